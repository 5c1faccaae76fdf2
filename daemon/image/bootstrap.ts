/**
 * `dsec image bootstrap debian`: a real-world base image built from a Debian mirror.
 *
 * {@link bootstrapDebian} runs `debootstrap --variant=minbase --include=<pkgs> <suite>`
 * into a scratch tree, removes what must not ship in an image (see {@link cleanTree}),
 * packs the tree into ONE EROFS layer with {@link LayerStore.addLayerFromDir} and stores
 * the manifest `<name>:<tag>` (default `debian:bookworm`).
 *
 * Cache (under `cacheDir`, default /var/cache/dsec/bootstrap):
 *
 *   trees/<key>.tar[.zst]   the finished, cleaned tree as a tar (zstd-compressed when the
 *                           `zstd` binary is on PATH), keyed by {@link bootstrapCacheKey}:
 *                           sha256 over suite, variant, sorted package list, mirror,
 *                           `debootstrap --version`, dpkg architecture and the cleaning
 *                           format version. A hit skips debootstrap entirely: unpack +
 *                           mkfs.erofs, seconds instead of minutes.
 *   trees/<key>.json        what the key was made of, and when (for operators).
 *   debs/                   debootstrap's own `--cache-dir` (.deb files), so even a tree
 *                           cache miss downloads each package version at most once.
 *   work/build-<pid>-<hex>/ scratch trees. Removed on success and on failure; dirs of
 *                           dead processes (a crash) are reclaimed by the next run.
 *   toolkits/, apt-archives/, work/toolkit-<pid>-<hex>/
 *                           toolkit layers on top of a bootstrapped image (toolkit.ts).
 *
 * A fresh machine (empty cache) rebuilds from the mirror. A cached tree is frozen at the
 * package versions of the day it was built: pass `refresh: true` to rebuild it.
 *
 * Safety: debootstrap mounts /proc (and may mount /sys) inside its target. Before any
 * scratch tree is deleted, every mount under it is unmounted (lazily if busy) and the
 * removal is refused if one remains, so a recursive delete never walks into a host
 * filesystem.
 */
import { createHash, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { chmod, chown, lstat, mkdir, readdir, readFile, rename, rm, truncate, unlink, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { execa } from 'execa';
import { DsecError } from '../errors.js';
import * as native from '../host/native.js';
import { listMountsUnder } from './rootfs.js';
import { parseRef, type ImageManifest, type LayerStore } from './layer-store.js';

/** Options of {@link bootstrapDebian}. */
export interface BootstrapDebianOptions {
  /** Image name; default `"debian"`. */
  name?: string;
  /** Image tag; default `"bookworm"`. */
  tag?: string;
  /** Debian suite; only `"bookworm"` for now. */
  suite?: 'bookworm';
  /**
   * Archive URI (http, https or file). Default: the first Debian archive URI that apt on
   * this host uses for the suite (see {@link detectMirror}), else http://deb.debian.org/debian.
   */
  mirror?: string;
  /** Packages on top of minbase; default `['python3', 'git']`. */
  include?: string[];
  /** Cache directory (absolute); default `/var/cache/dsec/bootstrap`. See the module comment. */
  cacheDir?: string;
  /** Ignore (and replace) a cached tree: run debootstrap against the mirror again. Default false. */
  refresh?: boolean;
  /** Called with each line debootstrap prints (`I: Retrieving …`) and with dsec's own steps (`dsec: …`). */
  onProgress?(line: string): void;
  /** Aborts the bootstrap: debootstrap's process group is killed, scratch dirs are removed, and the promise rejects with `signal.reason`. */
  signal?: AbortSignal;
}

/** Default archive when the host's apt sources name none. */
export const DEFAULT_DEBIAN_MIRROR = 'http://deb.debian.org/debian';
/** Default cache directory. */
export const DEFAULT_BOOTSTRAP_CACHE_DIR = '/var/cache/dsec/bootstrap';
/** Default extra packages: what agentic SWE tasks need first (an interpreter and git). */
export const DEFAULT_BOOTSTRAP_INCLUDE: readonly string[] = ['python3', 'git'];
/** Process defaults of bootstrapped images (Debian's login defaults for root). */
export const DEBIAN_IMAGE_CONFIG: ImageManifest['config'] = {
  env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'HOME=/root', 'LANG=C.UTF-8'],
  cwd: '/root',
  user: '0',
  cmd: ['/bin/bash'],
};

/**
 * Version of what {@link cleanTree} does to a tree. Part of the cache key: bump it when
 * the cleaning changes, so trees cleaned the old way are not reused.
 */
const TREE_FORMAT = 'dsec-debian-tree-v1';
const VARIANT = 'minbase';
/** sbin dirs first: debootstrap, chroot and dpkg's helpers live there and Node's PATH may lack them. */
export const TOOL_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
/** Debian package names (policy §5.6.1). */
export const PKG_RE = /^[a-z0-9][a-z0-9+.-]+$/;
/** Lines of debootstrap output (and of its log) quoted in an error. */
const ERROR_TAIL_LINES = 25;

/** One entry of an apt sources file, reduced to what mirror detection needs. */
export interface AptSource {
  types: string[];
  uris: string[];
  suites: string[];
}

/**
 * Parses apt sources text: one-line `.list` format (`deb [opts] URI suite comp…`) when
 * `format` is `'list'`, deb822 stanzas (`Types:`, `URIs:`, `Suites:`; `Enabled: no`
 * skips a stanza) when `'sources'`. Comments and malformed lines are ignored; never throws.
 */
export function parseAptSources(text: string, format: 'list' | 'sources'): AptSource[] {
  const out: AptSource[] = [];
  if (format === 'list') {
    for (const raw of text.split('\n')) {
      const line = raw.replace(/#.*/, '').trim();
      if (!line) continue;
      const noOpts = line.replace(/\[[^\]]*\]/, ' ');
      const f = noOpts.split(/\s+/).filter(Boolean);
      if (f.length < 3 || (f[0] !== 'deb' && f[0] !== 'deb-src')) continue;
      out.push({ types: [f[0]], uris: [f[1]], suites: [f[2]] });
    }
    return out;
  }
  for (const stanza of text.split(/\n\s*\n/)) {
    const fields = new Map<string, string>();
    let last: string | undefined;
    for (const raw of stanza.split('\n')) {
      if (raw.startsWith('#')) continue;
      if (/^\s/.test(raw) && last) {
        fields.set(last, `${fields.get(last)} ${raw.trim()}`);
        continue;
      }
      const m = /^([A-Za-z0-9-]+):\s*(.*)$/.exec(raw);
      if (m) {
        last = m[1].toLowerCase();
        fields.set(last, m[2].trim());
      }
    }
    if ((fields.get('enabled') ?? 'yes').toLowerCase() === 'no') continue;
    const words = (k: string) => (fields.get(k) ?? '').split(/\s+/).filter(Boolean);
    const src = { types: words('types'), uris: words('uris'), suites: words('suites') };
    if (src.types.length && src.uris.length && src.suites.length) out.push(src);
  }
  return out;
}

/**
 * The archive URI apt on this host uses for `suite`: the first URI of a `deb` source
 * (in /etc/apt/sources.list, then /etc/apt/sources.list.d/*.list and *.sources in name
 * order — apt's order) that lists `suite` itself (so `bookworm-security` archives are
 * skipped) with an http, https or file scheme. Trailing slashes are removed.
 * Returns {@link DEFAULT_DEBIAN_MIRROR} when none matches or the files are unreadable.
 * `aptDir` (default `/etc/apt`) exists for tests.
 */
export async function detectMirror(suite: string, aptDir = '/etc/apt'): Promise<string> {
  const files: Array<[string, 'list' | 'sources']> = [[join(aptDir, 'sources.list'), 'list']];
  const d = join(aptDir, 'sources.list.d');
  const names = await readdir(d).catch(() => [] as string[]);
  for (const n of names.sort()) {
    if (n.endsWith('.list')) files.push([join(d, n), 'list']);
    else if (n.endsWith('.sources')) files.push([join(d, n), 'sources']);
  }
  for (const [file, format] of files) {
    const text = await readFile(file, 'utf8').catch(() => '');
    for (const s of parseAptSources(text, format)) {
      if (!s.types.includes('deb') || !s.suites.includes(suite)) continue;
      const uri = s.uris.find((u) => /^(https?|file):\/\//.test(u));
      if (uri) return uri.replace(/\/+$/, '');
    }
  }
  return DEFAULT_DEBIAN_MIRROR;
}

/** Inputs of the tree cache key (see the module comment). */
export interface BootstrapCacheKeyInput {
  suite: string;
  mirror: string;
  include: string[];
  /** `debootstrap --version` output, e.g. `"debootstrap 1.0.128+nmu2+deb12u2"`. */
  debootstrapVersion: string;
  /** dpkg architecture, e.g. `"amd64"`. */
  arch: string;
}

/**
 * The tree cache key: 32 hex digits of sha256 over the cleaning format, variant, suite,
 * sorted de-duplicated package list, mirror (without trailing `/`), debootstrap version
 * and architecture. Pure; never throws.
 */
export function bootstrapCacheKey(k: BootstrapCacheKeyInput): string {
  const canon = {
    format: TREE_FORMAT,
    variant: VARIANT,
    suite: k.suite,
    include: [...new Set(k.include)].sort(),
    mirror: k.mirror.replace(/\/+$/, ''),
    debootstrap: k.debootstrapVersion.trim(),
    arch: k.arch.trim(),
  };
  return createHash('sha256').update(JSON.stringify(canon)).digest('hex').slice(0, 32);
}

/**
 * Builds (or takes from the cache) a Debian `suite` minbase tree with `include`, packs it
 * into one EROFS layer in `store` and stores the manifest `<name>:<tag>` with
 * {@link DEBIAN_IMAGE_CONFIG}, replacing an earlier manifest of that name. Returns the
 * stored manifest (one layer; `created_ms` = now).
 *
 * Needs root, `debootstrap` (Debian package `debootstrap`), `tar`, `mkfs.erofs`, and
 * the network path to the mirror on a cache miss. Progress goes to `onProgress`.
 *
 * Throws DsecError: InvalidArgument (bad name/tag/suite/package/mirror/cacheDir, or a
 * package the mirror does not have — the message names it), FailedPrecondition (not
 * root, debootstrap missing), Unavailable (the mirror could not
 * be reached or served a file that failed to download), Internal (debootstrap or tar
 * failed otherwise; the message quotes the tail of debootstrap's output and log), and
 * errors of LayerStore.addLayerFromDir / putManifest. Rejects with `signal.reason` when
 * aborted. Scratch dirs are removed in every case.
 */
export async function bootstrapDebian(store: LayerStore, opts: BootstrapDebianOptions = {}): Promise<ImageManifest> {
  const name = opts.name ?? 'debian';
  const tag = opts.tag ?? 'bookworm';
  const suite = opts.suite ?? 'bookworm';
  const include = [...new Set(opts.include ?? DEFAULT_BOOTSTRAP_INCLUDE)];
  const cacheDir = resolve(opts.cacheDir ?? DEFAULT_BOOTSTRAP_CACHE_DIR);
  const progress = (l: string) => opts.onProgress?.(l);
  const signal = opts.signal;

  if (suite !== 'bookworm') throw new DsecError('InvalidArgument', `unsupported suite ${JSON.stringify(suite)}: only bookworm`);
  for (const p of include) if (!PKG_RE.test(p)) throw new DsecError('InvalidArgument', `invalid package name ${JSON.stringify(p)}`);
  // Fail on a bad ref before spending minutes on debootstrap.
  parseRef(`${name}:${tag}`);
  if (/[\s,:]/.test(cacheDir)) throw new DsecError('InvalidArgument', `cache dir ${cacheDir} must not contain whitespace, ',' or ':'`);
  if (process.getuid?.() !== 0) throw new DsecError('FailedPrecondition', 'bootstrapping an image needs root (debootstrap chroots and creates root-owned files)');
  signal?.throwIfAborted();

  const mirror = (opts.mirror ?? (await detectMirror(suite))).replace(/\/+$/, '');
  if (!/^(https?|file):\/\/[^\s]+$/.test(mirror)) throw new DsecError('InvalidArgument', `invalid mirror ${JSON.stringify(mirror)}: want an http(s):// or file:// URI`);

  const debootstrapVersion = await toolOutput('debootstrap', ['--version'], 'debootstrap is not installed (apt-get install debootstrap)');
  const arch = await toolOutput('dpkg', ['--print-architecture'], 'dpkg is not installed');
  const key = bootstrapCacheKey({ suite, mirror, include, debootstrapVersion, arch });
  const zstd = await hasTool('zstd');
  const treesDir = join(cacheDir, 'trees');
  // Written with zstd when available; a plain .tar (written before zstd was installed) is read too.
  const cached = join(treesDir, `${key}.tar${zstd ? '.zst' : ''}`);
  const found = [cached, ...(zstd ? [join(treesDir, `${key}.tar`)] : [])].find((f) => existsSync(f));
  const workRoot = join(cacheDir, 'work');
  await mkdir(treesDir, { recursive: true, mode: 0o700 });
  await mkdir(join(cacheDir, 'debs'), { recursive: true, mode: 0o700 });
  await mkdir(workRoot, { recursive: true, mode: 0o700 });
  await reclaimStaleWork(workRoot, progress);

  const work = join(workRoot, `build-${process.pid}-${randomBytes(6).toString('hex')}`);
  const tree = join(work, 'tree');
  await mkdir(work, { mode: 0o700 });
  try {
    let fromCache = false;
    if (!opts.refresh && found) {
      progress(`dsec: cache hit ${found}: unpacking`);
      try {
        await mkdir(tree, { mode: 0o755 });
        await execa('tar', ['--extract', `--file=${found}`, `--directory=${tree}`, ...TAR_META_FLAGS, '--same-permissions', '--same-owner', ...(found.endsWith('.zst') ? ['--zstd'] : [])], {
          stdin: 'ignore',
          cancelSignal: signal,
          env: { PATH: `${TOOL_PATH}:${process.env.PATH ?? ''}` },
        });
        fromCache = true;
      } catch (e) {
        signal?.throwIfAborted();
        progress(`dsec: cached tree unusable (${(e as Error).message.split('\n')[0]}); rebuilding from ${mirror}`);
        await rm(found, { force: true });
        await removeTree(tree);
      }
    }
    if (!fromCache) {
      await runDebootstrap({ tree, suite, mirror, include, debsDir: join(cacheDir, 'debs'), progress, signal });
      progress('dsec: cleaning the tree');
      await cleanTree(tree);
      signal?.throwIfAborted();
      progress(`dsec: caching the tree in ${cached}`);
      const tmp = `${cached}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
      try {
        await execa('tar', ['--create', `--file=${tmp}`, `--directory=${tree}`, ...TAR_META_FLAGS, '--sort=name', ...(zstd ? ['--zstd'] : []), '.'], {
          stdin: 'ignore',
          cancelSignal: signal,
          env: { PATH: `${TOOL_PATH}:${process.env.PATH ?? ''}` },
        });
        await rename(tmp, cached);
        const meta = { key, suite, variant: VARIANT, include: [...include].sort(), mirror, debootstrapVersion, arch, format: TREE_FORMAT, created: new Date().toISOString() };
        await writeFile(join(treesDir, `${key}.json`), `${JSON.stringify(meta, null, 2)}\n`);
      } catch (e) {
        await rm(tmp, { force: true });
        signal?.throwIfAborted();
        // The image can still be built; only the next run is slower.
        progress(`dsec: could not cache the tree: ${(e as Error).message.split('\n')[0]}`);
      }
    }
    signal?.throwIfAborted();
    progress('dsec: packing the EROFS layer');
    const source = `debootstrap:${suite}/${VARIANT}${include.length ? `+${[...include].sort().join(',')}` : ''}@${mirror}${fromCache ? ` (cached tree ${key})` : ''}`;
    // The tree comes from debootstrap and cleanTree emptied dev/: no device nodes to look for.
    const { digest, sizeBytes } = await store.addLayerFromDir(tree, { source, skipDeviceCheck: true });
    progress(`dsec: layer ${digest} (${(sizeBytes / 2 ** 20).toFixed(1)} MiB)`);
    const manifest: ImageManifest = { name, tag, layers: [digest], config: structuredClone(DEBIAN_IMAGE_CONFIG), created_ms: Date.now() };
    await store.putManifest(manifest);
    progress(`dsec: stored ${name}:${tag}`);
    return manifest;
  } catch (e) {
    if (signal?.aborted) throw signal.reason;
    throw e;
  } finally {
    await removeTree(work);
  }
}

/** tar flags that keep what EROFS records: numeric owners, xattrs (e.g. security.capability). */
export const TAR_META_FLAGS = ['--numeric-owner', '--xattrs', '--xattrs-include=*'];

/** Trimmed stdout of `cmd args`; FailedPrecondition `missing` when it cannot be run. */
export async function toolOutput(cmd: string, args: string[], missing: string): Promise<string> {
  const r = await execa(cmd, args, { reject: false, stdin: 'ignore', env: { PATH: `${TOOL_PATH}:${process.env.PATH ?? ''}` } });
  if (r.failed) throw new DsecError('FailedPrecondition', missing, { cause: r });
  return String(r.stdout).trim();
}

/** True when `cmd` is on PATH (plus the sbin dirs). */
export async function hasTool(cmd: string): Promise<boolean> {
  for (const d of `${TOOL_PATH}:${process.env.PATH ?? ''}`.split(':')) {
    if (d && existsSync(join(d, cmd))) return true;
  }
  return false;
}

/** Runs debootstrap into `tree`, forwarding its output lines; throws as documented on bootstrapDebian. */
async function runDebootstrap(a: {
  tree: string;
  suite: string;
  mirror: string;
  include: string[];
  debsDir: string;
  progress: (l: string) => void;
  signal?: AbortSignal;
}): Promise<void> {
  const args = [`--variant=${VARIANT}`, `--cache-dir=${a.debsDir}`];
  if (a.include.length) args.push(`--include=${a.include.join(',')}`);
  args.push(a.suite, a.tree, a.mirror);
  a.progress(`dsec: debootstrap ${args.join(' ')}`);
  const sub = execa('debootstrap', args, {
    all: true,
    reject: false,
    stdin: 'ignore',
    // Its own process group, so an abort reaches dpkg and maintainer scripts in the chroot too.
    detached: true,
    env: { PATH: `${TOOL_PATH}:${process.env.PATH ?? ''}`, LC_ALL: 'C', DEBIAN_FRONTEND: 'noninteractive' },
  });
  const { result: r, tail } = await followGroup(sub, a.signal, a.progress);
  if (r.exitCode === 0) return;
  const log = await readFile(join(a.tree, 'debootstrap', 'debootstrap.log'), 'utf8').catch(() => '');
  const logTail = log.split('\n').filter(Boolean).slice(-ERROR_TAIL_LINES).join('\n');
  const text = `${tail.join('\n')}\n${logTail}`;
  const missing = missingPackages(text);
  if (missing.length > 0) {
    throw unknownPackages(missing, a.suite, a.mirror, r);
  }
  const unreachable = /Failed getting release file|Couldn't download|Could not resolve|Temporary failure|Connection refused|No route to host|Network is unreachable|Couldn't retrieve/i.test(text);
  throw new DsecError(
    unreachable ? 'Unavailable' : 'Internal',
    `debootstrap ${a.suite} from ${a.mirror} failed (exit ${r.exitCode ?? r.signal ?? 'none'}):\n${tail.join('\n')}${logTail ? `\n--- debootstrap.log (tail) ---\n${logTail}` : ''}`,
    { cause: r },
  );
}

/** The InvalidArgument for packages the suite does not have (debootstrap's or apt's), naming them. */
export function unknownPackages(missing: string[], suite: string, mirror: string, cause: unknown): DsecError {
  const many = missing.length !== 1;
  return new DsecError('InvalidArgument',
    `${many ? 'packages' : 'package'} ${missing.map((p) => JSON.stringify(p)).join(', ')} not found in ${suite} on ${mirror}: check the name${many ? 's' : ''} in include`, { cause });
}

/**
 * Follows a process started in its own process group (execa `detached: true`, `all:
 * true`): passes each output line to `onLine`, SIGKILLs the whole group when `signal`
 * aborts (so dpkg and maintainer scripts in a chroot die too), and resolves once it has
 * exited, with its result and its last {@link ERROR_TAIL_LINES} lines for error messages.
 * @throws the signal's reason when it aborted.
 */
export async function followGroup<R>(
  sub: PromiseLike<R> & { pid?: number; iterable(o: { from: 'all' }): AsyncIterable<unknown> },
  signal: AbortSignal | undefined,
  onLine: (line: string) => void,
): Promise<{ result: R; tail: string[] }> {
  const onAbort = () => {
    if (sub.pid) {
      try {
        process.kill(-sub.pid, 'SIGKILL');
      } catch {
        /* already gone */
      }
    }
  };
  signal?.addEventListener('abort', onAbort, { once: true });
  if (signal?.aborted) onAbort();
  const tail: string[] = [];
  try {
    for await (const line of sub.iterable({ from: 'all' })) {
      const l = String(line);
      tail.push(l);
      if (tail.length > ERROR_TAIL_LINES) tail.shift();
      onLine(l);
    }
    const result = await sub;
    signal?.throwIfAborted();
    return { result, tail };
  } finally {
    signal?.removeEventListener('abort', onAbort);
  }
}

/**
 * The packages debootstrap reports as unknown (`E: Couldn't find these debs: a b`, printed
 * when an `--include` package is not in the suite), in order, without duplicates; empty
 * when `output` has no such line. Pure; never throws.
 */
export function missingPackages(output: string): string[] {
  const out: string[] = [];
  for (const m of output.matchAll(/^E: Couldn't find these debs:(.*)$/gm)) {
    for (const p of m[1].trim().split(/\s+/)) if (p && !out.includes(p)) out.push(p);
  }
  return out;
}

/**
 * Removes from a freshly bootstrapped tree what must not ship in an image, in place:
 * apt lists and caches (`var/lib/apt/lists/*`, `var/cache/apt/archives/*.deb`,
 * `var/cache/apt/*.bin`), `tmp/*` and `var/tmp/*`, `dev/*` (the runtime mounts its own
 * /dev), `*-old` backups of dpkg and debconf, debootstrap's `var/log/bootstrap.log`;
 * truncates every other file under `var/log` to 0 bytes (keeping owners and modes, e.g.
 * wtmp's group utmp); empties `etc/machine-id` (systemd's "not yet initialised") and
 * removes `var/lib/dbus/machine-id`; replaces the host's `etc/hostname` (copied in by
 * debootstrap) with `localhost` and empties the host's `etc/resolv.conf`.
 * Symlinks are removed, never followed. Idempotent. Throws on unexpected fs errors.
 */
export async function cleanTree(tree: string): Promise<void> {
  const emptyDir = async (rel: string, keep: (n: string) => boolean = () => false, only: (n: string) => boolean = () => true) => {
    const d = join(tree, rel);
    for (const n of await readdir(d).catch(() => [] as string[])) {
      if (keep(n) || !only(n)) continue;
      await rm(join(d, n), { recursive: true, force: true });
    }
  };
  await emptyDir('var/lib/apt/lists', (n) => n === 'partial' || n === 'lock');
  await emptyDir('var/lib/apt/lists/partial');
  await emptyDir('var/cache/apt/archives', () => false, (n) => n.endsWith('.deb'));
  await emptyDir('var/cache/apt/archives/partial');
  await emptyDir('var/cache/apt', () => false, (n) => n.endsWith('.bin'));
  await emptyDir('tmp');
  await emptyDir('var/tmp');
  await emptyDir('dev');
  await emptyDir('var/cache/debconf', () => false, (n) => n.endsWith('-old'));
  await emptyDir('var/lib/dpkg', () => false, (n) => n.endsWith('-old'));
  await rm(join(tree, 'var/log/bootstrap.log'), { force: true });
  const truncateLogs = async (d: string): Promise<void> => {
    for (const ent of await readdir(d, { withFileTypes: true }).catch(() => [])) {
      const p = join(d, ent.name);
      if (ent.isDirectory()) await truncateLogs(p);
      else if (ent.isFile()) await truncate(p, 0);
    }
  };
  await truncateLogs(join(tree, 'var/log'));
  await replaceFile(join(tree, 'etc/machine-id'), '', 0o444);
  await rm(join(tree, 'var/lib/dbus/machine-id'), { force: true });
  await replaceFile(join(tree, 'etc/hostname'), 'localhost\n', 0o644);
  await replaceFile(join(tree, 'etc/resolv.conf'), '', 0o644);
}

/** Writes `content` to `file` as a regular root-owned file, replacing a symlink or file (never writing through a link). */
async function replaceFile(file: string, content: string, mode: number): Promise<void> {
  const st = await lstat(file).catch(() => undefined);
  if (st && !st.isFile()) await unlink(file);
  await writeFile(file, content, { mode });
  await chown(file, 0, 0);
  await chmod(file, mode);
}

/**
 * Unmounts everything under `dir` (deepest first; lazily when busy), then deletes it.
 * Refuses (Internal) if a mount remains, so rm never descends into /proc or a host fs.
 * Missing `dir` is fine.
 */
export async function removeTree(dir: string): Promise<void> {
  if (!existsSync(dir)) return;
  const mounts = await listMountsUnder(dir);
  for (const m of mounts.reverse()) {
    try {
      native.unmountAll(m);
    } catch {
      /* checked below */
    }
  }
  const left = await listMountsUnder(dir);
  if (left.length) throw new DsecError('Internal', `cannot remove ${dir}: still mounted: ${left.join(', ')}`);
  await rm(dir, { recursive: true, force: true });
}

/**
 * Removes `build-<pid>-*` (debootstrap) and `toolkit-<pid>-*` (toolkit.ts) work dirs whose
 * process is gone (left by a crash or kill -9), unmounting what is still mounted in them.
 */
export async function reclaimStaleWork(workRoot: string, progress: (l: string) => void): Promise<void> {
  for (const n of await readdir(workRoot).catch(() => [] as string[])) {
    const m = /^(?:build|toolkit)-(\d+)-[0-9a-f]+$/.exec(n);
    if (!m) continue;
    const pid = Number(m[1]);
    // Our own pid: a concurrent bootstrap in this process. A live pid: another one.
    if (pid === process.pid || isAlive(pid)) continue;
    progress(`dsec: removing stale work dir ${n}`);
    await removeTree(join(workRoot, n)).catch((e) => progress(`dsec: could not remove ${n}: ${(e as Error).message}`));
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}
