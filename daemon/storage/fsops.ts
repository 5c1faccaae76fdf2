/**
 * Typed access to the addon's filesystem operations (native/addon/fsops.c): btrfs
 * subvolumes and qgroups, project ids, XFS project quotas. Each call is one or a few
 * ioctls/quotactls, synchronous and short (tens of microseconds here), so the per-sandbox
 * work of the writable-layer store spawns no process.
 *
 * Errors are the addon's: an `Error` whose `code` is the errno name (read it with
 * errnoCode from daemon/host/native.ts), with `syscall` naming the ioctl and `path`.
 * A missing addon throws FailedPrecondition (see addonModule).
 */
import { addonModule } from '../host/native.js';

/** One level-0 btrfs qgroup, as committed in the quota tree (counters lag the page cache until a transaction commits). */
export interface BtrfsQgroup {
  /** The qgroup id's low part: the subvolume id of qgroup 0/<id>. */
  id: number;
  /** Bytes referenced by the subvolume (data and its tree blocks). */
  referenced: number;
  /** Bytes referenced by this subvolume only. */
  exclusive: number;
  /** The max-referenced limit in bytes, or null when there is none. */
  maxReferenced: number | null;
}

/** XFS project quota state of a mount (Q_XGETQSTATV). */
export interface XfsQuotaState {
  /** Project usage is accounted (mounted with `prjquota`/`pquota`). */
  accounting: boolean;
  /** Project limits are enforced. */
  enforcing: boolean;
}

interface FsAddon {
  btrfsQuotaEnable(mnt: string, simple: boolean): void;
  btrfsSubvolCreate(parentDir: string, name: string): void;
  btrfsSubvolDestroy(parentDir: string, name: string): Promise<void>;
  btrfsSubvolId(path: string): number;
  btrfsQgroupLimit(mnt: string, qgroupid: number, bytes: number): void;
  btrfsQgroupRemove(mnt: string, qgroupid: number): void;
  btrfsQgroups(mnt: string): BtrfsQgroup[];
  btrfsFsid(mnt: string): string;
  fsGetProject(path: string): { projid: number; inherit: boolean };
  fsSetProject(path: string, projid: number, inherit: boolean): void;
  xfsQuotaState(mnt: string): XfsQuotaState;
  xfsSetProjectLimit(mnt: string, projid: number, bytes: number): void;
  xfsProjectUsage(mnt: string, projid: number): { usedBytes: number; hardLimitBytes: number } | null;
  loopAttach(image: string, directIo: boolean): { device: string; fd: number };
  loopDetach(device: string): void;
}

const fs = (): FsAddon => addonModule() as unknown as FsAddon;

/**
 * Turns quotas on for the btrfs filesystem mounted at `mnt`: simple quotas (squota,
 * Linux 6.7+: usage is charged to the subvolume that allocated an extent, with no
 * backref walks, so accounting and subvolume deletion stay cheap) when `simple`, else
 * full qgroups. Safe to call on a filesystem that already has quotas of that mode.
 * Throws EINVAL when the kernel does not know simple quotas, EOPNOTSUPP/ENOTTY when
 * the filesystem is not btrfs.
 */
export function btrfsQuotaEnable(mnt: string, simple: boolean): void {
  fs().btrfsQuotaEnable(mnt, simple);
}

/** Creates the subvolume `<parentDir>/<name>` (root-owned, mode 0755). Throws EEXIST when it exists. */
export function btrfsSubvolCreate(parentDir: string, name: string): void {
  fs().btrfsSubvolCreate(parentDir, name);
}

/**
 * Deletes the subvolume `<parentDir>/<name>` with everything in it, on a libuv worker
 * thread. The name is gone when the promise resolves; the kernel's cleaner thread frees
 * the extents afterwards (on-disk size costs the caller nothing) and drops its level-0
 * qgroup once they are freed. The ioctl does prune the subvolume's inodes and page cache
 * still in memory, which takes time proportional to them (measured: 8 ms for 100k files
 * and 256 MiB cold, 470 ms hot), hence off the JS thread. Rejects ENOENT when missing,
 * ENOTEMPTY when it holds another subvolume, EINVAL when it is not a subvolume.
 */
export function btrfsSubvolDestroy(parentDir: string, name: string): Promise<void> {
  return fs().btrfsSubvolDestroy(parentDir, name);
}

/** The id of the subvolume that holds `path` (5 for the top level). */
export function btrfsSubvolId(path: string): number {
  return fs().btrfsSubvolId(path);
}

/**
 * Sets the max-referenced limit of subvolume `qgroupid` (its qgroup 0/<id>) to `bytes`;
 * 0 clears the limit. Writes beyond it fail with EDQUOT inside. Idempotent. The ioctl
 * goes through `mnt`, a directory of the filesystem outside that subvolume (the store's
 * mount): through the subvolume itself it fails with EDQUOT once the subvolume is at its
 * limit (native/addon/fsops.c says why), so a full layer's limit could not be raised.
 */
export function btrfsQgroupLimit(mnt: string, qgroupid: number, bytes: number): void {
  fs().btrfsQgroupLimit(mnt, qgroupid, bytes);
}

/** Deletes the level-0 qgroup 0/`qgroupid`. Throws EBUSY while it still accounts bytes (its subvolume is not fully dropped yet), ENOENT when absent. */
export function btrfsQgroupRemove(mnt: string, qgroupid: number): void {
  fs().btrfsQgroupRemove(mnt, qgroupid);
}

/** Every level-0 qgroup of the filesystem at `mnt`, with its committed counters and limit: one ioctl per ~3,600 qgroups. */
export function btrfsQgroups(mnt: string): BtrfsQgroup[] {
  return fs().btrfsQgroups(mnt);
}

/** The uuid of the btrfs filesystem at `mnt`, as named under /sys/fs/btrfs/. */
export function btrfsFsid(mnt: string): string {
  return fs().btrfsFsid(mnt);
}

/** The project id of `path` and whether it has FS_XFLAG_PROJINHERIT. */
export function fsGetProject(path: string): { projid: number; inherit: boolean } {
  return fs().fsGetProject(path);
}

/** Sets the project id of `path` (a 32-bit number) and, when `inherit`, FS_XFLAG_PROJINHERIT so new entries below inherit it. */
export function fsSetProject(path: string, projid: number, inherit: boolean): void {
  fs().fsSetProject(path, projid, inherit);
}

/** The project quota state of the XFS mount at `mnt`. Throws (ENOSYS, EOPNOTSUPP, ...) where the kernel has no XFS quota. */
export function xfsQuotaState(mnt: string): XfsQuotaState {
  return fs().xfsQuotaState(mnt);
}

/** Sets the block hard limit of project `projid` on the XFS mount at `mnt` to `bytes` (rounded up to 512 bytes); 0 clears it. */
export function xfsSetProjectLimit(mnt: string, projid: number, bytes: number): void {
  fs().xfsSetProjectLimit(mnt, projid, bytes);
}

/** Blocks used by project `projid` and its hard limit (0: none), in bytes; null when the project has no quota record yet. */
export function xfsProjectUsage(mnt: string, projid: number): { usedBytes: number; hardLimitBytes: number } | null {
  return fs().xfsProjectUsage(mnt, projid);
}

/**
 * Attaches `image` to a free loop device with autoclear (it detaches itself once its
 * last user closes it: the filesystem mounted on it, or `fd` if nothing is) and, when
 * `directIo`, direct I/O (the host page cache keeps no second copy; the kernel falls
 * back to buffered I/O where the backing filesystem cannot do it). Returns the device
 * path and an fd that keeps it attached: mount the device, then close the fd.
 * Throws with syscall LOOP_CTL_GET_FREE / LOOP_CONFIGURE and the errno code.
 */
export function loopAttach(image: string, directIo: boolean): { device: string; fd: number } {
  return fs().loopAttach(image, directIo);
}

/** Detaches a loop device (LOOP_CLR_FD); on one still in use the kernel only sets autoclear. Throws ENXIO when it is not attached. */
export function loopDetach(device: string): void {
  fs().loopDetach(device);
}
