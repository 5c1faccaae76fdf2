/**
 * RL rounds: a job's sandboxes paused and resumed in one call with processes and open
 * files intact and page cache reclaimed; job leases that lapse (pause, then destroy,
 * across a restart); renewals racing the expiry; admission; idle timeout; bad input.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { IS_ROOT, TestDaemon } from './harness.js';

interface Bulk { results: { id: string; ok: boolean; state?: string; reclaim?: { file_before_bytes: number; file_after_bytes: number; swap: boolean; note: string }; error?: { code: string } }[] }

const until = async (what: string, fn: () => Promise<boolean>, ms = 30_000) => {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await fn()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`timed out waiting for ${what}`);
};

describe.skipIf(!IS_ROOT)('RL rounds', () => {
  let d: TestDaemon;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 22, config: '[defaults]\nmemory_bytes = 134217728\n[leases]\ndestroy_grace_s = 3\n' });
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('pauses and resumes a job of 50 sandboxes in one call; processes and open files survive; page cache is reclaimed', async () => {
    const sbs = [];
    for (let i = 0; i < 50; i++) sbs.push(await d.client.createSandbox({ image: 'busybox', labels: { job: 'big', round: '1' } }));
    const held: Record<string, { pid: number }> = {};
    await Promise.all(sbs.map(async (sb) => {
      // 8 MiB of page cache, and a process that keeps a file open.
      const r = await d.client.exec(sb.id, { argv: ['sh', '-c', 'head -c 8388608 /dev/urandom > /tmp/data; sleep 100000 < /tmp/data > /dev/null 2>&1 & echo $!'] });
      held[sb.id] = { pid: Number(r.stdout.toString().trim()) };
    }));
    const cg = await d.cgroups();
    const paused = await d.client.request<Bulk>('POST', '/v1/sandboxes/bulk', { selector: 'job=big', action: 'pause' });
    expect(paused.results.length).toBe(50);
    for (const r of paused.results) {
      expect(r).toMatchObject({ ok: true, state: 'paused' });
      expect(r.reclaim!.file_after_bytes).toBeLessThanOrEqual(r.reclaim!.file_before_bytes / 2);
      expect(r.reclaim!.note).toMatch(r.reclaim!.swap ? /swap/ : /no swap/);
      // The report matches memory.stat now (nothing changes while frozen).
      const stat = readFileSync(path.join(cg.sandboxPaths(r.id).memory, 'memory.stat'), 'utf8');
      expect(Number(/^total_cache (\d+)$/m.exec(stat)![1])).toBe(r.reclaim!.file_after_bytes);
      expect(readFileSync(path.join(cg.sandboxPaths(r.id).freezer, 'freezer.state'), 'utf8').trim()).toBe('FROZEN');
    }
    // Idempotent: pausing again reports no reclaim and no error.
    const again = await d.client.request<{ sandbox: { state: string }; reclaim: unknown }>('POST', `/v1/sandboxes/${sbs[0].id}/pause`);
    expect(again).toMatchObject({ sandbox: { state: 'paused' }, reclaim: null });
    await expect(d.client.exec(sbs[0].id, { argv: ['true'] })).rejects.toMatchObject({ code: 'FailedPrecondition' });

    const resumed = await d.client.request<Bulk>('POST', '/v1/sandboxes/bulk', { selector: 'job=big', action: 'resume' });
    expect(resumed.results.every((r) => r.ok && r.state === 'running')).toBe(true);
    await Promise.all(sbs.map(async (sb) => {
      const r = await d.client.exec(sb.id, { argv: ['sh', '-c', `kill -0 ${held[sb.id].pid} && readlink /proc/${held[sb.id].pid}/fd/0 && wc -c < /tmp/data`] });
      expect(r.stdout.toString()).toBe('/tmp/data\n8388608\n');
    }));
    const gone = await d.client.request<Bulk>('POST', '/v1/sandboxes/bulk', { selector: 'job=big', action: 'destroy' });
    expect(gone.results.every((r) => r.ok)).toBe(true);
  });

  it('a lapsed lease pauses the job, and destroys it after the grace period even across a restart', async () => {
    const sbs = await Promise.all([0, 1, 2].map(() => d.client.createSandbox({ image: 'busybox', labels: { job: 'leased' } })));
    const keep = await d.client.createSandbox({ image: 'busybox', labels: { job: 'other' } });
    await d.client.request('POST', '/v1/leases', { job: 'leased', ttl_s: 1 });
    await until('the job to be paused', async () => (await d.client.listSandboxes({ selector: 'job=leased' })).every((s) => s.state === 'paused'));
    await d.kill9();
    await d.launch();
    await until('the job to be destroyed', async () => (await d.client.listSandboxes({ selector: 'job=leased' })).length === 0);
    await expect(d.client.request('GET', '/v1/leases/leased')).rejects.toMatchObject({ code: 'NotFound' });
    expect((await d.client.getSandbox(keep.id)).state).toBe('running');
    const evs = [];
    for await (const e of d.client.events()) if (sbs.some((s) => s.id === e.sandbox_id) && e.type === 'sandbox.destroyed') evs.push(e);
    expect(evs.length).toBe(3);
    await d.client.deleteSandbox(keep.id, { force: true });
  });

  it('a renewal racing the expiry ends the same way each of 20 times: refused at or after expires_at, accepted before', async () => {
    for (let i = 0; i < 20; i++) {
      const job = `race${i}`;
      const l = await d.client.request<{ expires_at: number }>('POST', '/v1/leases', { job, ttl_s: 1 });
      // Before the expiry a renewal is accepted...
      const early = await d.client.request<{ expires_at: number }>('POST', `/v1/leases/${job}/renew`, {});
      expect(early.expires_at).toBeGreaterThanOrEqual(l.expires_at);
      // ...at or after it, whether or not the reaper has swept yet, it is refused.
      const wait = early.expires_at - Date.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      await expect(d.client.request('POST', `/v1/leases/${job}/renew`, {})).rejects.toMatchObject({ code: 'FailedPrecondition' });
      await d.client.request('DELETE', `/v1/leases/${job}`).catch(() => {});
    }
  });

  it('pauses a sandbox after its idle timeout, and an exec keeps it awake', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', idle_timeout_s: 2 });
    await until('the idle sandbox to pause', async () => (await d.client.getSandbox(sb.id)).state === 'paused', 15_000);
    await d.client.request('POST', `/v1/sandboxes/${sb.id}/resume`);
    expect((await d.client.exec(sb.id, { argv: ['echo', 'awake'] })).stdout.toString()).toBe('awake\n');
    await d.client.deleteSandbox(sb.id, { force: true });
  });

  it('bad input: unknown lease, resume of a destroyed sandbox, bad selector, TTL 0', async () => {
    await expect(d.client.request('POST', '/v1/leases/nope/renew', {})).rejects.toMatchObject({ code: 'NotFound' });
    await expect(d.client.request('POST', '/v1/sandboxes/0000000000000000/resume')).rejects.toMatchObject({ code: 'NotFound' });
    await expect(d.client.request('POST', '/v1/sandboxes/bulk', { selector: 'a b=c', action: 'pause' })).rejects.toMatchObject({ code: 'InvalidArgument' });
    await expect(d.client.request('POST', '/v1/sandboxes/bulk', { selector: 'job=x', action: 'set_ttl', ttl_s: 0 })).rejects.toMatchObject({ code: 'InvalidArgument' });
    await expect(d.client.createSandbox({ image: 'busybox', ttl_s: -1 })).rejects.toMatchObject({ code: 'InvalidArgument' });
  });
});

describe.skipIf(!IS_ROOT)('admission', () => {
  let d: TestDaemon;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 23, config: '[admission]\nmax_sandboxes = 2\n' });
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('refuses the sandbox over the limit cleanly', async () => {
    await d.client.createSandbox({ image: 'busybox' });
    await d.client.createSandbox({ image: 'busybox' });
    const before = await d.traces();
    await expect(d.client.createSandbox({ image: 'busybox' })).rejects.toMatchObject({ code: 'ResourceExhausted', message: expect.stringMatching(/max_sandboxes/) });
    expect(await d.traces()).toEqual(before);
  });
});
