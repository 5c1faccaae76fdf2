// `dsec top`: the pure row computation (CPU% from counter deltas, sorting, filtering),
// the Ink view driven by ink-testing-library (header, rows, keys), and the plain
// snapshot a non-terminal stdout gets, against the fake dsecd.
import { render } from 'ink-testing-library';
import { createElement } from 'react';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { TopView } from '../../cli/ui/top.js';
import { keysFromInk, reduceKey, type TopUiState } from '../../cli/ui/top-keys.js';
import {
  cpuPercent, denialCount, diskCell, fleetHeader, fleetHosts, hostFromStats, idleCell, matchesFilter, meter, pressure, renderFleetLine, renderTopHeader, renderTopRows, renderTopTable, stateColor,
  topCellColors, type FleetHost, type TopHost,
} from '../../cli/ui/top-rows.js';
import type { SandboxStats, StatsResponse } from '../../sdk/index.js';
import { Interrupts, Sink, ok, runCli, startFakeDsecd, type FakeDsecd } from '../fixtures/fake-dsecd.js';

const T0 = 1_800_000_000_000;
const GiB = 1024 ** 3;
const MiB = 1024 ** 2;

const sb = (id: string, over: Partial<SandboxStats> = {}): SandboxStats => ({
  id,
  state: 'running',
  image: 'busybox:latest',
  labels: {},
  created_at: T0 - 60_000,
  cpu_usage_ns: 0,
  memory_bytes: 10 * MiB,
  memory_limit_bytes: 512 * MiB,
  pids: 3,
  oom_kills: 0,
  disk_used_bytes: 12 * MiB,
  disk_limit_bytes: 64 * MiB,
  ...over,
});
const sample = (time: number, sandboxes: SandboxStats[]): StatsResponse => ({
  time,
  host: { cores: 2, memory_bytes: 24 * GiB, memory_available_bytes: 20 * GiB, load_avg: [0.5, 0.25, 0.125] },
  sandboxes,
});

// Three sandboxes: a busy one (1.5 cores over 2 s), an idle old one, a young one with
// lots of memory; `young` was not in the first sample.
const A = 'aaaaaaaaaaaaaaaa';
const B = 'bbbbbbbbbbbbbbbb';
const C = 'cccccccccccccccc';
const prev = sample(T0, [
  sb(A, { cpu_usage_ns: 1e9, labels: { job: 'train', round: '1' } }),
  sb(B, { cpu_usage_ns: 5e9, created_at: T0 - 7_200_000, labels: { job: 'eval' } }),
]);
const cur = sample(T0 + 2000, [
  sb(A, { cpu_usage_ns: 1e9 + 3e9, labels: { job: 'train', round: '1' } }),
  sb(B, { cpu_usage_ns: 5e9 + 0.1e9, created_at: T0 - 7_200_000, labels: { job: 'eval' }, memory_bytes: 50 * MiB, idle_since: T0 + 2000 - 300_000, reclaimed_bytes: 40 * MiB }),
  sb(C, { cpu_usage_ns: 9e9, created_at: T0 + 1000, memory_bytes: 300 * MiB, state: 'running' }),
]);

describe('top rows (pure)', () => {
  it('CPU% = delta ns ÷ elapsed s ÷ 1e9 × 100; unknown without a previous value, for a stopped sandbox, or when the counter went back', () => {
    expect(cpuPercent({ cpu_usage_ns: 1e9 }, { cpu_usage_ns: 4e9 }, 2000)).toBeCloseTo(150);
    expect(cpuPercent({ cpu_usage_ns: 0 }, { cpu_usage_ns: 0.5e9 }, 1000)).toBeCloseTo(50);
    expect(cpuPercent(undefined, { cpu_usage_ns: 4e9 }, 2000)).toBeNull();
    expect(cpuPercent({ cpu_usage_ns: null }, { cpu_usage_ns: 4e9 }, 2000)).toBeNull();
    expect(cpuPercent({ cpu_usage_ns: 5e9 }, { cpu_usage_ns: 1e9 }, 2000)).toBeNull();
    expect(cpuPercent({ cpu_usage_ns: 1e9 }, { cpu_usage_ns: 2e9 }, 0)).toBeNull();
    const rows = renderTopRows(prev, cur, 'cpu');
    expect(rows.map((r) => [r.id, r.cpuPercent === null ? null : Math.round(r.cpuPercent * 10) / 10])).toEqual([[A, 150], [B, 5], [C, null]]);
    const stopped = renderTopRows(prev, sample(T0 + 2000, [sb(A, { state: 'stopped', cpu_usage_ns: null, memory_bytes: null, pids: null })]), 'cpu');
    expect(stopped[0]).toMatchObject({ cpuPercent: null, memoryBytes: null, pids: null });
    expect(renderTopRows(undefined, cur, 'cpu').every((r) => r.cpuPercent === null)).toBe(true);
  });

  it('sorts by cpu (unknown last), mem (largest first), age (newest first), id', () => {
    expect(renderTopRows(prev, cur, 'mem').map((r) => r.id)).toEqual([C, B, A]);
    expect(renderTopRows(prev, cur, 'age').map((r) => r.id)).toEqual([C, A, B]);
    expect(renderTopRows(prev, cur, 'id').map((r) => r.id)).toEqual([A, B, C]);
  });

  it('filters by label k=v, by state/image/id fields, or by text', () => {
    const ids = (f: string) => renderTopRows(prev, cur, 'id', f).map((r) => r.id);
    expect(ids('job=train')).toEqual([A]);
    expect(ids('job=nope')).toEqual([]);
    expect(ids('state=running')).toEqual([A, B, C]);
    expect(ids('id=bbbb')).toEqual([B]);
    expect(ids('EVAL')).toEqual([B]);
    expect(ids('round=1')).toEqual([A]);
    expect(ids('  ')).toEqual([A, B, C]);
    expect(matchesFilter({ id: A, state: 'running', image: 'x', labels: { state: 'odd' } }, 'state=running')).toBe(false); // a label wins over the field
  });

  it('renders the plain table and the host header', () => {
    const text = renderTopTable(renderTopRows(prev, cur, 'cpu'));
    const lines = text.trimEnd().split('\n');
    expect(lines[0].split(/\s+/)).toEqual(['ID', 'STATE', 'CPU%', 'MEM', 'LIMIT', 'PIDS', 'DISK', 'OOM', 'DENIED', 'IDLE/RECL', 'AGE', 'LABELS']);
    expect(lines[1].split(/\s+/)).toEqual([A.slice(0, 12), 'running', '150.0', '10MiB', '512MiB', '3', '12MiB/64MiB', '0', '-', '-', '1m', 'job=train,round=1']);
    // IDLE/RECL: the host reclaim's view (GET /v1/stats idle_since, reclaimed_bytes).
    expect(lines[2].split(/\s+/)).toEqual([B.slice(0, 12), 'running', '5.0', '50MiB', '512MiB', '3', '12MiB/64MiB', '0', '-', '5m/40MiB', '2h', 'job=eval']);
    expect(lines[3].split(/\s+/)).toEqual([C.slice(0, 12), 'running', '-', '300MiB', '512MiB', '3', '12MiB/64MiB', '0', '-', '-', '1s', '-']);
    // DENIED sums every refusal counter present; none counted is '-'.
    expect(denialCount({ seccomp_denials: { total: 4, by_syscall: { mount: 4 }, flooded: false }, network_denied: { connect: 2, sendmsg: 1, sock_create: 0, dns_refused: 3, last: null }, pids_limit_hits: 5 })).toBe(15);
    expect(denialCount({ seccomp_denials: null, network_denied: null, pids_limit_hits: null })).toBeNull();
    expect(denialCount({ seccomp_denials: { total: 0, by_syscall: {}, flooded: false } })).toBe(0);
    // A layer on the host filesystem has no usage; one without a quota shows its usage alone.
    expect(diskCell({ diskUsedBytes: null, diskLimitBytes: null })).toBe('-');
    expect(idleCell({ idleMs: null, reclaimedBytes: 0 })).toBe('-');
    expect(idleCell({ idleMs: null, reclaimedBytes: 3 * MiB })).toBe('-/3MiB');
    expect(idleCell({ idleMs: 90_000, reclaimedBytes: null })).toBe('1m/-');
    expect(diskCell({ diskUsedBytes: 5 * MiB, diskLimitBytes: null })).toBe('5MiB');
    expect(renderTopHeader(hostFromStats(cur), 3, 3)).toBe('host: 2 cores, mem 4GiB / 24GiB, load 0.50 0.25 0.13; 3 sandboxes');
    expect(renderTopHeader({ ...hostFromStats(cur), cpuPercent: 12.4 }, 3, 1)).toBe('host: 2 cores, cpu 12%, mem 4GiB / 24GiB, load 0.50 0.25 0.13; 1 of 3 sandboxes');
  });
});

describe('top keys (pure)', () => {
  const ui = (over: Partial<TopUiState> = {}): TopUiState => ({ sort: 'cpu', filter: '', editing: null, selected: null, confirm: null, ...over });
  const rows = [{ id: A, state: 'running' }, { id: B, state: 'paused' }, { id: C, state: 'stopped' }];
  /** Feeds one Ink input (as useInput would get it) through the reducer; returns the final state and the effects. */
  const feed = (s: TopUiState, input: string, key: Record<string, boolean> = {}) => {
    const effects = [];
    for (const k of keysFromInk(input, key)) {
      const r = reduceKey(s, k, rows, 2);
      s = r.state;
      if (r.effect) effects.push(r.effect);
    }
    return { s, effects };
  };

  it('a paste arrives as one input: `/job=a` and Enter at once apply the filter, as typed keys do', () => {
    expect(keysFromInk('/job=a\r', {}).map((k) => (k.name === 'char' ? k.ch : k.name))).toEqual(['/', 'j', 'o', 'b', '=', 'a', 'return']);
    expect(feed(ui(), '/job=a\r').s).toMatchObject({ filter: 'job=a', editing: null });
    // Pasted into an open prompt, with a backspace and a newline in it.
    expect(feed(ui({ editing: 'x' }), 'y\x7fz\n').s).toMatchObject({ filter: 'xz', editing: null });
    expect(feed(ui({ editing: 'abc' }), '', { escape: true }).s).toMatchObject({ filter: '', editing: null });
  });

  it('moves the selection with arrows, j/k, pages and ends; acts on the selected row', () => {
    expect(feed(ui(), '', { downArrow: true }).s.selected).toBe(B);
    expect(feed(ui({ selected: B }), 'j').s.selected).toBe(C);
    expect(feed(ui({ selected: C }), '', { downArrow: true }).s.selected).toBe(C);
    expect(feed(ui({ selected: C }), 'k').s.selected).toBe(B);
    expect(feed(ui(), '', { pageDown: true }).s.selected).toBe(C);
    expect(feed(ui({ selected: C }), 'g').s.selected).toBe(A);
    expect(feed(ui(), 'G').s.selected).toBe(C);
    // A selected sandbox that is gone falls back to the first row.
    expect(feed(ui({ selected: 'gone' }), 's').effects).toEqual([{ kind: 'shell', id: A }]);
    expect(feed(ui({ selected: B }), '', { return: true }).effects).toEqual([{ kind: 'shell', id: B }]);
    expect(feed(ui({ selected: B }), 'l').effects).toEqual([{ kind: 'logs', id: B }]);
    expect(feed(ui(), 'p').effects).toEqual([{ kind: 'pause', id: A }]);
    expect(feed(ui({ selected: B }), 'p').effects).toEqual([{ kind: 'resume', id: B }]);
    expect(feed(ui({ selected: C }), 'p').effects[0]).toMatchObject({ kind: 'notice', text: expect.stringMatching(/is stopped/) });
    expect(feed(ui(), 'm').s.sort).toBe('mem');
    expect(feed(ui(), 'q').effects).toEqual([{ kind: 'quit' }]);
  });

  it('d asks first: y destroys, any other key keeps the sandbox (a paste of `dy` confirms only through y)', () => {
    const asked = feed(ui({ selected: B }), 'd');
    expect(asked.s.confirm).toBe(B);
    expect(asked.effects).toEqual([]);
    expect(feed(asked.s, 'y').effects).toEqual([{ kind: 'destroy', id: B }]);
    expect(feed(asked.s, 'n').effects).toEqual([{ kind: 'notice', text: 'kept bbbbbbbbbbbb' }]);
    expect(feed(asked.s, '', { return: true }).s.confirm).toBeNull();
    expect(feed(ui(), 'dn').effects).toEqual([{ kind: 'notice', text: 'kept aaaaaaaaaaaa' }]);
  });
});

describe('top colours and meters (pure)', () => {
  it('state colours; CPU, memory and disk by pressure (70% yellow, 90% red); OOM kills red; refusals yellow', () => {
    expect(['running', 'paused', 'creating', 'stopped', 'failed'].map(stateColor)).toEqual(['green', 'cyan', 'blue', 'gray', 'red']);
    expect([pressure(50, 100), pressure(70, 100), pressure(95, 100), pressure(null, 100), pressure(5, null)]).toEqual(['ok', 'high', 'critical', null, null]);
    const [row] = renderTopRows(prev, sample(T0 + 2000, [sb(A, { cpu_usage_ns: 1e9 + 1.9e9, cpus: 1, memory_bytes: 400 * MiB, disk_used_bytes: 60 * MiB, oom_kills: 1, pids_limit_hits: 2 })]), 'cpu');
    // 95% of its one core, 400 of 512 MiB (78%), 60 of 64 MiB disk (94%).
    expect(topCellColors(row)).toEqual([undefined, 'green', 'red', 'yellow', undefined, undefined, 'red', 'red', 'yellow', undefined, undefined, undefined]);
    const [calm] = renderTopRows(undefined, cur, 'cpu');
    expect(topCellColors(calm).filter(Boolean)).toEqual(['green']);
  });

  it('meters as htop draws them: the bar in proportion, the value inside on the right', () => {
    const m = meter(0.5, 22, '50%');
    expect(m.open + m.filled + m.rest + m.close).toBe('[||||||||||       50%]');
    expect(m.filled).toBe('||||||||||');
    const full = meter(1.5, 12, '150%');
    expect(full.open + full.filled + full.rest + full.close).toBe('[||||||150%]');
    expect(meter(0, 10, 'x').filled).toBe('');
  });
});

describe('top view (Ink)', () => {
  const host: TopHost = { cores: 2, cpuPercent: 30, memoryUsedBytes: 4 * GiB, memoryTotalBytes: 24 * GiB, loadAvg: [1, 1, 1] };
  const tick = (ms = 20) => new Promise((r) => setTimeout(r, ms));
  const rowsOf = (frame: string) => frame.split('\n').filter((l) => /^[abc]{12}\s/.test(l)).map((l) => l.slice(0, 1));
  /**
   * Waits until the last frame satisfies `ok` (renders and samples run on timers: a busy
   * machine delays them, never changes them); fails with the frame after 10 s.
   */
  async function frameWhere(app: { lastFrame(): string | undefined }, ok: (frame: string) => boolean, what: string): Promise<string> {
    for (let i = 0; i < 1000; i++) {
      const f = app.lastFrame() ?? '';
      if (ok(f)) return f;
      await tick(10);
    }
    throw new Error(`no frame with ${what}; the last:\n${app.lastFrame()}`);
  }
  const rowsAre = (want: string[]) => (f: string) => rowsOf(f).join() === want.join();

  /** Sample n (0, 1, ...): 2 s apart; A burns 1.5 cores, B 5% of one, C (from sample 1 on) nothing. */
  const nth = (n: number): StatsResponse => (n === 0 ? prev : sample(T0 + 2000 * n, [
    sb(A, { cpu_usage_ns: 1e9 + 3e9 * n, labels: { job: 'train', round: '1' } }),
    sb(B, { cpu_usage_ns: 5e9 + 0.1e9 * n, created_at: T0 - 7_200_000, labels: { job: 'eval' }, memory_bytes: 50 * MiB }),
    sb(C, { cpu_usage_ns: 9e9, created_at: T0 + 1000, memory_bytes: 300 * MiB }),
  ]));

  async function view(filter = '') {
    let n = 0;
    const app = render(
      createElement(TopView, {
        sample: async () => nth(n++),
        host: async () => host,
        intervalMs: 30,
        sort: 'cpu',
        filter,
        keys: true,
        columns: 100,
        rows: 30,
      }),
    );
    for (let i = 0; i < 1000 && !/150\.0/.test(app.lastFrame() ?? ''); i++) await tick(10);
    return app;
  }

  it('shows the host header and one row per sandbox with CPU% once two samples are in', async () => {
    const app = await view();
    const frame = app.lastFrame()!;
    expect(frame).toContain('host: 2 cores, cpu 30%, mem 4GiB / 24GiB, load 1.00 1.00 1.00; 3 sandboxes');
    expect(frame).toMatch(/ID\s+STATE\s+CPU%\s+MEM\s+LIMIT\s+PIDS\s+DISK\s+OOM\s+DENIED\s+IDLE\/RECL\s+AGE\s+LABELS/);
    expect(frame).toMatch(/aaaaaaaaaaaa\s+running\s+150\.0\s+10MiB/);
    expect(rowsOf(frame)).toEqual(['a', 'b', 'c']);
    app.unmount();
  });

  it('`m` sorts by memory, `i` by id; `/` types a filter, Enter applies, Esc clears', async () => {
    const app = await view();
    app.stdin.write('m');
    expect(await frameWhere(app, rowsAre(['c', 'b', 'a']), 'rows by memory')).toContain('sort: mem');
    app.stdin.write('i');
    await frameWhere(app, rowsAre(['a', 'b', 'c']), 'rows by id');
    app.stdin.write('/');
    await frameWhere(app, (f) => f.includes('filter (k=v'), 'the filter prompt');
    for (const ch of 'job=eval') app.stdin.write(ch);
    await frameWhere(app, (f) => f.includes('filter (k=v or text, Enter applies, Esc clears): job=eval_'), 'the typed filter');
    app.stdin.write('\r');
    const f = await frameWhere(app, rowsAre(['b']), 'the filtered rows');
    expect(f).toContain('filter: job=eval');
    expect(f).toContain('1 of 3 sandboxes');
    app.stdin.write('\x1b');
    await frameWhere(app, rowsAre(['a', 'b', 'c']), 'every row after Esc');
    app.unmount();
  });

  it('the header has CPU and MEM meters', async () => {
    const app = await view();
    expect(app.lastFrame()).toMatch(/CPU \[\|+ +30%\]  MEM \[\|+ +4GiB\/24GiB\]/);
    app.unmount();
  });

  it('a pasted filter (one write of `/job=eval` and Enter) applies', async () => {
    const app = await view();
    app.stdin.write('/job=eval\r');
    expect(await frameWhere(app, rowsAre(['b']), 'the filtered rows')).toContain('filter: job=eval');
    app.unmount();
  });

  it('pause, destroy after y: the action runs on the selected row and its outcome is shown', async () => {
    const acts: string[] = [];
    let n = 0;
    const app = render(createElement(TopView, {
      sample: async () => nth(n++), host: async () => host, intervalMs: 30, sort: 'id', filter: '', keys: true, columns: 100, rows: 30,
      act: async (op, id) => {
        acts.push(`${op} ${id}`);
        return `${id} ${op}d`;
      },
    }));
    for (let i = 0; i < 1000 && !/150\.0/.test(app.lastFrame() ?? ''); i++) await tick(10);
    // Keys are handled in order through the view's state ref: no wait between them.
    app.stdin.write('\x1b[B');
    app.stdin.write('p');
    for (let i = 0; i < 1000 && !acts.length; i++) await tick(10);
    expect(acts).toEqual([`pause ${B}`]);
    for (let i = 0; i < 1000 && !/bbbbbbbbbbbbbbbb paused/.test(app.lastFrame() ?? ''); i++) await tick(10);
    expect(app.lastFrame()).toContain(`${B} paused`);
    app.stdin.write('d');
    await frameWhere(app, (f) => f.includes(`destroy sandbox ${B} (running), killing its processes? [y/N]`), 'the destroy question');
    app.stdin.write('y');
    for (let i = 0; i < 1000 && acts.length < 2; i++) await tick(10);
    expect(acts).toEqual([`pause ${B}`, `destroy ${B}`]);
    app.unmount();
  });

  it('starts with --filter applied and shows a failed sample as an error line', async () => {
    const app = await view('job=train');
    expect(rowsOf(app.lastFrame()!)).toEqual(['a']);
    app.unmount();
    const broken = render(createElement(TopView, { sample: async () => Promise.reject(new Error('dsecd is gone')), host: async () => host, intervalMs: 1000, sort: 'cpu', filter: '', keys: false }));
    for (let i = 0; i < 1000 && !/error/.test(broken.lastFrame() ?? ''); i++) await tick(10);
    expect(broken.lastFrame()).toContain('error: dsecd is gone (retrying)');
    broken.unmount();
  });
});

describe('dsec top (snapshot)', () => {
  let fake: FakeDsecd;
  beforeEach(async () => {
    fake = await startFakeDsecd();
    let n = 0;
    fake.routes['GET /v1/stats'] = (req, res) => ok(n++ === 0 ? prev : cur)(req, res);
  });
  afterEach(async () => {
    await fake.close();
  });

  it('with stdout not a terminal: the stderr note, then ONE plain table from two samples', async () => {
    const r = await runCli(['top', '--interval', '100ms'], { socket: fake.socketPath });
    expect(r.code).toBe(0);
    expect(r.err).toBe('(stdout is not a terminal: printing one snapshot)\n');
    const lines = r.out.trimEnd().split('\n');
    expect(lines).toHaveLength(4);
    expect(lines[0]).toMatch(/^ID\s+STATE\s+CPU%/);
    expect(lines[1]).toMatch(/^aaaaaaaaaaaa\s+running\s+150\.0\s/);
    expect(fake.seen.filter((s) => s.path === '/v1/stats')).toHaveLength(2);
  });

  it('--once on a terminal adds the host line and no note; --sort and --filter apply', async () => {
    const stdout = new Sink(true, 120, 40);
    const r = await runCli(['top', '--once', '--interval', '100ms', '--sort', 'mem', '--filter', 'state=running'], { socket: fake.socketPath, stdout });
    expect(r.code).toBe(0);
    expect(r.err).toBe('');
    const lines = stdout.text.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^host: \d+ cores, /);
    expect(lines.slice(2).map((l) => l.slice(0, 1))).toEqual(['c', 'b', 'a']);
  });

  it('--json prints {time, host, sandboxes} with cpu_percent', async () => {
    const r = await runCli(['--json', 'top', '--interval', '100ms'], { socket: fake.socketPath });
    expect(r.code).toBe(0);
    expect(r.err).toBe('');
    const j = JSON.parse(r.out);
    expect(j.time).toBe(cur.time);
    expect(j.host.cores).toBeGreaterThan(0);
    expect(j.sandboxes.map((s: { id: string; cpu_percent: number | null }) => [s.id, s.cpu_percent])).toEqual([[A, 150], [B, 5], [C, null]]);
  });

  it('an interrupt during the wait prints nothing and exits 130; a bad --sort is a usage error', async () => {
    const interrupts = new Interrupts();
    const run = runCli(['top', '--interval', '1h'], { socket: fake.socketPath, interrupts });
    for (let i = 0; i < 200 && (fake.seen.length === 0 || interrupts.handlers.size === 0); i++) await new Promise((r) => setTimeout(r, 5));
    interrupts.fire('SIGINT');
    const r = await run;
    expect(r.code).toBe(130);
    expect(r.out).toBe('');
    const bad = await runCli(['top', '--sort', 'disk'], { socket: fake.socketPath });
    expect(bad.code).toBe(125);
    expect(bad.err).toMatch(/^dsec: --sort: unknown sort "disk"/);
  });
});

// A gateway's GET /v1/stats (gateway/fanout.ts mergeStats): sandboxes name their host and
// the sample lists the hosts, each with its own host block when it answered.
const fleetSample = (time: number, sandboxes: Array<SandboxStats & { host: string }>): StatsResponse => {
  const hostBlock = (cores: number) => ({ cores, memory_bytes: cores * 4 * GiB, memory_available_bytes: cores * GiB, load_avg: [cores, 0, 0] });
  const hosts: FleetHost[] = [
    { name: 'h1', outcome: 'ok', sandboxes: sandboxes.filter((x) => x.host === 'h1').length, host: hostBlock(2) },
    { name: 'h2', outcome: 'ok', sandboxes: sandboxes.filter((x) => x.host === 'h2').length, host: hostBlock(4) },
    { name: 'h3', outcome: 'down', sandboxes: 0, error: { code: 'Unavailable', message: 'host h3 is down' } },
  ];
  return { time, host: { cores: 6, memory_bytes: 24 * GiB, memory_available_bytes: 6 * GiB, load_avg: [6, 0, 0] }, sandboxes, hosts } as StatsResponse;
};
const fprev = fleetSample(T0, [{ ...sb(A, { cpu_usage_ns: 1e9 }), host: 'h1' }, { ...sb(B, { cpu_usage_ns: 5e9 }), host: 'h2' }]);
const fcur = fleetSample(T0 + 2000, [{ ...sb(A, { cpu_usage_ns: 4e9 }), host: 'h1' }, { ...sb(B, { cpu_usage_ns: 5.1e9 }), host: 'h2' }, { ...sb(C), host: 'h2' }]);

describe('top against a gateway: the fleet', () => {
  it('one host\'s sample is not a fleet; a gateway\'s names its hosts, rows carry their host, host=NAME filters', () => {
    expect(fleetHosts(cur)).toBeNull();
    expect(fleetHosts(fcur)?.map((h) => h.name)).toEqual(['h1', 'h2', 'h3']);
    const rows = renderTopRows(fprev, fcur, 'id');
    expect(rows.map((r) => [r.id.slice(0, 1), r.host])).toEqual([['a', 'h1'], ['b', 'h2'], ['c', 'h2']]);
    expect(renderTopRows(fprev, fcur, 'id', 'host=h2').map((r) => r.id.slice(0, 1))).toEqual(['b', 'c']);
    expect(renderTopRows(fprev, fcur, 'id', 'host=h3')).toEqual([]);
    expect(renderTopRows(prev, cur, 'id').every((r) => r.host === null)).toBe(true);
  });

  it('the table gets a HOST column, the header the fleet\'s sums or the drilled-into host\'s own figures', () => {
    const rows = renderTopRows(fprev, fcur, 'id');
    const table = renderTopTable(rows, { fleet: true }).split('\n');
    expect(table[0]).toMatch(/^ID\s+STATE\s+HOST\s+CPU%/);
    expect(table[1]).toMatch(/^aaaaaaaaaaaa\s+running\s+h1\s+150\.0\s/);
    expect(renderTopTable(rows).split('\n')[0]).toMatch(/^ID\s+STATE\s+CPU%/);
    const all = fleetHeader(fcur, '');
    expect(renderTopHeader(all.host, 3, 3, all.label)).toMatch(/^fleet: 6 cores, mem 18GiB \/ 24GiB, load 6\.00 /);
    const h2 = fleetHeader(fcur, 'host=h2');
    expect(renderTopHeader(h2.host, 3, 2, h2.label)).toMatch(/^host h2: 4 cores, mem 12GiB \/ 16GiB, load 4\.00 .*; 2 of 3 sandboxes$/);
    // A host that is down has no figures of its own: the fleet's stay.
    expect(fleetHeader(fcur, 'host=h3').label).toBe('fleet');
    expect(renderFleetLine(fleetHosts(fcur)!, 'h2')).toBe('fleet: 3 hosts · h1 up 1 · [h2 up 2] · h3 down');
  });

  it('h drills into the selected row\'s host and h again leaves it; on one host it says why it does nothing', () => {
    const s: TopUiState = { sort: 'id', filter: '', editing: null, selected: null, confirm: null };
    const rows = renderTopRows(fprev, fcur, 'id');
    const down = reduceKey(s, { name: 'down' }, rows, 10).state;
    const drilled = reduceKey(down, { name: 'char', ch: 'h' }, rows, 10).state;
    expect(drilled.filter).toBe('host=h2');
    expect(drilled.selected).toBe(B);
    expect(reduceKey(drilled, { name: 'char', ch: 'h' }, rows.filter((r) => r.host === 'h2'), 10).state.filter).toBe('');
    const one = reduceKey(s, { name: 'char', ch: 'h' }, renderTopRows(prev, cur, 'id'), 10);
    expect(one.state.filter).toBe('');
    expect(one.effect).toEqual({ kind: 'notice', text: expect.stringContaining('one host') });
  });

  it('the live view shows the fleet line and HOST column, and h on a row shows only its host', async () => {
    let n = 0;
    const app = render(createElement(TopView, {
      sample: async () => (n++ === 0 ? fprev : fcur),
      host: async () => { throw new Error('a fleet sample takes its header from the sample'); },
      intervalMs: 30, sort: 'id', filter: '', keys: true, columns: 140, rows: 30,
    }));
    const tick = (ms = 10) => new Promise((r) => setTimeout(r, ms));
    for (let i = 0; i < 200 && !/150\.0/.test(app.lastFrame() ?? ''); i++) await tick();
    let frame = app.lastFrame()!;
    expect(frame).toContain('fleet: 3 hosts · h1 up 1 · h2 up 2 · h3 down');
    expect(frame).toMatch(/^fleet: 6 cores/m);
    expect(frame).toMatch(/ID\s+STATE\s+HOST\s+CPU%/);
    expect(frame).toContain('[h]ost');
    app.stdin.write('j');
    await tick(30);
    app.stdin.write('h');
    for (let i = 0; i < 200 && !/^host h2:/m.test(app.lastFrame() ?? ''); i++) await tick();
    frame = app.lastFrame()!;
    expect(frame).toMatch(/^host h2: 4 cores/m);
    expect(frame).toContain('[h2 up 2]');
    expect(frame.split('\n').filter((l) => /^[abc]{12}\s/.test(l)).map((l) => l.slice(0, 1))).toEqual(['b', 'c']);
    app.unmount();
  });

  it('dsec top --json through a gateway adds hosts and each row\'s host; --once on a terminal prints the fleet line', async () => {
    const fake = await startFakeDsecd();
    try {
      let n = 0;
      fake.routes['GET /v1/stats'] = (req, res) => ok(n++ % 2 === 0 ? fprev : fcur)(req, res);
      const r = await runCli(['--json', 'top', '--interval', '100ms', '--filter', 'host=h2'], { socket: fake.socketPath });
      expect(r.code, r.err).toBe(0);
      const j = JSON.parse(r.out);
      expect(j.hosts.map((h: { name: string; outcome: string }) => [h.name, h.outcome])).toEqual([['h1', 'ok'], ['h2', 'ok'], ['h3', 'down']]);
      expect(j.host.cores).toBe(4);
      expect(j.sandboxes.map((x: { id: string; host: string }) => [x.id.slice(0, 1), x.host])).toEqual([['b', 'h2'], ['c', 'h2']]);
      const stdout = new Sink(true, 140, 40);
      const t = await runCli(['top', '--once', '--interval', '100ms', '--sort', 'id'], { socket: fake.socketPath, stdout });
      expect(t.code, t.err).toBe(0);
      const lines = stdout.text.replace(/\x1b\[[0-9;]*m/g, '').trimEnd().split('\n');
      expect(lines[0]).toMatch(/^fleet: 6 cores/);
      expect(lines[1]).toBe('fleet: 3 hosts · h1 up 1 · h2 up 2 · h3 down');
      expect(lines[2]).toMatch(/^ID\s+STATE\s+HOST\s/);
    } finally {
      await fake.close();
    }
  });
});
