/**
 * Snapshots of sandboxes, restores and forks. A restore or fork asked with
 * `Accept: application/x-ndjson` streams the phases of each sandbox it makes, as a
 * create does (daemon/api/routes/sandboxes.ts).
 */
import type { FastifyInstance } from 'fastify';
import { ForkRequest, ForkResult, RestoreRequest, Sandbox, Snapshot, SnapshotList, SnapshotRequest } from '../schema.js';
import { runLong } from '../long.js';
import { parseWith } from '../server.js';
import { toApi } from '../../sandbox/repo.js';
import { snapshotToApi } from '../../sandbox/snapshots.js';
import { route } from './table.js';
import type { ApiDeps } from '../server.js';

const takeRoute = route({
  method: 'POST', url: '/v1/sandboxes/:id/snapshot', summary: 'Snapshot the sandbox: its writable layer, unstripped, as a private layer (a running sandbox is frozen while it is copied).',
  body: SnapshotRequest, status: 201, response: Snapshot, errors: ['InvalidArgument', 'NotFound', 'AlreadyExists', 'FailedPrecondition', 'Unimplemented'],
});
const listRoute = route({ method: 'GET', url: '/v1/snapshots', summary: 'Every snapshot on this host, oldest first.', status: 200, response: SnapshotList, errors: [] });
const getRoute = route({ method: 'GET', url: '/v1/snapshots/:ref', summary: 'One snapshot, by id (snap-…) or name.', status: 200, response: Snapshot, errors: ['NotFound'] });
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

/** Registers the snapshot routes. */
export function registerSnapshotRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const m = deps.manager;
  app.post<{ Params: { id: string } }>(takeRoute.url, async (req, reply) => {
    const body = parseWith(SnapshotRequest, req.body ?? {}, 'snapshot request');
    return reply.code(201).send(snapshotToApi(await m.snapshot(req.params.id, body)));
  });
  app.get(listRoute.url, async () => ({ snapshots: m.listSnapshots().map(snapshotToApi) }));
  app.get<{ Params: { ref: string } }>(getRoute.url, async (req) => snapshotToApi(m.getSnapshot(req.params.ref)));
  app.delete<{ Params: { ref: string } }>(delRoute.url, async (req) => snapshotToApi(await m.removeSnapshot(req.params.ref)));
  app.post<{ Params: { ref: string } }>(restoreRoute.url, async (req, reply) => {
    const body = parseWith(RestoreRequest, req.body ?? {}, 'restore request');
    return runLong(req, reply, deps, async (progress) => toApi(await m.restore(req.params.ref, body, { onProgress: progress })));
  });
  app.post<{ Params: { ref: string } }>(forkRoute.url, async (req, reply) => {
    const body = parseWith(ForkRequest, req.body, 'fork request');
    return runLong(req, reply, deps, async (progress) => ({ sandboxes: (await m.fork(req.params.ref, body, { onProgress: progress })).map(toApi) }));
  });
}
