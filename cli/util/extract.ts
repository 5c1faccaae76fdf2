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
 * The archive is parsed by tar-stream, which reads a PAX extended header record by
 * record, each by its length prefix, so a member name with a newline or `=` in it (a
 * file name the sandbox chose) stays one name and cannot add records of its own (a
 * `size` that would move where the next header is read); node-tar's parser reads PAX
 * records line by line and could be steered so. A header that does not parse (bad
 * checksum, PAX records past 4 MiB, an unknown format) ends the extraction there: what
 * came before is kept, the rest is reported lost (`onFail`), never guessed at.
 *
 * Regular files and directories are written here as the archive goes: member paths are
 * taken relative to the destination (a leading `/` dropped, a `..` component skipped),
 * never written through a symlink (every parent must be a real directory or missing;
 * missing ones are made), a file replaces what is at its path (never a directory) and is
 * created anew with O_EXCL|O_NOFOLLOW, so never written through a link; files and
 * directories are ours, with the permission bits of the archive (less the umask;
 * directories also get u+rwx, to write into them) and its modification time. Links are
 * kept from the first pass: a target that passes through other links of the same
 * archive (`x -> .`, then `up -> x/x/../..`) can resolve outside although its text
 * looks harmless. Here links wait until every file and directory of the archive is on
 * disk, then:
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
 * Links wait in memory, at most {@link MAX_HELD_LINK_BYTES} of them: each one past it is
 * refused, so an archive of millions of links cannot exhaust the client.
 *
 * Also refused: any entry below a link of the same archive (the archive is never written
 * through its own links, nor through a symlink already on disk), a link
 * where a directory is (an archive that names a directory and then a link of the same
 * name). Devices and FIFOs are skipped. Every refusal and skip is reported (`onRefuse`,
 * `onSkip`) with the member's name and why.
 */
import { constants as fsc, linkSync, lstatSync, mkdirSync, readlinkSync, realpathSync, symlinkSync, unlinkSync, utimesSync, type Stats } from 'node:fs';
import { open } from 'node:fs/promises';
import path from 'node:path';
import type { Readable } from 'node:stream';
import tarStream from 'tar-stream';
import { cliAddon } from './native.js';

/** Most symlinks one lookup follows before the kernel gives up (ELOOP): MAXSYMLINKS, include/linux/namei.h. */
export const MAX_SYMLINK_FOLLOWS = 40;

/**
 * Most memory the links of one archive may hold while they wait for its files (they are
 * made only after the last member), counted as {@link linkCost}: 64 MiB, about 300,000
 * links with 100-character paths and targets. Beyond it each further link is refused,
 * so an archive of millions of links costs the CLI a bounded amount of memory rather
 * than all the host has.
 */
export const MAX_HELD_LINK_BYTES = 64 * 1024 * 1024;

/** What one planned link is counted as against {@link MAX_HELD_LINK_BYTES}: its strings (2 bytes a character) and about 200 bytes of objects and map entry. */
function linkCost(...texts: string[]): number {
  return 200 + 2 * texts.reduce((n, t) => n + t.length, 0);
}

/** Member kinds (tar-stream's names) written as files and as directories; links are made after; anything else is skipped. */
const FILE_TYPES = new Set(['file', 'contiguous-file']);
const DIR_TYPES = new Set(['directory']);

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
   * Hears about each member that could not be copied as it is (a local write that failed,
   * ENOSPC or EACCES, and the file is missing or cut; a member below a symlink or a file
   * already in the destination), and about an archive that stops parsing (member '':
   * what followed is lost). The copy is then not faithful, unlike a skip.
   */
  onFail: (member: string, why: string) => void;
  /** Hears about each member refused by the rule of this module. */
  onRefuse: OnRefuse;
  /** The kernel's check; default {@link kernelBeneathCheck} (null: the portable check alone). */
  beneath?: BeneathCheck | null;
  /** Memory the planned links may hold, bytes as {@link linkCost} counts; default {@link MAX_HELD_LINK_BYTES}. */
  maxHeldLinkBytes?: number;
}

/** A member's body as tar-stream gives it, and whether a writer read it (else it is drained). */
interface EntryBody {
  stream: AsyncIterable<unknown>;
  consumed: boolean;
}

/**
 * Extracts the tar stream `src` into `opts.dest` (see the file comment); the links'
 * boundary is `dest/origin.localDir`.
 * @returns once every entry is written and every link made or refused (an archive that
 *   stops parsing is reported through `onFail` and what arrived before is kept)
 * @throws the stream's error (a broken connection), or the fs error of a missing destination
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
  /** Memory the planned links hold, as {@link linkCost} counts it. */
  const maxHeld = opts.maxHeldLinkBytes ?? MAX_HELD_LINK_BYTES;
  let held = 0;
  /** Drops the link planned at `rel`, if any (a later member of the same path replaces it). */
  const unplan = (rel: string) => {
    const s = symlinks.get(rel);
    const h = hardlinks.get(rel);
    if (s) held -= linkCost(s.rel, s.target, s.member);
    if (h) held -= linkCost(h.rel, h.to, h.member);
    symlinks.delete(rel);
    hardlinks.delete(rel);
  };
  /** Directories below `dest` (paths relative to it) seen to be real directories, made or found. */
  const realDirs = new Set<string>();

  /**
   * Makes the missing parents of `ps` (components below `dest`), each a real directory;
   * returns why the member cannot be written there, or null.
   */
  const parentsOf = (ps: string[]): string | null => {
    for (let i = 1; i < ps.length; i++) {
      const p = ps.slice(0, i).join('/');
      if (realDirs.has(p)) continue;
      const abs = path.join(dest, p);
      const st = lstatOrNull(abs);
      if (!st) mkdirSync(abs, 0o777);
      else if (st.isSymbolicLink()) return `it is below ${p}, a symlink already in the destination (never written through)`;
      else if (!st.isDirectory()) return `it is below ${p}, which is not a directory`;
      realDirs.add(p);
    }
    return null;
  };

  /**
   * Writes the file member at `ps` (below `dest`) from `body`, created anew, never
   * through a link; reads `body` to its end even when a write fails.
   */
  const writeFile = async (member: string, ps: string[], h: tarStream.Header, body: EntryBody): Promise<void> => {
    const why = parentsOf(ps);
    if (why) return onFail(member, why);
    const rel = ps.join('/');
    const abs = path.join(dest, rel);
    const st = lstatOrNull(abs);
    if (st?.isDirectory()) return onFail(member, `a file where the directory ${rel} is`);
    if (st) unlinkSync(abs);
    const fh = await open(abs, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW, (h.mode ?? 0o644) & 0o777);
    let failed: unknown = null;
    try {
      body.consumed = true;
      for await (const chunk of body.stream) {
        if (failed) continue;
        try {
          await fh.write(chunk as Buffer);
        } catch (e) {
          failed = e;
        }
      }
      if (failed) throw failed;
      if (h.mtime) await fh.utimes(new Date(), h.mtime);
    } finally {
      await fh.close();
    }
  };

  /** Makes the directory member at `ps` (below `dest`); a non-directory at its path is replaced. */
  const writeDir = (member: string, ps: string[], h: tarStream.Header): void => {
    const why = parentsOf(ps);
    if (why) return onFail(member, why);
    const rel = ps.join('/');
    const abs = path.join(dest, rel);
    const st = lstatOrNull(abs);
    if (!st?.isDirectory()) {
      if (st) unlinkSync(abs);
      mkdirSync(abs, ((h.mode ?? 0o755) | 0o700) & 0o777);
      if (h.mtime) utimesSync(abs, new Date(), h.mtime);
    }
    realDirs.add(rel);
  };

  /** One member: written, planned (links), skipped or refused; its body is read to the end by the caller. */
  const onEntry = async (h: tarStream.Header, body: EntryBody): Promise<void> => {
    const member = h.name;
    const type = (h.type as string | null) ?? 'unknown';
    const all = parts(member);
    const ps = all.slice(opts.strip);
    if (all.length <= opts.strip && !DIR_TYPES.has(type)) return;
    if (ps.includes('..')) return onSkip(member, "its path has a '..' component");
    const inner = below(ps);
    if (inner === null) return onRefuse(member, `it is outside ${base.join('/')}, the copied directory`);
    const rel = inner.join('/');
    for (let i = 1; i < inner.length; i++) {
      const p = inner.slice(0, i).join('/');
      if (symlinks.has(p) || hardlinks.has(p)) return onRefuse(member, `it is below ${p}, a link of the same archive (never written through)`);
    }
    if (FILE_TYPES.has(type) || DIR_TYPES.has(type)) {
      unplan(rel);
      addParents(inner);
      if (DIR_TYPES.has(type)) dirs.add(rel);
      if (ps.length === 0) return; // the destination itself
      try {
        if (DIR_TYPES.has(type)) writeDir(member, ps, h);
        else await writeFile(member, ps, h, body);
      } catch (e) {
        const err = e as NodeJS.ErrnoException;
        onFail(member, err.code ? `${err.code}: ${err.message}` : err.message);
      }
      return;
    }
    if (type === 'symlink' || type === 'link') {
      if (rel === '') return onRefuse(member, 'a link in place of the copied directory itself');
      if (isDirHere(rel)) return onRefuse(member, `a link where the directory ${rel} is (a directory is never replaced by a link)`);
      unplan(rel);
      const target = h.linkname ?? '';
      let to = '';
      if (type === 'link') {
        const ts = parts(target).slice(opts.strip);
        const toInner = ts.includes('..') ? null : below(ts);
        if (!toInner?.length) return onRefuse(member, `a hard link to ${JSON.stringify(h.linkname)}, outside the archive`);
        to = toInner.join('/');
      }
      const cost = linkCost(rel, type === 'link' ? to : target, member);
      if (held + cost > maxHeld) {
        return onRefuse(member, `one link more than dsec cp holds in memory until the archive's files are written (${symlinks.size + hardlinks.size} links, ${maxHeld} bytes); copy such a tree with \`dsec cp ID:DIR - | tar -x\``);
      }
      held += cost;
      addParents(inner);
      if (type === 'symlink') symlinks.set(rel, { rel, target, member });
      else hardlinks.set(rel, { rel, to, member });
      return;
    }
    onSkip(member, `a ${type.replace(/-/g, ' ')}`);
  };

  const extract = tarStream.extract();
  let entries = 0;
  await new Promise<void>((resolve, reject) => {
    let srcError: Error | null = null;
    let inflight: Promise<void> = Promise.resolve();
    src.on('error', (e) => {
      srcError = e;
      extract.destroy(e);
      reject(e);
    });
    extract.on('entry', (h, stream, next) => {
      entries++;
      const body: EntryBody = { stream, consumed: false };
      inflight = onEntry(h, body).then(async () => {
        if (!body.consumed) for await (const _ of stream);
      });
      inflight.then(() => next(), (e: unknown) => next(e as Error));
    });
    extract.on('error', (e) => {
      if (srcError) return;
      src.unpipe(extract);
      src.destroy();
      inflight.finally(() => {
        onFail('', `the rest of the archive: it stops parsing after ${entries} ${entries === 1 ? 'entry' : 'entries'} (${e.message}), and nothing after that point is read`);
        resolve();
      });
    });
    extract.on('finish', () => inflight.then(() => resolve(), reject));
    src.pipe(extract);
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
