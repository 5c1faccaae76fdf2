/**
 * Batched create on dsecd (POST /v1/sandboxes:batch, daemon/api/routes/sandboxes-batch.ts):
 * answered per sandbox in request order; admission and the tenant quota apply per
 * sandbox, so a batch crossing a limit makes what fits and answers ResourceExhausted for
 * the rest, and no more sandboxes exist than the limit; a retry with the same
 * Idempotency-Key answers the same sandboxes; malformed batches are refused whole; the
 * sandboxes are the caller tenant's; a batch whose answer never reached its caller is
 * reaped at the acknowledgement deadline.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, TestDaemon, rejection, runCli } from './harness.js';
import { doorRequest, makeToken } from './remote-helpers.js';
import type { BatchCreateResult } from '../../sdk/index.js';

/** Admission's sandbox limit on the test's host. */
const MAX = 30;
/** The quota of tenant team-q. */
const QUOTA = 3;
/** `[remote] creates_per_minute`: each token's create budget over the TCP door. */
const BUDGET = 50;

describe.skipIf(!IS_ROOT)('batched create on dsecd', () => {
  let d: TestDaemon;
  let a: string, b: string, q: string;
  const as = (token: string, method: string, path: string, json?: unknown, headers?: Record<string, string>) =>
    doorRequest(d, { method, path, token, ...(json !== undefined ? { json } : {}), ...(headers ? { headers } : {}) });

  beforeAll(async () => {
    d = await TestDaemon.start({
      slot: 61, listen: true,
      config: `[admission]\nmax_sandboxes = ${MAX}\n[creates]\nack_timeout_s = 2\n[remote]\ncreates_per_minute = ${BUDGET}\n[quotas.tenants.team-q]\nsandboxes = ${QUOTA}\n`,
    });
    a = (await makeToken(d, 'team-a', 'user')).token;
    b = (await makeToken(d, 'team-b', 'user')).token;
    q = (await makeToken(d, 'team-q', 'user')).token;
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  /** Destroys every sandbox (as the local admin). */
  async function clear(): Promise<void> {
    for (const s of await d.client.listSandboxes()) await d.client.deleteSandbox(s.id, { force: true });
  }

  afterEach(async () => {
    await clear();
  });

  it('creates 20 in one request, answered per sandbox in request order', async () => {
    const items = Array.from({ length: 20 }, (_, i) => ({ image: 'busybox', labels: { job: 'b20', i: String(i) } }));
    const r = await d.client.createSandboxes({ items });
    expect(r).toMatchObject({ created: 20, failed: 0 });
    expect(r.results.map((x) => x.sandbox?.labels.i)).toEqual(items.map((x) => x.labels.i));
    expect(r.results.every((x) => x.sandbox?.state === 'running')).toBe(true);
    expect(new Set(r.results.map((x) => x.sandbox?.id)).size).toBe(20);
    // Each answers exec: a real running sandbox, not a row.
    const last = r.results[19].sandbox!;
    expect((await d.client.exec(last.id, { argv: ['true'] })).exit_code).toBe(0);
    expect((await d.client.listSandboxes({ selector: 'job=b20' })).length).toBe(20);
  });

  it('applies admission per sandbox: a batch crossing the limit makes what fits and refuses the rest', async () => {
    await d.client.createSandboxes({ count: MAX - 5, spec: { labels: { job: 'fill' } } });
    const r = await d.client.createSandboxes({ count: 12, spec: { labels: { job: 'over' } } });
    expect(r).toMatchObject({ created: 5, failed: 7 });
    for (const x of r.results.filter((y) => y.error)) expect(x.error!.code).toBe('ResourceExhausted');
    expect((await d.client.listSandboxes()).length).toBe(MAX);
    expect((await d.traces()).rows.length).toBe(MAX);
  });

  it('applies the tenant quota per sandbox', async () => {
    const res = await as(q, 'POST', '/v1/sandboxes:batch', { count: QUOTA + 3 });
    expect(res.status).toBe(200);
    const r = JSON.parse(res.body) as BatchCreateResult;
    expect(r).toMatchObject({ created: QUOTA, failed: 3 });
    for (const x of r.results.filter((y) => y.error)) expect(x.error).toMatchObject({ code: 'ResourceExhausted', message: expect.stringContaining('team-q') });
    expect((await d.client.listSandboxes()).filter((s) => s.tenant === 'team-q').length).toBe(QUOTA);
  });

  it('answers a retry with the same Idempotency-Key with the same sandboxes, making only those that failed', async () => {
    await d.client.createSandboxes({ count: MAX - 3, spec: { labels: { job: 'fill' } } });
    const key = `batch-${Date.now()}`;
    const first = await d.client.createSandboxes({ count: 5, spec: { labels: { job: 'keyed' } } }, { idempotencyKey: key });
    expect(first).toMatchObject({ created: 3, failed: 2 });
    // Room for the rest: the retry replays the 3 made and makes the 2 that failed.
    for (const s of await d.client.listSandboxes({ selector: 'job=fill' })) await d.client.deleteSandbox(s.id, { force: true });
    const again = await d.client.createSandboxes({ count: 5, spec: { labels: { job: 'keyed' } } }, { idempotencyKey: key });
    expect(again).toMatchObject({ created: 5, failed: 0 });
    for (const [i, x] of first.results.entries()) if (x.sandbox) expect(again.results[i].sandbox!.id).toBe(x.sandbox.id);
    const third = await d.client.createSandboxes({ count: 5, spec: { labels: { job: 'keyed' } } }, { idempotencyKey: key });
    expect(third.results.map((x) => x.sandbox!.id)).toEqual(again.results.map((x) => x.sandbox!.id));
    expect((await d.client.listSandboxes({ selector: 'job=keyed' })).length).toBe(5);
    // The same key with another request is refused per sandbox, as a single create's would be.
    const other = await d.client.createSandboxes({ count: 5, spec: { labels: { job: 'other' } } }, { idempotencyKey: key });
    expect(other.results.every((x) => x.error?.code === 'InvalidArgument')).toBe(true);
  });

  it('refuses an oversized or malformed batch whole, making nothing', async () => {
    const bad: unknown[] = [
      { count: 1001 },
      { items: Array.from({ length: 1001 }, () => ({})) },
      { count: 2, items: [{}] },
      {},
      { items: [] },
      { items: [{ image: 'busybox' }], spec: {} },
      { count: 2, keys: ['k1'] },
      { count: 1, spec: { no_such_field: 1 } },
    ];
    for (const body of bad) {
      const e = await rejection(d.client.createSandboxes(body as never));
      expect(e.code, JSON.stringify(body).slice(0, 80)).toBe('InvalidArgument');
    }
    const e = await rejection(d.client.createSandboxes({ count: 2 }, { idempotencyKey: 'x'.repeat(254) }));
    expect(e.code).toBe('InvalidArgument');
    expect(await d.client.listSandboxes()).toEqual([]);
  });

  it('makes the sandboxes the caller tenant\'s: another tenant cannot see them', async () => {
    const res = await as(a, 'POST', '/v1/sandboxes:batch', { count: 3, spec: { labels: { job: 'mine' } } });
    expect(res.status).toBe(200);
    const ids = (JSON.parse(res.body) as BatchCreateResult).results.map((x) => x.sandbox!.id);
    for (const id of ids) {
      expect(JSON.parse((await as(a, 'GET', `/v1/sandboxes/${id}`)).body).tenant).toBe('team-a');
      expect((await as(b, 'GET', `/v1/sandboxes/${id}`)).status).toBe(404);
      expect((await as(b, 'DELETE', `/v1/sandboxes/${id}?force=true`)).status).toBe(404);
    }
    const listed = (await as(b, 'GET', '/v1/sandboxes')).body;
    for (const id of ids) expect(listed.includes(id)).toBe(false);
    // B's own batch with the same key is B's: it does not replay A's.
    const key = { 'idempotency-key': 'same-key-two-tenants' };
    const ra = JSON.parse((await as(a, 'POST', '/v1/sandboxes:batch', { count: 1 }, key)).body) as BatchCreateResult;
    const rb = JSON.parse((await as(b, 'POST', '/v1/sandboxes:batch', { count: 1 }, key)).body) as BatchCreateResult;
    expect(rb.results[0].sandbox!.tenant).toBe('team-b');
    expect(rb.results[0].sandbox!.id).not.toBe(ra.results[0].sandbox!.id);
  });

  it('spends one create of the token\'s budget per sandbox of a batch', async () => {
    const t = (await makeToken(d, 'team-r', 'user')).token;
    const over = await as(t, 'POST', '/v1/sandboxes:batch', { count: BUDGET + 1 });
    expect(over.status, over.body).toBe(429);
    expect(JSON.parse(over.body).error.message).toMatch(/creates_per_minute/);
    expect(await d.client.listSandboxes()).toEqual([]);
  });

  it('dsec create -n N prints N ids in order; past the limit it reports each sandbox not made and exits 1', async () => {
    const r = await runCli(d, ['create', '-n', '3', '--label', 'job=cli']);
    expect(r.code, r.stderr).toBe(0);
    const ids = r.stdout.trim().split('\n');
    expect(ids.length).toBe(3);
    expect((await d.client.listSandboxes({ selector: 'job=cli' })).map((s) => s.id).sort()).toEqual([...ids].sort());
    const j = await runCli(d, ['--json', 'create', '-n', '2']);
    expect(JSON.parse(j.stdout)).toMatchObject({ created: 2, failed: 0 });
    const over = await runCli(d, ['create', '-n', String(MAX), '--label', 'job=cli-over']);
    expect(over.code).toBe(1);
    expect(over.stdout.trim().split('\n').length).toBe(MAX - 5);
    expect(over.stderr).toMatch(/sandbox \d+ of 30 not created: ResourceExhausted: host is at its limit of 30 sandboxes/);
    expect(await runCli(d, ['create', '-n', '1001'])).toMatchObject({ code: 125, stderr: expect.stringContaining('create count 1001 is more than 1000') });
  });

  it('reaps the sandboxes of a batch whose answer never reached its caller', async () => {
    const gone = new AbortController();
    const call = d.client.createSandboxes({ count: 4, spec: { labels: { job: 'lost' } } }, { signal: gone.signal, idempotencyKey: 'lost-batch' });
    // Abort once dsecd started making them; the batch runs on without its caller.
    for (;;) {
      if ((await d.traces()).rows.length > 0) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    gone.abort();
    await call.catch(() => undefined);
    // All 4 are made, then destroyed at the deadline (2 s) since no answer was delivered.
    const seen = new Set<string>();
    for (;;) {
      const now = await d.client.listSandboxes({ selector: 'job=lost' });
      for (const s of now) seen.add(s.id);
      if (seen.size === 4 && now.length === 0) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect((await d.traces()).rows).toEqual([]);
  });
});
