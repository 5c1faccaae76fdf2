/**
 * The host's reclaim of idle container sandboxes in a real dsecd (daemon/host/memory/
 * host-reclaim.ts): `--reclaim` and `[memory]` accepted (the flag wins) and reported in
 * GET /v1/host and `dsec host info`; a bad mode refused; an idle sandbox's page cache
 * reclaimed through this host's memory cgroups and counted in /metrics and its stats, while
 * one with an exec session running is not; the sandbox answers exec afterwards.
 *
 * DAMON: the daemon is pointed at a directory tree shaped like DAMON's sysfs holding a
 * kdamond dsecd did not create (test/fixtures/damon-sysfs.ts), so it must stand aside and
 * say why; the host's real DAMON is never written (docs/ARCHITECTURE.md, "The host side").
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import http from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { IS_ROOT, REPO, TestDaemon, err, out, runCli } from './harness.js';
import { buildDamonTree } from '../fixtures/damon-sysfs.js';

/** The metrics text on the daemon's socket. */
function metrics(d: TestDaemon): Promise<string> {
  return new Promise((resolve, reject) => {
    http.get({ socketPath: d.socket, path: '/metrics' }, (res) => {
      let b = '';
      res.on('data', (c) => (b += c));
      res.on('end', () => resolve(b));
    }).on('error', reject);
  });
}

describe.skipIf(!IS_ROOT)('host reclaim of idle container sandboxes', () => {
  let d: TestDaemon;
  let tree: string;
  beforeAll(async () => {
    tree = mkdtempSync(path.join(os.tmpdir(), 'dsec-damon-it-'));
    const damon = buildDamonTree(tree, { layout: '6.18', kdamonds: [{ state: 'on', pid: 4242, operations: 'paddr', schemes: 1, filters: 1 }] });
    d = await TestDaemon.start({
      slot: 23,
      config: `[memory]\nreclaim = "idle"\nidle_after_s = 3\nsweep_s = 1\ndamon_sysfs = "${damon}"\n`,
      args: ['--reclaim', 'aggressive'],
    });
  });
  afterAll(async () => {
    await d?.cleanup();
    rmSync(tree, { recursive: true, force: true });
  });

  it('refuses an unknown mode before starting', async () => {
    const r = await execa(process.execPath, [path.join(REPO, 'bin/dsecd'), '--root', path.join(tree, 'never'), '--reclaim', 'sometimes'], { reject: false });
    expect(r.exitCode).toBe(2);
    expect(r.stderr).toMatch(/--reclaim "sometimes": one of off, idle, aggressive/);
  });

  it('reports the mode (the flag over [memory]), the method of this host and why DAMON is not used', async () => {
    const h = await d.client.hostInfo();
    const m = h.memory_reclaim!;
    expect(m.mode).toBe('aggressive');
    expect(m.idle_after_s).toBe(3);
    expect(m.idle_cpu_permil).toBe(5);
    expect(m.method).toBe(h.cgroup.version === 2 ? 'memory.reclaim' : 'memory.force_empty');
    expect(m.damon.owned).toBe(false);
    expect(m.damon.reason).toMatch(/1 kdamond\(s\) exist that dsecd did not create \(kdamond 0: state on, pid 4242, operations paddr, 1 scheme\(s\)\)/);
    const cli = await runCli(d, ['host', 'info']);
    expect(cli.code).toBe(0);
    expect(cli.stdout).toMatch(new RegExp(`^reclaim +aggressive via ${m.method.replace('.', '\\.')}: \\d+ idle sandbox\\(es\\) \\(idle after 3 s, CPU at most 5‰ of a core\\)`, 'm'));
    expect(cli.stdout).toMatch(/^damon +not owned: 1 kdamond\(s\) exist that dsecd did not create/m);
  });

  it('reclaims an idle sandbox\'s page cache, counts it per sandbox and in total, and the sandbox answers exec after', async () => {
    // busy: the same page cache, and an exec session running the whole time (written
    // first, so without its exec counted it would be due before the idle one).
    const busy = await d.client.createSandbox({ image: 'busybox' });
    const wb = await d.client.exec(busy.id, { argv: ['sh', '-c', 'dd if=/dev/zero of=/root/cold bs=1M count=64 2>/dev/null; sync; echo ok'] });
    expect(out(wb)).toBe('ok\n');
    const session = await d.client.startExec(busy.id, { argv: ['sleep', '600'] });
    const sb = await d.client.createSandbox({ image: 'busybox' });
    // 64 MiB of page cache on the writable layer, written back so that it can be dropped.
    const w = await d.client.exec(sb.id, { argv: ['sh', '-c', 'dd if=/dev/zero of=/root/cold bs=1M count=64 2>&1 >/dev/null | grep -v records; sync && echo ok'] });
    expect(out(w), err(w)).toBe('ok\n');
    const series = new RegExp(`^dsec_sandbox_reclaimed_bytes\\{sandbox="${sb.id}"\\} (\\d+)$`, 'm');
    let text = await metrics(d);
    // Idle needs 3 s without an exec; poll the counter (the test's timeout bounds the wait).
    while (Number(series.exec(text)?.[1] ?? 0) < 48 * 2 ** 20) {
      await new Promise((r) => setTimeout(r, 500));
      text = await metrics(d);
    }
    const mine = Number(series.exec(text)![1]);
    const method = (await d.client.hostInfo()).memory_reclaim!.method;
    const total = Number(new RegExp(`^dsec_reclaimed_bytes_total\\{method="${method.replace('.', '\\.')}"\\} (\\d+)$`, 'm').exec(text)![1]);
    expect(total).toBeGreaterThanOrEqual(mine);
    expect((await d.client.hostInfo()).memory_reclaim!.reclaimed_bytes).toBeGreaterThanOrEqual(mine);
    const st = await d.client.sandboxStats(sb.id);
    expect(st.memory_bytes!).toBeLessThan(32 * 2 ** 20);
    // Its stats carry the same count and since when it is idle (no exec since the write).
    expect(st.reclaimed_bytes).toBeGreaterThanOrEqual(mine);
    expect(st.idle_since).toBeGreaterThan(sb.created_at);
    // The sandbox with an exec running was not touched, and is not idle.
    const sbusy = await d.client.sandboxStats(busy.id);
    expect(sbusy.reclaimed_bytes).toBe(0);
    expect(sbusy.idle_since).toBeNull();
    expect(new RegExp(`^dsec_sandbox_reclaimed_bytes\\{sandbox="${busy.id}"\\}`, 'm').test(text)).toBe(false);
    expect(session.state).toBe('running');
    await d.client.deleteSandbox(busy.id, { force: true });
    const r = await d.client.exec(sb.id, { argv: ['sh', '-c', 'wc -c < /root/cold'] });
    expect(out(r).trim()).toBe(String(64 * 2 ** 20));
    await d.client.deleteSandbox(sb.id, { force: true });
    // Destroyed: its series goes at the next sweep, the total stays.
    let after = await metrics(d);
    while (series.test(after)) {
      await new Promise((r) => setTimeout(r, 500));
      after = await metrics(d);
    }
    expect(Number(new RegExp(`^dsec_reclaimed_bytes_total\\{method="[^"]+"\\} (\\d+)$`, 'm').exec(after)![1])).toBe(total);
  }, 180_000);

  it('restarted without the flag, [memory] reclaim holds; without [memory], off', async () => {
    d.args = [];
    await d.restart();
    expect((await d.client.hostInfo()).memory_reclaim!.mode).toBe('idle');
    d.setConfig('');
    await d.restart();
    const m = (await d.client.hostInfo()).memory_reclaim!;
    expect(m.mode).toBe('off');
    expect(m.method).toBe('none');
    expect(m.reason).toMatch(/^reclaim = off/);
  });
});
