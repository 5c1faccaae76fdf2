/**
 * `dsec image compose NAME[:TAG] LAYER... [--from IMAGE]`: names a new image made of
 * layers already in the store (lowest first; full digests or unique prefixes as `dsec
 * layer ls` shows them), with the config of --from; the security flags
 * (cli/util/security.ts) set its security defaults, merged field by field over --from's.
 * Prints the new ref, or the Image with --json. No data is copied.
 */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { resolveLayerDigests } from '../../util/layers.js';
import { writeJson } from '../../util/output.js';
import { addImageSecurityOptions, imageSecurityOf, type ImageSecurityFlags } from '../../util/security.js';

/** Adds `compose` to the `image` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return addImageSecurityOptions(parent
    .command('compose')
    .description('make an image from layers already in the store')
    .argument('<image>', 'name of the new image, name[:tag]')
    .argument('<layer...>', 'layer digests, lowest first (sha256:<hex> or a unique hex prefix)')
    .option('--from <image>', 'take the config (env, cwd, user, cmd, security) from this image'))
    .action(async (image: string, layers: string[], opts: { from?: string } & ImageSecurityFlags) => {
      const client = ctx.client();
      const digests = await resolveLayerDigests(client, layers);
      const security = imageSecurityOf(opts);
      const result = await client.composeImage({ image, layers: digests, ...(opts.from !== undefined ? { from: opts.from } : {}), ...(security ? { config: { security } } : {}) });
      if (ctx.json) writeJson(ctx.io.stdout, result);
      else ctx.out(result.ref + '\n');
    });
}
