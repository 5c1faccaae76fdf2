/**
 * Toolkit layers (daemon/image/toolkit.ts) without privileges: the tree cache key, what
 * cleanUpper removes from an upper dir (and what it keeps), how apt failures are
 * classified, and argument checks that run before any work.
 */
import { existsSync, mkdtempSync, readdirSync } from 'node:fs';
import { mkdir, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { isDsecError } from '../../daemon/errors.js';
import { LayerStore } from '../../daemon/image/layer-store.js';
import { OVERLAY_PRIVATE_XATTRS, TOOLKITS, bootstrapToolkit, buildToolkitImage, classifyAptFailure, cleanUpper, toolkitCacheKey } from '../../daemon/image/toolkit.js';

const BASE = `sha256:${'a'.repeat(64)}`;

describe('toolkitCacheKey', () => {
  const k0 = { baseLayers: [BASE], packages: ['gcc', 'g++', 'libc6-dev'], mirror: 'http://deb.debian.org/debian' };

  it('is 32 hex digits and ignores package order, duplicates and trailing slashes', () => {
    const k = toolkitCacheKey(k0);
    expect(k).toMatch(/^[0-9a-f]{32}$/);
    expect(toolkitCacheKey({ ...k0, packages: ['libc6-dev', 'g++', 'gcc', 'gcc'], mirror: 'http://deb.debian.org/debian//' })).toBe(k);
  });

  it('changes with the base layers (and their order), the packages and the mirror', () => {
    const k = toolkitCacheKey(k0);
    const other = `sha256:${'b'.repeat(64)}`;
    for (const change of [
      { baseLayers: [other] },
      { baseLayers: [BASE, other] },
      { packages: ['gcc', 'g++'] },
      { packages: ['gcc', 'g++', 'libc6-dev', 'make'] },
      { mirror: 'http://mirror.example/debian' },
    ]) {
      expect(toolkitCacheKey({ ...k0, ...change })).not.toBe(k);
    }
    expect(toolkitCacheKey({ ...k0, baseLayers: [BASE, other] })).not.toBe(toolkitCacheKey({ ...k0, baseLayers: [other, BASE] }));
  });

  it('the judge toolkit is gcc, g++ and libc6-dev over debian:bookworm', () => {
    expect(TOOLKITS.judge).toEqual({ packages: ['gcc', 'g++', 'libc6-dev'], image: 'judge:bookworm', base: 'debian:bookworm' });
    // opaque markers are meaning, not bookkeeping: they must survive the tar.
    expect(OVERLAY_PRIVATE_XATTRS).not.toContain('trusted.overlay.opaque');
    expect(OVERLAY_PRIVATE_XATTRS).toContain('trusted.overlay.uuid');
  });
});

describe('cleanUpper', () => {
  let dir: string;
  let upper: string;
  beforeEach(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'dsec-toolkit-'));
    upper = path.join(dir, 'upper');
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  const put = async (rel: string, content = 'x') => {
    await mkdir(path.dirname(path.join(upper, rel)), { recursive: true });
    await writeFile(path.join(upper, rel), content);
  };
  const all = (d: string, pre = ''): string[] =>
    readdirSync(d, { withFileTypes: true }).flatMap((e) => {
      const r = pre ? `${pre}/${e.name}` : e.name;
      return e.isDirectory() ? [`${r}/`, ...all(path.join(d, e.name), r)] : [r];
    });

  it('removes apt state, logs, temp files, backups, locks, aux-cache and host identity; keeps the toolkit', async () => {
    const removedFiles = [
      'var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_InRelease',
      'var/lib/apt/lists/partial/x',
      'var/cache/apt/pkgcache.bin',
      'var/cache/apt/archives/gcc_12_amd64.deb',
      'var/log/apt/history.log',
      'var/log/apt/term.log',
      'var/log/dpkg.log',
      'var/log/alternatives.log',
      'tmp/junk',
      'var/tmp/junk',
      'run/lock/x',
      'dev/null-ish',
      'var/lib/dpkg/status-old',
      'var/lib/dpkg/diversions-old',
      'var/lib/dpkg/lock',
      'var/lib/dpkg/lock-frontend',
      'var/lib/dpkg/triggers/Lock',
      'var/cache/debconf/config.dat-old',
      'var/cache/ldconfig/aux-cache',
      'etc/resolv.conf',
      'etc/hostname',
      'etc/machine-id',
      'var/lib/dbus/machine-id',
    ];
    const kept = [
      'usr/bin/gcc-12',
      'usr/include/stdio.h',
      'etc/ld.so.cache',
      'etc/alternatives.txt',
      'var/lib/dpkg/status',
      'var/lib/dpkg/info/gcc.list',
      'var/lib/dpkg/triggers/File',
      'var/lib/apt/extended_states',
      'var/cache/debconf/config.dat',
      'root/.profile',
    ];
    for (const f of [...removedFiles, ...kept]) await put(f);
    // A symlink in the upper is removed as an entry, never followed.
    const outside = path.join(dir, 'outside');
    await mkdir(outside);
    await writeFile(path.join(outside, 'keep'), 'host file');
    await symlink(outside, path.join(upper, 'var/log/link-to-outside'));

    const removed = await cleanUpper(upper);
    expect(removed).toContain('var/log/link-to-outside');
    expect(await readFile(path.join(outside, 'keep'), 'utf8')).toBe('host file');
    for (const f of removedFiles) expect(existsSync(path.join(upper, f)), f).toBe(false);
    for (const f of kept) expect(existsSync(path.join(upper, f)), f).toBe(true);
    // Directories below var/log stay (they merge with the base's); the dirs that were emptied stay too.
    expect(all(upper)).toContain('var/log/apt/');
    expect(readdirSync(path.join(upper, 'var/lib/apt/lists'))).toEqual([]);
    expect(readdirSync(path.join(upper, 'tmp'))).toEqual([]);
    // Top-level entries of emptied dirs are reported, sorted.
    expect(removed).toEqual([...removed].sort());
    expect(removed).toContain('var/lib/apt/lists/partial');
    expect(removed).toContain('run/lock');
    // Idempotent.
    expect(await cleanUpper(upper)).toEqual([]);
  });

  it('copes with an upper that has none of those dirs', async () => {
    await put('usr/bin/cc');
    expect(await cleanUpper(upper)).toEqual([]);
    expect(all(upper)).toEqual(['usr/', 'usr/bin/', 'usr/bin/cc']);
  });
});

describe('classifyAptFailure', () => {
  it('names packages apt cannot find', () => {
    expect(classifyAptFailure('Reading package lists...\nE: Unable to locate package foo\nE: Unable to locate package bar-baz\nE: Unable to locate package foo\n')).toEqual({
      kind: 'InvalidArgument',
      missing: ['foo', 'bar-baz'],
    });
    expect(classifyAptFailure("E: Package 'gcc-99' has no installation candidate\n")).toEqual({ kind: 'InvalidArgument', missing: ['gcc-99'] });
  });

  it('calls an unreachable mirror Unavailable and anything else Internal', () => {
    expect(classifyAptFailure('Err:1 http://127.0.0.1:9/debian bookworm InRelease\n  Could not connect to 127.0.0.1:9 (127.0.0.1). - connect (111: Connection refused)\n').kind).toBe('Unavailable');
    expect(classifyAptFailure('E: Failed to fetch http://x/debian/dists/bookworm/InRelease  Temporary failure resolving \'x\'\n').kind).toBe('Unavailable');
    expect(classifyAptFailure('E: Sub-process /usr/bin/dpkg returned an error code (1)\n')).toEqual({ kind: 'Internal', missing: [] });
  });
});

describe('argument checks', () => {
  const store = new LayerStore({ root: path.join(tmpdir(), 'dsec-toolkit-never-created') });
  const bad = (p: Promise<unknown>) => expect(p).rejects.toSatisfy((e: unknown) => isDsecError(e, 'InvalidArgument'));

  it('refuses bad packages, refs, suites and an empty package list before doing any work', async () => {
    const ok = { base: 'debian:bookworm', name: 'judge', tag: 'bookworm', packages: ['gcc'] };
    await bad(buildToolkitImage(store, { ...ok, packages: [] }));
    await bad(buildToolkitImage(store, { ...ok, packages: ['gcc; rm -rf /'] }));
    await bad(buildToolkitImage(store, { ...ok, name: 'Not A Name' }));
    await bad(buildToolkitImage(store, { ...ok, suite: 'sid' as 'bookworm' }));
    await bad(bootstrapToolkit(store, 'judge', { include: ['Bad_Pkg'] }));
    await bad(bootstrapToolkit(store, 'judge', { tag: 'no spaces' }));
    await bad(bootstrapToolkit(store, 'nope' as 'judge'));
    expect(existsSync(store.root)).toBe(false);
  });
});
