/**
 * microVM sandboxes end to end on real QEMU (`-M microvm`; TCG on this host, whose KVM
 * hangs stock guest kernels, so the KVM probe fails and says so): the guest kernel, exec
 * (stdin, PTY, streamed output) through the agent mux, files, pause/resume, stop/start on
 * the kept writable disk, adoption after dsecd is SIGKILLed, and destroy leaving nothing.
 * Then the bad input: no guest kernel, a VM that does not boot in time, memory the host
 * cannot give, QMP that stops answering.
 *
 * Timings are printed for the report, never asserted.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { GUEST_KERNEL, IS_ROOT, guestKernelRelease, TestDaemon, alive, procsMentioning, rejection } from './harness.js';

const HAS_QEMU = existsSync('/usr/bin/qemu-system-x86_64');
const HAS_KERNEL = existsSync(GUEST_KERNEL);

/** Reads a Readable to a Buffer. */
async function slurp(r: NodeJS.ReadableStream): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of r) parts.push(Buffer.from(c as Buffer));
  return Buffer.concat(parts);
}

/** Every trace a sandbox can leave: no row, dir, cgroup or mount, and no QEMU of this root. */
async function expectNoTraces(d: TestDaemon, id: string): Promise<void> {
  const t = await d.traces();
  expect(t.rows).not.toContain(id);
  expect(t.dirs).not.toContain(id);
  expect(t.cgroups).not.toContain(id);
  expect(t.mounts.filter((m) => m.includes(id))).toEqual([]);
  expect(existsSync(path.join(d.root, 'sandboxes', id))).toBe(false);
  expect(procsMentioning(path.join(d.root, 'sandboxes', id))).toEqual([]);
}

describe.skipIf(!IS_ROOT || !HAS_QEMU || !HAS_KERNEL)('microvm sandboxes', () => {
  let d: TestDaemon;
  let id: string;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 91, config: '[vm]\nqmp_timeout_ms = 2000\n' });
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('creates a microVM whose exec runs on the guest kernel; host info reports the accelerator', async () => {
    const t0 = performance.now();
    const sb = await d.client.createSandbox({ image: 'busybox', backend: 'microvm', memory_bytes: 256 * 2 ** 20 });
    const r = await d.client.exec(sb.id, { argv: ['uname', '-r'] });
    const ms = performance.now() - t0;
    id = sb.id;
    expect(sb).toMatchObject({ state: 'running', backend: 'microvm' });
    const release = r.stdout.toString().trim();
    expect(r.exit_code).toBe(0);
    expect(release).toBe(guestKernelRelease());
    expect(release).not.toBe(os.release());
    // The sandbox's init is its QEMU, in the sandbox's cgroup.
    expect(readFileSync(`/proc/${sb.init_pid}/cmdline`, 'utf8')).toContain('microvm');
    expect(await (await d.cgroups()).pids(sb.id)).toContain(sb.init_pid);
    const info = await d.client.hostInfo();
    expect(info.backends.microvm).toEqual({ available: true, reason: null });
    expect(info.features.kvm.reason).toMatch(/KVM|TCG/);
    const times: number[] = [];
    for (let i = 0; i < 20; i++) {
      const a = performance.now();
      await d.client.exec(sb.id, { argv: ['true'] });
      times.push(performance.now() - a);
    }
    times.sort((a, b) => a - b);
    // The same exec round trip in a container sandbox, for comparison.
    const c = await d.client.createSandbox({ image: 'busybox' });
    const ct: number[] = [];
    for (let i = 0; i < 20; i++) {
      const a = performance.now();
      await d.client.exec(c.id, { argv: ['true'] });
      ct.push(performance.now() - a);
    }
    ct.sort((a, b) => a - b);
    await d.client.deleteSandbox(c.id, { force: true });
    const st = await d.client.sandboxStats(sb.id);
    console.log(`microvm: create->first exec ${ms.toFixed(0)} ms incl. the KVM probe (guest ${release}, ${info.features.kvm.available ? 'KVM' : 'TCG'}); `
      + `exec true p50 through the API: microvm ${times[10].toFixed(2)} ms, container ${ct[10].toFixed(2)} ms; VMM cgroup memory ${(st.memory_bytes! / 2 ** 20).toFixed(0)} MiB (load ${os.loadavg()[0].toFixed(1)})`);
  });

  it('exec with stdin, a PTY exec, and streamed output go through the mux', async () => {
    const cat = await d.client.exec(id, { argv: ['cat'], stdin: Buffer.from('through the mux') });
    expect(cat.stdout.toString()).toBe('through the mux');
    // Streamed: 8 MiB of output, read as it arrives.
    const big = await d.client.startExec(id, { argv: ['head', '-c', String(8 << 20), '/dev/zero'] });
    const bytes = (await slurp(await d.client.execOutput(id, big.exec_id, { follow: true }))).length;
    expect(bytes).toBe(8 << 20);
    expect(await d.client.waitExec(id, big.exec_id)).toMatchObject({ state: 'exited', exit_code: 0 });
    // Paced (what `dsec exec` streams through): its own mux stream, paused while unread;
    // every byte arrives; the guest's OOM kills are not visible from the host (null).
    const paced = await d.client.startExec(id, { argv: ['head', '-c', String(24 << 20), '/dev/zero'], paced: true });
    expect((await slurp(await d.client.execOutput(id, paced.exec_id, { follow: true }))).length).toBe(24 << 20);
    expect(await d.client.waitExec(id, paced.exec_id)).toMatchObject({ state: 'exited', exit_code: 0, paced: true, stdout_dropped_bytes: 0, oom_kills: null });
    expect((await d.client.exec(id, { argv: ['true'] })).oom_kills).toBeNull();
    // PTY: the program sees a terminal of the asked size.
    const tty = await d.client.startExec(id, { argv: ['sh', '-c', 'stty size; tty'], tty: { rows: 33, cols: 101 } });
    await d.client.waitExec(id, tty.exec_id);
    const ttyOut = (await slurp(await d.client.execOutput(id, tty.exec_id))).toString();
    expect(ttyOut).toContain('33 101');
    expect(ttyOut).toMatch(/\/dev\/pts\/\d+/);
    // An exec with stdin that is never read does not stall another exec (own mux stream).
    const stuck = await d.client.startExec(id, { argv: ['sleep', '30'], stdin: true });
    await d.client.writeExecStdin(id, stuck.exec_id, Buffer.alloc(1 << 20));
    expect((await d.client.exec(id, { argv: ['echo', 'not blocked'] })).stdout.toString()).toBe('not blocked\n');
    await d.client.signalExec(id, stuck.exec_id, 'SIGKILL');
  });

  it('copies a file in and out through the files API', async () => {
    const data = Buffer.from(Array.from({ length: 300_000 }, (_, i) => i % 251));
    await d.client.writeFile(id, '/root/in.bin', data, { parents: true, mode: 0o640 });
    expect((await d.client.statFile(id, '/root/in.bin')).size).toBe(data.length);
    const sum = await d.client.exec(id, { argv: ['sh', '-c', 'md5sum /root/in.bin | cut -d" " -f1; cp /root/in.bin /root/out.bin'] });
    const back = await slurp(await d.client.readFile(id, '/root/out.bin'));
    expect(back.equals(data)).toBe(true);
    expect(sum.stdout.toString().trim()).toMatch(/^[0-9a-f]{32}$/);
  });

  it('pause/resume: a process keeps its state across the pause', async () => {
    const e = await d.client.startExec(id, { argv: ['sh', '-c', 'x=$$; echo ready; read line; echo "pid $x got $line"'], stdin: true });
    const paused = await d.client.pauseSandbox(id);
    expect(paused.sandbox.state).toBe('paused');
    expect((await rejection(d.client.exec(id, { argv: ['true'] }))).code).toBe('FailedPrecondition');
    expect((await d.client.resumeSandbox(id)).state).toBe('running');
    await d.client.writeExecStdin(id, e.exec_id, Buffer.from('after resume\n'), { eof: true });
    const done = await d.client.waitExec(id, e.exec_id);
    const out = (await slurp(await d.client.execOutput(id, e.exec_id))).toString();
    expect(done.exit_code).toBe(0);
    expect(out).toMatch(/^ready\npid \d+ got after resume\n$/);
  });

  it('stop/start keeps the writable layer on the disk', async () => {
    // /root and /var: writable top-level directories of the image (the root itself is read-only in the guest).
    await d.client.exec(id, { argv: ['sh', '-c', 'echo kept > /root/state; mkdir -p /var/x; echo deep > /var/x/f'] });
    const stopped = await d.client.stopSandbox(id);
    expect(stopped).toMatchObject({ state: 'stopped', init_pid: null });
    expect(procsMentioning(path.join(d.root, 'sandboxes', id))).toEqual([]);
    expect(existsSync(path.join(d.root, 'sandboxes', id, 'disk.raw'))).toBe(true);
    expect((await rejection(d.client.exec(id, { argv: ['true'] }))).code).toBe('FailedPrecondition');
    const started = await d.client.startSandbox(id);
    expect(started.state).toBe('running');
    const r = await d.client.exec(id, { argv: ['cat', '/root/state', '/var/x/f', '/root/in.bin'] });
    expect(r.stdout.toString().startsWith('kept\ndeep\n')).toBe(true);
    // The new boot confined its commands again: read-only /bin, no_new_privs.
    const c = await d.client.exec(id, { argv: ['sh', '-c', 'touch /bin/x; echo bin=$?; grep NoNewPrivs /proc/self/status'] });
    expect(c.stdout.toString()).toMatch(/bin=1\nNoNewPrivs:\s+1\n/);
  });

  it('survives kill -9 of dsecd: the VM is adopted, execs work, the old streams are dropped in the guest', async () => {
    const before = await d.client.getSandbox(id);
    await d.client.startExec(id, { argv: ['sh', '-c', 'echo $$ > /tmp/sleeper; exec sleep 1234'] });
    await d.client.exec(id, { argv: ['sh', '-c', 'echo marker > /tmp/marker; while [ ! -s /tmp/sleeper ]; do sleep 0.05; done'] });
    const alive = ['sh', '-c', 'kill -0 "$(cat /tmp/sleeper)"'];
    expect((await d.client.exec(id, { argv: alive })).exit_code).toBe(0);
    await d.kill9();
    expect(procsMentioning(path.join(d.root, 'sandboxes', id))).toEqual([before.init_pid]);
    await d.launch();
    const after = await d.client.getSandbox(id);
    expect(after).toMatchObject({ state: 'running', init_pid: before.init_pid });
    // A new dsecd's first connection starts a new mux session: the guest dropped the old
    // dsecd's streams and killed their (non-detached) execs, as for a dropped socket.
    expect((await d.client.exec(id, { argv: ['cat', '/tmp/marker'] })).stdout.toString()).toBe('marker\n');
    expect((await d.client.exec(id, { argv: alive })).exit_code).toBe(1);
    // The adopted guest keeps its confinement, and the new dsecd reports it.
    expect((await d.client.exec(id, { argv: ['grep', 'NoNewPrivs', '/proc/self/status'] })).stdout.toString()).toMatch(/NoNewPrivs:\s+1/);
    expect(after.defences).toMatchObject({ readonly_paths: { enforced: true }, seccomp: { enforced: true } });
  });

  it('a microVM that no store row accounts for is killed and removed at start', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', backend: 'microvm', memory_bytes: 256 * 2 ** 20 });
    await d.kill9();
    const db = new Database(path.join(d.root, 'dsec.db'));
    db.prepare('DELETE FROM sandboxes WHERE id = ?').run(sb.id);
    db.close();
    expect(alive(sb.init_pid!)).toBe(true);
    await d.launch();
    expect(alive(sb.init_pid!)).toBe(false);
    await expectNoTraces(d, sb.id);
    // The other microVM was adopted untouched.
    expect((await d.client.exec(id, { argv: ['echo', 'still here'] })).stdout.toString()).toBe('still here\n');
  });

  it('QMP that stops answering: pause fails with DeadlineExceeded, the VM recovers when QEMU answers again', async () => {
    const sb = await d.client.getSandbox(id);
    process.kill(sb.init_pid!, 'SIGSTOP');
    let err;
    try {
      err = await rejection(d.client.pauseSandbox(id));
    } finally {
      process.kill(sb.init_pid!, 'SIGCONT');
    }
    expect(err.code).toBe('DeadlineExceeded');
    expect(err.message).toMatch(/QMP/);
    expect((await d.client.getSandbox(id)).state).toBe('running');
    // The late `stop` QEMU reads after SIGCONT is undone by dsecd's resync; exec waits for it.
    expect((await d.client.exec(id, { argv: ['echo', 'alive'] })).stdout.toString()).toBe('alive\n');
  });

  it('destroy leaves no QEMU process, socket, disk, mount, cgroup or row', async () => {
    const sb = await d.client.getSandbox(id);
    await d.client.deleteSandbox(id, { force: true });
    expect(alive(sb.init_pid!)).toBe(false);
    await expectNoTraces(d, id);
  });

  it('create -> first exec -> destroy of a second microVM (timing for the report)', async () => {
    // The dsecd restarted above probes KVM again (once per dsecd): wait for its verdict first.
    await d.client.hostInfo();
    const t0 = performance.now();
    const sb = await d.client.createSandbox({ image: 'busybox', backend: 'microvm', memory_bytes: 256 * 2 ** 20 });
    const r = await d.client.exec(sb.id, { argv: ['true'] });
    const ms = performance.now() - t0;
    expect(r.exit_code).toBe(0);
    await d.client.deleteSandbox(sb.id, { force: true });
    await expectNoTraces(d, sb.id);
    console.log(`microvm: create->first exec ${ms.toFixed(0)} ms after the accelerator verdict`);
  });

  it('POST /v1/run with backend microvm: a one-shot run in a fresh microVM, destroyed after', async () => {
    const r = await d.client.run({ backend: 'microvm', image: 'busybox', argv: ['sh', '-c', 'uname -r; echo $((6 * 7))'] });
    expect(r.exit_code).toBe(0);
    const [rel, n] = r.stdout.toString().trim().split('\n');
    expect(rel).not.toBe(os.release());
    expect(n).toBe('42');
    expect((await d.traces()).rows).toEqual([]);
    expect(procsMentioning(path.join(d.root, 'sandboxes'))).toEqual([]);
  });

  it('refuses memory the host cannot give and memory a guest cannot boot in; leaves nothing', async () => {
    const big = await rejection(d.client.createSandbox({ image: 'busybox', backend: 'microvm', memory_bytes: os.totalmem() * 2 }));
    expect(big.code).toBe('InvalidArgument');
    const small = await rejection(d.client.createSandbox({ image: 'busybox', backend: 'microvm', memory_bytes: 32 * 2 ** 20 }));
    expect(small.code).toBe('InvalidArgument');
    expect(small.message).toMatch(/at least/);
    const t = await d.traces();
    expect(t.rows).toEqual([]);
    expect(t.dirs).toEqual([]);
    expect(procsMentioning(path.join(d.root, 'sandboxes'))).toEqual([]);
  });
});

describe.skipIf(!IS_ROOT || !HAS_QEMU || !HAS_KERNEL)('microvm bad input', () => {
  it('a missing guest kernel is FailedPrecondition naming the fix; host info says the backend is unavailable', async () => {
    const d = await TestDaemon.start({ slot: 92, config: '[vm]\nkernel = "/nonexistent/vmlinuz"\n' });
    try {
      const e = await rejection(d.client.createSandbox({ image: 'busybox', backend: 'microvm' }));
      expect(e.code).toBe('FailedPrecondition');
      expect(e.message).toContain('scripts/guest-kernel.sh');
      const info = await d.client.hostInfo();
      expect(info.backends.microvm.available).toBe(false);
      expect(info.backends.microvm.reason).toContain('/nonexistent/vmlinuz');
      expect((await d.traces()).rows).toEqual([]);
      expect((await d.traces()).dirs).toEqual([]);
    } finally {
      await d.cleanup();
    }
  });

  it('a VM that does not boot within its timeout: DeadlineExceeded with the console tail, QEMU killed, nothing left', async () => {
    // Under TCG a boot takes seconds; half a second always ends it early.
    const d = await TestDaemon.start({ slot: 93, config: '[vm]\naccel = "tcg"\nboot_timeout_s = 0.5\n' });
    try {
      const e = await rejection(d.client.createSandbox({ image: 'busybox', backend: 'microvm' }));
      expect(e.code).toBe('DeadlineExceeded');
      expect(e.message).toMatch(/did not boot within 500 ms/);
      expect(e.message).toContain('console log tail');
      const t = await d.traces();
      expect(t).toMatchObject({ rows: [], dirs: [], cgroups: [], mounts: [] });
      expect(procsMentioning(path.join(d.root, 'sandboxes'))).toEqual([]);
    } finally {
      await d.cleanup();
    }
  });
});
