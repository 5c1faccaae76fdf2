/**
 * `dsec run [create flags] [--timeout DUR] [-i] -- CMD...`: creates a sandbox, runs one
 * command in it and destroys it, whatever happens: when the command fails, when the exec
 * call fails, and on SIGINT/SIGTERM (exit 128+N). Exit codes as for `exec`. If the
 * destroy itself fails, a warning names the sandbox and the command's exit code is kept.
 *
 * The command runs as `dsec exec` runs it: its output streamed to ours, uncapped, with
 * our stdin streamed to it under -i (execStreamed); the first ^C goes to the command as
 * SIGINT, a second one kills it. With --json it runs in one call and the ExecResult is
 * printed (output at most 4 MiB per stream), and `--backend fncall` is a stateless call
 * (POST /v1/run), whose result is capped the same way by the tier's contract. On a
 * terminal, stderr shows the create's progress as `dsec create` does.
 */
import type { Command } from 'commander';
import { DsecApiError, type RunInput, type Sandbox } from '../../sdk/index.js';
import type { Ctx } from '../util/context.js';
import { EXIT, UserError, apiErrorHint } from '../util/errors.js';
import { readStdin, reportExecResult, signalNumber } from '../util/exec.js';
import { runCreate } from '../util/long.js';
import { addCreateOptions, createLabel, createRequest, type CreateFlags } from './create.js';
import { addCommandOptions, execStreamed, type ExecFlags } from './exec.js';

/** Adds `run` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent
    .command('run')
    .description('create a sandbox, run a command in it, destroy it; exits with the command\'s exit code')
    .argument('<cmd...>', 'command and arguments (put them after --)');
  addCreateOptions(cmd);
  addCommandOptions(cmd).option('-i, --stdin', 'stream our stdin to the command (until it ends); with --json or --backend fncall it is read whole first (at most 16 MiB)');
  return cmd.action(async (argv: string[], flags: CreateFlags & Omit<ExecFlags, 'env'>) => {
    if (flags.backend === 'fncall') return runFncall(ctx, argv, flags);
    const streamed = !ctx.json;
    // Read stdin before creating anything, so a refused stdin leaves nothing behind.
    const stdin = flags.stdin && !streamed ? await readStdin(ctx) : undefined;
    const client = ctx.client();
    const abort = new AbortController();
    let interrupted: NodeJS.Signals | undefined;
    // While the command is attached, its own interrupt handling runs (execStreamed).
    let attached = false;
    // Registered until the sandbox is gone: a second ^C must not kill us mid-cleanup.
    const unregister = ctx.io.onInterrupt((sig) => {
      if (attached) return;
      interrupted ??= sig;
      abort.abort();
    });
    let sandbox: Sandbox | undefined;
    try {
      // Not aborted on interrupt: an abandoned create could leave a sandbox we never learn the id of.
      // On a terminal a spinner shows the create's phases (cli/util/long.ts).
      sandbox = await runCreate(ctx, { label: createLabel(flags), abortOnInterrupt: false }, (o) => client.createSandbox(createRequest(flags), o));
      if (interrupted || !sandbox) return;
      if (sandbox.state === 'failed') {
        throw new UserError(`sandbox ${sandbox.id} failed to start: ${sandbox.error ?? 'no reason given'}`, '`dsec host info` shows what this host supports', 'FailedPrecondition');
      }
      if (streamed) {
        attached = true;
        try {
          ctx.exitCode = await execStreamed(ctx, sandbox.id, { argv, cwd: flags.cwd, user: flags.user, timeoutMs: flags.timeout, stdin: flags.stdin === true });
        } finally {
          attached = false;
        }
        return;
      }
      let result;
      try {
        result = await client.exec(sandbox.id, { argv, cwd: flags.cwd, user: flags.user, stdin, timeoutMs: flags.timeout, signal: abort.signal });
      } catch (e) {
        if (interrupted) return;
        throw e;
      }
      ctx.exitCode = reportExecResult(ctx, result, { timeoutMs: flags.timeout, extra: { sandbox_id: sandbox.id } });
    } finally {
      if (interrupted) {
        ctx.err(`dsec: interrupted by ${interrupted}` + (sandbox ? `; destroying sandbox ${sandbox.id}` : '') + '\n');
        ctx.exitCode = EXIT.signalBase + (signalNumber(interrupted) ?? 2);
      }
      try {
        if (sandbox) await destroy(ctx, sandbox.id);
      } finally {
        unregister();
      }
    }
  });
}

/** Destroys the run's sandbox; a failure is a warning (with the id to clean up), not an error. */
async function destroy(ctx: Ctx, id: string): Promise<void> {
  try {
    await ctx.client().deleteSandbox(id, { force: true });
  } catch (e) {
    if (!(e instanceof DsecApiError)) throw e;
    if (e.code === 'NotFound') return; // already gone (e.g. its TTL fired)
    ctx.err(`dsec: warning: could not destroy sandbox ${id}: ${e.message} (${e.code})\n`);
    ctx.err(`hint: remove it with \`dsec rm -f ${id}\`; ${apiErrorHint(e, 'rm')}\n`);
  }
}

/**
 * `dsec run --backend fncall`: the same call through POST /v1/run on the fncall tier,
 * exactly as `dsec call` makes it. Sandbox-only flags are refused: a call has no
 * sandbox to label, keep or schedule.
 */
async function runFncall(ctx: Ctx, argv: string[], flags: CreateFlags & Omit<ExecFlags, 'env'>): Promise<void> {
  const sandboxOnly = (['cpus', 'pids', 'label', 'ttl', 'priority', 'idleTimeout'] as const).filter((k) => (flags as Record<string, unknown>)[k] !== undefined);
  if (sandboxOnly.length) {
    throw new UserError(`--backend fncall runs a stateless call: ${sandboxOnly.map((k) => `--${k.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`).join(', ')} ${sandboxOnly.length > 1 ? 'do' : 'does'} not apply`,
      'drop them, or run in a sandbox with --backend container');
  }
  const stdin = flags.stdin ? await readStdin(ctx) : undefined;
  const r = await ctx.client().run(fncallRequest(argv, flags, stdin));
  ctx.exitCode = reportExecResult(ctx, r, { timeoutMs: flags.timeout });
}

/** The POST /v1/run body of an fncall from CLI flags (`--image`, `--env`, `--cwd`, `--user`, `--timeout`, `--memory`) and stdin bytes. */
export function fncallRequest(argv: string[], flags: { image?: string; env?: Record<string, string>; cwd?: string; user?: string; timeout?: number; memory?: number }, stdin?: Buffer): RunInput {
  return {
    backend: 'fncall', argv,
    ...(flags.image ? { image: flags.image } : {}), ...(flags.env ? { env: flags.env } : {}), ...(flags.cwd ? { cwd: flags.cwd } : {}),
    ...(flags.user ? { user: flags.user } : {}), ...(flags.timeout !== undefined ? { timeout_ms: flags.timeout } : {}),
    ...(flags.memory !== undefined ? { memory_bytes: flags.memory } : {}), ...(stdin ? { stdin_b64: Buffer.from(stdin).toString('base64') } : {}),
  };
}
