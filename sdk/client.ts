/**
 * Typed client of the dsecd HTTP+JSON API (daemon/api/schema.ts), spoken over the
 * daemon's Unix socket.
 *
 * Built for hot loops (an RL framework issuing thousands of execs per second): one
 * keep-alive `http.Agent` per client reuses connections, bodies are plain JSON with no
 * runtime schema validation on the client side, and idle pooled sockets are unref'd so a
 * short-lived process exits without calling {@link DsecClient.close}.
 *
 * Transfers stream: file contents, tar archives, exec output and exec stdin go through
 * node:http with backpressure in both directions (uploads are piped, downloads are
 * returned as Readables), so a multi-GB file never sits in memory here. Exec sessions
 * can be attached over a WebSocket ({@link DsecClient.attachExec}, sdk/attach.ts).
 *
 * Every failure is a {@link DsecApiError} whose `code` is one of the closed set of error
 * kinds (daemon/errors.ts), with three exceptions: a call aborted through an `AbortSignal`
 * rejects with the signal's reason (an `AbortError` by default), a long image operation
 * whose `onProgress` callback throws rejects with that error, and an upload whose source
 * stream fails rejects with that stream's error.
 */
import http from 'node:http';
import { Readable, pipeline } from 'node:stream';
import { StringDecoder } from 'node:string_decoder';
import type { z } from 'zod';
import type { ErrorKind } from '../daemon/errors.js';
import type { RunRequest as RunRequestSchema } from '../daemon/api/schema.js';
import type {
  Backend,
  BootstrapRequest,
  CommitResult as CommitResultSchema,
  ComposeRequest,
  CreateSandboxRequest,
  Event,
  ExecInfo as ExecInfoSchema,
  ExecResult,
  ForkRequest,
  HostInfo as HostInfoSchema,
  Image as ImageSchema,
  ImageConfig as ImageConfigSchema,
  ImportRequest,
  Layer as LayerSchema,
  PruneResult as PruneResultSchema,
  RestoreRequest,
  Sandbox,
  SandboxState,
  SandboxStatsView,
  Snapshot as SnapshotSchema,
  StatsResponse as StatsResponseSchema,
  StepState as StepStateSchema,
  TrajectoryDetail as TrajectoryDetailSchema,
  TrajectoryRecord as TrajectoryRecordSchema,
  TrajectoryRemoved as TrajectoryRemovedSchema,
  TrajectoryStep as TrajectoryStepSchema,
  TrajectorySummary as TrajectorySummarySchema,
  VersionInfo as VersionInfoSchema,
  NetworkSpec as NetworkSpecSchema,
  SandboxNetwork as SandboxNetworkSchema,
  NetworkPolicyView as NetworkPolicyViewSchema,
  PolicyReloadResult as PolicyReloadResultSchema,
  SeccompProfileInfo as SeccompProfileInfoSchema,
} from '../daemon/api/schema.js';
import type {
  BulkRequest as BulkRequestSchema,
  BulkResponse as BulkResponseSchema,
  LeaseView as LeaseViewSchema,
  PauseResult as PauseResultSchema,
  Reclaim as ReclaimSchema,
} from '../daemon/api/routes/jobs.js';
import type { Template as E2bTemplateSchema } from '../daemon/api/e2b/templates.js';
import type { CreatedToken as CreatedTokenSchema, TokenView as TokenViewSchema, Whoami as WhoamiSchema } from '../daemon/api/routes/tokens.js';
import { ExecAttachment, type AttachOptions } from './attach.js';

/**
 * API types re-exported from daemon/api/schema.ts and daemon/errors.ts: `Sandbox`, one
 * `Event` of the stream, the wire `ExecResult` (base64 output), `Backend`, `SandboxState`
 * and the closed `ErrorKind` set.
 */
export type { Backend, Event, ExecResult, Sandbox, SandboxState, ErrorKind };

/** Socket path used when neither the `socketPath` option nor `DSEC_SOCKET` is set. */
export const DEFAULT_SOCKET_PATH = '/run/dsec/dsecd.sock';

/**
 * Default per-request deadline, ms. Generous because a create under a burst queues
 * behind others on the daemon; a healthy daemon answers most calls in a few ms.
 */
export const DEFAULT_TIMEOUT_MS = 60_000;

/** GET /v1/version response: the daemon's version, API version and agent protocol. */
export type VersionInfo = z.infer<typeof VersionInfoSchema>;

/** GET /v1/host response: host capabilities, runtime, cgroup layout, counts. */
export type HostInfo = z.infer<typeof HostInfoSchema>;

/**
 * POST /v1/sandboxes request as the caller writes it: every field is optional
 * (backend defaults to `container`, image to `busybox`, limits to the daemon config).
 * Units: `cpus` cores (fractional), `memory_bytes` bytes, `ttl_s` seconds.
 */
export type CreateSandboxInput = z.input<typeof CreateSandboxRequest>;

/** A sandbox's network as requested: mode (none, allow, open), a named policy, allow and deny rules (docs/SECURITY.md, Networking and egress). */
export type NetworkInput = z.input<typeof NetworkSpecSchema>;

/** GET/PUT /v1/sandboxes/{id}/network response: the settled network, address, resolved hosts and denial counters. */
export type SandboxNetwork = z.infer<typeof SandboxNetworkSchema>;

/** One loaded network policy (GET /v1/network/policies). */
export type NetworkPolicy = z.infer<typeof NetworkPolicyViewSchema>;

/** POST /v1/network/policies/reload response. */
export type PolicyReloadResult = z.infer<typeof PolicyReloadResultSchema>;

/** The seccomp profile in force: its data `file`, the `sha256` of its text, and how many syscall names it `denied`. */
export type SeccompProfileInfo = z.infer<typeof SeccompProfileInfoSchema>;

/**
 * An image as the API returns it (GET /v1/images, GET /v1/images/{ref}, and the result of
 * every call that makes one): `ref` is `name:tag`; `layers` are digests
 * (`sha256:<64 hex>`), lowest first; `config` holds the process defaults; `size_bytes`
 * is the sum of the layer blob sizes in bytes; `created_at` is ms since the Unix epoch.
 */
export type Image = z.infer<typeof ImageSchema>;

/** An E2B template (GET /v1/templates): `name` -> `image` on `backend`; `builtin` for the default `base` no alias replaces. */
export type E2bTemplate = z.infer<typeof E2bTemplateSchema>;

/** The old name of {@link Image}, kept so existing callers compile; the shape is now the full Image. */
export type ImageInfo = Image;

/**
 * Process defaults of an image: `env` as `KEY=value` strings, `cwd` (absolute), `user`
 * (name or `uid[:gid]`), `cmd` (argv), and optionally `security`: the image's security
 * defaults (a `seccomp` override; `readonly_paths`, `writable_paths`, `landlock`;
 * docs/IMAGES.md "Security defaults").
 */
export type ImageConfig = z.infer<typeof ImageConfigSchema>;

/**
 * A layer of the content-addressed store: `digest` (`sha256:<64 hex>`), `size_bytes`
 * (EROFS blob size, bytes), `created_at` (ms since the Unix epoch), `source` (where the
 * content came from, e.g. `dir:/path`, `oci:/x.tar#1`, `commit:<sandbox id>`), `builder`
 * (`<host>/<instance>`), `images` (refs using it) and `sandboxes` (how many sandboxes of
 * this instance use it).
 */
export type Layer = z.infer<typeof LayerSchema>;

/**
 * POST /v1/images/import request. `type`: `dir` (one layer from a directory tree, on top
 * of `base` when given), `tar` (one layer from a root filesystem tar, plain, gzip or zstd)
 * or `oci` (an OCI image layout, directory or tar, or a docker/podman save archive).
 * `path` is absolute and is read by dsecd **on its own host**. `image` names the result
 * (`name[:tag]`); `config` overrides fields of the image config.
 */
export type ImportImageInput = z.input<typeof ImportRequest>;

/**
 * POST /v1/images request: make image `image` from `layers` (digests already in the store,
 * lowest first), taking the config from image `from` when given, with `config` overrides.
 */
export type ComposeImageInput = z.input<typeof ComposeRequest>;

/**
 * POST /v1/images/bootstrap request: `distro` (only `debian`: bookworm minbase), `image`
 * (default `debian:bookworm`), `include` (extra packages; default python3, git).
 */
export type BootstrapImageInput = z.input<typeof BootstrapRequest>;

/**
 * POST /v1/images/prune response: the layers `removed` (or that would be, with
 * `dry_run`), `freed_bytes` (bytes), `kept_young` (digests of unreferenced layers kept
 * because they are younger than the grace period) and `tmp_removed` (leftover temporary
 * entries removed).
 */
export type PruneResult = z.infer<typeof PruneResultSchema>;

/**
 * POST /v1/sandboxes/{id}/commit response: the new `image`, its new top `layer` and the
 * paths `stripped` (relative to the sandbox root) before packing.
 */
export type CommitResult = z.infer<typeof CommitResultSchema>;

/**
 * One progress report of a long image operation ({@link DsecClient.importImage},
 * {@link DsecClient.bootstrapImage}), as dsecd streams it. Every field but `type` is
 * optional; what is set depends on the operation and phase.
 */
export interface ImageProgress {
  type: 'progress';
  /** What is happening, e.g. `pack`, `layer`, `debootstrap`. */
  phase?: string;
  /** One human-readable line (e.g. a debootstrap output line). */
  message?: string;
  /** Bytes processed so far in this phase. */
  bytes?: number;
  /** Index (1-based) of the layer being processed, when importing several. */
  layer?: number;
  /** Number of layers in the import. */
  layers?: number;
}

/**
 * One phase of a sandbox create, restore or fork as dsecd reports it (daemon/sandbox/progress.ts):
 * `rootfs` (layers, writable layer or disks), `launch` (the runtime or QEMU starting),
 * `boot` (waiting for the agent; a VM's guest boots here), `ready` (running). Each
 * sandbox reports each phase at most once, in that order (one claimed from the warm pool
 * only `ready`); a fork's reports name each of its sandboxes.
 */
export interface CreateProgress {
  phase: 'rootfs' | 'launch' | 'boot' | 'ready' | (string & {});
  /** The sandbox being made. */
  id: string;
  /** The phase in words, e.g. `booting the guest (waiting for its agent)`. */
  message: string;
}

/** Options of the calls that create sandboxes ({@link DsecClient.createSandbox}, {@link DsecClient.restore}, {@link DsecClient.fork}). */
export interface CreateOptions extends RequestOptions {
  /**
   * Called once per phase report, in order, before the promise settles (the call then
   * streams: `Accept: application/x-ndjson`, no deadline). If it throws, the stream is
   * closed and the call rejects with that error; dsecd still finishes the create.
   */
  onProgress?: (p: CreateProgress) => void;
}

/** Options of the long image operations ({@link DsecClient.importImage}, {@link DsecClient.bootstrapImage}). */
export interface LongOperationOptions {
  /**
   * Called once per progress line, in order, before the promise settles. If it throws,
   * the stream is closed and the call rejects with that error.
   */
  onProgress?: (p: ImageProgress) => void;
  /**
   * Stop waiting: the promise rejects with the signal's reason and the connection closes.
   * dsecd does not cancel the operation; it may still finish.
   */
  signal?: AbortSignal;
}

/** Options of {@link DsecClient.pruneImages}. */
export interface PruneOptions {
  /** Report what would be removed without removing anything. */
  dryRun?: boolean;
}

/** Request of {@link DsecClient.commit}. */
export interface CommitOptions {
  /** Name of the new image, `name[:tag]`. */
  image: string;
  /** Extra globs, relative to the sandbox root (e.g. `srv/cache/**`), stripped before packing. */
  exclude?: string[];
  /**
   * Security defaults of the new image (seccomp override, filesystem options), merged
   * field by field over those of the sandbox's image; default: the image's unchanged.
   */
  security?: ImageConfig['security'];
  /** Stop waiting (rejects with the signal's reason); dsecd may still finish the commit. */
  signal?: AbortSignal;
}

/**
 * A snapshot (POST /v1/sandboxes/{id}/snapshot, GET /v1/snapshots...): `id`
 * (`snap-<16 hex>`), `name` (unique, or null), `kind` (`filesystem`: a container's
 * writable layer; `vm`: a microVM's whole machine, RAM, processes and disk), `sandbox_id`
 * (the source; it may be gone since), `image` and `image_layers` (digests a restore
 * mounts, lowest first; for `filesystem` the last is `layer`, the snapshot's own; for
 * `vm` `layer` is `sha256:` of the machine state), `size_bytes` (host bytes: the layer
 * blob, or the state plus the disk copy's blocks), the source's limits (`cpus` cores,
 * `memory_bytes` bytes, `pids`), `priority`, `labels` and `env` (the defaults of a
 * restore or fork), `created_at` (ms since the Unix epoch), and `machine` (`vm` only, else
 * null: `qemu_version`, `accel`, `memory_mib` and `vcpus` that restores keep,
 * `state_bytes` and `state_sha256` of the migration stream, `disk_bytes`,
 * `disk_allocated_bytes` and `disk_reflinked` of the disk copy, `paused_ms` the vCPUs
 * were stopped for the capture).
 */
export type Snapshot = z.infer<typeof SnapshotSchema>;

/** Options of {@link DsecClient.snapshot}. */
export interface SnapshotOptions {
  /** Unique name to restore by, `[a-z0-9][a-z0-9._-]{0,127}`; default none (restore by id). */
  name?: string;
  /**
   * Containers: also checkpoint memory and processes (CRIU); dsecd answers
   * `Unimplemented`, naming the reason, on a host where `criu check` fails. microVMs:
   * ignored, their snapshots always capture the whole machine.
   */
  process?: boolean;
  /** Stop waiting (rejects with the signal's reason); dsecd may still finish the snapshot. */
  signal?: AbortSignal;
}

/**
 * POST /v1/snapshots/{ref}/restore request in the wire format; every field is optional
 * and defaults to the snapshot's source sandbox: `labels` (replace the source's),
 * `env` (merged over the source's), `cpus` cores, `memory_bytes` bytes, `pids`,
 * `ttl_s` seconds from creation, `priority`, `idle_timeout_s` seconds.
 */
export type RestoreInput = z.input<typeof RestoreRequest>;

/**
 * POST /v1/snapshots/{ref}/fork request in the wire format: `count` (how many sandboxes,
 * 1-256) and the overrides of {@link RestoreInput}, applied to every one of them.
 */
export type ForkInput = z.input<typeof ForkRequest>;

/**
 * State of a recorded trajectory step: `running` (in this dsecd now), `finished` (its
 * result is recorded and replayed on a rerun) or `unknown` (it started and never
 * finished: dsecd died or the sandbox was lost mid-step; a rerun is refused with reason
 * `outcome_unknown` until the step is truncated).
 */
export type StepState = z.infer<typeof StepStateSchema>;

/**
 * One recorded step of a trajectory, without its output: `step` (number), `state`,
 * `hash` (sha256 hex of the canonical request: argv, env, cwd, user, stdin digest,
 * timeout_ms), `sandbox_id`, `argv`, `started_at`/`finished_at` (ms since the Unix
 * epoch), the outcome (`exit_code`, `signal`, `oom`, `timed_out`, `duration_ms` ms,
 * `stdout_bytes`/`stderr_bytes` bytes; null until finished), `replays` (how many times
 * the recorded result was replayed) and `error` (why the outcome is unknown, when it is).
 */
export type TrajectoryStep = z.infer<typeof TrajectoryStepSchema>;

/**
 * A trajectory's summary (GET /v1/trajectories): `id`, `host` (the dsecd holding the
 * log), `steps` (recorded), `first_step`/`last_step` (null when empty), `unknown` (steps
 * whose outcome is unknown), `sandbox_id` (of the latest step), `truncations` (how many
 * times the log was truncated), `created_at`/`updated_at` (ms since the Unix epoch).
 */
export type TrajectorySummary = z.infer<typeof TrajectorySummarySchema>;

/** GET /v1/trajectories/{id} response: the {@link TrajectorySummary} plus `step_list`, every {@link TrajectoryStep} in step order. */
export type TrajectoryDetail = z.infer<typeof TrajectoryDetailSchema>;

/**
 * One line of a trajectory export (GET /v1/trajectories/{id}/export): a whole
 * {@link TrajectoryStep} plus `trajectory` and `host` (lines of several hosts merge), the
 * request (`env`, `cwd`, `user`, `timeout_ms` ms, `stdin_sha256`) and the recorded output
 * (`stdout_b64`/`stderr_b64`, base64, with `stdout_truncated`/`stderr_truncated`; null
 * until the step finished).
 */
export type TrajectoryRecord = z.infer<typeof TrajectoryRecordSchema>;

/** DELETE /v1/trajectories/{id} response: the `id` and how many steps were discarded (`removed_steps`). */
export type TrajectoryRemoved = z.infer<typeof TrajectoryRemovedSchema>;

/** Options of {@link DsecClient.exportTrajectory}. */
export interface ExportTrajectoryOptions {
  /** Ends the stream: iteration then finishes normally, without an error (check the signal to tell a cut export from a whole one). */
  signal?: AbortSignal;
}

/** Options of {@link DsecClient}. */
export interface DsecClientOptions {
  /** Path of dsecd's Unix socket; default `$DSEC_SOCKET`, else {@link DEFAULT_SOCKET_PATH}. */
  socketPath?: string;
  /**
   * Deadline of one request in ms, from sending it to the end of the response body;
   * default {@link DEFAULT_TIMEOUT_MS}. `0` disables it. exec adds its own `timeoutMs`
   * on top (see {@link DsecClient.exec}); the events stream has no deadline.
   */
  timeoutMs?: number;
}

/** Query of {@link DsecClient.listSandboxes}. */
export interface ListSandboxesQuery {
  /**
   * Label selector: comma-separated terms `k=v` (label k is v), `k!=v` (k is not v, or
   * absent) and `k` (has label k); a sandbox matches when all terms match. A malformed
   * selector is `InvalidArgument`.
   */
  selector?: string;
  /** Only sandboxes in this state, e.g. `running`. */
  state?: SandboxState | string;
}

/** Options of {@link DsecClient.deleteSandbox}. */
export interface DeleteSandboxOptions {
  /** Destroy even when running (its processes are killed). */
  force?: boolean;
}

/** Options of {@link DsecClient.stopSandbox}. */
export interface StopSandboxOptions {
  /**
   * Grace period between SIGTERM and SIGKILL, ms (0 to 24 h); `0` kills at once. When
   * unset no body is sent and dsecd uses its default (10 s).
   */
  timeoutMs?: number;
  /** Abort the HTTP call (the promise rejects with the signal's reason); dsecd may still stop the sandbox. */
  signal?: AbortSignal;
}

/**
 * Scheduling class of a sandbox: `latency` (the default) or `batch` (SCHED_IDLE and
 * minimal CPU shares, so batch work never delays latency-sensitive sandboxes).
 */
export type SandboxPriority = Sandbox['priority'];

/**
 * What a pause reclaimed, measured from the sandbox's memory.stat before and after, in
 * bytes: `memory_before_bytes`/`memory_after_bytes` (all charged memory),
 * `file_before_bytes`/`file_after_bytes` (page cache), `anon_bytes` (anonymous memory
 * left: reclaimable only where the host has swap or zswap, which `swap` tells),
 * `reclaimed_bytes` and a human-readable `note`.
 */
export type Reclaim = z.infer<typeof ReclaimSchema>;

/**
 * POST /v1/sandboxes/{id}/pause response: the `sandbox` (state `paused`) and what the
 * pause `reclaim`ed; `reclaim` is null when the sandbox was already paused.
 */
export type PauseResult = z.infer<typeof PauseResultSchema>;

/** Actions of {@link DsecClient.bulk}. */
export type BulkAction = z.infer<typeof BulkRequestSchema>['action'];

/**
 * POST /v1/sandboxes/bulk request, in the wire format: `selector` (required and
 * non-empty: bulk never means "every sandbox"; same syntax as
 * {@link ListSandboxesQuery.selector}), `action`, `ttl_s` (set_ttl: seconds **from
 * creation**, or null to remove the TTL) and `timeout_ms` (stop: grace between SIGTERM
 * and SIGKILL).
 */
export type BulkInput = z.input<typeof BulkRequestSchema>;

/**
 * One sandbox's outcome of {@link DsecClient.bulk}: `ok` with the sandbox's `state`
 * afterwards (and `reclaim` for a pause that froze it now), or not `ok` with `error`
 * `{code, message}` (an error kind of daemon/errors.ts, as a string).
 */
export type BulkResult = z.infer<typeof BulkResponseSchema>['results'][number];

/**
 * A job's lease (POST/GET/DELETE /v1/leases...): `job` (the value of the `job` label
 * of its sandboxes), `ttl_s` (seconds each renewal extends it by), `expires_at` (ms since
 * the epoch; a renewal at or after it is refused), `lapsed_at` (when the lease lapsed and
 * the job's sandboxes were paused, else null), `created_at` (ms since the epoch) and
 * `sandboxes` (how many sandboxes carry `job=<job>` now).
 */
export type Lease = z.infer<typeof LeaseViewSchema>;

/** An API token as listed (GET /v1/tokens): id, tenant, role, times (ms since the epoch), state; never its text. */
export type TokenInfo = z.infer<typeof TokenViewSchema>;

/** POST /v1/tokens response: {@link TokenInfo} plus `token`, the text, shown this once. */
export type CreatedToken = z.infer<typeof CreatedTokenSchema>;

/** GET /v1/whoami response: the caller as dsecd sees it (door, token id, tenant, role, verified client certificate). */
export type Whoami = z.infer<typeof WhoamiSchema>;

/** Options of {@link DsecClient.createToken}. */
export interface CreateTokenOptions {
  /** Tenant the token acts for: 1-63 of a-z, 0-9, _ and -. */
  tenant: string;
  /** `admin`, `user`, `reader` or `metrics` (docs/SECURITY.md "The TCP door"). */
  role: 'admin' | 'user' | 'reader' | 'metrics';
  /** Lifetime in seconds; absent: never expires. */
  ttlS?: number;
  /** Free text shown by {@link DsecClient.listTokens}. */
  description?: string;
}

/** Options of {@link DsecClient.renewLease}. */
export interface RenewLeaseOptions {
  /** New TTL in seconds (1 s to 30 days); default the lease's current `ttl_s`. */
  ttlS?: number;
}

/** A command to run with {@link DsecClient.exec}. */
export interface ExecOptions {
  /** Program and arguments; `argv[0]` is looked up in the sandbox PATH. At least one element. */
  argv: string[];
  /** Extra environment, merged over the sandbox env. */
  env?: Record<string, string>;
  /** Absolute working directory inside the sandbox; default the image's. */
  cwd?: string;
  /** User name or `uid[:gid]` inside the sandbox; default the image's. */
  user?: string;
  /** Bytes fed to the command's stdin (a string is sent as UTF-8); at most 16 MiB. Empty otherwise. */
  stdin?: Buffer | Uint8Array | string;
  /** Kill the command (SIGKILL to its process group) after this many ms; the result then has `timed_out: true`. */
  timeoutMs?: number;
  /**
   * Record the command as step {@link step} of this trajectory (1-128 of
   * `[A-Za-z0-9._:@-]`, starting with a letter or digit); needs `step`. A rerun of a
   * finished step with the same request is not executed: dsecd answers with the recorded
   * result and `replayed: true`. See {@link DsecClient.exec} for the refusals.
   */
  trajectory?: string;
  /** Step number within `trajectory`, 0 to 2^31-1; steps are recorded in increasing order. Needs `trajectory`. */
  step?: number;
  /**
   * Discard the recorded steps of `trajectory` from `step` on, then run this one: the way
   * past a `Conflict` with reason `outcome_unknown` or `step_mismatch`. Needs `trajectory` and `step`.
   */
  truncate?: boolean;
  /** Abort the HTTP call (the promise rejects with the signal's reason). Whether the command keeps running is up to the daemon. */
  signal?: AbortSignal;
}

/** Result of {@link DsecClient.exec}: the API's ExecResult plus its output decoded from base64. */
/** A POST /v1/run request (snake_case, as on the wire): `{backend?, image?, argv, env?, cwd?, user?, stdin_b64?, timeout_ms?, memory_bytes?, cpus?, pids?}`. */
export type RunInput = z.input<typeof RunRequestSchema>;

/** One entry of a POST /v1/run:batch response. */
export interface RunBatchEntry {
  ok: boolean;
  /** When ok: the call's result (a failing command is ok, with its exit code). */
  result?: ExecResult;
  /** When not ok: why dsec could not run the call. */
  error?: { code: ErrorKind; message: string };
}

export interface ExecOutput extends ExecResult {
  /** Standard output bytes (decoded `stdout_b64`), possibly truncated (`stdout_truncated`). */
  stdout: Buffer;
  /** Standard error bytes (decoded `stderr_b64`), possibly truncated (`stderr_truncated`). */
  stderr: Buffer;
}

/**
 * An exec session (POST /v1/sandboxes/{id}/execs and the calls on it): `exec_id` (128-bit
 * random, usable only by the uid that started it, and root), `state` (`running` or
 * `exited`), `pid` (inside the sandbox), `started_at`/`finished_at` (ms since the Unix
 * epoch), `exit_code` (null while running or when killed), `signal`, `timed_out`,
 * `error` (why it could not start, or ended with its sandbox), and the bytes of output
 * kept (`stdout_bytes`, `stderr_bytes`) and dropped beyond dsecd's spool budget.
 */
export type ExecInfo = z.infer<typeof ExecInfoSchema>;

/** How a console attachment ended on dsecd's side: the console closed (the VM stopped). */
export interface ConsoleEnd {
  reason: string;
}

/** The attachment type {@link DsecClient.attachConsole} returns. */
export type ConsoleAttachmentHandle = ExecAttachment<ConsoleEnd>;

/** The attachment type {@link DsecClient.attachExec} returns, typed with {@link ExecInfo}. */
export type ExecAttachmentHandle = ExecAttachment<ExecInfo>;

/**
 * Resource usage of one sandbox (GET /v1/stats, GET /v1/sandboxes/{id}/stats):
 * `cpu_usage_ns` is cumulative CPU time in ns (compare two samples for a rate),
 * `memory_bytes`/`memory_limit_bytes` bytes charged/allowed, `pids`, `oom_kills`; every
 * usage field is null when the sandbox is not running.
 */
export type SandboxStats = z.infer<typeof SandboxStatsView>;

/** GET /v1/stats response: `time` of the sample (ms since the epoch), the `host` block and every sandbox's {@link SandboxStats}. */
export type StatsResponse = z.infer<typeof StatsResponseSchema>;

/** A command to start as an exec session with {@link DsecClient.startExec}. */
export interface StartExecOptions {
  /** Program and arguments; `argv[0]` is looked up in the sandbox PATH. At least one element. */
  argv: string[];
  /** Extra environment, merged over the sandbox env. */
  env?: Record<string, string>;
  /** Absolute working directory inside the sandbox; default the image's. */
  cwd?: string;
  /** User name or `uid[:gid]` inside the sandbox; default the image's. */
  user?: string;
  /** Open stdin for streaming ({@link DsecClient.writeExecStdin} or an attachment); default /dev/null. */
  stdin?: boolean;
  /** Run under a pseudo-terminal of this size; stdout and stderr are then one stream (stdout). */
  tty?: { rows: number; cols: number };
  /** Kill the command (SIGKILL) after this many ms; its ExecInfo then has `timed_out: true`. */
  timeoutMs?: number;
  /**
   * Pace the command by its readers instead of spooling its output: dsecd holds at most
   * 1 MiB per stream that no reader has taken, and the command blocks while its readers
   * are behind (or none is attached yet). No size limit; output once taken cannot be read
   * again. Attach right after starting (what `dsec exec` does). Default false: spooled,
   * up to 1 GiB per stream, readable again from any offset.
   */
  paced?: boolean;
  /** Abort the HTTP call (the promise rejects with the signal's reason); the session may still start. */
  signal?: AbortSignal;
}

/** Query of {@link DsecClient.execOutput}. */
export interface ExecOutputQuery {
  /** Which stream; default `stdout`. */
  stream?: 'stdout' | 'stderr';
  /** Start at this byte of what dsecd kept; default 0. */
  offset?: number;
  /** Keep streaming until the command ends. */
  follow?: boolean;
  /** Closes the stream when aborted (the Readable is destroyed with the signal's reason). */
  signal?: AbortSignal;
}

/** Options of {@link DsecClient.writeExecStdin}. */
export interface WriteStdinOptions {
  /** Close the command's stdin after these bytes. */
  eof?: boolean;
  /** Abort the upload (rejects with the signal's reason). */
  signal?: AbortSignal;
}

/** Options of {@link DsecClient.waitExec}. */
export interface WaitExecOptions {
  /** Give up after this many ms: rejects with `DeadlineExceeded` (the command keeps running). Default: wait as long as it runs. */
  timeoutMs?: number;
  /** Stop waiting (rejects with the signal's reason). */
  signal?: AbortSignal;
}

/** Options of {@link DsecClient.logs}. */
export interface LogsOptions {
  /** Keep the stream open and yield new lines until `signal` aborts or the sandbox is destroyed. */
  follow?: boolean;
  /** Ends the stream: iteration then finishes normally, without an error. */
  signal?: AbortSignal;
}

/** Options shared by the file calls. */
export interface FileOptions {
  /** Act as this user inside the sandbox (name or `uid[:gid]`): permissions are checked and new files owned as that user. */
  user?: string;
  /** Abort the transfer (rejects, or destroys the stream, with the signal's reason). */
  signal?: AbortSignal;
}

/** Options of {@link DsecClient.statFile}. */
export interface StatFileOptions extends FileOptions {
  /** Describe a final symlink itself (lstat) rather than what it points to (the default). */
  nofollow?: boolean;
}

/** Options of {@link DsecClient.getArchive}. */
export interface ArchiveOptions extends FileOptions {
  /** When `path` itself is a symlink, archive what it points to (under the link's name) rather than the link (the default). */
  follow?: boolean;
}

/** Options of {@link DsecClient.writeFile}. */
export interface WriteFileOptions extends FileOptions {
  /** Permission bits of a new file, e.g. `0o644` (sent as octal `0644`); dsecd's default otherwise. */
  mode?: number;
  /** Create missing parent directories. */
  parents?: boolean;
}

/** GET /v1/sandboxes/{id}/files/stat response: what is at a path in the sandbox (a final symlink is followed unless `nofollow`). */
export interface FileStat {
  /** The path asked about. */
  path: string;
  /** Kind of file. */
  type: 'file' | 'dir' | 'symlink' | 'other';
  /** Size in bytes. */
  size: number;
  /** Mode bits (permissions and, when dsecd includes them, the file type bits). */
  mode: number;
  /** Owner uid and gid, as seen inside the sandbox. */
  uid: number;
  gid: number;
  /** Modification time, ms since the Unix epoch. */
  mtime_ms: number;
  /** The link target of a symlink. */
  target?: string;
}

/** PUT /v1/sandboxes/{id}/files response. */
export interface WriteFileResult {
  /** The file written. */
  path: string;
  /** Bytes written. */
  bytes: number;
}

/** PUT /v1/sandboxes/{id}/archive response. */
export interface PutArchiveResult {
  /** Archive members extracted. */
  entries: number;
  /** Bytes of file content extracted. */
  bytes: number;
}

/** Options of {@link DsecClient.attachExec}; see {@link AttachOptions}. */
export type AttachExecOptions = AttachOptions;

/** Query of {@link DsecClient.events}. */
export interface EventsQuery {
  /** Only events of sandboxes whose labels match this selector (`k=v`, `k!=v`, `k` terms, comma-separated; see {@link ListSandboxesQuery.selector}). */
  selector?: string;
  /** Keep the stream open and yield new events as they happen (until aborted). */
  follow?: boolean;
  /** Only events at or after this time, ms since the Unix epoch. */
  since?: number;
  /** Ends the stream: iteration then finishes normally, without an error. */
  signal?: AbortSignal;
}

/** Options of {@link DsecClient.request}. */
export interface RequestOptions {
  /** Abort the call; the promise rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Deadline for this call in ms, overriding the client's `timeoutMs`; `0` disables it. */
  timeoutMs?: number;
}

/** Error kind for each HTTP status, used when a response body carries no recognisable code. */
const KIND_BY_STATUS: Record<number, ErrorKind> = {
  400: 'InvalidArgument',
  401: 'Unauthenticated',
  403: 'PermissionDenied',
  404: 'NotFound',
  409: 'Conflict',
  412: 'FailedPrecondition',
  429: 'ResourceExhausted',
  500: 'Internal',
  501: 'Unimplemented',
  503: 'Unavailable',
  504: 'DeadlineExceeded',
};

/** The closed set of kinds; typed as a full record so adding a kind to daemon/errors.ts breaks the build here. */
const KNOWN_KINDS: Record<ErrorKind, true> = {
  InvalidArgument: true,
  Unauthenticated: true,
  PermissionDenied: true,
  NotFound: true,
  AlreadyExists: true,
  Conflict: true,
  FailedPrecondition: true,
  ResourceExhausted: true,
  Internal: true,
  Unimplemented: true,
  Unavailable: true,
  DeadlineExceeded: true,
};

/**
 * A failed API call. `code` is one of the closed set of error kinds; `message` is the
 * daemon's own message (it names what failed) or, for client-side failures, one written
 * here that names the socket path; `reason`, when dsecd sent one, refines `code` for
 * callers that branch on it (trajectory execs).
 */
export class DsecApiError extends Error {
  /** Error kind, e.g. `NotFound`. Connection failures are `Unavailable`, client deadlines `DeadlineExceeded`. */
  readonly code: ErrorKind;
  /** HTTP status of the response, or 0 when there was no response (connection failure, client deadline). */
  readonly status: number;
  /**
   * Machine-readable refinement of `code` from the error body, where a caller must branch
   * on it, e.g. for a trajectory exec: `outcome_unknown`, `step_mismatch`, `in_progress`,
   * `out_of_order`, `trajectory_removed`. Undefined when dsecd gave none (most errors) and
   * for client-side failures.
   */
  readonly reason: string | undefined;

  /**
   * @param code error kind
   * @param message human-readable description
   * @param status HTTP status, 0 without a response
   * @param options `cause`: the underlying error, for logs; `reason`: the body's `reason`
   */
  constructor(code: ErrorKind, message: string, status: number, options?: { cause?: unknown; reason?: string }) {
    super(message, options !== undefined && 'cause' in options ? { cause: options.cause } : undefined);
    this.name = 'DsecApiError';
    this.code = code;
    this.status = status;
    this.reason = options?.reason;
  }
}

/** True when `e` is a {@link DsecApiError}, optionally of the given kind. */
export function isDsecApiError(e: unknown, code?: ErrorKind): e is DsecApiError {
  return e instanceof DsecApiError && (code === undefined || e.code === code);
}

/** Methods safe to resend once when a pooled keep-alive socket turns out to be closed. */
const IDEMPOTENT = new Set(['GET', 'HEAD', 'PUT', 'DELETE']);

/**
 * Client of one dsecd. Cheap to keep for the life of a process; safe to use from many
 * concurrent callers (requests run in parallel over pooled connections).
 */
export class DsecClient {
  /** The socket this client talks to. */
  readonly socketPath: string;
  /** Per-request deadline in ms (0 = none); see {@link DsecClientOptions.timeoutMs}. */
  readonly timeoutMs: number;
  private readonly agent: http.Agent;

  /** @param opts socket path and deadline; all optional. */
  constructor(opts: DsecClientOptions = {}) {
    this.socketPath = opts.socketPath || process.env.DSEC_SOCKET || DEFAULT_SOCKET_PATH;
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    // keepAlive: reuse connections across calls (the hot-loop case). Free sockets are
    // unref'd by the agent, so they never keep the process alive.
    this.agent = new http.Agent({ keepAlive: true });
  }

  /** GET /v1/version: the daemon's version. Rejects with `Unavailable` when dsecd is not reachable. */
  version(): Promise<VersionInfo> {
    return this.request<VersionInfo>('GET', '/v1/version');
  }

  /** GET /v1/host: host capabilities, runtime, cgroup layout, uid pool and sandbox counts. */
  hostInfo(): Promise<HostInfo> {
    return this.request<HostInfo>('GET', '/v1/host');
  }

  /**
   * POST /v1/sandboxes: creates a sandbox and resolves when it is running (or failed).
   * Errors: `InvalidArgument` (bad limits, labels, unknown field), `NotFound` (image),
   * `Unimplemented` (backend not built), `ResourceExhausted` (host full). With
   * `opts.onProgress` the create's phases are reported as they begin ({@link CreateProgress}).
   */
  createSandbox(req: CreateSandboxInput = {}, opts: CreateOptions = {}): Promise<Sandbox> {
    if (opts.onProgress) return this.longOperation<Sandbox, CreateProgress>('POST', '/v1/sandboxes', req, opts);
    return this.request<Sandbox>('POST', '/v1/sandboxes', req, opts);
  }

  /**
   * POST /v1/run: runs one command in a fresh environment of any tier and returns its
   * result (the shape of {@link exec}). `backend: "fncall"` runs it on a pre-warmed
   * pooled worker in fresh namespaces (nothing survives the call); `"container"` (the
   * default) creates a sandbox, runs the command and destroys the sandbox. The HTTP
   * deadline is the command's `timeout_ms` plus the client's timeout, none without one.
   * Errors: `InvalidArgument`, `NotFound` (image), `ResourceExhausted` (host full or the
   * fncall queue full), `Unimplemented` (tier not built), `Unavailable`.
   */
  async run(req: RunInput, opts: RequestOptions = {}): Promise<ExecOutput> {
    const deadline = req.timeout_ms !== undefined && this.timeoutMs > 0 ? req.timeout_ms + this.timeoutMs : 0;
    const res = await this.request<ExecResult>('POST', '/v1/run', req, { signal: opts.signal, timeoutMs: opts.timeoutMs ?? deadline });
    return { ...res, stdout: Buffer.from(res.stdout_b64, 'base64'), stderr: Buffer.from(res.stderr_b64, 'base64') };
  }

  /**
   * POST /v1/run:batch: runs up to 1,000 calls concurrently; one entry per call, in
   * order, each either `{ok: true, result}` or `{ok: false, error: {code, message}}`.
   * No HTTP deadline by default. Errors: `InvalidArgument` (a malformed call refuses the batch).
   */
  async runBatch(calls: RunInput[], opts: RequestOptions = {}): Promise<RunBatchEntry[]> {
    const res = await this.request<{ results: RunBatchEntry[] }>('POST', '/v1/run:batch', { calls }, { signal: opts.signal, timeoutMs: opts.timeoutMs ?? 0 });
    return res.results;
  }

  /** GET /v1/sandboxes: sandboxes matching the query (all when empty), as an array. */
  async listSandboxes(q: ListSandboxesQuery = {}): Promise<Sandbox[]> {
    const res = await this.request<{ sandboxes: Sandbox[] }>('GET', '/v1/sandboxes' + query({ selector: q.selector, state: q.state }));
    return res.sandboxes;
  }

  /** GET /v1/sandboxes/{id}. Errors: `NotFound`. */
  getSandbox(id: string): Promise<Sandbox> {
    return this.request<Sandbox>('GET', sandboxPath(id));
  }

  /**
   * DELETE /v1/sandboxes/{id}: destroys the sandbox; resolves with it in state `destroyed`.
   * Errors: `NotFound`; `Conflict`/`FailedPrecondition` when running and not `force`.
   */
  deleteSandbox(id: string, opts: DeleteSandboxOptions = {}): Promise<Sandbox> {
    return this.request<Sandbox>('DELETE', sandboxPath(id) + query({ force: opts.force ? 'true' : undefined }));
  }

  /**
   * POST /v1/sandboxes/{id}/stop: stops the sandbox's processes (SIGTERM, then SIGKILL
   * after the grace period; the writable layer stays); resolves with it stopped. The body
   * `{timeout_ms}` is sent only when `opts.timeoutMs` is given (dsecd's default grace is
   * 10 s; `0` kills at once). The HTTP deadline is the grace plus the client's `timeoutMs`.
   * Errors: `NotFound`, `FailedPrecondition` (not running), `InvalidArgument` (grace out of range).
   */
  stopSandbox(id: string, opts: StopSandboxOptions = {}): Promise<Sandbox> {
    if (opts.timeoutMs === undefined) return this.request<Sandbox>('POST', sandboxPath(id) + '/stop', undefined, { signal: opts.signal });
    const deadline = this.timeoutMs > 0 ? opts.timeoutMs + this.timeoutMs : 0;
    return this.request<Sandbox>('POST', sandboxPath(id) + '/stop', { timeout_ms: opts.timeoutMs }, { signal: opts.signal, timeoutMs: deadline });
  }

  /** GET /v1/sandboxes/{id}/network: mode, effective rules, address, resolved hosts, egress denials. Errors: `NotFound`. */
  getNetwork(id: string): Promise<SandboxNetwork> {
    return this.request<SandboxNetwork>('GET', sandboxPath(id) + '/network');
  }

  /**
   * PUT /v1/sandboxes/{id}/network: changes a sandbox's network; a running sandbox gets
   * it at once. Errors: `InvalidArgument` (bad rules, unknown policy), `NotFound`,
   * `FailedPrecondition` (between none and allow/open, or networking unavailable).
   */
  setNetwork(id: string, network: NetworkInput): Promise<SandboxNetwork> {
    return this.request<SandboxNetwork>('PUT', sandboxPath(id) + '/network', network);
  }

  /** GET /v1/network/policies: the loaded network policies. */
  async listNetworkPolicies(): Promise<NetworkPolicy[]> {
    return (await this.request<{ policies: NetworkPolicy[] }>('GET', '/v1/network/policies')).policies;
  }

  /**
   * POST /v1/network/policies/reload: reloads the policy files, all or nothing.
   * Errors: `InvalidArgument` naming each malformed file and field (the loaded policies stay in force).
   */
  reloadNetworkPolicies(): Promise<PolicyReloadResult> {
    return this.request<PolicyReloadResult>('POST', '/v1/network/policies/reload');
  }

  /** GET /v1/security/seccomp: the seccomp profile in force. */
  seccompProfile(): Promise<SeccompProfileInfo> {
    return this.request<SeccompProfileInfo>('GET', '/v1/security/seccomp');
  }

  /**
   * POST /v1/security/seccomp/reload: loads the seccomp profile file again (new creates
   * and starts get it). Errors: `InvalidArgument` naming the file and field (the profile
   * in force stays).
   */
  reloadSeccompProfile(): Promise<SeccompProfileInfo> {
    return this.request<SeccompProfileInfo>('POST', '/v1/security/seccomp/reload');
  }

  /** POST /v1/sandboxes/{id}/start: starts a stopped sandbox; resolves with it running. Errors: `NotFound`, `Conflict`. */
  startSandbox(id: string): Promise<Sandbox> {
    return this.request<Sandbox>('POST', sandboxPath(id) + '/start');
  }

  /**
   * POST /v1/sandboxes/{id}/pause: freezes every process of a running sandbox (cgroup
   * freezer) and reclaims its memory; resolves with the paused sandbox and what was
   * reclaimed. Without swap only page cache can go: anonymous memory stays resident
   * (`reclaim.swap` false, `reclaim.anon_bytes`). Safe to call twice: pausing a paused
   * sandbox resolves with `reclaim: null`.
   * Errors: `NotFound`, `FailedPrecondition` (not running, e.g. stopped).
   */
  pauseSandbox(id: string): Promise<PauseResult> {
    return this.request<PauseResult>('POST', sandboxPath(id) + '/pause');
  }

  /**
   * POST /v1/sandboxes/{id}/resume: thaws a paused sandbox exactly where it stopped
   * (processes, open files, sockets); resolves with it running. Safe to call twice:
   * resuming a running sandbox resolves with it unchanged.
   * Errors: `NotFound`, `FailedPrecondition` (neither paused nor running).
   */
  resumeSandbox(id: string): Promise<Sandbox> {
    return this.request<Sandbox>('POST', sandboxPath(id) + '/resume');
  }

  /**
   * POST /v1/sandboxes/bulk: applies `req.action` to every sandbox whose labels match
   * `req.selector` (dsecd works through them 8 at a time) and resolves with one result
   * per matched sandbox, in no promised order; an empty array when nothing matched. One
   * sandbox failing does not stop the others, and is not a rejection: check `ok` of each.
   * `destroy` destroys running sandboxes too (as `deleteSandbox` with `force`).
   * `set_ttl` sets `ttl_s` counted **from each sandbox's creation** (a TTL already past
   * destroys it at dsecd's next sweep), or removes it with `ttl_s: null`.
   *
   * No HTTP deadline unless `opts.timeoutMs` is given: a bulk stop or pause of many
   * sandboxes legitimately takes long. Aborting `opts.signal` stops waiting; dsecd still
   * finishes the action. Not retried on a dropped connection (it is not idempotent).
   * Errors: `InvalidArgument` (empty or malformed selector, `ttl_s` out of range).
   */
  async bulk(req: BulkInput, opts: RequestOptions = {}): Promise<BulkResult[]> {
    const res = await this.request<{ results: BulkResult[] }>('POST', '/v1/sandboxes/bulk', req, { signal: opts.signal, timeoutMs: opts.timeoutMs ?? 0 });
    return res.results;
  }

  /**
   * POST /v1/leases: creates the lease of `job` (the job's sandboxes carry label
   * `job=<job>`), or renews it if it exists, so that it expires `ttlS` seconds from now.
   * When a lease lapses dsecd pauses the job's sandboxes, and destroys them its
   * `destroy_grace_s` later. Resolves with the lease.
   * Errors: `InvalidArgument` (job not a label value `[A-Za-z0-9._/-]{1,63}`, `ttlS` not
   * 1 s to 30 days), `FailedPrecondition` (the lease exists and has expired: delete it
   * with {@link DsecClient.deleteLease} and create it again).
   */
  putLease(job: string, ttlS: number): Promise<Lease> {
    return this.request<Lease>('POST', '/v1/leases', { job, ttl_s: ttlS });
  }

  /**
   * POST /v1/leases/{job}/renew: the heartbeat. Extends an existing lease to expire
   * `opts.ttlS` (default its current `ttl_s`) seconds from now. Accepted only strictly
   * before `expires_at`: a renewal racing the expiry either wins or is refused, never
   * half-applied. Resolves with the lease.
   * Errors: `NotFound` (no lease: create one with {@link DsecClient.putLease}),
   * `FailedPrecondition` (expired: its sandboxes are paused and will be destroyed; delete
   * the lease and create a new one), `InvalidArgument` (`ttlS` out of range).
   */
  renewLease(job: string, opts: RenewLeaseOptions = {}): Promise<Lease> {
    return this.request<Lease>('POST', leasePath(job) + '/renew', opts.ttlS === undefined ? {} : { ttl_s: opts.ttlS });
  }

  /** GET /v1/leases: every lease, by job, as an array. */
  async listLeases(): Promise<Lease[]> {
    const res = await this.request<{ leases: Lease[] }>('GET', '/v1/leases');
    return res.leases;
  }

  /** GET /v1/leases/{job}: one lease. Errors: `NotFound`. */
  getLease(job: string): Promise<Lease> {
    return this.request<Lease>('GET', leasePath(job));
  }

  /**
   * DELETE /v1/leases/{job}: deletes the lease and resolves with it as it was. The job's
   * sandboxes stay as they are (a lapsed job's paused sandboxes are then no longer
   * destroyed by the lease). Errors: `NotFound`.
   */
  deleteLease(job: string): Promise<Lease> {
    return this.request<Lease>('DELETE', leasePath(job));
  }

  /**
   * POST /v1/sandboxes/{id}/exec: runs a command to completion and returns its status and
   * output. A command that fails is not an error: look at `exit_code` (127 not found,
   * 126 not executable), `signal`, `timed_out`, `oom` (the command itself was OOM-killed)
   * and `oom_kills` (OOM kills of any process in the sandbox while it ran, e.g. a stage of
   * its pipeline; null when the backend cannot see them). Output is capped at dsecd's
   * `max_output_bytes` per stream; for uncapped output start a paced session
   * ({@link startExec} with `paced: true`) and attach to it. The HTTP deadline is the
   * command's `timeoutMs` plus the client's `timeoutMs`; without a command timeout there
   * is no HTTP deadline (the command may legitimately run long).
   *
   * With `trajectory` and `step` the command is recorded as that step (docs/TRAJECTORIES.md):
   * a rerun of a finished step with the same request resolves with the recorded result
   * and `replayed: true` (nothing runs); the result also names its `trajectory` and `step`.
   * Refusals carry a {@link DsecApiError.reason}: `Conflict` with `outcome_unknown` (the
   * step started and never finished: whether it took effect is unknown), `step_mismatch`
   * (the step is recorded with another request), `out_of_order` (a later step is
   * recorded) or `in_progress` (running now); pass `truncate` to discard the step and the
   * later ones and run it. `FailedPrecondition` with `trajectory_removed`: the id was
   * removed and stays reserved; use a new one. A replay is answered in any sandbox state.
   * Errors: `NotFound`, `FailedPrecondition` (sandbox not running), `InvalidArgument`
   * (including `trajectory` without `step`, or `truncate` without both), `Conflict`.
   */
  async exec(id: string, req: ExecOptions): Promise<ExecOutput> {
    const body: Record<string, unknown> = { argv: req.argv };
    if (req.env !== undefined) body.env = req.env;
    if (req.cwd !== undefined) body.cwd = req.cwd;
    if (req.user !== undefined) body.user = req.user;
    if (req.stdin !== undefined) {
      const bytes = typeof req.stdin === 'string' ? Buffer.from(req.stdin, 'utf8') : Buffer.from(req.stdin.buffer, req.stdin.byteOffset, req.stdin.byteLength);
      body.stdin_b64 = bytes.toString('base64');
    }
    if (req.timeoutMs !== undefined) body.timeout_ms = req.timeoutMs;
    if (req.trajectory !== undefined) body.trajectory = req.trajectory;
    if (req.step !== undefined) body.step = req.step;
    if (req.truncate !== undefined) body.truncate = req.truncate;
    const deadline = req.timeoutMs !== undefined && this.timeoutMs > 0 ? req.timeoutMs + this.timeoutMs : 0;
    const res = await this.request<ExecResult>('POST', sandboxPath(id) + '/exec', body, { signal: req.signal, timeoutMs: deadline });
    return { ...res, stdout: Buffer.from(res.stdout_b64, 'base64'), stderr: Buffer.from(res.stderr_b64, 'base64') };
  }

  /**
   * POST /v1/sandboxes/{id}/execs: starts an exec session and resolves with its ExecInfo
   * once the program started (or failed to: see `error`, `exit_code` 127/126). The
   * session runs until its command exits, whoever is connected; read its output with
   * {@link execOutput} or {@link attachExec}. Errors: `NotFound`, `FailedPrecondition`
   * (sandbox not running), `InvalidArgument`, `Unavailable` (agent unreachable).
   */
  startExec(id: string, req: StartExecOptions): Promise<ExecInfo> {
    const body: Record<string, unknown> = { argv: req.argv };
    if (req.env !== undefined) body.env = req.env;
    if (req.cwd !== undefined) body.cwd = req.cwd;
    if (req.user !== undefined) body.user = req.user;
    if (req.stdin !== undefined) body.stdin = req.stdin;
    if (req.tty !== undefined) body.tty = { rows: req.tty.rows, cols: req.tty.cols };
    if (req.timeoutMs !== undefined) body.timeout_ms = req.timeoutMs;
    if (req.paced !== undefined) body.paced = req.paced;
    return this.request<ExecInfo>('POST', execsPath(id), body, { signal: req.signal });
  }

  /** GET /v1/sandboxes/{id}/execs: the caller's exec sessions in the sandbox (running, and exited ones dsecd still keeps). Errors: `NotFound`. */
  async listExecs(id: string): Promise<ExecInfo[]> {
    return (await this.request<{ execs: ExecInfo[] }>('GET', execsPath(id))).execs;
  }

  /** GET /v1/sandboxes/{id}/execs/{exec_id}: one session. Errors: `NotFound` (unknown, forgotten, or another user's). */
  getExec(id: string, execId: string): Promise<ExecInfo> {
    return this.request<ExecInfo>('GET', execPath(id, execId));
  }

  /**
   * GET .../execs/{exec_id}/output: one output stream as raw bytes from `offset`, as a
   * Readable (it streams with backpressure; nothing is buffered here). With `follow` it
   * ends when the command ends. Resolves once dsecd answered; errors: `NotFound`,
   * `InvalidArgument`; a dropped connection is an `error` event on the Readable.
   */
  async execOutput(id: string, execId: string, q: ExecOutputQuery = {}): Promise<Readable> {
    const qs = query({ stream: q.stream, offset: q.offset === undefined ? undefined : String(q.offset), follow: q.follow ? 'true' : undefined });
    return this.openStream('GET', execPath(id, execId) + '/output' + qs, q.signal);
  }

  /**
   * POST .../execs/{exec_id}/stdin: writes `data` (bytes, or a Readable streamed with
   * backpressure) to the command's stdin, then closes it when `eof`. Errors: `NotFound`,
   * `FailedPrecondition` (started without stdin); a failing Readable rejects with its own error.
   */
  async writeExecStdin(id: string, execId: string, data: Buffer | Uint8Array | Readable, opts: WriteStdinOptions = {}): Promise<void> {
    await this.upload('POST', execPath(id, execId) + '/stdin' + query({ eof: opts.eof ? 'true' : undefined }), data, OCTET_STREAM, opts.signal);
  }

  /** POST .../execs/{exec_id}/signal: sends `signal` (`SIGTERM`, `TERM` or a number) to the command's process group; resolves with the ExecInfo. Errors: `NotFound`, `InvalidArgument`. */
  signalExec(id: string, execId: string, signal: string | number): Promise<ExecInfo> {
    return this.request<ExecInfo>('POST', execPath(id, execId) + '/signal', { signal });
  }

  /** POST .../execs/{exec_id}/resize: resizes the PTY of a tty session. Errors: `NotFound`, `InvalidArgument` (no tty, size out of 1..1000). */
  resizeExec(id: string, execId: string, rows: number, cols: number): Promise<ExecInfo> {
    return this.request<ExecInfo>('POST', execPath(id, execId) + '/resize', { rows, cols });
  }

  /**
   * POST .../execs/{exec_id}/wait: resolves with the ExecInfo once the command has ended.
   * With `timeoutMs`, dsecd gives up after that long (`DeadlineExceeded`; the command
   * keeps running). No HTTP deadline beyond it. Errors: `NotFound`, `DeadlineExceeded`.
   */
  waitExec(id: string, execId: string, opts: WaitExecOptions = {}): Promise<ExecInfo> {
    const qs = query({ timeout_ms: opts.timeoutMs === undefined ? undefined : String(opts.timeoutMs) });
    const deadline = opts.timeoutMs !== undefined && this.timeoutMs > 0 ? opts.timeoutMs + this.timeoutMs : 0;
    return this.request<ExecInfo>('POST', execPath(id, execId) + '/wait' + qs, undefined, { signal: opts.signal, timeoutMs: deadline });
  }

  /** DELETE .../execs/{exec_id}: kills the command if it runs and forgets the session and its output; resolves with its last ExecInfo. Errors: `NotFound`. */
  removeExec(id: string, execId: string): Promise<ExecInfo> {
    return this.request<ExecInfo>('DELETE', execPath(id, execId));
  }

  /**
   * Attaches to an exec session over a WebSocket (GET .../execs/{exec_id}/attach): returns
   * at once an {@link ExecAttachment} emitting `stdout`/`stderr` chunks and `exit` (the
   * final ExecInfo), with `write(bytes)`, `eof()`, `resize(rows, cols)`, `signal(name)` and
   * `close()`; `opened` and `done` are its promises (see sdk/attach.ts). Output dsecd kept
   * is replayed from `stdoutOffset`/`stderrOffset` (default 0). With `killOnDetach` the
   * command is killed when the connection closes before it ends.
   * Errors (on `done`): `NotFound`, `FailedPrecondition` (stdin written to a session started
   * without it), `Unavailable` (socket unreachable, connection dropped).
   */
  attachExec(id: string, execId: string, opts: AttachExecOptions = {}): ExecAttachmentHandle {
    const qs = query({
      stdout_offset: opts.stdoutOffset ? String(opts.stdoutOffset) : undefined,
      stderr_offset: opts.stderrOffset ? String(opts.stderrOffset) : undefined,
      kill_on_detach: opts.killOnDetach === undefined ? undefined : String(opts.killOnDetach),
    });
    const path = execPath(id, execId) + '/attach' + qs;
    return new ExecAttachment<ExecInfo>(
      `ws+unix://${this.socketPath}:${path}`,
      {
        response: (status, body) => errorFromResponse(status, body),
        connection: (err) => this.connectionError(err, 'GET', path),
        kind: (code, message, status) => new DsecApiError(code, message, status),
      },
      opts.signal,
    );
  }

  /**
   * WebSocket to the serial console of a vm sandbox (GET /v1/sandboxes/{id}/console,
   * daemon/api/routes/console.ts): `stdout` events carry console output, `write()` sends
   * input to the guest, `done` resolves with `{ reason }` when the console ends (the VM
   * stopped), `null` after {@link ExecAttachment.close} (detach). `tailLines` replays the
   * last lines of the console log first (as `tail -n` counts them), `tailBytes` its last
   * bytes (give one). Errors: `NotFound`, `FailedPrecondition` (not a vm sandbox, or not
   * running), `InvalidArgument` (both tails), `Unavailable`.
   */
  attachConsole(id: string, opts: { tailLines?: number; tailBytes?: number; signal?: AbortSignal } = {}): ConsoleAttachmentHandle {
    const path = sandboxPath(id) + '/console' + query({
      tail_bytes: opts.tailBytes ? String(opts.tailBytes) : undefined,
      tail_lines: opts.tailLines ? String(opts.tailLines) : undefined,
    });
    return new ExecAttachment<ConsoleEnd>(
      `ws+unix://${this.socketPath}:${path}`,
      {
        response: (status, body) => errorFromResponse(status, body),
        connection: (err) => this.connectionError(err, 'GET', path),
        kind: (code, message, status) => new DsecApiError(code, message, status),
      },
      opts.signal,
    );
  }

  /** GET /v1/sandboxes/{id}/console/log: the serial console log of a vm sandbox (raw bytes). Errors: `NotFound`, `FailedPrecondition`. */
  async consoleLog(id: string): Promise<Buffer> {
    const parts: Buffer[] = [];
    for await (const c of await this.openStream('GET', sandboxPath(id) + '/console/log')) parts.push(Buffer.from(c as Buffer));
    return Buffer.concat(parts);
  }

  /** GET /v1/stats: resource usage of every sandbox and the host's totals (cores, memory, load). */
  stats(): Promise<StatsResponse> {
    return this.request<StatsResponse>('GET', '/v1/stats');
  }

  /** GET /v1/sandboxes/{id}/stats: resource usage of one sandbox. Errors: `NotFound`. */
  sandboxStats(id: string): Promise<SandboxStats> {
    return this.request<SandboxStats>('GET', sandboxPath(id) + '/stats');
  }

  /**
   * GET /v1/sandboxes/{id}/files: the file at `path` (absolute, inside the sandbox) as a
   * Readable of its raw bytes, streamed. Errors: `NotFound`, `FailedPrecondition` (a
   * directory: use {@link getArchive}), `InvalidArgument`.
   */
  readFile(id: string, path: string, opts: FileOptions = {}): Promise<Readable> {
    return this.openStream('GET', sandboxPath(id) + '/files' + query({ path, user: opts.user }), opts.signal);
  }

  /**
   * PUT /v1/sandboxes/{id}/files: writes `data` (bytes, or a Readable streamed with
   * backpressure, never buffered whole) to `path`, replacing it. `parents` creates
   * missing directories; `mode` sets the permission bits. Errors: `NotFound` (parent
   * missing), `FailedPrecondition` (path is a directory), `InvalidArgument`; a failing
   * Readable rejects with its own error.
   */
  async writeFile(id: string, path: string, data: Buffer | Uint8Array | Readable, opts: WriteFileOptions = {}): Promise<WriteFileResult> {
    const qs = query({ path, mode: opts.mode === undefined ? undefined : formatMode(opts.mode), user: opts.user, parents: opts.parents ? 'true' : undefined });
    return this.upload<WriteFileResult>('PUT', sandboxPath(id) + '/files' + qs, data, OCTET_STREAM, opts.signal);
  }

  /**
   * GET /v1/sandboxes/{id}/files/stat: what is at `path`, following a final symlink
   * (with `nofollow`: the symlink itself, `type` `symlink` and its `target`). Errors: `NotFound`.
   */
  statFile(id: string, path: string, opts: StatFileOptions = {}): Promise<FileStat> {
    return this.request<FileStat>('GET', sandboxPath(id) + '/files/stat' + query({ path, user: opts.user, nofollow: opts.nofollow ? 'true' : undefined }), undefined, { signal: opts.signal });
  }

  /**
   * GET /v1/sandboxes/{id}/archive: a tar stream of `path` (a file or a whole directory
   * tree), members named relative to its parent (`docker cp` semantics: the archive of
   * `/a/b` holds `b/...`). A symlink at `path` is archived as a symlink, or with `follow`
   * as what it points to. Streamed, never buffered. Errors: `NotFound`.
   */
  getArchive(id: string, path: string, opts: ArchiveOptions = {}): Promise<Readable> {
    return this.openStream('GET', sandboxPath(id) + '/archive' + query({ path, user: opts.user, follow: opts.follow ? 'true' : undefined }), opts.signal);
  }

  /**
   * PUT /v1/sandboxes/{id}/archive: extracts the tar stream `tar` into the directory
   * `dir` (which must exist), streamed with backpressure. Errors: `NotFound` (dir),
   * `FailedPrecondition` (not a directory), `InvalidArgument` (a malformed archive or an
   * unsafe member); a failing Readable rejects with its own error.
   */
  putArchive(id: string, dir: string, tar: Readable | Buffer, opts: FileOptions = {}): Promise<PutArchiveResult> {
    return this.upload<PutArchiveResult>('PUT', sandboxPath(id) + '/archive' + query({ path: dir, user: opts.user }), tar, TAR_TYPE, opts.signal);
  }

  /** GET /v1/images: the images the daemon can create sandboxes from, as an array. */
  async listImages(): Promise<Image[]> {
    const res = await this.request<{ images: Image[] }>('GET', '/v1/images');
    return res.images;
  }

  /**
   * GET /v1/images/{ref}: one image; `ref` is `name[:tag]` (tag default `latest`) and is
   * URL-encoded here (a `/` in the name is fine). Errors: `NotFound`, `InvalidArgument`
   * (malformed ref).
   */
  getImage(ref: string): Promise<Image> {
    return this.request<Image>('GET', imagePath(ref));
  }

  /**
   * DELETE /v1/images/{ref}: removes the image manifest and resolves with the image as it
   * was. Its layers stay in the store until {@link pruneImages}. Errors: `NotFound`.
   */
  removeImage(ref: string): Promise<Image> {
    return this.request<Image>('DELETE', imagePath(ref));
  }

  /**
   * POST /v1/images: makes an image from layers already in the store (no data copied).
   * Errors: `InvalidArgument` (malformed ref or digest, empty `layers`), `NotFound`
   * (a layer or the `from` image).
   */
  composeImage(req: ComposeImageInput): Promise<Image> {
    return this.request<Image>('POST', '/v1/images', req);
  }

  /**
   * POST /v1/images/{ref}/tag: gives image `ref` the additional name `target`
   * (`name[:tag]`); resolves with the new image. Errors: `NotFound`, `InvalidArgument`.
   */
  tagImage(ref: string, target: string): Promise<Image> {
    return this.request<Image>('POST', imagePath(ref) + '/tag', { target });
  }

  /**
   * GET /v1/templates: the E2B template aliases (name -> image and backend) and the
   * built-in `base` when no alias replaces it (docs/E2B.md). Errors: `Unimplemented`
   * when the daemon's E2B front is off.
   */
  async listTemplates(): Promise<E2bTemplate[]> {
    return (await this.request<{ templates: E2bTemplate[] }>('GET', '/v1/templates')).templates;
  }

  /**
   * PUT /v1/templates/{name}: makes `name` an E2B template for `image` on `backend`
   * (default container), replacing an alias of that name (admin only). Errors:
   * `InvalidArgument` (malformed name), `NotFound` (no such image), `PermissionDenied`.
   */
  setTemplate(name: string, image: string, backend?: Backend): Promise<E2bTemplate> {
    return this.request<E2bTemplate>('PUT', `/v1/templates/${encodeURIComponent(name)}`, { image, ...(backend ? { backend } : {}) });
  }

  /** DELETE /v1/templates/{name}: removes an alias (admin only); resolves with what it was. Errors: `NotFound`. */
  removeTemplate(name: string): Promise<E2bTemplate> {
    return this.request<E2bTemplate>('DELETE', `/v1/templates/${encodeURIComponent(name)}`);
  }

  /**
   * POST /v1/images/import: builds an image from a directory (`type: 'dir'`), a root
   * filesystem tar (`tar`) or an OCI layout / docker save archive (`oci`) at `req.path`,
   * an absolute path read by dsecd on its own host. Streams progress
   * (`Accept: application/x-ndjson`): `opts.onProgress` is called per progress line, and
   * the promise resolves with the new image. No HTTP deadline: a large import takes
   * minutes; use `opts.signal` to stop waiting.
   * Errors: `InvalidArgument` (bad request, unreadable archive), `NotFound` (path or base
   * image), any kind dsecd reports on its error line; `Unavailable` when the connection
   * drops (the import may still finish on dsecd).
   */
  importImage(req: ImportImageInput, opts: LongOperationOptions = {}): Promise<Image> {
    return this.longOperation<Image>('POST', '/v1/images/import', req, opts);
  }

  /**
   * POST /v1/images/bootstrap: builds the Debian base image with debootstrap on dsecd's
   * host (minutes on a cache miss). Progress, deadline and errors as for
   * {@link importImage}; `Unavailable` also when dsecd cannot run debootstrap or reach
   * the mirror.
   */
  bootstrapImage(req: BootstrapImageInput = { distro: 'debian' }, opts: LongOperationOptions = {}): Promise<Image> {
    return this.longOperation<Image>('POST', '/v1/images/bootstrap', req, opts);
  }

  /**
   * POST /v1/images/prune: removes layers no image, lease or sandbox references (layers
   * younger than the daemon's grace period are kept and listed in `kept_young`), and
   * leftover temporary files. With `dryRun` nothing is removed.
   */
  pruneImages(opts: PruneOptions = {}): Promise<PruneResult> {
    return this.request<PruneResult>('POST', '/v1/images/prune', opts.dryRun === undefined ? {} : { dry_run: opts.dryRun });
  }

  /** GET /v1/layers: every layer in the store, as an array. */
  async listLayers(): Promise<Layer[]> {
    const res = await this.request<{ layers: Layer[] }>('GET', '/v1/layers');
    return res.layers;
  }

  /** GET /v1/layers/{digest}: one layer; `digest` is the full `sha256:<64 hex>`. Errors: `NotFound`, `InvalidArgument`. */
  getLayer(digest: string): Promise<Layer> {
    return this.request<Layer>('GET', `/v1/layers/${encodeURIComponent(digest)}`);
  }

  /**
   * POST /v1/sandboxes/{id}/commit: packs the sandbox's writable layer (after stripping
   * secrets, caches and `exclude` globs) as a new layer on top of its image, and names the
   * result `opts.image`. No HTTP deadline: packing a large writable layer takes a while.
   * Errors: `NotFound` (sandbox), `FailedPrecondition` (sandbox in a state that cannot be
   * committed), `InvalidArgument` (malformed name or glob).
   */
  commit(id: string, opts: CommitOptions): Promise<CommitResult> {
    const body: Record<string, unknown> = { image: opts.image };
    if (opts.exclude !== undefined) body.exclude = opts.exclude;
    if (opts.security !== undefined) body.security = opts.security;
    return this.request<CommitResult>('POST', sandboxPath(id) + '/commit', body, { signal: opts.signal, timeoutMs: 0 });
  }

  /**
   * POST /v1/sandboxes/{id}/snapshot: captures the sandbox's writable layer (unstripped)
   * as a snapshot to restore or fork from, named `opts.name` when given. A running
   * sandbox is frozen while its layer is copied and thawed afterwards. No HTTP deadline:
   * packing a large writable layer takes a while.
   * Errors: `NotFound` (sandbox), `AlreadyExists` (name taken), `InvalidArgument`
   * (malformed name), `FailedPrecondition` (sandbox in a state that cannot be
   * snapshotted), `Unimplemented` (`process` on a host without a working CRIU).
   */
  snapshot(id: string, opts: SnapshotOptions = {}): Promise<Snapshot> {
    const body: Record<string, unknown> = {};
    if (opts.name !== undefined) body.name = opts.name;
    if (opts.process !== undefined) body.process = opts.process;
    return this.request<Snapshot>('POST', sandboxPath(id) + '/snapshot', body, { signal: opts.signal, timeoutMs: 0 });
  }

  /** GET /v1/snapshots: every snapshot on this host, oldest first, as an array. */
  async listSnapshots(): Promise<Snapshot[]> {
    return (await this.request<{ snapshots: Snapshot[] }>('GET', '/v1/snapshots')).snapshots;
  }

  /** GET /v1/snapshots/{ref}: one snapshot; `ref` is its id (`snap-<16 hex>`) or name. Errors: `NotFound`. */
  getSnapshot(ref: string): Promise<Snapshot> {
    return this.request<Snapshot>('GET', snapshotPath(ref));
  }

  /**
   * DELETE /v1/snapshots/{ref}: removes the snapshot and resolves with it as it was;
   * sandboxes restored or forked from it keep running. Errors: `NotFound`.
   */
  deleteSnapshot(ref: string): Promise<Snapshot> {
    return this.request<Snapshot>('DELETE', snapshotPath(ref));
  }

  /**
   * POST /v1/snapshots/{ref}/restore: creates one sandbox from the snapshot (its image
   * layers plus the snapshot layer) and resolves when it is running (or failed), like
   * {@link createSandbox}. Fields of `req` left out default to the source sandbox's.
   * Errors: `NotFound` (snapshot, or a layer of it missing), `FailedPrecondition` (a
   * layer or the machine state of it corrupt, or a machine state this host's QEMU cannot
   * load), `InvalidArgument` (bad overrides; `memory_bytes` or `cpus` other than a `vm`
   * snapshot's machine), `ResourceExhausted` (host full). `opts.onProgress`: as for
   * {@link createSandbox}.
   */
  restore(ref: string, req: RestoreInput = {}, opts: CreateOptions = {}): Promise<Sandbox> {
    if (opts.onProgress) return this.longOperation<Sandbox, CreateProgress>('POST', snapshotPath(ref) + '/restore', req, opts);
    return this.request<Sandbox>('POST', snapshotPath(ref) + '/restore', req, opts);
  }

  /**
   * POST /v1/snapshots/{ref}/fork: creates `req.count` sandboxes (1-256; a larger group
   * is several calls) from the snapshot, each with the overrides of `req`, and resolves
   * with them, running, in creation order. All or nothing: if one cannot be created,
   * none is left. No HTTP deadline unless `opts.timeoutMs` is given: a large group
   * legitimately takes long. Not retried on a dropped connection.
   * Errors: as {@link restore}; `InvalidArgument` also for `count` out of range,
   * `ResourceExhausted` when the host cannot fit the whole group. `opts.onProgress`
   * hears the phases of every sandbox of the group (each report names its sandbox).
   */
  async fork(ref: string, req: ForkInput, opts: CreateOptions = {}): Promise<Sandbox[]> {
    const res = opts.onProgress
      ? await this.longOperation<{ sandboxes: Sandbox[] }, CreateProgress>('POST', snapshotPath(ref) + '/fork', req, opts)
      : await this.request<{ sandboxes: Sandbox[] }>('POST', snapshotPath(ref) + '/fork', req, { signal: opts.signal, timeoutMs: opts.timeoutMs ?? 0 });
    return res.sandboxes;
  }

  /** GET /v1/trajectories: the summary of every trajectory this dsecd holds, most recently updated first, as an array. */
  async listTrajectories(): Promise<TrajectorySummary[]> {
    return (await this.request<{ trajectories: TrajectorySummary[] }>('GET', '/v1/trajectories')).trajectories;
  }

  /** GET /v1/trajectories/{id}: the summary and every step (without output), in step order. Errors: `NotFound`. */
  getTrajectory(id: string): Promise<TrajectoryDetail> {
    return this.request<TrajectoryDetail>('GET', trajectoryPath(id));
  }

  /**
   * GET /v1/trajectories/{id}/export: every step with its request and recorded output,
   * in step order, as an async iterable of {@link TrajectoryRecord} (NDJSON on the wire,
   * streamed: a long trajectory is never held whole here). It ends after the last step;
   * `signal` or a `break` closes the connection (iteration then ends normally).
   * Errors: `NotFound` when opening; a malformed line is `Internal`; a dropped connection
   * is `Unavailable`.
   */
  async *exportTrajectory(id: string, opts: ExportTrajectoryOptions = {}): AsyncGenerator<TrajectoryRecord, void, undefined> {
    const signal = opts.signal;
    if (signal?.aborted) return;
    let res: http.IncomingMessage;
    try {
      res = await this.openStream('GET', trajectoryPath(id) + '/export', signal);
    } catch (e) {
      if (signal?.aborted) return;
      throw e;
    }
    try {
      for await (const line of ndjsonLines(res)) yield parseRecordLine(line, id);
    } catch (e) {
      if (signal?.aborted) return;
      if (e instanceof DsecApiError) throw e;
      throw new DsecApiError('Unavailable', `export of trajectory ${id} from dsecd at ${this.socketPath} broke: ${errMessage(e)}`, 0, { cause: e });
    } finally {
      res.destroy();
    }
  }

  /**
   * DELETE /v1/trajectories/{id}: discards the trajectory's recorded steps and resolves
   * with how many. The id stays reserved: an exec re-using it is refused
   * (`FailedPrecondition`, reason `trajectory_removed`) rather than run steps again.
   * Errors: `NotFound` (unknown or already removed), `Conflict` with reason
   * `in_progress` (a step of it is running now).
   */
  deleteTrajectory(id: string): Promise<TrajectoryRemoved> {
    return this.request<TrajectoryRemoved>('DELETE', trajectoryPath(id));
  }

  /**
   * GET /v1/events: sandbox lifecycle events, oldest first, as an async iterable. Without
   * `follow` it ends after the recorded events; with it, it stays open until `signal`
   * aborts (iteration then ends normally) or the consumer stops iterating (`break`), which
   * closes the connection. Lines are NDJSON; a line split across reads is reassembled.
   * Errors: as for any call when opening; a malformed line is `Internal`; a dropped
   * connection is `Unavailable`.
   */
  async *events(q: EventsQuery = {}): AsyncGenerator<Event, void, undefined> {
    const path =
      '/v1/events' +
      query({ selector: q.selector, follow: q.follow ? 'true' : undefined, since: q.since === undefined ? undefined : String(q.since) });
    const signal = q.signal;
    if (signal?.aborted) return;
    let res: http.IncomingMessage;
    try {
      res = await this.open('GET', path, undefined, signal, 0, 0, true);
    } catch (e) {
      if (signal?.aborted) return;
      throw e;
    }
    if (res.statusCode! >= 400) {
      throw errorFromResponse(res.statusCode!, await readBody(res));
    }
    try {
      for await (const line of ndjsonLines(res)) yield parseEventLine(line);
    } catch (e) {
      if (signal?.aborted) return;
      if (e instanceof DsecApiError) throw e;
      throw new DsecApiError('Unavailable', `event stream from dsecd at ${this.socketPath} broke: ${errMessage(e)}`, 0, { cause: e });
    } finally {
      res.destroy();
    }
  }

  /**
   * GET /v1/sandboxes/{id}/logs: the sandbox's lifecycle and exec history, then its agent
   * log, as text lines (without their newline). Without `follow` it ends after what is
   * recorded; with it, it stays open until `signal` aborts (iteration then ends normally),
   * the consumer stops iterating, or the sandbox is destroyed. Errors: `NotFound` when
   * opening; a dropped connection is `Unavailable`.
   */
  async *logs(id: string, opts: LogsOptions = {}): AsyncGenerator<string, void, undefined> {
    const signal = opts.signal;
    if (signal?.aborted) return;
    let res: http.IncomingMessage;
    try {
      res = await this.openStream('GET', sandboxPath(id) + '/logs' + query({ follow: opts.follow ? 'true' : undefined }), signal);
    } catch (e) {
      if (signal?.aborted) return;
      throw e;
    }
    try {
      for await (const line of textLines(res)) yield line;
    } catch (e) {
      if (signal?.aborted) return;
      if (e instanceof DsecApiError) throw e;
      throw new DsecApiError('Unavailable', `log stream from dsecd at ${this.socketPath} broke: ${errMessage(e)}`, 0, { cause: e });
    } finally {
      res.destroy();
    }
  }

  /**
   * Opens a streamed download: resolves with the response (a Readable of the raw body)
   * once dsecd answered 2xx, or rejects with the error of its answer. No deadline (a
   * transfer takes as long as it takes); `signal` destroys the stream.
   */
  private async openStream(method: string, path: string, signal?: AbortSignal): Promise<http.IncomingMessage> {
    const res = await this.open(method, path, undefined, signal, 0, 0, IDEMPOTENT.has(method), '*/*');
    const status = res.statusCode ?? 0;
    if (status < 200 || status >= 300) {
      let text = '';
      try {
        text = await readBody(res);
      } catch {
        // The error body is a nicety; the status alone still says what failed.
      }
      throw errorFromResponse(status, text);
    }
    return res;
  }

  /**
   * Sends `body` (bytes, or a Readable piped with backpressure: memory stays at a few
   * chunks whatever its size) and parses the JSON answer (undefined when empty). A new
   * connection per upload: a stream cannot be resent if a pooled socket turns out closed.
   * When dsecd answers before the body is sent (an error), the rest is not sent. Errors:
   * as {@link request}; a failing Readable rejects with its own error.
   */
  private upload<T>(method: string, path: string, body: Buffer | Uint8Array | Readable, contentType: string, signal?: AbortSignal): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      const isStream = body instanceof Readable;
      // keep-alive although the connection is never reused: with `Connection: close`
      // dsecd closes the socket right after an early (error) answer, and our next write
      // fails with EPIPE before that answer is read. Kept alive, it drains the rest.
      const headers: http.OutgoingHttpHeaders = { accept: 'application/json', 'content-type': contentType, connection: 'keep-alive' };
      if (!isStream) headers['content-length'] = body.byteLength;
      const req = http.request({ socketPath: this.socketPath, path, method, headers, agent: false });
      let settled = false;
      let responded = false;
      let bodySent = false;
      let bodyError: Error | undefined;
      const finish = (err: unknown, value?: T) => {
        if (settled) return;
        settled = true;
        signal?.removeEventListener('abort', onAbort);
        if (err) reject(err);
        else resolve(value as T);
      };
      const onAbort = () => {
        finish(signal!.reason);
        req.destroy();
        if (isStream) body.destroy();
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      req.on('response', (res) => {
        responded = true;
        // Answered (possibly early, with an error): stop sending what is left.
        if (isStream && !bodySent) {
          body.unpipe(req);
          body.destroy();
        }
        readBody(res).then(
          (text) => {
            // The body was cut short: this connection cannot be reused; let it go.
            if (isStream && !bodySent) req.destroy();
            const status = res.statusCode ?? 0;
            if (status < 200 || status >= 300) return finish(errorFromResponse(status, text));
            if (text === '') return finish(undefined, undefined as T);
            try {
              finish(undefined, JSON.parse(text) as T);
            } catch (e) {
              finish(new DsecApiError('Internal', `dsecd answered ${method} ${path} with a body that is not JSON (status ${status})`, status, { cause: e }));
            }
          },
          (e) => finish(new DsecApiError('Unavailable', `connection to dsecd at ${this.socketPath} lost during ${method} ${path}: ${errMessage(e)}`, 0, { cause: e })),
        );
      });
      req.on('error', (err: NodeJS.ErrnoException) => {
        if (bodyError) return finish(bodyError);
        if (responded) return; // e.g. EPIPE after an early answer: the answer is what counts
        if (err.code === 'ENOENT' || err.code === 'ECONNREFUSED' || err.code === 'EACCES' || err.code === 'EPERM' || err.code === 'ENOTSOCK') {
          return finish(this.connectionError(err, method, path));
        }
        finish(new DsecApiError('Unavailable', `connection to dsecd at ${this.socketPath} lost during ${method} ${path}: ${err.message} (dsecd may have refused the upload part way)`, 0, { cause: err }));
      });
      if (!isStream) {
        req.end(body);
        return;
      }
      body.once('error', (e) => {
        bodyError = e;
      });
      pipeline(body, req, (err) => {
        if (!err) bodySent = true;
        if (!err || settled) return;
        if (bodyError) finish(bodyError);
        // A request error is reported by req's own 'error' handler.
      });
    });
  }

  /**
   * Sends one API call and parses its JSON answer. `path` starts with `/v1/` and may
   * carry a query string; `body` is sent as JSON when given. Resolves with the parsed
   * body (undefined when empty) for 2xx responses; rejects with {@link DsecApiError}
   * otherwise (the body's `{error: {code, message}}` when present, else a kind derived
   * from the status), `Unavailable` when the socket cannot be reached, or
   * `DeadlineExceeded` when the deadline passes.
   */
  async request<T>(method: string, path: string, body?: unknown, opts: RequestOptions = {}): Promise<T> {
    const timeoutMs = opts.timeoutMs ?? this.timeoutMs;
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body), 'utf8');
    const deadline = timeoutMs > 0 ? Date.now() + timeoutMs : 0;
    const res = await this.open(method, path, payload, opts.signal, deadline, timeoutMs, IDEMPOTENT.has(method));
    let text: string;
    try {
      text = await withDeadline(readBody(res), res, deadline, () => this.deadlineError(method, path, timeoutMs));
    } catch (e) {
      if (opts.signal?.aborted) throw opts.signal.reason ?? e;
      if (e instanceof DsecApiError) throw e;
      throw new DsecApiError('Unavailable', `connection to dsecd at ${this.socketPath} lost during ${method} ${path}: ${errMessage(e)}`, 0, { cause: e });
    }
    const status = res.statusCode ?? 0;
    if (status >= 400 || status < 200) throw errorFromResponse(status, text);
    if (text === '') return undefined as T;
    try {
      return JSON.parse(text) as T;
    } catch (e) {
      throw new DsecApiError('Internal', `dsecd answered ${method} ${path} with a body that is not JSON (status ${status})`, status, { cause: e });
    }
  }

  /**
   * Runs a long operation in NDJSON mode: sends `body` with `Accept: application/x-ndjson`,
   * calls `onProgress` per `{type: "progress"}` line and resolves with the `result` of the
   * `{type: "result"}` line, or rejects with the {@link DsecApiError} of an
   * `{type: "error"}` line. A daemon that ignores the Accept header and answers with one
   * JSON document is accepted too. No deadline.
   */
  private async longOperation<T, P = ImageProgress>(method: string, path: string, body: unknown, opts: { onProgress?: (p: P) => void; signal?: AbortSignal }): Promise<T> {
    const { signal, onProgress } = opts;
    const payload = Buffer.from(JSON.stringify(body), 'utf8');
    const res = await this.open(method, path, payload, signal, 0, 0, false, NDJSON_TYPE);
    let callbackFailed = false;
    try {
      const status = res.statusCode ?? 0;
      if (status >= 400 || status < 200) throw errorFromResponse(status, await readBody(res));
      if (!String(res.headers['content-type'] ?? '').includes(NDJSON_TYPE)) {
        const text = await readBody(res);
        try {
          return JSON.parse(text) as T;
        } catch (e) {
          throw new DsecApiError('Internal', `dsecd answered ${method} ${path} with a body that is not JSON (status ${status})`, status, { cause: e });
        }
      }
      for await (const line of ndjsonLines(res)) {
        const msg = parseProgressLine(line, method, path, status);
        if (msg.type === 'progress') {
          if (!onProgress) continue;
          try {
            onProgress(msg as unknown as P);
          } catch (e) {
            callbackFailed = true;
            throw e;
          }
        } else if (msg.type === 'result') {
          return msg.result as T;
        } else if (msg.type === 'error') {
          const c = msg.error?.code;
          const code: ErrorKind = typeof c === 'string' && Object.prototype.hasOwnProperty.call(KNOWN_KINDS, c) ? (c as ErrorKind) : 'Internal';
          const message = typeof msg.error?.message === 'string' ? msg.error.message : `${method} ${path} failed on dsecd (no message)`;
          const reason = typeof msg.error?.reason === 'string' ? msg.error.reason : undefined;
          throw new DsecApiError(code, message, status, reason === undefined ? undefined : { reason });
        }
        // Any other type: a newer daemon's addition; skipped.
      }
      throw new DsecApiError('Unavailable', `dsecd ended ${method} ${path} without a result; the operation may still finish on dsecd`, status);
    } catch (e) {
      if (callbackFailed) throw e;
      if (signal?.aborted) throw signal.reason ?? e;
      if (e instanceof DsecApiError) throw e;
      throw new DsecApiError(
        'Unavailable',
        `connection to dsecd at ${this.socketPath} lost during ${method} ${path}: ${errMessage(e)}; the operation may still finish on dsecd`,
        0,
        { cause: e },
      );
    } finally {
      res.destroy();
    }
  }

  /**
   * POST /v1/tokens: makes an API token for the TCP door (admin only: the Unix socket or
   * an admin token). The answer's `token` is the text, shown this once: dsecd keeps only
   * its hash. Errors: `InvalidArgument`, `PermissionDenied`.
   */
  createToken(opts: CreateTokenOptions): Promise<CreatedToken> {
    return this.request<CreatedToken>('POST', '/v1/tokens', { tenant: opts.tenant, role: opts.role, ...(opts.ttlS !== undefined ? { ttl_s: opts.ttlS } : {}), ...(opts.description !== undefined ? { description: opts.description } : {}) });
  }

  /** GET /v1/tokens: every token, without its text (admin only). Errors: `PermissionDenied`. */
  async listTokens(): Promise<TokenInfo[]> {
    return (await this.request<{ tokens: TokenInfo[] }>('GET', '/v1/tokens')).tokens;
  }

  /**
   * DELETE /v1/tokens/{id}: revokes a token (admin only); it is refused from now on and the
   * connections it opened close. Errors: `NotFound`, `PermissionDenied`.
   */
  revokeToken(id: string): Promise<TokenInfo> {
    return this.request<TokenInfo>('DELETE', `/v1/tokens/${encodeURIComponent(id)}`);
  }

  /** GET /v1/whoami: the caller as dsecd sees it. */
  whoami(): Promise<Whoami> {
    return this.request<Whoami>('GET', '/v1/whoami');
  }

  /**
   * Closes pooled connections. Safe to call twice; calls made afterwards still work
   * (they open new connections) but are not pooled. Not needed before process exit.
   */
  close(): void {
    this.agent.destroy();
  }

  /**
   * Sends a request and resolves with the response once its headers arrive. `deadline`
   * (absolute ms, 0 = none; `timeoutMs` is its length, for the message) bounds the wait
   * for the headers; the caller bounds the body.
   * A request that fails on a reused keep-alive socket before any response is resent
   * once when `retryable`. `accept` is the Accept header (NDJSON for long operations).
   */
  private open(
    method: string,
    path: string,
    payload: Buffer | undefined,
    signal: AbortSignal | undefined,
    deadline: number,
    timeoutMs: number,
    retryable: boolean,
    accept = 'application/json',
  ): Promise<http.IncomingMessage> {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) {
        reject(signal.reason);
        return;
      }
      const headers: http.OutgoingHttpHeaders = { accept };
      if (payload !== undefined) {
        headers['content-type'] = 'application/json';
        headers['content-length'] = payload.length;
      }
      const req = http.request({ socketPath: this.socketPath, path, method, headers, agent: this.agent });
      let settled = false;
      let timer: NodeJS.Timeout | undefined;
      const onAbort = () => req.destroy(signal!.reason instanceof Error ? signal!.reason : new Error('aborted'));
      const cleanup = () => {
        settled = true;
        if (timer) clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      if (deadline > 0) {
        const left = Math.max(0, deadline - Date.now());
        timer = setTimeout(() => req.destroy(this.deadlineError(method, path, timeoutMs)), left);
      }
      req.on('response', (res) => {
        if (settled) return;
        cleanup();
        // If the request is aborted while the body streams, surface it on the response.
        if (signal) {
          const onLateAbort = () => res.destroy(signal.reason instanceof Error ? signal.reason : new Error('aborted'));
          signal.addEventListener('abort', onLateAbort, { once: true });
          res.once('close', () => signal.removeEventListener('abort', onLateAbort));
        }
        resolve(res);
      });
      req.on('error', (err: NodeJS.ErrnoException) => {
        if (settled) return;
        cleanup();
        if (signal?.aborted) {
          reject(signal.reason ?? err);
        } else if (err instanceof DsecApiError) {
          reject(err);
        } else if (retryable && req.reusedSocket && (err.code === 'ECONNRESET' || err.code === 'EPIPE')) {
          // The daemon closed an idle pooled connection just as we reused it.
          this.open(method, path, payload, signal, deadline, timeoutMs, false, accept).then(resolve, reject);
        } else {
          reject(this.connectionError(err, method, path));
        }
      });
      req.end(payload);
    });
  }

  private deadlineError(method: string, path: string, ms: number): DsecApiError {
    return new DsecApiError('DeadlineExceeded', `no answer from dsecd at ${this.socketPath} to ${method} ${path} within ${ms} ms`, 0);
  }

  private connectionError(err: NodeJS.ErrnoException, method: string, path: string): DsecApiError {
    const where = `dsecd socket ${this.socketPath}`;
    switch (err.code) {
      case 'ENOENT':
        return new DsecApiError('Unavailable', `cannot connect to ${where}: no such file; is dsecd running?`, 0, { cause: err });
      case 'ECONNREFUSED':
        return new DsecApiError('Unavailable', `cannot connect to ${where}: connection refused; is dsecd running?`, 0, { cause: err });
      case 'EACCES':
      case 'EPERM':
        return new DsecApiError('Unavailable', `cannot connect to ${where}: permission denied (run as root or a member of the socket's group)`, 0, { cause: err });
      case 'ENOTSOCK':
        return new DsecApiError('Unavailable', `cannot connect to ${where}: not a socket; is dsecd running?`, 0, { cause: err });
      default:
        return new DsecApiError('Unavailable', `${method} ${path} to ${where} failed: ${err.message}; is dsecd running?`, 0, { cause: err });
    }
  }
}

/** Media type of streamed responses (events, long operations). */
const NDJSON_TYPE = 'application/x-ndjson';

/** `/v1/snapshots/{ref}` with the ref (id or name) escaped. */
function snapshotPath(ref: string): string {
  return `/v1/snapshots/${encodeURIComponent(ref)}`;
}

/** `/v1/trajectories/{id}` with the id escaped (ids may hold `:` and `@`). */
function trajectoryPath(id: string): string {
  return `/v1/trajectories/${encodeURIComponent(id)}`;
}

/** `/v1/images/{ref}` with the ref escaped (`team/py:1` → `team%2Fpy%3A1`). */
function imagePath(ref: string): string {
  return `/v1/images/${encodeURIComponent(ref)}`;
}

/** Media type of raw uploads (stdin, file contents). */
const OCTET_STREAM = 'application/octet-stream';

/** Media type of tar uploads. */
const TAR_TYPE = 'application/x-tar';

/** `/v1/sandboxes/{id}/execs`. */
function execsPath(id: string): string {
  return `${sandboxPath(id)}/execs`;
}

/** `/v1/sandboxes/{id}/execs/{exec_id}`. */
function execPath(id: string, execId: string): string {
  return `${execsPath(id)}/${encodeURIComponent(execId)}`;
}

/** Permission bits as the files API takes them: octal, 4 digits (`0o644` → `0644`). */
function formatMode(mode: number): string {
  if (!Number.isInteger(mode) || mode < 0 || mode > 0o7777) throw new DsecApiError('InvalidArgument', `mode ${mode} is not a permission mode (0 to 0o7777)`, 0);
  return mode.toString(8).padStart(4, '0');
}

/**
 * The lines of a text response body, in order, without their `\n` (blank lines kept). A
 * line split across reads (even inside a UTF-8 character) is reassembled; a final line
 * without a newline counts. Errors of the underlying stream propagate.
 */
async function* textLines(res: http.IncomingMessage): AsyncGenerator<string, void, undefined> {
  const decoder = new StringDecoder('utf8');
  let pending = '';
  for await (const chunk of res as AsyncIterable<Buffer>) {
    pending += decoder.write(chunk);
    if (!pending.includes('\n')) continue;
    const lines = pending.split('\n');
    pending = lines.pop()!;
    for (const line of lines) yield line;
  }
  pending += decoder.end();
  if (pending !== '') yield pending;
}

/** `/v1/sandboxes/{id}` with the id escaped. */
function sandboxPath(id: string): string {
  return `/v1/sandboxes/${encodeURIComponent(id)}`;
}

/** `/v1/leases/{job}` with the job escaped (a job may contain `/`). */
function leasePath(job: string): string {
  return `/v1/leases/${encodeURIComponent(job)}`;
}

/** Query string (with its `?`) of the defined, non-empty values, or `''`. */
function query(params: Record<string, string | undefined>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== '') q.set(k, v);
  const s = q.toString();
  return s === '' ? '' : `?${s}`;
}

/** Reads a whole response body as UTF-8. */
async function readBody(res: http.IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const c of res as AsyncIterable<Buffer>) chunks.push(c);
  return Buffer.concat(chunks).toString('utf8');
}

/** Races `p` against an absolute deadline (0 = none), destroying `res` when it passes. */
function withDeadline<T>(p: Promise<T>, res: http.IncomingMessage, deadline: number, err: () => Error): Promise<T> {
  if (deadline <= 0) return p;
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => {
      const e = err();
      res.destroy(e);
      reject(e);
    }, Math.max(0, deadline - Date.now()));
    p.then(
      (v) => {
        clearTimeout(timer);
        resolve(v);
      },
      (e) => {
        clearTimeout(timer);
        reject(e);
      },
    );
  });
}

/** The {@link DsecApiError} for an error response: its `{error: {code, message, reason?}}` when well-formed, else derived from the status. */
function errorFromResponse(status: number, text: string): DsecApiError {
  let code: ErrorKind | undefined;
  let message: string | undefined;
  let reason: string | undefined;
  try {
    const body = JSON.parse(text) as { error?: { code?: unknown; message?: unknown; reason?: unknown } };
    const c = body?.error?.code;
    if (typeof c === 'string' && Object.prototype.hasOwnProperty.call(KNOWN_KINDS, c)) code = c as ErrorKind;
    if (typeof body?.error?.message === 'string') message = body.error.message;
    if (typeof body?.error?.reason === 'string') reason = body.error.reason;
  } catch {
    // Not JSON (a proxy, a crash page): fall back to the status.
  }
  code ??= KIND_BY_STATUS[status] ?? (status >= 500 ? 'Internal' : 'InvalidArgument');
  message ??= text.trim() !== '' && text.length <= 200 ? `dsecd answered ${status}: ${text.trim()}` : `dsecd answered HTTP ${status}`;
  return new DsecApiError(code, message, status, reason === undefined ? undefined : { reason });
}

/**
 * The non-blank lines of an NDJSON response body, in order. A line split across reads
 * (even inside a UTF-8 character) is reassembled; a final line without a newline counts.
 * Errors of the underlying stream (a dropped connection) propagate.
 */
async function* ndjsonLines(res: http.IncomingMessage): AsyncGenerator<string, void, undefined> {
  const decoder = new StringDecoder('utf8');
  let pending = '';
  for await (const chunk of res as AsyncIterable<Buffer>) {
    pending += decoder.write(chunk);
    if (!pending.includes('\n')) continue;
    const lines = pending.split('\n');
    pending = lines.pop()!;
    for (const line of lines) if (line.trim() !== '') yield line;
  }
  pending += decoder.end();
  if (pending.trim() !== '') yield pending;
}

/** One line of a long operation's stream, as sent (not validated beyond `type`). */
interface StreamLine {
  type: string;
  result?: unknown;
  error?: { code?: unknown; message?: unknown; reason?: unknown };
  [k: string]: unknown;
}

/** Parses one NDJSON line of a long operation; a malformed line is `Internal`. */
function parseProgressLine(line: string, method: string, path: string, status: number): StreamLine {
  let v: unknown;
  try {
    v = JSON.parse(line);
  } catch (e) {
    throw new DsecApiError('Internal', `dsecd sent a malformed line during ${method} ${path}: ${JSON.stringify(clip(line))}`, status, { cause: e });
  }
  if (typeof v !== 'object' || v === null || typeof (v as StreamLine).type !== 'string') {
    throw new DsecApiError('Internal', `dsecd sent a line without a type during ${method} ${path}: ${JSON.stringify(clip(line))}`, status);
  }
  return v as StreamLine;
}

/** `s` cut to 80 characters for an error message. */
function clip(s: string): string {
  return s.length > 80 ? s.slice(0, 80) + '…' : s;
}

/** Parses one NDJSON line of a trajectory export; a malformed line is `Internal`. */
function parseRecordLine(line: string, id: string): TrajectoryRecord {
  try {
    return JSON.parse(line) as TrajectoryRecord;
  } catch (e) {
    throw new DsecApiError('Internal', `dsecd sent a malformed line in the export of trajectory ${id}: ${JSON.stringify(clip(line))}`, 200, { cause: e });
  }
}

/** Parses one NDJSON line of the event stream. */
function parseEventLine(line: string): Event {
  try {
    return JSON.parse(line) as Event;
  } catch (e) {
    throw new DsecApiError('Internal', `dsecd sent a malformed event line: ${JSON.stringify(clip(line))}`, 200, { cause: e });
  }
}

function errMessage(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
