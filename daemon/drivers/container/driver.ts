/**
 * The `container` backend: an OCI runtime (runc/crun) container whose rootfs is an
 * overlayfs over idmapped EROFS layers, in its own user namespace and uid range, with
 * the dsec agent as PID 1.
 *
 * Host layout of one sandbox (all under `<root>/sandboxes/<id>/`):
 *   config.json   OCI spec (the bundle)
 *   rootfs/       overlay mount (lower: lower/<i> idmapped EROFS mounts; upper/, work/)
 *   upper/ work/  the writable layer when it is on the host filesystem (upper_fs = "host",
 *                 or created before the store); otherwise it is the sandbox's entry in the
 *                 writable-layer store (daemon/storage/store.ts). Survives stop/start,
 *                 removed by destroy
 *   agent.sock    the agent's listening socket (host path; not in the sandbox's mount ns)
 *   agent.log     the agent's stderr; runtime.log the runtime's log
 *   apparmor.profile  the sandbox's AppArmor profile (only where the kernel has AppArmor)
 *   upper-created.json  paths dsec created in upper/ (see {@link ContainerDriver.recordUpperCreated})
 *
 * Filesystem hardening (daemon/security/filesystem.ts): at every create and start, once
 * the rootfs is mounted and before the runtime runs, the sandbox's resolved filesystem
 * options are planned over the composed tree (read-only root, self-binds of writable
 * places, directories to create) and go into the spec, with `--landlock` for the agent.
 */
import net from 'node:net';
import { execFileSync } from 'node:child_process';
import { closeSync, existsSync, openSync, readFileSync } from 'node:fs';
import { chmod, chown, lstat, mkdir, readdir, rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from 'pino';
import type { CgroupManager } from '../../host/cgroups/index.js';
import type { LayerMounts } from '../../image/mounts.js';
import { prepareRootfs, teardownRootfs, removeSandboxDir, listMountsUnder } from '../../image/rootfs.js';
import type { AgentExecHandle } from '../../agent/client.js';
import { AgentConnections, refuseBadCwdOrUser } from '../agent-connections.js';
import { DsecError, failedPrecondition, internal } from '../../errors.js';
import type { StepObserver } from '../../model/steps.js';
import { effectiveLayers } from '../../model/image.js';
import type { Backend } from '../../model/backend.js';
import type { AgentFiles, BackendCapabilities, LiveUpdate, DriverExecHandlers, ReclaimReport, SandboxStats, DriverExecRequest, DriverExecResult, DriverStartExecRequest, InitInfo, OrphanReport, SandboxDriver } from '../types.js';
import { buildSpec, SYSFS_MASKED_DIRS } from './spec.js';
import { CPU_PERIOD_US, containerCgroupLimits, cpuQuotaUs } from '../cgroup-limits.js';
import { hostHasSwap } from '../../host/proc.js';
import { kernelHasAppArmor, prepareSandboxProfile, profilePath, unloadProfile } from '../../security/apparmor.js';
import { procStartTime } from '../../host/proc.js';
import type { RuntimeSet } from './runtime.js';
import type { SandboxNetworking } from '../../net/network.js';
import type { SeccompMonitor } from '../../security/seccomp-monitor.js';
import { CORE_DENIALS, profileInfo } from '../../security/seccomp.js';
import type { WritableLayerStore } from '../../storage/writable-layers.js';
import type { SandboxFiles } from '../../host/sandbox-files.js';
import { createPlannedDirs, hostTree, planFilesystem, type FilesystemPlan } from '../../security/filesystem.js';
import { NO_IO_LIMITS, type IoLimits } from '../../model/resources.js';
import type { SandboxRecord, DefenceStatus } from '../../model/sandbox.js';
import type { SeccompOverride } from '../../model/image.js';
import { resolveFilesystem, type ResolvedFilesystem } from '../../model/filesystem.js';

/** How long create waits for the agent's HELLO after the runtime started the container: 15 s (TCG-free, but a loaded 2-core host under a 1,000-create burst can be slow). */
const AGENT_CONNECT_TIMEOUT_MS = 15_000;

/** Dependencies of the container driver, built once by the daemon. */
export interface ContainerDriverDeps {
  /** Instance root (state directory). */
  root: string;
  runtime: RuntimeSet;
  cgroups: CgroupManager;
  layers: LayerMounts;
  /** Host path of the static agent binary. */
  agentBinary: string;
  /**
   * The per-sandbox empty directories bound read-only over the sysfs masks
   * (host/sandbox-files.ts maskDir; spec.ts SpecInput.sysMasks): made at each start,
   * removed at destroy and by the orphan sweep. Default: none, the runtime masks them
   * with tmpfs.
   */
  masks?: Pick<SandboxFiles, 'maskDir' | 'removeMaskDir' | 'maskDirIds'>;
  /** Give each sandbox its own core-scheduling cookie (only where the kernel has core scheduling). */
  coreScheduling: boolean;
  /**
   * Per-sandbox AppArmor profiles (daemon/security/apparmor.ts): the instance name (part
   * of each profile's name) and the API socket's directory (denied in the profile).
   * Applied only when given *and* the kernel has AppArmor; otherwise no profile is
   * generated at create and the spec names none.
   */
  apparmor?: { instance: string; socketDir: string };
  /**
   * Networking of `allow`/`open` sandboxes (daemon/net/network.ts): resolv.conf in the
   * spec, veth and egress programs after the runtime started the init, removed when the
   * container is gone. Absent: every sandbox has loopback only.
   */
  network?: SandboxNetworking;
  /**
   * The instance's seccomp monitor: sandboxes created or started while it is reachable
   * have their denials counted (daemon/security/seccomp-monitor.ts). Default: none.
   */
  seccompMonitor?: SeccompMonitor;
  /** Where writable layers live and how they are limited (opened and mounted before the driver is used). */
  storage: WritableLayerStore;
  /**
   * `[filesystem]` of the config: resolves the options of a sandbox row that predates
   * them (filesystem null); newer rows carry their resolved options.
   */
  filesystemDefaults: ResolvedFilesystem;
  log: Logger;
}

/** The kernel's Landlock ABI as the agent sees it (`dsec-agent --landlock-abi`), or 0 and why not. */
export function probeLandlock(agentBinary: string): { abi: number; reason: string | null } {
  try {
    const r = JSON.parse(execFileSync(agentBinary, ['--landlock-abi'], { encoding: 'utf8', timeout: 10_000 })) as { abi: number; reason?: string };
    return r.abi > 0 ? { abi: r.abi, reason: null } : { abi: 0, reason: r.reason ?? 'the kernel has no Landlock' };
  } catch (e) {
    return { abi: 0, reason: `could not ask the agent (${agentBinary} --landlock-abi): ${(e as Error).message}` };
  }
}

/** The container backend. */
export class ContainerDriver implements SandboxDriver {
  readonly backends = ['container', 'fncall'] as const;
  /** The agent connections of its sandboxes (`<dir>/agent.sock`). */
  private readonly agents: AgentConnections;
  /** Memory-cgroup OOM kill count after the last isolated call, per fncall worker (see exec). */
  private readonly oomSeen = new Map<string, number>();
  /** Layer digests each sandbox holds a reference on (in-memory; rebuilt by adopt()). */
  private readonly held = new Map<string, string[]>();

  /** AppArmor is detected once, at construction (see {@link ContainerDriverDeps.apparmor}). */
  private readonly apparmorKernel: boolean;
  /** The kernel's Landlock ABI, asked of the agent binary once, at construction. */
  readonly landlock: { abi: number; reason: string | null };

  constructor(private readonly d: ContainerDriverDeps) {
    this.agents = new AgentConnections({ socketPath: (id) => path.join(this.dir(id), 'agent.sock'), timeoutMs: 5_000 });
    this.apparmorKernel = kernelHasAppArmor();
    this.landlock = probeLandlock(d.agentBinary);
  }

  /** Whether this host can enforce Landlock, and what it does (for `dsec host info`). */
  landlockStatus(): DefenceStatus {
    if (!this.landlock.abi) return { enforced: false, detail: `not on this host: ${this.landlock.reason}; sandboxes run without it (each reports it in \`dsec inspect\`)` };
    const on = this.d.filesystemDefaults.landlock;
    return {
      enforced: on,
      detail: `Landlock ABI ${this.landlock.abi}: ${on ? '' : 'available, but off by default ([filesystem] landlock = false); '}the agent restricts every sandbox process (fncall: each isolated call) to read and execute, plus every right on its writable paths, file writes and terminal ioctls under /dev, nothing more on /proc and /sys; per sandbox: filesystem.landlock`,
    };
  }

  /** Whether sandboxes get read-only system paths by default (for `dsec host info`). */
  readonlyPathsStatus(): DefenceStatus {
    const ro = this.d.filesystemDefaults.readonly_paths;
    if (ro.length === 0) return { enforced: false, detail: 'off by default ([filesystem] readonly_paths = []); a sandbox or image may turn it on' };
    return {
      enforced: true,
      detail: `root read-only even to root inside; read-only by default: ${ro.join(' ')}; every other top-level directory and writable_paths are read-write binds${this.d.filesystemDefaults.writable_paths.length ? ` (default writable_paths: ${this.d.filesystemDefaults.writable_paths.join(' ')})` : ''}; fncall workers: the whole image read-only`,
    };
  }

  /** The filesystem options in force for `sb` (resolved at create; older rows: now). */
  private filesystemOf(sb: SandboxRecord): ResolvedFilesystem {
    return resolveFilesystem(sb.filesystem, sb.imageConfig.security, this.d.filesystemDefaults);
  }

  /**
   * Plans the filesystem of `sb` over its mounted rootfs and creates the planned
   * directories (see daemon/security/filesystem.ts). Workers: no binds, read-only root.
   * @throws DsecError FailedPrecondition for options the image's tree cannot honour; with
   *   reason `writable_path_refused` for a writable path resolved through a symlink to
   *   where it must not lead (the reason is kept; the lifecycle records an event of it).
   */
  private async planFilesystem(sb: SandboxRecord, rootfs: string): Promise<FilesystemPlan & { landlock: boolean }> {
    const fs = this.filesystemOf(sb);
    if (sb.backend === 'fncall') return { readonlyRoot: true, binds: [], create: [], writable: [], landlock: fs.landlock };
    let plan: FilesystemPlan;
    try {
      plan = planFilesystem(fs, hostTree(rootfs));
    } catch (e) {
      if (e instanceof DsecError) throw new DsecError(e.kind, `sandbox ${sb.id}: ${e.message}`, { cause: e, reason: e.reason });
      throw e;
    }
    await createPlannedDirs(rootfs, plan, sb.uidBase!);
    if (plan.create.length) await this.recordUpperCreated(sb.id, plan.create);
    return { ...plan, landlock: fs.landlock };
  }

  /**
   * Which filesystem defences are in force for `sb` now (for GET /v1/sandboxes/{id}):
   * `readonly_paths` from the spec runc was given (`<dir>/config.json`), `landlock` from
   * what the agent reports in its HELLO. A sandbox that is not running has neither.
   */
  async defences(sb: SandboxRecord): Promise<Record<string, DefenceStatus>> {
    const fs = this.filesystemOf(sb);
    if (sb.state !== 'running' && sb.state !== 'paused') {
      const why = `sandbox is ${sb.state}; applied at its next start`;
      return {
        readonly_paths: { enforced: false, detail: `${why} (readonly_paths ${JSON.stringify(fs.readonly_paths)}, writable_paths ${JSON.stringify(fs.writable_paths)})` },
        landlock: { enforced: false, detail: `${why} (landlock ${fs.landlock})` },
      };
    }
    return { ...this.specDefences(sb), readonly_paths: this.readonlyDefence(sb, fs), landlock: await this.landlockDefence(sb, fs) };
  }

  /**
   * The defences read from the spec runc was given (what is in force, not what was asked
   * for): `seccomp` (the profile, the image's and the sandbox's overrides, whether the
   * denials are counted), `user_namespace` (the uid range) and `capabilities` (the set
   * and what it lacks).
   */
  private specDefences(sb: SandboxRecord): Record<string, DefenceStatus> {
    let spec: {
      linux?: { seccomp?: { syscalls?: unknown[]; listenerPath?: string }; uidMappings?: Array<{ hostID: number; size: number }> };
      process?: { capabilities?: { bounding?: string[] } };
    };
    try {
      spec = JSON.parse(readFileSync(path.join(this.dir(sb.id), 'config.json'), 'utf8'));
    } catch (e) {
      const detail = `cannot read the sandbox's spec: ${(e as Error).message}`;
      return { seccomp: { enforced: false, detail }, user_namespace: { enforced: false, detail }, capabilities: { enforced: false, detail } };
    }
    const sc = spec.linux?.seccomp;
    const ov = (o: SeccompOverride | null | undefined) => (o ? [o.allow?.length ? `allow ${o.allow.join(',')}` : '', o.deny?.length ? `deny ${o.deny.join(',')}` : ''].filter(Boolean).join(' ') : '');
    const imageOv = ov(sb.imageConfig.security?.seccomp), sandboxOv = ov(sb.seccomp);
    const prof = profileInfo();
    // runc installs a filter whenever the spec has linux.seccomp, even with no rules; say
    // what the one this sandbox got denies (names counted once across rules, whether a
    // rule is unconditional or conditioned on arguments).
    const rules = (sc?.syscalls ?? []) as Array<{ names: string[]; action: string; args?: unknown[] }>;
    const denying = rules.filter((r) => r.action !== 'SCMP_ACT_ALLOW' && r.action !== 'SCMP_ACT_LOG');
    const names = new Set(denying.flatMap((r) => r.names));
    const always = new Set(denying.filter((r) => !r.args?.length).flatMap((r) => r.names));
    const coreLacking = CORE_DENIALS.filter((n) => !always.has(n));
    const overrides = `${imageOv ? `; image override: ${imageOv}` : ''}${sandboxOv ? `; sandbox override: ${sandboxOv}` : ''}`;
    const seccomp: DefenceStatus = !sc
      ? { enforced: false, detail: 'the spec has no seccomp filter' }
      : names.size === 0
        ? { enforced: false, detail: `a seccomp filter from ${path.basename(prof.file)}${overrides} that denies no syscall (no denying rules)` }
        : {
          enforced: true,
          detail: `${rules.length} rules from ${path.basename(prof.file)}, denying ${names.size} syscalls (${always.size} unconditionally)${overrides}; `
            + (sc.listenerPath ? 'denials answered and counted by the seccomp monitor' : 'denials not counted (the seccomp monitor was not reachable when the sandbox started)')
            + (coreLacking.length ? `; lacks core denials: ${coreLacking.join(', ')}` : ''),
        };
    const m = spec.linux?.uidMappings?.[0];
    const caps = spec.process?.capabilities?.bounding ?? [];
    const lacking = ['CAP_SYS_ADMIN', 'CAP_SYS_PTRACE', 'CAP_NET_ADMIN', 'CAP_NET_RAW', 'CAP_SYS_MODULE', 'CAP_BPF'].filter((c) => !caps.includes(c));
    return {
      seccomp,
      user_namespace: m ? { enforced: true, detail: `uids and gids 0-${m.size - 1} inside are ${m.hostID}-${m.hostID + m.size - 1} on the host` } : { enforced: false, detail: 'no uid mapping in the spec' },
      capabilities: { enforced: true, detail: `${caps.length} capabilities; without ${lacking.join(', ')}${caps.includes('CAP_SYS_ADMIN') ? ' (CAP_SYS_ADMIN is the fncall agent\'s only, dropped from its bounding set at start)' : ''}` },
    };
  }

  private readonlyDefence(sb: SandboxRecord, fs: ResolvedFilesystem): DefenceStatus {
    let spec: { root?: { readonly?: boolean }; mounts?: Array<{ destination: string; type: string; source: string; options?: string[] }> };
    try {
      spec = JSON.parse(readFileSync(path.join(this.dir(sb.id), 'config.json'), 'utf8'));
    } catch (e) {
      return { enforced: false, detail: `cannot read the sandbox's spec: ${(e as Error).message}` };
    }
    if (!spec.root?.readonly) return { enforced: false, detail: 'off for this sandbox (readonly_paths []): the root is read-write' };
    if (sb.backend === 'fncall') return { enforced: true, detail: 'fncall worker: the whole image is read-only; each call writes only its fresh tmpfs /tmp, /dev/shm and scratch paths' };
    const rootfs = path.join(this.dir(sb.id), 'rootfs');
    const binds = (spec.mounts ?? []).filter((m) => m.type === 'bind' && m.source === path.join(rootfs, m.destination));
    const rw = binds.filter((m) => m.options?.includes('rw')).map((m) => m.destination);
    const ro = binds.filter((m) => m.options?.includes('ro')).map((m) => m.destination);
    return {
      enforced: true,
      detail: `root read-only (readonly_paths ${fs.readonly_paths.join(' ')}); read-write: ${rw.join(' ') || 'nothing'}${ro.length ? `; read-only below those: ${ro.join(' ')}` : ''}`,
    };
  }

  private async landlockDefence(sb: SandboxRecord, fs: ResolvedFilesystem): Promise<DefenceStatus> {
    if (!fs.landlock) return { enforced: false, detail: 'off for this sandbox (filesystem.landlock false)' };
    let info;
    try {
      info = (await this.agents.get(sb.id)).info.landlock;
    } catch (e) {
      return { enforced: false, detail: `cannot ask the agent: ${(e as Error).message}` };
    }
    if (!info) return { enforced: false, detail: 'the agent does not report Landlock (an agent older than it)' };
    if (!info.enforced) return { enforced: false, detail: `the agent runs without it: ${info.reason}` };
    return {
      enforced: true,
      detail: info.scope === 'isolated_execs'
        ? `Landlock ABI ${info.abi}, applied by each isolated call: read and execute, every right on its tmpfs mounts`
        : `Landlock ABI ${info.abi} on the agent and every process it starts: read and execute everywhere, every right on ${info.writable} writable path(s), file writes and terminal ioctls only under /dev, /proc and /sys read-only`,
    };
  }

  /**
   * Whether sandboxes get a loaded AppArmor profile, and why (for `dsec host info`):
   * only with an AppArmor kernel and the instance's settings given.
   */
  apparmorStatus(): { enforced: boolean; detail: string } {
    if (!this.apparmorKernel) return { enforced: false, detail: 'kernel has no AppArmor; per-sandbox profiles are generated and compiled (apparmor_parser -Q), not loaded' };
    if (!this.d.apparmor) return { enforced: false, detail: 'kernel has AppArmor, but the container driver was not given the instance settings to generate profiles' };
    return { enforced: true, detail: 'per-sandbox profile dsec-<instance>-<id> loaded (apparmor_parser -r) and set as process.apparmorProfile: denies /proc/sys and /sys writes, kcore/sysrq, raw and packet sockets, mount/umount/pivot_root, ptrace and signals outside the profile' };
  }

  /** `<root>/sandboxes`. */
  get sandboxesDir(): string {
    return path.join(this.d.root, 'sandboxes');
  }

  /** `<root>/sandboxes/<id>`. */
  dir(id: string): string {
    return path.join(this.sandboxesDir, id);
  }

  /**
   * `container`: user sandboxes, with filesystem snapshots, I/O settings, writable layers
   * in the store and warm pools. `fncall`: the pool's workers, which have none of those.
   */
  capabilities(backend: Backend): BackendCapabilities {
    const user = backend === 'container';
    return {
      id: `dsec.driver.${user ? 'container' : 'fncall'}.v1`, backend, available: true, reason: null, isolation: 'container', pause: true,
      snapshot: user ? 'filesystem' : null, networkModes: ['none', 'allow', 'open'], io: user, storeDisk: user, pool: user, console: false,
    };
  }

  async prepare(sb: SandboxRecord, steps: StepObserver): Promise<void> {
    // Owned by the sandbox's base uid, mode 0700: its init (that uid, in its user
    // namespace) can reach rootfs/, no other local user can enter.
    await mkdir(this.dir(sb.id), { recursive: true, mode: 0o700 });
    await chown(this.dir(sb.id), sb.uidBase!, sb.uidBase!);
    await chmod(this.dir(sb.id), 0o700);
    await this.mountRootfs(sb, steps, 'create');
  }

  async start(sb: SandboxRecord, steps: StepObserver): Promise<InitInfo> {
    // A new sandbox's rootfs was mounted by prepare; a stopped one's is mounted again.
    if (sb.state === 'creating') return this.launch(sb, steps, 'create');
    await this.mountRootfs(sb, steps, 'start');
    return this.launch(sb, steps, 'start');
  }

  private async mountRootfs(sb: SandboxRecord, steps: StepObserver, op: 'create' | 'start'): Promise<string> {
    if (sb.uidBase === null || sb.uidCount === null) throw internal(`sandbox ${sb.id} has no uid range`);
    await this.acquireLayers(sb);
    if (op === 'create') steps.hit('create.after-layers');
    const lowers = effectiveLayers(sb.imageLayers).map((dg) => this.d.layers.dirFor(dg));
    // A new sandbox's layer goes where the store puts new layers (with its quota); a
    // start finds the layer wherever it was made, and never makes an empty one in its place.
    const layer = op === 'create'
      ? await this.d.storage.create(sb.id, { diskBytes: sb.diskBytes })
      : this.d.storage.locate(sb.id);
    if (!layer) throw failedPrecondition(`sandbox ${sb.id} has no writable layer on this host (its store entry is gone); destroy it`);
    const prepare = () => prepareRootfs({
      dir: this.dir(sb.id), lowers, uidBase: sb.uidBase!, gidBase: sb.uidBase!, count: sb.uidCount!, upper: layer.upper, work: layer.work,
    });
    if (op === 'create') {
      // A new layer is empty, so overlayfs has room for its work dir.
      const { rootfs } = await prepare();
      steps.hit('create.after-rootfs');
      return rootfs;
    }
    // A layer at its quota leaves overlayfs no room for its work dir (it would mount
    // read-only, which prepareRootfs refuses), so the quota is lifted for the mount only.
    const { rootfs } = await this.d.storage.withRoomToMount(sb.id, async () => {
      const r = await prepare();
      steps.hit('start.after-rootfs');
      return r;
    });
    return rootfs;
  }

  private async acquireLayers(sb: SandboxRecord): Promise<void> {
    if (this.held.has(sb.id)) return;
    const got: string[] = [];
    try {
      for (const dg of sb.imageLayers) {
        await this.d.layers.acquire(dg);
        got.push(dg);
      }
    } catch (e) {
      for (const dg of got) await this.d.layers.release(dg).catch(() => {});
      throw e;
    }
    this.held.set(sb.id, got);
  }

  private async releaseLayers(id: string): Promise<void> {
    const got = this.held.get(id);
    if (!got) return;
    this.held.delete(id);
    for (const dg of got) await this.d.layers.release(dg).catch((e) => this.d.log.warn({ err: e, digest: dg }, 'layer release failed'));
  }

  /**
   * Writes the bundle, binds the agent socket, runs the container and waits for the
   * agent's HELLO. The socket is bound under a temporary name and renamed into place:
   * Node's listener unlinks its path when closed, and dsecd closes its copy of the
   * listening fd as soon as the runtime has passed it into the container.
   */
  private async launch(sb: SandboxRecord, steps: StepObserver, op: 'create' | 'start'): Promise<InitInfo> {
    const dir = this.dir(sb.id);
    // AppArmor: only where the kernel has it (never here): render, compile, load, attach.
    let apparmorProfile: string | undefined;
    if (this.apparmorKernel && this.d.apparmor) {
      const p = await prepareSandboxProfile({
        root: this.d.root, instance: this.d.apparmor.instance, socketDir: this.d.apparmor.socketDir,
        sandboxId: sb.id, worker: sb.backend === 'fncall',
      });
      apparmorProfile = p.name;
    }
    const network = (await this.d.network?.prepareSpec(sb)) ?? null;
    const seccompNotify = await this.d.seccompMonitor?.listenerFor(sb.id);
    const rootfs = path.join(dir, 'rootfs');
    const filesystem = await this.planFilesystem(sb, rootfs);
    // Mount points the runtime will create in the writable layer: commit strips them.
    if (network && !(await lstat(path.join(rootfs, 'etc', 'resolv.conf')).catch(() => undefined))) await this.recordUpperCreated(sb.id, ['etc/resolv.conf']);
    const imageSeccomp = sb.imageConfig.security?.seccomp;
    const spec = buildSpec({
      id: sb.id,
      rootfs,
      agentBinary: this.d.agentBinary,
      // Checked at each start: a bind needs its mount point (sysfs is read-only), and a
      // directory such as powercap goes away with its module.
      ...(this.d.masks ? { sysMasks: { dir: this.d.masks.maskDir(sb.id), paths: SYSFS_MASKED_DIRS.filter((p) => existsSync(p)) } } : {}),
      uidBase: sb.uidBase!,
      uidCount: sb.uidCount!,
      cgroupsPath: this.d.cgroups.runtimePath(sb.id),
      cpus: sb.cpus,
      memoryBytes: sb.memoryBytes,
      pids: sb.pids,
      priority: sb.priority,
      cgroupVersion: this.d.cgroups.version,
      coreScheduling: this.d.coreScheduling,
      // fncall workers: read-only image, an agent that serves isolated execs.
      worker: sb.backend === 'fncall',
      ...(sb.seccomp || imageSeccomp ? { seccomp: { image: imageSeccomp, sandbox: sb.seccomp ?? undefined } } : {}),
      seccompNotify,
      apparmorProfile,
      ...(network ? { network } : {}),
      filesystem,
    });
    await writeFile(path.join(dir, 'config.json'), JSON.stringify(spec, null, 1));
    const sock = path.join(dir, 'agent.sock');
    const tmpSock = path.join(dir, 'agent.sock.tmp');
    await rm(sock, { force: true });
    await rm(tmpSock, { force: true });
    const server = net.createServer();
    // Connections are accepted by the agent, never here: the server is closed before dsecd connects.
    server.on('connection', (c) => c.destroy());
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen({ path: tmpSock, backlog: 128 }, () => resolve());
    });
    let pid: number;
    const logFd = openSync(path.join(dir, 'agent.log'), 'a', 0o600);
    try {
      await rename(tmpSock, sock);
      if (op === 'create') steps.hit('create.after-bundle');
      const fd = (server as unknown as { _handle: { fd: number } })._handle.fd;
      pid = await this.d.runtime.run(sb.id, dir, {
        pidFile: path.join(dir, 'init.pid'), logFile: path.join(dir, 'runtime.log'), stdioFd: logFd, extraFd: fd,
        cgroup: { manager: this.d.cgroups, limits: containerCgroupLimits(sb) },
      });
    } finally {
      closeSync(logFd);
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
    steps.hit(op === 'create' ? 'create.after-runtime' : 'start.after-runtime');
    // I/O settings go on the cgroup runc made, before the agent answers: no command of the
    // sandbox runs before create or start returns.
    await this.applyIo(sb, sb.io);
    const start = procStartTime(pid);
    if (start === null) throw internal(`sandbox ${sb.id}: init ${pid} exited right after start; see ${dir}/agent.log`);
    // The veth and egress programs go in while the agent says hello: both before create returns.
    await Promise.all([this.agents.get(sb.id, AGENT_CONNECT_TIMEOUT_MS), this.d.network?.attach(sb, pid)]);
    if (op === 'create') steps.hit('create.after-agent');
    return { pid, start };
  }

  async stop(sb: SandboxRecord, steps: StepObserver, opts: { graceMs?: number } = {}): Promise<void> {
    // A frozen task cannot act on a signal: thaw a paused sandbox before ending it.
    if (sb.state === 'paused') await this.d.cgroups.thaw(sb.id).catch(() => {});
    if (opts.graceMs && opts.graceMs > 0 && sb.initPid && sb.state === 'running') await this.terminate(sb, opts.graceMs);
    await this.agents.drop(sb.id);
    await this.d.runtime.deleteForce(sb.id);
    steps.hit('stop.after-kill');
    await this.d.network?.detach(sb);
    await this.d.cgroups.killAll(sb.id).catch(() => {});
    await this.d.cgroups.remove(sb.id);
    await teardownRootfs(this.dir(sb.id));
    await this.releaseLayers(sb.id);
  }

  /**
   * Sends SIGTERM to every process of the sandbox except its init (the agent) and waits
   * up to `graceMs` for them to exit, polling the cgroup every 50 ms.
   */
  private async terminate(sb: SandboxRecord, graceMs: number): Promise<void> {
    const others = async () => (await this.d.cgroups.pids(sb.id).catch(() => [] as number[])).filter((p) => p !== sb.initPid);
    for (const pid of await others()) {
      try {
        process.kill(pid, 'SIGTERM');
      } catch { /* already gone */ }
    }
    const deadline = Date.now() + graceMs;
    while (Date.now() < deadline && (await others()).length > 0) await new Promise((r) => setTimeout(r, 50));
  }

  async destroy(sb: SandboxRecord, steps: StepObserver): Promise<void> {
    this.oomSeen.delete(sb.id);
    if (sb.state === 'paused') await this.d.cgroups.thaw(sb.id).catch(() => {});
    await this.agents.drop(sb.id);
    // SIGKILL to the init, when it is still the process the row recorded (pid and start
    // time), ends the sandbox's pid namespace without a runtime binary spawn (a third of
    // destroy's CPU in a burst profile: spawning forks dsecd). `delete --force` below kills
    // whatever this did not reach (no recorded init, or an init that changed).
    if (sb.initPid && sb.initStart !== null && procStartTime(sb.initPid) === sb.initStart) {
      try {
        process.kill(sb.initPid, 'SIGKILL');
      } catch { /* exited meanwhile */ }
    }
    steps.hit('destroy.after-kill');
    await this.d.runtime.deleteForce(sb.id);
    steps.hit('destroy.after-runtime');
    await this.d.network?.detach(sb, { forget: true });
    await teardownRootfs(this.dir(sb.id));
    await this.releaseLayers(sb.id);
    steps.hit('destroy.after-rootfs');
    await this.d.cgroups.killAll(sb.id).catch(() => {});
    await this.d.cgroups.remove(sb.id);
    steps.hit('destroy.after-cgroup');
    if (this.apparmorKernel && this.d.apparmor)
      await unloadProfile(profilePath(this.d.root, sb.id)).catch((e) => this.d.log.warn({ err: e, id: sb.id }, 'apparmor profile unload failed'));
    await this.d.storage.remove(sb.id);
    await removeSandboxDir(this.dir(sb.id));
    this.d.masks?.removeMaskDir(sb.id);
    this.d.seccompMonitor?.forget(sb.id);
    steps.hit('destroy.after-dir');
  }

  async exec(sb: SandboxRecord, req: DriverExecRequest): Promise<DriverExecResult> {
    // An fncall worker runs one call at a time, so the count read after its previous call
    // is exact and saves a cgroup read per call; other sandboxes read it afresh.
    const cached = req.isolate ? this.oomSeen.get(sb.id) : undefined;
    const oomBefore = cached ?? await this.oomKillCount(sb);
    const res = await this.agents.exec(sb.id, req);
    const oomAfter = await this.oomKillCount(sb);
    if (req.isolate) {
      if (oomAfter === null) this.oomSeen.delete(sb.id);
      else this.oomSeen.set(sb.id, oomAfter);
    }
    refuseBadCwdOrUser(sb.id, res);
    // The counter is per sandbox: every kill while the command ran is reported
    // (oomKills: a process of a pipeline, or of another command running at the same
    // time), and `oom` says the command itself died of SIGKILL while it rose.
    const oomKills = oomBefore === null || oomAfter === null ? null : Math.max(0, oomAfter - oomBefore);
    const oom = (oomKills ?? 0) > 0 && res.kind === 'exit' && res.signal === 9;
    return { ...res, oom, oomKills };
  }

  async oomKillCount(sb: Pick<SandboxRecord, 'id'>): Promise<number | null> {
    return this.d.cgroups.oomKills(sb.id).catch(() => null);
  }

  async files(sb: SandboxRecord): Promise<AgentFiles> {
    return this.agents.client(sb.id);
  }

  async startExec(sb: SandboxRecord, req: DriverStartExecRequest, handlers: DriverExecHandlers): Promise<AgentExecHandle> {
    return this.agents.startExec(sb.id, req, handlers);
  }

  async stats(sb: SandboxRecord): Promise<SandboxStats | null> {
    if (sb.state !== 'running' && sb.state !== 'paused') return null;
    const st = await this.d.cgroups.stats(sb.id).catch((e: unknown) => {
      this.d.log.warn({ err: e, id: sb.id }, 'cgroup stats read failed');
      return null;
    });
    if (!st) return null;
    return { cpuUsageNs: st.cpuUsageNs, memoryBytes: st.memoryBytes, memoryLimitBytes: st.memoryLimitBytes, pids: st.pidsCurrent, oomKills: st.oomKills,
      pidsLimitHits: st.pidsLimitHits, seccompDenials: this.d.seccompMonitor?.countsFor(sb.id) ?? null };
  }

  async limitCounters(sb: Pick<SandboxRecord, 'id' | 'state'>): Promise<{ oomKills: number; pidsLimitHits: number } | null> {
    if (sb.state !== 'running' && sb.state !== 'paused') return null;
    return this.d.cgroups.limitCounters(sb.id).catch(() => null);
  }

  async update(sb: SandboxRecord, u: LiveUpdate): Promise<void> {
    const l = u.limits;
    // The values buildSpec gives the runtime for a latency sandbox (no shares: the kernel default).
    if (l) {
      await this.d.cgroups.create(sb.id, {
        cpuQuotaUs: cpuQuotaUs(l.cpus), cpuPeriodUs: CPU_PERIOD_US, cpuShares: null, memoryBytes: l.memoryBytes, pids: l.pids,
      });
    }
    if (u.io !== undefined) await this.applyIo(sb, u.io);
  }

  /**
   * Writes `io` (null: the kernel's defaults) to the sandbox's cgroup for the block
   * device of the writable-layer store (daemon/host/cgroups/io.ts). Nothing to do where
   * the store has no device (layers on the host filesystem) or for an fncall worker.
   * @throws DsecError as CgroupManager.setIo.
   */
  private async applyIo(sb: SandboxRecord, io: IoLimits | null): Promise<void> {
    if (sb.backend !== 'container') return;
    const dev = this.d.storage.blockDevice();
    if (!dev) return;
    await this.d.cgroups.setIo(sb.id, io ?? NO_IO_LIMITS, dev);
  }

  logPath(sb: SandboxRecord): string {
    return path.join(this.dir(sb.id), 'agent.log');
  }

  async isAlive(sb: SandboxRecord): Promise<boolean> {
    if (!sb.initPid || sb.initStart === null) return false;
    if (procStartTime(sb.initPid) !== sb.initStart) return false;
    const st = await this.d.runtime.state(sb.id);
    return !!st && (st.status === 'running' || st.status === 'paused') && st.pid === sb.initPid;
  }

  async adopt(sb: SandboxRecord): Promise<void> {
    await this.acquireLayers(sb);
    await this.d.network?.adopt(sb);
    // A running sandbox is never left frozen: dsecd may have died in the middle of a
    // commit or snapshot, which freeze the sandbox while they copy its layer.
    if (sb.state === 'running') await this.d.cgroups.thaw(sb.id).catch((e) => this.d.log.warn({ err: e, id: sb.id }, 'thaw at adopt failed'));
  }

  async cleanOrphans(known: Set<string>): Promise<OrphanReport> {
    const removed: string[] = [];
    for (const c of await this.d.runtime.list()) {
      if (!known.has(c.id)) {
        await this.d.runtime.deleteForce(c.id);
        removed.push(`runtime container ${c.id}`);
      }
    }
    for (const id of await this.d.cgroups.list()) {
      if (!known.has(id)) {
        await this.d.cgroups.killAll(id).catch(() => {});
        await this.d.cgroups.remove(id);
        removed.push(`cgroup ${id}`);
      }
    }
    let dirs: string[] = [];
    try {
      dirs = await readdir(this.sandboxesDir);
    } catch { /* none yet */ }
    for (const id of dirs) {
      if (!known.has(id)) {
        await teardownRootfs(this.dir(id));
        await removeSandboxDir(this.dir(id));
        removed.push(`sandbox dir ${id}`);
      }
    }
    // Store entries (subvolumes, XFS project dirs) of sandboxes without a row.
    removed.push(...await this.d.storage.cleanOrphans(known));
    // Mounts whose dir vanished (e.g. removed by hand) but are still in the mount table.
    for (const m of await listMountsUnder(this.sandboxesDir + '/')) {
      const id = path.relative(this.sandboxesDir, m).split(path.sep)[0];
      if (!known.has(id)) {
        await teardownRootfs(this.dir(id));
        removed.push(`mount ${m}`);
      }
    }
    if (this.d.network) removed.push(...await this.d.network.cleanOrphans(known));
    for (const id of this.d.masks?.maskDirIds() ?? []) {
      if (!known.has(id)) {
        this.d.masks!.removeMaskDir(id);
        removed.push(`mask dir ${id}`);
      }
    }
    return { removed };
  }

  async pause(sb: SandboxRecord): Promise<ReclaimReport> {
    await this.d.cgroups.freeze(sb.id);
    const before = await this.d.cgroups.stats(sb.id);
    // v2: memory.reclaim; v1: memory.force_empty. Without swap only page cache can go.
    await this.d.cgroups.reclaim(sb.id).catch((e) => this.d.log.warn({ err: e, id: sb.id }, 'reclaim at pause failed'));
    const after = await this.d.cgroups.stats(sb.id);
    const swap = hostHasSwap();
    return {
      memory_before_bytes: before.memoryBytes,
      memory_after_bytes: after.memoryBytes,
      file_before_bytes: before.memoryCacheBytes,
      file_after_bytes: after.memoryCacheBytes,
      anon_bytes: after.memoryAnonBytes,
      reclaimed_bytes: Math.max(0, before.memoryBytes - after.memoryBytes),
      swap,
      note: swap
        ? 'page cache reclaimed; anonymous memory can be swapped out under pressure'
        : 'page cache reclaimed; this host has no swap, so anonymous memory stays resident',
    };
  }

  async resume(sb: SandboxRecord): Promise<void> {
    await this.d.cgroups.thaw(sb.id);
  }

  async withWritableLayer<T>(sb: SandboxRecord, fn: (upperDir: string, dsecCreated: readonly string[]) => Promise<T>): Promise<T> {
    const upper = this.d.storage.locate(sb.id)?.upper;
    if (!upper) throw failedPrecondition(`sandbox ${sb.id} has no writable layer on this host`);
    const created = this.upperCreated(sb.id);
    const frozen = sb.state === 'running';
    if (frozen) await this.d.cgroups.freeze(sb.id);
    try {
      return await fn(upper, created);
    } finally {
      if (frozen) await this.d.cgroups.thaw(sb.id);
    }
  }

  /**
   * Records that dsec itself created `relPaths` (relative to the sandbox root, a leading
   * `/` is dropped; e.g. `etc/resolv.conf` as the runtime's bind-mount point, a
   * `writable_paths` directory) in the sandbox's upper dir, so that commit strips them
   * while they are still what dsec made (withWritableLayer passes the list; see
   * daemon/image/commit.ts). Call it when creating such a path, before the sandbox can
   * see it. Idempotent; stored in `<sandbox dir>/upper-created.json` (mode 0600, root's),
   * written atomically.
   */
  async recordUpperCreated(id: string, relPaths: readonly string[]): Promise<void> {
    const all = new Set([...this.upperCreated(id), ...relPaths.map((p) => p.replace(/^\/+/, '').replace(/\/+$/, '')).filter(Boolean)]);
    const file = path.join(this.dir(id), 'upper-created.json');
    await writeFile(`${file}.tmp`, `${JSON.stringify([...all].sort())}\n`, { mode: 0o600 });
    await rename(`${file}.tmp`, file);
  }

  /** The paths {@link recordUpperCreated} recorded for sandbox `id` (none when the file is missing or unreadable). */
  private upperCreated(id: string): string[] {
    try {
      const v = JSON.parse(readFileSync(path.join(this.dir(id), 'upper-created.json'), 'utf8')) as unknown;
      return Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string') : [];
    } catch {
      return [];
    }
  }

  /**
   * Closes every agent connection; from here on no new one is made (a create or exec
   * still in flight when dsecd shuts down fails Unavailable instead of keeping the
   * process alive). Safe to call twice.
   */
  async close(): Promise<void> {
    await this.agents.close();
  }
}
