/**
 * dsecd configuration: defaults, the optional TOML file, environment, and flags, in
 * increasing precedence. The resolved object is immutable for the life of the process.
 */
import os from 'node:os';
import type { FncallPoolConfig } from './fncall/pool.js';
import type { WarmPoolConfig } from './sandbox/warm-pool.js';
import { createHash } from 'node:crypto';
import { readFileSync, existsSync } from 'node:fs';
import path from 'node:path';
import { z } from 'zod';
import { invalidArgument, isDsecError } from './errors.js';
import { readTomlFile } from './toml-file.js';
import { defaultProfilePath } from './security/seccomp.js';
import { MIN_DISK_BYTES } from './model/resources.js';
import { IoMaxSchema } from './host/cgroups/io.js';
import { MIN_STORE_BYTES, type StorageConfig } from './storage/writable-layers.js';
import { checkBuilderRange, DEFAULT_BUILDER_RANGE } from './host/builder.js';
import { FilesystemOptionsSchema } from './security/filesystem.js';
import { CERT_ROLES, type CertRole } from '../pki/roles.js';
import { MemorySchema, resolveHostReclaim, type HostReclaimConfig } from './host/memory/config.js';
import { GuestReclaimSchema, resolveGuestReclaim, type GuestReclaimConfig } from './drivers/microvm/reclaim.js';
import { IO_WEIGHT_DEFAULT, IO_WEIGHT_MAX, IO_WEIGHT_MIN, type IoLimits } from './model/resources.js';
import { DEFAULT_FILESYSTEM, resolveFilesystem, type ResolvedFilesystem } from './model/filesystem.js';
import { fleetHost, resolveFleet, type FleetConfig, type FleetSources } from './fleet/config.js';
import { HOST_LABEL_RE, HOST_NAME_RE } from './fleet/layout.js';
import { isLoopbackHost, parseListen, type RemoteConfig } from './remote/config.js';
import { TENANT_RE, type TenantQuota } from './model/tenant.js';

export type { FleetConfig } from './fleet/config.js';
export { isLoopbackHost, parseListen, type RemoteConfig } from './remote/config.js';

/** Default state directory (`--root`, DSEC_ROOT). */
export const DEFAULT_ROOT = '/var/lib/dsec';
/** Default API socket (`--socket`, DSEC_SOCKET). */
export const DEFAULT_SOCKET = '/run/dsec/dsecd.sock';
/** Default config file (`--config`); optional: a missing default file is not an error. */
export const DEFAULT_CONFIG = '/etc/dsec/dsecd.toml';
/** Default per-sandbox quota on the writable layer (`[defaults] disk_bytes`): 10 GiB; see {@link DaemonConfig.defaults}. */
export const DEFAULT_DISK_BYTES = 10 * 1024 ** 3;

/** One tenant quota in the config file (`[quotas]`, `[quotas.tenants.NAME]`): sandboxes, cores, bytes. */
export const TenantQuotaFile = z.object({
  sandboxes: z.number().int().min(0).optional(),
  cpus: z.number().min(0).optional(),
  memory_bytes: z.number().int().min(0).optional(),
}).strict();

/** {@link DaemonConfig.quotas} from the file's `[quotas]`. */
export function resolveQuotas(q: (z.infer<typeof TenantQuotaFile> & { tenants?: Record<string, z.infer<typeof TenantQuotaFile>> }) | undefined): DaemonConfig['quotas'] {
  const def: TenantQuota = { sandboxes: q?.sandboxes ?? null, cpus: q?.cpus ?? null, memoryBytes: q?.memory_bytes ?? null };
  const tenants: Record<string, TenantQuota> = {};
  for (const [name, t] of Object.entries(q?.tenants ?? {})) {
    tenants[name] = { sandboxes: t.sandboxes ?? def.sandboxes, cpus: t.cpus ?? def.cpus, memoryBytes: t.memory_bytes ?? def.memoryBytes };
  }
  return { default: def, tenants };
}

/**
 * The config file schema (TOML). Every key is optional; see {@link DaemonConfig} for
 * meanings and defaults. Unknown keys are rejected so a typo never silently does nothing.
 */
const FileConfig = z
  .object({
    root: z.string().optional(),
    socket: z.string().optional(),
    instance: z.string().regex(/^[a-z0-9][a-z0-9_.-]{0,62}$/).optional(),
    log_level: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).optional(),
    runtime: z
      .object({
        name: z.enum(['auto', 'runc', 'crun']).optional(),
        path: z.string().optional(),
      })
      .strict()
      .optional(),
    uid_pool: z
      .object({
        base: z.number().int().min(65536).optional(),
        size: z.number().int().min(65536).optional(),
        range_size: z.number().int().min(1).max(1 << 24).optional(),
      })
      .strict()
      .optional(),
    defaults: z
      .object({
        cpus: z.number().positive().optional(),
        memory_bytes: z.number().int().positive().optional(),
        pids: z.number().int().positive().optional(),
        disk_bytes: z.number().int().min(MIN_DISK_BYTES).optional(),
        io_weight: z.number().int().min(IO_WEIGHT_MIN).max(IO_WEIGHT_MAX).optional(),
        io_max: IoMaxSchema.optional(),
      })
      .strict()
      .optional(),
    storage: z
      .object({
        upper_fs: z.enum(['auto', 'btrfs', 'xfs', 'host']).optional(),
        size_bytes: z.number().int().min(MIN_STORE_BYTES).optional(),
        preallocate: z.boolean().optional(),
        path: z.string().regex(/^\//, 'path is absolute').optional(),
        reserve_bytes: z.number().int().min(0).optional(),
      })
      .strict()
      .optional(),
    memory: MemorySchema.optional(),
    exec: z.object({ max_output_bytes: z.number().int().min(1024).optional() }).strict().optional(),
    metrics: z.object({ address: z.string().optional() }).strict().optional(),
    remote: z
      .object({
        listen: z.string().optional(),
        tls_cert: z.string().min(1).optional(),
        tls_key: z.string().min(1).optional(),
        tls_ca: z.string().min(1).optional(),
        peer_roles: z.array(z.enum(CERT_ROLES)).min(1).optional(),
        san: z.array(z.string().min(1)).optional(),
        creates_per_minute: z.number().int().min(1).optional(),
        auth_failures_per_minute: z.number().int().min(1).optional(),
        max_connections: z.number().int().min(1).optional(),
        headers_timeout_s: z.number().positive().optional(),
        request_timeout_s: z.number().min(0).optional(),
        keep_alive_timeout_s: z.number().positive().optional(),
        handshake_timeout_s: z.number().positive().optional(),
      })
      .strict()
      .optional(),
    audit: z.object({ path: z.string().min(1).optional() }).strict().optional(),
    e2b: z
      .object({
        enabled: z.boolean().optional(),
        default_timeout_s: z.number().int().min(1).max(30 * 24 * 3600).optional(),
        internet: z.enum(['none', 'allow', 'open']).optional(),
      })
      .strict()
      .optional(),
    admission: z
      .object({
        max_sandboxes: z.number().int().min(1).optional(),
        memory_overcommit: z.number().positive().optional(),
        cpu_overcommit: z.number().positive().optional(),
        disk_overcommit: z.number().positive().optional(),
      })
      .strict()
      .optional(),
    leases: z.object({ destroy_grace_s: z.number().int().min(0).optional() }).strict().optional(),
    quotas: TenantQuotaFile.extend({
      tenants: z.record(z.string().regex(TENANT_RE, 'tenant names: 1-63 of a-z, 0-9, _ and -, starting with a letter or digit'), TenantQuotaFile).optional(),
    }).strict().optional(),
    sandboxfusion: z
      .object({
        address: z.string().regex(/^[^:]+:\d+$/, 'address is host:port').optional(),
        images: z.object({ python: z.string().min(1), bash: z.string().min(1), c: z.string().min(1), cpp: z.string().min(1) }).partial().strict().optional(),
      })
      .strict()
      .optional(),
    fncall: z
      .object({
        max_workers: z.number().int().min(1).max(4096).optional(),
        min_idle: z.number().int().min(0).optional(),
        idle_s: z.number().int().min(1).optional(),
        calls_per_worker: z.number().int().min(1).optional(),
        max_queue: z.number().int().min(0).optional(),
        memory_bytes: z.number().int().min(4 * 1024 * 1024).optional(),
        pids: z.number().int().min(8).optional(),
      })
      .strict()
      .optional(),
    pool: z
      .object({
        fill_concurrency: z.number().int().min(1).max(64).optional(),
        entries: z.array(z.object({
          image: z.string().min(1),
          size: z.number().int().min(0).max(4096),
          network: z.enum(['none', 'allow', 'open']).optional(),
        }).strict()).max(64).optional(),
      })
      .strict()
      .optional(),
    creates: z
      .object({
        idempotency_key_ttl_s: z.number().int().min(60).optional(),
        ack_timeout_s: z.number().int().min(1).optional(),
      })
      .strict()
      .optional(),
    retention: z
      .object({
        events_max: z.number().int().min(100).optional(),
        events_max_age_s: z.number().int().min(60).optional(),
        trajectory_max_age_s: z.number().int().min(60).optional(),
      })
      .strict()
      .optional(),
    network: z
      .object({
        subnet: z.string().optional(),
        user_mode: z.enum(['slirp4netns', 'none']).optional(),
        host_loopback: z.boolean().optional(),
        upstream_dns: z.array(z.string().regex(/^[0-9.]+(:\d{1,5})?$/, 'upstream_dns entries are IPv4 addresses with an optional :port')).min(1).optional(),
        host_resolvers: z.array(z.string().min(1)).min(1).optional(),
        policy_dir: z.string().optional(),
        ttl_min_s: z.number().int().min(1).optional(),
        ttl_max_s: z.number().int().min(1).optional(),
      })
      .strict()
      .optional(),
    images: z
      .object({
        store: z.string().optional(),
        cache_dir: z.string().optional(),
        cache_bytes: z.number().int().min(0).optional(),
        commit_exclude: z.array(z.string()).optional(),
        prune_grace_s: z.number().int().min(0).optional(),
        mkfs_path: z.string().min(1).optional(),
      })
      .strict()
      .optional(),
    builder: z
      .object({
        enabled: z.boolean().optional(),
        base: z.number().int().min(65536).optional(),
        size: z.number().int().min(65536).multipleOf(65536).optional(),
      })
      .strict()
      .optional(),
    filesystem: FilesystemOptionsSchema.optional(),
    security: z.object({ seccomp_profile: z.string().min(1).optional() }).strict().optional(),
    fleet: z
      .object({
        etcd: z.array(z.string().min(1)).min(1).optional(),
        etcd_cert: z.string().min(1).optional(),
        etcd_key: z.string().min(1).optional(),
        etcd_ca: z.string().min(1).optional(),
        prefix: z.string().regex(/^\/[A-Za-z0-9._/-]*$/, 'prefix is an absolute key path').optional(),
        advertise: z.string().optional(),
        host_name: z.string().regex(HOST_NAME_RE, 'host_name is a DNS label: 1-63 of [a-z0-9-]').optional(),
        labels: z.record(z.string().regex(HOST_LABEL_RE), z.string().regex(HOST_LABEL_RE)).optional(),
        lease_ttl_s: z.number().int().min(2).max(300).optional(),
        refresh_s: z.number().min(0.25).max(300).optional(),
      })
      .strict()
      .optional(),
    vm: z
      .object({
        kernel: z.string().min(1).optional(),
        modules: z.string().min(1).optional(),
        qemu: z.string().min(1).optional(),
        busybox: z.string().min(1).optional(),
        accel: z.enum(['auto', 'kvm', 'tcg']).optional(),
        boot_timeout_s: z.number().positive().optional(),
        qmp_timeout_ms: z.number().int().min(100).optional(),
        disk_bytes: z.number().int().min(64 * 1024 * 1024).optional(),
        kvm_probe_timeout_s: z.number().positive().optional(),
        tcg_tb_mib: z.number().int().min(16).optional(),
        thp: z.boolean().optional(),
        pmem: z.boolean().optional(),
        balloon: z.boolean().optional(),
        vmm_mount_namespace: z.boolean().optional(),
        vmm_unprivileged: z.boolean().optional(),
        vmm_seccomp: z.boolean().optional(),
        console_log_bytes: z.number().int().min(4096).optional(),
        reclaim: GuestReclaimSchema.optional(),
        disks: z.record(z.string().regex(/^[a-z0-9][a-z0-9._-]{0,63}$/, 'disk names are 1-64 of [a-z0-9._-], starting with a letter or digit'), z.object({
          path: z.string().min(1),
          format: z.enum(['raw', 'qcow2']).optional(),
          init: z.enum(['disk', 'agent']).optional(),
          root_partition: z.number().int().min(0).max(128).optional(),
          root_fstype: z.string().regex(/^[a-z0-9]+$/).optional(),
          init_path: z.string().regex(/^\/[^\s]*$/).optional(),
          ready: z.string().min(1).optional(),
          cmdline: z.string().regex(/^[^\n]*$/).optional(),
        }).strict()).optional(),
      })
      .strict()
      .optional(),
  })
  .strict();

/** Default guest kernel of the microvm tier, as scripts/guest-kernel.sh unpacks it. */
export const DEFAULT_GUEST_KERNEL = '/usr/local/lib/dsec/guest/vmlinuz';
/** Default guest kernel modules directory (`lib/modules/<release>` of the same package). */
export const DEFAULT_GUEST_MODULES = '/usr/local/lib/dsec/guest/modules';

/** The microvm tier's settings (`[vm]`); see {@link DaemonConfig.vm}. */
export interface VmConfig {
  /** Guest kernel (bzImage), `kernel`; default {@link DEFAULT_GUEST_KERNEL}. */
  kernel: string;
  /** The guest kernel's `lib/modules/<release>` directory, `modules`; default {@link DEFAULT_GUEST_MODULES}. */
  modules: string;
  /** QEMU system emulator binary (PATH search), `qemu`; default `qemu-system-x86_64`. */
  qemu: string;
  /** Statically linked busybox for the initramfs, `busybox`; default `/bin/busybox` (busybox-static). */
  busybox: string;
  /** `auto`: KVM when a probe boot under KVM succeeds on this host (probed once per dsecd), else TCG; or force one. */
  accel: 'auto' | 'kvm' | 'tcg';
  /** From QEMU's start to the guest agent's answer, ms (`boot_timeout_s`; default 120 s: a TCG boot takes ~5 s idle, ~20 s on a loaded 2-core host). */
  bootTimeoutMs: number;
  /** One QMP command's reply limit, ms (`qmp_timeout_ms`; default 10,000). */
  qmpTimeoutMs: number;
  /** Size of a microVM's writable disk when the sandbox names none (`disk_bytes`; default 10 GiB, sparse: only written blocks use host disk). */
  diskBytes: number;
  /** How long the KVM probe boot may take before KVM is judged unusable, ms (`kvm_probe_timeout_s`; default 10 s: a KVM boot to init takes ~1 s). */
  kvmProbeTimeoutMs: number;
  /** TCG translation cache per VM, MiB (`tcg_tb_mib`; default 128: QEMU's own default is 1 GiB, charged to the VM's cgroup as it fills). */
  tcgTbMiB: number;
  /**
   * Transparent huge pages for guest RAM (`thp`; default false). QEMU asks for them, and
   * then one byte a guest touches makes the host back its whole 2 MiB region, so an idle
   * guest costs several times the memory it uses; KVM guests with big working sets run
   * faster with them.
   */
  thp: boolean;
  /**
   * DAX sharing of image layers (`pmem`; default true): a microVM maps each read-only
   * EROFS layer as persistent memory backed by one shared host file (a 2 MiB-aligned copy
   * per layer digest, `<root>/vm/pmem/`), and the guest mounts it `dax=always`, so the
   * layer's bytes live once in the host page cache for all VMs instead of once per guest
   * page cache. false, or a VM whose memory map cannot take it: layers are virtio-blk
   * disks (docs/ARCHITECTURE.md "The microvm tier").
   */
  pmem: boolean;
  /**
   * virtio-balloon with free-page reporting (`balloon`; default true): the guest reports
   * pages it freed (in 4 MiB blocks, the kernel's pageblock order) and QEMU discards them,
   * so memory the guest touched once (boot, a finished build) goes back to the host.
   */
  balloon: boolean;
  /**
   * Confinement of every VMM (`vmm_mount_namespace`, `vmm_unprivileged`, `vmm_seccomp`;
   * each default true; docs/SECURITY.md "VMM confinement"): a mount namespace holding only
   * what QEMU needs, the sandbox's own host uid instead of root, dsec's seccomp filter
   * below QEMU's own `-sandbox`.
   */
  confine: { mountNamespace: boolean; unprivileged: boolean; seccomp: boolean };
  /** The vm tier's serial console log is rotated at this size (`console_log_bytes`; default 1 MiB, so at most 2 MiB per VM on disk). */
  consoleLogBytes: number;
  /** Disk images registered for the vm tier (`[vm.disks.NAME]`), by name: a create with image `disk:NAME` boots one ({@link VmDiskConfig}). */
  disks: Record<string, VmDiskConfig>;
  /** Guest-side DAMON reclaim of microVMs and their swap (`[vm.reclaim]`; daemon/drivers/microvm/reclaim.ts). */
  reclaim: GuestReclaimConfig;
}

/**
 * One operator-supplied disk image of the vm tier (`[vm.disks.NAME]`, docs/OPERATIONS.md
 * "Disk images"). Each VM boots a qcow2 overlay of its own over it; the file itself is only
 * read (it must stay unchanged while VMs use it).
 */
export interface VmDiskConfig {
  /** Absolute path of the disk file (`path`). */
  path: string;
  /** `raw` or `qcow2` (`format`; default from the extension: `.qcow2` is qcow2, anything else raw). */
  format: 'raw' | 'qcow2';
  /**
   * What runs as the guest's init (`init`; default `disk`): `disk` runs the disk's own
   * init (`init_path`) with no dsec agent, so only the serial console reaches the VM;
   * `agent` runs dsec's agent as PID 1 on the disk's root (exec, files, PTYs work).
   */
  init: 'disk' | 'agent';
  /** Partition number of the root filesystem (`root_partition`; default 0: the whole disk is the filesystem). */
  rootPartition: number;
  /** Root filesystem type (`root_fstype`; default ext4; the guest initramfs has ext4 only). */
  rootFstype: string;
  /** The disk's init program (`init_path`; default /sbin/init). */
  initPath: string;
  /** A regular expression: with `init = "disk"`, create waits until the console prints it (within boot_timeout_s); unset: running once QEMU runs. */
  ready: string | null;
  /** Extra guest kernel command line (`cmdline`). */
  cmdline: string;
}

/** The resolved daemon configuration. */
export interface DaemonConfig {
  /** State directory: store, layers, per-sandbox dirs, runtime state. */
  root: string;
  /** Unix socket path of the API. */
  socket: string;
  /**
   * Instance name. Keys everything this dsecd creates outside its root (cgroup parent
   * `dsec-<instance>`, runtime container names). Default: `default` for the default
   * root, else derived from the root path (basename + 8 hex of its sha256) so two
   * instances with different roots never collide.
   */
  instance: string;
  /** pino log level. */
  logLevel: string;
  /** OCI runtime choice: `auto` picks crun when it works on this host, runc otherwise. */
  runtime: { name: 'auto' | 'runc' | 'crun'; path: string | null };
  /**
   * Host uid/gid pool from which each sandbox gets its own range (container uid 0 ->
   * host `base + k*rangeSize`). Default base 2^31, size 2^30, range 65,536: 16,384
   * sandboxes, far above this host's target of 5,000, each with the conventional
   * 65,536 ids of a subuid range. Instances on one host must use disjoint pools; dsecd
   * refuses to start when another running instance registered an overlapping pool.
   */
  uidPool: { base: number; size: number; rangeSize: number };
  /**
   * Limits applied when a create request leaves them out: 1 core, 512 MiB, 1,024 pids,
   * and a 10 GiB quota on the writable layer (`disk_bytes`; where the store enforces
   * quotas). 10 GiB is Docker's old devicemapper base size, and holds a repository, its
   * build and its dependencies; it is a ceiling, not a reservation: quotas of all
   * sandboxes may add up to more than the store (like memory limits), and an idle
   * sandbox's layer costs only what it wrote. On a store smaller than it, the default is
   * the store's size. The value is written into each sandbox's row at create, so
   * changing it never alters an existing sandbox.
   *
   * `io` is the I/O setting of a sandbox whose create names none (`io_weight`, default
   * 100, the kernel's own default weight; `[defaults.io_max]` `read_bps`, `write_bps`,
   * `read_iops`, `write_iops`, default none): applied to its cgroup on the store's
   * device (daemon/host/cgroups/io.ts says what each cgroup version enforces).
   */
  defaults: { cpus: number; memoryBytes: number; pids: number; diskBytes: number; io: IoLimits };
  /** Where sandboxes' writable layers live and how they are limited (daemon/storage/layout.ts StorageConfig documents each field). */
  storage: StorageConfig;
  /** Per-stream cap on exec output kept in an ExecResult: 4 MiB; the rest is discarded and flagged truncated. */
  maxOutputBytes: number;
  /**
   * Layer store. `store` may be a shared filesystem used by many hosts (default
   * `<root>/images`). With `cacheDir` set, blobs are copied to that host-local directory
   * before they are mounted and evicted least-recently-used once the cache holds more
   * than `cacheBytes` (default 50 GiB). `commitExclude` adds glob patterns (relative to
   * the sandbox root, e.g. `srv/cache/**`) that `commit` strips besides its fixed list.
   * Unreferenced layers younger than `pruneGraceMs` (default 10 min, `prune_grace_s`) are
   * kept by prune. `mkfsPath` is the mkfs.erofs binary (default `mkfs.erofs` on PATH).
   */
  images: { store: string; cacheDir: string | null; cacheBytes: number; commitExclude: string[]; pruneGraceMs: number; mkfsPath: string };
  /**
   * The builder identity (daemon/host/builder.ts): the host uid/gid range under which
   * imports, image builds, commits and snapshots extract, copy and pack trees, as uid 0 of
   * a user namespace per job. Default base 2^31 - 2^20, size 2^20: 16 slots of 65,536
   * ids (16 concurrent builds), right below the default sandbox pool. It must not overlap
   * this instance's uid pool (checked here) nor any live instance's pool or builder range
   * (checked at registration). `enabled = false` builds as root instead (hosts without
   * user namespaces); `dsec host info` then reports builder_identity as not enforced.
   */
  builder: { enabled: boolean; base: number; size: number };
  /**
   * Loopback `host:port` serving GET /metrics only, without authentication (e.g.
   * `127.0.0.1:9464`), or null: metrics on the socket only. Only loopback addresses are
   * taken: a scraper on another machine reads GET /metrics through the TCP door with a
   * `metrics` token ({@link RemoteConfig}).
   */
  metricsAddress: string | null;
  /** The TCP door (`[remote]`, `--listen`): see {@link RemoteConfig}. */
  remote: RemoteConfig;
  /** The audit log of mutating API calls (`[audit] path`; default `<root>/audit.log`; daemon/remote/audit.ts). */
  audit: { path: string };
  /**
   * `[e2b]`, the E2B front on the TCP door (daemon/api/e2b, docs/E2B.md):
   * - `enabled`: serve E2B's control plane and envd next to /v1 (default true; only with `--listen`);
   * - `defaultTimeoutS`: timeout of a create or connect that names none (default 300 s, what E2B's SDKs send by default);
   * - `internet`: network mode of a sandbox created with internet access (E2B's default):
   *   default `none` (dsec's default: loopback only); `open` gives E2B's behaviour,
   *   `allow` the allow-list of the default network policy. `allow_internet_access: false` is always none.
   */
  e2b: { enabled: boolean; defaultTimeoutS: number; internet: 'none' | 'allow' | 'open' };
  /**
   * Admission limits, checked at create. Defaults are permissive, because RL sandboxes
   * idle far below their limits and the density target is thousands per host; operators
   * tighten them per fleet:
   * - `maxSandboxes`: default 16,384, the size of the default uid pool;
   * - `memoryOvercommit`: memory limits may sum to this times host memory (default 100);
   * - `cpuOvercommit`: CPU limits may sum to this times the cores (default 1,000);
   * - `diskOvercommit`: writable-layer quotas (`disk_bytes`) of container sandboxes may
   *   sum to this times the store's size (default 100, as for memory: a quota is a
   *   ceiling, and an RL sandbox writes far below it; the store fills only when the
   *   sandboxes' average use passes 1/100 of their quotas, and then the pool guard of
   *   daemon/storage/pool.ts keeps `[storage] reserve_bytes` for those that did not fill
   *   it). 1 never lets quotas add up to more than the store. Not checked where the store
   *   enforces no quota.
   */
  admission: { maxSandboxes: number; memoryOvercommit: number; cpuOvercommit: number; diskOvercommit: number };
  /**
   * Per-tenant quotas (`[quotas]`), checked at admission beside the host's limits:
   * `default` applies to every tenant but `system` (the Unix socket's, bounded by
   * `[admission]` alone), `tenants` overrides it per tenant name, key by key (a tenant
   * named there gets its own values, the default's for keys it leaves out). Default: no
   * quota at all.
   */
  quotas: { default: TenantQuota; tenants: Record<string, TenantQuota> };
  /** Sizing of the fncall pools (daemon/fncall/pool.ts FncallPoolConfig, which documents each default). */
  fncall: FncallPoolConfig;
  /**
   * `[pool]`: warm pools of pre-created container sandbox shells (daemon/sandbox/warm-pool.ts).
   * Default: no entries, so no shells and every create runs the runtime. Each
   * `[[pool.entries]]` keeps `size` (0-4,096) shells of `image` with network mode `network`
   * (default none) ready; `fill_concurrency` (default 2) bounds the background fills.
   */
  pool: WarmPoolConfig;
  /**
   * The SandboxFusion-compatible POST /run_code: `address` (a loopback host:port) also
   * serves it over plain TCP to local clients, without authentication (only that route);
   * clients elsewhere call POST /run_code through the TCP door with a `user` token;
   * `images` overrides the image per language (default judge:bookworm).
   */
  sandboxfusion: { address: string | null; images: Partial<Record<'python' | 'bash' | 'c' | 'cpp', string>> };
  /** After a job's lease lapses its sandboxes are paused; `destroyGraceMs` later they are destroyed (default 10 min). */
  leases: { destroyGraceMs: number };
  /**
   * Store retention: events beyond the newest `eventsMax` (default 100,000) or older
   * than `eventsMaxAgeMs` (default 7 days) are pruned by the reaper. Destroyed
   * sandboxes leave no row (their history is their events), and exec sessions are
   * forgotten 10 minutes after they end, so the store stays bounded. Trajectories not
   * updated for `trajectoryMaxAgeMs` (default 30 days: longer than any RL run stays
   * preempted) are removed, leaving a tombstone that is itself forgotten after another
   * such period.
   */
  retention: { eventsMax: number; eventsMaxAgeMs: number; trajectoryMaxAgeMs: number };
  /**
   * Creates (daemon/sandbox/create-records.ts): an `Idempotency-Key` is remembered for
   * `keyTtlMs` (default 24 h, as Stripe keeps keys); a sandbox whose create answer was not
   * acknowledged (written whole to the caller, or confirmed by the gateway that relayed
   * it) within `ackTimeoutMs` (default 60 s) is destroyed.
   */
  creates: { keyTtlMs: number; ackTimeoutMs: number };
  /** Sandbox networking (daemon/net/, docs/OPERATIONS.md "Networking"); see {@link NetworkConfig}. */
  network: NetworkConfig;
  /**
   * `[filesystem]`: the filesystem options of sandboxes whose request and image say
   * nothing (daemon/security/filesystem.ts): `readonly_paths` (default
   * /bin, /sbin, /usr, /lib*, /etc), `writable_paths` (default none), `landlock`
   * (default true).
   */
  filesystem: ResolvedFilesystem;
  /**
   * `[security]`: `seccompProfile` is the seccomp profile data file every sandbox gets
   * (default the shipped daemon/security/profiles/seccomp-default.json). It is validated
   * at start (a malformed file stops dsecd) and reloaded on SIGHUP and
   * `POST /v1/security/seccomp/reload`, where a malformed file is refused and the profile
   * in force stays.
   */
  security: { seccompProfile: string };
  /** The microvm tier (`[vm]`): guest kernel, QEMU, accelerator, timeouts, disk size ({@link VmConfig}). */
  vm: VmConfig;
  /** Proactive reclaim of idle container sandboxes by the host (`[memory]`, `--reclaim`; daemon/host/memory/config.ts). */
  memory: HostReclaimConfig;
  /** Fleet membership (`[fleet]`, `--etcd`; daemon/fleet/): null without etcd endpoints, and dsecd is a host of its own. */
  fleet: FleetConfig | null;
}

/**
 * `[network]`: the instance network namespace that `allow` and `open` sandboxes attach to.
 * - `subnet`: the bridge's IPv4 prefix inside the instance netns (default 10.201.0.0/16:
 *   65,533 sandbox addresses, more than the default uid pool's 16,384 ranges; private and
 *   rarely used, and only destinations inside it become unreachable). Gateway = first host.
 * - `userMode`: how the instance netns reaches the host's network: `slirp4netns` (default;
 *   user-mode networking, no host setting changes) or `none` (the operator routes the
 *   namespace, see docs/OPERATIONS.md).
 * - `hostLoopback`: let sandboxes reach the host's 127.0.0.1 through the user-mode
 *   gateway (10.0.2.2), still subject to their egress rules; default false.
 * - `upstreamDns`: where the sandbox resolver forwards allowed names, as seen from the
 *   instance netns; default slirp4netns's DNS forwarder 10.0.2.3 (which uses the host's
 *   resolv.conf).
 * - `hostResolvers`: servers dsecd (host netns) uses to resolve host rules; default the
 *   host's resolv.conf.
 * - `policyDir`: the operator's network policy files (default /etc/dsec/network-policies).
 * - `ttlMinS`/`ttlMaxS`: clamp on the DNS TTL of resolved host rules (default 30 s and
 *   3,600 s: no re-query storm from TTL-0 records, and moved services are picked up
 *   within an hour even when a record says a day).
 */
export interface NetworkConfig {
  subnet: string;
  userMode: 'slirp4netns' | 'none';
  hostLoopback: boolean;
  upstreamDns: string[];
  hostResolvers: string[] | null;
  policyDir: string;
  ttlMinS: number;
  ttlMaxS: number;
}

/** Options from flags and environment; undefined means "not given". */
export interface ConfigSources extends FleetSources {
  root?: string;
  socket?: string;
  config?: string;
  /** `--listen ADDR:PORT`. */
  listen?: string;
  /** `--tls-cert FILE`. */
  tlsCert?: string;
  /** `--tls-key FILE`. */
  tlsKey?: string;
  /** `--tls-ca FILE`. */
  tlsCa?: string;
  /** `--tls-peer-roles ROLE,...`. */
  peerRoles?: string;
  /** `--reclaim off|idle|aggressive` (wins over `[memory] reclaim`). */
  reclaim?: string;
  env?: NodeJS.ProcessEnv;
}

/** Derives the default instance name for `root` (see {@link DaemonConfig.instance}). */
export function instanceNameFor(root: string): string {
  const abs = path.resolve(root);
  if (abs === DEFAULT_ROOT) return 'default';
  const base = path.basename(abs).toLowerCase().replace(/[^a-z0-9_.-]/g, '-').replace(/^[^a-z0-9]+/, '').slice(0, 40) || 'x';
  const hash = createHash('sha256').update(abs).digest('hex').slice(0, 8);
  return `${base}-${hash}`;
}

/**
 * Resolves the configuration. Precedence: flags > environment (DSEC_ROOT, DSEC_SOCKET,
 * DSEC_CONFIG) > config file > defaults.
 * @throws DsecError InvalidArgument when the config file is unreadable, not TOML, or has unknown/invalid keys,
 *   or when an explicitly named config file does not exist.
 */
export function loadConfig(src: ConfigSources = {}): DaemonConfig {
  const env = src.env ?? process.env;
  const explicit = src.config ?? env.DSEC_CONFIG;
  const file = explicit ?? DEFAULT_CONFIG;
  const fc: z.infer<typeof FileConfig> = readTomlFile(file, FileConfig, explicit !== undefined);
  const pool = fc.uid_pool ?? {};
  if ((pool.base ?? 2 ** 31) + (pool.size ?? 2 ** 30) > 2 ** 32 - 1) {
    throw invalidArgument(`config ${file}: uid_pool base + size must stay below 2^32-1 (4294967295), the largest valid uid`);
  }
  // The TTL clamp is [ttl_min_s, ttl_max_s]: a minimum above the maximum has no meaning
  // (which bound wins would be an accident of the code), so it is refused.
  const ttlMin = fc.network?.ttl_min_s ?? 30, ttlMax = fc.network?.ttl_max_s ?? 3600;
  if (ttlMin > ttlMax) {
    throw invalidArgument(`config ${file}: network.ttl_min_s (${ttlMin}) must not exceed network.ttl_max_s (${ttlMax}${fc.network?.ttl_max_s === undefined ? ', the default' : ''})`);
  }
  const builder = { enabled: fc.builder?.enabled ?? true, base: fc.builder?.base ?? DEFAULT_BUILDER_RANGE.base, size: fc.builder?.size ?? DEFAULT_BUILDER_RANGE.size };
  try {
    if (builder.enabled) checkBuilderRange(builder, { base: pool.base ?? 2 ** 31, size: pool.size ?? 2 ** 30 });
  } catch (e) {
    if (isDsecError(e)) throw invalidArgument(`config ${file}: ${e.message}`);
    throw e;
  }
  const root = path.resolve(src.root ?? env.DSEC_ROOT ?? fc.root ?? DEFAULT_ROOT);
  const remote = resolveRemote(src, fc.remote ?? {}, file);
  for (const [what, a] of [['metrics address', fc.metrics?.address], ['sandboxfusion address', fc.sandboxfusion?.address]] as const) {
    if (a && !isLoopbackHost(parseListen(a, `config ${file}: ${what}`).host)) {
      throw invalidArgument(`config ${file}: ${what} ${a} is not a loopback address: it serves without authentication; bind it to 127.0.0.1, and reach it from elsewhere through the TCP door ([remote] listen) with a token`);
    }
  }
  const socket = path.resolve(src.socket ?? env.DSEC_SOCKET ?? fc.socket ?? DEFAULT_SOCKET);
  let fleet: FleetConfig | null;
  try {
    fleet = resolveFleet(src, fc.fleet);
  } catch (e) {
    if (isDsecError(e) && !src.etcd && fc.fleet?.etcd) throw invalidArgument(`config ${file}: fleet: ${e.message}`);
    throw e;
  }
  let memory: HostReclaimConfig;
  try {
    memory = resolveHostReclaim(fc.memory, src.reclaim);
  } catch (e) {
    throw invalidArgument((e as Error).message);
  }
  let remoteCfg = remote;
  if (fleet) [fleet, remoteCfg] = fleetHost(fleet, remote);
  return Object.freeze({
    fleet,
    remote: remoteCfg,
    root,
    socket,
    memory,
    instance: fc.instance ?? instanceNameFor(root),
    logLevel: env.DSEC_LOG_LEVEL ?? fc.log_level ?? 'info',
    runtime: { name: fc.runtime?.name ?? 'auto', path: fc.runtime?.path ?? null },
    uidPool: {
      base: fc.uid_pool?.base ?? 2 ** 31,
      size: fc.uid_pool?.size ?? 2 ** 30,
      rangeSize: fc.uid_pool?.range_size ?? 65536,
    },
    defaults: {
      cpus: fc.defaults?.cpus ?? 1,
      memoryBytes: fc.defaults?.memory_bytes ?? 512 * 1024 * 1024,
      pids: fc.defaults?.pids ?? 1024,
      diskBytes: fc.defaults?.disk_bytes ?? DEFAULT_DISK_BYTES,
      io: {
        weight: fc.defaults?.io_weight ?? IO_WEIGHT_DEFAULT,
        readBps: fc.defaults?.io_max?.read_bps ?? null,
        writeBps: fc.defaults?.io_max?.write_bps ?? null,
        readIops: fc.defaults?.io_max?.read_iops ?? null,
        writeIops: fc.defaults?.io_max?.write_iops ?? null,
      },
    },
    storage: {
      upperFs: fc.storage?.upper_fs ?? 'auto',
      sizeBytes: fc.storage?.size_bytes ?? null,
      preallocate: fc.storage?.preallocate ?? false,
      path: fc.storage?.path ? path.resolve(fc.storage.path) : null,
      reserveBytes: fc.storage?.reserve_bytes ?? null,
    },
    security: { seccompProfile: fc.security?.seccomp_profile ? path.resolve(fc.security.seccomp_profile) : defaultProfilePath() },
    maxOutputBytes: fc.exec?.max_output_bytes ?? 4 * 1024 * 1024,
    metricsAddress: fc.metrics?.address ?? null,
    audit: { path: path.resolve(fc.audit?.path ?? path.join(root, 'audit.log')) },
    e2b: { enabled: fc.e2b?.enabled ?? true, defaultTimeoutS: fc.e2b?.default_timeout_s ?? 300, internet: fc.e2b?.internet ?? 'none' },
    admission: {
      maxSandboxes: fc.admission?.max_sandboxes ?? 16_384,
      memoryOvercommit: fc.admission?.memory_overcommit ?? 100,
      cpuOvercommit: fc.admission?.cpu_overcommit ?? 1000,
      diskOvercommit: fc.admission?.disk_overcommit ?? 100,
    },
    leases: { destroyGraceMs: (fc.leases?.destroy_grace_s ?? 600) * 1000 },
    quotas: resolveQuotas(fc.quotas),
    sandboxfusion: { address: fc.sandboxfusion?.address ?? null, images: fc.sandboxfusion?.images ?? {} },
    fncall: {
      maxWorkers: fc.fncall?.max_workers ?? 4 * os.cpus().length,
      minIdle: fc.fncall?.min_idle ?? 1,
      idleMs: (fc.fncall?.idle_s ?? 60) * 1000,
      callsPerWorker: fc.fncall?.calls_per_worker ?? 10_000,
      maxQueue: fc.fncall?.max_queue ?? 10_000,
      memoryBytes: fc.fncall?.memory_bytes ?? 512 * 1024 * 1024,
      cpus: os.cpus().length,
      pids: fc.fncall?.pids ?? 256,
    },
    pool: {
      entries: (fc.pool?.entries ?? []).map((e) => ({ image: e.image, size: e.size, network: e.network ?? 'none' })),
      fillConcurrency: fc.pool?.fill_concurrency ?? 2,
    },
    creates: { keyTtlMs: (fc.creates?.idempotency_key_ttl_s ?? 86_400) * 1000, ackTimeoutMs: (fc.creates?.ack_timeout_s ?? 60) * 1000 },
    retention: { eventsMax: fc.retention?.events_max ?? 100_000, eventsMaxAgeMs: (fc.retention?.events_max_age_s ?? 7 * 86400) * 1000,
      trajectoryMaxAgeMs: (fc.retention?.trajectory_max_age_s ?? 30 * 86400) * 1000 },
    network: {
      subnet: fc.network?.subnet ?? '10.201.0.0/16',
      userMode: fc.network?.user_mode ?? 'slirp4netns',
      hostLoopback: fc.network?.host_loopback ?? false,
      upstreamDns: fc.network?.upstream_dns ?? ['10.0.2.3'],
      hostResolvers: fc.network?.host_resolvers ?? null,
      policyDir: path.resolve(fc.network?.policy_dir ?? '/etc/dsec/network-policies'),
      ttlMinS: ttlMin,
      ttlMaxS: ttlMax,
    },
    images: {
      store: path.resolve(fc.images?.store ?? path.join(root, 'images')),
      cacheDir: fc.images?.cache_dir ? path.resolve(fc.images.cache_dir) : null,
      cacheBytes: fc.images?.cache_bytes ?? 50 * 1024 ** 3,
      commitExclude: fc.images?.commit_exclude ?? [],
      pruneGraceMs: (fc.images?.prune_grace_s ?? 600) * 1000,
      mkfsPath: fc.images?.mkfs_path ?? 'mkfs.erofs',
    },
    builder,
    filesystem: resolveFilesystem(fc.filesystem, null, DEFAULT_FILESYSTEM),
    vm: {
      kernel: path.resolve(fc.vm?.kernel ?? DEFAULT_GUEST_KERNEL),
      modules: path.resolve(fc.vm?.modules ?? DEFAULT_GUEST_MODULES),
      qemu: fc.vm?.qemu ?? 'qemu-system-x86_64',
      busybox: fc.vm?.busybox ?? '/bin/busybox',
      accel: fc.vm?.accel ?? 'auto',
      bootTimeoutMs: Math.round((fc.vm?.boot_timeout_s ?? 120) * 1000),
      qmpTimeoutMs: fc.vm?.qmp_timeout_ms ?? 10_000,
      diskBytes: fc.vm?.disk_bytes ?? 10 * 1024 ** 3,
      kvmProbeTimeoutMs: Math.round((fc.vm?.kvm_probe_timeout_s ?? 10) * 1000),
      tcgTbMiB: fc.vm?.tcg_tb_mib ?? 128,
      thp: fc.vm?.thp ?? false,
      pmem: fc.vm?.pmem ?? true,
      balloon: fc.vm?.balloon ?? true,
      confine: { mountNamespace: fc.vm?.vmm_mount_namespace ?? true, unprivileged: fc.vm?.vmm_unprivileged ?? true, seccomp: fc.vm?.vmm_seccomp ?? true },
      consoleLogBytes: fc.vm?.console_log_bytes ?? 1024 * 1024,
      reclaim: resolveGuestReclaim(fc.vm?.reclaim),
      disks: Object.fromEntries(Object.entries(fc.vm?.disks ?? {}).map(([name, d]) => [name, {
        path: path.resolve(d.path),
        format: d.format ?? (d.path.endsWith('.qcow2') ? 'qcow2' : 'raw'),
        init: d.init ?? 'disk',
        rootPartition: d.root_partition ?? 0,
        rootFstype: d.root_fstype ?? 'ext4',
        initPath: d.init_path ?? '/sbin/init',
        ready: d.ready ?? null,
        cmdline: d.cmdline ?? '',
      } satisfies VmDiskConfig])),
    },
  });
}

/** Resolves `[remote]` under the flags (flags win). @throws DsecError InvalidArgument for a bad address, half a cert/key pair, or an unknown peer role. */
function resolveRemote(src: ConfigSources, r: NonNullable<z.infer<typeof FileConfig>['remote']>, file: string): RemoteConfig {
  const listen = src.listen ?? r.listen ?? null;
  if (listen !== null) parseListen(listen, src.listen !== undefined ? '--listen' : `config ${file}: remote.listen`);
  const abs = (p: string | undefined) => (p ? path.resolve(p) : null);
  const tlsCert = abs(src.tlsCert ?? r.tls_cert), tlsKey = abs(src.tlsKey ?? r.tls_key);
  if ((tlsCert === null) !== (tlsKey === null)) throw invalidArgument('--tls-cert and --tls-key go together: give both, or neither (dsecd then makes its own CA and certificate under <root>/tls)');
  let peerRoles: CertRole[] = r.peer_roles ?? ['client', 'gateway'];
  if (src.peerRoles !== undefined) {
    const list = src.peerRoles.split(',').map((x) => x.trim()).filter(Boolean);
    const bad = list.find((x) => !(CERT_ROLES as readonly string[]).includes(x));
    if (bad !== undefined || list.length === 0) throw invalidArgument(`--tls-peer-roles ${JSON.stringify(src.peerRoles)}: a comma-separated list of ${CERT_ROLES.join(', ')}`);
    peerRoles = list as CertRole[];
  }
  for (const n of r.san ?? []) {
    if (!/^[A-Za-z0-9.-]+$/.test(n) && !/^[0-9a-fA-F:.]+$/.test(n)) throw invalidArgument(`config ${file}: remote.san ${JSON.stringify(n)} is neither a DNS name nor an IP address`);
  }
  return {
    listen,
    tlsCert,
    tlsKey,
    tlsCa: abs(src.tlsCa ?? r.tls_ca),
    peerRoles,
    san: r.san ?? [],
    createsPerMinute: r.creates_per_minute ?? 6000,
    authFailuresPerMinute: r.auth_failures_per_minute ?? 30,
    maxConnections: r.max_connections ?? 10_000,
    headersTimeoutMs: Math.round((r.headers_timeout_s ?? 10) * 1000),
    requestTimeoutMs: Math.round((r.request_timeout_s ?? 3600) * 1000),
    keepAliveTimeoutMs: Math.round((r.keep_alive_timeout_s ?? 5) * 1000),
    handshakeTimeoutMs: Math.round((r.handshake_timeout_s ?? 10) * 1000),
  };
}
