/**
 * Error answers: every failure leaves the API as `{ error: { code, message, reason? } }`
 * with the status of its kind (daemon/errors.ts), counted by kind in the metrics.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import { DsecError } from '../errors.js';
import type { Metrics } from '../metrics.js';
import { noteErrorKind } from '../remote/audit.js';

/** Largest request body: 32 MiB (16 MiB of stdin as base64 plus headroom). */
export const BODY_LIMIT_BYTES = 32 * 1024 * 1024;

/**
 * Sends a DsecError (or any thrown value: fastify's own client errors keep their
 * meaning, anything else is Internal and logged) in the API error shape.
 */
export function sendError(reply: FastifyReply, e: unknown, log: Logger, req?: FastifyRequest, metrics?: Pick<Metrics, 'errors'>): FastifyReply {
  let err: DsecError;
  if (e instanceof DsecError) err = e;
  else if (e && typeof e === 'object' && 'statusCode' in e && typeof (e as { statusCode: unknown }).statusCode === 'number' && (e as { statusCode: number }).statusCode < 500) {
    // fastify's own client errors (body too large, bad content type, malformed JSON)
    const fe = e as { statusCode: number; message: string };
    // A body over the limit never succeeds on retry: InvalidArgument, not the retryable ResourceExhausted.
    err = new DsecError('InvalidArgument', fe.statusCode === 413 ? `request body larger than ${BODY_LIMIT_BYTES} bytes` : fe.message);
  } else {
    log.error({ err: e, url: req?.url, reqId: req?.id }, 'internal error');
    err = new DsecError('Internal', `internal error: ${(e as Error)?.message ?? String(e)}`);
  }
  if (err.kind === 'Internal') log.error({ err, cause: err.cause, url: req?.url, reqId: req?.id }, 'request failed');
  err = forCaller(err, req);
  metrics?.errors.inc({ code: err.kind });
  noteErrorKind(reply, err.kind);
  if (err.kind === 'Unauthenticated' || err.kind === 'PermissionDenied') reply.header('cache-control', 'no-store');
  return reply.code(err.status).type('application/json').send({ error: { code: err.kind, message: err.message, ...(err.reason ? { reason: err.reason } : {}) } });
}

/**
 * What the caller of `req` is told of error `err`: all of it, except that an Internal
 * error's text (host paths, dsecd's own state: what the operator reads in the log) goes
 * only to an admin (the Unix socket, an admin token); any other role is told the kind and
 * the request id dsecd logged it under (docs/SECURITY.md "The TCP door").
 */
export function forCaller(err: DsecError, req: FastifyRequest | undefined): DsecError {
  if (err.kind !== 'Internal' || !req?.principal || req.principal.role === 'admin') return err;
  return new DsecError('Internal', `internal error (dsecd logged it as request ${req.id}); tell dsecd's operator`);
}
