/**
 * `dsec events [-f] [--label k=v]... [--selector SEL] [--since DUR]`: sandbox lifecycle events as
 * lines `TIME TYPE SANDBOX STATE`, or NDJSON (one Event per line) with --json. With -f
 * it follows until SIGINT/SIGTERM (exit 128+N).
 */
import type { Command } from 'commander';
import { renderEventLine } from '../ui/events.js';
import type { Ctx } from '../util/context.js';
import { writeJsonLine } from '../util/output.js';
import { collectLabel, flag, parseDuration, parseSelector } from '../util/parse.js';
import { watchInterrupt } from '../util/interrupt.js';

/** Adds `events` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('events')
    .description('print sandbox events; -f follows new ones')
    .option('-f, --follow', 'keep printing new events until interrupted')
    .option('--selector <sel>', 'only events of sandboxes whose labels match all terms: k=v, k!=v or k (has key), comma-separated', flag('--selector', parseSelector))
    .option('--label <k=v>', 'only events of sandboxes with this label; repeatable, all must match (same as --selector k=v,...)', flag('--label', collectLabel))
    .option('--since <dur>', 'only events from this long ago onwards; a number with a unit, s, m, h or d (e.g. 10m, 2h)', flag('--since', (t: string) => parseDuration(t, '--since')))
    .action(async (opts: { follow?: boolean; selector?: string; label?: Record<string, string>; since?: number }) => {
      const terms = [opts.selector, ...Object.entries(opts.label ?? {}).map(([k, v]) => `${k}=${v}`)].filter(Boolean);
      const selector = terms.length ? terms.join(',') : undefined;
      const intr = watchInterrupt(ctx);
      try {
        const since = opts.since === undefined ? undefined : Date.now() - opts.since;
        for await (const e of ctx.client().events({ selector, follow: opts.follow, since, signal: intr.signal })) {
          if (ctx.json) writeJsonLine(ctx.io.stdout, e);
          else ctx.out(renderEventLine(e) + '\n');
        }
      } finally {
        intr.stop();
      }
      if (intr.by) ctx.exitCode = intr.exitCode()!;
    });
}
