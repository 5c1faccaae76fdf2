/**
 * Sandbox calls: create, list, get, stop, start and destroy (POST/GET/DELETE
 * /v1/sandboxes...). Pause and resume are with the rounds in sdk/jobs.ts; exec in
 * sdk/exec.ts; a sandbox's network with the host calls in sdk/host.ts.
 */
import type { BatchCreateResult, CreateSandboxInput, CreateSandboxesInput, Sandbox, SandboxState } from './types.js';
import { query, sandboxPath } from './paths.js';
import type { RequestOptions, TransportClass } from './transport.js';

/**
 * One phase of a sandbox create, restore or fork as dsecd reports it (daemon/sandbox/progress.ts):
 * `rootfs` (layers, writable layer or disks), `launch` (the runtime or QEMU starting),
 * `boot` (waiting for the agent; a VM's guest boots here), `ready` (running). Each
 * sandbox reports each phase at most once, in that order (one claimed from the warm pool
 * only `ready`); a fork's reports name each of its sandboxes.
 */
export interface CreateProgress {
  phase: 'rootfs' | 'launch' | 'boot' | 'ready' | (string & {});
  /** The sandbox being made. */
  id: string;
  /** The phase in words, e.g. `booting the guest (waiting for its agent)`. */
  message: string;
}

/** Options of the calls that create sandboxes ({@link DsecClient.createSandbox}, {@link DsecClient.restore}, {@link DsecClient.fork}). */
export interface CreateOptions extends RequestOptions {
  /**
   * Called once per phase report, in order, before the promise settles (the call then
   * streams: `Accept: application/x-ndjson`, no deadline). If it throws, the stream is
   * closed and the call rejects with that error; dsecd still finishes the create.
   */
  onProgress?: (p: CreateProgress) => void;
}

/** Query of {@link DsecClient.listSandboxes}. */
export interface ListSandboxesQuery {
  /**
   * Label selector: comma-separated terms `k=v` (label k is v), `k!=v` (k is not v, or
   * absent) and `k` (has label k); a sandbox matches when all terms match. A malformed
   * selector is `InvalidArgument`.
   */
  selector?: string;
  /** Only sandboxes in this state, e.g. `running`. */
  state?: SandboxState | string;
}

/** Options of {@link DsecClient.deleteSandbox}. */
export interface DeleteSandboxOptions {
  /** Destroy even when running (its processes are killed). */
  force?: boolean;
}

/** Options of {@link DsecClient.stopSandbox}. */
export interface StopSandboxOptions {
  /**
   * Grace period between SIGTERM and SIGKILL, ms (0 to 24 h); `0` kills at once. When
   * unset no body is sent and dsecd uses its default (10 s).
   */
  timeoutMs?: number;
  /** Abort the HTTP call (the promise rejects with the signal's reason); dsecd may still stop the sandbox. */
  signal?: AbortSignal;
}

/** Mixes the sandbox lifecycle calls into a {@link Transport} class (composed into DsecClient by sdk/client.ts). */
export function withSandboxCalls<B extends TransportClass>(Base: B) {
  return class SandboxCalls extends Base {
    /**
     * POST /v1/sandboxes: creates a sandbox and resolves when it is running (or failed).
     * Errors: `InvalidArgument` (bad limits, labels, unknown field), `NotFound` (image),
     * `Unimplemented` (backend not built), `ResourceExhausted` (host full). With
     * `opts.onProgress` the create's phases are reported as they begin ({@link CreateProgress}).
     * Sent with an `Idempotency-Key` (`opts.idempotencyKey`, else a fresh one) and retried
     * with it when the answer is lost ({@link Transport.keyedCreate}).
     */
    createSandbox(req: CreateSandboxInput = {}, opts: CreateOptions = {}): Promise<Sandbox> {
      return this.keyedCreate(opts, (idempotencyKey) => {
        if (opts.onProgress) return this.longOperation<Sandbox, CreateProgress>('POST', '/v1/sandboxes', req, { ...opts, idempotencyKey });
        return this.request<Sandbox>('POST', '/v1/sandboxes', req, { ...opts, idempotencyKey });
      });
    }

    /**
     * POST /v1/sandboxes:batch: creates many sandboxes in one request (`{count, spec}` or
     * `{items}`, 1 to 1,000) and resolves when every one is running or failed, with one
     * `{sandbox}` or `{error: {code, message}}` per sandbox, in request order. A sandbox
     * the host or tenant had no room for is that entry's `ResourceExhausted`; the call
     * itself rejects only for a malformed batch (`InvalidArgument`) or a lost answer.
     * Sent with an `Idempotency-Key` (`opts.idempotencyKey`, else a fresh one: sandbox i
     * gets `KEY/i`) and retried with it when the answer is lost, so a retry answers the
     * sandboxes already made and makes only the rest. No HTTP deadline unless
     * `opts.timeoutMs` (a batch of 1,000 cold creates takes minutes).
     */
    createSandboxes(req: CreateSandboxesInput, opts: RequestOptions & { idempotencyKey?: string } = {}): Promise<BatchCreateResult> {
      return this.keyedCreate(opts, (idempotencyKey) => this.request<BatchCreateResult>('POST', '/v1/sandboxes:batch', req, { timeoutMs: 0, ...opts, idempotencyKey }));
    }

    /** GET /v1/sandboxes: sandboxes matching the query (all when empty), as an array. */
    async listSandboxes(q: ListSandboxesQuery = {}): Promise<Sandbox[]> {
      const res = await this.request<{ sandboxes: Sandbox[] }>('GET', '/v1/sandboxes' + query({ selector: q.selector, state: q.state }));
      return res.sandboxes;
    }

    /** GET /v1/sandboxes/{id}. Errors: `NotFound`. */
    getSandbox(id: string): Promise<Sandbox> {
      return this.request<Sandbox>('GET', sandboxPath(id));
    }

    /**
     * DELETE /v1/sandboxes/{id}: destroys the sandbox; resolves with it in state `destroyed`.
     * Errors: `NotFound`; `Conflict`/`FailedPrecondition` when running and not `force`.
     */
    deleteSandbox(id: string, opts: DeleteSandboxOptions = {}): Promise<Sandbox> {
      return this.request<Sandbox>('DELETE', sandboxPath(id) + query({ force: opts.force ? 'true' : undefined }));
    }

    /**
     * POST /v1/sandboxes/{id}/stop: stops the sandbox's processes (SIGTERM, then SIGKILL
     * after the grace period; the writable layer stays); resolves with it stopped. The body
     * `{timeout_ms}` is sent only when `opts.timeoutMs` is given (dsecd's default grace is
     * 10 s; `0` kills at once). The HTTP deadline is the grace plus the client's `timeoutMs`.
     * Errors: `NotFound`, `FailedPrecondition` (not running), `InvalidArgument` (grace out of range).
     */
    stopSandbox(id: string, opts: StopSandboxOptions = {}): Promise<Sandbox> {
      if (opts.timeoutMs === undefined) return this.request<Sandbox>('POST', sandboxPath(id) + '/stop', undefined, { signal: opts.signal });
      const deadline = this.timeoutMs > 0 ? opts.timeoutMs + this.timeoutMs : 0;
      return this.request<Sandbox>('POST', sandboxPath(id) + '/stop', { timeout_ms: opts.timeoutMs }, { signal: opts.signal, timeoutMs: deadline });
    }

    /** POST /v1/sandboxes/{id}/start: starts a stopped sandbox; resolves with it running. Errors: `NotFound`, `Conflict`. */
    startSandbox(id: string): Promise<Sandbox> {
      return this.request<Sandbox>('POST', sandboxPath(id) + '/start');
    }
  };
}
