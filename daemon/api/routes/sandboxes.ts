/**
 * The sandbox resource: create, list, get, destroy, stop, start, exec. A create asked
 * with `Accept: application/x-ndjson` streams its phases (daemon/sandbox/progress.ts) as
 * `{type:"progress", phase, id, message}` lines before the `{type:"result"}` line
 * (daemon/api/long.ts).
 */
import type { FastifyInstance } from 'fastify';
import { CreateSandboxRequest, DeleteQuery, ExecRequest, ExecResult, ListQuery, Sandbox, SandboxList, StopRequest } from '../schema.js';
import { runLong } from '../long.js';
import { parseWith } from '../server.js';
import { toApi } from '../../sandbox/repo.js';
import { route } from './table.js';
import type { ApiDeps } from '../server.js';

const createRoute = route({
  method: 'POST', url: '/v1/sandboxes', summary: 'Create and start a sandbox. With `Accept: application/x-ndjson` the answer is a stream: {type:"progress", phase, id, message} lines (phases rootfs, launch, boot, ready), then {type:"result", result} or {type:"error", error}.', body: CreateSandboxRequest, status: 201, response: Sandbox,
  errors: ['InvalidArgument', 'NotFound', 'ResourceExhausted', 'Unimplemented', 'Unavailable'],
});
const listRoute = route({ method: 'GET', url: '/v1/sandboxes', summary: 'List sandboxes, optionally by label selector and state.', query: ListQuery, status: 200, response: SandboxList, errors: ['InvalidArgument'] });
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
const execRoute = route({
  method: 'POST', url: '/v1/sandboxes/:id/exec', summary: 'Run a command to completion inside the sandbox.', body: ExecRequest, status: 200, response: ExecResult,
  errors: ['InvalidArgument', 'NotFound', 'FailedPrecondition', 'Unavailable'],
});

/** Registers the sandbox routes. */
export function registerSandboxRoutes(app: FastifyInstance, deps: ApiDeps): void {
  const m = deps.manager;
  app.post(createRoute.url, async (req, reply) => {
    const body = parseWith(CreateSandboxRequest, req.body, 'create request');
    // With `Accept: application/x-ndjson`, the phases stream first (daemon/sandbox/progress.ts).
    return runLong(req, reply, deps, async (progress) => {
      const end = deps.metrics.createSeconds.startTimer({ backend: body.backend });
      const sb = await m.create(body, { onProgress: progress });
      end();
      return toApi(sb);
    });
  });
  app.get(listRoute.url, async (req) => {
    const q = parseWith(ListQuery, req.query, 'query');
    return { sandboxes: m.list(q.selector, q.state).map(toApi) };
  });
  app.delete(listRoute.url, async (_req, reply) =>
    reply.code(405).header('allow', 'GET, POST').send({
      error: { code: 'InvalidArgument', message: 'DELETE on the sandbox collection is not allowed; destroy sandboxes by id (DELETE /v1/sandboxes/{id})' },
    }));
  app.get<{ Params: { id: string } }>(getRoute.url, async (req) => {
    const sb = m.get(req.params.id);
    return { ...toApi(sb), defences: { ...(await m.defences(sb)), ...deps.network?.networking.sandboxDefences(sb) }, disk_used_bytes: m.diskUsage(sb.id)?.usedBytes ?? null };
  });
  app.delete<{ Params: { id: string } }>(deleteRoute.url, async (req) => {
    const q = parseWith(DeleteQuery, req.query, 'query');
    return toApi(await m.destroy(req.params.id, q.force === 'true' || q.force === '1'));
  });
  app.post<{ Params: { id: string } }>(stopRoute.url, async (req) => {
    const body = parseWith(StopRequest, req.body ?? {}, 'stop request');
    return toApi(await m.stop(req.params.id, body.timeout_ms));
  });
  app.post<{ Params: { id: string } }>(startRoute.url, async (req) => toApi(await m.start(req.params.id)));
  app.post<{ Params: { id: string } }>(execRoute.url, async (req) => {
    const body = parseWith(ExecRequest, req.body, 'exec request');
    const end = deps.metrics.execSeconds.startTimer();
    const r = await m.exec(req.params.id, body);
    end();
    return r;
  });
}
