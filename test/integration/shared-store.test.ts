/**
 * Two dsecd instances (separate roots) on one shared layer store: concurrent builds of
 * the same tree end with one blob of one digest; each host verifies a blob before its
 * first mount; prune on one instance never takes a blob the other's sandbox uses.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { IS_ROOT, TestDaemon } from './harness.js';

interface Img { ref: string; layers: string[] }

describe.skipIf(!IS_ROOT)('shared layer store', () => {
  let a: TestDaemon;
  let b: TestDaemon;
  let store: string;
  let work: string;
  beforeAll(async () => {
    store = mkdtempSync('/tmp/dsec-shared-');
    work = mkdtempSync('/tmp/dsec-shared-src-');
    chmodSync(store, 0o755);
    chmodSync(work, 0o755);
    const cfg = `[images]\nstore = "${store}"\nprune_grace_s = 0\n`;
    [a, b] = await Promise.all([TestDaemon.start({ slot: 12, config: cfg }), TestDaemon.start({ slot: 13, config: cfg })]);
  });
  afterAll(async () => {
    await Promise.all([a?.cleanup(), b?.cleanup()]);
    rmSync(store, { recursive: true, force: true });
    rmSync(work, { recursive: true, force: true });
  });

  it('concurrent builds of one tree on two instances give one blob of one digest', async () => {
    const src = path.join(work, 'tree');
    for (let i = 0; i < 200; i++) {
      mkdirSync(path.join(src, `d${i % 10}`), { recursive: true });
      writeFileSync(path.join(src, `d${i % 10}`, `f${i}`), `file ${i}\n`.repeat(100));
    }
    const before = readdirSync(path.join(store, 'blobs', 'sha256')).length;
    const [ia, ib] = await Promise.all([
      a.client.request<Img>('POST', '/v1/images/import', { type: 'dir', path: src, image: 'same:a' }),
      b.client.request<Img>('POST', '/v1/images/import', { type: 'dir', path: src, image: 'same:b' }),
    ]);
    expect(ia.layers).toEqual(ib.layers);
    expect(readdirSync(path.join(store, 'blobs', 'sha256')).length).toBe(before + 1);
    // No temp file is left behind by either writer.
    expect(readdirSync(path.join(store, 'tmp'))).toEqual([]);
    // Both instances see both manifests (one store).
    expect((await a.client.request<{ images: Img[] }>('GET', '/v1/images')).images.map((i) => i.ref)).toEqual(expect.arrayContaining(['same:a', 'same:b']));
  });

  it('each instance verifies a blob before its first mount, and prune respects the other instance\'s sandboxes', async () => {
    const src = path.join(work, 'leased');
    mkdirSync(src, { recursive: true });
    writeFileSync(path.join(src, 'data'), 'leased\n');
    const img = await a.client.request<Img>('POST', '/v1/images/import', { type: 'dir', path: src, base: 'busybox', image: 'leased:1' });
    const top = img.layers[1].slice(7);
    const sb = await b.client.createSandbox({ image: 'leased:1' });
    expect(existsSync(path.join(b.root, 'images-local', 'verified', top))).toBe(true);
    // A hashed the blob while building it, so it counts as verified there too.
    expect(existsSync(path.join(a.root, 'images-local', 'verified', top))).toBe(true);
    await a.client.request('DELETE', '/v1/images/leased:1');
    const rep = await a.client.request<{ removed: { digest: string }[] }>('POST', '/v1/images/prune', {});
    expect(rep.removed.map((r) => r.digest)).not.toContain(img.layers[1]);
    expect((await b.client.exec(sb.id, { argv: ['cat', '/data'] })).stdout.toString()).toBe('leased\n');
    await b.client.deleteSandbox(sb.id, { force: true });
    const rep2 = await a.client.request<{ removed: { digest: string }[] }>('POST', '/v1/images/prune', {});
    expect(rep2.removed.map((r) => r.digest)).toContain(img.layers[1]);
  });
});
