/**
 * One-shot runs for every tier (POST /v1/run): the same request, differing only in
 * `backend`. `fncall` is served by the worker pools; `container` (and, once built,
 * `microvm` and `vm`) creates a sandbox, runs the command and destroys the sandbox.
 */
import { LIMITS, type ExecResult, type RunRequest } from '../api/schema.js';
import { DsecError, invalidArgument, wrap } from '../errors.js';
import type { SandboxManager } from '../sandbox/manager.js';
import type { FncallPools } from './pool.js';

/** Label on the sandbox of a one-shot container run (it lives only for the call). */
export const RUN_LABEL = 'dsec.run';

/**
 * Runs one call on its tier and returns the exec result. `signal` (the client went away)
 * drops an fncall still waiting for a worker; a running call ends by its timeout.
 * @throws DsecError InvalidArgument, NotFound (image), ResourceExhausted (admission,
 *   fncall queue), Unimplemented (tier not built), Unavailable.
 */
export async function runOnce(m: SandboxManager, pools: FncallPools, r: RunRequest, signal?: AbortSignal): Promise<ExecResult> {
  const stdin = r.stdin_b64 !== undefined ? Buffer.from(r.stdin_b64, 'base64') : undefined;
  if (stdin && stdin.length > LIMITS.maxStdinBytes) throw invalidArgument(`stdin_b64 decodes to ${stdin.length} bytes, more than the ${LIMITS.maxStdinBytes} a call takes`);
  if (r.backend === 'fncall') {
    return pools.run({
      image: r.image, argv: r.argv, env: r.env, cwd: r.cwd, user: r.user, stdin, timeoutMs: r.timeout_ms, memoryBytes: r.memory_bytes,
    }, signal);
  }
  const sb = await m.create({
    backend: r.backend, image: r.image, labels: { [RUN_LABEL]: 'once' },
    ...(r.cpus !== undefined ? { cpus: r.cpus } : {}), ...(r.memory_bytes !== undefined ? { memory_bytes: r.memory_bytes } : {}),
    ...(r.pids !== undefined ? { pids: r.pids } : {}),
  });
  try {
    return await m.exec(sb.id, {
      argv: r.argv, ...(r.env ? { env: r.env } : {}), ...(r.cwd ? { cwd: r.cwd } : {}), ...(r.user ? { user: r.user } : {}),
      ...(r.stdin_b64 !== undefined ? { stdin_b64: r.stdin_b64 } : {}), ...(r.timeout_ms !== undefined ? { timeout_ms: r.timeout_ms } : {}),
    });
  } finally {
    await m.destroy(sb.id, true, 'one-shot run finished');
  }
}

/** Container runs of one batch in flight at once: 4, enough to overlap runc on 2 cores (the create path is CPU-bound). */
const BATCH_CONTAINER_CONCURRENCY = 4;

/**
 * Runs many calls concurrently (fncall calls all at once: the pools queue them;
 * container calls {@link BATCH_CONTAINER_CONCURRENCY} at a time) and reports each.
 * A call dsec cannot run is an entry with `ok: false`, never a failure of the batch.
 */
export async function runBatch(m: SandboxManager, pools: FncallPools, calls: RunRequest[]): Promise<Array<{ ok: boolean; result?: ExecResult; error?: { code: string; message: string } }>> {
  const out: Array<{ ok: boolean; result?: ExecResult; error?: { code: string; message: string } }> = new Array(calls.length);
  const one = async (i: number) => {
    try {
      out[i] = { ok: true, result: await runOnce(m, pools, calls[i]) };
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
