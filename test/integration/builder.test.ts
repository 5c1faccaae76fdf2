/**
 * The builder identity (daemon/host/builder.ts, docs/SECURITY.md "Builder and runtime
 * identities") on real user namespaces, idmapped mounts, EROFS and runc:
 *
 *   - extraction, copies and mkfs.erofs really run as uid 0 of a user namespace mapped
 *     onto a builder slot, never as host root and never as a sandbox's range (the worker
 *     is caught mid-extraction in /proc; mkfs.erofs is a wrapper script that records who
 *     it is for every layer dsecd builds);
 *   - a hostile tar extracted with NO sanitisation at all, as the builder, reaches no host
 *     file: the kernel refuses every write, link, device and read outside its tree;
 *   - layers built by the builder are byte-identical to root-built ones, and commits and
 *     snapshots keep owners, modes, setuid bits, capabilities, whiteouts and opaque dirs;
 *   - no layer built from a sandbox (commit, snapshot) holds dsec's runtime state: agent
 *     socket, logs, exec history, session spools, PTY output, trajectory data, create env.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, closeSync, constants as fsc, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, readlinkSync, statSync, write, writeFileSync } from 'node:fs';
import { chmod, lstat, mkdir, readFile, readlink, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { execa } from 'execa';
import tarStream from 'tar-stream';
import { BUILDER_SLOT_IDS, Builder } from '../../daemon/host/builder.js';
import { importArchive, importTarWithNotes } from '../../daemon/image/import/oci.js';
import type { ExtractReport } from '../../daemon/image/import/tar.js';
import { LayerStore } from '../../daemon/image/layer-store.js';
import { IS_ROOT, REPO, TestDaemon, builderRangeForSlot, leaseSlot, releaseSlot } from './harness.js';

/** A label for the daemon's temp root (the harness leases its id ranges). */
const SLOT = 30;
/** CHOWN, DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER, FSETID, MKNOD (27), SETFCAP (31): the builder's bounding set. */
const BUILDER_CAPS = '000000008800001f';
/** vfs_cap_data v2 with cap_net_raw (bit 13) effective and permitted. */
const CAP_NET_RAW_V2 = '0x0100000200200000000000000000000000000000';

interface Entry {
  name: string;
  type?: 'file' | 'directory' | 'symlink' | 'link' | 'fifo' | 'block-device' | 'character-device';
  body?: string | Buffer;
  mode?: number;
  uid?: number;
  gid?: number;
  linkname?: string;
  devmajor?: number;
  devminor?: number;
}

/** A tar (tar-stream) of `entries`, in order; defaults 0644 files, 0755 dirs, root-owned, mtime 2020-01-01. */
async function makeTar(entries: Entry[]): Promise<Buffer> {
  const pack = tarStream.pack();
  const chunks: Buffer[] = [];
  const done = new Promise<void>((res, rej) => {
    pack.on('data', (c: unknown) => chunks.push(c as Buffer));
    pack.on('end', () => res());
    pack.on('error', rej);
  });
  for (const e of entries) {
    const type = e.type ?? 'file';
    const header = {
      name: e.name, type, mode: e.mode ?? (type === 'directory' ? 0o755 : 0o644), uid: e.uid ?? 0, gid: e.gid ?? 0,
      mtime: new Date('2020-01-01T00:00:00Z'), linkname: e.linkname, devmajor: e.devmajor, devminor: e.devminor,
    };
    await new Promise<void>((res, rej) => {
      const cb = (err?: Error | null) => (err ? rej(err) : res());
      if (type === 'file') {
        const body = Buffer.from(e.body ?? '');
        pack.entry({ ...header, size: body.length }, body, cb);
      } else pack.entry(header, cb);
    });
  }
  pack.finalize();
  await done;
  return Buffer.concat(chunks);
}

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

/** A docker-archive (`docker save` layout) of `layers`, as one tar. */
async function dockerArchive(layers: Entry[][]): Promise<Buffer> {
  const tars = await Promise.all(layers.map(makeTar));
  const config = Buffer.from(JSON.stringify({ os: 'linux', architecture: 'amd64', config: { Env: ['PATH=/bin'], Cmd: ['/bin/sh'] }, rootfs: { type: 'layers', diff_ids: tars.map((t) => `sha256:${sha256(t)}`) } }));
  const cfgName = `${sha256(config)}.json`;
  const manifest = [{ Config: cfgName, RepoTags: ['builder-test:1'], Layers: tars.map((_, i) => `l${i}/layer.tar`) }];
  return makeTar([
    { name: 'manifest.json', body: JSON.stringify(manifest) },
    { name: cfgName, body: config },
    ...tars.flatMap((t, i) => [{ name: `l${i}`, type: 'directory' as const }, { name: `l${i}/layer.tar`, body: t }]),
  ]);
}

/** Mounts the EROFS blob file `blob` read-only at a fresh dir under `base`, runs `fn`, unmounts. */
async function withBlob<T>(base: string, blob: string, fn: (dir: string) => Promise<T>): Promise<T> {
  const dir = mkdtempSync(path.join(base, 'mnt-'));
  await execa('mount', ['-t', 'erofs', '-o', 'ro', blob, dir]);
  try {
    return await fn(dir);
  } finally {
    await execa('umount', [dir]);
    await rm(dir, { recursive: true, force: true });
  }
}

/** `trusted.overlay.opaque` of `p` as root, or null. */
async function opaqueOf(p: string): Promise<string | null> {
  const r = await execa('getfattr', ['-h', '--only-values', '-n', 'trusted.overlay.opaque', p], { reject: false });
  return r.exitCode === 0 ? String(r.stdout) : null;
}

/** `security.capability` of `p` in hex, or null. */
async function capOf(p: string): Promise<string | null> {
  const r = await execa('getfattr', ['-h', '-e', 'hex', '--only-values', '-n', 'security.capability', p], { reject: false, encoding: 'buffer' });
  return r.exitCode === 0 ? Buffer.from(r.stdout as Uint8Array).toString('hex') : null;
}

/** Host processes whose real uid is `uid`, with their uid_map, command line, NoNewPrivs, capability bounding set and namespaces. */
function processesOf(uid: number): Array<{ pid: number; uidMap: string; cmdline: string; noNewPrivs: string; capBnd: string; pidNs: string; netNs: string }> {
  const found = [];
  for (const n of readdirSync('/proc')) {
    if (!/^\d+$/.test(n)) continue;
    let status: string;
    try {
      status = readFileSync(`/proc/${n}/status`, 'utf8');
    } catch {
      continue; // exited meanwhile
    }
    if (!new RegExp(`^Uid:\\s+${uid}\\s`, 'm').test(status)) continue;
    const field = (k: string) => new RegExp(`^${k}:\\s+(\\S+)`, 'm').exec(status)?.[1] ?? '';
    try {
      found.push({
        pid: Number(n),
        uidMap: readFileSync(`/proc/${n}/uid_map`, 'utf8').trim().split(/\s+/).join(' '),
        cmdline: readFileSync(`/proc/${n}/cmdline`, 'utf8').split('\0').join(' '),
        noNewPrivs: field('NoNewPrivs'),
        capBnd: field('CapBnd'),
        pidNs: readlinkSync(`/proc/${n}/ns/pid`),
        netNs: readlinkSync(`/proc/${n}/ns/net`),
      });
    } catch {
      // exited meanwhile (a short-lived helper of the worker)
    }
  }
  return found;
}

describe.skipIf(!IS_ROOT)('builder identity, unit level (a Builder and an LayerStore in this process)', () => {
  let base: string;
  let builder: Builder;
  let sentinelDir: string;
  /** A test slot leased for its builder range alone (no daemon uses it meanwhile). */
  let leased = -1;
  let DIRECT_BUILDER: { base: number; size: number };
  beforeAll(async () => {
    leased = leaseSlot();
    DIRECT_BUILDER = builderRangeForSlot(leased);
    base = mkdtempSync('/tmp/dsec-builder-it-');
    chmodSync(base, 0o711); // the builder must reach <base>/builder/<job> by its absolute path
    builder = new Builder({ range: DIRECT_BUILDER, workDir: path.join(base, 'builder') });
    await builder.init();
    await builder.probe();
    // Host files a hostile archive goes for: a root-only secret and a root-owned dir, beside the world-readable /etc.
    sentinelDir = path.join(base, 'host');
    await mkdir(sentinelDir, { mode: 0o755 });
    await writeFile(path.join(sentinelDir, 'secret'), 'root only\n', { mode: 0o600 });
    await writeFile(path.join(sentinelDir, 'public'), 'world readable\n', { mode: 0o644 });
  });
  afterAll(async () => {
    if (base) await rm(base, { recursive: true, force: true });
    if (leased >= 0) releaseSlot(leased);
  });

  it('the extraction worker runs as uid 0 of a user namespace mapped onto a builder slot, with no host privilege', async () => {
    const tar = await makeTar([{ name: 'big', body: randomBytes(3 << 20) }, { name: 'small', body: 'x' }]);
    const fifo = path.join(base, 'in.fifo');
    await execa('mkfifo', ['-m', '0600', fifo]);
    // A reader without O_NONBLOCK (reopened through /proc), and the only writer: the worker
    // blocks for more input until the test has looked at it, then sees EOF when w closes.
    const r0 = openSync(fifo, fsc.O_RDONLY | fsc.O_NONBLOCK);
    const w = openSync(fifo, fsc.O_WRONLY);
    const r = openSync(`/proc/self/fd/${r0}`, fsc.O_RDONLY);
    closeSync(r0);
    const writeAll = (buf: Buffer) => new Promise<void>((res, rej) => {
      const step = (off: number) => (off >= buf.length ? res() : write(w, buf, off, buf.length - off, null, (e, n) => (e ? rej(e) : step(off + n))));
      step(0);
    });
    const seen: { uid: number; procs: ReturnType<typeof processesOf> }[] = [];
    let rest: Promise<void> | undefined;
    // The tail goes in only once the head is wholly written: the first progress report can
    // come while the head is still being written (the fifo takes 64 KiB at a time), and two
    // writers at once would interleave their chunks into a corrupt tar.
    let headWritten!: () => void;
    const head = new Promise<void>((res) => (headWritten = res));
    const report = await builder.withJob(async (job) => {
      const p = job.worker<ExtractReport>('extract', { dest: 'tree', ociWhiteouts: false }, {
        fds: [r],
        onProgress: () => {
          if (seen.length) return;
          seen.push({ uid: job.uid, procs: processesOf(job.uid) });
          rest = head.then(() => writeAll(tar.subarray(2 << 20))).then(() => closeSync(w));
        },
      });
      await writeAll(tar.subarray(0, 2 << 20));
      headWritten();
      const rep = await p;
      await rest;
      return rep;
    });
    closeSync(r);
    expect(report.entries).toBe(2);
    expect(seen).toHaveLength(1);
    const { uid, procs } = seen[0];
    // The job's uid is a slot of the builder range, and a process of it was mid-extraction.
    expect(uid).toBeGreaterThanOrEqual(DIRECT_BUILDER.base);
    expect(uid + BUILDER_SLOT_IDS).toBeLessThanOrEqual(DIRECT_BUILDER.base + DIRECT_BUILDER.size);
    const worker = procs.find((x) => x.cmdline.includes('builder-worker.js'));
    expect(worker).toBeDefined();
    for (const p of procs) {
      expect(p.uidMap).toBe(`0 ${uid} ${BUILDER_SLOT_IDS}`);
      expect(p.noNewPrivs).toBe('1');
      expect(p.capBnd).toBe(BUILDER_CAPS);
      expect(p.pidNs).not.toBe(readlinkSync('/proc/self/ns/pid'));
      expect(p.netNs).not.toBe(readlinkSync('/proc/self/ns/net'));
    }
  });

  it('a hostile tar extracted with no sanitisation at all, as the builder, reaches no host file', async () => {
    const tag = randomBytes(4).toString('hex');
    const shadowBefore = readFileSync('/etc/shadow');
    const passwdMode = statSync('/etc/passwd').mode;
    const tar = await makeTar([
      // Write through a symlink to a host directory, and to a host file.
      { name: 'etc-link', type: 'symlink', linkname: '/etc' },
      { name: `etc-link/dsec-through-${tag}`, body: 'pwned' },
      { name: 'shadow-link', type: 'symlink', linkname: '/etc/shadow' },
      { name: 'shadow-link', body: 'root::0:0:::::\n' },
      { name: 'passwd-link', type: 'symlink', linkname: '/etc/passwd' },
      { name: 'passwd-link', body: 'x', mode: 0o777 },
      // Hard links that would pin host files (and their contents) into the layer.
      { name: 'shadow-hard', type: 'link', linkname: '/etc/shadow' },
      { name: 'public-hard', type: 'link', linkname: path.join(sentinelDir, 'public') },
      // Absolute and `..` paths.
      { name: `/etc/dsec-abs-${tag}`, body: 'pwned' },
      { name: `../../../../../../../../etc/dsec-dotdot-${tag}`, body: 'pwned' },
      { name: path.join(sentinelDir, 'planted'), body: 'pwned' },
      { name: 'root-link', type: 'symlink', linkname: '/root' },
      { name: `root-link/dsec-dir-${tag}`, type: 'directory' },
      // Device nodes that would reach host hardware.
      { name: 'disk', type: 'block-device', devmajor: 8, devminor: 0 },
      { name: 'mem', type: 'character-device', devmajor: 1, devminor: 1 },
      // Symlinks whose targets the "dereference" pass reads.
      { name: 'secret-link', type: 'symlink', linkname: path.join(sentinelDir, 'secret') },
    ]);
    const tarFile = path.join(base, `hostile-${tag}.tar`);
    await writeFile(tarFile, tar, { mode: 0o600 }); // root-only: the builder gets it as an fd
    const lines = await builder.withJob(async (job) => {
      const fd = openSync(tarFile, fsc.O_RDONLY);
      try {
        const res = await job.run([process.execPath, path.join(REPO, 'test/fixtures/naive-extract.mjs')], { fds: [fd] });
        expect(res.exitCode).toBe(0);
        // What the builder managed to create inside its own tree (job dir), seen from the host.
        const made = readdirSync(job.dir);
        expect(made).not.toContain('disk');
        expect(made).not.toContain('mem');
        expect(made).not.toContain('shadow-hard');
        expect(made).not.toContain('public-hard');
        return res.stdout.trim().split('\n').map((l) => JSON.parse(l) as { entry?: string; op?: string; ok?: boolean; code?: string; done?: boolean });
      } finally {
        closeSync(fd);
      }
    });
    expect(lines.at(-1)).toEqual({ done: true });
    const outcome = (entry: string, op: string) => lines.find((l) => l.entry === entry && l.op === op);
    // The naive extractor did everything inside its own tree without trouble ...
    for (const l of ['etc-link', 'shadow-link', 'passwd-link', 'root-link', 'secret-link']) expect(outcome(l, 'symlink')).toMatchObject({ ok: true });
    // ... and the kernel refused every step that reached out of it.
    const refused: Array<[string, string, string[]]> = [
      [`etc-link/dsec-through-${tag}`, 'write', ['EACCES']],
      ['shadow-link', 'write', ['EACCES']],
      ['passwd-link', 'write', ['EACCES']],
      ['passwd-link', 'chmod', ['EPERM']],
      ['shadow-hard', 'link', ['EPERM']],
      ['public-hard', 'link', ['EPERM']],
      [`/etc/dsec-abs-${tag}`, 'write', ['EACCES']],
      [`../../../../../../../../etc/dsec-dotdot-${tag}`, 'write', ['EACCES']],
      [path.join(sentinelDir, 'planted'), 'write', ['EACCES']],
      [`root-link/dsec-dir-${tag}`, 'mkdir', ['EACCES']],
      ['disk', 'mknod', ['EPERM']],
      ['mem', 'mknod', ['EPERM']],
      ['shadow-link', 'read-through', ['EACCES']],
      ['secret-link', 'read-through', ['EACCES']],
    ];
    for (const [entry, op, codes] of refused) {
      const o = outcome(entry, op);
      expect(o, `${op} ${entry}`).toBeDefined();
      expect(o!.ok, `${op} ${entry} must be refused`).toBe(false);
      expect(codes, `${op} ${entry}`).toContain(o!.code);
    }
    // The host is untouched.
    expect(readFileSync('/etc/shadow').equals(shadowBefore)).toBe(true);
    expect(statSync('/etc/passwd').mode).toBe(passwdMode);
    for (const f of [`/etc/dsec-through-${tag}`, `/etc/dsec-abs-${tag}`, `/etc/dsec-dotdot-${tag}`, `/root/dsec-dir-${tag}`, path.join(sentinelDir, 'planted')]) expect(existsSync(f), f).toBe(false);
    expect(readdirSync(sentinelDir).sort()).toEqual(['public', 'secret']);

    // Control: the same extractor run as root (the old identity) does reach host files.
    // Only the throwaway sentinel dir is aimed at, never /etc.
    const control = await makeTar([
      { name: 'host-link', type: 'symlink', linkname: sentinelDir },
      { name: 'host-link/through', body: 'pwned' },
      { name: path.join(sentinelDir, 'planted'), body: 'pwned' },
      { name: 'public-hard', type: 'link', linkname: path.join(sentinelDir, 'public') },
      { name: 'secret-link', type: 'symlink', linkname: path.join(sentinelDir, 'secret') },
    ]);
    const controlDir = mkdtempSync(path.join(base, 'as-root-'));
    const controlTar = path.join(base, 'control.tar');
    await writeFile(controlTar, control);
    const fd = openSync(controlTar, fsc.O_RDONLY);
    try {
      const r = await execa(process.execPath, [path.join(REPO, 'test/fixtures/naive-extract.mjs')], { cwd: controlDir, stdio: ['ignore', 'pipe', 'pipe', fd] });
      const asRoot = String(r.stdout).trim().split('\n').map((l) => JSON.parse(l) as { entry?: string; op?: string; ok?: boolean });
      for (const [entry, op] of [['host-link/through', 'write'], [path.join(sentinelDir, 'planted'), 'write'], ['public-hard', 'link'], ['secret-link', 'read-through']]) {
        expect(asRoot.find((l) => l.entry === entry && l.op === op), `${op} ${entry} as root`).toMatchObject({ ok: true });
      }
      expect(readdirSync(sentinelDir).sort()).toEqual(['planted', 'public', 'secret', 'through']);
    } finally {
      closeSync(fd);
      await rm(path.join(sentinelDir, 'planted'), { force: true });
      await rm(path.join(sentinelDir, 'through'), { force: true });
      await rm(controlDir, { recursive: true, force: true });
    }

    // dsec's own importer, as the builder, refuses the same archive outright.
    const store = new LayerStore({ root: path.join(base, 'store-hostile'), builder });
    await store.init();
    await expect(importTarWithNotes(store, tarFile, { name: 'hostile', tag: '1' })).rejects.toMatchObject({ kind: 'InvalidArgument' });
    await expect(store.get('hostile:1')).rejects.toMatchObject({ kind: 'NotFound' });
    expect(readdirSync(path.join(base, 'builder')).filter((n) => /^\d+-[0-9a-f]+$/.test(n))).toEqual([]);
  });

  it('imports by the builder are byte-identical to root\'s, with exact owners, modes, setuid bits, links, fifos, whiteouts and opaque dirs', async () => {
    const layers: Entry[][] = [
      [
        { name: 'bin', type: 'directory' },
        { name: 'bin/suid', body: '#!/bin/sh\n', mode: 0o4755 },
        { name: 'bin/sgid', body: '#!/bin/sh\n', mode: 0o2711, gid: 42 },
        { name: 'srv', type: 'directory', mode: 0o2775, gid: 1001 },
        { name: 'scratch', type: 'directory', mode: 0o1777 },
        { name: 'home', type: 'directory' },
        { name: 'home/user', type: 'directory', mode: 0o700, uid: 1000, gid: 1000 },
        { name: 'home/user/.profile', body: 'export X=1\n', mode: 0o600, uid: 1000, gid: 1000 },
        { name: 'data', type: 'directory' },
        { name: 'data/a.txt', body: 'deleted above\n' },
        { name: 'data/b.txt', body: 'stays\n' },
        { name: 'data/b-hard', type: 'link', linkname: 'data/b.txt' },
        { name: 'data/abs-link', type: 'symlink', linkname: '/data/b.txt', uid: 7, gid: 8 },
        { name: 'data/dir', type: 'directory' },
        { name: 'data/dir/old', body: 'hidden above\n' },
        { name: 'data/top', body: 'max id\n', uid: 65535, gid: 65535 },
        { name: 'run', type: 'directory' },
        { name: 'run/fifo', type: 'fifo', mode: 0o620, uid: 1000, gid: 1000 },
      ],
      [
        { name: 'data', type: 'directory' },
        { name: 'data/.wh.a.txt', body: '' },
        { name: 'data/dir', type: 'directory' },
        { name: 'data/dir/.wh..wh..opq', body: '' },
        { name: 'data/dir/new', body: 'fresh\n' },
      ],
    ];
    const archive = path.join(base, 'image.tar');
    await writeFile(archive, await dockerArchive(layers), { mode: 0o600 });
    const asRoot = new LayerStore({ root: path.join(base, 'store-root') });
    const asBuilder = new LayerStore({ root: path.join(base, 'store-builder'), builder });
    await asRoot.init();
    await asBuilder.init();
    const mr = await importArchive(asRoot, archive, { name: 'exact', tag: '1' });
    const mb = await importArchive(asBuilder, archive, { name: 'exact', tag: '1' });
    expect(mb.layers).toHaveLength(2);
    expect(mb.layers).toEqual(mr.layers);
    // The builder's blobs are root's now, read-only.
    for (const d of mb.layers) expect(statSync(asBuilder.blobPath(d))).toMatchObject({ uid: 0, gid: 0, mode: 0o100444 });
    await withBlob(base, asBuilder.blobPath(mb.layers[0]), async (m) => {
      const st = async (p: string) => lstat(path.join(m, p));
      expect(await st('bin/suid')).toMatchObject({ uid: 0, gid: 0, mode: 0o104755 });
      expect(await st('bin/sgid')).toMatchObject({ uid: 0, gid: 42, mode: 0o102711 });
      expect(await st('srv')).toMatchObject({ gid: 1001, mode: 0o42775 });
      expect((await st('scratch')).mode & 0o7777).toBe(0o1777);
      expect(await st('home/user')).toMatchObject({ uid: 1000, gid: 1000, mode: 0o40700 });
      expect(await st('home/user/.profile')).toMatchObject({ uid: 1000, gid: 1000, mode: 0o100600 });
      expect(await st('data/b-hard')).toMatchObject({ nlink: 2, ino: (await st('data/b.txt')).ino });
      expect(await st('data/abs-link')).toMatchObject({ uid: 7, gid: 8 });
      expect(await readlink(path.join(m, 'data/abs-link'))).toBe('/data/b.txt');
      expect(await st('data/top')).toMatchObject({ uid: 65535, gid: 65535 });
      const fifo = await st('run/fifo');
      expect(fifo.isFIFO()).toBe(true);
      expect(fifo).toMatchObject({ uid: 1000, gid: 1000, mode: 0o10620 });
    });
    await withBlob(base, asBuilder.blobPath(mb.layers[1]), async (m) => {
      const wh = await lstat(path.join(m, 'data/a.txt'));
      expect(wh.isCharacterDevice()).toBe(true);
      expect(wh).toMatchObject({ rdev: 0, uid: 0, gid: 0 });
      expect(await opaqueOf(path.join(m, 'data/dir'))).toBe('y');
      expect(await opaqueOf(path.join(m, 'data'))).toBeNull();
      expect(await readFile(path.join(m, 'data/dir/new'), 'utf8')).toBe('fresh\n');
    });
  });

  it('owners beyond the 65,536 ids a sandbox sees are recorded as 65534, and said so', async () => {
    const tarFile = path.join(base, 'big-ids.tar');
    await writeFile(tarFile, await makeTar([{ name: 'f', body: 'x', uid: 100000, gid: 3 }, { name: 'g', body: 'y', uid: 5, gid: 70000 }]));
    const store = new LayerStore({ root: path.join(base, 'store-ids'), builder });
    await store.init();
    const r = await importTarWithNotes(store, tarFile, { name: 'ids', tag: '1' });
    expect(r.notes).toEqual([expect.stringMatching(/^owners above 65535 recorded as 65534 .*\(2 entries, e\.g\. "f"\)$/)]);
    await withBlob(base, store.blobPath(r.manifest.layers[0]), async (m) => {
      expect(await lstat(path.join(m, 'f'))).toMatchObject({ uid: 65534, gid: 3 });
      expect(await lstat(path.join(m, 'g'))).toMatchObject({ uid: 5, gid: 65534 });
    });
  });
});

describe.skipIf(!IS_ROOT)('builder identity in dsecd: who runs mkfs.erofs, and what layers from sandboxes hold', () => {
  let d: TestDaemon;
  let base: string;
  let calls: string;
  let DAEMON_BUILDER: { base: number; size: number };
  beforeAll(async () => {
    base = mkdtempSync('/tmp/dsec-builder-d-');
    chmodSync(base, 0o755);
    calls = path.join(base, 'calls');
    await mkdir(calls, { mode: 0o777 });
    await chmod(calls, 0o777); // the builder writes its records here
    // mkfs.erofs as a wrapper that records who runs it, then runs the real one.
    const wrapper = path.join(base, 'mkfs-wrapper');
    writeFileSync(wrapper, [
      '#!/bin/sh',
      `f=$(mktemp ${calls}/call.XXXXXX)`,
      '{',
      '  echo "uid $(id -u) gid $(id -g) pid $$"',
      '  echo "map $(cat /proc/self/uid_map)"',
      '  grep -E "^(NoNewPrivs|CapBnd):" /proc/self/status',
      '  echo "netns $(readlink /proc/self/ns/net)"',
      '  if cat /etc/shadow >/dev/null 2>&1; then echo "shadow readable"; else echo "shadow denied"; fi',
      '  echo "args $*"',
      '} > "$f"',
      'exec mkfs.erofs "$@"',
      '',
    ].join('\n'), { mode: 0o755 });
    d = await TestDaemon.start({ slot: SLOT, config: `[images]\nmkfs_path = "${wrapper}"\n` });
    DAEMON_BUILDER = d.builderRange;
  });
  afterAll(async () => {
    await d?.cleanup();
    if (base) await rm(base, { recursive: true, force: true });
  });

  const sh = async (id: string, script: string) => {
    const r = await d.client.exec(id, { argv: ['sh', '-c', script] });
    expect(r.stderr.toString()).toBe('');
    expect(r.exit_code).toBe(0);
    return r.stdout.toString();
  };
  const blob = (digest: string) => path.join(d.root, 'images', 'blobs', 'sha256', digest.slice('sha256:'.length));
  /** The wrapper's records, oldest first, each with the host owner of its record file. */
  const records = () => readdirSync(calls).map((f) => ({ text: readFileSync(path.join(calls, f), 'utf8'), owner: statSync(path.join(calls, f)).uid, mtime: statSync(path.join(calls, f)).mtimeMs })).sort((a, b) => a.mtime - b.mtime);

  it('runs mkfs.erofs for every layer it builds (built-in image, tar import, directory build, commit, snapshot) as a builder slot, never as root or a sandbox', async () => {
    const info = (await d.client.hostInfo()) as unknown as { defences: Record<string, { enforced: boolean; detail: string }> };
    expect(info.defences.builder_identity.enforced).toBe(true);
    expect(info.defences.builder_identity.detail).toContain(`${DAEMON_BUILDER.base}-${DAEMON_BUILDER.base + DAEMON_BUILDER.size - 1}`);

    const tarFile = path.join(base, 'rootfs.tar');
    await writeFile(tarFile, await makeTar([{ name: 'etc', type: 'directory' }, { name: 'etc/hello', body: 'hi\n' }]), { mode: 0o600 });
    await d.client.importImage({ type: 'tar', path: tarFile, image: 'from-tar:1' });
    const dir = path.join(base, 'tree');
    await mkdir(path.join(dir, 'srv'), { recursive: true });
    await writeFile(path.join(dir, 'srv/secret'), 'only root can read this file\n', { mode: 0o600 });
    await chmod(dir, 0o700);
    await d.client.importImage({ type: 'dir', path: dir, image: 'from-dir:1', base: 'busybox' });
    const sb = await d.client.createSandbox({ image: 'from-dir:1' });
    try {
      const def = (await d.client.getSandbox(sb.id)).defences!.builder_identity;
      expect(def.enforced).toBe(true);
      expect(def.detail).toContain(`${sb.uid_base}-${sb.uid_base! + sb.uid_count! - 1}`);
      expect(await sh(sb.id, 'cat /srv/secret; echo new > /root/new')).toBe('only root can read this file\n');
      await d.client.commit(sb.id, { image: 'committed:1' });
      await d.client.snapshot(sb.id, { name: 'snap-1' });
      const rec = records();
      // busybox at start, the tar, the dir, the commit, the snapshot.
      expect(rec.length).toBeGreaterThanOrEqual(5);
      const sandboxRange = { base: sb.uid_base!, end: sb.uid_base! + sb.uid_count! };
      for (const r of rec) {
        const m = /^map\s+(\d+)\s+(\d+)\s+(\d+)$/m.exec(r.text);
        expect(m, r.text).not.toBeNull();
        const [inner, outer, count] = [Number(m![1]), Number(m![2]), Number(m![3])];
        expect(r.text).toMatch(/^uid 0 gid 0 pid 1$/m);
        expect([inner, count]).toEqual([0, BUILDER_SLOT_IDS]);
        expect(outer).toBeGreaterThanOrEqual(DAEMON_BUILDER.base);
        expect(outer + count).toBeLessThanOrEqual(DAEMON_BUILDER.base + DAEMON_BUILDER.size);
        expect(outer >= sandboxRange.end || outer + count <= sandboxRange.base).toBe(true);
        // The record file, seen from the host, belongs to that slot's host uid.
        expect(r.owner).toBe(outer);
        expect(r.text).toMatch(/^NoNewPrivs:\s+1$/m);
        expect(r.text).toMatch(new RegExp(`^CapBnd:\\s+${BUILDER_CAPS}$`, 'm'));
        expect(r.text).toContain('shadow denied');
        expect(r.text).not.toContain(`netns ${readlinkSync('/proc/self/ns/net')}`);
        expect(r.text).toMatch(/^args .* \/proc\/self\/fd\/3\/\.$/m);
      }
      // The root-only file of the directory build reached the image (read through the view, not by permission).
      expect(await sh(sb.id, 'cat /srv/secret')).toBe('only root can read this file\n');
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('commits and snapshots keep owners, modes, setuid bits, file capabilities, whiteouts and opaque dirs exactly', async () => {
    // System paths writable (readonly_paths []), so the sandbox can delete /etc/group and replace /usr/local.
    const sb = await d.client.createSandbox({ image: 'busybox', filesystem: { readonly_paths: [], writable_paths: ['/work'] } });
    try {
      await sh(sb.id, [
        'mkdir -p /work/repo && echo answer > /work/repo/file && chown -R 1000:1001 /work/repo && chmod 2750 /work/repo',
        'cp /bin/busybox /work/suid && chmod 4755 /work/suid',
        'echo cap > /work/cap-v2 && echo cap > /work/cap-v3 && chown 65535:65535 /work/cap-v3',
        'rm /etc/group', 'rm -rf /usr/local && mkdir -p /usr/local/fresh',
      ].join(' && '));
      // A v2 capability set by host root, and a v3 one as `setcap` inside the sandbox writes it (root = the sandbox's base uid).
      const upper = path.join(d.root, 'sandboxes', sb.id, 'rootfs', 'work');
      await execa('setfattr', ['-n', 'security.capability', '-v', CAP_NET_RAW_V2, path.join(upper, 'cap-v2')]);
      const rootid = Buffer.alloc(4);
      rootid.writeUInt32LE(sb.uid_base!);
      await execa('setfattr', ['-n', 'security.capability', '-v', `0x0100000300200000000000000000000000000000${rootid.toString('hex')}`, path.join(upper, 'cap-v3')]);
      const c = await d.client.commit(sb.id, { image: 'exact:1' });
      const s = await d.client.snapshot(sb.id, { name: 'exact' });
      for (const digest of [c.layer.digest, s.layer]) {
        await withBlob(base, blob(digest), async (m) => {
          const st = async (p: string) => lstat(path.join(m, p));
          expect(await st('work/repo')).toMatchObject({ uid: 1000, gid: 1001, mode: 0o42750 });
          expect(await st('work/repo/file')).toMatchObject({ uid: 1000, gid: 1001 });
          expect(await st('work/suid')).toMatchObject({ uid: 0, gid: 0, mode: 0o104755 });
          expect(await st('work/cap-v3')).toMatchObject({ uid: 65535, gid: 65535 });
          // Both capabilities come out in the image's own form: v2, cap_net_raw effective and permitted.
          expect(await capOf(path.join(m, 'work/cap-v2'))).toBe(CAP_NET_RAW_V2.slice(2));
          expect(await capOf(path.join(m, 'work/cap-v3'))).toBe(CAP_NET_RAW_V2.slice(2));
          const wh = await st('etc/group');
          expect(wh.isCharacterDevice()).toBe(true);
          expect(wh).toMatchObject({ rdev: 0, uid: 0, gid: 0 });
          expect(await opaqueOf(path.join(m, 'usr/local'))).toBe('y');
          expect(await opaqueOf(path.join(m, 'work'))).toBeNull();
          // Overlayfs's own bookkeeping (origin handles, the mount's uuid) never ships.
          const x = await execa('getfattr', ['-R', '-h', '-d', '-m', '^trusted\\.', m]);
          expect(String(x.stdout).match(/^trusted\.[^=]+/gm)?.filter((k) => k !== 'trusted.overlay.opaque') ?? []).toEqual([]);
        });
      }
      // A sandbox of the committed image sees the same.
      const again = await d.client.createSandbox({ image: 'exact:1', filesystem: { writable_paths: ['/work'] } });
      try {
        expect(await sh(again.id, 'stat -c "%u:%g %a" /work/repo /work/suid; cat /work/repo/file; test -e /etc/group || echo gone; ls /usr/local')).toBe('1000:1001 2750\n0:0 4755\nanswer\ngone\nfresh\n');
      } finally {
        await d.client.deleteSandbox(again.id, { force: true });
      }
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('no layer built from a sandbox holds the agent socket, agent logs, exec history, session spools, PTY output, trajectory data or the create env', async () => {
    const hex = randomBytes(6).toString('hex');
    // Each marker exists only as a command's OUTPUT (or input), never as a literal in what the sandbox keeps on disk.
    const M = {
      env: `envtoken-${hex}`, argv: `ARGV-${hex}`, exec: `EXECOUT-${hex}`, session: `SESSOUT-${hex}`, stdin: `STDIN-${hex}`,
      pty: `PTYOUT-${hex}`, traj: `TRAJOUT-${hex}`, upload: `UPLOAD-${hex}`, archive: `ARCHIVE-${hex}`,
    };
    // Two writable paths dsecd creates in the writable layer: /work stays empty, /data gets the agent's result.
    const sb = await d.client.createSandbox({ image: 'busybox', env: { API_TOKEN: M.env }, filesystem: { writable_paths: ['/work', '/data'] } });
    try {
      // A plain exec, whose argv carries a marker of its own.
      const e = await d.client.exec(sb.id, { argv: ['sh', '-c', `true ${M.argv}; printf '%s-%s\\n' EXECOUT ${hex}`] });
      expect(e.stdout.toString()).toBe(`${M.exec}\n`);
      // An exec session with stdin and spooled output.
      const s1 = await d.client.startExec(sb.id, { argv: ['sh', '-c', `printf '%s-%s\\n' SESSOUT ${hex}; cat`], stdin: true });
      await d.client.writeExecStdin(sb.id, s1.exec_id, Buffer.from(`${M.stdin}\n`), { eof: true });
      expect((await d.client.waitExec(sb.id, s1.exec_id)).exit_code).toBe(0);
      // An interactive shell on a PTY: the typed line does not contain the output marker.
      const s2 = await d.client.startExec(sb.id, { argv: ['sh', '-i'], stdin: true, tty: { rows: 24, cols: 80 } });
      await d.client.writeExecStdin(sb.id, s2.exec_id, Buffer.from(`printf '%s-%s\\n' PTYOUT ${hex}\nexit\n`), { eof: true });
      await d.client.waitExec(sb.id, s2.exec_id);
      // A trajectory step.
      const t = await d.client.exec(sb.id, { argv: ['sh', '-c', `printf '%s-%s' TRAJOUT ${hex}`], trajectory: `traj-${hex}`, step: 0 });
      expect(t.stdout.toString()).toBe(M.traj);
      // File uploads: these are the sandbox's own content and must ship.
      await d.client.writeFile(sb.id, '/root/uploaded.txt', Buffer.from(M.upload));
      await d.client.putArchive(sb.id, '/root', await makeTar([{ name: 'arch.txt', body: M.archive }]));
      // What the agent leaves behind from an upload cut short; the agent's result in a dsec-made directory.
      await sh(sb.id, 'touch /root/.uploaded.txt.dsec-99-1.tmp /root/.dsec-99-2.tmp && echo result > /data/result');
      // The driver recorded the directories it made for writable_paths.
      expect(JSON.parse(readFileSync(path.join(d.root, 'sandboxes', sb.id, 'upper-created.json'), 'utf8'))).toEqual(['data', 'work']);

      // Proof that the markers exist host-side: session spools, the trajectory in the store.
      const spools = readdirSync(path.join(d.root, 'sandboxes', sb.id, 'execs')).map((f) => readFileSync(path.join(d.root, 'sandboxes', sb.id, 'execs', f), 'utf8')).join('\n');
      for (const m of [M.session, M.stdin, M.pty]) expect(spools).toContain(m);
      const steps = [];
      for await (const rec of d.client.exportTrajectory(`traj-${hex}`)) steps.push(rec);
      expect(steps.map((x) => Buffer.from(x.stdout_b64 ?? '', 'base64').toString())).toEqual([M.traj]);
      expect(existsSync(path.join(d.root, 'sandboxes', sb.id, 'agent.sock'))).toBe(true);

      const c = await d.client.commit(sb.id, { image: `clean:${hex}` });
      expect(c.stripped).toEqual(expect.arrayContaining(['work', 'root/.uploaded.txt.dsec-99-1.tmp', 'root/.dsec-99-2.tmp']));
      expect(c.stripped).not.toContain('data');
      expect(c.image.config.env.join('\n')).not.toContain(M.env);
      expect(c.warnings.join('\n')).toContain('API_TOKEN');
      expect(c.warnings.join('\n')).not.toContain(M.env);
      const manifestText = readFileSync(path.join(d.root, 'images', 'manifests', 'clean', `@${hex}.json`), 'utf8');
      expect(manifestText).not.toContain(M.env);
      const snap = await d.client.snapshot(sb.id, { name: `s-${hex}` });

      for (const [what, digest] of [['commit', c.layer.digest], ['snapshot', snap.layer]] as const) {
        await withBlob(base, blob(digest), async (m) => {
          const all = String((await execa('find', [m, '-printf', '%y %P\\n'])).stdout).split('\n');
          const names = all.map((l) => l.slice(2));
          // No socket of any kind, and nothing named like dsec's host-side state.
          expect(all.filter((l) => l.startsWith('s ')), what).toEqual([]);
          expect(names.filter((n) => /(^|\/)(agent\.sock|agent\.log|runtime\.log|\.dsec-agent|execs)$|\.(stdout|stderr)$|dsec-\d+-\d+\.tmp$/.test(n)), what).toEqual([]);
          // No marker of an exec, a session, stdin, a PTY, a trajectory or the env anywhere in the layer's files.
          for (const marker of [M.argv, M.exec, M.session, M.stdin, M.pty, M.traj, M.env]) {
            const g = await execa('grep', ['-r', '-a', '-l', '-F', marker, m], { reject: false });
            expect(g.exitCode, `${what}: ${marker} found in ${String(g.stdout)}`).toBe(1);
          }
          // Uploaded files are the sandbox's content: they ship.
          expect(await readFile(path.join(m, 'root/uploaded.txt'), 'utf8')).toBe(M.upload);
          expect(await readFile(path.join(m, 'root/arch.txt'), 'utf8')).toBe(M.archive);
          // The empty dsec-made directory: stripped from the commit, kept by the (unstripped)
          // snapshot; the one the agent filled is its work and ships either way.
          expect(existsSync(path.join(m, 'work')), what).toBe(what === 'snapshot');
          expect(await readFile(path.join(m, 'data/result'), 'utf8')).toBe('result\n');
        });
      }
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });
});
