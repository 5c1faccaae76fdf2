/**
 * Creates through the gateway: place (gateway/placement.ts), send to the chosen host, and
 * when the host refuses (ResourceExhausted or Unavailable, or cannot be reached) decide
 * again without it, until a host takes the create or no host is left. Used for
 * `POST /v1/sandboxes` and the one-shot runs (`POST /v1/run`, `/v1/run:batch`, `/run_code`).
 *
 * With `Accept: application/x-ndjson` a host answers 200 at once and reports admission
 * in its first line; the gateway reads that line before it answers the client, so a
 * refusal there also moves the create on, and a stream once started is the chosen host's.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { IncomingMessage } from 'node:http';
import { DsecError, unavailable } from '../daemon/errors.js';
import { ACK_HEADER, IDEMPOTENCY_HEADER, KEY_RE, idsOf } from '../daemon/sandbox/create-records.js';
import type { KeyClaim } from './idempotency.js';
import { reserveCreate, type QuotaHold } from './quotas.js';
import { copyImageTo, imageCopyBytes } from './image-copy.js';
import { choose, isNoHost, noHostError, normalizeImage, type NoHost, type PlacementRequest } from './placement.js';
import { addressOf, identityOf, requestLimits, type GatewayContext } from './context.js';
import { hostError, readJson, type Router } from './routing.js';
import { passHeaders } from './upstream.js';
import { tenantImageKey, type Reservation } from './table.js';

/** The request header by which a create allows a burst host (`allow`); see gateway/placement.ts. */
export const BURST_HEADER = 'x-dsec-burst';

/** A create tries at most 8 hosts: each refusal costs a round trip, and 8 refusals in a row mean the fleet is full, which the answer then says. */
export const MAX_ATTEMPTS = 8;

/**
 * Reads one NDJSON line from a host's streamed answer: the line and the bytes after it,
 * leaving the stream paused and readable (a `for await` loop left early would destroy it).
 */
function firstLine(res: IncomingMessage): Promise<{ line: string; rest: Buffer } | null> {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const done = () => {
      res.off('data', onData);
      res.off('end', onEnd);
      res.off('error', reject);
    };
    const onData = (c: Buffer) => {
      buf = Buffer.concat([buf, c]);
      const i = buf.indexOf(10);
      if (i < 0) return;
      res.pause();
      done();
      resolve({ line: buf.subarray(0, i).toString('utf8'), rest: buf.subarray(i + 1) });
    };
    const onEnd = () => {
      done();
      resolve(buf.length ? { line: buf.toString('utf8'), rest: Buffer.alloc(0) } : null);
    };
    res.on('data', onData);
    res.once('end', onEnd);
    res.once('error', reject);
  });
}

/** Whether an error kind sends a create to the next host. */
const movesOn = (kind: string) => kind === 'ResourceExhausted' || kind === 'Unavailable';

/** A create's fleet-wide quota reservation, and whether its answer streams (then the stream releases it). */
interface QuotaScope {
  hold: QuotaHold | null;
  streaming: boolean;
}

/**
 * Places and forwards one create; see the module comment. A sandbox create of a tenant
 * with a fleet-wide quota reserves its share first (gateway/quotas.ts), released unless
 * the create made a sandbox.
 * @param backend the backend when the body names none (sandboxes: container; runs: fncall)
 * @throws DsecError as placement decides (ResourceExhausted, Unavailable or
 *   FailedPrecondition naming what each filter excluded), as the quota decides
 *   (ResourceExhausted naming it), or as the host answered.
 */
export async function placeAndForward(ctx: GatewayContext, router: Router, req: FastifyRequest, reply: FastifyReply, defaultBackend: string): Promise<FastifyReply> {
  const q: QuotaScope = { hold: null, streaming: false };
  try {
    return await place(ctx, router, req, reply, defaultBackend, q);
  } finally {
    if (!q.streaming) await q.hold?.done();
  }
}

async function place(ctx: GatewayContext, router: Router, req: FastifyRequest, reply: FastifyReply, defaultBackend: string, q: QuotaScope): Promise<FastifyReply> {
  const body = await readJson(req);
  const text = JSON.stringify(body);
  const labels = (body.labels && typeof body.labels === 'object' ? body.labels : {}) as Record<string, string>;
  const network = (body.network as { mode?: string } | undefined)?.mode ?? 'none';
  const limits = requestLimits(body, ctx.table);
  const preq: PlacementRequest = {
    backend: typeof body.backend === 'string' ? body.backend : defaultBackend,
    image: normalizeImage(typeof body.image === 'string' ? body.image : 'busybox'),
    network, ...limits, job: typeof labels.job === 'string' ? labels.job : null, refused: new Set(),
    allowBurst: String(req.headers[BURST_HEADER] ?? '').toLowerCase() === 'allow',
  };
  const ndjson = String(req.headers.accept ?? '').includes('application/x-ndjson');
  const refusals: string[] = [];
  const refused = preq.refused as Set<string>;
  const who = identityOf(req);
  preq.tenantImage = tenantImageKey(who.tenant, preq.image);
  preq.copyBytes = imageCopyBytes(ctx, preq.image, who.tenant);
  const rawKey = req.headers[IDEMPOTENCY_HEADER];
  const key = typeof rawKey === 'string' && KEY_RE.test(rawKey) ? rawKey : null;
  // Only sandbox creates hold their sandboxes until delivery (daemon/sandbox/create-records.ts).
  const acks = req.routeOptions.url === '/v1/sandboxes';
  if (acks && typeof body.image === 'string') imageSomewhere(ctx, preq.image, who.tenant);
  if (acks) q.hold = await reserveCreate(ctx.quotas, ctx.keyed, ctx.table.fresh, who.tenant, preq.cpus, preq.memoryBytes, key);
  /** The host the key's record names, and whether this request made the record. */
  let owner: KeyClaim | null = null;
  for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
    const end = ctx.metrics.placementSeconds.startTimer();
    const pick = choose(ctx.table.placementHosts(), preq, ctx.policy);
    end();
    let name = isNoHost(pick) ? null : pick.name;
    if (key !== null) {
      if (attempt === 0) {
        owner = await ctx.keyed.claim(who.tenant, key, name);
        if (owner) name = owner.host;
      } else if (owner && name !== null) {
        await ctx.keyed.move(who.tenant, key, owner.host, name);
        owner = { host: name, created: true };
      }
    }
    if (name === null) {
      ctx.metrics.placements.inc({ outcome: 'none' });
      const e = noHostError(pick as NoHost, preq);
      throw new DsecError(e.kind, `${e.message}${refusals.length ? `; refusals: ${refusals.join('; ')}` : ''}`);
    }
    const host = ctx.table.hosts.get(name);
    if (!host || host.state !== 'up') {
      throw unavailable(`the first create with this ${IDEMPOTENCY_HEADER} went to host ${name}, which is ${host ? host.state : 'not in the fleet'}; retry when it is back (a create elsewhere would be another sandbox)`);
    }
    // An image only another host has is copied here first (gateway/image-copy.ts).
    if (acks && typeof body.image === 'string') await copyImageTo(ctx, host, preq.image, who.tenant);
    const r: Reservation = { count: 1, cpus: preq.cpus, memoryBytes: preq.memoryBytes, job: preq.job };
    ctx.table.reserve(host.name, r);
    let settled = false;
    const settle = (ok: boolean) => {
      if (!settled) ctx.table.settle(host.name, r, ok);
      settled = true;
    };
    let res: IncomingMessage;
    try {
      res = await ctx.upstreams.request(addressOf(host), {
        method: 'POST', path: req.url, headers: { ...passHeaders(req.headers), ...(acks ? { [ACK_HEADER]: 'gateway' } : {}), 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) },
        body: text, identity: who,
      });
    } catch (e) {
      settle(false);
      if (owner && !owner.created) throw unavailable(`the first create with this ${IDEMPOTENCY_HEADER} went to host ${host.name}, which cannot be reached now (${(e as Error).message}); retry later`);
      refused.add(host.name);
      refusals.push(`${host.name}: ${(e as Error).message}`);
      ctx.metrics.placements.inc({ outcome: 'refused' });
      continue;
    }
    const status = res.statusCode ?? 0;
    if (!ndjson || status !== 200) {
      const chunks: Buffer[] = [];
      for await (const c of res) chunks.push(c as Buffer);
      const raw = Buffer.concat(chunks);
      let parsed: unknown = null;
      try {
        parsed = JSON.parse(raw.toString('utf8'));
      } catch { /* passed on as is */ }
      if (status >= 400) {
        const err = hostError(host.name, status, parsed);
        if (movesOn(err.kind)) {
          settle(false);
          refused.add(host.name);
          refusals.push(`${host.name}: ${err.message}`);
          ctx.metrics.placements.inc({ outcome: 'refused' });
          continue;
        }
        settle(false);
        return reply.code(status).type('application/json').send(raw);
      }
      settle(true);
      ctx.metrics.placements.inc({ outcome: 'created' });
      noteCreated(router, host.name, parsed);
      await q.hold?.created(host.name, idsOf(parsed));
      if (acks) reply.raw.once('finish', () => ctx.keyed.ack(addressOf(host), who, idsOf(parsed)));
      reply.code(status);
      for (const [k, v] of Object.entries(passHeaders(res.headers))) if (k !== 'content-length') reply.header(k, v);
      return reply.send(raw);
    }
    // Streamed: admission answers in the first line.
    const first = await firstLine(res);
    let line: { type?: string; error?: { code?: string; message?: string }; result?: unknown } | null = null;
    try {
      line = first ? JSON.parse(first.line) : null;
    } catch { /* passed on */ }
    if (line?.type === 'error' && movesOn(line.error?.code ?? '')) {
      res.destroy();
      settle(false);
      refused.add(host.name);
      refusals.push(`${host.name}: ${line.error?.message ?? line.error?.code}`);
      ctx.metrics.placements.inc({ outcome: 'refused' });
      continue;
    }
    ctx.metrics.placements.inc({ outcome: 'created' });
    q.streaming = true;
    reply.hijack();
    const out = reply.raw;
    out.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' });
    const onLine = (l: string) => {
      try {
        const o = JSON.parse(l) as { type?: string; result?: unknown };
        if (o.type === 'result') {
          settle(true);
          noteCreated(router, host.name, o.result);
          void q.hold?.created(host.name, idsOf(o.result));
          if (acks) out.once('finish', () => ctx.keyed.ack(addressOf(host), who, idsOf(o.result)));
        } else if (o.type === 'error') {
          settle(false);
          void q.hold?.done();
        }
      } catch { /* not ours to judge */ }
    };
    if (first) {
      onLine(first.line);
      out.write(`${first.line}\n`);
    }
    let pending = first?.rest.toString('utf8') ?? '';
    const scan = () => {
      let i;
      while ((i = pending.indexOf('\n')) >= 0) {
        onLine(pending.slice(0, i));
        pending = pending.slice(i + 1);
      }
    };
    if (first?.rest.length) out.write(first.rest);
    scan();
    if (res.readableEnded) {
      settle(false);
      void q.hold?.done();
      out.end();
      return reply;
    }
    res.on('data', (c: Buffer) => {
      pending += c.toString('utf8');
      scan();
      if (!out.write(c)) {
        res.pause();
        out.once('drain', () => res.resume());
      }
    });
    res.on('end', () => {
      settle(false);
      void q.hold?.done();
      out.end();
    });
    res.on('error', () => {
      settle(false);
      void q.hold?.done();
      out.destroy();
    });
    out.on('close', () => res.destroy());
    res.resume();
    return reply;
  }
  throw new DsecError('ResourceExhausted', `${MAX_ATTEMPTS} hosts refused this create: ${refusals.join('; ')}`);
}

/**
 * Refuses at once a create of an image no up host has: hosts load images only from their
 * own store (imported, built or bootstrapped there) or from a peer host the gateway copies
 * it from (gateway/image-copy.ts), never from a registry, so no host could run it. Judged only when every up host has reported its images.
 * A `system` image of that name or `tenant`'s own one counts (image names are per tenant,
 * daemon/image/layer-store.ts).
 * @throws DsecError NotFound naming the image and how many hosts were asked.
 */
export function imageSomewhere(ctx: GatewayContext, image: string, tenant: string): void {
  const up = [...ctx.table.hosts.values()].filter((h) => h.state === 'up');
  // Only `name:tag` refs, as hosts report them; digests and disk images are left to the hosts.
  if (/^(sha256:|disk:)|@/.test(image) || up.length === 0 || up.some((h) => h.images === null)) return;
  if (up.some((h) => h.imageSet.has(image) || h.imageSet.has(tenantImageKey(tenant, image)))) return;
  throw new DsecError('NotFound', `image ${image} is on none of the fleet's ${up.length} up hosts, and no store holds it (hosts take images only from their own store): import, build or bootstrap it on a host first (dsec image import PATH --host NAME)`);
}

/** Remembers the sandboxes of a create's answer (one, or a list from a fork) on `host`. */
export function noteCreated(router: Router, host: string, body: unknown): void {
  const rows = Array.isArray(body) ? body : Array.isArray((body as { sandboxes?: unknown })?.sandboxes) ? (body as { sandboxes: unknown[] }).sandboxes : [body];
  for (const row of rows) {
    if (row && typeof row === 'object' && typeof (row as { id?: unknown }).id === 'string') {
      router.remember((row as { id: string }).id, host);
      router.keepRow(host, row as Record<string, unknown>);
    }
  }
}
