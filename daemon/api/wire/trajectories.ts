/** The trajectory log on the wire: steps, summaries, details, export records and removal. */
import { z } from 'zod';

/** State of a recorded step: `running` in this dsecd now, `finished` with a result, or `unknown` (started, never finished: dsecd died or the sandbox was lost mid-step). */
export const StepState = z.enum(['running', 'finished', 'unknown']);

/** One step of a trajectory, without its output (GET /v1/trajectories/{id}). */
export const TrajectoryStep = z.object({
  step: z.number().int(),
  state: StepState,
  hash: z.string().describe('sha256 (hex) of the canonical request: argv, env, cwd, user, stdin digest, timeout_ms.'),
  sandbox_id: z.string().describe('Sandbox the step ran in.'),
  argv: z.array(z.string()),
  started_at: z.number().int().describe('ms since the Unix epoch.'),
  finished_at: z.number().int().nullable(),
  exit_code: z.number().int().nullable(),
  signal: z.string().nullable(),
  oom: z.boolean().nullable(),
  timed_out: z.boolean().nullable(),
  duration_ms: z.number().nullable(),
  stdout_bytes: z.number().int().nullable(),
  stderr_bytes: z.number().int().nullable(),
  replays: z.number().int().describe('How many times the recorded result was replayed.'),
  error: z.string().nullable().describe('Why the outcome is unknown, when it is.'),
});

/** A trajectory's summary (GET /v1/trajectories). */
export const TrajectorySummary = z.object({
  id: z.string().describe("The trajectory's id, unique within its tenant."),
  tenant: z.string().describe('The tenant it belongs to: the tenant of the sandboxes its steps ran in.'),
  host: z.string().describe('Host name of the dsecd that holds the log.'),
  steps: z.number().int().describe('Recorded steps.'),
  first_step: z.number().int().nullable(),
  last_step: z.number().int().nullable(),
  unknown: z.number().int().describe('Steps whose outcome is unknown.'),
  sandbox_id: z.string().nullable().describe('Sandbox of the latest step.'),
  truncations: z.number().int().describe('How many times the log was truncated.'),
  created_at: z.number().int(),
  updated_at: z.number().int(),
});

/** GET /v1/trajectories response. */
export const TrajectoryList = z.object({ trajectories: z.array(TrajectorySummary) });

/** GET /v1/trajectories/{id} response. */
export const TrajectoryDetail = TrajectorySummary.extend({ step_list: z.array(TrajectoryStep) });

/**
 * One line of GET /v1/trajectories/{id}/export (JSONL): a whole step, for training
 * pipelines. `host` and `trajectory` make lines from several hosts mergeable.
 */
export const TrajectoryRecord = TrajectoryStep.extend({
  trajectory: z.string(),
  host: z.string(),
  env: z.record(z.string(), z.string()),
  cwd: z.string().nullable(),
  user: z.string().nullable(),
  timeout_ms: z.number().int().nullable(),
  stdin_sha256: z.string().nullable(),
  stdout_b64: z.string().nullable(),
  stderr_b64: z.string().nullable(),
  stdout_truncated: z.boolean().nullable(),
  stderr_truncated: z.boolean().nullable(),
});
export type TrajectoryRecord = z.infer<typeof TrajectoryRecord>;

/** DELETE /v1/trajectories/{id} response. */
export const TrajectoryRemoved = z.object({ id: z.string(), removed_steps: z.number().int() });
