import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { BlobCache } from '../../daemon/image/cache.js';

describe('BlobCache', () => {
  let dir: string;
  let store: string;
  const pinned = new Set<string>();
  const put = (content: string): string => {
    const hex = createHash('sha256').update(content).digest('hex');
    writeFileSync(path.join(store, hex), content);
    return `sha256:${hex}`;
  };
  const make = (maxBytes: number) => new BlobCache({ dir: path.join(dir, 'cache'), maxBytes, source: (d) => path.join(store, d.slice(7)), pinned: () => pinned });
  beforeEach(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'dsec-cache-'));
    store = path.join(dir, 'store');
    mkdirSync(store);
    pinned.clear();
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('copies a blob once, verified, and returns the local path', async () => {
    const c = make(1 << 20);
    const d = put('layer bytes');
    const [p1, p2] = await Promise.all([c.ensure(d), c.ensure(d)]);
    expect(p1).toBe(p2);
    expect(readFileSync(p1, 'utf8')).toBe('layer bytes');
    expect(p1.startsWith(path.join(dir, 'cache'))).toBe(true);
  });

  it('refuses a store blob whose bytes do not match its digest and caches nothing', async () => {
    const c = make(1 << 20);
    const d = put('good');
    writeFileSync(path.join(store, d.slice(7)), 'evil');
    await expect(c.ensure(d)).rejects.toMatchObject({ kind: 'Internal', message: expect.stringContaining(d) });
    expect(existsSync(c.path(d))).toBe(false);
    await expect(c.ensure(`sha256:${'0'.repeat(64)}`)).rejects.toMatchObject({ kind: 'NotFound' });
  });

  it('evicts least recently used unpinned blobs beyond the byte budget', async () => {
    const c = make(25);
    const a = put('a'.repeat(10));
    const b = put('b'.repeat(10));
    await c.ensure(a);
    await c.ensure(b);
    // a used longer ago than b
    utimesSync(c.path(a), new Date(1000), new Date(1000));
    pinned.add(b);
    const d = put('d'.repeat(10));
    await c.ensure(d); // 30 bytes > 25: evict a (LRU, unpinned)
    expect(existsSync(c.path(a))).toBe(false);
    expect(existsSync(c.path(b))).toBe(true);
    expect(existsSync(c.path(d))).toBe(true);
    // Pinned blobs stay even over budget.
    pinned.add(d);
    const e = put('e'.repeat(10));
    await c.ensure(e);
    expect(await c.usage()).toBe(30);
    expect(existsSync(c.path(b)) && existsSync(c.path(d))).toBe(true);
  });
});
