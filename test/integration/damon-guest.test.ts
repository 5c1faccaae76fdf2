/**
 * The host DAMON controller (daemon/host/memory/damon.ts) and the memory.reclaim fallback
 * (daemon/host/memory/idle-reclaim.ts through daemon/host/cgroups) on a real kernel
 * without touching this host's DAMON: their compiled JS runs inside a vm-tier guest on a
 * guest kernel with DAMON (Debian's 6.12), against the guest's own
 * /sys/kernel/mm/damon and cgroup v2 (test/fixtures/damon-guest.ts).
 *
 * In the guest, two sandbox cgroups (made by CgroupV2Manager) each hold ~96 MiB of page
 * cache (a file read by a process in the cgroup, then left alone). The controller, finding
 * no kdamond, takes ownership, points one pageout scheme at the first cgroup through a
 * memcg filter in this kernel's layout, and turns it on: DAMON's applied-bytes stat goes
 * above zero and the first cgroup's memory falls while the second's, outside the filter,
 * does not. It then tears down its own kdamond. With a kdamond it did not create, it
 * stands aside and writes nothing. The fallback's memory.reclaim then reclaims the second
 * cgroup. Last, the controller as dsecd runs it (host/memory/host-reclaim.ts, mode
 * aggressive) owns a kdamond, pages out the idle cgroup and not the one with an exec
 * running, counts the bytes DAMON applied to it, and removes its kdamond at stop.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestDaemon } from './harness.js';
import { DAMON_GUEST_CONFIG, GUEST_DIST, canRunDamonGuest, startDamonGuest, type DamonGuest } from '../fixtures/damon-guest.js';

/** The in-guest program: prints one JSON line with what it saw. Waits are bounded only by a hang detector. */
const SCRIPT = `
import { DamonController } from '${GUEST_DIST}/daemon/host/memory/damon.js';
import { IdleReclaimer } from '${GUEST_DIST}/daemon/host/memory/idle-reclaim.js';
import { HostReclaim } from '${GUEST_DIST}/daemon/host/memory/host-reclaim.js';
import { resolveHostReclaim } from '${GUEST_DIST}/daemon/host/memory/config.js';
import { detectCgroups } from '${GUEST_DIST}/daemon/host/cgroups/index.js';
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync, existsSync } from 'node:fs';

const MiB = 2 ** 20;
const HANG_MS = 10 * 60_000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const sh = (s) => execFileSync('/bin/sh', ['-c', s], { encoding: 'utf8' });
const out = {};

const cg = await detectCgroups({ instance: 'dtest' });
out.cgroupVersion = cg.version;
await cg.init();
const limits = { cpuQuotaUs: null, cpuPeriodUs: 100000, cpuShares: null, memoryBytes: null, pids: null };
const current = (id) => Number(readFileSync(cg.sandboxPaths(id).unified + '/memory.current', 'utf8'));
// ~96 MiB of page cache charged to each cgroup: a file read by a process inside it, after dropping the guest's caches once.
for (const id of ['sb1', 'sb2']) sh('dd if=/dev/urandom of=/var/tmp/' + id + '.bin bs=1M count=96 2>/dev/null');
sh('sync && echo 3 > /proc/sys/vm/drop_caches');
for (const id of ['sb1', 'sb2']) {
  await cg.create(id, limits);
  sh('echo $$ > ' + cg.sandboxPaths(id).unified + '/cgroup.procs && cat /var/tmp/' + id + '.bin > /dev/null');
}
out.before = { sb1: current('sb1'), sb2: current('sb2') };

const adminDir = '/sys/kernel/mm/damon/admin';
const nr = () => readFileSync(adminDir + '/kdamonds/nr_kdamonds', 'utf8').trim();
const params = { minAgeMs: 3000, sampleUs: 20000, aggrUs: 500000, cpuMsPerS: 200, bytesPerS: 256 * MiB };
const c = new DamonController({ ownerFile: '/opt/dsec/damon-owner.json' });
out.detect = await c.detect();
out.acquire = await c.acquire();
out.memcgPath = cg.memcgPath('sb1');
await c.apply([{ key: 'sb1', memcgPath: cg.memcgPath('sb1') }], params);
out.state = readFileSync(adminDir + '/kdamonds/0/state', 'utf8').trim();
out.layout = existsSync(adminDir + '/kdamonds/0/contexts/0/schemes/0/ops_filters') ? 'ops_filters' : 'filters';
out.owned = (await c.detect()).reason;
const t0 = Date.now();
for (;;) {
  const st = (await c.stats()).get('sb1');
  out.stats = st;
  out.after = { sb1: current('sb1'), sb2: current('sb2') };
  if (st && st.bytesApplied > 0 && out.after.sb1 < out.before.sb1 / 2) break;
  if (Date.now() - t0 > HANG_MS) { out.hang = true; break; }
  await sleep(1000);
}
out.waitedMs = Date.now() - t0;
await c.release();
out.afterRelease = { nr: nr(), owner: existsSync('/opt/dsec/damon-owner.json') };

// A kdamond dsecd did not create (made here, off): the controller stands aside and writes nothing.
writeFileSync(adminDir + '/kdamonds/nr_kdamonds', '1');
const snap = () => sh('cd ' + adminDir + ' && for f in kdamonds/nr_kdamonds kdamonds/0/state kdamonds/0/contexts/nr_contexts; do echo "$f=$(cat $f)"; done');
const before = snap();
const other = new DamonController({ ownerFile: '/opt/dsec/other-owner.json' });
out.foreign = await other.acquire();
await other.apply([{ key: 'sb1', memcgPath: cg.memcgPath('sb1') }], params).catch((e) => { out.foreignApply = e.kind; });
await other.release();
out.foreignUntouched = snap() === before;
writeFileSync(adminDir + '/kdamonds/nr_kdamonds', '0');

// The fallback: memory.reclaim of the idle second cgroup (v2), half of its usage.
const r = new IdleReclaimer(cg, { idleAfterMs: 0, repeatMs: 0, fraction: 0.5 });
out.fallback = await r.sweep([{ id: 'sb2', idleSinceMs: 0 }]);

// The controller as dsecd runs it (HostReclaim, mode aggressive): sb3 idle, sb4 with an exec
// running (the exec activity stand-in says so). It owns a kdamond, points it at sb3 only,
// counts what DAMON applied to sb3, and removes its kdamond at stop.
for (const id of ['sb3', 'sb4']) sh('dd if=/dev/urandom of=/var/tmp/' + id + '.bin bs=1M count=64 2>/dev/null');
sh('sync && echo 3 > /proc/sys/vm/drop_caches');
for (const id of ['sb3', 'sb4']) {
  await cg.create(id, limits);
  sh('echo $$ > ' + cg.sandboxPaths(id).unified + '/cgroup.procs && cat /var/tmp/' + id + '.bin > /dev/null');
}
out.wiredBefore = { sb3: current('sb3'), sb4: current('sb4') };
const log = { info() {}, warn() {}, debug() {}, error(o, m) { (out.wiredErrors ??= []).push(m + ': ' + (o?.err?.message ?? '')); }, child() { return log; } };
const hr = new HostReclaim({
  config: resolveHostReclaim({ reclaim: 'aggressive', idle_after_s: 1, sweep_s: 1, damon_min_age_s: 3, damon_cpu_ms_per_s: 200, damon_bytes_per_s: 256 * MiB }),
  cgroups: cg, damon: new DamonController({ ownerFile: '/opt/dsec/damon-owner.json' }), log,
  candidates: () => [{ id: 'sb3', backend: 'container', state: 'running' }, { id: 'sb4', backend: 'container', state: 'running' }],
  activity: { view: (id) => ({ running: id === 'sb4' ? 1 : 0, lastMs: null }), retain() {} },
});
await hr.start();
out.wiredStart = { method: hr.status().method, reason: hr.status().reason };
const t1 = Date.now();
for (;;) {
  await hr.sweep();
  const st = hr.status();
  out.wired = { idle: st.idleSandboxes, total: st.reclaimedBytes, sb3: st.bySandbox.get('sb3') ?? 0, sb4: st.bySandbox.get('sb4') ?? 0, after: { sb3: current('sb3'), sb4: current('sb4') } };
  if (out.wired.sb3 > 0 && out.wired.after.sb3 < out.wiredBefore.sb3 / 2) break;
  if (Date.now() - t1 > HANG_MS) { out.wiredHang = true; break; }
  await sleep(1000);
}
out.wiredWaitedMs = Date.now() - t1;
await hr.stop();
out.wiredAfterStop = { nr: nr(), owner: existsSync('/opt/dsec/damon-owner.json') };
for (const id of ['sb1', 'sb2', 'sb3', 'sb4']) await cg.remove(id);
console.log(JSON.stringify(out));
`;

describe.skipIf(!canRunDamonGuest)('host DAMON controller and memory.reclaim on a real 6.12 kernel, in a vm-tier guest', () => {
  let d: TestDaemon;
  let g: DamonGuest;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 99, config: DAMON_GUEST_CONFIG });
    g = await startDamonGuest(d);
  }, 30 * 60_000);
  afterAll(async () => {
    await g?.close();
    await d?.cleanup();
  });

  it('owns a kdamond where none exists, reclaims only the targeted memcg, tears down its own; stands aside from another; memory.reclaim works', async () => {
    const o = JSON.parse((await g.node(SCRIPT)).trim().split('\n').pop()!);
    console.log(`damon in a 6.12 guest: ${JSON.stringify(o)}`);
    const MiB = 2 ** 20;
    expect(o.cgroupVersion).toBe(2);
    expect(o.before.sb1).toBeGreaterThan(80 * MiB);
    expect(o.before.sb2).toBeGreaterThan(80 * MiB);
    expect(o.detect).toEqual({ available: true, reason: expect.stringMatching(/no kdamond runs/) });
    expect(o.acquire.available).toBe(true);
    expect(o.memcgPath).toBe('/dsec-dtest/sb1');
    expect(o.state).toBe('on');
    expect(o.layout).toBe('filters'); // 6.12: filters/ without allow
    expect(o.owned).toMatch(/dsecd owns kdamond 0 \(state on, pid \d+, operations paddr, 1 scheme\(s\)\)/);
    expect(o.hang).toBeUndefined();
    expect(o.stats.bytesApplied).toBeGreaterThan(0);
    expect(o.after.sb1).toBeLessThan(o.before.sb1 / 2);
    // The memcg filter: the other cgroup's cache is not the scheme's.
    expect(o.after.sb2).toBeGreaterThan(o.before.sb2 * 0.9);
    expect(o.afterRelease).toEqual({ nr: '0', owner: false });
    expect(o.foreign.available).toBe(false);
    expect(o.foreign.reason).toMatch(/1 kdamond\(s\) exist that dsecd did not create \(kdamond 0: state off\); writing nr_kdamonds would tear them down/);
    expect(o.foreignApply).toBe('FailedPrecondition');
    expect(o.foreignUntouched).toBe(true);
    expect(o.fallback).toHaveLength(1);
    expect(o.fallback[0].afterBytes).toBeLessThan(o.fallback[0].beforeBytes * 0.75);
    // HostReclaim, as dsecd runs it.
    expect(o.wiredStart.method).toBe('damon');
    expect(o.wiredErrors).toBeUndefined();
    expect(o.wiredHang).toBeUndefined();
    expect(o.wired.idle).toBe(1);
    expect(o.wired.sb3).toBeGreaterThan(0);
    expect(o.wired.total).toBe(o.wired.sb3);
    expect(o.wired.sb4).toBe(0);
    expect(o.wired.after.sb3).toBeLessThan(o.wiredBefore.sb3 / 2);
    expect(o.wired.after.sb4).toBeGreaterThan(o.wiredBefore.sb4 * 0.9);
    expect(o.wiredAfterStop).toEqual({ nr: '0', owner: false });
  }, 30 * 60_000);
});
