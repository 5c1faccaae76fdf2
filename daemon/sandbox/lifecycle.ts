/**
 * The lifecycle of existing sandboxes: look them up, stop, start, destroy, change their
 * network, and report what is in force for them. Every change follows the three steps
 * that make it restart-safe (docs/ARCHITECTURE.md "The lifecycle"):
 *
 *   1. write the intent to the store (`desired = <target>`),
 *   2. act through the backend's driver,
 *   3. commit the new state.
 *
 * After a crash, reconcile (./reconcile.ts) finishes or undoes each half-done step.
 * Creation is ./create.ts; pause and resume are ./rounds.ts; snapshots ./snapshots.ts.
 */
import type { Logger } from 'pino';
import { DsecError, conflict, failedPrecondition, invalidArgument, wrap } from '../errors.js';
import type { DaemonConfig } from '../config.js';
import type { LayerStore } from '../image/layer-store.js';
import type { SandboxNetworking } from '../net/network.js';
import type { WritableLayerStore } from '../storage/writable-layers.js';
import { WRITABLE_PATH_REFUSED_REASON } from '../security/filesystem.js';
import type { SandboxStats } from '../drivers/types.js';
import type { SandboxRepo } from '../db/sandboxes.js';
import { resolveFilesystem, type ResolvedFilesystem } from '../model/filesystem.js';
import { networkRevision, type NetworkSpec } from '../model/network.js';
import type { DefenceStatus, SandboxRecord } from '../model/sandbox.js';
import { parseSelector } from '../model/selector.js';
import { SYSTEM_SCOPE, inScope, visible, type Scope } from '../model/tenant.js';
import type { StepObserver } from '../model/steps.js';
import type { Backends } from './backends.js';
import type { ExecRegistry } from './exec-sessions.js';
import type { LayerLeases } from './layer-leases.js';
import type { LivenessWatch } from './liveness.js';
import type { SandboxLocks } from './locks.js';
import type { SpecResolver } from './resolve.js';
import { isPoolShell } from './warm-pool.js';

/** Default grace between SIGTERM and SIGKILL on stop: 10 s, Docker's `docker stop` default. */
export const DEFAULT_STOP_GRACE_MS = 10_000;

/**
 * Records a `sandbox.writable_path_refused` event (message: the error's) when `e` is a
 * create or start refused because a writable path resolves through a symlink to where
 * it must not lead (daemon/security/filesystem.ts, reason `writable_path_refused`), so
 * a watcher of events sees the attempt apart from other failures. Anything else: nothing.
 */
export function noteRefusal(repo: Pick<SandboxRepo, 'event'>, e: unknown, sb: SandboxRecord): void {
  if (e instanceof DsecError && e.reason === WRITABLE_PATH_REFUSED_REASON) repo.event('sandbox.writable_path_refused', sb, e.message);
}

/** What the lifecycle reads and acts through. */
export interface LifecycleDeps {
  /** `[filesystem]` (options of rows older than them). */
  config: Pick<DaemonConfig, 'filesystem'>;
  repo: SandboxRepo;
  backends: Backends;
  locks: SandboxLocks;
  /** The failpoints: told every step of stop, start and destroy. */
  steps: StepObserver;
  liveness: LivenessWatch;
  leases: LayerLeases;
  /** Exec sessions, dropped with their sandbox. */
  execs: Pick<ExecRegistry, 'dropSandbox'>;
  resolver: Pick<SpecResolver, 'network'>;
  /** Sandbox networking (network changes of a running sandbox); absent: mode none only. */
  network?: Pick<SandboxNetworking, 'update'>;
  /** The image store's builder identity, reported in defences. */
  images: Pick<LayerStore, 'builder'>;
  /** The writable-layer store's view of one sandbox's quota, reported in defences. */
  storage: Pick<WritableLayerStore, 'sandboxStatus'>;
  log: Logger;
}

/** Stop, start, destroy and inspection of existing sandboxes. */
export class SandboxLifecycle {
  constructor(private readonly d: LifecycleDeps) {}

  /**
   * The sandbox `id` as `scope` sees it.
   * @throws DsecError NotFound, with the same message for another tenant's sandbox as for a missing one.
   */
  get(id: string, scope: Scope = SYSTEM_SCOPE): SandboxRecord {
    return inScope(scope, this.d.repo.find(id), `sandbox ${id} not found`);
  }

  /**
   * Sandboxes `scope` sees matching the selector (and state, when given), oldest first:
   * a selector only ever matches the caller's tenant (every tenant's for an admin
   * scope). Warm-pool shells are no one's sandboxes yet and are never listed.
   * @throws DsecError InvalidArgument for a malformed selector.
   */
  list(selector?: string, state?: string, scope: Scope = SYSTEM_SCOPE): SandboxRecord[] {
    let match: (l: Record<string, string>) => boolean;
    try {
      match = parseSelector(selector);
    } catch (e) {
      throw invalidArgument((e as Error).message);
    }
    return this.d.repo.all().filter((s) => visible(scope, s.tenant) && !isPoolShell(s) && match(s.labels) && (!state || s.state === state));
  }

  /**
   * Stops every process of the sandbox; the writable layer stays. Processes get SIGTERM
   * and `graceMs` (default {@link DEFAULT_STOP_GRACE_MS}) to exit, then SIGKILL.
   * @throws DsecError NotFound, FailedPrecondition (not running/paused/failed).
   */
  async stop(id: string, graceMs = DEFAULT_STOP_GRACE_MS): Promise<SandboxRecord> {
    return this.d.locks.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (sb.state === 'stopped') return sb;
      if (!['running', 'paused', 'failed'].includes(sb.state)) throw failedPrecondition(`sandbox ${id} is ${sb.state}; cannot stop it`);
      this.d.repo.setDesired(id, 'stopped');
      this.d.steps.hit('stop.after-intent');
      await this.d.backends.driver(sb.backend).stop(sb, this.d.steps, { graceMs: sb.state === 'running' ? graceMs : 0 });
      const done = this.d.repo.transition(id, 'stopped', { initPid: null, initStart: null });
      this.d.repo.event('sandbox.stopped', done);
      return done;
    });
  }

  /**
   * Starts a stopped (or failed) sandbox on its kept writable layer. A start that fails
   * leaves the sandbox `failed` with the reason.
   * @throws DsecError NotFound, FailedPrecondition (creating, paused; or what the driver refused).
   */
  async start(id: string): Promise<SandboxRecord> {
    return this.d.locks.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (sb.state === 'running') return sb;
      if (sb.state !== 'stopped' && sb.state !== 'failed') throw failedPrecondition(`sandbox ${id} is ${sb.state}; cannot start it`);
      const drv = this.d.backends.driver(sb.backend);
      this.d.repo.setDesired(id, 'running');
      this.d.steps.hit('start.after-intent');
      let init;
      try {
        if (sb.state === 'failed') await drv.stop(sb, this.d.steps);
        init = await drv.start(sb, this.d.steps);
      } catch (e) {
        await drv.stop(sb, this.d.steps).catch(() => {});
        const failed = this.d.repo.transition(id, 'failed', { initPid: null, initStart: null, error: `start failed: ${(e as Error).message}` });
        noteRefusal(this.d.repo, e, failed);
        this.d.repo.event('sandbox.failed', failed, failed.error ?? undefined);
        throw e instanceof DsecError ? e : wrap(e, `start sandbox ${id}`);
      }
      const done = this.d.repo.transition(id, 'running', { initPid: init.pid, initStart: init.start, error: null });
      this.d.liveness.watch(id, init.pid, init.start);
      this.d.repo.event('sandbox.started', done);
      return done;
    });
  }

  /**
   * Destroys a sandbox and everything it has on the host.
   * @param force when false, a running or paused sandbox is refused.
   * @param reason recorded in the destroyed event (e.g. "ttl expired").
   * @returns the last record, with state `destroyed`.
   * @throws DsecError NotFound, FailedPrecondition (running without force).
   */
  async destroy(id: string, force: boolean, reason?: string): Promise<SandboxRecord> {
    return this.d.locks.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (!force && (sb.state === 'running' || sb.state === 'paused')) {
        throw failedPrecondition(`sandbox ${id} is ${sb.state}; stop it first or destroy with force`);
      }
      this.d.repo.setDesired(id, 'destroyed');
      this.d.steps.hit('destroy.after-intent');
      await this.d.backends.driver(sb.backend).destroy(sb, this.d.steps);
      await this.d.execs.dropSandbox(id);
      this.d.repo.remove(id);
      await this.d.leases.sync();
      const gone: SandboxRecord = { ...sb, state: 'destroyed', desired: null, initPid: null, updatedAt: Date.now() };
      this.d.repo.event('sandbox.destroyed', gone, reason);
      return gone;
    });
  }

  /**
   * Changes the network of a sandbox: stored at once, applied at once to a running or
   * paused one (allow <-> open, rules, policy), or at its next start. Between none and
   * allow/open the sandbox would need a different network namespace, so that is refused.
   * `opts.ifRevision`: change it only if the stored spec still has this revision
   * (model/network.ts networkRevision), checked under the sandbox's lock, so a
   * read-change-write of the rules cannot lose a change made in between.
   * @throws DsecError NotFound, InvalidArgument (bad rules), FailedPrecondition (none <-> other),
   *   Conflict (the stored spec's revision is not `opts.ifRevision`).
   */
  async setNetwork(id: string, spec: NetworkSpec, opts: { ifRevision?: string } = {}): Promise<SandboxRecord> {
    return this.d.locks.run(id, async () => {
      const sb = this.d.repo.get(id);
      if (opts.ifRevision !== undefined) {
        const now = networkRevision(sb.network);
        if (now !== opts.ifRevision) throw conflict(`the network of sandbox ${id} changed since it was read (revision ${opts.ifRevision}, now ${now}): read it again and reapply the change`);
      }
      const next = await this.d.resolver.network(spec, sb.backend);
      const from = sb.network?.mode ?? 'none', to = next?.mode ?? 'none';
      if ((from === 'none') !== (to === 'none')) {
        throw failedPrecondition(`sandbox ${id} has network mode ${from}; it cannot become ${to} while it exists (${from === 'none' ? 'it has no veth or egress programs' : 'its network namespace keeps its veth'}). `
          + `Create a new sandbox with --network ${to}, or snapshot this one and restore it with network mode ${to}`);
      }
      const done = this.d.repo.setNetwork(id, next);
      if ((sb.state === 'running' || sb.state === 'paused') && next && this.d.network) {
        try {
          await this.d.network.update(done, next);
        } catch (e) {
          this.d.repo.setNetwork(id, sb.network);
          throw e instanceof DsecError ? e : wrap(e, `apply network of sandbox ${id}`);
        }
      }
      this.d.repo.event('network.updated', done, `mode=${to}${next?.policy ? ` policy=${next.policy}` : ''} allow=${next?.allow?.length ?? 0} deny=${next?.deny?.length ?? 0}`);
      return done;
    });
  }

  /**
   * The filesystem options in force for sandbox `id`: as resolved and stored at create,
   * and for a sandbox created before they were stored, resolved now over its image and
   * the config (as its driver does at start).
   * @throws DsecError NotFound.
   */
  filesystemOf(id: string): ResolvedFilesystem {
    const sb = this.d.repo.get(id);
    return resolveFilesystem(sb.filesystem, sb.imageConfig.security, this.d.config.filesystem);
  }

  /**
   * The per-sandbox defences in force for `sb` now (GET /v1/sandboxes/{id} `defences`): as
   * its backend reports them (`readonly_paths`, `landlock`, ...), plus `disk_quota`
   * (whether its writable layer has a quota the kernel enforces) and `builder_identity`
   * (whether its commits and snapshots are copied and packed as the builder, whose ids
   * are disjoint from the sandbox's own range).
   */
  async defences(sb: SandboxRecord): Promise<Record<string, DefenceStatus>> {
    const b = this.d.images.builder;
    const builder_identity: DefenceStatus = b
      ? { enforced: true, detail: `commits and snapshots of this sandbox are copied, stripped and packed as the builder (host ids ${b.range.base}-${b.range.base + b.range.size - 1}), never as root and never as this sandbox's range (${sb.uidBase ?? '?'}-${sb.uidBase === null || sb.uidCount === null ? '?' : sb.uidBase + sb.uidCount - 1})` }
      : { enforced: false, detail: '[builder] enabled = false: commits and snapshots are copied and packed as root' };
    return { ...((await this.d.backends.driver(sb.backend).defences?.(sb)) ?? {}), disk_quota: this.d.storage.sandboxStatus(sb.id, sb.diskBytes), builder_identity };
  }

  /** Resource usage of a sandbox (null when it is not running). @throws DsecError NotFound. */
  async stats(id: string): Promise<SandboxStats | null> {
    const sb = this.d.repo.get(id);
    return this.d.backends.driver(sb.backend).stats(sb);
  }

  /** Host path of the sandbox's agent log, or null. @throws DsecError NotFound. */
  logPath(id: string): string | null {
    const sb = this.d.repo.get(id);
    return this.d.backends.driver(sb.backend).logPath(sb);
  }
}
