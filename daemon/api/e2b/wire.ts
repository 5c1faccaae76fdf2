/**
 * How dsec's errors leave the E2B front, in one place:
 * - E2B's REST (control plane, envd `/files` and `/health`): HTTP status and body
 *   `{ code: <status>, message }` (E2B's `Error` schema; the SDKs read the status);
 * - Connect RPC (envd's process and filesystem services): a Connect error code, which the
 *   SDKs turn into their own errors (NotFound -> NotFoundError, InvalidArgument ->
 *   InvalidArgumentError, Unauthenticated -> AuthenticationError, Unavailable -> a
 *   "sandbox not running" TimeoutError, DeadlineExceeded -> TimeoutError, ...).
 */
import type { FastifyReply } from 'fastify';
import { Code, ConnectError } from '@connectrpc/connect';
import { codeToHttpStatus, errorToJson } from '@connectrpc/connect/protocol-connect';
import { DsecError, type ErrorKind } from '../../errors.js';
import { noteErrorKind } from '../../remote/audit.js';
import { forCaller } from '../reply.js';

/**
 * The HTTP status an E2B client sees for a dsec error kind. As dsec's own, except:
 * FailedPrecondition is 409 (E2B answers a conflict with the sandbox's state, e.g.
 * "already paused", with 409) and Unavailable is 502 (E2B's proxy answers 502 when a
 * sandbox cannot be reached; the SDKs read it as "sandbox not running").
 */
const E2B_STATUS: Record<ErrorKind, number> = {
  InvalidArgument: 400,
  Unauthenticated: 401,
  PermissionDenied: 403,
  NotFound: 404,
  AlreadyExists: 409,
  Conflict: 409,
  FailedPrecondition: 409,
  ResourceExhausted: 429,
  Internal: 500,
  Unimplemented: 501,
  Unavailable: 502,
  DeadlineExceeded: 504,
};

/** Connect code of each dsec error kind. */
const CONNECT_CODE: Record<ErrorKind, Code> = {
  InvalidArgument: Code.InvalidArgument,
  Unauthenticated: Code.Unauthenticated,
  PermissionDenied: Code.PermissionDenied,
  NotFound: Code.NotFound,
  AlreadyExists: Code.AlreadyExists,
  Conflict: Code.Aborted,
  FailedPrecondition: Code.FailedPrecondition,
  ResourceExhausted: Code.ResourceExhausted,
  Internal: Code.Internal,
  Unimplemented: Code.Unimplemented,
  Unavailable: Code.Unavailable,
  DeadlineExceeded: Code.DeadlineExceeded,
};

/** `e` as a DsecError (anything else is Internal, its message kept). */
export function asDsecError(e: unknown): DsecError {
  if (e instanceof DsecError) return e;
  if (e && typeof e === 'object' && 'statusCode' in e && typeof (e as { statusCode: unknown }).statusCode === 'number' && (e as { statusCode: number }).statusCode < 500) {
    // fastify's own client errors (malformed JSON, body too large)
    return new DsecError('InvalidArgument', (e as unknown as Error).message);
  }
  return new DsecError('Internal', `internal error: ${(e as Error)?.message ?? String(e)}`, { cause: e });
}

/** E2B status of an error. */
export function e2bStatus(e: DsecError): number {
  return E2B_STATUS[e.kind];
}

/** Sends `e` as E2B's REST error: its status, `{code, message}` (an Internal error logged, its text for admins only: reply.ts forCaller). */
export function sendE2bError(reply: FastifyReply, e: unknown): FastifyReply {
  const full = asDsecError(e);
  if (full.kind === 'Internal') reply.log.error({ err: full, cause: full.cause, url: reply.request.url, reqId: reply.request.id }, 'request failed');
  const err = forCaller(full, reply.request);
  const status = E2B_STATUS[err.kind];
  noteErrorKind(reply, err.kind);
  if (err.kind === 'Unauthenticated' || err.kind === 'PermissionDenied') reply.header('cache-control', 'no-store');
  return reply.code(status).type('application/json').send({ code: status, message: err.message });
}

/** `e` as a ConnectError (a ConnectError passes through). */
export function toConnectError(e: unknown): ConnectError {
  if (e instanceof ConnectError) return e;
  const err = asDsecError(e);
  return new ConnectError(err.message, CONNECT_CODE[err.kind], undefined, undefined, err);
}

/**
 * Sends `e` as a Connect error before any handler ran (authentication, routing): the
 * code's HTTP status and the Connect JSON error body, which clients read for unary and
 * streaming calls alike.
 */
export function sendConnectError(reply: FastifyReply, e: unknown): FastifyReply {
  const ce = toConnectError(e);
  noteErrorKind(reply, e instanceof DsecError ? e.kind : Code[ce.code]);
  return reply.code(codeToHttpStatus(ce.code)).type('application/json').send(JSON.stringify(errorToJson(ce, undefined)));
}
