/**
 * bench/create-exec: N container sandboxes at concurrency C — create, exec `true`,
 * destroy — and, in the same run, the same N with `podman --runtime runc run --rm` on
 * the same busybox tree. Prints one JSON object:
 *
 *   { dsec: {create_to_first_exec_ms: {p50, p99}, creations_per_s, exec_ms: {p50, p99}, ...},
 *     podman: {run_ms: {p50, p99}, runs_per_s}, ratio: {...} }
 *
 * Usage: node dist/bench/create-exec.js [--n 200] [--concurrency 4] [--socket PATH]
 *        [--no-podman] [--exec-repeats 500]
 * Without --socket it starts its own dsecd on a temporary root and removes it after.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { execa } from 'execa';
import { DsecClient } from '../sdk/client.js';
import { prepareBusyboxTree } from '../daemon/image/builtin.js';
import { percentile, tempDaemon } from './lib.js';

const round = (x: number) => Math.round(x * 100) / 100;

/** Runs `fn(i)` for i in [0, n) with at most `c` in flight. */
async function pool(n: number, c: number, fn: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(c, n) }, async () => {
    while (next < n) await fn(next++);
  }));
}


async function main(): Promise<void> {
  const opts = new Command('create-exec')
    .option('--n <n>', 'sandboxes', '200')
    .option('--concurrency <c>', 'in flight at once', '4')
    .option('--socket <path>', 'use a running dsecd instead of a temporary one')
    .option('--exec-repeats <k>', 'sequential execs of `true` in one sandbox for exec latency', '500')
    .option('--no-podman', 'skip the podman peer')
    .parse(process.argv)
    .opts<{ n: string; concurrency: string; socket?: string; execRepeats: string; podman: boolean }>();
  const n = Number(opts.n);
  const c = Number(opts.concurrency);
  const k = Number(opts.execRepeats);

  const d = opts.socket ? { client: new DsecClient({ socketPath: opts.socket }), stop: async () => {}, root: '' } : await tempDaemon('dsec-bench-', null);
  const firstExec: number[] = [];
  const execLat: number[] = [];
  const destroyLat: number[] = [];
  // Warm-up: one sandbox, so image blobs are mounted and code paths JIT-compiled.
  const w = await d.client.createSandbox({ image: 'busybox' });
  await d.client.exec(w.id, { argv: ['true'] });
  await d.client.deleteSandbox(w.id, { force: true });

  let wall = 0;
  try {
    const t0 = performance.now();
    await pool(n, c, async () => {
      const s = performance.now();
      const sb = await d.client.createSandbox({ image: 'busybox' });
      const r = await d.client.exec(sb.id, { argv: ['true'] });
      if (r.exit_code !== 0) throw new Error(`exec true failed in ${sb.id}`);
      firstExec.push(performance.now() - s);
      const x = performance.now();
      await d.client.deleteSandbox(sb.id, { force: true });
      destroyLat.push(performance.now() - x);
    });
    wall = (performance.now() - t0) / 1000;
    // Exec round trip on an otherwise idle host: one sandbox, sequential `true`.
    const sb = await d.client.createSandbox({ image: 'busybox' });
    for (let i = 0; i < k; i++) {
      const e = performance.now();
      await d.client.exec(sb.id, { argv: ['true'] });
      execLat.push(performance.now() - e);
    }
    await d.client.deleteSandbox(sb.id, { force: true });
  } finally {
    await d.stop();
  }

  const result: Record<string, unknown> = {
    bench: 'create-exec',
    n,
    concurrency: c,
    host: { cores: (await import('node:os')).cpus().length, kernel: (await import('node:os')).release() },
    dsec: {
      create_to_first_exec_ms: { p50: round(percentile(firstExec, 50)), p99: round(percentile(firstExec, 99)) },
      creations_per_s: round(n / wall),
      exec_true_ms: { p50: round(percentile(execLat, 50)), p99: round(percentile(execLat, 99)), samples: execLat.length },
      destroy_ms: { p50: round(percentile(destroyLat, 50)), p99: round(percentile(destroyLat, 99)) },
      wall_s: round(wall),
    },
  };

  if (opts.podman) {
    const tree = mkdtempSync('/tmp/dsec-bench-tree-');
    try {
      await prepareBusyboxTree(tree);
      // This host's hard RLIMIT_NOFILE/NPROC are below podman's defaults, which runc then refuses to set.
      const args = ['--runtime', 'runc', 'run', '--rm', '--network', 'none', '--ulimit', 'nofile=1024:1024', '--ulimit', 'nproc=1024:1024', '--rootfs', tree, '/bin/true'];
      await execa('podman', args);
      const runLat: number[] = [];
      const p0 = performance.now();
      await pool(n, c, async () => {
        const s = performance.now();
        await execa('podman', args);
        runLat.push(performance.now() - s);
      });
      const pwall = (performance.now() - p0) / 1000;
      const execPeer: number[] = [];
      // Peer for exec latency: `podman exec` into one long-running container.
      const name = `dsec-bench-${process.pid}`;
      await execa('podman', ['--runtime', 'runc', 'run', '-d', '--name', name, '--network', 'none', '--ulimit', 'nofile=1024:1024', '--ulimit', 'nproc=1024:1024', '--rootfs', tree, '/bin/sleep', '3600']);
      try {
        for (let i = 0; i < 50; i++) {
          const s = performance.now();
          await execa('podman', ['exec', name, '/bin/true']);
          execPeer.push(performance.now() - s);
        }
      } finally {
        await execa('podman', ['rm', '-f', '-t', '0', name], { reject: false });
      }
      const podman = {
        run_rm_ms: { p50: round(percentile(runLat, 50)), p99: round(percentile(runLat, 99)) },
        runs_per_s: round(n / pwall),
        exec_true_ms: { p50: round(percentile(execPeer, 50)), p99: round(percentile(execPeer, 99)), samples: execPeer.length },
      };
      result.podman = podman;
      const ds = result.dsec as { create_to_first_exec_ms: { p50: number }; creations_per_s: number; exec_true_ms: { p50: number } };
      result.ratio = {
        create_to_first_exec_p50_podman_over_dsec: round(podman.run_rm_ms.p50 / ds.create_to_first_exec_ms.p50),
        throughput_dsec_over_podman: round(ds.creations_per_s / podman.runs_per_s),
        exec_p50_podman_over_dsec: round(podman.exec_true_ms.p50 / ds.exec_true_ms.p50),
      };
    } finally {
      rmSync(tree, { recursive: true, force: true });
    }
  }
  process.stdout.write(JSON.stringify(result, null, 2) + '\n');
}

main().catch((e) => {
  process.stderr.write(`create-exec: ${(e as Error).stack ?? e}\n`);
  process.exit(1);
});
