/**
 * `dsec snapshot ID [NAME] [--process]` (also `dsec snapshot create ID [NAME]`): captures
 * the sandbox's writable layer as a snapshot to restore (`dsec restore`) or fork
 * (`dsec fork`) from, named NAME when given; the sandbox keeps running. Prints the
 * snapshot id on stdout and `snapshot snap-… of sandbox ID: layer … (SIZE)` on stderr;
 * --json prints the Snapshot. `--process` also checkpoints memory and processes (CRIU),
 * refused (Unimplemented, with the reason) where the host cannot. A microvm sandbox's
 * snapshot always captures the whole machine (kind vm; the note names its state).
 *
 * The default subcommand of `snapshot`: sandbox ids are 16 hex characters, so an id is
 * never taken for `ls`, `inspect` or `rm`.
 */
import type { Command } from 'commander';
import { renderSnapshotNote } from '../../ui/snapshots.js';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { writeJson } from '../../util/output.js';

/** Snapshot names, as the API accepts them (SnapshotName in daemon/api/schema.ts). */
const SNAPSHOT_NAME = /^[a-z0-9][a-z0-9._-]{0,127}$/;

/** Checks NAME before any request; returns it unchanged. */
export function parseSnapshotName(text: string): string {
  if (!SNAPSHOT_NAME.test(text)) {
    throw new UserError(`invalid snapshot name ${JSON.stringify(text)}`, 'snapshot names are 1-128 of [a-z0-9._-], starting with a lowercase letter or digit, e.g. step-12');
  }
  return text;
}

/** Adds `create` to the `snapshot` command `parent`, as its default subcommand. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('create', { isDefault: true })
    .description('snapshot a sandbox (the default: `dsec snapshot ID [NAME]`)')
    .argument('<id>', 'sandbox id')
    .argument('[name]', 'unique name to restore by (default: use the snapshot id)')
    .option('--process', 'also checkpoint memory and processes (needs CRIU on dsecd\'s host)')
    .action(async (id: string, name: string | undefined, opts: { process?: boolean }) => {
      if (name !== undefined) parseSnapshotName(name);
      const snap = await ctx.client().snapshot(id, { ...(name !== undefined ? { name } : {}), ...(opts.process ? { process: true } : {}) });
      if (ctx.json) {
        writeJson(ctx.io.stdout, snap);
        return;
      }
      ctx.out(snap.id + '\n');
      ctx.err(renderSnapshotNote(snap));
    });
}
