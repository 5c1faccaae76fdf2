/**
 * `dsec execs [ls] ID`: lists the caller's exec sessions in a sandbox (running, and
 * exited ones dsecd still keeps) as a table (EXEC_ID, STATE, PID, EXIT, AGE, COMMAND),
 * their full ids with -q, or `{execs}` with --json.
 */
import type { Command } from 'commander';
import { renderExecTable } from '../../ui/execs.js';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { writeJson } from '../../util/output.js';

/** Options of `execs ls`. */
interface LsOptions {
  quiet?: boolean;
  trunc?: boolean;
}

/** Lists the sessions of sandbox `id`. */
async function list(ctx: Ctx, id: string, opts: LsOptions): Promise<void> {
  const execs = await ctx.client().listExecs(id);
  if (ctx.json) writeJson(ctx.io.stdout, { execs });
  else if (opts.quiet) ctx.out(execs.map((e) => e.exec_id + '\n').join(''));
  else ctx.out(renderExecTable(execs, { color: ctx.color, noTrunc: opts.trunc === false }));
}

/** Adds the options of `ls` to `cmd`. */
function lsOptions(cmd: Command): Command {
  return cmd.option('-q, --quiet', 'print only full exec ids').option('--no-trunc', 'full exec ids and commands');
}

/**
 * Creates the `execs` group under `parent`: `dsec execs ID` lists (as `execs ls ID`);
 * its subcommands are added by the caller.
 */
export function registerGroup(parent: Command, ctx: Ctx): Command {
  const group = parent
    .command('execs')
    .description('exec sessions of a sandbox: ls (default), inspect, kill, rm')
    .argument('[id]', 'sandbox id (lists its sessions, as `execs ls ID`)');
  return lsOptions(group).action(async (id: string | undefined, opts: LsOptions) => {
    if (id === undefined) throw new UserError('missing sandbox id', 'dsec execs ID lists the exec sessions of sandbox ID');
    await list(ctx, id, opts);
  });
}

/** Adds `ls` to `parent` (the `execs` group). */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent.command('ls').description('list the exec sessions of a sandbox').argument('<id>', 'sandbox id');
  return lsOptions(cmd).action(async (id: string, opts: LsOptions) => list(ctx, id, opts));
}
