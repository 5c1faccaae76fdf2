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
 * With `--json` the same failure is also written to stdout as one line
 * `{"error": {"code", "message", "hint", "reason"?}}` ({@link ErrorDoc}), so a script reading stdout
 * always gets JSON.
 */
import { DsecApiError, type ErrorKind } from '../../sdk/index.js';
import { rewriteFieldMessage } from './fields.js';
import type { OutStream } from './io.js';
import { printable, writeJsonLine } from './output.js';

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
  /** Error kind reported by `--json` (`InvalidArgument` unless the thrower knows better). */
  readonly code: ErrorKind;

  /**
   * @param message what is wrong, naming the flag or value
   * @param hint what to do about it
   * @param code error kind for `--json`; default `InvalidArgument`
   */
  constructor(message: string, hint?: string, code: ErrorKind = 'InvalidArgument') {
    super(message);
    this.name = 'UserError';
    this.hint = hint;
    this.code = code;
  }
}

/** What the CLI knows about an API error beyond its kind; see {@link hintFor}. */
export interface ErrorDetail {
  /** HTTP status of dsecd's answer; 0 (or unset) when dsecd never answered. */
  status?: number;
  /** errno code of the failed connection (`ENOENT`, `EACCES`, ...), when there was one. */
  errno?: string;
  /** The error's message (tells an agent failure from other daemon-side ones). */
  message?: string;
  /** dsecd's `reason` refining the kind (trajectory execs: `outcome_unknown`, `step_mismatch`, ...). */
  reason?: string;
}

/** Where dsecd logs, under systemd and without it (docs/OPERATIONS.md). */
const LOG_HINT = "see dsecd's log (journalctl -u dsecd, or /var/log/dsecd.log without systemd)";
/** Connection refused or no socket: dsecd is not running (or --socket names the wrong path). */
const START_HINT = "start dsecd (systemctl start dsecd, or see docs/OPERATIONS.md 'Without systemd')";
/** Permission denied on the socket. */
const PERMISSION_HINT = 'the socket is root:dsec 0660: run as root or join the dsec group';
/** dsecd answered Unavailable because it lost (or never got) the sandbox's agent. */
const AGENT_HINT = "the sandbox's agent is unreachable; `dsec inspect ID` shows its state";

/** A lease renewal (or re-creation) refused because the lease has expired (FailedPrecondition on `job lease`/`job renew`). */
export const LEASE_EXPIRED_HINT =
  'the lease expired; its sandboxes are paused and will be destroyed; create a new lease: `dsec job rm JOB`, then `dsec job lease JOB --ttl DUR`';

/**
 * A file operation (`dsec cp`, the files API) refused because the path is read-only in
 * the sandbox (reason `readonly_path`; docs/SECURITY.md "Filesystem"). dsecd's message
 * names why and the option that makes that path writable (a directory: never a file,
 * and `--no-readonly` only where a whole read-only path would have to go), so the hint
 * only says where options are set; dsecd sends no such reason for a sandbox with
 * read-only paths off.
 */
export const READONLY_PATH_HINT =
  'filesystem options are fixed when a sandbox is made: create one with the option named above, or snapshot this one (`dsec snapshot create ID`) and restore it with it (`dsec restore SNAPSHOT --writable DIR`); `dsec inspect ID` shows its options';

/**
 * An archive entry (`dsec cp - ID:/dir`, the archive API) that failed because it goes
 * through a symlink the same archive made, which leads out of the destination (reason
 * `archive_link`; dsecd's message names the entry, the link and where it leads).
 */
export const ARCHIVE_LINK_HINT =
  'a symlink in the archive leads the entries below it out of the destination: fix or leave out that link, or extract the entries without it';

/**
 * Hints for a refused writable path (reason `writable_path_refused`: a symlink leads it
 * to `/`, onto or above a read-only path, or out of the writable area; docs/SECURITY.md
 * "Symlinked writable paths"), by what was refused. A refused create, restore or fork
 * left no sandbox, so those hints name none.
 */
export const WRITABLE_PATH_REFUSED_HINTS = {
  create: 'nothing was created: the image has a symlink where that writable path is (named above); give --writable the directory it should be, or another path',
  restore: 'nothing was created: the snapshot holds a symlink its sandbox made where that writable path is (named above); restore it with other --writable paths',
  start: 'the sandbox keeps its files but cannot start with that writable path: snapshot it (`dsec snapshot create ID`) and restore the snapshot with other --writable paths (`dsec restore SNAPSHOT --writable DIR`)',
} as const;

/**
 * Hints of `exec --trajectory` by the `reason` of its refusal (docs/TRAJECTORIES.md),
 * whatever the kind: what happened to the step, and the way on (often `--truncate`).
 */
export const TRAJECTORY_HINTS: Record<string, string> = {
  outcome_unknown:
    'the step started but never finished (dsecd or the sandbox died mid-step), so there is no result to replay; check the sandbox, then rerun the step with --truncate to discard it and the steps after it',
  step_mismatch:
    'the step is recorded with a different command (argv, env, cwd, user, stdin or timeout); rerun with --truncate to discard the recorded step and the steps after it, or use a new step number',
  out_of_order:
    'steps are recorded in increasing order and this one is below the last; `dsec traj show <trajectory>` lists them; use a higher step, or --truncate to rewrite from this one',
  in_progress: 'the step is running now (another exec); wait for it, then rerun to get its recorded result',
  trajectory_removed:
    'this trajectory id was removed (`dsec traj rm`, or by retention) and stays reserved, so its steps are neither replayed nor run again; use a new trajectory id',
};

/** The errno code behind a client-side API error (from its `cause`), if any. */
export function errnoOf(err: DsecApiError): string | undefined {
  const c = (err as { cause?: unknown }).cause as { code?: unknown } | undefined;
  return typeof c?.code === 'string' ? c.code : undefined;
}

/**
 * The hint printed under an API error of kind `code` raised while running `verb`
 * (e.g. `ls`, `host info`, `image build`). `detail` tells apart, for `Unavailable`,
 * dsecd not running (no answer; ENOENT/ECONNREFUSED), a socket we may not open
 * (EACCES/EPERM), a connection that broke, and dsecd's own answer (an agent it cannot
 * reach, or something else it needs); for `exec`, its `reason` picks a trajectory hint
 * ({@link TRAJECTORY_HINTS}). A bare number is taken as the HTTP status.
 */
export function hintFor(code: ErrorKind, verb: string, detail: ErrorDetail | number = {}): string {
  const d: ErrorDetail = typeof detail === 'number' ? { status: detail } : detail;
  const image = verb === 'images' || verb.startsWith('image ');
  const layer = verb.startsWith('layer ');
  const job = verb.startsWith('job ');
  const snapshot = verb.startsWith('snapshot ') || verb === 'restore' || verb === 'fork';
  const traj = verb.startsWith('traj ');
  if (verb === 'exec' && d.reason !== undefined && Object.prototype.hasOwnProperty.call(TRAJECTORY_HINTS, d.reason)) return TRAJECTORY_HINTS[d.reason];
  if (d.reason === 'readonly_path') return READONLY_PATH_HINT;
  if (d.reason === 'archive_link') return ARCHIVE_LINK_HINT;
  if (d.reason === 'writable_path_refused') {
    if (verb === 'create' || verb === 'run') return WRITABLE_PATH_REFUSED_HINTS.create;
    if (verb === 'restore' || verb === 'fork') return WRITABLE_PATH_REFUSED_HINTS.restore;
    return WRITABLE_PATH_REFUSED_HINTS.start;
  }
  switch (code) {
    case 'Unavailable':
      return unavailableHint(verb, d, image || layer);
    case 'NotFound':
      if (verb === 'image build') return 'dsecd reads DIR on its own host: check it exists there; `dsec image ls` lists images for --base';
      if (verb === 'image import') return 'dsecd reads PATH on its own host: check it exists there';
      if (verb === 'image compose') return 'list layers with `dsec layer ls`, images with `dsec image ls`';
      if (verb === 'image alias') return 'list templates with `dsec image alias`, images with `dsec image ls`';
      if (image) return 'list images with `dsec image ls`';
      if (verb.startsWith('token ')) return 'list tokens with `dsec token ls` (an admin token, or the Unix socket on dsecd\'s host)';
      if (layer) return 'list layers with `dsec layer ls`';
      if (verb === 'attach' || verb.startsWith('execs')) return 'list sandboxes with `dsec ls`, the exec sessions of one with `dsec execs ID`';
      if (verb === 'cp') return 'check the path inside the sandbox (`dsec exec ID -- ls -la DIR`); `dsec ls` lists sandboxes';
      if (verb === 'job renew') return 'no lease for that job: create one with `dsec job lease JOB --ttl DUR`; `dsec job ls` lists leases';
      if (job) return 'list leases with `dsec job ls`';
      if (snapshot && verb !== 'snapshot create') return 'list snapshots with `dsec snapshot ls`';
      if (traj) return 'list trajectories with `dsec traj ls`';
      if (verb === 'call') return 'list images with `dsec images`';
      return verb === 'create' || verb === 'run' ? 'list images with `dsec images`, sandboxes with `dsec ls`' : 'list sandboxes with `dsec ls`';
    case 'Unauthenticated':
      return 'pass a token of `dsec token create` (--token or $DSEC_TOKEN, or a context: `dsec context ls`); a revoked or expired token needs a new one';
    case 'PermissionDenied':
      if (verb.startsWith('token ')) return 'token management needs an admin token or the Unix socket on dsecd\'s host';
      if (verb === 'image rm' && /system image/.test(d.message ?? '')) return "a system image is every tenant's: an admin removes it; your tenant's own image of the name (`dsec image tag`, `dsec commit`) shadows it for you";
      return 'the token\'s role may not do this (reader: reads only; user: not host-wide operations); ask an admin for a token of another role';
    case 'InvalidArgument':
      return verb === '' || verb === 'dsec' ? 'see `dsec --help`' : `see \`dsec ${verb} --help\``;
    case 'AlreadyExists':
      if (image || layer || verb === 'commit') return 'list images with `dsec image ls`; pick another name or remove the old one with `dsec image rm`';
      if (snapshot) return 'list snapshots with `dsec snapshot ls`; pick another name or remove the old one with `dsec snapshot rm NAME`';
      return 'list existing sandboxes with `dsec ls`';
    case 'Conflict':
      // Another operation changed the sandbox (or image) under this one; the message says which.
      if (image || layer) return 'retry, or see `dsec image ls` and `dsec layer ls` for what uses it';
      if (traj) return 'a step of it is running now; retry when the step has ended (`dsec traj show ID` shows it)';
      return 'retry, or check `dsec inspect ID`';
    case 'FailedPrecondition':
      if (image || layer) return 'see `dsec image ls` and `dsec layer ls` for what uses it';
      if (job) return LEASE_EXPIRED_HINT;
      if (verb === 'pause') return 'check the sandbox state with `dsec inspect ID`; a stopped sandbox needs `dsec start ID` first';
      if (verb === 'rm') return 'stop it first with `dsec stop ID`, or pass -f to destroy it anyway';
      if (verb === 'restore' || verb === 'fork') return 'the snapshot cannot be restored (a layer of it is missing or corrupt): remove it with `dsec snapshot rm REF` and take a new one';
      // A failed create leaves no sandbox: there is no ID to inspect.
      if (verb === 'create' || verb === 'run') return 'nothing was created: the message names what the image or this host cannot honour; `dsec host info` shows what this host supports';
      return 'check the sandbox state with `dsec inspect ID`';
    case 'ResourceExhausted':
      if (image || layer || verb === 'commit') return 'the layer store may be full: `dsec image prune` removes unused layers';
      if (verb === 'snapshot create') return 'the layer store may be full: `dsec snapshot rm` and `dsec image prune` free space';
      // A file write of the sandbox's: its writable layer is at its quota (or the store is full).
      if (verb === 'cp') return 'the sandbox\'s disk is full (its --disk quota, `dsec inspect ID` disk_bytes and disk_used_bytes): remove files in it, or create it with a larger --disk';
      return 'remove idle sandboxes (`dsec ls`, `dsec rm`) or retry later; `dsec host info` shows capacity';
    case 'Internal':
      return LOG_HINT;
    case 'Unimplemented':
      if (image || layer) return 'this dsecd does not support that yet; upgrade dsecd';
      // The CRIU hint only for process checkpoints; other snapshots dsecd cannot take depend on the backend.
      if (verb === 'snapshot create' && /CRIU|process checkpoint/i.test(d.message ?? '')) return "process snapshots need CRIU working on dsecd's host (`criu check`); drop --process for a filesystem snapshot";
      if (verb === 'snapshot create') return 'snapshots are built for container and microvm sandboxes (docs/TRAJECTORIES.md); `dsec commit` needs a container';
      return '`dsec host info` lists which backends this host supports';
    case 'DeadlineExceeded':
      return 'dsecd is overloaded or the command ran too long; retry, or raise --timeout';
  }
}

/** The hint of an `Unavailable` error; see {@link hintFor}. */
function unavailableHint(verb: string, d: ErrorDetail, imageOrLayer: boolean): string {
  if (!d.status && /\bdsecd at https:\/\//.test(d.message ?? '')) {
    // The TCP door (--host, DSEC_HOST, a context): no local dsecd to start.
    if (/^TLS:/.test(d.message ?? '')) return "the message says what TLS refused; `dsec context ls` shows the CA a context trusts";
    return "check the address (--host, $DSEC_HOST, `dsec context ls`) and that dsecd there runs with --listen";
  }
  if (!d.status) {
    // dsecd never answered: the connection failed, or broke before an answer.
    switch (d.errno) {
      case 'ENOENT':
      case 'ECONNREFUSED':
      case 'ENOTSOCK':
        return START_HINT;
      case 'EACCES':
      case 'EPERM':
        return PERMISSION_HINT;
      default:
        // Nothing known (a caller without detail): the usual reason is a stopped dsecd.
        if (d.errno === undefined && d.status === undefined) return START_HINT;
        return `the connection to dsecd broke (did it restart?); ${LOG_HINT}`;
    }
  }
  // dsecd's own answer: something it needs is unreachable. For a sandbox that is its
  // agent ("cannot reach its agent", "agent connection lost", "exec interrupted").
  if (verb === 'image bootstrap') return `dsecd could not run debootstrap or reach the Debian mirror; ${LOG_HINT}`;
  if (!imageOrLayer && (verb === 'exec' || /\bagent\b|exec interrupted/.test(d.message ?? ''))) return AGENT_HINT;
  return `dsecd could not use something it needs (named above); ${LOG_HINT}`;
}

/** The hint of an API error raised while running `verb`. */
export function apiErrorHint(err: DsecApiError, verb: string): string {
  return hintFor(err.code, verb, { status: err.status, errno: errnoOf(err), message: err.message, reason: err.reason });
}

/**
 * The message of an API error as the CLI shows it: for InvalidArgument and
 * FailedPrecondition raised by a verb that built its request from flags, the API's field
 * names and units are said as that verb's flags (cli/util/fields.ts); otherwise dsecd's
 * message as it is.
 */
export function apiErrorMessage(err: DsecApiError, verb: string): string {
  return err.code === 'InvalidArgument' || err.code === 'FailedPrecondition' ? rewriteFieldMessage(err.message, verb) : err.message;
}

/** Writes the two-line report of an API error: `dsec: <message> (<code>)` and its hint. */
export function reportApiError(err: DsecApiError, stderr: OutStream, verb: string, prefix = ''): void {
  stderr.write(`dsec: ${prefix}${printable(apiErrorMessage(err, verb), { lines: true })} (${err.code})\n`);
  stderr.write(`hint: ${printable(apiErrorHint(err, verb), { lines: true })}\n`);
}

/** The error object of `--json` output: `{"error": ErrorDoc}`. `hint` is null when there is none. */
export interface ErrorDoc {
  /** Error kind; `InvalidArgument` for usage and user errors, `Internal` for a bug in dsec. */
  code: ErrorKind;
  /** What failed, as on stderr (without the `dsec: ` prefix and the `(Code)` suffix). */
  message: string;
  /** What to do about it, as on the `hint:` line. */
  hint: string | null;
  /** dsecd's machine-readable refinement of `code` (e.g. `outcome_unknown`); only when it sent one. */
  reason?: string;
}

/** Writes `{"error": doc}` as one JSON line (a `--json` run's stdout on failure). */
export function writeJsonError(out: OutStream, doc: ErrorDoc): void {
  writeJsonLine(out, { error: doc });
}

/** The message of a bug (anything that is neither an API nor a user error). */
const BUG_HINT = 'this is a bug in dsec; please report it with the command you ran';

/**
 * Reports any error thrown while running a verb and returns the exit code (always 125).
 * `debug` (DSEC_DEBUG=1) adds the stack of a bug. `jsonOut` (stdout under `--json`)
 * also receives the error as `{"error": {code, message, hint}}`.
 */
export function reportError(err: unknown, stderr: OutStream, verb: string, debug: boolean, jsonOut?: OutStream): number {
  let doc: ErrorDoc;
  if (err instanceof DsecApiError) {
    reportApiError(err, stderr, verb);
    doc = { code: err.code, message: apiErrorMessage(err, verb), hint: apiErrorHint(err, verb) };
    if (err.reason !== undefined) doc.reason = err.reason;
  } else if (err instanceof UserError) {
    stderr.write(`dsec: ${printable(err.message, { lines: true })}\n`);
    if (err.hint) stderr.write(`hint: ${printable(err.hint, { lines: true })}\n`);
    doc = { code: err.code, message: err.message, hint: err.hint ?? null };
  } else {
    const msg = err instanceof Error ? err.message : String(err);
    stderr.write(`dsec: internal error: ${msg}\n`);
    stderr.write(BUG_HINT + (debug ? '' : ' (DSEC_DEBUG=1 shows the stack)') + '\n');
    if (debug && err instanceof Error && err.stack) stderr.write(err.stack + '\n');
    doc = { code: 'Internal', message: `internal error: ${msg}`, hint: BUG_HINT };
  }
  if (jsonOut) writeJsonError(jsonOut, doc);
  return EXIT.failure;
}
