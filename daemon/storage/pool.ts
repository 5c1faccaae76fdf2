/**
 * The writable-layer store as a shared pool: what admission allows, and how the last
 * free space of an overcommitted store is kept for the sandboxes that did not fill it.
 * Pure: the manager feeds numbers in and applies the limits that come out
 * (daemon/sandbox/manager.ts checkDiskQuotas).
 *
 * Why a guard: quotas may add up to more than the store (`[admission] disk_overcommit`
 * above 1), so the store can fill before any sandbox reaches its quota. Then every
 * sandbox's next write fails with ENOSPC, not only the one that filled it (measured on a
 * loop-mounted btrfs: a neighbour's 6-byte write failed, while reads, deletes, mkdir and
 * new sandboxes still worked; docs/OPERATIONS.md "When the store fills"). The guard keeps
 * a reserve (`[storage] reserve_bytes`) for the others: while the free space above the
 * reserve is smaller than some sandbox's headroom (quota minus use), each sandbox that
 * wrote since the last check gets a kernel limit of its use plus that free space, so the
 * kernel stops it (EDQUOT) before it reaches the reserve, however fast it writes; once
 * the free space is inside the reserve, a writer is held at its use. A guard limit is
 * only ever lowered until the quota is restored, and a quota is restored only to a
 * sandbox that did not write since the last check: statfs counts a write's blocks only
 * once writeback allocates them, so the caller subtracts what the examined sandboxes
 * hold in the page cache (their live use above the committed counters) from the free
 * space, and a sandbox still writing keeps its limit. Sandboxes that did
 * not write keep their own quota and can use the reserve. Limits go back to the quota as
 * soon as the store has room for the sandbox's whole headroom above the reserve.
 *
 * What it cannot do: a sandbox that starts writing between two checks (one second) is
 * stopped only at the next check, so several new fast writers can still reach the
 * reserve; the reserve should hold what a sandbox writes in a second or two.
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
}

/** What the guard decides for one entry. */
export interface PoolDecision {
  id: string;
  /** The kernel limit to set, bytes (its quota when restoring). */
  limitBytes: number;
  /** True when this restores the sandbox's own quota (else it is a guard limit below it). */
  restore: boolean;
}

/** The smallest change of a guard limit worth an ioctl: 1 MiB (limits of writers move with every check). */
export const GUARD_STEP_BYTES = 1024 * 1024;

/**
 * The limits to change for `entries` when the store has `availableBytes` free (statfs
 * f_bavail) and keeps `reserveBytes` for sandboxes that are not filling it; see the
 * module comment. Only changes are returned.
 */
export function guardPool(availableBytes: number, reserveBytes: number, entries: PoolEntry[]): PoolDecision[] {
  const room = availableBytes - reserveBytes;
  const out: PoolDecision[] = [];
  for (const e of entries) {
    const headroom = e.quotaBytes - e.usedBytes;
    const wrote = e.previousBytes !== null && e.usedBytes > e.previousBytes;
    if (room >= headroom) {
      if (e.guardLimitBytes === null) continue;
      if (!wrote) {
        out.push({ id: e.id, limitBytes: e.quotaBytes, restore: true });
        continue;
      }
    }
    if (!wrote) continue;
    // Only ever lowered while guarded: statfs counts a write's blocks only once they are
    // allocated at writeback, so free space read while a writer has data in the page
    // cache is too high, and a limit raised on it would let the writer into the reserve.
    const target = Math.min(e.quotaBytes, e.guardLimitBytes ?? Infinity, e.usedBytes + Math.max(room, 0));
    if (target >= e.quotaBytes) continue;
    if (e.guardLimitBytes === null || e.guardLimitBytes - target >= GUARD_STEP_BYTES || (target < e.guardLimitBytes && room <= 0)) {
      out.push({ id: e.id, limitBytes: target, restore: false });
    }
  }
  return out;
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
