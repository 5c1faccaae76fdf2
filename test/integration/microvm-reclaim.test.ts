/**
 * Guest-side DAMON reclaim of microVMs on a real guest kernel (issue 23's acceptance,
 * daemon/drivers/microvm/reclaim.ts, native/agent/damon.c): two dsecd instances in one run,
 * one with `[vm.reclaim] mode = "on"` (a DAMON pageout scheme in the guest, a swap disk,
 * free-page reporting), one with reclaim off (the control). In each, a guest of 256 MiB
 * keeps a 160 MiB buffer of incompressible bytes allocated, touched once and then left
 * alone (freeing it would let free-page reporting alone pass). With reclaim on, DAMON's
 * scheme applies in the guest (its applied-bytes stat above zero), the guest swaps the
 * buffer out, and the VMM's memory charge (its cgroup's usage) falls well below the
 * control's; the buffer's bytes are intact when read back (also in a machine snapshot's
 * restore, which carries the swap disk) and the sandbox answers exec.
 *
 * Needs a guest kernel with DAMON (Debian's 6.12: scripts/guest-kernel.sh; point the tests
 * at it with DSEC_TEST_GUEST_DIR while the default is another). No wall-clock bounds:
 * conditions are awaited with a generous hang detector; the numbers are printed.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { GUEST_KERNEL, IS_ROOT, REPO, TestDaemon, guestKernelConfig } from './harness.js';
import type { GuestReclaimRecord } from '../../daemon/drivers/microvm/reclaim.js';

const HAS_QEMU = existsSync('/usr/bin/qemu-system-x86_64');
const HAS_DAMON = existsSync(GUEST_KERNEL) && /^CONFIG_DAMON_SYSFS=y$/m.test(guestKernelConfig()) && /^CONFIG_DAMON_PADDR=y$/m.test(guestKernelConfig());

const MiB = 2 ** 20;
/** Guest RAM and the idle buffer in it (the example: most of the guest, touched once). */
const GUEST_MIB = 256;
const BUFFER_MIB = 160;
/** How much lower than the control's the reclaiming VMM's charge must get: well above noise (page cache, QEMU's heap), well below the buffer. */
const MARGIN_BYTES = 64 * MiB;
/** Hang detector for the reclaim to happen (TCG on a loaded 2-core host; DAMON needs min_age plus a few aggregation rounds, then the quota paces it). */
const HANG_MS = 15 * 60_000;

/** Settings of the reclaiming dsecd: short ages so the test does not wait a minute per step. */
const RECLAIM_ON = [
  '[vm]', 'accel = "tcg"',
  '[vm.reclaim]', 'mode = "on"', 'swap = "disk"', 'min_age_s = 10', 'sample_ms = 50', 'aggr_ms = 1000',
  'cpu_ms_per_s = 200', `bytes_per_s = ${256 * MiB}`,
].join('\n');

async function sleep(ms: number): Promise<void> {
  await new Promise((r) => setTimeout(r, ms));
}

describe.skipIf(!IS_ROOT || !HAS_QEMU || !HAS_DAMON)('microvm guest reclaim: DAMON pageout + swap disk + free-page reporting', () => {
  let on: TestDaemon;
  let off: TestDaemon;
  let memhog: Buffer;
  let tmp: string;
  beforeAll(async () => {
    tmp = mkdtempSync(path.join(os.tmpdir(), 'dsec-reclaim-'));
    await execa('gcc', ['-static', '-O2', '-o', path.join(tmp, 'memhog'), path.join(REPO, 'test/fixtures/memhog.c')]);
    memhog = readFileSync(path.join(tmp, 'memhog'));
    [on, off] = await Promise.all([
      TestDaemon.start({ slot: 97, config: RECLAIM_ON }),
      TestDaemon.start({ slot: 98, config: '[vm]\naccel = "tcg"\n' }),
    ]);
  });
  afterAll(async () => {
    await Promise.all([on?.cleanup(), off?.cleanup()]);
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  /** Creates a microVM, installs memhog and starts it holding the buffer; returns the sandbox id and memhog's guest pid. */
  async function hog(d: TestDaemon): Promise<{ id: string; pid: number }> {
    const sb = await d.client.createSandbox({ image: 'busybox', backend: 'microvm', memory_bytes: GUEST_MIB * MiB });
    const inst = await d.client.exec(sb.id, { argv: ['sh', '-c', 'cat > /tmp/memhog && chmod +x /tmp/memhog'], stdin: memhog });
    expect(inst.exit_code, inst.stderr.toString()).toBe(0);
    const r = await d.client.exec(sb.id, { argv: ['/tmp/memhog', String(BUFFER_MIB), '/tmp/memhog.result'] });
    expect(r.exit_code, r.stderr.toString()).toBe(0);
    const m = /^ready (\d+) (\d+)$/m.exec(r.stdout.toString());
    expect(m, r.stdout.toString()).not.toBeNull();
    return { id: sb.id, pid: Number(m![1]) };
  }

  it('the reclaiming guest pages its idle buffer out (DAMON applied bytes > 0) and its VMM\'s charge falls against the control; exec and the buffer survive', async () => {
    const [a, b] = await Promise.all([hog(on), hog(off)]);
    const charge = async (d: TestDaemon, id: string) => (await d.client.sandboxStats(id)).memory_bytes!;
    const start = { on: await charge(on, a.id), off: await charge(off, b.id) };
    // Both guests hold the buffer: each VMM is charged for it.
    expect(start.on).toBeGreaterThan(BUFFER_MIB * MiB);
    expect(start.off).toBeGreaterThan(BUFFER_MIB * MiB);

    // The record the reclaiming dsecd wrote at boot: the scheme runs on a swap disk.
    const recFile = path.join(on.root, 'sandboxes', a.id, 'guest-reclaim.json');
    const record = () => JSON.parse(readFileSync(recFile, 'utf8')) as GuestReclaimRecord;
    expect(record()).toMatchObject({ started: true, reason: null, swap: { kind: 'disk', bytes: GUEST_MIB * MiB } });
    expect(existsSync(path.join(off.root, 'sandboxes', b.id, 'guest-reclaim.json'))).toBe(false);

    // Wait (hang detector only) until DAMON applied its scheme and the charge fell below the control's by the margin.
    const t0 = Date.now();
    let last = { on: start.on, off: start.off, applied: 0 };
    for (;;) {
      const [con, coff] = [await charge(on, a.id), await charge(off, b.id)]; // a stats read also refreshes the guest's DAMON stats
      const applied = record().stats?.bytesApplied ?? 0;
      last = { on: con, off: coff, applied };
      if (applied > 0 && con < coff - MARGIN_BYTES) break;
      if (Date.now() - t0 > HANG_MS) {
        throw new Error(`no reclaim after ${HANG_MS} ms: ${JSON.stringify(last)}; record ${JSON.stringify(record())}; agent log:\n${readFileSync(path.join(on.root, 'sandboxes', a.id, 'agent.log'), 'utf8').slice(-3000)}`);
      }
      await sleep(2000);
    }
    const tMet = Date.now();
    // For the numbers: let the guest finish paging the buffer out and free-page reporting
    // catch up (its 2 MiB blocks are reported some seconds after they are freed): until the
    // charge stopped falling over three polls.
    const series = [last.on];
    for (;;) {
      await sleep(5000);
      series.push(await charge(on, a.id));
      const n = series.length;
      if (n >= 4 && series[n - 4] - series[n - 1] < 2 * MiB) break;
      if (Date.now() - t0 > HANG_MS) break;
    }
    last = { on: series.at(-1)!, off: await charge(off, b.id), applied: record().stats?.bytesApplied ?? 0 };
    expect(last.on).toBeLessThan(last.off - MARGIN_BYTES);
    const rec = record();
    expect(rec.stats!.bytesApplied).toBeGreaterThan(0);
    expect(rec.stats!.nrApplied).toBeGreaterThan(0);
    expect(rec.stats!.swapTotalBytes).toBeGreaterThan(0);
    // The guest swapped the buffer out (its swap is in use), the control has no swap at all.
    const swapped = rec.stats!.swapTotalBytes - rec.stats!.swapFreeBytes;
    expect(swapped).toBeGreaterThan(0);
    const ctl = await off.client.exec(b.id, { argv: ['sh', '-c', 'grep -E "^Swap(Total|Free)" /proc/meminfo'] });
    expect(ctl.stdout.toString()).toMatch(/SwapTotal:\s+0 kB/);

    // A machine snapshot of the swapped-out guest carries its swap disk: the restored
    // machine reads the buffer back intact from the copy (its RAM refers to those slots).
    const snap = await on.client.snapshot(a.id, { name: 'swapped' });
    expect(existsSync(path.join(on.root, 'snapshots', snap.id, 'swap.raw'))).toBe(true);
    const restored = await on.client.restore('swapped');
    const readBack = (id: string) => on.client.exec(id, { argv: ['sh', '-c', `rm -f /tmp/memhog.result; kill -USR1 ${a.pid}; i=0; while [ ! -s /tmp/memhog.result ] && [ $i -lt 6000 ]; do sleep 0.1; i=$((i+1)); done; cat /tmp/memhog.result`] });
    const rb = await readBack(restored.id);
    expect(rb.stdout.toString().trim()).toBe(`ok ${BUFFER_MIB * MiB}`);
    await on.client.deleteSandbox(restored.id, { force: true });

    // The sandbox answers exec, and the buffer reads back intact from swap.
    const ex = await readBack(a.id);
    expect(ex.exit_code).toBe(0);
    expect(ex.stdout.toString().trim()).toBe(`ok ${BUFFER_MIB * MiB}`);
    const vmswap = await on.client.exec(a.id, { argv: ['sh', '-c', `grep VmSwap /proc/${a.pid}/status`] });
    console.log(`guest reclaim (TCG, ${GUEST_MIB} MiB guests, ${BUFFER_MIB} MiB idle buffer): margin reached after ${((tMet - t0) / 1000).toFixed(0)} s, settled after ${((Date.now() - t0) / 1000).toFixed(0)} s; `
      + `VMM charge with reclaim ${(start.on / MiB).toFixed(0)} -> ${(last.on / MiB).toFixed(0)} MiB, control ${(start.off / MiB).toFixed(0)} -> ${(last.off / MiB).toFixed(0)} MiB `
      + `(${(((last.off - last.on) / last.off) * 100).toFixed(0)}% less); DAMON applied ${(rec.stats!.bytesApplied / MiB).toFixed(0)} MiB in ${rec.stats!.nrApplied} regions `
      + `(tried ${(rec.stats!.bytesTried / MiB).toFixed(0)} MiB, quota exceeded ${rec.stats!.quotaExceeds}x); guest swap used ${(swapped / MiB).toFixed(0)} MiB; `
      + `memhog after read-back: ${vmswap.stdout.toString().trim()}; swap file allocated ${((await swapAllocated(on, a.id)) / MiB).toFixed(0)} MiB (load ${os.loadavg()[0].toFixed(1)})`);
    await Promise.all([on.client.deleteSandbox(a.id, { force: true }), off.client.deleteSandbox(b.id, { force: true })]);
    await on.client.deleteSnapshot(snap.id);
  }, HANG_MS + 10 * 60_000);
});

/** Host disk blocks the guest's swap file holds (it is sparse; discards punch holes), bytes. */
async function swapAllocated(d: TestDaemon, id: string): Promise<number> {
  const r = await execa('stat', ['-c', '%b %B', path.join(d.root, 'sandboxes', id, 'swap.raw')], { reject: false });
  const [blocks, size] = String(r.stdout).trim().split(' ').map(Number);
  return blocks * size;
}
