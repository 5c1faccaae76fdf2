/**
 * VMM confinement (docs/SECURITY.md "VMM confinement") on a real microVM's QEMU, checked
 * from the host side against what the kernel reports, plus a probe program started by
 * dsec-vmm-launch in QEMU's place with the same kind of confinement, which tries to reach
 * host files outside its set:
 *   - its own cgroup (the sandbox's) — as before;
 *   - its own mount namespace: /proc/<pid>/ns/mnt differs from ours, its mountinfo holds
 *     only QEMU's runtime, the boot files and its own sandbox dir, and /proc/<pid>/root
 *     shows no /etc, /home, /proc or other sandboxes;
 *   - unprivileged: every uid is the sandbox's uid base, no effective capabilities;
 *   - seccomp: `Seccomp: 2` with two filters (QEMU's -sandbox and dsec's), NoNewPrivs.
 * The cost of the confinement at VM start is measured (printed, not asserted).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chmodSync, chownSync, existsSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { execa } from 'execa';
import { GUEST_DIR, GUEST_KERNEL, IS_ROOT, REPO, TestDaemon } from './harness.js';
import { confinementArgs, qemuRuntimePaths } from '../../daemon/drivers/vmm/qemu.js';

const HAS_QEMU = existsSync('/usr/bin/qemu-system-x86_64');
const KERNEL = GUEST_KERNEL;
const LAUNCHER = path.join(REPO, 'native/vmm/dsec-vmm-launch');

function status(pid: number): Record<string, string> {
  return Object.fromEntries(readFileSync(`/proc/${pid}/status`, 'utf8').split('\n').filter(Boolean).map((l) => {
    const i = l.indexOf(':');
    return [l.slice(0, i), l.slice(i + 1).trim()];
  }));
}

describe.skipIf(!IS_ROOT || !HAS_QEMU || !existsSync(KERNEL))('VMM confinement', () => {
  let d: TestDaemon;
  let vm: { id: string; init_pid: number | null; uid_base: number | null };
  let other: string;
  let tmp: string;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 97, config: '[vm]\naccel = "tcg"\n' });
    tmp = mkdtempSync('/tmp/dsec-vmm-probe-');
    // A second sandbox whose files the VMM must not see.
    other = (await d.client.createSandbox({ image: 'busybox' })).id;
    vm = await d.client.createSandbox({ image: 'busybox', backend: 'microvm', memory_bytes: 256 * 2 ** 20 });
  });
  afterAll(async () => {
    await d?.cleanup();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  it('QEMU runs as the sandbox\'s own host uid with no capabilities, under two seccomp filters', async () => {
    const st = status(vm.init_pid!);
    expect(vm.uid_base).toBeGreaterThan(0);
    expect(st.Uid.split(/\s+/).map(Number)).toEqual([vm.uid_base, vm.uid_base, vm.uid_base, vm.uid_base]);
    expect(st.Gid.split(/\s+/).map(Number)).toEqual([vm.uid_base, vm.uid_base, vm.uid_base, vm.uid_base]);
    expect(st.CapEff).toBe('0000000000000000');
    expect(st.NoNewPrivs).toBe('1');
    expect(st.Seccomp).toBe('2');
    expect(Number(st.Seccomp_filters)).toBe(2);
    // Still in the sandbox's cgroup, and still serving the guest.
    expect(await (await d.cgroups()).pids(vm.id)).toContain(vm.init_pid);
    expect((await d.client.exec(vm.id, { argv: ['echo', 'ok'] })).stdout.toString()).toBe('ok\n');
    // GET of the sandbox reports the same, read from /proc.
    const got = await d.client.getSandbox(vm.id);
    expect(got.defences).toMatchObject({ vmm_mount_namespace: { enforced: true }, vmm_unprivileged: { enforced: true }, vmm_seccomp: { enforced: true } });
  });

  it('QEMU has a mount namespace of its own that holds only its set: no /etc, /proc, /home, no other sandbox', async () => {
    const pid = vm.init_pid!;
    expect(readlinkSync(`/proc/${pid}/ns/mnt`)).not.toBe(readlinkSync('/proc/self/ns/mnt'));
    const runtime = await qemuRuntimePaths('/usr/bin/qemu-system-x86_64');
    const mine = path.join(d.root, 'sandboxes', vm.id);
    const points = readFileSync(`/proc/${pid}/mountinfo`, 'utf8').trim().split('\n').map((l) => l.split(' ')[4]);
    const allowed = (p: string) => p === '/' || runtime.includes(p) || p === mine || p.startsWith(path.join(d.root, 'vm') + '/')
      || p.startsWith(path.join(d.root, 'images') + '/') || p.startsWith(GUEST_DIR + '/') || ['/dev/null', '/dev/zero', '/dev/urandom'].includes(p);
    expect(points.filter((p) => !allowed(p))).toEqual([]);
    expect(points.length).toBeLessThan(runtime.length + 12);
    const top = readdirSync(`/proc/${pid}/root`).sort();
    for (const hidden of ['etc', 'home', 'proc', 'sys', 'root', 'boot', 'run']) expect(top).not.toContain(hidden);
    expect(existsSync(`/proc/${pid}/root/etc/passwd`)).toBe(false);
    expect(existsSync(`/proc/${pid}/root${path.join(d.root, 'sandboxes', other)}`)).toBe(false);
    expect(existsSync(`/proc/${pid}/root${path.join(d.root, 'dsec.db')}`)).toBe(false);
    // Its own set is there: QEMU, its sandbox dir (sockets), and read-only.
    expect(existsSync(`/proc/${pid}/root/usr/bin/qemu-system-x86_64`)).toBe(true);
    expect(existsSync(`/proc/${pid}/root${mine}/qmp.sock`)).toBe(true);
  });

  it('a VMM in its place that tries to open host files outside its set fails; it cannot write its read-only set or make namespaces', async () => {
    const uid = vm.uid_base!;
    // As dsecd prepares a sandbox dir for its VMM: root-owned, the VMM's group, 01770.
    chownSync(tmp, 0, uid);
    chmodSync(tmp, 0o1770);
    writeFileSync(path.join(tmp, 'mine'), 'own file\n', { mode: 0o644 });
    const args = confinementArgs({
      newRoot: path.join(d.root, 'vm', 'vmm-root'), ro: [...(await qemuRuntimePaths('/usr/bin/qemu-system-x86_64')), KERNEL, '/bin/busybox'],
      rw: [tmp], dev: ['/dev/null', '/dev/zero', '/dev/urandom'], uid, gid: uid, groups: [], seccomp: true,
    });
    const bb = (script: string) => execa(LAUNCHER, [...args, '--', '/bin/busybox', 'sh', '-c', script], { reject: false });
    const hostFiles = ['/etc/shadow', '/etc/hostname', path.join(d.root, 'dsec.db'), path.join(d.root, 'sandboxes', other, 'agent.sock'), '/proc/1/environ'];
    for (const f of hostFiles) {
      const r = await bb(`/bin/busybox cat ${f}`);
      expect(r.exitCode, f).not.toBe(0);
      expect(String(r.stderr), f).toMatch(/No such file or directory/);
    }
    const ok = await bb(`/bin/busybox cat ${tmp}/mine && /bin/busybox head -c 4 ${KERNEL} | /bin/busybox wc -c && /bin/busybox id -u`);
    expect(ok.exitCode).toBe(0);
    expect(String(ok.stdout).trim()).toBe(`own file\n4\n${uid}`);
    const ro = await bb('/bin/busybox touch /usr/bin/x');
    expect(String(ro.stderr)).toMatch(/Read-only file system/);
    const ns = await bb('/bin/busybox unshare -m /bin/busybox true');
    expect(String(ns.stderr)).toMatch(/Operation not permitted/);
  });

  it('cost of the confinement at VM start (printed): launcher + QEMU start with and without it', async () => {
    const runtime = await qemuRuntimePaths('/usr/bin/qemu-system-x86_64');
    const full = confinementArgs({ newRoot: path.join(d.root, 'vm', 'vmm-root'), ro: [...runtime, KERNEL], rw: [tmp], dev: ['/dev/null', '/dev/zero', '/dev/urandom'], uid: vm.uid_base!, gid: vm.uid_base!, groups: [], seccomp: true });
    // Alternated, so a busy host (other QEMUs) weighs on both the same.
    const once = async (a: string[]) => {
      const t = performance.now();
      const r = await execa(LAUNCHER, [...a, '--', '/usr/bin/qemu-system-x86_64', '-version'], { reject: false });
      expect(r.exitCode).toBe(0);
      return performance.now() - t;
    };
    const b: number[] = [];
    const c: number[] = [];
    for (let i = 0; i < 15; i++) {
      b.push(await once([]));
      c.push(await once(full));
    }
    const bare = b.sort((x, y) => x - y)[7];
    const conf = c.sort((x, y) => x - y)[7];
    console.log(`VMM confinement: launcher + qemu -version p50 ${bare.toFixed(1)} ms bare, ${conf.toFixed(1)} ms confined (mount namespace with ${runtime.length + 5} binds, uid drop, seccomp): +${(conf - bare).toFixed(1)} ms per VM start`);
  });
});
