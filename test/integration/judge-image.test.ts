/**
 * `judge:bookworm` = debian:bookworm's base layer + a toolkit layer (gcc, g++, libc6-dev),
 * built by a running dsecd through POST /v1/images/bootstrap {toolkit: "judge"} (and then
 * `dsec image bootstrap judge`), then compiled and run code in a sandbox made from it.
 *
 * The daemon's store starts empty, so the first bootstrap also builds debian:bookworm
 * (from the debootstrap tree cache when debian-image.test.ts ran before, else from the
 * mirror). The toolkit tree is cached under /var/cache/dsec/bootstrap/toolkits: the first
 * run on a machine runs apt-get against the mirror (~20 s here), later runs unpack it.
 */
import { mkdtempSync, readdirSync, readFileSync, rmdirSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import path from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_BOOTSTRAP_CACHE_DIR } from '../../daemon/image/bootstrap.js';
import { listMountsUnder } from '../../daemon/image/rootfs.js';
import { LayerStore } from '../../daemon/image/layer-store.js';
import { buildToolkitImage } from '../../daemon/image/toolkit.js';
import { isDsecError } from '../../daemon/errors.js';
import * as native from '../../daemon/host/native.js';
import type { Image, ImageProgress } from '../../sdk/index.js';
import { IS_ROOT, TestDaemon, runCli } from './harness.js';

const LONG = 15 * 60_000;

const HELLO_C = `#include <stdio.h>
#include <math.h>
int main(void) {
  long s = 0;
  for (int i = 1; i <= 100; i++) s += i;
  printf("hello from c %ld %.3f\\n", s, sqrt(2.0));
  return 0;
}
`;

const HELLO_CPP = `#include <iostream>
#include <numeric>
#include <string>
#include <vector>
int main() {
  std::vector<int> v(10);
  std::iota(v.begin(), v.end(), 1);
  std::string who = "c++";
  std::cout << "hello from " << who << " " << std::accumulate(v.begin(), v.end(), 0) << std::endl;
  return 0;
}
`;

describe.skipIf(!IS_ROOT)('judge:bookworm: debian base + toolkit layer, in a sandbox', () => {
  let d: TestDaemon;
  let judge: Image;

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 27 });
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it(
    'bootstraps judge:bookworm (building debian:bookworm first); a second bootstrap comes from the cache with the same digests',
    async () => {
      expect((await d.client.listImages()).map((i) => i.ref)).not.toContain('debian:bookworm');
      const lines: ImageProgress[] = [];
      let t = Date.now();
      judge = await d.client.bootstrapImage({ distro: 'debian', toolkit: 'judge' }, { onProgress: (p) => lines.push(p) });
      const first = (Date.now() - t) / 1000;
      const msgs = lines.map((p) => `${p.phase}: ${p.message}`);
      const cold = !msgs.some((m) => /^toolkit: dsec: cache hit /.test(m));
      console.log(`judge bootstrap: ${first.toFixed(1)} s, toolkit ${cold ? 'from the mirror (cache was empty)' : 'from the cache'}, ${lines.length} progress lines`);
      // The base was missing from this daemon's store: it was built first, streamed as debootstrap lines.
      expect(msgs).toContain('toolkit: dsec: debian:bookworm is not in the store: bootstrapping it first');
      expect(msgs.some((m) => m.startsWith('debootstrap: dsec: stored debian:bookworm'))).toBe(true);
      if (cold) expect(msgs.some((m) => /^toolkit: Setting up g\+\+ /.test(m))).toBe(true);

      const debian = await d.client.getImage('debian:bookworm');
      expect(debian.layers).toHaveLength(1);
      expect(judge.ref).toBe('judge:bookworm');
      expect(judge.layers).toHaveLength(2);
      expect(judge.layers[0]).toBe(debian.layers[0]);
      expect(judge.config).toEqual(debian.config);
      expect((await d.client.getLayer(judge.layers[1])).source).toMatch(/^apt:g\+\+,gcc,libc6-dev@(https?|file):\/\/\S+ over debian:bookworm/);

      // Second time through the CLI: the toolkit tree comes from the cache, same blob.
      t = Date.now();
      const r = await runCli(d, ['image', 'bootstrap', 'judge']);
      const second = (Date.now() - t) / 1000;
      console.log(`judge bootstrap again (dsec image bootstrap judge): ${second.toFixed(1)} s`);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout).toBe('judge:bookworm\n');
      expect(r.stderr).toMatch(/^toolkit: dsec: cache hit \S+\/toolkits\/[0-9a-f]{32}\.tar(\.zst)?: unpacking$/m);
      expect(r.stderr).not.toMatch(/^debootstrap: /m); // the base is in the store now
      expect(r.stderr).not.toMatch(/^toolkit: (Get|Setting up)/m); // no apt run
      expect((await d.client.getImage('judge:bookworm')).layers).toEqual(judge.layers);

      // Nothing mounted or left behind under the cache by the daemon's builds.
      expect(await listMountsUnder(DEFAULT_BOOTSTRAP_CACHE_DIR)).toEqual([]);
      expect(readdirSync(path.join(DEFAULT_BOOTSTRAP_CACHE_DIR, 'work')).filter((n) => n.includes(`-${d.pid}-`))).toEqual([]);
      expect(readdirSync(path.join(d.root, 'images', 'tmp'))).toEqual([]);
    },
    LONG,
  );

  it(
    'compiles and runs C and C++ in a judge:bookworm sandbox; python3 works',
    async () => {
      expect(judge).toBeDefined();
      const sb = await d.client.createSandbox({ image: 'judge:bookworm' });
      try {
        const run = async (argv: string[], stdin?: string) => {
          const x = await d.client.exec(sb.id, { argv, ...(stdin !== undefined ? { stdin } : {}) });
          return { code: x.exit_code, out: x.stdout.toString(), err: x.stderr.toString() };
        };
        expect(await run(['sh', '-c', 'cat > /tmp/a.c'], HELLO_C)).toEqual({ code: 0, out: '', err: '' });
        expect(await run(['gcc', '-O2', '-Wall', '-o', '/tmp/a', '/tmp/a.c', '-lm'])).toEqual({ code: 0, out: '', err: '' });
        expect(await run(['/tmp/a'])).toEqual({ code: 0, out: 'hello from c 5050 1.414\n', err: '' });

        expect(await run(['sh', '-c', 'cat > /tmp/b.cpp'], HELLO_CPP)).toEqual({ code: 0, out: '', err: '' });
        expect(await run(['g++', '-O2', '-std=c++17', '-Wall', '-o', '/tmp/b', '/tmp/b.cpp'])).toEqual({ code: 0, out: '', err: '' });
        expect(await run(['/tmp/b'])).toEqual({ code: 0, out: 'hello from c++ 55\n', err: '' });

        // A compile error is the program's result, not an exec failure.
        const bad = await run(['sh', '-c', 'printf "int main( { return 0; }\\n" > /tmp/bad.c && gcc -o /tmp/bad /tmp/bad.c']);
        expect(bad.code).toBe(1);
        expect(bad.err).toMatch(/error/);

        expect(await run(['python3', '-c', 'print(1)'])).toEqual({ code: 0, out: '1\n', err: '' });
        const v = await run(['sh', '-c', 'gcc --version | head -1; g++ --version | head -1; for t in cc c++ as ld; do command -v $t; done']);
        expect(v.code).toBe(0);
        expect(v.out).toMatch(/^gcc \(Debian 12\.[^\n]*\ng\+\+ \(Debian 12\.[^\n]*\n\/usr\/bin\/cc\n\/usr\/bin\/c\+\+\n\/usr\/bin\/as\n\/usr\/bin\/ld\n$/);
      } finally {
        await d.client.deleteSandbox(sb.id, { force: true });
      }
    },
    LONG,
  );

  it(
    'ships no apt lists, caches or logs: the sandbox sees what the base has, and the toolkit layer holds none',
    async () => {
      expect(judge).toBeDefined();
      // Same listing in a judge sandbox and a debian one.
      const probe = [
        'ls -A /var/lib/apt/lists /var/lib/apt/lists/partial /var/cache/apt /var/cache/apt/archives',
        'ls /var/cache/apt/archives/*.deb 2>/dev/null | wc -l',
        'find /var/log -type f -size +0 | wc -l',
        'find /tmp /var/tmp -mindepth 1 | wc -l',
        'cat /etc/hostname; wc -c < /etc/resolv.conf; wc -c < /etc/machine-id',
      ].join('; echo --; ');
      const seen: Record<string, string> = {};
      for (const image of ['judge:bookworm', 'debian:bookworm']) {
        const sb = await d.client.createSandbox({ image });
        try {
          const x = await d.client.exec(sb.id, { argv: ['sh', '-c', probe] });
          expect(x.exit_code, x.stderr.toString()).toBe(0);
          seen[image] = x.stdout.toString();
        } finally {
          await d.client.deleteSandbox(sb.id, { force: true });
        }
      }
      expect(seen['judge:bookworm']).toBe(seen['debian:bookworm']);
      expect(seen['judge:bookworm']).toMatch(/--\n0\n--\n0\n--\n0\n--\nlocalhost\n\d+\n0\n$/);

      // The toolkit layer's own tree, mounted read-only (file-backed EROFS) on its own.
      const blob = path.join(d.root, 'images', 'blobs', 'sha256', judge.layers[1].slice('sha256:'.length));
      const mnt = mkdtempSync('/tmp/dsec-judge-layer-');
      const c = native.constants();
      native.mount(blob, mnt, 'erofs', c.MS_RDONLY | c.MS_NODEV | c.MS_NOSUID, null);
      try {
        const top = readdirSync(mnt).sort();
        expect(top).toEqual(['etc', 'usr', 'var']);
        const has = (rel: string) => readdirSync(path.join(mnt, path.dirname(rel))).includes(path.basename(rel));
        expect(has('usr/bin/gcc-12')).toBe(true);
        expect(has('usr/include/stdio.h')).toBe(true);
        expect(has('var/lib/dpkg/status')).toBe(true);
        for (const gone of ['var/lib/apt/lists', 'var/cache/apt', 'var/cache/ldconfig/aux-cache', 'var/lib/dpkg/status-old', 'var/lib/dpkg/lock', 'etc/resolv.conf']) {
          expect(has(gone), gone).toBe(false);
        }
        const files = await execa('find', [path.join(mnt, 'var/log'), '-not', '-type', 'd'], { reject: false });
        expect(String(files.stdout)).toBe('');
        // Of overlayfs's xattrs only opaque markers may remain (origin, uuid, impure are dropped).
        const xattrs = await execa('getfattr', ['--recursive', '--physical', '--no-dereference', '--absolute-names', '--match=^trusted\\.overlay\\.', mnt], { reject: false });
        const names = String(xattrs.stdout).split('\n').filter((l) => l && !l.startsWith('#')).map((l) => l.replace(/=.*$/, ''));
        expect(names.filter((n) => n !== 'trusted.overlay.opaque')).toEqual([]);
      } finally {
        native.unmountAll(mnt);
        rmdirSync(mnt);
      }
      expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(mnt);

      const t = await d.traces();
      expect(t.rows).toEqual([]);
      expect(t.mounts).toEqual([]);
    },
    LONG,
  );

  it(
    'a package the mirror does not have is InvalidArgument naming it; nothing stays mounted, cached or written',
    async () => {
      // The daemon's store, through a second LayerStore on the same root (no init: see debian-image.test.ts).
      const store = new LayerStore({ root: path.join(d.root, 'images') });
      const cacheDir = mkdtempSync('/tmp/dsec-judge-cache-');
      try {
        const pkg = `dsec-no-such-package-${process.pid}`;
        const lines: string[] = [];
        await expect(buildToolkitImage(store, { base: 'debian:bookworm', name: 'judge', tag: 'broken', packages: ['gcc', pkg], cacheDir, onProgress: (l) => lines.push(l) })).rejects.toSatisfy(
          (e: unknown) => {
            if (!isDsecError(e, 'InvalidArgument')) throw e;
            expect((e as Error).message).toMatch(new RegExp(`^package "${pkg}" not found in bookworm on (https?|file)://`));
            return true;
          },
        );
        expect(lines).toContain(`E: Unable to locate package ${pkg}`);
        expect(await listMountsUnder(cacheDir)).toEqual([]);
        expect(readdirSync(path.join(cacheDir, 'work'))).toEqual([]);
        expect(readdirSync(path.join(cacheDir, 'toolkits'))).toEqual([]);
        await expect(d.client.getImage('judge:broken')).rejects.toMatchObject({ code: 'NotFound' });
      } finally {
        await rm(cacheDir, { recursive: true, force: true });
      }
    },
    LONG,
  );
});
