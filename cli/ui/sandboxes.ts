/**
 * Text rendering of sandboxes (used by `dsec ls`). Pure: data in, string out.
 */
import type { Sandbox } from '../../sdk/index.js';
import { formatAge, formatBytes, formatLabels, makeTable, tableText } from '../util/output.js';

/** Options of {@link renderSandboxTable}. */
export interface RenderSandboxOptions {
  /** "Now" in ms since the epoch, for the AGE column; default `Date.now()`. */
  now?: number;
  /** Bold header; set only for a terminal. */
  color?: boolean;
  /** Add the columns of `ls --wide` ({@link WIDE_COLUMNS}). */
  wide?: boolean;
}

/** Column headers of {@link renderSandboxTable}, in order. */
export const SANDBOX_COLUMNS = ['ID', 'STATE', 'IMAGE', 'CPUS', 'MEMORY', 'AGE', 'LABELS'] as const;

/** Column headers `ls --wide` adds after STATE. */
export const WIDE_COLUMNS = ['PRIORITY'] as const;

/**
 * The `dsec ls` table: ID, STATE, IMAGE, CPUS (cores), MEMORY (binary units), AGE (since
 * creation) and LABELS (`k=v,...`), one sandbox per line, header first even when empty.
 * `wide` adds PRIORITY (`latency` or `batch`; `-` from a dsecd that does not report it)
 * after STATE.
 */
export function renderSandboxTable(sandboxes: Sandbox[], opts: RenderSandboxOptions = {}): string {
  const now = opts.now ?? Date.now();
  const head: string[] = [...SANDBOX_COLUMNS];
  if (opts.wide) head.splice(2, 0, ...WIDE_COLUMNS);
  const t = makeTable(head, { color: opts.color ?? false });
  for (const s of sandboxes) {
    const row = [s.id, s.state, s.image, String(s.cpus), formatBytes(s.memory_bytes), formatAge(now - s.created_at), formatLabels(s.labels)];
    if (opts.wide) row.splice(2, 0, s.priority ?? '-');
    t.push(row);
  }
  return tableText(t);
}
