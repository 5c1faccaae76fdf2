/**
 * `dsec rm [-f] ID...` or `dsec rm -f --selector S`: destroys each sandbox, reporting per
 * id (the id on stdout when destroyed, an error line on stderr when not; `{results}` with
 * --json, see cli/util/batch.ts, or cli/util/bulk.ts for --selector). Exits 125 if any
 * failed; the others are still destroyed. dsecd's bulk destroy destroys running
 * sandboxes too, so `--selector` requires `-f`.
 */
import type { Command } from 'commander';
import type { Sandbox } from '../../sdk/index.js';
import { runBatch } from '../util/batch.js';
import { addSelectorOption, runBulk, targetsOf } from '../util/bulk.js';
import type { Ctx } from '../util/context.js';
import { UserError } from '../util/errors.js';

/** One id's outcome, as printed by `rm --json` in `{results: [...]}`. */
export type RmResult = { id: string; ok: true; sandbox: Sandbox } | { id: string; ok: false; error: { code: string; message: string; hint: string | null } };

/** Adds `rm` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent
    .command('rm')
    .description('destroy sandboxes')
    .argument('[id...]', 'sandbox ids (or --selector)')
    .option('-f, --force', 'destroy even when running (kills its processes); required with --selector');
  return addSelectorOption(cmd).action(async (ids: string[], opts: { force?: boolean; selector?: string }) => {
    const t = targetsOf('rm', ids, opts.selector);
    if ('selector' in t) {
      if (!opts.force) {
        throw new UserError(`rm --selector destroys every matching sandbox, running ones too, so it needs -f`, `\`dsec ls --selector ${t.selector}\` shows what matches; then \`dsec rm -f --selector ${t.selector}\``);
      }
      await runBulk(ctx, { selector: t.selector, action: 'destroy' }, { verb: 'rm' });
      return;
    }
    const client = ctx.client();
    await runBatch(ctx, t.ids, { verb: 'rm', key: 'id', valueKey: 'sandbox', noun: 'sandboxes' }, (id) => client.deleteSandbox(id, { force: opts.force }));
  });
}
