/**
 * Who may call what: each route of the API needs one kind of access, and each token role
 * grants some kinds. Decided from the route table (method and fastify-style URL), so a
 * route added later is classified by the same rules without a list to update: a GET is
 * `read`, anything else `write`, unless it is named in {@link ADMIN_ROUTES} (host-wide
 * operations), {@link ANY_ROUTES}, or is the metrics route.
 *
 * A WebSocket route (an exec attach, a console) is a GET that writes (stdin, keys): it
 * needs `write`.
 */
import type { TokenRole } from './tokens.js';

/** What a route needs: `any` (every role: who am I, which version), `read` (no change), `write` (changes the caller's objects), `admin` (host-wide), `metrics` (GET /metrics). */
export type Access = 'any' | 'read' | 'write' | 'admin' | 'metrics';

/** Routes every role may call: they tell the caller about itself and the daemon's version. */
export const ANY_ROUTES: ReadonlySet<string> = new Set(['GET /v1/whoami', 'GET /v1/version']);

/**
 * Routes only an admin may call, as `METHOD url` (fastify-style). Each changes or reveals
 * what is shared by every tenant of the host, or reads the host's own files:
 * - tokens: who may call at all;
 * - image import reads any path on dsecd's host (as root), bootstrap runs debootstrap as
 *   root, prune removes layers of every tenant's images (compose, tag and rm act on the
 *   caller's tenant's image names, layer-store.ts, and are `write`);
 * - the seccomp profile and network policy reloads apply host configuration.
 */
export const ADMIN_ROUTES: ReadonlySet<string> = new Set([
  'POST /v1/tokens',
  'GET /v1/tokens',
  'DELETE /v1/tokens/:id',
  'POST /v1/images/import',
  'POST /v1/images/bootstrap',
  'POST /v1/images/prune',
  // Stores an EROFS blob the kernel will mount (a gateway copying an image between hosts).
  'PUT /v1/layers/:digest/blob',
  'POST /v1/security/seccomp/reload',
  'POST /v1/network/policies/reload',
  // E2B template aliases: which image every tenant's `Sandbox.create(NAME)` gets.
  'PUT /v1/templates/:name',
  'DELETE /v1/templates/:name',
  // A gateway's host routes (gateway/hosts.ts): they change where the whole fleet places.
  'POST /v1/hosts/:name/cordon',
  'POST /v1/hosts/:name/uncordon',
  'POST /v1/hosts/:name/drain',
  'DELETE /v1/hosts/:name',
]);

/** The metrics route: `metrics` access, which admin, user, reader and metrics tokens have. */
export const METRICS_ROUTE = 'GET /metrics';

/**
 * The access a request needs.
 * @param method HTTP method
 * @param url the matched route's fastify-style URL (`/v1/sandboxes/:id`), or undefined when no route matched (then by method alone)
 * @param upgrade whether the request asks to upgrade to a WebSocket
 */
export function accessOf(method: string, url: string | undefined, upgrade: boolean): Access {
  const key = `${method} ${url ?? ''}`;
  if (key === METRICS_ROUTE) return 'metrics';
  if (ANY_ROUTES.has(key)) return 'any';
  if (url !== undefined && ADMIN_ROUTES.has(key)) return 'admin';
  if ((method === 'GET' || method === 'HEAD') && !upgrade) return 'read';
  return 'write';
}

/** Which kinds of access each role has. */
const GRANTS: Record<TokenRole, ReadonlySet<Access>> = {
  admin: new Set(['any', 'read', 'write', 'admin', 'metrics']),
  user: new Set(['any', 'read', 'write', 'metrics']),
  reader: new Set(['any', 'read', 'metrics']),
  metrics: new Set(['any', 'metrics']),
};

/** Whether `role` may make a request that needs `access`. */
export function allows(role: TokenRole, access: Access): boolean {
  return GRANTS[role].has(access);
}

/** Routes that create sandboxes (per-token create rate limit, docs/SECURITY.md). */
export const CREATE_ROUTES: ReadonlySet<string> = new Set([
  'POST /v1/sandboxes',
  'POST /v1/snapshots/:ref/restore',
  'POST /v1/snapshots/:ref/fork',
  // fastify's spelling of the literal colon: `::`.
  'POST /v1/sandboxes::batch',
  // E2B's creates (daemon/api/e2b/control.ts): the same budget.
  'POST /sandboxes',
  'POST /v2/sandboxes',
]);

/** Batched creates: they spend one create of the rate budget per sandbox asked for (daemon/remote/door.ts `req.spendCreates`). */
export const BATCH_CREATE_ROUTES: ReadonlySet<string> = new Set(['POST /v1/sandboxes::batch']);

/**
 * One-shot runs: each `container` call creates a sandbox and spends one create of the
 * rate budget when the route makes it (`req.spendCreates`, on the run channel per
 * message); `fncall` calls create none and spend nothing.
 */
export const RUN_ROUTES: ReadonlySet<string> = new Set(['POST /v1/run', 'POST /v1/run::batch', 'GET /v1/run/channel']);
