/**
 * `dsec network show ID`: a sandbox's network (mode, policy, effective rules, address,
 * resolved hosts, egress denials), or the API's SandboxNetwork with --json.
 */
import type { Command } from 'commander';
import { renderNetwork } from '../../ui/network.js';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** Adds `show` to the `network` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('show')
    .description("show a sandbox's network: mode, rules, address, resolved hosts, denials")
    .argument('<id>', 'sandbox id')
    .action(async (id: string) => {
      const n = await ctx.client().getNetwork(id);
      if (ctx.json) writeJson(ctx.io.stdout, n);
      else ctx.out(renderNetwork(n, { color: ctx.color }));
    });
}
