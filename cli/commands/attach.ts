/**
 * `dsec attach ID EXEC_ID [--no-stdin]`: attaches to an exec session (started with
 * `dsec exec -d`, or by an SDK caller): replays the output dsecd kept, then follows it;
 * forwards our stdin; exits with the command's code when it ends (128+N for signal N,
 * 124 if its --timeout fired).
 *
 * Detaching leaves the command running: Ctrl-P Ctrl-Q (docker's sequence) whenever our
 * stdin is a terminal, or a second ^C / a SIGTERM (the first ^C is sent to the command
 * as SIGINT). Raw mode is used when the session has a PTY and our stdin is a terminal;
 * for a session without one the terminal stays in line mode and Ctrl-Q ends a line, so
 * the keys still arrive at once (cli/util/attach.ts). Our stdin
 * ending does not close the command's stdin (other clients may still write to it).
 * When the session was started without stdin, what we type is not sent: dsec re-attaches
 * without stdin from where the output was.
 */
import type { Command } from 'commander';
import { DsecApiError } from '../../sdk/index.js';
import { runAttached } from '../util/attach.js';
import type { Ctx } from '../util/context.js';
import { EXIT, UserError } from '../util/errors.js';
import { reportExecInfo, signalNumber } from '../util/exec.js';
import { resolveExecId } from '../util/execs.js';

/** Adds `attach` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('attach')
    .description('attach to a running exec session; Ctrl-P Ctrl-Q detaches and leaves it running')
    .argument('<id>', 'sandbox id')
    .argument('<exec-id>', 'exec id (or a unique prefix, as `dsec execs ID` shows)')
    .option('--no-stdin', 'do not send our stdin (only watch the output)')
    .addHelpText(
      'after',
      '\nDetach (the command keeps running): Ctrl-P Ctrl-Q when our stdin is a terminal (with or\n' +
        'without a terminal in the session), or a second ^C (the first is sent to the command as SIGINT).\n' +
        "Exits with the command's exit code when it ends (128+N for signal N, 124 on timeout).",
    )
    .action(async (id: string, given: string, opts: { stdin: boolean }) => {
      if (ctx.json) throw new UserError('--json cannot be combined with attach (the command\'s output is the output)', 'see the session with `dsec execs inspect ID EXEC_ID`');
      const client = ctx.client();
      const execId = await resolveExecId(ctx, id, given);
      const info = await client.getExec(id, execId);
      const stdinTTY = ctx.io.stdin.isTTY === true;
      let stdin = opts.stdin;
      let offsets = { stdout: 0, stderr: 0 };
      for (;;) {
        const att = client.attachExec(id, execId, { killOnDetach: false, stdoutOffset: offsets.stdout, stderrOffset: offsets.stderr });
        let outcome;
        try {
          outcome = await runAttached(ctx, att, {
            tty: info.tty,
            raw: info.tty && stdin && stdinTTY,
            stdin,
            eofOnEnd: false,
            detachKeys: true,
            sendSize: info.tty,
          });
        } catch (e) {
          // The session has no stdin and we sent some: dsecd closed us. Go on without it.
          if (stdin && e instanceof DsecApiError && e.code === 'FailedPrecondition' && /without stdin/.test(e.message)) {
            stdin = false;
            offsets = { stdout: offsets.stdout + att.stdoutBytes, stderr: offsets.stderr + att.stderrBytes };
            ctx.err(`${info.tty ? '\r\n' : ''}dsec: exec ${execId.slice(0, 12)} was started without stdin; input is not sent (watching its output)\n`);
            continue;
          }
          throw e;
        }
        if (outcome.kind === 'exit') {
          ctx.exitCode = reportExecInfo(ctx, outcome.info);
          return;
        }
        const how = outcome.kind === 'detached' ? 'detached' : `detached (${outcome.signal})`;
        // Keys typed on a line-mode terminal left the cursor after their echo (^P^Q).
        const lead = info.tty ? '\r\n' : outcome.kind === 'detached' && stdinTTY ? '\n' : '';
        ctx.err(`${lead}dsec: ${how}; exec ${execId.slice(0, 12)} keeps running (re-attach with \`dsec attach ${id} ${execId.slice(0, 12)}\`)\n`);
        ctx.exitCode = outcome.kind === 'detached' ? EXIT.ok : EXIT.signalBase + (signalNumber(outcome.signal) ?? 15);
        return;
      }
    });
}
