/**
 * Two dsecd instances on one host, side by side: neither lists, reclaims nor touches
 * the other's sandboxes, including across SIGKILL and restart; overlapping uid pools
 * and a second daemon on one root are refused.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import path from 'node:path';
import { execa } from 'execa';
import { IS_ROOT, REPO, TestDaemon } from './harness.js';

describe.skipIf(!IS_ROOT)('instances are isolated from each other', () => {
  let a: TestDaemon;
  let b: TestDaemon;
  beforeAll(async () => {
    [a, b] = await Promise.all([TestDaemon.start({ slot: 5 }), TestDaemon.start({ slot: 6 })]);
  });
  afterAll(async () => {
    await Promise.all([a?.cleanup(), b?.cleanup()]);
  });

  it('have distinct instance names, cgroup parents and runtime state', async () => {
    const [ha, hb] = await Promise.all([a.client.hostInfo(), b.client.hostInfo()]);
    expect(ha.instance).not.toBe(hb.instance);
    for (const k of Object.keys(ha.cgroup.parents)) expect(ha.cgroup.parents[k]).not.toBe(hb.cgroup.parents[k]);
    expect(ha.uid_pool.base).not.toBe(hb.uid_pool.base);
  });

  it('never see or reclaim each other\'s sandboxes, even across SIGKILL and restart', async () => {
    const sa = await a.client.createSandbox({ image: 'busybox' });
    const sb = await b.client.createSandbox({ image: 'busybox' });
    expect((await a.client.listSandboxes()).map((s) => s.id)).toEqual([sa.id]);
    expect((await b.client.listSandboxes()).map((s) => s.id)).toEqual([sb.id]);
    await expect(a.client.getSandbox(sb.id)).rejects.toMatchObject({ code: 'NotFound' });

    // Kill A hard and restart it while B runs: A's orphan sweep must leave B alone.
    await a.kill9();
    await a.launch();
    await b.kill9();
    await b.launch();
    const [ga, gb] = await Promise.all([a.client.getSandbox(sa.id), b.client.getSandbox(sb.id)]);
    expect(ga).toMatchObject({ state: 'running', init_pid: sa.init_pid });
    expect(gb).toMatchObject({ state: 'running', init_pid: sb.init_pid });
    expect((await b.client.exec(sb.id, { argv: ['echo', 'b'] })).stdout.toString()).toBe('b\n');
    expect((await a.client.exec(sa.id, { argv: ['echo', 'a'] })).stdout.toString()).toBe('a\n');

    // Destroying everything in A leaves B's sandbox, cgroups and mounts in place.
    await a.client.deleteSandbox(sa.id, { force: true });
    const tb = await b.traces();
    expect(tb.cgroups).toEqual([sb.id]);
    expect(tb.runtime).toEqual([sb.id]);
    expect(tb.mounts.length).toBe(1);
    await b.client.deleteSandbox(sb.id, { force: true });
  });

  it('refuse a second daemon on the same root and an overlapping uid pool', async () => {
    const dup = await TestDaemon.start({ slot: 5, samePoolAs: a }).then((d) => d, (e: Error) => e);
    if (dup instanceof TestDaemon) await dup.cleanup(); // a daemon that should not have started must not outlive the test
    expect(dup).toBeInstanceOf(Error);
    expect((dup as Error).message).toMatch(/overlaps instance/);
    // Same root (so same instance name) on another socket: refused before touching anything.
    const r = await execa(process.execPath, [path.join(REPO, 'bin/dsecd'), '--root', a.root, '--socket', path.join(a.root, 'other.sock'), '--config', path.join(a.root, 'dsecd.toml')], { reject: false, timeout: 60_000 });
    expect(r.exitCode).toBe(1);
    expect(String(r.stderr)).toMatch(/already running/);
    expect((await a.client.version()).api).toBe('v1');
  });
});
