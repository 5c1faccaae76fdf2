/**
 * `dsec logs [-f] ID`: the sandbox's log as dsecd keeps it: its lifecycle and exec
 * history (`TIME TYPE ...` lines, e.g. `sandbox.created`), then the agent's own log.
 * With -f it follows new lines until SIGINT/SIGTERM (exit 128+N) or until the sandbox
 * is destroyed (exit 0). With --json each line is `{"line": "..."}` (NDJSON).
 */
import type { Command } from 'commander';
import type { Ctx } from '../util/context.js';
import { EXIT } from '../util/errors.js';
import { signalNumber } from '../util/exec.js';
import { writeJsonLine } from '../util/output.js';

/** C0 control characters other than tab, and DEL: never passed from a sandbox's log to a terminal. */
const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f]/g;

/** Adds `logs` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('logs')
    .description("print a sandbox's log (lifecycle, execs, agent); -f follows it")
    .argument('<id>', 'sandbox id')
    .option('-f, --follow', 'keep printing new lines until interrupted or the sandbox is destroyed')
    .action(async (id: string, opts: { follow?: boolean }) => {
      const abort = new AbortController();
      let interrupted: NodeJS.Signals | undefined;
      const unregister = ctx.io.onInterrupt((sig) => {
        interrupted ??= sig;
        abort.abort();
      });
      // Escape sequences from inside the sandbox must not drive our terminal.
      const clean = ctx.io.stdout.isTTY ? (l: string) => l.replace(CONTROL, (c) => `^${String.fromCharCode(c.charCodeAt(0) ^ 0x40)}`) : (l: string) => l;
      try {
        for await (const line of ctx.client().logs(id, { follow: opts.follow, signal: abort.signal })) {
          if (ctx.json) writeJsonLine(ctx.io.stdout, { line });
          else ctx.out(clean(line) + '\n');
        }
      } finally {
        unregister();
      }
      if (interrupted) ctx.exitCode = EXIT.signalBase + (signalNumber(interrupted) ?? 2);
    });
}
