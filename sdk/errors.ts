/**
 * The SDK's one error class and how an error answer of dsecd becomes one. The kinds are
 * the daemon's closed set (docs/api/openapi.json `ErrorBody`), so a caller branches on
 * `code` whatever call failed.
 */
import type { ErrorKind } from './types.js';

/** Error kind for each HTTP status, used when a response body carries no recognisable code. */
const KIND_BY_STATUS: Record<number, ErrorKind> = {
  400: 'InvalidArgument',
  401: 'Unauthenticated',
  403: 'PermissionDenied',
  404: 'NotFound',
  409: 'Conflict',
  412: 'FailedPrecondition',
  429: 'ResourceExhausted',
  500: 'Internal',
  501: 'Unimplemented',
  503: 'Unavailable',
  504: 'DeadlineExceeded',
};

/**
 * The closed set of kinds; typed as a full record so a kind added to the daemon's set
 * breaks the build here once sdk/types.gen.ts is regenerated (`npm run openapi`, enforced
 * by test/unit/sdk-types.test.ts).
 */
const KNOWN_KINDS: Record<ErrorKind, true> = {
  InvalidArgument: true,
  Unauthenticated: true,
  PermissionDenied: true,
  NotFound: true,
  AlreadyExists: true,
  Conflict: true,
  FailedPrecondition: true,
  ResourceExhausted: true,
  Internal: true,
  Unimplemented: true,
  Unavailable: true,
  DeadlineExceeded: true,
};

/** True when `c` is one of the closed set of error kinds. */
export function isErrorKind(c: unknown): c is ErrorKind {
  return typeof c === 'string' && Object.prototype.hasOwnProperty.call(KNOWN_KINDS, c);
}

/**
 * A failed API call. `code` is one of the closed set of error kinds; `message` is the
 * daemon's own message (it names what failed) or, for client-side failures, one written
 * here that names the socket path; `reason`, when dsecd sent one, refines `code` for
 * callers that branch on it (trajectory execs).
 */
export class DsecApiError extends Error {
  /** Error kind, e.g. `NotFound`. Connection failures are `Unavailable`, client deadlines `DeadlineExceeded`. */
  readonly code: ErrorKind;
  /** HTTP status of the response, or 0 when there was no response (connection failure, client deadline). */
  readonly status: number;
  /**
   * Machine-readable refinement of `code` from the error body, where a caller must branch
   * on it, e.g. for a trajectory exec: `outcome_unknown`, `step_mismatch`, `in_progress`,
   * `out_of_order`, `trajectory_removed`. Undefined when dsecd gave none (most errors) and
   * for client-side failures.
   */
  readonly reason: string | undefined;

  /**
   * @param code error kind
   * @param message human-readable description
   * @param status HTTP status, 0 without a response
   * @param options `cause`: the underlying error, for logs; `reason`: the body's `reason`
   */
  constructor(code: ErrorKind, message: string, status: number, options?: { cause?: unknown; reason?: string }) {
    super(message, options !== undefined && 'cause' in options ? { cause: options.cause } : undefined);
    this.name = 'DsecApiError';
    this.code = code;
    this.status = status;
    this.reason = options?.reason;
  }
}

/** True when `e` is a {@link DsecApiError}, optionally of the given kind. */
export function isDsecApiError(e: unknown, code?: ErrorKind): e is DsecApiError {
  return e instanceof DsecApiError && (code === undefined || e.code === code);
}

/** The {@link DsecApiError} for an error response: its `{error: {code, message, reason?}}` when well-formed, else derived from the status. */
export function errorFromResponse(status: number, text: string): DsecApiError {
  let code: ErrorKind | undefined;
  let message: string | undefined;
  let reason: string | undefined;
  try {
    const body = JSON.parse(text) as { error?: { code?: unknown; message?: unknown; reason?: unknown } };
    const c = body?.error?.code;
    if (isErrorKind(c)) code = c;
    if (typeof body?.error?.message === 'string') message = body.error.message;
    if (typeof body?.error?.reason === 'string') reason = body.error.reason;
  } catch {
    // Not JSON (a proxy, a crash page): fall back to the status.
  }
  code ??= KIND_BY_STATUS[status] ?? (status >= 500 ? 'Internal' : 'InvalidArgument');
  message ??= text.trim() !== '' && text.length <= 200 ? `dsecd answered ${status}: ${text.trim()}` : `dsecd answered HTTP ${status}`;
  return new DsecApiError(code, message, status, reason === undefined ? undefined : { reason });
}

/** The message of an error of any type, for wrapping it in one of ours. */
export function errMessage(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
