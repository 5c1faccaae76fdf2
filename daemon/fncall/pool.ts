/**
 * The fncall tier: bounded pools of pre-warmed worker sandboxes, one pool per image,
 * each worker serving one isolated call at a time.
 *
 * A worker is an ordinary container sandbox of backend `fncall` (so the lifecycle,
 * restart safety and leak accounting are the container tier's), whose agent runs every
 * call in fresh pid, mount, IPC and UTS namespaces with the image read-only and fresh
 * tmpfs mounts on /tmp and /dev/shm (docs/AGENT_PROTOCOL.md, "Isolated execs"). Nothing
 * of a call survives it, so a worker is reused as is; it is replaced when a call ends
 * in a way that may have left it unhealthy (an OOM kill, a lost agent connection) and
 * after {@link FncallPoolConfig.callsPerWorker} calls, which bounds whatever a kernel
 * object might still accumulate.
 *
 * Sizing: a pool grows with demand up to `maxWorkers` (calls beyond that wait in a FIFO
 * queue of at most `maxQueue`), and idle workers beyond `minIdle` are destroyed after
 * `idleMs` without a call.
 */
import type { Logger } from 'pino';
import { deadlineExceeded, DsecError, resourceExhausted, unavailable } from '../errors.js';
import type { ExecResult } from '../model/exec.js';
import type { SandboxRecord } from '../model/sandbox.js';

/** Label every worker sandbox carries (`dsec ls --selector dsec.fncall` lists them). */
export const FNCALL_WORKER_LABEL = 'dsec.fncall';

/** Sizing of every pool (config `[fncall]`). */
export interface FncallPoolConfig {
  /** Most workers per image; default 4 x cores (a call is mostly fork+exec: more than that only queues on the CPU). */
  maxWorkers: number;
  /** Idle workers kept warm per image even when unused; default 1. */
  minIdle: number;
  /** An idle worker beyond `minIdle` is destroyed after this long without a call, ms; default 60,000. */
  idleMs: number;
  /** Calls a worker serves before it is replaced; default 10,000. */
  callsPerWorker: number;
  /** Calls waiting for a worker, per image, before new ones are refused (ResourceExhausted); default 10,000. */
  maxQueue: number;
  /** Memory limit of a worker when the call names none, bytes; default 512 MiB. */
  memoryBytes: number;
  /** CPU limit of a worker, cores; default all cores (a call is limited by its wall-clock timeout). */
  cpus: number;
  /** Process limit of a worker (contains fork bombs); default 256. */
  pids: number;
}

/** One call, as the pool runs it. */
export interface FncallCall {
  /** Image reference; pools are keyed by the resolved `name:tag`. */
  image: string;
  argv: string[];
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  stdin?: Buffer;
  /** Wall-clock limit, ms; the whole process tree is killed when it passes. */
  timeoutMs?: number;
  /** Memory limit for this call, bytes; default {@link FncallPoolConfig.memoryBytes}. */
  memoryBytes?: number;
  /** Size of the call's fresh /tmp, bytes; default 64 MiB. */
  tmpBytes?: number;
  /** More fresh tmpfs mounts for the call (see IsolateOptions.scratch). */
  scratch?: { path: string; bytes: number }[];
}

/** What the pool needs from the rest of dsecd (the lifecycle manager and cgroups); a seam for tests. */
export interface WorkerHost {
  /**
   * Resolves an image reference: `ref` is its canonical `name:tag`, `key` also names its
   * content (the layer digests), so a retagged image gets a new pool and the old one's
   * workers idle out. @throws DsecError NotFound.
   */
  resolveImage(ref: string): Promise<{ ref: string; key: string }>;
  /** True when the worker's sandbox is still running (its row exists and its init is alive). */
  alive(sb: SandboxRecord): boolean;
  /** Creates and starts a worker sandbox for `image`. */
  createWorker(image: string, limits: { memoryBytes: number; cpus: number; pids: number }): Promise<SandboxRecord>;
  /** Destroys a worker (force). Safe to call for one already gone. */
  destroyWorker(id: string): Promise<void>;
  /** Runs one isolated call in a worker. @throws DsecError Unavailable when the agent is lost. */
  execIsolated(sb: SandboxRecord, call: FncallCall): Promise<ExecResult>;
  /** Sets the worker's memory limit, bytes. */
  setMemoryLimit(id: string, bytes: number): Promise<void>;
}

/** A pre-warmed worker and its bookkeeping. */
interface Worker {
  sb: SandboxRecord;
  calls: number;
  memoryBytes: number;
  lastUsed: number;
}

/** Counters of one pool, for host info and metrics. */
export interface PoolStats {
  image: string;
  workers: number;
  idle: number;
  busy: number;
  starting: number;
  queued: number;
  calls: number;
  replaced: number;
}

/** The workers of one image. */
class Pool {
  readonly idle: Worker[] = [];
  readonly busy = new Set<Worker>();
  starting = 0;
  calls = 0;
  replaced = 0;
  readonly queue: Array<{ resolve: (w: Worker) => void; reject: (e: Error) => void }> = [];

  /** @param image the image reference workers are created from; the pool's map key also names its content. */
  constructor(readonly image: string) {}

  get size(): number {
    return this.idle.length + this.busy.size + this.starting;
  }
}

/** Every fncall pool of this dsecd. */
export class FncallPools {
  private readonly pools = new Map<string, Pool>();
  private timer: NodeJS.Timeout | null = null;
  private closed = false;
  /** Destroys in flight (see {@link retire}). */
  private readonly retiring = new Set<Promise<unknown>>();

  constructor(private readonly host: WorkerHost, readonly config: FncallPoolConfig, private readonly log: Logger) {}

  /** Starts the idle sweep (every idleMs / 4, at least every second). Safe to call twice. */
  start(): void {
    if (this.timer) return;
    this.timer = setInterval(() => void this.shrink(), Math.max(1000, Math.floor(this.config.idleMs / 4)));
    this.timer.unref();
  }

  /**
   * Runs one call on a worker of its image: waits for an idle worker, starts one when
   * the pool is below its cap, or queues.
   * @throws DsecError NotFound (image), ResourceExhausted (queue full), Unavailable (the
   *   worker was lost mid-call; it is replaced), Internal (a worker could not start).
   */
  async run(call: FncallCall, signal?: AbortSignal): Promise<ExecResult> {
    if (this.closed) throw unavailable('dsecd is shutting down');
    const { ref, key } = await this.host.resolveImage(call.image);
    const pool = this.pool(key, ref);
    // The call's timeout bounds its wait for a worker too; the command gets what is left.
    const started = Date.now();
    let w = await this.acquire(pool, call.timeoutMs, signal);
    while (!this.host.alive(w.sb)) {
      // Destroyed or killed from outside while idle: replace it rather than fail the call.
      this.release(pool, w, false);
      w = await this.acquire(pool, call.timeoutMs === undefined ? undefined : Math.max(1, call.timeoutMs - (Date.now() - started)), signal);
    }
    const left = call.timeoutMs === undefined ? undefined : Math.max(1, call.timeoutMs - (Date.now() - started));
    let healthy = false;
    try {
      const mem = call.memoryBytes ?? this.config.memoryBytes;
      if (mem !== w.memoryBytes) {
        await this.host.setMemoryLimit(w.sb.id, mem);
        w.memoryBytes = mem;
      }
      const r = await this.host.execIsolated(w.sb, { ...call, ...(left !== undefined ? { timeoutMs: left } : {}) });
      // An OOM kill may have hit the namespace init rather than the command; a fresh worker is cheap.
      healthy = !r.oom;
      return r;
    } catch (e) {
      // A refused request (bad cwd or user, argument list too long) never touched the worker.
      if (e instanceof DsecError && e.kind === 'InvalidArgument') healthy = true;
      throw e;
    } finally {
      pool.calls += 1;
      w.calls += 1;
      w.lastUsed = Date.now();
      this.release(pool, w, healthy && w.calls < this.config.callsPerWorker);
    }
  }

  private pool(key: string, ref: string): Pool {
    let p = this.pools.get(key);
    if (!p) {
      p = new Pool(ref);
      this.pools.set(key, p);
    }
    return p;
  }

  /**
   * An idle worker, a new one, or a place in the queue.
   * @param waitMs give up after this long (DeadlineExceeded); undefined waits as long as it takes.
   * @param signal give up when aborted (the caller went away): the queued call never runs.
   */
  private acquire(pool: Pool, waitMs?: number, signal?: AbortSignal): Promise<Worker> {
    const w = pool.idle.pop();
    if (w) {
      pool.busy.add(w);
      return Promise.resolve(w);
    }
    if (pool.queue.length >= this.config.maxQueue) {
      return Promise.reject(resourceExhausted(`fncall pool of ${pool.image} has ${pool.queue.length} calls waiting (fncall.max_queue); retry later`));
    }
    const p = new Promise<Worker>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const entry = {
        resolve: (w: Worker) => { clear(); resolve(w); },
        reject: (e: Error) => { clear(); reject(e); },
      };
      const giveUp = (e: Error) => {
        const i = pool.queue.indexOf(entry);
        if (i >= 0) pool.queue.splice(i, 1);
        entry.reject(e);
      };
      const onAbort = () => giveUp(unavailable('the caller went away before a worker was free'));
      const clear = () => {
        if (timer) clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      };
      if (waitMs !== undefined) {
        timer = setTimeout(() => giveUp(deadlineExceeded(`no fncall worker of ${pool.image} became free within the call's timeout (${waitMs} ms)`)), waitMs);
      }
      signal?.addEventListener('abort', onAbort, { once: true });
      pool.queue.push(entry);
    });
    if (pool.size < this.config.maxWorkers) void this.grow(pool);
    return p;
  }

  /** Starts one worker and hands it to the first waiter (or parks it idle). */
  private async grow(pool: Pool): Promise<void> {
    pool.starting += 1;
    let w: Worker;
    try {
      const sb = await this.host.createWorker(pool.image, { memoryBytes: this.config.memoryBytes, cpus: this.config.cpus, pids: this.config.pids });
      w = { sb, calls: 0, memoryBytes: this.config.memoryBytes, lastUsed: Date.now() };
    } catch (e) {
      pool.starting -= 1;
      // Nothing is running in this pool to serve the waiters: fail them rather than hang.
      const err = e instanceof DsecError ? e : new DsecError('Internal', `fncall worker for ${pool.image} failed to start: ${(e as Error).message}`, { cause: e });
      if (pool.busy.size === 0 && pool.starting === 0) for (const q of pool.queue.splice(0)) q.reject(err);
      else pool.queue.shift()?.reject(err);
      this.log.error({ err: e, image: pool.image }, 'fncall worker failed to start');
      return;
    }
    pool.starting -= 1;
    if (this.closed) {
      await this.host.destroyWorker(w.sb.id).catch(() => {});
      return;
    }
    this.hand(pool, w);
  }

  /** Gives a ready worker to the next waiter, or parks it idle. */
  private hand(pool: Pool, w: Worker): void {
    const q = pool.queue.shift();
    if (q) {
      pool.busy.add(w);
      q.resolve(w);
    } else {
      pool.idle.push(w);
    }
  }

  private release(pool: Pool, w: Worker, keep: boolean): void {
    pool.busy.delete(w);
    if (keep && !this.closed) {
      this.hand(pool, w);
      return;
    }
    pool.replaced += 1;
    this.retire(w);
    // Keep serving the queue: a replacement starts at once when calls are waiting.
    if (pool.queue.length > 0 && pool.size < this.config.maxWorkers) void this.grow(pool);
  }

  /**
   * Destroys idle workers beyond `minIdle` that have not served a call for `idleMs`.
   * @returns ids destroyed.
   */
  async shrink(now = Date.now()): Promise<string[]> {
    const gone: string[] = [];
    for (const pool of this.pools.values()) {
      // idle is a stack (most recently used last): the oldest are at the front.
      while (pool.idle.length > this.config.minIdle && now - pool.idle[0].lastUsed >= this.config.idleMs) {
        const w = pool.idle.shift()!;
        gone.push(w.sb.id);
        this.retire(w);
      }
    }
    return gone;
  }

  /** Per-image counters. */
  stats(): PoolStats[] {
    return [...this.pools.values()].map((p) => ({
      image: p.image, workers: p.idle.length + p.busy.size, idle: p.idle.length, busy: p.busy.size, starting: p.starting,
      queued: p.queue.length, calls: p.calls, replaced: p.replaced,
    }));
  }

  /** Ids of every worker the pools hold now. */
  workerIds(): Set<string> {
    const ids = new Set<string>();
    for (const p of this.pools.values()) for (const w of [...p.idle, ...p.busy]) ids.add(w.sb.id);
    return ids;
  }

  /** Destroys a worker in the background; {@link close} waits for every such destroy. */
  private retire(w: Worker): void {
    const p = this.host.destroyWorker(w.sb.id).catch((e) => this.log.error({ err: e, id: w.sb.id }, 'destroying an fncall worker failed'));
    this.retiring.add(p);
    void p.finally(() => this.retiring.delete(p));
  }

  /**
   * Stops the sweep, fails queued calls and destroys every worker: idle ones, and busy
   * ones too (their calls end with Unavailable; the API has drained requests before
   * this runs). Resolves when every destroy has finished, so nothing outlives dsecd.
   */
  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    for (const p of this.pools.values()) {
      for (const q of p.queue.splice(0)) q.reject(unavailable('dsecd is shutting down'));
      for (const w of [...p.idle.splice(0), ...p.busy]) this.retire(w);
      p.busy.clear();
    }
    while (this.retiring.size) await Promise.all([...this.retiring]);
  }
}
