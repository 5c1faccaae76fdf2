/**
 * bench/priority: does a batch sandbox stay out of a latency sandbox's way?
 *
 * Exec round trip of `true` through the API in one latency sandbox, N times in a row
 * (p50 / p99), in three situations on the same daemon:
 *   (a) alone;
 *   (b) beside a batch sandbox (`priority: 'batch'`) running B CPU burners
 *       (`sh -c 'while :; do :; done' &` × B, default 2 = every core here);
 *   (c) beside the same burners in a latency sandbox (the default priority).
 * For (b) and (c) it also reports how much CPU the burners got while the execs ran
 * (cores), so the latency bought in (b) is seen next to the throughput batch work keeps,
 * the host's total busy CPU (background load included), and how long the latency
 * sandbox's agent and dsecd sat runnable waiting for a CPU per exec (schedstat).
 * (d) runs both burner sets at once, without execs, and reports how the CPU is split
 * between the batch and the latency sandbox.
 *
 * If the daemon does not actually run batch sandboxes as SCHED_IDLE (an older create
 * API without `priority`, or a driver that does not pass it to the spec), the bench says
 * so (`batch_mode: "host-chrt"`) and emulates (b) by switching the burners to SCHED_IDLE
 * from the host with `chrt --idle -p 0 PID` — the task policy only, without the cgroup's
 * cpu.shares 2. With a daemon that does (`batch_mode: "api"`), nothing is emulated.
 *
 * Usage (root): node dist/bench/priority.js [--n 300] [--rounds 3] [--burners 2] [--settle-ms 1000] [--socket PATH]
 * Without --socket it starts its own dsecd on a temporary root and removes it after.
 * Prints one JSON object.
 */
import { readdirSync, readFileSync } from 'node:fs';
import os from 'node:os';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { execa } from 'execa';
import { DsecClient } from '../sdk/client.js';
import { percentile, tempDaemon } from './lib.js';
import { readSchedPolicy, SCHED_POLICY } from '../daemon/host/sched.js';

const round = (x: number) => Math.round(x * 1000) / 1000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));


/** Host pids whose parent is `ppid` and whose command line contains `needle`. */
function childrenMatching(ppid: number, needle: string): number[] {
  const out: number[] = [];
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const st = readFileSync(`/proc/${e}/stat`, 'utf8');
      const parent = Number(st.slice(st.lastIndexOf(')') + 2).split(' ')[1]);
      if (parent !== ppid) continue;
      if (readFileSync(`/proc/${e}/cmdline`, 'utf8').includes(needle)) out.push(Number(e));
    } catch { /* gone */ }
  }
  return out.sort((a, b) => a - b);
}

/** utime + stime of a process, in seconds (clock ticks / 100). */
function cpuSeconds(pid: number): number {
  try {
    const st = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / 100; // fields 14, 15; USER_HZ is 100 on Linux
  } catch {
    return 0;
  }
}

const BURNER = 'while :; do :; done';

/**
 * Starts `n` CPU burners in sandbox `id` (as `sh -c 'while :; do :; done' &`, output to
 * /dev/null so the exec returns) and returns their host pids: they are orphaned to the
 * agent, whose host pid is `initPid`.
 */
async function startBurners(client: DsecClient, id: string, initPid: number, n: number): Promise<number[]> {
  const script = Array.from({ length: n }, () => `sh -c '${BURNER}' >/dev/null 2>&1 &`).join(' ');
  const r = await client.exec(id, { argv: ['sh', '-c', script] });
  if (r.exit_code !== 0) throw new Error(`starting burners failed: ${r.stderr.toString()}`);
  const deadline = Date.now() + 10_000;
  for (;;) {
    const pids = childrenMatching(initPid, BURNER);
    if (pids.length === n) return pids;
    if (Date.now() > deadline) throw new Error(`expected ${n} burners under pid ${initPid}, found ${pids.length}`);
    await sleep(20);
  }
}

function killAll(pids: number[]): void {
  for (const p of pids) {
    try { process.kill(p, 'SIGKILL'); } catch { /* gone */ }
  }
}

/** `n` sequential execs of `true` in `id`; round trip times in ms. */
async function execLoop(client: DsecClient, id: string, n: number): Promise<number[]> {
  const lat: number[] = [];
  for (let i = 0; i < n; i++) {
    const s = performance.now();
    const r = await client.exec(id, { argv: ['true'] });
    lat.push(performance.now() - s);
    if (r.exit_code !== 0) throw new Error(`exec true failed in ${id}`);
  }
  return lat;
}

function summary(lat: number[]) {
  return {
    p50: round(percentile(lat, 50)),
    p99: round(percentile(lat, 99)),
    mean: round(lat.reduce((a, b) => a + b, 0) / lat.length),
    max: round(Math.max(...lat)),
    samples: lat.length,
  };
}

/** Time a task has spent runnable but waiting for a CPU (schedstat run_delay), in µs; 0 if unreadable. */
function runDelayUs(pid: number): number {
  try {
    return Number(readFileSync(`/proc/${pid}/schedstat`, 'utf8').split(' ')[1]) / 1000;
  } catch {
    return 0;
  }
}

/** Busy CPU time of the whole host so far (all but idle and iowait), in seconds, from /proc/stat. */
function hostBusySeconds(): number {
  const f = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
  const total = f.reduce((a, b) => a + b, 0);
  return (total - f[3] - f[4]) / 100; // idle, iowait; USER_HZ 100
}

/** A sandbox that runs the burners in case b or c. */
interface BurnerSandbox {
  id: string;
  initPid: number;
  priority: 'batch' | 'latency';
  /** The create API accepted `priority`. */
  apiAccepted: boolean;
  /** Policy of its init (the agent) as the daemon started it. */
  initPolicy: number | null;
}

/** Samples and CPU accounting of one case, over all rounds. */
interface CaseAcc {
  lat: number[];
  wall: number;
  burnerCpu: number;
  hostBusy: number;
  /** run_delay accumulated by the latency sandbox's agent and by dsecd (its main thread), µs. */
  agentWait: number;
  dsecdWait: number;
  burnerPolicy?: number | null;
}

async function main(): Promise<void> {
  const opts = new Command('priority')
    .option('--n <n>', 'sequential execs of `true` per case (split over the rounds)', '300')
    .option('--rounds <r>', 'rounds; each runs a, b, c in turn, so drift in the host\'s background load hits all three alike', '3')
    .option('--burners <b>', 'CPU burners beside the latency sandbox', String(os.cpus().length))
    .option('--settle-ms <ms>', 'let the burners run this long before measuring', '1000')
    .option('--socket <path>', 'use a running dsecd instead of a temporary one')
    .parse(process.argv)
    .opts<{ n: string; rounds: string; burners: string; settleMs: string; socket?: string }>();
  const n = Number(opts.n);
  const rounds = Math.max(1, Number(opts.rounds));
  const b = Number(opts.burners);
  const settle = Number(opts.settleMs);
  const perRound = (r: number) => Math.floor(n / rounds) + (r < n % rounds ? 1 : 0);

  const d: { client: DsecClient; stop: () => Promise<void>; pid?: number } = opts.socket
    ? { client: new DsecClient({ socketPath: opts.socket }), stop: async () => {} }
    : await tempDaemon('dsec-bench-prio-', null);
  const client = d.client;
  const cleanup: (() => Promise<void>)[] = [];
  const live: number[] = [];
  const result: Record<string, unknown> = {
    bench: 'priority',
    n,
    rounds,
    burners: b,
    host: { cores: os.cpus().length, kernel: os.release() },
  };
  try {
    const lat = await client.createSandbox({ image: 'busybox' });
    cleanup.push(() => client.deleteSandbox(lat.id, { force: true }).then(() => {}));
    await execLoop(client, lat.id, 30); // warm-up: code paths JIT-compiled, agent paged in

    // The burners' sandboxes, created once. A CPU limit of one core per burner (at most
    // every core), so the burners can fill the host (the default limit is 1 core).
    const cpus = Math.min(b, os.cpus().length);
    const makeBurnerSandbox = async (priority: 'batch' | 'latency'): Promise<BurnerSandbox> => {
      let sb: Awaited<ReturnType<typeof client.createSandbox>>;
      let apiAccepted = true;
      try {
        sb = await client.createSandbox({ image: 'busybox', cpus, priority } as Parameters<typeof client.createSandbox>[0]);
      } catch (e) {
        // A daemon whose create API lacks `priority` refuses the unknown field.
        if ((e as { code?: string }).code !== 'InvalidArgument' || !/priority/.test((e as Error).message)) throw e;
        apiAccepted = false;
        sb = await client.createSandbox({ image: 'busybox', cpus });
      }
      cleanup.push(() => client.deleteSandbox(sb.id, { force: true }).then(() => {}));
      return { id: sb.id, initPid: sb.init_pid!, priority, apiAccepted, initPolicy: readSchedPolicy(sb.init_pid!) };
    };
    const batchSb = await makeBurnerSandbox('batch');
    const latencySb = await makeBurnerSandbox('latency');
    const batchMode = batchSb.initPolicy === SCHED_POLICY.IDLE ? 'api' : 'host-chrt';

    const acc: Record<'a' | 'b' | 'c', CaseAcc> = {
      a: { lat: [], wall: 0, burnerCpu: 0, hostBusy: 0, agentWait: 0, dsecdWait: 0 },
      b: { lat: [], wall: 0, burnerCpu: 0, hostBusy: 0, agentWait: 0, dsecdWait: 0 },
      c: { lat: [], wall: 0, burnerCpu: 0, hostBusy: 0, agentWait: 0, dsecdWait: 0 },
    };
    /** Measures `k` execs into `into`, with `burners` (host pids) running. */
    const measure = async (into: CaseAcc, k: number, burners: number[]) => {
      const cpu0 = burners.reduce((x, p) => x + cpuSeconds(p), 0);
      const busy0 = hostBusySeconds();
      const aw0 = runDelayUs(lat.init_pid!);
      const dw0 = d.pid ? runDelayUs(d.pid) : 0;
      const t0 = performance.now();
      into.lat.push(...(await execLoop(client, lat.id, k)));
      into.wall += (performance.now() - t0) / 1000;
      into.hostBusy += hostBusySeconds() - busy0;
      into.agentWait += runDelayUs(lat.init_pid!) - aw0;
      if (d.pid) into.dsecdWait += runDelayUs(d.pid) - dw0;
      into.burnerCpu += burners.reduce((x, p) => x + cpuSeconds(p), 0) - cpu0;
    };
    const withBurners = async (sb: BurnerSandbox, into: CaseAcc, k: number) => {
      const burners = await startBurners(client, sb.id, sb.initPid, b);
      live.push(...burners);
      try {
        if (sb.priority === 'batch' && batchMode === 'host-chrt') {
          for (const p of burners) await execa('chrt', ['--idle', '-p', '0', String(p)]);
        }
        const want = sb.priority === 'batch' ? SCHED_POLICY.IDLE : SCHED_POLICY.OTHER;
        const policies = burners.map((p) => readSchedPolicy(p));
        if (policies.some((p) => p !== want)) throw new Error(`burner policies ${policies.join(',')} in ${sb.priority} sandbox (wanted ${want})`);
        into.burnerPolicy = policies[0];
        await sleep(settle);
        await measure(into, k, burners);
      } finally {
        killAll(burners);
        live.splice(0);
      }
    };
    for (let r = 0; r < rounds; r++) {
      await measure(acc.a, perRound(r), []);
      await withBurners(batchSb, acc.b, perRound(r));
      await withBurners(latencySb, acc.c, perRound(r));
    }

    // (d) Both burner sets at once, no execs: how the CPU the two sandboxes get together
    // is split between them (cpu.shares 2 + SCHED_IDLE against 1024 + SCHED_OTHER).
    const split = { batch_burner_cores: 0, latency_burner_cores: 0, seconds: 0 };
    {
      const bp = await startBurners(client, batchSb.id, batchSb.initPid, b);
      live.push(...bp);
      if (batchMode === 'host-chrt') for (const p of bp) await execa('chrt', ['--idle', '-p', '0', String(p)]);
      const lp = await startBurners(client, latencySb.id, latencySb.initPid, b);
      live.push(...lp);
      try {
        await sleep(settle);
        const b0 = bp.reduce((x, p) => x + cpuSeconds(p), 0);
        const l0 = lp.reduce((x, p) => x + cpuSeconds(p), 0);
        const t0 = performance.now();
        await sleep(3000);
        const wall = (performance.now() - t0) / 1000;
        split.batch_burner_cores = round((bp.reduce((x, p) => x + cpuSeconds(p), 0) - b0) / wall);
        split.latency_burner_cores = round((lp.reduce((x, p) => x + cpuSeconds(p), 0) - l0) / wall);
        split.seconds = round(wall);
      } finally {
        killAll(live);
        live.splice(0);
      }
    }

    const report = (c: CaseAcc) => ({
      exec_true_ms: summary(c.lat),
      /** CPU the whole host was busy with while the execs ran (background load included), in cores. */
      host_busy_cores: round(c.hostBusy / c.wall),
      /** Mean time per exec the latency sandbox's agent, and dsecd's main thread, sat runnable waiting for a CPU. */
      wait_for_cpu_us_per_exec: {
        agent: round(c.agentWait / c.lat.length),
        dsecd: d.pid ? round(c.dsecdWait / c.lat.length) : null,
      },
    });
    const burnerReport = (c: CaseAcc, sb: BurnerSandbox, mode: string) => ({
      ...report(c),
      burner_cpu_cores: round(c.burnerCpu / c.wall),
      burner_sandbox: { priority: sb.priority, api_accepted_priority: sb.apiAccepted, init_policy: sb.initPolicy, burner_policy: c.burnerPolicy, mode },
    });
    const a = summary(acc.a.lat);
    const bb = summary(acc.b.lat);
    const cc = summary(acc.c.lat);
    result.batch_mode = batchMode;
    if (batchMode === 'host-chrt') {
      result.note = 'the daemon did not run the batch sandbox as SCHED_IDLE (its init has policy ' + batchSb.initPolicy + '; create API '
        + (batchSb.apiAccepted ? 'accepted `priority` but the driver did not apply it' : 'has no `priority`')
        + '): case b switched the burners to SCHED_IDLE from the host with `chrt --idle -p 0 PID`; that sandbox\'s cgroup kept the default cpu.shares';
    }
    result.a_alone = report(acc.a);
    result.b_beside_batch_burners = burnerReport(acc.b, batchSb, batchMode);
    result.c_beside_latency_burners = burnerReport(acc.c, latencySb, 'latency');
    result.d_batch_and_latency_burners_together = split;
    result.ratio = {
      b_over_a_p50: round(bb.p50 / a.p50),
      b_over_a_p99: round(bb.p99 / a.p99),
      c_over_a_p50: round(cc.p50 / a.p50),
      c_over_a_p99: round(cc.p99 / a.p99),
      c_over_b_p50: round(cc.p50 / bb.p50),
      c_over_b_p99: round(cc.p99 / bb.p99),
    };
  } finally {
    killAll(live);
    for (const f of cleanup.reverse()) await f().catch(() => {});
    await d.stop();
  }
  process.stdout.write(JSON.stringify(result, null, 2) + '\n');
}

main().catch((e) => {
  process.stderr.write(`priority: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
