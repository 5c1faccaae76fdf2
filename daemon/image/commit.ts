/**
 * `commit` and `snapshot`: a sandbox's writable layer (its overlay upper dir) packed as
 * a new EROFS layer on top of its image ({@link packWritableLayer}).
 *
 * What never reaches a layer built from a sandbox (docs/SECURITY.md "Builder and runtime
 * identities"):
 * - dsec's own runtime state lives outside the upper dir, on the host: the agent's socket
 *   (`<root>/sandboxes/<id>/agent.sock`), its log, exec session spools
 *   (`<root>/sandboxes/<id>/execs/`), the agent binary (bind-mounted on runc's /dev
 *   tmpfs), trajectories and the sandbox's create env (SQLite). None is copied.
 * - files dsec itself leaves IN the upper dir are removed: the agent's temp files of
 *   unfinished uploads ({@link DSEC_ARTEFACTS}, from commits and snapshots alike), and
 *   (commits only) the paths the driver recorded as created by dsec (the runtime's mount
 *   point for /etc/resolv.conf, `writable_paths` directories; see
 *   SandboxDriver.withWritableLayer) while they are still what dsec made: an empty
 *   directory (after stripping) or an empty file. A `writable_paths` directory the agent
 *   filled is its work and ships.
 * - commits also strip {@link COMMIT_STRIP} (temp dirs, shell and REPL histories) and the
 *   configured and requested excludes. Snapshots keep everything else: a restore must see
 *   exactly what the source saw.
 * - the committed image's config is the image's own: the sandbox's create env is a
 *   runtime secret and is not written into the manifest.
 *
 * How, with a builder identity (daemon/host/builder.ts): while the sandbox is frozen,
 * root lists the upper's opaque directories, its entries owned by host root (whiteouts)
 * and its file capabilities (read-only walks that never follow links), and the builder
 * copies the upper (GNU `cp -a`) from a read-only idmapped view in which the sandbox's
 * host range appears as in-image ids: the ownership shift is done by the kernel, and
 * modes and setuid bits are copied as they are. After the thaw, the builder strips the
 * copy, gives root-owned entries back owner 0 and sets the capabilities (the view hides
 * those not owned by the sandbox's root, e.g. set by host root); mkfs.erofs runs as the
 * builder with the opaque list. Without a builder, root copies,
 * strips and shifts owners itself ({@link prepareCopy}).
 * Only the copy happens while the sandbox is frozen (when it runs), so it is consistent
 * and the freeze lasts no longer than `cp -a`.
 */
import { closeSync, readFileSync } from 'node:fs';
import { chmod, lchown, lstat, readdir, rm } from 'node:fs/promises';
import { execa } from 'execa';
import { minimatch } from 'minimatch';
import { failedPrecondition, internal, invalidArgument } from '../errors.js';
import type { BuilderJob } from '../host/builder.js';
import { splitLines, unescapeOctal, type BuildErofsOptions } from './erofs.js';
import type { LayerStore, LayerMeta } from './layer-store.js';

/**
 * Paths (globs relative to the sandbox root, matched with dotfiles) stripped from every
 * commit: the contents of the temp dirs and of /var/log, and the histories shells and
 * REPLs leave behind, where an agent's earlier attempts (and answers, e.g. in a server's
 * or package manager's log) would otherwise ship with the image. `dir/**` matches what
 * is below `dir`, never `dir` itself: the directories stay (with the mode they had), and
 * a stripped entry that changed an image file reverts it to the image's version.
 */
export const COMMIT_STRIP: readonly string[] = [
  'tmp/**',
  'var/tmp/**',
  'var/log/**',
  'run/**',
  '**/.bash_history',
  '**/.ash_history',
  '**/.sh_history',
  '**/.zsh_history',
  '**/.python_history',
  '**/.lesshst',
  '**/.viminfo',
  '**/.wget-hsts',
];

/**
 * Files the agent itself may leave in a sandbox's filesystem, removed from commits AND
 * snapshots: the temp file of an upload that had not finished when the layer was copied
 * (`.<name>.dsec-<pid>-<n>.tmp`, or `.dsec-<pid>-<n>.tmp` for long names; renamed over
 * the target when the upload completes, see native/agent/files.c FILE_DONE).
 */
export const DSEC_ARTEFACTS: readonly string[] = ['**/.*.dsec-*-*.tmp', '**/.dsec-*-*.tmp'];

/** Result of {@link prepareCopy} and {@link prepareBuilderCopy}. */
export interface PackedUpper {
  /** The prepared tree, ready for LayerStore.addLayerFromDir. */
  dir: string;
  /** Relative paths removed by the strip rules, sorted. */
  stripped: string[];
  /** Caller-given exclude patterns (as normalised) that matched nothing. */
  unmatched: string[];
}

/**
 * Normalises a caller's exclude glob to the form the strip walk matches: relative to
 * the sandbox root (a leading `/` is dropped), and a trailing `/` means the directory
 * with everything below it. Negations (`!x`) are refused: an exclude list only removes.
 * @throws DsecError InvalidArgument for an empty pattern, a negation or `..`.
 */
export function normaliseExclude(glob: string): string[] {
  const g = glob.trim();
  if (!g || g.startsWith('!')) throw invalidArgument(`exclude pattern ${JSON.stringify(glob)}: empty patterns and negations are not allowed`);
  if (g.split('/').includes('..')) throw invalidArgument(`exclude pattern ${JSON.stringify(glob)} must not contain ".."`);
  const rel = g.replace(/^\/+/, '');
  if (rel.endsWith('/')) {
    const dir = rel.replace(/\/+$/, '');
    return [dir, `${dir}/**`];
  }
  return [rel];
}

/**
 * Copies `upper` into `dest` (which must not exist) with GNU `cp -a` (owners, modes,
 * setuid bits, xattrs, hard links, holes, whiteouts kept). This is the only step that
 * must see a still writable layer, so callers freeze the sandbox around it alone.
 * @throws DsecError Internal when the copy fails (e.g. disk full); `dest` is removed then.
 */
export async function copyUpper(upper: string, dest: string): Promise<void> {
  const r = await execa('cp', ['-a', '--', upper, dest], { reject: false });
  if (r.failed) {
    await rm(dest, { recursive: true, force: true });
    throw internal(`copying the writable layer failed: ${String(r.stderr).trim() || r.message}`);
  }
}

/** What the strip walk removes and keeps (see {@link stripWalk}). */
interface StripRules {
  /** false: a snapshot ({@link DSEC_ARTEFACTS} only); true: a commit (plus {@link COMMIT_STRIP} and `created`). */
  strip: boolean;
  /** Caller globs (not yet normalised). */
  exclude: readonly string[];
  /** Relative paths dsec created in the upper dir (commits strip them while they are an empty directory or an empty file). */
  created: readonly string[];
  /** Called for every entry kept (root included, as `rel` ''), before its children. */
  keep?(p: Buffer, rel: string): Promise<void>;
}

const SLASH = Buffer.from('/');

/** True when `p` is an empty directory or an empty regular file (a mount point or directory dsec made, unused). */
async function stillAsCreated(p: Buffer): Promise<boolean> {
  const st = await lstat(p).catch(() => undefined);
  if (st?.isDirectory()) return (await readdir(p)).length === 0;
  return st?.isFile() === true && st.size === 0;
}

/**
 * Walks `dest` (names handled as bytes, so names that are not UTF-8 survive; globs match
 * the UTF-8 reading of a name) removing what {@link StripRules} say; symlinks are never
 * followed (only real directories are entered).
 */
async function stripWalk(dest: string, rules: StripRules): Promise<PackedUpper> {
  const extra = rules.exclude.map((g) => ({ given: g, globs: normaliseExclude(g), hit: false }));
  const patterns = rules.strip ? [...COMMIT_STRIP, ...DSEC_ARTEFACTS] : [...DSEC_ARTEFACTS];
  const created = new Set(rules.strip ? rules.created.map((c) => c.replace(/^\/+/, '').replace(/\/+$/, '')) : []);
  const stripped: string[] = [];
  const walk = async (dir: Buffer, rel: string): Promise<void> => {
    for (const e of await readdir(dir, { withFileTypes: true, encoding: 'buffer' })) {
      const p = Buffer.concat([dir, SLASH, e.name]);
      const r = rel ? `${rel}/${e.name.toString()}` : e.name.toString();
      const byExtra = extra.filter((x) => x.globs.some((g) => minimatch(r, g, { dot: true })));
      for (const x of byExtra) x.hit = true;
      if (byExtra.length || patterns.some((g) => minimatch(r, g, { dot: true }))) {
        await rm(p, { recursive: true, force: true });
        stripped.push(r);
        continue;
      }
      await rules.keep?.(p, r);
      if (e.isDirectory()) await walk(p, r);
      // A path dsec created goes only while it is still what dsec made (children stripped first).
      if (created.has(r) && (await stillAsCreated(p))) {
        await rm(p, { recursive: true, force: true });
        stripped.push(r);
      }
    }
  };
  await rules.keep?.(Buffer.from(dest), '');
  await walk(Buffer.from(dest), '');
  return { dir: dest, stripped: stripped.sort(), unmatched: extra.filter((x) => !x.hit).map((x) => x.given) };
}

/**
 * Prepares a private copy of an upper dir (see {@link copyUpper}) for packing as root:
 * strips, and shifts ownership from the sandbox's host uid range back to image uids.
 * Changing a file's owner makes the kernel drop its setuid/setgid bits and its
 * `security.capability` xattr; both are put back, so the layer holds exactly what the
 * sandbox had.
 * @param uidBase first host uid/gid of the sandbox's range; ids in [uidBase, uidBase+count) become id - uidBase.
 * @param exclude extra globs to strip, relative to the sandbox root (e.g. `srv/cache/**`).
 * @param opts.strip false keeps everything but {@link DSEC_ARTEFACTS} (snapshots: a
 *   restore must see exactly what the source saw, /tmp and histories included); default
 *   true ({@link COMMIT_STRIP}, and `opts.created`: paths dsec created in the upper dir).
 * @throws DsecError Internal when the tree cannot be walked or fixed up.
 */
export async function prepareCopy(
  dest: string, uidBase: number, count: number, exclude: readonly string[] = [], opts: { strip?: boolean; created?: readonly string[] } = {},
): Promise<PackedUpper> {
  const shift = (id: number) => (id >= uidBase && id < uidBase + count ? id - uidBase : id);
  const caps = await dumpCapabilities(dest);
  const packed = await stripWalk(dest, { strip: opts.strip !== false, exclude, created: opts.created ?? [], keep: (p) => fixOwner(p, shift) });
  if (caps) await restoreCapabilities(dest, caps);
  return packed;
}

/**
 * The builder's half of {@link prepareCopy}, run as the builder over its own copy (made
 * through an idmapped view, so owners are already image ids): strips, gives owner 0 back
 * to the entries that host root owned in the upper dir (overlay whiteouts, which the view
 * shows as 65534), and sets the file capabilities root read from the upper dir (the view
 * hides those the sandbox's root does not own, such as ones host root set): `fixups` is
 * root's list of both (see {@link listRootOwned}, {@link scanUpperXattrs}).
 * @throws DsecError Internal when the tree cannot be walked or fixed up.
 */
export async function prepareBuilderCopy(
  dest: string, rules: { strip: boolean; exclude: readonly string[]; created: readonly string[] }, fixups: CopyFixups,
): Promise<PackedUpper> {
  const packed = await stripWalk(dest, rules);
  const at = (rel: Buffer) => (rel.length ? Buffer.concat([Buffer.from(dest), SLASH, rel]) : Buffer.from(dest));
  for (const o of fixups.rootOwned) {
    const p = at(o.rel);
    // A stripped entry (or one below a stripped directory) is gone: nothing to fix.
    const st = await lstat(p).catch(() => undefined);
    if (!st) continue;
    await lchown(p, o.uid ? st.uid : 0, o.gid ? st.gid : 0);
    if (!st.isSymbolicLink() && (st.mode & 0o6000) !== 0) await chmod(p, st.mode & 0o7777);
  }
  // Last: a chown above would have dropped a capability set earlier.
  const dump: Buffer[] = [];
  for (const c of fixups.caps) {
    if (!(await lstat(at(c.rel)).catch(() => undefined))?.isFile()) continue;
    // Paths as the worker sees them (relative to its working directory): its absolute
    // path goes through directories the builder may not search, so no `cwd` here.
    dump.push(Buffer.from('# file: '), quotePath(at(c.rel)), Buffer.from(`\nsecurity.capability=0x${c.value.toString('hex')}\n\n`));
  }
  if (dump.length) await restoreCapabilities(null, Buffer.concat(dump).toString('latin1'));
  return packed;
}

/** Quotes a path for `setfattr --restore` (`\\ooo` for bytes that are not printable ASCII, `\\` and `=`). */
function quotePath(b: Buffer): Buffer {
  const out: Buffer[] = [];
  for (const c of b) out.push(c <= 0x20 || c >= 0x7f || c === 0x5c || c === 0x3d ? Buffer.from(`\\${c.toString(8).padStart(3, '0')}`) : Buffer.from([c]));
  return Buffer.concat(out);
}

/** What root hands the builder for its copy of a writable layer (see {@link prepareBuilderCopy}). */
export interface CopyFixups {
  rootOwned: RootOwned[];
  caps: FileCapability[];
}

/** A file capability of the upper dir, in the form the layer must hold: a v2 `vfs_cap_data` (20 bytes). */
export interface FileCapability {
  rel: Buffer;
  value: Buffer;
}

/** `vfs_cap_data` revision 2 and 3 magic (high byte of magic_etc), and the effective flag (linux/capability.h). */
const VFS_CAP_REVISION_2 = 0x02000000;
const VFS_CAP_REVISION_3 = 0x03000000;
const VFS_CAP_REVISION_MASK = 0xff000000;
const VFS_CAP_FLAGS_EFFECTIVE = 0x000001;

/**
 * What root reads from a sandbox's upper dir `upper` (range starting at host id
 * `uidBase`) for the builder's copy, in ONE `getfattr -R -P` walk (never follows
 * symlinks; the sandbox is frozen meanwhile):
 *   - `opaque`: directories with `trusted.overlay.opaque="y"` (the builder cannot read
 *     trusted.* xattrs; mkfs.erofs gets the list);
 *   - `caps`: file capabilities as the layer must hold them, v2 values (applying to the
 *     image's root). A v3 value whose root is the sandbox's root (set by `setcap` inside)
 *     and a v2 value (set by host root, which the builder's view hides) are both kept; a
 *     v3 value for any other root (a nested user namespace) applies to nobody in a new
 *     sandbox and is dropped.
 * Paths are relative to `upper`, in raw bytes (`''` is `upper` itself).
 * @throws DsecError Internal when the walk fails, FailedPrecondition when getfattr (Debian `attr`) is missing.
 */
export async function scanUpperXattrs(upper: string, uidBase: number): Promise<{ opaque: Buffer[]; caps: FileCapability[] }> {
  const r = await execa('getfattr', ['-R', '-P', '-h', '--absolute-names', '-e', 'hex', '-m', '^(security\\.capability|trusted\\.overlay\\.opaque)$', '-d', '.'], {
    cwd: upper, reject: false, stdin: 'ignore', encoding: 'buffer', maxBuffer: 1 << 30,
  });
  if ((r as { code?: string }).code === 'ENOENT') throw failedPrecondition('getfattr not found: install the Debian package "attr" (needed to commit and snapshot writable layers)');
  if (r.exitCode !== 0 && r.exitCode !== 1) throw internal(`reading the xattrs of the writable layer failed: ${Buffer.from(r.stderr as Uint8Array).toString().trim() || r.message}`);
  const caps: FileCapability[] = [];
  const opaque: Buffer[] = [];
  let file: Buffer | null = null;
  for (const line of splitLines(Buffer.from(r.stdout as Uint8Array))) {
    const text = line.toString('latin1');
    if (text.startsWith('# file: ')) {
      const f = unescapeOctal(line.subarray(8));
      file = f.toString('latin1') === '.' ? Buffer.alloc(0) : f.subarray(0, 2).toString('latin1') === './' ? f.subarray(2) : f;
      continue;
    }
    if (file && text === 'trusted.overlay.opaque=0x79') { // "y"; overlayfs's "x" does not make a directory opaque
      opaque.push(file);
      continue;
    }
    const m = /^security\.capability=0x([0-9a-f]+)$/.exec(text);
    if (!file || !m) continue;
    const v = Buffer.from(m[1], 'hex');
    if (v.length < 20) continue;
    const magic = v.readUInt32LE(0);
    const rev = (magic & VFS_CAP_REVISION_MASK) >>> 0;
    if (rev === VFS_CAP_REVISION_3 && v.length >= 24 && v.readUInt32LE(20) !== uidBase) continue;
    if (rev !== VFS_CAP_REVISION_2 && rev !== VFS_CAP_REVISION_3) continue;
    const v2 = Buffer.from(v.subarray(0, 20));
    v2.writeUInt32LE((VFS_CAP_REVISION_2 | (magic & VFS_CAP_FLAGS_EFFECTIVE)) >>> 0, 0);
    caps.push({ rel: file, value: v2 });
  }
  return { opaque, caps };
}

/** An entry of an upper dir that host root (uid or gid 0) owns: `uid`/`gid` true when that id is NOT 0. */
export interface RootOwned {
  rel: Buffer;
  uid: boolean;
  gid: boolean;
}

/**
 * The entries below `upper` owned by host uid 0 or gid 0 (overlayfs creates whiteouts
 * with the mounter's credentials), found by one `find -P` run as root (never follows
 * symlinks, does not cross mounts). The builder's idmapped view shows them as 65534.
 * @throws DsecError Internal when the walk fails.
 */
export async function listRootOwned(upper: string): Promise<RootOwned[]> {
  const r = await execa('find', ['-P', '.', '-xdev', '(', '-uid', '0', '-o', '-gid', '0', ')', '-printf', '%U %G %P\\0'], {
    cwd: upper, reject: false, stdin: 'ignore', encoding: 'buffer', maxBuffer: 1 << 30,
  });
  if (r.exitCode !== 0) throw internal(`listing root-owned entries of the writable layer failed: ${Buffer.from(r.stderr as Uint8Array).toString().trim() || r.message}`);
  const out: RootOwned[] = [];
  const b = Buffer.from(r.stdout as Uint8Array);
  let start = 0;
  for (let i = 0; i < b.length; i++) {
    if (b[i] !== 0) continue;
    const rec = b.subarray(start, i);
    start = i + 1;
    const s1 = rec.indexOf(0x20);
    const s2 = rec.indexOf(0x20, s1 + 1);
    out.push({ uid: rec.subarray(0, s1).toString() !== '0', gid: rec.subarray(s1 + 1, s2).toString() !== '0', rel: rec.subarray(s2 + 1) });
  }
  return out;
}

/** Encodes {@link CopyFixups} for the builder worker (JSON; paths and values base64, since names are bytes). */
export function encodeFixups(f: CopyFixups): Buffer {
  return Buffer.from(JSON.stringify({
    rootOwned: f.rootOwned.map((o) => ({ rel: o.rel.toString('base64'), uid: o.uid, gid: o.gid })),
    caps: f.caps.map((c) => ({ rel: c.rel.toString('base64'), value: c.value.toString('base64') })),
  }));
}

/** Decodes {@link encodeFixups}. @throws SyntaxError for anything else. */
export function decodeFixups(b: Buffer): CopyFixups {
  const j = JSON.parse(b.toString('utf8')) as { rootOwned: { rel: string; uid: boolean; gid: boolean }[]; caps: { rel: string; value: string }[] };
  return {
    rootOwned: j.rootOwned.map((o) => ({ rel: Buffer.from(o.rel, 'base64'), uid: o.uid, gid: o.gid })),
    caps: j.caps.map((c) => ({ rel: Buffer.from(c.rel, 'base64'), value: Buffer.from(c.value, 'base64') })),
  };
}

/** Shifts one entry's owner; re-applies setuid/setgid bits the chown cleared. */
async function fixOwner(p: Buffer, shift: (id: number) => number): Promise<void> {
  const st = await lstat(p);
  const uid = shift(st.uid);
  const gid = shift(st.gid);
  if (uid === st.uid && gid === st.gid) return;
  await lchown(p, uid, gid);
  if (!st.isSymbolicLink() && (st.mode & 0o6000) !== 0) await chmod(p, st.mode & 0o7777);
}

/**
 * Every `security.capability` xattr under `dir`, as a `getfattr --dump` text (paths
 * relative to `dir`, values hex), or null when there is none. One process for the tree.
 */
async function dumpCapabilities(dir: string): Promise<string | null> {
  const r = await execa('getfattr', ['-R', '-P', '-h', '-e', 'hex', '-m', '^security\\.capability$', '-d', '.'], { cwd: dir, reject: false, encoding: 'buffer' });
  if (r.exitCode !== 0 && r.exitCode !== 1) throw internal(`reading file capabilities failed: ${Buffer.from(r.stderr as Uint8Array).toString().trim() || r.message}`);
  const text = Buffer.from(r.stdout as Uint8Array).toString('latin1');
  return text.includes('security.capability') ? text : null;
}

/** Puts back the capabilities {@link dumpCapabilities} read (or a dump in the same format), paths relative to `dir` (null: to the working directory). */
async function restoreCapabilities(dir: string | null, dump: string): Promise<void> {
  const r = await execa('setfattr', ['-h', '--restore=-'], { ...(dir === null ? {} : { cwd: dir }), input: Buffer.from(dump, 'latin1'), reject: false });
  if (r.failed) throw internal(`restoring file capabilities failed: ${String(r.stderr).trim() || r.message}`);
}

/** Options of {@link packWritableLayer}. */
export interface PackWritableLayerOptions {
  /** First host uid/gid of the sandbox's range and its size. */
  uidBase: number;
  uidCount: number;
  /** true: a commit (strip {@link COMMIT_STRIP}, `exclude` and dsec-created paths); false: a snapshot. */
  strip: boolean;
  /** Globs to strip (commits), relative to the sandbox root; validated with {@link normaliseExclude}. */
  exclude: readonly string[];
  /** Layer metadata `source`, e.g. `commit:<sandbox id>`. */
  source: string;
  /** mkfs options (snapshots keep mtimes and use chunks). */
  build?: BuildErofsOptions;
}

/**
 * Gives the caller's callback the sandbox's upper dir while nothing writes to it (the
 * driver freezes a running sandbox around it) and the relative paths dsec created in it.
 */
export type WithWritableLayer = <T>(fn: (upperDir: string, dsecCreated: readonly string[]) => Promise<T>) => Promise<T>;

/**
 * Packs a sandbox's writable layer as a layer in `store` (see the module comment for
 * what is removed, and how the builder identity does it). Only the copy runs inside
 * `withLayer` (the freeze). Returns the layer with what was stripped and the exclude
 * patterns that matched nothing.
 * @throws DsecError InvalidArgument (bad exclude pattern), Internal (copy, strip or mkfs
 *   failed: disk full, a tool missing), FailedPrecondition (no writable layer, from the driver).
 */
export async function packWritableLayer(
  store: LayerStore, withLayer: WithWritableLayer, opts: PackWritableLayerOptions,
): Promise<{ layer: LayerMeta & { sizeBytes: number }; stripped: string[]; unmatched: string[] }> {
  for (const g of opts.exclude) normaliseExclude(g);
  const builder = store.builder;
  if (!builder) {
    const tmp = store.tmpPath(opts.strip ? '-commit' : '-snapshot');
    try {
      const created = await withLayer(async (upper, dsecCreated) => {
        await copyUpper(upper, tmp);
        return dsecCreated;
      });
      const packed = await prepareCopy(tmp, opts.uidBase, opts.uidCount, opts.exclude, { strip: opts.strip, created });
      const layer = await store.addLayerFromDir(packed.dir, { ...opts.build, source: opts.source });
      return { layer, stripped: packed.stripped, unmatched: packed.unmatched };
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
  }
  return builder.withJob(async (job) => {
    const tree = 'tree';
    const { created, opaque, fixups } = await withLayer(async (upper, dsecCreated) => {
      const { opaque, caps } = await scanUpperXattrs(upper, opts.uidBase);
      const seen = { created: dsecCreated, opaque, fixups: { rootOwned: await listRootOwned(upper), caps } };
      await copyAsBuilder(job, upper, opts.uidBase, tree);
      return seen;
    });
    const listFd = job.dataFd(encodeFixups(fixups));
    let packed: Omit<PackedUpper, 'dir'>;
    try {
      packed = await job.worker<Omit<PackedUpper, 'dir'>>('prepare-copy', { tree, strip: opts.strip, exclude: opts.exclude, created }, { fds: [listFd] });
    } finally {
      closeSync(listFd);
    }
    const layer = await store.addLayerFromJob(job, tree, { ...opts.build, opaque, source: opts.source });
    return { layer, stripped: packed.stripped, unmatched: packed.unmatched };
  });
}

/**
 * `cp -a` of `upper` into `dest` (relative to the job's staging dir), run as the builder
 * from a read-only view in which the sandbox's ids appear as image ids.
 * @throws DsecError Internal when the copy fails (e.g. disk full).
 */
async function copyAsBuilder(job: BuilderJob, upper: string, uidBase: number, dest: string): Promise<void> {
  const view = job.view(upper, uidBase);
  try {
    // `/.`: copy the directory the fd is open on (the fd's path is a magic link).
    const r = await job.run(['cp', '-a', '--', '/proc/self/fd/3/.', dest], { fds: [view] });
    if (r.exitCode !== 0) throw internal(`copying the writable layer (as the builder, host uid ${job.uid}) failed: ${r.stderr.trim() || `exit ${r.exitCode}`}`);
  } finally {
    closeSync(view);
  }
}

/** Reads the {@link encodeFixups} data the worker gets as fd `fd`. */
export function readFixupsFd(fd: number): CopyFixups {
  return decodeFixups(readFileSync(fd));
}
