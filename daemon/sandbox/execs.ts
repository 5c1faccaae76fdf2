/**
 * Exec sessions: commands that run in a sandbox independently of any one API client.
 *
 * A session is started by an API caller (its owner: the uid of the peer of the Unix
 * socket connection) and has a 128-bit random id. Output is spooled to files under the
 * sandbox dir (`execs/<id>.stdout|.stderr`) as it arrives, so that:
 * - any number of readers (WebSocket attach, HTTP follow) stream it at their own pace,
 *   each reading the file from its own offset: daemon memory per reader is one chunk,
 *   whatever the command prints;
 * - a client that goes away and comes back re-attaches from any offset;
 * - what is kept is bounded by `spoolMaxBytes` per stream; beyond it output is
 *   counted and dropped (`*_dropped_bytes`), never held in memory.
 *
 * Lifecycle contract: a session ends when its command exits (the result is kept), or
 * when its sandbox stops or is destroyed (the agent connection closes; the command is
 * killed with the sandbox). Finished sessions are forgotten, with their spool files,
 * `retainMs` after they end, or on DELETE. Sessions do not survive a dsecd restart:
 * the agent kills the commands of a connection that drops (see docs/OPERATIONS.md).
 */
import { randomBytes } from 'node:crypto';
import { closeSync, mkdirSync, openSync, writeSync } from 'node:fs';
import { open, rm } from 'node:fs/promises';
import path from 'node:path';
import { constants as osConstants } from 'node:os';
import { deadlineExceeded, failedPrecondition, invalidArgument, notFound } from '../errors.js';
import type { AgentExecHandle, AgentExecOutcome } from '../agent/client.js';
import { signalName } from '../host/proc.js';

/** Which output stream. */
export type StreamName = 'stdout' | 'stderr';

/** Where an exec's output goes: an append-only file with a byte budget. */
class Spool {
  /** Bytes written to the file. */
  size = 0;
  /** Bytes produced beyond the budget and dropped. */
  dropped = 0;
  private fd: number | null;

  constructor(readonly file: string, private readonly maxBytes: number) {
    this.fd = openSync(file, 'w', 0o600);
  }

  /** Appends `b` (synchronously: a page-cache write), dropping what exceeds the budget. */
  append(b: Buffer): void {
    if (this.fd === null) return;
    const room = Math.max(0, this.maxBytes - this.size);
    const take = Math.min(room, b.length);
    if (take > 0) {
      writeSync(this.fd, b, 0, take);
      this.size += take;
    }
    this.dropped += b.length - take;
  }

  /** Stops writing (the file stays readable until removed). Safe to call twice. */
  close(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }
}

/** The public view of a session (API field names). */
export interface ExecInfo {
  exec_id: string;
  sandbox_id: string;
  argv: string[];
  tty: boolean;
  /** Whether stdin is open for writing (started with `stdin: true`). */
  stdin: boolean;
  state: 'running' | 'exited';
  /** pid inside the sandbox, null until the program started. */
  pid: number | null;
  started_at: number;
  finished_at: number | null;
  exit_code: number | null;
  signal: string | null;
  timed_out: boolean;
  /** Error text when the program could not be started (e.g. not found). */
  error: string | null;
  stdout_bytes: number;
  stderr_bytes: number;
  stdout_dropped_bytes: number;
  stderr_dropped_bytes: number;
}


/** One exec session; see the module comment. */
export class ExecSession {
  readonly startedAt = Date.now();
  finishedAt: number | null = null;
  pid: number | null = null;
  outcome: AgentExecOutcome | null = null;
  error: string | null = null;
  readonly spools: Record<StreamName, Spool>;
  private readonly waiters = new Set<() => void>();
  private readonly doneWaiters = new Set<() => void>();

  constructor(
    readonly id: string,
    readonly sandboxId: string,
    readonly ownerUid: number,
    readonly argv: string[],
    readonly tty: boolean,
    readonly stdinOpen: boolean,
    dir: string,
    spoolMaxBytes: number,
    readonly handle: AgentExecHandle,
  ) {
    this.spools = {
      stdout: new Spool(path.join(dir, `${id}.stdout`), spoolMaxBytes),
      stderr: new Spool(path.join(dir, `${id}.stderr`), spoolMaxBytes),
    };
  }

  /** True once the command ended (exit, exec error, or the sandbox went away). */
  get ended(): boolean {
    return this.finishedAt !== null;
  }

  /** Called by the manager with each output chunk. */
  output(stream: StreamName, b: Buffer): void {
    this.spools[stream].append(b);
    this.wake();
  }

  /** Called by the manager once the command ended. */
  finish(outcome: AgentExecOutcome | null, error: string | null): void {
    if (this.ended) return;
    this.outcome = outcome;
    this.error = error ?? (outcome?.kind === 'exec_error' ? outcome.message : null);
    this.finishedAt = Date.now();
    this.spools.stdout.close();
    this.spools.stderr.close();
    this.wake();
    for (const w of this.doneWaiters) w();
    this.doneWaiters.clear();
  }

  private wake(): void {
    const ws = [...this.waiters];
    this.waiters.clear();
    for (const w of ws) w();
  }

  /** Resolves at the next output or at the end (for followers that caught up). */
  changed(): Promise<void> {
    if (this.ended) return Promise.resolve();
    return new Promise((r) => this.waiters.add(r));
  }

  /**
   * Resolves once the command ended, or after `timeoutMs`.
   * @throws DsecError DeadlineExceeded when `timeoutMs` passes first.
   */
  async wait(timeoutMs?: number): Promise<void> {
    if (this.ended) return;
    await new Promise<void>((resolve, reject) => {
      const done = () => {
        if (t) clearTimeout(t);
        resolve();
      };
      this.doneWaiters.add(done);
      const t = timeoutMs === undefined ? null : setTimeout(() => {
        this.doneWaiters.delete(done);
        reject(deadlineExceeded(`exec ${this.id} still running after ${timeoutMs} ms`));
      }, timeoutMs);
    });
  }

  /**
   * Streams `stream` from byte `offset` to `write` in chunks of at most 256 KiB,
   * waiting for `write` to resolve before reading on (the reader's own backpressure).
   * With `follow`, waits for more output until the command ends; otherwise stops at
   * the current end. Returns the offset reached. Stops early when `aborted()` is true.
   */
  async pipe(stream: StreamName, offset: number, follow: boolean, write: (b: Buffer) => Promise<void>, aborted: () => boolean = () => false): Promise<number> {
    const spool = this.spools[stream];
    const fh = await open(spool.file, 'r');
    const buf = Buffer.allocUnsafe(256 * 1024);
    let pos = Math.max(0, offset);
    try {
      for (;;) {
        if (aborted()) return pos;
        if (pos < spool.size) {
          const { bytesRead } = await fh.read(buf, 0, Math.min(buf.length, spool.size - pos), pos);
          if (bytesRead === 0) break;
          pos += bytesRead;
          await write(Buffer.from(buf.subarray(0, bytesRead)));
          continue;
        }
        if (!follow || this.ended) return pos;
        await this.changed();
      }
      return pos;
    } finally {
      await fh.close();
    }
  }

  /** API view. */
  info(): ExecInfo {
    const o = this.outcome;
    return {
      exec_id: this.id,
      sandbox_id: this.sandboxId,
      argv: this.argv,
      tty: this.tty,
      stdin: this.stdinOpen,
      state: this.ended ? 'exited' : 'running',
      pid: this.pid,
      started_at: this.startedAt,
      finished_at: this.finishedAt,
      exit_code: o?.kind === 'exit' ? o.exitCode : o?.kind === 'exec_error' ? (o.errno === osConstants.errno.ENOENT ? 127 : 126) : null,
      signal: o?.kind === 'exit' && o.signal !== null ? signalName(o.signal) : null,
      timed_out: o?.kind === 'exit' ? o.timedOut : false,
      error: this.error,
      stdout_bytes: this.spools.stdout.size,
      stderr_bytes: this.spools.stderr.size,
      stdout_dropped_bytes: this.spools.stdout.dropped,
      stderr_dropped_bytes: this.spools.stderr.dropped,
    };
  }
}

/** Options of {@link ExecRegistry}. */
export interface ExecRegistryOptions {
  /** Directory of a sandbox's spool files: `<root>/sandboxes/<id>/execs`. */
  spoolDir: (sandboxId: string) => string;
  /** Output kept per stream per exec: default 1 GiB (on disk, not in memory). */
  spoolMaxBytes?: number;
  /** How long a finished session stays attachable: default 10 minutes. */
  retainMs?: number;
}

/** All live and recently finished sessions of this daemon. */
export class ExecRegistry {
  private readonly sessions = new Map<string, ExecSession>();
  private readonly spoolMax: number;
  private readonly retainMs: number;

  constructor(private readonly o: ExecRegistryOptions) {
    this.spoolMax = o.spoolMaxBytes ?? 1024 ** 3;
    this.retainMs = o.retainMs ?? 10 * 60 * 1000;
  }

  /**
   * Registers a session around a started agent exec: wires its output into the spool
   * and its end into the session. `start` receives the output callbacks and must start
   * the exec with them.
   */
  create(
    sandboxId: string,
    ownerUid: number,
    argv: string[],
    tty: boolean,
    stdinOpen: boolean,
    start: (handlers: { onStdout(b: Buffer): void; onStderr(b: Buffer): void }) => AgentExecHandle,
  ): ExecSession {
    const id = randomBytes(16).toString('hex');
    const dir = this.o.spoolDir(sandboxId);
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    let session: ExecSession | null = null;
    const early: [StreamName, Buffer][] = [];
    const handle = start({
      onStdout: (b) => (session ? session.output('stdout', b) : early.push(['stdout', b])),
      onStderr: (b) => (session ? session.output('stderr', b) : early.push(['stderr', b])),
    });
    session = new ExecSession(id, sandboxId, ownerUid, argv, tty, stdinOpen, dir, this.spoolMax, handle);
    for (const [s, b] of early) session.output(s, b);
    this.sessions.set(id, session);
    const s = session;
    handle.pid.then((pid) => { s.pid = pid; }, () => {});
    handle.done.then(
      (outcome) => s.finish(outcome, null),
      (e: Error) => s.finish(null, `the exec ended with its sandbox or agent connection: ${e.message}`),
    ).finally(() => {
      const t = setTimeout(() => void this.forget(id), this.retainMs);
      t.unref();
    });
    return session;
  }

  /**
   * The session `id` of sandbox `sandboxId`, if `uid` owns it (root, uid 0, may see
   * every session). Anything else is NotFound, so ids of other callers are not revealed.
   */
  get(sandboxId: string, id: string, uid: number): ExecSession {
    const s = this.sessions.get(id);
    if (!s || s.sandboxId !== sandboxId || (uid !== 0 && s.ownerUid !== uid)) throw notFound(`exec ${id} not found in sandbox ${sandboxId}`);
    return s;
  }

  /** Number of sessions held, by state (`running`, `exited`). */
  countByState(): Record<string, number> {
    const out: Record<string, number> = { running: 0, exited: 0 };
    for (const s of this.sessions.values()) out[s.ended ? 'exited' : 'running'] += 1;
    return out;
  }

  /** Sessions of a sandbox visible to `uid`, oldest first. */
  list(sandboxId: string, uid: number): ExecSession[] {
    return [...this.sessions.values()].filter((s) => s.sandboxId === sandboxId && (uid === 0 || s.ownerUid === uid)).sort((a, b) => a.startedAt - b.startedAt);
  }

  /** Kills a running session (SIGKILL to its process group) and forgets it with its spool. */
  async remove(sandboxId: string, id: string, uid: number): Promise<ExecInfo> {
    const s = this.get(sandboxId, id, uid);
    if (!s.ended) {
      s.handle.signal(9);
      await s.wait(5000).catch(() => {});
    }
    const info = s.info();
    await this.forget(id);
    return info;
  }

  /** Drops every session of a sandbox (it is being destroyed) and its spool dir. */
  async dropSandbox(sandboxId: string): Promise<void> {
    for (const s of [...this.sessions.values()]) if (s.sandboxId === sandboxId) this.sessions.delete(s.id);
    await rm(this.o.spoolDir(sandboxId), { recursive: true, force: true });
  }

  private async forget(id: string): Promise<void> {
    const s = this.sessions.get(id);
    if (!s) return;
    this.sessions.delete(id);
    s.spools.stdout.close();
    s.spools.stderr.close();
    await rm(s.spools.stdout.file, { force: true });
    await rm(s.spools.stderr.file, { force: true });
  }
}

/** Parses a signal given by name (`TERM`, `SIGTERM`) or number. @throws DsecError InvalidArgument. */
export function parseSignal(sig: string | number): number {
  if (typeof sig === 'number') {
    if (Number.isInteger(sig) && sig >= 1 && sig <= 64) return sig;
    throw invalidArgument(`signal ${sig} out of range 1..64`);
  }
  const name = sig.toUpperCase().startsWith('SIG') ? sig.toUpperCase() : `SIG${sig.toUpperCase()}`;
  const n = (osConstants.signals as Record<string, number>)[name];
  if (n === undefined) throw invalidArgument(`unknown signal ${sig}`);
  return n;
}

/** Throws FailedPrecondition unless the session's stdin is open for writing. */
export function assertStdin(s: ExecSession): void {
  if (!s.stdinOpen) throw failedPrecondition(`exec ${s.id} was started without stdin ("stdin": true opens it)`);
}
