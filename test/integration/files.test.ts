/**
 * Files through the agent: a 1 GiB file in and out with bounded daemon memory, a slow
 * reader and a frozen agent that dsecd waits for rather than buffers, stat, list, mkdir,
 * remove, tar archives both ways, and paths that try to leave the sandbox.
 *
 * dsecd's memory during a transfer is asserted as what its buffers hold (the
 * `dsec_file_transfer_buffered_bytes*` metrics, measured by the routes whenever a buffer
 * may grow) against the design bound of daemon/api/transfer.ts; RSS is only a sanity
 * check (see RSS_SLACK_BYTES).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { readFileSync } from 'node:fs';
import { Readable } from 'node:stream';
import tarStream from 'tar-stream';
import { IS_ROOT, RSS_SLACK_BYTES, TestDaemon, metricValue } from './harness.js';
import { DOWNLOAD_BUFFER_BOUND_BYTES, TRANSFER_BUFFER_BOUND_BYTES, UPLOAD_BUFFER_BOUND_BYTES } from '../../daemon/api/transfer.js';

/**
 * Polls the metric `dsec_file_transfer_buffered_bytes` until two readings 100 ms apart
 * agree (the transfer has stopped moving: one end waits), at most 100 readings; returns
 * the largest reading. The assertion on it holds at any instant; waiting only makes it
 * meaningful (the stalled end has had time to overfill a buffer that had no bound).
 */
async function settledBuffered(d: TestDaemon): Promise<number> {
  let last = -1;
  let most = 0;
  for (let i = 0; i < 100; i++) {
    const v = await metricValue(d, 'dsec_file_transfer_buffered_bytes');
    most = Math.max(most, v);
    if (v === last && v > 0) break;
    last = v;
    await new Promise((r) => setTimeout(r, 100));
  }
  return most;
}

function rss(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : 0;
}

describe.skipIf(!IS_ROOT)('files', () => {
  let d: TestDaemon;
  let sb: string;
  /** One HTTP request on the daemon socket; body may be a stream; resolves with status and body (or hash of it). */
  const req = (method: string, p: string, body?: Readable | Buffer | string, opts: { hash?: boolean; type?: string } = {}) =>
    new Promise<{ status: number; body: Buffer; sha256?: string; bytes: number }>((resolve, reject) => {
      const r = http.request({ socketPath: d.socket, method, path: `/v1/sandboxes/${sb}${p}`, headers: { 'content-type': opts.type ?? 'application/octet-stream' } }, (res) => {
        const h = createHash('sha256');
        const parts: Buffer[] = [];
        let bytes = 0;
        res.on('data', (c: Buffer) => {
          bytes += c.length;
          if (opts.hash) h.update(c);
          else parts.push(c);
        });
        res.on('end', () => resolve({ status: res.statusCode!, body: Buffer.concat(parts), bytes, ...(opts.hash ? { sha256: h.digest('hex') } : {}) }));
        res.on('error', reject);
      });
      r.on('error', reject);
      if (body instanceof Readable) body.pipe(r);
      else r.end(body);
    });
  const json = (r: { body: Buffer }) => JSON.parse(r.body.toString());

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 19, config: '[defaults]\nmemory_bytes = 1073741824\n' });
    // The tests write below /srv, /data and /copy: top-level directories busybox lacks,
    // which dsecd creates as writable places (the top level itself is read-only).
    sb = (await d.client.createSandbox({ image: 'busybox', filesystem: { writable_paths: ['/srv', '/data', '/copy'] } })).id;
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('copies a 1 GiB file in and out with equal sha256 while dsecd memory stays bounded', async () => {
    const chunk = Buffer.alloc(1 << 20);
    const total = 1024;
    const h = createHash('sha256');
    let i = 0;
    const src = new Readable({
      read() {
        if (i === total) return this.push(null);
        chunk.writeUInt32BE(i++, 0); // vary every MiB
        h.update(chunk);
        this.push(Buffer.from(chunk));
      },
    });
    const base = rss(d.pid);
    let peak = base;
    const t = setInterval(() => { peak = Math.max(peak, rss(d.pid)); }, 50);
    const put = await req('PUT', '/files?path=/root/big.bin&mode=0600', src);
    const get = await req('GET', '/files?path=/root/big.bin', undefined, { hash: true });
    clearInterval(t);
    expect(put.status).toBe(201);
    expect(json(put)).toEqual({ path: '/root/big.bin', bytes: total << 20 });
    expect(get.status).toBe(200);
    expect(get.bytes).toBe(total << 20);
    expect(get.sha256).toBe(h.digest('hex'));
    const held = await metricValue(d, 'dsec_file_transfer_buffered_bytes_peak');
    console.log(`files: 1 GiB in and out; dsecd held at most ${(held / 2 ** 20).toFixed(2)} MiB of it (bound ${(TRANSFER_BUFFER_BOUND_BYTES / 2 ** 20).toFixed(2)} MiB); RSS ${Math.round(base / 2 ** 20)} MiB -> peak ${Math.round(peak / 2 ** 20)} MiB (+${((peak - base) / 2 ** 20).toFixed(1)} MiB)`);
    expect(held).toBeGreaterThan(0);
    expect(held).toBeLessThanOrEqual(TRANSFER_BUFFER_BOUND_BYTES);
    expect(await metricValue(d, 'dsec_file_transfer_buffered_bytes')).toBe(0);
    expect(peak - base).toBeLessThan(RSS_SLACK_BYTES);
    const st = json(await req('GET', '/files/stat?path=/root/big.bin'));
    expect(st).toMatchObject({ type: 'file', size: total << 20, mode: 0o600, uid: 0 });
    expect((await req('DELETE', '/files?path=/root/big.bin')).status).toBe(204);
  });

  it('a reader that stops: dsecd holds at most the download bound and waits; the rest arrives when it reads again', async () => {
    const mib = 64;
    expect((await d.client.exec(sb, { argv: ['sh', '-c', `dd if=/dev/urandom of=/root/slow.bin bs=1M count=${mib} 2>/dev/null && sha256sum /root/slow.bin`] })).exit_code).toBe(0);
    const want = Buffer.from((await d.client.exec(sb, { argv: ['sha256sum', '/root/slow.bin'] })).stdout_b64, 'base64').toString().split(' ')[0];
    const h = createHash('sha256');
    let bytes = 0;
    let stalled = 0;
    await new Promise<void>((resolve, reject) => {
      http.get({ socketPath: d.socket, path: `/v1/sandboxes/${sb}/files?path=/root/slow.bin` }, (res) => {
        res.once('data', (c: Buffer) => {
          h.update(c);
          bytes += c.length;
          res.pause(); // the reader stops after its first chunk
          void settledBuffered(d).then((v) => {
            stalled = v;
            res.on('data', (x: Buffer) => {
              h.update(x);
              bytes += x.length;
            });
            res.on('end', () => resolve());
            res.resume();
          }, reject);
        });
        res.on('error', reject);
      }).on('error', reject);
    });
    console.log(`files: a stopped reader of ${mib} MiB: dsecd held ${(stalled / 2 ** 20).toFixed(2)} MiB (bound ${(DOWNLOAD_BUFFER_BOUND_BYTES / 2 ** 20).toFixed(2)} MiB)`);
    expect(stalled).toBeGreaterThan(0);
    expect(stalled).toBeLessThanOrEqual(DOWNLOAD_BUFFER_BOUND_BYTES);
    expect(bytes).toBe(mib << 20);
    expect(h.digest('hex')).toBe(want);
  });

  it('an agent that stops (SIGSTOP): dsecd holds at most the upload bound and stops taking the body; the upload completes once it runs again', async () => {
    const mib = 64;
    const chunk = Buffer.alloc(1 << 20, 0x33);
    let i = 0;
    const src = new Readable({
      read() {
        this.push(i++ === mib ? null : Buffer.from(chunk));
      },
    });
    const agentPid = (await d.client.getSandbox(sb)).init_pid!;
    process.kill(agentPid, 'SIGSTOP');
    let stalled = 0;
    let sentByThen = 0;
    let put: Awaited<ReturnType<typeof req>>;
    try {
      const putting = req('PUT', '/files?path=/root/frozen.bin', src);
      stalled = await settledBuffered(d);
      sentByThen = i;
      process.kill(agentPid, 'SIGCONT');
      put = await putting;
    } finally {
      process.kill(agentPid, 'SIGCONT');
    }
    console.log(`files: an upload to a stopped agent: dsecd held ${(stalled / 2 ** 20).toFixed(2)} MiB (bound ${(UPLOAD_BUFFER_BOUND_BYTES / 2 ** 20).toFixed(2)} MiB) while the client had produced ${sentByThen} MiB`);
    expect(put.status, put.body.toString()).toBe(201);
    expect(json(put)).toEqual({ path: '/root/frozen.bin', bytes: mib << 20 });
    expect(stalled).toBeGreaterThan(0);
    expect(stalled).toBeLessThanOrEqual(UPLOAD_BUFFER_BOUND_BYTES);
    await d.client.exec(sb, { argv: ['rm', '-f', '/root/frozen.bin', '/root/slow.bin'] });
  });

  it('stat, list, mkdir -p, remove -r, as a user of the sandbox', async () => {
    expect((await req('POST', '/files/mkdir', JSON.stringify({ path: '/srv/a/b', parents: true }), { type: 'application/json' })).status).toBe(201);
    await req('PUT', '/files?path=/srv/a/b/f.txt', 'hello');
    const ls = json(await req('GET', '/files/list?path=/srv/a/b'));
    expect(ls.entries.map((e: { name: string; size: number }) => [e.name, e.size])).toEqual([['f.txt', 5]]);
    // As nobody: cannot write into a root-owned 0755 directory.
    const denied = await req('PUT', '/files?path=/srv/a/b/g.txt&user=nobody', 'x');
    expect(denied.status).toBe(412);
    expect(json(denied).error.code).toBe('FailedPrecondition');
    // Refused while the client is still sending 32 MiB: the error body still arrives.
    const big = await req('PUT', '/files?path=/etc/too-big&user=nobody', Buffer.alloc(32 << 20));
    expect(big.status).toBe(412);
    expect(json(big).error.code).toBe('FailedPrecondition');
    expect((await req('GET', '/files?path=/srv/nope')).status).toBe(404);
    expect((await req('DELETE', '/files?path=/srv/a&recursive=true')).status).toBe(204);
    expect((await req('GET', '/files/stat?path=/srv/a')).status).toBe(404);
  });

  it('refuses paths that try to leave the sandbox', async () => {
    const dots = await req('GET', '/files?path=/etc/../../etc/passwd');
    expect(dots.status).toBe(400);
    expect(json(dots).error.code).toBe('InvalidArgument');
    // A magic link (/proc/PID/root) is refused outright.
    await d.client.exec(sb, { argv: ['ln', '-sf', '/proc/1/root/etc', '/tmp/magic'] });
    const magic = await req('GET', '/files?path=/tmp/magic/passwd');
    expect(magic.status).toBe(400);
    // A plain symlink with .. stays inside: the sandbox root is the agent's root.
    await d.client.exec(sb, { argv: ['ln', '-sf', '../../../../..', '/tmp/up'] });
    const up = await req('GET', '/files?path=/tmp/up/etc/passwd');
    expect(up.status).toBe(200);
    expect(up.body.toString()).toBe(readFileSync(`/proc/${(await d.client.getSandbox(sb)).init_pid}/root/etc/passwd`, 'utf8'));
    expect(up.body.toString()).not.toBe(readFileSync('/etc/passwd', 'utf8'));
  });

  it('tar archives out and in preserve the tree; a ".." entry refuses the archive', async () => {
    await d.client.exec(sb, { argv: ['sh', '-c', 'mkdir -p /data/x/y && echo one > /data/x/1 && echo two > /data/x/y/2 && ln -s 1 /data/x/link && chmod 600 /data/x/1'] });
    const out = await req('GET', '/archive?path=/data/x');
    expect(out.status).toBe(200);
    const names: string[] = [];
    const ex = tarStream.extract();
    ex.on('entry', (h, s, next) => { names.push(`${h.type}:${h.name}`); s.resume(); s.on('end', next); });
    await new Promise((resolve, reject) => { ex.on('finish', resolve); ex.on('error', reject); ex.end(out.body); });
    expect(names.sort()).toEqual(['directory:x', 'directory:x/y', 'file:x/1', 'file:x/y/2', 'symlink:x/link']);
    await req('POST', '/files/mkdir', JSON.stringify({ path: '/copy' }), { type: 'application/json' });
    const put = await req('PUT', '/archive?path=/copy', out.body, { type: 'application/x-tar' });
    expect(json(put)).toMatchObject({ entries: 5 });
    const r = await d.client.exec(sb, { argv: ['sh', '-c', 'cat /copy/x/1 /copy/x/y/2; readlink /copy/x/link; stat -c %a /copy/x/1'] });
    expect(r.stdout.toString()).toBe('one\ntwo\n1\n600\n');

    const evil = tarStream.pack();
    evil.entry({ name: '../../evil', type: 'file' }, 'pwned');
    evil.finalize();
    const chunks: Buffer[] = [];
    for await (const c of evil) chunks.push(c as Buffer);
    const bad = await req('PUT', '/archive?path=/copy', Buffer.concat(chunks), { type: 'application/x-tar' });
    expect(bad.status).toBe(400);
    expect((await d.client.exec(sb, { argv: ['ls', '/evil', '/copy/evil'] })).exit_code).not.toBe(0);

    // Refused midway: the entries written before the bad one (a symlink, a directory and
    // a file in it) are removed again; what was there before stays.
    const mid = tarStream.pack();
    mid.entry({ name: 'planted', type: 'symlink', linkname: '/etc' });
    mid.entry({ name: 'newdir', type: 'directory' });
    mid.entry({ name: 'newdir/f', type: 'file' }, 'data');
    mid.entry({ name: 'x', type: 'directory' });
    mid.entry({ name: 'dev', type: 'character-device', devmajor: 1, devminor: 3 });
    mid.finalize();
    const midChunks: Buffer[] = [];
    for await (const c of mid) midChunks.push(c as Buffer);
    const refused = await req('PUT', '/archive?path=/copy', Buffer.concat(midChunks), { type: 'application/x-tar' });
    expect(refused.status).toBe(400);
    expect(json(refused)).toMatchObject({ error: { code: 'InvalidArgument' } });
    const left = await d.client.exec(sb, { argv: ['sh', '-c', 'ls -A /copy; ls -A /copy/x'] });
    expect(left.stdout.toString()).toBe('x\n1\nlink\ny\n');
  });

  it('a file read is one HTTP message, however the file reads: no byte the sandbox wrote lands past its end (a forged response for a keep-alive client)', async () => {
    // A process whose environment is a whole HTTP response: /proc/PID/environ stats as 0
    // bytes and reads as that text, as a file the sandbox grows while it is read does.
    const forged = 'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}x=1';
    const holder = await d.client.startExec(sb, { argv: ['env', '-i', forged, 'sleep', '100000'] });
    try {
      const found = await d.client.exec(sb, { argv: ['sh', '-c', 'for p in /proc/[0-9]*; do grep -qs "^HTTP/1.1 200" $p/environ && echo ${p#/proc/}; done'] });
      const pid = found.stdout.toString().trim();
      expect(pid).toMatch(/^\d+$/);
      // Two requests on one connection, as a keep-alive client sends them: the file, then
      // the version (which closes the connection). The raw bytes of both answers:
      const raw = await new Promise<Buffer>((resolve, reject) => {
        const c = net.connect(d.socket);
        const parts: Buffer[] = [];
        c.on('data', (b: Buffer) => parts.push(b));
        c.on('end', () => resolve(Buffer.concat(parts)));
        c.on('error', reject);
        c.write(`GET /v1/sandboxes/${sb}/files?path=/proc/${pid}/environ HTTP/1.1\r\nHost: localhost\r\n\r\n`
          + 'GET /v1/version HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n');
      });
      /** One HTTP response at the start of `buf`: its head, its body, and what follows it. */
      const message = (buf: Buffer): { head: string; body: Buffer; after: Buffer } => {
        const at = buf.indexOf('\r\n\r\n');
        const head = buf.subarray(0, at).toString();
        let rest = buf.subarray(at + 4);
        const length = /^content-length: (\d+)$/im.exec(head);
        if (length) return { head, body: rest.subarray(0, Number(length[1])), after: rest.subarray(Number(length[1])) };
        expect(head).toMatch(/^transfer-encoding: chunked$/im);
        const chunks: Buffer[] = [];
        for (;;) {
          const eol = rest.indexOf('\r\n');
          const n = parseInt(rest.subarray(0, eol).toString(), 16);
          if (n === 0) return { head, body: Buffer.concat(chunks), after: rest.subarray(eol + 4) };
          chunks.push(rest.subarray(eol + 2, eol + 2 + n));
          rest = rest.subarray(eol + 2 + n + 2);
        }
      };
      const first = message(raw);
      expect(first.head).toMatch(/^HTTP\/1.1 200 /);
      // The next bytes are dsecd's answer to the second request, not the sandbox's.
      const second = message(first.after);
      expect(second.head).toMatch(/^HTTP\/1.1 200 /);
      expect(JSON.parse(second.body.toString())).toMatchObject({ api: 'v1' });
      expect(second.after.length).toBe(0);
      const body = first.body;
      // What the read gave, all of it, as the body.
      expect(body.toString()).toBe(`${forged}\0`);
    } finally {
      await d.client.signalExec(sb, holder.exec_id, 'SIGKILL').catch(() => undefined);
    }
  });

  it('an archive upload that fills the sandbox\'s quota midway fails with the quota\'s error, its entries removed; dsecd stays up', async () => {
    // A sandbox can fill its own quota at will, so an upload into it must fail cleanly:
    // the agent's write fails mid-file (EDQUOT) and the entry's body stream is cut.
    const full = (await d.client.createSandbox({ image: 'busybox', disk_bytes: 16 * 1024 ** 2 })).id;
    const pack = tarStream.pack();
    pack.entry({ name: 'up', type: 'directory' });
    pack.entry({ name: 'up/big', type: 'file', size: 32 * 1024 ** 2 }, Buffer.alloc(32 * 1024 ** 2, 1));
    pack.entry({ name: 'up/after', type: 'file' }, 'after');
    pack.finalize();
    const chunks: Buffer[] = [];
    for await (const c of pack) chunks.push(c as Buffer);
    const e = await d.client.putArchive(full, '/root', Buffer.concat(chunks)).then(() => null, (x: unknown) => x as { code?: string; message?: string });
    expect(e).not.toBeNull();
    expect(e!.code, e!.message).toBe('ResourceExhausted');
    expect(e!.message).toMatch(/quota|No space/i);
    // Still up, and the sandbox is as before: nothing of the archive stays.
    expect((await d.client.version()).version).toBeTruthy();
    const left = await d.client.exec(full, { argv: ['sh', '-c', 'ls -A /root; echo end'] });
    expect(left.stdout.toString()).toBe('end\n');
    await d.client.deleteSandbox(full, { force: true });
  });
});
