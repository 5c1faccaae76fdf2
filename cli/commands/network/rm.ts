/**
 * `dsec network rm ID [--allow RULE]... [--deny RULE]...`: removes rules from a sandbox's
 * own rules (compared as the flags write them, host names case-insensitively); its mode,
 * its policy and its other rules stay. A running sandbox loses them at once. A rule the
 * sandbox does not have is an error and nothing changes (a policy's rules are not its
 * own: `dsec network set` replaces the policy).
 *
 * Read, change, write back whole only if nothing changed in between, as `dsec network
 * add` (cli/util/network.ts changeNetwork).
 */
import type { Command } from 'commander';
import { renderNetwork } from '../../ui/network.js';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { addRuleOptions, changeNetwork, removeRules, type NetworkFlags } from '../../util/network.js';
import { writeJson } from '../../util/output.js';

/** Adds `rm` to the `network` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent
    .command('rm')
    .description("remove egress rules from a sandbox's own rules (its mode, policy and other rules stay); takes effect at once")
    .argument('<id>', 'sandbox id');
  return addRuleOptions(cmd, { allow: 'stop allowing egress to', deny: 'stop denying egress to' })
    .addHelpText('after', '\nExample:\n  dsec network rm ID --allow pypi.org:443/tcp')
    .action(async (id: string, f: Pick<NetworkFlags, 'allow' | 'deny'>) => {
      if (!f.allow && !f.deny) throw new UserError('nothing to remove', 'give --allow RULE or --deny RULE (repeatable), as `dsec network show ID` lists them');
      const n = await changeNetwork(ctx.client(), id, (spec) => {
        const rules = removeRules({ allow: spec.allow ?? [], deny: spec.deny ?? [] }, f);
        return {
          ...spec,
          ...(rules.allow.length ? { allow: rules.allow } : { allow: undefined }),
          ...(rules.deny.length ? { deny: rules.deny } : { deny: undefined }),
        };
      });
      if (ctx.json) writeJson(ctx.io.stdout, n);
      else ctx.out(renderNetwork(n, { color: ctx.color }));
    });
}
