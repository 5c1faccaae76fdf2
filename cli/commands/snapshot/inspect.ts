/**
 * `dsec snapshot inspect REF`: the snapshot (by id or name) as the API returns it, always
 * as pretty JSON.
 */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** Adds `inspect` to the `snapshot` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('inspect')
    .description('print a snapshot as JSON')
    .argument('<ref>', 'snapshot id (snap-...) or name')
    .action(async (ref: string) => {
      writeJson(ctx.io.stdout, await ctx.client().getSnapshot(ref));
    });
}
