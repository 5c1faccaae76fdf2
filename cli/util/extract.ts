/**
 * Local extraction of a tar stream that comes out of a sandbox (`dsec cp ID:DIR LOCAL`),
 * under one rule: **nothing it creates resolves outside the destination**, the local
 * directory that stands for DIR (LOCAL, or LOCAL/DIR when LOCAL existed), whatever the
 * archive holds and however its links combine. The archive is the sandbox's to shape
 * (names, link targets, order), and once the CLI talks to a remote dsecd the whole
 * stream is untrusted, so nothing here relies on who built it. Members outside that
 * directory are refused: what the sandbox's links name is its own tree, never what else
 * the local directory holds.
 *
 * Regular files and directories are written by node-tar's Unpack (no absolute or `..`
 * member paths, never through a symlink, our ownership, permission bits only). Links are
 * kept from it: node-tar checks a link's target text on its own, and a target that
 * passes through other links of the same archive (`x -> .`, then
 * `up -> x/x/../..`) can still resolve outside. Here links wait until every file and
 * directory of the archive is on disk, then:
 *
 * 1. Hard links are made, each only to a regular file below the destination reached
 *    without any symlink, and never to a symlink of the archive (a hard link to a symlink
 *    is that symlink at another place, where its relative target means something else).
 * 2. Each symlink's target is resolved against the tree as it will be (what is on disk,
 *    with the archive's other symlinks in place), component by component as the kernel
 *    resolves a path ({@link resolveInside}); a missing component counts as a directory
 *    that may appear later, so `missing/../..` counts as going up twice. A symlink that
 *    resolves outside (or through more than {@link MAX_SYMLINK_FOLLOWS} symlinks) is
 *    refused; refusing one changes how the others resolve, so this repeats until a pass
 *    refuses none.
 * 3. The rest are made, then every link made is resolved once more against the real
 *    tree and, on Linux with the native addon, opened with openat2 RESOLVE_BENEATH below
 *    the destination (the kernel's own answer, an extra guard: the portable check above
 *    is the rule, and the CLI works without the addon). A link either check finds
 *    leaving is removed again and reported.
 *
 * Absolute symlink targets name a path in the sandbox. One inside the copied directory
 * (`/work/out/a` in a copy of `/work/out`) is kept as the equivalent relative target
 * (`a`, from the link's own directory), so it points where the sandbox would see it;
 * any other absolute target would name a host path and is refused.
 *
 * Also refused: any entry below a link of the same archive (the archive is never written
 * through its own links, and node-tar never writes through one already on disk), a link
 * where a directory is (an archive that names a directory and then a link of the same
 * name). Devices and FIFOs are skipped. Every refusal and skip is reported (`onRefuse`,
 * `onSkip`) with the member's name and why.
 */
import { linkSync, lstatSync, mkdirSync, readlinkSync, realpathSync, symlinkSync, unlinkSync, type Stats } from 'node:fs';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { Unpack, type ReadEntry } from 'tar';
import { cliAddon } from './native.js';

/** Most symlinks one lookup follows before the kernel gives up (ELOOP): MAXSYMLINKS, include/linux/namei.h. */
export const MAX_SYMLINK_FOLLOWS = 40;

/** Member kinds node-tar writes for us; links are ours, anything else is skipped. */
const FILE_TYPES = new Set(['File', 'OldFile', 'ContiguousFile']);
const DIR_TYPES = new Set(['Directory', 'GNUDumpDir']);

/** How a symlink's target resolves: inside, or not with the reason (completes "it ..."). */
export type Resolution = { inside: true } | { inside: false; why: string };

/** What is at one path below the root, as {@link resolveInside} sees it. */
type Node = { kind: 'dir' | 'missing' | 'other' } | { kind: 'link'; target: string };

/**
 * The tree below `root` as a resolution sees it: what is on disk (lstat and readlink,
 * cached: nothing else writes below the destination while dsec cp runs), with the links
 * in `overlay` (relative path -> target) standing where they are still to be made.
 */
export class TreeView {
  /** `root` with its own symlinks resolved, to tell whether an absolute target on disk leads below it. */
  readonly realRoot: string;
  private readonly disk = new Map<string, Node>();

  /**
   * @param root an existing local directory (absolute or relative to the working directory)
   * @param overlay symlinks still to be made, relative path (no `.` or `..`) -> target text
   * @throws the fs error when `root` cannot be resolved
   */
  constructor(readonly root: string, readonly overlay: Map<string, string> = new Map()) {
    this.realRoot = realpathSync.native(root);
  }

  /** What is at `rel` (relative, `/`-separated, normalised): the overlay first, then the disk. */
  at(rel: string): Node {
    const o = this.overlay.get(rel);
    if (o !== undefined) return { kind: 'link', target: o };
    let n = this.disk.get(rel);
    if (!n) {
      const st = lstatOrNull(path.join(this.root, rel));
      n = !st ? { kind: 'missing' } : st.isSymbolicLink() ? { kind: 'link', target: readlinkSync(path.join(this.root, rel)) } : st.isDirectory() ? { kind: 'dir' } : { kind: 'other' };
      this.disk.set(rel, n);
    }
    return n;
  }

  /** Forgets what was read at `rel` (after this module changed it on disk). */
  forget(rel: string): void {
    this.disk.delete(rel);
  }

  /** The components below the root of an absolute path, or null when it is not below the root. */
  belowRoot(abs: string): string[] | null {
    const r = this.realRoot === '/' ? '' : this.realRoot;
    if (abs !== r && !abs.startsWith(r + '/')) return null;
    return parts(abs.slice(r.length));
  }
}

/** A path's components without empty and `.` ones (`..` kept). */
function parts(p: string): string[] {
  return p.split('/').filter((c) => c !== '' && c !== '.');
}

function lstatOrNull(p: string): Stats | null {
  try {
    return lstatSync(p);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') return null;
    throw e;
  }
}

/**
 * Resolves `target`, the text of a symlink in the directory `from` (components below the
 * view's root, each a real directory), against `view`, the way the kernel resolves a
 * path: component by component, following every symlink it meets (a relative target
 * from the symlink's own directory, an absolute one from the host's `/`), `..` going up
 * one real directory. Differences, each on the safe side: a missing component counts
 * as a directory (a later mkdir would make it one), and passing through more than
 * {@link MAX_SYMLINK_FOLLOWS} symlinks counts as leaving. A path that continues after
 * a file ends there (ENOTDIR: it resolves to nothing). Pure apart from the view's lstat.
 */
export function resolveInside(view: TreeView, from: readonly string[], target: string): Resolution {
  const stack = [...from];
  let todo: string[];
  if (target.startsWith('/')) {
    const below = view.belowRoot(target);
    if (!below) return { inside: false, why: `names the host path ${target}` };
    stack.length = 0;
    todo = below;
  } else {
    todo = parts(target);
  }
  let follows = 0;
  while (todo.length > 0) {
    const c = todo.shift()!;
    if (c === '..') {
      if (stack.length === 0) return { inside: false, why: 'climbs above the destination' };
      stack.pop();
      continue;
    }
    const rel = [...stack, c].join('/');
    const n = view.at(rel);
    if (n.kind === 'link') {
      if (++follows > MAX_SYMLINK_FOLLOWS) return { inside: false, why: `passes through more than ${MAX_SYMLINK_FOLLOWS} symlinks` };
      if (n.target.startsWith('/')) {
        const below = view.belowRoot(n.target);
        if (!below) return { inside: false, why: `goes through ${rel}, a symlink to the host path ${n.target}` };
        stack.length = 0;
        todo = [...below, ...todo];
      } else {
        todo = [...parts(n.target), ...todo];
      }
      continue;
    }
    if (n.kind === 'other' && todo.length > 0) return { inside: true };
    stack.push(c);
  }
  return { inside: true };
}

/**
 * The kernel's answer for `rel` below `dir` (openat2 RESOLVE_BENEATH, native addon): ''
 * when it resolves to something below `dir`, else the errno name ('EXDEV': it would
 * leave `dir`). Null where there is no such check: not Linux, no addon (the CLI on a
 * laptop, or not built), or a kernel without openat2.
 */
export type BeneathCheck = (dir: string, rel: string) => string;

let kernel: BeneathCheck | null | undefined;

/** The openat2 check of the native addon, or null where it is not available (see {@link BeneathCheck}). */
export function kernelBeneathCheck(): BeneathCheck | null {
  if (kernel !== undefined) return kernel;
  kernel = null;
  const f = cliAddon()?.resolveBeneath;
  if (typeof f !== 'function') return kernel;
  const check = f as BeneathCheck;
  if (check('/', '.') === 'ENOSYS') return kernel;
  kernel = check;
  return kernel;
}

/** A symlink to make: where (relative to the destination), the target text, and the member it came from. */
export interface PlannedLink {
  rel: string;
  target: string;
  member: string;
}

/** Where the copied sandbox directory sits, for absolute symlink targets. */
export interface SandboxOrigin {
  /** The copied directory in the sandbox (absolute). */
  sandboxDir: string;
  /** The local directory standing for it, relative to the destination ('' for the destination itself). */
  localDir: string;
}

/**
 * The relative target that points, from the symlink at `rel`, where the absolute
 * `target` points in the sandbox (see the file comment), or null when `target` is not
 * inside the copied directory. The part below it is kept as written (its `..` too).
 */
export function relativeTarget(rel: string, target: string, origin: SandboxOrigin): string | null {
  const t = parts(target);
  const root = parts(origin.sandboxDir);
  if (root.includes('..') || t.length < root.length || root.some((c, i) => t[i] !== c)) return null;
  const rest = t.slice(root.length);
  const linkDir = parts(rel).slice(0, -1);
  const base = parts(origin.localDir);
  let common = 0;
  while (common < linkDir.length && common < base.length && linkDir[common] === base[common]) common++;
  const out = [...Array<string>(linkDir.length - common).fill('..'), ...base.slice(common), ...rest];
  return out.length ? out.join('/') : '.';
}

/** A refusal: the member and why (completes "refused MEMBER: ..."). */
export type OnRefuse = (member: string, why: string) => void;

/**
 * Makes the symlinks `links` below `dest` (an existing directory) so that none
 * resolves outside it (steps 2 and 3 of the file comment); refuses the others through
 * `onRefuse`. An absolute target is rewritten with `origin` (refused without one, or
 * when outside it). A symlink replaces a file or symlink at its path, never a
 * directory; missing parent directories are made (never through a symlink).
 * `beneath` is the kernel's check (default {@link kernelBeneathCheck}; null: none).
 * @returns the relative paths of the symlinks made
 */
export function makeSymlinks(dest: string, links: readonly PlannedLink[], onRefuse: OnRefuse, origin?: SandboxOrigin, beneath: BeneathCheck | null = kernelBeneathCheck()): string[] {
  /** Each link still planned, with the target it gets (an absolute one rewritten). */
  const planned = new Map<string, PlannedLink & { made: string }>();
  const refuse = (rel: string, why: string) => {
    const l = planned.get(rel)!;
    onRefuse(l.member, `a symlink to ${JSON.stringify(l.target)}, which ${why}`);
  };
  const rels = new Set(links.map((l) => l.rel));
  for (const l of links) {
    let target = l.target;
    const ps = parts(l.rel);
    const above = ps.slice(0, -1).map((_, i) => ps.slice(0, i + 1).join('/')).find((p) => rels.has(p));
    if (above !== undefined) {
      onRefuse(l.member, `a symlink below ${above}, a link of the same archive (never made through it)`);
      continue;
    }
    if (target === '') {
      onRefuse(l.member, 'a symlink with an empty target');
      continue;
    }
    if (target.startsWith('/')) {
      const t = origin ? relativeTarget(l.rel, target, origin) : null;
      if (t === null) {
        onRefuse(l.member, `a symlink to the absolute path ${target}, ${origin ? `outside the copied directory ${origin.sandboxDir}` : 'which would name a path on this host'}`);
        continue;
      }
      target = t;
    }
    const why = parentProblem(dest, l.rel);
    if (why) {
      onRefuse(l.member, `a symlink ${why}`);
      continue;
    }
    planned.set(l.rel, { ...l, made: target });
  }

  // Step 2: against the tree as it will be, until a pass refuses none.
  const overlay = new Map([...planned].map(([rel, l]) => [rel, l.made]));
  const view = new TreeView(dest, overlay);
  for (let changed = true; changed;) {
    changed = false;
    for (const [rel, target] of overlay) {
      const r = resolveInside(view, parts(rel).slice(0, -1), target);
      if (r.inside) continue;
      overlay.delete(rel);
      refuse(rel, r.why);
      changed = true;
    }
  }

  // Step 3: make them, then check what was made against the real tree and the kernel.
  const made: string[] = [];
  for (const rel of overlay.keys()) {
    const l = planned.get(rel)!;
    try {
      ensureParents(dest, rel);
      const abs = path.join(dest, rel);
      const st = lstatOrNull(abs);
      if (st?.isDirectory()) throw new Error(`${rel} is a directory`);
      if (st) unlinkSync(abs);
      symlinkSync(l.made, abs);
      made.push(rel);
    } catch (e) {
      onRefuse(l.member, `a symlink that could not be made: ${(e as Error).message}`);
    }
  }
  const real = new TreeView(dest);
  const remove = (rel: string, why: string) => {
    unlinkSync(path.join(dest, rel));
    real.forget(rel);
    made.splice(made.indexOf(rel), 1);
    refuse(rel, `${why} (removed again)`);
  };
  for (let changed = true; changed;) {
    changed = false;
    for (const rel of [...made]) {
      const r = resolveInside(real, parts(rel).slice(0, -1), planned.get(rel)!.made);
      if (!r.inside) {
        remove(rel, r.why);
        changed = true;
      } else if (beneath && beneath(dest, rel) === 'EXDEV') {
        remove(rel, 'resolves outside the destination (openat2 RESOLVE_BENEATH)');
        changed = true;
      }
    }
  }
  return made;
}

/**
 * Why an entry cannot be made at `rel` below `dest` for its parents' sake ("below the
 * symlink X", "below X, which is not a directory"), or null when every parent on disk is
 * a real directory (missing ones are made later).
 */
function parentProblem(dest: string, rel: string): string | null {
  const ps = parts(rel);
  for (let i = 1; i < ps.length; i++) {
    const p = ps.slice(0, i).join('/');
    const st = lstatOrNull(path.join(dest, p));
    if (!st) return null;
    if (st.isSymbolicLink()) return `below ${p}, a symlink (never written through)`;
    if (!st.isDirectory()) return `below ${p}, which is not a directory`;
  }
  return null;
}

/** Makes the missing parent directories of `rel` below `dest` (0755 less the umask), never through a symlink. */
function ensureParents(dest: string, rel: string): void {
  const ps = parts(rel);
  for (let i = 1; i < ps.length; i++) {
    const p = ps.slice(0, i).join('/');
    const abs = path.join(dest, p);
    const st = lstatOrNull(abs);
    if (!st) mkdirSync(abs, 0o755);
    else if (!st.isDirectory()) throw new Error(`${p} is not a directory`);
  }
}

/** Options of {@link extractArchive}. */
export interface ExtractOptions {
  /** The local directory to extract into; it exists. */
  dest: string;
  /** Leading member path components to drop (as `tar --strip-components`). */
  strip: number;
  /**
   * Where the copied sandbox directory lands: `localDir` (relative to `dest`, after
   * `strip`) stands for `sandboxDir`. It is the boundary links must stay inside, and
   * members outside it are refused: what the sandbox's links name is its own tree, never
   * what else the local directory holds.
   */
  origin: SandboxOrigin;
  /** Hears about each member skipped by design (devices, FIFOs). */
  onSkip: (member: string, why: string) => void;
  /**
   * Hears about each member that could not be copied as it is: node-tar's warnings (a
   * local write that failed, ENOSPC or EACCES, and the file is missing or cut; an entry
   * whose header is corrupt, and what follows it may be lost). The copy is then not
   * faithful, unlike a skip.
   */
  onFail: (member: string, why: string) => void;
  /** Hears about each member refused by the rule of this module. */
  onRefuse: OnRefuse;
  /** The kernel's check; default {@link kernelBeneathCheck} (null: the portable check alone). */
  beneath?: BeneathCheck | null;
}

/**
 * Extracts the tar stream `src` into `opts.dest` (see the file comment); the links'
 * boundary is `dest/origin.localDir`.
 * @returns once every entry is written and every link made or refused
 * @throws the stream's or node-tar's error (a missing destination, a broken stream)
 */
export async function extractArchive(src: Readable, opts: ExtractOptions): Promise<void> {
  const { dest, onSkip, onFail, onRefuse } = opts;
  const base = parts(opts.origin.localDir);
  const root = path.join(dest, ...base);
  /** Symlinks and hard links of the archive still to be made, by path below `root`, in archive order. */
  const symlinks = new Map<string, PlannedLink>();
  const hardlinks = new Map<string, { rel: string; to: string; member: string }>();
  /** Directories below `root` the archive has: its directory entries and the parents of every entry. */
  const dirs = new Set<string>();
  const isDirHere = (rel: string) => dirs.has(rel) || lstatOrNull(path.join(root, rel))?.isDirectory() === true;
  const addParents = (ps: string[]) => {
    for (let i = 1; i < ps.length; i++) dirs.add(ps.slice(0, i).join('/'));
  };
  /** A member path after `strip`, below `root`, as components; null when it is not below it. */
  const below = (ps: string[]) => (ps.length >= base.length && base.every((c, i) => ps[i] === c) ? ps.slice(base.length) : null);

  const filter = (_p: string, entry: ReadEntry | unknown): boolean => {
    const e = entry as ReadEntry;
    const member = e.path;
    const ps = parts(e.path).slice(opts.strip);
    if (parts(e.path).length <= opts.strip && !DIR_TYPES.has(e.type)) return false;
    if (ps.includes('..')) {
      onSkip(member, "its path has a '..' component");
      return false;
    }
    const inner = below(ps);
    if (inner === null) {
      onRefuse(member, `it is outside ${base.join('/')}, the copied directory`);
      return false;
    }
    const rel = inner.join('/');
    for (let i = 1; i < inner.length; i++) {
      const p = inner.slice(0, i).join('/');
      if (symlinks.has(p) || hardlinks.has(p)) {
        onRefuse(member, `it is below ${p}, a link of the same archive (never written through)`);
        return false;
      }
    }
    if (FILE_TYPES.has(e.type) || DIR_TYPES.has(e.type)) {
      symlinks.delete(rel);
      hardlinks.delete(rel);
      addParents(inner);
      if (DIR_TYPES.has(e.type)) dirs.add(rel);
      e.path = ps.length ? ps.join('/') : '.';
      if (typeof e.mode === 'number') e.mode &= 0o777;
      return true;
    }
    if (e.type === 'SymbolicLink' || e.type === 'Link') {
      if (rel === '') {
        onRefuse(member, 'a link in place of the copied directory itself');
        return false;
      }
      if (isDirHere(rel)) {
        onRefuse(member, `a link where the directory ${rel} is (a directory is never replaced by a link)`);
        return false;
      }
      symlinks.delete(rel);
      hardlinks.delete(rel);
      addParents(inner);
      if (e.type === 'SymbolicLink') {
        symlinks.set(rel, { rel, target: String(e.linkpath ?? ''), member });
      } else {
        const to = parts(String(e.linkpath ?? '')).slice(opts.strip);
        const toInner = to.includes('..') ? null : below(to);
        if (!toInner?.length) {
          onRefuse(member, `a hard link to ${JSON.stringify(e.linkpath)}, outside the archive`);
          return false;
        }
        hardlinks.set(rel, { rel, to: toInner.join('/'), member });
      }
      return false;
    }
    onSkip(member, `a ${e.type}`);
    return false;
  };

  const unpack = new Unpack({
    cwd: dest,
    preserveOwner: false,
    filter,
    onwarn: (code: string, message: string | Error, data: unknown) => {
      if (code === 'TAR_ENTRY_INFO') return;
      onFail((data as { entry?: ReadEntry } | undefined)?.entry?.path ?? '', `${code}: ${message instanceof Error ? message.message : message}`);
    },
  });
  await new Promise<void>((resolve, reject) => {
    const fail = (e: Error) => {
      src.destroy();
      reject(e);
    };
    src.on('error', fail);
    unpack.on('error', fail);
    unpack.on('close', () => resolve());
    src.pipe(unpack as unknown as NodeJS.WritableStream);
  });
  if (symlinks.size === 0 && hardlinks.size === 0) return;

  // The boundary itself: made when only links named it, and never a symlink.
  const st = lstatOrNull(root);
  if (!st) mkdirSync(root, 0o755);
  else if (!st.isDirectory()) {
    for (const l of [...hardlinks.values(), ...symlinks.values()]) onRefuse(l.member, `a link below ${root}, which is not a directory`);
    return;
  }

  // Step 1: hard links, each to a regular file reached without a symlink.
  for (const h of hardlinks.values()) {
    if (h.to === h.rel) continue; // a link to itself: the file stays what it is
    const why = hardlinkProblem(root, h.to, symlinks) ?? parentProblem(root, h.rel);
    if (why) {
      onRefuse(h.member, `a hard link to ${h.to}: ${why}`);
      continue;
    }
    try {
      ensureParents(root, h.rel);
      const abs = path.join(root, h.rel);
      const at = lstatOrNull(abs);
      if (at?.isDirectory()) throw new Error(`${h.rel} is a directory`);
      if (at) unlinkSync(abs);
      linkSync(path.join(root, h.to), abs);
    } catch (e) {
      onRefuse(h.member, `a hard link that could not be made: ${(e as Error).message}`);
    }
  }
  makeSymlinks(root, [...symlinks.values()], onRefuse, { sandboxDir: opts.origin.sandboxDir, localDir: '' }, opts.beneath === undefined ? kernelBeneathCheck() : opts.beneath);
}

/**
 * Why a hard link to `to` (below `dest`) is refused, or null when `to` is a regular file
 * reached without a symlink, neither on disk nor among the archive's own `symlinks`.
 */
function hardlinkProblem(dest: string, to: string, symlinks: Map<string, PlannedLink>): string | null {
  const ps = parts(to);
  for (let i = 1; i <= ps.length; i++) {
    const p = ps.slice(0, i).join('/');
    if (symlinks.has(p)) return i === ps.length ? 'a symlink of the same archive (a hard link to a symlink moves its target)' : `it is below ${p}, a symlink of the same archive`;
  }
  for (let i = 1; i <= ps.length; i++) {
    const p = ps.slice(0, i).join('/');
    const last = i === ps.length;
    const st = lstatOrNull(path.join(dest, p));
    if (!st) return 'no such file';
    if (st.isSymbolicLink()) return last ? 'a symlink (a hard link to a symlink moves its target)' : `it is below ${p}, a symlink`;
    if (!last && !st.isDirectory()) return `${p} is not a directory`;
    if (last && !st.isFile()) return 'not a regular file';
  }
  return null;
}
