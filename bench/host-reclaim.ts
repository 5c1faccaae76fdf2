/**
 * bench/host-reclaim: memory of N idle container sandboxes with the host's reclaim off
 * against on (`[memory] reclaim = "aggressive"`, daemon/host/memory/host-reclaim.ts), same
 * invocation, runs one after the other. Prints one JSON object and writes it to
 * bench/results-host-reclaim.json:
 *
 *   { n, cache_mib, shm_mib, idle_after_s, host: { cpus, mem_total_mib, cgroup },
 *     runs: { off|on: { method, before_mib, after_mib, series: [[s, mib]...], reclaimed_mib,
 *                       seconds_to_90pct, exec_true_ms: {p50, max}, read_back_ms: {p50, max} } },
 *     saving_pct, cache_returned_pct }
 *
 * before_mib: the sum of each sandbox's charge read right after its own write (before any
 * reclaim could touch it); after_mib: the sum at the end; seconds_to_90pct: from the last
 * write until the sum was within 10% of its final drop; saving_pct: 1 - on.after / off.after;
 * cache_returned_pct: (on.before - on.after) / (n × cache_mib), how much of the cold page
 * cache came back.
 *
 * Per run: a fresh dsecd; N busybox sandboxes created one after the other; in each, one
 * exec writes `cache_mib` of a file on its writable layer (then `sync`: written back, so
 * droppable) and `shm_mib` into /dev/shm (tmpfs: shared memory, which without swap no
 * reclaim can take; the stand-in for a sandbox's anonymous memory); then nothing. The
 * sandboxes' memory is the sum of their cgroups' charge (GET .../stats memory_bytes),
 * sampled every second from the last write for idle_after_s + 30 s. Then, per sandbox, the
 * first exec after (`true`) and a read of the whole file back (`cat > /dev/null`), timed
 * at the client.
 *
 * On this development host (hybrid cgroup v1, no swap, a kdamond that is not dsec's) the
 * method is memory.force_empty: page cache only comes back. DAMON is switched off for the
 * bench (`damon = false`) so it never reads the host's kdamond as free to take; DAMON's
 * numbers come from a vm-tier guest (test/integration/damon-guest.test.ts).
 *
 * Each run's dsecd has a uid pool of 8,192 ranges (bench/all.ts's: room for N up to 8,192)
 * and a 1 GiB writable-layer quota per sandbox (so the disk pool's admission never refuses
 * N sandboxes that write a few MiB each); `--memory-mib` is each sandbox's memory limit.
 *
 * Usage (root): node dist/bench/host-reclaim.js [--n 50] [--cache-mib 32] [--shm-mib 8] [--idle-after-s 5] [--memory-mib 512]
 */
import { writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { BENCH_POOL, BENCH_RANGE, percentile, tempDaemon, type TempDaemon } from './lib.js';
import { repoRoot } from '../daemon/startup/host.js';

const MiB = 2 ** 20;
const round = (x: number) => Math.round(x * 10) / 10;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Sum of the sandboxes' cgroup charge, bytes. */
async function charge(d: TempDaemon, ids: string[]): Promise<number> {
  let sum = 0;
  for (const id of ids) sum += (await d.client.sandboxStats(id)).memory_bytes ?? 0;
  return sum;
}

/** One run (see the module comment). */
async function run(mode: 'off' | 'aggressive', o: { n: number; cacheMiB: number; shmMiB: number; idleAfterS: number; memoryMiB: number }) {
  const toml = `[defaults]\ndisk_bytes = ${2 ** 30}\n[memory]\nreclaim = "${mode}"\nidle_after_s = ${o.idleAfterS}\nsweep_s = 1\ndamon = false\n`;
  const d = await tempDaemon(`dsec-bench-reclaim-${mode}-`, BENCH_POOL, toml, { rangeSize: BENCH_RANGE });
  try {
    const ids: string[] = [];
    for (let i = 0; i < o.n; i++) {
      ids.push((await d.client.createSandbox({ image: 'busybox', memory_bytes: o.memoryMiB * MiB })).id);
      if ((i + 1) % 100 === 0) process.stderr.write(`${mode}: ${i + 1}/${o.n} created\n`);
    }
    // Each sandbox's charge right after its write: the memory before any reclaim (sandboxes written first may be reclaimed while later ones write).
    let written = 0;
    let nw = 0;
    for (const id of ids) {
      const r = await d.client.exec(id, { argv: ['sh', '-c', `dd if=/dev/urandom of=/root/cold bs=1M count=${o.cacheMiB} 2>/dev/null && sync && mkdir -p /dev/shm && dd if=/dev/urandom of=/dev/shm/hot bs=1M count=${o.shmMiB} 2>/dev/null && echo ok`] });
      if (Buffer.from(r.stdout_b64, 'base64').toString() !== 'ok\n') throw new Error(`sandbox ${id}: the write failed: ${Buffer.from(r.stderr_b64, 'base64').toString()}`);
      written += (await d.client.sandboxStats(id)).memory_bytes ?? 0;
      if (++nw % 100 === 0) process.stderr.write(`${mode}: ${nw}/${o.n} written\n`);
    }
    const t0 = performance.now();
    const series: Array<[number, number]> = [];
    while (performance.now() - t0 < (o.idleAfterS + 30) * 1000) {
      series.push([round((performance.now() - t0) / 1000), round((await charge(d, ids)) / MiB)]);
      await sleep(1000);
    }
    const before = round(written / MiB);
    const after = series.at(-1)![1];
    const drop = before - after;
    const info = await d.client.hostInfo();
    // Without a method nothing is reclaimed: what moves then is the kernel's own doing.
    const at90 = info.memory_reclaim?.method !== 'none' && drop > 0 ? series.find(([, m]) => before - m >= 0.9 * drop)?.[0] ?? null : null;
    const execTrue: number[] = [];
    const readBack: number[] = [];
    for (const id of ids) {
      let t = performance.now();
      await d.client.exec(id, { argv: ['true'] });
      execTrue.push(performance.now() - t);
      t = performance.now();
      await d.client.exec(id, { argv: ['sh', '-c', 'cat /root/cold > /dev/null'] });
      readBack.push(performance.now() - t);
    }
    const ms = (xs: number[]) => ({ p50: round(percentile(xs, 50)), max: round(Math.max(...xs)) });
    return {
      method: info.memory_reclaim?.method ?? 'unknown', before_mib: before, after_mib: after, series,
      reclaimed_mib: round((info.memory_reclaim?.reclaimed_bytes ?? 0) / MiB), seconds_to_90pct: at90,
      exec_true_ms: ms(execTrue), read_back_ms: ms(readBack),
    };
  } finally {
    await d.stop();
  }
}

const program = new Command('bench-host-reclaim')
  .option('--n <n>', 'idle sandboxes per run', (v) => parseInt(v, 10), 50)
  .option('--cache-mib <n>', 'page cache each sandbox writes and leaves', (v) => parseInt(v, 10), 32)
  .option('--shm-mib <n>', 'shared memory (tmpfs) each sandbox writes and leaves', (v) => parseInt(v, 10), 8)
  .option('--idle-after-s <n>', '[memory] idle_after_s of the "on" run', (v) => parseInt(v, 10), 5)
  .option('--memory-mib <n>', 'memory limit of each sandbox', (v) => parseInt(v, 10), 512);
program.parse();
const opts = program.opts<{ n: number; cacheMib: number; shmMib: number; idleAfterS: number; memoryMib: number }>();
const o = { n: opts.n, cacheMiB: opts.cacheMib, shmMiB: opts.shmMib, idleAfterS: opts.idleAfterS, memoryMiB: opts.memoryMib };
const off = await run('off', o);
const on = await run('aggressive', o);
const result = {
  n: o.n, cache_mib: o.cacheMiB, shm_mib: o.shmMiB, idle_after_s: o.idleAfterS, memory_mib: o.memoryMiB,
  host: { cpus: os.cpus().length, mem_total_mib: Math.round(os.totalmem() / MiB), kernel: os.release() },
  runs: { off, on },
  saving_pct: round((1 - on.after_mib / off.after_mib) * 100),
  cache_returned_pct: round(((on.before_mib - on.after_mib) / (o.n * o.cacheMiB)) * 100),
};
const text = JSON.stringify(result, null, 1);
writeFileSync(path.join(repoRoot(), 'bench/results-host-reclaim.json'), `${text}\n`);
process.stdout.write(`${text}\n`);
