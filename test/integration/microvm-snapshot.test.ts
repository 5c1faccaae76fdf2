/**
 * Machine snapshots of microVMs on real QEMU (TCG here): a snapshot of a running microVM
 * (QMP stop, disk copy, migration of RAM and devices to a file, cont) is restored into a
 * new VM started with `-incoming defer` where a file written before the snapshot and a
 * background process (the same pid) are still there, the agent answering over a new mux
 * session; two forks of it each run on their own disk copy, sockets and agent; then the
 * bad input: overrides that would resize the machine, a truncated state file (refused
 * before anything is made), a state file QEMU cannot load (QEMU exits, is gone, nothing
 * is left); destroying everything leaves no QEMU, socket, mount or cgroup, and removing
 * the snapshots removes their files.
 *
 * Timings are printed for the report, never asserted.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { existsSync, readFileSync, readdirSync, statSync, truncateSync, writeFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { GUEST_KERNEL, IS_ROOT, TestDaemon, alive, procsMentioning, rejection, runCli } from './harness.js';

const HAS_QEMU = existsSync('/usr/bin/qemu-system-x86_64');
const HAS_KERNEL = existsSync(GUEST_KERNEL);
const MEM = 256 * 2 ** 20;

describe.skipIf(!IS_ROOT || !HAS_QEMU || !HAS_KERNEL)('microvm machine snapshots', () => {
  let d: TestDaemon;
  let src: string;
  let snapId: string;
  let guestPid: string;
  const made: string[] = [];
  const sh = async (id: string, script: string) => {
    const r = await d.client.exec(id, { argv: ['sh', '-c', script] });
    expect(r.stderr.toString()).toBe('');
    expect(r.exit_code).toBe(0);
    return r.stdout.toString();
  };
  const sbDir = (id: string) => path.join(d.root, 'sandboxes', id);
  const snapDir = (id: string) => path.join(d.root, 'snapshots', id);

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 95 });
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('snapshot of a running microVM, restored into a new VM: the file and the same process are there', async () => {
    const t0 = performance.now();
    src = (await d.client.createSandbox({ image: 'busybox', backend: 'microvm', memory_bytes: MEM, labels: { job: 'vm' } })).id;
    const bootMs = performance.now() - t0;
    await sh(src, 'echo before-snapshot > /root/file; sh -c \'sleep 1000 & echo $! > /root/pid\'');
    guestPid = (await sh(src, 'cat /root/pid')).trim();
    expect(guestPid).toMatch(/^\d+$/);
    expect(await d.client.hostInfo()).toMatchObject({ features: { vm_snapshots: { available: true } } });

    const t1 = performance.now();
    const snap = await d.client.snapshot(src, { name: 'vm-one' });
    const snapMs = performance.now() - t1;
    snapId = snap.id;
    expect(snap).toMatchObject({ kind: 'vm', backend: 'microvm', name: 'vm-one', sandbox_id: src, labels: { job: 'vm' } });
    expect(snap.machine).toMatchObject({ memory_mib: 256, vcpus: 1, accel: 'tcg' });
    expect(snap.machine!.qemu_version).toMatch(/^\d+\.\d+\.\d+$/);
    // The stream and the disk copy are in the snapshot's dir, with the recorded size and digest.
    const state = path.join(snapDir(snap.id), 'state.qemu');
    const bytes = readFileSync(state);
    expect(bytes.length).toBe(snap.machine!.state_bytes);
    expect(createHash('sha256').update(bytes).digest('hex')).toBe(snap.machine!.state_sha256);
    expect(snap.layer).toBe(`sha256:${snap.machine!.state_sha256}`);
    expect(statSync(path.join(snapDir(snap.id), 'disk.raw')).size).toBe(snap.machine!.disk_bytes);
    // No migration socket is left in the source's dir; the source runs on, its process too.
    expect(existsSync(path.join(sbDir(src), 'migrate.sock'))).toBe(false);
    expect((await d.client.getSandbox(src)).state).toBe('running');
    expect(await sh(src, `kill -0 ${guestPid} && echo alive`)).toBe('alive\n');

    const t2 = performance.now();
    const r = await d.client.restore('vm-one');
    const restoreMs = performance.now() - t2;
    made.push(r.id);
    expect(r).toMatchObject({ state: 'running', backend: 'microvm', snapshot: snap.id, memory_bytes: MEM });
    expect(r.init_pid).not.toBe((await d.client.getSandbox(src)).init_pid);
    const t3 = performance.now();
    expect(await sh(r.id, 'cat /root/file /root/pid')).toBe(`before-snapshot\n${guestPid}\n`);
    const firstExecMs = performance.now() - t3;
    // The very process of the source, resumed: same pid, same program, alive.
    expect(await sh(r.id, `kill -0 ${guestPid} && cat /proc/${guestPid}/cmdline | tr '\\0' ' '`)).toBe('sleep 1000 ');
    // The guest's confinement came with its RAM: system paths stay read-only, and inspect says so.
    expect(await sh(r.id, '{ echo x > /bin/sh-hijack; } 2>&1 || echo refused')).toMatch(/Read-only file system\nrefused\n$/);
    const defences = (await d.client.getSandbox(r.id)).defences as Record<string, { enforced: boolean }>;
    expect(defences.readonly_paths?.enforced).toBe(true);
    // The new VM's QEMU was started to receive a migration and is this sandbox's.
    expect(readFileSync(`/proc/${r.init_pid}/cmdline`, 'utf8').split('\0')).toEqual(expect.arrayContaining(['-incoming', 'defer']));
    expect(await (await d.cgroups()).pids(r.id)).toContain(r.init_pid);
    // The guest clock was set to now (it stood still since the capture), not left at the snapshot's time.
    const guestNow = Number((await sh(r.id, 'date +%s')).trim());
    expect(Math.abs(guestNow - Date.now() / 1000)).toBeLessThan(60);
    // The restored VM diverges from the source.
    await sh(r.id, 'echo restored-only > /root/mine');
    expect(await sh(src, 'test -e /root/mine && echo there || echo absent')).toBe('absent\n');
    console.log(`microvm snapshot (TCG, ${snap.machine!.memory_mib} MiB guest): boot ${bootMs.toFixed(0)} ms; snapshot ${snapMs.toFixed(0)} ms through the API `
      + `(vCPUs stopped ${snap.machine!.paused_ms} ms; state ${(snap.machine!.state_bytes / 2 ** 20).toFixed(1)} MiB; disk ${snap.machine!.disk_reflinked ? 'reflinked' : `copied sparse, ${(snap.machine!.disk_allocated_bytes / 2 ** 20).toFixed(1)} MiB allocated`}); `
      + `restore ${restoreMs.toFixed(0)} ms to running + first exec ${firstExecMs.toFixed(0)} ms (load ${os.loadavg()[0].toFixed(1)})`);
  });

  it('two forks from the snapshot each resume on their own disk, sockets and agent', async () => {
    const t0 = performance.now();
    const forks = await d.client.fork(snapId, { count: 2 });
    const ms = performance.now() - t0;
    made.push(...forks.map((f) => f.id));
    expect(forks).toHaveLength(2);
    expect(new Set(forks.map((f) => f.init_pid)).size).toBe(2);
    for (const [i, f] of forks.entries()) {
      expect(f).toMatchObject({ state: 'running', snapshot: snapId });
      expect(await sh(f.id, `cat /root/file; kill -0 ${guestPid} && echo alive; test -e /root/mine || echo no-mine`)).toBe('before-snapshot\nalive\nno-mine\n');
      await sh(f.id, `echo fork-${i} > /root/mine; sync`);
      for (const file of ['disk.raw', 'qmp.sock', 'vmux.sock', 'agent.sock']) expect(existsSync(path.join(sbDir(f.id), file))).toBe(true);
    }
    for (const [i, f] of forks.entries()) expect(await sh(f.id, 'cat /root/mine')).toBe(`fork-${i}\n`);
    // Each fork's kernel RNG was reseeded from the host at restore: no two draw the same bytes.
    const draws = await Promise.all([...forks.map((f) => f.id), made[0]].map((id) => sh(id, 'cat /proc/sys/kernel/random/uuid')));
    expect(new Set(draws).size).toBe(3);
    // A PTY-less streamed exec goes through each fork's own mux too.
    const e = await d.client.startExec(forks[1].id, { argv: ['sh', '-c', 'echo streamed'] });
    expect(await d.client.waitExec(forks[1].id, e.exec_id)).toMatchObject({ exit_code: 0 });
    console.log(`microvm fork of 2 from one snapshot: ${ms.toFixed(0)} ms until both ran`);
  });

  it('the CLI takes a microvm snapshot and forks from it', async () => {
    const s = await runCli(d, ['snapshot', src, 'vm-cli']);
    expect(s.code).toBe(0);
    expect(s.stdout.trim()).toMatch(/^snap-[0-9a-f]{16}$/);
    expect(s.stderr).toMatch(/machine state/);
    const f = await runCli(d, ['fork', 'vm-cli', '-n', '1']);
    expect(f.code).toBe(0);
    const id = f.stdout.trim();
    made.push(id);
    expect(await sh(id, 'cat /root/mine 2>/dev/null || echo none')).toBe('none\n');
    expect(await sh(id, `kill -0 ${guestPid} && echo alive`)).toBe('alive\n');
  });

  it('a paused microVM is snapshotted as it is and stays paused', async () => {
    const id = made[0];
    await d.client.pauseSandbox(id);
    const snap = await d.client.snapshot(id, { name: 'vm-paused' });
    expect(snap.kind).toBe('vm');
    expect((await d.client.getSandbox(id)).state).toBe('paused');
    expect((await rejection(d.client.exec(id, { argv: ['true'] }))).code).toBe('FailedPrecondition');
    await d.client.resumeSandbox(id);
    expect(await sh(id, 'cat /root/mine')).toBe('restored-only\n');
    await d.client.deleteSnapshot(snap.id);
    expect(existsSync(snapDir(snap.id))).toBe(false);
  });

  it('overrides that would resize the machine are refused before anything is made', async () => {
    const before = (await d.client.listSandboxes()).map((s) => s.id).sort();
    const mem = await rejection(d.client.restore(snapId, { memory_bytes: 512 * 2 ** 20 }));
    expect(mem.code).toBe('InvalidArgument');
    expect(mem.message).toMatch(/256 MiB of RAM/);
    const cpu = await rejection(d.client.fork(snapId, { count: 2, cpus: 2 }));
    expect(cpu.code).toBe('InvalidArgument');
    expect(cpu.message).toMatch(/1 vCPU/);
    expect((await d.client.listSandboxes()).map((s) => s.id).sort()).toEqual(before);
    expect(readdirSync(path.join(d.root, 'sandboxes')).sort()).toEqual(before);
  });

  it('a truncated state file is refused with a clear error; nothing is created', async () => {
    const snap = await d.client.snapshot(src, { name: 'vm-truncated' });
    const state = path.join(snapDir(snap.id), 'state.qemu');
    truncateSync(state, Math.floor(snap.machine!.state_bytes / 2));
    const before = (await d.client.listSandboxes()).map((s) => s.id).sort();
    const e = await rejection(d.client.fork('vm-truncated', { count: 2 }));
    expect(e.code).toBe('FailedPrecondition');
    expect(e.message).toMatch(/snapshot snap-[0-9a-f]{16} \(vm-truncated\) cannot be restored: its machine state .* is corrupt: \d+ bytes where the snapshot wrote \d+/);
    expect((await d.client.listSandboxes()).map((s) => s.id).sort()).toEqual(before);
    expect(readdirSync(path.join(d.root, 'sandboxes')).sort()).toEqual(before);
    // One byte changed in the middle (RAM pages carry no checksum of their own): the digest catches it.
    const flipped = await d.client.snapshot(src, { name: 'vm-flipped' });
    const f = path.join(snapDir(flipped.id), 'state.qemu');
    const b = readFileSync(f);
    b[b.length >> 1] ^= 0xff;
    writeFileSync(f, b);
    const e2 = await rejection(d.client.restore('vm-flipped'));
    expect(e2.code).toBe('FailedPrecondition');
    expect(e2.message).toMatch(/\(vm-flipped\) cannot be restored: its machine state .* is corrupt: sha256 [0-9a-f]{64}, the snapshot wrote [0-9a-f]{64}/);
    expect((await d.client.listSandboxes()).map((s) => s.id).sort()).toEqual(before);
    await d.client.deleteSnapshot(flipped.id);
  });

  it('a state file QEMU cannot load: FailedPrecondition with QEMU\'s reason, QEMU gone, nothing left', async () => {
    // The truncated file of the previous test, with the row's size and digest made to
    // match it (as if the stream were intact but not loadable, e.g. from another QEMU):
    // only QEMU itself can refuse it now.
    const snap = await d.client.getSnapshot('vm-truncated');
    const state = readFileSync(path.join(snapDir(snap.id), 'state.qemu'));
    const db = new Database(path.join(d.root, 'dsec.db'));
    try {
      const row = db.prepare('SELECT machine FROM snapshots WHERE id = ?').get(snap.id) as { machine: string };
      const m = { ...JSON.parse(row.machine), stateBytes: state.length, stateSha256: createHash('sha256').update(state).digest('hex') };
      db.prepare('UPDATE snapshots SET machine = ? WHERE id = ?').run(JSON.stringify(m), snap.id);
    } finally {
      db.close();
    }
    const before = (await d.client.listSandboxes()).map((s) => s.id).sort();
    const qemus = procsMentioning(path.join(d.root, 'sandboxes')).sort();
    const e = await rejection(d.client.restore('vm-truncated'));
    expect(e.code).toBe('FailedPrecondition');
    expect(e.message).toMatch(/cannot be restored: QEMU could not load its machine state .* and exited \(QEMU exit status 1\)/);
    expect(e.message).toMatch(/load of migration failed/);
    expect((await d.client.listSandboxes()).map((s) => s.id).sort()).toEqual(before);
    const t = await d.traces();
    expect(t.dirs).toEqual(before);
    expect(t.cgroups).toEqual(before);
    expect(procsMentioning(path.join(d.root, 'sandboxes')).sort()).toEqual(qemus);
    await d.client.deleteSnapshot(snap.id);
  });

  it('a restored VM stops and starts again on its own disk (a cold boot of the copied disk)', async () => {
    const id = made[1];
    await sh(id, 'echo across-stop > /root/kept');
    expect((await d.client.stopSandbox(id)).state).toBe('stopped');
    expect(procsMentioning(sbDir(id))).toEqual([]);
    expect((await d.client.startSandbox(id)).state).toBe('running');
    expect(await sh(id, 'cat /root/file /root/mine /root/kept')).toBe('before-snapshot\nfork-0\nacross-stop\n');
    // A cold boot: the snapshot's process is not there any more (its pid may be another process's now).
    const sleeping = await d.client.exec(id, { argv: ['sh', '-c', `for p in /proc/[0-9]*; do tr '\\0' ' ' 2>/dev/null < $p/cmdline; echo; done | grep -c '^sleep 1000 $'`] });
    expect(sleeping.stdout.toString()).toBe('0\n');
    expect(await sh(made[0], `for p in /proc/[0-9]*; do tr '\\0' ' ' 2>/dev/null < $p/cmdline; echo; done | grep -c '^sleep 1000 $'`)).toBe('1\n');
  });

  it('a dsecd crash after the snapshot files are written leaves no snapshot and no files; restored VMs are adopted', async () => {
    const before = (await d.client.listSnapshots()).map((s) => s.id).sort();
    expect(readdirSync(path.join(d.root, 'snapshots')).sort()).toEqual(before);
    await d.restart({ DSEC_FAILPOINT: 'snapshot.after-layer' });
    await expect(d.client.snapshot(src, { name: 'vm-crashed' })).rejects.toBeDefined();
    expect((await d.waitExit()).signal).toBe('SIGKILL');
    // The files were complete when dsecd died; no row names them.
    expect(readdirSync(path.join(d.root, 'snapshots')).length).toBe(before.length + 1);
    await d.launch();
    expect((await d.client.listSnapshots()).map((s) => s.id).sort()).toEqual(before);
    expect(readdirSync(path.join(d.root, 'snapshots')).sort()).toEqual(before);
    expect((await d.client.getSandbox(src)).state).toBe('running');
    expect(await sh(src, `kill -0 ${guestPid} && echo alive`)).toBe('alive\n');
    expect(await sh(made[0], 'cat /root/mine')).toBe('restored-only\n');
  });

  it('destroying everything leaves no QEMU, socket, mount or cgroup; removing the snapshots removes their files', async () => {
    const all = await d.client.listSandboxes();
    expect(all.map((s) => s.id).sort()).toEqual([src, ...made].sort());
    for (const s of all) await d.client.deleteSandbox(s.id, { force: true });
    for (const s of all) expect(alive(s.init_pid!)).toBe(false);
    const t = await d.traces();
    expect(t).toMatchObject({ rows: [], dirs: [], cgroups: [], mounts: [] });
    expect(procsMentioning(path.join(d.root, 'sandboxes'))).toEqual([]);
    for (const s of await d.client.listSnapshots()) await d.client.deleteSnapshot(s.id);
    expect(readdirSync(path.join(d.root, 'snapshots'))).toEqual([]);
  });
});
