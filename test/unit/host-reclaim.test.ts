/**
 * The host's reclaim of idle container sandboxes as dsecd runs it: the idle policy
 * (daemon/host/memory/idle.ts), `[memory]`/`--reclaim` (config.ts), and the controller
 * (host-reclaim.ts) choosing its method and driving DAMON on directory trees shaped like
 * DAMON's sysfs in both layouts (test/fixtures/damon-sysfs.ts), or memory cgroups
 * through a recording stand-in of the cgroup interface. Never the host's real DAMON.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { IdleTracker } from '../../daemon/host/memory/idle.js';
import { resolveHostReclaim, MemorySchema } from '../../daemon/host/memory/config.js';
import { HostReclaim, type HostReclaimDeps } from '../../daemon/host/memory/host-reclaim.js';
import { DamonController } from '../../daemon/host/memory/damon.js';
import { ExecActivity } from '../../daemon/sandbox/activity.js';
import { unimplemented } from '../../daemon/errors.js';
import { DamonSysfsEmulator, buildDamonTree, type DamonSysfsLayout } from '../fixtures/damon-sysfs.js';

const IOMEM = '00100000-bffdffff : System RAM\n100000000-63fffffff : System RAM\n';
const log = pino({ level: 'silent' });

describe('idle policy', () => {
  it('busy while an exec runs or CPU is above the threshold; idle since the latest of first sight, busy sample and exec', () => {
    let t = 1_000_000;
    const tr = new IdleTracker(10, () => t);
    const s = (id: string, cpuNs: number | null, execsRunning = 0, lastExecMs: number | null = null, state: 'running' | 'paused' = 'running') => ({ id, state, cpuNs, execsRunning, lastExecMs });
    // First sight: idle since now (nothing is known of before), unless an exec runs.
    expect([...tr.observe([s('a', 0), s('b', 0, 1), s('p', null, 0, null, 'paused')])]).toEqual([['a', t], ['b', null], ['p', t]]);
    const t0 = t;
    t += 10_000;
    // a: 50 ms of CPU in 10 s = 5 per mille (under 10): still idle since t0. b: 200 ms in 10 s = 20 per mille: busy now.
    let r = tr.observe([s('a', 50e6), s('b', 200e6), s('p', null, 0, null, 'paused')]);
    expect(r.get('a')).toBe(t0);
    expect(r.get('b')).toBeNull();
    expect(r.get('p')).toBe(t0);
    const t1 = t;
    t += 10_000;
    // b calm again: idle since its last busy sample; a gets an exec that ended 3 s ago.
    r = tr.observe([s('a', 60e6, 0, t - 3000), s('b', 210e6), s('p', null, 0, null, 'paused')]);
    expect(r.get('a')).toBe(t - 3000);
    expect(r.get('b')).toBe(t1);
    // p resumed: its idle clock restarts; a forgotten sandbox starts over when seen again.
    t += 10_000;
    r = tr.observe([s('p', 0)]);
    expect([...r]).toEqual([['p', t]]);
    t += 10_000;
    expect(tr.observe([s('a', 60e6), s('p', 0)]).get('a')).toBe(t);
    // Exactly at the threshold is idle (the rule is "above").
    t += 10_000;
    expect(tr.observe([s('a', 60e6), s('p', 100e6)]).get('p')).toBe(t - 20_000);
  });

  it('exec activity: begin/end pairs, last start or end, forgotten when the sandbox is gone', () => {
    let t = 5;
    const a = new ExecActivity(() => t);
    a.begin('x');
    a.begin('x');
    t = 9;
    a.end('x');
    expect(a.view('x')).toEqual({ running: 1, lastMs: 9 });
    a.retain(new Set());
    expect(a.view('x').running).toBe(1);
    a.end('x');
    a.retain(new Set());
    expect(a.view('x')).toEqual({ running: 0, lastMs: null });
  });
});

describe('[memory] and --reclaim', () => {
  it('defaults off; presets; keys override; the flag wins; bad values refused', () => {
    const off = resolveHostReclaim(undefined);
    expect(off).toMatchObject({ mode: 'off', idleAfterMs: 120_000, idleCpuPermil: 5, repeatMs: 0, sweepMs: 5000, fraction: 0.5, damon: true, damonSysfs: '/sys/kernel/mm/damon' });
    expect(resolveHostReclaim({ reclaim: 'idle' }, 'aggressive')).toMatchObject({ mode: 'aggressive', idleAfterMs: 15_000, repeatMs: 60_000, fraction: 1, damonParams: { minAgeMs: 10_000, cpuMsPerS: 50, bytesPerS: 256 * 2 ** 20 } });
    expect(resolveHostReclaim({ reclaim: 'idle', idle_after_s: 30, idle_cpu_permil: 2, damon: false })).toMatchObject({ mode: 'idle', idleAfterMs: 30_000, idleCpuPermil: 2, damon: false });
    expect(() => resolveHostReclaim({}, 'sometimes')).toThrow(/--reclaim "sometimes": one of off, idle, aggressive/);
    expect(MemorySchema.safeParse({ reclaim: 'always' }).success).toBe(false);
    expect(MemorySchema.safeParse({ fraction: 0 }).success).toBe(false);
    expect(MemorySchema.safeParse({ damon_sysfs: 'relative' }).success).toBe(false);
  });
});

/** A recording stand-in of the cgroup interface: CPU per sandbox, usage that reclaim lowers. */
class FakeCgroups {
  version: 1 | 2;
  parents: Record<string, string>;
  cpu = new Map<string, number>();
  usage = new Map<string, number>();
  reclaims: Array<{ id: string; bytes?: number }> = [];
  unimplemented = false;
  constructor(version: 1 | 2, memory = true) {
    this.version = version;
    this.parents = memory ? (version === 1 ? { memory: '/sys/fs/cgroup/memory/dsec-t' } : { unified: '/sys/fs/cgroup/dsec-t' }) : {};
  }
  async stats(id: string) {
    return { cpuUsageNs: this.cpu.get(id) ?? 0, memoryBytes: this.usage.get(id) ?? 0 } as Awaited<ReturnType<HostReclaimDeps['cgroups']['stats']>>;
  }
  async reclaim(id: string, bytes?: number) {
    if (this.unimplemented) throw unimplemented('kernel has no memory.reclaim (needs Linux 5.19+)');
    this.reclaims.push({ id, bytes });
    const before = this.usage.get(id) ?? 0;
    const after = bytes === undefined ? Math.floor(before / 4) : before - bytes;
    this.usage.set(id, after);
    return { beforeBytes: before, afterBytes: after };
  }
  memcgPath(id: string) {
    return `/dsec-t/${id}`;
  }
}

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function rig(o: { layout?: DamonSysfsLayout; foreign?: boolean; version?: 1 | 2; mode?: 'off' | 'idle' | 'aggressive'; noDamonSysfs?: boolean }) {
  const root = mkdtempSync(path.join(os.tmpdir(), 'dsec-hr-'));
  dirs.push(root);
  const layout = o.layout ?? '6.18';
  const damonDir = o.noDamonSysfs ? path.join(root, 'none') : buildDamonTree(root, { layout, kdamonds: o.foreign ? [{ state: 'on', pid: 77, operations: 'paddr', schemes: 1, filters: 1 }] : [] });
  const io = new DamonSysfsEmulator(damonDir, layout);
  for (const id of ['a', 'b']) io.memcgs.add(`/dsec-t/${id}`);
  const ownerFile = path.join(root, 'damon-owner.json');
  const damon = new DamonController({ root: damonDir, io, ownerFile, bootId: async () => 'boot', iomem: async () => IOMEM });
  const cg = new FakeCgroups(o.version ?? 1);
  let t = 1_000_000;
  const activity = new ExecActivity(() => t);
  const live = [
    { id: 'a', backend: 'container' as const, state: 'running' as const },
    { id: 'b', backend: 'container' as const, state: 'running' as const },
    { id: 'v', backend: 'microvm' as const, state: 'running' as const },
  ];
  const config = resolveHostReclaim({ reclaim: o.mode ?? 'aggressive', damon_sysfs: damonDir });
  const r = new HostReclaim({ config, cgroups: cg, damon, candidates: () => live, activity, log, now: () => t });
  return { r, io, cg, activity, ownerFile, damonDir, advance: (ms: number) => { t += ms; }, rd: (rel: string) => readFileSync(path.join(damonDir, 'admin', rel), 'utf8').trim() };
}

describe.each(['6.12', '6.18'] as const)('host reclaim with DAMON on a %s-shaped sysfs', (layout) => {
  it('owns a kdamond, points it at idle container sandboxes only, counts applied bytes per sandbox, follows activity, removes its kdamond at stop', async () => {
    const { r, io, cg, activity, ownerFile, advance, rd } = rig({ layout });
    await r.start();
    expect(r.status()).toMatchObject({ mode: 'aggressive', method: 'damon', damon: { owned: true } });
    expect(rd('kdamonds/nr_kdamonds')).toBe('1');
    await r.sweep(); // first sight: nothing idle yet, nothing applied
    expect(rd('kdamonds/0/state')).toBe('off');
    advance(20_000);
    cg.cpu.set('b', 20_000 * 1e6 * 0.1); // b used 10% of a core: busy
    await r.sweep();
    expect(r.status().idleSandboxes).toBe(1);
    expect(rd('kdamonds/0/state')).toBe('on');
    expect(rd('kdamonds/0/contexts/0/schemes/nr_schemes')).toBe('1');
    const dir = layout === '6.12' ? 'filters' : 'ops_filters';
    expect(rd(`kdamonds/0/contexts/0/schemes/0/${dir}/0/memcg_path`)).toBe('/dsec-t/a');
    expect(rd('kdamonds/0/contexts/0/schemes/0/access_pattern/age/min')).toBe('5'); // 10 s / 2 s aggregation
    expect(r.status().reclaimedBytes).toBe(0); // the first read after a change is the baseline
    const base = io.stats.sz_applied;
    io.stats = { ...io.stats, sz_applied: base + 3 * 2 ** 20 };
    advance(5000);
    await r.sweep();
    expect(r.status().reclaimedBytes).toBe(3 * 2 ** 20);
    expect(r.status().bySandbox.get('a')).toBe(3 * 2 ** 20);
    expect(r.status().bySandbox.has('b')).toBe(false);
    expect(r.sandbox('a')).toEqual({ idleSinceMs: 1_000_000, reclaimedBytes: 3 * 2 ** 20 });
    expect(r.sandbox('b')).toEqual({ idleSinceMs: 1_020_000, reclaimedBytes: 0 });
    expect(r.sandbox('v')).toEqual({ idleSinceMs: null, reclaimedBytes: 0 });
    // An exec in a: busy, so no target: the kdamond is turned off (and kept).
    activity.begin('a');
    advance(5000);
    await r.sweep();
    expect(rd('kdamonds/0/state')).toBe('off');
    expect(r.status().idleSandboxes).toBe(0);
    expect(io.writes.some((w) => w.value.includes('/dsec-t/v'))).toBe(false);
    await r.stop();
    expect(rd('kdamonds/nr_kdamonds')).toBe('0');
    expect(existsSync(ownerFile)).toBe(false);
    expect(r.status().reclaimedBytes).toBe(3 * 2 ** 20);
  });

  it('stands aside from a kdamond it did not create: writes nothing, falls back to memory cgroups, and says why', async () => {
    const { r, io, cg, advance } = rig({ layout, foreign: true, version: 1 });
    await r.start();
    const st = r.status();
    expect(st.method).toBe('memory.force_empty');
    expect(st.damon.owned).toBe(false);
    expect(st.reason).toMatch(/cgroup v1 \(no memory\.reclaim\): memory\.force_empty of sandboxes idle for 15 s/);
    expect(st.damon.reason).toMatch(/1 kdamond\(s\) exist that dsecd did not create \(kdamond 0: state on, pid 77/);
    cg.usage.set('a', 400).set('b', 800);
    await r.sweep();
    advance(16_000);
    await r.sweep();
    await r.stop();
    expect(io.writes).toEqual([]);
    // v1: force_empty takes no amount; both idle container sandboxes reclaimed once, the microVM never.
    expect(cg.reclaims).toEqual([{ id: 'a', bytes: undefined }, { id: 'b', bytes: undefined }]);
    expect(r.status().reclaimedBytes).toBe(300 + 600);
  });
});

describe('host reclaim through memory cgroups', () => {
  it('v2 memory.reclaim: the fraction of usage per round, again after repeat_s while idle, per sandbox and in total', async () => {
    const { r, cg, activity, advance } = rig({ noDamonSysfs: true, version: 2 });
    await r.start();
    expect(r.status()).toMatchObject({ method: 'memory.reclaim', damon: { owned: false } });
    expect(r.status().damon.reason).toMatch(/no DAMON sysfs interface/);
    cg.usage.set('a', 1000).set('b', 2000);
    await r.sweep();
    advance(15_000);
    activity.begin('b');
    await r.sweep();
    expect(cg.reclaims).toEqual([{ id: 'a', bytes: 1000 }]);
    cg.usage.set('a', 500);
    advance(30_000);
    await r.sweep(); // idle, but repeat_s (60 s) not reached
    expect(cg.reclaims).toHaveLength(1);
    advance(31_000);
    await r.sweep();
    expect(cg.reclaims).toEqual([{ id: 'a', bytes: 1000 }, { id: 'a', bytes: 500 }]);
    expect(r.status().bySandbox.get('a')).toBe(1500);
    expect(r.status().reclaimedBytes).toBe(1500);
    await r.stop();
  });

  it('a kernel without the interface: method none with the reason, no more attempts', async () => {
    const { r, cg, advance } = rig({ noDamonSysfs: true, version: 2 });
    cg.unimplemented = true;
    await r.start();
    await r.sweep();
    advance(20_000);
    await r.sweep();
    expect(r.status().method).toBe('none');
    expect(r.status().reason).toMatch(/memory\.reclaim is not offered by this kernel/);
    await r.stop();
  });

  it('mode off: DAMON is only read (no kdamond made), nothing is reclaimed', async () => {
    const { r, io, cg, advance } = rig({ mode: 'off' });
    await r.start();
    expect(r.status()).toMatchObject({ mode: 'off', method: 'none', damon: { owned: false } });
    expect(r.status().damon.reason).toMatch(/no kdamond runs on this host: dsecd may create/);
    advance(200_000);
    await r.sweep();
    await r.stop();
    expect(io.writes).toEqual([]);
    expect(cg.reclaims).toEqual([]);
  });
});
