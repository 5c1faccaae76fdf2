/**
 * `dsec image ls` (also `dsec image list` and the older `dsec images`): the images dsecd
 * can create sandboxes from, as a table (REF, TENANT, LAYERS, SIZE, CREATED), or `{images}`
 * with --json.
 */
import type { Command } from 'commander';
import { renderImageTable } from '../../ui/images.js';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** The action of `image ls` and of its alias `images`. */
export async function listImages(ctx: Ctx): Promise<void> {
  const images = await ctx.client().listImages();
  if (ctx.json) writeJson(ctx.io.stdout, { images });
  else ctx.out(renderImageTable(images, { color: ctx.color }));
}

/** Adds `ls` to the `image` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('ls')
    .alias('list')
    .description('list images')
    .action(() => listImages(ctx));
}
