/**
 * `dsec host drain NAME` (through a gateway): cordon the host and list the sandboxes left on it (admin).
 * Prints the host's new state and what is left on it (ID STATE LABELS), or the answer with --json.
 */
import type { Command } from 'commander';
import { isDsecApiError } from '../../../sdk/index.js';
import { hostState } from '../../ui/hosts.js';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { writeJson } from '../../util/output.js';

/** Adds `drain` to the `host` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('drain <name>')
    .description('cordon the host and list the sandboxes left on it (admin)')
    .action(async (name: string) => {
      let r;
      try {
        r = await ctx.client().drainHost(name);
      } catch (e) {
        if (isDsecApiError(e) && e.code === 'NotFound' && /no route/.test(e.message)) throw new UserError('this server is a dsecd, not a gateway', 'point --host (DSEC_HOST) at a dsec-gateway');
        throw e;
      }
      if (ctx.json) {
        writeJson(ctx.io.stdout, r);
        return;
      }
      ctx.out(`${r.host.name}: ${hostState(r.host)}; ${r.left.length} sandbox(es) left\n`);
      for (const s of r.left) ctx.out(`${s.id}  ${s.state}  ${Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(',') || '-'}\n`);
    });
}
