/**
 * bench/microvm-density: host memory of N idle microVMs with the image's layers as shared
 * DAX persistent memory (`[vm] pmem = true`) against layers as virtio-blk disks
 * (`pmem = false`), both with the balloon's free-page reporting on, and pmem with the
 * balloon off. Prints one JSON object and writes it to bench/results-microvm-density.json:
 *
 *   { n, image, host: { cpus, mem_total_mib, accel, guest_memory_mib },
 *     runs: { blk|pmem|pmem_no_balloon: { layers, idle: Phase, after_read: Phase, boot_ms: {p50, max}, guest_meminfo_vm0 } },
 *     ratio_pss_per_vm: { idle, after_read },            (blk / pmem)
 *     balloon_saving_pss_mib_per_vm: { idle, after_read } }  (pmem_no_balloon - pmem)
 *   Phase = { pss_mib_total, pss_mib_per_vm, rss_mib_per_vm, cgroup_mib_per_vm,
 *             memavailable_delta_mib, memavailable_delta_mib_per_vm }
 *
 * The image is busybox plus one layer holding a 64 MiB file of random bytes (a stand-in
 * for a language runtime the workload reads). Per run: a fresh dsecd, N microVMs created
 * one after the other (256 MiB guests), then
 *   - idle: 15 s after the last boot (free-page reporting hands back what the boot freed),
 *   - after_read: every VM has read the 64 MiB file once (`cat > /dev/null`), plus 15 s.
 * PSS is the sum of `Pss:` in /proc/<QEMU pid>/smaps_rollup (shared pages split among the
 * processes mapping them: the shared layer copy counts once over all VMs); RSS the sum of
 * `Rss:`; cgroup the VMM cgroups' memory usage (page cache charged to the first toucher);
 * MemAvailable the /proc/meminfo drop from before the first create (noisy on a shared
 * host: other processes move it too).
 *
 * Usage (root; QEMU and the guest kernel installed): node dist/bench/microvm-density.js [--n 8]
 * Its dsecds lease id-range slots as the tests' do (bench/lib.ts tempDaemon), so it runs beside them.
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { percentile, tempDaemon, type TempDaemon } from './lib.js';
import { repoRoot } from '../daemon/startup/host.js';

const MiB = 1024 * 1024;
const DATA_BYTES = 64 * MiB;
const SETTLE_MS = 15_000;
const round = (x: number) => Math.round(x * 10) / 10;

/** One `key:  N kB` field of a /proc file, in bytes (0 when absent). */
function kbField(text: string, key: string): number {
  const m = new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(text);
  return m ? Number(m[1]) * 1024 : 0;
}

/** Memory of the running VMs: summed PSS/RSS of their QEMU processes and their cgroups' usage, bytes. */
async function measure(d: TempDaemon, ids: string[]): Promise<{ pss: number; rss: number; cgroup: number }> {
  let pss = 0;
  let rss = 0;
  let cgroup = 0;
  for (const id of ids) {
    const sb = await d.client.getSandbox(id);
    const roll = readFileSync(`/proc/${sb.init_pid}/smaps_rollup`, 'utf8');
    pss += kbField(roll, 'Pss');
    rss += kbField(roll, 'Rss');
    cgroup += (await d.client.sandboxStats(id)).memory_bytes ?? 0;
  }
  return { pss, rss, cgroup };
}

const memAvailable = () => kbField(readFileSync('/proc/meminfo', 'utf8'), 'MemAvailable');

/** One phase's numbers, MiB. */
function phase(n: number, m: { pss: number; rss: number; cgroup: number }, availBefore: number) {
  const delta = availBefore - memAvailable();
  return {
    pss_mib_total: round(m.pss / MiB), pss_mib_per_vm: round(m.pss / MiB / n), rss_mib_per_vm: round(m.rss / MiB / n),
    cgroup_mib_per_vm: round(m.cgroup / MiB / n), memavailable_delta_mib: round(delta / MiB), memavailable_delta_mib_per_vm: round(delta / MiB / n),
  };
}

/** One run: a fresh dsecd with `pmem`, the bench image, N VMs, the two phases. */
async function run(pmem: boolean, balloon: boolean, n: number, dataDir: string) {
  const d = await tempDaemon('dsec-bench-vmdens-', null, `[vm]\naccel = "tcg"\npmem = ${pmem}\nballoon = ${balloon}\n`);
  const ids: string[] = [];
  try {
    await d.client.importImage({ type: 'dir', path: dataDir, base: 'busybox', image: 'bench-density:1' });
    const availBefore = memAvailable();
    const boot: number[] = [];
    for (let i = 0; i < n; i++) {
      const t0 = performance.now();
      const sb = await d.client.createSandbox({ image: 'bench-density:1', backend: 'microvm', memory_bytes: 256 * MiB });
      boot.push(performance.now() - t0);
      ids.push(sb.id);
    }
    const layers = (await d.client.listImages()).find((im) => im.ref === 'bench-density:1')?.layers.length ?? null;
    await new Promise((r) => setTimeout(r, SETTLE_MS));
    const idle = phase(n, await measure(d, ids), availBefore);
    for (const id of ids) {
      const r = await d.client.exec(id, { argv: ['sh', '-c', 'cat /opt/data/blob > /dev/null && grep -E "^(MemFree|Cached)" /proc/meminfo'] });
      if (r.exit_code !== 0) throw new Error(`read in ${id} failed: ${r.stderr.toString()}`);
    }
    await new Promise((r) => setTimeout(r, SETTLE_MS));
    const afterRead = phase(n, await measure(d, ids), availBefore);
    const guest = (await d.client.exec(ids[0], { argv: ['sh', '-c', 'grep -E "^(MemTotal|MemFree|Cached)" /proc/meminfo; echo "pmem devices: $(ls /sys/block | grep -c pmem)"'] })).stdout.toString();
    return { layers, idle, after_read: afterRead, boot_ms: { p50: Math.round(percentile(boot, 50)), max: Math.round(Math.max(...boot)) }, guest_meminfo_vm0: guest.trim().split('\n') };
  } finally {
    for (const id of ids) await d.client.deleteSandbox(id, { force: true }).catch(() => {});
    await d.stop();
  }
}

async function main() {
  const o = new Command().option('--n <n>', 'microVMs per run', '8').parse().opts<{ n: string }>();
  const n = Number(o.n);
  const dataDir = mkdtempSync('/tmp/dsec-bench-vmdens-data-');
  mkdirSync(path.join(dataDir, 'opt/data'), { recursive: true });
  writeFileSync(path.join(dataDir, 'opt/data/blob'), randomBytes(DATA_BYTES));
  try {
    const blk = await run(false, true, n, dataDir);
    const pmem = await run(true, true, n, dataDir);
    const pmemNoBalloon = await run(true, false, n, dataDir);
    const out = {
      n,
      image: { base: 'busybox', extra_layer: '/opt/data/blob, 64 MiB of random bytes', data_bytes: DATA_BYTES },
      host: { cpus: os.cpus().length, mem_total_mib: Math.round(os.totalmem() / MiB), accel: 'tcg', guest_memory_mib: 256 },
      runs: { blk, pmem, pmem_no_balloon: pmemNoBalloon },
      ratio_pss_per_vm: {
        idle: Math.round(blk.idle.pss_mib_per_vm / pmem.idle.pss_mib_per_vm * 100) / 100,
        after_read: Math.round(blk.after_read.pss_mib_per_vm / pmem.after_read.pss_mib_per_vm * 100) / 100,
      },
      balloon_saving_pss_mib_per_vm: { idle: round(pmemNoBalloon.idle.pss_mib_per_vm - pmem.idle.pss_mib_per_vm), after_read: round(pmemNoBalloon.after_read.pss_mib_per_vm - pmem.after_read.pss_mib_per_vm) },
    };
    const text = `${JSON.stringify(out, null, 2)}\n`;
    writeFileSync(path.join(repoRoot(), 'bench/results-microvm-density.json'), text);
    process.stdout.write(text);
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
}

await main();
