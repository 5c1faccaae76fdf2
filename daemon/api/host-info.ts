/**
 * The host info document (GET /v1/host, `dsec host info`): capacity, runtime, cgroups,
 * the uid pool, pools, optional features and every defence, each saying whether it is in
 * force on this host and why. Built from the live subsystems at each request, in the
 * wire's shape (daemon/api/wire/host.ts).
 */
import os from 'node:os';
import type { z } from 'zod';
import type { HostInfo } from './schema.js';
import type { DaemonConfig } from '../config.js';
import type { CgroupManager } from '../host/cgroups/index.js';
import type { CriuProbe } from '../host/criu.js';
import { BUILDER_SLOT_IDS, type Builder } from '../host/builder.js';
import type { ContainerDriver } from '../drivers/container/driver.js';
import type { MicrovmDriver } from '../drivers/microvm/driver.js';
import type { FncallPools } from '../fncall/pool.js';
import type { SandboxNetworking } from '../net/network.js';
import { overlayLayerNaming } from '../image/rootfs.js';
import { monitorPid, type SeccompMonitor } from '../security/seccomp-monitor.js';
import { CORE_DENIALS, profileInfo } from '../security/seccomp.js';
import type { WritableLayerStore } from '../storage/writable-layers.js';
import type { SandboxRepo } from '../db/sandboxes.js';
import { BACKENDS } from '../model/backend.js';
import type { Backends } from '../sandbox/backends.js';
import type { DiskQuotaWatch } from '../sandbox/disk-quota.js';
import type { WarmPools } from '../sandbox/warm-pool.js';
import { DSEC_VERSION } from '../version.js';
import path from 'node:path';

/** What the document is read from. */
export interface HostInfoSources {
  config: DaemonConfig;
  cgroups: CgroupManager;
  runtime: { name: string; path: string; version: string };
  backends: Backends;
  container: Pick<ContainerDriver, 'apparmorStatus' | 'landlockStatus' | 'readonlyPathsStatus'>;
  microvm: Pick<MicrovmDriver, 'capabilities' | 'accelInfo'>;
  repo: Pick<SandboxRepo, 'rangesInUse' | 'poolRanges' | 'countByState'>;
  fncall: Pick<FncallPools, 'stats'>;
  warm: Pick<WarmPools, 'stats'>;
  /** `criu check`, run once in the background. */
  criu: Promise<CriuProbe>;
  schedIdle: { available: boolean; reason: string };
  coreSched: { available: boolean; reason: string };
  network: Pick<SandboxNetworking, 'hostDefences'>;
  storage: WritableLayerStore;
  disks: Pick<DiskQuotaWatch, 'poolInfo'>;
  seccompMonitor: SeccompMonitor | null;
  builder: Builder | undefined;
  /** Fleet membership (daemon/fleet/): its status, or null when no fleet is configured. */
  fleet: () => z.infer<typeof HostInfo>['fleet'];
}

/**
 * Host info's `mount_table_paths_hidden`: whether a container sandbox's mount table
 * (/proc/self/mountinfo) names host paths. Enforced where sandbox overlays are mounted
 * from fds (daemon/image/rootfs.ts); before this process mounted one, predicted from the
 * kernel release (6.15 takes detached layer clones as fds).
 */
function mountTableStatus(): { enforced: boolean; detail: string } {
  const still = 'still visible: the host uid/gid base of the sandbox\'s range (tmpfs uid= options; also /proc/self/uid_map), device numbers, the host devtmpfs\'s size, and the host\'s block device names through /sys/block and /proc/partitions (docs/SECURITY.md "What a sandbox sees of the host\'s mounts")';
  const hidden = 'container sandboxes\' /proc/self/mountinfo names no host path: the root overlay is mounted from fds of detached layer clones (lowerdir+=/, upperdir=/upper), the agent and resolv.conf are bound from the instance\'s tmpfs (source "dsec")';
  const n = overlayLayerNaming();
  if (n.naming === 'hidden') return { enforced: true, detail: `${hidden}; ${still}` };
  if (n.naming === 'host-paths') return { enforced: false, detail: `this kernel refused overlay layers as fds (${n.reason}): the root overlay's options show the host paths of its layers and writable layer; the agent and resolv.conf are bound from the instance's tmpfs` };
  const [major, minor] = os.release().split('.').map((x) => parseInt(x, 10));
  const able = major > 6 || (major === 6 && minor >= 15);
  return { enforced: able, detail: `no sandbox root mounted yet by this dsecd; kernel ${os.release()} ${able ? 'takes' : 'predates'} overlay layers as fds of detached clones (6.15)${able ? `: ${hidden}; ${still}` : ': the root overlay\'s options will show host paths'}` };
}

/** A container-tier host defence with the other tiers' caveat appended. */
function withTiers(d: { enforced: boolean; detail: string }, others: string): { enforced: boolean; detail: string } {
  return { enforced: d.enforced, detail: `container/fncall: ${d.detail}; ${others}` };
}

/**
 * The `io_weight` and `io_max` host defences: what the cgroups of this host enforce of
 * per-sandbox I/O settings on the writable-layer store's device (CgroupManager.ioSupport),
 * one entry each, so a host where limits hold only for direct I/O says so.
 */
async function ioDefences(cg: CgroupManager, storage: WritableLayerStore): Promise<Record<'io_weight' | 'io_max', { enforced: boolean; detail: string }>> {
  const dev = storage.blockDevice();
  const s = await cg.ioSupport(dev);
  const where = dev ? `container sandboxes, on the writable-layer store's device ${dev.name} (${dev.major}:${dev.minor}); microvm/vm: not applied` : 'container sandboxes';
  return {
    io_weight: { enforced: s.weightEnforced, detail: `${where}: ${s.detail}` },
    io_max: {
      enforced: s.limitEnforced && s.bufferedWritesLimited,
      detail: `${where}: ${s.limitEnforced ? (s.bufferedWritesLimited ? 'enforced for reads, direct I/O and buffered writes' : 'PARTLY enforced: reads and direct I/O only, buffered writes are not limited') : 'not enforced'}. ${s.detail}`,
    },
  };
}

/** The host info document, read now. */
export async function hostInfo(s: HostInfoSources): Promise<z.infer<typeof HostInfo>> {
  const { config, cgroups: cg, microvm, builder, storage, seccompMonitor } = s;
  return {
    version: DSEC_VERSION,
    instance: config.instance,
    root: config.root,
    socket: config.socket,
    kernel: os.release(),
    cores: os.cpus().length,
    memory_bytes: os.totalmem(),
    cgroup: { version: cg.version, parents: cg.parents },
    runtime: { name: s.runtime.name, path: s.runtime.path, version: s.runtime.version },
    backends: Object.fromEntries(BACKENDS.map((b) => {
      const c = s.backends.caps(b);
      return [b, { available: c.available, reason: c.reason }];
    })),
    uid_pool: {
      base: config.uidPool.base, size: config.uidPool.size, range_size: config.uidPool.rangeSize,
      in_use: s.repo.rangesInUse, free: s.repo.poolRanges - s.repo.rangesInUse,
    },
    sandboxes: s.repo.countByState(),
    fncall_pools: s.fncall.stats(),
    warm_pools: s.warm.stats(),
    features: {
      filesystem_snapshots: { available: true, reason: null },
      process_checkpoints: await s.criu.then((c) => ({ available: false, reason: c.available ? 'criu check passes, but container process checkpoints are not built yet' : c.reason })),
      vm_snapshots: microvm.capabilities('microvm').available
        ? { available: true, reason: 'microvm snapshots capture the whole machine (QMP migration of RAM and devices plus a copy of the writable disk); restores and forks resume its processes' }
        : { available: false, reason: `microvm backend unavailable: ${microvm.capabilities('microvm').reason}` },
      trajectory_log: { available: true, reason: null },
      kvm: await microvm.accelInfo(),
    },
    defences: {
      // Entries without a tier in their detail are the container tier's (container and fncall); the microvm and vm tiers have their own entries below.
      user_namespace: { enforced: true, detail: 'container/fncall: each sandbox has its own uid/gid range; root inside is an unprivileged uid outside' },
      capabilities: { enforced: true, detail: 'container/fncall: Docker default set; no CAP_SYS_PTRACE, CAP_SYS_ADMIN' },
      no_new_privileges: { enforced: true, detail: 'container/fncall: set on every sandbox process' },
      microvm_guest: {
        enforced: true,
        detail: 'microvm tier, inside the guest (the guest agent applies it at every boot, before any command runs; per sandbox in `dsec inspect`): readonly_paths/writable_paths as for containers (read-only root mount, read-write binds), '
          + 'every command with Docker\'s default capability set (bounding, effective, permitted), no_new_privs, and a seccomp filter of the profile\'s x86-64 rules (EPERM; other ABIs killed; denials not counted), Landlock on the writable paths where the guest kernel has it; '
          + 'not in the guest: user namespace (commands run as guest root; the VMM runs as the sandbox\'s host uid), AppArmor, denial counting, networking (mode none only)',
      },
      vm_guest: { enforced: false, detail: 'vm tier: nothing is confined inside the guest (root with every capability, writable root, no seccomp); the guest kernel and the VMM confinement are the boundary; networking: mode none only' },
      agent_endpoint_hidden: { enforced: true, detail: 'agent socket is an inherited fd; not a path in the sandbox' },
      mount_table_paths_hidden: mountTableStatus(),
      sched_idle: { enforced: s.schedIdle.available, detail: `batch sandboxes run as SCHED_IDLE with minimal CPU shares: ${s.schedIdle.reason}` },
      core_scheduling: { enforced: s.coreSched.available, detail: s.coreSched.reason },
      seccomp: ((i) => ({
        enforced: i.denied > 0,
        detail: `profile ${i.file} (sha256 ${i.sha256.slice(0, 12)}) on every container sandbox and fncall worker (microvm: see microvm_guest): `
          + (i.denied === 0 ? 'it denies no syscall'
            : `${i.denied} syscalls denied; ${i.missing_core.length ? `lacks core denials: ${i.missing_core.join(', ')}` : `includes every core denial (${CORE_DENIALS.length}: bpf, the mount family, kexec, modules, keyrings, open_by_handle_at, userfaultfd, perf_event_open, io_uring, ptrace, setns)`}`),
      }))(profileInfo()),
      seccomp_denial_counting: seccompMonitor?.available
        ? { enforced: true, detail: `denials answered EPERM and counted per sandbox by the seccomp monitor (pid ${monitorPid(path.join(config.root, 'seccomp')) ?? '?'}; SCMP_ACT_NOTIFY): seccomp.denied events, seccomp_denials in stats` }
        : { enforced: false, detail: `seccomp monitor not reachable (${seccompMonitor?.reason ?? 'not started'}): new sandboxes get plain EPERM rules, uncounted` },
      apparmor: s.container.apparmorStatus(),
      landlock: withTiers(s.container.landlockStatus(), 'microvm: applied in the guest where the guest kernel has Landlock (see each sandbox\'s defences); vm: not applied'),
      readonly_paths: withTiers(s.container.readonlyPathsStatus(), 'microvm: the same plan, enforced in the guest by read-only mounts; vm: not enforced'),
      ...s.network.hostDefences(),
      disk_quota: storage.status(),
      ...(await ioDefences(cg, storage)),
      builder_identity: builder
        ? { enforced: true, detail: `image imports, builds, commits and snapshots extract, copy and run mkfs.erofs as uid 0 of a user namespace mapped to host ids ${builder.range.base}-${builder.range.base + builder.range.size - 1} (${builder.slots} slots of ${BUILDER_SLOT_IDS}), disjoint from every sandbox's range, with no network; root only opens inputs, decides overlay opaque markers, publishes blobs and mounts; debootstrap and apt of image bootstrap run as root` }
        : { enforced: false, detail: '[builder] enabled = false: imports, builds, commits and snapshots extract and pack trees as root' },
    },
    storage: { ...storage.info(), pool: s.disks.poolInfo(), device: ((d) => (d ? `${d.major}:${d.minor}` : null))(storage.blockDevice()) },
    fleet: s.fleet() ?? null,
  };
}
