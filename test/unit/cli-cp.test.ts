// `dsec cp`: which side is in the sandbox (and `-`), and the docker-cp semantics of each
// direction, in-process against the fake dsecd whose files/archive endpoints serve a
// small in-memory "sandbox" (paths → files and dirs) and record what was uploaded.
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, statSync, writeFileSync } from 'node:fs';
import type http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import * as tar from 'tar';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { parseCpArgs, parseCpEndpoint, wantsContents } from '../../cli/util/cp.js';
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
      const n = fs.get(p);
      if (!n) return notFound(res, p);
      json(res, 200, { path: p, type: n.type, size: n.type === 'file' ? n.data.length : 0, mode: n.type === 'file' ? n.mode : 0o755, uid: 0, gid: 0, mtime_ms: 1, ...(n.type === 'symlink' ? { target: n.target } : {}) });
    };
    fake.routes['GET /v1/sandboxes/:id/files'] = (req, res) => {
      const n = fs.get(req.query.get('path')!);
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

  it('a sandbox symlink is copied as a symlink', async () => {
    expect((await dsec(['cp', `${ID}:/srv/link`, join(dir, 'l')])).code).toBe(0);
    expect(readlinkSync(join(dir, 'l'))).toBe('/srv/app/run.sh');
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
