/**
 * An image that only another host has: before a create goes to a host that lacks its
 * image, the gateway copies the image there from a peer host that has it, relaying it as
 * streams over the mutual TLS it already holds with every host (no host-to-host trust to
 * set up): the manifest (`GET /v1/images/{ref}` at the peer), each layer blob the target
 * lacks (`GET /v1/layers/{digest}/blob` at the peer piped into `PUT` of the same path at
 * the target, which stores it only when the bytes hash to the digest:
 * daemon/api/routes/layer-blobs.ts), then the manifest at the target (`POST /v1/images`).
 *
 * Tenancy: a tenant's own image (daemon/image/layer-store.ts keeps them per tenant) is
 * read at the peer as that tenant (the peer serves only layers an image of that tenant or
 * a `system` image names) and written at the target into that tenant, so it is copied
 * only within its tenant; a `system` image is read and written as `system`. The tenant's
 * own image of a name is taken before a `system` one, as hosts resolve names.
 */
import type { IncomingMessage } from 'node:http';
import { DsecError, unavailable } from '../daemon/errors.js';
import { SYSTEM_TENANT } from '../daemon/model/tenant.js';
import { addressOf, type GatewayContext } from './context.js';
import { hostError } from './routing.js';
import { tenantImageKey, type HostEntry } from './table.js';
import type { CallIdentity } from './upstream.js';

/** Whether host `h` reports image `ref` (normalized `name:tag`) visible to `tenant`. */
export function hostHasImage(h: HostEntry, ref: string, tenant: string): boolean {
  return h.imageSet.has(ref) || h.imageSet.has(tenantImageKey(tenant, ref));
}

/**
 * The up host to copy `ref` of `tenant` from, and the tenant the image belongs to; null
 * when no up host reports it (the create then goes on and its host answers).
 */
export function imageSource(ctx: GatewayContext, ref: string, tenant: string, exclude: string): { host: HostEntry; owner: string } | null {
  const up = [...ctx.table.hosts.values()].filter((h) => h.state === 'up' && h.info && h.name !== exclude);
  const own = up.find((h) => h.imageSet.has(tenantImageKey(tenant, ref)));
  if (own && tenant !== SYSTEM_TENANT) return { host: own, owner: tenant };
  const sys = up.find((h) => h.imageSet.has(ref));
  return sys ? { host: sys, owner: SYSTEM_TENANT } : null;
}

/**
 * Bytes a copy of `ref` of `tenant` would move to a host without it: the size of the image
 * the peers report (the tenant's own before a `system` one); 0 when none says.
 */
export function imageCopyBytes(ctx: GatewayContext, ref: string, tenant: string): number {
  let own = 0, sys = 0;
  for (const h of ctx.table.hosts.values()) {
    if (h.state !== 'up') continue;
    for (const i of h.images?.images ?? []) {
      if (i.ref !== ref) continue;
      if (i.tenant === undefined) sys = Math.max(sys, i.size_bytes ?? 0);
      else if (i.tenant === tenant) own = Math.max(own, i.size_bytes ?? 0);
    }
  }
  return own || sys;
}

async function body(res: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const c of res) chunks.push(c as Buffer);
  try {
    return JSON.parse(Buffer.concat(chunks).toString('utf8'));
  } catch {
    return null;
  }
}

/**
 * Copies image `ref` of `tenant` to `target` from a peer that has it, unless `target`
 * already reports it or no peer does; see the module comment.
 * @returns the bytes of blobs moved (0: nothing to copy).
 * @throws DsecError as a host answered (FailedPrecondition when a blob arrived with another digest), Unavailable when a host cannot be reached.
 */
export async function copyImageTo(ctx: GatewayContext, target: HostEntry, ref: string, tenant: string): Promise<number> {
  if (/^(sha256:|disk:)|@/.test(ref) || hostHasImage(target, ref, tenant)) return 0;
  const src = imageSource(ctx, ref, tenant, target.name);
  if (!src) return 0;
  const from = addressOf(src.host), to = addressOf(target);
  // Read as the image's tenant (its scope decides what the peer serves); written as an admin of that tenant (stores blobs, names the image there).
  const reader: CallIdentity = { tenant: src.owner, role: 'reader', tokenId: null };
  const writer: CallIdentity = { tenant: src.owner, role: 'admin', tokenId: null };
  const m = await ctx.upstreams.json<{ name: string; tag: string; tenant?: string; layers: string[]; config: Record<string, unknown> }>(from, { method: 'GET', path: `/v1/images/${encodeURIComponent(ref)}`, identity: reader });
  if (m.status !== 200 || !m.body) throw hostError(src.host.name, m.status, m.body);
  let moved = 0;
  for (const digest of m.body.layers) {
    const have = await ctx.upstreams.json(to, { method: 'GET', path: `/v1/layers/${digest}`, identity: writer });
    if (have.status === 200) continue;
    const blob = await ctx.upstreams.request(from, { method: 'GET', path: `/v1/layers/${digest}/blob`, identity: reader });
    if (blob.statusCode !== 200) throw hostError(src.host.name, blob.statusCode ?? 0, await body(blob));
    const len = String(blob.headers['content-length'] ?? '');
    let put: IncomingMessage;
    try {
      put = await ctx.upstreams.request(to, {
        method: 'PUT', path: `/v1/layers/${digest}/blob`, body: blob, identity: writer,
        headers: { 'content-type': 'application/octet-stream', ...(len ? { 'content-length': len } : {}) },
      });
    } catch (e) {
      blob.destroy();
      throw unavailable(`copying layer ${digest} of image ${ref} from host ${src.host.name} to host ${target.name} failed: ${(e as Error).message}`, e);
    }
    const answer = await body(put);
    if (put.statusCode !== 201) {
      const err = hostError(target.name, put.statusCode ?? 0, answer);
      throw new DsecError(err.kind, `image ${ref} is only on host ${src.host.name}; copying it to host ${target.name} failed: ${err.message}`);
    }
    moved += Number((answer as { size_bytes?: number }).size_bytes ?? 0);
  }
  const config = Object.fromEntries(Object.entries(m.body.config).filter(([, v]) => v !== undefined && v !== null));
  const compose = JSON.stringify({ image: `${m.body.name}:${m.body.tag}`, layers: m.body.layers, config });
  const made = await ctx.upstreams.json(to, {
    method: 'POST', path: '/v1/images', identity: writer, headers: { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(compose)) }, body: compose,
  });
  if (made.status !== 201) throw hostError(target.name, made.status, made.body);
  // The target's images record follows within its refresh; until then this gateway knows.
  target.imageSet.add(src.owner === SYSTEM_TENANT ? ref : tenantImageKey(src.owner, ref));
  ctx.log.info({ image: ref, tenant: src.owner, from: src.host.name, to: target.name, bytes: moved }, 'image copied to the host a create was placed on');
  return moved;
}
