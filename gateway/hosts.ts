/**
 * The gateway's own routes about the fleet's hosts: `GET /v1/hosts` (`dsec hosts`),
 * cordon, uncordon and drain (`dsec host cordon|uncordon|drain NAME`: records under
 * `cordons/` in etcd, so every gateway stops placing there), and forget (`dsec host forget
 * NAME`: a host gone for good gives up its name).
 */
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { failedPrecondition, notFound } from '../daemon/errors.js';
import { HOST_NAME_RE, type CordonRecord } from '../daemon/fleet/layout.js';
import { route } from '../daemon/api/routes/table.js';
import { addressOf, identityOf, type GatewayContext } from './context.js';
import { hostError, type Router } from './routing.js';
import type { HostEntry } from './table.js';
import { DEFAULT_BURST_THRESHOLD, primaryUtilisation } from './placement.js';

/** One host as `GET /v1/hosts` lists it. */
export const HostView = z.object({
  name: z.string(),
  id: z.string().nullable().describe('Persistent host id holding the name.'),
  state: z.enum(['up', 'down']).describe('up while its etcd lease is alive; down once it lapsed.'),
  since: z.number().int().describe('When this gateway saw the state change, ms since the epoch.'),
  cordoned: z.boolean(),
  draining: z.boolean(),
  pool: z.string().describe('Its `pool` label, or `default`.'),
  labels: z.record(z.string(), z.string()),
  advertise: z.string().nullable(),
  tag: z.string().nullable().describe('6 hex that begin the ids of its sandboxes.'),
  version: z.string().nullable(),
  backends: z.array(z.string()),
  sandboxes: z.number().int().describe('Sandboxes on it (all states), as it last reported.'),
  by_state: z.record(z.string(), z.number().int()),
  cpu: z.object({ cores: z.number().int(), busy: z.number().describe('Busy fraction of all cores, 0..1.'), load1: z.number() }),
  memory: z.object({ total_bytes: z.number(), available_bytes: z.number() }),
  admitted: z.object({ count: z.number(), cpus: z.number(), memory_bytes: z.number() }).describe('What admission counts, and the limits it counts against in `admission`.'),
  admission: z.object({ max_sandboxes: z.number(), cpus: z.number(), memory_bytes: z.number() }),
  reported_at: z.number().int().nullable().describe('When the host took its last load report, ms since the epoch (its clock).'),
});
export type HostView = z.infer<typeof HostView>;

/** GET /v1/hosts response. */
export const HostList = z.object({
  hosts: z.array(HostView),
  view: z.object({
    gateway: z.string(),
    fresh: z.boolean().describe('false while the gateway cannot watch etcd: the table is the last known state.'),
    stale_since: z.number().int().nullable(),
  }),
  pools: z.record(z.string(), z.object({ hosts: z.number().int(), sandboxes: z.number().int() })).describe('Per pool (a host\'s `pool` label): its hosts and the sandboxes they hold, as last reported.'),
  burst: z.object({
    threshold: z.number().describe('Primary utilisation (0..1) above which burst hosts take creates that allow them (X-Dsec-Burst: allow).'),
    primary_utilisation: z.number().describe('Of the up, uncordoned hosts outside the burst pool: the largest of admitted sandboxes, cores and memory over their admission limits, 0..1.'),
    open: z.boolean().describe('Whether burst hosts take such creates now.'),
  }),
});

const listRoute = route({ method: 'GET', url: '/v1/hosts', summary: 'Gateway only: the fleet\'s hosts, their state, pool, labels, load and backends.', status: 200, response: HostList, errors: [] });
const cordonRoute = route({ method: 'POST', url: '/v1/hosts/:name/cordon', summary: 'Gateway only: no new placements on the host (admin).', status: 200, response: HostView, errors: ['NotFound'] });
const uncordonRoute = route({ method: 'POST', url: '/v1/hosts/:name/uncordon', summary: 'Gateway only: the host takes placements again (admin).', status: 200, response: HostView, errors: ['NotFound'] });
const drainRoute = route({
  method: 'POST', url: '/v1/hosts/:name/drain', summary: 'Gateway only: cordon the host and report the sandboxes left on it (admin).', status: 200,
  response: z.object({ host: HostView, left: z.array(z.object({ id: z.string(), state: z.string(), labels: z.record(z.string(), z.string()) })) }), errors: ['NotFound', 'Unavailable'],
});
const forgetRoute = route({ method: 'DELETE', url: '/v1/hosts/:name', summary: 'Gateway only: remove a down host\'s registration and name claim from etcd (admin).', status: 200, response: HostView, errors: ['NotFound', 'FailedPrecondition'] });

/** The view of a table entry. */
export function hostView(h: HostEntry): HostView {
  const live = h.live, info = h.info;
  const by = live?.sandboxes ?? {};
  return {
    name: h.name, id: h.id, state: h.state, since: h.since, cordoned: h.cordon !== null, draining: h.cordon?.drain ?? false,
    pool: info?.labels.pool ?? 'default', labels: info?.labels ?? {}, advertise: info?.advertise ?? null, tag: info?.tag ?? null,
    version: info?.version ?? null, backends: info?.backends ?? [],
    sandboxes: Object.values(by).reduce((a, b) => a + b, 0), by_state: by,
    cpu: { cores: info?.capacity.cores ?? 0, busy: live?.cpu.busy ?? 0, load1: live?.cpu.load1 ?? 0 },
    memory: { total_bytes: info?.capacity.memory_bytes ?? 0, available_bytes: live?.memory_available_bytes ?? 0 },
    admitted: { count: live?.admitted.count ?? 0, cpus: live?.admitted.cpus ?? 0, memory_bytes: live?.admitted.memory_bytes ?? 0 },
    admission: { max_sandboxes: info?.admission.max_sandboxes ?? 0, cpus: info?.admission.cpus ?? 0, memory_bytes: info?.admission.memory_bytes ?? 0 },
    reported_at: live?.at ?? null,
  };
}

/** Registers the host routes. */
export function registerHostRoutes(app: FastifyInstance, ctx: GatewayContext, router: Router): void {
  const get = (name: string): HostEntry => {
    const h = HOST_NAME_RE.test(name) ? ctx.table.hosts.get(name) : undefined;
    if (!h || !h.info) throw notFound(`host ${name} not found`);
    return h;
  };
  const cordon = async (name: string, by: string, drain: boolean) => {
    const rec: CordonRecord = { at: Date.now(), by, drain };
    await ctx.etcd.put(ctx.keys.cordon(name)).value(JSON.stringify(rec));
    // The watch brings it to every gateway; this one knows at once.
    get(name).cordon = rec;
  };
  const caller = (p: { tokenId: string | null; tenant: string }) => `${p.tenant}${p.tokenId ? `/${p.tokenId}` : ''} via ${ctx.name}`;
  app.get(listRoute.url, async () => {
    const hosts = ctx.table.list().filter((h) => h.info).map(hostView);
    const pools: Record<string, { hosts: number; sandboxes: number }> = {};
    for (const h of hosts) {
      const p = (pools[h.pool] ??= { hosts: 0, sandboxes: 0 });
      p.hosts += 1;
      p.sandboxes += h.sandboxes;
    }
    const views = ctx.table.placementHosts();
    const util = primaryUtilisation(views);
    const threshold = ctx.policy.burstThreshold ?? DEFAULT_BURST_THRESHOLD;
    return {
      hosts,
      view: { gateway: ctx.name, fresh: ctx.table.fresh, stale_since: ctx.table.staleSince },
      pools,
      burst: { threshold, primary_utilisation: util, open: views.some((h) => h.burst) && util > threshold },
    };
  });
  app.post<{ Params: { name: string } }>(cordonRoute.url, async (req) => {
    get(req.params.name);
    await cordon(req.params.name, caller(req.principal), false);
    return hostView(get(req.params.name));
  });
  app.post<{ Params: { name: string } }>(uncordonRoute.url, async (req) => {
    const h = get(req.params.name);
    await ctx.etcd.delete().key(ctx.keys.cordon(req.params.name));
    h.cordon = null;
    return hostView(h);
  });
  app.post<{ Params: { name: string } }>(drainRoute.url, async (req) => {
    const h = get(req.params.name);
    await cordon(h.name, caller(req.principal), true);
    if (h.state !== 'up') throw failedPrecondition(`host ${h.name} is cordoned and draining, but it is down: what is left on it is known once it is back`);
    const r = await ctx.upstreams.json<{ sandboxes: Array<{ id: string; state: string; labels: Record<string, string> }> }>(addressOf(h), { method: 'GET', path: '/v1/sandboxes', identity: identityOf(req) });
    if (r.status !== 200 || !r.body) throw hostError(h.name, r.status, r.body);
    router.replaceRows(h.name, r.body.sandboxes as unknown as Array<Record<string, unknown>>);
    return { host: hostView(h), left: r.body.sandboxes.map((s) => ({ id: s.id, state: s.state, labels: s.labels })) };
  });
  app.delete<{ Params: { name: string } }>(forgetRoute.url, async (req) => {
    const h = get(req.params.name);
    if (h.state === 'up') throw failedPrecondition(`host ${h.name} is up: stop its dsecd first (a host that is up registers again)`);
    const view = hostView(h);
    await ctx.etcd.delete().prefix(ctx.keys.host(h.name));
    await ctx.etcd.delete().key(ctx.keys.cordon(h.name));
    return view;
  });
}
