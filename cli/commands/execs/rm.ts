/**
 * `dsec execs rm [-f] ID EXEC_ID...`: forgets exec sessions and their kept output.
 * A running session is refused unless -f, which kills it first (SIGKILL). Prints each
 * removed exec id as given; with --json `{results: [{exec_id, ok, exec | error}]}`. Exits 125 if
 * any failed.
 */
import type { Command } from 'commander';
import type { ExecInfo } from '../../../sdk/index.js';
import { runBatch } from '../../util/batch.js';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { resolveExecId } from '../../util/execs.js';

/** Adds `rm` to `parent` (the `execs` group). */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('rm')
    .description('remove exec sessions (-f kills running ones first)')
    .argument('<id>', 'sandbox id')
    .argument('<exec-ids...>', 'exec ids or unique prefixes')
    .option('-f, --force', 'kill a running session instead of refusing')
    .action(async (id: string, given: string[], opts: { force?: boolean }) => {
      const client = ctx.client();
      await runBatch<ExecInfo>(ctx, given, { verb: 'execs rm', key: 'exec_id', valueKey: 'exec', noun: 'exec sessions' }, async (g) => {
        const execId = await resolveExecId(ctx, id, g);
        if (!opts.force) {
          const info = await client.getExec(id, execId);
          if (info.state === 'running') {
            throw new UserError(`exec ${execId.slice(0, 12)} is running`, `stop it with \`dsec execs kill ${id} ${execId.slice(0, 12)}\`, or pass -f to kill and remove it`, 'FailedPrecondition');
          }
        }
        return client.removeExec(id, execId);
      });
    });
}
