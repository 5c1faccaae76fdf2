/**
 * Shared, refcounted read-only mounts of EROFS layer blobs.
 *
 * Each layer blob is mounted at most once per host, file-backed (mount(2) with fstype
 * "erofs" and the blob file as source — no loop device; kernel ≥ 6.12), read-only,
 * nosuid and nodev, at `<mountDir>/<hex of digest>`. Sandboxes never use these mounts
 * directly: rootfs.ts clones them into idmapped mounts per sandbox. (nosuid/nodev guard
 * the host's view of the layers only: setuid binaries in a layer still work inside a
 * sandbox, because exec checks the overlay mount, not the layer mount — tested.) The mount stays while
 * at least one sandbox holds a reference and is unmounted when the count drops to 0.
 *
 * Refcounts live in memory only. After a daemon restart the caller rebuilds them from its
 * own record (the store's sandboxes and their layers) with {@link LayerMounts.reconcile},
 * which adopts the mounts still in use and unmounts the rest: the kernel's mount table is
 * the truth about what is mounted, the caller's record about who needs it.
 *
 * Mounting goes through the native addon (one syscall, ~10 µs) rather than mount(8): the
 * daemon creates sandboxes in bursts, and a process spawn costs milliseconds.
 */
import { mkdir, readdir, realpath, rmdir } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { DsecError } from '../errors.js';
import * as native from '../host/native.js';
import { listMountsUnder } from './rootfs.js';
import { digestHex } from './layer-store.js';

/** Options for {@link LayerMounts}. */
export interface LayerMountsOptions {
  /** Directory holding one mount point per mounted blob: `<instance root>/layers`. */
  mountDir: string;
  /** Maps a digest to its blob file (LayerStore.blobPath). */
  blobPath: (digest: string) => string;
  /**
   * Called before a blob is mounted (first reference); resolves with the file to mount.
   * The daemon verifies the blob's digest here and, with a local cache, copies it in
   * (LayerStore.prepareForMount). Default: `blobPath(digest)` as is.
   */
  prepare?: (digest: string) => Promise<string>;
  /** Called after a blob was mounted (e.g. to record a lease in a shared store). */
  onMounted?: (digest: string) => Promise<void>;
  /** Called after a blob was unmounted. */
  onUnmounted?: (digest: string) => Promise<void>;
}

/** What {@link LayerMounts.reconcile} found and did (all lists hold digests, sorted). */
export interface ReconcileResult {
  /** Mounts found that nobody uses: unmounted and their dirs removed. */
  unmounted: string[];
  /** Mounts found that are in use: kept, with refcounts set from the caller's counts. */
  adopted: string[];
  /** In use per the caller but not mounted (e.g. after a reboot): left unmounted, refcount 0. */
  missing: string[];
}

const HEX_RE = /^[0-9a-f]{64}$/;

/** See the module comment. One instance per daemon; all methods are safe to call concurrently. */
export class LayerMounts {
  /** Where blob mount points live (`<instance root>/layers`). */
  readonly mountDir: string;
  private readonly blobPath: (digest: string) => string;
  private readonly hooks: Pick<LayerMountsOptions, 'prepare' | 'onMounted' | 'onUnmounted'>;
  /** digest -> references held (only digests with a live mount and refs > 0). */
  private readonly refs = new Map<string, number>();
  /** digest -> tail of the chain of operations on it (serializes acquire/release per digest). */
  private readonly locks = new Map<string, Promise<void>>();

  /** Does no I/O. */
  constructor(opts: LayerMountsOptions) {
    this.mountDir = resolve(opts.mountDir);
    this.blobPath = opts.blobPath;
    this.hooks = { prepare: opts.prepare, onMounted: opts.onMounted, onUnmounted: opts.onUnmounted };
  }

  /** Mount point for `digest`: `<mountDir>/<hex>`. Throws InvalidArgument for a malformed digest. */
  dirFor(digest: string): string {
    return join(this.mountDir, digestHex(digest));
  }

  /** Runs `fn` after every earlier operation on `digest` has finished. */
  private async locked<T>(digest: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.locks.get(digest) ?? Promise.resolve();
    let done!: () => void;
    const mine = new Promise<void>((r) => (done = r));
    const tail = prev.then(() => mine);
    this.locks.set(digest, tail);
    await prev;
    try {
      return await fn();
    } finally {
      done();
      if (this.locks.get(digest) === tail) this.locks.delete(digest);
    }
  }

  /**
   * Takes a reference on `digest`'s mount, mounting the blob first if this is the first
   * reference, and returns the mount point. Concurrent calls for one digest mount once.
   * A mount already present at the mount point (left by an earlier daemon run and not
   * reconciled) is adopted rather than stacked.
   * Throws InvalidArgument (bad digest), NotFound (no blob file), Internal (mount failed,
   * e.g. EINVAL for a blob that is not EROFS; `cause` has the errno error).
   */
  acquire(digest: string): Promise<string> {
    const dir = this.dirFor(digest);
    return this.locked(digest, async () => {
      const n = this.refs.get(digest) ?? 0;
      if (n > 0) {
        this.refs.set(digest, n + 1);
        return dir;
      }
      await mkdir(this.mountDir, { recursive: true, mode: 0o700 });
      await mkdir(dir, { recursive: true, mode: 0o755 });
      if (!native.isMountpoint(dir)) {
        let blob: string;
        try {
          blob = this.hooks.prepare ? await this.hooks.prepare(digest) : this.blobPath(digest);
        } catch (e) {
          await rmdir(dir).catch(() => undefined);
          throw e;
        }
        const c = native.constants();
        try {
          native.mount(blob, dir, 'erofs', c.MS_RDONLY | c.MS_NODEV | c.MS_NOSUID, null);
        } catch (e) {
          await rmdir(dir).catch(() => undefined);
          if (native.errnoCode(e) === 'ENOENT') throw new DsecError('NotFound', `layer ${digest}: blob ${blob} not found`, { cause: e });
          throw new DsecError('Internal', `mount layer ${digest}: ${(e as Error).message}`, { cause: e });
        }
      }
      this.refs.set(digest, 1);
      await this.hooks.onMounted?.(digest);
      return dir;
    });
  }

  /**
   * Drops one reference on `digest`; at zero the blob is unmounted (lazily detached if
   * busy) and its mount point removed. Releasing a digest that holds no reference is a
   * no-op, so a retried teardown cannot drive a count negative. Throws on unexpected
   * unmount errors; the mount is then left and adopted by the next acquire.
   */
  release(digest: string): Promise<void> {
    const dir = this.dirFor(digest);
    return this.locked(digest, async () => {
      const n = this.refs.get(digest) ?? 0;
      if (n <= 0) return;
      if (n > 1) {
        this.refs.set(digest, n - 1);
        return;
      }
      this.refs.delete(digest);
      await native.unmountAllAsync(dir);
      await rmdir(dir).catch((e: NodeJS.ErrnoException) => {
        if (e.code !== 'ENOENT') throw e;
      });
      await this.hooks.onUnmounted?.(digest);
    });
  }

  /**
   * Sets the reference count of an already-mounted `digest` to `refs` (≤ 0 forgets it
   * without unmounting). For use right after {@link reconcile} when the caller knows the
   * exact number of sandboxes per layer; it does not mount anything.
   * Throws FailedPrecondition when `refs > 0` and the mount point is not mounted.
   */
  adopt(digest: string, refs: number): void {
    if (refs <= 0) {
      this.refs.delete(digest);
      return;
    }
    if (!native.isMountpointOrMissing(this.dirFor(digest))) {
      throw new DsecError('FailedPrecondition', `cannot adopt layer ${digest}: not mounted at ${this.dirFor(digest)}`);
    }
    this.refs.set(digest, refs);
  }

  /**
   * Daemon-start recovery. Reads /proc/self/mountinfo for blob mounts under mountDir and:
   * keeps (adopts) those whose digest is in `inUse`, with refcount `inUse.get(digest)` for
   * a Map or 1 for a Set (fix up with {@link adopt}); unmounts the others and removes
   * their dirs; undoes stacked duplicate mounts; removes empty leftover mount dirs.
   * Replaces all in-memory refcounts, so call it before any acquire.
   * Mounts under mountDir that are not `<64 hex>` dirs are not ours and are left alone.
   */
  async reconcile(inUse: ReadonlySet<string> | ReadonlyMap<string, number>): Promise<ReconcileResult> {
    const want = new Map<string, number>();
    if (inUse instanceof Map) for (const [d, n] of inUse) want.set(d, n);
    else for (const d of inUse as ReadonlySet<string>) want.set(d, 1);

    await mkdir(this.mountDir, { recursive: true, mode: 0o700 });
    const real = await realpath(this.mountDir);
    const stacked = new Map<string, number>(); // digest -> times mounted
    for (const m of await listMountsUnder(real)) {
      const hex = m.slice(real.length + 1);
      if (dirname(m) !== real || !HEX_RE.test(hex)) continue;
      stacked.set(`sha256:${hex}`, (stacked.get(`sha256:${hex}`) ?? 0) + 1);
    }

    this.refs.clear();
    const result: ReconcileResult = { unmounted: [], adopted: [], missing: [] };
    for (const [digest, times] of stacked) {
      const dir = this.dirFor(digest);
      const refs = want.get(digest) ?? 0;
      if (refs > 0) {
        // Peel duplicates off the top; one mount is enough.
        for (let i = 1; i < times; i++) native.umount(dir, native.constants().MNT_DETACH);
        this.refs.set(digest, refs);
        result.adopted.push(digest);
      } else {
        native.unmountAll(dir);
        await rmdir(dir).catch(() => undefined);
        result.unmounted.push(digest);
      }
    }
    for (const [digest, n] of want) if (n > 0 && !stacked.has(digest)) result.missing.push(digest);

    for (const name of await readdir(this.mountDir)) {
      if (!HEX_RE.test(name) || stacked.has(`sha256:${name}`)) continue;
      const p = join(this.mountDir, name);
      if (!native.isMountpointOrMissing(p)) await rmdir(p).catch(() => undefined);
    }
    result.unmounted.sort();
    result.adopted.sort();
    result.missing.sort();
    return result;
  }

  /** Digests currently mounted and referenced, sorted. */
  mounted(): string[] {
    return [...this.refs.keys()].sort();
  }

  /** References currently held on `digest` (0 when not mounted by this instance). */
  refCount(digest: string): number {
    return this.refs.get(digest) ?? 0;
  }
}
