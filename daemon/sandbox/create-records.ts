/**
 * What dsecd remembers about creates (sandbox create, restore, fork) beyond the sandboxes
 * themselves, durable in SQLite:
 *
 * - **Idempotency keys.** A create carrying an `Idempotency-Key` request header (the IETF
 *   httpapi draft's name, as Stripe uses it) is run once per (tenant, key): a retry with
 *   the same key and the same request answers the first create's result again (marked by
 *   the response header `Idempotent-Replayed: true`); a retry while the first is still
 *   running waits for it; the same key with a different request is refused
 *   (InvalidArgument). A key is kept for `keyTtlMs` (default 24 h) after its create
 *   succeeded; a create that failed leaves no key, so its retry runs again.
 * - **Acknowledgements.** A create is *acknowledged* when its answer naming the sandboxes
 *   was delivered: on a direct call, when dsecd wrote the whole answer (the 201 body, or
 *   the stream's `result` line and its end) to the caller's connection without error; on
 *   a call relayed by a gateway that asked to confirm (`x-dsec-create-ack: gateway`),
 *   when that gateway reports it wrote the answer whole to its client
 *   (`POST /v1/sandboxes:ack`); or when any later call names the sandbox (its caller
 *   knows it). Until then the sandboxes are *held*: a sandbox still held
 *   `ackTimeoutMs` (default 60 s) after its create finished is destroyed, and its key
 *   forgotten, so no sandbox lives that no caller was told of. A replayed answer that is
 *   delivered acknowledges a held sandbox too; one that is acknowledged is never held
 *   again.
 *
 * The tables are this module's and are made here (`CREATE TABLE IF NOT EXISTS`), apart
 * from the versioned migrations of the sandbox store: they hold nothing a migration
 * would need to carry.
 */
import { createHash } from 'node:crypto';
import type Database from 'better-sqlite3';
import { statementCache, type Db } from '../db/db.js';
import { invalidArgument, isDsecError } from '../errors.js';

/** The request header that names a create's idempotency key. */
export const IDEMPOTENCY_HEADER = 'idempotency-key';
/** The response header set on an answer that is a replay of an earlier create. */
export const REPLAYED_HEADER = 'idempotent-replayed';
/** The header by which a gateway asks to confirm delivery itself (trusted from gateway certificates only). */
export const ACK_HEADER = 'x-dsec-create-ack';
/** A key: 1 to 255 visible ASCII characters (a UUID, or any client-chosen text). */
export const KEY_RE = /^[\x21-\x7e]{1,255}$/;

/** The sandbox ids (16 hex) in a create's answer: one sandbox, or `{sandboxes:[...]}` of a fork. */
export function idsOf(result: unknown): string[] {
  const rows = Array.isArray((result as { sandboxes?: unknown })?.sandboxes) ? (result as { sandboxes: unknown[] }).sandboxes : [result];
  return rows.map((r) => (r as { id?: unknown })?.id).filter((x): x is string => typeof x === 'string' && /^[0-9a-f]{16}$/.test(x));
}

/**
 * The idempotency key of each sandbox of a batched create (POST /v1/sandboxes:batch) of
 * `n`: `keys` when given, else
 * `header/i`, else none.
 * @throws DsecError InvalidArgument for both at once, a malformed header, or a header too
 *   long to derive a key from (a derived key is at most 255 characters, as any key).
 */
export function itemKeys(header: unknown, keys: string[] | undefined, n: number): Array<string | null> {
  if (header === undefined) return keys ?? Array.from({ length: n }, () => null);
  if (keys !== undefined) throw invalidArgument(`give the ${IDEMPOTENCY_HEADER} header or body keys, not both`);
  if (typeof header !== 'string' || !KEY_RE.test(header) || !KEY_RE.test(`${header}/${n - 1}`)) {
    throw invalidArgument(`${IDEMPOTENCY_HEADER} must be visible ASCII characters, short enough that "KEY/${n - 1}" is at most 255 characters`);
  }
  return Array.from({ length: n }, (_, i) => `${header}/${i}`);
}

/** Settings; see the module comment for what each number means. */
export interface CreateRecordsOptions {
  keyTtlMs: number;
  ackTimeoutMs: number;
  now?: () => number;
}

/** The durable record of keys and held sandboxes; see the module comment. */
export class CreateRecords {
  private readonly inFlight = new Map<string, { fingerprint: string; done: Promise<unknown> }>();
  /** The held ids, mirrored in memory so that {@link used} costs no store read. */
  private readonly heldIds = new Set<string>();
  private readonly now: () => number;
  /** The prepared statement of an SQL text, compiled once (every create runs several). */
  private readonly stmt: (sql: string) => Database.Statement;

  constructor(private readonly db: Db, private readonly opts: CreateRecordsOptions) {
    this.now = opts.now ?? Date.now;
    this.stmt = statementCache(db);
    db.exec(`
      CREATE TABLE IF NOT EXISTS idempotency_keys (
        tenant      TEXT NOT NULL,
        key         TEXT NOT NULL,
        fingerprint TEXT NOT NULL,              -- sha256 of method, path and body
        result      TEXT NOT NULL,              -- JSON answer of the create
        created_at  INTEGER NOT NULL,           -- ms since epoch
        expires_at  INTEGER NOT NULL,
        PRIMARY KEY (tenant, key)
      );
      CREATE TABLE IF NOT EXISTS create_holds (
        sandbox_id  TEXT PRIMARY KEY,
        tenant      TEXT,
        key         TEXT,                       -- the idempotency key that made it, else NULL
        deadline    INTEGER NOT NULL            -- ms since epoch: destroyed after this unless acknowledged
      );
    `);
    for (const r of db.prepare('SELECT sandbox_id FROM create_holds').all() as Array<{ sandbox_id: string }>) this.heldIds.add(r.sandbox_id);
  }

  /** A call named sandbox `id` (its caller knows it): acknowledges it if held. */
  used(id: string): void {
    if (this.heldIds.has(id)) this.ack([id]);
  }

  /** The fingerprint of a request: method, path (without query) and body. */
  static fingerprint(method: string, path: string, body: unknown): string {
    return createHash('sha256').update(`${method} ${path.split('?')[0]}\n${JSON.stringify(body ?? null)}`).digest('hex');
  }

  /**
   * Runs `fn` once per (tenant, key); see the module comment.
   * @returns the result and whether it was a replay
   * @throws DsecError InvalidArgument when the key is malformed or was used for another
   *   request; whatever `fn` throws (then no key is kept).
   */
  async once<T>(tenant: string, key: string, fingerprint: string, fn: () => Promise<T>): Promise<{ result: T; replayed: boolean }> {
    if (!KEY_RE.test(key)) throw invalidArgument(`${IDEMPOTENCY_HEADER} must be 1 to 255 visible ASCII characters`);
    const id = `${tenant}\0${key}`;
    const mismatch = () => invalidArgument(`${IDEMPOTENCY_HEADER} "${key}" was used for a different request; use a fresh key per logical create`);
    const running = this.inFlight.get(id);
    if (running) {
      if (running.fingerprint !== fingerprint) throw mismatch();
      return { result: (await running.done) as T, replayed: true };
    }
    const row = this.stmt('SELECT fingerprint, result FROM idempotency_keys WHERE tenant = ? AND key = ? AND expires_at > ?').get(tenant, key, this.now()) as { fingerprint: string; result: string } | undefined;
    if (row) {
      if (row.fingerprint !== fingerprint) throw mismatch();
      return { result: JSON.parse(row.result) as T, replayed: true };
    }
    const done = fn();
    this.inFlight.set(id, { fingerprint, done });
    try {
      const result = await done;
      const t = this.now();
      this.stmt('INSERT OR REPLACE INTO idempotency_keys (tenant, key, fingerprint, result, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)')
        .run(tenant, key, fingerprint, JSON.stringify(result), t, t + this.opts.keyTtlMs);
      return { result, replayed: false };
    } finally {
      this.inFlight.delete(id);
    }
  }

  /**
   * Holds sandboxes until their create is acknowledged. With `again` (a replayed answer)
   * only sandboxes still held get a new deadline: an acknowledged one stays so.
   */
  hold(ids: string[], tenant: string | null, key: string | null, again = false): void {
    const deadline = this.now() + this.opts.ackTimeoutMs;
    const stmt = again
      ? this.stmt('UPDATE create_holds SET deadline = ? WHERE sandbox_id = ?')
      : this.stmt('INSERT OR REPLACE INTO create_holds (deadline, sandbox_id, tenant, key) VALUES (?, ?, ?, ?)');
    this.db.transaction(() => {
      for (const id of ids) {
        if (again) stmt.run(deadline, id);
        else {
          stmt.run(deadline, id, tenant, key);
          this.heldIds.add(id);
        }
      }
    })();
  }

  /** Acknowledges sandboxes: they are no longer held. @returns how many were held. */
  ack(ids: string[]): number {
    const stmt = this.stmt('DELETE FROM create_holds WHERE sandbox_id = ?');
    let n = 0;
    this.db.transaction(() => {
      for (const id of ids) n += stmt.run(id).changes;
    })();
    for (const id of ids) this.heldIds.delete(id);
    return n;
  }

  /** How many sandboxes are held now (GET /v1/host `creates.held`). */
  held(): number {
    return (this.stmt('SELECT count(*) AS n FROM create_holds').get() as { n: number }).n;
  }

  /** The held sandboxes whose deadline passed: the caller destroys each, then calls {@link reaped}. */
  overdue(): string[] {
    return (this.stmt('SELECT sandbox_id FROM create_holds WHERE deadline <= ?').all(this.now()) as Array<{ sandbox_id: string }>).map((r) => r.sandbox_id);
  }

  /**
   * Forgets a held sandbox that was destroyed, and the key that made it (a retry of that
   * key creates afresh). Done after the destroy, so a crash between the two destroys it
   * again at the next start.
   */
  reaped(id: string): void {
    this.db.transaction(() => {
      const r = this.stmt('SELECT tenant, key FROM create_holds WHERE sandbox_id = ?').get(id) as { tenant: string | null; key: string | null } | undefined;
      this.stmt('DELETE FROM create_holds WHERE sandbox_id = ?').run(id);
      if (r?.key) this.stmt('DELETE FROM idempotency_keys WHERE tenant = ? AND key = ?').run(r.tenant, r.key);
    })();
    this.heldIds.delete(id);
  }

  /** Forgets keys past their expiry. @returns how many. */
  expireKeys(): number {
    return this.stmt('DELETE FROM idempotency_keys WHERE expires_at <= ?').run(this.now()).changes;
  }
}

/** Sweep interval of {@link startHoldReaper}: 1 s, so a held sandbox outlives its deadline by at most ~1 s. */
export const HOLD_SWEEP_MS = 1000;

/**
 * Destroys held sandboxes past their deadline every {@link HOLD_SWEEP_MS} and forgets
 * expired keys every minute. Holds are read from the store, so a restart loses none: a
 * deadline that passed while dsecd was down fires on the first sweep.
 * @returns a function that stops the sweeps.
 */
export function startHoldReaper(records: CreateRecords, destroy: (id: string) => Promise<unknown>, log: { info(o: object, m: string): void; warn(o: object, m: string): void }): () => void {
  let sweeps = 0;
  let running = false;
  const sweep = async () => {
    if (running) return;
    running = true;
    try {
      if (++sweeps % 60 === 1) records.expireKeys();
      for (const id of records.overdue()) {
        try {
          await destroy(id);
          records.reaped(id);
          log.info({ sandbox: id }, 'destroyed a sandbox whose create was never acknowledged');
        } catch (e) {
          if (isDsecError(e, 'NotFound')) records.reaped(id);
          else log.warn({ sandbox: id, err: e }, 'destroying an unacknowledged sandbox failed; trying again at the next sweep');
        }
      }
    } finally {
      running = false;
    }
  };
  const timer = setInterval(() => void sweep(), HOLD_SWEEP_MS);
  timer.unref();
  return () => clearInterval(timer);
}
