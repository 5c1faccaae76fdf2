/**
 * The E2B front (daemon/api/e2b, docs/E2B.md) driven by the unmodified `e2b` SDK, at two
 * versions whose endpoints differ (2.8.4: create and connect without /v2, `/files`
 * without the sandbox header; the newest 2.x: /v2 routes, stdin control), against a real
 * dsecd's TCP door: the SDK runs as its own program (test/fixtures/e2b-client.mjs) with
 * only E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY and NODE_EXTRA_CA_CERTS set, as a user's
 * program would.
 *
 * Through the fleet gateway: the gateway does not exist yet (issue 20); when it does, run
 * the same scenarios with E2B_API_URL and E2B_SANDBOX_URL pointing at it (`sdkAt` below
 * takes the URL).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { execa } from 'execa';
import path from 'node:path';
import { IS_ROOT, REPO, TestDaemon } from './harness.js';
import { doorRequest, makeToken } from './remote-helpers.js';

const CLIENT = path.join(REPO, 'test/fixtures/e2b-client.mjs');

/** What a scenario of the client program observed. */
type Observed = { ok: boolean; error?: { name: string; message: string; stack?: string }; [k: string]: unknown };

describe.skipIf(!IS_ROOT)('E2B SDKs against dsecd', () => {
  let d: TestDaemon;
  let tenantA: string;
  let tenantB: string;
  let admin: string;

  /** Runs scenario `name` of the client program with SDK package `pkg` and API key `key`, against `url`. */
  const sdkAt = async (url: string, pkg: string, key: string, name: string, args: unknown = {}): Promise<Observed> => {
    const r = await execa(process.execPath, [CLIENT, pkg, name, JSON.stringify(args)], {
      cwd: REPO,
      env: { E2B_API_URL: url, E2B_SANDBOX_URL: url, E2B_API_KEY: key, NODE_EXTRA_CA_CERTS: d.caFile, E2B_DEBUG: 'false' },
      extendEnv: true,
      reject: false,
    });
    const line = String(r.stdout).trim().split('\n').pop() ?? '';
    try {
      return JSON.parse(line) as Observed;
    } catch {
      throw new Error(`client ${pkg} ${name} printed no result (exit ${r.exitCode}):\n${r.stdout}\n${r.stderr}`);
    }
  };
  const sdk = (pkg: string, key: string, name: string, args: unknown = {}) => sdkAt(d.remoteUrl, pkg, key, name, args);

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
    });
  }
});
