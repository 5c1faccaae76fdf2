/**
 * Files of a running sandbox, through its agent, as a user inside the sandbox:
 * single files (raw bytes), stat, list, mkdir, remove, and tar archives in both
 * directions. Everything streams: a file's bytes flow agent -> HTTP response (or HTTP
 * request -> agent) with backpressure on both sides, so a multi-GB file never sits in
 * daemon memory.
 *
 * Single-file transfers account what they hold in dsecd's buffers into the metrics'
 * TransferMeter; the bound and where it comes from are in daemon/api/transfer.ts.
 *
 * Paths are absolute paths inside the sandbox. The agent refuses `..` components and
 * magic links (/proc/PID/root and the like); its root is the sandbox root, so no path
 * or symlink leads out of the sandbox. Tar archives given to PUT .../archive are
 * sanitised the same way before any entry is written: absolute names are made relative,
 * `..` and links that point outside the target are refused, devices are refused.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { drainOnFailure } from '../drain.js';
import path from 'node:path';
import { PassThrough, Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import tarStream from 'tar-stream';
import { z } from 'zod';
import { parseWith } from '../parse.js';
import { DsecError, failedPrecondition, invalidArgument } from '../../errors.js';
import { FileWriteFlag, type FileInfo } from '../../agent/protocol.js';
import { AgentFileError } from '../../agent/client.js';
import type { AgentFiles } from '../../drivers/types.js';
import { route } from './table.js';
import { readonlyAdvice, type ReadonlyAdvice } from '../../security/filesystem.js';
import type { Logger } from 'pino';
import type { TransferMeter } from '../transfer.js';
import type { ExecService } from '../../sandbox/exec.js';
import type { SandboxLifecycle } from '../../sandbox/lifecycle.js';
import type { ResolvedFilesystem } from '../../model/filesystem.js';

const user = z.string().regex(/^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$/).optional().describe('User inside the sandbox (name or uid[:gid]); default the image user.');
const absPath = z.string().startsWith('/').max(4096).describe('Absolute path inside the sandbox.');
const bool = z.enum(['true', 'false', '1', '0']).optional();

/** GET/DELETE .../files and GET .../files/stat|list and GET .../archive query. */
export const FileQuery = z.object({ path: absPath, user, nofollow: bool, recursive: bool }).strict();
/** GET .../archive query: FileQuery plus `follow`. */
export const ArchiveQuery = FileQuery.extend({ follow: bool.describe('When path itself is a symlink, archive what it points to (under the link\'s name); default: the symlink.') }).strict();
/** PUT .../files query. */
export const PutFileQuery = z.object({ path: absPath, user, mode: z.string().regex(/^0?[0-7]{3,4}$/).optional().describe('Octal mode, default 0644.'), parents: bool }).strict();
/** POST .../files/mkdir body. */
export const MkdirRequest = z.object({ path: absPath, user, mode: z.number().int().min(0).max(0o7777).optional(), parents: z.boolean().optional() }).strict();
/** A file's metadata. */
export const FileStat = z.object({
  path: z.string(),
  type: z.enum(['file', 'dir', 'symlink', 'other']),
  size: z.number().int().describe('Bytes.'),
  mode: z.number().int().describe('Permission bits.'),
  uid: z.number().int(),
  gid: z.number().int(),
  mtime_ms: z.number().describe('ms since the Unix epoch.'),
  target: z.string().optional().describe('Symlink target.'),
});

const B = '/v1/sandboxes/:id';
const getRoute = route({ method: 'GET', url: `${B}/files`, summary: 'Read a file (raw bytes, streamed in chunks to its end as read: no Content-Length, since the sandbox may grow the file while it is read and a /proc file stats as 0 bytes; X-Dsec-Mode gives its mode bits in octal).', query: FileQuery, status: 200, response: null, errors: ['InvalidArgument', 'NotFound', 'FailedPrecondition'] });
const putRoute = route({ method: 'PUT', url: `${B}/files`, summary: 'Write a file from the raw request body (streamed; replaced atomically).', query: PutFileQuery, status: 201, response: z.object({ path: z.string(), bytes: z.number().int() }), errors: ['InvalidArgument', 'NotFound', 'FailedPrecondition', 'ResourceExhausted'] });
const statRoute = route({ method: 'GET', url: `${B}/files/stat`, summary: 'Stat a path.', query: FileQuery, status: 200, response: FileStat, errors: ['InvalidArgument', 'NotFound'] });
const listRoute = route({ method: 'GET', url: `${B}/files/list`, summary: 'List a directory.', query: FileQuery, status: 200, response: z.object({ entries: z.array(FileStat.extend({ name: z.string() })) }), errors: ['InvalidArgument', 'NotFound', 'FailedPrecondition'] });
const mkdirRoute = route({ method: 'POST', url: `${B}/files/mkdir`, summary: 'Create a directory.', body: MkdirRequest, status: 201, response: FileStat, errors: ['InvalidArgument', 'AlreadyExists', 'FailedPrecondition'] });
const rmRoute = route({ method: 'DELETE', url: `${B}/files`, summary: 'Remove a file or (recursive=true) a directory tree.', query: FileQuery, status: 204, response: null, errors: ['InvalidArgument', 'NotFound', 'FailedPrecondition'] });
const getArchiveRoute = route({ method: 'GET', url: `${B}/archive`, summary: 'A tar stream of a file or directory (entries named from its basename, like docker cp).', query: ArchiveQuery, status: 200, response: null, errors: ['InvalidArgument', 'NotFound'] });
const putArchiveRoute = route({ method: 'PUT', url: `${B}/archive`, summary: 'Extract the tar request body into a directory.', query: FileQuery, status: 200, response: z.object({ entries: z.number().int(), bytes: z.number().int() }), errors: ['InvalidArgument', 'NotFound', 'FailedPrecondition'] });

/** API view of a FileInfo. */
function statView(p: string, i: FileInfo): z.infer<typeof FileStat> {
  return { path: p, type: i.type, size: i.size, mode: i.mode, uid: i.uid, gid: i.gid, mtime_ms: Math.round(i.mtimeMs), ...(i.target !== undefined ? { target: i.target } : {}) };
}

const truthy = (v?: string) => v === 'true' || v === '1';

/**
 * Normalises a tar entry name for extraction below the target directory.
 * @returns the relative path, or null for the archive's root entry (`./`).
 * @throws DsecError InvalidArgument for `..` components (the archive is refused).
 */
export function safeEntryName(name: string): string | null {
  const parts = name.split('/').filter((x) => x !== '' && x !== '.');
  if (parts.some((x) => x === '..')) throw invalidArgument(`archive entry ${JSON.stringify(name)} has a ".." component; refusing the archive`);
  return parts.length ? parts.join('/') : null;
}

/**
 * Exactly `size` bytes for a tar entry whose header said `size`, from `src` (a file's
 * bytes as read): a tar entry's body must be as long as its header says, or the bytes
 * after it are read as the next headers. The file is the sandbox's and may change while
 * it is read (it grows as it is copied; a /proc file stats as 0 bytes and reads as
 * more, a sysfs file as 4096 and reads as less), so, as GNU tar does, what comes past
 * `size` is left unread (the source is destroyed, cancelling the read) and a short file
 * is padded with zero bytes. `onChange` is told which happened.
 */
export async function* exactly(src: AsyncIterable<Buffer>, size: number, onChange: (how: 'longer' | 'shorter') => void): AsyncGenerator<Buffer> {
  let left = size;
  for await (const chunk of src) {
    if (chunk.length > left) {
      if (left > 0) yield chunk.subarray(0, left);
      onChange('longer');
      // Returning ends the for-await, which destroys `src`: nothing past `size` is read.
      return;
    }
    left -= chunk.length;
    if (chunk.length > 0) yield chunk;
  }
  if (left > 0) onChange('shorter');
  while (left > 0) {
    const n = Math.min(left, 64 * 1024);
    left -= n;
    yield Buffer.alloc(n);
  }
}

/**
 * Reason (`error.reason`) of an archive entry that failed because it goes through a
 * symlink the same archive made: the message names the entry, the symlink, its target
 * and where that leads ({@link throughArchiveLink}), not the place the write ended up in.
 */
export const ARCHIVE_LINK_REASON = 'archive_link';

/**
 * Where `target`, the text of a symlink at the absolute sandbox path `at`, leads when
 * read on its own (lexically: the sandbox's other symlinks are not followed): the
 * absolute path, and whether a relative target's `..` climb above `/` (the sandbox then
 * resolves it to `/`).
 */
export function linkLeads(at: string, target: string): { to: string; aboveRoot: boolean } {
  const stack = target.startsWith('/') ? [] : path.posix.dirname(at).split('/').filter(Boolean);
  let aboveRoot = false;
  for (const c of target.split('/')) {
    if (c === '' || c === '.') continue;
    if (c !== '..') stack.push(c);
    else if (stack.length) stack.pop();
    else aboveRoot = true;
  }
  return { to: '/' + stack.join('/'), aboveRoot };
}

/**
 * The error of archive entry `name` (extracted into `dest`) that failed with `cause`
 * while going through `link` (relative to `dest`, -> `target`), a symlink the same
 * archive made that leads out of `dest`: FailedPrecondition, reason
 * {@link ARCHIVE_LINK_REASON}, naming what was refused and why rather than only where
 * the write landed (an EROFS at `/` would otherwise read as "the top level is
 * read-only"). Null when the link leads below `dest`: then the link is not why.
 */
export function throughArchiveLink(name: string, dest: string, link: string, target: string, cause: unknown): DsecError | null {
  const at = path.posix.join(dest, link);
  const { to, aboveRoot } = linkLeads(at, target);
  const d = dest === '/' ? '' : dest.replace(/\/+$/, '');
  if (!aboveRoot && (to === d || to.startsWith(d + '/'))) return null;
  const leads = aboveRoot ? "which leaves the sandbox's root (its \"..\" climb above /, so the sandbox resolves it to /)" : `which leads out of ${dest} to ${to}`;
  const why = cause instanceof Error ? cause.message : String(cause);
  return new DsecError('FailedPrecondition',
    `archive entry ${JSON.stringify(name)} was refused: it goes through ${at}, a symlink this archive made (-> ${target}), ${leads}; writing there failed: ${why}`,
    { cause, reason: ARCHIVE_LINK_REASON });
}

/** Reason (`error.reason`) of a file operation refused because its path is read-only in the sandbox: the CLI's hint names the way out. */
export const READONLY_PATH_REASON = 'readonly_path';

/** errno EROFS, as the agent reports it. */
const EROFS = 30;

/**
 * A file operation that failed with EROFS in a sandbox with read-only paths on
 * (`filesystem`, the sandbox's resolved options; null: unknown) hit its read-only root or
 * a read-only path (docs/SECURITY.md "Filesystem"): the same error, FailedPrecondition,
 * with reason {@link READONLY_PATH_REASON} and a message that says why the path is
 * read-only and which option makes it writable ({@link readonlyAdvice}, from the path
 * the agent names, `<op> <path>: Read-only file system`). With read-only paths off
 * (`readonly_paths: []`), in a writable path, and for anything else, `e` is returned
 * unchanged: the options are not why.
 */
export function readonlyPathError(e: unknown, sandboxId: string, filesystem: Pick<ResolvedFilesystem, 'readonly_paths' | 'writable_paths'> | null): unknown {
  if (!(e instanceof AgentFileError) || e.errno !== EROFS) return e;
  const m = /^(\S+) (\/.*): Read-only file system/s.exec(e.message);
  const generic: ReadonlyAdvice = {
    why: 'its root and readonly_paths are read-only, and no new top-level entry can be made',
    advice: 'create the sandbox with a directory to keep writable in filesystem.writable_paths (`dsec create --writable DIR`; dsecd creates a missing directory)',
  };
  let a: ReadonlyAdvice | null = generic;
  if (filesystem) {
    if (filesystem.readonly_paths.length === 0) return e;
    if (m) a = readonlyAdvice(m[2], m[1] === 'mkdir' ? 'dir' : 'file', filesystem);
    if (!a) return e;
  }
  return new DsecError('FailedPrecondition', `${e.message}: ${m ? m[2] : 'the path'} is read-only in sandbox ${sandboxId} (${a.why}); to write there, ${a.advice}`, { cause: e, reason: READONLY_PATH_REASON });
}

/** What the file routes use. */
export interface FileRouteDeps {
  /** The agent of a running sandbox. */
  exec: Pick<ExecService, 'files'>;
  /** The sandbox (its image's default user) and its filesystem options (the read-only path hint). */
  lifecycle: Pick<SandboxLifecycle, 'get' | 'filesystemOf'>;
  /** What transfers hold in dsecd's buffers. */
  transfers: TransferMeter;
  log: Logger;
}

/** Registers the file routes (in their own scope: request bodies are raw streams here). */
export function registerFileRoutes(app: FastifyInstance, deps: FileRouteDeps): void {
  type R = FastifyRequest<{ Params: { id: string } }>;
  // Bodies of PUT .../files and .../archive are streamed to the agent, never parsed; the
  // JSON body of POST .../files/mkdir is parsed here.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (_req, body, done) => {
    try {
      done(null, (body as string).trim() ? JSON.parse(body as string) : undefined);
    } catch (e) {
      done(invalidArgument(`malformed JSON body: ${(e as Error).message}`), undefined);
    }
  });
  app.addContentTypeParser('*', (_req, payload, done) => done(null, payload));
  // Rethrown to the API's error handler, with the read-only path hint where it applies.
  app.setErrorHandler((e, req) => {
    const id = (req.params as { id?: string }).id ?? '?';
    let fs: Pick<ResolvedFilesystem, 'readonly_paths' | 'writable_paths'> | null = null;
    try {
      fs = deps.lifecycle.filesystemOf(id);
    } catch { /* gone meanwhile: the generic advice */ }
    throw readonlyPathError(e, id, fs);
  });

  const agent = (req: R): Promise<AgentFiles> => deps.exec.files(req.params.id);
  const userOf = (req: R, u?: string) => u ?? deps.lifecycle.get(req.params.id).imageConfig.user ?? '0';

  app.get(getRoute.url, async (req, reply) => {
    const r = req as R;
    const q = parseWith(FileQuery, req.query, 'query');
    const a = await agent(r);
    let sample = () => {};
    const f = a.readFile(q.path, { user: userOf(r, q.user), onPush: () => sample() });
    const info = await f.info;
    reply.hijack();
    const res = reply.raw;
    // Held here: the read stream, the response, and the agent frame being received.
    const held = deps.transfers.track(() => f.stream.readableLength + res.writableLength + a.inboundPendingBytes);
    sample = held.sample;
    // No Content-Length: the size at open is not what the read gives when the sandbox
    // grows the file meanwhile (or for a /proc file, 0 in stat), and bytes past a declared
    // length would be read by a keep-alive client as the start of its next response, a
    // response the sandbox wrote. Chunked, the body ends where the read ends, and a read
    // that fails midway destroys the response, which the client sees as cut short.
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'x-dsec-mode': info.mode.toString(8) });
    // Sent now: a read that fails before its first byte (EIO) is then a response cut short
    // for the client, not a connection closed without an answer.
    res.flushHeaders();
    try {
      const piped = pipeline(f.stream, res);
      f.stream.on('data', held.sample); // after the pipe's own listener: the chunk is in the response by now
      await piped;
      await f.done;
    } catch {
      res.destroy();
    } finally {
      held.end();
    }
  });

  app.put(putRoute.url, async (req, reply) => {
    const r = req as R;
    const q = parseWith(PutFileQuery, req.query, 'query');
    const body = (req.body ?? Readable.from([])) as Readable;
    const out = await drainOnFailure(body, async () => {
      const a = await agent(r);
      const flags = FileWriteFlag.CREATE | (truthy(q.parents) ? FileWriteFlag.PARENTS : 0);
      // The agent's writeFile destroys its source on failure; give it a pass-through so
      // the request body itself survives to be drained.
      const pass = new PassThrough();
      // Held here: the request body, the pass-through, and of the agent connection's send
      // queue at most what the agent has not acknowledged yet.
      let unacked = 0;
      const held = deps.transfers.track(() => body.readableLength + pass.readableLength + pass.writableLength + Math.min(unacked, a.outboundQueuedBytes));
      body.pipe(pass);
      body.on('data', held.sample); // after the pipe's own listener: the chunk is in the pass-through by now
      try {
        return await a.writeFile(q.path, pass, {
          user: userOf(r, q.user), mode: q.mode ? parseInt(q.mode, 8) : 0o644, flags,
          onProgress: (n) => {
            unacked = n;
            held.sample();
          },
        });
      } catch (e) {
        body.unpipe(pass);
        throw e;
      } finally {
        body.off('data', held.sample);
        held.end();
      }
    });
    return reply.code(201).send({ path: q.path, bytes: out.bytes });
  });

  app.get(statRoute.url, async (req) => {
    const r = req as R;
    const q = parseWith(FileQuery, req.query, 'query');
    return statView(q.path, await (await agent(r)).stat(q.path, { user: userOf(r, q.user), nofollow: truthy(q.nofollow) }));
  });

  app.get(listRoute.url, async (req) => {
    const r = req as R;
    const q = parseWith(FileQuery, req.query, 'query');
    const entries = await (await agent(r)).list(q.path, { user: userOf(r, q.user) });
    return { entries: entries.map((e) => ({ ...statView(path.posix.join(q.path, e.name), e), name: e.name })) };
  });

  app.post(mkdirRoute.url, async (req, reply) => {
    const r = req as R;
    const b = parseWith(MkdirRequest, req.body, 'mkdir request');
    const a = await agent(r);
    await a.mkdir(b.path, { user: userOf(r, b.user), mode: b.mode ?? 0o755, parents: b.parents });
    return reply.code(201).send(statView(b.path, await a.stat(b.path, { user: userOf(r, b.user) })));
  });

  app.delete(rmRoute.url, async (req, reply) => {
    const r = req as R;
    const q = parseWith(FileQuery, req.query, 'query');
    await (await agent(r)).remove(q.path, { user: userOf(r, q.user), recursive: truthy(q.recursive) });
    return reply.code(204).send();
  });

  app.get(getArchiveRoute.url, async (req, reply) => {
    const r = req as R;
    const q = parseWith(ArchiveQuery, req.query, 'query');
    const a = await agent(r);
    const u = userOf(r, q.user);
    const top = await a.stat(q.path, { user: u, nofollow: !truthy(q.follow) });
    const pack = tarStream.pack();
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, { 'content-type': 'application/x-tar' });
    const done = pipeline(pack, res).catch(() => undefined);
    const base = path.posix.basename(q.path) || '.';
    const header = (name: string, i: FileInfo) => ({ name, mode: i.mode, uid: i.uid, gid: i.gid, mtime: new Date(i.mtimeMs) });
    // Depth-first walk; each file's bytes are piped into its entry before the next starts
    // (a tar stream is sequential), so memory holds one chunk at a time.
    const add = async (p: string, name: string, i: FileInfo): Promise<void> => {
      if (i.type === 'dir') {
        pack.entry({ ...header(name, i), type: 'directory' });
        for (const e of await a.list(p, { user: u })) await add(path.posix.join(p, e.name), `${name}/${e.name}`, e);
      } else if (i.type === 'symlink') {
        pack.entry({ ...header(name, i), type: 'symlink', linkname: i.target ?? '' });
      } else if (i.type === 'file') {
        const f = a.readFile(p, { user: u });
        const info = await f.info;
        const entry = pack.entry({ ...header(name, info), type: 'file', size: info.size });
        const seen: { changed?: 'longer' | 'shorter' } = {};
        await pipeline(exactly(f.stream, info.size, (how) => { seen.changed = how; }), entry);
        // Cut short, the read was cancelled (its `done` rejects); otherwise it ended on its own.
        if (seen.changed !== 'longer') await f.done;
        if (seen.changed) deps.log.info({ path: p, sizeBytes: info.size, changed: seen.changed }, 'a file changed size while it was archived: its entry holds exactly the size it had when opened');
      }
      // sockets, fifos and devices are skipped: they cannot be copied as bytes.
    };
    try {
      await add(q.path, base, top);
      pack.finalize();
    } catch (e) {
      deps.log.warn({ err: e, path: q.path }, 'archive stream failed');
      pack.destroy(e as Error);
    }
    await done;
  });

  app.put(putArchiveRoute.url, async (req) => {
    const r = req as R;
    const q = parseWith(FileQuery, req.query, 'query');
    const a = await agent(r);
    const u = userOf(r, q.user);
    const dest = await a.stat(q.path, { user: u });
    if (dest.type !== 'dir') throw failedPrecondition(`${q.path} is not a directory; an archive is extracted into a directory`);
    const body = (req.body ?? Readable.from([])) as Readable;
    const extract = tarStream.extract();
    let entries = 0;
    let bytes = 0;
    let failure: Error | null = null;
    // Paths this upload created (not there before it), in order: removed again, last
    // first, when the archive is refused midway, so a refused archive leaves no
    // entries of its own behind (a symlink planted before the bad entry, say). What it
    // overwrote stays overwritten (no copy is kept), and a directory that gained
    // entries from elsewhere in the meantime is left.
    const created: string[] = [];
    /** Symlinks this archive made, relative path -> target: an entry that fails below one is reported as going through it. */
    const links = new Map<string, string>();
    const linkAbove = (rel: string): string | undefined => {
      const ps = rel.split('/');
      for (let i = ps.length - 1; i > 0; i--) {
        const p = ps.slice(0, i).join('/');
        if (links.has(p)) return p;
      }
      return undefined;
    };
    const isNew = (p: string) => a.stat(p, { user: u, nofollow: true }).then(() => false, (e: DsecError) => {
      if (e.kind === 'NotFound') return true;
      throw e;
    });
    extract.on('entry', (h, stream, next) => {
      // When the agent fails mid-file (EDQUOT, ENOSPC), writeFile destroys the body it was
      // reading and the entry's pipe into it errors here ("Writable stream closed"). The
      // failure is writeFile's to report (below); unheard, this error event would end dsecd.
      stream.on('error', () => {});
      const run = async () => {
        const rel = safeEntryName(h.name);
        if (rel === null) {
          stream.resume();
          return;
        }
        const via = linkAbove(rel);
        try {
          await write(rel);
        } catch (e) {
          throw (via !== undefined && throughArchiveLink(h.name, q.path, via, links.get(via)!, e)) || e;
        }
        entries += 1;
      };
      const write = async (rel: string) => {
        const target = path.posix.join(q.path, rel);
        if (!['directory', 'file', 'contiguous-file', 'symlink'].includes(h.type ?? '')) {
          throw invalidArgument(`archive entry ${JSON.stringify(h.name)} is a ${h.type}; only files, directories and symlinks can be extracted`);
        }
        if (await isNew(target)) created.push(target);
        links.delete(rel);
        const mode = (h.mode ?? 0o644) & 0o7777;
        if (h.type === 'directory') {
          await a.mkdir(target, { user: u, mode, parents: true }).catch((e: DsecError) => {
            if (e.kind !== 'AlreadyExists') throw e;
          });
          stream.resume();
        } else if (h.type === 'file' || h.type === 'contiguous-file') {
          const pass = new PassThrough();
          stream.pipe(pass);
          const w = await a.writeFile(target, pass, { user: u, mode, flags: FileWriteFlag.CREATE | FileWriteFlag.PARENTS });
          bytes += w.bytes;
        } else if (h.type === 'symlink') {
          await a.remove(target, { user: u }).catch(() => undefined);
          await a.symlink(target, h.linkname ?? '', { user: u });
          links.set(rel, h.linkname ?? '');
          stream.resume();
        } else {
          throw invalidArgument(`archive entry ${JSON.stringify(h.name)} is a ${h.type}; only files, directories and symlinks can be extracted`);
        }
      };
      run().then(() => next(), (e: Error) => {
        failure = e;
        stream.resume();
        next(e);
      });
    });
    const pass = new PassThrough();
    body.pipe(pass);
    await drainOnFailure(body, async () => {
      try {
        await pipeline(pass, extract);
      } catch (e) {
        body.unpipe(pass);
        for (const p of created.reverse()) await a.remove(p, { user: u }).catch(() => undefined);
        throw failure ?? (e instanceof DsecError ? e : invalidArgument(`not a valid tar stream: ${(e as Error).message}`));
      }
    });
    return { entries, bytes };
  });
}
