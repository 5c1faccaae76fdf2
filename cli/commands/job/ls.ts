/**
 * `dsec job ls`: lists leases as a table (JOB, TTL, EXPIRES IN, STATE active|lapsed,
 * SANDBOXES), their job names with -q, or `{leases}` with --json.
 */
import type { Command } from 'commander';
import { renderLeaseTable } from '../../ui/jobs.js';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** Adds `ls` to the `job` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('ls')
    .description('list job leases')
    .option('-q, --quiet', 'print only job names')
    .action(async (opts: { quiet?: boolean }) => {
      const leases = await ctx.client().listLeases();
      if (ctx.json) writeJson(ctx.io.stdout, { leases });
      else if (opts.quiet) ctx.out(leases.map((l) => l.job + '\n').join(''));
      else ctx.out(renderLeaseTable(leases, { color: ctx.color }));
    });
}
