/**
 * Host-rule names resolved by dsecd itself (in the host netns), shared by every sandbox
 * whose rules name them, and refreshed on their DNS TTL.
 *
 * TTLs are clamped to [ttlMinS, ttlMaxS] (`[network] ttl_min_s`/`ttl_max_s`, default
 * 30 s and 1 h): a TTL of 0 or a few seconds (common behind CDNs) would otherwise have
 * dsecd re-query continuously, and a TTL of a day would keep a moved service's old
 * address allowed, and its new one denied, for that long. A failed lookup keeps the
 * previous addresses (a resolver outage does not cut sandboxes off from what they were
 * allowed) and is retried after ttlMinS; a name that does not exist has no addresses
 * and is retried after ttlMinS too.
 */
import { Resolver } from 'node:dns/promises';
import type { Logger } from 'pino';

/** Resolution timeout per try: 2 s, 2 tries (node's c-ares; the host's resolv.conf style). */
const TIMEOUT_MS = 2000;
const TRIES = 2;
/** How often due names are looked at: every 5 s (the clamp's floor is 30 s, so refreshes are at most 5 s late). */
const SWEEP_MS = 5000;

/** One name's current addresses and when to look again. */
interface Entry {
  addresses: string[];
  refreshAt: number;
  /** The lookup in flight, if any. */
  pending: Promise<void> | null;
  /** Ever resolved (or tried): a first lookup is awaited by whoever asks. */
  tried: boolean;
}

/** Options of {@link HostNames}. */
export interface HostNamesOptions {
  /** DNS servers (`ip` or `ip:port`); null: the host's resolv.conf. */
  servers: string[] | null;
  ttlMinS: number;
  ttlMaxS: number;
  log: Logger;
  /** Called after a name's address set changed (not on every refresh). */
  onChange(name: string): void;
  /** How often due names are looked at, ms; default {@link SWEEP_MS} (tests use less). */
  sweepMs?: number;
}

/** The shared name cache; see the module comment. */
export class HostNames {
  private readonly resolver = new Resolver({ timeout: TIMEOUT_MS, tries: TRIES });
  private readonly entries = new Map<string, Entry>();
  private timer: NodeJS.Timeout | null = null;

  constructor(private readonly o: HostNamesOptions) {
    if (o.servers) this.resolver.setServers(o.servers);
  }

  /** Starts the refresh sweep. */
  start(): void {
    this.timer ??= setInterval(() => this.sweep(), this.o.sweepMs ?? SWEEP_MS);
    this.timer.unref();
  }

  /** Stops the sweep. */
  close(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** The addresses known now for `name` (lowercase), empty before the first lookup finished. */
  addresses(name: string): readonly string[] {
    return this.entries.get(name)?.addresses ?? [];
  }

  /**
   * Makes sure every name is tracked and resolved at least once; resolves when each
   * first lookup finished (successful or not).
   */
  async ensure(names: readonly string[]): Promise<void> {
    const waits: Promise<void>[] = [];
    for (const n of names) {
      let e = this.entries.get(n);
      if (!e) {
        e = { addresses: [], refreshAt: 0, pending: null, tried: false };
        this.entries.set(n, e);
      }
      if (!e.tried) waits.push(this.lookup(n, e));
    }
    await Promise.all(waits);
  }

  /** Looks `name` up again now (whatever its TTL says); resolves when done. A name not tracked is ignored. */
  refresh(name: string): Promise<void> {
    const e = this.entries.get(name);
    return e ? this.lookup(name, e) : Promise.resolve();
  }

  /** Forgets names no sandbox uses any more. */
  retain(used: ReadonlySet<string>): void {
    for (const n of [...this.entries.keys()]) if (!used.has(n)) this.entries.delete(n);
  }

  private sweep(): void {
    const now = Date.now();
    for (const [n, e] of this.entries) if (e.refreshAt <= now && !e.pending) void this.lookup(n, e);
  }

  /** Resolves A and AAAA of one name and updates its entry. */
  private lookup(name: string, e: Entry): Promise<void> {
    if (e.pending) return e.pending;
    const clamp = (ttl: number) => Math.min(this.o.ttlMaxS, Math.max(this.o.ttlMinS, ttl));
    const one = async (f: 4 | 6) => {
      try {
        return { ok: true, recs: f === 4 ? await this.resolver.resolve4(name, { ttl: true }) : await this.resolver.resolve6(name, { ttl: true }) };
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        // "No such name" and "no records of that type" are answers; anything else is an outage.
        return { ok: code === 'ENOTFOUND' || code === 'ENODATA', recs: [] as { address: string; ttl: number }[], code };
      }
    };
    e.pending = (async () => {
      const [a, b] = await Promise.all([one(4), one(6)]);
      e.tried = true;
      const recs = [...a.recs, ...b.recs];
      if (!a.ok && !b.ok) {
        this.o.log.warn({ name, error: (a as { code?: string }).code }, 'host rule lookup failed; keeping its previous addresses');
        e.refreshAt = Date.now() + this.o.ttlMinS * 1000;
        return;
      }
      const next = [...new Set(recs.map((r) => r.address))].sort();
      const ttl = recs.length ? clamp(Math.min(...recs.map((r) => r.ttl))) : this.o.ttlMinS;
      e.refreshAt = Date.now() + ttl * 1000;
      const changed = next.join(',') !== e.addresses.join(',');
      e.addresses = next;
      if (changed) this.o.onChange(name);
    })().finally(() => { e.pending = null; });
    return e.pending;
  }
}
