/**
 * `node dist/bench/ab.js --a DIR --b DIR`: two builds of dsec benchmarked in one
 * invocation, runs interleaved, so that a change (a refactor, an optimisation) is judged
 * against its own baseline on the same host at the same time rather than against numbers
 * of another day (this VM's speed varies several-fold between days: docs/BENCHMARKS.md).
 *
 * Each DIR is a built checkout (dist/, native/). A run is `node DIR/dist/bench/all.js
 * --only SECTIONS --no-doc --no-podman ...` of that build, with its own dsecds; its JSON
 * is read from DIR/bench/results-all.local.json. Runs go A B B A A B ... (each build first
 * in half of the pairs) so neither always meets a warmer or colder host. Reported per
 * metric: each build's median over its runs, every sample, and the ratio B/A of the
 * medians (for a rate, above 1 is better for B; for a latency, below 1).
 *
 * Metrics (those the sections produce; ms are create→first exec or round-trip latencies):
 *   burst: pool-empty and pool-prefilled ready/s and p50/p99 ms;  exec: API exec p50/p99 ms;
 *   and dsecd's own CPU ms per ready sandbox and per exec (`/proc/PID/stat`), the measure a
 *   loaded host moves least (a metric one build's bench lacks is left out).
 *
 * Usage: node dist/bench/ab.js --a DIR --b DIR [--runs 5] [--only burst,exec] [--n 300]
 *   [--concurrency 16] [--out FILE]
 * Writes the result JSON to --out (default bench/results-ab.local.json) and prints a table.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Command } from 'commander';
import { execa } from 'execa';
import { percentile } from './lib.js';

/** A metric: where it is in all.ts's JSON, and whether more is better. */
interface Metric {
  name: string;
  path: string[];
  higherIsBetter: boolean;
}

/** The burst and exec rows of docs/BENCHMARKS.md, as all.ts's JSON holds them. */
const METRICS: Metric[] = [
  { name: 'burst pool empty ready/s', path: ['burst', 'pool_empty', 'ready_per_s'], higherIsBetter: true },
  { name: 'burst pool empty p50 ms', path: ['burst', 'pool_empty', 'create_to_first_exec_ms', 'p50'], higherIsBetter: false },
  { name: 'burst pool empty p99 ms', path: ['burst', 'pool_empty', 'create_to_first_exec_ms', 'p99'], higherIsBetter: false },
  { name: 'burst pre-filled ready/s', path: ['burst', 'pool_prefilled', 'ready_per_s'], higherIsBetter: true },
  { name: 'burst pre-filled p50 ms', path: ['burst', 'pool_prefilled', 'create_to_first_exec_ms', 'p50'], higherIsBetter: false },
  { name: 'burst pre-filled p99 ms', path: ['burst', 'pool_prefilled', 'create_to_first_exec_ms', 'p99'], higherIsBetter: false },
  { name: 'exec true p50 ms', path: ['exec', 'dsec_api', 'p50'], higherIsBetter: false },
  { name: 'exec true p99 ms', path: ['exec', 'dsec_api', 'p99'], higherIsBetter: false },
  // dsecd's own CPU per operation: what a refactor changes, and what a busy shared host
  // (whose load moves wall-clock rates several-fold between runs) changes least.
  { name: 'burst pool empty dsecd CPU ms/sandbox', path: ['burst', 'pool_empty', 'dsecd_cpu_ms_per_sandbox'], higherIsBetter: false },
  { name: 'burst pre-filled dsecd CPU ms/sandbox', path: ['burst', 'pool_prefilled', 'dsecd_cpu_ms_per_sandbox'], higherIsBetter: false },
  { name: 'exec true dsecd CPU ms/exec', path: ['exec', 'dsecd_cpu_ms_per_exec'], higherIsBetter: false },
];

/** The value at `p` in `o`, or undefined. */
function at(o: unknown, p: string[]): number | undefined {
  let v: unknown = o;
  for (const k of p) v = v && typeof v === 'object' ? (v as Record<string, unknown>)[k] : undefined;
  return typeof v === 'number' ? v : undefined;
}

/** One run of `dir`'s bench; returns its JSON. @throws Error when the run fails. */
async function runOnce(dir: string, args: string[]): Promise<unknown> {
  const r = await execa(process.execPath, [path.join(dir, 'dist/bench/all.js'), ...args], { cwd: dir, reject: false, stdout: 'inherit', stderr: 'inherit' });
  if (r.exitCode !== 0) throw new Error(`bench of ${dir} exited with ${r.exitCode}`);
  return JSON.parse(readFileSync(path.join(dir, 'bench/results-all.local.json'), 'utf8'));
}

async function main(): Promise<void> {
  const o = new Command()
    .requiredOption('--a <dir>', 'baseline build (a built checkout)')
    .requiredOption('--b <dir>', 'build under test (a built checkout)')
    .option('--runs <n>', 'runs of each build', '5')
    .option('--only <list>', 'sections of all.ts', 'burst,exec')
    .option('--n <n>', 'burst size', '300')
    .option('--concurrency <n>', 'burst concurrency', '16')
    .option('--out <file>', 'result JSON', 'bench/results-ab.local.json')
    .parse()
    .opts();
  const runs = Number(o.runs);
  const args = ['--only', o.only, '--no-doc', '--no-podman', '--n', o.n, '--concurrency', o.concurrency];
  const builds = { a: path.resolve(o.a), b: path.resolve(o.b) };
  const samples: Record<'a' | 'b', unknown[]> = { a: [], b: [] };
  for (let i = 0; i < runs; i++) {
    // A B, B A, A B, ...: each build goes first in half of the pairs.
    const order: ('a' | 'b')[] = i % 2 === 0 ? ['a', 'b'] : ['b', 'a'];
    for (const k of order) {
      process.stderr.write(`ab: run ${i + 1}/${runs} of ${k} (${builds[k]})\n`);
      samples[k].push(await runOnce(builds[k], args));
    }
  }
  const rows = METRICS.map((m) => {
    const xa = samples.a.map((s) => at(s, m.path)).filter((x): x is number => x !== undefined);
    const xb = samples.b.map((s) => at(s, m.path)).filter((x): x is number => x !== undefined);
    if (!xa.length || !xb.length) return null;
    const ma = percentile(xa, 50), mb = percentile(xb, 50);
    return { metric: m.name, higher_is_better: m.higherIsBetter, a_median: ma, b_median: mb, ratio_b_over_a: Math.round((mb / ma) * 1000) / 1000, a: xa, b: xb };
  }).filter((r) => r !== null);
  const result = { at: new Date().toISOString(), a: builds.a, b: builds.b, runs, args, rows };
  writeFileSync(o.out, JSON.stringify(result, null, 2) + '\n');
  for (const r of rows) {
    process.stdout.write(`${r.metric.padEnd(40)} A ${String(Math.round(r.a_median * 100) / 100).padStart(8)}  B ${String(Math.round(r.b_median * 100) / 100).padStart(8)}  B/A ${r.ratio_b_over_a}\n`);
  }
}

main().catch((e) => {
  process.stderr.write(`ab: ${(e as Error).message}\n`);
  process.exit(1);
});
