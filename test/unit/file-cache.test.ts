/**
 * FileTextCache (daemon/image/file-cache.ts): a manifest read again costs a stat, and any
 * change to the file (replaced by rename, rewritten in place at the same size, removed)
 * is seen at the next read, as a store shared by other hosts needs.
 */
import { mkdtempSync, renameSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { FileTextCache } from '../../daemon/image/file-cache.js';

describe('FileTextCache', () => {
  let dir = '';
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  it('answers an unchanged file from memory and sees every change at the next read', async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'dsec-filecache-'));
    const f = path.join(dir, 'm.json');
    const c = new FileTextCache();
    expect(await c.read(f)).toBeUndefined();
    writeFileSync(f, '{"v":1}');
    expect(await c.read(f)).toBe('{"v":1}');
    expect(await c.read(f)).toBe('{"v":1}');
    expect(c.reads).toBe(1);
    // Replaced by rename, as the store writes manifests: a new inode.
    writeFileSync(`${f}.tmp`, '{"v":2}');
    renameSync(`${f}.tmp`, f);
    expect(await c.read(f)).toBe('{"v":2}');
    // Rewritten in place at the same size (another host's writer): ctime and mtime move.
    await new Promise((r) => setTimeout(r, 20)); // past the filesystem clock's tick
    writeFileSync(f, '{"v":3}');
    expect(await c.read(f)).toBe('{"v":3}');
    expect(c.reads).toBe(3);
    unlinkSync(f);
    expect(await c.read(f)).toBeUndefined();
    expect(await c.read(path.join(f, 'below-a-file'))).toBeUndefined();
  });

  it('keeps at most maxEntries files, dropping the least recently read', async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'dsec-filecache-'));
    const c = new FileTextCache(2);
    for (const n of ['a', 'b', 'c']) writeFileSync(path.join(dir, n), n);
    await c.read(path.join(dir, 'a'));
    await c.read(path.join(dir, 'b'));
    await c.read(path.join(dir, 'a'));
    await c.read(path.join(dir, 'c')); // drops b, the least recently read
    expect(c.reads).toBe(3);
    await c.read(path.join(dir, 'a'));
    expect(c.reads).toBe(3);
    await c.read(path.join(dir, 'b'));
    expect(c.reads).toBe(4);
  });
});
