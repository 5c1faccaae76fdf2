/**
 * The create path, top to bottom as named steps (in the manner of Firecracker's
 * build_microvm_for_boot):
 *
 *   admit    refuse limits the host cannot honour or has no room for, with every
 *            resource default applied (./admission.ts, ./resolve.ts `resources`);
 *   resolve  the image to its layers, the network settled, the filesystem options
 *            resolved: the {@link SandboxSpec}, validated once (./resolve.ts);
 *            a warm-pool shell matching the spec is claimed here instead of the rest;
 *   allocate the intent: the row in `creating` with its uid range, and the layer leases;
 *   prepare  the root filesystem (layers, writable layer or disk), by the driver;
 *   start    the init, until its agent answers, by the driver;
 *   commit   state `running`: the acknowledgement (the API answers only after it).
 *
 * A step's failure is a {@link CreateStepError} naming the step, with the cause's kind,
 * reason and message (what the API answers) and the cause itself; a failure after
 * allocate destroys what was made and removes the row before it is thrown. Restores and
 * forks (./snapshots.ts) and warm-pool shells run the same steps from allocate on.
 */
import type { Logger } from 'pino';
import { taggedId } from '../model/ids.js';
import { DsecError, failedPrecondition, wrap } from '../errors.js';
import { procStartTime } from '../host/proc.js';
import type { SandboxNetworking } from '../net/network.js';
import { profileSha256 } from '../security/seccomp.js';
import type { BackendCapabilities, InitInfo, SandboxDriver } from '../drivers/types.js';
import type { SandboxRepo } from '../db/sandboxes.js';
import type { Resources } from '../model/resources.js';
import type { SandboxInput, SandboxRecord, SandboxSpec } from '../model/sandbox.js';
import type { MachineRestore } from '../model/snapshot.js';
import type { Failpoints } from './failpoints.js';
import type { Admission } from './admission.js';
import type { Backends } from './backends.js';
import type { DiskQuotaWatch } from './disk-quota.js';
import type { LayerLeases } from './layer-leases.js';
import { noteRefusal, type SandboxLifecycle } from './lifecycle.js';
import type { LivenessWatch } from './liveness.js';
import type { SandboxLocks } from './locks.js';
import { createObserver, phaseMessage, type CreateProgressSink } from './progress.js';
import type { SpecResolver } from './resolve.js';
import { POOL_LABEL, isPoolShell, shellKey, type WarmPoolEntry, type WarmPools } from './warm-pool.js';

/** The named steps of a create, in order (see the module comment). */
export type CreateStep = 'admit' | 'resolve' | 'allocate' | 'prepare' | 'start' | 'commit';

/**
 * A create that failed at `step`. Kind, reason and message are the cause's when it is a
 * DsecError (the API's answer is unchanged by the wrapping); anything else is Internal
 * with the step in its message. `cause` is the original error.
 */
export class CreateStepError extends DsecError {
  constructor(readonly step: CreateStep, e: unknown, what: string) {
    const d = e instanceof DsecError ? e : wrap(e, `${what}: ${step}`);
    super(d.kind, d.message, { cause: e, reason: d.reason });
  }
}

/** Runs `fn` as create step `step`, turning its failure into a {@link CreateStepError}. */
async function step<T>(name: CreateStep, what: string, fn: () => T | Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (e) {
    throw e instanceof CreateStepError ? e : new CreateStepError(name, e, what);
  }
}

/** Options of one build (the steps from allocate on). */
interface BuildOptions {
  /** A machine snapshot to resume instead of a fresh boot (microvm restores and forks). */
  restore?: MachineRestore;
  /** A warm-pool shell: no `sandbox.created` event and no acknowledgement failpoint (the claim has them). */
  shell?: boolean;
  /** Hears the phases of the create (daemon/sandbox/progress.ts). */
  onProgress?: CreateProgressSink;
  /** Called once the sandbox's row is in the store (admission counts it from then on: {@link Admission.reserve}). */
  onAllocated?: () => void;
}

/** What the create path reads and acts through. */
export interface CreateDeps {
  repo: SandboxRepo;
  backends: Backends;
  locks: SandboxLocks;
  failpoints: Failpoints;
  admission: Admission;
  resolver: SpecResolver;
  leases: LayerLeases;
  liveness: LivenessWatch;
  /** Destroys what a failed claim or create left. */
  lifecycle: Pick<SandboxLifecycle, 'destroy'>;
  /**
   * The pool guard of the writable-layer store, run once a container's writable layer
   * exists and before its init starts, so that a layer made while the store is nearly
   * full starts at its share of the free space, not at its quota
   * (daemon/storage/pool.ts); absent: the reaper's sweep alone sets it.
   */
  disks?: Pick<DiskQuotaWatch, 'guard'>;
  /** Sandbox networking (a claimed shell's rules); absent: mode none only. */
  network?: Pick<SandboxNetworking, 'update'>;
  /** In a fleet, the host's id tag (6 hex) that begins new sandbox ids (daemon/model/ids.ts); else absent. */
  idTag?: string;
  log: Logger;
}

/** Creates sandboxes: user creates (possibly from the warm pool), fncall workers, pool shells, restores. */
export class SandboxCreator {
  /** The warm pools creates may claim from ({@link attachPool}); null: none. */
  private pool: WarmPools | null = null;
  /** User creates in flight (not pool fills): warm-pool refill waits while there are any. */
  private userCreates = 0;
  /** performance.now() when a user create last started or ended; -Infinity: never. */
  private lastUserCreate = -Infinity;

  constructor(private readonly d: CreateDeps) {}

  /** Lets creates claim shells of `pool` (built after the creator: its fills go through {@link createShell}). */
  attachPool(pool: WarmPools): void {
    this.pool = pool;
  }

  /** User creates in flight now (see {@link WarmPools}: refill is low priority). */
  get userCreatesInFlight(): number {
    return this.userCreates;
  }

  /** Ms since a user create last started or ended (Infinity when none has run): warm-pool refill waits for a quiet moment. */
  get msSinceUserCreate(): number {
    return performance.now() - this.lastUserCreate;
  }

  /**
   * Creates and starts a sandbox. The answer comes only after the running state is
   * committed, so an acknowledged sandbox always survives a daemon crash. `onProgress`
   * hears each phase of the create once, in order (daemon/sandbox/progress.ts); a
   * sandbox claimed from the warm pool reports `ready` alone.
   * @param opts.worker an fncall worker (daemon/fncall/pool.ts): never from the warm pool.
   * @throws CreateStepError (a DsecError) with the cause's kind: Unimplemented (no driver
   *   for the backend), InvalidArgument (limits above the host's, bad options),
   *   ResourceExhausted (admission, uid pool), NotFound (unknown image), FailedPrecondition,
   *   Internal (runtime failure; nothing is left behind).
   */
  async create(input: SandboxInput, opts: { worker?: boolean; onProgress?: CreateProgressSink } = {}): Promise<SandboxRecord> {
    const caps = this.d.backends.caps(input.backend);
    this.userCreates += 1;
    this.lastUserCreate = performance.now();
    // Admitted but not yet in the store: held in admission's totals until its row is written.
    let release = () => {};
    try {
      const what = 'create sandbox';
      const resources = await step('admit', what, () => {
        const r = this.admit(input, caps);
        release = r.release;
        return r.resources;
      });
      const spec = await step('resolve', what, () => this.resolve(input, resources));
      if (caps.pool && !opts.worker) {
        const claimed = await this.claimFromPool(spec);
        if (claimed) {
          opts.onProgress?.({ phase: 'ready', id: claimed.id, message: phaseMessage('ready', caps.isolation, false) });
          return claimed;
        }
      }
      return await this.build(spec, { onProgress: opts.onProgress, onAllocated: release });
    } finally {
      release();
      this.userCreates -= 1;
      this.lastUserCreate = performance.now();
    }
  }

  /** Step admit: limits the host can honour, every resource default applied, room on the host (reserved until released). */
  private admit(input: SandboxInput, caps: BackendCapabilities): { resources: Resources; release: () => void } {
    this.d.admission.checkLimits(input);
    const resources = this.d.resolver.resources(input);
    return { resources, release: this.d.admission.reserve(resources, caps, 1, input.tenant) };
  }

  /** Step resolve: the spec of `input` (image, network, filesystem). */
  private async resolve(input: SandboxInput, resources: Resources): Promise<SandboxSpec> {
    const source = await this.d.resolver.source(input.backend, input.image, input.tenant);
    const network = await this.d.resolver.network(input.network, input.backend);
    return this.d.resolver.spec(input, resources, source, network, null);
  }

  /**
   * Runs the steps from allocate on for `spec` (admission and resolution are the
   * caller's), reporting its phases to `opts.onProgress`.
   * @throws CreateStepError; after allocate, with everything made removed again.
   */
  async build(spec: SandboxSpec, opts: BuildOptions = {}): Promise<SandboxRecord> {
    const drv = this.d.backends.driver(spec.backend);
    const id = taggedId(this.d.idTag);
    const what = `create sandbox ${id}`;
    // The create's steps, reported as its phases when the caller asked for progress.
    const steps = opts.onProgress
      ? this.d.failpoints.observed(createObserver(id, drv.capabilities(spec.backend).isolation, !!opts.restore, opts.onProgress))
      : this.d.failpoints;
    const rec = await step('allocate', what, async () => {
      const r = this.d.repo.insertCreating({ ...spec, id, createdAt: Date.now() });
      opts.onAllocated?.();
      steps.hit('create.after-intent');
      await this.d.leases.add(r.imageLayers);
      return r;
    });
    return this.d.locks.run(id, async () => {
      let init: InitInfo;
      try {
        await step('prepare', what, () => drv.prepare(rec, steps, opts.restore));
        if (spec.backend === 'container') this.d.disks?.guard(id, spec.diskBytes);
        init = await step('start', what, () => drv.start(rec, steps, opts.restore));
      } catch (e) {
        await this.rollback(drv, rec, e as CreateStepError);
        throw e;
      }
      return step('commit', what, () => this.commit(rec, init, steps, !!opts.shell));
    });
  }

  /** After a failed prepare or start: destroys what was made, removes the row, records the failure. */
  private async rollback(drv: SandboxDriver, rec: SandboxRecord, e: CreateStepError): Promise<void> {
    const cause = e.cause;
    this.d.log.warn({ err: cause, id: rec.id, step: e.step }, 'create failed; cleaning up');
    await drv.destroy(rec, this.d.failpoints).catch((e2) => this.d.log.error({ err: e2, id: rec.id }, 'cleanup after failed create failed'));
    this.d.repo.remove(rec.id);
    noteRefusal(this.d.repo, cause, { ...rec, state: 'failed' });
    this.d.repo.event('sandbox.failed', { ...rec, state: 'failed' }, `create failed: ${(cause as Error).message}`);
  }

  /** Step commit: state running (the acknowledgement), the init watched, the event. */
  private commit(rec: SandboxRecord, init: InitInfo, steps: Failpoints, shell: boolean): SandboxRecord {
    const done = this.d.repo.transition(rec.id, 'running', { initPid: init.pid, initStart: init.start });
    this.d.liveness.watch(rec.id, init.pid, init.start);
    if (shell) return done;
    steps.hit('create.after-ack');
    this.d.repo.event('sandbox.created', done);
    return done;
  }

  /**
   * The key of the shell a create of `spec` would claim (warm-pool.ts shellKey), or null
   * when the spec names something a running shell cannot take on: a seccomp override (in
   * the runtime's filter) or the batch priority class (the agent's scheduling policy).
   * Everything else is applied at the claim.
   */
  private poolKey(spec: SandboxSpec): string | null {
    if (spec.seccomp || spec.priority !== 'latency') return null;
    return shellKey({
      image: spec.image, layers: spec.imageLayers, config: spec.imageConfig, seccompSha: profileSha256(),
      filesystem: spec.filesystem, network: spec.network?.mode ?? 'none', diskBytes: spec.diskBytes,
    });
  }

  /**
   * Answers a create from the warm pool: takes a matching ready shell and claims it
   * ({@link claim}); a shell that cannot be claimed (its init died, a limit cannot be
   * written) is destroyed and the next one tried. Null when no shell matches.
   */
  private async claimFromPool(spec: SandboxSpec): Promise<SandboxRecord | null> {
    if (!this.pool?.enabled) return null;
    const key = this.poolKey(spec);
    if (key === null) return null;
    for (;;) {
      const shell = this.pool.take(key, spec.image, spec.network?.mode ?? 'none');
      if (!shell) return null;
      try {
        return await this.claim(shell.id, spec);
      } catch (e) {
        this.d.log.warn({ err: e, id: shell.id }, 'a warm-pool shell could not be claimed; destroying it');
        await this.d.lifecycle.destroy(shell.id, true, 'warm-pool shell could not be claimed').catch((e2) => this.d.log.error({ err: e2, id: shell.id }, 'destroying an unclaimable shell failed'));
      }
    }
  }

  /**
   * Makes shell `id` the sandbox `spec` describes: its limits written to its cgroup, its
   * network rules applied, then one row update with the spec's labels, env, TTL, idle
   * timeout, limits, network and a creation time of now (repo.claimShell). That update
   * acknowledges the create: a crash before it leaves a shell (destroyed at the next
   * start), after it a user sandbox (adopted).
   * @throws DsecError FailedPrecondition when the shell is no longer a live, unclaimed shell.
   */
  private async claim(id: string, spec: SandboxSpec): Promise<SandboxRecord> {
    return this.d.locks.run(id, async () => {
      const sb = this.d.repo.find(id);
      if (!sb || !isPoolShell(sb) || sb.state !== 'running' || sb.desired !== null || sb.initPid === null || procStartTime(sb.initPid) !== sb.initStart) {
        throw failedPrecondition(`warm-pool shell ${id} is gone or not running`);
      }
      const drv = this.d.backends.driver(sb.backend);
      if (spec.cpus !== sb.cpus || spec.memoryBytes !== sb.memoryBytes || spec.pids !== sb.pids) {
        await drv.update(sb, { limits: { cpus: spec.cpus, memoryBytes: spec.memoryBytes, pids: spec.pids } });
      }
      if (JSON.stringify(spec.io) !== JSON.stringify(sb.io)) await drv.update(sb, { io: spec.io });
      if (spec.network && this.d.network) await this.d.network.update(sb, spec.network);
      const done = this.d.repo.claimShell(id, {
        tenant: spec.tenant, labels: spec.labels, env: spec.env, ttlS: spec.ttlS, idleTimeoutS: spec.idleTimeoutS, cpus: spec.cpus, memoryBytes: spec.memoryBytes, pids: spec.pids,
        network: spec.network, io: spec.io, now: Date.now(),
      });
      this.d.failpoints.hit('create.after-ack');
      this.d.repo.event('sandbox.created', done, 'from the warm pool');
      return done;
    });
  }

  /**
   * The spec of a shell of `[[pool.entries]]` entry `entry`: a container create of the
   * entry's image and network mode with every other setting the default, as a user
   * create naming only those resolves (so the keys match).
   * @throws DsecError NotFound (image), FailedPrecondition (network mode unavailable).
   */
  private async shellSpec(entry: WarmPoolEntry, labels: Record<string, string>): Promise<SandboxSpec> {
    const input: SandboxInput = { backend: 'container', image: entry.image, labels, ...(entry.network === 'none' ? {} : { network: { mode: entry.network } }) };
    const resources = this.d.resolver.resources(input);
    return this.resolve(input, resources);
  }

  /**
   * The key and canonical image of the shells of a `[[pool.entries]]` entry, as
   * {@link poolKey} computes it for a create of that image with no other options.
   * @throws as {@link shellSpec}.
   */
  async shellKeyOf(entry: WarmPoolEntry): Promise<{ key: string; image: string }> {
    const spec = await this.shellSpec(entry, {});
    return { key: this.poolKey(spec)!, image: spec.image };
  }

  /**
   * Creates one warm-pool shell of `entry` with key `key` (its {@link POOL_LABEL} value):
   * the create steps from allocate on with the entry's spec, recorded without a
   * `sandbox.created` event (that comes at the claim). Shells are not admitted: `[pool]`
   * bounds them.
   * @throws as {@link build}.
   */
  async createShell(entry: WarmPoolEntry, key: string): Promise<SandboxRecord> {
    return this.build(await this.shellSpec(entry, { [POOL_LABEL]: key }), { shell: true });
  }
}
