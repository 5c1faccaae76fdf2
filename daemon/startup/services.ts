/**
 * The lifecycle services of one dsecd, wired once: every service gets the narrow part of
 * the others it uses (daemon/sandbox/). One lock table, one liveness watch and one exec
 * session registry are shared by all of them.
 */
import path from 'node:path';
import type { Logger } from 'pino';
import type { DaemonConfig } from '../config.js';
import type { SandboxDriver } from '../drivers/types.js';
import type { LayerStore } from '../image/layer-store.js';
import type { SandboxNetworking } from '../net/network.js';
import type { WritableLayerStore } from '../storage/writable-layers.js';
import type { SandboxRepo } from '../db/sandboxes.js';
import type { SnapshotRepo } from '../db/snapshots.js';
import type { Backend } from '../model/backend.js';
import { Admission } from '../sandbox/admission.js';
import { Backends } from '../sandbox/backends.js';
import { SandboxCreator } from '../sandbox/create.js';
import { DiskQuotaWatch } from '../sandbox/disk-quota.js';
import { ExecService } from '../sandbox/exec.js';
import { ExecRegistry } from '../sandbox/exec-sessions.js';
import type { Failpoints } from '../sandbox/failpoints.js';
import { LayerLeases } from '../sandbox/layer-leases.js';
import { SandboxLifecycle } from '../sandbox/lifecycle.js';
import { LimitWatch } from '../sandbox/limits.js';
import { LivenessWatch } from '../sandbox/liveness.js';
import { SandboxLocks } from '../sandbox/locks.js';
import { SpecResolver } from '../sandbox/resolve.js';
import { RoundService } from '../sandbox/rounds.js';
import { SnapshotService } from '../sandbox/snapshots.js';
import type { TrajectoryLog } from '../sandbox/trajectory.js';

/** The stores and subsystems the services are built on. */
export interface ServiceSources {
  config: DaemonConfig;
  repo: SandboxRepo;
  snapshotRepo: SnapshotRepo;
  images: LayerStore;
  drivers: ReadonlyMap<Backend, SandboxDriver>;
  failpoints: Failpoints;
  trajectories: TrajectoryLog;
  network: SandboxNetworking;
  storage: WritableLayerStore;
  /** In a fleet, the host's id tag (6 hex) that begins new sandbox and snapshot ids (daemon/model/ids.ts); else absent. */
  idTag?: string;
  log: Logger;
}

/** Every lifecycle service of a dsecd. */
export interface Services {
  backends: Backends;
  leases: LayerLeases;
  liveness: LivenessWatch;
  lifecycle: SandboxLifecycle;
  creator: SandboxCreator;
  exec: ExecService;
  sessions: ExecRegistry;
  rounds: RoundService;
  snapshots: SnapshotService;
  limits: LimitWatch;
  disks: DiskQuotaWatch;
}

/** Builds the services over `s`. */
export function buildServices(s: ServiceSources): Services {
  const { config, repo, images, failpoints, network, storage } = s;
  const log = s.log.child({ component: 'lifecycle' });
  const backends = new Backends(s.drivers);
  const locks = new SandboxLocks();
  const sessions = new ExecRegistry({ spoolDir: (sid) => path.join(config.root, 'sandboxes', sid, 'execs') });
  const leases = new LayerLeases(repo, s.snapshotRepo, images);
  const liveness = new LivenessWatch({ repo, backends, locks, steps: failpoints, log });
  const resolver = new SpecResolver({ config, images, backends, network, storage });
  const admission = new Admission({ config, repo, storage });
  const lifecycle = new SandboxLifecycle({
    config, repo, backends, locks, steps: failpoints, liveness, leases, execs: sessions, resolver, network, images, storage, log,
  });
  const creator = new SandboxCreator({ repo, backends, locks, failpoints, admission, resolver, leases, liveness, lifecycle, network, idTag: s.idTag, log });
  const exec = new ExecService({ config, repo, backends, sessions, trajectories: s.trajectories, liveness, failpoints });
  const rounds = new RoundService({ config, repo, backends, locks, lifecycle, log });
  const snapshots = new SnapshotService({
    config, repo, snapshots: s.snapshotRepo, images, backends, locks, failpoints, leases, admission, resolver, creator, lifecycle, idTag: s.idTag, log,
  });
  return {
    backends, leases, liveness, lifecycle, creator, exec, sessions, rounds, snapshots,
    limits: new LimitWatch(repo, backends), disks: new DiskQuotaWatch({ config, repo, storage, log }),
  };
}
