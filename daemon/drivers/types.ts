/**
 * The backend contract. Every isolation tier (container, fncall, microvm, vm) has a
 * driver: {@link SandboxController} for the lifecycle (about ten methods, each with a
 * one-line contract), {@link SandboxIo} for what reaches inside (exec, files, console),
 * and {@link SandboxExtras} for what a tier may offer beyond. Drivers take the sandbox's
 * record from the model (daemon/model/), never a wire type; what a tier can do is its
 * {@link BackendCapabilities}, so the lifecycle (daemon/sandbox/) never tests a backend's
 * name and lives once for every tier.
 *
 * Contract for every method: it may be interrupted by a crash at any point and called
 * again (or `destroy`ed) after a restart, so each is idempotent with respect to what it
 * leaves on the host.
 */
import type { GuestReclaimStats } from './microvm/reclaim.js';
import type { IsolateOptions } from '../agent/protocol.js';
import type { SeccompCounts } from '../security/seccomp-monitor.js';
import type { AgentClient, AgentExecHandle, AgentExecResult } from '../agent/client.js';
import type { Backend } from '../model/backend.js';
import type { ImageSource } from '../model/image.js';
import type { NetworkMode } from '../model/network.js';
import type { IoLimits } from '../model/resources.js';
import type { DefenceStatus, SandboxRecord } from '../model/sandbox.js';
import type { MachineRestore, MachineSnapshot } from '../model/snapshot.js';
import type { StepObserver } from '../model/steps.js';

/** What a driver can do for one tier on this host; `dsec host info` reports `available` and `reason`. */
export interface BackendCapabilities {
  /** Plugin id, versioned like containerd's: e.g. `dsec.driver.container.v1`. */
  id: string;
  backend: Backend;
  /** False when the host lacks what the backend needs; `reason` says what. */
  available: boolean;
  reason: string | null;
  /** How sandboxes are isolated: a container on the host kernel, or a VM with a guest kernel of its own (wording of progress and messages). */
  isolation: 'container' | 'vm';
  /** Pause and resume (freeze, or stop the vCPUs). */
  pause: boolean;
  /** What a snapshot captures: the writable layer (`filesystem`), the whole machine (`machine`), or nothing (null: snapshots are not built). */
  snapshot: 'filesystem' | 'machine' | null;
  /** Network modes a sandbox may have (a VM's guest has only loopback: `none`). */
  networkModes: readonly NetworkMode[];
  /** I/O weight and limits on the writable-layer store's device (`io_weight`, `io_max`). */
  io: boolean;
  /** The writable layer is an entry of the writable-layer store, whose quotas admission sums. */
  storeDisk: boolean;
  /** Warm-pool shells can be made and claimed: limits and I/O settings can change on a running sandbox ({@link SandboxController.update}). */
  pool: boolean;
  /** A serial console ({@link SandboxIo.attachConsole}). */
  console: boolean;
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

/**
 * File operations inside a sandbox (the agent's, daemon/agent/files.ts), with the buffer
 * counts of its connection that transfers account for (daemon/api/transfer.ts): what
 * {@link SandboxIo.files} hands out, never the connection itself.
 */
export type AgentFiles = Pick<AgentClient, 'readFile' | 'writeFile' | 'stat' | 'list' | 'mkdir' | 'remove' | 'symlink' | 'outboundQueuedBytes' | 'inboundPendingBytes'>;

/** Leftovers found on the host that no store row accounts for. */
export interface OrphanReport {
  /** Human-readable description of each leftover removed. */
  removed: string[];
}

/** An image reference a driver resolves itself (the vm tier's `disk:NAME`), in place of the image store. */
export type ResolvedImage = ImageSource;

/** One client of a VM's serial console (see daemon/drivers/vm/console.ts). */
export interface ConsoleClientHandlers {
  /** Guest output as it arrives. */
  onData(b: Buffer): void;
  /** The console ended (the VM stopped, or dsecd closed it); called once. */
  onEnd(reason: string): void;
}

/** A client attached to a VM's serial console: its input writer and how it leaves. */
export interface ConsoleAttachment {
  /** Sends input to the guest; false when the input side is full (wait for {@link drained}). */
  write(b: Buffer): boolean;
  /** Leaves the console; the VM keeps running. */
  detach(): void;
  /** Resolves when the input side has room again. */
  drained(): Promise<void>;
}

/** Limits a running sandbox's cgroup can take on without a restart ({@link SandboxController.update}). */
export interface LiveUpdate {
  /** CPU (cores), memory (bytes) and pids limits, as a create of the `latency` class sets them. */
  limits?: { cpus: number; memoryBytes: number; pids: number };
  /** I/O settings on the writable-layer store's device; null: the kernel's defaults. */
  io?: IoLimits | null;
}

/**
 * The lifecycle of one tier's sandboxes, in the spirit of containerd's sandbox
 * Controller: each method takes the sandbox's record and, where it does durable work, a
 * {@link StepObserver} it tells each named step it reaches (failpoints, create progress).
 * See the module comment for the idempotency rule.
 */
export interface SandboxController {
  /** The tiers this driver serves (the container driver also serves fncall workers). */
  readonly backends: readonly Backend[];
  /** What this driver can do for sandboxes of `backend` (one of {@link backends}) on this host. */
  capabilities(backend: Backend): BackendCapabilities;
  /** Makes the root filesystem of a new sandbox (state creating): layers, writable layer or disk; from the machine snapshot `restore` when given. */
  prepare(sb: SandboxRecord, steps: StepObserver, restore?: MachineRestore): Promise<void>;
  /** Runs the init until its agent answers: a new sandbox's after {@link prepare} (state creating; resumed from `restore` when given), or a stopped one's on its kept writable layer. */
  start(sb: SandboxRecord, steps: StepObserver, restore?: MachineRestore): Promise<InitInfo>;
  /** Ends every process (SIGTERM and up to `graceMs` first, when > 0) and keeps the writable layer; safe on a dead sandbox. */
  stop(sb: SandboxRecord, steps: StepObserver, opts?: { graceMs?: number }): Promise<void>;
  /** Removes everything of the sandbox from the host; safe on any partial state. */
  destroy(sb: SandboxRecord, steps: StepObserver): Promise<void>;
  /** Freezes every process of a running sandbox and reclaims what memory the host can. */
  pause(sb: SandboxRecord): Promise<ReclaimReport>;
  /** Thaws a paused sandbox: every process continues where it stopped. */
  resume(sb: SandboxRecord): Promise<void>;
  /**
   * Applies limits to a running sandbox as its create would have (a warm-pool claim).
   * @throws DsecError FailedPrecondition without the capability (`pool` for limits, `io` for I/O), NotFound (no cgroup), Internal.
   */
  update(sb: SandboxRecord, u: LiveUpdate): Promise<void>;
  /** Whether the sandbox's init (as recorded: pid and start time) is alive; used to adopt it and to tell a dead one. */
  isAlive(sb: SandboxRecord): Promise<boolean>;
  /** Re-establishes in-memory state (agent connection, layer refs) for a live sandbox after a dsecd restart. */
  adopt(sb: SandboxRecord): Promise<void>;
  /** Resource usage of a running or paused sandbox, or null when it has none. */
  stats(sb: SandboxRecord): Promise<SandboxStats | null>;
  /** The kernel's limit counters (OOM kills, forks refused at the pids limit), cheap enough for a periodic sweep; null when it has none. */
  limitCounters(sb: Pick<SandboxRecord, 'id' | 'state'>): Promise<{ oomKills: number; pidsLimitHits: number } | null>;
  /** Removes host leftovers of this driver that belong to none of `known` sandbox ids. */
  cleanOrphans(known: Set<string>): Promise<OrphanReport>;
  /** Releases in-memory resources at daemon shutdown; sandboxes keep running. */
  close(): Promise<void>;
}

/** Commands, files and consoles of running sandboxes: what reaches inside. */
export interface SandboxIo {
  /** Runs a command to completion. @throws DsecError InvalidArgument (a cwd or user the sandbox lacks), Unavailable (agent unreachable or lost). */
  exec(sb: SandboxRecord, req: DriverExecRequest): Promise<DriverExecResult>;
  /** Starts a command and returns its handle at once; output arrives through `handlers`. @throws DsecError Unavailable. */
  startExec(sb: SandboxRecord, req: DriverStartExecRequest, handlers: DriverExecHandlers): Promise<AgentExecHandle>;
  /** File operations inside the sandbox, over its agent connection. @throws DsecError Unavailable. */
  files(sb: SandboxRecord): Promise<AgentFiles>;
  /**
   * The cumulative OOM kill count of the sandbox's processes (its memory cgroup's), read
   * before and after an exec session; null when it cannot be read. Absent: the backend
   * cannot see its sandboxes' kills (a VM's guest kernel kills inside the guest).
   */
  oomKillCount?(sb: Pick<SandboxRecord, 'id'>): Promise<number | null>;
  /** Host path of the sandbox's agent log (a VM without the agent: its console log), or null. */
  logPath(sb: SandboxRecord): string | null;
  /** Attaches to the serial console (capability `console`). @throws DsecError Unavailable when dsecd holds no console connection. */
  attachConsole?(sb: SandboxRecord, c: ConsoleClientHandlers): ConsoleAttachment;
}

/** What a tier may offer beyond the lifecycle; each is optional or gated by a capability. */
export interface SandboxExtras {
  /** Which per-sandbox defences are in force for `sb`, by name (e.g. `readonly_paths`, `landlock`), each saying truthfully whether and why. */
  defences?(sb: SandboxRecord): Promise<Record<string, DefenceStatus>>;
  /**
   * Runs `fn` on the sandbox's writable layer (its overlay upper dir) while no process of
   * the sandbox can change it (frozen when running). `dsecCreated` lists the paths
   * (relative to the sandbox root, no leading `/`) dsec itself created there (mount
   * points, writable_paths directories): commit strips them. Used by commit and
   * filesystem snapshots.
   * @throws DsecError FailedPrecondition when the sandbox has no writable layer directory on this host.
   */
  withWritableLayer<T>(sb: SandboxRecord, fn: (upperDir: string, dsecCreated: readonly string[]) => Promise<T>): Promise<T>;
  /**
   * Captures a running or paused sandbox's whole machine (RAM, CPU and device state, its
   * writable disk) into the empty directory `dir` (capability `snapshot: "machine"`); the
   * sandbox keeps the run state it had.
   * @throws DsecError FailedPrecondition (not running or paused, no machine record),
   *   DeadlineExceeded / Unavailable (QMP), Internal (`dir` may hold partial files the caller removes).
   */
  snapshotMachine?(sb: SandboxRecord, dir: string): Promise<MachineSnapshot>;
  /**
   * Checks that a machine snapshot can be restored here before anything is created: its
   * files intact, and the QEMU, accelerator, kernel and initramfs it needs present.
   * @throws DsecError FailedPrecondition naming what is wrong (the caller names the snapshot).
   */
  checkMachine?(restore: MachineRestore): Promise<void>;
  /**
   * Resolves an image reference this backend owns (the vm tier's `disk:NAME`), or null:
   * the image store resolves it.
   * @throws DsecError NotFound / FailedPrecondition for a reference it owns but cannot use.
   */
  resolveImage?(ref: string): Promise<ResolvedImage | null>;
}

/** A driver: the lifecycle, access to the inside, and what it offers beyond. */
export type SandboxDriver = SandboxController & SandboxIo & SandboxExtras;
