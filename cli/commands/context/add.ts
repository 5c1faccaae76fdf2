/**
 * `dsec context add NAME --host https://HOST:PORT [--token T] [--ca FILE] [--use]`: saves a
 * context (a dsecd's TCP door or a gateway) in the contexts file (cli/util/contexts.ts);
 * `--use` also makes it current. Replaces a context of that name. Prints NAME.
 */
import type { Command } from 'commander';
import path from 'node:path';
import { existsSync } from 'node:fs';
import type { Ctx } from '../../util/context.js';
import { CONTEXT_NAME_RE, readContexts, writeContexts } from '../../util/contexts.js';
import { UserError } from '../../util/errors.js';
import { writeJson } from '../../util/output.js';

/** Adds `add` to the `context` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('add')
    .description('save a context: a dsecd TCP door (or gateway), its token and CA')
    .argument('<name>', 'context name')
    .option('--use', 'make it the current context')
    .addHelpText('after', '\nThe endpoint is given with the global options: --host https://HOST:PORT (required), --token TOKEN, --ca FILE.')
    .action((name: string, flags: { use?: boolean }) => {
      // --host, --token and --ca are the global options (commander gives them to the root command wherever they stand).
      const opts = { host: ctx.globals.host, token: ctx.globals.token, ca: ctx.globals.ca, use: flags.use };
      if (!opts.host) throw new UserError('dsec context add needs --host https://HOST:PORT', 'e.g. dsec context add lab --host https://dsec1.example.org:8443 --token TOKEN --ca ca.crt');
      if (!CONTEXT_NAME_RE.test(name)) throw new UserError(`context name ${JSON.stringify(name)}: 1-63 of letters, digits, '.', '_', '-'`);
      let u: URL;
      try {
        u = new URL(opts.host);
      } catch {
        throw new UserError(`--host ${JSON.stringify(opts.host)} is not a URL`, 'e.g. --host https://dsec1.example.org:8443');
      }
      if (u.protocol !== 'https:') throw new UserError(`--host ${opts.host}: dsecd's TCP door speaks https only`, 'e.g. --host https://dsec1.example.org:8443');
      const ca = opts.ca ? path.resolve(opts.ca) : undefined;
      if (ca && !existsSync(ca)) throw new UserError(`--ca ${opts.ca}: no such file`);
      const file = readContexts(ctx.io.env);
      file.contexts[name] = { host: opts.host.replace(/\/$/, ''), ...(opts.token ? { token: opts.token } : {}), ...(ca ? { ca } : {}) };
      if (opts.use) file.current = name;
      writeContexts(ctx.io.env, file);
      if (ctx.json) writeJson(ctx.io.stdout, { name, current: file.current === name });
      else ctx.out(name + '\n');
    });
}
