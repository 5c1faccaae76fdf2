/**
 * cgroup v1 (legacy and hybrid hosts): one directory per hierarchy.
 *
 * Each mounted v1 hierarchy gets the instance parent
 * `<mount>/<own path in that hierarchy>/dsec-<instance>`; runc 1.1's cgroupfs driver
 * resolves the relative cgroupsPath `dsec-<instance>/<id>` the same way (against its
 * own cgroup in each subsystem, which it inherits from dsecd), so the dirs agree. In
 * hybrid mode the controller-less cgroup2 mount (`unified`) gets a parent too, for
 * cgroup-BPF; it carries no counters, so only list/exists/remove look at it.
 *
 * Where the numbers come from: memory.* in the memory hierarchy, pids.* in pids,
 * cpuacct.usage in cpuacct, freezer.state in freezer. Units are the kernel's (bytes,
 * nanoseconds).
 */
import { mkdir, rmdir } from 'node:fs/promises';
import path from 'node:path';
import { deadlineExceeded, failedPrecondition, invalidArgument, notFound, unimplemented } from '../../errors.js';
import type { CgroupLaunchStep, CgroupLimits, CgroupManager, CgroupStats } from './types.js';
import { bfqWeight, devKey, parseBlkioRw, v1ThrottleLines, v1Weight, type BlockDevice, type IoCounters, type IoSupport } from './io.js';
import {
  CounterFiles, INSTANCE_DIR_PREFIX, SANDBOX_ID_RE, assertInstanceName, assertSandboxId, cgroupFsError, childDirs, deviceScheduler, errnoOf,
  isDir, isFile, parseLimit, pollUntil, readFlatKeyed, readNumber, readOptional, readPidsRecursive,
  rmdirCgroupTree, signalPids, sleep, writeCgroupFile, type HierarchyLayout,
} from './procfs.js';
import { IO_WEIGHT_DEFAULT, hasIoMax, type IoLimits } from '../../model/resources.js';

/** Default wait for freeze/thaw/killAll, in ms: long enough for a loaded host, short enough to surface a stuck cgroup. */
const DEFAULT_TIMEOUT_MS = 5000;
/** How long killAll waits for a freeze before signalling anyway (the freeze only guards against forks). */
const KILL_FREEZE_WAIT_MS = 500;

/** Stand-in for a flat-keyed file of an unmounted controller. */
const NONE: Record<string, number> = {};

/** One v1 (or hybrid unified) hierarchy as this manager uses it. */
interface Hierarchy {
  keys: string[];
  version: 1 | 2;
  controllers: string[];
  ownDir: string;
  /** The hierarchy's mount point (what paths relative to the hierarchy's root start from). */
  mountPoint: string;
  /** `<ownDir>/dsec-<instance>` */
  parent: string;
}

/**
 * The v1 {@link CgroupManager}. Construct through `detectCgroups`; the constructor
 * only computes paths. Hierarchies that are not mounted (e.g. no pids hierarchy) make
 * the matching numbers read as 0/null, and `freeze`/`thaw` throw FailedPrecondition
 * without a freezer hierarchy.
 */
export class CgroupV1Manager implements CgroupManager {
  /** Always 1. */
  readonly version = 1 as const;
  /** The dsecd instance name. */
  readonly instance: string;
  /** Instance parent per hierarchy key (see {@link CgroupManager.parents}). */
  readonly parents: Record<string, string>;
  readonly mountPoints: Record<string, string>;
  private readonly hierarchies: Hierarchy[];
  /** memory.oom_control of each sandbox, kept open: read before and after every exec. */
  private readonly counters = new CounterFiles();

  /**
   * @param instance validated instance name.
   * @param layout the hierarchies from `resolveLayout` (v1 ones plus an optional hybrid `unified`).
   * @throws DsecError(InvalidArgument) for a bad instance name.
   */
  constructor(instance: string, layout: HierarchyLayout[]) {
    assertInstanceName(instance);
    this.instance = instance;
    this.hierarchies = layout.map((h) => ({
      keys: h.keys, version: h.version, controllers: h.controllers, ownDir: h.ownDir, mountPoint: h.mountPoint,
      parent: path.join(h.ownDir, `${INSTANCE_DIR_PREFIX}${instance}`),
    }));
    const parents: Record<string, string> = {};
    const mounts: Record<string, string> = {};
    for (const h of this.hierarchies) for (const k of h.keys) {
      parents[k] ??= h.parent;
      mounts[k] ??= h.mountPoint;
    }
    this.parents = Object.freeze(parents);
    this.mountPoints = Object.freeze(mounts);
  }

  /** The hierarchy carrying `key` (a controller name), if mounted. */
  private hier(key: string): Hierarchy | undefined {
    return this.hierarchies.find((h) => h.keys.includes(key));
  }

  /** Sandbox dir of `id` in the hierarchy carrying `key`, or undefined when not mounted. */
  private dir(key: string, id: string): string | undefined {
    const h = this.hier(key);
    return h ? path.join(h.parent, id) : undefined;
  }

  async init(): Promise<void> {
    for (const h of this.hierarchies) {
      // Not recursive: the own cgroup must exist; we never create anything above it.
      try {
        await mkdir(h.parent);
      } catch (e) {
        if (errnoOf(e) === 'ENOENT') throw failedPrecondition(`own cgroup ${h.ownDir} does not exist`, e);
        if (errnoOf(e) !== 'EEXIST') throw cgroupFsError(e, `mkdir ${h.parent}`);
      }
      // A new v1 cpuset cgroup starts with empty cpus/mems and refuses tasks until they are
      // set. runc fills a sandbox's from its parent, so give the parent the own cgroup's.
      if (h.controllers.includes('cpuset')) {
        for (const f of ['cpuset.cpus', 'cpuset.mems']) {
          const mine = await readOptional(path.join(h.parent, f));
          if (mine === null || mine.trim() !== '') continue;
          const own = (await readOptional(path.join(h.ownDir, f)))?.trim();
          if (own) await writeCgroupFile(path.join(h.parent, f), own).catch((e) => { throw cgroupFsError(e, `write ${f}`); });
        }
      }
    }
  }

  runtimePath(id: string): string {
    assertSandboxId(id);
    return `${INSTANCE_DIR_PREFIX}${this.instance}/${id}`;
  }

  async create(id: string, limits: CgroupLimits): Promise<void> {
    assertSandboxId(id);
    for (const h of this.hierarchies) {
      const d = path.join(h.parent, id);
      try {
        await mkdir(d);
      } catch (e) {
        if (errnoOf(e) !== 'EEXIST') throw cgroupFsError(e, `mkdir ${d}`);
      }
      // A new v1 cpuset cgroup refuses tasks until cpus and mems are set (see init()).
      if (h.controllers.includes('cpuset')) {
        for (const f of ['cpuset.cpus', 'cpuset.mems']) {
          if ((await readOptional(path.join(d, f)))?.trim()) continue;
          const parent = (await readOptional(path.join(h.parent, f)))?.trim();
          if (parent) await writeCgroupFile(path.join(d, f), parent).catch((e) => { throw cgroupFsError(e, `write ${f} of sandbox ${id}`); });
        }
      }
    }
    const write = async (key: string, file: string, value: number | null) => {
      const d = this.dir(key, id);
      if (d === undefined || value === null) return;
      await writeCgroupFile(path.join(d, file), String(value)).catch((e) => { throw cgroupFsError(e, `write ${file} of sandbox ${id}`); });
    };
    if (limits.memoryBytes !== null) await this.setMemoryLimit(id, limits.memoryBytes);
    await write('cpu', 'cpu.cfs_period_us', limits.cpuPeriodUs);
    await write('cpu', 'cpu.cfs_quota_us', limits.cpuQuotaUs ?? -1);
    await write('cpu', 'cpu.shares', limits.cpuShares);
    await write('pids', 'pids.max', limits.pids);
  }

  launchPlan(id: string, limits: CgroupLimits, deviceRules: readonly string[]): CgroupLaunchStep[] {
    assertSandboxId(id);
    const steps: CgroupLaunchStep[] = [];
    for (const h of this.hierarchies) {
      const d = path.join(h.parent, id);
      steps.push({ op: 'mkdir', path: d });
      // A new v1 cpuset cgroup refuses tasks until cpus and mems are set (see init()).
      if (h.controllers.includes('cpuset')) {
        for (const f of ['cpuset.cpus', 'cpuset.mems']) steps.push({ op: 'copy', from: path.join(h.parent, f), to: path.join(d, f) });
      }
    }
    const write = (key: string, file: string, value: string | number | null) => {
      const d = this.dir(key, id);
      if (d !== undefined && value !== null) steps.push({ op: 'write', path: path.join(d, file), value: String(value) });
    };
    // A new cgroup's memsw limit is unlimited, so memory.limit_in_bytes takes any value.
    write('memory', 'memory.limit_in_bytes', limits.memoryBytes ?? -1);
    write('cpu', 'cpu.cfs_period_us', limits.cpuPeriodUs);
    write('cpu', 'cpu.cfs_quota_us', limits.cpuQuotaUs ?? -1);
    write('cpu', 'cpu.shares', limits.cpuShares);
    write('pids', 'pids.max', limits.pids);
    if (this.dir('devices', id) === undefined) throw failedPrecondition('no devices cgroup hierarchy is mounted: device rules cannot be written');
    write('devices', 'devices.deny', 'a');
    for (const r of deviceRules) write('devices', 'devices.allow', r);
    return steps;
  }

  procsFiles(id: string): string[] {
    assertSandboxId(id);
    return this.hierarchies.map((h) => path.join(h.parent, id, 'cgroup.procs'));
  }

  sandboxPaths(id: string): Record<string, string> {
    assertSandboxId(id);
    const out: Record<string, string> = {};
    for (const [k, p] of Object.entries(this.parents)) out[k] = path.join(p, id);
    return out;
  }

  async list(): Promise<string[]> {
    const ids = new Set<string>();
    for (const h of this.hierarchies) for (const c of await childDirs(h.parent)) if (SANDBOX_ID_RE.test(c)) ids.add(c);
    return [...ids].sort();
  }

  async exists(id: string): Promise<boolean> {
    assertSandboxId(id);
    const found = await Promise.all(this.hierarchies.map((h) => isDir(path.join(h.parent, id))));
    return found.includes(true);
  }

  async pids(id: string): Promise<number[]> {
    assertSandboxId(id);
    // runc puts every process in every hierarchy; read the pids one, or the first mounted fallback.
    for (const key of ['pids', 'freezer', 'memory', 'cpu']) {
      const d = this.dir(key, id);
      if (d !== undefined) return readPidsRecursive(d);
    }
    const h = this.hierarchies.find((x) => x.version === 1);
    return h ? readPidsRecursive(path.join(h.parent, id)) : [];
  }

  async stats(id: string): Promise<CgroupStats> {
    if (!(await this.exists(id))) throw notFound(`cgroup of sandbox ${id} not found`);
    const mem = this.dir('memory', id);
    const pidsDir = this.dir('pids', id);
    const cpuacct = this.dir('cpuacct', id);
    const freezer = this.dir('freezer', id);
    const [usage, limit, stat, oom, pidsCur, pidsMax, cpu, state, pidsEv] = await Promise.all([
      mem ? readNumber(path.join(mem, 'memory.usage_in_bytes')) : null,
      mem ? readOptional(path.join(mem, 'memory.limit_in_bytes')) : null,
      mem ? readFlatKeyed(path.join(mem, 'memory.stat')) : NONE,
      mem ? readFlatKeyed(path.join(mem, 'memory.oom_control')) : NONE,
      pidsDir ? readNumber(path.join(pidsDir, 'pids.current')) : null,
      pidsDir ? readOptional(path.join(pidsDir, 'pids.max')) : null,
      cpuacct ? readNumber(path.join(cpuacct, 'cpuacct.usage')) : null,
      freezer ? readOptional(path.join(freezer, 'freezer.state')) : null,
      pidsDir ? readFlatKeyed(path.join(pidsDir, 'pids.events')) : NONE,
    ]);
    return {
      memoryBytes: usage ?? 0,
      memoryLimitBytes: limit === null ? null : parseLimit(limit),
      // total_* include descendants; a sandbox normally has none, but be exact when it does.
      memoryCacheBytes: stat.total_cache ?? stat.cache ?? 0,
      memoryAnonBytes: stat.total_rss ?? stat.rss ?? 0,
      oomKills: oom.oom_kill ?? 0,
      pidsCurrent: pidsCur ?? (await this.pids(id)).length,
      pidsLimit: pidsMax === null ? null : parseLimit(pidsMax),
      pidsLimitHits: pidsEv.max ?? 0,
      cpuUsageNs: cpu ?? 0,
      frozen: state?.trim() === 'FROZEN',
    };
  }

  async oomKills(id: string): Promise<number> {
    assertSandboxId(id);
    const mem = this.dir('memory', id);
    if (!mem) return 0;
    return this.counters.read(path.join(mem, 'memory.oom_control')).oom_kill ?? 0;
  }

  async limitCounters(id: string): Promise<{ oomKills: number; pidsLimitHits: number }> {
    assertSandboxId(id);
    const pidsDir = this.dir('pids', id);
    const [oomKills, ev] = await Promise.all([this.oomKills(id), pidsDir ? readFlatKeyed(path.join(pidsDir, 'pids.events')) : NONE]);
    return { oomKills, pidsLimitHits: ev.max ?? 0 };
  }

  /** The freezer.state file of `id`; throws FailedPrecondition without a freezer hierarchy, NotFound when the dir is gone. */
  private async freezerState(id: string): Promise<string> {
    assertSandboxId(id);
    const d = this.dir('freezer', id);
    if (!d) throw failedPrecondition('no freezer cgroup hierarchy is mounted');
    if (!(await isDir(d))) throw notFound(`cgroup of sandbox ${id} not found`);
    return path.join(d, 'freezer.state');
  }

  async freeze(id: string, timeoutMs = DEFAULT_TIMEOUT_MS): Promise<void> {
    const file = await this.freezerState(id);
    // As runc does: keep writing FROZEN while the state reads FREEZING, so tasks forked
    // during the freeze are caught too.
    const ok = await pollUntil(async () => {
      await writeCgroupFile(file, 'FROZEN');
      return (await readOptional(file))?.trim() === 'FROZEN';
    }, timeoutMs).catch((e) => { throw cgroupFsError(e, `freeze sandbox ${id}`); });
    if (!ok) {
      await writeCgroupFile(file, 'THAWED').catch(() => undefined);
      throw deadlineExceeded(`sandbox ${id} did not freeze within ${timeoutMs} ms`);
    }
  }

  async thaw(id: string, timeoutMs = DEFAULT_TIMEOUT_MS): Promise<void> {
    const file = await this.freezerState(id);
    const ok = await pollUntil(async () => {
      await writeCgroupFile(file, 'THAWED');
      return (await readOptional(file))?.trim() === 'THAWED';
    }, timeoutMs).catch((e) => { throw cgroupFsError(e, `thaw sandbox ${id}`); });
    if (!ok) throw deadlineExceeded(`sandbox ${id} did not thaw within ${timeoutMs} ms`);
  }

  async killAll(id: string, timeoutMs = DEFAULT_TIMEOUT_MS): Promise<void> {
    assertSandboxId(id);
    const deadline = Date.now() + timeoutMs;
    const freezer = this.dir('freezer', id);
    let delay = 1;
    for (;;) {
      const pids = await this.pids(id);
      if (pids.length === 0) return;
      if (Date.now() >= deadline) {
        throw deadlineExceeded(`sandbox ${id} still has processes ${pids.join(',')} after ${timeoutMs} ms`);
      }
      // v1 SIGKILL does not wake a frozen task, so: freeze (no fork escapes the snapshot of
      // pids), signal, thaw (the killed tasks run and die). Without a freezer just signal.
      const canFreeze = freezer !== undefined && (await isDir(freezer));
      if (canFreeze) {
        await this.freeze(id, Math.min(KILL_FREEZE_WAIT_MS, Math.max(1, deadline - Date.now()))).catch(() => undefined);
      }
      signalPids(canFreeze ? await this.pids(id) : pids, 'SIGKILL');
      if (canFreeze) await writeCgroupFile(path.join(freezer, 'freezer.state'), 'THAWED').catch(() => undefined);
      await sleep(delay);
      delay = Math.min(delay * 2, 50);
    }
  }

  async remove(id: string): Promise<void> {
    assertSandboxId(id);
    const mem = this.dir('memory', id);
    if (mem) this.counters.forget(mem);
    const errors: unknown[] = [];
    await Promise.all(this.hierarchies.map((h) => rmdirCgroupTree(path.join(h.parent, id)).catch((e) => { errors.push(e); })));
    // Again after the rmdir: a counter read while it ran (the limit sweep) opened the file anew.
    if (mem) this.counters.forget(mem);
    if (errors.length > 0) throw errors[0];
  }

  async removeInstance(): Promise<void> {
    const left = await this.list();
    if (left.length > 0) throw failedPrecondition(`instance ${this.instance} still has sandbox cgroups: ${left.join(', ')}`);
    for (const h of this.hierarchies) {
      try {
        await rmdir(h.parent);
      } catch (e) {
        if (errnoOf(e) !== 'ENOENT') throw cgroupFsError(e, `rmdir ${h.parent}`);
      }
    }
  }

  async setMemoryLimit(id: string, bytes: number | null): Promise<void> {
    assertSandboxId(id);
    if (bytes !== null && (!Number.isSafeInteger(bytes) || bytes < 0)) {
      throw invalidArgument(`memory limit must be a non-negative integer number of bytes or null, got ${bytes}`);
    }
    const mem = this.dir('memory', id);
    if (!mem) throw failedPrecondition('no memory cgroup hierarchy is mounted');
    if (!(await isDir(mem))) throw notFound(`cgroup of sandbox ${id} not found`);
    const value = bytes === null ? '-1' : String(bytes);
    const limitFile = path.join(mem, 'memory.limit_in_bytes');
    try {
      await writeCgroupFile(limitFile, value);
    } catch (e) {
      // memory.limit must stay ≤ memory.memsw.limit: raise memsw first, then retry.
      const memsw = path.join(mem, 'memory.memsw.limit_in_bytes');
      if (errnoOf(e) !== 'EINVAL' || (await readOptional(memsw)) === null) throw limitError(e, id);
      await writeCgroupFile(memsw, value).catch((e2) => { throw limitError(e2, id); });
      await writeCgroupFile(limitFile, value).catch((e2) => { throw limitError(e2, id); });
    }
  }

  memcgPath(id: string): string | null {
    assertSandboxId(id);
    const h = this.hier('memory');
    return h ? `/${path.relative(h.mountPoint, path.join(h.parent, id))}` : null;
  }

  async reclaim(id: string, _bytes?: number): Promise<{ beforeBytes: number; afterBytes: number }> {
    assertSandboxId(id);
    const mem = this.dir('memory', id);
    if (!mem) throw failedPrecondition('no memory cgroup hierarchy is mounted');
    if (!(await isDir(mem))) throw notFound(`cgroup of sandbox ${id} not found`);
    const usageFile = path.join(mem, 'memory.usage_in_bytes');
    const beforeBytes = (await readNumber(usageFile)) ?? 0;
    try {
      // Any write makes the kernel reclaim the cgroup's pages as far as it can (no swap: anon stays).
      await writeCgroupFile(path.join(mem, 'memory.force_empty'), '0');
    } catch (e) {
      const code = errnoOf(e);
      if (code === 'ENOENT' && (await isDir(mem))) throw unimplemented('kernel has no memory.force_empty', e);
      if (code !== 'EBUSY' && code !== 'EINTR') throw cgroupFsError(e, `reclaim sandbox ${id}`);
    }
    const afterBytes = (await readNumber(usageFile)) ?? 0;
    return { beforeBytes, afterBytes };
  }

  async setIo(id: string, io: IoLimits, dev: BlockDevice): Promise<void> {
    assertSandboxId(id);
    const d = this.dir('blkio', id);
    if (!d) {
      if (hasIoMax(io)) throw failedPrecondition('no blkio cgroup hierarchy is mounted: I/O limits (io_max) cannot be applied on this host');
      return;
    }
    if (!(await isDir(d))) throw notFound(`cgroup of sandbox ${id} not found`);
    const write = async (file: string, value: string) => {
      await writeCgroupFile(path.join(d, file), value).catch((e) => { throw cgroupFsError(e, `write ${file} (${value}) of sandbox ${id}`); });
    };
    const wf = await v1WeightFile(d);
    const w = io.weight ?? IO_WEIGHT_DEFAULT;
    if (wf) await write(wf, String(wf === 'blkio.bfq.weight' ? bfqWeight(w) : v1Weight(w)));
    if (!(await isFile(path.join(d, 'blkio.throttle.write_bps_device')))) {
      if (hasIoMax(io)) throw failedPrecondition('the blkio hierarchy has no blkio.throttle files (CONFIG_BLK_DEV_THROTTLING): I/O limits (io_max) cannot be applied on this host');
      return;
    }
    // All four, so a limit the new settings leave out is removed (0).
    for (const [file, line] of v1ThrottleLines(dev, io)) await write(file, line);
  }

  async ioSupport(dev: BlockDevice | null): Promise<IoSupport> {
    const parent = this.parents.blkio;
    const none = (why: string): IoSupport => ({ weightFile: null, weightEnforced: false, limitFile: null, limitEnforced: false, bufferedWritesLimited: false, detail: why });
    if (!parent) return none('cgroup v1 without a blkio hierarchy: no I/O weight or limit is enforced');
    if (!dev) return none('writable layers are on the host filesystem, not on a device of their own: no I/O weight or limit is applied');
    const weightFile = await v1WeightFile(parent);
    const sched = deviceScheduler(dev.major, dev.minor);
    const weightEnforced = (weightFile === 'blkio.bfq.weight' && sched === 'bfq') || (weightFile === 'blkio.weight' && sched === 'cfq');
    const limitFile = (await isFile(path.join(parent, 'blkio.throttle.write_bps_device'))) ? 'blkio.throttle.*_device' : null;
    const w = weightFile
      ? `io_weight is written to ${weightFile}${weightEnforced ? ` and enforced (scheduler ${sched} on ${devKey(dev)})` : `, but has no effect: the scheduler of ${devKey(dev)} is ${sched ?? 'unknown'}, not ${weightFile === 'blkio.bfq.weight' ? 'bfq' : 'cfq'}`}`
      : `io_weight is not enforced: cgroup v1 has no blkio.weight or blkio.bfq.weight here (no CFQ since Linux 5.0, BFQ not loaded)`;
    const l = limitFile
      ? `io_max is enforced by blkio.throttle on ${devKey(dev)} for reads and direct I/O only: cgroup v1 has no cgroup writeback, so buffered writes reach the device from the kernel's flusher threads, charged to the root cgroup, and are not limited`
      : 'io_max is not enforced: no blkio.throttle files (CONFIG_BLK_DEV_THROTTLING)';
    return { weightFile, weightEnforced, limitFile, limitEnforced: limitFile !== null, bufferedWritesLimited: false, detail: `cgroup v1: ${w}; ${l}` };
  }

  async ioCounters(id: string, dev: BlockDevice): Promise<IoCounters> {
    assertSandboxId(id);
    const d = this.dir('blkio', id);
    const zero = { readBytes: 0, writeBytes: 0, readIos: 0, writeIos: 0 };
    if (!d) return zero;
    const pick = async (base: string) => (await readOptional(path.join(d, `${base}_recursive`))) ?? (await readOptional(path.join(d, base))) ?? '';
    const bytes = parseBlkioRw(await pick('blkio.throttle.io_service_bytes'), dev);
    const ios = parseBlkioRw(await pick('blkio.throttle.io_serviced'), dev);
    return { readBytes: bytes.read, writeBytes: bytes.write, readIos: ios.read, writeIos: ios.write };
  }
}

/** The weight file of a v1 blkio cgroup dir: BFQ's where it exists, else CFQ's, else null. */
async function v1WeightFile(dir: string): Promise<'blkio.bfq.weight' | 'blkio.weight' | null> {
  if (await isFile(path.join(dir, 'blkio.bfq.weight'))) return 'blkio.bfq.weight';
  if (await isFile(path.join(dir, 'blkio.weight'))) return 'blkio.weight';
  return null;
}

/** Maps a failed memory-limit write: EBUSY means usage could not be pushed below the new limit. */
function limitError(e: unknown, id: string) {
  if (errnoOf(e) === 'EBUSY') {
    return failedPrecondition(`sandbox ${id} uses more memory than the new limit and it cannot be reclaimed`, e);
  }
  return cgroupFsError(e, `set memory limit of sandbox ${id}`);
}
