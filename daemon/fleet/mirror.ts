/**
 * An in-memory mirror of one etcd key prefix: the keys and values read once, then kept
 * current by a watch that starts at the revision of that read, so no change between the
 * read and the watch is lost. Readers (the gateway's host table, the fleet token store)
 * answer from memory: nothing on their hot path waits for etcd.
 *
 * While the watch is down (etcd unreachable) the mirror keeps its last contents and says
 * so ({@link PrefixMirror.connected} false, `stale` event); etcd3 reconnects the watch and
 * resumes from the last revision seen. When etcd compacted past that revision the
 * mirror reads the prefix again and reports the differences as changes.
 */
import { EventEmitter } from 'node:events';
import type { Etcd3, Watcher } from 'etcd3';
import type { Logger } from 'pino';

/** A change of one key: its new value, or null when it was deleted. */
export interface MirrorChange {
  key: string;
  value: Buffer | null;
}

/**
 * Events: `change` (MirrorChange), `connected` (the watch is up; also after a resync),
 * `stale` (the watch went down; the contents are the last known).
 */
export class PrefixMirror extends EventEmitter {
  /** Current values by key. */
  readonly entries = new Map<string, Buffer>();
  private watcher: Watcher | null = null;
  private closed = false;
  private connectedNow = false;
  /** When the watch went down, ms since the epoch; null while connected. */
  staleSince: number | null = Date.now();

  constructor(private readonly etcd: Etcd3, readonly prefix: string, private readonly log: Logger) {
    super();
  }

  /** Whether the watch is up (the contents are current). */
  get connected(): boolean {
    return this.connectedNow;
  }

  /**
   * Reads the prefix and starts the watch; resolves once both are done. Retries (with
   * back-off up to 2 s) while etcd is unreachable; `signal` or {@link close} gives up (rejects).
   */
  async start(signal?: AbortSignal): Promise<void> {
    let pause = 100;
    for (;;) {
      try {
        await this.sync();
        return;
      } catch (e) {
        if (this.closed || signal?.aborted) throw e;
        this.log.warn({ prefix: this.prefix, err: (e as Error).message }, 'fleet: cannot read etcd yet; retrying');
        await new Promise((r) => setTimeout(r, pause));
        pause = Math.min(2000, pause * 2);
        if (this.closed) throw new Error(`watch of ${this.prefix} closed`);
      }
    }
  }

  /** One read of the prefix, its differences applied as changes, and a watch from its revision. */
  private async sync(): Promise<void> {
    const res = await this.etcd.getAll().prefix(this.prefix).exec();
    const seen = new Set<string>();
    for (const kv of res.kvs) {
      const key = kv.key.toString();
      seen.add(key);
      const old = this.entries.get(key);
      if (!old || !old.equals(kv.value)) this.apply(key, kv.value);
    }
    for (const key of [...this.entries.keys()]) if (!seen.has(key)) this.apply(key, null);
    const rev = BigInt(res.header.revision) + 1n;
    const w = await this.etcd.watch().prefix(this.prefix).startRevision(rev.toString()).create();
    if (this.closed) {
      await w.cancel().catch(() => {});
      return;
    }
    this.watcher = w;
    w.on('put', (kv) => this.apply(kv.key.toString(), kv.value));
    w.on('delete', (kv) => this.apply(kv.key.toString(), null));
    w.on('disconnected', () => this.setConnected(false));
    w.on('connected', () => this.setConnected(true));
    w.on('error', (err) => {
      // A compacted revision: the watch cannot resume; read everything again.
      this.log.warn({ prefix: this.prefix, err: err.message }, 'fleet: watch failed; reading the prefix again');
      this.setConnected(false);
      if (this.watcher === w) this.watcher = null;
      void w.cancel().catch(() => {});
      if (!this.closed) void this.start().catch(() => {});
    });
    this.setConnected(true);
  }

  private apply(key: string, value: Buffer | null): void {
    if (value === null) {
      if (!this.entries.delete(key)) return;
    } else {
      this.entries.set(key, value);
    }
    this.emit('change', { key, value } satisfies MirrorChange);
  }

  private setConnected(up: boolean): void {
    if (up === this.connectedNow) return;
    this.connectedNow = up;
    this.staleSince = up ? null : Date.now();
    this.emit(up ? 'connected' : 'stale');
  }

  /** Stops watching. Safe to call twice. */
  async close(): Promise<void> {
    this.closed = true;
    const w = this.watcher;
    this.watcher = null;
    if (w) await w.cancel().catch(() => {});
  }
}
