/**
 * Batched create: `POST /v1/sandboxes:batch` makes many sandboxes in one request (a job's
 * rollout group), answered per sandbox in request order. Each sandbox is created exactly
 * as `POST /v1/sandboxes` creates one (daemon/sandbox/create.ts: admission and the tenant
 * quota per sandbox, a warm-pool shell claimed when one fits), {@link BATCH_CONCURRENCY}
 * at a time, so a batch may pass no limit a series of single creates could not: what
 * does not fit is that item's ResourceExhausted, the others are made.
 *
 * Keys and holds are per sandbox (daemon/sandbox/create-records.ts): sandbox i of a batch
 * sent with `Idempotency-Key: K` has the key `K/i` (or `keys[i]`), fingerprinted as a
 * single create of its spec, so a retried batch answers the sandboxes the first one
 * made and makes only those it failed to. Every sandbox made is held until the whole
 * answer is delivered (or, relayed by a gateway with `x-dsec-create-ack: gateway`, until
 * the gateway acknowledges it), and reaped at the acknowledgement deadline otherwise.
 */
import type { FastifyInstance } from 'fastify';
import { CreateSandboxRequest, CreateSandboxesRequest, CreateSandboxesResult, MAX_BATCH_SANDBOXES } from '../schema.js';
import { sandboxInput, sandboxView } from '../convert.js';
import { gatewayAcks } from '../creates.js';
import { parseWith } from '../parse.js';
import { scopeOf } from '../scope.js';
import { route } from './table.js';
import { DsecError, wrap } from '../../errors.js';
import { CreateRecords, IDEMPOTENCY_HEADER, itemKeys } from '../../sandbox/create-records.js';
import type { CreateDeps } from '../creates.js';
import type { Metrics } from '../../metrics.js';
import type { SandboxCreator } from '../../sandbox/create.js';

/**
 * Creates of one batch in flight at once inside dsecd: 16, the concurrency of the bursts
 * docs/BENCHMARKS.md measures single creates at (enough to overlap runc on 2 cores and to
 * drain a warm pool at its claim rate, few enough that one batch cannot starve other
 * callers' creates).
 */
export const BATCH_CONCURRENCY = 16;

const batchRoute = route({
  method: 'POST', url: '/v1/sandboxes:batch',
  summary: `Create many sandboxes in one request: {count, spec} or {items:[spec...]}, 1-${MAX_BATCH_SANDBOXES}. Answers 200 with one {sandbox} or {error:{code,message}} per sandbox, in request order; each is created as POST /v1/sandboxes creates one (admission and tenant quota per sandbox). Idempotency-Key K keys sandbox i as K/i.`,
  body: CreateSandboxesRequest, status: 200, response: CreateSandboxesResult, errors: ['InvalidArgument'],
});

/** What the batch route uses: the creator, and the keys and holds of daemon/api/creates.ts. */
export interface BatchCreateRouteDeps extends CreateDeps {
  creator: Pick<SandboxCreator, 'create'>;
  metrics: Pick<Metrics, 'createSeconds' | 'errors'>;
}

/** One entry of a batch's answer. */
type Item = { sandbox: ReturnType<typeof sandboxView>; error?: undefined } | { sandbox?: undefined; error: { code: string; message: string } };

/** Registers POST /v1/sandboxes:batch. */
export function registerBatchCreateRoute(app: FastifyInstance, deps: BatchCreateRouteDeps): void {
  // `::` is fastify's escape for a literal colon in a path.
  app.post(batchRoute.url.replace(':', '::'), async (req, reply) => {
    const body = parseWith(CreateSandboxesRequest, req.body, 'batch create request');
    const specs = body.items ?? Array.from({ length: body.count ?? 0 }, () => body.spec ?? CreateSandboxRequest.parse({}));
    const keys = itemKeys(req.headers[IDEMPOTENCY_HEADER], body.keys, specs.length);
    // The TCP door's create budget: one per sandbox (the request spent one).
    await req.spendCreates?.(specs.length - 1);
    const tenant = scopeOf(req).tenant;
    const records = deps.createRecords;
    const made: string[] = [];
    if (records && !gatewayAcks(req)) {
      // Delivered: the whole answer went to the connection; a connection that failed first never emits 'finish'.
      reply.raw.once('finish', () => {
        if (made.length) records.ack(made);
      });
    }
    const out: Item[] = new Array(specs.length);
    const one = async (i: number) => {
      const spec = specs[i];
      const make = async () => {
        const end = deps.metrics.createSeconds.startTimer({ backend: spec.backend });
        const sb = sandboxView(await deps.creator.create({ ...sandboxInput(spec), tenant }));
        end();
        return sb;
      };
      try {
        const key = keys[i];
        let sb: ReturnType<typeof sandboxView>;
        let replayed = false;
        if (records && key !== null) ({ result: sb, replayed } = await records.once(tenant, key, CreateRecords.fingerprint('POST', '/v1/sandboxes', spec), make));
        else sb = await make();
        records?.hold([sb.id], tenant, key, replayed);
        made.push(sb.id);
        out[i] = { sandbox: sb };
      } catch (e) {
        const err = e instanceof DsecError ? e : wrap(e, `batch item ${i}`);
        if (err.kind === 'Internal') deps.log.error({ err, item: i }, 'batch create item failed');
        deps.metrics.errors.inc({ code: err.kind });
        out[i] = { error: { code: err.kind, message: err.message } };
      }
    };
    let next = 0;
    const worker = async () => {
      while (next < specs.length) await one(next++);
    };
    await Promise.all(Array.from({ length: Math.min(BATCH_CONCURRENCY, specs.length) }, worker));
    const created = out.filter((r) => r.sandbox).length;
    return { results: out, created, failed: out.length - created };
  });
}
