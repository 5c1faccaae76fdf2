/**
 * `dsec stop ID`: stop a running sandbox; prints the id, or the Sandbox with --json.
 */
import type { Command } from 'commander';
import type { Ctx } from '../util/context.js';
import { writeJson } from '../util/output.js';

/** Adds `stop` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('stop')
    .description('stop a running sandbox')
    .argument('<id>', 'sandbox id')
    .action(async (id: string) => {
      const sandbox = await ctx.client().stopSandbox(id);
      if (ctx.json) writeJson(ctx.io.stdout, sandbox);
      else ctx.out(sandbox.id + '\n');
    });
}
