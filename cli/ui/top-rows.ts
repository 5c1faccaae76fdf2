/**
 * What `dsec top` shows, computed from two samples of GET /v1/stats. Pure: data in, rows
 * or text out, so the arithmetic, sorting and filtering are tested without a terminal.
 *
 * CPU% of a sandbox = (cpu_usage_ns now − cpu_usage_ns before) ÷ elapsed ÷ 1e9 × 100,
 * elapsed in seconds between the two samples' `time`: 100% is one core busy, so a
 * sandbox can show up to cores × 100%. Unknown (`-`) on the first sample, for a sandbox
 * that was not in the previous sample or not running, and when the counter went back
 * (the sandbox restarted).
 *
 * Against a gateway (issue 20's fleet) a sample is the fleet's: each sandbox names its
 * `host` and the sample lists every host with its outcome and host block
 * (gateway/fanout.ts mergeStats). Then the table has a HOST column, `host=NAME` filters
 * to one host, and the header speaks of the fleet or of the host filtered to
 * ({@link fleetHosts}, {@link renderFleetLine}).
 */
import type { SandboxStats, StatsResponse } from '../../sdk/index.js';
import { formatAge, formatBytes, formatLabels, makeTable, tableText } from '../util/output.js';

/** Sort orders of `dsec top`: CPU% (highest first), memory (largest first), age (newest first), id. */
export const TOP_SORTS = ['cpu', 'mem', 'age', 'id'] as const;
/** One of {@link TOP_SORTS}. */
export type TopSort = (typeof TOP_SORTS)[number];

/** Characters of a sandbox id shown by `top`. */
export const SHORT_ID = 12;

/** Column headers of the `top` table, in order (one host's sample; a fleet's adds HOST, {@link topColumns}). */
export const TOP_COLUMNS = ['ID', 'STATE', 'CPU%', 'MEM', 'LIMIT', 'PIDS', 'DISK', 'OOM', 'DENIED', 'IDLE/RECL', 'AGE', 'LABELS'] as const;

/** Column headers for a sample of one host (`fleet` false) or of a fleet (HOST after STATE). */
export function topColumns(fleet: boolean): readonly string[] {
  return fleet ? [...TOP_COLUMNS.slice(0, 2), 'HOST', ...TOP_COLUMNS.slice(2)] : TOP_COLUMNS;
}

/** A host of a fleet sample, as a gateway's GET /v1/stats lists it. */
export interface FleetHost {
  name: string;
  /** `ok`: the host answered; `down`: its lease lapsed (not asked); `error`: it failed to answer. */
  outcome: 'ok' | 'down' | 'error';
  /** Sandboxes it reported in this sample. */
  sandboxes: number;
  /** Its own host block (cores, memory bytes, load averages); absent unless `ok`. */
  host?: StatsResponse['host'];
  error?: { code: string; message: string };
}

/** The hosts of a fleet sample (a gateway's), or null for one host's sample (dsecd's own). */
export function fleetHosts(s: StatsResponse): FleetHost[] | null {
  const hosts = (s as { hosts?: unknown }).hosts;
  return Array.isArray(hosts) ? (hosts as FleetHost[]) : null;
}

/** The host a `host=NAME` filter names, or null when the filter is something else. */
export function filteredHost(filter: string): string | null {
  const m = /^\s*host\s*=\s*(\S+)\s*$/.exec(filter);
  return m ? m[1] : null;
}

/**
 * The fleet line of the header: every host with its state and sandbox count, the one
 * filtered to marked: `fleet: 3 hosts · h1 up 4 · [h2 up 5] · h3 down`.
 */
export function renderFleetLine(hosts: FleetHost[], selected: string | null): string {
  const part = (h: FleetHost) => {
    const t = h.outcome === 'ok' ? `${h.name} up ${h.sandboxes}` : `${h.name} ${h.outcome}`;
    return h.name === selected ? `[${t}]` : t;
  };
  return [`fleet: ${hosts.length} host${hosts.length === 1 ? '' : 's'}`, ...hosts.map(part)].join(' · ');
}

/**
 * The header figures of a fleet sample: those of the host `host=NAME` filters to (when it
 * answered), else the fleet's sums (cores and memory added, load averages added).
 * Returns the label for {@link renderTopHeader} with them.
 */
export function fleetHeader(s: StatsResponse, filter: string): { label: string; host: TopHost } {
  const name = filteredHost(filter);
  const one = name === null ? undefined : fleetHosts(s)?.find((h) => h.name === name && h.host);
  if (one?.host) return { label: `host ${one.name}`, host: hostFromStats({ ...s, host: one.host }) };
  return { label: 'fleet', host: hostFromStats(s) };
}

/** One sandbox as `top` shows it. */
export interface TopRow {
  /** Full sandbox id. */
  id: string;
  state: string;
  /** The host it runs on, in a fleet sample; null in one host's sample. */
  host: string | null;
  image: string;
  labels: Record<string, string>;
  /** CPU use since the previous sample, percent of one core; null when unknown. */
  cpuPercent: number | null;
  /** Memory charged, bytes; null when not running. */
  memoryBytes: number | null;
  /** Memory limit, bytes; null when none or not running. */
  memoryLimitBytes: number | null;
  pids: number | null;
  /** Writable-layer use, bytes; null where the store cannot tell (host filesystem). */
  diskUsedBytes: number | null;
  /** Writable-layer quota, bytes; null when none. */
  diskLimitBytes: number | null;
  /** OOM kills in the sandbox's cgroup (memory.events oom_kill); null when not running. */
  oomKills: number | null;
  /**
   * Attempts the defences refused: seccomp denials + egress denials (connect, sendmsg,
   * socket, DNS) + forks refused at the pids limit; null when none of them is counted.
   */
  denials: number | null;
  /** ms the sandbox has been idle at the sample's time (host reclaim's view: no exec, CPU under its threshold); null: busy or not judged. */
  idleMs: number | null;
  /** Bytes the host's reclaim took back from it since dsecd started; null when dsecd does not say. */
  reclaimedBytes: number | null;
  /** ms since the sandbox was created, at the sample's time. */
  ageMs: number;
  /** CPU limit, cores; null when dsecd did not say (an older dsecd). */
  cpuLimit: number | null;
}

/** CPU% of `cur` against `prev` (the same sandbox one sample earlier); null when it cannot be known. */
export function cpuPercent(prev: Pick<SandboxStats, 'cpu_usage_ns'> | undefined, cur: Pick<SandboxStats, 'cpu_usage_ns'>, elapsedMs: number): number | null {
  if (!prev || prev.cpu_usage_ns === null || cur.cpu_usage_ns === null || !(elapsedMs > 0)) return null;
  const delta = cur.cpu_usage_ns - prev.cpu_usage_ns;
  if (delta < 0) return null;
  return (delta / (elapsedMs / 1000) / 1e9) * 100;
}

/**
 * Whether a sandbox matches a `top` filter: empty matches all; `k=v` matches label k
 * equal to v, or (when the sandbox has no label k) the field `state`, `image` or `id`
 * (a prefix) or `host` (in a fleet sample) equal to v; anything else is a case-insensitive substring of the id, state,
 * image or `k=v` labels.
 */
export function matchesFilter(s: Pick<SandboxStats, 'id' | 'state' | 'image' | 'labels'> & { host?: string }, filter: string): boolean {
  const f = filter.trim();
  if (f === '') return true;
  const eq = f.indexOf('=');
  if (eq > 0) {
    const k = f.slice(0, eq).trim();
    const v = f.slice(eq + 1).trim();
    if (Object.prototype.hasOwnProperty.call(s.labels, k)) return s.labels[k] === v;
    if (k === 'state') return s.state === v;
    if (k === 'image') return s.image === v;
    if (k === 'id') return s.id.startsWith(v);
    if (k === 'host') return s.host === v;
    return false;
  }
  const needle = f.toLowerCase();
  return [s.id, s.state, s.image, formatLabels(s.labels), s.host ?? ''].some((x) => x.toLowerCase().includes(needle));
}

/** `a` before `b` under `sort`; unknown values last, ties broken by id. */
function compare(a: TopRow, b: TopRow, sort: TopSort): number {
  const desc = (x: number | null, y: number | null) => (x === y ? 0 : x === null ? 1 : y === null ? -1 : y - x);
  let c = 0;
  if (sort === 'cpu') c = desc(a.cpuPercent, b.cpuPercent);
  else if (sort === 'mem') c = desc(a.memoryBytes, b.memoryBytes);
  else if (sort === 'age') c = a.ageMs - b.ageMs;
  return c !== 0 ? c : a.id.localeCompare(b.id);
}

/**
 * The rows of `cur` (CPU% against `prev`, when given), those matching `filter` (see
 * {@link matchesFilter}), in `sort` order.
 */
export function renderTopRows(prev: StatsResponse | undefined, cur: StatsResponse, sort: TopSort, filter = ''): TopRow[] {
  const before = new Map((prev?.sandboxes ?? []).map((s) => [s.id, s]));
  const elapsedMs = prev ? cur.time - prev.time : 0;
  const rows: TopRow[] = [];
  for (const s of cur.sandboxes as Array<SandboxStats & { host?: string }>) {
    if (!matchesFilter(s, filter)) continue;
    rows.push({
      id: s.id,
      state: s.state,
      host: typeof s.host === 'string' ? s.host : null,
      image: s.image,
      labels: s.labels,
      cpuPercent: s.state === 'running' ? cpuPercent(before.get(s.id), s, elapsedMs) : null,
      memoryBytes: s.memory_bytes,
      memoryLimitBytes: s.memory_limit_bytes,
      pids: s.pids,
      diskUsedBytes: s.disk_used_bytes ?? null,
      diskLimitBytes: s.disk_limit_bytes ?? null,
      oomKills: s.oom_kills,
      denials: denialCount(s),
      idleMs: s.idle_since === null || s.idle_since === undefined ? null : Math.max(0, cur.time - s.idle_since),
      reclaimedBytes: s.reclaimed_bytes ?? null,
      ageMs: Math.max(0, cur.time - s.created_at),
      cpuLimit: typeof s.cpus === 'number' && s.cpus > 0 ? s.cpus : null,
    });
  }
  return rows.sort((a, b) => compare(a, b, sort));
}

/** The sum of a sandbox's refusal counters (see {@link TopRow.denials}); null when none is counted. */
export function denialCount(s: Pick<SandboxStats, 'seccomp_denials' | 'network_denied' | 'pids_limit_hits'>): number | null {
  const parts: number[] = [];
  if (s.seccomp_denials) parts.push(s.seccomp_denials.total);
  if (s.network_denied) parts.push(s.network_denied.connect + s.network_denied.sendmsg + s.network_denied.sock_create + s.network_denied.dns_refused);
  if (s.pids_limit_hits !== null && s.pids_limit_hits !== undefined) parts.push(s.pids_limit_hits);
  return parts.length ? parts.reduce((a, b) => a + b, 0) : null;
}

/** The DISK cell: `used/quota` (`12MiB/64MiB`), `used` without a quota, `-` when unknown. */
export function diskCell(r: Pick<TopRow, 'diskUsedBytes' | 'diskLimitBytes'>): string {
  if (r.diskUsedBytes === null) return '-';
  return r.diskLimitBytes === null ? formatBytes(r.diskUsedBytes) : `${formatBytes(r.diskUsedBytes)}/${formatBytes(r.diskLimitBytes)}`;
}

/** The IDLE/RECL cell: how long idle / bytes the host's reclaim took (`5m/40MiB`), `-` for an unknown part, `-` alone when both are. */
export function idleCell(r: Pick<TopRow, 'idleMs' | 'reclaimedBytes'>): string {
  if (r.idleMs === null && !r.reclaimedBytes) return '-';
  return `${r.idleMs === null ? '-' : formatAge(r.idleMs)}/${r.reclaimedBytes === null ? '-' : formatBytes(r.reclaimedBytes)}`;
}

/** A row's cells, in {@link topColumns} order (HOST only when `fleet`). */
export function topCells(r: TopRow, fleet = false): string[] {
  const opt = (n: number | null, f: (n: number) => string) => (n === null ? '-' : f(n));
  return [
    r.id.slice(0, SHORT_ID),
    r.state,
    ...(fleet ? [r.host ?? '-'] : []),
    opt(r.cpuPercent, (n) => n.toFixed(1)),
    opt(r.memoryBytes, formatBytes),
    opt(r.memoryLimitBytes, formatBytes),
    opt(r.pids, String),
    diskCell(r),
    opt(r.oomKills, String),
    opt(r.denials, String),
    idleCell(r),
    formatAge(r.ageMs),
    formatLabels(r.labels),
  ];
}

/** The host line of `top`'s header. */
export interface TopHost {
  cores: number;
  /** Host CPU busy, percent of all cores; null when unknown. */
  cpuPercent: number | null;
  memoryUsedBytes: number;
  memoryTotalBytes: number;
  loadAvg: number[];
}

/**
 * The header line: `host: 2 cores, cpu 12%, mem 3.1GiB / 24GiB, load 0.52 0.40 0.33; 5 sandboxes`;
 * `label` replaces `host` (`fleet`, `host h2`: {@link fleetHeader}).
 */
export function renderTopHeader(h: TopHost, sandboxes: number, shown: number, label = 'host'): string {
  const cpu = h.cpuPercent === null ? '' : `, cpu ${h.cpuPercent.toFixed(0)}%`;
  const load = h.loadAvg.slice(0, 3).map((l) => l.toFixed(2)).join(' ');
  const count = shown === sandboxes ? `${sandboxes} sandboxes` : `${shown} of ${sandboxes} sandboxes`;
  return `${label}: ${h.cores} cores${cpu}, mem ${formatBytes(h.memoryUsedBytes)} / ${formatBytes(h.memoryTotalBytes)}, load ${load}; ${count}`;
}

/** The host block of a stats sample as a {@link TopHost} (the fallback when systeminformation fails). */
export function hostFromStats(s: StatsResponse): TopHost {
  return {
    cores: s.host.cores,
    cpuPercent: null,
    memoryUsedBytes: Math.max(0, s.host.memory_bytes - s.host.memory_available_bytes),
    memoryTotalBytes: s.host.memory_bytes,
    loadAvg: s.host.load_avg,
  };
}

/** The plain table of `top --once` (and of a non-terminal stdout): header first even when empty; HOST with `fleet`. */
export function renderTopTable(rows: TopRow[], opts: { color?: boolean; fleet?: boolean } = {}): string {
  const t = makeTable([...topColumns(opts.fleet ?? false)], { color: opts.color ?? false });
  for (const r of rows) t.push(topCells(r, opts.fleet ?? false));
  return tableText(t);
}

/** A row as `top --json` prints it: the full id and raw numbers (CPU% rounded to 0.1); `host` in a fleet sample. */
export function topRowJson(r: TopRow): Record<string, unknown> {
  return {
    id: r.id,
    state: r.state,
    ...(r.host !== null ? { host: r.host } : {}),
    image: r.image,
    labels: r.labels,
    cpu_percent: r.cpuPercent === null ? null : Math.round(r.cpuPercent * 10) / 10,
    memory_bytes: r.memoryBytes,
    memory_limit_bytes: r.memoryLimitBytes,
    pids: r.pids,
    disk_used_bytes: r.diskUsedBytes,
    disk_limit_bytes: r.diskLimitBytes,
    idle_ms: r.idleMs,
    reclaimed_bytes: r.reclaimedBytes,
    age_ms: r.ageMs,
  };
}

/**
 * How close a sandbox is to a limit, for colour: `high` from 70% of it, `critical` from
 * 90% (the thresholds htop's meters and k9s's columns turn yellow and red near), `ok`
 * below, `null` when it cannot be told (no value or no limit).
 */
export type Pressure = 'ok' | 'high' | 'critical' | null;

/** {@link Pressure} of `used` against `limit`. */
export function pressure(used: number | null, limit: number | null): Pressure {
  if (used === null || limit === null || !(limit > 0)) return null;
  const f = used / limit;
  return f >= 0.9 ? 'critical' : f >= 0.7 ? 'high' : 'ok';
}

/** Pressure of a row's CPU (CPU% against its limit × 100), memory and disk (use against quota). */
export function rowPressure(r: TopRow): { cpu: Pressure; mem: Pressure; disk: Pressure } {
  return {
    cpu: pressure(r.cpuPercent, r.cpuLimit === null ? null : r.cpuLimit * 100),
    mem: pressure(r.memoryBytes, r.memoryLimitBytes),
    disk: pressure(r.diskUsedBytes, r.diskLimitBytes),
  };
}

/** Terminal colour names (as Ink's `color` takes them) used by the live view. */
export type TopColor = 'green' | 'yellow' | 'red' | 'cyan' | 'blue' | 'gray' | 'magenta';

/** Colour of a sandbox state: running green, paused cyan, creating blue, stopped gray, failed red. */
export function stateColor(state: string): TopColor | undefined {
  switch (state) {
    case 'running': return 'green';
    case 'paused': return 'cyan';
    case 'creating': return 'blue';
    case 'stopped': return 'gray';
    case 'failed': return 'red';
    default: return undefined;
  }
}

/** Colour of a pressure: high yellow, critical red, otherwise none. */
export function pressureColor(p: Pressure): TopColor | undefined {
  return p === 'critical' ? 'red' : p === 'high' ? 'yellow' : undefined;
}

/**
 * Colours of a row's cells, in {@link topColumns} order (undefined: the terminal's own):
 * STATE by state; CPU%, MEM and DISK by pressure; OOM red when the OOM killer struck;
 * DENIED yellow when a defence refused something.
 */
export function topCellColors(r: TopRow, fleet = false): (TopColor | undefined)[] {
  const p = rowPressure(r);
  return [
    undefined,
    stateColor(r.state),
    ...(fleet ? [undefined] : []),
    pressureColor(p.cpu),
    pressureColor(p.mem),
    undefined,
    undefined,
    pressureColor(p.disk),
    r.oomKills ? 'red' : undefined,
    r.denials ? 'yellow' : undefined,
    undefined,
    undefined,
    undefined,
  ];
}

/**
 * A meter as htop draws one: `[|||||||       35%]`, `width` characters in all, the bar
 * filled in proportion to `fraction` (clamped to 0..1) and `text` right-aligned inside it
 * (over the bar where they meet). Returns the bar's parts, for colouring: the brackets
 * and unfilled part in `rest`, the filled part in `filled`.
 */
export function meter(fraction: number, width: number, text: string): { open: string; filled: string; rest: string; close: string } {
  const inner = Math.max(text.length + 1, width - 2);
  const f = Number.isFinite(fraction) ? Math.min(1, Math.max(0, fraction)) : 0;
  const chars: string[] = Array.from({ length: inner }, (_, i) => (i < Math.round(f * inner) ? '|' : ' '));
  for (let i = 0; i < text.length; i++) chars[inner - text.length + i] = text[i];
  const n = Math.round(f * inner);
  return { open: '[', filled: chars.slice(0, n).join(''), rest: chars.slice(n).join(''), close: ']' };
}

/** The pressure of a host meter's fraction (same thresholds as a sandbox's). */
export function meterPressure(fraction: number): Pressure {
  return pressure(fraction, 1);
}
