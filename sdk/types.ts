/**
 * The dsecd API's request and response types under the names SDK callers use, with their
 * units. Every alias here points into sdk/types.gen.ts, which is generated from the
 * OpenAPI document (docs/api/openapi.json, itself generated from the daemon's wire schema)
 * and checked against a fresh generation by test/unit/sdk-types.test.ts: the SDK never
 * imports the daemon. Field-level docs are on the generated types.
 *
 * `...Input` types are requests as the caller writes them: a field with a default may be
 * left out. The other types are what dsecd answers, every field present.
 */
import type { components } from './types.gen.js';

type Schemas = components['schemas'];

/**
 * The closed set of error kinds (the daemon's daemon/errors.ts): the `code` of every
 * error body and of every {@link DsecApiError}.
 */
export type ErrorKind = Schemas['ErrorBody']['error']['code'];

/** Isolation tier of a sandbox: `container`, `fncall`, `microvm` or `vm`. */
export type Backend = Schemas['Backend'];

/** Lifecycle state of a sandbox: `creating`, `running`, `paused`, `stopped`, `failed` or `destroyed`. */
export type SandboxState = Schemas['SandboxState'];

/**
 * A sandbox as the API returns it: id, backend, image (`name:tag`) and its layer digests,
 * state, limits (`cpus` cores, `memory_bytes` bytes, `pids`, `disk_bytes` bytes), labels,
 * env, times (ms since the Unix epoch) and the settings it was created with.
 */
export type Sandbox = Schemas['Sandbox'];

/**
 * One event of GET /v1/events: `time` (ms since the Unix epoch), `type` (e.g.
 * `sandbox.created`, `exec.finished`), the `sandbox_id` it concerns, and optionally its
 * `state`, `labels` and a `message`.
 */
export type Event = Schemas['Event'];

/**
 * The wire result of a command run to completion (POST /v1/sandboxes/{id}/exec, POST
 * /v1/run): `exit_code` (null when killed by a signal), `signal`, output base64 in
 * `stdout_b64`/`stderr_b64` (capped, see `*_truncated`), `duration_ms` ms, `oom`,
 * `oom_kills`, `timed_out`, and for trajectory steps `trajectory`, `step`, `replayed`.
 */
export type ExecResult = Schemas['ExecResult'];

/** GET /v1/version response: the daemon's version, API version and agent protocol. */
export type VersionInfo = Schemas['VersionInfo'];

/** GET /v1/host response: host capabilities, runtime, cgroup layout, counts. */
export type HostInfo = Schemas['HostInfo'];

/**
 * POST /v1/sandboxes request as the caller writes it: every field is optional
 * (backend defaults to `container`, image to `busybox`, limits to the daemon config).
 * Units: `cpus` cores (fractional), `memory_bytes` bytes, `ttl_s` seconds.
 */
export type CreateSandboxInput = Schemas['CreateSandboxRequest'];

/**
 * A batched create (POST /v1/sandboxes:batch): `{count, spec}` (count sandboxes of one
 * spec) or `{items: [spec, ...]}`, 1 to 1,000 sandboxes; `keys` (one idempotency key per
 * sandbox) is for gateways, callers use the `Idempotency-Key` header.
 */
export type CreateSandboxesInput = Partial<Schemas['CreateSandboxesRequest']>;

/** One sandbox's outcome in a batched create: `sandbox` when made, else `error` ({code, message}, as a single create would have failed). */
export type BatchCreateItem = Schemas['BatchItemResult'];

/** The answer of a batched create: one {@link BatchCreateItem} per sandbox asked for, in order, and how many were made and failed. */
export type BatchCreateResult = Schemas['CreateSandboxesResult'];

/** A sandbox's network as requested: mode (none, allow, open), a named policy, allow and deny rules (docs/SECURITY.md, Networking and egress). */
export type NetworkInput = Schemas['NetworkSpec'];

/** GET/PUT /v1/sandboxes/{id}/network response: the settled network, address, resolved hosts and denial counters. */
export type SandboxNetwork = Schemas['SandboxNetwork'];

/** One loaded network policy (GET /v1/network/policies). */
export type NetworkPolicy = Schemas['NetworkPolicyView'];

/** POST /v1/network/policies/reload response. */
export type PolicyReloadResult = Schemas['PolicyReloadResult'];

/** The seccomp profile in force: its data `file`, the `sha256` of its text, and how many syscall names it `denied`. */
export type SeccompProfileInfo = Schemas['SeccompProfileInfo'];

/**
 * An image as the API returns it (GET /v1/images, GET /v1/images/{ref}, and the result of
 * every call that makes one): `ref` is `name:tag`; `layers` are digests
 * (`sha256:<64 hex>`), lowest first; `config` holds the process defaults; `size_bytes`
 * is the sum of the layer blob sizes in bytes; `created_at` is ms since the Unix epoch.
 */
export type Image = Schemas['Image'];

/** The old name of {@link Image}, kept so existing callers compile; the shape is now the full Image. */
export type ImageInfo = Image;

/**
 * Process defaults of an image: `env` as `KEY=value` strings, `cwd` (absolute), `user`
 * (name or `uid[:gid]`), `cmd` (argv), and optionally `security`: the image's security
 * defaults (a `seccomp` override; `readonly_paths`, `writable_paths`, `landlock`;
 * docs/IMAGES.md "Security defaults").
 */
export type ImageConfig = Schemas['ImageConfig'];

/**
 * A layer of the content-addressed store: `digest` (`sha256:<64 hex>`), `size_bytes`
 * (EROFS blob size, bytes), `created_at` (ms since the Unix epoch), `source` (where the
 * content came from, e.g. `dir:/path`, `oci:/x.tar#1`, `commit:<sandbox id>`), `builder`
 * (`<host>/<instance>`), `images` (refs using it) and `sandboxes` (how many sandboxes of
 * this instance use it).
 */
export type Layer = Schemas['Layer'];

/**
 * POST /v1/images/import request. `type`: `dir` (one layer from a directory tree, on top
 * of `base` when given), `tar` (one layer from a root filesystem tar, plain, gzip or zstd)
 * or `oci` (an OCI image layout, directory or tar, or a docker/podman save archive).
 * `path` is absolute and is read by dsecd **on its own host**. `image` names the result
 * (`name[:tag]`); `config` overrides fields of the image config.
 */
export type ImportImageInput = Schemas['ImportRequest'];

/**
 * POST /v1/images request: make image `image` from `layers` (digests already in the store,
 * lowest first), taking the config from image `from` when given, with `config` overrides.
 */
export type ComposeImageInput = Schemas['ComposeRequest'];

/**
 * POST /v1/images/bootstrap request: `distro` (only `debian`: bookworm minbase), `image`
 * (default `debian:bookworm`), `include` (extra packages; default python3, git).
 */
export type BootstrapImageInput = Schemas['BootstrapRequest'];

/**
 * POST /v1/images/prune response: the layers `removed` (or that would be, with
 * `dry_run`), `freed_bytes` (bytes), `kept_young` (digests of unreferenced layers kept
 * because they are younger than the grace period) and `tmp_removed` (leftover temporary
 * entries removed).
 */
export type PruneResult = Schemas['PruneResult'];

/**
 * POST /v1/sandboxes/{id}/commit response: the new `image`, its new top `layer` and the
 * paths `stripped` (relative to the sandbox root) before packing.
 */
export type CommitResult = Schemas['CommitResult'];

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
export type Snapshot = Schemas['Snapshot'];

/**
 * POST /v1/snapshots/{ref}/restore request in the wire format; every field is optional
 * and defaults to the snapshot's source sandbox: `labels` (replace the source's),
 * `env` (merged over the source's), `cpus` cores, `memory_bytes` bytes, `pids`,
 * `ttl_s` seconds from creation, `priority`, `idle_timeout_s` seconds.
 */
export type RestoreInput = Schemas['RestoreRequest'];

/**
 * POST /v1/snapshots/{ref}/fork request in the wire format: `count` (how many sandboxes,
 * 1-256) and the overrides of {@link RestoreInput}, applied to every one of them.
 */
export type ForkInput = Schemas['ForkRequest'];

/**
 * State of a recorded trajectory step: `running` (in this dsecd now), `finished` (its
 * result is recorded and replayed on a rerun) or `unknown` (it started and never
 * finished: dsecd died or the sandbox was lost mid-step; a rerun is refused with reason
 * `outcome_unknown` until the step is truncated).
 */
export type StepState = Schemas['StepState'];

/**
 * One recorded step of a trajectory, without its output: `step` (number), `state`,
 * `hash` (sha256 hex of the canonical request: argv, env, cwd, user, stdin digest,
 * timeout_ms), `sandbox_id`, `argv`, `started_at`/`finished_at` (ms since the Unix
 * epoch), the outcome (`exit_code`, `signal`, `oom`, `timed_out`, `duration_ms` ms,
 * `stdout_bytes`/`stderr_bytes` bytes; null until finished), `replays` (how many times
 * the recorded result was replayed) and `error` (why the outcome is unknown, when it is).
 */
export type TrajectoryStep = Schemas['TrajectoryStep'];

/**
 * A trajectory's summary (GET /v1/trajectories): `id`, `host` (the dsecd holding the
 * log), `steps` (recorded), `first_step`/`last_step` (null when empty), `unknown` (steps
 * whose outcome is unknown), `sandbox_id` (of the latest step), `truncations` (how many
 * times the log was truncated), `created_at`/`updated_at` (ms since the Unix epoch).
 */
export type TrajectorySummary = Schemas['TrajectorySummary'];

/** GET /v1/trajectories/{id} response: the {@link TrajectorySummary} plus `step_list`, every {@link TrajectoryStep} in step order. */
export type TrajectoryDetail = Schemas['TrajectoryDetail'];

/**
 * One line of a trajectory export (GET /v1/trajectories/{id}/export): a whole
 * {@link TrajectoryStep} plus `trajectory` and `host` (lines of several hosts merge), the
 * request (`env`, `cwd`, `user`, `timeout_ms` ms, `stdin_sha256`) and the recorded output
 * (`stdout_b64`/`stderr_b64`, base64, with `stdout_truncated`/`stderr_truncated`; null
 * until the step finished).
 */
export type TrajectoryRecord = Schemas['TrajectoryRecord'];

/** DELETE /v1/trajectories/{id} response: the `id` and how many steps were discarded (`removed_steps`). */
export type TrajectoryRemoved = Schemas['TrajectoryRemoved'];

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
export type Reclaim = Schemas['Reclaim'];

/**
 * POST /v1/sandboxes/{id}/pause response: the `sandbox` (state `paused`) and what the
 * pause `reclaim`ed; `reclaim` is null when the sandbox was already paused.
 */
export type PauseResult = Schemas['PauseResult'];

/** Actions of {@link DsecClient.bulk}. */
export type BulkAction = Schemas['BulkRequest']['action'];

/**
 * POST /v1/sandboxes/bulk request, in the wire format: `selector` (required and
 * non-empty: bulk never means "every sandbox"; same syntax as
 * {@link ListSandboxesQuery.selector}), `action`, `ttl_s` (set_ttl: seconds **from
 * creation**, or null to remove the TTL) and `timeout_ms` (stop: grace between SIGTERM
 * and SIGKILL).
 */
export type BulkInput = Schemas['BulkRequest'];

/**
 * One sandbox's outcome of {@link DsecClient.bulk}: `ok` with the sandbox's `state`
 * afterwards (and `reclaim` for a pause that froze it now), or not `ok` with `error`
 * `{code, message}` (an error kind of daemon/errors.ts, as a string).
 */
export type BulkResult = Schemas['BulkResponse']['results'][number];

/**
 * A job's lease (POST/GET/DELETE /v1/leases...): `job` (the value of the `job` label
 * of its sandboxes), `ttl_s` (seconds each renewal extends it by), `expires_at` (ms since
 * the epoch; a renewal at or after it is refused), `lapsed_at` (when the lease lapsed and
 * the job's sandboxes were paused, else null), `created_at` (ms since the epoch) and
 * `sandboxes` (how many sandboxes carry `job=<job>` now).
 */
export type Lease = Schemas['LeaseView'];

/**
 * An API token of the TCP door as listed (GET /v1/tokens): `id` (16 hex, the part of the
 * token text after `e2b_` that names it), `tenant`, `role` (`admin`, `user`, `reader`,
 * `metrics`), `description`, `created_at`, `expires_at` (null: never), `revoked_at`
 * (ms since the epoch) and `state` (`active`, `expired`, `revoked`). Never the text.
 */
export type TokenInfo = Schemas['TokenView'];

/** An E2B template (GET /v1/templates): `name` -> `image` on `backend`; `builtin` for the default `base` no alias replaces (docs/E2B.md). */
export type E2bTemplate = Schemas['Template'];

/** POST /v1/tokens answer: {@link TokenInfo} plus `token`, the text, shown this once (dsecd keeps only its hash). */
export type CreatedToken = Schemas['CreatedToken'];

/** POST /v1/tokens request: `{tenant, role, ttl_s?, description?}`. */
export type CreateTokenInput = Schemas['CreateTokenRequest'];

/** GET /v1/whoami answer: `door` (`unix`, `tcp`), `token_id`, `tenant`, `role`, `peer` (the verified client certificate: `{name, role, fingerprint256}`, or null). */
export type Whoami = Schemas['Whoami'];

/** A POST /v1/run request (snake_case, as on the wire): `{backend?, image?, argv, env?, cwd?, user?, stdin_b64?, timeout_ms?, memory_bytes?, cpus?, pids?}`. */
export type RunInput = Schemas['RunRequest'];

/**
 * An exec session (POST /v1/sandboxes/{id}/execs and the calls on it): `exec_id` (128-bit
 * random, usable only by the uid that started it, and root), `state` (`running` or
 * `exited`), `pid` (inside the sandbox), `started_at`/`finished_at` (ms since the Unix
 * epoch), `exit_code` (null while running or when killed), `signal`, `timed_out`,
 * `error` (why it could not start, or ended with its sandbox), and the bytes of output
 * kept (`stdout_bytes`, `stderr_bytes`) and dropped beyond dsecd's spool budget.
 */
export type ExecInfo = Schemas['ExecInfo'];

/**
 * Resource usage of one sandbox (GET /v1/stats, GET /v1/sandboxes/{id}/stats):
 * `cpu_usage_ns` is cumulative CPU time in ns (compare two samples for a rate),
 * `memory_bytes`/`memory_limit_bytes` bytes charged/allowed, `pids`, `oom_kills`; every
 * usage field is null when the sandbox is not running.
 */
export type SandboxStats = Schemas['SandboxStatsView'];

/** GET /v1/stats response: `time` of the sample (ms since the epoch), the `host` block and every sandbox's {@link SandboxStats}. */
export type StatsResponse = Schemas['StatsResponse'];

/**
 * GET /v1/sandboxes/{id}/files/stat response: what is at a path in the sandbox (a final
 * symlink is followed unless `nofollow`): the `path` asked about, its `type` (`file`,
 * `dir`, `symlink`, `other`), `size` in bytes, `mode` bits (permissions and, when dsecd
 * includes them, the file type bits), owner `uid`/`gid` as seen inside the sandbox,
 * `mtime_ms` (ms since the Unix epoch) and, for a symlink, its `target`.
 */
export type FileStat = Schemas['FileStat'];
