/**
 * The E2B front (daemon/api/e2b, docs/E2B.md) driven by the unmodified `e2b` SDK, at two
 * versions whose endpoints differ (2.8.4: create and connect without /v2, `/files`
 * without the sandbox header; the newest 2.x: /v2 routes, stdin control), against a real
 * dsecd's TCP door: the SDK runs as its own program (test/fixtures/e2b-client.mjs) with
 * only E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and NODE_EXTRA_CA_CERTS set, as a user's
 * program would.
 *
 * Through the fleet gateway: test/integration/e2b-gateway.test.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import https from 'node:https';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { IS_ROOT, TestDaemon, runCli } from './harness.js';
import { doorRequest, makeToken } from './remote-helpers.js';
import { runE2bClient } from '../fixtures/e2b-sdk.js';

describe.skipIf(!IS_ROOT)('E2B SDKs against dsecd', () => {
  let d: TestDaemon;
  let tenantA: string;
  let tenantB: string;
  let admin: string;

  const sdk = (pkg: string, key: string, name: string, args: unknown = {}) => runE2bClient(d.remoteUrl, d.caFile, pkg, key, name, args);

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 42, listen: true });
    tenantA = (await makeToken(d, 'team-a', 'user')).token;
    tenantB = (await makeToken(d, 'team-b', 'user')).token;
    admin = (await makeToken(d, 'system', 'admin')).token;
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  for (const pkg of ['e2b-2-8', 'e2b']) {
    describe(pkg, () => {
      let sandboxId = '';

      it('creates from the base template with metadata; runs commands with streamed output, exit codes, stdin and kill', async () => {
        const r = await sdk(pkg, tenantA, 'commands', { metadata: { suite: 'e2b', sdk: pkg } });
        expect(r.error).toBeUndefined();
        sandboxId = r.sandboxId as string;
        expect(sandboxId).toMatch(/^[0-9a-f]{16}$/);
        expect(r.run).toEqual({ exitCode: 0, stdout: 'hi\nuser\n/home/user\n', stderr: 'oops\n' });
        expect((r.streamed as { stdout: string[] }).stdout.join('')).toBe('hi\nuser\n/home/user\n');
        expect((r.streamed as { stderr: string[] }).stderr.join('')).toBe('oops\n');
        expect(r.asRoot).toBe('root\n/root\n');
        expect(r.envs).toBe('hello in /tmp\n');
        expect(r.failing).toMatchObject({ threw: true, isCommandExitError: true, name: 'CommandExitError', exitCode: 3, stdout: 'before\n' });
        const bg = r.background as { pid: number; seen: string; listed: number[]; killed: boolean; waited: { threw?: boolean; exitCode?: number }; listedAfter: number[] };
        expect(bg.seen).toBe('got:first\ngot:second\n');
        expect(bg.listed).toContain(bg.pid);
        expect(bg.killed).toBe(true);
        expect(bg.waited).toMatchObject({ threw: true, name: 'CommandExitError', exitCode: -1 });
        expect(bg.listedAfter).not.toContain(bg.pid);
        // An ordinary dsec sandbox: the socket's API sees it, with the metadata as labels.
        const sb = await d.client.getSandbox(sandboxId);
        expect(sb.state).toBe('running');
        expect(sb.image).toBe('e2b-base:latest');
        expect(sb.labels).toMatchObject({ suite: 'e2b', sdk: pkg, 'dsec.e2b.template': 'base', 'dsec.e2b.tenant': 'team-a' });
      });

      it('writes and reads text and a 5 MB binary byte-exact; lists, makes and removes directories; tells what exists', async () => {
        const r = await sdk(pkg, tenantA, 'files', { sandboxId });
        expect(r.error).toBeUndefined();
        expect(r.text).toEqual({ wrote: { name: 'hello.txt', type: 'file', path: '/home/user/hello.txt' }, read: 'hello from e2b\n' });
        const bin = r.binary as { sent: string; got: string; bytes: number };
        expect(bin.bytes).toBe(5 * 1024 * 1024);
        expect(bin.got).toBe(bin.sent);
        // A relative path is relative to the user's home.
        expect(r.relative).toEqual({ wrote: { name: 'note.txt', type: 'file', path: '/home/user/rel/note.txt' }, read: 'relative' });
        expect(r.makeDir).toEqual({ first: true, again: false });
        const list = r.list as { name: string; type: string; path: string; size: number; owner: string }[];
        expect(list.map((e) => e.name).sort()).toEqual(['blob.bin', 'd1', 'hello.txt', 'rel']);
        expect(list.find((e) => e.name === 'blob.bin')).toEqual({ name: 'blob.bin', type: 'file', path: '/home/user/blob.bin', size: 5 * 1024 * 1024, owner: 'user' });
        expect(list.find((e) => e.name === 'd1')).toMatchObject({ type: 'dir', path: '/home/user/d1' });
        expect([r.existsBefore, r.existsAfter, r.dirGone]).toEqual([true, false, true]);
        expect(r.missing).toMatchObject({ threw: true });
        expect((r.missing as { name: string }).name).toMatch(/NotFound/);
        expect(r.moved).toEqual({ path: '/home/user/moved.txt', read: 'relative' });
        // Written as the SDKs' default user, uid 1000 inside the sandbox.
        expect(r.owner).toBe('user:1000');
      });

      it('watches a directory: a file made and removed there shows as create and remove events', async () => {
        const r = await sdk(pkg, tenantA, 'watch', { sandboxId });
        expect(r.error).toBeUndefined();
        const ev = r.events as { name: string; type: string }[];
        expect(ev.findIndex((e) => e.name === 'a.txt' && e.type === 'create')).toBeLessThan(ev.findIndex((e) => e.name === 'a.txt' && e.type === 'remove'));
      });

      it.runIf(pkg === 'e2b')('runs PTYs, several files in one write, gzip and streamed uploads, connect and closeStdin, command timeouts, chatty commands nobody reads', async () => {
        const r = await sdk(pkg, tenantA, 'extras', { sandboxId });
        expect(r.error).toBeUndefined();
        expect(r.pty).toEqual({ sizes: ['24 80', '30 100'], exitCode: 0 });
        expect(r.multi).toEqual([{ name: 'm1.txt', type: 'file', path: '/home/user/m1.txt' }, { name: 'm2.txt', type: 'file', path: '/home/user/m2.txt' }]);
        expect(r.gzip).toEqual({ wrote: { name: 'gz.txt', type: 'file', path: '/home/user/gz.txt' }, read: 'zipped text' });
        expect(r.stream).toEqual({ wrote: { name: 'st.txt', type: 'file', path: '/home/user/st.txt' }, read: 'streamed' });
        expect(r.info).toMatchObject({ name: 'm1.txt', type: 'file', path: '/home/user/m1.txt', size: 3, mode: 0o644, permissions: '-rw-r--r--', owner: 'user', group: 'user' });
        expect(r.connect).toBe('abc\ndone-cat\n');
        expect(r.timeout).toMatchObject({ threw: true, name: 'TimeoutError' });
        expect(r.stillRunning).toContain('-l -c sleep 600');
        expect(r.chatty).toBe('finished');
      });

      it('lists sandboxes by metadata: only the matching ones of the caller\'s tenant', async () => {
        const r = await sdk(pkg, tenantA, 'list', { metadata: { sdk: pkg } });
        expect(r.error).toBeUndefined();
        expect(r.items).toEqual([{ sandboxId, templateId: 'base', metadata: { suite: 'e2b', sdk: pkg }, state: 'running' }]);
        const none = await sdk(pkg, tenantA, 'list', { metadata: { sdk: 'no-such' } });
        expect(none.items).toEqual([]);
      });

      it('serves pre-signed file URLs, and refuses one whose path was changed', async () => {
        const r = await sdk(pkg, tenantA, 'signedUrls', { sandboxId });
        expect(r.error).toBeUndefined();
        expect(r).toMatchObject({ hasSignature: true, put: 200, get: 200, body: 'via a signed url', forged: 401 });
      });

      it('pauses, then connect resumes it with its files and processes where they were', async () => {
        const r = await sdk(pkg, tenantA, 'pauseConnect', { sandboxId });
        expect(r.error).toBeUndefined();
        expect(r).toMatchObject({ paused: true, stateWhilePaused: 'paused', stateAfter: 'running', file: 'kept', sleeping: true });
        // A command against a paused sandbox is refused as "not running", not hung.
        expect(r.whilePaused).toMatchObject({ threw: true });
        expect((await d.client.getSandbox(sandboxId)).state).toBe('running');
      });

      it('keeps another tenant out: not listed, not connectable, not killable', async () => {
        const r = await sdk(pkg, tenantB, 'probe', { sandboxId });
        expect(r.error).toBeUndefined();
        expect(r.list).toMatchObject({ threw: false });
        expect((r.list as { value: string[] }).value).not.toContain(sandboxId);
        expect(r.connect).toMatchObject({ threw: true });
        expect((r.connect as { message: string }).message).toMatch(/not found/i);
        // kill answers false (no such sandbox for this caller) and the sandbox lives on.
        expect(r.kill).toEqual({ threw: false, value: false });
        expect((await d.client.getSandbox(sandboxId)).state).toBe('running');
        // An admin token sees every tenant's sandboxes.
        const adm = await sdk(pkg, admin, 'info', { sandboxId });
        expect(adm).toMatchObject({ found: true, state: 'running' });
      });

      it('refuses a wrong API key', async () => {
        const r = await sdk(pkg, 'e2b_' + '0'.repeat(48), 'probe', { sandboxId });
        for (const what of ['create', 'list', 'connect']) {
          expect(r[what]).toMatchObject({ threw: true, name: 'AuthenticationError' });
        }
      });

      it('expires at the timeout set with setTimeout', async () => {
        const r = await sdk(pkg, tenantA, 'setTimeout', { sandboxId, timeoutMs: 2000 });
        expect(r.error).toBeUndefined();
        expect(r.running).toBe(true);
        // Expiry is a time: wait until dsecd has destroyed it (the reaper sweeps every second).
        for (;;) {
          const i = await sdk(pkg, tenantA, 'info', { sandboxId });
          if (!i.found) {
            expect(i.message).toMatch(/not found/i);
            break;
          }
          await new Promise((res) => setTimeout(res, 500));
        }
        expect((await d.client.listSandboxes()).map((s) => s.id)).not.toContain(sandboxId);
      });

      it('kills', async () => {
        const c = await sdk(pkg, tenantA, 'commands', { metadata: { purpose: 'kill' } });
        expect(c.error).toBeUndefined();
        const r = await sdk(pkg, tenantA, 'kill', { sandboxId: c.sandboxId });
        expect(r).toMatchObject({ first: true, second: false });
        expect((await d.client.listSandboxes()).map((s) => s.id)).not.toContain(c.sandboxId);
      });
    });
  }

  describe('templates', () => {
    it('are image aliases an admin sets with `dsec image alias`; an image without bash is refused at the first command', async () => {
      const set = await runCli(d, ['image', 'alias', 'bb', 'busybox']);
      expect(set).toMatchObject({ code: 0, stdout: 'bb -> busybox (container)\n' });
      const listed = JSON.parse((await runCli(d, ['--json', 'image', 'alias'])).stdout) as { templates: { name: string; image: string; builtin: boolean }[] };
      expect(listed.templates).toEqual([
        { name: 'base', image: 'e2b-base', backend: 'container', builtin: true },
        { name: 'bb', image: 'busybox', backend: 'container', builtin: false },
      ]);
      const r = await sdk('e2b', tenantA, 'run', { template: 'bb', cmd: 'echo hi' });
      // The SDKs run every command as /bin/bash -l -c; busybox has no bash.
      expect(r).toMatchObject({ threw: true, name: 'InvalidArgumentError' });
      expect(r.message).toMatch(/cannot start \/bin\/bash/);
      const sb = await d.client.getSandbox(r.sandboxId as string);
      expect(sb.image).toBe('busybox:latest');
      expect(sb.labels['dsec.e2b.template']).toBe('bb');
      await d.client.deleteSandbox(sb.id, { force: true });
      // A template that is neither an alias nor an image.
      const none = await sdk('e2b', tenantA, 'run', { template: 'no-such-template', cmd: 'true' });
      expect(none).toMatchObject({ threw: true });
      expect(none.message).toMatch(/template no-such-template not found/);
      // What a user can do about it: an image it sees, or an alias only an admin makes.
      expect(none.message).toMatch(/an alias an admin made with dsec image alias NAME IMAGE, or the name of an image your tenant sees: dsec image ls/);
    });

    it('can be set by an admin only', async () => {
      const user = await doorRequest(d, { method: 'PUT', path: '/v1/templates/mine', headers: { 'x-api-key': tenantA }, json: { image: 'busybox' } });
      expect(user.status).toBe(403);
      const adm = await doorRequest(d, { method: 'PUT', path: '/v1/templates/mine', headers: { 'x-api-key': admin }, json: { image: 'busybox' } });
      expect(adm.status).toBe(200);
      expect((await runCli(d, ['image', 'alias', 'mine', '--rm'])).code).toBe(0);
      expect((await runCli(d, ['image', 'alias', 'bb', '--rm'])).code).toBe(0);
    });
  });

  describe('envd access tokens', () => {
    let a: { id: string; token: string };
    let b: { id: string; token: string };
    const create = async (key: string) => {
      const r = await doorRequest(d, { method: 'POST', path: '/v2/sandboxes', headers: { 'x-api-key': key }, json: { templateID: 'base', timeout: 300 } });
      expect(r.status).toBe(201);
      const j = JSON.parse(r.body) as { sandboxID: string; envdAccessToken: string; envdVersion: string };
      expect(j.envdVersion).toBe('0.5.7');
      return { id: j.sandboxID, token: j.envdAccessToken };
    };
    /** A Connect call of process.List to sandbox `id` with these headers. */
    const listProcesses = (id: string, headers: Record<string, string>) => doorRequest(d, {
      method: 'POST', path: '/process.Process/List', json: {}, headers: { 'e2b-sandbox-id': id, 'e2b-sandbox-port': '49983', 'connect-protocol-version': '1', ...headers },
    });
    beforeAll(async () => {
      a = await create(tenantA);
      b = await create(tenantB);
    });

    it('leave E2B calls in the audit log, as the owner tenant', async () => {
      const file = path.join(d.root, 'audit.log');
      // The log is written asynchronously: wait for the lines.
      const lines = async (pred: (l: Record<string, unknown>) => boolean) => {
        for (;;) {
          const hit = readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>).find(pred);
          if (hit) return hit;
          await new Promise((r) => setTimeout(r, 100));
        }
      };
      expect(await lines((l) => l.action === 'POST /v2/sandboxes' && (l.object as { created?: string } | null)?.created === a.id)).toMatchObject({ door: 'tcp', tenant: 'team-a', role: 'user', result: 201 });
      await listProcesses(a.id, { 'x-access-token': a.token });
      expect(await lines((l) => l.action === 'POST /process.Process/List')).toMatchObject({ tenant: 'team-a', token: null, result: 200 });
    });

    it('are returned by create, connect and info to the owning tenant only, and differ per sandbox', async () => {
      expect(a.token).not.toBe(b.token);
      expect(a.token.length).toBeGreaterThanOrEqual(43);
      const info = await doorRequest(d, { path: `/sandboxes/${a.id}`, headers: { 'x-api-key': tenantA } });
      expect(JSON.parse(info.body).envdAccessToken).toBe(a.token);
      const conn = await doorRequest(d, { method: 'POST', path: `/v2/sandboxes/${a.id}/connect`, headers: { 'x-api-key': tenantA }, json: { timeout: 300 } });
      expect(conn.status).toBe(200);
      expect(JSON.parse(conn.body).envdAccessToken).toBe(a.token);
      for (const r of [
        await doorRequest(d, { path: `/sandboxes/${a.id}`, headers: { 'x-api-key': tenantB } }),
        await doorRequest(d, { method: 'POST', path: `/v2/sandboxes/${a.id}/connect`, headers: { 'x-api-key': tenantB }, json: {} }),
      ]) {
        expect(r.status).toBe(404);
        expect(r.body).not.toContain(a.token);
        expect(JSON.parse(r.body)).toEqual({ code: 404, message: `sandbox ${a.id} not found` });
      }
    });

    it('must come with every envd request: missing, wrong or another sandbox\'s token is one 401', async () => {
      expect((await listProcesses(a.id, { 'x-access-token': a.token })).status).toBe(200);
      const wrong = a.token.slice(0, -2) + (a.token.endsWith('AA') ? 'BB' : 'AA');
      const refused = await Promise.all([
        listProcesses(a.id, {}),
        listProcesses(a.id, { 'x-access-token': wrong }),
        listProcesses(a.id, { 'x-access-token': b.token }),
        listProcesses(a.id, { 'x-access-token': 'garbage' }),
        // An API key is no envd credential.
        listProcesses(a.id, { 'x-api-key': tenantA, authorization: `Bearer ${tenantA}` }),
      ]);
      for (const r of refused) {
        expect(r.status).toBe(401);
        expect(JSON.parse(r.body)).toMatchObject({ code: 'unauthenticated' });
      }
      // The same for the plain HTTP routes, whatever the sandbox.
      for (const [id, token] of [[a.id, b.token], [b.id, a.token], ['0123456789abcdef', a.token]]) {
        const r = await doorRequest(d, { path: '/files?path=/etc/passwd', headers: { 'e2b-sandbox-id': id, 'x-access-token': token } });
        expect(r.status).toBe(401);
        expect(JSON.parse(r.body)).toEqual({ code: 401, message: expect.stringContaining('access token') });
      }
      const health = await doorRequest(d, { path: '/health', headers: { 'e2b-sandbox-id': b.id } });
      expect(health.status).toBe(401);
    });

    it('count failures against the source address\'s budget, as bad API keys do', async () => {
      // [remote] auth_failures_per_minute defaults to 30: after 30 failures in the minute the
      // address is refused (429) whatever it sends. This client is 127.0.0.7 alone.
      for (let i = 0; i < 30; i++) {
        const r = await doorRequest(d, { path: '/health', headers: { 'e2b-sandbox-id': a.id, 'x-access-token': b.token }, localAddress: '127.0.0.7' });
        expect(r.status).toBe(401);
      }
      const right = await doorRequest(d, { path: '/health', headers: { 'e2b-sandbox-id': a.id, 'x-access-token': a.token }, localAddress: '127.0.0.7' });
      expect(right.status).toBe(429);
      expect((await doorRequest(d, { path: '/health', headers: { 'e2b-sandbox-id': a.id, 'x-access-token': a.token } })).status).toBe(204);
    });

    it('route by the host name form 49983-<id>.<domain> too, and by the token alone', async () => {
      /** GET `p` with a Host header of E2B's host form (the TLS name stays one the certificate has). */
      const viaHost = (host: string, p: string, token: string) => new Promise<number>((resolve, reject) => {
        https.get({ host: '127.0.0.1', port: d.remotePort!, path: p, servername: 'localhost', ca: readFileSync(d.caFile), headers: { host, 'x-access-token': token }, agent: false }, (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode ?? 0));
        }).on('error', reject);
      });
      expect(await viaHost(`49983-${a.id}.e2b.test`, '/health', a.token)).toBe(204);
      expect(await viaHost(`49983-${a.id}.e2b.test`, '/health', b.token)).toBe(401);
      // Other ports of a sandbox are not forwarded.
      expect(await viaHost(`3000-${a.id}.e2b.test`, '/health', a.token)).toBe(400);
      const byToken = await doorRequest(d, { path: '/files?path=/etc/passwd', headers: { 'x-access-token': a.token } });
      expect(byToken.status).toBe(200);
      expect(byToken.body).toContain('user:x:1000:1000:');
    });
  });
});
