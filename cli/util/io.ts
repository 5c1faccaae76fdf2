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
  /** Height of the terminal in rows, when it is one (the size of an `exec -t` PTY). */
  rows?: number;
  /**
   * Node stream events, when the stream has them: `drain` (write returned false earlier;
   * streaming verbs wait for it), `resize` (a terminal's SIGWINCH; `exec -t` forwards it).
   */
  on?(event: 'drain' | 'resize', listener: () => void): unknown;
  /** Removes a listener added with {@link on}. */
  off?(event: 'drain' | 'resize', listener: () => void): unknown;
}

/** Where stdin comes from: `process.stdin`, or a test's readable. */
export interface InStream extends AsyncIterable<string | Uint8Array> {
  /** True when stdin is a terminal (then `run -i` refuses to read it rather than wait for input; `exec -t` requires it). */
  isTTY?: boolean;
  /** Raw mode of a terminal (tty.ReadStream): keys arrive byte by byte, ^C as byte 3 instead of SIGINT. */
  setRawMode?(raw: boolean): unknown;
  /** Readable events, when stdin is a Node stream (streaming verbs read it this way, so they can stop). */
  on?(event: 'data' | 'end' | 'error', listener: (arg?: any) => void): unknown;
  /** Removes a listener added with {@link on}. */
  off?(event: 'data' | 'end' | 'error', listener: (arg?: any) => void): unknown;
  /** Stops reading (lets the process exit while stdin is a terminal). */
  pause?(): unknown;
  /** Starts or resumes reading. */
  resume?(): unknown;
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
