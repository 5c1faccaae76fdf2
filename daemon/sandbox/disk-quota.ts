/**
 * Disk use of writable layers, watched: the `sandbox.disk_quota` event when a layer fills
 * its quota, and the pool guard (daemon/storage/pool.ts) that keeps the writable-layer
 * store from filling while sandboxes' quotas sum to more than its size. The kernel's own
 * signal is EDQUOT, returned to the writing process inside the sandbox and counted
 * nowhere, so the store's usage counters are polled by the reaper's sweep instead.
 */
import type { Logger } from 'pino';
import type { DaemonConfig } from '../config.js';
import type { DiskUsage, WritableLayerStore } from '../storage/writable-layers.js';
import { defaultReserveBytes, diskFullSlack, guardPool, humanBytes, quotaCap, type PoolEntry } from '../storage/pool.js';
import type { SandboxRepo } from '../db/sandboxes.js';

/** How close to its limit a layer counts as full: daemon/storage/pool.ts diskFullSlack (re-exported for the quota check's callers). */
export { diskFullSlack };

/** The pool as host info shows it (bytes; see {@link DiskQuotaWatch.poolInfo}). */
export interface PoolInfo {
  size_bytes: number;
  used_bytes: number;
  available_bytes: number;
  quota_sum_bytes: number;
  quota_cap_bytes: number;
  disk_overcommit: number;
  reserve_bytes: number;
  /** Sandboxes held after writing all of their share of the nearly full store (each had `sandbox.disk_pool_full`). */
  guarded: number;
  /** Sandboxes whose kernel limit the guard set below their quota (their share; the guarded ones included). */
  capped: number;
}

/** What the watch reads and acts through. */
export interface DiskQuotaDeps {
  /** `[storage] reserve_bytes` and `[admission] disk_overcommit`. */
  config: Pick<DaemonConfig, 'storage' | 'admission'>;
  repo: Pick<SandboxRepo, 'find' | 'event' | 'diskQuotas'>;
  storage: WritableLayerStore;
  log: Logger;
}

/** The quota events and the pool guard of the writable-layer store. */
export class DiskQuotaWatch {
  /** Sandboxes the last check found full. */
  private readonly full = new Set<string>();
  /** Limits the pool guard set below sandboxes' quotas, bytes, by id. */
  private readonly guarded = new Map<string, number>();
  /** Live layer use at the previous guard check, bytes, of the entries it looked at. */
  private readonly poolPrevious = new Map<string, number>();
  /** Sandboxes that filled their share of the store (each had its `sandbox.disk_pool_full` event) and whose quota was not restored since. */
  private readonly poolFull = new Set<string>();
  /** Whether the first guard check (which adopts limits a previous dsecd left) has run. */
  private guardAdopted = false;
  /**
   * The sum of headrooms (quota − use, bytes) the last full guard check found while the
   * pool had room, plus the quotas of layers made since; null when unknown or tight. See
   * {@link roomWithout}.
   */
  private lastHeadrooms: number | null = null;
  /**
   * While the store is tight: the room the last full check left out of the split for new
   * layers, bytes, and its level (daemon/storage/pool.ts CREATE_ALLOWANCE_DIVISOR); null
   * when not tight or used up.
   */
  private allowance: { bytes: number; levelBytes: number } | null = null;

  constructor(private readonly d: DiskQuotaDeps) {}

  /** Live disk use of a sandbox's writable layer and its quota, bytes; null where the store cannot tell (host filesystem). Any state. */
  usage(id: string): DiskUsage | null {
    return this.d.storage.usage(id);
  }

  /**
   * Disk use of every writable layer in the store, by sandbox id, read at once (btrfs:
   * one tree search; counters as of the last transaction commit, at most its 30 s
   * interval old). For listings; {@link usage} is live for one sandbox. Empty when the
   * read fails (logged).
   */
  usageAll(): Map<string, DiskUsage> {
    try {
      return this.d.storage.usageAll();
    } catch (e) {
      this.d.log.warn({ err: e }, 'reading writable-layer usage failed');
      return new Map();
    }
  }

  /**
   * One check (the reaper's, every sweep): records a `sandbox.disk_quota` event when a
   * sandbox's writable layer has become full (within {@link diskFullSlack} of its quota),
   * after a run of the pool guard. Edge-triggered: one event per time a layer fills up (a
   * restarted dsecd reports a still-full layer once).
   * @returns ids that became full (or got `sandbox.disk_pool_full`) in this check.
   */
  check(): string[] {
    let usage: Map<string, DiskUsage>;
    try {
      usage = this.d.storage.usageAll();
    } catch (e) {
      this.d.log.warn({ err: e }, 'reading writable-layer usage failed');
      return [];
    }
    const hit: string[] = [];
    try {
      hit.push(...this.guardStore(usage));
    } catch (e) {
      this.d.log.warn({ err: e }, 'the writable-layer pool guard failed');
    }
    for (const [id, u] of usage) {
      // A limit the pool guard set is not the sandbox's quota: its event is disk_pool_full.
      if (u.limitBytes === null || this.guarded.has(id)) continue;
      const slack = diskFullSlack(u.limitBytes);
      if (u.usedBytes >= u.limitBytes - slack) {
        const sb = this.d.repo.find(id);
        if (this.full.has(id) || !sb) continue;
        this.full.add(id);
        this.d.repo.event('sandbox.disk_quota', sb, `writable layer full: ${u.usedBytes} of ${u.limitBytes} bytes (disk_bytes); writes fail with EDQUOT inside`);
        hit.push(id);
      } else if (u.usedBytes < u.limitBytes - 2 * slack) this.full.delete(id);
    }
    for (const id of this.full) if (!usage.has(id)) this.full.delete(id);
    return hit;
  }

  /**
   * The store's reserve, bytes: `[storage] reserve_bytes`, else pool.ts
   * defaultReserveBytes of the store's size.
   */
  reserveBytes(sizeBytes: number): number {
    return this.d.config.storage.reserveBytes ?? defaultReserveBytes(sizeBytes);
  }

  /**
   * Runs the pool guard for a new layer, outside the reaper's sweep: the create path calls
   * it once sandbox `id`'s writable layer exists and before the sandbox runs anything, so a
   * layer made while the store is nearly full starts at its share, not at its quota
   * (daemon/storage/pool.ts). A store that had room at the last full check and still has
   * room for this quota is not read again ({@link roomWithout}); a tight one gives the
   * layer its share from the allowance the last check left ({@link fromAllowance}); only
   * when neither holds is every layer read and the room split again.
   * Failures are logged, never thrown (the sweep retries within a second).
   * @param id the new sandbox.
   * @param quotaBytes its quota (disk_bytes); null/undefined: unknown, split again.
   */
  guard(id: string, quotaBytes?: number | null): void {
    try {
      if (this.roomWithout(quotaBytes)) return;
      if (this.fromAllowance(id, quotaBytes)) return;
      this.guardStore(this.d.storage.usageAll());
    } catch (e) {
      this.d.log.warn({ err: e }, 'the writable-layer pool guard failed');
    }
  }

  /**
   * A new layer's limit from the allowance of the last full check of a tight store: its
   * live use plus the smaller of its headroom and the check's level, taken out of the
   * allowance. Sound between checks for the same reason as {@link roomWithout}: the
   * others' limits hold at most the room the check split, writes and deletes move free
   * space and headrooms together, and new layers hold at most the allowance.
   * @returns false (split again) when there is no allowance or too little of it.
   */
  private fromAllowance(id: string, quotaBytes: number | null | undefined): boolean {
    const a = this.allowance;
    if (!a || !quotaBytes || a.levelBytes <= 0) return false;
    const used = this.d.storage.usage(id)?.usedBytes;
    if (used === undefined) return false;
    const headroom = Math.max(0, quotaBytes - used);
    const share = Math.min(headroom, a.levelBytes);
    if (share > a.bytes) {
      this.allowance = null;
      return false;
    }
    if (share < headroom) {
      if (!this.d.storage.setPoolLimit(id, used + share)) return false;
      this.guarded.set(id, used + share);
    }
    a.bytes -= share;
    return true;
  }

  /**
   * Whether a layer of `quotaBytes` just made leaves the pool as roomy as the guard's
   * last full check found it, with no per-sandbox read: the headrooms that check summed,
   * plus the whole quota of every layer made since (an upper bound of their headroom), fit
   * in what statfs says is free above the reserve, and the guard holds no sandbox below
   * its quota. The bound stays sound between checks: a sandbox's write takes from its
   * headroom what it takes from the free space, a delete gives back to both, so only new
   * layers can make it grow. Keeps a burst of creates from reading every layer's use per
   * create (O(sandboxes) each, O(n²) for a burst). False (do the full check) when unsure.
   */
  private roomWithout(quotaBytes: number | null | undefined): boolean {
    if (this.lastHeadrooms === null || this.guarded.size > 0 || !quotaBytes) {
      this.lastHeadrooms = null;
      return false;
    }
    const space = this.d.storage.space();
    if (!space) return false;
    const reserve = this.reserveBytes(space.sizeBytes);
    const bound = this.lastHeadrooms + quotaBytes;
    if (reserve !== 0 && bound > space.availableBytes - reserve) {
      this.lastHeadrooms = null;
      return false;
    }
    this.lastHeadrooms = bound;
    return true;
  }

  /**
   * One check of the pool guard (daemon/storage/pool.ts), part of {@link check}: while
   * the store's room above its reserve is less than the sandboxes' headrooms together,
   * sets every sandbox's kernel limit to its use plus its share of the free space (the
   * reserve only for sandboxes that did not fill the store), and puts quotas back once
   * there is room. Records `sandbox.disk_pool_full` for a sandbox that wrote all of its
   * share (once, until its quota is back).
   * @param usage the store's usage counters of this check (committed; btrfs: as of the last transaction).
   * @returns ids that got the event in this check.
   */
  private guardStore(usage: Map<string, DiskUsage>): string[] {
    const store = this.d.storage;
    const space = store.enforcesQuota ? store.space() : null;
    if (!space) return [];
    const reserve = this.reserveBytes(space.sizeBytes);
    const quotas = this.d.repo.diskQuotas();
    if (!this.guardAdopted) {
      // Limits below quotas that a previous dsecd's guard left in the kernel.
      for (const [id, q] of quotas) {
        const cur = store.currentLimit(id);
        if (cur !== null && cur < q) this.guarded.set(id, cur);
      }
      this.guardAdopted = true;
    }
    for (const id of this.guarded.keys()) if (!quotas.has(id)) this.guarded.delete(id);
    for (const id of this.poolFull) if (!quotas.has(id)) this.poolFull.delete(id);
    // Headrooms from the committed counters against statfs: the same test as with live
    // use and the page cache subtracted (both sides differ by the same bytes), without a
    // live read per sandbox while the store has room.
    // A layer made since the committed counters were read (a create that runs the guard
    // at once) is missing from them: read live.
    const committed = (id: string) => usage.get(id) ?? store.usage(id);
    let headrooms = 0;
    for (const [id, q] of quotas) {
      const u = committed(id);
      if (u) headrooms += Math.max(0, q - u.usedBytes);
    }
    if ((reserve === 0 || headrooms <= space.availableBytes - reserve) && this.guarded.size === 0) {
      this.poolPrevious.clear();
      this.poolFull.clear();
      this.lastHeadrooms = headrooms;
      this.allowance = null;
      return [];
    }
    this.lastHeadrooms = null;
    this.allowance = null;
    const entries: PoolEntry[] = [];
    // Bytes the sandboxes wrote that statfs does not count yet (in the page cache or not
    // committed): their live use above the committed counters of this check. Read after
    // statfs, so a write in between only makes the free space look smaller.
    let pending = 0;
    for (const [id, q] of quotas) {
      const u = committed(id);
      if (!u) continue;
      const used = store.usage(id)?.usedBytes ?? u.usedBytes;
      pending += Math.max(0, used - u.usedBytes);
      entries.push({ id, quotaBytes: q, usedBytes: used, previousBytes: this.poolPrevious.get(id) ?? null, guardLimitBytes: this.guarded.get(id) ?? null, filled: this.poolFull.has(id) });
    }
    this.poolPrevious.clear();
    for (const e of entries) this.poolPrevious.set(e.id, e.usedBytes);
    const check = guardPool(space.availableBytes - pending, reserve, entries);
    this.allowance = check.tight ? { bytes: check.withheldBytes, levelBytes: check.levelBytes } : null;
    // Lower before raising: the limits in force never add up to more than the free space.
    const raises = (l: { id: string; limitBytes: number }) => Number(l.limitBytes > (this.guarded.get(l.id) ?? Infinity));
    const order = [...check.decisions].sort((a, b) => raises(a) - raises(b));
    for (const dcs of order) {
      if (!store.setPoolLimit(dcs.id, dcs.limitBytes)) continue;
      if (dcs.restore) {
        this.guarded.delete(dcs.id);
        this.poolFull.delete(dcs.id);
        this.d.log.info({ id: dcs.id, limitBytes: dcs.limitBytes }, 'the writable-layer store has room again: quota restored');
      } else this.guarded.set(dcs.id, dcs.limitBytes);
    }
    if (!check.tight) this.poolFull.clear();
    const hit: string[] = [];
    const byId = new Map(entries.map((e) => [e.id, e]));
    for (const id of check.filled) {
      const sb = this.d.repo.find(id);
      const e = byId.get(id);
      if (!sb || !e) continue;
      this.poolFull.add(id);
      this.d.repo.event('sandbox.disk_pool_full', sb,
        `the writable-layer store ${store.location} is nearly full: ${space.availableBytes} bytes free of ${space.sizeBytes} (${humanBytes(space.availableBytes)} of ${humanBytes(space.sizeBytes)}), `
        + `${reserve} bytes (${humanBytes(reserve)}) of it the reserve, while the sandboxes' quotas sum to ${humanBytes([...quotas.values()].reduce((a, b) => a + b, 0))} (admission.disk_overcommit ${this.d.config.admission.diskOvercommit}). `
        + `Each of the ${check.sharing} sandboxes on the store may write only its share of the free space, and this sandbox wrote all of its share: its writes now fail with EDQUOT at ${e.usedBytes} bytes, `
        + `below its disk_bytes ${e.quotaBytes} (${humanBytes(e.quotaBytes)}). It gets more as the others' shares free up, none of the reserve (kept for the sandboxes that did not fill the store), and its quota back once the store has room for every sandbox's quota`);
      hit.push(id);
    }
    return hit;
  }

  /**
   * The pool as host info shows it: the store's space, the sum of the quotas it holds
   * (warm-pool shells included), what admission allows them to sum to, the reserve, how
   * many sandboxes filled their share of the store (`guarded`: held there, their event
   * sandbox.disk_pool_full) and how many have a kernel limit below their quota, their
   * share (`capped`, the guarded ones included). Null without a store that enforces quotas.
   */
  poolInfo(): PoolInfo | null {
    const space = this.d.storage.enforcesQuota ? this.d.storage.space() : null;
    if (!space) return null;
    let sum = 0;
    for (const q of this.d.repo.diskQuotas().values()) sum += q;
    const overcommit = this.d.config.admission.diskOvercommit;
    return {
      size_bytes: space.sizeBytes, used_bytes: space.usedBytes, available_bytes: space.availableBytes, quota_sum_bytes: sum,
      quota_cap_bytes: quotaCap({ sizeBytes: space.sizeBytes, overcommit }), disk_overcommit: overcommit,
      reserve_bytes: this.reserveBytes(space.sizeBytes), guarded: this.poolFull.size, capped: this.guarded.size,
    };
  }
}
