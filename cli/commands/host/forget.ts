/**
 * `dsec host forget NAME` (through a gateway): remove a down host's registration and name claim from the fleet (admin).
 * Prints the host's new state, or the answer with --json.
 */
import type { Command } from 'commander';
import { isDsecApiError } from '../../../sdk/index.js';
import { hostState } from '../../ui/hosts.js';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { writeJson } from '../../util/output.js';

/** Adds `forget` to the `host` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('forget <name>')
    .description('remove a down host\'s registration and name claim from the fleet (admin)')
    .action(async (name: string) => {
      let r;
      try {
        r = await ctx.client().forgetHost(name);
      } catch (e) {
        if (isDsecApiError(e) && e.code === 'NotFound' && /no route/.test(e.message)) throw new UserError('this server is a dsecd, not a gateway', 'point --host (DSEC_HOST) at a dsec-gateway');
        throw e;
      }
      if (ctx.json) {
        writeJson(ctx.io.stdout, r);
        return;
      }
      ctx.out(`${r.name}: forgotten (id ${r.id ?? '-'})\n`);
    });
}
