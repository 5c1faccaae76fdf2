/**
 * Text rendering of trajectories and their steps (used by `dsec traj ...` and
 * `dsec exec --trajectory`). Pure: data in, string out.
 */
import type { TrajectoryDetail, TrajectoryStep, TrajectorySummary } from '../../sdk/index.js';
import { formatAge, formatDuration, makeTable, tableText } from '../util/output.js';
import { shellQuote } from './execs.js';

/** Options of the trajectory renderers. */
export interface RenderTrajectoryOptions {
  /** "Now" in ms since the epoch, for the UPDATED column; default `Date.now()`. */
  now?: number;
  /** Bold header; set only for a terminal. */
  color?: boolean;
  /** Full commands in the ARGV column. */
  noTrunc?: boolean;
}

/** Longest ARGV shown by {@link renderStepTable} unless `noTrunc`. */
const ARGV_WIDTH = 60;

/** Column headers of {@link renderTrajectoryTable}, in order. */
export const TRAJECTORY_COLUMNS = ['ID', 'STEPS', 'LAST', 'UNKNOWN', 'SANDBOX', 'HOST', 'UPDATED'] as const;

/**
 * The `dsec traj ls` table: ID, STEPS (recorded), LAST (the highest step, `-` when none),
 * UNKNOWN (steps whose outcome is unknown), SANDBOX (of the latest step), HOST (the dsecd
 * holding the log) and UPDATED (age, e.g. `3m ago`), header first even when empty.
 */
export function renderTrajectoryTable(list: TrajectorySummary[], opts: RenderTrajectoryOptions = {}): string {
  const now = opts.now ?? Date.now();
  const t = makeTable([...TRAJECTORY_COLUMNS], { color: opts.color ?? false });
  for (const x of list) {
    t.push([x.id, String(x.steps), x.last_step === null ? '-' : String(x.last_step), String(x.unknown), x.sandbox_id ?? '-', x.host, `${formatAge(now - x.updated_at)} ago`]);
  }
  return tableText(t);
}

/** The EXIT column of a step: its exit code, else `timeout` or the signal; `-` while running or when unknown. */
export function stepExitColumn(s: Pick<TrajectoryStep, 'state' | 'exit_code' | 'signal' | 'timed_out'>): string {
  if (s.state !== 'finished') return '-';
  if (s.timed_out) return 'timeout';
  if (s.exit_code !== null) return String(s.exit_code);
  return s.signal ?? '?';
}

/** Column headers of {@link renderStepTable}, in order. */
export const STEP_COLUMNS = ['STEP', 'STATE', 'EXIT', 'DURATION', 'ARGV', 'REPLAYS'] as const;

/**
 * The `dsec traj show` table: STEP, STATE (`running`, `finished` or `unknown`), EXIT (see
 * {@link stepExitColumn}), DURATION (`1.2s` style, `-` until finished), ARGV
 * (shell-quoted, cut at 60 characters unless `noTrunc`) and REPLAYS (how many times the
 * recorded result was replayed), in step order, header first even when empty.
 */
export function renderStepTable(steps: TrajectoryStep[], opts: RenderTrajectoryOptions = {}): string {
  const t = makeTable([...STEP_COLUMNS], { color: opts.color ?? false });
  for (const s of [...steps].sort((a, b) => a.step - b.step)) {
    let argv = s.argv.map(shellQuote).join(' ');
    if (!opts.noTrunc && [...argv].length > ARGV_WIDTH) argv = [...argv].slice(0, ARGV_WIDTH - 1).join('') + '…';
    const duration = s.duration_ms === null ? '-' : formatDuration(Math.round(s.duration_ms));
    t.push([String(s.step), s.state, stepExitColumn(s), duration, argv, String(s.replays)]);
  }
  return tableText(t);
}

/**
 * Notes for stderr under `dsec traj show`: one per step whose outcome is unknown, with
 * why (when dsecd knows) and how to go on, e.g.
 * `dsec: note: step 3 of T: outcome unknown (dsecd restarted); rerun it with --truncate`.
 */
export function renderUnknownStepNotes(t: TrajectoryDetail): string {
  return t.step_list
    .filter((s) => s.state === 'unknown')
    .map((s) => `dsec: note: step ${s.step} of ${t.id}: outcome unknown${s.error ? ` (${s.error})` : ''}; rerun it with \`dsec exec --trajectory ${t.id} --step ${s.step} --truncate ID -- CMD\`\n`)
    .join('');
}

/** The stderr note of an exec whose result was replayed: `dsec: step N of T replayed from the log; nothing ran`. */
export function renderReplayedNote(trajectory: string, step: number): string {
  return `dsec: step ${step} of ${trajectory} replayed from the log; nothing ran\n`;
}
