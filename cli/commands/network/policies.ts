/**
 * `dsec network policies`: the loaded network policies (shipped examples and the
 * operator's `[network] policy_dir`); with --json, the API's list.
 */
import type { Command } from 'commander';
import { renderPolicies } from '../../ui/network.js';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** Adds `policies` to the `network` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('policies')
    .description('list the loaded network policies')
    .action(async () => {
      const ps = await ctx.client().listNetworkPolicies();
      if (ctx.json) writeJson(ctx.io.stdout, { policies: ps });
      else ctx.out(renderPolicies(ps, { color: ctx.color }));
    });
}
