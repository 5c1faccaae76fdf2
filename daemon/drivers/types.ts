/**
 * The backend contract. Every isolation tier (container, fncall, microvm, vm)
 * implements {@link SandboxDriver}; the lifecycle state machine, the store and the API
 * live once in daemon/sandbox/ and never per driver (DESIGN.md §3).
 *
 * Contract for every method: it may be interrupted by a crash at any point and called
 * again (or `destroy`ed) after a restart, so each is idempotent with respect to what it
 * leaves on the host.
 */
import type { IsolateOptions } from '../agent/protocol.js';
import type { SeccompCounts } from '../security/seccomp-monitor.js';
import type { Backend, DefenceStatus, ImageConfig } from '../api/schema.js';
import type { z } from 'zod';
import type { SandboxRecord } from '../sandbox/repo.js';
import type { Failpoints } from '../sandbox/failpoints.js';
import type { AgentClient, AgentExecHandle, AgentExecResult } from '../agent/client.js';

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
}

/** Output callbacks of a started exec. */
export interface DriverExecHandlers {
  onStdout(b: Buffer): void;
  onStderr(b: Buffer): void;
}

/** Result of a driver exec plus whether the sandbox OOM-killed a process meanwhile. */
export type DriverExecResult = AgentExecResult & { oom: boolean };

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
  /** Creates and starts the sandbox described by `sb` (state creating); returns its init. */
  create(sb: SandboxRecord, fp: Failpoints): Promise<InitInfo>;
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
  limitCounters(sb: SandboxRecord): Promise<{ oomKills: number; pidsLimitHits: number } | null>;
  /**
   * Sets the CPU (cores), memory (bytes) and pids limits of a running sandbox of the
   * `latency` priority class, as its create would have (claiming a warm-pool shell,
   * daemon/sandbox/warm-pool.ts). Absent: the backend cannot, and its sandboxes are never pooled.
   * @throws DsecError NotFound (no cgroup), FailedPrecondition/Internal (cgroupfs errors).
   */
  applyLimits?(sb: SandboxRecord, limits: { cpus: number; memoryBytes: number; pids: number }): Promise<void>;
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
