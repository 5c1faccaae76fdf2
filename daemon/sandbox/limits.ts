/**
 * The kernel's limit counters as events: `sandbox.oom` when the OOM killer killed
 * processes of a sandbox, `sandbox.pids_limit` when forks were refused at its pids limit
 * (a fork bomb). Read by a periodic sweep (the reaper's), from a light query.
 */
import type { SandboxRepo } from '../db/sandboxes.js';
import type { SandboxEvent } from '../model/sandbox.js';
import type { Backends } from './backends.js';

/** Sandboxes read between two yields to the event loop: 100 (the counters are read synchronously from cgroupfs). */
const YIELD_EVERY = 100;

/** Turns rises of the limit counters of running sandboxes into events. */
export class LimitWatch {
  /** When this watch (this dsecd) started, ms since the epoch. */
  private readonly startedAt = Date.now();
  /** Counters last seen per running sandbox. */
  private readonly seen = new Map<string, { oomKills: number; pidsLimitHits: number }>();

  constructor(private readonly repo: Pick<SandboxRepo, 'runningIds' | 'find' | 'event'>, private readonly backends: Backends) {}

  /**
   * One sweep: an event per sandbox whose OOM kills or refused forks rose since the
   * last sweep, with the increase and the total. A sandbox adopted at start records a
   * baseline first (a previous dsecd reported its earlier counts); one created by this
   * dsecd started from zero.
   * @returns the events recorded.
   */
  async sweep(): Promise<SandboxEvent[]> {
    const out: SandboxEvent[] = [];
    const live = new Set<string>();
    let n = 0;
    for (const r of this.repo.runningIds()) {
      if (++n % YIELD_EVERY === 0) await new Promise((res) => setImmediate(res));
      const drv = this.backends.find(r.backend);
      const c = await drv?.limitCounters({ id: r.id, state: 'running' }).catch(() => null);
      if (!c) continue;
      live.add(r.id);
      const prev = this.seen.get(r.id) ?? (r.createdAt >= this.startedAt ? { oomKills: 0, pidsLimitHits: 0 } : undefined);
      this.seen.set(r.id, c);
      if (!prev || (c.oomKills <= prev.oomKills && c.pidsLimitHits <= prev.pidsLimitHits)) continue;
      const sb = this.repo.find(r.id);
      if (!sb) continue;
      if (c.oomKills > prev.oomKills) {
        const k = c.oomKills - prev.oomKills;
        out.push(this.repo.event('sandbox.oom', sb, `the OOM killer killed ${k} process${k > 1 ? 'es' : ''} at the memory limit of ${r.memoryBytes} bytes; ${c.oomKills} in all`));
      }
      if (c.pidsLimitHits > prev.pidsLimitHits) {
        const k = c.pidsLimitHits - prev.pidsLimitHits;
        out.push(this.repo.event('sandbox.pids_limit', sb, `${k} fork${k > 1 ? 's' : ''} refused at the pids limit of ${r.pids}; ${c.pidsLimitHits} in all`));
      }
    }
    for (const id of this.seen.keys()) if (!live.has(id)) this.seen.delete(id);
    return out;
  }
}
