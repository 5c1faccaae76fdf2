/**
 * RL rounds: pause and resume (freeze a sandbox between rounds, reclaiming its memory),
 * operations on every sandbox of a label selector at once, and job leases (while a job
 * renews its lease its sandboxes live; when it lapses they are paused, then destroyed),
 * plus the idle timeout that pauses a sandbox nobody executes in. Every decision of the
 * lease sweep is read from the store, so a restart neither loses nor repeats one.
 */
import type { Logger } from 'pino';
import { DsecError, failedPrecondition, invalidArgument, notFound, wrap } from '../errors.js';
import type { DaemonConfig } from '../config.js';
import type { ReclaimReport } from '../drivers/types.js';
import type { Lease, SandboxRepo } from '../db/sandboxes.js';
import type { SandboxRecord } from '../model/sandbox.js';
import { SYSTEM_SCOPE, tenantScope, type Scope } from '../model/tenant.js';
import type { Backends } from './backends.js';
import type { SandboxLifecycle } from './lifecycle.js';
import type { SandboxLocks } from './locks.js';

/** Actions of {@link RoundService.bulk}. */
export type BulkAction = 'pause' | 'resume' | 'stop' | 'destroy' | 'set_ttl';

/** One sandbox's outcome in a bulk operation. */
export interface BulkResult {
  id: string;
  ok: boolean;
  state?: string;
  reclaim?: ReclaimReport;
  error?: { code: string; message: string };
}

/** A lease with the number of sandboxes labelled `job=<job>`. */
export interface LeaseView extends Lease {
  sandboxes: number;
}

/** Sandboxes a bulk operation acts on at once: 8. */
const BULK_CONCURRENCY = 8;

/** What the round service reads and acts through. */
export interface RoundDeps {
  /** `[leases]`: how long a lapsed lease's paused sandboxes wait before they are destroyed. */
  config: Pick<DaemonConfig, 'leases'>;
  repo: SandboxRepo;
  backends: Backends;
  locks: SandboxLocks;
  /** Stop, destroy and selection for bulk operations. */
  lifecycle: Pick<SandboxLifecycle, 'stop' | 'destroy' | 'list'>;
  log: Logger;
}

/** Pause and resume, bulk operations by selector, leases and idle timeouts. */
export class RoundService {
  constructor(private readonly d: RoundDeps) {}

  /**
   * Pauses a running sandbox: freezes every process and reclaims its page cache
   * (anonymous memory too where the host has swap). Idempotent: pausing a paused
   * sandbox returns it with no reclaim report.
   * @throws DsecError NotFound, FailedPrecondition (not running).
   */
  async pause(id: string): Promise<{ sandbox: SandboxRecord; reclaim: ReclaimReport | null }> {
    return this.d.locks.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (sb.state === 'paused') return { sandbox: sb, reclaim: null };
      if (sb.state !== 'running') throw failedPrecondition(`sandbox ${id} is ${sb.state}; only a running sandbox can be paused`);
      const drv = this.d.backends.driver(sb.backend);
      this.d.repo.setDesired(id, 'paused');
      let reclaim: ReclaimReport;
      try {
        reclaim = await drv.pause(sb);
      } catch (e) {
        await drv.resume(sb).catch(() => {});
        this.d.repo.setDesired(id, null);
        throw e instanceof DsecError ? e : wrap(e, `pause sandbox ${id}`);
      }
      const done = this.d.repo.transition(id, 'paused');
      this.d.repo.event('sandbox.paused', done, `reclaimed ${reclaim.reclaimed_bytes} bytes`);
      return { sandbox: done, reclaim };
    });
  }

  /**
   * Resumes a paused sandbox exactly where it stopped. Idempotent on a running one.
   * @throws DsecError NotFound, FailedPrecondition (not paused or running).
   */
  async resume(id: string): Promise<SandboxRecord> {
    return this.d.locks.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (sb.state === 'running') return sb;
      if (sb.state !== 'paused') throw failedPrecondition(`sandbox ${id} is ${sb.state}; only a paused sandbox can be resumed`);
      this.d.repo.setDesired(id, 'running');
      await this.d.backends.driver(sb.backend).resume(sb);
      const done = this.d.repo.transition(id, 'running');
      this.d.repo.touchActive(id);
      this.d.repo.event('sandbox.resumed', done);
      return done;
    });
  }

  /**
   * Applies one action to every sandbox matching `selector`, at most
   * {@link BULK_CONCURRENCY} at a time, and reports a result per sandbox (one failure
   * does not stop the others).
   * @param opts.ttlS set_ttl: seconds from creation, null removes the TTL; opts.graceMs stop: the grace before SIGKILL.
   * @param scope whose sandboxes the selector matches (only the caller's tenant's, every tenant's for an admin).
   * @throws DsecError InvalidArgument for a malformed or empty selector.
   */
  async bulk(selector: string, action: BulkAction, opts: { ttlS?: number | null; graceMs?: number } = {}, scope: Scope = SYSTEM_SCOPE): Promise<BulkResult[]> {
    if (!selector.trim()) throw invalidArgument('bulk operations need a non-empty selector (e.g. job=a,round=3)');
    const targets = this.d.lifecycle.list(selector, undefined, scope);
    const results: BulkResult[] = new Array(targets.length);
    let next = 0;
    const worker = async () => {
      while (next < targets.length) {
        const i = next++;
        const id = targets[i].id;
        try {
          let sb: SandboxRecord;
          let reclaim: ReclaimReport | null = null;
          switch (action) {
            case 'pause': ({ sandbox: sb, reclaim } = await this.pause(id)); break;
            case 'resume': sb = await this.resume(id); break;
            case 'stop': sb = await this.d.lifecycle.stop(id, opts.graceMs); break;
            case 'destroy': sb = await this.d.lifecycle.destroy(id, true, 'bulk destroy'); break;
            case 'set_ttl': sb = this.d.repo.setTtl(id, opts.ttlS ?? null); break;
          }
          results[i] = { id, ok: true, state: sb.state, ...(reclaim ? { reclaim } : {}) };
        } catch (e) {
          const err = e instanceof DsecError ? e : wrap(e, `${action} ${id}`);
          results[i] = { id, ok: false, error: { code: err.kind, message: err.message } };
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(BULK_CONCURRENCY, targets.length) }, worker));
    return results;
  }

  /**
   * One sweep of lease expiry and idle timeouts (called by the reaper): lapsed leases
   * pause their job's sandboxes; leases lapsed longer than the destroy grace destroy them
   * and are deleted; sandboxes idle past their timeout are paused. A lease acts on its
   * own tenant's sandboxes labelled `job=<job>` only.
   * @returns ids paused (with a reclaim) and destroyed by this sweep.
   */
  async sweepLeases(now = Date.now()): Promise<{ paused: string[]; destroyed: string[] }> {
    const out = { paused: [] as string[], destroyed: [] as string[] };
    const sel = (job: string) => `job=${job}`;
    for (const k of this.d.repo.lapseDue(now)) this.d.repo.event('lease.lapsed', null, `job ${k.job}`, k.tenant);
    for (const k of this.d.repo.lapsedJobs()) {
      for (const r of await this.bulk(sel(k.job), 'pause', {}, tenantScope(k.tenant))) if (r.ok && r.reclaim) out.paused.push(r.id);
    }
    for (const k of this.d.repo.lapsedBefore(now - this.d.config.leases.destroyGraceMs)) {
      for (const r of await this.bulk(sel(k.job), 'destroy', {}, tenantScope(k.tenant))) if (r.ok) out.destroyed.push(r.id);
      if (this.d.lifecycle.list(sel(k.job), undefined, tenantScope(k.tenant)).length === 0) {
        this.d.repo.deleteLease(k.tenant, k.job);
        this.d.repo.event('lease.reclaimed', null, `job ${k.job}`, k.tenant);
      }
    }
    for (const id of this.d.repo.idleDue(now)) {
      await this.pause(id).then(() => out.paused.push(id), () => {});
    }
    return out;
  }

  /**
   * The lease of `job` of `scope`'s tenant, with the number of that tenant's sandboxes labelled `job=<job>`.
   * @throws DsecError NotFound (none in that tenant; another tenant's lease of the same job is another lease).
   */
  lease(job: string, scope: Scope = SYSTEM_SCOPE): LeaseView {
    return this.view(this.d.repo.lease(scope.tenant, job), job);
  }

  private view(l: Lease | undefined, job: string): LeaseView {
    if (!l) throw notFound(`no lease for job ${job}`);
    return { ...l, sandboxes: this.d.lifecycle.list(`job=${l.job}`, undefined, tenantScope(l.tenant)).length };
  }

  /** The leases `scope` sees (its tenant's; every tenant's for an admin), by tenant and job. */
  leases(scope: Scope = SYSTEM_SCOPE): LeaseView[] {
    return this.d.repo.leases(scope.all ? null : scope.tenant).map((l) => this.view(l, l.job));
  }

  /**
   * Creates the lease of `job` of `scope`'s tenant for `ttlS` seconds, or renews it;
   * records `lease.created` or `lease.renewed`.
   * @throws DsecError FailedPrecondition when the lease expired or lapsed (delete it and create a new one).
   */
  putLease(job: string, ttlS: number, scope: Scope = SYSTEM_SCOPE): LeaseView {
    const { lease, created } = this.d.repo.putLease(scope.tenant, job, ttlS);
    this.d.repo.event(created ? 'lease.created' : 'lease.renewed', null, `job ${lease.job} expires ${new Date(lease.expires_at).toISOString()}`, scope.tenant);
    return this.lease(job, scope);
  }

  /**
   * Renews the lease of `job` of `scope`'s tenant for `ttlS` seconds (default its own TTL): the job's heartbeat.
   * @throws DsecError NotFound, FailedPrecondition (expired or lapsed).
   */
  renewLease(job: string, ttlS: number | undefined, scope: Scope = SYSTEM_SCOPE): LeaseView {
    const cur = this.d.repo.lease(scope.tenant, job);
    if (!cur) throw notFound(`no lease for job ${job}`);
    this.d.repo.putLease(scope.tenant, job, ttlS ?? cur.ttl_s, Date.now(), 'renew');
    return this.lease(job, scope);
  }

  /**
   * Deletes the lease of `job` of `scope`'s tenant; its sandboxes stay.
   * @returns the lease as it was.
   * @throws DsecError NotFound.
   */
  deleteLease(job: string, scope: Scope = SYSTEM_SCOPE): LeaseView {
    const v = this.lease(job, scope);
    this.d.repo.deleteLease(scope.tenant, job);
    return v;
  }
}
