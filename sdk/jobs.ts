/**
 * Rounds of an RL job: pause and resume a sandbox between rounds, act on every sandbox
 * matching a label selector at once (bulk), and a job's lease (a heartbeat; when it lapses
 * dsecd pauses the job's sandboxes, then destroys them).
 */
import type { BulkInput, BulkResult, Lease, PauseResult, Sandbox } from './types.js';
import { leasePath, sandboxPath } from './paths.js';
import type { RequestOptions, TransportClass } from './transport.js';

/** Options of {@link DsecClient.renewLease}. */
export interface RenewLeaseOptions {
  /** New TTL in seconds (1 s to 30 days); default the lease's current `ttl_s`. */
  ttlS?: number;
}

/** Mixes pause and resume, bulk actions and leases into a {@link Transport} class (composed into DsecClient by sdk/client.ts). */
export function withJobCalls<B extends TransportClass>(Base: B) {
  return class JobCalls extends Base {
    /**
     * POST /v1/sandboxes/{id}/pause: freezes every process of a running sandbox (cgroup
     * freezer) and reclaims its memory; resolves with the paused sandbox and what was
     * reclaimed. Without swap only page cache can go: anonymous memory stays resident
     * (`reclaim.swap` false, `reclaim.anon_bytes`). Safe to call twice: pausing a paused
     * sandbox resolves with `reclaim: null`.
     * Errors: `NotFound`, `FailedPrecondition` (not running, e.g. stopped).
     */
    pauseSandbox(id: string): Promise<PauseResult> {
      return this.request<PauseResult>('POST', sandboxPath(id) + '/pause');
    }

    /**
     * POST /v1/sandboxes/{id}/resume: thaws a paused sandbox exactly where it stopped
     * (processes, open files, sockets); resolves with it running. Safe to call twice:
     * resuming a running sandbox resolves with it unchanged.
     * Errors: `NotFound`, `FailedPrecondition` (neither paused nor running).
     */
    resumeSandbox(id: string): Promise<Sandbox> {
      return this.request<Sandbox>('POST', sandboxPath(id) + '/resume');
    }

    /**
     * POST /v1/sandboxes/bulk: applies `req.action` to every sandbox whose labels match
     * `req.selector` (dsecd works through them 8 at a time) and resolves with one result
     * per matched sandbox, in no promised order; an empty array when nothing matched. One
     * sandbox failing does not stop the others, and is not a rejection: check `ok` of each.
     * `destroy` destroys running sandboxes too (as `deleteSandbox` with `force`).
     * `set_ttl` sets `ttl_s` counted **from each sandbox's creation** (a TTL already past
     * destroys it at dsecd's next sweep), or removes it with `ttl_s: null`.
     *
     * No HTTP deadline unless `opts.timeoutMs` is given: a bulk stop or pause of many
     * sandboxes legitimately takes long. Aborting `opts.signal` stops waiting; dsecd still
     * finishes the action. Not retried on a dropped connection (it is not idempotent).
     * Errors: `InvalidArgument` (empty or malformed selector, `ttl_s` out of range).
     */
    async bulk(req: BulkInput, opts: RequestOptions = {}): Promise<BulkResult[]> {
      const res = await this.request<{ results: BulkResult[] }>('POST', '/v1/sandboxes/bulk', req, { signal: opts.signal, timeoutMs: opts.timeoutMs ?? 0 });
      return res.results;
    }

    /**
     * POST /v1/leases: creates the lease of `job` (the job's sandboxes carry label
     * `job=<job>`), or renews it if it exists, so that it expires `ttlS` seconds from now.
     * When a lease lapses dsecd pauses the job's sandboxes, and destroys them its
     * `destroy_grace_s` later. Resolves with the lease.
     * Errors: `InvalidArgument` (job not a label value `[A-Za-z0-9._/-]{1,63}`, `ttlS` not
     * 1 s to 30 days), `FailedPrecondition` (the lease exists and has expired: delete it
     * with {@link DsecClient.deleteLease} and create it again).
     */
    putLease(job: string, ttlS: number): Promise<Lease> {
      return this.request<Lease>('POST', '/v1/leases', { job, ttl_s: ttlS });
    }

    /**
     * POST /v1/leases/{job}/renew: the heartbeat. Extends an existing lease to expire
     * `opts.ttlS` (default its current `ttl_s`) seconds from now. Accepted only strictly
     * before `expires_at`: a renewal racing the expiry either wins or is refused, never
     * half-applied. Resolves with the lease.
     * Errors: `NotFound` (no lease: create one with {@link DsecClient.putLease}),
     * `FailedPrecondition` (expired: its sandboxes are paused and will be destroyed; delete
     * the lease and create a new one), `InvalidArgument` (`ttlS` out of range).
     */
    renewLease(job: string, opts: RenewLeaseOptions = {}): Promise<Lease> {
      return this.request<Lease>('POST', leasePath(job) + '/renew', opts.ttlS === undefined ? {} : { ttl_s: opts.ttlS });
    }

    /** GET /v1/leases: every lease, by job, as an array. */
    async listLeases(): Promise<Lease[]> {
      const res = await this.request<{ leases: Lease[] }>('GET', '/v1/leases');
      return res.leases;
    }

    /** GET /v1/leases/{job}: one lease. Errors: `NotFound`. */
    getLease(job: string): Promise<Lease> {
      return this.request<Lease>('GET', leasePath(job));
    }

    /**
     * DELETE /v1/leases/{job}: deletes the lease and resolves with it as it was. The job's
     * sandboxes stay as they are (a lapsed job's paused sandboxes are then no longer
     * destroyed by the lease). Errors: `NotFound`.
     */
    deleteLease(job: string): Promise<Lease> {
      return this.request<Lease>('DELETE', leasePath(job));
    }
  };
}
