/**
 * `dsec traj rm ID...`: discards each trajectory and its recorded steps, reporting per id
 * (the id on stdout when removed, an error line on stderr when not; `{results}` of
 * `{id, ok, removed_steps | error}` with --json, see cli/util/batch.ts). Exits 125 if any
 * failed; the others are still removed. A removed id stays reserved: `dsec exec
 * --trajectory` with it is refused afterwards (reason `trajectory_removed`) rather than
 * running its steps again. A trajectory with a step running now is refused (Conflict).
 */
import type { Command } from 'commander';
import type { TrajectoryRemoved } from '../../../sdk/index.js';
import { runBatch } from '../../util/batch.js';
import type { Ctx } from '../../util/context.js';

/** Adds `rm` to the `traj` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('rm')
    .alias('remove')
    .description('remove trajectories and their recorded steps (the ids stay reserved)')
    .argument('<id...>', 'trajectory ids')
    .action(async (ids: string[]) => {
      const client = ctx.client();
      await runBatch<TrajectoryRemoved>(
        ctx,
        ids,
        { verb: 'traj rm', key: 'id', valueKey: 'removed', noun: 'trajectories', json: (r) => ({ removed_steps: r.removed_steps }) },
        (id) => client.deleteTrajectory(id),
      );
    });
}
