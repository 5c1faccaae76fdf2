/**
 * `dsec image rm REF...`: removes each image manifest, reporting per ref (the ref on
 * stdout when removed, an error line on stderr when not). Exits 125 if any failed; the
 * others are still removed. Layers stay in the store until `dsec image prune`.
 */
import type { Command } from 'commander';
import { DsecApiError, type Image } from '../../../sdk/index.js';
import type { Ctx } from '../../util/context.js';
import { EXIT, hintFor } from '../../util/errors.js';
import { writeJson } from '../../util/output.js';

/** One ref's outcome, as printed by `image rm --json` in `{results: [...]}`. */
export type ImageRmResult = { ref: string; ok: true; image: Image } | { ref: string; ok: false; error: { code: string; message: string } };

/** Adds `rm` to the `image` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('rm')
    .alias('remove')
    .description('remove images (their layers stay until `dsec image prune`)')
    .argument('<ref...>', 'images, name[:tag]')
    .action(async (refs: string[]) => {
      const client = ctx.client();
      const results: ImageRmResult[] = await Promise.all(
        refs.map(async (ref): Promise<ImageRmResult> => {
          try {
            return { ref, ok: true, image: await client.removeImage(ref) };
          } catch (e) {
            if (!(e instanceof DsecApiError)) throw e;
            return { ref, ok: false, error: { code: e.code, message: e.message } };
          }
        }),
      );
      const failed = results.filter((r) => !r.ok);
      if (ctx.json) {
        writeJson(ctx.io.stdout, { results });
      } else {
        for (const r of results) {
          if (r.ok) ctx.out(r.ref + '\n');
          else ctx.err(`dsec: image rm ${r.ref}: ${r.error.message} (${r.error.code})\n`);
        }
        const codes = new Set(failed.map((r) => (r.ok ? '' : r.error.code)));
        for (const code of codes) ctx.err(`hint: ${hintFor(code as DsecApiError['code'], 'image rm')}\n`);
      }
      if (failed.length > 0) ctx.exitCode = EXIT.failure;
    });
}
