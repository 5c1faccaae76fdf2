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
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdir, rename, rm, stat } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { execa } from 'execa';
import { DsecError } from '../errors.js';

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
 * is not a directory, and an Internal DsecError (with mkfs.erofs's stderr) when mkfs fails.
 */
export async function buildErofs(srcDir: string, outFile: string, opts: BuildErofsOptions = {}): Promise<ErofsBlob> {
  const st = await stat(srcDir).catch(() => undefined);
  if (!st?.isDirectory()) throw new DsecError('InvalidArgument', `layer source ${srcDir} is not a directory`);

  await mkdir(dirname(outFile), { recursive: true });
  const tmp = join(dirname(outFile), `.tmp-${basename(outFile)}-${process.pid}-${Math.random().toString(36).slice(2)}`);
  const args = ['--quiet', '-T0', `-U${EROFS_FIXED_UUID}`];
  if (opts.allRoot) args.push('--all-root');
  if (opts.compression) args.push(`-z${opts.compression}`);
  args.push(tmp, srcDir);
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
