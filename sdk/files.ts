/**
 * Files and archives in a sandbox: read, write and stat one file, and tar archives of a
 * path in or out (`docker cp` semantics). Contents stream both ways with backpressure;
 * nothing is held whole in memory here.
 */
import type { Readable } from 'node:stream';
import { DsecApiError } from './errors.js';
import type { FileStat } from './types.js';
import { query, sandboxPath } from './paths.js';
import { OCTET_STREAM, TAR_TYPE, type TransportClass } from './transport.js';

/** Options shared by the file calls. */
export interface FileOptions {
  /** Act as this user inside the sandbox (name or `uid[:gid]`): permissions are checked and new files owned as that user. */
  user?: string;
  /** Abort the transfer (rejects, or destroys the stream, with the signal's reason). */
  signal?: AbortSignal;
}

/** Options of {@link DsecClient.statFile}. */
export interface StatFileOptions extends FileOptions {
  /** Describe a final symlink itself (lstat) rather than what it points to (the default). */
  nofollow?: boolean;
}

/** Options of {@link DsecClient.getArchive}. */
export interface ArchiveOptions extends FileOptions {
  /** When `path` itself is a symlink, archive what it points to (under the link's name) rather than the link (the default). */
  follow?: boolean;
}

/** Options of {@link DsecClient.writeFile}. */
export interface WriteFileOptions extends FileOptions {
  /** Permission bits of a new file, e.g. `0o644` (sent as octal `0644`); dsecd's default otherwise. */
  mode?: number;
  /** Create missing parent directories. */
  parents?: boolean;
}

/** PUT /v1/sandboxes/{id}/files response. */
export interface WriteFileResult {
  /** The file written. */
  path: string;
  /** Bytes written. */
  bytes: number;
}

/** PUT /v1/sandboxes/{id}/archive response. */
export interface PutArchiveResult {
  /** Archive members extracted. */
  entries: number;
  /** Bytes of file content extracted. */
  bytes: number;
}

/** Mixes the file and archive calls into a {@link Transport} class (composed into DsecClient by sdk/client.ts). */
export function withFileCalls<B extends TransportClass>(Base: B) {
  return class FileCalls extends Base {
    /**
     * GET /v1/sandboxes/{id}/files: the file at `path` (absolute, inside the sandbox) as a
     * Readable of its raw bytes, streamed. Errors: `NotFound`, `FailedPrecondition` (a
     * directory: use {@link getArchive}), `InvalidArgument`.
     */
    readFile(id: string, path: string, opts: FileOptions = {}): Promise<Readable> {
      return this.openStream('GET', sandboxPath(id) + '/files' + query({ path, user: opts.user }), opts.signal);
    }

    /**
     * PUT /v1/sandboxes/{id}/files: writes `data` (bytes, or a Readable streamed with
     * backpressure, never buffered whole) to `path`, replacing it. `parents` creates
     * missing directories; `mode` sets the permission bits. Errors: `NotFound` (parent
     * missing), `FailedPrecondition` (path is a directory), `InvalidArgument`; a failing
     * Readable rejects with its own error.
     */
    async writeFile(id: string, path: string, data: Buffer | Uint8Array | Readable, opts: WriteFileOptions = {}): Promise<WriteFileResult> {
      const qs = query({ path, mode: opts.mode === undefined ? undefined : formatMode(opts.mode), user: opts.user, parents: opts.parents ? 'true' : undefined });
      return this.upload<WriteFileResult>('PUT', sandboxPath(id) + '/files' + qs, data, OCTET_STREAM, opts.signal);
    }

    /**
     * GET /v1/sandboxes/{id}/files/stat: what is at `path`, following a final symlink
     * (with `nofollow`: the symlink itself, `type` `symlink` and its `target`). Errors: `NotFound`.
     */
    statFile(id: string, path: string, opts: StatFileOptions = {}): Promise<FileStat> {
      return this.request<FileStat>('GET', sandboxPath(id) + '/files/stat' + query({ path, user: opts.user, nofollow: opts.nofollow ? 'true' : undefined }), undefined, { signal: opts.signal });
    }

    /**
     * GET /v1/sandboxes/{id}/archive: a tar stream of `path` (a file or a whole directory
     * tree), members named relative to its parent (`docker cp` semantics: the archive of
     * `/a/b` holds `b/...`). A symlink at `path` is archived as a symlink, or with `follow`
     * as what it points to. Streamed, never buffered. Errors: `NotFound`.
     */
    getArchive(id: string, path: string, opts: ArchiveOptions = {}): Promise<Readable> {
      return this.openStream('GET', sandboxPath(id) + '/archive' + query({ path, user: opts.user, follow: opts.follow ? 'true' : undefined }), opts.signal);
    }

    /**
     * PUT /v1/sandboxes/{id}/archive: extracts the tar stream `tar` into the directory
     * `dir` (which must exist), streamed with backpressure. Errors: `NotFound` (dir),
     * `FailedPrecondition` (not a directory), `InvalidArgument` (a malformed archive or an
     * unsafe member); a failing Readable rejects with its own error.
     */
    putArchive(id: string, dir: string, tar: Readable | Buffer, opts: FileOptions = {}): Promise<PutArchiveResult> {
      return this.upload<PutArchiveResult>('PUT', sandboxPath(id) + '/archive' + query({ path: dir, user: opts.user }), tar, TAR_TYPE, opts.signal);
    }
  };
}

/** Permission bits as the files API takes them: octal, 4 digits (`0o644` → `0644`). */
function formatMode(mode: number): string {
  if (!Number.isInteger(mode) || mode < 0 || mode > 0o7777) throw new DsecApiError('InvalidArgument', `mode ${mode} is not a permission mode (0 to 0o7777)`, 0);
  return mode.toString(8).padStart(4, '0');
}
