/**
 * What a run-to-completion exec sends and returns, shared by {@link DsecClient.exec}
 * (sdk/exec.ts), the exec channel (sdk/exec-channel.ts) and one-shot runs (sdk/run.ts).
 */
import type { ExecResult } from './types.js';

/** A command to run with {@link DsecClient.exec}. */
export interface ExecOptions {
  /** Program and arguments; `argv[0]` is looked up in the sandbox PATH. At least one element. */
  argv: string[];
  /** Extra environment, merged over the sandbox env. */
  env?: Record<string, string>;
  /** Absolute working directory inside the sandbox; default the image's. */
  cwd?: string;
  /** User name or `uid[:gid]` inside the sandbox; default the image's. */
  user?: string;
  /** Bytes fed to the command's stdin (a string is sent as UTF-8); at most 16 MiB. Empty otherwise. */
  stdin?: Buffer | Uint8Array | string;
  /** Kill the command (SIGKILL to its process group) after this many ms; the result then has `timed_out: true`. */
  timeoutMs?: number;
  /**
   * Record the command as step {@link step} of this trajectory (1-128 of
   * `[A-Za-z0-9._:@-]`, starting with a letter or digit); needs `step`. A rerun of a
   * finished step with the same request is not executed: dsecd answers with the recorded
   * result and `replayed: true`. See {@link DsecClient.exec} for the refusals.
   */
  trajectory?: string;
  /** Step number within `trajectory`, 0 to 2^31-1; steps are recorded in increasing order. Needs `trajectory`. */
  step?: number;
  /**
   * Discard the recorded steps of `trajectory` from `step` on, then run this one: the way
   * past a `Conflict` with reason `outcome_unknown` or `step_mismatch`. Needs `trajectory` and `step`.
   */
  truncate?: boolean;
  /** Abort the HTTP call (the promise rejects with the signal's reason). Whether the command keeps running is up to the daemon. */
  signal?: AbortSignal;
}

/** Result of {@link DsecClient.exec} and {@link DsecClient.run}: the API's ExecResult plus its output decoded from base64. */
export interface ExecOutput extends ExecResult {
  /** Standard output bytes (decoded `stdout_b64`), possibly truncated (`stdout_truncated`). */
  stdout: Buffer;
  /** Standard error bytes (decoded `stderr_b64`), possibly truncated (`stderr_truncated`). */
  stderr: Buffer;
}

/** An ExecResult with its base64 output decoded into `stdout` and `stderr`. */
export function decodeExecResult(res: ExecResult): ExecOutput {
  return { ...res, stdout: Buffer.from(res.stdout_b64, 'base64'), stderr: Buffer.from(res.stderr_b64, 'base64') };
}

/** The ExecRequest body of `req` (the fields POST .../exec takes). */
export function execRequestBody(req: ExecOptions): Record<string, unknown> {
  const body: Record<string, unknown> = { argv: req.argv };
  if (req.env !== undefined) body.env = req.env;
  if (req.cwd !== undefined) body.cwd = req.cwd;
  if (req.user !== undefined) body.user = req.user;
  if (req.stdin !== undefined) {
    const bytes = typeof req.stdin === 'string' ? Buffer.from(req.stdin, 'utf8') : Buffer.from(req.stdin.buffer, req.stdin.byteOffset, req.stdin.byteLength);
    body.stdin_b64 = bytes.toString('base64');
  }
  if (req.timeoutMs !== undefined) body.timeout_ms = req.timeoutMs;
  if (req.trajectory !== undefined) body.trajectory = req.trajectory;
  if (req.step !== undefined) body.step = req.step;
  if (req.truncate !== undefined) body.truncate = req.truncate;
  return body;
}
