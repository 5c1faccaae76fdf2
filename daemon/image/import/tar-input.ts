/**
 * The reading side of a layer tar import: the input (a file or a stream), its
 * compression, and its entries. Compression is detected from the first bytes, never from
 * a file name: gzip through node:zlib, zstd through `zstd -dc` (Node 20's zlib has no
 * zstd; Debian package `zstd`). Parsing is done by `tar-stream` (ustar, GNU long names,
 * PAX path/linkpath/size/uid/gid/mtime records, base-256 numbers, v7 headers). node-tar's
 * parser is not used: it refuses a regular-file header with a link name
 * (TAR_ENTRY_INVALID), which podman writes (daemon/image/import/tar-extract.ts).
 */
import { createReadStream, type ReadStream } from 'node:fs';
import { pipeline, Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { execa, type ResultPromise } from 'execa';
import tarStream from 'tar-stream';
import { DsecError } from '../../errors.js';

/** Compression of a tar stream, detected from its first bytes. */
export type TarCompression = 'none' | 'gzip' | 'zstd';

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

/** The input as a stream of Buffers, plus a way to stop it early. */
export function openInput(input: string | NodeJS.ReadableStream): { chunks: AsyncIterable<Buffer>; close(): void } {
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

/** A tar stream decompressed: its chunks, what stops it early, and the zstd process to wait for at the end. */
export interface Decompressed {
  chunks: AsyncIterable<Buffer>;
  /** Stop the decompression wherever it is (run on error and at the end). */
  cleanups: (() => void)[];
  /** The zstd process, when `compression` is zstd: awaited (errors ignored) once extraction ends. */
  child?: ResultPromise;
}

/**
 * The tar stream inside `stored` (the input's bytes as stored), decompressed as
 * `compression` says. gzip and zstd errors surface through the returned chunks: zstd's
 * exit status becomes an InvalidArgument DsecError (its stderr says why), a missing
 * `zstd` a FailedPrecondition one.
 */
export function decompress(compression: TarCompression, stored: AsyncIterable<Buffer>): Decompressed {
  if (compression === 'gzip') {
    const gz = createGunzip();
    const from = Readable.from(stored);
    pipeline(from, gz, () => undefined); // errors surface through gz's iterator
    return { chunks: gz, cleanups: [() => from.destroy(), () => gz.destroy()] };
  }
  if (compression === 'zstd') {
    const child = execa('zstd', ['-d', '-c', '-q'], { stdin: 'pipe', stdout: 'pipe', stderr: 'pipe', buffer: false, reject: false });
    let zstdStderr = '';
    child.stderr?.on('data', (c: Buffer) => (zstdStderr += c.toString()).length > 4096 && (zstdStderr = zstdStderr.slice(-4096)));
    const from = Readable.from(stored);
    let inputError: unknown;
    pipeline(from, child.stdin!, (err) => {
      if (err && (err as NodeJS.ErrnoException).code !== 'EPIPE') inputError = err;
    });
    const chunks = (async function* () {
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
    return { chunks, cleanups: [() => from.destroy(), () => child.kill()], child };
  }
  return { chunks: stored, cleanups: [] };
}

/** Entry types, as tar-stream names them; `null` for a type flag it does not know. */
export type EntryType = 'file' | 'contiguous-file' | 'directory' | 'symlink' | 'link' | 'fifo' | 'character-device' | 'block-device';

/** One tar entry, as the extractor sees it (PAX and GNU long-name records already applied). */
export interface TarEntry {
  /** Entry name as stored (not yet normalised). */
  path: string;
  type: EntryType | null;
  /** Link name as stored; `''` when the header has none. Used for symlinks and hard links only. */
  linkpath: string;
  mode?: number;
  uid?: number;
  gid?: number;
  mtime?: Date;
  devmajor?: number;
  devminor?: number;
  /** Body bytes (regular files; read to the end or resumed by the caller). */
  body: AsyncIterable<Buffer> & { resume(): unknown };
}

/** An entry as tar-stream's extractor yields it: a readable body with its header. */
type StreamEntry = tarStream.Extract extends AsyncIterable<infer S> ? S : never;
/** tar-stream's header; `type` is null for a type flag it does not know, `pax` holds the entry's PAX records. */
type StreamHeader = Omit<tarStream.Header, 'type' | 'pax' | 'linkname'> & {
  type: tarStream.Header['type'] | null;
  linkname: string | null;
  pax?: Record<string, string> | null;
};

/** A decimal PAX number (`uid`, `gid`, `mtime` with fraction), or undefined when absent or malformed. */
function paxNumber(v: string | undefined): number | undefined {
  if (v === undefined || !/^-?\d+(?:\.\d+)?$/.test(v)) return undefined;
  const n = Number(v);
  return Number.isFinite(n) ? n : undefined;
}

/** A tar-stream entry as a {@link TarEntry}: PAX uid/gid/mtime override the ustar fields (tar-stream applies only path, linkpath and size). */
export function toTarEntry(e: StreamEntry): TarEntry {
  const h = e.header as unknown as StreamHeader;
  const pax = h.pax ?? {};
  const mtimeS = paxNumber(pax.mtime);
  return {
    path: h.name ?? '',
    type: (h.type ?? null) as EntryType | null,
    linkpath: h.linkname ?? '',
    mode: h.mode,
    uid: paxNumber(pax.uid) ?? h.uid,
    gid: paxNumber(pax.gid) ?? h.gid,
    mtime: mtimeS !== undefined ? new Date(Math.floor(mtimeS * 1000)) : h.mtime,
    devmajor: h.devmajor,
    devminor: h.devminor,
    body: e as unknown as TarEntry['body'],
  };
}
