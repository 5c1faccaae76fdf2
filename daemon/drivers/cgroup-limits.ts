/**
 * The limits every tier puts on a sandbox's cgroup (the container's through the OCI spec
 * or, with crun, written by dsecd; a VM's VMM directly): one period, one way from cores
 * to a quota, one share value for the batch class, and the container's device rules.
 */
import type { CgroupLimits } from '../host/cgroups/index.js';

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

/**
 * A container's v1 devices-cgroup rules in `devices.allow` syntax, written after
 * `devices.deny` `a`: exactly what runc 1.1 leaves in `devices.list` for dsec's spec
 * (`devices: [{allow: false, access: "rwm"}]` plus runc's built-in allowed devices), read
 * from a runc container on this host and kept as the reference for crun, whose cgroups
 * dsecd writes itself. mknod of any node (`m`; a user namespace cannot mknod anyway),
 * and read/write/mknod of /dev/null (1:3), zero (1:5), full (1:7), random (1:8),
 * urandom (1:9), tty (5:0), ptmx (5:2), net/tun (10:200) and every /dev/pts/N (136:*).
 */
export const CONTAINER_DEVICE_RULES: readonly string[] = Object.freeze([
  'b *:* m', 'c *:* m',
  'c 1:3 rwm', 'c 1:5 rwm', 'c 1:7 rwm', 'c 1:8 rwm', 'c 1:9 rwm',
  'c 5:0 rwm', 'c 5:2 rwm', 'c 10:200 rwm', 'c 136:* rwm',
]);

/**
 * The cgroup limits of a container sandbox, as buildSpec gives them to runc in
 * `linux.resources` and dsecd writes them for crun: `cpus` cores as a quota per
 * {@link CPU_PERIOD_US}, batch shares, memory bytes and the pids limit (null: none).
 */
export function containerCgroupLimits(s: { cpus: number; memoryBytes: number | null; pids: number | null; priority?: 'latency' | 'batch' }): CgroupLimits & { cpuQuotaUs: number } {
  return {
    cpuQuotaUs: cpuQuotaUs(s.cpus), cpuPeriodUs: CPU_PERIOD_US, cpuShares: s.priority === 'batch' ? BATCH_CPU_SHARES : null,
    memoryBytes: s.memoryBytes, pids: s.pids,
  };
}
