/**
 * Fleet-wide tenant quotas (issue 21, gateway/quotas.ts): real etcd, three dsecd hosts each
 * in a network namespace of its own, two gateways with `[quotas.tenants.demo] sandboxes = 10`.
 *
 * - A burst of 50 creates of tenant demo split over both gateways at once leaves exactly
 *   10 sandboxes in the fleet; every other create is refused with ResourceExhausted naming
 *   the quota.
 * - Destroying sandboxes through a gateway frees their share at once.
 * - A sandbox destroyed on its host's own socket, and a reservation whose gateway died
 *   (a `held` key under a lease that lapses), are freed by reconciliation.
 * Order of events is asserted, never time.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT } from './harness.js';
import { FLEET_PREFIX, TestFleet, type GatewayAnswer } from '../fixtures/fleet.js';

const run = IS_ROOT ? describe : describe.skip;
const QUOTA_RE = /tenant demo is at its fleet-wide quota of 10 sandboxes \(quotas\.tenants\.demo\.sandboxes\): it has 10, and a new sandbox would make 11; destroy some first/;

run('fleet-wide tenant quota held in etcd by two gateways', () => {
  const cfgDir = mkdtempSync(path.join(os.tmpdir(), 'dsec-gwq-'));
  const cfg = path.join(cfgDir, 'gateway.toml');
  writeFileSync(cfg, '[quotas.tenants.demo]\nsandboxes = 10\n');
  const f = TestFleet.create({ gateways: 2, gatewayArgs: ['--config', cfg] });

  beforeAll(() => f.up(), 300_000);
  afterAll(async () => {
    await f.stop();
    rmSync(cfgDir, { recursive: true, force: true });
  }, 240_000);

  const create = (gateway: number, job: string) => f.request('POST', '/v1/sandboxes', { json: { image: 'busybox', labels: { job } }, gateway });
  const listed = async (job: string) => (await f.request('GET', `/v1/sandboxes?selector=job%3D${job}`, { gateway: 2 })).json.sandboxes as Array<{ id: string; host: string }>;
  const usage = async () => JSON.parse((await f.etcdctl(['get', '--print-value-only', `${FLEET_PREFIX}/v1/quotas/demo/usage`])).trim()) as { count: number };

  it('a burst of 50 through two gateways at once leaves at most 10, the rest refused naming the quota', async () => {
    const answers: GatewayAnswer[] = await Promise.all(Array.from({ length: 50 }, (_, i) => create(1 + (i % 2), 'q')));
    const made = answers.filter((a) => a.status === 201);
    const refused = answers.filter((a) => a.status !== 201);
    for (const r of refused) {
      expect(r.status, r.body).toBe(429);
      expect(r.json.error.code).toBe('ResourceExhausted');
      expect(r.json.error.message).toMatch(QUOTA_RE);
    }
    expect(made).toHaveLength(10);
    const l = await listed('q');
    expect(l.map((s) => s.id).sort()).toEqual(made.map((a) => a.json.id).sort());
    expect((await usage()).count).toBe(10);
  }, 600_000);

  it('destroying through a gateway frees quota for new creates', async () => {
    const l = await listed('q');
    for (const s of l.slice(0, 3)) {
      const d = await f.request('DELETE', `/v1/sandboxes/${s.id}?force=true`, { gateway: 1 + (s.id.charCodeAt(15) % 2) });
      expect(d.status, d.body).toBe(200);
    }
    expect((await usage()).count).toBe(7);
    for (let i = 0; i < 3; i++) {
      const c = await create(2 - (i % 2), 'q');
      expect(c.status, c.body).toBe(201);
    }
    const over = await create(1, 'q');
    expect(over.status, over.body).toBe(429);
    expect(over.json.error.message).toMatch(QUOTA_RE);
    expect(await listed('q')).toHaveLength(10);
  }, 300_000);

  it('reconciliation frees a sandbox destroyed on its host and a reservation whose gateway died', async () => {
    // Destroyed on the host's own socket: no gateway saw it go.
    const [s] = await listed('q');
    await f.hosts.get(s.host)!.client.deleteSandbox(s.id, { force: true });
    // A reservation as a gateway makes it, under a lease that lapses (the gateway died before its create).
    const lease = /lease ([0-9a-f]+) granted/.exec(await f.etcdctl(['lease', 'grant', '2']))![1];
    await f.etcdctl(['put', `--lease=${lease}`, `${FLEET_PREFIX}/v1/quotas/demo/held/dead-gateway`, JSON.stringify({ count: 1, cpus: 1, memory_bytes: 1 })]);
    const u = await usage() as { count: number; cpus: number; memory_bytes: number };
    await f.etcdctl(['put', `${FLEET_PREFIX}/v1/quotas/demo/usage`, JSON.stringify({ count: u.count + 1, cpus: u.cpus + 1, memory_bytes: u.memory_bytes + 1 })]);
    // Refused while the count holds both; created once reconciliation has freed them.
    let refusals = 0;
    for (;;) {
      const c = await create(1 + (refusals % 2), 'q');
      if (c.status === 201) break;
      expect(c.status, c.body).toBe(429);
      expect(c.json.error.message).toMatch(/tenant demo is at its fleet-wide quota of 10 sandboxes \(quotas\.tenants\.demo\.sandboxes\): it has 1[01],/);
      refusals++;
      await new Promise((r) => setTimeout(r, 500));
    }
    expect(await listed('q')).toHaveLength(10);
    // The dead gateway's reservation is not counted once reconciled: the count equals the sandboxes.
    for (;;) {
      if ((await f.etcdctl(['get', '--prefix', '--keys-only', `${FLEET_PREFIX}/v1/quotas/demo/held/`])).trim() === '' && (await usage()).count === 10) break;
      await new Promise((r) => setTimeout(r, 500));
    }
    const over = await create(2, 'q');
    expect(over.status, over.body).toBe(429);
  }, 300_000);
});
