/**
 * bench/builder: throughput of the image paths that read untrusted trees, on a realistic
 * tree (the Debian base image), so the cost of running them as the builder identity
 * (docs/SECURITY.md "Builder and runtime identities") can be compared with running them
 * as root. Prints one JSON object; each time is the median of `--reps` runs, in ms:
 *
 *   { tree: {files, bytes}, import_tar_ms, bootstrap_cached_ms, commit_ms, snapshot_ms, builder }
 *
 *   import_tar_ms        POST /v1/images/import of the cached bootstrap tree (a zstd tar
 *                        of debian:bookworm) as a plain rootfs tar: extraction + mkfs.erofs
 *   bootstrap_cached_ms  POST /v1/images/bootstrap {distro: debian} with the tree cached:
 *                        root untars dsec's own cache, the tree is packed
 *   commit_ms            commit of a sandbox whose writable layer holds a copy of /usr
 *                        (`cp -a /usr /opt/usr-copy` inside): copy, strip, ownership, mkfs
 *   snapshot_ms          a filesystem snapshot of the same sandbox
 *
 * Needs root, a cached Debian tree (`dsec image bootstrap debian` once) and zstd.
 * Usage: node dist/bench/builder.js [--reps 3] [--builder-base N]
 * `--builder-base` adds a `[builder]` table (base N, 16 slots) to the temporary dsecd's
 * config; without it the daemon uses the builder range of the slot it leased (bench/lib.ts).
 */
import { readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { execa } from 'execa';
import { DEFAULT_BOOTSTRAP_CACHE_DIR } from '../daemon/image/bootstrap.js';
import { percentile, tempDaemon } from './lib.js';


async function main(): Promise<void> {
  const opts = new Command('builder')
    .option('--reps <n>', 'runs of each operation (median reported)', '3')
    .option('--builder-base <n>', 'first host uid of the builder range ([builder] base)')
    .parse(process.argv)
    .opts<{ reps: string; builderBase?: string }>();
  const reps = Number(opts.reps);
  const trees = path.join(DEFAULT_BOOTSTRAP_CACHE_DIR, 'trees');
  const tar = readdirSync(trees).filter((f) => f.endsWith('.tar.zst')).map((f) => path.join(trees, f)).sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs)[0];
  if (!tar) throw new Error(`no cached Debian tree in ${trees}: run \`dsec image bootstrap debian\` once`);
  const list = await execa('tar', ['--zstd', '-tvf', tar], { maxBuffer: 1 << 28 });
  const lines = String(list.stdout).split('\n').filter(Boolean);
  const bytes = lines.reduce((s, l) => s + Number(l.split(/\s+/)[2] || 0), 0);

  const extra = opts.builderBase ? `[builder]\nbase = ${Number(opts.builderBase)}\nsize = ${16 * 65536}\n` : '';
  const d = await tempDaemon('dsec-bench-builder-', null, extra);
  const time = async (fn: (i: number) => Promise<unknown>): Promise<number> => {
    const xs: number[] = [];
    for (let i = 0; i < reps; i++) {
      const t0 = performance.now();
      await fn(i);
      xs.push(performance.now() - t0);
    }
    return Math.round(percentile(xs, 50));
  };
  try {
    const importMs = await time((i) => d.client.importImage({ type: 'tar', path: tar, image: `imported:${i}` }));
    const bootMs = await time(() => d.client.bootstrapImage({ distro: 'debian' }));
    const sb = await d.client.createSandbox({ image: 'imported:0' });
    const cp = await d.client.exec(sb.id, { argv: ['cp', '-a', '/usr', '/opt/usr-copy'] });
    if (cp.exit_code !== 0) throw new Error(`cp in the sandbox failed: ${cp.stderr.toString()}`);
    const commitMs = await time((i) => d.client.commit(sb.id, { image: `committed:${i}` }));
    const snapMs = await time((i) => d.client.snapshot(sb.id, { name: `bench-${i}` }));
    await d.client.deleteSandbox(sb.id, { force: true });
    const info = (await d.client.hostInfo()) as unknown as { defences?: Record<string, { enforced: boolean }> };
    console.log(JSON.stringify({
      tree: { files: lines.length, bytes },
      import_tar_ms: importMs, bootstrap_cached_ms: bootMs, commit_ms: commitMs, snapshot_ms: snapMs,
      builder: info.defences?.builder_identity?.enforced ?? false, reps,
    }, null, 2));
  } finally {
    await d.stop();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
