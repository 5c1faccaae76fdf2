import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { DsecApiError, DsecClient, type Event, type Sandbox } from '../../sdk/index.js';
import { sdkFixtures, fakeSandbox, json, startFakeDsecd, type FakeDsecd as Fake, type Route as Handler } from '../fixtures/fake-dsecd.js';

// A tiny stand-in for dsecd (test/fixtures/fake-dsecd.ts): node:http on a temp Unix
// socket, answering from a handler.

const { fake: fakeDsecd, client } = sdkFixtures();

/** The fixture sandbox with fixed times, one core and one label (the values these tests assert). */
const sandbox = (over: Partial<Sandbox> = {}): Sandbox =>
  fakeSandbox({ cpus: 1, labels: { job: 'a' }, created_at: 1_700_000_000_000, updated_at: 1_700_000_000_000, ...over });

const tick = (ms = 5) => new Promise((r) => setTimeout(r, ms));

describe('DsecClient requests', () => {
  it('calls every endpoint with the right method, path, query and body', async () => {
    const f = await fakeDsecd((req, res) => {
      if (req.url === '/v1/version') return json(res, 200, { version: '0.1.0', api: 'v1', agent_protocol: 1, node: 'v20' });
      if (req.url === '/v1/images') return json(res, 200, { images: [{ name: 'busybox', tag: 'latest', layers: ['sha256:aa'], created_at: 1 }] });
      if (req.url.startsWith('/v1/sandboxes?') || req.url === '/v1/sandboxes') {
        if (req.method === 'POST') return json(res, 201, sandbox());
        return json(res, 200, { sandboxes: [sandbox()] });
      }
      if (req.method === 'DELETE') return json(res, 200, sandbox({ state: 'destroyed' }));
      if (req.url.endsWith('/stop')) return json(res, 200, sandbox({ state: 'stopped' }));
      return json(res, 200, sandbox());
    });
    const c = client(f);
    expect((await c.version()).version).toBe('0.1.0');
    expect((await c.createSandbox({ image: 'busybox', memory_bytes: 64 << 20, labels: { job: 'a' } })).id).toBe('0123456789abcdef');
    expect(await c.listSandboxes({ selector: 'job=a,round=3', state: 'running' })).toHaveLength(1);
    await c.listSandboxes();
    await c.getSandbox('a/b');
    expect((await c.deleteSandbox('abc', { force: true })).state).toBe('destroyed');
    await c.deleteSandbox('abc');
    expect((await c.stopSandbox('abc')).state).toBe('stopped');
    await c.startSandbox('abc');
    expect(await c.listImages()).toEqual([{ name: 'busybox', tag: 'latest', layers: ['sha256:aa'], created_at: 1 }]);

    expect(f.seen.map((s) => `${s.method} ${s.url}`)).toEqual([
      'GET /v1/version',
      'POST /v1/sandboxes',
      'GET /v1/sandboxes?selector=job%3Da%2Cround%3D3&state=running',
      'GET /v1/sandboxes',
      'GET /v1/sandboxes/a%2Fb',
      'DELETE /v1/sandboxes/abc?force=true',
      'DELETE /v1/sandboxes/abc',
      'POST /v1/sandboxes/abc/stop',
      'POST /v1/sandboxes/abc/start',
      'GET /v1/images',
    ]);
    expect(JSON.parse(f.seen[1].text)).toEqual({ image: 'busybox', memory_bytes: 64 << 20, labels: { job: 'a' } });
    expect(new URLSearchParams(f.seen[2].url.split('?')[1]).get('selector')).toBe('job=a,round=3');
  });

  it('reuses one keep-alive connection across sequential calls, including after an error response', async () => {
    let n = 0;
    const f = await fakeDsecd((_req, res) => {
      n++;
      if (n === 5) return json(res, 404, { error: { code: 'NotFound', message: 'sandbox x not found' } });
      json(res, 200, { version: '0.1.0', api: 'v1', agent_protocol: 1, node: 'v20' });
    });
    const c = client(f);
    for (let i = 0; i < 20; i++) {
      try {
        await c.version();
      } catch (e) {
        expect((e as DsecApiError).code).toBe('NotFound');
      }
    }
    expect(f.seen).toHaveLength(20);
    expect(f.connections()).toBe(1);
  });

  it('resends a GET once when a reused keep-alive connection turns out dead; never a POST', async () => {
    let n = 0;
    const f = await fakeDsecd((req, res) => {
      n++;
      // The 2nd and 4th requests arrive on the pooled connection; drop it without answering.
      if (n === 2 || n === 4) return void res.socket!.destroy();
      json(res, 200, { version: '0.1.0', api: 'v1', agent_protocol: 1, node: 'v20' });
    });
    const c = client(f);
    await c.version();
    expect((await c.version()).version).toBe('0.1.0'); // 2nd dropped, resent as 3rd
    expect(f.seen.map((s) => s.method)).toEqual(['GET', 'GET', 'GET']);
    const e = await c.request('POST', '/v1/sandboxes/abc/stop').catch((x) => x); // 4th dropped, not resent
    expect(e).toMatchObject({ code: 'Unavailable', status: 0 });
    expect(f.seen).toHaveLength(4);
  });

  it('exec encodes stdin and timeout and decodes binary output', async () => {
    const out = Buffer.from([0xff, 0x00, 0x41, 0x0a]);
    const f = await fakeDsecd((_req, res) =>
      json(res, 200, {
        exit_code: 3,
        signal: null,
        stdout_b64: out.toString('base64'),
        stderr_b64: Buffer.from('warn\n').toString('base64'),
        stdout_truncated: false,
        stderr_truncated: false,
        duration_ms: 1.5,
        oom: false,
        timed_out: false,
      }),
    );
    const c = client(f);
    const r = await c.exec('abc', { argv: ['sh', '-c', 'exit 3'], stdin: Buffer.from([1, 2, 3]), timeoutMs: 2000, env: { A: '1' }, cwd: '/tmp', user: '1000:1000' });
    expect(r.exit_code).toBe(3);
    expect(r.stdout.equals(out)).toBe(true);
    expect(r.stderr.toString()).toBe('warn\n');
    expect(r.stdout_b64).toBe(out.toString('base64'));
    expect(f.seen[0].url).toBe('/v1/sandboxes/abc/exec');
    expect(JSON.parse(f.seen[0].text)).toEqual({ argv: ['sh', '-c', 'exit 3'], env: { A: '1' }, cwd: '/tmp', user: '1000:1000', stdin_b64: 'AQID', timeout_ms: 2000 });

    await c.exec('abc', { argv: ['cat'], stdin: 'héllo' });
    expect(JSON.parse(f.seen[1].text)).toEqual({ argv: ['cat'], stdin_b64: Buffer.from('héllo').toString('base64') });
  });

  it('stopSandbox sends {timeout_ms} only when timeoutMs is given (0 included)', async () => {
    const f = await fakeDsecd((_req, res) => json(res, 200, sandbox({ state: 'stopped' })));
    const c = client(f);
    expect((await c.stopSandbox('abc')).state).toBe('stopped');
    await c.stopSandbox('abc', {});
    await c.stopSandbox('abc', { timeoutMs: 0 });
    await c.stopSandbox('a/b', { timeoutMs: 30_000 });
    expect(f.seen.map((s) => `${s.method} ${s.url}`)).toEqual([
      'POST /v1/sandboxes/abc/stop', 'POST /v1/sandboxes/abc/stop', 'POST /v1/sandboxes/abc/stop', 'POST /v1/sandboxes/a%2Fb/stop',
    ]);
    expect(f.seen[0].text).toBe('');
    expect(f.seen[0].headers['content-type']).toBeUndefined();
    expect(f.seen[1].text).toBe('');
    expect(f.seen[2].text).toBe('{"timeout_ms":0}');
    expect(f.seen[2].headers['content-type']).toBe('application/json');
    expect(f.seen[3].body).toEqual({ timeout_ms: 30_000 });
  });

  it('stopSandbox waits the grace period on top of the client deadline', async () => {
    const f = await fakeDsecd((_req, res) => void setTimeout(() => json(res, 200, sandbox({ state: 'stopped' })), 80));
    expect((await client(f, 40).stopSandbox('abc', { timeoutMs: 100 })).state).toBe('stopped');
    const e = await client(f, 40).stopSandbox('abc').catch((x) => x);
    expect(e).toMatchObject({ code: 'DeadlineExceeded' });
  });

  it('request<T> is usable for any route', async () => {
    const f = await fakeDsecd((req, res) => json(res, 200, { echo: JSON.parse(req.text) }));
    const c = client(f);
    expect(await c.request<{ echo: unknown }>('POST', '/v1/anything', { a: 1 })).toEqual({ echo: { a: 1 } });
  });
});

describe('DsecClient errors', () => {
  it('maps an error body to DsecApiError with its code, status and message', async () => {
    const f = await fakeDsecd((_req, res) => json(res, 409, { error: { code: 'AlreadyExists', message: 'sandbox abc exists' } }));
    const e = await client(f).getSandbox('abc').catch((x) => x);
    expect(e).toBeInstanceOf(DsecApiError);
    expect(e).toMatchObject({ code: 'AlreadyExists', status: 409, message: 'sandbox abc exists' });
  });

  it('derives the kind from the status when the body is not an error body', async () => {
    const f = await fakeDsecd((req, res) => {
      res.writeHead(req.url === '/v1/host' ? 503 : 418, { 'content-type': 'text/plain' });
      res.end('upstream sad');
    });
    const c = client(f);
    expect(await c.hostInfo().catch((x) => x)).toMatchObject({ code: 'Unavailable', status: 503, message: 'dsecd answered 503: upstream sad' });
    expect(await c.version().catch((x) => x)).toMatchObject({ code: 'InvalidArgument', status: 418 });
  });

  it('a missing socket is Unavailable naming the path and asking whether dsecd runs', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsec-sdk-'));
    try {
      const socketPath = join(dir, 'nope.sock');
      const e = await new DsecClient({ socketPath }).version().catch((x) => x);
      expect(e).toBeInstanceOf(DsecApiError);
      expect(e.code).toBe('Unavailable');
      expect(e.status).toBe(0);
      expect(e.message).toContain(socketPath);
      expect(e.message).toContain('is dsecd running?');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a socket path nobody listens on is Unavailable too', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'dsec-sdk-'));
    try {
      const socketPath = join(dir, 'stale.sock');
      writeFileSync(socketPath, '');
      const e = await new DsecClient({ socketPath }).version().catch((x) => x);
      expect(e).toMatchObject({ code: 'Unavailable', status: 0 });
      expect(e.message).toContain(socketPath);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('the socket defaults to $DSEC_SOCKET', () => {
    const old = process.env.DSEC_SOCKET;
    process.env.DSEC_SOCKET = '/tmp/from-env.sock';
    try {
      expect(new DsecClient().socketPath).toBe('/tmp/from-env.sock');
      delete process.env.DSEC_SOCKET;
      expect(new DsecClient().socketPath).toBe('/run/dsec/dsecd.sock');
    } finally {
      if (old === undefined) delete process.env.DSEC_SOCKET;
      else process.env.DSEC_SOCKET = old;
    }
  });

  it('a daemon that never answers is DeadlineExceeded after timeoutMs', async () => {
    const f = await fakeDsecd(() => {
      /* never answer */
    });
    const e = await client(f, 30).version().catch((x) => x);
    expect(e).toMatchObject({ code: 'DeadlineExceeded', status: 0 });
    expect(e.message).toMatch(/within 30 ms/);
  });

  it('an aborted exec rejects with the signal reason', async () => {
    const f = await fakeDsecd(() => {
      /* never answer */
    });
    const ac = new AbortController();
    const p = client(f).exec('abc', { argv: ['sleep', '100'], signal: ac.signal });
    await tick();
    ac.abort();
    const e = await p.catch((x) => x);
    expect(e).not.toBeInstanceOf(DsecApiError);
    expect(e.name).toBe('AbortError');
  });

  it('close() is safe twice', () => {
    const c = new DsecClient({ socketPath: '/nonexistent' });
    c.close();
    c.close();
  });
});

describe('DsecClient.events', () => {
  const ev = (i: number, extra: Partial<Event> = {}): Event => ({ time: 1_700_000_000_000 + i, type: 'sandbox.created', sandbox_id: `id${i}`, state: 'running', ...extra });

  it('reassembles NDJSON lines split across chunks (even inside a UTF-8 character) and skips blank lines', async () => {
    const lines = [ev(1), ev(2, { message: 'naïve ✓ 日本' }), ev(3)].map((e) => JSON.stringify(e) + '\n').join('') + '\n';
    const bytes = Buffer.from(lines, 'utf8');
    const f = await fakeDsecd(async (req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      // Odd-sized pieces: cut through JSON, newlines and multi-byte characters.
      for (let i = 0; i < bytes.length; i += 7) {
        res.write(bytes.subarray(i, i + 7));
        await tick(1);
      }
      res.end();
    });
    const got: Event[] = [];
    for await (const e of client(f).events({ selector: 'job=a', since: 5 })) got.push(e);
    expect(got).toEqual([ev(1), ev(2, { message: 'naïve ✓ 日本' }), ev(3)]);
    expect(f.seen[0].url).toBe('/v1/events?selector=job%3Da&since=5');
  });

  it('a final line without a newline still counts', async () => {
    const f = await fakeDsecd((_req, res) => {
      res.writeHead(200);
      res.end(JSON.stringify(ev(1)) + '\n' + JSON.stringify(ev(2)));
    });
    const got: Event[] = [];
    for await (const e of client(f).events()) got.push(e);
    expect(got.map((e) => e.sandbox_id)).toEqual(['id1', 'id2']);
  });

  it('follow stays open until the signal aborts, then ends without an error', async () => {
    const f = await fakeDsecd((_req, res) => {
      res.writeHead(200);
      res.write(JSON.stringify(ev(1)) + '\n');
      // and then nothing more: a quiet follow stream
    });
    const ac = new AbortController();
    const got: Event[] = [];
    for await (const e of client(f).events({ follow: true, signal: ac.signal })) {
      got.push(e);
      setTimeout(() => ac.abort(), 5);
    }
    expect(got).toHaveLength(1);
    expect(f.seen[0].url).toBe('/v1/events?follow=true');
  });

  it('breaking out of the loop closes the stream', async () => {
    const f = await fakeDsecd(async (_req, res) => {
      res.writeHead(200);
      for (let i = 0; i < 3; i++) res.write(JSON.stringify(ev(i)) + '\n');
    });
    for await (const e of client(f).events({ follow: true })) {
      expect(e.sandbox_id).toBe('id0');
      break;
    }
  });

  it('an error status on open is a DsecApiError, a malformed line is Internal', async () => {
    const f = await fakeDsecd((req, res) => {
      if (req.url.includes('selector')) return json(res, 400, { error: { code: 'InvalidArgument', message: 'bad selector' } });
      res.writeHead(200);
      res.end('{"time":1,"type":"x","sandbox_id":null}\nnot json\n');
    });
    const c = client(f);
    const drain = async (it: AsyncIterable<Event>) => {
      for await (const _ of it);
    };
    expect(await drain(c.events({ selector: 'x=' })).catch((x) => x)).toMatchObject({ code: 'InvalidArgument', status: 400 });
    const e = await drain(c.events()).catch((x) => x);
    expect(e).toMatchObject({ code: 'Internal' });
    expect(e.message).toContain('not json');
  });
});
