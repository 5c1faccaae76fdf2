/**
 * `dsec layer inspect DIGEST`: one layer as the API returns it, always as pretty JSON.
 * DIGEST is `sha256:<64 hex>` or a unique prefix of the hex (e.g. the 12 digits
 * `dsec layer ls` prints); no match or several matches is a user error.
 */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { resolveLayer } from '../../util/layers.js';
import { writeJson } from '../../util/output.js';

/** Adds `inspect` to the `layer` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('inspect')
    .description('print a layer as JSON')
    .argument('<digest>', 'sha256:<hex>, or a unique prefix of the hex')
    .action(async (digest: string) => {
      writeJson(ctx.io.stdout, await resolveLayer(ctx.client(), digest));
    });
}
