/**
 * `npm run bench` (bench/all.ts): every DESIGN.md §6 target measured beside its peer in one
 * run, on this host, with the default security profile and network mode. Writes
 * bench/results-all.json and the generated table of docs/BENCHMARKS.md (between the
 * `bench:all` markers). Sections (`--only` picks some):
 *
 *   burst     N container creations at concurrency C, each followed by its first exec of
 *             `true`: ready/s (N / wall time of the burst) and p50/p99 create→first exec,
 *             with the warm pool empty (no `[pool]`) and pre-filled (`[pool]` of N shells,
 *             filled before the burst). Peer: `podman run -d` + `podman exec true` (fewer:
 *             --podman-n, reported per operation). Then every sandbox is destroyed (bulk).
 *   exec      sequential `true` execs through the API (POST .../exec, and the exec channel
 *             WebSocket in alternating blocks), p50/p99, each p50 over the host's own spawn
 *             of /bin/true measured in the same minutes; peers `runc exec` into the same
 *             dsec sandbox (its runtime root) and `podman exec` into a podman container.
 *   density   idle sandboxes created up to --density-n or until host memory (MemAvailable
 *             of /proc/meminfo) fell by --density-budget-mib: host memory per sandbox from
 *             that drop, and from the cgroups' charge (memory.usage_in_bytes), plus dsecd's
 *             RSS growth. Peer: podman containers (`sleep`), by the same MemAvailable drop.
 *   pause     pause and resume of idle sandboxes through the API, p50/p99, and the bytes
 *             pause reported reclaimed. Peer: `podman pause` / `podman unpause`.
 *   fncall    bench/fncall.js (`/bin/true` on the fncall tier vs bwrap per call) at
 *             concurrency 8, its JSON taken as is.
 *   status    GET /v1/sandboxes/{id} p50/p99 (the API's overhead on a call that does no
 *             work); peers `runc state` and `podman inspect`.
 *   io        bench/io-neighbour.ts: a neighbour's exec writing a small file (fsynced),
 *             p50/p99, while another sandbox writes as fast as it can (buffered, direct),
 *             with and without io_weight/io_max; peer: two podman containers.
 *   e2b       bench/e2b.ts: the unmodified `e2b` SDK's commands.run('true') and
 *             Sandbox.create('base') through the E2B front, against dsec's own /v1 exec and
 *             create on the same TCP door, same sandbox image, p50/p99.
 *
 * Usage: node dist/bench/all.js [--quick] [--only burst,exec,...] [--n 1000] [--podman-n 100]
 *   [--concurrency 16] [--density-n 5000] [--density-budget-mib 10240] [--no-podman]
 *   [--no-doc] [--cpu-prof DIR] [--merge] [--note TEXT]
 * --quick: N 100, density 100, podman 20, fewer repeats (a functional check, not numbers
 * to publish). The published pair, bench/results-all.json and the table in
 * docs/BENCHMARKS.md, is written only by a run that is neither --quick nor --no-doc; other
 * runs write their JSON to bench/results-all.local.json (not tracked). Each run also
 * records how fast the host spawns a process at its start and end
 * (host.spawn_true_ms_*): runs on different days differ several-fold on a shared VM.
 * --cpu-prof DIR: the dsecd of the burst runs under `node --cpu-prof` (profiles in DIR).
 */
import { runRemote } from './remote.js';
import { readFileSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { execa } from 'execa';
import { prepareBusyboxTree } from '../daemon/image/builtin.js';
import { repoRoot } from '../daemon/startup/host.js';
import { spawnNative } from '../daemon/host/spawn.js';
import { BENCH_POOL, BENCH_RANGE, percentile, tempDaemon, type TempDaemon } from './lib.js';
import { runIoNeighbour } from './io-neighbour.js';
import { runE2b } from './e2b.js';

const r2 = (x: number) => Math.round(x * 100) / 100;

/** Limits of every benchmark sandbox: 64 MiB, 64 pids (as the density and crash tests), the default 1 core. */
/**
 * Defaults of the bench's sandboxes: 64 MiB, 64 pids, a 1 GiB writable-layer quota (a
 * burst of 1,000 then fits admission's default disk_overcommit of 100 on any store of
 * 10 GiB or more; the quota's size costs nothing at create).
 */
const DEFAULTS = '[defaults]\nmemory_bytes = 67108864\npids = 64\ndisk_bytes = 1073741824\n';
/** podman's flags for this host: runc, no network, the host's lower rlimits (runc refuses podman's defaults here). */
const PODMAN = ['--runtime', 'runc'];
const PODMAN_RUN = ['--network', 'none', '--ulimit', 'nofile=1024:1024', '--ulimit', 'nproc=1024:1024'];
/**
 * A dsecd on runc instead of the default (crun where installed): the pool-empty burst's
 * control, and the daemons whose peer is `runc exec` / `runc state` on dsecd's own
 * runtime root (<root>/runtime/runc).
 */
const RUNC = '[runtime]\nname = "runc"\n';

/** p50/p99 of samples in ms, rounded. */
function pct(xs: number[]): { p50: number; p99: number; n: number } {
  return { p50: r2(percentile(xs, 50)), p99: r2(percentile(xs, 99)), n: xs.length };
}

/** Runs `fn(i)` for i in [0, n) with at most `c` in flight; returns wall seconds. */
async function pool(n: number, c: number, fn: (i: number) => Promise<void>): Promise<number> {
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: Math.min(c, n) }, async () => {
    while (next < n) await fn(next++);
  }));
  return (performance.now() - t0) / 1000;
}

/**
 * How fast this host starts a process right now: p50 of 200 sequential posix_spawn +
 * wait of `/bin/true`, ms. Process creation (fork, exec, page faults) is what every peer
 * and most of dsec's own paths are made of, and on a shared VM it varies several-fold
 * from one day to the next, so it is recorded with each run to compare runs by.
 */
async function spawnTrueMs(): Promise<number> {
  const xs: number[] = [];
  for (let i = 0; i < 200; i++) {
    const s = performance.now();
    await spawnNative('/bin/true', []);
    xs.push(performance.now() - s);
  }
  return r2(percentile(xs, 50));
}

/** Bytes of the allocated objects of slab cache `name` (/proc/slabinfo active_objs × objsize), or null when unreadable. */
function slabActiveBytes(name: string): number | null {
  try {
    const f = readFileSync('/proc/slabinfo', 'utf8').split('\n').find((l) => l.startsWith(`${name} `))?.split(/\s+/);
    return f ? Number(f[1]) * Number(f[3]) : null;
  } catch {
    return null;
  }
}

/**
 * Superblocks one sandbox of `d` adds to the host: devices in its /proc/self/mountinfo
 * that no other mount of this process's namespace has (its overlay root is mounted here
 * too; proc, sysfs, tmpfs, … are not).
 */
async function sandboxSuperblocks(d: TempDaemon): Promise<number> {
  const sb = (await d.client.listSandboxes({ selector: 'bench=density' }))[0];
  const text = (await d.client.exec(sb.id, { argv: ['cat', '/proc/self/mountinfo'] })).stdout.toString();
  const rootfs = path.join(d.root, 'sandboxes', sb.id, 'rootfs');
  const host = new Set(readFileSync('/proc/self/mountinfo', 'utf8').trim().split('\n').map((l) => l.split(' ')).filter((f) => f[4] !== rootfs).map((f) => f[2]));
  return new Set(text.trim().split('\n').map((l) => l.split(' ')[2]).filter((dev) => !host.has(dev))).size;
}

/** MemAvailable of /proc/meminfo, bytes. */
function memAvailable(): number {
  return Number(/^MemAvailable:\s+(\d+) kB/m.exec(readFileSync('/proc/meminfo', 'utf8'))![1]) * 1024;
}

/** Resident set of a process, bytes (VmRSS of /proc/<pid>/status). */
/**
 * CPU time a process has used, user + system, ms (`/proc/PID/stat` utime and stime, in
 * clock ticks of 10 ms: USER_HZ is 100 on Linux). Differences of it give a process's CPU
 * per operation, which a busy shared host changes far less than wall-clock latency.
 */
function cpuMs(pid: number | undefined): number {
  if (!pid) return NaN;
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(f[11]) + Number(f[12])) * 10;
}

function rss(pid: number | undefined): number {
  if (!pid) return NaN;
  return Number(/^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? NaN) * 1024;
}

/**
 * Memory a podman container holds on the host, bytes: its conmon's RSS plus the charge of
 * the container's memory cgroup (memory.usage_in_bytes on v1, memory.current on v2).
 */
async function podmanContainerBytes(name: string): Promise<number> {
  const r = await execa('podman', ['inspect', '--format', '{{.State.ConmonPid}} {{.State.Pid}}', name]);
  const [conmon, pid] = String(r.stdout).trim().split(' ').map(Number);
  let cg = 0;
  for (const line of readFileSync(`/proc/${pid}/cgroup`, 'utf8').trim().split('\n')) {
    const [, ctrls, p] = line.split(':');
    const file = ctrls.split(',').includes('memory') ? `/sys/fs/cgroup/memory${p}/memory.usage_in_bytes` : ctrls === '' ? `/sys/fs/cgroup${p}/memory.current` : null;
    if (!file) continue;
    try {
      cg = Number(readFileSync(file, 'utf8').trim());
      if (ctrls !== '') break;
    } catch { /* not this hierarchy */ }
  }
  return rss(conmon) + cg;
}

/** A benchmark dsecd with the bench's pool and defaults; `extra` TOML appended. */
function daemon(name: string, extra = '', nodeArgs?: string[]): Promise<TempDaemon> {
  return tempDaemon(`dsec-bench-${name}-`, BENCH_POOL, `${DEFAULTS}${extra}`, { rangeSize: BENCH_RANGE, ...(nodeArgs ? { nodeArgs } : {}) });
}

/** Waits until the warm pool has `n` shells ready (polls host info every 250 ms). */
async function poolReady(d: TempDaemon, n: number): Promise<void> {
  for (;;) {
    const p = (await d.client.hostInfo()).warm_pools[0];
    if (p && p.ready >= n) return;
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** Destroys every sandbox of `d` in one bulk call; returns per-sandbox ms (wall / n) and the wall seconds. */
async function destroyAll(d: TempDaemon, selector: string): Promise<{ per_sandbox_ms: number; wall_s: number; n: number }> {
  const t0 = performance.now();
  const res = await d.client.bulk({ selector, action: 'destroy' });
  const wall = (performance.now() - t0) / 1000;
  const bad = res.filter((x) => !x.ok);
  if (bad.length) throw new Error(`${bad.length} destroys failed: ${bad[0].error?.message}`);
  return { per_sandbox_ms: r2((wall * 1000) / Math.max(1, res.length)), wall_s: r2(wall), n: res.length };
}

interface Opts {
  quick: boolean; only?: string; n: string; podmanN: string; concurrency: string; podman: boolean; doc: boolean; cpuProf?: string;
  densityN: string; densityBudgetMib: string; densityRuntime?: string;
}

/** One burst through the API: creates then first exec; ready/s and latencies. */
async function dsecBurst(d: TempDaemon, n: number, c: number, label: string) {
  const lat: number[] = [];
  const cpu0 = cpuMs(d.pid);
  const wall = await pool(n, c, async () => {
    const s = performance.now();
    const sb = await d.client.createSandbox({ image: 'busybox', labels: { bench: label } });
    const r = await d.client.exec(sb.id, { argv: ['true'] });
    if (r.exit_code !== 0) throw new Error(`exec true failed in ${sb.id}`);
    lat.push(performance.now() - s);
  });
  return { n, concurrency: c, ready_per_s: r2(n / wall), create_to_first_exec_ms: pct(lat), wall_s: r2(wall), dsecd_cpu_ms_per_sandbox: r2((cpuMs(d.pid) - cpu0) / n) };
}

async function burst(o: Opts, tree: string, res: Record<string, unknown>): Promise<void> {
  const n = Number(o.n), c = Number(o.concurrency);
  const prof = o.cpuProf ? ['--cpu-prof', `--cpu-prof-dir=${path.resolve(o.cpuProf)}`] : undefined;
  // Pool empty: no [pool], every create runs the runtime.
  let d = await daemon('burst', '', prof);
  const out: Record<string, unknown> = {};
  try {
    const w = await d.client.createSandbox({ image: 'busybox' });
    await d.client.deleteSandbox(w.id, { force: true });
    out.pool_empty = await dsecBurst(d, n, c, 'empty');
    process.stderr.write(`burst, pool empty: ${JSON.stringify(out.pool_empty)}\n`);
    out.destroy = await destroyAll(d, 'bench=empty');
    out.dsecd_rss_bytes = rss(d.pid);
    out.runtime = (await d.client.hostInfo()).runtime;
  } finally {
    await d.stop();
  }
  // The same burst on runc (the default until crun could run on this hybrid host): the
  // runtime's share of a cold create, measured in the same run.
  d = await daemon('burst-runc', RUNC);
  try {
    out.pool_empty_runc = await dsecBurst(d, n, c, 'empty-runc');
    process.stderr.write(`burst, pool empty, runc: ${JSON.stringify(out.pool_empty_runc)}\n`);
    await destroyAll(d, 'bench=empty-runc');
  } finally {
    await d.stop();
  }
  // Pool pre-filled with N shells before the burst.
  d = await daemon('pool', `[pool]\nfill_concurrency = 2\n[[pool.entries]]\nimage = "busybox"\nsize = ${n}\n`, prof);
  try {
    const f0 = performance.now();
    await poolReady(d, n);
    const fill = (performance.now() - f0) / 1000;
    const r = await dsecBurst(d, n, c, 'pool');
    const stats = (await d.client.hostInfo()).warm_pools[0];
    out.pool_prefilled = { ...r, pool_fill_s: r2(fill), claimed: stats.claimed, misses: stats.misses };
    process.stderr.write(`burst, pool pre-filled: ${JSON.stringify(out.pool_prefilled)}\n`);
    await destroyAll(d, 'bench=pool');
  } finally {
    await d.stop();
  }
  if (o.podman) {
    const pn = Number(o.podmanN);
    const names: string[] = [];
    const lat: number[] = [];
    const tag = `dsec-bench-${process.pid}`;
    try {
      const wall = await pool(pn, c, async (i) => {
        const name = `${tag}-${i}`;
        names.push(name);
        const s = performance.now();
        await execa('podman', [...PODMAN, 'run', '-d', '--name', name, ...PODMAN_RUN, '--rootfs', tree, '/bin/sleep', '3600']);
        await execa('podman', ['exec', name, '/bin/true']);
        lat.push(performance.now() - s);
      });
      out.podman = { n: pn, concurrency: c, ready_per_s: r2(pn / wall), create_to_first_exec_ms: pct(lat), wall_s: r2(wall) };
      const t0 = performance.now();
      await execa('podman', ['rm', '-f', '-t', '0', ...names], { reject: false });
      (out.podman as Record<string, unknown>).destroy_per_container_ms = r2((performance.now() - t0) / pn);
      names.length = 0;
    } finally {
      if (names.length) await execa('podman', ['rm', '-f', '-t', '0', ...names], { reject: false });
    }
    process.stderr.write(`burst, podman: ${JSON.stringify(out.podman)}\n`);
  }
  res.burst = out;
}

async function exec(o: Opts, tree: string, res: Record<string, unknown>): Promise<void> {
  const k = o.quick ? 100 : 1000, kp = o.quick ? 20 : 100;
  const d = await daemon('exec', RUNC);
  const out: Record<string, unknown> = {};
  try {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    const channel = d.client.execChannel(sb.id);
    await channel.opened;
    const via = { api: () => d.client.exec(sb.id, { argv: ['true'] }), channel: () => channel.exec({ argv: ['true'] }) };
    // Warm-up: dsecd is a long-running daemon, and its first few thousand requests run in
    // V8's lower tiers (dsecd's CPU per channel exec fell from ~1.5 to ~0.8 ms over the
    // first 7,000 in a probe); what an agent loop meets is the warm daemon.
    const warm = o.quick ? 50 : 1000;
    for (let i = 0; i < warm; i++) await via.api();
    for (let i = 0; i < warm; i++) await via.channel();
    // POST .../exec and the exec channel in alternating blocks of 250, with the host's own
    // spawn of /bin/true measured before and after each pair of blocks: the three share the host's
    // moment, so their ratios hold on a host whose speed drifts.
    const lat = { api: [] as number[], channel: [] as number[] };
    const cpu = { api: 0, channel: 0 };
    const spawns: number[] = [await spawnTrueMs()];
    for (let done = 0; done < k; done += 250) {
      for (const how of ['api', 'channel'] as const) {
        const c0 = cpuMs(d.pid);
        for (let i = 0; i < Math.min(250, k - done); i++) {
          const s = performance.now();
          const r = await via[how]();
          lat[how].push(performance.now() - s);
          if (r.exit_code !== 0) throw new Error(`exec true (${how}) exited ${r.exit_code}`);
        }
        cpu[how] += cpuMs(d.pid) - c0;
      }
      spawns.push(await spawnTrueMs());
    }
    channel.close();
    out.dsec_api = pct(lat.api);
    out.dsecd_cpu_ms_per_exec = r2(cpu.api / k);
    out.dsec_channel = pct(lat.channel);
    out.dsecd_cpu_ms_per_exec_channel = r2(cpu.channel / k);
    const spawn = r2(percentile(spawns, 50));
    out.host_spawn_true_ms = spawn;
    out.api_over_host_spawn = r2(percentile(lat.api, 50) / spawn);
    out.channel_over_host_spawn = r2(percentile(lat.channel, 50) / spawn);
    // runc exec into the very same container, through dsecd's runtime root.
    const runc: number[] = [];
    const rroot = path.join(d.root, 'runtime', 'runc');
    for (let i = 0; i < kp; i++) {
      const s = performance.now();
      await execa('runc', ['--root', rroot, 'exec', sb.id, '/bin/true']);
      runc.push(performance.now() - s);
    }
    out.runc_exec = pct(runc);
  } finally {
    await d.stop();
  }
  if (o.podman) {
    const name = `dsec-bench-exec-${process.pid}`;
    await execa('podman', [...PODMAN, 'run', '-d', '--name', name, ...PODMAN_RUN, '--rootfs', tree, '/bin/sleep', '3600']);
    try {
      const pe: number[] = [];
      for (let i = 0; i < kp; i++) {
        const s = performance.now();
        await execa('podman', ['exec', name, '/bin/true']);
        pe.push(performance.now() - s);
      }
      out.podman_exec = pct(pe);
    } finally {
      await execa('podman', ['rm', '-f', '-t', '0', name], { reject: false });
    }
  }
  process.stderr.write(`exec: ${JSON.stringify(out)}\n`);
  res.exec = out;
}

async function density(o: Opts, tree: string, res: Record<string, unknown>): Promise<void> {
  const n = Number(o.densityN), budget = Number(o.densityBudgetMib) * 1024 * 1024, c = Number(o.concurrency);
  const out: Record<string, unknown> = {};
  // Admission counts CPU limits: by default 1,000 cores of limits per host core, so this
  // 2-core host admits 2,000 one-core sandboxes; the density run raises the ratio to fit n.
  const rt = o.densityRuntime ? `[runtime]\nname = "${o.densityRuntime}"\n` : '';
  const d = await daemon('density', `[admission]\ncpu_overcommit = ${Math.max(1000, Math.ceil((n + 100) / os.cpus().length))}\ndisk_overcommit = 100000\n${rt}`);
  try {
    const w = await d.client.createSandbox({ image: 'busybox' });
    await d.client.deleteSandbox(w.id, { force: true });
    const rss0 = rss(d.pid);
    const m0 = memAvailable();
    const k0 = slabActiveBytes('kmalloc-1k');
    let made = 0;
    let stop = false;
    await pool(n, c, async () => {
      if (stop) return;
      await d.client.createSandbox({ image: 'busybox', labels: { bench: 'density' } });
      made++;
      if (m0 - memAvailable() >= budget) stop = true;
    });
    await new Promise((r) => setTimeout(r, 2000)); // let the last agents settle
    const drop = m0 - memAvailable();
    const k1 = slabActiveBytes('kmalloc-1k');
    const stats = await d.client.stats();
    const charged = stats.sandboxes.reduce((s, x) => s + (x.memory_bytes ?? 0), 0);
    out.dsec = {
      sandboxes: made, budget_mib: Number(o.densityBudgetMib), runtime: (await d.client.hostInfo()).runtime.name, all_answer_exec: await (async () => {
        const list = await d.client.listSandboxes({ selector: 'bench=density' });
        let ok = 0;
        await pool(list.length, c, async (i) => { if ((await d.client.exec(list[i].id, { argv: ['true'] })).exit_code === 0) ok++; });
        return ok === list.length;
      })(),
      host_mem_per_sandbox_mib: r2(drop / made / 2 ** 20), cgroup_charge_per_sandbox_mib: r2(charged / made / 2 ** 20),
      dsecd_rss_growth_per_sandbox_kib: r2((rss(d.pid) - rss0) / made / 1024),
      accounted_per_sandbox_mib: r2((charged + rss(d.pid) - rss0) / made / 2 ** 20),
      // The kernel's per-memory-cgroup shrinker table (docs/BENCHMARKS.md "Density") is
      // kmalloc-1k objects; the superblocks a sandbox adds are the table's rows.
      kmalloc_1k_per_sandbox_kib: k0 === null || k1 === null ? null : r2((k1 - k0) / made / 1024),
      superblocks_per_sandbox: await sandboxSuperblocks(d),
    };
    await destroyAll(d, 'bench=density');
  } finally {
    await d.stop();
  }
  if (o.podman) {
    const pn = Math.min(n, Number(o.podmanN));
    const names: string[] = [];
    try {
      const m0 = memAvailable();
      await pool(pn, c, async (i) => {
        const name = `dsec-bench-dens-${process.pid}-${i}`;
        names.push(name);
        await execa('podman', [...PODMAN, 'run', '-d', '--name', name, ...PODMAN_RUN, '--rootfs', tree, '/bin/sleep', '3600']);
      });
      await new Promise((r) => setTimeout(r, 2000));
      const drop = m0 - memAvailable();
      let accounted = 0;
      for (const name of names) accounted += await podmanContainerBytes(name);
      out.podman = { containers: pn, host_mem_per_container_mib: r2(drop / pn / 2 ** 20), accounted_per_container_mib: r2(accounted / pn / 2 ** 20) };
    } finally {
      await execa('podman', ['rm', '-f', '-t', '0', ...names], { reject: false });
    }
  }
  process.stderr.write(`density: ${JSON.stringify(out)}\n`);
  res.density = out;
}

async function pause(o: Opts, tree: string, res: Record<string, unknown>): Promise<void> {
  const n = o.quick ? 20 : 100, pn = o.quick ? 5 : 20;
  const out: Record<string, unknown> = {};
  const d = await daemon('pause');
  try {
    const ids: string[] = [];
    for (let i = 0; i < n; i++) ids.push((await d.client.createSandbox({ image: 'busybox', labels: { bench: 'pause' } })).id);
    const p: number[] = [], r: number[] = [], reclaimed: number[] = [];
    for (const id of ids) {
      let s = performance.now();
      const pr = await d.client.pauseSandbox(id);
      p.push(performance.now() - s);
      reclaimed.push(pr.reclaim?.reclaimed_bytes ?? 0);
      s = performance.now();
      await d.client.resumeSandbox(id);
      r.push(performance.now() - s);
    }
    out.dsec = { pause_ms: pct(p), resume_ms: pct(r), reclaimed_kib_p50: r2(percentile(reclaimed, 50) / 1024) };
    await destroyAll(d, 'bench=pause');
  } finally {
    await d.stop();
  }
  if (o.podman) {
    const name = `dsec-bench-pause-${process.pid}`;
    await execa('podman', [...PODMAN, 'run', '-d', '--name', name, ...PODMAN_RUN, '--rootfs', tree, '/bin/sleep', '3600']);
    try {
      const p: number[] = [], r: number[] = [];
      for (let i = 0; i < pn; i++) {
        let s = performance.now();
        await execa('podman', ['pause', name]);
        p.push(performance.now() - s);
        s = performance.now();
        await execa('podman', ['unpause', name]);
        r.push(performance.now() - s);
      }
      out.podman = { pause_ms: pct(p), resume_ms: pct(r) };
    } finally {
      await execa('podman', ['rm', '-f', '-t', '0', name], { reject: false });
    }
  }
  process.stderr.write(`pause: ${JSON.stringify(out)}\n`);
  res.pause = out;
}

async function fncall(o: Opts, res: Record<string, unknown>): Promise<void> {
  const args = [path.join(repoRoot(), 'dist/bench/fncall.js'), '--no-python', '--no-podman', '--no-results', '--concurrency', '8',
    '--calls', o.quick ? '500' : '4000', '--peer-calls', o.quick ? '100' : '400'];
  const r = await execa(process.execPath, args, { stderr: 'inherit' });
  const j = JSON.parse(String(r.stdout)) as { true: { dsec_run: { c8: { calls_per_s: number } }; dsec_channel: { c8: { calls_per_s: number } }; dsec_batch: { c8: { calls_per_s: number } }; bwrap: { c8: { calls_per_s: number } } } };
  res.fncall = {
    concurrency: 8, dsec_run_calls_per_s: j.true.dsec_run.c8.calls_per_s, dsec_channel_calls_per_s: j.true.dsec_channel.c8.calls_per_s, dsec_batch_calls_per_s: j.true.dsec_batch.c8.calls_per_s,
    bwrap_calls_per_s: j.true.bwrap.c8.calls_per_s,
  };
  process.stderr.write(`fncall: ${JSON.stringify(res.fncall)}\n`);
}

async function status(o: Opts, tree: string, res: Record<string, unknown>): Promise<void> {
  const k = o.quick ? 200 : 2000, kp = o.quick ? 20 : 100;
  const out: Record<string, unknown> = {};
  const d = await daemon('status', RUNC);
  try {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    for (let i = 0; i < 100; i++) await d.client.getSandbox(sb.id);
    const api: number[] = [], ver: number[] = [], runc: number[] = [];
    for (let i = 0; i < k; i++) {
      let s = performance.now();
      await d.client.getSandbox(sb.id);
      api.push(performance.now() - s);
      s = performance.now();
      await d.client.version();
      ver.push(performance.now() - s);
    }
    for (let i = 0; i < kp; i++) {
      const s = performance.now();
      await execa('runc', ['--root', path.join(d.root, 'runtime', 'runc'), 'state', sb.id]);
      runc.push(performance.now() - s);
    }
    out.dsec_get_sandbox_ms = pct(api);
    out.dsec_version_ms = pct(ver);
    out.runc_state_ms = pct(runc);
  } finally {
    await d.stop();
  }
  if (o.podman) {
    const name = `dsec-bench-status-${process.pid}`;
    await execa('podman', [...PODMAN, 'run', '-d', '--name', name, ...PODMAN_RUN, '--rootfs', tree, '/bin/sleep', '3600']);
    try {
      const pi: number[] = [];
      for (let i = 0; i < kp; i++) {
        const s = performance.now();
        await execa('podman', ['inspect', name]);
        pi.push(performance.now() - s);
      }
      out.podman_inspect_ms = pct(pi);
    } finally {
      await execa('podman', ['rm', '-f', '-t', '0', name], { reject: false });
    }
  }
  process.stderr.write(`status: ${JSON.stringify(out)}\n`);
  res.status = out;
}

/** Markdown of the results, for docs/BENCHMARKS.md. */
function table(res: Record<string, any>): string {
  const L: string[] = [];
  const ms = (x?: { p50: number; p99: number }) => (x ? `${x.p50} / ${x.p99} ms` : 'not run');
  const ratio = (a?: number, b?: number) => (a && b ? `${r2(a / b)}×` : '');
  const ratioUp = (a?: number, b?: number) => (a && b ? `${r2(a / b)}× (dsec / peer)` : '');
  const pm = res.burst?.podman !== undefined; // the podman burst peer ran (not --no-podman)
  // A MemAvailable drop below zero means the host freed more than the run used: noise at that count.
  const mib = (v?: number) => (v === undefined ? '-' : v < 0 ? `${v} MiB (MemAvailable rose: noise at this count)` : `${v} MiB`);
  L.push(`Run of ${res.date} (${res.quick ? '--quick' : 'full'}), ${res.host.cores} cores, ${Math.round(res.host.memory_bytes / 2 ** 30)} GiB, kernel ${res.host.kernel}; ${res.host.note}. Host speed: spawning \`/bin/true\` took ${res.host.spawn_true_ms_at_start ?? '?'} ms (p50) at the start and ${res.host.spawn_true_ms_at_end ?? '?'} ms at the end.`);
  L.push('Command: `' + res.command + '`.', '');
  L.push('| what | target | dsec | peer | peer / dsec |', '|---|---|---|---|---|');
  const b = res.burst;
  if (b) {
    L.push(`| burst of ${b.pool_empty.n} at C=${b.pool_empty.concurrency}, pool empty: create→first exec p50 / p99 | ≤ 30 / ≤ 200 ms | ${ms(b.pool_empty.create_to_first_exec_ms)} | ${pm ? `podman run -d + exec (${b.podman.n}): ${ms(b.podman.create_to_first_exec_ms)}` : 'podman: not run'} | ${ratio(b.podman?.create_to_first_exec_ms.p50, b.pool_empty.create_to_first_exec_ms.p50)} |`);
    L.push(`| same, ready/s${b.runtime ? ` (${b.runtime.name} ${b.runtime.version})` : ''} | ≥ 100 /s, ≥ 10× podman | ${b.pool_empty.ready_per_s} /s | ${pm ? `${b.podman.ready_per_s} /s` : '-'} | ${ratioUp(b.pool_empty.ready_per_s, b.podman?.ready_per_s)} |`);
    if (b.pool_empty_runc) L.push(`| same burst, dsecd on runc: ready/s, create→first exec p50 / p99 | | ${b.pool_empty_runc.ready_per_s} /s, ${ms(b.pool_empty_runc.create_to_first_exec_ms)} | ${pm ? `${b.podman.ready_per_s} /s` : '-'} | ${ratioUp(b.pool_empty_runc.ready_per_s, b.podman?.ready_per_s)} |`);
    L.push(`| burst of ${b.pool_prefilled.n}, pool pre-filled (${b.pool_prefilled.claimed} claimed, ${b.pool_prefilled.misses} misses; fill took ${b.pool_prefilled.pool_fill_s} s): create→first exec p50 / p99 | ≤ 30 / ≤ 200 ms | ${ms(b.pool_prefilled.create_to_first_exec_ms)} | ${pm ? ms(b.podman.create_to_first_exec_ms) : '-'} | ${ratio(b.podman?.create_to_first_exec_ms.p50, b.pool_prefilled.create_to_first_exec_ms.p50)} |`);
    L.push(`| same, ready/s | ≥ 100 /s | ${b.pool_prefilled.ready_per_s} /s | ${pm ? `${b.podman.ready_per_s} /s` : '-'} | ${ratioUp(b.pool_prefilled.ready_per_s, b.podman?.ready_per_s)} |`);
    L.push(`| destroy (bulk, after the empty-pool burst), per sandbox | | ${b.destroy.per_sandbox_ms} ms | podman rm -f: ${b.podman?.destroy_per_container_ms ?? '-'} ms | |`);
  }
  const e = res.exec;
  if (e) {
    L.push(`| exec \`true\` through the API, p50 / p99 | ≤ 2 ms p50 | ${ms(e.dsec_api)} | runc exec: ${ms(e.runc_exec)} | ${ratio(e.runc_exec?.p50, e.dsec_api.p50)} |`);
    if (e.dsec_channel) {
      L.push(`| exec \`true\` over an exec channel (one WebSocket, GET .../exec/channel), p50 / p99 | ≤ 2 ms p50 | ${ms(e.dsec_channel)} | runc exec: ${ms(e.runc_exec)} | ${ratio(e.runc_exec?.p50, e.dsec_channel.p50)} |`);
      L.push(`| exec \`true\` p50 over the host's own spawn of \`/bin/true\` (${e.host_spawn_true_ms} ms, same run): POST .../exec; channel | ≤ 1.5× | ${e.api_over_host_spawn}×; ${e.channel_over_host_spawn}× | | |`);
      L.push(`| dsecd CPU per exec: POST .../exec; channel | | ${e.dsecd_cpu_ms_per_exec} ms; ${e.dsecd_cpu_ms_per_exec_channel} ms | | |`);
    }
    if (e.podman_exec) L.push(`| | | | podman exec: ${ms(e.podman_exec)} | ${ratio(e.podman_exec.p50, e.dsec_api.p50)} |`);
  }
  const dn = res.density;
  if (dn) {
    L.push(`| idle sandboxes: host memory each, MemAvailable drop over ${dn.dsec.sandboxes} sandboxes (all answer exec: ${dn.dsec.all_answer_exec}) | ≥ 5,000 at ≤ 2 MiB each | ${mib(dn.dsec.host_mem_per_sandbox_mib)} | ${dn.podman ? `podman (${dn.podman.containers}): ${mib(dn.podman.host_mem_per_container_mib)}` : 'podman: not run'} | ${ratio(dn.podman?.host_mem_per_container_mib, dn.dsec.host_mem_per_sandbox_mib)} |`);
    L.push(`| same, accounted per process: cgroup charge + dsecd RSS growth (podman: cgroup + conmon RSS) | ≤ 2 MiB | ${dn.dsec.accounted_per_sandbox_mib} MiB (cgroup ${dn.dsec.cgroup_charge_per_sandbox_mib} MiB, dsecd +${dn.dsec.dsecd_rss_growth_per_sandbox_kib} KiB) | ${dn.podman?.accounted_per_container_mib ?? '-'} MiB | ${ratio(dn.podman?.accounted_per_container_mib, dn.dsec.accounted_per_sandbox_mib)} |`);
    if (dn.dsec.superblocks_per_sandbox !== undefined) L.push(`| same, kernel: kmalloc-1k growth (memory cgroups' shrinker tables) per sandbox; superblocks each sandbox adds | | ${dn.dsec.kmalloc_1k_per_sandbox_kib ?? '-'} KiB; ${dn.dsec.superblocks_per_sandbox} superblocks | | |`);
  }
  const p = res.pause;
  if (p) {
    L.push(`| pause, p50 / p99 (page cache reclaimed, p50 ${p.dsec.reclaimed_kib_p50} KiB) | ≤ 20 ms | ${ms(p.dsec.pause_ms)} | podman pause: ${ms(p.podman?.pause_ms)} | ${ratio(p.podman?.pause_ms.p50, p.dsec.pause_ms.p50)} |`);
    L.push(`| resume, p50 / p99 | ≤ 20 ms | ${ms(p.dsec.resume_ms)} | podman unpause: ${ms(p.podman?.resume_ms)} | ${ratio(p.podman?.resume_ms.p50, p.dsec.resume_ms.p50)} |`);
  }
  const f = res.fncall;
  if (f) {
    L.push(`| fncall \`/bin/true\`, C=${f.concurrency} (POST /v1/run; batch of 100) | ≥ 1,000 calls/s | ${f.dsec_run_calls_per_s} /s; batch ${f.dsec_batch_calls_per_s} /s | bwrap: ${f.bwrap_calls_per_s} /s | ${ratioUp(f.dsec_run_calls_per_s, f.bwrap_calls_per_s)} |`);
    // Absent from runs made before the run channel existed.
    if (f.dsec_channel_calls_per_s !== undefined) L.push(`| same calls over a run channel (one WebSocket, GET /v1/run/channel, ${f.concurrency} in flight) | ≥ 1,000 calls/s, ≥ 5× bwrap | ${f.dsec_channel_calls_per_s} /s | bwrap: ${f.bwrap_calls_per_s} /s | ${ratioUp(f.dsec_channel_calls_per_s, f.bwrap_calls_per_s)} |`);
  }
  const s = res.status;
  if (s) {
    L.push(`| status call GET /v1/sandboxes/{id}, p50 / p99 | | ${ms(s.dsec_get_sandbox_ms)} (GET /v1/version ${ms(s.dsec_version_ms)}) | runc state: ${ms(s.runc_state_ms)} | ${ratio(s.runc_state_ms?.p50, s.dsec_get_sandbox_ms.p50)} |`);
    if (s.podman_inspect_ms) L.push(`| | | | podman inspect: ${ms(s.podman_inspect_ms)} | ${ratio(s.podman_inspect_ms.p50, s.dsec_get_sandbox_ms.p50)} |`);
  }
  const io = res.io;
  if (io?.dsec) {
    const pm = io.podman ?? {};
    L.push(`| neighbour exec writing 4 KiB + fsync, p50 / p99: idle | | ${ms(io.dsec.idle)} | podman exec: ${ms(pm.idle)} | |`);
    L.push(`| same, beside a buffered writer (no I/O settings / writer io_max ${r2(io.writer_io_max_write_bps / 2 ** 20)} MiB/s, io_weight 10) | | ${ms(io.dsec.buffered)} / ${ms(io.dsec['buffered+io'])} | ${ms(pm.buffered)} | |`);
    L.push(`| same, beside a direct-I/O writer (no I/O settings / with them) | | ${ms(io.dsec.direct)} / ${ms(io.dsec['direct+io'])} | ${ms(pm.direct)} | |`);
  }
  const e2 = res.e2b;
  if (e2) {
    L.push(`| E2B door: \`commands.run('true')\` (e2b SDK, runs \`/bin/bash -l -c true\`), p50 / p99 | | ${ms(e2.e2b_run_true_ms)} | /v1 exec \`bash -l -c true\` on the same door: ${ms(e2.v1_exec_bash_true_ms)}; \`true\`: ${ms(e2.v1_exec_true_ms)} | ${ratio(e2.v1_exec_bash_true_ms?.p50, e2.e2b_run_true_ms.p50)} |`);
    L.push(`| E2B door: \`Sandbox.create('base')\`, p50 / p99 | | ${ms(e2.e2b_create_ms)} | POST /v1/sandboxes (e2b-base): ${ms(e2.v1_create_ms)} | ${ratio(e2.v1_create_ms?.p50, e2.e2b_create_ms.p50)} |`);
  }
  return L.join('\n');
}

/** Replaces the text between the bench:all markers of docs/BENCHMARKS.md (appends the section when missing). */
function writeDoc(md: string): void {
  const file = path.join(repoRoot(), 'docs/BENCHMARKS.md');
  const begin = '<!-- bench:all begin (generated by `npm run bench`; do not edit) -->', end = '<!-- bench:all end -->';
  let doc = readFileSync(file, 'utf8');
  const block = `${begin}\n${md}\n${end}`;
  const i = doc.indexOf(begin), j = doc.indexOf(end);
  doc = i >= 0 && j > i ? doc.slice(0, i) + block + doc.slice(j + end.length) : `${doc.trimEnd()}\n\n## All targets side by side (\`npm run bench\`)\n\n${block}\n`;
  writeFileSync(file, doc);
}

async function main(): Promise<void> {
  const o = new Command('bench')
    .option('--quick', 'small counts: a functional check, not numbers to publish', false)
    .option('--only <list>', 'sections, comma-separated: burst,exec,density,pause,fncall,status,io,remote,e2b')
    .option('--n <n>', 'creations in the burst', '1000')
    .option('--podman-n <n>', 'podman containers in the burst and density peers', '100')
    .option('--concurrency <c>', 'creates in flight in the burst and density runs', '16')
    .option('--density-n <n>', 'most sandboxes in the density run (DESIGN.md §6: 5,000)', '5000')
    .option('--density-budget-mib <m>', 'stop the density run once host memory fell by this much', '10240')
    .option('--density-runtime <name>', 'the density dsecd\'s [runtime] name (runc or crun; default: auto)')
    .option('--no-podman', 'skip the podman peers')
    .option('--no-doc', 'do not rewrite docs/BENCHMARKS.md or bench/results-all.json (JSON goes to bench/results-all.local.json; --quick implies it)')
    .option('--cpu-prof <dir>', 'run the burst dsecd under node --cpu-prof, profiles into DIR')
    .option('--merge', 'keep the sections of bench/results-all.json that this run does not measure (with --only)', false)
    .option('--note <text>', 'host conditions, printed with the table', 'shared host, other work running')
    .parse(process.argv)
    .opts<Opts & { note: string; merge: boolean }>();
  if (o.quick) {
    if (o.n === '1000') o.n = '100';
    if (o.podmanN === '100') o.podmanN = '20';
    if (o.densityN === '5000') o.densityN = '100';
  }
  const only = new Set((o.only ?? 'burst,exec,density,pause,fncall,status,io,remote,e2b').split(','));
  const res: Record<string, unknown> = {
    bench: 'all', date: new Date().toISOString().slice(0, 16).replace('T', ' ') + ' UTC', quick: o.quick,
    command: `npm run bench -- ${process.argv.slice(2).join(' ')}`.trim(),
    host: {
      cores: os.cpus().length, memory_bytes: os.totalmem(), kernel: os.release(), loadavg_at_start: os.loadavg().map(r2), note: o.note,
      spawn_true_ms_at_start: await spawnTrueMs(),
    },
  };
  const tree = mkdtempSync('/tmp/dsec-bench-tree-');
  try {
    await prepareBusyboxTree(tree);
    if (only.has('burst')) await burst(o, tree, res);
    if (only.has('exec')) await exec(o, tree, res);
    if (only.has('density')) await density(o, tree, res);
    if (only.has('pause')) await pause(o, tree, res);
    if (only.has('fncall')) await fncall(o, res);
    if (only.has('status')) await status(o, tree, res);
    if (only.has('remote')) {
      // The TCP door against the socket, same run (bench/remote.ts).
      res.remote = await runRemote({ n: o.quick ? 10 : 50, concurrency: 4, execRepeats: o.quick ? 200 : 1000 });
      process.stderr.write(`remote: ${JSON.stringify((res.remote as { ratio: unknown }).ratio)}\n`);
    }
    if (only.has('io')) {
      res.io = await runIoNeighbour({ samples: o.quick ? 10 : 40, wbps: 32 * 1024 * 1024, podman: o.podman });
      process.stderr.write(`io: ${JSON.stringify(res.io)}\n`);
    }
    if (only.has('e2b')) res.e2b = await runE2b({ n: o.quick ? 20 : 200, createN: o.quick ? 3 : 20, warmup: o.quick ? 3 : 20 });
  } finally {
    rmSync(tree, { recursive: true, force: true });
  }
  (res.host as Record<string, unknown>).loadavg_at_end = os.loadavg().map(r2);
  (res.host as Record<string, unknown>).spawn_true_ms_at_end = await spawnTrueMs();
  if (o.merge) {
    const prev = JSON.parse(readFileSync(path.join(repoRoot(), 'bench/results-all.json'), 'utf8')) as Record<string, unknown>;
    for (const k of ['burst', 'exec', 'density', 'pause', 'fncall', 'status', 'io', 'remote', 'e2b']) if (!(k in res) && k in prev) res[k] = prev[k];
    res.command = `${prev.command as string}; then ${res.command as string}`;
  }
  const text = JSON.stringify(res, null, 2);
  // Quick numbers are not to be published, and the JSON and the table are published together.
  const publish = o.doc && !o.quick;
  const out = path.join(repoRoot(), publish ? 'bench/results-all.json' : 'bench/results-all.local.json');
  writeFileSync(out, text + '\n');
  const md = table(res);
  if (publish) writeDoc(md);
  process.stdout.write(`${text}\n\n${md}\n\nwrote ${path.relative(repoRoot(), out)}${publish ? ' and docs/BENCHMARKS.md' : ' (not published: --quick or --no-doc)'}\n`);
}

main().catch((e) => {
  process.stderr.write(`bench failed: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
