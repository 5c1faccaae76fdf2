/**
 * The caller's tenancy scope, from the door's principal (daemon/remote/door.ts): what
 * every route hands the services that list, look up or name objects. An admin (the Unix
 * socket, an admin token) sees every tenant; any other role only its own tenant.
 */
import type { FastifyRequest } from 'fastify';
import { SYSTEM_SCOPE, type Scope } from '../model/tenant.js';

/** The scope a request acts in (the system admin's when no door set a principal, as in route tests built without one). */
export function scopeOf(req: FastifyRequest): Scope {
  const p = req.principal;
  if (!p) return SYSTEM_SCOPE;
  return { tenant: p.tenant, all: p.role === 'admin' };
}
