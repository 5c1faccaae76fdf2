/**
 * `npm run bench:fncall`: the fncall tier end to end (HTTP API -> pool -> isolated call)
 * beside its peers in the same run, on the same root filesystem trees:
 *
 *   - dsec: POST /v1/run {backend: fncall} per call, the same calls over one run channel
 *     (GET /v1/run/channel, a WebSocket; `c` calls in flight on it), and POST
 *     /v1/run:batch (100 calls per request), at concurrency 1, 2 and 8;
 *   - bwrap per call: `bwrap --unshare-all --ro-bind TREE / --proc /proc --dev /dev --tmpfs /tmp CMD`;
 *   - podman per call: `podman --runtime runc run --rm --network none --rootfs TREE CMD`.
 *
 * Workloads: `/bin/true` on the busybox image and `python3 -c 'print(1)'` on
 * debian:bookworm (bootstrapped from the Debian mirror cache when missing; --no-python
 * skips it). Prints JSON (calls/s, p50/p99 latency, host CPU per call) and writes
 * bench/results-fncall.json.
 *
 *   node dist/bench/fncall.js [--calls 2000] [--concurrency 1,2,8] [--peer-calls 200] [--no-python] [--no-podman] [--no-results] [--no-peers] [--cpu-prof DIR]
 *
 * --cpu-prof DIR: dsecd runs under `node --cpu-prof` (its profile lands in DIR when it stops);
 * --no-peers: dsec only (for profiling; no ratios, no results file).
 */
import { Command } from 'commander';
import { execa } from 'execa';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { prepareBusyboxTree } from '../daemon/image/builtin.js';
import { percentile, tempDaemon } from './lib.js';

const round = (x: number, d = 2) => Math.round(x * 10 ** d) / 10 ** d;

/** Host CPU time so far, ms (user + system of all cores, from /proc/stat). */
function hostCpuMs(): number {
  const f = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
  // user nice system idle iowait irq softirq steal: busy = all but idle and iowait.
  const busy = f[0] + f[1] + f[2] + f[5] + f[6] + f[7];
  return (busy * 1000) / 100; // USER_HZ is 100 on Linux
}

/** One measurement: calls/s, latency percentiles (ms), host CPU per call (ms). */
interface Measure {
  calls: number;
  errors: number;
  calls_per_s: number;
  latency_ms: { p50: number; p99: number };
  host_cpu_ms_per_call: number;
}

/** Runs `n` calls of `one` with `c` in flight and measures them. */
async function measure(n: number, c: number, one: () => Promise<boolean>): Promise<Measure> {
  const lat: number[] = [];
  let next = 0;
  let errors = 0;
  const cpu0 = hostCpuMs();
  const t0 = performance.now();
  await Promise.all(Array.from({ length: c }, async () => {
    while (next++ < n) {
      const s = performance.now();
      if (!(await one())) errors += 1;
      lat.push(performance.now() - s);
    }
  }));
  const wall = (performance.now() - t0) / 1000;
  return {
    calls: n, errors, calls_per_s: round(n / wall, 1), latency_ms: { p50: round(percentile(lat, 50), 3), p99: round(percentile(lat, 99), 3) },
    host_cpu_ms_per_call: round((hostCpuMs() - cpu0) / n, 3),
  };
}

/** Like {@link measure}, for batches: `n` calls as requests of `size`, `c` requests in flight; latency is per request. */
async function measureBatch(n: number, c: number, size: number, batch: (k: number) => Promise<number>): Promise<Measure & { batch_size: number }> {
  const m = await measure(Math.ceil(n / size), c, async () => (await batch(size)) === size);
  return { ...m, calls: n, calls_per_s: round(m.calls_per_s * size, 0), host_cpu_ms_per_call: round(m.host_cpu_ms_per_call / size, 3), batch_size: size };
}

/** Rounds every calls_per_s of a measurement table to whole calls for the report. */
function wholeRates<T extends Record<string, Measure>>(t: T): T {
  for (const m of Object.values(t)) m.calls_per_s = Math.round(m.calls_per_s);
  return t;
}

async function main(): Promise<void> {
  const opts = new Command('fncall')
    .option('--calls <n>', 'dsec calls per measurement', '2000')
    .option('--peer-calls <n>', 'bwrap and podman calls per measurement (they are slower)', '200')
    .option('--concurrency <list>', 'calls in flight, comma-separated', '1,2,8')
    .option('--no-python', 'skip the python3 workload (needs debian:bookworm)')
    .option('--no-podman', 'skip the podman peer')
    .option('--no-results', 'print the JSON only; leave bench/results-fncall.json alone (bench/all.ts runs it so)')
    .option('--no-peers', 'measure dsec only (no bwrap or podman, no ratios): for profiling')
    .option('--cpu-prof <dir>', 'run dsecd under node --cpu-prof, its profile into DIR')
    .parse(process.argv)
    .opts<{ calls: string; peerCalls: string; concurrency: string; python: boolean; podman: boolean; results: boolean; peers: boolean; cpuProf?: string }>();
  const calls = Number(opts.calls);
  const peerCalls = Number(opts.peerCalls);
  const levels = opts.concurrency.split(',').map(Number);
  // Slot 30's pool (create-exec's): benchmarks never run beside each other.
  const d = await tempDaemon('dsec-bench-fncall-', null, `[fncall]\nmax_workers = ${Math.max(...levels)}\nmin_idle = ${Math.max(...levels)}\n`,
    opts.cpuProf ? { nodeArgs: ['--cpu-prof', `--cpu-prof-dir=${path.resolve(opts.cpuProf)}`] } : {});
  const trees: string[] = [];
  const mounts: string[] = [];
  const result: Record<string, unknown> = { bench: 'fncall', host: { cores: os.cpus().length, kernel: os.release() }, calls, peer_calls: peerCalls };
  try {
    const busybox = mkdtempSync('/tmp/dsec-bench-tree-');
    trees.push(busybox);
    await prepareBusyboxTree(busybox);
    const workloads: Array<{ name: string; image: string; argv: string[]; tree: string }> = [{ name: 'true', image: 'busybox', argv: ['/bin/true'], tree: busybox }];
    if (opts.python) {
      await d.client.bootstrapImage({ distro: 'debian' }).catch((e: Error) => { throw new Error(`bootstrap debian for the python workload failed (run with --no-python to skip): ${e.message}`); });
      const img = await d.client.getImage('debian:bookworm');
      // The peers get the same tree: the image's layer, mounted read-only.
      const mnt = mkdtempSync('/tmp/dsec-bench-debian-');
      trees.push(mnt);
      await execa('mount', ['-t', 'erofs', '-o', 'ro', path.join(d.root, 'images', 'blobs', 'sha256', img.layers[0].replace('sha256:', '')), mnt]);
      mounts.push(mnt);
      workloads.push({ name: 'python', image: 'debian:bookworm', argv: ['python3', '-c', 'print(1)'], tree: mnt });
    }
    for (const w of workloads) {
      const out: Record<string, unknown> = {};
      const dsecOne = async () => (await d.client.run({ backend: 'fncall', image: w.image, argv: w.argv })).exit_code === 0;
      for (let i = 0; i < 50; i++) await dsecOne(); // warm the pool's first worker and the page cache
      await Promise.all(Array.from({ length: Math.max(...levels) }, dsecOne)); // start every worker
      const channel = d.client.runChannel();
      await channel.opened;
      const channelOne = async () => (await channel.run({ backend: 'fncall', image: w.image, argv: w.argv })).exit_code === 0;
      const dsec: Record<string, Measure> = {};
      const viaChannel: Record<string, Measure> = {};
      const batch: Record<string, Measure> = {};
      const bwrap: Record<string, Measure> = {};
      const podman: Record<string, Measure> = {};
      const bwrapArgs = ['--unshare-all', '--die-with-parent', '--ro-bind', w.tree, '/', '--proc', '/proc', '--dev', '/dev', '--tmpfs', '/tmp', ...w.argv];
      const podmanArgs = ['--runtime', 'runc', 'run', '--rm', '--network', 'none', '--ulimit', 'nofile=1024:1024', '--ulimit', 'nproc=1024:1024', '--rootfs', w.tree, ...w.argv];
      for (const c of levels) {
        dsec[`c${c}`] = await measure(calls, c, dsecOne);
        viaChannel[`c${c}`] = await measure(calls, c, channelOne);
        batch[`c${c}`] = await measureBatch(calls, c, 100, async (k) => (await d.client.runBatch(Array.from({ length: k }, () => ({ backend: 'fncall' as const, image: w.image, argv: w.argv })))).filter((r) => r.ok && r.result?.exit_code === 0).length);
        if (!opts.peers) {
          process.stderr.write(`fncall ${w.name} c=${c}: dsec ${dsec[`c${c}`].calls_per_s}/s, channel ${viaChannel[`c${c}`].calls_per_s}/s, batch ${batch[`c${c}`].calls_per_s}/s\n`);
          continue;
        }
        bwrap[`c${c}`] = await measure(peerCalls, c, async () => (await execa('bwrap', bwrapArgs, { reject: false })).exitCode === 0);
        if (opts.podman) podman[`c${c}`] = await measure(Math.min(peerCalls, 60), c, async () => (await execa('podman', podmanArgs, { reject: false })).exitCode === 0);
        process.stderr.write(`fncall ${w.name} c=${c}: dsec ${dsec[`c${c}`].calls_per_s}/s, channel ${viaChannel[`c${c}`].calls_per_s}/s, batch ${batch[`c${c}`].calls_per_s}/s, bwrap ${bwrap[`c${c}`].calls_per_s}/s`
          + `${opts.podman ? `, podman ${podman[`c${c}`].calls_per_s}/s` : ''}\n`);
      }
      channel.close();
      out.dsec_run = wholeRates(dsec);
      out.dsec_channel = wholeRates(viaChannel);
      out.dsec_batch = wholeRates(batch);
      if (!opts.peers) {
        result[w.name] = out;
        continue;
      }
      out.bwrap = wholeRates(bwrap);
      if (opts.podman) out.podman = wholeRates(podman);
      out.ratio = Object.fromEntries(levels.map((c) => [`c${c}`, {
        dsec_run_over_bwrap: round(dsec[`c${c}`].calls_per_s / bwrap[`c${c}`].calls_per_s),
        dsec_channel_over_bwrap: round(viaChannel[`c${c}`].calls_per_s / bwrap[`c${c}`].calls_per_s),
        dsec_batch_over_bwrap: round(batch[`c${c}`].calls_per_s / bwrap[`c${c}`].calls_per_s),
        ...(opts.podman ? { dsec_run_over_podman: round(dsec[`c${c}`].calls_per_s / podman[`c${c}`].calls_per_s) } : {}),
      }]));
      result[w.name] = out;
    }
    const t = result.true as { dsec_run: Record<string, Measure>; dsec_channel: Record<string, Measure>; dsec_batch: Record<string, Measure> };
    const best = Math.max(...Object.values(t.dsec_run).map((m) => m.calls_per_s), ...Object.values(t.dsec_channel).map((m) => m.calls_per_s), ...Object.values(t.dsec_batch).map((m) => m.calls_per_s));
    result.target = { true_calls_per_s: 1000, best_measured: best, met: best >= 1000 };
  } finally {
    for (const m of mounts) await execa('umount', [m], { reject: false });
    for (const t of trees) rmSync(t, { recursive: true, force: true });
    await d.stop();
  }
  const text = JSON.stringify(result, null, 2);
  if (opts.results && opts.peers) writeFileSync(new URL('../../bench/results-fncall.json', import.meta.url), text + '\n');
  process.stdout.write(text + '\n');
}

main().catch((e) => {
  process.stderr.write(`fncall bench failed: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
