/**
 * `dsec images`: an alias of `dsec image ls` (REF, LAYERS, SIZE, CREATED, or `{images}`
 * with --json), kept for scripts written before the `image` verbs.
 */
import type { Command } from 'commander';
import type { Ctx } from '../util/context.js';
import { listImages } from './image/ls.js';

/** Adds `images` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('images')
    .description('list images (same as `dsec image ls`)')
    .action(() => listImages(ctx));
}
