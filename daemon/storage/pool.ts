/**
 * The writable-layer store as a shared pool: what admission allows, and how the free
 * space of an overcommitted store is shared so that no sandbox can take it from the
 * others. Pure: daemon/sandbox/disk-quota.ts feeds numbers in and applies the limits that
 * come out (DiskQuotaWatch.check every second from the reaper, and DiskQuotaWatch.guard
 * in the create path once a container's writable layer exists, before its init starts).
 *
 * Why a guard: quotas may add up to more than the store (`[admission] disk_overcommit`
 * above 1), so the store can fill before any sandbox reaches its quota. Then every
 * sandbox's next write fails with ENOSPC, not only the one that filled it (measured on a
 * loop-mounted btrfs: a neighbour's 6-byte write failed, while reads, deletes, mkdir and
 * new sandboxes still worked; docs/OPERATIONS.md "When the store fills").
 *
 * What it guarantees, between two checks and whatever the write speed (buffered writes
 * land at memory speed, fallocate takes any size at once): while the room above the
 * reserve (`[storage] reserve_bytes`) is smaller than the sandboxes' headrooms (quota
 * minus use) together, every sandbox's kernel limit (the qgroup or project limit that
 * holds its quota) is lowered to its use plus its **share** of the free space, set before
 * it writes, so the kernel itself stops it with EDQUOT:
 *
 * - the room above the reserve is split among all sandboxes of the store, max-min fair
 *   ({@link fairShares}: each gets its whole headroom or an equal level, whichever is
 *   smaller), so the limits together never reach into the reserve, and no sandbox,
 *   however it writes, takes another's share;
 * - a sandbox that wrote all of its share ("filled the store": it wrote since the last
 *   check and reached its limit) is marked until its quota is restored; once one is, or
 *   once the free space is inside the reserve, the reserve (what is free of it) is split
 *   the same way among the sandboxes that did not fill, on top of their share of the room.
 *   A sandbox that filled gets none of it: the reserve is for the others.
 *
 * Shares are worked out again at each check from what is free then (a sandbox that
 * deleted files, or a neighbour that left, gives room back), so limits move both ways;
 * a level share is rounded down to whole MiB so idle sandboxes' limits do not move with
 * every byte another writes. Limits go back to the quotas once the room above the reserve
 * holds every sandbox's whole headroom.
 *
 * Free space: statfs counts a write's blocks only once writeback allocates them, so the
 * caller subtracts what the sandboxes hold in the page cache (their live use above the
 * committed counters) before calling. Use is the kernel's own count for the limit
 * (referenced plus reserved bytes), so a limit of use plus share lets exactly the share
 * through; data allocated but not yet committed is missing from both and only makes the
 * limit tighter once committed.
 *
 * Layers made between two checks: while the store is tight and shared by 16 or more, a
 * check leaves 1/16 of the room out of the split ({@link CREATE_ALLOWANCE_DIVISOR}) and the create path gives each
 * new layer its share at the check's level from that allowance, so the limits together
 * stay within the room without a new split per create.
 *
 * What it cannot do: a sandbox created since the last check has its quota until the
 * guard has run for it (the create path runs it once the layer exists, before the sandbox
 * runs anything of the caller's); and the reserve must also hold btrfs's metadata growth,
 * which no qgroup limit counts.
 */

/** Admission's view of the pool: the sum of quotas it may admit. */
export interface PoolAdmission {
  /** Size of the store, bytes. */
  sizeBytes: number;
  /** `[admission] disk_overcommit`. */
  overcommit: number;
}

/**
 * The most that quotas of admitted sandboxes may add up to: store size times the
 * overcommit ratio, whole bytes.
 */
export function quotaCap(a: PoolAdmission): number {
  return Math.floor(a.sizeBytes * a.overcommit);
}

/**
 * How close to its limit a writable layer counts as full (the `sandbox.disk_quota` event
 * at its quota, a filled share under the pool guard): 4 MiB, or 1/16 of a smaller limit.
 * A write that hits the limit fails with EDQUOT once usage plus the write's reservation
 * would pass it, so a layer that was filled stops below the limit by up to one write
 * batch (btrfs reserves a few MiB per batch of pages); usage must fall below twice the
 * slack before another quota event.
 */
export function diskFullSlack(limitBytes: number): number {
  return Math.min(4 * 1024 * 1024, Math.floor(limitBytes / 16));
}

/** One sandbox's writable layer as the guard sees it. */
export interface PoolEntry {
  id: string;
  /** Its `disk_bytes`, bytes. */
  quotaBytes: number;
  /** Bytes it uses now (live: written data including what is still in the page cache). */
  usedBytes: number;
  /** Bytes it used at the previous check, or null when unknown (first check). */
  previousBytes: number | null;
  /** The limit the guard set on it below its quota, or null when its limit is its quota. */
  guardLimitBytes: number | null;
  /** It filled its share at an earlier check (and its quota was not restored since). */
  filled: boolean;
}

/** What the guard decides for one entry. */
export interface PoolDecision {
  id: string;
  /** The kernel limit to set, bytes (its quota when restoring). */
  limitBytes: number;
  /** True when this restores the sandbox's own quota (else it is a guard limit below it). */
  restore: boolean;
}

/** One check of the guard: the limits to change, and who filled the store. */
export interface PoolCheck {
  /** Limits to change (only changes). */
  decisions: PoolDecision[];
  /** Entries found filling the store at this check (not those marked before). */
  filled: string[];
  /** False when the room above the reserve holds every headroom: no sandbox needs a guard limit. */
  tight: boolean;
  /** The room above the reserve that was shared, bytes (0 when the free space is inside the reserve). */
  roomBytes: number;
  /** How many sandboxes shared the room. */
  sharing: number;
  /**
   * Room above the reserve that no sandbox's limit holds, bytes, kept for layers made
   * before the next check ({@link CREATE_ALLOWANCE_DIVISOR}); 0 when not tight.
   */
  withheldBytes: number;
  /**
   * The level of the room's max-min fair split, bytes: what a sandbox whose headroom is
   * larger got of the room at this check (a new layer's share until the next check); 0
   * when not tight.
   */
  levelBytes: number;
}

/**
 * While the store is tight and shared by at least 16 sandboxes, 1/16 of the room above
 * the reserve is left out of the sandboxes' shares and handed to layers made before the
 * next check, each its share at the level of the last split
 * (daemon/sandbox/disk-quota.ts DiskQuotaWatch.guard). With fewer, the allowance would
 * not hold one share (the level is at least room/n) and a split costs little: nothing is
 * withheld and every create splits again. So a
 * create gets its limit from one live read of its own layer instead of a new split over
 * every sandbox (O(sandboxes) sysfs reads and limit changes per create, the cost that
 * grew a cold burst's dsecd CPU by ~6 ms per sandbox at 150), and the limits together
 * still never reach into the reserve. With a level near room/n, the allowance holds about
 * n/16 creates; then the create path splits again. What it costs: the sandboxes that
 * share a tight store get 1/16 less of its room until the next split takes the allowance
 * back in (the reaper's, every second).
 */
export const CREATE_ALLOWANCE_DIVISOR = 16;

/** The grain of a level share, and the smallest raise worth an ioctl: 1 MiB. */
export const GUARD_STEP_BYTES = 1024 * 1024;

/**
 * Splits `total` bytes max-min fair over `demands` (bytes each): every demand gets
 * min(demand, level), the level the largest (rounded down to `grain`) for which the sum
 * stays within `total`. So demands below the level are met whole and the rest share
 * what is left equally. Returns the shares in the order of `demands`; all 0 when
 * `total` is 0 or less.
 */
export function fairShares(total: number, demands: readonly number[], grain = GUARD_STEP_BYTES): number[] {
  const out = new Array<number>(demands.length).fill(0);
  if (total <= 0) return out;
  const order = demands.map((_, i) => i).sort((a, b) => demands[a] - demands[b]);
  let left = total;
  for (let k = 0; k < order.length; k++) {
    const i = order[k];
    const d = Math.max(0, demands[i]);
    const level = left / (order.length - k);
    if (d <= level) {
      out[i] = d;
      left -= d;
      continue;
    }
    const share = Math.floor(level / grain) * grain;
    for (let j = k; j < order.length; j++) out[order[j]] = Math.min(Math.max(0, demands[order[j]]), share);
    break;
  }
  return out;
}

/**
 * One check of the guard for `entries` (every sandbox with a quota on the store) when
 * the store has `availableBytes` free (statfs f_bavail, less what the sandboxes hold in
 * the page cache) and keeps `reserveBytes`; see the module comment. A reserve of 0 turns
 * the guard off: every guard limit is restored.
 */
export function guardPool(availableBytes: number, reserveBytes: number, entries: PoolEntry[]): PoolCheck {
  const room = availableBytes - reserveBytes;
  const headroom = (e: PoolEntry) => Math.max(0, e.quotaBytes - e.usedBytes);
  const restoreAll = (): PoolDecision[] => entries.filter((e) => e.guardLimitBytes !== null).map((e) => ({ id: e.id, limitBytes: e.quotaBytes, restore: true }));
  const total = entries.reduce((a, e) => a + headroom(e), 0);
  if (reserveBytes <= 0 || total <= room) return { decisions: restoreAll(), filled: [], tight: false, roomBytes: Math.max(0, room), sharing: 0, withheldBytes: 0, levelBytes: 0 };

  // Filled at this check: it wrote since the last one, up to the guard limit it had.
  const filled = entries.filter((e) => !e.filled && e.guardLimitBytes !== null && e.previousBytes !== null
    && e.usedBytes > e.previousBytes && e.usedBytes >= e.guardLimitBytes - diskFullSlack(e.guardLimitBytes)).map((e) => e.id);
  const filler = (e: PoolEntry) => e.filled || filled.includes(e.id);

  const withheld = entries.length >= CREATE_ALLOWANCE_DIVISOR ? Math.floor(Math.max(0, room) / CREATE_ALLOWANCE_DIVISOR / GUARD_STEP_BYTES) * GUARD_STEP_BYTES : 0;
  const roomShares = fairShares(Math.max(0, room) - withheld, entries.map(headroom));
  // The level: the share of those whose headroom it did not meet whole (all shares are
  // whole headrooms only when the room minus the allowance held them all).
  const level = entries.reduce((m, e, i) => (roomShares[i] < headroom(e) ? Math.max(m, roomShares[i]) : m), 0);
  // The reserve goes to those that did not fill, once someone did or it is being used.
  const reserveOpen = room <= 0 || entries.some(filler);
  const rest = entries.map((e, i) => (reserveOpen && !filler(e) ? headroom(e) - roomShares[i] : 0));
  const reserveShares = fairShares(Math.max(0, Math.min(availableBytes, reserveBytes)), rest);

  const decisions: PoolDecision[] = [];
  entries.forEach((e, i) => {
    const target = e.usedBytes + roomShares[i] + reserveShares[i];
    if (target >= e.quotaBytes) {
      if (e.guardLimitBytes !== null) decisions.push({ id: e.id, limitBytes: e.quotaBytes, restore: true });
      return;
    }
    // Down at once, whatever the amount (the limits must add up within the free space);
    // up only by a step, so a limit does not move with every byte.
    if (e.guardLimitBytes === null || target < e.guardLimitBytes || target - e.guardLimitBytes >= GUARD_STEP_BYTES) {
      decisions.push({ id: e.id, limitBytes: target, restore: false });
    }
  });
  return { decisions, filled, tight: true, roomBytes: Math.max(0, room), sharing: entries.length, withheldBytes: withheld, levelBytes: level };
}

/**
 * The default reserve for a store of `sizeBytes`: 2% of it, at least 256 MiB and at
 * most 4 GiB (and never more than a quarter of the store). 256 MiB is about a second of
 * buffered writes into the loop-mounted store on the development host; 2% of a large
 * store covers several writers at once.
 */
export function defaultReserveBytes(sizeBytes: number): number {
  const MiB = 1024 ** 2;
  return Math.min(Math.floor(sizeBytes / 4), Math.max(256 * MiB, Math.min(Math.floor(sizeBytes * 0.02), 4096 * MiB)));
}

/** Human size for messages: `40 GiB`, `512 MiB`, `12 KiB`. */
export function humanBytes(n: number): string {
  const units: [number, string][] = [[1024 ** 4, 'TiB'], [1024 ** 3, 'GiB'], [1024 ** 2, 'MiB'], [1024, 'KiB']];
  for (const [u, name] of units) if (Math.abs(n) >= u) return `${+(n / u).toFixed(1)} ${name}`;
  return `${n} B`;
}
