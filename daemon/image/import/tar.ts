/**
 * Importing one tar stream (a layer, or a whole root filesystem) into a directory that is
 * then packed into an EROFS layer: {@link extractLayerTar}. The tar comes from outside (a
 * user's file, an OCI or docker archive), so extraction is SANITISED; the rules, and why,
 * are in docs/IMAGES.md ("Import and sanitisation") and daemon/image/import/tar-extract.ts,
 * which writes the entries. Reading the input, detecting and undoing its compression and
 * parsing it are in daemon/image/import/tar-input.ts. This module runs the two as a
 * pipeline with backpressure (the parser reads the next header only once an entry is
 * written), hashing the input as stored and the tar as decompressed on the way.
 */
import { createHash } from 'node:crypto';
import { lstat, mkdir } from 'node:fs/promises';
import type { ResultPromise } from 'execa';
import tarStream from 'tar-stream';
import { DsecError } from '../../errors.js';
import { BodyReadError, Extractor, entryError, type ExtractOptions } from './tar-extract.js';
import { decompress, detectCompression, openInput, toTarEntry, type TarCompression } from './tar-input.js';

export { OPAQUE_MARKER, OPAQUE_XATTR, WHITEOUT_PREFIX, normaliseEntryPath, type ExtractOptions } from './tar-extract.js';
export { detectCompression, type TarCompression } from './tar-input.js';

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
  /** Those directories, relative to the extraction root (`''` is the root itself), sorted. */
  opaque: string[];
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

/** Progress granularity: report after every this many input bytes. */
const PROGRESS_STEP = 1 << 20;

/**
 * The DsecError for the first failure of an extraction. `parseError` is what the tar
 * parser reported, if anything: a body read that failed because the parser stopped
 * (truncated archive) is reported as the parser's error, a corrupt archive as
 * InvalidArgument, never Internal.
 */
function archiveError(err: unknown, parseError: unknown): DsecError {
  if (err instanceof BodyReadError) err = parseError ?? err.original;
  if (err instanceof DsecError) return err;
  const code = (err as { code?: string } | undefined)?.code;
  if (code === 'Z_DATA_ERROR' || code === 'Z_BUF_ERROR') {
    return new DsecError('InvalidArgument', `gzip could not decompress the tar: ${(err as Error).message}`, { cause: err });
  }
  if (err !== undefined && err === parseError) {
    return new DsecError('InvalidArgument', `not a valid tar: ${(err as Error).message ?? String(err)}`, { cause: err });
  }
  const e = entryError(err, '(archive)');
  return e instanceof DsecError ? e : new DsecError('InvalidArgument', `not a valid tar: ${e.message}`, { cause: err });
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
 * a 0-byte input, a truncated or non-tar stream, an entry of unknown type, xz/bzip2
 * input, a gzip or zstd error: never Internal for the archive's content); NotFound when `input`
 * names no file; FailedPrecondition when `zstd` or `setfattr` is not installed;
 * ResourceExhausted for ENOSPC/EDQUOT; Internal for other I/O failures. On failure
 * `destDir` is left partially filled: the caller removes it.
 */
export async function extractLayerTar(input: string | NodeJS.ReadableStream, destDir: string, opts: ExtractOptions): Promise<ExtractReport> {
  // Kept relative when given relative: the builder's worker extracts into its working
  // directory, whose absolute path goes through directories it may not search.
  const root = destDir.replace(/\/+$/, '') || '.';
  await mkdir(root, { recursive: true });
  const rst = await lstat(root);
  if (!rst.isDirectory()) throw new DsecError('InvalidArgument', `extraction target ${root} is not a directory`);

  const x = new Extractor(root, opts);
  const src = openInput(input);
  const inHash = createHash('sha256');
  const tarHash = createHash('sha256');
  let inBytes = 0;
  let tarBytes = 0;
  let lastProgress = 0;
  const it = src.chunks[Symbol.asyncIterator]();
  let zstd: ResultPromise | undefined;
  const cleanups: (() => void)[] = [() => src.close()];

  /** The first error, whoever met it (input, decompressor, parser or an entry handler). */
  let failure: unknown;
  const fail = (e: unknown): void => {
    if (failure === undefined) failure = e;
  };
  let parseError: unknown;
  let feeding: Promise<void> | undefined;

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
    if (headLen === 0) throw new DsecError('InvalidArgument', 'the archive has no entries (it is 0 bytes long)');
    const compression = detectCompression(Buffer.concat(head));

    const decompressed = decompress(compression, tapped(head));
    cleanups.push(...decompressed.cleanups);
    zstd = decompressed.child;
    const tarChunks = decompressed.chunks;

    // allowUnknownFormat: also v7 headers (no ustar magic); a bad checksum still refuses.
    const ex = tarStream.extract({ allowUnknownFormat: true } as Parameters<typeof tarStream.extract>[0]);
    ex.on('error', (e: Error) => {
      if ((e as { code?: string })?.code !== 'STREAM_DESTROYED') parseError ??= e;
    });
    const closed = new Promise<void>((res) => ex.once('close', () => res()));
    cleanups.push(() => ex.destroy());

    // Producer: hashes and counts the tar bytes and writes them into the parser, waiting
    // while it is busy. Input or decompression errors are recorded and stop the parser.
    feeding = (async () => {
      try {
        for await (const chunk of tarChunks) {
          if (ex.destroyed || failure !== undefined) return;
          tarHash.update(chunk);
          tarBytes += chunk.length;
          if (!ex.write(chunk)) await Promise.race([new Promise<void>((res) => ex.once('drain', () => res())), closed]);
        }
        if (!ex.destroyed) ex.end(undefined);
      } catch (e) {
        fail(e);
        ex.destroy(e as Error);
      }
    })();

    // Consumer: one entry at a time; the parser reads the next header only when asked.
    try {
      for await (const e of ex) {
        x.entries++;
        const entry = toTarEntry(e);
        await x.handle(entry);
        entry.body.resume(); // skip a body the handler did not read (e.g. a whiteout's)
      }
    } catch (e) {
      fail(e);
      for (const c of cleanups) c(); // stop the producer wherever it waits
    }
    await feeding;
    if (failure !== undefined) throw failure;
    if (tarBytes === 0) throw new DsecError('InvalidArgument', `not a valid tar: the ${compression} stream decompresses to 0 bytes`);
    await x.finish();
    if (opts.onProgress && lastProgress !== inBytes) opts.onProgress(inBytes);
    return {
      entries: x.entries,
      bytes: x.bytes,
      whiteouts: x.whiteouts,
      opaqueDirs: x.opaqueDirs,
      opaque: x.opaqueRel,
      sanitised: x.sanitised(),
      compression,
      inputDigest: `sha256:${inHash.digest('hex')}`,
      inputBytes: inBytes,
      diffId: `sha256:${tarHash.digest('hex')}`,
    };
  } catch (e) {
    throw archiveError(failure ?? e, parseError);
  } finally {
    for (const c of cleanups) c();
    await feeding;
    await x.drainQuietly(); // every fd closed before returning, success or not
    if (zstd) await zstd.catch(() => undefined);
  }
}

