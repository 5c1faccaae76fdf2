/**
 * Keyed creates and delivery acknowledgements through gateways.
 *
 * **Which host a key went to.** A gateway is stateless, and a client's retry may reach
 * another gateway, whose placement could choose another host: the host that ran the
 * first create remembers the key (daemon/sandbox/create-records.ts), the others do not.
 * So the first gateway to see a key claims it in etcd, by transaction
 * (`<p>/v1/idempotency/<tenant>/<sha256(key)>` = host name, created only if absent), and
 * every gateway sends that key's create to the host the record names. When that host
 * answers a refusal (it holds no such key: a host that holds one replays it before
 * admission), the create moves on and the record is moved with it (compare-and-swap on
 * the host name). When the named host cannot be reached, the answer is Unavailable naming
 * it: the first create may live there, and a second one elsewhere would not be the same
 * sandbox. Records live on one lease of the gateway's, granted for
 * {@link KEY_RECORD_TTL_S} (the hosts' default key lifetime) and replaced hourly, so a
 * record outlives its use by at most a day and never needs a sweep.
 *
 * While etcd cannot be reached (the table's view is stale) a keyed create is placed
 * without a record: a retry through the same gateway still finds the host from this
 * gateway's memory, one through another gateway may create a second sandbox. The
 * unacknowledged one of the two is reaped by its host.
 *
 * **Acknowledgements.** Creates are sent to hosts with `x-dsec-create-ack: gateway`; once
 * the gateway wrote an answer whole to its client it reports the sandboxes to their host
 * (`POST /v1/sandboxes:ack`), batched per host over {@link ACK_FLUSH_MS}. A gateway that
 * dies first reports nothing, and the host reaps those sandboxes at its deadline (60 s by
 * default), unless a retry of the same key is answered and delivered by another gateway,
 * or a call names the sandbox (its client knows it). So the one window in which a client
 * saw an answer its host was not told of is the few milliseconds between delivery and
 * the report, closed by the client's first call on the sandbox within the deadline.
 */
import { createHash } from 'node:crypto';
import type { Etcd3, Lease } from 'etcd3';
import type { Logger } from 'pino';
import type { FleetKeys } from '../daemon/fleet/layout.js';
import type { CallIdentity, HostAddress, Upstreams } from './upstream.js';

/** Lifetime of a key record, seconds: 24 h, the hosts' default `idempotency_key_ttl_s`. */
export const KEY_RECORD_TTL_S = 86_400;
/** A record lease is replaced after 1 h, so records live between 23 and 24 h. */
const LEASE_RENEW_MS = 3_600_000;
/** Acknowledgements are sent this long (ms) after the first one queued: one request per host and caller for all delivered in that time. */
export const ACK_FLUSH_MS = 5;
/** Keys remembered in memory per gateway (for retries while etcd cannot be reached). */
const LOCAL_KEYS_MAX = 100_000;

/** The claim of a key: the host its create goes to, and whether this call made the record. */
export interface KeyClaim {
  host: string;
  created: boolean;
}

/** See the module comment. */
export class KeyedCreates {
  private lease: { lease: Lease; id: string; at: number } | null = null;
  private readonly local = new Map<string, string>();
  private readonly pending = new Map<string, { address: HostAddress; identity: CallIdentity; ids: string[] }>();
  private timer: NodeJS.Timeout | null = null;

  constructor(private readonly etcd: Etcd3, private readonly keys: FleetKeys, private readonly upstreams: Upstreams, private readonly log: Logger, private readonly fresh: () => boolean) {}

  private recordKey(tenant: string, key: string): string {
    return this.keys.idempotency(tenant, createHash('sha256').update(key).digest('hex'));
  }

  private async leaseId(): Promise<string> {
    if (this.lease && Date.now() - this.lease.at < LEASE_RENEW_MS) return this.lease.id;
    const lease = this.etcd.lease(KEY_RECORD_TTL_S, { autoKeepAlive: false });
    const id = await lease.grant();
    // The old lease is left to expire: its records stay valid until then.
    this.lease = { lease, id, at: Date.now() };
    return id;
  }

  /**
   * Claims `key` for `host` unless a record names another host already (with `host`
   * null, only reads the record).
   * @returns the claim, or null when etcd could not be asked (then this gateway's memory answers, if it knows the key).
   */
  async claim(tenant: string, key: string, host: string | null): Promise<KeyClaim | null> {
    const mem = `${tenant}\0${key}`;
    const known = this.local.get(mem);
    if (!this.fresh()) return known ? { host: known, created: false } : null;
    const k = this.recordKey(tenant, key);
    try {
      if (host === null) {
        // No host to claim it for (none fits): only whether an earlier create went somewhere.
        const v = await this.etcd.get(k).string();
        return v ? { host: v, created: false } : null;
      }
      const lease = await this.leaseId();
      const r = await this.etcd.if(k, 'Create', '==', 0).then(this.etcd.put(k).value(host).lease(lease)).else(this.etcd.get(k)).commit();
      const owner = r.succeeded ? host : r.responses[0]?.response_range?.kvs[0]?.value.toString('utf8') ?? host;
      this.remember(mem, owner);
      return { host: owner, created: r.succeeded };
    } catch (e) {
      this.log.warn({ err: e }, 'idempotency record not claimed in etcd; placing without it');
      return known ? { host: known, created: false } : null;
    }
  }

  /** Moves the record of `key` from `from` to `to` (the first host refused the create). Best effort: a failure is logged. */
  async move(tenant: string, key: string, from: string, to: string): Promise<void> {
    this.remember(`${tenant}\0${key}`, to);
    if (!this.fresh()) return;
    const k = this.recordKey(tenant, key);
    try {
      const lease = await this.leaseId();
      await this.etcd.if(k, 'Value', '==', from).then(this.etcd.put(k).value(to).lease(lease)).commit();
    } catch (e) {
      this.log.warn({ err: e }, 'idempotency record not moved in etcd');
    }
  }

  private remember(mem: string, host: string): void {
    if (this.local.size >= LOCAL_KEYS_MAX) this.local.delete(this.local.keys().next().value as string);
    this.local.set(mem, host);
  }

  /** Queues the acknowledgement of sandboxes whose create answer was delivered. */
  ack(address: HostAddress, identity: CallIdentity, ids: string[]): void {
    if (!ids.length) return;
    const k = `${address.name}\0${identity.tenant}\0${identity.role}\0${identity.tokenId ?? ''}`;
    const p = this.pending.get(k);
    if (p) p.ids.push(...ids);
    else this.pending.set(k, { address, identity, ids: [...ids] });
    this.timer ??= setTimeout(() => {
      this.timer = null;
      void this.flush();
    }, ACK_FLUSH_MS);
  }

  /** Sends the queued acknowledgements, one request per host and caller; a failed one is queued again (the host's deadline bounds how long that matters). */
  async flush(): Promise<void> {
    const batch = [...this.pending.values()];
    this.pending.clear();
    await Promise.all(batch.map(async (b) => {
      const text = JSON.stringify({ ids: b.ids });
      try {
        const res = await this.upstreams.request(b.address, {
          method: 'POST', path: '/v1/sandboxes:ack', headers: { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) }, body: text, identity: b.identity,
        });
        res.resume();
        if ((res.statusCode ?? 0) >= 500) throw new Error(`status ${res.statusCode}`);
      } catch (e) {
        this.log.warn({ err: e, host: b.address.name }, 'acknowledging creates failed; trying again');
        await new Promise((r) => setTimeout(r, 500));
        this.ack(b.address, b.identity, b.ids);
      }
    }));
  }

  /** Sends what is queued now (at close). */
  async close(): Promise<void> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    await this.flush();
  }
}
