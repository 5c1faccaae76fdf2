/**
 * Text of `dsec cp`'s progress line and summary. Pure: data in, string out.
 */
import { formatBytes } from '../util/output.js';

/** Width assumed when a terminal does not report its columns. */
const DEFAULT_COLUMNS = 80;

/**
 * The progress line: `copying WHAT: 512MiB of 1GiB (50%)`, or without a known size
 * `copying WHAT: 512MiB`, cut to the terminal width (no newline).
 */
export function formatProgressBytes(what: string, total: number, size?: number, columns?: number): string {
  const of = size !== undefined && size > 0 ? ` of ${formatBytes(size)} (${Math.min(100, Math.floor((total / size) * 100))}%)` : '';
  const line = `copying ${what}: ${formatBytes(total)}${of}`;
  const width = Math.max(10, (columns && columns > 0 ? columns : DEFAULT_COLUMNS) - 1);
  const chars = [...line];
  return chars.length > width ? chars.slice(0, width - 1).join('') + '…' : line;
}

/** The summary docker prints too: `Successfully copied 1GiB to ID:/path`. */
export function formatCopied(bytes: number, to: string): string {
  return `Successfully copied ${formatBytes(bytes)} to ${to}`;
}
