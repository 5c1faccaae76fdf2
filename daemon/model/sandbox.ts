/**
 * A sandbox in the domain's terms: what a create asks for ({@link SandboxInput}), the
 * same with every default applied and every name resolved ({@link SandboxSpec}), and the
 * record the store keeps and every layer below the API reads ({@link SandboxRecord}).
 * The API converts its wire request into a SandboxInput once (daemon/api/convert.ts); the
 * lifecycle resolves it into a SandboxSpec once (daemon/sandbox/resolve.ts), and nothing
 * below reads a request again.
 */
import type { Backend } from './backend.js';
import type { ResolvedFilesystem, FilesystemOptions } from './filesystem.js';
import type { ImageConfig, SeccompOverride } from './image.js';
import type { NetworkSpec } from './network.js';
import type { IoMaxInput, Priority, Resources } from './resources.js';
import type { SandboxState } from './state.js';

/**
 * A create as the caller asked for it: every field but `backend` and `image` optional
 * (absent: the default, see {@link SandboxSpec}). Sizes in bytes, CPU in cores, times in
 * seconds as named.
 */
export interface SandboxInput {
  backend: Backend;
  /** The tenant the sandbox belongs to (daemon/model/tenant.ts); absent: `system`. */
  tenant?: string;
  /** Image reference, `name[:tag]` or a reference a backend owns (`disk:NAME`). */
  image: string;
  cpus?: number;
  memoryBytes?: number;
  pids?: number;
  labels?: Record<string, string>;
  /** Environment of every exec, merged over the image's. */
  env?: Record<string, string>;
  /** Seconds after creation when the sandbox is destroyed. */
  ttlS?: number;
  priority?: Priority;
  /** Pause after this many seconds without an exec. */
  idleTimeoutS?: number;
  seccomp?: SeccompOverride;
  network?: NetworkSpec;
  /** Writable-layer quota, bytes. */
  diskBytes?: number;
  filesystem?: FilesystemOptions;
  /** I/O weight on the cgroup v2 `io.weight` scale (1-10,000). */
  ioWeight?: number;
  /** I/O limits; given, it replaces `[defaults.io_max]` as a whole. */
  ioMax?: IoMaxInput;
}

/**
 * A sandbox to create, resolved and validated once: every default applied (resources
 * from `[defaults]`, the disk quota from the store, filesystem options from request >
 * image > config), the image resolved to its layers and config, the network settled.
 * What the store records at create and what every later step reads.
 */
export interface SandboxSpec extends Resources {
  backend: Backend;
  /** The tenant it belongs to: who may see and change it (docs/SECURITY.md "Tenancy"). */
  tenant: string;
  /** Canonical image reference, `name:tag` (or `disk:NAME`). */
  image: string;
  /** Layer digests, lowest first. */
  imageLayers: string[];
  imageConfig: ImageConfig;
  labels: Record<string, string>;
  env: Record<string, string>;
  /** Seconds after creation when the sandbox is destroyed; null: never. */
  ttlS: number | null;
  priority: Priority;
  /** Pause after this many seconds without an exec; null: never. */
  idleTimeoutS: number | null;
  /** Snapshot this sandbox is restored or forked from, or null. */
  snapshotId: string | null;
  /** Changes to the default seccomp profile for this sandbox, or null. */
  seccomp: SeccompOverride | null;
  /** The settled network (mode always set), or null: mode none. */
  network: NetworkSpec | null;
  filesystem: ResolvedFilesystem;
}

/** A sandbox as the store records it. Times in ms since the epoch; sizes in bytes; cpus in cores. */
export interface SandboxRecord extends Omit<SandboxSpec, 'filesystem'> {
  /** 16 lowercase hex characters. */
  id: string;
  state: SandboxState;
  /** Target of an in-flight transition, written before acting on it. */
  desired: SandboxState | null;
  /** True once create committed (the API acknowledged or was about to). */
  acknowledged: boolean;
  createdAt: number;
  updatedAt: number;
  /** Host pid of the init (the agent, or a VM's QEMU) while running or paused. */
  initPid: number | null;
  /** starttime field of /proc/PID/stat (clock ticks since boot) of init: tells a live init from a reused pid. */
  initStart: number | null;
  /** First host uid/gid of the sandbox's range, and its size. */
  uidBase: number | null;
  uidCount: number | null;
  /** Why the sandbox failed, when it did. */
  error: string | null;
  /** Last exec start (ms), or null: none yet (creation counts). */
  lastActiveAt: number | null;
  /**
   * Filesystem options as resolved at create, or null for a sandbox created before they
   * existed (then resolved at each start from its recorded image config and dsecd's config).
   */
  filesystem: ResolvedFilesystem | null;
}

/** Whether one defence is in force for a sandbox or host, and what it does or why not. */
export interface DefenceStatus {
  enforced: boolean;
  detail: string;
}

/**
 * One recorded event (GET /v1/events streams these as they are). Field names are the
 * wire's: events are stored and streamed without conversion.
 */
export interface SandboxEvent {
  /** ms since the Unix epoch. */
  time: number;
  /** e.g. `sandbox.created`, `sandbox.failed`, `lease.lapsed`. */
  type: string;
  sandbox_id: string | null;
  /** The tenant the event belongs to: its sandbox's, a lease's, else `system`. Only that tenant (and admins) see it. */
  tenant: string;
  state?: SandboxState;
  labels?: Record<string, string>;
  message?: string;
}
