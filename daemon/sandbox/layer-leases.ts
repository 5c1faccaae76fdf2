/**
 * The image layers this instance uses: every layer of a sandbox row (any state but
 * destroyed) or of a snapshot. The image store keeps a lease per such layer, so prune
 * (on any host sharing the store) never takes one; {@link LayerLeases.sync} runs after
 * each change of that set.
 */
import type { LayerStore } from '../image/layer-store.js';
import type { SandboxRepo } from '../db/sandboxes.js';
import type { SnapshotRepo } from '../db/snapshots.js';

/** Keeps the image store's leases equal to the layers in use. */
export class LayerLeases {
  constructor(private readonly repo: SandboxRepo, private readonly snapshots: SnapshotRepo, private readonly images: Pick<LayerStore, 'syncLeases'>) {}

  /** Layer digests used by sandboxes of this instance that exist and by its snapshots. */
  inUse(): Set<string> {
    return new Set([...this.repo.layerDigests(), ...this.snapshots.all().flatMap((s) => s.imageLayers)]);
  }

  /** Writes the leases of {@link inUse} and drops the others (image store I/O). */
  async sync(): Promise<void> {
    await this.images.syncLeases(this.inUse());
  }
}
