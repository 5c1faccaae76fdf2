/**
 * One-shot runs for every tier (POST /v1/run): the same request, differing only in
 * `backend`. `fncall` is served by the worker pools; `container` (and, once built,
 * `microvm` and `vm`) creates a sandbox, runs the command and destroys the sandbox.
 */
import { DsecError, invalidArgument, isDsecError, wrap } from '../errors.js';
import type { Backend } from '../model/backend.js';
import type { ExecResult } from '../model/exec.js';
import { LIMITS } from '../model/resources.js';
import type { SandboxCreator } from '../sandbox/create.js';
import type { ExecService } from '../sandbox/exec.js';
import type { SandboxLifecycle } from '../sandbox/lifecycle.js';
import type { FncallPools } from './pool.js';

/** Label on the sandbox of a one-shot container run (it lives only for the call). */
export const RUN_LABEL = 'dsec.run';

/** One call of POST /v1/run: a command in a fresh environment of `backend`. Sizes in bytes, times in ms. */
export interface RunCall {
  backend: Backend;
  /** Image reference. */
  image: string;
  argv: string[];
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  stdin?: Buffer;
  /** Wall-clock limit; fncall's default is 60 s. */
  timeoutMs?: number;
  memoryBytes?: number;
  /** Container only: fncall workers have their pool's CPU and pids limits. */
  cpus?: number;
  pids?: number;
  /**
   * Container only: the tenant the call's sandbox belongs to (the caller's: its quota,
   * its images, its view); default `system`.
   */
  tenant?: string;
}

/** The lifecycle services a one-shot container run goes through. */
export interface RunServices {
  creator: Pick<SandboxCreator, 'create'>;
  exec: Pick<ExecService, 'exec'>;
  lifecycle: Pick<SandboxLifecycle, 'destroy'>;
}

/**
 * Runs one call on its tier and returns the exec result. `signal` (the client went away)
 * drops an fncall call still waiting for a worker (a running one ends by its
 * `timeoutMs`, 60 s by default) and destroys a container call's sandbox at once, whatever
 * its command was doing: nothing else would ever reap it (container calls have no default
 * timeout, and their sandbox is not the caller's to list or delete).
 * @throws DsecError InvalidArgument, NotFound (image), ResourceExhausted (admission,
 *   fncall queue, the tenant's quota), Unimplemented (tier not built), Unavailable
 *   (also: the client left before a container call ended).
 */
export async function runOnce(s: RunServices, pools: FncallPools, r: RunCall, signal?: AbortSignal): Promise<ExecResult> {
  const stdin = r.stdin;
  if (stdin && stdin.length > LIMITS.maxStdinBytes) throw invalidArgument(`stdin_b64 decodes to ${stdin.length} bytes, more than the ${LIMITS.maxStdinBytes} a call takes`);
  if (r.backend === 'fncall') {
    return pools.run({
      image: r.image, argv: r.argv, env: r.env, cwd: r.cwd, user: r.user, stdin, timeoutMs: r.timeoutMs, memoryBytes: r.memoryBytes,
    }, signal);
  }
  if (signal?.aborted) throw new DsecError('Unavailable', 'the client left before the run started');
  const sb = await s.creator.create({
    backend: r.backend, image: r.image, labels: { [RUN_LABEL]: 'once' },
    ...(r.cpus !== undefined ? { cpus: r.cpus } : {}), ...(r.memoryBytes !== undefined ? { memoryBytes: r.memoryBytes } : {}),
    ...(r.pids !== undefined ? { pids: r.pids } : {}), ...(r.tenant !== undefined ? { tenant: r.tenant } : {}),
  });
  // One destroy, by whichever comes first: the client leaving or the call ending.
  let destroying: Promise<unknown> | undefined;
  const destroy = (why: string) => (destroying ??= s.lifecycle.destroy(sb.id, true, why));
  const left = () => {
    destroy('one-shot run: its client left').catch(() => {}); // awaited (and reported) below
  };
  signal?.addEventListener('abort', left, { once: true });
  try {
    if (signal?.aborted) throw new DsecError('Unavailable', 'the client left before the run started');
    return await s.exec.exec(sb.id, {
      argv: r.argv, ...(r.env ? { env: r.env } : {}), ...(r.cwd ? { cwd: r.cwd } : {}), ...(r.user ? { user: r.user } : {}),
      ...(stdin !== undefined ? { stdin } : {}), ...(r.timeoutMs !== undefined ? { timeoutMs: r.timeoutMs } : {}),
    });
  } finally {
    signal?.removeEventListener('abort', left);
    // NotFound: someone (its tenant) destroyed the sandbox mid-call; the call's own
    // outcome (the exec's error or result) is the answer, not the destroy's.
    await destroy('one-shot run finished').catch((e: unknown) => {
      if (!isDsecError(e, 'NotFound')) throw e;
    });
  }
}

/** Container runs of one batch in flight at once: 4, enough to overlap runc on 2 cores (the create path is CPU-bound). */
const BATCH_CONTAINER_CONCURRENCY = 4;

/**
 * Runs many calls concurrently (fncall calls all at once: the pools queue them;
 * container calls {@link BATCH_CONTAINER_CONCURRENCY} at a time) and reports each.
 * A call dsec cannot run is an entry with `ok: false`, never a failure of the batch.
 * `signal` (the client went away) is every call's, as {@link runOnce} takes it: calls not
 * yet started are not started, container calls' sandboxes are destroyed.
 */
export async function runBatch(s: RunServices, pools: FncallPools, calls: RunCall[], signal?: AbortSignal): Promise<Array<{ ok: boolean; result?: ExecResult; error?: { code: string; message: string } }>> {
  const out: Array<{ ok: boolean; result?: ExecResult; error?: { code: string; message: string } }> = new Array(calls.length);
  const one = async (i: number) => {
    try {
      out[i] = { ok: true, result: await runOnce(s, pools, calls[i], signal) };
    } catch (e) {
      const err = e instanceof DsecError ? e : wrap(e, `call ${i}`);
      out[i] = { ok: false, error: { code: err.kind, message: err.message } };
    }
  };
  const others = calls.map((c, i) => [c, i] as const).filter(([c]) => c.backend !== 'fncall').map(([, i]) => i);
  let next = 0;
  const worker = async () => {
    while (next < others.length) await one(others[next++]);
  };
  await Promise.all([
    ...calls.map((c, i) => (c.backend === 'fncall' ? one(i) : null)).filter((p) => p !== null),
    ...Array.from({ length: Math.min(BATCH_CONTAINER_CONCURRENCY, others.length) }, worker),
  ]);
  return out;
}
