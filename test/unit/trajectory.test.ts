import { describe, expect, it } from 'vitest';
import Database from 'better-sqlite3';
import { openDb } from '../../daemon/db/db.js';
import { migrate } from '../../daemon/db/db.js';
import { MIGRATIONS } from '../../daemon/db/migrations.js';
import { canonicalRequest, TrajectoryLog, trajectoryKey } from '../../daemon/sandbox/trajectory.js';
import type { ExecResult } from '../../daemon/model/exec.js';

const result = (out: string, exit = 0): ExecResult => ({
  exit_code: exit, signal: null, stdout_b64: Buffer.from(out).toString('base64'), stderr_b64: '', stdout_truncated: false,
  stderr_truncated: false, duration_ms: 1.5, oom: false, timed_out: false,
});
const req = (cmd: string) => ({ argv: ['sh', '-c', cmd] });
const fresh = () => new TrajectoryLog(openDb(':memory:'), 'host-a');

/** Runs a step to completion through the log, as the manager does. */
function run(log: TrajectoryLog, t: string, step: number, cmd: string, out = cmd, truncate = false) {
  const d = log.begin(t, step, 'sb1', req(cmd), truncate);
  if (d.kind === 'replay') return d.result;
  log.finish(d.token, result(out));
  return null;
}

describe('canonicalRequest', () => {
  it('is independent of env key order and distinguishes every field', () => {
    const a = canonicalRequest({ argv: ['x'], env: { A: '1', B: '2' } }).hash;
    expect(canonicalRequest({ argv: ['x'], env: { B: '2', A: '1' } }).hash).toBe(a);
    const variants = [
      { argv: ['y'], env: { A: '1', B: '2' } },
      { argv: ['x'], env: { A: '1' } },
      { argv: ['x'], env: { A: '1', B: '2' }, cwd: '/' },
      { argv: ['x'], env: { A: '1', B: '2' }, user: '0' },
      { argv: ['x'], env: { A: '1', B: '2' }, timeout_ms: 5 },
      { argv: ['x'], env: { A: '1', B: '2' }, stdin_b64: '' },
      { argv: ['x'], env: { A: '1', B: '2' }, stdin_b64: 'YQ==' },
      { argv: ['x y'], env: { A: '1', B: '2' } },
      { argv: ['x', ''], env: { A: '1', B: '2' } },
    ];
    const hashes = new Set([a, ...variants.map((v) => canonicalRequest(v).hash)]);
    expect(hashes.size).toBe(variants.length + 1);
    expect(canonicalRequest({ argv: ['x'], stdin_b64: 'YQ==' }).request.stdin_sha256).toBe('ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb');
  });
});

describe('TrajectoryLog', () => {
  it('replays a finished step with the same request and counts replays', () => {
    const log = fresh();
    expect(run(log, 't', 1, 'echo a')).toBeNull();
    const r = run(log, 't', 1, 'echo a');
    expect(r).toMatchObject({ replayed: true, trajectory: 't', step: 1, exit_code: 0 });
    expect(Buffer.from(r!.stdout_b64, 'base64').toString()).toBe('echo a');
    expect(log.get('t').step_list[0].replays).toBe(1);
  });

  it('refuses a different request at a recorded step unless truncating', () => {
    const log = fresh();
    run(log, 't', 1, 'a');
    run(log, 't', 2, 'b');
    run(log, 't', 3, 'c');
    expect(() => log.begin('t', 2, 'sb1', req('B'))).toThrow(expect.objectContaining({ kind: 'Conflict', reason: 'step_mismatch' }));
    expect(run(log, 't', 2, 'B', 'B', true)).toBeNull();
    expect(log.get('t').step_list.map((s) => s.step)).toEqual([1, 2]);
    expect(log.get('t').truncations).toBe(1);
  });

  it('a started step is in_progress while this process runs it and outcome_unknown for a new process', () => {
    const db = openDb(':memory:');
    const log = new TrajectoryLog(db, 'h');
    const d = log.begin('t', 0, 'sb1', req('x'));
    expect(d.kind).toBe('run');
    expect(() => log.begin('t', 0, 'sb1', req('x'))).toThrow(expect.objectContaining({ reason: 'in_progress' }));
    expect(log.get('t').step_list[0].state).toBe('running');
    const after = new TrajectoryLog(db, 'h'); // dsecd restarted
    expect(() => after.begin('t', 0, 'sb1', req('x'))).toThrow(expect.objectContaining({ kind: 'Conflict', reason: 'outcome_unknown' }));
    expect(after.get('t').step_list[0]).toMatchObject({ state: 'unknown', error: 'dsecd stopped during the step' });
    expect(after.get('t').unknown).toBe(1);
    expect(after.begin('t', 0, 'sb1', req('x'), true).kind).toBe('run');
  });

  it('unknown() keeps the step refused with its reason; abandon() forgets a step that never ran', () => {
    const log = fresh();
    const d = log.begin('t', 0, 'sb1', req('x'));
    if (d.kind !== 'run') throw new Error('expected run');
    log.unknown(d.token, 'agent connection lost');
    expect(() => log.begin('t', 0, 'sb1', req('x'))).toThrow(/agent connection lost/);
    const d2 = log.begin('u', 0, 'sb1', req('x'));
    if (d2.kind !== 'run') throw new Error('expected run');
    log.abandon(d2.token);
    expect(log.list().map((t) => t.id)).toEqual(['t']);
    expect(log.begin('u', 0, 'sb1', req('x')).kind).toBe('run');
  });

  it('truncate refuses to discard a step that is running; mismatches name the fields that differ', () => {
    const log = fresh();
    run(log, 't', 1, 'a');
    const d = log.begin('t', 5, 'sb1', req('slow'));
    expect(() => log.begin('t', 3, 'sb1', req('x'), true)).toThrow(expect.objectContaining({ kind: 'Conflict', reason: 'in_progress' }));
    if (d.kind === 'run') log.finish(d.token, result('slow'));
    expect(log.begin('t', 3, 'sb1', req('x'), true).kind).toBe('run');
    const log2 = fresh();
    log2.finish((log2.begin('u', 0, 'sb1', { argv: ['x'], env: { A: '1' } }) as { token: { trajectory: string; step: number } }).token, result(''));
    expect(() => log2.begin('u', 0, 'sb1', { argv: ['x'], env: { A: '2' }, timeout_ms: 5 })).toThrow(/env, timeout_ms differ/);
  });

  it('a step abandoned before it ran leaves no trajectory behind', () => {
    const log = fresh();
    const d = log.begin('fresh', 0, 'sb1', req('x'));
    if (d.kind !== 'run') throw new Error('expected run');
    log.abandon(d.token);
    expect(log.list()).toEqual([]);
    expect(() => log.get('fresh')).toThrow(expect.objectContaining({ kind: 'NotFound' }));
  });

  it('appends in increasing order: gaps forward are fine, an unrecorded earlier step is out_of_order', () => {
    const log = fresh();
    run(log, 't', 10, 'a');
    run(log, 't', 20, 'b');
    expect(() => log.begin('t', 15, 'sb1', req('c'))).toThrow(expect.objectContaining({ reason: 'out_of_order' }));
    expect(run(log, 't', 15, 'c', 'c', true)).toBeNull();
    expect(log.get('t').step_list.map((s) => s.step)).toEqual([10, 15]);
  });

  it('canRun failing records nothing and truncates nothing', () => {
    const log = fresh();
    run(log, 't', 1, 'a');
    run(log, 't', 2, 'b');
    const stop = () => { throw new Error('not running'); };
    expect(() => log.begin('t', 1, 'sb1', req('z'), true, Date.now(), stop)).toThrow('not running');
    expect(log.get('t').step_list.map((s) => s.step)).toEqual([1, 2]);
    // A replay does not need canRun.
    expect(log.begin('t', 2, 'sb1', req('b'), false, Date.now(), stop).kind).toBe('replay');
  });

  it('remove leaves a tombstone: the id is refused, not silently re-run; prune applies retention', () => {
    const log = fresh();
    run(log, 't', 1, 'a');
    expect(log.remove('t')).toBe(1);
    expect(() => log.begin('t', 1, 'sb1', req('a'))).toThrow(expect.objectContaining({ kind: 'FailedPrecondition', reason: 'trajectory_removed' }));
    expect(() => log.get('t')).toThrow(expect.objectContaining({ kind: 'NotFound' }));
    expect(log.list()).toEqual([]);
    run(log, 'old', 1, 'a');
    run(log, 'new', 1, 'a');
    const now = Date.now();
    log.begin('new', 2, 'sb1', req('running')); // in flight: never pruned
    expect(log.prune(now + 1, 0, now + 1)).toEqual({ removed: 1, forgotten: 0 });
    expect(log.list().map((t) => t.id)).toEqual(['new']);
    expect(log.prune(0, now + 10, now + 2).forgotten).toBe(2); // tombstones of t and old
    expect(log.begin('t', 1, 'sb1', req('a')).kind).toBe('run');
  });

  it('exports every step with request and output, and summarises trajectories', () => {
    const log = fresh();
    run(log, 't', 1, 'a', 'out-a');
    run(log, 't', 2, 'b', 'out-b');
    const recs = [...log.export('t')];
    expect(recs.map((r) => [r.step, r.host, r.trajectory, Buffer.from(r.stdout_b64!, 'base64').toString()])).toEqual([[1, 'host-a', 't', 'out-a'], [2, 'host-a', 't', 'out-b']]);
    expect(recs[0]).toMatchObject({ argv: ['sh', '-c', 'a'], env: {}, cwd: null, stdin_sha256: null, state: 'finished', exit_code: 0, duration_ms: 1.5 });
    expect(log.list()[0]).toMatchObject({ id: 't', steps: 2, first_step: 1, last_step: 2, unknown: 0, sandbox_id: 'sb1', host: 'host-a' });
    expect(() => [...log.export('nope')]).toThrow(expect.objectContaining({ kind: 'NotFound' }));
  });

  it("keeps one id of two tenants as two trajectories; a tenant's calls never reach the other's", () => {
    const log = fresh();
    const A = { tenant: 'team-a', all: false }, B = { tenant: 'team-b', all: false };
    expect(trajectoryKey('system', 't')).toBe('t');
    run(log, trajectoryKey('team-a', 't'), 0, 'a');
    // B's step 0 of the same id runs (against A's it would be a step_mismatch) and replays as B's.
    expect(run(log, trajectoryKey('team-b', 't'), 0, 'b')).toBeNull();
    expect(run(log, trajectoryKey('team-b', 't'), 0, 'b')).toMatchObject({ replayed: true, trajectory: 't' });
    expect(log.get('t', A).step_list[0].argv).toEqual(['sh', '-c', 'a']);
    expect(log.get('t', B).step_list[0].argv).toEqual(['sh', '-c', 'b']);
    expect(log.list(A).map((t) => [t.id, t.tenant])).toEqual([['t', 'team-a']]);
    expect(log.list().map((t) => t.tenant).sort()).toEqual(['team-a', 'team-b']); // an admin sees both
    expect(() => log.get('t', { tenant: 'team-c', all: false })).toThrow(expect.objectContaining({ kind: 'NotFound', message: 'trajectory t not found' }));
    expect(log.remove('t', Date.now(), B)).toBe(1);
    expect(log.get('t', A).steps).toBe(1);
    expect([...log.export('t', A)].map((r) => r.trajectory)).toEqual(['t']);
  });
});

/** A store at schema `version` holding one sandbox row ('old') written by that version. */
function storeAt(version: number): Database.Database {
  const db = new Database(':memory:');
  migrate(db, MIGRATIONS.slice(0, version));
  db.prepare(`INSERT INTO sandboxes (id, backend, image, image_layers, image_config, state, cpus, memory_bytes, pids, labels, env, created_at, updated_at)
    VALUES ('old', 'container', 'busybox:latest', '[]', '{"env":[],"cwd":"/","user":"0","cmd":[]}', 'running', 1, 1, 8, '{}', '{}', 1, 1)`).run();
  return db;
}

describe('migrations 3-6', () => {
  it('3 adds snapshots, the trajectory log and sandboxes.snapshot_id to a version-2 store, keeping its rows', () => {
    const db = storeAt(2);
    expect(migrate(db, MIGRATIONS.slice(0, 3))).toEqual([3]);
    expect(db.prepare("SELECT snapshot_id FROM sandboxes WHERE id = 'old'").get()).toEqual({ snapshot_id: null });
    const tables = db.prepare("SELECT name FROM sqlite_master WHERE type='table'").all().map((r: any) => r.name);
    expect(tables).toEqual(expect.arrayContaining(['snapshots', 'trajectories', 'trajectory_steps']));
  });

  it('4 adds fork intents to a version-3 store', () => {
    const db = storeAt(3);
    expect(migrate(db, MIGRATIONS.slice(0, 4))).toEqual([4]);
    db.prepare("INSERT INTO fork_intents (id, snapshot_id, count, created_at) VALUES ('fork-1', 'snap-1', 3, 1)").run();
    expect(db.prepare('SELECT id, count FROM fork_intents').all()).toEqual([{ id: 'fork-1', count: 3 }]);
  });

  it('5 adds sandboxes.seccomp to a version-4 store, keeping its rows', () => {
    const db = storeAt(4);
    expect(migrate(db, MIGRATIONS.slice(0, 5))).toEqual([5]);
    expect(db.prepare("SELECT seccomp FROM sandboxes WHERE id = 'old'").get()).toEqual({ seccomp: null });
  });

  it('6 adds network, disk_bytes and filesystem to sandboxes and snapshots of a version-5 store, keeping its rows', () => {
    const db = storeAt(5);
    expect(migrate(db, MIGRATIONS.slice(0, 6))).toEqual([6]);
    expect(db.prepare("SELECT network, disk_bytes, filesystem FROM sandboxes WHERE id = 'old'").get()).toEqual({ network: null, disk_bytes: null, filesystem: null });
    const cols = db.prepare('PRAGMA table_info(snapshots)').all().map((r: any) => r.name);
    expect(cols).toEqual(expect.arrayContaining(['network', 'disk_bytes', 'filesystem']));
  });
});
