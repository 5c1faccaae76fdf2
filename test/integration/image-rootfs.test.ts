// Image store + layer mounts + rootfs composition against the real kernel (root only):
// file-backed EROFS mounts, idmapped lowers, overlayfs, cleanup after "crashes".
// Everything lives under one temp dir that afterAll unmounts and deletes.
import { execa } from 'execa';
import { closeSync, existsSync, mkdtempSync } from 'node:fs';
import { chmod, copyFile, lstat, mkdir, readFile, readdir, readlink, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isDsecError } from '../../daemon/errors.js';
import * as native from '../../daemon/host/native.js';
import { LayerMounts } from '../../daemon/image/mounts.js';
import { listMountsUnder, overlayLayerNaming, prepareRootfs, removeSandboxDir, teardownRootfs } from '../../daemon/image/rootfs.js';
import { LayerStore } from '../../daemon/image/layer-store.js';

const isRoot = process.getuid?.() === 0;
const COUNT = 65536;
const BASE_A = 1_100_000; // two disjoint id ranges, far from any real user
const BASE_B = 1_300_000;

describe.skipIf(!isRoot)('image store, layer mounts and rootfs (root)', () => {
  let base: string;
  let store: LayerStore;
  let layers: LayerMounts;
  let busybox: string; // digest of the busybox layer

  beforeAll(async () => {
    const addon = join(native.repoRoot(), native.ADDON_RELATIVE_PATH);
    if (!existsSync(addon)) await execa('make', ['-C', join(native.repoRoot(), 'native/addon')]);
    base = mkdtempSync(join(tmpdir(), 'dsec-rootfs-'));
    await chmod(base, 0o711); // host uid BASE_A must be able to reach the rootfs below
    store = new LayerStore({ root: join(base, 'images') });
    await store.init();
    layers = new LayerMounts({ mountDir: join(base, 'layers'), blobPath: (d) => store.blobPath(d) });
  });

  afterAll(async () => {
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

  it('builds the busybox image once and serves it by name and name:tag', async () => {
    await Promise.all([store.ensureBuiltinImages(), store.ensureBuiltinImages()]);
    const m = await store.get('busybox');
    expect(await store.get('busybox:latest')).toEqual(m);
    expect(m.layers).toHaveLength(1);
    busybox = m.layers[0];
    expect(busybox).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(m.config.cmd).toEqual(['/bin/sh']);
    expect(existsSync(store.blobPath(busybox))).toBe(true);
    await store.verifyBlob(busybox);
    expect((await store.list()).map((x) => `${x.name}:${x.tag}`)).toEqual(['busybox:latest']);
    expect(await readdir(join(base, 'images/tmp'))).toEqual([]);

    // A second store on the same root (a daemon restart) finds it instead of rebuilding.
    const again = new LayerStore({ root: join(base, 'images') });
    await again.init();
    await again.ensureBuiltinImages();
    expect((await again.get('busybox')).created_ms).toBe(m.created_ms);

    await expect(store.get('nosuch')).rejects.toSatisfy((e: unknown) => isDsecError(e, 'NotFound'));
    await expect(store.get('Bad Ref')).rejects.toSatisfy((e: unknown) => isDsecError(e, 'InvalidArgument'));
    await expect(store.verifyBlob(`sha256:${'0'.repeat(64)}`)).rejects.toSatisfy((e: unknown) => isDsecError(e, 'NotFound'));
  });

  it('reports native errors with errno code, syscall and path', async () => {
    const missing = join(base, 'no/such/dir');
    expect(() => native.idmapMount(missing, base, BASE_A, BASE_A, COUNT, true)).toThrow(
      expect.objectContaining({ code: 'ENOENT', syscall: 'open_tree', path: missing, message: expect.stringContaining(missing) }),
    );
    expect(() => native.umount(base, 0)).toThrow(expect.objectContaining({ code: 'EINVAL', syscall: 'umount2' }));
    expect(() => native.userns(BASE_A, BASE_A, 0)).toThrow(RangeError);
    expect(() => native.mount(null, base, 'overlay', 0, 'x'.repeat(5000))).toThrow(RangeError);
    expect(native.isMountpoint('/')).toBe(true);
    expect(native.isMountpoint(base)).toBe(false);
    expect(native.isMountpointOrMissing(missing)).toBe(false);
    expect(native.unmountAll(missing)).toBe(0);
    const fd = native.userns(BASE_A, BASE_B, COUNT);
    closeSync(fd);
  });

  it('detects a corrupt blob', async () => {
    const tree = join(base, 'corrupt-tree');
    await mkdir(tree, { recursive: true });
    await writeFile(join(tree, 'f'), 'x');
    const { digest } = await store.addLayerFromDir(tree);
    await store.verifyBlob(digest);
    await rm(store.blobPath(digest));
    await writeFile(store.blobPath(digest), 'not erofs');
    await expect(store.verifyBlob(digest)).rejects.toSatisfy((e: unknown) => isDsecError(e, 'FailedPrecondition'));
    await expect(layers.acquire(digest)).rejects.toSatisfy((e: unknown) => isDsecError(e, 'Internal'));
    expect(await listMountsUnder(join(base, 'layers'))).toEqual([]);
    await rm(store.blobPath(digest));
    await expect(layers.acquire(digest)).rejects.toSatisfy((e: unknown) => isDsecError(e, 'NotFound'));
  });

  it('mounts a layer once for concurrent acquires and unmounts it at refcount 0', async () => {
    const dirs = await Promise.all([layers.acquire(busybox), layers.acquire(busybox), layers.acquire(busybox)]);
    expect(new Set(dirs).size).toBe(1);
    const dir = dirs[0];
    expect(await listMountsUnder(join(base, 'layers'))).toEqual([dir]);
    expect(layers.refCount(busybox)).toBe(3);
    expect(layers.mounted()).toEqual([busybox]);
    expect((await stat(join(dir, 'bin/busybox'))).uid).toBe(0);
    expect((await lstat(join(dir, 'bin/sh'))).isSymbolicLink()).toBe(true);
    await expect(writeFile(join(dir, 'nope'), 'x')).rejects.toMatchObject({ code: 'EROFS' });

    await layers.release(busybox);
    await layers.release(busybox);
    expect(await listMountsUnder(join(base, 'layers'))).toEqual([dir]);
    await Promise.all([layers.release(busybox), layers.release(busybox)]); // the extra one is a no-op
    expect(await listMountsUnder(join(base, 'layers'))).toEqual([]);
    expect(existsSync(dir)).toBe(false);
    expect(layers.mounted()).toEqual([]);
  });

  it('shows idmapped lowers owned by uidBase and lets uidBase write through the overlay', async () => {
    const lower = await layers.acquire(busybox);
    const sb = join(base, 'sandboxes/a');
    const { rootfs } = await prepareRootfs({ dir: sb, lowers: [lower], uidBase: BASE_A, gidBase: BASE_A, count: COUNT, keepLowerMounts: true });
    try {
      const l0 = await stat(join(sb, 'lower/0/bin/busybox'));
      expect([l0.uid, l0.gid]).toEqual([BASE_A, BASE_A]);
      expect((await stat(join(lower, 'bin/busybox'))).uid).toBe(0); // the shared blob mount is untouched
      const root = await stat(rootfs);
      expect([root.uid, root.gid, root.mode & 0o7777]).toEqual([BASE_A, BASE_A, 0o755]);
      expect((await stat(join(rootfs, 'etc/passwd'))).uid).toBe(BASE_A);
      expect((await stat(join(rootfs, 'tmp'))).mode & 0o7777).toBe(0o1777);

      // Host uid BASE_A is root of this sandbox: it may write in /root (0700, owned by it).
      await execa('/bin/sh', ['-c', 'echo hi > "$1/root/hello" && mkdir "$1/tmp/d"', 'sh', rootfs], { uid: BASE_A, gid: BASE_A });
      const up = await stat(join(sb, 'upper/root/hello'));
      expect([up.uid, up.gid]).toEqual([BASE_A, BASE_A]);
      expect(await readFile(join(sb, 'upper/root/hello'), 'utf8')).toBe('hi\n');
      expect((await stat(join(sb, 'upper/tmp/d'))).uid).toBe(BASE_A);
      // Another range's root is nobody here.
      await expect(execa('/bin/sh', ['-c', 'echo x > "$1/root/evil"', 'sh', rootfs], { uid: BASE_B, gid: BASE_B })).rejects.toThrow();

      expect(await listMountsUnder(sb)).toEqual([join(sb, 'lower/0'), join(sb, 'rootfs')]);
      await expect(prepareRootfs({ dir: sb, lowers: [lower], uidBase: BASE_A, gidBase: BASE_A, count: COUNT })).rejects.toSatisfy(
        (e: unknown) => isDsecError(e, 'FailedPrecondition'),
      );
    } finally {
      await teardownRootfs(sb);
    }
    expect(await listMountsUnder(sb)).toEqual([]);
    expect(existsSync(join(sb, 'lower'))).toBe(false);
    expect(existsSync(join(sb, 'rootfs'))).toBe(false);
    expect(existsSync(join(sb, 'upper/root/hello'))).toBe(true); // the writable layer survives
    await teardownRootfs(sb); // twice is fine

    // Start again: same upper, fresh (detached-by-default) lowers; the earlier write is there.
    const { rootfs: again } = await prepareRootfs({ dir: sb, lowers: [lower], uidBase: BASE_A, gidBase: BASE_A, count: COUNT });
    expect(await listMountsUnder(sb)).toEqual([again]); // only the overlay stays mounted
    expect(existsSync(join(sb, 'lower'))).toBe(false);
    expect(await readFile(join(again, 'root/hello'), 'utf8')).toBe('hi\n');
    expect((await stat(join(again, 'bin/busybox'))).uid).toBe(BASE_A); // lowers still idmapped via overlay's clones
    const r = await execa(join(again, 'bin/busybox'), ['cat', join(again, 'etc/passwd')]);
    expect(r.stdout).toContain('root:x:0:0');

    await removeSandboxDir(sb);
    expect(existsSync(sb)).toBe(false);
    await removeSandboxDir(sb); // twice is fine
    await layers.release(busybox);
    expect(await listMountsUnder(base)).toEqual([]);
  });

  it('gives two sandboxes with different ranges their own ownership over one shared layer mount', async () => {
    const [la, lb] = await Promise.all([layers.acquire(busybox), layers.acquire(busybox)]);
    expect(la).toBe(lb);
    const sa = join(base, 'sandboxes/two-a');
    const sbx = join(base, 'sandboxes/two-b');
    const [a, b] = await Promise.all([
      prepareRootfs({ dir: sa, lowers: [la], uidBase: BASE_A, gidBase: BASE_A, count: COUNT }),
      prepareRootfs({ dir: sbx, lowers: [lb], uidBase: BASE_B, gidBase: BASE_B + 7, count: COUNT }),
    ]);
    const fa = await stat(join(a.rootfs, 'bin/busybox'));
    const fb = await stat(join(b.rootfs, 'bin/busybox'));
    expect([fa.uid, fa.gid]).toEqual([BASE_A, BASE_A]);
    expect([fb.uid, fb.gid]).toEqual([BASE_B, BASE_B + 7]);
    expect(await listMountsUnder(join(base, 'layers'))).toEqual([la]);

    await Promise.all([removeSandboxDir(sa), removeSandboxDir(sbx)]);
    await layers.release(busybox);
    await layers.release(busybox);
    expect(await listMountsUnder(base)).toEqual([]);
  });

  it('composes several layers with the top layer winning', async () => {
    const t1 = join(base, 'tree-top');
    await mkdir(join(t1, 'etc'), { recursive: true });
    await writeFile(join(t1, 'etc/motd'), 'top layer\n');
    await writeFile(join(t1, 'etc/passwd'), 'root:x:0:0:top:/root:/bin/sh\n');
    const { digest: top } = await store.addLayerFromDir(t1, { allRoot: true });
    const lowers = [await layers.acquire(busybox), await layers.acquire(top)];
    const sb = join(base, 'sandboxes/multi');
    const { rootfs } = await prepareRootfs({ dir: sb, lowers, uidBase: BASE_A, gidBase: BASE_A, count: COUNT });
    expect(await readFile(join(rootfs, 'etc/motd'), 'utf8')).toBe('top layer\n');
    expect(await readFile(join(rootfs, 'etc/passwd'), 'utf8')).toContain(':top:');
    expect(existsSync(join(rootfs, 'bin/busybox'))).toBe(true);
    // Mounted from fds of detached clones: the options name no host path (docs/SECURITY.md).
    const line = (await readFile('/proc/self/mountinfo', 'utf8')).split('\n').find((l) => l.split(' ')[4] === rootfs)!;
    expect(line.slice(line.indexOf(' - '))).toMatch(/ - overlay overlay rw,lowerdir\+=\/,lowerdir\+=\/,upperdir=\/upper,workdir=\/work,/);
    expect(line.slice(line.indexOf(' - '))).not.toContain(base);
    expect(overlayLayerNaming().naming).toBe('hidden');
    await removeSandboxDir(sb);
    await layers.release(busybox);
    await layers.release(top);
    expect(await listMountsUnder(base)).toEqual([]);
  });

  it('a refused overlay mount names the failing step and carries overlayfs\'s own message', async () => {
    const lower = await layers.acquire(busybox);
    const dir = join(base, 'sandboxes/refused');
    await mkdir(join(dir, 'rootfs'), { recursive: true });
    await mkdir(join(dir, 'upper'), { recursive: true });
    await mkdir(join(dir, 'work'), { recursive: true });
    const nsfd = native.userns(BASE_A, BASE_A, COUNT);
    try {
      // The same directory as upper and work dir: overlayfs refuses it at superblock creation.
      const e = await native.mountOverlayAsync(join(dir, 'rootfs'), [lower], nsfd, dir, 'upper', 'upper', ['index=off']).then(() => null, (x: unknown) => x);
      expect(e).toMatchObject({ code: 'EINVAL', syscall: 'fsconfig:create', path: join(dir, 'rootfs') });
      // An option overlayfs does not know: its message comes along.
      const bad = await native.mountOverlayAsync(join(dir, 'rootfs'), [lower], nsfd, dir, 'upper', 'work', ['index=off', 'no_such_option=1']).then(() => null, (x: unknown) => x);
      expect(bad).toMatchObject({ code: 'EINVAL', syscall: 'fsconfig', path: 'no_such_option', kernelLog: expect.stringMatching(/Unknown parameter 'no_such_option'/) });
      expect((bad as Error).message).toMatch(/kernel: .*Unknown parameter/);
      const missing = await native.mountOverlayAsync(join(dir, 'rootfs'), [join(base, 'no-such-layer')], nsfd, dir, 'upper', 'work', []).then(() => null, (x: unknown) => x);
      expect(missing).toMatchObject({ code: 'ENOENT', syscall: 'open_tree', path: join(base, 'no-such-layer') });
    } finally {
      closeSync(nsfd);
    }
    expect(await listMountsUnder(dir)).toEqual([]);
    await removeSandboxDir(dir);
    await layers.release(busybox);
  });

  it('keeps setuid bits of a layer working through the overlay (the blob mount is nosuid)', async () => {
    const t = join(base, 'tree-suid');
    await mkdir(t, { recursive: true });
    // coreutils' id (busybox drops setuid privileges for applets that do not need them);
    // it is run from the host, so its dynamic loader and libraries are the host's.
    await copyFile('/usr/bin/id', join(t, 'id'));
    await chmod(join(t, 'id'), 0o4755);
    const { digest } = await store.addLayerFromDir(t, { allRoot: true });
    const lower = await layers.acquire(digest);
    const sb = join(base, 'sandboxes/suid');
    const { rootfs } = await prepareRootfs({ dir: sb, lowers: [lower], uidBase: BASE_A, gidBase: BASE_A, count: COUNT });
    try {
      // Host uid BASE_A+1000 is uid 1000 in the sandbox; the setuid-root binary makes it euid 0 there.
      const r = await execa(join(rootfs, 'id'), ['-u'], { uid: BASE_A + 1000, gid: BASE_A + 1000 });
      expect(r.stdout).toBe(String(BASE_A));
    } finally {
      await removeSandboxDir(sb);
      await layers.release(digest);
    }
  });

  it('cleans up after a crash between the idmapped mounts and the overlay', async () => {
    const lower = await layers.acquire(busybox);
    const sb = join(base, 'sandboxes/crashed');
    // What a crash mid-prepareRootfs leaves: lower/0 mounted, lower/1 empty, no overlay.
    await mkdir(join(sb, 'lower/0'), { recursive: true });
    await mkdir(join(sb, 'lower/1'), { recursive: true });
    await mkdir(join(sb, 'rootfs'), { recursive: true });
    native.idmapMount(lower, join(sb, 'lower/0'), BASE_A, BASE_A, COUNT, true);
    expect(await listMountsUnder(sb)).toEqual([join(sb, 'lower/0')]);

    // prepareRootfs copes with the leftovers.
    const { rootfs } = await prepareRootfs({ dir: sb, lowers: [lower], uidBase: BASE_A, gidBase: BASE_A, count: COUNT });
    expect(await listMountsUnder(sb)).toEqual([rootfs]);
    await teardownRootfs(sb);

    // And teardown copes with them too.
    await mkdir(join(sb, 'lower/0'), { recursive: true });
    native.idmapMount(lower, join(sb, 'lower/0'), BASE_A, BASE_A, COUNT, true);
    native.idmapMount(lower, join(sb, 'lower/0'), BASE_A, BASE_A, COUNT, true); // stacked twice
    await teardownRootfs(sb);
    expect(await listMountsUnder(sb)).toEqual([]);
    expect(existsSync(join(sb, 'upper'))).toBe(true);
    await removeSandboxDir(sb);
    await layers.release(busybox);
    expect(await listMountsUnder(base)).toEqual([]);
  });

  it('reconciles after a daemon crash: adopts used layers, unmounts unused ones', async () => {
    const t = join(base, 'tree-extra');
    await mkdir(t, { recursive: true });
    await writeFile(join(t, 'extra'), 'extra\n');
    const { digest: extra } = await store.addLayerFromDir(t, { allRoot: true });
    const t2 = join(base, 'tree-never');
    await mkdir(t2, { recursive: true });
    await writeFile(join(t2, 'never'), 'never mounted\n');
    const { digest: never } = await store.addLayerFromDir(t2, { allRoot: true });

    // "Before the crash": busybox used by 2 sandboxes, extra by 1 (released later).
    const old = new LayerMounts({ mountDir: join(base, 'layers'), blobPath: (d) => store.blobPath(d) });
    await old.acquire(busybox);
    await old.acquire(busybox);
    const extraDir = await old.acquire(extra);
    // A stacked duplicate (e.g. an older daemon that did not adopt) and an empty leftover dir.
    native.mount(store.blobPath(busybox), old.dirFor(busybox), 'erofs', native.constants().MS_RDONLY, null);
    await mkdir(join(base, 'layers', 'f'.repeat(64)));
    expect(await listMountsUnder(join(base, 'layers'))).toHaveLength(3);

    // "After the restart": the record says busybox has 2 users, `never` 1, extra none.
    const fresh = new LayerMounts({ mountDir: join(base, 'layers'), blobPath: (d) => store.blobPath(d) });
    const r = await fresh.reconcile(
      new Map([
        [busybox, 2],
        [never, 1],
      ]),
    );
    expect(r).toEqual({ adopted: [busybox], unmounted: [extra], missing: [never] });
    expect(await listMountsUnder(join(base, 'layers'))).toEqual([fresh.dirFor(busybox)]);
    expect(existsSync(extraDir)).toBe(false);
    expect(existsSync(join(base, 'layers', 'f'.repeat(64)))).toBe(false);
    expect(fresh.refCount(busybox)).toBe(2);
    expect(fresh.mounted()).toEqual([busybox]);

    // The adopted mount is reused, not stacked, and goes away when the last user releases it.
    expect(await fresh.acquire(busybox)).toBe(fresh.dirFor(busybox));
    expect(await listMountsUnder(join(base, 'layers'))).toHaveLength(1);
    fresh.adopt(busybox, 1);
    expect(() => fresh.adopt(extra, 1)).toThrow(/not mounted/);
    await fresh.release(busybox);
    expect(await listMountsUnder(join(base, 'layers'))).toEqual([]);

    // A Set means one reference each; reconciling an empty set unmounts everything.
    await old.reconcile(new Set());
    const again = new LayerMounts({ mountDir: join(base, 'layers'), blobPath: (d) => store.blobPath(d) });
    await again.acquire(busybox);
    const r2 = await new LayerMounts({ mountDir: join(base, 'layers'), blobPath: (d) => store.blobPath(d) }).reconcile(new Set());
    expect(r2).toEqual({ adopted: [], unmounted: [busybox], missing: [] });
    expect(await listMountsUnder(base)).toEqual([]);
    // The shared instance's counts are stale now that others unmounted behind its back.
    await layers.reconcile(new Set());
    expect(layers.mounted()).toEqual([]);
  });

  it('runs busybox as root of the sandbox inside a user namespace on the rootfs', async () => {
    // A runtime smoke test without runc (which would need a cgroup of its own): a holder
    // process in a new user+mount namespace gets the sandbox's mapping (written from here,
    // as root, like runc does), then nsenter (uid 0 inside = host BASE_A) chroots into
    // the overlay and checks that root inside owns / and writes land in upper/ as BASE_A.
    const lower = await layers.acquire(busybox);
    const sb = join(base, 'sandboxes/exec');
    const { rootfs } = await prepareRootfs({ dir: sb, lowers: [lower], uidBase: BASE_A, gidBase: BASE_A, count: COUNT });
    const holder = execa('unshare', ['--user', '--mount', '--', 'sleep', '600'], { reject: false });
    try {
      const pid = holder.pid!;
      const ours = await readlink('/proc/self/ns/user');
      while ((await readlink(`/proc/${pid}/ns/user`)) === ours) await new Promise((r) => setTimeout(r, 5));
      await writeFile(`/proc/${pid}/uid_map`, `0 ${BASE_A} ${COUNT}\n`);
      await writeFile(`/proc/${pid}/gid_map`, `0 ${BASE_A} ${COUNT}\n`);
      const script = 'id -u; stat -c %u / /bin/busybox; echo ok > /root/made-inside; touch /made-in-root';
      const r = await execa('nsenter', ['-t', String(pid), '-U', '-m', '--', '/usr/sbin/chroot', rootfs, '/bin/sh', '-c', script], {
        env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin' },
      });
      expect(r.stdout.split('\n')).toEqual(['0', '0', '0']);
      for (const f of ['upper/root/made-inside', 'upper/made-in-root']) {
        const st = await stat(join(sb, f));
        expect([st.uid, st.gid]).toEqual([BASE_A, BASE_A]);
      }
    } finally {
      holder.kill('SIGKILL');
      await holder;
      await removeSandboxDir(sb);
      await layers.release(busybox);
    }
    expect(await listMountsUnder(base)).toEqual([]);
  });
});
