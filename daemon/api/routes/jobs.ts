/** Pause/resume, bulk operations by selector, and job leases (RL rounds). */
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { Sandbox } from '../schema.js';
import { parseWith } from '../server.js';
import { notFound } from '../../errors.js';
import { toApi } from '../../sandbox/repo.js';
import { route } from './table.js';
import type { ApiDeps } from '../server.js';

/** What a pause reclaimed (bytes), from memory.stat before and after. */
export const Reclaim = z.object({
  memory_before_bytes: z.number().int(), memory_after_bytes: z.number().int(),
  file_before_bytes: z.number().int(), file_after_bytes: z.number().int(),
  anon_bytes: z.number().int().describe('Anonymous memory left: reclaimable only with swap/zswap.'),
  reclaimed_bytes: z.number().int(), swap: z.boolean(), note: z.string(),
});
/** POST /v1/sandboxes/{id}/pause response. */
export const PauseResult = z.object({ sandbox: Sandbox, reclaim: Reclaim.nullable().describe('null when it was already paused.') });
/** POST /v1/sandboxes/bulk request. */
export const BulkRequest = z
  .object({
    selector: z.string().min(1).describe('Label selector, e.g. job=a,round=3 (required: bulk never means "everything").'),
    action: z.enum(['pause', 'resume', 'stop', 'destroy', 'set_ttl']),
    ttl_s: z.number().int().min(1).nullable().optional().describe('set_ttl: seconds from creation, or null to remove.'),
    timeout_ms: z.number().int().min(0).optional().describe('stop: grace between SIGTERM and SIGKILL.'),
  })
  .strict();
/** POST /v1/sandboxes/bulk response. */
export const BulkResponse = z.object({
  results: z.array(z.object({
    id: z.string(), ok: z.boolean(), state: z.string().optional(), reclaim: Reclaim.optional(),
    error: z.object({ code: z.string(), message: z.string() }).optional(),
  })),
});
const jobName = z.string().regex(/^[A-Za-z0-9._/-]{1,63}$/, 'job must be a label value: [A-Za-z0-9._/-]{1,63}');
/** A lease. */
export const LeaseView = z.object({
  job: z.string(), ttl_s: z.number().int(),
  expires_at: z.number().int().describe('ms since the epoch; a renewal at or after it is refused.'),
  lapsed_at: z.number().int().nullable().describe('When the job was paused for lack of renewal.'),
  created_at: z.number().int(),
  sandboxes: z.number().int().describe('Sandboxes labelled job=<job>.'),
});
/** POST /v1/leases request. */
export const LeaseRequest = z.object({ job: jobName, ttl_s: z.number().int().min(1).max(30 * 24 * 3600) }).strict();
/** POST /v1/leases/{job}/renew request. */
export const RenewRequest = z.object({ ttl_s: z.number().int().min(1).max(30 * 24 * 3600).optional() }).strict();

const pauseRoute = route({ method: 'POST', url: '/v1/sandboxes/:id/pause', summary: 'Freeze every process and reclaim memory; idempotent.', status: 200, response: PauseResult, errors: ['NotFound', 'FailedPrecondition'] });
const resumeRoute = route({ method: 'POST', url: '/v1/sandboxes/:id/resume', summary: 'Thaw a paused sandbox; idempotent.', status: 200, response: Sandbox, errors: ['NotFound', 'FailedPrecondition'] });
const bulkRoute = route({ method: 'POST', url: '/v1/sandboxes/bulk', summary: 'Pause, resume, stop, destroy or set the TTL of every sandbox matching a selector; a result per sandbox.', body: BulkRequest, status: 200, response: BulkResponse, errors: ['InvalidArgument'] });
const leasePut = route({ method: 'POST', url: '/v1/leases', summary: "Create or renew a job's lease (the job's sandboxes carry label job=<job>).", body: LeaseRequest, status: 200, response: LeaseView, errors: ['InvalidArgument', 'FailedPrecondition'] });
const leaseRenew = route({ method: 'POST', url: '/v1/leases/:job/renew', summary: 'Renew a lease (heartbeat); refused once it expired.', body: RenewRequest, status: 200, response: LeaseView, errors: ['NotFound', 'FailedPrecondition'] });
const leaseList = route({ method: 'GET', url: '/v1/leases', summary: 'All leases.', status: 200, response: z.object({ leases: z.array(LeaseView) }), errors: [] });
const leaseGet = route({ method: 'GET', url: '/v1/leases/:job', summary: 'One lease.', status: 200, response: LeaseView, errors: ['NotFound'] });
const leaseDel = route({ method: 'DELETE', url: '/v1/leases/:job', summary: "Delete a lease (the job's sandboxes stay).", status: 200, response: LeaseView, errors: ['NotFound'] });

/** Registers pause/resume, bulk and lease routes. */
export function registerJobRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const m = deps.manager;
  const view = (job: string) => {
    const l = deps.repo.lease(job);
    if (!l) throw notFound(`no lease for job ${job}`);
    return { ...l, sandboxes: m.list(`job=${job}`).length };
  };
  app.post<{ Params: { id: string } }>(pauseRoute.url, async (req) => {
    const r = await m.pause(req.params.id);
    return { sandbox: toApi(r.sandbox), reclaim: r.reclaim };
  });
  app.post<{ Params: { id: string } }>(resumeRoute.url, async (req) => toApi(await m.resume(req.params.id)));
  app.post(bulkRoute.url, async (req) => {
    const b = parseWith(BulkRequest, req.body, 'bulk request');
    return { results: await m.bulk(b.selector, b.action, { ttlS: b.ttl_s, graceMs: b.timeout_ms }) };
  });
  app.post(leasePut.url, async (req) => {
    const b = parseWith(LeaseRequest, req.body, 'lease request');
    const { lease, created } = deps.repo.putLease(b.job, b.ttl_s);
    deps.repo.event(created ? 'lease.created' : 'lease.renewed', null, `job ${lease.job} expires ${new Date(lease.expires_at).toISOString()}`);
    return view(b.job);
  });
  app.post<{ Params: { job: string } }>(leaseRenew.url, async (req) => {
    const b = parseWith(RenewRequest, req.body ?? {}, 'renew request');
    const cur = deps.repo.lease(req.params.job);
    if (!cur) throw notFound(`no lease for job ${req.params.job}`);
    deps.repo.putLease(req.params.job, b.ttl_s ?? cur.ttl_s, Date.now(), 'renew');
    return view(req.params.job);
  });
  app.get(leaseList.url, async () => ({ leases: deps.repo.leases().map((l) => view(l.job)) }));
  app.get<{ Params: { job: string } }>(leaseGet.url, async (req) => view(req.params.job));
  app.delete<{ Params: { job: string } }>(leaseDel.url, async (req) => {
    const v = view(req.params.job);
    deps.repo.deleteLease(req.params.job);
    return v;
  });
}
