/** TTL expiry is enforced from the store: on time while running, and after a restart for sandboxes that expired while dsecd was down. */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, TestDaemon } from './harness.js';

async function waitGone(d: TestDaemon, id: string): Promise<void> {
  for (let i = 0; i < 300; i++) {
    if (!(await d.client.listSandboxes()).some((s) => s.id === id)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`sandbox ${id} still exists 30 s after its TTL`);
}

describe.skipIf(!IS_ROOT)('ttl', () => {
  let d: TestDaemon;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 8 });
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('destroys a sandbox once its TTL passes and records why', async () => {
    const keep = await d.client.createSandbox({ image: 'busybox' });
    const sb = await d.client.createSandbox({ image: 'busybox', ttl_s: 1 });
    expect(sb.ttl_s).toBe(1);
    await waitGone(d, sb.id);
    const evs = [];
    for await (const e of d.client.events()) if (e.sandbox_id === sb.id) evs.push(e);
    expect(evs.at(-1)).toMatchObject({ type: 'sandbox.destroyed', message: 'ttl expired' });
    expect((await d.client.getSandbox(keep.id)).state).toBe('running');
    const t = await d.traces();
    expect(t.rows).toEqual([keep.id]);
    expect(t.cgroups).toEqual([keep.id]);
    await d.client.deleteSandbox(keep.id, { force: true });
  });

  it('an expiry that passed while dsecd was down fires once after restart', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', ttl_s: 1 });
    await d.kill9();
    await new Promise((r) => setTimeout(r, 1500));
    await d.launch();
    await waitGone(d, sb.id);
    const destroyed = [];
    for await (const e of d.client.events()) if (e.sandbox_id === sb.id && e.type === 'sandbox.destroyed') destroyed.push(e);
    expect(destroyed.length).toBe(1);
    expect(await d.traces()).toMatchObject({ mounts: [], cgroups: [], runtime: [], dirs: [], rows: [], uidRanges: 0 });
  });
});
