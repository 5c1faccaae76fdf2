/**
 * Progress of long image operations (`dsec image build`, `image import`,
 * `image bootstrap`) on stderr.
 *
 * - On a terminal: one status line, rewritten in place with `\r` + clear-line (ANSI
 *   `ESC[2K`), cut to the terminal width, and erased when the operation ends, so the
 *   final output (or error) starts on a clean line.
 * - Otherwise (a pipe, a log file, CI): one plain line per progress event, nothing else,
 *   so logs stay greppable.
 *
 * Text from dsecd is stripped of control characters before it reaches the terminal.
 */
import type { ImageProgress } from '../../sdk/index.js';
import type { OutStream } from '../util/io.js';
import { formatBytes } from '../util/output.js';
import { shortDigest } from './images.js';

/** Carriage return + ANSI "erase entire line". */
const CLEAR_LINE = '\r\x1b[2K';

/** Width assumed when a terminal does not report its columns. */
const DEFAULT_COLUMNS = 80;

/** C0 and C1 control characters (including ESC): never passed from dsecd to a terminal. */
const CONTROL = /[\u0000-\u001f\u007f-\u009f]+/g;

/**
 * Wording of the import phases dsecd reports without a message (daemon/image/import/oci.ts
 * ImportProgress): `unpack` an archive, extract `layer` i of n, `build` its EROFS blob,
 * store the `manifest`.
 */
const PHASE_TEXT: Record<string, string> = {
  unpack: 'unpacking the archive',
  layer: 'extracting layer',
  build: 'building EROFS layer',
  manifest: 'storing the manifest',
};

/**
 * One progress event as one line of text (no newline), each part only when present:
 * `phase: [2/5] message (12MiB)`; a known import phase without a message reads
 * `extracting layer 2/5 (12MiB)`. Empty when the event carries nothing to show.
 */
export function formatProgress(p: ImageProgress): string {
  const parts: string[] = [];
  const n = typeof p.layer === 'number' ? (typeof p.layers === 'number' ? `${p.layer}/${p.layers}` : `${p.layer}`) : undefined;
  const words = !p.message && p.phase ? PHASE_TEXT[p.phase] : undefined;
  if (words) {
    parts.push(words);
    if (n) parts.push(n);
  } else {
    if (p.phase) parts.push(`${clean(p.phase)}:`);
    if (n) parts.push(`[${n}]`);
    else if (typeof p.layer === 'string') parts.push(`[${shortDigest(clean(p.layer))}]`);
    if (p.message) parts.push(clean(p.message));
  }
  if (typeof p.bytes === 'number' && Number.isFinite(p.bytes)) parts.push(`(${formatBytes(p.bytes)})`);
  return parts.join(' ').trim();
}

/** `s` with control characters replaced by spaces, runs of white space collapsed to one, trimmed. */
function clean(s: string): string {
  return String(s).replace(CONTROL, ' ').replace(/\s+/g, ' ').trim();
}

/** Where a long operation reports progress; see the module comment. */
export interface ProgressView {
  /** Shows one progress event. */
  update(p: ImageProgress): void;
  /** Erases the status line (terminal mode); a no-op otherwise. Safe to call twice. */
  done(): void;
}

/** Options of {@link createProgressView}. */
export interface ProgressViewOptions {
  /** Rewrite one status line (a terminal) instead of printing a line per event. */
  tty: boolean;
  /** Terminal width in columns; default {@link DEFAULT_COLUMNS}. */
  columns?: number;
}

/** A {@link ProgressView} writing to `out` (stderr). */
export function createProgressView(out: OutStream, opts: ProgressViewOptions): ProgressView {
  if (!opts.tty) {
    return {
      update(p) {
        const line = formatProgress(p);
        if (line) out.write(line + '\n');
      },
      done() {},
    };
  }
  const width = Math.max(10, (opts.columns && opts.columns > 0 ? opts.columns : DEFAULT_COLUMNS) - 1);
  let shown = false;
  return {
    update(p) {
      const line = formatProgress(p);
      if (!line) return;
      const chars = [...line];
      const fitted = chars.length > width ? chars.slice(0, width - 1).join('') + '…' : line;
      out.write(CLEAR_LINE + fitted);
      shown = true;
    },
    done() {
      if (shown) out.write(CLEAR_LINE);
      shown = false;
    },
  };
}
