/** Images and layers on the wire: views, import, compose, tag, bootstrap, prune, commit, and the NDJSON progress line of long operations. */
import { z } from 'zod';
import { ImageSecuritySchema } from '../../image/security.js';

/** An image reference `name[:tag]` (tag defaults to latest). */
const ImageRef = z.string().min(1).max(255).describe('Image reference, name[:tag].');

/** A layer digest. */
const Digest = z.string().regex(/^sha256:[0-9a-f]{64}$/, 'digest must be sha256:<64 hex>');

/** Process defaults of an image. */
export const ImageConfig = z.object({
  env: z.array(z.string()).describe('KEY=value entries.'),
  cwd: z.string().describe('Working directory of execs.'),
  user: z.string().describe('Default user, name or uid[:gid].'),
  cmd: z.array(z.string()).describe('Default command.'),
  security: ImageSecuritySchema.optional().describe('Security defaults for sandboxes of this image: a seccomp override and filesystem options (docs/IMAGES.md "Security defaults"); a create request overrides each field.'),
});

/** An image as the API returns it. */
export const Image = z.object({
  ref: z.string().describe('name:tag'),
  name: z.string(),
  tag: z.string(),
  tenant: z.string().describe("Whose name it is: `system` for the shared base images every tenant reads and creates from, else the tenant that made it (seen by that tenant and admins only; its name shadows a system image of the same name for that tenant)."),
  layers: z.array(z.string()).describe('Layer digests, lowest first.'),
  config: ImageConfig,
  size_bytes: z.number().int().describe('Sum of the layer blob sizes, bytes.'),
  created_at: z.number().int().describe('ms since the Unix epoch.'),
});
export type Image = z.infer<typeof Image>;

/** GET /v1/images response. */
export const ImageList = z.object({ images: z.array(Image) });

/** A layer as the API returns it. */
export const Layer = z.object({
  digest: z.string(),
  size_bytes: z.number().int().describe('Blob size, bytes.'),
  created_at: z.number().int().describe("When the blob was packed, ms since the Unix epoch; for a caller that is not an admin, when the first image it sees named the layer (content is shared across tenants)."),
  source: z.string().describe('Where the content came from, e.g. dir:/path, oci:/x.tar#1, commit:<sandbox id> (for a caller that is not an admin, commit or snapshot alone).'),
  builder: z.string().describe('<host>/<instance> that built it.'),
  images: z.array(z.string()).describe('Images (name:tag) that use this layer.'),
  sandboxes: z.number().int().describe('Sandboxes of this instance that use this layer.'),
});

/** GET /v1/layers response. */
export const LayerList = z.object({ layers: z.array(Layer) });

/**
 * POST /v1/images/import: build or import an image from a path on the daemon's host.
 * `dir`: one layer from a directory tree (on top of `base`'s layers when given);
 * `tar`: one layer from a root filesystem tar (plain, gzip or zstd);
 * `oci`: an OCI image layout (dir or tar) or a docker/podman save archive, one layer per OCI layer.
 */
export const ImportRequest = z
  .object({
    type: z.enum(['dir', 'tar', 'oci']),
    path: z.string().startsWith('/').describe('Absolute path on the daemon host.'),
    image: ImageRef.describe('Name for the result, name[:tag].'),
    base: ImageRef.optional().describe('dir only: put the new layer on top of this image (its config is kept).'),
    source_ref: z.string().max(255).optional().describe('oci only: which image of a multi-image archive (its ref name, e.g. localhost/app:1).'),
    config: ImageConfig.partial().strict().optional().describe('Overrides of the image config.'),
  })
  .strict();

/** POST /v1/images: compose an image from layers already in the store. */
export const ComposeRequest = z
  .object({
    image: ImageRef,
    layers: z.array(Digest).min(1).describe('Layer digests, lowest first.'),
    from: ImageRef.optional().describe('Take the config from this image.'),
    config: ImageConfig.partial().strict().optional(),
  })
  .strict();

/** POST /v1/images/{ref}/tag request. */
export const TagRequest = z.object({ target: ImageRef }).strict();

/** POST /v1/images/bootstrap request. */
export const BootstrapRequest = z
  .object({
    distro: z.literal('debian').describe('Only debian (bookworm minbase) so far.'),
    toolkit: z
      .enum(['judge'])
      .optional()
      .describe(
        'Build a toolkit image instead: the base image (debian:bookworm, bootstrapped first when missing) plus one layer of packages. judge: gcc, g++, libc6-dev (image judge:bookworm).',
      ),
    image: ImageRef.optional().describe('Default debian:bookworm, or the toolkit\'s image (judge:bookworm).'),
    include: z
      .array(z.string().regex(/^[a-z0-9][a-z0-9+.-]*$/))
      .optional()
      .describe('Extra packages of the layer being built: on top of minbase (default python3, git), or with toolkit on top of its packages.'),
  })
  .strict();

/** POST /v1/images/prune request. */
export const PruneRequest = z.object({ dry_run: z.boolean().optional() }).strict();

/** POST /v1/images/prune response. */
export const PruneResult = z.object({
  removed: z.array(z.object({ digest: z.string(), size_bytes: z.number().int(), source: z.string() })),
  freed_bytes: z.number().int(),
  kept_young: z.array(z.string()).describe('Unreferenced layers kept because they are younger than the grace period.'),
  tmp_removed: z.number().int(),
  dry_run: z.boolean(),
});

/** POST /v1/sandboxes/{id}/commit request. */
export const CommitRequest = z
  .object({
    image: ImageRef.describe('Name of the new image, name[:tag].'),
    exclude: z.array(z.string().min(1)).optional().describe('Extra globs (relative to the sandbox root) to strip.'),
    security: ImageSecuritySchema.optional().describe("Security defaults of the new image; default the sandbox's image's."),
  })
  .strict();

/** POST /v1/sandboxes/{id}/commit response. */
export const CommitResult = z.object({
  image: Image,
  layer: Layer,
  stripped: z.array(z.string()).describe('Paths removed before packing.'),
  warnings: z.array(z.string()).describe('E.g. exclude patterns that matched nothing.'),
});

/** One line of a streamed (Accept: application/x-ndjson) long operation. */
export const ProgressLine = z.object({
  type: z.enum(['progress', 'result', 'error']),
  message: z.string().optional(),
  phase: z.string().optional(),
  bytes: z.number().optional(),
  result: z.unknown().optional(),
  error: z.object({ code: z.string(), message: z.string() }).optional(),
});
