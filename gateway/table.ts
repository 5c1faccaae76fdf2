/**
 * The gateway's host table: the fleet's hosts as etcd says they are, mirrored in memory
 * from the `hosts/` and `cordons/` prefixes (daemon/fleet/layout.ts), plus what this
 * gateway placed since each host last reported its load. Every decision on the hot path
 * (placement, routing an id to its host) reads this table and never etcd.
 *
 * A host is `up` while its `live` key exists (its lease is alive) and belongs to the id
 * that holds its name, `down` otherwise. Events: `up` and `down` (host name) when that
 * changes, `stale` and `fresh` when the watch of etcd goes down and comes back (the
 * table then holds the last known state: issue 21's "the view is stale").
 */
import { EventEmitter } from 'node:events';
import type { Etcd3 } from 'etcd3';
import type { Logger } from 'pino';
import { CordonRecord, FleetKeys, HostImagesRecord, HostInfoRecord, HostLiveRecord, parseRecord } from '../daemon/fleet/layout.js';
import { PrefixMirror, type MirrorChange } from '../daemon/fleet/mirror.js';
import type { PlacementHost } from './placement.js';

/** Resources a placement reserves on a host until the host's own numbers include it. */
export interface Reservation {
  count: number;
  cpus: number;
  memoryBytes: number;
  /** The create's `job` label, or null. */
  job: string | null;
}

/** One host as the gateway knows it. */
export interface HostEntry {
  name: string;
  /** The host id holding the name (`hosts/<name>/id`), or null when only other keys exist. */
  id: string | null;
  info: HostInfoRecord | null;
  live: HostLiveRecord | null;
  images: HostImagesRecord | null;
  /** Image refs and digests of `system` images, and {@link tenantImageKey}s of tenants' own (from `images`), for placement's image score and the gateway's image check. */
  imageSet: Set<string>;
  cordon: CordonRecord | null;
  /** `up`: its lease is alive; `down`: it lapsed (or the host never registered fully). */
  state: 'up' | 'down';
  /** When this gateway last saw the state change, ms since the epoch. */
  since: number;
  /** Creates this gateway has sent to the host and not yet seen answered. */
  inflight: Array<Reservation>;
  /** Creates this gateway saw succeed, with when they were sent (ms since the epoch), until the host's load includes them. */
  recent: Array<Reservation & { at: number }>;
  /** The sums of `inflight` and `recent`: what this gateway counts on the host beyond its report. */
  pending: { count: number; cpus: number; memoryBytes: number; jobs: Map<string, number> };
  /** Placement's view of the host, kept current as records and reservations change (one object per host for its life). */
  view: PlacementHost;
}

/**
 * The {@link HostEntry.imageSet} entry of tenant `tenant`'s own image `ref`: `tenant|ref`
 * (`|` occurs in no tenant or image name), so it never matches another tenant's lookup
 * or a `system` image's bare ref.
 */
export function tenantImageKey(tenant: string, ref: string): string {
  return `${tenant}|${ref}`;
}

/** The {@link HostEntry.imageSet} of a host's images record (empty for none). */
export function imageSetOf(r: HostImagesRecord | null): Set<string> {
  return new Set((r?.images ?? []).flatMap((i) => (i.tenant ? [tenantImageKey(i.tenant, i.ref)] : [i.ref, ...(i.digest ? [i.digest] : [])])));
}

/** Placement's view of a table entry: the host's records plus what this gateway has pending there. */
export function buildView(h: HostEntry): PlacementHost {
  const info = h.info, live = h.live;
  const warm = new Map<string, number>();
  for (const w of live?.warm_pools ?? []) warm.set(`${w.image.includes(':') ? w.image : `${w.image}:latest`}|${w.network}`, w.ready);
  const jobs: Record<string, number> = { ...(live?.jobs ?? {}) };
  for (const [j, n] of h.pending.jobs) jobs[j] = (jobs[j] ?? 0) + n;
  const memTotal = info?.capacity.memory_bytes ?? 0;
  return {
    name: h.name,
    up: h.state === 'up',
    cordoned: h.cordon !== null,
    backends: new Set(info?.backends ?? []),
    cap: { count: info?.admission.max_sandboxes ?? 0, cpus: info?.admission.cpus ?? 0, memoryBytes: info?.admission.memory_bytes ?? 0 },
    used: {
      count: (live?.admitted.count ?? 0) + h.pending.count,
      cpus: (live?.admitted.cpus ?? 0) + h.pending.cpus,
      memoryBytes: (live?.admitted.memory_bytes ?? 0) + h.pending.memoryBytes,
    },
    cpuBusy: live?.cpu.busy ?? 0,
    memFree: memTotal > 0 ? Math.min(1, (live?.memory_available_bytes ?? 0) / memTotal) : 0,
    images: h.imageSet,
    warm,
    jobs,
    burst: info?.labels.pool === 'burst',
  };
}

/**
 * A create this gateway saw succeed counts against its host until a `live` record the
 * host took after it arrives (then the host's own numbers include it), and for at most
 * 10 s (a host whose reports stopped). The host stamps its records with its clock, the
 * gateway its completions with its own: a fleet's clocks agree (NTP) far better than the
 * 250 ms to 2 s between a host's records. An estimate only, and it may count a create
 * twice for a moment (a report the host took while the create was in flight there, or
 * between its commit and the gateway seeing the answer, already holds it): placement
 * then sees that host a little fuller than it is; the host admits or refuses.
 */
export const RECENT_MAX_MS = 10_000;

/** The table; see the module comment. */
export class HostTable extends EventEmitter {
  readonly hosts = new Map<string, HostEntry>();
  /** Every host's placement view, by name (rebuilt when a host joins the table). */
  private views: PlacementHost[] | null = null;
  private readonly byTag = new Map<string, Set<string>>();
  /** When each reservation's create was sent (ms since the epoch; see {@link settle}). */
  private readonly sentAt = new WeakMap<Reservation, number>();
  private readonly hostMirror: PrefixMirror;
  private readonly cordonMirror: PrefixMirror;

  constructor(etcd: Etcd3, readonly keys: FleetKeys, private readonly log: Logger) {
    super();
    this.hostMirror = new PrefixMirror(etcd, keys.hosts, log);
    this.cordonMirror = new PrefixMirror(etcd, keys.cordons, log);
    this.hostMirror.on('change', (c: MirrorChange) => this.onHostKey(c));
    this.cordonMirror.on('change', (c: MirrorChange) => this.onCordonKey(c));
    for (const m of [this.hostMirror, this.cordonMirror]) {
      m.on('stale', () => this.emit('stale'));
      m.on('connected', () => {
        if (this.fresh) this.emit('fresh');
      });
    }
  }

  /** Reads etcd and starts watching (retries while etcd is unreachable). */
  async start(signal?: AbortSignal): Promise<void> {
    await Promise.all([this.hostMirror.start(signal), this.cordonMirror.start(signal)]);
  }

  /** Stops watching. */
  async close(): Promise<void> {
    await Promise.all([this.hostMirror.close(), this.cordonMirror.close()]);
  }

  /** Whether the table follows etcd now (false: the last known state, since {@link staleSince}). */
  get fresh(): boolean {
    return this.hostMirror.connected && this.cordonMirror.connected;
  }

  /** When the view went stale, ms since the epoch, or null while fresh. */
  get staleSince(): number | null {
    const a = this.hostMirror.staleSince, b = this.cordonMirror.staleSince;
    return a === null ? b : b === null ? a : Math.min(a, b);
  }

  /** Names of the hosts whose id tag is `tag` (usually one; more on a tag collision). */
  namesForTag(tag: string): string[] {
    return [...(this.byTag.get(tag) ?? [])];
  }

  /** Every host, by name. */
  list(): HostEntry[] {
    return [...this.hosts.values()].sort((a, b) => a.name.localeCompare(b.name));
  }

  private entry(name: string): HostEntry {
    let e = this.hosts.get(name);
    if (!e) {
      e = {
        name, id: null, info: null, live: null, images: null, imageSet: new Set(), cordon: null, state: 'down', since: Date.now(),
        inflight: [], recent: [], pending: { count: 0, cpus: 0, memoryBytes: 0, jobs: new Map() }, view: null as unknown as PlacementHost,
      };
      e.view = buildView(e);
      this.hosts.set(name, e);
      this.views = null;
    }
    return e;
  }

  private onHostKey(c: MirrorChange): void {
    const k = this.keys.parseHostKey(c.key);
    if (!k) return;
    const e = this.entry(k.name);
    switch (k.leaf) {
      case 'id':
        e.id = c.value ? c.value.toString() : null;
        break;
      case 'info': {
        const oldTag = e.info?.tag;
        e.info = parseRecord(HostInfoRecord, c.value);
        if (oldTag && oldTag !== e.info?.tag) this.byTag.get(oldTag)?.delete(k.name);
        if (e.info) {
          let s = this.byTag.get(e.info.tag);
          if (!s) this.byTag.set(e.info.tag, (s = new Set()));
          s.add(k.name);
        }
        break;
      }
      case 'live':
        e.live = parseRecord(HostLiveRecord, c.value);
        // The host's numbers now include what succeeded before it took them.
        if (e.live) this.prune(e, Math.max(e.live.at, Date.now() - RECENT_MAX_MS));
        break;
      case 'images':
        e.images = parseRecord(HostImagesRecord, c.value);
        e.imageSet = imageSetOf(e.images);
        break;
      default:
        return;
    }
    this.updateState(e);
    Object.assign(e.view, buildView(e));
  }

  private onCordonKey(c: MirrorChange): void {
    const name = this.keys.parseCordonKey(c.key);
    if (!name) return;
    const e = this.entry(name);
    e.cordon = parseRecord(CordonRecord, c.value);
    Object.assign(e.view, buildView(e));
  }

  /** Every host's placement view (the same objects, kept current): what a decision reads. */
  placementHosts(): PlacementHost[] {
    return (this.views ??= this.list().map((e) => e.view));
  }

  /** Adds (sign 1) or takes away (-1) a reservation from a host's pending sums and its view. */
  private count(e: HostEntry, r: Reservation, sign: 1 | -1): void {
    const p = e.pending, u = e.view.used;
    p.count += sign * r.count;
    p.cpus += sign * r.cpus;
    p.memoryBytes += sign * r.memoryBytes;
    u.count += sign * r.count;
    u.cpus += sign * r.cpus;
    u.memoryBytes += sign * r.memoryBytes;
    if (r.job !== null) {
      const n = (p.jobs.get(r.job) ?? 0) + sign * r.count;
      if (n > 0) p.jobs.set(r.job, n);
      else p.jobs.delete(r.job);
      (e.view.jobs as Record<string, number>)[r.job] = Math.max(0, (e.view.jobs[r.job] ?? 0) + sign * r.count);
    }
  }

  /**
   * Drops the recent creates sent at or before `at` (the host's numbers include them: a
   * host's report taken after a create was sent counts it once its row exists, and one
   * taken between the send and the row's insert undercounts for one report, which the
   * host's own admission makes safe: it refuses what does not fit, and the gateway places
   * the create elsewhere).
   */
  private prune(e: HostEntry, at: number): void {
    if (!e.recent.some((r) => r.at <= at)) return;
    const keep: typeof e.recent = [];
    for (const r of e.recent) {
      if (r.at <= at) this.count(e, r, -1);
      else keep.push(r);
    }
    e.recent = keep;
  }

  private updateState(e: HostEntry): void {
    const up = !!(e.live && e.info && e.id && e.live.id === e.id && e.info.id === e.id);
    const state = up ? 'up' : 'down';
    if (state === e.state) return;
    e.state = state;
    e.since = Date.now();
    if (!up) {
      e.inflight = [];
      e.recent = [];
      e.pending = { count: 0, cpus: 0, memoryBytes: 0, jobs: new Map() };
    }
    this.log.info({ host: e.name, state }, `fleet: host ${e.name} is ${state}`);
    this.emit(state, e.name);
  }

  /** Counts a create sent to `name` until {@link settle} says how it ended. */
  reserve(name: string, r: Reservation): void {
    const e = this.hosts.get(name);
    if (!e) return;
    this.sentAt.set(r, Date.now());
    e.inflight.push(r);
    this.count(e, r, 1);
  }

  /** Ends a reservation (the same object given to {@link reserve}): a create that succeeded keeps counting until the host reports it ({@link RECENT_MAX_MS}). */
  settle(name: string, r: Reservation, ok: boolean): void {
    const e = this.hosts.get(name);
    if (!e) return;
    const i = e.inflight.indexOf(r);
    if (i < 0) return;
    e.inflight.splice(i, 1);
    if (ok) {
      // Timed from the send, not the answer: a report the host took while the answer was
      // on its way already counts the sandbox (its row was written before the answer).
      // A report that arrived while the create was in flight, taken after it was sent,
      // may count it already: prune against it too, not only against the next one.
      e.recent.push({ ...r, at: this.sentAt.get(r) ?? Date.now() });
      this.prune(e, Math.max(e.live?.at ?? 0, Date.now() - RECENT_MAX_MS));
    } else this.count(e, r, -1);
  }
}
