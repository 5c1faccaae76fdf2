/**
 * Output helpers shared by the verbs: JSON documents, NDJSON lines, plain tables and
 * human formats for bytes, ages and durations.
 */
import Table from 'cli-table3';
import type { OutStream } from './io.js';

/** Writes `value` as one pretty-printed JSON document (2-space indent) and a newline. */
export function writeJson(out: OutStream, value: unknown): void {
  out.write(JSON.stringify(value, null, 2) + '\n');
}

/** Writes `value` as one compact JSON line (NDJSON). */
export function writeJsonLine(out: OutStream, value: unknown): void {
  out.write(JSON.stringify(value) + '\n');
}

/** Options of {@link makeTable}. */
export interface TableStyle {
  /** Colour the header (bold); only when writing to a terminal and NO_COLOR is unset. */
  color: boolean;
}

/**
 * A borderless table (columns separated by spaces, like `docker ps`) so its output is
 * easy to read and to cut/awk. Colour codes only when `style.color`.
 */
export function makeTable(head: string[], style: TableStyle): Table.Table {
  return new Table({
    head,
    chars: {
      top: '', 'top-mid': '', 'top-left': '', 'top-right': '',
      bottom: '', 'bottom-mid': '', 'bottom-left': '', 'bottom-right': '',
      left: '', 'left-mid': '', mid: '', 'mid-mid': '',
      right: '', 'right-mid': '', middle: '  ',
    },
    style: { 'padding-left': 0, 'padding-right': 0, head: style.color ? ['bold'] : [], border: [], compact: true },
  });
}

/** Renders a table to text: trailing spaces removed, one final newline. */
export function tableText(t: Table.Table): string {
  return t.toString().split('\n').map((l) => l.replace(/\s+$/, '')).join('\n') + '\n';
}

/** Whether to use colour on `out`: a terminal, and NO_COLOR unset. */
export function useColor(out: OutStream, env: Record<string, string | undefined>): boolean {
  return out.isTTY === true && !env.NO_COLOR;
}

/** Bytes in binary units, shortest exact-enough form: `512MiB`, `1.5GiB`, `100B`. */
export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let v = bytes;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  const s = i === 0 || Number.isInteger(v) ? String(v) : v >= 100 ? v.toFixed(0) : v.toFixed(1).replace(/\.0$/, '');
  return s + units[i];
}

/** A duration in ms as one coarse unit, like `docker ps` ages: `45s`, `3m`, `2h`, `5d`. */
export function formatAge(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

/** A duration in ms in the DUR syntax the flags accept: `500ms`, `2s`, `1m30s`, `1h`. */
export function formatDuration(ms: number): string {
  if (ms < 1000) return `${ms}ms`;
  let rest = ms;
  let out = '';
  for (const [unit, size] of [['h', 3_600_000], ['m', 60_000], ['s', 1000], ['ms', 1]] as const) {
    const n = Math.floor(rest / size);
    if (n > 0) out += `${n}${unit}`;
    rest -= n * size;
  }
  return out;
}

/** Labels as `k=v,k2=v2`, keys sorted; `-` when there are none. */
export function formatLabels(labels: Record<string, string> | undefined): string {
  const keys = Object.keys(labels ?? {}).sort();
  return keys.length === 0 ? '-' : keys.map((k) => `${k}=${labels![k]}`).join(',');
}

/** C0 controls, DEL and the C1 controls (U+0080-U+009F: some terminals read U+009B as CSI). */
const CONTROL_CHARS = /[\u0000-\u001f\u007f-\u009f]/g;
/** {@link CONTROL_CHARS} but tab and newline. */
const CONTROL_BUT_LINES = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g;

/**
 * `text` safe to print on a terminal: each control character shown as `\xNN` (`\u00NN`
 * for the C1 ones), so what a sandbox named (a file name, a link target) can neither
 * drive the terminal with escape sequences nor, with `lines: false` (the default), start
 * a line that looks like one of ours. `lines: true` keeps tabs and newlines (messages of
 * several lines).
 */
export function printable(text: string, opts: { lines?: boolean } = {}): string {
  return text.replace(opts.lines ? CONTROL_BUT_LINES : CONTROL_CHARS, (c) => {
    const n = c.charCodeAt(0);
    return n < 0x80 ? `\\x${n.toString(16).padStart(2, '0')}` : `\\u${n.toString(16).padStart(4, '0')}`;
  });
}
