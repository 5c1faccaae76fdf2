/**
 * Importing images into the layer store: OCI image layouts (a directory, or a tar of one
 * such as `podman save --format oci-archive`), docker/podman `save` archives
 * (docker-archive: manifest.json + layer tars), and plain root filesystem tars.
 *
 * Each layer of the source image becomes ONE EROFS layer, in the same order, so layers
 * shared between images are stored once (same content, same reproducible blob, same
 * digest; e.g. the docker-archive and the oci-archive of one image give the same layer
 * digests). A layer tar is extracted with {@link extractLayerTar} — sanitised, OCI
 * whiteouts turned into overlayfs whiteouts and opaque directories — into a temp dir
 * under `<store root>/tmp/`, packed with `ImageStore.addLayerFromDir` (mkfs.erofs 1.5
 * keeps `trusted.*` xattrs by default, so opaque markers survive), and the temp dir
 * removed before the next layer. Layers whose tar has no entries (e.g. from `RUN true`
 * or `ENV` steps) are skipped: they would only cost one more lower mount per sandbox.
 *
 * Integrity: every blob read through an OCI descriptor (index, manifest, config, layer)
 * is checked against the descriptor's sha256 and size; every layer's uncompressed
 * content is checked against the config's `rootfs.diff_ids` (the only check a
 * docker-archive allows, besides its config file being named by its digest). A mismatch
 * is an InvalidArgument naming the digest. Nothing is trusted from file names alone.
 *
 * Contract: temp dirs are always removed, also on failure; the manifest is written last,
 * so a failed import never leaves a manifest (layers already built stay in the store
 * unreferenced until `ImageStore.prune` collects them).
 *
 * Identity: when the store has a builder (daemon/host/builder.ts), every extraction runs
 * as the builder (daemon/image/builder-worker.ts) in the job's staging dir, which is then
 * the work dir: root opens each input (the user's archive, a layer blob) and passes the
 * fd, reads the archive's JSON documents from the builder's unpacked tree (the builder has
 * exited by then, so nothing changes them), and hands mkfs.erofs, also run as the builder,
 * the opaque directories the extraction reported.
 */
import { createHash } from 'node:crypto';
import { closeSync, constants as fsc, openSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, readFile, realpath, rm, stat, utimes } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join, resolve, sep } from 'node:path';
import { DsecError } from '../../errors.js';
import type { BuilderJob } from '../../host/builder.js';
import { ownTenant, parseRef, type ImageManifest, type LayerStore as ImageStore } from '../layer-store.js';
import { SYSTEM_TENANT } from '../../model/tenant.js';
import { extractLayerTar, type ExtractOptions, type ExtractReport } from './tar.js';

/** Progress of an import. `bytes` counts input bytes of the current phase (compressed, as stored). */
export interface ImportProgress {
  /**
   * `unpack`: extracting an archive file; `layer`: extracting layer `layer` of `layers`;
   * `sanitised`: something was changed rather than refused (see {@link ImportResult.notes}),
   * one event per note right after the archive or layer it concerns, then one summary
   * event (`summary: true`) before `manifest` — none at all when nothing was sanitised;
   * `build`: mkfs.erofs of a layer; `manifest`: storing the manifest.
   */
  phase: 'unpack' | 'layer' | 'sanitised' | 'build' | 'manifest';
  /** 1-based layer number (phases `layer` and `build`, and `sanitised` for a layer's note). */
  layer?: number;
  /** Number of layers in the source image. */
  layers?: number;
  /** Bytes consumed so far (phases `unpack` and `layer`). */
  bytes?: number;
  /** Phase `sanitised`: the note (as in {@link ImportResult.notes}), or the summary line. */
  message?: string;
  /** Phase `sanitised`: true on the final summary event. */
  summary?: boolean;
}

/**
 * What {@link importArchiveWithNotes} and {@link importTarWithNotes} return: the stored
 * manifest, and what extraction changed instead of refusing, one line per kind and source,
 * e.g. `layer 2/3: stripped leading "/" (2 entries, e.g. "/etc/x")` or (a plain tar)
 * `dropped device node below /dev (runc mounts its own /dev there) (3 entries, e.g. "dev/null")`.
 * Lines of the outer archive file start with `archive: `. Empty when nothing was changed.
 */
export interface ImportResult {
  manifest: ImageManifest;
  notes: string[];
}

/** Options for {@link importArchive}. */
export interface ImportArchiveOptions {
  /** Name of the stored image (see store.ts parseRef for the rules). */
  name: string;
  /** Tag of the stored image. */
  tag: string;
  /** Tenant the image name belongs to (layer-store.ts ImageManifest.tenant); default `system`. */
  tenant?: string;
  /**
   * Which image of a multi-image archive, by reference as recorded in the archive
   * (`org.opencontainers.image.ref.name` / `io.containerd.image.name` annotations, or
   * docker RepoTags), e.g. `localhost/app:1` or `app:1` (`docker.io/library/` and
   * `localhost/` prefixes and a missing `:latest` are normalised). Not needed when the
   * archive holds one image.
   */
  ref?: string;
  /** Progress callback; see {@link ImportProgress}. */
  onProgress?(p: ImportProgress): void;
}

/** Options for {@link importTar}. */
export interface ImportTarOptions {
  /** Name of the stored image. */
  name: string;
  /** Tag of the stored image. */
  tag: string;
  /** Tenant the image name belongs to (layer-store.ts ImageManifest.tenant); default `system`. */
  tenant?: string;
  /** Process defaults; missing fields default to {@link ROOTFS_TAR_DEFAULTS}. */
  config?: Partial<ImageManifest['config']>;
  /** Progress callback (phases `layer`, `build`, `manifest`). */
  onProgress?(p: ImportProgress): void;
}

/** Process defaults of an image imported from a plain root filesystem tar (PATH as Docker's default). */
export const ROOTFS_TAR_DEFAULTS: ImageManifest['config'] = {
  env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'],
  cwd: '/',
  user: '0',
  cmd: ['/bin/sh'],
};

/** The parts of an OCI / docker image config that dsec reads. */
export interface OciImageConfig {
  os?: string;
  architecture?: string;
  config?: { Env?: unknown; Cmd?: unknown; Entrypoint?: unknown; WorkingDir?: unknown; User?: unknown };
  rootfs?: { type?: string; diff_ids?: unknown };
}

/** An OCI content descriptor (the fields used here). */
interface Descriptor {
  mediaType?: string;
  digest: string;
  size: number;
  annotations?: Record<string, string>;
  platform?: { os?: string; architecture?: string; variant?: string };
}

/** One layer of the image being imported. */
interface LayerSource {
  /** File holding the layer tar. */
  file: string;
  /** For messages: the descriptor digest or the archive path. */
  label: string;
  /** Expected sha256 and size of the file's bytes (OCI descriptors). */
  digest?: string;
  size?: number;
  /** Expected sha256 of the uncompressed tar (config rootfs.diff_ids). */
  diffId?: string;
}

/** The image chosen in an archive, ready to import. */
interface ResolvedImage {
  config: OciImageConfig;
  layers: LayerSource[];
}

const SHA256_RE = /^sha256:[0-9a-f]{64}$/;
/** Largest JSON document (index, manifest, config) read into memory. */
const MAX_JSON_BYTES = 16 << 20;
/** Keep the temp dir's mtime fresh so a concurrent `prune` (stale after an hour) never takes it mid-import. */
const TOUCH_EVERY_MS = 60_000;
const INDEX_ANNOTATIONS = ['io.containerd.image.name', 'org.opencontainers.image.ref.name'];
const LAYER_MEDIA_RE =
  /^application\/vnd\.(?:oci\.image\.layer(?:\.nondistributable)?\.v1\.tar(?:\+gzip|\+zstd)?|docker\.image\.rootfs\.(?:foreign\.)?diff\.tar(?:\.gzip)?)$/;

const GOARCH: Record<string, string> = { x64: 'amd64', arm64: 'arm64', arm: 'arm', ia32: '386', ppc64: 'ppc64le', s390x: 's390x', riscv64: 'riscv64' };

const bad = (msg: string, cause?: unknown) => new DsecError('InvalidArgument', msg, cause === undefined ? undefined : { cause });

/**
 * Maps an OCI/docker image config to dsec's process defaults: `Env` → env,
 * `WorkingDir` → cwd (default `/`; a relative one is taken from `/`), `User` → user
 * (default `0`), `Entrypoint` followed by `Cmd` → cmd (Docker's rule for the default
 * command; empty when both are absent). Non-string items are dropped. Labels, ports,
 * volumes and the stop signal are not used by dsec. Throws an InvalidArgument DsecError
 * for an image whose `os` is set and is not `linux`.
 */
export function imageConfigFromOci(cfg: OciImageConfig): ImageManifest['config'] {
  if (typeof cfg.os === 'string' && cfg.os !== '' && cfg.os !== 'linux') throw bad(`image is for os ${JSON.stringify(cfg.os)}; dsec runs linux images only`);
  const c = cfg.config ?? {};
  const strings = (v: unknown): string[] => (Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string') : []);
  const wd = typeof c.WorkingDir === 'string' && c.WorkingDir !== '' ? c.WorkingDir : '/';
  return {
    env: strings(c.Env),
    cwd: wd.startsWith('/') ? wd : `/${wd}`,
    user: typeof c.User === 'string' && c.User !== '' ? c.User : '0',
    cmd: [...strings(c.Entrypoint), ...strings(c.Cmd)],
  };
}

/** Normalises an image reference for comparison: drops `docker.io/library/`, `docker.io/`, `localhost/`; adds `:latest`. */
function normRef(r: string): string {
  let s = r.replace(/^(?:index\.)?docker\.io\/(?:library\/)?/, '').replace(/^localhost\//, '');
  const lastSlash = s.lastIndexOf('/');
  if (!s.includes('@') && s.indexOf(':', lastSlash + 1) < 0) s += ':latest';
  return s;
}

/** True when the archive's ref `have` names `want` (an OCI ref.name may be a bare tag, e.g. `1.0`). */
function refMatches(have: string, want: string): boolean {
  if (have === want || normRef(have) === normRef(want)) return true;
  return !have.includes('/') && !have.includes(':') && want.endsWith(`:${have}`);
}

/** Picks the candidate named by `want`, or the only one; InvalidArgument listing the refs otherwise. */
function pick<T extends { id: string; refs: string[] }>(all: T[], want: string | undefined, where: string): T {
  const byId = new Map<string, T>();
  for (const c of all) {
    const seen = byId.get(c.id);
    if (seen) seen.refs.push(...c.refs.filter((r) => !seen.refs.includes(r)));
    else byId.set(c.id, { ...c, refs: [...c.refs] });
  }
  const cands = [...byId.values()];
  const list = cands.map((c) => (c.refs.length ? c.refs.join(', ') : `(untagged ${c.id})`)).join('; ');
  if (cands.length === 0) throw bad(`${where} holds no image`);
  if (want === undefined) {
    if (cands.length === 1) return cands[0];
    throw bad(`${where} holds ${cands.length} images; choose one with ref: ${list}`);
  }
  const hit = cands.filter((c) => c.refs.some((r) => refMatches(r, want)));
  if (hit.length === 1) return hit[0];
  if (hit.length === 0) throw bad(`${where} has no image ${JSON.stringify(want)}; it holds: ${list}`);
  throw bad(`${where}: ref ${JSON.stringify(want)} matches ${hit.length} images: ${hit.map((c) => c.refs.join(', ')).join('; ')}`);
}

/** Resolves `rel` inside `root` (symlinks allowed only if they stay inside). InvalidArgument when missing or outside. */
async function inside(root: string, rel: string, what: string): Promise<string> {
  if (typeof rel !== 'string' || rel === '' || rel.startsWith('/') || rel.split('/').includes('..')) {
    throw bad(`${what}: path ${JSON.stringify(rel)} is not a plain relative path inside the archive`);
  }
  const realRoot = await realpath(root);
  let real: string;
  try {
    real = await realpath(join(root, rel));
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw bad(`${what}: ${rel} is missing from the archive`, e);
    if (code === 'ELOOP' || code === 'ENOTDIR' || code === 'ENAMETOOLONG') throw bad(`${what}: ${rel} cannot be resolved in the archive (${code})`, e);
    throw e;
  }
  if (real !== realRoot && !real.startsWith(realRoot + sep)) throw bad(`${what}: ${rel} points outside the archive`);
  const st = await stat(real);
  if (!st.isFile()) throw bad(`${what}: ${rel} is not a regular file`);
  return real;
}

/** Path of the blob for an OCI descriptor in layout `root`; InvalidArgument for a non-sha256 or malformed digest. */
async function blobFile(root: string, desc: Descriptor, what: string): Promise<string> {
  if (!desc || typeof desc.digest !== 'string') throw bad(`${what}: descriptor has no digest`);
  if (!SHA256_RE.test(desc.digest)) throw bad(`${what}: unsupported or malformed digest ${JSON.stringify(desc.digest)} (only sha256 is supported)`);
  if (!Number.isSafeInteger(desc.size) || desc.size < 0) throw bad(`${what} ${desc.digest}: descriptor has no valid size`);
  return inside(root, `blobs/sha256/${desc.digest.slice('sha256:'.length)}`, `${what} ${desc.digest}`);
}

function sha256(buf: Buffer): string {
  return `sha256:${createHash('sha256').update(buf).digest('hex')}`;
}

/** Parses JSON, InvalidArgument naming `what` if it is not. */
function parseJson(buf: Buffer, what: string): unknown {
  try {
    return JSON.parse(buf.toString('utf8'));
  } catch (e) {
    throw bad(`${what} is not valid JSON`, e);
  }
}

/** Reads a small JSON file; InvalidArgument when too large or not JSON. */
async function readJsonFile(file: string, what: string): Promise<{ json: unknown; bytes: Buffer }> {
  const st = await stat(file);
  if (st.size > MAX_JSON_BYTES) throw bad(`${what} is ${st.size} bytes, more than the ${MAX_JSON_BYTES} allowed for JSON`);
  const bytes = await readFile(file);
  return { json: parseJson(bytes, what), bytes };
}

/** Reads the JSON blob of `desc`, checking its size and sha256 against the descriptor. */
async function readVerifiedJson(root: string, desc: Descriptor, what: string): Promise<unknown> {
  const file = await blobFile(root, desc, what);
  if (desc.size > MAX_JSON_BYTES) throw bad(`${what} ${desc.digest} is ${desc.size} bytes, more than the ${MAX_JSON_BYTES} allowed for JSON`);
  const { size } = await stat(file);
  if (size !== desc.size) {
    throw bad(`${what} ${desc.digest}: the blob is ${size} bytes, its descriptor says ${desc.size}; the archive is corrupt or was altered`);
  }
  const bytes = await readFile(file);
  const actual = sha256(bytes);
  if (actual !== desc.digest || bytes.length !== desc.size) {
    throw bad(`${what} ${desc.digest}: the blob hashes to ${actual} (${bytes.length} bytes, descriptor says ${desc.size}); the archive is corrupt or was altered`);
  }
  return parseJson(bytes, `${what} ${desc.digest}`);
}

function asObject(v: unknown, what: string): Record<string, unknown> {
  if (!v || typeof v !== 'object' || Array.isArray(v)) throw bad(`${what} is not a JSON object`);
  return v as Record<string, unknown>;
}

/** The expected diff_ids of a config, validated; undefined when the config has none. */
function diffIds(cfg: OciImageConfig, layers: number): string[] | undefined {
  const ids = cfg.rootfs?.diff_ids;
  if (ids === undefined) return undefined;
  if (!Array.isArray(ids) || !ids.every((d) => typeof d === 'string' && SHA256_RE.test(d))) throw bad('image config: rootfs.diff_ids is malformed');
  if (ids.length !== layers) throw bad(`image config lists ${ids.length} rootfs.diff_ids for ${layers} layers`);
  return ids as string[];
}

/** Chooses and resolves the image of an OCI image layout directory. */
async function resolveOci(root: string, want: string | undefined, where: string): Promise<ResolvedImage> {
  const layout = asObject((await readJsonFile(await inside(root, 'oci-layout', where), `${where}: oci-layout`)).json, `${where}: oci-layout`);
  if (typeof layout.imageLayoutVersion !== 'string') throw bad(`${where}: oci-layout has no imageLayoutVersion`);
  const index = asObject((await readJsonFile(await inside(root, 'index.json', where), `${where}: index.json`)).json, `${where}: index.json`);
  if (!Array.isArray(index.manifests)) throw bad(`${where}: index.json has no manifests`);

  const arch = GOARCH[process.arch] ?? process.arch;
  const cands: { id: string; refs: string[]; manifest: Record<string, unknown> }[] = [];
  const skippedPlatforms: string[] = [];
  for (const d of index.manifests as Descriptor[]) {
    const refs = INDEX_ANNOTATIONS.map((k) => d?.annotations?.[k]).filter((r): r is string => typeof r === 'string' && r !== '');
    const doc = asObject(await readVerifiedJson(root, d, 'manifest'), `manifest ${d.digest}`);
    if (!Array.isArray(doc.manifests)) {
      cands.push({ id: d.digest, refs, manifest: doc });
      continue;
    }
    // An image index (multi-platform): take the manifest for this host's platform.
    const fits = (doc.manifests as Descriptor[]).filter((m) => m?.platform?.os === 'linux' && m.platform.architecture === arch);
    for (const m of doc.manifests as Descriptor[]) if (m?.platform && !fits.includes(m)) skippedPlatforms.push(`${m.platform.os}/${m.platform.architecture}`);
    if (fits.length === 0) continue;
    const doc2 = asObject(await readVerifiedJson(root, fits[0], 'manifest'), `manifest ${fits[0].digest}`);
    cands.push({ id: fits[0].digest, refs, manifest: doc2 });
  }
  if (cands.length === 0 && skippedPlatforms.length > 0) {
    throw bad(`${where} has no image for linux/${arch}; it has: ${[...new Set(skippedPlatforms)].join(', ')}`);
  }
  const chosen = pick(cands, want, where);
  const man = chosen.manifest;
  if (!man.config || !Array.isArray(man.layers)) throw bad(`manifest ${chosen.id} is not an image manifest (no config or layers)`);
  const config = asObject(await readVerifiedJson(root, man.config as Descriptor, 'image config'), 'image config') as OciImageConfig;
  const descs = man.layers as Descriptor[];
  const ids = diffIds(config, descs.length);
  const layers: LayerSource[] = [];
  for (let i = 0; i < descs.length; i++) {
    const d = descs[i];
    const what = `layer ${i + 1}/${descs.length}`;
    if (typeof d?.mediaType === 'string' && !LAYER_MEDIA_RE.test(d.mediaType)) throw bad(`${what} ${d.digest}: unsupported media type ${d.mediaType}`);
    const file = await blobFile(root, d, what);
    const { size } = await stat(file);
    if (size !== d.size) throw bad(`${what} ${d.digest}: the blob is ${size} bytes, its descriptor says ${d.size}; the archive is corrupt or was altered`);
    layers.push({ file, label: d.digest, digest: d.digest, size: d.size, diffId: ids?.[i] });
  }
  return { config, layers };
}

/** Chooses and resolves the image of an unpacked docker-archive (`docker save` / `podman save`). */
async function resolveDocker(root: string, want: string | undefined, where: string): Promise<ResolvedImage> {
  const list = (await readJsonFile(await inside(root, 'manifest.json', where), `${where}: manifest.json`)).json;
  if (!Array.isArray(list)) throw bad(`${where}: manifest.json is not a list`);
  const cands = list.map((e: unknown, i) => {
    const o = asObject(e, `${where}: manifest.json entry ${i}`);
    if (typeof o.Config !== 'string' || !Array.isArray(o.Layers)) throw bad(`${where}: manifest.json entry ${i} has no Config or Layers`);
    const refs = Array.isArray(o.RepoTags) ? o.RepoTags.filter((t): t is string => typeof t === 'string') : [];
    return { id: o.Config, refs, layers: o.Layers as unknown[] };
  });
  const chosen = pick(cands, want, where);
  const cfgFile = await inside(root, chosen.id, 'image config');
  const { json, bytes } = await readJsonFile(cfgFile, `image config ${chosen.id}`);
  // The config is named by its digest (`<hex>.json`, or `blobs/sha256/<hex>` in newer docker).
  const named = /(?:^|\/)([0-9a-f]{64})(?:\.json)?$/.exec(chosen.id);
  if (named && sha256(bytes) !== `sha256:${named[1]}`) {
    throw bad(`image config sha256:${named[1]}: the file hashes to ${sha256(bytes)}; the archive is corrupt or was altered`);
  }
  const config = asObject(json, 'image config') as OciImageConfig;
  const ids = diffIds(config, chosen.layers.length);
  if (!ids) throw bad(`${where}: the image config has no rootfs.diff_ids, so its layers cannot be verified`);
  const layers: LayerSource[] = [];
  for (let i = 0; i < chosen.layers.length; i++) {
    const rel = chosen.layers[i] as string;
    layers.push({ file: await inside(root, rel, `layer ${i + 1}/${chosen.layers.length}`), label: String(rel), diffId: ids[i] });
  }
  return { config, layers };
}

/**
 * Runs `fn` with a fresh work dir, always removed afterwards: the staging dir of a
 * builder job (`<root>/builder/…`) when the store has a builder (`job` is then given),
 * else a dir of root's own under `<store root>/tmp/`, kept fresh with `touch` so a
 * concurrent prune never takes it.
 */
async function withWorkDir<T>(store: ImageStore, fn: (work: string, touch: () => void, job: BuilderJob | undefined) => Promise<T>): Promise<T> {
  const tmpRoot = join(store.root, 'tmp');
  await mkdir(tmpRoot, { recursive: true });
  const toucher = (work: string) => {
    let last = Date.now();
    return (): void => {
      const now = Date.now();
      if (now - last < TOUCH_EVERY_MS) return;
      last = now;
      void utimes(work, now / 1000, now / 1000).catch(() => undefined);
    };
  };
  // A builder's staging dir is outside the store's tmp/, where prune never looks: no touching needed.
  if (store.builder) return store.builder.withJob((job) => fn(job.dir, () => undefined, job));
  // Named like the store's own temp entries (`<host>-<pid>-…`), so prune can tell whose they are.
  const host = (store as { owner?: { host?: string } }).owner?.host ?? hostname();
  const work = await mkdtemp(join(tmpRoot, `${host}-${process.pid}-import-`));
  try {
    return await fn(work, toucher(work), undefined);
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

/**
 * Extracts the tar `file` into `<work>/<dest>`: in this process (root), or with a job as
 * the builder (root opens `file` and passes the fd; the builder creates `dest`).
 * Errors as {@link extractLayerTar}.
 */
async function extract(job: BuilderJob | undefined, work: string, file: string, dest: string, opts: Pick<ExtractOptions, 'ociWhiteouts' | 'onProgress'>): Promise<ExtractReport> {
  if (!job) return extractLayerTar(file, join(work, dest), opts);
  let fd: number;
  try {
    fd = openSync(file, fsc.O_RDONLY | fsc.O_NOCTTY);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') throw new DsecError('NotFound', `tar ${file} not found`, { cause: e });
    throw e;
  }
  try {
    return await job.worker<ExtractReport>('extract', { dest, ociWhiteouts: opts.ociWhiteouts }, { fds: [fd], onProgress: opts.onProgress });
  } finally {
    closeSync(fd);
  }
}

/** stat that maps ENOENT to NotFound. */
async function statInput(path: string) {
  try {
    return await stat(path);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') throw new DsecError('NotFound', `${path} not found`, { cause: e });
    throw e;
  }
}

/** Checks what extraction saw against what the archive promised. */
function verifyLayer(src: LayerSource, rep: ExtractReport, what: string): void {
  if (src.digest !== undefined && (rep.inputDigest !== src.digest || rep.inputBytes !== src.size)) {
    throw bad(`${what} ${src.digest}: the blob hashes to ${rep.inputDigest} (${rep.inputBytes} bytes, descriptor says ${src.size}); the archive is corrupt or was altered`);
  }
  if (src.diffId !== undefined && rep.diffId !== src.diffId) {
    throw bad(`${what} (${src.label}): its uncompressed content hashes to ${rep.diffId}, but the image config's rootfs.diff_ids says ${src.diffId}; the archive is corrupt or was altered`);
  }
}

/**
 * Imports one image from `path` into `store` as `opts.name:opts.tag` and returns the
 * stored manifest with what was sanitised (see {@link ImportResult}). `path` may be:
 *   1. an OCI image layout directory (`oci-layout`, `index.json`, `blobs/sha256/…`);
 *   2. a tar of one (e.g. `podman save --format oci-archive`; newer `docker save` output
 *      also has an OCI layout and is read as one);
 *   3. a docker-archive tar (`docker save`, `podman save --format docker-archive`:
 *      `manifest.json` + layer tars), or such a tar unpacked into a directory.
 * Archive files may be plain, gzip or zstd tars (detected from their bytes); they are
 * unpacked (sanitised) into the store's tmp/ first. The image is the archive's only one,
 * or the one `opts.ref` names; multi-platform indexes resolve to this host's
 * linux/<arch>. Each source layer becomes one EROFS layer (empty ones are skipped);
 * config per {@link imageConfigFromOci}. Progress phases: see {@link ImportProgress}.
 *
 * Throws DsecError: InvalidArgument for a bad name/tag, an archive with no entries, an
 * unrecognised, corrupt or malformed archive, an ambiguous or unknown ref (the message
 * lists the archive's refs), a digest or size mismatch (naming the digest), an
 * unsupported layer media type, or anything extractLayerTar refuses; NotFound when `path`
 * does not exist; FailedPrecondition / ResourceExhausted / Internal as extractLayerTar
 * and buildErofs (Internal only for failures of the host, never for the archive's
 * content). Temp dirs are removed in every case, and the manifest is written only after
 * every layer is stored.
 */
export async function importArchiveWithNotes(store: ImageStore, path: string, opts: ImportArchiveOptions): Promise<ImportResult> {
  parseRef(`${opts.name}:${opts.tag}`);
  const abs = resolve(path);
  const st = await statInput(abs);
  if (!st.isDirectory() && !st.isFile()) throw bad(`${abs} is neither a file nor a directory`);
  return withWorkDir(store, async (work, touch, job) => {
    const notes = new Notes(opts.onProgress);
    let root = abs;
    if (st.isFile()) {
      root = join(work, 'archive');
      opts.onProgress?.({ phase: 'unpack', bytes: 0 });
      let rep: ExtractReport;
      try {
        rep = await extract(job, work, abs, 'archive', {
          ociWhiteouts: false,
          onProgress: (bytes) => {
            touch();
            opts.onProgress?.({ phase: 'unpack', bytes });
          },
        });
      } catch (e) {
        if (e instanceof DsecError) throw new DsecError(e.kind, `${abs}: ${e.message}`, { cause: e });
        throw e;
      }
      if (rep.entries === 0) throw bad(`${abs}: the archive has no entries`);
      notes.add(rep.sanitised, 'archive');
    }
    const has = async (f: string) => (await stat(join(root, f)).catch(() => undefined))?.isFile() ?? false;
    let image: ResolvedImage;
    if ((await has('oci-layout')) && (await has('index.json'))) image = await resolveOci(root, opts.ref, abs);
    else if (await has('manifest.json')) image = await resolveDocker(root, opts.ref, abs);
    else {
      throw bad(
        `${abs} is neither an OCI image layout (oci-layout + index.json) nor a docker/podman save archive (manifest.json); a root filesystem tar is imported as type "tar" (dsec image import --format tar)`,
      );
    }
    const config = imageConfigFromOci(image.config);
    if (image.layers.length === 0) throw bad(`${abs}: the image has no layers`);
    const manifest = await buildImage(store, work, job, image.layers, config, opts, `oci:${abs}`, touch, notes);
    return { manifest, notes: notes.lines };
  });
}

/** {@link importArchiveWithNotes}, returning only the manifest (the notes still go to `onProgress`). */
export async function importArchive(store: ImageStore, path: string, opts: ImportArchiveOptions): Promise<ImageManifest> {
  return (await importArchiveWithNotes(store, path, opts)).manifest;
}

/** Sanitisation notes of one import, also reported through `onProgress` (phase `sanitised`). */
class Notes {
  readonly lines: string[] = [];
  constructor(private readonly onProgress?: (p: ImportProgress) => void) {}

  /** Adds the notes of one extraction; `prefix` names it (`archive`, `layer 2/3`), none for a plain tar. */
  add(sanitised: string[], prefix?: string, layer?: { layer: number; layers: number }): void {
    for (const s of sanitised) {
      const line = prefix ? `${prefix}: ${s}` : s;
      this.lines.push(line);
      this.onProgress?.({ phase: 'sanitised', ...layer, message: line });
    }
  }

  /** The summary event, when anything was noted. */
  summary(): void {
    const n = this.lines.length;
    if (n === 0) return;
    this.onProgress?.({ phase: 'sanitised', summary: true, message: `sanitised: ${n} kind${n === 1 ? '' : 's'} of entries changed instead of refused (listed above)` });
  }
}

/** Extracts, verifies and stores each layer, then the manifest. */
async function buildImage(
  store: ImageStore,
  work: string,
  job: BuilderJob | undefined,
  layers: LayerSource[],
  config: ImageManifest['config'],
  opts: { name: string; tag: string; tenant?: string; onProgress?(p: ImportProgress): void },
  source: string,
  touch: () => void,
  notes: Notes,
  plainTar = false,
): Promise<ImageManifest> {
  const n = layers.length;
  const digests: string[] = [];
  for (let i = 0; i < n; i++) {
    const src = layers[i];
    const what = `layer ${i + 1}/${n}`;
    const dir = join(work, `layer-${i}`);
    if (!job) {
      await mkdir(dir, { mode: 0o755 });
      await chmod(dir, 0o755); // the layer's root directory, whatever the umask (the builder's worker does the same)
    }
    opts.onProgress?.({ phase: 'layer', layer: i + 1, layers: n, bytes: 0 });
    let rep: ExtractReport;
    try {
      rep = await extract(job, work, src.file, `layer-${i}`, {
        ociWhiteouts: !plainTar,
        onProgress: (bytes) => {
          touch();
          opts.onProgress?.({ phase: 'layer', layer: i + 1, layers: n, bytes });
        },
      });
    } catch (e) {
      if (e instanceof DsecError) throw new DsecError(e.kind, plainTar ? `${src.label}: ${e.message}` : `${what} (${src.label}): ${e.message}`, { cause: e });
      throw e;
    }
    verifyLayer(src, rep, what);
    if (plainTar && rep.entries === 0) throw bad(`${src.label}: the archive has no entries`);
    notes.add(rep.sanitised, plainTar ? undefined : what, { layer: i + 1, layers: n });
    const keepEmpty = i === n - 1 && digests.length === 0; // an image needs one layer
    if (rep.entries > 0 || keepEmpty) {
      opts.onProgress?.({ phase: 'build', layer: i + 1, layers: n });
      const blob = job
        ? await store.addLayerFromJob(job, `layer-${i}`, { source: `${source}#${i}`, opaque: rep.opaque })
        : await store.addLayerFromDir(dir, { source: `${source}#${i}` });
      digests.push(blob.digest);
    }
    await rm(dir, { recursive: true, force: true });
    touch();
  }
  notes.summary();
  opts.onProgress?.({ phase: 'manifest' });
  const m: ImageManifest = { name: opts.name, tag: opts.tag, layers: digests, config, created_ms: Date.now(), ...ownTenant(opts.tenant ?? SYSTEM_TENANT) };
  await store.putManifest(m);
  return m;
}

/**
 * Imports a plain root filesystem tar (plain, gzip or zstd; e.g. `tar -C rootfs -c .`)
 * as a one-layer image `opts.name:opts.tag` and returns the stored manifest with what
 * was sanitised (see {@link ImportResult}; these notes have no prefix). The tar is
 * extracted with the same sanitisation as archive layers but WITHOUT whiteout
 * conversion (`.wh.*` names stay ordinary files). Config: {@link ROOTFS_TAR_DEFAULTS}
 * overridden field by field by `opts.config`.
 *
 * Throws DsecError: InvalidArgument (bad name/tag, `path` is a directory, the tar is
 * empty or has no entries, anything extractLayerTar refuses), NotFound (no such file),
 * otherwise as extractLayerTar and buildErofs. Temp dirs are always removed; no manifest
 * is written on failure.
 */
export async function importTarWithNotes(store: ImageStore, path: string, opts: ImportTarOptions): Promise<ImportResult> {
  parseRef(`${opts.name}:${opts.tag}`);
  const abs = resolve(path);
  const st = await statInput(abs);
  if (st.isDirectory()) throw bad(`${abs} is a directory, not a tar of a root filesystem`);
  if (!st.isFile()) throw bad(`${abs} is not a regular file, so not a tar of a root filesystem`);
  const c = opts.config ?? {};
  const config: ImageManifest['config'] = {
    env: c.env ?? ROOTFS_TAR_DEFAULTS.env,
    cwd: c.cwd ?? ROOTFS_TAR_DEFAULTS.cwd,
    user: c.user ?? ROOTFS_TAR_DEFAULTS.user,
    cmd: c.cmd ?? ROOTFS_TAR_DEFAULTS.cmd,
  };
  return withWorkDir(store, async (work, touch, job) => {
    const notes = new Notes(opts.onProgress);
    const manifest = await buildImage(store, work, job, [{ file: abs, label: abs }], config, opts, `tar:${abs}`, touch, notes, true);
    return { manifest, notes: notes.lines };
  });
}

/** {@link importTarWithNotes}, returning only the manifest (the notes still go to `onProgress`). */
export async function importTar(store: ImageStore, path: string, opts: ImportTarOptions): Promise<ImageManifest> {
  return (await importTarWithNotes(store, path, opts)).manifest;
}
