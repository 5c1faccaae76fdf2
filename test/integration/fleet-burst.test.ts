/**
 * Bursting (issue 21): real etcd, three dsecd hosts in their own network namespaces, one
 * gateway (test/fixtures/fleet.ts). h1 and h2 are the primary pool, h3 is labelled
 * `pool=burst`; every host admits at most 5 sandboxes, so the primary pool holds 10 and
 * the default threshold (80%) is crossed above 8. Asserted: below the threshold even a
 * create that allows bursting never goes to h3; above it a create that does not allow
 * bursting never goes there either (and a full primary pool answers ResourceExhausted
 * naming the closed burst pool and the sandbox limit); one that allows it does;
 * `GET /v1/hosts` (`dsec hosts`) shows which pool holds what and that bursting is open.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT } from './harness.js';
import { TestFleet } from '../fixtures/fleet.js';

const run = IS_ROOT ? describe : describe.skip;

run('fleet bursting: pool=burst hosts take creates only above the primary threshold and only when allowed', () => {
  const f = TestFleet.create({ labels: { h3: { pool: 'burst' } }, hostConfig: '[admission]\nmax_sandboxes = 5\n' });
  const hostOf = new Map<string, string>();

  beforeAll(() => f.up(), 300_000);
  afterAll(() => f.stop(), 180_000);

  /** Waits until the hosts' reports hold `n` sandboxes in all, so the gateway's view counts each once. */
  async function settled(n: number): Promise<any> {
    for (;;) {
      const r = await f.request('GET', '/v1/hosts');
      const total = (r.json.hosts as Array<{ admitted: { count: number } }>).reduce((a, h) => a + h.admitted.count, 0);
      if (total === n) return r.json;
      await new Promise((res) => setTimeout(res, 200));
    }
  }

  async function create(i: number, allow: boolean) {
    const r = await f.request('POST', '/v1/sandboxes', { json: { image: 'busybox', labels: { b: String(i) } }, headers: allow ? { 'x-dsec-burst': 'allow' } : {} });
    if (r.status === 201) {
      const l = await f.request('GET', `/v1/sandboxes?selector=b%3D${i}`);
      hostOf.set(r.json.id, l.json.sandboxes[0].host);
      return { ...r, host: l.json.sandboxes[0].host as string };
    }
    return { ...r, host: null };
  }

  it('below the threshold, creates that allow bursting stay on the primary pool', async () => {
    for (let i = 0; i < 7; i++) {
      const r = await create(i, true);
      expect(r.status, r.body).toBe(201);
      expect(['h1', 'h2']).toContain(r.host);
      await settled(i + 1);
    }
    const v = await settled(7);
    expect(v.burst).toMatchObject({ threshold: 0.8, open: false });
    expect(v.burst.primary_utilisation).toBeCloseTo(0.7, 5);
  }, 300_000);

  it('above it, creates that do not allow bursting never go to the burst host; a full primary pool refuses them at once', async () => {
    for (let i = 7; i < 10; i++) {
      const r = await create(i, false);
      expect(r.status, r.body).toBe(201);
      expect(['h1', 'h2']).toContain(r.host);
      await settled(i + 1);
    }
    const full = await create(10, false);
    expect(full.status, full.body).toBe(429);
    expect(full.json.error.message).toMatch(/1 in the burst pool \(closed/);
    expect(full.json.error.message).toMatch(/2 without room .*2 at their sandbox limit/);
  }, 300_000);

  it('above it, creates that allow bursting go to the burst host; dsec hosts shows which pool holds what', async () => {
    for (let i = 11; i < 13; i++) {
      const r = await create(i, true);
      expect(r.status, r.body).toBe(201);
      expect(r.host).toBe('h3');
      await settled(i);
    }
    const v = await settled(12);
    expect(v.burst).toMatchObject({ threshold: 0.8, open: true });
    expect(v.pools).toEqual({ default: { hosts: 2, sandboxes: 10 }, burst: { hosts: 1, sandboxes: 2 } });
    for (const id of hostOf.keys()) expect((await f.request('DELETE', `/v1/sandboxes/${id}?force=true`)).status).toBe(200);
  }, 300_000);
});
