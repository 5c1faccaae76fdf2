/** 250 container sandboxes live at once on this host, each answering exec. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, TestDaemon } from './harness.js';

const N = 250;
/** Creations in flight at once: enough to overlap runtime work on 2 cores. */
const CONCURRENCY = 8;

async function pool<T>(n: number, c: number, fn: (i: number) => Promise<T>): Promise<T[]> {
  const out: T[] = new Array(n);
  let next = 0;
  await Promise.all(Array.from({ length: c }, async () => {
    while (next < n) {
      const i = next++;
      out[i] = await fn(i);
    }
  }));
  return out;
}

describe.skipIf(!IS_ROOT)('density', () => {
  let d: TestDaemon;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 3, config: '[defaults]\nmemory_bytes = 67108864\npids = 64\n# 256 MiB quotas: their sum stays within [admission] disk_overcommit (100) of any store over 10 GiB\ndisk_bytes = 268435456\n' });
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it(`${N} sandboxes live at once, each exec-able, all cleaned on destroy`, async () => {
    const sbs = await pool(N, CONCURRENCY, (i) => d.client.createSandbox({ image: 'busybox', labels: { n: String(i) } }));
    expect(new Set(sbs.map((s) => s.uid_base)).size).toBe(N);
    const live = await d.client.listSandboxes({ state: 'running' });
    expect(live.length).toBe(N);
    const outs = await pool(N, CONCURRENCY, (i) => d.client.exec(sbs[i].id, { argv: ['sh', '-c', 'hostname; cat /proc/1/comm'] }).then((r) => r.stdout.toString()));
    outs.forEach((o, i) => expect(o).toContain(sbs[i].id));
    // One shared EROFS mount for all of them.
    expect(d.layerMounts().length).toBe(1);
    await pool(N, CONCURRENCY, (i) => d.client.deleteSandbox(sbs[i].id, { force: true }));
    const t = await d.traces();
    expect(t).toMatchObject({ mounts: [], cgroups: [], runtime: [], dirs: [], rows: [], uidRanges: 0 });
    expect(d.layerMounts().length).toBe(0);
  });
});
