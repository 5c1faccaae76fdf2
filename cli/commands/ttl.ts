/**
 * `dsec ttl --selector S [-f] DUR|none`: sets (or with `none` removes) the TTL of every
 * sandbox whose labels match S, through POST /v1/sandboxes/bulk `set_ttl`.
 *
 * Selector only, by choice of the API: dsecd has no per-sandbox TTL call, so
 * `dsec ttl ID... DUR` is refused with a hint to use a label selector (a TTL is fixed at
 * create time with `create --ttl`).
 *
 * As with `create --ttl`, the TTL counts from each sandbox's **creation**, not from now:
 * `ttl --selector job=a 10m` on hour-old sandboxes would have dsecd destroy them at its
 * next sweep. So the matching sandboxes are listed first, and if the TTL is already past
 * for any of them the command refuses (naming them) unless `-f` is given; the check and
 * the bulk call are two requests, so a sandbox created in between is not checked (it is
 * younger than the TTL anyway).
 *
 * Output as for the other bulk verbs (cli/util/bulk.ts): each sandbox id on stdout, or
 * `{results}` with --json; exit 125 if any failed.
 */
import type { Command } from 'commander';
import { addSelectorOption, runBulk } from '../util/bulk.js';
import type { Ctx } from '../util/context.js';
import { UserError } from '../util/errors.js';
import { formatAge, formatDuration } from '../util/output.js';
import { parseWholeSeconds } from '../util/parse.js';

const EXAMPLE = 'e.g. `dsec ttl --selector job=a 2h` (counted from creation), or `dsec ttl --selector job=a none`';

/** Parses the TTL argument: `none` (remove) → null, else DUR in whole seconds (1s to 30 days). */
function parseTtlArg(text: string): number | null {
  if (text === 'none') return null;
  return parseWholeSeconds(text, 'TTL');
}

/** Adds `ttl` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent
    .command('ttl')
    .description("set or remove the TTL of the sandboxes matching a selector; counted from each sandbox's creation")
    .usage('--selector <sel> [-f] <dur|none>')
    .argument('<ttl...>', 'DUR from creation (e.g. 2h, 1d; rounded up to whole seconds), or none to remove the TTL')
    .option('-f, --force', 'set it even if it is already past for some sandboxes (dsecd then destroys them at its next sweep)');
  return addSelectorOption(cmd).action(async (args: string[], opts: { selector?: string; force?: boolean }) => {
    if (opts.selector === undefined) {
      if (args.length > 1) throw new UserError('dsecd sets TTLs by label selector only (there is no per-sandbox TTL call), so `dsec ttl` takes --selector, not ids', EXAMPLE);
      throw new UserError('missing --selector', EXAMPLE);
    }
    if (args.length > 1) throw new UserError(`give one TTL with --selector, not sandbox ids (got ${args.map((a) => JSON.stringify(a)).join(' ')})`, EXAMPLE);
    const ttlS = parseTtlArg(args[0]);
    if (ttlS !== null && !opts.force) await refuseIfPast(ctx, opts.selector, ttlS);
    await runBulk(ctx, { selector: opts.selector, action: 'set_ttl', ttl_s: ttlS }, { verb: 'ttl' });
  });
}

/** Refuses (UserError) when `ttlS` from creation is already past for a sandbox matching `selector`. */
async function refuseIfPast(ctx: Ctx, selector: string, ttlS: number): Promise<void> {
  const now = Date.now();
  const sandboxes = await ctx.client().listSandboxes({ selector });
  const past = sandboxes.filter((s) => s.state !== 'destroyed' && s.created_at + ttlS * 1000 <= now);
  if (past.length === 0) return;
  const oldest = Math.max(...past.map((s) => now - s.created_at));
  const ids = past.length <= 5 ? past.map((s) => s.id).join(', ') : `${past.slice(0, 5).map((s) => s.id).join(', ')}, ...`;
  throw new UserError(
    `TTL ${formatDuration(ttlS * 1000)} counts from creation: ${past.length} of ${sandboxes.length} matching sandboxes are older (${ids}) and would be destroyed at once`,
    `give a TTL longer than the oldest one's age (${formatAge(oldest)}), or pass -f to destroy them`,
    'FailedPrecondition',
  );
}
