/**
 * What sandbox networking adds: create latency (client-side, sequential creates, each
 * destroyed before the next) of mode none against allow (two CIDR rules) and open, and
 * the exec round trip of `true` in a none sandbox against an allow sandbox (the egress
 * programs act on socket calls only, so exec should not change). Prints JSON.
 *
 *   node dist/bench/network.js [--creates N] [--execs N]
 *
 * The first allow/open create brings up the instance netns, slirp4netns and the resolver;
 * it is done (and not counted) before the measured rounds. Modes are interleaved per
 * round so drift of the host affects all alike.
 */
import { percentile, tempDaemon } from './lib.js';

/** Mode none, allow and open requests measured. */
const MODES = {
  none: undefined,
  allow: { mode: 'allow' as const, allow: [{ cidr: '198.51.100.0/24', ports: [443] }, { cidr: '203.0.113.0/24', ports: ['8000-8080'] }] },
  open: { mode: 'open' as const },
};

async function main(): Promise<void> {
  const arg = (name: string, dflt: number) => {
    const i = process.argv.indexOf(name);
    return i > 0 ? Number(process.argv[i + 1]) : dflt;
  };
  const creates = arg('--creates', 40);
  const execs = arg('--execs', 300);
  // A pool at 512 MiB, below the test slots (1 GiB and up) and the other benchmarks' pools.
  const d = await tempDaemon('dsec-bench-net-', null);
  try {
    const warm = await d.client.createSandbox({ network: MODES.open });
    await d.client.deleteSandbox(warm.id, { force: true });
    const times: Record<keyof typeof MODES, number[]> = { none: [], allow: [], open: [] };
    for (let i = 0; i < creates; i++) {
      for (const m of Object.keys(MODES) as (keyof typeof MODES)[]) {
        const t0 = performance.now();
        const sb = await d.client.createSandbox(MODES[m] ? { network: MODES[m] } : {});
        times[m].push(performance.now() - t0);
        await d.client.deleteSandbox(sb.id, { force: true });
      }
    }
    const ex: Record<'none' | 'allow', number[]> = { none: [], allow: [] };
    const sbs = { none: await d.client.createSandbox({}), allow: await d.client.createSandbox({ network: MODES.allow }) };
    for (let i = 0; i < execs; i++) {
      for (const m of ['none', 'allow'] as const) {
        const t0 = performance.now();
        await d.client.exec(sbs[m].id, { argv: ['true'] });
        ex[m].push(performance.now() - t0);
      }
    }
    const r3 = (x: number) => Math.round(x * 1000) / 1000;
    const summary = (xs: number[]) => ({ p50_ms: r3(percentile(xs, 50)), p90_ms: r3(percentile(xs, 90)), p99_ms: r3(percentile(xs, 99)) });
    const out = {
      benchmark: 'network',
      creates_per_mode: creates,
      create: { none: summary(times.none), allow: summary(times.allow), open: summary(times.open) },
      added_p50_ms: { allow: r3(percentile(times.allow, 50) - percentile(times.none, 50)), open: r3(percentile(times.open, 50) - percentile(times.none, 50)) },
      execs_per_mode: execs,
      exec_true: { none: summary(ex.none), allow: summary(ex.allow) },
    };
    process.stdout.write(JSON.stringify(out, null, 2) + '\n');
  } finally {
    await d.stop();
  }
}

void main().catch((e) => {
  process.stderr.write(`${(e as Error).stack}\n`);
  process.exit(1);
});
