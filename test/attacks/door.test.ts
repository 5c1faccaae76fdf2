/**
 * Attacks on the TCP door (docs/SECURITY.md "The TCP door"): an oversized body, slow
 * clients holding connections with partial headers, a burst of bad tokens, a runaway
 * create loop. Each must leave dsecd serving other callers.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import tls from 'node:tls';
import { IS_ROOT, TestDaemon } from '../integration/harness.js';
import { doorRequest, makeToken } from '../integration/remote-helpers.js';

describe.skipIf(!IS_ROOT)('attacks on the TCP door', () => {
  let d: TestDaemon;
  let admin: string;
  beforeAll(async () => {
    // Small budgets so the test reaches them quickly; the defaults are in daemon/config.ts.
    d = await TestDaemon.start({ slot: 44, listen: true, config: '[remote]\nheaders_timeout_s = 2\nauth_failures_per_minute = 10\ncreates_per_minute = 3\n' });
    admin = (await makeToken(d, 'system', 'admin')).token;
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('an oversized body is refused (400) without a token even being read, and others are served meanwhile', async () => {
    const big = Buffer.alloc(40 * 1024 * 1024, 0x20);
    big.write('{"image":"busybox","labels":{"x":"');
    big.write('"}}', big.length - 3);
    const [withToken, without, other] = await Promise.all([
      doorRequest(d, { method: 'POST', path: '/v1/sandboxes', token: admin, raw: big, headers: { 'content-type': 'application/json' } }).catch((e: Error) => e),
      doorRequest(d, { method: 'POST', path: '/v1/sandboxes', raw: big, headers: { 'content-type': 'application/json' }, localAddress: '127.0.0.3' }).catch((e: Error) => e),
      doorRequest(d, { path: '/v1/version', token: admin }),
    ]);
    expect(other.status).toBe(200);
    // dsecd answers and may close before the client finished sending (EPIPE/ECONNRESET then).
    if (!(withToken instanceof Error)) {
      expect(withToken.status).toBe(400);
      expect(JSON.parse(withToken.body).error.message).toMatch(/request body larger than/);
    }
    if (!(without instanceof Error)) expect(without.status).toBe(401);
    expect((await d.client.listSandboxes()).length).toBe(0);
  });

  it('slow clients holding partial headers are cut by the header timeout while others are served', async () => {
    const ca = readFileSync(d.caFile);
    const slow = await Promise.all(Array.from({ length: 40 }, () => new Promise<{ closed: Promise<void>; stop(): void }>((resolve, reject) => {
      const s = tls.connect({ host: '127.0.0.1', port: d.remotePort!, ca, servername: 'localhost' }, () => {
        s.write('GET /v1/version HTTP/1.1\r\nhost: x\r\n');
        s.resume();
        // One more header byte now and then: the connection is never idle, the headers never end.
        const drip = setInterval(() => s.write('x'), 500);
        resolve({ closed: new Promise<void>((r) => s.on('close', () => { clearInterval(drip); r(); })), stop: () => { clearInterval(drip); s.destroy(); } });
      });
      s.on('error', () => {});
      s.once('error', reject);
    })));
    try {
      for (let i = 0; i < 5; i++) expect((await doorRequest(d, { path: '/v1/sandboxes', token: admin })).status).toBe(200);
      // dsecd closes every slow connection itself (headers_timeout_s).
      await Promise.all(slow.map((c) => c.closed));
    } finally {
      for (const c of slow) c.stop();
    }
    expect((await doorRequest(d, { path: '/v1/version', token: admin })).status).toBe(200);
  });

  it('a burst of bad tokens from one address is answered 429 once its budget is spent; other addresses are served', async () => {
    const statuses: number[] = [];
    for (let i = 0; i < 25; i++) {
      const bad = 'e2b_' + i.toString(16).padStart(16, '0') + 'a'.repeat(32);
      statuses.push((await doorRequest(d, { path: '/v1/sandboxes', token: bad, localAddress: '127.0.0.2' })).status);
    }
    expect(statuses.slice(0, 10)).toEqual(Array(10).fill(401));
    expect(statuses.slice(10)).toEqual(Array(15).fill(429));
    // Blocked: even a good token from that address waits for the window to pass.
    expect((await doorRequest(d, { path: '/v1/sandboxes', token: admin, localAddress: '127.0.0.2' })).status).toBe(429);
    expect((await doorRequest(d, { path: '/v1/sandboxes', token: admin })).status).toBe(200);
    const m = (await doorRequest(d, { path: '/metrics', token: admin })).body;
    expect(Number(/^dsec_auth_failures_total\{reason="rate_limited"\} (\d+)/m.exec(m)?.[1])).toBeGreaterThanOrEqual(16);
    expect(Number(/^dsec_auth_failures_total\{reason="unknown"\} (\d+)/m.exec(m)?.[1])).toBeGreaterThanOrEqual(10);
  });

  it('a token starting creates past its budget gets 429; another token is not affected', async () => {
    const a = (await makeToken(d, 'team-a', 'user')).token;
    const b = (await makeToken(d, 'team-b', 'user')).token;
    // Creates that fail validation still count: the budget is checked before the body is read.
    const bad = { image: 42 };
    const codes: number[] = [];
    for (let i = 0; i < 5; i++) codes.push((await doorRequest(d, { method: 'POST', path: '/v1/sandboxes', token: a, json: bad })).status);
    expect(codes).toEqual([400, 400, 400, 429, 429]);
    const r = await doorRequest(d, { method: 'POST', path: '/v1/sandboxes', token: a, json: bad });
    expect(JSON.parse(r.body).error.message).toMatch(/creates_per_minute/);
    expect(Number(r.headers['retry-after'])).toBeGreaterThan(0);
    expect((await doorRequest(d, { method: 'POST', path: '/v1/sandboxes', token: b, json: bad })).status).toBe(400);
    // Reads are not creates.
    expect((await doorRequest(d, { path: '/v1/sandboxes', token: a })).status).toBe(200);
  });
});
