import { afterEach, describe, expect, it } from 'vitest';
import { DsecApiError, DsecClient, type TrajectoryDetail, type TrajectoryRecord } from '../../sdk/index.js';
import { sdkFixtures, fail, fakeRecord, fakeSandbox, fakeSnapshot, fakeStep, fakeTrajectory, installSnapshotRoutes, json, ndjson, ok, startFakeDsecd, type FakeDsecd } from '../fixtures/fake-dsecd.js';

// The snapshot, fork and trajectory calls of the SDK, and exec's trajectory fields,
// against the fake dsecd (test/fixtures/fake-dsecd.ts).

const { fake, client } = sdkFixtures();

const tick = (ms = 5) => new Promise((r) => setTimeout(r, ms));
const ID = '0123456789abcdef';

async function collect<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}

describe('snapshot calls', () => {
  it('call the right method, path and body; refs are URL-encoded; lists are unwrapped', async () => {
    const f = await fake();
    const snap = fakeSnapshot();
    const restored = fakeSandbox({ id: 'b'.repeat(16), snapshot: snap.id });
    f.routes['POST /v1/sandboxes/:id/snapshot'] = ok(snap, 201);
    f.routes['GET /v1/snapshots'] = ok({ snapshots: [snap] });
    f.routes['GET /v1/snapshots/:ref'] = ok(snap);
    f.routes['DELETE /v1/snapshots/:ref'] = ok(snap);
    f.routes['POST /v1/snapshots/:ref/restore'] = ok(restored, 201);
    f.routes['POST /v1/snapshots/:ref/fork'] = ok({ sandboxes: [restored, fakeSandbox({ id: 'c'.repeat(16) })] }, 201);
    const c = client(f);

    expect(await c.snapshot(ID)).toEqual(snap);
    await c.snapshot(ID, { name: 'base', process: true });
    expect(await c.listSnapshots()).toEqual([snap]);
    expect(await c.getSnapshot('base')).toEqual(snap);
    expect(await c.getSnapshot('a/b c')).toEqual(snap);
    expect(await c.deleteSnapshot(snap.id)).toEqual(snap);
    expect(await c.restore('base')).toEqual(restored);
    await c.restore(snap.id, { labels: { job: 'b' }, env: { K: 'V' }, cpus: 2, memory_bytes: 1 << 30, ttl_s: 600 });
    expect((await c.fork('base', { count: 2, labels: { round: '4' } })).map((s) => s.id)).toEqual(['b'.repeat(16), 'c'.repeat(16)]);

    expect(f.seen.map((s) => `${s.method} ${s.url}`)).toEqual([
      `POST /v1/sandboxes/${ID}/snapshot`,
      `POST /v1/sandboxes/${ID}/snapshot`,
      'GET /v1/snapshots',
      'GET /v1/snapshots/base',
      'GET /v1/snapshots/a%2Fb%20c',
      `DELETE /v1/snapshots/${snap.id}`,
      'POST /v1/snapshots/base/restore',
      `POST /v1/snapshots/${snap.id}/restore`,
      'POST /v1/snapshots/base/fork',
    ]);
    expect(f.seen.map((s) => s.body)).toEqual([
      {},
      { name: 'base', process: true },
      undefined,
      undefined,
      undefined,
      undefined,
      {},
      { labels: { job: 'b' }, env: { K: 'V' }, cpus: 2, memory_bytes: 1 << 30, ttl_s: 600 },
      { count: 2, labels: { round: '4' } },
    ]);
    expect(f.seen[0].headers['content-type']).toBe('application/json');
  });

  it('snapshot and fork have no HTTP deadline; fork takes one from opts.timeoutMs; restore keeps the client deadline', async () => {
    const f = await fake();
    const slow = (body: unknown) => async (_req: unknown, res: Parameters<typeof json>[0]) => {
      await tick(60);
      json(res, 201, body);
    };
    f.routes['POST /v1/sandboxes/:id/snapshot'] = slow(fakeSnapshot());
    f.routes['POST /v1/snapshots/:ref/fork'] = slow({ sandboxes: [fakeSandbox()] });
    f.routes['POST /v1/snapshots/:ref/restore'] = slow(fakeSandbox());
    const c = client(f, 20);
    expect((await c.snapshot(ID)).id).toBe('snap-00000000000000a1');
    expect(await c.fork('base', { count: 1 })).toHaveLength(1);
    expect(await c.fork('base', { count: 1 }, { timeoutMs: 20 }).catch((e) => e)).toMatchObject({ code: 'DeadlineExceeded', status: 0 });
    expect(await c.restore('base').catch((e) => e)).toMatchObject({ code: 'DeadlineExceeded' });
  });

  it('an aborted snapshot rejects with the signal reason', async () => {
    const f = await fake();
    f.routes['POST /v1/sandboxes/:id/snapshot'] = async () => {
      // never answers
    };
    const ac = new AbortController();
    const p = client(f).snapshot(ID, { signal: ac.signal });
    setTimeout(() => ac.abort(new Error('stop')), 10);
    await expect(p).rejects.toThrow('stop');
  });

  it('errors keep their kind, message and reason; reason is undefined when the body has none', async () => {
    const f = await fake();
    f.routes['POST /v1/sandboxes/:id/snapshot'] = fail(501, 'Unimplemented', 'process snapshots need CRIU: criu check failed');
    f.routes['GET /v1/snapshots/:ref'] = fail(404, 'NotFound', 'snapshot nope not found');
    f.routes['POST /v1/snapshots/:ref/fork'] = fail(409, 'Conflict', 'busy', 'some_reason');
    const c = client(f);
    const e1 = await c.snapshot(ID, { process: true }).catch((x) => x);
    expect(e1).toBeInstanceOf(DsecApiError);
    expect(e1).toMatchObject({ code: 'Unimplemented', status: 501, message: 'process snapshots need CRIU: criu check failed', reason: undefined });
    expect(await c.getSnapshot('nope').catch((x) => x)).toMatchObject({ code: 'NotFound', status: 404 });
    expect(await c.fork('x', { count: 1 }).catch((x) => x)).toMatchObject({ code: 'Conflict', reason: 'some_reason' });
  });
});

describe('DsecApiError.reason', () => {
  it('is set from the constructor option, and absent otherwise (including on client-side failures)', async () => {
    expect(new DsecApiError('Conflict', 'x', 409, { reason: 'step_mismatch' }).reason).toBe('step_mismatch');
    const plain = new DsecApiError('Conflict', 'x', 409);
    expect(plain.reason).toBeUndefined();
    expect('cause' in plain).toBe(false);
    const cause = new Error('c');
    expect(new DsecApiError('Unavailable', 'y', 0, { cause }).cause).toBe(cause);
    const e = await new DsecClient({ socketPath: '/nonexistent/dsecd.sock' }).version().catch((x) => x);
    expect(e).toMatchObject({ code: 'Unavailable', reason: undefined });
  });

  it('a non-string reason in the body is ignored', async () => {
    const f = await fake();
    f.routes['GET /v1/snapshots'] = (_req, res) => json(res, 409, { error: { code: 'Conflict', message: 'm', reason: 7 } });
    expect(await client(f).listSnapshots().catch((x) => x)).toMatchObject({ code: 'Conflict', message: 'm', reason: undefined });
  });

  it('comes through an NDJSON error line of a long operation too', async () => {
    const f = await fake();
    f.routes['POST /v1/images/import'] = ndjson([{ type: 'error', error: { code: 'Conflict', message: 'busy', reason: 'in_progress' } }]);
    const e = await client(f).importImage({ type: 'dir', path: '/x', image: 'a:b' }).catch((x) => x);
    expect(e).toMatchObject({ code: 'Conflict', message: 'busy', reason: 'in_progress' });
  });
});

describe('exec with a trajectory', () => {
  it('sends trajectory, step and truncate only when given, and returns replayed/trajectory/step', async () => {
    const f = await fake();
    const out = Buffer.from('hi\n').toString('base64');
    f.routes['POST /v1/sandboxes/:id/exec'] = (req, res) =>
      json(res, 200, {
        exit_code: 0, signal: null, stdout_b64: out, stderr_b64: '', stdout_truncated: false, stderr_truncated: false,
        duration_ms: 1, oom: false, timed_out: false,
        ...(req.body.trajectory !== undefined ? { trajectory: req.body.trajectory, step: req.body.step, replayed: true } : {}),
      });
    const c = client(f);
    const plain = await c.exec(ID, { argv: ['echo', 'hi'] });
    expect(plain.replayed).toBeUndefined();
    const r = await c.exec(ID, { argv: ['echo', 'hi'], trajectory: 'ep:7@host', step: 0 });
    expect(r).toMatchObject({ trajectory: 'ep:7@host', step: 0, replayed: true, exit_code: 0 });
    expect(r.stdout.toString()).toBe('hi\n');
    await c.exec(ID, { argv: ['echo', 'hi'], trajectory: 't', step: 4, truncate: true });
    await c.exec(ID, { argv: ['echo'], trajectory: 't', step: 5, truncate: false });
    expect(f.seen.map((s) => s.body)).toEqual([
      { argv: ['echo', 'hi'] },
      { argv: ['echo', 'hi'], trajectory: 'ep:7@host', step: 0 },
      { argv: ['echo', 'hi'], trajectory: 't', step: 4, truncate: true },
      { argv: ['echo'], trajectory: 't', step: 5, truncate: false },
    ]);
  });

  it('a refused step is a Conflict with its reason', async () => {
    const f = await fake();
    f.routes['POST /v1/sandboxes/:id/exec'] = fail(409, 'Conflict', 'step 3 of ep-7 started but its outcome is unknown', 'outcome_unknown');
    const e = await client(f).exec(ID, { argv: ['x'], trajectory: 'ep-7', step: 3 }).catch((x) => x);
    expect(e).toBeInstanceOf(DsecApiError);
    expect(e).toMatchObject({ code: 'Conflict', status: 409, reason: 'outcome_unknown', message: 'step 3 of ep-7 started but its outcome is unknown' });
  });

  it('against the model: records, replays without running, refuses a different command, truncates', async () => {
    const f = await fake();
    const state = installSnapshotRoutes(f);
    const c = client(f);
    const first = await c.exec(ID, { argv: ['echo', 'a'], trajectory: 'ep', step: 0 });
    expect(first).toMatchObject({ replayed: false, trajectory: 'ep', step: 0 });
    const again = await c.exec(ID, { argv: ['echo', 'a'], trajectory: 'ep', step: 0 });
    expect(again.replayed).toBe(true);
    expect(again.stdout.toString()).toBe('echo a\n');
    expect(state.ran).toHaveLength(1);
    expect(await c.exec(ID, { argv: ['echo', 'b'], trajectory: 'ep', step: 0 }).catch((x) => x)).toMatchObject({ code: 'Conflict', reason: 'step_mismatch' });
    const redone = await c.exec(ID, { argv: ['echo', 'b'], trajectory: 'ep', step: 0, truncate: true });
    expect(redone).toMatchObject({ replayed: false });
    expect(state.ran.map((r) => r.argv)).toEqual([['echo', 'a'], ['echo', 'b']]);
    const t = await c.getTrajectory('ep');
    expect(t).toMatchObject({ id: 'ep', steps: 1, truncations: 1, first_step: 0, last_step: 0 });
    expect(t.step_list.map((s) => [s.step, s.argv, s.replays])).toEqual([[0, ['echo', 'b'], 0]]);
  });
});

describe('trajectory calls', () => {
  it('call the right method and path; ids are URL-encoded; lists are unwrapped', async () => {
    const f = await fake();
    const summary = fakeTrajectory();
    const detail: TrajectoryDetail = { ...summary, step_list: [fakeStep(), fakeStep({ step: 1 })] };
    f.routes['GET /v1/trajectories'] = ok({ trajectories: [summary] });
    f.routes['GET /v1/trajectories/:id'] = ok(detail);
    f.routes['DELETE /v1/trajectories/:id'] = ok({ id: 'ep:7@h', removed_steps: 3 });
    const c = client(f);
    expect(await c.listTrajectories()).toEqual([summary]);
    expect(await c.getTrajectory('ep:7@h')).toEqual(detail);
    expect(await c.deleteTrajectory('ep:7@h')).toEqual({ id: 'ep:7@h', removed_steps: 3 });
    expect(f.seen.map((s) => `${s.method} ${s.url}`)).toEqual(['GET /v1/trajectories', 'GET /v1/trajectories/ep%3A7%40h', 'DELETE /v1/trajectories/ep%3A7%40h']);
    expect(f.seen[1].params.id).toBe('ep:7@h');
  });

  it('exportTrajectory yields the records in order, reassembling lines split across chunks', async () => {
    const f = await fake();
    const records: TrajectoryRecord[] = [0, 1, 2].map((step) => fakeRecord({ step, argv: ['echo', `naïve ✓ 日本 ${step}`] }));
    f.routes['GET /v1/trajectories/:id/export'] = ndjson([...records, ''], { chunk: 13 });
    const got = await collect(client(f).exportTrajectory('ep-7'));
    expect(got).toEqual(records);
    expect(f.seen[0].url).toBe('/v1/trajectories/ep-7/export');
  });

  it('exportTrajectory has no deadline: a slow stream outlives the client timeoutMs', async () => {
    const f = await fake();
    f.routes['GET /v1/trajectories/:id/export'] = ndjson([fakeRecord(), fakeRecord({ step: 1 })], { chunk: 64, delayMs: 30 });
    expect(await collect(client(f, 10).exportTrajectory('ep-7'))).toHaveLength(2);
  });

  it('exportTrajectory: NotFound on open, Internal for a malformed line, Unavailable for a dropped connection', async () => {
    const f = await fake();
    f.routes['GET /v1/trajectories/:id/export'] = (req, res) => {
      if (req.params.id === 'nope') return json(res, 404, { error: { code: 'NotFound', message: 'trajectory nope not found' } });
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      if (req.params.id === 'bad') {
        res.end(JSON.stringify(fakeRecord()) + '\nnot json\n');
        return;
      }
      res.write(JSON.stringify(fakeRecord()) + '\n');
      setTimeout(() => res.destroy(), 10);
    };
    const c = client(f);
    expect(await collect(c.exportTrajectory('nope')).catch((x) => x)).toMatchObject({ code: 'NotFound', status: 404, message: 'trajectory nope not found' });
    const bad = await collect(c.exportTrajectory('bad')).catch((x) => x);
    expect(bad).toMatchObject({ code: 'Internal' });
    expect(bad.message).toContain('not json');
    const cut = await collect(c.exportTrajectory('cut')).catch((x) => x);
    expect(cut).toMatchObject({ code: 'Unavailable' });
    expect(cut.message).toContain('trajectory cut');
  });

  it('exportTrajectory ends without an error when its signal aborts, and when the consumer breaks', async () => {
    const f = await fake();
    f.routes['GET /v1/trajectories/:id/export'] = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(JSON.stringify(fakeRecord()) + '\n');
      res.write(JSON.stringify(fakeRecord({ step: 1 })) + '\n');
      // and then nothing more, never ended
    };
    const c = client(f);
    const ac = new AbortController();
    const got: TrajectoryRecord[] = [];
    for await (const r of c.exportTrajectory('ep-7', { signal: ac.signal })) {
      got.push(r);
      if (got.length === 2) setTimeout(() => ac.abort(), 5);
    }
    expect(got.map((r) => r.step)).toEqual([0, 1]);
    for await (const r of c.exportTrajectory('ep-7')) {
      expect(r.step).toBe(0);
      break;
    }
    // An already aborted signal never opens the stream.
    expect(await collect(c.exportTrajectory('ep-7', { signal: AbortSignal.abort() }))).toEqual([]);
    expect(f.seen).toHaveLength(2);
  });
});
