/**
 * The builder identity's id ranges (daemon/host/builder.ts): range checks, the config's
 * [builder] table, refusal of overlaps between live instances (daemon/host/instances.ts),
 * slot assignment, the layout of the integration-test grid against the production
 * defaults, and the encodings root and the builder worker exchange.
 */
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { BUILDER_SLOT_IDS, Builder, DEFAULT_BUILDER_RANGE, checkBuilderRange, rangesOverlap, type IdRange } from '../../daemon/host/builder.js';
import { loadConfig } from '../../daemon/config.js';
import { rangeConflict } from '../../daemon/host/instances.js';
import { decodeFixups, encodeFixups } from '../../daemon/image/commit.js';
import { SLOTS, builderRangeForSlot, uidPoolForSlot } from '../integration/harness.js';

const DEFAULT_POOL: IdRange = { base: 2 ** 31, size: 2 ** 30 };

describe('builder id ranges', () => {
  it('overlap is any shared id of two half-open ranges', () => {
    expect(rangesOverlap({ base: 0, size: 10 }, { base: 10, size: 5 })).toBe(false);
    expect(rangesOverlap({ base: 0, size: 11 }, { base: 10, size: 5 })).toBe(true);
    expect(rangesOverlap({ base: 12, size: 1 }, { base: 10, size: 5 })).toBe(true);
    expect(rangesOverlap({ base: 15, size: 1 }, { base: 10, size: 5 })).toBe(false);
  });

  it('the default range is 16 slots right below the default sandbox pool, disjoint from it', () => {
    expect(DEFAULT_BUILDER_RANGE).toEqual({ base: 2 ** 31 - 2 ** 20, size: 2 ** 20 });
    expect(checkBuilderRange(DEFAULT_BUILDER_RANGE, DEFAULT_POOL)).toBe(16);
    expect(DEFAULT_BUILDER_RANGE.base + DEFAULT_BUILDER_RANGE.size).toBe(DEFAULT_POOL.base);
  });

  it('refuses a range over the pool, over host root and system users, not in whole slots, or past 2^32-1', () => {
    expect(() => checkBuilderRange({ base: 2 ** 31, size: 2 ** 16 }, DEFAULT_POOL)).toThrow(/overlaps the sandbox uid pool \[2147483648, 3221225472\)/);
    expect(() => checkBuilderRange({ base: 2 ** 31 - 2 ** 16, size: 2 ** 17 }, DEFAULT_POOL)).toThrow(/overlaps the sandbox uid pool/);
    expect(() => checkBuilderRange({ base: 0, size: 2 ** 16 }, DEFAULT_POOL)).toThrow(/at least 65536/);
    expect(() => checkBuilderRange({ base: 1000, size: 2 ** 16 }, DEFAULT_POOL)).toThrow(/at least 65536/);
    expect(() => checkBuilderRange({ base: 2 ** 20, size: 1000 }, DEFAULT_POOL)).toThrow(/multiple of 65536/);
    expect(() => checkBuilderRange({ base: 2 ** 20, size: 0 }, DEFAULT_POOL)).toThrow(/multiple of 65536/);
    expect(() => checkBuilderRange({ base: 2 ** 32 - 2 ** 16, size: 2 ** 16 }, { base: 2 ** 20, size: 2 ** 16 })).toThrow(/below 2\^32-1/);
    try {
      checkBuilderRange({ base: 2 ** 31, size: 2 ** 16 }, DEFAULT_POOL);
    } catch (e) {
      expect((e as { kind?: string }).kind).toBe('InvalidArgument');
    }
  });

  it('slots are consecutive blocks of 65,536 ids', () => {
    const b = new Builder({ range: { base: 2 ** 24, size: 3 * BUILDER_SLOT_IDS }, workDir: '/nonexistent' });
    expect(b.slots).toBe(3);
    expect([0, 1, 2].map((i) => b.slotBase(i))).toEqual([2 ** 24, 2 ** 24 + 65536, 2 ** 24 + 2 * 65536]);
    expect(() => new Builder({ range: { base: 2 ** 24, size: 100 }, workDir: '/nonexistent' })).toThrow(/holds no slot/);
  });
});

describe('[builder] in the config', () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'dsec-cfg-builder-'));
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  const load = (toml: string) => {
    const f = path.join(dir, `${Math.random().toString(36).slice(2)}.toml`);
    writeFileSync(f, toml);
    return loadConfig({ config: f, env: {} });
  };

  it('defaults to the default range, enabled; mkfs.erofs from PATH', () => {
    const c = load('');
    expect(c.builder).toEqual({ enabled: true, ...DEFAULT_BUILDER_RANGE });
    expect(c.images.mkfsPath).toBe('mkfs.erofs');
  });

  it('takes base and size, and refuses an overlap with its own pool, naming both ranges', () => {
    expect(load('[builder]\nbase = 1048576\nsize = 131072\n').builder).toEqual({ enabled: true, base: 1048576, size: 131072 });
    expect(() => load('[uid_pool]\nbase = 1048576\nsize = 1048576\n[builder]\nbase = 1048576\n')).toThrow(/builder range \[1048576, 2097152\) overlaps the sandbox uid pool \[1048576, 2097152\)/);
    expect(() => load('[builder]\nsize = 1000\n')).toThrow(/builder\.size/);
    expect(() => load('[builder]\nbase = 5\n')).toThrow(/builder\.base/);
    expect(() => load('[builder]\nslots = 4\n')).toThrow(/slots|Unrecognized/);
  });

  it('enabled = false skips the range check (nothing runs as the builder)', () => {
    expect(load('[builder]\nenabled = false\nbase = 2147483648\n').builder.enabled).toBe(false);
  });
});

describe('overlaps between live instances are refused', () => {
  const A = { uid_pool: { base: 2 ** 30, size: 2 ** 24 }, builder: { base: 2 ** 29, size: 2 ** 20 } };
  it('pool/pool, builder/pool, pool/builder and builder/builder, each with a hint', () => {
    expect(rangeConflict(A, 'other', 7, { uid_pool: { base: 2 ** 30 + 2 ** 23, size: 2 ** 24 } })?.message).toMatch(/^uid pool .* overlaps instance other's uid pool .*pid 7.*uid_pool\.base/);
    expect(rangeConflict(A, 'other', 7, { uid_pool: { base: 2 ** 29, size: 2 ** 16 } })?.message).toMatch(/^builder range .* overlaps instance other's uid pool .*\[builder\] base outside every instance's uid pool/);
    expect(rangeConflict(A, 'other', 7, { uid_pool: { base: 2 ** 31, size: 2 ** 16 }, builder: { base: 2 ** 30, size: 2 ** 16 } })?.message).toMatch(/^uid pool .* overlaps instance other's builder range/);
    expect(rangeConflict(A, 'other', 7, { uid_pool: { base: 2 ** 31, size: 2 ** 16 }, builder: { base: 2 ** 29 + 2 ** 16, size: 2 ** 16 } })?.message).toMatch(/^builder range .* overlaps instance other's builder range .*its own \[builder\] base/);
    expect(rangeConflict(A, 'other', 7, { uid_pool: { base: 2 ** 31, size: 2 ** 16 }, builder: { base: 2 ** 29 + 2 ** 20, size: 2 ** 16 } })).toBeNull();
    // Instances that build as root (and entries of older versions) claim no builder range.
    expect(rangeConflict({ uid_pool: A.uid_pool }, 'other', 7, { uid_pool: { base: 2 ** 31, size: 2 ** 16 }, builder: null })).toBeNull();
    expect(rangeConflict(A, 'other', 7, { uid_pool: { base: 2 ** 31, size: 2 ** 16 } })?.kind ?? null).toBeNull();
  });

  it('a second dsecd whose builder range overlaps a live instance does not start (registry)', async () => {
    const reg = mkdtempSync(path.join(tmpdir(), 'dsec-reg-'));
    let sleeper: ChildProcess | undefined;
    try {
      // A "live instance": a process of ours, registered by hand.
      sleeper = spawn('sleep', ['600'], { stdio: 'ignore' });
      const pid = sleeper.pid!;
      writeFileSync(path.join(reg, 'live.json'), JSON.stringify({ pid, start: null, root: '/x', socket: '/x.sock', uid_pool: { base: 2 ** 30, size: 2 ** 24 }, builder: { base: 2 ** 29, size: 2 ** 20 } }));
      // REGISTRY_DIR is read when the module loads: load a fresh copy with the test's dir.
      process.env.DSEC_REGISTRY_DIR = reg;
      vi.resetModules();
      const { registerInstance } = await import('../../daemon/host/instances.js');
      const cfg = (builder: IdRange) => ({ ...loadConfig({ env: {}, config: undefined }), instance: 'mine', root: '/y', socket: '/y.sock', uidPool: { base: 2 ** 31, size: 2 ** 24, rangeSize: 65536 }, builder: { enabled: true, ...builder } });
      expect(() => registerInstance(cfg({ base: 2 ** 29 + 2 ** 19, size: 2 ** 16 }))).toThrow(/builder range .* overlaps instance live's builder range/);
      expect(() => registerInstance(cfg({ base: 2 ** 30, size: 2 ** 16 }))).toThrow(/builder range .* overlaps instance live's uid pool/);
      const ok = registerInstance(cfg({ base: 2 ** 29 + 2 ** 20, size: 2 ** 16 }));
      ok.release();
    } finally {
      delete process.env.DSEC_REGISTRY_DIR;
      vi.resetModules();
      sleeper?.kill('SIGKILL');
      rmSync(reg, { recursive: true, force: true });
    }
  });
});

describe('integration-test id grid (test/integration/harness.ts) against the production defaults', () => {
  it('every leasable slot has a pool and a builder range that overlap nothing else', () => {
    const ranges: Array<{ what: string; r: IdRange }> = [
      { what: 'default pool', r: DEFAULT_POOL },
      { what: 'default builder', r: DEFAULT_BUILDER_RANGE },
      { what: 'bench/builder pool', r: { base: 3 * 2 ** 28, size: 2 ** 24 } },
    ];
    for (let s = 0; s < SLOTS; s++) ranges.push({ what: `slot ${s} pool`, r: uidPoolForSlot(s) }, { what: `slot ${s} builder`, r: builderRangeForSlot(s) });
    const clashes: string[] = [];
    for (let i = 0; i < ranges.length; i++) {
      for (let j = i + 1; j < ranges.length; j++) if (rangesOverlap(ranges[i].r, ranges[j].r)) clashes.push(`${ranges[i].what} / ${ranges[j].what}`);
    }
    expect(clashes).toEqual([]);
    for (const x of ranges) if (x.what.endsWith('builder')) {
      expect(checkBuilderRange(x.r, DEFAULT_POOL), x.what).toBe(16);
      expect(x.r.base + x.r.size, x.what).toBeLessThanOrEqual(2 ** 32 - 1);
    }
  });
});

describe('what root hands the builder worker', () => {
  it('root-owned entries and capabilities survive the encoding byte for byte, names that are not UTF-8 included', () => {
    const f = {
      rootOwned: [{ rel: Buffer.alloc(0), uid: false, gid: false }, { rel: Buffer.from([0x66, 0xff, 0x0a, 0x5c]), uid: true, gid: false }],
      caps: [{ rel: Buffer.from('usr/bin/ping'), value: Buffer.from('0100000200200000000000000000000000000000', 'hex') }],
    };
    expect(decodeFixups(encodeFixups(f))).toEqual(f);
  });
});
