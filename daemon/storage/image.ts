/**
 * The store's image (`<root>/storage/upper.img`) and its loop mount: making the image
 * (sparse or preallocated, then mkfs), mounting it (attached to a loop device with
 * autoclear, so it detaches itself when the filesystem is unmounted, even lazily, and
 * direct I/O, so the host page cache does not hold a second copy of what the store
 * caches), recognising the mount a previous dsecd left, unmounting it for purge, and
 * finding the block device under the store (for cgroup I/O limits).
 */
import { closeSync, existsSync, readFileSync, realpathSync, renameSync, rmSync, statfsSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import type { Logger } from 'pino';
import { failedPrecondition, internal } from '../errors.js';
import * as native from '../host/native.js';
import { errnoCode } from '../host/native.js';
import { unescapeMountinfo } from '../image/rootfs.js';
import * as fsops from './fsops.js';
import { MIN_STORE_BYTES, defaultStoreBytes, gib, type StorageConfig, type StoreRecord } from './layout.js';

/** Mount options per store: noatime everywhere; discard returns freed blocks of a sparse btrfs image to the host. */
export function mountOptions(rec: StoreRecord): { fstype: string; data: string } {
  if (rec.kind === 'btrfs') return { fstype: 'btrfs', data: rec.preallocated ? 'nodiscard' : 'discard=async' };
  return { fstype: 'xfs', data: rec.quota === 'prjquota' ? 'prjquota' : '' };
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

/**
 * Makes the image of a new store of `kind` at `image` (in `dir`): sized as `cfg` says
 * (default: half the free host disk), sparse or preallocated, formatted. Built under
 * `<image>.tmp` and renamed into place, so an image that exists was made whole.
 * @returns its size, bytes.
 * @throws `unavailable`'s error when there is no room or mkfs is missing or fails;
 *   DsecError FailedPrecondition when preallocating fails, Internal when sizing fails.
 */
export async function makeImage(
  dir: string,
  image: string,
  cfg: StorageConfig,
  kind: 'btrfs' | 'xfs',
  log: Logger,
  unavailable: (msg: string) => Error,
): Promise<number> {
  const st = statfsSync(dir);
  const free = st.bavail * st.bsize;
  const size = cfg.sizeBytes ?? defaultStoreBytes(free);
  if (size === null) throw unavailable(`the host filesystem under ${dir} has ${gib(free)} free; a store needs twice ${gib(MIN_STORE_BYTES)} (or set [storage] size_bytes)`);
  if (size > free) log.warn({ sizeBytes: size, freeBytes: free }, 'the writable-layer store is larger than the free host disk: a full store would fill the host disk first (see [storage] preallocate)');
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
  return size;
}

/**
 * Attaches `image` to a free loop device (autoclear, direct I/O) and mounts it at `mnt`.
 * If the mount fails the device detaches itself when its fd is closed here.
 * @throws the errno-coded Error of the loop setup or of mount(2).
 */
export function attachAndMount(image: string, mnt: string, o: { fstype: string; data: string }): void {
  const { device, fd } = fsops.loopAttach(image, true);
  try {
    native.mount(device, mnt, o.fstype, native.constants().MS_NOATIME, o.data || null);
  } finally {
    closeSync(fd);
  }
}

/** Mounts a just-made store; a failure (no such filesystem in this kernel, no loop device) is `unavailable`'s error. */
export function mountNew(image: string, mnt: string, rec: StoreRecord, unavailable: (msg: string) => Error): void {
  try {
    attachAndMount(image, mnt, mountOptions(rec));
  } catch (e) {
    throw unavailable(`mounting it failed (${(e as Error).message})`);
  }
}

/**
 * Mounts the recorded store's image at `mnt` (which exists), unless the mount a previous
 * dsecd left is already there and is this image (that mount is kept: sandboxes may be
 * running on it). `recordFile` is named in the message of a missing image.
 * @throws DsecError FailedPrecondition when `mnt` holds another mount, the image is
 *   missing, or the mount fails.
 */
export function mountRecordedImage(image: string, mnt: string, rec: StoreRecord, recordFile: string): void {
  if (native.isMountpointOrMissing(mnt)) {
    const src = mountSourceOf(readFileSync('/proc/self/mountinfo', 'utf8'), mnt);
    const backing = src ? loopBackingFile(src) : null;
    if (backing !== image) {
      throw failedPrecondition(`${mnt} is mounted from ${src ?? 'an unknown source'}${backing ? ` (${backing})` : ''}, not from this instance's store ${image}; unmount it and start again`);
    }
    return;
  }
  if (!existsSync(image)) {
    throw failedPrecondition(`the writable-layer store image ${image} is missing although ${recordFile} records it; sandboxes on it lost their writable layers. Restore the image, or purge the instance (dsecd --purge)`);
  }
  try {
    attachAndMount(image, mnt, mountOptions(rec));
  } catch (e) {
    throw failedPrecondition(`mounting the writable-layer store ${image} at ${mnt} failed: ${(e as Error).message}; check the kernel log`, { cause: e });
  }
}

/**
 * Unmounts the store at `mnt` for purge. Autoclear detaches its loop device once the
 * filesystem lets go of it; a device attached without autoclear (by hand) to `image` is
 * detached here.
 * @throws errno-coded Errors of the detach other than "already gone".
 */
export function unmountImage(mnt: string, image: string): void {
  const src = mountSourceOf(readFileSync('/proc/self/mountinfo', 'utf8'), mnt);
  native.unmountAll(mnt);
  if (src && loopBackingFile(src) === image) {
    try {
      fsops.loopDetach(src);
    } catch (e) {
      if (errnoCode(e) !== 'ENXIO' && errnoCode(e) !== 'ENOENT') throw e;
    }
  }
}

/**
 * The whole disk under the store mounted at `mountDir` (the loop device of the image, or
 * the disk under the operator's filesystem when `external`), as cgroup I/O files name it;
 * null when the mount's source is not a block device. Read from /proc/self/mountinfo and
 * sysfs; see WritableLayerStore.blockDevice.
 */
export function blockDeviceOf(mountDir: string, external: boolean): { major: number; minor: number; name: string } | null {
  const mi = readFileSync('/proc/self/mountinfo', 'utf8');
  let src = mountSourceOf(mi, mountDir);
  if (src === null && external) {
    // The operator's directory may be below its filesystem's mount point: take the longest mount prefix.
    let best = '';
    for (const line of mi.split('\n')) {
      const f = line.split(' ');
      const mp = f[4] ? unescapeMountinfo(f[4]) : '';
      if (mp && (mountDir === mp || mountDir.startsWith(mp.endsWith('/') ? mp : `${mp}/`)) && mp.length >= best.length) {
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
