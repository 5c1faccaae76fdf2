/**
 * The Python client (sdk/python, package `dsec`) against a real dsecd: its unittest suite
 * and its rollout example, run with Debian's /usr/bin/python3, once over the Unix socket
 * and once over the TCP door (TLS 1.3, a token), each configured only by the environment
 * the CLI reads (DSEC_SOCKET; DSEC_HOST, DSEC_TOKEN, DSEC_CA). Tokens of another tenant
 * and of a reader are handed to the door's run for its refusal tests. The Python output
 * is shown when a run fails.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import path from 'node:path';
import { existsSync } from 'node:fs';
import { execa } from 'execa';
import { IS_ROOT, REPO, TestDaemon } from './harness.js';
import { makeToken } from './remote-helpers.js';

/**
 * The Python that runs the suite: `DSEC_TEST_PYTHON` (e.g. a 3.9 build, the oldest the
 * package supports), else Debian's own /usr/bin/python3 (what trainer machines have; a
 * pyenv shim on PATH is not it).
 */
const PYTHON = process.env.DSEC_TEST_PYTHON || (existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3');
const PKG = path.join(REPO, 'sdk', 'python');

/** The environment of a Python run: the caller's, minus every DSEC_ variable, plus `env`. */
function pyEnv(env: Record<string, string>): Record<string, string> {
  const base: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !k.startsWith('DSEC_')) base[k] = v;
  return { ...base, PYTHONDONTWRITEBYTECODE: '1', PYTHONUNBUFFERED: '1', ...env };
}

/** Runs `python3 args` in sdk/python; resolves with its exit code and combined output. */
async function python(args: string[], env: Record<string, string>): Promise<{ code: number; out: string }> {
  const r = await execa(PYTHON, args, { cwd: PKG, env: pyEnv(env), extendEnv: false, reject: false, all: true });
  return { code: r.exitCode ?? -1, out: String(r.all ?? '') };
}

describe.skipIf(!IS_ROOT)('the Python client', () => {
  let d: TestDaemon;
  let unixEnv: Record<string, string>;
  let tlsEnv: Record<string, string>;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 44, listen: true });
    const admin = await makeToken(d, 'system', 'admin');
    const other = await makeToken(d, 'other', 'user');
    const reader = await makeToken(d, 'system', 'reader');
    unixEnv = { DSEC_SOCKET: d.socket };
    tlsEnv = { DSEC_HOST: d.remoteUrl, DSEC_TOKEN: admin.token, DSEC_CA: d.caFile, DSEC_TEST_OTHER_TOKEN: other.token, DSEC_TEST_READER_TOKEN: reader.token };
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  for (const door of ['unix', 'tls'] as const) {
    it(`passes its unittest suite over the ${door === 'unix' ? 'Unix socket' : 'TCP door (TLS, token)'}`, async () => {
      const r = await python(['-m', 'unittest', 'discover', '-s', 'tests', '-t', 'tests', '-v'], door === 'unix' ? unixEnv : tlsEnv);
      expect(r.code, r.out).toBe(0);
      expect(r.out).toMatch(/^OK/m);
      // The door's refusal tests ran there and were skipped on the socket.
      if (door === 'tls') expect(r.out).toMatch(/test_another_tenants_token_is_refused \(.*\) \.\.\. ok/);
      else expect(r.out).toMatch(/test_another_tenants_token_is_refused \(.*\) \.\.\. skipped/);
    }, 30 * 60_000);
  }

  it('installs offline into a virtual environment made with python3 -m venv', async () => {
    const venv = path.join(d.root, 'venv');
    const mk = await python(['-m', 'venv', venv], {});
    expect(mk.code, mk.out).toBe(0);
    const pip = await execa(path.join(venv, 'bin', 'pip'), ['install', '--no-index', '--disable-pip-version-check', PKG], { reject: false, all: true, env: pyEnv({}), extendEnv: false, cwd: d.root });
    expect(pip.exitCode, String(pip.all)).toBe(0);
    // Imported from the venv (not the source tree) and talking to dsecd.
    const r = await execa(path.join(venv, 'bin', 'python'), ['-c', 'import dsec, sys; print(dsec.__file__); print(dsec.Client().version()["version"])'], { reject: false, all: true, env: pyEnv(unixEnv), extendEnv: false, cwd: d.root });
    expect(r.exitCode, String(r.all)).toBe(0);
    const [file, version] = String(r.stdout).split('\n');
    expect(file.startsWith(path.join(venv, 'lib'))).toBe(true);
    expect(existsSync(path.join(path.dirname(file), 'py.typed'))).toBe(true);
    expect(version).toBe((await d.client.version()).version);
  }, 10 * 60_000);
});
