/**
 * Guessing the format of `dsec image import PATH` (`--format auto`) from the copy of
 * PATH visible to the CLI. dsecd reads PATH on its own host; over a Unix socket that is
 * normally this host, and when it is not, the user passes `--format` and nothing here
 * runs.
 *
 * - A directory is `oci` when it holds `oci-layout` (an OCI image layout) or
 *   `manifest.json` (an unpacked docker save archive); any other directory is refused
 *   (building from a tree is `dsec image build`).
 * - A file is read as a tar (gzip-compressed too, and zstd where this Node can inflate
 *   it) just far enough to decide: `oci-layout`, `index.json`, `manifest.json`,
 *   `blobs/sha256/...` or a docker-save `<64 hex>/` entry means `oci`; a root-filesystem
 *   directory (`etc/`, `usr/`, ...) or the end of the archive means `tar`.
 * - Other compressions (xz, bzip2, zstd without inflater) are sent as `tar`: dsecd decides.
 */
import { createReadStream } from 'node:fs';
import { open, stat } from 'node:fs/promises';
import { join } from 'node:path';
import zlib from 'node:zlib';
import { Parser, type ReadEntry } from 'tar';
import { UserError } from './errors.js';

/** Import types `--format` can name, besides `auto`. */
export type ImportFormat = 'tar' | 'oci';

const FORMAT_HINT = 'import takes a root filesystem tar (plain, gzip or zstd), an OCI image layout (directory or tar) or a docker save archive';

/** Top-level names of an OCI layout or a docker/podman save archive. */
const OCI_FILES = new Set(['oci-layout', 'index.json', 'manifest.json']);

/** Top-level directories of a root filesystem: one of these settles `tar` without reading further. */
const ROOTFS_DIRS = new Set(['bin', 'boot', 'dev', 'etc', 'home', 'lib', 'lib32', 'lib64', 'libx32', 'media', 'mnt', 'opt', 'proc', 'root', 'run', 'sbin', 'srv', 'sys', 'tmp', 'usr', 'var']);

/** What one tar member path says about the archive, or undefined when it says nothing. */
export function classifyMember(path: string): ImportFormat | undefined {
  const p = path.replace(/^(\.?\/)+/, '');
  if (p === '') return undefined;
  if (OCI_FILES.has(p)) return 'oci';
  if (p.startsWith('blobs/sha256/')) return 'oci';
  if (/^[0-9a-f]{64}(\/|\.json$)/.test(p)) return 'oci'; // docker save: <layer id>/layer.tar, <config>.json
  if (ROOTFS_DIRS.has(p.split('/')[0])) return 'tar';
  return undefined;
}

/** Compression of a file, from its magic bytes. */
type Magic = 'gzip' | 'zstd' | 'xz' | 'bzip2' | 'none';

function magicOf(head: Buffer): Magic {
  if (head[0] === 0x1f && head[1] === 0x8b) return 'gzip';
  if (head.subarray(0, 4).equals(Buffer.from([0x28, 0xb5, 0x2f, 0xfd]))) return 'zstd';
  if (head.subarray(0, 6).equals(Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]))) return 'xz';
  if (head.subarray(0, 3).toString('latin1') === 'BZh') return 'bzip2';
  return 'none';
}

/**
 * Decides `tar` or `oci` for `path` (absolute). Throws {@link UserError} when PATH does not
 * exist here, is a directory that is not an OCI layout, or is not an archive.
 */
export async function detectImportFormat(path: string): Promise<ImportFormat> {
  let st;
  try {
    st = await stat(path);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') {
      throw new UserError(`${path} does not exist here, so its format cannot be detected`, 'if it exists on the dsecd host, pass --format tar or --format oci');
    }
    throw new UserError(`cannot read ${path} to detect its format: ${(e as Error).message}`, 'pass --format tar or --format oci');
  }
  if (st.isDirectory()) {
    if ((await exists(join(path, 'oci-layout'))) || (await exists(join(path, 'manifest.json')))) return 'oci';
    throw new UserError(
      `${path} is a directory without oci-layout or manifest.json, so neither an OCI image layout nor an unpacked docker save archive`,
      'to build an image from a directory tree use `dsec image build DIR --tag NAME`',
    );
  }
  if (!st.isFile()) throw new UserError(`${path} is neither a file nor a directory`, FORMAT_HINT);

  const head = Buffer.alloc(6);
  let fh;
  try {
    fh = await open(path, 'r');
    await fh.read(head, 0, head.length, 0);
  } catch (e) {
    throw new UserError(`cannot read ${path} to detect its format: ${(e as Error).message}`, 'pass --format tar or --format oci');
  } finally {
    await fh?.close();
  }
  const magic = magicOf(head);
  const canInflate = magic === 'none' || magic === 'gzip' || (magic === 'zstd' && typeof (zlib as { createZstdDecompress?: unknown }).createZstdDecompress === 'function');
  if (!canInflate) return 'tar';
  const found = await scanTar(path);
  if (found === 'unknown') {
    if (magic !== 'none') throw new UserError(`${path} is ${magic}-compressed but does not contain a readable tar archive`, FORMAT_HINT);
    throw new UserError(`${path} is not a tar archive`, FORMAT_HINT);
  }
  return found;
}

async function exists(p: string): Promise<boolean> {
  try {
    await stat(p);
    return true;
  } catch {
    return false;
  }
}

/**
 * Reads the members of the tar at `path` until one settles the format (see
 * {@link classifyMember}); `tar` if none does, `unknown` if it is not a tar at all.
 */
function scanTar(path: string): Promise<ImportFormat | 'unknown'> {
  return new Promise((resolve, reject) => {
    let entries = 0;
    let settled = false;
    const rs = createReadStream(path);
    const finish = (v: ImportFormat | 'unknown') => {
      if (settled) return;
      settled = true;
      rs.destroy();
      resolve(v);
    };
    const parser = new Parser({
      onReadEntry: (entry: ReadEntry) => {
        entries++;
        entry.resume();
        const kind = classifyMember(entry.path);
        if (kind) finish(kind);
      },
      onwarn: (code: string) => {
        if (code === 'TAR_BAD_ARCHIVE' && entries === 0) finish('unknown');
      },
    });
    // A corrupt archive after some members: still most likely a rootfs tar; dsecd will say.
    parser.on('error', () => finish(entries > 0 ? 'tar' : 'unknown'));
    parser.on('end', () => finish(entries > 0 ? 'tar' : 'unknown'));
    rs.on('error', (e) => {
      if (settled) return;
      settled = true;
      reject(new UserError(`cannot read ${path} to detect its format: ${e.message}`, 'pass --format tar or --format oci'));
    });
    rs.pipe(parser);
  });
}
