/**
 * `dsec host reload`: reloads the data files dsecd enforces, as SIGHUP does: the seccomp
 * profile and the network policy files. Each is all or nothing: a malformed file is
 * refused (the message names the file and the field) and what was in force stays.
 * Exits non-zero when either was refused, after trying both.
 */
import type { Command } from 'commander';
import type { Ctx } from '../../util/context.js';
import { writeJson } from '../../util/output.js';
import { isDsecApiError } from '../../../sdk/index.js';
import { UserError } from '../../util/errors.js';

/** Adds `reload` to the `host` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('reload')
    .description('reload the seccomp profile and the network policy files (a malformed file is refused; what is in force stays)')
    .action(async () => {
      const client = ctx.client();
      const settle = async <T>(p: Promise<T>): Promise<{ ok: T } | { error: string }> => {
        try {
          return { ok: await p };
        } catch (e) {
          if (isDsecApiError(e) && (e.code === 'InvalidArgument' || e.code === 'Unimplemented')) return { error: e.message };
          throw e;
        }
      };
      const [seccomp, network] = [await settle(client.reloadSeccompProfile()), await settle(client.reloadNetworkPolicies())];
      if (ctx.json) writeJson(ctx.io.stdout, { seccomp, network });
      else {
        ctx.out('ok' in seccomp ? `seccomp: ${seccomp.ok.file} (sha256 ${seccomp.ok.sha256.slice(0, 12)}, ${seccomp.ok.denied} syscalls denied)\n` : `seccomp: refused, the profile in force stays: ${seccomp.error}\n`);
        if ('ok' in seccomp) for (const w of seccomp.ok.warnings ?? []) ctx.err(`dsec: warning: ${w}\n`);
        ctx.out('ok' in network ? `network policies: ${network.ok.loaded.join(', ') || 'none'} (changed: ${network.ok.changed.join(', ') || 'none'})\n` : `network policies: refused, the loaded ones stay: ${network.error}\n`);
      }
      const refused = ['seccomp', 'network'].filter((k, i) => 'error' in [seccomp, network][i]);
      if (refused.length && !refused.every((k) => k === 'network' && 'error' in network && /no sandbox networking/.test(network.error)))
        throw new UserError(`reload refused for ${refused.join(' and ')}`, 'fix the file named above and run `dsec host reload` again');
    });
}
