/**
 * The run channel (GET /v1/run/channel, daemon/api/routes/run.ts over daemon/api/channel.ts)
 * against a real dsecd, its fncall workers and runc: its answers are POST /v1/run's,
 * calls in flight are answered by id, nothing of one call reaches the next, errors are
 * per call, a container call's sandbox is destroyed when its client leaves (the channel
 * closed, or a POST /v1/run abandoned) and belongs to the caller's tenant, and over the TCP door it is authenticated and each call is audited.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import WebSocket from 'ws';
import { DsecClient } from '../../sdk/index.js';
import { RUN_CHANNEL_AUDIT_ACTION } from '../../daemon/api/routes/run.js';
import { IS_ROOT, TestDaemon } from './harness.js';
import { auditLines, makeToken } from './remote-helpers.js';
import { waitFor } from '../fixtures/agent.js';

/** How long a wait here may take before it counts as a hang, ms. */
const WAIT_MS = 30_000;

/** `[remote] creates_per_minute`: each token's create budget over the TCP door. */
const BUDGET = 4;

describe.skipIf(!IS_ROOT)('run channel', () => {
  let d: TestDaemon;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 48, listen: true, config: `[fncall]\nmax_workers = 2\nmin_idle = 1\npids = 64\n[remote]\ncreates_per_minute = ${BUDGET}\n` });
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('answers as POST /v1/run does, many calls in flight, none seeing another', async () => {
    const ch = d.client.runChannel();
    await ch.opened;
    const call = { backend: 'fncall' as const, image: 'busybox', argv: ['sh', '-c', 'cat; echo "$X"; echo oops >&2; exit 3'], env: { X: 'ex' }, stdin_b64: Buffer.from('in\n').toString('base64') };
    const [viaChannel, viaHttp] = await Promise.all([ch.run(call), d.client.run(call)]);
    for (const r of [viaChannel, viaHttp]) {
      expect(r.stdout.toString()).toBe('in\nex\n');
      expect(r.stderr.toString()).toBe('oops\n');
      expect(r.exit_code).toBe(3);
    }
    expect(Object.keys(viaChannel).sort()).toEqual(Object.keys(viaHttp).sort());
    // 40 calls at once, each leaving a file and a process behind: every call starts clean.
    const many = await Promise.all(Array.from({ length: 40 }, (_, i) => ch.run({
      backend: 'fncall', image: 'busybox',
      argv: ['sh', '-c', `ls -A /tmp; echo ${i} > /tmp/mark; (sleep 1000 &); echo ${i}`],
    })));
    expect(many.map((r) => r.stdout.toString())).toEqual(Array.from({ length: 40 }, (_, i) => `${i}\n`));
    expect((await ch.run({ backend: 'fncall', image: 'busybox', argv: ['sh', '-c', 'sleep 5'], timeout_ms: 200 })).timed_out).toBe(true);
    ch.close();
  });

  it('errors are per call and keep the channel', async () => {
    const ch = d.client.runChannel();
    await expect(ch.run({ backend: 'fncall', image: 'busybox', argv: [] })).rejects.toMatchObject({ code: 'InvalidArgument' });
    await expect(ch.run({ backend: 'fncall', image: 'no-such-image', argv: ['true'] })).rejects.toMatchObject({ code: 'NotFound' });
    await expect(ch.run({ backend: 'container', image: 'busybox', argv: ['true'], bogus: 1 } as never)).rejects.toMatchObject({ code: 'InvalidArgument' });
    expect((await ch.run({ backend: 'fncall', image: 'busybox', argv: ['echo', 'still'] })).stdout.toString()).toBe('still\n');
    ch.close();
    await expect(ch.run({ backend: 'fncall', image: 'busybox', argv: ['true'] })).rejects.toMatchObject({ code: 'Unavailable' });
  });

  it('a protocol violation closes the channel with 1008 and an {"id": null} answer; an oversized frame with 1009, not logged as an error', async () => {
    const ws = new WebSocket(`ws+unix://${d.socket}:/v1/run/channel`);
    const got: unknown[] = [];
    ws.on('message', (m) => got.push(JSON.parse(String(m))));
    const closed = new Promise<number>((r) => ws.on('close', (code) => r(code)));
    await new Promise((r, j) => {
      ws.once('open', r);
      ws.once('error', j);
    });
    ws.send(JSON.stringify({ id: { nested: 1 }, request: {} }));
    expect(await closed).toBe(1008);
    expect(got).toEqual([{ id: null, error: { code: 'InvalidArgument', message: expect.stringMatching(/"id" must be/) } }]);
    // A frame over the 1 MiB limit: closed with 1009, and logged as the client's error
    // (debug), not as an error of dsecd's, however many a client sends.
    const big = new WebSocket(`ws+unix://${d.socket}:/v1/run/channel`);
    const bigClosed = new Promise<number>((r) => big.on('close', (code) => r(code)));
    await new Promise((r, j) => {
      big.once('open', r);
      big.once('error', j);
    });
    big.send('x'.repeat(1024 * 1024 + 1));
    expect(await bigClosed).toBe(1009);
    expect((await d.client.run({ backend: 'fncall', image: 'busybox', argv: ['true'] })).exit_code).toBe(0);
    const errors = d.stderr.split('\n').filter((l) => /"level":50/.test(l) && /payload|websocket/i.test(l));
    expect(errors).toEqual([]);    // A plain GET (no upgrade) is told what the route is.
    for (const p of ['/v1/run/channel', '/v1/sandboxes/0123456789abcdef/exec/channel']) {
      const plain = await new Promise<{ status: number; body: string }>((resolve, reject) => {
        http.get({ socketPath: d.socket, path: p }, (res) => {
          let body = '';
          res.on('data', (c) => (body += c));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        }).on('error', reject);
      });
      expect(plain.status, plain.body).toBe(p.includes('/sandboxes/') ? 404 : 400);
      if (!p.includes('/sandboxes/')) expect(JSON.parse(plain.body).error).toMatchObject({ code: 'InvalidArgument', message: expect.stringMatching(/is a WebSocket/) });
    }
  });

  it("a container call's sandbox is destroyed at once when its client leaves: the channel closed, or a POST /v1/run abandoned", async () => {
    const before = new Set((await d.client.listSandboxes()).map((s) => s.id));
    /** The id of the one sandbox created since `before`, once it runs. */
    const newRunning = async () => {
      let mine: string | undefined;
      await waitFor('the call\'s sandbox to run', async () => {
        mine = (await d.client.listSandboxes()).map((s) => s.id).find((id) => !before.has(id));
        return mine !== undefined && (await d.client.getSandbox(mine)).state === 'running';
      }, WAIT_MS);
      before.add(mine!);
      return mine!;
    };
    const gone = (id: string) => waitFor(`sandbox ${id} to be destroyed`, async () => d.client.getSandbox(id).then(() => false, (e: { code?: string }) => e.code === 'NotFound'), 60_000);
    // No timeout_ms: without its client leaving, this call would run for 10 minutes.
    const ch = d.client.runChannel();
    const running = ch.run({ backend: 'container', image: 'busybox', argv: ['sleep', '600'] });
    running.catch(() => {});
    const viaChannel = await newRunning();
    ch.close();
    await expect(running).rejects.toMatchObject({ code: 'Unavailable' });
    await gone(viaChannel);
    const abandon = new AbortController();
    const post = d.client.run({ backend: 'container', image: 'busybox', argv: ['sleep', '600'] }, { signal: abandon.signal });
    post.catch(() => {});
    const viaPost = await newRunning();
    abandon.abort();
    await gone(viaPost);
    // run:batch: every container call's sandbox, and the calls not yet started never start.
    const abandonBatch = new AbortController();
    const batch = d.client.runBatch(Array.from({ length: 6 }, () => ({ backend: 'container' as const, image: 'busybox', argv: ['sleep', '600'] })), { signal: abandonBatch.signal });
    batch.catch(() => {});
    const first = await newRunning();
    abandonBatch.abort();
    await gone(first);
    await waitFor('every one-shot sandbox of the batch to be destroyed', async () => (await d.client.listSandboxes()).filter((x) => x.labels['dsec.run'] === 'once').length === 0, 60_000);
  });

  it('over the TCP door: a reader gets PermissionDenied, a bad token Unauthenticated, each call is audited', async () => {
    const ca = readFileSync(d.caFile);
    const remote = (token: string) => new DsecClient({ remote: { url: `https://127.0.0.1:${d.remotePort}`, token, ca } });
    const user = await makeToken(d, 'runchan-a', 'user');
    const reader = await makeToken(d, 'runchan-a', 'reader');
    const other = await makeToken(d, 'runchan-b', 'user');
    const ch = remote(user.token).runChannel();
    expect((await ch.run({ backend: 'fncall', image: 'busybox', argv: ['echo', 'over tls'] })).stdout.toString()).toBe('over tls\n');
    await expect(ch.run({ backend: 'fncall', image: 'busybox', argv: [] })).rejects.toMatchObject({ code: 'InvalidArgument' });
    // A container call's sandbox is the caller's tenant's: listed for it, not for another tenant.
    const seen = ch.run({ backend: 'container', image: 'busybox', argv: ['sh', '-c', 'while [ ! -e /tmp/go ]; do sleep 0.05; done'] });
    let mine: { id: string; tenant: string } | undefined;
    await waitFor('the call\'s sandbox in its tenant\'s list', async () => {
      mine = (await remote(user.token).listSandboxes()).find((s) => s.state === 'running');
      return mine !== undefined;
    }, WAIT_MS);
    expect(mine!.tenant).toBe('runchan-a');
    expect((await remote(other.token).listSandboxes()).map((s) => s.id)).not.toContain(mine!.id);
    await remote(user.token).exec(mine!.id, { argv: ['touch', '/tmp/go'] });
    expect((await seen).exit_code).toBe(0);
    // Deleting its own one-shot sandbox mid-call: the call answers with the exec's own
    // outcome, not the NotFound of the run's cleanup finding it gone.
    const doomed = ch.run({ backend: 'container', image: 'busybox', argv: ['sleep', '600'] });
    doomed.catch(() => {});
    let victim: string | undefined;
    await waitFor('the doomed call\'s sandbox', async () => {
      victim = (await remote(user.token).listSandboxes()).find((s) => s.state === 'running')?.id;
      return victim !== undefined;
    }, WAIT_MS);
    await remote(user.token).deleteSandbox(victim!, { force: true });
    const outcome = await doomed.then((r) => ({ code: 'result', r }), (e: { code?: string }) => ({ code: e.code, r: null }));
    expect(outcome.code).not.toBe('NotFound');
    // The fncall tier runs the shared images only: another tenant's image is a plain
    // NotFound that names no tenant; a tenant's own image is told to use "container".
    await remote(other.token).tagImage('busybox', 'onlyb:1');
    const mineOnFncall = remote(other.token).run({ backend: 'fncall', image: 'onlyb:1', argv: ['true'] });
    await expect(mineOnFncall).rejects.toMatchObject({ code: 'NotFound', message: expect.stringMatching(/backend "container"/) });
    const theirs = await remote(user.token).run({ backend: 'fncall', image: 'onlyb:1', argv: ['true'] }).then(() => null, (e: Error & { code?: string }) => e);
    expect(theirs).toMatchObject({ code: 'NotFound' });
    expect(theirs!.message).not.toMatch(/runchan-b/);
    expect((await remote(other.token).run({ backend: 'container', image: 'onlyb:1', argv: ['echo', 'own'] })).stdout.toString()).toBe('own\n');
    ch.close();
    // Container calls spend the token's create budget (BUDGET a minute), over POST, batch
    // and the channel alike; fncall calls spend none. `spender` is a fresh token.
    const spender = await makeToken(d, 'runchan-a', 'user');
    const sc = remote(spender.token);
    const one = { backend: 'container' as const, image: 'busybox', argv: ['true'] };
    expect((await sc.run(one)).exit_code).toBe(0);
    expect((await sc.runBatch([one, one])).map((e) => e.ok)).toEqual([true, true]);
    const sch = sc.runChannel();
    expect((await sch.run(one)).exit_code).toBe(0);
    await expect(sch.run(one)).rejects.toMatchObject({ code: 'ResourceExhausted', message: expect.stringMatching(/creates_per_minute/) });
    await expect(sc.run(one)).rejects.toMatchObject({ code: 'ResourceExhausted' });
    await expect(sc.runBatch([one])).rejects.toMatchObject({ code: 'ResourceExhausted' });
    for (let i = 0; i < BUDGET * 2; i++) expect((await sch.run({ backend: 'fncall', image: 'busybox', argv: ['true'] })).exit_code).toBe(0);
    sch.close();
    await expect(remote(reader.token).runChannel().opened).rejects.toMatchObject({ code: 'PermissionDenied' });
    await expect(remote('e2b_' + 'f'.repeat(48)).runChannel().opened).rejects.toMatchObject({ code: 'Unauthenticated' });
    const lines = () => auditLines(d).filter((x) => x.token === user.id);
    await waitFor('the audit lines', () => lines().filter((x) => x.action === RUN_CHANNEL_AUDIT_ACTION).length >= 4, WAIT_MS);
    expect(lines()[0]).toMatchObject({ action: 'GET /v1/run/channel', result: 101, tenant: 'runchan-a' });
    expect(lines().filter((x) => x.action === RUN_CHANNEL_AUDIT_ACTION).map((x) => [x.result, x.error]).slice(0, 3)).toEqual([[200, null], [400, 'InvalidArgument'], [200, null]]);
  });
});
