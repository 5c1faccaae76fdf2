/**
 * dsecd's registration in the fleet (`dsecd --etcd URL[,URL...]`): the host claims its
 * name for its persistent id, writes what it is (`info`), and keeps what it carries
 * (`live`, `images`) under an etcd lease that it keeps alive, so a host that dies
 * vanishes from the fleet at the lease's TTL without anyone detecting anything.
 * daemon/fleet/layout.ts has the keys and records.
 *
 * Contracts:
 * - etcd is never needed to serve: the registration runs beside the API, and a dsecd
 *   whose etcd is gone keeps serving its own API and sandboxes; it registers again (a new
 *   lease, the same id) when etcd answers again, with back-off.
 * - A name is claimed by transaction: `hosts/<name>/id` is created with this host's id if
 *   absent, and kept if it already holds it; a name held by another id is refused, never
 *   merged ({@link NameTakenError}).
 * - `live` is rewritten every `refreshMs` and at once (checked every `checkMs`) when the
 *   load moved a lot ({@link largeChange}), so placement sees a burst within a check.
 */
import { readFileSync } from 'node:fs';
import os from 'node:os';
import type { Etcd3, Lease } from 'etcd3';
import type { Logger } from 'pino';
import { DsecError } from '../errors.js';
import type { HostIdentity } from './identity.js';
import { DEFAULT_LEASE_TTL_S, DEFAULT_REFRESH_MS, FleetKeys, type HostImagesRecord, type HostInfoRecord, type HostLiveRecord } from './layout.js';

/** What the daemon tells the registration about its host (closures over its subsystems). */
export interface FleetHostSource {
  /** Static facts: backends, capacity, admission limits, version. */
  info(): Pick<HostInfoRecord, 'backends' | 'capacity' | 'admission' | 'defaults' | 'version'>;
  /** The load that placement reads: sandboxes by state, admitted sums, warm pools, jobs, untagged ids. */
  load(): Pick<HostLiveRecord, 'sandboxes' | 'admitted' | 'warm_pools' | 'jobs' | 'untagged'>;
  /** Image references present on the host. */
  images(): Promise<HostImagesRecord['images']>;
}

/** Settings of a registration. */
export interface RegistrationOptions {
  etcd: Etcd3;
  keys: FleetKeys;
  identity: HostIdentity;
  /** Host name (`--host-name`). */
  name: string;
  /** `https://ADDR:PORT` gateways reach the host at (`--advertise`). */
  advertise: string;
  /** `--host-label k=v` pairs. */
  labels: Record<string, string>;
  /** Lease TTL, s (default {@link DEFAULT_LEASE_TTL_S}). */
  leaseTtlS?: number;
  /** `live` is rewritten at least this often, ms (default {@link DEFAULT_REFRESH_MS}). */
  refreshMs?: number;
  /** The load is compared with the last written one this often, ms (default {@link DEFAULT_CHECK_MS}). */
  checkMs?: number;
  source: FleetHostSource;
  log: Logger;
}

/** The load is checked for a large change every 250 ms (a SQLite count and a few sums). */
export const DEFAULT_CHECK_MS = 250;
export { DEFAULT_LEASE_TTL_S, DEFAULT_REFRESH_MS };
/** Back-off between registration attempts while etcd is unreachable: from 250 ms doubling to 5 s (about the lease TTL). */
const RETRY_MIN_MS = 250;
const RETRY_MAX_MS = 5000;
/** While a name is held by another id, the claim is tried again this often: 30 s (the other host may be forgotten by an operator). */
const REFUSED_RETRY_MS = 30_000;

/** Where a registration stands (`dsec host info`'s `fleet.state`). */
export type RegistrationState = 'connecting' | 'registered' | 'refused' | 'lost' | 'stopped';

/** A host name held in etcd by another host id. */
export class NameTakenError extends DsecError {
  constructor(readonly hostName: string, readonly heldBy: string, readonly ourId: string) {
    super('FailedPrecondition', `host name ${hostName} is registered in the fleet by host id ${heldBy}, not by this host (id ${ourId}); `
      + 'give this dsecd another --host-name, or remove the other registration if that host is gone for good (dsec host forget NAME)');
  }
}

/**
 * Whether the load moved enough since the last written record to write at once instead
 * of at the next refresh: the admitted count changed by 4 or by 10% (whichever is more),
 * or a warm pool emptied or refilled. Pure, for tests.
 */
export function largeChange(prev: Pick<HostLiveRecord, 'admitted' | 'warm_pools'> | null, next: Pick<HostLiveRecord, 'admitted' | 'warm_pools'>): boolean {
  if (!prev) return true;
  const d = Math.abs(next.admitted.count - prev.admitted.count);
  if (d >= Math.max(4, Math.ceil(prev.admitted.count * 0.1))) return true;
  const empty = (p: HostLiveRecord['warm_pools']) => p.map((w) => `${w.image}|${w.network}|${w.ready > 0}`).sort().join(',');
  return empty(prev.warm_pools) !== empty(next.warm_pools);
}

/** Reads /proc/stat's first line: total and idle jiffies of all CPUs. */
function cpuTimes(): { total: number; idle: number } {
  try {
    const f = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
    const idle = (f[3] ?? 0) + (f[4] ?? 0);
    return { total: f.reduce((a, b) => a + b, 0), idle };
  } catch {
    return { total: 0, idle: 0 };
  }
}

/** MemAvailable of /proc/meminfo in bytes (os.freemem() when unreadable). */
export function memAvailableBytes(): number {
  try {
    const m = /^MemAvailable:\s+(\d+) kB$/m.exec(readFileSync('/proc/meminfo', 'utf8'));
    if (m) return Number(m[1]) * 1024;
  } catch { /* fall through */ }
  return os.freemem();
}

/** A host's registration; see the module comment. */
export class Registration {
  private stateNow: RegistrationState = 'connecting';
  private reasonNow: string | null = null;
  private lease: Lease | null = null;
  private leaseId: string | null = null;
  private seq = 0;
  private lastWritten: HostLiveRecord | null = null;
  private lastWriteAt = 0;
  private lastImages = '';
  private lastImagesAt = 0;
  private cpuPrev = cpuTimes();
  private timer: NodeJS.Timeout | null = null;
  private retryTimer: NodeJS.Timeout | null = null;
  private retryMs = RETRY_MIN_MS;
  private stopped = false;
  private busy: Promise<void> = Promise.resolve();
  private readonly startedAt = Date.now();
  private registeredAt: number | null = null;
  private readonly leaseTtlS: number;
  private readonly refreshMs: number;
  private readonly checkMs: number;

  constructor(private readonly o: RegistrationOptions) {
    this.leaseTtlS = o.leaseTtlS ?? DEFAULT_LEASE_TTL_S;
    this.refreshMs = o.refreshMs ?? DEFAULT_REFRESH_MS;
    this.checkMs = o.checkMs ?? DEFAULT_CHECK_MS;
  }

  /** Where the registration stands, and why when it is not registered. */
  status(): { state: RegistrationState; reason: string | null; host_id: string; name: string; tag: string; registered_at: number | null; lease_ttl_s: number } {
    return {
      state: this.stateNow, reason: this.reasonNow, host_id: this.o.identity.id, name: this.o.name, tag: this.o.identity.tag,
      registered_at: this.registeredAt, lease_ttl_s: this.leaseTtlS,
    };
  }

  /**
   * Makes the first attempt and resolves after it; later attempts run in the background.
   * Never throws: an unreachable etcd is retried with back-off, a name held by another id
   * leaves the state `refused` (logged, retried every 30 s); dsecd serves meanwhile.
   */
  async start(): Promise<void> {
    this.timer = setInterval(() => this.tick(), this.checkMs);
    this.timer.unref();
    this.busy = this.register().catch((e) => this.failed(e));
    await this.busy;
  }

  /**
   * Stops refreshing and revokes the lease, so gateways see the host leave at once (a
   * clean stop; a crash is seen at the TTL). `info` and the name claim stay. Safe to
   * call twice; never throws.
   */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    this.stopTimers();
    await this.busy.catch(() => {});
    const lease = this.lease;
    this.lease = null;
    if (lease) await lease.revoke().catch((e) => this.o.log.debug({ err: e }, 'fleet: revoking the lease failed; it lapses at its TTL'));
    this.stateNow = 'stopped';
  }

  private stopTimers(): void {
    if (this.timer) clearInterval(this.timer);
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.timer = null;
    this.retryTimer = null;
  }

  /** One registration: lease, name claim and every record, by transaction. */
  private async register(): Promise<void> {
    const { etcd, keys, name, identity } = this.o;
    this.stateNow = this.stateNow === 'registered' ? 'lost' : this.stateNow;
    const lease = etcd.lease(this.leaseTtlS, { autoKeepAlive: true });
    // A lease that cannot be granted emits `lost` as well as rejecting grant(); the rejection is handled here.
    lease.on('lost', (err) => this.onLost(lease, err));
    let leaseId: string;
    try {
      leaseId = await lease.grant();
    } catch (e) {
      lease.release();
      throw e;
    }
    const info: HostInfoRecord = {
      id: identity.id, name, tag: identity.tag, advertise: this.o.advertise, labels: this.o.labels,
      ...this.o.source.info(), started_at: this.startedAt,
    };
    const live = this.liveRecord();
    const images: HostImagesRecord = { id: identity.id, images: await this.o.source.images() };
    const puts = () => [
      etcd.put(keys.hostInfo(name)).value(JSON.stringify(info)),
      etcd.put(keys.hostLive(name)).value(JSON.stringify(live)).lease(leaseId),
      etcd.put(keys.hostImages(name)).value(JSON.stringify(images)).lease(leaseId),
    ];
    const idKey = keys.hostId(name);
    // Ours already, or free: claim it; both in one transaction with the records.
    let r = await etcd.if(idKey, 'Value', '==', identity.id).then(...puts()).commit();
    if (!r.succeeded) {
      r = await etcd.if(idKey, 'Create', '==', 0).then(etcd.put(idKey).value(identity.id), ...puts()).else(etcd.get(idKey)).commit();
    }
    if (!r.succeeded) {
      const kv = r.responses?.[0]?.response_range?.kvs?.[0];
      await lease.revoke().catch(() => lease.release());
      throw new NameTakenError(name, kv ? kv.value.toString() : '?', identity.id);
    }
    if (this.stopped) {
      await lease.revoke().catch(() => lease.release());
      return;
    }
    const was = this.stateNow;
    this.lease = lease;
    this.leaseId = leaseId;
    this.lastWritten = live;
    this.lastWriteAt = Date.now();
    this.lastImages = JSON.stringify(images.images);
    this.lastImagesAt = Date.now();
    this.stateNow = 'registered';
    this.reasonNow = null;
    this.registeredAt = Date.now();
    this.retryMs = RETRY_MIN_MS;
    this.o.log.info({ host: name, id: identity.id, tag: identity.tag, lease: leaseId, ttl_s: this.leaseTtlS, again: was === 'lost' }, 'fleet: registered');
  }

  /** The lease lapsed (etcd unreachable past the TTL, or etcd revoked it): register again. */
  private onLost(lease: Lease, err: Error): void {
    if (this.lease !== lease || this.stopped) return;
    this.lease = null;
    this.leaseId = null;
    this.stateNow = 'lost';
    this.reasonNow = `lease lost: ${err.message}`;
    this.o.log.warn({ err: err.message }, 'fleet: lease lost; registering again (the API and sandboxes keep serving)');
    this.scheduleRetry(0);
  }

  /** Records an attempt's failure and schedules the next. */
  private failed(e: unknown): void {
    if (this.stopped) return;
    if (e instanceof NameTakenError) {
      this.stateNow = 'refused';
      this.reasonNow = e.message;
      this.o.log.error(e.message);
      this.scheduleRetry(REFUSED_RETRY_MS);
      return;
    }
    if (this.stateNow !== 'lost') this.stateNow = 'connecting';
    this.reasonNow = `etcd: ${(e as Error).message}`;
    this.o.log.warn({ err: (e as Error).message, retry_ms: this.retryMs }, 'fleet: registration failed; retrying (the API and sandboxes keep serving)');
    this.scheduleRetry(this.retryMs);
    this.retryMs = Math.min(RETRY_MAX_MS, this.retryMs * 2);
  }

  private scheduleRetry(ms: number): void {
    if (this.stopped || this.retryTimer) return;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      this.busy = this.busy.then(() => this.register()).catch((e) => this.failed(e));
    }, ms);
    this.retryTimer.unref();
  }

  /** A `live` record of the load now. */
  private liveRecord(): HostLiveRecord {
    const now = cpuTimes();
    const dt = now.total - this.cpuPrev.total;
    const busy = dt > 0 ? Math.min(1, Math.max(0, 1 - (now.idle - this.cpuPrev.idle) / dt)) : 0;
    this.cpuPrev = now;
    return {
      id: this.o.identity.id, seq: this.seq++, at: Date.now(),
      ...this.o.source.load(),
      cpu: { load1: os.loadavg()[0], busy },
      memory_available_bytes: memAvailableBytes(),
    };
  }

  /** Every checkMs: write `live` when due or changed a lot, `images` when changed (checked every refresh). */
  private tick(): void {
    if (this.stopped || !this.lease || this.stateNow !== 'registered') return;
    const due = Date.now() - this.lastWriteAt >= this.refreshMs;
    const load = this.o.source.load();
    if (!due && !largeChange(this.lastWritten, load)) return;
    this.busy = this.busy.then(() => this.write(due)).catch((e) => {
      this.o.log.debug({ err: (e as Error).message }, 'fleet: refresh failed (the lease decides whether the host stays up)');
    });
  }

  private async write(checkImages: boolean): Promise<void> {
    const leaseId = this.leaseId;
    if (!leaseId || this.stopped) return;
    const { etcd, keys, name } = this.o;
    const live = this.liveRecord();
    this.lastWriteAt = Date.now();
    await etcd.put(keys.hostLive(name)).value(JSON.stringify(live)).lease(leaseId);
    this.lastWritten = live;
    if (checkImages && Date.now() - this.lastImagesAt >= this.refreshMs) {
      this.lastImagesAt = Date.now();
      const images = await this.o.source.images();
      const text = JSON.stringify(images);
      if (text !== this.lastImages) {
        await etcd.put(keys.hostImages(name)).value(JSON.stringify({ id: this.o.identity.id, images } satisfies HostImagesRecord)).lease(leaseId);
        this.lastImages = text;
      }
    }
  }
}
