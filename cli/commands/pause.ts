/**
 * `dsec pause ID...` or `dsec pause --selector S`: freezes each sandbox (cgroup freezer)
 * and reclaims its memory; `dsec resume` thaws it exactly where it stopped. Prints one
 * line per sandbox saying what was reclaimed, e.g.
 * `ID paused, reclaimed 38MiB (file 40MiB -> 2MiB; no swap: anon 30MiB stays)`:
 * without swap only page cache can go and anonymous memory stays resident. Pausing a
 * paused sandbox is not an error (nothing is reclaimed).
 *
 * With ids, one call per id (cli/util/batch.ts); `--json` results are
 * `{id, ok: true, sandbox, reclaim}` (reclaim null when it was already paused). With
 * `--selector`, one bulk call (cli/util/bulk.ts); results are dsecd's
 * `{id, ok: true, state, reclaim?}`. Either way a failure is an `{id, ok: false, error}`
 * result and a stderr line, and the run exits 125.
 */
import type { Command } from 'commander';
import type { PauseResult } from '../../sdk/index.js';
import { renderPauseLine } from '../ui/jobs.js';
import { runBatch } from '../util/batch.js';
import { addSelectorOption, runBulk, targetsOf } from '../util/bulk.js';
import type { Ctx } from '../util/context.js';

/** Adds `pause` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent
    .command('pause')
    .description('freeze sandboxes and reclaim their memory (`dsec resume` thaws them)')
    .argument('[id...]', 'sandbox ids (or --selector)');
  return addSelectorOption(cmd).action(async (ids: string[], opts: { selector?: string }) => {
    const t = targetsOf('pause', ids, opts.selector);
    if ('selector' in t) {
      await runBulk(ctx, { selector: t.selector, action: 'pause' }, { verb: 'pause', line: (r) => renderPauseLine(r.id, r.reclaim) });
      return;
    }
    const client = ctx.client();
    await runBatch<PauseResult>(
      ctx,
      t.ids,
      {
        verb: 'pause',
        key: 'id',
        valueKey: 'sandbox',
        noun: 'sandboxes',
        line: (id, v) => renderPauseLine(id, v.reclaim),
        json: (v) => ({ sandbox: v.sandbox, reclaim: v.reclaim }),
      },
      (id) => client.pauseSandbox(id),
    );
  });
}
