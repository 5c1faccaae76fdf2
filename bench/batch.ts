/**
 * bench/batch: a batched create (POST /v1/sandboxes:batch, one request for N sandboxes)
 * against N single creates (POST /v1/sandboxes, `--concurrency` in flight, the bursts'
 * usual 16), same run, same dsecd, on the Unix socket. Each side is measured
 * `--rounds` times, alternating which goes first, with the pool empty (every create runs
 * the runtime) and with the warm pool pre-filled with N shells before each side.
 *
 * Per side and round: ready/s (N / wall time from the first request to the last answer:
 * every sandbox is running when its create answers), wall seconds, client CPU ms per
 * sandbox (this process's user + system time, process.cpuUsage) and dsecd CPU ms per
 * sandbox (/proc/PID/stat utime + stime, 10 ms ticks). Sandboxes are destroyed between
 * runs, outside the measurement.
 *
 * Prints one JSON object and writes bench/results-batch.json.
 * Usage: node dist/bench/batch.js [--n 100] [--concurrency 16] [--rounds 2] [--no-pool]
 */
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Command } from 'commander';
import { repoRoot } from '../daemon/startup/host.js';
import { BENCH_POOL, BENCH_RANGE, tempDaemon, type TempDaemon } from './lib.js';

const r2 = (x: number) => Math.round(x * 100) / 100;
/** Sandbox defaults of bench/all.ts: 64 MiB, 64 pids, a 1 GiB writable-layer quota. */
const DEFAULTS = '[defaults]\nmemory_bytes = 67108864\npids = 64\ndisk_bytes = 1073741824\n';

/** dsecd's CPU time, ms (user + system from /proc/PID/stat, 10 ms ticks). */
function cpuMs(pid: number | undefined): number {
  if (!pid) return NaN;
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(f[11]) + Number(f[12])) * 10;
}

/** This process's CPU time, ms. */
function clientCpuMs(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}

/** One side's measurement. */
interface Side { n: number; ready_per_s: number; wall_s: number; client_cpu_ms_per_sandbox: number; dsecd_cpu_ms_per_sandbox: number; claimed?: number }

/** Measures `run` making `n` sandboxes labelled `label`, then destroys them (unmeasured). */
async function measure(d: TempDaemon, n: number, label: string, run: () => Promise<number>): Promise<Side> {
  const c0 = clientCpuMs(), d0 = cpuMs(d.pid), t0 = performance.now();
  const made = await run();
  const wall = (performance.now() - t0) / 1000;
  const side = { n, ready_per_s: r2(n / wall), wall_s: r2(wall), client_cpu_ms_per_sandbox: r2((clientCpuMs() - c0) / n), dsecd_cpu_ms_per_sandbox: r2((cpuMs(d.pid) - d0) / n) };
  if (made !== n) throw new Error(`${label}: ${made} of ${n} sandboxes made`);
  const gone = await d.client.bulk({ selector: `bench=${label}`, action: 'destroy' });
  if (gone.some((x) => !x.ok)) throw new Error(`${label}: destroys failed`);
  return side;
}

/** N single creates, `c` in flight. @returns how many were made. */
async function singles(d: TempDaemon, n: number, c: number, label: string): Promise<number> {
  let next = 0, made = 0;
  await Promise.all(Array.from({ length: Math.min(c, n) }, async () => {
    while (next < n) {
      next++;
      await d.client.createSandbox({ image: 'busybox', labels: { bench: label } });
      made++;
    }
  }));
  return made;
}

/** One batched create of N. @returns how many were made. */
async function batch(d: TempDaemon, n: number, label: string): Promise<number> {
  const r = await d.client.createSandboxes({ count: n, spec: { image: 'busybox', labels: { bench: label } } });
  const bad = r.results.find((x) => x.error);
  if (bad) throw new Error(`batch: ${r.failed} failed, e.g. ${bad.error?.code}: ${bad.error?.message}`);
  return r.created;
}

/** Waits until the warm pool has `n` shells ready and none filling. */
async function poolReady(d: TempDaemon, n: number): Promise<void> {
  for (;;) {
    const p = (await d.client.hostInfo()).warm_pools[0];
    if (p && p.ready >= n && p.filling === 0) return;
    await new Promise((r) => setTimeout(r, 250));
  }
}

/** Both sides, `rounds` times each, alternating which goes first. */
async function compare(d: TempDaemon, n: number, c: number, rounds: number, prefill: boolean): Promise<{ single: Side[]; batch: Side[] }> {
  const out = { single: [] as Side[], batch: [] as Side[] };
  const claimed = async () => (prefill ? (await d.client.hostInfo()).warm_pools[0].claimed : 0);
  for (let i = 0; i < rounds; i++) {
    const order: Array<'single' | 'batch'> = i % 2 === 0 ? ['single', 'batch'] : ['batch', 'single'];
    for (const side of order) {
      if (prefill) await poolReady(d, n);
      const k0 = await claimed();
      const label = `${side}-${i}`;
      const r = await measure(d, n, label, () => (side === 'single' ? singles(d, n, c, label) : batch(d, n, label)));
      if (prefill) r.claimed = (await claimed()) - k0;
      out[side].push(r);
      process.stderr.write(`${prefill ? 'pool pre-filled' : 'pool empty'}, ${side}, round ${i}: ${JSON.stringify(r)}\n`);
    }
  }
  return out;
}

async function main(): Promise<void> {
  const o = new Command()
    .option('--n <n>', 'sandboxes per side', '100')
    .option('--concurrency <c>', 'single creates in flight', '16')
    .option('--rounds <r>', 'measurements per side', '2')
    .option('--no-pool', 'skip the pre-filled-pool comparison')
    .parse()
    .opts<{ n: string; concurrency: string; rounds: string; pool: boolean }>();
  const n = Number(o.n), c = Number(o.concurrency), rounds = Number(o.rounds);
  const res: Record<string, unknown> = { date: new Date().toISOString(), n, concurrency: c, rounds };
  let d = await tempDaemon('dsec-bench-batch-', BENCH_POOL, DEFAULTS, { rangeSize: BENCH_RANGE });
  try {
    const w = await d.client.createSandbox({ image: 'busybox' });
    await d.client.deleteSandbox(w.id, { force: true });
    res.pool_empty = await compare(d, n, c, rounds, false);
  } finally {
    await d.stop();
  }
  if (o.pool) {
    d = await tempDaemon('dsec-bench-batchpool-', BENCH_POOL, `${DEFAULTS}[pool]\nfill_concurrency = 2\n[[pool.entries]]\nimage = "busybox"\nsize = ${n}\n`, { rangeSize: BENCH_RANGE });
    try {
      res.pool_prefilled = await compare(d, n, c, rounds, true);
    } finally {
      await d.stop();
    }
  }
  const text = JSON.stringify(res, null, 2);
  writeFileSync(path.join(repoRoot(), 'bench/results-batch.json'), `${text}\n`);
  process.stdout.write(`${text}\n`);
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
