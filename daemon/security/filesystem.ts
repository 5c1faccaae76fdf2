/**
 * Read-only system paths and the sandbox's writable places (docs/SECURITY.md
 * "Filesystem"): option schemas, their precedence, and the plan of mounts that enforces
 * them, computed from the composed rootfs before the container starts.
 *
 * The model. The sandbox's root `/` is mounted read-only (OCI `root.readonly`), even to
 * root inside. Every top-level directory of the composed rootfs that does not match
 * `readonly_paths` (default DEFAULT_READONLY_PATHS, daemon/model/filesystem.ts) gets a read-write bind of
 * itself, as does every `writable_paths` entry: an exception below a read-only path
 * (`/usr/local`), or a directory the image does not have yet, which dsecd creates in the
 * writable layer (as the sandbox's root) before the container starts. Consequences,
 * which are the contract:
 *   - nothing below a read-only path changes, whatever the uid or capabilities inside:
 *     overwriting `/bin/sh` or `/etc/passwd` fails with EROFS;
 *   - the top level itself is fixed: no new top-level entry can be made from inside, and
 *     top-level symlinks (merged-/usr images: `/bin -> usr/bin`) cannot be replaced. A
 *     sandbox that needs `/work` names it in `writable_paths` (`dsec create --writable
 *     /work`), and dsecd creates it;
 *   - the runtime's own mounts (/proc, /sys, /dev and what is mounted below them) are
 *     never bound and never named here: their protection is the OCI masks, read-only
 *     sysfs, and Landlock;
 *   - a rename or hard link between two top-level directories now crosses mounts and
 *     fails with EXDEV (mv falls back to copying), as between Docker volumes.
 * `readonly_paths: []` turns the read-only root off for one sandbox (root read-write, no
 * binds). Landlock, when on, still grants every right only on the top-level directories
 * (it cannot grant all of `/` without also granting /proc and /dev, see the agent), so
 * new top-level entries still need `writable_paths` or `landlock: false`.
 *
 * Mount count: the binds are runc mounts (OCI `mounts`), made inside the container's own
 * mount namespace. The host's mount table still holds exactly one mount per running
 * sandbox (its overlay), which every `runc run` copies; a bind costs only kernel memory
 * in the sandbox's namespace (a few hundred bytes each).
 *
 * Order: the binds come first in the spec's mounts, parents before children, so any
 * later mount below them (the agent under /dev, a runtime-generated /etc/resolv.conf)
 * lands on top and stays visible; runc makes the root read-only after every mount is
 * in place (finalizeRootfs), so mount points it must create still can be.
 *
 * Safety of the host paths: a bind's source is a host path (`<rootfs>/<path>`) that runc
 * resolves in the host's mount namespace, following symlinks. So every path is resolved
 * here inside the rootfs, one component at a time with lstat (symlinks followed as the
 * sandbox would see them, never leaving its root), and the host path of each bind, each
 * directory created and each Landlock `--writable` entry (all taken from the one plan)
 * has no symlink in it. This runs while no process of the sandbox exists (create,
 * restore, fork, or start of a stopped sandbox), so nothing can change the tree between
 * this check and runc's mount.
 *
 * Symlinks the sandbox controls. The tree is not the image alone: a restarted sandbox's
 * writable layer, and a snapshot it is restored or forked from, hold whatever the sandbox
 * made, e.g. `ln -s /etc /root/data` over its writable path /root/data. Following that
 * would bind /etc read-write at the next start (and a link to `/` would drop every
 * top-level bind). So a writable path is refused (FailedPrecondition, reason
 * {@link WRITABLE_PATH_REFUSED_REASON}; the lifecycle records a
 * `sandbox.writable_path_refused` event) when it resolves to `/`, through any symlink
 * onto or above a read-only place, or through a symlink in a directory the sandbox may
 * write to a place not writable without it; see {@link planFilesystem}. Refused, never
 * skipped: the start (or create, restore, fork) fails and says which path and symlink,
 * rather than the sandbox running with a writable place missing; the files stay, and a
 * restore without that writable path brings them back. A symlink that stays inside the
 * writable area (`/root/cache -> /tmp/cache`) is followed as before.
 *
 * Precedence of the options, field by field: the create request's `filesystem` > the
 * image's security defaults (`config.security`, daemon/image/security.ts) > `[filesystem]`
 * in dsecd's config > the defaults here. The resolved values are stored with the sandbox
 * at create (resolveFilesystem in daemon/model/filesystem.ts), so a later change of config or image never
 * alters an existing sandbox.
 */
import { lstatSync, readdirSync, readlinkSync } from 'node:fs';
import { chmod, chown, lstat, mkdir } from 'node:fs/promises';
import path from 'node:path';
import { z } from 'zod';
import { DsecError, failedPrecondition } from '../errors.js';
import type { FilesystemOptions, ResolvedFilesystem } from '../model/filesystem.js';

/** Top-level directories of the runtime's own mounts (spec.ts): never bound, never named in the options. */
export const RUNTIME_MOUNT_DIRS: readonly string[] = ['/proc', '/sys', '/dev'];

/** Most entries in `readonly_paths` or `writable_paths`: 64 each. */
export const MAX_FILESYSTEM_PATHS = 64;

/**
 * Most writable places one sandbox may have: 128, the agent's limit of `--writable`
 * flags (LL_MAX_WRITABLE in native/agent/landlock.h), twice the 64 writable_paths a request
 * may name plus room for an image's top-level directories.
 */
export const MAX_WRITABLE_PLACES = 128;

/**
 * Reason (`error.reason`) of a start, create, restore or fork refused because a writable
 * path resolves somewhere it must not (see {@link planFilesystem}); the lifecycle records
 * a `sandbox.writable_path_refused` event with the message.
 */
export const WRITABLE_PATH_REFUSED_REASON = 'writable_path_refused';

/** Symlinks followed while resolving one path inside the rootfs: 40, the kernel's own limit (MAXSYMLINKS). */
const MAX_SYMLINKS = 40;

const GLOB_CHARS = /[*?]/;

/** Why `p` is not a valid option path, or null. */
function pathProblem(p: string): string | null {
  if (!p.startsWith('/')) return 'paths are absolute';
  if (p.includes('\0')) return 'paths must not contain NUL';
  if (p === '/') return null;
  const parts = p.slice(1).split('/');
  if (parts.some((x) => x === '')) return 'paths have no empty components ("//") and no trailing "/"';
  if (parts.some((x) => x === '.' || x === '..')) return 'paths must not contain "." or ".." components';
  if (parts.slice(0, -1).some((x) => GLOB_CHARS.test(x))) return 'globs (* and ?) are allowed in the last component only, e.g. /lib*';
  if (RUNTIME_MOUNT_DIRS.some((d) => p === d || p.startsWith(`${d}/`))) return `${parts[0] === 'dev' ? '/dev' : `/${parts[0]}`} and below belong to the runtime's own mounts (/proc, /sys, /dev): their protection is fixed`;
  return null;
}

/**
 * One path of `readonly_paths` or `writable_paths`: absolute, normalised (no `//`,
 * trailing `/`, `.` or `..`), at most 4096 bytes, `*` and `?` only in the last component,
 * not under /proc, /sys or /dev.
 */
export const FilesystemPathSchema = z.string().max(4096).superRefine((p, ctx) => {
  const why = pathProblem(p);
  if (why) ctx.addIssue({ code: 'custom', message: `${JSON.stringify(p)}: ${why}` });
}).describe('Absolute, normalised path inside the sandbox (no "//", trailing "/", "." or ".."); * and ? only in the last component; not under /proc, /sys or /dev.');

/**
 * Filesystem options of a sandbox, of an image's security defaults, or of `[filesystem]`
 * in the config. Every field is optional: an absent one falls through to the next
 * source (see the module comment).
 */
export const FilesystemOptionsSchema = z
  .object({
    readonly_paths: z.array(FilesystemPathSchema).max(MAX_FILESYSTEM_PATHS).optional()
      .describe('System paths read-only even to root inside (`*`/`?` in the last component); default ["/bin","/sbin","/usr","/lib*","/etc"]; ["/"] makes every path read-only but writable_paths; [] turns read-only paths off.'),
    writable_paths: z.array(FilesystemPathSchema.refine((p) => p !== '/', '"/" cannot be a writable path: use readonly_paths: [] to turn read-only paths off'))
      .max(MAX_FILESYSTEM_PATHS).optional()
      .describe('Paths kept writable: exceptions below read-only paths (e.g. /usr/local), or directories the image lacks (e.g. /work), which dsecd creates before start. Wins over readonly_paths.'),
    landlock: z.boolean().optional().describe('Restrict file access with Landlock where the kernel has it (docs/SECURITY.md "Landlock"); default true.'),
  })
  .strict() satisfies z.ZodType<FilesystemOptions>; // parses into the model's shape

/** True when `name` (one path component) matches the glob `pattern` (`*`: any run of characters, `?`: one). */
export function globMatch(pattern: string, name: string): boolean {
  if (!GLOB_CHARS.test(pattern)) return pattern === name;
  const re = new RegExp(`^${pattern.split('').map((c) => (c === '*' ? '.*' : c === '?' ? '.' : c.replace(/[.+^${}()|[\]\\]/g, '\\$&'))).join('')}$`, 's');
  return re.test(name);
}

/** True when the absolute, normalised `p` matches the option path `pattern` (same parent, last component by glob; `/` matches itself only). */
export function pathMatches(pattern: string, p: string): boolean {
  if (pattern === '/' || p === '/') return pattern === p;
  return path.posix.dirname(pattern) === path.posix.dirname(p) && globMatch(path.posix.basename(pattern), path.posix.basename(p));
}

/** A read-only view of a directory tree by in-tree absolute paths (`/` is its root). */
export interface TreeView {
  /** What `p` is, without following a final symlink. */
  kind(p: string): 'dir' | 'symlink' | 'other' | 'missing';
  /** The target of the symlink `p`. */
  readlink(p: string): string;
  /** Names in the directory `p`. */
  list(p: string): string[];
}

/** A {@link TreeView} of the host directory `root` (a sandbox's mounted rootfs). */
export function hostTree(root: string): TreeView {
  const at = (p: string) => path.join(root, p);
  return {
    kind(p) {
      try {
        const st = lstatSync(at(p));
        return st.isSymbolicLink() ? 'symlink' : st.isDirectory() ? 'dir' : 'other';
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code === 'ENOENT' || (e as NodeJS.ErrnoException).code === 'ENOTDIR') return 'missing';
        throw e;
      }
    },
    readlink: (p) => readlinkSync(at(p)),
    list: (p) => readdirSync(at(p)),
  };
}

/** One symlink followed while resolving a path: where it is (in-tree, no symlink in it) and its target as stored. */
export interface FollowedLink {
  at: string;
  target: string;
}

/** Where {@link resolveInTree} got: the resolved path, how many of its last components do not exist, and the symlinks followed. */
export interface ResolvedPath {
  /** Absolute in-tree path with no symlink in it. */
  path: string;
  /** Trailing components of `path` that are missing (0: it exists and is a directory). */
  missing: number;
  /** Symlinks followed on the way, in order; empty when `path` is `p` itself. */
  links: FollowedLink[];
}

/**
 * Resolves `p` inside `tree` the way the sandbox would see it: symlinks (absolute ones
 * relative to the tree's root) and `..` in their targets are followed, never above `/`.
 * Each component is looked at with lstat semantics ({@link TreeView.kind}) below an
 * already resolved, symlink-free prefix, so the host path `<root><path>` of the result
 * has no symlink in it; whether a followed symlink may be trusted is the caller's
 * decision (see {@link planFilesystem}), made from `links`.
 * @throws DsecError FailedPrecondition when a component is neither a directory nor a
 *   symlink, after {@link MAX_SYMLINKS} symlinks (a loop), or when `..` follows a missing
 *   directory (with reason {@link WRITABLE_PATH_REFUSED_REASON} when `what` is
 *   'writable path'); `what` names the option.
 */
export function resolveInTree(tree: TreeView, p: string, what: string): ResolvedPath {
  const todo = p.split('/').filter(Boolean);
  const done: string[] = [];
  const links: FollowedLink[] = [];
  while (todo.length) {
    const c = todo.shift()!;
    if (c === '.' || c === '') continue;
    if (c === '..') {
      done.pop();
      continue;
    }
    const cur = `/${[...done, c].join('/')}`;
    const k = tree.kind(cur);
    if (k === 'dir') {
      done.push(c);
    } else if (k === 'symlink') {
      if (links.length >= MAX_SYMLINKS) throw failedPrecondition(`${what} ${p}: too many symlinks (a loop?) in the image at ${cur}`);
      const target = tree.readlink(cur);
      links.push({ at: cur, target });
      if (target.startsWith('/')) done.length = 0;
      todo.unshift(...target.split('/').filter(Boolean));
    } else if (k === 'missing') {
      const rest = todo.filter((x) => x !== '.');
      // `..` after a missing directory names nothing the kernel would resolve (ENOENT),
      // and creating the directories would climb back out of it (`/new/../etc` is /etc).
      if (rest.includes('..')) {
        const m = `${what} ${p}: ${links.length ? `${linkText(links.slice(-1))} leads` : 'it leads'} through the missing ${cur} and then "..": dsecd does not create a path that climbs out of a directory it creates`;
        throw what === 'writable path' ? refused(m) : failedPrecondition(m);
      }
      return { path: `/${[...done, c, ...rest].join('/')}`, missing: 1 + rest.length, links };
    } else {
      throw failedPrecondition(`${what} ${p}: ${cur} in the image is not a directory`);
    }
  }
  return { path: `/${done.join('/')}`, missing: 0, links };
}

/** One bind of a path onto itself, made by runc inside the sandbox's mount namespace. */
export interface FilesystemBind {
  /** In-sandbox absolute path; its host source is `<rootfs><path>` (no symlink in it). */
  path: string;
  /** Read-only (a read-only path below a writable one) or read-write. */
  readonly: boolean;
}

/** What {@link planFilesystem} decided for one start of a sandbox. */
export interface FilesystemPlan {
  /** OCI `root.readonly`: false only when `readonly_paths` is empty. */
  readonlyRoot: boolean;
  /** Binds in mount order (parents first). */
  binds: FilesystemBind[];
  /** Directories dsecd creates in the rootfs before start, parents first. */
  create: string[];
  /** The sandbox's writable places, for Landlock (agent `--writable`), sorted. */
  writable: string[];
}

const depth = (p: string) => (p === '/' ? 0 : p.split('/').length - 1);
const parentOf = (p: string) => path.posix.dirname(p);

/** One `writable_paths` entry (a glob: one of its matches) resolved inside the tree. */
interface WritableResolution extends ResolvedPath {
  /** The entry as the options name it. */
  option: string;
}

/** A layout of the tree for a set of resolved writable paths: the plan, and who may write where under it. */
interface Layout {
  plan: FilesystemPlan;
  /** True when the sandbox may change entries of the directory `p` (in-tree, no symlink in it) under this plan. */
  writableAt(p: string): boolean;
  /**
   * The explicitly read-only places (top-level directories, deeper read-only paths) as
   * the options make them before writable paths win, less those a writable path names
   * literally (the user's exception): what no writable path may reach through a symlink,
   * onto or above.
   */
  readonlyPlaces: string[];
}

/** "the symlink A -> B" / "the symlinks A -> B, C -> D", for messages. */
function linkText(links: readonly FollowedLink[]): string {
  return `the symlink${links.length > 1 ? 's' : ''} ${links.map((l) => `${l.at} -> ${l.target}`).join(', ')}`;
}

/** What every refusal of a writable path ends with: the way out. */
const REFUSAL_WAY_OUT = 'the sandbox keeps its files: snapshot it and restore it without this writable path (filesystem.writable_paths), or name the target itself';

/** FailedPrecondition with reason {@link WRITABLE_PATH_REFUSED_REASON}. */
function refused(message: string): DsecError {
  return new DsecError('FailedPrecondition', `${message}; ${REFUSAL_WAY_OUT}`, { reason: WRITABLE_PATH_REFUSED_REASON });
}

const isRuntime = (p: string) => RUNTIME_MOUNT_DIRS.some((d) => p === d || p.startsWith(`${d}/`));
const atOrBelow = (p: string, dir: string) => dir === '/' || p === dir || p.startsWith(`${dir}/`);

/**
 * The mounts (and directories to create) that enforce `fs` on the tree `tree` (a
 * sandbox's composed rootfs). Pure over `tree`; see the module comment for the model.
 *
 * - Top-level directories (real ones: top-level symlinks and files are left alone, they
 *   live on the read-only root; /proc, /sys, /dev are the runtime's) are writable unless
 *   they match a `readonly_paths` entry; a `writable_paths` match wins.
 * - Deeper `readonly_paths` entries that exist become read-only binds below writable
 *   parents (a read-only path below a read-only one needs nothing).
 * - `writable_paths` entries are resolved inside the tree; a missing one (not a glob) is
 *   created, an existing non-directory is an error; globs match existing entries only.
 * - Only a change of mode from the parent's gets a bind.
 * - Options name directories: a path without a glob that is a file in the image is an
 *   error; a glob skips whatever it matches that is not a directory.
 * - Symlinks met while resolving a writable path (module comment, "Symlinks the sandbox
 *   controls") are checked; a writable path (or a glob's match) that fails is refused,
 *   never skipped: the whole plan fails, so the sandbox does not start with fewer
 *   writable places than it was given. Refused when it resolves
 *     (a) to `/`;
 *     (b) through any symlink onto or above a read-only place (`/root/data -> /etc`;
 *         `/data -> /usr` in the image);
 *     (c) through a symlink in a directory the sandbox may write under this plan, to a
 *         place that is not writable without the writable paths that did so
 *         (`/var/cache -> ../usr/bin`; `/root/cache -> /tmp/cache` is fine);
 *     (d) through a missing directory and `..` (see {@link resolveInTree}).
 *   A symlink on the read-only part of the tree is image content (or the content of a
 *   snapshot restored with other options) and is followed into read-only paths, as
 *   merged-/usr images need (`/lib/python3/site-packages` is /usr/lib/...).
 *
 * @throws DsecError FailedPrecondition when a path names a non-directory (a file in the
 *   way, a symlink loop) or there are more than {@link MAX_WRITABLE_PLACES} writable
 *   places; FailedPrecondition with reason {@link WRITABLE_PATH_REFUSED_REASON} when a
 *   writable path is refused as above or resolves into /proc, /sys or /dev.
 */
export function planFilesystem(fs: ResolvedFilesystem, tree: TreeView): FilesystemPlan {
  const resolved: WritableResolution[] = [];
  for (const w of fs.writable_paths) {
    for (const r of expand(tree, w, 'writable path', true)) {
      if (isRuntime(r.path)) throw refused(`writable path ${w} resolves to ${r.path} in the image, which is below the runtime's own mounts (/proc, /sys, /dev)`);
      if (r.path === '/') throw refused(`writable path ${w} resolves to / through ${linkText(r.links)}: a writable path never makes the root writable (readonly_paths [] does)`);
      resolved.push({ ...r, option: w });
    }
  }
  const full = layout(fs, tree, resolved);
  for (const r of resolved) {
    if (!r.links.length) continue;
    const ro = full.readonlyPlaces.find((q) => atOrBelow(q, r.path));
    if (ro) throw refused(`writable path ${r.option} resolves through ${linkText(r.links)} to ${r.path}, which is or contains the read-only path ${ro}; dsecd makes a read-only path writable only when writable_paths names it`);
  }
  // Links the sandbox may have made: in a directory writable under the plan itself (the
  // most the sandbox can write, so nothing it could have changed is taken as trusted).
  const tainted = resolved.filter((r) => r.links.some((l) => full.writableAt(parentOf(l.at))));
  if (tainted.length) {
    const base = layout(fs, tree, resolved.filter((r) => !tainted.includes(r)));
    for (const r of tainted) {
      if (base.writableAt(r.path)) continue;
      const own = r.links.filter((l) => full.writableAt(parentOf(l.at)));
      throw refused(`writable path ${r.option} resolves through ${linkText(own)}, which ${own.length > 1 ? 'are' : 'is'} in a writable part of the sandbox (the sandbox may have made ${own.length > 1 ? 'them' : 'it'}), to ${r.path}, outside its writable places; dsecd does not follow ${own.length > 1 ? 'them' : 'it'} there`);
    }
  }
  return full.plan;
}

/**
 * The entries `pattern` names in `tree`: itself resolved (a missing one only when
 * `mayCreate`), or a glob's matching directories resolved; each with the symlinks
 * followed (the glob's parent's first).
 */
function expand(tree: TreeView, pattern: string, what: string, mayCreate: boolean): ResolvedPath[] {
  const base = path.posix.basename(pattern);
  if (!GLOB_CHARS.test(base)) {
    const r = resolveInTree(tree, pattern, what);
    return r.missing > 0 && !mayCreate ? [] : [r];
  }
  const parent = resolveInTree(tree, parentOf(pattern), what);
  if (parent.missing > 0) return [];
  const out: ResolvedPath[] = [];
  for (const name of tree.list(parent.path).sort()) {
    if (!globMatch(base, name)) continue;
    // A glob names directories: a file, a dangling or looping symlink it matches is not one.
    let r: ResolvedPath;
    try {
      r = resolveInTree(tree, path.posix.join(parent.path, name), what);
    } catch {
      continue;
    }
    if (r.missing === 0) out.push({ ...r, links: [...parent.links, ...r.links] });
  }
  return out;
}

/** The plan for `fs` over `tree` with the writable paths `writables` (already resolved and checked against /proc, /sys, /dev and `/`). */
function layout(fs: ResolvedFilesystem, tree: TreeView, writables: readonly ResolvedPath[]): Layout {
  const create = new Set<string>();
  for (const r of writables) {
    for (let i = r.missing; i > 0; i--) create.add(r.path.split('/').slice(0, depth(r.path) - i + 2).join('/'));
  }
  const sortedCreate = [...create].sort((a, b) => depth(a) - depth(b) || (a < b ? -1 : 1));
  const existsAfter = (p: string) => tree.kind(p) === 'dir' || create.has(p);
  const topLevel = [...new Set([...tree.list('/').map((n) => `/${n}`), ...sortedCreate.filter((p) => depth(p) === 1)])]
    .filter((p) => !isRuntime(p) && existsAfter(p))
    .sort();
  if (fs.readonly_paths.length === 0) {
    // Read-only paths off: root read-write, no binds. Landlock's writable places are the
    // top-level directories (see the module comment); the sandbox may change `/` itself.
    const writable = checkPlaces(topLevel);
    return {
      plan: { readonlyRoot: false, binds: [], create: sortedCreate, writable },
      writableAt: (p) => p === '/' || writable.some((w) => atOrBelow(p, w)),
      readonlyPlaces: [],
    };
  }
  const explicit = new Map<string, 'ro' | 'rw'>();
  const roAll = fs.readonly_paths.includes('/');
  const matchesAny = (list: readonly string[], p: string) => list.some((x) => pathMatches(x, p));
  for (const t of topLevel) explicit.set(t, matchesAny(fs.writable_paths, t) ? 'rw' : roAll || matchesAny(fs.readonly_paths, t) ? 'ro' : 'rw');
  for (const r of fs.readonly_paths) {
    if (r === '/' || depth(r) < 2) continue;
    for (const p of expand(tree, r, 'read-only path', false)) if (!isRuntime(p.path) && existsAfter(p.path) && !explicit.has(p.path)) explicit.set(p.path, 'ro');
  }
  // Read-only places as the options make them, before writable paths win: one that a
  // writable path names literally (no symlink followed) is the user's exception.
  const readonlyPlaces = [...explicit].filter(([p, m]) => m === 'ro' && !writables.some((r) => r.path === p && r.links.length === 0)).map(([p]) => p);
  for (const r of writables) explicit.set(r.path, 'rw');
  const modeOf = (p: string): 'ro' | 'rw' => {
    for (let q = p; ; q = parentOf(q)) {
      const m = explicit.get(q);
      if (m) return m;
      if (q === '/') return 'ro';
    }
  };
  const binds: FilesystemBind[] = [];
  for (const p of [...explicit.keys()].sort((a, b) => depth(a) - depth(b) || (a < b ? -1 : 1))) {
    const mode = explicit.get(p)!;
    if (mode !== modeOf(parentOf(p))) binds.push({ path: p, readonly: mode === 'ro' });
  }
  return {
    plan: { readonlyRoot: true, binds, create: sortedCreate, writable: checkPlaces(binds.filter((b) => !b.readonly).map((b) => b.path).sort()) },
    writableAt: (p) => modeOf(p) === 'rw',
    readonlyPlaces,
  };
}

/** `writable`, or FailedPrecondition when it has more than {@link MAX_WRITABLE_PLACES} entries. */
function checkPlaces(writable: string[]): string[] {
  if (writable.length > MAX_WRITABLE_PLACES) {
    throw failedPrecondition(`${writable.length} writable places (top-level directories of the image and writable_paths); at most ${MAX_WRITABLE_PLACES}: make some read-only with readonly_paths (e.g. ["/"] and the few writable_paths the task needs)`);
  }
  return writable;
}

/**
 * Creates the directories of `plan.create` in the mounted rootfs `rootfs` (so in the
 * sandbox's writable layer), mode 0755, owned by `uid`:`uid` (the sandbox's root: its
 * base host uid). Parents come first in the plan, and planFilesystem resolved every
 * existing component, so no symlink is followed; each created directory is checked with
 * lstat afterwards all the same. An existing directory is fine (safe to call twice).
 * Only while no process of the sandbox runs (see the module comment).
 * @throws DsecError FailedPrecondition when something other than a directory is found
 *   where one was created; errno errors from mkdir/chown otherwise.
 */
export async function createPlannedDirs(rootfs: string, plan: Pick<FilesystemPlan, 'create'>, uid: number): Promise<void> {
  for (const p of plan.create) {
    const at = path.join(rootfs, p);
    await mkdir(at, { mode: 0o755 }).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== 'EEXIST') throw e;
    });
    const st = await lstat(at);
    if (!st.isDirectory()) throw failedPrecondition(`writable path ${p}: the image has a ${st.isSymbolicLink() ? 'symlink' : 'file'} there, not a directory`);
    await chown(at, uid, uid);
    await chmod(at, 0o755);
  }
}

/** Why a path is read-only in a sandbox, and the option that makes it writable (see {@link readonlyAdvice}). */
export interface ReadonlyAdvice {
  /** E.g. "below the read-only path /etc", "the top level is read-only". */
  why: string;
  /** E.g. "create the sandbox with `--writable /work` (filesystem.writable_paths; dsecd creates the directory)". */
  advice: string;
}

/**
 * How a write to `p` (a file, or a directory for `kind` 'dir') that failed with EROFS
 * could be made writable in a sandbox with options `fs`, judged from the options alone
 * (symlinks in `p` are not resolved: the caller names the path as it was asked for).
 * Writable paths are directories, so a file's advice names its directory; `--no-readonly`
 * is offered only where the directory would be a whole read-only path (`/etc` for
 * `/etc/passwd`), never for a new top-level directory (`--writable /work` is enough).
 * @returns null when read-only paths cannot be why: they are off (`readonly_paths: []`:
 *   the error comes from the runtime's own read-only mounts), or `p` is in a writable
 *   path and no deeper read-only path covers it.
 */
export function readonlyAdvice(p: string, kind: 'file' | 'dir', fs: Pick<ResolvedFilesystem, 'readonly_paths' | 'writable_paths'>): ReadonlyAdvice | null {
  if (fs.readonly_paths.length === 0) return null;
  const norm = path.posix.normalize(p).replace(/(.)\/+$/, '$1');
  // The deepest ancestor-or-self of the path that an option names (writable wins on a tie).
  let named: { at: string; mode: 'ro' | 'rw' } | null = null;
  for (let q = norm; ; q = parentOf(q)) {
    if (fs.writable_paths.some((w) => pathMatches(w, q))) named = { at: q, mode: 'rw' };
    else if (fs.readonly_paths.some((r) => pathMatches(r, q))) named = { at: q, mode: 'ro' };
    if (named || q === '/') break;
  }
  if (named?.mode === 'rw') return null;
  const dir = kind === 'dir' ? norm : parentOf(norm);
  const create = (d: string, extra = '') => `create the sandbox with \`--writable ${d}\` (filesystem.writable_paths; dsecd creates the directory when missing)${extra}`;
  if (!named || named.at === '/') {
    // Only the root is read-only here: the top level is fixed, every top-level directory
    // the options do not name is writable already.
    const top = `/${norm.split('/')[1] ?? ''}`;
    const why = named ? 'every path but writable_paths is read-only (readonly_paths ["/"])' : 'the top level is read-only: no new top-level entry can be made';
    if (norm === '/' || (top === norm && kind === 'file')) return { why, advice: 'write below a writable directory (e.g. /tmp), or name a directory to keep writable with `--writable DIR` when creating the sandbox' };
    return { why, advice: create(named ? dir : top) };
  }
  const why = `below the read-only path ${named.at}`;
  if (dir === named.at || depth(dir) < depth(named.at)) {
    return { why, advice: create(named.at, `, which makes all of ${named.at} writable${kind === 'file' ? ` (writable paths are directories: ${norm} itself cannot be one)` : ''}, or with \`--no-readonly\`` ) };
  }
  return { why, advice: create(dir) };
}
