// `dsec top`: the pure row computation (CPU% from counter deltas, sorting, filtering),
// the Ink view driven by ink-testing-library (header, rows, keys), and the plain
// snapshot a non-terminal stdout gets, against the fake dsecd.
import { render } from 'ink-testing-library';
import { createElement } from 'react';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { TopView } from '../../cli/ui/top.js';
import { cpuPercent, denialCount, diskCell, hostFromStats, matchesFilter, renderTopHeader, renderTopRows, renderTopTable, type TopHost } from '../../cli/ui/top-rows.js';
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
  sb(B, { cpu_usage_ns: 5e9 + 0.1e9, created_at: T0 - 7_200_000, labels: { job: 'eval' }, memory_bytes: 50 * MiB }),
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
    expect(lines[0].split(/\s+/)).toEqual(['ID', 'STATE', 'CPU%', 'MEM', 'LIMIT', 'PIDS', 'DISK', 'OOM', 'DENIED', 'AGE', 'LABELS']);
    expect(lines[1].split(/\s+/)).toEqual([A.slice(0, 12), 'running', '150.0', '10MiB', '512MiB', '3', '12MiB/64MiB', '0', '-', '1m', 'job=train,round=1']);
    expect(lines[2].split(/\s+/)).toEqual([B.slice(0, 12), 'running', '5.0', '50MiB', '512MiB', '3', '12MiB/64MiB', '0', '-', '2h', 'job=eval']);
    expect(lines[3].split(/\s+/)).toEqual([C.slice(0, 12), 'running', '-', '300MiB', '512MiB', '3', '12MiB/64MiB', '0', '-', '1s', '-']);
    // DENIED sums every refusal counter present; none counted is '-'.
    expect(denialCount({ seccomp_denials: { total: 4, by_syscall: { mount: 4 }, flooded: false }, network_denied: { connect: 2, sendmsg: 1, sock_create: 0, dns_refused: 3, last: null }, pids_limit_hits: 5 })).toBe(15);
    expect(denialCount({ seccomp_denials: null, network_denied: null, pids_limit_hits: null })).toBeNull();
    expect(denialCount({ seccomp_denials: { total: 0, by_syscall: {}, flooded: false } })).toBe(0);
    // A layer on the host filesystem has no usage; one without a quota shows its usage alone.
    expect(diskCell({ diskUsedBytes: null, diskLimitBytes: null })).toBe('-');
    expect(diskCell({ diskUsedBytes: 5 * MiB, diskLimitBytes: null })).toBe('5MiB');
    expect(renderTopHeader(hostFromStats(cur), 3, 3)).toBe('host: 2 cores, mem 4GiB / 24GiB, load 0.50 0.25 0.13; 3 sandboxes');
    expect(renderTopHeader({ ...hostFromStats(cur), cpuPercent: 12.4 }, 3, 1)).toBe('host: 2 cores, cpu 12%, mem 4GiB / 24GiB, load 0.50 0.25 0.13; 1 of 3 sandboxes');
  });
});

describe('top view (Ink)', () => {
  const host: TopHost = { cores: 2, cpuPercent: 30, memoryUsedBytes: 4 * GiB, memoryTotalBytes: 24 * GiB, loadAvg: [1, 1, 1] };
  const tick = (ms = 20) => new Promise((r) => setTimeout(r, ms));
  const rowsOf = (frame: string) => frame.split('\n').filter((l) => /^[abc]{12}\s/.test(l)).map((l) => l.slice(0, 1));

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
        columns: 120,
        rows: 30,
      }),
    );
    for (let i = 0; i < 100 && !/150\.0/.test(app.lastFrame() ?? ''); i++) await tick(10);
    return app;
  }

  it('shows the host header and one row per sandbox with CPU% once two samples are in', async () => {
    const app = await view();
    const frame = app.lastFrame()!;
    expect(frame).toContain('host: 2 cores, cpu 30%, mem 4GiB / 24GiB, load 1.00 1.00 1.00; 3 sandboxes');
    expect(frame).toMatch(/ID\s+STATE\s+CPU%\s+MEM\s+LIMIT\s+PIDS\s+DISK\s+OOM\s+DENIED\s+AGE\s+LABELS/);
    expect(frame).toMatch(/aaaaaaaaaaaa\s+running\s+150\.0\s+10MiB/);
    expect(rowsOf(frame)).toEqual(['a', 'b', 'c']);
    app.unmount();
  });

  it('`m` sorts by memory, `i` by id; `/` types a filter, Enter applies, Esc clears', async () => {
    const app = await view();
    app.stdin.write('m');
    await tick();
    expect(rowsOf(app.lastFrame()!)).toEqual(['c', 'b', 'a']);
    expect(app.lastFrame()).toContain('sort: mem');
    app.stdin.write('i');
    await tick();
    expect(rowsOf(app.lastFrame()!)).toEqual(['a', 'b', 'c']);
    app.stdin.write('/');
    await tick();
    for (const ch of 'job=eval') {
      app.stdin.write(ch);
      await tick(5);
    }
    expect(app.lastFrame()).toContain('filter (k=v or text, Enter applies, Esc clears): job=eval_');
    app.stdin.write('\r');
    await tick();
    expect(rowsOf(app.lastFrame()!)).toEqual(['b']);
    expect(app.lastFrame()).toContain('filter: job=eval');
    expect(app.lastFrame()).toContain('1 of 3 sandboxes');
    app.stdin.write('\x1b');
    await tick(60);
    expect(rowsOf(app.lastFrame()!)).toEqual(['a', 'b', 'c']);
    app.unmount();
  });

  it('starts with --filter applied and shows a failed sample as an error line', async () => {
    const app = await view('job=train');
    expect(rowsOf(app.lastFrame()!)).toEqual(['a']);
    app.unmount();
    const broken = render(createElement(TopView, { sample: async () => Promise.reject(new Error('dsecd is gone')), host: async () => host, intervalMs: 1000, sort: 'cpu', filter: '', keys: false }));
    for (let i = 0; i < 50 && !/error/.test(broken.lastFrame() ?? ''); i++) await tick(10);
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
