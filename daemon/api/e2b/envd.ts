/**
 * E2B's in-sandbox API ("envd") on dsecd's TCP door: the Connect services
 * (`/process.Process/*`, `/filesystem.Filesystem/*`), `GET`/`POST /files` and
 * `GET /health`, for every sandbox at one address.
 *
 * Which sandbox: the `E2b-Sandbox-Id` header (what the SDKs send with `E2B_SANDBOX_URL`),
 * else the host name `49983-<id>.<domain>` (the SDKs' default form, given wildcard DNS to
 * this door), else the sandbox the access token names (the 2.8 SDKs' `/files` requests
 * carry only the token).
 *
 * Authentication (these requests carry no API key; the door lets them through to here):
 * the sandbox's access token in `X-Access-Token` (tokens.ts), checked in constant time
 * against the sandbox the request names; for `/files`, a pre-signed URL's `signature`
 * instead. Any failure is one 401 answer; a valid token of a sandbox that is gone or not
 * running is 502 (what E2B's proxy answers, which the SDKs read as "sandbox not running").
 * The request then acts for the sandbox's owner tenant.
 *
 * Users: E2B's user (Basic authorization `user:`, or the `username` query of `/files`),
 * else the SDKs' default `user` when the sandbox has that account (front.ts actingUser).
 */
import type { FastifyInstance, FastifyReply, FastifyRequest, HTTPMethods } from 'fastify';
import { drainOnFailure } from '../drain.js';
import path from 'node:path';
import { PassThrough, Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import { createConnectRouter, createContextValues } from '@connectrpc/connect';
import { universalRequestFromNodeRequest, universalResponseToNodeResponse } from '@connectrpc/connect-node';
import { Busboy, type BusboyInstance } from '@fastify/busboy';
import { invalidArgument, isDsecError, unauthenticated, unavailable } from '../../errors.js';
import { AgentFileError } from '../../agent/client.js';
import { BODY_LIMIT_BYTES } from '../reply.js';
import type { Sandbox } from '../wire/sandboxes.js';
import { Process } from './gen/process/process_pb.js';
import { Filesystem } from './gen/filesystem/filesystem_pb.js';
import { ENVD_CONTEXT, type EnvdRequestContext } from './context.js';
import type { E2bFront } from './front.js';
import { processService } from './process.js';
import { filesystemService } from './filesystem.js';
import { SANDBOX_ID_RE } from './tokens.js';
import { sendConnectError, sendE2bError } from './wire.js';

/** envd's port in E2B's host names (`49983-<id>.<domain>`). */
export const ENVD_PORT = 49983;

/** The one answer to every envd authentication failure (it never says whether the sandbox exists). */
export const ENVD_UNAUTHENTICATED = 'unauthorized: send the sandbox\'s access token (envdAccessToken of create or connect) as X-Access-Token';

/** Most files one multipart upload writes: 1,000. */
const MAX_UPLOAD_FILES = 1000;

/** errno of a full disk (ENOSPC) and of a full quota (EDQUOT): answered 507, E2B's NotEnoughSpaceError. */
const NO_SPACE_ERRNOS = new Set([28, 122]);

/** The sandbox a request names by header or host name, or null. */
export function namedSandbox(headers: Record<string, string | string[] | undefined>): { id: string | null; port: number | null } {
  const h = headers['e2b-sandbox-id'];
  if (typeof h === 'string' && h !== '') {
    const port = Number(headers['e2b-sandbox-port'] ?? ENVD_PORT);
    return { id: h, port: Number.isInteger(port) ? port : null };
  }
  const host = typeof headers.host === 'string' ? headers.host : '';
  const m = /^(\d{1,5})-([0-9a-z]+)\./.exec(host);
  if (m) return { id: m[2], port: Number(m[1]) };
  return { id: null, port: null };
}

/** E2B's user of a request: Basic authorization `user:` (envd's scheme), else undefined. */
export function basicUser(auth: string | undefined): string | undefined {
  const m = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(auth ?? '');
  if (!m) return undefined;
  const text = Buffer.from(m[1], 'base64').toString('utf8');
  const user = text.includes(':') ? text.slice(0, text.indexOf(':')) : text;
  return user || undefined;
}

/** Registers the envd routes (see the module comment), in a scope of their own: bodies are raw streams here. */
export function registerEnvdRoutes(app: FastifyInstance, front: E2bFront): void {
  const { host, tokens } = front;
  app.removeAllContentTypeParsers();
  // Bodies are read by the handlers (Connect's, the upload's), never parsed here.
  app.addContentTypeParser('*', (_req, payload, done) => done(null, payload));
  app.setErrorHandler((e, _req, reply) => {
    if (e instanceof AgentFileError && NO_SPACE_ERRNOS.has(e.errno)) return reply.code(507).type('application/json').send({ code: 507, message: e.message });
    return sendE2bError(reply, e);
  });

  /**
   * Authenticates an envd request (see the module comment).
   * @param signed for `/files`: the operation a pre-signed URL may stand for
   * @throws DsecError Unauthenticated (one answer for every failure), Unavailable (gone or not running), InvalidArgument (a port other than envd's)
   */
  const authenticate = async (req: FastifyRequest, signed?: 'read' | 'write'): Promise<EnvdRequestContext> => {
    const named = namedSandbox(req.headers);
    if (named.id !== null && named.port !== ENVD_PORT) {
      throw invalidArgument(`port ${named.port ?? '?'} of sandbox ${named.id}: only envd (${ENVD_PORT}) is served; dsec does not forward other sandbox ports`);
    }
    const expect = named.id !== null && SANDBOX_ID_RE.test(named.id) ? named.id : null;
    const token = req.headers['x-access-token'];
    let id = named.id !== null && expect === null ? null : tokens.verify(typeof token === 'string' ? token : undefined, expect);
    const q = req.query as { signature?: string; signature_expiration?: string; path?: string; username?: string };
    if (id === null && signed && expect !== null && typeof q.signature === 'string' && token === undefined) {
      const exp = q.signature_expiration !== undefined ? Number(q.signature_expiration) : null;
      if (tokens.verifySignature(expect, q.signature, signed, q.path ?? '', q.username ?? '', exp)) id = expect;
    }
    if (id === null) {
      await req.noteAuthFailure?.();
      req.log.info({ remote: req.socket.remoteAddress, url: req.url.split('?')[0] }, 'envd authentication failed');
      throw unauthenticated(ENVD_UNAUTHENTICATED);
    }
    let sandbox: Sandbox;
    try {
      sandbox = await host.get(id);
    } catch (e) {
      if (isDsecError(e, 'NotFound')) throw unavailable(`sandbox ${id} was not found: it was killed or its timeout passed`);
      throw e;
    }
    if (sandbox.state !== 'running') throw unavailable(`sandbox ${id} is ${sandbox.state === 'paused' ? 'paused; connect to it (Sandbox.connect) to resume it' : sandbox.state}`);
    // The request acts for the sandbox's owner (the door set an anonymous principal).
    req.principal = { ...req.principal, tenant: front.ownerOf(sandbox) ?? 'system', role: 'user' };
    return { sandbox, username: basicUser(req.headers.authorization) };
  };

  app.get('/health', { config: { selfAuthenticated: true } }, async (req, reply) => {
    await authenticate(req);
    return reply.code(204).send();
  });

  app.get('/files', { config: { selfAuthenticated: true } }, async (req, reply) => {
    const c = await authenticate(req, 'read');
    const q = req.query as { path?: string; username?: string };
    const who = await front.actingUser(c.sandbox.id, q.username || c.username);
    const p = front.resolvePath(q.path ?? '', who.home);
    const user = who.user ?? '0';
    const files = await host.files(c.sandbox.id);
    const st = await files.stat(p, { user });
    if (st.type === 'dir') throw invalidArgument(`${p} is a directory`);
    const f = files.readFile(p, { user });
    const info = await f.info;
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, {
      'content-type': 'application/octet-stream',
      'content-length': String(info.size),
      'content-disposition': `inline; filename*=UTF-8''${encodeURIComponent(path.posix.basename(p))}`,
    });
    try {
      await pipeline(f.stream, res);
      await f.done;
    } catch {
      res.destroy();
    }
  });

  app.post('/files', { config: { selfAuthenticated: true } }, async (req, reply) => {
    const body = (req.body ?? Readable.from([])) as Readable;
    const written = await drainOnFailure(body, async () => {
      const c = await authenticate(req, 'write');
      const q = req.query as { path?: string; username?: string };
      const who = await front.actingUser(c.sandbox.id, q.username || c.username);
      const user = who.user ?? '0';
      const files = await host.files(c.sandbox.id);
      const write = async (target: string, src: Readable) => {
        const p = front.resolvePath(target, who.home);
        // A pass-through: the agent destroys its source on failure, the request must survive to be drained.
        const pass = new PassThrough();
        src.pipe(pass);
        try {
          await files.writeFile(p, pass, { user, parents: true });
        } catch (e) {
          src.unpipe(pass);
          src.resume();
          throw e;
        }
        return { name: path.posix.basename(p), type: 'file', path: p };
      };
      const ctype = String(req.headers['content-type'] ?? '');
      if (/^multipart\/form-data/i.test(ctype)) return multipart(req, body, q.path, write);
      if (q.path === undefined) throw invalidArgument('path is required for an application/octet-stream upload');
      const enc = String(req.headers['content-encoding'] ?? 'identity').toLowerCase();
      if (enc !== 'identity' && enc !== 'gzip') throw invalidArgument(`content-encoding ${enc}: identity or gzip`);
      return [await write(q.path, enc === 'gzip' ? body.pipe(createGunzip()) : body)];
    });
    return reply.code(200).send(written);
  });

  // Connect: each RPC of the two services as a route of its own, handled by connect-node's
  // universal handler once the request is authenticated (JSON and binary codecs; only the
  // Connect protocol: the SDKs speak nothing else).
  const router = createConnectRouter({ connect: true, grpc: false, grpcWeb: false, readMaxBytes: BODY_LIMIT_BYTES, jsonOptions: { ignoreUnknownFields: true } });
  router.service(Process, processService(front));
  router.service(Filesystem, filesystemService(front));
  for (const h of router.handlers) {
    app.route({
      method: h.allowedMethods as HTTPMethods[],
      url: h.requestPath,
      config: { selfAuthenticated: true },
      handler: async (req: FastifyRequest, reply: FastifyReply) => {
        let c: EnvdRequestContext;
        try {
          c = await authenticate(req);
        } catch (e) {
          return sendConnectError(reply, e);
        }
        reply.hijack();
        try {
          const ures = await h(universalRequestFromNodeRequest(req.raw, reply.raw, undefined, createContextValues().set(ENVD_CONTEXT, c)));
          await universalResponseToNodeResponse(ures, reply.raw);
        } catch (e) {
          req.log.warn({ err: e, url: h.requestPath }, 'envd rpc failed');
          reply.raw.destroy();
        }
      },
    });
  }
}

/**
 * The files of a multipart upload, each written by `write` as it arrives (one at a time:
 * the parser waits for each file to be consumed). A file's target is the `path` query
 * for a single file, else the part's file name (E2B's SDKs send the full path there).
 * @returns what was written, in order
 */
function multipart(req: FastifyRequest, body: Readable, single: string | undefined, write: (target: string, src: Readable) => Promise<{ name: string; type: string; path: string }>): Promise<{ name: string; type: string; path: string }[]> {
  return new Promise((resolve, reject) => {
    let bb: BusboyInstance;
    try {
      bb = new Busboy({ headers: req.headers as { 'content-type': string }, preservePath: true, limits: { files: MAX_UPLOAD_FILES, fields: 100 } });
    } catch (e) {
      reject(invalidArgument(`malformed multipart upload: ${(e as Error).message}`));
      return;
    }
    const results: Promise<{ name: string; type: string; path: string }>[] = [];
    let failed: unknown = null;
    bb.on('file', (_field, stream, filename) => {
      if (failed) return void stream.resume();
      if (single !== undefined && results.length > 0) {
        failed = invalidArgument('a multipart upload with a path query carries one file; send several files without path (each part named by its path)');
        return void stream.resume();
      }
      const target = single ?? filename;
      if (!target) {
        failed = invalidArgument('a multipart file part needs a file name (its path in the sandbox) when the upload has no path query');
        return void stream.resume();
      }
      const p = write(target, stream);
      p.catch((e: unknown) => { failed ??= e; });
      results.push(p);
    });
    bb.on('filesLimit', () => { failed ??= invalidArgument(`more than ${MAX_UPLOAD_FILES} files in one upload`); });
    bb.on('error', (e: Error) => reject(failed ?? invalidArgument(`malformed multipart upload: ${e.message}`)));
    bb.on('finish', () => {
      Promise.all(results).then((r) => {
        if (failed) reject(failed);
        else if (r.length === 0) reject(invalidArgument('the multipart upload has no file part'));
        else resolve(r);
      }, (e: unknown) => reject(failed ?? e));
    });
    body.pipe(bb);
  });
}

