/**
 * What a sandbox may use of the host: CPU (cores, fractional), memory (bytes), processes,
 * its writable-layer quota (bytes) and its I/O settings on the writable-layer store's
 * device. The bounds a request must respect ({@link LIMITS}) are here too, so the wire
 * schema, the config and the lifecycle read them from one place.
 */

/** Limits that make a request absurd rather than merely large; see `cpus`, `memory_bytes`, `pids`. */
export const LIMITS = {
  /** Smallest memory limit accepted: 4 MiB; below that the agent and a shell cannot start. */
  minMemoryBytes: 4 * 1024 * 1024,
  /** Largest memory limit accepted: 1 TiB, far above any host dsec runs on. */
  maxMemoryBytes: 1024 ** 4,
  /** Smallest CPU share: 0.01 cores (a 1 ms quota per 100 ms period). */
  minCpus: 0.01,
  /** Largest CPU limit: 512 cores; more is a typo, not a machine. */
  maxCpus: 512,
  /** Smallest pids limit: 8 (agent, a shell, a command and some headroom). */
  minPids: 8,
  /** Largest pids limit: 4,194,304, the kernel's PID_MAX_LIMIT on 64-bit. */
  maxPids: 4_194_304,
  /** Longest exec timeout: 24 h. */
  maxTimeoutMs: 24 * 3600 * 1000,
  /** Largest trajectory step number: 2^31-1, so steps fit a signed 32-bit int in every client language. */
  maxStep: 2 ** 31 - 1,
  /** Most sandboxes one fork call creates: 256 (a rollout group; larger groups are several calls). */
  maxForkCount: 256,
  /**
   * Most sandboxes one batched create asks for (POST /v1/sandboxes:batch): 1,000, so one
   * answer (about 1 KiB per sandbox) stays near 1 MiB; a larger job is several batches.
   */
  maxBatchSandboxes: 1000,
  /** Largest stdin accepted inline by exec: 16 MiB (base64 in JSON). */
  maxStdinBytes: 16 * 1024 * 1024,
  /** Longest sandbox TTL: 30 days. */
  maxTtlS: 30 * 24 * 3600,
  /** Most labels on one sandbox: 64 (selectors stay cheap; tables stay readable). */
  maxLabels: 64,
  /** Total size of an env map (keys, values, `=` and NUL): 128 KiB, so execve's argument space (ARG_MAX, 2 MiB with an 8 MiB stack) keeps room for argv. */
  maxEnvBytes: 128 * 1024,
} as const;

/** Smallest per-sandbox disk quota: 16 MiB (an image's first writes and a shell history fit). */
export const MIN_DISK_BYTES = 16 * 1024 * 1024;

/**
 * Smallest bytes-per-second limit of `io_max`: 4 KiB/s, one page a second. Lower rates
 * would starve the sandbox's own page-cache misses (its binaries load through the same
 * device), which is never what a limit is for.
 */
export const IO_MAX_MIN_BPS = 4096;

/**
 * The I/O settings of one sandbox, applied to its cgroup for one device (the
 * writable-layer store's device). Units: weight on the v2 `io.weight` scale; bytes per
 * second; IOs per second. null leaves a setting at the kernel's default (weight 100,
 * no limit).
 */
export interface IoLimits {
  /** Proportional weight, 1-10,000 (cgroup v2 `io.weight` scale; the kernel default is 100). */
  weight: number | null;
  readBps: number | null;
  writeBps: number | null;
  readIops: number | null;
  writeIops: number | null;
}

/** No setting: the kernel's defaults. */
export const NO_IO_LIMITS: IoLimits = Object.freeze({ weight: null, readBps: null, writeBps: null, readIops: null, writeIops: null });

/** Bounds of {@link IoLimits.weight}: cgroup v2 `io.weight`'s range. */
export const IO_WEIGHT_MIN = 1;
export const IO_WEIGHT_MAX = 10_000;
/** The kernel's default weight on the v2 scale (`io.weight`, `io.bfq.weight`). */
export const IO_WEIGHT_DEFAULT = 100;

/** Whether `l` limits anything (a rate or a count). */
export function hasIoMax(l: IoLimits): boolean {
  return l.readBps !== null || l.writeBps !== null || l.readIops !== null || l.writeIops !== null;
}

/**
 * A request's I/O limits before defaults: each rate optional (absent: unlimited). All
 * absent means "no io_max given" only when the object itself is absent.
 */
export interface IoMaxInput {
  readBps?: number;
  writeBps?: number;
  readIops?: number;
  writeIops?: number;
}

/** Scheduling class: `latency` (default) or `batch` (SCHED_IDLE and minimal CPU shares). */
export type Priority = 'latency' | 'batch';

/**
 * The resources of a sandbox with every default applied: what its cgroup, its
 * writable-layer quota and admission use.
 */
export interface Resources {
  /** CPU limit, cores (fractional). */
  cpus: number;
  /** Memory limit, bytes. */
  memoryBytes: number;
  /** Process limit. */
  pids: number;
  /** Quota on the writable layer, bytes, or null: none (the store enforces no quota). */
  diskBytes: number | null;
  /** I/O weight and limits on the writable-layer store's device, or null: none (a tier without I/O settings). */
  io: IoLimits | null;
}

/** `[defaults]` of dsecd's config: the resources of a sandbox whose request names none. */
export interface ResourceDefaults {
  cpus: number;
  memoryBytes: number;
  pids: number;
  /** Writable-layer quota, bytes (at most the store's size when applied). */
  diskBytes: number;
  io: IoLimits;
}
