/**
 * Images and layers: list, get, remove, compose and tag images; import and bootstrap them
 * (long operations streaming their progress); prune the layer store; and commit a
 * sandbox's writable layer as a new image.
 */
import type { BootstrapImageInput, CommitResult, ComposeImageInput, Image, ImageConfig, ImportImageInput, Layer, PruneResult } from './types.js';
import { imagePath, sandboxPath } from './paths.js';
import type { TransportClass } from './transport.js';

/**
 * One progress report of a long image operation ({@link DsecClient.importImage},
 * {@link DsecClient.bootstrapImage}), as dsecd streams it. Every field but `type` is
 * optional; what is set depends on the operation and phase.
 */
export interface ImageProgress {
  type: 'progress';
  /** What is happening, e.g. `pack`, `layer`, `debootstrap`. */
  phase?: string;
  /** One human-readable line (e.g. a debootstrap output line). */
  message?: string;
  /** Bytes processed so far in this phase. */
  bytes?: number;
  /** Index (1-based) of the layer being processed, when importing several. */
  layer?: number;
  /** Number of layers in the import. */
  layers?: number;
}

/** Options of the long image operations ({@link DsecClient.importImage}, {@link DsecClient.bootstrapImage}). */
export interface LongOperationOptions {
  /**
   * Called once per progress line, in order, before the promise settles. If it throws,
   * the stream is closed and the call rejects with that error.
   */
  onProgress?: (p: ImageProgress) => void;
  /**
   * Stop waiting: the promise rejects with the signal's reason and the connection closes.
   * dsecd does not cancel the operation; it may still finish.
   */
  signal?: AbortSignal;
}

/** Options of {@link DsecClient.pruneImages}. */
export interface PruneOptions {
  /** Report what would be removed without removing anything. */
  dryRun?: boolean;
}

/** Request of {@link DsecClient.commit}. */
export interface CommitOptions {
  /** Name of the new image, `name[:tag]`. */
  image: string;
  /** Extra globs, relative to the sandbox root (e.g. `srv/cache/**`), stripped before packing. */
  exclude?: string[];
  /**
   * Security defaults of the new image (seccomp override, filesystem options), merged
   * field by field over those of the sandbox's image; default: the image's unchanged.
   */
  security?: ImageConfig['security'];
  /** Stop waiting (rejects with the signal's reason); dsecd may still finish the commit. */
  signal?: AbortSignal;
}

/** Mixes the image, layer and commit calls into a {@link Transport} class (composed into DsecClient by sdk/client.ts). */
export function withImageCalls<B extends TransportClass>(Base: B) {
  return class ImageCalls extends Base {
    /** GET /v1/images: the images the daemon can create sandboxes from, as an array. */
    async listImages(): Promise<Image[]> {
      const res = await this.request<{ images: Image[] }>('GET', '/v1/images');
      return res.images;
    }

    /**
     * GET /v1/images/{ref}: one image; `ref` is `name[:tag]` (tag default `latest`) and is
     * URL-encoded here (a `/` in the name is fine). Errors: `NotFound`, `InvalidArgument`
     * (malformed ref).
     */
    getImage(ref: string): Promise<Image> {
      return this.request<Image>('GET', imagePath(ref));
    }

    /**
     * DELETE /v1/images/{ref}: removes the image manifest and resolves with the image as it
     * was. Its layers stay in the store until {@link pruneImages}. Errors: `NotFound`.
     */
    removeImage(ref: string): Promise<Image> {
      return this.request<Image>('DELETE', imagePath(ref));
    }

    /**
     * POST /v1/images: makes an image from layers already in the store (no data copied).
     * Errors: `InvalidArgument` (malformed ref or digest, empty `layers`), `NotFound`
     * (a layer or the `from` image).
     */
    composeImage(req: ComposeImageInput): Promise<Image> {
      return this.request<Image>('POST', '/v1/images', req);
    }

    /**
     * POST /v1/images/{ref}/tag: gives image `ref` the additional name `target`
     * (`name[:tag]`); resolves with the new image. Errors: `NotFound`, `InvalidArgument`.
     */
    tagImage(ref: string, target: string): Promise<Image> {
      return this.request<Image>('POST', imagePath(ref) + '/tag', { target });
    }

    /**
     * POST /v1/images/import: builds an image from a directory (`type: 'dir'`), a root
     * filesystem tar (`tar`) or an OCI layout / docker save archive (`oci`) at `req.path`,
     * an absolute path read by dsecd on its own host. Streams progress
     * (`Accept: application/x-ndjson`): `opts.onProgress` is called per progress line, and
     * the promise resolves with the new image. No HTTP deadline: a large import takes
     * minutes; use `opts.signal` to stop waiting.
     * Errors: `InvalidArgument` (bad request, unreadable archive), `NotFound` (path or base
     * image), any kind dsecd reports on its error line; `Unavailable` when the connection
     * drops (the import may still finish on dsecd).
     */
    importImage(req: ImportImageInput, opts: LongOperationOptions = {}): Promise<Image> {
      return this.longOperation<Image, ImageProgress>('POST', '/v1/images/import', req, opts);
    }

    /**
     * POST /v1/images/bootstrap: builds the Debian base image with debootstrap on dsecd's
     * host (minutes on a cache miss). Progress, deadline and errors as for
     * {@link importImage}; `Unavailable` also when dsecd cannot run debootstrap or reach
     * the mirror.
     */
    bootstrapImage(req: BootstrapImageInput = { distro: 'debian' }, opts: LongOperationOptions = {}): Promise<Image> {
      return this.longOperation<Image, ImageProgress>('POST', '/v1/images/bootstrap', req, opts);
    }

    /**
     * POST /v1/images/prune: removes layers no image, lease or sandbox references (layers
     * younger than the daemon's grace period are kept and listed in `kept_young`), and
     * leftover temporary files. With `dryRun` nothing is removed.
     */
    pruneImages(opts: PruneOptions = {}): Promise<PruneResult> {
      return this.request<PruneResult>('POST', '/v1/images/prune', opts.dryRun === undefined ? {} : { dry_run: opts.dryRun });
    }

    /** GET /v1/layers: every layer in the store, as an array. */
    async listLayers(): Promise<Layer[]> {
      const res = await this.request<{ layers: Layer[] }>('GET', '/v1/layers');
      return res.layers;
    }

    /** GET /v1/layers/{digest}: one layer; `digest` is the full `sha256:<64 hex>`. Errors: `NotFound`, `InvalidArgument`. */
    getLayer(digest: string): Promise<Layer> {
      return this.request<Layer>('GET', `/v1/layers/${encodeURIComponent(digest)}`);
    }

    /**
     * POST /v1/sandboxes/{id}/commit: packs the sandbox's writable layer (after stripping
     * secrets, caches and `exclude` globs) as a new layer on top of its image, and names the
     * result `opts.image`. No HTTP deadline: packing a large writable layer takes a while.
     * Errors: `NotFound` (sandbox), `FailedPrecondition` (sandbox in a state that cannot be
     * committed), `InvalidArgument` (malformed name or glob).
     */
    commit(id: string, opts: CommitOptions): Promise<CommitResult> {
      const body: Record<string, unknown> = { image: opts.image };
      if (opts.exclude !== undefined) body.exclude = opts.exclude;
      if (opts.security !== undefined) body.security = opts.security;
      return this.request<CommitResult>('POST', sandboxPath(id) + '/commit', body, { signal: opts.signal, timeoutMs: 0 });
    }
  };
}
