/**
 * Images and layers: list, inspect, import/build, compose, tag, remove, prune, bootstrap
 * (a Debian base, or a toolkit image on top of it), and commit of a sandbox. Long operations (import, bootstrap) stream progress as NDJSON
 * when the request says `Accept: application/x-ndjson` (daemon/api/long.ts): `{type:"progress", ...}`
 * lines, then one `{type:"result", result}` or `{type:"error", error:{code,message}}` line.
 * Without it they answer once, with the result.
 */
import type { FastifyInstance } from 'fastify';
import {
  BootstrapRequest, CommitRequest, CommitResult, ComposeRequest, Image, ImageList, ImportRequest, Layer, LayerList, PruneRequest, PruneResult, TagRequest,
} from '../schema.js';
import { parseWith } from '../parse.js';
import { invalidArgument, notFound } from '../../errors.js';
import { SYSTEM_SCOPE, visible, type Scope } from '../../model/tenant.js';
import { scopeOf } from '../scope.js';
import { imageTenant, ownTenant, parseRef, type ImageManifest, type LayerStore, type LayerMeta } from '../../image/layer-store.js';
import { importArchiveWithNotes, importTarWithNotes, type ImportProgress } from '../../image/import/oci.js';
import { bootstrapDebian } from '../../image/bootstrap.js';
import { TOOLKITS, bootstrapToolkit } from '../../image/toolkit.js';
import { runLong } from '../long.js';
import { route } from './table.js';
import type { Logger } from 'pino';
import type { Metrics } from '../../metrics.js';
import type { SandboxRepo } from '../../db/sandboxes.js';
import type { StepObserver } from '../../model/steps.js';
import type { LayerLeases } from '../../sandbox/layer-leases.js';
import type { SnapshotService } from '../../sandbox/snapshots.js';
import { z } from 'zod';

const listRoute = route({ method: 'GET', url: '/v1/images', summary: "Images in the layer store: the caller's tenant's and the shared system images (an admin: every tenant's).", status: 200, response: ImageList, errors: [] });
const composeRoute = route({ method: 'POST', url: '/v1/images', summary: "Compose an image in the caller's tenant from layers its images (or the system images) name.", body: ComposeRequest, status: 201, response: Image, errors: ['InvalidArgument', 'NotFound'] });
const getRoute = route({ method: 'GET', url: '/v1/images/:ref', summary: "One image by name, the caller's tenant's first, else the system one (URL-encode a / in the name).", status: 200, response: Image, errors: ['InvalidArgument', 'NotFound'] });
const deleteRoute = route({
  method: 'DELETE', url: '/v1/images/:ref', summary: "Remove an image manifest of the caller's tenant (a system image: admins only); its layers stay until pruned.", status: 200, response: Image,
  errors: ['NotFound', 'PermissionDenied'],
});
const tagRoute = route({ method: 'POST', url: '/v1/images/:ref/tag', summary: "Give an image another name:tag in the caller's tenant.", body: TagRequest, status: 201, response: Image, errors: ['InvalidArgument', 'NotFound'] });
const importRoute = route({
  method: 'POST', url: '/v1/images/import', summary: 'Build or import an image from a directory, tar or OCI/docker archive on the daemon host.', body: ImportRequest, status: 201,
  response: Image.extend({ notes: z.array(z.string()).describe('What was sanitised (e.g. leading / stripped, device nodes under dev/ dropped).') }),
  errors: ['InvalidArgument', 'NotFound'],
});
const bootstrapRoute = route({
  method: 'POST', url: '/v1/images/bootstrap', summary: 'Build the Debian bookworm base image with debootstrap, or (toolkit) a toolkit image: that base plus one layer of apt packages.', body: BootstrapRequest, status: 201,
  response: Image, errors: ['InvalidArgument', 'Unavailable'],
});
const pruneRoute = route({ method: 'POST', url: '/v1/images/prune', summary: 'Remove layers no image, lease or sandbox references.', body: PruneRequest, status: 200, response: PruneResult, errors: [] });
const layersRoute = route({ method: 'GET', url: '/v1/layers', summary: 'Layers in the store: every layer for an admin; for other callers the layers images name (a snapshot\'s layer is its tenant\'s), sources naming a sandbox cut to their kind.', status: 200, response: LayerList, errors: [] });
const layerRoute = route({ method: 'GET', url: '/v1/layers/:digest', summary: 'One layer.', status: 200, response: Layer, errors: ['InvalidArgument', 'NotFound'] });
const commitRoute = route({
  method: 'POST', url: '/v1/sandboxes/:id/commit', summary: "Pack a sandbox's writable layer as a new image on top of its image.", body: CommitRequest, status: 201, response: CommitResult,
  errors: ['InvalidArgument', 'NotFound', 'FailedPrecondition'],
});

/** API view of a manifest. */
export async function imageView(store: LayerStore, m: ImageManifest): Promise<z.infer<typeof Image>> {
  let size = 0;
  for (const d of m.layers) size += (await store.layer(d).catch(() => undefined))?.size_bytes ?? 0;
  return {
    ref: `${m.name}:${m.tag}`, name: m.name, tag: m.tag, tenant: imageTenant(m), layers: m.layers, config: m.config, size_bytes: size, created_at: m.created_ms,
  };
}

/**
 * `over` on top of `base`: each given field replaces the base's, except `security`,
 * whose fields are merged one by one (a `--writable` on top of a base image keeps the
 * base's seccomp override).
 */
export function mergeConfig(base: ImageManifest['config'], over?: Partial<ImageManifest['config']>): ImageManifest['config'] {
  const out = { ...base, ...(over ?? {}) };
  if (over?.security) out.security = { ...(base.security ?? {}), ...over.security };
  return out;
}

/** Config of an image built from scratch (no base). */
const SCRATCH_CONFIG: ImageManifest['config'] = {
  env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'], cwd: '/', user: '0', cmd: ['/bin/sh'],
};

/** What the image routes use. */
export interface ImageRouteDeps {
  images: LayerStore;
  /** Sandbox counts per layer. */
  repo: Pick<SandboxRepo, 'all'>;
  /** The layers prune must keep. */
  leases: Pick<LayerLeases, 'inUse'>;
  /** Commit of a sandbox into an image. */
  snapshots: Pick<SnapshotService, 'commit'>;
  /** Told `image.after-blob` (an imported layer published, before its manifest). */
  failpoints: StepObserver;
  metrics: Pick<Metrics, 'errors'>;
  log: Logger;
}

/** Registers the image, layer and commit routes. */
export function registerImageRoutes(app: FastifyInstance, deps: ImageRouteDeps): void {
  const store = deps.images;
  /**
   * A layer as `scope` may see it. Layers are host-wide, but a layer no image names is a
   * snapshot's (private to its tenant) and is shown to admins only; for other callers
   * `sandboxes` counts their own tenant's sandboxes, a source naming a sandbox
   * (`commit:ID`, `snapshot:ID`) is cut to its kind, so no tenant learns another's ids,
   * and `created_at` is the oldest of the images they see naming it.
   * @returns null when `scope` may not see the layer.
   */
  const layerView = async (meta: LayerMeta, scope: Scope = SYSTEM_SCOPE): Promise<z.infer<typeof Layer> | null> => {
    // Only the images `scope` sees name a layer for it (another tenant's image names are its own).
    const named = (await store.list(scope)).filter((m) => m.layers.includes(meta.digest));
    const images = named.map((m) => `${m.name}:${m.tag}`);
    if (!scope.all && images.length === 0) return null;
    const sandboxes = deps.repo.all().filter((s) => visible(scope, s.tenant) && s.imageLayers.includes(meta.digest)).length;
    if (scope.all) return { ...meta, images, sandboxes };
    // Content is deduplicated across tenants, so the blob's own time may be when another
    // tenant packed the same content: a tenant is told when the first image it sees named it.
    return { ...meta, source: meta.source.replace(/^(commit|snapshot):.*$/, '$1'), created_at: Math.min(...named.map((m) => m.created_ms)), images, sandboxes };
  };

  app.get(listRoute.url, async (req) => ({ images: await Promise.all((await store.list(scopeOf(req))).map((m) => imageView(store, m))) }));
  app.get<{ Params: { ref: string } }>(getRoute.url, async (req) => imageView(store, await store.get(req.params.ref, scopeOf(req))));
  app.delete<{ Params: { ref: string } }>(deleteRoute.url, async (req) => {
    const m = await store.removeImage(req.params.ref, scopeOf(req));
    return imageView(store, m);
  });
  app.post<{ Params: { ref: string } }>(tagRoute.url, async (req, reply) => {
    const body = parseWith(TagRequest, req.body, 'tag request');
    return reply.code(201).send(await imageView(store, await store.tag(req.params.ref, body.target, scopeOf(req))));
  });
  app.post(composeRoute.url, async (req, reply) => {
    const body = parseWith(ComposeRequest, req.body, 'compose request');
    const scope = scopeOf(req);
    const { name, tag } = parseRef(body.image);
    const base = body.from ? (await store.get(body.from, scope)).config : SCRATCH_CONFIG;
    if (!scope.all) {
      // A tenant composes only from layers an image it sees names: a layer of another
      // tenant's image or snapshot answers as a missing one (putManifest's message).
      const seen = new Set((await store.list(scope)).flatMap((x) => x.layers));
      const hidden = body.layers.find((d) => !seen.has(d));
      if (hidden) throw notFound(`image ${name}:${tag}: layer ${hidden} is not in the store`);
    }
    const m: ImageManifest = { name, tag, layers: body.layers, config: mergeConfig(base, body.config), created_ms: Date.now(), ...ownTenant(scope.tenant) };
    await store.putManifest(m);
    return reply.code(201).send(await imageView(store, m));
  });
  app.post(importRoute.url, async (req, reply) => {
    const body = parseWith(ImportRequest, req.body, 'import request');
    const scope = scopeOf(req);
    const { name, tag } = parseRef(body.image);
    if (body.base && body.type !== 'dir') throw invalidArgument('base is only supported with type "dir"');
    if (body.source_ref && body.type !== 'oci') throw invalidArgument('source_ref is only supported with type "oci"');
    return runLong(req, reply, deps, async (progress) => {
      let m: ImageManifest;
      let notes: string[] = [];
      if (body.type === 'dir') {
        const base = body.base ? await store.get(body.base, scope) : null;
        progress({ phase: 'pack', message: `packing ${body.path} as an EROFS layer` });
        const layer = await store.addLayerFromDir(body.path, { source: `dir:${body.path}` });
        deps.failpoints.hit('image.after-blob');
        m = {
          name, tag, layers: [...(base?.layers ?? []), layer.digest],
          config: mergeConfig(base?.config ?? SCRATCH_CONFIG, body.config), created_ms: Date.now(), ...ownTenant(scope.tenant),
        };
        await store.putManifest(m);
      } else {
        const onProgress = (p: ImportProgress) => progress({ ...p });
        const r = body.type === 'tar'
          ? await importTarWithNotes(store, body.path, { name, tag, tenant: scope.tenant, onProgress })
          : await importArchiveWithNotes(store, body.path, { name, tag, tenant: scope.tenant, ref: body.source_ref, onProgress });
        m = r.manifest;
        notes = r.notes;
        if (body.config) {
          m = { ...m, config: mergeConfig(m.config, body.config) };
          await store.putManifest(m);
        }
      }
      return { ...(await imageView(store, m)), notes };
    });
  });
  app.post(bootstrapRoute.url, async (req, reply) => {
    const body = parseWith(BootstrapRequest, req.body ?? {}, 'bootstrap request');
    const ref = parseRef(body.image ?? (body.toolkit ? TOOLKITS[body.toolkit].image : 'debian:bookworm'));
    return runLong(req, reply, deps, async (progress) => {
      const m = body.toolkit
        ? await bootstrapToolkit(store, body.toolkit, { name: ref.name, tag: ref.tag, include: body.include, onProgress: (line, phase) => progress({ phase, message: line }) })
        : await bootstrapDebian(store, { name: ref.name, tag: ref.tag, include: body.include, onProgress: (line: string) => progress({ phase: 'debootstrap', message: line }) });
      return imageView(store, m);
    });
  });
  app.post(pruneRoute.url, async (req) => {
    const body = parseWith(PruneRequest, req.body ?? {}, 'prune request');
    const rep = await store.prune(deps.leases.inUse(), { dryRun: body.dry_run });
    return {
      removed: rep.removed.map((l) => ({ digest: l.digest, size_bytes: l.size_bytes, source: l.source })),
      freed_bytes: rep.freed_bytes, kept_young: rep.kept_young, tmp_removed: rep.tmp_removed, dry_run: !!body.dry_run,
    };
  });
  app.get(layersRoute.url, async (req) => {
    const views = await Promise.all((await store.layers()).map((l) => layerView(l, scopeOf(req))));
    return { layers: views.filter((v) => v !== null) };
  });
  app.get<{ Params: { digest: string } }>(layerRoute.url, async (req) => {
    const v = await layerView(await store.layer(req.params.digest), scopeOf(req));
    // The answer a missing layer gets (LayerStore.layer's).
    if (!v) throw notFound(`layer ${req.params.digest} not found`);
    return v;
  });
  app.post<{ Params: { id: string } }>(commitRoute.url, async (req, reply) => {
    const body = parseWith(CommitRequest, req.body, 'commit request');
    const r = await deps.snapshots.commit(req.params.id, body.image, body.exclude, body.security, scopeOf(req).tenant);
    // The layer as the caller sees it: the same content committed by another tenant is one
    // shared layer, whose other image names and `commit:ID` source are not the caller's.
    return reply.code(201).send({ image: await imageView(store, r.image), layer: (await layerView(r.layer, scopeOf(req)))!, stripped: r.stripped, warnings: r.warnings });
  });
}
