import { describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { migrate, openDb } from '../../daemon/db/db.js';
import { MIGRATIONS } from '../../daemon/db/migrations.js';
import { SandboxRepo } from '../../daemon/db/sandboxes.js';
import { SnapshotRepo } from '../../daemon/db/snapshots.js';
import { parseSelector } from '../../daemon/model/selector.js';

const pool = { base: 1 << 20, size: 4 * 65536, rangeSize: 65536 };

function rec(id: string, tenant = 'system') {
  return {
    id, tenant, backend: 'container' as const, image: 'busybox:latest', imageLayers: ['sha256:aa'],
    imageConfig: { env: [], cwd: '/', user: '0', cmd: [] }, cpus: 1, memoryBytes: 1 << 28, pids: 100,
    labels: { job: 'a' }, env: {}, ttlS: null, createdAt: Date.now(), priority: 'latency' as const, idleTimeoutS: null,
  };
}

describe('migrations', () => {
  it('migration 1 applies to an empty database and sets user_version', () => {
    const db = new Database(':memory:');
    expect(migrate(db, MIGRATIONS.slice(0, 1))).toEqual([1]);
    expect(db.pragma('user_version', { simple: true })).toBe(1);
    const tables = db.prepare("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name").all().map((r: any) => r.name);
    expect(tables).toEqual(expect.arrayContaining(['sandboxes', 'uid_ranges', 'events']));
    expect(migrate(db)).toEqual(MIGRATIONS.slice(1).map((m) => m.version));
  });
  it('migration 2 adds priority, idle timeout, last activity and leases to a version-1 store, keeping its rows', () => {
    const db = new Database(':memory:');
    migrate(db, MIGRATIONS.slice(0, 1));
    db.prepare(`INSERT INTO sandboxes (id, backend, image, image_layers, image_config, state, cpus, memory_bytes, pids, labels, env, created_at, updated_at)
      VALUES ('old', 'container', 'busybox:latest', '[]', '{"env":[],"cwd":"/","user":"0","cmd":[]}', 'running', 1, 1, 8, '{}', '{}', 1, 1)`).run();
    expect(migrate(db, MIGRATIONS.slice(0, 2))).toEqual([2]);
    const row = db.prepare("SELECT priority, idle_timeout_s, last_active_at FROM sandboxes WHERE id = 'old'").get();
    expect(row).toEqual({ priority: 'latency', idle_timeout_s: null, last_active_at: null });
    db.prepare("INSERT INTO leases (job, ttl_s, expires_at, created_at) VALUES ('j', 5, 10, 1)").run();
    expect(db.prepare('SELECT job, lapsed_at FROM leases').all()).toEqual([{ job: 'j', lapsed_at: null }]);
  });
  it('migration 8 adds the io column to a version-7 store, keeping its rows (io NULL: no settings)', () => {
    const db = new Database(':memory:');
    migrate(db, MIGRATIONS.slice(0, 7));
    db.prepare(`INSERT INTO sandboxes (id, backend, image, image_layers, image_config, state, cpus, memory_bytes, pids, labels, env, created_at, updated_at)
      VALUES ('old', 'container', 'busybox:latest', '[]', '{"env":[],"cwd":"/","user":"0","cmd":[]}', 'running', 1, 1, 8, '{}', '{}', 1, 1)`).run();
    expect(migrate(db, MIGRATIONS.slice(0, 8))).toEqual([8]);
    expect(db.prepare("SELECT io FROM sandboxes WHERE id = 'old'").get()).toEqual({ io: null });
  });
  it('migration 10 gives every sandbox, snapshot, trajectory, lease and event of a version-9 store the system tenant, and makes snapshot names unique per tenant', () => {
    const db = new Database(':memory:');
    migrate(db, MIGRATIONS.slice(0, 9));
    db.prepare(`INSERT INTO sandboxes (id, backend, image, image_layers, image_config, state, cpus, memory_bytes, pids, labels, env, created_at, updated_at)
      VALUES ('old', 'container', 'busybox:latest', '[]', '{"env":[],"cwd":"/","user":"0","cmd":[]}', 'running', 1, 1, 8, '{}', '{}', 1, 1)`).run();
    const snap = `INSERT INTO snapshots (id, name, kind, sandbox_id, backend, image, image_layers, image_config, layer, size_bytes, cpus, memory_bytes, pids,
      priority, labels, env, created_at, network, disk_bytes, filesystem, machine) VALUES (?, ?, 'filesystem', 'old', 'container', 'busybox:latest', '[]', '{}', 'sha256:bb', 1, 1, 1, 8,
      'latency', '{}', '{}', 1, NULL, 5, NULL, NULL)`;
    db.prepare(snap).run('snap-0000000000000001', 'n');
    db.prepare("INSERT INTO leases (job, ttl_s, expires_at, created_at) VALUES ('j', 5, 10, 1)").run();
    db.prepare("INSERT INTO trajectories (id, created_at, updated_at) VALUES ('t', 1, 1)").run();
    db.prepare("INSERT INTO events (time, type) VALUES (1, 'x')").run();
    expect(migrate(db, MIGRATIONS.slice(0, 10))).toEqual([10]);
    for (const t of ['sandboxes', 'snapshots', 'trajectories', 'leases', 'events']) {
      expect(db.prepare(`SELECT DISTINCT tenant FROM ${t}`).all(), t).toEqual([{ tenant: 'system' }]);
    }
    expect(db.prepare("SELECT name, disk_bytes FROM snapshots WHERE id = 'snap-0000000000000001'").get()).toEqual({ name: 'n', disk_bytes: 5 });
    expect(db.prepare('SELECT job, ttl_s FROM leases').all()).toEqual([{ job: 'j', ttl_s: 5 }]);
    // The same name in another tenant is another snapshot; twice in one tenant is refused.
    const snapT = snap.replace('(id, name,', '(id, tenant, name,').replace('VALUES (?, ?,', 'VALUES (?, ?, ?,');
    db.prepare(snapT).run('snap-0000000000000002', 'team-b', 'n');
    expect(() => db.prepare(snapT).run('snap-0000000000000003', 'team-b', 'n')).toThrow(/UNIQUE/);
  });
  it('migration 11 fills the admission totals of a version-10 store from its rows, without warm-pool shells', () => {
    const db = new Database(':memory:');
    migrate(db, MIGRATIONS.slice(0, 10));
    const ins = db.prepare(`INSERT INTO sandboxes (id, tenant, backend, image, image_layers, image_config, state, cpus, memory_bytes, pids, labels, env, created_at, updated_at, disk_bytes)
      VALUES (?, ?, ?, 'busybox:latest', '[]', '{"env":[],"cwd":"/","user":"0","cmd":[]}', 'running', ?, ?, 8, ?, '{}', 1, 1, ?)`);
    ins.run('a', 'system', 'container', 0.5, 100, '{}', 1000);
    ins.run('b', 'system', 'microvm', 1.25, 200, '{"job":"x"}', 5000);
    ins.run('c', 'team-b', 'container', 2, 300, '{}', null);
    ins.run('shell', 'system', 'container', 1, 400, '{"dsec.pool":"busybox"}', 1000);
    expect(migrate(db, MIGRATIONS.slice(0, 11))).toEqual([11]);
    expect(db.prepare('SELECT * FROM admission_totals ORDER BY tenant').all()).toEqual([
      { tenant: 'system', n: 2, mem: 300, mcpus: 1750, disk: 1000 },
      { tenant: 'team-b', n: 1, mem: 300, mcpus: 2000, disk: 0 },
    ]);
  });
  it('versions are consecutive from 1', () => {
    MIGRATIONS.forEach((m, i) => expect(m.version).toBe(i + 1));
  });
  it('refuses a database newer than the binary', () => {
    const db = new Database(':memory:');
    db.pragma('user_version = 999');
    expect(() => migrate(db)).toThrow(/newer than this dsecd knows/);
  });
  it('opens a file database in WAL mode and survives reopen', () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'dsec-db-'));
    try {
      const f = path.join(dir, 'x.db');
      const db = openDb(f);
      expect(db.pragma('journal_mode', { simple: true })).toBe('wal');
      new SandboxRepo(db, pool).insertCreating(rec('a1'));
      db.close();
      const db2 = openDb(f);
      expect(new SandboxRepo(db2, pool).get('a1').state).toBe('creating');
      db2.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('SandboxRepo', () => {
  it('keeps the admission totals equal to a scan of the rows through inserts, claims of shells, changes and removals', () => {
    const db = openDb(':memory:');
    const repo = new SandboxRepo(db, { base: 1 << 20, size: 256 * 65536, rangeSize: 65536 });
    const scan = (tenant?: string) => {
      const r = db.prepare(`SELECT COUNT(*) n, COALESCE(SUM(memory_bytes), 0) mem, COALESCE(SUM(cpus), 0) cpus,
          COALESCE(SUM(CASE WHEN backend = 'container' THEN disk_bytes END), 0) disk FROM sandboxes
        WHERE json_extract(labels, '$."dsec.pool"') IS NULL ${tenant ? 'AND tenant = ?' : ''}`).get(...(tenant ? [tenant] : [])) as { n: number; mem: number; cpus: number; disk: number };
      return { count: r.n, memoryBytes: r.mem, cpus: Math.round(r.cpus * 1000) / 1000, diskBytes: r.disk };
    };
    const same = () => {
      for (const t of [undefined, 'system', 'team-b', 'nobody']) expect(repo.admissionTotals(t), String(t)).toEqual(scan(t));
    };
    same();
    // A deterministic mix: tenths of cores (which would drift as a sum of floats), shells, two tenants.
    let seed = 7;
    const rnd = (n: number) => (seed = (seed * 1103515245 + 12345) % 2 ** 31) % n;
    const live: string[] = [];
    for (let i = 0; i < 200; i++) {
      const op = rnd(4);
      if (op <= 1 || live.length === 0) {
        const id = `s${i}`;
        const shell = rnd(3) === 0;
        repo.insertCreating({ ...rec(id, rnd(2) ? 'system' : 'team-b'), cpus: (1 + rnd(20)) / 10, memoryBytes: 1 + rnd(1000), diskBytes: rnd(2) ? 1 + rnd(5000) : null,
          labels: shell ? { 'dsec.pool': 'busybox' } : { job: 'a' } } as Parameters<SandboxRepo['insertCreating']>[0]);
        live.push(id);
      } else if (op === 2) {
        const id = live[rnd(live.length)];
        repo.claimShell(id, { tenant: rnd(2) ? 'system' : 'team-b', labels: { job: 'b' }, env: {}, ttlS: null, idleTimeoutS: null, cpus: (1 + rnd(20)) / 10,
          memoryBytes: 1 + rnd(1000), pids: 8, network: null, io: null, now: Date.now() });
      } else {
        repo.remove(live.splice(rnd(live.length), 1)[0]);
      }
      same();
    }
    expect(live.length).toBeGreaterThan(5);
    expect(scan().diskBytes).toBeGreaterThan(0);
    expect(scan().count).toBeLessThan(live.length);
  });
  it('allocates disjoint uid ranges and exhausts the pool with ResourceExhausted', () => {
    const repo = new SandboxRepo(openDb(':memory:'), pool);
    const bases = ['a', 'b', 'c', 'd'].map((id) => repo.insertCreating(rec(id)).uidBase);
    expect(new Set(bases).size).toBe(4);
    for (const b of bases) expect((b! - pool.base) % pool.rangeSize).toBe(0);
    expect(() => repo.insertCreating(rec('e'))).toThrow(expect.objectContaining({ kind: 'ResourceExhausted' }));
    repo.remove('b');
    expect(repo.insertCreating(rec('e')).uidBase).toBe(bases[1]);
  });
  it('rebuilds the used-range set from the store', () => {
    const db = openDb(':memory:');
    const a = new SandboxRepo(db, pool).insertCreating(rec('a')).uidBase;
    const repo2 = new SandboxRepo(db, pool);
    expect(repo2.rangesInUse).toBe(1);
    expect(repo2.insertCreating(rec('b')).uidBase).not.toBe(a);
  });
  it('transition enforces the state machine and acknowledges creates', () => {
    const repo = new SandboxRepo(openDb(':memory:'), pool);
    repo.insertCreating(rec('a'));
    expect(repo.get('a').acknowledged).toBe(false);
    const r = repo.transition('a', 'running', { initPid: 42, initStart: 7 });
    expect(r).toMatchObject({ state: 'running', acknowledged: true, initPid: 42, desired: null });
    expect(() => repo.transition('a', 'creating')).toThrow(expect.objectContaining({ kind: 'FailedPrecondition' }));
  });
  it('frees uid ranges of vanished rows', () => {
    const db = openDb(':memory:');
    const repo = new SandboxRepo(db, pool);
    repo.insertCreating(rec('a'));
    db.prepare("DELETE FROM sandboxes WHERE id='a'").run();
    expect(repo.freeOrphanRanges()).toBe(1);
    expect(repo.rangesInUse).toBe(0);
  });
  it('records events and notifies listeners', () => {
    const repo = new SandboxRepo(openDb(':memory:'), pool);
    const seen: string[] = [];
    const off = repo.onEvent((e) => seen.push(e.type));
    const sb = repo.insertCreating(rec('a'));
    repo.event('sandbox.created', sb);
    off();
    repo.event('sandbox.destroyed', sb);
    expect(seen).toEqual(['sandbox.created']);
    expect(repo.events().map((e) => e.type)).toEqual(['sandbox.created', 'sandbox.destroyed']);
    expect(repo.events()[0]).toMatchObject({ sandbox_id: 'a', labels: { job: 'a' } });
  });
});

describe('leases', () => {
  it('renewal is accepted strictly before expires_at and refused at or after it, swept or not', () => {
    const repo = new SandboxRepo(openDb(':memory:'), pool);
    expect(repo.putLease('system', 'j', 10, 1000).created).toBe(true); // expires at 11000
    expect(repo.putLease('system', 'j', 10, 10_999, 'renew').lease.expires_at).toBe(20_999);
    expect(() => repo.putLease('system', 'j', 10, 20_999, 'renew')).toThrow(expect.objectContaining({ kind: 'FailedPrecondition' }));
    expect(repo.lapseDue(20_998)).toEqual([]);
    expect(repo.lapseDue(20_999)).toEqual([{ tenant: 'system', job: 'j' }]);
    expect(repo.lapseDue(30_000)).toEqual([]); // lapses once
    expect(() => repo.putLease('system', 'j', 10, 21_000)).toThrow(/expired/);
    expect(repo.lapsedBefore(20_999 + 5000)).toEqual([{ tenant: 'system', job: 'j' }]);
    expect(repo.deleteLease('system', 'j')).toBe(true);
    expect(() => repo.putLease('system', 'nope', 10, 0, 'renew')).toThrow(expect.objectContaining({ kind: 'NotFound' }));
  });
  it("are keyed on (tenant, job): tenant B's job a neither renews, lapses nor deletes A's", () => {
    const repo = new SandboxRepo(openDb(':memory:'), pool);
    repo.putLease('team-a', 'a', 10, 1000); // expires at 11000
    expect(repo.putLease('team-b', 'a', 100, 1000).created).toBe(true); // a second lease, not a renewal of A's
    expect(() => repo.putLease('team-b', 'z', 10, 0, 'renew')).toThrow(expect.objectContaining({ kind: 'NotFound' }));
    expect(repo.lapseDue(11_000)).toEqual([{ tenant: 'team-a', job: 'a' }]);
    expect(repo.lease('team-b', 'a')).toMatchObject({ lapsed_at: null, expires_at: 101_000 });
    expect(repo.deleteLease('team-b', 'a')).toBe(true);
    expect(repo.lease('team-a', 'a')).toMatchObject({ tenant: 'team-a', job: 'a' });
    expect(repo.leases('team-b')).toEqual([]);
    expect(repo.leases(null).map((l) => `${l.tenant}/${l.job}`)).toEqual(['team-a/a']);
  });
});

describe('snapshots per tenant', () => {
  const snap = (id: string, tenant: string, name: string | null) => ({
    id, tenant, name, kind: 'filesystem' as const, sandboxId: 'sb', backend: 'container' as const, image: 'busybox:latest', imageLayers: ['sha256:aa'],
    imageConfig: { env: [], cwd: '/', user: '0', cmd: [] }, layer: 'sha256:aa', sizeBytes: 1, cpus: 1, memoryBytes: 1, pids: 1, priority: 'latency' as const,
    labels: {}, env: {}, createdAt: 1, network: null, diskBytes: null, filesystem: null, machine: null,
  });
  it("names are unique per tenant; another tenant's snapshot answers as a missing one, by id and by name", () => {
    const repo = new SnapshotRepo(openDb(':memory:'));
    const A = { tenant: 'team-a', all: false }, B = { tenant: 'team-b', all: false };
    repo.insert(snap('snap-000000000000000a', 'team-a', 'n'));
    repo.insert(snap('snap-000000000000000b', 'team-b', 'n'));
    expect(() => repo.insert(snap('snap-000000000000000c', 'team-b', 'n'))).toThrow(expect.objectContaining({ kind: 'AlreadyExists' }));
    expect(repo.get('n', A).id).toBe('snap-000000000000000a');
    expect(repo.get('n', B).id).toBe('snap-000000000000000b');
    const missing = (() => { try { repo.get('snap-0000000000000fff', B); } catch (e) { return e; } })() as Error;
    expect(() => repo.get('snap-000000000000000a', B)).toThrow(missing.message.replace('snap-0000000000000fff', 'snap-000000000000000a'));
    expect(() => repo.get('snap-000000000000000a', B)).toThrow(expect.objectContaining({ kind: 'NotFound' }));
    expect(repo.all(B).map((x) => x.id)).toEqual(['snap-000000000000000b']);
    expect(repo.all().length).toBe(2); // the system admin's scope sees every tenant
    expect(repo.get('snap-000000000000000b').tenant).toBe('team-b');
  });
});

describe('event pruning', () => {
  it('keeps the newest N events', () => {
    const repo = new SandboxRepo(openDb(':memory:'), pool);
    for (let i = 0; i < 10; i++) repo.event(`e${i}`, null);
    expect(repo.pruneEvents(3)).toBe(7);
    expect(repo.events().map((e) => e.type)).toEqual(['e7', 'e8', 'e9']);
    expect(repo.pruneEvents(3)).toBe(0);
    // By age too.
    const cutoff = Date.now() + 1;
    expect(repo.pruneEvents(100, cutoff)).toBe(3);
    expect(repo.events()).toEqual([]);
  });
});

describe('selectors', () => {
  it('match all terms', () => {
    const m = parseSelector('job=a,round=3');
    expect(m({ job: 'a', round: '3', x: 'y' })).toBe(true);
    expect(m({ job: 'a', round: '4' })).toBe(false);
    expect(parseSelector('job')({ job: '' })).toBe(true);
    expect(parseSelector('job!=a')({ job: 'b' })).toBe(true);
    expect(parseSelector('job!=a')({})).toBe(true);
    expect(parseSelector('')({})).toBe(true);
  });
  it('reject malformed terms', () => {
    expect(() => parseSelector('=a')).toThrow(/empty key/);
    expect(() => parseSelector('a b=c')).toThrow(/bad selector key/);
    expect(() => parseSelector('job=a, x y=1')).toThrow(/bad selector key "x y" at position 7/);
  });
});
