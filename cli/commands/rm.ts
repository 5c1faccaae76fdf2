/**
 * `dsec rm [-f] ID...`: destroys each sandbox, reporting per id (the id on stdout when
 * destroyed, an error line on stderr when not). Exits 125 if any failed; the others are
 * still destroyed.
 */
import type { Command } from 'commander';
import { DsecApiError, type Sandbox } from '../../sdk/index.js';
import type { Ctx } from '../util/context.js';
import { EXIT, hintFor } from '../util/errors.js';
import { writeJson } from '../util/output.js';

/** One id's outcome, as printed by `rm --json` in `{results: [...]}`. */
export type RmResult = { id: string; ok: true; sandbox: Sandbox } | { id: string; ok: false; error: { code: string; message: string } };

/** Adds `rm` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('rm')
    .description('destroy sandboxes')
    .argument('<id...>', 'sandbox ids')
    .option('-f, --force', 'destroy even when running (kills its processes)')
    .action(async (ids: string[], opts: { force?: boolean }) => {
      const client = ctx.client();
      const results: RmResult[] = await Promise.all(
        ids.map(async (id): Promise<RmResult> => {
          try {
            return { id, ok: true, sandbox: await client.deleteSandbox(id, { force: opts.force }) };
          } catch (e) {
            if (!(e instanceof DsecApiError)) throw e;
            return { id, ok: false, error: { code: e.code, message: e.message } };
          }
        }),
      );
      const failed = results.filter((r) => !r.ok);
      if (ctx.json) {
        writeJson(ctx.io.stdout, { results });
      } else {
        for (const r of results) {
          if (r.ok) ctx.out(r.id + '\n');
          else ctx.err(`dsec: rm ${r.id}: ${r.error.message} (${r.error.code})\n`);
        }
        const codes = new Set(failed.map((r) => (r.ok ? '' : r.error.code)));
        for (const code of codes) ctx.err(`hint: ${hintFor(code as DsecApiError['code'], 'rm')}\n`);
      }
      if (failed.length > 0) ctx.exitCode = EXIT.failure;
    });
}
