/**
 * `dsec layer ls`: the layers of the store as a table (DIGEST (12 hex), SIZE, SOURCE,
 * IMAGES, SANDBOXES, AGE), or `{layers}` with --json.
 */
import type { Command } from 'commander';
import { renderLayerTable } from '../../ui/images.js';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** Adds `ls` to the `layer` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('ls')
    .alias('list')
    .description('list layers')
    .action(async () => {
      const layers = await ctx.client().listLayers();
      if (ctx.json) writeJson(ctx.io.stdout, { layers });
      else ctx.out(renderLayerTable(layers, { color: ctx.color }));
    });
}
