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
import { defaultReserveBytes, guardPool, humanBytes, quotaCap, type PoolEntry } from '../storage/pool.js';
import type { SandboxRepo } from '../db/sandboxes.js';

/**
 * How close to its quota a writable layer counts as full for the `sandbox.disk_quota`
 * event: 4 MiB, or 1/16 of a smaller quota. A write that hits the limit fails with
 * EDQUOT once usage plus the write's reservation would pass it, so a layer that was
 * filled stops below the limit by up to one write batch (btrfs reserves a few MiB per
 * batch of pages); usage must fall below twice the slack before another event.
 */
export function diskFullSlack(limitBytes: number): number {
  return Math.min(4 * 1024 * 1024, Math.floor(limitBytes / 16));
}

/** The pool as host info shows it (bytes; see {@link DiskQuotaWatch.poolInfo}). */
export interface PoolInfo {
  size_bytes: number;
  used_bytes: number;
  available_bytes: number;
  quota_sum_bytes: number;
  quota_cap_bytes: number;
  disk_overcommit: number;
  reserve_bytes: number;
  guarded: number;
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
  /** Sandboxes stopped by the full store that have had their `sandbox.disk_pool_full` event. */
  private readonly poolFull = new Set<string>();
  /** Whether the first guard check (which adopts limits a previous dsecd left) has run. */
  private guardAdopted = false;

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
   * One check of the pool guard (daemon/storage/pool.ts): while the store's free space
   * above its reserve is less than some sandbox's headroom, limits each sandbox that
   * wrote since the last check so the kernel stops it before the reserve, and puts quotas
   * back once there is room. Records `sandbox.disk_pool_full` (edge-triggered) for a
   * sandbox that reached such a limit: it was filling the store.
   * @param usage the store's usage counters of this check (committed; btrfs: as of the last transaction).
   * @returns ids that got the event in this check.
   */
  private guardStore(usage: Map<string, DiskUsage>): string[] {
    const store = this.d.storage;
    const space = store.enforcesQuota ? store.space() : null;
    if (!space) return [];
    const reserve = this.reserveBytes(space.sizeBytes);
    if (reserve === 0 && this.guarded.size === 0) return [];
    const room = space.availableBytes - reserve;
    const quotas = this.d.repo.diskQuotas();
    if (!this.guardAdopted) {
      // Limits below quotas that a previous dsecd's guard left in the kernel.
      for (const [id, q] of quotas) {
        const cur = store.currentLimit(id);
        if (cur !== null && cur < q) this.guarded.set(id, cur);
      }
      this.guardAdopted = true;
    }
    const entries: PoolEntry[] = [];
    const live = new Map<string, number>();
    // Bytes the examined sandboxes wrote that statfs does not count yet (in the page cache
    // or not committed): their live use above the committed counters of this check.
    let pending = 0;
    for (const [id, q] of quotas) {
      const u = usage.get(id);
      if (!u) continue;
      // Entries with room for their whole headroom need no live reading unless guarded.
      if (room >= q - u.usedBytes && !this.guarded.has(id)) {
        this.poolPrevious.delete(id);
        continue;
      }
      const used = store.usage(id)?.usedBytes ?? u.usedBytes;
      live.set(id, used);
      pending += Math.max(0, used - u.usedBytes);
      entries.push({ id, quotaBytes: q, usedBytes: used, previousBytes: this.poolPrevious.get(id) ?? null, guardLimitBytes: this.guarded.get(id) ?? null });
      this.poolPrevious.set(id, used);
    }
    for (const id of this.guarded.keys()) if (!quotas.has(id)) this.guarded.delete(id);
    for (const id of this.poolPrevious.keys()) if (!quotas.has(id)) this.poolPrevious.delete(id);
    for (const dcs of guardPool(space.availableBytes - pending, reserve, entries)) {
      if (!store.setPoolLimit(dcs.id, dcs.limitBytes)) continue;
      if (dcs.restore) {
        this.guarded.delete(dcs.id);
        this.poolFull.delete(dcs.id);
        this.d.log.info({ id: dcs.id, limitBytes: dcs.limitBytes }, 'the writable-layer store has room again: quota restored');
      } else this.guarded.set(dcs.id, dcs.limitBytes);
    }
    const hit: string[] = [];
    for (const [id, limit] of this.guarded) {
      const used = live.get(id);
      if (used === undefined || this.poolFull.has(id) || used < limit - diskFullSlack(limit)) continue;
      const sb = this.d.repo.find(id);
      if (!sb) continue;
      this.poolFull.add(id);
      this.d.repo.event('sandbox.disk_pool_full', sb,
        `the writable-layer store ${store.location} is full: ${space.availableBytes} bytes free of ${space.sizeBytes} (${humanBytes(space.availableBytes)} of ${humanBytes(space.sizeBytes)}), `
        + `with ${reserve} bytes (${humanBytes(reserve)}) kept for other sandboxes; this sandbox was writing, so its writes now fail with EDQUOT at ${used} bytes, `
        + `below its disk_bytes ${quotas.get(id)} (${humanBytes(quotas.get(id)!)}), until the store has room again (sum of quotas: ${humanBytes([...quotas.values()].reduce((a, b) => a + b, 0))}, admission.disk_overcommit ${this.d.config.admission.diskOvercommit})`);
      hit.push(id);
    }
    return hit;
  }

  /**
   * The pool as host info shows it: the store's space, the sum of the quotas it holds
   * (warm-pool shells included), what admission allows them to sum to, the reserve, and
   * how many sandboxes the guard holds below their quotas. Null without a store that
   * enforces quotas.
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
      reserve_bytes: this.reserveBytes(space.sizeBytes), guarded: this.guarded.size,
    };
  }
}
