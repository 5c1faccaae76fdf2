/**
 * Fleet-wide tenant quotas: the gateway's `[quotas]` (the shape of dsecd's: sandboxes, the
 * sum of CPU limits in cores, the sum of memory limits in bytes; `[quotas.tenants.NAME]`
 * overrides per tenant; tenant `system` has none), held against one count per tenant in
 * etcd that every gateway of the fleet reads and writes only by transaction.
 *
 * **Keys** (daemon/fleet/layout.ts FleetKeys):
 * - `<p>/v1/quotas/<tenant>/usage`: {@link Usage}, the tenant's sandboxes and creates in
 *   flight through gateways. Every change of it is a compare-and-swap on its
 *   `mod_revision`, retried on conflict at most {@link CAS_TRIES} times.
 * - `<p>/v1/quotas/<tenant>/held/<uuid>`: a reservation (a create sent or about to be sent
 *   to a host), under the reserving gateway's lease of {@link HOLD_TTL_S}.
 * - `<p>/v1/quotas/<tenant>/made/<sandbox id>`: {@link Entry} of a sandbox a create made.
 *
 * **Reserve** (before a create goes to any host): read `usage`, refuse with
 * ResourceExhausted when one more would pass the quota, else in one transaction that
 * holds only if `usage` is unchanged: `usage` + the request, and a `held` key. Two
 * gateways that read the same `usage` cannot both commit: the second transaction's
 * compare fails, it reads again and sees the first's reservation. **Created**: the `held`
 * key becomes a `made` key (the sum is unchanged). **Failed**: `usage` − the request and
 * the `held` key deleted. **Destroyed through a gateway**: `usage` − the sandbox's limits
 * and its `made` key deleted.
 *
 * **Reconciliation** ({@link FleetQuotas.reconcile}, by every gateway every
 * {@link RECONCILE_MS}): one read of every key under `quotas/` at one revision; `made`
 * keys whose host (up, and listing the tenant's sandboxes) no longer has the sandbox are
 * deleted (it died, was reaped, or was destroyed on the host's socket), and `usage` is set
 * to the sum of the `held` and `made` keys left, in a transaction that holds only if
 * `usage` is as read. Between the read and that transaction, keys change without `usage`
 * changing only by a `held` key becoming `made` (the same sum) or by a lease lapsing (a
 * lower sum), so the count written is never below the truth. So a gateway killed between
 * reserve and create leaves its reservations counted until its lease lapses
 * ({@link HOLD_TTL_S}) and the next reconciliation, after which they are free again; a
 * create it had already sent is made by its host, never acknowledged, and reaped by the
 * host at its acknowledgement deadline (gateway/idempotency.ts), so it holds no quota
 * either once its host's list no longer has it.
 *
 * While etcd cannot be reached (the host table is stale) a tenant with a quota cannot
 * create through a gateway (Unavailable): its count cannot be held. Tenants without a
 * quota are not affected, and no etcd call is made for them.
 */
import { randomUUID } from 'node:crypto';
import type { Etcd3, Lease } from 'etcd3';
import type { Logger } from 'pino';
import { z } from 'zod';
import { resourceExhausted, unavailable } from '../daemon/errors.js';
import type { FleetKeys } from '../daemon/fleet/layout.js';
import type { TenantQuota } from '../daemon/model/tenant.js';
import { SYSTEM_TENANT } from '../daemon/model/tenant.js';
import type { KeyedCreates } from './idempotency.js';
import type { HostTable } from './table.js';
import type { HostAddress, Upstreams } from './upstream.js';

/** The gateway's `[quotas]`: the default of every tenant and each named tenant's. */
export interface FleetQuotaConfig {
  default: TenantQuota;
  tenants: Record<string, TenantQuota>;
}

/** Lease of a gateway's reservations, s: they outlive a killed gateway by at most this (kept alive at a third of it). */
export const HOLD_TTL_S = 10;
/** Compare-and-swap attempts of one change before it answers Unavailable (each conflict is another gateway's change, so 32 in a row mean heavy contention). */
export const CAS_TRIES = 32;
/** Each gateway reconciles the counts this often, ms. */
export const RECONCILE_MS = 10_000;

/** `usage`: what a tenant's sandboxes and creates in flight sum to. */
const Usage = z.object({ count: z.number().int().min(0), cpus: z.number().min(0), memory_bytes: z.number().min(0) });
type Usage = z.infer<typeof Usage>;
/** A `held` or `made` key's value: one create's share (`host` once made). */
const Entry = z.object({ count: z.number().int().min(1), cpus: z.number().min(0), memory_bytes: z.number().min(0), host: z.string().optional() });
type Entry = z.infer<typeof Entry>;

const ZERO: Usage = { count: 0, cpus: 0, memory_bytes: 0 };

function parse<S extends z.ZodType>(s: S, raw: Buffer | undefined): z.infer<S> | null {
  if (!raw) return null;
  try {
    const r = s.safeParse(JSON.parse(raw.toString('utf8')));
    return r.success ? r.data : null;
  } catch {
    return null;
  }
}

/** `a` plus `sign` times `b`, never below 0. */
function add(a: Usage, b: Omit<Entry, 'host'>, sign: 1 | -1): Usage {
  return {
    count: Math.max(0, a.count + sign * b.count),
    cpus: Math.max(0, Math.round((a.cpus + sign * b.cpus) * 1000) / 1000),
    memory_bytes: Math.max(0, a.memory_bytes + sign * b.memory_bytes),
  };
}

/** One reservation; see {@link FleetQuotas.reserve}. Calls after the first of created/done are ignored. */
export interface QuotaHold {
  /** The create made `ids` on `host`: the reservation becomes theirs. */
  created(host: string, ids: string[]): Promise<void>;
  /** The create is over: releases the reservation unless {@link created} took it. */
  done(): Promise<void>;
}

/** See the module comment. */
export class FleetQuotas {
  private lease: { lease: Lease; id: Promise<string> } | null = null;
  /** Per tenant, this gateway's changes one after another (fewer conflicts among its own requests). */
  private readonly chains = new Map<string, Promise<unknown>>();
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly etcd: Etcd3, private readonly keys: FleetKeys, private readonly cfg: FleetQuotaConfig,
    private readonly table: HostTable, private readonly upstreams: Upstreams, private readonly log: Logger,
  ) {}

  /** Whether any quota is configured (else nothing is read or written). */
  get any(): boolean {
    const set = (q: TenantQuota) => q.sandboxes !== null || q.cpus !== null || q.memoryBytes !== null;
    return set(this.cfg.default) || Object.values(this.cfg.tenants).some(set);
  }

  /** The quota of `tenant` and its config key, or null when it has none. */
  quotaOf(tenant: string): { q: TenantQuota; key: string } | null {
    if (tenant === SYSTEM_TENANT) return null;
    const named = this.cfg.tenants[tenant];
    const q = named ?? this.cfg.default;
    if (q.sandboxes === null && q.cpus === null && q.memoryBytes === null) return null;
    return { q, key: named ? `quotas.tenants.${tenant}` : 'quotas' };
  }

  /** Starts the periodic reconciliation (when any quota is set). */
  start(): void {
    if (!this.any) return;
    this.timer = setInterval(() => {
      void this.reconcile().catch((e) => this.log.warn({ err: e }, 'quota reconciliation failed; trying again later'));
    }, RECONCILE_MS);
    this.timer.unref();
  }

  /** Stops reconciling and revokes the reservations' lease (a clean stop frees them at once). */
  async close(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    const l = this.lease;
    this.lease = null;
    if (l) await l.lease.revoke().catch(() => l.lease.release());
  }

  private usageKey(tenant: string): string {
    return `${this.keys.quotas}${tenant}/usage`;
  }

  private serial<T>(tenant: string, f: () => Promise<T>): Promise<T> {
    const prev = this.chains.get(tenant) ?? Promise.resolve();
    const next = prev.then(f, f);
    const tail = next.catch(() => {});
    this.chains.set(tenant, tail);
    void tail.then(() => {
      if (this.chains.get(tenant) === tail) this.chains.delete(tenant);
    });
    return next;
  }

  private leaseId(): Promise<string> {
    if (!this.lease) {
      const lease = this.etcd.lease(HOLD_TTL_S, { autoKeepAlive: true });
      const id = lease.grant();
      this.lease = { lease, id };
      lease.on('lost', () => {
        if (this.lease?.lease === lease) this.lease = null;
      });
      id.catch(() => {
        if (this.lease?.lease === lease) this.lease = null;
      });
    }
    return this.lease.id;
  }

  /**
   * One compare-and-swap of `usage`: `change` gets the current usage and returns the new
   * one with the other operations of the transaction (and their compares), or null for
   * no change. Retried on conflict.
   * @throws DsecError from `change`, or Unavailable when etcd cannot be reached or the tries run out.
   */
  private async cas(tenant: string, change: (u: Usage) => Promise<{ next: Usage; ops: Array<ReturnType<Etcd3['put']> | ReturnType<Etcd3['delete']>>; compares?: Array<[string, 'Mod' | 'Version', string | number]> } | null>): Promise<void> {
    const k = this.usageKey(tenant);
    for (let i = 0; i < CAS_TRIES; i++) {
      let rev = '0';
      let u = ZERO;
      try {
        const kv = (await this.etcd.get(k).exec()).kvs[0];
        if (kv) {
          rev = kv.mod_revision;
          u = parse(Usage, kv.value) ?? ZERO;
        }
      } catch (e) {
        throw unavailable(`tenant ${tenant}'s fleet-wide quota is counted in etcd, which cannot be reached now (${(e as Error).message}); retry later`, e);
      }
      const c = await change(u);
      if (!c) return;
      try {
        let txn = this.etcd.if(k, 'Mod', '==', rev);
        for (const [key, col, v] of c.compares ?? []) txn = txn.and(key, col, col === 'Version' ? '>' : '==', v);
        const r = await txn.then(this.etcd.put(k).value(JSON.stringify(c.next)), ...c.ops).commit();
        if (r.succeeded) return;
      } catch (e) {
        throw unavailable(`tenant ${tenant}'s fleet-wide quota is counted in etcd, which cannot be reached now (${(e as Error).message}); retry later`, e);
      }
      await new Promise((r) => setTimeout(r, Math.random() * 5 * (i + 1)));
    }
    throw unavailable(`tenant ${tenant}'s fleet-wide quota count changed under ${CAS_TRIES} tries in a row (many gateways creating for it at once); retry`);
  }

  /**
   * Reserves `count` sandboxes of `cpus` cores and `memoryBytes` bytes each for `tenant`,
   * before the create is sent to a host; null when the tenant has no quota.
   * @param force count it without refusing (a keyed retry whose first create may exist: it is never refused, and counted once)
   * @param fresh whether the gateway's view of etcd is live
   * @throws DsecError ResourceExhausted naming the quota, its value and the tenant's use
   *   (dsecd's wording, daemon/sandbox/admission.ts); Unavailable when etcd cannot be reached.
   */
  async reserve(tenant: string, count: number, cpus: number, memoryBytes: number, fresh: boolean, force = false): Promise<QuotaHold | null> {
    const qk = this.quotaOf(tenant);
    if (!qk) return null;
    if (!fresh) throw unavailable(`tenant ${tenant} has a fleet-wide quota (${qk.key} in the gateway's config), counted in etcd, which cannot be reached now; retry when it is back`);
    const { q, key } = qk;
    const want: Entry = { count, cpus: cpus * count, memory_bytes: memoryBytes * count };
    const held = `${this.keys.quotas}${tenant}/held/${randomUUID()}`;
    const lease = await this.leaseId().catch((e) => {
      throw unavailable(`tenant ${tenant}'s fleet-wide quota is counted in etcd, which cannot be reached now (${(e as Error).message}); retry later`, e);
    });
    const more = count > 1 ? `${count} new sandboxes` : 'a new sandbox';
    await this.serial(tenant, () => this.cas(tenant, async (use) => {
      if (!force && q.sandboxes !== null && use.count + count > q.sandboxes) {
        throw resourceExhausted(`tenant ${tenant} is at its fleet-wide quota of ${q.sandboxes} sandboxes (${key}.sandboxes): it has ${use.count}, and ${more} would make ${use.count + count}; destroy some first`);
      }
      if (!force && q.cpus !== null && use.cpus + want.cpus > q.cpus) {
        throw resourceExhausted(`tenant ${tenant}'s CPU limits would total ${use.cpus + want.cpus} cores, over its fleet-wide quota of ${q.cpus} (${key}.cpus; in use: ${use.cpus} cores); ask for fewer cpus or destroy sandboxes`);
      }
      if (!force && q.memoryBytes !== null && use.memory_bytes + want.memory_bytes > q.memoryBytes) {
        throw resourceExhausted(`tenant ${tenant}'s memory limits would total ${use.memory_bytes + want.memory_bytes} bytes, over its fleet-wide quota of ${q.memoryBytes} (${key}.memory_bytes; in use: ${use.memory_bytes} bytes); ask for less memory_bytes or destroy sandboxes`);
      }
      return { next: add(use, want, 1), ops: [this.etcd.put(held).value(JSON.stringify(want)).lease(lease)] };
    }));
    let over = false;
    return {
      created: async (host, ids) => {
        if (over) return;
        over = true;
        await this.serial(tenant, () => this.commit(tenant, held, want, host, ids)).catch((e) => this.log.warn({ err: e, tenant }, 'quota: recording a create failed; reconciliation corrects the count'));
      },
      done: async () => {
        if (over) return;
        over = true;
        await this.serial(tenant, () => this.release(tenant, held, want)).catch((e) => this.log.warn({ err: e, tenant }, 'quota: releasing a reservation failed; its lease and reconciliation free it'));
      },
    };
  }

  /** The reservation `held` becomes `made` keys of `ids` (its share split among them); one already recorded (a replay) gives its share back. */
  private async commit(tenant: string, held: string, want: Entry, host: string, ids: string[]): Promise<void> {
    const each: Entry = { count: 1, cpus: want.cpus / want.count, memory_bytes: want.memory_bytes / want.count, host };
    const made = (id: string) => `${this.keys.quotas}${tenant}/made/${id}`;
    await this.cas(tenant, async (use) => {
      const heldKv = (await this.etcd.get(held).exec()).kvs[0];
      const fresh: string[] = [];
      for (const id of ids) if (!(await this.etcd.get(made(id)).exec()).kvs[0]) fresh.push(id);
      // With its reservation still there, `use` counts it: give back what is not a new sandbox. Without (its lease lapsed): count the new ones.
      const next = heldKv ? add(use, { count: want.count - fresh.length, cpus: each.cpus * (want.count - fresh.length), memory_bytes: each.memory_bytes * (want.count - fresh.length) }, -1)
        : add(use, { count: fresh.length, cpus: each.cpus * fresh.length, memory_bytes: each.memory_bytes * fresh.length }, 1);
      const compares: Array<[string, 'Mod' | 'Version', string | number]> = heldKv ? [[held, 'Mod', heldKv.mod_revision]] : [[held, 'Mod', 0]];
      for (const id of fresh) compares.push([made(id), 'Mod', 0]);
      return { next, compares, ops: [this.etcd.delete().key(held), ...fresh.map((id) => this.etcd.put(made(id)).value(JSON.stringify(each)))] };
    });
  }

  /** Gives a reservation back (its create made nothing). */
  private async release(tenant: string, held: string, want: Entry): Promise<void> {
    await this.cas(tenant, async (use) => {
      const kv = (await this.etcd.get(held).exec()).kvs[0];
      // Gone: its lease lapsed, and reconciliation takes (or took) it out of `usage`.
      if (!kv) return null;
      return { next: add(use, want, -1), compares: [[held, 'Mod', kv.mod_revision]], ops: [this.etcd.delete().key(held)] };
    });
  }

  /**
   * Sandbox `id` of `tenant` was destroyed through this gateway: its share is freed. A
   * sandbox the quota never counted is ignored. Never throws (reconciliation corrects a
   * failure).
   */
  async destroyed(tenant: string, id: string): Promise<void> {
    if (!this.quotaOf(tenant)) return;
    const made = `${this.keys.quotas}${tenant}/made/${id}`;
    await this.serial(tenant, () => this.cas(tenant, async (use) => {
      const kv = (await this.etcd.get(made).exec()).kvs[0];
      const e = kv ? parse(Entry, kv.value) : null;
      if (!kv || !e) return null;
      return { next: add(use, e, -1), compares: [[made, 'Mod', kv.mod_revision]], ops: [this.etcd.delete().key(made)] };
    })).catch((e) => this.log.warn({ err: e, tenant, id }, 'quota: freeing a destroyed sandbox failed; reconciliation corrects the count'));
  }

  /**
   * Sets every tenant's `usage` to what its keys sum to, after deleting the `made` keys of
   * sandboxes their (up) host no longer has; see the module comment for why a count so
   * written is never too low.
   * @throws when etcd cannot be read; a tenant whose `usage` changed meanwhile is left to the next round.
   */
  async reconcile(): Promise<void> {
    if (!this.table.fresh) return;
    const snap = await this.etcd.getAll().prefix(this.keys.quotas).exec();
    const tenants = new Map<string, { usage: { rev: string; u: Usage } | null; entries: Map<string, Entry>; made: Map<string, Entry> }>();
    for (const kv of snap.kvs) {
      const rest = kv.key.toString('utf8').slice(this.keys.quotas.length).split('/');
      const [tenant, kind, name] = rest;
      let t = tenants.get(tenant);
      if (!t) tenants.set(tenant, (t = { usage: null, entries: new Map(), made: new Map() }));
      if (kind === 'usage') t.usage = { rev: kv.mod_revision, u: parse(Usage, kv.value) ?? ZERO };
      else if ((kind === 'held' || kind === 'made') && name) {
        const e = parse(Entry, kv.value);
        if (!e) continue;
        t.entries.set(`${kind}/${name}`, e);
        if (kind === 'made') t.made.set(name, e);
      }
    }
    for (const [tenant, t] of tenants) {
      const gone = await this.goneSandboxes(tenant, t.made);
      let sum = ZERO;
      for (const [k, e] of t.entries) if (!gone.has(k.slice(5)) || !k.startsWith('made/')) sum = add(sum, e, 1);
      const cur = t.usage?.u ?? ZERO;
      if (!gone.size && cur.count === sum.count && cur.cpus === sum.cpus && cur.memory_bytes === sum.memory_bytes) continue;
      const k = this.usageKey(tenant);
      const r = await this.etcd.if(k, 'Mod', '==', t.usage?.rev ?? '0')
        .then(this.etcd.put(k).value(JSON.stringify(sum)), ...[...gone].map((id) => this.etcd.delete().key(`${this.keys.quotas}${tenant}/made/${id}`))).commit();
      if (r.succeeded) this.log.info({ tenant, was: cur, now: sum, gone: gone.size }, 'quota: count reconciled');
    }
  }

  /** The ids among `made` that their host, up and answering, no longer lists for `tenant` (or whose host left the fleet). */
  private async goneSandboxes(tenant: string, made: Map<string, Entry>): Promise<Set<string>> {
    const gone = new Set<string>();
    const byHost = new Map<string, string[]>();
    for (const [id, e] of made) {
      const h = e.host ?? '';
      byHost.set(h, [...(byHost.get(h) ?? []), id]);
    }
    for (const [name, ids] of byHost) {
      const h = this.table.hosts.get(name);
      if (!h) {
        for (const id of ids) gone.add(id);
        continue;
      }
      if (h.state !== 'up' || !h.info) continue;
      const address: HostAddress = { name, advertise: h.info.advertise };
      try {
        const r = await this.upstreams.json<{ sandboxes?: Array<{ id?: string; state?: string }> }>(address, { method: 'GET', path: '/v1/sandboxes', identity: { tenant, role: 'user', tokenId: null } });
        if (r.status !== 200 || !Array.isArray(r.body?.sandboxes)) continue;
        const live = new Set(r.body.sandboxes.filter((s) => s.state !== 'destroyed').map((s) => s.id));
        for (const id of ids) if (!live.has(id)) gone.add(id);
      } catch { /* unreachable now: its sandboxes stay counted */ }
    }
    return gone;
  }
}

/**
 * The reservation of one create of `tenant` through a gateway (null without a quota). A
 * keyed create whose key a gateway has already sent somewhere is counted without being
 * refused: it may be the retry of a create that exists, which its host replays (and
 * {@link QuotaHold.created} then gives the share back).
 * @throws DsecError as {@link FleetQuotas.reserve}.
 */
export async function reserveCreate(quotas: FleetQuotas, keyed: KeyedCreates, fresh: boolean, tenant: string, cpus: number, memoryBytes: number, key: string | null): Promise<QuotaHold | null> {
  if (!quotas.quotaOf(tenant)) return null;
  const retry = key !== null && fresh && (await keyed.claim(tenant, key, null)) !== null;
  return quotas.reserve(tenant, 1, cpus, memoryBytes, fresh, retry);
}
