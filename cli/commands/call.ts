/**
 * `dsec call [--image NAME] [--timeout DUR] [--memory SIZE] [--env K=V]... [-i] -- CMD...`:
 * one stateless call on the fncall tier (POST /v1/run with backend fncall): a pre-warmed
 * worker runs the command in fresh namespaces and nothing of it survives. Output and exit
 * codes as for `exec` (124 timeout, 128+N signal, 125 dsec failed, 126/127).
 */
import type { Command } from 'commander';
import type { Ctx } from '../util/context.js';
import { readStdin, reportExecResult } from '../util/exec.js';
import { collectEnv, flag, parseSize } from '../util/parse.js';
import { addCommandOptions, type ExecFlags } from './exec.js';
import { fncallRequest } from './run.js';
import { watchInterrupt } from '../util/interrupt.js';

/** Flags of `call`. */
interface CallFlags extends Omit<ExecFlags, 'env'> {
  image?: string;
  memory?: number;
  env?: Record<string, string>;
  stdin?: boolean;
}

/** Adds `call` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent
    .command('call')
    .description('run one stateless, isolated call on the fncall tier (pooled workers); exits with the command\'s exit code')
    .argument('<cmd...>', 'command and arguments (put them after --)')
    .option('--image <name>', 'image, name or name:tag (default busybox)')
    .option('--memory <size>', 'memory limit of the call: bytes or K/M/G (binary), e.g. 256M', flag('--memory', parseSize))
    .option('--env <K=V>', 'environment of the call, repeatable (each name once)', flag('--env', collectEnv))
    .option('-i, --stdin', 'send our stdin (a pipe or file, read to the end) to the command');
  addCommandOptions(cmd);
  return cmd.action(async (argv: string[], flags: CallFlags) => {
    const stdin = flags.stdin ? await readStdin(ctx) : undefined;
    const intr = watchInterrupt(ctx);
    try {
      const r = await ctx.client().run(fncallRequest(argv, flags, stdin), { signal: intr.signal });
      ctx.exitCode = reportExecResult(ctx, r, { timeoutMs: flags.timeout });
    } catch (e) {
      if (!intr.by) throw e;
      ctx.err(`dsec: interrupted by ${intr.by}\n`);
      ctx.exitCode = intr.exitCode()!;
    } finally {
      intr.stop();
    }
  });
}
