/**
 * Liveness: an init that dies on its own (killed from outside, crashed, the agent taken by
 * the OOM killer) moves its sandbox to `failed` when it happens. dsecd holds a pidfd
 * exit watch (daemon/host/pidwatch.ts) on the init of every running sandbox no operation
 * is acting on; the reaper's sweep only reconciles the watches against a three-column
 * query, so nothing here costs per sandbox per sweep.
 */
import type { Logger } from 'pino';
import { failedPrecondition, type DsecError } from '../errors.js';
import { procStartTime } from '../host/proc.js';
import { watchExit, type ExitWatch } from '../host/pidwatch.js';
import type { SandboxRepo } from '../db/sandboxes.js';
import type { StepObserver } from '../model/steps.js';
import type { Backends } from './backends.js';
import type { SandboxLocks } from './locks.js';

/** What the liveness watch reads and acts through. */
export interface LivenessDeps {
  repo: Pick<SandboxRepo, 'find' | 'get' | 'runningInits' | 'transition' | 'event'>;
  backends: Backends;
  locks: SandboxLocks;
  /** Told the steps of the cleanup of a dead sandbox (its driver's stop). */
  steps: StepObserver;
  log: Logger;
}

/** Exit watches of the inits of running sandboxes, and what a death does. */
export class LivenessWatch {
  /** Exit watches by sandbox id. */
  private readonly watches = new Map<string, { pid: number; start: number; watch: ExitWatch }>();

  constructor(private readonly d: LivenessDeps) {}

  /**
   * Keeps an exit watch on the init of every running sandbox that no operation is acting
   * on. Called by the reaper every sweep (and {@link watch} after each start): watches
   * inits it does not watch yet, drops watches of sandboxes no longer running, and
   * handles an init found already gone. One three-column query plus one pidfd per new init.
   * @returns ids of sandboxes found dead by this call (others are handled as they die).
   */
  async check(): Promise<string[]> {
    const dead: string[] = [];
    const seen = new Set<string>();
    for (const r of this.d.repo.runningInits()) {
      seen.add(r.id);
      const w = this.watches.get(r.id);
      if (w && w.pid === r.initPid && w.start === r.initStart) continue;
      if (!this.watch(r.id, r.initPid, r.initStart) && (await this.onExit(r.id, r.initPid, r.initStart))) dead.push(r.id);
    }
    for (const [id, w] of this.watches) {
      if (seen.has(id)) continue;
      w.watch.cancel();
      this.watches.delete(id);
    }
    return dead;
  }

  /**
   * Starts watching init `pid` (start time `start`, clock ticks) of sandbox `id`,
   * replacing a watch of an earlier init. False when that init is not running now
   * (nothing is watched).
   */
  watch(id: string, pid: number, start: number): boolean {
    const old = this.watches.get(id);
    if (old && old.pid === pid && old.start === start) return true;
    old?.watch.cancel();
    this.watches.delete(id);
    let w: ExitWatch | null;
    try {
      w = watchExit(pid, start, () => {
        if (this.watches.get(id)?.watch === w) this.watches.delete(id);
        void this.onExit(id, pid, start).catch((e) => this.d.log.error({ err: e, id }, 'handling an init exit failed'));
      });
    } catch (e) {
      // No pidfd (fd exhaustion): the next sweep tries again; until then the exit is noticed there.
      this.d.log.warn({ err: e, id }, 'cannot watch the sandbox init');
      return procStartTime(pid) === start;
    }
    if (!w) return false;
    this.watches.set(id, { pid, start, watch: w });
    return true;
  }

  /**
   * Init `pid` of sandbox `id` exited (or was found gone): when the row still records it
   * as the init of a running sandbox no operation is acting on, and the driver agrees the
   * sandbox is dead, the sandbox becomes `failed` ({@link markDead}). True when it did.
   */
  private async onExit(id: string, pid: number, start: number): Promise<boolean> {
    const sb = this.d.repo.find(id);
    if (!sb || sb.state !== 'running' || sb.desired !== null || sb.initPid !== pid || sb.initStart !== start) return false;
    if (procStartTime(pid) === start) return false;
    const drv = this.d.backends.find(sb.backend);
    if (!drv || (await drv.isAlive(sb))) return false;
    await this.markDead(id);
    return true;
  }

  /**
   * Records that a running sandbox's init died on its own: cleans its runtime state and
   * mounts (the driver's stop), moves it to `failed`, and returns the error to give a
   * caller that found it dead. The writable layer stays; `start` brings the sandbox back.
   * @returns DsecError FailedPrecondition naming the way back (not thrown: the caller throws it).
   */
  async markDead(id: string): Promise<DsecError> {
    return this.d.locks.run(id, async () => {
      const sb = this.d.repo.get(id);
      if ((sb.state === 'running' || sb.state === 'paused') && sb.desired === null) {
        await this.d.backends.driver(sb.backend).stop(sb, this.d.steps).catch((e) => this.d.log.warn({ err: e, id }, 'cleanup of dead sandbox failed'));
        const f = this.d.repo.transition(id, 'failed', { initPid: null, initStart: null, error: 'sandbox init exited unexpectedly' });
        this.d.repo.event('sandbox.failed', f, f.error ?? undefined);
      }
      return failedPrecondition(`sandbox ${id} is failed: its init exited unexpectedly; start it again with \`dsec start ${id}\` or destroy it`);
    });
  }
}
