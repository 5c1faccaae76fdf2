/** WarmPools (daemon/sandbox/warm-pool.ts) against a fake host: fill, claim, low-priority refill, stale keys, close. */
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { QUIET_MS, shellKey, WarmPools, type ShellHost, type WarmPoolEntry } from '../../daemon/sandbox/warm-pool.js';
import { loadConfig } from '../../daemon/config.js';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { SandboxRecord } from '../../daemon/model/sandbox.js';

/** A host whose shells are plain objects; `busy` stands for user creates in flight. */
function fakeHost() {
  const h = {
    key: 'k1',
    busy: 0,
    made: [] as string[],
    destroyed: [] as string[],
    concurrent: 0,
    maxConcurrent: 0,
    fail: false,
    /** performance.now() of the last user create (start or end); -Infinity: none. */
    lastCreate: -Infinity,
    /** A burst is under way: a user create has just started or ended, whenever the pool asks. */
    inBurst: false,
  };
  let n = 0;
  const host: ShellHost = {
    keyOf: async () => ({ key: h.key, image: 'busybox:latest' }),
    createShell: async (_e: WarmPoolEntry, key: string) => {
      h.concurrent += 1;
      h.maxConcurrent = Math.max(h.maxConcurrent, h.concurrent);
      await new Promise((r) => setTimeout(r, 5));
      h.concurrent -= 1;
      if (h.fail) throw new Error('runtime failed');
      const id = `s${n++}-${key}`;
      h.made.push(id);
      return { id } as SandboxRecord;
    },
    destroyShell: async (id) => {
      h.destroyed.push(id);
    },
    userCreatesInFlight: () => h.busy,
    msSinceUserCreate: () => (h.inBurst ? 0 : performance.now() - h.lastCreate),
  };
  return { h, host };
}

const log = pino({ level: 'silent' });
const until = async (f: () => boolean) => {
  while (!f()) await new Promise((r) => setTimeout(r, 5));
};

describe('WarmPools', () => {
  it('fills to size at the fill concurrency, hands out shells by key, refills', async () => {
    const { h, host } = fakeHost();
    const p = new WarmPools(host, { entries: [{ image: 'busybox', size: 5, network: 'none' }], fillConcurrency: 2 }, log);
    p.start();
    await until(() => p.stats()[0].ready === 5);
    expect(h.maxConcurrent).toBe(2);
    expect(p.take('other', 'alpine:latest', 'none')).toBeNull();
    expect(p.stats()[0].misses).toBe(0);
    expect(p.take('other', 'busybox:latest', 'none')).toBeNull();
    expect(p.stats()[0].misses).toBe(1);
    const s = p.take('k1', 'busybox:latest', 'none');
    expect(s?.id).toBe(h.made[0]);
    expect(p.stats()[0]).toMatchObject({ ready: 4, claimed: 1 });
    await until(() => p.stats()[0].ready === 5);
    expect(h.made.length).toBe(6);
    await p.close();
    expect(h.destroyed.sort()).toEqual(h.made.slice(1).sort());
  });

  it('refills only while no user create is in flight', async () => {
    const { h, host } = fakeHost();
    h.busy = 1;
    const p = new WarmPools(host, { entries: [{ image: 'busybox', size: 2, network: 'none' }], fillConcurrency: 2 }, log);
    p.start();
    await new Promise((r) => setTimeout(r, 100));
    expect(h.made).toEqual([]);
    h.busy = 0;
    await until(() => p.stats()[0].ready === 2);
    await p.close();
  });

  it('waits for a quiet moment after the last user create before refilling', async () => {
    const { h, host } = fakeHost();
    const p = new WarmPools(host, { entries: [{ image: 'busybox', size: 2, network: 'none' }], fillConcurrency: 2 }, log);
    // A burst of 200 ms in which creates keep ending with none in flight in between. It is
    // modelled as "a create just ended" whenever the pool asks, not with a timer: a loaded
    // host can delay a 10 ms timer past QUIET_MS and so fake a quiet moment.
    h.inBurst = true;
    p.start();
    await new Promise((r) => setTimeout(r, 200));
    expect(h.made).toEqual([]);
    h.lastCreate = performance.now();
    h.inBurst = false;
    const ended = h.lastCreate;
    await until(() => p.stats()[0].ready === 2);
    expect(performance.now() - ended).toBeGreaterThanOrEqual(QUIET_MS - 1);
    await p.close();
  });

  it('replaces shells whose key changed (retag, seccomp reload), and backs off after failures', async () => {
    const { h, host } = fakeHost();
    const p = new WarmPools(host, { entries: [{ image: 'busybox', size: 1, network: 'none' }], fillConcurrency: 1 }, log);
    p.start();
    await until(() => p.stats()[0].ready === 1);
    const first = h.made[0];
    h.key = 'k2';
    // A claim under the new key misses; the pool resolves its key again and retires the old shell.
    h.fail = true;
    expect(p.take('k2', 'busybox:latest', 'none')).toBeNull();
    await until(() => h.destroyed.includes(first));
    await until(() => p.stats()[0].fill_errors > 0);
    expect(p.stats()[0].ready).toBe(0);
    h.fail = false;
    await until(() => p.stats()[0].ready === 1);
    expect(p.take('k2', 'busybox:latest', 'none')?.id).toMatch(/-k2$/);
    await p.close();
  }, 20_000);

  it('shellKey changes with each part of the key', () => {
    const base = { image: 'busybox:latest', layers: ['sha256:a'], config: { env: [], cwd: '/', user: '0', cmd: ['sh'] }, seccompSha: 'x', filesystem: { landlock: true }, network: 'none' as const, diskBytes: null };
    const k = shellKey(base);
    expect(shellKey({ ...base })).toBe(k);
    for (const v of [{ image: 'b:1' }, { layers: ['sha256:b'] }, { config: { env: [], cwd: '/', user: '1000', cmd: ['sh'] } }, { seccompSha: 'y' }, { filesystem: { landlock: false } }, { network: 'allow' as const }, { diskBytes: 1 }]) {
      expect(shellKey({ ...base, ...v })).not.toBe(k);
    }
  });

  it('[pool] config: off by default; entries parsed with network none by default', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'dsec-pool-cfg-'));
    try {
      const f = path.join(dir, 'c.toml');
      writeFileSync(f, '');
      expect(loadConfig({ config: f, root: dir, env: {} }).pool).toEqual({ entries: [], fillConcurrency: 2 });
      writeFileSync(f, '[pool]\nfill_concurrency = 3\n[[pool.entries]]\nimage = "busybox"\nsize = 8\n[[pool.entries]]\nimage = "judge:bookworm"\nsize = 2\nnetwork = "allow"\n');
      expect(loadConfig({ config: f, root: dir, env: {} }).pool).toEqual({
        fillConcurrency: 3, entries: [{ image: 'busybox', size: 8, network: 'none' }, { image: 'judge:bookworm', size: 2, network: 'allow' }],
      });
      writeFileSync(f, '[pool]\n[[pool.entries]]\nimage = "busybox"\nsize = 5000\n');
      expect(() => loadConfig({ config: f, root: dir, env: {} })).toThrow(/size/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
