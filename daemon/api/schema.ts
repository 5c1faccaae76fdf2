/**
 * The dsecd HTTP API, defined once.
 *
 * Every request body and response body is a zod schema here; route handlers parse with
 * them, and docs/api/openapi.json is generated from them (daemon/api/openapi.ts). JSON
 * fields are snake_case, times are milliseconds (durations) or milliseconds since the
 * Unix epoch (`*_at`), sizes are bytes, CPU amounts are cores (fractional).
 * Request objects are strict: an unknown field is an InvalidArgument error.
 */
import { z } from 'zod';
import { ERROR_KINDS } from '../errors.js';
import { SeccompOverrideSchema } from '../security/seccomp.js';
import { ruleProblem } from '../security/egress.js';
import { FilesystemOptionsSchema } from '../security/filesystem.js';
import { ImageSecuritySchema } from '../image/security.js';
import { IO_WEIGHT_MAX, IO_WEIGHT_MIN } from '../host/cgroups/io.js';

/** Limits that make a request absurd rather than merely large; see `cpus`, `memory_bytes`, `pids`. */
export const LIMITS = {
  /** Smallest memory limit accepted: 4 MiB; below that the agent and a shell cannot start. */
  minMemoryBytes: 4 * 1024 * 1024,
  /** Largest memory limit accepted: 1 TiB, far above any host dsec runs on. */
  maxMemoryBytes: 1024 ** 4,
  /** Smallest CPU share: 0.01 cores (a 1 ms quota per 100 ms period). */
  minCpus: 0.01,
  /** Largest CPU limit: 512 cores; more is a typo, not a machine. */
  maxCpus: 512,
  /** Smallest pids limit: 8 (agent, a shell, a command and some headroom). */
  minPids: 8,
  /** Largest pids limit: 4,194,304, the kernel's PID_MAX_LIMIT on 64-bit. */
  maxPids: 4_194_304,
  /** Longest exec timeout: 24 h. */
  maxTimeoutMs: 24 * 3600 * 1000,
  /** Largest trajectory step number: 2^31-1, so steps fit a signed 32-bit int in every client language. */
  maxStep: 2 ** 31 - 1,
  /** Most sandboxes one fork call creates: 256 (a rollout group; larger groups are several calls). */
  maxForkCount: 256,
  /** Largest stdin accepted inline by exec: 16 MiB (base64 in JSON). */
  maxStdinBytes: 16 * 1024 * 1024,
  /** Longest sandbox TTL: 30 days. */
  maxTtlS: 30 * 24 * 3600,
  /** Most labels on one sandbox: 64 (selectors stay cheap; tables stay readable). */
  maxLabels: 64,
  /** Total size of an env map (keys, values, `=` and NUL): 128 KiB, so execve's argument space (ARG_MAX, 2 MiB with an 8 MiB stack) keeps room for argv. */
  maxEnvBytes: 128 * 1024,
} as const;

const envSize = (e: Record<string, string>) => Object.entries(e).reduce((n, [k, v]) => n + k.length + v.length + 2, 0);

/** Label keys and values: Kubernetes-like, so selectors stay unambiguous (no `,` or `=`). */
const labelKey = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$/, 'label key must match [A-Za-z0-9][A-Za-z0-9._/-]{0,62}')
  // dsecd's own labels (`dsec.pool` marks a warm-pool shell, kept out of listings and
  // admission; `dsec.fork` names a fork) mean something only when dsecd sets them.
  .refine((k) => !k.startsWith('dsec.'), 'label keys starting with "dsec." are reserved for dsecd');
const labelValue = z.string().regex(/^[A-Za-z0-9._/-]{0,63}$/, 'label value must match [A-Za-z0-9._/-]{0,63}');
const envKey = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'env names must match [A-Za-z_][A-Za-z0-9_]*');
const envValue = z.string().refine((s) => !s.includes('\0'), 'env values must not contain NUL');

/**
 * Trajectory ids: 1–128 characters from `A-Z a-z 0-9 . _ : @ -`, starting with a letter
 * or digit, so an id is safe in a URL path segment, a file name and a JSONL line as is.
 */
export const TrajectoryId = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$/, 'trajectory ids are 1-128 characters of [A-Za-z0-9._:@-], starting with a letter or digit');

/** Snapshot names: like image names, lowercase `[a-z0-9][a-z0-9._-]{0,127}`; unique per host. */
export const SnapshotName = z.string().regex(/^[a-z0-9][a-z0-9._-]{0,127}$/, 'snapshot names are 1-128 characters of [a-z0-9._-], starting with a letter or digit')
  .refine((n) => !/^snap-[0-9a-f]{16}$/.test(n), 'snapshot names must not look like snapshot ids (snap- and 16 hex characters)');

/** Isolation tiers. Only `container` is built so far; the others answer Unimplemented. */
export const Backend = z.enum(['container', 'fncall', 'microvm', 'vm']).describe('Isolation tier.');
export type Backend = z.infer<typeof Backend>;

/** Lifecycle states; transitions are defined in daemon/sandbox/state.ts. */
export const SandboxState = z.enum(['creating', 'running', 'paused', 'stopped', 'failed', 'destroyed']);
export type SandboxState = z.infer<typeof SandboxState>;

/** Error body: `{ error: { code, message } }`. */
export const ErrorBody = z.object({
  error: z.object({
    code: z.enum(ERROR_KINDS as [string, ...string[]]).describe('Error kind; decides the HTTP status.'),
    message: z.string().describe('Human-readable description naming what failed.'),
    reason: z.string().optional().describe(
      'Machine-readable refinement of `code` where a caller must branch on it, e.g. for trajectory steps: '
      + '`outcome_unknown`, `step_mismatch`, `in_progress`, `out_of_order`, `trajectory_removed` (see docs/TRAJECTORIES.md).'),
  }),
});

/**
 * Sandbox names and policy names: lowercase `[a-z0-9][a-z0-9._-]{0,62}`, so a name is a
 * file name as is (policies are data files, docs/SECURITY.md).
 */
export const PolicyName = z.string().regex(/^[a-z0-9][a-z0-9._-]{0,62}$/, 'policy names are 1-63 characters of [a-z0-9._-], starting with a letter or digit');

/**
 * One egress rule: a destination (exactly one of `cidr` and `host`), optional ports and
 * a protocol. `host` names are resolved by dsecd and refreshed on their DNS TTL
 * (docs/SECURITY.md "Networking"); `*.example.org` matches every name below example.org.
 */
export const EgressRule = z
  .object({
    cidr: z.string().min(2).max(43).optional().describe('IPv4 or IPv6 prefix, e.g. `10.0.0.0/8`, `2001:db8::/32`; a bare address means /32 or /128.'),
    host: z.string().min(1).max(253).optional().describe('DNS name, or `*.` and a name for every name below it; resolved by dsecd.'),
    ports: z.array(z.union([z.number().int().min(1).max(65535), z.string().regex(/^\d{1,5}-\d{1,5}$/, 'port ranges are "low-high"')])).min(1).max(16).optional()
      .describe('Destination ports or "low-high" ranges; default every port.'),
    protocol: z.enum(['tcp', 'udp', 'any']).optional().describe('Default any.'),
  })
  .strict()
  .refine((r) => (r.cidr === undefined) !== (r.host === undefined), 'an egress rule has exactly one of cidr and host')
  .superRefine((r, ctx) => {
    // Prefix syntax and host bits, host-name syntax, port-range order (daemon/security/egress.ts).
    const problem = ruleProblem(r);
    if (problem) ctx.addIssue({ code: 'custom', message: problem });
  });
export type EgressRule = z.infer<typeof EgressRule>;

/**
 * The network of a sandbox. `none` (default): a network namespace with loopback only.
 * `allow`: a veth on the instance bridge, egress only to `allow` (and the sandbox's
 * resolver), minus `deny`. `open`: egress anywhere except `deny`. `policy` names a
 * network policy data file whose rules are merged under the inline ones. `mode` may be
 * left out when `policy` is given: the policy's mode applies (docs/SECURITY.md
 * "Networking and egress"); the stored spec always has the settled mode.
 */
export const NetworkSpec = z
  .object({
    mode: z.enum(['none', 'allow', 'open']).optional().describe("none (loopback only), allow (allow-list) or open (anything but deny); default the policy's mode, else none."),
    policy: PolicyName.optional().describe('Name of a network policy data file (docs/SECURITY.md), merged under the inline rules.'),
    allow: z.array(EgressRule).max(256).optional().describe('Destinations reachable in mode allow.'),
    deny: z.array(EgressRule).max(256).optional().describe('Destinations never reachable; wins over allow.'),
  })
  .strict();
export type NetworkSpec = z.infer<typeof NetworkSpec>;

/** Denials of one sandbox's egress programs and resolver since it was attached (cumulative for its current container). */
export const NetworkDenials = z.object({
  connect: z.number().int().describe('connect() calls refused (EPERM).'),
  sendmsg: z.number().int().describe('UDP sendto/sendmsg calls to an address refused (EPERM).'),
  sock_create: z.number().int().describe('Raw or non-TCP/UDP inet sockets refused (EPERM).'),
  dns_refused: z.number().int().describe('DNS questions the resolver refused (REFUSED, never forwarded), for its current container; kept across dsecd restarts (recorded before it is shown).'),
  last: z.string().nullable().describe('The last denied attempt, e.g. `10.0.0.9:80/tcp (connect)`.'),
});

/** GET/PUT /v1/sandboxes/{id}/network response: the settled network and its state on the host. */
export const SandboxNetwork = z.object({
  id: z.string(),
  mode: z.enum(['none', 'allow', 'open']),
  policy: z.string().nullable().describe('The named policy merged in, if any.'),
  allow: z.array(EgressRule).describe("Effective allow rules: the policy's, then the sandbox's own."),
  deny: z.array(EgressRule).describe("Effective deny rules: the policy's, then the sandbox's own."),
  address: z.string().nullable().describe('The sandbox\'s IPv4 address on the instance bridge (derived from its uid-range slot), null in mode none.'),
  gateway: z.string().nullable(),
  resolver: z.string().nullable().describe('The resolver its /etc/resolv.conf names, `gateway:53`.'),
  attached: z.boolean().describe('Whether its veth and egress programs are in place now (running or paused).'),
  hosts: z.record(z.string(), z.array(z.string())).describe('Addresses dsecd resolved for each exact host rule (refreshed on the DNS TTL, clamped).'),
  learned: z.number().int().describe('Addresses allowed because the resolver answered them for an allow host rule (wildcards included).'),
  denied: NetworkDenials,
});

/** One loaded network policy (GET /v1/network/policies). */
export const NetworkPolicyView = z.object({
  name: z.string(),
  file: z.string().describe('The data file it was loaded from.'),
  description: z.string().nullable(),
  mode: z.enum(['allow', 'open']),
  allow: z.array(EgressRule),
  deny: z.array(EgressRule),
});

/** GET /v1/network/policies response. */
export const NetworkPolicyList = z.object({ policies: z.array(NetworkPolicyView) });

/** POST /v1/network/policies/reload response. */
export const PolicyReloadResult = z.object({
  loaded: z.array(z.string()).describe('Every policy loaded now.'),
  changed: z.array(z.string()).describe('Policies whose content changed, appeared or disappeared.'),
  reapplied: z.array(z.string()).describe('Sandboxes whose network was re-applied because their policy changed.'),
  shadowed: z.array(z.object({
    name: z.string(),
    file: z.string().describe('The operator\'s file in force.'),
    shadows: z.string().describe('The shipped file it hides.'),
  })).describe('Shipped policies hidden by an operator policy of the same name (every one in force, not only new ones).'),
  warnings: z.array(z.object({
    policy: z.string(),
    file: z.string(),
    message: z.string().describe('Which allow rule (`allow.<index>`) never takes effect and why: inside a destination every sandbox is denied (bridge subnet, host addresses, link-local metadata range, ...), covered by a deny rule of the policy, or in an open policy.'),
  })).describe('Allow rules of loaded policies that can never take effect; they do not refuse the reload.'),
  modes: z.array(z.object({
    id: z.string().describe('Sandbox id.'),
    policy: z.string(),
    mode: z.enum(['allow', 'open']).describe("The sandbox's mode now."),
    policy_mode: z.enum(['allow', 'open']).describe("The policy's mode after the reload."),
    changed: z.boolean().describe('True when the sandbox took the new mode (its stored network names no mode of its own); false when it keeps the mode settled at its create (PUT its network to change it).'),
  })).describe("Sandboxes naming a policy whose mode this reload changed (each also gets a network.policy_mode_changed event)."),
});
export type PolicyReloadResult = z.infer<typeof PolicyReloadResult>;

/**
 * Filesystem hardening of a sandbox (docs/SECURITY.md "Filesystem" and "Landlock";
 * daemon/security/filesystem.ts): read-only system paths, writable exceptions, Landlock.
 * In a request every field defaults to the image's security defaults, then to
 * `[filesystem]` in dsecd's config; a sandbox returns the values resolved at create.
 */
export const FilesystemSpec = FilesystemOptionsSchema;
export type FilesystemSpec = z.infer<typeof FilesystemSpec>;

/** Smallest per-sandbox disk quota: 16 MiB (an image's first writes and a shell history fit). */
export const MIN_DISK_BYTES = 16 * 1024 * 1024;

/**
 * Smallest bytes-per-second limit of `io_max`: 4 KiB/s, one page a second. Lower rates
 * would starve the sandbox's own page-cache misses (its binaries load through the same
 * device), which is never what a limit is for.
 */
export const IO_MAX_MIN_BPS = 4096;

/**
 * I/O limits of a sandbox on the writable-layer store's device (`io_max`; `[defaults.io_max]`
 * in the config): bytes per second and IOs per second, each optional (absent: unlimited).
 * Applied as cgroup v2 `io.max` or v1 `blkio.throttle.*` (docs/OPERATIONS.md "Disk I/O").
 */
export const IoMaxSchema = z
  .object({
    read_bps: z.number().int().min(IO_MAX_MIN_BPS).optional().describe(`Read bytes per second (at least ${IO_MAX_MIN_BPS}).`),
    write_bps: z.number().int().min(IO_MAX_MIN_BPS).optional().describe(`Written bytes per second (at least ${IO_MAX_MIN_BPS}).`),
    read_iops: z.number().int().min(1).optional().describe('Read IOs per second.'),
    write_iops: z.number().int().min(1).optional().describe('Write IOs per second.'),
  })
  .strict()
  .refine((m) => Object.keys(m).length > 0, 'io_max names at least one of read_bps, write_bps, read_iops, write_iops');
export type IoMax = z.infer<typeof IoMaxSchema>;

/** Whether one defence is in force for a sandbox or host, and what it does or why not. */
export const DefenceStatus = z.object({
  enforced: z.boolean(),
  detail: z.string(),
});
export type DefenceStatus = z.infer<typeof DefenceStatus>;

/** GET /v1/security/seccomp and POST /v1/security/seccomp/reload response: the seccomp profile in force. */
export const SeccompProfileInfo = z.object({
  file: z.string().describe('The profile data file ([security] seccomp_profile).'),
  sha256: z.string().describe('sha256 of the file as loaded, hex.'),
  denied: z.number().int().describe('Distinct syscall names the profile denies (unconditionally or by argument).'),
  missing_core: z.array(z.string()).describe('Core syscalls (bpf, the mount family, keyctl, ptrace, ...) the profile does not deny unconditionally; empty for the shipped default.'),
  warnings: z.array(z.string()).describe('Warnings about the profile, e.g. missing core denials; empty when none.'),
});
export type SeccompProfileInfo = z.infer<typeof SeccompProfileInfo>;

/** POST /v1/sandboxes request. */
export const CreateSandboxRequest = z
  .object({
    backend: Backend.default('container').describe('Isolation tier; default container.'),
    image: z.string().min(1).max(255).default('busybox').describe('Image reference, `name` or `name:tag`; default busybox.'),
    cpus: z.number().min(LIMITS.minCpus).max(LIMITS.maxCpus).optional().describe('CPU limit in cores (fractional); default from config.'),
    memory_bytes: z.number().int().min(LIMITS.minMemoryBytes).max(LIMITS.maxMemoryBytes).optional().describe('Memory limit in bytes; default from config.'),
    pids: z.number().int().min(LIMITS.minPids).max(LIMITS.maxPids).optional().describe('Maximum number of processes; default from config.'),
    labels: z.record(labelKey, labelValue).refine((l) => Object.keys(l).length <= LIMITS.maxLabels, `at most ${LIMITS.maxLabels} labels`).optional()
      .describe('Labels, e.g. {job: "a", round: "3"}; at most 64.'),
    env: z.record(envKey, envValue).refine((e) => envSize(e) <= LIMITS.maxEnvBytes, 'env larger than 128 KiB').optional()
      .describe('Environment for every exec, merged over the image env; at most 128 KiB in all.'),
    ttl_s: z.number().int().min(1).max(LIMITS.maxTtlS).optional().describe('Seconds after creation when the sandbox is destroyed.'),
    priority: z.enum(['latency', 'batch']).optional().describe('latency (default) or batch: SCHED_IDLE and minimal CPU shares, so batch work never delays latency sandboxes.'),
    idle_timeout_s: z.number().int().min(1).max(LIMITS.maxTtlS).optional().describe('Pause the sandbox after this many seconds without an exec.'),
    seccomp: SeccompOverrideSchema.optional().describe(
      'Changes to the default seccomp profile (docs/SECURITY.md): `allow` lifts every denial of the named syscalls (e.g. ["ptrace"] for a debugger task), `deny` adds EPERM denials.'),
    network: NetworkSpec.optional().describe('Network mode and egress policy; default mode none (loopback only).'),
    disk_bytes: z.number().int().min(MIN_DISK_BYTES).max(LIMITS.maxMemoryBytes * 16).optional()
      .describe('Quota on the writable layer, bytes (at least 16 MiB); default [defaults] disk_bytes (10 GiB). Refused above the store\'s size, and where the store enforces no quota.'),
    filesystem: FilesystemSpec.optional().describe('Read-only system paths, writable exceptions, Landlock; defaults from the image, then config.'),
    io_weight: z.number().int().min(IO_WEIGHT_MIN).max(IO_WEIGHT_MAX).optional()
      .describe(`Share of the writable-layer store's device under contention, on the cgroup v2 io.weight scale ${IO_WEIGHT_MIN}-${IO_WEIGHT_MAX} (kernel default 100); default [defaults] io_weight. Container backend only; whether the host enforces it: host info defences.io_weight.`),
    io_max: IoMaxSchema.optional()
      .describe('Limits on the writable-layer store\'s device; default [defaults.io_max] (none). Container backend only; what the host enforces (v1: not buffered writes): host info defences.io_max.'),
  })
  .strict();
export type CreateSandboxRequest = z.infer<typeof CreateSandboxRequest>;

/** A sandbox as the API returns it. */
export const Sandbox = z.object({
  id: z.string().describe('Sandbox id: 16 lowercase hex characters.'),
  backend: Backend,
  image: z.string().describe('Image reference as resolved, `name:tag`.'),
  image_layers: z.array(z.string()).describe('Layer digests of the image, lowest first.'),
  state: SandboxState,
  cpus: z.number().describe('CPU limit, cores.'),
  memory_bytes: z.number().int().describe('Memory limit, bytes.'),
  pids: z.number().int().describe('Process limit.'),
  labels: z.record(z.string(), z.string()),
  env: z.record(z.string(), z.string()),
  ttl_s: z.number().int().nullable(),
  created_at: z.number().int().describe('Creation time, ms since the Unix epoch.'),
  updated_at: z.number().int().describe('Last state change, ms since the Unix epoch.'),
  init_pid: z.number().int().nullable().describe('Host pid of the sandbox init (the agent), null unless running or paused.'),
  uid_base: z.number().int().nullable().describe('First host uid/gid of the sandbox range (container uid 0).'),
  uid_count: z.number().int().nullable().describe('Size of the uid/gid range.'),
  error: z.string().nullable().describe('Why the sandbox failed, when state is failed.'),
  priority: z.enum(['latency', 'batch']),
  idle_timeout_s: z.number().int().nullable(),
  last_active_at: z.number().int().nullable().describe('Start of the last exec, ms since the epoch.'),
  snapshot: z.string().nullable().describe('Id of the snapshot this sandbox was restored or forked from, else null.'),
  seccomp: SeccompOverrideSchema.nullable().describe('The seccomp override it was created with, else null (the default profile).'),
  network: NetworkSpec.nullable().describe('The network it was created with (or last set), else null (mode none).'),
  disk_bytes: z.number().int().nullable().describe('Quota on the writable layer, bytes, fixed at create; null: none (the store enforces no quota; see defences.disk_quota).'),
  io_weight: z.number().int().nullable().describe('I/O weight (io.weight scale) applied to its cgroup; null: none (not a container sandbox, or created before I/O settings).'),
  io_max: IoMaxSchema.nullable().describe('I/O limits applied to its cgroup; null: none.'),
  disk_used_bytes: z.number().int().nullable().optional().describe('Bytes the writable layer uses now, as the store accounts them; null where it cannot tell (layer on the host filesystem). GET of one sandbox only.'),
  filesystem: FilesystemSpec.nullable().describe('The filesystem options resolved at create (request > image > config), else null (a sandbox older than them: resolved at each start).'),
  defences: z.record(z.string(), DefenceStatus).optional().describe('Which defences are in force for this sandbox (GET of one sandbox only).'),
});
export type Sandbox = z.infer<typeof Sandbox>;

/** GET /v1/sandboxes response. */
export const SandboxList = z.object({ sandboxes: z.array(Sandbox) });

/** GET /v1/sandboxes query. */
export const ListQuery = z
  .object({
    selector: z.string().optional().describe('Label selector `k=v,k2=v2` (all must match).'),
    state: SandboxState.optional(),
  })
  .strict();

/** DELETE /v1/sandboxes/{id} query. */
export const DeleteQuery = z
  .object({ force: z.enum(['true', 'false', '1', '0']).optional().describe('Destroy even if running (kills processes).') })
  .strict();

/** POST /v1/sandboxes/{id}/stop request (the body is optional). */
export const StopRequest = z
  .object({
    timeout_ms: z.number().int().min(0).max(LIMITS.maxTimeoutMs).optional().describe('Grace between SIGTERM and SIGKILL, ms; default 10000, 0 kills at once.'),
  })
  .strict();

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

/** GET /v1/version response. */
export const VersionInfo = z.object({
  version: z.string().describe('dsec version.'),
  api: z.literal('v1'),
  agent_protocol: z.number().int().describe('Version of the in-sandbox agent protocol.'),
  node: z.string(),
});

/** GET /v1/host response. */
export const HostInfo = z.object({
  version: z.string(),
  instance: z.string().describe('Instance name; keys cgroups, runtime state and mounts.'),
  root: z.string().describe('State directory.'),
  socket: z.string(),
  kernel: z.string(),
  cores: z.number().int(),
  memory_bytes: z.number().int(),
  cgroup: z.object({ version: z.union([z.literal(1), z.literal(2)]), parents: z.record(z.string(), z.string()) }),
  runtime: z.object({ name: z.string(), path: z.string(), version: z.string() }),
  backends: z.record(z.string(), z.object({ available: z.boolean(), reason: z.string().nullable() })),
  uid_pool: z.object({ base: z.number().int(), size: z.number().int(), range_size: z.number().int(), in_use: z.number().int(), free: z.number().int() }),
  sandboxes: z.record(z.string(), z.number().int()).describe('Count by state.'),
  fncall_pools: z.array(z.object({
    image: z.string(), workers: z.number().int(), idle: z.number().int(), busy: z.number().int(), starting: z.number().int(),
    queued: z.number().int(), calls: z.number().int().describe('Calls served since dsecd started.'), replaced: z.number().int().describe('Workers replaced (OOM, lost agent, call budget, idle).'),
  })).describe('The fncall worker pools, one per image content.'),
  warm_pools: z.array(z.object({
    image: z.string().describe('Image reference of the [[pool.entries]] entry.'),
    network: z.enum(['none', 'allow', 'open']),
    size: z.number().int().describe('Shells the entry keeps ready.'),
    ready: z.number().int().describe('Shells ready to be claimed now.'),
    filling: z.number().int().describe('Shells being created (refill runs only while no user create is in flight).'),
    claimed: z.number().int().describe('Creates answered from this pool since dsecd started.'),
    misses: z.number().int().describe('Creates of this image and network mode that found no ready shell since dsecd started.'),
    fill_errors: z.number().int().describe('Shell creations that failed since dsecd started.'),
  })).describe('Warm pools of pre-created container sandbox shells ([pool]); empty when none is configured.'),
  features: z.record(z.string(), z.object({ available: z.boolean(), reason: z.string().nullable() }))
    .describe('Optional features and whether this host has them: filesystem_snapshots, process_checkpoints (CRIU), vm_snapshots (machine snapshots of microVMs: RAM, processes and disk), trajectory_log, kvm (available: microVMs run under KVM; otherwise TCG; reason: the verdict of the KVM probe boot).'),
  defences: z.record(z.string(), z.object({ enforced: z.boolean(), detail: z.string() })),
  storage: z.object({
    kind: z.enum(['btrfs', 'xfs', 'host']).describe("Where new sandboxes' writable layers go (daemon/storage/store.ts)."),
    quota: z.enum(['squota', 'qgroup', 'prjquota', 'none']).describe('How the store limits a layer: btrfs simple quotas, full qgroups, XFS project quota, or not at all.'),
    location: z.string().describe("The store's image, or the operator's directory ([storage] path); <root>/sandboxes for host."),
    size_bytes: z.number().int().nullable().describe('Size of the store filesystem, bytes; null for host.'),
    used_bytes: z.number().int().nullable().describe('Bytes used on it (statfs): what quotas, which may add up to more than the size, have actually taken.'),
    layers: z.number().int().describe('Writable layers in the store.'),
    pool: z.object({
      available_bytes: z.number().int().describe('Bytes writers can still take (statfs f_bavail).'),
      quota_sum_bytes: z.number().int().describe('Sum of the disk_bytes quotas of every container sandbox in the store (warm-pool shells included): what the sandboxes may write in all.'),
      quota_cap_bytes: z.number().int().describe('What admission lets the quotas of sandboxes (warm-pool shells excepted) sum to: size_bytes x disk_overcommit.'),
      disk_overcommit: z.number().describe('[admission] disk_overcommit.'),
      reserve_bytes: z.number().int().describe('Free space kept for sandboxes that are not filling the store ([storage] reserve_bytes; 0: no pool guard).'),
      guarded: z.number().int().describe('Sandboxes the pool guard now holds below their quota because the store is nearly full (their events: sandbox.disk_pool_full).'),
    }).nullable().optional().describe('The store as a shared pool: use against the sum of quotas; null where the store enforces no quota.'),
    device: z.string().nullable().optional().describe('The block device under the store (MAJ:MIN, e.g. a loop device) on which I/O weights and limits act; null: none (host filesystem).'),
  }).optional().describe('The writable-layer store.'),
  fleet: z.object({
    state: z.enum(['connecting', 'registered', 'refused', 'lost', 'stopped']).describe('Registration in etcd: registered (its lease is alive), connecting/lost (etcd unreachable: retrying), refused (its name is held by another host id).'),
    reason: z.string().nullable().describe('Why it is not registered, else null.'),
    host_id: z.string().describe('Persistent host id (16 hex), kept in <root>/fleet/host.json.'),
    name: z.string(),
    tag: z.string().describe('6 hex that begin the ids of the sandboxes and snapshots this host creates, so a gateway routes them without a lookup.'),
    registered_at: z.number().int().nullable().describe('Last successful registration, ms since the epoch.'),
    lease_ttl_s: z.number().int(),
  }).nullable().optional().describe('Fleet membership (dsecd --etcd; daemon/fleet/); null: no fleet configured.'),
});

/** One line of GET /v1/events (NDJSON). */
export const Event = z.object({
  time: z.number().int().describe('ms since the Unix epoch.'),
  type: z.string().describe('e.g. sandbox.created, sandbox.started, sandbox.stopped, sandbox.destroyed, sandbox.failed, sandbox.disk_quota (its writable layer filled its quota), sandbox.disk_pool_full (the writable-layer store filled while the sandbox was writing: its writes fail with EDQUOT until the store has room; the message gives the numbers of the store), sandbox.writable_path_refused (a create, restore, fork or start refused because a writable path resolves through a symlink to where it must not lead; the message says which), exec.finished.'),
  sandbox_id: z.string().nullable(),
  state: SandboxState.optional(),
  labels: z.record(z.string(), z.string()).optional(),
  message: z.string().optional(),
});
export type Event = z.infer<typeof Event>;

/** GET /v1/events query. */
export const EventsQuery = z
  .object({
    selector: z.string().optional().describe('Only events of sandboxes whose labels match.'),
    follow: z.enum(['true', 'false', '1', '0']).optional().describe('Keep the stream open and send new events as they happen.'),
    since: z.coerce.number().int().optional().describe('Only events at or after this time, ms since the epoch.'),
  })
  .strict();

/** An image reference `name[:tag]` (tag defaults to latest). */
const ImageRef = z.string().min(1).max(255).describe('Image reference, name[:tag].');
/** A layer digest. */
const Digest = z.string().regex(/^sha256:[0-9a-f]{64}$/, 'digest must be sha256:<64 hex>');

/** Process defaults of an image. */
export const ImageConfig = z.object({
  env: z.array(z.string()).describe('KEY=value entries.'),
  cwd: z.string().describe('Working directory of execs.'),
  user: z.string().describe('Default user, name or uid[:gid].'),
  cmd: z.array(z.string()).describe('Default command.'),
  security: ImageSecuritySchema.optional().describe('Security defaults for sandboxes of this image: a seccomp override and filesystem options (docs/IMAGES.md "Security defaults"); a create request overrides each field.'),
});

/** An image as the API returns it. */
export const Image = z.object({
  ref: z.string().describe('name:tag'),
  name: z.string(),
  tag: z.string(),
  layers: z.array(z.string()).describe('Layer digests, lowest first.'),
  config: ImageConfig,
  size_bytes: z.number().int().describe('Sum of the layer blob sizes, bytes.'),
  created_at: z.number().int().describe('ms since the Unix epoch.'),
});
export type Image = z.infer<typeof Image>;

/** GET /v1/images response. */
export const ImageList = z.object({ images: z.array(Image) });

/** A layer as the API returns it. */
export const Layer = z.object({
  digest: z.string(),
  size_bytes: z.number().int().describe('Blob size, bytes.'),
  created_at: z.number().int().describe('ms since the Unix epoch.'),
  source: z.string().describe('Where the content came from, e.g. dir:/path, oci:/x.tar#1, commit:<sandbox id>.'),
  builder: z.string().describe('<host>/<instance> that built it.'),
  images: z.array(z.string()).describe('Images (name:tag) that use this layer.'),
  sandboxes: z.number().int().describe('Sandboxes of this instance that use this layer.'),
});

/** GET /v1/layers response. */
export const LayerList = z.object({ layers: z.array(Layer) });

/**
 * POST /v1/images/import: build or import an image from a path on the daemon's host.
 * `dir`: one layer from a directory tree (on top of `base`'s layers when given);
 * `tar`: one layer from a root filesystem tar (plain, gzip or zstd);
 * `oci`: an OCI image layout (dir or tar) or a docker/podman save archive, one layer per OCI layer.
 */
export const ImportRequest = z
  .object({
    type: z.enum(['dir', 'tar', 'oci']),
    path: z.string().startsWith('/').describe('Absolute path on the daemon host.'),
    image: ImageRef.describe('Name for the result, name[:tag].'),
    base: ImageRef.optional().describe('dir only: put the new layer on top of this image (its config is kept).'),
    source_ref: z.string().max(255).optional().describe('oci only: which image of a multi-image archive (its ref name, e.g. localhost/app:1).'),
    config: ImageConfig.partial().strict().optional().describe('Overrides of the image config.'),
  })
  .strict();

/** POST /v1/images: compose an image from layers already in the store. */
export const ComposeRequest = z
  .object({
    image: ImageRef,
    layers: z.array(Digest).min(1).describe('Layer digests, lowest first.'),
    from: ImageRef.optional().describe('Take the config from this image.'),
    config: ImageConfig.partial().strict().optional(),
  })
  .strict();

/** POST /v1/images/{ref}/tag request. */
export const TagRequest = z.object({ target: ImageRef }).strict();

/** POST /v1/images/bootstrap request. */
export const BootstrapRequest = z
  .object({
    distro: z.literal('debian').describe('Only debian (bookworm minbase) so far.'),
    toolkit: z
      .enum(['judge'])
      .optional()
      .describe(
        'Build a toolkit image instead: the base image (debian:bookworm, bootstrapped first when missing) plus one layer of packages. judge: gcc, g++, libc6-dev (image judge:bookworm).',
      ),
    image: ImageRef.optional().describe('Default debian:bookworm, or the toolkit\'s image (judge:bookworm).'),
    include: z
      .array(z.string().regex(/^[a-z0-9][a-z0-9+.-]*$/))
      .optional()
      .describe('Extra packages of the layer being built: on top of minbase (default python3, git), or with toolkit on top of its packages.'),
  })
  .strict();

/** POST /v1/images/prune request. */
export const PruneRequest = z.object({ dry_run: z.boolean().optional() }).strict();

/** POST /v1/images/prune response. */
export const PruneResult = z.object({
  removed: z.array(z.object({ digest: z.string(), size_bytes: z.number().int(), source: z.string() })),
  freed_bytes: z.number().int(),
  kept_young: z.array(z.string()).describe('Unreferenced layers kept because they are younger than the grace period.'),
  tmp_removed: z.number().int(),
  dry_run: z.boolean(),
});

/** POST /v1/sandboxes/{id}/commit request. */
export const CommitRequest = z
  .object({
    image: ImageRef.describe('Name of the new image, name[:tag].'),
    exclude: z.array(z.string().min(1)).optional().describe('Extra globs (relative to the sandbox root) to strip.'),
    security: ImageSecuritySchema.optional().describe("Security defaults of the new image; default the sandbox's image's."),
  })
  .strict();

/** POST /v1/sandboxes/{id}/commit response. */
export const CommitResult = z.object({
  image: Image,
  layer: Layer,
  stripped: z.array(z.string()).describe('Paths removed before packing.'),
  warnings: z.array(z.string()).describe('E.g. exclude patterns that matched nothing.'),
});

/** One line of a streamed (Accept: application/x-ndjson) long operation. */
export const ProgressLine = z.object({
  type: z.enum(['progress', 'result', 'error']),
  message: z.string().optional(),
  phase: z.string().optional(),
  bytes: z.number().optional(),
  result: z.unknown().optional(),
  error: z.object({ code: z.string(), message: z.string() }).optional(),
});

/** Resource usage of one sandbox. */
export const SandboxStatsView = z.object({
  id: z.string(),
  state: SandboxState,
  image: z.string(),
  labels: z.record(z.string(), z.string()),
  created_at: z.number().int(),
  cpus: z.number().describe('CPU limit, cores (as the sandbox was created with).'),
  cpu_usage_ns: z.number().describe('Cumulative CPU time, ns (null fields when not running).').nullable(),
  memory_bytes: z.number().int().nullable().describe('Memory charged to the sandbox cgroup, bytes.'),
  memory_limit_bytes: z.number().int().nullable(),
  pids: z.number().int().nullable(),
  oom_kills: z.number().int().nullable(),
  network_denied: NetworkDenials.nullable().optional().describe('Egress denials of an allow/open sandbox with its network attached, else null.'),
  pids_limit_hits: z.number().int().nullable().optional().describe('Forks refused because the sandbox was at its pids limit (pids.events max).'),
  seccomp_denials: z.object({
    total: z.number().int().describe('Denied system calls since the sandbox started (counted by the seccomp monitor, across dsecd restarts).'),
    by_syscall: z.record(z.string(), z.number().int()).describe('Denials per syscall name.'),
    flooded: z.boolean().describe('Past the flood limit: later denials still fail (ENOSYS) but are no longer counted.'),
  }).nullable().optional().describe('null: this sandbox\'s denials are not counted (no seccomp monitor when it started).'),
  disk_used_bytes: z.number().int().nullable().describe('Bytes the writable layer uses (any state): btrfs referenced plus reserved data, or the XFS project\'s blocks; null where the store cannot tell (host filesystem). In GET /v1/stats read for all layers at once, as of the store\'s last commit (btrfs: at most 30 s old).'),
  disk_limit_bytes: z.number().int().nullable().describe('The writable layer\'s quota as the filesystem holds it, bytes; null: none.'),
});

/** GET /v1/stats response: every sandbox's usage plus the host's. */
export const StatsResponse = z.object({
  time: z.number().int().describe('ms since the Unix epoch, when sampled.'),
  host: z.object({ cores: z.number().int(), memory_bytes: z.number().int(), memory_available_bytes: z.number().int(), load_avg: z.array(z.number()) }),
  sandboxes: z.array(SandboxStatsView),
});

/** GET /v1/sandboxes/{id}/logs query. */
export const LogsQuery = z
  .object({
    follow: z.enum(['true', 'false', '1', '0']).optional().describe('Keep streaming new lines.'),
  })
  .strict();

/** POST /v1/sandboxes/{id}/snapshot request (the body is optional). */
export const SnapshotRequest = z
  .object({
    name: SnapshotName.optional().describe('Unique name to restore by; default none (use the id).'),
    process: z.boolean().optional().describe(
      'Containers: also checkpoint memory and processes (CRIU); answered Unimplemented, with the reason, where `criu check` fails on the host. '
      + 'microvm sandboxes: ignored, their snapshot always captures the whole machine (kind `vm`: RAM, processes, devices and the writable disk).'),
  })
  .strict();
export type SnapshotRequest = z.infer<typeof SnapshotRequest>;

/** A snapshot as the API returns it. */
export const Snapshot = z.object({
  id: z.string().describe('Snapshot id: `snap-` and 16 lowercase hex characters.'),
  name: z.string().nullable(),
  kind: z.enum(['filesystem', 'vm']).describe(
    'What was captured: `filesystem` (a container: the writable layer, unstripped), `vm` (a microVM: the whole machine, its RAM, CPU and device state and its writable disk; a restore resumes its processes).'),
  sandbox_id: z.string().describe('The source sandbox (it may have been destroyed since).'),
  backend: Backend,
  image: z.string().describe('Image of the source sandbox, `name:tag`.'),
  image_layers: z.array(z.string()).describe('Layer digests a restored sandbox mounts (filesystem: the last is the snapshot layer) or attaches as disks (vm), lowest first.'),
  layer: z.string().describe('filesystem: digest of the snapshot layer (the source writable layer, packed); vm: `sha256:` of the machine state file.'),
  size_bytes: z.number().int().describe('Host bytes the snapshot takes: the layer blob (filesystem); the state file plus the allocated blocks of the disk copy (vm).'),
  cpus: z.number().describe('CPU limit of the source, cores; the default for restores.'),
  memory_bytes: z.number().int().describe('Memory limit of the source, bytes; the default for restores.'),
  pids: z.number().int(),
  priority: z.enum(['latency', 'batch']),
  labels: z.record(z.string(), z.string()).describe('Labels of the source; the default labels of restores.'),
  env: z.record(z.string(), z.string()).describe('Sandbox env of the source, kept by restores.'),
  created_at: z.number().int().describe('ms since the Unix epoch.'),
  machine: z.object({
    qemu_version: z.string().describe('QEMU that wrote the state; a restore needs the same major.minor.'),
    accel: z.enum(['kvm', 'tcg']),
    memory_mib: z.number().int().describe('Guest RAM, MiB; restores keep it (memory_bytes cannot change).'),
    vcpus: z.number().int().describe('vCPUs; restores keep it (cpus must round up to it).'),
    state_bytes: z.number().int().describe('Bytes of the migration stream (RAM pages the guest touched, CPU and device state).'),
    state_sha256: z.string().describe('sha256 (hex) of the stream, checked before every restore.'),
    disk_bytes: z.number().int().describe('Apparent size of the writable disk copy, bytes.'),
    disk_allocated_bytes: z.number().int().describe('Host bytes of the disk copy (0 for a reflink).'),
    disk_reflinked: z.boolean().describe('Whether the disk copy is a reflink of the source disk (btrfs, XFS) rather than a sparse copy.'),
    paused_ms: z.number().int().describe("How long the source's vCPUs were stopped for the capture, ms."),
  }).nullable().describe('The captured machine of a `vm` snapshot, else null.'),
});
export type Snapshot = z.infer<typeof Snapshot>;

/** GET /v1/snapshots response. */
export const SnapshotList = z.object({ snapshots: z.array(Snapshot) });

/** Overrides a restore or fork may set; every field defaults to the snapshot's source sandbox. */
const restoreFields = {
  labels: z.record(labelKey, labelValue).refine((l) => Object.keys(l).length <= LIMITS.maxLabels, `at most ${LIMITS.maxLabels} labels`).optional()
    .describe("Labels of the new sandbox(es); default the source's labels."),
  env: z.record(envKey, envValue).refine((e) => envSize(e) <= LIMITS.maxEnvBytes, 'env larger than 128 KiB').optional()
    .describe("Merged over the source's sandbox env."),
  cpus: z.number().min(LIMITS.minCpus).max(LIMITS.maxCpus).optional(),
  memory_bytes: z.number().int().min(LIMITS.minMemoryBytes).max(LIMITS.maxMemoryBytes).optional(),
  pids: z.number().int().min(LIMITS.minPids).max(LIMITS.maxPids).optional(),
  ttl_s: z.number().int().min(1).max(LIMITS.maxTtlS).optional().describe('Seconds after the new sandbox is created when it is destroyed; default none.'),
  priority: z.enum(['latency', 'batch']).optional(),
  idle_timeout_s: z.number().int().min(1).max(LIMITS.maxTtlS).optional(),
  seccomp: SeccompOverrideSchema.optional().describe('Seccomp override of the new sandbox(es); default none (the default profile).'),
  network: NetworkSpec.optional().describe("Network of the new sandbox(es); default the source's."),
  disk_bytes: z.number().int().min(MIN_DISK_BYTES).max(LIMITS.maxMemoryBytes * 16).optional().describe("Writable-layer quota, bytes; default the source's."),
  filesystem: FilesystemSpec.optional().describe("Filesystem options of the new sandbox(es), field by field over the source's."),
};

/** POST /v1/snapshots/{ref}/restore request (the body is optional). */
export const RestoreRequest = z.object(restoreFields).strict();
export type RestoreRequest = z.infer<typeof RestoreRequest>;

/** POST /v1/snapshots/{ref}/fork request. */
export const ForkRequest = z
  .object({ count: z.number().int().min(1).max(LIMITS.maxForkCount).describe('How many sandboxes, 1-256.'), ...restoreFields })
  .strict();
export type ForkRequest = z.infer<typeof ForkRequest>;

/** POST /v1/snapshots/{ref}/fork response. */
export const ForkResult = z.object({ sandboxes: z.array(Sandbox).describe('The new sandboxes, all running, in creation order.') });

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
  id: z.string(),
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
