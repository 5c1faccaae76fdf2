/**
 * `dsec image import PATH --tag NAME[:TAG] [--format auto|tar|oci]`: imports a root
 * filesystem tar (one layer; plain, gzip or zstd) or an OCI image layout / docker save
 * archive (one layer per image layer). PATH is resolved to an absolute path here and
 * read by dsecd on its own host. `auto` looks at PATH here (cli/util/archive.ts). The
 * security flags (cli/util/security.ts) set the image's security defaults.
 * Progress on stderr; the new ref (or Image with --json) on stdout.
 */
import { stat } from 'node:fs/promises';
import { resolve } from 'node:path';
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { detectImportFormat, type ImportFormat } from '../../util/archive.js';
import { runImageOperation } from '../../util/long.js';
import { flag } from '../../util/parse.js';
import { addImageSecurityOptions, imageSecurityOf, type ImageSecurityFlags } from '../../util/security.js';

/** Values of `--format`. */
export const IMPORT_FORMATS = ['auto', 'tar', 'oci'] as const;

/** Parses `--format`: one of {@link IMPORT_FORMATS}. */
function parseFormat(text: string): string {
  if (!(IMPORT_FORMATS as readonly string[]).includes(text)) {
    throw new UserError(`unknown format ${JSON.stringify(text)}`, `formats are ${IMPORT_FORMATS.join(', ')}; to build from a directory tree use \`dsec image build\``);
  }
  return text;
}

/** Adds `import` to the `image` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return addImageSecurityOptions(parent
    .command('import')
    .description('import a root filesystem tar or an OCI/docker archive (read by dsecd on its host)')
    .argument('<path>', 'tar file, OCI layout (directory or tar) or docker save archive')
    .requiredOption('-t, --tag <name[:tag]>', 'name of the new image')
    .option('--format <format>', `${IMPORT_FORMATS.join(', ')}; auto looks at PATH`, flag('--format', parseFormat), 'auto')
    .option('--ref <name>', 'which image of a multi-image archive (oci only), e.g. localhost/app:1'))
    .addHelpText(
      'after',
      '\nPATH is resolved to an absolute path here and read by dsecd on its own host, with\n' +
        "dsecd's permissions. --format auto needs PATH to be visible here too: a directory\n" +
        'with oci-layout or manifest.json, or an archive (plain or gzip) holding\n' +
        'oci-layout/index.json/manifest.json, is oci; any other archive is a root\n' +
        'filesystem tar.\n',
    )
    .action(async (p: string, flags: { tag: string; format: string; ref?: string } & ImageSecurityFlags) => {
      const path = resolve(p);
      let type: ImportFormat;
      if (flags.format === 'auto') {
        type = await detectImportFormat(path);
      } else {
        type = flags.format as ImportFormat;
        const st = await stat(path).catch(() => undefined);
        if (type === 'tar' && st?.isDirectory()) {
          throw new UserError(`${path} is a directory, not a tar`, 'to build an image from a directory tree use `dsec image build DIR --tag NAME`');
        }
      }
      const client = ctx.client();
      if (flags.ref && type !== 'oci') throw new UserError('--ref selects an image of an OCI/docker archive', 'use --format oci, or drop --ref');
      const security = imageSecurityOf(flags);
      await runImageOperation(ctx, 'import', (opts) =>
        client.importImage({ type, path, image: flags.tag, ...(flags.ref ? { source_ref: flags.ref } : {}), ...(security ? { config: { security } } : {}) }, opts));
    });
}
