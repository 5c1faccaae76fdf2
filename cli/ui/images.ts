/**
 * Text rendering of images (used by `dsec images`). Pure: data in, string out.
 */
import type { ImageInfo } from '../../sdk/index.js';
import { formatAge, makeTable, tableText } from '../util/output.js';

/** The `dsec images` table: NAME, TAG, LAYERS (count), AGE (since import). */
export function renderImageTable(images: ImageInfo[], opts: { now?: number; color?: boolean } = {}): string {
  const now = opts.now ?? Date.now();
  const t = makeTable(['NAME', 'TAG', 'LAYERS', 'AGE'], { color: opts.color ?? false });
  for (const i of images) t.push([i.name, i.tag, String(i.layers.length), formatAge(now - i.created_at)]);
  return tableText(t);
}
