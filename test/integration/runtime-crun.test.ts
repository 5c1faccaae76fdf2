/**
 * crun as the container runtime, with runc as the reference (issue 25 item 3): on a
 * cgroup v1 host dsecd creates each sandbox's cgroups, writes their limits and device
 * rules, and starts crun inside them through native/oci-exec (crun 1.8 refuses this
 * hybrid host on its own, and resolves a relative cgroupsPath from each hierarchy's
 * root). A sandbox of a crun dsecd and one of a runc dsecd, created alike, must look the
 * same from the host's cgroups and from inside.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, TestDaemon, out } from './harness.js';
import { CONTAINER_DEVICE_RULES } from '../../daemon/drivers/cgroup-limits.js';
import { READONLY_PATHS } from '../../daemon/drivers/container/spec.js';
import { detectRuntime, ociExecPath } from '../../daemon/drivers/container/runtime.js';
import { execa } from 'execa';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';

const MiB = 1 << 20;
/** What a sandbox shows of itself, in sections split by `--`: capabilities, seccomp and privilege bits, its cgroups, id maps, rlimits, mounts, /dev and the hostname. */
const INSIDE = [
  'grep -E "^(Cap|Seccomp|NoNewPrivs)" /proc/self/status',
  'echo --; cat /proc/self/cgroup',
  'echo --; cat /proc/self/uid_map /proc/self/gid_map',
  'echo --; cat /proc/self/limits',
  // mount point, fs type, per-mount and superblock options; ids and peer groups vary
  "echo --; awk '{ for (i = 7; $i != \"-\"; i++); print $5, $(i+1), $6, $(i+3) }' /proc/self/mountinfo",
  'echo --; ls /dev; hostname',
].join('; ');

describe.skipIf(!IS_ROOT)('crun through dsec-oci-exec, runc as the reference', () => {
  let c: TestDaemon;
  let r: TestDaemon;
  beforeAll(async () => {
    [c, r] = await Promise.all([
      TestDaemon.start({ slot: 71 }),
      TestDaemon.start({ slot: 72, config: '[runtime]\nname = "runc"\n' }),
    ]);
  });
  afterAll(async () => {
    await Promise.all([c?.cleanup(), r?.cleanup()]);
  });

  it('the default runtime on this host is crun, started through the launcher', async () => {
    expect((await c.client.hostInfo()).runtime.name).toBe('crun');
    expect((await r.client.hostInfo()).runtime.name).toBe('runc');
  });

  it('cgroups: every process in the sandbox cgroup of every hierarchy, under dsecd\'s own subtree; limits and device rules as runc writes them', async () => {
    const spec = { image: 'busybox', cpus: 0.5, memory_bytes: 48 * MiB, pids: 40 };
    for (const priority of ['latency', 'batch'] as const) {
      const [a, b] = await Promise.all([c.client.createSandbox({ ...spec, priority }), r.client.createSandbox({ ...spec, priority })]);
      const files = async (d: TestDaemon, id: string, pid: number) => {
        const paths = (await d.cgroups()).sandboxPaths(id);
        // The init (and so every process it forks) is in the sandbox's cgroup everywhere, the unified mount included.
        for (const dir of new Set(Object.values(paths))) expect(readFileSync(path.join(dir, 'cgroup.procs'), 'utf8').split('\n').map(Number)).toContain(pid);
        const read = (k: string, f: string) => readFileSync(path.join(paths[k], f), 'utf8').trim();
        return {
          devices: read('devices', 'devices.list').split('\n').sort(),
          memory: read('memory', 'memory.limit_in_bytes'),
          quota: read('cpu', 'cpu.cfs_quota_us'), period: read('cpu', 'cpu.cfs_period_us'), shares: read('cpu', 'cpu.shares'),
          pids: read('pids', 'pids.max'),
        };
      };
      const fa = await files(c, a.id, a.init_pid!);
      const fb = await files(r, b.id, b.init_pid!);
      expect(fa).toEqual(fb);
      expect(fa.devices).toEqual([...CONTAINER_DEVICE_RULES].sort());
      expect(fa).toMatchObject({ memory: String(48 * MiB), quota: '50000', period: '100000', pids: '40', shares: priority === 'batch' ? '2' : '1024' });
      await Promise.all([c.client.deleteSandbox(a.id, { force: true }), r.client.deleteSandbox(b.id, { force: true })]);
    }
  });

  it('from inside: the same capabilities, seccomp mode, cgroups, id maps, rlimits and /dev; the same mounts, none less restricted', async () => {
    const [a, b] = await Promise.all([c.client.createSandbox({ image: 'busybox' }), r.client.createSandbox({ image: 'busybox' })]);
    const look = async (d: TestDaemon, id: string) => {
      const x = await d.client.exec(id, { argv: ['sh', '-c', INSIDE] });
      expect(x.exit_code).toBe(0);
      // The uid range and the hostname (the sandbox id) differ by construction.
      const [status, cgroup, maps, limits, mounts, dev] = out(x).replace(new RegExp(id, 'g'), 'ID').split('--\n');
      const mountMap = new Map<string, { type: string; flags: Set<string> }>();
      for (const line of mounts.trim().split('\n')) {
        const [point, type, opts] = line.split(' ');
        // Only what restricts: superblock options and the mount order differ between runtimes.
        mountMap.set(point, { type, flags: new Set(opts.split(',').filter((f) => ['ro', 'nosuid', 'nodev', 'noexec'].includes(f))) });
      }
      // crun adds the /dev/core symlink (to /proc/kcore, which is masked); runc does not.
      const devs = dev.split('\n').filter((n) => n !== 'core').join('\n');
      return { same: { status, cgroup, maps: maps.replace(/^(\s*0\s+)\d+(\s+\d+)$/gm, '$1BASE$2'), limits, dev: devs }, mounts: mountMap };
    };
    const [ia, ib] = await Promise.all([look(c, a.id), look(r, b.id)]);
    expect(ia.same).toEqual(ib.same);
    expect(ia.same.status).toMatch(/^Seccomp:\s+2$/m);
    expect(ia.same.status).toMatch(/^NoNewPrivs:\s+1$/m);
    expect([...ia.mounts.keys()].sort()).toEqual([...ib.mounts.keys()].sort());
    for (const [point, ref] of ib.mounts) {
      const got = ia.mounts.get(point)!;
      expect({ point, type: got.type }).toEqual({ point, type: ref.type });
      // The read-only paths under /proc are binds of /proc's own dirs: crun makes them ro
      // only, runc also nosuid/nodev/noexec, which procfs content (no setuid file, device
      // node or executable) does not need.
      const wanted = READONLY_PATHS.includes(point) ? ['ro'] : [...ref.flags];
      expect({ point, missing: wanted.filter((f) => !got.flags.has(f)) }).toEqual({ point, missing: [] });
    }
    // The writable places (a read-only root with binds of /home, /root, /run, /tmp, /var) stay nosuid and nodev.
    for (const p of ['/home', '/root', '/run', '/tmp', '/var']) expect([...ia.mounts.get(p)!.flags].sort()).toEqual(['nodev', 'nosuid']);
    await Promise.all([c.client.deleteSandbox(a.id, { force: true }), r.client.deleteSandbox(b.id, { force: true })]);
  });

  it('the seccomp monitor counts a crun sandbox\'s denials (crun pretty-prints the state it sends the listener)', async () => {
    const a = await c.client.createSandbox({ image: 'busybox' });
    const x = await c.client.exec(a.id, { argv: ['sh', '-c', 'unshare -U true; echo $?'] });
    expect(out(x).trim()).not.toBe('0');
    expect((await c.client.sandboxStats(a.id)).seccomp_denials?.total ?? 0).toBeGreaterThanOrEqual(1);
    await c.client.deleteSandbox(a.id, { force: true });
  });

  it('stop, start, pause and destroy leave no trace in the crun state dir, cgroups or mounts', async () => {
    const a = await c.client.createSandbox({ image: 'busybox' });
    await c.client.pauseSandbox(a.id);
    await c.client.resumeSandbox(a.id);
    await c.client.stopSandbox(a.id);
    const started = await c.client.startSandbox(a.id);
    expect(await (await c.cgroups()).pids(a.id)).toContain(started.init_pid);
    await c.client.deleteSandbox(a.id, { force: true });
    const t = await c.traces();
    const mine = (xs: string[]) => xs.filter((x) => x.includes(a.id));
    expect({ runtime: mine(t.runtime), cgroups: mine(t.cgroups), mounts: mine(t.mounts), dirs: mine(t.dirs) }).toEqual({ runtime: [], cgroups: [], mounts: [], dirs: [] });
  });

  it('a host moved from runc to crun (auto, after crun is installed) keeps its runc sandboxes until they are destroyed', async () => {
    const old = await r.client.createSandbox({ image: 'busybox' });
    const stoppedOld = await r.client.createSandbox({ image: 'busybox' });
    await r.client.stopSandbox(stoppedOld.id);
    r.setConfig('');
    await r.restart();
    expect((await r.client.hostInfo()).runtime.name).toBe('crun');
    // The running one is adopted (runc still answers for it) and works.
    expect((await r.client.getSandbox(old.id)).state).toBe('running');
    expect(out(await r.client.exec(old.id, { argv: ['echo', 'still here'] }))).toBe('still here\n');
    // A new one, and the stopped one when started again, run on crun.
    const fresh = await r.client.createSandbox({ image: 'busybox' });
    await r.client.startSandbox(stoppedOld.id);
    const [runc, crun] = await r.runtimes();
    expect((await runc.list()).map((x) => x.id)).toEqual([old.id]);
    expect((await crun.list()).map((x) => x.id).sort()).toEqual([fresh.id, stoppedOld.id].sort());
    // Destroying the runc one goes through runc: nothing of it is left.
    await r.client.deleteSandbox(old.id, { force: true });
    expect(await runc.list()).toEqual([]);
    const t = await r.traces();
    expect({ cgroups: t.cgroups.includes(old.id), mounts: t.mounts.some((m) => m.includes(old.id)) }).toEqual({ cgroups: false, mounts: false });
    await r.client.deleteSandbox(fresh.id, { force: true });
    await r.client.deleteSandbox(stoppedOld.id, { force: true });
  });

  it('runtime choice: auto takes crun through the launcher on v1; a path with auto, crun on v2 are refused with the reason; an earlier crun on v2 only inspects and deletes', async () => {
    const auto = await detectRuntime({ name: 'auto', path: null }, 1);
    expect(auto).toMatchObject({ name: 'crun', cgroupsByDsecd: true });
    expect(auto.launcher).toMatch(/native\/oci-exec\/dsec-oci-exec$/);
    await expect(detectRuntime({ name: 'auto', path: '/usr/sbin/runc' }, 1)).rejects.toMatchObject({ kind: 'InvalidArgument', message: expect.stringContaining('needs name = "runc" or "crun"') });
    await expect(detectRuntime({ name: 'crun', path: null }, 2)).rejects.toMatchObject({ kind: 'Unavailable', message: expect.stringContaining('use runc') });
    expect(await detectRuntime({ name: 'auto', path: null }, 2)).toMatchObject({ name: 'runc', cgroupsByDsecd: false, launcher: null });
    expect(await detectRuntime({ name: 'crun', path: null }, 2, { existing: true })).toMatchObject({ name: 'crun', cgroupsByDsecd: false, launcher: null });
    await expect(detectRuntime({ name: 'crun', path: '/nonexistent/crun' }, 1)).rejects.toMatchObject({ kind: 'Unavailable', message: expect.stringContaining('did not answer --version') });
  });

  it('a runtime that fails to start the container leaves no cgroup behind (runc configured as crun: it refuses crun\'s flags)', async () => {
    const w = await TestDaemon.start({ slot: 73, config: '[runtime]\nname = "crun"\npath = "/usr/sbin/runc"\n' });
    try {
      await expect(w.client.createSandbox({ image: 'busybox' })).rejects.toMatchObject({ code: 'Internal' });
      const t = await w.traces();
      expect({ cgroups: t.cgroups, runtime: t.runtime, rows: t.rows }).toEqual({ cgroups: [], runtime: [], rows: [] });
    } finally {
      await w.cleanup();
    }
  });

  it('the launcher: steps run in order, a failing one stops it (exit 125) before the runtime, its message a JSON line in the error log', async () => {
    const tmp = mkdtempSync('/tmp/dsec-oci-exec-');
    try {
      const log = path.join(tmp, 'runtime.log');
      // Like cgroupfs files, the targets of --write exist (nothing is created but by --mkdir).
      mkdirSync(path.join(tmp, 'a'));
      writeFileSync(path.join(tmp, 'a', 'f'), '');
      const ok = await execa(ociExecPath(), ['--error-log', log, '--mkdir', path.join(tmp, 'a'), '--mkdir', path.join(tmp, 'a'),
        '--write', path.join(tmp, 'a', 'f'), 'x', '--copy', path.join(tmp, 'a', 'f'), path.join(tmp, 'g'), '/bin/cat', path.join(tmp, 'g')], { reject: false, stdio: ['ignore', 'pipe', 'pipe'] });
      // --copy onto a missing file fails, and the runtime (cat) never runs.
      expect(ok.exitCode).toBe(125);
      expect(ok.stderr).toContain(`dsec-oci-exec: copy to ${path.join(tmp, 'g')}: No such file or directory`);
      const lines = readFileSync(log, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { level: string; msg: string });
      expect(lines).toEqual([{ level: 'error', msg: `dsec-oci-exec: copy to ${path.join(tmp, 'g')}: No such file or directory` }]);
      expect(readFileSync(path.join(tmp, 'a', 'f'), 'utf8')).toBe('x');
      const run = await execa(ociExecPath(), ['--write', path.join(tmp, 'a', 'f'), 'y', '/bin/cat', path.join(tmp, 'a', 'f')], { reject: false });
      expect({ code: run.exitCode, out: run.stdout }).toEqual({ code: 0, out: 'y' });
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  });
});
