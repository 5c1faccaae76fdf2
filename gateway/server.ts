/**
 * The gateway's API: dsecd's own `/v1` routes (the route table of daemon/api/routes/,
 * so a route dsecd gains is served here once it is classified), each answered by the
 * class it belongs to ({@link classify}), behind the same TCP door as dsecd's
 * (daemon/remote/door.ts: TLS 1.3, tokens, roles), plus the gateway's host routes and
 * E2B's API (gateway/e2b.ts).
 * Bodies are passed through unparsed (streamed) except where the gateway must read them
 * (creates, bulk).
 */
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import '../daemon/api/server.js';
import { ROUTE_DOCS, type RouteDoc } from '../daemon/api/routes/table.js';
import { sendError } from '../daemon/api/reply.js';
import { registerTokenRoutes } from '../daemon/api/routes/tokens.js';
import { DsecError, failedPrecondition, invalidArgument, notFound, unimplemented } from '../daemon/errors.js';
import type { ApiDoor } from '../daemon/remote/door.js';
import { DSEC_VERSION } from '../daemon/version.js';
import { identityOf, type GatewayContext } from './context.js';
import { placeAndForward } from './create.js';
import { placeBatch } from './batch.js';
import { applyAll, bulk, mergedEvents, mergedList, mergeMetrics, mergeStats } from './fanout.js';
import { registerHostRoutes } from './hosts.js';
import { registerE2bGatewayRoutes } from './e2b.js';
import { downMessage, forward, READ_LIMIT_BYTES, Router, UNREACHABLE } from './routing.js';
import type { Logger } from 'pino';

/** How the gateway answers a route of dsecd's API. */
export type RouteClass =
  /** Answered by the gateway itself (version, whoami, tokens, hosts). */
  | 'local'
  /** Routed by the sandbox id in the path to its host. */
  | 'sandbox'
  /** Placed on a host (a create or a one-shot run). */
  | 'create'
  /** Routed by the snapshot id (tag) or name (looked up) to its host. */
  | 'snapshot'
  /** Routed by looking the object up on every host (trajectories, one image, one layer, one lease). */
  | 'lookup'
  /** Every host's list merged. */
  | 'list'
  /** A batched create: placed per sandbox, sent as per-host sub-batches, merged in order (gateway/batch.ts). */
  | 'batch'
  /** Every host's results merged. */
  | 'bulk'
  /** Every host carries it out. */
  | 'all'
  /** Merged stream. */
  | 'events'
  | 'stats'
  | 'metrics'
  /** Acts on one host named by `?host=NAME` (imports read a path on that host). */
  | 'pinned'
  /** A route the gateway does not serve (405 on dsecd too, or not meaningful across hosts). */
  | 'none';

/**
 * The class of a route of dsecd's API (`METHOD url`, fastify-style). Every route of the
 * table must have one: test/unit/gateway-routes.test.ts checks the whole table, so a
 * route added to dsecd later fails there until it is classified here.
 */
export function classify(method: string, url: string): RouteClass {
  const k = `${method} ${url}`;
  if (['GET /v1/version', 'GET /v1/whoami', 'POST /v1/tokens', 'GET /v1/tokens', 'DELETE /v1/tokens/:id'].includes(k) || url.startsWith('/v1/hosts')) return 'local';
  if (k === 'POST /v1/sandboxes' || k === 'POST /v1/run' || k === 'POST /v1/run:batch' || k === 'POST /run_code') return 'create';
  if (k === 'POST /v1/sandboxes:batch') return 'batch';
  if (k === 'POST /v1/sandboxes/bulk') return 'bulk';
  if (k === 'DELETE /v1/sandboxes' || url === '/v1/layers/:digest/blob') return 'none';
  if (url.startsWith('/v1/sandboxes/:id')) return 'sandbox';
  if (url.startsWith('/v1/snapshots/:ref')) return 'snapshot';
  if (['GET /v1/trajectories/:id', 'DELETE /v1/trajectories/:id', 'GET /v1/trajectories/:id/export', 'GET /v1/images/:ref', 'GET /v1/layers/:digest', 'GET /v1/leases/:job'].includes(k)) return 'lookup';
  if (method === 'GET' && ['/v1/sandboxes', '/v1/snapshots', '/v1/trajectories', '/v1/images', '/v1/layers', '/v1/leases', '/v1/network/policies'].includes(url)) return 'list';
  if (['POST /v1/leases', 'POST /v1/leases/:job/renew', 'DELETE /v1/leases/:job', 'POST /v1/images', 'POST /v1/images/:ref/tag', 'DELETE /v1/images/:ref',
    'POST /v1/images/prune', 'POST /v1/security/seccomp/reload', 'POST /v1/network/policies/reload', 'GET /v1/security/seccomp',
    // E2B template aliases are each host's (daemon/api/e2b/templates.ts): set and removed on every host alike.
    'GET /v1/templates', 'PUT /v1/templates/:name', 'DELETE /v1/templates/:name'].includes(k)) return 'all';
  if (k === 'GET /v1/events') return 'events';
  if (k === 'GET /v1/stats') return 'stats';
  if (k === 'GET /metrics') return 'metrics';
  if (['POST /v1/images/import', 'POST /v1/images/bootstrap', 'GET /v1/host'].includes(k)) return 'pinned';
  return 'none';
}

/** The gateway's answer to `GET /v1/version`. */
export function versionInfo(): Record<string, string> {
  return { version: DSEC_VERSION, api: 'v1', role: 'gateway', node: process.version };
}

/** A fastify app shaped like dsecd's (error shape, limits), with bodies passed through unparsed. */
function baseApp(log: Logger, door: ApiDoor, metrics: GatewayContext['metrics']): FastifyInstance {
  const app = Fastify({
    ...door.serverOptions,
    loggerInstance: log.child({ component: 'api' }, { level: 'warn' }) as unknown as FastifyBaseLogger,
    bodyLimit: READ_LIMIT_BYTES,
    routerOptions: { maxParamLength: 1024 },
    frameworkErrors: (e, req, reply) => sendError(reply, invalidArgument(e.message), log, req),
    return503OnClosing: true,
    forceCloseConnections: 'idle',
  });
  app.removeAllContentTypeParsers();
  // The body stays a stream: routed calls pipe it to the host; the gateway's own reads bound it.
  app.addContentTypeParser('*', (_req, payload, done) => done(null, payload));
  app.setErrorHandler((e, req, reply) => {
    metrics.errors.inc({ code: e instanceof DsecError ? e.kind : 'Internal' });
    return sendError(reply, e, log, req);
  });
  app.setNotFoundHandler((req, reply) => sendError(reply, notFound(`no route ${req.method} ${req.url.split('?')[0]}`), log, req));
  door.install(app);
  return app;
}

/** The host a `pinned` route names (`?host=NAME`). @throws DsecError FailedPrecondition without one, NotFound for an unknown host. */
function pinnedHost(ctx: GatewayContext, req: FastifyRequest) {
  const name = new URLSearchParams(req.url.split('?')[1] ?? '').get('host');
  if (!name) throw failedPrecondition(`${req.method} ${req.url.split('?')[0]} acts on one host: add ?host=NAME (dsec hosts lists them)`);
  const h = ctx.table.hosts.get(name);
  if (!h?.info) throw notFound(`host ${name} not found`);
  return h;
}

/** The request's path with `host` taken out of its query (a pinned route's `?host=` is the gateway's). */
function withoutHostParam(url: string): string {
  const [p, q] = url.split('?');
  if (!q) return url;
  const s = new URLSearchParams(q);
  s.delete('host');
  const t = s.toString();
  return t ? `${p}?${t}` : p;
}

/**
 * Builds the gateway's app on `door` (the TCP door with the fleet's token store).
 * @returns the app and its router (tests read the router's caches).
 */
export function buildGateway(ctx: GatewayContext, door: ApiDoor): { app: FastifyInstance; router: Router } {
  const app = baseApp(ctx.log, door, ctx.metrics);
  const router = new Router(ctx);
  // The gateway's own routes read JSON bodies (in a scope of their own: elsewhere bodies pass through).
  app.register(async (scoped) => {
    scoped.removeAllContentTypeParsers();
    scoped.addContentTypeParser('*', { parseAs: 'string' }, (_req, body, done) => {
      const text = (body as string).trim();
      if (!text) return done(null, undefined);
      try {
        done(null, JSON.parse(text));
      } catch (e) {
        done(invalidArgument(`malformed JSON body: ${(e as Error).message}`), undefined);
      }
    });
    registerTokenRoutes(scoped, { tokens: ctx.tokens });
    registerHostRoutes(scoped, ctx, router);
    scoped.get('/v1/version', async () => versionInfo());
  });
  const handler = (doc: RouteDoc, cls: RouteClass) => async (req: FastifyRequest, reply: FastifyReply) => {
    const params = req.params as Record<string, string>;
    switch (cls) {
      case 'sandbox': {
        const id = params.id;
        const host = await router.hostOf(id, `/v1/sandboxes/${encodeURIComponent(id)}`, identityOf(req));
        if (host.state !== 'up' && req.method === 'GET' && doc.url === '/v1/sandboxes/:id') {
          const last = router.lastRows.get(host.name)?.get(id);
          return { ...(last ?? { id }), state: UNREACHABLE, host: host.name, error: downMessage(host, `sandbox ${id}`) };
        }
        if (req.method === 'DELETE' && doc.url === '/v1/sandboxes/:id') {
          // Its share of a fleet-wide quota is freed before the client hears it is gone.
          return forward(ctx, host, req, reply, `sandbox ${id}`, req.url, async (status) => {
            if (status !== 200) return;
            router.forget(id, host.name);
            await ctx.quotas.destroyed(identityOf(req).tenant, id);
          });
        }
        return forward(ctx, host, req, reply, `sandbox ${id}`);
      }
      case 'snapshot': {
        const ref = params.ref;
        const probe = `/v1/snapshots/${encodeURIComponent(ref)}`;
        const host = /^snap-[0-9a-f]{16}$/.test(ref) ? await router.hostOf(ref, probe, identityOf(req)) : await router.hostByLookup(`snapshot:${ref}`, probe, identityOf(req), `snapshot ${ref}`);
        return forward(ctx, host, req, reply, `snapshot ${ref}`);
      }
      case 'lookup': {
        const key = Object.values(params)[0];
        const probe = req.url.split('?')[0].replace(/\/export$/, '');
        const host = await router.hostByLookup(`${doc.url}:${key}`, probe, identityOf(req), `${doc.url.split('/')[2].replace(/s$/, '')} ${key}`);
        return forward(ctx, host, req, reply, `${key}`);
      }
      case 'create':
        return placeAndForward(ctx, router, req, reply, doc.url === '/v1/sandboxes' ? 'container' : 'fncall');
      case 'batch':
        return placeBatch(ctx, router, req, reply);
      case 'list':
        return mergedList(ctx, router, req);
      case 'bulk':
        return bulk(ctx, router, req);
      case 'all':
        return applyAll(ctx, req);
      case 'events':
        return mergedEvents(ctx, req, reply);
      case 'stats':
        return mergeStats(ctx, req);
      case 'metrics':
        return reply.type('text/plain; version=0.0.4').send(await mergeMetrics(ctx, req));
      case 'pinned': {
        const h = req.url.includes('host=') || doc.url !== '/v1/host' ? pinnedHost(ctx, req) : null;
        if (!h) {
          return { role: 'gateway', gateway: ctx.name, version: DSEC_VERSION, hosts: ctx.table.list().filter((x) => x.info).map((x) => ({ name: x.name, state: x.state })) };
        }
        return forward(ctx, h, req, reply, `host ${h.name}`, withoutHostParam(req.url));
      }
      default:
        throw unimplemented(`${req.method} ${doc.url} is not served through a gateway: call a host's own socket`);
    }
  };
  for (const doc of ROUTE_DOCS) {
    const cls = classify(doc.method, doc.url);
    if (cls === 'local') continue;
    // The WebSocket routes are answered on the server's upgrade event (gateway/ws.ts); a plain GET of them reaches the host, which refuses it as dsecd does.
    // A literal colon inside a segment (`/v1/sandboxes:batch`) is `::` to fastify; unescaped it would be a parameter.
    app.route({ method: doc.method, url: doc.url.replace(/([^/]):/g, '$1::'), handler: handler(doc, cls) });
  }
  // E2B's control plane and envd, routed to the hosts that serve them (gateway/e2b.ts).
  registerE2bGatewayRoutes(app, ctx, router);
  return { app, router };
}
