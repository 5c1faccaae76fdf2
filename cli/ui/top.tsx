/**
 * The live `dsec top` view (Ink): a host header, then one row per sandbox, refreshed
 * every interval. Keys: `c`/`m`/`a`/`i` sort by CPU, memory, age, id; `/` starts a filter
 * (`k=v` or text; Enter applies, Esc clears); Esc clears the filter; `q` or Ctrl-C quits.
 *
 * The arithmetic and text live in ./top-rows.ts (pure); this file only holds state,
 * timers and keys. A failed sample is shown in the view and retried at the next tick
 * (dsecd restarting does not end `top`).
 */
import { Box, Text, render, useApp, useInput, useStdout } from 'ink';
import { useEffect, useRef, useState } from 'react';
import type { StatsResponse } from '../../sdk/index.js';
import { TOP_COLUMNS, renderTopHeader, renderTopRows, topCells, type TopHost, type TopSort } from './top-rows.js';

/** Where the view gets its data; injected so tests drive it without a daemon. */
export interface TopSources {
  /** One GET /v1/stats sample. */
  sample(): Promise<StatsResponse>;
  /** The host header for a sample (systeminformation, else the sample's host block). */
  host(s: StatsResponse): Promise<TopHost>;
}

/** Props of {@link TopView}. */
export interface TopViewProps extends TopSources {
  /** ms between samples. */
  intervalMs: number;
  /** Initial sort order. */
  sort: TopSort;
  /** Initial filter (`k=v` or text; empty for none). */
  filter: string;
  /** Handle keys (stdin is a terminal); without it only Ctrl-C / a signal ends the view. */
  keys: boolean;
  /** Terminal width and height (default: the Ink stdout's, read at each render, so a resize applies); rows beyond the height are cut. */
  columns?: number;
  rows?: number;
}

/** Keys of the sort orders. */
const SORT_KEYS: Record<string, TopSort> = { c: 'cpu', m: 'mem', a: 'age', i: 'id' };

/** Lines above and below the table (header, status, filter prompt, error, column heads). */
const CHROME_LINES = 5;

/** Cells padded into columns two spaces apart (last column unpadded), each line cut to `width`. */
function layout(head: readonly string[], body: string[][], width: number): string[] {
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((r) => [...r[i]].length)));
  const line = (cells: readonly string[]) => {
    const s = cells.map((c, i) => (i === cells.length - 1 ? c : c + ' '.repeat(widths[i] - [...c].length))).join('  ');
    const chars = [...s];
    return chars.length > width ? chars.slice(0, Math.max(1, width - 1)).join('') + '…' : s;
  };
  return [line(head), ...body.map(line)];
}

/** The live view; see the file comment. */
export function TopView(props: TopViewProps) {
  const { exit } = useApp();
  const { stdout } = useStdout();
  const [samples, setSamples] = useState<{ prev?: StatsResponse; cur?: StatsResponse }>({});
  const [host, setHost] = useState<TopHost | undefined>();
  const [sort, setSort] = useState<TopSort>(props.sort);
  const [filter, setFilter] = useState(props.filter);
  const [editing, setEditingState] = useState<string | null>(null);
  // Keys can arrive faster than renders: the key handler reads and writes the filter
  // being typed through a ref, never through a possibly stale render's value.
  const editingRef = useRef<string | null>(null);
  const setEditing = (v: string | null) => {
    editingRef.current = v;
    setEditingState(v);
  };
  const [error, setError] = useState<string | null>(null);

  useEffect(() => {
    let stopped = false;
    let timer: NodeJS.Timeout | undefined;
    const tick = async () => {
      try {
        const s = await props.sample();
        if (stopped) return;
        setSamples((p) => ({ prev: p.cur, cur: s }));
        setError(null);
        const h = await props.host(s);
        if (!stopped) setHost(h);
      } catch (e) {
        if (!stopped) setError(e instanceof Error ? e.message : String(e));
      }
      if (!stopped) timer = setTimeout(() => void tick(), props.intervalMs);
    };
    void tick();
    return () => {
      stopped = true;
      if (timer) clearTimeout(timer);
    };
  }, []);

  useInput(
    (input, key) => {
      const typed = editingRef.current;
      if (typed !== null) {
        if (key.return) {
          setFilter(typed.trim());
          setEditing(null);
        } else if (key.escape) {
          setFilter('');
          setEditing(null);
        } else if (key.backspace || key.delete) {
          setEditing(typed.slice(0, -1));
        } else if (input && !key.ctrl && !key.meta) {
          setEditing(typed + input);
        }
        return;
      }
      if (input === 'q') exit();
      else if (input === '/') setEditing('');
      else if (key.escape) setFilter('');
      else if (SORT_KEYS[input]) setSort(SORT_KEYS[input]);
    },
    { isActive: props.keys },
  );

  const width = Math.max(20, props.columns ?? stdout?.columns ?? 80);
  const rows = samples.cur ? renderTopRows(samples.prev, samples.cur, sort, filter) : [];
  const maxRows = Math.max(1, (props.rows ?? stdout?.rows ?? 24) - CHROME_LINES);
  const lines = layout(TOP_COLUMNS, rows.slice(0, maxRows).map(topCells), width);
  const total = samples.cur?.sandboxes.length ?? 0;
  const status = `sort: ${sort}${filter ? `  filter: ${filter}` : ''}` + (props.keys ? '   [c]pu [m]em [a]ge [i]d  [/] filter  [q]uit' : '');
  return (
    <Box flexDirection="column">
      <Text>{host ? renderTopHeader(host, total, rows.length) : 'host: sampling…'}</Text>
      <Text dimColor>{status}</Text>
      {editing !== null ? <Text>filter (k=v or text, Enter applies, Esc clears): {editing}_</Text> : null}
      {error ? <Text color="red">error: {error} (retrying)</Text> : null}
      <Text bold>{lines[0]}</Text>
      {lines.slice(1).map((l, i) => (
        <Text key={rows[i].id}>{l}</Text>
      ))}
      {rows.length > maxRows ? <Text dimColor>… {rows.length - maxRows} more (filter with /)</Text> : null}
    </Box>
  );
}

/** Options of {@link renderTop}. */
export interface RenderTopOptions extends Omit<TopViewProps, 'columns' | 'rows'> {
  /** The terminal (the real process streams; Ink needs Node streams). */
  stdout: NodeJS.WriteStream;
  stdin: NodeJS.ReadStream;
  /** Resolves the view early (a SIGTERM): it is unmounted. */
  stop?: Promise<unknown>;
}

/**
 * Renders the live view until `q`, Ctrl-C or `stop`; resolves once Ink has unmounted
 * (the terminal is back in its previous mode).
 */
export async function renderTop(opts: RenderTopOptions): Promise<void> {
  const { stdout, stdin, stop, ...view } = opts;
  const app = render(<TopView {...view} />, { stdout, stdin, exitOnCtrlC: true, patchConsole: false });
  void stop?.then(() => app.unmount());
  await app.waitUntilExit();
}
