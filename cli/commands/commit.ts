/**
 * `dsec commit ID NAME[:TAG] [--exclude GLOB]... [security flags]`: packs the sandbox's
 * writable layer (secrets, caches and the --exclude globs stripped) as a new layer on top
 * of its image and names the result. The security flags (cli/util/security.ts) change
 * the new image's security defaults, field by field over the sandbox's image's. Prints the new ref on stdout and
 * `layer sha256:… (N bytes), stripped: …` plus `warning: …` lines on stderr; --json
 * prints the CommitResult.
 */
import type { Command } from 'commander';
import { renderCommitNote } from '../ui/images.js';
import type { Ctx } from '../util/context.js';
import { UserError } from '../util/errors.js';
import { writeJson } from '../util/output.js';
import { flag } from '../util/parse.js';
import { addImageSecurityOptions, imageSecurityOf, type ImageSecurityFlags } from '../util/security.js';

/** Commander collector for repeatable `--exclude`: a non-empty glob, appended. */
function collectGlob(text: string, prev: string[] | undefined): string[] {
  if (text === '') throw new UserError('empty glob', 'write a glob relative to the sandbox root, e.g. --exclude \'srv/cache/**\'');
  return [...(prev ?? []), text];
}

/** Adds `commit` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return addImageSecurityOptions(parent
    .command('commit')
    .description("save a sandbox's changes as a new image")
    .argument('<id>', 'sandbox id')
    .argument('<image>', 'name of the new image, name[:tag]')
    .option('--exclude <glob>', 'also strip paths matching this glob (relative to the sandbox root), repeatable', flag('--exclude', collectGlob)))
    .action(async (id: string, image: string, opts: { exclude?: string[] } & ImageSecurityFlags) => {
      const security = imageSecurityOf(opts);
      const result = await ctx.client().commit(id, { image, ...(opts.exclude !== undefined ? { exclude: opts.exclude } : {}), ...(security ? { security } : {}) });
      if (ctx.json) {
        writeJson(ctx.io.stdout, result);
        return;
      }
      ctx.out(result.image.ref + '\n');
      ctx.err(renderCommitNote(result));
    });
}
