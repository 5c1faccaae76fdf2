/**
 * Per-image security defaults (daemon/image/security.ts, docs/IMAGES.md "Security
 * defaults") on a real dsecd (slot 31) whose config sets `[filesystem] writable_paths`:
 * set by `dsec image build|compose` and `dsec commit` flags, validated, shown by `dsec
 * image inspect`; precedence request > image > config, field by field; the image's
 * seccomp override reaches the sandbox's filter and the sandbox's own override wins over
 * it (also in the image's fncall workers); a sandbox keeps the options it was created
 * with when the image changes later.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chmodSync, copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import path from 'node:path';
import { IS_ROOT, TestDaemon, err, out, postJson, rejection, runCli } from './harness.js';
import type { ExecResult } from '../../sdk/index.js';

describe.skipIf(!IS_ROOT)('image security defaults', () => {
  let d: TestDaemon;
  let tmp: string;
  const sh = (id: string, script: string) => d.client.exec(id, { argv: ['sh', '-c', script] });
  const made: string[] = [];
  const create = async (req: Parameters<TestDaemon['client']['createSandbox']>[0]) => {
    const s = await d.client.createSandbox(req);
    made.push(s.id);
    return s;
  };

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 31, config: '[filesystem]\nwritable_paths = ["/srv"]\n' });
    tmp = mkdtempSync('/tmp/dsec-imgsec-');
    // A one-layer image: busybox and a few applets, built by `dsec image build`.
    const root = path.join(tmp, 'tree');
    for (const dir of ['bin', 'etc', 'tmp', 'root', 'proc', 'sys', 'dev']) mkdirSync(path.join(root, dir), { recursive: true });
    chmodSync(path.join(root, 'tmp'), 0o1777);
    copyFileSync('/bin/busybox', path.join(root, 'bin/busybox'));
    for (const a of ['sh', 'mkdir', 'ls', 'cat', 'echo', 'stat', 'test']) symlinkSync('busybox', path.join(root, 'bin', a));
    const b = await runCli(d, ['image', 'build', root, '--tag', 'sec:1', '--env', 'PATH=/bin', '--writable', '/work', '--seccomp-deny', 'mkdir', '--seccomp-deny', 'mkdirat']);
    expect(b.code, b.stderr).toBe(0);
  });
  afterAll(async () => {
    for (const id of made) await d.client.deleteSandbox(id, { force: true }).catch(() => undefined);
    if (tmp) rmSync(tmp, { recursive: true, force: true });
    await d?.cleanup();
  });

  it('dsec image inspect shows the security defaults the flags set', async () => {
    const r = await runCli(d, ['image', 'inspect', 'sec:1']);
    expect(JSON.parse(r.stdout).config.security).toEqual({ writable_paths: ['/work'], seccomp: { deny: ['mkdir', 'mkdirat'] } });
  });

  it('a sandbox of the image gets them: /work created and writable, mkdir denied by the image\'s seccomp override', async () => {
    const s = await create({ image: 'sec:1' });
    // The image's writable_paths replace the config's (/srv); the rest comes from the config's defaults.
    expect(s.filesystem).toEqual({ readonly_paths: ['/bin', '/sbin', '/usr', '/lib*', '/etc'], writable_paths: ['/work'], landlock: true });
    const r = await sh(s.id, 'echo ok > /work/f && cat /work/f; mkdir /tmp/d; ls -d /srv 2>&1');
    expect(out(r)).toBe('ok\nls: /srv: No such file or directory\n');
    expect(err(r)).toBe("mkdir: can't create directory '/tmp/d': Operation not permitted\n");
  });

  it('fncall workers of the image get its seccomp override too', async () => {
    const r = await postJson<ExecResult>(d, '/v1/run', { backend: 'fncall', image: 'sec:1', argv: ['mkdir', '/tmp/d'] });
    expect({ code: r.exit_code, err: err(r) }).toEqual({ code: 1, err: "mkdir: can't create directory '/tmp/d': Operation not permitted\n" });
  });

  it('the request wins, field by field: its own writable_paths and a seccomp allow that undoes the image\'s deny', async () => {
    const s = await create({ image: 'sec:1', filesystem: { writable_paths: ['/data'], landlock: false }, seccomp: { allow: ['mkdir', 'mkdirat'] } });
    expect(s.filesystem).toEqual({ readonly_paths: ['/bin', '/sbin', '/usr', '/lib*', '/etc'], writable_paths: ['/data'], landlock: false });
    expect(out(await sh(s.id, 'mkdir /tmp/d && echo mkdir-ok; ls -d /work /data 2>&1'))).toBe('mkdir-ok\nls: /work: No such file or directory\n/data\n');
  });

  it('the config applies when neither says anything; dsec create flags set the request', async () => {
    const s = await create({ image: 'busybox' });
    expect(s.filesystem!.writable_paths).toEqual(['/srv']);
    expect(out(await sh(s.id, 'echo x > /srv/x && cat /srv/x'))).toBe('x\n');
    const c = await runCli(d, ['create', '--image', 'busybox', '--writable', '/a', '--writable', '/b/c', '--readonly', '/usr', '--readonly', '/etc', '--no-landlock']);
    expect(c.code, c.stderr).toBe(0);
    made.push(c.stdout.trim());
    expect((await d.client.getSandbox(c.stdout.trim())).filesystem).toEqual({ readonly_paths: ['/usr', '/etc'], writable_paths: ['/a', '/b/c'], landlock: false });
    // /bin is no longer read-only in that sandbox; /etc still is.
    expect(out(await sh(c.stdout.trim(), 'echo x > /bin/x && echo bin-ok; (echo x > /etc/x) 2>&1'))).toMatch(/^bin-ok\n.*Read-only file system/);
    const off = await runCli(d, ['create', '--image', 'busybox', '--no-readonly']);
    made.push(off.stdout.trim());
    expect((await d.client.getSandbox(off.stdout.trim())).filesystem!.readonly_paths).toEqual([]);
  });

  it('a later change of the image never alters an existing sandbox, across stop and start', async () => {
    const s = await create({ image: 'sec:1' });
    const img = await d.client.getImage('sec:1');
    await d.client.composeImage({ image: 'sec:1', layers: img.layers, from: 'sec:1', config: { security: { writable_paths: ['/other'], seccomp: {} } } });
    expect((await d.client.getImage('sec:1')).config.security).toEqual({ writable_paths: ['/other'], seccomp: {} });
    await d.client.stopSandbox(s.id, { timeoutMs: 0 });
    await d.client.startSandbox(s.id);
    expect((await d.client.getSandbox(s.id)).filesystem!.writable_paths).toEqual(['/work']);
    const r = await sh(s.id, 'ls -d /work; ls -d /other 2>&1; mkdir /tmp/e 2>&1');
    expect(out(r)).toMatch(/^\/work\nls: \/other: No such file or directory\nmkdir: can't create directory '\/tmp\/e': Operation not permitted\n$/);
  });

  it('dsec commit sets the new image\'s defaults over the sandbox\'s image\'s; compose validates them', async () => {
    const s = await create({ image: 'busybox' });
    const c = await runCli(d, ['commit', s.id, 'committed:1', '--writable', '/work', '--no-landlock']);
    expect(c.code, c.stderr).toBe(0);
    expect((await d.client.getImage('committed:1')).config.security).toEqual({ writable_paths: ['/work'], landlock: false });
    const bb = await d.client.getImage('busybox');
    const bad = await rejection(d.client.composeImage({ image: 'bad:1', layers: bb.layers, config: { security: { writable_paths: ['work'] } } }));
    expect(bad.code).toBe('InvalidArgument');
    expect(bad.message).toMatch(/security.*writable_paths.*"work": paths are absolute/);
    const badCli = await runCli(d, ['image', 'compose', 'bad:1', bb.layers[0], '--readonly', 'usr']);
    expect(badCli.code).not.toBe(0);
    expect(badCli.stderr).toMatch(/--readonly: "usr" is not an absolute path/);
  });

  it('dsec host info reports the defaults of this dsecd', async () => {
    const h = await d.client.hostInfo();
    expect(h.defences.readonly_paths).toEqual({ enforced: true, detail: expect.stringMatching(/\/bin \/sbin \/usr \/lib\* \/etc.*default writable_paths: \/srv/) });
  });
});
