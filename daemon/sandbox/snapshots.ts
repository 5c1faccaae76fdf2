/**
 * Snapshots, restores, forks and commits: what packs a sandbox's state into something
 * new sandboxes start from. A container's snapshot is its writable layer packed
 * unstripped as a layer (kind `filesystem`); a microVM's is its whole machine (kind `vm`,
 * daemon/drivers/microvm/). A restore or fork runs the create steps from allocate on
 * (./create.ts) for each new sandbox; a commit packs the writable layer stripped as a new
 * image.
 */
import { randomBytes } from 'node:crypto';
import { mkdir, rm } from 'node:fs/promises';
import path from 'node:path';
import { SYSTEM_SCOPE, SYSTEM_TENANT, type Scope } from '../model/tenant.js';
import type { Logger } from 'pino';
import { taggedId } from '../model/ids.js';
import { DsecError, failedPrecondition, invalidArgument, unimplemented, wrap } from '../errors.js';
import type { DaemonConfig } from '../config.js';
import { probeCriu } from '../host/criu.js';
import { normaliseExclude, packWritableLayer } from '../image/commit.js';
import { MAX_LAYERS, ownTenant, parseRef, type ImageManifest, type LayerMeta, type LayerStore } from '../image/layer-store.js';
import type { ImageSecurity } from '../model/image.js';
import type { SandboxRepo } from '../db/sandboxes.js';
import type { SnapshotRepo } from '../db/snapshots.js';
import type { SandboxDriver } from '../drivers/types.js';
import type { SandboxInput, SandboxRecord } from '../model/sandbox.js';
import type { ForkInput, MachineRestore, RestoreInput, SnapshotInput, SnapshotRecord } from '../model/snapshot.js';
import type { Admission } from './admission.js';
import type { Backends } from './backends.js';
import type { CreateProgressSink } from './progress.js';
import type { SandboxCreator } from './create.js';
import type { Failpoints } from './failpoints.js';
import type { LayerLeases } from './layer-leases.js';
import type { SandboxLifecycle } from './lifecycle.js';
import type { SandboxLocks } from './locks.js';
import type { SpecResolver } from './resolve.js';

/** Label naming the fork (or restore) call that created a sandbox: `fork-<16 hex>`; one value per call. */
export const FORK_LABEL = 'dsec.fork';

/** Chunk size of snapshot layers: 4 KiB, the page size, so any hole of a sparse file costs nothing in the blob. */
const SNAPSHOT_CHUNK_BYTES = 4096;

/** Sandboxes a fork creates at once: 4, enough to overlap runc's work on 2 cores without queueing the event loop behind mounts. */
const FORK_CONCURRENCY = 4;

/** What the snapshot service reads and acts through. */
export interface SnapshotDeps {
  /** The state root (machine snapshot files) and `[images] commit_exclude`. */
  config: Pick<DaemonConfig, 'root' | 'images'>;
  repo: Pick<SandboxRepo, 'get' | 'event'>;
  snapshots: SnapshotRepo;
  images: LayerStore;
  backends: Backends;
  locks: SandboxLocks;
  failpoints: Failpoints;
  leases: LayerLeases;
  admission: Admission;
  resolver: SpecResolver;
  creator: Pick<SandboxCreator, 'build'>;
  /** Destroys the sandboxes of a fork that failed. */
  lifecycle: Pick<SandboxLifecycle, 'destroy'>;
  /** In a fleet, the host's id tag (6 hex) that begins new snapshot ids (daemon/model/ids.ts); else absent. */
  idTag?: string;
  log: Logger;
}

/** Snapshots, restores, forks and commits. */
export class SnapshotService {
  constructor(private readonly d: SnapshotDeps) {}

  /** Directory of a machine snapshot's files: `<root>/snapshots/<id>`. */
  dir(id: string): string {
    return path.join(this.d.config.root, 'snapshots', id);
  }

  /**
   * Packs the sandbox's writable layer as a new layer on top of its image and stores
   * the result as image `ref` (see daemon/image/commit.ts for what is stripped). The
   * sandbox is frozen while its layer is copied and keeps running afterwards. The new
   * image keeps the config the sandbox was created from; `security` (optional) changes
   * its security defaults field by field. The sandbox's create env is a runtime secret
   * and is not written into the manifest (a warning names the variables left out).
   * @param tenant whose image name `ref` becomes (the caller's tenant; default `system`):
   *   it replaces only that tenant's image of the name (layer-store.ts).
   * @returns the new manifest, the new layer and the stripped paths.
   * @throws DsecError NotFound, InvalidArgument (bad ref), FailedPrecondition (no writable layer).
   */
  async commit(id: string, ref: string, exclude: string[] = [], security?: ImageSecurity, tenant: string = SYSTEM_TENANT): Promise<{ image: ImageManifest; layer: LayerMeta; stripped: string[]; warnings: string[] }> {
    const { name, tag } = parseRef(ref);
    for (const g of exclude) normaliseExclude(g); // refuse bad patterns before freezing anything
    return this.d.locks.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (sb.uidBase === null || sb.uidCount === null) throw failedPrecondition(`sandbox ${id} has no uid range`);
      const packed = await packWritableLayer(this.d.images, (fn) => this.d.backends.driver(sb.backend).withWritableLayer(sb, fn), {
        uidBase: sb.uidBase, uidCount: sb.uidCount, strip: true, exclude: [...this.d.config.images.commitExclude, ...exclude], source: `commit:${id}`,
      });
      const layer = packed.layer;
      const image: ImageManifest = {
        name, tag, layers: [...sb.imageLayers, layer.digest],
        config: { ...sb.imageConfig, ...(security ? { security: { ...(sb.imageConfig.security ?? {}), ...security } } : {}) },
        created_ms: Date.now(), ...ownTenant(tenant),
      };
      await this.d.images.putManifest(image);
      this.d.repo.event('sandbox.committed', sb, `${name}:${tag} ${layer.digest}`);
      const { sizeBytes: _s, ...meta } = layer;
      const warnings = packed.unmatched.map((g) => `exclude pattern ${JSON.stringify(g)} matched nothing`);
      const envNames = Object.keys(sb.env).sort();
      if (envNames.length) warnings.push(`the sandbox's create env (${envNames.join(', ')}) is not part of the image: it is a runtime secret; pass it again when creating sandboxes from ${name}:${tag}`);
      return { image, layer: meta, stripped: packed.stripped, warnings };
    });
  }

  /**
   * Takes a snapshot. A tier whose snapshots capture the writable layer (capability
   * `snapshot: "filesystem"`) packs it, unstripped, as a layer in the image store
   * (ownership shifted to image uids like a commit), recorded with what a restore needs;
   * a running sandbox is frozen while its layer is copied and keeps running. A tier with
   * machine snapshots captures the whole machine instead ({@link snapshotMachine}).
   * @param input.process containers: also checkpoint processes, answered Unimplemented with
   *   the reason; microVMs: ignored (a machine snapshot always has its processes).
   * @throws DsecError NotFound, AlreadyExists (name taken), FailedPrecondition (no
   *   writable layer; not running, paused or stopped), Unimplemented (process
   *   checkpoints, a tier without snapshots), Internal (copy or mkfs failed).
   */
  async snapshot(id: string, input: SnapshotInput): Promise<SnapshotRecord> {
    const sb0 = this.d.repo.get(id);
    const drv = this.d.backends.driver(sb0.backend);
    const kind = drv.capabilities(sb0.backend).snapshot;
    if (kind === 'machine' && drv.snapshotMachine) return this.snapshotMachine(id, input, drv);
    if (kind !== 'filesystem') throw unimplemented(`snapshots of ${sb0.backend} sandboxes are not built yet`);
    if (input.process) {
      const criu = await probeCriu();
      throw unimplemented(criu.available
        ? 'process checkpoints of container sandboxes are not supported by this dsecd yet (criu check passes on this host); take a filesystem snapshot (omit process)'
        : `process checkpoints need CRIU, and ${criu.reason}; take a filesystem snapshot (omit process) instead`);
    }
    const name = input.name ?? null;
    this.d.snapshots.assertNameFree(sb0.tenant, name);
    return this.d.locks.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (!['running', 'paused', 'stopped', 'failed'].includes(sb.state) || sb.desired !== null) {
        throw failedPrecondition(`sandbox ${id} is ${sb.desired ? `becoming ${sb.desired}` : sb.state}; snapshot it when it is running, paused or stopped`);
      }
      if (sb.uidBase === null || sb.uidCount === null) throw failedPrecondition(`sandbox ${id} has no uid range`);
      if (sb.imageLayers.length + 1 > MAX_LAYERS) {
        throw failedPrecondition(`sandbox ${id} already has ${sb.imageLayers.length} layers (snapshots of restored sandboxes stack up); a snapshot would exceed ${MAX_LAYERS}`);
      }
      // Real mtimes (a fork must see what the source saw) and 4 KiB chunks (sparse files keep their holes).
      const { layer } = await packWritableLayer(this.d.images, (fn) => drv.withWritableLayer(sb, fn), {
        uidBase: sb.uidBase, uidCount: sb.uidCount, strip: false, exclude: [], source: `snapshot:${id}`,
        build: { keepMtimes: true, chunkBytes: SNAPSHOT_CHUNK_BYTES },
      });
      this.d.failpoints.hit('snapshot.after-layer');
      const snap = this.d.snapshots.insert({
        id: `snap-${taggedId(this.d.idTag)}`, tenant: sb.tenant, name, kind: 'filesystem', sandboxId: id, backend: sb.backend, image: sb.image,
        imageLayers: [...sb.imageLayers, layer.digest], imageConfig: sb.imageConfig, layer: layer.digest, sizeBytes: layer.sizeBytes,
        cpus: sb.cpus, memoryBytes: sb.memoryBytes, pids: sb.pids, priority: sb.priority, labels: sb.labels, env: sb.env, createdAt: Date.now(),
        network: sb.network, diskBytes: sb.diskBytes, filesystem: sb.filesystem, machine: null,
      });
      await this.d.leases.sync();
      this.d.repo.event('sandbox.snapshotted', sb, `${snap.id}${name ? ` (${name})` : ''} ${layer.digest}`);
      return snap;
    });
  }

  /**
   * Takes a machine snapshot (kind vm) of a running or paused microVM: the driver captures
   * RAM, CPU and device state and the writable disk into {@link dir}; the row is written
   * after the files, so a crash in between leaves only a directory, which reconcile
   * removes. The source keeps the run state it had.
   * @throws DsecError NotFound, AlreadyExists (name taken), FailedPrecondition (not
   *   running or paused), DeadlineExceeded / Unavailable (QMP), Internal (the capture failed).
   */
  private async snapshotMachine(id: string, input: SnapshotInput, drv: SandboxDriver): Promise<SnapshotRecord> {
    const name = input.name ?? null;
    this.d.snapshots.assertNameFree(this.d.repo.get(id).tenant, name);
    return this.d.locks.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (!['running', 'paused'].includes(sb.state) || sb.desired !== null) {
        throw failedPrecondition(`sandbox ${id} is ${sb.desired ? `becoming ${sb.desired}` : sb.state}; a ${sb.backend} snapshot captures the running machine: snapshot it when it is running or paused`);
      }
      const snapId = `snap-${taggedId(this.d.idTag)}`;
      const dir = this.dir(snapId);
      await mkdir(dir, { recursive: true, mode: 0o700 });
      try {
        const machine = await drv.snapshotMachine!(sb, dir);
        this.d.failpoints.hit('snapshot.after-layer');
        const snap = this.d.snapshots.insert({
          id: snapId, tenant: sb.tenant, name, kind: 'vm', sandboxId: id, backend: sb.backend, image: sb.image,
          imageLayers: sb.imageLayers, imageConfig: sb.imageConfig, layer: `sha256:${machine.stateSha256}`,
          sizeBytes: machine.stateBytes + machine.diskAllocatedBytes,
          cpus: sb.cpus, memoryBytes: sb.memoryBytes, pids: sb.pids, priority: sb.priority, labels: sb.labels, env: sb.env, createdAt: Date.now(),
          network: sb.network, diskBytes: sb.diskBytes, filesystem: sb.filesystem, machine,
        });
        await this.d.leases.sync();
        this.d.repo.event('sandbox.snapshotted', sb, `${snap.id}${name ? ` (${name})` : ''} machine: ${machine.stateBytes} bytes of state, vCPUs stopped ${machine.pausedMs} ms`);
        return snap;
      } catch (e) {
        await rm(dir, { recursive: true, force: true });
        throw e instanceof DsecError ? e : wrap(e, `snapshot sandbox ${id}`);
      }
    });
  }

  /**
   * The snapshot `ref` (id, or a name of `scope`'s tenant) as `scope` sees it.
   * @throws DsecError NotFound, also for another tenant's snapshot.
   */
  get(ref: string, scope: Scope = SYSTEM_SCOPE): SnapshotRecord {
    return this.d.snapshots.get(ref, scope);
  }

  /** The snapshots `scope` sees on this host, oldest first. */
  list(scope: Scope = SYSTEM_SCOPE): SnapshotRecord[] {
    return this.d.snapshots.all(scope);
  }

  /**
   * Removes a snapshot. Sandboxes restored from it keep running: they hold their own
   * lease on its layer, which prune collects once nothing uses it.
   * @throws DsecError NotFound, also for another tenant's snapshot.
   */
  async remove(ref: string, scope: Scope = SYSTEM_SCOPE): Promise<SnapshotRecord> {
    const snap = this.d.snapshots.get(ref, scope);
    this.d.snapshots.remove(snap.id);
    // A machine snapshot's files; restores made from it have their own disk copies.
    await rm(this.dir(snap.id), { recursive: true, force: true });
    await this.d.leases.sync();
    this.d.repo.event('snapshot.removed', null, `${snap.id}${snap.name ? ` (${snap.name})` : ''}`, snap.tenant);
    return snap;
  }

  /**
   * Checks a snapshot can be restored before anything is created: its layer blobs must
   * be present and hash to their digests; a machine snapshot's files and platform must
   * be here.
   * @throws DsecError NotFound (snapshot or a layer missing), FailedPrecondition (corrupt
   *   layer or machine state, a tier that cannot restore machines), Unimplemented.
   */
  private async checkSnapshot(ref: string, scope: Scope): Promise<SnapshotRecord> {
    const snap = this.d.snapshots.get(ref, scope);
    const drv = this.d.backends.driver(snap.backend);
    const what = `snapshot ${snap.id}${snap.name ? ` (${snap.name})` : ''} cannot be restored`;
    for (const digest of snap.imageLayers) {
      try {
        await this.d.images.prepareForMount(digest);
      } catch (e) {
        const err = e instanceof DsecError ? e : wrap(e, 'layer check');
        throw new DsecError(err.kind, `${what}: ${err.message}`, { cause: e });
      }
    }
    if (snap.kind === 'vm') {
      if (!snap.machine || !drv.checkMachine) throw failedPrecondition(`${what}: it is a machine snapshot and the ${snap.backend} backend of this dsecd cannot restore machines`);
      try {
        await drv.checkMachine(this.machineRestore(snap));
      } catch (e) {
        const err = e instanceof DsecError ? e : wrap(e, 'machine check');
        throw new DsecError(err.kind, `${what}: ${err.message}`, { cause: e });
      }
    }
    return snap;
  }

  /** Where a restore of the machine snapshot `snap` reads from. */
  private machineRestore(snap: SnapshotRecord): MachineRestore {
    return { snapshotId: snap.id, dir: this.dir(snap.id), machine: snap.machine! };
  }

  /**
   * The create a restore of `snap` with overrides `req` amounts to: every field the
   * request names, else the source's (env merged over the source's; filesystem options
   * field by field over the source's resolved ones). `diskBytes` is only the request's:
   * the source's quota is the resolver's inherited default.
   */
  private restoreInput(snap: SnapshotRecord, req: RestoreInput, tenant: string): SandboxInput {
    const fs = req.filesystem ?? snap.filesystem;
    return {
      tenant, backend: snap.backend, image: snap.image, cpus: req.cpus ?? snap.cpus, memoryBytes: req.memoryBytes ?? snap.memoryBytes, pids: req.pids ?? snap.pids,
      labels: req.labels ?? snap.labels, env: { ...snap.env, ...(req.env ?? {}) }, priority: req.priority ?? snap.priority,
      ttlS: req.ttlS, idleTimeoutS: req.idleTimeoutS, seccomp: req.seccomp, network: req.network ?? snap.network ?? undefined,
      diskBytes: req.diskBytes,
      filesystem: fs ? { ...(snap.filesystem ?? {}), ...(req.filesystem ?? {}) } : undefined,
    };
  }

  /**
   * Creates a new running sandbox from a snapshot: the snapshot layer is mounted as the
   * top lower layer (shared, read-only) under a fresh writable layer, so the sandbox
   * starts with exactly the files the source had. A machine snapshot (kind vm) is resumed
   * instead in a new VM on its own copy of the disk, its processes where they were. The
   * source is never touched. `opts.onProgress` hears its phases, as a create's.
   * @param ref snapshot id or name.
   * @param opts.scope who restores: the snapshot must be visible to it (NotFound otherwise,
   *   as a missing one), and the new sandbox belongs to its tenant. Default: the system admin.
   * @throws DsecError NotFound, FailedPrecondition (corrupt layer or machine state, a
   *   state QEMU cannot load, another QEMU release), ResourceExhausted (admission, uid
   *   pool), InvalidArgument (limits above the host's; memory or vCPUs other than a
   *   machine snapshot's), Internal.
   */
  async restore(ref: string, req: RestoreInput = {}, opts: { onProgress?: CreateProgressSink; scope?: Scope } = {}): Promise<SandboxRecord> {
    return (await this.fork(ref, { ...req, count: 1 }, opts))[0];
  }

  /**
   * Creates `req.count` independent sandboxes from one snapshot ({@link restore} each),
   * at most {@link FORK_CONCURRENCY} at a time. All or nothing: when one fails, the
   * others are destroyed and the first error is thrown. `opts.onProgress` hears the
   * phases of every sandbox of the group (each report names its sandbox).
   * @throws as {@link restore}.
   */
  async fork(ref: string, req: ForkInput, opts: { onProgress?: CreateProgressSink; scope?: Scope } = {}): Promise<SandboxRecord[]> {
    const scope = opts.scope ?? SYSTEM_SCOPE;
    const snap = await this.checkSnapshot(ref, scope);
    const input = this.restoreInput(snap, req, scope.tenant);
    const network = await this.d.resolver.network(input.network, input.backend);
    this.d.admission.checkLimits(input);
    const resources = this.d.resolver.resources(input, snap.diskBytes);
    if (snap.kind === 'vm') {
      // The machine's RAM and vCPUs are in its state: a restore cannot resize them.
      const m = snap.machine!;
      if (Math.ceil(resources.memoryBytes / 2 ** 20) !== m.memoryMiB) {
        throw invalidArgument(`snapshot ${snap.id} holds a machine with ${m.memoryMiB} MiB of RAM, which a restore cannot change; leave memory_bytes out (or ask for ${snap.memoryBytes})`);
      }
      if (Math.max(1, Math.ceil(resources.cpus)) !== m.vcpus) {
        throw invalidArgument(`snapshot ${snap.id} holds a machine with ${m.vcpus} vCPU(s), which a restore cannot change; leave cpus out or ask for more than ${m.vcpus - 1} and at most ${m.vcpus}`);
      }
      if (req.diskBytes !== undefined && req.diskBytes !== snap.diskBytes) {
        throw invalidArgument(`snapshot ${snap.id} holds the machine's disk of ${m.diskBytes} bytes, which a restore cannot resize; leave disk_bytes out`);
      }
    }
    const caps = this.d.backends.caps(input.backend);
    // The whole group first (its refusal names the room left), then one reservation per
    // sandbox, each released once that sandbox's row is in the store (or it failed), so
    // concurrent creates and forks see the group's sandboxes before they exist.
    this.d.admission.admit(resources, caps, req.count, scope.tenant);
    const releases = Array.from({ length: req.count }, () => this.d.admission.reserve(resources, caps, 1, scope.tenant));
    const source = { image: snap.image, layers: snap.imageLayers, config: snap.imageConfig };
    const restore = snap.kind === 'vm' ? this.machineRestore(snap) : undefined;
    // Intent first: if dsecd dies mid-fork, reconcile destroys whatever this fork created.
    const forkId = `fork-${randomBytes(8).toString('hex')}`;
    const spec = this.d.resolver.spec({ ...input, labels: { ...input.labels, [FORK_LABEL]: forkId } }, resources, source, network, snap.id);
    this.d.snapshots.addForkIntent(forkId, snap.id, req.count);
    const made: SandboxRecord[] = new Array(req.count);
    let next = 0;
    let failure: unknown = null;
    const worker = async () => {
      while (next < req.count && failure === null) {
        const i = next++;
        try {
          made[i] = await this.d.creator.build(spec, { restore, onProgress: opts.onProgress, onAllocated: releases[i] });
          this.d.failpoints.hit('fork.after-create');
        } catch (e) {
          failure ??= e;
        }
      }
    };
    try {
      await Promise.all(Array.from({ length: Math.min(FORK_CONCURRENCY, req.count) }, worker));
    } finally {
      // A sandbox whose create failed before its row, or that never started (a failure
      // stopped the workers), holds nothing from here on; the release is idempotent.
      for (const r of releases) r();
    }
    if (failure !== null) {
      for (const sb of made) if (sb) await this.d.lifecycle.destroy(sb.id, true, `fork of ${snap.id} failed`).catch((e) => this.d.log.error({ err: e, id: sb.id }, 'cleanup after failed fork failed'));
      this.d.snapshots.removeForkIntent(forkId);
      throw failure instanceof DsecError ? failure : wrap(failure, `fork ${snap.id}`);
    }
    this.d.snapshots.removeForkIntent(forkId);
    if (req.count > 1) this.d.repo.event('snapshot.forked', null, `${snap.id} -> ${made.map((s) => s.id).join(',')}`, scope.tenant);
    return made;
  }
}
