/** Commands on the wire: execs to completion and their results, exec sessions with their queries, and one-shot runs (POST /v1/run, /v1/run:batch). */
import { z } from 'zod';
import { LIMITS } from '../../model/resources.js';
import { Backend, TrajectoryId, envKey, envSize, envValue } from './common.js';

/** POST /v1/sandboxes/{id}/exec request. */
export const ExecRequest = z
  .object({
    argv: z.array(z.string().refine((s) => !s.includes('\0'), 'argv must not contain NUL')).min(1).describe('Program and arguments; argv[0] is looked up in PATH.'),
    env: z.record(envKey, envValue).refine((e) => envSize(e) <= LIMITS.maxEnvBytes, 'env larger than 128 KiB').optional()
      .describe('Extra environment, merged over the sandbox env; at most 128 KiB.'),
    cwd: z.string().startsWith('/').optional().describe('Working directory inside the sandbox; default the image cwd.'),
    user: z.string().regex(/^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$/).optional().describe('User name or uid[:gid] inside the sandbox; default the image user.'),
    stdin_b64: z.string().base64().optional().describe('Bytes fed to stdin, base64; stdin is empty otherwise.'),
    timeout_ms: z.number().int().min(1).max(LIMITS.maxTimeoutMs).optional().describe('Kill the command (SIGKILL to its process group) after this many ms.'),
    trajectory: TrajectoryId.optional().describe('Record this command as a step of this trajectory (docs/TRAJECTORIES.md); needs `step`.'),
    step: z.number().int().min(0).max(LIMITS.maxStep).optional().describe('Step number within `trajectory`, 0 or more; steps are recorded in increasing order.'),
    truncate: z.boolean().optional().describe('Discard the recorded steps of `trajectory` from `step` on, then run this one (after a Conflict).'),
  })
  .strict()
  .superRefine((r, ctx) => {
    if ((r.trajectory === undefined) !== (r.step === undefined)) ctx.addIssue({ code: 'custom', message: 'trajectory and step go together: give both or neither', path: [r.trajectory === undefined ? 'trajectory' : 'step'] });
    if (r.truncate === true && r.trajectory === undefined) ctx.addIssue({ code: 'custom', message: 'truncate needs trajectory and step', path: ['truncate'] });
  });
export type ExecRequest = z.infer<typeof ExecRequest>;

/** POST /v1/sandboxes/{id}/execs request: start an exec session (streamed, background, optionally with a PTY). */
export const StartExecRequest = z
  .object({
    argv: z.array(z.string().refine((s) => !s.includes('\0'), 'argv must not contain NUL')).min(1),
    env: z.record(envKey, envValue).refine((e) => envSize(e) <= LIMITS.maxEnvBytes, 'env larger than 128 KiB').optional(),
    cwd: z.string().startsWith('/').optional(),
    user: z.string().regex(/^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?$/).optional(),
    stdin: z.boolean().optional().describe('Open stdin for streaming (POST .../stdin or the attach WebSocket); default /dev/null.'),
    tty: z.object({ rows: z.number().int().min(1).max(1000), cols: z.number().int().min(1).max(1000) }).strict().optional()
      .describe('Run under a pseudo-terminal of this size; stdout and stderr are then one stream (stdout).'),
    timeout_ms: z.number().int().min(1).max(LIMITS.maxTimeoutMs).optional(),
    paced: z.boolean().optional().describe(
      'Pace the command by its readers instead of spooling its output (what `dsec exec` uses, as `docker exec` streams): output is held in dsecd '
      + 'until an attached reader (attach WebSocket, output?follow) has taken it, at most 1 MiB per stream, and the command blocks on its full pipes '
      + 'while its readers are further behind (or none is attached yet). No size limit and no spool file; output a reader has taken is gone, so a later '
      + 'reader starts at the oldest byte still held. Default false: spooled to disk up to 1 GiB per stream, readable again from any offset.'),
  })
  .strict();
export type StartExecRequest = z.infer<typeof StartExecRequest>;

/**
 * What `oom_kills` of an exec means (ExecResult, ExecInfo): the sandbox's OOM kill counter
 * (memory cgroup v1 `memory.oom_control` oom_kill, v2 `memory.events` oom_kill) read
 * before the command started and after it ended, so it counts a process of a pipeline
 * (or any child) that was killed while the command itself exited 0. The counter is per
 * sandbox: with other commands running in the sandbox at the same time, a kill of one of
 * theirs counts here too.
 */
const OOM_KILLS_DOC = "OOM kills in the sandbox's memory cgroup from the command's start to its end: any process, this command's children "
  + 'or (when other commands ran at the same time) theirs; null when the backend cannot see them (a VM guest\'s own kernel).';

/** An exec session as the API returns it. */
export const ExecInfo = z.object({
  exec_id: z.string().describe('128-bit random id; only its owner (the uid that started it) and root can use it.'),
  sandbox_id: z.string(),
  argv: z.array(z.string()),
  tty: z.boolean(),
  stdin: z.boolean().describe('Whether stdin is open for writing.'),
  state: z.enum(['running', 'exited']),
  pid: z.number().int().nullable().describe('pid inside the sandbox.'),
  started_at: z.number().int().describe('ms since the Unix epoch.'),
  finished_at: z.number().int().nullable(),
  exit_code: z.number().int().nullable().describe('127 not found, 126 not executable, else the exit status; null while running or when killed.'),
  signal: z.string().nullable(),
  timed_out: z.boolean(),
  error: z.string().nullable().describe('Why the command could not start, or ended with its sandbox.'),
  stdout_bytes: z.number().int().describe('Bytes of stdout produced so far: the end offset (readable from offset 0 when spooled; a paced session holds only the bytes no reader has taken).'),
  stderr_bytes: z.number().int(),
  stdout_dropped_bytes: z.number().int().describe('Bytes produced beyond the spool budget and dropped (always 0 when paced).'),
  stderr_dropped_bytes: z.number().int(),
  paced: z.boolean().describe('Whether output is paced by its readers rather than spooled (StartExecRequest.paced).'),
  oom_kills: z.number().int().nullable().describe(OOM_KILLS_DOC + ' Null while the command runs.'),
});

/** GET /v1/sandboxes/{id}/execs response. */
export const ExecList = z.object({ execs: z.array(ExecInfo) });

/** GET .../execs/{exec_id}/output query. */
export const OutputQuery = z
  .object({
    stream: z.enum(['stdout', 'stderr']).optional().describe('Default stdout.'),
    offset: z.coerce.number().int().min(0).optional().describe('Start at this byte; default 0.'),
    follow: z.enum(['true', 'false', '1', '0']).optional().describe('Keep streaming until the command ends.'),
  })
  .strict();

/** POST .../execs/{exec_id}/signal request. */
export const SignalRequest = z.object({ signal: z.union([z.string().min(1).max(16), z.number().int()]).describe('Name (SIGTERM, TERM) or number.') }).strict();

/** POST .../execs/{exec_id}/resize request. */
export const ResizeRequest = z.object({ rows: z.number().int().min(1).max(1000), cols: z.number().int().min(1).max(1000) }).strict();

/** POST .../execs/{exec_id}/wait query. */
export const WaitQuery = z.object({ timeout_ms: z.coerce.number().int().min(0).max(LIMITS.maxTimeoutMs).optional() }).strict();

/** GET .../execs/{exec_id}/attach (WebSocket) query. */
export const AttachQuery = z
  .object({
    stdout_offset: z.coerce.number().int().min(0).optional().describe('Resume stdout from this byte (default 0: everything kept).'),
    stderr_offset: z.coerce.number().int().min(0).optional(),
    kill_on_detach: z.enum(['true', 'false', '1', '0']).optional().describe('SIGKILL the command when this WebSocket closes while it runs (default false: it keeps running).'),
  })
  .strict();

/** POST /v1/sandboxes/{id}/exec response. */
export const ExecResult = z.object({
  exit_code: z.number().int().nullable().describe('Exit status, null when killed by a signal.'),
  signal: z.string().nullable().describe('Signal name (e.g. SIGKILL) when killed by one, else null.'),
  stdout_b64: z.string().describe('Standard output, base64, at most max_output_bytes.'),
  stderr_b64: z.string().describe('Standard error, base64, at most max_output_bytes.'),
  stdout_truncated: z.boolean(),
  stderr_truncated: z.boolean(),
  duration_ms: z.number().describe('Time from fork to exit inside the sandbox, ms.'),
  oom: z.boolean().describe("True when the command was killed by SIGKILL while the sandbox's memory cgroup recorded an OOM kill."),
  oom_kills: z.number().int().nullable().optional().describe(OOM_KILLS_DOC + ' Absent from a replayed trajectory step recorded without it.'),
  timed_out: z.boolean().describe('True when timeout_ms elapsed and the command was killed.'),
  trajectory: z.string().optional().describe('The trajectory the step belongs to (trajectory execs only).'),
  step: z.number().int().optional(),
  replayed: z.boolean().optional().describe('True when this result is the recorded one of an earlier run of the same step and nothing was executed now (trajectory execs only).'),
});
export type ExecResult = z.infer<typeof ExecResult>;

/** Most calls in one POST /v1/run:batch: 1,000 (a rollout group's rewards; larger batches are several requests). */
export const MAX_BATCH_CALLS = 1000;

/**
 * POST /v1/run request: one command in a fresh environment, for any tier. `container`
 * creates a sandbox, runs the command and destroys the sandbox; `fncall` runs it on a
 * pre-warmed pooled worker in fresh namespaces. Only `backend` differs between tiers.
 */
export const RunRequest = z
  .object({
    backend: Backend.default('container').describe('Isolation tier; default container (as for sandboxes); fncall is the fastest isolated execution.'),
    image: z.string().min(1).max(255).default('busybox').describe('Image reference; default busybox.'),
    argv: ExecRequest.shape.argv,
    env: ExecRequest.shape.env,
    cwd: ExecRequest.shape.cwd,
    user: ExecRequest.shape.user,
    stdin_b64: ExecRequest.shape.stdin_b64,
    timeout_ms: z.number().int().min(1).max(LIMITS.maxTimeoutMs).optional().describe('Wall-clock limit, ms: the whole process tree is killed when it passes. Default 60,000 for fncall.'),
    memory_bytes: z.number().int().min(LIMITS.minMemoryBytes).max(LIMITS.maxMemoryBytes).optional().describe('Memory limit, bytes; default from config.'),
    cpus: z.number().min(LIMITS.minCpus).max(LIMITS.maxCpus).optional().describe('CPU limit, cores (container only; fncall workers share the pool limit).'),
    pids: z.number().int().min(LIMITS.minPids).max(LIMITS.maxPids).optional().describe('Process limit (container only; fncall workers have the pool limit).'),
  })
  .strict();
export type RunRequest = z.infer<typeof RunRequest>;

/** POST /v1/run:batch request. */
export const RunBatchRequest = z
  .object({ calls: z.array(RunRequest).min(1).max(MAX_BATCH_CALLS).describe(`The calls, 1-${MAX_BATCH_CALLS}; they run concurrently.`) })
  .strict();

/** POST /v1/run:batch response: one entry per call, in request order. */
export const RunBatchResult = z.object({
  results: z.array(z.object({
    ok: z.boolean(),
    result: ExecResult.optional().describe('When ok.'),
    error: z.object({ code: z.string(), message: z.string() }).optional().describe('When not ok: why dsec could not run the call (a failing command is ok with its exit code).'),
  })),
});
