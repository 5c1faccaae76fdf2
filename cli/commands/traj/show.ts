/**
 * `dsec traj show ID`: the steps of a trajectory as a table (STEP, STATE, EXIT, DURATION,
 * ARGV, REPLAYS), in step order, with a note on stderr for each step whose outcome is
 * unknown (and how to rerun it); --json prints the TrajectoryDetail. The recorded output
 * is not shown: `dsec traj export ID` has it.
 */
import type { Command } from 'commander';
import { renderStepTable, renderUnknownStepNotes } from '../../ui/trajectories.js';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** Adds `show` to the `traj` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('show')
    .alias('inspect')
    .description('show the steps of a trajectory')
    .argument('<id>', 'trajectory id')
    .option('--no-trunc', 'full commands')
    .action(async (id: string, opts: { trunc?: boolean }) => {
      const t = await ctx.client().getTrajectory(id);
      if (ctx.json) {
        writeJson(ctx.io.stdout, t);
        return;
      }
      ctx.out(renderStepTable(t.step_list, { color: ctx.color, noTrunc: opts.trunc === false }));
      ctx.err(renderUnknownStepNotes(t));
    });
}
