/**
 * Text rendering of snapshots (used by `dsec snapshot ...`). Pure: data in, string out.
 */
import type { Snapshot } from '../../sdk/index.js';
import { formatAge, formatBytes, makeTable, tableText } from '../util/output.js';
import { shortDigest } from './images.js';

/** Options of {@link renderSnapshotTable}. */
export interface RenderSnapshotOptions {
  /** "Now" in ms since the epoch, for the CREATED column; default `Date.now()`. */
  now?: number;
  /** Bold header; set only for a terminal. */
  color?: boolean;
}

/** Column headers of {@link renderSnapshotTable}, in order. */
export const SNAPSHOT_COLUMNS = ['ID', 'NAME', 'SANDBOX', 'IMAGE', 'SIZE', 'CREATED'] as const;

/**
 * The `dsec snapshot ls` table: ID (`snap-<16 hex>`), NAME (`-` for none), SANDBOX (the
 * source, which may be gone), IMAGE (of the source), SIZE (the snapshot layer's blob,
 * binary units) and CREATED (age, e.g. `2h ago`), in the order dsecd lists them, header
 * first even when empty.
 */
export function renderSnapshotTable(snapshots: Snapshot[], opts: RenderSnapshotOptions = {}): string {
  const now = opts.now ?? Date.now();
  const t = makeTable([...SNAPSHOT_COLUMNS], { color: opts.color ?? false });
  for (const s of snapshots) t.push([s.id, s.name ?? '-', s.sandbox_id, s.image, formatBytes(s.size_bytes), `${formatAge(now - s.created_at)} ago`]);
  return tableText(t);
}

/**
 * The `dsec snapshot ID [NAME]` note for stderr:
 * `snapshot snap-… "NAME" of sandbox ID: layer 0123456789ab (12MiB)`, or for a machine
 * snapshot (kind vm) `…: machine state 0123456789ab (40MiB), vCPUs stopped 350 ms`.
 */
export function renderSnapshotNote(s: Snapshot): string {
  const name = s.name === null ? '' : ` ${JSON.stringify(s.name)}`;
  const what = s.kind === 'vm' && s.machine
    ? `machine state ${shortDigest(s.layer)} (${formatBytes(s.size_bytes)}), vCPUs stopped ${s.machine.paused_ms} ms`
    : `layer ${shortDigest(s.layer)} (${formatBytes(s.size_bytes)})`;
  return `snapshot ${s.id}${name} of sandbox ${s.sandbox_id}: ${what}\n`;
}
