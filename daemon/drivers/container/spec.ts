/**
 * OCI runtime spec (config.json) for a container sandbox. Pure: same input, same spec;
 * unit-tested in test/unit/spec.test.ts.
 *
 * The container's init is the dsec agent (native/agent), bind-mounted read-only at
 * {@link AGENT_PATH} and started with `--listen-fd 3`: fd 3 is the listening socket that
 * dsecd bound at a host path the sandbox's mount namespace does not contain.
 *
 * Priority classes (see daemon/host/sched.ts): a `batch` sandbox's agent also gets
 * `--sched-idle` (it and every process it forks run as SCHED_IDLE), its cgroup gets the
 * smallest CPU weight (cpu.shares 2; cgroup v2 also cpu.idle 1) and RLIMIT_NICE 0 so no
 * process inside can switch itself back to SCHED_OTHER. A `latency` sandbox (the
 * default) gets the spec it always had. `--core-sched` (one core-scheduling cookie per
 * sandbox) is passed when the caller says the host has core scheduling.
 *
 * Workers (`worker: true`): the pre-warmed containers of the `fncall` tier, whose agent
 * runs every call in fresh pid/mount/IPC/UTS namespaces (EXEC `ISOLATE`,
 * docs/AGENT_PROTOCOL.md). Creating those namespaces and mounting the per-call tmpfs and
 * /proc needs CAP_SYS_ADMIN in the sandbox's user namespace, so a worker's spec adds
 * exactly that one capability ({@link WORKER_AGENT_CAPS}) and passes `--worker` to the
 * agent, which drops it from its bounding (and inheritable) set at start: the agent keeps
 * it in its permitted/effective set, but no program it executes can ever hold it (root's
 * capabilities after execve come from the bounding set; no_new_privs is set too). So the
 * commands of a worker get exactly {@link DEFAULT_CAPS}, like any other sandbox's. The
 * capability is namespaced: it is CAP_SYS_ADMIN over the sandbox's own user namespace
 * (its mounts, its namespaces), never over the host. The image is read-only in a worker
 * (`root.readonly`): nothing a call writes outside its fresh tmpfs mounts can reach the
 * next call (the agent also makes every mount read-only inside each call). Everything
 * else is the spec of an ordinary sandbox; without `worker` the spec is unchanged.
 *
 * seccomp: every sandbox gets `linux.seccomp` from daemon/security/seccomp.ts (the default
 * profile with the image's and the sandbox's overrides). A worker's filter leaves mount,
 * mount_setattr and umount2 to its agent, which re-denies them with a second filter in every
 * process it starts (see that module).
 *
 * Filesystem (daemon/security/filesystem.ts, docs/SECURITY.md "Filesystem"): with a plan
 * ({@link SpecInput.filesystem}) the root is read-only unless the plan says otherwise, and
 * each planned bind (a writable top-level directory, a writable exception, a read-only
 * path below a writable one) is a runc bind of `<rootfs><path>` onto `<path>`, FIRST in
 * `mounts`, parents before children: every other mount (the agent under /dev, files the
 * runtime generates under /etc) then lands on top of them. Writable binds are
 * `nosuid,nodev`. With `landlock` the agent gets `--landlock` and one `--writable PATH`
 * per writable place of the plan. A worker keeps its fully read-only root and no binds:
 * only `--landlock` reaches it (each isolated call applies it; native/agent/isolate.c).
 *
 * AppArmor: `process.apparmorProfile` only when the caller passes a loaded profile's name
 * ({@link SpecInput.apparmorProfile}); the driver does so only where the kernel has
 * AppArmor (daemon/security/apparmor.ts). Elsewhere the spec never names one.
 */
import { containerCgroupLimits } from '../cgroup-limits.js';
import path from 'node:path';
import { buildSeccomp, type OciSeccomp } from '../../security/seccomp.js';
import type { FilesystemPlan } from '../../security/filesystem.js';
import type { SeccompOverride } from '../../model/image.js';

/** Where the agent binary appears inside the sandbox. Under /dev (a tmpfs runc creates), so the writable layer stays untouched. */
export const AGENT_PATH = '/dev/.dsec-agent';

/**
 * Capabilities of processes in a sandbox: Docker's default set. CAP_SYS_PTRACE is
 * deliberately absent: with it, root in the sandbox could ptrace the agent (PID 1) or
 * open /proc/1/fd and reach the agent's listening socket.
 */
export const DEFAULT_CAPS = [
  'CAP_CHOWN', 'CAP_DAC_OVERRIDE', 'CAP_FSETID', 'CAP_FOWNER', 'CAP_MKNOD', 'CAP_NET_RAW', 'CAP_SETGID',
  'CAP_SETUID', 'CAP_SETFCAP', 'CAP_SETPCAP', 'CAP_NET_BIND_SERVICE', 'CAP_SYS_CHROOT', 'CAP_KILL', 'CAP_AUDIT_WRITE',
] as const;

/**
 * Capabilities a worker's agent holds on top of {@link DEFAULT_CAPS}, for itself only (see
 * the module comment): CAP_SYS_ADMIN, to create per-call namespaces and mount in them.
 * The alternative, a nested user namespace per call, needs no extra capability but
 * cannot mount a fresh /proc: every mount copied into a less privileged user namespace is
 * locked, and the kernel refuses a new proc mount while the sandbox's /proc has locked
 * mounts over files (runc's masked paths such as /proc/kcore); see native/agent/isolate.c.
 */
export const WORKER_AGENT_CAPS = ['CAP_SYS_ADMIN'] as const;

/** Agent flag of a worker: drop {@link WORKER_AGENT_CAPS} from the bounding set at start, serve isolated execs. */
export const AGENT_FLAG_WORKER = '--worker';

/** Agent flag that puts the agent and every process it forks in SCHED_IDLE (batch sandboxes). */
export const AGENT_FLAG_SCHED_IDLE = '--sched-idle';

/** Agent flag that gives the sandbox its own core-scheduling cookie (hosts with core scheduling). */
export const AGENT_FLAG_CORE_SCHED = '--core-sched';

/** Agent flag: restrict file access with Landlock (native/agent/landlock.c). */
export const AGENT_FLAG_LANDLOCK = '--landlock';

/** Agent flag naming one writable place for Landlock (repeated; follows {@link AGENT_FLAG_LANDLOCK}). */
export const AGENT_FLAG_WRITABLE = '--writable';

/** Inputs of {@link buildSpec}. */
export interface SpecInput {
  /** Sandbox id; also the hostname. */
  id: string;
  /** Absolute path of the prepared rootfs (overlay mount). */
  rootfs: string;
  /** Host path of the agent binary. */
  agentBinary: string;
  /**
   * Sysfs directories masked with a read-only bind of `dir` (an empty host directory,
   * host/sandbox-files.ts maskDir) instead of a tmpfs each: `paths`, those of
   * {@link SYSFS_MASKED_DIRS} that exist on the host (a bind needs its mount point, and
   * sysfs is read-only). Default: none, every masked path is a tmpfs or /dev/null as the
   * runtime masks it (OCI linux.maskedPaths).
   */
  sysMasks?: { dir: string; paths: string[] };
  /** First host uid/gid of the sandbox's range, and its size. */
  uidBase: number;
  uidCount: number;
  /** runtime cgroupsPath (relative; see daemon/host/cgroups). */
  cgroupsPath: string;
  /** Limits: cores (fractional), bytes, processes. */
  cpus: number;
  memoryBytes: number;
  pids: number;
  /** CPU priority class; default `latency` (see the module comment). */
  priority?: 'latency' | 'batch';
  /**
   * cgroup version of the host (daemon/host/cgroups); default 1. Only on 2 does a batch
   * sandbox get `unified: {"cpu.idle": "1"}` — runc refuses `unified` on v1 hosts.
   */
  cgroupVersion?: 1 | 2;
  /** Pass `--core-sched` to the agent (set when detectCoreScheduling() says available); default false. */
  coreScheduling?: boolean;
  /**
   * An `fncall` worker (see the module comment): the agent gets CAP_SYS_ADMIN for itself
   * and `--worker`, the root filesystem is read-only. Default false: an ordinary sandbox.
   */
  worker?: boolean;
  /** seccomp overrides of the sandbox's image and of the sandbox (daemon/security/seccomp.ts). */
  seccomp?: { image?: SeccompOverride; sandbox?: SeccompOverride };
  /**
   * Count this sandbox's seccomp denials through the instance's seccomp monitor
   * (daemon/security/seccomp-monitor.ts): the EPERM rules become SCMP_ACT_NOTIFY rules
   * whose listener is `listenerPath`, with the sandbox id as metadata. Default: none
   * (plain EPERM rules, nothing counted).
   */
  seccompNotify?: { listenerPath: string; metadata: string };
  /**
   * The `linux.seccomp` object to use as is (tests); default: built from the default
   * profile, {@link SpecInput.seccomp} and {@link SpecInput.worker}.
   */
  seccompFilter?: OciSeccomp;
  /**
   * Name of the sandbox's loaded AppArmor profile (daemon/security/apparmor.ts), set as
   * `process.apparmorProfile`. Only given where the kernel has AppArmor and the profile
   * is loaded: runc fails to start a container whose profile it cannot apply. Default:
   * none, and the spec has no `apparmorProfile` key.
   */
  apparmorProfile?: string;
  /**
   * Network of an `allow`/`open` sandbox (daemon/net/network.ts): the generated
   * resolv.conf (host path) is bind-mounted read-only at /etc/resolv.conf, and
   * CAP_NET_RAW is dropped, because raw and packet sockets would bypass the socket-level
   * egress hooks. The netns stays runc's own; dsecd plugs a veth into it after start.
   * Default: mode none, the spec is unchanged (loopback only).
   */
  network?: { resolvConf: string };
  /**
   * Read-only root, binds and Landlock (see the module comment), from planFilesystem()
   * over the mounted rootfs, plus whether Landlock is on. Default: none of it (a writable
   * root, no binds, no Landlock), the spec of a sandbox without filesystem hardening.
   */
  filesystem?: FilesystemPlan & { landlock: boolean };
}

/**
 * Paths masked and made read-only in /proc and /sys: runc's default spec's, plus
 * `/sys/devices/virtual/block`, the host's loop, zram and device-mapper devices, where
 * each loop device's `loop/backing_file` names the file behind it on the host (the
 * writable-layer store's image under dsecd's root, other instances' stores, whatever
 * else the host loop-mounts), which the mount table hides (docs/SECURITY.md "What a
 * sandbox sees of the host's mounts"). Their names stay listed in /sys/block and
 * /proc/partitions.
 */
const MASKED_PATHS = [
  '/proc/acpi', '/proc/asound', '/proc/kcore', '/proc/keys', '/proc/latency_stats', '/proc/timer_list',
  '/proc/timer_stats', '/proc/sched_debug', '/proc/scsi', '/sys/firmware', '/sys/devices/virtual/powercap',
  '/sys/devices/virtual/block',
];
/**
 * The directories of {@link MASKED_PATHS} in sysfs, masked with a read-only bind of one
 * shared empty directory ({@link SpecInput.sysMasks}) rather than a tmpfs each, which is
 * a superblock per sandbox per path. Those in /proc stay tmpfs: runc refuses a bind whose
 * destination is inside /proc unless its source is procfs.
 */
export const SYSFS_MASKED_DIRS: readonly string[] = ['/sys/firmware', '/sys/devices/virtual/powercap', '/sys/devices/virtual/block'];
/** Paths the runtime bind-mounts read-only over themselves (OCI linux.readonlyPaths). */
export const READONLY_PATHS: readonly string[] = ['/proc/bus', '/proc/fs', '/proc/irq', '/proc/sys', '/proc/sysrq-trigger'];

/** Builds the OCI spec (runtime-spec 1.0.2 as runc 1.1 reads it). */
export function buildSpec(i: SpecInput): Record<string, unknown> {
  const caps: string[] = DEFAULT_CAPS.filter((c) => !(i.network && c === 'CAP_NET_RAW'));
  if (i.worker) caps.push(...WORKER_AGENT_CAPS);
  const batch = i.priority === 'batch';
  const args = [AGENT_PATH, '--listen-fd', '3'];
  if (batch) args.push(AGENT_FLAG_SCHED_IDLE);
  if (i.coreScheduling) args.push(AGENT_FLAG_CORE_SCHED);
  if (i.worker) args.push(AGENT_FLAG_WORKER);
  const fsPlan = i.filesystem;
  if (fsPlan?.landlock) {
    args.push(AGENT_FLAG_LANDLOCK);
    if (!i.worker) for (const w of fsPlan.writable) args.push(AGENT_FLAG_WRITABLE, w);
  }
  // Workers keep a fully read-only root: no binds (isolated calls get fresh tmpfs mounts).
  // A writable place carries nosuid/nodev twice: as remount flags (runc applies them so)
  // and as the recursive attributes rnosuid/rnodev (mount_setattr, OCI runtime-spec 1.1),
  // because crun 1.8 in a user namespace applies a bind's flags only when it is read-only
  // and would leave a writable place suid and dev (test/integration/runtime-crun.test.ts).
  const binds = i.worker || !fsPlan ? [] : fsPlan.binds.map((b) => ({
    destination: b.path, type: 'bind', source: path.join(i.rootfs, b.path),
    options: b.readonly ? ['rbind', 'ro'] : ['rbind', 'rw', 'nosuid', 'nodev', 'rnosuid', 'rnodev'],
  }));
  // The limits crun's launcher writes itself (containerCgroupLimits), as runc reads them.
  const limits = containerCgroupLimits(i);
  const cpu: Record<string, number> = { quota: limits.cpuQuotaUs, period: limits.cpuPeriodUs };
  if (limits.cpuShares !== null) cpu.shares = limits.cpuShares;
  const proc: Record<string, unknown> = {
    terminal: false,
    user: { uid: 0, gid: 0 },
    args,
    env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'],
    cwd: '/',
    capabilities: { bounding: caps, effective: caps, permitted: caps },
    noNewPrivileges: true,
    oomScoreAdj: 0,
  };
  // Leaving SCHED_IDLE without CAP_SYS_NICE needs RLIMIT_NICE ≥ 20 − nice; 0 closes that
  // door whatever limit dsecd itself inherited (e.g. systemd's LimitNICE=).
  if (batch) proc.rlimits = [{ type: 'RLIMIT_NICE', hard: 0, soft: 0 }];
  if (i.apparmorProfile) proc.apparmorProfile = i.apparmorProfile;
  const resources: Record<string, unknown> = {
    memory: { limit: limits.memoryBytes },
    cpu,
    pids: { limit: limits.pids },
    devices: [{ allow: false, access: 'rwm' }],
  };
  if (batch && i.cgroupVersion === 2) resources.unified = { 'cpu.idle': '1' };
  return {
    ociVersion: '1.0.2',
    process: proc,
    root: { path: i.rootfs, readonly: !!i.worker || !!fsPlan?.readonlyRoot },
    hostname: i.id,
    mounts: [
      ...binds,
      { destination: '/proc', type: 'proc', source: 'proc', options: ['nosuid', 'noexec', 'nodev'] },
      { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'] },
      { destination: '/dev/pts', type: 'devpts', source: 'devpts', options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620'] },
      { destination: '/dev/shm', type: 'tmpfs', source: 'shm', options: ['nosuid', 'noexec', 'nodev', 'mode=1777', 'size=65536k'] },
      { destination: '/dev/mqueue', type: 'mqueue', source: 'mqueue', options: ['nosuid', 'noexec', 'nodev'] },
      { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] },
      ...(i.sysMasks?.paths ?? []).map((p) => ({ destination: p, type: 'bind', source: i.sysMasks!.dir, options: ['bind', 'ro', 'nosuid', 'nodev', 'noexec'] })),
      { destination: AGENT_PATH, type: 'bind', source: i.agentBinary, options: ['bind', 'ro', 'nosuid', 'nodev'] },
      ...(i.network ? [{ destination: '/etc/resolv.conf', type: 'bind', source: i.network.resolvConf, options: ['bind', 'ro', 'nosuid', 'nodev', 'noexec'] }] : []),
    ],
    linux: {
      uidMappings: [{ containerID: 0, hostID: i.uidBase, size: i.uidCount }],
      gidMappings: [{ containerID: 0, hostID: i.uidBase, size: i.uidCount }],
      namespaces: [{ type: 'pid' }, { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }, { type: 'network' }, { type: 'user' }, { type: 'cgroup' }],
      cgroupsPath: i.cgroupsPath,
      resources,
      maskedPaths: i.sysMasks ? MASKED_PATHS.filter((p) => !i.sysMasks!.paths.includes(p)) : MASKED_PATHS,
      readonlyPaths: READONLY_PATHS,
      rootfsPropagation: 'private',
      seccomp: i.seccompFilter ?? buildSeccomp({ image: i.seccomp?.image, sandbox: i.seccomp?.sandbox, worker: !!i.worker, notify: i.seccompNotify }),
    },
  };
}
