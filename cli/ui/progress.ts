/**
 * Progress of long image operations (`dsec image build`, `image import`,
 * `image bootstrap`) on stderr, and the spinner of slow creates (`create`, `run`,
 * `restore`, `fork`: {@link startSpinner}, a terminal's stderr only).
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

/** Frames of the spinner (braille dots, as npm and many CLIs draw it). */
export const SPINNER_FRAMES = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'] as const;

/** ms between spinner frames (and elapsed-time updates). */
export const SPINNER_INTERVAL_MS = 100;

/**
 * A spinner's status line (no newline): `⠹ creating a microvm sandbox: booting the guest
 * (waiting for its agent) 4.2s`, the part after the label only when there is one, cut to
 * `width` columns. Elapsed time in seconds with one decimal (tenths are what a person
 * watching can see move). Text from dsecd is cleaned of control characters.
 */
export function formatSpinnerLine(frame: number, label: string, detail: string | undefined, elapsedMs: number, width = DEFAULT_COLUMNS - 1): string {
  const time = `${(Math.max(0, elapsedMs) / 1000).toFixed(1)}s`;
  const head = `${SPINNER_FRAMES[frame % SPINNER_FRAMES.length]} ${label}${detail ? `: ${clean(detail)}` : ''}`;
  const chars = [...head];
  const room = Math.max(10, width - time.length - 1);
  return `${chars.length > room ? chars.slice(0, room - 1).join('') + '…' : head} ${time}`;
}

/** A running spinner; see {@link startSpinner}. */
export interface Spinner {
  /** Sets the text after the label (the phase); drawn at the next frame. */
  update(detail: string): void;
  /** Stops the spinner and erases its line. Safe to call twice. */
  done(): void;
}

/** Options of {@link startSpinner}. */
export interface SpinnerOptions {
  /** What is being waited for, e.g. `creating a microvm sandbox`. */
  label: string;
  /** Terminal width in columns; default {@link DEFAULT_COLUMNS}. */
  columns?: number;
  /** Draw nothing before this many ms have passed (a quick operation shows no flash); default 250. */
  delayMs?: number;
  /** The clock (ms); default `Date.now`. */
  now?: () => number;
}

/**
 * Draws a spinner with the elapsed time on `out` (a terminal's stderr), rewritten in
 * place every {@link SPINNER_INTERVAL_MS} from `delayMs` on, until {@link Spinner.done},
 * which erases it so what follows starts on a clean line. The timer does not keep the
 * process alive.
 */
export function startSpinner(out: OutStream, opts: SpinnerOptions): Spinner {
  const now = opts.now ?? Date.now;
  const t0 = now();
  const width = Math.max(20, (opts.columns && opts.columns > 0 ? opts.columns : DEFAULT_COLUMNS) - 1);
  let detail: string | undefined;
  let frame = 0;
  let shown = false;
  let stopped = false;
  const draw = () => {
    if (stopped) return;
    out.write(CLEAR_LINE + formatSpinnerLine(frame++, opts.label, detail, now() - t0, width));
    shown = true;
  };
  let timer: NodeJS.Timeout | undefined;
  const delay = setTimeout(() => {
    draw();
    timer = setInterval(draw, SPINNER_INTERVAL_MS);
    timer.unref?.();
  }, opts.delayMs ?? 250);
  delay.unref?.();
  return {
    update(d) {
      detail = d;
    },
    done() {
      if (stopped) return;
      stopped = true;
      clearTimeout(delay);
      if (timer) clearInterval(timer);
      if (shown) out.write(CLEAR_LINE);
    },
  };
}
