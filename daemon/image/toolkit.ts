/**
 * Toolkit layers: packages installed with apt on top of a base image, packed as ONE extra
 * EROFS layer, so the base layer stays a shared blob and only the toolkit is new.
 *
 * `dsec image bootstrap judge` ({@link bootstrapToolkit}) makes `judge:bookworm` =
 * [debian:bookworm's layer, a layer with gcc, g++ and libc6-dev (plus what apt pulls in:
 * binutils, cpp, libstdc++-dev, …)] for the online-judge `run_code` path (python, bash, c,
 * cpp). `debian:bookworm` is bootstrapped first when the store lacks it.
 *
 * How {@link buildToolkitImage} builds the layer (under `<cacheDir>/work/toolkit-<pid>-<hex>/`):
 *
 *   lower/<i>   the base image's blobs, mounted file-backed read-only (EROFS)
 *   upper/      a fresh overlay upper dir: after the build it holds exactly the change
 *               (new and changed files, whiteouts for deleted ones, opaque dirs)
 *   merged/     overlay(lower, upper); made mount-private, then given /proc, a minimal
 *               tmpfs /dev (null zero full random urandom tty), tmpfs /run /tmp /var/tmp,
 *               the host's /etc/resolv.conf (bind), and bind mounts of scratch dirs over
 *               var/lib/apt/lists and var/cache/apt (its archives/ seeded with hard links
 *               from `<cacheDir>/apt-archives/`, and new debs linked back after the
 *               install), so apt's lists, caches and the temp dirs never reach the upper
 *               dir at all
 *
 * then `chroot merged apt-get update` and `apt-get install -y --no-install-recommends
 * <packages>` against the mirror bootstrap uses ({@link detectMirror}), from a sources
 * list on the /run tmpfs (a file:// mirror is bind-mounted read-only under /run/dsec).
 * Everything is unmounted, {@link cleanUpper} reverts what must not ship (logs, dpkg and
 * debconf backups, lock files, anything under tmp/run/dev, apt state), and the upper dir
 * is written to the tree cache as a tar that keeps whiteouts and `trusted.overlay.opaque`
 * but drops overlayfs's private bookkeeping xattrs ({@link OVERLAY_PRIVATE_XATTRS}: origin
 * file handles, the per-mount uuid, …, which would make the blob differ on every build).
 * The layer is packed from that tar unpacked, on a cold build as on a cache hit, so both
 * give the same digest.
 *
 * Cache (`<cacheDir>`, default /var/cache/dsec/bootstrap, shared with bootstrap.ts):
 *   toolkits/<key>.tar[.zst]  the cleaned upper dir; key = {@link toolkitCacheKey} (base
 *                             layer digests, sorted package list, mirror, format version).
 *                             A hit skips the chroot and the network: unpack + mkfs.erofs.
 *   toolkits/<key>.json       what the key was made of, and when.
 *   apt-archives/             apt's .deb cache, so a cache miss downloads each package
 *                             version at most once. Never pruned; safe to delete.
 *   work/toolkit-<pid>-<hex>/ scratch, removed on success and failure (mounts first); dirs of
 *                             dead processes are reclaimed by the next bootstrap.
 * `refresh: true` ignores and replaces a cached tree (new package versions).
 *
 * Safety: every mount is recorded as it is made and undone in reverse order in a
 * `finally`; the work dir is then removed only when mountinfo shows nothing left under it
 * ({@link removeTree}), so a recursive delete never walks into /proc, /dev or the mirror.
 */
import { createHash, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, chown, copyFile, link, lstat, mkdir, readdir, rename, rm, symlink, writeFile } from 'node:fs/promises';
import { join, relative, resolve } from 'node:path';
import { execa } from 'execa';
import { DsecError, isDsecError } from '../errors.js';
import * as native from '../host/native.js';
import {
  DEFAULT_BOOTSTRAP_CACHE_DIR,
  PKG_RE,
  TAR_META_FLAGS,
  TOOL_PATH,
  bootstrapDebian,
  followGroup,
  unknownPackages,
  detectMirror,
  hasTool,
  reclaimStaleWork,
  removeTree,
} from './bootstrap.js';
import { OVERLAY_OPTIONS, unescapeMountinfo } from './rootfs.js';
import { MAX_LAYERS, parseRef, type ImageManifest, type LayerStore } from './layer-store.js';

/** Toolkits `bootstrap` knows: name -> packages (on top of the base image) and default image ref. */
export const TOOLKITS = {
  /** Compilers for an online judge (`run_code`: python, bash, c, cpp). python3 is in the base. */
  judge: { packages: ['gcc', 'g++', 'libc6-dev'] as readonly string[], image: 'judge:bookworm', base: 'debian:bookworm' },
} as const;
export type ToolkitName = keyof typeof TOOLKITS;

/**
 * Version of how a toolkit tree is made and cleaned ({@link cleanUpper}, the apt options,
 * the xattrs dropped). Part of the cache key: bump it when any of those change.
 */
const TOOLKIT_FORMAT = 'dsec-toolkit-tree-v1';

/**
 * overlayfs's private xattrs that copy-up and directory operations leave in an upper dir.
 * They mean something only to the overlay mount that wrote them (file handles into its
 * lower filesystems, its random per-mount `uuid`, index state), and `uuid` alone would
 * make every build's blob different, so they are dropped when the upper dir is tarred.
 * `trusted.overlay.opaque` is NOT here: an opaque directory must stay opaque in the layer.
 */
export const OVERLAY_PRIVATE_XATTRS: readonly string[] = [
  'trusted.overlay.origin',
  'trusted.overlay.impure',
  'trusted.overlay.uuid',
  'trusted.overlay.nlink',
  'trusted.overlay.upper',
  'trusted.overlay.redirect',
  'trusted.overlay.metacopy',
  'trusted.overlay.protattr',
];

/** Inputs of the toolkit tree cache key. */
export interface ToolkitCacheKeyInput {
  /** The base image's layer digests, lowest first (the tree is a diff against exactly them). */
  baseLayers: string[];
  /** Packages installed on top. */
  packages: string[];
  /** Archive URI apt installs from. */
  mirror: string;
}

/**
 * The toolkit tree cache key: 32 hex digits of sha256 over the format version, the base
 * layer digests (in order), the sorted de-duplicated package list and the mirror (without
 * trailing `/`). Pure; never throws.
 */
export function toolkitCacheKey(k: ToolkitCacheKeyInput): string {
  const canon = {
    format: TOOLKIT_FORMAT,
    base: [...k.baseLayers],
    packages: [...new Set(k.packages)].sort(),
    mirror: k.mirror.replace(/\/+$/, ''),
  };
  return createHash('sha256').update(JSON.stringify(canon)).digest('hex').slice(0, 32);
}

/** Options of {@link buildToolkitImage}. */
export interface BuildToolkitOptions {
  /** Base image ref; it must be a Debian `suite` image with apt (e.g. from bootstrapDebian). */
  base: string;
  /** Name and tag of the new image. */
  name: string;
  tag: string;
  /** Packages to install (`apt-get install --no-install-recommends`); at least one. */
  packages: string[];
  /** Debian suite of the base; only `"bookworm"`. */
  suite?: 'bookworm';
  /** Archive URI (http, https or file); default {@link detectMirror}(suite). */
  mirror?: string;
  /** Cache directory (absolute); default /var/cache/dsec/bootstrap. */
  cacheDir?: string;
  /** Ignore (and replace) a cached tree. */
  refresh?: boolean;
  /** apt's output lines and dsec's own steps (`dsec: …`). */
  onProgress?(line: string): void;
  /** Aborts: apt's process group is killed, everything is unmounted and removed, the promise rejects with `signal.reason`. */
  signal?: AbortSignal;
}

/**
 * Builds (or takes from the cache) the toolkit layer of `packages` over the image `base`
 * and stores the manifest `<name>:<tag>` = [...base layers, toolkit layer] with the base's
 * config, replacing an earlier manifest of that name. Returns the stored manifest.
 *
 * Needs root, the native addon (mounts), `chroot`, `mknod`, `tar`, `mkfs.erofs`, and the
 * network path to the mirror on a cache miss.
 *
 * Throws DsecError: InvalidArgument (bad name/tag/package/mirror/cacheDir, base image of
 * too many layers, or a package apt cannot find — the message names it), NotFound (no
 * base image), FailedPrecondition (not root, a tool missing), Unavailable (the mirror
 * could not be reached), Internal (apt or tar failed otherwise; the message quotes the
 * tail of apt's output). Rejects with `signal.reason` when aborted. Every mount is undone
 * and the scratch dir removed in every case.
 */
export async function buildToolkitImage(store: LayerStore, opts: BuildToolkitOptions): Promise<ImageManifest> {
  const suite = opts.suite ?? 'bookworm';
  const packages = [...new Set(opts.packages)];
  const cacheDir = resolve(opts.cacheDir ?? DEFAULT_BOOTSTRAP_CACHE_DIR);
  const progress = (l: string) => opts.onProgress?.(l);
  const signal = opts.signal;

  if (suite !== 'bookworm') throw new DsecError('InvalidArgument', `unsupported suite ${JSON.stringify(suite)}: only bookworm`);
  if (packages.length === 0) throw new DsecError('InvalidArgument', 'a toolkit needs at least one package');
  for (const p of packages) if (!PKG_RE.test(p)) throw new DsecError('InvalidArgument', `invalid package name ${JSON.stringify(p)}`);
  parseRef(`${opts.name}:${opts.tag}`);
  // Overlay options carry paths below cacheDir: no separators, escapes or whitespace.
  if (/[\s,:\\]/.test(cacheDir)) throw new DsecError('InvalidArgument', `cache dir ${cacheDir} must not contain whitespace, ',', ':' or '\\'`);
  if (process.getuid?.() !== 0) throw new DsecError('FailedPrecondition', 'building a toolkit layer needs root (it mounts an overlay and chroots into it)');
  signal?.throwIfAborted();

  const base = await store.get(opts.base);
  if (base.layers.length + 1 > MAX_LAYERS) throw new DsecError('InvalidArgument', `base image ${opts.base} has ${base.layers.length} layers; a toolkit on top would exceed ${MAX_LAYERS}`);
  const mirror = (opts.mirror ?? (await detectMirror(suite))).replace(/\/+$/, '');
  if (!/^(https?|file):\/\/[^\s]+$/.test(mirror)) throw new DsecError('InvalidArgument', `invalid mirror ${JSON.stringify(mirror)}: want an http(s):// or file:// URI`);

  const key = toolkitCacheKey({ baseLayers: base.layers, packages, mirror });
  const zstd = await hasTool('zstd');
  const treesDir = join(cacheDir, 'toolkits');
  const cached = join(treesDir, `${key}.tar${zstd ? '.zst' : ''}`);
  const found = [cached, ...(zstd ? [join(treesDir, `${key}.tar`)] : [])].find((f) => existsSync(f));
  const workRoot = join(cacheDir, 'work');
  for (const d of [treesDir, workRoot, join(cacheDir, 'apt-archives')]) await mkdir(d, { recursive: true, mode: 0o700 });
  await reclaimStaleWork(workRoot, progress);

  const work = join(workRoot, `toolkit-${process.pid}-${randomBytes(6).toString('hex')}`);
  const tree = join(work, 'tree');
  await mkdir(work, { mode: 0o700 });
  try {
    let fromCache = false;
    if (!opts.refresh && found) {
      progress(`dsec: cache hit ${found}: unpacking`);
      try {
        await untar(found, tree, signal);
        fromCache = true;
      } catch (e) {
        signal?.throwIfAborted();
        progress(`dsec: cached tree unusable (${(e as Error).message.split('\n')[0]}); rebuilding from ${mirror}`);
        await rm(found, { force: true });
        await removeTree(tree);
      }
    }
    if (!fromCache) {
      const upper = join(work, 'upper');
      await installInOverlay({ store, work, upper, lowers: base.layers, packages, suite, mirror, archives: join(cacheDir, 'apt-archives'), progress, signal });
      signal?.throwIfAborted();
      progress('dsec: cleaning the upper dir');
      await cleanUpper(upper);
      // The layer is always packed from the tar unpacked (see the module comment).
      const tar = join(work, `toolkit.tar${zstd ? '.zst' : ''}`);
      await execa('tar', ['--create', `--file=${tar}`, `--directory=${upper}`, ...TAR_META_FLAGS, ...OVERLAY_PRIVATE_XATTRS.map((x) => `--xattrs-exclude=${x}`), '--sort=name', ...(zstd ? ['--zstd'] : []), '.'], {
        stdin: 'ignore',
        cancelSignal: signal,
        env: { PATH: `${TOOL_PATH}:${process.env.PATH ?? ''}` },
      });
      await untar(tar, tree, signal);
      await checkNoPrivateXattrs(tree);
      progress(`dsec: caching the tree in ${cached}`);
      try {
        await rename(tar, cached);
        const meta = { key, base: opts.base, base_layers: base.layers, packages: [...packages].sort(), mirror, suite, format: TOOLKIT_FORMAT, created: new Date().toISOString() };
        await writeFile(join(treesDir, `${key}.json`), `${JSON.stringify(meta, null, 2)}\n`);
      } catch (e) {
        // The image can still be built; only the next run is slower.
        progress(`dsec: could not cache the tree: ${(e as Error).message.split('\n')[0]}`);
      }
    }
    signal?.throwIfAborted();
    progress('dsec: packing the toolkit layer');
    const source = `apt:${[...packages].sort().join(',')}@${mirror} over ${opts.base}${fromCache ? ` (cached tree ${key})` : ''}`;
    // Device check stays on: whiteouts (char 0:0) pass, anything else would be a bug.
    const { digest, sizeBytes } = await store.addLayerFromDir(tree, { source });
    progress(`dsec: layer ${digest} (${(sizeBytes / 2 ** 20).toFixed(1)} MiB)`);
    const manifest: ImageManifest = { name: opts.name, tag: opts.tag, layers: [...base.layers, digest], config: structuredClone(base.config), created_ms: Date.now() };
    await store.putManifest(manifest);
    progress(`dsec: stored ${opts.name}:${opts.tag}`);
    return manifest;
  } catch (e) {
    if (signal?.aborted) throw signal.reason;
    throw e;
  } finally {
    await removeTree(work);
  }
}

/** Options of {@link bootstrapToolkit}. */
export interface BootstrapToolkitOptions {
  /** Image name and tag; default from {@link TOOLKITS} (`judge:bookworm`). */
  name?: string;
  tag?: string;
  /** Packages on top of the toolkit's own. */
  include?: string[];
  mirror?: string;
  cacheDir?: string;
  refresh?: boolean;
  /** Lines of debootstrap (phase `debootstrap`, only when the base is built) and of the toolkit build (phase `toolkit`). */
  onProgress?(line: string, phase: 'debootstrap' | 'toolkit'): void;
  signal?: AbortSignal;
}

/**
 * `dsec image bootstrap <toolkit>`: the toolkit's base image (bootstrapped with
 * {@link bootstrapDebian} and its defaults when the store lacks it), then
 * {@link buildToolkitImage}. Errors as those two.
 */
export async function bootstrapToolkit(store: LayerStore, toolkit: ToolkitName, opts: BootstrapToolkitOptions = {}): Promise<ImageManifest> {
  const t = TOOLKITS[toolkit];
  if (!t) throw new DsecError('InvalidArgument', `unknown toolkit ${JSON.stringify(toolkit)}: want one of ${Object.keys(TOOLKITS).join(', ')}`);
  const def = parseRef(t.image);
  const name = opts.name ?? def.name;
  const tag = opts.tag ?? def.tag;
  const packages = [...t.packages, ...(opts.include ?? [])];
  for (const p of packages) if (!PKG_RE.test(p)) throw new DsecError('InvalidArgument', `invalid package name ${JSON.stringify(p)}`);
  parseRef(`${name}:${tag}`);
  const baseRef = parseRef(t.base);
  try {
    await store.get(t.base);
  } catch (e) {
    if (!isDsecError(e, 'NotFound')) throw e;
    opts.onProgress?.(`dsec: ${t.base} is not in the store: bootstrapping it first`, 'toolkit');
    await bootstrapDebian(store, { name: baseRef.name, tag: baseRef.tag, mirror: opts.mirror, cacheDir: opts.cacheDir, onProgress: (l) => opts.onProgress?.(l, 'debootstrap'), signal: opts.signal });
  }
  return buildToolkitImage(store, {
    base: t.base,
    name,
    tag,
    packages,
    mirror: opts.mirror,
    cacheDir: opts.cacheDir,
    refresh: opts.refresh,
    onProgress: (l) => opts.onProgress?.(l, 'toolkit'),
    signal: opts.signal,
  });
}

/** Extracts tar `file` (zstd when it ends in .zst) into `dir` (created), keeping owners, modes, xattrs, devices. */
async function untar(file: string, dir: string, signal?: AbortSignal): Promise<void> {
  await mkdir(dir, { mode: 0o755 });
  await execa('tar', ['--extract', `--file=${file}`, `--directory=${dir}`, ...TAR_META_FLAGS, '--same-permissions', '--same-owner', ...(file.endsWith('.zst') ? ['--zstd'] : [])], {
    stdin: 'ignore',
    cancelSignal: signal,
    env: { PATH: `${TOOL_PATH}:${process.env.PATH ?? ''}` },
  });
}

/**
 * Refuses (Internal) a tree that still carries an overlayfs xattr other than
 * `trusted.overlay.opaque` (a new kernel's bookkeeping not in OVERLAY_PRIVATE_XATTRS).
 * Skipped when `getfattr` (Debian package `attr`) is not installed.
 */
async function checkNoPrivateXattrs(tree: string): Promise<void> {
  if (!(await hasTool('getfattr'))) return;
  const r = await execa('getfattr', ['--recursive', '--physical', '--no-dereference', '--absolute-names', '--match=^trusted\\.overlay\\.', tree], {
    reject: false,
    stdin: 'ignore',
    env: { PATH: `${TOOL_PATH}:${process.env.PATH ?? ''}` },
  });
  const names = String(r.stdout)
    .split('\n')
    .filter((l) => l && !l.startsWith('#'))
    .map((l) => l.replace(/=.*$/, '').trim());
  const bad = [...new Set(names.filter((n) => n !== 'trusted.overlay.opaque'))];
  if (bad.length) throw new DsecError('Internal', `toolkit tree ${tree} still has overlay xattrs ${bad.join(', ')}: add them to OVERLAY_PRIVATE_XATTRS`);
}

/**
 * Paths of an upper dir that a toolkit layer must not change, relative to the root: for
 * each dir, which entries to remove (`all`, or a predicate on the name). Removing an
 * upper entry reverts the path to what the base has (the base was cleaned by cleanTree),
 * so whiteouts here are removed as well.
 */
const REVERT: ReadonlyArray<{ dir: string; match: 'all' | ((name: string) => boolean); deep?: boolean }> = [
  // apt state (bind-mounted away during the build; removed should anything get through).
  { dir: 'var/lib/apt/lists', match: 'all' },
  { dir: 'var/cache/apt', match: 'all' },
  // Temp and runtime dirs, and dev (all tmpfs during the build).
  { dir: 'tmp', match: 'all' },
  { dir: 'var/tmp', match: 'all' },
  { dir: 'run', match: 'all' },
  { dir: 'dev', match: 'all' },
  { dir: 'proc', match: 'all' },
  // Logs: every non-directory below var/log (apt's history/term logs, dpkg.log, alternatives.log).
  { dir: 'var/log', match: 'all', deep: true },
  // Backups dpkg and debconf keep of their databases, and lock files (empty copy-ups).
  { dir: 'var/lib/dpkg', match: (n) => n.endsWith('-old') || n === 'lock' || n === 'lock-frontend' },
  { dir: 'var/lib/dpkg/triggers', match: (n) => n === 'Lock' },
  { dir: 'var/cache/debconf', match: (n) => n.endsWith('-old') },
  // ldconfig's stat cache (inode numbers, ctimes): differs on every build, only speeds up
  // the next ldconfig run, which checks it anyway. /etc/ld.so.cache itself ships.
  { dir: 'var/cache/ldconfig', match: (n) => n === 'aux-cache' },
  // Host identity (bind-mounted during the build; the base keeps its own values).
  { dir: 'etc', match: (n) => n === 'resolv.conf' || n === 'hostname' || n === 'machine-id' || n === 'mtab' },
  { dir: 'var/lib/dbus', match: (n) => n === 'machine-id' },
];

/**
 * Removes from an overlay upper dir what a toolkit layer must not ship (see REVERT):
 * anything under var/lib/apt/lists, var/cache/apt, tmp, var/tmp, run, dev and proc; every
 * non-directory below var/log; dpkg's and debconf's `*-old` backups, dpkg's lock files and
 * ldconfig's aux-cache;
 * etc/resolv.conf, etc/hostname, etc/machine-id, etc/mtab and var/lib/dbus/machine-id.
 * Each removal reverts the path to the base layer's content. Directories under var/log
 * stay (they merge with the base's). Symlinks are removed, never followed. Idempotent;
 * returns the removed paths (relative, sorted). Throws on unexpected fs errors.
 */
export async function cleanUpper(upper: string): Promise<string[]> {
  const removed: string[] = [];
  const ents = async (rel: string) => {
    // lstat: a symlinked dir in the upper is itself an entry to judge, never followed.
    const st = await lstat(join(upper, rel)).catch(() => undefined);
    if (!st?.isDirectory()) return [];
    return readdir(join(upper, rel), { withFileTypes: true });
  };
  const drop = async (rel: string) => {
    await rm(join(upper, rel), { recursive: true, force: true });
    removed.push(rel);
  };
  const deepFiles = async (rel: string): Promise<void> => {
    for (const e of await ents(rel)) {
      const r = `${rel}/${e.name}`;
      if (e.isDirectory()) await deepFiles(r);
      else await drop(r);
    }
  };
  for (const rule of REVERT) {
    if (rule.deep) {
      await deepFiles(rule.dir);
      continue;
    }
    for (const e of await ents(rule.dir)) {
      if (rule.match === 'all' || rule.match(e.name)) await drop(`${rule.dir}/${e.name}`);
    }
  }
  return removed.sort();
}

/** What {@link classifyAptFailure} found in apt's output. */
export interface AptFailure {
  kind: 'InvalidArgument' | 'Unavailable' | 'Internal';
  /** Package names apt could not find (InvalidArgument only). */
  missing: string[];
}

/**
 * Classifies failed apt-get output: packages it cannot find (`E: Unable to locate package
 * X`, `E: Package 'X' has no installation candidate`) are InvalidArgument; a mirror that
 * cannot be reached (resolve/connect/fetch failures) Unavailable; anything else Internal.
 * Pure; never throws.
 */
export function classifyAptFailure(output: string): AptFailure {
  const missing: string[] = [];
  for (const m of output.matchAll(/^E: (?:Unable to locate package (\S+)|Package '([^']+)' has no installation candidate)/gm)) {
    const p = m[1] ?? m[2];
    if (p && !missing.includes(p)) missing.push(p);
  }
  if (missing.length) return { kind: 'InvalidArgument', missing };
  if (/Could not resolve|Temporary failure resolving|Failed to fetch|Unable to connect|Could not connect|Connection refused|Connection timed out|No route to host|Network is unreachable/i.test(output)) {
    return { kind: 'Unavailable', missing };
  }
  return { kind: 'Internal', missing };
}

/** Everything {@link installInOverlay} needs. */
interface InstallArgs {
  store: LayerStore;
  work: string;
  upper: string;
  lowers: string[];
  packages: string[];
  suite: string;
  mirror: string;
  /** Persistent apt .deb cache: seeds the build's var/cache/apt/archives and receives its new debs. */
  archives: string;
  progress: (l: string) => void;
  signal?: AbortSignal;
}

/**
 * Mounts base + fresh `upper` as an overlay with the chroot's mounts (see the module
 * comment), runs apt-get update and install in it, and unmounts everything again — also
 * when anything fails. Leaves `upper` holding the change.
 */
async function installInOverlay(a: InstallArgs): Promise<void> {
  const c = native.constants();
  const lowerRoot = join(a.work, 'lower');
  const merged = join(a.work, 'merged');
  const ovlWork = join(a.work, 'ovlwork');
  const aptLists = join(a.work, 'apt-lists');
  const aptCache = join(a.work, 'apt-cache');
  for (const d of [lowerRoot, merged, ovlWork, aptLists, join(aptLists, 'partial'), aptCache, join(aptCache, 'archives', 'partial')]) await mkdir(d, { recursive: true, mode: 0o755 });
  // apt locks its archives dir for the whole install: each build gets its own, seeded from
  // the shared .deb cache by hard links (apt checks every cached file's hash before use).
  await linkDebs(a.archives, join(aptCache, 'archives'));
  // The layer's root dir takes the upper's attributes: make them the base's (root 0755).
  await mkdir(a.upper, { mode: 0o755 });
  await chown(a.upper, 0, 0);
  await chmod(a.upper, 0o755);

  // Lower mounts are undone last: the opaque pass below reads them after the overlay is gone.
  const lowerMounts: string[] = [];
  const mounted: string[] = [];
  const mnt = (source: string | null, target: string, fstype: string | null, flags: number, data: string | null) => {
    native.mount(source, target, fstype, flags, data);
    mounted.push(target);
  };
  const unmountStack = (stack: string[]): unknown => {
    let firstError: unknown;
    while (stack.length) {
      const m = stack.pop() as string;
      try {
        native.unmountAll(m);
      } catch (e) {
        firstError ??= e;
      }
    }
    return firstError;
  };
  /** A mount point that must already exist in the merged tree (creating one would land in the upper). */
  const inMerged = async (rel: string, kind: 'dir' | 'file'): Promise<string> => {
    const p = join(merged, rel);
    const st = await lstat(p).catch(() => undefined);
    if (!st || (kind === 'dir' ? !st.isDirectory() : !st.isFile())) {
      throw new DsecError('FailedPrecondition', `base image has no ${kind === 'dir' ? 'directory' : 'regular file'} /${rel} to mount over; is it a Debian image?`);
    }
    return p;
  };
  try {
    const dirs: string[] = [];
    for (let i = 0; i < a.lowers.length; i++) {
      const blob = await a.store.prepareForMount(a.lowers[i]);
      const at = join(lowerRoot, String(i));
      await mkdir(at, { mode: 0o755 });
      native.mount(blob, at, 'erofs', c.MS_RDONLY | c.MS_NODEV | c.MS_NOSUID, null);
      lowerMounts.push(at);
      dirs.push(at);
    }
    mnt('overlay', merged, 'overlay', 0, `lowerdir=${[...dirs].reverse().join(':')},upperdir=${a.upper},workdir=${ovlWork},${OVERLAY_OPTIONS}`);
    // Nothing mounted below merged/ may propagate to (or from) other mount namespaces.
    native.mount(null, merged, null, c.MS_REC | c.MS_PRIVATE, null);

    mnt('proc', await inMerged('proc', 'dir'), 'proc', c.MS_NOSUID | c.MS_NODEV | c.MS_NOEXEC, null);
    const dev = await inMerged('dev', 'dir');
    mnt('tmpfs', dev, 'tmpfs', c.MS_NOSUID | c.MS_NOEXEC, 'mode=0755,size=1m');
    for (const [n, major, minor] of [['null', 1, 3], ['zero', 1, 5], ['full', 1, 7], ['random', 1, 8], ['urandom', 1, 9], ['tty', 5, 0]] as const) {
      await execa('mknod', ['-m', '666', join(dev, n), 'c', String(major), String(minor)], { stdin: 'ignore', env: { PATH: `${TOOL_PATH}:${process.env.PATH ?? ''}` } });
    }
    for (const [n, target] of [['fd', '/proc/self/fd'], ['stdin', '/proc/self/fd/0'], ['stdout', '/proc/self/fd/1'], ['stderr', '/proc/self/fd/2']]) await symlink(target, join(dev, n));
    await mkdir(join(dev, 'pts'));
    await mkdir(join(dev, 'shm'), { mode: 0o1777 });
    await chmod(join(dev, 'shm'), 0o1777);

    const run = await inMerged('run', 'dir');
    mnt('tmpfs', run, 'tmpfs', c.MS_NOSUID | c.MS_NODEV, 'mode=0755');
    mnt('tmpfs', await inMerged('tmp', 'dir'), 'tmpfs', c.MS_NOSUID | c.MS_NODEV, 'mode=1777');
    mnt('tmpfs', await inMerged('var/tmp', 'dir'), 'tmpfs', c.MS_NOSUID | c.MS_NODEV, 'mode=1777');
    mnt(aptLists, await inMerged('var/lib/apt/lists', 'dir'), null, c.MS_BIND, null);
    const cacheAt = await inMerged('var/cache/apt', 'dir');
    mnt(aptCache, cacheAt, null, c.MS_BIND, null);
    if (existsSync('/etc/resolv.conf')) mnt('/etc/resolv.conf', await inMerged('etc/resolv.conf', 'file'), null, c.MS_BIND, null);

    // apt's configuration for this build lives on the /run tmpfs.
    await mkdir(join(run, 'dsec', 'sources.list.d'), { recursive: true, mode: 0o755 });
    let uri = a.mirror;
    if (a.mirror.startsWith('file://')) {
      const at = join(run, 'dsec', 'mirror');
      await mkdir(at);
      mnt(a.mirror.slice('file://'.length), at, null, c.MS_BIND, null);
      native.mount(null, at, null, c.MS_REMOUNT | c.MS_BIND | c.MS_RDONLY, null);
      uri = 'file:///run/dsec/mirror';
    }
    await writeFile(join(run, 'dsec', 'sources.list'), `deb ${uri} ${a.suite} main\n`, { mode: 0o644 });

    const aptOpts = [
      '-q',
      '-o', 'Dir::Etc::SourceList=/run/dsec/sources.list',
      '-o', 'Dir::Etc::SourceParts=/run/dsec/sources.list.d',
      '-o', 'Acquire::Languages=none',
      '-o', 'Acquire::Retries=3',
      '-o', 'APT::Update::Error-Mode=any',
      '-o', 'Dpkg::Use-Pty=0',
    ];
    await runApt(merged, [...aptOpts, 'update'], a);
    await runApt(merged, [...aptOpts, '-y', '--no-install-recommends', 'install', '--', ...a.packages], a);
    await linkDebs(join(aptCache, 'archives'), a.archives);
    // The upper dir is only touched once the overlay is gone.
    const e = unmountStack(mounted);
    if (e) throw e;
    await dropStrayOpaque(a.upper, dirs, a.progress);
  } finally {
    const e1 = unmountStack(mounted);
    const e2 = unmountStack(lowerMounts);
    const e = e1 ?? e2;
    // removeTree (the caller's finally) checks mountinfo again before deleting anything.
    if (e) a.progress(`dsec: unmount failed: ${(e as Error).message}`);
  }
}

/**
 * Clears `trusted.overlay.opaque` on upper dirs that no lower has as a directory.
 * overlayfs marks some directories it creates in a merged parent opaque (an optimisation:
 * lookups then skip the lowers). Where the base has no such directory the marker hides
 * nothing, but the layer would hide that directory of any other base it is composed on.
 * Opaque dirs that replace a base directory keep the marker. Skipped (with a progress line)
 * when getfattr/setfattr (Debian package `attr`) are missing. Returns how many were cleared.
 */
async function dropStrayOpaque(upper: string, lowers: string[], progress: (l: string) => void): Promise<number> {
  if (!(await hasTool('getfattr')) || !(await hasTool('setfattr'))) {
    progress('dsec: getfattr/setfattr not installed (package attr): opaque markers of new directories are kept');
    return 0;
  }
  const env = { PATH: `${TOOL_PATH}:${process.env.PATH ?? ''}` };
  const r = await execa('getfattr', ['--recursive', '--physical', '--no-dereference', '--absolute-names', '--match=^trusted\\.overlay\\.opaque$', upper], { stdin: 'ignore', env });
  const stray: string[] = [];
  for (const line of String(r.stdout).split('\n')) {
    if (!line.startsWith('# file: ')) continue;
    const p = unescapeMountinfo(line.slice('# file: '.length));
    const rel = relative(upper, p);
    if (!rel || rel.startsWith('..')) continue;
    let inLower = false;
    for (const l of lowers) if ((await lstat(join(l, rel)).catch(() => undefined))?.isDirectory()) inLower = true;
    if (!inLower) stray.push(p);
  }
  for (let i = 0; i < stray.length; i += 256) {
    await execa('setfattr', ['--no-dereference', '--remove=trusted.overlay.opaque', '--', ...stray.slice(i, i + 256)], { stdin: 'ignore', env });
  }
  if (stray.length) progress(`dsec: cleared the opaque marker of ${stray.length} new ${stray.length === 1 ? 'directory' : 'directories'}`);
  return stray.length;
}

/** Hard-links (copies across filesystems) every `*.deb` of `from` that `to` lacks into `to`. */
async function linkDebs(from: string, to: string): Promise<void> {
  for (const n of await readdir(from).catch(() => [] as string[])) {
    if (!n.endsWith('.deb')) continue;
    try {
      await link(join(from, n), join(to, n));
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === 'EXDEV') await copyFile(join(from, n), join(to, n));
      else if (code !== 'EEXIST') throw e;
    }
  }
}

/** Runs `chroot merged apt-get args` with a clean environment, forwarding its lines; throws as documented on buildToolkitImage. */
async function runApt(merged: string, args: string[], a: InstallArgs): Promise<void> {
  a.progress(`dsec: apt-get ${args.filter((x) => x !== '-o' && !x.includes('::')).join(' ')}`);
  const sub = execa('chroot', [merged, '/usr/bin/apt-get', ...args], {
    all: true,
    reject: false,
    stdin: 'ignore',
    // Its own process group, so an abort reaches dpkg and maintainer scripts too.
    detached: true,
    // Nothing of dsecd's environment goes into the chroot.
    extendEnv: false,
    env: { PATH: TOOL_PATH, HOME: '/root', LC_ALL: 'C', DEBIAN_FRONTEND: 'noninteractive', DEBCONF_NONINTERACTIVE_SEEN: 'true' },
  });
  // apt's own error and warning lines, wherever they fall: the tail alone may miss them.
  const all: string[] = [];
  const { result: r, tail } = await followGroup(sub, a.signal, (l) => {
    if (l.startsWith('E: ') || l.startsWith('W: ') || l.startsWith('Err:')) all.push(l);
    a.progress(l);
  });
  if (r.exitCode === 0) return;
  const text = `${all.join('\n')}\n${tail.join('\n')}`;
  const f = classifyAptFailure(text);
  if (f.kind === 'InvalidArgument') {
    throw unknownPackages(f.missing, a.suite, a.mirror, r);
  }
  throw new DsecError(f.kind, `apt-get ${args.at(-1) === 'update' ? 'update' : 'install'} from ${a.mirror} failed (exit ${r.exitCode ?? r.signal ?? 'none'}):\n${tail.join('\n')}`, { cause: r });
}

