/**
 * Tenant isolation over the TCP door, derived from the route table (docs/SECURITY.md
 * "Tenancy"): tenant A makes one object of each kind; for every route of ROUTE_DOCS whose
 * path names a tenant's object (a new route joins by existing), tenant B's token on A's
 * object gets the NotFound a random id gets, and A's objects are unchanged afterwards;
 * no list of B's shows A's objects; the same names in two tenants (snapshots,
 * trajectories, jobs, images) are two objects, the system images shared by both; a
 * tenant's quota refuses with ResourceExhausted naming it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import tls from 'node:tls';
import WebSocket from 'ws';
import { renderOpenApi } from '../../daemon/api/openapi.js';
import { ROUTE_DOCS, type RouteDoc } from '../../daemon/api/routes/table.js';
import { paramScope, pathParams } from '../../daemon/api/tenancy.js';
import '../../gateway/hosts.js'; // the gateway's routes are in the table too (admin only, no tenant objects)
import { IS_ROOT, TestDaemon } from './harness.js';
import { doorRequest, makeToken, type DoorAnswer } from './remote-helpers.js';

renderOpenApi(); // imports every route module, filling ROUTE_DOCS

/** Prefixes of routes whose parameter names no tenant's object (host-wide layers and E2B templates, admin-only tokens and fleet hosts). */
const NOT_TENANT_OBJECTS = ['/v1/layers/:digest', '/v1/templates/:name', '/v1/tokens/:id', '/v1/hosts/:name'];

/** Bodies a tenant-scoped route needs to get past its parsing to the lookup (every other route's lookup comes first). */
const BODIES: Record<string, unknown> = {
  'POST /v1/snapshots/:ref/fork': { count: 1 },
  'POST /v1/snapshots/:ref/restore': {},
  'POST /v1/leases/:job/renew': {},
  'POST /v1/images/:ref/tag': { target: 'b-copy:v1' },
};

/** A's objects, and the random ids of the same shapes a missing object has. */
interface Objects { sandbox: string; exec: string; snapshot: string; snapshotName: string; trajectory: string; job: string; image: string }
const RANDOM: Objects = {
  sandbox: '0123456789abcdef', exec: 'f'.repeat(32), snapshot: 'snap-0123456789abcdef', snapshotName: 'no-such-snapshot', trajectory: 'no-such-trajectory', job: 'no-such-job',
  image: 'no-such-image:v1',
};

/** The concrete path of route `url` with `o`'s objects (`snapshot` by id or by name). */
function concrete(url: string, o: Objects, byName = false): string {
  return url.replace(/:([A-Za-z_]+)/g, (_m, p: string) => {
    if (p === 'exec_id') return o.exec;
    if (url.startsWith('/v1/sandboxes/:id')) return o.sandbox;
    if (url.startsWith('/v1/snapshots/:ref')) return byName ? o.snapshotName : o.snapshot;
    if (url.startsWith('/v1/trajectories/:id')) return o.trajectory;
    if (url.startsWith('/v1/leases/:job')) return o.job;
    if (url.startsWith('/v1/images/:ref')) return encodeURIComponent(o.image);
    throw new Error(`no object for :${p} of ${url}`);
  });
}

/** The routes whose path names a tenant's object: every route of the table with a path parameter, but those of {@link NOT_TENANT_OBJECTS}. */
function tenantRoutes(): RouteDoc[] {
  return ROUTE_DOCS.filter((r) => pathParams(r.url).length > 0 && !NOT_TENANT_OBJECTS.some((p) => r.url === p || r.url.startsWith(`${p}/`)));
}

describe('the tenant scope of every path parameter', () => {
  it('covers every route of the table; only images, layers, E2B templates, tokens and fleet hosts are not tenant objects', () => {
    for (const r of ROUTE_DOCS) {
      for (const p of pathParams(r.url)) {
        const s = paramScope(r.url, p);
        expect(s, `${r.method} ${r.url} :${p}`).toBeDefined();
        if (s === 'shared' || s === 'admin') expect(NOT_TENANT_OBJECTS.some((x) => r.url === x || r.url.startsWith(`${x}/`)), `${r.method} ${r.url}`).toBe(true);
      }
    }
    expect(paramScope('/v1/widgets/:id', 'id')).toBeUndefined();
    expect(tenantRoutes().length).toBeGreaterThan(40);
  });
});

describe.skipIf(!IS_ROOT)('tenant isolation over the TCP door', () => {
  let d: TestDaemon;
  let a: string, b: string, admin: string, q: string;
  const A = {} as Objects;
  const as = (token: string, method: string, path: string, json?: unknown) => doorRequest(d, { method, path, token, ...(json !== undefined ? { json } : {}) });
  const ok = async (p: Promise<DoorAnswer>, status = 200) => {
    const r = await p;
    expect(r.status, r.body).toBe(status);
    return JSON.parse(r.body);
  };
  /** What A's objects look like: compared before and after B's calls. */
  const stateOfA = async () => ({
    sandbox: (await ok(as(a, 'GET', `/v1/sandboxes/${A.sandbox}`))).state as string,
    exec: (await ok(as(a, 'GET', `/v1/sandboxes/${A.sandbox}/execs/${A.exec}`))).state as string,
    marker: (await as(a, 'GET', `/v1/sandboxes/${A.sandbox}/files?path=/tmp/marker`)).body,
    snapshot: (await ok(as(a, 'GET', `/v1/snapshots/${A.snapshot}`))).name as string,
    trajectory: await ok(as(a, 'GET', `/v1/trajectories/${A.trajectory}`)).then((t) => ({ steps: t.steps, truncations: t.truncations })),
    lease: await ok(as(a, 'GET', `/v1/leases/${A.job}`)).then((l) => ({ expires_at: l.expires_at, sandboxes: l.sandboxes })),
    network: await ok(as(a, 'GET', `/v1/sandboxes/${A.sandbox}/network`)),
    image: await ok(as(a, 'GET', `/v1/images/${encodeURIComponent(A.image)}`)).then((i) => ({ tenant: i.tenant, layers: i.layers, created_at: i.created_at })),
  });

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 43, listen: true, config: '[quotas.tenants.team-q]\nsandboxes = 1\n[pool]\n[[pool.entries]]\nimage = "busybox"\nsize = 1\n' });
    a = (await makeToken(d, 'team-a', 'user')).token;
    b = (await makeToken(d, 'team-b', 'user')).token;
    q = (await makeToken(d, 'team-q', 'user')).token;
    admin = (await makeToken(d, 'system', 'admin')).token;
    const sb = await ok(as(a, 'POST', '/v1/sandboxes', { image: 'busybox', labels: { job: 'job-a1' } }), 201);
    A.sandbox = sb.id;
    expect(sb.tenant).toBe('team-a');
    expect((await doorRequest(d, { method: 'PUT', path: `/v1/sandboxes/${A.sandbox}/files?path=/tmp/marker`, token: a, raw: 'tenant a was here' })).status).toBeLessThan(300);
    A.image = 'app-a:v1';
    expect((await ok(as(a, 'POST', `/v1/sandboxes/${A.sandbox}/commit`, { image: A.image }), 201)).image.tenant).toBe('team-a');
    A.exec = (await ok(as(a, 'POST', `/v1/sandboxes/${A.sandbox}/execs`, { argv: ['cat'], stdin: true }), 201)).exec_id;
    A.snapshotName = 'snap-name';
    A.snapshot = (await ok(as(a, 'POST', `/v1/sandboxes/${A.sandbox}/snapshot`, { name: A.snapshotName }), 201)).id;
    A.trajectory = 'traj-a1';
    await ok(as(a, 'POST', `/v1/sandboxes/${A.sandbox}/exec`, { argv: ['echo', 'a'], trajectory: A.trajectory, step: 0 }));
    A.job = 'job-a1';
    await ok(as(a, 'POST', '/v1/leases', { job: A.job, ttl_s: 3600 }));
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it("answers B on every route naming A's object exactly as on a missing one, and A's objects are unchanged", async () => {
    const before = await stateOfA();
    expect(before).toMatchObject({ sandbox: 'running', exec: 'running', marker: 'tenant a was here', snapshot: A.snapshotName, image: { tenant: 'team-a' } });
    const ca = readFileSync(d.caFile);
    const tried: string[] = [];
    for (const r of tenantRoutes()) {
      const key = `${r.method} ${r.url}`;
      for (const byName of r.url.startsWith('/v1/snapshots/:ref') ? [false, true] : [false]) {
        const theirs = concrete(r.url, A, byName), missing = concrete(r.url, RANDOM, byName);
        if (r.status === 101) {
          // A WebSocket: the upgrade is refused with the answer of a missing object.
          const upgrade = (p: string) => new Promise<number>((resolve, reject) => {
            const ws = new WebSocket(`wss://127.0.0.1:${d.remotePort}${p}`, { ca, headers: { authorization: `Bearer ${b}` } });
            ws.on('unexpected-response', (_req, res) => {
              resolve(res.statusCode ?? 0);
              ws.terminate();
            });
            ws.on('open', () => {
              ws.terminate();
              resolve(101);
            });
            ws.on('error', reject);
          });
          expect(await upgrade(theirs), key).toBe(404);
          expect(await upgrade(missing), key).toBe(404);
        } else {
          const body = BODIES[key];
          const got = await as(b, r.method, theirs, body);
          const none = await as(b, r.method, missing, body);
          expect(got.status, `${key} ${theirs}: ${got.body}`).toBe(404);
          expect(JSON.parse(got.body).error.code, key).toBe('NotFound');
          // Same answer as a missing object, the id aside: no existence oracle.
          const ids = (s: string, o: Objects) => [o.sandbox, o.snapshot, o.snapshotName, o.trajectory, o.job, o.image].sort((x, y) => y.length - x.length).reduce((t, id) => t.split(id).join('ID'), s);
          expect(ids(got.body, A), key).toBe(ids(none.body, RANDOM));
        }
        tried.push(`${key}${byName ? ' (by name)' : ''}`);
      }
    }
    expect(tried.length).toBeGreaterThan(40);
    expect(await stateOfA()).toEqual(before);
  });

  it('closes the connection of a refused WebSocket upgrade (tenant 404, door 401) once the answer is out', async () => {
    const ca = readFileSync(d.caFile);
    for (const [token, status] of [[b, 404], ['', 401]] as const) {
      const got = await new Promise<string>((resolve, reject) => {
        const s = tls.connect({ host: '127.0.0.1', port: d.remotePort!, ca, servername: 'localhost' }, () => {
          s.write(`GET /v1/sandboxes/${A.sandbox}/execs/${A.exec}/attach HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n`
            + `Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n${token ? `Authorization: Bearer ${token}\r\n` : ''}\r\n`);
        });
        let text = '';
        s.on('data', (c: Buffer) => (text += c.toString('latin1')));
        // dsecd ends the connection; before, it stayed open (untracked by the HTTP server, so shutdown waited on it).
        s.on('close', () => resolve(text));
        s.on('error', reject);
      });
      expect(got.startsWith(`HTTP/1.1 ${status} `), got).toBe(true);
    }
  });

  it("shows B none of A's objects in any list, and B's label selectors and leases never reach A's", async () => {
    const aIds = [A.sandbox, A.snapshot, A.snapshotName, `"${A.trajectory}"`, `"job":"${A.job}"`, A.image];
    for (const r of ROUTE_DOCS.filter((x) => x.method === 'GET' && pathParams(x.url).length === 0 && x.status !== 101)) {
      const got = await as(b, 'GET', r.url);
      for (const id of aIds) expect(got.body.includes(id), `GET ${r.url} shows ${id} to tenant B`).toBe(false);
    }
    // An admin sees A's objects in the same lists.
    expect((await as(admin, 'GET', '/v1/sandboxes')).body).toContain(A.sandbox);
    expect((await as(admin, 'GET', '/v1/snapshots')).body).toContain(A.snapshot);
    expect((await ok(as(admin, 'GET', '/v1/images'))).images).toContainEqual(expect.objectContaining({ ref: A.image, tenant: 'team-a' }));
    const before = await stateOfA();
    expect(await ok(as(b, 'POST', '/v1/sandboxes/bulk', { selector: `job=${A.job}`, action: 'destroy' }))).toEqual({ results: [] });
    // B's lease of job ja is B's own: A's is neither renewed nor replaced.
    const bl = await ok(as(b, 'POST', '/v1/leases', { job: A.job, ttl_s: 60 }));
    expect(bl).toMatchObject({ tenant: 'team-b', job: A.job, sandboxes: 0 });
    expect(await ok(as(b, 'DELETE', `/v1/leases/${A.job}`))).toMatchObject({ tenant: 'team-b' });
    expect(await stateOfA()).toEqual(before);
  });

  it('keeps the same names in two tenants as two independent objects', async () => {
    const sb = await ok(as(b, 'POST', '/v1/sandboxes', { image: 'busybox' }), 201);
    expect(sb.tenant).toBe('team-b');
    const snap = await ok(as(b, 'POST', `/v1/sandboxes/${sb.id}/snapshot`, { name: A.snapshotName }), 201);
    expect(snap.id).not.toBe(A.snapshot);
    expect((await ok(as(b, 'GET', `/v1/snapshots/${A.snapshotName}`))).id).toBe(snap.id);
    expect((await ok(as(a, 'GET', `/v1/snapshots/${A.snapshotName}`))).id).toBe(A.snapshot);
    // Step 0 of B's trajectory of the same id runs (A's recorded step would be a step_mismatch).
    const r = await ok(as(b, 'POST', `/v1/sandboxes/${sb.id}/exec`, { argv: ['echo', 'b'], trajectory: A.trajectory, step: 0 }));
    expect(r).toMatchObject({ replayed: false, trajectory: A.trajectory });
    expect(Buffer.from(r.stdout_b64, 'base64').toString()).toBe('b\n');
    expect((await ok(as(a, 'GET', `/v1/trajectories/${A.trajectory}`))).step_list[0].argv).toEqual(['echo', 'a']);
    const restored = await ok(as(b, 'POST', `/v1/snapshots/${A.snapshotName}/restore`, {}), 201);
    expect(restored).toMatchObject({ tenant: 'team-b', snapshot: snap.id });
    for (const id of [restored.id, sb.id]) await ok(as(b, 'DELETE', `/v1/sandboxes/${id}?force=true`));
  });

  it('keeps image names per tenant: own images private and independent, system images shared and not theirs to change', async () => {
    const put = (t: string, id: string, text: string) => doorRequest(d, { method: 'PUT', path: `/v1/sandboxes/${id}/files?path=/work/content`, token: t, raw: text });
    const content = async (t: string, id: string) => (await as(t, 'GET', `/v1/sandboxes/${id}/files?path=/work/content`)).body;
    // Both tenants create from the system busybox and commit their own app:v1.
    const layers: Record<string, string[]> = {};
    for (const [t, text] of [[a, 'made by a'], [b, 'made by b']] as const) {
      const sb = await ok(as(t, 'POST', '/v1/sandboxes', { image: 'busybox', filesystem: { writable_paths: ['/work'] } }), 201);
      const w = await put(t, sb.id, text);
      expect(w.status, w.body).toBeLessThan(300);
      const c = await ok(as(t, 'POST', `/v1/sandboxes/${sb.id}/commit`, { image: 'app:v1' }), 201);
      layers[text] = c.image.layers;
      await ok(as(t, 'DELETE', `/v1/sandboxes/${sb.id}?force=true`));
    }
    expect(layers['made by a']).not.toEqual(layers['made by b']);
    for (const [t, text] of [[a, 'made by a'], [b, 'made by b']] as const) {
      const sb = await ok(as(t, 'POST', '/v1/sandboxes', { image: 'app:v1' }), 201);
      expect(await content(t, sb.id)).toBe(text);
      await ok(as(t, 'DELETE', `/v1/sandboxes/${sb.id}?force=true`));
      // Its list: its own app:v1 and system images, nothing of the other tenant's.
      const list = (await ok(as(t, 'GET', '/v1/images'))).images as { ref: string; tenant: string; layers: string[] }[];
      const own = t === a ? 'team-a' : 'team-b';
      expect(list.filter((i) => i.ref === 'app:v1')).toEqual([expect.objectContaining({ tenant: own, layers: layers[text] })]);
      expect(list.every((i) => i.tenant === 'system' || i.tenant === own), JSON.stringify(list)).toBe(true);
      expect(list.some((i) => i.ref === 'busybox:latest' && i.tenant === 'system')).toBe(true);
    }
    // B composing from A's layer gets what a missing layer gets.
    const aLayer = layers['made by a'].at(-1)!;
    const composed = await as(b, 'POST', '/v1/images', { image: 'steal:v1', layers: [aLayer] });
    expect(composed.status, composed.body).toBe(404);
    expect(JSON.parse(composed.body).error.message).toBe(`image steal:v1: layer ${aLayer} is not in the store`);
    // B removing app:v1 removes B's only; the name is then missing for B, as it always was for a third tenant.
    expect((await ok(as(b, 'DELETE', '/v1/images/app%3Av1'))).tenant).toBe('team-b');
    const gone = await as(b, 'GET', '/v1/images/app%3Av1');
    expect([gone.status, JSON.parse(gone.body).error.message]).toEqual([404, 'image app:v1 not found']);
    expect((await ok(as(a, 'GET', '/v1/images/app%3Av1'))).layers).toEqual(layers['made by a']);
    // An admin lists A's app:v1 but resolves names in its own tenant: its NotFound says whose the name is and what to do.
    const byAdmin = await as(admin, 'GET', '/v1/images/app%3Av1');
    expect([byAdmin.status, JSON.parse(byAdmin.body).error.message]).toEqual([404,
      'image app:v1 not found in tenant system; tenant team-a has one: admins resolve image names in their own tenant, so act on it with a token of that tenant (dsec token create --tenant team-a --role user)']);
    // A system image: a user may neither remove it nor replace it; its tag of the name shadows it for itself only.
    const sys = await ok(as(admin, 'GET', '/v1/images/busybox'));
    expect(sys.tenant).toBe('system');
    const rm = await as(b, 'DELETE', '/v1/images/busybox');
    expect(rm.status, rm.body).toBe(403);
    expect(JSON.parse(rm.body).error).toEqual({ code: 'PermissionDenied', message: 'image busybox:latest is a system image shared by every tenant; only an admin may remove it' });
    expect(await ok(as(a, 'POST', '/v1/images/app%3Av1/tag', { target: 'busybox:latest' }), 201)).toMatchObject({ tenant: 'team-a' });
    expect((await ok(as(a, 'GET', '/v1/images/busybox'))).layers).toEqual(layers['made by a']);
    expect((await ok(as(b, 'GET', '/v1/images/busybox'))).layers).toEqual(sys.layers);
    // The warm pool's busybox shell is the system image's: A's create of its own busybox is
    // not handed it (A gets its content), B's create of the system busybox is.
    const pool = async () => (await ok(as(admin, 'GET', '/v1/host'))).warm_pools[0] as { ready: number; filling: number; claimed: number };
    while ((await pool()).ready < 1) await new Promise((r) => setTimeout(r, 100));
    const claimed = (await pool()).claimed;
    const fromA = await ok(as(a, 'POST', '/v1/sandboxes', { image: 'busybox' }), 201);
    expect(await content(a, fromA.id)).toBe('made by a');
    expect((await pool()).claimed).toBe(claimed);
    const fromB = await ok(as(b, 'POST', '/v1/sandboxes', { image: 'busybox' }), 201);
    expect((await pool()).claimed).toBe(claimed + 1);
    expect(fromB.image).toBe('busybox:latest');
    for (const [t, id] of [[a, fromA.id], [b, fromB.id]]) await ok(as(t, 'DELETE', `/v1/sandboxes/${id}?force=true`));
    expect((await ok(as(admin, 'GET', '/v1/images/busybox'))).layers).toEqual(sys.layers);
    expect((await ok(as(a, 'DELETE', '/v1/images/busybox'))).tenant).toBe('team-a');
    expect((await ok(as(a, 'GET', '/v1/images/busybox'))).layers).toEqual(sys.layers);
  });

  it("refuses a create past the tenant's quota with ResourceExhausted naming the quota and its use", async () => {
    const first = await ok(as(q, 'POST', '/v1/sandboxes', { image: 'busybox' }), 201);
    const second = await as(q, 'POST', '/v1/sandboxes', { image: 'busybox' });
    expect(second.status).toBe(429);
    const err = JSON.parse(second.body).error;
    expect(err.code).toBe('ResourceExhausted');
    expect(err.message).toContain('tenant team-q is at its quota of 1 sandboxes (quotas.tenants.team-q.sandboxes): it has 1');
    // Other tenants are not held by team-q's quota.
    const other = await ok(as(b, 'POST', '/v1/sandboxes', { image: 'busybox' }), 201);
    for (const [t, id] of [[q, first.id], [b, other.id]]) await ok(as(t, 'DELETE', `/v1/sandboxes/${id}?force=true`));
  });
});
