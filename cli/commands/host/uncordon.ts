/**
 * `dsec host uncordon NAME` (through a gateway): the host takes placements again (admin).
 * Prints the host's new state, or the answer with --json.
 */
import type { Command } from 'commander';
import { isDsecApiError } from '../../../sdk/index.js';
import { hostState } from '../../ui/hosts.js';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { writeJson } from '../../util/output.js';

/** Adds `uncordon` to the `host` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('uncordon <name>')
    .description('the host takes placements again (admin)')
    .action(async (name: string) => {
      let r;
      try {
        r = await ctx.client().uncordonHost(name);
      } catch (e) {
        if (isDsecApiError(e) && e.code === 'NotFound' && /no route/.test(e.message)) throw new UserError('this server is a dsecd, not a gateway', 'point --host (DSEC_HOST) at a dsec-gateway');
        throw e;
      }
      if (ctx.json) {
        writeJson(ctx.io.stdout, r);
        return;
      }
      ctx.out(`${r.name}: ${hostState(r)}\n`);
    });
}
