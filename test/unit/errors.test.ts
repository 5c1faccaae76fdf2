import { describe, expect, it } from 'vitest';
import { DsecError, ERROR_STATUS, wrap } from '../../daemon/errors.js';

describe('error kinds', () => {
  it('map to the contract statuses', () => {
    expect(ERROR_STATUS).toEqual({
      InvalidArgument: 400, Unauthenticated: 401, PermissionDenied: 403, NotFound: 404, AlreadyExists: 409, Conflict: 409,
      FailedPrecondition: 412, ResourceExhausted: 429, Internal: 500,
      Unimplemented: 501, Unavailable: 503, DeadlineExceeded: 504,
    });
    expect(new DsecError('NotFound', 'x').status).toBe(404);
  });
  it('wrap keeps the kind of a DsecError and adds context', () => {
    const e = wrap(new DsecError('Conflict', 'busy'), 'stop sandbox a');
    expect(e.kind).toBe('Conflict');
    expect(e.message).toBe('stop sandbox a: busy');
    expect(wrap(new Error('boom'), 'ctx').kind).toBe('Internal');
  });
});
