/**
 * Commands run in a sandbox: what a caller asks (an exec to completion, or an exec
 * session), and the result of one run to completion.
 */

/** A command: argv and how to run it. Absent fields take the sandbox's and image's values. */
export interface CommandInput {
  /** Program and arguments; argv[0] is looked up in PATH. */
  argv: string[];
  /** Extra environment, merged over the sandbox env (itself over the image env). */
  env?: Record<string, string>;
  /** Working directory inside the sandbox; default the image's. */
  cwd?: string;
  /** User name or `uid[:gid]` inside the sandbox; default the image's. */
  user?: string;
  /** Kill the command (SIGKILL to its process group) after this many ms. */
  timeoutMs?: number;
}

/** A trajectory step an exec is recorded as (docs/TRAJECTORIES.md). */
export interface TrajectoryStepInput {
  /** Trajectory id. */
  id: string;
  /** Step number, 0 or more, increasing within the trajectory. */
  step: number;
  /** Discard the recorded steps from `step` on first (after a Conflict). */
  truncate: boolean;
}

/** An exec to completion. */
export interface ExecInput extends CommandInput {
  /** Bytes fed to stdin (absent: empty stdin). */
  stdin?: Buffer;
  /** Record the run as this trajectory step; absent: not recorded. */
  trajectory?: TrajectoryStepInput;
}

/** An exec session: the command runs on its own, its output streamed or spooled. */
export interface StartExecInput extends CommandInput {
  /** True: stdin is a pipe fed by the session; false: /dev/null. */
  stdin: boolean;
  /** Run under a pseudo-terminal of this size. */
  tty?: { rows: number; cols: number };
  /** Pace the command by its readers instead of spooling its output (daemon/sandbox/exec-sessions.ts). */
  paced: boolean;
}

/**
 * The result of one exec to completion. Field names are the wire's (the API's
 * ExecResult): the trajectory log records results in this shape and replays them as
 * they were answered, and the fncall tier hands them on unchanged.
 */
export interface ExecResult {
  /** Exit status, null when killed by a signal. */
  exit_code: number | null;
  /** Signal name (e.g. SIGKILL) when killed by one, else null. */
  signal: string | null;
  /** Standard output and error, base64, each at most the configured output cap. */
  stdout_b64: string;
  stderr_b64: string;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  /** Time from fork to exit inside the sandbox, ms. */
  duration_ms: number;
  /** The command died of SIGKILL while the sandbox's memory cgroup counted an OOM kill. */
  oom: boolean;
  /** OOM kills in the sandbox from the command's start to its end; null: not visible (a VM guest). Absent in replays of old records. */
  oom_kills?: number | null;
  /** timeout_ms elapsed and the command was killed. */
  timed_out: boolean;
  /** Trajectory execs only: the trajectory, the step, and whether this is a recorded result replayed. */
  trajectory?: string;
  step?: number;
  replayed?: boolean;
}
