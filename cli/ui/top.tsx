/**
 * The live `dsec top` view (Ink), refreshed every interval: a host header with CPU and
 * memory meters, then one row per sandbox, the selected one highlighted, coloured by
 * state (running green, paused cyan, failed red) and by pressure (CPU, memory and disk
 * near their limits yellow, at them red; OOM kills red, refusals yellow). The keys are
 * those of ./top-keys.ts: select with ↑/↓, `s`/Enter a shell, `l` the log, `p`
 * pause/resume, `d` destroy (asks first), `c`/`m`/`a`/`i` sort, `/` filter, `q` quit.
 * Through a gateway the sample is the fleet's: a fleet line lists the hosts, the table
 * has a HOST column, and `h` drills into the selected sandbox's host (and back); the
 * header then shows that host's figures, else the fleet's sums.
 *
 * The arithmetic and text live in ./top-rows.ts and the keys in ./top-keys.ts (pure);
 * this file holds state, timers and drawing. A failed sample is shown in the view and
 * retried at the next tick (dsecd restarting does not end `top`).
 *
 * {@link renderTop} runs the view on the terminal's alternate screen (as htop does), so
 * quitting leaves the screen as it was before `top`; a shell or a log suspends the view
 * (Ink unmounted, the normal screen back) and `top` comes back where it was afterwards.
 */
import { Box, Text, render, useApp, useInput, useStdout } from 'ink';
import { useEffect, useRef, useState } from 'react';
import type { StatsResponse } from '../../sdk/index.js';
import { formatBytes } from '../util/output.js';
import { keysFromInk, reduceKey, selectedIndex, type TopEffect, type TopUiState } from './top-keys.js';
import {
  fleetHeader, fleetHosts, filteredHost, meter, meterPressure, pressureColor, renderFleetLine, renderTopHeader, renderTopRows, topCellColors, topCells, topColumns,
  type TopColor, type TopHost, type TopSort,
} from './top-rows.js';

/** Where the view gets its data; injected so tests drive it without a daemon. */
export interface TopSources {
  /** One GET /v1/stats sample. */
  sample(): Promise<StatsResponse>;
  /** The host header for one host's sample (systeminformation, else the sample's host block); a fleet sample's header comes from the sample itself. */
  host(s: StatsResponse): Promise<TopHost>;
}

/** A row action that needs the terminal: the view exits with it, {@link renderTop} runs it and comes back. */
export interface TopSuspend {
  kind: 'shell' | 'logs';
  id: string;
  /** The view's state, to come back to. */
  state: TopUiState;
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
  /** Colour states and pressure (off under NO_COLOR); the selection is shown inverse either way. */
  color?: boolean;
  /** State to start from (coming back from a shell or a log); overrides `sort` and `filter`. */
  initial?: TopUiState;
  /** A line to show first (how the last shell or log ended). */
  notice?: string;
  /**
   * Runs pause, resume or destroy of a sandbox and resolves with a line saying what was
   * done; a rejection's message is shown as an error. Without it those keys only say
   * that they are not available.
   */
  act?: (op: 'pause' | 'resume' | 'destroy', id: string) => Promise<string>;
}

/**
 * Lines around the table: the host header, the meters, the status line, a prompt or
 * notice, an error, the column heads and the `… more` line.
 */
const CHROME_LINES = 7;

/** One piece of a line with its own colour. */
interface Segment {
  text: string;
  color?: TopColor;
}

/**
 * The cells laid out in columns two spaces apart (the last column unpadded), each line
 * cut to `width` (an ellipsis marks the cut), as coloured segments.
 */
export function layoutSegments(head: readonly string[], body: string[][], colors: (TopColor | undefined)[][], width: number): Segment[][] {
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((r) => [...r[i]].length)));
  const line = (cells: readonly string[], cols: (TopColor | undefined)[]): Segment[] => {
    const segs: Segment[] = [];
    cells.forEach((c, i) => {
      if (i > 0) segs.push({ text: '  ' });
      segs.push({ text: i === cells.length - 1 ? c : c + ' '.repeat(widths[i] - [...c].length), color: cols[i] });
    });
    return cut(segs, width);
  };
  return [line(head, []), ...body.map((r, i) => line(r, colors[i] ?? []))];
}

/** `segs` cut to `width` characters, the last kept one ending in `…` when anything was cut. */
function cut(segs: Segment[], width: number): Segment[] {
  const total = segs.reduce((n, s) => n + [...s.text].length, 0);
  if (total <= width) return segs;
  const out: Segment[] = [];
  let room = Math.max(1, width - 1);
  for (const s of segs) {
    const chars = [...s.text];
    if (chars.length <= room) {
      out.push(s);
      room -= chars.length;
      continue;
    }
    out.push({ ...s, text: chars.slice(0, room).join('') });
    break;
  }
  out.push({ text: '…' });
  return out;
}

/** The CPU and memory meters of the header: `CPU [|||||   30%]  MEM [||||   4GiB/24GiB]`, split to fit `width`. */
function HostMeters(props: { host: TopHost; width: number; color: boolean }) {
  const { host, width } = props;
  const each = Math.max(14, Math.min(50, Math.floor((width - 12) / 2)));
  const cpu = host.cpuPercent === null ? null : host.cpuPercent / 100;
  const mem = host.memoryTotalBytes > 0 ? host.memoryUsedBytes / host.memoryTotalBytes : 0;
  const one = (label: string, fraction: number | null, text: string) => {
    const m = meter(fraction ?? 0, each, text);
    const c = props.color && fraction !== null ? (pressureColor(meterPressure(fraction)) ?? 'green') : undefined;
    return (
      <Text>
        <Text bold>{label}</Text>
        {' '}
        {m.open}
        <Text color={c}>{m.filled}</Text>
        {m.rest}
        {m.close}
      </Text>
    );
  };
  return (
    <Text>
      {one('CPU', cpu, cpu === null ? 'n/a' : `${host.cpuPercent!.toFixed(0)}%`)}
      {'  '}
      {one('MEM', mem, `${formatBytes(host.memoryUsedBytes)}/${formatBytes(host.memoryTotalBytes)}`)}
    </Text>
  );
}

/** The live view; see the file comment. */
export function TopView(props: TopViewProps) {
  const { exit } = useApp();
  const { stdout } = useStdout();
  const [samples, setSamples] = useState<{ prev?: StatsResponse; cur?: StatsResponse }>({});
  const [host, setHost] = useState<TopHost | undefined>();
  const [ui, setUiState] = useState<TopUiState>(props.initial ?? { sort: props.sort, filter: props.filter, editing: null, selected: null, confirm: null });
  // Keys can arrive faster than renders: the key handler reads and writes the state
  // through a ref, never through a possibly stale render's value.
  const uiRef = useRef(ui);
  const setUi = (s: TopUiState) => {
    uiRef.current = s;
    setUiState(s);
  };
  const [notice, setNotice] = useState<{ text: string; error: boolean } | null>(props.notice ? { text: props.notice, error: false } : null);
  const [error, setError] = useState<string | null>(null);
  // The rows as last drawn, which the keys act on.
  const shownRef = useRef<ReturnType<typeof renderTopRows>>([]);
  const pageRef = useRef(1);
  const busyRef = useRef(false);

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

  /** Carries out what a key asked for. */
  const perform = (effect: TopEffect) => {
    if (effect.kind === 'quit') return exit();
    if (effect.kind === 'notice') return setNotice({ text: effect.text, error: false });
    if (effect.kind === 'shell' || effect.kind === 'logs') {
      const suspend: TopSuspend = { kind: effect.kind, id: effect.id, state: { ...uiRef.current, editing: null, confirm: null } };
      return exit(suspend);
    }
    if (!props.act) return setNotice({ text: `${effect.kind} is not available here`, error: true });
    if (busyRef.current) return setNotice({ text: 'busy with the last action; try again when it is done', error: true });
    busyRef.current = true;
    setNotice({ text: `${effect.kind === 'destroy' ? 'destroying' : effect.kind === 'pause' ? 'pausing' : 'resuming'} ${effect.id.slice(0, 12)}…`, error: false });
    props.act(effect.kind, effect.id).then(
      (text) => setNotice({ text, error: false }),
      (e: unknown) => setNotice({ text: e instanceof Error ? e.message : String(e), error: true }),
    ).finally(() => {
      busyRef.current = false;
    });
  };

  useInput(
    (input, key) => {
      for (const k of keysFromInk(input, key)) {
        const before = uiRef.current;
        const { state, effect } = reduceKey(before, k, shownRef.current, pageRef.current);
        setUi(state);
        // Any key after a notice clears it, unless it makes a new one.
        if (notice && !effect) setNotice(null);
        if (effect) perform(effect);
        if (effect?.kind === 'quit' || effect?.kind === 'shell' || effect?.kind === 'logs') return;
      }
    },
    { isActive: props.keys },
  );

  const color = props.color ?? false;
  const width = Math.max(20, props.columns ?? stdout?.columns ?? 80);
  const rows = samples.cur ? renderTopRows(samples.prev, samples.cur, ui.sort, ui.filter) : [];
  const fleet = samples.cur ? fleetHosts(samples.cur) : null;
  const maxRows = Math.max(1, (props.rows ?? stdout?.rows ?? 24) - CHROME_LINES - (fleet ? 1 : 0));
  const sel = selectedIndex(ui, rows);
  // Scroll so the selected row is on screen.
  const offset = sel < maxRows ? 0 : sel - maxRows + 1;
  const visible = rows.slice(offset, offset + maxRows);
  shownRef.current = rows;
  pageRef.current = maxRows;
  const lines = layoutSegments(topColumns(fleet !== null), visible.map((r) => topCells(r, fleet !== null)), visible.map((r) => (color ? topCellColors(r, fleet !== null) : [])), width);
  // A fleet's header is the host filtered to, or the fleet's sums; one host's, props.host's.
  const head = fleet && samples.cur ? fleetHeader(samples.cur, ui.filter) : host ? { label: 'host', host } : undefined;
  const total = samples.cur?.sandboxes.length ?? 0;
  const help = props.keys ? `   ↑↓ select  [s]hell [l]ogs [p]ause/resume [d]estroy${fleet ? ' [h]ost' : ''}  [c]pu [m]em [a]ge [i]d  [/] filter  [q]uit` : '';
  const status = `sort: ${ui.sort}${ui.filter ? `  filter: ${ui.filter}` : ''}` + help;
  const below = rows.length - offset - visible.length;
  return (
    <Box flexDirection="column">
      <Text>{head ? renderTopHeader(head.host, total, rows.length, head.label) : 'host: sampling…'}</Text>
      {fleet ? <Text>{cutText(renderFleetLine(fleet, filteredHost(ui.filter)), width)}</Text> : null}
      {head ? <HostMeters host={head.host} width={width} color={color} /> : <Text> </Text>}
      <Text dimColor>{cutText(status, width)}</Text>
      {ui.editing !== null ? (
        <Text>filter (k=v or text, Enter applies, Esc clears): {ui.editing}_</Text>
      ) : ui.confirm !== null ? (
        <Text color={color ? 'red' : undefined} bold>destroy sandbox {ui.confirm} ({rows.find((r) => r.id === ui.confirm)?.state ?? 'gone'}), killing its processes? [y/N]</Text>
      ) : notice ? (
        <Text color={color && notice.error ? 'red' : undefined}>{cutText(notice.text, width)}</Text>
      ) : null}
      {error ? <Text color={color ? 'red' : undefined}>error: {error} (retrying)</Text> : null}
      <Text bold>{lines[0].map((s) => s.text).join('')}</Text>
      {lines.slice(1).map((segs, i) => (
        <Text key={visible[i].id} inverse={props.keys && offset + i === sel}>
          {segs.map((s, j) => (
            <Text key={j} color={s.color}>{s.text}</Text>
          ))}
        </Text>
      ))}
      {below > 0 ? <Text dimColor>… {below} more (↓ scrolls, / filters)</Text> : null}
    </Box>
  );
}

/** `s` cut to `width` characters (an ellipsis marks the cut). */
function cutText(s: string, width: number): string {
  const chars = [...s];
  return chars.length > width ? chars.slice(0, Math.max(1, width - 1)).join('') + '…' : s;
}

/** Enter the alternate screen buffer and move home (xterm's private mode 1049, as htop and less use). */
export const ENTER_ALT_SCREEN = '\x1b[?1049h\x1b[H';
/** Leave the alternate screen buffer: the screen as it was before comes back. */
export const LEAVE_ALT_SCREEN = '\x1b[?1049l';

/** Options of {@link renderTop}. */
export interface RenderTopOptions extends Omit<TopViewProps, 'columns' | 'rows' | 'initial' | 'notice'> {
  /** The terminal (the real process streams; Ink needs Node streams). */
  stdout: NodeJS.WriteStream;
  stdin: NodeJS.ReadStream;
  /** Resolves the view early (a SIGTERM): it is unmounted. */
  stop?: Promise<unknown>;
  /**
   * Runs a shell in (`shell`) or follows the log of (`logs`) a sandbox with the terminal
   * to itself (Ink is unmounted and the normal screen is back); resolves with a line to
   * show when the view comes back, or rejects with the error to show there.
   */
  suspend?: (kind: 'shell' | 'logs', id: string) => Promise<string | undefined>;
}

/**
 * Renders the live view on the alternate screen until `q`, Ctrl-C or `stop`; resolves
 * once Ink has unmounted and the screen is back as it was. A shell or a log
 * (`opts.suspend`) leaves the view and the alternate screen, and comes back to both with
 * the state it had (sort, filter, selection).
 */
export async function renderTop(opts: RenderTopOptions): Promise<void> {
  const { stdout, stdin, stop, suspend, ...view } = opts;
  let stopped = false;
  void stop?.then(() => {
    stopped = true;
  });
  let alt = false;
  const leave = () => {
    if (!alt) return;
    alt = false;
    process.off('exit', leave);
    stdout.write(LEAVE_ALT_SCREEN);
  };
  let initial: TopUiState | undefined;
  let notice: string | undefined;
  try {
    while (!stopped) {
      stdout.write(ENTER_ALT_SCREEN);
      alt = true;
      // A last resort: even an exit from elsewhere gives the screen back.
      process.on('exit', leave);
      // Coming back from a shell or a log, which paused stdin when done: a paused TTY
      // stream has stopped reading its fd, and Ink's 'readable' listener would wait forever.
      if (initial) stdin.resume();
      const app = render(<TopView {...view} initial={initial} notice={notice} />, { stdout, stdin, exitOnCtrlC: true, patchConsole: false });
      void stop?.then(() => app.unmount());
      const result = (await app.waitUntilExit()) as TopSuspend | undefined;
      leave();
      if (!result || stopped || !suspend) return;
      initial = result.state;
      try {
        notice = await suspend(result.kind, result.id);
      } catch (e) {
        notice = `${result.kind === 'shell' ? 'shell' : 'log'} of ${result.id.slice(0, 12)}: ${e instanceof Error ? e.message : String(e)}`;
      }
    }
  } finally {
    leave();
  }
}
