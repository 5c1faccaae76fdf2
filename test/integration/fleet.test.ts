/**
 * The fleet end to end (issue 20): real etcd with TLS, users and roles; three dsecd hosts
 * each in a network namespace of its own; two gateways. Through a gateway: a job of 12
 * spreads over the hosts; exec, a PTY over the attach WebSocket, cp (archives), logs and
 * logs -f; bulk pause and resume of the job across hosts; kill -9 of a host (the gateway
 * marks it down, its sandboxes read unreachable, creations go elsewhere; back: routable
 * with its state); a token revoked through one host's socket is refused at every gateway
 * and host, and its open streams close. Order of events is asserted, never time.
 */
import https from 'node:https';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import type { IncomingMessage } from 'node:http';
import tarStream from 'tar-stream';
import WebSocket from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { lineReader } from '../fixtures/ndjson.js';
import { IS_ROOT, REPO } from './harness.js';
import { DsecClient } from '../../sdk/index.js';
import { inNetns, TestFleet } from '../fixtures/fleet.js';

const run = IS_ROOT ? describe : describe.skip;

/** A tar holding one file. */
async function tarOf(name: string, text: string): Promise<Buffer> {
  const pack = tarStream.pack();
  pack.entry({ name, mode: 0o644 }, text);
  pack.finalize();
  const chunks: Buffer[] = [];
  for await (const c of pack) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

/** The entries of a tar: name -> content. */
async function untar(buf: Buffer): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  const ex = tarStream.extract();
  const done = new Promise<void>((resolve, reject) => {
    ex.on('entry', (h, s, next) => {
      const chunks: Buffer[] = [];
      s.on('data', (c: Buffer) => chunks.push(c));
      s.on('end', () => {
        out[h.name] = Buffer.concat(chunks).toString();
        next();
      });
    });
    ex.on('finish', resolve);
    ex.on('error', reject);
  });
  ex.end(buf);
  await done;
  return out;
}

/** A streamed GET through gateway `g`: resolves with the response once it started (the caller reads and ends it). */
function openStream(f: TestFleet, p: string, token: string, g = 1): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const req = https.get({ host: '127.0.0.1', port: f.gateways[g - 1].port, path: p, headers: { authorization: `Bearer ${token}` }, ca: readFileSync(f.caFile, 'utf8'), agent: false }, resolve);
    req.on('error', reject);
  });
}

run('fleet: three hosts in their own namespaces, two gateways, real etcd', () => {
  const f = TestFleet.create({ gateways: 2 });
  const job: string[] = [];
  const hostOf = new Map<string, string>();

  beforeAll(() => f.up(), 300_000);
  afterAll(() => f.stop(), 180_000);

  it('lists the three hosts up, with their labels, load and backends', async () => {
    const r = await f.request('GET', '/v1/hosts');
    expect(r.status).toBe(200);
    expect(r.json.hosts.map((h: { name: string; state: string }) => [h.name, h.state])).toEqual([['h1', 'up'], ['h2', 'up'], ['h3', 'up']]);
    expect(r.json.hosts[0].backends).toContain('container');
    expect(r.json.view.fresh).toBe(true);
  });

  it('spreads a job of 12 sandboxes over the hosts', async () => {
    for (let i = 0; i < 12; i++) {
      const r = await f.request('POST', '/v1/sandboxes', { json: { image: 'busybox', labels: { job: 'j12', i: String(i) } } });
      expect(r.status, r.body).toBe(201);
      job.push(r.json.id);
    }
    const l = await f.request('GET', '/v1/sandboxes?selector=job%3Dj12');
    expect(l.status).toBe(200);
    expect(l.json.sandboxes.map((s: { id: string }) => s.id).sort()).toEqual([...job].sort());
    const per: Record<string, number> = {};
    for (const s of l.json.sandboxes as Array<{ id: string; host: string }>) {
      per[s.host] = (per[s.host] ?? 0) + 1;
      hostOf.set(s.id, s.host);
    }
    // 4 each when the gateway's count of the job is exact; a host's report taken while a
    // create is in flight there counts that create twice for a moment (gateway/table.ts), so one more or less.
    expect(Object.keys(per).sort()).toEqual(['h1', 'h2', 'h3']);
    for (const n of Object.values(per)) expect(n).toBeGreaterThanOrEqual(3);
    expect(Math.max(...Object.values(per)) - Math.min(...Object.values(per))).toBeLessThanOrEqual(2);
    expect(l.json.hosts.map((h: { name: string; outcome: string }) => h.outcome)).toEqual(['ok', 'ok', 'ok']);
    // Each id names its host: its tag is the host's.
    const hosts = (await f.request('GET', '/v1/hosts')).json.hosts as Array<{ name: string; tag: string }>;
    for (const id of job) expect(hosts.find((h) => h.tag === id.slice(0, 6))?.name).toBe(hostOf.get(id));
  }, 240_000);

  it('runs exec, cp (archives both ways) and logs through the gateway', async () => {
    const id = job[0];
    const e = await f.request('POST', `/v1/sandboxes/${id}/exec`, { json: { argv: ['sh', '-c', 'echo out-$HOSTNAME; echo err >&2'] } });
    expect(e.status).toBe(200);
    expect(Buffer.from(e.json.stdout_b64, 'base64').toString()).toMatch(/^out-/);
    expect(Buffer.from(e.json.stderr_b64, 'base64').toString()).toBe('err\n');
    const put = await f.request('PUT', `/v1/sandboxes/${id}/archive?path=/tmp`, { raw: await tarOf('hello.txt', 'through the gateway\n'), headers: { 'content-type': 'application/x-tar' } });
    expect(put.status, put.body).toBe(200);
    const cat = await f.request('POST', `/v1/sandboxes/${id}/exec`, { json: { argv: ['cat', '/tmp/hello.txt'] } });
    expect(Buffer.from(cat.json.stdout_b64, 'base64').toString()).toBe('through the gateway\n');
    const res = await openStream(f, `/v1/sandboxes/${id}/archive?path=/tmp/hello.txt`, f.tokens.user);
    expect(res.statusCode).toBe(200);
    const chunks: Buffer[] = [];
    for await (const c of res) chunks.push(c as Buffer);
    expect(await untar(Buffer.concat(chunks))).toEqual({ 'hello.txt': 'through the gateway\n' });
    const logs = await f.request('GET', `/v1/sandboxes/${id}/logs`);
    expect(logs.status).toBe(200);
    expect(logs.body).toContain('sandbox.created state=running');
  }, 120_000);

  it('follows logs (-f) through the gateway as new commands run', async () => {
    const id = job[1];
    const res = await openStream(f, `/v1/sandboxes/${id}/logs?follow=true`, f.tokens.user);
    expect(res.statusCode).toBe(200);
    let text = '';
    const seen = new Promise<void>((resolve) => res.on('data', (c: Buffer) => {
      text += c.toString();
      if (text.includes('sandbox.resumed')) resolve();
    }));
    // A pause and a resume happen after the stream opened: their lines arrive on it.
    await f.request('POST', `/v1/sandboxes/${id}/pause`);
    await f.request('POST', `/v1/sandboxes/${id}/resume`);
    await seen;
    expect(text.indexOf('sandbox.paused')).toBeLessThan(text.indexOf('sandbox.resumed'));
    res.destroy();
  }, 120_000);

  it('attaches a PTY over the WebSocket through the gateway', async () => {
    const id = job[2];
    const s = await f.request('POST', `/v1/sandboxes/${id}/execs`, { json: { argv: ['sh'], stdin: true, tty: { rows: 24, cols: 80 } } });
    expect(s.status, s.body).toBe(201);
    const ws = new WebSocket(`wss://127.0.0.1:${f.gateways[0].port}/v1/sandboxes/${id}/execs/${s.json.exec_id}/attach`, {
      headers: { authorization: `Bearer ${f.tokens.user}` }, ca: readFileSync(f.caFile, 'utf8'),
    });
    let out = '';
    const exit = new Promise<any>((resolve, reject) => {
      ws.on('message', (data, binary) => {
        if (binary) out += (data as Buffer).subarray(1).toString();
        else {
          const m = JSON.parse(data.toString());
          if (m.type === 'exit') resolve(m);
          if (m.type === 'error') reject(new Error(m.error.message));
        }
      });
      ws.on('error', reject);
    });
    await new Promise((r) => ws.once('open', r));
    ws.send(JSON.stringify({ type: 'resize', rows: 30, cols: 100 }));
    ws.send(Buffer.concat([Buffer.from([0]), Buffer.from('stty size; tty; exit 3\n')]));
    const m = await exit;
    expect(m.exit_code).toBe(3);
    expect(out).toContain('30 100');
    expect(out).toMatch(/\/dev\/pts\/\d+/);
    ws.close();
  }, 120_000);

  it('runs commands over an exec channel through the gateway', async () => {
    const id = job[2];
    const client = new DsecClient({ remote: { url: f.url(), token: f.tokens.user, ca: readFileSync(f.caFile) } });
    const ch = client.execChannel(id);
    const rs = await Promise.all([ch.exec({ argv: ['echo', 'one'] }), ch.exec({ argv: ['sh', '-c', 'echo two >&2; exit 4'] })]);
    expect(rs[0].stdout.toString()).toBe('one\n');
    expect(rs[1]).toMatchObject({ exit_code: 4 });
    expect(rs[1].stderr.toString()).toBe('two\n');
    ch.close();
    await expect(client.execChannel('0123456789abcdef').opened).rejects.toMatchObject({ code: 'NotFound' });
    // The run channel stays on a host: the gateway says so and names what to use instead.
    await expect(client.runChannel().opened).rejects.toMatchObject({ code: 'NotFound', message: expect.stringMatching(/POST \/v1\/run/) });
  }, 120_000);

  it('serves the CLI unchanged: dsec hosts, ls, exec, cp and logs through a gateway (DSEC_HOST)', async () => {
    const env = { DSEC_HOST: f.url(), DSEC_CA: f.caFile, DSEC_TOKEN: f.tokens.user, HOME: f.dir };
    const dsec = (args: string[], input?: string) => execa(process.execPath, [path.join(REPO, 'bin/dsec'), ...args], { env, reject: false, input });
    const hosts = await dsec(['hosts']);
    expect(hosts.exitCode, hosts.stderr).toBe(0);
    expect(String(hosts.stdout)).toMatch(/^h1\s+default\s+up\s/m);
    const ls = await dsec(['--json', 'ls', '--selector', 'job=j12']);
    expect(JSON.parse(String(ls.stdout)).sandboxes ?? JSON.parse(String(ls.stdout))).toHaveLength(12);
    const id = job[3];
    const ex = await dsec(['exec', id, '--', 'sh', '-c', 'echo cli-through-gateway']);
    expect(ex.exitCode, ex.stderr).toBe(0);
    expect(String(ex.stdout)).toBe('cli-through-gateway');
    const src = path.join(f.dir, 'cp-src.txt');
    writeFileSync(src, 'copied by dsec cp\n');
    const cp = await dsec(['cp', src, `${id}:/tmp/`]);
    expect(cp.exitCode, cp.stderr).toBe(0);
    const cat = await dsec(['exec', id, '--', 'cat', '/tmp/cp-src.txt']);
    expect(String(cat.stdout)).toBe('copied by dsec cp');
    const logs = await dsec(['logs', id]);
    expect(logs.exitCode, logs.stderr).toBe(0);
    expect(String(logs.stdout)).toContain('sandbox.created');
    // top shows the fleet: every host listed, each row naming its host; host=NAME drills in.
    const top = await dsec(['--json', 'top', '--interval', '200ms', '--filter', 'host=h2']);
    expect(top.exitCode, top.stderr).toBe(0);
    const t = JSON.parse(String(top.stdout));
    expect(t.hosts.map((h: { name: string; outcome: string }) => [h.name, h.outcome])).toEqual([['h1', 'ok'], ['h2', 'ok'], ['h3', 'ok']]);
    const h2 = t.hosts.find((h: { name: string }) => h.name === 'h2');
    expect(t.sandboxes.length).toBe(h2.sandboxes);
    expect(t.sandboxes.length).toBeGreaterThan(0);
    expect(t.sandboxes.every((x: { host: string }) => x.host === 'h2')).toBe(true);
    expect(t.host.cores).toBe(h2.host.cores);
  }, 120_000);

  it('pauses and resumes the job across hosts in one bulk call', async () => {
    const p = await f.request('POST', '/v1/sandboxes/bulk', { json: { selector: 'job=j12', action: 'pause' } });
    expect(p.status, p.body).toBe(200);
    expect(p.json.results).toHaveLength(12);
    expect(p.json.results.every((r: { ok: boolean; state: string }) => r.ok && r.state === 'paused')).toBe(true);
    expect(new Set(p.json.results.map((r: { host: string }) => r.host))).toEqual(new Set(['h1', 'h2', 'h3']));
    expect(p.json.hosts.map((h: { outcome: string }) => h.outcome)).toEqual(['ok', 'ok', 'ok']);
    const l = await f.request('GET', '/v1/sandboxes?selector=job%3Dj12');
    expect(l.json.sandboxes.map((s: { state: string }) => s.state)).toEqual(Array(12).fill('paused'));
    const r = await f.request('POST', '/v1/sandboxes/bulk', { json: { selector: 'job=j12', action: 'resume' } });
    expect(r.json.results.every((x: { ok: boolean; state: string }) => x.ok && x.state === 'running')).toBe(true);
  }, 180_000);

  it('kill -9 of a host: marked down, its sandboxes unreachable, creates go elsewhere; restarted: routable with its state', async () => {
    const h2 = f.hosts.get('h2')!;
    const onH2 = job.filter((id) => hostOf.get(id) === 'h2');
    // One of h2's sandboxes paused, to see its state survive.
    const paused = onH2[0];
    expect((await f.request('POST', `/v1/sandboxes/${paused}/pause`)).status).toBe(200);
    const events = await openStream(f, '/v1/events?follow=true', f.tokens.admin);
    const eventLines = lineReader(events);
    await h2.kill9();
    const order: string[] = [];
    // 1. the gateway's event stream says h2 is down (its lease lapsed)
    await eventLines.until((o) => o.type === 'host.down' && o.host === 'h2');
    order.push('down');
    // 2. its sandboxes read unreachable, and hosts list it down
    const g = await f.request('GET', `/v1/sandboxes/${paused}`);
    expect(g.status).toBe(200);
    expect(g.json.state).toBe('unreachable');
    expect(g.json.host).toBe('h2');
    const e = await f.request('POST', `/v1/sandboxes/${onH2[1]}/exec`, { json: { argv: ['true'] } });
    expect(e.status).toBe(503);
    expect(e.json.error.message).toMatch(/host h2 is down/);
    expect((await f.request('GET', '/v1/hosts')).json.hosts.find((h: { name: string }) => h.name === 'h2').state).toBe('down');
    const l = await f.request('GET', '/v1/sandboxes?selector=job%3Dj12');
    expect(l.json.sandboxes.filter((s: { host: string }) => s.host === 'h2').map((s: { state: string }) => s.state)).toEqual(Array(onH2.length).fill('unreachable'));
    expect(l.json.hosts.find((h: { name: string }) => h.name === 'h2').outcome).toBe('down');
    order.push('unreachable');
    // 3. creations succeed elsewhere
    const made: string[] = [];
    for (let i = 0; i < 4; i++) {
      const c = await f.request('POST', '/v1/sandboxes', { json: { image: 'busybox', labels: { job: 'after-kill' } } });
      expect(c.status, c.body).toBe(201);
      made.push(c.json.id);
    }
    const placed = (await f.request('GET', '/v1/sandboxes?selector=job%3Dafter-kill')).json.sandboxes.map((s: { host: string }) => s.host);
    expect(placed.filter((h: string) => h === 'h2')).toEqual([]);
    order.push('created elsewhere');
    // 4. restarted: up again, its sandboxes routable with their state
    await h2.launch();
    await eventLines.until((o) => o.type === 'host.up' && o.host === 'h2');
    order.push('up');
    events.destroy();
    expect((await f.request('GET', `/v1/sandboxes/${paused}`)).json.state).toBe('paused');
    expect((await f.request('POST', `/v1/sandboxes/${paused}/resume`)).status).toBe(200);
    const x = await f.request('POST', `/v1/sandboxes/${onH2[1]}/exec`, { json: { argv: ['echo', 'back'] } });
    expect(Buffer.from(x.json.stdout_b64, 'base64').toString()).toBe('back\n');
    expect(order).toEqual(['down', 'unreachable', 'created elsewhere', 'up']);
    for (const id of made) await f.request('DELETE', `/v1/sandboxes/${id}?force=true`);
  }, 240_000);

  it('a token revoked through one host is refused at every gateway and host, and its streams close', async () => {
    const made = await f.request('POST', '/v1/tokens', { token: f.tokens.admin, json: { tenant: 'demo', role: 'user' } });
    expect(made.status, made.body).toBe(201);
    const t = made.json.token as string;
    for (const g of [1, 2]) expect((await f.request('GET', '/v1/sandboxes', { token: t, gateway: g })).status).toBe(200);
    const stream = await openStream(f, '/v1/events?follow=true', t, 2);
    expect(stream.statusCode).toBe(200);
    const closed = new Promise<void>((resolve) => stream.on('close', () => resolve()));
    stream.resume();
    // Revoked on h1's own socket: its token store is etcd.
    const h1 = f.hosts.get('h1')!;
    const rv = await (h1.client as unknown as { request<T>(m: string, p: string): Promise<T> }).request<{ state: string }>('DELETE', `/v1/tokens/${made.json.id}`);
    expect(rv.state).toBe('revoked');
    await closed;
    for (const g of [1, 2]) {
      const r = await f.request('GET', '/v1/sandboxes', { token: t, gateway: g });
      expect(r.status).toBe(401);
    }
    // A host's own port takes gateway certificates only: the token alone gets no TLS session there.
    for (const h of ['h1', 'h2', 'h3']) {
      const r = await inNetns(f.ns('gw1'), ['curl', '-sS', '-o', '/dev/null', '-w', '%{http_code}', '--cacert', f.caFile, '-H', `Authorization: Bearer ${t}`, `https://${f.hostAddr(h)}:8443/v1/sandboxes`]);
      expect(r.exitCode).not.toBe(0);
      expect(String(r.stdout)).toBe('000');
    }
  }, 120_000);

  it('destroys the job through the gateway', async () => {
    const d = await f.request('POST', '/v1/sandboxes/bulk', { json: { selector: 'job=j12', action: 'destroy' } });
    expect(d.json.results.filter((r: { ok: boolean }) => r.ok)).toHaveLength(12);
    expect((await f.request('GET', '/v1/sandboxes?selector=job%3Dj12')).json.sandboxes).toEqual([]);
  }, 120_000);
});
