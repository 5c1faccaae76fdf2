/**
 * `dsec exec ID [flags] -- CMD...`: runs a command in a sandbox to completion, writes its
 * stdout/stderr bytes to ours and exits with its exit code (128+N for signal N, 124 on
 * --timeout, 125 when dsec itself failed). With --json prints the ExecResult instead.
 *
 * On SIGINT/SIGTERM dsec stops waiting and exits 128+N, saying that the command may still
 * be running: the API has no call yet to signal a running exec, so it runs on in the
 * sandbox until it ends (or its --timeout, or `dsec exec ID -- kill ...`).
 */
import type { Command } from 'commander';
import type { Ctx } from '../util/context.js';
import { EXIT } from '../util/errors.js';
import { readStdin, parseTimeout, reportExecResult, signalNumber } from '../util/exec.js';
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
    .option('--timeout <dur>', 'kill the command after this long; a number with a unit, ms, s, m or h (e.g. 500ms, 30s, 5m); exit 124', flag('--timeout', (t: string) => parseTimeout(t)))
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
    .option('--env <K=V>', 'extra environment, repeatable (each name once)', flag('--env', collectEnv));
  return addCommandOptions(cmd).action(async (id: string, argv: string[], flags: ExecFlags) => {
    const stdin = flags.stdin ? await readStdin(ctx) : undefined;
    const abort = new AbortController();
    let interrupted: NodeJS.Signals | undefined;
    const unregister = ctx.io.onInterrupt((sig) => {
      interrupted ??= sig;
      abort.abort();
    });
    let result;
    try {
      result = await ctx.client().exec(id, { argv, env: flags.env, cwd: flags.cwd, user: flags.user, stdin, timeoutMs: flags.timeout, signal: abort.signal });
    } catch (e) {
      if (!interrupted) throw e;
    } finally {
      unregister();
    }
    if (result === undefined) {
      // Only an interrupt gets here (other failures were rethrown above).
      ctx.err(`dsec: interrupted; the command may still be running in sandbox ${id} (stop it with dsec exec ${id} -- kill ...)\n`);
      ctx.exitCode = EXIT.signalBase + (signalNumber(interrupted!) ?? 2);
      return;
    }
    ctx.exitCode = reportExecResult(ctx, result, { timeoutMs: flags.timeout });
  });
}
