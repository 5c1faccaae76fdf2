/**
 * The agent's file operations (FILE_READ … FILE_SYMLINK) and the client's file API, with
 * the agent run as a normal (non-PID-1) process on the host, like test/unit/agent.test.ts.
 * Outside a container the agent's root is the host's: these tests check the path rules
 * (absolute, no '..', no /proc magic links), not a sandbox boundary. Needs root (user
 * switching).
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { execFileSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { AgentFileError, FileWriteFlag, fileErrorKind } from '../../daemon/agent/client.js';
import {
  FileTag, FrameType, decodeFileEntry, decodeFileError, decodeFileInfo, decodeU64, encodeFileInfo,
  encodeFileRequest, encodeTlv, encodeU32,
} from '../../daemon/agent/protocol.js';
import { AgentHarness, BB, buildAgent, waitFor } from '../fixtures/agent.js';

const ENV = ['PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin'];
const MiB = 1 << 20;
const isRoot = process.getuid?.() === 0;

// ---- harness (test/fixtures/agent.ts, same fd hand-over as agent.test.ts) --------------

// 0755: user 65534 must be able to reach the test directories.
const harness = new AgentHarness({ prefix: 'dsec-agent-files-test-', dirMode: 0o755, removeAgentDirs: true });

function rssKb(pid: number): number {
  return Number(/^VmRSS:\s+(\d+)/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]);
}

/** Sample the agent's RSS every 20 ms until stop() is called; returns the maximum (KiB). */
function rssSampler(pid: number): { stop(): number } {
  let max = rssKb(pid);
  const t = setInterval(() => { try { max = Math.max(max, rssKb(pid)); } catch { /* exited */ } }, 20);
  return { stop: () => { clearInterval(t); return Math.max(max, rssKb(pid)); } };
}

async function readAll(r: { stream: Readable; done: Promise<void> }): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const b of r.stream) parts.push(b as Buffer);
  await r.done;
  return Buffer.concat(parts);
}

/** Rejection of p as a DsecError-like object (kind, message, errno). */
async function failure(p: Promise<unknown>): Promise<{ kind: string; message: string; errno?: number }> {
  try {
    await p;
  } catch (e) {
    return e as { kind: string; message: string; errno?: number };
  }
  throw new Error('expected a rejection');
}

beforeAll(() => buildAgent());

afterEach(() => harness.cleanup());

afterAll(() => harness.removeAll());

// ---- codec ----------------------------------------------------------------------------

describe('protocol codec: files', () => {
  it('encodes file requests and decodes FILE_INFO / FILE_ENTRY / FILE_ERROR', () => {
    const p = encodeFileRequest({ path: '/a/b', user: '1:2', offset: 5, length: 7, mode: 0o640, flags: 9, nofollow: true, recursive: true, target: 't' });
    const tags = new Map<number, Buffer>();
    for (let off = 0; off < p.length;) {
      const len = p.readUInt32BE(off + 1);
      tags.set(p[off], p.subarray(off + 5, off + 5 + len));
      off += 5 + len;
    }
    expect(tags.get(FileTag.PATH)?.toString()).toBe('/a/b');
    expect(tags.get(FileTag.USER)?.toString()).toBe('1:2');
    expect(tags.get(FileTag.OFFSET)?.readBigUInt64BE(0)).toBe(5n);
    expect(tags.get(FileTag.LENGTH)?.readBigUInt64BE(0)).toBe(7n);
    expect(tags.get(FileTag.MODE)?.readUInt32BE(0)).toBe(0o640);
    expect([...(tags.get(FileTag.FLAGS) ?? [])]).toEqual([9]);
    expect([...(tags.get(FileTag.NOFOLLOW) ?? [])]).toEqual([1]);
    expect([...(tags.get(FileTag.RECURSIVE) ?? [])]).toEqual([1]);
    expect(tags.get(FileTag.TARGET)?.toString()).toBe('t');
    expect(() => encodeFileRequest({ path: '/a\0' })).toThrow(/NUL/);
    expect(() => encodeFileRequest({ path: '/a', mode: 0o10000 })).toThrow(/mode/);
    expect(() => encodeFileRequest({ path: '' })).toThrow(/path/);

    const info = { size: 123, rawMode: 0o120777, uid: 1, gid: 2, mtimeNs: 1_500_000_000_123_456_789n, type: 'symlink' as const, target: '/x' };
    expect(decodeFileInfo(encodeFileInfo(info))).toMatchObject({ ...info, mode: 0o777, mtimeMs: 1_500_000_000_123.4568 });
    const fixed = encodeFileInfo({ ...info, target: undefined });
    const name = Buffer.from('näme');
    const nl = Buffer.alloc(2);
    nl.writeUInt16BE(name.length);
    expect(decodeFileEntry(Buffer.concat([fixed, nl, name, Buffer.from('tgt')]))).toMatchObject({ name: 'näme', target: 'tgt', type: 'symlink' });
    const err = Buffer.concat([encodeU32(13), Buffer.from('write /x: Permission denied')]);
    expect(decodeFileError(err)).toEqual({ errno: 13, message: 'write /x: Permission denied' });
    expect([2, 17, 13, 1, 22, 40, 18, 21, 20, 28, 122, 5].map(fileErrorKind)).toEqual([
      'NotFound', 'AlreadyExists', 'FailedPrecondition', 'FailedPrecondition', 'InvalidArgument', 'InvalidArgument',
      'InvalidArgument', 'FailedPrecondition', 'FailedPrecondition', 'ResourceExhausted', 'ResourceExhausted', 'Internal',
    ]);
  });
});

// ---- transfer ---------------------------------------------------------------------------

describe('dsec-agent file transfer', () => {
  it('writes and reads back 200 MiB with bounded agent memory', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const file = path.join(a.dir, 'big.bin');
    const total = 200 * MiB;
    const block = randomBytes(MiB);
    const hashIn = createHash('sha256');
    async function* gen(): AsyncGenerator<Buffer> {
      for (let i = 0; i < total / MiB; i++) {
        const b = Buffer.from(block);
        b.writeUInt32BE(i, 0); // no two MiB alike: reordering would show
        hashIn.update(b);
        yield b;
      }
    }
    const before = rssKb(a.pid);
    let rss = rssSampler(a.pid);
    const w = await c.writeFile(file, Readable.from(gen()), { mode: 0o600 });
    const writeMax = rss.stop();
    expect(w.bytes).toBe(total);
    const st = fs.statSync(file);
    expect([st.size, st.mode & 0o7777]).toEqual([total, 0o600]);
    expect(writeMax).toBeLessThan(32 * 1024);

    rss = rssSampler(a.pid);
    const r = c.readFile(file);
    const hashOut = createHash('sha256');
    let got = 0;
    for await (const b of r.stream) {
      hashOut.update(b as Buffer);
      got += (b as Buffer).length;
      expect((b as Buffer).length).toBeLessThanOrEqual(256 * 1024);
    }
    await r.done;
    const readMax = rss.stop();
    expect((await r.info).size).toBe(total);
    expect(got).toBe(total);
    expect(hashOut.digest('hex')).toBe(hashIn.digest('hex'));
    expect(readMax).toBeLessThan(32 * 1024);
    console.log(`agent VmRSS: start ${before} KiB, max during write ${writeMax} KiB, during read ${readMax} KiB`);
  }, 120_000);

  it('bounds memory on both ends when the reader is slow (socket paused)', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const file = path.join(a.dir, 'slow.bin');
    const data = randomBytes(48 * MiB);
    fs.writeFileSync(file, data);
    const rss = rssSampler(a.pid);
    const r = c.readFile(file);
    await r.info;
    // Do not consume for a while: the agent must stop reading the file, and the client
    // must not buffer the whole file either.
    await new Promise((res) => setTimeout(res, 800));
    expect(r.stream.readableLength).toBeLessThan(4 * MiB);
    // Other streams of this connection wait while it is paused; a second connection is
    // unaffected.
    const c2 = await harness.connect(a);
    expect(await c2.ping()).toBeGreaterThanOrEqual(0);
    const out = await readAll(r);
    expect(rss.stop()).toBeLessThan(32 * 1024);
    expect(out.equals(data)).toBe(true);
    expect(await c.ping()).toBeGreaterThanOrEqual(0); // resumed
  }, 60_000);

  it('reads a range, and cancels a read when the stream is destroyed', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const file = path.join(a.dir, 'range.bin');
    const data = randomBytes(3 * MiB + 5);
    fs.writeFileSync(file, data);
    expect((await readAll(c.readFile(file, { offset: MiB + 3, length: 1000 }))).equals(data.subarray(MiB + 3, MiB + 1003))).toBe(true);
    expect((await readAll(c.readFile(file, { offset: 3 * MiB }))).equals(data.subarray(3 * MiB))).toBe(true);
    expect((await readAll(c.readFile(file, { offset: 10 * MiB }))).length).toBe(0);
    const empty = path.join(a.dir, 'empty');
    fs.writeFileSync(empty, '');
    const e = c.readFile(empty);
    expect((await readAll(e)).length).toBe(0);
    expect((await e.info).size).toBe(0);

    const big = path.join(a.dir, 'cancel.bin');
    fs.writeFileSync(big, Buffer.alloc(64 * MiB));
    const r = c.readFile(big);
    await r.info;
    r.stream.destroy();
    await expect(r.done).rejects.toThrow(/cancelled/);
    await waitFor('the cancellation to be logged', () => fs.readFileSync(a.logPath, 'utf8').includes('cancelled by the client'));
    expect(await c.ping()).toBeGreaterThanOrEqual(0);
    expect((await c.stat(file)).size).toBe(data.length);
  });

  it('creates, replaces atomically, appends, and honours EXCLUSIVE / no-CREATE / PARENTS', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const f = path.join(a.dir, 'f.txt');
    expect(await c.writeFile(f, Buffer.from('one\n'))).toEqual({ bytes: 4 });
    expect(fs.statSync(f).mode & 0o7777).toBe(0o644); // default mode, exact (no umask)
    fs.chmodSync(f, 0o640);
    const ino = fs.statSync(f).ino;
    const held = fs.openSync(f, 'r');
    try {
      await c.writeFile(f, Readable.from(['two', '\n', Buffer.from('three\n')]));
      expect(fs.readFileSync(f, 'utf8')).toBe('two\nthree\n');
      expect(fs.statSync(f).ino).not.toBe(ino); // renamed over: a new inode
      expect(fs.statSync(f).mode & 0o7777).toBe(0o640); // the replaced file's mode is kept
      expect(fs.readFileSync(held, 'utf8')).toBe('one\n'); // a reader of the old file is undisturbed
    } finally {
      fs.closeSync(held);
    }
    await c.writeFile(f, Buffer.from('four\n'), { flags: FileWriteFlag.APPEND });
    expect(fs.readFileSync(f, 'utf8')).toBe('two\nthree\nfour\n');
    await c.writeFile(f, Buffer.from('x'), { mode: 0o4755 });
    expect(fs.statSync(f).mode & 0o7777).toBe(0o4755);

    expect(await failure(c.writeFile(f, Buffer.from('x'), { flags: FileWriteFlag.EXCLUSIVE }))).toMatchObject({ kind: 'AlreadyExists', errno: 17 });
    expect(await failure(c.writeFile(path.join(a.dir, 'missing'), Buffer.from('x'), { flags: 0 })))
      .toMatchObject({ kind: 'NotFound', message: expect.stringMatching(/^write .*missing: No such file or directory$/) });
    await c.writeFile(path.join(a.dir, 'new-excl'), Buffer.from('e'), { flags: FileWriteFlag.EXCLUSIVE });
    expect(fs.readFileSync(path.join(a.dir, 'new-excl'), 'utf8')).toBe('e');
    const deep = path.join(a.dir, 'p/q/r/file');
    expect(await failure(c.writeFile(deep, Buffer.from('d')))).toMatchObject({ kind: 'NotFound' });
    await c.writeFile(deep, Buffer.from('d'), { flags: FileWriteFlag.CREATE | FileWriteFlag.PARENTS });
    expect(fs.readFileSync(deep, 'utf8')).toBe('d');
    expect(fs.statSync(path.join(a.dir, 'p/q')).mode & 0o777).toBe(0o755);
    expect(await failure(c.writeFile(a.dir, Buffer.from('x')))).toMatchObject({ kind: 'FailedPrecondition', errno: 21 });
    expect(fs.readdirSync(a.dir).filter((n) => n.includes('.dsec-'))).toEqual([]); // no temp files left
  });

  it('aborts a write whose source fails, leaving the old file and no temp file', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const f = path.join(a.dir, 'keep.txt');
    fs.writeFileSync(f, 'original');
    async function* failing(): AsyncGenerator<Buffer> {
      yield Buffer.alloc(3 * MiB, 1);
      throw new Error('source broke');
    }
    await expect(c.writeFile(f, Readable.from(failing()))).rejects.toThrow('source broke');
    await waitFor('the abort to be logged', () => fs.readFileSync(a.logPath, 'utf8').includes('cancelled by the client'));
    expect(fs.readFileSync(f, 'utf8')).toBe('original');
    expect(fs.readdirSync(a.dir).filter((n) => n.includes('.dsec-'))).toEqual([]);

    // Connection loss mid-write: same.
    const c2 = await harness.connect(a);
    let fed = false;
    const slow = new Readable({ read() { if (!fed) { fed = true; this.push(Buffer.alloc(MiB)); } } });
    const p = c2.writeFile(f, slow);
    await waitFor('the temp file to appear', () => fs.readdirSync(a.dir).some((n) => n.includes('.dsec-')));
    c2.close();
    await expect(p).rejects.toThrow(/agent connection lost/);
    await waitFor('the temp file to be removed', () => !fs.readdirSync(a.dir).some((n) => n.includes('.dsec-')));
    expect(fs.readFileSync(f, 'utf8')).toBe('original');
  });
});

// ---- metadata operations ---------------------------------------------------------------

describe('dsec-agent stat, list, mkdir, remove, symlink', () => {
  it('stats files, directories and symlinks', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const f = path.join(a.dir, 'file');
    fs.writeFileSync(f, 'hello');
    fs.chmodSync(f, 0o640);
    fs.symlinkSync('file', path.join(a.dir, 'link'));
    const st = await c.stat(f);
    const ref = fs.statSync(f, { bigint: true });
    expect(st).toMatchObject({ size: 5, mode: 0o640, type: 'file', uid: 0, gid: 0, mtimeNs: ref.mtimeNs });
    expect(st.target).toBeUndefined();
    expect(await c.stat(path.join(a.dir, 'link'))).toMatchObject({ type: 'file', size: 5 }); // followed
    expect(await c.stat(path.join(a.dir, 'link'), { nofollow: true })).toMatchObject({ type: 'symlink', size: 4, target: 'file' });
    expect(await c.stat(a.dir)).toMatchObject({ type: 'dir', mode: 0o755 });
    expect(await c.stat('/dev/null')).toMatchObject({ type: 'other' });
    expect(await c.stat('/')).toMatchObject({ type: 'dir' });
    expect(await c.stat(`${a.dir}//./file/`)).toMatchObject({ size: 5 }); // normalized
    const missing = await failure(c.stat(path.join(a.dir, 'nope')));
    expect(missing).toBeInstanceOf(AgentFileError);
    expect(missing).toMatchObject({ kind: 'NotFound', errno: 2, message: `stat ${a.dir}/nope: No such file or directory` });
  });

  it('lists a directory with types, sizes, and symlink targets', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const d = path.join(a.dir, 'd');
    fs.mkdirSync(d);
    fs.writeFileSync(path.join(d, 'f'), 'abc');
    fs.mkdirSync(path.join(d, 'sub'));
    fs.symlinkSync('/etc/hostname', path.join(d, 'ln'));
    fs.writeFileSync(path.join(d, 'ünï cødé'), '');
    const entries = (await c.list(d)).sort((x, y) => x.name.localeCompare(y.name));
    expect(entries.map((e) => [e.name, e.type, e.size, e.target])).toEqual([
      ['f', 'file', 3, undefined], ['ln', 'symlink', 13, '/etc/hostname'], ['sub', 'dir', expect.any(Number), undefined],
      ['ünï cødé', 'file', 0, undefined],
    ]);
    expect(await c.list(path.join(d, 'sub'))).toEqual([]);
    expect(await failure(c.list(path.join(d, 'f')))).toMatchObject({ kind: 'FailedPrecondition', errno: 20 });

    // A large directory streams in many frames.
    const big = path.join(a.dir, 'big');
    fs.mkdirSync(big);
    for (let i = 0; i < 5000; i++) fs.writeFileSync(path.join(big, `entry-${i}`), '');
    const all = await c.list(big);
    expect(all).toHaveLength(5000);
    expect(new Set(all.map((e) => e.name)).size).toBe(5000);
  });

  it('mkdir (with and without parents), symlink and remove (recursive)', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const d = path.join(a.dir, 'm');
    await c.mkdir(d, { mode: 0o700 });
    expect(fs.statSync(d).mode & 0o7777).toBe(0o700);
    expect(await failure(c.mkdir(d))).toMatchObject({ kind: 'AlreadyExists' });
    expect(await failure(c.mkdir(path.join(a.dir, 'x/y')))).toMatchObject({ kind: 'NotFound' });
    await c.mkdir(path.join(a.dir, 'x/y/z'), { parents: true, mode: 0o750 });
    expect(fs.statSync(path.join(a.dir, 'x/y/z')).mode & 0o7777).toBe(0o750);
    expect(fs.statSync(path.join(a.dir, 'x')).mode & 0o7777).toBe(0o755);
    await c.mkdir(path.join(a.dir, 'x/y/z'), { parents: true }); // exists: fine with parents
    fs.writeFileSync(path.join(a.dir, 'plain'), '');
    expect(await failure(c.mkdir(path.join(a.dir, 'plain/sub'), { parents: true }))).toMatchObject({ kind: 'FailedPrecondition', errno: 20 });

    await c.symlink(path.join(a.dir, 'x/link'), '../plain');
    expect(fs.readlinkSync(path.join(a.dir, 'x/link'))).toBe('../plain');
    expect(await failure(c.symlink(path.join(a.dir, 'x/link'), 'other'))).toMatchObject({ kind: 'AlreadyExists' });

    // A tree with a symlink to something outside it: remove -r must not follow it.
    fs.writeFileSync(path.join(a.dir, 'x/y/z/f1'), '1');
    fs.mkdirSync(path.join(a.dir, 'x/y/z/deeper/still'), { recursive: true });
    fs.writeFileSync(path.join(a.dir, 'x/y/z/deeper/still/f2'), '2');
    fs.symlinkSync(d, path.join(a.dir, 'x/y/dirlink'));
    expect(await failure(c.remove(path.join(a.dir, 'x')))).toMatchObject({ kind: 'FailedPrecondition', errno: 39 });
    await c.remove(path.join(a.dir, 'x/link'));
    expect(fs.existsSync(path.join(a.dir, 'plain'))).toBe(true); // the link went, not its target
    await c.remove(path.join(a.dir, 'x'), { recursive: true });
    expect(fs.existsSync(path.join(a.dir, 'x'))).toBe(false);
    expect(fs.existsSync(d)).toBe(true); // not followed through dirlink
    await c.remove(d); // an empty directory without recursive
    expect(fs.existsSync(d)).toBe(false);
    await c.remove(path.join(a.dir, 'plain'), { recursive: true }); // a file with recursive
    expect(await failure(c.remove(path.join(a.dir, 'plain')))).toMatchObject({ kind: 'NotFound' });
    expect(await failure(c.remove('/'))).toMatchObject({ kind: 'FailedPrecondition', message: expect.stringMatching(/refusing/) });
  });
});

// ---- path rules and users ---------------------------------------------------------------

describe('dsec-agent file path rules and users', () => {
  it('refuses relative paths and any ".." component', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    fs.writeFileSync(path.join(a.dir, 'f'), 'x');
    for (const p of ['relative/path', `${a.dir}/../${path.basename(a.dir)}/f`, `${a.dir}/..`, '/..', '..']) {
      const e = await failure(c.stat(p));
      expect(e).toMatchObject({ kind: 'InvalidArgument', errno: 22 });
      expect(e.message).toMatch(/invalid path: it must be absolute, without NUL bytes or '\.\.' components/);
      expect(await failure(c.writeFile(`${p}/new`, Buffer.from('x')))).toMatchObject({ kind: 'InvalidArgument' });
    }
    expect(await c.stat(`${a.dir}/...`).catch((e: { kind: string }) => e.kind)).toBe('NotFound'); // '...' is a name
    expect(await failure(c.stat(`/${'a'.repeat(300)}`))).toMatchObject({ kind: 'InvalidArgument', errno: 36 });
  });

  it('refuses /proc magic links, directly or through a symlink', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const link = path.join(a.dir, 'escape');
    fs.symlinkSync('/proc/self/root/etc/passwd', link);
    for (const p of [link, '/proc/self/root/etc/passwd', `/proc/${a.pid}/cwd`, '/proc/self/fd/0']) {
      const e = await failure(readAll(c.readFile(p)));
      expect(e).toMatchObject({ kind: 'InvalidArgument', errno: 40 });
      expect(e.message).toMatch(/magic link/);
    }
    expect(await failure(c.list('/proc/self/root/'))).toMatchObject({ kind: 'InvalidArgument' });
    expect(await failure(c.writeFile(path.join('/proc/self/cwd', a.dir, 'x'), Buffer.from('x')))).toMatchObject({ kind: 'InvalidArgument' });
    // The link itself can be inspected, and ordinary symlinks are followed.
    expect(await c.stat(link, { nofollow: true })).toMatchObject({ type: 'symlink', target: '/proc/self/root/etc/passwd' });
    fs.symlinkSync('/etc/passwd', path.join(a.dir, 'ordinary'));
    expect((await readAll(c.readFile(path.join(a.dir, 'ordinary')))).toString()).toBe(fs.readFileSync('/etc/passwd', 'utf8'));
  });

  it('reads regular files only (directories, devices and FIFOs are refused without blocking)', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    expect(await failure(readAll(c.readFile(a.dir)))).toMatchObject({ kind: 'FailedPrecondition', errno: 21 });
    expect(await failure(readAll(c.readFile('/dev/null')))).toMatchObject({ kind: 'InvalidArgument', message: '/dev/null: not a regular file'.replace(/^/, 'read ') });
    const fifo = path.join(a.dir, 'fifo');
    execFileSync('mkfifo', [fifo]);
    expect(await failure(readAll(c.readFile(fifo)))).toMatchObject({ kind: 'InvalidArgument' });
    expect(await failure(readAll(c.readFile(path.join(a.dir, 'nope'))))).toMatchObject({ kind: 'NotFound' });
    const r = c.readFile(path.join(a.dir, 'nope'));
    await expect(r.info).rejects.toMatchObject({ kind: 'NotFound' });
    expect(r.stream.destroyed).toBe(true);
  });

  it.skipIf(!isRoot)('runs as the requested user and always restores the agent identity', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const ro = path.join(a.dir, 'root-only');
    fs.mkdirSync(ro, { mode: 0o755 });
    fs.writeFileSync(path.join(ro, 'secret'), 's', { mode: 0o600 });
    const denied = await failure(c.writeFile(path.join(ro, 'f'), Buffer.from('x'), { user: '65534' }));
    expect(denied).toMatchObject({ kind: 'FailedPrecondition', errno: 13 });
    expect(denied.message).toMatch(/^write .*root-only\/f: Permission denied$/);
    expect(await failure(readAll(c.readFile(path.join(ro, 'secret'), { user: 'nobody' })))).toMatchObject({ kind: 'FailedPrecondition', errno: 13 });
    expect(await failure(c.mkdir(path.join(ro, 'd'), { user: 'nobody' }))).toMatchObject({ kind: 'FailedPrecondition' });
    expect(await failure(c.remove(path.join(ro, 'secret'), { user: 'nobody' }))).toMatchObject({ kind: 'FailedPrecondition' });
    expect(await failure(c.stat('/', { user: 'no-such-user-dsec' }))).toMatchObject({ kind: 'NotFound', message: 'stat /: user: no-such-user-dsec: unknown user' });
    // Root (the default) still can: the identity was restored after each failure.
    await c.writeFile(path.join(ro, 'f'), Buffer.from('x'));
    expect((await readAll(c.readFile(path.join(ro, 'secret')))).toString()).toBe('s');

    // Where the user may write, the files are its own; supplementary groups apply too.
    const open = path.join(a.dir, 'open');
    fs.mkdirSync(open);
    fs.chmodSync(open, 0o777);
    await c.writeFile(path.join(open, 'mine'), Buffer.from('m'), { user: '65534:4242' });
    await c.mkdir(path.join(open, 'sub/dir'), { user: '65534', parents: true });
    await c.symlink(path.join(open, 'ln'), 'mine', { user: '65534' });
    for (const n of ['mine', 'sub', 'sub/dir']) expect(fs.statSync(path.join(open, n)).uid).toBe(65534);
    expect(fs.statSync(path.join(open, 'mine')).gid).toBe(4242);
    expect(fs.lstatSync(path.join(open, 'ln')).uid).toBe(65534);
    const grp = path.join(a.dir, 'grp');
    fs.mkdirSync(grp);
    fs.chownSync(grp, 0, 4343);
    fs.chmodSync(grp, 0o070);
    expect(await failure(c.list(grp, { user: '65534' }))).toMatchObject({ kind: 'FailedPrecondition' });
    expect(await c.list(grp, { user: '65534:4343' })).toEqual([]);

    // Replacing a root-owned file as root keeps its owner; the agent is still root.
    fs.writeFileSync(path.join(open, 'owned'), 'o');
    fs.chownSync(path.join(open, 'owned'), 1234, 5678);
    await c.writeFile(path.join(open, 'owned'), Buffer.from('p'));
    expect([fs.statSync(path.join(open, 'owned')).uid, fs.statSync(path.join(open, 'owned')).gid]).toEqual([1234, 5678]);
    const status = fs.readFileSync(`/proc/${a.pid}/status`, 'utf8');
    expect(/^Uid:\s+(.*)$/m.exec(status)?.[1].split(/\s+/)).toEqual(['0', '0', '0', '0']);
    expect(/^Gid:\s+(.*)$/m.exec(status)?.[1].split(/\s+/)).toEqual(['0', '0', '0', '0']);
    expect(/^Groups:[ \t]*(.*)$/m.exec(status)?.[1].trim()).toBe(/^Groups:[ \t]*(.*)$/m.exec(fs.readFileSync('/proc/self/status', 'utf8'))?.[1].trim());
    const r = await c.exec({ argv: [BB, 'sh', '-c', 'id -u; umask'], env: ENV, maxOutputBytes: 100 });
    expect(r.stdout.toString()).toBe(`0\n${(process.umask() & 0o777).toString(8).padStart(4, '0')}\n`);
  });

  it('falls back to O_NOFOLLOW on the final component without openat2', async () => {
    const a = await harness.start({ env: { ...process.env, DSEC_AGENT_NO_OPENAT2: '1' } });
    const c = await harness.connect(a);
    const f = path.join(a.dir, 'f');
    fs.writeFileSync(f, 'data');
    fs.symlinkSync('f', path.join(a.dir, 'ln'));
    expect((await readAll(c.readFile(f))).toString()).toBe('data');
    expect(await failure(readAll(c.readFile(path.join(a.dir, 'ln'))))).toMatchObject({ kind: 'InvalidArgument', errno: 40 });
    expect(await failure(readAll(c.readFile('/proc/self/fd/0')))).toMatchObject({ kind: 'InvalidArgument' });
    await c.writeFile(path.join(a.dir, 'g'), Buffer.from('g'));
    expect(fs.readFileSync(path.join(a.dir, 'g'), 'utf8')).toBe('g');
  });
});

// ---- wire level -------------------------------------------------------------------------

describe('dsec-agent file protocol', () => {
  it('answers each request on its stream, with FILE_ERROR for malformed ones', async () => {
    const a = await harness.start();
    const raw = harness.raw(a.socketPath);
    await raw.hello();
    const fileErr = async (stream: number) => {
      const f = await raw.next();
      expect([f.type, f.stream]).toEqual([FrameType.FILE_ERROR, stream]);
      return decodeFileError(f.payload);
    };
    raw.send(FrameType.FILE_STAT, 3, encodeTlv([{ tag: FileTag.USER, value: Buffer.from('0') }]));
    expect(await fileErr(3)).toEqual({ errno: 22, message: 'stat: malformed request: PATH is required' });
    raw.send(FrameType.FILE_WRITE, 4, encodeFileRequest({ path: `${a.dir}/w`, flags: 0x40 }));
    expect(await fileErr(4)).toMatchObject({ errno: 22, message: expect.stringMatching(/unknown FLAGS 0x40/) });
    raw.send(FrameType.FILE_MKDIR, 5, encodeTlv([{ tag: FileTag.PATH, value: Buffer.from('/x') }, { tag: FileTag.MODE, value: Buffer.from([1]) }]));
    expect(await fileErr(5)).toMatchObject({ errno: 22, message: expect.stringMatching(/MODE/) });
    raw.send(FrameType.FILE_READ, 6, Buffer.from([1, 0, 0]));
    expect(await fileErr(6)).toMatchObject({ errno: 22, message: expect.stringMatching(/truncated/) });

    // A write: ACK(0) at open, data, FILE_DONE(u64 bytes); the stream id is free again after.
    raw.send(FrameType.FILE_WRITE, 7, encodeFileRequest({ path: `${a.dir}/w`, flags: FileWriteFlag.CREATE }));
    let f = await raw.next();
    expect([f.type, f.stream, decodeU64(f.payload, 'ACK')]).toEqual([FrameType.FILE_ACK, 7, 0]);
    raw.send(FrameType.FILE_READ, 7, encodeFileRequest({ path: '/etc/passwd' })); // live: refused
    f = await raw.next();
    expect([f.type, f.stream, f.payload.toString()]).toEqual([FrameType.ERROR, 7, 'stream 7 is already in use']);
    raw.send(FrameType.FILE_DATA, 7, Buffer.alloc(MiB - 10, 7));
    raw.send(FrameType.FILE_DATA, 7, Buffer.alloc(20, 7)); // crosses 1 MiB: one ACK
    f = await raw.next();
    expect([f.type, decodeU64(f.payload, 'ACK')]).toEqual([FrameType.FILE_ACK, MiB + 10]);
    raw.send(FrameType.FILE_DONE, 7);
    f = await raw.next();
    expect([f.type, f.stream, decodeU64(f.payload, 'DONE')]).toEqual([FrameType.FILE_DONE, 7, MiB + 10]);
    expect(fs.statSync(`${a.dir}/w`).size).toBe(MiB + 10);
    raw.send(FrameType.FILE_DATA, 7, Buffer.from('late')); // no longer live: dropped

    // STAT answers FILE_INFO then FILE_DONE; SIGNAL on a file stream is an error and ends it.
    raw.send(FrameType.FILE_STAT, 7, encodeFileRequest({ path: `${a.dir}/w` }));
    f = await raw.next();
    expect([f.type, f.stream, decodeFileInfo(f.payload).size]).toEqual([FrameType.FILE_INFO, 7, MiB + 10]);
    expect((await raw.next()).type).toBe(FrameType.FILE_DONE);
    raw.send(FrameType.FILE_WRITE, 8, encodeFileRequest({ path: `${a.dir}/w2` }));
    expect((await raw.next()).type).toBe(FrameType.FILE_ACK);
    raw.send(FrameType.SIGNAL, 8, encodeU32(9));
    f = await raw.next();
    expect([f.type, f.stream]).toEqual([FrameType.ERROR, 8]);
    await waitFor('the temp file of the abandoned write to go', () => !fs.readdirSync(a.dir).some((n) => n.includes('.dsec-')));
    expect(fs.existsSync(`${a.dir}/w2`)).toBe(false);

    // File requests on stream 0 are fatal.
    raw.send(FrameType.FILE_STAT, 0, encodeFileRequest({ path: '/' }));
    f = await raw.next();
    expect([f.type, f.stream]).toEqual([FrameType.ERROR, 0]);
  });

  it('interleaves file streams with execs on one connection', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const data = randomBytes(5 * MiB);
    const ops = await Promise.all([
      c.writeFile(path.join(a.dir, 'p1'), data),
      c.exec({ argv: [BB, 'head', '-c', String(6 * MiB), '/dev/zero'], env: ENV, maxOutputBytes: 10 * MiB }),
      c.writeFile(path.join(a.dir, 'p2'), Readable.from([data.subarray(0, MiB), data.subarray(MiB)])),
      readAll(c.readFile('/etc/passwd')),
      c.list('/'),
    ]);
    expect(ops[0]).toEqual({ bytes: data.length });
    expect(ops[1].stdout.length).toBe(6 * MiB);
    expect(ops[2]).toEqual({ bytes: data.length });
    expect(ops[3].toString()).toBe(fs.readFileSync('/etc/passwd', 'utf8'));
    const [r1, r2] = await Promise.all([readAll(c.readFile(path.join(a.dir, 'p1'))), readAll(c.readFile(path.join(a.dir, 'p2')))]);
    expect(r1.equals(data) && r2.equals(data)).toBe(true);
  });
});
