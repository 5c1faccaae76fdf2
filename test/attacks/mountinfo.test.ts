/**
 * Attack: learn the host's layout from inside a container sandbox. /proc/self/mountinfo,
 * /proc/1/mountinfo and /proc/self/mounts print every mount's source, its root within its
 * filesystem and its options; an overlay's options name its layer directories, a bind
 * mount's root names the file it was bound from. None of it may name a host path of dsecd's
 * state root, of this checkout (the agent, profiles) or the host's block device
 * (docs/SECURITY.md "What a sandbox sees of the host's mounts").
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, readdirSync, readFileSync, realpathSync } from 'node:fs';
import path from 'node:path';
import { IS_ROOT, REPO, TestDaemon, out } from '../integration/harness.js';

/** One /proc/self/mountinfo line of the host, split into the fields this test needs. */
interface HostMount {
  mountPoint: string;
  source: string;
}

function hostMounts(): HostMount[] {
  return readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter(Boolean).map((l) => {
    const f = l.split(' ');
    const dash = f.indexOf('-');
    return { mountPoint: f[4].replace(/\\040/g, ' '), source: f[dash + 2] };
  });
}

/** The host mount holding `p` (longest mount point that is a prefix of it). */
function mountOf(p: string, mounts: HostMount[]): HostMount {
  return mounts.filter((m) => m.mountPoint === '/' || p === m.mountPoint || p.startsWith(m.mountPoint + '/'))
    .sort((a, b) => b.mountPoint.length - a.mountPoint.length)[0];
}

describe.skipIf(!IS_ROOT)('attack: read the host layout from the mount table', () => {
  let d: TestDaemon;
  /** Strings that name the host: paths of the root and the checkout, block devices. */
  let secrets: string[];
  /** Device names (e.g. vda, loop3) matched as whole words. */
  let devices: string[];

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 71 });
    const mounts = hostMounts();
    const paths = new Set([d.root, realpathSync(d.root), REPO, realpathSync(REPO)]);
    // Every block device behind the root, the checkout, and what dsecd mounted under its
    // root (layer blobs, the writable-layer store's loop device).
    const devs = new Set<string>();
    for (const m of [mountOf(d.root, mounts), mountOf(REPO, mounts), ...mounts.filter((m) => m.mountPoint.startsWith(d.root + '/'))]) {
      if (m.source.startsWith('/dev/')) devs.add(m.source);
    }
    secrets = [...paths, ...devs];
    devices = [...devs].map((s) => path.basename(s));
    expect(devices.length).toBeGreaterThan(0);
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  /** Reads the three mount tables inside sandbox `id` and checks them. */
  async function expectNoHostNames(id: string): Promise<void> {
    const r = await d.client.exec(id, { argv: ['sh', '-c', 'cat /proc/self/mountinfo /proc/1/mountinfo /proc/self/mounts'] });
    const text = out(r);
    expect(text).toContain(' / ');
    for (const s of secrets) expect(text, `mount table names ${s}:\n${text}`).not.toContain(s);
    for (const dev of devices) expect(text, `mount table names device ${dev}:\n${text}`).not.toMatch(new RegExp(`\\b${dev}\\b`));
  }

  it('a plain sandbox: the overlay root, the agent, /dev, /proc and /sys name nothing of the host', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    await expectNoHostNames(sb.id);
    const info = (await d.client.hostInfo()) as unknown as { defences: Record<string, { enforced: boolean; detail: string }> };
    expect(info.defences.mount_table_paths_hidden).toMatchObject({ enforced: true });
  });

  it('the sysfs masks read empty and refuse writes, and are binds of a directory of the sandbox\'s own on dsecd\'s tmpfs: a sandbox makes 8 superblocks, not 10', async () => {
    const masks = ['/sys/firmware', '/sys/devices/virtual/block'].filter((p) => existsSync(p));
    expect(masks.length).toBeGreaterThan(0);
    const sb = await d.client.createSandbox({ image: 'busybox' });
    const r = await d.client.exec(sb.id, { argv: ['sh', '-c', masks.map((m) => `ls -A ${m}; touch ${m}/x; mkdir ${m}/y`).join('; ') + '; true'] });
    expect(out(r)).toBe('');
    expect(r.stderr.toString().match(/Read-only file system/g)).toHaveLength(2 * masks.length);
    // Superblocks the sandbox adds to the host: devices of its mount table that no other
    // mount of the host's namespace has (its overlay root is also mounted there). Each is
    // a row in every memory cgroup's shrinker table (docs/BENCHMARKS.md "Density"): the
    // overlay, proc, sysfs, /dev, devpts, /dev/shm, mqueue and the /proc/acpi mask.
    const lines = out(await d.client.exec(sb.id, { argv: ['cat', '/proc/self/mountinfo'] })).trim().split('\n').map((l) => l.split(' '));
    const rootfs = path.join(d.root, 'sandboxes', sb.id, 'rootfs');
    const hostDevs = new Set(readFileSync('/proc/self/mountinfo', 'utf8').trim().split('\n').map((l) => l.split(' ')).filter((f) => f[4] !== rootfs).map((f) => f[2]));
    const own = new Set(lines.map((f) => f[2]).filter((dev) => !hostDevs.has(dev)));
    expect(own.has(lines.find((f) => f[4] === '/')![2])).toBe(true);
    expect([...own].length, lines.map((f) => `${f[2]} ${f[4]}`).join('\n')).toBeLessThanOrEqual(existsSync('/proc/acpi') ? 8 : 7);
    // Binds of the sandbox's own directory on the instance's sandbox-files tmpfs (the
    // agent's filesystem): not one inode shared by every sandbox.
    const agentDev = lines.find((f) => f[4] === '/dev/.dsec-agent')![2];
    for (const m of masks) expect(lines.find((f) => f[4] === m)?.slice(2, 4)).toEqual([agentDev, `/mask/${sb.id}`]);
    const other = await d.client.createSandbox({ image: 'busybox' });
    const ino = async (id: string) => out(await d.client.exec(id, { argv: ['stat', '-c', '%i', masks[0]] })).trim();
    expect(await ino(other.id)).not.toBe(await ino(sb.id));
    await d.client.deleteSandbox(other.id, { force: true });
    expect(existsSync(path.join(d.root, 'sandbox-files', 'mask', other.id))).toBe(false);
  });

  it('with networking and writable paths: resolv.conf and the filesystem binds name nothing of the host', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', network: { mode: 'open' }, filesystem: { writable_paths: ['/work'] } });
    await expectNoHostNames(sb.id);
  });

  it('sysfs: no loop device behind the store names its image (loop/backing_file), nor any other host path of dsecd', async () => {
    // Precondition: the store is a loop device here, whose backing file the host names.
    const hostBacking = readdirSync('/sys/block').filter((b) => b.startsWith('loop')).map((b) => {
      try {
        return readFileSync(`/sys/block/${b}/loop/backing_file`, 'utf8');
      } catch {
        return '';
      }
    });
    expect(hostBacking.some((f) => f.startsWith(d.root + '/'))).toBe(true);
    const sb = await d.client.createSandbox({ image: 'busybox' });
    const r = await d.client.exec(sb.id, { argv: ['sh', '-c', 'ls /sys/block; cat /sys/block/*/loop/backing_file /sys/class/block/*/loop/backing_file /sys/devices/virtual/block/*/loop/backing_file /sys/dev/block/*/loop/backing_file 2>/dev/null; true'] });
    const text = out(r);
    expect(text).toMatch(/\bloop\d+\b/); // the names are still listed
    for (const s of [d.root, realpathSync(d.root), REPO]) expect(text, `sysfs names ${s}:\n${text}`).not.toContain(s);
    expect(text).not.toMatch(/\/storage\/upper\.img/);
  });

  it('after a stop and start (the overlay is mounted again)', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    await d.client.exec(sb.id, { argv: ['sh', '-c', 'echo x > /root/f'] });
    await d.client.stopSandbox(sb.id);
    await d.client.startSandbox(sb.id);
    await expectNoHostNames(sb.id);
  });
});
