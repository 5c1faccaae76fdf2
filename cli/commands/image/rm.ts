/**
 * `dsec image rm REF...`: removes each image manifest, reporting per ref (the ref on
 * stdout when removed, an error line on stderr when not; `{results}` with --json, see
 * cli/util/batch.ts). Exits 125 if any failed; the others are still removed. Layers
 * stay in the store until `dsec image prune`.
 */
import type { Command } from 'commander';
import type { Image } from '../../../sdk/index.js';
import { runBatch } from '../../util/batch.js';
import type { Ctx } from '../../util/context.js';

/** One ref's outcome, as printed by `image rm --json` in `{results: [...]}`. */
export type ImageRmResult = { ref: string; ok: true; image: Image } | { ref: string; ok: false; error: { code: string; message: string; hint: string | null } };

/** Adds `rm` to the `image` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('rm')
    .alias('remove')
    .description('remove images (their layers stay until `dsec image prune`)')
    .argument('<ref...>', 'images, name[:tag]')
    .action(async (refs: string[]) => {
      const client = ctx.client();
      await runBatch(ctx, refs, { verb: 'image rm', key: 'ref', valueKey: 'image', noun: 'images' }, (ref) => client.removeImage(ref));
    });
}
