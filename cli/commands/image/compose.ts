/**
 * `dsec image compose NAME[:TAG] LAYER... [--from IMAGE]`: names a new image made of
 * layers already in the store (lowest first; full digests or unique prefixes as `dsec
 * layer ls` shows them), with the config of --from. Prints the new ref, or the Image
 * with --json. No data is copied.
 */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { resolveLayerDigests } from '../../util/layers.js';
import { writeJson } from '../../util/output.js';

/** Adds `compose` to the `image` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('compose')
    .description('make an image from layers already in the store')
    .argument('<image>', 'name of the new image, name[:tag]')
    .argument('<layer...>', 'layer digests, lowest first (sha256:<hex> or a unique hex prefix)')
    .option('--from <image>', 'take the config (env, cwd, user, cmd) from this image')
    .action(async (image: string, layers: string[], opts: { from?: string }) => {
      const client = ctx.client();
      const digests = await resolveLayerDigests(client, layers);
      const result = await client.composeImage({ image, layers: digests, ...(opts.from !== undefined ? { from: opts.from } : {}) });
      if (ctx.json) writeJson(ctx.io.stdout, result);
      else ctx.out(result.ref + '\n');
    });
}
