/**
 * The backend contract. Every isolation tier (container, fncall, microvm, vm)
 * implements {@link SandboxDriver}; the lifecycle state machine, the store and the API
 * live once in daemon/sandbox/ and never per driver (DESIGN.md §3).
 *
 * Contract for every method: it may be interrupted by a crash at any point and called
 * again (or `destroy`ed) after a restart, so each is idempotent with respect to what it
 * leaves on the host.
 */
import type { GuestReclaimStats } from './microvm/reclaim.js';
import type { IsolateOptions } from '../agent/protocol.js';
import type { SeccompCounts } from '../security/seccomp-monitor.js';
import type { Backend, DefenceStatus, ImageConfig } from '../api/schema.js';
import type { z } from 'zod';
import type { SandboxRecord } from '../sandbox/repo.js';
import type { Failpoints } from '../sandbox/failpoints.js';
import type { AgentClient, AgentExecHandle, AgentExecResult } from '../agent/client.js';
import type { IoLimits } from '../host/cgroups/io.js';

/** What a backend can do on this host; reported by `dsec host info`. */
export interface DriverCapabilities {
  /** Plugin id, versioned like containerd's: e.g. `dsec.driver.container.v1`. */
  id: string;
  backend: Backend;
  /** False when the host lacks what the backend needs; `reason` says what. */
  available: boolean;
  reason: string | null;
  pause: boolean;
  snapshot: boolean;
}

/**
 * What a machine snapshot (`kind: vm`, the microvm tier) captured and how to boot it
 * again: the machine's QEMU configuration, which a restore must repeat exactly (the
 * migration stream carries RAM and device state, not the device set), and the two files
 * in the snapshot's directory ({@link MACHINE_STATE_FILE}, {@link MACHINE_DISK_FILE}).
 * Stored as JSON in the snapshot row; field names are part of the store format.
 */
export interface MachineSnapshot {
  /** QEMU that wrote the state, `major.minor.micro` (from the QMP greeting). */
  qemuVersion: string;
  accel: 'kvm' | 'tcg';
  /** Guest RAM, MiB (`-m`). */
  memoryMiB: number;
  /** vCPUs (`-smp`). */
  vcpus: number;
  /** Host paths of the boot kernel and initramfs the source booted (both content-addressed under `<root>/vm`). */
  kernel: string;
  initrd: string;
  /** `tsc_early_khz` of the source's command line (TCG), or null. */
  tscKhz: number | null;
  /** Layer digests attached as read-only disks, lowest first (virtio-mmio slot order). */
  layers: string[];
  /** Bytes of the migration stream file and its sha256 (hex), checked before a restore. */
  stateBytes: number;
  stateSha256: string;
  /** Apparent size of the writable disk copy, bytes (the guest's ext4 size). */
  diskBytes: number;
  /** Host bytes the disk copy takes (allocated blocks; 0 extra where it is a reflink). */
  diskAllocatedBytes: number;
  /** Whether the disk copy shares its blocks with the source (`cp --reflink=auto` made a reflink). */
  diskReflinked: boolean;
  /** How long the source's vCPUs were stopped for the capture, ms. */
  pausedMs: number;
}

/** File of a machine snapshot's migration stream (QEMU's savevm format), in its directory. */
export const MACHINE_STATE_FILE = 'state.qemu';
/** File of a machine snapshot's writable-disk copy, in its directory. */
export const MACHINE_DISK_FILE = 'disk.raw';

/** Where a create restores a machine snapshot from (microvm restores and forks). */
export interface MachineRestore {
  /** Snapshot id, for messages. */
  snapshotId: string;
  /** The snapshot's directory, holding {@link MACHINE_STATE_FILE} and {@link MACHINE_DISK_FILE}. */
  dir: string;
  machine: MachineSnapshot;
}

/** Resource usage of one sandbox: bytes, nanoseconds of CPU, process count. */
export interface SandboxStats {
  cpuUsageNs: number;
  memoryBytes: number;
  memoryLimitBytes: number | null;
  pids: number;
  oomKills: number;
  /** Forks refused at the pids limit (pids.events max). */
  pidsLimitHits: number;
  /** Denied system calls as the seccomp monitor counted them, or null: not counted. */
  seccompDenials?: SeccompCounts | null;
  /** A microVM's guest-side DAMON reclaim (microvm/reclaim.ts), as of the guest's last stats refresh; null or absent: none runs. */
  guestReclaim?: GuestReclaimStats | null;
}

/** What a pause reclaimed, measured from the sandbox's memory.stat before and after. Bytes. */
export interface ReclaimReport {
  memory_before_bytes: number;
  memory_after_bytes: number;
  /** File-backed (page cache) bytes before and after. */
  file_before_bytes: number;
  file_after_bytes: number;
  /** Anonymous bytes after the pause: reclaimable only where swap or zswap exists. */
  anon_bytes: number;
  reclaimed_bytes: number;
  /** Whether the host has swap, so anonymous memory could be reclaimed too. */
  swap: boolean;
  note: string;
}

/** Where the init of a running sandbox is: host pid and its /proc starttime. */
export interface InitInfo {
  pid: number;
  start: number;
}

/** A command to run in a sandbox, resolved against the sandbox and image config. */
export interface DriverExecRequest {
  argv: string[];
  /** Full environment, `K=V`. */
  env: string[];
  cwd: string;
  user: string;
  stdin?: Buffer;
  timeoutMs?: number;
  /** Cap per output stream, bytes. */
  maxOutputBytes: number;
  /**
   * Run in fresh namespaces so nothing of the command survives it (fncall workers only;
   * see daemon/agent/protocol.ts IsolateOptions). Absent: a plain exec.
   */
  isolate?: IsolateOptions;
}

/** A command to start as an exec session (output streamed through handlers). */
export interface DriverStartExecRequest extends Omit<DriverExecRequest, 'stdin' | 'maxOutputBytes'> {
  /** True: stdin is a pipe fed by the handle; false: /dev/null. */
  stdin: boolean;
  /** Allocate a pseudo-terminal of this size (rows, cols) for the command. */
  tty?: { rows: number; cols: number };
  /**
   * The caller will pause the command's output through the handle (pauseOutput): the exec
   * gets an agent connection of its own, so pausing it stalls no other exec or file copy.
   */
  paced?: boolean;
}

/** Output callbacks of a started exec. */
export interface DriverExecHandlers {
  onStdout(b: Buffer): void;
  onStderr(b: Buffer): void;
}

/**
 * Result of a driver exec plus the sandbox's OOM kills meanwhile: `oomKills` is how much
 * its memory cgroup's OOM kill counter rose from before the command to after it (any
 * process of the sandbox; null when the backend cannot see the counter), `oom` whether
 * the command itself died of SIGKILL while it rose.
 */
export type DriverExecResult = AgentExecResult & { oom: boolean; oomKills: number | null };

/** Leftovers found on the host that no store row accounts for. */
export interface OrphanReport {
  /** Human-readable description of each leftover removed. */
  removed: string[];
}

/** An image reference a driver resolves itself (the vm tier's `disk:NAME`), in place of the image store. */
export interface ResolvedImage {
  /** The reference as stored in the sandbox row. */
  image: string;
  /** Layer digests (none for a disk image). */
  layers: string[];
  config: z.infer<typeof ImageConfig>;
}

/** One client of a VM's serial console (see daemon/drivers/vm/console.ts). */
export interface ConsoleClientHandlers {
  /** Guest output as it arrives. */
  onData(b: Buffer): void;
  /** The console ended (the VM stopped, or dsecd closed it); called once. */
  onEnd(reason: string): void;
}

/** The backend contract; see the module comment for the idempotency rule. */
export interface SandboxDriver {
  readonly backend: Backend;
  capabilities(): DriverCapabilities;
  /**
   * Creates and starts the sandbox described by `sb` (state creating); returns its init.
   * With `restore` (backends with {@link snapshotMachine} only), the sandbox is the
   * machine of that snapshot, resumed where it was captured, instead of a fresh boot.
   */
  create(sb: SandboxRecord, fp: Failpoints, restore?: MachineRestore): Promise<InitInfo>;
  /** Starts a stopped sandbox again on its kept writable layer. */
  start(sb: SandboxRecord, fp: Failpoints): Promise<InitInfo>;
  /**
   * Ends every process of the sandbox; keeps its writable layer. Safe on a dead sandbox.
   * With `graceMs` > 0, processes first get SIGTERM and up to that long to exit before
   * everything is killed.
   */
  stop(sb: SandboxRecord, fp: Failpoints, opts?: { graceMs?: number }): Promise<void>;
  /** Removes everything of the sandbox from the host. Safe on any partial state. */
  destroy(sb: SandboxRecord, fp: Failpoints): Promise<void>;
  /** Runs a command to completion. @throws DsecError FailedPrecondition when the sandbox is not running. */
  exec(sb: SandboxRecord, req: DriverExecRequest): Promise<DriverExecResult>;
  /**
   * Starts a command and returns its handle at once; output arrives through `handlers`.
   * @throws DsecError Unavailable when the agent cannot be reached.
   */
  startExec(sb: SandboxRecord, req: DriverStartExecRequest, handlers: DriverExecHandlers): Promise<AgentExecHandle>;
  /**
   * The sandbox's agent connection (the same protocol for every backend), for file
   * operations and other agent requests.
   * @throws DsecError Unavailable when the agent cannot be reached.
   */
  agentClient(sb: SandboxRecord): Promise<AgentClient>;
  /** Resource usage of a running sandbox, or null when it has none (stopped). */
  stats(sb: SandboxRecord): Promise<SandboxStats | null>;
  /**
   * The kernel's limit counters of a running sandbox (OOM kills, forks refused at the
   * pids limit), cheap enough for a periodic sweep; null when it has none.
   */
  limitCounters(sb: Pick<SandboxRecord, 'id' | 'state'>): Promise<{ oomKills: number; pidsLimitHits: number } | null>;
  /**
   * The cumulative OOM kill count of the sandbox's processes (its memory cgroup's), read
   * before and after an exec session to give its `oom_kills`; null when it cannot be read.
   * Absent: the backend cannot see the kills of its sandboxes' processes (a VM's guest
   * kernel kills inside the guest), and sessions report null.
   */
  oomKillCount?(sb: Pick<SandboxRecord, 'id'>): Promise<number | null>;
  /**
   * Sets the CPU (cores), memory (bytes) and pids limits of a running sandbox of the
   * `latency` priority class, as its create would have (claiming a warm-pool shell,
   * daemon/sandbox/warm-pool.ts). Absent: the backend cannot, and its sandboxes are never pooled.
   * @throws DsecError NotFound (no cgroup), FailedPrecondition/Internal (cgroupfs errors).
   */
  applyLimits?(sb: SandboxRecord, limits: { cpus: number; memoryBytes: number; pids: number }): Promise<void>;
  /**
   * Applies I/O settings (daemon/host/cgroups/io.ts) to a running sandbox's cgroup on the
   * writable-layer store's device, replacing its current ones; null: the kernel's
   * defaults. A no-op where the store has no device of its own. Absent: the backend has
   * no I/O settings.
   * @throws DsecError NotFound (no cgroup), FailedPrecondition (limits the host cannot apply), Internal.
   */
  applyIo?(sb: SandboxRecord, io: IoLimits | null): Promise<void>;
  /**
   * Which per-sandbox defences are in force for `sb`, by name (e.g. `readonly_paths`,
   * `landlock`), each saying truthfully whether and why (for GET /v1/sandboxes/{id}).
   * Optional: a backend without per-sandbox defences omits it.
   */
  defences?(sb: SandboxRecord): Promise<Record<string, DefenceStatus>>;
  /** Host path of the sandbox's agent log, or null for backends without one. */
  logPath(sb: SandboxRecord): string | null;
  /** Whether the sandbox's init (as recorded) is alive; used at restart to adopt it. */
  isAlive(sb: SandboxRecord): Promise<boolean>;
  /** Re-establishes in-memory state (agent connection, layer refs) for a live sandbox after a restart. */
  adopt(sb: SandboxRecord): Promise<void>;
  /** Removes host leftovers of this backend that belong to none of `known` sandbox ids. */
  cleanOrphans(known: Set<string>): Promise<OrphanReport>;
  /**
   * Runs `fn` on the sandbox's writable layer (its overlay upper dir) while no process
   * of the sandbox can change it (frozen when running; stopped sandboxes need nothing).
   * `dsecCreated` lists the paths (relative to the sandbox root, no leading `/`) that dsec
   * itself created in the upper dir (mount points for bind mounts such as
   * /etc/resolv.conf, `writable_paths` directories): commit strips them, because they are
   * runtime state rather than the sandbox's work. Used by commit and snapshots.
   * @throws DsecError FailedPrecondition when the sandbox has no writable layer on this host.
   */
  withWritableLayer<T>(sb: SandboxRecord, fn: (upperDir: string, dsecCreated: readonly string[]) => Promise<T>): Promise<T>;
  /**
   * Captures a running or paused sandbox's whole machine (guest RAM, CPU and device
   * state, and its writable disk) into the empty directory `dir`; the sandbox is left in
   * the run state it had. Optional: backends with machine snapshots only (capability
   * `snapshot` of a VM tier).
   * @throws DsecError FailedPrecondition (not running or paused, started by a dsecd
   *   without machine records), DeadlineExceeded / Unavailable (QMP), Internal (the copy
   *   or the migration failed; `dir` may hold partial files the caller removes).
   */
  snapshotMachine?(sb: SandboxRecord, dir: string): Promise<MachineSnapshot>;
  /**
   * Checks that a machine snapshot can be restored on this host before anything is
   * created: its files are complete and intact (size and sha256 of the state), and the
   * QEMU, accelerator, kernel and initramfs it needs are here.
   * @throws DsecError FailedPrecondition naming what is wrong (without the snapshot's
   *   name: the caller prefixes it).
   */
  checkMachine?(restore: MachineRestore): Promise<void>;
  /** Freezes every process of a running sandbox and reclaims what memory the host can. */
  pause(sb: SandboxRecord): Promise<ReclaimReport>;
  /** Thaws a paused sandbox: every process continues where it stopped. */
  resume(sb: SandboxRecord): Promise<void>;
  /** Releases in-memory resources at daemon shutdown; sandboxes keep running. */
  close(): Promise<void>;
  /**
   * Resolves an image reference this backend owns (the vm tier's `disk:NAME`), or null:
   * the image store resolves it. Optional.
   * @throws DsecError NotFound / FailedPrecondition for a reference it owns but cannot use.
   */
  resolveImage?(ref: string): Promise<ResolvedImage | null>;
  /**
   * Attaches to the sandbox's serial console (vm tier only); returns the input writer, a
   * promise of the input side draining, and the detach function.
   * @throws DsecError Unavailable when the console is not connected.
   */
  attachConsole?(sb: SandboxRecord, c: ConsoleClientHandlers): { write(b: Buffer): boolean; detach(): void; drained(): Promise<void> };
}
