/**
 * A minimal image store: content-addressed EROFS layer blobs plus named manifests.
 *
 * On-disk layout under `root` (`<instance root>/images`):
 *
 *   blobs/sha256/<64 hex>        one EROFS layer each, named by the sha256 of its bytes (mode 0444)
 *   manifests/<name>/<tag>.json  one {@link ImageManifest} each (names may contain `/`)
 *   tmp/                         scratch for builds; emptied by init()
 *
 * Every file appears atomically (written under tmp/ or as a temp file in the target
 * directory, fsynced, then renamed), so a crash leaves either the old state or the new
 * one plus garbage in tmp/, never a half-written blob or manifest.
 *
 * This is the seed of the full layer store (import from dirs/tars/OCI layouts, GC,
 * shared-filesystem roots): {@link ImageStore.addLayerFromDir} and
 * {@link ImageStore.putManifest} are the two primitives those build on.
 */
import { randomBytes } from 'node:crypto';
import { constants as fsc } from 'node:fs';
import { access, chmod, mkdir, open, readdir, readFile, rename, rm, stat } from 'node:fs/promises';
import { dirname, join, relative, sep } from 'node:path';
import { DsecError } from '../errors.js';
import { BUSYBOX_PATH_ENV, prepareBusyboxTree } from './builtin.js';
import { buildErofs, sha256File, type BuildErofsOptions } from './erofs.js';

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
  };
  /** Creation time, milliseconds since the Unix epoch. */
  created_ms: number;
}

/** Name of the built-in image (see builtin.ts). */
export const BUILTIN_BUSYBOX = 'busybox';
/** Tag used when a ref names no tag. */
export const DEFAULT_TAG = 'latest';

const NAME_RE = /^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:\/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$/;
const TAG_RE = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/;
const DIGEST_RE = /^sha256:([0-9a-f]{64})$/;

/**
 * Splits an image ref `name[:tag]` into name and tag (tag defaults to `latest`).
 * Throws an InvalidArgument DsecError for malformed refs (uppercase names, `..`,
 * digests `@sha256:` — not supported yet).
 */
export function parseRef(ref: string): { name: string; tag: string } {
  const slash = ref.lastIndexOf('/');
  const colon = ref.lastIndexOf(':');
  const [name, tag] = colon > slash ? [ref.slice(0, colon), ref.slice(colon + 1)] : [ref, DEFAULT_TAG];
  if (!NAME_RE.test(name) || !TAG_RE.test(tag)) {
    throw new DsecError('InvalidArgument', `invalid image ref ${JSON.stringify(ref)}: want name[:tag], e.g. busybox:latest`);
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

/** Checks the shape of a parsed manifest; throws an Internal DsecError naming `where` if wrong. */
function checkManifest(m: unknown, where: string): ImageManifest {
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
  return o;
}

/**
 * Writes `data` to `file` atomically: temp file in the same directory, fsync, rename.
 * The directory is created if needed.
 */
async function writeFileAtomic(file: string, data: string | Buffer, mode = 0o644): Promise<void> {
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

/** Options for {@link ImageStore}. */
export interface ImageStoreOptions {
  /** The store's directory, `<instance root>/images`. Created by init(). */
  root: string;
}

/** See the module comment for the layout and crash-safety contract. */
export class ImageStore {
  /** The store's directory (`<instance root>/images`). */
  readonly root: string;
  private builtinOnce: Promise<void> | undefined;

  /** Does no I/O; call {@link init} before use. */
  constructor(opts: ImageStoreOptions) {
    this.root = opts.root;
  }

  private get blobsDir(): string {
    return join(this.root, 'blobs', 'sha256');
  }
  private get manifestsDir(): string {
    return join(this.root, 'manifests');
  }
  private get tmpDir(): string {
    return join(this.root, 'tmp');
  }

  /**
   * Creates the layout and empties tmp/ (leftovers of builds interrupted by a crash).
   * Safe to call again. Must run before any other method, and only one process may use a
   * store root at a time (tmp/ is cleared).
   */
  async init(): Promise<void> {
    await mkdir(this.blobsDir, { recursive: true, mode: 0o700 });
    await mkdir(this.manifestsDir, { recursive: true, mode: 0o700 });
    await rm(this.tmpDir, { recursive: true, force: true });
    await mkdir(this.tmpDir, { recursive: true, mode: 0o700 });
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
   * Throws NotFound when the blob is missing, Internal when its content hashes to
   * something else (corruption: the blob must be deleted and rebuilt or re-fetched).
   */
  async verifyBlob(digest: string): Promise<void> {
    const path = this.blobPath(digest);
    let actual: string;
    try {
      actual = await sha256File(path);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') throw new DsecError('NotFound', `blob ${digest} not found`);
      throw e;
    }
    if (actual !== digest) throw new DsecError('Internal', `blob ${digest} is corrupt: its content hashes to ${actual}`);
  }

  /**
   * Packs `srcDir` into an EROFS blob and stores it by digest (no-op for the bytes if a
   * blob with that digest is already present). Returns the digest and size in bytes.
   * Errors as {@link buildErofs}.
   */
  async addLayerFromDir(srcDir: string, opts: BuildErofsOptions = {}): Promise<{ digest: string; sizeBytes: number }> {
    const tmp = join(this.tmpDir, `layer-${process.pid}-${randomBytes(6).toString('hex')}.erofs`);
    try {
      const blob = await buildErofs(srcDir, tmp, opts);
      const dst = this.blobPath(blob.digest);
      if (await this.hasBlob(blob.digest)) return blob;
      await chmod(tmp, 0o444);
      await rename(tmp, dst);
      return blob;
    } finally {
      await rm(tmp, { force: true });
    }
  }

  /**
   * Stores `m` as `manifests/<name>/<tag>.json` atomically, replacing any previous one.
   * Throws InvalidArgument for a bad name/tag, FailedPrecondition when a layer blob is
   * missing (manifests never point at absent blobs).
   */
  async putManifest(m: ImageManifest): Promise<void> {
    parseRef(`${m.name}:${m.tag}`);
    checkManifest(m, `${m.name}:${m.tag}`);
    for (const d of m.layers) {
      if (!(await this.hasBlob(d))) throw new DsecError('FailedPrecondition', `image ${m.name}:${m.tag}: layer ${d} is not in the store`);
    }
    await writeFileAtomic(this.manifestPath(m.name, m.tag), `${JSON.stringify(m, null, 2)}\n`);
  }

  private manifestPath(name: string, tag: string): string {
    return join(this.manifestsDir, ...name.split('/'), `${tag}.json`);
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
    const tree = join(this.tmpDir, `busybox-tree-${process.pid}-${randomBytes(6).toString('hex')}`);
    try {
      await prepareBusyboxTree(tree);
      const { digest } = await this.addLayerFromDir(tree, { allRoot: true });
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
   * The manifest for `ref` (`name` or `name:tag`, tag defaulting to `latest`).
   * Throws InvalidArgument for a malformed ref, NotFound when no such image is stored,
   * Internal when the stored manifest is unreadable.
   */
  async get(ref: string): Promise<ImageManifest> {
    const { name, tag } = parseRef(ref);
    const path = this.manifestPath(name, tag);
    let text: string;
    try {
      text = await readFile(path, 'utf8');
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT' || (e as NodeJS.ErrnoException).code === 'ENOTDIR') {
        throw new DsecError('NotFound', `image ${name}:${tag} not found`);
      }
      throw e;
    }
    try {
      return checkManifest(JSON.parse(text), `${name}:${tag}`);
    } catch (e) {
      if (e instanceof DsecError) throw e;
      throw new DsecError('Internal', `manifest ${name}:${tag} is not valid JSON`, { cause: e });
    }
  }

  /** All stored manifests, sorted by name then tag. Skips temp files; throws on unreadable manifests. */
  async list(): Promise<ImageManifest[]> {
    const out: ImageManifest[] = [];
    const walk = async (dir: string): Promise<void> => {
      const entries = await readdir(dir, { withFileTypes: true }).catch((e: NodeJS.ErrnoException) => {
        if (e.code === 'ENOENT') return [];
        throw e;
      });
      for (const ent of entries) {
        const p = join(dir, ent.name);
        if (ent.isDirectory()) await walk(p);
        else if (ent.isFile() && ent.name.endsWith('.json')) {
          const rel = relative(this.manifestsDir, p).split(sep);
          const tag = rel.pop()!.slice(0, -'.json'.length);
          out.push(await this.get(`${rel.join('/')}:${tag}`));
        }
      }
    };
    await walk(this.manifestsDir);
    return out.sort((a, b) => (a.name === b.name ? (a.tag < b.tag ? -1 : 1) : a.name < b.name ? -1 : 1));
  }
}
