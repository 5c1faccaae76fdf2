/**
 * The ^C / SIGTERM handling that long commands share: the first interrupt aborts the
 * command's API call, and the command then exits 128+N for signal N (Unix convention).
 */
import type { Ctx } from './context.js';
import { EXIT } from './errors.js';
import { signalNumber } from './exec.js';

/** An interrupt watch for one command; {@link stop} it when the command's work is over. */
export interface InterruptWatch {
  /** Aborts at the first interrupt; pass it to the API call. */
  readonly signal: AbortSignal;
  /** The first signal received, or undefined while none was. */
  readonly by: NodeJS.Signals | undefined;
  /** 128 + the signal's number (2 when unknown) once interrupted, else undefined. */
  exitCode(): number | undefined;
  /** Stops watching (a later interrupt reaches the default handler). Safe to call twice. */
  stop(): void;
}

/** Starts watching for an interrupt of the running command. */
export function watchInterrupt(ctx: Ctx): InterruptWatch {
  const abort = new AbortController();
  let by: NodeJS.Signals | undefined;
  const stop = ctx.io.onInterrupt((sig) => {
    by ??= sig;
    abort.abort();
  });
  return {
    signal: abort.signal,
    get by() {
      return by;
    },
    exitCode: () => (by === undefined ? undefined : EXIT.signalBase + (signalNumber(by) ?? 2)),
    stop,
  };
}
