/**
 * dsecd: the per-host sandbox daemon, in the foreground.
 *
 *   dsecd [--root DIR] [--socket PATH] [--config FILE] [--listen ADDR:PORT [--tls-cert FILE --tls-key FILE] [--tls-ca FILE]]
 *         [--etcd URL[,URL...] --advertise URL [--host-name NAME] [--host-label K=V]...]
 *         [--reclaim off|idle|aggressive]
 *
 * {@link startDaemon} runs named start phases, in order: the seccomp profile and the
 * state directories, then {@link openHost} (instance registration, the sandbox-files
 * tmpfs, the API socket, cgroups, the OCI runtime), {@link openStores} (the database, the
 * builder, the image store, the writable-layer store: mounted before any sandbox is
 * touched), {@link startDrivers} (layer mounts, networking, the seccomp monitor, one
 * driver per tier), the lifecycle services (daemon/startup/services.ts),
 * {@link reconcileHost} (adopt live sandboxes, undo half-done work, remove orphans),
 * {@link startPools} (fncall workers, warm pools) and {@link serveApi} (the host's reclaim
 * of idle sandboxes, daemon/startup/reclaim.ts, then the API socket,
 * then the TCP door when `--listen` is set, then the fleet registration with `--etcd`,
 * daemon/fleet/). SIGTERM/SIGINT
 * close the API and exit; sandboxes keep running (systemd's KillMode=process) and are
 * adopted by the next start.
 */
import { Command } from 'commander';
import { existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pino, { type Logger } from 'pino';
import { execa } from 'execa';
import { loadConfig, type DaemonConfig } from './config.js';
import { DsecError, invalidArgument, isDsecError, unavailable } from './errors.js';
import { SYSTEM_TENANT } from './model/tenant.js';
import { openDb, type Db } from './db/db.js';
import { SandboxRepo } from './db/sandboxes.js';
import { SnapshotRepo } from './db/snapshots.js';
import { probeCriu } from './host/criu.js';
import { detectCoreScheduling, detectSchedIdle } from './host/sched.js';
import { detectCgroups, joinRecordedCgroups, locateInstanceParents, type CgroupManager } from './host/cgroups/index.js';
import { registerInstance } from './host/instances.js';
import { Builder } from './host/builder.js';
import { BPF_BUILD_RELATIVE } from './host/bpf.js';
import { SandboxFiles } from './host/sandbox-files.js';
import { unmountAllAsync } from './host/native.js';
import { RuntimeSet, runtimeStateDir } from './drivers/container/runtime.js';
import { ContainerDriver } from './drivers/container/driver.js';
import { MicrovmDriver } from './drivers/microvm/driver.js';
import { VmDriver } from './drivers/vm/driver.js';
import type { SandboxDriver } from './drivers/types.js';
import { LayerStore } from './image/layer-store.js';
import { LayerMounts } from './image/mounts.js';
import { BlobCache } from './image/cache.js';
import { buildApi, buildRunCodeApi, type ApiDeps } from './api/server.js';
import { TransferMeter } from './api/transfer.js';
import type { SeccompProfileInfo } from './api/schema.js';
import { SandboxNetworking } from './net/network.js';
import { builtinDeny } from './net/decisions.js';
import { parseSubnet } from './net/addr.js';
import { PolicySet, shippedPolicyDir } from './security/egress-policy.js';
import { DenialEvents, SeccompMonitor } from './security/seccomp-monitor.js';
import { profileInfo, reloadProfile as reloadSeccompFile } from './security/seccomp.js';
import { WritableLayerStore } from './storage/writable-layers.js';
import type { Backend } from './model/backend.js';
import { FNCALL_WORKER_LABEL, FncallPools } from './fncall/pool.js';
import { Failpoints } from './sandbox/failpoints.js';
import { Reaper } from './sandbox/reaper.js';
import { CreateRecords, startHoldReaper } from './sandbox/create-records.js';
import { reconcile } from './sandbox/reconcile.js';
import { TrajectoryLog } from './sandbox/trajectory.js';
import { isPoolShell, WarmPools } from './sandbox/warm-pool.js';
import type { SandboxLifecycle } from './sandbox/lifecycle.js';
import { Metrics } from './metrics.js';
import { AGENT_PROTOCOL_VERSION, DSEC_VERSION } from './version.js';
import { agentBinaryPath, checkCgroupParents, checkRootLength, claimSocket, prepareStateDirs, recordedCgroupParents, repoRoot, secureSocket, vmmLauncherPath } from './startup/host.js';
import { hostInfo } from './api/host-info.js';
import { loadPolicies, reloadPolicies } from './startup/policies.js';
import { buildServices, type Services } from './startup/services.js';
import { startHostReclaim } from './startup/reclaim.js';
import { DamonController } from './host/memory/damon.js';
import { AuditLog } from './remote/audit.js';
import { unixDoor } from './remote/door.js';
import { startRemoteDoor, type RemoteDoor } from './remote/listen.js';
import { SqliteTokenStore, TokenService } from './remote/tokens.js';
import { loadOrCreateIdentity, type HostIdentity } from './fleet/identity.js';
import type { FleetJoin, FleetMembership } from './fleet/join.js';
import { imageDigest } from './fleet/layout.js';
import { mountE2b, openE2bFront } from './api/e2b/index.js';

/** On SIGTERM, requests in flight get this long (30 s) to finish before connections are cut; systemd's stop timeout is 90 s. */
const SHUTDOWN_DRAIN_MS = 30_000;

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

/** Options of {@link startDaemon}. */
export interface StartOptions {
  /** Destroy every sandbox of the instance and everything it made on the host, then return without serving. */
  purge?: boolean;
}

/** What {@link openHost} set up: the instance's place on the host. */
interface HostParts {
  sandboxFiles: SandboxFiles;
  /** The agent binary as sandboxes bind it (a copy on the sandbox-files tmpfs). */
  agentBinary: string;
  cgroups: CgroupManager;
  runtime: RuntimeSet;
  /** Logged at start: state dirs of runtimes this host can no longer run (RuntimeSet.open), a purge that joined the recorded cgroups. */
  warnings: string[];
}

/** What {@link openStores} opened. */
interface Stores {
  db: Db;
  repo: SandboxRepo;
  builder: Builder | undefined;
  images: LayerStore;
  storage: WritableLayerStore;
}

/** What {@link startDrivers} started. */
interface DriverParts {
  layers: LayerMounts;
  policies: PolicySet;
  network: SandboxNetworking;
  denialEvents: DenialEvents;
  seccompMonitor: SeccompMonitor | null;
  container: ContainerDriver;
  microvm: MicrovmDriver;
  vm: VmDriver;
  drivers: Map<Backend, SandboxDriver>;
  coreSched: { available: boolean; reason: string };
  schedIdle: { available: boolean; reason: string };
}

/**
 * Phase "seccomp profile": the profile is a data file, so a malformed one refuses the
 * start (there is no previous profile to keep yet); later reloads keep the one in force.
 * @returns a loader for reloads, which logs the profile's warnings.
 * @throws DsecError InvalidArgument naming the file and field.
 */
function seccompLoader(config: DaemonConfig, log: Logger): () => SeccompProfileInfo {
  return () => {
    try {
      reloadSeccompFile(config.security.seccompProfile);
    } catch (e) {
      throw invalidArgument((e as Error).message);
    }
    const info = profileInfo();
    for (const w of info.warnings) log.warn({ file: info.file, missing_core: info.missing_core }, w);
    return info;
  };
}

/**
 * Phase "host": the sandbox-files tmpfs with the agent, the API socket (a busy one is
 * refused before anything is created), the instance's cgroup parents, the OCI runtime.
 * @throws DsecError FailedPrecondition (busy socket, moved cgroup parents), Unavailable (no runtime).
 */
async function openHost(config: DaemonConfig, agentSource: string, opts: StartOptions): Promise<HostParts> {
  // The agent (and networked sandboxes' resolv.conf) are bound into sandboxes from a
  // tmpfs of the instance's own, so their mount entries name no host path.
  const sandboxFiles = SandboxFiles.open(config.root);
  const agentBinary = sandboxFiles.installAgent(agentSource);
  if (!opts.purge) await claimSocket(config.socket);
  let cgroups = await detectCgroups({ instance: config.instance });
  const warnings: string[] = [];
  if (opts.purge) {
    // A purge goes where the sandboxes' cgroups are, whatever cgroup it was started from,
    // and leaves the record alone (it refuses nothing, so it must not lose the record).
    const joined = await joinRecordedCgroups(await locateInstanceParents(recordedCgroupParents(config.root), cgroups), cgroups);
    if (joined.length) {
      cgroups = await detectCgroups({ instance: config.instance });
      warnings.push(`--purge was run from another cgroup than this instance's dsecd: it joined the cgroups dsecd ran in (${joined.join(', ')}), where the sandboxes live`);
    }
  } else {
    checkCgroupParents(config.root, cgroups.parents);
  }
  await cgroups.init();
  const rt = await RuntimeSet.open(config.root, config.runtime, cgroups.version);
  return { sandboxFiles, agentBinary, cgroups, runtime: rt.set, warnings: [...warnings, ...rt.warnings] };
}

/**
 * Phase "stores": the database, the builder identity (untrusted trees are extracted,
 * copied and packed as it, never as root: daemon/host/builder.ts; refusing to start
 * rather than falling back to root silently), the image store with its built-in images,
 * and the writable-layer store, mounted (or made on first start) before reconcile
 * touches a sandbox.
 */
async function openStores(config: DaemonConfig, log: Logger): Promise<Stores> {
  const db = openDb(path.join(config.root, 'dsec.db'));
  const repo = new SandboxRepo(db, config.uidPool);
  const builder = config.builder.enabled ? new Builder({ range: config.builder, workDir: path.join(config.root, 'builder') }) : undefined;
  await builder?.init();
  await builder?.probe();
  const images = new LayerStore({
    root: config.images.store,
    localDir: path.join(config.root, 'images-local'),
    owner: { host: os.hostname(), instance: config.instance },
    pruneGraceMs: config.images.pruneGraceMs,
    builder,
    mkfsPath: config.images.mkfsPath,
  });
  await images.init();
  await images.ensureBuiltinImages();
  const storage = await WritableLayerStore.open({ root: config.root, config: config.storage, log: log.child({ component: 'storage' }) });
  const storeCap = storage.capacityBytes();
  if (storage.enforcesQuota && storeCap !== null && config.defaults.diskBytes > storeCap) {
    log.warn({ diskBytes: config.defaults.diskBytes, capacityBytes: storeCap }, '[defaults] disk_bytes is more than the writable-layer store holds: sandboxes created without disk_bytes get the whole store as their quota');
  }
  return { db, repo, builder, images, storage };
}

/**
 * Phase "drivers": layer mounts (through the blob cache when configured), sandbox
 * networking with its policies, the seccomp monitor, and one driver per tier (fncall
 * workers are container sandboxes with a worker spec).
 */
async function startDrivers(config: DaemonConfig, log: Logger, h: HostParts, st: Stores, opts: StartOptions): Promise<DriverParts> {
  const { images, repo } = st;
  let microvm: MicrovmDriver | null = null;
  let layers: LayerMounts | null = null;
  const cache = config.images.cacheDir
    ? new BlobCache({ dir: config.images.cacheDir, maxBytes: config.images.cacheBytes, source: (dg) => images.blobPath(dg),
      pinned: () => new Set([...layers!.mounted(), ...microvm!.pinnedLayers()]) })
    : null;
  // Verify a blob before its first mount (or attach) on this host; with a cache, use the verified local copy.
  const verified = (dg: string) => (cache ? cache.ensure(dg) : images.prepareForMount(dg));
  layers = new LayerMounts({ mountDir: path.join(config.root, 'layers'), blobPath: (dg) => images.blobPath(dg), prepare: verified });
  const coreSched = detectCoreScheduling();
  const schedIdle = detectSchedIdle();
  // Warnings name allow rules that the built-in denials make unreachable (a bad subnet is refused below, by SandboxNetworking).
  const alwaysDenied = () => {
    try {
      return builtinDeny(parseSubnet(config.network.subnet), config.network.hostLoopback);
    } catch {
      return [];
    }
  };
  const policies = new PolicySet([shippedPolicyDir(), config.network.policyDir], alwaysDenied);
  loadPolicies(policies, log);
  const cg2 = h.cgroups.parents.unified;
  const network = new SandboxNetworking({
    config: config.network, root: config.root, instance: config.instance, uidPool: config.uidPool, policies, sandboxFiles: h.sandboxFiles,
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
  const container = new ContainerDriver({
    root: config.root, runtime: h.runtime, cgroups: h.cgroups, layers, agentBinary: h.agentBinary, masks: h.sandboxFiles, coreScheduling: coreSched.available, storage: st.storage,
    log: log.child({ component: 'container' }), network, ...(seccompMonitor ? { seccompMonitor } : {}),
    // Per-sandbox AppArmor profiles, loaded only where the kernel has AppArmor (daemon/security/apparmor.ts).
    apparmor: { instance: config.instance, socketDir: path.dirname(config.socket) }, filesystemDefaults: config.filesystem,
  });
  // microVMs attach layer blob files as disks: verified (or cached) like a blob before its first mount.
  microvm = new MicrovmDriver({
    root: config.root, cgroups: h.cgroups, agentBinary: h.agentBinary, launcher: vmmLauncherPath(), vm: config.vm, log: log.child({ component: 'microvm' }),
    blobPath: verified, filesystemDefaults: config.filesystem,
  });
  if (!opts.purge) await microvm.init();
  // Full VMs (q35): the VMM lifecycle of the microvm tier, booting a disk composed from the image's layers (as the builder) or a registered one.
  const vm = new VmDriver({
    root: config.root, cgroups: h.cgroups, agentBinary: h.agentBinary, launcher: vmmLauncherPath(), vm: config.vm, log: log.child({ component: 'vm' }),
    blobPath: verified, layers, builder: st.builder ?? null,
  });
  if (!opts.purge) await vm.init();
  const drivers = new Map<Backend, SandboxDriver>([['container', container], ['fncall', container], ['microvm', microvm], ['vm', vm]]);
  return { layers, policies, network, denialEvents, seccompMonitor, container, microvm, vm, drivers, coreSched, schedIdle };
}

/**
 * Phase "reconcile": settles every row with the host (daemon/sandbox/reconcile.ts), then
 * keeps exactly the layer references adopted sandboxes re-acquired (unmounting every
 * blob no live sandbox holds) and the image store's leases of the layers in use.
 */
async function reconcileHost(config: DaemonConfig, log: Logger, st: Stores, d: DriverParts, svc: Services, snapshotRepo: SnapshotRepo): Promise<void> {
  const rep = await reconcile({ root: config.root, repo: st.repo, snapshots: snapshotRepo, backends: svc.backends, log: log.child({ component: 'lifecycle' }) });
  const inUse = new Map<string, number>();
  for (const s of st.repo.all()) for (const dg of s.imageLayers) if (d.layers.refCount(dg) > 0) inUse.set(dg, d.layers.refCount(dg));
  const lr = await d.layers.reconcile(inUse);
  await svc.leases.sync();
  log.info({ ...rep, layersUnmounted: lr.unmounted }, 'reconciled store with host');
}

/** `dsecd --purge`: every sandbox destroyed, and every mount, store, cgroup and tmpfs of the instance removed. */
async function purge(config: DaemonConfig, log: Logger, h: HostParts, st: Stores, d: DriverParts, svc: Services): Promise<void> {
  for (const sb of st.repo.all()) await svc.lifecycle.destroy(sb.id, true, 'purge');
  await d.layers.reconcile(new Map());
  await st.storage.purge();
  await h.cgroups.removeInstance();
  // A kdamond this instance created (its record in the root) goes too; any other is left alone.
  await new DamonController({ root: config.memory.damonSysfs, ownerFile: path.join(config.root, 'damon-owner.json') }).release();
  await st.images.syncLeases([]);
  await d.network.purge();
  await execa('umount', [path.join(config.root, 'bpf')], { reject: false });
  await h.sandboxFiles.remove();
  // crun's state tmpfs (RuntimeSet.open mounts it).
  await unmountAllAsync(runtimeStateDir(config.root, 'crun')).catch((e: Error) => log.warn({ err: e }, 'unmount of the runtime state tmpfs failed'));
  await d.container.close();
  await d.microvm.close();
  await d.vm.close();
  st.db.close();
  SeccompMonitor.stop(path.join(config.root, 'seccomp'));
  log.info({ instance: config.instance }, 'purged: every sandbox destroyed, layers, the writable-layer store (its image removed) and the sandbox-files tmpfs unmounted, cgroup parents removed');
}

/** Destroys sandboxes `ids` (force), 8 at a time; failures are logged, never thrown. */
async function destroyAll(lifecycle: Pick<SandboxLifecycle, 'destroy'>, ids: string[], reason: string, log: Logger): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: Math.min(8, ids.length) }, async () => {
    while (next < ids.length) {
      const id = ids[next++];
      await lifecycle.destroy(id, true, reason).catch((e) => log.error({ err: e, id }, 'destroying a warm-pool shell failed'));
    }
  }));
}

/** Destroys a sandbox that may already be gone (a retired worker or shell). */
async function retire(lifecycle: Pick<SandboxLifecycle, 'destroy'>, id: string, reason: string): Promise<void> {
  await lifecycle.destroy(id, true, reason).catch((e) => {
    if (!isDsecError(e, 'NotFound')) throw e;
  });
}

/**
 * Phase "pools": the fncall worker pools and the warm pools. Neither kind of sandbox is
 * adopted across a restart: the workers and shells a previous dsecd left are destroyed
 * first; pools refill on demand (fncall) or once the API answers (warm pools).
 */
async function startPools(config: DaemonConfig, log: Logger, st: Stores, h: HostParts, svc: Services): Promise<{ fncall: FncallPools; warm: WarmPools }> {
  const { repo, images } = st;
  for (const sb of repo.all()) {
    if (sb.backend === 'fncall') await svc.lifecycle.destroy(sb.id, true, 'fncall worker of a previous dsecd').catch((e) => log.error({ err: e, id: sb.id }, 'destroying a stale fncall worker failed'));
  }
  const resolved = new Map<string, { v: { ref: string; key: string }; at: number }>();
  const fncall = new FncallPools({
    // Resolved refs are cached for a second: a call must not read a manifest from the
    // (possibly shared) store each time, and a retag is seen within that second.
    resolveImage: async (ref) => {
      const hit = resolved.get(ref);
      if (hit && Date.now() - hit.at < 1000) return hit.v;
      // Workers are shared by every tenant's calls, so they run the shared (system)
      // images only; the lookup is system's own, which names no other tenant in its error.
      const m = await images.get(ref, { tenant: SYSTEM_TENANT, all: false }).catch((e: unknown) => {
        if (!isDsecError(e, 'NotFound')) throw e;
        throw new DsecError('NotFound', `${(e as Error).message}: the fncall tier runs the shared (system) images; a tenant's own images run with backend "container"`);
      });
      const v = { ref: `${m.name}:${m.tag}`, key: `${m.name}:${m.tag}@${m.layers.join(',')}` };
      resolved.set(ref, { v, at: Date.now() });
      return v;
    },
    // The row alone: an init that dies moves its row to `failed` as it dies (the liveness
    // pidfd watch, daemon/sandbox/liveness.ts), so no /proc read per call.
    alive: (sb) => repo.isRunningWith(sb.id, sb.initPid),
    createWorker: (image, l) => svc.creator.create({
      backend: 'fncall', image, cpus: l.cpus, memoryBytes: l.memoryBytes, pids: l.pids, labels: { [FNCALL_WORKER_LABEL]: 'worker' },
    }, { worker: true }),
    destroyWorker: (id) => retire(svc.lifecycle, id, 'fncall worker retired'),
    execIsolated: (sb, call) => svc.exec.execIsolated(sb, call),
    setMemoryLimit: (id, bytes) => h.cgroups.setMemoryLimit(id, bytes),
  }, config.fncall, log.child({ component: 'fncall' }));
  fncall.start();
  await destroyAll(svc.lifecycle, repo.all().filter(isPoolShell).map((s) => s.id), 'warm-pool shell of a previous dsecd', log);
  const warm = new WarmPools({
    keyOf: (e) => svc.creator.shellKeyOf(e),
    createShell: (e, key) => svc.creator.createShell(e, key),
    destroyShell: (id) => retire(svc.lifecycle, id, 'warm-pool shell retired'),
    userCreatesInFlight: () => svc.creator.userCreatesInFlight,
    msSinceUserCreate: () => svc.creator.msSinceUserCreate,
  }, config.pool, log.child({ component: 'warm-pool' }));
  svc.creator.attachPool(warm);
  return { fncall, warm };
}

/**
 * Starts a daemon with the given config. Resolves once the API is listening.
 * With `purge`, it instead destroys every sandbox of the instance, unmounts its layers and
 * its writable-layer store (whose loop device detaches and whose image is deleted),
 * removes its cgroup parents and resolves without serving (`dsecd --purge`).
 * @throws DsecError when the host lacks what dsecd needs (runtime, agent binary, cgroups).
 */
export async function startDaemon(config: DaemonConfig, log: Logger, opts: StartOptions = {}): Promise<Daemon> {
  const fp = new Failpoints(process.env.DSEC_FAILPOINT);
  checkRootLength(config.root);
  const loadSeccomp = seccompLoader(config, log);
  loadSeccomp();
  const agentSource = agentBinaryPath();
  if (!existsSync(agentSource)) throw unavailable(`agent binary ${agentSource} is missing; run the install step (make -C native)`);
  prepareStateDirs(config.root);
  // In a fleet the host's persistent id is read (or made) first: a name another host id
  // holds in etcd refuses the start before anything is created, and the id's tag begins
  // every sandbox id (daemon/fleet/).
  const identity = config.fleet ? loadOrCreateIdentity(config.root) : null;
  const fleetJoin = config.fleet && identity && !opts.purge
    ? await (await import('./fleet/join.js')).prepareFleet(config.fleet, identity, log.child({ component: 'fleet' }))
    : null;
  const reg = registerInstance(config);
  try {
    const h = await openHost(config, agentSource, opts);
    for (const w of h.warnings) log.warn(w);
    if (h.runtime.earlier.length) log.info({ runtimes: h.runtime.earlier.map((r) => r.info.name) }, 'containers of an earlier runtime stay with it until destroyed');
    const st = await openStores(config, log);
    const d = await startDrivers(config, log, h, st, opts);
    const snapshotRepo = new SnapshotRepo(st.db);
    const trajectories = new TrajectoryLog(st.db, os.hostname());
    const svc = buildServices({
      config, repo: st.repo, snapshotRepo, images: st.images, drivers: d.drivers, failpoints: fp, trajectories, network: d.network, storage: st.storage, log,
      ...(identity ? { idTag: identity.tag } : {}),
    });
    // `criu check` runs once, in the background; host info and process snapshots read the result.
    const criu = probeCriu();
    await reconcileHost(config, log, st, d, svc, snapshotRepo);
    if (opts.purge) {
      await purge(config, log, h, st, d, svc);
      reg.release();
      return { config, log, async close() {} };
    }
    const pools = await startPools(config, log, st, h, svc);
    return await serveApi({ config, log, fp, h, st, d, svc, trajectories, criu, loadSeccomp, identity, fleetJoin, release: () => reg.release(), ...pools });
  } catch (e) {
    reg.release();
    fleetJoin?.close();
    throw e;
  }
}

/** Everything {@link serveApi} serves and closes. */
interface Running {
  config: DaemonConfig;
  log: Logger;
  fp: Failpoints;
  h: HostParts;
  st: Stores;
  d: DriverParts;
  svc: Services;
  trajectories: TrajectoryLog;
  criu: ReturnType<typeof probeCriu>;
  loadSeccomp: () => SeccompProfileInfo;
  fncall: FncallPools;
  warm: WarmPools;
  /** The host's fleet identity and its prepared etcd membership (`--etcd`), else null. */
  identity: HostIdentity | null;
  fleetJoin: FleetJoin | null;
  /** Releases the instance registration (at close). */
  release(): void;
}

/**
 * Phase "serve": metrics, the reaper, the API on its socket (and POST /run_code alone on
 * the SandboxFusion TCP address when configured), then warm-pool fills. Returns the
 * daemon's handle, whose `close` undoes this in reverse (sandboxes keep running).
 */
async function serveApi(r: Running): Promise<Daemon> {
  const { config, log, h, st, d, svc, fncall, warm } = r;
  const { repo } = st;
  const transfers = new TransferMeter();
  const reclaim = await startHostReclaim(config, h.cgroups, repo, svc.activity, log);
  const metrics = new Metrics(() => repo.countByState(), () => svc.sessions.countByState(), () => warm.stats(), transfers, () => reclaim.status());
  const metricsServer = config.metricsAddress ? await metrics.listen(config.metricsAddress) : null;
  const reaper = new Reaper(repo, svc, log.child({ component: 'reaper' }), config.retention, undefined, r.trajectories);
  await reaper.sweep();
  reaper.start();
  const createRecords = new CreateRecords(st.db, config.creates);
  const stopHolds = startHoldReaper(createRecords, (id) => svc.lifecycle.destroy(id, true), log.child({ component: 'creates' }));
  const reload = () => reloadPolicies({ policies: d.policies, repo, lifecycle: svc.lifecycle, log });
  // In a fleet etcd holds the tokens (daemon/fleet/tokens.ts); else dsecd's own store.
  const tokens = new TokenService(r.fleetJoin ? r.fleetJoin.tokenStore() : new SqliteTokenStore(st.db));
  let fleet: FleetMembership | null = null;
  const apiDeps: ApiDeps = {
    ...svc,
    tokens,
    repo,
    createRecords,
    images: st.images,
    log,
    failpoints: r.fp,
    metrics,
    reclaim,
    transfers,
    trajectories: r.trajectories,
    fncall,
    sandboxfusionImages: config.sandboxfusion.images,
    network: { networking: d.network, policies: d.policies, reload },
    security: {
      seccompInfo: () => profileInfo(),
      reloadSeccomp: () => {
        const info = r.loadSeccomp();
        repo.event('security.seccomp_reloaded', null, `${info.file} sha256=${info.sha256.slice(0, 12)} denied=${info.denied}${info.missing_core.length ? ` missing_core=${info.missing_core.join(',')}` : ''}`);
        return info;
      },
    },
    host: {
      version: () => ({ version: DSEC_VERSION, api: 'v1', agent_protocol: AGENT_PROTOCOL_VERSION, node: process.version }),
      hostInfo: () => hostInfo({
        config, cgroups: h.cgroups, runtime: h.runtime.info, backends: svc.backends, container: d.container, microvm: d.microvm, repo, fncall, warm,
        criu: r.criu, schedIdle: d.schedIdle, coreSched: d.coreSched, network: d.network, storage: st.storage, disks: svc.disks,
        seccompMonitor: d.seccompMonitor, builder: st.builder, fleet: () => fleet?.status() ?? null, reclaim: () => reclaim.status(), reclaimConfig: config.memory,
      }),
    },
  };
  // The E2B front (docs/E2B.md): served on the TCP door; its template aliases on both doors.
  const e2b = config.e2b.enabled ? await openE2bFront(config, { ...svc, repo, images: st.images, metrics }, config.remote.listen !== null, log) : undefined;
  if (e2b) apiDeps.e2b = e2b;
  const audit = new AuditLog(config.audit.path);
  const app = buildApi(apiDeps, unixDoor(audit));
  await app.listen({ path: config.socket });
  secureSocket(config.socket, log);
  // Fleet registration runs beside the API: an unreachable etcd delays nothing (daemon/fleet/registration.ts).
  fleet = r.fleetJoin?.register({
    info: () => ({
      backends: [...d.drivers.keys()].filter((b) => b === 'container' || b === 'fncall' || (b === 'microvm' ? d.microvm : d.vm).capabilities().available),
      capacity: { cores: os.cpus().length, memory_bytes: os.totalmem(), disk_bytes: st.storage.capacityBytes() },
      admission: {
        max_sandboxes: config.admission.maxSandboxes, cpus: os.cpus().length * config.admission.cpuOvercommit,
        memory_bytes: os.totalmem() * config.admission.memoryOvercommit,
        disk_bytes: ((c) => (c === null || !st.storage.enforcesQuota ? null : c * config.admission.diskOvercommit))(st.storage.capacityBytes()),
      },
      defaults: { cpus: config.defaults.cpus, memory_bytes: config.defaults.memoryBytes },
      version: DSEC_VERSION,
    }),
    load: () => {
      const t = repo.admissionTotals();
      return {
        sandboxes: repo.countByState(),
        admitted: { count: t.count, cpus: t.cpus, memory_bytes: t.memoryBytes, disk_bytes: t.diskBytes },
        warm_pools: warm.stats().map((w) => ({ image: w.image, network: w.network, ready: w.ready, size: w.size })),
        jobs: repo.jobCounts(),
        untagged: repo.countUntagged(r.identity!.tag),
      };
    },
    images: async () => Promise.all((await st.images.list()).map(async (m) => {
      let size = 0;
      for (const d of m.layers) size += (await st.images.layer(d).catch(() => null))?.size_bytes ?? 0;
      return { ref: `${m.name}:${m.tag}`, digest: imageDigest(m.layers), ...(m.tenant ? { tenant: m.tenant } : {}), size_bytes: size };
    })),
  }) ?? null;
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
      remote = await startRemoteDoor(config.remote, config.root, apiDeps, (door) => {
        const tcp = buildApi(apiDeps, door);
        // E2B's control plane and envd, next to /v1 on the same port.
        if (e2b) mountE2b(tcp, e2b);
        return tcp;
      }, audit, log, { gatewayIdentity: config.fleet !== null });
    } catch (e) {
      await sfApp?.close();
      await app.close();
      throw e;
    }
  }
  log.info({ socket: config.socket, root: config.root, runtime: h.runtime.info.name, cgroup: h.cgroups.version, failpoint: r.fp.armed }, 'dsecd ready');
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
        const res = await reload();
        log.info(res, 'network policies reloaded');
      } catch (e) {
        log.error({ err: e }, (e as Error).message);
      }
    },
    async close() {
      await fleet?.stop();
      reaper.stop();
      stopHolds();
      await reclaim.stop();
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
      await audit.close();
      await fncall.close();
      await warm.close();
      await d.container.close();
      await d.network.close();
      await d.microvm.close();
      await d.vm.close();
      d.denialEvents.close();
      d.seccompMonitor?.close();
      st.db.close();
      r.release();
    },
  };
}

/** Entry point of bin/dsecd. Returns the process exit code. */
export async function main(argv: string[]): Promise<number> {
  const program = new Command('dsecd')
    .description('dsec per-host sandbox daemon (runs in the foreground)')
    .option('--root <dir>', 'state directory (env DSEC_ROOT; default /var/lib/dsec)')
    .option('--socket <path>', 'API Unix socket (env DSEC_SOCKET; default /run/dsec/dsecd.sock)')
    .option('--config <file>', 'TOML config file (env DSEC_CONFIG; default /etc/dsec/dsecd.toml, optional)')
    .option('--etcd <urls>', 'join a fleet: register this host in etcd at these client URLs (comma-separated; [fleet] etcd)')
    .option('--etcd-cert <file>', 'etcd client certificate (PEM; its CN is this host\'s etcd user)')
    .option('--etcd-key <file>', 'key of --etcd-cert (PEM)')
    .option('--etcd-ca <file>', 'CA certificate of etcd\'s server certificate (PEM)')
    .option('--etcd-prefix <path>', 'key prefix of the fleet in etcd (default /dsec)')
    .option('--advertise <url>', 'https://ADDR:PORT at which gateways reach this host (required with --etcd)')
    .option('--host-name <name>', 'this host\'s name in the fleet (default: the machine\'s host name)')
    .option('--host-label <k=v>', 'a label of this host in the fleet, e.g. pool=burst or zone=a (repeatable)', (v: string, prev: string[] = []) => [...prev, v])
    .option('--listen <addr:port>', 'also serve the API over HTTPS (TLS 1.3, tokens) on this address, e.g. 0.0.0.0:8443 ([remote] listen)')
    .option('--tls-cert <file>', 'server certificate chain, PEM (default: dsecd makes its own CA and certificate under <root>/tls)')
    .option('--tls-key <file>', 'private key of --tls-cert, PEM')
    .option('--tls-ca <file>', 'require client certificates signed by this CA, PEM (mutual TLS; a fleet CA of `dsec fleet ca`)')
    .option('--tls-peer-roles <roles>', 'roles a client certificate may name with --tls-ca, comma-separated (default client,gateway)')
    .option('--reclaim <mode>', 'reclaim idle container sandboxes\' memory: off (default), idle or aggressive ([memory] reclaim; see docs/OPERATIONS.md)')
    .option('--purge', 'destroy every sandbox of this instance, unmount its layers and writable-layer store (deleting the store image), remove its cgroups, and exit')
    .version(DSEC_VERSION)
    .exitOverride();
  try {
    program.parse(argv);
  } catch (e) {
    const code = (e as { exitCode?: number }).exitCode ?? 2;
    return code === 0 ? 0 : 2;
  }
  const opts = program.opts<{ root?: string; socket?: string; config?: string; purge?: boolean; reclaim?: string; listen?: string; tlsCert?: string; tlsKey?: string; tlsCa?: string; tlsPeerRoles?: string;
    etcd?: string; etcdCert?: string; etcdKey?: string; etcdCa?: string; etcdPrefix?: string; advertise?: string; hostName?: string; hostLabel?: string[] }>();
  let config: DaemonConfig;
  try {
    config = loadConfig({ ...opts, peerRoles: opts.tlsPeerRoles, hostLabels: opts.hostLabel });
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
