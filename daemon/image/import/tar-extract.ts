/**
 * Writing the entries of one tar (a layer, or a whole root filesystem) into a directory
 * that is then packed into an EROFS layer: {@link Extractor}, driven entry by entry by
 * extractLayerTar (daemon/image/import/tar.ts). The tar comes from outside (a user's
 * file, an OCI or docker archive), so extraction is SANITISED; the rules, and why, are
 * in docs/IMAGES.md ("Import and sanitisation"). In short:
 *
 *   - paths: a leading `/` is stripped (recorded in `sanitised`), `.` and empty
 *     components are dropped, and ANY `..` component refuses the archive (no real layer
 *     has one, and refusing is simpler to reason about than resolving);
 *   - symlinks: created verbatim (their targets are resolved inside the sandbox at run
 *     time, so absolute targets are fine) but NEVER followed while extracting: an entry
 *     whose parent path is a symlink, wherever it points, refuses the archive; files are
 *     opened with O_EXCL|O_NOFOLLOW after removing whatever was at their path;
 *   - hard links: only to a non-directory entry extracted earlier from the same archive;
 *   - device nodes: refused (InvalidArgument), except below `dev/`, where they are
 *     dropped and recorded (runc mounts its own /dev over it, so dropping them changes
 *     nothing a sandbox can see). Overlay whiteouts are only ever made by this module;
 *   - fifos are kept; setuid/setgid/sticky bits are kept (images need them, e.g. su and
 *     ping; they are safe because every sandbox runs in its own user namespace with
 *     no_new_privs); owners are kept numerically (uid/gid from the header, names ignored)
 *     when running as root; mtimes are kept (directory mtimes set last, after their
 *     children). Extended attributes in PAX headers are not applied;
 *   - a link name on a regular-file entry is ignored, as GNU tar and Go's archive/tar do
 *     (podman writes the second and later whiteouts of a layer that way, because
 *     overlayfs shares one inode between whiteouts); unknown entry types (GNU sparse
 *     files, volume labels, …) refuse the archive rather than lose a file silently.
 *
 * With `ociWhiteouts`, OCI whiteouts become what overlayfs understands in a lower layer:
 * `<dir>/.wh.<name>` becomes a character device 0:0 `<dir>/<name>` (mode 0000, root) and
 * `<dir>/.wh..wh..opq` sets the xattr `trusted.overlay.opaque=y` on `<dir>`. The name
 * decides, not the entry type: a `.wh.*` entry is a whiteout whatever its type, size or
 * link name. Per the OCI image spec a whiteout only hides LOWER layers: if the same
 * archive also has `<name>`, the whiteout is dropped (the entry itself hides the lower
 * one). Other `.wh..wh.*` names are AUFS bookkeeping and are skipped.
 *
 * Node has neither mknod(2) nor setxattr(2): fifos and whiteouts are created at the end,
 * in one `xargs … mknod` run per kind (an empty placeholder file holds their path
 * meanwhile, so every check sees the final tree shape), and opaque markers are set with
 * `setfattr` (Debian package `attr`) in batches, or only reported (`opaqueXattrs: false`)
 * when extracting as the builder identity, which may not set trusted.* xattrs.
 */
import { constants as fsc } from 'node:fs';
import { chmod, lchown, link, lstat, lutimes, mkdir, open, rm, symlink, unlink, type FileHandle } from 'node:fs/promises';
import type { Stats } from 'node:fs';
import { execa } from 'execa';
import { DsecError } from '../../errors.js';
import type { TarEntry } from './tar-input.js';

/** Options for extractLayerTar (daemon/image/import/tar.ts). */
export interface ExtractOptions {
  /** Convert OCI whiteouts (`.wh.<name>`, `.wh..wh..opq`) into overlayfs whiteouts and opaque dirs. */
  ociWhiteouts: boolean;
  /**
   * Progress: called with the number of INPUT bytes consumed so far (as stored, i.e.
   * compressed bytes for a compressed tar), at most about once per MiB and once at the end.
   */
  onProgress?(bytes: number): void;
  /**
   * Set `trusted.overlay.opaque=y` on opaque directories (default true). The builder
   * identity cannot set trusted.* xattrs (they need CAP_SYS_ADMIN in the initial user
   * namespace), so it passes false and hands ExtractReport.opaque to mkfs.erofs
   * instead (native/builder/mkfs-shim.c).
   */
  opaqueXattrs?: boolean;
  /**
   * Owners (uid and gid) at or above this are recorded as 65534 ("nobody"), with a note.
   * The builder passes 65536: its user namespace maps ids 0..65535 only, and a sandbox
   * sees only those (its lowers are idmapped onto a range of 65,536), so a larger id
   * shows as 65534 inside anyway. Default: no limit (root keeps every id).
   */
  idLimit?: number;
}

/** The xattr that marks an overlayfs directory opaque (read with the mounter's credentials; we mount as root). */
export const OPAQUE_XATTR = 'trusted.overlay.opaque';
/** OCI whiteout prefix: `.wh.<name>` deletes `<name>` of lower layers. */
export const WHITEOUT_PREFIX = '.wh.';
/** OCI opaque marker: `<dir>/.wh..wh..opq` hides everything of lower layers below `<dir>`. */
export const OPAQUE_MARKER = '.wh..wh..opq';

/** Paths per setfattr invocation: far below ARG_MAX even for 4 KiB paths. */
const SETFATTR_BATCH = 256;
/**
 * Files whose metadata (owner, mode, mtime) and close may still be in flight. Those steps
 * go through an open fd, so they cannot be misdirected by later entries (an unlinked or
 * replaced path leaves the fd on its inode); running them in the background overlaps
 * them with the next entries and cuts extraction time several-fold on many small files.
 * The cap bounds open fds.
 */
const MAX_INFLIGHT_FILES = 64;

const EPOCH = new Date(0);

/**
 * Normalises a tar entry path to a path relative to the extraction root, `''` meaning
 * the root itself: strips leading `/` (reported as `strippedSlash`), drops `.` and
 * empty components. Throws an InvalidArgument DsecError if any component is `..`
 * (even one that would not escape: no well-formed layer has one).
 */
export function normaliseEntryPath(raw: string): { rel: string; strippedSlash: boolean } {
  if (raw.includes('\0')) throw new DsecError('InvalidArgument', `tar entry ${JSON.stringify(raw)} contains a NUL byte`);
  const strippedSlash = raw.startsWith('/');
  const parts: string[] = [];
  for (const c of raw.split('/')) {
    if (c === '' || c === '.') continue;
    if (c === '..') throw new DsecError('InvalidArgument', `tar entry ${JSON.stringify(raw)} contains "..": refused, it could reach outside the layer`);
    parts.push(c);
  }
  return { rel: parts.join('/'), strippedSlash };
}

/** A fifo or whiteout waiting for mknod at the end; an empty placeholder file holds its path. */
interface PendingNode {
  kind: 'fifo' | 'whiteout';
  mode: number;
  uid: number;
  gid: number;
  mtime: Date;
}

/** Numeric metadata of an entry, with defaults for missing or malformed header fields. */
interface EntryMeta {
  uid: number;
  gid: number;
  mode: number;
  mtime: Date;
}

function validDate(d: Date | undefined): Date {
  return d instanceof Date && !Number.isNaN(d.getTime()) ? d : EPOCH;
}

function entryMeta(e: TarEntry, defaultMode: number): EntryMeta {
  const id = (n: number | undefined) => (Number.isInteger(n) && (n as number) >= 0 ? (n as number) : 0);
  return {
    uid: id(e.uid),
    gid: id(e.gid),
    mode: (Number.isInteger(e.mode) ? (e.mode as number) : defaultMode) & 0o7777,
    mtime: validDate(e.mtime),
  };
}

async function lstatOrNull(p: string): Promise<Stats | null> {
  try {
    return await lstat(p);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw e;
  }
}

/** Reading an entry's body failed: the parser or the decompressor stopped (its own error says why). */
export class BodyReadError extends Error {
  constructor(readonly original: unknown) {
    super(`reading a tar entry's data failed: ${(original as Error)?.message ?? String(original)}`);
  }
}

/** Turns an errno error met while extracting `entryPath` into a DsecError with context. */
export function entryError(e: unknown, entryPath: string): DsecError | BodyReadError {
  if (e instanceof DsecError || e instanceof BodyReadError) return e;
  const code = (e as NodeJS.ErrnoException).code;
  const msg = `extracting tar entry ${JSON.stringify(entryPath)}: ${(e as Error).message ?? String(e)}`;
  if (code === 'ENOSPC' || code === 'EDQUOT') return new DsecError('ResourceExhausted', msg, { cause: e });
  if (code === 'ENAMETOOLONG' || code === 'EILSEQ') return new DsecError('InvalidArgument', msg, { cause: e });
  return new DsecError('Internal', msg, { cause: e });
}

/** One extraction run: the state that the entry handlers share. */
export class Extractor {
  readonly root: string;
  readonly oci: boolean;
  private readonly opaqueXattrs: boolean;
  private readonly idLimit: number;
  readonly asRoot = process.geteuid?.() === 0;
  entries = 0;
  bytes = 0;
  whiteouts = 0;
  opaqueDirs = 0;
  /** Paths (relative) known to be real directories on disk right now. '' is the root. */
  private readonly knownDirs = new Set<string>(['']);
  /** Non-directory entries created from this archive and still on disk: valid hard-link targets. */
  private readonly extracted = new Set<string>();
  /** Fifos and whiteouts to mknod at the end. */
  private readonly pending = new Map<string, PendingNode>();
  /** Directories to mark opaque at the end. */
  private readonly opaque = new Set<string>();
  /** Final mode and mtime of directories from their entries, applied at the end. */
  private readonly dirMeta = new Map<string, { mode: number; mtime: Date }>();
  /** kind of change -> count and first example, for the report. */
  private readonly notes = new Map<string, { count: number; example?: string }>();
  /** Background fd work of files (see MAX_INFLIGHT_FILES). */
  private readonly inflight = new Set<Promise<void>>();

  opaqueRel: string[] = [];

  constructor(root: string, opts: ExtractOptions) {
    this.root = root;
    this.oci = opts.ociWhiteouts;
    this.opaqueXattrs = opts.opaqueXattrs ?? true;
    this.idLimit = opts.idLimit ?? Infinity;
  }

  /** {@link entryMeta}, with owners at or above `idLimit` recorded as 65534. */
  private meta(e: TarEntry, defaultMode: number): EntryMeta {
    const m = entryMeta(e, defaultMode);
    if (m.uid >= this.idLimit || m.gid >= this.idLimit) {
      this.note(`owners above ${this.idLimit - 1} recorded as 65534 (a sandbox sees only ids 0-${this.idLimit - 1})`, e.path);
      if (m.uid >= this.idLimit) m.uid = 65534;
      if (m.gid >= this.idLimit) m.gid = 65534;
    }
    return m;
  }

  /** The path of `rel` below the extraction root (`''` is the root itself). */
  abs(rel: string): string {
    return rel === '' ? this.root : `${this.root}/${rel}`;
  }

  /** Records a change made instead of a refusal; `example` is the entry path (none for archive-wide notes). */
  note(what: string, example?: string): void {
    const n = this.notes.get(what);
    if (n) n.count++;
    else this.notes.set(what, { count: 1, example });
  }

  /** What was changed rather than refused, one line per kind with a count and an example (ExtractReport.sanitised). */
  sanitised(): string[] {
    return [...this.notes].map(([what, n]) =>
      n.example === undefined ? what : `${what} (${n.count} ${n.count === 1 ? 'entry' : 'entries'}, e.g. ${JSON.stringify(n.example)})`,
    );
  }

  /**
   * Handles one entry. Reads the body of a regular file; any other body is left for the
   * caller to skip (resume). Errors carry the entry path.
   */
  async handle(entry: TarEntry): Promise<void> {
    try {
      await this.handleInner(entry);
    } catch (e) {
      throw entryError(e, entry.path);
    }
  }

  private async handleInner(entry: TarEntry): Promise<void> {
    const raw = entry.path;
    const { rel, strippedSlash } = normaliseEntryPath(raw);
    if (strippedSlash) this.note('stripped leading "/"', raw);
    const parts = rel === '' ? [] : rel.split('/');

    if (this.oci && parts.length > 0) {
      for (let i = 0; i < parts.length - 1; i++) {
        if (parts[i].startsWith('.wh..wh.')) {
          this.note('skipped AUFS metadata below .wh..wh.*', raw);
          return;
        }
        if (parts[i].startsWith(WHITEOUT_PREFIX)) {
          throw new DsecError('InvalidArgument', `tar entry ${JSON.stringify(raw)}: a whiteout name (${parts[i]}) used as a directory`);
        }
      }
      // The name decides: podman writes later whiteouts of a layer as regular files with a
      // link name (one shared overlay whiteout inode), other tools as hard links.
      if (parts[parts.length - 1].startsWith(WHITEOUT_PREFIX)) {
        await this.whiteout(raw, parts, validDate(entry.mtime));
        return;
      }
    }

    switch (entry.type) {
      case 'file':
      case 'contiguous-file':
        if (entry.linkpath !== '') this.note('ignored the link name of regular-file entries', raw);
        return this.file(entry, raw, rel);
      case 'directory':
        return this.directory(entry, raw, rel);
      case 'symlink':
        return this.symlink(entry, raw, rel);
      case 'link':
        return this.hardlink(entry, raw, rel);
      case 'fifo':
        return this.fifo(entry, raw, rel);
      case 'character-device':
      case 'block-device': {
        if (rel === 'dev' || rel.startsWith('dev/')) {
          this.note('dropped device node below /dev (runc mounts its own /dev there)', raw);
          return;
        }
        const kind = entry.type === 'character-device' ? 'character' : 'block';
        throw new DsecError(
          'InvalidArgument',
          `tar entry ${JSON.stringify(raw)} is a ${kind} device ${entry.devmajor ?? '?'}:${entry.devminor ?? '?'}: device nodes are refused in layers (only below /dev are they dropped)`,
        );
      }
      default:
        throw new DsecError(
          'InvalidArgument',
          `tar entry ${JSON.stringify(raw)} has an unsupported type (e.g. a GNU sparse file, a GNU dump directory or a volume label): refused, skipping it would silently lose a file`,
        );
    }
  }

  /** Makes sure every component of `dirRel` is a real directory (not a symlink), creating missing ones 0755 root. */
  private async ensureDirChain(dirRel: string, raw: string): Promise<void> {
    if (this.knownDirs.has(dirRel)) return;
    let p = '';
    for (const c of dirRel.split('/')) {
      p = p ? `${p}/${c}` : c;
      if (this.knownDirs.has(p)) continue;
      const st = await lstatOrNull(this.abs(p));
      if (st?.isSymbolicLink()) {
        throw new DsecError('InvalidArgument', `tar entry ${JSON.stringify(raw)} goes through the symlink ${JSON.stringify(p)}: refused, writing through symlinks could reach outside the layer`);
      }
      if (st && !st.isDirectory()) {
        if (!this.pending.has(p)) throw new DsecError('InvalidArgument', `tar entry ${JSON.stringify(raw)}: ${JSON.stringify(p)} is not a directory`);
        await unlink(this.abs(p)); // a fifo/whiteout placeholder: the directory replaces it
        this.pending.delete(p);
        this.extracted.delete(p);
      }
      if (!st || !st.isDirectory()) {
        await mkdir(this.abs(p));
        await chmod(this.abs(p), 0o755); // implicit parent: 0755 root:root, whatever the umask
      }
      this.knownDirs.add(p);
    }
  }

  private parentOf(rel: string): string {
    const i = rel.lastIndexOf('/');
    return i < 0 ? '' : rel.slice(0, i);
  }

  /** Forgets everything recorded at `rel` and (for a removed directory) below it. */
  private forget(rel: string, subtree: boolean): void {
    for (const set of [this.knownDirs, this.extracted, this.opaque]) set.delete(rel);
    this.pending.delete(rel);
    this.dirMeta.delete(rel);
    if (!subtree) return;
    const prefix = `${rel}/`;
    for (const set of [this.knownDirs, this.extracted, this.opaque]) for (const k of set) if (k.startsWith(prefix)) set.delete(k);
    for (const m of [this.pending, this.dirMeta] as Map<string, unknown>[]) for (const k of m.keys()) if (k.startsWith(prefix)) m.delete(k);
  }

  /**
   * Clears the path of a new entry: a later entry replaces an earlier one with the same
   * path, except that a directory over a directory merges. Returns whether `rel` is now
   * free ('absent') or an existing directory to merge into ('merge').
   */
  private async prepareLeaf(rel: string, wantDir: boolean): Promise<'absent' | 'merge'> {
    const st = await lstatOrNull(this.abs(rel));
    if (!st) return 'absent';
    if (wantDir && st.isDirectory()) return 'merge';
    if (st.isDirectory()) {
      await rm(this.abs(rel), { recursive: true, force: true });
      this.forget(rel, true);
    } else {
      await unlink(this.abs(rel));
      this.forget(rel, false);
    }
    return 'absent';
  }

  private refuseRoot(raw: string, rel: string): void {
    if (rel === '') throw new DsecError('InvalidArgument', `tar entry ${JSON.stringify(raw)} names the root but is not a directory`);
  }

  private async placeholder(rel: string): Promise<void> {
    const fh = await open(this.abs(rel), fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW, 0o600);
    await fh.close();
  }

  /** Runs `work` in the background (bounded); a failure surfaces here or in {@link drain}. */
  private async background(work: Promise<void>): Promise<void> {
    const p: Promise<void> = work.finally(() => this.inflight.delete(p));
    p.catch(() => undefined); // observed by race/drain below
    this.inflight.add(p);
    if (this.inflight.size >= MAX_INFLIGHT_FILES) await Promise.race(this.inflight);
  }

  /** Waits for all background work; rethrows the first failure. */
  async drain(): Promise<void> {
    await Promise.all([...this.inflight]);
  }

  /** Waits for all background work, ignoring failures (error path: close every fd). */
  async drainQuietly(): Promise<void> {
    await Promise.allSettled([...this.inflight]);
  }

  private async file(entry: TarEntry, raw: string, rel: string): Promise<void> {
    this.refuseRoot(raw, rel);
    const m = this.meta(entry, 0o644);
    await this.ensureDirChain(this.parentOf(rel), raw);
    const flags = fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW;
    let fh: FileHandle;
    try {
      fh = await open(this.abs(rel), flags, 0o600);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      await this.prepareLeaf(rel, false); // also an existing symlink: O_EXCL never follows it
      fh = await open(this.abs(rel), flags, 0o600);
    }
    try {
      // Body: the next chunk is asked for only once this one is written (backpressure
      // reaches the tar parser). A failing read is the archive's fault (truncated, or the
      // decompressor failed): the caller reports the parser's or decompressor's error.
      const it = entry.body[Symbol.asyncIterator]();
      for (;;) {
        let r: IteratorResult<Buffer>;
        try {
          r = await it.next();
        } catch (e) {
          throw new BodyReadError(e);
        }
        if (r.done) break;
        await fh.write(r.value);
        this.bytes += r.value.length;
      }
    } catch (e) {
      await fh.close();
      throw e;
    }
    this.extracted.add(rel);
    const asRoot = this.asRoot;
    await this.background(
      (async () => {
        try {
          if (asRoot) await fh.chown(m.uid, m.gid);
          await fh.chmod(m.mode); // after chown, which clears setuid/setgid
          await fh.utimes(m.mtime, m.mtime);
        } catch (e) {
          throw entryError(e, raw);
        } finally {
          await fh.close();
        }
      })(),
    );
  }

  private async directory(entry: TarEntry, raw: string, rel: string): Promise<void> {
    const m = this.meta(entry, 0o755);
    if (rel !== '') {
      await this.ensureDirChain(this.parentOf(rel), raw);
      try {
        await mkdir(this.abs(rel), { mode: 0o700 }); // the final mode is set at the end
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
        if ((await this.prepareLeaf(rel, true)) === 'absent') await mkdir(this.abs(rel), { mode: 0o700 });
      }
      this.knownDirs.add(rel);
    }
    if (this.asRoot) await lchown(this.abs(rel), m.uid, m.gid);
    this.dirMeta.set(rel, { mode: m.mode, mtime: m.mtime });
  }

  private async symlink(entry: TarEntry, raw: string, rel: string): Promise<void> {
    this.refuseRoot(raw, rel);
    const target = entry.linkpath;
    if (target === '') throw new DsecError('InvalidArgument', `tar entry ${JSON.stringify(raw)} is a symlink without a target`);
    if (target.includes('\0')) throw new DsecError('InvalidArgument', `tar entry ${JSON.stringify(raw)} is a symlink whose target contains a NUL byte`);
    const m = this.meta(entry, 0o777);
    await this.ensureDirChain(this.parentOf(rel), raw);
    try {
      await symlink(target, this.abs(rel));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      await this.prepareLeaf(rel, false);
      await symlink(target, this.abs(rel));
    }
    if (this.asRoot) await lchown(this.abs(rel), m.uid, m.gid);
    await lutimes(this.abs(rel), m.mtime, m.mtime);
    this.extracted.add(rel);
  }

  private async hardlink(entry: TarEntry, raw: string, rel: string): Promise<void> {
    this.refuseRoot(raw, rel);
    const linkpath = entry.linkpath;
    if (linkpath === '') throw new DsecError('InvalidArgument', `tar entry ${JSON.stringify(raw)} is a hard link without a target`);
    const { rel: target, strippedSlash } = normaliseEntryPath(linkpath);
    if (strippedSlash) this.note('stripped leading "/" from a hard link target', linkpath);
    if (target === rel) return; // a link to itself: nothing to do
    await this.ensureDirChain(this.parentOf(rel), raw);
    await this.prepareLeaf(rel, false);
    // `extracted` only holds paths created from this archive whose parent chain is made of
    // real directories (entries below a replaced directory are forgotten), so link(2)
    // below cannot be steered outside the layer.
    if (!this.extracted.has(target)) {
      throw new DsecError(
        'InvalidArgument',
        `tar entry ${JSON.stringify(raw)} is a hard link to ${JSON.stringify(linkpath)}, which is not an earlier file of this archive: refused, a hard link must not reach outside the layer`,
      );
    }
    const pend = this.pending.get(target);
    if (pend) {
      // link(2) to a placeholder would not survive its replacement by mknod: make a twin.
      await this.placeholder(rel);
      this.pending.set(rel, { ...pend });
      this.note('hard link to a fifo made a separate fifo', raw);
    } else {
      const st = await lstat(this.abs(target));
      if (st.isDirectory()) throw new DsecError('InvalidArgument', `tar entry ${JSON.stringify(raw)} is a hard link to a directory`);
      await link(this.abs(target), this.abs(rel));
    }
    this.extracted.add(rel);
  }

  private async fifo(entry: TarEntry, raw: string, rel: string): Promise<void> {
    this.refuseRoot(raw, rel);
    const m = this.meta(entry, 0o644);
    await this.ensureDirChain(this.parentOf(rel), raw);
    await this.prepareLeaf(rel, false);
    await this.placeholder(rel);
    this.pending.set(rel, { kind: 'fifo', ...m });
    this.extracted.add(rel);
  }

  /** `.wh.<name>` and `.wh..wh..opq` (parts = normalised path components, last one a whiteout name). */
  private async whiteout(raw: string, parts: string[], mtime: Date): Promise<void> {
    const base = parts[parts.length - 1];
    const dir = parts.slice(0, -1).join('/');
    if (base === OPAQUE_MARKER) {
      await this.ensureDirChain(dir, raw);
      this.opaque.add(dir);
      return;
    }
    if (base.startsWith('.wh..wh.')) {
      this.note('skipped AUFS metadata .wh..wh.*', raw);
      return;
    }
    const name = base.slice(WHITEOUT_PREFIX.length);
    if (name === '' || name === '.' || name === '..') throw new DsecError('InvalidArgument', `tar entry ${JSON.stringify(raw)} is a malformed whiteout`);
    const target = dir ? `${dir}/${name}` : name;
    await this.ensureDirChain(dir, raw);
    if (await lstatOrNull(this.abs(target))) {
      // OCI: a whiteout hides lower layers only; this layer's own entry already does.
      if (!this.pending.has(target)) this.note('dropped whiteout of a path this layer itself provides', raw);
      return;
    }
    await this.placeholder(target);
    this.pending.set(target, { kind: 'whiteout', mode: 0, uid: 0, gid: 0, mtime });
  }

  /** Finishes file metadata, creates fifos and whiteouts, marks opaque dirs, applies directory modes and mtimes. */
  async finish(): Promise<void> {
    await this.drain();
    const byKind = { fifo: [] as string[], whiteout: [] as string[] };
    for (const [rel, p] of this.pending) {
      await unlink(this.abs(rel));
      byKind[p.kind].push(rel);
    }
    await mknodAll(byKind.whiteout.map((r) => this.abs(r)), ['-m', '0000'], ['c', '0', '0']);
    await mknodAll(byKind.fifo.map((r) => this.abs(r)), ['-m', '0600'], ['p']);
    for (const [rel, p] of this.pending) {
      const at = this.abs(rel);
      if (p.kind === 'fifo') {
        if (this.asRoot) await lchown(at, p.uid, p.gid);
        await chmod(at, p.mode);
      }
      await lutimes(at, p.mtime, p.mtime);
    }
    this.whiteouts = byKind.whiteout.length;

    const opaque: string[] = [];
    for (const rel of this.opaque) {
      const st = await lstatOrNull(this.abs(rel));
      if (st?.isDirectory()) opaque.push(rel);
      else this.note('dropped opaque marker of a directory that a later entry replaced', rel);
    }
    if (this.opaqueXattrs) await setOpaque(opaque.map((r) => this.abs(r)));
    this.opaqueDirs = opaque.length;
    this.opaqueRel = opaque.sort();

    // Last: creating children above changed directory mtimes.
    for (const [rel, m] of this.dirMeta) {
      await chmod(this.abs(rel), m.mode);
      await lutimes(this.abs(rel), m.mtime, m.mtime);
    }
    if (!this.asRoot && this.entries > 0) this.note('ownership not applied: not running as root');
  }
}

/** `mknod <modeArgs> <path> <spec>` for every path, in one xargs run (no shell involved). */
async function mknodAll(paths: string[], modeArgs: string[], spec: string[]): Promise<void> {
  if (paths.length === 0) return;
  const r = await execa('xargs', ['-0', '-r', '-I', '{}', 'mknod', ...modeArgs, '--', '{}', ...spec], {
    input: paths.join('\0'),
    reject: false,
  });
  if (r.failed) {
    const why = (r.stderr || r.message || '').toString().trim();
    throw new DsecError('Internal', `creating ${paths.length} ${spec[0] === 'p' ? 'fifos' : 'whiteouts'} with mknod failed: ${why}`, { cause: r });
  }
}

/** Sets `trusted.overlay.opaque=y` on each directory (`setfattr -h`, batched). */
async function setOpaque(dirs: string[]): Promise<void> {
  for (let i = 0; i < dirs.length; i += SETFATTR_BATCH) {
    const batch = dirs.slice(i, i + SETFATTR_BATCH);
    const r = await execa('setfattr', ['-h', '-n', OPAQUE_XATTR, '-v', 'y', '--', ...batch], { reject: false, stdin: 'ignore' });
    if (r.failed) {
      if ((r as { code?: string }).code === 'ENOENT') {
        throw new DsecError('FailedPrecondition', 'setfattr not found: install the Debian package "attr" (needed for opaque directories of OCI layers)', { cause: r });
      }
      const why = (r.stderr || r.message || '').toString().trim();
      throw new DsecError('Internal', `setting ${OPAQUE_XATTR} on ${batch.length} directories failed: ${why}`, { cause: r });
    }
  }
}
