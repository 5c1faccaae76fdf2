/**
 * The closed set of error kinds dsec reports, and their one mapping to HTTP status.
 *
 * Every failure that crosses the API boundary is a {@link DsecError} with one of these
 * kinds; anything else is turned into `Internal` by the API layer. The wire shape is
 * `{ "error": { "code": <kind>, "message": <text> } }` (see daemon/api/schema.ts).
 * The set and the statuses follow DESIGN.md §3 and the spine issue's contract.
 */

/** Error kind -> HTTP status. The only place this mapping lives. */
export const ERROR_STATUS = {
  InvalidArgument: 400,
  /** No valid credentials on the TCP door (missing, malformed, unknown, revoked or expired token: one answer for all). */
  Unauthenticated: 401,
  /** Valid credentials whose role may not do this (a reader's create, a user's token admin). */
  PermissionDenied: 403,
  NotFound: 404,
  AlreadyExists: 409,
  Conflict: 409,
  FailedPrecondition: 412,
  ResourceExhausted: 429,
  Internal: 500,
  Unimplemented: 501,
  Unavailable: 503,
  DeadlineExceeded: 504,
} as const;

/** One of the closed set of error kinds, e.g. `"NotFound"`. */
export type ErrorKind = keyof typeof ERROR_STATUS;

/** All error kinds, in declaration order. */
export const ERROR_KINDS = Object.keys(ERROR_STATUS) as ErrorKind[];

/**
 * An error with a kind from the closed set. `message` is shown to users as is, so it
 * names the thing that failed ("sandbox 3f2a… not found"), not the code path.
 * `cause` carries the underlying error (e.g. a runc stderr) for logs only.
 */
export class DsecError extends Error {
  /** The kind, which decides the HTTP status. */
  readonly kind: ErrorKind;
  /**
   * Optional machine-readable refinement of the kind, sent as `error.reason`, for the few
   * cases a caller must branch on (e.g. trajectory step `outcome_unknown`); undefined
   * for most errors.
   */
  readonly reason: string | undefined;

  constructor(kind: ErrorKind, message: string, options?: { cause?: unknown; reason?: string }) {
    super(message, options);
    this.kind = kind;
    this.reason = options?.reason;
    this.name = `DsecError(${kind})`;
  }

  /** HTTP status for this error's kind. */
  get status(): number {
    return ERROR_STATUS[this.kind];
  }
}

/** Shorthand constructors, so call sites read `throw notFound(...)`. */
export const invalidArgument = (m: string, cause?: unknown) => new DsecError('InvalidArgument', m, { cause });
export const unauthenticated = (m: string, cause?: unknown) => new DsecError('Unauthenticated', m, { cause });
export const permissionDenied = (m: string, cause?: unknown) => new DsecError('PermissionDenied', m, { cause });
export const notFound = (m: string, cause?: unknown) => new DsecError('NotFound', m, { cause });
export const alreadyExists = (m: string, cause?: unknown) => new DsecError('AlreadyExists', m, { cause });
export const conflict = (m: string, cause?: unknown) => new DsecError('Conflict', m, { cause });
export const failedPrecondition = (m: string, cause?: unknown) => new DsecError('FailedPrecondition', m, { cause });
export const resourceExhausted = (m: string, cause?: unknown) => new DsecError('ResourceExhausted', m, { cause });
export const internal = (m: string, cause?: unknown) => new DsecError('Internal', m, { cause });
export const unimplemented = (m: string, cause?: unknown) => new DsecError('Unimplemented', m, { cause });
export const unavailable = (m: string, cause?: unknown) => new DsecError('Unavailable', m, { cause });
export const deadlineExceeded = (m: string, cause?: unknown) => new DsecError('DeadlineExceeded', m, { cause });

/** True when `e` is a DsecError, optionally of the given kind. */
export function isDsecError(e: unknown, kind?: ErrorKind): e is DsecError {
  return e instanceof DsecError && (kind === undefined || e.kind === kind);
}

/** Wraps any thrown value as a DsecError (kind Internal unless it already is one), prefixing context. */
export function wrap(e: unknown, context: string, kind: ErrorKind = 'Internal'): DsecError {
  if (e instanceof DsecError) return new DsecError(e.kind, `${context}: ${e.message}`, { cause: e, reason: e.reason });
  const msg = e instanceof Error ? e.message : String(e);
  return new DsecError(kind, `${context}: ${msg}`, { cause: e });
}
