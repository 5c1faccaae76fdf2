/**
 * Extracting one tar stream (a layer, or a whole root filesystem) into a directory that
 * is then packed into an EROFS layer. The tar comes from outside (a user's file, an OCI
 * or docker archive), so extraction is SANITISED; the rules, and why, are in
 * docs/IMAGES.md ("Import and sanitisation"). In short:
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
 *     children). Extended attributes in PAX headers are not read (node-tar drops them).
 *
 * With `ociWhiteouts`, OCI whiteouts become what overlayfs understands in a lower layer:
 * `<dir>/.wh.<name>` becomes a character device 0:0 `<dir>/<name>` (mode 0000, root) and
 * `<dir>/.wh..wh..opq` sets the xattr `trusted.overlay.opaque=y` on `<dir>`. Per the OCI
 * image spec a whiteout only hides LOWER layers: if the same archive also has `<name>`,
 * the whiteout is dropped (the entry itself hides the lower one). Other `.wh..wh.*`
 * names are AUFS bookkeeping and are skipped.
 *
 * Node has neither mknod(2) nor setxattr(2): fifos and whiteouts are created at the end,
 * in one `xargs … mknod` run per kind (an empty placeholder file holds their path
 * meanwhile, so every check sees the final tree shape), and opaque markers are set with
 * `setfattr` (Debian package `attr`) in batches. Compression is detected from the first
 * bytes, never from a file name: gzip through node:zlib, zstd through `zstd -dc` (Node
 * 20's zlib has no zstd; Debian package `zstd`).
 */
import { createHash } from 'node:crypto';
import { constants as fsc, createReadStream, type ReadStream } from 'node:fs';
import { chmod, lchown, link, lstat, lutimes, mkdir, open, rm, symlink, unlink, type FileHandle } from 'node:fs/promises';
import { once } from 'node:events';
import { resolve } from 'node:path';
import { pipeline, Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import type { Stats } from 'node:fs';
import { execa, type ResultPromise } from 'execa';
import { Parser, type ReadEntry } from 'tar';
import { DsecError } from '../../errors.js';

/** Options for {@link extractLayerTar}. */
export interface ExtractOptions {
  /** Convert OCI whiteouts (`.wh.<name>`, `.wh..wh..opq`) into overlayfs whiteouts and opaque dirs. */
  ociWhiteouts: boolean;
  /**
   * Progress: called with the number of INPUT bytes consumed so far (as stored, i.e.
   * compressed bytes for a compressed tar), at most about once per MiB and once at the end.
   */
  onProgress?(bytes: number): void;
}

/** Compression of a tar stream, detected from its first bytes. */
export type TarCompression = 'none' | 'gzip' | 'zstd';

/** What {@link extractLayerTar} did. */
export interface ExtractReport {
  /** Tar entries read (every file, dir, link, whiteout… header; PAX/long-name headers not counted). */
  entries: number;
  /** Bytes of regular-file content written. */
  bytes: number;
  /** Overlay whiteouts (char 0:0) created. */
  whiteouts: number;
  /** Directories marked opaque (`trusted.overlay.opaque=y`). */
  opaqueDirs: number;
  /**
   * What was changed rather than refused, one line per kind with a count and an example,
   * e.g. `stripped leading "/" from 12 entries (e.g. "/etc/x")`. Empty for a clean tar.
   */
  sanitised: string[];
  /** Compression detected on the input. */
  compression: TarCompression;
  /** `sha256:<hex>` of the input bytes as stored (an OCI layer descriptor's digest). */
  inputDigest: string;
  /** Input bytes as stored (an OCI layer descriptor's size). */
  inputBytes: number;
  /** `sha256:<hex>` of the uncompressed tar stream (an OCI config's `rootfs.diff_ids` entry). */
  diffId: string;
}

/** The xattr that marks an overlayfs directory opaque (read with the mounter's credentials; we mount as root). */
export const OPAQUE_XATTR = 'trusted.overlay.opaque';
/** OCI whiteout prefix: `.wh.<name>` deletes `<name>` of lower layers. */
export const WHITEOUT_PREFIX = '.wh.';
/** OCI opaque marker: `<dir>/.wh..wh..opq` hides everything of lower layers below `<dir>`. */
export const OPAQUE_MARKER = '.wh..wh..opq';

/** Progress granularity: report after every this many input bytes. */
const PROGRESS_STEP = 1 << 20;
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
 * Detects the compression of a tar from its first bytes (at least 4 are needed):
 * gzip `1f 8b`, zstd `28 b5 2f fd`, anything else is taken as a plain tar (the tar parser
 * then refuses what is not one). xz and bzip2 are recognised only to be refused with a
 * clear InvalidArgument DsecError (no image tool produces them for layers).
 */
export function detectCompression(head: Buffer): TarCompression {
  if (head.length >= 2 && head[0] === 0x1f && head[1] === 0x8b) return 'gzip';
  if (head.length >= 4 && head.readUInt32BE(0) === 0x28b52ffd) return 'zstd';
  if (head.length >= 6 && head.subarray(0, 6).equals(Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]))) {
    throw new DsecError('InvalidArgument', 'xz-compressed tars are not supported: decompress it first (or use gzip or zstd)');
  }
  if (head.length >= 3 && head.subarray(0, 3).toString('latin1') === 'BZh') {
    throw new DsecError('InvalidArgument', 'bzip2-compressed tars are not supported: decompress it first (or use gzip or zstd)');
  }
  return 'none';
}

/**
 * Normalises a tar entry path to a path relative to the extraction root, `''` meaning
 * the root itself: strips leading `/` (reported as `strippedSlash`), drops `.` and
 * empty components. Throws an InvalidArgument DsecError if any component is `..`
 * (even one that would not escape: no well-formed layer has one).
 */
export function normaliseEntryPath(raw: string): { rel: string; strippedSlash: boolean } {
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

function entryMeta(e: ReadEntry, defaultMode: number): EntryMeta {
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

/** Turns an errno error met while extracting `entryPath` into a DsecError with context. */
function entryError(e: unknown, entryPath: string): DsecError {
  if (e instanceof DsecError) return e;
  const code = (e as NodeJS.ErrnoException).code;
  const msg = `extracting tar entry ${JSON.stringify(entryPath)}: ${(e as Error).message ?? String(e)}`;
  if (code === 'ENOSPC' || code === 'EDQUOT') return new DsecError('ResourceExhausted', msg, { cause: e });
  if (code === 'ENAMETOOLONG' || code === 'EILSEQ') return new DsecError('InvalidArgument', msg, { cause: e });
  return new DsecError('Internal', msg, { cause: e });
}

/** One extraction run: the state that the entry handlers share. */
class Extractor {
  readonly root: string;
  readonly oci: boolean;
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

  constructor(root: string, oci: boolean) {
    this.root = root;
    this.oci = oci;
  }

  abs(rel: string): string {
    return rel === '' ? this.root : `${this.root}/${rel}`;
  }

  /** Records a change made instead of a refusal; `example` is the entry path (none for archive-wide notes). */
  note(what: string, example?: string): void {
    const n = this.notes.get(what);
    if (n) n.count++;
    else this.notes.set(what, { count: 1, example });
  }

  sanitised(): string[] {
    return [...this.notes].map(([what, n]) =>
      n.example === undefined ? what : `${what} (${n.count} ${n.count === 1 ? 'entry' : 'entries'}, e.g. ${JSON.stringify(n.example)})`,
    );
  }

  /** Handles one entry; consumes (or resumes) its body. Errors carry the entry path. */
  async handle(entry: ReadEntry): Promise<void> {
    try {
      await this.handleInner(entry);
    } catch (e) {
      entry.resume();
      throw entryError(e, entry.path);
    }
  }

  private async handleInner(entry: ReadEntry): Promise<void> {
    const raw = entry.path;
    const { rel, strippedSlash } = normaliseEntryPath(raw);
    if (strippedSlash) this.note('stripped leading "/"', raw);
    const parts = rel === '' ? [] : rel.split('/');

    if (this.oci && parts.length > 0) {
      for (let i = 0; i < parts.length - 1; i++) {
        if (parts[i].startsWith('.wh..wh.')) {
          this.note('skipped AUFS metadata below .wh..wh.*', raw);
          entry.resume();
          return;
        }
        if (parts[i].startsWith(WHITEOUT_PREFIX)) {
          throw new DsecError('InvalidArgument', `tar entry ${JSON.stringify(raw)}: a whiteout name (${parts[i]}) used as a directory`);
        }
      }
      if (parts[parts.length - 1].startsWith(WHITEOUT_PREFIX)) {
        entry.resume();
        await this.whiteout(raw, parts, validDate(entry.mtime));
        return;
      }
    }

    switch (entry.type) {
      case 'File':
      case 'OldFile':
      case 'ContiguousFile':
        return this.file(entry, raw, rel);
      case 'Directory':
      case 'GNUDumpDir':
        entry.resume();
        return this.directory(entry, rel);
      case 'SymbolicLink':
        entry.resume();
        return this.symlink(entry, raw, rel);
      case 'Link':
        entry.resume();
        return this.hardlink(entry, raw, rel);
      case 'FIFO':
        entry.resume();
        return this.fifo(entry, raw, rel);
      case 'CharacterDevice':
      case 'BlockDevice': {
        entry.resume();
        if (rel === 'dev' || rel.startsWith('dev/')) {
          this.note('dropped device node below /dev (runc mounts its own /dev there)', raw);
          return;
        }
        const kind = entry.type === 'CharacterDevice' ? 'character' : 'block';
        throw new DsecError(
          'InvalidArgument',
          `tar entry ${JSON.stringify(raw)} is a ${kind} device ${entry.header.devmaj ?? '?'}:${entry.header.devmin ?? '?'}: device nodes are refused in layers (only below /dev are they dropped)`,
        );
      }
      default:
        throw new DsecError('InvalidArgument', `tar entry ${JSON.stringify(raw)} has unsupported type ${String(entry.type)}`);
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

  private async file(entry: ReadEntry, raw: string, rel: string): Promise<void> {
    this.refuseRoot(raw, rel);
    const m = entryMeta(entry, 0o644);
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
      // Body: pause while each chunk is written (backpressure reaches the tar parser).
      await new Promise<void>((res, rej) => {
        let writes = Promise.resolve();
        entry.on('data', (chunk: Buffer) => {
          entry.pause();
          writes = writes.then(async () => {
            await fh.write(chunk);
            this.bytes += chunk.length;
            entry.resume();
          });
          writes.catch(rej);
        });
        entry.on('end', () => writes.then(res, rej));
        entry.on('error', rej);
        entry.resume();
      });
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

  private async directory(entry: ReadEntry, rel: string): Promise<void> {
    const m = entryMeta(entry, 0o755);
    if (rel !== '') {
      await this.ensureDirChain(this.parentOf(rel), entry.path);
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

  private async symlink(entry: ReadEntry, raw: string, rel: string): Promise<void> {
    this.refuseRoot(raw, rel);
    const m = entryMeta(entry, 0o777);
    await this.ensureDirChain(this.parentOf(rel), raw);
    try {
      await symlink(entry.linkpath ?? '', this.abs(rel));
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      await this.prepareLeaf(rel, false);
      await symlink(entry.linkpath ?? '', this.abs(rel));
    }
    if (this.asRoot) await lchown(this.abs(rel), m.uid, m.gid);
    await lutimes(this.abs(rel), m.mtime, m.mtime);
    this.extracted.add(rel);
  }

  private async hardlink(entry: ReadEntry, raw: string, rel: string): Promise<void> {
    this.refuseRoot(raw, rel);
    const linkpath = entry.linkpath ?? '';
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

  private async fifo(entry: ReadEntry, raw: string, rel: string): Promise<void> {
    this.refuseRoot(raw, rel);
    const m = entryMeta(entry, 0o644);
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
      if (st?.isDirectory()) opaque.push(this.abs(rel));
      else this.note('dropped opaque marker of a directory that a later entry replaced', rel);
    }
    await setOpaque(opaque);
    this.opaqueDirs = opaque.length;

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

/** The input as a stream of Buffers, plus a way to stop it early. */
function openInput(input: string | NodeJS.ReadableStream): { chunks: AsyncIterable<Buffer>; close(): void } {
  if (typeof input === 'string') {
    const rs: ReadStream = createReadStream(input, { highWaterMark: 1 << 20 });
    const chunks = (async function* () {
      try {
        for await (const c of rs) yield c as Buffer;
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        if (code === 'ENOENT') throw new DsecError('NotFound', `tar ${input} not found`, { cause: e });
        if (code === 'EISDIR') throw new DsecError('InvalidArgument', `tar ${input} is a directory`, { cause: e });
        throw e;
      }
    })();
    return { chunks, close: () => rs.destroy() };
  }
  const chunks = (async function* () {
    for await (const c of input as AsyncIterable<Buffer | string>) yield Buffer.isBuffer(c) ? c : Buffer.from(c);
  })();
  return { chunks, close: () => (input as Partial<Readable>).destroy?.() };
}

/**
 * Extracts the tar `input` (a file path or a readable stream; plain, gzip or zstd,
 * detected from the first bytes) into `destDir`, sanitised as described in the module
 * comment and docs/IMAGES.md. `destDir` is created if missing and should be empty
 * (entries merge into what is there). Ownership is applied only when running as root.
 *
 * Returns an {@link ExtractReport} (counts, what was sanitised, input and diff digests).
 * Throws DsecError: InvalidArgument for a refused or corrupt archive (`..`, writing
 * through a symlink, a hard link to outside the archive, a device node outside /dev,
 * a truncated or non-tar stream, xz/bzip2 input, a zstd error); NotFound when `input`
 * names no file; FailedPrecondition when `zstd` or `setfattr` is not installed;
 * ResourceExhausted for ENOSPC/EDQUOT; Internal for other I/O failures. On failure
 * `destDir` is left partially filled: the caller removes it.
 */
export async function extractLayerTar(input: string | NodeJS.ReadableStream, destDir: string, opts: ExtractOptions): Promise<ExtractReport> {
  const root = resolve(destDir);
  await mkdir(root, { recursive: true });
  const rst = await lstat(root);
  if (!rst.isDirectory()) throw new DsecError('InvalidArgument', `extraction target ${root} is not a directory`);

  const x = new Extractor(root, opts.ociWhiteouts);
  const src = openInput(input);
  const inHash = createHash('sha256');
  const tarHash = createHash('sha256');
  let inBytes = 0;
  let tarBytes = 0;
  let lastProgress = 0;
  let allZero = true;
  const it = src.chunks[Symbol.asyncIterator]();
  let zstd: ResultPromise | undefined;
  let zstdStderr = '';
  const cleanups: (() => void)[] = [() => src.close()];

  let failure: unknown;
  let rejectFailed!: (e: unknown) => void;
  const failed = new Promise<never>((_, rej) => (rejectFailed = rej));
  failed.catch(() => undefined);
  const fail = (e: unknown): void => {
    if (failure !== undefined) return;
    failure = e;
    rejectFailed(e);
  };

  try {
    // Input bytes, hashed and counted as they are read; the first ones decide compression.
    const tapped = async function* (first: Buffer[]): AsyncGenerator<Buffer> {
      for (const c of first) yield c;
      for (;;) {
        const r = await it.next();
        if (r.done) return;
        inHash.update(r.value);
        inBytes += r.value.length;
        if (opts.onProgress && inBytes - lastProgress >= PROGRESS_STEP) {
          lastProgress = inBytes;
          opts.onProgress(inBytes);
        }
        yield r.value;
      }
    };
    const head: Buffer[] = [];
    let headLen = 0;
    while (headLen < 6) {
      const r = await it.next();
      if (r.done) break;
      inHash.update(r.value);
      inBytes += r.value.length;
      head.push(r.value);
      headLen += r.value.length;
    }
    if (headLen === 0) throw new DsecError('InvalidArgument', 'the tar is empty (0 bytes)');
    const compression = detectCompression(Buffer.concat(head));

    let tarChunks: AsyncIterable<Buffer>;
    if (compression === 'gzip') {
      const gz = createGunzip();
      const from = Readable.from(tapped(head));
      pipeline(from, gz, () => undefined); // errors surface through gz's iterator
      cleanups.push(() => from.destroy(), () => gz.destroy());
      tarChunks = gz;
    } else if (compression === 'zstd') {
      const child = execa('zstd', ['-d', '-c', '-q'], { stdin: 'pipe', stdout: 'pipe', stderr: 'pipe', buffer: false, reject: false });
      zstd = child;
      child.stderr?.on('data', (c: Buffer) => (zstdStderr += c.toString()).length > 4096 && (zstdStderr = zstdStderr.slice(-4096)));
      const from = Readable.from(tapped(head));
      let inputError: unknown;
      pipeline(from, child.stdin!, (err) => {
        if (err && (err as NodeJS.ErrnoException).code !== 'EPIPE') inputError = err;
      });
      cleanups.push(() => from.destroy(), () => child.kill());
      tarChunks = (async function* () {
        let streamError: unknown;
        try {
          yield* child.stdout! as AsyncIterable<Buffer>;
        } catch (e) {
          streamError = e; // the exit status below says more
        }
        const r = await child;
        if ((r as { code?: string }).code === 'ENOENT') {
          throw new DsecError('FailedPrecondition', 'zstd not found: install the Debian package "zstd" to import zstd-compressed layers');
        }
        if (inputError) throw inputError;
        if (r.failed) throw new DsecError('InvalidArgument', `zstd could not decompress the tar: ${zstdStderr.trim() || r.message}`);
        if (streamError) throw streamError;
      })();
    } else {
      tarChunks = tapped(head);
    }

    const parser = new Parser({ strict: false, brotli: false, zstd: false });
    let chain = Promise.resolve();
    parser.on('entry', (entry: ReadEntry) => {
      x.entries++;
      chain = chain.then(() => (failure === undefined ? x.handle(entry) : void entry.resume())).catch(fail);
    });
    parser.on('ignoredEntry', (entry: ReadEntry) => {
      fail(new DsecError('InvalidArgument', `tar entry ${JSON.stringify(entry.path)} has unsupported type ${String(entry.type)} (or an oversized header)`));
    });
    parser.on('warn', (code: string, message: string) => {
      // An archive of end-of-archive blocks only is a valid empty layer (e.g. `RUN true`).
      if (code === 'TAR_BAD_ARCHIVE' && x.entries === 0 && allZero && tarBytes >= 1024 && /Unrecognized/.test(message)) return;
      fail(new DsecError('InvalidArgument', `not a valid tar: ${message} (${code})`));
    });
    parser.on('error', (e: Error) => fail(new DsecError('InvalidArgument', `not a valid tar: ${e.message}`, { cause: e })));
    const ended = new Promise<void>((res) => parser.on('end', () => res()));

    for await (const chunk of tarChunks) {
      if (failure !== undefined) break;
      tarHash.update(chunk);
      tarBytes += chunk.length;
      if (allZero && chunk.some((b) => b !== 0)) allZero = false;
      if (!parser.write(chunk)) await Promise.race([once(parser, 'drain'), failed]);
    }
    if (failure !== undefined) throw failure;
    parser.end();
    await Promise.race([ended, failed]);
    await chain;
    if (failure !== undefined) throw failure;
    await x.finish();
    if (opts.onProgress && lastProgress !== inBytes) opts.onProgress(inBytes);
    return {
      entries: x.entries,
      bytes: x.bytes,
      whiteouts: x.whiteouts,
      opaqueDirs: x.opaqueDirs,
      sanitised: x.sanitised(),
      compression,
      inputDigest: `sha256:${inHash.digest('hex')}`,
      inputBytes: inBytes,
      diffId: `sha256:${tarHash.digest('hex')}`,
    };
  } catch (e) {
    // The entry chain may hold the first, more precise error.
    const err = failure ?? e;
    if (err instanceof DsecError) throw err;
    if ((err as { code?: string }).code === 'Z_DATA_ERROR' || (err as { code?: string }).code === 'Z_BUF_ERROR') {
      throw new DsecError('InvalidArgument', `gzip could not decompress the tar: ${(err as Error).message}`, { cause: err });
    }
    throw entryError(err, '(archive)');
  } finally {
    for (const c of cleanups) c();
    await x.drainQuietly(); // every fd closed before returning, success or not
    if (zstd) await zstd.catch(() => undefined);
  }
}
