/** The sandbox resource on the wire: create, the sandbox view, list and delete queries, stop, pause (with its reclaim report), bulk operations and job leases. */
import { z } from 'zod';
import { IoMaxSchema } from '../../host/cgroups/io.js';
export { IoMaxSchema } from '../../host/cgroups/io.js';
import { IO_WEIGHT_MAX, IO_WEIGHT_MIN, LIMITS, MIN_DISK_BYTES } from '../../model/resources.js';
import { SeccompOverrideSchema } from '../../security/seccomp.js';
import { Backend, DefenceStatus, FilesystemSpec, SandboxState, envKey, envSize, envValue, labelKey, labelValue } from './common.js';
import { NetworkSpec } from './network.js';

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
  tenant: z.string().describe('The tenant it belongs to (docs/SECURITY.md "Tenancy"): `system` for what the Unix socket made.'),
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

/** What a pause reclaimed (bytes), from memory.stat before and after. */
export const Reclaim = z.object({
  memory_before_bytes: z.number().int(), memory_after_bytes: z.number().int(),
  file_before_bytes: z.number().int(), file_after_bytes: z.number().int(),
  anon_bytes: z.number().int().describe('Anonymous memory left: reclaimable only with swap/zswap.'),
  reclaimed_bytes: z.number().int(), swap: z.boolean(), note: z.string(),
});

/** POST /v1/sandboxes/{id}/pause response. */
export const PauseResult = z.object({ sandbox: Sandbox, reclaim: Reclaim.nullable().describe('null when it was already paused.') });

/** POST /v1/sandboxes/bulk request. */
export const BulkRequest = z
  .object({
    selector: z.string().min(1).describe('Label selector, e.g. job=a,round=3 (required: bulk never means "everything").'),
    action: z.enum(['pause', 'resume', 'stop', 'destroy', 'set_ttl']),
    ttl_s: z.number().int().min(1).nullable().optional().describe('set_ttl: seconds from creation, or null to remove.'),
    timeout_ms: z.number().int().min(0).optional().describe('stop: grace between SIGTERM and SIGKILL.'),
  })
  .strict();

/** POST /v1/sandboxes/bulk response. */
export const BulkResponse = z.object({
  results: z.array(z.object({
    id: z.string(), ok: z.boolean(), state: z.string().optional(), reclaim: Reclaim.optional(),
    error: z.object({ code: z.string(), message: z.string() }).optional(),
  })),
});

const jobName = z.string().regex(/^[A-Za-z0-9._/-]{1,63}$/, 'job must be a label value: [A-Za-z0-9._/-]{1,63}');

/** A lease. */
export const LeaseView = z.object({
  tenant: z.string().describe('The tenant whose job it is: leases are per (tenant, job).'),
  job: z.string(), ttl_s: z.number().int(),
  expires_at: z.number().int().describe('ms since the epoch; a renewal at or after it is refused.'),
  lapsed_at: z.number().int().nullable().describe('When the job was paused for lack of renewal.'),
  created_at: z.number().int(),
  sandboxes: z.number().int().describe('Sandboxes labelled job=<job>.'),
});

/** POST /v1/leases request. */
export const LeaseRequest = z.object({ job: jobName, ttl_s: z.number().int().min(1).max(30 * 24 * 3600) }).strict();

/** POST /v1/leases/{job}/renew request. */
export const RenewRequest = z.object({ ttl_s: z.number().int().min(1).max(30 * 24 * 3600).optional() }).strict();

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

/** POST /v1/sandboxes:ack: the sandboxes whose create answers a gateway delivered (daemon/sandbox/create-records.ts). */
export const AckRequest = z.object({ ids: z.array(z.string().regex(/^[0-9a-f]{16}$/)).max(10_000) }).strict();

/** Answer of POST /v1/sandboxes:ack. */
export const AckResult = z.object({ acknowledged: z.number().int().describe('How many of the ids were held (the others were acknowledged already, reaped or unknown).') });
