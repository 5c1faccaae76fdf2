/**
 * `dsec network set ID [--network MODE] [--allow RULE]... [--deny RULE]... [--network-policy NAME]`:
 * replaces a sandbox's network: its own rules and its policy become exactly what is given
 * (rules and a policy left out are dropped); a running sandbox gets it at once. Without
 * `--network` the sandbox keeps its mode. To add or remove single rules and keep the
 * rest, use `dsec network add` / `dsec network rm`. Between none and allow/open dsecd refuses
 * (a sandbox keeps its kind of network namespace).
 */
import type { Command } from 'commander';
import { renderNetwork } from '../../ui/network.js';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { addNetworkOptions, networkRequest, type NetworkFlags } from '../../util/network.js';
import { writeJson } from '../../util/output.js';

/** Adds `set` to the `network` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  const cmd = parent
    .command('set')
    .description("replace a sandbox's network rules (mode, --allow, --deny, policy): what is not given is dropped; takes effect at once (`network add`/`rm` change single rules)")
    .argument('<id>', 'sandbox id');
  return addNetworkOptions(cmd).action(async (id: string, f: NetworkFlags) => {
    const client = ctx.client();
    if (f.network === undefined && !f.allow && !f.deny && f.networkPolicy === undefined) {
      throw new UserError('nothing to set', 'give --network, --allow, --deny or --network-policy (the rules given replace the current ones; `dsec network add` adds to them)');
    }
    const current = f.network === undefined ? (await client.getNetwork(id)).mode : undefined;
    const req = networkRequest({ ...f, network: f.network ?? (f.networkPolicy === undefined ? current : undefined) })!;
    const n = await client.setNetwork(id, req);
    if (ctx.json) writeJson(ctx.io.stdout, n);
    else ctx.out(renderNetwork(n, { color: ctx.color }));
  });
}
