/**
 * bench/python: the Python client (sdk/python, issue 24) against the TypeScript SDK, same
 * dsecd, same sandbox, same run. One temporary dsecd (Unix socket) and one busybox sandbox:
 * - exec `true` round trip, sequential: TypeScript SDK, then Python `dsec.Client` and
 *   `dsec.AsyncClient` (bench/python-client.py, Debian's python3), then the TypeScript SDK
 *   again (its samples are the union of both blocks, so both languages see the same load);
 * - 64-way concurrency: wall time of a round of 64 concurrent exec `true` (Promise.all /
 *   asyncio.gather from one loop), as p50/p99 over rounds and execs per second.
 * Prints one JSON object; `ratio` is Python / TypeScript.
 *
 * Usage: node dist/bench/python.js [--exec-repeats 500] [--rounds 20]
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { execa } from 'execa';
import type { DsecClient } from '../sdk/client.js';
import { repoRoot } from '../daemon/startup/host.js';
import { percentile, tempDaemon } from './lib.js';

const round = (x: number) => Math.round(x * 100) / 100;
const pct = (xs: number[]) => ({ p50: round(percentile(xs, 50)), p99: round(percentile(xs, 99)) });
/** Execs per second of rounds of 64 that took `ms` each. */
const rate = (ms: number[]) => round((64 * ms.length) / (ms.reduce((a, b) => a + b, 0) / 1000));

/** `k` sequential exec `true` round trips through the TypeScript SDK, ms each. */
async function tsSequential(c: DsecClient, id: string, k: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < k; i++) {
    const s = performance.now();
    await c.exec(id, { argv: ['true'] });
    out.push(performance.now() - s);
  }
  return out;
}

/** `rounds` rounds of 64 concurrent exec `true` through the TypeScript SDK, wall ms each. */
async function tsWide(c: DsecClient, id: string, rounds: number): Promise<number[]> {
  const out: number[] = [];
  for (let r = 0; r < rounds; r++) {
    const s = performance.now();
    await Promise.all(Array.from({ length: 64 }, () => c.exec(id, { argv: ['true'] })));
    out.push(performance.now() - s);
  }
  return out;
}

/** Runs the benchmark and returns its result object. */
export async function runPython(o: { execRepeats: number; rounds: number }): Promise<Record<string, unknown>> {
  const python = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
  const d = await tempDaemon('dsec-bench-python-', null);
  try {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    await tsSequential(d.client, sb.id, 50);
    await tsWide(d.client, sb.id, 2);
    const half = Math.ceil(o.execRepeats / 2);
    const tsSeq = await tsSequential(d.client, sb.id, half);
    const tsW = await tsWide(d.client, sb.id, Math.ceil(o.rounds / 2));
    const env: Record<string, string> = {};
    for (const [k, v] of Object.entries(process.env)) if (v !== undefined && !k.startsWith('DSEC_')) env[k] = v;
    const py = await execa(python, [path.join(repoRoot(), 'bench', 'python-client.py'), sb.id, String(o.execRepeats), String(o.rounds)], {
      env: { ...env, DSEC_SOCKET: path.join(d.root, 'dsecd.sock') }, extendEnv: false,
    });
    const p = JSON.parse(py.stdout) as { python: string; sync_exec_true_ms: number[]; async_exec_true_ms: number[]; async_64_ms: number[] };
    tsSeq.push(...(await tsSequential(d.client, sb.id, o.execRepeats - half)));
    tsW.push(...(await tsWide(d.client, sb.id, o.rounds - Math.ceil(o.rounds / 2))));
    await d.client.deleteSandbox(sb.id, { force: true });
    const ts = { exec_true_ms: pct(tsSeq), wide64_round_ms: pct(tsW), wide64_execs_per_s: rate(tsW) };
    const pySync = { exec_true_ms: pct(p.sync_exec_true_ms) };
    const pyAsync = { exec_true_ms: pct(p.async_exec_true_ms), wide64_round_ms: pct(p.async_64_ms), wide64_execs_per_s: rate(p.async_64_ms) };
    return {
      bench: 'python', python: p.python, exec_repeats: o.execRepeats, rounds_of_64: o.rounds,
      typescript: ts, python_sync: pySync, python_async: pyAsync,
      ratio: {
        sync_exec_true_p50: round(pySync.exec_true_ms.p50 / ts.exec_true_ms.p50),
        async_exec_true_p50: round(pyAsync.exec_true_ms.p50 / ts.exec_true_ms.p50),
        wide64_round_p50: round(pyAsync.wide64_round_ms.p50 / ts.wide64_round_ms.p50),
      },
    };
  } finally {
    await d.stop();
  }
}

async function main(): Promise<void> {
  const opts = new Command('python')
    .option('--exec-repeats <k>', 'timed sequential execs of `true` per client', '500')
    .option('--rounds <r>', 'timed rounds of 64 concurrent execs per client', '20')
    .parse(process.argv)
    .opts<{ execRepeats: string; rounds: string }>();
  const r = await runPython({ execRepeats: Number(opts.execRepeats), rounds: Number(opts.rounds) });
  process.stdout.write(JSON.stringify(r, null, 2) + '\n');
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(new URL(import.meta.url).pathname)) {
  main().catch((e) => {
    process.stderr.write(`python: ${(e as Error).stack ?? e}\n`);
    process.exit(1);
  });
}
