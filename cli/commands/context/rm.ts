/** `dsec context rm NAME...`: removes saved contexts (the current one too: then the local socket is current). */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { readContexts, writeContexts } from '../../util/contexts.js';
import { UserError } from '../../util/errors.js';

/** Adds `rm` to the `context` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('rm')
    .description('remove saved contexts')
    .argument('<name...>', 'context names')
    .action((names: string[]) => {
      const file = readContexts(ctx.io.env);
      const missing = names.filter((n) => !file.contexts[n]);
      if (missing.length) throw new UserError(`no context ${missing.map((n) => JSON.stringify(n)).join(', ')}`, 'list them with `dsec context ls`');
      for (const n of names) {
        delete file.contexts[n];
        if (file.current === n) file.current = null;
      }
      writeContexts(ctx.io.env, file);
      for (const n of names) ctx.out(n + '\n');
    });
}
