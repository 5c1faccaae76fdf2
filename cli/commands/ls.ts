/**
 * `dsec ls`: lists sandboxes as a table (ID, STATE, IMAGE, CPUS, MEMORY, AGE, LABELS;
 * `--wide` adds PRIORITY after STATE), their ids with -q, or `{sandboxes}` with --json.
 */
import type { Command } from 'commander';
import type { SandboxState } from '../../sdk/index.js';
import { renderSandboxTable } from '../ui/sandboxes.js';
import type { Ctx } from '../util/context.js';
import { UserError } from '../util/errors.js';
import { writeJson } from '../util/output.js';
import { flag, parseSelector } from '../util/parse.js';

/** Sandbox states the API knows (daemon/api/schema.ts SandboxState). */
export const STATES = ['creating', 'running', 'paused', 'stopped', 'failed', 'destroyed'] as const satisfies readonly SandboxState[];

/** Parses `--state`: one of {@link STATES}. */
function parseState(text: string): string {
  if (!(STATES as readonly string[]).includes(text)) throw new UserError(`unknown state ${JSON.stringify(text)}`, `states are ${STATES.join(', ')}`);
  return text;
}

/** Adds `ls` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('ls')
    .description('list sandboxes')
    .option('--selector <sel>', 'only sandboxes whose labels match all terms: k=v, k!=v or k (has key), comma-separated', flag('--selector', parseSelector))
    .option('--state <state>', `only sandboxes in this state: ${STATES.join(', ')}`, flag('--state', parseState))
    .option('-q, --quiet', 'print only ids')
    .option('-w, --wide', 'more columns: PRIORITY (latency or batch)')
    .action(async (opts: { selector?: string; state?: string; quiet?: boolean; wide?: boolean }) => {
      const sandboxes = await ctx.client().listSandboxes({ selector: opts.selector, state: opts.state });
      if (ctx.json) writeJson(ctx.io.stdout, { sandboxes });
      else if (opts.quiet) ctx.out(sandboxes.map((s) => s.id + '\n').join(''));
      else ctx.out(renderSandboxTable(sandboxes, { color: ctx.color, wide: opts.wide }));
    });
}
