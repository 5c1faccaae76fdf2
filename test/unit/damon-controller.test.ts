/**
 * The host DAMON controller (daemon/host/memory/damon.ts) against directory trees shaped
 * like DAMON's sysfs in both layouts it meets (test/fixtures/damon-sysfs.ts: 6.12's
 * `filters/`, 6.18's `ops_filters/` with `allow`), with the kernel's reactions emulated:
 * it stands aside (writing nothing) when a kdamond it did not create exists, owns one
 * otherwise, writes in the documented order, turns on, commits changes, refreshes
 * stats, and tears down only its own kdamond. Never the host's real DAMON.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DamonController, systemRamRanges, type DamonReclaimParams } from '../../daemon/host/memory/damon.js';
import { DamonSysfsEmulator, buildDamonTree, type DamonSysfsLayout } from '../fixtures/damon-sysfs.js';

const IOMEM = [
  '00000000-00000fff : Reserved',
  '00001000-0009fbff : System RAM',
  '000f0000-000fffff : Reserved',
  '00100000-bffdffff : System RAM',
  '  01000000-01ffffff : Kernel code',
  'fec00000-fec003ff : PNP0003:00',
  '100000000-63fffffff : System RAM',
].join('\n');

const PARAMS: DamonReclaimParams = { minAgeMs: 30_000, sampleUs: 100_000, aggrUs: 2_000_000, cpuMsPerS: 20, bytesPerS: 64 * 2 ** 20 };
const BOOT = 'boot-1';

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

function setup(layout: DamonSysfsLayout, kdamonds: Parameters<typeof buildDamonTree>[1]['kdamonds'] = [], bootId = BOOT) {
  const root = mkdtempSync(path.join(os.tmpdir(), 'dsec-damon-'));
  dirs.push(root);
  const damon = buildDamonTree(root, { layout, kdamonds });
  const io = new DamonSysfsEmulator(damon, layout);
  const ownerFile = path.join(root, 'damon-owner.json');
  const c = new DamonController({ root: damon, io, ownerFile, bootId: async () => bootId, iomem: async () => IOMEM });
  const rd = (rel: string) => readFileSync(path.join(damon, 'admin', rel), 'utf8').trim();
  return { root, damon, io, c, ownerFile, rd };
}

describe('systemRamRanges', () => {
  it('takes top-level System RAM lines of at least 4 MiB, end exclusive', () => {
    expect(systemRamRanges(IOMEM)).toEqual([[0x100000n, 0xbffe0000n], [0x100000000n, 0x640000000n]]);
  });
});

describe.each(['6.12', '6.18'] as const)('DAMON controller on a %s-shaped sysfs', (layout) => {
  it('stands aside from a kdamond it did not create: says why, writes nothing, even on release', async () => {
    const { c, io } = setup(layout, [{ state: 'on', pid: 1234, operations: 'paddr', schemes: 1, filters: 2 }]);
    const v = await c.detect();
    expect(v.available).toBe(false);
    expect(v.reason).toMatch(/1 kdamond\(s\) exist that dsecd did not create \(kdamond 0: state on, pid 1234, operations paddr, 1 scheme\(s\)\); writing nr_kdamonds would tear them down/);
    expect((await c.acquire()).available).toBe(false);
    await expect(c.apply([{ key: 'sb1', memcgPath: '/dsec-x/sb1' }], PARAMS)).rejects.toMatchObject({ kind: 'FailedPrecondition' });
    expect(await c.stats()).toEqual(new Map());
    await c.release();
    expect(io.writes).toEqual([]);
  });

  it('a stopped foreign kdamond is foreign too; so is its own kdamond of an earlier boot', async () => {
    const a = setup(layout, [{ state: 'off' }]);
    expect((await a.c.acquire()).available).toBe(false);
    expect(a.io.writes).toEqual([]);
    // Own kdamond, then the host rebooted (a new boot id): the record no longer vouches for it.
    const b = setup(layout);
    expect((await b.c.acquire()).available).toBe(true);
    const later = new DamonController({ root: b.damon, io: b.io, ownerFile: b.ownerFile, bootId: async () => 'boot-2', iomem: async () => IOMEM });
    const n = b.io.writes.length;
    expect((await later.detect()).available).toBe(false);
    await later.release();
    expect(b.io.writes.length).toBe(n);
  });

  it('no sysfs: unavailable, with the reason', async () => {
    const root = mkdtempSync(path.join(os.tmpdir(), 'dsec-damon-'));
    dirs.push(root);
    const c = new DamonController({ root: path.join(root, 'sys/kernel/mm/damon'), ownerFile: path.join(root, 'o.json'), bootId: async () => BOOT });
    expect(await c.detect()).toEqual({ available: false, reason: expect.stringMatching(/no DAMON sysfs interface .*CONFIG_DAMON_SYSFS/) });
  });

  it('owns a kdamond when none exists: writes in the documented order, memcg filters in this layout, on, commit, stats, teardown of its own only', async () => {
    const { c, io, rd, ownerFile } = setup(layout);
    io.memcgs = new Set(['/dsec-x/sb1', '/dsec-x/sb2']);
    expect((await c.detect()).reason).toMatch(/no kdamond runs/);
    expect((await c.acquire()).available).toBe(true);
    expect(JSON.parse(readFileSync(ownerFile, 'utf8'))).toEqual({ bootId: BOOT, kdamond: 0 });
    await c.apply([{ key: 'sb1', memcgPath: '/dsec-x/sb1' }, { key: 'sb2', memcgPath: '/dsec-x/sb2' }], PARAMS);
    const files = io.writes.map((w) => w.file.replace(/^admin\/kdamonds\/0\/contexts\/0\//, 'C/').replace(/^admin\/kdamonds\/0\//, 'K/'));
    // Each nr_* before anything inside what it creates; state last.
    const at = (f: string) => files.indexOf(f);
    expect(files[0]).toBe('admin/kdamonds/nr_kdamonds');
    expect(at('K/contexts/nr_contexts')).toBe(1);
    expect(at('C/operations')).toBeGreaterThan(at('K/contexts/nr_contexts'));
    expect(at('C/targets/nr_targets')).toBeLessThan(at('C/targets/0/regions/nr_regions'));
    expect(at('C/targets/0/regions/nr_regions')).toBeLessThan(at('C/targets/0/regions/0/start'));
    expect(at('C/schemes/nr_schemes')).toBeLessThan(at('C/schemes/0/action'));
    const fdir = layout === '6.18' ? 'ops_filters' : 'filters';
    expect(at(`C/schemes/1/${fdir}/nr_filters`)).toBeLessThan(at(`C/schemes/1/${fdir}/0/memcg_path`));
    expect(files.at(-1)).toBe('K/state');
    expect(io.writes.at(-1)!.value).toBe('on');
    // What the kernel now holds.
    expect(rd('kdamonds/0/state')).toBe('on');
    expect(rd('kdamonds/0/contexts/0/operations')).toBe('paddr');
    expect(rd('kdamonds/0/contexts/0/targets/0/regions/nr_regions')).toBe('2');
    expect(rd('kdamonds/0/contexts/0/targets/0/regions/1/end')).toBe(String(0x640000000));
    const s1 = 'kdamonds/0/contexts/0/schemes/1';
    expect(rd(`${s1}/action`)).toBe('pageout');
    expect(rd(`${s1}/access_pattern/nr_accesses/max`)).toBe('0');
    expect(rd(`${s1}/access_pattern/age/min`)).toBe('15'); // 30 s in 2 s aggregation intervals
    expect(rd(`${s1}/quotas/ms`)).toBe('10'); // 20 ms/s split over two schemes
    expect(rd(`${s1}/quotas/bytes`)).toBe(String(32 * 2 ** 20));
    expect(rd(`${s1}/quotas/reset_interval_ms`)).toBe('1000');
    expect(rd(`${s1}/${fdir}/0/type`)).toBe('memcg');
    expect(rd(`${s1}/${fdir}/0/memcg_path`)).toBe('/dsec-x/sb2');
    expect(rd(`${s1}/${fdir}/0/matching`)).toBe('N');
    if (layout === '6.18') {
      expect(rd(`${s1}/ops_filters/0/allow`)).toBe('N');
      expect(rd(`${s1}/filters/nr_filters`)).toBe('0');
    }
    expect((await c.detect()).reason).toMatch(/dsecd owns kdamond 0 \(state on, pid \d+, operations paddr, 2 scheme\(s\)\)/);

    // A running kdamond takes changes through commit.
    io.writes.length = 0;
    await c.apply([{ key: 'sb2', memcgPath: '/dsec-x/sb2' }], PARAMS);
    expect(io.writes.at(-1)).toEqual({ file: 'admin/kdamonds/0/state', value: 'commit' });
    expect(io.writes.some((w) => w.file === 'admin/kdamonds/nr_kdamonds')).toBe(false);
    expect(rd('kdamonds/0/contexts/0/schemes/nr_schemes')).toBe('1');
    expect(rd(`kdamonds/0/contexts/0/schemes/0/${fdir}/0/memcg_path`)).toBe('/dsec-x/sb2');

    // Stats: refreshed by update_schemes_stats, keyed by target.
    const st = await c.stats();
    expect(io.writes.at(-1)).toEqual({ file: 'admin/kdamonds/0/state', value: 'update_schemes_stats' });
    expect(st.get('sb2')).toEqual({ nrTried: 7, bytesTried: 7 * 4096 * 1024, nrApplied: 5, bytesApplied: 5 * 4096 * 1024, quotaExceeds: 1 });

    // A memcg the kernel does not know: the commit is refused, named.
    await expect(c.apply([{ key: 'gone', memcgPath: '/dsec-x/gone' }], PARAMS)).rejects.toMatchObject({ kind: 'Internal', message: expect.stringMatching(/state.*ENOENT/) });

    // No targets: off, kdamond kept.
    await c.apply([], PARAMS);
    expect(rd('kdamonds/0/state')).toBe('off');
    expect(rd('kdamonds/nr_kdamonds')).toBe('1');

    // Teardown: its own kdamond goes, and the record.
    await c.release();
    expect(rd('kdamonds/nr_kdamonds')).toBe('0');
    expect(() => readFileSync(ownerFile)).toThrow();
    const n = io.writes.length;
    await c.release(); // safe twice
    expect(io.writes.length).toBe(n);
  });

  it('teardown of a running kdamond turns it off before removing it (the kernel refuses nr_kdamonds while one runs)', async () => {
    const { c, io, rd } = setup(layout);
    io.memcgs = new Set(['/a']);
    await c.acquire();
    await c.apply([{ key: 'a', memcgPath: '/a' }], PARAMS);
    io.writes.length = 0;
    await c.release();
    expect(io.writes).toEqual([{ file: 'admin/kdamonds/0/state', value: 'off' }, { file: 'admin/kdamonds/nr_kdamonds', value: '0' }]);
    expect(rd('kdamonds/nr_kdamonds')).toBe('0');
  });
});
