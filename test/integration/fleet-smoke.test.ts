import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT } from './harness.js';
import { TestFleet } from '../fixtures/fleet.js';

const run = IS_ROOT ? describe : describe.skip;
run('fleet smoke', () => {
  let f: TestFleet;
  beforeAll(async () => { f = await TestFleet.start(); }, 150_000);
  afterAll(async () => { await f?.stop(); }, 120_000);
  it('lists hosts and creates through the gateway', async () => {
    const h = await f.request('GET', '/v1/hosts');
    console.log(h.status, h.body.slice(0, 500));
    expect(h.status).toBe(200);
    const c = await f.request('POST', '/v1/sandboxes', { json: { image: 'busybox', labels: { job: 's' } } });
    console.log(c.status, c.body.slice(0, 300));
    expect(c.status).toBe(201);
    const e = await f.request('POST', `/v1/sandboxes/${c.json.id}/exec`, { json: { argv: ['echo', 'hi'] } });
    console.log(e.status, e.body.slice(0, 300));
    const l = await f.request('GET', '/v1/sandboxes');
    console.log(l.status, l.body.slice(0, 600));
    const d = await f.request('DELETE', `/v1/sandboxes/${c.json.id}?force=true`);
    console.log(d.status, d.body.slice(0, 200));
  }, 120_000);
});
