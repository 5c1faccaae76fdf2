/**
 * `dsec network reload`: reloads the network policy files, as SIGHUP does. All or
 * nothing: a malformed file is refused (the message names the file and the field) and
 * the loaded policies stay in force. Prints what changed and which sandboxes got it, shipped
 * policies an operator file shadows, allow rules that never take effect, and sandboxes
 * whose policy's mode changed (they keep their own).
 */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** Adds `reload` to the `network` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('reload')
    .description('reload the network policy files (a malformed file is refused; the loaded ones stay in force)')
    .action(async () => {
      const r = await ctx.client().reloadNetworkPolicies();
      if (ctx.json) writeJson(ctx.io.stdout, r);
      else {
        ctx.out(`loaded: ${r.loaded.join(', ') || 'none'}\nchanged: ${r.changed.join(', ') || 'none'}\nre-applied to: ${r.reapplied.join(', ') || 'no sandbox'}\n`);
        for (const sh of r.shadowed) ctx.out(`shadowed: ${sh.name}: ${sh.file} hides the shipped ${sh.shadows}\n`);
        for (const w of r.warnings) ctx.out(`warning: policy ${w.policy} (${w.file}): ${w.message}\n`);
        for (const m of r.modes) ctx.out(`mode: sandbox ${m.id} ${m.changed ? 'took' : 'keeps'} mode ${m.mode} (policy ${m.policy} now has mode ${m.policy_mode})\n`);
      }
    });
}
