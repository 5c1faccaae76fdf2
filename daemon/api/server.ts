/**
 * The HTTP+JSON API (fastify), served on the Unix socket and, with `--listen`, on the TCP
 * door (daemon/remote/door.ts): the same routes on both, each door adding its hooks. Parsing is done with the zod schemas of
 * daemon/api/schema.ts; every error leaves as `{ error: { code, message } }` with the
 * status of its kind (daemon/errors.ts), and a bug never takes the daemon down.
 */
import type { LanguageImages } from '../fncall/runcode.js';
import type { FncallPools } from '../fncall/pool.js';
import { registerRunCodeRoute, registerRunRoutes } from './routes/run.js';
import type { TrajectoryLog } from '../sandbox/trajectory.js';
import { registerSnapshotRoutes } from './routes/snapshots.js';
import { registerTrajectoryRoutes } from './routes/trajectories.js';
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { z } from 'zod';
import type { PolicyReloadResult, SeccompProfileInfo } from './schema.js';
import { DsecError, invalidArgument, notFound } from '../errors.js';
import type { SandboxManager } from '../sandbox/manager.js';
import type { SandboxRepo } from '../sandbox/repo.js';
import type { ImageStore } from '../image/store.js';
import type { Failpoints } from '../sandbox/failpoints.js';
import type { Metrics } from '../metrics.js';
import { registerSandboxRoutes } from './routes/sandboxes.js';
import { registerEventRoutes } from './routes/events.js';
import { registerImageRoutes } from './routes/images.js';
import { ROUTE_DOCS, type RouteDoc } from './routes/table.js';
import { registerExecRoutes } from './routes/execs.js';
import { registerConsoleRoutes } from './routes/console.js';
import { registerStatsRoutes } from './routes/stats.js';
import { registerFileRoutes } from './routes/files.js';
import { registerJobRoutes } from './routes/jobs.js';
import websocket from '@fastify/websocket';
import { registerHostRoutes, type HostInfoProvider } from './routes/host.js';
import { registerNetworkRoutes } from './routes/network.js';
import { registerSecurityRoutes } from './routes/security.js';
import type { SandboxNetworking } from '../net/network.js';
import type { PolicySet } from '../security/egress-policy.js';
import { noteErrorKind } from '../remote/audit.js';
import { unixDoor, type ApiDoor } from '../remote/door.js';
import type { TokenService } from '../remote/tokens.js';
import { registerTokenRoutes } from './routes/tokens.js';
import { registerTemplateRoutes } from './routes/templates.js';
import type { E2bFront } from './e2b/front.js';

/** What routes need. */
export interface ApiDeps {
  manager: SandboxManager;
  repo: SandboxRepo;
  images: ImageStore;
  host: HostInfoProvider;
  failpoints: Failpoints;
  metrics: Metrics;
  log: Logger;
  /** The trajectory log (routes/trajectories.ts). */
  trajectories: TrajectoryLog;
  /** The fncall pools (routes/run.ts). */
  fncall: FncallPools;
  /** Image per language of POST /run_code (config `[sandboxfusion] images`). */
  sandboxfusionImages: LanguageImages;
  /** The seccomp profile in force and its reload (routes/security.ts). */
  security: {
    /** @returns the file, sha256 and denied-syscall count of the profile in force. */
    seccompInfo(): SeccompProfileInfo;
    /** Loads the configured profile file again. @throws DsecError InvalidArgument naming the file and field (the profile in force stays). */
    reloadSeccomp(): SeccompProfileInfo;
  };
  /** API tokens of the TCP door (routes/tokens.ts; admin only). */
  tokens: TokenService;
  /** Sandbox networking and network policies (routes/network.ts); absent: those routes answer Unimplemented. */
  network?: {
    networking: SandboxNetworking;
    policies: PolicySet;
    /** Reloads the policy files and re-applies changed ones. @throws DsecError InvalidArgument (the previous set stays). */
    reload(): Promise<PolicyReloadResult>;
  };
  /** The E2B front (daemon/api/e2b): its routes on the TCP door, its template aliases on both doors; absent with `[e2b] enabled = false`. */
  e2b?: E2bFront;
}

/** Largest request body: 32 MiB (16 MiB of stdin as base64 plus headroom). */
export const BODY_LIMIT_BYTES = 32 * 1024 * 1024;

/**
 * Parses `input` with `schema`, turning zod issues into one InvalidArgument message
 * such as `memory_bytes: Too small: expected number to be >=4194304; unknown field "foo"`.
 * An absent body (`undefined`: the request had none) parses as `{}`; a JSON `null` is
 * parsed as given, so a route whose schema is an object refuses it.
 */
export function parseWith<S extends z.ZodType>(schema: S, input: unknown, what: string): z.infer<S> {
  const r = schema.safeParse(input === undefined ? {} : input);
  if (r.success) return r.data;
  const msg = r.error.issues
    .map((i) => {
      if (i.code === 'unrecognized_keys') return `unknown field${i.keys.length > 1 ? 's' : ''} ${i.keys.map((k) => `"${k}"`).join(', ')}`;
      return `${i.path.length ? i.path.join('.') + ': ' : ''}${i.message}`;
    })
    .join('; ');
  throw invalidArgument(`invalid ${what}: ${msg}`);
}

/** Sends a DsecError (or any thrown value, as Internal) in the API error shape. */
export function sendError(reply: FastifyReply, e: unknown, log: Logger, req?: FastifyRequest, metrics?: Metrics): FastifyReply {
  let err: DsecError;
  if (e instanceof DsecError) err = e;
  else if (e && typeof e === 'object' && 'statusCode' in e && typeof (e as { statusCode: unknown }).statusCode === 'number' && (e as { statusCode: number }).statusCode < 500) {
    // fastify's own client errors (body too large, bad content type, malformed JSON)
    const fe = e as { statusCode: number; message: string };
    // A body over the limit never succeeds on retry: InvalidArgument, not the retryable ResourceExhausted.
    err = new DsecError('InvalidArgument', fe.statusCode === 413 ? `request body larger than ${BODY_LIMIT_BYTES} bytes` : fe.message);
  } else {
    log.error({ err: e, url: req?.url }, 'internal error');
    err = new DsecError('Internal', `internal error: ${(e as Error)?.message ?? String(e)}`);
  }
  if (err.kind === 'Internal') log.error({ err, cause: err.cause, url: req?.url }, 'request failed');
  metrics?.errors.inc({ code: err.kind });
  noteErrorKind(reply, err.kind);
  if (err.kind === 'Unauthenticated' || err.kind === 'PermissionDenied') reply.header('cache-control', 'no-store');
  return reply.code(err.status).type('application/json').send({ error: { code: err.kind, message: err.message, ...(err.reason ? { reason: err.reason } : {}) } });
}

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
  registerHostRoutes(app, deps);
  registerTokenRoutes(app, deps);
  registerSandboxRoutes(app, deps);
  registerEventRoutes(app, deps);
  registerImageRoutes(app, deps);
  registerStatsRoutes(app, deps);
  registerJobRoutes(app, deps);
  registerSnapshotRoutes(app, deps);
  registerTrajectoryRoutes(app, deps);
  registerRunRoutes(app, deps);
  registerNetworkRoutes(app, deps);
  registerSecurityRoutes(app, deps);
  registerTemplateRoutes(app, deps);
  app.register(websocket, { options: { maxPayload: 1024 * 1024 } });
  app.register(async (scoped) => registerExecRoutes(scoped, deps));
  app.register(async (scoped) => registerConsoleRoutes(scoped, deps));
  app.register(async (scoped) => registerFileRoutes(scoped, deps));
  return app;
}

/**
 * The SandboxFusion endpoint alone (POST /run_code), for the TCP address of
 * `[sandboxfusion] address`: nothing else of the API is reachable over TCP.
 */
export function buildRunCodeApi(deps: ApiDeps): FastifyInstance {
  const app = baseApp(deps, ROUTE_DOCS.filter((r) => r.url === '/run_code'), unixDoor(null));
  registerRunCodeRoute(app, deps);
  return app;
}

/**
 * A fastify app with the API's body parsing, limits and error shapes, and no routes.
 * @param served the routes it will serve: a known path with another method is 405, anything else 404.
 */
function baseApp(deps: ApiDeps, served: readonly RouteDoc[], door: ApiDoor): FastifyInstance {
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
  // JSON bodies: empty is allowed (POST .../stop has none); malformed JSON is InvalidArgument.
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'string' }, (_req, body, done) => {
    const s = (body as string).trim();
    if (s === '') return done(null, undefined);
    try {
      // `__proto__` keys would be dropped silently by object handling downstream: refuse them.
      done(null, JSON.parse(s, (k, v) => {
        if (k === '__proto__') throw invalidArgument('"__proto__" is not allowed as a key');
        return v;
      }));
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
