/**
 * The cgroup v2 io controller code (daemon/host/cgroups/v2.ts: setIo, ioSupport,
 * ioCounters) run for real, inside a vm-tier guest whose kernel (Debian's) has cgroup v2
 * mounted, through the fixture test/fixtures/cgroup2-guest.ts: this host is hybrid v1, so
 * the v2 path cannot run on it. In the guest, dsec's own compiled module creates an
 * instance parent and a sandbox cgroup on the guest's real cgroup2 mount, writes io.weight
 * and io.max for the guest's root disk, and a shell moved into that cgroup writes with
 * direct I/O and then buffered. Checked on behaviour, never wall-clock bounds: the bytes a
 * throttled direct-I/O dd wrote are at most the rate times the time it ran (timed in the
 * guest), io.stat charged them to the sandbox, and buffered writes were charged to it too
 * (cgroup writeback, which v1 lacks: test/attacks/disk.test.ts shows the v1 side).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestDaemon } from './harness.js';
import { CGROUP2_GUEST_CONFIG, GUEST_DIST, canRunCgroup2Guest, startCgroup2Guest, type Cgroup2Guest } from '../fixtures/cgroup2-guest.js';

const RATE = 1024 * 1024;

describe.skipIf(!canRunCgroup2Guest)('cgroup v2 io controller, in a vm-tier guest', () => {
  let d: TestDaemon;
  let g: Cgroup2Guest;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 96, config: CGROUP2_GUEST_CONFIG });
    g = await startCgroup2Guest(d);
  });
  afterAll(async () => {
    await g?.close();
    await d?.cleanup();
  });

  it('setIo writes io.weight and io.max on the guest root disk; a direct-I/O writer is held to the rate; buffered writes are charged too; iocost makes io.weight enforced', async () => {
    const { major, minor } = g.rootDevice;
    const out = await g.node(`
      import { detectCgroups } from '${GUEST_DIST}/daemon/host/cgroups/index.js';
      import { spawnSync } from 'node:child_process';
      import { readFileSync, writeFileSync } from 'node:fs';
      const dev = { major: ${major}, minor: ${minor} };
      const cg = await detectCgroups({ instance: 'guest' });
      await cg.init();
      await cg.create('sb1', { cpuQuotaUs: null, cpuPeriodUs: 100000, cpuShares: null, memoryBytes: null, pids: null });
      const supportBefore = await cg.ioSupport(dev);
      await cg.setIo('sb1', { weight: 200, readBps: null, writeBps: ${RATE}, readIops: null, writeIops: null }, dev);
      const dir = cg.sandboxPaths('sb1').unified;
      const files = { max: readFileSync(dir + '/io.max', 'utf8'), weight: readFileSync(dir + '/io.weight', 'utf8') };
      const run = (script) => spawnSync('sh', ['-c', 'echo $$ > ' + dir + '/cgroup.procs && ' + script], { encoding: 'utf8' });
      const c0 = await cg.ioCounters('sb1', dev);
      const direct = run('t0=$(cut -d" " -f1 /proc/uptime); timeout 3 dd if=/dev/zero of=/root/direct bs=64k count=1000 oflag=direct 2>/dev/null; '
        + 't1=$(cut -d" " -f1 /proc/uptime); echo "$(awk "BEGIN { print int(($t1 - $t0) * 1000) }") $(stat -c %s /root/direct)"').stdout.trim().split(' ').map(Number);
      const c1 = await cg.ioCounters('sb1', dev);
      run('dd if=/dev/zero of=/root/buffered bs=1M count=2 2>/dev/null; sync');
      const c2 = await cg.ioCounters('sb1', dev);
      writeFileSync('/sys/fs/cgroup/io.cost.qos', '${major}:${minor} enable=1');
      const supportIocost = await cg.ioSupport(dev);
      await cg.setIo('sb1', { weight: null, readBps: null, writeBps: null, readIops: null, writeIops: null }, dev);
      const cleared = readFileSync(dir + '/io.max', 'utf8');
      console.log(JSON.stringify({ version: cg.version, supportBefore, files, direct, c0, c1, c2, supportIocost, cleared }));
    `);
    const r = JSON.parse(out.trim().split('\n').pop()!) as {
      version: number; supportBefore: { limitEnforced: boolean; bufferedWritesLimited: boolean; weightFile: string | null; weightEnforced: boolean; detail: string };
      files: { max: string; weight: string }; direct: [number, number]; c0: { writeBytes: number }; c1: { writeBytes: number }; c2: { writeBytes: number };
      supportIocost: { weightEnforced: boolean; detail: string }; cleared: string;
    };
    console.log(`guest root ${major}:${minor}: direct dd at wbps=${RATE}: ${r.direct[1]} bytes in ${r.direct[0]} ms; io.stat wbytes +${r.c1.writeBytes - r.c0.writeBytes} (direct), +${r.c2.writeBytes - r.c1.writeBytes} (2 MiB buffered + sync)`);
    expect(r.version).toBe(2);
    expect(r.supportBefore).toMatchObject({ limitEnforced: true, bufferedWritesLimited: true, weightFile: 'io.weight', weightEnforced: false });
    expect(r.files.max).toBe(`${major}:${minor} rbps=max wbps=${RATE} riops=max wiops=max\n`);
    expect(r.files.weight).toMatch(/^default 200\n/);
    const [ms, bytes] = r.direct;
    expect(ms).toBeGreaterThan(0);
    expect(bytes).toBeGreaterThan(0);
    // At most the rate over the time it ran, plus one 64 KiB write in flight and the
    // throttle's first slice; unthrottled, the same dd writes far more in that time.
    expect(bytes).toBeLessThanOrEqual(RATE * (ms / 1000 + 0.5) + 64 * 1024);
    expect(r.c1.writeBytes - r.c0.writeBytes).toBeGreaterThanOrEqual(bytes);
    // Buffered writes, flushed by sync: charged to the sandbox's cgroup (v2 cgroup writeback).
    expect(r.c2.writeBytes - r.c1.writeBytes).toBeGreaterThanOrEqual(2 * 1024 * 1024);
    expect(r.supportIocost.weightEnforced).toBe(true);
    expect(r.supportIocost.detail).toMatch(/enforced by iocost/);
    expect(r.cleared).toBe('');
  });
});
