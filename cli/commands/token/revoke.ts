/**
 * `dsec token revoke ID...`: revokes API tokens: refused from now on, and the connections
 * they opened (attach, logs -f, events) are closed at once. Prints each id, or the tokens
 * with --json. Admin only. Fails (125) if any id is unknown, after revoking the others.
 */
import type { Command } from 'commander';
import type { TokenInfo } from '../../../sdk/index.js';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** Adds `revoke` to the `token` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('revoke')
    .description('revoke API tokens (effective at once, open streams included)')
    .argument('<id...>', 'token ids (`dsec token ls`)')
    .action(async (ids: string[]) => {
      const done: TokenInfo[] = [];
      let failure: unknown;
      for (const id of ids) {
        try {
          done.push(await ctx.client().revokeToken(id));
          if (!ctx.json) ctx.out(id + '\n');
        } catch (e) {
          failure ??= e;
        }
      }
      if (ctx.json) writeJson(ctx.io.stdout, { tokens: done });
      if (failure) throw failure;
    });
}
