import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { gzipSync } from 'node:zlib';
import * as tar from 'tar';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { CommitResult, Image, Layer, PruneResult } from '../../sdk/index.js';
import { Interrupts, fail, json, ndjson, ok, runCli, startFakeDsecd, type FakeDsecd, type Ran, type Route, type Seen } from '../fixtures/fake-dsecd.js';

// The image, layer and commit verbs of the CLI, run in-process against the fake dsecd
// (test/fixtures/fake-dsecd.ts).

let fake: FakeDsecd;
let routes: Record<string, Route>;
let seen: Seen[];
let interrupts: Interrupts;

beforeEach(async () => {
  fake = await startFakeDsecd();
  ({ routes, seen } = fake);
  interrupts = new Interrupts();
});

afterEach(async () => {
  await fake.close();
});

interface Opts {
  tty?: boolean;
  columns?: number;
  socket?: string;
}

/** Runs `dsec --socket <fake> ...args` in-process; `tty` pretends stderr is a terminal. */
function dsec(args: string[], opts: Opts = {}): Promise<Ran> {
  return runCli(args, { socket: opts.socket ?? fake.socketPath, stderrTTY: opts.tty, stderrColumns: opts.columns, interrupts });
}

/** A path inside the fake's temp directory (removed after each test). */
const tmp = (...p: string[]) => join(fake.dir, ...p);

const HEX_A = '0123456789ab' + 'a'.repeat(52);
const HEX_B = '0123456789cd' + 'b'.repeat(52);
const HEX_C = 'fedcba987654' + 'c'.repeat(52);
const STACK = /^\s+at /m;
const CLEAR = '\r\x1b[2K';

const image = (over: Partial<Image> = {}): Image => ({
  ref: 'team/py:1',
  name: 'team/py',
  tag: '1',
  tenant: 'team-a',
  layers: [`sha256:${HEX_A}`, `sha256:${HEX_B}`],
  config: { env: ['PATH=/usr/bin:/bin', 'LANG=C.UTF-8'], cwd: '/', user: '0', cmd: ['/bin/sh'] },
  size_bytes: 3 * 1024 ** 2,
  created_at: Date.now() - 2 * 3600_000 - 1000,
  ...over,
});

const layer = (over: Partial<Layer> = {}): Layer => ({
  digest: `sha256:${HEX_A}`,
  size_bytes: 1536 * 1024,
  created_at: Date.now() - 3 * 86400_000 - 1000,
  source: 'dir:/srv/py',
  builder: 'host1/default',
  images: ['team/py:1', 'team/py:latest'],
  sandboxes: 2,
  ...over,
});

const LAYERS = [layer(), layer({ digest: `sha256:${HEX_B}`, images: [], sandboxes: 0, source: 'commit:0123456789abcdef', size_bytes: 100 }), layer({ digest: `sha256:${HEX_C}` })];

/** A route streaming progress then the result image. */
const stream = (result: Image, progress: unknown[] = [], chunk = 7): Route => ndjson([...progress, { type: 'result', result }], { chunk });

describe('image ls / images', () => {
  it('prints REF, TENANT, LAYERS, SIZE, CREATED; `images` is the same; --json prints {images}', async () => {
    routes['GET /v1/images'] = ok({ images: [image(), image({ ref: 'busybox:latest', name: 'busybox', tag: 'latest', tenant: 'system', layers: [`sha256:${HEX_C}`], size_bytes: 900 * 1024, created_at: Date.now() - 30_000 })] });
    const r = await dsec(['image', 'ls']);
    expect(r.code).toBe(0);
    const lines = r.out.trimEnd().split('\n');
    expect(lines[0].split(/\s+/)).toEqual(['REF', 'TENANT', 'LAYERS', 'SIZE', 'CREATED']);
    expect(lines[1].split(/\s+/)).toEqual(['team/py:1', 'team-a', '2', '3MiB', '2h', 'ago']);
    expect(lines[2].split(/\s+/)).toEqual(['busybox:latest', 'system', '1', '900KiB', '30s', 'ago']);
    expect(r.err).toBe('');
    expect((await dsec(['images'])).out).toBe(r.out);
    expect((await dsec(['image', 'list'])).out).toBe(r.out);
    const j = await dsec(['--json', 'image', 'ls']);
    expect(JSON.parse(j.out).images).toHaveLength(2);
    expect(JSON.parse((await dsec(['images', '--json'])).out)).toEqual(JSON.parse(j.out));
  });

  it('an empty store prints the header only', async () => {
    routes['GET /v1/images'] = ok({ images: [] });
    expect((await dsec(['image', 'ls'])).out).toBe('REF  TENANT  LAYERS  SIZE  CREATED\n');
  });
});

describe('image inspect, tag, rm', () => {
  it('inspect prints pretty JSON with or without --json and URL-encodes a ref with /', async () => {
    routes['GET /v1/images/:ref'] = ok(image());
    for (const args of [['image', 'inspect', 'team/py:1'], ['--json', 'image', 'inspect', 'team/py:1']]) {
      const r = await dsec(args);
      expect(r.code).toBe(0);
      expect(r.out).toBe(JSON.stringify(image(), null, 2).replace(/"created_at": \d+/, `"created_at": ${JSON.parse(r.out).created_at}`) + '\n');
    }
    expect(seen[0].path).toBe('/v1/images/team%2Fpy%3A1');
    expect(seen[0].params.ref).toBe('team/py:1');
  });

  it('inspect of a missing image is 125 with an image hint', async () => {
    routes['GET /v1/images/:ref'] = fail(404, 'NotFound', 'image nope:latest not found');
    const r = await dsec(['image', 'inspect', 'nope']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: image nope:latest not found (NotFound)\nhint: list images with `dsec image ls`\n');
    expect(r.err).not.toMatch(STACK);
  });

  it('tag prints the new ref, or the Image with --json', async () => {
    routes['POST /v1/images/:ref/tag'] = (req, res) => json(res, 201, image({ ref: req.body.target, tag: 'latest' }));
    const r = await dsec(['image', 'tag', 'team/py:1', 'team/py:latest']);
    expect(r.code).toBe(0);
    expect(r.out).toBe('team/py:latest\n');
    expect(seen[0].path).toBe('/v1/images/team%2Fpy%3A1/tag');
    expect(seen[0].body).toEqual({ target: 'team/py:latest' });
    const j = await dsec(['image', 'tag', '--json', 'team/py:1', 'x:2']);
    expect(JSON.parse(j.out).ref).toBe('x:2');
  });

  it('rm removes each ref, reports per ref, exits 125 if any failed; --json reports results', async () => {
    routes['DELETE /v1/images/:ref'] = (req, res) =>
      req.params.ref === 'gone' ? json(res, 404, { error: { code: 'NotFound', message: 'image gone:latest not found' } }) : json(res, 200, image({ ref: req.params.ref }));
    const r = await dsec(['image', 'rm', 'team/py:1', 'gone', 'a/b:c']);
    expect(r.code).toBe(125);
    expect(r.out).toBe('team/py:1\na/b:c\n');
    expect(r.err).toBe('dsec: image rm gone: image gone:latest not found (NotFound)\nhint: list images with `dsec image ls`\n');
    expect(seen.map((s) => s.path).sort()).toEqual(['/v1/images/a%2Fb%3Ac', '/v1/images/gone', '/v1/images/team%2Fpy%3A1']);
    const j = await dsec(['image', 'rm', '--json', 'team/py:1', 'gone']);
    expect(j.code).toBe(125);
    expect(JSON.parse(j.out).results).toEqual([
      { ref: 'team/py:1', ok: true, image: expect.objectContaining({ ref: 'team/py:1' }) },
      { ref: 'gone', ok: false, error: { code: 'NotFound', message: 'image gone:latest not found', hint: 'list images with `dsec image ls`' } },
    ]);
    expect(JSON.parse(j.out).error).toEqual({ code: 'NotFound', message: 'image rm failed for 1 of 2 images: gone', hint: 'list images with `dsec image ls`' });
    expect(j.err).toBe('dsec: image rm gone: image gone:latest not found (NotFound)\nhint: list images with `dsec image ls`\n');
    const all = await dsec(['image', 'rm', 'team/py:1']);
    expect(all.code).toBe(0);
  });
});

describe('image prune', () => {
  const result: PruneResult = {
    removed: [
      { digest: `sha256:${HEX_A}`, size_bytes: 2 * 1024 ** 2, source: 'dir:/srv/py' },
      { digest: `sha256:${HEX_B}`, size_bytes: 1024 ** 2, source: 'commit:0123456789abcdef' },
    ],
    freed_bytes: 3 * 1024 ** 2,
    kept_young: [`sha256:${HEX_C}`],
    tmp_removed: 2,
    dry_run: false,
  };

  it('prints each removed layer, the bytes freed and the notes', async () => {
    routes['POST /v1/images/prune'] = ok(result);
    const r = await dsec(['image', 'prune']);
    expect(r.code).toBe(0);
    expect(seen[0].body).toEqual({});
    const lines = r.out.trimEnd().split('\n');
    expect(lines[0].split(/\s+/)).toEqual(['removed', '0123456789ab', '2MiB', 'dir:/srv/py']);
    expect(lines[1].split(/\s+/)).toEqual(['removed', '0123456789cd', '1MiB', 'commit:0123456789abcdef']);
    expect(lines.slice(2)).toEqual(['freed 3MiB (2 layers)', 'kept 1 unreferenced layer younger than the grace period', 'removed 2 leftover temporary entries']);
  });

  it('--dry-run asks for a dry run and says "would"; --json prints the PruneResult', async () => {
    routes['POST /v1/images/prune'] = (req, res) => json(res, 200, { ...result, kept_young: [], tmp_removed: 0, dry_run: req.body.dry_run === true });
    const r = await dsec(['image', 'prune', '--dry-run']);
    expect(seen[0].body).toEqual({ dry_run: true });
    expect(r.out).toMatch(/^would remove\s+0123456789ab\s+2MiB\s+dir:\/srv\/py$/m);
    expect(r.out).toMatch(/^would free 3MiB \(2 layers\)$/m);
    const j = await dsec(['--json', 'image', 'prune']);
    expect(JSON.parse(j.out)).toEqual({ ...result, kept_young: [], tmp_removed: 0, dry_run: false });
  });

  it('nothing to remove says so', async () => {
    routes['POST /v1/images/prune'] = ok({ removed: [], freed_bytes: 0, kept_young: [], tmp_removed: 0, dry_run: false });
    expect((await dsec(['image', 'prune'])).out).toBe('nothing pruned\n');
  });
});

describe('image build', () => {
  it('sends an absolute dir, base and config; progress lines on stderr, the ref alone on stdout', async () => {
    mkdirSync(tmp('tree'));
    routes['GET /v1/images/:ref'] = ok(image({ ref: 'busybox:latest' }));
    routes['POST /v1/images/import'] = stream(image({ ref: 'team/app:2' }), [
      { type: 'progress', phase: 'pack', message: `packing ${tmp('tree')} as an EROFS layer` },
      { type: 'progress', phase: 'pack', bytes: 5 * 1024 ** 2 },
    ]);
    const r = await dsec([
      'image', 'build', tmp('tree'), '--tag', 'team/app:2', '--base', 'busybox', '--env', 'LANG=en_US.UTF-8', '--env', 'APP=1',
      '--cwd', '/app', '--user', '1000:1000', '--cmd', 'python3', 'app.py',
    ]);
    expect(r.code).toBe(0);
    expect(r.out).toBe('team/app:2\n');
    expect(r.err).toBe(`pack: packing ${tmp('tree')} as an EROFS layer\npack: (5MiB)\n`);
    expect(seen.map((s) => `${s.method} ${s.path}`)).toEqual(['GET /v1/images/busybox', 'POST /v1/images/import']);
    expect(seen[1].headers.accept).toBe('application/x-ndjson');
    expect(seen[1].body).toEqual({
      type: 'dir', path: tmp('tree'), image: 'team/app:2', base: 'busybox',
      // --env is merged over the base image's env: LANG replaced in place, APP added.
      config: { env: ['PATH=/usr/bin:/bin', 'LANG=en_US.UTF-8', 'APP=1'], cwd: '/app', user: '1000:1000', cmd: ['python3', 'app.py'] },
    });
  });

  it('resolves a relative DIR; sends no config without config flags; --json prints only the Image on stdout', async () => {
    routes['POST /v1/images/import'] = stream(image(), [{ type: 'progress', phase: 'pack', message: 'packing' }]);
    const r = await dsec(['--json', 'image', 'build', 'some/rel/dir', '-t', 'team/py:1']);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out).ref).toBe('team/py:1');
    expect(r.err).toBe('pack: packing\n');
    expect(seen[0].body).toEqual({ type: 'dir', path: resolve('some/rel/dir'), image: 'team/py:1' });
  });

  it('without --base, --env is merged over the default PATH; --cmd takes a JSON array', async () => {
    routes['POST /v1/images/import'] = stream(image());
    const r = await dsec(['image', 'build', '/srv/tree', '-t', 'x', '--env', 'A=1', '--cmd', '["python3","-m","http.server"]']);
    expect(r.code).toBe(0);
    expect(seen).toHaveLength(1);
    expect(seen[0].body.config).toEqual({ env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'A=1'], cmd: ['python3', '-m', 'http.server'] });
  });

  it('the security flags set config.security (field by field over --base, merged by dsecd)', async () => {
    routes['POST /v1/images/import'] = stream(image());
    const r = await dsec(['image', 'build', '/srv/tree', '-t', 'x', '--writable', '/work', '--no-landlock', '--seccomp-allow', 'ptrace', '--seccomp-deny', 'kcmp']);
    expect(r.code).toBe(0);
    expect(seen[0].body.config).toEqual({ security: { writable_paths: ['/work'], landlock: false, seccomp: { allow: ['ptrace'], deny: ['kcmp'] } } });
  });

  it('refuses a file, a relative --cwd, bad --cmd JSON and a missing --tag before any request', async () => {
    writeFileSync(tmp('file.tar'), 'x');
    const f = await dsec(['image', 'build', tmp('file.tar'), '-t', 'x']);
    expect(f.code).toBe(125);
    expect(f.err).toBe(`dsec: ${tmp('file.tar')} is not a directory\nhint: to import a tar or OCI archive use \`dsec image import PATH --tag NAME\`\n`);
    const c = await dsec(['image', 'build', '/srv/tree', '-t', 'x', '--cwd', 'work']);
    expect(c.code).toBe(125);
    expect(c.err).toMatch(/^dsec: --cwd: working directory "work" is not absolute\nhint: /);
    const j = await dsec(['image', 'build', '/srv/tree', '-t', 'x', '--cmd', '[oops']);
    expect(j.code).toBe(125);
    expect(j.err).toMatch(/^dsec: --cmd: "\[oops" is not a JSON array\nhint: /);
    const t = await dsec(['image', 'build', '/srv/tree']);
    expect(t.code).toBe(125);
    expect(t.err).toBe("dsec: required option '-t, --tag <name[:tag]>' not specified; see `dsec image build --help`\n");
    expect(seen).toHaveLength(0);
  });

  it('help says the path is read by dsecd on its host', async () => {
    const r = await dsec(['image', 'build', '--help']);
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/read by dsecd on its own host/);
  });

  it('a path missing on the daemon host gets a hint saying where dsecd looks', async () => {
    routes['POST /v1/images/import'] = ndjson([{ type: 'error', error: { code: 'NotFound', message: 'no such directory /srv/nope' } }]);
    const r = await dsec(['image', 'build', '/srv/nope', '-t', 'x']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: no such directory /srv/nope (NotFound)\nhint: dsecd reads DIR on its own host: check it exists there; `dsec image ls` lists images for --base\n');
  });
});

describe('progress and errors of long operations', () => {
  const progress = [
    { type: 'progress', phase: 'layer', layer: 1, layers: 2, message: 'naïve ✓ 日本 sha256:abc', bytes: 1024 },
    { type: 'progress', phase: 'layer', layer: 2, layers: 2, bytes: 2.5 * 1024 ** 2 },
    { type: 'progress', message: 'evil \x1b]0;title\x07 line\nbreak' },
  ];

  it('parses NDJSON split into 3-byte chunks and prints one plain line per event', async () => {
    routes['POST /v1/images/import'] = stream(image(), progress, 3);
    const r = await dsec(['image', 'import', '/srv/x.tar', '--format', 'oci', '-t', 'team/py:1']);
    expect(r.code).toBe(0);
    expect(r.out).toBe('team/py:1\n');
    expect(r.err).toBe('layer: [1/2] naïve ✓ 日本 sha256:abc (1KiB)\nextracting layer 2/2 (2.5MiB)\nevil ]0;title line break\n');
  });

  it('import phases without a message read as words', async () => {
    routes['POST /v1/images/import'] = stream(image(), [
      { type: 'progress', phase: 'unpack', bytes: 0 },
      { type: 'progress', phase: 'layer', layer: 1, layers: 3, bytes: 4096 },
      { type: 'progress', phase: 'build', layer: 1, layers: 3 },
      { type: 'progress', phase: 'manifest' },
      { type: 'progress' },
    ]);
    const r = await dsec(['image', 'import', '/srv/x.tar', '--format', 'oci', '-t', 'team/py:1']);
    expect(r.err).toBe('unpacking the archive (0B)\nextracting layer 1/3 (4KiB)\nbuilding EROFS layer 1/3\nstoring the manifest\n');
  });

  it('on a terminal: one status line rewritten in place, cut to the width, erased at the end', async () => {
    routes['POST /v1/images/import'] = stream(image(), [...progress, { type: 'progress', phase: 'pack', message: 'x'.repeat(200) }], 5);
    const r = await dsec(['image', 'import', '/srv/x.tar', '--format', 'tar', '-t', 'team/py:1'], { tty: true, columns: 40 });
    expect(r.code).toBe(0);
    expect(r.out).toBe('team/py:1\n');
    expect(r.err).not.toContain('\n');
    expect(r.err).not.toMatch(/\x1b\]|\x07/);
    const frames = r.err.split(CLEAR);
    expect(frames).toEqual(['', 'layer: [1/2] naïve ✓ 日本 sha256:abc (1K…', 'extracting layer 2/2 (2.5MiB)', 'evil ]0;title line break', 'pack: ' + 'x'.repeat(32) + '…', '']);
    expect([...frames[1]].length).toBe(39);
    expect([...frames[4]].length).toBe(39);
  });

  it('an error line mid-stream: exit 125, the progress so far, then one line and a hint', async () => {
    routes['POST /v1/images/import'] = ndjson([progress[0], { type: 'error', error: { code: 'InvalidArgument', message: 'layer 2 of /srv/x.tar is not a tar' } }, progress[1]], { chunk: 4 });
    const r = await dsec(['image', 'import', '/srv/x.tar', '--format', 'oci', '-t', 'team/py:1']);
    expect(r.code).toBe(125);
    expect(r.out).toBe('');
    expect(r.err).toBe(
      'layer: [1/2] naïve ✓ 日本 sha256:abc (1KiB)\n' +
        'dsec: layer 2 of /srv/x.tar is not a tar (InvalidArgument)\n' +
        'hint: see `dsec image import --help`\n',
    );
    expect(r.err).not.toMatch(STACK);
  });

  it('an error line on a terminal erases the status line first', async () => {
    routes['POST /v1/images/import'] = ndjson([progress[0], { type: 'error', error: { code: 'Internal', message: 'mkfs.erofs failed' } }]);
    const r = await dsec(['image', 'import', '/srv/x.tar', '--format', 'tar', '-t', 'x', '--json'], { tty: true });
    expect(r.code).toBe(125);
    const LOG = "see dsecd's log (journalctl -u dsecd, or /var/log/dsecd.log without systemd)";
    expect(JSON.parse(r.out)).toEqual({ error: { code: 'Internal', message: 'mkfs.erofs failed', hint: LOG } });
    expect(r.err).toBe(`${CLEAR}layer: [1/2] naïve ✓ 日本 sha256:abc (1KiB)${CLEAR}dsec: mkfs.erofs failed (Internal)\nhint: ${LOG}\n`);
  });

  it('SIGINT stops waiting, says dsecd may still finish, exits 130 and unregisters', async () => {
    routes['POST /v1/images/import'] = ndjson([progress[0]], { keepOpen: true });
    fake.onRequest = () => setTimeout(() => interrupts.fire('SIGINT'), 20);
    const r = await dsec(['image', 'import', '/srv/x.tar', '--format', 'tar', '-t', 'x']);
    expect(r.code).toBe(130);
    expect(r.out).toBe('');
    expect(r.err).toMatch(/dsec: interrupted by SIGINT; dsecd may still finish the import \(see `dsec image ls`\)\n$/);
    expect(interrupts.handlers.size).toBe(0);
  });

  it('a daemon without NDJSON support (one 201 JSON answer) still works', async () => {
    routes['POST /v1/images/import'] = ok(image(), 201);
    const r = await dsec(['image', 'import', '/srv/x.tar', '--format', 'tar', '-t', 'team/py:1']);
    expect(r.code).toBe(0);
    expect(r.out).toBe('team/py:1\n');
    expect(r.err).toBe('');
  });
});

describe('image import format detection', () => {
  /** Writes files (path → content) under a new directory `name` and returns its path. */
  function tree(name: string, files: Record<string, string>): string {
    const root = tmp(name);
    for (const [p, content] of Object.entries(files)) {
      mkdirSync(join(root, p, '..'), { recursive: true });
      writeFileSync(join(root, p), content);
    }
    return root;
  }
  /** Tars `root`'s entries (as `./...`) into `file`, gzipped when `gz`. */
  async function tarOf(root: string, file: string, gz = false): Promise<string> {
    await tar.c({ file, cwd: root, gzip: gz, portable: true }, ['.']);
    return file;
  }
  const OCI = { 'oci-layout': '{"imageLayoutVersion":"1.0.0"}', 'index.json': '{}', [`blobs/sha256/${HEX_A}`]: 'blob' };
  const ROOTFS = { 'etc/os-release': 'ID=test', 'bin/sh': '#!' };

  beforeEach(() => {
    routes['POST /v1/images/import'] = (req, res) => json(res, 201, image({ ref: req.body.image }));
  });
  const sent = () => seen.map((s) => s.body.type);

  it('a directory with oci-layout or manifest.json is oci; any other directory points at `image build`', async () => {
    const oci = tree('oci', OCI);
    expect((await dsec(['image', 'import', oci, '-t', 'x'])).code).toBe(0);
    expect(seen[0].body).toEqual({ type: 'oci', path: oci, image: 'x' });
    const docker = tree('docker', { 'manifest.json': '[]', [`${HEX_B}/layer.tar`]: '' });
    expect((await dsec(['image', 'import', docker, '-t', 'x'])).code).toBe(0);
    expect(seen[1].body.type).toBe('oci');
    const plain = tree('plain', ROOTFS);
    const r = await dsec(['image', 'import', plain, '-t', 'x']);
    expect(r.code).toBe(125);
    expect(r.err).toBe(
      `dsec: ${plain} is a directory without oci-layout or manifest.json, so neither an OCI image layout nor an unpacked docker save archive\n` +
        'hint: to build an image from a directory tree use `dsec image build DIR --tag NAME`\n',
    );
    expect(seen).toHaveLength(2);
  });

  it('tars: OCI layout → oci, docker save → oci, root filesystem → tar, gzip looked into', async () => {
    const ociTar = await tarOf(tree('o', OCI), tmp('oci.tar'));
    const docker = await tarOf(tree('d', { [`${HEX_B}/layer.tar`]: 'x', [`${HEX_B}/json`]: '{}', 'repositories': '{}', 'manifest.json': '[]' }), tmp('docker.tar'));
    const rootfs = await tarOf(tree('r', ROOTFS), tmp('rootfs.tar'));
    const rootfsGz = await tarOf(tree('rg', ROOTFS), tmp('rootfs.tar.gz'), true);
    const ociGz = await tarOf(tree('og', OCI), tmp('oci.tar.gz'), true);
    const odd = await tarOf(tree('odd', { 'app/main.py': 'print(1)' }), tmp('odd.tar'));
    for (const f of [ociTar, docker, rootfs, rootfsGz, ociGz, odd]) {
      const r = await dsec(['image', 'import', f, '-t', 'x']);
      expect(r.code, f + r.err).toBe(0);
    }
    expect(sent()).toEqual(['oci', 'oci', 'tar', 'tar', 'oci', 'tar']);
  });

  it('a file whose first tar entry is manifest.json at the top, written without ./, is oci', async () => {
    const root = tree('m', { 'manifest.json': '[]' });
    const file = tmp('m.tar');
    await tar.c({ file, cwd: root, portable: true }, ['manifest.json']);
    expect((await dsec(['image', 'import', file, '-t', 'x'])).code).toBe(0);
    expect(sent()).toEqual(['oci']);
  });

  it('xz and bzip2 archives are sent as tar without looking inside (dsecd decides)', async () => {
    writeFileSync(tmp('a.tar.xz'), Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00, 1, 2, 3]));
    writeFileSync(tmp('a.tar.bz2'), Buffer.from('BZh91AY&SY'));
    for (const f of ['a.tar.xz', 'a.tar.bz2']) expect((await dsec(['image', 'import', tmp(f), '-t', 'x'])).code).toBe(0);
    expect(sent()).toEqual(['tar', 'tar']);
  });

  it('not an archive, or missing here: a user error with a hint; no request', async () => {
    writeFileSync(tmp('notes.txt'), 'hello, not a tar\n'.repeat(100));
    const n = await dsec(['image', 'import', tmp('notes.txt'), '-t', 'x']);
    expect(n.code).toBe(125);
    expect(n.err).toMatch(new RegExp(`^dsec: ${tmp('notes.txt')} is not a tar archive\\nhint: import takes a root filesystem tar`));
    writeFileSync(tmp('bad.gz'), gzipSync(Buffer.from('hello, not a tar')));
    const g = await dsec(['image', 'import', tmp('bad.gz'), '-t', 'x']);
    expect(g.code).toBe(125);
    expect(g.err).toMatch(/is gzip-compressed but does not contain a readable tar archive/);
    const m = await dsec(['image', 'import', '/nonexistent/x.tar', '-t', 'x']);
    expect(m.code).toBe(125);
    expect(m.err).toBe('dsec: /nonexistent/x.tar does not exist here, so its format cannot be detected\nhint: if it exists on the dsecd host, pass --format tar or --format oci\n');
    expect(seen).toHaveLength(0);
  });

  it('an explicit --format skips detection (the path may exist only on the daemon host) but refuses a tar that is a directory here', async () => {
    expect((await dsec(['image', 'import', '/only/on/daemon.tar', '--format', 'tar', '-t', 'x'])).code).toBe(0);
    expect(seen[0].body).toEqual({ type: 'tar', path: '/only/on/daemon.tar', image: 'x' });
    const dir = tree('dir', ROOTFS);
    const r = await dsec(['image', 'import', dir, '--format', 'tar', '-t', 'x']);
    expect(r.code).toBe(125);
    expect(r.err).toMatch(/is a directory, not a tar\nhint: to build an image from a directory tree use `dsec image build/);
    const b = await dsec(['image', 'import', dir, '--format', 'dir', '-t', 'x']);
    expect(b.code).toBe(125);
    expect(b.err).toMatch(/^dsec: --format: unknown format "dir"\nhint: formats are auto, tar, oci/);
    expect(seen).toHaveLength(1);
  });

  it('the gzip fixtures above really are gzip', async () => {
    // Guards the detection test against a tar package that silently stops compressing.
    const f = await tarOf(tree('gzcheck', ROOTFS), tmp('check.tgz'), true);
    expect([...readFileSync(f).subarray(0, 2)]).toEqual([0x1f, 0x8b]);
  });
});

describe('image compose and bootstrap', () => {
  it('compose resolves layer prefixes with one listing, passes full digests, takes --from', async () => {
    routes['GET /v1/layers'] = ok({ layers: LAYERS });
    routes['POST /v1/images'] = (req, res) => json(res, 201, image({ ref: req.body.image, layers: req.body.layers }));
    const r = await dsec(['image', 'compose', 'team/py:3', `sha256:${HEX_C}`, '0123456789ab', 'SHA256:0123456789C', '--from', 'team/py:1']);
    expect(r.code).toBe(0);
    expect(r.out).toBe('team/py:3\n');
    expect(seen.map((s) => `${s.method} ${s.path}`)).toEqual(['GET /v1/layers', 'POST /v1/images']);
    expect(seen[1].body).toEqual({ image: 'team/py:3', layers: [`sha256:${HEX_C}`, `sha256:${HEX_A}`, `sha256:${HEX_B}`], from: 'team/py:1' });
    const j = await dsec(['--json', 'image', 'compose', 'x', `sha256:${HEX_A}`]);
    expect(JSON.parse(j.out).layers).toEqual([`sha256:${HEX_A}`]);
    expect(seen.at(-1)!.body).toEqual({ image: 'x', layers: [`sha256:${HEX_A}`] });
    expect(seen).toHaveLength(3); // full digests need no listing
  });

  it('compose with an ambiguous prefix is a user error and nothing is composed', async () => {
    routes['GET /v1/layers'] = ok({ layers: LAYERS });
    const r = await dsec(['image', 'compose', 'x', '0123']);
    expect(r.code).toBe(125);
    expect(r.err).toMatch(/^dsec: layer prefix "0123" is ambiguous: it matches 2 layers/);
    expect(seen.map((s) => s.method)).toEqual(['GET']);
  });

  it('bootstrap debian streams debootstrap lines and prints the ref; --json the Image', async () => {
    routes['POST /v1/images/bootstrap'] = stream(image({ ref: 'debian:bookworm' }), [
      { type: 'progress', phase: 'debootstrap', message: 'I: Retrieving InRelease' },
      { type: 'progress', phase: 'debootstrap', message: 'I: Base system installed successfully.' },
    ]);
    const r = await dsec(['image', 'bootstrap', 'debian']);
    expect(r.code).toBe(0);
    expect(r.out).toBe('debian:bookworm\n');
    expect(r.err).toBe('debootstrap: I: Retrieving InRelease\ndebootstrap: I: Base system installed successfully.\n');
    expect(seen[0].body).toEqual({ distro: 'debian' });
    const j = await dsec(['image', 'bootstrap', 'debian', '--tag', 'deb:py', '--include', 'python3', '--include', 'curl', '--json']);
    expect(JSON.parse(j.out).ref).toBe('debian:bookworm');
    expect(seen[1].body).toEqual({ distro: 'debian', image: 'deb:py', include: ['python3', 'curl'] });
  });

  it('bootstrap judge asks for the judge toolkit on debian and streams both phases', async () => {
    routes['POST /v1/images/bootstrap'] = stream(image({ ref: 'judge:bookworm' }), [
      { type: 'progress', phase: 'toolkit', message: 'dsec: debian:bookworm is not in the store: bootstrapping it first' },
      { type: 'progress', phase: 'debootstrap', message: 'I: Base system installed successfully.' },
      { type: 'progress', phase: 'toolkit', message: 'Setting up gcc (4:12.2.0-3) ...' },
    ]);
    const r = await dsec(['image', 'bootstrap', 'judge']);
    expect(r.code).toBe(0);
    expect(r.out).toBe('judge:bookworm\n');
    expect(r.err).toBe('toolkit: dsec: debian:bookworm is not in the store: bootstrapping it first\ndebootstrap: I: Base system installed successfully.\ntoolkit: Setting up gcc (4:12.2.0-3) ...\n');
    expect(seen[0].body).toEqual({ distro: 'debian', toolkit: 'judge' });
    await dsec(['image', 'bootstrap', 'judge', '--tag', 'judge:make', '--include', 'make']);
    expect(seen[1].body).toEqual({ distro: 'debian', toolkit: 'judge', image: 'judge:make', include: ['make'] });
  });

  it('bootstrap refuses other distros and bad package names locally', async () => {
    const u = await dsec(['image', 'bootstrap', 'ubuntu']);
    expect(u.code).toBe(125);
    expect(u.err).toBe('dsec: cannot bootstrap "ubuntu"\nhint: targets are debian, judge\n');
    const p = await dsec(['image', 'bootstrap', 'debian', '--include', 'Bad_Pkg']);
    expect(p.code).toBe(125);
    expect(p.err).toMatch(/^dsec: --include: invalid package name "Bad_Pkg"\nhint: /);
    expect(seen).toHaveLength(0);
  });

  it('bootstrap: Unavailable from dsecd names debootstrap and the mirror; an unreachable dsecd says to start it', async () => {
    routes['POST /v1/images/bootstrap'] = ndjson([{ type: 'error', error: { code: 'Unavailable', message: 'cannot reach deb.debian.org' } }]);
    const r = await dsec(['image', 'bootstrap', 'debian']);
    expect(r.code).toBe(125);
    expect(r.err).toBe("dsec: cannot reach deb.debian.org (Unavailable)\nhint: dsecd could not run debootstrap or reach the Debian mirror; see dsecd's log (journalctl -u dsecd, or /var/log/dsecd.log without systemd)\n");
    const d = await dsec(['image', 'bootstrap', 'debian'], { socket: tmp('missing.sock') });
    expect(d.code).toBe(125);
    expect(d.err).toMatch(/\(Unavailable\)\nhint: start dsecd \(systemctl start dsecd, or see docs\/OPERATIONS.md 'Without systemd'\)\n$/);
  });
});

describe('layer ls and inspect', () => {
  it('ls prints DIGEST (12 hex), SIZE, SOURCE, IMAGES, SANDBOXES, AGE; --json prints {layers}', async () => {
    routes['GET /v1/layers'] = ok({ layers: LAYERS });
    const r = await dsec(['layer', 'ls']);
    expect(r.code).toBe(0);
    const lines = r.out.trimEnd().split('\n');
    expect(lines[0].split(/\s+/)).toEqual(['DIGEST', 'SIZE', 'SOURCE', 'IMAGES', 'SANDBOXES', 'AGE']);
    expect(lines[1].split(/\s+/)).toEqual(['0123456789ab', '1.5MiB', 'dir:/srv/py', 'team/py:1,team/py:latest', '2', '3d']);
    expect(lines[2].split(/\s+/)).toEqual(['0123456789cd', '100B', 'commit:0123456789abcdef', '-', '0', '3d']);
    const j = await dsec(['layer', 'ls', '--json']);
    expect(JSON.parse(j.out).layers.map((l: Layer) => l.digest)).toEqual(LAYERS.map((l) => l.digest));
  });

  it('inspect resolves a unique prefix (with or without sha256:, any case) by listing', async () => {
    routes['GET /v1/layers'] = ok({ layers: LAYERS });
    for (const arg of ['fedc', 'sha256:FEDCBA987654', 'fedcba987654']) {
      const r = await dsec(['layer', 'inspect', arg]);
      expect(r.code, arg).toBe(0);
      expect(JSON.parse(r.out).digest).toBe(`sha256:${HEX_C}`);
    }
    expect((await dsec(['--json', 'layer', 'inspect', '0123456789a'])).out).toBe(JSON.stringify(LAYERS[0], null, 2) + '\n');
    expect(seen.every((s) => s.path === '/v1/layers')).toBe(true);
  });

  it('inspect of a full digest fetches it directly (URL-encoded)', async () => {
    routes['GET /v1/layers/:digest'] = (req, res) => json(res, 200, layer({ digest: req.params.digest }));
    const r = await dsec(['layer', 'inspect', `sha256:${HEX_B}`]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.out).digest).toBe(`sha256:${HEX_B}`);
    expect(seen.map((s) => s.path)).toEqual([`/v1/layers/sha256%3A${HEX_B}`]);
  });

  it('an ambiguous, unknown or malformed prefix is a user error with a hint', async () => {
    routes['GET /v1/layers'] = ok({ layers: LAYERS });
    const a = await dsec(['layer', 'inspect', '0123456789']);
    expect(a.code).toBe(125);
    expect(a.err).toBe('dsec: layer prefix "0123456789" is ambiguous: it matches 2 layers (0123456789abaa, 0123456789cdbb)\nhint: give more hex digits of the digest\n');
    const n = await dsec(['layer', 'inspect', 'beef']);
    expect(n.code).toBe(125);
    expect(n.err).toBe('dsec: no layer matches "beef"\nhint: list layers with `dsec layer ls`\n');
    const bad = await dsec(['layer', 'inspect', 'xyz']);
    expect(bad.code).toBe(125);
    expect(bad.err).toMatch(/^dsec: invalid layer digest "xyz"\nhint: /);
    expect(seen).toHaveLength(2);
    expect(a.err + n.err + bad.err).not.toMatch(STACK);
  });

  it('a full digest that does not exist is the API NotFound with a layer hint', async () => {
    routes['GET /v1/layers/:digest'] = fail(404, 'NotFound', `layer sha256:${HEX_B} not found`);
    const r = await dsec(['layer', 'inspect', HEX_B]);
    expect(r.code).toBe(125);
    expect(r.err).toBe(`dsec: layer sha256:${HEX_B} not found (NotFound)\nhint: list layers with \`dsec layer ls\`\n`);
  });
});

describe('commit', () => {
  const result: CommitResult = {
    image: image({ ref: 'team/py:2', tag: '2' }),
    layer: layer({ digest: `sha256:${HEX_C}`, size_bytes: 123456, source: 'commit:0123456789abcdef', images: ['team/py:2'], sandboxes: 1 }),
    stripped: ['root/.bash_history', 'tmp/x'],
  };

  it('prints the new ref on stdout and the layer and stripped paths on stderr', async () => {
    routes['POST /v1/sandboxes/:id/commit'] = ok(result, 201);
    const r = await dsec(['commit', '0123456789abcdef', 'team/py:2', '--exclude', 'srv/cache/**', '--exclude', '*.log']);
    expect(r.code).toBe(0);
    expect(r.out).toBe('team/py:2\n');
    expect(r.err).toBe(`layer sha256:${HEX_C} (123456 bytes), stripped: root/.bash_history, tmp/x\n`);
    expect(seen[0].path).toBe('/v1/sandboxes/0123456789abcdef/commit');
    expect(seen[0].body).toEqual({ image: 'team/py:2', exclude: ['srv/cache/**', '*.log'] });
  });

  it('--json prints only the CommitResult; nothing stripped says none; many stripped are summarised', async () => {
    routes['POST /v1/sandboxes/:id/commit'] = ok(result, 201);
    const j = await dsec(['--json', 'commit', 'abc', 'team/py:2']);
    expect(j.code).toBe(0);
    expect(JSON.parse(j.out)).toEqual(JSON.parse(JSON.stringify(result)));
    expect(j.err).toBe('');
    expect(seen[0].body).toEqual({ image: 'team/py:2' });
    routes['POST /v1/sandboxes/:id/commit'] = ok({ ...result, stripped: [] }, 201);
    expect((await dsec(['commit', 'abc', 'x'])).err).toMatch(/, stripped: none\n$/);
    routes['POST /v1/sandboxes/:id/commit'] = ok({ ...result, stripped: Array.from({ length: 13 }, (_, i) => `f${i}`) }, 201);
    expect((await dsec(['commit', 'abc', 'x'])).err).toMatch(/, stripped: f0, f1, f2, f3, f4, f5, f6, f7, f8, f9 and 3 more\n$/);
  });

  it('prints each warning of the result (e.g. the create env left out of the image) on its own line', async () => {
    const warnings = ['exclude pattern "x/**" matched nothing', "the sandbox's create env (TOKEN) is not part of the image: it is a runtime secret; pass it again when creating sandboxes from team/py:2"];
    routes['POST /v1/sandboxes/:id/commit'] = ok({ ...result, warnings }, 201);
    const r = await dsec(['commit', 'abc', 'team/py:2']);
    expect(r.code).toBe(0);
    expect(r.err).toBe(`layer sha256:${HEX_C} (123456 bytes), stripped: root/.bash_history, tmp/x\nwarning: ${warnings[0]}\nwarning: ${warnings[1]}\n`);
  });

  it('a missing sandbox or a non-running one gets the sandbox hints', async () => {
    routes['POST /v1/sandboxes/:id/commit'] = fail(404, 'NotFound', 'sandbox nope not found');
    const r = await dsec(['commit', 'nope', 'x']);
    expect(r.code).toBe(125);
    expect(r.err).toBe('dsec: sandbox nope not found (NotFound)\nhint: list sandboxes with `dsec ls`\n');
    routes['POST /v1/sandboxes/:id/commit'] = fail(412, 'FailedPrecondition', 'sandbox abc is creating');
    expect((await dsec(['commit', 'abc', 'x'])).err).toMatch(/\nhint: check the sandbox state with `dsec inspect ID`\n$/);
    const u = await dsec(['commit', 'abc']);
    expect(u.code).toBe(125);
    expect(u.err).toBe("dsec: missing required argument 'image'; see `dsec commit --help`\n");
  });
});
