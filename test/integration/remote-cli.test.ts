/**
 * The CLI against a real dsecd over its TCP door only (no socket): `dsec exec -it` in a
 * terminal (node-pty), `cp` both ways, `logs -f`, `events`, `exec`, and contexts.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import pty from 'node-pty';
import { IS_ROOT, REPO, TestDaemon } from './harness.js';
import { doorRequest, makeToken } from './remote-helpers.js';

describe.skipIf(!IS_ROOT)('the CLI over the TCP door', () => {
  let d: TestDaemon;
  let tmp: string;
  let env: Record<string, string>;
  let id: string;
  /** Runs bin/dsec with the remote environment; DSEC_SOCKET points nowhere, so only the door can answer. */
  const dsec = async (args: string[], extra: Record<string, string> = {}, input?: string) => {
    const r = await execa(process.execPath, [path.join(REPO, 'bin/dsec'), ...args], { reject: false, input, env: { ...env, ...extra }, extendEnv: false, stripFinalNewline: false });
    return { code: r.exitCode ?? -1, stdout: String(r.stdout), stderr: String(r.stderr) };
  };
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 45, listen: true });
    tmp = mkdtempSync('/tmp/dsec-remote-cli-');
    const { token } = await makeToken(d, 'team-a', 'user');
    env = { PATH: process.env.PATH!, HOME: tmp, DSEC_CONFIG_DIR: path.join(tmp, 'cfg'), DSEC_SOCKET: path.join(tmp, 'no.sock'), DSEC_HOST: d.remoteUrl, DSEC_TOKEN: token, DSEC_CA: d.caFile };
    // The token's tenant's sandbox (another tenant's, the socket's system one included, would be NotFound to it).
    const made = await doorRequest(d, { method: 'POST', path: '/v1/sandboxes', token, json: { image: 'busybox' } });
    id = (JSON.parse(made.body) as { id: string }).id;
  });
  afterAll(async () => {
    await d?.cleanup();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  it('exec and ls answer over TLS; without a token or with the wrong CA it says why', async () => {
    const r = await dsec(['exec', id, '--', 'echo', 'hello over tls']);
    expect(r).toMatchObject({ code: 0, stdout: 'hello over tls\n' });
    expect((await dsec(['ls', '-q'])).stdout).toContain(id);
    expect((await dsec(['--json', 'ls'])).stdout).toContain(`"${id}"`);
    const noToken = await dsec(['ls'], { DSEC_TOKEN: '' });
    expect(noToken.code).toBe(125);
    expect(noToken.stderr).toMatch(/authentication required/);
    expect(noToken.stderr).toMatch(/hint: pass a token/);
    const badCa = await dsec(['ls'], { DSEC_CA: '/etc/ssl/certs/ca-certificates.crt' });
    expect(badCa.code).toBe(125);
    expect(badCa.stderr).toMatch(/TLS: dsecd at https:\/\/127\.0\.0\.1:\d+ presented a certificate this client does not trust/);
  });

  it('cp uploads and downloads files', async () => {
    const local = path.join(tmp, 'up.txt');
    writeFileSync(local, 'payload\n'.repeat(1000));
    expect((await dsec(['cp', local, `${id}:/tmp/up.txt`])).code).toBe(0);
    const back = path.join(tmp, 'down.txt');
    const r = await dsec(['cp', `${id}:/tmp/up.txt`, back]);
    expect(r.stderr).toBe('');
    expect(readFileSync(back, 'utf8')).toBe('payload\n'.repeat(1000));
  });

  it('logs -f streams until interrupted, and events answers', async () => {
    const p = execa(process.execPath, [path.join(REPO, 'bin/dsec'), 'logs', '-f', id], { reject: false, env, extendEnv: false });
    let out = '';
    p.stdout!.on('data', (b: Buffer) => (out += b.toString()));
    while (!out.includes('sandbox.created') && !out.includes('created')) await new Promise((r) => setTimeout(r, 100));
    await dsec(['exec', id, '--', 'true']);
    while (!/exec/.test(out.split('\n').slice(-5).join('\n'))) await new Promise((r) => setTimeout(r, 100));
    p.kill('SIGINT');
    await p;
    const ev = await dsec(['--json', 'events', '--since', '1h']);
    expect(ev.code).toBe(0);
    expect(ev.stdout).toContain(id);
  });

  it('exec -it runs a shell in a terminal over TLS', async () => {
    const p = pty.spawn(process.execPath, [path.join(REPO, 'bin/dsec'), 'exec', '-it', id, '--', 'sh'], { name: 'xterm', cols: 80, rows: 24, cwd: REPO, env });
    let screen = '';
    p.onData((s) => (screen += s));
    const exited = new Promise<number>((r) => p.onExit((e) => r(e.exitCode)));
    const t0 = Date.now();
    // busybox sh's prompt (it may be followed by a cursor-position query).
    while (!screen.includes('/ # ')) {
      if (Date.now() - t0 > 20_000) throw new Error(`no prompt; screen: ${JSON.stringify(screen)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    p.write('echo "tty: $(tty)"; stty size\r');
    while (!/24 80/.test(screen)) await new Promise((r) => setTimeout(r, 100));
    expect(screen).toMatch(/tty: \/dev\/pts\/\d+/);
    p.write('exit 7\r');
    expect(await exited).toBe(7);
  });

  it('top shows the sandbox over TLS and quits on q; attach joins a detached session', async () => {
    const p = pty.spawn(process.execPath, [path.join(REPO, 'bin/dsec'), 'top'], { name: 'xterm', cols: 160, rows: 30, cwd: REPO, env });
    let screen = '';
    p.onData((s) => (screen += s));
    const exited = new Promise<number>((r) => p.onExit((e) => r(e.exitCode)));
    while (!screen.includes(id.slice(0, 12))) await new Promise((r) => setTimeout(r, 100));
    p.write('q');
    expect(await exited).toBe(0);

    const started = await dsec(['exec', '-d', '-i', id, '--', 'sh', '-c', 'read line; echo "got $line"']);
    expect(started.code).toBe(0);
    const execId = started.stdout.trim();
    const a = await dsec(['attach', id, execId], {}, 'over the door\n');
    expect(a.stdout).toContain('got over the door');
    expect(a.code).toBe(0);
  });

  it('context add/use makes a saved endpoint the default', async () => {
    const noEnv = { DSEC_HOST: '', DSEC_TOKEN: '', DSEC_CA: '', DSEC_SOCKET: '' };
    expect((await dsec(['context', 'add', 'lab', '--host', d.remoteUrl, '--token', env.DSEC_TOKEN, '--ca', d.caFile, '--use'], noEnv)).code).toBe(0);
    const r = await dsec(['exec', id, '--', 'echo', 'via context'], noEnv);
    expect(r.stderr).toBe('');
    expect(r).toMatchObject({ code: 0, stdout: 'via context\n' });
    const ls = await dsec(['context', 'ls'], noEnv);
    expect(ls.stdout).toMatch(/\*\s+lab\s+https:\/\/127\.0\.0\.1/);
    expect(ls.stdout).not.toContain(env.DSEC_TOKEN);
    // DSEC_SOCKET (or --socket) wins over the current context.
    expect((await dsec(['ls'], { ...noEnv, DSEC_SOCKET: env.DSEC_SOCKET })).stderr).toMatch(/no\.sock/);
    expect((await dsec(['context', 'use', '-'], noEnv)).code).toBe(0);
    expect((await dsec(['context', 'ls'], noEnv)).stdout).toMatch(/^\*\s+\(local socket\)/m);
  });
});
