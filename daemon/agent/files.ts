/**
 * File operations over an agent connection (docs/AGENT_PROTOCOL.md "Files"): streamed
 * reads and flow-controlled writes of one file, stat, list, mkdir, remove and symlink,
 * each run as the given user inside the sandbox. Failures are {@link AgentFileError}s
 * whose kind follows the errno ({@link fileErrorKind}).
 */
import { Readable } from 'node:stream';
import {
  FileWriteFlag, FrameType, decodeFileEntry, decodeFileError, decodeFileInfo, decodeU64, encodeFileRequest,
  type FileEntry, type FileInfo, type FileRequestFields, type Frame,
} from './protocol.js';
import { DsecError, failedPrecondition, internal, invalidArgument, type ErrorKind } from '../errors.js';
import { streamError, type StreamHost, type StreamSink } from './streams.js';

/** Options shared by the file operations. */
export interface AgentFileOptions {
  /** "uid", "uid:gid", "name" or "name:group" inside the sandbox; default "0" (root). */
  user?: string;
}

/** Options of {@link AgentClient.readFile}. */
export interface AgentReadFileOptions extends AgentFileOptions {
  /** Start at this byte offset (default 0). */
  offset?: number;
  /** Read at most this many bytes (default / 0: to the end). */
  length?: number;
  /** Called after each chunk of the file is queued in the stream (buffer accounting, daemon/api/transfer.ts). */
  onPush?: () => void;
}

/** Options of {@link AgentClient.writeFile}. */
export interface AgentWriteFileOptions extends AgentFileOptions {
  /**
   * Permission bits (≤ 0o7777), applied exactly (no umask). Default: the replaced file's
   * mode, or 0o644 for a new file.
   */
  mode?: number;
  /** {@link FileWriteFlag} bits; default CREATE (create or atomically replace). */
  flags?: number;
  /**
   * Called with the bytes sent but not yet acknowledged, after each FILE_DATA frame sent
   * and each FILE_ACK (buffer accounting, daemon/api/transfer.ts): an upper bound on what
   * of this write waits in the connection's send queue.
   */
  onProgress?: (unacked: number) => void;
}

/** A file being read: see {@link AgentClient.readFile}. */
export interface AgentFileRead {
  /** Resolves with the file's stat once it is open; rejects with the open failure. */
  readonly info: Promise<FileInfo>;
  /** The bytes (chunks ≤ 256 KiB); ends after the last byte, is destroyed on failure. */
  readonly stream: Readable;
  /** Resolves after the last byte was received; rejects on any failure or cancellation. */
  readonly done: Promise<void>;
}

/** Size of FILE_DATA frames the client sends. */
export const FILE_FRAME_BYTES = 256 * 1024;
/** A writeFile keeps at most this many bytes sent but not acknowledged by FILE_ACK. */
export const WRITE_WINDOW_BYTES = 4 * 1024 * 1024;
/** highWaterMark of a readFile stream; above it the socket is paused. */
export const READ_STREAM_HWM = 256 * 1024;

/** Linux errno values the agent reports in FILE_ERROR. */
const ERRNO = {
  EPERM: 1, ENOENT: 2, EIO: 5, ENOMEM: 12, EACCES: 13, EBUSY: 16, EEXIST: 17, EXDEV: 18, ENOTDIR: 20,
  EISDIR: 21, EINVAL: 22, ENFILE: 23, EMFILE: 24, EFBIG: 27, ENOSPC: 28, EROFS: 30, ENAMETOOLONG: 36,
  ENOTEMPTY: 39, ELOOP: 40, EDQUOT: 122, ECANCELED: 125,
} as const;

/**
 * Error kind for a FILE_ERROR errno: ENOENT → NotFound; EEXIST → AlreadyExists;
 * EACCES/EPERM, EISDIR/ENOTDIR, ENOTEMPTY, EBUSY, EROFS → FailedPrecondition;
 * EINVAL/ELOOP/EXDEV/ENAMETOOLONG (relative paths, '..', magic links) → InvalidArgument;
 * ENOSPC/EDQUOT/EFBIG/ENOMEM/EMFILE/ENFILE → ResourceExhausted; anything else → Internal.
 */
export function fileErrorKind(errno: number): ErrorKind {
  switch (errno) {
    case ERRNO.ENOENT: return 'NotFound';
    case ERRNO.EEXIST: return 'AlreadyExists';
    case ERRNO.EACCES: case ERRNO.EPERM: case ERRNO.EISDIR: case ERRNO.ENOTDIR: case ERRNO.ENOTEMPTY:
    case ERRNO.EBUSY: case ERRNO.EROFS: case ERRNO.ECANCELED:
      return 'FailedPrecondition';
    case ERRNO.EINVAL: case ERRNO.ELOOP: case ERRNO.EXDEV: case ERRNO.ENAMETOOLONG: return 'InvalidArgument';
    case ERRNO.ENOSPC: case ERRNO.EDQUOT: case ERRNO.EFBIG: case ERRNO.ENOMEM: case ERRNO.EMFILE: case ERRNO.ENFILE:
      return 'ResourceExhausted';
    default: return 'Internal';
  }
}

/** A file operation the agent refused or that failed (FILE_ERROR). */
export class AgentFileError extends DsecError {
  /** The Linux errno the agent reported (e.g. 2 = ENOENT, 13 = EACCES). */
  readonly errno: number;

  constructor(errno: number, message: string) {
    super(fileErrorKind(errno), message);
    this.errno = errno;
  }
}

function toBuffer(chunk: unknown): Buffer {
  if (Buffer.isBuffer(chunk)) return chunk;
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  if (typeof chunk === 'string') return Buffer.from(chunk, 'utf8');
  throw invalidArgument(`writeFile: source yielded a ${typeof chunk}, expected Buffer, Uint8Array or string`);
}

/**
 * Stream a regular file out of the sandbox.
 *
 * Flow control: the agent stops reading the file while this connection's outbound queue
 * is above 4 MiB. The client cannot pause one stream of a shared socket, so when
 * `stream`'s buffer is above 256 KiB (its highWaterMark: the consumer is slower than the
 * agent) the whole socket is paused until the consumer reads again; every other stream
 * of this connection (exec output, other files, pings) waits meanwhile. Memory stays
 * bounded on both ends; a consumer that waits for another stream of the same
 * connection before reading this one deadlocks, so use a connection of its own for it.
 *
 * Destroying `stream` early cancels the read on the agent; `done` then rejects with
 * the destroy error, or FailedPrecondition "cancelled" when there was none.
 * @throws DsecError(InvalidArgument) synchronously for a malformed request
 * @returns info (on open), the bytes, and completion; failures reject `info` (if not
 *   yet open) and `done`, and destroy `stream`, with an {@link AgentFileError}
 *   (e.g. NotFound, FailedPrecondition for EACCES/EISDIR, InvalidArgument for '..' or a
 *   /proc magic link), DsecError(Unavailable) on connection loss, or
 *   DsecError(Unimplemented) for an agent without files
 */
export function readFile(host: StreamHost, path: string, opts: AgentReadFileOptions = {}): AgentFileRead {
  const payload = encodeFile('readFile', { path, user: opts.user, offset: opts.offset, length: opts.length });
  const stream = host.alloc();
  let resolveInfo!: (i: FileInfo) => void;
  let rejectInfo!: (e: Error) => void;
  let resolveDone!: () => void;
  let rejectDone!: (e: Error) => void;
  const info = new Promise<FileInfo>((res, rej) => { resolveInfo = res; rejectInfo = rej; });
  const done = new Promise<void>((res, rej) => { resolveDone = res; rejectDone = rej; });
  info.catch(() => {});
  done.catch(() => {});
  let finished = false;
  const fail = (err: Error) => {
    if (finished) return;
    finished = true;
    host.unpauseFor(stream);
    rejectInfo(err);
    rejectDone(err);
    if (!readable.destroyed) readable.destroy(err);
  };
  const readable = new Readable({
    highWaterMark: READ_STREAM_HWM,
    read: () => host.unpauseFor(stream),
    destroy: (err, cb) => {
      if (!finished) {
        // The consumer gave up: tell the agent (FILE_DONE on a read = cancel).
        finished = true;
        host.unpauseFor(stream);
        if (host.owns(stream, sink)) {
          host.forget(stream);
          host.send(FrameType.FILE_DONE, stream);
        }
        const e = err ?? failedPrecondition(`read ${path}: cancelled by the reader`);
        rejectInfo(e);
        rejectDone(e);
      }
      cb(err);
    },
  });
  // Failures are reported through `done`; without this, destroying a stream nobody
  // listens to would crash the process with an unhandled 'error' event.
  readable.on('error', () => {});
  const sink = fileSink(host, (f) => {
    switch (f.type) {
      case FrameType.FILE_INFO:
        resolveInfo(decodeFileInfo(f.payload));
        return;
      case FrameType.FILE_DATA:
        if (!finished && !readable.push(f.payload)) host.pauseFor(stream);
        opts.onPush?.();
        return;
      case FrameType.FILE_DONE:
        host.forget(f.stream);
        if (finished) return;
        finished = true;
        host.unpauseFor(stream);
        readable.push(null);
        resolveDone();
        return;
      default:
        return;
    }
  }, fail);
  startFileOp(host, stream, sink, FrameType.FILE_READ, payload);
  return { info, stream: readable, done };
}

/**
 * Write a file inside the sandbox from `source` (a Readable, any async iterable of
 * Buffer/Uint8Array/string, or one Buffer). By default (flags CREATE) the bytes go to a
 * temp file in the same directory that atomically replaces `path` once the source has
 * ended; with APPEND they are appended in place. The agent acknowledges every MiB
 * written (FILE_ACK) and this client keeps at most 4 MiB unacknowledged, so a fast
 * source never floods the socket. If the agent fails first, the source is destroyed.
 * @returns the number of bytes written
 * @throws DsecError(InvalidArgument) for a malformed request; an {@link AgentFileError}
 *   (e.g. FailedPrecondition "Permission denied", AlreadyExists with EXCLUSIVE,
 *   ResourceExhausted for ENOSPC); the source's own error (the write is then aborted
 *   and nothing replaces `path`); DsecError(Unavailable) on connection loss
 */
export async function writeFile(
host: StreamHost,
path: string,
  source: Readable | AsyncIterable<Buffer | Uint8Array | string> | Buffer,
  opts: AgentWriteFileOptions = {},
): Promise<{ bytes: number }> {
  const payload = encodeFile('writeFile', {
    path, user: opts.user, mode: opts.mode, flags: opts.flags ?? FileWriteFlag.CREATE,
  });
  const stream = host.alloc();
  let acked = 0;
  let sent = 0;
  let settled = false;
  let wake: (() => void) | null = null;
  const wakeUp = () => {
    const w = wake;
    wake = null;
    w?.();
  };
  let resolveResult!: (r: { bytes: number }) => void;
  let rejectResult!: (e: Error) => void;
  const result = new Promise<{ bytes: number }>((res, rej) => { resolveResult = res; rejectResult = rej; });
  result.catch(() => {});
  const fail = (err: Error) => {
    if (settled) return;
    settled = true;
    rejectResult(err);
    wakeUp();
    // Stop a source that may be waiting for its producer (the pump below would
    // otherwise only notice at its next chunk).
    if (source instanceof Readable && !source.destroyed) source.destroy();
  };
  const sink = fileSink(host, (f) => {
    switch (f.type) {
      case FrameType.FILE_ACK:
        acked = decodeU64(f.payload, 'FILE_ACK');
        opts.onProgress?.(sent - acked);
        wakeUp();
        return;
      case FrameType.FILE_DONE:
        host.forget(f.stream);
        if (!settled) {
          settled = true;
          resolveResult({ bytes: decodeU64(f.payload, 'FILE_DONE') });
          wakeUp();
        }
        return;
      default:
        return;
    }
  }, fail);
  startFileOp(host, stream, sink, FrameType.FILE_WRITE, payload);
  const iterable: AsyncIterable<unknown> = Buffer.isBuffer(source) ? [source] as unknown as AsyncIterable<unknown> : source;
  // The pump runs on its own: `result` settles on the agent's answer or on connection
  // loss even while the source is stalled.
  const pump = async () => {
    try {
      for await (const chunk of iterable) {
        if (settled) break; // the agent failed (or the connection is gone): stop reading
        const buf = toBuffer(chunk);
        for (let off = 0; off < buf.length && !settled; off += FILE_FRAME_BYTES) {
          while (!settled && sent - acked >= WRITE_WINDOW_BYTES) {
            await new Promise<void>((r) => { wake = r; });
          }
          if (settled) break;
          const part = buf.subarray(off, Math.min(buf.length, off + FILE_FRAME_BYTES));
          host.send(FrameType.FILE_DATA, stream, part);
          sent += part.length;
          opts.onProgress?.(sent - acked);
        }
      }
    } catch (e) {
      if (!settled) {
        // The source failed: abort on the agent (its temp file is removed).
        if (host.owns(stream, sink)) {
          host.forget(stream);
          host.send(FrameType.FILE_ERROR, stream);
        }
        fail(e instanceof Error ? e : new Error(String(e)));
      }
    }
    if (!settled) host.send(FrameType.FILE_DONE, stream);
  };
  void pump();
  return result;
}

/**
 * stat (or lstat, with nofollow) a path inside the sandbox.
 * @returns its info; `target` is set for a symlink (nofollow)
 * @throws an {@link AgentFileError} (NotFound, FailedPrecondition, InvalidArgument, …)
 */
export async function stat(host: StreamHost, path: string, opts: AgentFileOptions & { nofollow?: boolean } = {}): Promise<FileInfo> {
  const payload = encodeFile('stat', { path, user: opts.user, nofollow: opts.nofollow });
  let info: FileInfo | null = null;
  await simpleFileOp(host, FrameType.FILE_STAT, payload, (f) => {
    if (f.type === FrameType.FILE_INFO) info = decodeFileInfo(f.payload);
  });
  if (!info) throw internal(`stat ${path}: the agent sent no FILE_INFO`);
  return info;
}

/**
 * List a directory (entries other than "." and "..", in directory order, not sorted).
 * @returns each entry's lstat info and name; `target` for symlinks
 * @throws an {@link AgentFileError} (NotFound, FailedPrecondition for ENOTDIR/EACCES, …)
 */
export async function list(host: StreamHost, path: string, opts: AgentFileOptions = {}): Promise<FileEntry[]> {
  const payload = encodeFile('list', { path, user: opts.user });
  const entries: FileEntry[] = [];
  await simpleFileOp(host, FrameType.FILE_LIST, payload, (f) => {
    if (f.type === FrameType.FILE_ENTRY) entries.push(decodeFileEntry(f.payload));
  });
  return entries;
}

/**
 * Create a directory (mode default 0o755, exact). With parents, missing parents are
 * created (0o755) and an existing directory is not an error.
 * @throws an {@link AgentFileError} (AlreadyExists, NotFound for a missing parent, …)
 */
export async function mkdir(host: StreamHost, path: string, opts: AgentFileOptions & { mode?: number; parents?: boolean } = {}): Promise<void> {
  const payload = encodeFile('mkdir', {
    path, user: opts.user, mode: opts.mode, flags: opts.parents ? FileWriteFlag.PARENTS : undefined,
  });
  await simpleFileOp(host, FrameType.FILE_MKDIR, payload, () => {});
}

/**
 * Remove a file, symlink or empty directory; with recursive, a directory tree (symlinks
 * are removed, never followed).
 * @throws an {@link AgentFileError} (NotFound, FailedPrecondition for ENOTEMPTY/EACCES, …)
 */
export async function remove(host: StreamHost, path: string, opts: AgentFileOptions & { recursive?: boolean } = {}): Promise<void> {
  const payload = encodeFile('remove', { path, user: opts.user, recursive: opts.recursive });
  await simpleFileOp(host, FrameType.FILE_REMOVE, payload, () => {});
}

/**
 * Create a symlink at `path` pointing to `target` (stored as is, may be relative).
 * @throws an {@link AgentFileError} (AlreadyExists, NotFound for a missing parent, …)
 */
export async function symlink(host: StreamHost, path: string, target: string, opts: AgentFileOptions = {}): Promise<void> {
  const payload = encodeFile('symlink', { path, user: opts.user, target });
  await simpleFileOp(host, FrameType.FILE_SYMLINK, payload, () => {});
}

function encodeFile(op: string, fields: FileRequestFields): Buffer {
  try {
    return encodeFileRequest(fields);
  } catch (e) {
    throw invalidArgument(`${op}: ${(e as Error).message}`, e);
  }
}

/** Register a file stream and send its request, or fail it at once. */
function startFileOp(host: StreamHost, stream: number, sink: StreamSink, type: number, payload: Buffer): void {
  if (host.isClosed()) {
    sink.fail(host.lostError('connection is closed'));
    return;
  }
  try {
    host.requireFeature('files', 'file operations');
  } catch (e) {
    sink.fail(e as Error);
    return;
  }
  host.open(stream, sink);
  host.send(type, stream, payload);
}

/** A file request answered by some frames (passed to onFrame) and FILE_DONE / FILE_ERROR. */
function simpleFileOp(host: StreamHost, type: number, payload: Buffer, onFrame: (f: Frame) => void): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const stream = host.alloc();
    const sink = fileSink(host, (f) => {
      if (f.type === FrameType.FILE_DONE) {
        host.forget(f.stream);
        resolve();
      } else {
        onFrame(f);
      }
    }, reject);
    startFileOp(host, stream, sink, type, payload);
  });
}

/**
 * The sink of a file stream. FILE_ERROR and ERROR end the stream the same way for every
 * operation: it is forgotten and `fail` gets an {@link AgentFileError} or the stream
 * error (see streamError). Every other frame goes to `onFrame`; `fail` also receives
 * connection loss.
 */
function fileSink(host: StreamHost, onFrame: (f: Frame) => void, fail: (err: Error) => void): StreamSink {
  return {
    onFrame: (f) => {
      if (f.type !== FrameType.FILE_ERROR && f.type !== FrameType.ERROR) {
        onFrame(f);
        return;
      }
      host.forget(f.stream);
      if (f.type === FrameType.ERROR) {
        fail(streamError(f.stream, f.payload));
      } else {
        const x = decodeFileError(f.payload);
        fail(new AgentFileError(x.errno, x.message));
      }
    },
    fail,
  };
}
