/** Snapshots on the wire: taking one, the snapshot view, restores and forks. */
import { z } from 'zod';
import { LIMITS, MIN_DISK_BYTES } from '../../model/resources.js';
import { SeccompOverrideSchema } from '../../security/seccomp.js';
import { Backend, FilesystemSpec, SnapshotName, envKey, envSize, envValue, labelKey, labelValue } from './common.js';
import { NetworkSpec } from './network.js';
import { Sandbox } from './sandboxes.js';

/** POST /v1/sandboxes/{id}/snapshot request (the body is optional). */
export const SnapshotRequest = z
  .object({
    name: SnapshotName.optional().describe('Name to restore by, unique within the tenant; default none (use the id).'),
    process: z.boolean().optional().describe(
      'Containers: also checkpoint memory and processes (CRIU); answered Unimplemented, with the reason, where `criu check` fails on the host. '
      + 'microvm sandboxes: ignored, their snapshot always captures the whole machine (kind `vm`: RAM, processes, devices and the writable disk).'),
  })
  .strict();
export type SnapshotRequest = z.infer<typeof SnapshotRequest>;

/** A snapshot as the API returns it. */
export const Snapshot = z.object({
  id: z.string().describe('Snapshot id: `snap-` and 16 lowercase hex characters.'),
  tenant: z.string().describe('The tenant it belongs to (docs/SECURITY.md "Tenancy"): `system` for what the Unix socket made.'),
  name: z.string().nullable().describe('Unique within its tenant: two tenants may each have a snapshot of the same name.'),
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
