/**
 * `dsec context use NAME`: makes NAME the current context (commands then go to its
 * dsecd unless `--socket`, `--host`, `--context` or DSEC_HOST say otherwise);
 * `dsec context use -`: back to the local socket. Prints the name.
 */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { readContexts, writeContexts } from '../../util/contexts.js';
import { UserError } from '../../util/errors.js';

/** Adds `use` to the `context` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('use')
    .description('make a context current (`-`: the local socket)')
    .argument('<name>', 'context name, or - for the local socket')
    .action((name: string) => {
      const file = readContexts(ctx.io.env);
      if (name !== '-' && !file.contexts[name]) throw new UserError(`no context ${JSON.stringify(name)}`, 'list them with `dsec context ls`; add one with `dsec context add`');
      file.current = name === '-' ? null : name;
      writeContexts(ctx.io.env, file);
      ctx.out(`${name === '-' ? 'local socket' : name}\n`);
    });
}
