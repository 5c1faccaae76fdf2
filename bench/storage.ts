/**
 * bench/storage: what the writable-layer store (daemon/storage/writable-layers.ts) costs per
 * sandbox, for each kind, in one run. Prints one JSON object:
 *
 *   { store_ops_us: { host|btrfs|xfs: { create: {p50, p99}, remove: {p50, p99} } },
 *     sandbox_ms: { host|auto: { create: {p50, p99}, destroy: {p50, p99} } },
 *     large_tree_destroy_ms: { host|auto: { files, bytes, destroy_ms } } }
 *
 * - store_ops_us: the store alone, in this process: making a sandbox's layer (btrfs:
 *   subvolume + qgroup limit; XFS: project dir; host: nothing; then upper/ and work/ for
 *   all, as prepareRootfs makes them) and removing it (host: nothing, the sandbox dir goes later), N times on a
 *   fresh store of each kind, alternating between the kinds.
 * - sandbox_ms: create (to the API's answer) and destroy of N busybox sandboxes, one at
 *   a time, through a dsecd with `upper_fs = "host"` and one with the default (auto:
 *   btrfs here), alternating between the two.
 * - large_tree_destroy_ms: destroy of one sandbox whose layer holds `--files` small
 *   files and 256 MiB of data, per store.
 *
 * Usage (root): node dist/bench/storage.js [--n 200] [--sandboxes 40] [--files 100000]
 * Uses the uid pools of test slots 30 and 31 at DSEC_TEST_SLOT_OFFSET=90: do not run it
 * beside that checkout's test/attacks/disk.test.ts or test/integration/storage.test.ts.
 */
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { execa } from 'execa';
import pino from 'pino';
import { WritableLayerStore, type StorageConfig } from '../daemon/storage/writable-layers.js';
import { percentile, tempDaemon, type TempDaemon } from './lib.js';

const round = (x: number) => Math.round(x * 100) / 100;
const stats = (xs: number[]) => ({ p50: round(percentile(xs, 50)), p99: round(percentile(xs, 99)) });

/**
 * create/remove of `n` layers on a fresh store of each kind, alternating between the
 * kinds so load from elsewhere on the host hits them alike; microseconds.
 */
async function storeOps(n: number) {
  const kinds = ['host', 'btrfs', 'xfs'] as const;
  const stores = [] as { kind: (typeof kinds)[number]; root: string; store: WritableLayerStore; create: number[]; remove: number[] }[];
  try {
    for (const kind of kinds) {
      const root = mkdtempSync('/tmp/dsec-bench-store-');
      const config: StorageConfig = { upperFs: kind, sizeBytes: 4 * 1024 ** 3, preallocate: false, path: null, reserveBytes: null };
      stores.push({ kind, root, store: await WritableLayerStore.open({ root, config, log: pino({ level: 'silent' }) }), create: [], remove: [] });
    }
    for (let i = 0; i < n; i++) {
      for (const s of stores) {
        const id = `b${String(i).padStart(15, '0')}`;
        mkdirSync(path.join(s.root, 'sandboxes', id), { recursive: true });
        let t = performance.now();
        const layer = await s.store.create(id, { diskBytes: 64 * 1024 ** 2 });
        for (const d of [layer.upper, layer.work]) mkdirSync(d); // prepareRootfs's part
        s.create.push((performance.now() - t) * 1000);
        t = performance.now();
        await s.store.remove(id);
        s.remove.push((performance.now() - t) * 1000);
        rmSync(path.join(s.root, 'sandboxes', id), { recursive: true, force: true });
      }
    }
    return Object.fromEntries(stores.map((s) => [s.kind, { create: stats(s.create), remove: stats(s.remove) }]));
  } finally {
    for (const s of stores) {
      await s.store.purge();
      rmSync(s.root, { recursive: true, force: true });
    }
  }
}

/** Create and destroy of one busybox sandbox on `d`, ms each. */
async function createDestroy(d: TempDaemon): Promise<[number, number]> {
  let t = performance.now();
  const sb = await d.client.createSandbox({ image: 'busybox' });
  const c = performance.now() - t;
  t = performance.now();
  await d.client.deleteSandbox(sb.id, { force: true });
  return [c, performance.now() - t];
}

/** Destroy of one sandbox whose layer holds `files` empty files and 256 MiB, on `d`. */
async function largeTree(d: TempDaemon, files: number) {
  const big = await d.client.createSandbox({ image: 'busybox', memory_bytes: 1024 ** 3 });
  const r = await d.client.exec(big.id, {
    argv: ['sh', '-c', `mkdir -p /t && cd /t && seq 1 ${files} | xargs touch && dd if=/dev/urandom of=/data bs=1M count=256 2>/dev/null && sync && find /t -type f | wc -l`],
    timeoutMs: 600_000,
  });
  const count = Number(r.stdout.toString().trim());
  const t = performance.now();
  await d.client.deleteSandbox(big.id, { force: true });
  return { files: count, bytes: 256 * 1024 ** 2, destroy_ms: round(performance.now() - t) };
}

/**
 * `n` create/destroy pairs on a dsecd with `upper_fs = "host"` and one with the default
 * store, alternating between them so load from elsewhere on the host hits both alike;
 * then the large-tree destroy on each.
 */
async function sandboxes(n: number, files: number) {
  const host = await tempDaemon('dsec-bench-store-', null, '[storage]\nupper_fs = "host"\n');
  const auto = await tempDaemon('dsec-bench-store-', null);
  try {
    const m = { host: { create: [] as number[], destroy: [] as number[] }, auto: { create: [] as number[], destroy: [] as number[] } };
    for (let i = 0; i < n; i++) {
      for (const [k, d] of [['host', host], ['auto', auto]] as const) {
        const [c, x] = await createDestroy(d);
        m[k].create.push(c);
        m[k].destroy.push(x);
      }
    }
    return {
      sandbox_ms: {
        host: { create: stats(m.host.create), destroy: stats(m.host.destroy) },
        auto: { create: stats(m.auto.create), destroy: stats(m.auto.destroy) },
      },
      large_tree_destroy_ms: { host: await largeTree(host, files), auto: await largeTree(auto, files) },
    };
  } finally {
    await host.stop();
    await auto.stop();
  }
}

async function main(): Promise<void> {
  const o = new Command('storage')
    .option('--n <n>', 'store operations per kind', '200')
    .option('--sandboxes <n>', 'sandboxes per dsecd', '40')
    .option('--files <n>', 'files in the large tree', '100000')
    .parse(process.argv)
    .opts<{ n: string; sandboxes: string; files: string }>();
  const n = Number(o.n);
  const ops = await storeOps(n);
  const sb = await sandboxes(Number(o.sandboxes), Number(o.files));
  await execa('sync');
  process.stdout.write(JSON.stringify({ store_ops_us: ops, ...sb }, null, 1) + '\n');
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack}\n`);
  process.exit(1);
});
