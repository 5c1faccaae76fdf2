/**
 * Typed access to the `snapshots` table. A `filesystem` snapshot (containers) is a
 * sandbox's writable layer, packed unstripped as an EROFS layer in the image store; a
 * `vm` snapshot (microVMs) is the whole machine, its migration stream and writable disk
 * in `<root>/snapshots/<id>/` with the machine's configuration in the row. Both keep what
 * a restore needs to recreate the sandbox: its image layers and config, limits, labels
 * and env.
 */
import type { Db } from './db.js';
import type { Backend } from '../model/backend.js';
import type { SnapshotRecord } from '../model/snapshot.js';
import { alreadyExists } from '../errors.js';
import { SYSTEM_SCOPE, inScope, type Scope } from '../model/tenant.js';

interface Row {
  id: string; tenant: string; name: string | null; kind: string; sandbox_id: string; backend: string; image: string; image_layers: string; image_config: string;
  layer: string; size_bytes: number; cpus: number; memory_bytes: number; pids: number; priority: string; labels: string; env: string; created_at: number;
  network: string | null; disk_bytes: number | null; filesystem: string | null; machine: string | null;
}

const decode = (r: Row): SnapshotRecord => ({
  id: r.id, tenant: r.tenant, name: r.name, kind: r.kind === 'vm' ? 'vm' : 'filesystem', sandboxId: r.sandbox_id, backend: r.backend as Backend, image: r.image,
  imageLayers: JSON.parse(r.image_layers), imageConfig: JSON.parse(r.image_config), layer: r.layer, sizeBytes: r.size_bytes,
  cpus: r.cpus, memoryBytes: r.memory_bytes, pids: r.pids, priority: r.priority === 'batch' ? 'batch' : 'latency',
  labels: JSON.parse(r.labels), env: JSON.parse(r.env), createdAt: r.created_at,
  network: r.network ? JSON.parse(r.network) : null, diskBytes: r.disk_bytes, filesystem: r.filesystem ? JSON.parse(r.filesystem) : null,
  machine: r.machine ? JSON.parse(r.machine) : null,
});

/** Snapshot ids: `snap-` + 16 hex; anything else given as a ref is a name. */
export const SNAPSHOT_ID = /^snap-[0-9a-f]{16}$/;

/** Store access for snapshots. Synchronous (better-sqlite3). */
export class SnapshotRepo {
  constructor(private readonly db: Db) {}

  /**
   * Inserts a snapshot.
   * @throws DsecError AlreadyExists when the name is taken.
   */
  insert(s: SnapshotRecord): SnapshotRecord {
    this.assertNameFree(s.tenant, s.name);
    this.db.prepare(`INSERT INTO snapshots (id, tenant, name, kind, sandbox_id, backend, image, image_layers, image_config, layer, size_bytes, cpus,
        memory_bytes, pids, priority, labels, env, created_at, network, disk_bytes, filesystem, machine) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
      .run(s.id, s.tenant, s.name, s.kind, s.sandboxId, s.backend, s.image, JSON.stringify(s.imageLayers), JSON.stringify(s.imageConfig), s.layer,
        s.sizeBytes, s.cpus, s.memoryBytes, s.pids, s.priority, JSON.stringify(s.labels), JSON.stringify(s.env), s.createdAt,
        s.network ? JSON.stringify(s.network) : null, s.diskBytes, s.filesystem ? JSON.stringify(s.filesystem) : null,
        s.machine ? JSON.stringify(s.machine) : null);
    return s;
  }

  /** @throws DsecError AlreadyExists when a snapshot of `tenant` already has `name` (names are unique per tenant: another tenant's never collide). */
  assertNameFree(tenant: string, name: string | null): void {
    if (name !== null && this.db.prepare('SELECT 1 FROM snapshots WHERE tenant = ? AND name = ?').get(tenant, name)) {
      throw alreadyExists(`a snapshot named ${name} already exists; pick another name or remove it with \`dsec snapshot rm ${name}\``);
    }
  }

  /**
   * The snapshot with this id (`snap-…`) or name, as `scope` sees it: an id of a tenant
   * the scope does not see, and a name, are looked up within the scope's own tenant, so
   * another tenant's snapshot answers exactly as a missing one.
   * @throws DsecError NotFound.
   */
  get(ref: string, scope: Scope = SYSTEM_SCOPE): SnapshotRecord {
    const r = (SNAPSHOT_ID.test(ref)
      ? this.db.prepare('SELECT * FROM snapshots WHERE id = ?').get(ref)
      : this.db.prepare('SELECT * FROM snapshots WHERE tenant = ? AND name = ?').get(scope.tenant, ref)) as Row | undefined;
    return inScope(scope, r && decode(r), `snapshot ${ref} not found`);
  }

  /** The snapshots `scope` sees, oldest first. */
  all(scope: Scope = SYSTEM_SCOPE): SnapshotRecord[] {
    const rows = scope.all
      ? this.db.prepare('SELECT * FROM snapshots ORDER BY created_at, id').all()
      : this.db.prepare('SELECT * FROM snapshots WHERE tenant = ? ORDER BY created_at, id').all(scope.tenant);
    return (rows as Row[]).map(decode);
  }

  /** Records that a fork (or restore) `id` is about to create sandboxes labelled `dsec.fork=<id>`. */
  addForkIntent(id: string, snapshotId: string, count: number): void {
    this.db.prepare('INSERT INTO fork_intents (id, snapshot_id, count, created_at) VALUES (?, ?, ?, ?)').run(id, snapshotId, count, Date.now());
  }

  /** Commits a fork (all its sandboxes were created) or forgets a rolled-back one. Safe to call twice. */
  removeForkIntent(id: string): void {
    this.db.prepare('DELETE FROM fork_intents WHERE id = ?').run(id);
  }

  /** Forks that never committed (dsecd died during them): their sandboxes must be destroyed. */
  forkIntents(): string[] {
    return (this.db.prepare('SELECT id FROM fork_intents ORDER BY created_at').all() as { id: string }[]).map((r) => r.id);
  }

  /** Deletes a snapshot row. Safe to call twice. */
  remove(id: string): void {
    this.db.prepare('DELETE FROM snapshots WHERE id = ?').run(id);
  }
}
