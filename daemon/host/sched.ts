/**
 * CPU priority classes of sandboxes: what the host kernel offers, detected once and
 * reported by `dsec host info` (DESIGN.md §3: capabilities the kernel lacks are
 * detected and reported, never faked).
 *
 * A sandbox is `latency` (the default) or `batch`. Batch sandboxes run their whole
 * process tree as SCHED_IDLE (the agent's `--sched-idle`, see native/agent/agent.c) with
 * cpu.shares 2 (v1) / cpu.idle 1 (v2) on their cgroup (daemon/drivers/container/spec.ts),
 * so they soak up spare CPU without delaying latency sandboxes' wake-ups. Core
 * scheduling (the agent's `--core-sched`: one cookie per sandbox) additionally keeps
 * other sandboxes' tasks off the SMT sibling of a core a sandbox is running on; it
 * needs CONFIG_SCHED_CORE and SMT, which is why it is probed here.
 *
 * Leaving SCHED_IDLE: Linux lets an unprivileged task switch from SCHED_IDLE back to
 * SCHED_OTHER only when its RLIMIT_NICE would permit its current nice value (rlimit ≥
 * 20 − nice; since 2.6.39), and otherwise requires CAP_SYS_NICE in the *initial* user
 * namespace. Sandbox processes never have the latter (they run in a user namespace, and
 * CAP_SYS_NICE is not in their set anyway), so batch sandboxes are given RLIMIT_NICE 0
 * (soft and hard) both by the OCI spec and by the agent itself; raising a hard limit
 * needs CAP_SYS_RESOURCE in the initial user namespace, which they lack too.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { constants as osConstants } from 'node:os';
import { schedCoreProbe, schedIdleProbe } from './native.js';

/** A sandbox's CPU priority class (`priority` of the create request). */
export type PriorityClass = 'latency' | 'batch';

/** The default class: a sandbox created without `priority`. */
export const DEFAULT_PRIORITY: PriorityClass = 'latency';

/** Linux scheduling policy numbers (<linux/sched.h>), as /proc/PID/stat field 41 shows them. */
export const SCHED_POLICY = { OTHER: 0, FIFO: 1, RR: 2, BATCH: 3, IDLE: 5, DEADLINE: 6 } as const;

/** Result of a host capability probe, as `dsec host info` shows it. */
export interface SchedCapability {
  /** True when the mechanism works on this host. */
  available: boolean;
  /** Why (always set): what was probed and what it returned, errno name and number on failure. */
  reason: string;
}

/** `EINVAL (errno 22)` for 22; the bare number for an errno Node does not name. */
export function describeErrno(errno: number): string {
  const name = Object.entries(osConstants.errno).find(([, v]) => v === errno)?.[0];
  return name ? `${name} (errno ${errno})` : `errno ${errno}`;
}

/**
 * Detects core scheduling (PR_SCHED_CORE, Linux 5.14) by calling
 * `prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET, 0, PIDTYPE_PID, &cookie)` on the calling
 * thread through the native addon (`schedCoreProbe`). `available` is true exactly when
 * the probe returns 0; otherwise `reason` names the errno and what it means: EINVAL —
 * the kernel was built without CONFIG_SCHED_CORE (this development host); ENODEV — it
 * has it but the CPUs have no SMT siblings, so there is nothing to isolate. When the
 * addon is not built, reports unavailable with that as the reason. Changes nothing;
 * never throws. `probe` is injectable for tests.
 */
export function detectCoreScheduling(probe: () => number = schedCoreProbe): SchedCapability {
  let rc: number;
  try {
    rc = probe();
  } catch (e) {
    return { available: false, reason: `cannot probe core scheduling: ${(e as Error).message}` };
  }
  if (rc === 0) return { available: true, reason: 'prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET) succeeded: the kernel has core scheduling and SMT siblings' };
  const what = `prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET) failed with ${describeErrno(rc)}`;
  if (rc === osConstants.errno.EINVAL) return { available: false, reason: `${what}: the kernel was built without CONFIG_SCHED_CORE` };
  if (rc === osConstants.errno.ENODEV) return { available: false, reason: `${what}: the kernel has core scheduling but the CPUs have no SMT siblings` };
  return { available: false, reason: what };
}

/**
 * Detects SCHED_IDLE (Linux ≥ 2.6.23: always present, but a seccomp or LSM policy
 * around dsecd could forbid switching to it). Probes through the native addon
 * (`schedIdleProbe`: a short-lived thread of this process switches itself to
 * SCHED_IDLE; the daemon's own threads are untouched); when the addon is not built,
 * falls back to running `chrt --idle 0 true`. Never throws. `probe` is injectable for
 * tests.
 */
export function detectSchedIdle(probe: () => number = schedIdleProbe): SchedCapability {
  let rc: number;
  try {
    rc = probe();
  } catch {
    const r = spawnSync('chrt', ['--idle', '0', 'true'], { stdio: ['ignore', 'ignore', 'pipe'], timeout: 10_000 });
    if (r.error) return { available: false, reason: `native addon not built and \`chrt --idle 0 true\` could not run: ${r.error.message}` };
    if (r.status === 0) return { available: true, reason: '`chrt --idle 0 true` succeeded (native addon not built)' };
    return { available: false, reason: `\`chrt --idle 0 true\` failed (status ${r.status}): ${String(r.stderr).trim()}` };
  }
  if (rc === 0) return { available: true, reason: 'sched_setscheduler(SCHED_IDLE) succeeded on a probe thread' };
  return { available: false, reason: `sched_setscheduler(SCHED_IDLE) failed with ${describeErrno(rc)}` };
}

/**
 * Scheduling policy of a process (or thread: pass a tid) from /proc/PID/stat field 41
 * (`policy`), e.g. {@link SCHED_POLICY}.IDLE; null when the process does not exist.
 */
export function readSchedPolicy(pid: number): number | null {
  let s: string;
  try {
    s = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return null;
  }
  return parseStatPolicy(s);
}

/**
 * Field 41 (`policy`) of a /proc/PID/stat line; null if the line is malformed.
 * `comm` (field 2) may hold spaces and parentheses, so fields are counted after the
 * last `)`: field 3 is the first one there, so field 41 is index 38.
 */
export function parseStatPolicy(stat: string): number | null {
  const rest = stat.slice(stat.lastIndexOf(')') + 2).trim().split(/\s+/);
  const v = Number(rest[38]);
  return rest.length > 38 && Number.isInteger(v) ? v : null;
}
