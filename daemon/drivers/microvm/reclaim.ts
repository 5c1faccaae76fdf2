/**
 * Guest-side memory reclaim of the microvm tier (issue 23): dsecd asks each microVM's
 * agent to run a DAMON `pageout` scheme for the guest's cold memory (native/agent/damon.c),
 * the guest swaps cold anonymous pages out to a swap device of its own, and
 * virtio-balloon free-page reporting (`[vm] balloon`) hands the freed pages back to the
 * host, where QEMU discards them: the VMM's memory charge falls.
 *
 * This module holds the `[vm.reclaim]` settings (schema and defaults), the wire encoding
 * of the mux guest operations RECLAIM and RECLAIM_STATS (docs/AGENT_PROTOCOL.md "Guest
 * memory reclaim"), the guest kernel arguments that give the guest its swap (all pure),
 * and the few steps the driver (driver.ts) takes per boot: the swap file, the start of the
 * scheme, and the record of both (`<sandbox dir>/guest-reclaim.json`).
 *
 * Where pages go (`swap`), measured on this host (docs/ARCHITECTURE.md "Guest memory
 * reclaim"):
 *   - `disk` (default): a sparse raw file in the sandbox dir (`swap.raw`), a virtio-blk
 *     disk opened with O_DIRECT (no host page cache holds what the guest swapped out) and
 *     `discard=unmap` (the guest discards freed swap slots, so the file's blocks are
 *     released); /init runs mkswap and `swapon -d` at every boot. Pages leave the host's
 *     memory entirely; the cost is host disk I/O and a swap-in when the sandbox touches
 *     them again.
 *   - `zram`: a compressed swap device in the guest's own RAM: only the compression
 *     ratio is returned to the host (nothing for incompressible data), no host disk.
 *   - `none`: no swap: DAMON's pageout drops cold page cache only.
 */
import { constants as fsConstants, openSync, closeSync } from 'node:fs';
import { open, rename, rm, stat, writeFile } from 'node:fs/promises';
import { z } from 'zod';

/** `[vm.reclaim]` of dsecd.toml (see {@link GuestReclaimConfig} for each key). */
export const GuestReclaimSchema = z.object({
  mode: z.enum(['off', 'on']).optional(),
  min_age_s: z.number().positive().max(86_400).optional(),
  sample_ms: z.number().positive().max(60_000).optional(),
  aggr_ms: z.number().positive().max(600_000).optional(),
  cpu_ms_per_s: z.number().int().min(0).max(1000).optional(),
  bytes_per_s: z.number().int().min(0).optional(),
  free_high_permil: z.number().int().min(0).max(1000).optional(),
  free_mid_permil: z.number().int().min(0).max(1000).optional(),
  free_low_permil: z.number().int().min(0).max(1000).optional(),
  swap: z.enum(['disk', 'zram', 'none']).optional(),
  swap_bytes: z.number().int().min(0).optional(),
}).strict().refine((r) => (r.sample_ms ?? DEFAULT_SAMPLE_MS) <= (r.aggr_ms ?? DEFAULT_AGGR_MS), { message: 'sample_ms must not exceed aggr_ms' })
  .refine((r) => {
    const h = r.free_high_permil ?? 0;
    const m = r.free_mid_permil ?? 0;
    const l = r.free_low_permil ?? 0;
    return (h === 0 && m === 0 && l === 0) || (h >= m && m >= l);
  }, { message: 'watermarks need free_high_permil >= free_mid_permil >= free_low_permil' });

/** Default sampling interval: 100 ms (DAMON's own is 5 ms; a microVM host runs thousands of kdamonds, and cold memory is judged over tens of seconds). */
export const DEFAULT_SAMPLE_MS = 100;
/** Default aggregation interval: 2 s (20 samples per region; ages count in these). */
export const DEFAULT_AGGR_MS = 2000;
/** Default minimum age of a cold region: 60 s without an access (DAMON_RECLAIM's default is 120 s; sandboxes idle between an agent's steps for tens of seconds). */
export const DEFAULT_MIN_AGE_S = 60;
/** Default time quota: 10 ms of the guest's CPU per second (1% of a core) for applying the scheme. */
export const DEFAULT_CPU_MS_PER_S = 10;
/** Default size quota: 64 MiB per second paged out (a swap disk's write rate stays modest). */
export const DEFAULT_BYTES_PER_S = 64 * 1024 * 1024;

/** The resolved `[vm.reclaim]` settings (dsecd-wide; per-sandbox settings come later). */
export interface GuestReclaimConfig {
  /** `off` (default): no scheme, no swap device; `on`: every microVM whose guest kernel has DAMON runs one. */
  mode: 'off' | 'on';
  /** A region not accessed for this long is paged out, ms (`min_age_s`; default {@link DEFAULT_MIN_AGE_S}). */
  minAgeMs: number;
  /** DAMON sampling interval, µs (`sample_ms`; default {@link DEFAULT_SAMPLE_MS}). */
  sampleUs: number;
  /** DAMON aggregation interval, µs (`aggr_ms`; default {@link DEFAULT_AGGR_MS}). */
  aggrUs: number;
  /** Time quota: ms of guest CPU per second the scheme may use (`cpu_ms_per_s`; default {@link DEFAULT_CPU_MS_PER_S}; 0: none). */
  cpuMsPerS: number;
  /** Size quota: bytes per second the scheme may page out (`bytes_per_s`; default {@link DEFAULT_BYTES_PER_S}; 0: none). */
  bytesPerS: number;
  /**
   * Free-memory watermarks of the guest, per mille (`free_{high,mid,low}_permil`; default
   * all 0: no watermarks, the scheme always runs). With them, DAMON activates the scheme
   * when free memory falls below `mid` and deactivates it above `high` or below `low`.
   */
  watermarks: { high: number; mid: number; low: number };
  /** Where paged-out anonymous pages go (`swap`; default `disk`; see the module comment). */
  swap: 'disk' | 'zram' | 'none';
  /** Size of the swap device, bytes (`swap_bytes`; default 0: the guest's memory size). */
  swapBytes: number;
}

/** `[vm.reclaim]` with its defaults applied. */
export function resolveGuestReclaim(raw: z.infer<typeof GuestReclaimSchema> | undefined): GuestReclaimConfig {
  const r = raw ?? {};
  return {
    mode: r.mode ?? 'off',
    minAgeMs: Math.round((r.min_age_s ?? DEFAULT_MIN_AGE_S) * 1000),
    sampleUs: Math.round((r.sample_ms ?? DEFAULT_SAMPLE_MS) * 1000),
    aggrUs: Math.round((r.aggr_ms ?? DEFAULT_AGGR_MS) * 1000),
    cpuMsPerS: r.cpu_ms_per_s ?? DEFAULT_CPU_MS_PER_S,
    bytesPerS: r.bytes_per_s ?? DEFAULT_BYTES_PER_S,
    watermarks: { high: r.free_high_permil ?? 0, mid: r.free_mid_permil ?? 0, low: r.free_low_permil ?? 0 },
    swap: r.swap ?? 'disk',
    swapBytes: r.swap_bytes ?? 0,
  };
}

/** Bytes of RECLAIM's start argument (native/agent/damon.h DAMON_RECLAIM_ARG_LEN). */
export const RECLAIM_ARG_BYTES = 44;
/** The quota's reset interval the start argument asks for: 1 s, so the quotas are per second. */
export const QUOTA_RESET_MS = 1000;
/** How often DAMON checks the watermarks, ms. */
export const WATERMARK_CHECK_MS = 1000;

/**
 * The RECLAIM argument that starts (or replaces) the scheme: 44 bytes, big-endian —
 * u8 1, 3 bytes 0, u32 min age ms, u32 sample µs, u32 aggregation µs, u32 quota ms,
 * u32 quota reset interval ms, u64 quota bytes, u16 high, u16 mid, u16 low (free memory
 * per mille; all 0: no watermarks), u16 0, u32 watermark check interval ms. The quota
 * bytes are per reset interval ({@link QUOTA_RESET_MS}).
 */
export function encodeReclaimStart(c: GuestReclaimConfig): Buffer {
  const b = Buffer.alloc(RECLAIM_ARG_BYTES);
  b[0] = 1;
  b.writeUInt32BE(Math.min(0xffffffff, c.minAgeMs), 4);
  b.writeUInt32BE(c.sampleUs, 8);
  b.writeUInt32BE(c.aggrUs, 12);
  b.writeUInt32BE(c.cpuMsPerS, 16);
  b.writeUInt32BE(QUOTA_RESET_MS, 20);
  b.writeBigUInt64BE(BigInt(c.bytesPerS), 24);
  b.writeUInt16BE(c.watermarks.high, 32);
  b.writeUInt16BE(c.watermarks.mid, 34);
  b.writeUInt16BE(c.watermarks.low, 36);
  b.writeUInt32BE(WATERMARK_CHECK_MS, 40);
  return b;
}

/** The RECLAIM argument that stops the scheme (the kdamond stays, off). */
export function encodeReclaimStop(): Buffer {
  return Buffer.from([0]);
}

/** What RECLAIM_STATS reports: DAMOS stats of the scheme (as of its last refresh) and the guest's memory. Bytes and counts. */
export interface GuestReclaimStats {
  /** The guest's kdamond is running. */
  running: boolean;
  /** Regions the scheme was tried on, and their bytes. */
  nrTried: number;
  bytesTried: number;
  /** Regions the action (pageout) was applied to, and their bytes: what was paged out or dropped. */
  nrApplied: number;
  bytesApplied: number;
  /** Times a quota was exceeded (reclaim was held back by it). */
  quotaExceeds: number;
  /** The guest's /proc/meminfo MemTotal, MemFree, SwapTotal, SwapFree. */
  memTotalBytes: number;
  memFreeBytes: number;
  swapTotalBytes: number;
  swapFreeBytes: number;
}

/**
 * Decodes RECLAIM_STATS's reply bytes: u8 running, 7 bytes 0, then u64 nr_tried,
 * sz_tried, nr_applied, sz_applied, qt_exceeds, MemTotal, MemFree, SwapTotal, SwapFree
 * (big-endian; bytes appended later are ignored).
 * @throws Error when fewer than 80 bytes came.
 */
export function decodeReclaimStats(b: Buffer): GuestReclaimStats {
  if (b.length < 80) throw new Error(`RECLAIM_STATS reply of ${b.length} bytes; 80 expected`);
  const u = (i: number) => Number(b.readBigUInt64BE(8 + 8 * i));
  return {
    running: b[0] === 1,
    nrTried: u(0), bytesTried: u(1), nrApplied: u(2), bytesApplied: u(3), quotaExceeds: u(4),
    memTotalBytes: u(5), memFreeBytes: u(6), swapTotalBytes: u(7), swapFreeBytes: u(8),
  };
}

/** The virtio-blk serial of the swap disk (what /init looks for). */
export const SWAP_SERIAL = 'swap';

/**
 * Guest kernel arguments for the guest's swap, read by /init (initramfs.ts): `dsec.swap=<serial>`
 * when a swap disk is attached, `dsec.zram=<bytes>` for a zram device.
 */
export function swapCmdline(o: { swapDisk: boolean; zramBytes: number }): string[] {
  const a: string[] = [];
  if (o.swapDisk) a.push(`dsec.swap=${SWAP_SERIAL}`);
  if (o.zramBytes > 0) a.push(`dsec.zram=${o.zramBytes}`);
  return a;
}

/** The swap device's size for a guest of `guestBytes` RAM: `swap_bytes`, or the RAM size (all of it could be cold). */
export function swapSizeBytes(c: GuestReclaimConfig, guestBytes: number): number {
  return c.swapBytes > 0 ? c.swapBytes : guestBytes;
}

/** The session calls the steps below need (VmuxSession). */
export interface ReclaimSession {
  opReply(op: number, arg?: Buffer, timeoutMs?: number): Promise<{ result: number; data: Buffer }>;
}

/** Guest operation numbers (vmux.ts GuestOp.RECLAIM, RECLAIM_STATS). */
const OP_RECLAIM = 7;
const OP_RECLAIM_STATS = 8;
/** How long one reclaim op may take: the agent answers without waiting on its kdamond, so a few seconds under TCG on a loaded host is plenty. */
export const RECLAIM_OP_TIMEOUT_MS = 10_000;

/**
 * What `<sandbox dir>/guest-reclaim.json` records about the running boot: whether the
 * scheme runs (and if not, why), the settings it was started with, and the stats of the
 * last refresh. Written at boot and on every stats read; read by `dsec inspect`-style
 * views and the tests.
 */
export interface GuestReclaimRecord {
  /** The guest agent started the scheme. */
  started: boolean;
  /** Why it was not started (null when it was). */
  reason: string | null;
  /** Where swapped-out pages go at this boot: the swap kind and device size in bytes (0: none). */
  swap: { kind: GuestReclaimConfig['swap']; bytes: number };
  /** The settings sent. */
  config: GuestReclaimConfig;
  /** The last stats read, or null. */
  stats: GuestReclaimStats | null;
  /** When this record was written, ms since the epoch. */
  at: number;
}

/** Why the agent refused RECLAIM, by errno (the agent's answers: native/agent/damon.c). */
export function reclaimRefusal(errno: number): string {
  switch (errno) {
    case 2: return 'the guest kernel has no DAMON sysfs interface (CONFIG_DAMON_SYSFS): boot microVMs on the 6.12 guest kernel (bash scripts/guest-kernel.sh)';
    case 16: return 'kdamonds exist in the guest that its agent did not create; it leaves them alone';
    case 95: return 'the guest kernel\'s DAMON has no paddr operations set';
    case 38: return 'the guest agent predates guest reclaim (RECLAIM unknown): restart the sandbox after upgrading dsec';
    case 22: return 'the guest kernel refused the scheme\'s parameters ([vm.reclaim])';
    case 1: return 'the guest agent is not the guest\'s init';
    default: return `the guest agent refused RECLAIM with errno ${errno}`;
  }
}

/**
 * Makes the sandbox's swap file `file` for this boot, per `c`: with `mode = "on"` and
 * `swap = "disk"`, a sparse file of {@link swapSizeBytes} (kept when it has that size:
 * /init reformats it at every boot), or the snapshot's copy `restoreFrom` (a restored
 * machine's RAM refers to what it swapped out); otherwise the file is removed. A restore
 * takes the snapshot's file whatever the settings: the machine must have the devices it
 * was captured with.
 * @returns whether the file exists now (the VM gets the disk iff it does).
 * @throws Error from the filesystem (no space, …).
 */
export async function prepareSwapFile(file: string, c: GuestReclaimConfig, guestBytes: number, restoreFrom: string | null, copy: (from: string, to: string) => Promise<unknown>): Promise<boolean> {
  if (restoreFrom !== null) {
    await rm(file, { force: true });
    if (!(await stat(restoreFrom).catch(() => null))) return false;
    await copy(restoreFrom, file);
    return true;
  }
  if (c.mode !== 'on' || c.swap !== 'disk') {
    await rm(file, { force: true });
    return false;
  }
  const want = swapSizeBytes(c, guestBytes);
  const have = await stat(file).catch(() => null);
  if (have?.isFile() && have.size === want) return true;
  const fh = await open(file, 'w', 0o600);
  try {
    await fh.truncate(want);
  } finally {
    await fh.close();
  }
  return true;
}

/** Whether `file` can be opened with O_DIRECT (QEMU's `cache.direct=on`); false on filesystems without it (tmpfs). */
export function directIoWorks(file: string): boolean {
  try {
    closeSync(openSync(file, fsConstants.O_RDWR | fsConstants.O_DIRECT));
    return true;
  } catch {
    return false;
  }
}

/** The snapshot's copy of the swap file (a machine snapshot's dir): `swap.raw`. */
export const SNAPSHOT_SWAP_FILE = 'swap.raw';

/** Copies the swap file into a snapshot dir when the VM has one (sparse-aware `copy`). */
export async function snapshotSwapFile(file: string, dir: string, copy: (from: string, to: string) => Promise<unknown>): Promise<void> {
  if (await stat(file).catch(() => null)) await copy(file, `${dir}/${SNAPSHOT_SWAP_FILE}`);
}

/**
 * Asks the guest agent to start the scheme and returns the record of it (also when the
 * agent refused: `reason` says why). Never throws for a refusal; a lost session or a
 * timeout is a record with that reason too (reclaim is best effort: the sandbox runs
 * without it).
 */
export async function startGuestReclaim(s: ReclaimSession, c: GuestReclaimConfig, swap: GuestReclaimRecord['swap']): Promise<GuestReclaimRecord> {
  const base = { swap, config: c, stats: null, at: Date.now() };
  try {
    const r = await s.opReply(OP_RECLAIM, encodeReclaimStart(c), RECLAIM_OP_TIMEOUT_MS);
    return r.result < 0 ? { ...base, started: false, reason: reclaimRefusal(-r.result) } : { ...base, started: true, reason: null };
  } catch (e) {
    return { ...base, started: false, reason: `RECLAIM did not complete: ${(e as Error).message}` };
  }
}

/**
 * The scheme's stats from the guest (as of the agent's last refresh), or null when it runs
 * none (-ENOENT) or the guest did not answer.
 */
export async function readGuestReclaimStats(s: ReclaimSession): Promise<GuestReclaimStats | null> {
  try {
    const r = await s.opReply(OP_RECLAIM_STATS, undefined, RECLAIM_OP_TIMEOUT_MS);
    return r.result < 0 ? null : decodeReclaimStats(r.data);
  } catch {
    return null;
  }
}

/** Writes the record (mode 0600, replaced whole through a temp name and a rename, so a reader never sees half of it). */
export async function writeGuestReclaimRecord(file: string, rec: GuestReclaimRecord): Promise<void> {
  const tmp = `${file}.${process.pid}.${++recordSeq}.tmp`;
  await writeFile(tmp, JSON.stringify(rec), { mode: 0o600 });
  await rename(tmp, file);
}
let recordSeq = 0;
