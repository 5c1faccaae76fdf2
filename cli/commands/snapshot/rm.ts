/**
 * `dsec snapshot rm REF...`: removes each snapshot (by id or name), reporting per ref (the
 * ref on stdout when removed, an error line on stderr when not; `{results}` of
 * `{ref, ok, snapshot | error}` with --json, see cli/util/batch.ts). Exits 125 if any
 * failed; the others are still removed. Sandboxes restored or forked from a snapshot
 * keep running.
 */
import type { Command } from 'commander';
import type { Snapshot } from '../../../sdk/index.js';
import { runBatch } from '../../util/batch.js';
import type { Ctx } from '../../util/context.js';

/** Adds `rm` to the `snapshot` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('rm')
    .alias('remove')
    .description('remove snapshots (sandboxes restored from them stay)')
    .argument('<ref...>', 'snapshot ids (snap-...) or names')
    .action(async (refs: string[]) => {
      const client = ctx.client();
      await runBatch<Snapshot>(ctx, refs, { verb: 'snapshot rm', key: 'ref', valueKey: 'snapshot', noun: 'snapshots' }, (ref) => client.deleteSnapshot(ref));
    });
}
