/**
 * `dsec stop [-t DUR] ID...` or `dsec stop [-t DUR] --selector S`: stops each sandbox's
 * processes (SIGTERM, then SIGKILL after the grace period -t, dsecd's default 10s;
 * `-t 0` kills at once). The writable layer stays; `dsec start` runs it again. Reports
 * per id like `rm` (the id on stdout, an error line on stderr; `{results}` with --json,
 * see cli/util/batch.ts, or cli/util/bulk.ts for --selector); exits 125 if any failed.
 */
import type { Command } from 'commander';
import type { Sandbox } from '../../sdk/index.js';
import { runBatch } from '../util/batch.js';
import { addSelectorOption, runBulk, targetsOf } from '../util/bulk.js';
import type { Ctx } from '../util/context.js';
import { parseGrace } from '../util/exec.js';
import { flag } from '../util/parse.js';

/** One id's outcome, as printed by `stop --json` in `{results: [...]}`. */
export type StopResult = { id: string; ok: true; sandbox: Sandbox } | { id: string; ok: false; error: { code: string; message: string; hint: string | null } };

/** Adds `stop` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent
    .command('stop')
    .description('stop running sandboxes (SIGTERM, then SIGKILL after the grace period)')
    .argument('[id...]', 'sandbox ids (or --selector)')
    .option('-t, --time <dur>', "grace period between SIGTERM and SIGKILL, with a unit (e.g. 500ms, 30s, 2m); 0 kills at once (default: dsecd's, 10s)", flag('--time', (t: string) => parseGrace(t)));
  return addSelectorOption(cmd).action(async (ids: string[], opts: { time?: number; selector?: string }) => {
    const t = targetsOf('stop', ids, opts.selector);
    if ('selector' in t) {
      await runBulk(ctx, { selector: t.selector, action: 'stop', ...(opts.time === undefined ? {} : { timeout_ms: opts.time }) }, { verb: 'stop' });
      return;
    }
    const client = ctx.client();
    await runBatch(ctx, t.ids, { verb: 'stop', key: 'id', valueKey: 'sandbox', noun: 'sandboxes' }, (id) =>
      client.stopSandbox(id, opts.time === undefined ? {} : { timeoutMs: opts.time }),
    );
  });
}
