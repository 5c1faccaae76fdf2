/**
 * Whether a sandbox is idle, and since when (issue 23): the policy the host's reclaim
 * (host/memory/host-reclaim.ts) acts on. Pure but for its memory of earlier samples.
 *
 * A running sandbox is busy at a sample when an exec of it runs, or when its cgroup's CPU
 * time grew by more than `cpuPermil` of one core over the time since the previous sample
 * (cpuacct.usage on v1, cpu.stat usage_usec on v2: every process of the sandbox, the
 * agent included). It is idle since the latest of: the last busy sample, the last exec
 * start or end (daemon/sandbox/activity.ts), and the first time this tracker saw it (a
 * restart of dsecd starts the clock again: nothing is known of the time before). A paused
 * (frozen) sandbox is idle since the tracker first saw it paused. Other states are not
 * candidates.
 */

/** One sandbox at a sample. */
export interface IdleSample {
  id: string;
  state: 'running' | 'paused';
  /** Its cgroup's cumulative CPU time, ns; null when unreadable (then CPU does not make it busy). */
  cpuNs: number | null;
  /** Execs of it running now. */
  execsRunning: number;
  /** Last exec start or end, ms since the epoch; null: none since dsecd started. */
  lastExecMs: number | null;
}

/** Per sandbox: what the previous sample saw. */
interface Seen {
  state: IdleSample['state'];
  atMs: number;
  cpuNs: number | null;
  /** Latest moment it was known busy (or first seen), ms. */
  busyMs: number;
}

/** See the module comment. */
export class IdleTracker {
  private readonly seen = new Map<string, Seen>();

  /**
   * @param cpuPermil CPU threshold, per mille of one core (HostReclaimConfig.idleCpuPermil).
   * @param now the clock, ms since the epoch.
   */
  constructor(private readonly cpuPermil: number, private readonly now: () => number = Date.now) {}

  /**
   * Takes one sample of every candidate and returns since when each is idle (ms since
   * the epoch), or null when it is busy now. Sandboxes not listed are forgotten.
   */
  observe(samples: readonly IdleSample[]): Map<string, number | null> {
    const t = this.now();
    const out = new Map<string, number | null>();
    const ids = new Set(samples.map((s) => s.id));
    for (const id of [...this.seen.keys()]) if (!ids.has(id)) this.seen.delete(id);
    for (const s of samples) {
      const prev = this.seen.get(s.id);
      let busyMs = prev && prev.state === s.state ? prev.busyMs : t;
      let busy = false;
      if (s.state === 'running') {
        if (s.execsRunning > 0) busy = true;
        else if (prev && prev.state === 'running' && prev.cpuNs !== null && s.cpuNs !== null && t > prev.atMs) {
          // ns of CPU per ms of wall time = per mille of one core × 1000.
          const permil = (s.cpuNs - prev.cpuNs) / 1000 / (t - prev.atMs);
          if (permil > this.cpuPermil) busy = true;
        }
        if (busy) busyMs = t;
        if (s.lastExecMs !== null && s.lastExecMs > busyMs) busyMs = Math.min(s.lastExecMs, t);
      }
      this.seen.set(s.id, { state: s.state, atMs: t, cpuNs: s.cpuNs, busyMs });
      out.set(s.id, busy ? null : busyMs);
    }
    return out;
  }
}
