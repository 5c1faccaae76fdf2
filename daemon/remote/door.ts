/**
 * The API's doors: the Unix socket (the local administrator: tenant `system`, role admin)
 * and the TCP door (`dsecd --listen`, `[remote]`): HTTPS with TLS 1.3 only, a token on
 * every request, optionally a client certificate of a fleet CA (mutual TLS). Both serve
 * the same routes (daemon/api/server.ts buildApi); a door adds the fastify server
 * options and the hooks that set `req.principal`, the caller's identity routes read.
 *
 * Order of checks on the TCP door, per request (onRequest, before the body is read):
 * 1. client certificate role, when the port requires certificates (403 for a wrong role;
 *    no certificate or one of another CA never completes the TLS handshake);
 * 2. the source address's failed-authentication budget (429 once spent);
 * 3. the token (`Authorization: Bearer` or `X-API-Key`): one 401 answer for a missing,
 *    malformed, unknown, revoked or expired token;
 * 4. the role against the route ({@link accessOf}, 403);
 * 5. the token's create budget on routes that create sandboxes (429).
 * Routes marked `selfAuthenticated` (E2B's envd: a per-sandbox access token instead of a
 * token of the door) pass after step 2 and authenticate the request themselves.
 * Every connection a token authenticated is remembered under it: revoking the token, or
 * its expiry, destroys them, which ends its attach WebSockets, `logs -f` and event streams.
 */
import type { FastifyInstance, FastifyRequest, FastifyServerOptions } from 'fastify';
import type { Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import rateLimit from '@fastify/rate-limit';
import type { Logger } from 'pino';
import { permissionDenied, resourceExhausted, unauthenticated } from '../errors.js';
import type { Metrics } from '../metrics.js';
import { AuditLog, installAudit, isUpgrade } from './audit.js';
import { peerIdentity, type CertRole, type PeerIdentity } from '../../pki/certs.js';
import { BATCH_CREATE_ROUTES, CREATE_ROUTES, RUN_ROUTES, accessOf, allows } from './policy.js';
import { LIMITS } from '../model/resources.js';
import type { RemoteConfig } from './config.js';
import { SYSTEM_TENANT, TENANT_RE, TOKEN_ROLES, type TokenRole, type TokenService } from './tokens.js';

/**
 * Who is calling, as routes read it from `req.principal`. On the Unix socket: door
 * `unix`, no token, tenant `system`, role admin. On the TCP door: the token's id, tenant
 * and role, and the verified client certificate when the port requires one.
 */
export interface Principal {
  door: 'unix' | 'tcp';
  /** Id of the token that authenticated the request (16 hex), null on the Unix socket. */
  tokenId: string | null;
  /** The tenant the request acts for. */
  tenant: string;
  role: TokenRole;
  /** The verified client certificate (mutual TLS), else null. */
  peer: PeerIdentity | null;
}

declare module 'fastify' {
  interface FastifyRequest {
    /** The caller (daemon/remote/door.ts); set by the door's first hook, before any route runs. */
    principal: Principal;
    /**
     * On a route that authenticates its callers itself (route config `selfAuthenticated`):
     * counts a failed authentication against the source address's budget, as the door
     * counts a bad token. Unset on the Unix socket.
     */
    noteAuthFailure?: () => Promise<void>;
    /**
     * Over the TCP door, on a batched create (BATCH_CREATE_ROUTES) or a one-shot run
     * route (RUN_ROUTES): spends `n` creates of the token's create budget (`[remote]
     * creates_per_minute`). A batched create spends `n` beyond the one its request spent;
     * a run route spends one per `container` call, when the route makes it.
     * @throws DsecError ResourceExhausted when the budget has fewer left.
     */
    spendCreates?: (n: number) => Promise<void>;
  }
  interface FastifyContextConfig {
    /**
     * The route authenticates its callers itself (E2B's envd, daemon/api/e2b/envd.ts: a
     * per-sandbox access token, no API key): the TCP door checks the client certificate
     * and the source's failure budget, then lets the request through with an anonymous
     * principal (tenant '', role reader) for the route to replace.
     */
    selfAuthenticated?: boolean;
  }
}

/** The Unix socket's caller: the local administrator. */
export const UNIX_PRINCIPAL: Principal = Object.freeze({ door: 'unix', tokenId: null, tenant: SYSTEM_TENANT, role: 'admin', peer: null });

/** What a door adds to the API's fastify app (daemon/api/server.ts baseApp). */
export interface ApiDoor {
  /** Which door. */
  readonly name: 'unix' | 'tcp';
  /** fastify server options of this door (https, timeouts), merged over the API's own. */
  readonly serverOptions: Partial<FastifyServerOptions> & Record<string, unknown>;
  /** Adds the door's hooks; runs before any route is registered. */
  install(app: FastifyInstance): void;
}

/** The Unix socket door: every request is the local administrator's; mutating calls are audited. */
export function unixDoor(audit: AuditLog | null): ApiDoor {
  return {
    name: 'unix',
    serverOptions: {},
    install(app) {
      app.decorateRequest('principal', null as unknown as Principal);
      app.addHook('onRequest', (req, _reply, done) => {
        req.principal = UNIX_PRINCIPAL;
        done();
      });
      if (audit) installAudit(app, audit, 'unix');
    },
  };
}

/**
 * Limits and timeouts of the TCP door: the `[remote]` settings of the same names
 * (daemon/remote/config.ts RemoteConfig documents each, with its default and unit), which
 * dsec-gateway's door takes too.
 */
export type DoorLimits = Pick<RemoteConfig, 'createsPerMinute' | 'authFailuresPerMinute' | 'maxConnections' | 'headersTimeoutMs' | 'requestTimeoutMs' | 'keepAliveTimeoutMs' | 'handshakeTimeoutMs'>;

/** The TLS material of the TCP door. */
export interface DoorTls {
  /** Server certificate chain, PEM. */
  cert: string;
  /** Its private key, PEM. */
  key: string;
  /** Client CA, PEM: when set, clients must present a certificate it signed (mutual TLS). */
  clientCa: string | null;
  /** Roles a client certificate may name on this port (with `clientCa`). */
  peerRoles: CertRole[];
}

/** The one answer to every authentication failure (issue 19: it never says whether the token exists). */
export const UNAUTHENTICATED_MESSAGE = 'authentication required: send a valid token as "Authorization: Bearer TOKEN" or "X-API-Key: TOKEN"';

/**
 * Connections authenticated by each token, so revocation and expiry close them. A
 * keep-alive connection that carried requests of several tokens is under each.
 */
export class TokenConnections {
  private readonly byToken = new Map<string, Set<Socket>>();
  private readonly expiry = new Map<string, NodeJS.Timeout>();

  /** Remembers that `socket` carried a request of token `id` (which expires at `expiresAt`, ms, or never). */
  track(id: string, expiresAt: number | null, socket: Socket): void {
    let set = this.byToken.get(id);
    if (!set) {
      set = new Set();
      this.byToken.set(id, set);
      if (expiresAt !== null) {
        // setTimeout holds at most 2^31-1 ms (24.8 days); a later expiry re-arms on the next request after that.
        const ms = Math.min(Math.max(0, expiresAt - Date.now()), 2 ** 31 - 1);
        const t = setTimeout(() => {
          this.expiry.delete(id);
          if (expiresAt <= Date.now()) this.close(id);
        }, ms);
        t.unref();
        this.expiry.set(id, t);
      }
    }
    if (set.has(socket)) return;
    set.add(socket);
    socket.once('close', () => {
      const s = this.byToken.get(id);
      if (!s) return;
      s.delete(socket);
      if (s.size === 0) {
        this.byToken.delete(id);
        const t = this.expiry.get(id);
        if (t) clearTimeout(t);
        this.expiry.delete(id);
      }
    });
  }

  /** Destroys every connection token `id` authenticated. @returns how many. */
  close(id: string): number {
    const set = this.byToken.get(id);
    if (!set) return 0;
    const n = set.size;
    for (const s of [...set]) s.destroy();
    return n;
  }

  /** How many connections token `id` holds open now. */
  count(id: string): number {
    return this.byToken.get(id)?.size ?? 0;
  }
}

/** The token text of a request: `Authorization: Bearer T` or `X-API-Key: T`; '' for two different ones or a non-Bearer Authorization. */
export function presentedToken(req: FastifyRequest): string | undefined {
  const auth = req.headers.authorization;
  const key = req.headers['x-api-key'];
  let bearer: string | undefined;
  if (auth !== undefined) {
    const m = /^Bearer +(\S+)\s*$/i.exec(auth);
    bearer = m ? m[1] : '';
  }
  const apiKey = Array.isArray(key) ? '' : key?.trim();
  if (bearer !== undefined && apiKey !== undefined && bearer !== apiKey) return '';
  return bearer ?? apiKey;
}

/** Options of {@link tcpDoor}. */
export interface TcpDoorOptions {
  tokens: TokenService;
  tls: DoorTls;
  limits: DoorLimits;
  metrics: Pick<Metrics, 'authFailures' | 'authDenied'>;
  log: Logger;
  audit: AuditLog | null;
  /**
   * A fleet host's door (dsecd --etcd): a request over a verified gateway certificate
   * names its caller in the gateway's identity headers ({@link GATEWAY_HEADERS}) instead
   * of a token, the gateway having authenticated the token itself. The headers are read
   * from gateway certificates only; any other peer still needs a token.
   */
  gatewayIdentity?: boolean;
}

/** Headers in which a gateway names the caller to a host (gateway/upstream.ts sets them). */
export const GATEWAY_HEADERS = { tenant: 'x-dsec-tenant', role: 'x-dsec-role', tokenId: 'x-dsec-token-id' } as const;

/**
 * The caller a gateway named in its headers.
 * @throws DsecError PermissionDenied when the tenant or role header is missing or malformed (a gateway bug, never a caller's).
 */
export function gatewayPrincipal(req: FastifyRequest, peer: PeerIdentity): Principal {
  const h = (n: string) => {
    const v = req.headers[n];
    return Array.isArray(v) ? undefined : v;
  };
  const tenant = h(GATEWAY_HEADERS.tenant), role = h(GATEWAY_HEADERS.role), tokenId = h(GATEWAY_HEADERS.tokenId);
  if (!tenant || !TENANT_RE.test(tenant) || !role || !(TOKEN_ROLES as readonly string[]).includes(role) || (tokenId !== undefined && !/^[0-9a-f]{16}$/.test(tokenId))) {
    throw permissionDenied(`gateway "${peer.name}" named no valid caller (headers ${GATEWAY_HEADERS.tenant}, ${GATEWAY_HEADERS.role})`);
  }
  return { door: 'tcp', tokenId: tokenId ?? null, tenant, role: role as TokenRole, peer };
}

/** The TCP door (see the module comment). @returns the door and the registry of connections per token. */
export function tcpDoor(opts: TcpDoorOptions): ApiDoor & { connections: TokenConnections } {
  const { tokens, tls, limits, metrics, log } = opts;
  const connections = new TokenConnections();
  tokens.onRevoke((id) => {
    const n = connections.close(id);
    if (n) log.info({ token: id, connections: n }, 'token revoked: its connections closed');
  });
  const mtls = tls.clientCa !== null;
  return {
    name: 'tcp',
    connections,
    serverOptions: {
      https: {
        cert: tls.cert,
        key: tls.key,
        minVersion: 'TLSv1.3',
        maxVersion: 'TLSv1.3',
        handshakeTimeout: limits.handshakeTimeoutMs,
        ...(mtls ? { ca: tls.clientCa!, requestCert: true, rejectUnauthorized: true } : {}),
        // How often node checks headersTimeout/requestTimeout (default 30 s): a slow-header
        // client is cut within a second of its deadline rather than up to 30 s later.
        connectionsCheckingInterval: 1000,
      },
      keepAliveTimeout: limits.keepAliveTimeoutMs,
      requestTimeout: limits.requestTimeoutMs,
      // No idle-socket timeout: a run-to-completion exec or an exec wait legitimately
      // sends nothing for minutes; slow clients are bounded by the header and request timeouts.
      connectionTimeout: 0,
    },
    install(app) {
      app.decorateRequest('principal', null as unknown as Principal);
      app.register(rateLimit, { global: false });
      const server = app.server as import('node:https').Server;
      server.headersTimeout = limits.headersTimeoutMs;
      server.maxConnections = limits.maxConnections;
      type Limiter = (req: FastifyRequest, o?: { increment?: boolean }) => Promise<{ isExceeded?: boolean; remaining?: number; ttl?: number }>;
      // Created at the first request: the plugin's decorator exists once fastify has loaded it.
      let failures: Limiter | undefined, creates: Limiter | undefined;
      const failureLimiter = (): Limiter => (failures ??= (app as unknown as { createRateLimit(o: object): Limiter }).createRateLimit({
        max: limits.authFailuresPerMinute, timeWindow: 60_000, keyGenerator: (r: FastifyRequest) => r.socket.remoteAddress ?? '',
      }));
      const createLimiter = (): Limiter => (creates ??= (app as unknown as { createRateLimit(o: object): Limiter }).createRateLimit({
        max: limits.createsPerMinute, timeWindow: 60_000, keyGenerator: (r: FastifyRequest) => r.principal.tokenId ?? '',
      }));
      if (opts.audit) installAudit(app, opts.audit, 'tcp');
      app.addHook('onRequest', async (req, reply) => {
        let peer: PeerIdentity | null = null;
        if (mtls) {
          peer = peerIdentity((req.socket as TLSSocket).getPeerCertificate());
          if (!peer || peer.role === null || !tls.peerRoles.includes(peer.role)) {
            metrics.authFailures.inc({ reason: 'client_cert' });
            throw permissionDenied(`client certificate ${peer ? `"${peer.name}" of role ${peer.role ?? '(none)'}` : '(none)'} is not accepted on this port (accepted roles: ${tls.peerRoles.join(', ')})`);
          }
        }
        if (opts.gatewayIdentity && peer?.role === 'gateway') {
          if (req.routeOptions.config?.selfAuthenticated) {
            // A request that carries its own credential (E2B's envd access token), passed
            // on by a gateway: the route checks it; the gateway counts failures by source.
            req.principal = { door: 'tcp', tokenId: null, tenant: '', role: 'reader', peer };
            return;
          }
          // The gateway authenticated the caller's token and applies its create budget.
          req.principal = gatewayPrincipal(req, peer);
          const access = accessOf(req.method, req.routeOptions.url, isUpgrade(req));
          if (!allows(req.principal.role, access)) {
            metrics.authDenied.inc({ role: req.principal.role });
            throw permissionDenied(`a ${req.principal.role} caller may not ${req.method} ${req.routeOptions.url ?? req.url.split('?')[0]}${access === 'admin' ? ' (admin only)' : ''}`);
          }
          return;
        }
        // A peek: `remaining` 0 means the address already failed authFailuresPerMinute times in this window.
        const spent = await failureLimiter()(req, { increment: false });
        if (spent.remaining !== undefined && spent.remaining <= 0) {
          metrics.authFailures.inc({ reason: 'rate_limited' });
          reply.header('retry-after', String(Math.max(1, Math.ceil((spent.ttl ?? 60_000) / 1000))));
          throw resourceExhausted(`too many failed authentications from ${req.socket.remoteAddress}; retry after ${Math.ceil((spent.ttl ?? 60_000) / 1000)} s`);
        }
        if (req.routeOptions.config?.selfAuthenticated) {
          req.principal = { door: 'tcp', tokenId: null, tenant: '', role: 'reader', peer };
          req.noteAuthFailure = async () => {
            await failureLimiter()(req);
            metrics.authFailures.inc({ reason: 'unknown' });
          };
          return;
        }
        const r = await tokens.check(presentedToken(req));
        if (!r.ok) {
          await failureLimiter()(req);
          metrics.authFailures.inc({ reason: r.why });
          log.info({ remote: req.socket.remoteAddress, why: r.why, url: req.url.split('?')[0] }, 'authentication failed');
          reply.header('www-authenticate', 'Bearer realm="dsec"');
          throw unauthenticated(UNAUTHENTICATED_MESSAGE);
        }
        req.principal = { door: 'tcp', tokenId: r.rec.id, tenant: r.rec.tenant, role: r.rec.role, peer };
        connections.track(r.rec.id, r.rec.expires_at, req.socket);
        const url = req.routeOptions.url;
        const access = accessOf(req.method, url, isUpgrade(req));
        if (!allows(r.rec.role, access)) {
          metrics.authDenied.inc({ role: r.rec.role });
          throw permissionDenied(`a ${r.rec.role} token may not ${req.method} ${url ?? req.url.split('?')[0]}${access === 'admin' ? ' (admin only)' : ''}`);
        }
        if (url !== undefined && CREATE_ROUTES.has(`${req.method} ${url}`)) {
          const c = await createLimiter()(req);
          if (c.isExceeded) {
            reply.header('retry-after', String(Math.max(1, Math.ceil((c.ttl ?? 60_000) / 1000))));
            throw resourceExhausted(`token ${r.rec.id} started more than ${limits.createsPerMinute} sandbox creates in a minute ([remote] creates_per_minute); retry after ${Math.ceil((c.ttl ?? 60_000) / 1000)} s`);
          }
        }
        const key = `${req.method} ${url}`;
        if (url !== undefined && (BATCH_CREATE_ROUTES.has(key) || RUN_ROUTES.has(key))) {
          const batch = BATCH_CREATE_ROUTES.has(key);
          req.spendCreates = async (n) => {
            for (let i = 0; i < Math.min(n, LIMITS.maxBatchSandboxes); i++) {
              const c = await createLimiter()(req);
              if (c.isExceeded) {
                const retry = Math.max(1, Math.ceil((c.ttl ?? 60_000) / 1000));
                // On an upgraded request (the run channel) the header goes nowhere; the message says it.
                reply.header('retry-after', String(retry));
                throw resourceExhausted(batch
                  ? `token ${r.rec.id} asked for ${n + 1} sandboxes, more than remain of its ${limits.createsPerMinute} creates a minute ([remote] creates_per_minute); retry after ${retry} s`
                  : `token ${r.rec.id} made more than its ${limits.createsPerMinute} sandbox creates a minute ([remote] creates_per_minute; a container call of /v1/run creates one, fncall calls none); retry after ${retry} s`);
              }
            }
          };
        }
      });
    },
  };
}
