import { afterEach, describe, expect, it } from 'vitest';
import { DsecApiError, DsecClient, isDsecApiError, type BulkResult } from '../../sdk/index.js';
import { sdkFixtures, fail, fakeLease, fakeReclaim, fakeSandbox, json, ok, startFakeDsecd, type FakeDsecd } from '../fixtures/fake-dsecd.js';

// The RL-round calls of the SDK (pause/resume, bulk, leases) against the fake dsecd
// (test/fixtures/fake-dsecd.ts): method, path, body and the shape handed back.

const fixtures = sdkFixtures();

async function setup(timeoutMs?: number): Promise<{ fake: FakeDsecd; client: DsecClient }> {
  const fake = await fixtures.fake();
  return { fake, client: fixtures.client(fake, timeoutMs) };
}

const ID = '0123456789abcdef';
const calls = (f: FakeDsecd) => f.seen.map((s) => `${s.method} ${s.path}`);

describe('pauseSandbox and resumeSandbox', () => {
  it('pause POSTs without a body and resolves with {sandbox, reclaim}', async () => {
    const { fake, client } = await setup();
    const body = { sandbox: fakeSandbox({ state: 'paused' }), reclaim: fakeReclaim() };
    fake.routes['POST /v1/sandboxes/:id/pause'] = ok(body);
    const r = await client.pauseSandbox(ID);
    expect(r).toEqual(body);
    expect(r.reclaim!.reclaimed_bytes).toBe(38 * 1024 ** 2);
    expect(calls(fake)).toEqual([`POST /v1/sandboxes/${ID}/pause`]);
    expect(fake.seen[0].text).toBe('');
  });

  it('pausing a paused sandbox resolves with reclaim null (idempotent)', async () => {
    const { fake, client } = await setup();
    fake.routes['POST /v1/sandboxes/:id/pause'] = ok({ sandbox: fakeSandbox({ state: 'paused' }), reclaim: null });
    expect((await client.pauseSandbox(ID)).reclaim).toBeNull();
  });

  it('resume POSTs and resolves with the Sandbox; ids are escaped', async () => {
    const { fake, client } = await setup();
    fake.routes['POST /v1/sandboxes/:id/resume'] = (req, res) => json(res, 200, fakeSandbox({ id: req.params.id }));
    expect((await client.resumeSandbox(ID)).state).toBe('running');
    expect((await client.resumeSandbox('a/b')).id).toBe('a/b');
    expect(calls(fake)).toEqual([`POST /v1/sandboxes/${ID}/resume`, 'POST /v1/sandboxes/a%2Fb/resume']);
  });

  it('a refusal is a DsecApiError of its kind', async () => {
    const { fake, client } = await setup();
    fake.routes['POST /v1/sandboxes/:id/pause'] = fail(412, 'FailedPrecondition', `sandbox ${ID} is stopped; only a running sandbox can be paused`);
    fake.routes['POST /v1/sandboxes/:id/resume'] = fail(404, 'NotFound', 'sandbox nope not found');
    const p = await client.pauseSandbox(ID).catch((e) => e);
    expect(p).toBeInstanceOf(DsecApiError);
    expect(p.code).toBe('FailedPrecondition');
    expect(p.status).toBe(412);
    expect(isDsecApiError(await client.resumeSandbox('nope').catch((e) => e), 'NotFound')).toBe(true);
  });
});

describe('bulk', () => {
  const results: BulkResult[] = [
    { id: 'aaa', ok: true, state: 'paused', reclaim: fakeReclaim() },
    { id: 'bbb', ok: false, error: { code: 'FailedPrecondition', message: 'sandbox bbb is stopped; only a running sandbox can be paused' } },
  ];

  it('sends the request as given and resolves with the results array (failures are results, not rejections)', async () => {
    const { fake, client } = await setup();
    fake.routes['POST /v1/sandboxes/bulk'] = ok({ results });
    expect(await client.bulk({ selector: 'job=a,round=3', action: 'pause' })).toEqual(results);
    fake.routes['POST /v1/sandboxes/bulk'] = ok({ results: [] });
    expect(await client.bulk({ selector: 'job=a', action: 'stop', timeout_ms: 0 })).toEqual([]);
    expect(await client.bulk({ selector: 'job=a', action: 'set_ttl', ttl_s: null })).toEqual([]);
    expect(fake.seen.map((s) => s.body)).toEqual([
      { selector: 'job=a,round=3', action: 'pause' },
      { selector: 'job=a', action: 'stop', timeout_ms: 0 },
      { selector: 'job=a', action: 'set_ttl', ttl_s: null },
    ]);
    expect(calls(fake).every((c) => c === 'POST /v1/sandboxes/bulk')).toBe(true);
    expect(fake.seen[0].headers['content-type']).toBe('application/json');
  });

  it("has no deadline by default (a bulk over many sandboxes takes long); opts.timeoutMs sets one", async () => {
    const { fake, client } = await setup(30);
    fake.routes['POST /v1/sandboxes/bulk'] = async (_req, res) => {
      await new Promise((r) => setTimeout(r, 120));
      json(res, 200, { results });
    };
    expect(await client.bulk({ selector: 'job=a', action: 'destroy' })).toEqual(results);
    const e = await client.bulk({ selector: 'job=a', action: 'destroy' }, { timeoutMs: 20 }).catch((x) => x);
    expect(isDsecApiError(e, 'DeadlineExceeded')).toBe(true);
  });

  it('an aborted signal stops waiting', async () => {
    const { fake, client } = await setup();
    fake.routes['POST /v1/sandboxes/bulk'] = async (_req, res) => {
      await new Promise((r) => setTimeout(r, 200));
      json(res, 200, { results });
    };
    const ac = new AbortController();
    const p = client.bulk({ selector: 'job=a', action: 'resume' }, { signal: ac.signal });
    setTimeout(() => ac.abort(), 10);
    expect((await p.catch((x) => x)).name).toBe('AbortError');
  });

  it("dsecd's InvalidArgument (empty or bad selector) rejects", async () => {
    const { fake, client } = await setup();
    fake.routes['POST /v1/sandboxes/bulk'] = fail(400, 'InvalidArgument', 'bulk operations need a non-empty selector (e.g. job=a,round=3)');
    const e = await client.bulk({ selector: ' ', action: 'destroy' }).catch((x) => x);
    expect(isDsecApiError(e, 'InvalidArgument')).toBe(true);
    expect(e.message).toMatch(/non-empty selector/);
  });
});

describe('leases', () => {
  it('putLease POSTs {job, ttl_s} to /v1/leases and resolves with the lease', async () => {
    const { fake, client } = await setup();
    const lease = fakeLease();
    fake.routes['POST /v1/leases'] = ok(lease);
    expect(await client.putLease('a', 600)).toEqual(lease);
    expect(calls(fake)).toEqual(['POST /v1/leases']);
    expect(fake.seen[0].body).toEqual({ job: 'a', ttl_s: 600 });
  });

  it('renewLease sends {} without a TTL and {ttl_s} with one; the job is escaped', async () => {
    const { fake, client } = await setup();
    fake.routes['POST /v1/leases/:job/renew'] = (req, res) => json(res, 200, fakeLease({ job: req.params.job }));
    expect((await client.renewLease('a')).job).toBe('a');
    expect((await client.renewLease('team/rl.1', { ttlS: 30 })).job).toBe('team/rl.1');
    expect(calls(fake)).toEqual(['POST /v1/leases/a/renew', 'POST /v1/leases/team%2Frl.1/renew']);
    expect(fake.seen.map((s) => s.body)).toEqual([{}, { ttl_s: 30 }]);
    expect(fake.seen[0].headers['content-type']).toBe('application/json');
  });

  it('a renewal refused after expiry is FailedPrecondition; an unknown job NotFound', async () => {
    const { fake, client } = await setup();
    fake.routes['POST /v1/leases/:job/renew'] = (req, res) =>
      req.params.job === 'old'
        ? json(res, 412, { error: { code: 'FailedPrecondition', message: 'lease of job old expired at 2026-01-01T00:00:00.000Z; its sandboxes are being reclaimed. Delete the lease and create a new one' } })
        : json(res, 404, { error: { code: 'NotFound', message: `no lease for job ${req.params.job}` } });
    const e = await client.renewLease('old').catch((x) => x);
    expect(isDsecApiError(e, 'FailedPrecondition')).toBe(true);
    expect(e.message).toMatch(/expired/);
    expect(isDsecApiError(await client.renewLease('x').catch((x) => x), 'NotFound')).toBe(true);
  });

  it('listLeases resolves with the array; getLease and deleteLease address one job', async () => {
    const { fake, client } = await setup();
    const leases = [fakeLease(), fakeLease({ job: 'b', lapsed_at: Date.now() - 1000, expires_at: Date.now() - 2000, sandboxes: 0 })];
    fake.routes['GET /v1/leases'] = ok({ leases });
    fake.routes['GET /v1/leases/:job'] = (req, res) => json(res, 200, fakeLease({ job: req.params.job }));
    fake.routes['DELETE /v1/leases/:job'] = (req, res) => json(res, 200, fakeLease({ job: req.params.job }));
    expect(await client.listLeases()).toEqual(leases);
    expect((await client.getLease('a/b')).job).toBe('a/b');
    expect((await client.deleteLease('b')).job).toBe('b');
    expect(calls(fake)).toEqual(['GET /v1/leases', 'GET /v1/leases/a%2Fb', 'DELETE /v1/leases/b']);
    fake.routes['GET /v1/leases/:job'] = fail(404, 'NotFound', 'no lease for job zz');
    expect(isDsecApiError(await client.getLease('zz').catch((x) => x), 'NotFound')).toBe(true);
  });
});
