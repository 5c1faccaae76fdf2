/**
 * Creates with an idempotency key and an acknowledgement (daemon/sandbox/create-records.ts
 * says what each means): wraps a create route's work so that a keyed retry answers the
 * first result, the sandboxes made are held until the answer is delivered, and delivery
 * acknowledges them. Used by `POST /v1/sandboxes`, `/v1/snapshots/{ref}/restore` and
 * `/v1/snapshots/{ref}/fork`.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { runLong } from './long.js';
import type { Metrics } from '../metrics.js';
import { ACK_HEADER, CreateRecords, IDEMPOTENCY_HEADER, REPLAYED_HEADER, idsOf } from '../sandbox/create-records.js';

/** What {@link runCreate} uses. */
export interface CreateDeps {
  log: Logger;
  metrics?: Pick<Metrics, 'errors'>;
  /** The record of keys and holds; absent in tests that build routes alone (then no key, no hold). */
  createRecords?: CreateRecords;
}

/** Whether the caller is a gateway that confirms delivery itself (the header counts only from a verified gateway certificate). */
export function gatewayAcks(req: FastifyRequest): boolean {
  return req.principal?.peer?.role === 'gateway' && req.headers[ACK_HEADER] === 'gateway';
}

/**
 * Runs a create as {@link runLong} does, with the key and the hold; see the module comment.
 * @throws DsecError InvalidArgument for a malformed or reused key; what `fn` throws.
 */
export async function runCreate<T>(req: FastifyRequest, reply: FastifyReply, deps: CreateDeps, body: unknown, fn: (progress: (p: object) => void) => Promise<T>): Promise<unknown> {
  const records = deps.createRecords;
  if (!records) return runLong(req, reply, deps, fn);
  const raw = req.headers[IDEMPOTENCY_HEADER];
  const key = typeof raw === 'string' ? raw : null;
  const tenant = req.principal?.tenant ?? 'system';
  let ids: string[] = [];
  const deferred = gatewayAcks(req);
  if (!deferred) {
    // Delivered: the whole answer went to the connection ('finish'); a connection that failed first never emits it.
    reply.raw.once('finish', () => {
      if (ids.length) records.ack(ids);
    });
  }
  return runLong(req, reply, deps, async (progress) => {
    let result: T;
    let replayed = false;
    if (key !== null) {
      ({ result, replayed } = await records.once(tenant, key, CreateRecords.fingerprint(req.method, req.url, body), () => fn(progress)));
    } else {
      result = await fn(progress);
    }
    ids = idsOf(result);
    records.hold(ids, tenant, key, replayed);
    if (replayed && !reply.raw.headersSent) reply.header(REPLAYED_HEADER, 'true');
    return result;
  });
}
