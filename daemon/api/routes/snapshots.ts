/**
 * Snapshots of sandboxes, restores and forks. A restore or fork asked with
 * `Accept: application/x-ndjson` streams the phases of each sandbox it makes, as a
 * create does (daemon/api/routes/sandboxes.ts).
 */
import type { FastifyInstance } from 'fastify';
import { ForkRequest, ForkResult, RestoreRequest, Sandbox, Snapshot, SnapshotList, SnapshotRequest } from '../schema.js';
import type { Logger } from 'pino';
import { forkInput, restoreInput, sandboxView, snapshotInput, snapshotView } from '../convert.js';
import { runCreate, type CreateDeps } from '../creates.js';
import { parseWith } from '../parse.js';
import { scopeOf } from '../scope.js';
import { route } from './table.js';
import type { Metrics } from '../../metrics.js';
import type { SnapshotService } from '../../sandbox/snapshots.js';

const takeRoute = route({
  method: 'POST', url: '/v1/sandboxes/:id/snapshot', summary: 'Snapshot the sandbox: its writable layer, unstripped, as a private layer (a running sandbox is frozen while it is copied).',
  body: SnapshotRequest, status: 201, response: Snapshot, errors: ['InvalidArgument', 'NotFound', 'AlreadyExists', 'FailedPrecondition', 'Unimplemented'],
});
const listRoute = route({ method: 'GET', url: '/v1/snapshots', summary: "The caller's tenant's snapshots on this host (every tenant's for an admin), oldest first.", status: 200, response: SnapshotList, errors: [] });
const getRoute = route({ method: 'GET', url: '/v1/snapshots/:ref', summary: "One snapshot, by id (snap-…) or name (names are the caller's tenant's).", status: 200, response: Snapshot, errors: ['NotFound'] });
const delRoute = route({
  method: 'DELETE', url: '/v1/snapshots/:ref', summary: 'Remove a snapshot; sandboxes restored from it keep running.', status: 200, response: Snapshot, errors: ['NotFound'],
});
const restoreRoute = route({
  method: 'POST', url: '/v1/snapshots/:ref/restore', summary: 'Create a running sandbox from a snapshot (the source is untouched). Streams its phases with `Accept: application/x-ndjson`, as a create.',
  body: RestoreRequest, status: 201, response: Sandbox, errors: ['InvalidArgument', 'NotFound', 'FailedPrecondition', 'ResourceExhausted'],
});
const forkRoute = route({
  method: 'POST', url: '/v1/snapshots/:ref/fork', summary: 'Create `count` independent running sandboxes from one snapshot; all or nothing. Streams the phases of each with `Accept: application/x-ndjson`, as a create.',
  body: ForkRequest, status: 201, response: ForkResult, errors: ['InvalidArgument', 'NotFound', 'FailedPrecondition', 'ResourceExhausted'],
});

/** What the snapshot routes use. */
export interface SnapshotRouteDeps extends CreateDeps {
  snapshots: Pick<SnapshotService, 'snapshot' | 'list' | 'get' | 'remove' | 'restore' | 'fork'>;
  metrics: Pick<Metrics, 'errors'>;
  log: Logger;
}

/** Registers the snapshot routes. */
export function registerSnapshotRoutes(app: FastifyInstance, deps: SnapshotRouteDeps): void {
  const m = deps.snapshots;
  app.post<{ Params: { id: string } }>(takeRoute.url, async (req, reply) => {
    const body = parseWith(SnapshotRequest, req.body ?? {}, 'snapshot request');
    return reply.code(201).send(snapshotView(await m.snapshot(req.params.id, snapshotInput(body))));
  });
  app.get(listRoute.url, async (req) => ({ snapshots: m.list(scopeOf(req)).map(snapshotView) }));
  app.get<{ Params: { ref: string } }>(getRoute.url, async (req) => snapshotView(m.get(req.params.ref, scopeOf(req))));
  app.delete<{ Params: { ref: string } }>(delRoute.url, async (req) => snapshotView(await m.remove(req.params.ref, scopeOf(req))));
  app.post<{ Params: { ref: string } }>(restoreRoute.url, async (req, reply) => {
    const body = parseWith(RestoreRequest, req.body ?? {}, 'restore request');
    return runCreate(req, reply, deps, body, async (progress) => sandboxView(await m.restore(req.params.ref, restoreInput(body), { onProgress: progress, scope: scopeOf(req) })));
  });
  app.post<{ Params: { ref: string } }>(forkRoute.url, async (req, reply) => {
    const body = parseWith(ForkRequest, req.body, 'fork request');
    return runCreate(req, reply, deps, body, async (progress) => ({ sandboxes: (await m.fork(req.params.ref, forkInput(body), { onProgress: progress, scope: scopeOf(req) })).map(sandboxView) }));
  });
}
