/**
 * What `exec` and `run` share: reading stdin for `-i`, turning an ExecResult into our
 * exit code, and writing the command's output.
 *
 * Exit codes follow the shell and coreutils `timeout`: the command's own code; 128+N
 * when it died of signal N; 124 when its --timeout elapsed; 126/127 arrive from the
 * daemon as ordinary exit codes (not executable / not found); 125 is dsec's own failure.
 */
import { constants } from 'node:os';
import type { ExecInfo, ExecOutput } from '../../sdk/index.js';
import type { Ctx } from './context.js';
import { EXIT, UserError } from './errors.js';
import { formatDuration, writeJson } from './output.js';
import { parseDuration } from './parse.js';

/** Largest stdin `-i` sends: the API's inline limit (LIMITS.maxStdinBytes in daemon/api/schema.ts), 16 MiB. */
export const MAX_STDIN_BYTES = 16 * 1024 * 1024;

/** Longest --timeout the API accepts (LIMITS.maxTimeoutMs): 24 h. */
export const MAX_TIMEOUT_MS = 24 * 3600 * 1000;

/** Parses `--timeout DUR` into ms: at least 1 ms, at most 24 h; a unit is required. */
export function parseTimeout(text: string, name = '--timeout'): number {
  const ms = parseDuration(text, name);
  if (ms < 1) throw new UserError(`${name} must be at least 1ms, got ${JSON.stringify(text)}`, 'e.g. --timeout 30s');
  if (ms > MAX_TIMEOUT_MS) throw new UserError(`${name} ${JSON.stringify(text)} is longer than 24h`);
  return ms;
}

/** Parses a stop grace period (`dsec stop -t DUR`) into ms: 0 (kill at once) to 24 h; a unit is required except for 0. */
export function parseGrace(text: string, name = '--time'): number {
  const ms = parseDuration(text, name);
  if (ms > MAX_TIMEOUT_MS) throw new UserError(`${name} ${JSON.stringify(text)} is longer than 24h`);
  return ms;
}

/**
 * Reads all of stdin for `-i`. Refuses a terminal (it would wait for input nobody is
 * told to type; interactive exec is a separate feature) and input over 16 MiB.
 */
export async function readStdin(ctx: Ctx): Promise<Buffer> {
  const stdin = ctx.io.stdin;
  if (stdin.isTTY) {
    throw new UserError('-i reads stdin to the end, but stdin is a terminal', 'pipe or redirect input, e.g. `echo hi | dsec exec ID -i -- cat`');
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of stdin) {
    const b = typeof c === 'string' ? Buffer.from(c, 'utf8') : Buffer.from(c);
    size += b.length;
    if (size > MAX_STDIN_BYTES) throw new UserError('stdin is larger than 16MiB, the most exec accepts inline', 'copy large inputs into the sandbox another way');
    chunks.push(b);
  }
  return Buffer.concat(chunks);
}

/** Signal number of a signal name (`SIGKILL` → 9), or undefined when unknown here. */
export function signalNumber(name: string): number | undefined {
  return (constants.signals as Record<string, number>)[name];
}

/** Our exit code for an ExecResult: 124 timed out, else its exit code, else 128+signal, else 125. */
export function exitCodeOf(r: Pick<ExecOutput, 'timed_out' | 'exit_code' | 'signal'>): number {
  if (r.timed_out) return EXIT.timedOut;
  if (r.exit_code !== null) return r.exit_code;
  if (r.signal) {
    const n = signalNumber(r.signal);
    if (n !== undefined) return EXIT.signalBase + n;
  }
  return EXIT.failure;
}

/** The ExecResult as the API returned it (the decoded Buffers removed), plus `extra` fields first. */
export function execResultJson(r: ExecOutput, extra: Record<string, unknown> = {}): Record<string, unknown> {
  const { stdout: _o, stderr: _e, ...wire } = r;
  return { ...extra, ...wire };
}

/**
 * Writes an exec's outcome and returns the exit code. Text mode: the command's stdout
 * and stderr bytes to ours. `--json`: the ExecResult document. Either way, notes on
 * stderr for timeout, signal, OOM kills (whatever the exit status: {@link oomNote}) and
 * truncation, prefixed `dsec:`.
 */
export function reportExecResult(ctx: Ctx, r: ExecOutput, opts: { timeoutMs?: number; extra?: Record<string, unknown> } = {}): number {
  if (ctx.json) {
    writeJson(ctx.io.stdout, execResultJson(r, opts.extra));
  } else {
    if (r.stdout.length > 0) ctx.io.stdout.write(r.stdout);
    if (r.stderr.length > 0) ctx.io.stderr.write(r.stderr);
  }
  const code = exitCodeOf(r);
  if (r.stdout_truncated) ctx.err('dsec: note: stdout was truncated by dsecd (output limit)\n');
  if (r.stderr_truncated) ctx.err('dsec: note: stderr was truncated by dsecd (output limit)\n');
  const oom = oomNote(r.oom, r.oom_kills);
  if (oom) ctx.err(oom);
  if (r.timed_out) {
    const after = opts.timeoutMs !== undefined ? ` after ${formatDuration(opts.timeoutMs)}` : '';
    ctx.err(`dsec: command timed out${after} and was killed (exit ${EXIT.timedOut})\n`);
  } else if (r.exit_code === null && r.signal) {
    ctx.err(code === EXIT.failure ? `dsec: command killed by unknown signal ${r.signal}\n` : `dsec: command killed by ${r.signal} (exit ${code})\n`);
  }
  return code;
}

/**
 * The note on OOM kills during an exec, or '' for none: `killed` the command itself died
 * of the OOM kill (ExecResult.oom); `kills` the sandbox's OOM kills from its start to its
 * end (ExecResult.oom_kills: any process of the sandbox, so with other commands running
 * at the same time one of theirs may be among them). A pipeline whose `head` was killed
 * still exits 0, so the note does not depend on the exit status.
 */
export function oomNote(killed: boolean, kills: number | null | undefined): string {
  const n = kills ?? 0;
  if (killed) return `dsec: note: the sandbox ran out of memory during this command (OOM kill${n > 1 ? `s: ${n}` : ''})\n`;
  if (n <= 0) return '';
  return `dsec: note: the OOM killer killed ${n === 1 ? 'a process' : `${n} processes`} in the sandbox while this command ran `
    + '(one it started, or one of another command running at the same time); its output may be incomplete\n';
}

/**
 * Writes the notes on how an exec session ended (timeout, signal, OOM kills in the
 * sandbox meanwhile, the reason it could not start) to stderr and returns our exit code
 * for it, as {@link exitCodeOf}.
 */
export function reportExecInfo(ctx: Ctx, info: ExecInfo, opts: { timeoutMs?: number } = {}): number {
  const code = exitCodeOf(info);
  if (info.error) ctx.err(`dsec: ${info.error}\n`);
  // The command itself died of SIGKILL while the counter rose: as ExecResult.oom.
  const oom = oomNote((info.oom_kills ?? 0) > 0 && info.signal === 'SIGKILL' && !info.timed_out, info.oom_kills);
  if (oom) ctx.err(oom);
  if (info.timed_out) {
    const after = opts.timeoutMs !== undefined ? ` after ${formatDuration(opts.timeoutMs)}` : '';
    ctx.err(`dsec: command timed out${after} and was killed (exit ${EXIT.timedOut})\n`);
  } else if (info.exit_code === null && info.signal) {
    ctx.err(code === EXIT.failure ? `dsec: command killed by unknown signal ${info.signal}\n` : `dsec: command killed by ${info.signal} (exit ${code})\n`);
  }
  if (info.stdout_dropped_bytes > 0 || info.stderr_dropped_bytes > 0) {
    ctx.err('dsec: note: dsecd dropped output beyond its spool limit; what was dropped was never sent\n');
  }
  return code;
}
