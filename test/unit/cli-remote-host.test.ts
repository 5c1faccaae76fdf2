/**
 * What a newcomer to remote access is told. A mistyped dsecd address (`--host`,
 * DSEC_HOST, a context's host) is the user's mistake: the CLI says what it wants and
 * exits 125 with a hint, never "internal error ... this is a bug in dsec" (nothing is
 * listening: the address is refused before any connection). The hints under token and
 * tenant errors name what the user can do.
 */
import { mkdtempSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { hintFor } from '../../cli/util/errors.js';
import { runCli } from '../fixtures/fake-dsecd.js';

let home: string;
beforeEach(() => {
  home = mkdtempSync(join(tmpdir(), 'dsec-cli-host-'));
});
afterEach(() => {
  rmSync(home, { recursive: true, force: true });
});

const BAD: [string, RegExp][] = [
  ['http://127.0.0.1:8443', /http:\/\/127\.0\.0\.1:8443.*https:\/\/HOST:PORT/],
  ['127.0.0.1:8443', /127\.0\.0\.1:8443.*https:\/\/HOST:PORT/],
  ['dsec1.example.org', /dsec1\.example\.org.*https:\/\/HOST:PORT/],
  ['https://dsec1.example.org:8443/v1', /no path after HOST:PORT/],
];

describe('a malformed dsecd address', () => {
  for (const [host, says] of BAD) {
    it(`--host ${host} is a user error`, async () => {
      const r = await runCli(['--host', host, '--token', 'e2b_00', 'ls'], { socket: null, env: { HOME: home } });
      expect(r.code).toBe(125);
      expect(r.err).toMatch(says);
      expect(r.err).toMatch(/^hint: .*--host https:\/\//m);
      expect(r.err).not.toMatch(/internal error|a bug in dsec/);
    });
  }

  it('DSEC_HOST and a context with a bad address name where it came from', async () => {
    const env = await runCli(['ls'], { socket: null, env: { HOME: home, DSEC_HOST: 'http://127.0.0.1:8443' } });
    expect(env.code).toBe(125);
    expect(env.err).toMatch(/^dsec: DSEC_HOST "http:\/\/127\.0\.0\.1:8443"/);
    mkdirSync(join(home, '.config', 'dsec'), { recursive: true });
    writeFileSync(join(home, '.config', 'dsec', 'contexts.json'), JSON.stringify({ current: 'lab', contexts: { lab: { host: 'dsec1:8443' } } }));
    const ctx = await runCli(['ls'], { socket: null, env: { HOME: home } });
    expect(ctx.code).toBe(125);
    expect(ctx.err).toMatch(/^dsec: context lab: host "dsec1:8443"/);
    expect(ctx.err).not.toMatch(/internal error|a bug in dsec/);
  });
});

describe('hints of token and tenant errors', () => {
  it('an unknown token id points at the token list, not the sandboxes', () => {
    expect(hintFor('NotFound', 'token revoke')).toBe('list tokens with `dsec token ls` (an admin token, or the Unix socket on dsecd\'s host)');
  });

  it("a user's rm of a system image says who may remove it and how to shadow it", () => {
    const message = 'image busybox:latest is a system image shared by every tenant; only an admin may remove it';
    expect(hintFor('PermissionDenied', 'image rm', { message })).toBe("a system image is every tenant's: an admin removes it; your tenant's own image of the name (`dsec image tag`, `dsec commit`) shadows it for you");
    // A reader's refusal is about its role.
    expect(hintFor('PermissionDenied', 'image rm', { message: 'a reader token may not DELETE /v1/images/:ref' })).toMatch(/^the token's role may not do this/);
  });
});
