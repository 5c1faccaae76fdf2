// extractLayerTar: sanitisation (.., absolute paths, symlink escapes, devices, hard links),
// compression detection by magic bytes, OCI whiteouts. Tars are built here with node-tar:
// `tar.c` from real directories for the ordinary cases, and node-tar's Header encoder for
// the hostile ones that no directory on disk can produce. Checks of owners, whiteouts and
// trusted.* xattrs need root (skipped otherwise); everything lives in one temp dir.
import { execa } from 'execa';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { chmod, lstat, mkdir, readdir, readFile, readlink, rm, stat, symlink, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import * as tar from 'tar';
import { afterAll, describe, expect, it } from 'vitest';
import { isDsecError } from '../../daemon/errors.js';
import { detectCompression, extractLayerTar, normaliseEntryPath } from '../../daemon/image/import/tar.js';

const isRoot = process.getuid?.() === 0;
const base = mkdtempSync(join(tmpdir(), 'dsec-import-tar-'));
afterAll(async () => {
  await rm(base, { recursive: true, force: true });
});

let n = 0;
/** A fresh directory under base; the extraction target is `<it>/out`, so `<it>` is "outside". */
async function fresh(): Promise<{ dir: string; out: string }> {
  const dir = join(base, `case-${n++}`);
  await mkdir(join(dir, 'out'), { recursive: true });
  return { dir, out: join(dir, 'out') };
}

interface RawEntry {
  path: string;
  type?: 'File' | 'Directory' | 'SymbolicLink' | 'Link' | 'CharacterDevice' | 'BlockDevice' | 'FIFO';
  body?: string;
  linkpath?: string;
  mode?: number;
  uid?: number;
  gid?: number;
  devmaj?: number;
  devmin?: number;
  mtime?: Date;
}

/** Encodes entries as a tar with node-tar's Header (no checks: hostile archives are the point). */
function rawTar(entries: RawEntry[]): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const body = Buffer.from(e.body ?? '');
    const type = e.type ?? 'File';
    const h = new tar.Header({
      path: e.path,
      type,
      size: type === 'File' ? body.length : 0,
      mode: e.mode ?? (type === 'Directory' ? 0o755 : 0o644),
      uid: e.uid ?? 0,
      gid: e.gid ?? 0,
      mtime: e.mtime ?? new Date(1_700_000_000_000),
      linkpath: e.linkpath ?? '',
      uname: '',
      gname: '',
      devmaj: e.devmaj ?? 0,
      devmin: e.devmin ?? 0,
    });
    const hb = Buffer.alloc(512);
    h.encode(hb);
    blocks.push(hb);
    if (type === 'File' && body.length > 0) {
      blocks.push(body, Buffer.alloc((512 - (body.length % 512)) % 512));
    }
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

async function writeTar(dir: string, name: string, data: Buffer): Promise<string> {
  const p = join(dir, name);
  await writeFile(p, data);
  return p;
}

const sha = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;

async function expectInvalid(p: Promise<unknown>, re: RegExp): Promise<void> {
  await expect(p).rejects.toSatisfy((e: unknown) => {
    if (!isDsecError(e, 'InvalidArgument')) throw e;
    expect((e as Error).message).toMatch(re);
    return true;
  });
}

async function zstdCompress(data: Buffer): Promise<Buffer> {
  const r = await execa('zstd', ['-q', '-c', '-3'], { input: data, encoding: 'buffer' });
  return Buffer.from(r.stdout as Uint8Array);
}

describe('path normalisation and magic bytes', () => {
  it('strips leading slashes and dots, refuses any ..', () => {
    expect(normaliseEntryPath('./a/b/')).toEqual({ rel: 'a/b', strippedSlash: false });
    expect(normaliseEntryPath('//etc/x')).toEqual({ rel: 'etc/x', strippedSlash: true });
    expect(normaliseEntryPath('./')).toEqual({ rel: '', strippedSlash: false });
    expect(normaliseEntryPath('a//./b')).toEqual({ rel: 'a/b', strippedSlash: false });
    for (const bad of ['../x', 'a/../../x', 'a/..', '/..', 'a/../b']) {
      expect(() => normaliseEntryPath(bad)).toThrow(/"\.\."/);
    }
  });

  it('detects gzip and zstd by magic, refuses xz and bzip2, takes the rest as plain', () => {
    expect(detectCompression(Buffer.from([0x1f, 0x8b, 8, 0]))).toBe('gzip');
    expect(detectCompression(Buffer.from([0x28, 0xb5, 0x2f, 0xfd, 0, 0]))).toBe('zstd');
    expect(detectCompression(Buffer.from('ustar\0'))).toBe('none');
    expect(() => detectCompression(Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]))).toThrow(/xz/);
    expect(() => detectCompression(Buffer.from('BZh91AY'))).toThrow(/bzip2/);
  });
});

describe('extractLayerTar', () => {
  /** A small tree with files, dirs, symlinks and a hard link, packed by node-tar from disk (node-tar's packer hangs on fifos: those are tested with raw headers). */
  async function sampleTar(dir: string): Promise<{ tarPath: string; data: Buffer }> {
    const src = join(dir, 'src');
    await mkdir(join(src, 'usr/bin'), { recursive: true });
    await mkdir(join(src, 'etc'), { recursive: true });
    await writeFile(join(src, 'usr/bin/tool'), 'tool body\n');
    await chmod(join(src, 'usr/bin/tool'), 0o4755);
    await writeFile(join(src, 'etc/conf'), 'k=v\n');
    await symlink('/usr/bin/tool', join(src, 'usr/bin/abs-link'));
    await symlink('../etc/conf', join(src, 'usr/conf-link'));
    await (await import('node:fs/promises')).link(join(src, 'etc/conf'), join(src, 'etc/conf-hard'));
    await chmod(join(src, 'etc'), 0o750);
    await utimes(join(src, 'etc/conf'), 1_600_000_000, 1_600_000_000);
    await utimes(join(src, 'etc'), 1_500_000_000, 1_500_000_000);
    const tarPath = join(dir, 'sample.tar');
    await tar.c({ cwd: src, file: tarPath, portable: false }, ['usr', 'etc']);
    return { tarPath, data: await readFile(tarPath) };
  }

  async function checkSample(out: string): Promise<void> {
    expect((await readFile(join(out, 'usr/bin/tool'), 'utf8'))).toBe('tool body\n');
    expect((await stat(join(out, 'usr/bin/tool'))).mode & 0o7777).toBe(0o4755); // setuid kept
    expect(await readlink(join(out, 'usr/bin/abs-link'))).toBe('/usr/bin/tool');
    expect(await readlink(join(out, 'usr/conf-link'))).toBe('../etc/conf');
    expect((await stat(join(out, 'etc/conf-hard'))).ino).toBe((await stat(join(out, 'etc/conf'))).ino);
    expect((await stat(join(out, 'etc'))).mode & 0o7777).toBe(0o750);
    expect((await stat(join(out, 'etc/conf'))).mtimeMs).toBe(1_600_000_000_000);
    expect((await stat(join(out, 'etc'))).mtimeMs).toBe(1_500_000_000_000); // set after its children
  }

  it('extracts files, dirs, symlinks and hard links with modes (setuid too) and mtimes', async () => {
    const { dir, out } = await fresh();
    const { tarPath, data } = await sampleTar(dir);
    const progress: number[] = [];
    const r = await extractLayerTar(tarPath, out, { ociWhiteouts: false, onProgress: (b) => progress.push(b) });
    await checkSample(out);
    expect(r).toMatchObject({ compression: 'none', whiteouts: 0, opaqueDirs: 0, bytes: 'tool body\n'.length + 'k=v\n'.length });
    expect(r.entries).toBe(8); // usr usr/bin tool abs-link conf-link etc conf conf-hard
    expect(r.sanitised).toEqual(isRoot ? [] : [expect.stringMatching(/ownership not applied/)]);
    expect(r.inputDigest).toBe(sha(data));
    expect(r.diffId).toBe(sha(data));
    expect(r.inputBytes).toBe(data.length);
    expect(progress.at(-1)).toBe(data.length);
  });

  it('detects gzip and zstd from the bytes, not the name, and accepts a stream', async () => {
    const { dir } = await fresh();
    const { data } = await sampleTar(dir);
    const gz = gzipSync(data);
    const zs = await zstdCompress(data);
    for (const [name, bytes, kind] of [['a.tar', gz, 'gzip'], ['b.tar.gz', zs, 'zstd'], ['c.zst', data, 'none']] as const) {
      const out = join(dir, `out-${name}`);
      const r = await extractLayerTar(await writeTar(dir, name, bytes), out, { ociWhiteouts: false });
      expect(r.compression).toBe(kind);
      expect(r.inputDigest).toBe(sha(bytes));
      expect(r.diffId).toBe(sha(data));
      await checkSample(out);
    }
    const out = join(dir, 'out-stream');
    const r = await extractLayerTar(Readable.from([zs.subarray(0, 3), zs.subarray(3)]), out, { ociWhiteouts: false });
    expect(r.compression).toBe('zstd');
    await checkSample(out);
  });

  it('keeps fifos (a hard link to one becomes a second fifo)', async () => {
    const { dir, out } = await fresh();
    const r = await extractLayerTar(
      await writeTar(dir, 'f.tar', rawTar([{ path: 'run/p', type: 'FIFO', mode: 0o640 }, { path: 'run/q', type: 'Link', linkpath: 'run/p' }])),
      out,
      { ociWhiteouts: false },
    );
    for (const name of ['p', 'q']) {
      const st = await lstat(join(out, 'run', name));
      expect(st.isFIFO()).toBe(true);
      expect(st.mode & 0o7777).toBe(0o640);
    }
    expect(r.sanitised).toEqual(expect.arrayContaining([expect.stringMatching(/separate fifo/)]));
  });

  it.skipIf(!isRoot)('keeps numeric owners from the header', async () => {
    const { dir, out } = await fresh();
    const data = rawTar([
      { path: 'd', type: 'Directory', uid: 1234, gid: 2345 },
      { path: 'd/f', body: 'x', uid: 1000, gid: 1001, mode: 0o2755 },
      { path: 'd/l', type: 'SymbolicLink', linkpath: 'f', uid: 7, gid: 8 },
    ]);
    await extractLayerTar(await writeTar(dir, 'o.tar', data), out, { ociWhiteouts: false });
    expect(await stat(join(out, 'd'))).toMatchObject({ uid: 1234, gid: 2345 });
    const f = await stat(join(out, 'd/f'));
    expect(f).toMatchObject({ uid: 1000, gid: 1001 });
    expect(f.mode & 0o7777).toBe(0o2755); // setgid survives the chown
    expect(await lstat(join(out, 'd/l'))).toMatchObject({ uid: 7, gid: 8 });
  });

  it('refuses ../ escapes and writes nothing outside', async () => {
    const { dir, out } = await fresh();
    for (const p of ['../escape', 'a/../../escape', './../escape']) {
      await expectInvalid(extractLayerTar(await writeTar(dir, 'e.tar', rawTar([{ path: p, body: 'pwned' }])), out, { ociWhiteouts: false }), /"\.\."/);
    }
    await expectInvalid(
      extractLayerTar(await writeTar(dir, 'e.tar', rawTar([{ path: 'ok', body: '1' }, { path: 'sl', type: 'SymbolicLink', linkpath: 'x' }, { path: 'h', type: 'Link', linkpath: '../ok' }])), out, {
        ociWhiteouts: false,
      }),
      /"\.\."/,
    );
    expect((await readdir(dir)).sort()).toEqual(['e.tar', 'out']);
  });

  it('strips a leading / instead of writing to the host path, and says so', async () => {
    const { dir, out } = await fresh();
    const name = `dsec-import-test-${randomBytes(6).toString('hex')}`;
    const r = await extractLayerTar(await writeTar(dir, 'a.tar', rawTar([{ path: `/etc/${name}`, body: 'inside' }, { path: '/etc/other', body: 'o' }])), out, {
      ociWhiteouts: false,
    });
    expect(await readFile(join(out, 'etc', name), 'utf8')).toBe('inside');
    await expect(stat(join('/etc', name))).rejects.toMatchObject({ code: 'ENOENT' });
    expect(r.sanitised).toContain(`stripped leading "/" (2 entries, e.g. "/etc/${name}")`);
  });

  it('refuses to write through a symlink, wherever it points', async () => {
    const { dir, out } = await fresh();
    const outside = join(dir, 'outside');
    await mkdir(outside);
    const cases: RawEntry[][] = [
      [{ path: 'evil', type: 'SymbolicLink', linkpath: outside }, { path: 'evil/pwned', body: 'x' }],
      [{ path: 'evil', type: 'SymbolicLink', linkpath: '../../outside' }, { path: 'evil/sub/pwned', body: 'x' }],
      [{ path: 'evil', type: 'SymbolicLink', linkpath: outside }, { path: 'evil/d', type: 'Directory' }],
      [{ path: 'evil', type: 'SymbolicLink', linkpath: outside }, { path: 'evil/s', type: 'SymbolicLink', linkpath: '/x' }],
      [{ path: 'inner', type: 'Directory' }, { path: 'evil', type: 'SymbolicLink', linkpath: 'inner' }, { path: 'evil/f', body: 'x' }], // even inside
    ];
    for (const entries of cases) {
      const o = join(dir, `out-${n++}`);
      await expectInvalid(extractLayerTar(await writeTar(dir, 's.tar', rawTar(entries)), o, { ociWhiteouts: false }), /goes through the symlink "evil"/);
    }
    expect(await readdir(outside)).toEqual([]);

    // A file entry at the symlink's own path replaces the symlink; it never writes through it.
    await writeFile(join(outside, 'target'), 'host file');
    await extractLayerTar(
      await writeTar(dir, 'r.tar', rawTar([{ path: 'l', type: 'SymbolicLink', linkpath: join(outside, 'target') }, { path: 'l', body: 'layer file' }])),
      out,
      { ociWhiteouts: false },
    );
    expect(await readFile(join(outside, 'target'), 'utf8')).toBe('host file');
    expect((await lstat(join(out, 'l'))).isFile()).toBe(true);
    expect(await readFile(join(out, 'l'), 'utf8')).toBe('layer file');
  });

  it('allows hard links only to earlier entries of the archive', async () => {
    const { dir, out } = await fresh();
    const outside = join(dir, 'secret');
    await writeFile(outside, 'host secret');
    for (const linkpath of ['/etc/passwd', outside, 'not-in-archive', 'etc/passwd']) {
      await expectInvalid(extractLayerTar(await writeTar(dir, 'h.tar', rawTar([{ path: 'x', type: 'Link', linkpath }])), join(dir, `o-${n++}`), { ociWhiteouts: false }), /not an earlier file/);
    }
    // Through a symlink planted after the target's directory was replaced.
    await expectInvalid(
      extractLayerTar(
        await writeTar(
          dir,
          'h2.tar',
          rawTar([
            { path: 'd/f', body: 'in layer' },
            { path: 'd', type: 'SymbolicLink', linkpath: dir },
            { path: 'x', type: 'Link', linkpath: 'd/f' },
          ]),
        ),
        join(dir, `o-${n++}`),
        { ociWhiteouts: false },
      ),
      /not an earlier file/,
    );
    const r = await extractLayerTar(await writeTar(dir, 'ok.tar', rawTar([{ path: 'a/f', body: 'same' }, { path: 'b/g', type: 'Link', linkpath: '/a/f' }])), out, {
      ociWhiteouts: false,
    });
    expect((await stat(join(out, 'b/g'))).ino).toBe((await stat(join(out, 'a/f'))).ino);
    expect(r.sanitised).toEqual(expect.arrayContaining([expect.stringMatching(/hard link target/)]));
    expect(await readFile(outside, 'utf8')).toBe('host secret');
  });

  it('refuses device nodes, except below /dev where they are dropped', async () => {
    const { dir, out } = await fresh();
    await expectInvalid(
      extractLayerTar(await writeTar(dir, 'd.tar', rawTar([{ path: 'etc/sda', type: 'BlockDevice', devmaj: 8, devmin: 0 }])), join(dir, 'o1'), { ociWhiteouts: false }),
      /block device 8:0/,
    );
    await expectInvalid(
      extractLayerTar(await writeTar(dir, 'd.tar', rawTar([{ path: 'mem', type: 'CharacterDevice', devmaj: 1, devmin: 1 }])), join(dir, 'o2'), { ociWhiteouts: true }),
      /character device 1:1/,
    );
    // A ready-made overlay whiteout is a device like any other: only this module makes them.
    await expectInvalid(
      extractLayerTar(await writeTar(dir, 'd.tar', rawTar([{ path: 'gone', type: 'CharacterDevice', devmaj: 0, devmin: 0 }])), join(dir, 'o3'), { ociWhiteouts: true }),
      /character device 0:0/,
    );
    const r = await extractLayerTar(
      await writeTar(dir, 'ok.tar', rawTar([{ path: 'dev', type: 'Directory' }, { path: 'dev/null', type: 'CharacterDevice', devmaj: 1, devmin: 3 }, { path: 'dev/fd0', type: 'BlockDevice', devmaj: 2 }])),
      out,
      { ociWhiteouts: false },
    );
    expect(await readdir(join(out, 'dev'))).toEqual([]);
    expect(r.sanitised).toEqual(expect.arrayContaining([expect.stringMatching(/^dropped device node below \/dev .*2 entries/)]));
  });

  it('lets a later entry replace an earlier one, merging directories', async () => {
    const { dir, out } = await fresh();
    await extractLayerTar(
      await writeTar(
        dir,
        'r.tar',
        rawTar([
          { path: 'p', body: 'file first' },
          { path: 'p', type: 'Directory', mode: 0o700 },
          { path: 'p/a', body: 'a' },
          { path: 'p', type: 'Directory', mode: 0o711 },
          { path: 'p/b', body: 'b' },
          { path: 'q/x', body: 'x' },
          { path: 'q', body: 'now a file' },
        ]),
      ),
      out,
      { ociWhiteouts: false },
    );
    expect((await readdir(join(out, 'p'))).sort()).toEqual(['a', 'b']);
    expect((await stat(join(out, 'p'))).mode & 0o7777).toBe(0o711);
    expect(await readFile(join(out, 'q'), 'utf8')).toBe('now a file');
  });

  it('refuses corrupt input and accepts an empty archive', async () => {
    const { dir, out } = await fresh();
    const good = rawTar([{ path: 'f', body: 'x'.repeat(2000) }]);
    await expectInvalid(extractLayerTar(await writeTar(dir, 't.tar', good.subarray(0, 1024)), join(dir, 'o1'), { ociWhiteouts: false }), /not a valid tar/);
    await expectInvalid(extractLayerTar(await writeTar(dir, 'r.tar', randomBytes(4096)), join(dir, 'o2'), { ociWhiteouts: false }), /not a valid tar/);
    await expectInvalid(extractLayerTar(await writeTar(dir, 'z.tar', Buffer.alloc(0)), join(dir, 'o3'), { ociWhiteouts: false }), /empty/);
    const badGz = gzipSync(good);
    badGz[badGz.length - 12] ^= 0xff;
    await expectInvalid(extractLayerTar(await writeTar(dir, 'g.tar', badGz), join(dir, 'o4'), { ociWhiteouts: false }), /gzip|not a valid tar/);
    const badZs = await zstdCompress(good);
    await expectInvalid(extractLayerTar(await writeTar(dir, 's.tar', badZs.subarray(0, badZs.length - 5)), join(dir, 'o5'), { ociWhiteouts: false }), /zstd/);
    await expect(extractLayerTar(join(dir, 'missing.tar'), join(dir, 'o6'), { ociWhiteouts: false })).rejects.toSatisfy((e: unknown) => isDsecError(e, 'NotFound'));

    const r = await extractLayerTar(await writeTar(dir, 'empty.tar', gzipSync(Buffer.alloc(1024))), out, { ociWhiteouts: true });
    expect(r).toMatchObject({ entries: 0, compression: 'gzip' });
    expect(await readdir(out)).toEqual([]);
  });

  it('keeps .wh. files as plain files without ociWhiteouts', async () => {
    const { dir, out } = await fresh();
    const r = await extractLayerTar(await writeTar(dir, 'w.tar', rawTar([{ path: 'd/.wh.x' }, { path: 'd/.wh..wh..opq' }])), out, { ociWhiteouts: false });
    expect((await readdir(join(out, 'd'))).sort()).toEqual(['.wh..wh..opq', '.wh.x']);
    expect(r).toMatchObject({ whiteouts: 0, opaqueDirs: 0 });
  });

  it.skipIf(!isRoot)('turns OCI whiteouts into overlay whiteouts and opaque dirs', async () => {
    const { dir, out } = await fresh();
    const r = await extractLayerTar(
      await writeTar(
        dir,
        'w.tar',
        rawTar([
          { path: 'data', type: 'Directory' },
          { path: 'data/.wh.a.txt' },
          { path: 'data/dir/.wh..wh..opq' }, // marker before its directory's own entry
          { path: 'data/dir', type: 'Directory', mode: 0o750 },
          { path: 'data/dir/n', body: 'new\n' },
          { path: 'keep', body: 'k' },
          { path: '.wh.keep' }, // same layer has keep: the whiteout only hides lower layers
          { path: '.wh.late' },
          { path: 'late', body: 'recreated' }, // and the other way round
          { path: '.wh..wh.plnk/123', body: 'aufs' },
          { path: 'gone/.wh.deep' }, // parent not in the archive: created 0755
        ]),
      ),
      out,
      { ociWhiteouts: true },
    );
    const wh = await lstat(join(out, 'data/a.txt'));
    expect(wh.isCharacterDevice()).toBe(true);
    expect(wh.rdev).toBe(0);
    expect(wh.mode & 0o7777).toBe(0);
    expect((await lstat(join(out, 'gone/deep'))).isCharacterDevice()).toBe(true);
    expect((await stat(join(out, 'gone'))).mode & 0o7777).toBe(0o755);
    const xattr = async (p: string) =>
      (await execa('getfattr', ['-h', '--only-values', '-n', 'trusted.overlay.opaque', p], { reject: false })).stdout;
    expect(await xattr(join(out, 'data/dir'))).toBe('y');
    expect(await xattr(join(out, 'data'))).toBe('');
    expect((await stat(join(out, 'data/dir'))).mode & 0o7777).toBe(0o750);
    expect(await readFile(join(out, 'keep'), 'utf8')).toBe('k');
    expect(await readFile(join(out, 'late'), 'utf8')).toBe('recreated');
    expect((await readdir(out)).sort()).toEqual(['data', 'gone', 'keep', 'late']);
    expect(r).toMatchObject({ whiteouts: 2, opaqueDirs: 1 });
    expect(r.sanitised).toEqual(
      expect.arrayContaining([expect.stringMatching(/^dropped whiteout of a path this layer itself provides \(1 entry/), expect.stringMatching(/AUFS/)]),
    );
    await expectInvalid(extractLayerTar(await writeTar(dir, 'b.tar', rawTar([{ path: '.wh.x/y' }])), join(dir, 'o1'), { ociWhiteouts: true }), /whiteout name/);
    await expectInvalid(extractLayerTar(await writeTar(dir, 'b.tar', rawTar([{ path: 'a/.wh.' }])), join(dir, 'o2'), { ociWhiteouts: true }), /malformed whiteout/);
  });
});
