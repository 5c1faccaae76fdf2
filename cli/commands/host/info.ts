/**
 * `dsec host info`: what this host offers (kernel, cgroups, runtime, backends, defences,
 * uid pool, sandbox counts), as reported by dsecd. Missing capabilities are listed with
 * the reason, never hidden.
 */
import type { Command } from 'commander';
import { renderHostInfo } from '../../ui/host.js';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';

/** Adds `info` to the `host` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('info')
    .description('show host capabilities, runtime, backends and defences')
    .action(async () => {
      const info = await ctx.client().hostInfo();
      if (ctx.json) writeJson(ctx.io.stdout, info);
      else ctx.out(renderHostInfo(info, { color: ctx.color }));
    });
}
