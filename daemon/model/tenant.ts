/**
 * Tenancy in the domain's terms (docs/SECURITY.md "Tenancy"): every sandbox, snapshot,
 * trajectory, lease and event belongs to one tenant, and every call that lists, looks up
 * or names objects acts within a {@link Scope}. The API turns the caller (the door's
 * principal) into a Scope once (daemon/api/scope.ts); the services below take the Scope,
 * never the request.
 */
import { notFound } from '../errors.js';

/** The tenant of what the Unix socket creates and of everything made before tenancy existed. */
export const SYSTEM_TENANT = 'system';

/** Tenant names: 1-63 of a-z, 0-9, `_` and `-`, starting with a letter or digit (never `/`, so `tenant/name` keys are unambiguous). */
export const TENANT_RE = /^[a-z0-9][a-z0-9_-]{0,62}$/;

/**
 * Who a call acts for.
 * - `tenant`: the tenant new objects get, and the one whose names (snapshot names,
 *   trajectory ids, lease jobs) the call means.
 * - `all`: the caller sees and changes every tenant's objects by id and in lists (an
 *   admin: the Unix socket, an admin token); names still resolve in `tenant` first.
 */
export interface Scope {
  readonly tenant: string;
  readonly all: boolean;
}

/** The local administrator's scope (the Unix socket; internal callers such as the reaper's sweeps of host-wide state). */
export const SYSTEM_SCOPE: Scope = Object.freeze({ tenant: SYSTEM_TENANT, all: true });

/** The scope of exactly one tenant, seeing nothing else (a lease's sweep acts in its own tenant only). */
export function tenantScope(tenant: string): Scope {
  return { tenant, all: false };
}

/** The tenant of an image manifest (`system` when it names none: the layout and JSON before tenancy). */
export function imageTenant(m: { tenant?: string }): string {
  return m.tenant ?? SYSTEM_TENANT;
}

/** The `tenant` field a manifest of `tenant` carries: none for `system` (the layout and JSON before tenancy). */
export function ownTenant(tenant: string): { tenant?: string } {
  return tenant === SYSTEM_TENANT ? {} : { tenant };
}

/** Whether an object of `tenant` is visible to `scope`. */
export function visible(scope: Scope, tenant: string): boolean {
  return scope.all || scope.tenant === tenant;
}

/**
 * Returns `obj` when `scope` sees it; otherwise throws the NotFound a missing object of
 * that kind gets, so an answer never tells another tenant's object from none (no
 * existence oracle).
 * @param what the message of the NotFound, the same text the missing case uses (e.g. `sandbox ID not found`)
 * @throws DsecError NotFound when `obj` is undefined or belongs to a tenant `scope` does not see.
 */
export function inScope<T extends { tenant: string }>(scope: Scope, obj: T | undefined, what: string): T {
  if (!obj || !visible(scope, obj.tenant)) throw notFound(what);
  return obj;
}

/**
 * What one tenant may hold at once on a host (`[quotas]`, daemon/config.ts): null means
 * no limit. Counted like admission counts the host (warm-pool shells excluded), over the
 * tenant's sandboxes in every state but destroyed (a stopped sandbox keeps its slot).
 */
export interface TenantQuota {
  /** Sandboxes. */
  sandboxes: number | null;
  /** Sum of CPU limits, cores. */
  cpus: number | null;
  /** Sum of memory limits, bytes. */
  memoryBytes: number | null;
}
