/**
 * `dsec fleet ca DIR [--name NAME] [--days N]`: makes a fleet CA in DIR (created 0700):
 * `ca.crt` (give it to every dsecd and gateway as `--tls-ca`, and to clients) and
 * `ca.key` (0600; keep it offline: whoever holds it can mint host and gateway
 * certificates). Refuses a DIR that already holds a CA. Runs locally, without dsecd.
 * Prints the two paths, or `{cert, key}` with --json.
 */
import type { Command } from 'commander';
import { PkiError, makeFleetCa } from '../../../pki/certs.js';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { writeJson } from '../../util/output.js';
import { flag, parsePositiveInt } from '../../util/parse.js';

/** Runs `fn`, turning a refusal of the certificate code (PkiError) into a UserError (printed without a stack). */
export async function asUserError<T>(fn: () => Promise<T>, hint?: string): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    if (e instanceof PkiError) throw new UserError(e.message, hint, e.kind);
    throw e;
  }
}

/** Adds `ca` to the `fleet` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('ca')
    .description('make a fleet CA in DIR: ca.crt (for --tls-ca and clients) and ca.key (keep it offline)')
    .argument('<dir>', 'directory to write ca.crt and ca.key in (created 0700)')
    .option('--name <name>', 'the CA\'s common name', 'dsec fleet CA')
    .option('--days <n>', 'validity in days', flag('--days', parsePositiveInt), 3650)
    .action(async (dir: string, opts: { name: string; days: number }) => {
      const r = await asUserError(() => makeFleetCa(dir, opts.name, opts.days), 'choose another DIR');
      if (ctx.json) writeJson(ctx.io.stdout, r);
      else ctx.out(`${r.cert}\n${r.key}\n`);
    });
}
