/**
 * bench/microvm-reclaim: host memory of N idle microVMs whose guests each touched and left
 * `cold_mib` of anonymous memory, with guest reclaim on (`[vm.reclaim] mode = "on"`: a DAMON
 * pageout scheme in the guest, a swap disk, free-page reporting; docs/ARCHITECTURE.md
 * "Guest memory reclaim") against off (the control), in the same invocation, one run after
 * the other (issue 23's microVM benchmark). Prints one JSON object and writes it to
 * bench/results-microvm-reclaim.json:
 *
 *   { n, n_rule, guest_mib, cold_mib, poll_s, bound_s, reclaim_toml, host: {...},
 *     runs: { on|off: Run }, saving_pct: { cgroup, pss }, cold_returned: { mib_per_vm, pct },
 *     seconds_to_half, seconds_to_plateau, exec_true_ms: { on, off } }
 *   Run = { boot_ms, after_touch: Phase, end: Phase, duration_s, per_vm_timing,
 *           series: [[s, cgroup_mib, pss_mib, memavail_delta_mib]...], exec_true_ms: {p50, max}, damon: {...} | null }
 *   Phase = { cgroup_mib_total, cgroup_mib_per_vm, pss_mib_total, pss_mib_per_vm, memavailable_delta_mib }
 *
 * Per run: a fresh dsecd (TCG), N busybox microVMs of `guest_mib` created (3 at a time);
 * in each, test/fixtures/memhog (static) is installed, then one exec runs it: it maps
 * `cold_mib` of private anonymous memory, fills it with incompressible bytes and leaves a
 * process that holds the buffer without touching it again (so free-page reporting alone
 * cannot give it back: it is never freed). The guests then idle. Memory is the sum over
 * the VMs of the VMM cgroup's charge (GET .../stats memory_bytes) and of `Pss:` in the
 * QEMU process's /proc/<pid>/smaps_rollup, and the drop of the host's MemAvailable since
 * before the first create (noisy: other processes on a shared host move it).
 * after_touch sums each VM's numbers read right after its own touch (before any reclaim
 * could reach it; MemAvailable: at the last touch). Every VM is sampled every `poll_s`
 * from the first touch on (VMs touched first reclaim while later ones touch); `series` is
 * the sums from the last touch on (s counted from it): the reclaiming run until its charge stopped falling (less than 0.2% of
 * it over the last three polls, after DAMON applied something and at least 10% of the
 * cold bytes came back) or `bound_s`; the control for as long as the reclaiming run took,
 * so both end at the same age. Then each VM answers one exec `true`, timed at the client.
 *
 * saving_pct: 1 - on.end / off.end; cold_returned: (on.after_touch - on.end) / (N × cold_mib)
 * on the cgroup charge; per_vm_timing: p50 and max over the VMs of the seconds from a VM's
 * own touch until its charge had fallen 50% / 90% of its own final drop (VMs that gave
 * back less than 10% of the cold bytes are left out); seconds_to_half / _plateau: the same
 * on the sums, counted from the last touch.
 *
 * N: at most --n (the issue's 50), and at most what fits in --mem-share of the host's
 * MemAvailable at start at `guest_mib + 128` MiB per VM (a guest's RAM plus QEMU and its
 * TCG translation cache): this host is shared. When memory allows fewer than 8 (or
 * --n's smaller number), it refuses to run.
 *
 * The reclaim settings are the keys docs/OPERATIONS.md documents, with the age shortened
 * so the bench does not wait minutes (min_age_s 10 against 60; sampling 50 ms, aggregation
 * 1 s) and the quotas of test/integration/microvm-reclaim.test.ts (200 ms of guest CPU per
 * second, 256 MiB/s): under TCG the default 1% of a core pages out a few MiB a minute.
 *
 * Usage (root; QEMU, gcc and the 6.12 guest kernel installed):
 *   node dist/bench/microvm-reclaim.js [--n 50] [--guest-mib 384] [--cold-mib 256] [--bound-s 300]
 */
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Command } from 'commander';
import { execa } from 'execa';
import { percentile, tempDaemon, type TempDaemon } from './lib.js';
import { repoRoot } from '../daemon/startup/host.js';

const MiB = 2 ** 20;
/** Host memory a VM is budgeted beyond its guest RAM when N is chosen (QEMU's heap, the TCG translation cache of [vm] tcg_tb_mib 128). */
const VMM_OVERHEAD_MIB = 128;
const MIN_N = 8;
const round = (x: number) => Math.round(x * 10) / 10;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Opts { n: number; guestMib: number; coldMib: number; boundS: number; pollS: number; memShare: number; minAgeS: number }

/** The [vm.reclaim] table of the reclaiming run (see the module comment for why these values). */
const reclaimToml = (o: Opts) => ['[vm.reclaim]', 'mode = "on"', 'swap = "disk"', `min_age_s = ${o.minAgeS}`, 'sample_ms = 50', 'aggr_ms = 1000', 'cpu_ms_per_s = 200', `bytes_per_s = ${256 * MiB}`].join('\n');

/** One `key:  N kB` field of a /proc file, in bytes (0 when absent). */
function kbField(text: string, key: string): number {
  const m = new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(text);
  return m ? Number(m[1]) * 1024 : 0;
}
const memAvailable = () => kbField(readFileSync('/proc/meminfo', 'utf8'), 'MemAvailable');

/** One VM's VMM cgroup charge and QEMU PSS, bytes (the stats read also refreshes the guest's DAMON record). */
async function vmMem(d: TempDaemon, id: string, qemuPid: number): Promise<{ cgroup: number; pss: number }> {
  const cgroup = await d.client.sandboxStats(id).then((st) => st.memory_bytes ?? 0, () => 0); // a VM that died counts 0 (and is named in failed_vms)
  let pss = 0;
  try {
    pss = kbField(readFileSync(`/proc/${qemuPid}/smaps_rollup`, 'utf8'), 'Pss');
  } catch { /* QEMU gone: counts 0 */ }
  return { cgroup, pss };
}

/** A phase's numbers in MiB from byte sums. */
function phase(n: number, cgroup: number, pss: number, availDelta: number) {
  return {
    cgroup_mib_total: round(cgroup / MiB), cgroup_mib_per_vm: round(cgroup / MiB / n),
    pss_mib_total: round(pss / MiB), pss_mib_per_vm: round(pss / MiB / n), memavailable_delta_mib: round(availDelta / MiB),
  };
}

/** Runs `f` over `xs` with at most `k` at a time, results in order. */
async function pool<T, R>(xs: T[], k: number, f: (x: T) => Promise<R>): Promise<R[]> {
  const out: R[] = new Array(xs.length);
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(k, xs.length) }, async () => {
    while (next < xs.length) { const i = next++; out[i] = await f(xs[i]); }
  }));
  return out;
}

/** One run (see the module comment); `durationS` fixes how long the idle phase is sampled (the control), else it runs to the plateau or the bound. */
async function run(reclaim: boolean, n: number, o: Opts, memhog: Buffer, durationS: number | null) {
  const d = await tempDaemon(`dsec-bench-vmrecl-${reclaim ? 'on' : 'off'}-`, null, `[vm]\naccel = "tcg"\n${reclaim ? reclaimToml(o) : ''}\n`);
  const vms: Array<{ id: string; pid: number; guestPid: number }> = [];
  try {
    const availBefore = memAvailable();
    const boot = await pool(Array.from({ length: n }, (_, i) => i), 3, async () => {
      const t = performance.now();
      const sb = await d.client.createSandbox({ image: 'busybox', backend: 'microvm', memory_bytes: o.guestMib * MiB });
      vms.push({ id: sb.id, pid: sb.init_pid ?? 0, guestPid: 0 });
      return performance.now() - t;
    });
    for (const vm of vms) {
      const r = await d.client.exec(vm.id, { argv: ['sh', '-c', 'cat > /tmp/memhog && chmod +x /tmp/memhog'], stdin: memhog });
      if (r.exit_code !== 0) throw new Error(`installing memhog in ${vm.id}: ${r.stderr.toString()}`);
    }
    // The touch, one VM after the other; each VM's memory read right after its own. A
    // sampler runs from the first touch on (VMs touched early start reclaiming while later
    // ones touch), so each VM's own drop is timed from its own touch.
    const tS = performance.now();
    const now = () => (performance.now() - tS) / 1000;
    const perVm: Array<Array<[number, number]>> = vms.map(() => []);
    const before: Array<{ t: number; cgroup: number; pss: number } | null> = vms.map(() => null);
    const totals: Array<[number, number, number, number]> = [];
    let lastTouch: number | null = null;
    let failed = false;
    const sampler = (async () => {
      for (;;) {
        if (failed) return;
        const s = now();
        let cg = 0;
        let pss = 0;
        for (const [i, vm] of vms.entries()) {
          const x = await vmMem(d, vm.id, vm.pid);
          cg += x.cgroup;
          pss += x.pss;
          if (before[i]) perVm[i].push([round(s), round(x.cgroup / MiB)]);
        }
        if (lastTouch !== null) {
          totals.push([round(s - lastTouch), round(cg / MiB), round(pss / MiB), round((availBefore - memAvailable()) / MiB)]);
          const since = s - lastTouch;
          if (durationS !== null ? since >= durationS : since >= o.boundS || plateau(totals, sum(before, 'cgroup') / MiB, n * o.coldMib, reclaim ? appliedBytes(d, vms) : 0)) return;
        }
        await sleep(o.pollS * 1000);
      }
    })();
    sampler.catch(() => {}); // awaited below; this only keeps a failure during the touches from being unhandled
    let availAtTouch = 0;
    try {
      for (const [i, vm] of vms.entries()) {
        const r = await d.client.exec(vm.id, { argv: ['/tmp/memhog', String(o.coldMib), '/tmp/memhog.result'] });
        const m = /^ready (\d+) /m.exec(r.stdout.toString());
        if (r.exit_code !== 0 || !m) throw new Error(`memhog in ${vm.id}: ${r.stdout.toString()} ${r.stderr.toString()}`);
        vm.guestPid = Number(m[1]);
        before[i] = { t: now(), ...(await vmMem(d, vm.id, vm.pid)) };
      }
      availAtTouch = memAvailable();
    } catch (e) {
      failed = true;
      await sampler.catch(() => {});
      throw e;
    }
    lastTouch = now();
    await sampler;
    const afterTouch = phase(n, sum(before, 'cgroup'), sum(before, 'pss'), availBefore - availAtTouch);
    const series = totals;
    // Per VM: seconds from its own touch until its charge had fallen 50% / 90% of its own final drop (VMs whose drop is under 10% of the cold bytes: none).
    const own = (share: number) => vms.map((_, i) => {
      const b = before[i]!;
      const pts = perVm[i].filter(([t]) => t >= b.t);
      const drop = b.cgroup / MiB - pts.at(-1)![1];
      if (drop < 0.1 * o.coldMib) return null;
      const hit = pts.find(([, c]) => b.cgroup / MiB - c >= share * drop);
      return hit ? round(hit[0] - b.t) : null;
    }).filter((x): x is number => x !== null);
    const stat = (xs: number[]) => (xs.length ? { p50: round(percentile(xs, 50)), max: round(Math.max(...xs)), vms: xs.length } : null);
    const perVmTiming = { seconds_to_half: stat(own(0.5)), seconds_to_90pct: stat(own(0.9)), touch_spread_s: round(lastTouch - before[0]!.t) };
    const last = series.at(-1)!;
    const end = { cgroup_mib_total: last[1], cgroup_mib_per_vm: round(last[1] / n), pss_mib_total: last[2], pss_mib_per_vm: round(last[2] / n), memavailable_delta_mib: last[3] };
    // VMs that are no longer running (a guest or VMM that died) are named, not timed.
    const dead: Array<{ id: string; state: string; error: unknown; console_tail: string[] }> = [];
    const execTrue: number[] = [];
    for (const vm of vms) {
      const sb = await d.client.getSandbox(vm.id);
      if (sb.state !== 'running') {
        // The guest's last console lines (a panic, an OOM kill of its init) say why; the run's root goes when it ends.
        let consoleTail: string[] = [];
        try {
          consoleTail = readFileSync(path.join(d.root, 'sandboxes', vm.id, 'console.log'), 'utf8').trimEnd().split('\n').slice(-40);
        } catch { /* none kept */ }
        dead.push({ id: vm.id, state: sb.state, error: (sb as unknown as Record<string, unknown>).error ?? null, console_tail: consoleTail });
        continue;
      }
      const t = performance.now();
      const r = await d.client.exec(vm.id, { argv: ['true'] });
      execTrue.push(performance.now() - t);
      if (r.exit_code !== 0) throw new Error(`exec true in ${vm.id} exited ${r.exit_code}`);
    }
    const vm0 = dead.some((f) => f.id === vms[0].id) ? '' : (await d.client.exec(vms[0].id, { argv: ['sh', '-c', `grep -E "^(VmRSS|VmSwap)" /proc/${vms[0].guestPid}/status; grep -E "^(MemFree|Swap(Total|Free))" /proc/meminfo`] })).stdout.toString();
    return {
      boot_ms: { p50: Math.round(percentile(boot, 50)), max: Math.round(Math.max(...boot)) },
      after_touch: afterTouch, end, duration_s: last[0], per_vm_timing: perVmTiming, series,
      exec_true_ms: { p50: round(percentile(execTrue, 50)), max: round(Math.max(...execTrue)) },
      failed_vms: dead, damon: reclaim ? damonTotals(d, vms) : null, guest_vm0: vm0.trim().split('\n'),
    };
  } finally {
    for (const vm of vms) await d.client.deleteSandbox(vm.id, { force: true }).catch(() => {});
    await d.stop();
  }
}

/** Sum of one field over the VMs' right-after-touch readings, bytes. */
const sum = (xs: Array<{ cgroup: number; pss: number } | null>, k: 'cgroup' | 'pss') => xs.reduce((a, x) => a + (x?.[k] ?? 0), 0);

/** The guest reclaim records (`<sandbox dir>/guest-reclaim.json`) of `vms`, null where absent. */
function records(d: TempDaemon, vms: Array<{ id: string }>) {
  return vms.map((vm) => {
    try {
      return JSON.parse(readFileSync(path.join(d.root, 'sandboxes', vm.id, 'guest-reclaim.json'), 'utf8')) as { started: boolean; reason: string | null; stats: { bytesApplied: number; swapTotalBytes: number; swapFreeBytes: number } | null };
    } catch { return null; }
  });
}
const appliedBytes = (d: TempDaemon, vms: Array<{ id: string }>) => records(d, vms).reduce((a, r) => a + (r?.stats?.bytesApplied ?? 0), 0);

/** Sums of the records: VMs whose scheme started, bytes DAMON applied pageout to, guest swap in use, and host disk the swap files hold. */
function damonTotals(d: TempDaemon, vms: Array<{ id: string }>) {
  const rs = records(d, vms);
  let disk = 0;
  for (const vm of vms) {
    try { disk += statSync(path.join(d.root, 'sandboxes', vm.id, 'swap.raw')).blocks * 512; } catch { /* no swap file */ }
  }
  return {
    vms_started: rs.filter((r) => r?.started).length, reasons: [...new Set(rs.map((r) => r?.reason).filter(Boolean))],
    applied_mib_total: round(rs.reduce((a, r) => a + (r?.stats?.bytesApplied ?? 0), 0) / MiB),
    guest_swap_used_mib_total: round(rs.reduce((a, r) => a + (r?.stats ? r.stats.swapTotalBytes - r.stats.swapFreeBytes : 0), 0) / MiB),
    swap_files_disk_mib_total: round(disk / MiB),
  };
}

/** The reclaiming run's stop rule: DAMON applied something, ≥ 10% of the cold bytes came back, and the charge fell < 0.2% over the last three polls. */
function plateau(series: Array<[number, number, number, number]>, beforeMib: number, coldMib: number, applied: number): boolean {
  const k = series.length;
  if (k < 4 || applied <= 0 || beforeMib - series[k - 1][1] < 0.1 * coldMib) return false;
  return series[k - 4][1] - series[k - 1][1] < 0.002 * series[k - 1][1];
}

/** Seconds from the last touch until the charge had fallen `share` of its final drop (null: no drop). */
function timeTo(series: Array<[number, number, number, number]>, beforeMib: number, share: number): number | null {
  const drop = beforeMib - series.at(-1)![1];
  return drop > 0 ? series.find(([, c]) => beforeMib - c >= share * drop)?.[0] ?? null : null;
}

async function main() {
  const p = new Command('bench-microvm-reclaim')
    .option('--n <n>', 'microVMs per run, at most (fewer when memory does not allow)', (v) => parseInt(v, 10), 50)
    .option('--guest-mib <n>', 'guest RAM per microVM, MiB', (v) => parseInt(v, 10), 384)
    .option('--cold-mib <n>', 'anonymous memory each guest touches once and keeps, MiB', (v) => parseInt(v, 10), 256)
    .option('--bound-s <n>', 'longest the reclaiming run is sampled after the last touch, s', (v) => parseInt(v, 10), 300)
    .option('--poll-s <n>', 'seconds between samples', (v) => parseInt(v, 10), 5)
    .option('--min-age-s <n>', '[vm.reclaim] min_age_s of the reclaiming run', (v) => parseInt(v, 10), 10)
    .option('--mem-share <x>', 'share of MemAvailable a run may use', Number, 0.5)
    .parse();
  const o = p.opts<Opts>();
  const availMib = memAvailable() / MiB;
  const fit = Math.floor((o.memShare * availMib) / (o.guestMib + VMM_OVERHEAD_MIB));
  const n = Math.min(o.n, fit);
  if (n < Math.min(MIN_N, o.n)) throw new Error(`only ${fit} microVMs of ${o.guestMib} MiB fit in ${o.memShare} of MemAvailable (${Math.round(availMib)} MiB); at least ${MIN_N} needed`);
  const tmp = mkdtempSync(path.join(os.tmpdir(), 'dsec-bench-vmrecl-'));
  try {
    await execa('gcc', ['-static', '-O2', '-o', path.join(tmp, 'memhog'), path.join(repoRoot(), 'test/fixtures/memhog.c')]);
    const memhog = readFileSync(path.join(tmp, 'memhog'));
    const load0 = os.loadavg()[0];
    const on = await run(true, n, o, memhog, null);
    const off = await run(false, n, o, memhog, on.duration_s);
    const returned = on.after_touch.cgroup_mib_total - on.end.cgroup_mib_total;
    const out = {
      n, n_rule: `min(--n ${o.n}, ${o.memShare} × MemAvailable ${Math.round(availMib)} MiB / ${o.guestMib + VMM_OVERHEAD_MIB} MiB per VM = ${fit})`,
      guest_mib: o.guestMib, cold_mib: o.coldMib, poll_s: o.pollS, bound_s: o.boundS, reclaim_toml: reclaimToml(o),
      host: { cpus: os.cpus().length, mem_total_mib: Math.round(os.totalmem() / MiB), memavailable_mib_at_start: Math.round(availMib), kernel: os.release(), accel: 'tcg', loadavg_start: round(load0), loadavg_end: round(os.loadavg()[0]) },
      runs: { on, off },
      saving_pct: { cgroup: round((1 - on.end.cgroup_mib_total / off.end.cgroup_mib_total) * 100), pss: round((1 - on.end.pss_mib_total / off.end.pss_mib_total) * 100) },
      cold_returned: { mib_per_vm: round(returned / n), pct: round((returned / (n * o.coldMib)) * 100) },
      seconds_to_half: timeTo(on.series, on.after_touch.cgroup_mib_total, 0.5), seconds_to_plateau: timeTo(on.series, on.after_touch.cgroup_mib_total, 0.9),
      exec_true_ms: { on: on.exec_true_ms, off: off.exec_true_ms },
    };
    const text = `${JSON.stringify(out, null, 1)}\n`;
    writeFileSync(path.join(repoRoot(), 'bench/results-microvm-reclaim.json'), text);
    process.stdout.write(text);
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

await main();
