/**
 * Host-local blob cache in front of a (remote, shared) layer store: blobs are copied to
 * local disk before they are mounted, so reads of a hot layer never cross the network,
 * and the least recently used unmounted blobs are evicted once the cache holds more
 * than its byte budget. A copy is hashed while it is written and published by rename,
 * so a cached blob is always complete and verified.
 */
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { mkdir, readdir, rename, rm, stat, utimes } from 'node:fs/promises';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { Transform } from 'node:stream';
import { DsecError } from '../errors.js';
import { digestHex } from './layer-store.js';

/** Options of {@link BlobCache}. */
export interface BlobCacheOptions {
  /** Local directory for cached blobs. */
  dir: string;
  /** Budget in bytes; eviction keeps the total at or below it when it can. */
  maxBytes: number;
  /** Source path of a blob in the store. */
  source: (digest: string) => string;
  /** Digests that must not be evicted (currently mounted). */
  pinned: () => ReadonlySet<string>;
}

/** The cache; one per daemon. Concurrent `ensure` of one digest copies once. */
export class BlobCache {
  private readonly inflight = new Map<string, Promise<string>>();

  constructor(private readonly o: BlobCacheOptions) {}

  /** Cached path of `digest`: `<dir>/<hex>`. */
  path(digest: string): string {
    return join(this.o.dir, digestHex(digest));
  }

  /**
   * Returns the local path of `digest`, copying and verifying it first when absent, and
   * marks it most recently used (its mtime).
   * @throws DsecError NotFound (not in the store), Internal (the copy hashes to another digest; nothing is cached).
   */
  ensure(digest: string): Promise<string> {
    const cur = this.inflight.get(digest);
    if (cur) return cur;
    const p = this.fill(digest).finally(() => this.inflight.delete(digest));
    this.inflight.set(digest, p);
    return p;
  }

  private async fill(digest: string): Promise<string> {
    const dst = this.path(digest);
    const now = new Date();
    if (await stat(dst).catch(() => undefined)) {
      await utimes(dst, now, now);
      return dst;
    }
    await mkdir(this.o.dir, { recursive: true, mode: 0o700 });
    const src = this.o.source(digest);
    if (!(await stat(src).catch(() => undefined))) throw new DsecError('NotFound', `layer ${digest} is missing from the store (${src})`);
    const tmp = `${dst}.tmp-${process.pid}`;
    const hash = createHash('sha256');
    const tap = new Transform({
      transform(chunk: Buffer, _enc, cb) {
        hash.update(chunk);
        cb(null, chunk);
      },
    });
    try {
      await pipeline(createReadStream(src, { highWaterMark: 1 << 20 }), tap, createWriteStream(tmp, { mode: 0o444 }));
      const got = `sha256:${hash.digest('hex')}`;
      if (got !== digest) throw new DsecError('Internal', `layer ${digest}: the store's blob ${src} hashes to ${got}; refusing to cache or mount it`);
      await rename(tmp, dst);
    } finally {
      await rm(tmp, { force: true });
    }
    await this.evict();
    return dst;
  }

  /** Bytes currently cached. */
  async usage(): Promise<number> {
    let total = 0;
    for (const e of await this.entries()) total += e.size;
    return total;
  }

  private async entries(): Promise<{ digest: string; size: number; mtimeMs: number }[]> {
    const out = [];
    for (const f of await readdir(this.o.dir).catch(() => [] as string[])) {
      if (!/^[0-9a-f]{64}$/.test(f)) continue;
      const st = await stat(join(this.o.dir, f)).catch(() => undefined);
      if (st) out.push({ digest: `sha256:${f}`, size: st.size, mtimeMs: st.mtimeMs });
    }
    return out;
  }

  /**
   * Evicts least recently used, unpinned blobs until usage ≤ maxBytes. Pinned blobs stay
   * even over budget (a mounted layer cannot be dropped). Returns the evicted digests.
   */
  async evict(): Promise<string[]> {
    const es = (await this.entries()).sort((a, b) => a.mtimeMs - b.mtimeMs);
    let total = es.reduce((n, e) => n + e.size, 0);
    const pinned = this.o.pinned();
    const out: string[] = [];
    for (const e of es) {
      if (total <= this.o.maxBytes) break;
      if (pinned.has(e.digest) || this.inflight.has(e.digest)) continue;
      await rm(this.path(e.digest), { force: true });
      total -= e.size;
      out.push(e.digest);
    }
    return out;
  }
}
