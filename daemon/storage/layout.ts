/**
 * What the writable-layer store is made of: its config (`[storage]`), its record
 * (`<root>/storage/store.json`), where its parts live on disk, and the shapes its users
 * see (a sandbox's writable layer, its disk use). daemon/storage/writable-layers.ts
 * describes the store as a whole.
 *
 * On-disk layout (all root-only, mode 0700):
 *   <root>/storage/store.json   the store's record (kind, quota mode, size), written last
 *   <root>/storage/lifted/<id>.json  a sandbox quota lifted while its overlay is mounted,
 *                               with the limit to put back (daemon/storage/lifted.ts)
 *   <root>/storage/upper.img    the image (sparse unless `preallocate`; image.ts)
 *   <root>/storage/mnt/         its mount point: one mount per instance
 *   <root>/storage/mnt/sb/<id>/ one sandbox: btrfs subvolume or XFS project directory,
 *                               holding upper/ and work/
 *   <root>/storage/mnt/trash/   XFS directories being deleted in the background
 *   <root>/sandboxes/<id>/upper a layer on the host filesystem (upper_fs = "host", or
 *                               made before the store existed)
 *
 * With `[storage] path` the operator's directory takes the place of `mnt/`.
 */
import { renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Logger } from 'pino';

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
   * Filesystem of new sandboxes' writable layers: `auto` (default; see
   * daemon/storage/writable-layers.ts), `btrfs`, `xfs` or `host`. Read when the store is
   * created; afterwards the recorded kind wins, and naming a different explicit kind is
   * refused at start. `host` with an existing store keeps mounting it for the sandboxes on it.
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

/** Options of {@link WritableLayerStore.open}. */
export interface OpenStoreOptions {
  /** Instance root. */
  root: string;
  config: StorageConfig;
  log: Logger;
}

/**
 * The sandbox entries of a mounted btrfs or XFS store (`<mnt>/sb/<id>`), each with its
 * quota: what differs between the two filesystems (daemon/storage/btrfs.ts,
 * daemon/storage/xfs.ts). Limits are bytes; 0 means none. Methods throw the
 * errno-coded Errors of the ioctls unless they say otherwise.
 */
export interface StoreEntries {
  /** Reads the entries the mounted store holds (their subvolume or project ids); an unreadable one is logged and skipped. */
  load(): void;
  /** True when sandbox `id` has a known entry. */
  has(id: string): boolean;
  /** How many entries are known. */
  readonly size: number;
  /** Creates sandbox `id`'s entry, or finds it, and sets its limit to `limitBytes` where quotas are on. */
  create(id: string, limitBytes: number): void;
  /** The limit set on sandbox `id`'s entry now, or null when it has none. */
  limitOf(id: string): number | null;
  /** Sets the limit of sandbox `id`'s entry (0: none). */
  setLimit(id: string, bytes: number): void;
  /** Live disk use of sandbox `id`'s entry, or null when it cannot be read. */
  usage(id: string): DiskUsage | null;
  /** Disk use of every known entry, by sandbox id. */
  usageAll(): Map<string, DiskUsage>;
  /** Removes the existing entry of sandbox `id` and what is in it; false when it vanished meanwhile. Never blocks the event loop. */
  remove(id: string): Promise<boolean>;
  /** Forgets sandbox `id` (its entry is gone). */
  forget(id: string): void;
  /** Removes what the filesystem keeps beyond the entries (btrfs qgroups of deleted subvolumes, XFS trash); returns a description of each. */
  cleanLeftovers(): string[];
  /** Resolves once background deletions have finished. */
  drain(): Promise<void>;
}

/** `<root>/storage`. */
export function storageDir(root: string): string {
  return path.join(root, 'storage');
}

/** `<mnt>/sb`: one entry per sandbox. */
export function entriesDirOf(mountDir: string): string {
  return path.join(mountDir, 'sb');
}

/** `<mnt>/trash`: XFS entries being deleted. */
export function trashDirOf(mountDir: string): string {
  return path.join(mountDir, 'trash');
}

/** The upper/ and work/ paths of a writable layer kept in `dir`. */
export function layerIn(dir: string, location: 'store' | 'host'): WritableLayer {
  return { upper: path.join(dir, 'upper'), work: path.join(dir, 'work'), location };
}

/** Writes the store's record into `dir` (temp file + rename: a reader sees the old or the new one). */
export function writeRecord(dir: string, rec: StoreRecord): void {
  const f = path.join(dir, 'store.json');
  writeFileSync(`${f}.tmp`, JSON.stringify(rec, null, 1), { mode: 0o600 });
  renameSync(`${f}.tmp`, f);
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

/** Human size for messages: `40 GiB`, `512 MiB`. */
export function gib(n: number): string {
  return n >= 1024 ** 3 ? `${+(n / 1024 ** 3).toFixed(1)} GiB` : `${+(n / 1024 ** 2).toFixed(1)} MiB`;
}

/** Thrown when a store of one kind cannot be made here; `auto` moves on to the next kind. */
export class StoreUnavailable extends Error {}
