/**
 * `dsec job renew JOB [--ttl DUR]`: the heartbeat. Extends JOB's existing lease to expire
 * DUR (default its current TTL) from now; prints the lease line (`job lease`), or the
 * lease with --json. Refused once the lease has expired (FailedPrecondition: the job's
 * sandboxes are paused and will be destroyed; delete the lease and create a new one),
 * and for a job without a lease (NotFound).
 */
import type { Command } from 'commander';
import { renderLeaseLine } from '../../ui/jobs.js';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';
import { parseLeaseTtl } from './lease.js';

/** Adds `renew` to the `job` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('renew')
    .description("renew a job's lease before it expires")
    .argument('<job>', 'job name')
    .option('--ttl <dur>', "expire this long from now (default: the lease's current TTL)", parseLeaseTtl)
    .action(async (job: string, opts: { ttl?: number }) => {
      const lease = await ctx.client().renewLease(job, { ttlS: opts.ttl });
      if (ctx.json) writeJson(ctx.io.stdout, lease);
      else ctx.out(renderLeaseLine(lease) + '\n');
    });
}
