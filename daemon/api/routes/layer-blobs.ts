/**
 * Layer blobs as bytes, for copying an image between the hosts of a fleet (a gateway
 * relays them, gateway/image-copy.ts): `GET /v1/layers/{digest}/blob` streams one EROFS
 * blob; `PUT /v1/layers/{digest}/blob` stores one from the request body, admins only (the
 * kernel mounts what is stored: only a party trusted with imports may add blobs), and
 * only when the bytes hash to the digest named, so a blob corrupted or substituted on the
 * way is refused and never reaches the store.
 */
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { chmod, rename, rm, stat } from 'node:fs/promises';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { z } from 'zod';
import { DsecError, invalidArgument, notFound } from '../../errors.js';
import type { LayerStore } from '../../image/layer-store.js';
import { scopeOf } from '../scope.js';
import { route } from './table.js';

const DIGEST_RE = /^sha256:[0-9a-f]{64}$/;

const getRoute = route({
  method: 'GET', url: '/v1/layers/:digest/blob', summary: 'The bytes of one layer blob (EROFS), streamed, for a copy to another host; a layer an image the caller sees names (admins: any).',
  status: 200, response: null, errors: ['InvalidArgument', 'NotFound'],
});
const putRoute = route({
  method: 'PUT', url: '/v1/layers/:digest/blob', summary: 'Store one layer blob from the raw request body (admins only: a gateway copying an image from a peer host); refused unless its bytes hash to the digest.',
  status: 201, response: z.object({ digest: z.string(), size_bytes: z.number().int(), stored: z.boolean().describe('False when the store already held it (the body was read and dropped).') }),
  errors: ['InvalidArgument', 'FailedPrecondition', 'PermissionDenied'],
});

/**
 * Writes `body` into the store as the blob of `digest`: to a temp file, hashed on the
 * way, renamed into place (0444) only when the hash matches.
 * @returns the blob's size, bytes, and whether it was stored (false: already present).
 * @throws DsecError FailedPrecondition naming both digests when the bytes hash to another.
 */
export async function receiveBlob(store: LayerStore, digest: string, body: Readable): Promise<{ size: number; stored: boolean }> {
  const tmp = store.tmpPath('.blob');
  const hash = createHash('sha256');
  let size = 0;
  body.on('data', (c: Buffer) => {
    hash.update(c);
    size += c.length;
  });
  try {
    await pipeline(body, createWriteStream(tmp, { mode: 0o600 }));
    const actual = `sha256:${hash.digest('hex')}`;
    if (actual !== digest) throw new DsecError('FailedPrecondition', `layer ${digest}: the bytes received hash to ${actual} (${size} bytes); refused, nothing stored (corrupted or substituted on the way)`);
    if (await store.hasBlob(digest)) return { size, stored: false };
    await chmod(tmp, 0o444);
    await rename(tmp, store.blobPath(digest));
    return { size, stored: true };
  } finally {
    await rm(tmp, { force: true });
  }
}

/** Registers the blob routes (in their own scope: the PUT body is a raw stream). */
export function registerLayerBlobRoutes(app: FastifyInstance, deps: { images: LayerStore }): void {
  const store = deps.images;
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', (_req, payload, done) => done(null, payload));
  const digestOf = (req: FastifyRequest<{ Params: { digest: string } }>) => {
    const d = req.params.digest;
    if (!DIGEST_RE.test(d)) throw invalidArgument(`layer digest ${JSON.stringify(d)}: sha256:<64 hex>`);
    return d;
  };

  app.get<{ Params: { digest: string } }>(getRoute.url, async (req, reply) => {
    const digest = digestOf(req);
    const scope = scopeOf(req);
    // A tenant reads only layers an image it sees names (another tenant's image, or a snapshot's layer, answers as missing).
    if (!scope.all && !(await store.list(scope)).some((m) => m.layers.includes(digest))) throw notFound(`layer ${digest} not found`);
    const st = await stat(store.blobPath(digest)).catch(() => null);
    if (!st) throw notFound(`layer ${digest} not found`);
    return reply.code(200).header('content-type', 'application/octet-stream').header('content-length', String(st.size)).send(createReadStream(store.blobPath(digest)));
  });

  app.put<{ Params: { digest: string } }>(putRoute.url, async (req, reply) => {
    const digest = digestOf(req);
    const body = req.body as Readable | undefined;
    if (!body || typeof body.on !== 'function') throw invalidArgument('the request body must be the blob\'s bytes (application/octet-stream)');
    const r = await receiveBlob(store, digest, body);
    return reply.code(201).send({ digest, size_bytes: r.size, stored: r.stored });
  });
}
