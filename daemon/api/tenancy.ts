/**
 * Tenant isolation at the API's edge (docs/SECURITY.md "Tenancy"): how every path
 * parameter of the route table is scoped, and the hook that checks a request's sandbox
 * id against the caller's tenant before the route runs.
 *
 * Each path parameter of every route is one of:
 * - `sandbox`: a sandbox id (`/v1/sandboxes/:id...`): the hook answers NotFound, exactly
 *   as for a missing sandbox, unless the caller's scope sees it; the route then runs on
 *   a sandbox the caller may use, so nothing under it (execs, files, network, logs,
 *   stats, console, commit, snapshot) needs a check of its own;
 * - `sandbox-child`: an id under a sandbox (`:exec_id`), held per sandbox by its service
 *   (an exec id of another sandbox is NotFound there);
 * - `scoped`: a name or id the service resolves within the caller's scope (snapshots,
 *   trajectories, leases, image names: names are per tenant, so the service must know
 *   the tenant; an image name falls back to the shared `system` image of that name);
 * - `shared`: a host-wide object every tenant reads (layers, whose views the route cuts
 *   to the images the caller sees; E2B template aliases), changed only by admin routes;
 * - `admin`: a parameter of a route only an admin may call at all (tokens, fleet hosts).
 * {@link paramScope} classifies by URL and parameter name; {@link assertScoped} refuses,
 * at startup, a route whose parameter no rule covers, so a route added later cannot
 * serve another tenant's objects by omission (test/integration/tenancy.test.ts walks the
 * whole table: the classification of every route, then its behaviour for another tenant).
 */
import type { FastifyInstance } from 'fastify';
import type { SandboxRecord } from '../model/sandbox.js';
import type { Scope } from '../model/tenant.js';
import { scopeOf } from './scope.js';
import type { RouteDoc } from './routes/table.js';

/** How one path parameter is scoped (see the module comment). */
export type ParamScope = 'sandbox' | 'sandbox-child' | 'scoped' | 'shared' | 'admin';

/** Rules in order: the first whose URL prefix and parameter match decides. */
const RULES: readonly { prefix: string; param: string; scope: ParamScope }[] = [
  { prefix: '/v1/sandboxes/:id', param: 'id', scope: 'sandbox' },
  { prefix: '/v1/sandboxes/:id/', param: 'exec_id', scope: 'sandbox-child' },
  { prefix: '/v1/snapshots/:ref', param: 'ref', scope: 'scoped' },
  { prefix: '/v1/trajectories/:id', param: 'id', scope: 'scoped' },
  { prefix: '/v1/leases/:job', param: 'job', scope: 'scoped' },
  { prefix: '/v1/images/:ref', param: 'ref', scope: 'scoped' },
  { prefix: '/v1/layers/:digest', param: 'digest', scope: 'shared' },
  { prefix: '/v1/templates/:name', param: 'name', scope: 'shared' },
  { prefix: '/v1/tokens/:id', param: 'id', scope: 'admin' },
  { prefix: '/v1/hosts/:name', param: 'name', scope: 'admin' },
];

/** The path parameters of a fastify-style URL, in order (`/v1/sandboxes/:id/execs/:exec_id` → id, exec_id). */
export function pathParams(url: string): string[] {
  return [...url.matchAll(/\/:([A-Za-z_]+)/g)].map((m) => m[1]);
}

/** How parameter `param` of route `url` is scoped, or undefined when no rule covers it. */
export function paramScope(url: string, param: string): ParamScope | undefined {
  return RULES.find((r) => r.param === param && (url === r.prefix || url.startsWith(r.prefix.endsWith('/') ? r.prefix : `${r.prefix}/`)))?.scope;
}

/**
 * Refuses a route table with a path parameter no rule covers.
 * @throws Error naming the route and parameter (a programming error: dsecd must not start with it).
 */
export function assertScoped(routes: readonly Pick<RouteDoc, 'method' | 'url'>[]): void {
  for (const r of routes) {
    for (const p of pathParams(r.url)) {
      if (!paramScope(r.url, p)) throw new Error(`route ${r.method} ${r.url}: path parameter :${p} has no tenant scope (daemon/api/tenancy.ts RULES)`);
    }
  }
}

/** What the tenancy hook reads. */
export interface TenancyDeps {
  lifecycle: { get(id: string, scope: Scope): SandboxRecord };
}

/**
 * Adds the hook that answers NotFound for a sandbox id the caller's scope does not see,
 * on every route whose `:id` is a sandbox. Runs on onRequest after the door's hook (the
 * principal is set), before the body is read, so a refused request changes nothing.
 */
export function installTenancy(app: FastifyInstance, deps: TenancyDeps): void {
  app.addHook('onRequest', async (req) => {
    const url = req.routeOptions.url;
    if (url === undefined || paramScope(url, 'id') !== 'sandbox') return;
    const id = (req.params as Record<string, string | undefined>).id;
    if (id !== undefined) deps.lifecycle.get(id, scopeOf(req));
  });
}
