/**
 * The cgroup types every implementation shares: what a sandbox cgroup reports
 * ({@link CgroupStats}), the limits dsecd sets on one it creates ({@link CgroupLimits}),
 * and the {@link CgroupManager} interface. Kept apart from index.ts (which picks the
 * implementation) so v1.ts and v2.ts import them without importing index.ts back.
 */
import type { BlockDevice, IoCounters, IoSupport } from './io.js';
import type { IoLimits } from '../../model/resources.js';

/**
 * A point-in-time snapshot of one sandbox cgroup. Byte and nanosecond counts come
 * straight from the kernel files named below (v1 file / v2 file); missing files
 * (controller not mounted, old kernel) read as 0 / null / false.
 */
export interface CgroupStats {
  /** Charged memory in bytes, page cache included (v1 memory.usage_in_bytes / v2 memory.current). */
  memoryBytes: number;
  /** Memory limit in bytes, null when unlimited (v1 memory.limit_in_bytes / v2 memory.max). */
  memoryLimitBytes: number | null;
  /** Page cache in bytes (v1 memory.stat total_cache / v2 memory.stat file). */
  memoryCacheBytes: number;
  /** Anonymous memory in bytes (v1 memory.stat total_rss / v2 memory.stat anon). */
  memoryAnonBytes: number;
  /** Cumulative OOM kills (v1 memory.oom_control oom_kill / v2 memory.events oom_kill). */
  oomKills: number;
  /** Tasks in the cgroup (pids.current; v1 without a pids hierarchy: number of processes). */
  pidsCurrent: number;
  /** Task limit, null when unlimited (pids.max). */
  pidsLimit: number | null;
  /** Forks refused because the cgroup was at its task limit (pids.events `max`, v1 and v2); 0 when absent. */
  pidsLimitHits: number;
  /** CPU time used in nanoseconds (v1 cpuacct.usage / v2 cpu.stat usage_usec × 1000). */
  cpuUsageNs: number;
  /** True when fully frozen (v1 freezer.state FROZEN / v2 cgroup.events frozen 1). */
  frozen: boolean;
}

/**
 * Limits of a sandbox cgroup that dsecd creates itself ({@link CgroupManager.create}), in
 * the units of the OCI spec runc applies for containers: CPU as a CFS quota over a period
 * (µs), CPU shares (v1 `cpu.shares`; v2 maps them to `cpu.weight` as runc does), bytes,
 * a task count. null leaves a limit unset (unlimited).
 */
export interface CgroupLimits {
  cpuQuotaUs: number | null;
  cpuPeriodUs: number;
  cpuShares: number | null;
  memoryBytes: number | null;
  pids: number | null;
  /** v2 only: `cpu.idle` 1 (a batch sandbox), where the kernel has it. */
  idle?: boolean;
}

/**
 * One step of {@link CgroupManager.launchPlan}, as native/oci-exec performs it: `mkdir`
 * (an existing dir is fine), `copy` (`from`'s contents to `to` when `to` reads empty:
 * cpuset seeding), `write` (`value` to a cgroupfs file in one write).
 */
export type CgroupLaunchStep =
  | { op: 'mkdir'; path: string }
  | { op: 'copy'; from: string; to: string }
  | { op: 'write'; path: string; value: string };

/**
 * Everything the daemon does with cgroups, for one dsecd instance. Sandbox ids must
 * match `^[a-z0-9][a-z0-9_-]{0,63}$`; every method taking an id throws
 * DsecError(InvalidArgument) otherwise, before touching the filesystem. Methods that
 * need a cgroup which does not exist throw DsecError(NotFound) unless stated otherwise.
 */
export interface CgroupManager {
  /** 1 for legacy/hybrid hosts, 2 for pure cgroup2 hosts. */
  readonly version: 1 | 2;
  /** The dsecd instance name (validated against `^[a-z0-9][a-z0-9_.-]{0,62}$`). */
  readonly instance: string;
  /**
   * Absolute instance-parent dir per hierarchy name: v1 controller names (`memory`,
   * `cpu`, `cpuacct`, `freezer`, `pids`, …; co-mounted controllers share one dir), the
   * named hierarchy `systemd`, and `unified` (v2, and the cgroup2 mount of a hybrid host,
   * recorded so cgroup-BPF programs can attach there).
   */
  readonly parents: Record<string, string>;
  /** Mount point of each hierarchy, under the same keys as {@link parents}. */
  readonly mountPoints: Record<string, string>;
  /**
   * mkdir the instance parent in every hierarchy (idempotent; never creates the
   * daemon's own cgroup or anything above it). v1: also seeds the parent's
   * cpuset.cpus/mems from the own cgroup when empty. v2: enables cpu, memory, pids in
   * subtree_control of the own cgroup and of the parent, moving the daemon into a
   * `<own>/dsecd` leaf first (v2 forbids processes in a cgroup that delegates controllers).
   * @throws DsecError(FailedPrecondition) when the own cgroup dir is missing or busy.
   */
  init(): Promise<void>;
  /** The cgroupsPath to put in the OCI spec for sandbox `id`: relative, `dsec-<instance>/<id>`. */
  runtimePath(id: string): string;
  /**
   * Creates the cgroup of sandbox `id` in every hierarchy (v1: seeding cpuset.cpus/mems
   * from the parent, as runc does) and writes `limits`, for backends whose processes dsecd
   * starts itself rather than an OCI runtime (the microvm tier's VMM). Idempotent: an
   * existing cgroup just gets the limits again.
   * @throws DsecError InvalidArgument (bad id), FailedPrecondition/Internal (cgroupfs errors, naming the file).
   */
  create(id: string, limits: CgroupLimits): Promise<void>;
  /**
   * The `cgroup.procs` file of sandbox `id` in every hierarchy, in a fixed order: a
   * process that writes `0` to each has joined the sandbox everywhere (how the VMM
   * launcher enters it before exec). Nothing is created.
   */
  procsFiles(id: string): string[];
  /** Absolute dir of sandbox `id` per hierarchy name (same keys as {@link parents}); nothing is created. */
  sandboxPaths(id: string): Record<string, string>;
  /**
   * v1: the steps that create sandbox `id`'s cgroup in every hierarchy with `limits` and
   * the device rules `deviceRules` (`devices.allow` syntax, after `devices.deny` `a`), for
   * a process that then joins it ({@link procsFiles}) and starts the container there:
   * native/oci-exec runs them before it execs crun, so the cgroupfs work (a memory
   * cgroup's creation is the costly part) is done outside dsecd's event loop. Nothing is
   * touched here.
   * @throws DsecError InvalidArgument (bad id), FailedPrecondition (no devices hierarchy),
   *   Unimplemented on v2 (device rules are a BPF program the runtime loads there).
   */
  launchPlan(id: string, limits: CgroupLimits, deviceRules: readonly string[]): CgroupLaunchStep[];
  /** Sandbox ids (child dir names) that exist under the instance parent in ANY hierarchy, deduplicated and sorted. */
  list(): Promise<string[]>;
  /** True when the sandbox dir exists in at least one hierarchy. */
  exists(id: string): Promise<boolean>;
  /** Pids in the sandbox cgroup and its descendants (v1: pids hierarchy; v2: cgroup.procs), sorted; `[]` when gone. */
  pids(id: string): Promise<number[]>;
  /** Snapshot of the sandbox's counters. @throws DsecError(NotFound) when the cgroup does not exist. */
  stats(id: string): Promise<CgroupStats>;
  /** Cumulative OOM kills in the sandbox's memory cgroup (v1 memory.oom_control `oom_kill`; v2 memory.events `oom_kill`); 0 when absent. */
  oomKills(id: string): Promise<number>;
  /**
   * The two counters through which the kernel reports a sandbox hitting its limits:
   * OOM kills and forks refused at the pids limit; zeros when the files are absent.
   * Two small reads, cheap enough for a periodic sweep.
   */
  limitCounters(id: string): Promise<{ oomKills: number; pidsLimitHits: number }>;
  /**
   * Freezes the sandbox and waits until the kernel reports it frozen (v1 freezer.state
   * FROZEN; v2 cgroup.freeze=1 then cgroup.events `frozen 1`). On timeout the freeze is
   * undone and DsecError(DeadlineExceeded) is thrown. Safe to call on a frozen sandbox.
   * @param timeoutMs how long to wait for the kernel (default 5000).
   */
  freeze(id: string, timeoutMs?: number): Promise<void>;
  /** Thaws the sandbox and waits until it is no longer frozen; DeadlineExceeded after `timeoutMs` (default 5000). Safe to call twice. */
  thaw(id: string, timeoutMs?: number): Promise<void>;
  /**
   * SIGKILLs every process in the sandbox cgroup (v2: cgroup.kill when present; v1:
   * freeze, signal, thaw so no fork escapes and frozen tasks can die), repeating until
   * the cgroup is empty. Returns at once when there are no processes or no cgroup.
   * @throws DsecError(DeadlineExceeded) when processes remain after `timeoutMs` (default 5000).
   */
  killAll(id: string, timeoutMs?: number): Promise<void>;
  /**
   * rmdir the sandbox cgroup in every hierarchy, descendants first; ENOENT is fine
   * (safe to call twice), EBUSY is retried for up to 2 s.
   * @throws DsecError(FailedPrecondition) when a cgroup is still busy after the retries.
   */
  remove(id: string): Promise<void>;
  /**
   * rmdir the instance parents (used by tests and `dsecd --cleanup`); already-gone
   * parents are fine. The daemon's own cgroup (and a v2 `dsecd` leaf) is left alone.
   * @throws DsecError(FailedPrecondition) naming the sandboxes that still exist.
   */
  removeInstance(): Promise<void>;
  /**
   * Sets the sandbox memory limit in bytes, or removes it with null (v1
   * memory.limit_in_bytes, raising memory.memsw.limit_in_bytes first when it is in the
   * way; v2 memory.max). Used for reclaim squeezes.
   * @throws DsecError(InvalidArgument) for a negative/non-integer value; FailedPrecondition
   * when v1 cannot shrink usage below the new limit (EBUSY); NotFound when the cgroup is gone.
   */
  setMemoryLimit(id: string, bytes: number | null): Promise<void>;
  /**
   * Reclaims the sandbox's memory. v1: writes 0 to memory.force_empty (drops as much
   * as possible; `bytes` is ignored). v2: writes `bytes` (default: current usage) to
   * memory.reclaim; a partial reclaim (EAGAIN) is not an error. Returns memory usage
   * in bytes before and after; the difference is what was reclaimed.
   * @throws DsecError(NotFound) when the cgroup is gone; Unimplemented when the kernel lacks memory.reclaim/force_empty.
   */
  reclaim(id: string, bytes?: number): Promise<{ beforeBytes: number; afterBytes: number }>;
  /**
   * Applies the I/O settings `io` of sandbox `id` on device `dev` (the writable-layer
   * store's), replacing earlier ones: v2 writes `io.bfq.weight` where the device's
   * scheduler is BFQ, else `io.weight`, and `io.max` (`max` for what `io` leaves
   * unlimited); v1 writes `blkio.bfq.weight` or `blkio.weight` where the file exists and
   * the four `blkio.throttle.*_device` files (0: no limit). A weight without a weight file
   * (v1 without BFQ or CFQ, v2 without iocost and BFQ) is skipped: {@link ioSupport} says
   * so. Weight scales: see io.ts (bfqWeight, v1Weight).
   * @throws DsecError InvalidArgument (bad id), NotFound (no cgroup), FailedPrecondition
   *   (a limit is set but the host has no limit file: v2 without the io controller
   *   delegated, v1 without a blkio hierarchy), Internal (the kernel refused a value).
   */
  setIo(id: string, io: IoLimits, dev: BlockDevice): Promise<void>;
  /**
   * What this host enforces of I/O settings on device `dev` (null: no device to act on,
   * e.g. writable layers on the host filesystem): weight and limit files, whether each
   * takes effect, whether buffered writes are limited. Reads only.
   */
  ioSupport(dev: BlockDevice | null): Promise<IoSupport>;
  /**
   * Bytes and IOs sandbox `id` submitted to `dev` (v2 `io.stat`; v1
   * `blkio.throttle.io_service_bytes` and `io_serviced`, which count the bios that passed
   * the throttle, i.e. what was charged to the sandbox); zeros when the files are absent.
   * @throws DsecError InvalidArgument (bad id).
   */
  ioCounters(id: string, dev: BlockDevice): Promise<IoCounters>;
  /**
   * The path of sandbox `id`'s memory cgroup as DAMON's memcg filters name it
   * (`memcg_path`: from the memory controller's mount point, starting with `/`, e.g.
   * `/system.slice/dsecd.service/dsec-<instance>/<id>`), or null without a memory
   * hierarchy. Nothing is read or created.
   * @throws DsecError(InvalidArgument) for a bad id.
   */
  memcgPath(id: string): string | null;
}
