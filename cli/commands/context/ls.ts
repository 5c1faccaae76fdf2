/**
 * `dsec context ls`: the saved contexts as a table (CURRENT `*`, NAME, HOST, CA, TOKEN
 * shown as its id only), or `{current, contexts}` with --json (tokens as ids there too).
 */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { readContexts } from '../../util/contexts.js';
import { makeTable, tableText, writeJson } from '../../util/output.js';

/** A token as a listing shows it: `e2b_<id>…` (its id names it; the secret stays out of sight). */
export function maskToken(t: string | undefined): string {
  if (!t) return '';
  return /^e2b_[0-9a-f]{16}/.test(t) ? `${t.slice(0, 20)}…` : '(set)';
}

/** Adds `ls` to the `context` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('ls')
    .description('list saved contexts')
    .action(() => {
      const file = readContexts(ctx.io.env);
      if (ctx.json) {
        const contexts = Object.fromEntries(Object.entries(file.contexts).map(([n, c]) => [n, { ...c, token: c.token ? maskToken(c.token) : undefined }]));
        writeJson(ctx.io.stdout, { current: file.current, contexts });
        return;
      }
      const t = makeTable(['CURRENT', 'NAME', 'HOST', 'CA', 'TOKEN'], { color: ctx.color });
      t.push([file.current === null ? '*' : '', '(local socket)', '', '', '']);
      for (const [n, c] of Object.entries(file.contexts)) t.push([file.current === n ? '*' : '', n, c.host, c.ca ?? '', maskToken(c.token)]);
      ctx.out(tableText(t));
    });
}
