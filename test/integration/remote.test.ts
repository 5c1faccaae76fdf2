/**
 * The TCP door (daemon/remote/door.ts) against a real dsecd on loopback: TLS 1.3 only,
 * tokens (missing, malformed, unknown, revoked, expired: one 401), roles, the same routes
 * as the socket, and the audit log.
 */
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import net from 'node:net';
import tls from 'node:tls';
import { X509Certificate } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import https from 'node:https';
import WebSocket from 'ws';
import { IS_ROOT, TestDaemon, runCli } from './harness.js';
import { auditLines, doorRequest, makeToken } from './remote-helpers.js';

describe.skipIf(!IS_ROOT)('the TCP door', () => {
  let d: TestDaemon;
  let admin: { token: string; id: string };
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 41, listen: true });
    admin = await makeToken(d, 'system', 'admin');
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('makes a CA and a server certificate for its names; the CA key is root-only', async () => {
    const ca = new X509Certificate(readFileSync(d.caFile));
    const srv = new X509Certificate(readFileSync(path.join(d.root, 'tls', 'server.crt')));
    expect(srv.checkIssued(ca)).toBe(true);
    expect(srv.checkIP('127.0.0.1')).toBe('127.0.0.1');
    expect(srv.checkHost('localhost')).toBe('localhost');
    expect(statSync(path.join(d.root, 'tls', 'ca.key')).mode & 0o777).toBe(0o600);
    expect(statSync(path.join(d.root, 'tls', 'server.key')).mode & 0o777).toBe(0o600);
    // The peer a client sees verifies against ca.crt under the name it dialled, over TLS 1.3.
    const proto = await new Promise<string | null>((resolve, reject) => {
      const s = tls.connect({ host: '127.0.0.1', port: d.remotePort!, ca: readFileSync(d.caFile), servername: 'localhost' }, () => {
        resolve(s.getProtocol());
        s.destroy();
      });
      s.on('error', reject);
    });
    expect(proto).toBe('TLSv1.3');
  });

  it('refuses plaintext HTTP and TLS 1.2', async () => {
    // Plain HTTP: the TLS server reads it as a broken handshake and drops the connection; no HTTP answer.
    const plain = await new Promise<string>((resolve) => {
      const c = net.connect(d.remotePort!, '127.0.0.1', () => c.write('GET /v1/version HTTP/1.1\r\nhost: x\r\n\r\n'));
      let got = '';
      c.on('data', (b) => (got += b.toString('latin1')));
      c.on('close', () => resolve(got));
      c.on('error', () => {});
    });
    expect(plain).not.toMatch(/^HTTP\//);
    const e12 = await new Promise<NodeJS.ErrnoException>((resolve) => {
      const s = tls.connect({ host: '127.0.0.1', port: d.remotePort!, ca: readFileSync(d.caFile), maxVersion: 'TLSv1.2' }, () => {
        s.destroy();
        resolve(new Error('handshake succeeded') as NodeJS.ErrnoException);
      });
      s.on('error', resolve);
    });
    expect(e12.message).toMatch(/protocol version|alert/i);
  });

  it('refuses a missing, malformed, unknown, revoked and expired token with one 401 answer', async () => {
    const revoked = await makeToken(d, 'team-a', 'user');
    expect((await doorRequest(d, { path: '/v1/sandboxes', token: revoked.token })).status).toBe(200);
    const del = await doorRequest(d, { method: 'DELETE', path: `/v1/tokens/${revoked.id}`, token: admin.token });
    expect(del.status).toBe(200);
    expect(JSON.parse(del.body)).toMatchObject({ id: revoked.id, state: 'revoked' });
    const expired = await makeToken(d, 'team-a', 'user', 1);
    // Expiry is a time: wait until dsecd itself lists the token as expired.
    for (;;) {
      const list = JSON.parse((await doorRequest(d, { path: '/v1/tokens', token: admin.token })).body) as { tokens: { id: string; state: string }[] };
      if (list.tokens.find((t) => t.id === expired.id)!.state === 'expired') break;
      await new Promise((r) => setTimeout(r, 200));
    }
    const unknown = admin.token.slice(0, -1) + (admin.token.endsWith('0') ? '1' : '0');
    const answers = await Promise.all([
      doorRequest(d, { path: '/v1/sandboxes' }),
      doorRequest(d, { path: '/v1/sandboxes', token: 'not-a-token' }),
      doorRequest(d, { path: '/v1/sandboxes', headers: { authorization: 'Basic dXNlcjpwdw==' } }),
      doorRequest(d, { path: '/v1/sandboxes', token: unknown }),
      doorRequest(d, { path: '/v1/sandboxes', token: revoked.token }),
      doorRequest(d, { path: '/v1/sandboxes', token: expired.token }),
      doorRequest(d, { method: 'POST', path: '/v1/sandboxes', token: revoked.token, json: { image: 'busybox' } }),
    ]);
    for (const a of answers) {
      expect(a.status).toBe(401);
      expect(a.body).toBe(answers[0].body);
      expect(a.headers['www-authenticate']).toBe('Bearer realm="dsec"');
    }
    expect(JSON.parse(answers[0].body).error.code).toBe('Unauthenticated');
  });

  it('takes the token as X-API-Key too, and refuses two different ones', async () => {
    expect((await doorRequest(d, { path: '/v1/version', headers: { 'x-api-key': admin.token } })).status).toBe(200);
    const other = await makeToken(d, 'system', 'admin');
    expect((await doorRequest(d, { path: '/v1/version', token: admin.token, headers: { 'x-api-key': other.token } })).status).toBe(401);
  });

  it('serves the same routes as the socket to an admin: create, exec, destroy', async () => {
    const created = await doorRequest(d, { method: 'POST', path: '/v1/sandboxes', token: admin.token, json: { image: 'busybox' } });
    expect(created.status).toBe(201);
    const id = JSON.parse(created.body).id as string;
    const ex = await doorRequest(d, { method: 'POST', path: `/v1/sandboxes/${id}/exec`, token: admin.token, json: { argv: ['echo', 'over tls'] } });
    expect(ex.status).toBe(200);
    expect(Buffer.from(JSON.parse(ex.body).stdout_b64, 'base64').toString()).toBe('over tls\n');
    // The socket sees what the door made.
    expect((await d.client.getSandbox(id)).state).toBe('running');
    expect((await doorRequest(d, { method: 'DELETE', path: `/v1/sandboxes/${id}?force=true`, token: admin.token })).status).toBe(200);
  });

  it('a reader reads and changes nothing; a user may not manage tokens or host-wide state; a metrics token reads /metrics only', async () => {
    const reader = await makeToken(d, 'team-a', 'reader');
    expect((await doorRequest(d, { path: '/v1/sandboxes', token: reader.token })).status).toBe(200);
    const create = await doorRequest(d, { method: 'POST', path: '/v1/sandboxes', token: reader.token, json: { image: 'busybox' } });
    expect(create.status).toBe(403);
    expect(JSON.parse(create.body).error.code).toBe('PermissionDenied');
    expect((await d.client.listSandboxes()).length).toBe(0);
    expect((await doorRequest(d, { method: 'POST', path: '/v1/leases', token: reader.token, json: { job: 'x', ttl_s: 60 } })).status).toBe(403);
    expect((await doorRequest(d, { path: '/v1/tokens', token: reader.token })).status).toBe(403);

    const user = await makeToken(d, 'team-a', 'user');
    expect((await doorRequest(d, { path: '/v1/tokens', token: user.token })).status).toBe(403);
    expect((await doorRequest(d, { method: 'POST', path: '/v1/tokens', token: user.token, json: { tenant: 'team-a', role: 'admin' } })).status).toBe(403);
    expect((await doorRequest(d, { method: 'POST', path: '/v1/images/import', token: user.token, json: { type: 'dir', path: '/etc', image: 'stolen' } })).status).toBe(403);
    expect((await doorRequest(d, { method: 'POST', path: '/v1/security/seccomp/reload', token: user.token })).status).toBe(403);

    const metrics = await makeToken(d, 'system', 'metrics');
    const m = await doorRequest(d, { path: '/metrics', token: metrics.token });
    expect(m.status).toBe(200);
    expect(m.body).toMatch(/^dsec_auth_failures_total\{reason="missing"\} [1-9]/m);
    expect((await doorRequest(d, { path: '/v1/sandboxes', token: metrics.token })).status).toBe(403);
  });

  it('refuses an id with path characters', async () => {
    for (const p of ['/v1/sandboxes/..%2F..%2Fetc', '/v1/sandboxes/%2e%2e', '/v1/sandboxes/a%00b', '/v1/snapshots/..%2Fx']) {
      const r = await doorRequest(d, { path: p, token: admin.token });
      expect([400, 404]).toContain(r.status);
      expect(JSON.parse(r.body).error.code).toMatch(/InvalidArgument|NotFound/);
    }
  });

  it('writes every mutating call to the audit log, refused ones too, never a token text', async () => {
    const user = await makeToken(d, 'team-b', 'user');
    const l = await doorRequest(d, { method: 'POST', path: '/v1/leases', token: user.token, json: { job: 'audited', ttl_s: 600 } });
    expect(l.status).toBe(200);
    await doorRequest(d, { method: 'POST', path: '/v1/leases', token: 'e2b_' + 'f'.repeat(48), json: { job: 'nope', ttl_s: 60 } });
    const file = path.join(d.root, 'audit.log');
    expect(statSync(file).mode & 0o777).toBe(0o600);
    let lines: Array<Record<string, unknown>> = [];
    // The log is written asynchronously: read its complete lines until both are there.
    for (;;) {
      lines = auditLines(d);
      if (lines.some((x) => x.result === 401 && x.action === 'POST /v1/leases')) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(lines.find((x) => x.token === user.id && x.action === 'POST /v1/leases')).toMatchObject({ door: 'tcp', tenant: 'team-b', role: 'user', result: 200, remote: '127.0.0.1' });
    expect(lines.find((x) => x.result === 401 && x.action === 'POST /v1/leases')).toMatchObject({ token: null, error: 'Unauthenticated' });
    // The socket's token creation is audited as the local admin's, with the id it made.
    expect(lines.find((x) => x.door === 'unix' && x.action === 'POST /v1/tokens' && (x.object as { created?: string })?.created === user.id)).toMatchObject({ tenant: 'system', role: 'admin', result: 201 });
    const text = readFileSync(file, 'utf8');
    expect(text).not.toContain(user.token);
    expect(text).not.toContain(admin.token);
  });

  it('dsec token create/ls/revoke on the socket: the text once, a hash kept, revocation closes open attach, logs -f and events streams', async () => {
    const created = await runCli(d, ['token', 'create', '--tenant', 'team-c', '--role', 'user', '--ttl', '1h', '--description', 'streams']);
    expect(created.code).toBe(0);
    const token = created.stdout.trim();
    expect(token).toMatch(/^e2b_[0-9a-f]{48}$/);
    const id = token.slice(4, 20);
    expect(created.stderr).toContain(`token ${id}: tenant team-c, role user, expires `);
    const ls = await runCli(d, ['--json', 'token', 'ls']);
    const listed = (JSON.parse(ls.stdout) as { tokens: Array<Record<string, unknown>> }).tokens.find((t) => t.id === id);
    expect(listed).toMatchObject({ tenant: 'team-c', role: 'user', state: 'active', description: 'streams' });
    expect(ls.stdout).not.toContain(token.slice(20));

    // The sandbox is team-c's (another tenant's would answer the token NotFound); the socket, an admin, sees it too.
    const made = await doorRequest(d, { method: 'POST', path: '/v1/sandboxes', token, json: { image: 'busybox' } });
    expect(made.status).toBe(201);
    const sb = JSON.parse(made.body) as { id: string; tenant: string };
    expect(sb.tenant).toBe('team-c');
    const ex = await d.client.startExec(sb.id, { argv: ['sh', '-c', 'echo ready; sleep 600'], stdin: true });
    const ca = readFileSync(d.caFile);
    const ws = new WebSocket(`wss://127.0.0.1:${d.remotePort}/v1/sandboxes/${sb.id}/execs/${ex.exec_id}/attach`, { ca, headers: { authorization: `Bearer ${token}` } });
    // A failed assertion must not leave the WebSocket open: dsecd's shutdown waits for it.
    onTestFinished(() => ws.terminate());
    const wsClosed = new Promise<number>((resolve) => ws.on('close', (code) => resolve(code)));
    await new Promise<void>((resolve, reject) => {
      ws.on('message', (m: Buffer, binary: boolean) => {
        if (binary && m.subarray(1).toString().includes('ready')) resolve();
      });
      ws.on('error', reject);
    });
    // Two more streams on their own connections: events and logs, followed.
    const follow = (p: string) => new Promise<{ ended: Promise<void> }>((resolve, reject) => {
      const req = https.get({ host: '127.0.0.1', port: d.remotePort!, path: p, ca, agent: false, headers: { authorization: `Bearer ${token}` } }, (res) => {
        expect(res.statusCode).toBe(200);
        res.resume();
        resolve({ ended: new Promise<void>((r) => { res.on('close', () => r()); res.on('error', () => r()); }) });
      });
      req.on('error', reject);
    });
    const events = await follow('/v1/events?follow=true');
    const logs = await follow(`/v1/sandboxes/${sb.id}/logs?follow=true`);

    const revoked = await runCli(d, ['token', 'revoke', id]);
    expect(revoked).toMatchObject({ code: 0, stdout: `${id}\n` });
    expect(await wsClosed).toBeGreaterThan(0);
    await events.ended;
    await logs.ended;
    // The token is refused from now on; the command it attached to runs on.
    expect((await doorRequest(d, { path: '/v1/sandboxes', token })).status).toBe(401);
    expect((await d.client.getExec(sb.id, ex.exec_id)).state).toBe('running');
    const again = await runCli(d, ['token', 'revoke', 'ffffffffffffffff']);
    expect(again.code).toBe(125);
    expect(again.stderr).toMatch(/token ffffffffffffffff not found/);
    await d.client.deleteSandbox(sb.id, { force: true });
  });
});
