/**
 * Fleet identity on the TCP door: `dsec fleet ca` / `dsec fleet cert` make the CA and the
 * certificates; a dsecd started with `--tls-ca` and a host certificate serves only
 * clients presenting a certificate of that CA whose role the port accepts, and shows the
 * verified peer to the request (GET /v1/whoami).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import { IS_ROOT, REPO, TestDaemon } from './harness.js';
import { doorRequest, makeToken } from './remote-helpers.js';

/** Runs `dsec` (no daemon needed for the fleet verbs). */
async function dsec(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const r = await execa(process.execPath, [path.join(REPO, 'bin/dsec'), ...args], { reject: false });
  return { code: r.exitCode ?? -1, stdout: String(r.stdout), stderr: String(r.stderr) };
}

describe.skipIf(!IS_ROOT)('mutual TLS with fleet certificates', () => {
  let dir: string;
  let d: TestDaemon;
  let token: string;
  const pem = (p: string) => readFileSync(path.join(dir, p), 'utf8');
  beforeAll(async () => {
    dir = mkdtempSync('/tmp/dsec-fleet-ca-');
    expect((await dsec(['fleet', 'ca', path.join(dir, 'ca')])).code).toBe(0);
    expect((await dsec(['fleet', 'ca', path.join(dir, 'other')])).code).toBe(0);
    const cert = async (ca: string, role: string, name: string, out: string, san: string[] = []) => {
      const r = await dsec(['fleet', 'cert', '--ca', path.join(dir, ca), '--role', role, '--name', name, ...san.flatMap((s) => ['--san', s]), '--out', path.join(dir, out)]);
      expect(r.stderr).toBe('');
      expect(r.code).toBe(0);
    };
    await cert('ca', 'host', 'h1', 'h1', ['127.0.0.1']);
    await cert('ca', 'gateway', 'gw1', 'gw1');
    await cert('ca', 'client', 'alice', 'alice');
    await cert('other', 'gateway', 'gw-x', 'gw-x');
    d = await TestDaemon.start({
      slot: 42,
      listen: { args: ['--tls-cert', path.join(dir, 'h1.crt'), '--tls-key', path.join(dir, 'h1.key'), '--tls-ca', path.join(dir, 'ca', 'ca.crt'), '--tls-peer-roles', 'gateway'] },
    });
    token = (await makeToken(d, 'system', 'admin')).token;
  });
  afterAll(async () => {
    await d?.cleanup();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('fleet ca and cert write the files with the role in a URI SAN, keys 0600', () => {
    const h1 = new X509Certificate(pem('h1.crt'));
    expect(h1.subjectAltName).toContain('URI:dsec:role:host');
    expect(h1.subjectAltName).toContain('IP Address:127.0.0.1');
    expect(h1.checkIssued(new X509Certificate(pem('ca/ca.crt')))).toBe(true);
    expect(new X509Certificate(pem('alice.crt')).subjectAltName).toBe('URI:dsec:role:client');
    for (const k of ['ca/ca.key', 'h1.key', 'gw1.key']) expect(statSync(path.join(dir, k)).mode & 0o777).toBe(0o600);
  });

  it('a gateway certificate of the fleet CA is served, and the request sees its role', async () => {
    const r = await doorRequest(d, { path: '/v1/whoami', token, ca: pem('ca/ca.crt'), cert: pem('gw1.crt'), key: pem('gw1.key') });
    expect(r.status).toBe(200);
    expect(JSON.parse(r.body)).toMatchObject({ door: 'tcp', tenant: 'system', role: 'admin', peer: { name: 'gw1', role: 'gateway' } });
  });

  it('a certificate of a role the port does not accept is refused with 403', async () => {
    for (const who of ['alice', 'h1']) {
      const r = await doorRequest(d, { path: '/v1/whoami', token, ca: pem('ca/ca.crt'), cert: pem(`${who}.crt`), key: pem(`${who}.key`) });
      expect(r.status).toBe(403);
      expect(JSON.parse(r.body).error).toMatchObject({ code: 'PermissionDenied' });
      expect(JSON.parse(r.body).error.message).toMatch(/accepted roles: gateway/);
    }
  });

  it('no certificate, or one of another CA, never gets past the handshake', async () => {
    const none = await doorRequest(d, { path: '/v1/whoami', token, ca: pem('ca/ca.crt') }).then(() => null, (e: Error) => e);
    expect(none?.message).toMatch(/certificate required|alert|socket hang up|ECONNRESET/i);
    const other = await doorRequest(d, { path: '/v1/whoami', token, ca: pem('ca/ca.crt'), cert: pem('gw-x.crt'), key: pem('gw-x.key') }).then(() => null, (e: Error) => e);
    expect(other?.message).toMatch(/unknown ca|alert|socket hang up|ECONNRESET/i);
  });

  it('a token is still needed beside the certificate', async () => {
    const r = await doorRequest(d, { path: '/v1/sandboxes', ca: pem('ca/ca.crt'), cert: pem('gw1.crt'), key: pem('gw1.key') });
    expect(r.status).toBe(401);
  });
});
