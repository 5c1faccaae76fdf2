/**
 * The streams and process hooks a CLI run uses, injectable so tests run `main()`
 * in-process and capture everything it prints.
 */

/** Where output goes: `process.stdout`/`process.stderr`, or a test's collector. */
export interface OutStream {
  /** Writes text (UTF-8) or raw bytes. */
  write(chunk: string | Uint8Array): unknown;
  /** True when the stream is a terminal (enables table colours, the progress status line). */
  isTTY?: boolean;
  /** Width of the terminal in columns, when it is one (cuts the progress status line). */
  columns?: number;
}

/** Where stdin comes from: `process.stdin`, or a test's readable. */
export interface InStream extends AsyncIterable<string | Uint8Array> {
  /** True when stdin is a terminal (then `exec -i` refuses to read it rather than wait for input). */
  isTTY?: boolean;
}

/** Everything a CLI run touches outside itself. */
export interface CliIO {
  /** Standard output. */
  stdout: OutStream;
  /** Standard error. */
  stderr: OutStream;
  /** Standard input, read only by `exec -i` / `run -i`. */
  stdin: InStream;
  /** Environment (DSEC_SOCKET, DSEC_DEBUG, NO_COLOR). */
  env: Record<string, string | undefined>;
  /**
   * Registers `handler` for an interrupt (SIGINT/SIGTERM) while a verb needs cleanup
   * (`run` destroys its sandbox, `exec` stops waiting, `events -f` stops); returns the function
   * that unregisters it.
   * While registered, the signal does not kill the process.
   */
  onInterrupt(handler: (signal: NodeJS.Signals) => void): () => void;
}

let epipeHandled = false;

/**
 * Makes a closed process stdout (`dsec events -f | head`) end the process quietly with
 * 141 (128+SIGPIPE), as a shell tool would, instead of an unhandled EPIPE stack.
 * Safe to call twice; only for the real process stdout.
 */
export function exitQuietlyOnEpipe(): void {
  if (epipeHandled) return;
  epipeHandled = true;
  process.stdout.on('error', (e: NodeJS.ErrnoException) => {
    if (e.code === 'EPIPE') process.exit(141);
    throw e;
  });
}

/** The real process's streams, environment and signals. */
export function processIO(): CliIO {
  return {
    stdout: process.stdout,
    stderr: process.stderr,
    // A getter: touching process.stdin creates a handle, so only `-i` does.
    get stdin() {
      return process.stdin;
    },
    env: process.env,
    onInterrupt(handler) {
      const signals: NodeJS.Signals[] = ['SIGINT', 'SIGTERM'];
      for (const s of signals) process.on(s, handler);
      return () => {
        for (const s of signals) process.off(s, handler);
      };
    },
  };
}
