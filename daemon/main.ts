/**
 * dsecd: the per-host sandbox daemon, in the foreground.
 *
 *   dsecd [--root DIR] [--socket PATH] [--config FILE] [--listen ADDR:PORT [--tls-cert FILE --tls-key FILE] [--tls-ca FILE]]
 *
 * Start-up order: config -> state dirs -> instance registration -> cgroups -> runtime ->
 * store -> images -> writable-layer store (mounted before any sandbox is touched) ->
 * drivers -> reconcile (adopt live sandboxes, undo half-done work,
 * remove orphans) -> API socket -> TCP door (`--listen`). SIGTERM/SIGINT close the API and exit; sandboxes keep
 * running (systemd's KillMode=process) and are adopted by the next start.
 */
import { procStartTime } from './host/proc.js';
import { FNCALL_WORKER_LABEL, FncallPools } from './fncall/pool.js';
import { Command } from 'commander';
import { chmodSync, chownSync, existsSync, mkdirSync, readFileSync, statSync, unlinkSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pino, { type Logger } from 'pino';
import { loadConfig, type DaemonConfig } from './config.js';
import { DsecError, failedPrecondition, invalidArgument, isDsecError, unavailable } from './errors.js';
import { openDb } from './store/db.js';
import { SandboxRepo } from './sandbox/repo.js';
import { SnapshotRepo } from './sandbox/snapshots.js';
import { TrajectoryLog } from './sandbox/trajectory.js';
import { probeCriu } from './host/criu.js';
import { isPoolShell, SandboxManager } from './sandbox/manager.js';
import { WarmPools } from './sandbox/warm-pool.js';
import { Failpoints } from './sandbox/failpoints.js';
import { Reaper } from './sandbox/reaper.js';
import { Metrics } from './metrics.js';
import { detectCoreScheduling, detectSchedIdle } from './host/sched.js';
import { detectCgroups, type CgroupManager } from './host/cgroups/index.js';
import { detectRuntime, OciRuntime } from './drivers/container/runtime.js';
import { ContainerDriver } from './drivers/container/driver.js';
import { MicrovmDriver } from './drivers/microvm/driver.js';
import { VmDriver } from './drivers/vm/driver.js';
import type { SandboxDriver } from './drivers/types.js';
import { ImageStore } from './image/store.js';
import { LayerMounts } from './image/mounts.js';
import { BlobCache } from './image/cache.js';
import { buildApi, buildRunCodeApi, type ApiDeps } from './api/server.js';
import { registerInstance, type InstanceRegistration } from './host/instances.js';
import { BUILDER_SLOT_IDS, Builder } from './host/builder.js';
import { AGENT_PROTOCOL_VERSION, DSEC_VERSION } from './version.js';
import type { Backend, SeccompProfileInfo } from './api/schema.js';
import { SandboxNetworking, builtinDeny } from './net/network.js';
import { parseSubnet } from './net/addr.js';
import { PolicySet, shippedPolicyDir } from './security/egress-policy.js';
import { BPF_BUILD_RELATIVE } from './host/bpf.js';
import { SandboxFiles } from './host/sandbox-files.js';
import { overlayLayerNaming } from './image/rootfs.js';
import { execa } from 'execa';
import { DenialEvents, SeccompMonitor, monitorPid } from './security/seccomp-monitor.js';
import { CORE_DENIALS, profileInfo, reloadProfile as reloadSeccompFile } from './security/seccomp.js';
import { UpperStore } from './storage/store.js';
import { AuditLog } from './remote/audit.js';
import { unixDoor } from './remote/door.js';
import { startRemoteDoor, type RemoteDoor } from './remote/listen.js';
import { SqliteTokenStore, TokenService } from './remote/tokens.js';
import { E2bFront } from './api/e2b/front.js';
import { localHost } from './api/e2b/host.js';
import { EnvdTokens } from './api/e2b/tokens.js';
import { TemplateStore } from './api/e2b/templates.js';
import { ensureE2bBaseImage } from './image/e2b-base.js';

/** On SIGTERM, requests in flight get this long (30 s) to finish before connections are cut; systemd's stop timeout is 90 s. */
const SHUTDOWN_DRAIN_MS = 30_000;

/** Longest Unix socket path the kernel accepts (sun_path is 108 bytes with the NUL). */
const MAX_SOCKET_PATH = 107;

/** Repository root (dir with package.json), found from this file in dist/ or in the source tree. */
export function repoRoot(): string {
  let d = path.dirname(fileURLToPath(import.meta.url));
  while (d !== '/' && !existsSync(path.join(d, 'package.json'))) d = path.dirname(d);
  return d;
}

/** The static agent binary built by the install step (`make -C native`). */
export function agentBinaryPath(): string {
  return process.env.DSEC_AGENT_BINARY ?? path.join(repoRoot(), 'native', 'agent', 'dsec-agent');
}

/** The VMM launcher of the microvm tier (`make -C native`): joins the sandbox's cgroup, execs QEMU. */
export function vmmLauncherPath(): string {
  return process.env.DSEC_VMM_LAUNCHER ?? path.join(repoRoot(), 'native', 'vmm', 'dsec-vmm-launch');
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

/** A started daemon, as tests and the entry point hold it. */
export interface Daemon {
  config: DaemonConfig;
  log: Logger;
  close(): Promise<void>;
  /** Reloads the network policy files (SIGHUP); logs and keeps the previous set on a malformed file. */
  reloadNetworkPolicies?(): Promise<void>;
  /** Reloads the seccomp profile file (SIGHUP); logs and keeps the profile in force on a malformed file. */
  reloadSeccompProfile?(): void;
  /** Reopens the audit log file (SIGHUP, after logrotate moved it). */
  reopenAudit?(): void;
  /** The TCP door when `--listen` is set: its address and the CA file clients trust. */
  remote?: { address: { host: string; port: number }; caFile: string | null };
}

/** Destroys sandboxes `ids` (force), 8 at a time; failures are logged, never thrown. */
async function destroyShells(manager: SandboxManager, ids: string[], reason: string, log: Logger): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(8, ids.length) }, async () => {
    while (next < ids.length) {
      const id = ids[next++];
      await manager.destroy(id, true, reason).catch((e) => log.error({ err: e, id }, 'destroying a warm-pool shell failed'));
    }
  }));
}

/**
 * The runtime sets up a sandbox's rootfs from inside its user namespace, as the
 * sandbox's (unprivileged) host uid, so every directory above a sandbox's rootfs must
 * be searchable by others (mode o+x).
 * @throws DsecError FailedPrecondition naming the first directory that is not.
 */
function assertTraversable(dir: string): void {
  for (let d = path.resolve(dir); ; d = path.dirname(d)) {
    const st = statSync(d);
    if ((st.mode & 0o001) === 0) {
      throw failedPrecondition(`${d} (mode ${(st.mode & 0o777).toString(8)}) is not searchable by other users; sandboxes under ${dir} could not reach their rootfs. chmod o+x ${d} or choose another --root`);
    }
    if (d === '/') return;
  }
}

/**
 * Sandboxes of an instance live in cgroups below the cgroup dsecd ran in when it
 * created them (runc resolves the relative cgroupsPath against its own cgroup). If
 * dsecd is later started from a different cgroup (another login session rather than
 * its systemd service), it would not find them. The parents are recorded in
 * `<root>/cgroup-parents.json`; a start from elsewhere is refused while sandboxes exist.
 * @throws DsecError FailedPrecondition naming the hierarchy whose parent moved.
 */
function checkCgroupParents(root: string, parents: Record<string, string>): void {
  const file = path.join(root, 'cgroup-parents.json');
  const dbFile = path.join(root, 'dsec.db');
  let recorded: Record<string, string> | null = null;
  try {
    recorded = JSON.parse(readFileSync(file, 'utf8'));
  } catch { /* first start */ }
  if (recorded) {
    const moved = Object.keys(parents).filter((k) => recorded![k] !== undefined && recorded![k] !== parents[k]);
    if (moved.length && existsSync(dbFile)) {
      const db = openDb(dbFile);
      const n = (db.prepare('SELECT COUNT(*) n FROM sandboxes').get() as { n: number }).n;
      db.close();
      if (n > 0) {
        const k = moved[0];
        throw failedPrecondition(`dsecd was started from another cgroup: its ${k} parent would be ${parents[k]}, but this instance's ${n} sandbox(es) live under ${recorded[k]}. Start dsecd the way it was started before (e.g. systemctl start dsecd), or destroy the sandboxes first`);
      }
    }
  }
  writeFileSync(file, JSON.stringify(parents, null, 1));
}

/** Listens on the Unix socket, refusing when another live daemon answers there. */
async function claimSocket(socket: string): Promise<void> {
  mkdirSync(path.dirname(socket), { recursive: true, mode: 0o755 });
  if (!existsSync(socket)) return;
  const alive = await new Promise<boolean>((resolve) => {
    const c = net.connect(socket);
    c.once('connect', () => { c.destroy(); resolve(true); });
    c.once('error', () => resolve(false));
  });
  if (alive) throw failedPrecondition(`another dsecd is serving ${socket}; stop it or pass --socket`);
  unlinkSync(socket);
}

/** Gives the socket mode 0660 and group `dsec` when that group exists. */
function secureSocket(socket: string, log: Logger): void {
  chmodSync(socket, 0o660);
  try {
    const line = readFileSync('/etc/group', 'utf8').split('\n').find((l) => l.startsWith('dsec:'));
    if (line) chownSync(socket, 0, Number(line.split(':')[2]));
  } catch (e) {
    log.warn({ err: e }, 'could not set socket group');
  }
}

/**
 * Starts a daemon with the given config. Resolves once the API is listening.
 * With `purge`, it instead destroys every sandbox of the instance, unmounts its layers and
 * its writable-layer store (whose loop device detaches and whose image is deleted),
 * removes its cgroup parents and resolves without serving (`dsecd --purge`).
 * @throws DsecError when the host lacks what dsecd needs (runtime, agent binary, cgroups).
 */
export async function startDaemon(config: DaemonConfig, log: Logger, opts: { purge?: boolean } = {}): Promise<Daemon> {
  const fp = new Failpoints(process.env.DSEC_FAILPOINT);
  if (path.join(config.root, 'sandboxes', 'x'.repeat(16), 'agent.sock.tmp').length > MAX_SOCKET_PATH) {
    throw failedPrecondition(`root ${config.root} is too long: agent socket paths under it would exceed ${MAX_SOCKET_PATH} bytes`);
  }
  // The seccomp profile is a data file: refuse to start on a malformed one (there is no
  // previous profile to keep yet); later reloads keep the one in force instead.
  const loadSeccomp = (): SeccompProfileInfo => {
    try {
      reloadSeccompFile(config.security.seccompProfile);
    } catch (e) {
      throw invalidArgument((e as Error).message);
    }
    const info = profileInfo();
    for (const w of info.warnings) log.warn({ file: info.file, missing_core: info.missing_core }, w);
    return info;
  };
  loadSeccomp();
  const agentSource = agentBinaryPath();
  if (!existsSync(agentSource)) throw unavailable(`agent binary ${agentSource} is missing; run the install step (make -C native)`);
  // Modes: a sandbox's init (an unprivileged host uid) must traverse the root and
  // sandboxes/ to reach its rootfs (0711, not listable); everything else is root-only:
  // the store holds sandbox env (secrets), blob mounts expose image files.
  for (const [d, mode] of [['', 0o711], ['sandboxes', 0o711], ['images', 0o700], ['layers', 0o700], ['runtime', 0o700]] as const) {
    mkdirSync(path.join(config.root, d), { recursive: true, mode });
    chmodSync(path.join(config.root, d), mode);
  }
  // SQLite creates the -wal and -shm files with the database file's mode.
  const dbFile = path.join(config.root, 'dsec.db');
  if (!existsSync(dbFile)) writeFileSync(dbFile, '', { mode: 0o600 });
  chmodSync(dbFile, 0o600);
  for (const f of [`${dbFile}-wal`, `${dbFile}-shm`]) if (existsSync(f)) chmodSync(f, 0o600);
  assertTraversable(config.root);

  const reg: InstanceRegistration = registerInstance(config);
  let cgroups: CgroupManager | undefined;
  try {
    // The agent (and networked sandboxes' resolv.conf) are bound into sandboxes from a
    // tmpfs of the instance's own, so their mount entries name no host path.
    const sandboxFiles = SandboxFiles.open(config.root);
    const agentBinary = sandboxFiles.installAgent(agentSource);
    // Refuse a busy socket before creating anything on the host.
    if (!opts.purge) await claimSocket(config.socket);
    cgroups = await detectCgroups({ instance: config.instance });
    checkCgroupParents(config.root, cgroups.parents);
    await cgroups.init();
    const runtimeInfo = await detectRuntime(config.runtime, cgroups.version);
    const runtime = new OciRuntime(runtimeInfo, path.join(config.root, 'runtime', runtimeInfo.name));
    const db = openDb(path.join(config.root, 'dsec.db'));
    const repo = new SandboxRepo(db, config.uidPool);
    // Untrusted trees (imported tars, writable layers) are extracted, copied and packed as
    // the builder identity, never as root (daemon/host/builder.ts); refuse to start rather
    // than fall back to root silently.
    const builder = config.builder.enabled ? new Builder({ range: config.builder, workDir: path.join(config.root, 'builder') }) : undefined;
    await builder?.init();
    await builder?.probe();
    const images = new ImageStore({
      root: config.images.store,
      localDir: path.join(config.root, 'images-local'),
      owner: { host: os.hostname(), instance: config.instance },
      pruneGraceMs: config.images.pruneGraceMs,
      builder,
      mkfsPath: config.images.mkfsPath,
    });
    await images.init();
    await images.ensureBuiltinImages();
    // Writable layers: mounted (or created on first start) before reconcile touches a sandbox.
    const storage = await UpperStore.open({ root: config.root, config: config.storage, log: log.child({ component: 'storage' }) });
    const storeCap = storage.capacityBytes();
    if (storage.enforcesQuota && storeCap !== null && config.defaults.diskBytes > storeCap) {
      log.warn({ diskBytes: config.defaults.diskBytes, capacityBytes: storeCap }, '[defaults] disk_bytes is more than the writable-layer store holds: sandboxes created without disk_bytes get the whole store as their quota');
    }
    let layers: LayerMounts;
    let microvm: MicrovmDriver;
    const cache = config.images.cacheDir
      ? new BlobCache({ dir: config.images.cacheDir, maxBytes: config.images.cacheBytes, source: (dg) => images.blobPath(dg),
        pinned: () => new Set([...layers.mounted(), ...microvm.pinnedLayers()]) })
      : null;
    layers = new LayerMounts({
      mountDir: path.join(config.root, 'layers'),
      blobPath: (dg) => images.blobPath(dg),
      // Verify before the first mount on this host; with a cache, mount the verified local copy.
      prepare: (dg) => (cache ? cache.ensure(dg) : images.prepareForMount(dg)),
    });
    const coreSched = detectCoreScheduling();
    const schedIdle = detectSchedIdle();
    // Sandbox networking: instance netns, egress programs, resolver (daemon/net/network.ts).
    // Warnings name allow rules that the built-in denials make unreachable (a bad subnet is refused below, by SandboxNetworking).
    const alwaysDenied = () => {
      try {
        return builtinDeny(parseSubnet(config.network.subnet), config.network.hostLoopback);
      } catch {
        return [];
      }
    };
    const policies = new PolicySet([shippedPolicyDir(), config.network.policyDir], alwaysDenied);
    for (const p of policies.loadInitial()) log.error({ file: p.file }, `network policy skipped: ${p.message}`);
    for (const sh of policies.report().shadowed) log.warn(sh, `network policy ${sh.name}: ${sh.file} shadows the shipped ${sh.shadows}`);
    for (const w of policies.report().warnings) log.warn({ policy: w.policy, file: w.file }, `network policy ${w.policy}: ${w.message}`);
    const cg2 = cgroups.parents.unified;
    const network = new SandboxNetworking({
      config: config.network, root: config.root, instance: config.instance, uidPool: config.uidPool, policies, sandboxFiles,
      cgroup2Dir: (id) => path.join(cg2 ?? '/nonexistent-cgroup2', id), bpfBuildDir: path.join(repoRoot(), BPF_BUILD_RELATIVE),
      event: (id, type, message) => { repo.event(type, id === null ? null : repo.find(id) ?? null, message); },
      log: log.child({ component: 'network' }),
    });
    await network.init({ eager: repo.all().some((s) => SandboxNetworking.hasNetwork(s)) });
    // seccomp denials are answered (EPERM) and counted by the instance's monitor process;
    // events are coalesced per sandbox (at most one per DENIAL_EVENT_MS).
    const denialEvents = new DenialEvents((id, msg) => {
      const sb = repo.find(id);
      if (sb) repo.event('seccomp.denied', sb, msg);
    });
    const seccompMonitor = opts.purge ? null : await SeccompMonitor.start({
      dir: path.join(config.root, 'seccomp'), log: log.child({ component: 'seccomp-monitor' }),
      onDenied: (d) => denialEvents.add(d),
      onFlood: (id, total) => denialEvents.flood(id, total),
      onMissed: (id, n, by, total) => denialEvents.missed(id, n, by, total),
    });
    const container = new ContainerDriver({ root: config.root, runtime, cgroups, layers, agentBinary, coreScheduling: coreSched.available, storage, log: log.child({ component: 'container' }), network,
      ...(seccompMonitor ? { seccompMonitor } : {}),
      // Per-sandbox AppArmor profiles, loaded only where the kernel has AppArmor (daemon/security/apparmor.ts).
      apparmor: { instance: config.instance, socketDir: path.dirname(config.socket) }, filesystemDefaults: config.filesystem });
    // microVMs attach layer blob files as disks: verified (or cached) like a blob before its first mount.
    microvm = new MicrovmDriver({
      root: config.root, cgroups, agentBinary, launcher: vmmLauncherPath(), vm: config.vm, log: log.child({ component: 'microvm' }),
      blobPath: (dg) => (cache ? cache.ensure(dg) : images.prepareForMount(dg)), filesystemDefaults: config.filesystem,
    });
    if (!opts.purge) await microvm.init();
    // Full VMs (q35): the microvm tier's VMM lifecycle, booting a disk composed from the image's layers (as the builder) or a registered one.
    const vm = new VmDriver({
      root: config.root, cgroups, agentBinary, launcher: vmmLauncherPath(), vm: config.vm, log: log.child({ component: 'vm' }),
      blobPath: (dg) => (cache ? cache.ensure(dg) : images.prepareForMount(dg)), layers, builder: builder ?? null,
    });
    if (!opts.purge) await vm.init();
    // fncall workers are container sandboxes with a worker spec (read-only image, isolating agent).
    const drivers = new Map<Backend, SandboxDriver>([['container', container], ['fncall', container], ['microvm', microvm], ['vm', vm]]);
    const trajectories = new TrajectoryLog(db, os.hostname());
    const manager = new SandboxManager({
      config, repo, images, drivers, failpoints: fp, log: log.child({ component: 'lifecycle' }), snapshots: new SnapshotRepo(db), trajectories, network, storage,
    });
    /**
     * Reloads policy files (all or nothing) and re-applies changed ones to the sandboxes
     * naming them. Reports (log, events, result) shadowed shipped policies, allow rules
     * that never take effect, and every sandbox whose policy's mode changed: a sandbox
     * keeps the mode settled at its create (an allow sandbox never opens up by a reload);
     * only a stored network without a mode of its own takes the policy's new one.
     */
    const reloadPolicies = async () => {
      const inUse = new Set(repo.all().map((s) => s.network?.policy).filter((p): p is string => !!p));
      const modeBefore = new Map([...inUse].map((n) => [n, policies.get(n)?.mode]));
      const r = policies.reload(inUse);
      const reapplied: string[] = [];
      const modes: { id: string; policy: string; mode: 'allow' | 'open'; policy_mode: 'allow' | 'open'; changed: boolean }[] = [];
      for (const sb of repo.all()) {
        const name = sb.network?.policy;
        if (!name || !r.changed.includes(name)) continue;
        const before = sb.network!.mode ?? modeBefore.get(name);
        const done = await manager.setNetwork(sb.id, sb.network!);
        reapplied.push(sb.id);
        const policyMode = policies.get(name)!.mode;
        if (modeBefore.get(name) !== policyMode) {
          const mode = done.network!.mode as 'allow' | 'open';
          const changed = before !== mode;
          modes.push({ id: sb.id, policy: name, mode, policy_mode: policyMode, changed });
          const msg = changed ? `policy ${name} now has mode ${policyMode}; the sandbox took it (its network names no mode of its own)`
            : `policy ${name} now has mode ${policyMode}; the sandbox keeps mode ${mode}, settled at its create (set its network to change it)`;
          repo.event('network.policy_mode_changed', done, msg);
          log.warn({ id: sb.id, policy: name, mode, policyMode }, msg);
        }
      }
      for (const sh of r.shadowed) log.warn(sh, `network policy ${sh.name}: ${sh.file} shadows the shipped ${sh.shadows}`);
      for (const w of r.warnings) log.warn({ policy: w.policy, file: w.file }, `network policy ${w.policy}: ${w.message}`);
      const list = (xs: string[]) => xs.join(',') || 'none';
      repo.event('network.policies_reloaded', null, `loaded=${list(r.loaded)} changed=${list(r.changed)} reapplied=${reapplied.length}`
        + ` shadowed=${list(r.shadowed.map((x) => x.name))} warnings=${r.warnings.length}${r.warnings.length ? ` (${[...new Set(r.warnings.map((w) => w.policy))].join(',')})` : ''}`
        + (modes.length ? ` mode_changed=${modes.map((m) => `${m.id}:${m.changed ? 'took' : 'kept'}-${m.mode}`).join(',')}` : ''));
      return { ...r, reapplied, modes };
    };
    // `criu check` runs once, in the background; host info and process snapshots read the result.
    const criu = probeCriu();

    const rep = await manager.reconcile();
    // Adopted sandboxes re-acquired their layers above; keep exactly those references
    // and unmount every blob no live sandbox holds.
    const inUse = new Map<string, number>();
    for (const s of repo.all()) for (const dg of s.imageLayers) if (layers.refCount(dg) > 0) inUse.set(dg, layers.refCount(dg));
    const lr = await layers.reconcile(inUse);
    await images.syncLeases(manager.layersInUse());
    log.info({ ...rep, layersUnmounted: lr.unmounted }, 'reconciled store with host');

    if (opts.purge) {
      for (const sb of repo.all()) await manager.destroy(sb.id, true, 'purge');
      await layers.reconcile(new Map());
      await storage.purge();
      await cgroups.removeInstance();
      await images.syncLeases([]);
      await network.purge();
      await execa('umount', [path.join(config.root, 'bpf')], { reject: false });
      await sandboxFiles.remove();
      await container.close();
      await microvm.close();
      await vm.close();
      db.close();
      reg.release();
      SeccompMonitor.stop(path.join(config.root, 'seccomp'));
      log.info({ instance: config.instance }, 'purged: every sandbox destroyed, layers, the writable-layer store (its image removed) and the sandbox-files tmpfs unmounted, cgroup parents removed');
      return { config, log, async close() {} };
    }
    // fncall workers are stateless and never adopted: the ones a previous dsecd left are destroyed.
    for (const sb of repo.all()) {
      if (sb.backend === 'fncall') await manager.destroy(sb.id, true, 'fncall worker of a previous dsecd').catch((e) => log.error({ err: e, id: sb.id }, 'destroying a stale fncall worker failed'));
    }
    const resolved = new Map<string, { v: { ref: string; key: string }; at: number }>();
    const fncall = new FncallPools({
      // Resolved refs are cached for a second: a call must not read a manifest from the
      // (possibly shared) store each time, and a retag is seen within that second.
      resolveImage: async (ref) => {
        const hit = resolved.get(ref);
        if (hit && Date.now() - hit.at < 1000) return hit.v;
        const m = await images.get(ref);
        const v = { ref: `${m.name}:${m.tag}`, key: `${m.name}:${m.tag}@${m.layers.join(',')}` };
        resolved.set(ref, { v, at: Date.now() });
        return v;
      },
      alive: (sb) => {
        const row = repo.find(sb.id);
        return !!row && row.state === 'running' && row.desired === null && row.initPid !== null && procStartTime(row.initPid) === row.initStart;
      },
      createWorker: (image, l) => manager.create({
        backend: 'fncall', image, cpus: l.cpus, memory_bytes: l.memoryBytes, pids: l.pids, labels: { [FNCALL_WORKER_LABEL]: 'worker' },
      }, { worker: true }),
      destroyWorker: async (id) => {
        await manager.destroy(id, true, 'fncall worker retired').catch((e) => {
          if (!isDsecError(e, 'NotFound')) throw e;
        });
      },
      execIsolated: (sb, call) => manager.execIsolated(sb, call),
      setMemoryLimit: (id, bytes) => cgroups!.setMemoryLimit(id, bytes),
    }, config.fncall, log.child({ component: 'fncall' }));
    fncall.start();
    // Warm-pool shells are never adopted: the ones a previous dsecd left (it was killed) are destroyed.
    await destroyShells(manager, repo.all().filter(isPoolShell).map((s) => s.id), 'warm-pool shell of a previous dsecd', log);
    const warm = new WarmPools({
      keyOf: (e) => manager.shellKeyOf(e),
      createShell: (e, key) => manager.createShell(e, key),
      destroyShell: async (id) => {
        await manager.destroy(id, true, 'warm-pool shell retired').catch((e) => {
          if (!isDsecError(e, 'NotFound')) throw e;
        });
      },
      userCreatesInFlight: () => manager.userCreatesInFlight,
      msSinceUserCreate: () => manager.msSinceUserCreate,
    }, config.pool, log.child({ component: 'warm-pool' }));
    manager.attachPool(warm);
    const metrics = new Metrics(() => repo.countByState(), () => manager.execs.countByState(), () => warm.stats());
    const metricsServer = config.metricsAddress ? await metrics.listen(config.metricsAddress) : null;
    const reaper = new Reaper(repo, manager, log.child({ component: 'reaper' }), config.retention, undefined, trajectories);
    await reaper.sweep();
    reaper.start();
    const cg = cgroups;
    const tokens = new TokenService(new SqliteTokenStore(db));
    const apiDeps: ApiDeps = {
      tokens,
      manager,
      repo,
      images,
      log,
      failpoints: fp,
      metrics,
      trajectories,
      fncall,
      sandboxfusionImages: config.sandboxfusion.images,
      network: { networking: network, policies, reload: reloadPolicies },
      security: {
        seccompInfo: () => profileInfo(),
        reloadSeccomp: () => {
          const info = loadSeccomp();
          repo.event('security.seccomp_reloaded', null, `${info.file} sha256=${info.sha256.slice(0, 12)} denied=${info.denied}${info.missing_core.length ? ` missing_core=${info.missing_core.join(',')}` : ''}`);
          return info;
        },
      },
      host: {
        version: () => ({ version: DSEC_VERSION, api: 'v1', agent_protocol: AGENT_PROTOCOL_VERSION, node: process.version }),
        hostInfo: async () => ({
          version: DSEC_VERSION,
          instance: config.instance,
          root: config.root,
          socket: config.socket,
          kernel: os.release(),
          cores: os.cpus().length,
          memory_bytes: os.totalmem(),
          cgroup: { version: cg.version, parents: cg.parents },
          runtime: { name: runtimeInfo.name, path: runtimeInfo.path, version: runtimeInfo.version },
          backends: {
            container: { available: true, reason: null },
            fncall: { available: true, reason: null },
            microvm: { available: microvm.capabilities().available, reason: microvm.capabilities().reason },
            vm: { available: vm.capabilities().available, reason: vm.capabilities().reason },
          },
          uid_pool: {
            base: config.uidPool.base, size: config.uidPool.size, range_size: config.uidPool.rangeSize,
            in_use: repo.rangesInUse, free: repo.poolRanges - repo.rangesInUse,
          },
          sandboxes: repo.countByState(),
          fncall_pools: fncall.stats(),
          warm_pools: warm.stats(),
          features: {
            filesystem_snapshots: { available: true, reason: null },
            process_checkpoints: await criu.then((c) => ({ available: false, reason: c.available ? 'criu check passes, but container process checkpoints are not built yet' : c.reason })),
            vm_snapshots: microvm.capabilities().available
              ? { available: true, reason: 'microvm snapshots capture the whole machine (QMP migration of RAM and devices plus a copy of the writable disk); restores and forks resume its processes' }
              : { available: false, reason: `microvm backend unavailable: ${microvm.capabilities().reason}` },
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
            sched_idle: { enforced: schedIdle.available, detail: `batch sandboxes run as SCHED_IDLE with minimal CPU shares: ${schedIdle.reason}` },
            core_scheduling: { enforced: coreSched.available, detail: coreSched.reason },
            seccomp: ((i) => ({
              enforced: i.denied > 0,
              detail: `profile ${i.file} (sha256 ${i.sha256.slice(0, 12)}) on every container sandbox and fncall worker (microvm: see microvm_guest): `
                + (i.denied === 0 ? 'it denies no syscall'
                  : `${i.denied} syscalls denied; ${i.missing_core.length ? `lacks core denials: ${i.missing_core.join(', ')}` : `includes every core denial (${CORE_DENIALS.length}: bpf, the mount family, kexec, modules, keyrings, open_by_handle_at, userfaultfd, perf_event_open, io_uring, ptrace, setns)`}`),
            }))(profileInfo()),
            seccomp_denial_counting: seccompMonitor?.available
              ? { enforced: true, detail: `denials answered EPERM and counted per sandbox by the seccomp monitor (pid ${monitorPid(path.join(config.root, 'seccomp')) ?? '?'}; SCMP_ACT_NOTIFY): seccomp.denied events, seccomp_denials in stats` }
              : { enforced: false, detail: `seccomp monitor not reachable (${seccompMonitor?.reason ?? 'not started'}): new sandboxes get plain EPERM rules, uncounted` },
            apparmor: container.apparmorStatus(),
            landlock: withTiers(container.landlockStatus(), 'microvm: applied in the guest where the guest kernel has Landlock (see each sandbox\'s defences); vm: not applied'),
            readonly_paths: withTiers(container.readonlyPathsStatus(), 'microvm: the same plan, enforced in the guest by read-only mounts; vm: not enforced'),
            ...network.hostDefences(),
            disk_quota: storage.status(),
            ...(await ioDefences(cg, storage)),
            builder_identity: builder
              ? { enforced: true, detail: `image imports, builds, commits and snapshots extract, copy and run mkfs.erofs as uid 0 of a user namespace mapped to host ids ${builder.range.base}-${builder.range.base + builder.range.size - 1} (${builder.slots} slots of ${BUILDER_SLOT_IDS}), disjoint from every sandbox's range, with no network; root only opens inputs, decides overlay opaque markers, publishes blobs and mounts; debootstrap and apt of image bootstrap run as root` }
              : { enforced: false, detail: '[builder] enabled = false: imports, builds, commits and snapshots extract and pack trees as root' },
          },
          storage: { ...storage.info(), pool: manager.poolInfo(), device: ((d) => (d ? `${d.major}:${d.minor}` : null))(storage.blockDevice()) },
        }),
      },
    };
    // The E2B front (docs/E2B.md): served on the TCP door; its template aliases on both doors.
    if (config.e2b.enabled) {
      apiDeps.e2b = new E2bFront(
        localHost({ manager, repo, images, metrics }),
        EnvdTokens.fromFile(path.join(config.root, 'e2b', 'envd.key')),
        new TemplateStore(path.join(config.root, 'e2b', 'templates.json')),
        { defaultTimeoutS: config.e2b.defaultTimeoutS, internet: config.e2b.internet },
        log.child({ component: 'e2b' }),
      );
      // The default `base` template's image, where E2B clients can reach this host; a
      // missing bash-static is reported, not fatal (the other templates still work).
      if (config.remote.listen) {
        await ensureE2bBaseImage(images).catch((e) => log.warn({ err: e }, `E2B base template not available: ${(e as Error).message}`));
      }
    }
    const audit = new AuditLog(config.audit.path);
    const app = buildApi(apiDeps, unixDoor(audit));
    await app.listen({ path: config.socket });
    secureSocket(config.socket, log);
    // Fills start once the API answers: shells are background work, never part of start.
    warm.start();
    // SandboxFusion clients reach /run_code over TCP; nothing else of the API is served there.
    const sfApp = config.sandboxfusion.address ? buildRunCodeApi(apiDeps) : null;
    if (sfApp) {
      const [host, port] = [config.sandboxfusion.address!.slice(0, config.sandboxfusion.address!.lastIndexOf(':')), Number(config.sandboxfusion.address!.split(':').pop())];
      await sfApp.listen({ host, port });
      log.info({ address: config.sandboxfusion.address }, 'serving SandboxFusion run_code over TCP');
    }
    let remote: RemoteDoor | null = null;
    if (config.remote.listen) {
      try {
        remote = await startRemoteDoor(config.remote, config.root, apiDeps, audit, log);
      } catch (e) {
        await sfApp?.close();
        await app.close();
        throw e;
      }
    }
    log.info({ socket: config.socket, root: config.root, runtime: runtimeInfo.name, cgroup: cgroups.version, failpoint: fp.armed }, 'dsecd ready');
    return {
      config,
      log,
      remote: remote ? { address: remote.address, caFile: remote.caFile } : undefined,
      reopenAudit() {
        audit.reopen();
      },
      reloadSeccompProfile() {
        try {
          const info = apiDeps.security.reloadSeccomp();
          log.info(info, 'seccomp profile reloaded');
        } catch (e) {
          log.error({ err: e }, `seccomp profile not reloaded, the one in force stays: ${(e as Error).message}`);
        }
      },
      async reloadNetworkPolicies() {
        try {
          const r = await reloadPolicies();
          log.info(r, 'network policies reloaded');
        } catch (e) {
          log.error({ err: e }, (e as Error).message);
        }
      },
      async close() {
        reaper.stop();
        metricsServer?.close();
        // Let requests in flight (execs) finish, but not for longer than SHUTDOWN_DRAIN_MS.
        await sfApp?.close();
        const drained = Promise.all([app.close(), remote?.app.close()]);
        const t = setTimeout(() => {
          app.server.closeAllConnections();
          (remote?.app.server as { closeAllConnections?(): void } | undefined)?.closeAllConnections?.();
        }, SHUTDOWN_DRAIN_MS);
        await drained;
        clearTimeout(t);
        tokens.close();
        audit.close();
        await fncall.close();
        await warm.close();
        await container.close();
        await network.close();
        await microvm.close();
        await vm.close();
        denialEvents.close();
        seccompMonitor?.close();
        db.close();
        reg.release();
      },
    };
  } catch (e) {
    reg.release();
    throw e;
  }
}

/** Entry point of bin/dsecd. Returns the process exit code. */
export async function main(argv: string[]): Promise<number> {
  const program = new Command('dsecd')
    .description('dsec per-host sandbox daemon (runs in the foreground)')
    .option('--root <dir>', 'state directory (env DSEC_ROOT; default /var/lib/dsec)')
    .option('--socket <path>', 'API Unix socket (env DSEC_SOCKET; default /run/dsec/dsecd.sock)')
    .option('--config <file>', 'TOML config file (env DSEC_CONFIG; default /etc/dsec/dsecd.toml, optional)')
    .option('--listen <addr:port>', 'also serve the API over HTTPS (TLS 1.3, tokens) on this address, e.g. 0.0.0.0:8443 ([remote] listen)')
    .option('--tls-cert <file>', 'server certificate chain, PEM (default: dsecd makes its own CA and certificate under <root>/tls)')
    .option('--tls-key <file>', 'private key of --tls-cert, PEM')
    .option('--tls-ca <file>', 'require client certificates signed by this CA, PEM (mutual TLS; a fleet CA of `dsec fleet ca`)')
    .option('--tls-peer-roles <roles>', 'roles a client certificate may name with --tls-ca, comma-separated (default client,gateway)')
    .option('--purge', 'destroy every sandbox of this instance, unmount its layers and writable-layer store (deleting the store image), remove its cgroups, and exit')
    .version(DSEC_VERSION)
    .exitOverride();
  try {
    program.parse(argv);
  } catch (e) {
    const code = (e as { exitCode?: number }).exitCode ?? 2;
    return code === 0 ? 0 : 2;
  }
  const opts = program.opts<{ root?: string; socket?: string; config?: string; purge?: boolean; listen?: string; tlsCert?: string; tlsKey?: string; tlsCa?: string; tlsPeerRoles?: string }>();
  let config: DaemonConfig;
  try {
    config = loadConfig({ ...opts, peerRoles: opts.tlsPeerRoles });
  } catch (e) {
    process.stderr.write(`dsecd: ${(e as Error).message}\n`);
    return 2;
  }
  const log = pino({ level: config.logLevel, base: { instance: config.instance } }, pino.destination({ dest: 2, sync: false }));
  if (process.getuid?.() !== 0) {
    process.stderr.write('dsecd: must run as root (it creates mounts, cgroups and user namespaces)\n');
    return 2;
  }
  let daemon: Daemon;
  try {
    daemon = await startDaemon(config, log, { purge: opts.purge });
    if (opts.purge) {
      log.flush();
      return 0;
    }
  } catch (e) {
    // A refusal (busy socket, overlapping pool, ...) is one line; only a bug gets a stack.
    if (e instanceof DsecError && e.kind !== 'Internal') log.fatal({ code: e.kind }, e.message);
    else log.fatal({ err: e }, 'start failed');
    process.stderr.write(`dsecd: ${e instanceof DsecError ? e.message : (e as Error).stack}\n`);
    log.flush();
    return 1;
  }
  await new Promise<void>((resolve) => {
    const stop = (sig: string) => {
      log.info({ signal: sig }, 'shutting down; sandboxes keep running');
      resolve();
    };
    process.once('SIGTERM', () => stop('SIGTERM'));
    process.once('SIGINT', () => stop('SIGINT'));
    process.on('SIGHUP', () => {
      daemon.reloadSeccompProfile?.();
      void daemon.reloadNetworkPolicies?.();
      daemon.reopenAudit?.();
    });
  });
  await daemon.close();
  log.flush();
  return 0;
}

/** A container-tier host defence with the other tiers' caveat appended (`dsec host info`). */
function withTiers(d: { enforced: boolean; detail: string }, others: string): { enforced: boolean; detail: string } {
  return { enforced: d.enforced, detail: `container/fncall: ${d.detail}; ${others}` };
}

/**
 * The `io_weight` and `io_max` host defences: what the cgroups of this host enforce of
 * per-sandbox I/O settings on the writable-layer store's device (CgroupManager.ioSupport),
 * one entry each, so a host where limits hold only for direct I/O says so.
 */
async function ioDefences(cg: CgroupManager, storage: UpperStore): Promise<Record<'io_weight' | 'io_max', { enforced: boolean; detail: string }>> {
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
