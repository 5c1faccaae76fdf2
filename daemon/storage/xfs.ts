/**
 * The XFS store: each sandbox's entry `sb/<id>` is a directory with a project id of its
 * own and FS_XFLAG_PROJINHERIT, so everything written below it is charged to the project,
 * and a project quota of the sandbox's `disk_bytes` where the kernel has XFS quota
 * support. Where it has none the store is still XFS (so XFS-specific attacks meet a real
 * XFS) and reports that quotas are not enforced. A removed entry is renamed into
 * `trash/` and deleted in the background.
 */
import { mkdirSync, readdirSync, renameSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import type { Logger } from 'pino';
import { errnoCode } from '../host/native.js';
import * as fsops from './fsops.js';
import { attachAndMount, mountNew, mountOptions } from './image.js';
import { StoreUnavailable, entriesDirOf, trashDirOf, type DiskUsage, type QuotaMode, type StoreEntries, type StoreRecord } from './layout.js';

/**
 * Mounts a just-made XFS image with project quota and checks that the kernel enforces
 * it, setting `rec.quota` (`prjquota`, or `none` with `rec.quotaReason`). A kernel that
 * refuses `-o prjquota` gets the image mounted without it.
 * @throws StoreUnavailable when quotas are not to be had and `needQuota` (auto);
 *   `unavailable`'s error when even the plain mount fails.
 */
export function mountXfsWithQuota(image: string, mnt: string, rec: StoreRecord, needQuota: boolean, unavailable: (msg: string) => Error): void {
  try {
    attachAndMount(image, mnt, mountOptions({ ...rec, quota: 'prjquota' }));
    rec.quota = 'prjquota';
  } catch (e) {
    rec.quotaReason = `the kernel refused mount -o prjquota (${errnoCode(e) ?? (e as Error).message}; the kernel log names the cause, e.g. "quota support not available in this kernel")`;
    if (needQuota) throw new StoreUnavailable(rec.quotaReason);
    mountNew(image, mnt, rec, unavailable);
  }
  if (rec.quota === 'prjquota') {
    const q = (() => {
      try {
        return fsops.xfsQuotaState(mnt);
      } catch (e) {
        return { accounting: false, enforcing: false, err: errnoCode(e) };
      }
    })();
    if (!q.enforcing) {
      rec.quota = 'none';
      rec.quotaReason = 'XFS mounted with prjquota, but project quota is not enforced (Q_XGETQSTATV)';
      if (needQuota) throw new StoreUnavailable(rec.quotaReason);
    }
  }
}

/**
 * The quota mode of the operator's XFS at `dir` (`[storage] path`): `prjquota` when the
 * kernel enforces project quota there (it must have been mounted with it), else `none`
 * with `rec.quotaReason` set.
 */
export function adoptXfsQuota(dir: string, rec: StoreRecord): QuotaMode {
  try {
    if (fsops.xfsQuotaState(dir).enforcing) return 'prjquota';
    rec.quotaReason = `${dir} is on an XFS mounted without project quota enforcement; remount it with -o prjquota`;
  } catch (e) {
    rec.quotaReason = `the kernel has no XFS quota (${errnoCode(e) ?? (e as Error).message})`;
  }
  return 'none';
}

/** The project-directory entries of a mounted XFS store, with their project quotas and usage. */
export class XfsEntries implements StoreEntries {
  /** Project id of each sandbox entry. */
  private readonly ids = new Map<string, number>();
  /** The next project id to give (above every id in sb/ and trash/). */
  private nextProjid = 1;
  /** Background deletions of trash entries, awaited by {@link drain}. */
  private readonly deleting = new Set<Promise<void>>();

  /**
   * @param mountDir where the store is mounted
   * @param quota the store's quota mode (`none`: entries get no project quota)
   */
  constructor(
    private readonly mountDir: string,
    private readonly quota: QuotaMode,
    private readonly log: Logger,
  ) {}

  private get entriesDir(): string {
    return entriesDirOf(this.mountDir);
  }

  private get trashDir(): string {
    return trashDirOf(this.mountDir);
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

  /** Also reads the project ids in trash/, so a new entry never reuses one still charged there. */
  load(): void {
    let max = 0;
    for (const d of [this.entriesDir, this.trashDir]) {
      for (const name of readdirSync(d)) {
        const p = path.join(d, name);
        try {
          const pid = fsops.fsGetProject(p).projid;
          if (d === this.entriesDir) this.ids.set(name, pid);
          max = Math.max(max, pid);
        } catch (e) {
          this.log.warn({ err: e, entry: p }, 'unreadable writable-layer entry');
        }
      }
    }
    this.nextProjid = max + 1;
  }

  create(id: string, limitBytes: number): void {
    const dir = path.join(this.entriesDir, id);
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    let projid = fsops.fsGetProject(dir).projid;
    if (projid === 0) projid = this.nextProjid++;
    fsops.fsSetProject(dir, projid, true);
    if (this.quota === 'prjquota') fsops.xfsSetProjectLimit(this.mountDir, projid, limitBytes);
    this.ids.set(id, projid);
  }

  /** The project's block hard limit. */
  limitOf(id: string): number | null {
    const u = fsops.xfsProjectUsage(this.mountDir, this.projidOf(id));
    return u && u.hardLimitBytes > 0 ? u.hardLimitBytes : null;
  }

  setLimit(id: string, bytes: number): void {
    fsops.xfsSetProjectLimit(this.mountDir, this.projidOf(id), bytes);
  }

  /** The project's block count and hard limit; null when they cannot be read. */
  usage(id: string): DiskUsage | null {
    const projid = this.ids.get(id);
    if (projid === undefined) return null;
    try {
      const u = fsops.xfsProjectUsage(this.mountDir, projid);
      return u ? { usedBytes: u.usedBytes, limitBytes: u.hardLimitBytes > 0 ? u.hardLimitBytes : null } : { usedBytes: 0, limitBytes: null };
    } catch {
      return null;
    }
  }

  /** Asks per project; an entry that vanished meanwhile is left out. */
  usageAll(): Map<string, DiskUsage> {
    const out = new Map<string, DiskUsage>();
    for (const [id, projid] of this.ids) {
      try {
        const u = fsops.xfsProjectUsage(this.mountDir, projid);
        if (u) out.set(id, { usedBytes: u.usedBytes, limitBytes: u.hardLimitBytes > 0 ? u.hardLimitBytes : null });
      } catch { /* entry vanished */ }
    }
    return out;
  }

  /** Renames the directory into trash/, clears its project limit, and deletes it in the background. */
  async remove(id: string): Promise<boolean> {
    const dir = path.join(this.entriesDir, id);
    const projid = this.projidOf(id);
    const to = path.join(this.trashDir, `${id}.${randomBytes(4).toString('hex')}`);
    renameSync(dir, to);
    if (this.quota === 'prjquota' && projid) {
      try {
        fsops.xfsSetProjectLimit(this.mountDir, projid, 0);
      } catch (e) {
        this.log.warn({ err: e, id, projid }, 'clearing a project quota failed');
      }
    }
    this.purgeInBackground(to);
    return true;
  }

  /** Deletes what is left in trash/ (an earlier dsecd's deletions), in the background. */
  cleanLeftovers(): string[] {
    for (const name of readdirSync(this.trashDir)) this.purgeInBackground(path.join(this.trashDir, name));
    return [];
  }

  async drain(): Promise<void> {
    await Promise.all([...this.deleting]);
  }

  /** The project id of sandbox `id`'s entry, from memory or from the directory. */
  private projidOf(id: string): number {
    return this.ids.get(id) ?? fsops.fsGetProject(path.join(this.entriesDir, id)).projid;
  }

  /** Deletes a trash entry without holding up the caller; {@link drain} waits for all of them. */
  private purgeInBackground(p: string): void {
    const done: Promise<void> = rm(p, { recursive: true, force: true })
      .catch((e) => this.log.warn({ err: e, path: p }, 'deleting a removed writable layer failed'))
      .finally(() => this.deleting.delete(done));
    this.deleting.add(done);
  }
}
