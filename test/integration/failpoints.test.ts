/**
 * Restart safety: for every failpoint, dsecd SIGKILLs itself at that step; after a
 * restart every acknowledged sandbox still runs with its init pid and answers exec,
 * and the interrupted operation is either complete or fully undone, with nothing
 * left in mountinfo, any cgroup hierarchy, runtime state, sandbox dirs, the
 * writable-layer store (btrfs subvolumes), loop devices or the SQLite store.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FAILPOINTS } from '../../daemon/sandbox/failpoints.js';
import { IS_ROOT, TestDaemon, loopDevicesReleased } from './harness.js';

describe.skipIf(!IS_ROOT)('SIGKILL at every failpoint, then restart', () => {
  let d: TestDaemon;
  let keeper: { id: string; init_pid: number | null };
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 7 });
    keeper = await d.client.createSandbox({ image: 'busybox', labels: { role: 'keeper' } });
    // /root: the top level is read-only (docs/SECURITY.md "Filesystem").
    await d.client.exec(keeper.id, { argv: ['sh', '-c', 'echo kept > /root/kept'] });
  });
  afterAll(async () => {
    await d?.cleanup();
    // The store's loop device detaches with the (lazily) unmounted filesystem.
    if (d) expect(await loopDevicesReleased(d.root)).toEqual([]);
  });

  /** Checks the keeper survived and that host traces equal the store's rows. */
  async function assertConsistent(): Promise<string[]> {
    const k = await d.client.getSandbox(keeper.id);
    expect(k.state).toBe('running');
    expect(k.init_pid).toBe(keeper.init_pid);
    const r = await d.client.exec(keeper.id, { argv: ['cat', '/root/kept'] });
    expect(r.stdout.toString()).toBe('kept\n');
    const t = await d.traces();
    const live = (await d.client.listSandboxes()).filter((s) => s.state === 'running').map((s) => s.id).sort();
    const all = (await d.client.listSandboxes()).map((s) => s.id).sort();
    expect(t.rows).toEqual(all);
    expect(t.runtime).toEqual(live);
    expect(t.cgroups).toEqual(live);
    expect(t.dirs).toEqual(all);
    // Every sandbox's writable layer is one store entry (a btrfs subvolume here); none without a row.
    expect(t.store).toEqual(all);
    expect(t.uidRanges).toBe(all.length);
    // One overlay mount per running sandbox, none for stopped ones.
    expect(t.mounts.map((m) => m.split('/').slice(-2, -1)[0]).sort()).toEqual(live);
    // Layer blobs stay mounted only while a running sandbox uses them.
    expect(d.layerMounts().length).toBe(live.length > 0 ? 1 : 0);
    return all;
  }

  for (const fp of FAILPOINTS.filter((f) => /^(create|destroy|stop|start)\./.test(f))) {
    it(`${fp}`, async () => {
      // A victim for destroy/stop/start failpoints.
      const victim = fp.startsWith('create.') ? null : await d.client.createSandbox({ image: 'busybox', labels: { role: 'victim' } });
      if (victim && fp.startsWith('start.')) await d.client.stopSandbox(victim.id);
      await d.restart({ DSEC_FAILPOINT: fp });
      const op = fp.startsWith('create.') ? d.client.createSandbox({ image: 'busybox', labels: { role: 'new' } })
        : fp.startsWith('destroy.') ? d.client.deleteSandbox(victim!.id, { force: true })
          : fp.startsWith('stop.') ? d.client.stopSandbox(victim!.id)
            : d.client.startSandbox(victim!.id);
      await expect(op).rejects.toBeDefined();
      const exit = await d.waitExit();
      expect(exit.signal).toBe('SIGKILL');
      await d.launch();
      const all = await assertConsistent();
      const others = all.filter((id) => id !== keeper.id);
      if (fp.startsWith('create.')) {
        // Acknowledged in the store (create.after-ack) -> kept and working; otherwise gone.
        if (fp === 'create.after-ack') {
          expect(others.length).toBe(1);
          const r = await d.client.exec(others[0], { argv: ['echo', 'hi'] });
          expect(r.stdout.toString()).toBe('hi\n');
        } else {
          expect(others).toEqual([]);
        }
      } else if (fp.startsWith('destroy.')) {
        expect(others).toEqual([]);
      } else if (fp.startsWith('stop.')) {
        expect((await d.client.getSandbox(victim!.id)).state).toBe('stopped');
      } else {
        // An unacknowledged start is rolled back to stopped; it can be started again.
        expect((await d.client.getSandbox(victim!.id)).state).toBe('stopped');
        const s = await d.client.startSandbox(victim!.id);
        expect(s.state).toBe('running');
      }
      for (const id of others) await d.client.deleteSandbox(id, { force: true });
      await assertConsistent();
    });
  }
});
