/**
 * The writable-layer pool (daemon/storage/pool.ts): admission's cap, the default
 * reserve, and the guard's decisions; and the I/O conversions of daemon/host/cgroups/io.ts.
 * Pure functions, numbers in and out; the behaviour on a real store is in
 * test/attacks/disk.test.ts.
 */
import { describe, expect, it } from 'vitest';
import { defaultReserveBytes, guardPool, humanBytes, quotaCap, type PoolEntry } from '../../daemon/storage/pool.js';
import { bfqWeight, ioMaxLine, parseBlkioRw, parseIoStat, v1ThrottleLines, v1Weight } from '../../daemon/host/cgroups/io.js';

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

const entry = (id: string, o: Partial<PoolEntry>): PoolEntry => ({ id, quotaBytes: 10 * GiB, usedBytes: 0, previousBytes: 0, guardLimitBytes: null, ...o });

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
  it('does nothing while every headroom fits above the reserve', () => {
    expect(guardPool(30 * GiB, GiB, [entry('a', { usedBytes: GiB, previousBytes: 0 }), entry('b', {})])).toEqual([]);
  });
  it('limits a writer to its use plus the room above the reserve, and leaves sandboxes that did not write alone', () => {
    const d = guardPool(5 * GiB, GiB, [entry('a', { usedBytes: 2 * GiB, previousBytes: GiB }), entry('b', { usedBytes: MiB, previousBytes: MiB })]);
    expect(d).toEqual([{ id: 'a', limitBytes: 6 * GiB, restore: false }]);
  });
  it('holds a writer at its use once the free space is inside the reserve', () => {
    expect(guardPool(512 * MiB, GiB, [entry('a', { usedBytes: 8 * GiB, previousBytes: 7 * GiB, guardLimitBytes: 8 * GiB + 300 * MiB })]))
      .toEqual([{ id: 'a', limitBytes: 8 * GiB, restore: false }]);
  });
  it('moves a guard limit only by at least 1 MiB while there is room, and never up (statfs lags behind the page cache)', () => {
    expect(guardPool(5 * GiB, GiB, [entry('a', { usedBytes: 2 * GiB, previousBytes: GiB, guardLimitBytes: 6 * GiB + 1000 })])).toEqual([]);
    expect(guardPool(5 * GiB, GiB, [entry('a', { usedBytes: 3 * GiB, previousBytes: 2 * GiB, guardLimitBytes: 6 * GiB })])).toEqual([]);
  });
  it('does not take a sandbox as a writer on the first check (no previous use)', () => {
    expect(guardPool(2 * GiB, GiB, [entry('a', { usedBytes: 2 * GiB, previousBytes: null })])).toEqual([]);
  });
  it('restores the quota once the whole headroom fits above the reserve again', () => {
    expect(guardPool(20 * GiB, GiB, [entry('a', { usedBytes: 2 * GiB, previousBytes: 2 * GiB, guardLimitBytes: 2 * GiB })]))
      .toEqual([{ id: 'a', limitBytes: 10 * GiB, restore: true }]);
    // Still writing: keeps its limit, whatever statfs says.
    expect(guardPool(20 * GiB, GiB, [entry('a', { usedBytes: 3 * GiB, previousBytes: 2 * GiB, guardLimitBytes: 3 * GiB })])).toEqual([]);
  });
  it('a writer whose headroom is just over the room gets a limit just under its quota; a guarded sandbox whose headroom fits is restored', () => {
    expect(guardPool(10 * GiB + MiB, GiB, [entry('a', { quotaBytes: 10 * GiB, usedBytes: MiB, previousBytes: 0 })]))
      .toEqual([{ id: 'a', limitBytes: 9 * GiB + 2 * MiB, restore: false }]);
    expect(guardPool(9 * GiB, GiB, [entry('a', { quotaBytes: 4 * GiB, usedBytes: 3 * GiB, previousBytes: 3 * GiB, guardLimitBytes: 3 * GiB })]))
      .toEqual([{ id: 'a', limitBytes: 4 * GiB, restore: true }]);
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
