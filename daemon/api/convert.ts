/**
 * The boundary between the wire and the domain: each request the API parsed (zod,
 * daemon/api/schema.ts) becomes a model input (daemon/model/) here, once, and each record
 * the lifecycle returns becomes its wire view here. Nothing below the API reads a wire
 * type. Field by field; absent stays absent (the lifecycle applies defaults in one place,
 * daemon/sandbox/resolve.ts).
 */
import { invalidArgument } from '../errors.js';
import type { ExecInput, StartExecInput } from '../model/exec.js';
import { hasIoMax, type IoLimits } from '../model/resources.js';
import type { SandboxInput, SandboxRecord } from '../model/sandbox.js';
import type { ForkInput, RestoreInput, SnapshotInput, SnapshotRecord } from '../model/snapshot.js';
import type { RunCall } from '../fncall/run.js';
import type {
  CreateSandboxRequest, ExecRequest, ForkRequest, RestoreRequest, RunRequest, Sandbox, Snapshot, SnapshotRequest, StartExecRequest,
} from './schema.js';

/**
 * POST /v1/sandboxes: the create the request asks for.
 * @throws DsecError InvalidArgument for backend fncall: that tier runs calls (POST /v1/run), not sandboxes.
 */
export function sandboxInput(req: CreateSandboxRequest): SandboxInput {
  if (req.backend === 'fncall') {
    throw invalidArgument('fncall is the stateless tier: run calls with POST /v1/run (`dsec run --backend fncall` or `dsec call`), not as a sandbox');
  }
  const m = req.io_max;
  return {
    backend: req.backend, image: req.image, cpus: req.cpus, memoryBytes: req.memory_bytes, pids: req.pids, labels: req.labels, env: req.env,
    ttlS: req.ttl_s, priority: req.priority, idleTimeoutS: req.idle_timeout_s, seccomp: req.seccomp, network: req.network,
    diskBytes: req.disk_bytes, filesystem: req.filesystem, ioWeight: req.io_weight,
    ioMax: m ? { readBps: m.read_bps, writeBps: m.write_bps, readIops: m.read_iops, writeIops: m.write_iops } : undefined,
  };
}

/** POST /v1/snapshots/{ref}/restore: the overrides the request names. */
export function restoreInput(req: RestoreRequest): RestoreInput {
  return {
    labels: req.labels, env: req.env, cpus: req.cpus, memoryBytes: req.memory_bytes, pids: req.pids, ttlS: req.ttl_s, priority: req.priority,
    idleTimeoutS: req.idle_timeout_s, seccomp: req.seccomp, network: req.network, diskBytes: req.disk_bytes, filesystem: req.filesystem,
  };
}

/** POST /v1/snapshots/{ref}/fork. */
export function forkInput(req: ForkRequest): ForkInput {
  return { ...restoreInput(req), count: req.count };
}

/** POST /v1/sandboxes/{id}/snapshot. */
export function snapshotInput(req: SnapshotRequest): SnapshotInput {
  return { name: req.name, process: req.process };
}

/** POST /v1/sandboxes/{id}/exec: the command, its stdin decoded, and its trajectory step if it names one. */
export function execInput(req: ExecRequest): ExecInput {
  return {
    argv: req.argv, env: req.env, cwd: req.cwd, user: req.user, timeoutMs: req.timeout_ms,
    stdin: req.stdin_b64 !== undefined ? Buffer.from(req.stdin_b64, 'base64') : undefined,
    trajectory: req.trajectory !== undefined && req.step !== undefined ? { id: req.trajectory, step: req.step, truncate: req.truncate ?? false } : undefined,
  };
}

/** POST /v1/sandboxes/{id}/execs: an exec session. */
export function startExecInput(req: StartExecRequest): StartExecInput {
  return {
    argv: req.argv, env: req.env, cwd: req.cwd, user: req.user, timeoutMs: req.timeout_ms,
    stdin: !!req.stdin, tty: req.tty, paced: !!req.paced,
  };
}

/** POST /v1/run (and each call of /v1/run:batch). */
export function runInput(req: RunRequest): RunCall {
  return {
    backend: req.backend, image: req.image, argv: req.argv, env: req.env, cwd: req.cwd, user: req.user,
    stdin: req.stdin_b64 !== undefined ? Buffer.from(req.stdin_b64, 'base64') : undefined,
    timeoutMs: req.timeout_ms, memoryBytes: req.memory_bytes, cpus: req.cpus, pids: req.pids,
  };
}

/** The wire's `io_max` of `io`: the limits it sets, or null when it sets none. */
function ioMaxView(io: IoLimits | null): Sandbox['io_max'] {
  if (!io || !hasIoMax(io)) return null;
  return {
    ...(io.readBps !== null ? { read_bps: io.readBps } : {}), ...(io.writeBps !== null ? { write_bps: io.writeBps } : {}),
    ...(io.readIops !== null ? { read_iops: io.readIops } : {}), ...(io.writeIops !== null ? { write_iops: io.writeIops } : {}),
  };
}

/** A sandbox as the API returns it (`init_pid` only while running or paused). */
export function sandboxView(s: SandboxRecord): Sandbox {
  return {
    id: s.id,
    tenant: s.tenant,
    backend: s.backend,
    image: s.image,
    image_layers: s.imageLayers,
    state: s.state,
    cpus: s.cpus,
    memory_bytes: s.memoryBytes,
    pids: s.pids,
    labels: s.labels,
    env: s.env,
    ttl_s: s.ttlS,
    created_at: s.createdAt,
    updated_at: s.updatedAt,
    init_pid: s.state === 'running' || s.state === 'paused' ? s.initPid : null,
    uid_base: s.uidBase,
    uid_count: s.uidCount,
    error: s.error,
    priority: s.priority,
    idle_timeout_s: s.idleTimeoutS,
    last_active_at: s.lastActiveAt,
    snapshot: s.snapshotId,
    seccomp: s.seccomp,
    network: s.network,
    disk_bytes: s.diskBytes,
    filesystem: s.filesystem,
    io_weight: s.io?.weight ?? null,
    io_max: ioMaxView(s.io),
  };
}

/** A snapshot as the API returns it. */
export function snapshotView(s: SnapshotRecord): Snapshot {
  return {
    id: s.id, tenant: s.tenant, name: s.name, kind: s.kind, sandbox_id: s.sandboxId, backend: s.backend, image: s.image, image_layers: s.imageLayers,
    layer: s.layer, size_bytes: s.sizeBytes, cpus: s.cpus, memory_bytes: s.memoryBytes, pids: s.pids, priority: s.priority,
    labels: s.labels, env: s.env, created_at: s.createdAt,
    machine: s.machine ? {
      qemu_version: s.machine.qemuVersion, accel: s.machine.accel, memory_mib: s.machine.memoryMiB, vcpus: s.machine.vcpus,
      state_bytes: s.machine.stateBytes, state_sha256: s.machine.stateSha256, disk_bytes: s.machine.diskBytes,
      disk_allocated_bytes: s.machine.diskAllocatedBytes, disk_reflinked: s.machine.diskReflinked, paused_ms: s.machine.pausedMs,
    } : null,
  };
}
