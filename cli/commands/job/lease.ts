/**
 * `dsec job lease JOB --ttl DUR`: creates the lease of JOB, or renews it if it exists, so
 * that it expires DUR from now. A job is the sandboxes labelled `job=JOB`
 * (`dsec create --label job=JOB`); while the lease lives they are left alone, and when it
 * lapses dsecd pauses them and destroys them its `destroy_grace_s` later. Prints
 * `job JOB: lease active, expires in 10m (ttl 10m), N sandboxes`, or the lease with
 * --json. An expired lease cannot be renewed: FailedPrecondition, with the hint to delete
 * it (`dsec job rm JOB`) and create a new one.
 */
import type { Command } from 'commander';
import { renderLeaseLine } from '../../ui/jobs.js';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';
import { flag, parseWholeSeconds } from '../../util/parse.js';

/** Parses a lease `--ttl DUR` into whole seconds (1s to 30 days). */
export const parseLeaseTtl = flag('--ttl', (t: string) => parseWholeSeconds(t, '--ttl'));

/** Adds `lease` to the `job` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('lease')
    .description('create or renew the lease of a job (its sandboxes carry label job=JOB)')
    .argument('<job>', 'job name, a label value: 1-63 of [A-Za-z0-9._/-]')
    .requiredOption('--ttl <dur>', 'the lease expires this long from now unless renewed (e.g. 10m; rounded up to whole seconds)', parseLeaseTtl)
    .action(async (job: string, opts: { ttl: number }) => {
      const lease = await ctx.client().putLease(job, opts.ttl);
      if (ctx.json) writeJson(ctx.io.stdout, lease);
      else ctx.out(renderLeaseLine(lease) + '\n');
    });
}
