/**
 * `dsec traj ls`: lists the trajectories this dsecd holds as a table (ID, STEPS, LAST,
 * UNKNOWN, SANDBOX, HOST, UPDATED), their ids with -q, or `{trajectories}` with --json.
 */
import type { Command } from 'commander';
import { renderTrajectoryTable } from '../../ui/trajectories.js';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** Adds `ls` to the `traj` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('ls')
    .alias('list')
    .description('list trajectories')
    .option('-q, --quiet', 'print only trajectory ids')
    .action(async (opts: { quiet?: boolean }) => {
      const trajectories = await ctx.client().listTrajectories();
      if (ctx.json) writeJson(ctx.io.stdout, { trajectories });
      else if (opts.quiet) ctx.out(trajectories.map((t) => t.id + '\n').join(''));
      else ctx.out(renderTrajectoryTable(trajectories, { color: ctx.color }));
    });
}
