/**
 * `dsec snapshot ls`: lists snapshots as a table (ID, NAME, SANDBOX, IMAGE, SIZE,
 * CREATED), their ids with -q, or `{snapshots}` with --json.
 */
import type { Command } from 'commander';
import { renderSnapshotTable } from '../../ui/snapshots.js';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** Adds `ls` to the `snapshot` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('ls')
    .alias('list')
    .description('list snapshots')
    .option('-q, --quiet', 'print only snapshot ids')
    .action(async (opts: { quiet?: boolean }) => {
      const snapshots = await ctx.client().listSnapshots();
      if (ctx.json) writeJson(ctx.io.stdout, { snapshots });
      else if (opts.quiet) ctx.out(snapshots.map((s) => s.id + '\n').join(''));
      else ctx.out(renderSnapshotTable(snapshots, { color: ctx.color }));
    });
}
