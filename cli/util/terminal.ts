/**
 * The local terminal during `exec -t` and `attach`: raw mode in and out, the PTY size,
 * and docker's detach sequence.
 *
 * Contract: whatever ends an interactive session (the command's exit, an error message,
 * a dropped socket, our own SIGTERM, an exception, `process.exit`), the terminal is put
 * back in cooked mode. {@link enterRawMode} and {@link enterDetachLineMode} return the
 * restore function, which is safe to call any number of times, and also register it on
 * the process `exit` event as a last resort.
 */
import { spawnSync } from 'node:child_process';
import type { InStream, OutStream } from './io.js';

/** Size used for a PTY when our stdout is not a terminal (or does not report its size). */
export const DEFAULT_TTY_SIZE = { rows: 24, cols: 80 } as const;

/** Largest PTY side dsecd accepts (ResizeRequest in daemon/api/schema.ts). */
const MAX_TTY_SIDE = 1000;

/**
 * Turns off output post-processing (OPOST) on the terminal behind our fd 0, completing
 * raw mode as cfmakeraw (ssh, docker) does: Node's raw mode leaves ONLCR on, so the `\n`
 * a full-screen program inside sends to move the cursor down would also return it to
 * column 0 here, and `\r\n` would arrive as `\r\r\n`. Best effort (no stty: no change).
 * Leaving raw mode restores it: libuv puts back the whole terminal state it saved.
 */
function clearOutputProcessing(): void {
  spawnSync('stty', ['-opost'], { stdio: ['inherit', 'ignore', 'ignore'], timeout: 2000 });
}

/**
 * Puts `stdin` (a terminal) in raw mode and returns the function that restores it.
 * Without `setRawMode` (not a terminal) it does nothing and returns a no-op. For the
 * process's own stdin, output post-processing is turned off too (see
 * {@link clearOutputProcessing}), unless `opts.keepOutput` (our own line-by-line output,
 * as `top`'s log view writes it, needs `\n` to return the cursor).
 */
export function enterRawMode(stdin: InStream, opts: { keepOutput?: boolean } = {}): () => void {
  if (typeof stdin.setRawMode !== 'function') return () => {};
  stdin.setRawMode(true);
  if (!opts.keepOutput && stdin === (process.stdin as unknown) && process.stdin.isTTY) clearOutputProcessing();
  let restored = false;
  const restore = () => {
    if (restored) return;
    restored = true;
    process.off('exit', restore);
    try {
      stdin.setRawMode!(false);
    } catch {
      // The terminal is gone (hangup): nothing left to restore.
    }
  };
  process.on('exit', restore);
  return restore;
}

/**
 * Makes Ctrl-P Ctrl-Q reach us while the terminal behind `stdin` stays in line mode
 * (`dsec attach` to a session without a PTY: the line editing, echo and ^C of the local
 * terminal keep working). Two termios changes, through `stty` on our fd 0:
 * - `-ixon`: Ctrl-Q is no longer flow control (XON), which the terminal would swallow;
 * - `eol ^Q`: Ctrl-Q also ends a line, so a read returns as soon as it is typed, with the
 *   Ctrl-P before it (a line-mode read otherwise waits for Enter).
 * The settings before (`stty -g`) are put back by the returned function. Only for the
 * process's own stdin when it is a terminal (anything else: a no-op); best effort (no
 * stty: no change, and the keys then work after Enter).
 */
export function enterDetachLineMode(stdin: InStream): () => void {
  if (stdin !== (process.stdin as unknown) || !process.stdin.isTTY) return () => {};
  const saved = spawnSync('stty', ['-g'], { stdio: ['inherit', 'pipe', 'ignore'], timeout: 2000 });
  const settings = saved.status === 0 ? String(saved.stdout).trim() : '';
  if (!settings) return () => {};
  spawnSync('stty', ['-ixon', 'eol', '^Q'], { stdio: ['inherit', 'ignore', 'ignore'], timeout: 2000 });
  let restored = false;
  const restore = () => {
    if (restored) return;
    restored = true;
    process.off('exit', restore);
    // The terminal may be gone (hangup): then there is nothing to restore.
    spawnSync('stty', [settings], { stdio: ['inherit', 'ignore', 'ignore'], timeout: 2000 });
  };
  process.on('exit', restore);
  return restore;
}

/** The PTY size matching `out` (rows × columns, each 1..1000), or {@link DEFAULT_TTY_SIZE}. */
export function terminalSize(out: OutStream): { rows: number; cols: number } {
  const clamp = (n: number | undefined, d: number) => (typeof n === 'number' && n >= 1 ? Math.min(Math.floor(n), MAX_TTY_SIDE) : d);
  if (!out.isTTY) return { ...DEFAULT_TTY_SIZE };
  return { rows: clamp(out.rows, DEFAULT_TTY_SIZE.rows), cols: clamp(out.columns, DEFAULT_TTY_SIZE.cols) };
}

/** Ctrl-P: first byte of the detach sequence. */
const CTRL_P = 0x10;
/** Ctrl-Q: second byte of the detach sequence. */
const CTRL_Q = 0x11;

/**
 * Finds docker's detach sequence, Ctrl-P Ctrl-Q, in keyboard input. A Ctrl-P is held
 * back until the next byte shows whether it starts the sequence; when it does not, it
 * is passed on with that byte (so Ctrl-P still reaches the program, one key late).
 * With `dropCtrlQ` (a terminal in line mode, see {@link enterDetachLineMode}), a Ctrl-Q
 * outside the sequence is dropped, as the terminal's flow control dropped it before.
 */
export class DetachKeys {
  private held = false;

  constructor(private readonly opts: { dropCtrlQ?: boolean } = {}) {}

  /** Bytes to forward from `chunk`, and whether the sequence was completed (bytes after it are dropped). */
  feed(chunk: Buffer): { forward: Buffer; detach: boolean } {
    const out: number[] = [];
    for (const b of chunk) {
      if (this.held) {
        this.held = false;
        if (b === CTRL_Q) return { forward: Buffer.from(out), detach: true };
        out.push(CTRL_P);
        if (b === CTRL_P) {
          this.held = true;
          continue;
        }
        out.push(b);
      } else if (b === CTRL_P) {
        this.held = true;
      } else if (b === CTRL_Q && this.opts.dropCtrlQ) {
        continue;
      } else {
        out.push(b);
      }
    }
    return { forward: Buffer.from(out), detach: false };
  }
}
