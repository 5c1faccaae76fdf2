/**
 * The image layers this instance uses: every layer of a sandbox row (any state but
 * destroyed) or of a snapshot. The image store keeps a lease per such layer, so prune
 * (on any host sharing the store) never takes one; {@link LayerLeases.sync} runs after
 * each change of that set, {@link LayerLeases.add} after a new row.
 *
 * Why two calls: a sync reads every row's layers (O(sandboxes)), which made each create
 * and destroy of a 1,000-sandbox burst O(n). A create only adds layers, almost always
 * ones already leased, so {@link LayerLeases.add} answers from what the last sync left
 * when no sync is in flight; syncs that callers start while one runs are coalesced into
 * one that starts after it (each caller resolves once a sync that began after its call
 * finished, so what it changed before the call is in it).
 */
import type { LayerStore } from '../image/layer-store.js';
import type { SandboxRepo } from '../db/sandboxes.js';
import type { SnapshotRepo } from '../db/snapshots.js';

/** Keeps the image store's leases equal to the layers in use. */
export class LayerLeases {
  /** Digests the last completed sync left leased; null before the first one or after a failed one. */
  private leased: Set<string> | null = null;
  /** The sync running now, if any. */
  private current: Promise<void> | null = null;
  /** The sync queued to start when {@link current} ends (shared by every caller meanwhile). */
  private next: Promise<void> | null = null;

  constructor(private readonly repo: SandboxRepo, private readonly snapshots: SnapshotRepo, private readonly images: Pick<LayerStore, 'syncLeases'>) {}

  /** Layer digests used by sandboxes of this instance that exist and by its snapshots. */
  inUse(): Set<string> {
    return new Set([...this.repo.layerDigests(), ...this.snapshots.all().flatMap((s) => s.imageLayers)]);
  }

  /**
   * Writes the leases of {@link inUse} and drops the others (image store I/O). Resolves
   * after a sync that started after this call has finished.
   * @throws as LayerStore.syncLeases.
   */
  sync(): Promise<void> {
    if (this.next) return this.next;
    if (this.current) {
      const start = () => {
        this.next = null;
        return this.runOnce();
      };
      this.next = this.current.then(start, start);
      return this.next;
    }
    return this.runOnce();
  }

  /**
   * Leases for `digests`, the layers of a row just written (a new sandbox): nothing to do
   * when the last sync leased them all and no sync is in flight (one in flight may have
   * read the rows before this one and drop a lease this row needs), else a sync.
   * @throws as {@link sync}.
   */
  async add(digests: readonly string[]): Promise<void> {
    const leased = this.leased;
    if (!this.current && leased && digests.every((d) => leased.has(d))) return;
    await this.sync();
  }

  /** One sync: reads the rows when it starts, records what it leased. */
  private runOnce(): Promise<void> {
    const run = (async () => {
      const want = this.inUse();
      try {
        await this.images.syncLeases(want);
        this.leased = want;
      } catch (e) {
        this.leased = null;
        throw e;
      }
    })();
    const tracked: Promise<void> = run.finally(() => {
      if (this.current === tracked) this.current = null;
    });
    this.current = tracked;
    return tracked;
  }
}
