/**
 * `dsec stop [-t DUR] ID...`: stops each sandbox's processes (SIGTERM, then SIGKILL after
 * the grace period -t, dsecd's default 10s; `-t 0` kills at once). The writable layer
 * stays; `dsec start` runs it again. Reports per id like `rm` (the id on stdout, an error
 * line on stderr; `{results}` with --json, see cli/util/batch.ts); exits 125 if any failed.
 */
import type { Command } from 'commander';
import type { Sandbox } from '../../sdk/index.js';
import { runBatch } from '../util/batch.js';
import type { Ctx } from '../util/context.js';
import { parseGrace } from '../util/exec.js';
import { flag } from '../util/parse.js';

/** One id's outcome, as printed by `stop --json` in `{results: [...]}`. */
export type StopResult = { id: string; ok: true; sandbox: Sandbox } | { id: string; ok: false; error: { code: string; message: string; hint: string | null } };

/** Adds `stop` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('stop')
    .description('stop running sandboxes (SIGTERM, then SIGKILL after the grace period)')
    .argument('<id...>', 'sandbox ids')
    .option('-t, --time <dur>', "grace period between SIGTERM and SIGKILL, with a unit (e.g. 500ms, 30s, 2m); 0 kills at once (default: dsecd's, 10s)", flag('--time', (t: string) => parseGrace(t)))
    .action(async (ids: string[], opts: { time?: number }) => {
      const client = ctx.client();
      await runBatch(ctx, ids, { verb: 'stop', key: 'id', valueKey: 'sandbox', noun: 'sandboxes' }, (id) =>
        client.stopSandbox(id, opts.time === undefined ? {} : { timeoutMs: opts.time }),
      );
    });
}
