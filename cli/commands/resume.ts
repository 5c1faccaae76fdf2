/**
 * `dsec resume ID...` or `dsec resume --selector S`: thaws paused sandboxes exactly where
 * they stopped (processes, open files, sockets, writable layer). Resuming a running
 * sandbox is not an error. Prints each id resumed; with ids `--json` results are
 * `{id, ok: true, sandbox}` (cli/util/batch.ts), with `--selector` dsecd's
 * `{id, ok: true, state}` (cli/util/bulk.ts). Exits 125 if any failed.
 */
import type { Command } from 'commander';
import { runBatch } from '../util/batch.js';
import { addSelectorOption, runBulk, targetsOf } from '../util/bulk.js';
import type { Ctx } from '../util/context.js';

/** Adds `resume` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent
    .command('resume')
    .description('thaw paused sandboxes')
    .argument('[id...]', 'sandbox ids (or --selector)');
  return addSelectorOption(cmd).action(async (ids: string[], opts: { selector?: string }) => {
    const t = targetsOf('resume', ids, opts.selector);
    if ('selector' in t) {
      await runBulk(ctx, { selector: t.selector, action: 'resume' }, { verb: 'resume' });
      return;
    }
    const client = ctx.client();
    await runBatch(ctx, t.ids, { verb: 'resume', key: 'id', valueKey: 'sandbox', noun: 'sandboxes' }, (id) => client.resumeSandbox(id));
  });
}
