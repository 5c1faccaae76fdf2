/**
 * `commit`: a sandbox's writable layer (its overlay upper dir) packed as a new EROFS
 * layer on top of its image, for an image meant to be shared.
 *
 * The upper dir is copied (GNU `cp -a`, which keeps overlay whiteouts — char devices
 * 0:0 — and the `trusted.overlay.opaque` xattr of opaque directories), then:
 * - paths that must never be packed are removed: {@link COMMIT_STRIP} plus configured
 *   globs (temporary files, shell and REPL histories; the agent's socket and logs live
 *   outside the sandbox and never reach the upper dir);
 * - ownership is shifted back from the sandbox's host uid range to image uids
 *   (host `base + k` -> `k`), so the layer is usable by any sandbox's range.
 * Only the copy happens while the sandbox is frozen (when it runs), so it is consistent
 * and the freeze lasts no longer than `cp -a`.
 */
import { chmod, lchown, lstat, readdir, rm } from 'node:fs/promises';
import { execa } from 'execa';
import { minimatch } from 'minimatch';
import { internal, invalidArgument } from '../errors.js';

/**
 * Paths (globs relative to the sandbox root, matched with dotfiles) stripped from every
 * commit: the contents of the temp dirs and the histories shells and REPLs leave behind,
 * where an agent's earlier attempts (and answers) would otherwise ship with the image.
 */
export const COMMIT_STRIP: readonly string[] = [
  'tmp/**',
  'var/tmp/**',
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

/** Result of {@link packUpper}. */
export interface PackedUpper {
  /** The prepared tree, ready for ImageStore.addLayerFromDir. */
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

/**
 * Prepares a private copy of an upper dir (see {@link copyUpper}) for packing: strips,
 * and shifts ownership from the sandbox's host uid range back to image uids. Names are
 * handled as bytes, so file names that are not UTF-8 survive. Changing a file's owner
 * makes the kernel drop its setuid/setgid bits and its `security.capability` xattr; both
 * are put back, so the layer holds exactly what the sandbox had.
 * @param uidBase first host uid/gid of the sandbox's range; ids in [uidBase, uidBase+count) become id - uidBase.
 * @param exclude extra globs to strip, relative to the sandbox root (e.g. `srv/cache/**`).
 * @param opts.strip false keeps everything (snapshots: a restore must see exactly what
 *   the source saw, /tmp and histories included); default true ({@link COMMIT_STRIP}).
 * @throws DsecError Internal when the tree cannot be walked or fixed up.
 */
export async function prepareCopy(dest: string, uidBase: number, count: number, exclude: readonly string[] = [], opts: { strip?: boolean } = {}): Promise<PackedUpper> {
  const extra = exclude.map((g) => ({ given: g, globs: normaliseExclude(g), hit: false }));
  const patterns = opts.strip === false ? [] : [...COMMIT_STRIP];
  const stripped: string[] = [];
  const shift = (id: number) => (id >= uidBase && id < uidBase + count ? id - uidBase : id);
  const caps = await dumpCapabilities(dest);
  const root = Buffer.from(dest);
  const walk = async (dir: Buffer, rel: string): Promise<void> => {
    for (const e of await readdir(dir, { withFileTypes: true, encoding: 'buffer' })) {
      const p = Buffer.concat([dir, SLASH, e.name]);
      // Globs match the name as UTF-8 (lossy for other bytes); the file is handled by its bytes.
      const r = rel ? `${rel}/${e.name.toString()}` : e.name.toString();
      const byExtra = extra.filter((x) => x.globs.some((g) => minimatch(r, g, { dot: true })));
      for (const x of byExtra) x.hit = true;
      if (byExtra.length || patterns.some((g) => minimatch(r, g, { dot: true }))) {
        await rm(p, { recursive: true, force: true });
        stripped.push(r);
        continue;
      }
      await fixOwner(p, shift);
      if (e.isDirectory()) await walk(p, r);
    }
  };
  await fixOwner(root, shift);
  await walk(root, '');
  if (caps) await restoreCapabilities(dest, caps);
  return { dir: dest, stripped: stripped.sort(), unmatched: extra.filter((x) => !x.hit).map((x) => x.given) };
}

const SLASH = Buffer.from('/');

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

/** Puts back the capabilities {@link dumpCapabilities} read. */
async function restoreCapabilities(dir: string, dump: string): Promise<void> {
  const r = await execa('setfattr', ['-h', '--restore=-'], { cwd: dir, input: Buffer.from(dump, 'latin1'), reject: false });
  if (r.failed) throw internal(`restoring file capabilities failed: ${String(r.stderr).trim() || r.message}`);
}
