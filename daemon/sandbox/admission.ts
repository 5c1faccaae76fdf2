/**
 * Admission: whether the host takes a new sandbox (or a fork's group) at all, decided
 * before anything is written, so a refused create leaves nothing behind.
 */
import os from 'node:os';
import { invalidArgument, resourceExhausted } from '../errors.js';
import type { DaemonConfig } from '../config.js';
import type { WritableLayerStore } from '../storage/writable-layers.js';
import { humanBytes, quotaCap } from '../storage/pool.js';
import type { Resources } from '../model/resources.js';
import type { BackendCapabilities } from '../drivers/types.js';
import type { SandboxRepo } from '../db/sandboxes.js';
import { SYSTEM_TENANT, type TenantQuota } from '../model/tenant.js';

/** Cores of this host, read once (os.cpus() reads /proc/cpuinfo on every call). */
export const HOST_CORES = os.cpus().length;

/** What admission reads. */
export interface AdmissionDeps {
  /** `[admission]`: the count and overcommit ratios; `[quotas]`: per-tenant quotas. */
  config: Pick<DaemonConfig, 'admission' | 'quotas'>;
  repo: Pick<SandboxRepo, 'admissionTotals'>;
  /** The writable-layer store: its size and where it is (for messages). */
  storage: Pick<WritableLayerStore, 'capacityBytes' | 'location'>;
}

/** The host's limits on new sandboxes. */
export class Admission {
  /**
   * Admitted creates whose row is not in the store yet ({@link reserve}): counted with the
   * store's totals, so concurrent creates (a batch, a burst) cannot all pass a limit that
   * only some of them fit under while none has written its row.
   */
  private readonly pending = new Set<{ tenant: string; count: number; memoryBytes: number; cpus: number; diskBytes: number }>();

  constructor(private readonly d: AdmissionDeps) {}

  /** The store's totals (of `tenant`, or all) plus the pending reservations. */
  private totals(tenant?: string): { count: number; memoryBytes: number; cpus: number; diskBytes: number } {
    const t = { ...this.d.repo.admissionTotals(tenant) };
    for (const p of this.pending) {
      if (tenant !== undefined && p.tenant !== tenant) continue;
      t.count += p.count;
      t.memoryBytes += p.memoryBytes;
      t.cpus += p.cpus;
      t.diskBytes += p.diskBytes;
    }
    return t;
  }

  /**
   * {@link admit}, then holds what was admitted in the totals until the returned release
   * is called: the create calls it once its row is in the store (which counts it from
   * then on) or when it failed before that. Release is idempotent.
   * @throws DsecError ResourceExhausted as {@link admit}.
   */
  reserve(res: Resources, caps: Pick<BackendCapabilities, 'storeDisk'>, count = 1, tenant: string = SYSTEM_TENANT): () => void {
    this.admit(res, caps, count, tenant);
    const entry = { tenant, count, memoryBytes: res.memoryBytes * count, cpus: res.cpus * count, diskBytes: caps.storeDisk ? (res.diskBytes ?? 0) * count : 0 };
    this.pending.add(entry);
    return () => {
      this.pending.delete(entry);
    };
  }

  /**
   * Refuses limits above what the host has: they can never be honoured, so say so
   * instead of overcommitting silently.
   * @param req CPU (cores) and memory (bytes) as asked for; absent: the defaults, which fit.
   * @throws DsecError InvalidArgument.
   */
  checkLimits(req: { cpus?: number; memoryBytes?: number }): void {
    if (req.cpus !== undefined && req.cpus > HOST_CORES) throw invalidArgument(`cpus ${req.cpus} is more than this host's ${HOST_CORES} cores`);
    if (req.memoryBytes !== undefined && req.memoryBytes > os.totalmem()) {
      throw invalidArgument(`memory_bytes ${req.memoryBytes} is more than this host's ${os.totalmem()} bytes of memory`);
    }
  }

  /**
   * Refuses `count` new sandboxes of `res` that would take the host past its configured
   * limits: count of sandboxes, sum of memory limits over total memory times the memory
   * overcommit ratio, sum of CPU limits over cores times the CPU overcommit ratio, sum of
   * writable-layer quotas over the store's size times the disk overcommit ratio (only for
   * tiers whose writable layer is in the store: capability `storeDisk`). Warm-pool shells
   * are not counted: `[pool]` bounds them and they give way to the creates that claim them.
   * Creates admitted by {@link reserve} and not yet in the store count as made.
   * Then the tenant's quota ({@link admitTenant}).
   * @param tenant whose sandboxes they are (absent: `system`, which has no quota).
   * @throws DsecError ResourceExhausted naming the limit.
   */
  admit(res: Resources, caps: Pick<BackendCapabilities, 'storeDisk'>, count = 1, tenant: string = SYSTEM_TENANT): void {
    const a = this.d.config.admission;
    const diskBytes = caps.storeDisk ? res.diskBytes : null;
    const live = this.totals();
    if (live.count + count > a.maxSandboxes) {
      throw resourceExhausted(`host is at its limit of ${a.maxSandboxes} sandboxes (admission.max_sandboxes)`
        + `${count > 1 ? ` and has room for ${Math.max(0, a.maxSandboxes - live.count)} more, not ${count}` : ''}; destroy some first`);
    }
    const mem = live.memoryBytes + res.memoryBytes * count;
    const memCap = os.totalmem() * a.memoryOvercommit;
    if (mem > memCap) {
      throw resourceExhausted(`memory limits would total ${mem} bytes, over ${Math.floor(memCap)} (host memory x admission.memory_overcommit ${a.memoryOvercommit})`);
    }
    const cpu = live.cpus + res.cpus * count;
    const cpuCap = HOST_CORES * a.cpuOvercommit;
    if (cpu > cpuCap) {
      throw resourceExhausted(`CPU limits would total ${cpu} cores, over ${cpuCap} (host cores x admission.cpu_overcommit ${a.cpuOvercommit})`);
    }
    const size = diskBytes === null ? null : this.d.storage.capacityBytes();
    if (diskBytes !== null && size !== null) {
      const disk = live.diskBytes + diskBytes * count;
      const cap = quotaCap({ sizeBytes: size, overcommit: a.diskOvercommit });
      if (disk > cap) {
        throw resourceExhausted(`writable-layer quotas would total ${disk} bytes (${humanBytes(disk)}: ${humanBytes(live.diskBytes)} of sandboxes on this host + ${count > 1 ? `${count} x ` : ''}${humanBytes(diskBytes)}), `
          + `over ${cap} bytes (${humanBytes(cap)}: the ${humanBytes(size)} writable-layer store pool ${this.d.storage.location} x admission.disk_overcommit ${a.diskOvercommit}); `
          + 'ask for a smaller disk_bytes, destroy sandboxes, or raise admission.disk_overcommit (docs/OPERATIONS.md)');
      }
    }
    this.admitTenant(res, count, tenant);
  }

  /** The quota of `tenant`: `[quotas.tenants.NAME]`, else `[quotas]`; `system` has none. */
  quotaOf(tenant: string): TenantQuota | null {
    if (tenant === SYSTEM_TENANT) return null;
    return this.d.config.quotas.tenants[tenant] ?? this.d.config.quotas.default;
  }

  /**
   * Refuses `count` new sandboxes of `res` that would take `tenant` past its quota
   * (sandboxes, sum of CPU limits, sum of memory limits over the tenant's sandboxes).
   * @throws DsecError ResourceExhausted naming the quota, its value and the tenant's use.
   */
  admitTenant(res: Resources, count: number, tenant: string): void {
    const q = this.quotaOf(tenant);
    if (!q || (q.sandboxes === null && q.cpus === null && q.memoryBytes === null)) return;
    const use = this.totals(tenant);
    const key = this.d.config.quotas.tenants[tenant] ? `quotas.tenants.${tenant}` : 'quotas';
    const more = count > 1 ? `${count} new sandboxes` : 'a new sandbox';
    if (q.sandboxes !== null && use.count + count > q.sandboxes) {
      throw resourceExhausted(`tenant ${tenant} is at its quota of ${q.sandboxes} sandboxes (${key}.sandboxes): it has ${use.count}, and ${more} would make ${use.count + count}; destroy some first`);
    }
    if (q.cpus !== null && use.cpus + res.cpus * count > q.cpus) {
      throw resourceExhausted(`tenant ${tenant}'s CPU limits would total ${use.cpus + res.cpus * count} cores, over its quota of ${q.cpus} (${key}.cpus; in use: ${use.cpus} cores); ask for fewer cpus or destroy sandboxes`);
    }
    if (q.memoryBytes !== null && use.memoryBytes + res.memoryBytes * count > q.memoryBytes) {
      throw resourceExhausted(`tenant ${tenant}'s memory limits would total ${use.memoryBytes + res.memoryBytes * count} bytes, over its quota of ${q.memoryBytes} (${key}.memory_bytes; in use: ${use.memoryBytes} bytes); ask for less memory_bytes or destroy sandboxes`);
    }
  }
}
