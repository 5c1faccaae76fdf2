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
 * The copy happens while the sandbox is frozen when it runs, so it is consistent.
 */
import { lchown, lstat, readdir, rm } from 'node:fs/promises';
import { join, relative } from 'node:path';
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
 * Copies `upper` into `dest` (which must not exist), strips, and shifts ownership.
 * @param uidBase first host uid/gid of the sandbox's range; ids in [uidBase, uidBase+count) become id - uidBase.
 * @param exclude extra globs to strip, relative to the sandbox root (e.g. `srv/cache/**`).
 * @param opts.strip false keeps everything (snapshots: a restore must see exactly what
 *   the source saw, /tmp and histories included); default true ({@link COMMIT_STRIP}).
 * @throws DsecError Internal when the copy fails (e.g. disk full); `dest` is removed then.
 */
export async function packUpper(upper: string, dest: string, uidBase: number, count: number, exclude: readonly string[] = [], opts: { strip?: boolean } = {}): Promise<PackedUpper> {
  const r = await execa('cp', ['-a', '--', upper, dest], { reject: false });
  if (r.failed) {
    await rm(dest, { recursive: true, force: true });
    throw internal(`commit: copying the writable layer failed: ${String(r.stderr).trim() || r.message}`);
  }
  const extra = exclude.map((g) => ({ given: g, globs: normaliseExclude(g), hit: false }));
  const patterns = opts.strip === false ? [] : [...COMMIT_STRIP];
  const stripped: string[] = [];
  const walk = async (dir: string): Promise<void> => {
    for (const e of await readdir(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      const rel = relative(dest, p);
      const byExtra = extra.filter((x) => x.globs.some((g) => minimatch(rel, g, { dot: true })));
      for (const x of byExtra) x.hit = true;
      if (byExtra.length || patterns.some((g) => minimatch(rel, g, { dot: true }))) {
        await rm(p, { recursive: true, force: true });
        stripped.push(rel);
        continue;
      }
      const st = await lstat(p);
      const shift = (id: number) => (id >= uidBase && id < uidBase + count ? id - uidBase : id);
      if (shift(st.uid) !== st.uid || shift(st.gid) !== st.gid) await lchown(p, shift(st.uid), shift(st.gid));
      if (e.isDirectory()) await walk(p);
    }
  };
  const top = await lstat(dest);
  await lchown(dest, top.uid >= uidBase && top.uid < uidBase + count ? top.uid - uidBase : top.uid, top.gid >= uidBase && top.gid < uidBase + count ? top.gid - uidBase : top.gid);
  await walk(dest);
  return { dir: dest, stripped: stripped.sort(), unmatched: extra.filter((x) => !x.hit).map((x) => x.given) };
}
