/**
 * `node dist/bench/io-neighbour.js` (also `npm run bench -- --only io`): how much one
 * sandbox writing as fast as it can slows a neighbour's exec that writes a small file,
 * with and without per-sandbox I/O settings (`io_weight`, `io_max`), beside two podman
 * containers doing the same (no I/O settings) in the same run.
 *
 * Scenarios, each `--samples` neighbour execs one after another, latency through the API
 * (client.exec round trip) p50/p99:
 *   - idle:             no writer;
 *   - buffered:         the writer loops `dd bs=1M count=256` + `rm` (page cache, then writeback);
 *   - buffered+io:      the same with the writer at io_weight 10 and io_max write_bps
 *                       --wbps (the neighbour at io_weight 1000);
 *   - direct:           the writer loops the same dd with oflag=direct;
 *   - direct+io:        direct with the I/O settings.
 * The neighbour's exec: `dd if=/dev/zero of=/root/small bs=4k count=1 conv=fsync` (a small
 * file, made durable: it waits for the device like a `git commit` or a build's output).
 * On cgroup v1 (this host) io_max holds back direct I/O only, so buffered+io is expected
 * to look like buffered; host info's io_max entry says so, and the JSON carries it.
 *
 * Usage: node dist/bench/io-neighbour.js [--samples 40] [--wbps 33554432] [--no-podman]
 * Prints JSON on stdout.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { execa } from 'execa';
import { prepareBusyboxTree } from '../daemon/image/builtin.js';
import { percentile, tempDaemon, type TempDaemon } from './lib.js';

/** Uid pool of this bench's dsecd: 2^25 ids from 2^29 + 2^28, clear of the test slots and of bench/all.ts's pool. */
const POOL = { base: 2 ** 29 + 2 ** 28, size: 2 ** 25 };

/** The neighbour's command: one 4 KiB file, fsynced. */
const SMALL = 'dd if=/dev/zero of=/root/small bs=4k count=1 conv=fsync 2>/dev/null';

/** The writer's loop, until /tmp/stop exists; `direct` adds oflag=direct. */
const writerLoop = (direct: boolean) =>
  `while [ ! -e /tmp/stop ]; do dd if=/dev/zero of=/root/w bs=1M count=256 ${direct ? 'oflag=direct ' : ''}2>/dev/null; rm -f /root/w; done; rm -f /tmp/stop`;

/** p50/p99/max of ms samples, rounded to 0.1 ms. */
function pct(xs: number[]): { p50: number; p99: number; max: number; n: number } {
  const r = (x: number) => Math.round(x * 10) / 10;
  return { p50: r(percentile(xs, 50)), p99: r(percentile(xs, 99)), max: r(Math.max(...xs)), n: xs.length };
}

/** Times `n` runs of `run`, one after another, ms each. */
async function sample(n: number, run: () => Promise<void>): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await run();
    out.push(performance.now() - t0);
  }
  return out;
}

/** Options of {@link runIoNeighbour}. */
export interface IoNeighbourOptions {
  samples: number;
  /** The writer's io_max write_bps in the `+io` scenarios, bytes/s. */
  wbps: number;
  podman: boolean;
}

/** The scenarios through one dsecd, and the podman peer. */
export async function runIoNeighbour(o: IoNeighbourOptions): Promise<Record<string, unknown>> {
  const res: Record<string, unknown> = { bench: 'io-neighbour', samples: o.samples, writer_io_max_write_bps: o.wbps };
  const d: TempDaemon = await tempDaemon('dsec-bench-io-', POOL);
  try {
    const info = await d.client.hostInfo();
    res.host = { cgroup: info.cgroup.version, store: info.storage?.kind, device: info.storage?.device, io_max: info.defences.io_max, io_weight: info.defences.io_weight };
    const dsec: Record<string, unknown> = {};
    for (const io of [false, true]) {
      const neighbour = await d.client.createSandbox({ image: 'busybox', ...(io ? { io_weight: 1000 } : {}) });
      const writer = await d.client.createSandbox({ image: 'busybox', ...(io ? { io_weight: 10, io_max: { write_bps: o.wbps } } : {}) });
      const small = async () => {
        const r = await d.client.exec(neighbour.id, { argv: ['sh', '-c', SMALL] });
        if (r.exit_code !== 0) throw new Error(`neighbour exec failed: ${r.stderr.toString()}`);
      };
      await sample(3, small);
      if (!io) dsec.idle = pct(await sample(o.samples, small));
      for (const direct of [false, true]) {
        const loop = d.client.exec(writer.id, { argv: ['sh', '-c', writerLoop(direct)] });
        await new Promise((r) => setTimeout(r, 1000));
        dsec[`${direct ? 'direct' : 'buffered'}${io ? '+io' : ''}`] = pct(await sample(o.samples, small));
        await d.client.exec(writer.id, { argv: ['touch', '/tmp/stop'] });
        await loop;
        await execa('sync');
      }
      await d.client.deleteSandbox(writer.id, { force: true });
      await d.client.deleteSandbox(neighbour.id, { force: true });
    }
    res.dsec = dsec;
  } finally {
    await d.stop();
  }
  if (o.podman) res.podman = await podmanPeer(o);
  return res;
}

/**
 * Two podman containers (runc, no network), each on a busybox tree of its own on the host
 * filesystem: the writer runs the buffered loop, the neighbour's `podman exec` runs the
 * same small write. podman exec costs ~170 ms by itself here, so compare each scenario
 * with podman's own idle line, not with dsec's.
 */
async function podmanPeer(o: IoNeighbourOptions): Promise<Record<string, unknown>> {
  const trees = [mkdtempSync('/tmp/dsec-bench-io-w-'), mkdtempSync('/tmp/dsec-bench-io-n-')];
  const names = [`dsec-bench-io-w-${process.pid}`, `dsec-bench-io-n-${process.pid}`];
  const out: Record<string, unknown> = {};
  try {
    for (const t of trees) await prepareBusyboxTree(t);
    for (let i = 0; i < 2; i++) {
      await execa('podman', ['--runtime', 'runc', 'run', '-d', '--name', names[i], '--network', 'none', '--ulimit', 'nofile=1024:1024', '--ulimit', 'nproc=1024:1024', '--rootfs', trees[i], '/bin/sleep', '3600']);
    }
    const small = async () => {
      await execa('podman', ['exec', names[1], 'sh', '-c', SMALL]);
    };
    await sample(3, small);
    const n = Math.max(10, Math.floor(o.samples / 2));
    out.idle = pct(await sample(n, small));
    for (const direct of [false, true]) {
      const loop = execa('podman', ['exec', names[0], 'sh', '-c', writerLoop(direct)], { reject: false });
      await new Promise((r) => setTimeout(r, 1000));
      out[direct ? 'direct' : 'buffered'] = pct(await sample(n, small));
      await execa('podman', ['exec', names[0], 'touch', '/tmp/stop']);
      await loop;
      await execa('sync');
    }
  } finally {
    await execa('podman', ['rm', '-f', '-t', '0', ...names], { reject: false });
    for (const t of trees) rmSync(t, { recursive: true, force: true });
  }
  return out;
}

async function main(): Promise<void> {
  const o = new Command('io-neighbour')
    .option('--samples <n>', 'neighbour execs per scenario', '40')
    .option('--wbps <n>', "the writer's io_max write_bps in the +io scenarios", String(32 * 1024 * 1024))
    .option('--no-podman', 'skip the podman peer')
    .parse(process.argv)
    .opts<{ samples: string; wbps: string; podman: boolean }>();
  const res = await runIoNeighbour({ samples: Number(o.samples), wbps: Number(o.wbps), podman: o.podman });
  process.stdout.write(`${JSON.stringify(res, null, 2)}\n`);
}

if (process.argv[1]?.endsWith('io-neighbour.js')) {
  main().catch((e) => {
    process.stderr.write(`bench failed: ${(e as Error).stack ?? e}\n`);
    process.exit(1);
  });
}
