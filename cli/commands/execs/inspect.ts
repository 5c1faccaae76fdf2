/** `dsec execs inspect ID EXEC_ID`: one exec session's ExecInfo as pretty JSON (with or without --json). */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { resolveExecId } from '../../util/execs.js';
import { writeJson } from '../../util/output.js';

/** Adds `inspect` to `parent` (the `execs` group). */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('inspect')
    .description('show one exec session as JSON')
    .argument('<id>', 'sandbox id')
    .argument('<exec-id>', 'exec id or a unique prefix')
    .action(async (id: string, given: string) => {
      const execId = await resolveExecId(ctx, id, given);
      writeJson(ctx.io.stdout, await ctx.client().getExec(id, execId));
    });
}
