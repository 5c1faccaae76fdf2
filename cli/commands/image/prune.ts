/**
 * `dsec image prune [--dry-run]`: removes layers that no image, lease or sandbox uses
 * (dsecd keeps young ones for a grace period) and leftover temporary files; prints each
 * removed layer and the bytes freed, or the PruneResult with --json.
 */
import type { Command } from 'commander';
import { renderPruneResult } from '../../ui/images.js';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** Adds `prune` to the `image` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('prune')
    .description('remove layers no image or sandbox uses')
    .option('--dry-run', 'only show what would be removed')
    .action(async (opts: { dryRun?: boolean }) => {
      const result = await ctx.client().pruneImages({ dryRun: opts.dryRun === true ? true : undefined });
      if (ctx.json) writeJson(ctx.io.stdout, result);
      else ctx.out(renderPruneResult(result));
    });
}
