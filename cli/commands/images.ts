/**
 * `dsec images`: the images dsecd can create sandboxes from (NAME, TAG, LAYERS, AGE),
 * or `{images}` with --json.
 */
import type { Command } from 'commander';
import { renderImageTable } from '../ui/images.js';
import type { Ctx } from '../util/context.js';
import { writeJson } from '../util/output.js';

/** Adds `images` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('images')
    .description('list images')
    .action(async () => {
      const images = await ctx.client().listImages();
      if (ctx.json) writeJson(ctx.io.stdout, { images });
      else ctx.out(renderImageTable(images, { color: ctx.color }));
    });
}
