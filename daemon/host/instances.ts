/**
 * Host-wide registry of running dsecd instances, so two instances never share a name
 * (and with it a cgroup parent and runtime names) or an overlapping uid pool: sandboxes
 * of different instances must never share a host uid.
 *
 * One JSON file per instance in {@link REGISTRY_DIR}: `{pid, start, root, socket, uid_pool}`.
 * An entry whose process is gone (or whose pid was reused: /proc starttime differs) is stale
 * and ignored. Written at start, removed at clean shutdown.
 */
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { DaemonConfig } from '../config.js';
import { failedPrecondition } from '../errors.js';
import { procStartTime } from './proc.js';

/** Where instance registrations live: tmpfs, so a reboot clears it. Override with DSEC_REGISTRY_DIR. */
export const REGISTRY_DIR = process.env.DSEC_REGISTRY_DIR ?? '/run/dsec/instances';

interface Entry {
  pid: number;
  start: number | null;
  root: string;
  socket: string;
  uid_pool: { base: number; size: number };
}


/** A held registration; `release()` removes it (safe to call twice). */
export interface InstanceRegistration {
  release(): void;
}

/**
 * Registers this process as instance `config.instance`.
 * @throws DsecError FailedPrecondition when a live process already runs this instance
 *   (same name) or a live instance's uid pool overlaps ours.
 */
export function registerInstance(config: DaemonConfig): InstanceRegistration {
  mkdirSync(REGISTRY_DIR, { recursive: true, mode: 0o755 });
  const lo = config.uidPool.base;
  const hi = config.uidPool.base + config.uidPool.size;
  for (const f of readdirSync(REGISTRY_DIR)) {
    if (!f.endsWith('.json')) continue;
    let e: Entry;
    try {
      e = JSON.parse(readFileSync(path.join(REGISTRY_DIR, f), 'utf8'));
    } catch {
      continue;
    }
    if (e.pid === process.pid) continue;
    const st = procStartTime(e.pid);
    if (st === null || (e.start !== null && st !== e.start)) continue; // stale
    const name = f.slice(0, -5);
    if (name === config.instance) {
      throw failedPrecondition(`instance ${name} is already running (pid ${e.pid}, root ${e.root}); stop it or use another --root`);
    }
    const olo = e.uid_pool.base;
    const ohi = e.uid_pool.base + e.uid_pool.size;
    if (lo < ohi && olo < hi) {
      throw failedPrecondition(
        `uid pool [${lo}, ${hi}) overlaps instance ${name}'s [${olo}, ${ohi}) (pid ${e.pid}); give each instance its own uid_pool.base in its config`,
      );
    }
  }
  const file = path.join(REGISTRY_DIR, `${config.instance}.json`);
  const entry: Entry = { pid: process.pid, start: procStartTime(process.pid), root: config.root, socket: config.socket, uid_pool: { base: lo, size: config.uidPool.size } };
  writeFileSync(`${file}.tmp${process.pid}`, JSON.stringify(entry));
  renameSync(`${file}.tmp${process.pid}`, file);
  let released = false;
  return {
    release() {
      if (released) return;
      released = true;
      try {
        const cur = JSON.parse(readFileSync(file, 'utf8')) as Entry;
        if (cur.pid === process.pid) rmSync(file, { force: true });
      } catch { /* already gone */ }
    },
  };
}
