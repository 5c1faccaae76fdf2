/**
 * The API's URL paths with their parameters escaped, and query strings. Every path
 * parameter goes through encodeURIComponent: ids, refs and names may hold `/`, `:` or `@`.
 */

/** `/v1/sandboxes/{id}` with the id escaped. */
export function sandboxPath(id: string): string {
  return `/v1/sandboxes/${encodeURIComponent(id)}`;
}

/** `/v1/sandboxes/{id}/execs`. */
export function execsPath(id: string): string {
  return `${sandboxPath(id)}/execs`;
}

/** `/v1/sandboxes/{id}/execs/{exec_id}`. */
export function execPath(id: string, execId: string): string {
  return `${execsPath(id)}/${encodeURIComponent(execId)}`;
}

/** `/v1/images/{ref}` with the ref escaped (`team/py:1` → `team%2Fpy%3A1`). */
export function imagePath(ref: string): string {
  return `/v1/images/${encodeURIComponent(ref)}`;
}

/** `/v1/snapshots/{ref}` with the ref (id or name) escaped. */
export function snapshotPath(ref: string): string {
  return `/v1/snapshots/${encodeURIComponent(ref)}`;
}

/** `/v1/trajectories/{id}` with the id escaped (ids may hold `:` and `@`). */
export function trajectoryPath(id: string): string {
  return `/v1/trajectories/${encodeURIComponent(id)}`;
}

/** `/v1/leases/{job}` with the job escaped (a job may contain `/`). */
export function leasePath(job: string): string {
  return `/v1/leases/${encodeURIComponent(job)}`;
}

/** Query string (with its `?`) of the defined, non-empty values, or `''`. */
export function query(params: Record<string, string | undefined>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== '') q.set(k, v);
  const s = q.toString();
  return s === '' ? '' : `?${s}`;
}
