/**
 * `dsec token ls`: lists API tokens as a table (ID, TENANT, ROLE, STATE, CREATED,
 * EXPIRES, DESCRIPTION), ids only with -q, or `{tokens}` with --json. Never shows a
 * token's text (dsecd does not have it). Admin only.
 */
import type { Command } from 'commander';
import type { TokenInfo } from '../../../sdk/index.js';
import type { Ctx } from '../../util/context.js';
import { makeTable, tableText, writeJson } from '../../util/output.js';

/** The table of `token ls`. */
export function renderTokenTable(tokens: TokenInfo[], color = false): string {
  const t = makeTable(['ID', 'TENANT', 'ROLE', 'STATE', 'CREATED', 'EXPIRES', 'DESCRIPTION'], { color });
  const when = (ms: number | null) => (ms === null ? 'never' : new Date(ms).toISOString().replace(/\.\d+Z$/, 'Z'));
  for (const k of tokens) t.push([k.id, k.tenant, k.role, k.state, when(k.created_at), k.state === 'revoked' ? `revoked ${when(k.revoked_at)}` : when(k.expires_at), k.description ?? '']);
  return tableText(t);
}

/** Adds `ls` to the `token` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('ls')
    .description('list API tokens (never their text)')
    .option('-q, --quiet', 'print only token ids')
    .action(async (opts: { quiet?: boolean }) => {
      const tokens = await ctx.client().listTokens();
      if (ctx.json) writeJson(ctx.io.stdout, { tokens });
      else if (opts.quiet) ctx.out(tokens.map((k) => k.id + '\n').join(''));
      else ctx.out(renderTokenTable(tokens, ctx.color));
    });
}
