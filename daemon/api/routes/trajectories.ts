/** The trajectory log: list, show, export (JSONL) and remove. Steps are recorded by exec (routes/execs.ts). */
import { Readable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import { TrajectoryDetail, TrajectoryList, TrajectoryRecord, TrajectoryRemoved } from '../schema.js';
import { route } from './table.js';
import { scopeOf } from '../scope.js';
import type { TrajectoryLog } from '../../sandbox/trajectory.js';

const listRoute = route({ method: 'GET', url: '/v1/trajectories', summary: "The caller's tenant's trajectories on this host (every tenant's for an admin), most recently updated first.", status: 200, response: TrajectoryList, errors: [] });
const getRoute = route({ method: 'GET', url: '/v1/trajectories/:id', summary: "One trajectory of the caller's tenant and its steps (without output).", status: 200, response: TrajectoryDetail, errors: ['NotFound'] });
const exportRoute = route({
  method: 'GET', url: '/v1/trajectories/:id/export', summary: 'Every step with its request and full output, as JSONL in step order (for training pipelines).',
  status: 200, response: TrajectoryRecord, ndjson: true, errors: ['NotFound'],
});
const delRoute = route({
  method: 'DELETE', url: '/v1/trajectories/:id', summary: 'Remove a trajectory; its id stays reserved (re-using it is FailedPrecondition trajectory_removed).',
  status: 200, response: TrajectoryRemoved, errors: ['NotFound', 'Conflict'],
});

/** What the trajectory routes use. */
export interface TrajectoryRouteDeps {
  trajectories: TrajectoryLog;
}

/** Registers the trajectory routes. */
export function registerTrajectoryRoutes(app: FastifyInstance, deps: TrajectoryRouteDeps): void {
  const log = deps.trajectories;
  app.get(listRoute.url, async (req) => ({ trajectories: log.list(scopeOf(req)) }));
  app.get<{ Params: { id: string } }>(getRoute.url, async (req) => log.get(req.params.id, scopeOf(req)));
  app.get<{ Params: { id: string } }>(exportRoute.url, async (req, reply) => {
    const records = log.export(req.params.id, scopeOf(req));
    const first = records.next(); // throws NotFound before any byte is sent
    function* lines() {
      for (let r = first; !r.done; r = records.next()) yield JSON.stringify(r.value) + '\n';
    }
    return reply.type('application/x-ndjson').header('cache-control', 'no-store').send(Readable.from(lines()));
  });
  app.delete<{ Params: { id: string } }>(delRoute.url, async (req) => ({ id: req.params.id, removed_steps: log.remove(req.params.id, Date.now(), scopeOf(req)) }));
}
