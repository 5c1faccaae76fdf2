/**
 * The CPU limits every tier puts on a sandbox's cgroup (the container's through the OCI
 * spec, a VM's VMM directly): one period, one way from cores to a quota, one share value
 * for the batch class.
 */

/** CFS period for CPU limits: 100 ms, the kernel default; quota = cpus × period. */
export const CPU_PERIOD_US = 100_000;

/**
 * cpu.shares of a batch sandbox: 2, the smallest value cgroup v1 accepts (the default is
 * 1024), so under contention a batch sandbox's cgroup gets ~1/512 of a latency sibling's
 * CPU time. On cgroup v2 runc maps shares to cpu.weight (2 → 1, the minimum).
 */
export const BATCH_CPU_SHARES = 2;

/** The CFS quota of `cpus` cores per {@link CPU_PERIOD_US}, µs: at least 1 ms, the kernel's minimum. */
export function cpuQuotaUs(cpus: number): number {
  return Math.max(1000, Math.round(cpus * CPU_PERIOD_US));
}
