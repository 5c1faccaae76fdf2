/**
 * Long operations answered as NDJSON when the client asks (`Accept: application/x-ndjson`):
 * `{type:"progress", ...}` lines as the work goes on, then one `{type:"result", result}`
 * or `{type:"error", error:{code,message,reason?}}` line. Without that header the route
 * answers once, with the result and the given status, or with the usual error response.
 * Used by image import/bootstrap and by the creates (sandbox create, restore, fork).
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import { DsecError } from '../errors.js';
import type { Logger } from 'pino';
import type { Metrics } from '../metrics.js';

/** Whether the request asked for a streamed (NDJSON) answer. */
export function wantsNdjson(req: FastifyRequest): boolean {
  return String(req.headers.accept ?? '').includes('application/x-ndjson');
}

/**
 * Runs `fn`, which reports progress through the function it is given (a no-op when the
 * client did not ask for a stream); answers its result with `status`, or streams as
 * described in the module comment (status 200: the outcome is in the last line; an error
 * there is counted in the error metric as an error response is). A client that goes away
 * mid-stream does not stop `fn`; its progress is then dropped.
 */
export async function runLong<T>(req: FastifyRequest, reply: FastifyReply, deps: { log: Logger; metrics?: Pick<Metrics, 'errors'> }, fn: (progress: (p: object) => void) => Promise<T>, status = 201): Promise<unknown> {
  if (!wantsNdjson(req)) {
    const result = await fn(() => {});
    return reply.code(status).send(result);
  }
  reply.hijack();
  const res = reply.raw;
  res.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' });
  const line = (o: object) => {
    if (!res.writableEnded && !res.destroyed) res.write(JSON.stringify(o) + '\n');
  };
  try {
    const result = await fn((p) => line({ type: 'progress', ...p }));
    res.end(JSON.stringify({ type: 'result', result }) + '\n');
  } catch (e) {
    const err = e instanceof DsecError ? e : new DsecError('Internal', (e as Error).message);
    if (err.kind === 'Internal') deps.log.error({ err: e }, 'long operation failed');
    // Counted as the error responses of other calls are (sendError in ./reply.ts).
    deps.metrics?.errors.inc({ code: err.kind });
    res.end(JSON.stringify({ type: 'error', error: { code: err.kind, message: err.message, ...(err.reason ? { reason: err.reason } : {}) } }) + '\n');
  }
  return reply;
}
