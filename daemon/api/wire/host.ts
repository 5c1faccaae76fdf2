/** Host-level answers on the wire: version, host info, the seccomp profile, events, stats and logs. */
import { z } from 'zod';
import { SandboxState } from './common.js';
import { NetworkDenials } from './network.js';

/** GET /v1/security/seccomp and POST /v1/security/seccomp/reload response: the seccomp profile in force. */
export const SeccompProfileInfo = z.object({
  file: z.string().describe('The profile data file ([security] seccomp_profile).'),
  sha256: z.string().describe('sha256 of the file as loaded, hex.'),
  denied: z.number().int().describe('Distinct syscall names the profile denies (unconditionally or by argument).'),
  missing_core: z.array(z.string()).describe('Core syscalls (bpf, the mount family, keyctl, ptrace, ...) the profile does not deny unconditionally; empty for the shipped default.'),
  warnings: z.array(z.string()).describe('Warnings about the profile, e.g. missing core denials; empty when none.'),
});
export type SeccompProfileInfo = z.infer<typeof SeccompProfileInfo>;

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
      guarded: z.number().int().describe('Sandboxes that wrote all of their share of the nearly full store and are held there, below their quota, until it has room again (their events: sandbox.disk_pool_full).'),
      capped: z.number().int().describe('Sandboxes whose kernel limit the pool guard has set below their quota, to their use plus their share of the free space, because the room above the reserve is less than the headrooms together (the guarded ones included; an idle sandbox is capped too, before it writes).'),
    }).nullable().optional().describe('The store as a shared pool: use against the sum of quotas; null where the store enforces no quota.'),
    device: z.string().nullable().optional().describe('The block device under the store (MAJ:MIN, e.g. a loop device) on which I/O weights and limits act; null: none (host filesystem).'),
  }).optional().describe('The writable-layer store.'),
  memory_reclaim: z.object({
    mode: z.enum(['off', 'idle', 'aggressive']).describe('[memory] reclaim or dsecd --reclaim: off (default), idle, aggressive.'),
    method: z.enum(['damon', 'memory.reclaim', 'memory.force_empty', 'none']).describe('How idle container sandboxes are reclaimed here: a kdamond dsecd owns (paddr, memcg filters), cgroup v2 memory.reclaim, cgroup v1 memory.force_empty, or not at all.'),
    reason: z.string().describe('Why this method on this host.'),
    damon: z.object({
      owned: z.boolean().describe('dsecd owns a kdamond and reclaims with it.'),
      reason: z.string().describe('What dsecd found of DAMON: no sysfs, a kdamond it did not create (described), or its own.'),
    }),
    idle_after_s: z.number().describe('A container sandbox idle this long is reclaimed: no exec running, none started or ended, CPU at most idle_cpu_permil.'),
    idle_cpu_permil: z.number().describe('CPU threshold of idle (at most this), per mille of one core averaged over a sweep.'),
    idle_sandboxes: z.number().int().describe('Container sandboxes idle past idle_after_s at the last sweep.'),
    reclaimed_bytes: z.number().int().describe('Bytes reclaimed from idle container sandboxes since dsecd started (DAMON: bytes its schemes paged out; memory cgroups: usage before minus after).'),
  }).optional().describe('Proactive reclaim of idle container sandboxes by the host ([memory]; daemon/host/memory/). microVMs reclaim inside their guests ([vm.reclaim]).'),
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
  type: z.string().describe('e.g. sandbox.created, sandbox.started, sandbox.stopped, sandbox.destroyed, sandbox.failed, sandbox.disk_quota (its writable layer filled its quota), sandbox.disk_pool_full (the writable-layer store is nearly full and the sandbox wrote all of its share of it: its writes fail with EDQUOT below its quota until the store has room; the message gives the numbers of the store), sandbox.writable_path_refused (a create, restore, fork or start refused because a writable path resolves through a symlink to where it must not lead; the message says which), exec.finished.'),
  sandbox_id: z.string().nullable(),
  tenant: z.string().optional().describe("The tenant the event belongs to (its sandbox's or lease's); a caller sees only its own tenant's events, an admin every tenant's."),
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
  idle_since: z.number().int().nullable().optional().describe('Container sandboxes, while the host\'s reclaim runs ([memory] reclaim): idle since (no exec, CPU at most idle_cpu_permil), ms since the epoch, as of its last sweep; null: busy, or not judged (other tiers, reclaim off).'),
  reclaimed_bytes: z.number().int().optional().describe('Bytes the host\'s reclaim took back from this sandbox since dsecd started (GET /v1/host memory_reclaim).'),
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
