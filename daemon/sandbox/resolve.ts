/**
 * Resolution of a create: the one place defaults are applied and names resolved. A
 * {@link SandboxInput} (what the caller asked) becomes a {@link SandboxSpec} (what the
 * store records and every later step reads) through three parts, each validating what it
 * decides:
 *
 *   - {@link SpecResolver.resources}: CPU, memory, pids from `[defaults]`, the
 *     writable-layer quota from the request, the source snapshot or `[defaults]` (at most
 *     the store's size), I/O settings where the tier has them;
 *   - {@link SpecResolver.source} and {@link SpecResolver.network}: the image reference to
 *     its layers and config (a backend's own reference first), the network settled
 *     against its policy and the tier's network modes;
 *   - {@link SpecResolver.spec}: the rest (labels, env, TTL, priority, seccomp) and the
 *     filesystem options, request > image > `[filesystem]`.
 */
import { SYSTEM_TENANT, tenantScope } from '../model/tenant.js';
import { failedPrecondition, invalidArgument } from '../errors.js';
import type { DaemonConfig } from '../config.js';
import type { LayerStore } from '../image/layer-store.js';
import type { SandboxNetworking } from '../net/network.js';
import type { WritableLayerStore } from '../storage/writable-layers.js';
import type { Backend } from '../model/backend.js';
import { resolveFilesystem } from '../model/filesystem.js';
import type { ImageSource } from '../model/image.js';
import type { NetworkSpec } from '../model/network.js';
import type { IoLimits, Resources } from '../model/resources.js';
import type { SandboxInput, SandboxSpec } from '../model/sandbox.js';
import type { Backends } from './backends.js';

/** What resolution reads. */
export interface ResolverDeps {
  /** `[defaults]` (resources) and `[filesystem]` (the filesystem options below the request and the image). */
  config: Pick<DaemonConfig, 'defaults' | 'filesystem'>;
  images: Pick<LayerStore, 'get'>;
  backends: Backends;
  /** Sandbox networking; absent: only mode none is accepted. */
  network?: Pick<SandboxNetworking, 'settle'>;
  /** The writable-layer store: whether it enforces quotas and how much it holds. */
  storage: Pick<WritableLayerStore, 'enforcesQuota' | 'capacityBytes' | 'status' | 'imagePath'>;
}

/** Turns create inputs into specs; see the module comment. */
export class SpecResolver {
  constructor(private readonly d: ResolverDeps) {}

  /**
   * The resources of a new sandbox of `input`, every default applied.
   * @param inheritedDiskBytes the writable-layer quota of the snapshot a restore is made
   *   from (used when `input.diskBytes` is absent); undefined for a fresh create.
   * @throws DsecError InvalidArgument (I/O settings for a tier without them; a quota the
   *   store cannot hold), FailedPrecondition (an explicit quota on a store without quotas),
   *   Unimplemented (no driver for the backend).
   */
  resources(input: SandboxInput, inheritedDiskBytes?: number | null): Resources {
    const def = this.d.config.defaults;
    const io = this.io(input);
    return {
      cpus: input.cpus ?? def.cpus,
      memoryBytes: input.memoryBytes ?? def.memoryBytes,
      pids: input.pids ?? def.pids,
      diskBytes: this.diskQuota(input.diskBytes, inheritedDiskBytes),
      io,
    };
  }

  /**
   * The I/O settings a sandbox of `input` gets: the request's, else `[defaults]`
   * io_weight and io_max; null for a tier without I/O settings. A given `ioMax` replaces
   * the default limits as a whole (its absent rates are unlimited).
   * @throws DsecError InvalidArgument when the request names I/O settings its tier lacks:
   *   only container sandboxes write to the writable-layer store's device (a microVM's or
   *   VM's disk is a file on the host filesystem, written by its VMM).
   */
  private io(input: SandboxInput): IoLimits | null {
    if (!this.d.backends.caps(input.backend).io) {
      if (input.ioWeight !== undefined || input.ioMax !== undefined) {
        throw invalidArgument(`io_weight and io_max apply to container sandboxes only (they act on the writable-layer store's device); backend ${input.backend} keeps its disk in a file on the host filesystem. Leave them out`);
      }
      return null;
    }
    const def = this.d.config.defaults.io;
    const m = input.ioMax;
    // Key order is part of the stored JSON a warm-pool claim compares: weight, then the rates.
    return {
      weight: input.ioWeight ?? def.weight,
      readBps: m ? m.readBps ?? null : def.readBps, writeBps: m ? m.writeBps ?? null : def.writeBps,
      readIops: m ? m.readIops ?? null : def.readIops, writeIops: m ? m.writeIops ?? null : def.writeIops,
    };
  }

  /**
   * The writable-layer quota of a new sandbox, in bytes: the request's, else the
   * source's (restore, fork), else `[defaults] disk_bytes` (at most the store's size);
   * null where the store enforces no quota (then only an explicit request is an error).
   * @throws DsecError FailedPrecondition (explicit quota, store without quotas),
   *   InvalidArgument (more than the store holds).
   */
  private diskQuota(explicit: number | undefined, inherited: number | null | undefined): number | null {
    const store = this.d.storage;
    if (!store.enforcesQuota) {
      if (explicit !== undefined) throw failedPrecondition(`disk_bytes cannot be enforced on this host: ${store.status().detail}; leave disk_bytes out`);
      return null;
    }
    const cap = store.capacityBytes();
    const def = this.d.config.defaults.diskBytes;
    // The default never makes a create fail: on a store smaller than it, it is the store's size.
    const v = explicit ?? inherited ?? (cap !== null ? Math.min(def, cap) : def);
    if (cap !== null && v > cap) {
      const what = explicit !== undefined ? `disk_bytes ${v}` : `the snapshot's disk_bytes ${v}`;
      throw invalidArgument(`${what} is more than the writable-layer store can hold (${cap} bytes on ${store.imagePath}); ask for at most ${cap} bytes, or make the store larger ([storage] size_bytes, docs/OPERATIONS.md)`);
    }
    return v;
  }

  /**
   * The content of image reference `ref` for a sandbox of `backend`: a reference the
   * backend owns (the vm tier's `disk:NAME`), else the image store's manifest of that
   * name in `tenant` (its own image first, else the `system` one; layer-store.ts get).
   * @param tenant the tenant of the sandbox being made (default `system`).
   * @throws DsecError NotFound (unknown image or disk, or only another tenant's image of
   *   that name), FailedPrecondition (a disk whose file is missing).
   */
  async source(backend: Backend, ref: string, tenant: string = SYSTEM_TENANT): Promise<ImageSource> {
    const own = await this.d.backends.driver(backend).resolveImage?.(ref);
    if (own) return own;
    const m = await this.d.images.get(ref, tenantScope(tenant));
    return { image: `${m.name}:${m.tag}`, layers: m.layers, config: m.config };
  }

  /**
   * Validates a requested network and settles its mode (daemon/net/network.ts); null for
   * mode none, which is what a sandbox without a network has.
   * @param backend the sandbox's tier: its capabilities list the modes it can have (a
   *   microVM's or VM's guest has only loopback: mode none).
   * @throws DsecError InvalidArgument (bad rules, unknown policy, a mode the tier lacks),
   *   FailedPrecondition (allow/open where networking is unavailable).
   */
  async network(spec: NetworkSpec | null | undefined, backend: Backend): Promise<NetworkSpec | null> {
    if (!spec) return null;
    const modes = this.d.backends.caps(backend).networkModes;
    const refuse = (mode: string) => invalidArgument(`network mode ${mode} is not available for backend ${backend}: microVMs and VMs have no network yet (the guest has only loopback); use network mode none (the default)`);
    if (!modes.includes(spec.mode ?? 'none')) throw refuse(spec.mode!);
    const settled = this.d.network
      ? await this.d.network.settle(spec)
      : (spec.mode ?? 'none') === 'none' && !spec.policy && !spec.allow?.length && !spec.deny?.length
        ? { ...spec, mode: 'none' as const }
        : (() => { throw failedPrecondition('this dsecd has no sandbox networking; use network mode none (the default)'); })();
    if (!modes.includes(settled.mode ?? 'none')) throw refuse(String(settled.mode));
    return settled.mode === 'none' ? null : settled;
  }

  /**
   * The spec of a sandbox of `input` made of `source`, with `resources` and the settled
   * `network`: the remaining defaults, and the filesystem options resolved now (request >
   * image > `[filesystem]`) so a later change of config or image never alters it. Pure.
   * @param snapshotId the snapshot it is restored from, or null.
   */
  spec(input: SandboxInput, resources: Resources, source: ImageSource, network: NetworkSpec | null, snapshotId: string | null): SandboxSpec {
    return {
      backend: input.backend,
      tenant: input.tenant ?? SYSTEM_TENANT,
      image: source.image,
      imageLayers: source.layers,
      imageConfig: source.config,
      ...resources,
      labels: input.labels ?? {},
      env: input.env ?? {},
      ttlS: input.ttlS ?? null,
      priority: input.priority ?? 'latency',
      idleTimeoutS: input.idleTimeoutS ?? null,
      snapshotId,
      seccomp: input.seccomp ?? null,
      network,
      filesystem: resolveFilesystem(input.filesystem, source.config.security, this.d.config.filesystem),
    };
  }
}
