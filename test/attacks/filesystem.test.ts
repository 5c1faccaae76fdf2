/**
 * Attacks on the filesystem from inside a sandbox (issue 8 items 4 and 6; docs/SECURITY.md
 * "Filesystem" and "Landlock"), as root of the sandbox on a real dsecd (slot 30):
 *
 *   - overwrite /bin/sh, /bin/busybox, /etc/passwd, /etc/ld.so.preload; in a merged-/usr
 *     image replace the /bin symlink and write /usr/bin; create a new top-level entry;
 *     through exec, the files API and `dsec cp`: refused (EROFS), with an error that
 *     names the directory to pass to `--writable` (never a file, and `--no-readonly`
 *     only for a whole read-only path); none of that advice with read-only paths off;
 *   - write /proc/sys, /sys and /proc/self/...; ioctl a device: refused;
 *   - escape through a symlink in an upload path (to /, /proc/1/root, a ..-laden target,
 *     the host's dsecd state directory), by the files API, a tar and `dsec cp`: every
 *     byte lands inside the sandbox or is refused, and nothing appears on the host;
 *   - read another sandbox's files, host logs, host sockets, the host through
 *     /proc/1/root: nothing of the host or the neighbour is visible.
 *
 * A neighbouring sandbox runs an exec during every attack and after it. Each defence the
 * kernel enforces here is also switched off once, to show its test can fail:
 * `readonly_paths: []` lets the /bin and /etc writes through, `landlock: false` lets the
 * /proc/self write and the device ioctl through (in a sandbox and in an fncall call).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync, chmodSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import tarStream from 'tar-stream';
import { execa } from 'execa';
import { IS_ROOT, TestDaemon, err, out, postJson, runCli } from '../integration/harness.js';
import type { ExecResult } from '../../sdk/index.js';

interface RawResult { status: number; body: string }

describe.skipIf(!IS_ROOT)('filesystem attacks', () => {
  let d: TestDaemon;
  /** The attacker (default filesystem options) and a neighbour that must keep working. */
  let sb: string;
  let neighbour: string;
  let tmp: string;
  /** A name no test has used on the host, for "nothing appeared" checks. */
  const marker = `dsec-escape-${randomBytes(4).toString('hex')}`;

  const sh = (id: string, script: string) => d.client.exec(id, { argv: ['sh', '-c', script] });
  /** Runs `attack` while the neighbour execs, then checks the neighbour once more. */
  const withNeighbour = async <T>(attack: () => Promise<T>): Promise<T> => {
    const [r, during] = await Promise.all([attack(), sh(neighbour, 'echo alive; cat /root/own')]);
    expect(out(during)).toBe('alive\nneighbour data\n');
    expect(out(await sh(neighbour, 'echo alive'))).toBe('alive\n');
    return r;
  };
  /** One raw HTTP request on the daemon socket (the files API is raw bytes). */
  const raw = (method: string, p: string, body?: Buffer | string, type = 'application/octet-stream') => new Promise<RawResult>((resolve, reject) => {
    const r = http.request({ socketPath: d.socket, method, path: p, headers: { 'content-type': type } }, (res) => {
      const parts: Buffer[] = [];
      res.on('data', (c: Buffer) => parts.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, body: Buffer.concat(parts).toString() }));
      res.on('error', reject);
    });
    r.on('error', reject);
    r.end(body);
  });
  const tarOf = async (entries: Array<{ name: string; type?: 'file' | 'symlink' | 'directory'; linkname?: string; body?: string }>) => {
    const pack = tarStream.pack();
    for (const e of entries) pack.entry({ name: e.name, type: e.type ?? 'file', linkname: e.linkname }, e.body ?? (e.type === 'file' || !e.type ? 'x' : undefined));
    pack.finalize();
    const chunks: Buffer[] = [];
    for await (const c of pack) chunks.push(c as Buffer);
    return Buffer.concat(chunks);
  };
  /** Nothing named `marker` anywhere a symlink escape could have put it on the host. */
  const assertNothingOnHost = () => {
    for (const dir of ['/', '/tmp', '/etc', '/root', d.root, path.join(d.root, 'sandboxes'), tmp]) {
      expect(readdirSync(dir).filter((n) => n.includes(marker)), dir).toEqual([]);
    }
    for (const p of [`/tmp/${marker}`, `/${marker}`, path.join(d.root, marker), `/proc/1/root/tmp/${marker}`]) expect(existsSync(p), p).toBe(false);
  };

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 30, config: '[fncall]\nmax_workers = 1\nmin_idle = 0\n' });
    tmp = mkdtempSync('/tmp/dsec-fs-attack-');
    [sb, neighbour] = (await Promise.all([d.client.createSandbox({ image: 'busybox' }), d.client.createSandbox({ image: 'busybox' })])).map((s) => s.id);
    expect((await sh(neighbour, 'echo "neighbour data" > /root/own')).exit_code).toBe(0);
  });
  afterAll(async () => {
    if (tmp) rmSync(tmp, { recursive: true, force: true });
    await d?.cleanup();
  });

  describe('read-only system paths', () => {
    it('the sandbox says what is in force: read-only root, Landlock, and which paths are writable', async () => {
      const s = await d.client.getSandbox(sb);
      expect(s.filesystem).toEqual({ readonly_paths: ['/bin', '/sbin', '/usr', '/lib*', '/etc'], writable_paths: [], landlock: true });
      expect(s.defences!.readonly_paths).toEqual({ enforced: true, detail: expect.stringMatching(/root read-only .*read-write: \/home \/root \/run \/tmp \/var$/) });
      expect(s.defences!.landlock).toEqual({ enforced: true, detail: expect.stringMatching(/Landlock ABI \d+ on the agent/) });
      const host = await d.client.hostInfo();
      expect(host.defences.landlock.enforced).toBe(true);
      expect(host.defences.readonly_paths.enforced).toBe(true);
    });

    it('overwriting /bin/sh, /bin/busybox, /etc/passwd, /etc/ld.so.preload fails with EROFS, for root too', async () => {
      const attacks = [
        'echo pwned > /bin/sh', 'cp /bin/busybox /tmp/bb && cat /tmp/bb > /bin/busybox', 'rm -f /bin/sh', 'mv /tmp/bb /bin/busybox',
        'echo "evil::0:0::/:/bin/sh" >> /etc/passwd', 'echo /tmp/evil.so > /etc/ld.so.preload', 'chmod 777 /etc', 'touch /usr/bin/x', 'ln -s /tmp/x /sbin/y',
      ];
      for (const a of attacks) {
        const r = await withNeighbour(() => sh(sb, a));
        expect({ a, code: r.exit_code === 0 ? 0 : 'failed', err: err(r) }).toEqual({ a, code: 'failed', err: expect.stringMatching(/Read-only file system/) });
      }
      expect(out(await sh(sb, 'id -u; /bin/sh -c "echo sh ok"; grep -c evil /etc/passwd; test -e /etc/ld.so.preload || echo no-preload'))).toBe('0\nsh ok\n0\nno-preload\n');
    });

    it('no new top-level entry: mkdir /work, a file at /, replacing a top-level symlink', async () => {
      for (const a of ['mkdir /work', 'echo x > /state', 'rm /linuxrc', 'ln -sfn /tmp /linuxrc', 'mv /tmp /tmp2']) {
        const r = await withNeighbour(() => sh(sb, a));
        expect(r.exit_code, a).not.toBe(0);
      }
      expect(out(await sh(sb, 'ls /'))).toBe('bin\ndev\netc\nhome\nlinuxrc\nproc\nroot\nrun\nsbin\nsys\ntmp\nusr\nvar\n');
    });

    it('the files API and dsec cp refuse with an error that names the directory to keep writable', async () => {
      const put = await withNeighbour(() => raw('PUT', `/v1/sandboxes/${sb}/files?path=/bin/sh`, 'pwned'));
      expect(put.status).toBe(412);
      expect(JSON.parse(put.body).error).toEqual({
        code: 'FailedPrecondition', reason: 'readonly_path',
        message: expect.stringMatching(/^write \/bin\/sh: Read-only file system: \/bin\/sh is read-only in sandbox [0-9a-f]{16} \(below the read-only path \/bin\); to write there, create the sandbox with `--writable \/bin` .*\/bin\/sh itself cannot be one\), or with `--no-readonly`$/),
      });
      // A file: its directory is named, never the file as a writable path.
      const passwd = JSON.parse((await raw('PUT', `/v1/sandboxes/${sb}/files?path=/etc/passwd`, 'x')).body).error;
      expect(passwd).toMatchObject({ reason: 'readonly_path', message: expect.stringMatching(/`--writable \/etc`/) });
      expect(passwd.message).not.toMatch(/--writable \/etc\/passwd/);
      const mk = await raw('POST', `/v1/sandboxes/${sb}/files/mkdir`, JSON.stringify({ path: '/work' }), 'application/json');
      expect(JSON.parse(mk.body).error).toMatchObject({ code: 'FailedPrecondition', reason: 'readonly_path', message: expect.stringMatching(/^mkdir \/work: Read-only file system/) });
      const local = path.join(tmp, 'upload.txt');
      writeFileSync(local, 'data\n');
      const cp = await runCli(d, ['cp', local, `${sb}:/work/upload.txt`]);
      expect(cp.code).not.toBe(0);
      expect(cp.stderr).toMatch(/Read-only file system: \/work\/upload.txt is read-only in sandbox [0-9a-f]{16} \(the top level is read-only: no new top-level entry can be made\); to write there, create the sandbox with `--writable \/work`/);
      // --writable /work is the whole way out: no --no-readonly, in the message or the hint.
      expect(cp.stderr).not.toMatch(/--no-readonly/);
      expect(cp.stderr).toMatch(/hint: filesystem options are fixed when a sandbox is made: .*--writable DIR/);
      // The way out works: a sandbox with the path in writable_paths gets it, created by dsecd.
      const ok = await d.client.createSandbox({ image: 'busybox', filesystem: { writable_paths: ['/work', '/usr/local/lib'] } });
      try {
        expect((await runCli(d, ['cp', local, `${ok.id}:/work/upload.txt`])).code).toBe(0);
        expect(out(await sh(ok.id, 'cat /work/upload.txt; stat -c %u:%a /work; echo x > /usr/local/lib/y && echo lib-ok; echo x > /usr/local/z 2>&1 || true')))
          .toMatch(/^data\n0:755\nlib-ok\n/);
        expect(err(await sh(ok.id, 'echo x > /usr/local/z'))).toMatch(/Read-only file system/);
      } finally {
        await d.client.deleteSandbox(ok.id, { force: true });
      }
    });

    it('a merged-/usr image: the /bin -> usr/bin symlink cannot be replaced, /usr/bin cannot be written', async () => {
      const root = path.join(tmp, 'merged');
      for (const dir of ['usr/bin', 'usr/lib', 'etc', 'tmp', 'root', 'proc', 'sys', 'dev']) mkdirSync(path.join(root, dir), { recursive: true });
      chmodSync(path.join(root, 'tmp'), 0o1777);
      copyFileSync('/bin/busybox', path.join(root, 'usr/bin/busybox'));
      chmodSync(path.join(root, 'usr/bin/busybox'), 0o755);
      for (const a of ['sh', 'echo', 'cat', 'ls', 'rm', 'ln', 'mv', 'mkdir', 'touch', 'readlink', 'id', 'test', 'cp']) symlinkSync('busybox', path.join(root, 'usr/bin', a));
      for (const [l, t] of [['bin', 'usr/bin'], ['sbin', 'usr/bin'], ['lib', 'usr/lib']]) symlinkSync(t, path.join(root, l));
      writeFileSync(path.join(root, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\n');
      await d.client.importImage({ type: 'dir', path: root, image: 'merged-usr:1', config: { env: ['PATH=/usr/bin:/bin'], cwd: '/', user: '0', cmd: ['/bin/sh'] } });
      const m = await d.client.createSandbox({ image: 'merged-usr:1' });
      try {
        expect((await d.client.getSandbox(m.id)).defences!.readonly_paths.detail).toMatch(/read-write: \/root \/tmp$/);
        for (const a of ['rm /bin', 'ln -sfn /tmp /bin', 'mv /bin /tmp/bin', 'echo x > /usr/bin/x', 'echo x > /bin/x', 'cp /usr/bin/busybox /bin/sh', 'rm /lib && mkdir /lib']) {
          const r = await withNeighbour(() => sh(m.id, a));
          expect({ a, failed: r.exit_code !== 0 }).toEqual({ a, failed: true });
        }
        expect(out(await sh(m.id, 'readlink /bin; ls /usr/bin | grep -c "^x$"; echo ok > /tmp/t && cat /tmp/t'))).toBe('usr/bin\n0\nok\n');
      } finally {
        await d.client.deleteSandbox(m.id, { force: true });
      }
    });

    it('switched off (readonly_paths []): the same writes go through, so the tests above can fail', async () => {
      const off = await d.client.createSandbox({ image: 'busybox', filesystem: { readonly_paths: [] } });
      try {
        expect((await d.client.getSandbox(off.id)).defences!.readonly_paths).toEqual({ enforced: false, detail: expect.stringMatching(/off for this sandbox/) });
        // (busybox is running as this sh: it is replaced by a rename, as a package manager does.)
        const r = await sh(off.id, 'echo pwned > /bin/sh-copy && cp /bin/busybox /bin/bb.new && mv /bin/bb.new /bin/busybox && echo "evil::0:0::/:/bin/sh" >> /etc/passwd && echo /tmp/x.so > /etc/ld.so.preload && grep -c evil /etc/passwd');
        expect({ code: r.exit_code, out: out(r) }).toEqual({ code: 0, out: '1\n' });
      } finally {
        await d.client.deleteSandbox(off.id, { force: true });
      }
    });

    it('a file the runtime binds over the read-only /etc (as /etc/resolv.conf will be) is visible, and /etc stays read-only', async () => {
      // The sandbox's own spec, run once more by runc with one more bind appended (where
      // spec.ts puts every mount after the filesystem binds), and a shell instead of the agent.
      const spec = JSON.parse(readFileSync(path.join(d.root, 'sandboxes', sb, 'config.json'), 'utf8'));
      const id = `fsbind-${process.pid}`;
      const bundle = path.join(d.root, 'workers', id);
      mkdirSync(bundle, { recursive: true });
      const generated = path.join(tmp, 'generated.conf');
      writeFileSync(generated, 'nameserver 192.0.2.53\n');
      chmodSync(tmp, 0o755);
      spec.hostname = id;
      spec.linux.cgroupsPath = `${(await d.cgroups()).runtimePath(id)}`;
      spec.mounts.push({ destination: '/etc/dsec-generated.conf', type: 'bind', source: generated, options: ['rbind', 'ro'] });
      spec.process.args = ['/bin/sh', '-c', 'cat /etc/dsec-generated.conf; (echo x > /etc/passwd) 2>&1; (echo x > /etc/dsec-generated.conf) 2>&1; echo ok > /tmp/ok && cat /tmp/ok'];
      writeFileSync(path.join(bundle, 'config.json'), JSON.stringify(spec));
      const r = await execa('runc', ['--root', path.join(d.root, 'runtime', 'runc'), 'run', '--bundle', bundle, id], { reject: false, stdin: 'ignore' });
      rmSync(bundle, { recursive: true, force: true });
      expect({ code: r.exitCode, out: String(r.stdout) }).toEqual({
        code: 0,
        out: 'nameserver 192.0.2.53\n/bin/sh: can\'t create /etc/passwd: Read-only file system\n/bin/sh: can\'t create /etc/dsec-generated.conf: Read-only file system\nok',
      });
    });

    it('read-only paths off: an EROFS from the runtime\'s own mounts gets no read-only-path advice', async () => {
      const off = await d.client.createSandbox({ image: 'busybox', filesystem: { readonly_paths: [], landlock: false } });
      try {
        const mk = JSON.parse((await raw('POST', `/v1/sandboxes/${off.id}/files/mkdir`, JSON.stringify({ path: '/sys/dsec-x' }), 'application/json')).body).error;
        expect(mk).toEqual({ code: 'FailedPrecondition', message: 'mkdir /sys/dsec-x: Read-only file system' });
        const cp = await runCli(d, ['cp', path.join(tmp, 'upload.txt'), `${off.id}:/sys/dsec-y`]);
        expect(cp.code).not.toBe(0);
        expect(cp.stderr).toMatch(/Read-only file system/);
        expect(cp.stderr).not.toMatch(/--writable|--no-readonly|filesystem options/);
      } finally {
        await d.client.deleteSandbox(off.id, { force: true });
      }
    });

    it('the read-only mounts hold without Landlock too (landlock: false)', async () => {
      const noLl = await d.client.createSandbox({ image: 'busybox', filesystem: { landlock: false } });
      try {
        const r = await sh(noLl.id, 'echo pwned > /bin/sh');
        expect(err(r)).toMatch(/Read-only file system/);
        expect((await d.client.getSandbox(noLl.id)).defences!.landlock).toEqual({ enforced: false, detail: 'off for this sandbox (filesystem.landlock false)' });
      } finally {
        await d.client.deleteSandbox(noLl.id, { force: true });
      }
    });
  });

  describe('/proc, /sys and devices', () => {
    const probe = 'for f in /proc/sys/kernel/hostname /proc/sysrq-trigger /sys/kernel/uevent_helper /proc/self/comm /proc/self/oom_score_adj; do (echo 1 > $f) 2>/dev/null && echo "$f written"; done; stty -F /dev/null 2>&1; echo done';
    it('writes to /proc/sys, /sys and /proc/self/... and device ioctls are refused', async () => {
      const r = await withNeighbour(() => sh(sb, probe));
      expect(out(r)).toBe('stty: /dev/null: Permission denied\ndone\n');
      // What still works: /dev/null, terminals (a PTY exec's window size, test/unit/agent-landlock.test.ts), /dev/shm.
      expect(out(await sh(sb, 'echo x > /dev/null && echo y > /dev/shm/z && cat /dev/shm/z && head -c 4 /dev/urandom | wc -c'))).toBe('y\n4\n');
    });
    it('switched off (landlock: false): /proc/self/comm is written and the ioctl reaches the driver, so the test above can fail', async () => {
      const off = await d.client.createSandbox({ image: 'busybox', filesystem: { landlock: false } });
      try {
        // /proc/sys, /sysrq-trigger and /sys stay read-only mounts; the rest was Landlock's.
        expect(out(await sh(off.id, probe))).toBe('/proc/self/comm written\n/proc/self/oom_score_adj written\nstty: /dev/null: Inappropriate ioctl for device\ndone\n');
      } finally {
        await d.client.deleteSandbox(off.id, { force: true });
      }
    });
    it('fncall calls run under Landlock too (each call\'s namespace init), and only because of it', async () => {
      const call = (image: string) => postJson<ExecResult>(d, '/v1/run', { backend: 'fncall', image, argv: ['sh', '-c', 'echo x > /proc/self/comm && echo comm-written; echo y > /tmp/ok && cat /tmp/ok; (echo z > /etc/z) 2>&1 | grep -c Read-only'] });
      expect(out(await withNeighbour(() => call('busybox')))).toBe('y\n1\n');
      // An image whose security defaults turn Landlock off: the same call writes /proc/self/comm.
      const bb = await d.client.getImage('busybox');
      await d.client.composeImage({ image: 'busybox-nolandlock:1', layers: bb.layers, from: 'busybox', config: { security: { landlock: false } } });
      expect(out(await call('busybox-nolandlock:1'))).toBe('comm-written\ny\n1\n');
    });
  });

  describe('symlinks in upload paths', () => {
    beforeAll(async () => {
      // The host path of dsecd's state dir exists inside the sandbox only because the
      // attacker made it (in its own /tmp); through it, an upload can only land there.
      const links = `ln -s / /tmp/toroot && ln -s /proc/1/root /tmp/proc1 && ln -s ../../../../../../.. /tmp/dots && ln -s ${d.root} /tmp/hoststate && mkdir -p ${d.root} /tmp/${marker}-dir && ln -s /tmp/${marker}-dir/../../.. /root/weird`;
      expect((await sh(sb, links)).exit_code).toBe(0);
    });

    it('files API: through /, ../.., the host state dir: lands inside the sandbox; through /proc/1/root: refused', async () => {
      for (const [p, where] of [
        [`/tmp/toroot/tmp/${marker}-a`, `/tmp/${marker}-a`],
        [`/tmp/dots/tmp/${marker}-b`, `/tmp/${marker}-b`],
        [`/tmp/hoststate/${marker}-c`, `${d.root}/${marker}-c`],
        [`/root/weird/tmp/${marker}-d`, `/tmp/${marker}-d`],
      ] as const) {
        const r = await withNeighbour(() => raw('PUT', `/v1/sandboxes/${sb}/files?path=${encodeURIComponent(p)}&parents=true`, 'escaped?'));
        expect({ p, status: r.status }).toEqual({ p, status: 201 });
        // Inside the sandbox, at the path the sandbox's own root gives it.
        expect(out(await sh(sb, `cat ${where}`)), p).toBe('escaped?');
      }
      const magic = await raw('PUT', `/v1/sandboxes/${sb}/files?path=${encodeURIComponent(`/tmp/proc1/tmp/${marker}-e`)}`, 'escaped?');
      expect(magic.status).toBe(400);
      expect(JSON.parse(magic.body).error.message).toMatch(/magic link/);
      assertNothingOnHost();
    });

    it('tar: entries through the sandbox\'s symlinks, and a tar that brings its own symlink to /', async () => {
      const through = await tarOf([{ name: `toroot/tmp/${marker}-t1` }, { name: `hoststate/${marker}-t2` }]);
      const r1 = await withNeighbour(() => raw('PUT', `/v1/sandboxes/${sb}/archive?path=/tmp`, through, 'application/x-tar'));
      expect(r1.status).toBe(200);
      expect(out(await sh(sb, `cat /tmp/${marker}-t1 ${d.root}/${marker}-t2`))).toBe('xx');
      // /etc is read-only: the second entry is refused, and the first, which had landed
      // inside, is removed again with the refused archive.
      const refused = await tarOf([{ name: `toroot/tmp/${marker}-t1b` }, { name: `dots/etc/${marker}-t3` }]);
      expect((await raw('PUT', `/v1/sandboxes/${sb}/archive?path=/tmp`, refused, 'application/x-tar')).status).toBe(412);
      expect(out(await sh(sb, `ls /tmp/${marker}-t1b /etc/${marker}-t3 2>/dev/null; echo end`))).toBe('end\n');
      const own = await tarOf([{ name: 'up', type: 'symlink', linkname: '/' }, { name: `up/tmp/${marker}-t4` }, { name: 'host', type: 'symlink', linkname: d.root }, { name: `host/${marker}-t5` }]);
      const r2 = await raw('PUT', `/v1/sandboxes/${sb}/archive?path=/root`, own, 'application/x-tar');
      expect(r2.status).toBe(200);
      expect(out(await sh(sb, `cat /tmp/${marker}-t4 ${d.root}/${marker}-t5; readlink /root/up`))).toBe('xx/\n');
      const dots = await raw('PUT', `/v1/sandboxes/${sb}/archive?path=/root`, await tarOf([{ name: `../../tmp/${marker}-t6` }]), 'application/x-tar');
      expect(dots.status).toBe(400);
      assertNothingOnHost();
    });

    it('dsec cp through the same symlinks: inside the sandbox or refused, never on the host', async () => {
      const local = path.join(tmp, `${marker}-cp`);
      writeFileSync(local, 'cp data');
      for (const dst of [`/tmp/toroot/tmp/`, `/tmp/hoststate/`, `/tmp/dots/root/`]) {
        const r = await withNeighbour(() => runCli(d, ['cp', local, `${sb}:${dst}`]));
        expect(r.code, `${dst}: ${r.stderr}`).toBe(0);
      }
      expect((await runCli(d, ['cp', local, `${sb}:/tmp/proc1/tmp/`])).code).not.toBe(0);
      expect(out(await sh(sb, `cat /tmp/${marker}-cp ${d.root}/${marker}-cp /root/${marker}-cp`))).toBe('cp datacp datacp data');
      rmSync(local);
      assertNothingOnHost();
    });
  });

  describe('nothing of the host or the neighbour is visible', () => {
    it('another sandbox\'s files: not by path, not through /proc, not by the files API', async () => {
      const r = await withNeighbour(() => sh(sb, 'cat /root/own 2>&1; ls /proc/*/root/root/own 2>/dev/null; find / -name own -path "*/root/*" 2>/dev/null; ls /proc | grep -c "^[0-9]"'));
      expect(out(r)).not.toMatch(/neighbour data/);
      expect(Number(out(r).trim().split('\n').pop())).toBeLessThan(6);
      const viaApi = await raw('GET', `/v1/sandboxes/${sb}/files?path=${encodeURIComponent(`/proc/1/root/root/own`)}`);
      expect(viaApi.status).toBe(400);
      const neighbourUpper = path.join(d.root, 'sandboxes', neighbour, 'upper', 'root', 'own');
      expect(out(await sh(sb, `cat ${neighbourUpper} 2>&1; ls ${path.join(d.root, 'sandboxes')} 2>&1`))).toMatch(/No such file or directory\n.*No such file or directory\n$/);
    });

    it('host sockets, the daemon socket, host logs, the host root through /proc/1/root', async () => {
      const r = await withNeighbour(() => sh(sb, [
        'echo "socks=$(find / /proc/1/root/ \\( -path /sys -o -path "/proc/[0-9]*" -o -path /proc/1/root/proc -o -path /proc/1/root/sys \\) -prune -o -name "*.sock" -print 2>/dev/null | wc -l)"',
        `echo "daemon=$(test -e ${d.socket} && echo visible || echo absent)"`,
        'echo "log=$(ls /var/log 2>&1)"',
        'echo "init-root=$(ls /proc/1/root/ 2>&1)"',
        'echo "host=$(hostname)"',
      ].join('; ')));
      expect(out(r).split('\n')).toEqual([
        'socks=0',
        'daemon=absent',
        'log=ls: /var/log: No such file or directory',
        // /proc/1 is the sandbox's own init, the agent, which is not dumpable: its root is not even readable.
        'init-root=ls: /proc/1/root/: Permission denied',
        `host=${sb}`,
        '',
      ]);
    });
  });
});
