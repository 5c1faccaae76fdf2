/**
 * Text rendering for RL rounds (used by `dsec pause`, `dsec job ...`): what a pause
 * reclaimed, and leases. Pure: data in, string out.
 */
import type { Lease, Reclaim } from '../../sdk/index.js';
import { formatAge, formatBytes, formatDuration, makeTable, tableText } from '../util/output.js';

/**
 * One line per paused sandbox, e.g.
 * `0123456789abcdef paused, reclaimed 38MiB (file 40MiB -> 2MiB; no swap: anon 30MiB stays)`.
 * `reclaim` null or absent: the sandbox was already paused, nothing was reclaimed now.
 * With swap the anonymous memory is `swappable` instead of staying resident.
 */
export function renderPauseLine(id: string, reclaim: Reclaim | null | undefined): string {
  if (!reclaim) return `${id} paused (already paused; nothing reclaimed)`;
  const file = `file ${formatBytes(reclaim.file_before_bytes)} -> ${formatBytes(reclaim.file_after_bytes)}`;
  const anon = reclaim.swap ? `anon ${formatBytes(reclaim.anon_bytes)} swappable` : `no swap: anon ${formatBytes(reclaim.anon_bytes)} stays`;
  return `${id} paused, reclaimed ${formatBytes(reclaim.reclaimed_bytes)} (${file}; ${anon})`;
}

/** Options of the lease renderers. */
export interface RenderLeaseOptions {
  /** "Now" in ms since the epoch, for EXPIRES IN and STATE; default `Date.now()`. */
  now?: number;
  /** Bold header; set only for a terminal. */
  color?: boolean;
}

/**
 * `active` or `lapsed`. A lease is lapsed once dsecd marked it (`lapsed_at`), and also
 * from `expires_at` on even before dsecd's next sweep: a renewal is refused from then.
 */
export function leaseState(lease: Lease, now = Date.now()): 'active' | 'lapsed' {
  return lease.lapsed_at !== null || now >= lease.expires_at ? 'lapsed' : 'active';
}

/** When the lease expires, relative to `now`: `9m` ahead, `3m ago` once past. */
function expiresIn(lease: Lease, now: number): string {
  const left = lease.expires_at - now;
  // Time left rounds up (a fresh 2 s lease reads "2s"); time since expiry rounds down.
  return left > 0 ? formatAge(Math.ceil(left / 1000) * 1000) : `${formatAge(-left)} ago`;
}

/** `job a: lease active, expires in 10m (ttl 10m), 3 sandboxes`: the line of `job lease` and `job renew`. */
export function renderLeaseLine(lease: Lease, opts: RenderLeaseOptions = {}): string {
  const now = opts.now ?? Date.now();
  const n = `${lease.sandboxes} sandbox${lease.sandboxes === 1 ? '' : 'es'}`;
  const state = leaseState(lease, now);
  const when = state === 'active' ? `expires in ${expiresIn(lease, now)}` : `expired ${expiresIn(lease, now)}`;
  return `job ${lease.job}: lease ${state}, ${when} (ttl ${formatDuration(lease.ttl_s * 1000)}), ${n}`;
}

/** Column headers of {@link renderLeaseTable}, in order. */
export const LEASE_COLUMNS = ['JOB', 'TTL', 'EXPIRES IN', 'STATE', 'SANDBOXES'] as const;

/**
 * The `dsec job ls` table: JOB, TTL (what a renewal extends by, e.g. `10m`), EXPIRES IN
 * (`9m`, or `3m ago` once past), STATE (`active` or `lapsed`, see {@link leaseState}) and
 * SANDBOXES (labelled `job=<job>`), header first even when empty.
 */
export function renderLeaseTable(leases: Lease[], opts: RenderLeaseOptions = {}): string {
  const now = opts.now ?? Date.now();
  const t = makeTable([...LEASE_COLUMNS], { color: opts.color ?? false });
  for (const l of leases) t.push([l.job, formatDuration(l.ttl_s * 1000), expiresIn(l, now), leaseState(l, now), String(l.sandboxes)]);
  return tableText(t);
}
