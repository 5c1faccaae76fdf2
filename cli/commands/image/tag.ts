/**
 * `dsec image tag SRC DST`: gives image SRC the additional name DST (both `name[:tag]`);
 * prints the new ref, or the new Image with --json. No data is copied.
 */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** Adds `tag` to the `image` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('tag')
    .description('give an image another name[:tag]')
    .argument('<src>', 'existing image, name[:tag]')
    .argument('<dst>', 'new name, name[:tag]')
    .action(async (src: string, dst: string) => {
      const image = await ctx.client().tagImage(src, dst);
      if (ctx.json) writeJson(ctx.io.stdout, image);
      else ctx.out(image.ref + '\n');
    });
}
