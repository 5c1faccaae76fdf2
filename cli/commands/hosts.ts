/**
 * `dsec hosts`: the fleet's hosts as a gateway sees them (NAME, POOL, STATE, SANDBOXES,
 * CPU, MEM, BACKENDS, LABELS), or `{hosts, view}` with --json. Needs a gateway
 * (`--host`/`DSEC_HOST` naming a dsec-gateway); warns on stderr when the gateway's view of
 * etcd is stale (the table is then the last known state).
 */
import type { Command } from 'commander';
import { isDsecApiError, type FleetHostList } from '../../sdk/index.js';
import { renderHostTable } from '../ui/hosts.js';
import type { Ctx } from '../util/context.js';
import { UserError } from '../util/errors.js';
import { writeJson } from '../util/output.js';

/** GET /v1/hosts, with a user error when the server is a dsecd rather than a gateway. */
export async function fleetHosts(ctx: Ctx): Promise<FleetHostList> {
  try {
    return await ctx.client().listHosts();
  } catch (e) {
    if (isDsecApiError(e) && e.code === 'NotFound') throw new UserError('this server is a dsecd, not a gateway: hosts are a fleet\'s', 'point --host (DSEC_HOST) at a dsec-gateway');
    throw e;
  }
}

/** Adds `hosts` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('hosts')
    .description('list the fleet\'s hosts (through a gateway): state, pool, load, backends')
    .action(async () => {
      const r = await fleetHosts(ctx);
      if (ctx.json) {
        writeJson(ctx.io.stdout, r);
        return;
      }
      if (!r.view.fresh) ctx.err(`dsec: warning: gateway ${r.view.gateway} cannot reach etcd${r.view.stale_since ? ` since ${new Date(r.view.stale_since).toISOString()}` : ''}: this is the last known state\n`);
      ctx.out(renderHostTable(r.hosts, { color: ctx.color }));
      // Which pool took what, and whether burst hosts take creates now (older gateways send neither).
      const extra = r as FleetHostList & { pools?: Record<string, { hosts: number; sandboxes: number }>; burst?: { threshold: number; primary_utilisation: number; open: boolean } };
      if (extra.pools) ctx.out(`pools: ${Object.entries(extra.pools).map(([p, v]) => `${p} ${v.hosts} host${v.hosts === 1 ? '' : 's'} ${v.sandboxes} sandboxes`).join('; ')}\n`);
      if (extra.burst && extra.pools?.burst) {
        ctx.out(`burst: ${extra.burst.open ? 'open' : 'closed'} (primary utilisation ${Math.round(extra.burst.primary_utilisation * 100)}%, threshold ${Math.round(extra.burst.threshold * 100)}%; creates with X-Dsec-Burst: allow)\n`);
      }
    });
}
