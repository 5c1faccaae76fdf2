/**
 * Batched create through the gateway (gateway/batch.ts): real etcd, three dsecd hosts
 * each in a network namespace of its own admitting at most 5 sandboxes, two gateways
 * (test/fixtures/fleet.ts).
 *
 * - A batch of 12 is placed across the hosts, none past its admission limit, and answered
 *   per sandbox in request order.
 * - The same batch retried with the same Idempotency-Key through the other gateway
 *   answers the same sandboxes (the per-sandbox keys' etcd records name their hosts).
 * - A batch larger than the room left makes what fits and answers ResourceExhausted for
 *   the rest; no host goes past its limit.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT } from './harness.js';
import { TestFleet } from '../fixtures/fleet.js';

const run = IS_ROOT ? describe : describe.skip;
/** Admission's sandbox limit of every host. */
const MAX = 5;

run('batched create through the gateway', () => {
  const f = TestFleet.create({ gateways: 2, hostConfig: `[admission]\nmax_sandboxes = ${MAX}\n` });

  beforeAll(() => f.up(), 300_000);
  afterAll(() => f.stop(), 240_000);

  /** Sandboxes per host, from the gateway's merged list. */
  async function perHost(): Promise<Map<string, number>> {
    const l = await f.request('GET', '/v1/sandboxes');
    const m = new Map<string, number>();
    for (const s of l.json.sandboxes as Array<{ host: string }>) m.set(s.host, (m.get(s.host) ?? 0) + 1);
    return m;
  }

  it('places a batch across the hosts, within each host\'s limit, answered per sandbox in order; a keyed retry through the other gateway answers the same', async () => {
    const key = randomUUID();
    const items = Array.from({ length: 12 }, (_, i) => ({ image: 'busybox', labels: { job: 'fb', i: String(i) } }));
    const a = await f.request('POST', '/v1/sandboxes:batch', { json: { items }, headers: { 'idempotency-key': key }, gateway: 1 });
    expect(a.status, a.body).toBe(200);
    expect(a.json).toMatchObject({ created: 12, failed: 0 });
    expect(a.json.results.map((r: { sandbox: { labels: { i: string } } }) => r.sandbox.labels.i)).toEqual(items.map((x) => x.labels.i));
    const hosts = await perHost();
    expect(hosts.size).toBe(3);
    for (const n of hosts.values()) expect(n).toBeLessThanOrEqual(MAX);
    const b = await f.request('POST', '/v1/sandboxes:batch', { json: { items }, headers: { 'idempotency-key': key }, gateway: 2 });
    expect(b.status, b.body).toBe(200);
    expect(b.json.results.map((r: { sandbox: { id: string } }) => r.sandbox.id)).toEqual(a.json.results.map((r: { sandbox: { id: string } }) => r.sandbox.id));
    expect((await f.request('GET', '/v1/sandboxes?selector=job%3Dfb')).json.sandboxes.length).toBe(12);
  }, 300_000);

  /**
   * Waits until every host's load report was taken after `t` (ms since the epoch): the
   * gateway counts a sandbox it placed until a report taken after its answer includes it
   * (gateway/table.ts), so before that its view holds the batch twice.
   */
  async function reportedAfter(t: number): Promise<void> {
    for (;;) {
      const r = await f.request('GET', '/v1/hosts');
      if ((r.json.hosts as Array<{ reported_at: number | null }>).every((h) => (h.reported_at ?? 0) > t)) return;
      await new Promise((res) => setTimeout(res, 200));
    }
  }

  it('makes what fits of a batch larger than the room left and refuses the rest per sandbox', async () => {
    await reportedAfter(Date.now());
    const r = await f.request('POST', '/v1/sandboxes:batch', { json: { count: 6, spec: { labels: { job: 'over' } } } });
    expect(r.status, r.body).toBe(200);
    expect(r.json, r.body).toMatchObject({ created: 3 * MAX - 12, failed: 6 - (3 * MAX - 12) });
    for (const x of r.json.results.filter((y: { error?: unknown }) => y.error)) expect(x.error.code).toBe('ResourceExhausted');
    const hosts = await perHost();
    expect([...hosts.values()].reduce((s, n) => s + n, 0)).toBe(3 * MAX);
    for (const n of hosts.values()) expect(n).toBeLessThanOrEqual(MAX);
  }, 300_000);

  it('refuses a malformed batch whole', async () => {
    const r = await f.request('POST', '/v1/sandboxes:batch', { json: { count: 1001 } });
    expect(r.status, r.body).toBe(400);
    expect(r.json.error.code).toBe('InvalidArgument');
  }, 60_000);
});
