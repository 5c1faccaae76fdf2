/**
 * Typed access to dsec's N-API addon (native/addon/dsec_native.c): the few Linux syscalls
 * Node lacks — user namespaces for idmapped mounts, open_tree/mount_setattr/move_mount,
 * mount(2), umount2(2), a mount-point test, and the scheduling probes behind
 * daemon/host/sched.ts (core scheduling, SCHED_IDLE).
 *
 * The addon is built by `make -C native/addon` into
 * `native/addon/build/Release/dsec_native.node` and loaded lazily on first use, so
 * modules that import this file still load on machines where it has not been built (the
 * first call then throws a FailedPrecondition DsecError saying how to build it).
 * `DSEC_NATIVE_ADDON` overrides the path (e.g. for a packaged install).
 *
 * Errors from syscalls are plain `Error`s shaped like Node's fs errors: `code` is the
 * errno name (`"ENOENT"`, `"EBUSY"`, ...), `errno` the negated errno number, `syscall`
 * the failing call and `path` the path it was given; the message names both. Use
 * {@link errnoCode} to read the code.
 *
 * All calls but {@link unmountAllAsync} are synchronous: each is one or a few syscalls
 * (tens of microseconds; a userns costs one short-lived clone, ~0.15 ms here), cheaper
 * than a thread hop. Unmounting is the exception: each umount2 of an overlay or EROFS
 * mount waits for an RCU grace period (a millisecond or more on a loaded host), so the
 * lifecycle paths unmount on the libuv threadpool.
 */
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { DsecError } from '../errors.js';

/** Mount and unmount flag values (from <linux/mount.h> / <sys/mount.h>), as the addon exports them. */
export interface NativeConstants {
  MS_RDONLY: number;
  MS_NOSUID: number;
  MS_NODEV: number;
  MS_NOEXEC: number;
  MS_REMOUNT: number;
  MS_NOATIME: number;
  MS_BIND: number;
  MS_REC: number;
  MS_PRIVATE: number;
  MS_SLAVE: number;
  MNT_FORCE: number;
  MNT_DETACH: number;
  UMOUNT_NOFOLLOW: number;
}

/** The raw addon interface (see native/addon/dsec_native.c for the syscalls behind each). */
interface NativeAddon {
  userns(uidBase: number, gidBase: number, count: number): number;
  idmapMountFd(src: string, dst: string, nsfd: number, readonly: boolean): void;
  idmapMount(src: string, dst: string, uidBase: number, gidBase: number, count: number, readonly: boolean): void;
  mount(source: string | null, target: string, fstype: string | null, flags: number, data: string | null): void;
  umount(target: string, flags: number): void;
  isMountpoint(path: string): boolean;
  isReadOnly(path: string): boolean;
  dropCache(path: string): void;
  peerCred(fd: number): PeerCred;
  schedCoreProbe(): number;
  schedIdleProbe(): number;
  openTreeIdmapped(src: string, inner: number, outer: number, count: number, readonly: boolean): number;
  unmountAllAsync(target: string): Promise<number>;
  mountOverlayAsync(target: string, lowers: string[], nsfd: number, layerDir: string, upperName: string, workName: string, options: string[]): Promise<void>;
  constants: NativeConstants;
}

/** Path of the compiled addon relative to the repository root. */
export const ADDON_RELATIVE_PATH = 'native/addon/build/Release/dsec_native.node';

/**
 * The repository (package) root: the nearest ancestor of this file that holds a
 * package.json. Works both from source (`daemon/host/native.ts`, under vitest/tsx) and
 * from the compiled tree (`dist/daemon/host/native.js`).
 * Throws a FailedPrecondition DsecError if no package.json is found up to `/`.
 */
export function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, 'package.json'))) return dir;
    const parent = dirname(dir);
    if (parent === dir) {
      throw new DsecError('FailedPrecondition', `no package.json above ${fileURLToPath(import.meta.url)}`);
    }
    dir = parent;
  }
}

/** Absolute path the addon is loaded from: `$DSEC_NATIVE_ADDON`, else `<repo root>/native/addon/build/Release/dsec_native.node`. */
export function addonPath(): string {
  return process.env.DSEC_NATIVE_ADDON || join(repoRoot(), ADDON_RELATIVE_PATH);
}

let cached: NativeAddon | undefined;

/**
 * Loads (once) and returns the addon.
 * Throws a FailedPrecondition DsecError when the file is missing (not built) or fails to load.
 */
function addon(): NativeAddon {
  if (cached) return cached;
  const path = addonPath();
  if (!existsSync(path)) {
    throw new DsecError('FailedPrecondition', `native addon not built: ${path} is missing (run \`make -C native/addon\`)`);
  }
  try {
    const require = createRequire(join(repoRoot(), 'package.json'));
    cached = require(path) as NativeAddon;
  } catch (e) {
    throw new DsecError('FailedPrecondition', `native addon ${path} failed to load: ${(e as Error).message}`, { cause: e });
  }
  return cached;
}

/**
 * The loaded addon itself, for the wrappers of its other source files (daemon/host/bpf.ts
 * and the like), which type their own functions.
 * @throws DsecError FailedPrecondition when the addon is not built or fails to load.
 */
export function loadAddon(): NativeAddon {
  return addon();
}

/**
 * The loaded addon's exports, untyped, for the typed wrappers of the addon's other source
 * files (e.g. daemon/storage/fsops.ts over native/addon/fsops.c). Loads it on first use.
 * Throws as {@link addon}: FailedPrecondition when it is not built or fails to load.
 */
export function addonModule(): Record<string, unknown> {
  return addon() as unknown as Record<string, unknown>;
}

/** True when the addon file exists and loads (never throws). Tests and `dsec host info` use it. */
export function nativeAvailable(): boolean {
  try {
    addon();
    return true;
  } catch {
    return false;
  }
}

/** Mount/unmount flag constants (MS_RDONLY, MNT_DETACH, ...). Loads the addon. */
export function constants(): NativeConstants {
  return addon().constants;
}

/** The `code` (errno name such as `"EBUSY"`) of an error thrown by this module, or undefined. */
export function errnoCode(e: unknown): string | undefined {
  const c = (e as { code?: unknown } | null)?.code;
  return typeof c === 'string' ? c : undefined;
}

/**
 * A detached idmapped view of the directory `src` as an fd (O_CLOEXEC), attached nowhere
 * (no mount table entry; it vanishes with the last fd): through it, a file owned by host
 * id `inner + k` (k < count) appears owned by host id `outer + k`, any other owner as the
 * overflow id 65534. Mounts below `src` are not part of the view. `readonly` makes the
 * view read-only. The builder identity reads trees through such fds
 * (daemon/host/builder.ts); close with `fs.closeSync`.
 * Throws (code EINVAL when the filesystem of `src` cannot be idmapped, ENOENT, ENOTDIR, EPERM, ...).
 */
export function openTreeIdmapped(src: string, inner: number, outer: number, count: number, readonly: boolean): number {
  return addon().openTreeIdmapped(src, inner, outer, count, readonly);
}

/**
 * Creates a user namespace whose uid_map is `0 uidBase count` and gid_map `0 gidBase count`
 * (container id 0 is host id `uidBase`; the range comes from the sandbox's allocation),
 * and returns an fd on it (O_CLOEXEC). The caller must close it with `fs.closeSync`.
 * One fd serves all layers of one sandbox (see {@link idmapMountFd}).
 * Throws (code EPERM, EINVAL, ENOSPC, ...) if the namespace cannot be created or mapped;
 * `count` must be > 0 and all numbers integers in [0, 2^32).
 */
export function userns(uidBase: number, gidBase: number, count: number): number {
  return addon().userns(uidBase, gidBase, count);
}

/**
 * Attaches at `dst` (an existing directory) a clone of the mount whose root is `src`,
 * idmapped through the user namespace `nsfd` (from {@link userns}): a file owned by id N
 * in `src` shows as owned by `uidBase + N` (`gidBase + N`) at `dst`; ids outside
 * [0, count) show as the overflow id (65534). `readonly` also sets MOUNT_ATTR_RDONLY.
 * `src` must be the root of a mount (e.g. a mounted EROFS blob), not a subdirectory of one
 * — otherwise the clone covers only that subtree, which is also fine.
 * Throws with `syscall` open_tree / mount_setattr / move_mount and the errno code.
 */
export function idmapMountFd(src: string, dst: string, nsfd: number, readonly: boolean): void {
  addon().idmapMountFd(src, dst, nsfd, readonly);
}

/**
 * Mounts overlayfs at `target` (an existing directory) from file descriptors, so that the
 * mount table names no host path (native/addon/overlay.c): each of `lowers` (TOP layer
 * first; at most 500) is cloned detached, idmapped through `nsfd` (from {@link userns})
 * and read-only, and given as `lowerdir+`; `layerDir/upperName` and `layerDir/workName`
 * (one filesystem) are given as `upperdir` and `workdir` through a detached clone of
 * `layerDir`. /proc/<pid>/mountinfo then shows `lowerdir+=/` per layer and
 * `upperdir=/<upperName>,workdir=/<workName>`. `options` are further `key=value` overlay
 * options (a bare `key` is a flag). Runs on the libuv threadpool (closing the detached
 * clones waits for RCU grace periods).
 * Rejects with an errno-coded Error whose `syscall` names the step (`open_tree`,
 * `mount_setattr`, `fsopen`, `fsconfig` (an option, named in `path`), `fsconfig:lowerdir+`,
 * `fsconfig:upperdir`, `fsconfig:workdir`, `fsconfig:create`, `fsmount`, `move_mount`)
 * and whose `kernelLog`, when present, is overlayfs's own message. A kernel older than
 * 6.13 (no fd layers: EINVAL at `fsconfig:lowerdir+`) or 6.15 (no detached layers:
 * EINVAL at `fsconfig:create`) cannot do this; callers fall back to path options.
 */
export function mountOverlayAsync(target: string, lowers: string[], nsfd: number, layerDir: string, upperName: string, workName: string, options: string[]): Promise<void> {
  return addon().mountOverlayAsync(target, lowers, nsfd, layerDir, upperName, workName, options);
}

/**
 * {@link userns} + {@link idmapMountFd} + close, for a single idmapped mount.
 * Prefer sharing one userns fd when mounting several layers for the same sandbox.
 */
export function idmapMount(
  src: string,
  dst: string,
  uidBase: number,
  gidBase: number,
  count: number,
  readonly: boolean,
): void {
  addon().idmapMount(src, dst, uidBase, gidBase, count, readonly);
}

/**
 * mount(2). `source`/`fstype`/`data` may be null (e.g. for MS_BIND or propagation
 * changes). `flags` is an OR of {@link constants} MS_* values. `data` is the
 * filesystem's option string; it must be shorter than 4096 bytes (one page, what the
 * kernel copies) — longer strings are refused with a RangeError rather than cut.
 * Throws with `syscall: "mount"`, `path: target` and the errno code.
 */
export function mount(source: string | null, target: string, fstype: string | null, flags: number, data: string | null): void {
  addon().mount(source, target, fstype, flags, data);
}

/**
 * umount2(2). `flags` is 0 or an OR of MNT_DETACH / MNT_FORCE / UMOUNT_NOFOLLOW.
 * Throws with `syscall: "umount2"`: EINVAL when `target` is not a mount point,
 * EBUSY when it is in use (retry with MNT_DETACH), ENOENT when it does not exist.
 */
export function umount(target: string, flags = 0): void {
  addon().umount(target, flags);
}

/**
 * True when `path` is the root of a mount (statx STATX_ATTR_MOUNT_ROOT; symlinks are not
 * followed, automounts not triggered). Cheaper than reading /proc/self/mountinfo.
 * Throws ENOENT if `path` does not exist; see {@link isMountpointOrMissing}.
 */
export function isMountpoint(path: string): boolean {
  return addon().isMountpoint(path);
}

/**
 * True when the filesystem at `path` is read-only for writers there: statvfs(3)
 * ST_RDONLY, which the kernel sets when the mount *or* its superblock is read-only. So
 * it also catches a filesystem that turned itself read-only although it was mounted
 * read-write (overlayfs without a usable work dir, btrfs after an error). Follows
 * symlinks. Throws the errno-coded Error of statvfs (ENOENT, ...).
 */
export function isReadOnly(path: string): boolean {
  return addon().isReadOnly(path);
}

/** Credentials of the peer of a connected Unix socket (SO_PEERCRED). */
export interface PeerCred {
  pid: number;
  uid: number;
  gid: number;
}

/**
 * The pid, uid and gid of the process at the other end of the connected Unix socket
 * `fd`, as recorded by the kernel at connect time. Throws with `syscall:
 * "getsockopt(SO_PEERCRED)"` (e.g. ENOTSOCK).
 */
export function peerCred(fd: number): PeerCred {
  return addon().peerCred(fd);
}

/**
 * Evicts `path`'s clean pages from the page cache (posix_fadvise POSIX_FADV_DONTNEED on
 * the whole file). Pages still mapped or dirty stay. Throws with `syscall: "open"` or
 * `"posix_fadvise"` and the errno code.
 */
export function dropCache(path: string): void {
  addon().dropCache(path);
}

/**
 * Probes core scheduling on the calling thread: `prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET,
 * 0, PIDTYPE_PID, &cookie)`. Returns 0 when the kernel has it and it is usable, else the
 * errno number (positive): EINVAL (22) when the kernel was built without
 * CONFIG_SCHED_CORE, ENODEV (19) when it has it but the CPUs have no SMT siblings.
 * Changes nothing. Never throws for the probe itself (only when the addon is missing).
 * See {@link detectCoreScheduling} in daemon/host/sched.ts for the interpreted result.
 */
export function schedCoreProbe(): number {
  return addon().schedCoreProbe();
}

/**
 * Probes SCHED_IDLE: a short-lived helper thread switches itself to SCHED_IDLE
 * (scheduling policy is per thread, so the daemon's own threads keep theirs). Returns 0
 * or the errno number (positive), e.g. EPERM under a seccomp/LSM policy that forbids
 * sched_setscheduler. Never throws for the probe itself (only when the addon is missing).
 */
export function schedIdleProbe(): number {
  return addon().schedIdleProbe();
}

/** Like {@link isMountpoint} but returns false when `path` does not exist. */
export function isMountpointOrMissing(path: string): boolean {
  try {
    return addon().isMountpoint(path);
  } catch (e) {
    if (errnoCode(e) === 'ENOENT' || errnoCode(e) === 'ENOTDIR') return false;
    throw e;
  }
}

/**
 * Unmounts everything mounted at `target` (mounts can be stacked), falling back to a
 * lazy detach (MNT_DETACH) when a mount is busy. Returns how many mounts were removed.
 * Safe to call when nothing is mounted there or `target` does not exist (returns 0).
 * Throws on other errors, or a FailedPrecondition DsecError if `target` is still a mount
 * point after 64 attempts (stacking that deep means something keeps re-mounting it).
 */
export function unmountAll(target: string): number {
  const { MNT_DETACH } = addon().constants;
  let n = 0;
  while (isMountpointOrMissing(target)) {
    if (n >= 64) throw new DsecError('FailedPrecondition', `${target} is still mounted after ${n} unmounts`);
    try {
      addon().umount(target, 0);
    } catch (e) {
      const code = errnoCode(e);
      if (code === 'EBUSY') addon().umount(target, MNT_DETACH);
      else if (code === 'EINVAL' || code === 'ENOENT') break;
      else throw e;
    }
    n++;
  }
  return n;
}

/**
 * {@link unmountAll} on the libuv threadpool: the same loop (unmount, lazily detach a busy
 * mount, stop when `target` is no longer a mount point or is missing), so the event loop
 * does not wait for the kernel's RCU grace period of each umount2. Resolves with how many
 * mounts were removed; safe when nothing is mounted at `target` or it does not exist.
 * Rejects with an errno-coded Error (`syscall` "statx" or "umount2") on other errors, and
 * with code EBUSY when `target` is still a mount point after 64 unmounts.
 */
export function unmountAllAsync(target: string): Promise<number> {
  return addon().unmountAllAsync(target);
}
