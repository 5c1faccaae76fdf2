/**
 * What `dsec cp` is made of: reading its two arguments, the byte counter and the
 * progress line (safe local extraction of a tar stream is cli/util/extract.ts).
 *
 * Arguments follow `docker cp`: `ID:PATH` names a path in a sandbox (PATH absolute), `-`
 * names a tar stream on stdin/stdout, anything else is local; a local path containing
 * `:` is written with a leading `./` or `/`. Exactly one side is in a sandbox.
 */
import { Transform } from 'node:stream';
import { formatProgressBytes } from '../ui/cp.js';
import { UserError } from './errors.js';
import type { OutStream } from './io.js';

/** One side of `dsec cp`. */
export type CpEndpoint =
  | { kind: 'local'; path: string }
  | { kind: 'stdio' }
  | { kind: 'sandbox'; id: string; path: string };

/** A parsed `dsec cp SRC DST`: `in` copies into the sandbox, `out` out of it. */
export type CpPlan =
  | { direction: 'in'; src: Extract<CpEndpoint, { kind: 'local' | 'stdio' }>; dst: Extract<CpEndpoint, { kind: 'sandbox' }> }
  | { direction: 'out'; src: Extract<CpEndpoint, { kind: 'sandbox' }>; dst: Extract<CpEndpoint, { kind: 'local' | 'stdio' }> };

const CP_HINT = 'write `dsec cp LOCAL ID:/path` or `dsec cp ID:/path LOCAL` (`-` for a tar stream on stdin/stdout)';

/** Reads one `dsec cp` argument; see the file comment. */
export function parseCpEndpoint(text: string): CpEndpoint {
  if (text === '') throw new UserError('empty path', CP_HINT);
  if (text === '-') return { kind: 'stdio' };
  if (text.startsWith('/') || text.startsWith('.')) return { kind: 'local', path: text };
  const colon = text.indexOf(':');
  if (colon < 0) return { kind: 'local', path: text };
  const id = text.slice(0, colon);
  const path = text.slice(colon + 1);
  if (id === '' || /[/\\]/.test(id)) return { kind: 'local', path: text };
  if (!path.startsWith('/')) {
    throw new UserError(`the path in sandbox ${id} must be absolute, got ${JSON.stringify(path)}`, `write ${id}:/${path.replace(/^\/*/, '')}; a local path with ':' is written ./${text}`);
  }
  return { kind: 'sandbox', id, path };
}

/** Reads `dsec cp SRC DST` into a plan; refuses two local or two sandbox sides, and `-` against `-`. */
export function parseCpArgs(srcText: string, dstText: string): CpPlan {
  const src = parseCpEndpoint(srcText);
  const dst = parseCpEndpoint(dstText);
  if (src.kind === 'sandbox' && dst.kind === 'sandbox') throw new UserError('copying between two sandboxes is not supported', 'copy to a local path first, or pipe: dsec cp A:/p - | dsec cp - B:/dir');
  if (src.kind === 'sandbox') return { direction: 'out', src, dst: dst as Extract<CpEndpoint, { kind: 'local' | 'stdio' }> };
  if (dst.kind === 'sandbox') return { direction: 'in', src, dst };
  throw new UserError('one side of cp must be in a sandbox (ID:/path)', CP_HINT);
}

/** The last path component, ignoring trailing slashes (`/a/b/` → `b`; `/` → `''`). */
export function baseName(p: string): string {
  const parts = p.split('/').filter(Boolean);
  return parts.length ? parts[parts.length - 1] : '';
}

/** The parent of a POSIX path, ignoring trailing slashes (`/a/b/` → `/a`; `/a` → `/`). */
export function parentDir(p: string): string {
  const parts = p.split('/').filter(Boolean);
  parts.pop();
  return '/' + parts.join('/');
}

/** True when a path asks for a directory's contents rather than the directory (`dir/.`, docker's rule). */
export function wantsContents(p: string): boolean {
  return p === '.' || p.endsWith('/.');
}

/** Counts the bytes passing through; reports them to `onBytes`. */
export function byteCounter(onBytes: (total: number) => void): Transform & { bytes(): number } {
  let total = 0;
  const t = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      total += chunk.length;
      onBytes(total);
      cb(null, chunk);
    },
  });
  return Object.assign(t, { bytes: () => total });
}

/** Shortest interval between two progress redraws, ms. */
const REDRAW_MS = 100;

/** Carriage return + ANSI "erase entire line". */
const CLEAR_LINE = '\r\x1b[2K';

/** Bytes-copied status line on stderr; only when stderr is a terminal, else silent. */
export interface ByteProgress {
  /** Shows `total` bytes copied (redrawn at most every 100 ms). */
  update(total: number): void;
  /** Erases the line. Safe to call twice. */
  done(): void;
}

/** A {@link ByteProgress} on `err` for a copy described by `what`, of `size` bytes when known. */
export function createByteProgress(err: OutStream, enabled: boolean, what: string, size?: number): ByteProgress {
  if (!enabled) return { update() {}, done() {} };
  let last = 0;
  let shown = false;
  return {
    update(total) {
      const now = Date.now();
      if (now - last < REDRAW_MS) return;
      last = now;
      err.write(CLEAR_LINE + formatProgressBytes(what, total, size, err.columns));
      shown = true;
    },
    done() {
      if (shown) err.write(CLEAR_LINE);
      shown = false;
    },
  };
}
