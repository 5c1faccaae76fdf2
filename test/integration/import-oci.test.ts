// Import of docker-archive, oci-archive and OCI layout directories made by podman, composed
// exactly as a sandbox's rootfs (LayerMounts + prepareRootfs over idmapped EROFS lowers),
// and compared file by file with podman's own view of the same image (`podman image
// mount`: the image's merged layers, with nothing injected since no container exists).
// Root only; needs podman (runc) and /bin/busybox. No registry is contacted: the base
// image is `podman import`ed from a tar of a directory made here, the other layers are
// built with `podman build --network=none --pull=never`. One of them deletes several
// files in one RUN: podman writes the second and later whiteouts of such a layer as
// regular-file entries with a link name (they share one overlay whiteout inode), which
// the importer must take as whiteouts like the first.
//
// Compared per path: type, mode (incl. setuid), owner (ours shifted down by the uid base),
// size, symlink target, sha256 of file contents, link count. Ignored: the root directory's
// own owner/mode (ours is the sandbox's upper dir, podman's its own) and all mtimes
// (EROFS layers are built with -T0: every mtime is 0 by design). Nothing else is ignored.
//
// Teardown: rootfs and layer mounts, podman image mounts, the two podman images (removed
// by the exact names given here), and the temp dir.
import { execa } from 'execa';
import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync } from 'node:fs';
import { chmod, chown, copyFile, link, lstat, mkdir, readdir, readFile, readlink, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isDsecError } from '../../daemon/errors.js';
import * as native from '../../daemon/host/native.js';
import { importArchive, importArchiveWithNotes, importTar } from '../../daemon/image/import/oci.js';
import { LayerMounts } from '../../daemon/image/mounts.js';
import { listMountsUnder, prepareRootfs, removeSandboxDir } from '../../daemon/image/rootfs.js';
import { LayerStore, type ImageManifest } from '../../daemon/image/layer-store.js';

const isRoot = process.getuid?.() === 0;
const hasPodman = existsSync('/usr/bin/podman') && existsSync('/bin/busybox');
const BASE_IMG = 'localhost/dsec-import-test-base:1';
const TOP_IMG = 'localhost/dsec-import-test-top:1';
const UID_BASE = 1_500_000; // disjoint from the ranges other rootfs tests use
const COUNT = 65536;

/** path -> "type mode uid:gid size nlink content" for every entry below root (root itself excluded). */
async function tree(root: string, uidShift = 0): Promise<Map<string, string>> {
  const out = new Map<string, string>();
  const walk = async (rel: string): Promise<void> => {
    for (const name of (await readdir(join(root, rel))).sort()) {
      const r = rel ? `${rel}/${name}` : name;
      const p = join(root, r);
      const st = await lstat(p);
      const owner = `${st.uid - uidShift}:${st.gid - uidShift}`;
      const mode = (st.mode & 0o7777).toString(8);
      let desc: string;
      if (st.isDirectory()) desc = `dir ${mode} ${owner}`;
      else if (st.isSymbolicLink()) desc = `symlink ${owner} -> ${await readlink(p)}`;
      else if (st.isFile()) desc = `file ${mode} ${owner} ${st.size} n${st.nlink} ${createHash('sha256').update(await readFile(p)).digest('hex')}`;
      else if (st.isFIFO()) desc = `fifo ${mode} ${owner}`;
      else if (st.isCharacterDevice()) desc = `char ${mode} ${owner} ${st.rdev}`;
      else desc = `other ${mode} ${owner}`;
      out.set(r, desc);
      if (st.isDirectory()) await walk(r);
    }
  };
  await walk('');
  return out;
}

describe.skipIf(!isRoot || !hasPodman)('import from podman archives, composed like a sandbox (root, podman)', () => {
  let base: string;
  let store: LayerStore;
  let layers: LayerMounts;
  const podmanMounted = new Set<string>();
  const held: string[] = []; // layer digests acquired and not yet released
  let dockerTar: string;
  let ociTar: string;
  let baseTar: string;

  const podman = (args: string[]) => execa('podman', args, { stdin: 'ignore' });

  beforeAll(async () => {
    const addon = join(native.repoRoot(), native.ADDON_RELATIVE_PATH);
    if (!existsSync(addon)) await execa('make', ['-C', join(native.repoRoot(), 'native/addon')]);
    base = mkdtempSync(join(tmpdir(), 'dsec-import-oci-'));
    await chmod(base, 0o711);
    store = new LayerStore({ root: join(base, 'images') });
    await store.init();
    layers = new LayerMounts({ mountDir: join(base, 'layers'), blobPath: (d) => store.blobPath(d) });

    // The base root filesystem: busybox and some applets, files, dirs, owners, setuid, a hard link, a fifo.
    const rootfs = join(base, 'rootfs');
    for (const d of ['bin', 'etc/gone-dir/sub', 'data/dir/sub', 'data/keep', 'empty', 'run', 'home/user']) await mkdir(join(rootfs, d), { recursive: true });
    await copyFile('/bin/busybox', join(rootfs, 'bin/busybox'));
    await chmod(join(rootfs, 'bin/busybox'), 0o755);
    for (const a of ['sh', 'ls', 'rm', 'mkdir', 'echo', 'cat']) await symlink('busybox', join(rootfs, 'bin', a));
    await writeFile(join(rootfs, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n');
    await writeFile(join(rootfs, 'data/a.txt'), 'to be deleted\n');
    for (const f of ['etc/a', 'etc/b', 'etc/c', 'etc/keep', 'etc/gone-dir/sub/f']) await writeFile(join(rootfs, f), `${f}\n`);
    await symlink('keep', join(rootfs, 'etc/gone-link'));
    await writeFile(join(rootfs, 'data/b.txt'), 'stays\n');
    await link(join(rootfs, 'data/b.txt'), join(rootfs, 'data/b-hard'));
    await writeFile(join(rootfs, 'data/dir/o1'), 'old 1\n');
    await writeFile(join(rootfs, 'data/dir/sub/o2'), 'old 2\n');
    await writeFile(join(rootfs, 'data/keep/k'), 'kept\n');
    await writeFile(join(rootfs, 'data/suid'), '#!/bin/sh\n');
    await chmod(join(rootfs, 'data/suid'), 0o4755);
    await symlink('/data/b.txt', join(rootfs, 'data/abs-link'));
    await writeFile(join(rootfs, 'home/user/.profile'), 'export X=1\n');
    await chown(join(rootfs, 'home/user/.profile'), 1000, 1000);
    await chown(join(rootfs, 'home/user'), 1000, 1000);
    await chmod(join(rootfs, 'home/user'), 0o700);
    await execa('mkfifo', ['-m', '0620', join(rootfs, 'run/fifo')]);
    baseTar = join(base, 'base.tar');
    await execa('tar', ['-C', rootfs, '--numeric-owner', '-cf', baseTar, '.']);

    await podman(['import', baseTar, BASE_IMG]);
    const ctx = join(base, 'ctx');
    await mkdir(ctx);
    await writeFile(
      join(ctx, 'Containerfile'),
      [
        `FROM ${BASE_IMG}`,
        'RUN rm /data/a.txt && rm -rf /data/dir && mkdir /data/dir && echo new > /data/dir/n',
        // Several deletions in one layer: whiteouts 2.. are typeflag-0 entries with a link name.
        'RUN rm -rf /etc/a /etc/b /etc/c /etc/gone-dir /etc/gone-link',
        'ENV FOO=bar',
        'WORKDIR /data',
        'USER 1000:1000',
        'ENTRYPOINT ["/bin/sh", "-c"]',
        'CMD ["echo hi"]',
        '',
      ].join('\n'),
    );
    await podman(['build', '--network=none', '--pull=never', '--runtime', 'runc', '-t', TOP_IMG, ctx]);
    dockerTar = join(base, 'docker.tar');
    ociTar = join(base, 'oci.tar');
    await podman(['save', '--format', 'docker-archive', '-o', dockerTar, TOP_IMG]);
    await podman(['save', '--format', 'oci-archive', '-o', ociTar, TOP_IMG]);
  });

  afterAll(async () => {
    for (const d of held.splice(0)) await layers?.release(d).catch(() => undefined);
    for (const img of podmanMounted) await execa('podman', ['image', 'unmount', img], { reject: false });
    await execa('podman', ['rmi', TOP_IMG], { reject: false });
    await execa('podman', ['rmi', BASE_IMG], { reject: false });
    if (!base) return;
    for (const m of (await listMountsUnder(base)).reverse()) {
      try {
        native.umount(m, native.constants().MNT_DETACH);
      } catch {
        /* already gone */
      }
    }
    expect(await listMountsUnder(base)).toEqual([]);
    await rm(base, { recursive: true, force: true });
  });

  /** Entries of the store's tmp/ that an import left behind (none, ever). */
  const importLeftovers = async () => (await readdir(join(base, 'images/tmp'))).filter((f) => f.includes('-import-'));

  /** Mounts `m` as a sandbox would, returns its tree (owners shifted back), tears it down. */
  async function composedTree(m: ImageManifest, sandbox: string): Promise<Map<string, string>> {
    const lowers: string[] = [];
    for (const d of m.layers) {
      lowers.push(await layers.acquire(d));
      held.push(d);
    }
    const dir = join(base, 'sandboxes', sandbox);
    try {
      const { rootfs } = await prepareRootfs({ dir, lowers, uidBase: UID_BASE, gidBase: UID_BASE, count: COUNT });
      return await tree(rootfs, UID_BASE);
    } finally {
      await removeSandboxDir(dir);
      for (const d of m.layers) {
        await layers.release(d);
        held.splice(held.indexOf(d), 1);
      }
    }
  }

  async function podmanTree(img: string): Promise<Map<string, string>> {
    const { stdout } = await podman(['image', 'mount', img]);
    podmanMounted.add(img);
    try {
      return await tree(stdout.trim());
    } finally {
      await podman(['image', 'unmount', img]);
      podmanMounted.delete(img);
    }
  }

  let fromDocker: ImageManifest;
  let fromOci: ImageManifest;

  it('the layer with several deletions really has whiteouts with a link name (what node-tar refused)', async () => {
    const dir = join(base, 'docker-unpacked');
    await mkdir(dir);
    await execa('tar', ['-C', dir, '-xf', dockerTar]);
    const dm = JSON.parse(await readFile(join(dir, 'manifest.json'), 'utf8'));
    expect(dm[0].Layers).toHaveLength(3);
    const raw = await readFile(join(dir, dm[0].Layers[2]));
    const whiteouts: string[] = [];
    for (let off = 0; off + 512 <= raw.length; ) {
      const h = raw.subarray(off, off + 512);
      if (h.every((b) => b === 0)) break;
      const str = (a: number, n: number) => h.subarray(a, a + n).toString('latin1').replace(/\0.*$/s, '');
      const size = parseInt(str(124, 12).trim() || '0', 8);
      if (/\/\.wh\.[^/]+$/.test(str(0, 100))) whiteouts.push(`${str(0, 100)} ${str(156, 1)} ${str(157, 100)}`);
      off += 512 + Math.ceil(size / 512) * 512;
    }
    expect(whiteouts).toHaveLength(5);
    expect(whiteouts.filter((w) => /^\S+ 0 \S+$/.test(w)).length).toBeGreaterThanOrEqual(1); // typeflag 0 + link name
  });

  it('imports the docker-archive and the oci-archive to the same layers and config', async () => {
    const phases: string[] = [];
    const withNotes = await importArchiveWithNotes(store, dockerTar, { name: 'imp/docker', tag: '1', onProgress: (p) => phases.push(p.phase) });
    fromDocker = withNotes.manifest;
    expect(withNotes.notes).toEqual([]); // podman's whiteout quirk is no sanitisation
    fromOci = await importArchive(store, ociTar, { name: 'imp/oci', tag: '1' });
    expect(fromDocker.layers).toHaveLength(3);
    expect(fromOci.layers).toEqual(fromDocker.layers); // same layer content -> same reproducible blobs
    expect(fromDocker.config).toEqual({
      env: expect.arrayContaining(['FOO=bar', expect.stringMatching(/^PATH=/)]),
      cwd: '/data',
      user: '1000:1000',
      cmd: ['/bin/sh', '-c', 'echo hi'],
    });
    expect(fromOci.config).toEqual(fromDocker.config);
    expect(await store.get('imp/oci:1')).toEqual(fromOci);
    for (const d of fromOci.layers) await store.verifyBlob(d);
    expect(new Set(phases)).toEqual(new Set(['unpack', 'layer', 'build', 'manifest']));
    expect(await importLeftovers()).toEqual([]);
  });

  it('composes the layers into the same tree as podman, whiteouts and opaque dir honoured', async () => {
    const want = await podmanTree(TOP_IMG);
    if (process.env.DSEC_DEBUG_TREE) console.log(want);
    for (const [m, sb] of [[fromDocker, 'docker'], [fromOci, 'oci']] as const) {
      const got = await composedTree(m, sb);
      expect(Object.fromEntries(got)).toEqual(Object.fromEntries(want));
    }
    // The points of the exercise, spelled out (podman's tree has them too, or equality would fail).
    const got = await composedTree(fromOci, 'spelled');
    expect(got.has('data/a.txt')).toBe(false); // whiteout
    for (const gone of ['etc/a', 'etc/b', 'etc/c', 'etc/gone-dir', 'etc/gone-link']) expect(got.has(gone), gone).toBe(false); // whiteouts 2.. of one layer
    expect(got.get('etc/keep')).toMatch(/^file 644 0:0 9 /);
    expect([...got.keys()].filter((k) => k.startsWith('data/dir/'))).toEqual(['data/dir/n']); // opaque dir
    expect(got.get('data/keep/k')).toMatch(/^file 644 0:0 5 /);
    expect(got.get('data/suid')).toMatch(/^file 4755 /);
    expect(got.get('home/user/.profile')).toMatch(/^file 644 1000:1000 /);
    expect(got.get('run/fifo')).toBe('fifo 620 0:0');
    expect(got.get('data/b-hard')).toMatch(/ n2 /);
    expect(await listMountsUnder(join(base, 'layers'))).toEqual([]);
  });

  it('imports an OCI layout directory, and a plain rootfs tar as one layer', async () => {
    const layout = join(base, 'layout');
    await mkdir(layout);
    await execa('tar', ['-C', layout, '-xf', ociTar]);
    const m = await importArchive(store, layout, { name: 'imp/layout', tag: '1' });
    expect(m.layers).toEqual(fromOci.layers);

    // zstd-compressed layers (podman pushes to a local oci: directory, no registry involved);
    // this layout's ref.name is a bare tag ("zst"), which a ref with that tag selects.
    const zlayout = join(base, 'layout-zstd');
    await podman(['push', '--compression-format', 'zstd', TOP_IMG, `oci:${zlayout}:zst`]);
    const z = await importArchive(store, zlayout, { name: 'imp/zstd', tag: '1', ref: 'whatever:zst' });
    expect(z.layers).toEqual(fromOci.layers); // same uncompressed content, same blobs

    const t = await importTar(store, baseTar, { name: 'imp/rootfs', tag: 'latest', config: { cmd: ['/bin/busybox', 'sh'] } });
    expect(t.layers).toEqual(fromOci.layers.slice(0, 1)); // podman's base layer holds the same tree
    expect(t.config).toMatchObject({ cwd: '/', user: '0', cmd: ['/bin/busybox', 'sh'] });
    const want = await podmanTree(BASE_IMG);
    expect(Object.fromEntries(await composedTree(t, 'rootfs-tar'))).toEqual(Object.fromEntries(want));
    expect(await importLeftovers()).toEqual([]);
  });

  it('refuses a tampered blob, naming its digest, and leaves no manifest or temp dir', async () => {
    const layout = join(base, 'tampered');
    await mkdir(layout);
    await execa('tar', ['-C', layout, '-xf', ociTar]);
    const index = JSON.parse(await readFile(join(layout, 'index.json'), 'utf8'));
    const manifest = JSON.parse(await readFile(join(layout, 'blobs/sha256', index.manifests[0].digest.slice(7)), 'utf8'));
    const top = manifest.layers[1].digest as string;
    const blob = join(layout, 'blobs/sha256', top.slice(7));
    const bytes = await readFile(blob);
    bytes[9] ^= 0x01; // the gzip header's OS byte: still decompresses to the same tar, but the digest differs
    await rm(blob);
    await writeFile(blob, bytes);
    await expect(importArchive(store, layout, { name: 'imp/tampered', tag: '1' })).rejects.toSatisfy(
      (e: unknown) => isDsecError(e, 'InvalidArgument') && (e as Error).message.includes(`${top}: the blob hashes to sha256:`),
    );
    await expect(store.get('imp/tampered:1')).rejects.toSatisfy((e: unknown) => isDsecError(e, 'NotFound'));

    // docker-archive: a changed byte of file data inside a layer tar breaks its diff_id.
    const dock = join(base, 'tampered-docker');
    await mkdir(dock);
    await execa('tar', ['-C', dock, '-xf', dockerTar]);
    const dm = JSON.parse(await readFile(join(dock, 'manifest.json'), 'utf8'));
    const layerTar = join(dock, dm[0].Layers[1]);
    const lb = await readFile(layerTar);
    const at = lb.indexOf(Buffer.from('new\n'));
    expect(at).toBeGreaterThan(0);
    lb[at] = 'N'.charCodeAt(0);
    await rm(layerTar);
    await writeFile(layerTar, lb);
    await expect(importArchive(store, dock, { name: 'imp/tampered', tag: '2' })).rejects.toSatisfy(
      (e: unknown) => isDsecError(e, 'InvalidArgument') && /diff_ids/.test((e as Error).message),
    );
    await expect(store.get('imp/tampered:2')).rejects.toSatisfy((e: unknown) => isDsecError(e, 'NotFound'));
    expect(await importLeftovers()).toEqual([]);
  });

  it('needs a ref for a multi-image archive and lists the refs', async () => {
    const multi = join(base, 'multi.tar');
    await podman(['save', '--multi-image-archive', '--format', 'docker-archive', '-o', multi, BASE_IMG, TOP_IMG]);
    await expect(importArchive(store, multi, { name: 'imp/multi', tag: '1' })).rejects.toSatisfy(
      (e: unknown) => isDsecError(e, 'InvalidArgument') && (e as Error).message.includes(BASE_IMG) && (e as Error).message.includes(TOP_IMG),
    );
    const m = await importArchive(store, multi, { name: 'imp/multi', tag: '1', ref: 'dsec-import-test-base:1' });
    expect(m.layers).toEqual(fromOci.layers.slice(0, 1));
    await expect(importArchive(store, multi, { name: 'imp/multi', tag: '2', ref: 'nosuch:1' })).rejects.toSatisfy(
      (e: unknown) => isDsecError(e, 'InvalidArgument') && /no image "nosuch:1"/.test((e as Error).message),
    );
    await expect(importArchive(store, baseTar, { name: 'imp/notarchive', tag: '1' })).rejects.toSatisfy(
      (e: unknown) => isDsecError(e, 'InvalidArgument') && /imported as type "tar"/.test((e as Error).message) && !/importTar/.test((e as Error).message),
    );
    await expect(importArchive(store, join(base, 'nope.tar'), { name: 'imp/x', tag: '1' })).rejects.toSatisfy((e: unknown) => isDsecError(e, 'NotFound'));
    expect(await importLeftovers()).toEqual([]);
  });
});
