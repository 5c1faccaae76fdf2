/**
 * `dsec exec ID [flags] -- CMD...`: runs a command in a sandbox to completion, writes its
 * stdout/stderr bytes to ours and exits with its exit code (128+N for signal N, 124 on
 * --timeout, 125 when dsec itself failed). With --json prints the ExecResult instead.
 */
import type { Command } from 'commander';
import type { Ctx } from '../util/context.js';
import { readStdin, parseTimeout, reportExecResult } from '../util/exec.js';
import { collectEnv, flag } from '../util/parse.js';

/** Parsed exec flags. */
export interface ExecFlags {
  /** `--timeout`, ms. */
  timeout?: number;
  /** `--env`, accumulated. */
  env?: Record<string, string>;
  /** `--cwd`. */
  cwd?: string;
  /** `--user`. */
  user?: string;
  /** `-i`/`--stdin`: send our stdin. */
  stdin?: boolean;
}

/** Adds `--timeout`, `--cwd`, `--user` and `-i` (shared with `run`) to `cmd`. */
export function addCommandOptions(cmd: Command): Command {
  return cmd
    .option('--timeout <dur>', 'kill the command after this long (e.g. 30s); exit 124', flag('--timeout', parseTimeout))
    .option('--cwd <dir>', 'working directory inside the sandbox (absolute)')
    .option('--user <user>', 'user name or uid[:gid] inside the sandbox')
    .option('-i, --stdin', 'send our stdin (a pipe or file, read to the end) to the command');
}

/** Adds `exec` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent
    .command('exec')
    .description('run a command in a sandbox; exits with its exit code')
    .argument('<id>', 'sandbox id')
    .argument('<cmd...>', 'command and arguments (put them after --)')
    .option('--env <K=V>', 'extra environment, repeatable', flag('--env', collectEnv));
  return addCommandOptions(cmd).action(async (id: string, argv: string[], flags: ExecFlags) => {
    const stdin = flags.stdin ? await readStdin(ctx) : undefined;
    const result = await ctx.client().exec(id, { argv, env: flags.env, cwd: flags.cwd, user: flags.user, stdin, timeoutMs: flags.timeout });
    ctx.exitCode = reportExecResult(ctx, result, { timeoutMs: flags.timeout });
  });
}
