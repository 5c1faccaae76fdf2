/** A host-local cache in front of a remote store: layers are mounted from verified local copies. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { IS_ROOT, TestDaemon } from './harness.js';

describe.skipIf(!IS_ROOT)('local blob cache', () => {
  let d: TestDaemon;
  let remote: string;
  let cache: string;
  beforeAll(async () => {
    remote = mkdtempSync('/tmp/dsec-remote-');
    cache = mkdtempSync('/tmp/dsec-cache-');
    chmodSync(remote, 0o755);
    d = await TestDaemon.start({ slot: 14, config: `[images]\nstore = "${remote}"\ncache_dir = "${cache}"\ncache_bytes = 104857600\n` });
  });
  afterAll(async () => {
    await d?.cleanup();
    rmSync(remote, { recursive: true, force: true });
    rmSync(cache, { recursive: true, force: true });
  });

  it('mounts the layer from the cache, not the remote store', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    try {
      const digest = sb.image_layers[0];
      const cached = path.join(cache, digest.slice(7));
      expect(existsSync(cached)).toBe(true);
      const mi = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').find((l) => l.split(' ')[4] === path.join(d.root, 'layers', digest.slice(7)));
      expect(mi).toBeDefined();
      expect(mi!.split(' - ')[1].split(' ')[1]).toBe(cached);
      expect((await d.client.exec(sb.id, { argv: ['echo', 'ok'] })).stdout.toString()).toBe('ok\n');
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });
});
