// `dsec cp`: which side is in the sandbox (and `-`), and the docker-cp semantics of each
// direction, in-process against the fake dsecd whose files/archive endpoints serve a
// small in-memory "sandbox" (paths → files and dirs) and record what was uploaded.
import { chmodSync, existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, realpathSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import type http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import * as tar from 'tar';
import tarStream from 'tar-stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { parseCpArgs, parseCpEndpoint, wantsContents } from '../../cli/util/cp.js';
import { kernelBeneathCheck, makeSymlinks, relativeTarget, resolveInside, TreeView } from '../../cli/util/extract.js';
import { linkLeads, throughArchiveLink } from '../../daemon/api/routes/files.js';
import { hintFor } from '../../cli/util/errors.js';
import { json, runCli, startFakeDsecd, type FakeDsecd, type Ran, type Seen } from '../fixtures/fake-dsecd.js';

describe('cp arguments', () => {
  it('tells the sandbox side, the local side and `-` apart, docker style', () => {
    expect(parseCpEndpoint('abc123:/etc/hosts')).toEqual({ kind: 'sandbox', id: 'abc123', path: '/etc/hosts' });
    expect(parseCpEndpoint('abc123:/')).toEqual({ kind: 'sandbox', id: 'abc123', path: '/' });
    expect(parseCpEndpoint('-')).toEqual({ kind: 'stdio' });
    expect(parseCpEndpoint('file.txt')).toEqual({ kind: 'local', path: 'file.txt' });
    expect(parseCpEndpoint('./a:b')).toEqual({ kind: 'local', path: './a:b' });
    expect(parseCpEndpoint('/tmp/a:b')).toEqual({ kind: 'local', path: '/tmp/a:b' });
    expect(parseCpEndpoint('dir/a:b')).toEqual({ kind: 'local', path: 'dir/a:b' });
    expect(() => parseCpEndpoint('abc:etc/hosts')).toThrow(/must be absolute/);
    expect(() => parseCpEndpoint('')).toThrow(/empty path/);
  });

  it('needs exactly one sandbox side; `-` pairs only with a sandbox', () => {
    expect(parseCpArgs('./x', 'sb:/tmp')).toMatchObject({ direction: 'in', src: { kind: 'local' }, dst: { id: 'sb' } });
    expect(parseCpArgs('-', 'sb:/tmp')).toMatchObject({ direction: 'in', src: { kind: 'stdio' } });
    expect(parseCpArgs('sb:/etc', '-')).toMatchObject({ direction: 'out', dst: { kind: 'stdio' } });
    expect(parseCpArgs('sb:/etc', 'out')).toMatchObject({ direction: 'out', dst: { kind: 'local', path: 'out' } });
    expect(() => parseCpArgs('a', 'b')).toThrow(/one side of cp must be in a sandbox/);
    expect(() => parseCpArgs('-', '-')).toThrow(/one side of cp must be in a sandbox/);
    expect(() => parseCpArgs('-', 'local')).toThrow(/one side/);
    expect(() => parseCpArgs('a:/x', 'b:/y')).toThrow(/between two sandboxes/);
    expect(wantsContents('dir/.')).toBe(true);
    expect(wantsContents('dir')).toBe(false);
  });
});

describe('dsec cp', () => {
  let fake: FakeDsecd;
  let dir: string;
  /** The fake sandbox's file system: path → file bytes and mode, or a directory. */
  let fs: Map<string, { type: 'file'; data: Buffer; mode: number } | { type: 'dir' } | { type: 'symlink'; target: string }>;
  /** Members of each PUT archive, in order. */
  let archives: { dir: string; entries: { path: string; type: string; size: number; body: string }[] }[];
  const ID = 'sb1';

  const dsec = (args: string[], opts: { stdin?: Readable; stderrTTY?: boolean } = {}): Promise<Ran> =>
    runCli(args, { socket: fake.socketPath, stdin: opts.stdin, stderrTTY: opts.stderrTTY, stderrColumns: 100 });

  /** A tar of the fake sandbox's `p` (docker cp naming: members under its base name), built from a temp copy. */
  async function archiveOf(p: string): Promise<Buffer> {
    const stage = mkdtempSync(join(dir, 'stage-'));
    const base = p.split('/').filter(Boolean).pop()!;
    for (const [path, node] of fs) {
      if (path !== p && !path.startsWith(p + '/')) continue;
      const rel = join(stage, base, path.slice(p.length));
      if (node.type === 'dir') mkdirSync(rel, { recursive: true });
      else if (node.type === 'file') {
        mkdirSync(join(rel, '..'), { recursive: true });
        writeFileSync(rel, node.data);
        chmodSync(rel, node.mode);
      }
    }
    const chunks: Buffer[] = [];
    for await (const c of tar.c({ cwd: stage }, [base]) as unknown as AsyncIterable<Buffer>) chunks.push(Buffer.from(c));
    return Buffer.concat(chunks);
  }

  /** Members of a tar held in memory. */
  async function members(body: Buffer): Promise<{ path: string; type: string; size: number; body: string }[]> {
    const out: { path: string; type: string; size: number; body: string }[] = [];
    await new Promise<void>((resolve, reject) => {
      const p = new tar.Parser({
        onReadEntry: (e) => {
          const parts: Buffer[] = [];
          e.on('data', (c: Buffer) => parts.push(c));
          e.on('end', () => out.push({ path: e.path, type: e.type, size: e.size, body: Buffer.concat(parts).toString() }));
        },
      });
      p.on('end', () => resolve());
      p.on('error', reject);
      p.end(body);
    });
    return out;
  }

  beforeEach(async () => {
    fake = await startFakeDsecd();
    dir = mkdtempSync(join(tmpdir(), 'dsec-cp-'));
    fs = new Map();
    fs.set('/', { type: 'dir' });
    fs.set('/work', { type: 'dir' });
    fs.set('/etc', { type: 'dir' });
    fs.set('/etc/hosts', { type: 'file', data: Buffer.from('127.0.0.1 localhost\n'), mode: 0o644 });
    fs.set('/srv', { type: 'dir' });
    fs.set('/srv/app', { type: 'dir' });
    fs.set('/srv/app/run.sh', { type: 'file', data: Buffer.from('#!/bin/sh\necho hi\n'), mode: 0o4755 });
    fs.set('/srv/app/lib', { type: 'dir' });
    fs.set('/srv/app/lib/x.txt', { type: 'file', data: Buffer.from('x'), mode: 0o600 });
    fs.set('/srv/link', { type: 'symlink', target: '/srv/app/run.sh' });
    archives = [];
    const notFound = (res: http.ServerResponse, p: string) => json(res, 404, { error: { code: 'NotFound', message: `no such file or directory: ${p}` } });
    fake.routes['GET /v1/sandboxes/:id/files/stat'] = (req, res) => {
      const p = req.query.get('path')!.replace(/(.)\/+$/, '$1');
      let n = fs.get(p);
      // dsecd follows a final symlink unless nofollow (the fake: absolute targets only).
      if (n?.type === 'symlink' && req.query.get('nofollow') !== 'true') n = fs.get(n.target);
      if (!n) return notFound(res, p);
      json(res, 200, { path: p, type: n.type, size: n.type === 'file' ? n.data.length : 0, mode: n.type === 'file' ? n.mode : 0o755, uid: 0, gid: 0, mtime_ms: 1, ...(n.type === 'symlink' ? { target: n.target } : {}) });
    };
    fake.routes['GET /v1/sandboxes/:id/files'] = (req, res) => {
      let n = fs.get(req.query.get('path')!);
      if (n?.type === 'symlink') n = fs.get(n.target);
      if (!n || n.type !== 'file') return notFound(res, req.query.get('path')!);
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      res.end(n.data);
    };
    fake.routes['PUT /v1/sandboxes/:id/files'] = (req, res) => {
      const p = req.query.get('path')!;
      fs.set(p, { type: 'file', data: req.raw, mode: parseInt(req.query.get('mode') ?? '644', 8) });
      json(res, 201, { path: p, bytes: req.raw.length });
    };
    fake.routes['GET /v1/sandboxes/:id/archive'] = async (req, res) => {
      const p = req.query.get('path')!;
      if (!fs.has(p)) return notFound(res, p);
      const body = await archiveOf(p);
      res.writeHead(200, { 'content-type': 'application/x-tar' });
      res.end(body);
    };
    fake.routes['PUT /v1/sandboxes/:id/archive'] = async (req, res) => {
      const d = req.query.get('path')!;
      if (fs.get(d)?.type !== 'dir') return notFound(res, d);
      const entries = await members(req.raw);
      archives.push({ dir: d, entries });
      json(res, 200, { entries: entries.length, bytes: entries.reduce((n, e) => n + e.size, 0) });
    };
  });

  afterEach(async () => {
    await fake.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const puts = () => fake.seen.filter((s: Seen) => s.method === 'PUT');

  it('a local file into an existing directory lands under its own name, with its mode and parents=true', async () => {
    const f = join(dir, 'model.bin');
    writeFileSync(f, Buffer.alloc(300_000, 7));
    chmodSync(f, 0o640);
    const r = await dsec(['cp', f, `${ID}:/work`]);
    expect(r.code).toBe(0);
    expect(r.out).toBe('');
    expect(r.err).toBe('');
    const put = puts()[0];
    expect(put.path).toBe(`/v1/sandboxes/${ID}/files`);
    expect(Object.fromEntries(put.query)).toEqual({ path: '/work/model.bin', mode: '0640', parents: 'true' });
    expect(put.headers['transfer-encoding']).toBe('chunked'); // streamed, not buffered
    expect(put.raw.equals(Buffer.alloc(300_000, 7))).toBe(true);
  });

  it('a local file onto a missing path becomes that path; --user is passed; --json reports bytes', async () => {
    const f = join(dir, 'a.txt');
    writeFileSync(f, 'hello');
    const r = await dsec(['--json', 'cp', '--user', 'app', f, `${ID}:/work/new/name.txt`]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out)).toEqual({ source: f, destination: `${ID}:/work/new/name.txt`, bytes: 5 });
    expect(puts()[0].query.get('path')).toBe('/work/new/name.txt');
    expect(fake.seen.every((s) => s.query.get('user') === 'app')).toBe(true);
  });

  it('a local directory: into an existing directory (DIR/...), onto a missing path (renamed), or its contents with DIR/.', async () => {
    const d = join(dir, 'proj');
    mkdirSync(join(d, 'src'), { recursive: true });
    writeFileSync(join(d, 'README'), 'readme');
    writeFileSync(join(d, 'src', 'main.c'), 'int main(){}');
    expect((await dsec(['cp', d, `${ID}:/work`])).code).toBe(0);
    expect(archives[0].dir).toBe('/work');
    expect(archives[0].entries.map((e) => e.path).sort()).toEqual(['proj/', 'proj/README', 'proj/src/', 'proj/src/main.c']);
    expect(archives[0].entries.find((e) => e.path === 'proj/src/main.c')!.body).toBe('int main(){}');

    expect((await dsec(['cp', d, `${ID}:/work/renamed`])).code).toBe(0);
    expect(archives[1].dir).toBe('/work');
    expect(archives[1].entries.map((e) => e.path).sort()).toEqual(['renamed/', 'renamed/README', 'renamed/src/', 'renamed/src/main.c']);

    expect((await dsec(['cp', d + '/.', `${ID}:/work`])).code).toBe(0);
    expect(archives[2].entries.map((e) => e.path).sort()).toEqual(['README', 'src/', 'src/main.c']);

    const onFile = await dsec(['cp', d, `${ID}:/etc/hosts`]);
    expect(onFile.code).toBe(125);
    expect(onFile.err).toMatch(/^dsec: cannot copy directory .* onto sb1:\/etc\/hosts, which is not a directory/);
  });

  it('a sandbox file to a local file or into a local directory, permission bits only', async () => {
    const out = join(dir, 'hosts.copy');
    expect((await dsec(['cp', `${ID}:/etc/hosts`, out])).code).toBe(0);
    expect(readFileSync(out, 'utf8')).toBe('127.0.0.1 localhost\n');
    expect((await dsec(['cp', `${ID}:/srv/app/run.sh`, dir])).code).toBe(0);
    expect(readFileSync(join(dir, 'run.sh'), 'utf8')).toBe('#!/bin/sh\necho hi\n');
    expect(statSync(join(dir, 'run.sh')).mode & 0o7777).toBe(0o755); // setuid dropped
  });

  it('a sandbox directory: into an existing local directory, or becoming a missing one; setuid dropped', async () => {
    expect((await dsec(['cp', `${ID}:/srv/app`, dir])).code).toBe(0);
    expect(readdirSync(join(dir, 'app')).sort()).toEqual(['lib', 'run.sh']);
    expect(readFileSync(join(dir, 'app', 'lib', 'x.txt'), 'utf8')).toBe('x');
    expect(statSync(join(dir, 'app', 'run.sh')).mode & 0o7777).toBe(0o755);

    const fresh = join(dir, 'fresh');
    expect((await dsec(['cp', `${ID}:/srv/app`, fresh])).code).toBe(0);
    expect(readdirSync(fresh).sort()).toEqual(['lib', 'run.sh']);

    const gone = await dsec(['cp', `${ID}:/srv/app`, join(dir, 'no', 'such')]);
    expect(gone.code).toBe(125);
    expect(gone.err).toMatch(/no such file or directory/);
  });

  it('a sandbox symlink is copied as a symlink: an absolute target inside its directory becomes relative; -L copies the file', async () => {
    expect((await dsec(['cp', `${ID}:/srv/link`, join(dir, 'l')])).code).toBe(0);
    expect(readlinkSync(join(dir, 'l'))).toBe('app/run.sh');
    expect(fake.seen.find((s) => s.path.endsWith('/files/stat'))!.query.get('nofollow')).toBe('true');
    const followed = await dsec(['cp', '-L', `${ID}:/srv/link`, join(dir, 'f')]);
    expect(followed.code, followed.err).toBe(0);
    expect(lstatSync(join(dir, 'f')).isFile()).toBe(true);
    expect(readFileSync(join(dir, 'f'), 'utf8')).toBe('#!/bin/sh\necho hi\n');
  });

  it('a local symlink named as the source is uploaded as a symlink (a one-entry archive), under its name or the new one; -L uploads the file', async () => {
    const target = join(dir, 'real.txt');
    writeFileSync(target, 'real');
    const link = join(dir, 'link');
    symlinkSync('../somewhere/real.txt', link);
    expect((await dsec(['cp', link, `${ID}:/work`])).code).toBe(0);
    expect(archives[0]).toEqual({ dir: '/work', entries: [{ path: 'link', type: 'SymbolicLink', size: 0, body: '' }] });
    expect(fake.seen.some((s) => s.method === 'PUT' && s.path.endsWith('/files'))).toBe(false);
    const linkpath = await new Promise<string>((resolve) => {
      new tar.Parser({ onReadEntry: (e) => resolve(String(e.linkpath)) }).end(puts()[0].raw);
    });
    expect(linkpath).toBe('../somewhere/real.txt');
    expect((await dsec(['cp', link, `${ID}:/work/renamed`])).code).toBe(0);
    expect(archives[1]).toMatchObject({ dir: '/work', entries: [{ path: 'renamed', type: 'SymbolicLink' }] });

    const abs = join(dir, 'abs');
    symlinkSync(target, abs);
    const r = await dsec(['cp', '--follow-link', abs, `${ID}:/work`]);
    expect(r.code, r.err).toBe(0);
    expect(fs.get('/work/abs')).toMatchObject({ type: 'file', data: Buffer.from('real') });
    expect(archives).toHaveLength(2);
  });

  it('-L on a local symlink to a directory uploads the directory under the link\'s name, its own links kept as links', async () => {
    const real = join(dir, 'release-7');
    mkdirSync(join(real, 'bin'), { recursive: true });
    writeFileSync(join(real, 'bin', 'tool'), 'tool');
    symlinkSync('bin/tool', join(real, 'tool-link'));
    const current = join(dir, 'current');
    symlinkSync('release-7', current);
    const r = await dsec(['cp', '-L', current, `${ID}:/work`]);
    expect(r.code, r.err).toBe(0);
    expect(archives[0].dir).toBe('/work');
    expect(archives[0].entries.map((e) => `${e.path} ${e.type}`).sort()).toEqual(['current/ Directory', 'current/bin/ Directory', 'current/bin/tool File', 'current/tool-link SymbolicLink']);
    // Onto a missing path: the directory under the new name.
    expect((await dsec(['cp', '-L', current, `${ID}:/work/app`])).code).toBe(0);
    expect(archives[1].entries.map((e) => `${e.path} ${e.type}`).sort()).toEqual(['app/ Directory', 'app/bin/ Directory', 'app/bin/tool File', 'app/tool-link SymbolicLink']);
    // Without -L: the link itself.
    expect((await dsec(['cp', current, `${ID}:/work`])).code).toBe(0);
    expect(archives[2].entries).toEqual([{ path: 'current', type: 'SymbolicLink', size: 0, body: '' }]);
  });

  it('names and link targets the sandbox chose reach our stderr with their control characters escaped: no terminal escapes, no forged lines', async () => {
    // (No C1 character in the archive: tar-stream writes a non-ASCII name as a pax record,
    // which node-tar splits at the newline; the lone link below has one.)
    const evil = '\x1b]0;owned\x07\x1b[2J\x7f\ndsec: all good';
    const shown = '\\x1b]0;owned\\x07\\x1b[2J\\x7f\\x0adsec: all good';
    fake.routes['GET /v1/sandboxes/:id/archive'] = async (_req, res) => {
      const pack = tarStream.pack();
      pack.entry({ name: 'app', type: 'directory', mode: 0o755 });
      pack.entry({ name: 'app/ok', type: 'file', mode: 0o644 }, 'ok');
      pack.entry({ name: `app/${evil}`, type: 'symlink', linkname: `/etc/${evil}`, mode: 0o777 });
      pack.finalize();
      const chunks: Buffer[] = [];
      for await (const c of pack) chunks.push(c as Buffer);
      res.writeHead(200, { 'content-type': 'application/x-tar' });
      res.end(Buffer.concat(chunks));
    };
    const r = await dsec(['cp', `${ID}:/srv/app`, join(dir, 'out')]);
    expect(r.code).toBe(125);
    expect(r.err).toContain(`dsec: warning: refused app/${shown}: a symlink to the absolute path /etc/${shown}, outside`);
    expect(r.err).not.toMatch(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/);
    expect(r.err.split('\n').filter((l) => l.startsWith('dsec: all good'))).toEqual([]);
    expect(readFileSync(join(dir, 'out', 'ok'), 'utf8')).toBe('ok');

    // A lone symlink copied by name: its refusal is an error message, escaped the same way.
    fs.set('/srv/evil', { type: 'symlink', target: `/etc/${evil}\u009b31m` });
    const lone = await dsec(['cp', `${ID}:/srv/evil`, join(dir, 'lone')]);
    expect(lone.code).toBe(125);
    expect(lone.err).toContain(`a symlink to the absolute path /etc/${shown}\\u009b31m`);
    expect(lone.err).not.toMatch(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/);
    expect(lone.err.split('\n').filter((l) => l.startsWith('dsec: all good'))).toEqual([]);
  });

  /** A tar of `app/` holding the files `names` (each's body its name), in memory. */
  async function appTar(names: string[]): Promise<Buffer> {
    const pack = tarStream.pack();
    pack.entry({ name: 'app', type: 'directory', mode: 0o755 });
    for (const n of names) pack.entry({ name: `app/${n}`, type: 'file', mode: 0o644 }, n);
    pack.finalize();
    const chunks: Buffer[] = [];
    for await (const c of pack) chunks.push(c as Buffer);
    return Buffer.concat(chunks);
  }

  it('an entry that cannot be copied as it is (a corrupt header) fails the copy: named as an error, the rest written, exit 125', async () => {
    const body = await appTar(['a', 'b', 'c']);
    // Headers at 0 (app/), 512 (app/a), 1536 (app/b): break app/b's checksum.
    expect(body.subarray(1536, 1541).toString()).toBe('app/b');
    body[1536 + 148] ^= 0x01;
    fake.routes['GET /v1/sandboxes/:id/archive'] = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-tar' });
      res.end(body);
    };
    const r = await dsec(['cp', `${ID}:/srv/app`, join(dir, 'out')]);
    expect(r.code).toBe(125);
    expect(r.err).toMatch(/^dsec: error: could not copy .*TAR_ENTRY_INVALID/m);
    // (The broken header, then its body block read as one: two.)
    expect(r.err).toMatch(/^dsec: \d+ entries could not be copied \(above\); .*out is incomplete\nhint: /m);
    expect(readFileSync(join(dir, 'out', 'a'), 'utf8')).toBe('a');
    expect(readFileSync(join(dir, 'out', 'c'), 'utf8')).toBe('c');
  });

  it('an archive dsecd breaks off midway is an error saying so (not a bug report), for a directory and for `-`', async () => {
    const body = await appTar(['a', 'b']);
    fake.routes['GET /v1/sandboxes/:id/archive'] = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-tar' });
      res.write(body.subarray(0, 1024));
      setTimeout(() => res.destroy(), 50);
    };
    for (const to of [join(dir, 'out'), '-']) {
      const r = await dsec(['cp', `${ID}:/srv/app`, to]);
      expect(r.code, to).toBe(125);
      expect(r.err).toMatch(new RegExp(`^dsec: dsecd broke off the archive of sb1:/srv/app midway; what arrived before is in ${to === '-' ? 'stdout' : '.*out'}, the rest is missing\nhint: dsecd could not read something below it`));
      expect(r.err).not.toMatch(/internal error/);
    }
    // A single file whose read fails after the answer began: the same, and no partial file.
    fake.routes['GET /v1/sandboxes/:id/files'] = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      res.write('12345');
      setTimeout(() => res.destroy(), 50);
    };
    const one = await dsec(['cp', `${ID}:/etc/hosts`, join(dir, 'hosts')]);
    expect(one.code).toBe(125);
    expect(one.err).toMatch(/^dsec: dsecd broke off the read of sb1:\/etc\/hosts midway; nothing was kept at .*hosts\nhint: dsecd could not read it: /);
    expect(existsSync(join(dir, 'hosts'))).toBe(false);
  });

  it('`-` streams a tar: stdin into a sandbox directory; a sandbox path to stdout', async () => {
    const tarBody = await archiveOf('/srv/app');
    const r = await dsec(['cp', '-', `${ID}:/work`], { stdin: Readable.from([tarBody.subarray(0, 1000), tarBody.subarray(1000)]) });
    expect(r.code).toBe(0);
    expect(archives[0].dir).toBe('/work');
    expect(archives[0].entries.map((e) => e.path).sort()).toEqual(['app/', 'app/lib/', 'app/lib/x.txt', 'app/run.sh']);

    const o = await dsec(['cp', `${ID}:/srv/app`, '-']);
    expect(o.code).toBe(0);
    expect((await members(o.outBuf)).map((e) => e.path).sort()).toEqual(['app/', 'app/lib/', 'app/lib/x.txt', 'app/run.sh']);

    const notDir = await dsec(['cp', '-', `${ID}:/etc/hosts`], { stdin: Readable.from([tarBody]) });
    expect(notDir.code).toBe(125);
    expect(notDir.err).toMatch(/is not an existing directory/);
    expect((await dsec(['--json', 'cp', `${ID}:/etc`, '-'])).code).toBe(125);
  });

  it('user errors: missing local source, missing sandbox path (NotFound hint), no sandbox side; no stack', async () => {
    const missing = await dsec(['cp', join(dir, 'nope'), `${ID}:/work`]);
    expect(missing.code).toBe(125);
    expect(missing.err).toMatch(/^dsec: .*nope: no such file or directory\nhint: check the local path\n$/);
    const remote = await dsec(['cp', `${ID}:/nope`, dir]);
    expect(remote.code).toBe(125);
    expect(remote.err).toBe('dsec: no such file or directory: /nope (NotFound)\nhint: check the path inside the sandbox (`dsec exec ID -- ls -la DIR`); `dsec ls` lists sandboxes\n');
    const both = await dsec(['cp', 'a', 'b']);
    expect(both.code).toBe(125);
    expect(both.err).toMatch(/^dsec: one side of cp must be in a sandbox/);
    for (const r of [missing, remote, both]) expect(r.err).not.toMatch(/^\s+at /m);
    expect(existsSync(join(dir, 'nope'))).toBe(false);
  });

  it('on a terminal stderr: a progress line, then the summary', async () => {
    const f = join(dir, 'big');
    writeFileSync(f, Buffer.alloc(2 * 1024 * 1024));
    const r = await dsec(['cp', f, `${ID}:/work`], { stderrTTY: true });
    expect(r.code).toBe(0);
    expect(r.err).toMatch(/Successfully copied 2MiB to sb1:\/work\n$/);
    const q = await dsec(['cp', '-q', f, `${ID}:/work`], { stderrTTY: true });
    expect(q.err).toBe('');
  });
});

describe('links on the host resolve inside the destination (cli/util/extract.ts)', () => {
  let dir: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-links-'));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('resolveInside follows links as the kernel does, treats a missing directory as one that may appear, and counts at most 40 links', () => {
    mkdirSync(join(dir, 'sub/deep'), { recursive: true });
    writeFileSync(join(dir, 'file'), 'f');
    symlinkSync('.', join(dir, 'x'));
    symlinkSync('sub/deep', join(dir, 'd'));
    const overlay = new Map([['up', 'x/x/../..'], ['loop', 'loop'], ['viaup', 'up/etc']]);
    const v = new TreeView(dir, overlay);
    const at = (from: string[], t: string) => resolveInside(v, from, t);
    expect(at([], 'x/x/x/sub')).toEqual({ inside: true });
    // Lexically `x/x/../..` is `.`; through x -> . it climbs out.
    expect(at([], 'x/x/../..')).toEqual({ inside: false, why: 'climbs above the destination' });
    expect(at([], 'd/../..')).toEqual({ inside: true }); // d -> sub/deep: ../.. is the root again
    expect(at([], 'd/../../..')).toMatchObject({ inside: false });
    expect(at([], 'viaup')).toMatchObject({ inside: false }); // a link to a link that climbs out
    expect(at([], 'missing/../..')).toMatchObject({ inside: false });
    expect(at(['sub'], 'missing/../..')).toEqual({ inside: true });
    expect(at([], 'file/../..')).toEqual({ inside: true }); // ENOTDIR: resolves to nothing
    expect(at([], 'loop')).toEqual({ inside: false, why: 'passes through more than 40 symlinks' });
    expect(at([], '/etc')).toEqual({ inside: false, why: 'names the host path /etc' });
    expect(at([], `${realpathSync.native(dir)}/sub`)).toEqual({ inside: true });
  });

  it("relativeTarget: an absolute target inside the copied sandbox directory, from the link's own directory", () => {
    const o = { sandboxDir: '/work/out', localDir: '' };
    expect(relativeTarget('a/b/l', '/work/out/c/f', o)).toBe('../../c/f');
    expect(relativeTarget('l', '/work/out', o)).toBe('.');
    expect(relativeTarget('l', '/work/out/../etc', o)).toBe('../etc'); // kept as written: the resolver refuses it
    expect(relativeTarget('l', '/work/outside', o)).toBeNull();
    expect(relativeTarget('l', '/etc/passwd', o)).toBeNull();
    expect(relativeTarget('out/a/l', '/work/out/b', { sandboxDir: '/work/out', localDir: 'out' })).toBe('../b');
    expect(relativeTarget('bin/sh', '/usr/bin/busybox', { sandboxDir: '/', localDir: '' })).toBe('../usr/bin/busybox');
  });

  it('the kernel guard (openat2 RESOLVE_BENEATH): removes a link the portable check lets through when the kernel says it leaves', () => {
    const check = kernelBeneathCheck();
    if (!check) return; // not Linux, or no addon: nothing to check (the portable rule stands alone)
    symlinkSync('..', join(dir, 'up'));
    expect(check(dir, 'up')).toBe('EXDEV');
    expect(check(dir, 'nope')).toBe('ENOENT');
    // A link of the user's own with an absolute target inside the destination: the
    // portable check follows it and stays inside; RESOLVE_BENEATH refuses every absolute link.
    mkdirSync(join(dir, 'sub'));
    symlinkSync(join(realpathSync.native(dir), 'sub'), join(dir, 'mine'));
    const refused: string[] = [];
    const made = makeSymlinks(dir, [{ rel: 'l', target: 'mine', member: 'd/l' }, { rel: 'ok', target: 'sub', member: 'd/ok' }], (m, why) => refused.push(`${m}: ${why}`), undefined, check);
    expect(made).toEqual(['ok']);
    expect(refused).toEqual(['d/l: a symlink to "mine", which resolves outside the destination (openat2 RESOLVE_BENEATH) (removed again)']);
    expect(existsSync(join(dir, 'l'))).toBe(false);
    // Without the guard (a laptop), the portable rule alone keeps it: it does resolve inside.
    expect(makeSymlinks(dir, [{ rel: 'l', target: 'mine', member: 'd/l' }], () => {}, undefined, null)).toEqual(['l']);
  });
});

describe('a tar upload that goes through its own symlink (daemon/api/routes/files.ts)', () => {
  it('says which entry, which link, where it leads and what failed; not when the link stays below the destination', () => {
    expect(linkLeads('/root/up', '../../../..')).toEqual({ to: '/', aboveRoot: true });
    expect(linkLeads('/root/a/l', '../../etc')).toEqual({ to: '/etc', aboveRoot: false });
    expect(linkLeads('/root/l', '/tmp/x')).toEqual({ to: '/tmp/x', aboveRoot: false });
    const e = throughArchiveLink('up/f', '/root', 'up', '../../../..', new Error('write /root/up/f: Read-only file system'))!;
    expect(e).toMatchObject({ kind: 'FailedPrecondition', reason: 'archive_link' });
    expect(e.message).toBe('archive entry "up/f" was refused: it goes through /root/up, a symlink this archive made (-> ../../../..), which leaves the sandbox\'s root (its ".." climb above /, so the sandbox resolves it to /); writing there failed: write /root/up/f: Read-only file system');
    expect(throughArchiveLink('l/f', '/root', 'l', '/etc', new Error('x'))!.message).toMatch(/which leads out of \/root to \/etc; writing there failed: x$/);
    expect(throughArchiveLink('l/f', '/root', 'l', 'sub', new Error('x'))).toBeNull();
    expect(hintFor('FailedPrecondition', 'cp', { reason: 'archive_link' })).toMatch(/a symlink in the archive leads the entries below it out of the destination/);
    // A write into a sandbox at its quota: its own disk, not the host's capacity.
    expect(hintFor('ResourceExhausted', 'cp')).toMatch(/^the sandbox's disk is full \(its --disk quota/);
  });
});
