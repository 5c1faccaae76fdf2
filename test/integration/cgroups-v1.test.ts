/**
 * The v1 manager against the real cgroup v1 hierarchies of this host (root only).
 *
 * The test plays runc: it mkdirs each sandbox cgroup under the instance parent, writes
 * a limit and moves a process it started into every hierarchy. Everything it creates
 * lives under `dsec-it<pid>a` / `dsec-it<pid>b` inside this process's own cgroups and
 * is removed in afterAll, also after a failure; only processes this test started are
 * ever signalled (the sandbox cgroups hold nothing else).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { detectCgroups, type CgroupManager } from '../../daemon/host/cgroups/index.js';
import { rmdirCgroupTree } from '../../daemon/host/cgroups/procfs.js';

const MiB = 1 << 20;
const A = `it${process.pid}a`;
const B = `it${process.pid}b`;

function skipReason(): string | null {
  if (process.getuid?.() !== 0) return 'needs root to create cgroups';
  const v1 = readFileSync('/proc/self/mountinfo', 'utf8').split('\n')
    .some((l) => / - cgroup /.test(l) && l.split(' ')[4]?.startsWith('/sys/fs/cgroup/'));
  if (!v1) return 'host has no cgroup v1 hierarchies under /sys/fs/cgroup (v2 is covered by test/unit/cgroups-v2.test.ts)';
  return null;
}
const SKIP = skipReason();
const PYTHON = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

let a: CgroupManager;
let b: CgroupManager;
let tmp: string;
const children: ChildProcess[] = [];

const unique = (paths: Record<string, string>) => [...new Set(Object.values(paths))];
const isDir = (p: string) => stat(p).then((s) => s.isDirectory(), () => false);
const procState = (pid: number) => readFileSync(`/proc/${pid}/stat`, 'utf8').replace(/^.*\) /s, '')[0];

/** What runc does at create: mkdir the sandbox cgroup everywhere, seed cpuset, apply the memory limit. */
async function runcCreate(m: CgroupManager, id: string, memoryLimit?: number) {
  for (const dir of unique(m.sandboxPaths(id))) {
    await mkdir(dir);
    for (const f of ['cpuset.cpus', 'cpuset.mems']) {
      if (!existsSync(path.join(dir, f))) continue;
      await writeFile(path.join(dir, f), (await readFile(path.join(path.dirname(dir), f), 'utf8')).trim());
    }
  }
  if (memoryLimit !== undefined) await writeFile(path.join(m.sandboxPaths(id).memory, 'memory.limit_in_bytes'), String(memoryLimit));
}

/** Starts `script` under sh, moves it into every hierarchy of sandbox `id`, then lets it run. */
async function runInside(m: CgroupManager, id: string, script: string) {
  const child = spawn('sh', ['-c', `read _ && ${script}`], { stdio: ['pipe', 'ignore', 'pipe'] });
  children.push(child);
  let stderr = '';
  child.stderr!.on('data', (d) => { stderr += String(d); });
  const exit = new Promise<{ code: number | null; signal: NodeJS.Signals | null; stderr: string }>((r) =>
    child.on('exit', (code, signal) => r({ code, signal, stderr })));
  for (const dir of unique(m.sandboxPaths(id))) await writeFile(path.join(dir, 'cgroup.procs'), String(child.pid));
  child.stdin!.end('\n');
  return { child, pid: child.pid!, exit };
}

async function waitFor(check: () => boolean | Promise<boolean>, what: string) {
  for (let i = 0; i < 2000; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 5));
  }
  throw new Error(`timed out waiting for ${what}`);
}

describe(`cgroup v1 on this host${SKIP ? ` (skipped: ${SKIP})` : ''}`, () => {
  beforeAll(async () => {
    if (SKIP) return;
    tmp = await mkdtemp(path.join(os.tmpdir(), 'dsec-cg1-'));
    a = await detectCgroups({ instance: A });
    b = await detectCgroups({ instance: B });
  });

  afterAll(async () => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    for (const m of [a, b]) {
      if (!m) continue;
      for (const id of await m.list().catch(() => [] as string[])) {
        await m.thaw(id).catch(() => undefined);
        await m.killAll(id).catch((e) => console.error(`cleanup killAll ${id}:`, e));
        await m.remove(id).catch((e) => console.error(`cleanup remove ${id}:`, e));
      }
      await m.removeInstance().catch((e) => console.error('cleanup removeInstance:', e));
      // Last resort: whatever is left under our own instance parents.
      for (const p of unique(m.parents)) await rmdirCgroupTree(p).catch((e) => console.error(`cleanup ${p}:`, e));
    }
    if (tmp) await rm(tmp, { recursive: true, force: true });
  });

  it.skipIf(!!SKIP)('detects v1 and init creates the instance parent under the own cgroup in every hierarchy', async () => {
    expect(a.version).toBe(1);
    const own = Object.fromEntries(readFileSync('/proc/self/cgroup', 'utf8').trim().split('\n').map((l) => {
      const [, ctl, p] = l.match(/^\d+:([^:]*):(.*)$/)!;
      return [ctl === '' ? 'unified' : ctl.replace(/^name=/, ''), p];
    }));
    expect(a.parents.memory).toBe(path.join('/sys/fs/cgroup/memory', own.memory, `dsec-${A}`));
    expect(Object.keys(a.parents)).toEqual(expect.arrayContaining(['memory', 'freezer', 'pids', 'cpuacct', 'systemd', 'unified']));
    await a.init();
    await a.init(); // idempotent
    for (const [key, parent] of Object.entries(a.parents)) {
      expect(await isDir(parent), key).toBe(true);
      expect(path.basename(parent)).toBe(`dsec-${A}`);
      // The parent's parent is this process's own cgroup in that hierarchy.
      const ownKey = Object.keys(own).find((k) => k.split(',').includes(key))!;
      expect(path.dirname(parent).endsWith(own[ownKey] === '/' ? '' : own[ownKey]), key).toBe(true);
    }
    expect(a.runtimePath('main')).toBe(`dsec-${A}/main`);
    expect(await a.list()).toEqual([]);
  });

  let main: Awaited<ReturnType<typeof runInside>>;

  it.skipIf(!!SKIP)('a sandbox made like runc makes is listed and reports pids and stats', async () => {
    await runcCreate(a, 'main', 256 * MiB);
    main = await runInside(a, 'main', 'exec sleep 100');
    await waitFor(() => readFileSync(`/proc/${main.pid}/comm`, 'utf8').trim() === 'sleep', 'sleep to exec');
    expect(await a.list()).toEqual(['main']);
    expect(await a.exists('main')).toBe(true);
    expect(await a.exists('nope')).toBe(false);
    expect(await a.pids('main')).toEqual([main.pid]);
    expect(await a.pids('nope')).toEqual([]);
    const s = await a.stats('main');
    expect(s.memoryBytes).toBeGreaterThan(0);
    expect(s.memoryLimitBytes).toBe(256 * MiB);
    expect(s.pidsCurrent).toBeGreaterThanOrEqual(1);
    expect(s.pidsLimit).toBeNull();
    expect(s.cpuUsageNs).toBeGreaterThan(0);
    expect(s.frozen).toBe(false);
    expect(s.oomKills).toBe(0);
    await expect(a.stats('nope')).rejects.toMatchObject({ kind: 'NotFound' });
  });

  it.skipIf(!!SKIP)('freeze stops the process and thaw resumes it', async () => {
    const state = path.join(a.sandboxPaths('main').freezer, 'freezer.state');
    await a.freeze('main');
    expect((await readFile(state, 'utf8')).trim()).toBe('FROZEN');
    expect((await a.stats('main')).frozen).toBe(true);
    // Frozen tasks sleep uninterruptibly: this kernel shows 'D' (older ones 'T'/'D').
    expect(['D', 'T']).toContain(procState(main.pid));
    await a.freeze('main'); // safe twice
    await a.thaw('main');
    expect((await readFile(state, 'utf8')).trim()).toBe('THAWED');
    expect((await a.stats('main')).frozen).toBe(false);
    await waitFor(() => procState(main.pid) === 'S', 'sleep to be sleeping again');
    await expect(a.freeze('nope')).rejects.toMatchObject({ kind: 'NotFound' });
  });

  it.skipIf(!!SKIP)('two instances never see each other\'s sandboxes', async () => {
    await b.init();
    await runcCreate(b, 'other');
    await runcCreate(b, 'main'); // same id as in A, different instance
    expect(await a.list()).toEqual(['main']);
    expect(await b.list()).toEqual(['main', 'other']);
    expect(await a.exists('other')).toBe(false);
    expect(await b.pids('main')).toEqual([]);
    await b.remove('main');
    expect(await a.pids('main')).toEqual([main.pid]);
    await b.remove('other');
    await b.removeInstance();
    for (const p of unique(b.parents)) expect(await isDir(p)).toBe(false);
    expect(await a.list()).toEqual(['main']);
  });

  it.skipIf(!!SKIP)('oomKills counts an OOM kill in the sandbox memory cgroup', async () => {
    await runcCreate(a, 'oom', 32 * MiB);
    expect(await a.oomKills('oom')).toBe(0);
    // bytes * n touches every page, so the 128 MiB are really charged.
    const hog = await runInside(a, 'oom', `exec ${PYTHON} -c "b = b'x' * (128 << 20)"`);
    const r = await hog.exit;
    expect(r.signal, r.stderr).toBe('SIGKILL');
    expect(await a.oomKills('oom')).toBeGreaterThanOrEqual(1);
    expect((await a.stats('oom')).oomKills).toBe(await a.oomKills('oom'));
    // The manager keeps memory.oom_control open. A cgroup removed and made anew behind its
    // back (not through remove()) leaves that fd on the removed one, which reads ENODEV:
    // the new cgroup's counter is read, not the old one's.
    const mem = a.sandboxPaths('oom').memory;
    for (const dir of unique(a.sandboxPaths('oom'))) await rmdirCgroupTree(dir);
    expect(await a.oomKills('oom')).toBe(0);
    await runcCreate(a, 'oom', 32 * MiB);
    expect(existsSync(path.join(mem, 'memory.oom_control'))).toBe(true);
    expect(await a.oomKills('oom')).toBe(0);
    const again = await runInside(a, 'oom', `exec ${PYTHON} -c "b = b'x' * (128 << 20)"`);
    expect((await again.exit).signal).toBe('SIGKILL');
    expect(await a.oomKills('oom')).toBe(1);
  });

  it.skipIf(!!SKIP)('reclaim drops the page cache a sandbox process created', async () => {
    await runcCreate(a, 'cache');
    const file = path.join(tmp, 'cache-50m');
    // The writer's memcg is charged for the page cache; fsync so the pages are clean and reclaimable.
    const job = await runInside(a, 'cache', `dd if=/dev/zero of=${file} bs=1M count=50 conv=fsync status=none && cat ${file} > /dev/null`);
    const r = await job.exit;
    expect(r.code, r.stderr).toBe(0);
    const s = await a.stats('cache');
    expect(s.memoryCacheBytes).toBeGreaterThan(40 * MiB);
    const { beforeBytes, afterBytes } = await a.reclaim('cache');
    expect(beforeBytes).toBeGreaterThan(40 * MiB);
    expect(afterBytes).toBeLessThan(beforeBytes);
    expect(beforeBytes - afterBytes).toBeGreaterThan(30 * MiB);
    expect((await a.stats('cache')).memoryCacheBytes).toBeLessThan(10 * MiB);
    await expect(a.reclaim('nope')).rejects.toMatchObject({ kind: 'NotFound' });
  });

  it.skipIf(!!SKIP)('memcgPath names the sandbox\'s memory cgroup from the memory hierarchy\'s mount (what a DAMON memcg filter takes)', async () => {
    const p = a.memcgPath('main')!;
    expect(p).toMatch(/^\/.*\/main$/);
    const mount = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' '))
      .find((f) => f[f.indexOf('-') + 1] === 'cgroup' && f[f.indexOf('-') + 3]?.split(',').includes('memory'))![4];
    expect(path.join(mount, p)).toBe(a.sandboxPaths('main').memory);
    expect(await isDir(path.join(mount, p))).toBe(true);
  });

  it.skipIf(!!SKIP)('setMemoryLimit sets, raises past memsw, and clears the limit', async () => {
    await a.setMemoryLimit('main', 64 * MiB);
    expect((await a.stats('main')).memoryLimitBytes).toBe(64 * MiB);
    const memsw = path.join(a.sandboxPaths('main').memory, 'memory.memsw.limit_in_bytes');
    if (existsSync(memsw)) {
      await writeFile(memsw, String(96 * MiB));
      await a.setMemoryLimit('main', 128 * MiB); // above memsw: raised first
      expect((await a.stats('main')).memoryLimitBytes).toBe(128 * MiB);
      expect(Number((await readFile(memsw, 'utf8')).trim())).toBe(128 * MiB);
    }
    await a.setMemoryLimit('main', null);
    expect((await a.stats('main')).memoryLimitBytes).toBeNull();
    await expect(a.setMemoryLimit('main', 1.5)).rejects.toMatchObject({ kind: 'InvalidArgument' });
    await expect(a.setMemoryLimit('nope', MiB)).rejects.toMatchObject({ kind: 'NotFound' });
  });

  it.skipIf(!!SKIP)('killAll kills every process, even in a frozen sandbox', async () => {
    const second = await runInside(a, 'main', 'exec sleep 100');
    expect((await a.pids('main')).sort()).toEqual([main.pid, second.pid].sort());
    await a.freeze('main');
    await a.killAll('main');
    expect(await a.pids('main')).toEqual([]);
    expect((await main.exit).signal).toBe('SIGKILL');
    expect((await second.exit).signal).toBe('SIGKILL');
    await a.killAll('main'); // nothing left: returns at once
    await a.killAll('nope');
  });

  it.skipIf(!!SKIP)('remove deletes the sandbox cgroup in every hierarchy and is safe twice', async () => {
    await expect(a.removeInstance()).rejects.toMatchObject({ kind: 'FailedPrecondition' });
    for (const id of ['main', 'oom', 'cache']) {
      await a.remove(id);
      for (const [key, dir] of Object.entries(a.sandboxPaths(id))) expect(await isDir(dir), `${id} ${key}`).toBe(false);
      expect(await a.exists(id)).toBe(false);
      await a.remove(id);
    }
    await expect(a.stats('main')).rejects.toMatchObject({ kind: 'NotFound' });
    expect(await a.list()).toEqual([]);
  });

  it.skipIf(!!SKIP)('removeInstance removes the parents and is safe twice', async () => {
    await a.removeInstance();
    for (const p of unique(a.parents)) expect(await isDir(p)).toBe(false);
    await a.removeInstance();
  });
});
