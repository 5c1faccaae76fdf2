/**
 * The CLI's two kinds of failure and how each is reported.
 *
 * - A user error ({@link UserError}, or a {@link DsecApiError} from the daemon, or a
 *   commander usage error) prints `dsec: <message>` and a `hint: ...` line, never a stack.
 * - Anything else is a bug in dsec: `dsec: internal error: ...` plus a request to report
 *   it; the stack only with `DSEC_DEBUG=1`.
 *
 * Both exit {@link EXIT.failure} (125), the code meaning "dsec itself failed" (as in
 * `env`, `chroot`, `docker run`), so it never collides with a command's own exit code.
 */
import { DsecApiError, type ErrorKind } from '../../sdk/index.js';
import type { OutStream } from './io.js';

/** Exit codes of the CLI; `exec` and `run` otherwise pass the command's code through. */
export const EXIT = {
  /** Success. */
  ok: 0,
  /** The command was killed because its --timeout elapsed (as in coreutils `timeout`). */
  timedOut: 124,
  /** dsec itself failed: API error, bad flag, missing socket, a bug. */
  failure: 125,
  /** The command exists but is not executable (reported by the daemon). */
  notExecutable: 126,
  /** The command was not found (reported by the daemon). */
  notFound: 127,
  /** Base added to a signal number when the command died of a signal. */
  signalBase: 128,
} as const;

/** A mistake the user can fix: bad flag value, missing argument, unusable stdin. Printed without a stack. */
export class UserError extends Error {
  /** One line telling the user what to do next, printed as `hint: ...`; optional. */
  readonly hint?: string;

  /**
   * @param message what is wrong, naming the flag or value
   * @param hint what to do about it
   */
  constructor(message: string, hint?: string) {
    super(message);
    this.name = 'UserError';
    this.hint = hint;
  }
}

/**
 * The hint printed under an API error of kind `code` raised while running `verb`
 * (e.g. `ls`, `host info`, `image build`). `status` is the error's HTTP status: 0 when
 * dsecd was never reached (so `Unavailable` means dsecd is down), else dsecd's own
 * answer (so `Unavailable` names something dsecd needs).
 */
export function hintFor(code: ErrorKind, verb: string, status?: number): string {
  const image = verb === 'images' || verb.startsWith('image ');
  const layer = verb.startsWith('layer ');
  switch (code) {
    case 'Unavailable':
      if (verb === 'image bootstrap' && status !== undefined && status !== 0) {
        return 'dsecd could not run debootstrap or reach the Debian mirror; see its log (journalctl -u dsecd)';
      }
      return 'start dsecd (systemctl start dsecd) or pass --socket';
    case 'NotFound':
      if (verb === 'image build') return 'dsecd reads DIR on its own host: check it exists there; `dsec image ls` lists images for --base';
      if (verb === 'image import') return 'dsecd reads PATH on its own host: check it exists there';
      if (verb === 'image compose') return 'list layers with `dsec layer ls`, images with `dsec image ls`';
      if (image) return 'list images with `dsec image ls`';
      if (layer) return 'list layers with `dsec layer ls`';
      return verb === 'create' || verb === 'run' ? 'list images with `dsec images`, sandboxes with `dsec ls`' : 'list sandboxes with `dsec ls`';
    case 'InvalidArgument':
      return `see \`dsec ${verb} --help\``;
    case 'AlreadyExists':
      if (image || layer || verb === 'commit') return 'list images with `dsec image ls`; pick another name or remove the old one with `dsec image rm`';
      return 'list existing sandboxes with `dsec ls`';
    case 'Conflict':
    case 'FailedPrecondition':
      if (image || layer) return 'see `dsec image ls` and `dsec layer ls` for what uses it';
      return verb === 'rm'
        ? 'stop it first with `dsec stop ID`, or pass -f to destroy it anyway'
        : 'check the sandbox state with `dsec inspect ID`';
    case 'ResourceExhausted':
      if (image || layer || verb === 'commit') return 'the layer store may be full: `dsec image prune` removes unused layers';
      return 'remove idle sandboxes (`dsec ls`, `dsec rm`) or retry later; `dsec host info` shows capacity';
    case 'Internal':
      return 'this is a dsecd bug; see its log (journalctl -u dsecd) and report it';
    case 'Unimplemented':
      if (image || layer) return 'this dsecd does not support that yet; upgrade dsecd';
      return '`dsec host info` lists which backends this host supports';
    case 'DeadlineExceeded':
      return 'dsecd is overloaded or the command ran too long; retry, or raise --timeout';
  }
}

/** Writes the two-line report of an API error: `dsec: <message> (<code>)` and its hint. */
export function reportApiError(err: DsecApiError, stderr: OutStream, verb: string, prefix = ''): void {
  stderr.write(`dsec: ${prefix}${err.message} (${err.code})\n`);
  stderr.write(`hint: ${hintFor(err.code, verb, err.status)}\n`);
}

/**
 * Reports any error thrown while running a verb and returns the exit code (always 125).
 * `debug` (DSEC_DEBUG=1) adds the stack of a bug.
 */
export function reportError(err: unknown, stderr: OutStream, verb: string, debug: boolean): number {
  if (err instanceof DsecApiError) {
    reportApiError(err, stderr, verb);
  } else if (err instanceof UserError) {
    stderr.write(`dsec: ${err.message}\n`);
    if (err.hint) stderr.write(`hint: ${err.hint}\n`);
  } else {
    const msg = err instanceof Error ? err.message : String(err);
    stderr.write(`dsec: internal error: ${msg}\n`);
    stderr.write('this is a bug in dsec; please report it with the command you ran' + (debug ? '' : ' (DSEC_DEBUG=1 shows the stack)') + '\n');
    if (debug && err instanceof Error && err.stack) stderr.write(err.stack + '\n');
  }
  return EXIT.failure;
}
