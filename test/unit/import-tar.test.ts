// extractLayerTar: sanitisation (.., absolute paths, symlink escapes, devices, hard links),
// compression detection by magic bytes, OCI whiteouts (also podman's regular-file
// whiteouts with a link name), PAX records. Tars are built here with node-tar: `tar.c`
// from real directories for the ordinary cases, and node-tar's Header/Pax encoders for
// the hostile ones that no directory on disk can produce. Then importTar / importArchive
// on hand-made archives: error kinds and messages, sanitisation notes; and the device
// check of buildErofs. Checks of owners, whiteouts, devices and trusted.* xattrs need
// root (skipped otherwise); everything lives in one temp dir.
import { execa } from 'execa';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync } from 'node:fs';
import { chmod, lstat, mkdir, readdir, readFile, readlink, rm, stat, symlink, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { gzipSync } from 'node:zlib';
import * as tar from 'tar';
import { afterAll, describe, expect, it } from 'vitest';
import { isDsecError } from '../../daemon/errors.js';
import { buildErofs, findForbiddenDevice } from '../../daemon/image/erofs.js';
import { importArchive, importArchiveWithNotes, importTar, importTarWithNotes, type ImportProgress } from '../../daemon/image/import/oci.js';
import { detectCompression, extractLayerTar, normaliseEntryPath } from '../../daemon/image/import/tar.js';
import { LayerStore } from '../../daemon/image/layer-store.js';

const isRoot = process.getuid?.() === 0;
const hasMkfs = ['/usr/bin/mkfs.erofs', '/usr/sbin/mkfs.erofs', '/sbin/mkfs.erofs'].some((p) => existsSync(p));
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
  type?: 'File' | 'Directory' | 'SymbolicLink' | 'Link' | 'CharacterDevice' | 'BlockDevice' | 'FIFO' | 'SparseFile' | 'GNUDumpDir';
  body?: string;
  linkpath?: string;
  mode?: number;
  uid?: number;
  gid?: number;
  devmaj?: number;
  devmin?: number;
  mtime?: Date;
  /** PAX records written in an extended header before this entry. */
  pax?: { path?: string; linkpath?: string; uid?: number; gid?: number; mtime?: Date };
}

/** Encodes entries as a tar with node-tar's Header (no checks: hostile archives are the point). */
function rawTar(entries: RawEntry[]): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const body = Buffer.from(e.body ?? '');
    const type = e.type ?? 'File';
    if (e.pax) blocks.push(new tar.Pax({ ...e.pax }).encode());
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
    await expectInvalid(extractLayerTar(await writeTar(dir, 'z.tar', Buffer.alloc(0)), join(dir, 'o3'), { ociWhiteouts: false }), /has no entries \(it is 0 bytes long\)/);
    // Truncated inside a header, inside a body (at a block boundary and not), and garbage after a valid entry.
    await expectInvalid(extractLayerTar(await writeTar(dir, 'h.tar', good.subarray(0, 300)), join(dir, 'o7'), { ociWhiteouts: false }), /not a valid tar/);
    await expectInvalid(extractLayerTar(await writeTar(dir, 'b.tar', good.subarray(0, 1000)), join(dir, 'o8'), { ociWhiteouts: false }), /not a valid tar/);
    await expectInvalid(
      extractLayerTar(await writeTar(dir, 'x.tar', Buffer.concat([good.subarray(0, 2560), randomBytes(512)])), join(dir, 'o9'), { ociWhiteouts: false }),
      /not a valid tar/,
    );
    await expectInvalid(extractLayerTar(await writeTar(dir, 'gz0.tar', gzipSync(Buffer.alloc(0))), join(dir, 'o10'), { ociWhiteouts: false }), /not a valid tar/);
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

  it.skipIf(!isRoot)('takes podman whiteouts: .wh.* entries of any type, a regular file with a link name included', async () => {
    const { dir, out } = await fresh();
    // As podman writes a layer from `RUN rm /etc/a /etc/b /etc/c`: the first whiteout a plain
    // empty file, the later ones sharing its inode (typeflag 0 + link name, or a hard link).
    const data = rawTar([
      { path: 'etc', type: 'Directory' },
      { path: 'etc/.wh.a', mode: 0 },
      { path: 'etc/.wh.b', mode: 0, linkpath: 'etc/.wh.a' },
      { path: 'etc/.wh.c', type: 'Link', linkpath: 'etc/.wh.a' },
      { path: 'etc/.wh.d', body: 'a body nobody reads\n'.repeat(100) }, // skipped, and parsing goes on after it
      { path: 'etc/hostname', body: 'h\n' },
    ]);
    expect(data.subarray(2 * 512 + 156, 2 * 512 + 157 + 9).toString('latin1')).toBe('0etc/.wh.a'); // really typeflag 0 with a link name
    const r = await extractLayerTar(await writeTar(dir, 'p.tar', data), out, { ociWhiteouts: true });
    for (const name of ['a', 'b', 'c', 'd']) {
      const st = await lstat(join(out, 'etc', name));
      expect(st.isCharacterDevice()).toBe(true);
      expect(st.rdev).toBe(0);
    }
    expect((await readdir(join(out, 'etc'))).sort()).toEqual(['a', 'b', 'c', 'd', 'hostname']);
    expect(await readFile(join(out, 'etc/hostname'), 'utf8')).toBe('h\n');
    expect(r).toMatchObject({ entries: 6, whiteouts: 4 });
    expect(r.sanitised).toEqual([]); // podman's quirk is not worth a note
  });

  it('ignores the link name of a regular-file entry (GNU tar and Go do too), and says so', async () => {
    const { dir, out } = await fresh();
    const r = await extractLayerTar(
      await writeTar(dir, 'l.tar', rawTar([{ path: 'a', body: 'A' }, { path: 'b', body: 'own body', linkpath: 'a' }, { path: '.wh.x', linkpath: 'a' }])),
      out,
      { ociWhiteouts: false },
    );
    expect(await readFile(join(out, 'b'), 'utf8')).toBe('own body');
    expect((await stat(join(out, 'b'))).ino).not.toBe((await stat(join(out, 'a'))).ino);
    expect(await readFile(join(out, '.wh.x'), 'utf8')).toBe(''); // no whiteout conversion here
    expect(r.sanitised).toEqual([expect.stringMatching(/^ignored the link name of regular-file entries \(2 entries, e\.g\. "b"\)$/)]);
  });

  it('reads PAX records: long path and link target, uid/gid above the ustar range, sub-second mtime', async () => {
    const { dir, out } = await fresh();
    const long = `${'d'.repeat(120)}/${'f'.repeat(120)}`;
    const r = await extractLayerTar(
      await writeTar(
        dir,
        'pax.tar',
        rawTar([
          { path: 'short-name', body: 'pax body', pax: { path: long, uid: 3_000_000, gid: 3_000_001, mtime: new Date(1_700_000_000_500) } },
          { path: 'l', type: 'SymbolicLink', linkpath: 'x', pax: { linkpath: `/${'t'.repeat(200)}` } },
        ]),
      ),
      out,
      { ociWhiteouts: false },
    );
    expect(r.entries).toBe(2);
    expect(await readFile(join(out, long), 'utf8')).toBe('pax body');
    expect(await readlink(join(out, 'l'))).toBe(`/${'t'.repeat(200)}`);
    const st = await stat(join(out, long));
    expect(st.mtimeMs).toBe(1_700_000_000_500);
    if (isRoot) expect(st).toMatchObject({ uid: 3_000_000, gid: 3_000_001 });
  });

  it('refuses unknown entry types, links without a target and NUL bytes in names, as InvalidArgument', async () => {
    const { dir } = await fresh();
    for (const [i, entries, re] of [
      [1, [{ path: 'sparse', type: 'SparseFile' }], /unsupported type/],
      [2, [{ path: 'dump', type: 'GNUDumpDir' }], /unsupported type/],
      [3, [{ path: 's', type: 'SymbolicLink', linkpath: '' }], /symlink without a target/],
      [4, [{ path: 'h', type: 'Link', linkpath: '' }], /hard link without a target/],
      [5, [{ path: 'n', body: 'x', pax: { path: 'a\0b' } }], /NUL byte/],
      [6, [{ path: 's', type: 'SymbolicLink', linkpath: 'x', pax: { linkpath: 'a\0b' } }], /NUL byte/],
    ] as const) {
      await expectInvalid(extractLayerTar(await writeTar(dir, `u${i}.tar`, rawTar([...entries] as RawEntry[])), join(dir, `o${i}`), { ociWhiteouts: true }), re);
    }
  });
});

describe('importTar and importArchive: refusals, error kinds, sanitisation notes', () => {
  let store: LayerStore;
  let dir: string;
  const storeRoot = join(base, 'store');

  const leftovers = async () => (await readdir(join(storeRoot, 'tmp'))).filter((f) => f.includes('-import-'));

  /** An OCI image layout in `root` with one layer blob `layer` (bytes as given) and the descriptor `desc` overrides. */
  async function ociLayout(root: string, layer: Buffer, opts: { diffId?: string; desc?: { digest?: string; size?: number } } = {}): Promise<void> {
    await mkdir(join(root, 'blobs/sha256'), { recursive: true });
    const put = async (b: Buffer) => {
      const d = sha(b);
      await writeFile(join(root, 'blobs/sha256', d.slice(7)), b);
      return { digest: d, size: b.length };
    };
    const l = await put(layer);
    const config = await put(Buffer.from(JSON.stringify({ os: 'linux', architecture: 'amd64', config: {}, rootfs: { type: 'layers', diff_ids: [opts.diffId ?? sha(layer)] } })));
    const manifest = await put(
      Buffer.from(
        JSON.stringify({
          schemaVersion: 2,
          mediaType: 'application/vnd.oci.image.manifest.v1+json',
          config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...config },
          layers: [{ mediaType: 'application/vnd.oci.image.layer.v1.tar', ...l, ...opts.desc }],
        }),
      ),
    );
    await writeFile(join(root, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
    await writeFile(join(root, 'index.json'), JSON.stringify({ schemaVersion: 2, manifests: [{ mediaType: 'application/vnd.oci.image.manifest.v1+json', ...manifest }] }));
  }

  const tarOf = async (root: string, name: string) => {
    const f = join(dir, name);
    await execa('tar', ['-C', root, '-cf', f, '.']);
    return f;
  };

  it('refuses an empty tar (0 bytes, or end-of-archive blocks only) the same way, naming no internal function', async () => {
    store = new LayerStore({ root: storeRoot });
    await store.init();
    dir = (await fresh()).dir;
    const empty = await writeTar(dir, 'empty.tar', Buffer.alloc(10240));
    const zero = await writeTar(dir, 'zero.tar', Buffer.alloc(0));
    const emptyGz = await writeTar(dir, 'empty.tar.gz', gzipSync(Buffer.alloc(1024)));
    for (const f of [empty, zero, emptyGz]) {
      for (const run of [() => importTar(store, f, { name: 'e/tar', tag: '1' }), () => importArchive(store, f, { name: 'e/archive', tag: '1' })]) {
        await expect(run()).rejects.toSatisfy((e: unknown) => {
          if (!isDsecError(e, 'InvalidArgument')) throw e;
          expect((e as Error).message).toMatch(new RegExp(`^${f.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}: the archive has no entries`));
          expect((e as Error).message).not.toMatch(/import(Tar|Archive)|extractLayerTar/);
          return true;
        });
      }
    }
    await expect(store.get('e/tar:1')).rejects.toSatisfy((e: unknown) => isDsecError(e, 'NotFound'));
    // A directory is not a tar; a rootfs tar is not an image archive: neither message names a function.
    await expect(importTar(store, dir, { name: 'e/dir', tag: '1' })).rejects.toSatisfy(
      (e: unknown) => isDsecError(e, 'InvalidArgument') && /is a directory, not a tar/.test((e as Error).message) && !/importTar/.test((e as Error).message),
    );
    const rootfs = await writeTar(dir, 'rootfs.tar', rawTar([{ path: 'etc/passwd', body: 'root:x:0:0::/:/bin/sh\n' }]));
    await expect(importArchive(store, rootfs, { name: 'e/notarchive', tag: '1' })).rejects.toSatisfy(
      (e: unknown) => isDsecError(e, 'InvalidArgument') && /imported as type "tar"/.test((e as Error).message) && !/importTar/.test((e as Error).message),
    );
    expect(await leftovers()).toEqual([]);
  });

  it('reports a corrupt archive, a corrupt layer and digest mismatches as InvalidArgument, never Internal', async () => {
    const layer = rawTar([{ path: 'etc/hostname', body: 'x\n' }]);
    const cases: [string, string | (() => Promise<string>), RegExp][] = [
      ['random bytes', () => writeTar(dir, 'random.tar', randomBytes(8192)), /not a valid tar/],
      ['a truncated gzip', () => writeTar(dir, 'trunc.tar.gz', gzipSync(layer).subarray(0, 40)), /gzip|not a valid tar/],
      [
        'a layer blob that is not a tar (digest right)',
        async () => {
          await ociLayout(join(dir, 'l1'), randomBytes(4096));
          return join(dir, 'l1');
        },
        /layer 1\/1 \(sha256:[0-9a-f]{64}\): not a valid tar/,
      ],
      [
        'a descriptor naming a blob the archive does not have',
        async () => {
          await ociLayout(join(dir, 'l2'), layer, { desc: { digest: sha(Buffer.from('other')) } });
          return join(dir, 'l2');
        },
        /is missing from the archive/,
      ],
      [
        'a layer whose diff_id does not match',
        async () => {
          await ociLayout(join(dir, 'l3'), layer, { diffId: sha(Buffer.from('other')) });
          return tarOf(join(dir, 'l3'), 'l3.tar');
        },
        /rootfs\.diff_ids says sha256:/,
      ],
      [
        'a descriptor size that lies',
        async () => {
          await ociLayout(join(dir, 'l4'), layer, { desc: { size: layer.length + 1 } });
          return join(dir, 'l4');
        },
        /descriptor says \d+; the archive is corrupt/,
      ],
      [
        'a truncated oci-archive',
        async () => {
          await ociLayout(join(dir, 'l5'), layer);
          const whole = await readFile(await tarOf(join(dir, 'l5'), 'l5.tar'));
          return writeTar(dir, 'l5-trunc.tar', whole.subarray(0, whole.length - 3000));
        },
        /not a valid tar/,
      ],
    ];
    for (const [what, make, re] of cases) {
      const path = typeof make === 'string' ? make : await make();
      await expect(importArchive(store, path, { name: 'e/corrupt', tag: '1' }), what).rejects.toSatisfy((e: unknown) => {
        if (!isDsecError(e, 'InvalidArgument')) throw new Error(`${what}: ${String(e)}`, { cause: e });
        expect((e as Error).message, what).toMatch(re);
        return true;
      });
    }
    // The tampered blob names the digest it was asked for.
    const l6 = join(dir, 'l6');
    await ociLayout(l6, layer);
    const blob = join(l6, 'blobs/sha256', sha(layer).slice(7));
    const bytes = await readFile(blob);
    bytes[bytes.indexOf(Buffer.from('x\n'))] = 'y'.charCodeAt(0);
    await writeFile(blob, bytes);
    await expect(importArchive(store, l6, { name: 'e/corrupt', tag: '1' })).rejects.toSatisfy(
      (e: unknown) => isDsecError(e, 'InvalidArgument') && (e as Error).message.includes(`${sha(layer)}: the blob hashes to sha256:`),
    );
    await expect(store.get('e/corrupt:1')).rejects.toSatisfy((e: unknown) => isDsecError(e, 'NotFound'));
    expect(await leftovers()).toEqual([]);
  });

  it.skipIf(!hasMkfs)('returns and reports what was sanitised: one progress event per note, then a summary', async () => {
    const data = rawTar([
      { path: '/etc/hostname', body: 'h\n' },
      { path: '/etc/motd', body: 'm\n' },
      { path: 'dev', type: 'Directory' },
      { path: 'dev/null', type: 'CharacterDevice', devmaj: 1, devmin: 3 },
      { path: 'b', body: 'b', linkpath: 'etc/motd' },
    ]);
    const f = await writeTar(dir, 'notes.tar', data);
    const events: ImportProgress[] = [];
    const r = await importTarWithNotes(store, f, { name: 'n/tar', tag: '1', onProgress: (p) => events.push(p) });
    const want = [
      'stripped leading "/" (2 entries, e.g. "/etc/hostname")',
      'dropped device node below /dev (runc mounts its own /dev there) (1 entry, e.g. "dev/null")',
      'ignored the link name of regular-file entries (1 entry, e.g. "b")',
      ...(isRoot ? [] : ['ownership not applied: not running as root']),
    ];
    expect(r.notes).toEqual(want);
    expect(r.manifest).toEqual(await store.get('n/tar:1'));
    const san = events.filter((e) => e.phase === 'sanitised');
    expect(san.map((e) => e.message)).toEqual([...want, expect.stringMatching(/^sanitised: \d+ kinds of entries changed instead of refused/)]);
    expect(san.slice(0, -1).every((e) => !e.summary && e.layer === 1)).toBe(true);
    expect(san.at(-1)?.summary).toBe(true);
    // Order: the notes come after the layer's extraction and before the manifest.
    const phases = events.map((e) => e.phase).filter((p, i, a) => p !== a[i - 1]);
    expect(phases).toEqual(['layer', 'sanitised', 'build', 'sanitised', 'manifest']);
    expect(await importTar(store, f, { name: 'n/tar', tag: '2' })).toMatchObject({ layers: r.manifest.layers });

    // The same tree as the layer of an OCI layout in an oci-archive: notes name the layer; the archive's own are prefixed.
    const lay = join(dir, 'notes-layout');
    await ociLayout(lay, data);
    const ra = await importArchiveWithNotes(store, await tarOf(lay, 'notes-layout.tar'), { name: 'n/oci', tag: '1' });
    expect(ra.manifest.layers).toEqual(r.manifest.layers);
    expect(ra.notes.filter((n) => n.startsWith('layer 1/1: '))).toEqual(want.map((w) => `layer 1/1: ${w}`));
    expect(ra.notes.filter((n) => !n.startsWith('layer 1/1: ') && !n.startsWith('archive: '))).toEqual([]);
    const clean = await importArchiveWithNotes(store, lay, { name: 'n/oci', tag: '2' }); // a directory: no archive to unpack
    expect(clean.notes).toEqual(want.map((w) => `layer 1/1: ${w}`));
    expect(await leftovers()).toEqual([]);
  });
});

describe.skipIf(!isRoot || !hasMkfs)('building a layer from a directory with device nodes (root)', () => {
  it('refuses block and character devices other than a whiteout, naming the path; skipDeviceCheck skips the walk', async () => {
    const { dir } = await fresh();
    const tree = join(dir, 'tree');
    await mkdir(join(tree, 'usr/lib/x'), { recursive: true });
    await writeFile(join(tree, 'usr/lib/x/f'), 'f');
    await execa('mknod', ['-m', '0000', join(tree, 'usr/gone'), 'c', '0', '0']); // an overlay whiteout: fine
    await execa('mkfifo', [join(tree, 'usr/fifo')]);
    expect(await findForbiddenDevice(tree)).toBeUndefined();
    const ok = await buildErofs(tree, join(dir, 'ok.erofs'));
    expect(ok.digest).toMatch(/^sha256:/);

    await execa('mknod', ['-m', '0600', join(tree, 'usr/lib/x/sda'), 'b', '8', '0']);
    expect(await findForbiddenDevice(tree)).toEqual({ path: 'usr/lib/x/sda', kind: 'block', major: 8, minor: 0 });
    await expectInvalid(buildErofs(tree, join(dir, 'bad.erofs')), new RegExp(`block device ${join(tree, 'usr/lib/x/sda')} \\(8:0\\)`));
    expect(existsSync(join(dir, 'bad.erofs'))).toBe(false);
    await rm(join(tree, 'usr/lib/x/sda'));
    await execa('mknod', ['-m', '0600', join(tree, 'mem'), 'c', '1', '1']);
    await execa('mknod', ['-m', '0600', join(tree, 'big'), 'c', '300', '70000']);
    const store = new LayerStore({ root: join(dir, 'store') });
    await store.init();
    await expectInvalid(store.addLayerFromDir(tree), /character device .*\/(mem \(1:1\)|big \(300:70000\))/);
    await rm(join(tree, 'mem'));
    expect(await findForbiddenDevice(tree)).toEqual({ path: 'big', kind: 'character', major: 300, minor: 70000 });
    // Internal callers that made the tree themselves may skip the walk (mkfs then packs what is there).
    await expect(store.addLayerFromDir(tree, { skipDeviceCheck: true })).resolves.toMatchObject({ digest: expect.stringMatching(/^sha256:/) });
  });
});
