// The SDK's exec-session, attach, stats, logs and files calls against the fake dsecd:
// paths, queries and bodies on the wire; streamed uploads and downloads; the attach
// WebSocket's messages, errors and lifecycle promises.
import { mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { DsecApiError, DsecClient, type ExecInfo } from '../../sdk/index.js';
import { fail, json, ok, startFakeDsecd, type FakeDsecd } from '../fixtures/fake-dsecd.js';

let fake: FakeDsecd;
let c: DsecClient;
beforeEach(async () => {
  fake = await startFakeDsecd();
  c = new DsecClient({ socketPath: fake.socketPath });
});
afterEach(async () => {
  c.close();
  await fake.close();
});

const ID = 'sb1';
const EID = 'e'.repeat(32);
const info = (over: Partial<ExecInfo> = {}): ExecInfo => ({
  exec_id: EID, sandbox_id: ID, argv: ['sh'], tty: false, state: 'running', pid: 9, started_at: 1, finished_at: null, exit_code: null,
  signal: null, timed_out: false, error: null, stdout_bytes: 0, stderr_bytes: 0, stdout_dropped_bytes: 0, stderr_dropped_bytes: 0, ...over,
});
const text = async (r: Readable) => {
  const parts: Buffer[] = [];
  for await (const p of r) parts.push(p as Buffer);
  return Buffer.concat(parts).toString();
};

describe('exec sessions', () => {
  it('sends each call to its path with its body and query', async () => {
    fake.handler = (req, res) => {
      if (req.path.endsWith('/output')) {
        res.writeHead(200, { 'content-type': 'application/octet-stream' });
        res.write('part1 ');
        setTimeout(() => res.end('part2'), 5);
        return;
      }
      if (req.method === 'POST' && req.path.endsWith('/stdin')) {
        res.writeHead(204);
        return res.end();
      }
      if (req.method === 'GET' && req.path.endsWith('/execs')) return json(res, 200, { execs: [info()] });
      json(res, req.method === 'POST' && req.path.endsWith('/execs') ? 201 : 200, info());
    };
    await c.startExec(ID, { argv: ['sh', '-c', 'x'], env: { A: '1' }, cwd: '/w', user: 'u', stdin: true, tty: { rows: 24, cols: 80 }, timeoutMs: 1000 });
    expect(await c.listExecs(ID)).toHaveLength(1);
    await c.getExec(ID, EID);
    expect(await text(await c.execOutput(ID, EID, { stream: 'stderr', offset: 10, follow: true }))).toBe('part1 part2');
    await c.writeExecStdin(ID, EID, Buffer.from('abc'));
    await c.writeExecStdin(ID, EID, Readable.from([Buffer.from('de'), Buffer.from('f')]), { eof: true });
    await c.signalExec(ID, EID, 'TERM');
    await c.resizeExec(ID, EID, 30, 100);
    await c.waitExec(ID, EID, { timeoutMs: 500 });
    await c.removeExec(ID, EID);
    const base = `/v1/sandboxes/${ID}/execs`;
    expect(fake.seen.map((s) => `${s.method} ${s.url}`)).toEqual([
      `POST ${base}`,
      `GET ${base}`,
      `GET ${base}/${EID}`,
      `GET ${base}/${EID}/output?stream=stderr&offset=10&follow=true`,
      `POST ${base}/${EID}/stdin`,
      `POST ${base}/${EID}/stdin?eof=true`,
      `POST ${base}/${EID}/signal`,
      `POST ${base}/${EID}/resize`,
      `POST ${base}/${EID}/wait?timeout_ms=500`,
      `DELETE ${base}/${EID}`,
    ]);
    expect(fake.seen[0].body).toEqual({ argv: ['sh', '-c', 'x'], env: { A: '1' }, cwd: '/w', user: 'u', stdin: true, tty: { rows: 24, cols: 80 }, timeout_ms: 1000 });
    expect(fake.seen[4].raw.toString()).toBe('abc');
    expect(fake.seen[4].headers['content-type']).toBe('application/octet-stream');
    expect(fake.seen[5].raw.toString()).toBe('def');
    expect(fake.seen[5].headers['transfer-encoding']).toBe('chunked');
    expect(fake.seen[6].body).toEqual({ signal: 'TERM' });
    expect(fake.seen[7].body).toEqual({ rows: 30, cols: 100 });
  });

  it('an error answer to a stream is a DsecApiError before any byte', async () => {
    fake.routes['GET /v1/sandboxes/:id/execs/:eid/output'] = fail(404, 'NotFound', 'exec x not found');
    await expect(c.execOutput(ID, 'x')).rejects.toMatchObject({ code: 'NotFound', message: 'exec x not found' });
  });
});

describe('attachExec', () => {
  const route = 'GET /v1/sandboxes/:id/execs/:eid/attach';

  it('delivers stdout/stderr chunks and the exit ExecInfo; sends stdin (queued before open), eof, resize, signal', async () => {
    const got: { bin: Buffer[]; text: unknown[]; query?: URLSearchParams } = { bin: [], text: [] };
    fake.wsRoutes[route] = (ws, req) => {
      got.query = req.query;
      ws.on('message', (d: Buffer, isBinary: boolean) => {
        if (isBinary) got.bin.push(d);
        else {
          const m = JSON.parse(d.toString());
          got.text.push(m);
          if (m.type === 'signal') {
            ws.send(Buffer.concat([Buffer.from([1]), Buffer.from('out')]));
            ws.send(Buffer.concat([Buffer.from([2]), Buffer.from('err')]));
            ws.send(Buffer.concat([Buffer.from([9]), Buffer.from('future channel')]));
            ws.send(JSON.stringify({ type: 'exit', ...info({ state: 'exited', exit_code: 3 }) }), () => ws.close(1000));
          }
        }
      });
    };
    const a = c.attachExec(ID, EID, { stdoutOffset: 5, killOnDetach: true });
    const events: string[] = [];
    a.on('stdout', (b) => events.push(`out:${b}`));
    a.on('stderr', (b) => events.push(`err:${b}`));
    a.on('exit', (i) => events.push(`exit:${i.exit_code}`));
    a.on('close', (code) => events.push(`close:${code}`));
    a.write('typed');
    a.eof();
    a.resize(10, 20);
    a.signal('SIGINT');
    await a.opened;
    const done = await a.done;
    expect(done).toMatchObject({ exec_id: EID, exit_code: 3 });
    expect((done as Record<string, unknown>).type).toBeUndefined();
    await new Promise((r) => a.once('close', r));
    expect(events).toEqual(['out:out', 'err:err', 'exit:3', 'close:1000']);
    expect(a.stdoutBytes).toBe(3);
    expect(a.outcome).toBe('exit');
    expect(got.query!.get('stdout_offset')).toBe('5');
    expect(got.query!.get('kill_on_detach')).toBe('true');
    expect(got.bin).toEqual([Buffer.concat([Buffer.from([0]), Buffer.from('typed')])]);
    expect(got.text).toEqual([{ type: 'stdin_eof' }, { type: 'resize', rows: 10, cols: 20 }, { type: 'signal', signal: 'SIGINT' }]);
  });

  it('an error message rejects done with its kind; a refused handshake with the HTTP error', async () => {
    fake.wsRoutes[route] = (ws) => ws.send(JSON.stringify({ type: 'error', error: { code: 'NotFound', message: 'exec gone not found' } }), () => ws.close(1008));
    const a = c.attachExec(ID, EID);
    await expect(a.done).rejects.toMatchObject({ code: 'NotFound', message: 'exec gone not found' });
    delete fake.wsRoutes[route];
    const b = c.attachExec(ID, EID);
    const err = await b.done.catch((e) => e);
    expect(err).toBeInstanceOf(DsecApiError);
    expect(err.code).toBe('NotFound');
    await expect(b.opened).rejects.toBe(err);
  });

  it('a dropped connection rejects with Unavailable; close() resolves null; no socket is Unavailable naming it', async () => {
    fake.wsRoutes[route] = (ws) => setTimeout(() => ws.terminate(), 10);
    await expect(c.attachExec(ID, EID).done).rejects.toMatchObject({ code: 'Unavailable', message: expect.stringMatching(/closed before the command ended/) });
    fake.wsRoutes[route] = () => {};
    const a = c.attachExec(ID, EID);
    await a.opened;
    a.close();
    a.close();
    expect(await a.done).toBeNull();
    expect(a.outcome).toBe('closed');
    const gone = new DsecClient({ socketPath: fake.socketPath + '.missing' });
    await expect(gone.attachExec(ID, EID).done).rejects.toMatchObject({ code: 'Unavailable', message: expect.stringMatching(/missing: no such file/) });
  });

  it('write() reports backpressure past 1 MiB queued and emits drain', async () => {
    let received = 0;
    fake.wsRoutes[route] = (ws) => ws.on('message', (d: Buffer) => (received += d.length - 1));
    const a = c.attachExec(ID, EID);
    const big = Buffer.alloc(256 * 1024);
    let full = false;
    for (let i = 0; i < 8 && !full; i++) full = !a.write(big);
    expect(full).toBe(true);
    await new Promise((r) => a.once('drain', r));
    await new Promise<void>((r) => { const t = setInterval(() => { if (received >= 4 * big.length) { clearInterval(t); r(); } }, 5); });
    a.close();
  });
});

describe('stats and logs', () => {
  it('stats() and sandboxStats() return the documents', async () => {
    const s = { time: 5, host: { cores: 2, memory_bytes: 8, memory_available_bytes: 4, load_avg: [0, 0, 0] }, sandboxes: [] };
    fake.routes['GET /v1/stats'] = ok(s);
    fake.routes['GET /v1/sandboxes/:id/stats'] = ok({ id: ID });
    expect(await c.stats()).toEqual(s);
    expect(await c.sandboxStats(ID)).toEqual({ id: ID });
  });

  it('logs() yields lines (blank ones kept, a split line and UTF-8 reassembled), follow=true when asked, and ends on abort', async () => {
    fake.routes['GET /v1/sandboxes/:id/logs'] = async (req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      const bytes = Buffer.from('a é line\n\nlast without newline');
      for (let i = 0; i < bytes.length; i += 3) {
        res.write(bytes.subarray(i, i + 3));
        await new Promise((r) => setTimeout(r, 1));
      }
      if (req.query.get('follow') !== 'true') res.end();
    };
    const lines: string[] = [];
    for await (const l of c.logs(ID)) lines.push(l);
    expect(lines).toEqual(['a é line', '', 'last without newline']);
    const abort = new AbortController();
    const followed: string[] = [];
    for await (const l of c.logs(ID, { follow: true, signal: abort.signal })) {
      followed.push(l);
      if (followed.length === 2) abort.abort();
    }
    expect(followed).toEqual(['a é line', '']);
    expect(fake.seen[1].query.get('follow')).toBe('true');
  });
});

describe('files', () => {
  it('readFile/getArchive stream, statFile parses, writeFile/putArchive upload with mode, user and parents', async () => {
    fake.routes['GET /v1/sandboxes/:id/files'] = (_req, res) => {
      res.writeHead(200);
      res.end('content');
    };
    fake.routes['GET /v1/sandboxes/:id/archive'] = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-tar' });
      res.end(Buffer.alloc(1024));
    };
    fake.routes['GET /v1/sandboxes/:id/files/stat'] = ok({ path: '/a', type: 'file', size: 7, mode: 0o644, uid: 0, gid: 0, mtime_ms: 1 });
    fake.routes['PUT /v1/sandboxes/:id/files'] = (req, res) => json(res, 201, { path: req.query.get('path'), bytes: req.raw.length });
    fake.routes['PUT /v1/sandboxes/:id/archive'] = (req, res) => json(res, 200, { entries: 1, bytes: req.raw.length });
    expect(await text(await c.readFile(ID, '/a b', { user: 'app' }))).toBe('content');
    expect((await text(await c.getArchive(ID, '/d'))).length).toBe(1024);
    expect(await c.statFile(ID, '/a')).toMatchObject({ type: 'file', size: 7 });
    // A 32 MiB upload from a generator: streamed in chunks, never as one buffer.
    const chunk = Buffer.alloc(1 << 20, 1);
    async function* gen() {
      for (let i = 0; i < 32; i++) yield chunk;
    }
    expect(await c.writeFile(ID, '/big', Readable.from(gen()), { mode: 0o600, parents: true, user: 'app' })).toEqual({ path: '/big', bytes: 32 << 20 });
    expect(await c.writeFile(ID, '/small', Buffer.from('x'))).toEqual({ path: '/small', bytes: 1 });
    expect(await c.putArchive(ID, '/d', Readable.from([Buffer.alloc(512)]))).toEqual({ entries: 1, bytes: 512 });
    await expect(c.writeFile(ID, '/x', Buffer.from('x'), { mode: 0o10000 })).rejects.toMatchObject({ code: 'InvalidArgument' });
    const urls = fake.seen.map((s) => `${s.method} ${s.url}`);
    expect(urls).toEqual([
      `GET /v1/sandboxes/${ID}/files?path=%2Fa+b&user=app`,
      `GET /v1/sandboxes/${ID}/archive?path=%2Fd`,
      `GET /v1/sandboxes/${ID}/files/stat?path=%2Fa`,
      `PUT /v1/sandboxes/${ID}/files?path=%2Fbig&mode=0600&user=app&parents=true`,
      `PUT /v1/sandboxes/${ID}/files?path=%2Fsmall`,
      `PUT /v1/sandboxes/${ID}/archive?path=%2Fd`,
    ]);
    expect(fake.seen[3].headers['transfer-encoding']).toBe('chunked');
    expect(fake.seen[4].headers['content-length']).toBe('1');
    expect(fake.seen[5].headers['content-type']).toBe('application/x-tar');
  });

  it('an early error answer stops the upload and rejects with it; a failing source rejects with its own error', async () => {
    // A server that answers at once, without reading the body (the fake reads bodies first).
    const dir = mkdtempSync(join(tmpdir(), 'dsec-early-'));
    const early = http.createServer((_req, res) => {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { code: 'NotFound', message: 'no such directory: /nope' } }));
    });
    await new Promise<void>((r) => early.listen(join(dir, 's.sock'), r));
    const ec = new DsecClient({ socketPath: join(dir, 's.sock') });
    async function* endless() {
      for (;;) yield Buffer.alloc(64 * 1024);
    }
    const src = Readable.from(endless());
    try {
      await expect(ec.writeFile(ID, '/nope/f', src)).rejects.toMatchObject({ code: 'NotFound', message: 'no such directory: /nope' });
      expect(src.destroyed).toBe(true);
    } finally {
      ec.close();
      early.closeAllConnections();
      await new Promise((r) => early.close(r));
      rmSync(dir, { recursive: true, force: true });
    }
    fake.routes['PUT /v1/sandboxes/:id/files'] = (req, res) => json(res, 201, { path: '/f', bytes: req.raw.length });
    const broken = new Readable({ read() { this.destroy(Object.assign(new Error('EIO: disk read failed'), { code: 'EIO' })); } });
    await expect(c.writeFile(ID, '/f', broken)).rejects.toThrow(/EIO: disk read failed/);
  });
});
