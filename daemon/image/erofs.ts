/**
 * Building EROFS layer blobs with `mkfs.erofs` (erofs-utils; 1.5 on Debian 12).
 *
 * A layer is a directory tree packed into one read-only EROFS image, stored by the
 * sha256 of its bytes and later mounted file-backed (see mounts.ts). Builds are
 * reproducible — the same tree (names, contents, modes, owners, xattrs, link structure)
 * gives the same bytes and so the same digest — because:
 *   - `-T0` stamps every inode and the superblock with time 0 (no mtimes, no build time);
 *   - `-U 00000000-…` fixes the filesystem UUID (mkfs.erofs draws a random one otherwise);
 *   - mkfs.erofs 1.5 orders directory entries by name, not by readdir order, and numbers
 *     inodes by layout, not by the host's inode numbers (checked by building trees
 *     created in different orders: same bytes).
 * Data is stored uncompressed by default: blocks are then read on demand straight from the
 * blob (the point of file-backed layers) and no decompression cost is paid per read.
 *
 * Device nodes: a layer must not carry block or character devices (a device node in a
 * rootfs reaches host hardware), except the character device 0:0, which is how overlayfs
 * records a whiteout (a file deleted in an upper layer) and so legitimately appears in
 * imported and committed layers. {@link buildErofs} walks the source tree before mkfs and
 * refuses any other device (see {@link findForbiddenDevice}); callers that made the tree
 * themselves may skip the walk with `skipDeviceCheck`.
 *
 * As the builder identity (daemon/host/builder.ts), mkfs.erofs runs as uid 0 of a user
 * namespace mapped onto a builder slot ({@link mkfsAsBuilder}): it reads its source
 * through an fd (`/proc/self/fd/3/.`) and gets the overlay opaque directories as a list
 * (it cannot read trusted.* xattrs; root finds them with {@link listOpaqueDirs}), through
 * the LD_PRELOAD shim native/builder/mkfs-shim.c. The blob it writes is then checked and
 * taken over by root (LayerStore).
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { lstat, mkdir, readdir, rename, rm, stat } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { execa } from 'execa';
import { closeSync } from 'node:fs';
import { DsecError } from '../errors.js';
import type { BuilderJob } from '../host/builder.js';

/** The fixed filesystem UUID stamped into every blob, so the UUID never varies the digest. */
export const EROFS_FIXED_UUID = '00000000-0000-0000-0000-000000000000';

/** Options for {@link buildErofs}. */
export interface BuildErofsOptions {
  /**
   * Record every file as owned by 0:0 (`--all-root`) instead of the tree's real owners.
   * Used for trees assembled by an unprivileged builder where "root-owned" is intended.
   * Default false: owners are kept, so images imported as root keep their uids.
   */
  allRoot?: boolean;
  /** Compressor (`-z`), e.g. `"lz4"` or `"lz4hc,9"`; default none (uncompressed). */
  compression?: string;
  /** The mkfs.erofs binary; default `mkfs.erofs` on PATH. */
  mkfsPath?: string;
  /**
   * Skip the walk that refuses block and character devices (other than overlay whiteouts,
   * char 0:0) in the source tree. Default false: every tree is checked. Only for trees the
   * caller built itself and knows to hold no devices (e.g. a bootstrapped tree whose /dev
   * was emptied); whiteouts are accepted either way, so a commit does not need it.
   */
  skipDeviceCheck?: boolean;
  /**
   * Keep every file's mtime instead of stamping time 0 (`-T0`): snapshots, where a fork
   * must see the source's times (a `make` in it must decide as the source's would).
   * Default false: reproducible layers.
   */
  keepMtimes?: boolean;
  /**
   * Store files as chunks of this many bytes (`--chunksize`, a power of two ≥ 4096), so
   * holes of sparse files take no space in the blob. Default none (contiguous files).
   */
  chunkBytes?: number;
  /**
   * Directories to record as overlay-opaque (`trusted.overlay.opaque=y`), as paths
   * relative to the source (`''` is the source itself), when mkfs.erofs cannot read that
   * xattr itself (run as the builder). Ignored by {@link buildErofs}, which reads the
   * tree's own xattrs as root.
   */
  opaque?: ReadonlyArray<string | Buffer>;
}

/** A device node found in a layer source tree. */
export interface ForbiddenDevice {
  /** Path relative to the tree root. */
  path: string;
  kind: 'block' | 'character';
  major: number;
  minor: number;
}

/** Linux dev_t → major, minor (glibc's gnu_dev_major/minor encoding). */
function splitDev(rdev: number): { major: number; minor: number } {
  const d = BigInt(rdev);
  const major = Number(((d >> 8n) & 0xfffn) | ((d >> 32n) & ~0xfffn));
  const minor = Number((d & 0xffn) | ((d >> 12n) & ~0xffn));
  return { major, minor };
}

/**
 * The first block or character device below `root` other than an overlay whiteout
 * (character device 0:0), or undefined when there is none. Symlinks are not followed.
 * Cheap: one readdir (with file types) per directory, an lstat only for devices.
 * Rejects with the fs error if the tree cannot be read.
 */
export async function findForbiddenDevice(root: string): Promise<ForbiddenDevice | undefined> {
  const stack = [''];
  while (stack.length > 0) {
    const rel = stack.pop() as string;
    for (const ent of await readdir(rel ? join(root, rel) : root, { withFileTypes: true })) {
      const r = rel ? `${rel}/${ent.name}` : ent.name;
      if (ent.isDirectory()) stack.push(r);
      else if (ent.isBlockDevice() || ent.isCharacterDevice()) {
        const st = await lstat(join(root, r));
        if (!st.isBlockDevice() && !st.isCharacterDevice()) continue; // replaced meanwhile
        if (st.isCharacterDevice() && st.rdev === 0) continue; // overlay whiteout
        return { path: r, kind: st.isBlockDevice() ? 'block' : 'character', ...splitDev(st.rdev) };
      }
    }
  }
  return undefined;
}

/**
 * Refuses a tree holding a block or character device other than an overlay whiteout
 * (see {@link findForbiddenDevice}). Reads directories only, never follows symlinks.
 * @throws DsecError InvalidArgument naming the device's path and major:minor, with a hint.
 */
export async function refuseDevices(srcDir: string): Promise<void> {
  const dev = await findForbiddenDevice(srcDir);
  if (dev) {
    throw new DsecError(
      'InvalidArgument',
      `layer source ${srcDir} contains the ${dev.kind} device ${join(srcDir, dev.path)} (${dev.major}:${dev.minor}): device nodes cannot go into a layer (the only one allowed is an overlay whiteout, a character device 0:0); remove it, e.g. empty dev/, which the runtime mounts anyway`,
    );
  }
}

/** The result of {@link buildErofs}. */
export interface ErofsBlob {
  /** `"sha256:<64 lowercase hex>"` of the blob's bytes. */
  digest: string;
  /** Size of the blob file in bytes. */
  sizeBytes: number;
}

/**
 * Streams `file` through sha256 and returns `"sha256:<hex>"`.
 * Rejects with the fs error (e.g. ENOENT) if the file cannot be read.
 */
export async function sha256File(file: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(file, { highWaterMark: 1 << 20 })) hash.update(chunk as Buffer);
  return `sha256:${hash.digest('hex')}`;
}

/**
 * Packs the directory tree `srcDir` into a reproducible EROFS image at `outFile`.
 *
 * The image is written to a temporary file beside `outFile` (same directory, so the final
 * rename is atomic) and renamed into place only once complete and hashed: a reader never
 * sees a partial blob at `outFile`, and a crash leaves only a `.tmp-*` file behind.
 * The parent directory of `outFile` is created if needed. An existing `outFile` is replaced.
 *
 * Returns the blob's digest and size. Throws an InvalidArgument DsecError when `srcDir`
 * is not a directory or (unless `opts.skipDeviceCheck`) holds a block or character device
 * other than an overlay whiteout (char 0:0) — the message names its path —, and an
 * Internal DsecError (with mkfs.erofs's stderr) when mkfs fails.
 */
export async function buildErofs(srcDir: string, outFile: string, opts: BuildErofsOptions = {}): Promise<ErofsBlob> {
  const st = await stat(srcDir).catch(() => undefined);
  if (!st?.isDirectory()) throw new DsecError('InvalidArgument', `layer source ${srcDir} is not a directory`);
  if (!opts.skipDeviceCheck) await refuseDevices(srcDir);

  await mkdir(dirname(outFile), { recursive: true });
  const tmp = join(dirname(outFile), `.tmp-${basename(outFile)}-${process.pid}-${Math.random().toString(36).slice(2)}`);
  const args = [...mkfsOptions(opts), tmp, srcDir];
  try {
    const r = await execa(opts.mkfsPath ?? 'mkfs.erofs', args, { reject: false, stdin: 'ignore' });
    if (r.failed) {
      const why = (r.stderr || r.stdout || r.message || '').toString().trim();
      throw new DsecError('Internal', `mkfs.erofs ${srcDir} failed (exit ${r.exitCode ?? 'none'}): ${why}`, { cause: r });
    }
    const digest = await sha256File(tmp);
    const { size } = await stat(tmp);
    await rename(tmp, outFile);
    return { digest, sizeBytes: size };
  } catch (e) {
    await rm(tmp, { force: true });
    throw e;
  }
}

/** mkfs.erofs options (before the output file and source) for `opts`: reproducible unless `keepMtimes`. */
function mkfsOptions(opts: BuildErofsOptions): string[] {
  const args = ['--quiet', ...(opts.keepMtimes ? [] : ['-T0']), `-U${EROFS_FIXED_UUID}`];
  if (opts.chunkBytes) args.push(`--chunksize=${opts.chunkBytes}`);
  if (opts.allRoot) args.push('--all-root');
  if (opts.compression) args.push(`-z${opts.compression}`);
  return args;
}

/** The source mkfs.erofs is given as the builder: the tree's fd, through /proc (see mkfs-shim.c for the trailing `/.`). */
const BUILDER_SOURCE = '/proc/self/fd/3/.';

/**
 * Runs mkfs.erofs as the builder of `job` over the tree open at `srcFd` (a staging dir
 * fd from {@link BuilderJob.openDir}, or a view from {@link BuilderJob.view}) and writes
 * the blob to `outRel` in the job's staging dir. `opts.opaque` lists the opaque
 * directories (see {@link BuildErofsOptions.opaque}). Does not hash or publish: the store
 * takes the file over with {@link BuilderJob.adopt}.
 * @throws DsecError Internal (with mkfs.erofs's stderr) when mkfs fails; as
 *   {@link BuilderJob.run} when the builder cannot run.
 */
export async function mkfsAsBuilder(job: BuilderJob, srcFd: number, outRel: string, opts: BuildErofsOptions = {}): Promise<void> {
  const opaque = opts.opaque ?? [];
  const listFd = opaque.length ? job.dataFd(Buffer.concat(opaque.flatMap((p) => [Buffer.from(p), Buffer.alloc(1)]))) : undefined;
  try {
    const env: Record<string, string> = { LD_PRELOAD: job.builder.tools.mkfsShim, DSEC_MKFS_SOURCE: BUILDER_SOURCE, LC_ALL: 'C' };
    if (listFd !== undefined) env.DSEC_OPAQUE_FD = '4';
    const r = await job.run([opts.mkfsPath ?? 'mkfs.erofs', ...mkfsOptions(opts), outRel, BUILDER_SOURCE], {
      fds: listFd === undefined ? [srcFd] : [srcFd, listFd],
      env,
    });
    if (r.exitCode !== 0) {
      const why = (r.stderr || r.stdout).trim();
      throw new DsecError('Internal', `mkfs.erofs (as the builder, host uid ${job.uid}) failed (exit ${r.exitCode}): ${why}`);
    }
  } finally {
    if (listFd !== undefined) closeSync(listFd);
  }
}

/** Value of `trusted.overlay.opaque` that makes a directory opaque (overlayfs also writes `x`, which does not). */
const OPAQUE_VALUE = 'y';

/**
 * The overlay-opaque directories below `root` (`trusted.overlay.opaque="y"`), as paths
 * relative to `root` in raw bytes (`''` for `root` itself), found by one `getfattr -R -P`
 * run as root: it never follows symlinks and only reads xattrs. Used to tell mkfs.erofs
 * run as the builder which markers a tree has (see {@link BuildErofsOptions.opaque}).
 * @throws DsecError FailedPrecondition when getfattr (Debian package `attr`) is missing,
 *   Internal when the walk fails.
 */
export async function listOpaqueDirs(root: string): Promise<Buffer[]> {
  const r = await execa('getfattr', ['-R', '-P', '--absolute-names', '-d', '-e', 'text', '-m', '^trusted\\.overlay\\.opaque$', '.'], {
    cwd: root, reject: false, stdin: 'ignore', encoding: 'buffer', maxBuffer: 1 << 30,
  });
  if ((r as { code?: string }).code === 'ENOENT') throw new DsecError('FailedPrecondition', 'getfattr not found: install the Debian package "attr" (needed to carry overlay opaque directories into layers)');
  // Exit 1: some entry had no attribute or vanished; the output still lists every match.
  if (r.exitCode !== 0 && r.exitCode !== 1) {
    throw new DsecError('Internal', `listing opaque directories under ${root} failed: ${Buffer.from(r.stderr as Uint8Array).toString().trim() || r.message}`);
  }
  const out: Buffer[] = [];
  let file: Buffer | null = null;
  for (const line of splitLines(Buffer.from(r.stdout as Uint8Array))) {
    if (line.subarray(0, 8).toString('latin1') === '# file: ') file = unescapeOctal(line.subarray(8));
    else if (file && line.toString('latin1') === `trusted.overlay.opaque="${OPAQUE_VALUE}"`) {
      const rel = file.toString('latin1') === '.' ? Buffer.alloc(0) : file.subarray(0, 2).toString('latin1') === './' ? file.subarray(2) : file;
      out.push(rel);
    }
  }
  return out;
}

/** Splits `b` at newlines (a final line without one included). */
export function splitLines(b: Buffer): Buffer[] {
  const lines: Buffer[] = [];
  let start = 0;
  for (let i = 0; i < b.length; i++) {
    if (b[i] !== 0x0a) continue;
    lines.push(b.subarray(start, i));
    start = i + 1;
  }
  if (start < b.length) lines.push(b.subarray(start));
  return lines;
}

/** Undoes getfattr's quoting of file names (`\ooo` for newline, carriage return and backslash), byte for byte. */
export function unescapeOctal(b: Buffer): Buffer {
  const out: number[] = [];
  for (let i = 0; i < b.length; i++) {
    if (b[i] === 0x5c && i + 3 < b.length && /^[0-7]{3}$/.test(b.subarray(i + 1, i + 4).toString('latin1'))) {
      out.push(parseInt(b.subarray(i + 1, i + 4).toString('latin1'), 8));
      i += 3;
    } else out.push(b[i]);
  }
  return Buffer.from(out);
}
