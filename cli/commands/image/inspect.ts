/**
 * `dsec image inspect REF`: the image as the API returns it (ref, layers, config, size,
 * creation time), always as pretty JSON.
 */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** Adds `inspect` to the `image` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('inspect')
    .description('print an image as JSON')
    .argument('<ref>', 'image, name[:tag] (tag default latest)')
    .action(async (ref: string) => {
      writeJson(ctx.io.stdout, await ctx.client().getImage(ref));
    });
}
