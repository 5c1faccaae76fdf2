/**
 * The HTTP+JSON API on a Unix socket (fastify). Parsing is done with the zod schemas of
 * daemon/api/schema.ts; every error leaves as `{ error: { code, message } }` with the
 * status of its kind (daemon/errors.ts), and a bug never takes the daemon down.
 */
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyRequest } from 'fastify';
import websocket from '@fastify/websocket';
import { DsecError, invalidArgument, notFound } from '../errors.js';
import { parseJson } from './parse.js';
import { BODY_LIMIT_BYTES, sendError } from './reply.js';
import { ROUTE_DOCS, type RouteDoc } from './routes/table.js';
import { registerConsoleRoutes, type ConsoleRouteDeps } from './routes/console.js';
import { registerEventRoutes, type EventRouteDeps } from './routes/events.js';
import { registerExecChannelRoute } from './routes/exec-channel.js';
import { registerExecRoute, registerExecSessionRoutes, type ExecRouteDeps, type ExecSessionRouteDeps } from './routes/execs.js';
import { registerFileRoutes, type FileRouteDeps } from './routes/files.js';
import { registerLayerBlobRoutes } from './routes/layer-blobs.js';
import { registerHostRoutes, type HostRouteDeps } from './routes/host.js';
import { registerImageRoutes, type ImageRouteDeps } from './routes/images.js';
import { registerNetworkRoutes, type NetworkRouteDeps } from './routes/network.js';
import { registerRoundRoutes, type RoundRouteDeps } from './routes/rounds.js';
import { registerRunChannelRoute, registerRunCodeRoute, registerRunRoutes, type RunCodeRouteDeps, type RunRouteDeps } from './routes/run.js';
import { registerSandboxRoutes, type SandboxRouteDeps } from './routes/sandboxes.js';
import { registerBatchCreateRoute } from './routes/sandboxes-batch.js';
import { registerSecurityRoutes, type SecurityRouteDeps } from './routes/security.js';
import { registerSnapshotRoutes, type SnapshotRouteDeps } from './routes/snapshots.js';
import { registerStatsRoutes, type StatsRouteDeps } from './routes/stats.js';
import { registerTrajectoryRoutes, type TrajectoryRouteDeps } from './routes/trajectories.js';
import { registerTokenRoutes, type TokenRouteDeps } from './routes/tokens.js';
import { registerTemplateRoutes, type TemplateRouteDeps } from './routes/templates.js';
import { unixDoor, type ApiDoor } from '../remote/door.js';
import { assertScoped, installTenancy } from './tenancy.js';
import type { Logger } from 'pino';
import type { Metrics } from '../metrics.js';

/**
 * Everything the routes use: the union of each route module's own deps (each route is
 * given only its part). Built by the daemon (daemon/main.ts).
 */
export type ApiDeps = SandboxRouteDeps & ExecRouteDeps & ExecSessionRouteDeps & ConsoleRouteDeps & FileRouteDeps & EventRouteDeps
  & StatsRouteDeps & ImageRouteDeps & RoundRouteDeps & SnapshotRouteDeps & TrajectoryRouteDeps & RunRouteDeps & NetworkRouteDeps
  & SecurityRouteDeps & HostRouteDeps & TokenRouteDeps & TemplateRouteDeps & { log: Logger; metrics: Metrics };

/** Regex matching concrete paths of a fastify-style route (`:param` = one segment). */
function routeRegex(url: string): RegExp {
  return new RegExp(`^${url.replace(/[.*+?^${}()|[\]\\]/g, '\\$&').replace(/\/:[a-z_]+/g, '/[^/]+')}/?$`);
}

/**
 * Builds the fastify app with every route; the caller listens.
 * @param door the Unix socket's (default: every caller is the local admin) or the TCP door's (daemon/remote/door.ts)
 */
export function buildApi(deps: ApiDeps, door: ApiDoor = unixDoor(null)): FastifyInstance {
  const app = baseApp(deps, ROUTE_DOCS, door);
  // Every path parameter has a tenant scope (or dsecd does not start), and a sandbox id
  // the caller's tenant does not own is NotFound before any route runs.
  assertScoped(ROUTE_DOCS);
  installTenancy(app, deps);
  registerHostRoutes(app, deps);
  registerTokenRoutes(app, deps);
  registerSandboxRoutes(app, deps);
  registerBatchCreateRoute(app, deps);
  registerExecRoute(app, deps);
  registerEventRoutes(app, deps);
  registerImageRoutes(app, deps);
  registerStatsRoutes(app, deps);
  registerRoundRoutes(app, deps);
  registerSnapshotRoutes(app, deps);
  registerTrajectoryRoutes(app, deps);
  registerRunRoutes(app, deps);
  registerNetworkRoutes(app, deps);
  registerSecurityRoutes(app, deps);
  registerTemplateRoutes(app, deps);
  app.register(websocket, { options: { maxPayload: 1024 * 1024 }, errorHandler: webSocketError });
  app.register(async (scoped) => registerExecSessionRoutes(scoped, deps));
  app.register(async (scoped) => registerExecChannelRoute(scoped, deps));
  app.register(async (scoped) => registerRunChannelRoute(scoped, deps));
  app.register(async (scoped) => registerConsoleRoutes(scoped, deps));
  app.register(async (scoped) => registerFileRoutes(scoped, deps));
  app.register(async (scoped) => registerLayerBlobRoutes(scoped, deps));
  return app;
}

/**
 * What becomes of an error on an accepted WebSocket: the socket is dropped, and the error
 * is logged as dsecd's (level error) unless the client caused it: a frame the protocol or
 * dsecd's limits refuse (`ws`'s receiver names those `WS_ERR_*`: over 1 MiB, unmasked,
 * bad UTF-8, a bad opcode). Those are logged at debug, so a client cannot fill the error
 * log with them. (A connection the client cut is no error here: `ws` handles its socket's
 * errors itself and only closes.)
 */
function webSocketError(err: Error, socket: { terminate(): void }, req: FastifyRequest): void {
  const code = (err as NodeJS.ErrnoException).code;
  if (typeof code === 'string' && code.startsWith('WS_ERR_')) req.log.debug({ err }, 'websocket closed on a client error');
  else req.log.error({ err }, 'websocket error');
  socket.terminate();
}

/**
 * The SandboxFusion endpoint alone (POST /run_code), for the TCP address of
 * `[sandboxfusion] address`: nothing else of the API is reachable over TCP.
 */
export function buildRunCodeApi(deps: RunCodeRouteDeps & { log: Logger; metrics: Metrics }): FastifyInstance {
  const app = baseApp(deps, ROUTE_DOCS.filter((r) => r.url === '/run_code'), unixDoor(null));
  registerRunCodeRoute(app, deps);
  return app;
}

/**
 * A fastify app with the API's body parsing, limits and error shapes, and no routes.
 * @param served the routes it will serve: a known path with another method is 405, anything else 404.
 */
function baseApp(deps: { log: Logger; metrics: Metrics }, served: readonly RouteDoc[], door: ApiDoor): FastifyInstance {
  const app = Fastify({
    ...door.serverOptions,
    // Errors the HTTP parser raises before fastify routes (headers too large, unknown
    // method, malformed request line) also answer in the API's error shape.
    clientErrorHandler: (err: NodeJS.ErrnoException & { code?: string }, socket) => {
      const tooLarge = err.code === 'HPE_HEADER_OVERFLOW';
      // A client too slow to send its headers or request (the TCP door's headers_timeout_s, request_timeout_s).
      const timedOut = err.code === 'ERR_HTTP_REQUEST_TIMEOUT';
      const body = JSON.stringify({ error: timedOut ? { code: 'DeadlineExceeded', message: 'request not received in time' } : { code: 'InvalidArgument', message: tooLarge ? 'request headers too large' : `malformed HTTP request: ${err.message}` } });
      if (socket.writable) {
        socket.end(`HTTP/1.1 ${tooLarge ? '431 Request Header Fields Too Large' : timedOut ? '408 Request Timeout' : '400 Bad Request'}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
      } else {
        socket.destroy(err);
      }
    },
    // Per-request access logs are at info level; the API logger keeps warnings and errors only.
    loggerInstance: deps.log.child({ component: 'api' }, { level: 'warn' }) as unknown as FastifyBaseLogger,
    bodyLimit: BODY_LIMIT_BYTES,
    // Image refs (up to 255 characters, URL-encoded) and digests are path parameters.
    routerOptions: { maxParamLength: 1024 },
    // A malformed URL or an overlong path parameter answers in the API's error shape too.
    frameworkErrors: (e, req, reply) => sendError(reply, invalidArgument(`${e.message}`), deps.log, req, deps.metrics),
    return503OnClosing: true,
    // On shutdown, idle keep-alive connections close at once and requests in flight
    // (an exec) finish; the daemon bounds the wait (see daemon/main.ts).
    forceCloseConnections: 'idle',
  }) as unknown as FastifyInstance;
  door.install(app);
  // An upgrade request refused before @fastify/websocket's own hooks ran (a door's 401 or
  // 403, the tenancy hook's 404) is answered on a socket no HTTP server tracks: close it
  // once the answer is out, or it stays open and dsecd's shutdown waits for it forever.
  app.addHook('onResponse', async (req, reply) => {
    if (reply.statusCode !== 101 && /websocket/i.test(String(req.headers.upgrade ?? '')) && !req.raw.socket.destroyed) req.raw.socket.destroy();
  });
  // JSON bodies: empty is allowed (POST .../stop has none); malformed JSON is InvalidArgument.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'string' }, (_req, body, done) => {
    const s = (body as string).trim();
    if (s === '') return done(null, undefined);
    try {
      done(null, parseJson(s));
    } catch (e) {
      done(e instanceof DsecError ? e : invalidArgument(`malformed JSON body: ${(e as Error).message}`), undefined);
    }
  });
  app.setErrorHandler((e, req, reply) => sendError(reply, e, deps.log, req, deps.metrics));
  app.setNotFoundHandler((req, reply) => {
    const p = req.url.split('?')[0];
    const allowed = served.filter((r) => routeRegex(r.url).test(p)).map((r) => r.method);
    if (allowed.length) {
      // A known resource with a method it does not support: 405 with Allow, in the usual error shape.
      return reply.code(405).header('allow', [...new Set(allowed)].join(', ')).type('application/json')
        .send({ error: { code: 'InvalidArgument', message: `${req.method} is not allowed on ${p}; allowed: ${[...new Set(allowed)].join(', ')}` } });
    }
    return sendError(reply, notFound(`no route ${req.method} ${p}`), deps.log, req, deps.metrics);
  });
  return app;
}
