/**
 * The writable-layer store's pure parts (daemon/storage/), its config, and the
 * manager's quota check, without privileges: the store itself is exercised on real
 * btrfs and XFS in test/integration/storage.test.ts and test/attacks/disk.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { DEFAULT_DISK_BYTES, loadConfig } from '../../daemon/config.js';
import { MAX_DEFAULT_STORE_BYTES, MIN_STORE_BYTES, defaultStoreBytes, mountSourceOf, type DiskUsage } from '../../daemon/storage/writable-layers.js';
import { DiskQuotaWatch, diskFullSlack } from '../../daemon/sandbox/disk-quota.js';

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

function withConfig(toml: string) {
  const dir = mkdtempSync(path.join(tmpdir(), 'dsec-cfg-'));
  try {
    const f = path.join(dir, 'c.toml');
    writeFileSync(f, toml);
    return loadConfig({ config: f, env: {} });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe('[storage] and [defaults] disk_bytes', () => {
  it('defaults: auto, sized at creation, sparse, 10 GiB per sandbox', () => {
    const c = withConfig('');
    expect(c.storage).toEqual({ upperFs: 'auto', sizeBytes: null, preallocate: false, path: null, reserveBytes: null });
    expect(c.defaults.diskBytes).toBe(DEFAULT_DISK_BYTES);
    expect(DEFAULT_DISK_BYTES).toBe(10 * GiB);
  });

  it('takes every key, and refuses bad values with the key named', () => {
    const c = withConfig(`[storage]\nupper_fs = "xfs"\nsize_bytes = ${8 * GiB}\npreallocate = true\npath = "/srv/x/../dsec"\n[defaults]\ndisk_bytes = ${64 * MiB}\n`);
    expect(c.storage).toEqual({ upperFs: 'xfs', sizeBytes: 8 * GiB, preallocate: true, path: '/srv/dsec', reserveBytes: null });
    expect(c.defaults.diskBytes).toBe(64 * MiB);
    expect(() => withConfig('[storage]\nupper_fs = "ext4"\n')).toThrow(/storage\.upper_fs/);
    expect(() => withConfig(`[storage]\nsize_bytes = ${MiB}\n`)).toThrow(/storage\.size_bytes/);
    expect(() => withConfig('[storage]\npath = "relative/dir"\n')).toThrow(/path is absolute/);
    expect(() => withConfig(`[defaults]\ndisk_bytes = ${MiB}\n`)).toThrow(/defaults\.disk_bytes/);
  });
});

describe('store sizing and mount lookup', () => {
  it('the default store is half the free space, whole MiB, between 1 GiB and 1 TiB', () => {
    expect(defaultStoreBytes(80 * GiB + 3)).toBe(40 * GiB);
    expect(defaultStoreBytes(10 * GiB + 3 * MiB)).toBe(5 * GiB + MiB);
    expect(defaultStoreBytes(10 * 1024 ** 4)).toBe(MAX_DEFAULT_STORE_BYTES);
    expect(defaultStoreBytes(2 * MIN_STORE_BYTES)).toBe(MIN_STORE_BYTES);
    expect(defaultStoreBytes(2 * MIN_STORE_BYTES - 2 * MiB)).toBeNull();
  });

  it('finds the source of the topmost mount at a path in mountinfo (escapes decoded)', () => {
    const mi = [
      '22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw',
      '90 22 0:51 / /var/lib/dsec/storage/mnt rw,noatime shared:40 - btrfs /dev/loop3 rw,discard=async',
      '91 22 0:52 / /tmp/with\\040space/mnt rw - xfs /dev/loop4 rw',
      '92 90 0:53 / /var/lib/dsec/storage/mnt rw - xfs /dev/loop5 rw',
    ].join('\n');
    expect(mountSourceOf(mi, '/var/lib/dsec/storage/mnt')).toBe('/dev/loop5');
    expect(mountSourceOf(mi, '/tmp/with space/mnt')).toBe('/dev/loop4');
    expect(mountSourceOf(mi, '/nowhere')).toBeNull();
  });
});

describe('quota check (DiskQuotaWatch.check)', () => {
  /** A watch over a fake store whose usage the test sets, and a repo that records events. */
  function setup() {
    let usage = new Map<string, DiskUsage>();
    const events: { type: string; id: string; message?: string }[] = [];
    const rows = new Set(['a', 'b']);
    const m = new DiskQuotaWatch({
      config: { root: '/nonexistent' },
      repo: {
        find: (id: string) => (rows.has(id) ? { id } : null),
        event: (type: string, sb: { id: string }, message?: string) => events.push({ type, id: sb.id, message }),
      },
      storage: { usageAll: () => usage },
      log: pino({ level: 'silent' }),
    } as never);
    return { m, events, rows, set: (u: Record<string, DiskUsage>) => (usage = new Map(Object.entries(u))) };
  }

  it('records one event when a layer fills up, again only after it was emptied', () => {
    const { m, events, set } = setup();
    const limit = 64 * MiB;
    set({ a: { usedBytes: 10 * MiB, limitBytes: limit }, b: { usedBytes: 5 * MiB, limitBytes: null } });
    expect(m.check()).toEqual([]);
    set({ a: { usedBytes: limit - diskFullSlack(limit) + 1, limitBytes: limit }, b: { usedBytes: 500 * GiB, limitBytes: null } });
    expect(m.check()).toEqual(['a']);
    expect(m.check()).toEqual([]); // still full: no second event
    set({ a: { usedBytes: limit - diskFullSlack(limit) - MiB, limitBytes: limit } }); // a little below: still counted as full
    expect(m.check()).toEqual([]);
    set({ a: { usedBytes: MiB, limitBytes: limit } });
    expect(m.check()).toEqual([]);
    set({ a: { usedBytes: limit, limitBytes: limit } });
    expect(m.check()).toEqual(['a']);
    expect(events.map((e) => `${e.type} ${e.id}`)).toEqual(['sandbox.disk_quota a', 'sandbox.disk_quota a']);
    expect(events[0].message).toMatch(/of 67108864 bytes/);
  });

  it('ignores layers without a row (being destroyed) and forgets layers that are gone', () => {
    const { m, events, rows, set } = setup();
    rows.delete('b');
    set({ b: { usedBytes: 64 * MiB, limitBytes: 64 * MiB } });
    expect(m.check()).toEqual([]);
    set({ a: { usedBytes: 64 * MiB, limitBytes: 64 * MiB } });
    expect(m.check()).toEqual(['a']);
    set({});
    m.check();
    set({ a: { usedBytes: 64 * MiB, limitBytes: 64 * MiB } });
    expect(m.check()).toEqual(['a']); // a new layer of the same id fills up: a new event
    expect(events).toHaveLength(2);
  });

  it('the slack is 4 MiB, or 1/16 of a small quota', () => {
    expect(diskFullSlack(10 * GiB)).toBe(4 * MiB);
    expect(diskFullSlack(32 * MiB)).toBe(2 * MiB);
  });
});

describe('pool guard in the create path (DiskQuotaWatch.guard)', () => {
  /**
   * A tight store (4 GiB free, 256 MiB reserve) holding `n` idle layers of 10 GiB quota,
   * over a fake store that counts its reads and limit changes and enforces nothing: the
   * guard's arithmetic, not the kernel's (test/attacks/disk.test.ts has the kernel's).
   */
  function tight(n: number) {
    const quotas = new Map<string, number>();
    const limits = new Map<string, number>();
    for (let i = 0; i < n; i++) quotas.set(`s${i}`, 10 * GiB);
    const count = { usage: 0, usageAll: 0, setLimit: 0 };
    const used = (id: string): DiskUsage | null => (quotas.has(id) ? { usedBytes: 0, limitBytes: limits.get(id) ?? quotas.get(id)! } : null);
    const m = new DiskQuotaWatch({
      config: { storage: { reserveBytes: 256 * MiB }, admission: { diskOvercommit: 100 } },
      repo: { find: () => null, event: () => {}, diskQuotas: () => new Map(quotas) },
      storage: {
        enforcesQuota: true, location: '/fake',
        space: () => ({ sizeBytes: 8 * GiB, usedBytes: 4 * GiB, availableBytes: 4 * GiB }),
        usage: (id: string) => (count.usage++, used(id)),
        usageAll: () => (count.usageAll++, new Map([...quotas.keys()].map((id) => [id, used(id)!]))),
        setPoolLimit: (id: string, b: number) => (count.setLimit++, limits.set(id, b), true),
        currentLimit: () => null,
      },
      log: pino({ level: 'silent' }),
    } as never);
    /** Headroom the limits of all layers hold together, bytes (every layer is idle at 0 bytes). */
    const held = () => [...quotas.keys()].reduce((a, id) => a + (limits.get(id) ?? quotas.get(id)!), 0);
    const add = (id: string) => quotas.set(id, 10 * GiB);
    return { m, count, held, add, room: 4 * GiB - 256 * MiB };
  }

  it('a create on a tight store takes its share from the allowance of the last split: one read and one limit, no split', () => {
    const t = tight(100);
    t.m.check(); // the reaper's split: every layer gets the level, 1/16 of the room is kept
    expect(t.held()).toBeLessThanOrEqual(t.room - Math.floor(t.room / 16));
    const before = { ...t.count };
    for (let i = 0; i < 5; i++) {
      t.add(`new${i}`);
      t.m.guard(`new${i}`, 10 * GiB);
    }
    expect(t.count.usageAll - before.usageAll).toBe(0);
    expect(t.count.usage - before.usage).toBe(5);
    expect(t.count.setLimit - before.setLimit).toBe(5);
    // The new layers' limits fit in what was kept: the limits together stay within the room.
    expect(t.held()).toBeLessThanOrEqual(t.room);
  });

  it('once the allowance is used up, the next create splits the room again over every layer; the limits never pass the room', () => {
    const t = tight(100);
    t.m.check();
    let splits = 0;
    for (let i = 0; i < 40; i++) {
      const all = t.count.usageAll;
      t.add(`new${i}`);
      t.m.guard(`new${i}`, 10 * GiB);
      if (t.count.usageAll > all) splits++;
      expect(t.held()).toBeLessThanOrEqual(t.room);
    }
    // About n/16 creates per allowance (the level falls as layers are added): far fewer splits than creates, and some.
    expect(splits).toBeGreaterThan(0);
    expect(splits).toBeLessThan(10);
  });

  it('with no split yet (a fresh dsecd) the create path splits at once', () => {
    const t = tight(10);
    t.add('new');
    t.m.guard('new', 10 * GiB);
    expect(t.count.usageAll).toBe(1);
    expect(t.held()).toBeLessThanOrEqual(t.room);
  });
});
