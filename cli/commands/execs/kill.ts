/**
 * `dsec execs kill ID EXEC_ID [-s SIGNAL]`: sends a signal (default SIGKILL, as
 * `docker kill`) to an exec session's process group; prints the exec id, or the ExecInfo
 * with --json. The session stays listed until it is removed (`execs rm`) or forgotten.
 */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { resolveExecId } from '../../util/execs.js';
import { writeJson } from '../../util/output.js';
import { flag } from '../../util/parse.js';

/** Parses `--signal`: a name (`TERM`, `SIGTERM`) or a number 1..64; names are sent upper-cased. */
export function parseSignalFlag(text: string): string | number {
  const s = text.trim();
  if (/^\d+$/.test(s)) {
    const n = Number(s);
    if (n >= 1 && n <= 64) return n;
  } else if (/^(SIG)?[A-Z0-9+-]{2,12}$/i.test(s)) {
    return s.toUpperCase();
  }
  throw new UserError(`invalid signal ${JSON.stringify(text)}`, 'write a name or a number, e.g. -s TERM, -s SIGINT or -s 9');
}

/** Adds `kill` to `parent` (the `execs` group). */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('kill')
    .description('send a signal (default SIGKILL) to an exec session')
    .argument('<id>', 'sandbox id')
    .argument('<exec-id>', 'exec id or a unique prefix')
    .option('-s, --signal <sig>', 'signal name or number (default KILL)', flag('--signal', parseSignalFlag))
    .action(async (id: string, given: string, opts: { signal?: string | number }) => {
      const execId = await resolveExecId(ctx, id, given);
      const info = await ctx.client().signalExec(id, execId, opts.signal ?? 'SIGKILL');
      if (ctx.json) writeJson(ctx.io.stdout, info);
      else ctx.out(info.exec_id + '\n');
    });
}
