/**
 * The writable-layer store: where each sandbox's overlay `upper/` and `work/` live, and
 * what limits how much it can write.
 *
 * Kinds (`[storage] upper_fs`, fixed when the store is created):
 *   - `btrfs`: one loop-mounted btrfs image under the instance root; each sandbox gets a
 *     subvolume with a qgroup whose max-referenced limit is the sandbox's `disk_bytes`
 *     (simple quotas where the kernel has them, Linux 6.7+, else full qgroups). Writes
 *     beyond the limit fail with EDQUOT inside the sandbox; the host disk never sees more
 *     than the image's size. Destroy deletes the subvolume: its size on disk does not
 *     matter (the kernel frees extents in the background); what it has cached in memory
 *     is pruned on a worker thread.
 *   - `xfs`: one loop-mounted XFS image; each sandbox gets a directory with its own
 *     project id and FS_XFLAG_PROJINHERIT, and a project quota of `disk_bytes` — where the
 *     kernel has XFS quota support. Where it has none, the store is still XFS (so
 *     XFS-specific attacks meet a real XFS) and reports that quotas are not enforced.
 *   - `host`: the layout before the store existed: `<root>/sandboxes/<id>/upper` on the
 *     host filesystem, no quota.
 *   - `auto` (default) picks, when the store is first created: XFS if the kernel mounts
 *     it with `prjquota`, else btrfs if quotas can be enabled on it, else host. The
 *     attempt is made on the store's own image, so the probe is the real thing.
 *
 * On-disk layout (all root-only, mode 0700):
 *   <root>/storage/store.json   the store's record (kind, quota mode, size), written last
 *   <root>/storage/lifted/<id>.json  a sandbox quota lifted while its overlay is mounted,
 *                               with the limit to put back (see withRoomToMount)
 *   <root>/storage/upper.img    the image (sparse unless `preallocate`)
 *   <root>/storage/mnt/         its mount point: one mount per instance
 *   <root>/storage/mnt/sb/<id>/ one sandbox: btrfs subvolume or XFS project directory,
 *                               holding upper/ and work/
 *   <root>/storage/mnt/trash/   XFS directories being deleted in the background
 *
 * The image is attached to a loop device with autoclear (it detaches itself when the
 * filesystem is unmounted, including a lazy `umount -l`) and direct I/O (the host page
 * cache does not hold a second copy of what the store caches). It is mounted at every
 * dsecd start, before sandboxes are adopted; a mount left by a previous dsecd (which may
 * have been SIGKILLed while its sandboxes kept running on it) is checked to be this
 * instance's image and reused. Only `dsecd --purge` unmounts it and removes the image.
 *
 * `[storage] path` names a directory on a filesystem the operator mounted instead (a real
 * XFS with `prjquota`, or a btrfs): no image and no loop device, the same entries under
 * `<path>/sb/`; dsecd never mounts or unmounts it.
 *
 * Sandboxes created before the store, or while `upper_fs = "host"`, keep their layer at
 * `<root>/sandboxes/<id>/upper`: {@link UpperStore.locate} finds each sandbox's layer
 * wherever it is, so an upgrade needs no migration.
 */
import { chmodSync, closeSync, existsSync, fsyncSync, mkdirSync, openSync, readFileSync, readdirSync, realpathSync, renameSync, rmdirSync, rmSync, statSync, statfsSync, writeFileSync, writeSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { execa } from 'execa';
import type { Logger } from 'pino';
import { failedPrecondition, internal } from '../errors.js';
import * as native from '../host/native.js';
import { errnoCode } from '../host/native.js';
import { unescapeMountinfo } from '../image/rootfs.js';
import * as fsops from './fsops.js';

/** Smallest store image: 1 GiB (mkfs.xfs refuses below 300 MB; a store smaller than a few sandboxes' layers is no use). */
export const MIN_STORE_BYTES = 1024 ** 3;
/** Cap of the default store size: 1 TiB (an operator who wants more says so with `size_bytes`). */
export const MAX_DEFAULT_STORE_BYTES = 1024 ** 4;

/** statfs f_type of btrfs and XFS (linux/magic.h). */
export const BTRFS_SUPER_MAGIC = 0x9123683e;
export const XFS_SUPER_MAGIC = 0x58465342;

/** How the store filesystem is chosen and sized (`[storage]` in the config). */
export interface StorageConfig {
  /**
   * Filesystem of new sandboxes' writable layers: `auto` (default; see the module
   * comment), `btrfs`, `xfs` or `host`. Read when the store is created; afterwards the
   * recorded kind wins, and naming a different explicit kind is refused at start.
   * `host` with an existing store keeps mounting it for the sandboxes on it.
   */
  upperFs: 'auto' | 'btrfs' | 'xfs' | 'host';
  /**
   * Size of the store image in bytes (at least {@link MIN_STORE_BYTES}), used only when
   * it is created. Null: half of the space free on the filesystem under `<root>` at that
   * moment, at most {@link MAX_DEFAULT_STORE_BYTES} — half, so images, layers and logs
   * keep the other half. The image is sparse: it takes host disk only as sandboxes
   * write, so a size above the free space overcommits the host disk (see `preallocate`).
   */
  sizeBytes: number | null;
  /**
   * Allocate the whole image when it is created (fallocate) instead of leaving it sparse.
   * A sparse image that outgrows the host disk makes the loop device fail writes, and
   * the store filesystem then turns read-only or shuts down for every sandbox on it;
   * preallocating reserves the space up front so that can never happen, at the cost of
   * the space itself. Default false. A preallocated btrfs store is mounted `nodiscard`,
   * so deleted data does not punch holes back into the image.
   */
  preallocate: boolean;
  /**
   * A directory on a filesystem the operator mounted (XFS with `prjquota`, or btrfs),
   * used instead of a loop-mounted image; null (default): the image. Production hosts
   * with a real XFS partition set this (docs/OPERATIONS.md). Fixed once the store exists.
   */
  path: string | null;
  /**
   * Free space of the store kept for sandboxes that are not filling it, bytes
   * (daemon/storage/pool.ts): when less than a writer's headroom is free above it, the
   * writer is limited so that it stops before the reserve. Null (default):
   * pool.ts defaultReserveBytes of the store's size (2%, 256 MiB to 4 GiB). 0 turns the
   * guard off: a full store then fails every sandbox's writes with ENOSPC.
   */
  reserveBytes: number | null;
}

/** Where new writable layers go. */
export type StoreKind = 'btrfs' | 'xfs' | 'host';

/** How the store limits a sandbox: btrfs simple quotas, full qgroups, XFS project quota, or not at all. */
export type QuotaMode = 'squota' | 'qgroup' | 'prjquota' | 'none';

/** `<root>/storage/store.json`: what was created, so every later start mounts it the same way. */
export interface StoreRecord {
  version: 1;
  kind: 'btrfs' | 'xfs';
  quota: QuotaMode;
  /** Why `quota` is `none` (what the kernel refused), else null. */
  quotaReason: string | null;
  /** Image size, bytes. */
  sizeBytes: number;
  preallocated: boolean;
  /** The operator's directory (`[storage] path`), or null: the instance's loop-mounted image. */
  external: string | null;
  /** ms since the epoch. */
  createdAt: number;
}

/**
 * `<root>/storage/lifted/<id>.json`: the quota of sandbox `id` is lifted while its
 * overlay is mounted ({@link UpperStore.withRoomToMount}); written (and fsynced) before
 * the lift and removed once the limit is back, so a dsecd that dies in between leaves
 * it for the next start, which puts the limit back ({@link UpperStore.open}).
 */
interface LiftedQuota {
  version: 1;
  /** The sandbox (also the file's name). */
  id: string;
  /** The limit in force before the lift, bytes: btrfs max-referenced or XFS block hard limit. */
  limitBytes: number;
  /** When it was lifted, ms since the epoch (for the operator reading the file). */
  liftedAt: number;
}

/** A sandbox's writable layer: overlay upper and work dirs (same filesystem), and where they live. */
export interface WritableLayer {
  upper: string;
  work: string;
  /** `store`: in the store's mount; `host`: in the sandbox dir on the host filesystem. */
  location: 'store' | 'host';
}

/** Disk use of a sandbox's writable layer, bytes. */
export interface DiskUsage {
  /** Bytes charged to the layer: btrfs referenced plus reserved-but-unwritten data, or XFS project blocks. */
  usedBytes: number;
  /** The quota, or null when none is set. */
  limitBytes: number | null;
}

/** Whether a defence is in force, and what it does or why not (schema DefenceStatus). */
export interface DefenceStatus {
  enforced: boolean;
  detail: string;
}

/** Options of {@link UpperStore.open}. */
export interface OpenStoreOptions {
  /** Instance root. */
  root: string;
  config: StorageConfig;
  log: Logger;
}

/** Mount options per store: noatime everywhere; discard returns freed blocks of a sparse btrfs image to the host. */
function mountOptions(rec: StoreRecord): { fstype: string; data: string } {
  if (rec.kind === 'btrfs') return { fstype: 'btrfs', data: rec.preallocated ? 'nodiscard' : 'discard=async' };
  return { fstype: 'xfs', data: rec.quota === 'prjquota' ? 'prjquota' : '' };
}

/** Human size for messages: `40 GiB`, `512 MiB`. */
function gib(n: number): string {
  return n >= 1024 ** 3 ? `${+(n / 1024 ** 3).toFixed(1)} GiB` : `${+(n / 1024 ** 2).toFixed(1)} MiB`;
}

/**
 * The default store size for `freeBytes` free on the host filesystem: half of it, whole
 * MiB, at most {@link MAX_DEFAULT_STORE_BYTES}; null when that is below
 * {@link MIN_STORE_BYTES} (the host has no room for a store).
 */
export function defaultStoreBytes(freeBytes: number): number | null {
  const half = Math.floor(freeBytes / 2 / 1024 ** 2) * 1024 ** 2;
  const size = Math.min(half, MAX_DEFAULT_STORE_BYTES);
  return size >= MIN_STORE_BYTES ? size : null;
}

/**
 * The source device of the mount at `mnt` in /proc/self/mountinfo (`/dev/loop3`), or
 * null when nothing is mounted there. The last matching line wins (the top of a stack).
 */
export function mountSourceOf(mountinfo: string, mnt: string): string | null {
  let src: string | null = null;
  for (const line of mountinfo.split('\n')) {
    const f = line.split(' ');
    if (f.length < 10 || unescapeMountinfo(f[4]) !== mnt) continue;
    const dash = f.indexOf('-', 6);
    if (dash > 0 && f[dash + 2] !== undefined) src = unescapeMountinfo(f[dash + 2]);
  }
  return src;
}

/** The file a loop device is attached to (/sys/block/loopN/loop/backing_file), or null when detached. */
export function loopBackingFile(device: string): string | null {
  const m = /^\/dev\/(loop\d+)$/.exec(device);
  if (!m) return null;
  try {
    return readFileSync(`/sys/block/${m[1]}/loop/backing_file`, 'utf8').trim();
  } catch {
    return null;
  }
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

/** Thrown when a store of `kind` cannot be made here; `auto` moves on to the next kind. */
class StoreUnavailable extends Error {}

/** The writable-layer store of one dsecd instance. */
export class UpperStore {
  /** Subvolume id (btrfs) or project id (XFS) of each sandbox entry: for usage lookups. */
  private readonly ids = new Map<string, number>();
  /** XFS: the next project id to give (above every id in sb/ and trash/). */
  private nextProjid = 1;
  /** XFS: background deletions of trash entries, awaited by purge. */
  private readonly deleting = new Set<Promise<void>>();
  /** btrfs: /sys/fs/btrfs/<uuid>/qgroups, for live usage (referenced plus reservations). */
  private qgroupSysfs: string | null = null;
  /** The store's block device once found ({@link blockDevice}); undefined: not looked up yet. */
  private device: { major: number; minor: number; name: string } | null | undefined = undefined;

  private constructor(
    private readonly root: string,
    /** Where new sandboxes' layers go. */
    readonly kind: StoreKind,
    /** The mounted store, or null (no store: every layer is on the host filesystem). */
    readonly record: StoreRecord | null,
    /** Why the kind is what it is, when `auto` or the record decided (for host info). */
    private readonly note: string | null,
    private readonly log: Logger,
  ) {}

  /** `<root>/storage`. */
  static dirOf(root: string): string {
    return path.join(root, 'storage');
  }

  /** The store's directory: its image's mount point `<root>/storage/mnt`, or the operator's `[storage] path`. */
  get mountDir(): string {
    return this.record?.external ?? path.join(UpperStore.dirOf(this.root), 'mnt');
  }

  /** The store's image, `<root>/storage/upper.img`. */
  get imagePath(): string {
    return path.join(UpperStore.dirOf(this.root), 'upper.img');
  }

  /** `<mnt>/sb`: one entry per sandbox. */
  private get entriesDir(): string {
    return path.join(this.mountDir, 'sb');
  }

  private get trashDir(): string {
    return path.join(this.mountDir, 'trash');
  }

  /** `<root>/storage/lifted`: quotas lifted for an overlay mount and not yet put back ({@link LiftedQuota}). */
  private get liftedDir(): string {
    return path.join(UpperStore.dirOf(this.root), 'lifted');
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
  static async open(opts: OpenStoreOptions): Promise<UpperStore> {
    const dir = UpperStore.dirOf(opts.root);
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
      const s = new UpperStore(opts.root, want === 'host' ? 'host' : rec.kind, rec, want === 'host' ? 'upper_fs = "host": new sandboxes use the host filesystem; sandboxes already on the store keep it' : null, opts.log);
      await s.mount();
      await s.load();
      return s;
    }
    if (want === 'host') return new UpperStore(opts.root, 'host', null, 'upper_fs = "host"', opts.log);
    if (extPath) {
      const made = UpperStore.adopt(extPath, want, opts.log);
      writeRecord(dir, made);
      const s = new UpperStore(opts.root, made.kind, made, null, opts.log);
      await s.load();
      opts.log.info({ kind: made.kind, quota: made.quota, path: extPath }, 'using the operator\'s filesystem as the writable-layer store');
      return s;
    }
    const order: ('xfs' | 'btrfs')[] = want === 'auto' ? ['xfs', 'btrfs'] : [want];
    const refused: string[] = [];
    for (const kind of order) {
      try {
        const made = await UpperStore.create(opts, kind, want === 'auto');
        const s = new UpperStore(opts.root, kind, made, want === 'auto' && refused.length ? `auto: ${refused.join('; ')}` : null, opts.log);
        await s.load();
        opts.log.info({ kind, quota: made.quota, sizeBytes: made.sizeBytes, preallocated: made.preallocated, image }, 'created the writable-layer store');
        return s;
      } catch (e) {
        if (!(e instanceof StoreUnavailable)) throw e;
        refused.push(`${kind}: ${e.message}`);
      }
    }
    const note = `auto found no filesystem with per-sandbox quotas (${refused.join('; ')})`;
    opts.log.warn({ reasons: refused }, 'writable layers stay on the host filesystem without quotas');
    return new UpperStore(opts.root, 'host', null, note, opts.log);
  }

  /**
   * Makes the image, formats and mounts it, and turns quotas on. With `needQuota` (auto),
   * a filesystem whose quotas the kernel refuses is removed again and StoreUnavailable
   * thrown; otherwise the store is kept with quota `none` and the reason recorded.
   */
  private static async create(opts: OpenStoreOptions, kind: 'btrfs' | 'xfs', needQuota: boolean): Promise<StoreRecord> {
    const dir = UpperStore.dirOf(opts.root);
    const mnt = path.join(dir, 'mnt');
    const image = path.join(dir, 'upper.img');
    const cfg = opts.config;
    const unavailable = (msg: string) => (needQuota ? new StoreUnavailable(msg) : failedPrecondition(`cannot create the ${kind} writable-layer store: ${msg}`));
    const st = statfsSync(dir);
    const free = st.bavail * st.bsize;
    const size = cfg.sizeBytes ?? defaultStoreBytes(free);
    if (size === null) throw unavailable(`the host filesystem under ${dir} has ${gib(free)} free; a store needs twice ${gib(MIN_STORE_BYTES)} (or set [storage] size_bytes)`);
    if (size > free) opts.log.warn({ sizeBytes: size, freeBytes: free }, 'the writable-layer store is larger than the free host disk: a full store would fill the host disk first (see [storage] preallocate)');
    const tmp = `${image}.tmp`;
    rmSync(tmp, { force: true });
    writeFileSync(tmp, '', { mode: 0o600 });
    try {
      if (cfg.preallocate) {
        const r = await execa('fallocate', ['-l', String(size), tmp], { reject: false });
        if (r.failed) throw failedPrecondition(`preallocating ${gib(size)} for the writable-layer store failed: ${String(r.stderr).trim() || r.message}; free host disk or lower [storage] size_bytes`);
      } else {
        const r = await execa('truncate', ['-s', String(size), tmp], { reject: false });
        if (r.failed) throw internal(`sizing the writable-layer store image failed: ${String(r.stderr).trim() || r.message}`);
      }
      const mkfs = kind === 'btrfs' ? ['mkfs.btrfs', ['-q', '-f', '-L', 'dsec-upper', tmp]] as const : ['mkfs.xfs', ['-q', '-f', '-L', 'dsec-upper', tmp]] as const;
      const r = await execa(mkfs[0], [...mkfs[1]], { reject: false });
      if (r.failed) {
        const why = (r as { code?: string }).code === 'ENOENT' ? `${mkfs[0]} is not installed (apt install ${kind === 'btrfs' ? 'btrfs-progs' : 'xfsprogs'})` : `${mkfs[0]} failed: ${String(r.stderr).trim() || r.message}`;
        throw unavailable(why);
      }
      renameSync(tmp, image);
    } catch (e) {
      rmSync(tmp, { force: true });
      throw e;
    }
    const rec: StoreRecord = { version: 1, kind, quota: 'none', quotaReason: null, sizeBytes: size, preallocated: cfg.preallocate, external: null, createdAt: Date.now() };
    mkdirSync(mnt, { recursive: true, mode: 0o700 });
    try {
      if (kind === 'xfs') {
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
    if (kind === 'btrfs') {
      const mode = (() => {
        try {
          return readFileSync(`/sys/fs/btrfs/${fsops.btrfsFsid(dir)}/qgroups/mode`, 'utf8').trim();
        } catch {
          return null; // quotas are off (no qgroups directory)
        }
      })();
      rec.quota = mode === 'squota' ? 'squota' : mode === 'qgroup' ? 'qgroup' : enableBtrfsQuota(dir, rec);
    } else {
      try {
        if (fsops.xfsQuotaState(dir).enforcing) rec.quota = 'prjquota';
        else rec.quotaReason = `${dir} is on an XFS mounted without project quota enforcement; remount it with -o prjquota`;
      } catch (e) {
        rec.quotaReason = `the kernel has no XFS quota (${errnoCode(e) ?? (e as Error).message})`;
      }
    }
    if (rec.quota === 'none') log.warn({ path: dir, reason: rec.quotaReason }, 'the operator\'s writable-layer filesystem enforces no per-sandbox quota');
    for (const d of ['sb', 'trash']) mkdirSync(path.join(dir, d), { recursive: true, mode: 0o700 });
    return rec;
  }

  /** Mounts the recorded store unless the mount a previous dsecd left is already there (and is this image). */
  private async mount(): Promise<void> {
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
    if (native.isMountpointOrMissing(mnt)) {
      const src = mountSourceOf(readFileSync('/proc/self/mountinfo', 'utf8'), mnt);
      const backing = src ? loopBackingFile(src) : null;
      if (backing !== this.imagePath) {
        throw failedPrecondition(`${mnt} is mounted from ${src ?? 'an unknown source'}${backing ? ` (${backing})` : ''}, not from this instance's store ${this.imagePath}; unmount it and start again`);
      }
      return;
    }
    if (!existsSync(this.imagePath)) {
      throw failedPrecondition(`the writable-layer store image ${this.imagePath} is missing although ${path.join(UpperStore.dirOf(this.root), 'store.json')} records it; sandboxes on it lost their writable layers. Restore the image, or purge the instance (dsecd --purge)`);
    }
    try {
      attachAndMount(this.imagePath, mnt, mountOptions(rec));
    } catch (e) {
      throw failedPrecondition(`mounting the writable-layer store ${this.imagePath} at ${mnt} failed: ${(e as Error).message}; check the kernel log`, { cause: e });
    }
  }

  /** Reads what the mounted store holds: entry ids and their subvolume/project ids. */
  private async load(): Promise<void> {
    const rec = this.record;
    if (!rec) return;
    for (const d of [this.entriesDir, this.trashDir]) mkdirSync(d, { recursive: true, mode: 0o700 });
    if (rec.kind === 'btrfs') {
      try {
        this.qgroupSysfs = `/sys/fs/btrfs/${fsops.btrfsFsid(this.mountDir)}/qgroups`;
      } catch (e) {
        this.log.warn({ err: e }, 'btrfs fsid unknown: disk usage falls back to committed qgroup counters');
      }
    }
    let max = 0;
    for (const d of [this.entriesDir, this.trashDir]) {
      for (const name of readdirSync(d)) {
        const p = path.join(d, name);
        try {
          if (rec.kind === 'btrfs') {
            if (d === this.entriesDir) this.ids.set(name, fsops.btrfsSubvolId(p));
          } else {
            const pid = fsops.fsGetProject(p).projid;
            if (d === this.entriesDir) this.ids.set(name, pid);
            max = Math.max(max, pid);
          }
        } catch (e) {
          this.log.warn({ err: e, entry: p }, 'unreadable writable-layer entry');
        }
      }
    }
    this.nextProjid = max + 1;
    this.restoreLifted();
  }

  /**
   * Puts back every quota a previous dsecd lifted for an overlay mount and did not
   * restore (it died inside {@link withRoomToMount}), before any sandbox is adopted or
   * started. A record whose entry is gone is dropped. A limit the kernel refuses to set
   * is logged and its record kept: the sandbox's next start retries it and fails while
   * it cannot, so no sandbox runs with its quota lifted.
   */
  private restoreLifted(): void {
    let names: string[];
    try {
      names = readdirSync(this.liftedDir);
    } catch {
      return; // none yet
    }
    for (const name of names) {
      const file = path.join(this.liftedDir, name);
      // A record never renamed into place: its lift was never made.
      if (name.endsWith('.tmp')) {
        rmSync(file, { force: true });
        continue;
      }
      const l = readLifted(file);
      if (!l) {
        this.log.error({ file }, 'unreadable record of a lifted sandbox quota: set the limit of that sandbox by hand, then delete the file');
        continue;
      }
      if (!this.ids.has(l.id)) {
        rmSync(file, { force: true });
        continue;
      }
      try {
        this.setLimit(l.id, l.limitBytes);
      } catch (e) {
        this.log.error({ err: e, id: l.id, limitBytes: l.limitBytes }, 'putting back a sandbox quota left lifted by an interrupted start failed; its next start retries');
        continue;
      }
      rmSync(file, { force: true });
      this.log.warn({ id: l.id, limitBytes: l.limitBytes }, 'put back a sandbox quota left lifted by an interrupted start');
    }
  }

  /**
   * The limit now set on a sandbox's store entry, bytes, or null when it has none. btrfs:
   * the qgroup's max_referenced in sysfs (in memory, so exact at once), else the quota
   * tree; XFS: the project's block hard limit.
   * @throws errno-coded Errors from the ioctls.
   */
  private limitOf(id: string): number | null {
    const dir = path.join(this.entriesDir, id);
    if (this.record!.kind === 'btrfs') {
      const sid = this.ids.get(id) ?? fsops.btrfsSubvolId(dir);
      const sysfs = this.qgroupSysfs ? readCounter(`${this.qgroupSysfs}/0_${sid}/max_referenced`) : null;
      const max = sysfs ?? fsops.btrfsQgroups(this.mountDir).find((q) => q.id === sid)?.maxReferenced ?? 0;
      return max > 0 ? max : null;
    }
    const u = fsops.xfsProjectUsage(this.mountDir, this.ids.get(id) ?? fsops.fsGetProject(dir).projid);
    return u && u.hardLimitBytes > 0 ? u.hardLimitBytes : null;
  }

  /** Sets the limit of a sandbox's store entry to `bytes` (0: none). @throws errno-coded Errors from the ioctls. */
  private setLimit(id: string, bytes: number): void {
    const dir = path.join(this.entriesDir, id);
    if (this.record!.kind === 'btrfs') fsops.btrfsQgroupLimit(dir, bytes);
    else fsops.xfsSetProjectLimit(this.mountDir, this.ids.get(id) ?? fsops.fsGetProject(dir).projid, bytes);
  }

  /**
   * Runs `mount` (the overlay mount of sandbox `id`) with the layer's quota lifted, and
   * puts the limit back before returning. Why: overlayfs creates and cleans its work dir
   * (`work/work`) at every mount, and on a layer at its quota that fails with EDQUOT, so
   * the overlay comes up read-only: a sandbox that filled its disk could never start
   * again to delete a file. With the limit lifted for those few milliseconds the mount is
   * read-write; once it is back the layer is over or at its quota again, so writes still
   * fail with EDQUOT, and deleting frees room. Nothing of the sandbox runs during the
   * window (it is not started yet), so nothing else can write past the quota.
   *
   * Crash safety: the limit is read from the kernel and recorded in
   * `<root>/storage/lifted/<id>.json` (fsynced) before it is lifted, and the record is
   * removed after it is back; a dsecd that dies in between leaves the record, and the
   * next {@link open} puts the limit back before any sandbox starts. A record already
   * there (its restore failed) is the limit to put back.
   *
   * Without a quota on the entry (no quotas, no limit, layer on the host filesystem)
   * `mount` just runs. `mount`'s own error is rethrown after the limit is back.
   * @throws DsecError Internal when the limit cannot be put back (the record stays, so
   *   the next start of dsecd or of the sandbox retries); the caller must then not start
   *   the sandbox (the container driver's start fails and tears the overlay down).
   */
  async withRoomToMount<T>(id: string, mount: () => Promise<T>): Promise<T> {
    const rec = this.record;
    if (!rec || rec.quota === 'none' || this.locate(id)?.location !== 'store') return mount();
    const file = path.join(this.liftedDir, `${id}.json`);
    const pending = readLifted(file);
    const limit = pending?.limitBytes ?? this.limitOf(id);
    if (limit === null) return mount();
    if (!pending) {
      const l: LiftedQuota = { version: 1, id, limitBytes: limit, liftedAt: Date.now() };
      writeDurably(this.liftedDir, `${id}.json`, JSON.stringify(l));
    }
    this.setLimit(id, 0);
    let result!: T;
    let failure: { e: unknown } | null = null;
    try {
      result = await mount();
    } catch (e) {
      failure = { e };
    }
    try {
      this.setLimit(id, limit);
    } catch (e) {
      if (failure) this.log.warn({ err: failure.e, id }, 'the overlay mount failed while the quota was lifted');
      throw internal(`putting back the ${limit}-byte quota of sandbox ${id} after mounting its overlay failed (${(e as Error).message}); the sandbox is not started, and the next start of dsecd or of the sandbox puts it back (${file})`, e);
    }
    rmSync(file, { force: true });
    if (failure) throw failure.e;
    return result;
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
    this.device = this.findBlockDevice();
    return this.device;
  }

  /** {@link blockDevice}, uncached. */
  private findBlockDevice(): { major: number; minor: number; name: string } | null {
    if (!this.record) return null;
    const mi = readFileSync('/proc/self/mountinfo', 'utf8');
    let src = mountSourceOf(mi, this.mountDir);
    if (src === null && this.record.external) {
      // The operator's directory may be below its filesystem's mount point: take the longest mount prefix.
      let best = '';
      for (const line of mi.split('\n')) {
        const f = line.split(' ');
        const mp = f[4] ? unescapeMountinfo(f[4]) : '';
        if (mp && (this.mountDir === mp || this.mountDir.startsWith(mp.endsWith('/') ? mp : `${mp}/`)) && mp.length >= best.length) {
          best = mp;
        }
      }
      src = best ? mountSourceOf(mi, best) : null;
    }
    const m = src ? /^\/dev\/(.+)$/.exec(src) : null;
    if (!m) return null;
    const name = path.basename(m[1]);
    try {
      // A partition's sysfs dir lies under its disk's: /sys/class/block/vda1 -> .../block/vda/vda1.
      const sys = realpathSync(`/sys/class/block/${name}`);
      const disk = existsSync(path.join(sys, 'partition')) ? path.dirname(sys) : sys;
      const [major, minor] = readFileSync(path.join(disk, 'dev'), 'utf8').trim().split(':').map(Number);
      return Number.isInteger(major) && Number.isInteger(minor) ? { major, minor, name: path.basename(disk) } : null;
    } catch {
      return null;
    }
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
    if (!this.record || this.record.quota === 'none' || !this.ids.has(id)) return false;
    if (existsSync(path.join(this.liftedDir, `${id}.json`))) return false;
    this.setLimit(id, Math.max(1, bytes));
    return true;
  }

  /** The limit the kernel enforces on sandbox `id`'s store entry now, bytes, or null (none, no entry, no quotas). */
  currentLimit(id: string): number | null {
    if (!this.record || this.record.quota === 'none' || !this.ids.has(id)) return null;
    try {
      return this.limitOf(id);
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
    if (this.kind === 'host') return layerIn(path.join(this.root, 'sandboxes', id), 'host');
    const rec = this.record!;
    const dir = path.join(this.entriesDir, id);
    if (rec.kind === 'btrfs') {
      if (!existsSync(dir)) {
        try {
          fsops.btrfsSubvolCreate(this.entriesDir, id);
        } catch (e) {
          if (errnoCode(e) !== 'EEXIST') throw e;
        }
      }
      if (rec.quota !== 'none') fsops.btrfsQgroupLimit(dir, o.diskBytes ?? 0);
      this.ids.set(id, fsops.btrfsSubvolId(dir));
    } else {
      mkdirSync(dir, { recursive: true, mode: 0o700 });
      let projid = fsops.fsGetProject(dir).projid;
      if (projid === 0) projid = this.nextProjid++;
      fsops.fsSetProject(dir, projid, true);
      if (rec.quota === 'prjquota') fsops.xfsSetProjectLimit(this.mountDir, projid, o.diskBytes ?? 0);
      this.ids.set(id, projid);
    }
    if (rec.kind === 'btrfs') chmodSync(dir, 0o700); // a new subvolume's root is 0755
    return layerIn(dir, 'store');
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
   * independent of its size on disk; see fsops.btrfsSubvolDestroy); XFS: the directory
   * is renamed into trash/ and deleted in the background, and its project limit
   * cleared. Neither blocks the event loop. The caller must have unmounted the sandbox's
   * overlay first. Safe to call twice and for a sandbox without an entry.
   * @returns whether there was an entry.
   */
  async remove(id: string): Promise<boolean> {
    if (!this.record) return false;
    const dir = path.join(this.entriesDir, id);
    if (!existsSync(dir)) {
      this.ids.delete(id);
      return false;
    }
    if (this.record.kind === 'btrfs') {
      try {
        await fsops.btrfsSubvolDestroy(this.entriesDir, id);
      } catch (e) {
        // Not a subvolume (EINVAL): a plain directory someone made there.
        if (errnoCode(e) === 'ENOENT') return false;
        if (errnoCode(e) !== 'EINVAL') throw e;
        await rm(dir, { recursive: true, force: true });
      }
    } else {
      const projid = this.ids.get(id) ?? fsops.fsGetProject(dir).projid;
      const to = path.join(this.trashDir, `${id}.${randomBytes(4).toString('hex')}`);
      renameSync(dir, to);
      if (this.record.quota === 'prjquota' && projid) {
        try {
          fsops.xfsSetProjectLimit(this.mountDir, projid, 0);
        } catch (e) {
          this.log.warn({ err: e, id, projid }, 'clearing a project quota failed');
        }
      }
      this.purgeInBackground(to);
    }
    rmSync(path.join(this.liftedDir, `${id}.json`), { force: true });
    this.ids.delete(id);
    return true;
  }

  /** Deletes a trash entry without holding up the caller; purge waits for all of them. */
  private purgeInBackground(p: string): void {
    const done: Promise<void> = rm(p, { recursive: true, force: true })
      .catch((e) => this.log.warn({ err: e, path: p }, 'deleting a removed writable layer failed'))
      .finally(() => this.deleting.delete(done));
    this.deleting.add(done);
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
    const sid = this.ids.get(id);
    if (!rec || rec.quota === 'none' || sid === undefined || this.locate(id)?.location !== 'store') return null;
    if (rec.kind === 'btrfs') {
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
    try {
      const u = fsops.xfsProjectUsage(this.mountDir, sid);
      return u ? { usedBytes: u.usedBytes, limitBytes: u.hardLimitBytes > 0 ? u.hardLimitBytes : null } : { usedBytes: 0, limitBytes: null };
    } catch {
      return null;
    }
  }

  /**
   * Disk use of every sandbox entry with a quota, for the reaper's quota check: btrfs
   * reads every qgroup in one tree search (counters as of the last commit: a write that
   * hits the limit forces one, so a full layer shows at once); XFS asks per project.
   */
  usageAll(): Map<string, DiskUsage> {
    const out = new Map<string, DiskUsage>();
    const rec = this.record;
    if (!rec || rec.quota === 'none' || this.ids.size === 0) return out;
    if (rec.kind === 'btrfs') {
      const byId = new Map(fsops.btrfsQgroups(this.mountDir).map((q) => [q.id, q] as const));
      for (const [id, sid] of this.ids) {
        const q = byId.get(sid);
        if (q) out.set(id, { usedBytes: q.referenced, limitBytes: q.maxReferenced });
      }
      return out;
    }
    for (const [id, projid] of this.ids) {
      try {
        const u = fsops.xfsProjectUsage(this.mountDir, projid);
        if (u) out.set(id, { usedBytes: u.usedBytes, limitBytes: u.hardLimitBytes > 0 ? u.hardLimitBytes : null });
      } catch { /* entry vanished */ }
    }
    return out;
  }

  /**
   * Removes store entries of sandboxes not in `known` (leftovers of a crash), btrfs
   * qgroups whose subvolume is gone and is fully freed (kernels that do not drop them
   * on their own), and XFS trash. Safe on a clean store.
   * @returns a description of each removed leftover.
   */
  async cleanOrphans(known: Set<string>): Promise<string[]> {
    const removed: string[] = [];
    if (!this.record) return removed;
    for (const id of this.entries()) {
      if (known.has(id)) continue;
      await this.remove(id);
      removed.push(`writable layer ${id} (${this.record.kind} store)`);
    }
    if (this.record.kind === 'btrfs' && this.record.quota !== 'none') {
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
    }
    if (this.record.kind === 'xfs') {
      for (const name of readdirSync(this.trashDir)) this.purgeInBackground(path.join(this.trashDir, name));
    }
    return removed;
  }

  /**
   * `dsecd --purge`: removes every entry, unmounts the store (its loop device detaches
   * itself), and deletes the image and its record. The operator's filesystem
   * (`[storage] path`) only loses dsec's entries. Call after every sandbox is destroyed.
   */
  async purge(): Promise<void> {
    if (!this.record) return;
    for (const id of this.entries()) await this.remove(id);
    await Promise.all([...this.deleting]);
    if (this.record.external) {
      for (const d of [this.entriesDir, this.trashDir]) rmSync(d, { recursive: true, force: true });
      rmSync(path.join(UpperStore.dirOf(this.root), 'store.json'), { force: true });
      rmSync(this.liftedDir, { recursive: true, force: true });
      return;
    }
    const src = mountSourceOf(readFileSync('/proc/self/mountinfo', 'utf8'), this.mountDir);
    native.unmountAll(this.mountDir);
    // Autoclear detaches the device once the filesystem lets go of it; a device that was
    // attached without autoclear (by hand) is detached here.
    if (src && loopBackingFile(src) === this.imagePath) {
      try {
        fsops.loopDetach(src);
      } catch (e) {
        if (errnoCode(e) !== 'ENXIO' && errnoCode(e) !== 'ENOENT') throw e;
      }
    }
    const dir = UpperStore.dirOf(this.root);
    rmSync(path.join(dir, 'store.json'), { force: true });
    rmSync(this.liftedDir, { recursive: true, force: true });
    rmSync(this.imagePath, { force: true });
    try {
      rmdirSync(this.mountDir);
    } catch { /* still a mount point (lazily detached) or not empty: left for the next purge */ }
  }
}

/** Mounts a just-made store; a failure (no such filesystem in this kernel, no loop device) is `unavailable`'s error. */
function mountNew(image: string, mnt: string, rec: StoreRecord, unavailable: (msg: string) => Error): void {
  try {
    attachAndMount(image, mnt, mountOptions(rec));
  } catch (e) {
    throw unavailable(`mounting it failed (${(e as Error).message})`);
  }
}

/** The upper/ and work/ paths of a writable layer kept in `dir`. */
function layerIn(dir: string, location: 'store' | 'host'): WritableLayer {
  return { upper: path.join(dir, 'upper'), work: path.join(dir, 'work'), location };
}

/** The lifted-quota record in `file`, or null when there is none or it is unreadable. */
function readLifted(file: string): LiftedQuota | null {
  try {
    const l = JSON.parse(readFileSync(file, 'utf8')) as LiftedQuota;
    return typeof l.id === 'string' && Number.isSafeInteger(l.limitBytes) && l.limitBytes > 0 ? l : null;
  } catch {
    return null;
  }
}

/**
 * Writes `data` to `<dir>/<name>` so that it survives a crash of dsecd or of the host
 * once this returns: temp file, fsync, rename, fsync of the directory (mode 0600, `dir`
 * made 0700 when missing).
 */
function writeDurably(dir: string, name: string, data: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const f = path.join(dir, name);
  const fd = openSync(`${f}.tmp`, 'w', 0o600);
  try {
    writeSync(fd, data);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(`${f}.tmp`, f);
  const dfd = openSync(dir, 'r');
  try {
    fsyncSync(dfd);
  } finally {
    closeSync(dfd);
  }
}

/** Writes the store's record into `dir` (temp file + rename: a reader sees the old or the new one). */
function writeRecord(dir: string, rec: StoreRecord): void {
  const f = path.join(dir, 'store.json');
  writeFileSync(`${f}.tmp`, JSON.stringify(rec, null, 1), { mode: 0o600 });
  renameSync(`${f}.tmp`, f);
}

/**
 * Attaches `image` to a free loop device (autoclear, direct I/O) and mounts it at `mnt`.
 * If the mount fails the device detaches itself when its fd is closed here.
 * @throws the errno-coded Error of the loop setup or of mount(2).
 */
function attachAndMount(image: string, mnt: string, o: { fstype: string; data: string }): void {
  const { device, fd } = fsops.loopAttach(image, true);
  try {
    native.mount(device, mnt, o.fstype, native.constants().MS_NOATIME, o.data || null);
  } finally {
    closeSync(fd);
  }
}

/**
 * Enables quotas on the btrfs store at `mnt`: simple quotas where the kernel has them,
 * else full qgroups. Returns the mode, or `none` with `rec.quotaReason` set.
 */
function enableBtrfsQuota(mnt: string, rec: StoreRecord): QuotaMode {
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

