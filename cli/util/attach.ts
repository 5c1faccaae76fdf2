/**
 * Running the local end of an attached exec session, shared by `exec -i/-t` and `attach`:
 * output to our stdout/stderr (with backpressure), our stdin to the command, terminal
 * resizes to its PTY, interrupts, and the terminal restored on every way out.
 *
 * Keys and signals:
 * - raw mode (a tty session, our stdin a terminal, stdin forwarded): every key goes to
 *   the command, ^C as byte 3 (the PTY inside turns it into SIGINT, as with ssh or
 *   docker); with `detachKeys`, Ctrl-P Ctrl-Q detaches;
 * - with `detachKeys` and our stdin a terminal but no raw mode (a session without a PTY,
 *   or stdin not forwarded): the terminal stays in line mode (echo, line editing, ^C as
 *   a signal) with Ctrl-Q made a line end ({@link enterDetachLineMode}), and stdin is read
 *   even when it is not forwarded, so Ctrl-P Ctrl-Q detaches there too (what was typed
 *   on the line before it is sent first, when stdin is forwarded);
 * - otherwise the first SIGINT is forwarded to the command as a signal, and a second
 *   SIGINT (or a SIGTERM) makes us let go (for `exec`, which attached with
 *   kill_on_detach, that kills the command);
 * - in raw mode a SIGTERM sent to dsec lets go too.
 */
import type { ExecAttachmentHandle, ExecInfo } from '../../sdk/index.js';
import type { Ctx } from './context.js';
import type { InStream, OutStream } from './io.js';
import { DetachKeys, enterDetachLineMode, enterRawMode, terminalSize } from './terminal.js';

/** How {@link runAttached} drives a session. */
export interface AttachedOptions {
  /** The session has a PTY: forward our terminal's size changes. */
  tty: boolean;
  /** Put our stdin in raw mode (only when it is a terminal and is forwarded). */
  raw: boolean;
  /** Forward our stdin to the command. */
  stdin: boolean;
  /** When our stdin ends, close the command's stdin (`exec -i`); `attach` leaves it open. */
  eofOnEnd: boolean;
  /** Ctrl-P Ctrl-Q detaches when our stdin is a terminal (raw mode or line mode, see the module comment). */
  detachKeys: boolean;
  /** Send our terminal's size once attached (re-attaching to a tty session). */
  sendSize: boolean;
}

/** How an attached session ended (an error rejects instead). */
export type AttachedOutcome =
  | { kind: 'exit'; info: ExecInfo }
  | { kind: 'detached' }
  | { kind: 'interrupted'; signal: NodeJS.Signals };

/**
 * Drives `att` until the command exits, we detach, or an interrupt makes us let go;
 * rejects with the attachment's error (an error message from dsecd, a dropped
 * connection). Our terminal is restored and our stdin released before it settles.
 */
export async function runAttached(ctx: Ctx, att: ExecAttachmentHandle, opts: AttachedOptions): Promise<AttachedOutcome> {
  const { stdin, stdout, stderr } = ctx.io;
  const cleanups: (() => void)[] = [];
  let interrupted: NodeJS.Signals | undefined;
  let detached = false;
  let forwardedSigint = false;

  // Output, pausing the socket while a slow stdout or stderr (a pipe) catches up.
  const backpressure = new Backpressure(att);
  att.on('stdout', (b) => backpressure.write(stdout, b));
  att.on('stderr', (b) => backpressure.write(stderr, b));

  // Keys are looked for on a terminal only: through a pipe nobody types them.
  const lineKeys = opts.detachKeys && !opts.raw && stdin.isTTY === true;
  try {
    // Our handlers go in before the terminal changes: entering raw mode runs `stty`
    // synchronously, and a SIGTERM that arrived before a handler was registered would
    // take the default action and leave the terminal raw.
    const unregister = ctx.io.onInterrupt((sig) => {
      if (sig === 'SIGINT' && !opts.raw && !forwardedSigint) {
        forwardedSigint = true;
        att.signal('SIGINT');
        return;
      }
      interrupted ??= sig;
      att.close();
    });
    cleanups.push(unregister);

    if (opts.raw) cleanups.push(enterRawMode(stdin));
    else if (lineKeys) cleanups.push(enterDetachLineMode(stdin));

    if (opts.tty && stdout.isTTY && typeof stdout.on === 'function') {
      const onResize = () => {
        const { rows, cols } = terminalSize(stdout);
        att.resize(rows, cols);
      };
      stdout.on('resize', onResize);
      cleanups.push(() => stdout.off?.('resize', onResize));
      if (opts.sendSize) onResize();
    }

    if (opts.stdin || lineKeys) cleanups.push(forwardStdin(stdin, att, opts, () => {
      detached = true;
      att.close();
    }));

    const info = await att.done;
    if (info) return { kind: 'exit', info };
    if (interrupted) return { kind: 'interrupted', signal: interrupted };
    return detached ? { kind: 'detached' } : { kind: 'interrupted', signal: 'SIGTERM' };
  } finally {
    // Last in, first out: stop reading stdin before leaving raw mode.
    for (const c of cleanups.reverse()) c();
    att.close();
  }
}

/**
 * Reads `stdin` for the session: forwards it to the attachment when `opts.stdin` (with
 * backpressure), and looks for the detach keys when `opts.detachKeys` and stdin is a
 * terminal. Returns the function that stops it and releases stdin.
 */
function forwardStdin(stdin: InStream, att: ExecAttachmentHandle, opts: AttachedOptions, detach: () => void): () => void {
  const keys = opts.detachKeys && stdin.isTTY === true ? new DetachKeys({ dropCtrlQ: !opts.raw }) : undefined;
  let stopped = false;
  const onData = (chunk: string | Uint8Array) => {
    if (stopped) return;
    let bytes: Buffer = typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : Buffer.from(chunk);
    if (keys) {
      const r = keys.feed(bytes);
      bytes = r.forward;
      if (r.detach) {
        if (bytes.length > 0 && opts.stdin) att.write(bytes);
        detach();
        return;
      }
    }
    if (bytes.length === 0 || !opts.stdin) return;
    if (!att.write(bytes) && typeof stdin.pause === 'function') {
      stdin.pause();
      att.once('drain', () => {
        if (!stopped) stdin.resume?.();
      });
    }
  };
  const onEnd = () => {
    if (!stopped && opts.eofOnEnd && opts.stdin) att.eof();
  };
  // A failing stdin (EIO on a terminal that went away) is treated as its end.
  const onError = () => onEnd();

  if (typeof stdin.on === 'function') {
    stdin.on('data', onData);
    stdin.on('end', onEnd);
    stdin.on('error', onError);
    stdin.resume?.();
    return () => {
      stopped = true;
      stdin.off?.('data', onData);
      stdin.off?.('end', onEnd);
      stdin.off?.('error', onError);
      // Paused, a terminal stdin no longer keeps the process alive.
      stdin.pause?.();
    };
  }
  // A bare async iterable (no events): read it in the background; it cannot be cancelled.
  void (async () => {
    try {
      for await (const c of stdin) {
        if (stopped) return;
        onData(c);
      }
      onEnd();
    } catch {
      onEnd();
    }
  })();
  return () => {
    stopped = true;
  };
}

/**
 * Writes output to our streams, pausing the attachment while any of them is full (a slow
 * pipe) and resuming it once all have drained. One 'drain' listener per full stream,
 * however many chunks arrive before the pause takes effect (frames already received are
 * still delivered, and written: the stream buffers them).
 */
class Backpressure {
  private readonly full = new Set<OutStream>();

  constructor(private readonly att: ExecAttachmentHandle) {}

  /** Writes `b` to `out`; when `out` says it is full, pauses the attachment until it drains. */
  write(out: OutStream, b: Buffer): void {
    const ok = out.write(b);
    if (ok !== false || typeof out.on !== 'function' || this.full.has(out)) return;
    if (this.full.size === 0) this.att.pause();
    this.full.add(out);
    const onDrain = () => {
      out.off?.('drain', onDrain);
      this.full.delete(out);
      if (this.full.size === 0) this.att.resume();
    };
    out.on('drain', onDrain);
  }
}
