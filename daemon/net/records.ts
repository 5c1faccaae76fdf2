/**
 * What sandbox networking keeps on disk across dsecd restarts, under `<root>/net`:
 * addresses each sandbox learned from its resolver (`pins/<id>.json`, written at most
 * once a second, so an address resolved before a restart stays allowed after it), and
 * the resolver's refusal count of each container (`counters/<id>.json`, written before
 * any value of it is shown, so what a client saw is never lower after a restart).
 */
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Logger } from 'pino';

/** Most learned addresses per sandbox: 4,096 (a wildcard allow over a CDN yields many; beyond that the oldest go first). */
export const MAX_PINS = 4096;

/** What `<root>/net/counters/<id>.json` holds: the resolver's refusals of one container (its cgroup id, decimal). */
interface CountersFile { cgid: string; dnsRefused: number; lastRefused: string | null }

/** A sandbox whose resolver refusals are counted. */
export interface CountedSandbox {
  id: string;
  /** Its container's cgroup id: a count is valid for the container it was made in. */
  cgid: bigint;
  dnsRefused: number;
  lastRefused: string | null;
  /** dnsRefused or lastRefused changed since they were last written. */
  countersDirty: boolean;
}

/** A sandbox with learned addresses. */
export interface PinnedSandbox {
  id: string;
  /** Learned addresses: host pattern -> address -> expiry (ms since the epoch). */
  pins: Map<string, Map<string, number>>;
  /** The pins changed since they were last written. */
  pinsDirty: boolean;
}

/** The pins and counters files of one instance. */
export class NetworkRecords {
  constructor(private readonly stateDir: string, private readonly log: Logger) {}

  /** `<root>/net/pins/<id>.json`: the addresses sandbox `id` learned from its resolver. */
  pinsFile(id: string): string {
    return path.join(this.stateDir, 'pins', `${id}.json`);
  }

  /** `<root>/net/counters/<id>.json`: the resolver's refusals of sandbox `id`'s container. */
  countersFile(id: string): string {
    return path.join(this.stateDir, 'counters', `${id}.json`);
  }

  /** The resolver's refusals recorded for this container (same cgroup id) before a restart, else zero. */
  loadCounters(id: string, cgid: bigint): { dnsRefused: number; lastRefused: string | null } {
    try {
      const raw = JSON.parse(readFileSync(this.countersFile(id), 'utf8')) as CountersFile;
      if (raw.cgid === String(cgid) && Number.isSafeInteger(raw.dnsRefused) && raw.dnsRefused >= 0) return { dnsRefused: raw.dnsRefused, lastRefused: raw.lastRefused ?? null };
    } catch { /* none */ }
    return { dnsRefused: 0, lastRefused: null };
  }

  /** Writes a sandbox's refusal count when it changed; called before any value of it is shown (see the module comment). */
  saveCounters(l: CountedSandbox): void {
    if (!l.countersDirty) return;
    const f: CountersFile = { cgid: String(l.cgid), dnsRefused: l.dnsRefused, lastRefused: l.lastRefused };
    try {
      writeFileSync(this.countersFile(l.id), JSON.stringify(f), { mode: 0o600 });
      l.countersDirty = false;
    } catch (e) {
      this.log.warn({ err: e, id: l.id }, 'writing the DNS refusal count failed');
    }
  }

  /** Loads a sandbox's learned addresses written before a restart (expired ones dropped). */
  loadPins(id: string): Map<string, Map<string, number>> {
    const out = new Map<string, Map<string, number>>();
    try {
      const raw = JSON.parse(readFileSync(this.pinsFile(id), 'utf8')) as Record<string, Record<string, number>>;
      const now = Date.now();
      for (const [host, addrs] of Object.entries(raw)) {
        const m = new Map(Object.entries(addrs).filter(([, exp]) => exp > now));
        if (m.size) out.set(host, m);
      }
    } catch { /* none */ }
    return out;
  }

  /** Writes the learned addresses of each sandbox in `live` whose pins changed since they were last written. */
  writePins(live: Iterable<PinnedSandbox>): void {
    for (const l of live) {
      if (!l.pinsDirty) continue;
      l.pinsDirty = false;
      const obj: Record<string, Record<string, number>> = {};
      for (const [h, m] of l.pins) obj[h] = Object.fromEntries(m);
      try {
        writeFileSync(this.pinsFile(l.id), JSON.stringify(obj), { mode: 0o600 });
      } catch (e) {
        this.log.warn({ err: e, id: l.id }, 'writing learned DNS addresses failed');
      }
    }
  }
}

/** Drops expired pins and keeps at most {@link MAX_PINS} (the ones expiring last). */
export function prunePins(pins: Map<string, Map<string, number>>, now: number): void {
  const all: [string, string, number][] = [];
  for (const [h, m] of pins) for (const [a, exp] of m) if (exp > now) all.push([h, a, exp]); else m.delete(a);
  if (all.length <= MAX_PINS) return;
  all.sort((x, y) => x[2] - y[2]);
  for (const [h, a] of all.slice(0, all.length - MAX_PINS)) pins.get(h)?.delete(a);
}

