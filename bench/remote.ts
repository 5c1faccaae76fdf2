/**
 * bench/remote: the cost of the TCP door (issue 19). One temporary dsecd serving both its
 * Unix socket and `--listen` on loopback; the same SDK calls over each, in the same run:
 * - exec `true` round trip (POST /exec in one sandbox, sequential), in alternating blocks
 *   so both transports see the same host load;
 * - create → first exec (create a busybox sandbox, exec `true`), N per transport at
 *   concurrency C, destroys not timed.
 * Prints one JSON object: `{unix: {...}, tls: {...}, ratio: {...}}` (ratio = tls / unix).
 *
 * Usage: node dist/bench/remote.js [--n 50] [--concurrency 4] [--exec-repeats 1000]
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { DsecClient } from '../sdk/client.js';
import { percentile, tempDaemon } from './lib.js';
import { freePort } from '../test/fixtures/ports.js';

const round = (x: number) => Math.round(x * 100) / 100;
const pct = (xs: number[]) => ({ p50: round(percentile(xs, 50)), p99: round(percentile(xs, 99)) });


/** Runs `fn(i)` for i in [0, n) with at most `c` in flight. */
async function pool(n: number, c: number, fn: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(c, n) }, async () => {
    while (next < n) await fn(next++);
  }));
}

/** N creates → first exec at concurrency c through `client`; destroys after, untimed. */
async function createExec(client: DsecClient, n: number, c: number): Promise<{ create_to_first_exec_ms: { p50: number; p99: number }; creations_per_s: number }> {
  const lat: number[] = [];
  const ids: string[] = [];
  const t0 = performance.now();
  await pool(n, c, async () => {
    const s = performance.now();
    const sb = await client.createSandbox({ image: 'busybox' });
    await client.exec(sb.id, { argv: ['true'] });
    lat.push(performance.now() - s);
    ids.push(sb.id);
  });
  const wall = performance.now() - t0;
  await pool(ids.length, c, async (i) => {
    await client.deleteSandbox(ids[i], { force: true });
  });
  return { create_to_first_exec_ms: pct(lat), creations_per_s: round((n / wall) * 1000) };
}

/** Runs the benchmark and returns its result object. */
export async function runRemote(o: { n: number; concurrency: number; execRepeats: number }): Promise<Record<string, unknown>> {
  const port = await freePort();
  const d = await tempDaemon('dsec-bench-remote-', null, `[remote]\nlisten = "127.0.0.1:${port}"\n`);
  try {
    const { token } = await d.client.createToken({ tenant: 'bench', role: 'admin' });
    // The door (and its CA) comes up right after the socket: wait until it answers.
    let tls: DsecClient;
    for (let i = 0; ; i++) {
      try {
        tls = new DsecClient({ remote: { url: `https://127.0.0.1:${port}`, token, ca: readFileSync(path.join(d.root, 'tls', 'ca.crt')) }, timeoutMs: 120_000 });
        await tls.version();
        break;
      } catch (e) {
        if (i > 200) throw e;
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    const sb = await d.client.createSandbox({ image: 'busybox' });
    const viaUnix: number[] = [], viaTls: number[] = [];
    // Warm-up on both (connections, JIT), then alternating blocks of 50.
    for (let i = 0; i < 50; i++) {
      await d.client.exec(sb.id, { argv: ['true'] });
      await tls.exec(sb.id, { argv: ['true'] });
    }
    for (let done = 0; done < o.execRepeats; done += 50) {
      for (const [client, out] of [[d.client, viaUnix], [tls, viaTls]] as const) {
        for (let i = 0; i < 50; i++) {
          const s = performance.now();
          await client.exec(sb.id, { argv: ['true'] });
          out.push(performance.now() - s);
        }
      }
    }
    await d.client.deleteSandbox(sb.id, { force: true });
    const unixCreate = await createExec(d.client, o.n, o.concurrency);
    const tlsCreate = await createExec(tls, o.n, o.concurrency);
    tls.close();
    const unix = { exec_true_ms: pct(viaUnix), ...unixCreate };
    const over = { exec_true_ms: pct(viaTls), ...tlsCreate };
    return {
      bench: 'remote', n: o.n, concurrency: o.concurrency, exec_repeats: o.execRepeats,
      unix, tls: over,
      ratio: {
        exec_true_p50: round(over.exec_true_ms.p50 / unix.exec_true_ms.p50),
        exec_true_p99: round(over.exec_true_ms.p99 / unix.exec_true_ms.p99),
        create_to_first_exec_p50: round(over.create_to_first_exec_ms.p50 / unix.create_to_first_exec_ms.p50),
        create_to_first_exec_p99: round(over.create_to_first_exec_ms.p99 / unix.create_to_first_exec_ms.p99),
      },
    };
  } finally {
    await d.stop();
  }
}

async function main(): Promise<void> {
  const opts = new Command('remote')
    .option('--n <n>', 'creates per transport', '50')
    .option('--concurrency <c>', 'creates in flight', '4')
    .option('--exec-repeats <k>', 'timed execs of `true` per transport', '1000')
    .parse(process.argv)
    .opts<{ n: string; concurrency: string; execRepeats: string }>();
  const r = await runRemote({ n: Number(opts.n), concurrency: Number(opts.concurrency), execRepeats: Number(opts.execRepeats) });
  process.stdout.write(JSON.stringify(r, null, 2) + '\n');
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(new URL(import.meta.url).pathname)) {
  main().catch((e) => {
    process.stderr.write(`remote: ${(e as Error).stack ?? e}\n`);
    process.exit(1);
  });
}
