/**
 * `dsec version`: the client version and, when dsecd answers, the daemon's.
 * An unreachable daemon is reported but is not a failure (exit 0): the client version
 * is what was asked for first.
 */
import type { Command } from 'commander';
import { DsecApiError, type VersionInfo } from '../../sdk/index.js';
import type { Ctx } from '../util/context.js';
import { writeJson } from '../util/output.js';
import { clientVersion } from '../util/version.js';

/** Adds `version` to `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('version')
    .description('print the client version and the daemon version if reachable')
    .action(async () => {
      const client = clientVersion();
      let daemon: VersionInfo | null = null;
      let failure: DsecApiError | null = null;
      try {
        daemon = await ctx.client().version();
      } catch (e) {
        if (!(e instanceof DsecApiError)) throw e;
        failure = e;
      }
      if (ctx.json) {
        writeJson(ctx.io.stdout, {
          client: { version: client },
          daemon,
          ...(failure ? { daemon_error: { code: failure.code, message: failure.message } } : {}),
        });
        return;
      }
      ctx.out(`dsec   ${client}\n`);
      if (daemon) ctx.out(`dsecd  ${daemon.version} (api ${daemon.api}, agent protocol ${daemon.agent_protocol}, node ${daemon.node})\n`);
      else ctx.out(`dsecd  not reachable: ${failure!.message} (${failure!.code})\n`);
    });
}
