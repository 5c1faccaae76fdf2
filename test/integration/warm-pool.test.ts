/**
 * Warm pools (daemon/sandbox/warm-pool.ts): a create that matches a ready shell claims it
 * and gets a sandbox indistinguishable from a fresh one (its own id, hostname and uid
 * range, the request's labels, env, limits and creation time, an untouched writable
 * layer); the pool refills; requests a shell cannot take on are created fresh; shells
 * are hidden from listings; and shells are reclaimed at shutdown and after a SIGKILL,
 * leaving every host trace in agreement with the store.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, TestDaemon, runCli } from './harness.js';

/** Shells the test's pool keeps ready. */
const SIZE = 2;

describe.skipIf(!IS_ROOT)('warm pools', () => {
  let d: TestDaemon;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 12, config: `[pool]\n[[pool.entries]]\nimage = "busybox"\nsize = ${SIZE}\n` });
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  /** The busybox pool's counters from host info. */
  async function poolStats() {
    const p = (await d.client.hostInfo()).warm_pools;
    expect(p.length).toBe(1);
    return p[0];
  }

  /** Waits (no bound but the test's timeout) until the pool has `SIZE` shells ready and none filling. */
  async function filled(): Promise<void> {
    for (;;) {
      const s = await poolStats();
      if (s.ready === SIZE && s.filling === 0) return;
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** Rows that are not user sandboxes: the shells. */
  async function shellIds(): Promise<string[]> {
    const users = new Set((await d.client.listSandboxes()).map((s) => s.id));
    return (await d.traces()).rows.filter((id) => !users.has(id));
  }

  /** Every host trace names exactly the store's rows (users and shells), all running. */
  async function assertAgree(): Promise<void> {
    const t = await d.traces();
    expect(t.runtime).toEqual(t.rows);
    expect(t.cgroups).toEqual(t.rows);
    expect(t.dirs).toEqual(t.rows);
    expect(t.store).toEqual(t.rows);
    expect(t.uidRanges).toBe(t.rows.length);
    expect(t.mounts.map((m) => m.split('/').slice(-2, -1)[0]).sort()).toEqual(t.rows);
  }

  it('a matching create claims a shell and gets a fresh sandbox with its own settings', async () => {
    await filled();
    const shells = await shellIds();
    expect(shells.length).toBe(SIZE);
    // Shells are not sandboxes of anyone: not listed, not in stats.
    expect(await d.client.listSandboxes()).toEqual([]);
    expect((await d.client.stats()).sandboxes).toEqual([]);

    const before = Date.now();
    const sb = await d.client.createSandbox({
      image: 'busybox', labels: { job: 'a' }, env: { FOO: 'bar' }, cpus: 0.5, memory_bytes: 100 * 1024 * 1024, pids: 50, ttl_s: 3600,
    });
    expect(shells).toContain(sb.id);
    const s = await poolStats();
    expect(s.claimed).toBe(1);
    // The request's settings, not the shell's.
    expect(sb.labels).toEqual({ job: 'a' });
    expect(sb.state).toBe('running');
    expect(sb.created_at).toBeGreaterThanOrEqual(before);
    expect(sb.ttl_s).toBe(3600);
    expect(sb.cpus).toBe(0.5);
    expect(sb.memory_bytes).toBe(100 * 1024 * 1024);
    expect(sb.pids).toBe(50);
    expect((await d.client.listSandboxes()).map((x) => x.id)).toEqual([sb.id]);
    const r = await d.client.exec(sb.id, { argv: ['sh', '-c', 'echo "$FOO $(hostname)"; find /tmp /root -mindepth 1 | wc -l; id -u'] });
    expect(r.stdout.toString()).toBe(`bar ${sb.id}\n0\n0\n`);
    // Limits written to the cgroup at the claim.
    const cg = await d.cgroups();
    const st = await cg.stats(sb.id);
    expect(st.memoryLimitBytes).toBe(100 * 1024 * 1024);
    expect(st.pidsLimit).toBe(50);
    const cpuDir = cg.sandboxPaths(sb.id).cpu;
    if (cg.version === 1) expect(readFileSync(path.join(cpuDir, 'cpu.cfs_quota_us'), 'utf8').trim()).toBe('50000');
    else expect(readFileSync(path.join(cg.sandboxPaths(sb.id).unified ?? cpuDir, 'cpu.max'), 'utf8').trim()).toBe('50000 100000');
    // Its own uid range, like any sandbox; the event log says it was created.
    expect(sb.uid_base).not.toBeNull();
    const evs = [];
    for await (const e of d.client.events({ follow: false })) evs.push(e);
    expect(evs.filter((e) => e.type === 'sandbox.created').map((e) => e.sandbox_id)).toEqual([sb.id]);

    // The pool refills to its size in the background.
    await filled();
    // `dsec host info` shows the pool.
    const info = await runCli(d, ['host', 'info']);
    expect(info.code).toBe(0);
    expect(info.stdout).toMatch(/WARM POOL[\s\S]*busybox\s+none\s+2\s+2\s+0\s+1\s/);
    const again = await shellIds();
    expect(again.length).toBe(SIZE);
    expect(again).not.toContain(sb.id);
    await assertAgree();
    await d.client.deleteSandbox(sb.id, { force: true });
  });

  it('creates a shell cannot serve are created fresh; a drained pool falls back to fresh creates', async () => {
    await filled();
    const shells = await shellIds();
    const batch = await d.client.createSandbox({ image: 'busybox', priority: 'batch' });
    const seccomp = await d.client.createSandbox({ image: 'busybox', seccomp: { deny: ['chroot'] } });
    expect(shells).not.toContain(batch.id);
    expect(shells).not.toContain(seccomp.id);
    // SIZE + 1 creates at once: SIZE claim shells, the rest are fresh.
    const made = await Promise.all(Array.from({ length: SIZE + 1 }, () => d.client.createSandbox({ image: 'busybox' })));
    expect(made.filter((m) => shells.includes(m.id)).length).toBe(SIZE);
    for (const m of made) expect((await d.client.exec(m.id, { argv: ['true'] })).exit_code).toBe(0);
    expect((await poolStats()).misses).toBeGreaterThanOrEqual(1);
    for (const m of [batch, seccomp, ...made]) await d.client.deleteSandbox(m.id, { force: true });
  });

  it('shells are reclaimed at shutdown and after a SIGKILL; nothing leaks', async () => {
    await filled();
    const keep = await d.client.createSandbox({ image: 'busybox', labels: { keep: '1' } });
    await filled();
    // SIGTERM: shutdown destroys the shells, user sandboxes stay.
    await d.stop();
    let t = await d.traces();
    expect(t.rows).toEqual([keep.id]);
    expect(t.runtime).toEqual([keep.id]);
    expect(t.cgroups).toEqual([keep.id]);
    expect(t.dirs).toEqual([keep.id]);
    expect(t.store).toEqual([keep.id]);
    expect(t.uidRanges).toBe(1);
    await d.launch();
    await filled();
    const old = await shellIds();
    // SIGKILL: the shells stay on the host until the next start destroys them.
    await d.kill9();
    await d.launch({ DSEC_LOG_LEVEL: 'info' });
    // The start's report names the user sandbox as adopted and the shells apart (they are destroyed, not adopted).
    const rep = JSON.parse(d.stderr.split('\n').find((l) => l.includes('"reconciled store with host"'))!);
    expect(rep.adopted).toEqual([keep.id]);
    expect([...rep.shells].sort()).toEqual([...old].sort());
    const now = (await d.traces()).rows;
    for (const id of old) expect(now).not.toContain(id);
    expect(now).toContain(keep.id);
    await filled();
    await assertAgree();
    expect((await d.client.exec(keep.id, { argv: ['true'] })).exit_code).toBe(0);
    await d.client.deleteSandbox(keep.id, { force: true });
    await d.stop();
    t = await d.traces();
    expect(t).toEqual({ mounts: [], cgroups: [], runtime: [], dirs: [], rows: [], uidRanges: 0, store: [] });
  });
});
