/**
 * `dsec inspect ID`: the sandbox as the API returns it, always as pretty JSON.
 */
import type { Command } from 'commander';
import type { Ctx } from '../util/context.js';
import { writeJson } from '../util/output.js';

/** Adds `inspect` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('inspect')
    .description('print a sandbox as JSON')
    .argument('<id>', 'sandbox id')
    .action(async (id: string) => {
      writeJson(ctx.io.stdout, await ctx.client().getSandbox(id));
    });
}
