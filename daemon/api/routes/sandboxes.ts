/**
 * The sandbox resource: create, list, get, destroy, stop, start, pause, resume. A create
 * asked with `Accept: application/x-ndjson` streams its phases (daemon/sandbox/progress.ts)
 * as `{type:"progress", phase, id, message}` lines before the `{type:"result"}` line
 * (daemon/api/long.ts). The batched create is in ./sandboxes-batch.ts.
 */
import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { AckRequest, AckResult, CreateSandboxRequest, DeleteQuery, ListQuery, PauseResult, Sandbox, SandboxList, StopRequest } from '../schema.js';
import { sandboxInput, sandboxView } from '../convert.js';
import { runCreate, type CreateDeps } from '../creates.js';
import { parseWith } from '../parse.js';
import { scopeOf } from '../scope.js';
import { route } from './table.js';
import type { Metrics } from '../../metrics.js';
import type { SandboxNetworking } from '../../net/network.js';
import type { SandboxCreator } from '../../sandbox/create.js';
import type { DiskQuotaWatch } from '../../sandbox/disk-quota.js';
import type { SandboxLifecycle } from '../../sandbox/lifecycle.js';
import type { RoundService } from '../../sandbox/rounds.js';

const createRoute = route({
  method: 'POST', url: '/v1/sandboxes', summary: 'Create and start a sandbox. With `Accept: application/x-ndjson` the answer is a stream: {type:"progress", phase, id, message} lines (phases rootfs, launch, boot, ready), then {type:"result", result} or {type:"error", error}.', body: CreateSandboxRequest, status: 201, response: Sandbox,
  errors: ['InvalidArgument', 'NotFound', 'ResourceExhausted', 'Unimplemented', 'Unavailable'],
});
const ackRoute = route({
  method: 'POST', url: '/v1/sandboxes:ack', summary: 'Acknowledge creates a gateway relayed with `x-dsec-create-ack: gateway`: their answers reached the client, so their sandboxes are no longer destroyed at the acknowledgement deadline (daemon/sandbox/create-records.ts).',
  body: AckRequest, status: 200, response: AckResult, errors: ['InvalidArgument'],
});
const listRoute = route({ method: 'GET', url: '/v1/sandboxes', summary: "List the caller's tenant's sandboxes (every tenant's for an admin), optionally by label selector and state.", query: ListQuery, status: 200, response: SandboxList, errors: ['InvalidArgument'] });
const getRoute = route({ method: 'GET', url: '/v1/sandboxes/:id', summary: 'One sandbox, with the defences in force for it and its writable layer\'s disk use.', status: 200, response: Sandbox, errors: ['NotFound'] });
const deleteRoute = route({
  method: 'DELETE', url: '/v1/sandboxes/:id', summary: 'Destroy a sandbox (force=true to destroy a running one).', query: DeleteQuery, status: 200, response: Sandbox,
  errors: ['NotFound', 'FailedPrecondition'],
});
const stopRoute = route({
  method: 'POST', url: '/v1/sandboxes/:id/stop', summary: 'Stop every process (SIGTERM, then SIGKILL after timeout_ms); the writable layer stays.', body: StopRequest,
  status: 200, response: Sandbox, errors: ['InvalidArgument', 'NotFound', 'FailedPrecondition'],
});
const startRoute = route({ method: 'POST', url: '/v1/sandboxes/:id/start', summary: 'Start a stopped sandbox on its writable layer.', status: 200, response: Sandbox, errors: ['NotFound', 'FailedPrecondition'] });
const pauseRoute = route({ method: 'POST', url: '/v1/sandboxes/:id/pause', summary: 'Freeze every process and reclaim memory; idempotent.', status: 200, response: PauseResult, errors: ['NotFound', 'FailedPrecondition'] });
const resumeRoute = route({ method: 'POST', url: '/v1/sandboxes/:id/resume', summary: 'Thaw a paused sandbox; idempotent.', status: 200, response: Sandbox, errors: ['NotFound', 'FailedPrecondition'] });

/** What the sandbox routes use. */
export interface SandboxRouteDeps extends CreateDeps {
  creator: Pick<SandboxCreator, 'create'>;
  lifecycle: Pick<SandboxLifecycle, 'get' | 'list' | 'destroy' | 'stop' | 'start' | 'defences'>;
  rounds: Pick<RoundService, 'pause' | 'resume'>;
  disks: Pick<DiskQuotaWatch, 'usage'>;
  /** Sandbox networking: its per-sandbox defences join GET of a sandbox. */
  network?: { networking: Pick<SandboxNetworking, 'sandboxDefences'> };
  metrics: Pick<Metrics, 'createSeconds' | 'errors'>;
  log: Logger;
}

/** Registers the sandbox routes. */
export function registerSandboxRoutes(app: FastifyInstance, deps: SandboxRouteDeps): void {
  const lc = deps.lifecycle;
  // A call naming a sandbox acknowledges its create (daemon/sandbox/create-records.ts): the caller knows it.
  const records = deps.createRecords;
  if (records) {
    app.addHook('preHandler', async (req) => {
      const id = (req.params as { id?: unknown } | undefined)?.id;
      if (typeof id === 'string' && req.routeOptions.url?.startsWith('/v1/sandboxes/:id')) records.used(id);
    });
  }
  app.post(createRoute.url, async (req, reply) => {
    const body = parseWith(CreateSandboxRequest, req.body, 'create request');
    // With `Accept: application/x-ndjson`, the phases stream first (daemon/sandbox/progress.ts).
    return runCreate(req, reply, deps, body, async (progress) => {
      const end = deps.metrics.createSeconds.startTimer({ backend: body.backend });
      const sb = await deps.creator.create({ ...sandboxInput(body), tenant: scopeOf(req).tenant }, { onProgress: progress });
      end();
      return sandboxView(sb);
    });
  });
  // `::` is fastify's escape for a literal colon (unescaped, `:ack` would be a parameter matching `/v1/sandboxes<anything>`).
  app.post(ackRoute.url.replace(':', '::'), async (req) => {
    const body = parseWith(AckRequest, req.body, 'ack request');
    // Only the caller's tenant's sandboxes (every tenant's for a gateway acting as admin):
    // another tenant's id counts as unknown, so no tenant keeps another's create from its deadline.
    const scope = scopeOf(req);
    const ids = body.ids.filter((id) => {
      try {
        lc.get(id, scope);
        return true;
      } catch {
        return false;
      }
    });
    return { acknowledged: deps.createRecords?.ack(ids) ?? 0 };
  });
  app.get(listRoute.url, async (req) => {
    const q = parseWith(ListQuery, req.query, 'query');
    return { sandboxes: lc.list(q.selector, q.state, scopeOf(req)).map(sandboxView) };
  });
  app.delete(listRoute.url, async (_req, reply) =>
    reply.code(405).header('allow', 'GET, POST').send({
      error: { code: 'InvalidArgument', message: 'DELETE on the sandbox collection is not allowed; destroy sandboxes by id (DELETE /v1/sandboxes/{id})' },
    }));
  app.get<{ Params: { id: string } }>(getRoute.url, async (req) => {
    const sb = lc.get(req.params.id, scopeOf(req));
    return { ...sandboxView(sb), defences: { ...(await lc.defences(sb)), ...deps.network?.networking.sandboxDefences(sb) }, disk_used_bytes: deps.disks.usage(sb.id)?.usedBytes ?? null };
  });
  app.delete<{ Params: { id: string } }>(deleteRoute.url, async (req) => {
    const q = parseWith(DeleteQuery, req.query, 'query');
    return sandboxView(await lc.destroy(req.params.id, q.force === 'true' || q.force === '1'));
  });
  app.post<{ Params: { id: string } }>(stopRoute.url, async (req) => {
    const body = parseWith(StopRequest, req.body ?? {}, 'stop request');
    return sandboxView(await lc.stop(req.params.id, body.timeout_ms));
  });
  app.post<{ Params: { id: string } }>(startRoute.url, async (req) => sandboxView(await lc.start(req.params.id)));
  app.post<{ Params: { id: string } }>(pauseRoute.url, async (req) => {
    const r = await deps.rounds.pause(req.params.id);
    return { sandbox: sandboxView(r.sandbox), reclaim: r.reclaim };
  });
  app.post<{ Params: { id: string } }>(resumeRoute.url, async (req) => sandboxView(await deps.rounds.resume(req.params.id)));
}
