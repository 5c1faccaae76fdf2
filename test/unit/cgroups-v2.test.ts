/**
 * The v2 manager against a temp directory tree shaped like cgroupfs. A plain directory
 * does not grow interface files on mkdir, nor change them behind our back, so the test
 * plays the kernel: it pre-creates a sandbox's files (what runc + the kernel would
 * produce), flips cgroup.events when cgroup.freeze is written, and deletes interface
 * files before rmdir (a cgroup rmdir succeeds with them present; a plain rmdir does not).
 *
 * Every pid written into the fake tree is either this test's own child or above the
 * kernel's maximum pid (PID_MAX_LIMIT is 4194304), so a stray SIGKILL can hit nothing.
 */
import { spawn } from 'node:child_process';
import { mkdir, mkdtemp, readFile, readdir, rm, stat, unlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { detectCgroups, type CgroupManager } from '../../daemon/host/cgroups/index.js';
import { DAEMON_LEAF } from '../../daemon/host/cgroups/v2.js';

const NO_PID_A = 99999901;
const NO_PID_B = 99999902;
const OWN = '/system.slice/dsecd.service';

let root: string;
let ownDir: string;

async function put(dir: string, files: Record<string, string>) {
  await mkdir(dir, { recursive: true });
  for (const [name, text] of Object.entries(files)) await writeFile(path.join(dir, name), text);
}
const read = (p: string) => readFile(p, 'utf8');
const exists = (p: string) => stat(p).then(() => true, () => false);

/** What the kernel shows in a fresh non-root cgroup. */
const CGROUP_FILES = (procs: string) => ({
  'cgroup.controllers': 'cpu io memory pids\n',
  'cgroup.subtree_control': '',
  'cgroup.procs': procs,
  'cgroup.type': 'domain\n',
});

/** Pre-creates what runc and the kernel would leave in a sandbox cgroup. */
async function fakeSandbox(m: CgroupManager, id: string, procs = `${NO_PID_A}\n${NO_PID_B}\n`) {
  await put(m.sandboxPaths(id).unified, {
    ...CGROUP_FILES(procs),
    'memory.current': '1048576\n',
    'memory.max': 'max\n',
    'memory.stat': 'anon 4096\nfile 8192\nkernel 0\nshmem 0\n',
    'memory.events': 'low 0\nhigh 0\nmax 3\noom 2\noom_kill 1\noom_group_kill 0\n',
    'memory.reclaim': '',
    'pids.current': '2\n',
    'pids.max': '512\n',
    'pids.events': 'max 7\n',
    'cpu.stat': 'usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n',
    'cgroup.freeze': '0\n',
    'cgroup.events': 'populated 1\nfrozen 0\n',
  });
}

/** Simulates the kernel's rmdir: interface files vanish with the cgroup. */
async function dropInterfaceFiles(dir: string) {
  for (const e of await readdir(dir, { withFileTypes: true })) {
    if (e.isFile()) await unlink(path.join(dir, e.name));
    else if (e.isDirectory()) await dropInterfaceFiles(path.join(dir, e.name));
  }
}

/** Plays the kernel's freezer: when cgroup.freeze reads `want`, report it in cgroup.events. */
async function kernelFreezer(dir: string, want: '0' | '1') {
  for (let i = 0; i < 1000; i++) {
    if ((await read(path.join(dir, 'cgroup.freeze'))).trim() === want) {
      await writeFile(path.join(dir, 'cgroup.events'), `populated 1\nfrozen ${want}\n`);
      return;
    }
    await new Promise((r) => setTimeout(r, 2));
  }
  throw new Error('cgroup.freeze was never written');
}

async function manager(instance = 'unit', own = OWN): Promise<CgroupManager> {
  return detectCgroups({ instance, mountRoot: root, procSelfCgroup: `0::${own}\n`, mountinfo: '' });
}

beforeEach(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), 'dsec-cg2-'));
  await put(root, { 'cgroup.controllers': 'cpuset cpu io memory hugetlb pids rdma misc\n', 'cgroup.subtree_control': 'cpu memory pids\n', 'cgroup.procs': '' });
  ownDir = path.join(root, OWN);
  await put(ownDir, CGROUP_FILES(`${process.pid}\n${NO_PID_A}\n`));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

describe('cgroup v2 detection', () => {
  it('picks v2 for a tree with cgroup.controllers and no v1 hierarchy (real mountinfo)', async () => {
    const m = await detectCgroups({ instance: 'unit', mountRoot: root, procSelfCgroup: `0::${OWN}\n` });
    expect(m.version).toBe(2);
    expect(m.parents).toEqual({ unified: path.join(ownDir, 'dsec-unit') });
    expect(m.runtimePath('sb1')).toBe('dsec-unit/sb1');
    expect(m.sandboxPaths('sb1')).toEqual({ unified: path.join(ownDir, 'dsec-unit', 'sb1') });
  });
});

describe('cgroup v2 init', () => {
  it('moves the daemon into the dsecd leaf, then enables cpu, memory, pids, io along the instance parent', async () => {
    const m = await manager();
    await m.init();
    const leafProcs = await read(path.join(ownDir, DAEMON_LEAF, 'cgroup.procs'));
    // One write per pid; the fake file keeps the last one. The daemon goes first.
    expect(leafProcs).toBe(String(NO_PID_A));
    expect(await read(path.join(ownDir, 'cgroup.subtree_control'))).toBe('+cpu +memory +pids +io');
    expect(await read(path.join(m.parents.unified, 'cgroup.subtree_control'))).toBe('+cpu +memory +pids +io');
    // Idempotent: nothing missing, nothing rewritten, the parent survives.
    await writeFile(path.join(m.parents.unified, 'marker'), 'x');
    await m.init();
    expect(await exists(path.join(m.parents.unified, 'marker'))).toBe(true);
    // A manager created after the move (own path now ends in /dsecd) uses the same parent.
    const again = await manager('unit', `${OWN}/${DAEMON_LEAF}`);
    expect(again.parents).toEqual(m.parents);
  });
  it('writes the daemon pid first', async () => {
    await put(ownDir, { 'cgroup.procs': `${process.pid}\n` });
    await (await manager()).init();
    expect(await read(path.join(ownDir, DAEMON_LEAF, 'cgroup.procs'))).toBe(String(process.pid));
  });
  it('only enables controllers the own cgroup has', async () => {
    await put(ownDir, { 'cgroup.controllers': 'memory io\n' });
    const m = await manager();
    await m.init();
    expect(await read(path.join(m.parents.unified, 'cgroup.subtree_control'))).toBe('+memory +io');
  });
  it('moves nothing out of the real root cgroup (no cgroup.type)', async () => {
    const m = await manager('unit', '/');
    await m.init();
    expect(await exists(path.join(root, DAEMON_LEAF))).toBe(false);
    expect(m.parents.unified).toBe(path.join(root, 'dsec-unit'));
  });
  it('fails cleanly when the own cgroup does not exist (and creates nothing above it)', async () => {
    const m = await manager('unit', '/nope/dsecd.service');
    await expect(m.init()).rejects.toMatchObject({ kind: 'FailedPrecondition' });
    expect(await exists(path.join(root, 'nope'))).toBe(false);
  });
});

describe('cgroup v2 sandboxes', () => {
  let m: CgroupManager;
  beforeEach(async () => {
    m = await manager();
    await m.init();
  });

  it('list, exists and pids see pre-created sandboxes only', async () => {
    expect(await m.list()).toEqual([]);
    await fakeSandbox(m, 'sb1');
    await fakeSandbox(m, 'sb2', '');
    await mkdir(path.join(m.parents.unified, 'Not.A.Sandbox'));
    expect(await m.list()).toEqual(['sb1', 'sb2']);
    expect(await m.exists('sb1')).toBe(true);
    expect(await m.exists('sb3')).toBe(false);
    expect(await m.pids('sb1')).toEqual([NO_PID_A, NO_PID_B]);
    expect(await m.pids('sb2')).toEqual([]);
    expect(await m.pids('sb3')).toEqual([]);
  });

  it('another instance never lists these sandboxes', async () => {
    const other = await manager('other');
    await other.init();
    await fakeSandbox(m, 'sb1');
    await fakeSandbox(other, 'sb9');
    expect(await m.list()).toEqual(['sb1']);
    expect(await other.list()).toEqual(['sb9']);
    expect(await other.exists('sb1')).toBe(false);
  });

  it('stats read memory, pids, cpu and freezer files with their units', async () => {
    await fakeSandbox(m, 'sb1');
    expect(await m.stats('sb1')).toEqual({
      memoryBytes: 1048576, memoryLimitBytes: null, memoryCacheBytes: 8192, memoryAnonBytes: 4096,
      oomKills: 1, pidsCurrent: 2, pidsLimit: 512, pidsLimitHits: 7, cpuUsageNs: 1_500_000, frozen: false,
    });
    expect(await m.limitCounters('sb1')).toEqual({ oomKills: 1, pidsLimitHits: 7 });
    await expect(m.stats('gone')).rejects.toMatchObject({ kind: 'NotFound' });
  });

  it('oomKills reads memory.events afresh on every call (the file stays open) and is 0 when absent', async () => {
    await fakeSandbox(m, 'sb1');
    expect(await m.oomKills('sb1')).toBe(1);
    await writeFile(path.join(m.sandboxPaths('sb1').unified, 'memory.events'), 'low 0\nhigh 0\nmax 9\noom 4\noom_kill 3\n');
    expect(await m.oomKills('sb1')).toBe(3);
    expect(await m.oomKills('gone')).toBe(0);
  });

  it('freeze and thaw wait for cgroup.events', async () => {
    await fakeSandbox(m, 'sb1');
    const dir = m.sandboxPaths('sb1').unified;
    await Promise.all([m.freeze('sb1'), kernelFreezer(dir, '1')]);
    expect((await m.stats('sb1')).frozen).toBe(true);
    await Promise.all([m.thaw('sb1'), kernelFreezer(dir, '0')]);
    expect((await m.stats('sb1')).frozen).toBe(false);
  });

  it('freeze gives up after its timeout and undoes the freeze', async () => {
    await fakeSandbox(m, 'sb1');
    await expect(m.freeze('sb1', 30)).rejects.toMatchObject({ kind: 'DeadlineExceeded' });
    expect((await read(path.join(m.sandboxPaths('sb1').unified, 'cgroup.freeze'))).trim()).toBe('0');
    await expect(m.freeze('gone', 30)).rejects.toMatchObject({ kind: 'NotFound' });
  });

  it('killAll SIGKILLs the processes when cgroup.kill is missing', async () => {
    const child = spawn('sleep', ['100'], { stdio: 'ignore' });
    const exited = new Promise<NodeJS.Signals | null>((r) => child.on('exit', (_c, s) => r(s)));
    await fakeSandbox(m, 'sb1', `${child.pid}\n`);
    const procs = path.join(m.sandboxPaths('sb1').unified, 'cgroup.procs');
    // The kernel drops an exited process from cgroup.procs.
    void exited.then(() => writeFile(procs, ''));
    await m.killAll('sb1');
    expect(await exited).toBe('SIGKILL');
    expect(await m.pids('sb1')).toEqual([]);
  });

  it('killAll writes cgroup.kill when present', async () => {
    await fakeSandbox(m, 'sb1');
    const dir = m.sandboxPaths('sb1').unified;
    await writeFile(path.join(dir, 'cgroup.kill'), '');
    const kernel = (async () => {
      while ((await read(path.join(dir, 'cgroup.kill'))).trim() !== '1') await new Promise((r) => setTimeout(r, 2));
      await writeFile(path.join(dir, 'cgroup.procs'), '');
    })();
    await m.killAll('sb1');
    await kernel;
    expect(await m.pids('sb1')).toEqual([]);
  });

  it('killAll gives up with DeadlineExceeded when processes stay, and returns at once when the cgroup is gone', async () => {
    await fakeSandbox(m, 'sb1');
    await expect(m.killAll('sb1', 30)).rejects.toMatchObject({ kind: 'DeadlineExceeded' });
    await m.killAll('gone');
  });

  it('setMemoryLimit writes memory.max', async () => {
    await fakeSandbox(m, 'sb1');
    const file = path.join(m.sandboxPaths('sb1').unified, 'memory.max');
    await m.setMemoryLimit('sb1', 64 << 20);
    expect(await read(file)).toBe(String(64 << 20));
    expect((await m.stats('sb1')).memoryLimitBytes).toBe(64 << 20);
    await m.setMemoryLimit('sb1', null);
    expect(await read(file)).toBe('max');
    await expect(m.setMemoryLimit('sb1', -1)).rejects.toMatchObject({ kind: 'InvalidArgument' });
    await expect(m.setMemoryLimit('gone', 1)).rejects.toMatchObject({ kind: 'NotFound' });
  });

  it('reclaim writes memory.reclaim and reports usage before and after', async () => {
    await fakeSandbox(m, 'sb1');
    const dir = m.sandboxPaths('sb1').unified;
    expect(await m.reclaim('sb1')).toEqual({ beforeBytes: 1048576, afterBytes: 1048576 });
    expect(await read(path.join(dir, 'memory.reclaim'))).toBe('1048576');
    await m.reclaim('sb1', 4096);
    expect(await read(path.join(dir, 'memory.reclaim'))).toBe('4096');
    await unlink(path.join(dir, 'memory.reclaim'));
    await expect(m.reclaim('sb1')).rejects.toMatchObject({ kind: 'Unimplemented' });
    await expect(m.reclaim('gone')).rejects.toMatchObject({ kind: 'NotFound' });
  });

  it('remove takes child cgroups first, is safe twice; removeInstance refuses while sandboxes remain', async () => {
    await fakeSandbox(m, 'sb1');
    await put(path.join(m.sandboxPaths('sb1').unified, 'inner'), CGROUP_FILES(''));
    await expect(m.removeInstance()).rejects.toMatchObject({ kind: 'FailedPrecondition' });
    await dropInterfaceFiles(m.sandboxPaths('sb1').unified);
    await m.remove('sb1');
    expect(await exists(m.sandboxPaths('sb1').unified)).toBe(false);
    await m.remove('sb1');
    expect(await m.list()).toEqual([]);
    await dropInterfaceFiles(m.parents.unified);
    await m.removeInstance();
    expect(await exists(m.parents.unified)).toBe(false);
    await m.removeInstance();
    // The daemon's own cgroup and its leaf stay.
    expect(await exists(path.join(ownDir, DAEMON_LEAF))).toBe(true);
  });
  it('setIo writes io.weight ("default N") and io.max with every key (max where unlimited); a later call removes limits it leaves out', async () => {
    await fakeSandbox(m, 'sb1');
    const dir = m.sandboxPaths('sb1').unified;
    await put(dir, { 'io.weight': 'default 100\n', 'io.max': '', 'io.stat': '' });
    const dev = { major: 7, minor: 3 };
    await m.setIo('sb1', { weight: 250, readBps: null, writeBps: 1048576, readIops: null, writeIops: 100 }, dev);
    expect(await read(path.join(dir, 'io.weight'))).toBe('default 250');
    expect(await read(path.join(dir, 'io.max'))).toBe('7:3 rbps=max wbps=1048576 riops=max wiops=100');
    await m.setIo('sb1', { weight: null, readBps: null, writeBps: null, readIops: null, writeIops: null }, dev);
    expect(await read(path.join(dir, 'io.weight'))).toBe('default 100');
    expect(await read(path.join(dir, 'io.max'))).toBe('7:3 rbps=max wbps=max riops=max wiops=max');
    await expect(m.setIo('gone', { weight: 1, readBps: null, writeBps: null, readIops: null, writeIops: null }, dev)).rejects.toMatchObject({ kind: 'NotFound' });
  });

  it('setIo without the io controller (no io.max) refuses limits with FailedPrecondition, and skips a weight quietly', async () => {
    await fakeSandbox(m, 'sb1');
    const dev = { major: 7, minor: 3 };
    await m.setIo('sb1', { weight: 300, readBps: null, writeBps: null, readIops: null, writeIops: null }, dev);
    expect(await exists(path.join(m.sandboxPaths('sb1').unified, 'io.weight'))).toBe(false);
    await expect(m.setIo('sb1', { weight: null, readBps: 4096, readIops: null, writeBps: null, writeIops: null }, dev)).rejects.toMatchObject({ kind: 'FailedPrecondition' });
  });

  it('ioSupport: io.max enforced for buffered writes too; io.weight without iocost or BFQ says it has no effect, with iocost it is enforced', async () => {
    const dev = { major: 7, minor: 3 };
    await put(m.parents.unified, { 'cgroup.controllers': 'cpu io memory pids\n', 'io.weight': 'default 100\n', 'io.max': '' });
    const s = await m.ioSupport(dev);
    expect(s).toMatchObject({ weightFile: 'io.weight', weightEnforced: false, limitFile: 'io.max', limitEnforced: true, bufferedWritesLimited: true });
    expect(s.detail).toMatch(/has no effect: 7:3 has scheduler .*not bfq, and iocost is not enabled/);
    await put(root, { 'io.cost.qos': '7:3 enable=1 ctrl=auto rpct=0.00 rlat=250000 wpct=0.00 wlat=250000 min=1.00 max=10000.00\n' });
    expect(await m.ioSupport(dev)).toMatchObject({ weightEnforced: true });
    expect((await m.ioSupport(null)).limitEnforced).toBe(false);
    await put(m.parents.unified, { 'cgroup.controllers': 'cpu memory pids\n' });
    expect((await m.ioSupport(dev)).detail).toMatch(/without the io controller/);
  });

  it('ioCounters reads io.stat for the device', async () => {
    await fakeSandbox(m, 'sb1');
    await put(m.sandboxPaths('sb1').unified, { 'io.stat': '8:0 rbytes=1 wbytes=2 rios=3 wios=4\n7:3 rbytes=4096 wbytes=1048576 rios=1 wios=256 dbytes=0 dios=0\n' });
    expect(await m.ioCounters('sb1', { major: 7, minor: 3 })).toEqual({ readBytes: 4096, writeBytes: 1048576, readIos: 1, writeIos: 256 });
    expect(await m.ioCounters('sb1', { major: 9, minor: 9 })).toEqual({ readBytes: 0, writeBytes: 0, readIos: 0, writeIos: 0 });
  });
});
