/**
 * Proactive reclaim of idle sandboxes through the memory cgroup interface: dsec's
 * fallback where it does not own DAMON (host/memory/damon.ts stands aside, or the
 * kernel has none). Every sandbox idle for longer than `idleAfterMs` is reclaimed once
 * per idle period, and again every `repeatMs` while it stays idle, through
 * {@link CgroupManager.reclaim} (host/cgroups: the only module that writes /sys/fs/cgroup):
 *   - cgroup v2: `memory.reclaim` with a share (`fraction`) of the cgroup's current usage;
 *     the kernel takes the coldest pages of its LRU lists first and stops short when
 *     nothing more is reclaimable (EAGAIN, not an error);
 *   - cgroup v1: what the kernel offers, `memory.force_empty` (reclaims as much as it can;
 *     the amount cannot be chosen), the same write dsec's pause makes after freezing.
 * Without swap only page cache (and anything else file-backed) goes; anonymous memory
 * stays where the host has no swap.
 *
 * Idle comes from the caller (the lifecycle's view: no exec running and none for
 * the idle period, or paused); this module only decides when to reclaim and does it.
 */
import type { CgroupManager } from '../cgroups/index.js';

/** Options of {@link IdleReclaimer}. */
export interface IdleReclaimOptions {
  /** A sandbox idle at least this long is reclaimed, ms. */
  idleAfterMs: number;
  /** While it stays idle, it is reclaimed again after this long, ms (0: once per idle period). */
  repeatMs: number;
  /** v2: the share of the cgroup's current usage asked of memory.reclaim per round, (0, 1]. */
  fraction: number;
}

/** A sandbox as the sweep sees it: its id and since when it is idle (ms since the epoch; null: active now). */
export interface IdleCandidate {
  id: string;
  idleSinceMs: number | null;
}

/** What one reclaim did, bytes of the cgroup's usage before and after. */
export interface IdleReclaimResult {
  id: string;
  beforeBytes: number;
  afterBytes: number;
}

/** See the module comment. One per dsecd; `sweep` calls must not overlap. */
export class IdleReclaimer {
  /** Per sandbox: the idle period (its start) last reclaimed, and when. */
  private readonly last = new Map<string, { idleSinceMs: number; atMs: number }>();

  constructor(
    private readonly cg: Pick<CgroupManager, 'version' | 'reclaim' | 'stats'>,
    private readonly o: IdleReclaimOptions,
    private readonly now: () => number = Date.now,
  ) {
    if (!(o.fraction > 0 && o.fraction <= 1)) throw new RangeError(`fraction must be in (0, 1], got ${o.fraction}`);
  }

  /** Whether `c` is due now (see the module comment). Pure but for the record of earlier rounds. */
  due(c: IdleCandidate): boolean {
    if (c.idleSinceMs === null) return false;
    const t = this.now();
    if (t - c.idleSinceMs < this.o.idleAfterMs) return false;
    const l = this.last.get(c.id);
    if (!l || l.idleSinceMs !== c.idleSinceMs) return true; // a new idle period
    return this.o.repeatMs > 0 && t - l.atMs >= this.o.repeatMs;
  }

  /**
   * Reclaims every due candidate, one after the other; a sandbox whose cgroup is gone
   * (NotFound) is skipped, other errors propagate after the record of the ones done.
   * Candidates not listed are forgotten.
   * @returns what each reclaim did.
   */
  async sweep(cands: readonly IdleCandidate[]): Promise<IdleReclaimResult[]> {
    const ids = new Set(cands.map((c) => c.id));
    for (const id of [...this.last.keys()]) if (!ids.has(id)) this.last.delete(id);
    const out: IdleReclaimResult[] = [];
    for (const c of cands) {
      if (!this.due(c)) continue;
      let r: { beforeBytes: number; afterBytes: number };
      try {
        const bytes = this.cg.version === 2 ? Math.floor((await this.cg.stats(c.id)).memoryBytes * this.o.fraction) : undefined;
        r = await this.cg.reclaim(c.id, bytes);
      } catch (e) {
        if ((e as { kind?: string }).kind === 'NotFound') continue;
        throw e;
      }
      this.last.set(c.id, { idleSinceMs: c.idleSinceMs!, atMs: this.now() });
      out.push({ id: c.id, ...r });
    }
    return out;
  }
}
