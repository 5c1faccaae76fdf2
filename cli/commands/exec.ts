/**
 * `dsec exec [-i] [-t] [-d] ID [flags] -- CMD...`: runs a command in a sandbox.
 *
 * - No -i/-t/-d: streams its stdout and stderr to ours, separately and as they come, and
 *   exits with its exit code (128+N for signal N, 124 on --timeout, 126/127 not
 *   executable/not found, 125 when dsec itself failed). It is a paced exec session
 *   (StartExecRequest.paced) attached over a WebSocket that kills the command if it
 *   drops: no size limit, and our memory stays flat however much it prints, because a
 *   slow stdout (a pipe, a full disk) pauses the command instead of being buffered. The
 *   first ^C is sent to the command as SIGINT; a second one gives up (and kills it). The
 *   notes (signal, timeout, OOM kills in the sandbox meanwhile) go to stderr after its
 *   output.
 * - `--json` (no -i/-t/-d), and every `--trajectory` step: runs it to completion in one
 *   API call and prints the ExecResult (output at most 4 MiB per stream, base64, with
 *   `*_truncated`), the documented one-shot contract; a step is recorded whole. On
 *   SIGINT/SIGTERM dsec stops waiting and exits 128+N, saying that the command may still
 *   be running.
 * - `-t` (usually with `-i`, like `docker exec -it`): starts an exec session under a PTY
 *   the size of our terminal, attaches over a WebSocket that kills the command if it
 *   drops, puts our terminal in raw mode (every key, ^C too, goes to the command), follows
 *   our terminal's size, restores the terminal however it ends, and exits with the
 *   command's code. Needs stdin to be a terminal ("the input device is not a TTY", 125).
 * - `-i` alone: streams our stdin (until it ends, then EOF) to the command and its stdout
 *   and stderr to ours, separately. The first ^C is sent to the command as SIGINT; a
 *   second one gives up (and kills it).
 * - `-d`: starts the session in the background and prints its exec id (the ExecInfo with
 *   --json); follow it with `dsec attach`, list with `dsec execs`. With -i its stdin stays
 *   open for a later `dsec attach`.
 * - `--trajectory T --step N [--truncate]` (the run-to-completion form only): records the
 *   command as step N of trajectory T (docs/TRAJECTORIES.md). A rerun of a finished step
 *   with the same command is answered from the log: its recorded output and exit code,
 *   and `dsec: step N of T replayed from the log; nothing ran` on stderr (not with
 *   --json, whose ExecResult says `replayed: true`). A refused step (its outcome unknown,
 *   or recorded with another command) is a Conflict whose hint tells of --truncate, which
 *   discards the step and the later ones and runs it.
 */
import type { Command } from 'commander';
import type { ExecInfo } from '../../sdk/index.js';
import { renderReplayedNote } from '../ui/trajectories.js';
import { runAttached, type AttachedOutcome } from '../util/attach.js';
import type { Ctx } from '../util/context.js';
import { EXIT, UserError } from '../util/errors.js';
import { parseTimeout, reportExecInfo, reportExecResult, signalNumber } from '../util/exec.js';
import { writeJson } from '../util/output.js';
import { collectEnv, flag } from '../util/parse.js';
import { terminalSize } from '../util/terminal.js';

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
  /** `-t`/`--tty`: run under a PTY, attached to our terminal. */
  tty?: boolean;
  /** `-d`/`--detach`: start in the background and print the exec id. */
  detach?: boolean;
  /** `--trajectory`: record the command as a step of this trajectory. */
  trajectory?: string;
  /** `--step`: the step number within `--trajectory`. */
  step?: number;
  /** `--truncate`: discard the recorded steps from `--step` on first. */
  truncate?: boolean;
}

/** Trajectory ids, as the API accepts them (TrajectoryId in daemon/api/schema.ts). */
const TRAJECTORY_ID = /^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$/;

/** Largest step number (LIMITS.maxStep in daemon/api/schema.ts): 2^31-1. */
export const MAX_STEP = 2 ** 31 - 1;

/** Parses `--trajectory`: 1-128 of `[A-Za-z0-9._:@-]`, starting with a letter or digit. */
export function parseTrajectoryId(text: string): string {
  if (!TRAJECTORY_ID.test(text)) {
    throw new UserError(`invalid trajectory id ${JSON.stringify(text)}`, 'trajectory ids are 1-128 of [A-Za-z0-9._:@-], starting with a letter or digit, e.g. run-7:ep-12');
  }
  return text;
}

/** Parses `--step`: a whole number from 0 to 2^31-1. */
export function parseStep(text: string): number {
  const s = text.trim();
  const n = /^\d+$/.test(s) ? Number(s) : NaN;
  if (!Number.isSafeInteger(n) || n > MAX_STEP) throw new UserError(`invalid step ${JSON.stringify(text)}`, `steps are whole numbers from 0 to ${MAX_STEP}`);
  return n;
}

/**
 * Checks the trajectory flags go together (`--trajectory` with `--step`, `--truncate` with
 * both) and only with the run-to-completion form; throws a UserError otherwise.
 */
function checkTrajectoryFlags(flags: ExecFlags): void {
  const traj = flags.trajectory !== undefined;
  const step = flags.step !== undefined;
  if (!traj && !step && !flags.truncate) return;
  const example = 'e.g. `dsec exec --trajectory T --step 3 ID -- CMD`';
  if (traj !== step) throw new UserError(traj ? '--trajectory needs --step' : '--step needs --trajectory', `give both: ${example}`);
  if (!traj) throw new UserError('--truncate needs --trajectory and --step', `give all three: \`dsec exec --trajectory T --step 3 --truncate ID -- CMD\``);
  const mode = [flags.stdin && '-i', flags.tty && '-t', flags.detach && '-d'].filter(Boolean);
  if (mode.length > 0) {
    throw new UserError(`--trajectory cannot be combined with ${mode.join(', ')}`, `a trajectory step runs to completion and is recorded whole: drop ${mode.join(', ')}`);
  }
}

/** Adds `--timeout`, `--cwd` and `--user` (shared with `run`) to `cmd`. */
export function addCommandOptions(cmd: Command): Command {
  return cmd
    .option('--timeout <dur>', 'kill the command after this long; a number with a unit, ms, s, m or h (e.g. 500ms, 30s, 5m); exit 124', flag('--timeout', (t: string) => parseTimeout(t)))
    .option('--cwd <dir>', 'working directory inside the sandbox (absolute)')
    .option('--user <user>', 'user name or uid[:gid] inside the sandbox');
}

/** Adds `exec` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent
    .command('exec')
    .description('run a command in a sandbox; exits with its exit code (-it for an interactive terminal, -d in the background)')
    .argument('<id>', 'sandbox id')
    .argument('<cmd...>', 'command and arguments (put them after --)')
    .option('-i, --stdin', 'stream our stdin to the command (until it ends); with -t, interactive')
    .option('-t, --tty', 'run under a pseudo-terminal attached to ours (raw mode; ^C goes to the command); needs a terminal')
    .option('-d, --detach', 'start in the background and print the exec id (see `dsec attach`, `dsec execs`)')
    .option('--env <K=V>', 'extra environment, repeatable (each name once)', flag('--env', collectEnv))
    .option('--trajectory <id>', 'record the command as a step of this trajectory (needs --step; not with -i/-t/-d)', flag('--trajectory', parseTrajectoryId))
    .option('--step <n>', 'step number within --trajectory (0 or more, increasing); a finished step rerun with the same command is replayed from the log', flag('--step', parseStep))
    .option('--truncate', 'discard the recorded steps of --trajectory from --step on, then run this one');
  return addCommandOptions(cmd)
    .addHelpText('after', '\nExamples:\n  dsec exec ID -- ls -la /\n  dsec exec -it ID -- sh\n  tar c . | dsec exec -i ID -- tar x -C /work\n  dsec exec -d ID -- sh -c "make > /tmp/log 2>&1"\n  dsec exec --trajectory ep-7 --step 3 ID -- python3 step.py')
    .action(async (id: string, argv: string[], flags: ExecFlags) => {
      checkTrajectoryFlags(flags);
      if (flags.detach) return execDetached(ctx, id, argv, flags);
      if (flags.tty || flags.stdin) return execAttached(ctx, id, argv, flags);
      if (ctx.json || flags.trajectory !== undefined) return execToCompletion(ctx, id, argv, flags);
      ctx.exitCode = await execStreamed(ctx, id, { argv, env: flags.env, cwd: flags.cwd, user: flags.user, timeoutMs: flags.timeout });
    });
}

/** The command of a streamed exec ({@link execStreamed}). */
export interface StreamedCommand {
  argv: string[];
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  /** `--timeout`, ms. */
  timeoutMs?: number;
  /** Stream our stdin to it (`-i`) until it ends, then close its stdin. */
  stdin?: boolean;
}

/**
 * Runs `cmd` in sandbox `id` with its output streamed to ours (the form of `exec` and
 * `run` without -i/-t/-d/--json): a paced session, attached with kill_on_detach, and
 * returns our exit code (see the module comment). Rejects as the attachment does (dsecd
 * gone, the sandbox destroyed under it), which the caller turns into 125.
 */
export async function execStreamed(ctx: Ctx, id: string, cmd: StreamedCommand): Promise<number> {
  const client = ctx.client();
  const info = await client.startExec(id, { ...cmd, stdin: cmd.stdin ? true : undefined, paced: true });
  const att = client.attachExec(id, info.exec_id, { killOnDetach: true });
  const outcome = await runAttached(ctx, att, { tty: false, raw: false, stdin: cmd.stdin === true, eofOnEnd: true, detachKeys: false, sendSize: false });
  return reportAttachedOutcome(ctx, outcome, cmd.timeoutMs);
}

/** Our exit code for how an attached exec ended, with its notes on stderr. */
function reportAttachedOutcome(ctx: Ctx, outcome: AttachedOutcome, timeoutMs: number | undefined): number {
  if (outcome.kind === 'exit') return reportExecInfo(ctx, outcome.info, { timeoutMs });
  const sig = outcome.kind === 'interrupted' ? outcome.signal : 'SIGTERM';
  ctx.err(`dsec: interrupted by ${sig}; the command was killed\n`);
  return EXIT.signalBase + (signalNumber(sig) ?? 15);
}

/** The run-to-completion exec (`--json`, `--trajectory`): one API call. */
async function execToCompletion(ctx: Ctx, id: string, argv: string[], flags: ExecFlags): Promise<void> {
  const abort = new AbortController();
  let interrupted: NodeJS.Signals | undefined;
  const unregister = ctx.io.onInterrupt((sig) => {
    interrupted ??= sig;
    abort.abort();
  });
  let result;
  try {
    result = await ctx.client().exec(id, {
      argv,
      env: flags.env,
      cwd: flags.cwd,
      user: flags.user,
      timeoutMs: flags.timeout,
      trajectory: flags.trajectory,
      step: flags.step,
      truncate: flags.truncate,
      signal: abort.signal,
    });
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
  if (result.replayed && !ctx.json) ctx.err(renderReplayedNote(result.trajectory ?? flags.trajectory!, result.step ?? flags.step!));
}

/**
 * The exec-session request of `exec -d/-i/-t`: the flags, a PTY of our terminal's size
 * with -t. An attached session is paced by us (no spool, no size limit); a detached one
 * is spooled, for whoever attaches later.
 */
function sessionRequest(ctx: Ctx, argv: string[], flags: ExecFlags) {
  return {
    argv,
    env: flags.env,
    cwd: flags.cwd,
    user: flags.user,
    stdin: flags.stdin ? true : undefined,
    tty: flags.tty ? terminalSize(ctx.io.stdout) : undefined,
    timeoutMs: flags.timeout,
    paced: flags.detach ? undefined : true,
  };
}

/** `exec -d`: starts the session and prints its id (or ExecInfo). */
async function execDetached(ctx: Ctx, id: string, argv: string[], flags: ExecFlags): Promise<void> {
  const info = await ctx.client().startExec(id, sessionRequest(ctx, argv, flags));
  if (ctx.json) writeJson(ctx.io.stdout, info);
  else ctx.out(info.exec_id + '\n');
  // A command that could not even start (not found, not executable) is reported now.
  if (info.state === 'exited' && info.error) ctx.exitCode = reportExecInfo(ctx, info, { timeoutMs: flags.timeout });
}

/**
 * An interactive command in sandbox `id` under a PTY of our terminal's size, as
 * `dsec exec -it ID -- ARGV` runs it (`top`'s shell); resolves with the exit code it
 * would exit with, leaving `ctx.exitCode` as it was.
 * @throws UserError when stdin is not a terminal; API errors as `exec -it`.
 */
export async function execInteractive(ctx: Ctx, id: string, argv: string[]): Promise<number> {
  const before = ctx.exitCode;
  try {
    await execAttached(ctx, id, argv, { tty: true, stdin: true });
    return ctx.exitCode;
  } finally {
    ctx.exitCode = before;
  }
}

/** `exec -i` / `exec -t`: starts a session and stays attached until it ends. */
async function execAttached(ctx: Ctx, id: string, argv: string[], flags: ExecFlags): Promise<void> {
  if (ctx.json) {
    throw new UserError('--json cannot be combined with -i or -t (the command\'s output is the output)', 'start it with `dsec exec -d --json ID -- CMD` and read it with `dsec attach`, or drop -i/-t');
  }
  const stdinTTY = ctx.io.stdin.isTTY === true;
  if (flags.tty && !stdinTTY) {
    throw new UserError('the input device is not a TTY', 'drop -t (pipes work with -i alone), or run it from a terminal');
  }
  const client = ctx.client();
  const info: ExecInfo = await client.startExec(id, sessionRequest(ctx, argv, flags));
  const att = client.attachExec(id, info.exec_id, { killOnDetach: true });
  const outcome = await runAttached(ctx, att, {
    tty: flags.tty === true,
    raw: flags.tty === true && flags.stdin === true && stdinTTY,
    stdin: flags.stdin === true,
    eofOnEnd: true,
    detachKeys: false,
    sendSize: false,
  });
  ctx.exitCode = reportAttachedOutcome(ctx, outcome, flags.timeout);
}
