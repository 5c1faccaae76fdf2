/**
 * The sandbox lifecycle: the one place that turns API requests into store intents and
 * driver actions, in the order that makes every step restart-safe:
 *
 *   1. write the intent to the store (row in `creating`, or `desired = <target>`),
 *   2. act through the backend's driver,
 *   3. commit the new state (which acknowledges a create).
 *
 * After a crash, {@link SandboxManager.reconcile} finishes or undoes each half-done
 * step: unacknowledged creates and starts are rolled back, stops and destroys are
 * rolled forward, live sandboxes are adopted, and host leftovers no row accounts for
 * are removed.
 */
import type { FncallCall } from '../fncall/pool.js';
import type { IsolateOptions } from '../agent/protocol.js';
import { randomBytes } from 'node:crypto';
import { taggedId } from '../fleet/layout.js';
import type { Logger } from 'pino';
import type { Backend, CreateSandboxRequest, DefenceStatus, ExecRequest, ExecResult, ForkRequest, NetworkSpec, RestoreRequest, SnapshotRequest, StartExecRequest, Event as ApiEvent } from '../api/schema.js';
import path from 'node:path';
import { ExecRegistry, type ExecSession } from './execs.js';
import type { DaemonConfig } from '../config.js';
import { conflict, DsecError, failedPrecondition, invalidArgument, isDsecError, resourceExhausted, unimplemented, wrap } from '../errors.js';
import os, { constants as osConstants } from 'node:os';

const { ENOENT, E2BIG } = osConstants.errno;
import type { ConsoleClientHandlers, MachineRestore, ReclaimReport, SandboxDriver, SandboxStats } from '../drivers/types.js';
import { mkdir, readdir, rm } from 'node:fs/promises';
import type { AgentClient, AgentExecHandle } from '../agent/client.js';
import { MAX_LAYERS, parseRef, type ImageManifest, type ImageStore, type LayerMeta } from '../image/store.js';
import { normaliseExclude, packWritableLayer } from '../image/commit.js';
import { procStartTime, signalName } from '../host/proc.js';
import { watchExit, type ExitWatch } from '../host/pidwatch.js';
import { ContainerDriver } from '../drivers/container/driver.js';
import { Failpoints } from './failpoints.js';
import { createObserver, phaseMessage, type CreateProgressSink } from './progress.js';
import { parseSelector, SandboxRepo, type ImageConfig, type SandboxRecord } from './repo.js';
import type { SnapshotRecord, SnapshotRepo } from './snapshots.js';
import type { TrajectoryLog } from './trajectory.js';
import { probeCriu } from '../host/criu.js';
import type { SandboxNetworking } from '../net/network.js';
import type { DiskUsage, WritableLayerStore as UpperStore } from '../storage/writable-layers.js';
import { defaultReserveBytes, guardPool, humanBytes, quotaCap, type PoolEntry } from '../storage/pool.js';
import type { IoLimits } from '../host/cgroups/io.js';
import { WRITABLE_PATH_REFUSED_REASON, resolveFilesystem, type ResolvedFilesystem } from '../security/filesystem.js';
import type { ImageSecurity } from '../image/security.js';
import { profileInfo } from '../security/seccomp.js';
import { POOL_LABEL, shellKey, type WarmPoolEntry, type WarmPools } from './warm-pool.js';

/** Whether a row is a warm-pool shell not yet claimed (daemon/sandbox/warm-pool.ts). */
export function isPoolShell(sb: SandboxRecord): boolean {
  return sb.labels[POOL_LABEL] !== undefined;
}

/** Actions of {@link SandboxManager.bulk}. */
export type BulkAction = 'pause' | 'resume' | 'stop' | 'destroy' | 'set_ttl';

/** One sandbox's outcome in a bulk operation. */
export interface BulkResult {
  id: string;
  ok: boolean;
  state?: string;
  reclaim?: ReclaimReport;
  error?: { code: string; message: string };
}

/** Default grace between SIGTERM and SIGKILL on stop: 10 s, Docker's `docker stop` default. */
export const DEFAULT_STOP_GRACE_MS = 10_000;

/** What {@link SandboxManager.reconcile} found and did at start. */
export interface ReconcileReport {
  /** User sandboxes found alive and adopted. */
  adopted: string[];
  /** Warm-pool shells of the previous dsecd found alive; main destroys them right after (never adopted). */
  shells: string[];
  rolledBack: string[];
  finished: string[];
  failed: string[];
  orphans: string[];
}

/** Serialises lifecycle operations per sandbox id (create/stop/start/destroy never interleave on one sandbox). */
class KeyedMutex {
  private readonly tails = new Map<string, Promise<unknown>>();

  /** Runs `fn` after every earlier holder of `key` finished. */
  async run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.catch(() => {}).then(fn);
    this.tails.set(key, next);
    try {
      return await next;
    } finally {
      if (this.tails.get(key) === next) this.tails.delete(key);
    }
  }
}

/** Dependencies of the manager. */
export interface ManagerDeps {
  config: DaemonConfig;
  repo: SandboxRepo;
  images: ImageStore;
  drivers: Map<Backend, SandboxDriver>;
  failpoints: Failpoints;
  log: Logger;
  snapshots: SnapshotRepo;
  trajectories: TrajectoryLog;
  /** Sandbox networking (daemon/net/network.ts); absent: only mode none is accepted. */
  network?: SandboxNetworking;
  /** The writable-layer store: quota support and capacity for `disk_bytes`, usage for stats and the quota check. */
  storage: UpperStore;
  /** In a fleet, the host's id tag (6 hex) that begins new sandbox and snapshot ids (daemon/fleet/layout.ts taggedId); else absent. */
  idTag?: string;
}

/** What a new sandbox is made of: an image's layers and config, or a snapshot's. */
interface SandboxSource {
  /** `name:tag` of the image. */
  image: string;
  layers: string[];
  config: ImageConfig;
  /** The snapshot restored, if any. */
  snapshotId: string | null;
  /** A machine snapshot (kind vm) to resume instead of booting, if any. */
  restore?: MachineRestore;
}

/** Label naming the fork (or restore) call that created a sandbox: `fork-<16 hex>`; one value per call. */
export const FORK_LABEL = 'dsec.fork';

/** Chunk size of snapshot layers: 4 KiB, the page size, so any hole of a sparse file costs nothing in the blob. */
const SNAPSHOT_CHUNK_BYTES = 4096;

/** Wall-clock limit of an fncall that names none: 60 s, so a runaway call cannot hold a worker forever. */
export const FNCALL_DEFAULT_TIMEOUT_MS = 60_000;

/**
 * How close to its quota a writable layer counts as full for the `sandbox.disk_quota`
 * event: 4 MiB, or 1/16 of a smaller quota. A write that hits the limit fails with
 * EDQUOT once usage plus the write's reservation would pass it, so a layer that was
 * filled stops below the limit by up to one write batch (btrfs reserves a few MiB per
 * batch of pages); usage must fall below twice the slack before another event.
 */
export function diskFullSlack(limitBytes: number): number {
  return Math.min(4 * 1024 * 1024, Math.floor(limitBytes / 16));
}

/** Cores of this host, read once (os.cpus() reads /proc/cpuinfo on every call). */
const CORES = os.cpus().length;

/** Sandboxes a fork creates at once: 4, enough to overlap runc's work on 2 cores without queueing the event loop behind mounts. */
const FORK_CONCURRENCY = 4;

/** The lifecycle of every sandbox on this host. */
export class SandboxManager {
  private readonly mutex = new KeyedMutex();
  /** Sandboxes whose writable layer the last quota check found full (see {@link checkDiskQuotas}). */
  private readonly diskFull = new Set<string>();
  /** Limits the pool guard set below sandboxes' quotas, bytes, by id (daemon/storage/pool.ts). */
  private readonly guarded = new Map<string, number>();
  /** Live layer use at the previous guard check, bytes, of the entries it looked at. */
  private readonly poolPrevious = new Map<string, number>();
  /** Sandboxes stopped by the full store that have had their `sandbox.disk_pool_full` event. */
  private readonly poolFull = new Set<string>();
  /** Whether the first guard check (which adopts limits a previous dsecd left) has run. */
  private guardAdopted = false;
  /** Exec sessions (streamed, background, PTY) of every sandbox. */
  readonly execs: ExecRegistry;
  /** The warm pools creates may claim from ({@link attachPool}); null: none. */
  private pool: WarmPools | null = null;
  /** User creates in flight (not pool fills): warm-pool refill waits while there are any. */
  private userCreates = 0;
  /** performance.now() when a user create last started or ended; -Infinity: never. */
  private lastUserCreate = -Infinity;

  constructor(private readonly d: ManagerDeps) {
    this.execs = new ExecRegistry({ spoolDir: (sid) => path.join(d.config.root, 'sandboxes', sid, 'execs') });
  }

  /** Lets creates claim shells of `pool` (built after the manager: its fills go through {@link createShell}). */
  attachPool(pool: WarmPools): void {
    this.pool = pool;
  }

  /** User creates in flight now (see {@link WarmPools}: refill is low priority). */
  get userCreatesInFlight(): number {
    return this.userCreates;
  }

  /** Ms since a user create last started or ended (Infinity when none has run): warm-pool refill waits for a quiet moment. */
  get msSinceUserCreate(): number {
    return performance.now() - this.lastUserCreate;
  }

  private driver(backend: Backend): SandboxDriver {
    const drv = this.d.drivers.get(backend);
    if (!drv) throw unimplemented(`backend ${backend} is not implemented yet; use backend "container"`);
    return drv;
  }

  /**
   * Creates and starts a sandbox. The response is sent only after the running state is
   * committed, so an acknowledged sandbox always survives a daemon crash. `onProgress`
   * hears each phase of the create once, in order (daemon/sandbox/progress.ts); a
   * sandbox claimed from the warm pool reports `ready` alone.
   * @throws DsecError Unimplemented (backend not built), NotFound (unknown image),
   *   ResourceExhausted (uid pool), Internal (runtime failure; nothing is left behind).
   */
  async create(req: CreateSandboxRequest, opts: { worker?: boolean; onProgress?: CreateProgressSink } = {}): Promise<SandboxRecord> {
    if (req.backend === 'fncall' && !opts.worker) {
      throw invalidArgument('fncall is the stateless tier: run calls with POST /v1/run (`dsec run --backend fncall` or `dsec call`), not as a sandbox');
    }
    this.driver(req.backend);
    this.userCreates += 1;
    this.lastUserCreate = performance.now();
    try {
      this.checkLimits(req);
      this.checkIo(req);
      const disk = this.diskQuota(req.disk_bytes, undefined);
      this.admit(req.cpus ?? this.d.config.defaults.cpus, req.memory_bytes ?? this.d.config.defaults.memoryBytes, req.backend === 'container' ? disk : null);
      // A backend may own a kind of reference (the vm tier's `disk:NAME`); else the image store resolves it.
      const own = await this.driver(req.backend).resolveImage?.(req.image);
      const image = own ? null : await this.d.images.get(req.image);
      const network = await this.settleNetwork(req.network, req.backend);
      const src = own ? { image: own.image, layers: own.layers, config: own.config, snapshotId: null }
        : { image: `${image!.name}:${image!.tag}`, layers: image!.layers, config: image!.config, snapshotId: null };
      const settled = { ...req, network, disk_bytes: disk ?? undefined };
      if (!own && req.backend === 'container' && !opts.worker) {
        const claimed = await this.claimFromPool(settled, src);
        if (claimed) {
          opts.onProgress?.({ phase: 'ready', id: claimed.id, message: phaseMessage('ready', claimed.backend, false) });
          return claimed;
        }
      }
      return await this.createFrom(settled, src, { onProgress: opts.onProgress });
    } finally {
      this.userCreates -= 1;
      this.lastUserCreate = performance.now();
    }
  }

  /**
   * The key of the shell a create would claim (daemon/sandbox/warm-pool.ts shellKey), or
   * null when the request names something a running shell cannot take on: a seccomp
   * override (in the runtime's filter) or the batch priority class (the agent's
   * scheduling policy). Everything else is applied at the claim.
   */
  private requestKey(req: CreateSandboxRequest, src: SandboxSource): string | null {
    if (req.seccomp || (req.priority ?? 'latency') !== 'latency') return null;
    return shellKey({
      image: src.image, layers: src.layers, seccompSha: profileInfo().sha256,
      filesystem: resolveFilesystem(req.filesystem, src.config.security, this.d.config.filesystem),
      network: req.network?.mode ?? 'none', diskBytes: req.disk_bytes ?? null,
    });
  }

  /**
   * Answers a create from the warm pool: takes a matching ready shell and claims it
   * ({@link claim}); a shell that cannot be claimed (its init died, a limit cannot be
   * written) is destroyed and the next one tried. Null when no shell matches.
   */
  private async claimFromPool(req: CreateSandboxRequest, src: SandboxSource): Promise<SandboxRecord | null> {
    if (!this.pool?.enabled) return null;
    const key = this.requestKey(req, src);
    if (key === null) return null;
    for (;;) {
      const shell = this.pool.take(key, src.image, req.network?.mode ?? 'none');
      if (!shell) return null;
      try {
        return await this.claim(shell.id, req);
      } catch (e) {
        this.d.log.warn({ err: e, id: shell.id }, 'a warm-pool shell could not be claimed; destroying it');
        await this.destroy(shell.id, true, 'warm-pool shell could not be claimed').catch((e2) => this.d.log.error({ err: e2, id: shell.id }, 'destroying an unclaimable shell failed'));
      }
    }
  }

  /**
   * Makes shell `id` the sandbox `req` asks for: its limits written to its cgroup, its
   * network rules applied, then one row update with the request's labels, env, TTL,
   * idle timeout, limits, network and a creation time of now (repo.claimShell). That
   * update acknowledges the create: a crash before it leaves a shell (destroyed at the
   * next start), after it a user sandbox (adopted).
   * @throws DsecError FailedPrecondition when the shell is no longer a live, unclaimed shell.
   */
  private async claim(id: string, req: CreateSandboxRequest): Promise<SandboxRecord> {
    return this.mutex.run(id, async () => {
      const sb = this.d.repo.find(id);
      if (!sb || !isPoolShell(sb) || sb.state !== 'running' || sb.desired !== null || sb.initPid === null || procStartTime(sb.initPid) !== sb.initStart) {
        throw failedPrecondition(`warm-pool shell ${id} is gone or not running`);
      }
      const drv = this.driver(sb.backend);
      const limits = { cpus: req.cpus ?? this.d.config.defaults.cpus, memoryBytes: req.memory_bytes ?? this.d.config.defaults.memoryBytes, pids: req.pids ?? this.d.config.defaults.pids };
      const io = this.ioOf(req);
      if (limits.cpus !== sb.cpus || limits.memoryBytes !== sb.memoryBytes || limits.pids !== sb.pids) {
        if (!drv.applyLimits) throw failedPrecondition(`backend ${sb.backend} cannot change limits of a running sandbox`);
        await drv.applyLimits(sb, limits);
      }
      if (JSON.stringify(io) !== JSON.stringify(sb.io)) {
        if (!drv.applyIo) throw failedPrecondition(`backend ${sb.backend} cannot change I/O settings of a running sandbox`);
        await drv.applyIo(sb, io);
      }
      const network = req.network ?? null;
      if (network && this.d.network) await this.d.network.update(sb, network);
      const done = this.d.repo.claimShell(id, {
        labels: req.labels ?? {}, env: req.env ?? {}, ttlS: req.ttl_s ?? null, idleTimeoutS: req.idle_timeout_s ?? null, ...limits, network, io, now: Date.now(),
      });
      this.d.failpoints.hit('create.after-ack');
      this.d.repo.event('sandbox.created', done, 'from the warm pool');
      return done;
    });
  }

  /**
   * The key and canonical image of the shells of a `[[pool.entries]]` entry, as
   * {@link requestKey} computes it for a create of that image with no other options.
   * @throws DsecError NotFound (image), FailedPrecondition (network mode unavailable).
   */
  async shellKeyOf(entry: WarmPoolEntry): Promise<{ key: string; image: string }> {
    const m = await this.d.images.get(entry.image);
    const src: SandboxSource = { image: `${m.name}:${m.tag}`, layers: m.layers, config: m.config, snapshotId: null };
    const network = entry.network === 'none' ? undefined : await this.settleNetwork({ mode: entry.network }, 'container');
    const disk = this.diskQuota(undefined, undefined);
    return { key: this.requestKey({ backend: 'container', image: entry.image, network, disk_bytes: disk ?? undefined }, src)!, image: src.image };
  }

  /**
   * Creates one warm-pool shell of `entry` with key `key` (its {@link POOL_LABEL} value):
   * an ordinary create with the defaults and no user-visible settings, recorded without a
   * `sandbox.created` event (that comes at the claim).
   * @throws as {@link create}.
   */
  async createShell(entry: WarmPoolEntry, key: string): Promise<SandboxRecord> {
    const m = await this.d.images.get(entry.image);
    const src: SandboxSource = { image: `${m.name}:${m.tag}`, layers: m.layers, config: m.config, snapshotId: null };
    const network = entry.network === 'none' ? undefined : await this.settleNetwork({ mode: entry.network }, 'container');
    const disk = this.diskQuota(undefined, undefined);
    return this.createFrom({ backend: 'container', image: entry.image, labels: { [POOL_LABEL]: key }, network, disk_bytes: disk ?? undefined }, src, { shell: true });
  }

  /**
   * Validates a requested network and settles its mode (daemon/net/network.ts); null for
   * mode none, which is what a sandbox without a network has.
   * @param backend the sandbox's tier: a microvm or vm has no network device yet (its
   *   guest has only loopback), so only mode none is accepted there.
   * @throws DsecError InvalidArgument (bad rules, unknown policy, allow/open for a
   *   microvm or vm), FailedPrecondition (allow/open where networking is unavailable).
   */
  private async settleNetwork(spec: NetworkSpec | null | undefined, backend: Backend): Promise<NetworkSpec | undefined> {
    if (!spec) return undefined;
    const vmTier = backend === 'microvm' || backend === 'vm';
    const refuseVm = (mode: string) => invalidArgument(`network mode ${mode} is not available for backend ${backend}: microVMs and VMs have no network yet (the guest has only loopback); use network mode none (the default)`);
    if (vmTier && (spec.mode ?? 'none') !== 'none') throw refuseVm(spec.mode!);
    const settled = this.d.network
      ? await this.d.network.settle(spec)
      : (spec.mode ?? 'none') === 'none' && !spec.policy && !spec.allow?.length && !spec.deny?.length
        ? { ...spec, mode: 'none' as const }
        : (() => { throw failedPrecondition('this dsecd has no sandbox networking; use network mode none (the default)'); })();
    if (vmTier && settled.mode !== 'none') throw refuseVm(String(settled.mode));
    return settled.mode === 'none' ? undefined : settled;
  }

  /**
   * Changes the network of a sandbox: stored at once, applied at once to a running or
   * paused one (allow <-> open, rules, policy), or at its next start. Between none and
   * allow/open the sandbox would need a different network namespace, so that is refused.
   * @throws DsecError NotFound, InvalidArgument (bad rules), FailedPrecondition (none <-> other).
   */
  async setNetwork(id: string, spec: NetworkSpec): Promise<SandboxRecord> {
    return this.mutex.run(id, async () => {
      const sb = this.d.repo.get(id);
      const next = (await this.settleNetwork(spec, sb.backend)) ?? null;
      const from = sb.network?.mode ?? 'none', to = next?.mode ?? 'none';
      if ((from === 'none') !== (to === 'none')) {
        throw failedPrecondition(`sandbox ${id} has network mode ${from}; it cannot become ${to} while it exists (${from === 'none' ? 'it has no veth or egress programs' : 'its network namespace keeps its veth'}). `
          + `Create a new sandbox with --network ${to}, or snapshot this one and restore it with network mode ${to}`);
      }
      const done = this.d.repo.setNetwork(id, next);
      if ((sb.state === 'running' || sb.state === 'paused') && next && this.d.network) {
        try {
          await this.d.network.update(done, next);
        } catch (e) {
          this.d.repo.setNetwork(id, sb.network);
          throw e instanceof DsecError ? e : wrap(e, `apply network of sandbox ${id}`);
        }
      }
      this.d.repo.event('network.updated', done, `mode=${to}${next?.policy ? ` policy=${next.policy}` : ''} allow=${next?.allow?.length ?? 0} deny=${next?.deny?.length ?? 0}`);
      return done;
    });
  }

  /**
   * Refuses limits above what the host has: they can never be honoured, so say so
   * instead of overcommitting silently.
   * @throws DsecError InvalidArgument.
   */
  private checkLimits(req: { cpus?: number; memory_bytes?: number }): void {
    const cores = CORES;
    if (req.cpus !== undefined && req.cpus > cores) throw invalidArgument(`cpus ${req.cpus} is more than this host's ${cores} cores`);
    if (req.memory_bytes !== undefined && req.memory_bytes > os.totalmem()) {
      throw invalidArgument(`memory_bytes ${req.memory_bytes} is more than this host's ${os.totalmem()} bytes of memory`);
    }
  }

  /**
   * Refuses I/O settings for a backend they do not apply to: only container sandboxes
   * write to the writable-layer store's device (a microVM's or VM's disk is a file on
   * the host filesystem, written by its VMM).
   * @throws DsecError InvalidArgument.
   */
  private checkIo(req: CreateSandboxRequest): void {
    if (req.backend !== 'container' && (req.io_weight !== undefined || req.io_max !== undefined)) {
      throw invalidArgument(`io_weight and io_max apply to container sandboxes only (they act on the writable-layer store's device); backend ${req.backend} keeps its disk in a file on the host filesystem. Leave them out`);
    }
  }

  /**
   * The I/O settings a sandbox made by `req` gets: the request's, else `[defaults]`
   * io_weight and io_max; null for a backend other than container (see {@link checkIo}).
   */
  private ioOf(req: CreateSandboxRequest): IoLimits | null {
    if (req.backend !== 'container') return null;
    const def = this.d.config.defaults.io;
    const m = req.io_max;
    return {
      weight: req.io_weight ?? def.weight,
      readBps: m ? m.read_bps ?? null : def.readBps, writeBps: m ? m.write_bps ?? null : def.writeBps,
      readIops: m ? m.read_iops ?? null : def.readIops, writeIops: m ? m.write_iops ?? null : def.writeIops,
    };
  }

  /**
   * The writable-layer quota of a new sandbox, in bytes: the request's, else the
   * source's (restore, fork), else `[defaults] disk_bytes` (at most the store's size);
   * null where the store enforces no quota (then only an explicit request is an error).
   * @throws DsecError FailedPrecondition (explicit quota, store without quotas),
   *   InvalidArgument (more than the store holds).
   */
  private diskQuota(explicit: number | undefined, inherited: number | null | undefined): number | null {
    const store = this.d.storage;
    if (!store.enforcesQuota) {
      if (explicit !== undefined) throw failedPrecondition(`disk_bytes cannot be enforced on this host: ${store.status().detail}; leave disk_bytes out`);
      return null;
    }
    const cap = store.capacityBytes();
    // The default never makes a create fail: on a store smaller than it, it is the store's size.
    const v = explicit ?? inherited ?? (cap !== null ? Math.min(this.d.config.defaults.diskBytes, cap) : this.d.config.defaults.diskBytes);
    if (cap !== null && v > cap) {
      const what = explicit !== undefined ? `disk_bytes ${v}` : `the snapshot's disk_bytes ${v}`;
      throw invalidArgument(`${what} is more than the writable-layer store can hold (${cap} bytes on ${store.imagePath}); ask for at most ${cap} bytes, or make the store larger ([storage] size_bytes, docs/OPERATIONS.md)`);
    }
    return v;
  }

  /** Live disk use of a sandbox's writable layer and its quota, bytes; null where the store cannot tell (host filesystem). Any state. */
  diskUsage(id: string): DiskUsage | null {
    return this.d.storage.usage(id);
  }

  /**
   * Disk use of every writable layer in the store, by sandbox id, read at once (btrfs:
   * one tree search; counters as of the last transaction commit, at most its 30 s
   * interval old). For listings; {@link diskUsage} is live for one sandbox.
   */
  diskUsageAll(): Map<string, DiskUsage> {
    try {
      return this.d.storage.usageAll();
    } catch (e) {
      this.d.log.warn({ err: e }, 'reading writable-layer usage failed');
      return new Map();
    }
  }

  /**
   * One quota check (called by the reaper every sweep): records a `sandbox.disk_quota`
   * event when a sandbox's writable layer has become full (within
   * {@link diskFullSlack} of its quota). The kernel's own signal is EDQUOT, returned to
   * the writing process inside the sandbox and counted nowhere, so the store's usage
   * counters are polled instead: one tree search for every btrfs qgroup. Edge-triggered:
   * one event per time a layer fills up (a restarted dsecd reports a still-full layer once).
   * @returns ids that became full in this check.
   */
  checkDiskQuotas(): string[] {
    let usage: Map<string, DiskUsage>;
    try {
      usage = this.d.storage.usageAll();
    } catch (e) {
      this.d.log.warn({ err: e }, 'reading writable-layer usage failed');
      return [];
    }
    const hit: string[] = [];
    try {
      hit.push(...this.guardStore(usage));
    } catch (e) {
      this.d.log.warn({ err: e }, 'the writable-layer pool guard failed');
    }
    for (const [id, u] of usage) {
      // A limit the pool guard set is not the sandbox's quota: its event is disk_pool_full.
      if (u.limitBytes === null || this.guarded.has(id)) continue;
      const slack = diskFullSlack(u.limitBytes);
      if (u.usedBytes >= u.limitBytes - slack) {
        const sb = this.d.repo.find(id);
        if (this.diskFull.has(id) || !sb) continue;
        this.diskFull.add(id);
        this.d.repo.event('sandbox.disk_quota', sb, `writable layer full: ${u.usedBytes} of ${u.limitBytes} bytes (disk_bytes); writes fail with EDQUOT inside`);
        hit.push(id);
      } else if (u.usedBytes < u.limitBytes - 2 * slack) this.diskFull.delete(id);
    }
    for (const id of this.diskFull) if (!usage.has(id)) this.diskFull.delete(id);
    return hit;
  }

  /**
   * The store's reserve, bytes: `[storage] reserve_bytes`, else pool.ts
   * defaultReserveBytes of the store's size.
   */
  reserveBytes(sizeBytes: number): number {
    return this.d.config.storage.reserveBytes ?? defaultReserveBytes(sizeBytes);
  }

  /**
   * One check of the pool guard (daemon/storage/pool.ts), part of {@link checkDiskQuotas}:
   * while the store's free space above its reserve is less than some sandbox's headroom,
   * limits each sandbox that wrote since the last check so the kernel stops it before the
   * reserve, and puts quotas back once there is room. Records `sandbox.disk_pool_full`
   * (edge-triggered) for a sandbox that reached such a limit: it was filling the store.
   * @param usage the store's usage counters of this check (committed; btrfs: as of the last transaction).
   * @returns ids that got the event in this check.
   */
  private guardStore(usage: Map<string, DiskUsage>): string[] {
    const store = this.d.storage;
    const space = store.enforcesQuota ? store.space() : null;
    if (!space) return [];
    const reserve = this.reserveBytes(space.sizeBytes);
    if (reserve === 0 && this.guarded.size === 0) return [];
    const room = space.availableBytes - reserve;
    const quotas = this.d.repo.diskQuotas();
    if (!this.guardAdopted) {
      // Limits below quotas that a previous dsecd's guard left in the kernel.
      for (const [id, q] of quotas) {
        const cur = store.currentLimit(id);
        if (cur !== null && cur < q) this.guarded.set(id, cur);
      }
      this.guardAdopted = true;
    }
    const entries: PoolEntry[] = [];
    const live = new Map<string, number>();
    // Bytes the examined sandboxes wrote that statfs does not count yet (in the page cache
    // or not committed): their live use above the committed counters of this check.
    let pending = 0;
    for (const [id, q] of quotas) {
      const u = usage.get(id);
      if (!u) continue;
      // Entries with room for their whole headroom need no live reading unless guarded.
      if (room >= q - u.usedBytes && !this.guarded.has(id)) {
        this.poolPrevious.delete(id);
        continue;
      }
      const used = store.usage(id)?.usedBytes ?? u.usedBytes;
      live.set(id, used);
      pending += Math.max(0, used - u.usedBytes);
      entries.push({ id, quotaBytes: q, usedBytes: used, previousBytes: this.poolPrevious.get(id) ?? null, guardLimitBytes: this.guarded.get(id) ?? null });
      this.poolPrevious.set(id, used);
    }
    for (const id of this.guarded.keys()) if (!quotas.has(id)) this.guarded.delete(id);
    for (const id of this.poolPrevious.keys()) if (!quotas.has(id)) this.poolPrevious.delete(id);
    for (const dcs of guardPool(space.availableBytes - pending, reserve, entries)) {
      if (!store.setPoolLimit(dcs.id, dcs.limitBytes)) continue;
      if (dcs.restore) {
        this.guarded.delete(dcs.id);
        this.poolFull.delete(dcs.id);
        this.d.log.info({ id: dcs.id, limitBytes: dcs.limitBytes }, 'the writable-layer store has room again: quota restored');
      } else this.guarded.set(dcs.id, dcs.limitBytes);
    }
    const hit: string[] = [];
    for (const [id, limit] of this.guarded) {
      const used = live.get(id);
      if (used === undefined || this.poolFull.has(id) || used < limit - diskFullSlack(limit)) continue;
      const sb = this.d.repo.find(id);
      if (!sb) continue;
      this.poolFull.add(id);
      this.d.repo.event('sandbox.disk_pool_full', sb,
        `the writable-layer store ${store.location} is full: ${space.availableBytes} bytes free of ${space.sizeBytes} (${humanBytes(space.availableBytes)} of ${humanBytes(space.sizeBytes)}), `
        + `with ${reserve} bytes (${humanBytes(reserve)}) kept for other sandboxes; this sandbox was writing, so its writes now fail with EDQUOT at ${used} bytes, `
        + `below its disk_bytes ${quotas.get(id)} (${humanBytes(quotas.get(id)!)}), until the store has room again (sum of quotas: ${humanBytes([...quotas.values()].reduce((a, b) => a + b, 0))}, admission.disk_overcommit ${this.d.config.admission.diskOvercommit})`);
      hit.push(id);
    }
    return hit;
  }

  /**
   * The pool as host info shows it: the store's space, the sum of the quotas it holds
   * (warm-pool shells included), what admission allows them to sum to, the reserve, and
   * how many sandboxes the guard holds below their quotas. Null without a store that
   * enforces quotas.
   */
  poolInfo(): { size_bytes: number; used_bytes: number; available_bytes: number; quota_sum_bytes: number; quota_cap_bytes: number; disk_overcommit: number; reserve_bytes: number; guarded: number } | null {
    const space = this.d.storage.enforcesQuota ? this.d.storage.space() : null;
    if (!space) return null;
    let sum = 0;
    for (const q of this.d.repo.diskQuotas().values()) sum += q;
    const overcommit = this.d.config.admission.diskOvercommit;
    return {
      size_bytes: space.sizeBytes, used_bytes: space.usedBytes, available_bytes: space.availableBytes, quota_sum_bytes: sum,
      quota_cap_bytes: quotaCap({ sizeBytes: space.sizeBytes, overcommit }), disk_overcommit: overcommit,
      reserve_bytes: this.reserveBytes(space.sizeBytes), guarded: this.guarded.size,
    };
  }

  /** Records the intent, creates through the driver, commits `running` (see {@link create}), reporting its phases to `opts.onProgress`; admission is the caller's. */
  private async createFrom(req: CreateSandboxRequest, src: SandboxSource, opts: { shell?: boolean; onProgress?: CreateProgressSink } = {}): Promise<SandboxRecord> {
    const drv = this.driver(req.backend);
    const id = taggedId(this.d.idTag);
    // The create's steps, reported as its phases when the caller asked for progress.
    const fp = opts.onProgress ? this.d.failpoints.observed(createObserver(id, req.backend, !!src.restore, opts.onProgress)) : this.d.failpoints;
    const rec = this.d.repo.insertCreating({
      id,
      backend: req.backend,
      image: src.image,
      imageLayers: src.layers,
      imageConfig: src.config,
      cpus: req.cpus ?? this.d.config.defaults.cpus,
      memoryBytes: req.memory_bytes ?? this.d.config.defaults.memoryBytes,
      pids: req.pids ?? this.d.config.defaults.pids,
      labels: req.labels ?? {},
      env: req.env ?? {},
      ttlS: req.ttl_s ?? null,
      priority: req.priority ?? 'latency',
      idleTimeoutS: req.idle_timeout_s ?? null,
      createdAt: Date.now(),
      snapshotId: src.snapshotId,
      seccomp: req.seccomp ?? null,
      network: req.network ?? null,
      diskBytes: req.disk_bytes ?? null,
      io: this.ioOf(req),
      // Resolved now and stored, so a later config or image change never alters it.
      filesystem: resolveFilesystem(req.filesystem, src.config.security, this.d.config.filesystem),
    });
    fp.hit('create.after-intent');
    await this.d.images.syncLeases(this.layersInUse());
    return this.mutex.run(id, async () => {
      let init;
      try {
        init = await drv.create(rec, fp, src.restore);
      } catch (e) {
        this.d.log.warn({ err: e, id }, 'create failed; cleaning up');
        await drv.destroy(rec, this.d.failpoints).catch((e2) => this.d.log.error({ err: e2, id }, 'cleanup after failed create failed'));
        this.d.repo.remove(id);
        this.noteRefusal(e, { ...rec, state: 'failed' });
        this.d.repo.event('sandbox.failed', { ...rec, state: 'failed' }, `create failed: ${(e as Error).message}`);
        throw e instanceof DsecError ? e : wrap(e, `create sandbox ${id}`);
      }
      const done = this.d.repo.transition(id, 'running', { initPid: init.pid, initStart: init.start });
      this.watchInit(id, init.pid, init.start);
      if (opts.shell) return done;
      fp.hit('create.after-ack');
      this.d.repo.event('sandbox.created', done);
      return done;
    });
  }

  /**
   * Records a `sandbox.writable_path_refused` event (message: the error's) when `e` is a
   * create or start refused because a writable path resolves through a symlink to where
   * it must not lead (daemon/security/filesystem.ts, reason `writable_path_refused`), so
   * a watcher of events sees the attempt apart from other failures. Anything else: nothing.
   */
  private noteRefusal(e: unknown, sb: SandboxRecord): void {
    if (e instanceof DsecError && e.reason === WRITABLE_PATH_REFUSED_REASON) this.d.repo.event('sandbox.writable_path_refused', sb, e.message);
  }

  /**
   * Admission: refuses a create that would take the host past its configured limits
   * (count of sandboxes, sum of memory limits over total memory times the memory
   * overcommit ratio, sum of CPU limits over cores times the CPU overcommit ratio, sum of
   * writable-layer quotas over the store's size times the disk overcommit ratio).
   * Checked before anything is written, so a refused create leaves nothing behind.
   * @param diskBytes the writable-layer quota of each new sandbox, or null when it takes
   *   none from the store (no quota enforced, or not a container sandbox).
   * @throws DsecError ResourceExhausted naming the limit.
   */
  private admit(cpus: number, memoryBytes: number, diskBytes: number | null, count = 1): void {
    const a = this.d.config.admission;
    // Pool shells are bounded by [pool] and give way to the creates that claim them.
    const live = this.d.repo.admissionTotals();
    if (live.count + count > a.maxSandboxes) {
      throw resourceExhausted(`host is at its limit of ${a.maxSandboxes} sandboxes (admission.max_sandboxes)`
        + `${count > 1 ? ` and has room for ${Math.max(0, a.maxSandboxes - live.count)} more, not ${count}` : ''}; destroy some first`);
    }
    cpus *= count;
    memoryBytes *= count;
    const mem = live.memoryBytes + memoryBytes;
    const memCap = os.totalmem() * a.memoryOvercommit;
    if (mem > memCap) {
      throw resourceExhausted(`memory limits would total ${mem} bytes, over ${Math.floor(memCap)} (host memory x admission.memory_overcommit ${a.memoryOvercommit})`);
    }
    const cpu = live.cpus + cpus;
    const cpuCap = CORES * a.cpuOvercommit;
    if (cpu > cpuCap) {
      throw resourceExhausted(`CPU limits would total ${cpu} cores, over ${cpuCap} (host cores x admission.cpu_overcommit ${a.cpuOvercommit})`);
    }
    const size = diskBytes === null ? null : this.d.storage.capacityBytes();
    if (diskBytes !== null && size !== null) {
      const disk = live.diskBytes + diskBytes * count;
      const cap = quotaCap({ sizeBytes: size, overcommit: a.diskOvercommit });
      if (disk > cap) {
        throw resourceExhausted(`writable-layer quotas would total ${disk} bytes (${humanBytes(disk)}: ${humanBytes(live.diskBytes)} of sandboxes on this host + ${count > 1 ? `${count} x ` : ''}${humanBytes(diskBytes)}), `
          + `over ${cap} bytes (${humanBytes(cap)}: the ${humanBytes(size)} writable-layer store pool ${this.d.storage.location} x admission.disk_overcommit ${a.diskOvercommit}); `
          + 'ask for a smaller disk_bytes, destroy sandboxes, or raise admission.disk_overcommit (docs/OPERATIONS.md)');
      }
    }
  }

  /**
   * Attaches to the serial console of a vm sandbox (`dsec console`): guest output goes to
   * `c`; the returned writer sends input to the guest.
   * @throws DsecError NotFound, FailedPrecondition (not a vm sandbox: only full VMs have a
   *   serial console; or not running/paused), Unavailable (console not connected).
   */
  attachConsole(id: string, c: ConsoleClientHandlers): { write(b: Buffer): boolean; detach(): void; drained(): Promise<void> } {
    const sb = this.d.repo.get(id);
    const drv = this.driver(sb.backend);
    if (!drv.attachConsole) {
      throw failedPrecondition(`sandbox ${id} is a ${sb.backend} sandbox: only vm sandboxes have a serial console; use \`dsec exec -it ${id} -- sh\` for a terminal in it`);
    }
    if (sb.state !== 'running' && sb.state !== 'paused') throw failedPrecondition(`sandbox ${id} is ${sb.state}; its serial console exists only while the VM runs (dsec start ${id})`);
    return drv.attachConsole(sb, c);
  }

  /** Host path of a sandbox's serial console log (vm sandboxes: `<root>/sandboxes/<id>/console.log`). */
  consoleLogPath(id: string): string {
    return path.join(this.d.config.root, 'sandboxes', this.d.repo.get(id).id, 'console.log');
  }

  /**
   * The filesystem options in force for sandbox `id`: as resolved and stored at create,
   * and for a sandbox created before they were stored, resolved now over its image and
   * the config (as its driver does at start).
   * @throws DsecError NotFound.
   */
  filesystemOf(id: string): ResolvedFilesystem {
    const sb = this.d.repo.get(id);
    return resolveFilesystem(sb.filesystem, sb.imageConfig.security, this.d.config.filesystem);
  }

  /** @throws DsecError NotFound. */
  get(id: string): SandboxRecord {
    return this.d.repo.get(id);
  }

  /**
   * Sandboxes matching the selector (and state, when given), oldest first. Warm-pool
   * shells are no one's sandboxes yet and are never listed.
   * @throws DsecError InvalidArgument for a malformed selector.
   */
  list(selector?: string, state?: string): SandboxRecord[] {
    let match: (l: Record<string, string>) => boolean;
    try {
      match = parseSelector(selector);
    } catch (e) {
      throw invalidArgument((e as Error).message);
    }
    return this.d.repo.all().filter((s) => !isPoolShell(s) && match(s.labels) && (!state || s.state === state));
  }

  /**
   * Stops every process of the sandbox; the writable layer stays. Processes get SIGTERM
   * and `graceMs` (default {@link DEFAULT_STOP_GRACE_MS}) to exit, then SIGKILL.
   * @throws DsecError NotFound, FailedPrecondition (not running/paused/failed).
   */
  async stop(id: string, graceMs = DEFAULT_STOP_GRACE_MS): Promise<SandboxRecord> {
    return this.mutex.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (sb.state === 'stopped') return sb;
      if (!['running', 'paused', 'failed'].includes(sb.state)) throw failedPrecondition(`sandbox ${id} is ${sb.state}; cannot stop it`);
      this.d.repo.setDesired(id, 'stopped');
      this.d.failpoints.hit('stop.after-intent');
      await this.driver(sb.backend).stop(sb, this.d.failpoints, { graceMs: sb.state === 'running' ? graceMs : 0 });
      const done = this.d.repo.transition(id, 'stopped', { initPid: null, initStart: null });
      this.d.repo.event('sandbox.stopped', done);
      return done;
    });
  }

  /**
   * Starts a stopped (or failed) sandbox on its kept writable layer.
   * @throws DsecError NotFound, FailedPrecondition (already running, creating).
   */
  async start(id: string): Promise<SandboxRecord> {
    return this.mutex.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (sb.state === 'running') return sb;
      if (sb.state !== 'stopped' && sb.state !== 'failed') throw failedPrecondition(`sandbox ${id} is ${sb.state}; cannot start it`);
      const drv = this.driver(sb.backend);
      this.d.repo.setDesired(id, 'running');
      this.d.failpoints.hit('start.after-intent');
      let init;
      try {
        if (sb.state === 'failed') await drv.stop(sb, this.d.failpoints);
        init = await drv.start(sb, this.d.failpoints);
      } catch (e) {
        await drv.stop(sb, this.d.failpoints).catch(() => {});
        const failed = this.d.repo.transition(id, 'failed', { initPid: null, initStart: null, error: `start failed: ${(e as Error).message}` });
        this.noteRefusal(e, failed);
        this.d.repo.event('sandbox.failed', failed, failed.error ?? undefined);
        throw e instanceof DsecError ? e : wrap(e, `start sandbox ${id}`);
      }
      const done = this.d.repo.transition(id, 'running', { initPid: init.pid, initStart: init.start, error: null });
      this.watchInit(id, init.pid, init.start);
      this.d.repo.event('sandbox.started', done);
      return done;
    });
  }

  /**
   * Pauses a running sandbox: freezes every process and reclaims its page cache
   * (anonymous memory too where the host has swap). Idempotent: pausing a paused
   * sandbox returns it with no reclaim report.
   * @throws DsecError NotFound, FailedPrecondition (not running).
   */
  async pause(id: string): Promise<{ sandbox: SandboxRecord; reclaim: ReclaimReport | null }> {
    return this.mutex.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (sb.state === 'paused') return { sandbox: sb, reclaim: null };
      if (sb.state !== 'running') throw failedPrecondition(`sandbox ${id} is ${sb.state}; only a running sandbox can be paused`);
      this.d.repo.setDesired(id, 'paused');
      let reclaim: ReclaimReport;
      try {
        reclaim = await this.driver(sb.backend).pause(sb);
      } catch (e) {
        await this.driver(sb.backend).resume(sb).catch(() => {});
        this.d.repo.setDesired(id, null);
        throw e instanceof DsecError ? e : wrap(e, `pause sandbox ${id}`);
      }
      const done = this.d.repo.transition(id, 'paused');
      this.d.repo.event('sandbox.paused', done, `reclaimed ${reclaim.reclaimed_bytes} bytes`);
      return { sandbox: done, reclaim };
    });
  }

  /**
   * Resumes a paused sandbox exactly where it stopped. Idempotent on a running one.
   * @throws DsecError NotFound, FailedPrecondition (not paused or running).
   */
  async resume(id: string): Promise<SandboxRecord> {
    return this.mutex.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (sb.state === 'running') return sb;
      if (sb.state !== 'paused') throw failedPrecondition(`sandbox ${id} is ${sb.state}; only a paused sandbox can be resumed`);
      this.d.repo.setDesired(id, 'running');
      await this.driver(sb.backend).resume(sb);
      const done = this.d.repo.transition(id, 'running');
      this.d.repo.touchActive(id);
      this.d.repo.event('sandbox.resumed', done);
      return done;
    });
  }

  /**
   * Applies one action to every sandbox matching `selector`, at most 8 at a time, and
   * reports a result per sandbox (one failure does not stop the others).
   * @throws DsecError InvalidArgument for a malformed or empty selector.
   */
  async bulk(selector: string, action: BulkAction, opts: { ttlS?: number | null; graceMs?: number } = {}): Promise<BulkResult[]> {
    if (!selector.trim()) throw invalidArgument('bulk operations need a non-empty selector (e.g. job=a,round=3)');
    const targets = this.list(selector);
    const results: BulkResult[] = new Array(targets.length);
    let next = 0;
    const worker = async () => {
      while (next < targets.length) {
        const i = next++;
        const id = targets[i].id;
        try {
          let sb: SandboxRecord;
          let reclaim: ReclaimReport | null = null;
          switch (action) {
            case 'pause': ({ sandbox: sb, reclaim } = await this.pause(id)); break;
            case 'resume': sb = await this.resume(id); break;
            case 'stop': sb = await this.stop(id, opts.graceMs); break;
            case 'destroy': sb = await this.destroy(id, true, 'bulk destroy'); break;
            case 'set_ttl': sb = this.d.repo.setTtl(id, opts.ttlS ?? null); break;
          }
          results[i] = { id, ok: true, state: sb.state, ...(reclaim ? { reclaim } : {}) };
        } catch (e) {
          const err = e instanceof DsecError ? e : wrap(e, `${action} ${id}`);
          results[i] = { id, ok: false, error: { code: err.kind, message: err.message } };
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(8, targets.length) }, worker));
    return results;
  }

  /**
   * One sweep of lease expiry (called by the reaper): lapsed leases pause their job's
   * sandboxes; leases lapsed longer than the destroy grace destroy them and are deleted.
   * All decisions are read from the store, so a restart neither loses nor repeats one.
   */
  async sweepLeases(now = Date.now()): Promise<{ paused: string[]; destroyed: string[] }> {
    const out = { paused: [] as string[], destroyed: [] as string[] };
    const sel = (job: string) => `job=${job}`;
    for (const job of this.d.repo.lapseDue(now)) this.d.repo.event('lease.lapsed', null, `job ${job}`);
    for (const job of this.d.repo.lapsedJobs()) {
      for (const r of await this.bulk(sel(job), 'pause')) if (r.ok && r.reclaim) out.paused.push(r.id);
    }
    for (const job of this.d.repo.lapsedBefore(now - this.d.config.leases.destroyGraceMs)) {
      for (const r of await this.bulk(sel(job), 'destroy')) if (r.ok) out.destroyed.push(r.id);
      if (this.list(sel(job)).length === 0) {
        this.d.repo.deleteLease(job);
        this.d.repo.event('lease.reclaimed', null, `job ${job}`);
      }
    }
    for (const id of this.d.repo.idleDue(now)) {
      await this.pause(id).then(() => out.paused.push(id), () => {});
    }
    return out;
  }

  /**
   * Destroys a sandbox and everything it has on the host.
   * @param force when false, a running or paused sandbox is refused.
   * @param reason recorded in the destroyed event (e.g. "ttl expired").
   * @returns the last record, with state `destroyed`.
   * @throws DsecError NotFound, FailedPrecondition (running without force).
   */
  async destroy(id: string, force: boolean, reason?: string): Promise<SandboxRecord> {
    return this.mutex.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (!force && (sb.state === 'running' || sb.state === 'paused')) {
        throw failedPrecondition(`sandbox ${id} is ${sb.state}; stop it first or destroy with force`);
      }
      this.d.repo.setDesired(id, 'destroyed');
      this.d.failpoints.hit('destroy.after-intent');
      await this.driver(sb.backend).destroy(sb, this.d.failpoints);
      await this.execs.dropSandbox(id);
      this.d.repo.remove(id);
      await this.d.images.syncLeases(this.layersInUse());
      const gone: SandboxRecord = { ...sb, state: 'destroyed', desired: null, initPid: null, updatedAt: Date.now() };
      this.d.repo.event('sandbox.destroyed', gone, reason);
      return gone;
    });
  }

  /**
   * Runs a command to completion in a running sandbox.
   * @throws DsecError NotFound, FailedPrecondition (not running), InvalidArgument (bad
   *   cwd or user inside the sandbox), Unavailable (agent unreachable or lost mid-exec).
   */
  /** The command as the agent runs it: env = image env < sandbox env < request env; cwd and user default to the image's. */
  private resolveCommand(sb: SandboxRecord, req: { argv: string[]; env?: Record<string, string>; cwd?: string; user?: string; timeout_ms?: number }) {
    const env = new Map<string, string>();
    for (const kv of sb.imageConfig.env) {
      const i = kv.indexOf('=');
      if (i > 0) env.set(kv.slice(0, i), kv.slice(i + 1));
    }
    for (const [k, v] of Object.entries(sb.env)) env.set(k, v);
    for (const [k, v] of Object.entries(req.env ?? {})) env.set(k, v);
    return {
      argv: req.argv,
      env: [...env].map(([k, v]) => `${k}=${v}`),
      cwd: req.cwd ?? sb.imageConfig.cwd ?? '/',
      user: req.user ?? sb.imageConfig.user ?? '0',
      timeoutMs: req.timeout_ms,
    };
  }

  /**
   * Starts an exec session: the command runs on its own, owned by `ownerUid`, its
   * output spooled for any number of readers, or with `paced` held for them and the
   * command paused while they are behind (daemon/sandbox/execs.ts). Resolves once the
   * program started or failed to (not found, not executable: an exited session with its
   * error). The session's `oom_kills` is the sandbox's OOM kill count after it ended
   * minus before it started.
   * @throws DsecError NotFound, FailedPrecondition (not running), Unavailable (agent
   *   unreachable), InvalidArgument (a cwd or user the sandbox does not have, or argv and
   *   env too long for execve; no session is kept).
   */
  async startExec(id: string, req: StartExecRequest, ownerUid: number): Promise<ExecSession> {
    const sb = this.d.repo.get(id);
    ContainerDriver.assertRunning(sb);
    if (sb.idleTimeoutS !== null) this.d.repo.touchActive(id);
    const cmd = this.resolveCommand(sb, req);
    if (req.tty && !cmd.env.some((e) => e.startsWith('TERM='))) cmd.env.push('TERM=xterm');
    // Output may arrive before the session exists; it is held until the sink is set.
    const early: ['stdout' | 'stderr', Buffer][] = [];
    let sink: ((s: 'stdout' | 'stderr', b: Buffer) => void) | null = null;
    const drv = this.driver(sb.backend);
    // The sandbox's OOM kill counter before and after the command (ExecInfo.oom_kills).
    const oomBefore = drv.oomKillCount ? await drv.oomKillCount(sb) : null;
    let session: ExecSession | null = null;
    const started = await drv.startExec(sb, { ...cmd, stdin: !!req.stdin, tty: req.tty, paced: !!req.paced }, {
      onStdout: (b) => (sink ? sink('stdout', b) : early.push(['stdout', b])),
      onStderr: (b) => (sink ? sink('stderr', b) : early.push(['stderr', b])),
    });
    // The session ends once the count after is read, so its ExecInfo at the end has it.
    const done = started.done.then(async (outcome) => {
      const after = oomBefore === null || !drv.oomKillCount ? null : await drv.oomKillCount(sb);
      if (session) session.oomKills = after === null || oomBefore === null ? null : Math.max(0, after - oomBefore);
      return outcome;
    });
    done.catch(() => {});
    const handle: AgentExecHandle = { ...started, done };
    session = this.execs.create(id, ownerUid, req.argv, !!req.tty, !!req.stdin, (handlers) => {
      sink = (s, b) => (s === 'stdout' ? handlers.onStdout(b) : handlers.onStderr(b));
      for (const [s, b] of early.splice(0)) sink(s, b);
      return handle;
    }, !!req.paced);
    // A cwd or user the sandbox does not have is the request's fault, as for POST .../exec
    // (runExec): InvalidArgument, and no session is left behind.
    const startFailed = await started.pid.then(() => false, () => true);
    if (startFailed) {
      await session.wait();
      const o = session.outcome;
      if (o?.kind === 'exec_error' && (/^(chdir|user)\b/.test(o.message) || o.errno === E2BIG)) {
        await this.execs.remove(id, session.id, 0).catch(() => {});
        throw invalidArgument(o.errno === E2BIG ? `sandbox ${id}: argument list and environment are too long for execve (${o.message})` : `sandbox ${id}: ${o.message}`);
      }
    }
    this.d.repo.event('exec.started', sb, `${session.id} ${JSON.stringify(req.argv).slice(0, 200)}`);
    void session.wait().then(() => {
      const i = session.info();
      const row = this.d.repo.find(id);
      if (row) this.d.repo.event('exec.finished', row, `${session.id} exit=${i.exit_code ?? 'none'} signal=${i.signal ?? 'none'}`);
    });
    return session;
  }

  async exec(id: string, req: ExecRequest): Promise<ExecResult> {
    const sb = this.d.repo.get(id);
    const stdin = req.stdin_b64 !== undefined ? Buffer.from(req.stdin_b64, 'base64') : undefined;
    if (stdin && stdin.length > 16 * 1024 * 1024) throw invalidArgument('stdin_b64 decodes to more than 16 MiB');
    if (req.trajectory === undefined || req.step === undefined) {
      ContainerDriver.assertRunning(sb);
      return this.runExec(sb, req, stdin);
    }
    // A replay touches nothing in the sandbox, so it is answered in any state; a step
    // that must run needs a running sandbox, checked before `started` is recorded.
    const decision = this.d.trajectories.begin(req.trajectory, req.step, id, req, req.truncate ?? false, Date.now(), () => ContainerDriver.assertRunning(sb));
    if (decision.kind === 'replay') return decision.result;
    const tok = decision.token;
    let r: ExecResult;
    try {
      r = await this.runExec(sb, req, stdin);
    } catch (e) {
      // InvalidArgument comes from checks that run before the command (cwd, user, execve
      // limits): nothing ran. Anything else may have broken off a running command.
      if (isDsecError(e, 'InvalidArgument')) this.d.trajectories.abandon(tok);
      else this.d.trajectories.unknown(tok, `the command was cut off: ${(e as Error).message}`);
      throw e;
    }
    this.d.failpoints.hit('trajectory.before-record');
    this.d.trajectories.finish(tok, r);
    return { ...r, trajectory: req.trajectory, step: req.step, replayed: false };
  }

  /**
   * Runs one isolated call in an fncall worker (daemon/fncall/pool.ts): fresh pid,
   * mount, IPC and UTS namespaces, the image read-only, fresh /tmp and /dev/shm.
   * @throws as {@link exec}.
   */
  async execIsolated(sb: SandboxRecord, call: FncallCall): Promise<ExecResult> {
    const req: ExecRequest = {
      argv: call.argv, ...(call.env ? { env: call.env } : {}), ...(call.cwd ? { cwd: call.cwd } : {}), ...(call.user ? { user: call.user } : {}),
      timeout_ms: call.timeoutMs ?? FNCALL_DEFAULT_TIMEOUT_MS,
    };
    return this.runExec(sb, req, call.stdin, { ...(call.tmpBytes ? { tmpBytes: call.tmpBytes } : {}), ...(call.scratch ? { scratch: call.scratch } : {}) });
  }

  /** Runs a command in a running sandbox through its driver (the exec path without the trajectory log). */
  private async runExec(sb: SandboxRecord, req: ExecRequest, stdin: Buffer | undefined, isolate?: IsolateOptions): Promise<ExecResult> {
    const id = sb.id;
    if (sb.idleTimeoutS !== null) this.d.repo.touchActive(id);
    const drv = this.driver(sb.backend);
    const r = await drv.exec(sb, {
      ...this.resolveCommand(sb, req),
      stdin,
      maxOutputBytes: this.d.config.maxOutputBytes,
      ...(isolate ? { isolate } : {}),
    }).catch(async (e) => {
      if (!isDsecError(e, 'Unavailable')) throw e;
      // The agent connection dropped: tell a stop/destroy that raced the command from a dead init.
      const now = this.d.repo.find(id);
      if (!now) throw conflict(`sandbox ${id} was destroyed while the command ran`);
      if (now.state === 'failed') {
        throw failedPrecondition(`sandbox ${id} is failed: ${now.error ?? 'its init exited'}; start it again with \`dsec start ${id}\` or destroy it`);
      }
      if (now.desired === 'destroyed' || now.desired === 'stopped' || now.state !== 'running') {
        throw conflict(`sandbox ${id} was ${now.desired ?? now.state} while the command ran`);
      }
      // The connection can drop a moment before the dying init is visibly gone (exit in
      // progress, not yet a zombie): look again for up to 1 s before calling it alive.
      for (let i = 0; i < 20; i++) {
        if (!(await drv.isAlive(sb))) throw await this.markDead(id);
        await new Promise((r) => setTimeout(r, 50));
      }
      throw e;
    });
    if (r.kind === 'exec_error') {
      if (r.errno === E2BIG) throw invalidArgument(`sandbox ${id}: argument list and environment are too long for execve (${r.message})`);
      // Shell conventions: 127 command not found, 126 found but not executable.
      const code = r.errno === ENOENT ? 127 : 126;
      return {
        exit_code: code, signal: null, stdout_b64: '', stderr_b64: Buffer.from(`dsec: ${r.message}\n`).toString('base64'),
        stdout_truncated: false, stderr_truncated: false, duration_ms: 0, oom: false, oom_kills: r.oomKills, timed_out: false,
      };
    }
    return {
      exit_code: r.exitCode,
      signal: r.signal === null ? null : signalName(r.signal),
      stdout_b64: r.stdout.toString('base64'),
      stderr_b64: r.stderr.toString('base64'),
      stdout_truncated: r.stdoutTruncated,
      stderr_truncated: r.stderrTruncated,
      duration_ms: Math.round(r.durationMs * 1000) / 1000,
      oom: r.oom,
      oom_kills: r.oomKills,
      timed_out: r.timedOut,
    };
  }

  /**
   * Packs the sandbox's writable layer as a new layer on top of its image and stores
   * the result as image `ref` (see daemon/image/commit.ts for what is stripped). The
   * sandbox is frozen while its layer is copied and keeps running afterwards. The new
   * image keeps the config the sandbox was created from; `security` (optional) changes
   * its security defaults field by field. The sandbox's create env is a runtime secret
   * and is not written into the manifest (a warning names the variables left out).
   * @returns the new manifest, the new layer and the stripped paths.
   * @throws DsecError NotFound, InvalidArgument (bad ref), FailedPrecondition (no writable layer).
   */
  async commit(id: string, ref: string, exclude: string[] = [], security?: ImageSecurity): Promise<{ image: ImageManifest; layer: LayerMeta; stripped: string[]; warnings: string[] }> {
    const { name, tag } = parseRef(ref);
    for (const g of exclude) normaliseExclude(g); // refuse bad patterns before freezing anything
    return this.mutex.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (sb.uidBase === null || sb.uidCount === null) throw failedPrecondition(`sandbox ${id} has no uid range`);
      const packed = await packWritableLayer(this.d.images, (fn) => this.driver(sb.backend).withWritableLayer(sb, fn), {
        uidBase: sb.uidBase, uidCount: sb.uidCount, strip: true, exclude: [...this.d.config.images.commitExclude, ...exclude], source: `commit:${id}`,
      });
      const layer = packed.layer;
      const image: ImageManifest = {
        name, tag, layers: [...sb.imageLayers, layer.digest],
        config: { ...sb.imageConfig, ...(security ? { security: { ...(sb.imageConfig.security ?? {}), ...security } } : {}) },
        created_ms: Date.now(),
      };
      await this.d.images.putManifest(image);
      this.d.repo.event('sandbox.committed', sb, `${name}:${tag} ${layer.digest}`);
      const { sizeBytes: _s, ...meta } = layer;
      const warnings = packed.unmatched.map((g) => `exclude pattern ${JSON.stringify(g)} matched nothing`);
      const envNames = Object.keys(sb.env).sort();
      if (envNames.length) warnings.push(`the sandbox's create env (${envNames.join(', ')}) is not part of the image: it is a runtime secret; pass it again when creating sandboxes from ${name}:${tag}`);
      return { image, layer: meta, stripped: packed.stripped, warnings };
    });
  }

  /**
   * The agent of a running sandbox, for file operations.
   * @throws DsecError NotFound, FailedPrecondition (not running), Unavailable.
   */
  async agent(id: string): Promise<AgentClient> {
    const sb = this.d.repo.get(id);
    ContainerDriver.assertRunning(sb);
    return this.driver(sb.backend).agentClient(sb);
  }

  /**
   * The per-sandbox defences in force for `sb` now (GET /v1/sandboxes/{id} `defences`): as
   * its backend reports them (`readonly_paths`, `landlock`, ...), plus `disk_quota`
   * (whether its writable layer has a quota the kernel enforces) and `builder_identity`
   * (whether its commits and snapshots are copied and packed as the builder, whose ids
   * are disjoint from the sandbox's own range).
   */
  async defences(sb: SandboxRecord): Promise<Record<string, DefenceStatus>> {
    const b = this.d.images.builder;
    const builder_identity: DefenceStatus = b
      ? { enforced: true, detail: `commits and snapshots of this sandbox are copied, stripped and packed as the builder (host ids ${b.range.base}-${b.range.base + b.range.size - 1}), never as root and never as this sandbox's range (${sb.uidBase ?? '?'}-${sb.uidBase === null || sb.uidCount === null ? '?' : sb.uidBase + sb.uidCount - 1})` }
      : { enforced: false, detail: '[builder] enabled = false: commits and snapshots are copied and packed as root' };
    return { ...((await this.driver(sb.backend).defences?.(sb)) ?? {}), disk_quota: this.d.storage.sandboxStatus(sb.id, sb.diskBytes), builder_identity };
  }

  /** Resource usage of a sandbox (null when it is not running). @throws DsecError NotFound. */
  async stats(id: string): Promise<SandboxStats | null> {
    const sb = this.d.repo.get(id);
    return this.driver(sb.backend).stats(sb);
  }

  /** Host path of the sandbox's agent log, or null. @throws DsecError NotFound. */
  logPath(id: string): string | null {
    const sb = this.d.repo.get(id);
    return this.driver(sb.backend).logPath(sb);
  }

  /** Layer digests used by sandboxes of this instance that exist (any state but destroyed). */
  layersInUse(): Set<string> {
    return new Set([...this.d.repo.layerDigests(), ...this.d.snapshots.all().flatMap((s) => s.imageLayers)]);
  }

  /**
   * Takes a filesystem snapshot: the sandbox's writable layer packed, unstripped, as a
   * layer in the image store (ownership shifted to image uids like a commit), recorded
   * with what a restore needs. A running sandbox is frozen while its layer is copied
   * and keeps running afterwards; a paused or stopped one is copied as it is. A microVM
   * (a backend with machine snapshots) is captured whole instead: {@link snapshotMachine}.
   * @param req.process containers: also checkpoint processes, answered Unimplemented with
   *   the reason; microVMs: ignored (a machine snapshot always has its processes).
   * @throws DsecError NotFound, AlreadyExists (name taken), FailedPrecondition (no
   *   writable layer), Unimplemented (process checkpoints), Internal (copy or mkfs failed).
   */
  async snapshot(id: string, req: SnapshotRequest): Promise<SnapshotRecord> {
    const sb0 = this.d.repo.get(id);
    if (sb0.backend !== 'container' && sb0.backend !== 'fncall') {
      const drv = this.driver(sb0.backend);
      if (!drv.capabilities().snapshot || !drv.snapshotMachine) throw unimplemented(`snapshots of ${sb0.backend} sandboxes are not built yet`);
      return this.snapshotMachine(id, req, drv);
    }
    if (req.process) {
      const criu = await probeCriu();
      throw unimplemented(criu.available
        ? 'process checkpoints of container sandboxes are not supported by this dsecd yet (criu check passes on this host); take a filesystem snapshot (omit process)'
        : `process checkpoints need CRIU, and ${criu.reason}; take a filesystem snapshot (omit process) instead`);
    }
    if (sb0.backend !== 'container') throw unimplemented(`snapshots of ${sb0.backend} sandboxes are not built yet`);
    const name = req.name ?? null;
    this.d.snapshots.assertNameFree(name);
    return this.mutex.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (!['running', 'paused', 'stopped', 'failed'].includes(sb.state) || sb.desired !== null) {
        throw failedPrecondition(`sandbox ${id} is ${sb.desired ? `becoming ${sb.desired}` : sb.state}; snapshot it when it is running, paused or stopped`);
      }
      if (sb.uidBase === null || sb.uidCount === null) throw failedPrecondition(`sandbox ${id} has no uid range`);
      if (sb.imageLayers.length + 1 > MAX_LAYERS) {
        throw failedPrecondition(`sandbox ${id} already has ${sb.imageLayers.length} layers (snapshots of restored sandboxes stack up); a snapshot would exceed ${MAX_LAYERS}`);
      }
      // Real mtimes (a fork must see what the source saw) and 4 KiB chunks (sparse files keep their holes).
      const { layer } = await packWritableLayer(this.d.images, (fn) => this.driver(sb.backend).withWritableLayer(sb, fn), {
        uidBase: sb.uidBase, uidCount: sb.uidCount, strip: false, exclude: [], source: `snapshot:${id}`,
        build: { keepMtimes: true, chunkBytes: SNAPSHOT_CHUNK_BYTES },
      });
      this.d.failpoints.hit('snapshot.after-layer');
      const snap = this.d.snapshots.insert({
        id: `snap-${taggedId(this.d.idTag)}`, name, kind: 'filesystem', sandboxId: id, backend: sb.backend, image: sb.image,
        imageLayers: [...sb.imageLayers, layer.digest], imageConfig: sb.imageConfig, layer: layer.digest, sizeBytes: layer.sizeBytes,
        cpus: sb.cpus, memoryBytes: sb.memoryBytes, pids: sb.pids, priority: sb.priority, labels: sb.labels, env: sb.env, createdAt: Date.now(),
        network: sb.network, diskBytes: sb.diskBytes, filesystem: sb.filesystem, machine: null,
      });
      await this.d.images.syncLeases(this.layersInUse());
      this.d.repo.event('sandbox.snapshotted', sb, `${snap.id}${name ? ` (${name})` : ''} ${layer.digest}`);
      return snap;
    });
  }

  /** Directory of a machine snapshot's files: `<root>/snapshots/<id>`. */
  private snapshotDir(id: string): string {
    return path.join(this.d.config.root, 'snapshots', id);
  }

  /**
   * Takes a machine snapshot (kind vm) of a running or paused microVM: the driver captures
   * RAM, CPU and device state and the writable disk into {@link snapshotDir}; the row is
   * written after the files, so a crash in between leaves only a directory, which
   * {@link reconcile} removes. The source keeps the run state it had.
   * @throws DsecError NotFound, AlreadyExists (name taken), FailedPrecondition (not
   *   running or paused), DeadlineExceeded / Unavailable (QMP), Internal (the capture failed).
   */
  private async snapshotMachine(id: string, req: SnapshotRequest, drv: SandboxDriver): Promise<SnapshotRecord> {
    const name = req.name ?? null;
    this.d.snapshots.assertNameFree(name);
    return this.mutex.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (!['running', 'paused'].includes(sb.state) || sb.desired !== null) {
        throw failedPrecondition(`sandbox ${id} is ${sb.desired ? `becoming ${sb.desired}` : sb.state}; a ${sb.backend} snapshot captures the running machine: snapshot it when it is running or paused`);
      }
      const snapId = `snap-${taggedId(this.d.idTag)}`;
      const dir = this.snapshotDir(snapId);
      await mkdir(dir, { recursive: true, mode: 0o700 });
      try {
        const machine = await drv.snapshotMachine!(sb, dir);
        this.d.failpoints.hit('snapshot.after-layer');
        const snap = this.d.snapshots.insert({
          id: snapId, name, kind: 'vm', sandboxId: id, backend: sb.backend, image: sb.image,
          imageLayers: sb.imageLayers, imageConfig: sb.imageConfig, layer: `sha256:${machine.stateSha256}`,
          sizeBytes: machine.stateBytes + machine.diskAllocatedBytes,
          cpus: sb.cpus, memoryBytes: sb.memoryBytes, pids: sb.pids, priority: sb.priority, labels: sb.labels, env: sb.env, createdAt: Date.now(),
          network: sb.network, diskBytes: sb.diskBytes, filesystem: sb.filesystem, machine,
        });
        await this.d.images.syncLeases(this.layersInUse());
        this.d.repo.event('sandbox.snapshotted', sb, `${snap.id}${name ? ` (${name})` : ''} machine: ${machine.stateBytes} bytes of state, vCPUs stopped ${machine.pausedMs} ms`);
        return snap;
      } catch (e) {
        await rm(dir, { recursive: true, force: true });
        throw e instanceof DsecError ? e : wrap(e, `snapshot sandbox ${id}`);
      }
    });
  }

  /** @throws DsecError NotFound. */
  getSnapshot(ref: string): SnapshotRecord {
    return this.d.snapshots.get(ref);
  }

  /** All snapshots on this host, oldest first. */
  listSnapshots(): SnapshotRecord[] {
    return this.d.snapshots.all();
  }

  /**
   * Removes a snapshot. Sandboxes restored from it keep running: they hold their own
   * lease on its layer, which prune collects once nothing uses it.
   * @throws DsecError NotFound.
   */
  async removeSnapshot(ref: string): Promise<SnapshotRecord> {
    const snap = this.d.snapshots.get(ref);
    this.d.snapshots.remove(snap.id);
    // A machine snapshot's files; restores made from it have their own disk copies.
    await rm(this.snapshotDir(snap.id), { recursive: true, force: true });
    await this.d.images.syncLeases(this.layersInUse());
    this.d.repo.event('snapshot.removed', null, `${snap.id}${snap.name ? ` (${snap.name})` : ''}`);
    return snap;
  }

  /**
   * Checks a snapshot can be restored before anything is created: its layer blobs must
   * be present and hash to their digests.
   * @throws DsecError NotFound (snapshot or a layer missing), FailedPrecondition (corrupt layer).
   */
  private async checkSnapshot(ref: string): Promise<SnapshotRecord> {
    const snap = this.d.snapshots.get(ref);
    const drv = this.driver(snap.backend);
    const what = `snapshot ${snap.id}${snap.name ? ` (${snap.name})` : ''} cannot be restored`;
    for (const digest of snap.imageLayers) {
      try {
        await this.d.images.prepareForMount(digest);
      } catch (e) {
        const err = e instanceof DsecError ? e : wrap(e, 'layer check');
        throw new DsecError(err.kind, `${what}: ${err.message}`, { cause: e });
      }
    }
    if (snap.kind === 'vm') {
      if (!snap.machine || !drv.checkMachine) throw failedPrecondition(`${what}: it is a machine snapshot and the ${snap.backend} backend of this dsecd cannot restore machines`);
      try {
        await drv.checkMachine(this.machineRestore(snap));
      } catch (e) {
        const err = e instanceof DsecError ? e : wrap(e, 'machine check');
        throw new DsecError(err.kind, `${what}: ${err.message}`, { cause: e });
      }
    }
    return snap;
  }

  /** Where a restore of the machine snapshot `snap` reads from. */
  private machineRestore(snap: SnapshotRecord): MachineRestore {
    return { snapshotId: snap.id, dir: this.snapshotDir(snap.id), machine: snap.machine! };
  }

  /** The create request a restore of `snap` with overrides `req` amounts to. */
  private restoreRequest(snap: SnapshotRecord, req: RestoreRequest): CreateSandboxRequest {
    return {
      backend: snap.backend, image: snap.image, cpus: req.cpus ?? snap.cpus, memory_bytes: req.memory_bytes ?? snap.memoryBytes, pids: req.pids ?? snap.pids,
      labels: req.labels ?? snap.labels, env: { ...snap.env, ...(req.env ?? {}) }, priority: req.priority ?? snap.priority,
      ...(req.ttl_s !== undefined ? { ttl_s: req.ttl_s } : {}), ...(req.idle_timeout_s !== undefined ? { idle_timeout_s: req.idle_timeout_s } : {}),
      ...(req.seccomp !== undefined ? { seccomp: req.seccomp } : {}),
      ...((req.network ?? snap.network) ? { network: req.network ?? snap.network! } : {}),
      ...((req.disk_bytes ?? snap.diskBytes) !== null && (req.disk_bytes ?? snap.diskBytes) !== undefined ? { disk_bytes: (req.disk_bytes ?? snap.diskBytes)! } : {}),
      // Field by field: what the request names, else the source's resolved options.
      ...((req.filesystem ?? snap.filesystem) ? { filesystem: { ...(snap.filesystem ?? {}), ...(req.filesystem ?? {}) } } : {}),
    };
  }

  /**
   * Creates a new running sandbox from a snapshot: the snapshot layer is mounted as the
   * top lower layer (shared, read-only) under a fresh writable layer, so the sandbox
   * starts with exactly the files the source had. A machine snapshot (kind vm) is resumed
   * instead in a new VM on its own copy of the disk, its processes where they were. The
   * source is never touched. `opts.onProgress` hears its phases, as for {@link create}.
   * @param ref snapshot id or name.
   * @throws DsecError NotFound, FailedPrecondition (corrupt layer or machine state, a
   *   state QEMU cannot load, another QEMU release), ResourceExhausted (admission, uid
   *   pool), InvalidArgument (limits above the host's; memory or vCPUs other than a
   *   machine snapshot's), Internal.
   */
  async restore(ref: string, req: RestoreRequest = {}, opts: { onProgress?: CreateProgressSink } = {}): Promise<SandboxRecord> {
    return (await this.fork(ref, { ...req, count: 1 }, opts))[0];
  }

  /**
   * Creates `req.count` independent sandboxes from one snapshot ({@link restore} each),
   * at most {@link FORK_CONCURRENCY} at a time. All or nothing: when one fails, the
   * others are destroyed and the first error is thrown. `opts.onProgress` hears the
   * phases of every sandbox of the group (each report names its sandbox).
   * @throws as {@link restore}.
   */
  async fork(ref: string, req: ForkRequest, opts: { onProgress?: CreateProgressSink } = {}): Promise<SandboxRecord[]> {
    const snap = await this.checkSnapshot(ref);
    const creq = this.restoreRequest(snap, req);
    creq.network = await this.settleNetwork(creq.network, creq.backend);
    this.checkLimits(creq);
    const disk = this.diskQuota(req.disk_bytes, snap.diskBytes);
    if (disk === null) delete creq.disk_bytes;
    else creq.disk_bytes = disk;
    if (snap.kind === 'vm') {
      // The machine's RAM and vCPUs are in its state: a restore cannot resize them.
      const m = snap.machine!;
      if (Math.ceil(creq.memory_bytes! / 2 ** 20) !== m.memoryMiB) {
        throw invalidArgument(`snapshot ${snap.id} holds a machine with ${m.memoryMiB} MiB of RAM, which a restore cannot change; leave memory_bytes out (or ask for ${snap.memoryBytes})`);
      }
      if (Math.max(1, Math.ceil(creq.cpus!)) !== m.vcpus) {
        throw invalidArgument(`snapshot ${snap.id} holds a machine with ${m.vcpus} vCPU(s), which a restore cannot change; leave cpus out or ask for more than ${m.vcpus - 1} and at most ${m.vcpus}`);
      }
      if (req.disk_bytes !== undefined && req.disk_bytes !== snap.diskBytes) {
        throw invalidArgument(`snapshot ${snap.id} holds the machine's disk of ${m.diskBytes} bytes, which a restore cannot resize; leave disk_bytes out`);
      }
    }
    this.admit(creq.cpus!, creq.memory_bytes!, creq.backend === 'container' ? disk : null, req.count);
    const src: SandboxSource = {
      image: snap.image, layers: snap.imageLayers, config: snap.imageConfig, snapshotId: snap.id,
      ...(snap.kind === 'vm' ? { restore: this.machineRestore(snap) } : {}),
    };
    // Intent first: if dsecd dies mid-fork, reconcile destroys whatever this fork created.
    const forkId = `fork-${randomBytes(8).toString('hex')}`;
    creq.labels = { ...creq.labels, [FORK_LABEL]: forkId };
    this.d.snapshots.addForkIntent(forkId, snap.id, req.count);
    const made: SandboxRecord[] = new Array(req.count);
    let next = 0;
    let failure: unknown = null;
    const worker = async () => {
      while (next < req.count && failure === null) {
        const i = next++;
        try {
          made[i] = await this.createFrom(creq, src, { onProgress: opts.onProgress });
          this.d.failpoints.hit('fork.after-create');
        } catch (e) {
          failure ??= e;
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(FORK_CONCURRENCY, req.count) }, worker));
    if (failure !== null) {
      for (const sb of made) if (sb) await this.destroy(sb.id, true, `fork of ${snap.id} failed`).catch((e) => this.d.log.error({ err: e, id: sb.id }, 'cleanup after failed fork failed'));
      this.d.snapshots.removeForkIntent(forkId);
      throw failure instanceof DsecError ? failure : wrap(failure, `fork ${snap.id}`);
    }
    this.d.snapshots.removeForkIntent(forkId);
    if (req.count > 1) this.d.repo.event('snapshot.forked', null, `${snap.id} -> ${made.map((s) => s.id).join(',')}`);
    return made;
  }

  /**
   * Finds running sandboxes whose init has exited (killed from outside, or the OOM
   * killer took the agent) and moves them to `failed`. Cheap: one /proc read per running
   * sandbox; the runtime is asked only about sandboxes whose init looks gone.
   * @returns ids marked failed.
   */
  /** When this manager (this dsecd) started, ms since the epoch. */
  private readonly startedAt = Date.now();
  /** Limit counters last seen per running sandbox (see {@link watchLimits}). */
  private readonly limitsSeen = new Map<string, { oomKills: number; pidsLimitHits: number }>();
  /** Exit watches of the inits of running sandboxes, by sandbox id ({@link checkLiveness}). */
  private readonly initWatches = new Map<string, { pid: number; start: number; watch: ExitWatch }>();

  /**
   * Turns the kernel's limit counters into events: `sandbox.oom` when the OOM killer
   * killed processes of a sandbox, `sandbox.pids_limit` when forks were refused at its
   * pids limit (a fork bomb), each with the increase since the last sweep and the total.
   * The first sweep after a start (or after a sandbox appears) records a baseline.
   * @returns the events emitted.
   */
  async watchLimits(): Promise<ApiEvent[]> {
    const out: ApiEvent[] = [];
    const live = new Set<string>();
    let n = 0;
    for (const r of this.d.repo.runningIds()) {
      // The counters are read synchronously (cgroupfs): let requests in every 100 sandboxes.
      if (++n % 100 === 0) await new Promise((res) => setImmediate(res));
      const drv = this.d.drivers.get(r.backend);
      const c = await drv?.limitCounters({ id: r.id, state: 'running' }).catch(() => null);
      if (!c) continue;
      live.add(r.id);
      // A sandbox created by this dsecd started from zero (its cgroup is new); one adopted
      // at start may have counts from before, which a previous dsecd reported.
      const prev = this.limitsSeen.get(r.id) ?? (r.createdAt >= this.startedAt ? { oomKills: 0, pidsLimitHits: 0 } : undefined);
      this.limitsSeen.set(r.id, c);
      if (!prev || (c.oomKills <= prev.oomKills && c.pidsLimitHits <= prev.pidsLimitHits)) continue;
      const sb = this.d.repo.find(r.id);
      if (!sb) continue;
      if (c.oomKills > prev.oomKills) {
        const k = c.oomKills - prev.oomKills;
        out.push(this.d.repo.event('sandbox.oom', sb, `the OOM killer killed ${k} process${k > 1 ? 'es' : ''} at the memory limit of ${r.memoryBytes} bytes; ${c.oomKills} in all`));
      }
      if (c.pidsLimitHits > prev.pidsLimitHits) {
        const k = c.pidsLimitHits - prev.pidsLimitHits;
        out.push(this.d.repo.event('sandbox.pids_limit', sb, `${k} fork${k > 1 ? 's' : ''} refused at the pids limit of ${r.pids}; ${c.pidsLimitHits} in all`));
      }
    }
    for (const id of this.limitsSeen.keys()) if (!live.has(id)) this.limitsSeen.delete(id);
    return out;
  }

  /**
   * Keeps an exit watch (daemon/host/pidwatch.ts) on the init of every running sandbox
   * that no operation is acting on, so an init that dies on its own (killed from outside,
   * crashed) is handled when it happens ({@link onInitExit}). Called by the reaper every
   * few seconds and after each start: it watches inits it does not watch yet (a create,
   * start, restore or adopt since the last call), drops watches of sandboxes no longer
   * running, and handles an init found already gone. Costs one three-column query plus
   * one pidfd per new init; nothing per sandbox that is already watched.
   * @returns ids of sandboxes found dead by this call (others are reported as they die).
   */
  async checkLiveness(): Promise<string[]> {
    const dead: string[] = [];
    const seen = new Set<string>();
    for (const r of this.d.repo.runningInits()) {
      seen.add(r.id);
      const w = this.initWatches.get(r.id);
      if (w && w.pid === r.initPid && w.start === r.initStart) continue;
      if (!this.watchInit(r.id, r.initPid, r.initStart) && (await this.onInitExit(r.id, r.initPid, r.initStart))) dead.push(r.id);
    }
    for (const [id, w] of this.initWatches) {
      if (seen.has(id)) continue;
      w.watch.cancel();
      this.initWatches.delete(id);
    }
    return dead;
  }

  /**
   * Starts watching init `pid` (start time `start`) of sandbox `id`, replacing a watch of
   * an earlier init. False when that init is not running now (nothing is watched).
   */
  private watchInit(id: string, pid: number, start: number): boolean {
    const old = this.initWatches.get(id);
    if (old && old.pid === pid && old.start === start) return true;
    old?.watch.cancel();
    this.initWatches.delete(id);
    let w: ExitWatch | null;
    try {
      w = watchExit(pid, start, () => {
        if (this.initWatches.get(id)?.watch === w) this.initWatches.delete(id);
        void this.onInitExit(id, pid, start).catch((e) => this.d.log.error({ err: e, id }, 'handling an init exit failed'));
      });
    } catch (e) {
      // No pidfd (fd exhaustion): the next sweep tries again; until then the exit is noticed there.
      this.d.log.warn({ err: e, id }, 'cannot watch the sandbox init');
      return procStartTime(pid) === start;
    }
    if (!w) return false;
    this.initWatches.set(id, { pid, start, watch: w });
    return true;
  }

  /**
   * Init `pid` of sandbox `id` exited (or was found gone): when the row still records it
   * as the init of a running sandbox no operation is acting on, and the driver agrees the
   * sandbox is dead, the sandbox becomes `failed` ({@link markDead}). True when it did.
   */
  private async onInitExit(id: string, pid: number, start: number): Promise<boolean> {
    const sb = this.d.repo.find(id);
    if (!sb || sb.state !== 'running' || sb.desired !== null || sb.initPid !== pid || sb.initStart !== start) return false;
    if (procStartTime(pid) === start) return false;
    const drv = this.d.drivers.get(sb.backend);
    if (!drv || (await drv.isAlive(sb))) return false;
    await this.markDead(id);
    return true;
  }

  /**
   * Records that a running sandbox's init died on its own (e.g. killed from outside):
   * cleans its runtime state and mounts, moves it to `failed`, and returns the error
   * to give the caller. The writable layer stays; `start` brings the sandbox back.
   */
  private async markDead(id: string): Promise<DsecError> {
    return this.mutex.run(id, async () => {
      const sb = this.d.repo.get(id);
      if ((sb.state === 'running' || sb.state === 'paused') && sb.desired === null) {
        await this.driver(sb.backend).stop(sb, this.d.failpoints).catch((e) => this.d.log.warn({ err: e, id }, 'cleanup of dead sandbox failed'));
        const f = this.d.repo.transition(id, 'failed', { initPid: null, initStart: null, error: 'sandbox init exited unexpectedly' });
        this.d.repo.event('sandbox.failed', f, f.error ?? undefined);
      }
      return failedPrecondition(`sandbox ${id} is failed: its init exited unexpectedly; start it again with \`dsec start ${id}\` or destroy it`);
    });
  }

  /**
   * Brings the store and the host into agreement after a start (possibly after a
   * crash). Safe to run on a clean host and to run twice.
   */
  async reconcile(): Promise<ReconcileReport> {
    const rep: ReconcileReport = { adopted: [], shells: [], rolledBack: [], finished: [], failed: [], orphans: [] };
    const fp = new Failpoints(undefined);
    for (const sb of this.d.repo.all()) {
      const drv = this.d.drivers.get(sb.backend);
      if (!drv) {
        this.d.log.error({ id: sb.id, backend: sb.backend }, 'sandbox of an unknown backend left alone');
        continue;
      }
      try {
        if (!sb.acknowledged) {
          await drv.destroy(sb, fp);
          this.d.repo.remove(sb.id);
          this.d.repo.event('sandbox.failed', { ...sb, state: 'failed' }, 'create interrupted by a dsecd restart; cleaned up');
          rep.rolledBack.push(sb.id);
        } else if (sb.desired === 'destroyed') {
          await drv.destroy(sb, fp);
          this.d.repo.remove(sb.id);
          this.d.repo.event('sandbox.destroyed', { ...sb, state: 'destroyed' });
          rep.finished.push(sb.id);
        } else if (sb.desired === 'stopped' || sb.state === 'stopped') {
          await drv.stop(sb, fp);
          if (sb.state !== 'stopped') this.d.repo.event('sandbox.stopped', this.d.repo.transition(sb.id, 'stopped', { initPid: null, initStart: null }));
          else this.d.repo.setDesired(sb.id, null);
          rep.finished.push(sb.id);
        } else if (sb.state === 'failed') {
          await drv.stop(sb, fp);
          this.d.repo.setDesired(sb.id, null);
        } else if (sb.state === 'running' || sb.state === 'paused') {
          if (await drv.isAlive(sb)) {
            await drv.adopt(sb);
            // Unacknowledged pause/resume roll back to the recorded state.
            if (sb.desired === 'paused' && sb.state === 'running') await drv.resume(sb).catch(() => {});
            if (sb.desired === 'running' && sb.state === 'paused') await drv.pause(sb).catch(() => {});
            if (sb.desired) this.d.repo.setDesired(sb.id, null);
            (isPoolShell(sb) ? rep.shells : rep.adopted).push(sb.id);
          } else {
            await drv.stop(sb, fp);
            const f = this.d.repo.transition(sb.id, 'failed', { initPid: null, initStart: null, error: 'init exited while dsecd was not running' });
            this.d.repo.event('sandbox.failed', f, f.error ?? undefined);
            rep.failed.push(sb.id);
          }
        }
      } catch (e) {
        this.d.log.error({ err: e, id: sb.id }, 'reconcile failed for sandbox');
        rep.failed.push(sb.id);
      }
    }
    // Forks that never committed are rolled back whole: their callers never got the ids.
    for (const forkId of this.d.snapshots.forkIntents()) {
      for (const sb of this.d.repo.all().filter((s) => s.labels[FORK_LABEL] === forkId)) {
        const drv = this.d.drivers.get(sb.backend);
        try {
          if (drv) await drv.destroy(sb, fp);
          this.d.repo.remove(sb.id);
          this.d.repo.event('sandbox.destroyed', { ...sb, state: 'destroyed' }, `fork ${forkId} interrupted by a dsecd restart; rolled back`);
          rep.rolledBack.push(sb.id);
        } catch (e) {
          this.d.log.error({ err: e, id: sb.id }, 'rolling back an interrupted fork failed');
        }
      }
      this.d.snapshots.removeForkIntent(forkId);
    }
    // Machine snapshot files whose row was never written (dsecd died during the capture).
    const snapIds = new Set(this.d.snapshots.all().map((s) => s.id));
    for (const e of await readdir(path.join(this.d.config.root, 'snapshots')).catch(() => [] as string[])) {
      if (snapIds.has(e)) continue;
      await rm(this.snapshotDir(e), { recursive: true, force: true });
      rep.orphans.push(`snapshot files ${e}`);
    }
    const known = new Set(this.d.repo.all().map((s) => s.id));
    for (const drv of new Set(this.d.drivers.values())) {
      const o = await drv.cleanOrphans(known);
      rep.orphans.push(...o.removed);
    }
    const freed = this.d.repo.freeOrphanRanges();
    if (freed) rep.orphans.push(`${freed} uid range(s)`);
    return rep;
  }
}
