/**
 * Host-wide registry of running dsecd instances, so two instances never share a name
 * (and with it a cgroup parent and runtime names) or an overlapping id range: sandboxes
 * of different instances must never share a host uid, and no instance's builder identity
 * (daemon/host/builder.ts) may share one with any sandbox or any other builder.
 *
 * One JSON file per instance in {@link REGISTRY_DIR}: `{pid, start, root, socket, uid_pool, builder}`
 * (`builder` is absent for instances that build as root, and in entries of older versions).
 * An entry whose process is gone (or whose pid was reused: /proc starttime differs) is stale
 * and ignored. Written at start, removed at clean shutdown.
 */
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { DaemonConfig } from '../config.js';
import { failedPrecondition, type DsecError } from '../errors.js';
import { rangesOverlap, type IdRange } from './builder.js';
import { procStartTime } from './proc.js';

/** Where instance registrations live: tmpfs, so a reboot clears it. Override with DSEC_REGISTRY_DIR. */
export const REGISTRY_DIR = process.env.DSEC_REGISTRY_DIR ?? '/run/dsec/instances';

interface Entry {
  pid: number;
  start: number | null;
  root: string;
  socket: string;
  uid_pool: { base: number; size: number };
  builder?: { base: number; size: number };
}

/** The id ranges an instance claims: its sandbox uid pool and, when it has one, its builder range. */
export interface ClaimedRanges {
  uid_pool: IdRange;
  builder?: IdRange | null;
}

/**
 * Why instance `mine` cannot run beside the live instance `name` (`other`), or null when
 * their ranges are disjoint: any overlap between the two sandbox pools, the two builder
 * ranges, or one's pool and the other's builder range is refused. Pure.
 */
export function rangeConflict(mine: ClaimedRanges, name: string, pid: number, other: ClaimedRanges): DsecError | null {
  const show = (r: IdRange) => `[${r.base}, ${r.base + r.size})`;
  const pairs: Array<[string, IdRange | null | undefined, string, IdRange | null | undefined, string]> = [
    ['uid pool', mine.uid_pool, 'uid pool', other.uid_pool, 'give each instance its own uid_pool.base in its config'],
    ['builder range', mine.builder, 'uid pool', other.uid_pool, 'move [builder] base outside every instance\'s uid pool'],
    ['uid pool', mine.uid_pool, 'builder range', other.builder, 'move uid_pool.base outside every instance\'s builder range'],
    ['builder range', mine.builder, 'builder range', other.builder, 'give each instance its own [builder] base'],
  ];
  for (const [a, ra, b, rb, hint] of pairs) {
    if (ra && rb && rangesOverlap(ra, rb)) return failedPrecondition(`${a} ${show(ra)} overlaps instance ${name}'s ${b} ${show(rb)} (pid ${pid}); ${hint}`);
  }
  return null;
}


/** A held registration; `release()` removes it (safe to call twice). */
export interface InstanceRegistration {
  release(): void;
}

/**
 * Registers this process as instance `config.instance`.
 * @throws DsecError FailedPrecondition when a live process already runs this instance
 *   (same name) or a live instance's uid pool or builder range overlaps ours (see {@link rangeConflict}).
 */
export function registerInstance(config: DaemonConfig): InstanceRegistration {
  mkdirSync(REGISTRY_DIR, { recursive: true, mode: 0o755 });
  const lo = config.uidPool.base;
  const builder = config.builder.enabled ? { base: config.builder.base, size: config.builder.size } : undefined;
  const mine: ClaimedRanges = { uid_pool: { base: lo, size: config.uidPool.size }, builder };
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
    const conflict = rangeConflict(mine, name, e.pid, e);
    if (conflict) throw conflict;
  }
  const file = path.join(REGISTRY_DIR, `${config.instance}.json`);
  const entry: Entry = { pid: process.pid, start: procStartTime(process.pid), root: config.root, socket: config.socket, uid_pool: { base: lo, size: config.uidPool.size }, ...(builder ? { builder } : {}) };
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
