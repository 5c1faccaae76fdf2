/**
 * The host verbs only a gateway serves (admin; every gateway follows them through etcd):
 * - `dsec host cordon NAME`: no new placements on the host; prints its new state;
 * - `dsec host uncordon NAME`: the host takes placements again; prints its new state;
 * - `dsec host drain NAME`: cordon it and list the sandboxes left on it (ID STATE LABELS);
 * - `dsec host forget NAME`: remove a down host's registration and name claim.
 * With --json each prints the gateway's answer. Against a dsecd (no such route) the
 * error says to point DSEC_HOST at a gateway.
 */
import type { Command } from 'commander';
import { isDsecApiError, type DsecClient } from '../../../sdk/index.js';
import { hostState } from '../../ui/hosts.js';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { writeJson } from '../../util/output.js';

/** One verb: its call and how its answer reads for a person. */
interface HostVerb<T> {
  name: string;
  description: string;
  call(client: DsecClient, host: string): Promise<T>;
  lines(r: T): string[];
}

const verb = <T>(v: HostVerb<T>): HostVerb<unknown> => v as HostVerb<unknown>;

/** The verbs, in the order `dsec host --help` lists them. */
const VERBS: HostVerb<unknown>[] = [
  verb({
    name: 'cordon', description: 'no new placements on the host (admin; every gateway follows it)',
    call: (c, h) => c.cordonHost(h), lines: (r) => [`${r.name}: ${hostState(r)}`],
  }),
  verb({
    name: 'uncordon', description: 'the host takes placements again (admin)',
    call: (c, h) => c.uncordonHost(h), lines: (r) => [`${r.name}: ${hostState(r)}`],
  }),
  verb({
    name: 'drain', description: 'cordon the host and list the sandboxes left on it (admin)',
    call: (c, h) => c.drainHost(h),
    lines: (r) => [
      `${r.host.name}: ${hostState(r.host)}; ${r.left.length} sandbox(es) left`,
      ...r.left.map((s) => `${s.id}  ${s.state}  ${Object.entries(s.labels).map(([k, v]) => `${k}=${v}`).join(',') || '-'}`),
    ],
  }),
  verb({
    name: 'forget', description: 'remove a down host\'s registration and name claim from the fleet (admin)',
    call: (c, h) => c.forgetHost(h), lines: (r) => [`${r.name}: forgotten (id ${r.id ?? '-'})`],
  }),
];

/** Adds cordon, uncordon, drain and forget to the `host` command `parent`. */
export function register(parent: Command, ctx: Ctx): void {
  for (const v of VERBS) {
    parent
      .command(`${v.name} <name>`)
      .description(v.description)
      .action(async (name: string) => {
        let r: unknown;
        try {
          r = await v.call(ctx.client(), name);
        } catch (e) {
          if (isDsecApiError(e) && e.code === 'NotFound' && /no route/.test(e.message)) throw new UserError('this server is a dsecd, not a gateway', 'point --host (DSEC_HOST) at a dsec-gateway');
          throw e;
        }
        if (ctx.json) {
          writeJson(ctx.io.stdout, r);
          return;
        }
        for (const l of v.lines(r)) ctx.out(`${l}\n`);
      });
  }
}
