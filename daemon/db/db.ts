/**
 * The durable record of intent: one SQLite database (WAL) under the instance root.
 *
 * The kernel (cgroups, mounts, runtime state) is the truth about what exists; this
 * store records what dsecd meant to do, written before it acts, so a restart can finish
 * or undo every half-done step (daemon/sandbox/reconcile.ts).
 */
import Database from 'better-sqlite3';
import { MIGRATIONS, type Migration } from './migrations.js';
import { internal } from '../errors.js';

/** An open store. `db` is the better-sqlite3 handle; all access is synchronous. */
export type Db = Database.Database;

/**
 * A function that returns the prepared statement of an SQL text, compiling each text once
 * (better-sqlite3's `prepare` parses and plans the SQL on every call: tens of µs, paid per
 * create on the hot paths that use this).
 */
export function statementCache(db: Db): (sql: string) => Database.Statement {
  const stmts = new Map<string, Database.Statement>();
  return (sql) => {
    let st = stmts.get(sql);
    if (!st) {
      st = db.prepare(sql);
      stmts.set(sql, st);
    }
    return st;
  };
}

/**
 * Opens (creating if needed) the database at `file` and applies pending migrations.
 * `synchronous=NORMAL` under WAL is durable across a process crash (SIGKILL), which is
 * the failure dsecd must survive; only an OS crash may lose the last transactions.
 * @throws DsecError Internal when the database is newer than this binary knows.
 */
export function openDb(file: string, migrations: readonly Migration[] = MIGRATIONS): Db {
  const db = new Database(file);
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = NORMAL');
  db.pragma('foreign_keys = ON');
  db.pragma('busy_timeout = 5000');
  migrate(db, migrations);
  return db;
}

/**
 * Applies every migration above the database's user_version, each in its own
 * transaction with its version bump, in order.
 * @returns the versions applied.
 * @throws DsecError Internal when user_version is above the last known migration.
 */
export function migrate(db: Db, migrations: readonly Migration[] = MIGRATIONS): number[] {
  const current = db.pragma('user_version', { simple: true }) as number;
  const latest = migrations.length ? migrations[migrations.length - 1].version : 0;
  if (current > latest) {
    throw internal(`store schema version ${current} is newer than this dsecd knows (${latest}); upgrade dsec`);
  }
  const applied: number[] = [];
  for (const m of migrations) {
    if (m.version <= current) continue;
    db.transaction(() => {
      db.exec(m.sql);
      db.pragma(`user_version = ${m.version}`);
    })();
    applied.push(m.version);
  }
  return applied;
}
