/**
 * The host's DAMON controller (issue 23): proactive reclaim of container sandboxes'
 * cold memory by a DAMON kdamond that dsecd owns, on the host's physical address space
 * (`paddr`), one DAMOS `pageout` scheme per target sandbox, each narrowed to that
 * sandbox's memory cgroup by a memcg filter.
 *
 * Ownership (the rule that protects the host). DAMON's sysfs interface has one global set
 * of kdamonds, and writing `kdamonds/nr_kdamonds` tears every existing kdamond directory
 * down (the kernel refuses only while one runs). So dsecd owns DAMON only when no
 * kdamond exists that it did not create: it creates exactly one (`nr_kdamonds` 0 → 1),
 * records that in its ownership file (`<dsecd root>/damon-owner.json`, with the host's
 * boot id), and after a restart recognises it by that record. Any other kdamond (the
 * machine's own, another dsecd instance's, one left from an earlier boot) makes it stand
 * aside: it never writes anything then, and {@link DamonController.detect} says why (for
 * `dsec host info`), so dsec uses its fallback (memory.reclaim; host/memory/idle-reclaim.ts).
 * Teardown ({@link DamonController.release}) turns off and removes only its own kdamond.
 *
 * Order of writes (Documentation/admin-guide/mm/damon/usage.rst: each directory exists
 * only after its parent's `nr_*` file was written; the kernel reads the files when the
 * kdamond is turned `on`, or again on `commit`):
 *   kdamonds/nr_kdamonds → kdamonds/0/contexts/nr_contexts → contexts/0/avail_operations
 *   (checked) → operations → monitoring_attrs/intervals/* → targets/nr_targets →
 *   targets/0/regions/nr_regions → regions/<i>/{start,end} (the host's System RAM) →
 *   schemes/nr_schemes → per scheme: action, access_pattern/*, quotas/*, watermarks/*,
 *   the memcg filter → state `on` (stopped) or `commit` (running).
 *
 * Filters, in both layouts it meets:
 *   - 6.12 (`schemes/<n>/filters/`, no `allow` file): filters only exclude; `type memcg`,
 *     `memcg_path <sandbox>`, `matching N` excludes every page *not* in that memcg.
 *   - 6.14+ (`schemes/<n>/ops_filters/` for operations-layer filters such as memcg, each
 *     with `allow`): the same filter with `allow N` (reject what matches: pages outside the
 *     memcg). Unmatched pages are allowed either way, so the meaning does not depend on a
 *     kernel's default for unmatched memory (which changed in 6.15).
 *   One scheme per target, because a 6.12 exclude-filter cannot keep two memcgs in one
 *   scheme; the time and size quotas are split evenly between the schemes, so the whole
 *   kdamond never exceeds the configured share of a core.
 *
 * The root of the sysfs tree and all I/O are injectable ({@link SysfsIo}), so tests run
 * this against directory trees shaped like DAMON's sysfs (test/fixtures/damon-sysfs.ts)
 * and, in a guest with its own kernel, against the real one. Never against a host's DAMON
 * that runs a kdamond of its own: detect() reads, and stands aside.
 */
import { open, readFile, readdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import { constants as fsConstants } from 'node:fs';
import path from 'node:path';
import { failedPrecondition, internal } from '../../errors.js';

/** Where the kernel's DAMON sysfs directory is. */
export const DAMON_SYSFS_ROOT = '/sys/kernel/mm/damon';

/**
 * File operations on the DAMON sysfs tree. `write` opens an existing file write-only
 * (O_WRONLY|O_TRUNC, never O_CREAT: sysfs has no such thing as a new file) and writes
 * the value in one call; errors carry node's `code` (ENOENT, EBUSY, EINVAL, …).
 */
export interface SysfsIo {
  read(file: string): Promise<string>;
  write(file: string, value: string): Promise<void>;
  exists(p: string): Promise<boolean>;
  list(dir: string): Promise<string[]>;
}

/** {@link SysfsIo} on the real filesystem. */
export const fsSysfsIo: SysfsIo = {
  read: (file) => readFile(file, 'utf8'),
  async write(file, value) {
    const fh = await open(file, fsConstants.O_WRONLY | fsConstants.O_TRUNC);
    try {
      await fh.write(value);
    } finally {
      await fh.close();
    }
  },
  exists: (p) => stat(p).then(() => true, () => false),
  list: (dir) => readdir(dir),
};

/** What reclaim the kdamond applies: the scheme's access pattern and the whole kdamond's quotas. */
export interface DamonReclaimParams {
  /** A region not accessed for this long is paged out, ms. */
  minAgeMs: number;
  /** DAMON sampling and aggregation intervals, µs. */
  sampleUs: number;
  aggrUs: number;
  /** CPU the whole kdamond may spend applying schemes: ms per second (split across schemes, at least 1 each). */
  cpuMsPerS: number;
  /** Bytes per second the whole kdamond may page out (split across schemes). */
  bytesPerS: number;
}

/** One sandbox to reclaim: a key (the sandbox id) and its memory cgroup as DAMON names it (CgroupManager.memcgPath). */
export interface DamonTarget {
  key: string;
  memcgPath: string;
}

/** DAMOS stats of one target's scheme (as of the last `update_schemes_stats`). Counts and bytes. */
export interface DamonSchemeStats {
  nrTried: number;
  bytesTried: number;
  nrApplied: number;
  bytesApplied: number;
  quotaExceeds: number;
}

/** The controller's verdict on this host's DAMON: whether dsecd owns (or may own) a kdamond, and why. */
export interface DamonVerdict {
  /** dsecd owns a kdamond here (or none exists and it may create one). */
  available: boolean;
  /** One sentence for `dsec host info`: what was found, and what dsec does instead when not available. */
  reason: string;
  /** The filters layout of this kernel's schemes, once known (after the first scheme was made). */
  layout?: 'filters' | 'ops_filters';
}

/** The ownership record kept in dsecd's root. */
interface OwnerRecord {
  /** /proc/sys/kernel/random/boot_id when the kdamond was created. */
  bootId: string;
  /** Index of the kdamond dsecd created (always 0: it only creates when none exist). */
  kdamond: number;
}

/** Options of {@link DamonController}. */
export interface DamonControllerOptions {
  /** The DAMON sysfs dir (default {@link DAMON_SYSFS_ROOT}); tests pass a fixture tree's. */
  root?: string;
  /** File operations (default {@link fsSysfsIo}). */
  io?: SysfsIo;
  /** The ownership record's path (`<dsecd root>/damon-owner.json`). */
  ownerFile: string;
  /** The host's boot id (default: /proc/sys/kernel/random/boot_id). */
  bootId?: () => Promise<string>;
  /** The host's /proc/iomem text (default: read it; root-only addresses). */
  iomem?: () => Promise<string>;
}

/** Most System RAM ranges handed to DAMON as the paddr target's regions. */
const MAX_RAM_RANGES = 64;
/** System RAM ranges smaller than this are not monitored (the legacy low 640 KiB, firmware holes): 4 MiB. */
const MIN_RAM_RANGE = 4 * 1024 * 1024;
/** DAMOS quota reset interval: 1 s, so the quotas read per second. */
const QUOTA_RESET_MS = 1000;

/**
 * The host's System RAM ranges in `/proc/iomem` text (top-level `start-end : System RAM`
 * lines, end inclusive) as [start, end) byte addresses, at least {@link MIN_RAM_RANGE}
 * each, at most {@link MAX_RAM_RANGES}. BigInt: addresses exceed 2^53 on large hosts.
 */
export function systemRamRanges(iomem: string): Array<[bigint, bigint]> {
  const out: Array<[bigint, bigint]> = [];
  for (const line of iomem.split('\n')) {
    const m = /^([0-9a-f]+)-([0-9a-f]+) : System RAM$/.exec(line);
    if (!m) continue;
    const a = BigInt(`0x${m[1]}`);
    const b = BigInt(`0x${m[2]}`) + 1n;
    if (b - a >= BigInt(MIN_RAM_RANGE) && out.length < MAX_RAM_RANGES) out.push([a, b]);
  }
  return out;
}

/** See the module comment. One per dsecd; methods must not run concurrently (the caller serialises them). */
export class DamonController {
  private readonly root: string;
  private readonly io: SysfsIo;
  private layout: 'filters' | 'ops_filters' | undefined;
  /** Target keys in scheme order, as last applied. */
  private applied: DamonTarget[] = [];

  constructor(private readonly o: DamonControllerOptions) {
    this.root = o.root ?? DAMON_SYSFS_ROOT;
    this.io = o.io ?? fsSysfsIo;
  }

  private admin(...p: string[]): string {
    return path.join(this.root, 'admin', ...p);
  }

  private kd(...p: string[]): string {
    return this.admin('kdamonds', '0', ...p);
  }

  private ctx(...p: string[]): string {
    return this.kd('contexts', '0', ...p);
  }

  private async readTrim(file: string): Promise<string> {
    return (await this.io.read(file)).trim();
  }

  /** Writes one file, naming it in the error. @throws DsecError Internal (FailedPrecondition for ENOENT: the kernel lacks the file). */
  private async put(file: string, value: string | number | bigint): Promise<void> {
    try {
      await this.io.write(file, String(value));
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      const what = `DAMON: writing '${value}' to ${path.relative(this.root, file)} failed (${code ?? (e as Error).message})`;
      // ENOENT is either the file missing (a kernel without it) or the kernel's answer to the value (a memcg path that does not exist).
      if (code === 'ENOENT' && !(await this.io.exists(file))) throw failedPrecondition(`${what}: this kernel's DAMON sysfs lacks that file`, e);
      throw internal(what, e);
    }
  }

  private async bootId(): Promise<string> {
    return this.o.bootId ? this.o.bootId() : (await readFile('/proc/sys/kernel/random/boot_id', 'utf8')).trim();
  }

  private async owner(): Promise<OwnerRecord | null> {
    try {
      const r = JSON.parse(await readFile(this.o.ownerFile, 'utf8')) as OwnerRecord;
      return r.bootId === (await this.bootId()) && r.kdamond === 0 ? r : null;
    } catch {
      return null;
    }
  }

  /** Whether kdamonds/0 is dsecd's: exactly one kdamond exists and this boot's ownership record names it. */
  private async ours(n: number): Promise<boolean> {
    return n === 1 && (await this.owner()) !== null;
  }

  /**
   * This host's DAMON, by reading only: no DAMON sysfs; a kdamond dsecd did not create
   * (described: its state, pid, operations, schemes); dsecd's own; or none (dsecd may
   * create one). Never writes.
   */
  async detect(): Promise<DamonVerdict> {
    if (!(await this.io.exists(this.admin('kdamonds', 'nr_kdamonds')))) {
      return { available: false, reason: `the kernel has no DAMON sysfs interface (${this.admin()} is missing: CONFIG_DAMON_SYSFS); idle sandboxes are reclaimed through memory cgroups instead` };
    }
    const n = Number(await this.readTrim(this.admin('kdamonds', 'nr_kdamonds')));
    if (n === 0) return { available: true, reason: 'no kdamond runs on this host: dsecd may create and own one (paddr with memcg filters)' };
    if (await this.ours(n)) return { available: true, reason: `dsecd owns kdamond 0 (${await this.describe(0)})`, ...(this.layout ? { layout: this.layout } : {}) };
    const found: string[] = [];
    for (let i = 0; i < Math.min(n, 4); i++) found.push(`kdamond ${i}: ${await this.describe(i)}`);
    return {
      available: false,
      reason: `${n} kdamond(s) exist that dsecd did not create (${found.join('; ')}); writing nr_kdamonds would tear them down, so dsecd leaves DAMON alone and reclaims idle sandboxes through memory cgroups instead`,
    };
  }

  /** One kdamond in words (state, pid, operations, number of schemes), from its files; what cannot be read is left out. */
  private async describe(i: number): Promise<string> {
    const k = (...p: string[]) => this.admin('kdamonds', String(i), ...p);
    const r = async (f: string) => this.readTrim(f).catch(() => null);
    const state = await r(k('state'));
    const pid = await r(k('pid'));
    const ops = await r(k('contexts', '0', 'operations'));
    const schemes = await r(k('contexts', '0', 'schemes', 'nr_schemes'));
    return [state && `state ${state}`, state === 'on' && pid && `pid ${pid}`, ops && `operations ${ops}`, schemes && `${schemes} scheme(s)`].filter(Boolean).join(', ') || 'unreadable';
  }

  /**
   * Takes ownership when nothing else runs: creates kdamond 0 and its context, checks
   * that the kernel has `paddr`, records ownership. Safe to call when already owned. A
   * kernel without paddr gets its kdamond removed again.
   * @returns the verdict; `available: false` (with the reason) when it stood aside.
   * @throws DsecError Internal/FailedPrecondition when a write the kernel should accept fails.
   */
  async acquire(): Promise<DamonVerdict> {
    const v = await this.detect();
    if (!v.available) return v;
    const n = Number(await this.readTrim(this.admin('kdamonds', 'nr_kdamonds')));
    if (n === 0) {
      // The record first: a crash between the two leaves a record and no kdamond (harmless),
      // never a kdamond of dsecd's that the next start would take for a foreign one.
      const tmp = `${this.o.ownerFile}.tmp`;
      await writeFile(tmp, JSON.stringify({ bootId: await this.bootId(), kdamond: 0 } satisfies OwnerRecord), { mode: 0o600 });
      await rename(tmp, this.o.ownerFile);
      await this.put(this.admin('kdamonds', 'nr_kdamonds'), 1);
    }
    if (!(await this.io.exists(this.ctx()))) await this.put(this.kd('contexts', 'nr_contexts'), 1);
    const avail = (await this.readTrim(this.ctx('avail_operations'))).split(/\s+/);
    if (!avail.includes('paddr')) {
      await this.release();
      return { available: false, reason: `this kernel's DAMON has no paddr operations (avail_operations: ${avail.join(' ') || 'none'}); idle sandboxes are reclaimed through memory cgroups instead` };
    }
    return { available: true, reason: `dsecd owns kdamond 0 (${await this.describe(0)})`, ...(this.layout ? { layout: this.layout } : {}) };
  }

  /**
   * Points the kdamond at `targets` (one pageout scheme each, see the module comment) and
   * runs it: `on` when stopped, `commit` when running; with no targets it is turned off
   * (and kept). Only on an owned kdamond ({@link acquire} first).
   * @throws DsecError FailedPrecondition when dsecd does not own the kdamond (nothing is
   *   written) or the kernel lacks a file; Internal when the kernel refuses a write (e.g.
   *   a memcg path that does not exist).
   */
  async apply(targets: readonly DamonTarget[], p: DamonReclaimParams): Promise<void> {
    const n = Number(await this.readTrim(this.admin('kdamonds', 'nr_kdamonds')).catch(() => '0'));
    if (!(await this.ours(n))) throw failedPrecondition('DAMON: dsecd does not own a kdamond on this host (acquire() first; it stands aside when others exist)');
    const running = (await this.readTrim(this.kd('state'))) === 'on';
    if (targets.length === 0) {
      if (running) await this.put(this.kd('state'), 'off');
      this.applied = [];
      return;
    }
    if (!(await this.io.exists(this.ctx()))) await this.put(this.kd('contexts', 'nr_contexts'), 1);
    await this.put(this.ctx('operations'), 'paddr');
    await this.put(this.ctx('monitoring_attrs', 'intervals', 'sample_us'), p.sampleUs);
    await this.put(this.ctx('monitoring_attrs', 'intervals', 'aggr_us'), p.aggrUs);
    if (Number(await this.readTrim(this.ctx('targets', 'nr_targets'))) !== 1) await this.put(this.ctx('targets', 'nr_targets'), 1);
    const ram = systemRamRanges(this.o.iomem ? await this.o.iomem() : await readFile('/proc/iomem', 'utf8'));
    if (ram.length === 0) throw failedPrecondition('DAMON: no System RAM ranges in /proc/iomem (addresses are hidden from a process without CAP_SYS_ADMIN)');
    const regions = this.ctx('targets', '0', 'regions');
    await this.put(path.join(regions, 'nr_regions'), ram.length);
    for (let i = 0; i < ram.length; i++) {
      await this.put(path.join(regions, String(i), 'start'), ram[i][0]);
      await this.put(path.join(regions, String(i), 'end'), ram[i][1]);
    }
    await this.put(this.ctx('schemes', 'nr_schemes'), targets.length);
    const age = Math.ceil((p.minAgeMs * 1000) / p.aggrUs);
    const ms = p.cpuMsPerS > 0 ? Math.max(1, Math.floor(p.cpuMsPerS / targets.length)) : 0;
    const bytes = Math.floor(p.bytesPerS / targets.length);
    for (let i = 0; i < targets.length; i++) {
      const s = (...q: string[]) => this.ctx('schemes', String(i), ...q);
      await this.put(s('action'), 'pageout');
      await this.put(s('access_pattern', 'sz', 'min'), 4096);
      await this.put(s('access_pattern', 'sz', 'max'), '18446744073709551615');
      await this.put(s('access_pattern', 'nr_accesses', 'min'), 0);
      await this.put(s('access_pattern', 'nr_accesses', 'max'), 0);
      await this.put(s('access_pattern', 'age', 'min'), age);
      await this.put(s('access_pattern', 'age', 'max'), 4294967295);
      await this.put(s('quotas', 'ms'), ms);
      await this.put(s('quotas', 'bytes'), bytes);
      await this.put(s('quotas', 'reset_interval_ms'), QUOTA_RESET_MS);
      await this.put(s('quotas', 'weights', 'sz_permil'), 0);
      await this.put(s('quotas', 'weights', 'nr_accesses_permil'), 0);
      await this.put(s('quotas', 'weights', 'age_permil'), 1000);
      await this.put(s('watermarks', 'metric'), 'none');
      await this.writeMemcgFilter(s(), targets[i].memcgPath);
    }
    await this.put(this.kd('state'), running ? 'commit' : 'on');
    this.applied = [...targets];
  }

  /** The memcg filter of one scheme in this kernel's layout (see the module comment). */
  private async writeMemcgFilter(scheme: string, memcgPath: string): Promise<void> {
    this.layout ??= (await this.io.exists(path.join(scheme, 'ops_filters'))) ? 'ops_filters' : 'filters';
    const dir = path.join(scheme, this.layout);
    await this.put(path.join(dir, 'nr_filters'), 1);
    const f = (x: string) => path.join(dir, '0', x);
    await this.put(f('type'), 'memcg');
    await this.put(f('memcg_path'), memcgPath);
    await this.put(f('matching'), 'N');
    // allow exists from 6.14 on (in either directory): N rejects what matches, i.e. pages outside the memcg.
    if (await this.io.exists(f('allow'))) await this.put(f('allow'), 'N');
  }

  /**
   * Refreshes and reads the schemes' stats (`update_schemes_stats`; on 6.12 that write
   * returns once the kdamond handled it, up to an aggregation interval later), by target
   * key. Empty when the kdamond is off or not ours.
   */
  async stats(): Promise<Map<string, DamonSchemeStats>> {
    const out = new Map<string, DamonSchemeStats>();
    const n = Number(await this.readTrim(this.admin('kdamonds', 'nr_kdamonds')).catch(() => '0'));
    if (!(await this.ours(n)) || (await this.readTrim(this.kd('state'))) !== 'on') return out;
    await this.put(this.kd('state'), 'update_schemes_stats');
    for (let i = 0; i < this.applied.length; i++) {
      const st = (f: string) => this.readTrim(this.ctx('schemes', String(i), 'stats', f)).then(Number);
      out.set(this.applied[i].key, {
        nrTried: await st('nr_tried'), bytesTried: await st('sz_tried'), nrApplied: await st('nr_applied'), bytesApplied: await st('sz_applied'), quotaExceeds: await st('qt_exceeds'),
      });
    }
    return out;
  }

  /**
   * Turns dsecd's kdamond off and removes it (`nr_kdamonds` 0), then the ownership record.
   * Only its own: with any other kdamond present (or none of ours) nothing is written.
   * Safe to call twice.
   */
  async release(): Promise<void> {
    const file = this.admin('kdamonds', 'nr_kdamonds');
    if (!(await this.io.exists(file))) return;
    const n = Number(await this.readTrim(file));
    if (!(await this.ours(n))) return;
    if ((await this.readTrim(this.kd('state'))) === 'on') await this.put(this.kd('state'), 'off');
    await this.put(file, 0);
    this.applied = [];
    await rm(this.o.ownerFile, { force: true });
  }
}
