/**
 * Guest reclaim of the microvm tier, the pure parts and the guest agent on the host:
 * `[vm.reclaim]` settings, the RECLAIM/RECLAIM_STATS wire format
 * (daemon/drivers/microvm/reclaim.ts), the swap disk on QEMU's command line and in /init,
 * the idle-reclaim fallback's schedule (daemon/host/memory/idle-reclaim.ts), and the
 * agent's damon.c run as `dsec-agent --vmux-fd 3` against a directory tree shaped like a
 * 6.12 guest's DAMON sysfs (DSEC_AGENT_DAMON_ROOT).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import { loadConfig } from '../../daemon/config.js';
import {
  RECLAIM_ARG_BYTES, decodeReclaimStats, encodeReclaimStart, encodeReclaimStop, resolveGuestReclaim, startGuestReclaim, readGuestReclaimStats,
} from '../../daemon/drivers/microvm/reclaim.js';
import { guestCmdline, qemuArgs } from '../../daemon/drivers/microvm/qemu.js';
import { initScript } from '../../daemon/drivers/vmm/initramfs.js';
import { GuestOp, VmuxSession } from '../../daemon/drivers/vmm/vmux.js';
import { IdleReclaimer } from '../../daemon/host/memory/idle-reclaim.js';
import { notFound } from '../../daemon/errors.js';
import { AGENT, buildAgent } from '../fixtures/agent.js';
import { buildDamonTree } from '../fixtures/damon-sysfs.js';

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'dsec-reclaim-unit-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

describe('[vm.reclaim] settings and the RECLAIM wire format', () => {
  it('defaults: off, 60 s, 100 ms / 2 s, 10 ms/s, 64 MiB/s, no watermarks, swap on a disk of the guest\'s size', () => {
    expect(resolveGuestReclaim(undefined)).toEqual({
      mode: 'off', minAgeMs: 60_000, sampleUs: 100_000, aggrUs: 2_000_000, cpuMsPerS: 10, bytesPerS: 64 * 2 ** 20,
      watermarks: { high: 0, mid: 0, low: 0 }, swap: 'disk', swapBytes: 0,
    });
  });

  it('dsecd.toml [vm.reclaim] is parsed and checked', () => {
    const f = path.join(tmp, 'dsecd.toml');
    fs.writeFileSync(f, '[vm.reclaim]\nmode = "on"\nmin_age_s = 5\nsample_ms = 20\naggr_ms = 500\nswap = "zram"\nfree_high_permil = 500\nfree_mid_permil = 400\nfree_low_permil = 50\n');
    const c = loadConfig({ root: tmp, config: f, env: {} });
    expect(c.vm.reclaim).toMatchObject({ mode: 'on', minAgeMs: 5000, sampleUs: 20_000, aggrUs: 500_000, swap: 'zram', watermarks: { high: 500, mid: 400, low: 50 } });
    fs.writeFileSync(f, '[vm.reclaim]\nsample_ms = 600\naggr_ms = 500\n');
    expect(() => loadConfig({ root: tmp, config: f, env: {} })).toThrow(/sample_ms must not exceed aggr_ms/);
    fs.writeFileSync(f, '[vm.reclaim]\nfree_high_permil = 100\nfree_mid_permil = 400\n');
    expect(() => loadConfig({ root: tmp, config: f, env: {} })).toThrow(/free_high_permil >= free_mid_permil/);
    fs.writeFileSync(f, '[vm.reclaim]\nmode = "aggressive"\n');
    expect(() => loadConfig({ root: tmp, config: f, env: {} })).toThrow();
  });

  it('encodes the start argument (44 bytes, big-endian) and the stop; decodes the stats reply', () => {
    const c = { ...resolveGuestReclaim({ mode: 'on', min_age_s: 5, sample_ms: 20, aggr_ms: 500, cpu_ms_per_s: 30, bytes_per_s: 1 << 20 }), watermarks: { high: 500, mid: 400, low: 50 } };
    const b = encodeReclaimStart(c);
    expect(b.length).toBe(RECLAIM_ARG_BYTES);
    expect(b[0]).toBe(1);
    expect([b.readUInt32BE(4), b.readUInt32BE(8), b.readUInt32BE(12), b.readUInt32BE(16), b.readUInt32BE(20)]).toEqual([5000, 20_000, 500_000, 30, 1000]);
    expect(b.readBigUInt64BE(24)).toBe(1n << 20n);
    expect([b.readUInt16BE(32), b.readUInt16BE(34), b.readUInt16BE(36), b.readUInt32BE(40)]).toEqual([500, 400, 50, 1000]);
    expect(encodeReclaimStop()).toEqual(Buffer.from([0]));
    const r = Buffer.alloc(88);
    r[0] = 1;
    [1, 2, 3, 4, 5, 6, 7, 8, 9].forEach((v, i) => r.writeBigUInt64BE(BigInt(v), 8 + 8 * i));
    expect(decodeReclaimStats(r)).toEqual({
      running: true, nrTried: 1, bytesTried: 2, nrApplied: 3, bytesApplied: 4, quotaExceeds: 5, memTotalBytes: 6, memFreeBytes: 7, swapTotalBytes: 8, swapFreeBytes: 9,
    });
    expect(() => decodeReclaimStats(Buffer.alloc(79))).toThrow(/80 expected/);
  });

  it('a refusal is a record with the reason, never a failed boot', async () => {
    const c = resolveGuestReclaim({ mode: 'on' });
    const swap = { kind: 'disk' as const, bytes: 1 };
    expect(await startGuestReclaim({ opReply: async () => ({ result: -2, data: Buffer.alloc(0) }) }, c, swap))
      .toMatchObject({ started: false, reason: expect.stringMatching(/no DAMON sysfs interface.*6\.12 guest kernel/) });
    expect(await startGuestReclaim({ opReply: async () => ({ result: -38, data: Buffer.alloc(0) }) }, c, swap))
      .toMatchObject({ started: false, reason: expect.stringMatching(/predates guest reclaim/) });
    expect(await startGuestReclaim({ opReply: async () => { throw new Error('session closed'); } }, c, swap))
      .toMatchObject({ started: false, reason: 'RECLAIM did not complete: session closed' });
    expect(await startGuestReclaim({ opReply: async () => ({ result: 0, data: Buffer.alloc(0) }) }, c, swap)).toMatchObject({ started: true, reason: null });
    expect(await readGuestReclaimStats({ opReply: async () => ({ result: -2, data: Buffer.alloc(0) }) })).toBeNull();
  });
});

describe('the swap disk on the QEMU command line and in /init', () => {
  const spec = {
    id: 'abc', dir: '/r/sandboxes/abc', kernel: '/k/vmlinuz', initrd: '/r/vm/i.cpio', accel: 'tcg' as const, vcpus: 1, memoryMiB: 256,
    layers: [], tscKhz: null, tcgTbMiB: 128,
  };
  it('a swap disk: virtio-blk serial swap, O_DIRECT where it works, discards; dsec.swap=swap for /init; zram: dsec.zram=<bytes>', () => {
    const a = qemuArgs({ ...spec, swapDisk: { file: '/r/sandboxes/abc/swap.raw', direct: true } });
    const after = (flag: string) => a.filter((_, i) => a[i - 1] === flag);
    expect(after('-drive')).toContain('id=swap,file=/r/sandboxes/abc/swap.raw,format=raw,if=none,discard=unmap,cache.direct=on');
    expect(after('-device')).toContain('virtio-blk-device,drive=swap,serial=swap');
    expect(after('-append')[0]).toContain('dsec.swap=swap');
    expect(qemuArgs({ ...spec, swapDisk: { file: '/s', direct: false } }).join(' ')).not.toContain('cache.direct');
    const plain = qemuArgs(spec).join(' ');
    expect(plain).not.toMatch(/swap/);
    expect(guestCmdline({ ...spec, zramBytes: 1024 })).toContain('dsec.zram=1024');
  });
  it('/init formats the swap disk at every boot and swaps on it with discards; a failure is reported, not fatal', () => {
    const s = initScript(['virtio_mmio']);
    expect(s).toContain('dsec.swap=*) swap="${a#dsec.swap=}" ;;');
    expect(s).toContain('if mkswap "$dev" >/dev/null && swapon -d "$dev"; then');
    expect(s).toContain('dsec-init: swap on $dev failed; the guest runs without it');
    expect(s).toMatch(/echo "\$zram" > \/sys\/block\/zram0\/disksize && mkswap \/dev\/zram0 >\/dev\/null && swapon \/dev\/zram0/);
  });
});

describe('idle reclaim through memory cgroups (the fallback)', () => {
  function fake(version: 1 | 2) {
    const calls: Array<{ id: string; bytes: number | undefined }> = [];
    return {
      calls,
      cg: {
        version,
        stats: async (id: string) => {
          if (id === 'gone') throw notFound('cgroup of sandbox gone not found');
          return { memoryBytes: 100 * 2 ** 20 } as never;
        },
        reclaim: async (id: string, bytes?: number) => {
          calls.push({ id, bytes });
          return { beforeBytes: 100, afterBytes: 40 };
        },
      },
    };
  }

  it('reclaims a sandbox idle past the threshold once per idle period, again after repeatMs; not active ones; v2 asks a share of usage, v1 force_empty', async () => {
    let now = 1_000_000;
    const v2 = fake(2);
    const r = new IdleReclaimer(v2.cg, { idleAfterMs: 60_000, repeatMs: 300_000, fraction: 0.25 }, () => now);
    const cands = [{ id: 'a', idleSinceMs: now - 61_000 }, { id: 'b', idleSinceMs: now - 10_000 }, { id: 'c', idleSinceMs: null }, { id: 'gone', idleSinceMs: 0 }];
    expect(await r.sweep(cands)).toEqual([{ id: 'a', beforeBytes: 100, afterBytes: 40 }]);
    expect(v2.calls).toEqual([{ id: 'a', bytes: 25 * 2 ** 20 }]);
    now += 60_000; // b is now idle long enough; a was done for this idle period
    await r.sweep(cands);
    expect(v2.calls.map((c) => c.id)).toEqual(['a', 'b']);
    now += 300_000; // repeat
    await r.sweep(cands);
    expect(v2.calls.map((c) => c.id)).toEqual(['a', 'b', 'a', 'b']);
    // a was active in between: a new idle period starts the count again.
    await r.sweep([{ id: 'a', idleSinceMs: now - 1000 }]);
    expect(v2.calls.length).toBe(4);
    const v1 = fake(1);
    await new IdleReclaimer(v1.cg, { idleAfterMs: 0, repeatMs: 0, fraction: 1 }, () => now).sweep([{ id: 'x', idleSinceMs: now }]);
    expect(v1.calls).toEqual([{ id: 'x', bytes: undefined }]);
    expect(() => new IdleReclaimer(v1.cg, { idleAfterMs: 0, repeatMs: 0, fraction: 0 })).toThrow(RangeError);
  });
});

describe('the guest agent\'s DAMON ops (damon.c) on a tree shaped like a 6.12 guest\'s sysfs', () => {
  const agents: ChildProcess[] = [];
  beforeAll(() => buildAgent());
  afterAll(async () => {
    for (const a of agents) a.kill('SIGTERM');
  });

  /** The agent on a socketpair, its DAMON root at `root`, and a mux session to it. */
  async function guest(root: string): Promise<{ s: VmuxSession; log: () => string }> {
    const logFile = path.join(root, 'agent.log');
    const log = fs.openSync(logFile, 'a');
    const child = spawn(AGENT, ['--vmux-fd', '3'], { stdio: ['ignore', log, log, 'pipe'], env: { ...process.env, DSEC_AGENT_DAMON_ROOT: root } });
    fs.closeSync(log);
    agents.push(child);
    const s = await VmuxSession.start(child.stdio[3] as Duplex, { timeoutMs: 10_000, what: 'test guest' });
    return { s, log: () => fs.readFileSync(logFile, 'utf8') };
  }

  const IOMEM = '00000000-00000fff : Reserved\n00001000-0009fbff : System RAM\n00100000-0bffffff : System RAM\n  01000000-01ffffff : Kernel code\n0c000000-0c3fffff : Persistent Memory (legacy)\n0c400000-0cffffff : System RAM\n';
  const MEMINFO = 'MemTotal:         262144 kB\nMemFree:          100000 kB\nSwapTotal:        262140 kB\nSwapFree:         200000 kB\n';

  it('RECLAIM writes the scheme into the kdamond it creates, RECLAIM_STATS reports stats and meminfo, stop turns it off', async () => {
    const root = fs.mkdtempSync(path.join(tmp, 'g-'));
    // The shape the agent's nr_* writes will find (a plain directory cannot grow them), nr_kdamonds still 0.
    const damon = buildDamonTree(root, { layout: '6.12', kdamonds: [{ state: 'off', operations: 'vaddr', regions: 2, schemes: 1 }], iomem: IOMEM, meminfo: MEMINFO });
    const admin = path.join(damon, 'admin');
    fs.writeFileSync(path.join(admin, 'kdamonds', 'nr_kdamonds'), '0\n');
    const { s, log } = await guest(root);
    const rd = (rel: string) => fs.readFileSync(path.join(admin, 'kdamonds', rel), 'utf8').trim();
    // No scheme yet: stats say so.
    expect((await s.opReply(GuestOp.RECLAIM_STATS)).result).toBe(-2);
    const c = { ...resolveGuestReclaim({ mode: 'on', min_age_s: 5, sample_ms: 20, aggr_ms: 500, cpu_ms_per_s: 30, bytes_per_s: 1 << 20 }), watermarks: { high: 500, mid: 400, low: 50 } };
    const r = await s.opReply(GuestOp.RECLAIM, encodeReclaimStart(c));
    expect(r.result, log()).toBe(0);
    expect(fs.readFileSync(path.join(admin, 'kdamonds', 'nr_kdamonds'), 'utf8').trim()).toBe('1');
    const C = '0/contexts/0';
    expect(rd(`${C}/operations`)).toBe('paddr');
    expect([rd(`${C}/monitoring_attrs/intervals/sample_us`), rd(`${C}/monitoring_attrs/intervals/aggr_us`)]).toEqual(['20000', '500000']);
    // The guest's System RAM ranges of at least 4 MiB (not the low 640 KiB, not the pmem range), end exclusive.
    expect(rd(`${C}/targets/0/regions/nr_regions`)).toBe('2');
    expect([rd(`${C}/targets/0/regions/0/start`), rd(`${C}/targets/0/regions/0/end`)]).toEqual([String(0x100000), String(0xc000000)]);
    expect([rd(`${C}/targets/0/regions/1/start`), rd(`${C}/targets/0/regions/1/end`)]).toEqual([String(0xc400000), String(0xd000000)]);
    const S = `${C}/schemes/0`;
    expect(rd(`${S}/action`)).toBe('pageout');
    expect([rd(`${S}/access_pattern/nr_accesses/min`), rd(`${S}/access_pattern/nr_accesses/max`)]).toEqual(['0', '0']);
    expect(rd(`${S}/access_pattern/age/min`)).toBe('10'); // 5 s in 500 ms aggregation intervals
    expect([rd(`${S}/quotas/ms`), rd(`${S}/quotas/bytes`), rd(`${S}/quotas/reset_interval_ms`)]).toEqual(['30', String(1 << 20), '1000']);
    expect([rd(`${S}/watermarks/metric`), rd(`${S}/watermarks/high`), rd(`${S}/watermarks/mid`), rd(`${S}/watermarks/low`), rd(`${S}/watermarks/interval_us`)])
      .toEqual(['free_mem_rate', '500', '400', '50', '1000000']);
    expect(rd('0/state')).toBe('on');
    expect(log()).toMatch(/damon: pageout of regions idle for 5000 ms \(age 10 x 500000 us\) on 2 RAM range\(s\)/);
    // Stats: the stats files as they are, and the guest's memory.
    fs.writeFileSync(path.join(admin, 'kdamonds', S, 'stats', 'sz_applied'), '12345\n');
    fs.writeFileSync(path.join(admin, 'kdamonds', S, 'stats', 'nr_applied'), '3\n');
    const st = await s.opReply(GuestOp.RECLAIM_STATS);
    expect(st.result).toBe(0);
    expect(decodeReclaimStats(st.data)).toMatchObject({ running: true, nrApplied: 3, bytesApplied: 12345, memTotalBytes: 262144 * 1024, swapTotalBytes: 262140 * 1024, swapFreeBytes: 200000 * 1024 });
    // The stats refresh runs off the agent's loop (a thread writing update_schemes_stats).
    await expect.poll(() => rd('0/state')).toBe('update_schemes_stats');
    fs.writeFileSync(path.join(admin, 'kdamonds', '0', 'state'), 'on\n');
    // Stop.
    expect((await s.opReply(GuestOp.RECLAIM, encodeReclaimStop())).result).toBe(0);
    expect(rd('0/state')).toBe('off');
    // Bad arguments.
    expect((await s.opReply(GuestOp.RECLAIM, Buffer.alloc(10, 1))).result).toBe(-22);
    const badWm = encodeReclaimStart({ ...c, watermarks: { high: 100, mid: 400, low: 50 } });
    expect((await s.opReply(GuestOp.RECLAIM, badWm)).result).toBe(-22);
  });

  it('refuses (EBUSY) and writes nothing when kdamonds exist that it did not create; ENOENT without DAMON', async () => {
    const root = fs.mkdtempSync(path.join(tmp, 'g-'));
    const damon = buildDamonTree(root, { layout: '6.12', kdamonds: [{ state: 'on', operations: 'vaddr' }], iomem: IOMEM, meminfo: MEMINFO });
    const before = fs.readFileSync(path.join(damon, 'admin', 'kdamonds', '0', 'contexts', '0', 'operations'), 'utf8');
    const { s, log } = await guest(root);
    expect((await s.opReply(GuestOp.RECLAIM, encodeReclaimStart(resolveGuestReclaim({ mode: 'on' })))).result).toBe(-16);
    expect(fs.readFileSync(path.join(damon, 'admin', 'kdamonds', 'nr_kdamonds'), 'utf8').trim()).toBe('1');
    expect(fs.readFileSync(path.join(damon, 'admin', 'kdamonds', '0', 'contexts', '0', 'operations'), 'utf8')).toBe(before);
    expect(log()).toMatch(/kdamonds exist that the agent did not create/);
    const none = fs.mkdtempSync(path.join(tmp, 'g-'));
    const g2 = await guest(none);
    expect((await g2.s.opReply(GuestOp.RECLAIM, encodeReclaimStart(resolveGuestReclaim({ mode: 'on' })))).result).toBe(-2);
  });
});
