/**
 * The writable-layer store: where each sandbox's overlay `upper/` and `work/` live, and
 * what limits how much it can write. (Not to be confused with the SQLite store of rows,
 * daemon/store/, nor the store of read-only image layers, daemon/image/store.ts.)
 *
 * Kinds (`[storage] upper_fs`, fixed when the store is created):
 *   - `btrfs`: one loop-mounted btrfs image under the instance root; each sandbox gets a
 *     subvolume with a qgroup limit of its `disk_bytes` (daemon/storage/btrfs.ts).
 *   - `xfs`: one loop-mounted XFS image; each sandbox gets a project directory with a
 *     project quota of its `disk_bytes`, where the kernel has XFS quota support
 *     (daemon/storage/xfs.ts).
 *   - `host`: the layout before the store existed: `<root>/sandboxes/<id>/upper` on the
 *     host filesystem, no quota.
 *   - `auto` (default) picks, when the store is first created: XFS if the kernel mounts
 *     it with `prjquota`, else btrfs if quotas can be enabled on it, else host. The
 *     attempt is made on the store's own image, so the probe is the real thing.
 * Writes beyond a quota fail with EDQUOT inside the sandbox; the host disk never sees
 * more than the image's size.
 *
 * The image (daemon/storage/image.ts) is mounted at every dsecd start, before sandboxes
 * are adopted; a mount left by a previous dsecd (which may have been SIGKILLed while its
 * sandboxes kept running on it) is checked to be this instance's image and reused. Only
 * `dsecd --purge` unmounts it and removes the image. The on-disk layout is described in
 * daemon/storage/layout.ts.
 *
 * `[storage] path` names a directory on a filesystem the operator mounted instead (a real
 * XFS with `prjquota`, or a btrfs): no image and no loop device, the same entries under
 * `<path>/sb/`; dsecd never mounts or unmounts it.
 *
 * Sandboxes created before the store, or while `upper_fs = "host"`, keep their layer at
 * `<root>/sandboxes/<id>/upper`: {@link WritableLayerStore.locate} finds each sandbox's
 * layer wherever it is, so an upgrade needs no migration.
 */
import { chmodSync, existsSync, mkdirSync, readFileSync, readdirSync, rmSync, rmdirSync, statSync, statfsSync } from 'node:fs';
import path from 'node:path';
import type { Logger } from 'pino';
import { failedPrecondition } from '../errors.js';
import * as native from '../host/native.js';
import { BtrfsEntries, adoptBtrfsQuota, enableBtrfsQuota } from './btrfs.js';
import { blockDeviceOf, makeImage, mountNew, mountRecordedImage, mountSourceOf, unmountImage } from './image.js';
import {
  BTRFS_SUPER_MAGIC,
  StoreUnavailable,
  XFS_SUPER_MAGIC,
  entriesDirOf,
  gib,
  layerIn,
  storageDir,
  trashDirOf,
  writeRecord,
  type DefenceStatus,
  type DiskUsage,
  type OpenStoreOptions,
  type QuotaMode,
  type StorageConfig,
  type StoreEntries,
  type StoreKind,
  type StoreRecord,
  type WritableLayer,
} from './layout.js';
import { forgetLifted, isLifted, restoreLifted, withQuotaLifted } from './lifted.js';
import { XfsEntries, adoptXfsQuota, mountXfsWithQuota } from './xfs.js';

export { MAX_DEFAULT_STORE_BYTES, MIN_STORE_BYTES, BTRFS_SUPER_MAGIC, XFS_SUPER_MAGIC, defaultStoreBytes } from './layout.js';
export type { DefenceStatus, DiskUsage, OpenStoreOptions, QuotaMode, StorageConfig, StoreKind, StoreRecord, WritableLayer } from './layout.js';
export { loopBackingFile, mountSourceOf } from './image.js';

/** The writable-layer store of one dsecd instance. */
export class WritableLayerStore {
  /** The store's block device once found ({@link blockDevice}); undefined: not looked up yet. */
  private device: { major: number; minor: number; name: string } | null | undefined = undefined;
  /** The sandbox entries of the mounted store (btrfs or XFS), or null without a store. */
  private readonly store: StoreEntries | null;

  private constructor(
    private readonly root: string,
    /** Where new sandboxes' layers go. */
    readonly kind: StoreKind,
    /** The mounted store, or null (no store: every layer is on the host filesystem). */
    readonly record: StoreRecord | null,
    /** Why the kind is what it is, when `auto` or the record decided (for host info). */
    private readonly note: string | null,
    private readonly log: Logger,
  ) {
    this.store = !record ? null : record.kind === 'btrfs' ? new BtrfsEntries(this.mountDir, record.quota, log) : new XfsEntries(this.mountDir, record.quota, log);
  }

  /** `<root>/storage`. */
  static dirOf(root: string): string {
    return storageDir(root);
  }

  /** The store's directory: its image's mount point `<root>/storage/mnt`, or the operator's `[storage] path`. */
  get mountDir(): string {
    return this.record?.external ?? path.join(storageDir(this.root), 'mnt');
  }

  /** The store's image, `<root>/storage/upper.img`. */
  get imagePath(): string {
    return path.join(storageDir(this.root), 'upper.img');
  }

  /** `<mnt>/sb`: one entry per sandbox. */
  private get entriesDir(): string {
    return entriesDirOf(this.mountDir);
  }

  /** `<root>/storage/lifted`: quotas lifted for an overlay mount and not yet put back (daemon/storage/lifted.ts). */
  private get liftedDir(): string {
    return path.join(storageDir(this.root), 'lifted');
  }

  /** True when new sandboxes get a quota that the kernel enforces. */
  get enforcesQuota(): boolean {
    return this.kind !== 'host' && !!this.record && this.record.quota !== 'none';
  }

  /**
   * Opens the instance's store: mounts the recorded one (or checks that the mount a
   * previous dsecd left is this instance's image), or creates it on first start as
   * `config.upperFs` says. Safe to call at every start, after a crash at any point
   * (an image without a record is an interrupted creation and is made again).
   * @throws DsecError FailedPrecondition when the recorded store's kind differs from an
   *   explicit `upper_fs`, when its mount point holds something else, when an explicit
   *   kind cannot be created here (no room, mkfs missing), or the mount fails.
   */
  static async open(opts: OpenStoreOptions): Promise<WritableLayerStore> {
    const dir = storageDir(opts.root);
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    chmodSync(dir, 0o700);
    const mnt = path.join(dir, 'mnt');
    const image = path.join(dir, 'upper.img');
    const recFile = path.join(dir, 'store.json');
    let rec: StoreRecord | null = null;
    if (existsSync(recFile)) {
      try {
        rec = JSON.parse(readFileSync(recFile, 'utf8')) as StoreRecord;
      } catch (e) {
        throw failedPrecondition(`the writable-layer store record ${recFile} is unreadable (${(e as Error).message}); restore it, or purge the instance (dsecd --purge) to start over`);
      }
    } else {
      // An interrupted creation: nothing was ever stored on it.
      if (mountSourceOf(readFileSync('/proc/self/mountinfo', 'utf8'), mnt) !== null) native.unmountAll(mnt);
      rmSync(image, { force: true });
      rmSync(`${image}.tmp`, { force: true });
    }
    const want = opts.config.upperFs;
    const extPath = opts.config.path ? path.resolve(opts.config.path) : null;
    if (rec && (rec.external ?? null) !== extPath) {
      throw failedPrecondition(`[storage] path is ${extPath ? `"${extPath}"` : 'unset'}, but this instance's writable-layer store is ${rec.external ? `on "${rec.external}"` : `the image ${image}`}; one instance has one store. Restore the setting, or purge the instance (dsecd --purge) to make a new one`);
    }
    if (rec) {
      if ((want === 'btrfs' || want === 'xfs') && want !== rec.kind) {
        throw failedPrecondition(`[storage] upper_fs = "${want}", but this instance's writable-layer store (${image}) is ${rec.kind}; one instance has one store. Set upper_fs = "${rec.kind}" or "auto", or purge the instance (dsecd --purge destroys every sandbox) to make a new one`);
      }
      const s = new WritableLayerStore(opts.root, want === 'host' ? 'host' : rec.kind, rec, want === 'host' ? 'upper_fs = "host": new sandboxes use the host filesystem; sandboxes already on the store keep it' : null, opts.log);
      s.mount();
      s.load();
      return s;
    }
    if (want === 'host') return new WritableLayerStore(opts.root, 'host', null, 'upper_fs = "host"', opts.log);
    if (extPath) {
      const made = WritableLayerStore.adopt(extPath, want, opts.log);
      writeRecord(dir, made);
      const s = new WritableLayerStore(opts.root, made.kind, made, null, opts.log);
      s.load();
      opts.log.info({ kind: made.kind, quota: made.quota, path: extPath }, 'using the operator\'s filesystem as the writable-layer store');
      return s;
    }
    const order: ('xfs' | 'btrfs')[] = want === 'auto' ? ['xfs', 'btrfs'] : [want];
    const refused: string[] = [];
    for (const kind of order) {
      try {
        const made = await WritableLayerStore.create(opts, kind, want === 'auto');
        const s = new WritableLayerStore(opts.root, kind, made, want === 'auto' && refused.length ? `auto: ${refused.join('; ')}` : null, opts.log);
        s.load();
        opts.log.info({ kind, quota: made.quota, sizeBytes: made.sizeBytes, preallocated: made.preallocated, image }, 'created the writable-layer store');
        return s;
      } catch (e) {
        if (!(e instanceof StoreUnavailable)) throw e;
        refused.push(`${kind}: ${e.message}`);
      }
    }
    const note = `auto found no filesystem with per-sandbox quotas (${refused.join('; ')})`;
    opts.log.warn({ reasons: refused }, 'writable layers stay on the host filesystem without quotas');
    return new WritableLayerStore(opts.root, 'host', null, note, opts.log);
  }

  /**
   * Makes the image, formats and mounts it, and turns quotas on. With `needQuota` (auto),
   * a filesystem whose quotas the kernel refuses is removed again and StoreUnavailable
   * thrown; otherwise the store is kept with quota `none` and the reason recorded.
   */
  private static async create(opts: OpenStoreOptions, kind: 'btrfs' | 'xfs', needQuota: boolean): Promise<StoreRecord> {
    const dir = storageDir(opts.root);
    const mnt = path.join(dir, 'mnt');
    const image = path.join(dir, 'upper.img');
    const unavailable = (msg: string) => (needQuota ? new StoreUnavailable(msg) : failedPrecondition(`cannot create the ${kind} writable-layer store: ${msg}`));
    const size = await makeImage(dir, image, opts.config, kind, opts.log, unavailable);
    const rec: StoreRecord = { version: 1, kind, quota: 'none', quotaReason: null, sizeBytes: size, preallocated: opts.config.preallocate, external: null, createdAt: Date.now() };
    mkdirSync(mnt, { recursive: true, mode: 0o700 });
    try {
      if (kind === 'xfs') {
        mountXfsWithQuota(image, mnt, rec, needQuota, unavailable);
      } else {
        mountNew(image, mnt, rec, unavailable);
        rec.quota = enableBtrfsQuota(mnt, rec);
        if (rec.quota === 'none' && needQuota) throw new StoreUnavailable(rec.quotaReason ?? 'btrfs quotas could not be enabled');
      }
      chmodSync(mnt, 0o700);
      for (const d of ['sb', 'trash']) mkdirSync(path.join(mnt, d), { mode: 0o700 });
    } catch (e) {
      native.unmountAll(mnt);
      rmSync(image, { force: true });
      throw e;
    }
    writeRecord(dir, rec);
    return rec;
  }

  /**
   * Takes the operator's directory `dir` (`[storage] path`) as the store: its
   * filesystem must be btrfs or XFS (and match an explicit `upper_fs`). btrfs quotas are
   * turned on when they are off; XFS project quota must have been mounted on.
   * @throws DsecError FailedPrecondition naming what is wrong with the directory.
   */
  private static adopt(dir: string, want: StorageConfig['upperFs'], log: Logger): StoreRecord {
    let st;
    try {
      st = statfsSync(dir);
      if (!statSync(dir).isDirectory()) throw new Error('not a directory');
    } catch (e) {
      throw failedPrecondition(`[storage] path "${dir}" is unusable (${(e as Error).message}); mount the filesystem and create the directory first`);
    }
    const kind = st.type === BTRFS_SUPER_MAGIC ? 'btrfs' : st.type === XFS_SUPER_MAGIC ? 'xfs' : null;
    if (!kind) throw failedPrecondition(`[storage] path "${dir}" is on a filesystem with magic 0x${st.type.toString(16)}, neither XFS nor btrfs; writable layers with quotas need one of them`);
    if ((want === 'btrfs' || want === 'xfs') && want !== kind) throw failedPrecondition(`[storage] path "${dir}" is on ${kind}, but upper_fs = "${want}"`);
    const rec: StoreRecord = { version: 1, kind, quota: 'none', quotaReason: null, sizeBytes: st.blocks * st.bsize, preallocated: false, external: dir, createdAt: Date.now() };
    rec.quota = kind === 'btrfs' ? adoptBtrfsQuota(dir, rec) : adoptXfsQuota(dir, rec);
    if (rec.quota === 'none') log.warn({ path: dir, reason: rec.quotaReason }, 'the operator\'s writable-layer filesystem enforces no per-sandbox quota');
    for (const d of ['sb', 'trash']) mkdirSync(path.join(dir, d), { recursive: true, mode: 0o700 });
    return rec;
  }

  /** Mounts the recorded store unless the mount a previous dsecd left is already there (and is this image). */
  private mount(): void {
    const rec = this.record!;
    const mnt = this.mountDir;
    if (rec.external) {
      const magic = (() => {
        try {
          return statfsSync(mnt).type;
        } catch {
          return null;
        }
      })();
      if (magic !== (rec.kind === 'btrfs' ? BTRFS_SUPER_MAGIC : XFS_SUPER_MAGIC)) {
        throw failedPrecondition(`the writable-layer store ${mnt} is not on its ${rec.kind} filesystem; mount it ([storage] path) before starting dsecd`);
      }
      return;
    }
    mkdirSync(mnt, { recursive: true, mode: 0o700 });
    mountRecordedImage(this.imagePath, mnt, rec, path.join(storageDir(this.root), 'store.json'));
  }

  /** Reads what the mounted store holds, then puts back quotas an interrupted start left lifted. */
  private load(): void {
    if (!this.store) return;
    for (const d of [this.entriesDir, trashDirOf(this.mountDir)]) mkdirSync(d, { recursive: true, mode: 0o700 });
    this.store.load();
    restoreLifted(this.liftedDir, this.store, this.log);
  }

  /**
   * Runs `mount` (the overlay mount of sandbox `id`) with the layer's quota lifted, and
   * puts the limit back before returning: overlayfs must write its work dir at every
   * mount, which a layer at its quota refuses (daemon/storage/lifted.ts says why and how
   * this is crash safe). Without a quota on the entry (no quotas, no limit, layer on the
   * host filesystem) `mount` just runs. `mount`'s own error is rethrown after the limit
   * is back.
   * @throws DsecError Internal when the limit cannot be put back (the record stays, so
   *   the next start of dsecd or of the sandbox retries); the caller must then not start
   *   the sandbox (the container driver's start fails and tears the overlay down).
   */
  async withRoomToMount<T>(id: string, mount: () => Promise<T>): Promise<T> {
    const rec = this.record;
    if (!rec || !this.store || rec.quota === 'none' || this.locate(id)?.location !== 'store') return mount();
    return withQuotaLifted(this.liftedDir, this.store, id, this.log, mount);
  }

  /**
   * Whether new sandboxes get a quota, and how (the host-wide `disk_quota` defence).
   * Truthful: `enforced` only when the kernel enforces the limit.
   */
  status(): DefenceStatus {
    const rec = this.record;
    if (this.kind === 'host') {
      return { enforced: false, detail: `writable layers on the host filesystem (${this.root}/sandboxes/<id>/upper): no per-sandbox quota, a sandbox can fill the host disk${this.note ? `; ${this.note}` : ''}` };
    }
    const size = (() => {
      try {
        return statSync(this.imagePath).size; // grown by hand since it was made, perhaps
      } catch {
        return rec!.sizeBytes;
      }
    })();
    const where = rec!.external
      ? `the operator's ${rec!.kind} filesystem at ${rec!.external}`
      : `a loop-mounted ${rec!.kind} image (${this.imagePath}, ${gib(size)}, ${rec!.preallocated ? 'preallocated' : 'sparse'})`;
    if (rec!.quota === 'none') return { enforced: false, detail: `writable layers on ${where} without per-sandbox quotas: ${rec!.quotaReason ?? 'quotas are off'}` };
    const how = rec!.quota === 'prjquota' ? 'an XFS project with a project quota' : `a btrfs subvolume with a qgroup limit (${rec!.quota === 'squota' ? 'simple quotas' : 'full qgroups'})`;
    return { enforced: true, detail: `each sandbox's writable layer is ${how} of its disk_bytes on ${where}; writes beyond it fail with EDQUOT inside, and the host disk never gives the store more than its size${this.note ? `; ${this.note}` : ''}` };
  }

  /**
   * The `disk_quota` defence of one sandbox, from where its layer is and its recorded quota.
   * @param diskBytes the sandbox's recorded `disk_bytes` (null: none applied).
   */
  sandboxStatus(id: string, diskBytes: number | null): DefenceStatus {
    const layer = this.locate(id);
    if (!layer) return { enforced: false, detail: 'the sandbox has no writable layer on this host' };
    if (layer.location === 'host') return { enforced: false, detail: `writable layer on the host filesystem (${layer.upper}), without a quota: it was created with upper_fs = "host" or before the store existed` };
    const rec = this.record!;
    if (rec.quota === 'none') return { enforced: false, detail: `writable layer on ${rec.kind} without quotas: ${rec.quotaReason ?? 'quotas are off'}` };
    if (diskBytes === null) return { enforced: false, detail: `writable layer on ${rec.kind}, created without a quota` };
    return { enforced: true, detail: `${diskBytes} bytes (${gib(diskBytes)}) on its ${rec.kind === 'btrfs' ? 'btrfs subvolume (qgroup limit)' : 'XFS project (project quota)'}; writes beyond fail with EDQUOT` };
  }

  /** The store as host info shows it: kind, quota mode, where, size and use (statfs), and how many layers it holds. */
  info(): { kind: StoreKind; quota: QuotaMode; location: string; size_bytes: number | null; used_bytes: number | null; layers: number } {
    if (!this.record || this.kind === 'host') {
      return { kind: 'host', quota: 'none', location: path.join(this.root, 'sandboxes'), size_bytes: null, used_bytes: null, layers: this.entries().length };
    }
    const st = statfsSync(this.mountDir);
    return {
      kind: this.kind, quota: this.record.quota, location: this.record.external ?? this.imagePath,
      size_bytes: st.blocks * st.bsize, used_bytes: (st.blocks - st.bfree) * st.bsize, layers: this.entries().length,
    };
  }

  /** Where the store's space comes from, for messages: its image, the operator's directory, or `<root>/sandboxes` without a store. */
  get location(): string {
    if (!this.record) return path.join(this.root, 'sandboxes');
    return this.record.external ?? this.imagePath;
  }

  /**
   * The block device that holds the store, as cgroup I/O files name it: the loop device
   * of the instance's image, or the disk under the operator's filesystem (a partition's
   * whole disk: cgroup I/O limits take whole disks only). Null without a store, or when
   * the mount's source is not a block device (e.g. a btrfs on several devices shows only
   * one; its first is taken). Read from /proc/self/mountinfo and sysfs at the first call.
   *
   * The loop device reads and writes its image with direct I/O, so what passes it
   * reaches the host disk once, without a second copy in the host page cache: a limit on
   * the loop device is a limit on the sandbox's share of the host disk. (On cgroup v2
   * the loop driver also issues the image's I/O on behalf of the submitting cgroup.)
   */
  blockDevice(): { major: number; minor: number; name: string } | null {
    if (!this.record) return null;
    // The mount (and so its device) stays for the life of the instance: found once, since
    // /proc/self/mountinfo grows with every sandbox's mounts and creates call this.
    if (this.device !== undefined) return this.device;
    this.device = blockDeviceOf(this.mountDir, !!this.record.external);
    return this.device;
  }

  /**
   * The store's space now (statfs), bytes: size, used, and available to writers
   * (f_bavail); null without a store.
   */
  space(): { sizeBytes: number; usedBytes: number; availableBytes: number } | null {
    if (!this.record || this.kind === 'host') return null;
    const st = statfsSync(this.mountDir);
    return { sizeBytes: st.blocks * st.bsize, usedBytes: (st.blocks - st.bfree) * st.bsize, availableBytes: st.bavail * st.bsize };
  }

  /**
   * Sets the kernel limit of sandbox `id`'s store entry for the pool guard
   * (daemon/storage/pool.ts): `bytes` below its quota, or its quota to restore it.
   * Skipped (false) while the entry's quota is lifted for an overlay mount
   * ({@link withRoomToMount} puts its own limit back) or without quotas.
   * @throws errno-coded Errors from the ioctls.
   */
  setPoolLimit(id: string, bytes: number): boolean {
    if (!this.record || !this.store || this.record.quota === 'none' || !this.store.has(id)) return false;
    if (isLifted(this.liftedDir, id)) return false;
    this.store.setLimit(id, Math.max(1, bytes));
    return true;
  }

  /** The limit the kernel enforces on sandbox `id`'s store entry now, bytes, or null (none, no entry, no quotas). */
  currentLimit(id: string): number | null {
    if (!this.record || !this.store || this.record.quota === 'none' || !this.store.has(id)) return null;
    try {
      return this.store.limitOf(id);
    } catch {
      return null;
    }
  }

  /** Total size of the store filesystem, bytes (statfs), or null without a store: the largest quota it can hold. */
  capacityBytes(): number | null {
    if (!this.record) return null;
    const st = statfsSync(this.mountDir);
    return st.blocks * st.bsize;
  }

  /**
   * Creates (or finds) the writable layer of a new sandbox where new layers go, and sets
   * its quota: the btrfs subvolume or XFS project directory `sb/<id>`. Returns where its
   * upper/ and work/ go; prepareRootfs makes them (owned by the sandbox's root), inside
   * the entry so they are charged to it. For the host kind they go in
   * `<root>/sandboxes/<id>/`. Safe to call twice: an existing entry is kept and its
   * limit set again.
   * @param o.diskBytes the quota in bytes, or null for none (ignored without quota support).
   * @throws errno-coded Errors from the ioctls (EEXIST never: an existing entry is reused).
   */
  async create(id: string, o: { diskBytes: number | null }): Promise<WritableLayer> {
    if (this.kind === 'host' || !this.store) return layerIn(path.join(this.root, 'sandboxes', id), 'host');
    this.store.create(id, o.diskBytes ?? 0);
    return layerIn(path.join(this.entriesDir, id), 'store');
  }

  /**
   * Where a sandbox's writable layer is: its store entry, else the host-filesystem
   * layout (`<root>/sandboxes/<id>/upper`, sandboxes from before the store or from
   * upper_fs = "host"), else null (none yet, or destroyed). Never creates anything.
   */
  locate(id: string): WritableLayer | null {
    const isDir = (p: string) => {
      try {
        return statSync(p).isDirectory();
      } catch {
        return false;
      }
    };
    if (this.record) {
      const dir = path.join(this.entriesDir, id);
      if (isDir(path.join(dir, 'upper'))) return { upper: path.join(dir, 'upper'), work: path.join(dir, 'work'), location: 'store' };
    }
    const host = path.join(this.root, 'sandboxes', id);
    if (isDir(path.join(host, 'upper'))) return { upper: path.join(host, 'upper'), work: path.join(host, 'work'), location: 'host' };
    return null;
  }

  /**
   * Removes a sandbox's store entry with everything in it (a host-filesystem layer goes
   * with the sandbox dir, see removeSandboxDir). btrfs: the subvolume is deleted (cost
   * independent of its size on disk); XFS: the directory is renamed into trash/ and
   * deleted in the background, and its project limit cleared. Neither blocks the event
   * loop. The caller must have unmounted the sandbox's overlay first. Safe to call twice
   * and for a sandbox without an entry.
   * @returns whether there was an entry.
   */
  async remove(id: string): Promise<boolean> {
    if (!this.record || !this.store) return false;
    if (!existsSync(path.join(this.entriesDir, id))) {
      this.store.forget(id);
      return false;
    }
    if (!(await this.store.remove(id))) return false;
    forgetLifted(this.liftedDir, id);
    this.store.forget(id);
    return true;
  }

  /** Ids of sandboxes with a store entry, sorted. */
  entries(): string[] {
    if (!this.record) return [];
    try {
      return readdirSync(this.entriesDir).sort();
    } catch {
      return [];
    }
  }

  /**
   * Live disk use of one sandbox's writable layer, or null when the store cannot tell
   * (host filesystem, no quotas, no entry). btrfs: the qgroup's referenced bytes plus its
   * reserved data (written to the page cache, not yet committed), from sysfs; XFS: the
   * project's block count.
   */
  usage(id: string): DiskUsage | null {
    const rec = this.record;
    if (!rec || !this.store || rec.quota === 'none' || !this.store.has(id) || this.locate(id)?.location !== 'store') return null;
    return this.store.usage(id);
  }

  /**
   * Disk use of every sandbox entry with a quota, for the reaper's quota check: btrfs
   * reads every qgroup in one tree search (counters as of the last commit: a write that
   * hits the limit forces one, so a full layer shows at once); XFS asks per project.
   */
  usageAll(): Map<string, DiskUsage> {
    const rec = this.record;
    if (!rec || !this.store || rec.quota === 'none' || this.store.size === 0) return new Map();
    return this.store.usageAll();
  }

  /**
   * Removes store entries of sandboxes not in `known` (leftovers of a crash), btrfs
   * qgroups whose subvolume is gone and is fully freed (kernels that do not drop them
   * on their own), and XFS trash. Safe on a clean store.
   * @returns a description of each removed leftover.
   */
  async cleanOrphans(known: Set<string>): Promise<string[]> {
    const removed: string[] = [];
    if (!this.record || !this.store) return removed;
    for (const id of this.entries()) {
      if (known.has(id)) continue;
      await this.remove(id);
      removed.push(`writable layer ${id} (${this.record.kind} store)`);
    }
    removed.push(...this.store.cleanLeftovers());
    return removed;
  }

  /**
   * `dsecd --purge`: removes every entry, unmounts the store (its loop device detaches
   * itself), and deletes the image and its record. The operator's filesystem
   * (`[storage] path`) only loses dsec's entries. Call after every sandbox is destroyed.
   */
  async purge(): Promise<void> {
    if (!this.record || !this.store) return;
    for (const id of this.entries()) await this.remove(id);
    await this.store.drain();
    if (this.record.external) {
      for (const d of [this.entriesDir, trashDirOf(this.mountDir)]) rmSync(d, { recursive: true, force: true });
      rmSync(path.join(storageDir(this.root), 'store.json'), { force: true });
      rmSync(this.liftedDir, { recursive: true, force: true });
      return;
    }
    unmountImage(this.mountDir, this.imagePath);
    const dir = storageDir(this.root);
    rmSync(path.join(dir, 'store.json'), { force: true });
    rmSync(this.liftedDir, { recursive: true, force: true });
    rmSync(this.imagePath, { force: true });
    try {
      rmdirSync(this.mountDir);
    } catch { /* still a mount point (lazily detached) or not empty: left for the next purge */ }
  }
}
