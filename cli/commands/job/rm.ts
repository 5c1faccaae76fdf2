/**
 * `dsec job rm JOB...`: deletes each job's lease; the job's sandboxes stay as they are
 * (remove them with `dsec rm -f --selector job=JOB`). Deleting a lapsed lease stops
 * dsecd from destroying the job's paused sandboxes, and lets `dsec job lease` create a
 * new one. Reports per job like `rm` (the job on stdout, an error line on stderr;
 * `{results}` of `{job, ok, lease | error}` with --json, see cli/util/batch.ts); exits
 * 125 if any failed.
 */
import type { Command } from 'commander';
import type { Lease } from '../../../sdk/index.js';
import { runBatch } from '../../util/batch.js';
import type { Ctx } from '../../util/context.js';

/** One job's outcome, as printed by `job rm --json` in `{results: [...]}`. */
export type JobRmResult = { job: string; ok: true; lease: Lease } | { job: string; ok: false; error: { code: string; message: string; hint: string | null } };

/** Adds `rm` to the `job` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('rm')
    .description("delete job leases (the jobs' sandboxes stay)")
    .argument('<job...>', 'job names')
    .action(async (jobs: string[]) => {
      const client = ctx.client();
      await runBatch(ctx, jobs, { verb: 'job rm', key: 'job', valueKey: 'lease', noun: 'leases' }, (job) => client.deleteLease(job));
    });
}
