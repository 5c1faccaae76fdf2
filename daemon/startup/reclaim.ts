/**
 * Start of the host's proactive reclaim of idle container sandboxes (daemon/host/memory/
 * host-reclaim.ts) with the settings of `[memory]` / `--reclaim`: the DAMON controller
 * over the configured sysfs (its ownership record in `<root>/damon-owner.json`), the
 * instance's cgroups, the store's live sandboxes and the exec activity. dsecd stops it at
 * shutdown (HostReclaim.stop), which removes a kdamond only if dsecd created it.
 */
import path from 'node:path';
import type { Logger } from 'pino';
import type { DaemonConfig } from '../config.js';
import type { SandboxRepo } from '../db/sandboxes.js';
import type { CgroupManager } from '../host/cgroups/index.js';
import { DamonController } from '../host/memory/damon.js';
import { HostReclaim } from '../host/memory/host-reclaim.js';
import type { ExecActivity } from '../sandbox/activity.js';

/**
 * Builds and starts the host's reclaim: it chooses its method and logs it (never throws
 * for a host that offers no method: it then reclaims nothing and says why).
 */
export async function startHostReclaim(config: DaemonConfig, cgroups: CgroupManager, repo: Pick<SandboxRepo, 'settledLive'>, activity: ExecActivity, log: Logger): Promise<HostReclaim> {
  const m = config.memory;
  const damon = m.damon ? new DamonController({ root: m.damonSysfs, ownerFile: path.join(config.root, 'damon-owner.json') }) : null;
  const r = new HostReclaim({ config: m, cgroups, damon, candidates: () => repo.settledLive(), activity, log: log.child({ component: 'reclaim' }) });
  await r.start();
  return r;
}
