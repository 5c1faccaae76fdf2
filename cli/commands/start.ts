/**
 * `dsec start ID`: start a stopped sandbox; prints the id, or the Sandbox with --json.
 */
import type { Command } from 'commander';
import type { Ctx } from '../util/context.js';
import { writeJson } from '../util/output.js';

/** Adds `start` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('start')
    .description('start a stopped sandbox')
    .argument('<id>', 'sandbox id')
    .action(async (id: string) => {
      const sandbox = await ctx.client().startSandbox(id);
      if (ctx.json) writeJson(ctx.io.stdout, sandbox);
      else ctx.out(sandbox.id + '\n');
    });
}
