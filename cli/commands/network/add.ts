/**
 * `dsec network add ID [--allow RULE]... [--deny RULE]...`: adds rules to a sandbox's own
 * rules; its mode, its policy and the rules it has stay. A running sandbox gets them at
 * once. A rule it already has is not added twice (stderr says so).
 *
 * The CLI reads the sandbox's network (GET /v1/sandboxes/{id}), appends, and writes it
 * back whole only if it did not change in between (cli/util/network.ts changeNetwork:
 * otherwise it reads again), so two changes racing on one sandbox both take effect.
 */
import type { Command } from 'commander';
import { formatRule, renderNetwork } from '../../ui/network.js';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { addRuleOptions, addRules, changeNetwork, type NetworkFlags } from '../../util/network.js';
import { writeJson } from '../../util/output.js';

/** Adds `add` to the `network` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent
    .command('add')
    .description("add egress rules to a sandbox's own rules (its mode, policy and other rules stay); takes effect at once")
    .argument('<id>', 'sandbox id');
  return addRuleOptions(cmd, { allow: 'also allow egress to', deny: 'also deny egress to' })
    .addHelpText('after', '\nExamples:\n  dsec network add ID --allow files.pythonhosted.org:443/tcp\n  dsec network add ID --deny 10.0.0.0/8')
    .action(async (id: string, f: Pick<NetworkFlags, 'allow' | 'deny'>) => {
      if (!f.allow && !f.deny) throw new UserError('nothing to add', 'give --allow RULE or --deny RULE (repeatable)');
      let present: ReturnType<typeof addRules>['present'] = [];
      const n = await changeNetwork(ctx.client(), id, (spec) => {
        const added = addRules({ allow: spec.allow ?? [], deny: spec.deny ?? [] }, f);
        present = added.present;
        // A sandbox without a network has no stored mode: the rules ask for one (dsecd
        // refuses none -> allow/open for an existing sandbox, and says why).
        const mode = spec.mode ?? (spec.policy !== undefined ? undefined : f.allow ? 'allow' : 'open');
        return {
          ...spec,
          ...(mode !== undefined ? { mode } : {}),
          ...(added.rules.allow.length ? { allow: added.rules.allow } : { allow: undefined }),
          ...(added.rules.deny.length ? { deny: added.rules.deny } : { deny: undefined }),
        };
      });
      for (const r of present) ctx.err(`dsec: ${formatRule(r)} was already a rule of ${id}\n`);
      if (ctx.json) writeJson(ctx.io.stdout, n);
      else ctx.out(renderNetwork(n, { color: ctx.color }));
    });
}
