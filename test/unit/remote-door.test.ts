/**
 * The TCP door's pure parts: route classification over the whole route table, tokens
 * (text, hash, refusals), the certificate role, and the [remote] config.
 */
import { describe, expect, it } from 'vitest';
import Database from 'better-sqlite3';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Fastify from 'fastify';
import { renderOpenApi } from '../../daemon/api/openapi.js';
import { registerControlRoutes } from '../../daemon/api/e2b/control.js';
import { ROUTE_DOCS } from '../../daemon/api/routes/table.js';
import '../../gateway/hosts.js'; // the gateway's host routes join ROUTE_DOCS: ADMIN_ROUTES names them too
import { ADMIN_ROUTES, ANY_ROUTES, CREATE_ROUTES, accessOf, allows } from '../../daemon/remote/policy.js';
import { SqliteTokenStore, TokenService, tokenHash, TOKEN_RE } from '../../daemon/remote/tokens.js';
import { migrate } from '../../daemon/db/db.js';
import { loadConfig, parseListen } from '../../daemon/config.js';
import { roleOfSan } from '../../pki/certs.js';

describe('route access', () => {
  renderOpenApi(); // imports every route module, filling ROUTE_DOCS
  // Each route as the table names it and as fastify matches it (a literal colon in a segment is `::`, e.g. `/v1/sandboxes::batch`).
  const routes = ROUTE_DOCS.flatMap((r) => [`${r.method} ${r.url}`, `${r.method} ${r.url.replace(/([^/]):/g, '$1::')}`]);

  it('every named admin, any-role and create route exists in the route table or E2B\'s routes (a renamed route must not drop out of its list)', async () => {
    // E2B's control plane registers plain fastify routes (daemon/api/e2b/control.ts): read them off an app.
    const app = Fastify();
    const e2b: string[] = [];
    app.addHook('onRoute', (r) => {
      for (const m of [r.method].flat()) e2b.push(`${m} ${r.url}`);
    });
    registerControlRoutes(app, {} as never);
    await app.ready();
    await app.close();
    expect(e2b).toContain('POST /sandboxes');
    for (const k of [...ADMIN_ROUTES, ...ANY_ROUTES, ...CREATE_ROUTES]) expect([...routes, ...e2b]).toContain(k);
  });

  it('no route that changes something is readable by a reader; WebSocket routes need write', () => {
    for (const r of ROUTE_DOCS) {
      const a = accessOf(r.method, r.url, r.status === 101);
      if (r.method !== 'GET' || r.status === 101) {
        expect(allows('reader', a), `${r.method} ${r.url}`).toBe(false);
        expect(allows('metrics', a), `${r.method} ${r.url}`).toBe(false);
      }
      expect(allows('admin', a)).toBe(true);
    }
    expect(accessOf('GET', '/v1/sandboxes/:id/execs/:exec_id/attach', true)).toBe('write');
    expect(accessOf('POST', undefined, false)).toBe('write');
  });

  it('a user reaches every route but the admin ones; a metrics token only /metrics, whoami and version', () => {
    for (const r of ROUTE_DOCS) {
      const k = `${r.method} ${r.url}`;
      const a = accessOf(r.method, r.url, r.status === 101);
      expect(allows('user', a), k).toBe(!ADMIN_ROUTES.has(k));
      expect(allows('metrics', a), k).toBe(k === 'GET /metrics' || ANY_ROUTES.has(k));
    }
  });
});

describe('tokens', () => {
  const service = (now: () => number) => {
    const db = new Database(':memory:');
    migrate(db);
    return new TokenService(new SqliteTokenStore(db), now);
  };

  it('are e2b_ + 48 hex, stored as a hash only, and checked', async () => {
    let t = 1_000_000;
    const s = service(() => t);
    const { token, view } = await s.create({ tenant: 'team-a', role: 'user', ttlMs: 60_000 });
    expect(token).toMatch(/^e2b_[0-9a-f]+$/);
    expect(TOKEN_RE.exec(token)![1]).toBe(view.id);
    const rec = await s.store.get(view.id);
    expect(rec!.hash).toBe(tokenHash(token));
    expect(JSON.stringify(rec)).not.toContain(token.slice(20));
    expect(await s.check(token)).toMatchObject({ ok: true, rec: { tenant: 'team-a', role: 'user' } });
    expect(await s.check(undefined)).toEqual({ ok: false, why: 'missing' });
    expect(await s.check('e2b_xyz')).toEqual({ ok: false, why: 'malformed' });
    expect(await s.check(token.slice(0, -1) + (token.endsWith('0') ? '1' : '0'))).toEqual({ ok: false, why: 'unknown' });
    t += 60_000;
    expect(await s.check(token)).toEqual({ ok: false, why: 'expired' });
  });

  it('revocation is at once and announced', async () => {
    const s = service(Date.now);
    const { token, view } = await s.create({ tenant: 'x', role: 'reader', ttlMs: null });
    const seen: string[] = [];
    s.onRevoke((id) => seen.push(id));
    expect((await s.revoke(view.id)).state).toBe('revoked');
    expect(seen).toEqual([view.id]);
    expect(await s.check(token)).toEqual({ ok: false, why: 'revoked' });
    await expect(s.revoke('0123456789abcdef')).rejects.toMatchObject({ kind: 'NotFound' });
    await expect(s.revoke('../x')).rejects.toMatchObject({ kind: 'NotFound' });
  });

  it('refuses a bad tenant or role', async () => {
    const s = service(Date.now);
    await expect(s.create({ tenant: 'Bad Name', role: 'user', ttlMs: null })).rejects.toMatchObject({ kind: 'InvalidArgument' });
    await expect(s.create({ tenant: 'ok', role: 'root' as 'user', ttlMs: null })).rejects.toMatchObject({ kind: 'InvalidArgument' });
  });
});

describe('certificate roles', () => {
  it('come from exactly one dsec:role: URI of a known role', () => {
    expect(roleOfSan('DNS:h1, URI:dsec:role:host')).toBe('host');
    expect(roleOfSan('URI:dsec:role:gateway')).toBe('gateway');
    expect(roleOfSan('DNS:h1')).toBeNull();
    expect(roleOfSan('URI:dsec:role:admin')).toBeNull();
    expect(roleOfSan('URI:dsec:role:host, URI:dsec:role:gateway')).toBeNull();
    expect(roleOfSan(undefined)).toBeNull();
  });
});

describe('[remote] config', () => {
  const withFile = (toml: string, src: Record<string, string> = {}) => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'dsec-cfg-'));
    try {
      writeFileSync(path.join(dir, 'c.toml'), toml);
      return loadConfig({ config: path.join(dir, 'c.toml'), env: {}, ...src });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  };
  it('takes listen, flags over the file, and defaults the limits', () => {
    const c = withFile('[remote]\nlisten = "0.0.0.0:8443"\n', { listen: '[::]:9443' });
    expect(c.remote).toMatchObject({ listen: '[::]:9443', tlsCert: null, peerRoles: ['client', 'gateway'], authFailuresPerMinute: 30, headersTimeoutMs: 10_000 });
    expect(parseListen('[::]:9443', 'x')).toEqual({ host: '::', port: 9443 });
    expect(() => parseListen('8443', '--listen')).toThrow(/want ADDR:PORT/);
  });
  it('refuses half a certificate pair, an unknown peer role, and unauthenticated listeners off loopback', () => {
    expect(() => withFile('', { tlsCert: '/x.crt' })).toThrow(/go together/);
    expect(() => withFile('', { peerRoles: 'gateway,boss' })).toThrow(/--tls-peer-roles/);
    expect(() => withFile('[metrics]\naddress = "0.0.0.0:9464"\n')).toThrow(/not a loopback address/);
    expect(() => withFile('[sandboxfusion]\naddress = "10.0.0.1:8080"\n')).toThrow(/not a loopback address/);
    expect(withFile('[metrics]\naddress = "127.0.0.1:9464"\n').metricsAddress).toBe('127.0.0.1:9464');
  });
});
