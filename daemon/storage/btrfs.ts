/**
 * The btrfs store: each sandbox's entry `sb/<id>` is a subvolume whose qgroup limits its
 * referenced bytes to the sandbox's `disk_bytes` (simple quotas where the kernel has
 * them, Linux 6.7+, else full qgroups). Writes beyond the limit fail with EDQUOT inside
 * the sandbox. Deleting a subvolume costs the same whatever its size (the kernel frees
 * extents in the background; what it has cached in memory is pruned on a worker thread,
 * see fsops.btrfsSubvolDestroy).
 */
import { chmodSync, existsSync, readFileSync, readdirSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from 'pino';
import { errnoCode } from '../host/native.js';
import * as fsops from './fsops.js';
import { entriesDirOf, type DiskUsage, type QuotaMode, type StoreEntries, type StoreRecord } from './layout.js';

/**
 * Enables quotas on the btrfs store at `mnt`: simple quotas where the kernel has them,
 * else full qgroups. Returns the mode, or `none` with `rec.quotaReason` set.
 */
export function enableBtrfsQuota(mnt: string, rec: StoreRecord): QuotaMode {
  try {
    fsops.btrfsQuotaEnable(mnt, true);
    return 'squota';
  } catch (e) {
    const simpleErr = errnoCode(e) ?? (e as Error).message;
    try {
      fsops.btrfsQuotaEnable(mnt, false);
      return 'qgroup';
    } catch (e2) {
      rec.quotaReason = `the kernel refused btrfs quotas (simple: ${simpleErr}, qgroups: ${errnoCode(e2) ?? (e2 as Error).message})`;
      return 'none';
    }
  }
}

/**
 * The quota mode of the operator's btrfs at `dir` (`[storage] path`): the mode quotas
 * are on in, or, when they are off, what {@link enableBtrfsQuota} turns on.
 */
export function adoptBtrfsQuota(dir: string, rec: StoreRecord): QuotaMode {
  const mode = (() => {
    try {
      return readFileSync(`/sys/fs/btrfs/${fsops.btrfsFsid(dir)}/qgroups/mode`, 'utf8').trim();
    } catch {
      return null; // quotas are off (no qgroups directory)
    }
  })();
  return mode === 'squota' ? 'squota' : mode === 'qgroup' ? 'qgroup' : enableBtrfsQuota(dir, rec);
}

/** Reads a decimal sysfs counter; null when unreadable. */
function readCounter(p: string): number | null {
  try {
    const n = Number(readFileSync(p, 'utf8').trim());
    return Number.isFinite(n) ? n : null;
  } catch {
    return null;
  }
}

/** The subvolume entries of a mounted btrfs store, with their qgroup limits and usage. */
export class BtrfsEntries implements StoreEntries {
  /** Subvolume id of each sandbox entry: its qgroup is `0/<id>`. */
  private readonly ids = new Map<string, number>();
  /** /sys/fs/btrfs/<uuid>/qgroups, for live usage (referenced plus reservations). */
  private qgroupSysfs: string | null = null;

  /**
   * @param mountDir where the store is mounted
   * @param quota the store's quota mode (`none`: entries get no limit)
   */
  constructor(
    private readonly mountDir: string,
    private readonly quota: QuotaMode,
    private readonly log: Logger,
  ) {}

  private get entriesDir(): string {
    return entriesDirOf(this.mountDir);
  }

  get size(): number {
    return this.ids.size;
  }

  has(id: string): boolean {
    return this.ids.has(id);
  }

  forget(id: string): void {
    this.ids.delete(id);
  }

  load(): void {
    try {
      this.qgroupSysfs = `/sys/fs/btrfs/${fsops.btrfsFsid(this.mountDir)}/qgroups`;
    } catch (e) {
      this.log.warn({ err: e }, 'btrfs fsid unknown: disk usage falls back to committed qgroup counters');
    }
    for (const name of readdirSync(this.entriesDir)) {
      const p = path.join(this.entriesDir, name);
      try {
        this.ids.set(name, fsops.btrfsSubvolId(p));
      } catch (e) {
        this.log.warn({ err: e, entry: p }, 'unreadable writable-layer entry');
      }
    }
  }

  create(id: string, limitBytes: number): void {
    const dir = path.join(this.entriesDir, id);
    if (!existsSync(dir)) {
      try {
        fsops.btrfsSubvolCreate(this.entriesDir, id);
      } catch (e) {
        if (errnoCode(e) !== 'EEXIST') throw e;
      }
    }
    if (this.quota !== 'none') fsops.btrfsQgroupLimit(dir, limitBytes);
    this.ids.set(id, fsops.btrfsSubvolId(dir));
    chmodSync(dir, 0o700); // a new subvolume's root is 0755
  }

  /** The qgroup's max_referenced in sysfs (in memory, so exact at once), else from the quota tree. */
  limitOf(id: string): number | null {
    const sid = this.ids.get(id) ?? fsops.btrfsSubvolId(path.join(this.entriesDir, id));
    const sysfs = this.qgroupSysfs ? readCounter(`${this.qgroupSysfs}/0_${sid}/max_referenced`) : null;
    const max = sysfs ?? fsops.btrfsQgroups(this.mountDir).find((q) => q.id === sid)?.maxReferenced ?? 0;
    return max > 0 ? max : null;
  }

  setLimit(id: string, bytes: number): void {
    fsops.btrfsQgroupLimit(path.join(this.entriesDir, id), bytes);
  }

  /**
   * The qgroup's referenced bytes plus its reserved data (written to the page cache, not
   * yet committed), from sysfs; without sysfs, the committed counters of {@link usageAll}.
   */
  usage(id: string): DiskUsage | null {
    const sid = this.ids.get(id);
    if (sid === undefined) return null;
    if (this.qgroupSysfs) {
      const d = `${this.qgroupSysfs}/0_${sid}`;
      const ref = readCounter(`${d}/referenced`);
      if (ref !== null) {
        const max = readCounter(`${d}/max_referenced`) ?? 0;
        return { usedBytes: ref + (readCounter(`${d}/rsv_data`) ?? 0), limitBytes: max > 0 ? max : null };
      }
    }
    return this.usageAll().get(id) ?? null;
  }

  /**
   * Every qgroup in one tree search: counters as of the last commit (a write that hits the
   * limit forces one, so a full layer shows at once).
   */
  usageAll(): Map<string, DiskUsage> {
    const out = new Map<string, DiskUsage>();
    const byId = new Map(fsops.btrfsQgroups(this.mountDir).map((q) => [q.id, q] as const));
    for (const [id, sid] of this.ids) {
      const q = byId.get(sid);
      if (q) out.set(id, { usedBytes: q.referenced, limitBytes: q.maxReferenced });
    }
    return out;
  }

  /** Deletes the subvolume (a plain directory someone made there is removed recursively). */
  async remove(id: string): Promise<boolean> {
    try {
      await fsops.btrfsSubvolDestroy(this.entriesDir, id);
    } catch (e) {
      // Not a subvolume (EINVAL): a plain directory someone made there.
      if (errnoCode(e) === 'ENOENT') return false;
      if (errnoCode(e) !== 'EINVAL') throw e;
      await rm(path.join(this.entriesDir, id), { recursive: true, force: true });
    }
    return true;
  }

  /** Qgroups whose subvolume is gone and that are fully freed (kernels that do not drop them on their own). */
  cleanLeftovers(): string[] {
    const removed: string[] = [];
    if (this.quota === 'none') return removed;
    const live = new Set(this.ids.values());
    for (const q of fsops.btrfsQgroups(this.mountDir)) {
      if (q.id === 5 || live.has(q.id) || q.referenced > 0) continue;
      try {
        fsops.btrfsQgroupRemove(this.mountDir, q.id);
        removed.push(`qgroup 0/${q.id}`);
      } catch (e) {
        if (errnoCode(e) !== 'EBUSY' && errnoCode(e) !== 'ENOENT') throw e;
      }
    }
    return removed;
  }

  async drain(): Promise<void> {}
}
