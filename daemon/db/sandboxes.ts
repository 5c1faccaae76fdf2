/**
 * Typed access to the sandbox rows, uid ranges and events in the store. Every write
 * that changes a sandbox's state checks the state machine (daemon/model/state.ts).
 */
import { statementCache, type Db } from './db.js';
import type Database from 'better-sqlite3';
import type { Backend } from '../model/backend.js';
import type { SandboxEvent, SandboxRecord, SandboxSpec } from '../model/sandbox.js';
import type { NetworkSpec } from '../model/network.js';
import type { IoLimits } from '../model/resources.js';
import { assertTransition, type SandboxState } from '../model/state.js';
import { failedPrecondition, notFound, resourceExhausted } from '../errors.js';
import { SYSTEM_TENANT } from '../model/tenant.js';

/** A job's lease: while it is renewed, the job's sandboxes live; when it lapses they are paused, then destroyed. */
export interface Lease {
  /** The tenant whose job it is: leases are keyed on (tenant, job), so two tenants' job `a` are two leases. */
  tenant: string;
  job: string;
  ttl_s: number;
  /** ms since the epoch; a renewal at or after it is refused. */
  expires_at: number;
  /** ms since the epoch when the reaper paused the job, or null while active. */
  lapsed_at: number | null;
  created_at: number;
}

interface Row {
  id: string; backend: string; image: string; image_layers: string; image_config: string; state: string;
  desired: string | null; acknowledged: number; cpus: number; memory_bytes: number; pids: number;
  labels: string; env: string; ttl_s: number | null; created_at: number; updated_at: number;
  init_pid: number | null; init_start: number | null; uid_base: number | null; uid_count: number | null; error: string | null;
  priority: string; idle_timeout_s: number | null; last_active_at: number | null; snapshot_id: string | null; seccomp: string | null;
  network: string | null; disk_bytes: number | null; filesystem: string | null; io: string | null; tenant: string;
}

function decode(r: Row): SandboxRecord {
  return {
    id: r.id,
    tenant: r.tenant,
    backend: r.backend as Backend,
    image: r.image,
    imageLayers: JSON.parse(r.image_layers),
    imageConfig: JSON.parse(r.image_config),
    state: r.state as SandboxState,
    desired: r.desired as SandboxState | null,
    acknowledged: r.acknowledged === 1,
    cpus: r.cpus,
    memoryBytes: r.memory_bytes,
    pids: r.pids,
    labels: JSON.parse(r.labels),
    env: JSON.parse(r.env),
    ttlS: r.ttl_s,
    createdAt: r.created_at,
    updatedAt: r.updated_at,
    initPid: r.init_pid,
    initStart: r.init_start,
    uidBase: r.uid_base,
    uidCount: r.uid_count,
    error: r.error,
    priority: r.priority === 'batch' ? 'batch' : 'latency',
    idleTimeoutS: r.idle_timeout_s,
    lastActiveAt: r.last_active_at,
    snapshotId: r.snapshot_id,
    seccomp: r.seccomp ? JSON.parse(r.seccomp) : null,
    network: r.network ? JSON.parse(r.network) : null,
    diskBytes: r.disk_bytes,
    filesystem: r.filesystem ? JSON.parse(r.filesystem) : null,
    io: r.io ? JSON.parse(r.io) : null,
  };
}

/** A lease's key. */
export interface LeaseKey {
  tenant: string;
  job: string;
}

/** Listeners for newly recorded events (the events API follows them). */
export type EventListener = (e: SandboxEvent) => void;

/** Store access for sandboxes. Synchronous (better-sqlite3); each method is one transaction. */
export class SandboxRepo {
  private readonly listeners = new Set<EventListener>();
  /** Bases in use, mirrored from uid_ranges so allocation is O(1) amortised. */
  private readonly usedBases = new Set<number>();
  private nextIndex = 0;
  /**
   * Prepared statements by SQL text: preparing compiles the SQL, and the profile of a
   * 1,000-create burst had it at 2.6% of dsecd's CPU when every call prepared afresh.
   */
  private readonly stmt: (sql: string) => Database.Statement;

  constructor(
    readonly db: Db,
    /** Uid pool: first host uid, number of host uids, uids per sandbox. */
    readonly pool: { base: number; size: number; rangeSize: number },
  ) {
    this.stmt = statementCache(db);
    for (const r of db.prepare('SELECT base FROM uid_ranges').all() as { base: number }[]) this.usedBases.add(r.base);
  }

  /**
   * Totals over the sandboxes that count against admission (every row but warm-pool
   * shells, whose labels hold `dsec.pool`): count, sum of memory limits (bytes), of CPU
   * limits (cores, to 1/1000) and of the writable-layer quotas of container sandboxes
   * (bytes; the other tiers' disks are files on the host filesystem, not in the store).
   * Read from `admission_totals`, which triggers keep in step with every insert, delete
   * and change of the columns involved (migration 11): O(tenants), not O(sandboxes).
   * @param tenant only that tenant's sandboxes (per-tenant quotas); absent: the whole host's.
   */
  admissionTotals(tenant?: string): { count: number; memoryBytes: number; cpus: number; diskBytes: number } {
    const r = (tenant === undefined
      ? this.stmt('SELECT COALESCE(SUM(n), 0) n, COALESCE(SUM(mem), 0) mem, COALESCE(SUM(mcpus), 0) mcpus, COALESCE(SUM(disk), 0) disk FROM admission_totals').get()
      : this.stmt('SELECT n, mem, mcpus, disk FROM admission_totals WHERE tenant = ?').get(tenant)) as { n: number; mem: number; mcpus: number; disk: number } | undefined;
    return r ? { count: r.n, memoryBytes: r.mem, cpus: r.mcpus / 1000, diskBytes: r.disk } : { count: 0, memoryBytes: 0, cpus: 0, diskBytes: 0 };
  }

  /** Sandboxes whose id does not begin with `tag` (made before this host joined a fleet; daemon/fleet/layout.ts). */
  countUntagged(tag: string): number {
    return (this.stmt('SELECT COUNT(*) n FROM sandboxes WHERE substr(id, 1, 6) != ?').get(tag) as { n: number }).n;
  }

  /** Sandboxes per value of their `job` label, the `limit` largest jobs (a fleet host's `live` record, daemon/fleet/). */
  jobCounts(limit = 256): Record<string, number> {
    const rows = this.stmt(`SELECT json_extract(labels, '$.job') job, COUNT(*) n FROM sandboxes
      WHERE json_extract(labels, '$.job') IS NOT NULL GROUP BY job ORDER BY n DESC LIMIT ?`).all(limit) as { job: string; n: number }[];
    return Object.fromEntries(rows.map((r) => [String(r.job), r.n]));
  }

  /**
   * The writable-layer quota (`disk_bytes`) of every container sandbox that has one,
   * warm-pool shells included (they hold store entries too): for the pool guard and the
   * sum of quotas host info shows. Two columns, not whole rows.
   */
  diskQuotas(): Map<string, number> {
    const rows = this.stmt(`SELECT id, disk_bytes d FROM sandboxes WHERE backend = 'container' AND disk_bytes IS NOT NULL`).all() as { id: string; d: number }[];
    return new Map(rows.map((r) => [r.id, r.d]));
  }

  /** Distinct layer digests of every row (any state), computed by SQLite over the stored JSON arrays. */
  layerDigests(): string[] {
    return (this.stmt('SELECT DISTINCT j.value d FROM sandboxes, json_each(sandboxes.image_layers) j').all() as { d: string }[]).map((r) => r.d);
  }

  /**
   * Whether sandbox `id` is running its init `initPid` with no operation acting on it
   * (state `running`, no desired state): one indexed row, three columns, nothing decoded.
   * The fncall pool asks before every call (daemon/fncall/pool.ts).
   */
  isRunningWith(id: string, initPid: number | null): boolean {
    const r = this.stmt('SELECT state, desired, init_pid p FROM sandboxes WHERE id = ?').get(id) as { state: string; desired: string | null; p: number | null } | undefined;
    return !!r && r.state === 'running' && r.desired === null && r.p !== null && r.p === initPid;
  }

  /**
   * The recorded init of every running sandbox no operation is acting on (state
   * `running`, no desired state, an init pid): id, backend, pid and start time (clock
   * ticks, field 22 of /proc/PID/stat). Three columns, not whole rows: the liveness sweep
   * reads it every few seconds, at any number of sandboxes.
   */
  runningInits(): { id: string; backend: Backend; initPid: number; initStart: number }[] {
    return this.stmt(`SELECT id, backend, init_pid initPid, init_start initStart FROM sandboxes
      WHERE state = 'running' AND desired IS NULL AND init_pid IS NOT NULL AND init_start IS NOT NULL`).all() as { id: string; backend: Backend; initPid: number; initStart: number }[];
  }

  /**
   * Running sandboxes by id and backend (for the limit counters sweep), without decoding
   * whole rows.
   */
  runningIds(): { id: string; backend: Backend; createdAt: number; memoryBytes: number; pids: number }[] {
    return this.stmt(`SELECT id, backend, created_at createdAt, memory_bytes memoryBytes, pids FROM sandboxes WHERE state = 'running'`)
      .all() as { id: string; backend: Backend; createdAt: number; memoryBytes: number; pids: number }[];
  }

  /**
   * Running and paused sandboxes with no transition under way (desired state null), by id,
   * backend and state: the candidates of host reclaim (daemon/host/memory/), read every few
   * seconds without decoding whole rows.
   */
  settledLive(): { id: string; backend: Backend; state: 'running' | 'paused' }[] {
    return this.stmt(`SELECT id, backend, state FROM sandboxes WHERE state IN ('running', 'paused') AND desired IS NULL`)
      .all() as { id: string; backend: Backend; state: 'running' | 'paused' }[];
  }

  /** Number of ranges in the pool. */
  get poolRanges(): number {
    return Math.floor(this.pool.size / this.pool.rangeSize);
  }

  /** Ranges currently allocated. */
  get rangesInUse(): number {
    return this.usedBases.size;
  }

  /** @throws DsecError NotFound when no row has this id. */
  get(id: string): SandboxRecord {
    const r = this.find(id);
    if (!r) throw notFound(`sandbox ${id} not found`);
    return r;
  }

  /** The row, or undefined. */
  find(id: string): SandboxRecord | undefined {
    const r = this.stmt('SELECT * FROM sandboxes WHERE id = ?').get(id) as Row | undefined;
    return r && decode(r);
  }

  /** All rows, oldest first. */
  all(): SandboxRecord[] {
    return (this.stmt('SELECT * FROM sandboxes ORDER BY created_at, id').all() as Row[]).map(decode);
  }

  /** Ids of acknowledged sandboxes whose TTL has passed at `now` (ms), not already being destroyed. */
  expired(now: number): string[] {
    return (this.db
      .prepare(`SELECT id FROM sandboxes WHERE ttl_s IS NOT NULL AND acknowledged = 1 AND (desired IS NULL OR desired != 'destroyed')
                AND created_at + ttl_s * 1000 <= ? ORDER BY created_at`)
      .all(now) as { id: string }[]).map((r) => r.id);
  }

  /** Records exec activity (resets the idle timer). */
  touchActive(id: string, now = Date.now()): void {
    this.stmt('UPDATE sandboxes SET last_active_at = ? WHERE id = ?').run(now, id);
  }

  /** Running sandboxes whose idle timeout has passed at `now`. */
  idleDue(now: number): string[] {
    return (this.db
      .prepare(`SELECT id FROM sandboxes WHERE state = 'running' AND desired IS NULL AND idle_timeout_s IS NOT NULL
                AND COALESCE(last_active_at, created_at) + idle_timeout_s * 1000 <= ?`)
      .all(now) as { id: string }[]).map((r) => r.id);
  }

  /**
   * Makes a warm-pool shell the sandbox a create asked for (daemon/sandbox/warm-pool.ts),
   * in one update: the request's labels (which drop the pool label), env, TTL, idle
   * timeout, limits and network, and `created_at` now, so TTLs and listings count from
   * the claim. @throws DsecError NotFound.
   */
  claimShell(id: string, c: { tenant: string; labels: Record<string, string>; env: Record<string, string>; ttlS: number | null; idleTimeoutS: number | null;
    cpus: number; memoryBytes: number; pids: number; network: NetworkSpec | null; io: IoLimits | null; now: number }): SandboxRecord {
    const r = this.stmt(`UPDATE sandboxes SET tenant = ?, labels = ?, env = ?, ttl_s = ?, idle_timeout_s = ?, cpus = ?, memory_bytes = ?, pids = ?, network = ?, io = ?,
        created_at = ?, updated_at = ?, last_active_at = NULL WHERE id = ?`)
      .run(c.tenant, JSON.stringify(c.labels), JSON.stringify(c.env), c.ttlS, c.idleTimeoutS, c.cpus, c.memoryBytes, c.pids, c.network ? JSON.stringify(c.network) : null,
        c.io ? JSON.stringify(c.io) : null, c.now, c.now, id);
    if (r.changes !== 1) throw notFound(`sandbox ${id} not found`);
    return this.get(id);
  }

  /** Sets the TTL (seconds from creation; null removes it). */
  setTtl(id: string, ttlS: number | null): SandboxRecord {
    this.stmt('UPDATE sandboxes SET ttl_s = ?, updated_at = ? WHERE id = ?').run(ttlS, Date.now(), id);
    return this.get(id);
  }

  /** Stores a sandbox's (settled) network, or null for mode none. @throws DsecError NotFound. */
  setNetwork(id: string, network: NetworkSpec | null): SandboxRecord {
    this.get(id);
    this.stmt('UPDATE sandboxes SET network = ?, updated_at = ? WHERE id = ?').run(network ? JSON.stringify(network) : null, Date.now(), id);
    return this.get(id);
  }

  /**
   * Creates the lease of `job` of `tenant`, or renews it. The rule that makes a renewal
   * racing the expiry come out one way: a renewal is accepted only if it runs strictly
   * before `expires_at` and the lease has not lapsed; otherwise it is refused, whether or
   * not the reaper has swept yet. A lapsed lease must be deleted and created again.
   * @returns the lease, and whether it was created.
   * @throws DsecError FailedPrecondition when the lease expired or lapsed; NotFound (mode renew) when there is none.
   */
  putLease(tenant: string, job: string, ttlS: number, now = Date.now(), mode: 'create-or-renew' | 'renew' = 'create-or-renew'): { lease: Lease; created: boolean } {
    return this.db.transaction(() => {
      const cur = this.lease(tenant, job);
      if (!cur) {
        if (mode === 'renew') throw notFound(`no lease for job ${job}`);
        this.stmt('INSERT INTO leases (tenant, job, ttl_s, expires_at, lapsed_at, created_at) VALUES (?, ?, ?, ?, NULL, ?)').run(tenant, job, ttlS, now + ttlS * 1000, now);
        return { lease: this.lease(tenant, job)!, created: true };
      }
      if (cur.lapsed_at !== null || now >= cur.expires_at) {
        throw failedPrecondition(`lease of job ${job} expired at ${new Date(cur.expires_at).toISOString()}; its sandboxes are being reclaimed. Delete the lease and create a new one`);
      }
      this.stmt('UPDATE leases SET ttl_s = ?, expires_at = ? WHERE tenant = ? AND job = ?').run(ttlS, now + ttlS * 1000, tenant, job);
      return { lease: this.lease(tenant, job)!, created: false };
    })();
  }

  /** The lease of `job` of `tenant`, or undefined. */
  lease(tenant: string, job: string): Lease | undefined {
    return this.stmt('SELECT * FROM leases WHERE tenant = ? AND job = ?').get(tenant, job) as Lease | undefined;
  }

  /** The leases of `tenant` (every tenant's when null), by tenant and job. */
  leases(tenant: string | null): Lease[] {
    return tenant === null
      ? this.stmt('SELECT * FROM leases ORDER BY tenant, job').all() as Lease[]
      : this.stmt('SELECT * FROM leases WHERE tenant = ? ORDER BY job').all(tenant) as Lease[];
  }

  /** Deletes the lease of `job` of `tenant`. @returns whether one existed. */
  deleteLease(tenant: string, job: string): boolean {
    return this.stmt('DELETE FROM leases WHERE tenant = ? AND job = ?').run(tenant, job).changes > 0;
  }

  /** Marks every active lease whose expiry passed as lapsed (one transaction); returns their keys. */
  lapseDue(now: number): LeaseKey[] {
    return this.stmt('UPDATE leases SET lapsed_at = ? WHERE lapsed_at IS NULL AND expires_at <= ? RETURNING tenant, job').all(now, now) as LeaseKey[];
  }

  /** Leases that lapsed at or before `cutoff` (ms). */
  lapsedBefore(cutoff: number): LeaseKey[] {
    return this.stmt('SELECT tenant, job FROM leases WHERE lapsed_at IS NOT NULL AND lapsed_at <= ?').all(cutoff) as LeaseKey[];
  }

  /** Leases that lapsed (their sandboxes paused, not yet destroyed). */
  lapsedJobs(): LeaseKey[] {
    return this.stmt('SELECT tenant, job FROM leases WHERE lapsed_at IS NOT NULL').all() as LeaseKey[];
  }

  /** Counts by state. */
  countByState(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const r of this.stmt('SELECT state, COUNT(*) n FROM sandboxes GROUP BY state').all() as { state: string; n: number }[]) {
      out[r.state] = r.n;
    }
    return out;
  }

  /**
   * Records the intent to create sandbox `rec.id` of the resolved spec `rec`: inserts the
   * row in state `creating` (desired running, not acknowledged) and allocates a uid range,
   * in one transaction, before anything is done on the host.
   * @param rec the spec, the new id and the creation time (ms since the epoch).
   * @throws DsecError ResourceExhausted when the uid pool has no free range.
   */
  insertCreating(rec: SandboxSpec & { id: string; createdAt: number }): SandboxRecord {
    const base = this.pickBase();
    const now = rec.createdAt;
    this.db.transaction(() => {
      this.stmt(
        `INSERT INTO sandboxes (id, backend, image, image_layers, image_config, state, desired, acknowledged, cpus, memory_bytes, pids,
           labels, env, ttl_s, created_at, updated_at, uid_base, uid_count, priority, idle_timeout_s, snapshot_id, seccomp, network, disk_bytes, filesystem, io, tenant)
         VALUES (?, ?, ?, ?, ?, 'creating', 'running', 0, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
      ).run(rec.id, rec.backend, rec.image, JSON.stringify(rec.imageLayers), JSON.stringify(rec.imageConfig), rec.cpus,
        rec.memoryBytes, rec.pids, JSON.stringify(rec.labels), JSON.stringify(rec.env), rec.ttlS, now, now, base, this.pool.rangeSize,
        rec.priority, rec.idleTimeoutS, rec.snapshotId ?? null, rec.seccomp ? JSON.stringify(rec.seccomp) : null,
        rec.network ? JSON.stringify(rec.network) : null, rec.diskBytes ?? null, rec.filesystem ? JSON.stringify(rec.filesystem) : null,
        rec.io ? JSON.stringify(rec.io) : null, rec.tenant);
      this.stmt('INSERT INTO uid_ranges (base, sandbox_id) VALUES (?, ?)').run(base, rec.id);
    })();
    this.usedBases.add(base);
    return this.get(rec.id);
  }

  private pickBase(): number {
    const n = this.poolRanges;
    if (this.usedBases.size >= n) {
      throw resourceExhausted(`uid pool exhausted: all ${n} ranges of ${this.pool.rangeSize} ids are in use; destroy sandboxes or enlarge uid_pool.size`);
    }
    for (let i = 0; i < n; i++) {
      const idx = (this.nextIndex + i) % n;
      const base = this.pool.base + idx * this.pool.rangeSize;
      if (!this.usedBases.has(base)) {
        this.nextIndex = (idx + 1) % n;
        return base;
      }
    }
    throw resourceExhausted('uid pool exhausted');
  }

  /**
   * Moves a sandbox to `to` (checked by the state machine), clears `desired`, and sets
   * the extra columns given. `acknowledged` becomes 1 when `to` is reached from creating.
   * @throws DsecError FailedPrecondition for an illegal transition, NotFound for an unknown id.
   */
  transition(id: string, to: SandboxState, extra: { initPid?: number | null; initStart?: number | null; error?: string | null } = {}): SandboxRecord {
    const cur = this.get(id);
    if (cur.state !== to) assertTransition(id, cur.state, to);
    const now = Date.now();
    this.stmt(
      `UPDATE sandboxes SET state = ?, desired = NULL, updated_at = ?, acknowledged = 1,
           init_pid = ?, init_start = ?, error = ? WHERE id = ?`,
    )
      .run(to, now, extra.initPid !== undefined ? extra.initPid : cur.initPid, extra.initStart !== undefined ? extra.initStart : cur.initStart,
        extra.error !== undefined ? extra.error : cur.error, id);
    return this.get(id);
  }

  /** Records the intent to move to `desired` (durably, before acting). */
  setDesired(id: string, desired: SandboxState | null): void {
    this.stmt('UPDATE sandboxes SET desired = ?, updated_at = ? WHERE id = ?').run(desired, Date.now(), id);
  }

  /** Records the init pid and its start time while a transition is in flight. */
  setInit(id: string, initPid: number | null, initStart: number | null): void {
    this.stmt('UPDATE sandboxes SET init_pid = ?, init_start = ? WHERE id = ?').run(initPid, initStart, id);
  }

  /** Deletes the row and frees its uid range, in one transaction. Safe to call twice. */
  remove(id: string): void {
    const row = this.stmt('SELECT base FROM uid_ranges WHERE sandbox_id = ?').get(id) as { base: number } | undefined;
    this.db.transaction(() => {
      this.stmt('DELETE FROM uid_ranges WHERE sandbox_id = ?').run(id);
      this.stmt('DELETE FROM sandboxes WHERE id = ?').run(id);
    })();
    if (row) this.usedBases.delete(row.base);
  }

  /** Frees uid ranges whose sandbox row no longer exists (after a crash between steps). */
  freeOrphanRanges(): number {
    const orphans = this.db
      .prepare('SELECT base FROM uid_ranges WHERE sandbox_id NOT IN (SELECT id FROM sandboxes)')
      .all() as { base: number }[];
    this.stmt('DELETE FROM uid_ranges WHERE sandbox_id NOT IN (SELECT id FROM sandboxes)').run();
    for (const o of orphans) this.usedBases.delete(o.base);
    return orphans.length;
  }

  /**
   * Appends an event and notifies listeners.
   * @param tenant the event's tenant when it has no sandbox (a lease's); default `system`. With a sandbox, the sandbox's.
   */
  event(type: string, sandbox: SandboxRecord | null, message?: string, tenant = SYSTEM_TENANT): SandboxEvent {
    const e: SandboxEvent = {
      time: Date.now(),
      type,
      sandbox_id: sandbox?.id ?? null,
      tenant: sandbox?.tenant ?? tenant,
      ...(sandbox ? { state: sandbox.state, labels: sandbox.labels } : {}),
      ...(message ? { message } : {}),
    };
    this.stmt('INSERT INTO events (time, type, sandbox_id, tenant, state, labels, message) VALUES (?, ?, ?, ?, ?, ?, ?)')
      .run(e.time, e.type, e.sandbox_id, e.tenant, e.state ?? null, e.labels ? JSON.stringify(e.labels) : null, e.message ?? null);
    for (const l of this.listeners) l(e);
    return e;
  }

  /** Events at or after `since` (ms), oldest first, at most `limit`. */
  events(since = 0, limit = 10_000): SandboxEvent[] {
    const rows = this.db
      .prepare('SELECT time, type, sandbox_id, tenant, state, labels, message FROM events WHERE time >= ? ORDER BY seq LIMIT ?')
      .all(since, limit) as { time: number; type: string; sandbox_id: string | null; tenant: string; state: string | null; labels: string | null; message: string | null }[];
    return rows.map((r) => ({
      time: r.time,
      type: r.type,
      sandbox_id: r.sandbox_id,
      tenant: r.tenant,
      ...(r.state ? { state: r.state as SandboxState } : {}),
      ...(r.labels ? { labels: JSON.parse(r.labels) } : {}),
      ...(r.message ? { message: r.message } : {}),
    }));
  }

  /** Deletes all but the newest `keep` events, and (when `before` is given) events older than `before` (ms). Returns how many were deleted. */
  pruneEvents(keep: number, before?: number): number {
    let n = this.stmt('DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - ?').run(keep).changes;
    if (before !== undefined) n += this.stmt('DELETE FROM events WHERE time < ?').run(before).changes;
    return n;
  }

  /** Subscribes to new events; returns the unsubscribe function. */
  onEvent(l: EventListener): () => void {
    this.listeners.add(l);
    return () => this.listeners.delete(l);
  }
}
