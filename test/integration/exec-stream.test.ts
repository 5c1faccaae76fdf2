/**
 * Exec sessions: streamed output with bounded daemon memory, stdin, signals, PTYs,
 * background execs that outlive their client and re-attach, ownership, bad input.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync, chmodSync } from 'node:fs';
import http from 'node:http';
import { execa } from 'execa';
import WebSocket from 'ws';
import { IS_ROOT, TestDaemon } from './harness.js';

interface Info { exec_id: string; state: string; exit_code: number | null; signal: string | null; stdout_bytes: number; error: string | null; pid: number | null }

/** RSS of a process in bytes (VmRSS). */
function rss(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : 0;
}

describe.skipIf(!IS_ROOT)('exec sessions', () => {
  let d: TestDaemon;
  let sb: string;
  const api = <T>(method: string, p: string, body?: unknown) => d.client.request<T>(method, `/v1/sandboxes/${sb}${p}`, body);
  /** Streams GET .../output and returns the bytes (or just their count when `count`). */
  const output = (eid: string, q: string, onChunk?: (n: number) => void): Promise<Buffer> => new Promise((resolve, reject) => {
    http.get({ socketPath: d.socket, path: `/v1/sandboxes/${sb}/execs/${eid}/output?${q}` }, (res) => {
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => (onChunk ? onChunk(c.length) : parts.push(c)));
      res.on('end', () => resolve(Buffer.concat(parts)));
      res.on('error', reject);
    }).on('error', reject);
  });
  const ws = (eid: string, q = '') => new WebSocket(`ws+unix://${d.socket}:/v1/sandboxes/${sb}/execs/${eid}/attach${q ? `?${q}` : ''}`);

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 16 });
    sb = (await d.client.createSandbox({ image: 'busybox' })).id;
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('streams 100 MB of output while dsecd memory stays bounded', async () => {
    const base = rss(d.pid);
    let peak = base;
    const timer = setInterval(() => { peak = Math.max(peak, rss(d.pid)); }, 20);
    const e = await api<Info>('POST', '/execs', { argv: ['head', '-c', '104857600', '/dev/zero'] });
    let got = 0;
    await output(e.exec_id, 'follow=true', (n) => { got += n; });
    clearInterval(timer);
    const done = await api<Info>('GET', `/execs/${e.exec_id}`);
    expect(got).toBe(104857600);
    expect(done).toMatchObject({ state: 'exited', exit_code: 0, stdout_bytes: 104857600 });
    const grew = peak - base;
    console.log(`exec-stream: 100 MiB streamed; dsecd RSS ${Math.round(base / 2 ** 20)} MiB -> peak ${Math.round(peak / 2 ** 20)} MiB (+${(grew / 2 ** 20).toFixed(1)} MiB)`);
    expect(grew).toBeLessThan(64 * 2 ** 20);
  });

  it('stdin round trip through cat, by HTTP and by WebSocket', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['cat'], stdin: true });
    await d.client.request('POST', `/v1/sandboxes/${sb}/execs/${e.exec_id}/stdin?eof=true`, 'hello through stdin');
    await api('POST', `/execs/${e.exec_id}/wait`);
    expect((await output(e.exec_id, '')).toString()).toBe('hello through stdin');

    const e2 = await api<Info>('POST', '/execs', { argv: ['cat'], stdin: true });
    const sock = ws(e2.exec_id);
    const out: Buffer[] = [];
    const exit = await new Promise<Record<string, unknown>>((resolve, reject) => {
      sock.on('open', () => {
        sock.send(Buffer.concat([Buffer.from([0]), Buffer.from('via ws\n')]));
        sock.send(JSON.stringify({ type: 'stdin_eof' }));
      });
      sock.on('message', (m: Buffer, binary: boolean) => {
        if (binary) out.push(m.subarray(1));
        else {
          const j = JSON.parse(m.toString());
          if (j.type === 'exit') resolve(j);
          else reject(new Error(m.toString()));
        }
      });
      sock.on('error', reject);
    });
    expect(Buffer.concat(out).toString()).toBe('via ws\n');
    expect(exit).toMatchObject({ state: 'exited', exit_code: 0 });
  });

  it('stdin nobody reads holds back its uploader, not the sandbox\'s other execs or dsecd memory', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['sleep', '60'], stdin: true });
    const base = rss(d.pid);
    const post = new Promise<number>((resolve, reject) => {
      const r = http.request({ socketPath: d.socket, method: 'POST', path: `/v1/sandboxes/${sb}/execs/${e.exec_id}/stdin`, headers: { 'content-type': 'application/octet-stream' } }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode!));
      });
      r.on('error', reject);
      r.end(Buffer.alloc(64 << 20));
    });
    const posted = post.then(() => 'stdin');
    await new Promise((r) => setTimeout(r, 500));
    const other = d.client.exec(sb, { argv: ['echo', 'not blocked'] }).then((x) => x.stdout.toString());
    expect(await Promise.race([other, posted])).toBe('not blocked\n');
    expect(rss(d.pid) - base).toBeLessThan(48 * 2 ** 20);
    // Killing the session works even though its connection is backed up with stdin.
    await api('DELETE', `/execs/${e.exec_id}`);
    await posted.catch(() => {});
  });

  it('delivers SIGTERM to a running exec', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['sh', '-c', 'trap "echo term; exit 7" TERM; while :; do sleep 0.1; done'] });
    await new Promise((r) => setTimeout(r, 300));
    await api('POST', `/execs/${e.exec_id}/signal`, { signal: 'TERM' });
    const done = await api<Info>('POST', `/execs/${e.exec_id}/wait?timeout_ms=10000`);
    expect(done.exit_code).toBe(7);
    expect((await output(e.exec_id, '')).toString()).toBe('term\n');
  });

  it('a background exec outlives its client, and a new client re-attaches from an offset', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['sh', '-c', 'for i in 1 2 3 4 5 6; do echo line$i; sleep 0.2; done'] });
    const first = ws(e.exec_id);
    const firstLine = await new Promise<string>((resolve) => first.on('message', (m: Buffer, b: boolean) => { if (b) resolve(m.subarray(1).toString()); }));
    first.terminate();
    expect(firstLine).toBe('line1\n');
    const again = ws(e.exec_id, `stdout_offset=${firstLine.length}`);
    const rest: Buffer[] = [];
    const exit = await new Promise<Record<string, unknown>>((resolve) => again.on('message', (m: Buffer, b: boolean) => {
      if (b) rest.push(m.subarray(1));
      else resolve(JSON.parse(m.toString()));
    }));
    expect(Buffer.concat(rest).toString()).toBe('line2\nline3\nline4\nline5\nline6\n');
    expect(exit).toMatchObject({ type: 'exit', exit_code: 0 });
  });

  it('kill_on_detach kills the command when its WebSocket closes', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['sleep', '30'] });
    const sock = ws(e.exec_id, 'kill_on_detach=true');
    await new Promise((r) => sock.on('open', r));
    sock.close();
    const done = await api<Info>('POST', `/execs/${e.exec_id}/wait?timeout_ms=10000`);
    expect(done).toMatchObject({ state: 'exited', signal: 'SIGKILL' });
  });

  it('runs under a PTY with resize', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['sh', '-c', 'stty size; read x; stty size; exit 3'], tty: { rows: 30, cols: 90 }, stdin: true });
    await new Promise((r) => setTimeout(r, 300));
    await api('POST', `/execs/${e.exec_id}/resize`, { rows: 50, cols: 120 });
    await d.client.request('POST', `/v1/sandboxes/${sb}/execs/${e.exec_id}/stdin`, 'go\n');
    const done = await api<Info>('POST', `/execs/${e.exec_id}/wait?timeout_ms=10000`);
    expect(done.exit_code).toBe(3);
    const text = (await output(e.exec_id, '')).toString();
    expect(text).toContain('30 90');
    expect(text).toContain('50 120');
  });

  it('bad input: missing binary is 127 with a message; resize without tty, unknown signal are InvalidArgument; garbage on the WebSocket closes it', async () => {
    const nf = await api<Info>('POST', '/execs', { argv: ['no-such-thing'] });
    const done = await api<Info>('POST', `/execs/${nf.exec_id}/wait`);
    expect(done.exit_code).toBe(127);
    expect(done.error).toMatch(/no-such-thing/);
    const e = await api<Info>('POST', '/execs', { argv: ['sleep', '30'] });
    await expect(api('POST', `/execs/${e.exec_id}/resize`, { rows: 5, cols: 5 })).rejects.toMatchObject({ code: 'InvalidArgument' });
    await expect(api('POST', `/execs/${e.exec_id}/signal`, { signal: 'SIGNOPE' })).rejects.toMatchObject({ code: 'InvalidArgument' });
    const sock = ws(e.exec_id);
    const closeCode = await new Promise<number>((resolve) => {
      sock.on('open', () => sock.send('this is not json'));
      sock.on('close', (code: number) => resolve(code));
    });
    expect(closeCode).toBe(1008);
    await api('DELETE', `/execs/${e.exec_id}`);
    await expect(api('GET', `/execs/${e.exec_id}`)).rejects.toMatchObject({ code: 'NotFound' });
    expect((await d.client.version()).api).toBe('v1');
  });

  it('exec ids belong to the uid that started them', async () => {
    const e = await api<Info>('POST', '/execs', { argv: ['sleep', '30'] });
    chmodSync(d.socket, 0o666);
    try {
      const script = `const h=require('http');h.get({socketPath:${JSON.stringify(d.socket)},path:'/v1/sandboxes/${sb}/execs/${e.exec_id}'},r=>{let s='';r.on('data',c=>s+=c);r.on('end',()=>{console.log(r.statusCode, s)})})`;
      const r = await execa(process.execPath, ['-e', script], { uid: 65534, gid: 65534 });
      expect(String(r.stdout)).toMatch(/^404 .*NotFound/);
    } finally {
      chmodSync(d.socket, 0o660);
      await api('DELETE', `/execs/${e.exec_id}`);
    }
  });
});
