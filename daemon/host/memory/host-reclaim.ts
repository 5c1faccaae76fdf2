/**
 * The host's proactive reclaim of idle container sandboxes (issue 23), as dsecd runs it:
 * every `sweepMs` it judges which container sandboxes are idle (host/memory/idle.ts, from
 * cgroup CPU time and exec activity), and gives the memory of those idle for
 * `idleAfterMs` back to the host by the best method this host offers, chosen once at
 * start ({@link HostReclaim.start}):
 *   1. `damon`: a kdamond dsecd owns (host/memory/damon.ts; only where no kdamond it did
 *      not create exists), one `paddr` pageout scheme per idle sandbox narrowed to its
 *      memory cgroup, quotas bounding the CPU and bytes per second; re-pointed when the set
 *      of idle sandboxes changes. Bytes counted: what the schemes applied pageout to
 *      (DAMOS `sz_applied`).
 *   2. `memory.reclaim` (cgroup v2): a share of the sandbox's usage per round
 *      (host/memory/idle-reclaim.ts). Bytes counted: usage before minus after.
 *   3. `memory.force_empty` (cgroup v1, what it offers): the kernel reclaims what it can
 *      of the cgroup. Bytes counted: usage before minus after.
 *   4. `none`: mode `off`, or nothing above works here; the start logs one line saying why.
 * Without swap (this development host) methods 2 and 3 take only page cache; anonymous
 * memory stays.
 *
 * Only the container tier: a microVM's memory is reclaimed inside its guest
 * ([vm.reclaim], drivers/microvm/reclaim.ts), where the guest knows what is cold.
 */
import type { Logger } from 'pino';
import type { CgroupManager } from '../cgroups/index.js';
import type { Backend } from '../../model/backend.js';
import type { ExecActivity } from '../../sandbox/activity.js';
import type { HostReclaimConfig, ReclaimMode } from './config.js';
import type { DamonController, DamonTarget, DamonVerdict } from './damon.js';
import { IdleTracker, type IdleSample } from './idle.js';
import { IdleReclaimer } from './idle-reclaim.js';

/** How the host reclaims (see the module comment). */
export type ReclaimMethod = 'damon' | 'memory.reclaim' | 'memory.force_empty' | 'none';

/** What {@link HostReclaim.status} reports (host info, metrics). */
export interface HostReclaimStatus {
  mode: ReclaimMode;
  method: ReclaimMethod;
  /** One sentence: why this method on this host. */
  reason: string;
  /** DAMON on this host: whether dsecd owns a kdamond, and why (or why not). */
  damon: { owned: boolean; reason: string };
  /** Container sandboxes idle for at least idleAfterMs at the last sweep. */
  idleSandboxes: number;
  /** Bytes reclaimed since dsecd started, all sandboxes (destroyed ones included). */
  reclaimedBytes: number;
  /** Bytes reclaimed since dsecd started, per live sandbox. */
  bySandbox: ReadonlyMap<string, number>;
}

/** What {@link HostReclaim} acts through. */
export interface HostReclaimDeps {
  config: HostReclaimConfig;
  cgroups: Pick<CgroupManager, 'version' | 'parents' | 'stats' | 'reclaim' | 'memcgPath'>;
  /** The DAMON controller over the host's (or a test tree's) sysfs; null: DAMON not considered (`[memory] damon = false`). */
  damon: Pick<DamonController, 'detect' | 'acquire' | 'apply' | 'stats' | 'release'> | null;
  /** Running and paused sandboxes with no transition under way (SandboxRepo.settledLive). */
  candidates: () => Array<{ id: string; backend: Backend; state: 'running' | 'paused' }>;
  activity: Pick<ExecActivity, 'view' | 'retain'>;
  log: Logger;
  now?: () => number;
}

/** See the module comment. One per dsecd: {@link start}, then {@link stop} at shutdown. */
export class HostReclaim {
  private method: ReclaimMethod = 'none';
  private reason = 'not started';
  private damonVerdict: DamonVerdict = { available: false, reason: 'not probed' };
  private readonly tracker: IdleTracker;
  private readonly reclaimer: IdleReclaimer;
  private readonly now: () => number;
  private timer: NodeJS.Timeout | null = null;
  private inFlight: Promise<void> | null = null;
  private idleCount = 0;
  private total = 0;
  private readonly bySandbox = new Map<string, number>();
  /** Per container sandbox at the last sweep: idle since (ms since the epoch), or null when busy. */
  private idleSince = new Map<string, number | null>();
  /** DAMON: the idle set last applied (sorted keys), and each scheme's sz_applied counted so far. */
  private damonSet = '';
  private readonly damonSeen = new Map<string, number>();

  constructor(private readonly d: HostReclaimDeps) {
    this.now = d.now ?? Date.now;
    this.tracker = new IdleTracker(d.config.idleCpuPermil, this.now);
    this.reclaimer = new IdleReclaimer(d.cgroups, { idleAfterMs: d.config.idleAfterMs, repeatMs: d.config.repeatMs, fraction: d.config.fraction }, this.now);
  }

  /**
   * Chooses the method (module comment), logs it in one line with the reason, and starts
   * sweeping unless it is `none`. DAMON is always probed (reading only) so host info says
   * what it found; a kdamond is created only in a mode other than `off`.
   */
  async start(): Promise<void> {
    const { config: c, damon, cgroups: cg, log } = this.d;
    if (damon) {
      try {
        this.damonVerdict = c.mode === 'off' ? await damon.detect() : await damon.acquire();
      } catch (e) {
        this.damonVerdict = { available: false, reason: `DAMON could not be set up: ${(e as Error).message}` };
      }
    } else this.damonVerdict = { available: false, reason: '[memory] damon = false: DAMON is not used' };
    if (c.mode === 'off') {
      this.set('none', 'reclaim = off: idle sandboxes are not reclaimed (a pause still reclaims the sandbox it freezes); set [memory] reclaim or dsecd --reclaim idle|aggressive');
    } else if (this.damonVerdict.available) {
      this.set('damon', `DAMON: ${this.damonVerdict.reason}`);
    } else if (cg.version === 2) {
      this.set('memory.reclaim', `cgroup v2 memory.reclaim of sandboxes idle for ${c.idleAfterMs / 1000} s, ${Math.round(c.fraction * 100)}% of their usage per round; DAMON not used: ${this.damonVerdict.reason}`);
    } else if (cg.parents.memory !== undefined) {
      this.set('memory.force_empty', `cgroup v1 (no memory.reclaim): memory.force_empty of sandboxes idle for ${c.idleAfterMs / 1000} s; without swap only page cache comes back; DAMON not used: ${this.damonVerdict.reason}`);
    } else {
      this.set('none', `no method: no memory cgroup hierarchy is mounted and DAMON is not usable (${this.damonVerdict.reason})`);
    }
    (this.method === 'none' && c.mode !== 'off' ? log.warn.bind(log) : log.info.bind(log))({ mode: c.mode, method: this.method }, `memory reclaim: ${this.method} (${this.reason})`);
    if (this.method === 'none') return;
    this.timer = setInterval(() => void this.sweep(), c.sweepMs);
    this.timer.unref();
  }

  private set(method: ReclaimMethod, reason: string): void {
    this.method = method;
    this.reason = reason;
  }

  /** The current status (see {@link HostReclaimStatus}). */
  status(): HostReclaimStatus {
    return {
      mode: this.d.config.mode, method: this.method, reason: this.reason,
      damon: { owned: this.method === 'damon', reason: this.damonVerdict.reason },
      idleSandboxes: this.idleCount, reclaimedBytes: this.total, bySandbox: this.bySandbox,
    };
  }

  /**
   * One sandbox as of the last sweep (for its stats): since when it is idle (ms since
   * the epoch; null: busy, or not judged: another tier, or reclaim off) and the bytes
   * reclaimed from it since dsecd started.
   */
  sandbox(id: string): { idleSinceMs: number | null; reclaimedBytes: number } {
    return { idleSinceMs: this.idleSince.get(id) ?? null, reclaimedBytes: this.bySandbox.get(id) ?? 0 };
  }

  /** One sweep (the timer's; tests call it directly). Overlapping calls join the one in flight. Errors are logged, never thrown. */
  sweep(): Promise<void> {
    this.inFlight ??= this.sweepOnce().catch((e) => this.d.log.error({ err: e }, `memory reclaim (${this.method}): sweep failed`)).finally(() => { this.inFlight = null; });
    return this.inFlight;
  }

  private async sweepOnce(): Promise<void> {
    if (this.method === 'none') return;
    const live = this.d.candidates().filter((c) => c.backend === 'container');
    const ids = new Set(live.map((c) => c.id));
    this.d.activity.retain(ids);
    for (const id of [...this.bySandbox.keys()]) if (!ids.has(id)) this.bySandbox.delete(id);
    const samples: IdleSample[] = [];
    for (const c of live) {
      let cpuNs: number | null = null;
      if (c.state === 'running') cpuNs = await this.d.cgroups.stats(c.id).then((s) => s.cpuUsageNs, () => null);
      const a = this.d.activity.view(c.id);
      samples.push({ id: c.id, state: c.state, cpuNs, execsRunning: a.running, lastExecMs: a.lastMs });
    }
    const idle = this.tracker.observe(samples);
    this.idleSince = idle;
    const t = this.now();
    this.idleCount = [...idle.values()].filter((s) => s !== null && t - s >= this.d.config.idleAfterMs).length;
    if (this.method === 'damon') await this.sweepDamon(idle, t);
    else await this.sweepCgroups(idle);
  }

  private add(id: string, bytes: number): void {
    if (!(bytes > 0)) return;
    this.total += bytes;
    this.bySandbox.set(id, (this.bySandbox.get(id) ?? 0) + bytes);
  }

  private async sweepCgroups(idle: Map<string, number | null>): Promise<void> {
    try {
      const done = await this.reclaimer.sweep([...idle].map(([id, idleSinceMs]) => ({ id, idleSinceMs })));
      for (const r of done) {
        this.add(r.id, r.beforeBytes - r.afterBytes);
        this.d.log.debug({ id: r.id, beforeBytes: r.beforeBytes, afterBytes: r.afterBytes }, 'memory reclaim: idle sandbox reclaimed');
      }
    } catch (e) {
      if ((e as { kind?: string }).kind !== 'Unimplemented') throw e;
      this.set('none', `${this.method} is not offered by this kernel (${(e as Error).message}); idle sandboxes are not reclaimed`);
      this.d.log.warn({ method: this.method }, `memory reclaim: none (${this.reason})`);
    }
  }

  /**
   * Points dsecd's kdamond at the sandboxes idle past the threshold (re-applied only when
   * that set changes), then counts what each scheme applied since the last sweep. After a
   * change the first read is a new baseline, since a scheme's index may now be another
   * sandbox's: bytes are never credited to the wrong sandbox.
   */
  private async sweepDamon(idle: Map<string, number | null>, t: number): Promise<void> {
    const damon = this.d.damon!;
    const targets: DamonTarget[] = [];
    for (const [id, since] of idle) {
      if (since === null || t - since < this.d.config.idleAfterMs) continue;
      const memcgPath = this.d.cgroups.memcgPath(id);
      if (memcgPath !== null) targets.push({ key: id, memcgPath });
    }
    targets.sort((a, b) => (a.key < b.key ? -1 : 1));
    const set = targets.map((x) => x.key).join(',');
    let fresh = false;
    if (set !== this.damonSet) {
      await damon.apply(targets, this.d.config.damonParams);
      this.damonSet = set;
      this.damonSeen.clear();
      fresh = true;
    }
    if (targets.length === 0) return;
    for (const [key, st] of await damon.stats()) {
      const prev = this.damonSeen.get(key);
      this.damonSeen.set(key, st.bytesApplied);
      if (fresh || prev === undefined) continue;
      this.add(key, st.bytesApplied >= prev ? st.bytesApplied - prev : st.bytesApplied);
    }
  }

  /** Stops sweeping, waits for a sweep in flight, and removes dsecd's kdamond (only its own). Safe to call twice. */
  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.inFlight;
    if (this.method === 'damon') {
      await this.d.damon!.release().catch((e) => this.d.log.error({ err: e }, 'memory reclaim: removing dsecd\'s kdamond failed'));
      this.set('none', 'stopped');
    }
  }
}
