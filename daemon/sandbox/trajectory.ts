/**
 * The trajectory log: a durable record of every command a rollout ran, keyed by
 * (trajectory, step), so that a rollout resumed after preemption fast-forwards by
 * replaying recorded results instead of running non-idempotent commands twice.
 *
 * Contract (docs/TRAJECTORIES.md has the user's view):
 * - A step is reduced to a canonical hash of its request ({@link canonicalRequest}).
 * - `started` is committed to SQLite before the command runs; the result (output,
 *   exit, signal, oom, timings) is committed when it ends. WAL with synchronous=NORMAL
 *   makes both durable across a dsecd crash (daemon/db/db.ts).
 * - Re-issuing a finished step with the same hash replays the recorded result; with a
 *   different hash it is Conflict `step_mismatch`; a step that started and never
 *   finished is Conflict `outcome_unknown`. `truncate` discards the step and every
 *   later one first, which is how the caller resolves either conflict.
 * - New steps are appended in increasing order: a step number below the last
 *   recorded one that is not itself recorded is Conflict `out_of_order` (it can be
 *   neither replayed nor run without rewriting the past).
 * - A removed trajectory (`rm` or retention) leaves a tombstone: re-using its id is
 *   FailedPrecondition `trajectory_removed`, so a rollout that expects replays never
 *   silently re-runs its steps against an empty log.
 * The log is independent of sandbox ids (a rollout may move to a restored sandbox),
 * and every exported record names its host, so a cluster-wide log can merge the
 * per-host logs later.
 */
import { createHash } from 'node:crypto';
import type { Db } from '../db/db.js';
import { DsecError, notFound } from '../errors.js';
import type { ExecResult } from '../model/exec.js';
import { SYSTEM_SCOPE, SYSTEM_TENANT, type Scope } from '../model/tenant.js';

/** The parts of an exec request that define a step; absent fields are null. */
export interface CanonicalRequest {
  argv: string[];
  /** The request's own env (not the sandbox's or image's), keys sorted. */
  env: Record<string, string>;
  cwd: string | null;
  user: string | null;
  timeout_ms: number | null;
  /** sha256 hex of the stdin bytes, or null when the request had no stdin. */
  stdin_sha256: string | null;
}

/**
 * An exec request as the trajectory log reduces it: the wire's field names (the
 * canonical form keeps them), stdin as bytes (`stdin`) or as their base64 (`stdin_b64`;
 * `stdin` wins when both are given).
 */
export interface CanonicalInput {
  argv: string[];
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  timeout_ms?: number;
  stdin_b64?: string;
  stdin?: Buffer;
}

/**
 * Reduces an exec request to its canonical form and hash: sha256 (hex) of the
 * version tag `dsec-trajectory-v1` and a newline, then the canonical JSON (keys
 * sorted, env keys sorted, absent fields null). Two requests with the same hash run
 * the same command in the same way, whatever sandbox they target.
 */
export function canonicalRequest(req: CanonicalInput): { request: CanonicalRequest; hash: string } {
  const env: Record<string, string> = {};
  for (const k of Object.keys(req.env ?? {}).sort()) env[k] = req.env![k];
  const stdin = req.stdin ?? (req.stdin_b64 !== undefined ? Buffer.from(req.stdin_b64, 'base64') : undefined);
  const request: CanonicalRequest = {
    argv: [...req.argv],
    env,
    cwd: req.cwd ?? null,
    user: req.user ?? null,
    timeout_ms: req.timeout_ms ?? null,
    stdin_sha256: stdin !== undefined ? createHash('sha256').update(stdin).digest('hex') : null,
  };
  const canon = JSON.stringify({
    argv: request.argv, cwd: request.cwd, env: request.env, stdin_sha256: request.stdin_sha256, timeout_ms: request.timeout_ms, user: request.user,
  });
  return { request, hash: createHash('sha256').update(`dsec-trajectory-v1\n${canon}`).digest('hex') };
}

/** What {@link TrajectoryLog.begin} decided. */
export type StepDecision =
  | { kind: 'replay'; result: ExecResult }
  | { kind: 'run'; token: StepToken };

/** A step this process is running; pass it to finish/unknown/abandon exactly once. */
export interface StepToken {
  trajectory: string;
  step: number;
}

/** Result fields stored as JSON (the output bytes are separate BLOBs). */
interface StoredResult {
  exit_code: number | null;
  signal: string | null;
  oom: boolean;
  /** ExecResult.oom_kills; absent in steps recorded before it existed. */
  oom_kills?: number | null;
  timed_out: boolean;
  duration_ms: number;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
}

interface StepRow {
  trajectory: string; step: number; hash: string; sandbox_id: string; request: string; started_at: number;
  finished_at: number | null; result: string | null; stdout: Buffer | null; stderr: Buffer | null; error: string | null; replays: number;
}

interface TrajRow { id: string; tenant: string; created_at: number; updated_at: number; truncations: number; removed_at: number | null }

/** A step's state as the API shows it. */
export type StepState = 'running' | 'finished' | 'unknown';

/** One step without output (GET /v1/trajectories/{id}). */
export interface StepView {
  step: number;
  state: StepState;
  hash: string;
  sandbox_id: string;
  argv: string[];
  started_at: number;
  finished_at: number | null;
  exit_code: number | null;
  signal: string | null;
  oom: boolean | null;
  timed_out: boolean | null;
  duration_ms: number | null;
  stdout_bytes: number | null;
  stderr_bytes: number | null;
  replays: number;
  error: string | null;
}

/** A trajectory summary (GET /v1/trajectories). */
export interface TrajectorySummaryView {
  /** The trajectory's id as its tenant names it. */
  id: string;
  /** The tenant it belongs to (its sandboxes'). */
  tenant: string;
  host: string;
  steps: number;
  first_step: number | null;
  last_step: number | null;
  unknown: number;
  sandbox_id: string | null;
  truncations: number;
  created_at: number;
  updated_at: number;
}

/** A whole step, as one JSONL line of an export. */
export type StepRecord = StepView & {
  trajectory: string;
  host: string;
  env: Record<string, string>;
  cwd: string | null;
  user: string | null;
  timeout_ms: number | null;
  stdin_sha256: string | null;
  stdout_b64: string | null;
  stderr_b64: string | null;
  stdout_truncated: boolean | null;
  stderr_truncated: boolean | null;
};

const conflictWith = (reason: string, message: string) => new DsecError('Conflict', message, { reason });

/**
 * The store key of trajectory `name` of `tenant`: the name itself for tenant `system`
 * (so keys made before tenancy keep their meaning), `tenant/name` for the others.
 * Trajectory ids never contain `/` (the wire's TrajectoryId) and tenant names never do
 * (TENANT_RE), so two tenants' same name are two keys and no key is ambiguous.
 */
export function trajectoryKey(tenant: string, name: string): string {
  return tenant === SYSTEM_TENANT ? name : `${tenant}/${name}`;
}

/** The tenant and name of a store key ({@link trajectoryKey}). */
export function splitTrajectoryKey(key: string): { tenant: string; name: string } {
  const i = key.indexOf('/');
  return i < 0 ? { tenant: SYSTEM_TENANT, name: key } : { tenant: key.slice(0, i), name: key.slice(i + 1) };
}

/** The per-host trajectory log over the store's `trajectories` and `trajectory_steps` tables. */
export class TrajectoryLog {
  /** Steps running in this process now, as `trajectory \0 step`; a started row not in here is of unknown outcome. */
  private readonly inFlight = new Set<string>();

  /**
   * @param db the store.
   * @param host this host's name, written into every summary and exported record.
   */
  constructor(private readonly db: Db, readonly host: string) {}

  private key(t: string, step: number): string {
    return `${t}\0${step}`;
  }

  private stateOf(r: StepRow): StepState {
    if (r.finished_at !== null) return 'finished';
    return this.inFlight.has(this.key(r.trajectory, r.step)) ? 'running' : 'unknown';
  }

  /**
   * Decides what an exec carrying (trajectory, step) does, and records the decision in
   * one transaction: replay the recorded result (counting the replay), or record the
   * step as started and hand back a token for the caller to run it.
   * @param trajectory the trajectory's store key ({@link trajectoryKey} of its sandbox's tenant and its id).
   * @param sandboxId the sandbox the step targets now (recorded for new steps).
   * @param truncate discard `step` and every later step first.
   * @param canRun called (inside the transaction) before a step is recorded to run; it
   *   throws when the step cannot run now (e.g. the sandbox is not running), and then
   *   nothing is recorded or truncated.
   * @throws DsecError Conflict with reason `step_mismatch`, `outcome_unknown`,
   *   `in_progress` or `out_of_order`; FailedPrecondition `trajectory_removed`; what
   *   `canRun` throws.
   */
  begin(trajectory: string, step: number, sandboxId: string, req: CanonicalInput, truncate = false, now = Date.now(), canRun: () => void = () => {}): StepDecision {
    const { request, hash } = canonicalRequest(req);
    return this.db.transaction((): StepDecision => {
      const t = this.db.prepare('SELECT * FROM trajectories WHERE id = ?').get(trajectory) as TrajRow | undefined;
      if (t?.removed_at != null) {
        throw new DsecError('FailedPrecondition', `trajectory ${trajectory} was removed at ${new Date(t.removed_at).toISOString()}; its recorded steps are gone, so they can be neither replayed nor safely run again. Use a new trajectory id`, { reason: 'trajectory_removed' });
      }
      const cur = this.db.prepare('SELECT * FROM trajectory_steps WHERE trajectory = ? AND step = ?').get(trajectory, step) as StepRow | undefined;
      if (cur && this.inFlight.has(this.key(trajectory, step))) {
        throw conflictWith('in_progress', `step ${step} of trajectory ${trajectory} is running now (started at ${new Date(cur.started_at).toISOString()} in sandbox ${cur.sandbox_id}); wait for it to finish, then re-issue it to get its result`);
      }
      if (truncate) {
        const running = [...this.inFlight].filter((k) => k.startsWith(`${trajectory}\0`)).map((k) => Number(k.slice(trajectory.length + 1))).filter((n) => n >= step);
        if (running.length) {
          throw conflictWith('in_progress', `step ${Math.min(...running)} of trajectory ${trajectory} is running now; truncating from step ${step} would discard it while it runs. Wait for it to finish`);
        }
      }
      if (cur && !truncate) {
        if (cur.finished_at === null) {
          throw conflictWith('outcome_unknown', `step ${step} of trajectory ${trajectory} started at ${new Date(cur.started_at).toISOString()} in sandbox ${cur.sandbox_id} and never finished`
            + `${cur.error ? ` (${cur.error})` : ' (dsecd stopped during it)'}: whether it took effect is unknown. Inspect the sandbox, then re-issue with truncate to run it again from this step`);
        }
        if (cur.hash !== hash) {
          const was = JSON.parse(cur.request) as CanonicalRequest;
          const differs = (Object.keys(request) as (keyof CanonicalRequest)[]).filter((k) => JSON.stringify(was[k]) !== JSON.stringify(request[k]));
          throw conflictWith('step_mismatch', `step ${step} of trajectory ${trajectory} was recorded with a different request (${differs.join(', ')} differ; recorded argv ${JSON.stringify(was.argv).slice(0, 200)}); `
            + 're-issue with truncate to discard this step and every later one');
        }
        this.db.prepare('UPDATE trajectory_steps SET replays = replays + 1 WHERE trajectory = ? AND step = ?').run(trajectory, step);
        return { kind: 'replay', result: { ...this.result(cur), trajectory: splitTrajectoryKey(trajectory).name, step, replayed: true } };
      }
      if (!truncate) {
        const last = (this.db.prepare('SELECT MAX(step) AS m FROM trajectory_steps WHERE trajectory = ?').get(trajectory) as { m: number | null }).m;
        if (last !== null && step < last) {
          throw conflictWith('out_of_order', `trajectory ${trajectory} has steps up to ${last}, and step ${step} was never recorded: it cannot be replayed, and running it now would record it out of order. `
            + 'Re-issue with truncate to discard the later steps and run it');
        }
      }
      canRun();
      if (truncate) {
        const n = this.db.prepare('DELETE FROM trajectory_steps WHERE trajectory = ? AND step >= ?').run(trajectory, step).changes;
        if (n > 0) this.db.prepare('UPDATE trajectories SET truncations = truncations + 1, updated_at = ? WHERE id = ?').run(now, trajectory);
      }
      if (!t) this.db.prepare('INSERT INTO trajectories (id, tenant, created_at, updated_at) VALUES (?, ?, ?, ?)').run(trajectory, splitTrajectoryKey(trajectory).tenant, now, now);
      else this.db.prepare('UPDATE trajectories SET updated_at = ? WHERE id = ?').run(now, trajectory);
      this.db.prepare('INSERT INTO trajectory_steps (trajectory, step, hash, sandbox_id, request, started_at) VALUES (?, ?, ?, ?, ?, ?)')
        .run(trajectory, step, hash, sandboxId, JSON.stringify(request), now);
      this.inFlight.add(this.key(trajectory, step));
      return { kind: 'run', token: { trajectory, step } };
    })();
  }

  /** Records a step's result (the command ran to an end: exit, signal, timeout or OOM). */
  finish(tok: StepToken, r: ExecResult, now = Date.now()): void {
    const stored: StoredResult = {
      exit_code: r.exit_code, signal: r.signal, oom: r.oom, ...(r.oom_kills !== undefined ? { oom_kills: r.oom_kills } : {}), timed_out: r.timed_out,
      duration_ms: r.duration_ms, stdout_truncated: r.stdout_truncated, stderr_truncated: r.stderr_truncated,
    };
    this.db.transaction(() => {
      this.db.prepare('UPDATE trajectory_steps SET finished_at = ?, result = ?, stdout = ?, stderr = ?, error = NULL WHERE trajectory = ? AND step = ?')
        .run(now, JSON.stringify(stored), Buffer.from(r.stdout_b64, 'base64'), Buffer.from(r.stderr_b64, 'base64'), tok.trajectory, tok.step);
      this.db.prepare('UPDATE trajectories SET updated_at = ? WHERE id = ?').run(now, tok.trajectory);
    })();
    this.inFlight.delete(this.key(tok.trajectory, tok.step));
  }

  /** Leaves a started step of unknown outcome (e.g. the agent connection broke mid-command), noting why. */
  unknown(tok: StepToken, why: string): void {
    this.db.prepare('UPDATE trajectory_steps SET error = ? WHERE trajectory = ? AND step = ? AND finished_at IS NULL').run(why.slice(0, 500), tok.trajectory, tok.step);
    this.inFlight.delete(this.key(tok.trajectory, tok.step));
  }

  /** Forgets a started step whose command provably never began (e.g. execve's argument list too long). */
  abandon(tok: StepToken): void {
    this.db.transaction(() => {
      this.db.prepare('DELETE FROM trajectory_steps WHERE trajectory = ? AND step = ? AND finished_at IS NULL').run(tok.trajectory, tok.step);
      // A trajectory this step created, and nothing else touched, goes with it.
      this.db.prepare(`DELETE FROM trajectories WHERE id = ? AND truncations = 0 AND removed_at IS NULL
        AND NOT EXISTS (SELECT 1 FROM trajectory_steps WHERE trajectory = ?)`).run(tok.trajectory, tok.trajectory);
    })();
    this.inFlight.delete(this.key(tok.trajectory, tok.step));
  }

  private result(r: StepRow): ExecResult {
    const s = JSON.parse(r.result!) as StoredResult;
    return {
      exit_code: s.exit_code, signal: s.signal,
      stdout_b64: (r.stdout ?? Buffer.alloc(0)).toString('base64'), stderr_b64: (r.stderr ?? Buffer.alloc(0)).toString('base64'),
      stdout_truncated: s.stdout_truncated, stderr_truncated: s.stderr_truncated, duration_ms: s.duration_ms, oom: s.oom,
      ...(s.oom_kills !== undefined ? { oom_kills: s.oom_kills } : {}), timed_out: s.timed_out,
    };
  }

  private view(r: StepRow): StepView {
    const s = r.result ? (JSON.parse(r.result) as StoredResult) : null;
    return {
      step: r.step, state: this.stateOf(r), hash: r.hash, sandbox_id: r.sandbox_id, argv: (JSON.parse(r.request) as CanonicalRequest).argv,
      started_at: r.started_at, finished_at: r.finished_at, exit_code: s?.exit_code ?? null, signal: s?.signal ?? null, oom: s?.oom ?? null,
      timed_out: s?.timed_out ?? null, duration_ms: s?.duration_ms ?? null, stdout_bytes: r.stdout?.length ?? null, stderr_bytes: r.stderr?.length ?? null,
      replays: r.replays, error: r.finished_at === null && !this.inFlight.has(this.key(r.trajectory, r.step)) ? (r.error ?? 'dsecd stopped during the step') : null,
    };
  }

  /** Summaries of every trajectory `scope` sees that is not removed, most recently updated first. */
  list(scope: Scope = SYSTEM_SCOPE): TrajectorySummaryView[] {
    const rows = (scope.all
      ? this.db.prepare('SELECT * FROM trajectories WHERE removed_at IS NULL ORDER BY updated_at DESC, id').all()
      : this.db.prepare('SELECT * FROM trajectories WHERE removed_at IS NULL AND tenant = ? ORDER BY updated_at DESC, id').all(scope.tenant)) as TrajRow[];
    return rows.map((t) => this.summary(t));
  }

  private summary(t: TrajRow): TrajectorySummaryView {
    const agg = this.db.prepare(`SELECT COUNT(*) AS n, MIN(step) AS lo, MAX(step) AS hi FROM trajectory_steps WHERE trajectory = ?`).get(t.id) as { n: number; lo: number | null; hi: number | null };
    const open = (this.db.prepare('SELECT step FROM trajectory_steps WHERE trajectory = ? AND finished_at IS NULL').all(t.id) as { step: number }[])
      .filter((r) => !this.inFlight.has(this.key(t.id, r.step))).length;
    const lastSb = agg.hi === null ? null : (this.db.prepare('SELECT sandbox_id FROM trajectory_steps WHERE trajectory = ? AND step = ?').get(t.id, agg.hi) as { sandbox_id: string }).sandbox_id;
    return {
      id: splitTrajectoryKey(t.id).name, tenant: t.tenant, host: this.host, steps: agg.n, first_step: agg.lo, last_step: agg.hi, unknown: open, sandbox_id: lastSb,
      truncations: t.truncations, created_at: t.created_at, updated_at: t.updated_at,
    };
  }

  /** The live row of trajectory `name` of `scope`'s tenant (names are per tenant: another tenant's same name is another trajectory). */
  private live(name: string, scope: Scope): TrajRow {
    const t = this.db.prepare('SELECT * FROM trajectories WHERE id = ?').get(trajectoryKey(scope.tenant, name)) as TrajRow | undefined;
    if (!t) throw notFound(`trajectory ${name} not found`);
    if (t.removed_at !== null) throw notFound(`trajectory ${name} was removed at ${new Date(t.removed_at).toISOString()}`);
    return t;
  }

  /**
   * Trajectory `id` of `scope`'s tenant with its steps.
   * @throws DsecError NotFound (unknown, removed, or only another tenant has it).
   */
  get(id: string, scope: Scope = SYSTEM_SCOPE): TrajectorySummaryView & { step_list: StepView[] } {
    const t = this.live(id, scope);
    const rows = this.db.prepare('SELECT * FROM trajectory_steps WHERE trajectory = ? ORDER BY step').all(t.id) as StepRow[];
    return { ...this.summary(t), step_list: rows.map((r) => this.view(r)) };
  }

  /**
   * Every step with its output, in step order, one row read at a time (no statement
   * stays open across yields, so other requests keep using the store meanwhile).
   * @throws DsecError NotFound (unknown, removed, or only another tenant has it), on the first iteration.
   */
  *export(id: string, scope: Scope = SYSTEM_SCOPE): Generator<StepRecord> {
    const key = this.live(id, scope).id;
    const steps = (this.db.prepare('SELECT step FROM trajectory_steps WHERE trajectory = ? ORDER BY step').all(key) as { step: number }[]).map((r) => r.step);
    const one = this.db.prepare('SELECT * FROM trajectory_steps WHERE trajectory = ? AND step = ?');
    for (const step of steps) {
      const r = one.get(key, step) as StepRow | undefined;
      if (!r) continue; // truncated while exporting
      const req = JSON.parse(r.request) as CanonicalRequest;
      const s = r.result ? (JSON.parse(r.result) as StoredResult) : null;
      yield {
        trajectory: id, host: this.host, ...this.view(r), env: req.env, cwd: req.cwd, user: req.user, timeout_ms: req.timeout_ms, stdin_sha256: req.stdin_sha256,
        stdout_b64: r.stdout ? r.stdout.toString('base64') : null, stderr_b64: r.stderr ? r.stderr.toString('base64') : null,
        stdout_truncated: s?.stdout_truncated ?? null, stderr_truncated: s?.stderr_truncated ?? null,
      };
    }
  }

  /**
   * Removes a trajectory's steps and leaves a tombstone, so the id cannot be reused by
   * a rollout that expects its old results.
   * @returns how many steps were removed.
   * @throws DsecError NotFound (unknown, already removed, or only another tenant has it), Conflict (a step is running now).
   */
  remove(id: string, now = Date.now(), scope: Scope = SYSTEM_SCOPE): number {
    return this.removeKey(this.live(id, scope).id, now);
  }

  /** Removes the trajectory of store key `key` (see {@link remove}). */
  private removeKey(key: string, now: number): number {
    const { name } = splitTrajectoryKey(key);
    for (const k of this.inFlight) {
      if (k.startsWith(`${key}\0`)) throw new DsecError('Conflict', `trajectory ${name} has a step running now; remove it after the step ends`, { reason: 'in_progress' });
    }
    return this.db.transaction(() => {
      const n = this.db.prepare('DELETE FROM trajectory_steps WHERE trajectory = ?').run(key).changes;
      this.db.prepare('UPDATE trajectories SET removed_at = ?, updated_at = ? WHERE id = ?').run(now, now, key);
      return n;
    })();
  }

  /**
   * Retention: removes (with a tombstone) trajectories not updated since `before` (ms)
   * and with no step running, and forgets tombstones older than `tombstonesBefore`.
   * @returns how many trajectories were removed and how many tombstones forgotten.
   */
  prune(before: number, tombstonesBefore: number, now = Date.now()): { removed: number; forgotten: number } {
    const stale = (this.db.prepare('SELECT id FROM trajectories WHERE removed_at IS NULL AND updated_at < ?').all(before) as { id: string }[])
      .map((r) => r.id).filter((id) => ![...this.inFlight].some((k) => k.startsWith(`${id}\0`)));
    for (const key of stale) this.removeKey(key, now);
    const forgotten = this.db.prepare('DELETE FROM trajectories WHERE removed_at IS NOT NULL AND removed_at < ?').run(tombstonesBefore).changes;
    return { removed: stale.length, forgotten };
  }
}
