/**
 * Full-VM sandboxes (`backend: "vm"`: QEMU q35, virtio-pci, an emulated serial port, the
 * Debian guest kernel; TCG on this host) end to end:
 *   - a VM of a dsec image boots from the base disk dsec composed from the image's layers
 *     and runs commands through the agent (exec, stdin, PTY, files), pause/resume,
 *     stop/start on its kept qcow2 disk, survives a dsecd kill -9;
 *   - a VM of a registered disk with only a serial console: lifecycle works, exec answers
 *     FailedPrecondition, the console works through the API and through `dsec console`
 *     under a real PTY (node-pty) and through a pipe;
 *   - a registered disk booted with the agent;
 *   - bad input: an unregistered disk, a registered disk whose file is missing, a VM that
 *     fails to boot (its init is missing; and a boot timeout), QMP that stops answering,
 *     `dsec console` on a container sandbox.
 *
 * Timings and memory are printed for the report, never asserted.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, chmodSync, copyFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import pty from 'node-pty';
import { GUEST_KERNEL, IS_ROOT, guestKernelRelease, REPO, TestDaemon, alive, procsMentioning, rejection, runCli } from './harness.js';

const HAS_QEMU = existsSync('/usr/bin/qemu-system-x86_64') && existsSync('/usr/share/seabios/bios-256k.bin');
const HAS_KERNEL = existsSync(GUEST_KERNEL);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function slurp(r: NodeJS.ReadableStream): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of r) parts.push(Buffer.from(c as Buffer));
  return Buffer.concat(parts);
}

/**
 * A bootable disk without the dsec agent: an ext4 filesystem (no partition table) holding
 * static busybox and an /sbin/init that prints a banner and keeps a shell on the console.
 */
async function makeConsoleDisk(dir: string): Promise<string> {
  const tree = path.join(dir, 'tree');
  for (const d of ['bin', 'sbin', 'dev', 'proc', 'sys', 'tmp', 'etc']) mkdirSync(path.join(tree, d), { recursive: true });
  copyFileSync('/bin/busybox', path.join(tree, 'bin/busybox'));
  chmodSync(path.join(tree, 'bin/busybox'), 0o755);
  writeFileSync(path.join(tree, 'sbin/init'), [
    '#!/bin/busybox sh',
    'export PATH=/bin',
    '/bin/busybox --install -s /bin',
    'echo "dsec-test-disk ready on $(uname -r)"',
    'while true; do setsid cttyhack /bin/sh; done',
    '',
  ].join('\n'), { mode: 0o755 });
  const disk = path.join(dir, 'console.raw');
  await execa('mkfs.ext4', ['-q', '-F', '-d', tree, disk, '64M']);
  chmodSync(disk, 0o644);
  return disk;
}

/** Every trace a sandbox can leave: no row, dir, cgroup or mount, and no QEMU of its dir. */
async function expectNoTraces(d: TestDaemon, id: string): Promise<void> {
  const t = await d.traces();
  expect(t.rows).not.toContain(id);
  expect(t.dirs).not.toContain(id);
  expect(t.cgroups).not.toContain(id);
  expect(t.mounts.filter((m) => m.includes(id))).toEqual([]);
  expect(procsMentioning(path.join(d.root, 'sandboxes', id))).toEqual([]);
}

describe.skipIf(!IS_ROOT || !HAS_QEMU || !HAS_KERNEL)('vm sandboxes (q35)', () => {
  let d: TestDaemon;
  let tmp: string;
  let id: string;
  let plain: string;
  beforeAll(async () => {
    tmp = mkdtempSync('/tmp/dsec-vm-disks-');
    const disk = await makeConsoleDisk(tmp);
    d = await TestDaemon.start({
      slot: 95,
      config: [
        '[vm]', 'accel = "tcg"', 'qmp_timeout_ms = 2000',
        '[vm.disks.plain]', `path = "${disk}"`, 'ready = "dsec-test-disk ready"',
        '[vm.disks.agent-on-disk]', `path = "${disk}"`, 'init = "agent"',
        '[vm.disks.noinit]', `path = "${disk}"`, 'init_path = "/sbin/no-such-init"', 'ready = "dsec-test-disk ready"',
        '[vm.disks.gone]', 'path = "/nonexistent/disk.raw"',
        '',
      ].join('\n'),
    });
  });
  afterAll(async () => {
    await d?.cleanup();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  it('A full VM boots and runs a command: q35 with PCI, the guest kernel, exec through the agent', async () => {
    const t0 = performance.now();
    const sb = await d.client.createSandbox({ image: 'busybox', backend: 'vm', memory_bytes: 256 * 2 ** 20 });
    const r = await d.client.exec(sb.id, { argv: ['sh', '-c', 'uname -r; cat /sys/class/dmi/id/product_name; ls /sys/bus/pci/devices | wc -l; cat /etc/hostname 2>/dev/null; echo $((6 * 7))'] });
    const firstMs = performance.now() - t0;
    id = sb.id;
    expect(sb).toMatchObject({ state: 'running', backend: 'vm' });
    expect(r.exit_code).toBe(0);
    const [release, product, pci] = r.stdout.toString().split('\n');
    expect(release).toBe(guestKernelRelease());
    expect(release).not.toBe(os.release());
    expect(product).toMatch(/Q35/);
    expect(Number(pci)).toBeGreaterThan(2);
    expect(r.stdout.toString().trim().split('\n').pop()).toBe('42');
    // The sandbox's init is its QEMU (machine q35), in the sandbox's cgroup.
    const cmd = readFileSync(`/proc/${sb.init_pid}/cmdline`, 'utf8').split('\0');
    expect(cmd[cmd.indexOf('-M') + 1]).toBe('q35');
    expect(await (await d.cgroups()).pids(sb.id)).toContain(sb.init_pid);
    const info = await d.client.hostInfo();
    expect(info.backends.vm).toEqual({ available: true, reason: null });
    // A second VM of the same image reuses the composed base disk.
    const t1 = performance.now();
    const sb2 = await d.client.createSandbox({ image: 'busybox', backend: 'vm', memory_bytes: 256 * 2 ** 20 });
    await d.client.exec(sb2.id, { argv: ['true'] });
    const secondMs = performance.now() - t1;
    const bases = readdirSync(path.join(d.root, 'vm', 'disks')).filter((f) => f.startsWith('base-'));
    expect(bases).toHaveLength(1);
    const times: number[] = [];
    for (let i = 0; i < 10; i++) {
      const a = performance.now();
      await d.client.exec(sb.id, { argv: ['true'] });
      times.push(performance.now() - a);
    }
    times.sort((a, b) => a - b);
    await sleep(3000);
    const st = await d.client.sandboxStats(sb.id);
    const rss = Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${sb.init_pid}/status`, 'utf8'))![1]) * 1024;
    await d.client.deleteSandbox(sb2.id, { force: true });
    console.log(`vm: create->first exec ${firstMs.toFixed(0)} ms (first VM of the image: base disk composed), ${secondMs.toFixed(0)} ms (base disk cached); `
      + `exec true p50 ${times[5].toFixed(2)} ms; idle 256 MiB VM: cgroup memory ${(st.memory_bytes! / 2 ** 20).toFixed(0)} MiB, QEMU RSS ${(rss / 2 ** 20).toFixed(0)} MiB (load ${os.loadavg()[0].toFixed(1)})`);
  });

  it('exec with stdin, a PTY, and files in and out work as in any sandbox', async () => {
    expect((await d.client.exec(id, { argv: ['cat'], stdin: Buffer.from('via virtio-serial-pci') })).stdout.toString()).toBe('via virtio-serial-pci');
    const tty = await d.client.startExec(id, { argv: ['sh', '-c', 'stty size; tty'], tty: { rows: 31, cols: 97 } });
    await d.client.waitExec(id, tty.exec_id);
    const ttyOut = (await slurp(await d.client.execOutput(id, tty.exec_id))).toString();
    expect(ttyOut).toContain('31 97');
    const data = Buffer.from(Array.from({ length: 200_000 }, (_, i) => i % 253));
    await d.client.writeFile(id, '/root/in.bin', data, { parents: true });
    await d.client.exec(id, { argv: ['cp', '/root/in.bin', '/root/out.bin'] });
    expect((await slurp(await d.client.readFile(id, '/root/out.bin'))).equals(data)).toBe(true);
  });

  it('pause/resume, and stop/start keep the writable disk (a qcow2 overlay over the base disk)', async () => {
    expect((await d.client.pauseSandbox(id)).sandbox.state).toBe('paused');
    expect((await rejection(d.client.exec(id, { argv: ['true'] }))).code).toBe('FailedPrecondition');
    expect((await d.client.resumeSandbox(id)).state).toBe('running');
    await d.client.exec(id, { argv: ['sh', '-c', 'echo kept > /state'] });
    expect(await d.client.stopSandbox(id)).toMatchObject({ state: 'stopped', init_pid: null });
    expect(procsMentioning(path.join(d.root, 'sandboxes', id))).toEqual([]);
    expect(existsSync(path.join(d.root, 'sandboxes', id, 'disk.qcow2'))).toBe(true);
    expect((await d.client.startSandbox(id)).state).toBe('running');
    expect((await d.client.exec(id, { argv: ['cat', '/state'] })).stdout.toString()).toBe('kept\n');
    // Commit names this tier and its qcow2 disk (not the microvm's ext4 disk).
    const c = await rejection(d.client.commit(id, { image: 'vmcommit:1' }));
    expect(c.code).toBe('FailedPrecondition');
    expect(c.message).toMatch(new RegExp(`is a vm: its writable layer is the qcow2 disk \\S*${id}/disk\\.qcow2`));
  });

  it('the console log of an agent VM holds the boot; kill -9 of dsecd: the VM and its console are adopted', async () => {
    const log = (await d.client.consoleLog(id)).toString();
    expect(log).toContain('dsec-init: starting the agent');
    const before = await d.client.getSandbox(id);
    await d.kill9();
    expect(alive(before.init_pid!)).toBe(true);
    await d.launch();
    expect(await d.client.getSandbox(id)).toMatchObject({ state: 'running', init_pid: before.init_pid });
    expect((await d.client.exec(id, { argv: ['echo', 'adopted'] })).stdout.toString()).toBe('adopted\n');
    // The console was reconnected: what the guest writes to it now reaches the log.
    await d.client.exec(id, { argv: ['sh', '-c', 'echo console-after-adopt > /dev/ttyS0'] });
    let seen = false;
    for (let i = 0; i < 50 && !seen; i++) {
      seen = (await d.client.consoleLog(id)).toString().includes('console-after-adopt');
      if (!seen) await sleep(100);
    }
    expect(seen).toBe(true);
  });

  it('QMP that stops answering: pause fails with DeadlineExceeded, the VM recovers', async () => {
    const sb = await d.client.getSandbox(id);
    process.kill(sb.init_pid!, 'SIGSTOP');
    let e;
    try {
      e = await rejection(d.client.pauseSandbox(id));
    } finally {
      process.kill(sb.init_pid!, 'SIGCONT');
    }
    expect(e.code).toBe('DeadlineExceeded');
    expect(e.message).toMatch(/QMP/);
    expect((await d.client.exec(id, { argv: ['echo', 'alive'] })).stdout.toString()).toBe('alive\n');
  });

  it('a registered disk with only a serial console: created and running, exec is FailedPrecondition, the console answers', async () => {
    const sb = await d.client.createSandbox({ image: 'disk:plain', backend: 'vm', memory_bytes: 192 * 2 ** 20 });
    plain = sb.id;
    expect(sb).toMatchObject({ state: 'running', backend: 'vm', image: 'disk:plain', image_layers: [] });
    const e = await rejection(d.client.exec(plain, { argv: ['true'] }));
    expect(e.code).toBe('FailedPrecondition');
    expect(e.message).toContain(`dsec console ${plain}`);
    // The guest writes its banner when its init gets there, not before the create answers:
    // read the log until the line is whole (a hang detector bounds the wait).
    const banner = /dsec-test-disk ready on \d+\.\d+/;
    let log = '';
    for (let i = 0; i < 600 && !banner.test(log); i++) {
      if (i > 0) await sleep(100);
      log = (await d.client.consoleLog(plain)).toString();
    }
    expect(log).toMatch(banner);
    // Through the API: what we type runs in the disk's shell.
    const att = d.client.attachConsole(plain);
    let got = '';
    att.on('stdout', (b) => { got += b.toString(); });
    await att.opened;
    att.write('echo con-$((6 * 7))\n');
    for (let i = 0; i < 200 && !got.includes('con-42'); i++) await sleep(50);
    expect(got).toContain('con-42');
    att.close();
    expect(await att.done).toBeNull();
  });

  it('dsec console under a real PTY: raw mode, typed input runs in the VM, Ctrl-P Ctrl-Q detaches with exit 0', async () => {
    const p = pty.spawn(process.execPath, [path.join(REPO, 'bin/dsec'), '--socket', d.socket, 'console', plain], { name: 'xterm', cols: 80, rows: 24, cwd: REPO, env: { ...process.env, NO_COLOR: '1' } as Record<string, string> });
    let outp = '';
    p.onData((s) => { outp += s; });
    const exit = new Promise<{ exitCode: number }>((resolve) => p.onExit(resolve));
    const waitFor = async (re: RegExp) => {
      for (let i = 0; i < 400; i++) {
        if (re.test(outp)) return;
        await sleep(50);
      }
      throw new Error(`no ${re} in ${JSON.stringify(outp)}`);
    };
    await waitFor(/attached to the serial console/);
    // Raw mode: the Enter key arrives as \r, and the guest's tty turns it into a newline.
    p.write('echo pty-$((3 * 5))\r');
    await waitFor(/pty-15/);
    p.write('\x10\x11');
    expect((await exit).exitCode).toBe(0);
    expect(outp).toMatch(/detached from the console/);
    // The VM keeps running after the detach.
    expect((await d.client.getSandbox(plain)).state).toBe('running');
  });

  it('dsec console without a TTY streams: piped input runs, the answer comes back, it detaches when the console is quiet', async () => {
    const r = await runCli(d, ['console', plain, '--linger', '1500'], 'echo piped-$((2 * 3))\n');
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('piped-6');
    const j = await runCli(d, ['--json', 'console', plain]);
    expect(j.code).toBe(125);
    expect(j.stdout + j.stderr).toMatch(/--json cannot be combined with console/);
  });

  it('a console-only VM stops (ACPI power-down, then quit), starts again on its disk, and is destroyed without traces', async () => {
    // The disk's busybox init ignores the ACPI power button: stop waits out the grace period, then quits QEMU.
    const stopped = await d.client.stopSandbox(plain, { timeoutMs: 1000 });
    expect(stopped.state).toBe('stopped');
    const started = await d.client.startSandbox(plain);
    expect(started.state).toBe('running');
    expect((await d.client.consoleLog(plain)).toString().match(/dsec-test-disk ready/g)?.length).toBeGreaterThanOrEqual(2);
    const pid = started.init_pid!;
    await d.client.deleteSandbox(plain, { force: true });
    expect(alive(pid)).toBe(false);
    await expectNoTraces(d, plain);
  });

  it('a registered disk with init = "agent": dsec\'s agent runs on the disk\'s root', async () => {
    const sb = await d.client.createSandbox({ image: 'disk:agent-on-disk', backend: 'vm', memory_bytes: 192 * 2 ** 20 });
    // The disk has only /bin/busybox (its own init would install the applets; it does not run here).
    const r = await d.client.exec(sb.id, { argv: ['/bin/busybox', 'sh', '-c', '/bin/busybox ls /sbin/init && /bin/busybox uname -r'] });
    expect(r.exit_code).toBe(0);
    expect(r.stdout.toString()).toMatch(/^\/sbin\/init\n\d+\.\d+/);
    await d.client.deleteSandbox(sb.id, { force: true });
    await expectNoTraces(d, sb.id);
  });

  it('bad input: unregistered disk, missing disk file, a disk whose init is missing (boot fails: QEMU gone, nothing left)', async () => {
    const nope = await rejection(d.client.createSandbox({ image: 'disk:nope', backend: 'vm' }));
    expect(nope.code).toBe('NotFound');
    expect(nope.message).toContain('[vm.disks.nope]');
    const gone = await rejection(d.client.createSandbox({ image: 'disk:gone', backend: 'vm' }));
    expect(gone.code).toBe('FailedPrecondition');
    expect(gone.message).toContain('/nonexistent/disk.raw');
    const before = (await d.traces()).rows;
    const vmmsBefore = procsMentioning(path.join(d.root, 'sandboxes')).sort();
    const noinit = await rejection(d.client.createSandbox({ image: 'disk:noinit', backend: 'vm', memory_bytes: 192 * 2 ** 20 }));
    expect(noinit.code).toBe('FailedPrecondition');
    expect(noinit.message).toMatch(/QEMU exited during boot/);
    expect(noinit.message).toContain('the root disk has no init program /sbin/no-such-init');
    expect(noinit.message).toContain('console log tail');
    const t = await d.traces();
    expect(t.rows).toEqual(before);
    expect(t.dirs.filter((x) => !before.includes(x))).toEqual([]);
    expect(procsMentioning(path.join(d.root, 'sandboxes')).sort()).toEqual(vmmsBefore);
  });

  it('dsec console on a container sandbox is a clear error', async () => {
    const c = await d.client.createSandbox({ image: 'busybox' });
    const r = await runCli(d, ['console', c.id]);
    expect(r.code).toBe(125);
    expect(r.stderr).toMatch(/only vm sandboxes have a serial console/);
    expect(r.stderr).toContain('dsec exec -it');
    await d.client.deleteSandbox(c.id, { force: true });
  });

  it('destroy leaves no QEMU, socket, disk, cgroup or row; the unused base disk is collected', async () => {
    const sb = await d.client.getSandbox(id);
    await d.client.deleteSandbox(id, { force: true });
    expect(alive(sb.init_pid!)).toBe(false);
    await expectNoTraces(d, id);
    expect(readdirSync(path.join(d.root, 'vm', 'disks')).filter((f) => f.startsWith('base-'))).toEqual([]);
  });
});

describe.skipIf(!IS_ROOT || !HAS_QEMU || !HAS_KERNEL)('vm bad input: boot timeout', () => {
  it('a VM that does not boot within its timeout: DeadlineExceeded with the console tail, QEMU killed, nothing left', async () => {
    const d = await TestDaemon.start({ slot: 96, config: '[vm]\naccel = "tcg"\nboot_timeout_s = 0.5\n' });
    try {
      const e = await rejection(d.client.createSandbox({ image: 'busybox', backend: 'vm' }));
      expect(e.code).toBe('DeadlineExceeded');
      expect(e.message).toMatch(/VM did not boot within 500 ms/);
      expect(e.message).toContain('console log tail');
      expect(await d.traces()).toMatchObject({ rows: [], dirs: [], cgroups: [], mounts: [] });
      expect(procsMentioning(path.join(d.root, 'sandboxes'))).toEqual([]);
    } finally {
      await d.cleanup();
    }
  });
});
