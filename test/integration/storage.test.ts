/**
 * The writable-layer store across the lifecycle of an instance (slot 31; daemons one
 * after the other): an upgrade from `upper_fs = "host"` (sandboxes made before the store
 * still start, snapshot, commit and destroy), a dsecd SIGKILL (sandboxes keep running on
 * the mounted store and are adopted; still one mount and one loop device), orphan
 * subvolumes removed at start, a quota lifted for an overlay mount by a dsecd that was
 * then killed (put back at the next start), `dsecd --purge` (no mount, no loop device, no image), and
 * an operator's own btrfs given as `[storage] path`.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statfsSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import { IS_ROOT, REPO, TestDaemon, loopDevicesReleased, loopDevicesUnder } from './harness.js';

const BTRFS_SUPER_MAGIC = 0x9123683e;

/** Mount points in this namespace that are exactly `p`. */
function mountsAt(p: string): number {
  return readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.split(' ')[4] === p).length;
}

/**
 * The max-referenced limit of a sandbox's btrfs qgroup in bytes, or null for none, as
 * `btrfs qgroup show` reads it from the quota tree (independent of dsecd's addon).
 */
async function maxReferenced(d: TestDaemon, id: string): Promise<number | null> {
  const r = await execa('btrfs', ['qgroup', 'show', '-re', '--raw', d.storeMount]);
  const row = r.stdout.split('\n').map((l) => l.trim().split(/\s+/)).find((f) => f[f.length - 1] === `sb/${id}`);
  if (!row) throw new Error(`no qgroup for sb/${id} in:\n${r.stdout}`);
  return row[3] === 'none' ? null : Number(row[3]);
}

async function sh(d: TestDaemon, id: string, script: string): Promise<string> {
  return (await d.client.exec(id, { argv: ['sh', '-c', script] })).stdout.toString();
}

describe.skipIf(!IS_ROOT)('writable-layer store: upgrade, restarts, orphans, purge', () => {
  let d: TestDaemon;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 31, config: '[storage]\nupper_fs = "host"\n' });
  });
  afterAll(async () => {
    await d?.cleanup();
    if (d) expect(await loopDevicesReleased(d.root)).toEqual([]);
  });

  it('sandboxes made with upper_fs = "host" still run, start, snapshot, commit and destroy after a restart with the default store', async () => {
    expect((await d.client.hostInfo()).defences.disk_quota.enforced).toBe(false);
    expect(loopDevicesUnder(d.root)).toEqual([]);
    const running = await d.client.createSandbox({ image: 'busybox' });
    const stopped = await d.client.createSandbox({ image: 'busybox' });
    expect(running.disk_bytes).toBeNull();
    await sh(d, running.id, 'echo one > /root/data');
    await sh(d, stopped.id, 'echo two > /root/data');
    await d.client.stopSandbox(stopped.id, { timeoutMs: 0 });
    expect(d.upperDir(running.id)).toBe(path.join(d.root, 'sandboxes', running.id, 'upper'));

    // The upgrade: same root, default storage (auto: btrfs with quotas on this kernel).
    d.setConfig('');
    await d.restart();
    const host = await d.client.hostInfo();
    expect(host.defences.disk_quota.enforced).toBe(true);
    expect(loopDevicesUnder(d.root)).toHaveLength(1);

    // The old sandboxes: adopted or started on their host-filesystem layer, no quota.
    const r = await d.client.getSandbox(running.id);
    expect(r.state).toBe('running');
    expect(r.init_pid).toBe(running.init_pid);
    expect(r.disk_bytes).toBeNull();
    expect(r.disk_used_bytes).toBeNull();
    expect(r.defences?.disk_quota).toMatchObject({ enforced: false, detail: expect.stringMatching(/host filesystem/) });
    expect(await sh(d, running.id, 'cat /root/data')).toBe('one\n');
    await d.client.startSandbox(stopped.id);
    expect(await sh(d, stopped.id, 'cat /root/data')).toBe('two\n');
    expect((await d.client.sandboxStats(stopped.id)).disk_used_bytes).toBeNull();

    // A snapshot of an old sandbox restores into the store, with the default quota.
    const snap = await d.client.snapshot(running.id, {});
    const restored = await d.client.restore(snap.id);
    expect(restored.disk_bytes).toBe(10 * 1024 ** 3);
    expect(d.upperDir(restored.id)).toBe(path.join(d.storeMount, 'sb', restored.id, 'upper'));
    expect(await sh(d, restored.id, 'cat /root/data')).toBe('one\n');
    expect((await d.client.getSandbox(restored.id)).defences?.disk_quota.enforced).toBe(true);
    // A commit of the other one packs its host-filesystem layer.
    await d.client.commit(stopped.id, { image: 'upgraded:v1' });
    const fromCommit = await d.client.createSandbox({ image: 'upgraded:v1' });
    expect(await sh(d, fromCommit.id, 'cat /root/data')).toBe('two\n');

    // New sandboxes live in the store; the old ones' dirs go with them on destroy.
    expect((await d.traces()).store).toEqual([restored.id, fromCommit.id].sort());
    for (const sb of [running, stopped]) {
      await d.client.deleteSandbox(sb.id, { force: true });
      expect(existsSync(path.join(d.root, 'sandboxes', sb.id))).toBe(false);
    }
    await d.client.deleteSandbox(fromCommit.id, { force: true });
    expect((await d.traces()).store).toEqual([restored.id]);
    await d.client.deleteSandbox(restored.id, { force: true });
    await d.client.deleteSnapshot(snap.id);
    expect((await d.traces()).store).toEqual([]);
  });

  it('a SIGKILLed dsecd leaves the store mounted; its sandboxes keep running and are adopted; still one mount and one loop device', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', disk_bytes: 64 * 1024 ** 2 });
    await sh(d, sb.id, 'echo kept > /root/kept');
    await d.kill9();
    expect(mountsAt(d.storeMount)).toBe(1);
    expect(() => process.kill(sb.init_pid!, 0)).not.toThrow();
    await d.launch();
    const got = await d.client.getSandbox(sb.id);
    expect(got.state).toBe('running');
    expect(got.init_pid).toBe(sb.init_pid);
    expect(await sh(d, sb.id, 'cat /root/kept && dd if=/dev/zero of=/root/f bs=1M count=128 2>&1 | grep -c "quota exceeded"')).toBe('kept\n1\n');
    await d.restart();
    expect(mountsAt(d.storeMount)).toBe(1);
    expect(loopDevicesUnder(d.root)).toHaveLength(1);
    // stop/start keeps the layer (and its quota) on the store.
    await d.client.stopSandbox(sb.id, { timeoutMs: 0 });
    await d.client.startSandbox(sb.id);
    expect(await sh(d, sb.id, 'cat /root/kept')).toBe('kept\n');
    expect((await d.client.sandboxStats(sb.id)).disk_limit_bytes).toBe(64 * 1024 ** 2);
    await d.client.deleteSandbox(sb.id, { force: true });
  });

  it('a dsecd killed while a full layer\'s quota is lifted for its overlay mount leaves a record; the next start puts the limit back', async () => {
    const MiB = 1024 ** 2;
    const sb = await d.client.createSandbox({ image: 'busybox', disk_bytes: 64 * MiB });
    expect(await sh(d, sb.id, 'dd if=/dev/zero of=/root/f bs=1M count=128 2>&1 | grep -c "quota exceeded"')).toBe('1\n');
    expect(await maxReferenced(d, sb.id)).toBe(64 * MiB);
    await d.client.stopSandbox(sb.id, { timeoutMs: 0 });

    // SIGKILL with the overlay mounted and the quota lifted for that mount.
    await d.restart({ DSEC_FAILPOINT: 'start.after-rootfs' });
    await expect(d.client.startSandbox(sb.id)).rejects.toBeDefined();
    expect((await d.waitExit()).signal).toBe('SIGKILL');
    const record = path.join(d.root, 'storage', 'lifted', `${sb.id}.json`);
    expect(await maxReferenced(d, sb.id)).toBeNull();
    expect(JSON.parse(readFileSync(record, 'utf8'))).toMatchObject({ id: sb.id, limitBytes: 64 * MiB });

    // The next start puts the limit back before anything runs, and drops the record.
    await d.launch();
    expect(await maxReferenced(d, sb.id)).toBe(64 * MiB);
    expect(existsSync(record)).toBe(false);
    expect((await d.client.getSandbox(sb.id)).state).toBe('stopped');
    await d.client.startSandbox(sb.id);
    expect(await sh(d, sb.id, 'rm /root/f && echo removed && dd if=/dev/zero of=/root/g bs=1M count=128 2>&1 | grep -c "quota exceeded"')).toBe('removed\n1\n');
    expect(await maxReferenced(d, sb.id)).toBe(64 * MiB);
    await d.client.deleteSandbox(sb.id, { force: true });
  });

  it('a subvolume no row accounts for is removed at start', async () => {
    await d.stop();
    const orphan = 'deadbeefdeadbeef';
    await execa('btrfs', ['subvolume', 'create', path.join(d.storeMount, 'sb', orphan)]);
    mkdirSync(path.join(d.storeMount, 'sb', orphan, 'upper'));
    expect((await d.traces()).store).toEqual([orphan]);
    await d.launch();
    expect((await d.traces()).store).toEqual([]);
  });

  it('dsecd --purge unmounts the store, detaches its loop device and deletes the image', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    await d.stop();
    const r = await execa(path.join(REPO, 'bin/dsecd'), ['--root', d.root, '--socket', d.socket, '--config', path.join(d.root, 'dsecd.toml'), '--purge'], { reject: false });
    expect(r.exitCode, r.stderr).toBe(0);
    expect(mountsAt(d.storeMount)).toBe(0);
    expect(loopDevicesUnder(d.root)).toEqual([]);
    expect(existsSync(path.join(d.root, 'storage', 'upper.img'))).toBe(false);
    expect(existsSync(path.join(d.root, 'storage', 'store.json'))).toBe(false);
    expect(existsSync(path.join(d.root, 'sandboxes', sb.id))).toBe(false);
    // The next start makes a new store.
    await d.launch();
    expect((await d.client.hostInfo()).defences.disk_quota.enforced).toBe(true);
    expect(loopDevicesUnder(d.root)).toHaveLength(1);
  });
});

describe.skipIf(!IS_ROOT)('writable-layer store on the operator\'s own btrfs ([storage] path)', () => {
  let d: TestDaemon;
  let tmp: string;
  let fsDir: string;
  beforeAll(async () => {
    tmp = mkdtempSync('/tmp/dsec-it-extfs-');
    const img = path.join(tmp, 'fs.img');
    fsDir = path.join(tmp, 'mnt');
    mkdirSync(fsDir);
    await execa('truncate', ['-s', '2G', img]);
    await execa('mkfs.btrfs', ['-q', '-f', img]);
    await execa('mount', ['-o', 'loop', img, fsDir]);
    mkdirSync(path.join(fsDir, 'dsec'));
    d = await TestDaemon.start({ slot: 31, config: `[storage]\npath = "${fsDir}/dsec"\n` });
  });
  afterAll(async () => {
    await d?.cleanup();
    if (fsDir) await execa('umount', [fsDir], { reject: false });
    if (tmp) {
      expect(loopDevicesUnder(tmp)).toEqual([]);
      rmSync(tmp, { recursive: true, force: true });
    }
  });

  it('turns quotas on, puts each sandbox in a subvolume there, and never mounts an image of its own', async () => {
    const h = await d.client.hostInfo();
    expect(h.defences.disk_quota).toMatchObject({ enforced: true, detail: expect.stringContaining(`the operator's btrfs filesystem at ${fsDir}/dsec`) });
    expect(existsSync(path.join(d.root, 'storage', 'upper.img'))).toBe(false);
    expect(loopDevicesUnder(d.root)).toEqual([]);
    const sb = await d.client.createSandbox({ image: 'busybox', disk_bytes: 32 * 1024 ** 2 });
    const upper = path.join(fsDir, 'dsec', 'sb', sb.id, 'upper');
    expect(existsSync(upper)).toBe(true);
    expect(statfsSync(upper).type).toBe(BTRFS_SUPER_MAGIC);
    const show = await execa('btrfs', ['subvolume', 'show', path.join(fsDir, 'dsec', 'sb', sb.id)]);
    expect(show.stdout).toMatch(/Subvolume ID:/);
    expect(await sh(d, sb.id, 'dd if=/dev/zero of=/root/f bs=1M count=64 2>&1 | grep -c "quota exceeded"')).toBe('1\n');
    await d.client.deleteSandbox(sb.id, { force: true });
    expect(existsSync(path.join(fsDir, 'dsec', 'sb', sb.id))).toBe(false);
  });

  it('on a store smaller than [defaults] disk_bytes (2 GiB < 10 GiB), the default quota is the whole store; more is refused', async () => {
    const st = statfsSync(path.join(fsDir, 'dsec'));
    const sb = await d.client.createSandbox({ image: 'busybox' });
    expect(sb.disk_bytes).toBe(st.blocks * st.bsize);
    const e = await d.client.createSandbox({ image: 'busybox', disk_bytes: 10 * 1024 ** 3 }).catch((x: { code: string }) => x);
    expect(e).toMatchObject({ code: 'InvalidArgument' });
    await d.client.deleteSandbox(sb.id, { force: true });
  });
});
