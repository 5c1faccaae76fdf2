/**
 * Composition of a sandbox's root filesystem: idmapped EROFS lowers + a writable upper
 * dir, joined by overlayfs.
 *
 * Layout inside a sandbox directory `<dir>`:
 *
 *   upper/      the sandbox's writable layer (survives stop/start; removed only by
 *               removeSandboxDir). Owned uidBase:gidBase, i.e. root inside the sandbox.
 *   work/       overlayfs's work dir (same filesystem as upper/).
 *               Both may live elsewhere instead: in the writable-layer store
 *               (daemon/storage/writable-layers.ts), passed as PrepareRootfsOptions.upper/work.
 *   rootfs/     the overlay mount: what runc gets as the container's root.
 *   lower/<i>   only on kernels that cannot take layers as file descriptors (below), and
 *               only while prepareRootfs runs unless `keepLowerMounts` is set: layer i
 *               (0 = base) attached as an idmapped read-only clone of the blob mount.
 *
 * Each layer is an idmapped read-only clone of its blob mount: id N in the layer shows as
 * `uidBase + N` / `gidBase + N`. The overlay is mounted from file descriptors
 * (native.mountOverlayAsync, Linux 6.15+): the layer clones and a clone of the upper's
 * parent are never attached anywhere, and overlayfs records each layer by its path inside
 * its detached clone, so the sandbox's /proc/self/mountinfo reads
 * `lowerdir+=/,...,upperdir=/upper,workdir=/work` and names no host path (docs/SECURITY.md
 * "What a sandbox sees of the host's mounts"). On older kernels (decided once per process
 * at the first mount, {@link overlayLayerNaming}) the layers are attached at lower/<i> and
 * the overlay is mounted with path options, which the mount table then shows.
 *
 * Either way each sandbox leaves exactly one mount behind, rootfs/: overlayfs takes its
 * own private clones of every layer when it is mounted (clone_private_mount), so the
 * clones it was given are closed (or, on the path-option fallback, lower/<i> unmounted)
 * right after. Keeping them would add one mount per layer per sandbox to the host mount
 * table, which every new mount namespace (each runc container start) copies, and which
 * every reader of /proc/self/mountinfo walks — at thousands of sandboxes that costs real
 * time.
 *
 * Overlay options: `index=off,redirect_dir=off,metacopy=off` (also this kernel's
 * defaults, stated explicitly so a host with different module defaults behaves the same):
 *   - index=off: the lowers are fresh idmapped clones on every start; with the index on,
 *     overlayfs records lower identities in the upper/work dirs and may refuse to remount
 *     the same upper over them (and our blobs share one fixed UUID, see erofs.ts).
 *   - metacopy=off and redirect_dir=off keep the upper dir self-contained: every changed
 *     file is fully copied up and renamed lower directories are real copies, not xattrs
 *     pointing into lowers. The upper can then be packed into a new layer on its own
 *     (DESIGN: environments are packed from writable layers). The cost: rename(2) of a
 *     directory that exists in a lower returns EXDEV (mv falls back to copying), as on
 *     Docker's default overlay2 setup.
 * We mount as real root, so `userxattr` is not used (trusted.* xattrs).
 */
import { closeSync } from 'node:fs';
import { chmod, chown, mkdir, readFile, readdir, realpath, rm, rmdir } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { DsecError } from '../errors.js';
import * as native from '../host/native.js';

/** Options for {@link prepareRootfs}. */
export interface PrepareRootfsOptions {
  /** The sandbox directory (absolute; must not contain `,` `:` `\` or newlines, which overlay options cannot carry). */
  dir: string;
  /** Mounted blob directories (from LayerMounts.acquire), LOWEST layer first. At least one. */
  lowers: string[];
  /** Host uid that is uid 0 in the sandbox (from the sandbox's id-range allocation). */
  uidBase: number;
  /** Host gid that is gid 0 in the sandbox. */
  gidBase: number;
  /** Size of the uid and gid ranges (e.g. 65536). */
  count: number;
  /**
   * The writable layer's upper and work dirs (one filesystem, absolute, without the
   * characters `dir` must not have). Default `<dir>/upper` and `<dir>/work`.
   */
  upper?: string;
  work?: string;
  /**
   * Keep the idmapped lower/<i> mounts attached after the overlay is mounted (debugging,
   * tests). Default false: they are detached (see the module comment).
   */
  keepLowerMounts?: boolean;
}

/** Overlay mount options besides the dirs; see the module comment for why each. */
export const OVERLAY_OPTIONS = 'index=off,redirect_dir=off,metacopy=off';

/** Characters overlayfs's option parser treats specially (or that break mountinfo lines). */
const BAD_PATH_CHARS = /[,:\\\n]/;

/**
 * Mounts the sandbox root filesystem at `<dir>/rootfs` and returns its path.
 *
 * Steps: clean up lower/ mounts left by an interrupted earlier call; create upper/ and
 * work/ if missing (existing contents are kept: the writable layer persists across
 * stop/start) and set them to uidBase:gidBase mode 0755; create one user namespace for
 * the sandbox's range; mount the overlay from fds of detached idmapped read-only layer
 * clones (see the module comment; upper and work must share a parent directory). Where
 * the kernel cannot (or with keepLowerMounts), attach every lower as an idmapped
 * read-only mount at lower/<i>, mount overlay with lowerdir = lower/<n-1>:…:lower/0
 * (overlayfs lists the TOP layer first), then, unless keepLowerMounts, detach lower/*
 * and remove lower/. On failure every mount it made is undone before the error is
 * rethrown.
 *
 * Throws: InvalidArgument for bad options; FailedPrecondition when `<dir>/rootfs` is
 * already mounted (call teardownRootfs first), or when the overlay came up read-only
 * (statvfs ST_RDONLY: overlayfs could not create its work dir, e.g. a full layer; the
 * overlay is unmounted again); errno-coded Errors from the syscalls (see
 * host/native.ts) otherwise.
 */
export async function prepareRootfs(opts: PrepareRootfsOptions): Promise<{ rootfs: string }> {
  const dir = resolve(opts.dir);
  const { lowers, uidBase, gidBase, count } = opts;
  if (BAD_PATH_CHARS.test(dir)) throw new DsecError('InvalidArgument', `sandbox dir ${dir} contains one of , : \\ or newline`);
  if (lowers.length === 0) throw new DsecError('InvalidArgument', 'prepareRootfs needs at least one lower layer');
  for (const n of [uidBase, gidBase, count]) {
    if (!Number.isInteger(n) || n < 0 || n > 0xffffffff) throw new DsecError('InvalidArgument', `bad id range ${uidBase}/${gidBase}/${count}`);
  }
  if (count === 0) throw new DsecError('InvalidArgument', 'id range count must be > 0');

  const rootfs = join(dir, 'rootfs');
  const upper = resolve(opts.upper ?? join(dir, 'upper'));
  const work = resolve(opts.work ?? join(dir, 'work'));
  for (const p of [upper, work]) if (BAD_PATH_CHARS.test(p)) throw new DsecError('InvalidArgument', `writable-layer dir ${p} contains one of , : \\ or newline`);
  const lowerDir = join(dir, 'lower');

  if (native.isMountpointOrMissing(rootfs)) {
    throw new DsecError('FailedPrecondition', `${rootfs} is already mounted; tear it down first`);
  }
  await unmountLowers(lowerDir);

  for (const d of [upper, work]) {
    await mkdir(d, { recursive: true });
    await chown(d, uidBase, gidBase);
    await chmod(d, 0o755);
  }
  await mkdir(rootfs, { recursive: true });

  const mounted: string[] = [];
  try {
    const nsfd = native.userns(uidBase, gidBase, count);
    try {
      let fdFailure: unknown = null;
      let done = false;
      if (fdLayers !== false && !opts.keepLowerMounts && dirname(upper) === dirname(work)) {
        try {
          await native.mountOverlayAsync(rootfs, lowers.slice().reverse(), nsfd, dirname(upper), basename(upper), basename(work), OVERLAY_OPTIONS.split(','));
          fdLayers = true;
          done = true;
        } catch (e) {
          if (fdLayers === true || !kernelLacksFdLayers(e)) throw e;
          fdFailure = e;
        }
      }
      if (!done) {
        await mkdir(lowerDir, { recursive: true, mode: 0o700 });
        for (let i = 0; i < lowers.length; i++) {
          const at = join(lowerDir, String(i));
          await mkdir(at, { recursive: true });
          native.idmapMountFd(lowers[i], at, nsfd, true);
          mounted.push(at);
        }
        const lowerdir = mounted.slice().reverse().join(':');
        native.mount('overlay', rootfs, 'overlay', 0, `lowerdir=${lowerdir},upperdir=${upper},workdir=${work},${OVERLAY_OPTIONS}`);
        if (fdFailure) {
          fdLayers = false;
          fdLayersReason = (fdFailure as Error).message;
        }
      }
    } finally {
      closeSync(nsfd);
    }
    // overlayfs mounts read-only, without failing, when it cannot make or clean its work
    // dir (work/work): e.g. EDQUOT/ENOSPC on a full writable layer. A sandbox would then
    // start with a root it cannot write, so that is a failed prepare.
    if (native.isReadOnly(rootfs)) {
      native.unmountAll(rootfs);
      throw new DsecError('FailedPrecondition', `overlayfs mounted ${rootfs} read-only: it could not create its work dir in ${work} (the writable layer's filesystem is full, over its quota, or read-only; the kernel log has overlayfs's errno). Free space there, then start again`);
    }
  } catch (e) {
    await unmountLowers(lowerDir).catch(() => undefined);
    throw e;
  }
  if (!opts.keepLowerMounts) await unmountLowers(lowerDir);
  return { rootfs };
}

/**
 * Whether overlays are mounted from file descriptors (true), with path options because the
 * kernel cannot take detached layers as fds (false), or not decided yet (null: no sandbox
 * root mounted in this process so far).
 */
let fdLayers: boolean | null = null;
/** Why the fd mount was given up (the kernel's refusal), when {@link fdLayers} is false. */
let fdLayersReason = '';

/**
 * How the sandbox overlays of this process name their layers in /proc/<pid>/mountinfo:
 * `hidden` (mounted from fds: `lowerdir+=/`, `upperdir=/upper`), `host-paths` (this kernel
 * refused fd layers: the options carry the host paths; `reason` is its refusal), or
 * `undecided` (no sandbox root mounted by this process yet).
 */
export function overlayLayerNaming(): { naming: 'hidden' | 'host-paths' | 'undecided'; reason: string } {
  if (fdLayers === null) return { naming: 'undecided', reason: '' };
  return fdLayers ? { naming: 'hidden', reason: '' } : { naming: 'host-paths', reason: fdLayersReason };
}

/**
 * True when `e` (from native.mountOverlayAsync) is a kernel's refusal of fd layers rather
 * than a problem of this mount: EINVAL/ENOSYS/EOPNOTSUPP from fsopen, from a layer's
 * fsconfig (no `lowerdir+` fds before 6.13) or from the superblock creation (detached
 * clones refused as layers before 6.15). prepareRootfs then retries with path options,
 * and gives the fd mount up only if that works.
 */
function kernelLacksFdLayers(e: unknown): boolean {
  const code = native.errnoCode(e);
  const step = (e as { syscall?: unknown } | null)?.syscall;
  return (code === 'EINVAL' || code === 'ENOSYS' || code === 'EOPNOTSUPP')
    && typeof step === 'string' && (step === 'fsopen' || step.startsWith('fsconfig:'));
}

/** Unmounts every lower/<i> and removes the (then empty) dirs and lower/ itself. Missing is fine. */
async function unmountLowers(lowerDir: string): Promise<void> {
  let names: string[];
  try {
    names = await readdir(lowerDir);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw e;
  }
  await Promise.all(names.map(async (n) => {
    const p = join(lowerDir, n);
    await native.unmountAllAsync(p);
    await rmdirIfPresent(p);
  }));
  await rmdirIfPresent(lowerDir);
}

/** rmdir (never recursive: a still-mounted or non-empty dir makes it fail loudly); ENOENT is fine. */
async function rmdirIfPresent(p: string): Promise<void> {
  try {
    await rmdir(p);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
  }
}

/**
 * Unmounts `<dir>/rootfs` and any `<dir>/lower/*` (lazily detaching a busy mount, e.g.
 * one a dying container still holds), then removes rootfs/ and lower/. KEEPS upper/ and
 * work/: the sandbox's writable layer survives stop/start.
 * Safe to call twice, on a dir that never had a rootfs, or after a crash at any point of
 * prepareRootfs. Throws only on unexpected errno errors.
 */
export async function teardownRootfs(dir: string): Promise<void> {
  dir = resolve(dir);
  const rootfs = join(dir, 'rootfs');
  await native.unmountAllAsync(rootfs);
  await rmdirIfPresent(rootfs);
  await unmountLowers(join(dir, 'lower'));
}

/**
 * teardownRootfs, then deletes the whole sandbox dir including upper/ and work/.
 * Refuses (FailedPrecondition) if any mount is still found under `dir` in mountinfo, so
 * a recursive delete can never walk into a mounted filesystem.
 * Safe to call twice and on a missing dir.
 */
export async function removeSandboxDir(dir: string): Promise<void> {
  dir = resolve(dir);
  await teardownRootfs(dir);
  const left = await listMountsUnder(dir);
  if (left.length > 0) throw new DsecError('FailedPrecondition', `cannot remove ${dir}: still mounted: ${left.join(', ')}`);
  // overlayfs may leave root-only 0000 dirs in work/ (work/work); rm -rf as root handles them.
  await rm(dir, { recursive: true, force: true });
}

/**
 * Decodes the octal escapes mountinfo uses for space, tab, newline and backslash
 * (`\040`, `\011`, `\012`, `\134`). Bytes are decoded as UTF-8 afterwards.
 */
export function unescapeMountinfo(s: string): string {
  if (!s.includes('\\')) return s;
  const bytes: number[] = [];
  const raw = Buffer.from(s, 'utf8');
  for (let i = 0; i < raw.length; i++) {
    if (raw[i] === 0x5c && i + 3 < raw.length && /^[0-7]{3}$/.test(raw.subarray(i + 1, i + 4).toString('latin1'))) {
      bytes.push(parseInt(raw.subarray(i + 1, i + 4).toString('latin1'), 8));
      i += 3;
    } else bytes.push(raw[i]);
  }
  return Buffer.from(bytes).toString('utf8');
}

/**
 * Mount points from mountinfo `text` (the 5th field of each line, unescaped), in file
 * order (a parent mount before the mounts on top of or under it).
 */
export function parseMountinfo(text: string): string[] {
  const out: string[] = [];
  for (const line of text.split('\n')) {
    if (!line) continue;
    const f = line.split(' ');
    if (f.length >= 5) out.push(unescapeMountinfo(f[4]));
  }
  return out;
}

/**
 * Mount points in this process's mount namespace (/proc/self/mountinfo) that are
 * `prefix` itself or below it, in mountinfo order (parents first: unmount in reverse).
 * A mount point stacked several times appears several times. `prefix` is resolved
 * (and symlinks in it followed, when it exists) since mountinfo shows real paths.
 */
export async function listMountsUnder(prefix: string): Promise<string[]> {
  let p = resolve(prefix);
  p = await realpath(p).catch(() => p);
  const base = p === '/' ? '/' : `${p}/`;
  const text = await readFile('/proc/self/mountinfo', 'utf8');
  return parseMountinfo(text).filter((m) => m === p || m.startsWith(base));
}
