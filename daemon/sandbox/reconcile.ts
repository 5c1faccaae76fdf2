/**
 * Reconcile: at start (possibly after a crash), the store and the host are brought into
 * agreement. Each row is settled by what its half-done step was (docs/ARCHITECTURE.md
 * "The lifecycle"): unacknowledged creates and starts are rolled back, stops and
 * destroys rolled forward, live sandboxes adopted; forks that never committed are
 * rolled back whole; then each driver removes host leftovers no row accounts for. Safe
 * on a clean host and safe to run twice.
 */
import { readdir, rm } from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from 'pino';
import type { SandboxRepo } from '../db/sandboxes.js';
import type { SnapshotRepo } from '../db/snapshots.js';
import { NO_STEPS } from '../model/steps.js';
import type { Backends } from './backends.js';
import { FORK_LABEL } from './snapshots.js';
import { isPoolShell } from './warm-pool.js';

/** What {@link reconcile} found and did at start. */
export interface ReconcileReport {
  /** User sandboxes found alive and adopted. */
  adopted: string[];
  /** Warm-pool shells of the previous dsecd found alive; main destroys them right after (never adopted). */
  shells: string[];
  rolledBack: string[];
  finished: string[];
  failed: string[];
  orphans: string[];
}

/** What reconcile reads and acts through. */
export interface ReconcileDeps {
  /** The state root (`<root>/snapshots`). */
  root: string;
  repo: SandboxRepo;
  snapshots: SnapshotRepo;
  backends: Backends;
  log: Logger;
}

/**
 * Settles every row and removes leftovers; see the module comment. Failpoints are not
 * armed here (a cleanup is not a step under test).
 * @returns what was adopted, rolled back, finished, failed and removed.
 */
export async function reconcile(d: ReconcileDeps): Promise<ReconcileReport> {
  const rep: ReconcileReport = { adopted: [], shells: [], rolledBack: [], finished: [], failed: [], orphans: [] };
  const steps = NO_STEPS;
  for (const sb of d.repo.all()) {
    const drv = d.backends.find(sb.backend);
    if (!drv) {
      d.log.error({ id: sb.id, backend: sb.backend }, 'sandbox of an unknown backend left alone');
      continue;
    }
    try {
      if (!sb.acknowledged) {
        await drv.destroy(sb, steps);
        d.repo.remove(sb.id);
        d.repo.event('sandbox.failed', { ...sb, state: 'failed' }, 'create interrupted by a dsecd restart; cleaned up');
        rep.rolledBack.push(sb.id);
      } else if (sb.desired === 'destroyed') {
        await drv.destroy(sb, steps);
        d.repo.remove(sb.id);
        d.repo.event('sandbox.destroyed', { ...sb, state: 'destroyed' });
        rep.finished.push(sb.id);
      } else if (sb.desired === 'stopped' || sb.state === 'stopped') {
        await drv.stop(sb, steps);
        if (sb.state !== 'stopped') d.repo.event('sandbox.stopped', d.repo.transition(sb.id, 'stopped', { initPid: null, initStart: null }));
        else d.repo.setDesired(sb.id, null);
        rep.finished.push(sb.id);
      } else if (sb.state === 'failed') {
        await drv.stop(sb, steps);
        d.repo.setDesired(sb.id, null);
      } else if (sb.state === 'running' || sb.state === 'paused') {
        if (await drv.isAlive(sb)) {
          await drv.adopt(sb);
          // Unacknowledged pause/resume roll back to the recorded state.
          if (sb.desired === 'paused' && sb.state === 'running') await drv.resume(sb).catch(() => {});
          if (sb.desired === 'running' && sb.state === 'paused') await drv.pause(sb).catch(() => {});
          if (sb.desired) d.repo.setDesired(sb.id, null);
          (isPoolShell(sb) ? rep.shells : rep.adopted).push(sb.id);
        } else {
          await drv.stop(sb, steps);
          const f = d.repo.transition(sb.id, 'failed', { initPid: null, initStart: null, error: 'init exited while dsecd was not running' });
          d.repo.event('sandbox.failed', f, f.error ?? undefined);
          rep.failed.push(sb.id);
        }
      }
    } catch (e) {
      d.log.error({ err: e, id: sb.id }, 'reconcile failed for sandbox');
      rep.failed.push(sb.id);
    }
  }
  // Forks that never committed are rolled back whole: their callers never got the ids.
  for (const forkId of d.snapshots.forkIntents()) {
    for (const sb of d.repo.all().filter((s) => s.labels[FORK_LABEL] === forkId)) {
      const drv = d.backends.find(sb.backend);
      try {
        if (drv) await drv.destroy(sb, steps);
        d.repo.remove(sb.id);
        d.repo.event('sandbox.destroyed', { ...sb, state: 'destroyed' }, `fork ${forkId} interrupted by a dsecd restart; rolled back`);
        rep.rolledBack.push(sb.id);
      } catch (e) {
        d.log.error({ err: e, id: sb.id }, 'rolling back an interrupted fork failed');
      }
    }
    d.snapshots.removeForkIntent(forkId);
  }
  // Machine snapshot files whose row was never written (dsecd died during the capture).
  const snapIds = new Set(d.snapshots.all().map((s) => s.id));
  for (const e of await readdir(path.join(d.root, 'snapshots')).catch(() => [] as string[])) {
    if (snapIds.has(e)) continue;
    await rm(path.join(d.root, 'snapshots', e), { recursive: true, force: true });
    rep.orphans.push(`snapshot files ${e}`);
  }
  const known = new Set(d.repo.all().map((s) => s.id));
  for (const drv of d.backends.all()) {
    const o = await drv.cleanOrphans(known);
    rep.orphans.push(...o.removed);
  }
  const freed = d.repo.freeOrphanRanges();
  if (freed) rep.orphans.push(`${freed} uid range(s)`);
  return rep;
}
