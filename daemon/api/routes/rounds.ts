/** RL rounds: bulk operations by label selector, and job leases. Pause and resume are in ./sandboxes.ts. */
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { BulkRequest, BulkResponse, LeaseRequest, LeaseView, RenewRequest } from '../schema.js';
import { parseWith } from '../parse.js';
import { scopeOf } from '../scope.js';
import { route } from './table.js';
import type { RoundService } from '../../sandbox/rounds.js';

const bulkRoute = route({ method: 'POST', url: '/v1/sandboxes/bulk', summary: 'Pause, resume, stop, destroy or set the TTL of every sandbox matching a selector; a result per sandbox.', body: BulkRequest, status: 200, response: BulkResponse, errors: ['InvalidArgument'] });
const leasePut = route({ method: 'POST', url: '/v1/leases', summary: "Create or renew a job's lease (the job's sandboxes carry label job=<job>).", body: LeaseRequest, status: 200, response: LeaseView, errors: ['InvalidArgument', 'FailedPrecondition'] });
const leaseRenew = route({ method: 'POST', url: '/v1/leases/:job/renew', summary: 'Renew a lease (heartbeat); refused once it expired.', body: RenewRequest, status: 200, response: LeaseView, errors: ['NotFound', 'FailedPrecondition'] });
const leaseList = route({ method: 'GET', url: '/v1/leases', summary: "The caller's tenant's leases (every tenant's for an admin).", status: 200, response: z.object({ leases: z.array(LeaseView) }), errors: [] });
const leaseGet = route({ method: 'GET', url: '/v1/leases/:job', summary: 'One lease.', status: 200, response: LeaseView, errors: ['NotFound'] });
const leaseDel = route({ method: 'DELETE', url: '/v1/leases/:job', summary: "Delete a lease (the job's sandboxes stay).", status: 200, response: LeaseView, errors: ['NotFound'] });

/** What the round routes use. */
export interface RoundRouteDeps {
  rounds: Pick<RoundService, 'bulk' | 'lease' | 'leases' | 'putLease' | 'renewLease' | 'deleteLease'>;
}

/** Registers the bulk and lease routes. */
export function registerRoundRoutes(app: FastifyInstance, deps: RoundRouteDeps): void {
  const r = deps.rounds;
  app.post(bulkRoute.url, async (req) => {
    const b = parseWith(BulkRequest, req.body, 'bulk request');
    return { results: await r.bulk(b.selector, b.action, { ttlS: b.ttl_s, graceMs: b.timeout_ms }, scopeOf(req)) };
  });
  app.post(leasePut.url, async (req) => {
    const b = parseWith(LeaseRequest, req.body, 'lease request');
    return r.putLease(b.job, b.ttl_s, scopeOf(req));
  });
  app.post<{ Params: { job: string } }>(leaseRenew.url, async (req) => {
    const b = parseWith(RenewRequest, req.body ?? {}, 'renew request');
    return r.renewLease(req.params.job, b.ttl_s, scopeOf(req));
  });
  app.get(leaseList.url, async (req) => ({ leases: r.leases(scopeOf(req)) }));
  app.get<{ Params: { job: string } }>(leaseGet.url, async (req) => r.lease(req.params.job, scopeOf(req)));
  app.delete<{ Params: { job: string } }>(leaseDel.url, async (req) => r.deleteLease(req.params.job, scopeOf(req)));
}
