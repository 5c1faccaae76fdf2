/**
 * Attacks on the writable layer's filesystem (slot 30; two daemons, one after the other).
 *
 * (a) Disk fill, on the default store (`upper_fs = "auto"`: btrfs with qgroups on this
 *     kernel, which has no XFS quota): a sandbox with a 64 MiB quota writes until the
 *     kernel refuses. It must stop near 64 MiB with EDQUOT, the host disk must not give
 *     the store more than about that, a neighbour must keep working during and after, and
 *     the quota event must appear. The same write under a 256 MiB quota goes past 64 MiB,
 *     so it is the quota that stopped the first one (the test can fail). A layer filled
 *     to its quota then starts again read-write (after stop/start and after a dsecd
 *     restart): deleting frees room and the quota still holds; overlayfs would mount it
 *     read-only if dsecd did not lift the quota for the mount. An overlay that comes up
 *     read-only anyway (an immutable work dir) fails the start with a clear error.
 *
 * (b) XFS_IOC_SWAPEXT on a real XFS (`upper_fs = "xfs"`; without XFS quota support here,
 *     so quotas are reported as not enforced). The upper dir is on XFS (statfs magic from
 *     the host; from inside, `stat -f` shows the overlay with the XFS's block counts).
 *     Inside, the swap of two files of the upper is EPERM under the default seccomp
 *     profile. With `ioctl` allowed the same call gets ENOTTY: it reaches the overlay,
 *     and overlayfs passes no XFS ioctl down (it only forwards the fileattr ioctls), so
 *     a sandbox process never holds a file of the XFS itself. On the host, the same
 *     probe on the same two files (now on the XFS directly) gets XFS's own answer: the
 *     XFS would take the call, so EPERM inside is seccomp's doing. The XFS stays mounted
 *     and a neighbour still writes.
 *
 * (c) The store as a shared pool (a 1 GiB store, `disk_overcommit = 1.5`): admission
 *     beyond the ratio, the pool guard's reserve and `sandbox.disk_pool_full`, and I/O
 *     limits on cgroup v1 (see the describe block).
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { mkdtempSync, readFileSync, rmSync, statSync, statfsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { IS_ROOT, REPO, TestDaemon, loopDevicesReleased, loopDevicesUnder, rejection, runCli } from '../integration/harness.js';

const MiB = 1024 ** 2;
const XFS_SUPER_MAGIC = 0x58465342;
const OVERLAYFS_SUPER_MAGIC = 0x794c7630;

/** Bytes of host disk the store image occupies (allocated blocks, not its apparent size), after a sync. */
async function imageAllocated(d: TestDaemon): Promise<number> {
  await execa('sync');
  return statSync(path.join(d.root, 'storage', 'upper.img')).blocks * 512;
}

/** Free bytes of the host filesystem that holds the instance root. */
function hostFree(d: TestDaemon): number {
  const st = statfsSync(d.root);
  return st.bavail * st.bsize;
}

/** Runs a shell script in a sandbox and returns exit code and output. */
async function sh(d: TestDaemon, id: string, script: string): Promise<{ code: number | null; out: string; err: string }> {
  const r = await d.client.exec(id, { argv: ['sh', '-c', script] });
  return { code: r.exit_code, out: r.stdout.toString(), err: r.stderr.toString() };
}

/** Writes up to `mib` MiB of zeros to `file` inside, in 1 MiB blocks; returns dd's output, its status and the file's size. */
async function fill(d: TestDaemon, id: string, file: string, mib: number): Promise<{ rc: number; size: number; out: string }> {
  const r = await sh(d, id, `dd if=/dev/zero of=${file} bs=1M count=${mib} 2>&1; echo "rc=$?"; sync; stat -c 'size=%s' ${file}`);
  return { rc: Number(/rc=(\d+)/.exec(r.out)?.[1]), size: Number(/size=(\d+)/.exec(r.out)?.[1]), out: r.out };
}

/** Collects the recorded events of a sandbox. */
async function eventsOf(d: TestDaemon, id: string): Promise<{ type: string; message?: string }[]> {
  const evs: { type: string; message?: string }[] = [];
  for await (const e of d.client.events()) if (e.sandbox_id === id) evs.push(e);
  return evs;
}

describe.skipIf(!IS_ROOT)('attack: fill the disk (default store: btrfs with a qgroup per sandbox)', () => {
  let d: TestDaemon;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 30 });
  });
  afterAll(async () => {
    await d?.cleanup();
    if (d) expect(await loopDevicesReleased(d.root)).toEqual([]);
  });

  it('host info reports per-sandbox quotas as enforced, on a loop-mounted btrfs', async () => {
    const h = await d.client.hostInfo();
    expect(h.defences.disk_quota.enforced).toBe(true);
    expect(h.defences.disk_quota.detail).toMatch(/btrfs subvolume with a qgroup limit/);
    expect(loopDevicesUnder(d.root)).toEqual([expect.stringContaining(path.join(d.root, 'storage', 'upper.img'))]);
  });

  it('a sandbox writing until it fails stops near its 64 MiB quota; the host disk and a neighbour are unaffected; the event appears', async () => {
    const neighbour = await d.client.createSandbox({ image: 'busybox' });
    const victim = await d.client.createSandbox({ image: 'busybox', disk_bytes: 64 * MiB });
    expect(victim.disk_bytes).toBe(64 * MiB);
    expect(neighbour.disk_bytes).toBe(10 * 1024 ** 3); // [defaults] disk_bytes
    const got = await d.client.getSandbox(victim.id);
    expect(got.defences?.disk_quota).toMatchObject({ enforced: true });
    const allocBefore = await imageAllocated(d);
    const freeBefore = hostFree(d);

    // The attack: write until the kernel refuses. Bounded at 2 GiB, so a broken quota
    // fails the test instead of filling the host disk. The neighbour writes 16 MiB at the
    // same time.
    const [f, during] = await Promise.all([
      fill(d, victim.id, '/root/fill', 2048),
      sh(d, neighbour.id, 'dd if=/dev/zero of=/root/n1 bs=1M count=16 2>/dev/null && sync && stat -c %s /root/n1 && echo ok'),
    ]);
    expect(during.out).toBe(`${16 * MiB}\nok\n`);
    expect(f.rc, f.out).not.toBe(0);
    expect(f.out).toMatch(/Disk quota exceeded/);
    expect(f.size).toBeLessThanOrEqual(64 * MiB);
    expect(f.size).toBeGreaterThan(56 * MiB);
    // Still full: a further write fails too.
    expect((await fill(d, victim.id, '/root/more', 8)).rc).not.toBe(0);

    // The host side: the image grew by the quota plus the neighbour's 16 MiB at most (and
    // a few MiB of btrfs metadata), and the host filesystem lost far less than the 2 GiB
    // the attacker asked for (other tests may write at the same time, hence the loose
    // bound on that figure).
    const grew = (await imageAllocated(d)) - allocBefore;
    expect(grew).toBeLessThan(64 * MiB + 16 * MiB + 8 * MiB);
    expect(freeBefore - hostFree(d)).toBeLessThan(1024 * MiB);

    // The neighbour writes and reads back while the victim is full.
    const full = await sh(d, neighbour.id, 'dd if=/dev/zero of=/root/n2 bs=1M count=16 2>/dev/null && sync && cat /root/n1 /root/n2 | wc -c');
    expect(full.out.trim()).toBe(String(32 * MiB));

    // Usage as the stats API and `dsec top` report it.
    const st = await d.client.sandboxStats(victim.id);
    expect(st.disk_limit_bytes).toBe(64 * MiB);
    expect(st.disk_used_bytes).toBeGreaterThan(56 * MiB);
    expect((await d.client.getSandbox(victim.id)).disk_used_bytes).toBeGreaterThan(56 * MiB);
    const top = await runCli(d, ['--json', 'top', '--once', '--interval', '100ms']);
    const row = (JSON.parse(top.stdout) as { sandboxes: { id: string; disk_used_bytes: number; disk_limit_bytes: number }[] }).sandboxes.find((s) => s.id === victim.id)!;
    expect(row.disk_limit_bytes).toBe(64 * MiB);

    // The quota event: the reaper's quota check sees the full layer (it runs every second).
    let evs: { type: string; message?: string }[] = [];
    while (!(evs = await eventsOf(d, victim.id)).some((e) => e.type === 'sandbox.disk_quota')) await new Promise((r) => setTimeout(r, 200));
    expect(evs.filter((e) => e.type === 'sandbox.disk_quota')).toHaveLength(1);
    expect(evs.find((e) => e.type === 'sandbox.disk_quota')!.message).toMatch(/of 67108864 bytes/);

    // Freeing the layer lets the victim write again; the neighbour still works after.
    expect((await sh(d, victim.id, 'rm /root/fill /root/more; sync; echo done')).out).toBe('done\n');
    expect((await fill(d, victim.id, '/root/again', 16)).size).toBe(16 * MiB);
    expect((await sh(d, neighbour.id, 'echo after > /root/n3 && cat /root/n3')).out).toBe('after\n');
    await d.client.deleteSandbox(victim.id, { force: true });
    await d.client.deleteSandbox(neighbour.id, { force: true });
  });

  it('a sandbox that filled its quota comes back read-write after stop/start and after a dsecd restart, and the quota still holds', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', disk_bytes: 64 * MiB });
    /** Fills the layer until the kernel refuses, and checks it was the quota that refused. */
    const fillToQuota = async () => {
      const f = await fill(d, sb.id, '/root/fill', 2048);
      expect(f.out).toMatch(/Disk quota exceeded/);
      expect(f.size).toBeLessThanOrEqual(64 * MiB);
      expect(f.size).toBeGreaterThan(56 * MiB);
    };
    /**
     * After a start on a full layer: the sandbox's own mountinfo shows the overlay's
     * superblock read-write (overlayfs falls back to a read-only superblock when it
     * cannot make its work dir), a new file is refused for the quota, not for a
     * read-only filesystem; deleting frees room, and the quota stops the next fill.
     */
    const checkWritableAndLimited = async () => {
      const line = (await sh(d, sb.id, "awk '$5 == \"/root\"' /proc/self/mountinfo")).out;
      expect(line).toMatch(/ - overlay overlay rw,/);
      expect((await sh(d, sb.id, 'touch /root/probe 2>&1; echo "rc=$?"')).out).toMatch(/Disk quota exceeded\nrc=1/);
      expect((await sh(d, sb.id, 'rm /root/fill && echo removed')).out).toBe('removed\n');
      expect((await fill(d, sb.id, '/root/small', 16)).size).toBe(16 * MiB);
      expect((await sh(d, sb.id, 'rm /root/small && echo removed')).out).toBe('removed\n');
      await fillToQuota();
      expect((await d.client.sandboxStats(sb.id)).disk_limit_bytes).toBe(64 * MiB);
    };

    await fillToQuota();
    // statfs inside (what df shows) is the whole store's, not the 64 MiB quota: btrfs
    // reports no qgroup limit through statfs (docs/OPERATIONS.md, "What a sandbox sees").
    const inside = (await sh(d, sb.id, "stat -f -c '%b %S' /root")).out.trim().split(' ').map(Number);
    const store = statfsSync(d.storeMount);
    expect(inside[0] * inside[1]).toBe(store.blocks * store.bsize);
    expect(inside[0] * inside[1]).toBeGreaterThan(64 * MiB);
    await d.client.stopSandbox(sb.id, { timeoutMs: 0 });
    expect((await d.client.startSandbox(sb.id)).state).toBe('running');
    await checkWritableAndLimited();

    // Full again (checkWritableAndLimited ends with a fill): stopped, dsecd restarted, started.
    await d.client.stopSandbox(sb.id, { timeoutMs: 0 });
    await d.restart();
    expect((await d.client.startSandbox(sb.id)).state).toBe('running');
    await checkWritableAndLimited();
    await d.client.deleteSandbox(sb.id, { force: true });
  });

  it('a start whose overlay still comes up read-only fails with a clear error, and leaves the quota in force', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', disk_bytes: 64 * MiB });
    await d.client.stopSandbox(sb.id, { timeoutMs: 0 });
    // An immutable work/work: overlayfs can neither clean nor re-create it, whatever the
    // quota, so it mounts read-only (its fallback, not an error of mount(2)).
    const workwork = path.join(d.storeMount, 'sb', sb.id, 'work', 'work');
    await execa('chattr', ['+i', workwork]);
    try {
      const e = await rejection(d.client.startSandbox(sb.id));
      expect(e.code).toBe('FailedPrecondition');
      expect(e.message).toMatch(/overlayfs mounted .*\/rootfs read-only: it could not create its work dir/);
      const got = await d.client.getSandbox(sb.id);
      expect(got.state).toBe('failed');
      expect(got.error).toMatch(/read-only/);
      expect((await d.traces()).mounts.filter((m) => m.includes(sb.id))).toEqual([]);
      expect((await d.client.sandboxStats(sb.id)).disk_limit_bytes).toBe(64 * MiB);
    } finally {
      await execa('chattr', ['-i', workwork]);
    }
    expect((await d.client.startSandbox(sb.id)).state).toBe('running');
    expect((await sh(d, sb.id, 'echo ok > /root/ok && cat /root/ok')).out).toBe('ok\n');
    await d.client.deleteSandbox(sb.id, { force: true });
  });

  it('the same write with a 256 MiB quota goes past 64 MiB: the quota is what stopped it', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', disk_bytes: 256 * MiB });
    const f = await fill(d, sb.id, '/root/fill', 128);
    expect(f.rc, f.out).toBe(0);
    expect(f.size).toBe(128 * MiB);
    await d.client.deleteSandbox(sb.id, { force: true });
  });

  it('a quota larger than the store, or below 16 MiB, is refused with a clear error; dsec create --disk sets it', async () => {
    const cap = statfsSync(path.join(d.root, 'storage', 'mnt')).blocks * statfsSync(path.join(d.root, 'storage', 'mnt')).bsize;
    const big = await rejection(d.client.createSandbox({ image: 'busybox', disk_bytes: cap + MiB }));
    expect(big.code).toBe('InvalidArgument');
    expect(big.message).toMatch(/more than the writable-layer store can hold/);
    expect((await rejection(d.client.createSandbox({ image: 'busybox', disk_bytes: MiB }))).code).toBe('InvalidArgument');
    const r = await runCli(d, ['--json', 'create', '--disk', '32M']);
    expect(r.code, r.stderr).toBe(0);
    const sb = JSON.parse(r.stdout) as { id: string; disk_bytes: number };
    expect(sb.disk_bytes).toBe(32 * MiB);
    expect((await fill(d, sb.id, '/root/fill', 64)).size).toBeLessThanOrEqual(32 * MiB);
    await d.client.deleteSandbox(sb.id, { force: true });
  });
});

describe.skipIf(!IS_ROOT)('attack: XFS_IOC_SWAPEXT on a real XFS upper (upper_fs = "xfs")', () => {
  let d: TestDaemon;
  let tmp: string;
  let probe: string;
  beforeAll(async () => {
    tmp = mkdtempSync(path.join(os.tmpdir(), 'dsec-disk-'));
    probe = path.join(tmp, 'probe');
    await execa('gcc', ['-static', '-O1', '-o', probe, path.join(REPO, 'test/attacks/seccomp-probe.c')]);
    d = await TestDaemon.start({ slot: 30, config: '[storage]\nupper_fs = "xfs"\n' });
  }, 120_000);
  afterAll(async () => {
    await d?.cleanup();
    if (d) expect(await loopDevicesReleased(d.root)).toEqual([]);
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  /** Runs the probe inside a sandbox (copied in on stdin) on two files of its writable layer. */
  async function swapInside(id: string): Promise<string> {
    const r = await d.client.exec(id, {
      argv: ['sh', '-c', 'cat > /root/probe && chmod +x /root/probe && head -c 65536 /dev/urandom > /root/f1 && head -c 65536 /dev/urandom > /root/f2 && sync && for n in XFS_IOC_SWAPEXT XFS_IOC_SWAPEXT_HIBITS; do /root/probe $n /root/f1 /root/f2; done'],
      stdin: readFileSync(probe),
    });
    expect(r.stderr.toString()).toBe('');
    return r.stdout.toString();
  }

  it('the store is a loop-mounted XFS, and host info says per-sandbox quotas are not enforced here', async () => {
    const h = await d.client.hostInfo();
    expect(h.defences.disk_quota.enforced).toBe(false);
    expect(h.defences.disk_quota.detail).toMatch(/xfs image .* without per-sandbox quotas: the kernel refused mount -o prjquota/);
    expect(statfsSync(d.storeMount).type).toBe(XFS_SUPER_MAGIC);
    const sb = await d.client.createSandbox({ image: 'busybox' });
    expect(sb.disk_bytes).toBeNull();
    expect((await d.client.getSandbox(sb.id)).defences?.disk_quota).toMatchObject({ enforced: false });
    // An explicit quota cannot be honoured here, and says so.
    const e = await rejection(d.client.createSandbox({ image: 'busybox', disk_bytes: 64 * MiB }));
    expect(e.code).toBe('FailedPrecondition');
    expect(e.message).toMatch(/disk_bytes cannot be enforced on this host/);
    await d.client.deleteSandbox(sb.id, { force: true });
  });

  it('the upper dir is on the XFS: statfs magic on the host, the same blocks behind the overlay inside', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    await sh(d, sb.id, 'echo x > /root/on-upper');
    const upper = d.upperDir(sb.id);
    expect(upper).toBe(path.join(d.storeMount, 'sb', sb.id, 'upper'));
    expect(statfsSync(path.join(upper, 'root', 'on-upper')).type).toBe(XFS_SUPER_MAGIC);
    const inside = (await sh(d, sb.id, "stat -f -c '%t %b %S' /")).out.trim().split(' ');
    expect(parseInt(inside[0], 16)).toBe(OVERLAYFS_SUPER_MAGIC);
    const host = statfsSync(d.storeMount);
    expect(Number(inside[1]) * Number(inside[2])).toBe(host.blocks * host.bsize);
    await d.client.deleteSandbox(sb.id, { force: true });
  });

  it('SWAPEXT on two files of the upper: EPERM under the default profile, ENOTTY from overlayfs with ioctl allowed, XFS\'s own answer on the host', async () => {
    const neighbour = await d.client.createSandbox({ image: 'busybox' });
    const denied = await d.client.createSandbox({ image: 'busybox' });
    expect(await swapInside(denied.id)).toBe('XFS_IOC_SWAPEXT EPERM\nXFS_IOC_SWAPEXT_HIBITS EPERM\n');

    // The seccomp denial switched off for this sandbox: the call gets past seccomp and
    // meets the overlay, which has no XFS ioctls.
    const allowed = await d.client.createSandbox({ image: 'busybox', seccomp: { allow: ['ioctl'] } });
    expect(await swapInside(allowed.id)).toBe('XFS_IOC_SWAPEXT ENOTTY\nXFS_IOC_SWAPEXT_HIBITS ENOTTY\n');

    // The same two files, opened on the XFS itself (host side, no filter): XFS takes the
    // ioctl and refuses the swap on its own terms (the target's recorded stat does not match).
    const upper = d.upperDir(allowed.id);
    for (const n of ['XFS_IOC_SWAPEXT', 'XFS_IOC_SWAPEXT_HIBITS']) {
      const r = await execa(probe, [n, path.join(upper, 'root/f1'), path.join(upper, 'root/f2')]);
      const answer = r.stdout.split(' ')[1];
      expect(answer, r.stdout).not.toBe('EPERM');
      expect(answer, r.stdout).not.toBe('ENOTTY');
    }

    // The XFS is still mounted read-write, and the neighbour writes and reads.
    const line = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').find((l) => l.split(' ')[4] === d.storeMount)!;
    expect(line).toMatch(/ - xfs \/dev\/loop\d+ rw,/);
    const w = await sh(d, neighbour.id, 'dd if=/dev/zero of=/root/n bs=1M count=8 2>/dev/null && sync && cat /root/n | wc -c');
    expect(w.out.trim()).toBe(String(8 * MiB));
    for (const sb of [neighbour, denied, allowed]) await d.client.deleteSandbox(sb.id, { force: true });
  });
});

/** Host info's writable-layer pool (GET /v1/host storage.pool). */
async function pool(d: TestDaemon): Promise<{ used_bytes: number; available_bytes: number; quota_sum_bytes: number; quota_cap_bytes: number; disk_overcommit: number; reserve_bytes: number; guarded: number; capped: number }> {
  return (await d.client.hostInfo()).storage!.pool!;
}

/**
 * (c) The store as a shared pool, on a 1 GiB btrfs store with quotas allowed to add up to
 * 1.5 times it (slot 30 again, a third daemon): admission refuses quotas beyond that;
 * host info shows use against the sum of quotas; a sandbox that stayed idle and then
 * fills the store at once (buffered writes at memory speed, or fallocate) while its
 * neighbour still has data to write is stopped by the limit the pool guard set before it
 * wrote, before the reserve (EDQUOT, below its own quota, with a `sandbox.disk_pool_full`
 * event naming it), the neighbour writes into the reserve, and the writer's quota comes
 * back once there is room. And I/O limits on cgroup v1: applied to the store's loop device, enforced for
 * direct I/O (a throttled dd writes no more than the rate allows), not charged for
 * buffered writes, and host info says exactly that.
 */
describe.skipIf(!IS_ROOT)('attack: overcommit the writable-layer pool (1 GiB store, disk_overcommit 1.5)', () => {
  let d: TestDaemon;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 30, config: '[storage]\nsize_bytes = 1073741824\n[admission]\ndisk_overcommit = 1.5\n' });
  });
  afterEach(async () => {
    // Each test starts on an empty pool, whatever the last one left.
    for (const sb of await d.client.listSandboxes()) await d.client.deleteSandbox(sb.id, { force: true });
    // btrfs frees a deleted subvolume's extents in the background: wait until the store
    // holds about nothing again (a fresh one uses a few MiB of metadata), so the next test
    // starts with the room it expects.
    while ((await pool(d)).used_bytes > 64 * MiB) {
      await execa('sync');
      await new Promise((r) => setTimeout(r, 200));
    }
  });
  afterAll(async () => {
    await d?.cleanup();
    if (d) expect(await loopDevicesReleased(d.root)).toEqual([]);
  });

  it('admission refuses quotas beyond store x disk_overcommit, naming the pool, the sum and the ratio; host info shows the sum', async () => {
    const size = (await d.client.hostInfo()).storage!.size_bytes!;
    const a = await d.client.createSandbox({ image: 'busybox' });
    expect(a.disk_bytes).toBe(size); // [defaults] disk_bytes (10 GiB) is more than the store: the store's size
    // 17 MiB below the cap: 18 MiB more is refused, 16 MiB admitted.
    const b = await d.client.createSandbox({ image: 'busybox', disk_bytes: Math.floor(size / 2) - 17 * MiB });
    let p = await pool(d);
    expect(p.quota_sum_bytes).toBe(a.disk_bytes! + b.disk_bytes!);
    expect(p.quota_cap_bytes).toBe(Math.floor(size * 1.5));
    expect(p.disk_overcommit).toBe(1.5);
    const e = await rejection(d.client.createSandbox({ image: 'busybox', disk_bytes: 18 * MiB }));
    expect(e.code).toBe('ResourceExhausted');
    expect(e.message).toContain(`quotas would total ${a.disk_bytes! + b.disk_bytes! + 18 * MiB} bytes`);
    expect(e.message).toContain(path.join(d.root, 'storage', 'upper.img'));
    expect(e.message).toContain('admission.disk_overcommit 1.5');
    const c = await d.client.createSandbox({ image: 'busybox', disk_bytes: 16 * MiB });
    p = await pool(d);
    expect(p.quota_sum_bytes).toBe(a.disk_bytes! + b.disk_bytes! + 16 * MiB);
    const txt = await runCli(d, ['host', 'info']);
    expect(txt.stdout).toMatch(/disk pool\s+.* free; quotas sum to .*admission allows .*\(disk_overcommit 1\.5\); reserve 256 ?MiB/);
    for (const sb of [a, b, c]) await d.client.deleteSandbox(sb.id, { force: true });
    expect((await pool(d)).quota_sum_bytes).toBe(0);
  });

  /**
   * Two sandboxes with 600 MiB quotas; the neighbour holds 300 MiB, so the store (about
   * 600 MiB free, 256 MiB of it the reserve) has less room above the reserve than the two
   * headrooms (900 MiB) together. The neighbour is made and writes its 300 MiB alone,
   * while its headroom fits the room (no guard limit, so nothing it writes counts as
   * filling a share, whatever the store's free space after the previous test); the writer
   * is made next, and its create runs the guard, which limits both before the writer runs
   * anything. Waits until both kernel limits are set (host info's `capped`).
   */
  async function tightPool(): Promise<{ writer: { id: string }; neighbour: { id: string }; reserve: number }> {
    const neighbour = await d.client.createSandbox({ image: 'busybox', disk_bytes: 600 * MiB });
    expect((await fill(d, neighbour.id, '/root/pre', 300)).size).toBe(300 * MiB);
    const writer = await d.client.createSandbox({ image: 'busybox', disk_bytes: 600 * MiB });
    const reserve = (await pool(d)).reserve_bytes;
    expect(reserve).toBe(256 * MiB);
    for (let p = await pool(d); p.capped < 2; p = await pool(d)) await new Promise((r) => setTimeout(r, 200));
    return { writer, neighbour, reserve };
  }

  it('an idle sandbox that writes as fast as it can (dd bs=8M) is stopped at its share of the room, before the reserve (EDQUOT, event names it); the neighbour writes into the reserve; the quota comes back', async () => {
    const quota = 600 * MiB;
    const { writer, neighbour, reserve } = await tightPool();
    // The attack: nothing written before, then buffered writes at memory speed, far more
    // than a guard check apart could catch.
    const f = await sh(d, writer.id, 'dd if=/dev/zero of=/root/fill bs=8M count=128 2>&1; echo "rc=$?"; sync');
    expect(f.out).toMatch(/Disk quota exceeded/);
    const used = (await d.client.sandboxStats(writer.id)).disk_used_bytes!;
    expect(used).toBeLessThan(quota - 64 * MiB); // stopped well below its own quota
    // The reserve is still free (less what btrfs needed for metadata).
    expect((await pool(d)).available_bytes).toBeGreaterThan(reserve - 64 * MiB);

    let evs: { type: string; message?: string }[] = [];
    while (!(evs = await eventsOf(d, writer.id)).some((e) => e.type === 'sandbox.disk_pool_full')) await new Promise((r) => setTimeout(r, 200));
    const ev = evs.find((e) => e.type === 'sandbox.disk_pool_full')!;
    expect(ev.message).toMatch(/writable-layer store .* is nearly full: .* this sandbox wrote all of its share: its writes now fail with EDQUOT at \d+ bytes, below its disk_bytes 629145600/);
    expect(evs.filter((e) => e.type === 'sandbox.disk_quota')).toEqual([]);
    expect((await eventsOf(d, neighbour.id)).filter((e) => e.type.startsWith('sandbox.disk_'))).toEqual([]);
    expect((await pool(d)).guarded).toBe(1);

    // The neighbour, which did not fill the store, writes its whole headroom (290 MiB:
    // more than its share of the room above the reserve, so into the reserve), and a
    // small file, and reads back.
    const n = await sh(d, neighbour.id, 'echo hi > /root/small && dd if=/dev/zero of=/root/more bs=1M count=290 2>&1 | tail -1; sync; cat /root/pre /root/more | wc -c; cat /root/small');
    expect(n.out.trim().split('\n').slice(-2)).toEqual([String(590 * MiB), 'hi']);
    // The writer is still held.
    expect((await fill(d, writer.id, '/root/again', 64)).out).toMatch(/Disk quota exceeded/);

    // Room again (the neighbour gone: the writer's headroom fits above the reserve): its
    // quota is back, and it writes.
    await d.client.deleteSandbox(neighbour.id, { force: true });
    await sh(d, writer.id, 'rm -f /root/again; sync');
    for (let p = await pool(d); p.guarded > 0 || p.capped > 0; p = await pool(d)) await new Promise((r) => setTimeout(r, 200));
    expect((await d.client.sandboxStats(writer.id)).disk_limit_bytes).toBe(quota);
    expect((await fill(d, writer.id, '/root/after', 64)).size).toBe(64 * MiB);
  });

  it('an idle sandbox that fallocates its whole headroom at once gets EDQUOT before the reserve; the neighbour keeps writing', async () => {
    const quota = 600 * MiB;
    const { writer, neighbour, reserve } = await tightPool();
    const before = (await d.client.sandboxStats(writer.id)).disk_used_bytes!;
    // fallocate reserves the blocks at once, without writing a byte.
    const f = await sh(d, writer.id, 'fallocate -l 590M /root/big 2>&1; echo "rc=$?"; sync');
    expect(f.out).toMatch(/Disk quota exceeded/);
    expect(f.out).not.toMatch(/rc=0/);
    expect((await pool(d)).available_bytes).toBeGreaterThan(reserve - 64 * MiB);
    expect((await d.client.sandboxStats(writer.id)).disk_used_bytes!).toBeLessThan(before + 8 * MiB);
    expect((await d.client.sandboxStats(writer.id)).disk_limit_bytes!).toBeLessThan(quota);
    // The neighbour writes a small file and 128 MiB, and reads them back.
    const n = await sh(d, neighbour.id, 'echo hi > /root/small && dd if=/dev/zero of=/root/more bs=1M count=128 2>&1 | tail -1; sync; cat /root/more | wc -c; cat /root/small');
    expect(n.out.trim().split('\n').slice(-2)).toEqual([String(128 * MiB), 'hi']);
  });

  it('io_max on cgroup v1: written to blkio.throttle for the store\'s loop device; a direct-I/O writer is held to the rate; buffered writes are not charged; host info says so', async () => {
    const info = await d.client.hostInfo();
    const [major, minor] = info.storage!.device!.split(':').map(Number);
    expect(readFileSync(`/sys/dev/block/${major}:${minor}/loop/backing_file`, 'utf8').trim()).toBe(path.join(d.root, 'storage', 'upper.img'));
    expect(info.defences.io_max.enforced).toBe(false);
    expect(info.defences.io_max.detail).toMatch(/PARTLY enforced: reads and direct I\/O only.*buffered writes .*not limited/);
    expect(info.defences.io_weight.enforced).toBe(false);
    expect(info.defences.io_weight.detail).toMatch(/io_weight is not enforced|has no effect/);

    const rate = 256 * 1024;
    const sb = await d.client.createSandbox({ image: 'busybox', io_weight: 200, io_max: { write_bps: rate, read_iops: 1000 } });
    expect(sb).toMatchObject({ io_weight: 200, io_max: { write_bps: rate, read_iops: 1000 } });
    expect((await d.client.getSandbox(sb.id)).io_max).toEqual({ write_bps: rate, read_iops: 1000 });
    const cg = await d.cgroups();
    const blkio = cg.sandboxPaths(sb.id).blkio;
    expect(readFileSync(path.join(blkio, 'blkio.throttle.write_bps_device'), 'utf8')).toBe(`${major}:${minor} ${rate}\n`);
    expect(readFileSync(path.join(blkio, 'blkio.throttle.read_iops_device'), 'utf8')).toBe(`${major}:${minor} 1000\n`);
    const dev = { major, minor };

    // Direct I/O for 2 s (timed inside): no more than the rate allows over the time it ran,
    // plus one 64 KiB write in flight. Unthrottled, the same dd writes tens of MiB.
    const r = await sh(d, sb.id, 't0=$(cut -d" " -f1 /proc/uptime); timeout 2 dd if=/dev/zero of=/root/direct bs=64k count=1000 oflag=direct 2>/dev/null; '
      + 't1=$(cut -d" " -f1 /proc/uptime); echo "$(awk "BEGIN { print int(($t1 - $t0) * 1000) }") $(stat -c %s /root/direct)"');
    const [ms, bytes] = r.out.trim().split(' ').map(Number);
    expect(ms, r.out + r.err).toBeGreaterThan(0);
    expect(bytes).toBeGreaterThan(0);
    expect(bytes).toBeLessThanOrEqual(rate * (ms / 1000 + 0.5) + 64 * 1024);
    const direct = await cg.ioCounters(sb.id, dev);
    expect(direct.writeBytes).toBeGreaterThanOrEqual(bytes);
    // Buffered writes reach the device from the flusher threads, charged to the root
    // cgroup: the sandbox's counter does not move (what host info says is not enforced).
    await sh(d, sb.id, 'dd if=/dev/zero of=/root/buffered bs=1M count=16 2>/dev/null; sync');
    expect((await cg.ioCounters(sb.id, dev)).writeBytes - direct.writeBytes).toBeLessThan(MiB);
    await d.client.deleteSandbox(sb.id, { force: true });

    // Without io_max, the same files say no limit (0 removes a v1 rule).
    const plain = await d.client.createSandbox({ image: 'busybox' });
    expect(plain).toMatchObject({ io_weight: 100, io_max: null });
    expect(readFileSync(path.join(cg.sandboxPaths(plain.id).blkio, 'blkio.throttle.write_bps_device'), 'utf8')).toBe('');
    await d.client.deleteSandbox(plain.id, { force: true });
  });

  it('bad I/O settings are refused with InvalidArgument', async () => {
    for (const body of [{ io_weight: 0 }, { io_weight: 10_001 }, { io_max: {} }, { io_max: { write_bps: 100 } }, { io_max: { wbps: 1 } }]) {
      const e = await rejection(d.client.createSandbox({ image: 'busybox', ...body } as never));
      expect(e.code, JSON.stringify(body)).toBe('InvalidArgument');
    }
    const e = await rejection(d.client.createSandbox({ image: 'busybox', backend: 'microvm', io_weight: 50 }));
    expect(e.code).toBe('InvalidArgument');
    expect(e.message).toMatch(/apply to container sandboxes only/);
  });
});
