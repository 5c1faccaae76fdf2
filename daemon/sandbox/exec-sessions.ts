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
 * A session started `paced` (what `dsec exec` streams through) has no spool: its output
 * is held in memory until its readers have taken it, and the command is paused while a
 * stream holds more than {@link PACED_WINDOW_BYTES} (its agent connection stops being
 * read, the agent stops reading its pipes, the command blocks on its writes). Nothing is
 * dropped and nothing is kept beyond the window, whatever the command prints; the price
 * is that output a reader took cannot be read again.
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

/**
 * Output of a paced session: held in memory until its readers have taken it, never
 * written anywhere. Bytes `[base, size)` are held, as the chunks the agent sent.
 * `pipe()` registers each reader's position; what every registered reader has passed is
 * let go. With no reader registered nothing is let go (output that came before the first
 * attach waits for it). The owner pauses the command's output while more than
 * {@link PACED_WINDOW_BYTES} are held (see ExecSession.output).
 */
class PacedBuffer {
  /** Offset of the end: every byte the command wrote to the stream. */
  size = 0;
  /** Never anything: a paced stream blocks the command instead of dropping. */
  readonly dropped = 0;
  /** Offset of the first byte held. */
  base = 0;
  private readonly chunks: Buffer[] = [];
  /** Position of each reader in {@link ExecSession.pipe}. */
  private readonly readers = new Map<symbol, number>();

  /** Bytes held. */
  get held(): number {
    return this.size - this.base;
  }

  append(b: Buffer): void {
    if (b.length === 0) return;
    this.chunks.push(b);
    this.size += b.length;
  }

  /** Paced output has no file to close. */
  close(): void {}

  /** Registers a reader at `offset` (at least {@link base}) and returns its key and position. */
  enter(offset: number): { key: symbol; pos: number } {
    const key = Symbol('reader');
    const pos = Math.max(this.base, Math.min(offset, this.size));
    this.readers.set(key, pos);
    return { key, pos };
  }

  /** Removes a reader: what it passed goes (unless another reader is behind it), what it left unread stays held for the next one. */
  leave(key: symbol): void {
    const pos = this.readers.get(key);
    this.readers.delete(key);
    if (pos !== undefined) this.release(pos);
  }

  /**
   * Takes up to `max` bytes at `pos` (≥ base, < size) for reader `key`, moves it past them
   * and lets go of what every reader has passed. The returned buffer is the reader's:
   * the held chunks may be dropped while it is being written.
   */
  take(key: symbol, pos: number, max: number): Buffer {
    let at = this.base;
    let i = 0;
    while (at + this.chunks[i].length <= pos) at += this.chunks[i++].length;
    const c = this.chunks[i];
    const part = c.subarray(pos - at, Math.min(c.length, pos - at + max));
    this.readers.set(key, pos + part.length);
    this.release(pos + part.length);
    return part;
  }

  /** Drops the chunks every registered reader has passed, and none past `upTo`. */
  private release(upTo = Infinity): void {
    let low = upTo;
    for (const p of this.readers.values()) low = Math.min(low, p);
    while (this.chunks.length > 0 && this.base + this.chunks[0].length <= low) this.base += this.chunks.shift()!.length;
  }
}

/**
 * Most output a paced session holds per stream before it pauses the command: 1 MiB. With
 * the agent's own queue (4 MiB per connection, docs/AGENT_PROTOCOL.md "Flow control") and
 * the pipe, that is how far a command runs ahead of its slowest reader; a quarter of it
 * resumes the command, so it is not woken for every chunk.
 */
export const PACED_WINDOW_BYTES = 1024 * 1024;

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
  /** Output paced by its readers rather than spooled (see StartExecRequest.paced). */
  paced: boolean;
  /** OOM kills in the sandbox while the command ran (see ExecResult.oom_kills); null while it runs or when unknown. */
  oom_kills: number | null;
}


/** One exec session; see the module comment. */
export class ExecSession {
  readonly startedAt = Date.now();
  finishedAt: number | null = null;
  pid: number | null = null;
  outcome: AgentExecOutcome | null = null;
  error: string | null = null;
  /** OOM kills in the sandbox while the command ran; set (by the exec service, daemon/sandbox/exec.ts) before it is marked ended. */
  oomKills: number | null = null;
  readonly spools: Record<StreamName, Spool | PacedBuffer>;
  /** Whether the command's output is paused because a paced stream holds too much. */
  private outputPaused = false;
  private readonly waiters = new Set<() => void>();
  private readonly doneWaiters = new Set<() => void>();

  /**
   * @param paced the output is held for the readers, not spooled; the handle's
   *   pauseOutput/resumeOutput keep at most about {@link PACED_WINDOW_BYTES} held per stream
   */
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
    readonly paced = false,
  ) {
    this.spools = paced
      ? { stdout: new PacedBuffer(), stderr: new PacedBuffer() }
      : {
        stdout: new Spool(path.join(dir, `${id}.stdout`), spoolMaxBytes),
        stderr: new Spool(path.join(dir, `${id}.stderr`), spoolMaxBytes),
      };
  }

  /** True once the command ended (exit, exec error, or the sandbox went away). */
  get ended(): boolean {
    return this.finishedAt !== null;
  }

  /** Called by the exec service with each output chunk. */
  output(stream: StreamName, b: Buffer): void {
    this.spools[stream].append(b);
    this.pace();
    this.wake();
  }

  /**
   * A paced session pauses the command's output while a stream holds more than
   * {@link PACED_WINDOW_BYTES} and resumes it once both hold a quarter of that or less.
   */
  private pace(): void {
    if (!this.paced || this.ended) return;
    const held = Math.max((this.spools.stdout as PacedBuffer).held, (this.spools.stderr as PacedBuffer).held);
    if (!this.outputPaused && held > PACED_WINDOW_BYTES) {
      this.outputPaused = true;
      this.handle.pauseOutput();
    } else if (this.outputPaused && held <= PACED_WINDOW_BYTES / 4) {
      this.outputPaused = false;
      this.handle.resumeOutput();
    }
  }

  /** Bytes held for the readers of a paced session, per stream (0 when spooled). */
  heldBytes(): Record<StreamName, number> {
    if (!this.paced) return { stdout: 0, stderr: 0 };
    return { stdout: (this.spools.stdout as PacedBuffer).held, stderr: (this.spools.stderr as PacedBuffer).held };
  }

  /** Called by the exec service once the command ended. */
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
    if (spool instanceof PacedBuffer) return this.pipePaced(spool, offset, follow, write, aborted);
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

  /**
   * {@link pipe} for a paced stream: from the oldest byte held when `offset` is older;
   * each chunk taken is let go once every reader has passed it, which may resume the
   * command.
   */
  private async pipePaced(buf: PacedBuffer, offset: number, follow: boolean, write: (b: Buffer) => Promise<void>, aborted: () => boolean): Promise<number> {
    const { key, pos: start } = buf.enter(offset);
    let pos = start;
    try {
      for (;;) {
        if (aborted()) return pos;
        if (pos < buf.size) {
          pos = Math.max(pos, buf.base);
          const part = buf.take(key, pos, 256 * 1024);
          pos += part.length;
          this.pace();
          await write(part);
          continue;
        }
        if (!follow || this.ended) return pos;
        await this.changed();
      }
    } finally {
      buf.leave(key);
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
      paced: this.paced,
      oom_kills: this.ended ? this.oomKills : null,
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
   * (or, `paced`, into the buffer its readers pace) and its end into the session. `start`
   * receives the output callbacks and must start the exec with them.
   */
  create(
    sandboxId: string,
    ownerUid: number,
    argv: string[],
    tty: boolean,
    stdinOpen: boolean,
    start: (handlers: { onStdout(b: Buffer): void; onStderr(b: Buffer): void }) => AgentExecHandle,
    paced = false,
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
    session = new ExecSession(id, sandboxId, ownerUid, argv, tty, stdinOpen, dir, this.spoolMax, handle, paced);
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
    for (const sp of [s.spools.stdout, s.spools.stderr]) {
      sp.close();
      if (sp instanceof Spool) await rm(sp.file, { force: true });
    }
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
