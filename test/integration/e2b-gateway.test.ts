/**
 * The E2B front through the fleet gateway (gateway/e2b.ts): the unmodified `e2b` SDK at
 * both versions the direct test uses (2.8.4 and the newest 2.x) pointed at a gateway
 * (E2B_API_URL and E2B_SANDBOX_URL both the gateway's URL) in front of two dsecd hosts
 * with real etcd (test/fixtures/fleet.ts). Creates are placed on a host, calls on one
 * sandbox and envd requests routed to its host, lists merged; the hosts check the envd
 * access tokens, so a missing, wrong or another sandbox's token is refused through the
 * gateway as it is directly; tenants stay apart.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT } from './harness.js';
import { TestFleet } from '../fixtures/fleet.js';
import { runE2bClient } from '../fixtures/e2b-sdk.js';

const run = IS_ROOT ? describe : describe.skip;

run('E2B SDKs through the fleet gateway', () => {
  const f = TestFleet.create({ hosts: ['h1', 'h2'], gateways: 1 });
  let tenantA = '';
  let tenantB = '';
  const sdk = (pkg: string, key: string, name: string, args: unknown = {}) => runE2bClient(f.url(), f.caFile, pkg, key, name, args);
  /** The host a sandbox lives on, as the gateway's /v1 list says. */
  const hostOf = async (id: string) => {
    const r = await f.request('GET', '/v1/sandboxes', { token: f.tokens.admin });
    return (r.json.sandboxes as { id: string; host: string }[]).find((s) => s.id === id)?.host;
  };

  beforeAll(async () => {
    await f.up();
    tenantA = f.tokens.user;
    tenantB = await f.makeToken('team-b', 'user');
  }, 300_000);
  afterAll(() => f.stop(), 180_000);

  for (const pkg of ['e2b-2-8', 'e2b']) {
    describe(pkg, () => {
      let sandboxId = '';

      it('creates on a host of the fleet and runs commands with streamed output, exit codes, stdin and kill', async () => {
        const r = await sdk(pkg, tenantA, 'commands', { metadata: { suite: 'gw', sdk: pkg } });
        expect(r.error).toBeUndefined();
        sandboxId = r.sandboxId as string;
        expect(['h1', 'h2']).toContain(await hostOf(sandboxId));
        expect(r.run).toEqual({ exitCode: 0, stdout: 'hi\nuser\n/home/user\n', stderr: 'oops\n' });
        expect((r.streamed as { stdout: string[] }).stdout.join('')).toBe('hi\nuser\n/home/user\n');
        expect((r.streamed as { stderr: string[] }).stderr.join('')).toBe('oops\n');
        expect(r.asRoot).toBe('root\n/root\n');
        expect(r.failing).toMatchObject({ threw: true, isCommandExitError: true, name: 'CommandExitError', exitCode: 3, stdout: 'before\n' });
        const bg = r.background as { pid: number; seen: string; killed: boolean; waited: { exitCode?: number } };
        expect(bg.seen).toBe('got:first\ngot:second\n');
        expect(bg.killed).toBe(true);
        expect(bg.waited).toMatchObject({ threw: true, name: 'CommandExitError', exitCode: -1 });
      });

      it('writes and reads text and a 5 MB binary byte-exact; lists, makes and removes directories', async () => {
        const r = await sdk(pkg, tenantA, 'files', { sandboxId });
        expect(r.error).toBeUndefined();
        expect(r.text).toEqual({ wrote: { name: 'hello.txt', type: 'file', path: '/home/user/hello.txt' }, read: 'hello from e2b\n' });
        const bin = r.binary as { sent: string; got: string; bytes: number };
        expect(bin.bytes).toBe(5 * 1024 * 1024);
        expect(bin.got).toBe(bin.sent);
        expect(r.makeDir).toEqual({ first: true, again: false });
        expect((r.list as { name: string }[]).map((e) => e.name).sort()).toEqual(['blob.bin', 'd1', 'hello.txt', 'rel']);
        expect([r.existsBefore, r.existsAfter, r.dirGone]).toEqual([true, false, true]);
      });

      it('lists by metadata across the hosts: only the caller\'s tenant\'s', async () => {
        const r = await sdk(pkg, tenantA, 'list', { metadata: { sdk: pkg } });
        expect(r.error).toBeUndefined();
        expect(r.items).toEqual([{ sandboxId, templateId: 'base', metadata: { suite: 'gw', sdk: pkg }, state: 'running' }]);
        const other = await sdk(pkg, tenantB, 'list', { metadata: { sdk: pkg } });
        expect(other.items).toEqual([]);
      });

      it('pauses, then connect resumes it with its state', async () => {
        const r = await sdk(pkg, tenantA, 'pauseConnect', { sandboxId });
        expect(r.error).toBeUndefined();
        expect(r).toMatchObject({ paused: true, stateWhilePaused: 'paused', stateAfter: 'running', file: 'kept', sleeping: true });
      });

      it('keeps another tenant out and refuses a wrong API key', async () => {
        const r = await sdk(pkg, tenantB, 'probe', { sandboxId });
        expect(r.error).toBeUndefined();
        expect((r.list as { value: string[] }).value).not.toContain(sandboxId);
        expect(r.connect).toMatchObject({ threw: true });
        expect(r.kill).toEqual({ threw: false, value: false });
        const bad = await sdk(pkg, 'e2b_' + '0'.repeat(48), 'probe', { sandboxId });
        for (const what of ['create', 'list', 'connect']) expect(bad[what]).toMatchObject({ threw: true, name: 'AuthenticationError' });
        expect(await sdk(pkg, tenantA, 'info', { sandboxId })).toMatchObject({ found: true, state: 'running' });
      });

      it('expires at the timeout set with setTimeout, and kills', async () => {
        const r = await sdk(pkg, tenantA, 'setTimeout', { sandboxId, timeoutMs: 2000 });
        expect(r.running).toBe(true);
        for (;;) {
          const i = await sdk(pkg, tenantA, 'info', { sandboxId });
          if (!i.found) break;
          await new Promise((res) => setTimeout(res, 500));
        }
        const c = await sdk(pkg, tenantA, 'commands', { metadata: { purpose: 'kill' } });
        expect(c.error).toBeUndefined();
        expect(await sdk(pkg, tenantA, 'kill', { sandboxId: c.sandboxId })).toMatchObject({ first: true, second: false });
        expect(await hostOf(c.sandboxId as string)).toBeUndefined();
      });
    });
  }

  describe('envd access tokens through the gateway', () => {
    let a: { id: string; token: string };
    let b: { id: string; token: string };
    const create = async (key: string) => {
      const r = await f.request('POST', '/v2/sandboxes', { token: null, headers: { 'x-api-key': key }, json: { templateID: 'base', timeout: 300 } });
      expect(r.status, r.body).toBe(201);
      return { id: r.json.sandboxID as string, token: r.json.envdAccessToken as string };
    };
    const listProcesses = (id: string, headers: Record<string, string>) => f.request('POST', '/process.Process/List', {
      token: null, json: {}, headers: { 'e2b-sandbox-id': id, 'e2b-sandbox-port': '49983', 'connect-protocol-version': '1', ...headers },
    });
    beforeAll(async () => {
      a = await create(tenantA);
      b = await create(tenantB);
    });

    it('are answered to the owner only, and a missing, wrong or another sandbox\'s token is one 401', async () => {
      expect(a.token).not.toBe(b.token);
      const info = await f.request('GET', `/sandboxes/${a.id}`, { token: null, headers: { 'x-api-key': tenantB } });
      expect(info.status).toBe(404);
      expect(info.body).not.toContain(a.token);
      expect((await listProcesses(a.id, { 'x-access-token': a.token })).status).toBe(200);
      const wrong = a.token.slice(0, -2) + (a.token.endsWith('AA') ? 'BB' : 'AA');
      for (const headers of [{}, { 'x-access-token': wrong }, { 'x-access-token': b.token }, { 'x-api-key': tenantA }]) {
        const r = await listProcesses(a.id, headers);
        expect(r.status, JSON.stringify(headers)).toBe(401);
      }
      // The plain HTTP routes, a sandbox no host has, and the token alone (the 2.8 SDKs' /files).
      for (const [id, token] of [[a.id, b.token], ['0123456789abcdef', a.token]]) {
        const r = await f.request('GET', '/files?path=/etc/passwd', { token: null, headers: { 'e2b-sandbox-id': id, 'x-access-token': token } });
        expect(r.status).toBe(401);
      }
      const byToken = await f.request('GET', '/files?path=/etc/passwd', { token: null, headers: { 'x-access-token': a.token } });
      expect(byToken.status).toBe(200);
      expect(byToken.body).toContain('user:x:1000:1000:');
    });
  });
});
