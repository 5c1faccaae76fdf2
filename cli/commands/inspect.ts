/**
 * `dsec inspect ID [--stats]`: the sandbox as the API returns it, always as pretty JSON.
 * With `--stats`, the sandbox's resource usage and refusal counters (GET
 * /v1/sandboxes/{id}/stats: memory, pids, OOM kills, disk use and quota, seccomp and
 * egress denials, forks refused at the pids limit) are added under `stats`.
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
    .option('--stats', 'add the resource usage and refusal counters (seccomp, egress, pids, OOM) under "stats"')
    .action(async (id: string, opts: { stats?: boolean }) => {
      const client = ctx.client();
      const sb = await client.getSandbox(id);
      writeJson(ctx.io.stdout, opts.stats ? { ...sb, stats: await client.sandboxStats(sb.id) } : sb);
    });
}
