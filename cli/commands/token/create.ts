/**
 * `dsec token create --tenant NAME --role admin|user|reader|metrics [--ttl DUR]
 * [--description TEXT]`: makes an API token for dsecd's TCP door and prints its text
 * alone on stdout (so `TOKEN=$(dsec token create ...)` works), with its id, tenant, role
 * and expiry on stderr. The text is shown this once: dsecd keeps only its hash. With
 * --json, the whole answer (`token` included) on stdout. Admin only: run it on dsecd's
 * host (the Unix socket) or with an admin token.
 */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { writeJson } from '../../util/output.js';
import { flag, parseDuration } from '../../util/parse.js';

/** Roles a token can carry. */
export const ROLES = ['admin', 'user', 'reader', 'metrics'] as const;

/** Longest token lifetime dsecd accepts: 10 years, in seconds. */
const MAX_TTL_S = 10 * 365 * 86400;

/** Parses `--ttl DUR` into whole seconds (1 s to 10 years, rounded up). */
export const parseTokenTtl = flag('--ttl', (t: string) => {
  const ms = parseDuration(t, '--ttl');
  if (ms < 1000) throw new UserError(`--ttl must be at least 1s, got ${JSON.stringify(t)}`, 'e.g. --ttl 30d');
  if (ms > MAX_TTL_S * 1000) throw new UserError(`--ttl ${JSON.stringify(t)} is longer than 10 years`, 'leave --ttl out for a token that never expires');
  return Math.ceil(ms / 1000);
});

/** Adds `create` to the `token` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('create')
    .description('make an API token for the TCP door; prints it once (only its hash is kept)')
    .requiredOption('--tenant <name>', 'tenant the token acts for (1-63 of a-z, 0-9, _ and -)')
    .requiredOption('--role <role>', `${ROLES.join(', ')}: admin everything; user its tenant; reader reads only; metrics GET /metrics only`)
    .option('--ttl <dur>', 'lifetime, e.g. 12h or 30d (default: never expires)', parseTokenTtl)
    .option('--description <text>', 'free text shown by `dsec token ls`')
    .action(async (opts: { tenant: string; role: string; ttl?: number; description?: string }) => {
      if (!(ROLES as readonly string[]).includes(opts.role)) throw new UserError(`--role ${JSON.stringify(opts.role)}: one of ${ROLES.join(', ')}`);
      const t = await ctx.client().createToken({ tenant: opts.tenant, role: opts.role as (typeof ROLES)[number], ...(opts.ttl !== undefined ? { ttl_s: opts.ttl } : {}), ...(opts.description !== undefined ? { description: opts.description } : {}) });
      if (ctx.json) {
        writeJson(ctx.io.stdout, t);
        return;
      }
      ctx.out(t.token + '\n');
      ctx.err(`token ${t.id}: tenant ${t.tenant}, role ${t.role}, ${t.expires_at === null ? 'never expires' : `expires ${new Date(t.expires_at).toISOString()}`}; shown once, keep it secret\n`);
    });
}
