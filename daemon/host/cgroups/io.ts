/**
 * Block I/O control of sandbox cgroups: the shapes shared by the v1 (`blkio`) and v2
 * (`io`) managers, the conversions between their scales, and parsers of their counters.
 * Pure: no file is read or written here (v1.ts and v2.ts do that).
 *
 * What the kernel enforces, and where (docs/OPERATIONS.md "Disk I/O"):
 *   - Limits (bytes/s, IOs/s per device): v2 `io.max`; v1 `blkio.throttle.*_device`.
 *     Both act on bios as they are submitted to the device. On v2, cgroup writeback
 *     attributes a page's writeback to the cgroup that dirtied it, so buffered writes are
 *     limited too (btrfs and XFS support cgroup writeback). On v1 there is no cgroup
 *     writeback: buffered writes reach the device from the flusher threads, charged to the
 *     root cgroup, so only direct I/O and reads (submitted by the task itself) are limited.
 *   - Weights (a share of a contended device): v2 `io.bfq.weight` when the device's
 *     scheduler is BFQ, else `io.weight`, which only the iocost controller honours
 *     (enabled per device in the root's `io.cost.qos`); v1 `blkio.bfq.weight` (BFQ) or
 *     `blkio.weight` (CFQ, gone since Linux 5.0). A weight file that exists while neither
 *     BFQ nor iocost runs on the device is accepted and has no effect: reported as such.
 */

import { z } from 'zod';
import { IO_MAX_MIN_BPS, type IoLimits } from '../../model/resources.js';

/** A block device as cgroup files name it (`MAJ:MIN`). */
export interface BlockDevice {
  major: number;
  minor: number;
}

/**
 * The `io_max` format of the API and of `[defaults.io_max]` in the config: bytes per
 * second and IOs per second, each optional (absent: unlimited), at least one given.
 * Applied as cgroup v2 `io.max` or v1 `blkio.throttle.*` (docs/OPERATIONS.md "Disk I/O").
 */
export const IoMaxSchema = z
  .object({
    read_bps: z.number().int().min(IO_MAX_MIN_BPS).optional().describe(`Read bytes per second (at least ${IO_MAX_MIN_BPS}).`),
    write_bps: z.number().int().min(IO_MAX_MIN_BPS).optional().describe(`Written bytes per second (at least ${IO_MAX_MIN_BPS}).`),
    read_iops: z.number().int().min(1).optional().describe('Read IOs per second.'),
    write_iops: z.number().int().min(1).optional().describe('Write IOs per second.'),
  })
  .strict()
  .refine((m) => Object.keys(m).length > 0, 'io_max names at least one of read_bps, write_bps, read_iops, write_iops');
export type IoMax = z.infer<typeof IoMaxSchema>;

/**
 * A v2-scale weight (1-10,000, default 100) on the BFQ scale (`io.bfq.weight`,
 * `blkio.bfq.weight`: 1-1,000, default 100): the same number, clamped, so defaults match
 * and ratios between 1 and 1,000 are kept.
 */
export function bfqWeight(w: number): number {
  return Math.min(1000, Math.max(1, Math.round(w)));
}

/**
 * A v2-scale weight on the v1 CFQ scale (`blkio.weight`: 10-1,000, default 500): times 5,
 * clamped, so the defaults match (100 -> 500) and ratios between 2 and 200 are kept.
 */
export function v1Weight(w: number): number {
  return Math.min(1000, Math.max(10, Math.round(w * 5)));
}

/** `MAJ:MIN`. */
export function devKey(d: BlockDevice): string {
  return `${d.major}:${d.minor}`;
}

/** The line to write to v2 `io.max` for `l` on `d`: every key, `max` where unlimited (so a setting can also be removed). */
export function ioMaxLine(d: BlockDevice, l: IoLimits): string {
  const v = (n: number | null) => (n === null ? 'max' : String(n));
  return `${devKey(d)} rbps=${v(l.readBps)} wbps=${v(l.writeBps)} riops=${v(l.readIops)} wiops=${v(l.writeIops)}`;
}

/** v1 throttle files and the value of each for `l` on `d` (`MAJ:MIN 0` removes a limit). */
export function v1ThrottleLines(d: BlockDevice, l: IoLimits): [file: string, line: string][] {
  const v = (n: number | null) => `${devKey(d)} ${n ?? 0}`;
  return [
    ['blkio.throttle.read_bps_device', v(l.readBps)],
    ['blkio.throttle.write_bps_device', v(l.writeBps)],
    ['blkio.throttle.read_iops_device', v(l.readIops)],
    ['blkio.throttle.write_iops_device', v(l.writeIops)],
  ];
}

/** Bytes and IOs a cgroup submitted to one device since it was created (v2 `io.stat`; v1 `blkio.throttle.io_service_bytes`/`io_serviced`). */
export interface IoCounters {
  readBytes: number;
  writeBytes: number;
  readIos: number;
  writeIos: number;
}

/** The counters of device `d` in the text of a v2 `io.stat` (`8:16 rbytes=1 wbytes=2 rios=3 wios=4 ...`); zeros when it has no line for `d`. */
export function parseIoStat(text: string, d: BlockDevice): IoCounters {
  const out: IoCounters = { readBytes: 0, writeBytes: 0, readIos: 0, writeIos: 0 };
  for (const line of text.split('\n')) {
    const [dev, ...kv] = line.trim().split(/\s+/);
    if (dev !== devKey(d)) continue;
    for (const pair of kv) {
      const [k, v] = pair.split('=');
      const n = Number(v);
      if (!Number.isFinite(n)) continue;
      if (k === 'rbytes') out.readBytes = n;
      else if (k === 'wbytes') out.writeBytes = n;
      else if (k === 'rios') out.readIos = n;
      else if (k === 'wios') out.writeIos = n;
    }
  }
  return out;
}

/**
 * The `Read` and `Write` counts of device `d` in a v1 blkio per-device file
 * (`7:2 Read 4096` lines, as in `blkio.throttle.io_service_bytes`); zeros when absent.
 */
export function parseBlkioRw(text: string, d: BlockDevice): { read: number; write: number } {
  let read = 0, write = 0;
  for (const line of text.split('\n')) {
    const [dev, op, v] = line.trim().split(/\s+/);
    if (dev !== devKey(d)) continue;
    if (op === 'Read') read = Number(v) || 0;
    else if (op === 'Write') write = Number(v) || 0;
  }
  return { read, write };
}

/**
 * What a host enforces of {@link IoLimits} on one device, for `dsec host info` and each
 * sandbox's defences: which files carry the settings and whether each takes effect.
 */
export interface IoSupport {
  /** The file a weight is written to (`io.bfq.weight`, `io.weight`, `blkio.bfq.weight`, `blkio.weight`), or null where there is none. */
  weightFile: string | null;
  /** True when the weight takes effect on the device (BFQ is its scheduler, or iocost is enabled for it). */
  weightEnforced: boolean;
  /** The file(s) limits are written to (`io.max`, `blkio.throttle.*`), or null where there are none. */
  limitFile: string | null;
  /** True when limits apply to direct I/O and reads (the task's own bios). */
  limitEnforced: boolean;
  /** True when limits also apply to buffered writes (cgroup writeback: v2 only). */
  bufferedWritesLimited: boolean;
  /** One sentence each on what is enforced and what is not, and why. */
  detail: string;
}
