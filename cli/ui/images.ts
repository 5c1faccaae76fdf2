/**
 * Text rendering of images and layers (used by `dsec image ls`, `dsec images`,
 * `dsec layer ls`, `dsec image prune`, `dsec commit`). Pure: data in, string out.
 */
import type { CommitResult, Image, Layer, PruneResult } from '../../sdk/index.js';
import { formatAge, formatBytes, makeTable, tableText } from '../util/output.js';

/** Options of the table renderers. */
export interface RenderImageOptions {
  /** "Now" in ms since the epoch, for the age columns; default `Date.now()`. */
  now?: number;
  /** Bold header; set only for a terminal. */
  color?: boolean;
}

/** Hex digits shown for a digest in tables, as `docker images` does; enough to be unique in practice and accepted back as a prefix. */
export const SHORT_DIGEST_LENGTH = 12;

/** `sha256:0123456789abcdef…` → `0123456789ab`; anything without the `sha256:` prefix is cut the same way. */
export function shortDigest(digest: string): string {
  return digest.replace(/^sha256:/, '').slice(0, SHORT_DIGEST_LENGTH);
}

/** Column headers of {@link renderImageTable}, in order. */
export const IMAGE_COLUMNS = ['REF', 'TENANT', 'LAYERS', 'SIZE', 'CREATED'] as const;

/**
 * The `dsec image ls` table: REF (`name:tag`), TENANT (whose name it is: `system` for the
 * shared base images), LAYERS (count), SIZE (sum of layer blobs, binary units) and
 * CREATED (age, e.g. `2h ago`), header first even when empty.
 */
export function renderImageTable(images: Image[], opts: RenderImageOptions = {}): string {
  const now = opts.now ?? Date.now();
  const t = makeTable([...IMAGE_COLUMNS], { color: opts.color ?? false });
  for (const i of images) {
    // `ref` and `size_bytes` are missing from the listing of a dsecd older than the image API.
    const ref = i.ref ?? `${i.name}:${i.tag}`;
    const size = typeof i.size_bytes === 'number' ? formatBytes(i.size_bytes) : '-';
    // `tenant` is missing from the listing of a dsecd older than per-tenant image names: all were system's.
    t.push([ref, i.tenant ?? 'system', String(i.layers.length), size, `${formatAge(now - i.created_at)} ago`]);
  }
  return tableText(t);
}

/** Column headers of {@link renderLayerTable}, in order. */
export const LAYER_COLUMNS = ['DIGEST', 'SIZE', 'SOURCE', 'IMAGES', 'SANDBOXES', 'AGE'] as const;

/**
 * The `dsec layer ls` table: DIGEST (first 12 hex digits), SIZE (binary units), SOURCE,
 * IMAGES (refs using it, comma-separated, `-` for none), SANDBOXES (count) and AGE.
 */
export function renderLayerTable(layers: Layer[], opts: RenderImageOptions = {}): string {
  const now = opts.now ?? Date.now();
  const t = makeTable([...LAYER_COLUMNS], { color: opts.color ?? false });
  for (const l of layers) {
    t.push([shortDigest(l.digest), formatBytes(l.size_bytes), l.source || '-', l.images.length ? l.images.join(',') : '-', String(l.sandboxes), formatAge(now - l.created_at)]);
  }
  return tableText(t);
}

/** Plural helper: `1 layer`, `2 layers`. */
function count(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? '' : 's'}`;
}

/**
 * The `dsec image prune` report: one `removed DIGEST SIZE SOURCE` line per layer (`would
 * remove` for a dry run), then a summary line with the bytes freed, and notes on young
 * layers kept and temporary entries removed.
 */
export function renderPruneResult(r: PruneResult): string {
  const verb = r.dry_run ? 'would remove' : 'removed';
  let out = '';
  if (r.removed.length > 0) {
    const t = makeTable(['', 'DIGEST', 'SIZE', 'SOURCE'], { color: false });
    for (const l of r.removed) t.push([verb, shortDigest(l.digest), formatBytes(l.size_bytes), l.source || '-']);
    // Drop the header row: the verb column already says what each line is.
    out += tableText(t).split('\n').slice(1).join('\n');
  }
  if (r.removed.length === 0) out += r.dry_run ? 'nothing to prune\n' : 'nothing pruned\n';
  else out += `${r.dry_run ? 'would free' : 'freed'} ${formatBytes(r.freed_bytes)} (${count(r.removed.length, 'layer')})\n`;
  if (r.kept_young.length > 0) out += `kept ${count(r.kept_young.length, 'unreferenced layer')} younger than the grace period\n`;
  if (r.tmp_removed > 0) out += `${verb} ${r.tmp_removed} leftover temporary ${r.tmp_removed === 1 ? 'entry' : 'entries'}\n`;
  return out;
}

/** Most stripped paths `dsec commit` names before summarising the rest. */
const MAX_STRIPPED_SHOWN = 10;

/**
 * The `dsec commit` note for stderr: `layer sha256:… (N bytes), stripped: a, b, … and N more`,
 * then one `warning: …` line per warning of the result (an exclude that matched nothing,
 * the create env left out of the image).
 */
export function renderCommitNote(r: CommitResult): string {
  const shown = r.stripped.slice(0, MAX_STRIPPED_SHOWN);
  const more = r.stripped.length - shown.length;
  const stripped = shown.length === 0 ? 'none' : shown.join(', ') + (more > 0 ? ` and ${more} more` : '');
  const warnings = (r.warnings ?? []).map((w) => `warning: ${w}\n`).join('');
  return `layer ${r.layer.digest} (${r.layer.size_bytes} bytes), stripped: ${stripped}\n${warnings}`;
}
