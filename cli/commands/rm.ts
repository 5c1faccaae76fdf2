/**
 * `dsec rm [-f] ID...`: destroys each sandbox, reporting per id (the id on stdout when
 * destroyed, an error line on stderr when not; `{results}` with --json, see
 * cli/util/batch.ts). Exits 125 if any failed; the others are still destroyed.
 */
import type { Command } from 'commander';
import type { Sandbox } from '../../sdk/index.js';
import { runBatch } from '../util/batch.js';
import type { Ctx } from '../util/context.js';

/** One id's outcome, as printed by `rm --json` in `{results: [...]}`. */
export type RmResult = { id: string; ok: true; sandbox: Sandbox } | { id: string; ok: false; error: { code: string; message: string; hint: string | null } };

/** Adds `rm` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('rm')
    .description('destroy sandboxes')
    .argument('<id...>', 'sandbox ids')
    .option('-f, --force', 'destroy even when running (kills its processes)')
    .action(async (ids: string[], opts: { force?: boolean }) => {
      const client = ctx.client();
      await runBatch(ctx, ids, { verb: 'rm', key: 'id', valueKey: 'sandbox', noun: 'sandboxes' }, (id) => client.deleteSandbox(id, { force: opts.force }));
    });
}
