/**
 * The vm tier's pure parts: the q35 command line and guest kernel command line, the VMM
 * confinement's launcher arguments, the /init branch that boots from a root disk, the
 * `[vm.disks]` config, and the console hub (against a fake QEMU chardev socket): the
 * bounded log, broadcast, input, the `ready` pattern and the end of the console.
 */
import { afterAll, describe, expect, it } from 'vitest';
import net from 'node:net';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { vmCmdline, vmQemuArgs, type VmSpec } from '../../daemon/drivers/vm/qemu.js';
import { initScript } from '../../daemon/drivers/vmm/initramfs.js';
import { ConsoleHub } from '../../daemon/drivers/vm/console.js';
import { loadConfig } from '../../daemon/config.js';
import { confinementArgs } from '../../daemon/drivers/vmm/qemu.js';

const tmp = mkdtempSync(path.join(os.tmpdir(), 'dsec-vm-unit-'));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const spec: VmSpec = {
  id: 'abc', dir: '/r/sandboxes/abc', accel: 'tcg', vcpus: 2, memoryMiB: 256, tcgTbMiB: 64, tscKhz: 2600000,
  kernel: '/k', initrd: '/i.cpio', agent: true, rootPartition: 0, rootFstype: 'ext4', initPath: '/sbin/init', cmdline: '',
};

describe('vm QEMU command line', () => {
  it('q35 with virtio-pci disk and serial ports, the console on a socket, vCPUs stopped until dsecd connected', () => {
    const a = vmQemuArgs(spec);
    const after = (f: string) => a[a.indexOf(f) + 1];
    expect(after('-M')).toBe('q35');
    expect(a).toContain('-S');
    expect(after('-sandbox')).toBe('on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny');
    expect(a).toContain('socket,id=con,path=/r/sandboxes/abc/console.sock,server=on,wait=off');
    expect(a).toContain('virtio-blk-pci,drive=root,serial=root');
    expect(a).toContain('id=root,file=/r/sandboxes/abc/disk.qcow2,format=qcow2,if=none,discard=unmap,detect-zeroes=unmap');
    expect(a).toContain('virtio-serial-pci,max_ports=4');
    expect(a.some((x) => x.includes('virtio-mmio') || x.includes('-device,'))).toBe(false);
    expect(after('-accel')).toBe('tcg,tb-size=64');
    expect(after('-smp')).toBe('2');
  });
  it('without the agent: no virtio-serial ports; the disk\'s init and partition go to /init', () => {
    const a = vmQemuArgs({ ...spec, agent: false, rootPartition: 2, initPath: '/init2', cmdline: 'quiet  x=1' });
    expect(a.some((x) => x.startsWith('virtio-serial'))).toBe(false);
    const cl = a[a.indexOf('-append') + 1];
    expect(cl.split(' ')).toEqual(expect.arrayContaining(['console=ttyS0', 'dsec.root=root', 'dsec.init=disk', 'dsec.rootpart=2', 'dsec.initpath=/init2', 'quiet', 'x=1']));
    expect(vmCmdline({ ...spec })).toContain('tsc_early_khz=2600000');
    expect(vmCmdline({ ...spec, accel: 'kvm' })).not.toContain('tsc');
  });
});

describe('VMM confinement arguments', () => {
  it('mount namespace binds, uid drop with groups, seccomp; nothing when all is off', () => {
    expect(confinementArgs({ newRoot: '/nr', ro: ['/a', '/b'], rw: ['/d'], dev: ['/dev/null'], uid: 7, gid: 8, groups: [9, 10], seccomp: true }))
      .toEqual(['--new-root', '/nr', '--ro', '/a', '--ro', '/b', '--rw', '/d', '--dev', '/dev/null', '--uid', '7', '--gid', '8', '--groups', '9,10', '--seccomp']);
    expect(confinementArgs({ newRoot: null, ro: ['/a'], rw: [], dev: [], uid: null, gid: null, groups: [], seccomp: false })).toEqual([]);
  });
});

describe('/init booting from a root disk', () => {
  it('mounts the root disk by serial and partition, checks the disk\'s init, or runs the agent', () => {
    const s = initScript(['virtio_pci', 'ext4']);
    expect(s).toContain('dsec.root=*) root=');
    expect(s).toContain('dev=$(dev_by_serial "$root")$rootpart');
    expect(s).toContain('fail "the root disk has no init program $initpath"');
    expect(s).toContain('exec switch_root /newroot "$initpath"');
    // The microvm path (layers + overlay) is kept for an empty dsec.root.
    expect(s).toContain('mount -t overlay overlay');
  });
});

describe('[vm.disks] config', () => {
  it('resolves defaults (format from the extension, init disk) and rejects bad names', () => {
    const f = path.join(tmp, 'c.toml');
    writeFileSync(f, '[vm.disks.deb12]\npath = "/srv/d.qcow2"\nready = "login:"\n[vm.disks.raw1]\npath = "/srv/r.img"\ninit = "agent"\nroot_partition = 1\n');
    const c = loadConfig({ config: f, root: tmp, env: {} });
    expect(c.vm.disks.deb12).toMatchObject({ path: '/srv/d.qcow2', format: 'qcow2', init: 'disk', rootPartition: 0, ready: 'login:' });
    expect(c.vm.disks.raw1).toMatchObject({ format: 'raw', init: 'agent', rootPartition: 1 });
    expect(c.vm.confine).toEqual({ mountNamespace: true, unprivileged: true, seccomp: true });
    writeFileSync(f, '[vm.disks."Bad Name"]\npath = "/x"\n');
    expect(() => loadConfig({ config: f, root: tmp, env: {} })).toThrow();
  });
});

describe('console hub', () => {
  it('logs boundedly (rotating), broadcasts output, forwards input, matches a ready pattern, ends clients when QEMU goes', async () => {
    const sock = path.join(tmp, 'console.sock');
    let qemuSide: net.Socket | null = null;
    const got: Buffer[] = [];
    const server = net.createServer((s) => {
      qemuSide = s;
      s.on('data', (b) => got.push(b));
    });
    await new Promise<void>((r) => server.listen(sock, r));
    const log = path.join(tmp, 'console.log');
    const hub = new ConsoleHub({ socket: sock, logFile: log, oldLogFile: `${log}.1`, logCapBytes: 90, what: 'test' });
    await hub.connect(Date.now() + 2000);
    while (!qemuSide) await new Promise((r) => setTimeout(r, 5));
    const ready = hub.waitFor(/login:/);
    const a: string[] = [];
    const b: string[] = [];
    let ended = '';
    const ca = hub.attach({ onData: (x) => a.push(x.toString()), onEnd: (r) => { ended = r; } });
    hub.attach({ onData: (x) => b.push(x.toString()), onEnd: () => {} });
    qemuSide!.write('x'.repeat(80));
    while (a.join('').length < 80) await new Promise((r) => setTimeout(r, 5));
    qemuSide!.write('boot done\nlogin: ');
    await ready.done;
    await new Promise((r) => setTimeout(r, 50));
    expect(a.join('')).toBe(b.join(''));
    expect(a.join('')).toContain('login: ');
    // 80 bytes, then 17 more: over the 90-byte cap, so the first part was rotated.
    expect(readFileSync(`${log}.1`, 'utf8')).toBe('x'.repeat(80));
    expect(readFileSync(log, 'utf8')).toBe('boot done\nlogin: ');
    ca.write(Buffer.from('root\n'));
    await new Promise((r) => setTimeout(r, 50));
    expect(Buffer.concat(got).toString()).toBe('root\n');
    qemuSide!.destroy();
    await new Promise((r) => setTimeout(r, 50));
    expect(ended).toMatch(/closed/);
    expect(hub.connected).toBe(false);
    expect(() => hub.attach({ onData: () => {}, onEnd: () => {} })).toThrow(/not connected/);
    hub.close();
    server.close();
    expect(existsSync(log) && statSync(log).size).toBeTruthy();
  });
});
