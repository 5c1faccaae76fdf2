/**
 * bench/fncall-agent: the agent side of the `fncall` tier. Calls of `/bin/true` driven
 * straight at one worker's agent from Node (AgentClient over its Unix socket; no dsecd,
 * no HTTP in the path), isolated (EXEC ISOLATE: fresh pid/mount/IPC/UTS namespaces per
 * call) against plain execs on the same worker, at several concurrencies. Prints one
 * JSON object:
 *
 *   { plain: { c1: {calls_per_s, latency_ms: {p50, p99}, cpu_ms_per_call: {...}}, c2, c8 },
 *     isolated: { ... }, ratio: { ... } }
 *
 * cpu_ms_per_call: host CPU time per call over the run (all of it), split into the
 * worker's cgroup (agent + the calls' processes, including namespace setup and the
 * teardown done on exit), the agent process alone, kernel threads (deferred work such as
 * freeing namespaces), this Node process (the client) and the rest of the host (other
 * users of this shared machine: a large value means a noisy run). On 2 cores 1,000
 * calls/s means at most 2 ms of host CPU per call in total. Jiffy resolution (10 ms) is
 * fine over thousands of calls.
 *
 * Setup: a throwaway dsecd (bench/lib.ts) makes an ordinary busybox sandbox with a CPU
 * limit of all the host's cores (`--cpus`; the default 1-core quota would cap a worker at
 * ~1/(CPU per call) calls/s); a worker
 * container (its spec with `worker: true`) runs beside it on the same rootfs
 * (test/fixtures/worker.ts), because dsecd does not create workers through its API yet.
 *
 * Usage: node dist/bench/fncall-agent.js [--calls 4000] [--concurrency 1,2,8] [--warmup 300]
 *        [--connections 1] [--argv /bin/true] [--no-callhost]
 *
 * --no-callhost: the worker's agent starts a namespace init per isolated call instead of
 * handing calls to call hosts (native/agent/callhost.h), for comparing the two.
 */
import { readdirSync, readFileSync } from 'node:fs';
import os from 'node:os';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { AgentClient } from '../daemon/agent/client.js';
import { startWorkerBeside, type WorkerContainer } from '../test/fixtures/worker.js';
import { percentile, tempDaemon } from './lib.js';

const round = (x: number, d = 2) => Math.round(x * 10 ** d) / 10 ** d;
/** USER_HZ of /proc/stat (100 on every Linux this runs on). */
const CLK_TCK_MS = 10;

/** Busy jiffies of the whole host (user+nice+system+irq+softirq+steal). */
function hostBusyMs(): number {
  const f = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
  return (f[0] + f[1] + f[2] + f[5] + f[6] + f[7]) * CLK_TCK_MS;
}

/** utime+stime of one process in ms (0 once it is gone). */
function procCpuMs(pid: number): number {
  try {
    const st = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) * CLK_TCK_MS;
  } catch {
    return 0;
  }
}

/** CPU time of every kernel thread (children of kthreadd, pid 2) in ms: kworkers doing deferred teardown. */
function kthreadCpuMs(): number {
  let sum = 0;
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const st = readFileSync(`/proc/${e}/stat`, 'utf8');
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
      if (f[1] === '2' || e === '2') sum += (Number(f[11]) + Number(f[12])) * CLK_TCK_MS;
    } catch { /* gone */ }
  }
  return sum;
}

/** CPU time of the worker's cgroup in ms (cpuacct.usage on v1, cpu.stat usage_usec on v2). */
async function workerCpuMs(w: WorkerContainer): Promise<number> {
  const st = await w.cgroups.stats(w.id);
  return st.cpuUsageNs / 1e6;
}

interface RunResult {
  calls: number;
  errors: number;
  calls_per_s: number;
  latency_ms: { p50: number; p90: number; p99: number; max: number };
  cpu_ms_per_call: { host: number; worker_cgroup: number; agent: number; kernel_threads: number; client_node: number; rest_of_host: number };
}

async function run(clients: AgentClient[], w: WorkerContainer, argv: string[], isolate: boolean, calls: number, concurrency: number): Promise<RunResult> {
  const lat: number[] = [];
  let errors = 0;
  let next = 0;
  const req = { argv, env: ['PATH=/usr/bin:/bin'], maxOutputBytes: 4096, ...(isolate ? { isolate: {} } : {}) };
  const h0 = hostBusyMs();
  const k0 = kthreadCpuMs();
  const a0 = procCpuMs(w.pid);
  const w0 = await workerCpuMs(w);
  const n0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async (_, k) => {
    const c = clients[k % clients.length];
    while (next < calls) {
      next++;
      const s = performance.now();
      const r = await c.exec(req);
      lat.push(performance.now() - s);
      if (r.kind !== 'exit' || r.exitCode !== 0) errors++;
    }
  }));
  const wall = (performance.now() - t0) / 1000;
  const n1 = process.cpuUsage(n0);
  const w1 = await workerCpuMs(w);
  const a1 = procCpuMs(w.pid);
  const k1 = kthreadCpuMs();
  const h1 = hostBusyMs();
  const per = (x: number) => round(x / calls, 3);
  const node = (n1.user + n1.system) / 1000;
  return {
    calls,
    errors,
    calls_per_s: round(calls / wall, 0),
    latency_ms: { p50: round(percentile(lat, 50), 3), p90: round(percentile(lat, 90), 3), p99: round(percentile(lat, 99), 3), max: round(Math.max(...lat), 2) },
    cpu_ms_per_call: {
      host: per(h1 - h0),
      worker_cgroup: per(w1 - w0),
      agent: per(a1 - a0),
      kernel_threads: per(k1 - k0),
      client_node: per(node),
      rest_of_host: per(Math.max(0, (h1 - h0) - (w1 - w0) - (k1 - k0) - node)),
    },
  };
}

async function main(): Promise<void> {
  const opts = new Command('fncall-agent')
    .option('--calls <n>', 'calls per measurement', '4000')
    .option('--concurrency <list>', 'calls in flight, comma-separated', '1,2,8')
    .option('--warmup <n>', 'calls before each measurement', '300')
    .option('--connections <n>', 'agent connections the calls are spread over', '1')
    .option('--argv <cmd>', 'command of each call (space-separated)', '/bin/true')
    .option('--cpus <n>', 'CPU limit of the worker, cores (default: all of the host)', String(os.cpus().length))
    .option('--modes <list>', 'plain, isolated or both (comma-separated)', 'plain,isolated')
    .option('--repeat <n>', 'measurements per mode and concurrency (reported: the median by calls/s)', '1')
    .option('--no-callhost', 'the worker agent runs --no-callhost: a namespace init per isolated call (the A/B control)')
    .parse(process.argv)
    .opts<{ calls: string; concurrency: string; warmup: string; connections: string; argv: string; repeat: string; cpus: string; modes: string; callhost: boolean }>();
  const calls = Number(opts.calls);
  const levels = opts.concurrency.split(',').map(Number);
  const warmup = Number(opts.warmup);
  const argv = opts.argv.split(' ');
  const modes = opts.modes.split(',');
  const ps0 = (m: Record<string, RunResult>) => Object.keys(m).length > 0;

  // Pool above the test slots' and create-exec's (slot 30): 16 Mi ids at 3 GiB + 31 × 32 Mi.
  const d = await tempDaemon('dsec-bench-fncall-', null);
  const result: Record<string, unknown> = {
    bench: 'fncall-agent',
    argv,
    calls_per_measurement: calls,
    connections: Number(opts.connections),
    callhost: opts.callhost,
    worker_cpus: Number(opts.cpus),
    host: { cores: os.cpus().length, kernel: os.release() },
  };
  try {
    // The worker may use every core (the default sandbox gets 1 core, whose CFS quota would
    // be the limit): fncall throughput is a per-host target.
    const sb = await d.client.createSandbox({ image: 'busybox', cpus: Number(opts.cpus) });
    const w = await startWorkerBeside(d.root, sb.id, `fncall-bench-${process.pid}`, {
      mutateSpec: (spec) => { if (!opts.callhost) (spec.process.args as string[]).push('--no-callhost'); },
    });
    try {
      const clients = await Promise.all(Array.from({ length: Number(opts.connections) }, () => AgentClient.connect(w.socketPath)));
      const plain: Record<string, RunResult> = {};
      const isolated: Record<string, RunResult> = {};
      const median = (rs: RunResult[]) => [...rs].sort((a, b) => a.calls_per_s - b.calls_per_s)[Math.floor(rs.length / 2)];
      for (const c of levels) {
        // Interleaved, so a drift of the host affects both modes alike.
        const ps: RunResult[] = [];
        const is: RunResult[] = [];
        for (let i = 0; i < Number(opts.repeat); i++) {
          if (modes.includes('plain')) {
            await run(clients, w, argv, false, warmup, c);
            ps.push(await run(clients, w, argv, false, calls, c));
          }
          if (modes.includes('isolated')) {
            await run(clients, w, argv, true, warmup, c);
            is.push(await run(clients, w, argv, true, calls, c));
          }
        }
        if (ps.length) plain[`c${c}`] = median(ps);
        if (is.length) isolated[`c${c}`] = median(is);
        process.stderr.write(`fncall-agent: c=${c} plain ${plain[`c${c}`]?.calls_per_s ?? '-'}/s isolated ${isolated[`c${c}`]?.calls_per_s ?? '-'}/s\n`);
      }
      for (const c of clients) c.close();
      result.plain = plain;
      result.isolated = isolated;
      if (ps0(plain) && ps0(isolated)) result.ratio = Object.fromEntries(levels.map((c) => [`c${c}`, {
        isolated_over_plain_calls_per_s: round(isolated[`c${c}`].calls_per_s / plain[`c${c}`].calls_per_s),
        isolated_minus_plain_p50_ms: round(isolated[`c${c}`].latency_ms.p50 - plain[`c${c}`].latency_ms.p50, 3),
        isolated_minus_plain_host_cpu_ms: round(isolated[`c${c}`].cpu_ms_per_call.host - plain[`c${c}`].cpu_ms_per_call.host, 3),
      }]));
      if (ps0(isolated)) result.target = { calls_per_s: 1000, met_by_isolated: Math.max(...levels.map((c) => isolated[`c${c}`].calls_per_s)) >= 1000 };
    } finally {
      await w.stop();
    }
  } finally {
    await d.stop();
  }
  process.stdout.write(JSON.stringify(result, null, 2) + '\n');
}

main().catch((e) => {
  process.stderr.write(`fncall-agent: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
