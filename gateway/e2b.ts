/**
 * E2B's API through the gateway (docs/E2B.md, "Through the gateway"): the unmodified
 * `e2b` SDKs pointed at a gateway (E2B_API_URL and E2B_SANDBOX_URL) drive the fleet's
 * sandboxes. Every host serves E2B's control plane and envd itself (daemon/api/e2b); the
 * gateway only decides which host answers, and passes the request and its answer through
 * (bodies and Connect streams unparsed, with backpressure):
 * - creates (`POST /sandboxes`, `/v2/sandboxes`) are placed like `POST /v1/sandboxes`
 *   (gateway/create.ts) and sent with the caller's identity, so the host records the
 *   caller's tenant as the owner and answers the envdAccessToken to it alone;
 * - lists (`GET /sandboxes`, `/v2/sandboxes`) ask every up host with the caller's
 *   identity and concatenate the answers (each host filters by tenant and metadata);
 * - calls on one sandbox (`/sandboxes/{id}/...`, `/v2/sandboxes/{id}/connect`) go to the
 *   host the id names (its tag, gateway/routing.ts);
 * - envd requests (`/process.Process/*`, `/filesystem.Filesystem/*`, `/files`,
 *   `/health`) carry no API key: the gateway's door lets them through (route config
 *   `selfAuthenticated`) and the gateway routes them by the sandbox they name (the
 *   `E2b-Sandbox-Id` header, the host name `49983-<id>.<domain>`, or the id an access
 *   token begins with); the owning host checks the access token in constant time. A
 *   401 from the host counts against the source address's failure budget here, as a bad
 *   API key does.
 * Errors the gateway raises itself are in E2B's shape (`{code, message}`).
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Readable } from 'node:stream';
import { unauthenticated } from '../daemon/errors.js';
import { ENVD_PORT, ENVD_UNAUTHENTICATED, namedSandbox } from '../daemon/api/e2b/envd.js';
import { ENVD_TOKEN_RE, SANDBOX_ID_RE } from '../daemon/api/e2b/tokens.js';
import { sendE2bError } from '../daemon/api/e2b/wire.js';
import { addressOf, identityOf, type GatewayContext } from './context.js';
import { placeAndForward } from './create.js';
import { askAll } from './fanout.js';
import { forward, sendUpstream, type Router } from './routing.js';
import { passHeaders } from './upstream.js';

/** E2B's calls on one sandbox: method and path (fastify-style), all routed by `:id`. */
const SANDBOX_ROUTES: ReadonlyArray<[method: 'GET' | 'POST' | 'DELETE', url: string]> = [
  ['GET', '/sandboxes/:id'],
  ['DELETE', '/sandboxes/:id'],
  ['POST', '/sandboxes/:id/timeout'],
  ['POST', '/sandboxes/:id/refreshes'],
  ['POST', '/sandboxes/:id/pause'],
  ['POST', '/sandboxes/:id/resume'],
  ['POST', '/sandboxes/:id/connect'],
  ['POST', '/v2/sandboxes/:id/connect'],
];

/**
 * The sandbox an envd request names (see the module comment), or null.
 * @returns the id, and whether it was read from the host name (the host then needs it as a header: the Host header is the gateway's)
 */
export function envdSandboxOf(headers: Record<string, string | string[] | undefined>): { id: string; fromHostName: boolean } | null {
  const named = namedSandbox(headers);
  if (named.id !== null) return SANDBOX_ID_RE.test(named.id) ? { id: named.id, fromHostName: typeof headers['e2b-sandbox-id'] !== 'string' } : null;
  const token = headers['x-access-token'];
  const m = typeof token === 'string' ? ENVD_TOKEN_RE.exec(token) : null;
  return m ? { id: m[1], fromHostName: false } : null;
}

/**
 * Passes an envd request to the host of the sandbox it names. Unlike {@link forward}, the
 * request's `Authorization: Basic` header (envd's user selection, no credential) is kept.
 * @throws DsecError Unauthenticated when it names no sandbox or one no host has (the same answer as a wrong token: it never tells whether a sandbox exists)
 */
async function forwardEnvd(ctx: GatewayContext, router: Router, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
  const named = envdSandboxOf(req.headers);
  const fail = async () => {
    await req.noteAuthFailure?.();
    return unauthenticated(ENVD_UNAUTHENTICATED);
  };
  if (!named) throw await fail();
  let host;
  try {
    host = await router.hostOf(named.id, `/v1/sandboxes/${named.id}`, identityOf(req));
  } catch {
    throw await fail();
  }
  const headers: Record<string, string | string[]> = { ...passHeaders(req.headers), 'x-forwarded-for': req.socket.remoteAddress ?? '' };
  const auth = req.headers.authorization;
  if (typeof auth === 'string' && /^Basic\s/i.test(auth)) headers.authorization = auth;
  if (named.fromHostName) Object.assign(headers, { 'e2b-sandbox-id': named.id, 'e2b-sandbox-port': String(ENVD_PORT) });
  const res = await ctx.upstreams.request(addressOf(host), { method: req.method, path: req.url, headers, body: req.body as Readable | undefined, identity: identityOf(req) });
  if (res.statusCode === 401) await req.noteAuthFailure?.();
  return sendUpstream(reply, res);
}

/** Registers E2B's control plane and envd on the gateway's app (see the module comment). */
export function registerE2bGatewayRoutes(app: FastifyInstance, ctx: GatewayContext, router: Router): void {
  app.register(async (scope) => {
    scope.setErrorHandler((e, _req, reply) => sendE2bError(reply, e));
    for (const url of ['/sandboxes', '/v2/sandboxes']) {
      scope.post(url, (req, reply) => placeAndForward(ctx, router, req, reply, 'container'));
      scope.get(url, async (req) => {
        const { answers } = await askAll(ctx, req);
        const all = answers.flatMap((a) => (Array.isArray(a.body) ? (a.body as unknown[]) : []));
        const limit = Number(new URLSearchParams(req.url.split('?')[1] ?? '').get('limit'));
        return Number.isInteger(limit) && limit > 0 ? all.slice(0, limit) : all;
      });
    }
    for (const [method, url] of SANDBOX_ROUTES) {
      scope.route({
        method, url,
        handler: async (req, reply) => {
          const id = (req.params as { id: string }).id;
          const host = await router.hostOf(id, `/v1/sandboxes/${encodeURIComponent(id)}`, identityOf(req));
          const r = await forward(ctx, host, req, reply, `sandbox ${id}`);
          if (method === 'DELETE' && reply.statusCode < 300) router.forget(id, host.name);
          return r;
        },
      });
    }
    const envd = { config: { selfAuthenticated: true }, handler: (req: FastifyRequest, reply: FastifyReply) => forwardEnvd(ctx, router, req, reply) };
    scope.route({ method: 'GET', url: '/health', ...envd });
    scope.route({ method: ['GET', 'POST'], url: '/files', ...envd });
    scope.route({ method: ['GET', 'POST'], url: '/process.Process/*', ...envd });
    scope.route({ method: ['GET', 'POST'], url: '/filesystem.Filesystem/*', ...envd });
  });
}
