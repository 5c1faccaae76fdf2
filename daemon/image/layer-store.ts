/**
 * The layer store: content-addressed EROFS layer blobs, their metadata, and named image
 * manifests. The store directory may be a shared filesystem (CephFS, NFS, JuiceFS, 3FS,
 * or a local dir) that many hosts and instances use at once.
 *
 * On-disk layout under `root`:
 *
 *   blobs/sha256/<64 hex>          one EROFS layer each, named by the sha256 of its bytes (mode 0444)
 *   layers/<64 hex>.json           {@link LayerMeta}: size, created, source, builder
 *   manifests/<name>/@<tag>.json   one {@link ImageManifest} of tenant `system` each (names may contain `/`):
 *                                  the shared base images every tenant reads (the layout before tenancy, unchanged)
 *   tenants/<tenant>/manifests/<name>/@<tag>.json   one image of that tenant each, seen by it and admins only
 *   leases/<host>/<instance>/<hex> present while a sandbox of that instance on that host uses the blob
 *   tmp/<host>-<pid>-<random>...   scratch of one writer; stale entries are removed by prune
 *
 * Per-instance local state (never shared) lives in `localDir`: `verified/<hex>` records
 * that this host hashed a blob before its first mount, and `cache/` holds copies of
 * remote blobs when a local cache is configured (daemon/image/cache.ts).
 *
 * Crash and concurrency contract:
 * - every file appears atomically (temp file in tmp/ or beside the target, fsync,
 *   rename), so a reader never sees a partial blob, metadata file or manifest;
 * - two writers building the same layer at once each write their own temp file and
 *   rename it over the same name: the bytes are identical (builds are reproducible), so
 *   either rename yields the same blob, and a mount of the replaced inode stays valid;
 * - prune removes only blobs that no manifest, no lease and no live sandbox of the
 *   calling instance references, and only when older than a grace period, so a blob
 *   published by a build whose manifest is not written yet is never taken.
 *
 * Image names are per tenant (docs/SECURITY.md "Tenancy"): a name resolves in the
 * caller's tenant first, then in `system`; another tenant's image of that name is never
 * seen by name (NotFound as a missing one). Layers stay host-wide and content-addressed,
 * so identical content is stored once whichever tenants name it.
 *
 * With a {@link Builder} (dsecd always has one unless `[builder] enabled = false`),
 * mkfs.erofs runs as the builder identity: over a read-only idmapped view of a source dir
 * ({@link LayerStore.addLayerFromDir}) or over a staging tree the builder made itself
 * ({@link LayerStore.addLayerFromJob}); root then checks the blob the builder wrote, makes
 * it root's (0444) and renames it into blobs/. Without one, root runs mkfs.erofs itself.
 */
import { randomBytes } from 'node:crypto';
import { constants as fsc, existsSync } from 'node:fs';
import { access, chmod, copyFile, mkdir, open, readdir, readFile, rename, rm, stat, unlink, utimes, writeFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import { dirname, join, relative, sep } from 'node:path';
import { DsecError } from '../errors.js';
import { BUSYBOX_PATH_ENV, prepareBusyboxTree } from './builtin.js';
import { buildErofs, listOpaqueDirs, mkfsAsBuilder, refuseDevices, sha256File, type BuildErofsOptions } from './erofs.js';
import * as native from '../host/native.js';
import type { Builder, BuilderJob } from '../host/builder.js';
import { closeSync, createReadStream } from 'node:fs';
import { createHash } from 'node:crypto';
import { checkImageSecurity } from './security.js';
import { FileTextCache } from './file-cache.js';
import type { ImageSecurity } from '../model/image.js';
import { SYSTEM_SCOPE, SYSTEM_TENANT, TENANT_RE, imageTenant, ownTenant, type Scope } from '../model/tenant.js';
export { imageTenant, ownTenant } from '../model/tenant.js';

/** An image: an ordered stack of layers plus the process defaults for sandboxes made from it. */
export interface ImageManifest {
  /** Repository-style name, e.g. `"busybox"` or `"team/py311"` (lowercase, digits, `._-`, `/`). */
  name: string;
  /** Tag, e.g. `"latest"`. */
  tag: string;
  /** Layer digests (`"sha256:<hex>"`), LOWEST first: layers[0] is the base. */
  layers: string[];
  /** Process defaults. */
  config: {
    /** Environment, `KEY=value` each. */
    env: string[];
    /** Working directory inside the sandbox (absolute). */
    cwd: string;
    /** User as `uid[:gid]` or a name resolved inside the image, e.g. `"0:0"`. */
    user: string;
    /** Default command (argv). */
    cmd: string[];
    /**
     * Security defaults for sandboxes of this image (daemon/image/security.ts): a seccomp
     * override and filesystem options. Absent: none (dsecd's config decides).
     */
    security?: ImageSecurity;
  };
  /** Creation time, milliseconds since the Unix epoch. */
  created_ms: number;
  /**
   * The tenant the name belongs to; absent means `system` (a shared base image). Set by
   * the store from where the manifest lies (never trusted from the file's content) and
   * read by {@link LayerStore.putManifest} to decide where it is written.
   */
  tenant?: string;
}

/** Name of the built-in image (see builtin.ts). */
export const BUILTIN_BUSYBOX = 'busybox';
/** Tag used when a ref names no tag. */
export const DEFAULT_TAG = 'latest';

const NAME_RE = /^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:\/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$/;
/** Longest name (chars): distribution/reference's total; keeps each path component of a manifest under NAME_MAX (255). */
const NAME_MAX_CHARS = 255;
const TAG_RE = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/;
const DIGEST_RE = /^sha256:([0-9a-f]{64})$/;

/**
 * Splits an image ref `name[:tag]` into name and tag (tag defaults to `latest`).
 * Throws an InvalidArgument DsecError for malformed refs (uppercase names, `..`, a name
 * over 255 characters, digests `@sha256:` — not supported yet).
 */
export function parseRef(ref: string): { name: string; tag: string } {
  const slash = ref.lastIndexOf('/');
  const colon = ref.lastIndexOf(':');
  const [name, tag] = colon > slash ? [ref.slice(0, colon), ref.slice(colon + 1)] : [ref, DEFAULT_TAG];
  if (name.length > NAME_MAX_CHARS || !NAME_RE.test(name) || !TAG_RE.test(tag)) {
    throw new DsecError('InvalidArgument', `invalid image ref ${JSON.stringify(ref)}: want name[:tag], name at most ${NAME_MAX_CHARS} characters, e.g. busybox:latest`);
  }
  return { name, tag };
}

/**
 * Returns the hex part of a `"sha256:<64 lowercase hex>"` digest.
 * Throws an InvalidArgument DsecError for anything else.
 */
export function digestHex(digest: string): string {
  const m = DIGEST_RE.exec(digest);
  if (!m) throw new DsecError('InvalidArgument', `invalid digest ${JSON.stringify(digest)}: want sha256:<64 hex>`);
  return m[1];
}

/**
 * Checks the shape of a parsed manifest, including its `config.security`; throws a
 * DsecError naming `where` if wrong: Internal for a stored manifest, `kind` (e.g.
 * InvalidArgument for one about to be written).
 */
function checkManifest(m: unknown, where: string, kind: 'Internal' | 'InvalidArgument' = 'Internal'): ImageManifest {
  const o = m as ImageManifest;
  const ok =
    !!o &&
    typeof o.name === 'string' &&
    typeof o.tag === 'string' &&
    Array.isArray(o.layers) &&
    o.layers.every((d) => typeof d === 'string' && DIGEST_RE.test(d)) &&
    !!o.config &&
    Array.isArray(o.config.env) &&
    typeof o.config.cwd === 'string' &&
    typeof o.config.user === 'string' &&
    Array.isArray(o.config.cmd) &&
    typeof o.created_ms === 'number';
  if (!ok) throw new DsecError('Internal', `manifest ${where} is malformed`);
  if (o.config.security !== undefined) {
    const sec = checkImageSecurity(o.config.security);
    if (!sec.ok) throw new DsecError(kind, `image ${where}: ${sec.message}`);
  }
  return o;
}

/**
 * Writes `data` to `file` atomically: temp file in the same directory, fsync, rename.
 * The directory is created if needed.
 */
export async function writeFileAtomic(file: string, data: string | Buffer, mode = 0o644): Promise<void> {
  await mkdir(dirname(file), { recursive: true });
  const tmp = `${file}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
  const fh = await open(tmp, 'w', mode);
  try {
    await fh.writeFile(data);
    await fh.sync();
  } finally {
    await fh.close();
  }
  try {
    await rename(tmp, file);
  } catch (e) {
    await rm(tmp, { force: true });
    throw e;
  }
}

/** Metadata of one layer, stored beside its blob. */
export interface LayerMeta {
  /** `"sha256:<hex>"` of the blob's bytes. */
  digest: string;
  /** Blob size, bytes. */
  size_bytes: number;
  /** When the blob was first published, ms since the Unix epoch. */
  created_at: number;
  /** Where the content came from, e.g. `dir:/srv/tree`, `oci:/tmp/x.tar#2`, `commit:<sandbox id>`, `builtin:busybox`. */
  source: string;
  /** Who built it: `<host>/<instance>`. */
  builder: string;
}

/** Identity of the instance using the store: keys leases and temp files. */
export interface StoreOwner {
  host: string;
  instance: string;
}

/** Options for {@link LayerStore}. */
export interface LayerStoreOptions {
  /** The store directory; may be shared by many hosts. Created by init(). */
  root: string;
  /** This instance's private state dir (verification markers). Default `<root>/local`. */
  localDir?: string;
  /** Identity for leases and temp names. Default this host's name and instance `default`. */
  owner?: StoreOwner;
  /** Called with a message for recoverable problems (e.g. an unreadable manifest skipped by list). */
  onWarning?: (msg: string) => void;
  /**
   * Blobs younger than this are never pruned even when unreferenced: 10 minutes, far
   * longer than publishing a blob and then its manifest takes, so prune never races a build.
   */
  pruneGraceMs?: number;
  /**
   * The builder identity that runs mkfs.erofs (and, through the importers and commit,
   * extraction and copies). Default none: root (this process) does everything, as in
   * unit tests and with `[builder] enabled = false`.
   */
  builder?: Builder;
  /** The mkfs.erofs binary for every layer this store builds (`[images] mkfs_path`); default `mkfs.erofs` on PATH. */
  mkfsPath?: string;
}

/** What {@link LayerStore.prune} removed. */
export interface PruneReport {
  /** Layers removed (blob and metadata). */
  removed: LayerMeta[];
  /** Bytes of blobs removed. */
  freed_bytes: number;
  /** Unreferenced blobs kept because they are younger than the grace period. */
  kept_young: string[];
  /** Stale temp entries removed. */
  tmp_removed: number;
}

/**
 * Most layers in one image: 48. The overlay's lowerdir list must fit in one 4 KiB page
 * of mount options, and each sandbox's lower paths are ~70 bytes each.
 */
export const MAX_LAYERS = 48;

/** Default prune grace period: 10 minutes (see {@link LayerStoreOptions.pruneGraceMs}). */
export const PRUNE_GRACE_MS = 10 * 60 * 1000;
/** Temp entries older than this (1 hour) belong to a crashed writer and are removed by prune. */
const TMP_STALE_MS = 60 * 60 * 1000;

const HEX64 = /^[0-9a-f]{64}$/;

/** See the module comment for the layout and crash-safety contract. */
export class LayerStore {
  /** The store directory. */
  readonly root: string;
  /** This instance's private state dir. */
  readonly localDir: string;
  /** Identity for leases and temp names. */
  readonly owner: StoreOwner;
  /** The builder identity, if this store builds as one (see {@link LayerStoreOptions.builder}). */
  readonly builder: Builder | undefined;
  private readonly mkfsPath: string | undefined;
  private readonly graceMs: number;
  private readonly onWarning?: (msg: string) => void;
  private builtinOnce: Promise<void> | undefined;
  /** Manifest texts, checked against their files by one stat per read (daemon/image/file-cache.ts). */
  private readonly manifestTexts = new FileTextCache();
  private leaseChain: Promise<void> = Promise.resolve();

  /** Does no I/O; call {@link init} before use. */
  constructor(opts: LayerStoreOptions) {
    this.root = opts.root;
    this.localDir = opts.localDir ?? join(opts.root, 'local');
    this.owner = opts.owner ?? { host: hostname(), instance: 'default' };
    this.graceMs = opts.pruneGraceMs ?? PRUNE_GRACE_MS;
    this.onWarning = opts.onWarning;
    this.builder = opts.builder;
    this.mkfsPath = opts.mkfsPath;
  }

  private get blobsDir(): string {
    return join(this.root, 'blobs', 'sha256');
  }
  private get manifestsDir(): string {
    return join(this.root, 'manifests');
  }
  /** Where `tenant`'s manifests lie: `manifests/` for `system`, `tenants/<tenant>/manifests/` for any other. */
  private manifestsDirOf(tenant: string): string {
    if (tenant === SYSTEM_TENANT) return this.manifestsDir;
    if (!TENANT_RE.test(tenant)) throw new DsecError('InvalidArgument', `invalid tenant ${JSON.stringify(tenant)}`);
    return join(this.root, 'tenants', tenant, 'manifests');
  }
  private get layersDir(): string {
    return join(this.root, 'layers');
  }
  /** Scratch area for writers (shared; entries are named after their writer). */
  get tmpDir(): string {
    return join(this.root, 'tmp');
  }
  private get leaseDir(): string {
    return join(this.root, 'leases', this.owner.host, this.owner.instance);
  }

  /** A fresh temp path in tmp/ named after this writer: `<host>-<pid>-<random><suffix>`. */
  tmpPath(suffix = ''): string {
    return join(this.tmpDir, `${this.owner.host}-${process.pid}-${randomBytes(6).toString('hex')}${suffix}`);
  }

  /**
   * Creates the layout. Safe to call again and from many hosts at once. Removes only
   * temp entries that a dead process of this host left (other writers' temp files may
   * be in flight; prune removes stale ones of any host after an hour).
   */
  async init(): Promise<void> {
    for (const d of [this.blobsDir, this.manifestsDir, this.layersDir, this.tmpDir, this.leaseDir, join(this.localDir, 'verified')]) {
      await mkdir(d, { recursive: true, mode: 0o700 });
    }
    // Images may contain task data; only root (on any host sharing the store) reads them.
    await chmod(this.root, 0o700).catch(() => undefined);
    // Scratch left by a writer of this host that died (a crashed import, build or commit).
    for (const f of await readdir(this.tmpDir)) {
      const m = /^(.+)-(\d+)-[0-9a-f]{12}/.exec(f);
      if (!m || m[1] !== this.owner.host) continue;
      const pid = Number(m[2]);
      if (pid !== process.pid && !existsSync(`/proc/${pid}`)) await rm(join(this.tmpDir, f), { recursive: true, force: true });
    }
  }

  /**
   * Path of the blob file for `digest` (`<root>/blobs/sha256/<hex>`), whether or not it
   * exists. Throws an InvalidArgument DsecError for a malformed digest.
   */
  blobPath(digest: string): string {
    return join(this.blobsDir, digestHex(digest));
  }

  /** True when the blob for `digest` exists (no content check; see {@link verifyBlob}). */
  async hasBlob(digest: string): Promise<boolean> {
    return access(this.blobPath(digest), fsc.R_OK).then(
      () => true,
      () => false,
    );
  }

  /**
   * Re-hashes the blob for `digest` and checks it matches.
   * Throws NotFound when the blob is missing, FailedPrecondition when its content hashes
   * to something else (corruption: the blob must be deleted and rebuilt or re-fetched).
   */
  async verifyBlob(digest: string): Promise<void> {
    const path = this.blobPath(digest);
    let actual: string;
    try {
      actual = await sha256File(path);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') throw new DsecError('NotFound', `layer ${digest}: blob not found in the store (${path})`);
      throw e;
    }
    if (actual !== digest) {
      throw new DsecError('FailedPrecondition', `layer ${digest}: blob ${path} is corrupt (its content hashes to ${actual}); refusing to mount it. Remove it and rebuild or re-import the layer`);
    }
  }

  /**
   * The blob path to mount for `digest`, verified against its digest before the first
   * mount on this host. The verification is recorded in `<localDir>/verified/<hex>` with
   * the blob's size, mtime and inode, so it is redone when the file changes.
   * @throws DsecError NotFound (missing blob), Internal (digest mismatch: never mounted).
   */
  async prepareForMount(digest: string): Promise<string> {
    const path = this.blobPath(digest);
    const st = await stat(path).catch(() => undefined);
    if (!st) throw new DsecError('NotFound', `layer ${digest} is missing from the store (${path})`);
    // ctime cannot be set from user space: an in-place edit that restores the mtime still changes it.
    const stamp = `${st.size}:${st.mtimeMs}:${st.ctimeMs}:${st.ino}`;
    const marker = join(this.localDir, 'verified', digestHex(digest));
    const seen = await readFile(marker, 'utf8').catch(() => '');
    if (seen !== stamp) {
      await this.verifyBlob(digest);
      // The hash pass read the whole blob: evict it again, so that sandboxes load the
      // layer's blocks on demand rather than finding the whole layer resident.
      try {
        native.dropCache(path);
      } catch { /* advisory */ }
      await writeFileAtomic(marker, stamp);
    }
    return path;
  }

  /**
   * Makes this instance's leases exactly `digests`: the layers of every sandbox the
   * instance has (running or not). Prune on any host keeps leased blobs, so a stopped
   * sandbox keeps its lower layers even after its image manifest is removed. Calls are
   * serialised, each applying the set computed when it was made, in order.
   */
  syncLeases(digests: Iterable<string>): Promise<void> {
    const want = new Set([...digests].map(digestHex));
    const run = async () => {
      await mkdir(this.leaseDir, { recursive: true });
      const have = new Set((await readdir(this.leaseDir)).filter((f) => HEX64.test(f)));
      for (const h of have) if (!want.has(h)) await unlink(join(this.leaseDir, h)).catch(() => undefined);
      for (const h of want) if (!have.has(h)) await writeFile(join(this.leaseDir, h), '');
    };
    this.leaseChain = this.leaseChain.then(run, run);
    return this.leaseChain;
  }

  /**
   * Packs `srcDir` into an EROFS blob and stores it by digest (the bytes are not
   * rewritten when a blob with that digest is present), with metadata. Returns the
   * layer's metadata (plus `sizeBytes`, as buildErofs reports it).
   *
   * With a builder, mkfs.erofs runs as a builder slot over a read-only idmapped view of
   * `srcDir` (host ids 0..65535 keep their values in the layer; larger ids become 65534;
   * mounts below `srcDir` are not crossed), and `srcDir`'s opaque directories are found
   * by root ({@link listOpaqueDirs}); the builder needs no permission on `srcDir`.
   * Errors as {@link buildErofs}; with a builder also FailedPrecondition when the
   * filesystem of `srcDir` cannot be idmapped.
   */
  async addLayerFromDir(srcDir: string, opts: BuildErofsOptions & { source?: string } = {}): Promise<LayerMeta & { sizeBytes: number }> {
    const source = opts.source ?? `dir:${srcDir}`;
    if (this.builder) {
      const st = await stat(srcDir).catch(() => undefined);
      if (!st?.isDirectory()) throw new DsecError('InvalidArgument', `layer source ${srcDir} is not a directory`);
      if (!opts.skipDeviceCheck) await refuseDevices(srcDir);
      const opaque = await listOpaqueDirs(srcDir);
      return this.builder.withJob(async (job) => {
        const view = job.view(srcDir, 0);
        try {
          return await this.publishBuilt(job, view, { ...opts, opaque }, source);
        } finally {
          closeSync(view);
        }
      });
    }
    const tmp = this.tmpPath('.erofs');
    try {
      const blob = await buildErofs(srcDir, tmp, { mkfsPath: this.mkfsPath, ...opts });
      if (!(await this.hasBlob(blob.digest))) {
        await chmod(tmp, 0o444);
        await mkdir(this.blobsDir, { recursive: true });
        await rename(tmp, this.blobPath(blob.digest));
        await this.markVerified(blob.digest);
      }
      return await this.recordLayer(blob.digest, blob.sizeBytes, source);
    } finally {
      await rm(tmp, { force: true });
    }
  }

  /**
   * Packs the tree `treeRel` that the builder made in `job`'s staging dir (an extracted
   * layer, a copied writable layer) as a layer, like {@link addLayerFromDir}; `opts.opaque`
   * lists its opaque directories (the builder could not mark them). The device check runs
   * as root over the tree (nothing of the builder runs any more).
   * @throws DsecError InvalidArgument (a device node other than a whiteout), Internal
   *   (mkfs.erofs failed, or the tree or blob is not what the builder should have left).
   */
  async addLayerFromJob(job: BuilderJob, treeRel: string, opts: BuildErofsOptions & { source: string }): Promise<LayerMeta & { sizeBytes: number }> {
    if (!opts.skipDeviceCheck) await refuseDevices(job.path(treeRel));
    const fd = job.openDir(treeRel);
    try {
      return await this.publishBuilt(job, fd, opts, opts.source);
    } finally {
      closeSync(fd);
    }
  }

  /** mkfs.erofs as the builder over `srcFd`, then root takes the blob over: hash, root:root 0444, rename into blobs/, metadata. */
  private async publishBuilt(job: BuilderJob, srcFd: number, opts: BuildErofsOptions, source: string): Promise<LayerMeta & { sizeBytes: number }> {
    const out = 'layer.erofs';
    await mkfsAsBuilder(job, srcFd, out, { mkfsPath: this.mkfsPath, ...opts });
    const { fd, path } = job.adopt(out, 0o444);
    let digest: string;
    let size: number;
    try {
      const hash = createHash('sha256');
      size = 0;
      for await (const c of createReadStream('', { fd, autoClose: false, start: 0, highWaterMark: 1 << 20 })) {
        hash.update(c as Buffer);
        size += (c as Buffer).length;
      }
      digest = `sha256:${hash.digest('hex')}`;
    } finally {
      closeSync(fd);
    }
    if (!(await this.hasBlob(digest))) {
      await mkdir(this.blobsDir, { recursive: true });
      try {
        await rename(path, this.blobPath(digest));
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EXDEV') throw e;
        // A store on another filesystem than the builder's work dir (e.g. a shared one):
        // copy into the store's tmp/ first, so the blob still appears by one rename.
        const tmp = this.tmpPath('.erofs');
        try {
          await copyFile(path, tmp);
          await chmod(tmp, 0o444);
          await rename(tmp, this.blobPath(digest));
        } finally {
          await rm(tmp, { force: true });
        }
      }
      await this.markVerified(digest);
    }
    return this.recordLayer(digest, size, source);
  }

  /** Records that this host hashed the blob `digest` while building it, so its first mount does not read it all again. */
  private async markVerified(digest: string): Promise<void> {
    const st = await stat(this.blobPath(digest));
    await writeFileAtomic(join(this.localDir, 'verified', digestHex(digest)), `${st.size}:${st.mtimeMs}:${st.ctimeMs}:${st.ino}`);
  }

  /** Writes (or reuses) the layer's metadata and marks it as just used; returns it with the blob size. */
  private async recordLayer(digest: string, sizeBytes: number, source: string): Promise<LayerMeta & { sizeBytes: number }> {
    const meta = await this.ensureLayerMeta(digest, sizeBytes, source);
    // Mark the layer as just used, so prune's grace period protects a reused blob
    // until the manifest that will reference it is written.
    const now = new Date();
    await utimes(join(this.layersDir, `${digestHex(digest)}.json`), now, now).catch(() => undefined);
    return { ...meta, sizeBytes };
  }

  /** Writes layer metadata unless present; returns what is stored. */
  private async ensureLayerMeta(digest: string, size: number, source: string): Promise<LayerMeta> {
    const file = join(this.layersDir, `${digestHex(digest)}.json`);
    try {
      return JSON.parse(await readFile(file, 'utf8')) as LayerMeta;
    } catch {
      const meta: LayerMeta = { digest, size_bytes: size, created_at: Date.now(), source, builder: `${this.owner.host}/${this.owner.instance}` };
      await writeFileAtomic(file, `${JSON.stringify(meta)}\n`);
      return meta;
    }
  }

  /**
   * Metadata of one layer. A blob without a metadata file (published by an older
   * version, or metadata lost) gets metadata synthesised from the file.
   * @throws DsecError NotFound when the blob does not exist.
   */
  async layer(digest: string): Promise<LayerMeta> {
    const file = join(this.layersDir, `${digestHex(digest)}.json`);
    const st = await stat(this.blobPath(digest)).catch(() => undefined);
    if (!st) throw new DsecError('NotFound', `layer ${digest} not found`);
    try {
      return JSON.parse(await readFile(file, 'utf8')) as LayerMeta;
    } catch {
      return { digest, size_bytes: st.size, created_at: Math.round(st.mtimeMs), source: 'unknown', builder: 'unknown' };
    }
  }

  /** Every layer blob in the store, oldest first. */
  async layers(): Promise<LayerMeta[]> {
    const out: LayerMeta[] = [];
    for (const f of await readdir(this.blobsDir).catch(() => [] as string[])) {
      if (!HEX64.test(f)) continue;
      const m = await this.layer(`sha256:${f}`).catch(() => undefined);
      if (m) out.push(m);
    }
    return out.sort((a, b) => a.created_at - b.created_at || a.digest.localeCompare(b.digest));
  }

  /**
   * Stores `m` as `<its tenant's manifests dir>/<name>/@<tag>.json` atomically, replacing
   * any previous one of that tenant (another tenant's image of the same name is untouched).
   * Throws InvalidArgument for a bad name/tag or a malformed `config.security`, NotFound when a layer blob is missing
   * (manifests never point at absent blobs).
   */
  async putManifest(m: ImageManifest): Promise<void> {
    parseRef(`${m.name}:${m.tag}`);
    checkManifest(m, `${m.name}:${m.tag}`, 'InvalidArgument');
    if (m.layers.length === 0) throw new DsecError('InvalidArgument', `image ${m.name}:${m.tag}: an image needs at least one layer`);
    if (m.layers.length > MAX_LAYERS) {
      throw new DsecError('InvalidArgument', `image ${m.name}:${m.tag}: ${m.layers.length} layers; at most ${MAX_LAYERS} (overlayfs mount options must fit in one page)`);
    }
    for (const d of m.layers) {
      if (!(await this.hasBlob(d))) throw new DsecError('NotFound', `image ${m.name}:${m.tag}: layer ${d} is not in the store`);
    }
    const { tenant, ...stored } = m;
    await writeFileAtomic(this.manifestPath(m.name, m.tag, tenant ?? SYSTEM_TENANT), `${JSON.stringify(stored, null, 2)}\n`);
  }

  private manifestPath(name: string, tag: string, tenant: string): string {
    // `@` cannot occur in names, so the tag file `x/@b.json` never collides with a name `x/b.json`.
    return join(this.manifestsDirOf(tenant), ...name.split('/'), `@${tag}.json`);
  }

  /**
   * Points `target` at the same layers and config as `source` (a new manifest file;
   * nothing is copied). `source` resolves in `scope` ({@link get}); `target` is written
   * in `scope.tenant`, replacing that tenant's image of that name only.
   * @throws DsecError NotFound (source), InvalidArgument (malformed refs).
   */
  async tag(source: string, target: string, scope: Scope = SYSTEM_SCOPE): Promise<ImageManifest> {
    const m = await this.get(source, scope);
    const { name, tag } = parseRef(target);
    const out: ImageManifest = { ...m, name, tag, created_ms: Date.now(), ...ownTenant(scope.tenant) };
    await this.putManifest(out);
    return out;
  }

  /**
   * Removes the manifest `ref` as {@link get} resolves it in `scope`. Its layers stay
   * until `prune` finds them unreferenced; sandboxes created from it keep running (they
   * hold their layer list).
   * @throws DsecError NotFound; PermissionDenied when `ref` resolves to a `system` image
   *   and `scope` is not an admin's (a shared base image every tenant creates from).
   */
  async removeImage(ref: string, scope: Scope = SYSTEM_SCOPE): Promise<ImageManifest> {
    const m = await this.get(ref, scope);
    const tenant = imageTenant(m);
    if (tenant !== scope.tenant && !scope.all) {
      throw new DsecError('PermissionDenied', `image ${m.name}:${m.tag} is a system image shared by every tenant; only an admin may remove it`);
    }
    await unlink(this.manifestPath(m.name, m.tag, tenant)).catch((e: NodeJS.ErrnoException) => {
      // A concurrent remove of the name won: for this call it is missing.
      throw e.code === 'ENOENT' ? new DsecError('NotFound', `image ${m.name}:${m.tag} not found`) : e;
    });
    return m;
  }

  /**
   * Removes layers that no manifest, no lease (of any host or instance) and none of
   * `inUse` references, older than the grace period; and stale temp entries.
   * Each blob is removed with one unlink after its metadata, so a crash mid-prune
   * leaves every referenced blob in place and at worst an unreferenced blob without
   * metadata (removed by the next prune).
   * @param inUse digests used by the caller's live sandboxes.
   */
  async prune(inUse: ReadonlySet<string> = new Set(), opts: { dryRun?: boolean; now?: number } = {}): Promise<PruneReport> {
    const now = opts.now ?? Date.now();
    const referenced = new Set<string>(inUse);
    // Every tenant's images keep their layers (list() without a scope walks them all).
    for (const m of await this.list()) for (const d of m.layers) referenced.add(d);
    const leasesRoot = join(this.root, 'leases');
    for (const host of await readdir(leasesRoot).catch(() => [] as string[])) {
      for (const inst of await readdir(join(leasesRoot, host)).catch(() => [] as string[])) {
        for (const h of await readdir(join(leasesRoot, host, inst)).catch(() => [] as string[])) if (HEX64.test(h)) referenced.add(`sha256:${h}`);
      }
    }
    const rep: PruneReport = { removed: [], freed_bytes: 0, kept_young: [], tmp_removed: 0 };
    for (const f of await readdir(this.blobsDir).catch(() => [] as string[])) {
      if (!HEX64.test(f)) continue;
      const digest = `sha256:${f}`;
      if (referenced.has(digest)) continue;
      const st = await stat(join(this.blobsDir, f)).catch(() => undefined);
      if (!st) continue;
      const metaSt = await stat(join(this.layersDir, `${f}.json`)).catch(() => undefined);
      const lastUsed = Math.max(st.mtimeMs, metaSt?.mtimeMs ?? 0);
      if (now - lastUsed < this.graceMs) {
        rep.kept_young.push(digest);
        continue;
      }
      const meta = await this.layer(digest).catch(() => undefined);
      if (!opts.dryRun) {
        await unlink(join(this.layersDir, `${f}.json`)).catch(() => undefined);
        await unlink(join(this.blobsDir, f)).catch(() => undefined);
      }
      rep.removed.push(meta ?? { digest, size_bytes: st.size, created_at: Math.round(st.mtimeMs), source: 'unknown', builder: 'unknown' });
      rep.freed_bytes += st.size;
    }
    for (const f of await readdir(this.tmpDir).catch(() => [] as string[])) {
      const p = join(this.tmpDir, f);
      const st = await stat(p).catch(() => undefined);
      if (st && now - st.mtimeMs > TMP_STALE_MS) {
        if (!opts.dryRun) await rm(p, { recursive: true, force: true });
        rep.tmp_removed++;
      }
    }
    return rep;
  }

  /**
   * Builds the built-in images if they are missing: today only `busybox:latest`
   * (tree from prepareBusyboxTree in tmp/, one EROFS layer, manifest). Idempotent and
   * cheap when present (the manifest and its blobs exist). Concurrent calls in one process
   * share one build. Throws FailedPrecondition when /bin/busybox is absent.
   */
  ensureBuiltinImages(): Promise<void> {
    this.builtinOnce ??= this.buildBusybox().catch((e) => {
      this.builtinOnce = undefined; // let a later call retry
      throw e;
    });
    return this.builtinOnce;
  }

  private async buildBusybox(): Promise<void> {
    try {
      const m = await this.get(BUILTIN_BUSYBOX);
      let complete = true;
      for (const d of m.layers) complete &&= (await stat(this.blobPath(d)).catch(() => undefined))?.isFile() ?? false;
      if (complete) return;
    } catch (e) {
      if (!(e instanceof DsecError && e.kind === 'NotFound')) throw e;
    }
    const tree = this.tmpPath('-busybox-tree');
    try {
      await prepareBusyboxTree(tree);
      const { digest } = await this.addLayerFromDir(tree, { allRoot: true, source: 'builtin:busybox' });
      await this.putManifest({
        name: BUILTIN_BUSYBOX,
        tag: DEFAULT_TAG,
        layers: [digest],
        config: { env: [BUSYBOX_PATH_ENV, 'HOME=/root'], cwd: '/', user: '0:0', cmd: ['/bin/sh'] },
        created_ms: Date.now(),
      });
    } finally {
      await rm(tree, { recursive: true, force: true });
    }
  }

  /**
   * The manifest for `ref` (`name` or `name:tag`, tag defaulting to `latest`) as
   * `scope` names it: `scope.tenant`'s own image of that name first, else the `system`
   * one. Another tenant's image of the name is never returned, admin or not (admins see
   * every tenant's images in {@link list}; by name they act in their own tenant, as with
   * snapshot names). The result's `tenant` says whose it is (absent: `system`).
   * Throws InvalidArgument for a malformed ref, NotFound (`image NAME:TAG not found`, the
   * same text whether no tenant or only another one has it; for an admin's scope, which
   * lists other tenants' images, it names the tenants that have one) when neither exists,
   * Internal when the stored manifest is unreadable.
   */
  async get(ref: string, scope: Scope = SYSTEM_SCOPE): Promise<ImageManifest> {
    const { name, tag } = parseRef(ref);
    if (scope.tenant !== SYSTEM_TENANT) {
      const own = await this.read(name, tag, scope.tenant);
      if (own) return own;
    }
    const m = await this.read(name, tag, SYSTEM_TENANT);
    if (m) return m;
    // An admin lists every tenant's images but resolves names in its own: say whose the name is.
    const others = scope.all ? [...new Set((await this.list()).filter((x) => x.name === name && x.tag === tag).map(imageTenant))] : [];
    const whose = others.length === 0 ? '' : ` in tenant ${scope.tenant}${scope.tenant === SYSTEM_TENANT ? '' : ' or system'}; tenant ${others.join(', ')} has one: admins resolve image names in their own tenant, so act on it with a token of that tenant (dsec token create --tenant ${others[0]} --role user)`;
    throw new DsecError('NotFound', `image ${name}:${tag} not found${whose}`);
  }

  /** `tenant`'s manifest of `name:tag`, or undefined when it has none. @throws DsecError Internal (unreadable manifest). */
  private async read(name: string, tag: string, tenant: string): Promise<ImageManifest | undefined> {
    const text = await this.manifestTexts.read(this.manifestPath(name, tag, tenant));
    if (text === undefined) return undefined;
    let m: ImageManifest;
    try {
      m = checkManifest(JSON.parse(text), `${name}:${tag}`);
    } catch (e) {
      if (e instanceof DsecError) throw e;
      throw new DsecError('Internal', `manifest ${name}:${tag} is not valid JSON`, { cause: e });
    }
    // Whose it is comes from where it lies, never from the file.
    const { tenant: _ignored, ...rest } = m;
    return { ...rest, ...ownTenant(tenant) };
  }

  /**
   * Stored manifests, sorted by name, tag, then tenant (`system` first). Without a
   * `scope`, or for an admin's, every tenant's; otherwise `system`'s and `scope.tenant`'s.
   * Skips temp files and (with a warning) unreadable manifests.
   */
  async list(scope?: Scope): Promise<ImageManifest[]> {
    const tenants = [SYSTEM_TENANT];
    if (!scope || scope.all) {
      for (const t of await readdir(join(this.root, 'tenants')).catch(() => [] as string[])) if (TENANT_RE.test(t) && t !== SYSTEM_TENANT) tenants.push(t);
    } else if (scope.tenant !== SYSTEM_TENANT) tenants.push(scope.tenant);
    const out: ImageManifest[] = [];
    for (const tenant of tenants) {
      const base = this.manifestsDirOf(tenant);
      const walk = async (dir: string): Promise<void> => {
        const entries = await readdir(dir, { withFileTypes: true }).catch((e: NodeJS.ErrnoException) => {
          if (e.code === 'ENOENT') return [];
          throw e;
        });
        for (const ent of entries) {
          const p = join(dir, ent.name);
          if (ent.isDirectory()) await walk(p);
          else if (ent.isFile() && ent.name.startsWith('@') && ent.name.endsWith('.json')) {
            const rel = relative(base, dir).split(sep);
            const tag = ent.name.slice(1, -'.json'.length);
            try {
              const { name } = parseRef(`${rel.join('/')}:${tag}`);
              const m = await this.read(name, tag, tenant);
              if (m) out.push(m);
            } catch (e) {
              // One unreadable manifest must not hide every other image.
              this.onWarning?.(`skipping manifest ${p}: ${(e as Error).message}`);
            }
          }
        }
      };
      await walk(base);
    }
    const key = (m: ImageManifest) => [m.name, m.tag, m.tenant ?? ''] as const;
    return out.sort((a, b) => {
      const [x, y] = [key(a), key(b)];
      for (let i = 0; i < 3; i++) if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
      return 0;
    });
  }
}
