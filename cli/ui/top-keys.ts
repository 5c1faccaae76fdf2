/**
 * The keys of the live `dsec top` view, as a pure reducer: the view's state and one key
 * in, the next state and what to do out. Kept apart from the Ink component so every key
 * path is tested without a terminal.
 *
 * Keys (htop's and k9s's where they have one):
 * - ↑/↓ or k/j move the selection, PgUp/PgDn a page, Home/End (g/G) to the ends;
 * - `s` or Enter: a shell in the selected sandbox (`sh` under a PTY; exit it to come back);
 * - `l`: its log, followed (q, Esc or ^C comes back);
 * - `p`: pause it (running) or resume it (paused);
 * - `d`: destroy it, after a `y` to the question asked (any other key keeps it);
 * - `h` (a fleet, through a gateway): show only the selected sandbox's host (the filter
 *   `host=NAME`); `h` again shows the whole fleet;
 * - `c`/`m`/`a`/`i`: sort by CPU, memory, age, id;
 * - `/`: type a filter (`k=v` or text), Enter applies, Esc clears; Esc alone clears it too;
 * - `q` (or Ctrl-C, which Ink handles): quit.
 *
 * Input arrives from Ink one read at a time: a paste, or keys typed faster than the
 * terminal is read, is one string (`/job=a` + Enter). {@link keysFromInk} splits such a
 * string into its keys, so a pasted filter applies as if typed.
 */
import { filteredHost, type TopRow, type TopSort } from './top-rows.js';

/** One key, as the reducer sees it. */
export type TopKey =
  | { name: 'char'; ch: string }
  | { name: 'return' | 'escape' | 'backspace' | 'up' | 'down' | 'pageup' | 'pagedown' | 'home' | 'end' };

/** The flags Ink's `useInput` passes with each input (the subset used here). */
export interface InkKey {
  upArrow?: boolean;
  downArrow?: boolean;
  pageUp?: boolean;
  pageDown?: boolean;
  home?: boolean;
  end?: boolean;
  return?: boolean;
  escape?: boolean;
  backspace?: boolean;
  delete?: boolean;
  ctrl?: boolean;
  meta?: boolean;
  tab?: boolean;
}

/**
 * The keys in one Ink input: a named key (arrows, Enter, Esc, Backspace) as itself; a
 * string of several characters (a paste) as one key per character, `\r`/`\n` as Enter,
 * DEL/BS as Backspace, ESC as Escape; other control characters and Ctrl/Meta
 * combinations are dropped (Ctrl-C is Ink's).
 */
export function keysFromInk(input: string, key: InkKey): TopKey[] {
  if (key.upArrow) return [{ name: 'up' }];
  if (key.downArrow) return [{ name: 'down' }];
  if (key.pageUp) return [{ name: 'pageup' }];
  if (key.pageDown) return [{ name: 'pagedown' }];
  if (key.home) return [{ name: 'home' }];
  if (key.end) return [{ name: 'end' }];
  if (key.return) return [{ name: 'return' }];
  if (key.escape && !input) return [{ name: 'escape' }];
  if (key.backspace || key.delete) return [{ name: 'backspace' }];
  if (key.ctrl || key.tab) return [];
  const out: TopKey[] = [];
  for (const ch of input) {
    if (ch === '\r' || ch === '\n') out.push({ name: 'return' });
    else if (ch === '\x7f' || ch === '\b') out.push({ name: 'backspace' });
    else if (ch === '\x1b') out.push({ name: 'escape' });
    else if (ch >= ' ') out.push({ name: 'char', ch });
  }
  return out;
}

/** What the view shows and edits; carried over while `top` is suspended for a shell or a log. */
export interface TopUiState {
  sort: TopSort;
  /** The filter in force (`k=v` or text; empty for none). */
  filter: string;
  /** The filter being typed, or null when not typing one. */
  editing: string | null;
  /** Id of the selected sandbox; null: the first row. */
  selected: string | null;
  /** Id of the sandbox whose destroy awaits a `y`, or null. */
  confirm: string | null;
}

/** What a key asks the view to do beyond changing its state. */
export type TopEffect =
  | { kind: 'quit' }
  | { kind: 'shell' | 'logs' | 'pause' | 'resume' | 'destroy'; id: string }
  | { kind: 'notice'; text: string };

/** Keys of the sort orders. */
const SORT_KEYS: Record<string, TopSort> = { c: 'cpu', m: 'mem', a: 'age', i: 'id' };

/** Index of the selected row in `rows` (the first when the selected one is gone), -1 when there are none. */
export function selectedIndex(s: Pick<TopUiState, 'selected'>, rows: Pick<TopRow, 'id'>[]): number {
  if (rows.length === 0) return -1;
  const i = s.selected === null ? -1 : rows.findIndex((r) => r.id === s.selected);
  return i < 0 ? 0 : i;
}

/**
 * The next state after key `k`, with the rows on screen (`rows`, filtered and sorted as
 * shown) and `page` rows per screen; `effect` when the key asks for more (see the module
 * comment). A key the current mode does not use changes nothing.
 */
export function reduceKey(s: TopUiState, k: TopKey, rows: Array<Pick<TopRow, 'id' | 'state'> & { host?: string | null }>, page: number): { state: TopUiState; effect?: TopEffect } {
  if (s.editing !== null) {
    if (k.name === 'return') return { state: { ...s, filter: s.editing.trim(), editing: null, selected: null } };
    if (k.name === 'escape') return { state: { ...s, filter: '', editing: null } };
    if (k.name === 'backspace') return { state: { ...s, editing: [...s.editing].slice(0, -1).join('') } };
    if (k.name === 'char') return { state: { ...s, editing: s.editing + k.ch } };
    return { state: s };
  }
  if (s.confirm !== null) {
    const id = s.confirm;
    if (k.name === 'char' && (k.ch === 'y' || k.ch === 'Y')) return { state: { ...s, confirm: null }, effect: { kind: 'destroy', id } };
    return { state: { ...s, confirm: null }, effect: { kind: 'notice', text: `kept ${id.slice(0, 12)}` } };
  }
  const i = selectedIndex(s, rows);
  const sel = i >= 0 ? rows[i] : undefined;
  const move = (to: number) => ({ state: { ...s, selected: rows.length ? rows[Math.max(0, Math.min(rows.length - 1, to))].id : null } });
  switch (k.name) {
    case 'up': return move(i - 1);
    case 'down': return move(i + 1);
    case 'pageup': return move(i - Math.max(1, page));
    case 'pagedown': return move(i + Math.max(1, page));
    case 'home': return move(0);
    case 'end': return move(rows.length - 1);
    case 'escape': return { state: { ...s, filter: '' } };
    case 'return': return sel ? { state: s, effect: { kind: 'shell', id: sel.id } } : { state: s };
    case 'backspace': return { state: s };
  }
  const ch = k.ch;
  if (ch === 'q') return { state: s, effect: { kind: 'quit' } };
  if (ch === '/') return { state: { ...s, editing: '' } };
  if (SORT_KEYS[ch]) return { state: { ...s, sort: SORT_KEYS[ch] } };
  if (ch === 'k') return move(i - 1);
  if (ch === 'j') return move(i + 1);
  if (ch === 'g') return move(0);
  if (ch === 'G') return move(rows.length - 1);
  if (!sel) return { state: s };
  if (ch === 's') return { state: s, effect: { kind: 'shell', id: sel.id } };
  if (ch === 'l') return { state: s, effect: { kind: 'logs', id: sel.id } };
  if (ch === 'd') return { state: { ...s, confirm: sel.id } };
  if (ch === 'h') {
    if (!sel.host) return { state: s, effect: { kind: 'notice', text: 'h drills into a host of a fleet: this is one host (dsecd, not a gateway)' } };
    return filteredHost(s.filter) === sel.host ? { state: { ...s, filter: '' } } : { state: { ...s, filter: `host=${sel.host}`, selected: sel.id } };
  }
  if (ch === 'p') {
    if (sel.state === 'running') return { state: s, effect: { kind: 'pause', id: sel.id } };
    if (sel.state === 'paused') return { state: s, effect: { kind: 'resume', id: sel.id } };
    return { state: s, effect: { kind: 'notice', text: `${sel.id.slice(0, 12)} is ${sel.state}: only a running sandbox can be paused, a paused one resumed` } };
  }
  return { state: s };
}
