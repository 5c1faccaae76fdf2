// buildErofs: reproducible digests, different trees -> different digests, atomic output.
// Needs mkfs.erofs (erofs-utils) but no privileges: --all-root makes owners irrelevant.
import { execaSync } from 'execa';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync } from 'node:fs';
import { chmod, link, mkdir, readdir, rm, symlink, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { isDsecError } from '../../daemon/errors.js';
import { buildErofs, sha256File } from '../../daemon/image/erofs.js';
import { parseMountinfo, unescapeMountinfo } from '../../daemon/image/rootfs.js';
import { digestHex, parseRef } from '../../daemon/image/layer-store.js';

const hasMkfs = (() => {
  try {
    execaSync('mkfs.erofs', ['--help'], { reject: false });
    return true;
  } catch {
    return false;
  }
})();

const base = mkdtempSync(join(tmpdir(), 'dsec-erofs-'));
afterAll(async () => {
  await rm(base, { recursive: true, force: true });
});

/** Builds a small tree; `order` flips creation order, `extra` adds a file. */
async function makeTree(dir: string, opts: { order?: 'ab' | 'ba'; extra?: boolean; mtime?: number } = {}): Promise<void> {
  await mkdir(dir, { recursive: true });
  await chmod(dir, 0o755);
  const mk = {
    a: async () => {
      await mkdir(join(dir, 'a'), { recursive: true });
      await writeFile(join(dir, 'a/file'), 'alpha\n');
      await chmod(join(dir, 'a/file'), 0o644);
    },
    b: async () => {
      await mkdir(join(dir, 'b'), { recursive: true });
      await writeFile(join(dir, 'b/big'), Buffer.alloc(20000, 7));
      await chmod(join(dir, 'b/big'), 0o600);
    },
  };
  for (const k of (opts.order ?? 'ab').split('') as Array<'a' | 'b'>) await mk[k]();
  await symlink('../a/file', join(dir, 'b/link'));
  await link(join(dir, 'a/file'), join(dir, 'b/hard'));
  if (opts.mtime !== undefined) await utimes(join(dir, 'a/file'), opts.mtime, opts.mtime);
  if (opts.extra) await writeFile(join(dir, 'extra'), 'x');
}

describe.skipIf(!hasMkfs)('buildErofs', () => {
  it('gives the same bytes for the same tree, whatever the creation order and mtimes', async () => {
    await makeTree(join(base, 't1'), { order: 'ab' });
    await makeTree(join(base, 't2'), { order: 'ba', mtime: 1_000_000 });
    const r1 = await buildErofs(join(base, 't1'), join(base, 'out/one.erofs'), { allRoot: true });
    const r1b = await buildErofs(join(base, 't1'), join(base, 'out/one-again.erofs'), { allRoot: true });
    const r2 = await buildErofs(join(base, 't2'), join(base, 'out/two.erofs'), { allRoot: true });
    expect(r1.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(r1b.digest).toBe(r1.digest);
    expect(r2.digest).toBe(r1.digest);
    expect(r1.sizeBytes).toBeGreaterThan(0);
    expect(r2.sizeBytes).toBe(r1.sizeBytes);
    // The digest is the sha256 of the file's bytes.
    const hex = createHash('sha256').update(readFileSync(join(base, 'out/one.erofs'))).digest('hex');
    expect(r1.digest).toBe(`sha256:${hex}`);
    expect(await sha256File(join(base, 'out/two.erofs'))).toBe(r1.digest);
  });

  it('gives different digests for different trees (content, extra file, mode)', async () => {
    await makeTree(join(base, 'd1'));
    await makeTree(join(base, 'd2'), { extra: true });
    await makeTree(join(base, 'd3'));
    await writeFile(join(base, 'd3/a/file'), 'alphA\n');
    await makeTree(join(base, 'd4'));
    await chmod(join(base, 'd4/a/file'), 0o755);
    const digests = new Set<string>();
    for (const d of ['d1', 'd2', 'd3', 'd4']) {
      digests.add((await buildErofs(join(base, d), join(base, `out/${d}.erofs`), { allRoot: true })).digest);
    }
    expect(digests.size).toBe(4);
  });

  it('leaves no temp file behind and replaces an existing output', async () => {
    await makeTree(join(base, 'r1'));
    const out = join(base, 'out2/x.erofs');
    await mkdir(join(base, 'out2'), { recursive: true });
    await writeFile(out, 'stale');
    const r = await buildErofs(join(base, 'r1'), out, { allRoot: true });
    expect(await sha256File(out)).toBe(r.digest);
    expect(await readdir(join(base, 'out2'))).toEqual(['x.erofs']);
  });

  it('rejects a source that is not a directory with InvalidArgument, writing nothing', async () => {
    const out = join(base, 'out3/x.erofs');
    await expect(buildErofs(join(base, 'nope'), out)).rejects.toSatisfy((e: unknown) => isDsecError(e, 'InvalidArgument'));
    await writeFile(join(base, 'afile'), 'x');
    await expect(buildErofs(join(base, 'afile'), out)).rejects.toSatisfy((e: unknown) => isDsecError(e, 'InvalidArgument'));
  });

  it('reports mkfs.erofs failure as Internal and cleans its temp file', async () => {
    await makeTree(join(base, 'f1'));
    const outDir = join(base, 'out4');
    await expect(buildErofs(join(base, 'f1'), join(outDir, 'x.erofs'), { compression: 'nosuchcompressor' })).rejects.toSatisfy(
      (e: unknown) => isDsecError(e, 'Internal'),
    );
    expect(await readdir(outDir)).toEqual([]);
  });
});

describe('helpers', () => {
  it('unescapes mountinfo octal escapes', () => {
    expect(unescapeMountinfo('/a\\040b\\011c\\012d\\134e')).toBe('/a b\tc\nd\\e');
    expect(unescapeMountinfo('/plain')).toBe('/plain');
    expect(unescapeMountinfo('/caf\\303\\251')).toBe('/café');
    const line = '36 35 98:0 /mnt1 /mnt/my\\040dir rw,noatime master:1 - ext3 /dev/root rw,errors=continue';
    expect(parseMountinfo(`${line}\n`)).toEqual(['/mnt/my dir']);
  });

  it('parses image refs and digests', () => {
    expect(parseRef('busybox')).toEqual({ name: 'busybox', tag: 'latest' });
    expect(parseRef('busybox:1.36')).toEqual({ name: 'busybox', tag: '1.36' });
    expect(parseRef('team/py-311:v2')).toEqual({ name: 'team/py-311', tag: 'v2' });
    for (const bad of ['', 'BusyBox', '../x', 'a:', 'a:b:c', 'a//b', 'x@sha256:00']) {
      expect(() => parseRef(bad), bad).toThrow(/invalid image ref/);
    }
    expect(digestHex(`sha256:${'a'.repeat(64)}`)).toBe('a'.repeat(64));
    expect(() => digestHex('sha256:xyz')).toThrow(/invalid digest/);
    expect(() => digestHex(`sha256:${'a'.repeat(64)}/../x`)).toThrow(/invalid digest/);
  });
});
