/**
 * Resource attacks in a container sandbox: a fork bomb and a memory bomb. Each is
 * contained by the sandbox's own cgroup limits (pids, memory), a neighbouring sandbox's
 * exec succeeds while the bomb runs and after it, and the kernel's signal (forks refused
 * at pids.max, OOM kills) reaches the sandbox's stats and events.
 *
 * Each containment is shown to depend on the limit: the same bomb with a larger limit
 * gets further (more processes, the whole allocation), so the assertions can fail.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, TestDaemon } from '../integration/harness.js';

/**
 * A fork bomb in busybox sh: every process forks two more, then stays (sleeps), so the
 * population grows until fork fails and then stays at whatever the limit allows.
 */
const FORK_BOMB = 'b() { b & b & sleep 6; }; b';

describe.skipIf(!IS_ROOT)('attack: fork bomb and memory bomb (cgroup limits)', () => {
  let d: TestDaemon;
  let neighbour: string;

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 40 });
    neighbour = (await d.client.createSandbox({ image: 'busybox' })).id;
  }, 120_000);
  afterAll(async () => {
    await d?.cleanup();
  });

  /** Waits (polling the event log) for an event of `type` about sandbox `id`, or gives up after ~15 s of sweeps. */
  async function eventOf(type: string, id: string): Promise<string | null> {
    for (let i = 0; i < 150; i++) {
      for await (const e of d.client.events({})) if (e.type === type && e.sandbox_id === id) return e.message ?? '';
      await new Promise((r) => setTimeout(r, 100));
    }
    return null;
  }

  /** Runs the fork bomb in `id` and returns the highest pids.current the host saw over ~2 s. */
  async function bombPeak(id: string): Promise<number> {
    const run = d.client.exec(id, { argv: ['sh', '-c', `(${FORK_BOMB}) >/dev/null 2>&1`], timeoutMs: 30_000 });
    let peak = 0;
    for (let i = 0; i < 40; i++) {
      peak = Math.max(peak, (await d.client.sandboxStats(id)).pids ?? 0);
      await new Promise((r) => setTimeout(r, 50));
    }
    await run;
    return peak;
  }

  it('a fork bomb stays at the pids limit, is reported, and the neighbour keeps working', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', pids: 64 });
    const peak = await bombPeak(sb.id);
    // During: the neighbour answers.
    expect((await d.client.exec(neighbour, { argv: ['echo', 'alive'] })).stdout.toString()).toBe('alive\n');
    expect(peak).toBeLessThanOrEqual(64);
    expect(peak).toBeGreaterThan(32);
    const st = await d.client.sandboxStats(sb.id);
    expect(st.pids_limit_hits).toBeGreaterThan(0);
    expect(await eventOf('sandbox.pids_limit', sb.id)).toMatch(/forks? refused at the pids limit of 64/);
    // After: the neighbour answers, and the bombed sandbox is usable again once its processes are gone.
    await d.client.stopSandbox(sb.id, { timeoutMs: 0 });
    expect((await d.client.exec(neighbour, { argv: ['echo', 'alive'] })).stdout.toString()).toBe('alive\n');
    await d.client.startSandbox(sb.id);
    expect((await d.client.exec(sb.id, { argv: ['echo', 'ok'] })).stdout.toString()).toBe('ok\n');
    await d.client.deleteSandbox(sb.id, { force: true });

    // The limit is what stopped it: with pids 256 the same bomb gets well past 64.
    const big = await d.client.createSandbox({ image: 'busybox', pids: 256 });
    expect(await bombPeak(big.id)).toBeGreaterThan(64);
    await d.client.deleteSandbox(big.id, { force: true });
  });

  it('a memory bomb is OOM-killed inside its own cgroup, is reported, and the neighbour keeps working', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', memory_bytes: 64 * 1024 * 1024 });
    // `tail -c N` keeps the last N bytes of its input in memory: 200 MB of anonymous memory.
    const bomb = 'head -c 200000000 /dev/zero | tail -c 199999999 >/dev/null; echo survived $?';
    const r = await d.client.exec(sb.id, { argv: ['sh', '-c', bomb] });
    expect(r.stdout.toString()).not.toMatch(/survived 0/);
    expect((await d.client.exec(neighbour, { argv: ['echo', 'alive'] })).stdout.toString()).toBe('alive\n');
    const st = await d.client.sandboxStats(sb.id);
    expect(st.oom_kills).toBeGreaterThan(0);
    expect(await eventOf('sandbox.oom', sb.id)).toMatch(/OOM killer killed \d+ process(es)? at the memory limit of 67108864 bytes/);
    expect((await d.client.exec(sb.id, { argv: ['echo', 'ok'] })).stdout.toString()).toBe('ok\n');
    await d.client.deleteSandbox(sb.id, { force: true });

    // The limit is what stopped it: with 512 MiB the same command completes.
    const big = await d.client.createSandbox({ image: 'busybox', memory_bytes: 512 * 1024 * 1024 });
    expect((await d.client.exec(big.id, { argv: ['sh', '-c', bomb] })).stdout.toString()).toBe('survived 0\n');
    expect((await d.client.sandboxStats(big.id)).oom_kills).toBe(0);
    await d.client.deleteSandbox(big.id, { force: true });
  });
});
