/**
 * cgroup v2 (pure unified hosts, i.e. production): one tree.
 *
 * Layout: `<mount>/<base>/dsec-<instance>/<id>`, where `<base>` is dsecd's own cgroup
 * (systemd gives it one with `Delegate=yes`, e.g. `/system.slice/dsecd.service`).
 *
 * Why the `dsecd` leaf: v2 has the "no internal processes" rule: a non-root cgroup
 * that enables controllers for its children in cgroup.subtree_control may not hold
 * processes itself (the write fails with EBUSY, and so does moving a process in). To
 * give sandboxes cpu/memory/pids, `<base>` must enable them, so `init()` first moves
 * the daemon (and any other process left in `<base>`, all of which belong to the
 * daemon's delegated unit) into `<base>/dsecd`. This also matches runc: for a relative
 * cgroupsPath runc's fs2 driver joins it with the PARENT of its own cgroup (it assumes
 * its own cgroup holds processes), and runc inherits `<base>/dsecd` from dsecd, so the
 * relative `dsec-<instance>/<id>` lands at `<base>/dsec-<instance>/<id>`. The real
 * root cgroup (no `cgroup.type` file) is exempt from the rule, so nothing is moved there.
 *
 * Numbers: memory.current/max/stat/events, pids.current/max, cpu.stat usage_usec,
 * cgroup.events frozen; bytes, and µs converted to ns.
 */
import { mkdir, rmdir } from 'node:fs/promises';
import path from 'node:path';
import { deadlineExceeded, failedPrecondition, invalidArgument, notFound, unimplemented } from '../../errors.js';
import type { CgroupLaunchStep, CgroupLimits, CgroupManager, CgroupStats } from './types.js';
import { bfqWeight, devKey, ioMaxLine, parseIoStat, type BlockDevice, type IoCounters, type IoSupport } from './io.js';
import {
  CounterFiles, INSTANCE_DIR_PREFIX, SANDBOX_ID_RE, assertInstanceName, assertSandboxId, cgroupFsError, childDirs, deviceScheduler, errnoOf,
  isDir, isFile, parseLimit, parsePids, pollUntil, readFlatKeyed, readNumber, readOptional, readPidsRecursive,
  rmdirCgroupTree, signalPids, sleep, writeCgroupFile, type HierarchyLayout,
} from './procfs.js';
import { IO_WEIGHT_DEFAULT, hasIoMax, type IoLimits } from '../../model/resources.js';

/** Name of the leaf cgroup, under dsecd's own cgroup, that the daemon moves itself into on v2. */
export const DAEMON_LEAF = 'dsecd';
/**
 * Controllers enabled for sandboxes on v2 (those of them the own cgroup has): what runc's
 * OCI limits need, and `io` for the sandboxes' I/O weights and limits ({@link CgroupV2Manager.setIo}).
 */
export const V2_CONTROLLERS = ['cpu', 'memory', 'pids', 'io'] as const;

/** Default wait for freeze/thaw/killAll, in ms (see v1.ts). */
const DEFAULT_TIMEOUT_MS = 5000;

/** Controller names in a `cgroup.controllers` / `cgroup.subtree_control` file (a leading `+` is dropped). */
function tokens(text: string | null): string[] {
  return (text ?? '').split(/\s+/).filter(Boolean).map((t) => t.replace(/^\+/, ''));
}

/**
 * The v2 {@link CgroupManager}. Construct through `detectCgroups`; the constructor only
 * computes paths. `parents` has the single key `unified`.
 */
export class CgroupV2Manager implements CgroupManager {
  /** Always 2. */
  readonly version = 2 as const;
  /** The dsecd instance name. */
  readonly instance: string;
  /** `{ unified: <base>/dsec-<instance> }`. */
  readonly parents: Record<string, string>;
  /** `{ unified: <mount point> }`. */
  readonly mountPoints: Record<string, string>;
  /** dsecd's own cgroup dir, minus a trailing `dsecd` leaf it may already have moved into. */
  readonly baseDir: string;
  private readonly parent: string;
  /** memory.events of each sandbox, kept open: read before and after every exec. */
  private readonly counters = new CounterFiles();
  /** The cgroup2 mount point (its root holds the host-wide `io.cost.qos`). */
  private readonly mountPoint: string;

  /**
   * @param instance validated instance name.
   * @param layout the unified hierarchy from `resolveLayout`.
   * @throws DsecError(InvalidArgument) for a bad instance name.
   */
  constructor(instance: string, layout: HierarchyLayout) {
    assertInstanceName(instance);
    this.instance = instance;
    // After init() (or a previous dsecd in this process) we live in <base>/dsecd.
    this.baseDir = path.basename(layout.ownDir) === DAEMON_LEAF ? path.dirname(layout.ownDir) : layout.ownDir;
    this.parent = path.join(this.baseDir, `${INSTANCE_DIR_PREFIX}${instance}`);
    this.parents = Object.freeze({ unified: this.parent });
    this.mountPoint = layout.mountPoint;
    this.mountPoints = Object.freeze({ unified: layout.mountPoint });
  }

  memcgPath(id: string): string {
    return `/${path.relative(this.mountPoint, this.dir(id))}`;
  }

  private dir(id: string): string {
    assertSandboxId(id);
    return path.join(this.parent, id);
  }

  /** Like {@link dir} but throws NotFound when the sandbox cgroup does not exist. */
  private async existingDir(id: string): Promise<string> {
    const d = this.dir(id);
    if (!(await isDir(d))) throw notFound(`cgroup of sandbox ${id} not found`);
    return d;
  }

  async init(): Promise<void> {
    const base = this.baseDir;
    if (!(await isDir(base))) throw failedPrecondition(`own cgroup ${base} does not exist`);
    // The real root cgroup has no cgroup.type and may hold processes alongside enabled
    // controllers; any other cgroup (a cgroup-namespace root included) may not.
    if (await isFile(path.join(base, 'cgroup.type'))) await this.moveIntoLeaf(base);

    const available = tokens(await readOptional(path.join(base, 'cgroup.controllers')));
    const want = V2_CONTROLLERS.filter((c) => available.includes(c));
    await enableControllers(base, want);
    try {
      await mkdir(this.parent);
    } catch (e) {
      if (errnoOf(e) !== 'EEXIST') throw cgroupFsError(e, `mkdir ${this.parent}`);
    }
    // What base delegates is exactly what the parent's cgroup.controllers offers.
    await enableControllers(this.parent, want);
  }

  /** Moves every process of `base` (the daemon first) into `<base>/dsecd`; see the file comment for why. */
  private async moveIntoLeaf(base: string): Promise<void> {
    const procs = parsePids((await readOptional(path.join(base, 'cgroup.procs'))) ?? '');
    if (procs.length === 0) return;
    const leaf = path.join(base, DAEMON_LEAF);
    try {
      await mkdir(leaf);
    } catch (e) {
      if (errnoOf(e) !== 'EEXIST') throw cgroupFsError(e, `mkdir ${leaf}`);
    }
    const order = procs.includes(process.pid) ? [process.pid, ...procs.filter((p) => p !== process.pid)] : procs;
    for (const pid of order) {
      try {
        await writeCgroupFile(path.join(leaf, 'cgroup.procs'), String(pid));
      } catch (e) {
        if (errnoOf(e) !== 'ESRCH') throw cgroupFsError(e, `move pid ${pid} into ${leaf}`);
      }
    }
  }

  runtimePath(id: string): string {
    assertSandboxId(id);
    return `${INSTANCE_DIR_PREFIX}${this.instance}/${id}`;
  }

  async create(id: string, limits: CgroupLimits): Promise<void> {
    const d = this.dir(id);
    try {
      await mkdir(d);
    } catch (e) {
      if (errnoOf(e) !== 'EEXIST') throw cgroupFsError(e, `mkdir ${d}`);
    }
    const write = async (file: string, value: string) => {
      await writeCgroupFile(path.join(d, file), value).catch((e) => { throw cgroupFsError(e, `write ${file} of sandbox ${id}`); });
    };
    if (limits.memoryBytes !== null) await write('memory.max', String(limits.memoryBytes));
    await write('cpu.max', `${limits.cpuQuotaUs ?? 'max'} ${limits.cpuPeriodUs}`);
    // runc's conversion of OCI shares to cpu.weight: [2, 262144] -> [1, 10000].
    if (limits.cpuShares !== null) await write('cpu.weight', String(Math.round(1 + ((limits.cpuShares - 2) * 9999) / 262142)));
    if (limits.pids !== null) await write('pids.max', String(limits.pids));
    if (limits.idle && (await isFile(path.join(d, 'cpu.idle')))) await write('cpu.idle', '1');
  }

  launchPlan(id: string): CgroupLaunchStep[] {
    assertSandboxId(id);
    throw unimplemented('cgroup v2 device rules are a BPF program the OCI runtime loads; dsecd does not write them (use runc on cgroup v2)');
  }

  procsFiles(id: string): string[] {
    return [path.join(this.dir(id), 'cgroup.procs')];
  }

  sandboxPaths(id: string): Record<string, string> {
    return { unified: this.dir(id) };
  }

  async list(): Promise<string[]> {
    return (await childDirs(this.parent)).filter((c) => SANDBOX_ID_RE.test(c));
  }

  async exists(id: string): Promise<boolean> {
    return isDir(this.dir(id));
  }

  async pids(id: string): Promise<number[]> {
    return readPidsRecursive(this.dir(id));
  }

  async stats(id: string): Promise<CgroupStats> {
    const d = await this.existingDir(id);
    const f = (n: string) => path.join(d, n);
    const [current, max, stat, events, pidsCur, pidsMax, cpu, cgEvents, pidsEv] = await Promise.all([
      readNumber(f('memory.current')),
      readOptional(f('memory.max')),
      readFlatKeyed(f('memory.stat')),
      readFlatKeyed(f('memory.events')),
      readNumber(f('pids.current')),
      readOptional(f('pids.max')),
      readFlatKeyed(f('cpu.stat')),
      readFlatKeyed(f('cgroup.events')),
      readFlatKeyed(f('pids.events')),
    ]);
    return {
      memoryBytes: current ?? 0,
      memoryLimitBytes: max === null ? null : parseLimit(max),
      memoryCacheBytes: stat.file ?? 0,
      memoryAnonBytes: stat.anon ?? 0,
      oomKills: events.oom_kill ?? 0,
      pidsCurrent: pidsCur ?? (await this.pids(id)).length,
      pidsLimit: pidsMax === null ? null : parseLimit(pidsMax),
      pidsLimitHits: pidsEv.max ?? 0,
      cpuUsageNs: (cpu.usage_usec ?? 0) * 1000,
      frozen: cgEvents.frozen === 1,
    };
  }

  async oomKills(id: string): Promise<number> {
    return this.counters.read(path.join(this.dir(id), 'memory.events')).oom_kill ?? 0;
  }

  async limitCounters(id: string): Promise<{ oomKills: number; pidsLimitHits: number }> {
    const [oomKills, ev] = await Promise.all([this.oomKills(id), readFlatKeyed(path.join(this.dir(id), 'pids.events'))]);
    return { oomKills, pidsLimitHits: ev.max ?? 0 };
  }

  /** Writes cgroup.freeze and waits for cgroup.events `frozen` to match; reverts and throws on timeout when freezing. */
  private async setFrozen(id: string, frozen: boolean, timeoutMs: number): Promise<void> {
    const d = await this.existingDir(id);
    const freezeFile = path.join(d, 'cgroup.freeze');
    if (!(await isFile(freezeFile))) throw unimplemented('kernel has no cgroup.freeze (needs Linux 5.2+)');
    const want = frozen ? 1 : 0;
    try {
      await writeCgroupFile(freezeFile, String(want));
    } catch (e) {
      throw cgroupFsError(e, `${frozen ? 'freeze' : 'thaw'} sandbox ${id}`);
    }
    const ok = await pollUntil(async () => (await readFlatKeyed(path.join(d, 'cgroup.events'))).frozen === want, timeoutMs);
    if (!ok) {
      if (frozen) await writeCgroupFile(freezeFile, '0').catch(() => undefined);
      throw deadlineExceeded(`sandbox ${id} did not ${frozen ? 'freeze' : 'thaw'} within ${timeoutMs} ms`);
    }
  }

  async freeze(id: string, timeoutMs = DEFAULT_TIMEOUT_MS): Promise<void> {
    await this.setFrozen(id, true, timeoutMs);
  }

  async thaw(id: string, timeoutMs = DEFAULT_TIMEOUT_MS): Promise<void> {
    await this.setFrozen(id, false, timeoutMs);
  }

  async killAll(id: string, timeoutMs = DEFAULT_TIMEOUT_MS): Promise<void> {
    const d = this.dir(id);
    const killFile = path.join(d, 'cgroup.kill');
    const hasKill = await isFile(killFile);
    const deadline = Date.now() + timeoutMs;
    let delay = 1;
    for (;;) {
      const pids = await readPidsRecursive(d);
      if (pids.length === 0) return;
      if (Date.now() >= deadline) {
        throw deadlineExceeded(`sandbox ${id} still has processes ${pids.join(',')} after ${timeoutMs} ms`);
      }
      if (hasKill) {
        // cgroup.kill (5.14+) kills the whole subtree atomically, frozen tasks and new forks included.
        await writeCgroupFile(killFile, '1').catch((e) => {
          if (errnoOf(e) !== 'ENOENT') throw cgroupFsError(e, `kill sandbox ${id}`);
        });
      } else {
        // Older kernels: signal pid by pid (v2 frozen tasks do die on SIGKILL) and repeat for forks.
        signalPids(pids, 'SIGKILL');
      }
      await sleep(delay);
      delay = Math.min(delay * 2, 50);
    }
  }

  async remove(id: string): Promise<void> {
    const dir = this.dir(id);
    this.counters.forget(dir);
    await rmdirCgroupTree(dir);
    // Again after the rmdir: a counter read while it ran (the limit sweep) opened the file anew.
    this.counters.forget(dir);
  }

  async removeInstance(): Promise<void> {
    const left = await this.list();
    if (left.length > 0) throw failedPrecondition(`instance ${this.instance} still has sandbox cgroups: ${left.join(', ')}`);
    try {
      await rmdir(this.parent);
    } catch (e) {
      if (errnoOf(e) !== 'ENOENT') throw cgroupFsError(e, `rmdir ${this.parent}`);
    }
  }

  async setMemoryLimit(id: string, bytes: number | null): Promise<void> {
    if (bytes !== null && (!Number.isSafeInteger(bytes) || bytes < 0)) {
      throw invalidArgument(`memory limit must be a non-negative integer number of bytes or null, got ${bytes}`);
    }
    const d = await this.existingDir(id);
    try {
      await writeCgroupFile(path.join(d, 'memory.max'), bytes === null ? 'max' : String(bytes));
    } catch (e) {
      throw cgroupFsError(e, `set memory limit of sandbox ${id}`);
    }
  }

  async reclaim(id: string, bytes?: number): Promise<{ beforeBytes: number; afterBytes: number }> {
    if (bytes !== undefined && (!Number.isSafeInteger(bytes) || bytes < 0)) {
      throw invalidArgument(`reclaim amount must be a non-negative integer number of bytes, got ${bytes}`);
    }
    const d = await this.existingDir(id);
    const reclaimFile = path.join(d, 'memory.reclaim');
    if (!(await isFile(reclaimFile))) throw unimplemented('kernel has no memory.reclaim (needs Linux 5.19+)');
    const beforeBytes = (await readNumber(path.join(d, 'memory.current'))) ?? 0;
    const amount = bytes ?? beforeBytes;
    if (amount > 0) {
      try {
        await writeCgroupFile(reclaimFile, String(amount));
      } catch (e) {
        // EAGAIN: the kernel reclaimed less than asked (e.g. anon memory without swap).
        if (errnoOf(e) !== 'EAGAIN') throw cgroupFsError(e, `reclaim sandbox ${id}`);
      }
    }
    const afterBytes = (await readNumber(path.join(d, 'memory.current'))) ?? 0;
    return { beforeBytes, afterBytes };
  }

  /**
   * The weight file for `dev` in cgroup dir `dir`: `io.bfq.weight` when BFQ schedules the
   * device (and the file exists), else `io.weight` when it exists, else null.
   */
  private async weightFile(dir: string, dev: BlockDevice): Promise<'io.bfq.weight' | 'io.weight' | null> {
    if (deviceScheduler(dev.major, dev.minor) === 'bfq' && (await isFile(path.join(dir, 'io.bfq.weight')))) return 'io.bfq.weight';
    if (await isFile(path.join(dir, 'io.weight'))) return 'io.weight';
    return null;
  }

  /** True when iocost is enabled for `dev` (a `MAJ:MIN ... enable=1` line in the root's io.cost.qos): what makes io.weight take effect without BFQ. */
  private async iocostEnabled(dev: BlockDevice): Promise<boolean> {
    const qos = (await readOptional(path.join(this.mountPoint, 'io.cost.qos')).catch(() => null)) ?? '';
    return qos.split('\n').some((l) => l.startsWith(`${devKey(dev)} `) && /\benable=1\b/.test(l));
  }

  async setIo(id: string, io: IoLimits, dev: BlockDevice): Promise<void> {
    const d = await this.existingDir(id);
    const write = async (file: string, value: string) => {
      await writeCgroupFile(path.join(d, file), value).catch((e) => { throw cgroupFsError(e, `write ${file} (${value}) of sandbox ${id}`); });
    };
    const wf = await this.weightFile(d, dev);
    const w = io.weight ?? IO_WEIGHT_DEFAULT;
    if (wf) await write(wf, `default ${wf === 'io.bfq.weight' ? bfqWeight(w) : w}`);
    if (!(await isFile(path.join(d, 'io.max')))) {
      if (hasIoMax(io)) throw failedPrecondition(`the io controller is not enabled for sandboxes (no io.max in ${d}; the own cgroup ${this.baseDir} does not have io in cgroup.controllers): I/O limits (io_max) cannot be applied on this host`);
      return;
    }
    // Every key is written (max where unlimited), so a limit the new settings leave out is removed.
    await write('io.max', ioMaxLine(dev, io));
  }

  async ioSupport(dev: BlockDevice | null): Promise<IoSupport> {
    const none = (why: string): IoSupport => ({ weightFile: null, weightEnforced: false, limitFile: null, limitEnforced: false, bufferedWritesLimited: false, detail: why });
    if (!tokens(await readOptional(path.join(this.parent, 'cgroup.controllers'))).includes('io')) {
      return none(`cgroup v2 without the io controller delegated to ${this.parent}: no I/O weight or limit is enforced`);
    }
    if (!dev) return none('writable layers are on the host filesystem, not on a device of their own: no I/O weight or limit is applied');
    // The parent's children are sandboxes: a sandbox's files are those the parent offers them.
    const probe = this.parent;
    const sched = deviceScheduler(dev.major, dev.minor);
    const weightFile = await this.weightFile(probe, dev);
    const iocost = await this.iocostEnabled(dev);
    const weightEnforced = weightFile === 'io.bfq.weight' || (weightFile === 'io.weight' && iocost);
    const w = weightFile === 'io.bfq.weight'
      ? `io_weight is written to io.bfq.weight and enforced (scheduler bfq on ${devKey(dev)})`
      : weightFile === 'io.weight'
        ? (iocost ? `io_weight is written to io.weight and enforced by iocost on ${devKey(dev)}` : `io_weight is written to io.weight, but has no effect: ${devKey(dev)} has scheduler ${sched ?? 'unknown'}, not bfq, and iocost is not enabled for it (io.cost.qos)`)
        : 'io_weight is not enforced: neither io.weight (iocost) nor io.bfq.weight (BFQ) exists';
    return {
      weightFile, weightEnforced, limitFile: 'io.max', limitEnforced: true, bufferedWritesLimited: true,
      detail: `cgroup v2: ${w}; io_max is enforced by io.max on ${devKey(dev)} for reads, direct I/O and buffered writes (cgroup writeback charges a dirty page's writeback to the sandbox that wrote it)`,
    };
  }

  async ioCounters(id: string, dev: BlockDevice): Promise<IoCounters> {
    return parseIoStat((await readOptional(path.join(this.dir(id), 'io.stat'))) ?? '', dev);
  }
}

/**
 * Enables `want` controllers in `dir`/cgroup.subtree_control, writing only the missing
 * ones (idempotent).
 * @throws DsecError(FailedPrecondition) on EBUSY (processes in `dir`: the no-internal-processes rule).
 */
async function enableControllers(dir: string, want: readonly string[]): Promise<void> {
  const file = path.join(dir, 'cgroup.subtree_control');
  const have = tokens(await readOptional(file));
  const missing = want.filter((c) => !have.includes(c));
  if (missing.length === 0) return;
  try {
    await writeCgroupFile(file, missing.map((c) => `+${c}`).join(' '));
  } catch (e) {
    if (errnoOf(e) === 'EBUSY') {
      throw failedPrecondition(`cannot enable ${missing.join(',')} in ${file}: the cgroup holds processes (cgroup v2 no-internal-processes rule)`, e);
    }
    throw cgroupFsError(e, `enable controllers in ${file}`);
  }
}
