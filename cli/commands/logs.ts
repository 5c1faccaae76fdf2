/**
 * `dsec logs [-f] ID`: the sandbox's log as dsecd keeps it: its lifecycle and exec
 * history (`TIME TYPE ...` lines, e.g. `sandbox.created`), then the agent's own log.
 * With -f it follows new lines until SIGINT/SIGTERM (exit 128+N) or until the sandbox
 * is destroyed (exit 0). With --json each line is `{"line": "..."}` (NDJSON).
 */
import type { Command } from 'commander';
import type { Ctx } from '../util/context.js';
import { writeJsonLine } from '../util/output.js';
import { watchInterrupt } from '../util/interrupt.js';

/** C0 control characters other than tab, and DEL: never passed from a sandbox's log to a terminal. */
const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f]/g;

/** A log line made safe for a terminal: control characters shown as `^X` (escape sequences from inside the sandbox must not drive it). */
export function cleanLogLine(line: string): string {
  return line.replace(CONTROL, (c) => `^${String.fromCharCode(c.charCodeAt(0) ^ 0x40)}`);
}

/** Adds `logs` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('logs')
    .description("print a sandbox's log (lifecycle, execs, agent); -f follows it")
    .argument('<id>', 'sandbox id')
    .option('-f, --follow', 'keep printing new lines until interrupted or the sandbox is destroyed')
    .action(async (id: string, opts: { follow?: boolean }) => {
      const intr = watchInterrupt(ctx);
      // Escape sequences from inside the sandbox must not drive our terminal.
      const clean = ctx.io.stdout.isTTY ? cleanLogLine : (l: string) => l;
      try {
        for await (const line of ctx.client().logs(id, { follow: opts.follow, signal: intr.signal })) {
          if (ctx.json) writeJsonLine(ctx.io.stdout, { line });
          else ctx.out(clean(line) + '\n');
        }
      } finally {
        intr.stop();
      }
      if (intr.by) ctx.exitCode = intr.exitCode()!;
    });
}
