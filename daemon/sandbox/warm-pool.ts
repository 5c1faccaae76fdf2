/**
 * Warm pools: pre-created container sandbox shells, so a create that matches one is
 * answered by claiming a shell instead of running the runtime (DESIGN.md §6, burst
 * creation).
 *
 * A shell is an ordinary running container sandbox (row, uid range, cgroup, overlay,
 * runtime container, agent connected) created from a configured entry (`[[pool.entries]]`:
 * image, network mode, count) with the default security profile and no user-visible
 * settings. It carries the label {@link POOL_LABEL}, which keeps it out of listings, bulk
 * selectors and admission counts. Shells are keyed by what a create cannot change on a
 * running sandbox ({@link shellKey}): the image's content, the seccomp profile in force,
 * the resolved filesystem options, the network mode and the writable-layer quota. A create
 * whose key matches a ready shell claims it; whatever else the request names (labels,
 * env, TTL, idle timeout, CPU/memory/pids limits, network rules) is applied at the claim,
 * so a claimed sandbox is indistinguishable from a fresh one: its id, uid range and
 * writable layer were never seen by anyone, nothing ran in it, and its limits, env and
 * creation time are the request's (daemon/sandbox/create.ts `claim`).
 *
 * Refill is low priority: a pool below its count creates shells in the background, at
 * most {@link WarmPoolConfig.fillConcurrency} at a time, and only once no user create is
 * in flight and none has started or ended for {@link QUIET_MS}, so a burst is never slowed
 * by its own refill (between two creates of a burst there is at most an exec).
 *
 * Restart safety: a shell is claimed by one row update (its labels become the request's),
 * so after a crash every row is either a user sandbox (adopted) or a shell, and shells of a
 * previous dsecd are destroyed at start. Shutdown destroys the shells too.
 */
import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import type { SandboxRecord } from '../model/sandbox.js';

/** Label every pool shell carries; its value is the shell's {@link shellKey} hash. */
export const POOL_LABEL = 'dsec.pool';

/** Whether a row is a warm-pool shell not yet claimed. */
export function isPoolShell(sb: Pick<SandboxRecord, 'labels'>): boolean {
  return sb.labels[POOL_LABEL] !== undefined;
}

/** One `[[pool.entries]]` table: which shells to keep ready. */
export interface WarmPoolEntry {
  /** Image reference, as a create names it (resolved to its content when the pool fills). */
  image: string;
  /** Shells kept ready, 1..4,096. */
  size: number;
  /** Network mode of the shells: `none` (the default; loopback only), `allow` or `open` (rules are applied at claim). */
  network: 'none' | 'allow' | 'open';
}

/** `[pool]`: the warm pools. No entries (the default): no pools, every create runs the runtime. */
export interface WarmPoolConfig {
  entries: WarmPoolEntry[];
  /**
   * Shells created at once while filling, across all pools; default 2 (one per core here):
   * enough to fill while the host is idle, few enough to leave a core to the API.
   */
  fillConcurrency: number;
}

/** What a shell is made of, as far as its key goes. */
export interface ShellKeyInput {
  /** `name:tag` of the image. */
  image: string;
  /** Layer digests, lowest first. */
  layers: readonly string[];
  /**
   * The image's process defaults (layer-store.ts ImageManifest.config). With the layers
   * they make the key the image's content, not its name: image names are per tenant, and
   * a tenant's `app:v1` claims a shell only when it is exactly what the shell was made of.
   */
  config: unknown;
  /** sha256 of the seccomp profile in force (daemon/security/seccomp.ts profileInfo). */
  seccompSha: string;
  /** The resolved filesystem options (daemon/security/filesystem.ts ResolvedFilesystem), as stored in the row. */
  filesystem: unknown;
  /** Network mode. */
  network: 'none' | 'allow' | 'open';
  /** Writable-layer quota, bytes; null where the store enforces none. */
  diskBytes: number | null;
}

/** The key of a shell or request: 24 hex of sha256 over {@link ShellKeyInput} (also the value of {@link POOL_LABEL}). */
export function shellKey(k: ShellKeyInput): string {
  const s = JSON.stringify([k.image, k.layers, k.config, k.seccompSha, k.filesystem, k.network, k.diskBytes]);
  return createHash('sha256').update(s).digest('hex').slice(0, 24);
}

/** Counters of one pool (host info `warm_pools`, metrics). */
export interface WarmPoolStats {
  /** The entry's image reference. */
  image: string;
  network: 'none' | 'allow' | 'open';
  /** Shells the entry asks for. */
  size: number;
  /** Shells ready to be claimed. */
  ready: number;
  /** Shells being created. */
  filling: number;
  /** Creates answered from this pool since dsecd started. */
  claimed: number;
  /** Creates of this pool's image and network mode that found no ready shell since dsecd started. */
  misses: number;
  /** Shells that failed to be created since dsecd started (the pool retries with a back-off). */
  fill_errors: number;
}

/** What the pools need from the lifecycle manager (a seam for tests). */
export interface ShellHost {
  /** Resolves the entry to its key and canonical image; null when it cannot be made now (unknown image: retried later). */
  keyOf(entry: WarmPoolEntry): Promise<{ key: string; image: string }>;
  /** Creates one running shell of `entry` labelled with `key`. */
  createShell(entry: WarmPoolEntry, key: string): Promise<SandboxRecord>;
  /** Destroys a shell; safe for one already gone. */
  destroyShell(id: string): Promise<void>;
  /** User creates in flight (refill waits while there are any). */
  userCreatesInFlight(): number;
  /** Ms since a user create last started or ended (refill waits for {@link QUIET_MS} of quiet); Infinity when none ever ran. */
  msSinceUserCreate(): number;
}

/** How long refill waits between looks at a busy host: 20 ms. */
const BUSY_POLL_MS = 20;
/**
 * Quiet time after the last user create before refill starts: 50 ms. The creates of a
 * burst follow each other within milliseconds (a client at concurrency C issues its next
 * create right after one exec), so 50 ms without one means the burst is over; a steady
 * trickle of up to ~15 creates/s still leaves room to refill between them.
 */
export const QUIET_MS = 50;
/** Back-off after a failed fill: 1 s, doubling to 30 s. */
const FILL_BACKOFF_MS = [1000, 30_000] as const;

/** One entry's shells. */
class Pool {
  readonly ready: SandboxRecord[] = [];
  filling = 0;
  claimed = 0;
  misses = 0;
  fillErrors = 0;
  /** The key shells are made with now, and the image's canonical `name:tag` (null until resolved). */
  key: string | null = null;
  canonical: string | null = null;
  /** Failed fills in a row, and when the next fill may start (ms since the epoch). */
  failures = 0;
  retryAt = 0;
  /** A key refresh in flight ({@link WarmPools.refresh}). */
  refreshing: Promise<{ key: string; image: string }> | null = null;
  constructor(readonly entry: WarmPoolEntry) {}
}

/** Every warm pool of this dsecd. */
export class WarmPools {
  private readonly pools: Pool[];
  private closed = false;
  private filling = 0;
  private kick: NodeJS.Timeout | null = null;
  /** Fills in flight, awaited by {@link close}. */
  private readonly inflight = new Set<Promise<void>>();

  constructor(private readonly host: ShellHost, readonly config: WarmPoolConfig, private readonly log: Logger) {
    this.pools = config.entries.filter((e) => e.size > 0).map((e) => new Pool(e));
  }

  /** Whether any pool is configured. */
  get enabled(): boolean {
    return this.pools.length > 0;
  }

  /** Starts filling in the background. */
  start(): void {
    this.schedule(0);
  }

  /**
   * Takes a ready shell whose key is `key`, or returns null (and counts a miss in the
   * pools of `image`, the canonical `name:tag`, and `network`). The caller owns the shell
   * from here: it claims it or destroys it. Starts a refill.
   */
  take(key: string, image: string, network: string): SandboxRecord | null {
    if (this.closed) return null;
    const pool = this.pools.find((p) => p.key === key && p.ready.length > 0);
    if (pool) {
      const sb = pool.ready.shift()!;
      pool.claimed += 1;
      this.schedule(0);
      return sb;
    }
    for (const p of this.pools) {
      if ((p.key !== key && p.canonical !== image) || p.entry.network !== network) continue;
      p.misses += 1;
      // Same image and mode, another key: the image may have been retagged or the seccomp profile reloaded.
      if (p.key !== key) void this.refresh(p);
    }
    return null;
  }

  /** Per-pool counters. */
  stats(): WarmPoolStats[] {
    return this.pools.map((p) => ({
      image: p.entry.image, network: p.entry.network, size: p.entry.size, ready: p.ready.length, filling: p.filling,
      claimed: p.claimed, misses: p.misses, fill_errors: p.fillErrors,
    }));
  }

  /** Ids of the shells ready now (tests, shutdown). */
  readyIds(): string[] {
    return this.pools.flatMap((p) => p.ready.map((s) => s.id));
  }

  /** Stops filling, waits for fills in flight, destroys every ready shell. */
  async close(): Promise<void> {
    this.closed = true;
    if (this.kick) clearTimeout(this.kick);
    await Promise.all([...this.inflight]);
    const ids = this.readyIds();
    for (const p of this.pools) p.ready.length = 0;
    let next = 0;
    await Promise.all(Array.from({ length: Math.min(8, ids.length) }, async () => {
      while (next < ids.length) {
        const id = ids[next++];
        await this.host.destroyShell(id).catch((e) => this.log.error({ err: e, id }, 'destroying a pool shell at shutdown failed'));
      }
    }));
  }

  private schedule(ms: number): void {
    if (this.closed || this.kick) return;
    this.kick = setTimeout(() => {
      this.kick = null;
      void this.fill();
    }, ms);
    this.kick.unref();
  }

  /** Starts fills up to the concurrency while the host has no user create in flight. */
  private async fill(): Promise<void> {
    if (this.closed) return;
    if (this.host.userCreatesInFlight() > 0) {
      this.schedule(BUSY_POLL_MS);
      return;
    }
    const quiet = this.host.msSinceUserCreate();
    if (quiet < QUIET_MS) {
      this.schedule(Math.max(1, Math.ceil(QUIET_MS - quiet)));
      return;
    }
    let later = Infinity;
    for (const p of this.pools) {
      while (!this.closed && this.filling < this.config.fillConcurrency && p.ready.length + p.filling < p.entry.size) {
        const wait = p.retryAt - Date.now();
        if (wait > 0) {
          later = Math.min(later, wait);
          break;
        }
        p.filling += 1;
        this.filling += 1;
        const t = this.fillOne(p).finally(() => {
          p.filling -= 1;
          this.filling -= 1;
          this.inflight.delete(t);
          this.schedule(0);
        });
        this.inflight.add(t);
      }
    }
    if (later !== Infinity) this.schedule(later);
  }

  /**
   * Resolves the pool's key again; when it changed, the ready shells (which no create can
   * match any more) are destroyed and the pool refills under the new key. One at a time per pool.
   * @returns the key, or throws what resolving threw.
   */
  private async refresh(p: Pool): Promise<{ key: string; image: string }> {
    p.refreshing ??= (async () => {
      try {
        const k = await this.host.keyOf(p.entry);
        p.canonical = k.image;
        if (p.key !== k.key) {
          const stale = p.ready.splice(0);
          p.key = k.key;
          for (const s of stale) void this.host.destroyShell(s.id).catch((e) => this.log.error({ err: e, id: s.id }, 'destroying a stale pool shell failed'));
          this.schedule(0);
        }
        return k;
      } finally {
        p.refreshing = null;
      }
    })();
    return p.refreshing;
  }

  private async fillOne(p: Pool): Promise<void> {
    try {
      const k = await this.refresh(p);
      const sb = await this.host.createShell(p.entry, k.key);
      p.failures = 0;
      if (this.closed || p.key !== k.key) {
        await this.host.destroyShell(sb.id).catch(() => {});
        return;
      }
      p.ready.push(sb);
    } catch (e) {
      p.fillErrors += 1;
      p.failures += 1;
      const ms = Math.min(FILL_BACKOFF_MS[1], FILL_BACKOFF_MS[0] * 2 ** (p.failures - 1));
      p.retryAt = Date.now() + ms;
      this.log.warn({ err: e, image: p.entry.image }, `filling the warm pool failed; retrying in ${ms} ms`);
    }
  }
}
