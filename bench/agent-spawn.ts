/**
 * bench/agent-spawn: the agent's own exec start, without dsecd, HTTP or a container in the
 * path. Agent binaries (one or two builds) run as normal processes on the host on a fresh
 * listening socket each (test/fixtures/agent.ts), and Node drives sequential execs of
 * `/bin/true` straight at each over its Unix socket (AgentClient), rounds interleaved
 * A B B A A B ... so that a change is judged against its baseline on the same host at the
 * same time. Prints one JSON object:
 *
 *   { modes: { <mode>: { <agent>: { latency_ms: {p50, p90, p99}, cpu_ms_per_exec: {agent,
 *     children} , rounds: [p50...] } , ratio_p50: B/A } } }
 *
 * latency_ms: one exec round trip (EXEC sent to EXIT received), the median of the rounds'
 * percentiles. cpu_ms_per_exec: the agent's own utime+stime, and that of its reaped
 * children (cutime+cstime: the commands, and with a CLONE_VM child its work up to execve),
 * per exec over all rounds (jiffies: 10 ms resolution, fine over thousands of execs).
 * Modes: `plain` (the agent not Landlocked: each child raises its own oom_score_adj),
 * `landlock` (--landlock: the dsec-oom-adj helper raises each child) and `isolated`
 * (EXEC ISOLATE: each call in fresh namespaces under a forked namespace init, as an
 * fncall worker runs it; the agent holds CAP_SYS_ADMIN as root). Needs root (the agent
 * switches users and, isolated, mounts; as in the unit tests).
 *
 * Usage: node dist/bench/agent-spawn.js [--a PATH] [--b PATH] [--n 2000] [--rounds 4]
 *        [--modes plain,landlock,isolated]
 *   --a/--b: agent binaries (default: this checkout's native/agent/dsec-agent as A only).
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { AgentClient } from '../daemon/agent/client.js';
import { AGENT, spawnOnListenSocket } from '../test/fixtures/agent.js';
import { percentile } from './lib.js';

const round = (x: number, d = 3) => Math.round(x * 10 ** d) / 10 ** d;
/** USER_HZ of /proc/stat (100 on every Linux this runs on). */
const CLK_TCK_MS = 10;

/** [utime+stime, cutime+cstime] of a process in ms. */
function cpuMs(pid: number): [number, number] {
  const st = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
  return [(Number(f[11]) + Number(f[12])) * CLK_TCK_MS, (Number(f[13]) + Number(f[14])) * CLK_TCK_MS];
}

interface Round {
  p50: number;
  p90: number;
  p99: number;
  agentMs: number;
  childrenMs: number;
}

/** One round: start `bin` with `args`, warm up, n sequential execs of /bin/true, stop it. */
async function oneRound(bin: string, args: string[], n: number, isolate: boolean): Promise<Round> {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'dsec-agent-spawn-'));
  const p = await spawnOnListenSocket(dir, (stdio) => spawn(bin, ['--listen-fd', '3', ...args], { stdio }));
  const pid = p.child.pid!;
  try {
    const c = await AgentClient.connect(p.socketPath, { timeoutMs: 10_000 });
    const req = { argv: ['/bin/true'], env: ['PATH=/usr/bin:/bin'], maxOutputBytes: 1024, ...(isolate ? { isolate: {} } : {}) };
    for (let i = 0; i < 100; i++) await c.exec(req);
    const lat: number[] = [];
    const [a0, c0] = cpuMs(pid);
    for (let i = 0; i < n; i++) {
      const s = performance.now();
      const r = await c.exec(req);
      lat.push(performance.now() - s);
      if (r.kind !== 'exit' || r.exitCode !== 0) throw new Error(`exec /bin/true failed: ${JSON.stringify(r.kind === 'exit' ? r.exitCode : r.message)}`);
    }
    const [a1, c1] = cpuMs(pid);
    c.close();
    return { p50: percentile(lat, 50), p90: percentile(lat, 90), p99: percentile(lat, 99), agentMs: a1 - a0, childrenMs: c1 - c0 };
  } finally {
    p.child.kill('SIGTERM');
    await p.exited;
    rmSync(dir, { recursive: true, force: true });
  }
}

const median = (xs: number[]) => percentile(xs, 50);

async function main(): Promise<void> {
  const o = new Command()
    .option('--a <path>', 'agent binary A', AGENT)
    .option('--b <path>', 'agent binary B (optional)')
    .option('--n <n>', 'execs per round', '2000')
    .option('--rounds <n>', 'rounds per agent and mode', '4')
    .option('--modes <list>', 'plain,landlock,isolated', 'plain,landlock')
    .parse()
    .opts<{ a: string; b?: string; n: string; rounds: string; modes: string }>();
  const bins: Array<[string, string]> = [['A', o.a], ...(o.b ? [['B', o.b] as [string, string]] : [])];
  const n = Number(o.n);
  const out: Record<string, unknown> = { n, rounds: Number(o.rounds), agents: Object.fromEntries(bins), modes: {} };
  for (const mode of o.modes.split(',')) {
    const args = mode === 'landlock' ? ['--landlock'] : [];
    const rounds: Record<string, Round[]> = Object.fromEntries(bins.map(([k]) => [k, []]));
    for (let r = 0; r < Number(o.rounds); r++) {
      const order = r % 2 === 0 ? bins : [...bins].reverse();
      for (const [k, bin] of order) {
        const res = await oneRound(bin, args, n, mode === 'isolated');
        rounds[k].push(res);
        process.stderr.write(`${mode} round ${r} ${k}: p50 ${round(res.p50)} ms p99 ${round(res.p99)} ms agent ${res.agentMs} ms children ${res.childrenMs} ms\n`);
      }
    }
    const summary: Record<string, unknown> = {};
    for (const [k] of bins) {
      const rs = rounds[k];
      summary[k] = {
        latency_ms: { p50: round(median(rs.map((x) => x.p50))), p90: round(median(rs.map((x) => x.p90))), p99: round(median(rs.map((x) => x.p99))) },
        cpu_ms_per_exec: {
          agent: round(rs.reduce((s, x) => s + x.agentMs, 0) / (n * rs.length), 4),
          children: round(rs.reduce((s, x) => s + x.childrenMs, 0) / (n * rs.length), 4),
        },
        rounds_p50: rs.map((x) => round(x.p50)),
      };
    }
    if (bins.length === 2) {
      const pa = (summary.A as { latency_ms: { p50: number } }).latency_ms.p50;
      const pb = (summary.B as { latency_ms: { p50: number } }).latency_ms.p50;
      summary.ratio_p50_b_over_a = round(pb / pa);
    }
    (out.modes as Record<string, unknown>)[mode] = summary;
  }
  process.stdout.write(JSON.stringify(out, null, 2) + '\n');
}

main().catch((e) => {
  process.stderr.write(`${e instanceof Error ? e.stack : String(e)}\n`);
  process.exit(1);
});
