/**
 * Batched creates through the gateway (`POST /v1/sandboxes:batch`, as dsecd serves it:
 * daemon/api/routes/sandboxes-batch.ts). The gateway places every sandbox of the batch as
 * it places a single create (gateway/placement.ts, one decision per sandbox, each
 * reserving on its host so the next sees it: admission, bursting and spread apply per
 * sandbox), sends each host one sub-batch of the sandboxes placed on it (`{items, keys}`,
 * concurrently), and merges the hosts' answers per sandbox in request order. A sandbox a
 * host refused (ResourceExhausted or Unavailable, or a host that could not be reached) is
 * placed again without that host, up to {@link MAX_ATTEMPTS} rounds, as a single create
 * moves on; any other error is that sandbox's answer.
 *
 * Keys: with `Idempotency-Key: K` sandbox i has the key `K/i` (or `keys[i]`), claimed in
 * etcd per sandbox as a single create's key is (gateway/idempotency.ts), so a retried
 * batch, through any gateway, sends each sandbox to the host that made it, which answers
 * it again. Sub-batches go with `x-dsec-create-ack: gateway`; once the merged answer was
 * written whole to the client, each host is told which of its sandboxes were delivered.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { DsecError, ERROR_KINDS, wrap, type ErrorKind } from '../daemon/errors.js';
import { parseWith } from '../daemon/api/parse.js';
import { CreateSandboxRequest, CreateSandboxesRequest } from '../daemon/api/schema.js';
import { ACK_HEADER, IDEMPOTENCY_HEADER, itemKeys } from '../daemon/sandbox/create-records.js';
import { BURST_HEADER, MAX_ATTEMPTS, imageSomewhere, noteCreated } from './create.js';
import { addressOf, identityOf, requestLimits, type GatewayContext } from './context.js';
import { choose, isNoHost, noHostError, normalizeImage, type NoHost, type PlacementRequest } from './placement.js';
import { hostError, readJson, type Router } from './routing.js';
import type { Reservation } from './table.js';

/** One sandbox of the batch while it is placed. */
interface Pending {
  i: number;
  spec: CreateSandboxRequest;
  key: string | null;
  preq: PlacementRequest;
  refusals: string[];
  /** Whether this request made the key's etcd record (false: an earlier create of the key named the host). */
  ownsKey: boolean;
  /** The host that holds the key's record, once claimed. */
  keyHost: string | null;
}

/** An entry of the answer. */
type Entry = { sandbox: Record<string, unknown> } | { error: { code: string; message: string } };

const movesOn = (kind: string) => kind === 'ResourceExhausted' || kind === 'Unavailable';
const fail = (e: DsecError): Entry => ({ error: { code: e.kind, message: e.message } });

/**
 * Places, sends and merges one batched create; see the module comment.
 * @throws DsecError InvalidArgument for a malformed batch (nothing is placed); every
 *   per-sandbox failure is in the answer instead.
 */
export async function placeBatch(ctx: GatewayContext, router: Router, req: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const body = parseWith(CreateSandboxesRequest, await readJson(req), 'batch create request');
  const specs = body.items ?? Array.from({ length: body.count ?? 0 }, () => body.spec ?? CreateSandboxRequest.parse({}));
  const keys = itemKeys(req.headers[IDEMPOTENCY_HEADER], body.keys, specs.length);
  // The gateway door's create budget: one per sandbox (the request spent one).
  await req.spendCreates?.(specs.length - 1);
  const who = identityOf(req);
  const allowBurst = String(req.headers[BURST_HEADER] ?? '').toLowerCase() === 'allow';
  const out: Entry[] = new Array(specs.length);
  /** Delivered sandboxes per host, acknowledged once the answer is out. */
  const made = new Map<string, string[]>();
  let todo: Pending[] = [];
  for (const [i, spec] of specs.entries()) {
    const labels = spec.labels ?? {};
    const preq: PlacementRequest = {
      backend: spec.backend, image: normalizeImage(spec.image), network: spec.network?.mode ?? 'none', ...requestLimits(spec, ctx.table),
      job: typeof labels.job === 'string' ? labels.job : null, refused: new Set(), allowBurst,
    };
    try {
      imageSomewhere(ctx, preq.image, who.tenant);
      todo.push({ i, spec, key: keys[i], preq, refusals: [], ownsKey: false, keyHost: null });
    } catch (e) {
      out[i] = fail(e as DsecError);
    }
  }
  for (let round = 0; round < MAX_ATTEMPTS && todo.length; round++) {
    // Place each sandbox in order; each reservation counts in the next decision.
    const byHost = new Map<string, Array<{ p: Pending; r: Reservation }>>();
    for (const p of todo) {
      const pick = choose(ctx.table.placementHosts(), p.preq, ctx.policy);
      let name = isNoHost(pick) ? null : pick.name;
      if (p.key !== null) {
        if (p.keyHost === null) {
          const claim = await ctx.keyed.claim(who.tenant, p.key, name);
          if (claim) {
            name = claim.host;
            p.keyHost = claim.host;
            p.ownsKey = claim.created;
          }
        } else if (name !== null && name !== p.keyHost) {
          await ctx.keyed.move(who.tenant, p.key, p.keyHost, name);
          p.keyHost = name;
          p.ownsKey = true;
        }
      }
      if (name === null) {
        ctx.metrics.placements.inc({ outcome: 'none' });
        const e = noHostError(pick as NoHost, p.preq);
        out[p.i] = fail(new DsecError(e.kind, `${e.message}${p.refusals.length ? `; refusals: ${p.refusals.join('; ')}` : ''}`));
        continue;
      }
      const host = ctx.table.hosts.get(name);
      if (!host || host.state !== 'up') {
        out[p.i] = fail(new DsecError('Unavailable', `the first create with this ${IDEMPOTENCY_HEADER} went to host ${name}, which is ${host ? host.state : 'not in the fleet'}; retry when it is back (a create elsewhere would be another sandbox)`));
        continue;
      }
      const r: Reservation = { count: 1, cpus: p.preq.cpus, memoryBytes: p.preq.memoryBytes, job: p.preq.job };
      ctx.table.reserve(name, r);
      const list = byHost.get(name) ?? [];
      list.push({ p, r });
      byHost.set(name, list);
    }
    const again: Pending[] = [];
    // One sub-batch per host, all hosts at once.
    await Promise.all([...byHost].map(async ([name, list]) => {
      const host = ctx.table.hosts.get(name)!;
      const keyed = list.some((x) => x.p.key !== null);
      const text = JSON.stringify({ items: list.map((x) => x.p.spec), ...(keyed ? { keys: list.map((x) => x.p.key ?? `${req.id}/${x.p.i}`) } : {}) });
      let answer = null as { results?: Array<{ sandbox?: Record<string, unknown>; error?: { code: string; message: string } }> } | null;
      let whole = null as DsecError | null;
      try {
        const res = await ctx.upstreams.request(addressOf(host), {
          method: 'POST', path: '/v1/sandboxes:batch',
          headers: { [ACK_HEADER]: 'gateway', 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) }, body: text, identity: who,
        });
        const chunks: Buffer[] = [];
        for await (const c of res) chunks.push(c as Buffer);
        let parsed: unknown = null;
        try {
          parsed = JSON.parse(Buffer.concat(chunks).toString('utf8'));
        } catch { /* judged below */ }
        if ((res.statusCode ?? 0) >= 400) whole = hostError(name, res.statusCode ?? 0, parsed);
        else answer = parsed as typeof answer;
      } catch (e) {
        whole = new DsecError('Unavailable', `host ${name} cannot be reached: ${(e as Error).message}`);
      }
      for (const [j, { p, r }] of list.entries()) {
        const got = answer?.results?.[j];
        const err = whole ?? (got?.sandbox ? null : got?.error ? new DsecError((ERROR_KINDS as string[]).includes(got.error.code) ? (got.error.code as ErrorKind) : 'Internal', got.error.message) : wrap(new Error('no entry for this sandbox'), `host ${name}`));
        if (!err && got?.sandbox) {
          ctx.table.settle(name, r, true);
          ctx.metrics.placements.inc({ outcome: 'created' });
          noteCreated(router, name, got.sandbox);
          out[p.i] = { sandbox: got.sandbox };
          const ids = made.get(name) ?? [];
          ids.push(String(got.sandbox.id));
          made.set(name, ids);
          continue;
        }
        ctx.table.settle(name, r, false);
        const e = err!;
        // A key whose first create another request sent here stays here (a create elsewhere would be a second sandbox).
        if (movesOn(e.kind) && !(p.key !== null && !p.ownsKey && e.kind === 'Unavailable')) {
          ctx.metrics.placements.inc({ outcome: 'refused' });
          (p.preq.refused as Set<string>).add(name);
          p.refusals.push(`${name}: ${e.message}`);
          again.push(p);
        } else out[p.i] = fail(e);
      }
    }));
    todo = again;
  }
  for (const p of todo) out[p.i] = fail(new DsecError('ResourceExhausted', `${MAX_ATTEMPTS} hosts refused this create: ${p.refusals.join('; ')}`));
  reply.raw.once('finish', () => {
    for (const [name, ids] of made) {
      const h = ctx.table.hosts.get(name);
      if (h?.info) ctx.keyed.ack(addressOf(h), who, ids);
    }
  });
  const created = out.filter((x) => 'sandbox' in x).length;
  return { results: out, created, failed: out.length - created };
}
