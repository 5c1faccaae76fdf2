/**
 * The reaper: a periodic sweep over the durable store that destroys sandboxes whose
 * TTL has passed (`created_at + ttl_s * 1000 <= now`), marks running sandboxes whose
 * init died `failed`, pauses the sandboxes of lapsed job leases and idle sandboxes,
 * destroys those whose lease lapsed longer ago than the grace period, records sandboxes
 * whose writable layer filled its quota, and prunes old events. Expiry is computed from the
 * store on every sweep, never held in in-memory timers, so a restart neither loses
 * nor double-fires an expiry: a sandbox that expired while dsecd was down is destroyed
 * by the first sweep after start.
 */
import type { TrajectoryLog } from './trajectory.js';
import type { Logger } from 'pino';
import type { SandboxRepo } from '../db/sandboxes.js';
import type { DiskQuotaWatch } from './disk-quota.js';
import type { SandboxLifecycle } from './lifecycle.js';
import type { LimitWatch } from './limits.js';
import type { LivenessWatch } from './liveness.js';
import type { RoundService } from './rounds.js';
import { isDsecError } from '../errors.js';

/** Sweep interval: 1 s, so a TTL fires at most ~1 s late; one indexed query per sweep. */
export const REAP_INTERVAL_MS = 1000;

/**
 * Limit counters (OOM kills, forks refused at the pids limit) are read every 5th sweep:
 * two small cgroup reads per running sandbox, ~2,000 reads/s at 5,000 sandboxes, so an
 * OOM or a fork bomb shows as an event within ~5 s.
 */
export const LIMIT_WATCH_SWEEPS = 5;

/** The services a sweep drives. */
export interface ReaperServices {
  liveness: Pick<LivenessWatch, 'check'>;
  limits: Pick<LimitWatch, 'sweep'>;
  disks: Pick<DiskQuotaWatch, 'check'>;
  rounds: Pick<RoundService, 'sweepLeases'>;
  lifecycle: Pick<SandboxLifecycle, 'destroy'>;
}

/** Periodic TTL enforcement and event pruning; `start()` after reconcile, `stop()` at shutdown. */
export class Reaper {
  private timer: NodeJS.Timeout | null = null;
  private running = false;
  private sweeps = 0;
  private readonly inFlight = new Set<string>();

  constructor(
    private readonly repo: SandboxRepo,
    private readonly services: ReaperServices,
    private readonly log: Logger,
    /** Event and trajectory retention (see DaemonConfig.retention). */
    private readonly retention: { eventsMax: number; eventsMaxAgeMs: number; trajectoryMaxAgeMs?: number } = { eventsMax: 100_000, eventsMaxAgeMs: 7 * 86400_000 },
    private readonly intervalMs = REAP_INTERVAL_MS,
    /** The trajectory log to prune, if any. */
    private readonly trajectories: TrajectoryLog | null = null,
  ) {}

  /** Starts sweeping. Safe to call twice. */
  start(): void {
    if (this.timer) return;
    this.timer = setInterval(() => void this.sweep(), this.intervalMs);
    this.timer.unref();
  }

  /** Stops sweeping; an in-flight destroy finishes on its own. */
  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** One sweep: destroys every expired sandbox not already being destroyed. Returns the ids it destroyed. */
  async sweep(now = Date.now()): Promise<string[]> {
    if (this.running) return [];
    this.running = true;
    const done: string[] = [];
    try {
      this.sweeps += 1;
      if (this.sweeps % 60 === 1) {
        this.repo.pruneEvents(this.retention.eventsMax, now - this.retention.eventsMaxAgeMs);
        const age = this.retention.trajectoryMaxAgeMs;
        if (this.trajectories && age !== undefined) this.trajectories.prune(now - age, now - 2 * age, now);
      }
      await this.services.liveness.check().catch((e) => this.log.error({ err: e }, 'reaper: liveness check failed'));
      if (this.sweeps % LIMIT_WATCH_SWEEPS === 1)
        await this.services.limits.sweep().catch((e) => this.log.error({ err: e }, 'reaper: limit counters sweep failed'));
      this.services.disks.check();
      await this.services.rounds.sweepLeases(now).catch((e) => this.log.error({ err: e }, 'reaper: lease/idle sweep failed'));
      for (const id of this.repo.expired(now)) {
        if (this.inFlight.has(id)) continue;
        this.inFlight.add(id);
        try {
          await this.services.lifecycle.destroy(id, true, 'ttl expired');
          done.push(id);
        } catch (e) {
          if (!isDsecError(e, 'NotFound')) this.log.error({ err: e, id }, 'reaper: destroy of expired sandbox failed');
        } finally {
          this.inFlight.delete(id);
        }
      }
    } finally {
      this.running = false;
    }
    return done;
  }
}
