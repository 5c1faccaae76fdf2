/**
 * Snapshots: capture a sandbox (its writable layer, or a microVM's whole machine), list,
 * get and delete snapshots, and make sandboxes from one: restore (one) and fork (a group).
 */
import type { ForkInput, RestoreInput, Sandbox, Snapshot } from './types.js';
import type { CreateOptions, CreateProgress } from './sandboxes.js';
import { sandboxPath, snapshotPath } from './paths.js';
import type { TransportClass } from './transport.js';

/** Options of {@link DsecClient.snapshot}. */
export interface SnapshotOptions {
  /** Unique name to restore by, `[a-z0-9][a-z0-9._-]{0,127}`; default none (restore by id). */
  name?: string;
  /**
   * Containers: also checkpoint memory and processes (CRIU); dsecd answers
   * `Unimplemented`, naming the reason, on a host where `criu check` fails. microVMs:
   * ignored, their snapshots always capture the whole machine.
   */
  process?: boolean;
  /** Stop waiting (rejects with the signal's reason); dsecd may still finish the snapshot. */
  signal?: AbortSignal;
}

/** Mixes the snapshot, restore and fork calls into a {@link Transport} class (composed into DsecClient by sdk/client.ts). */
export function withSnapshotCalls<B extends TransportClass>(Base: B) {
  return class SnapshotCalls extends Base {
    /**
     * POST /v1/sandboxes/{id}/snapshot: captures the sandbox's writable layer (unstripped)
     * as a snapshot to restore or fork from, named `opts.name` when given. A running
     * sandbox is frozen while its layer is copied and thawed afterwards. No HTTP deadline:
     * packing a large writable layer takes a while.
     * Errors: `NotFound` (sandbox), `AlreadyExists` (name taken), `InvalidArgument`
     * (malformed name), `FailedPrecondition` (sandbox in a state that cannot be
     * snapshotted), `Unimplemented` (`process` on a host without a working CRIU).
     */
    snapshot(id: string, opts: SnapshotOptions = {}): Promise<Snapshot> {
      const body: Record<string, unknown> = {};
      if (opts.name !== undefined) body.name = opts.name;
      if (opts.process !== undefined) body.process = opts.process;
      return this.request<Snapshot>('POST', sandboxPath(id) + '/snapshot', body, { signal: opts.signal, timeoutMs: 0 });
    }

    /** GET /v1/snapshots: every snapshot on this host, oldest first, as an array. */
    async listSnapshots(): Promise<Snapshot[]> {
      return (await this.request<{ snapshots: Snapshot[] }>('GET', '/v1/snapshots')).snapshots;
    }

    /** GET /v1/snapshots/{ref}: one snapshot; `ref` is its id (`snap-<16 hex>`) or name. Errors: `NotFound`. */
    getSnapshot(ref: string): Promise<Snapshot> {
      return this.request<Snapshot>('GET', snapshotPath(ref));
    }

    /**
     * DELETE /v1/snapshots/{ref}: removes the snapshot and resolves with it as it was;
     * sandboxes restored or forked from it keep running. Errors: `NotFound`.
     */
    deleteSnapshot(ref: string): Promise<Snapshot> {
      return this.request<Snapshot>('DELETE', snapshotPath(ref));
    }

    /**
     * POST /v1/snapshots/{ref}/restore: creates one sandbox from the snapshot (its image
     * layers plus the snapshot layer) and resolves when it is running (or failed), like
     * {@link createSandbox}. Fields of `req` left out default to the source sandbox's.
     * Errors: `NotFound` (snapshot, or a layer of it missing), `FailedPrecondition` (a
     * layer or the machine state of it corrupt, or a machine state this host's QEMU cannot
     * load), `InvalidArgument` (bad overrides; `memory_bytes` or `cpus` other than a `vm`
     * snapshot's machine), `ResourceExhausted` (host full). `opts.onProgress`: as for
     * {@link createSandbox}.
     */
    restore(ref: string, req: RestoreInput = {}, opts: CreateOptions = {}): Promise<Sandbox> {
      return this.keyedCreate(opts, (idempotencyKey) => {
        if (opts.onProgress) return this.longOperation<Sandbox, CreateProgress>('POST', snapshotPath(ref) + '/restore', req, { ...opts, idempotencyKey });
        return this.request<Sandbox>('POST', snapshotPath(ref) + '/restore', req, { ...opts, idempotencyKey });
      });
    }

    /**
     * POST /v1/snapshots/{ref}/fork: creates `req.count` sandboxes (1-256; a larger group
     * is several calls) from the snapshot, each with the overrides of `req`, and resolves
     * with them, running, in creation order. All or nothing: if one cannot be created,
     * none is left. No HTTP deadline unless `opts.timeoutMs` is given: a large group
     * legitimately takes long. Sent with an `Idempotency-Key` and retried with it when the
     * answer is lost, as {@link createSandbox}.
     * Errors: as {@link restore}; `InvalidArgument` also for `count` out of range,
     * `ResourceExhausted` when the host cannot fit the whole group. `opts.onProgress`
     * hears the phases of every sandbox of the group (each report names its sandbox).
     */
    async fork(ref: string, req: ForkInput, opts: CreateOptions = {}): Promise<Sandbox[]> {
      const res = await this.keyedCreate(opts, (idempotencyKey) => opts.onProgress
        ? this.longOperation<{ sandboxes: Sandbox[] }, CreateProgress>('POST', snapshotPath(ref) + '/fork', req, { ...opts, idempotencyKey })
        : this.request<{ sandboxes: Sandbox[] }>('POST', snapshotPath(ref) + '/fork', req, { signal: opts.signal, timeoutMs: opts.timeoutMs ?? 0, idempotencyKey, allowBurst: opts.allowBurst }));
      return res.sandboxes;
    }
  };
}
