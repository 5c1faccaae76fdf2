/** One-shot runs on any tier: POST /v1/run, POST /v1/run:batch and the run channel (GET /v1/run/channel). */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { WebSocket } from 'ws';
import { notUpgraded, serveChannel } from '../channel.js';
import { ExecResult, RunBatchRequest, RunBatchResult, RunRequest } from '../schema.js';
import { parseWith } from '../parse.js';
import { runInput } from '../convert.js';
import { scopeOf } from '../scope.js';
import { runBatch, runOnce } from '../../fncall/run.js';
import { RunCodeRequest, RunCodeResponse, runCode } from '../../fncall/runcode.js';
import { route } from './table.js';
import type { FncallPools } from '../../fncall/pool.js';
import type { RunServices } from '../../fncall/run.js';
import type { LanguageImages } from '../../fncall/runcode.js';

const runRoute = route({
  method: 'POST', url: '/v1/run', summary: 'Run one command in a fresh environment of any tier (fncall: a pooled isolated worker; container: create, exec, destroy).',
  body: RunRequest, status: 200, response: ExecResult, errors: ['InvalidArgument', 'NotFound', 'ResourceExhausted', 'Unimplemented', 'Unavailable'],
});
const batchRoute = route({
  method: 'POST', url: '/v1/run:batch', summary: 'Run many one-shot calls concurrently; one result or error per call, in order.',
  body: RunBatchRequest, status: 200, response: RunBatchResult, errors: ['InvalidArgument', 'ResourceExhausted'],
});

const channelRoute = route({
  method: 'GET', url: '/v1/run/channel',
  summary: 'WebSocket: one-shot runs as POST /v1/run takes them, many on one connection, answers matched by request id (see daemon/api/channel.ts for the message format).',
  status: 101, response: null, errors: [],
});

/** Action of a run channel request's audit line. */
export const RUN_CHANNEL_AUDIT_ACTION = 'RUN /v1/run/channel';

const runCodeRoute = route({
  method: 'POST', url: '/run_code', summary: 'SandboxFusion-compatible: compile and run code (python, bash, c, cpp) on the fncall tier; timeouts in seconds.',
  body: RunCodeRequest, status: 200, response: RunCodeResponse, errors: ['InvalidArgument', 'FailedPrecondition', 'ResourceExhausted'],
});

/** What the run_code route uses. */
export interface RunCodeRouteDeps {
  fncall: FncallPools;
  /** Image per language of POST /run_code (config `[sandboxfusion] images`). */
  sandboxfusionImages: LanguageImages;
}

/** What the run routes use: the pools, and the lifecycle a one-shot container run goes through. */
export interface RunRouteDeps extends RunCodeRouteDeps, RunServices {}

/** Registers POST /run_code (on the API socket, and alone on the SandboxFusion TCP address). */
export function registerRunCodeRoute(app: FastifyInstance, deps: RunCodeRouteDeps): void {
  app.post(runCodeRoute.url, async (req) => runCode(deps.fncall, parseWith(RunCodeRequest, req.body, 'run_code request'), deps.sandboxfusionImages));
}

/** A signal that aborts when the client leaves before its answer was sent. */
function clientGone(reply: FastifyReply): AbortSignal {
  const gone = new AbortController();
  reply.raw.on('close', () => {
    if (!reply.raw.writableFinished) gone.abort();
  });
  return gone.signal;
}

/**
 * Spends one create of the caller's token budget (daemon/remote/door.ts `spendCreates`,
 * TCP door only) per `container` call: each creates a sandbox; fncall calls create none.
 * @throws DsecError ResourceExhausted when the budget has fewer left.
 */
async function spendContainerCreates(req: FastifyRequest, calls: RunRequest[]): Promise<void> {
  const n = calls.filter((c) => c.backend !== 'fncall').length;
  if (n > 0) await req.spendCreates?.(n);
}

/** Registers the run routes. */
export function registerRunRoutes(app: FastifyInstance, deps: RunRouteDeps): void {
  app.post(runRoute.url, async (req, reply) => {
    const body = parseWith(RunRequest, req.body, 'run request');
    await spendContainerCreates(req, [body]);
    return runOnce(deps, deps.fncall, { ...runInput(body), tenant: scopeOf(req).tenant }, clientGone(reply));
  });
  // `::` is fastify's escape for a literal colon in a path.
  app.post(batchRoute.url.replace(':', '::'), async (req, reply) => {
    const b = parseWith(RunBatchRequest, req.body, 'batch request');
    await spendContainerCreates(req, b.calls);
    const tenant = scopeOf(req).tenant;
    return { results: await runBatch(deps, deps.fncall, b.calls.map((c) => ({ ...runInput(c), tenant })), clientGone(reply)) };
  });
  registerRunCodeRoute(app, deps);
}

/**
 * Registers the run channel (GET /v1/run/channel): POST /v1/run's requests and answers
 * over one WebSocket, many in flight, with the protocol, limits and per-request audit
 * lines of daemon/api/channel.ts. For a reward loop that makes thousands of fncall calls:
 * the HTTP request machinery and the door's checks are paid once per connection, not
 * once per call (docs/BENCHMARKS.md "fncall"). When the channel closes, its calls are
 * treated as POST /v1/run's are when their client leaves (daemon/fncall/run.ts runOnce):
 * an fncall call still waiting for a worker is dropped, a running one ends by its
 * timeout, a container call's sandbox is destroyed at once. Must run inside a context
 * where @fastify/websocket is registered.
 */
export function registerRunChannelRoute(app: FastifyInstance, deps: RunRouteDeps & { log: Logger }): void {
  app.route({ method: 'GET', url: channelRoute.url, handler: notUpgraded, wsHandler: (socket: WebSocket, req) => {
    serveChannel(socket, req, {
      auditAction: RUN_CHANNEL_AUDIT_ACTION,
      log: deps.log,
      logFields: { route: channelRoute.url },
      run: async (request, closed) => {
        const body = parseWith(RunRequest, request, 'run request');
        await spendContainerCreates(req, [body]);
        return runOnce(deps, deps.fncall, { ...runInput(body), tenant: scopeOf(req).tenant }, closed);
      },
    });
  } });
}
