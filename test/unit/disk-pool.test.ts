/**
 * The writable-layer pool (daemon/storage/pool.ts): admission's cap, the default
 * reserve, and the guard's decisions; and the I/O conversions of daemon/host/cgroups/io.ts.
 * Pure functions, numbers in and out; the behaviour on a real store is in
 * test/attacks/disk.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { defaultReserveBytes, fairShares, guardPool, humanBytes, quotaCap, type PoolEntry } from '../../daemon/storage/pool.js';
import { bfqWeight, ioMaxLine, parseBlkioRw, parseIoStat, v1ThrottleLines, v1Weight } from '../../daemon/host/cgroups/io.js';

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

const entry = (id: string, o: Partial<PoolEntry>): PoolEntry => ({ id, quotaBytes: 10 * GiB, usedBytes: 0, previousBytes: 0, guardLimitBytes: null, filled: false, ...o });

describe('pool admission and reserve', () => {
  it('the cap is the store size times the ratio', () => {
    expect(quotaCap({ sizeBytes: 40 * GiB, overcommit: 1 })).toBe(40 * GiB);
    expect(quotaCap({ sizeBytes: 40 * GiB, overcommit: 2.5 })).toBe(100 * GiB);
  });
  it('the default reserve is 2% within 256 MiB..4 GiB, never above a quarter of the store', () => {
    expect(defaultReserveBytes(40 * GiB)).toBe(Math.floor(40 * GiB * 0.02));
    expect(defaultReserveBytes(4 * GiB)).toBe(256 * MiB);
    expect(defaultReserveBytes(1024 * GiB)).toBe(4 * GiB);
    expect(defaultReserveBytes(GiB)).toBe(256 * MiB);
  });
  it('humanBytes', () => {
    expect(humanBytes(40 * GiB)).toBe('40 GiB');
    expect(humanBytes(1536 * MiB)).toBe('1.5 GiB');
    expect(humanBytes(12)).toBe('12 B');
  });
});

describe('pool guard', () => {
  it('fairShares: demands below the level are met whole, the rest share what is left equally, in whole MiB', () => {
    expect(fairShares(900 * MiB, [100 * MiB, 600 * MiB, 600 * MiB])).toEqual([100 * MiB, 400 * MiB, 400 * MiB]);
    expect(fairShares(444 * MiB, [600 * MiB, 300 * MiB])).toEqual([222 * MiB, 222 * MiB]);
    expect(fairShares(10 * MiB, [MiB, 2 * MiB])).toEqual([MiB, 2 * MiB]);
    expect(fairShares(10 * MiB + 1, [9 * MiB, 9 * MiB])).toEqual([5 * MiB, 5 * MiB]);
    expect(fairShares(0, [MiB])).toEqual([0]);
    expect(fairShares(-5, [MiB, 0])).toEqual([0, 0]);
    const s = fairShares(1000 * MiB + 12345, [700 * MiB, 300 * MiB, 999 * MiB, 5]);
    expect(s.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(1000 * MiB + 12345);
  });

  it('does nothing while every headroom fits above the reserve', () => {
    expect(guardPool(30 * GiB, GiB, [entry('a', { usedBytes: GiB, previousBytes: 0 }), entry('b', {})])).toMatchObject({ decisions: [], tight: false });
  });

  it('limits every sandbox, idle ones too, to its use plus its share of the room above the reserve, before it writes', () => {
    // The reviewer's case: 1 GiB store, 256 MiB reserve, two 600 MiB quotas, the neighbour holds 300 MiB.
    const c = guardPool(700 * MiB, 256 * MiB, [
      entry('idle', { quotaBytes: 600 * MiB, usedBytes: 0, previousBytes: 0 }),
      entry('nb', { quotaBytes: 600 * MiB, usedBytes: 300 * MiB, previousBytes: 300 * MiB }),
    ]);
    expect(c.decisions).toEqual([
      { id: 'idle', limitBytes: 222 * MiB, restore: false },
      { id: 'nb', limitBytes: 522 * MiB, restore: false },
    ]);
    // Whatever both write before the next check, the reserve stays free.
    expect(c.decisions.reduce((a, d) => a + d.limitBytes, 0) - 300 * MiB).toBeLessThanOrEqual(700 * MiB - 256 * MiB);
    expect(c.filled).toEqual([]);
  });

  it('a sandbox that wrote up to its limit filled the store: the reserve goes to the others, none to it', () => {
    const c = guardPool(478 * MiB, 256 * MiB, [
      entry('w', { quotaBytes: 600 * MiB, usedBytes: 222 * MiB, previousBytes: 0, guardLimitBytes: 222 * MiB }),
      entry('nb', { quotaBytes: 600 * MiB, usedBytes: 300 * MiB, previousBytes: 300 * MiB, guardLimitBytes: 522 * MiB }),
    ]);
    expect(c.filled).toEqual(['w']);
    // The room (222 MiB) is split again: 111 MiB each; the neighbour's headroom (300 MiB)
    // fits in its share of the room plus the reserve: its quota is back.
    expect(c.decisions).toEqual([
      { id: 'w', limitBytes: 333 * MiB, restore: false },
      { id: 'nb', limitBytes: 600 * MiB, restore: true },
    ]);
    // Once marked, it is not reported again, and still gets none of the reserve.
    const again = guardPool(256 * MiB, 256 * MiB, [
      entry('w', { quotaBytes: 600 * MiB, usedBytes: 333 * MiB, previousBytes: 300 * MiB, guardLimitBytes: 333 * MiB, filled: true }),
      entry('x', { quotaBytes: 600 * MiB, usedBytes: 0, previousBytes: 0, guardLimitBytes: 10 * MiB }),
    ]);
    expect(again.filled).toEqual([]);
    expect(again.decisions).toEqual([{ id: 'x', limitBytes: 256 * MiB, restore: false }]);
  });

  it('an idle sandbox at a tiny limit did not fill the store: filling needs a write since the last check', () => {
    const c = guardPool(100 * MiB, 256 * MiB, [entry('a', { quotaBytes: 600 * MiB, usedBytes: 5 * MiB, previousBytes: 5 * MiB, guardLimitBytes: 5 * MiB })]);
    expect(c.filled).toEqual([]);
    // The free space is inside the reserve: it is shared among those that did not fill.
    expect(c.decisions).toEqual([{ id: 'a', limitBytes: 105 * MiB, restore: false }]);
    expect(guardPool(100 * MiB, 256 * MiB, [entry('a', { quotaBytes: 600 * MiB, usedBytes: 5 * MiB, previousBytes: null, guardLimitBytes: 5 * MiB })]).filled).toEqual([]);
  });

  it('lowers a limit by any amount, raises it only by at least 1 MiB', () => {
    const base = { quotaBytes: 10 * GiB, usedBytes: 2 * GiB, previousBytes: 2 * GiB };
    // One sandbox, 4 GiB of room: its share is 4 GiB, limit 6 GiB.
    expect(guardPool(5 * GiB, GiB, [entry('a', { ...base, guardLimitBytes: 6 * GiB + 1000 })]).decisions).toEqual([{ id: 'a', limitBytes: 6 * GiB, restore: false }]);
    expect(guardPool(5 * GiB, GiB, [entry('a', { ...base, guardLimitBytes: 6 * GiB - 1000 })]).decisions).toEqual([]);
    expect(guardPool(5 * GiB, GiB, [entry('a', { ...base, guardLimitBytes: 6 * GiB - MiB })]).decisions).toEqual([{ id: 'a', limitBytes: 6 * GiB, restore: false }]);
  });

  it('restores every quota once all headrooms fit above the reserve; a reserve of 0 turns the guard off', () => {
    const c = guardPool(20 * GiB, GiB, [entry('a', { usedBytes: 2 * GiB, previousBytes: GiB, guardLimitBytes: 2 * GiB, filled: true }), entry('b', { usedBytes: 0 })]);
    expect(c).toMatchObject({ tight: false, decisions: [{ id: 'a', limitBytes: 10 * GiB, restore: true }] });
    expect(guardPool(MiB, 0, [entry('a', { usedBytes: 2 * GiB, guardLimitBytes: 2 * GiB })]).decisions).toEqual([{ id: 'a', limitBytes: 10 * GiB, restore: true }]);
  });

  it('shared by 16 or more, 1/16 of the room is kept out of the split for new layers; below 16 nothing is', () => {
    const idle = (n: number) => Array.from({ length: n }, (_, i) => entry(`s${i}`, { quotaBytes: 10 * GiB, usedBytes: 0, previousBytes: 0 }));
    // 16 idle sandboxes, 4 GiB of room: 256 MiB kept, 3840 MiB split, 240 MiB each.
    const c = guardPool(5 * GiB, GiB, idle(16));
    expect(c).toMatchObject({ tight: true, withheldBytes: 256 * MiB, levelBytes: 240 * MiB });
    expect(c.decisions.every((d) => d.limitBytes === 240 * MiB)).toBe(true);
    expect(c.decisions.reduce((a, d) => a + d.limitBytes, 0) + c.withheldBytes).toBeLessThanOrEqual(4 * GiB);
    // 15: the whole room is split (273 MiB each, whole MiB).
    expect(guardPool(5 * GiB, GiB, idle(15))).toMatchObject({ withheldBytes: 0, levelBytes: 273 * MiB });
    // Not tight: nothing kept.
    expect(guardPool(30 * GiB, GiB, [entry('a', {})])).toMatchObject({ tight: false, withheldBytes: 0, levelBytes: 0 });
  });

  it('a sandbox whose headroom is below its share keeps its quota', () => {
    const c = guardPool(3 * GiB, GiB, [entry('small', { quotaBytes: GiB, usedBytes: 512 * MiB }), entry('big', { quotaBytes: 10 * GiB, usedBytes: 0 })]);
    expect(c.decisions).toEqual([{ id: 'big', limitBytes: 1536 * MiB, restore: false }]);
  });
});

describe('I/O settings on the cgroup files', () => {
  const dev = { major: 7, minor: 2 };
  it('weights: v2 scale to BFQ (same number, 1..1000) and to v1 CFQ (x5, 10..1000); defaults match', () => {
    expect(bfqWeight(100)).toBe(100);
    expect(bfqWeight(10_000)).toBe(1000);
    expect(bfqWeight(1)).toBe(1);
    expect(v1Weight(100)).toBe(500);
    expect(v1Weight(1)).toBe(10);
    expect(v1Weight(10_000)).toBe(1000);
  });
  it('io.max line names every key; v1 writes 0 for no limit', () => {
    const l = { weight: null, readBps: 4096, writeBps: null, readIops: null, writeIops: 7 };
    expect(ioMaxLine(dev, l)).toBe('7:2 rbps=4096 wbps=max riops=max wiops=7');
    expect(v1ThrottleLines(dev, l)).toEqual([
      ['blkio.throttle.read_bps_device', '7:2 4096'], ['blkio.throttle.write_bps_device', '7:2 0'],
      ['blkio.throttle.read_iops_device', '7:2 0'], ['blkio.throttle.write_iops_device', '7:2 7'],
    ]);
  });
  it('parses io.stat and v1 per-device counters', () => {
    expect(parseIoStat('7:2 rbytes=10 wbytes=20 rios=1 wios=2 dbytes=0 dios=0\n', dev)).toEqual({ readBytes: 10, writeBytes: 20, readIos: 1, writeIos: 2 });
    expect(parseBlkioRw('7:2 Read 4096\n7:2 Write 8192\n7:2 Sync 0\n253:0 Write 1\nTotal 12288\n', dev)).toEqual({ read: 4096, write: 8192 });
  });
});

describe('dsec create I/O flags', () => {
  it('map to io_weight and io_max; none given: neither is sent', async () => {
    const { createRequest } = await import('../../cli/commands/create.js');
    expect(createRequest({ ioWeight: 50, ioWriteBps: 1048576, ioReadIops: 100 })).toMatchObject({ io_weight: 50, io_max: { write_bps: 1048576, read_iops: 100 } });
    const none = createRequest({});
    expect(none.io_weight).toBeUndefined();
    expect(none.io_max).toBeUndefined();
  });
});
