/**
 * Symlinks a sandbox plants where its writable paths are (issue 8 review; docs/SECURITY.md
 * "Filesystem", "Symlinked writable paths"), as root of the sandbox on a real dsecd:
 *
 *   - a writable path replaced by a symlink to /etc (absolute), to /usr/bin (relative,
 *     `../usr/bin`), to `/`, or to `/nope/../etc` (a missing directory, then `..`), then the sandbox's mounts set up again: after stop/start,
 *     after a restore from a snapshot taken with the link, after a fork of it. dsecd
 *     resolves the path inside the rootfs and refuses it (FailedPrecondition, reason
 *     `writable_path_refused`, event `sandbox.writable_path_refused`): the restarted
 *     sandbox stays failed, a refused restore or fork leaves no sandbox, and nothing of
 *     /etc, /usr/bin or / becomes writable. Without the check each of these starts and the
 *     write the probe makes succeeds (the probe runs whenever a start is not refused, so
 *     the failure shows what got through);
 *   - the way out: the same snapshot restored without that writable path runs, and writes
 *     through the planted symlink still hit the read-only /etc or /usr/bin;
 *   - a symlink that stays inside the writable area (/root/cache -> /tmp/cache) is
 *     followed as before.
 *
 * A neighbouring sandbox runs an exec during every attack and after it.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IS_ROOT, TestDaemon, err, out } from '../integration/harness.js';
import { isDsecApiError, type Event, type Sandbox } from '../../sdk/index.js';

/** What a start, restore or fork did: refused with this error, or started and let the probe write (its output per sandbox). */
type Outcome = { refused: { code: string; reason?: string; message: string } } | { started: Array<{ exit: number; out: string; err: string }> };

describe.skipIf(!IS_ROOT)('symlinked writable paths', () => {
  let d: TestDaemon;
  let neighbour: string;

  const sh = (id: string, script: string) => d.client.exec(id, { argv: ['sh', '-c', script] });
  /** Runs `attack` while the neighbour execs, then checks the neighbour once more. */
  const withNeighbour = async <T>(attack: () => Promise<T>): Promise<T> => {
    const [r, during] = await Promise.all([attack(), sh(neighbour, 'echo alive; cat /root/own')]);
    expect(out(during)).toBe('alive\nneighbour data\n');
    expect(out(await sh(neighbour, 'echo alive'))).toBe('alive\n');
    return r;
  };
  /**
   * Runs `op` (a start, restore or fork); when it is not refused, runs `probe` in every
   * sandbox it started (then destroys those it created), so a failed expectation shows
   * whether the write went through.
   */
  const attempt = async (op: () => Promise<Sandbox | Sandbox[]>, probe: string, created: boolean): Promise<Outcome> => {
    let made: Sandbox[];
    try {
      const r = await op();
      made = Array.isArray(r) ? r : [r];
    } catch (e) {
      if (!isDsecApiError(e)) throw e;
      return { refused: { code: e.code, reason: e.reason, message: e.message } };
    }
    const started = [];
    for (const s of made) {
      const r = await sh(s.id, probe);
      started.push({ exit: r.exit_code ?? -1, out: out(r), err: err(r) });
      if (created) await d.client.deleteSandbox(s.id, { force: true });
    }
    return { started };
  };
  /** Events of `type` recorded since `since` (ms) for `id` (any sandbox when null). */
  const eventsOf = async (type: string, since: number, id: string | null): Promise<Event[]> => {
    const all: Event[] = [];
    for await (const e of d.client.events({ since })) if (e.type === type && (id === null || e.sandbox_id === id)) all.push(e);
    return all;
  };
  const sandboxIds = async () => (await d.client.listSandboxes()).map((s) => s.id).sort();

  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 31 });
    neighbour = (await d.client.createSandbox({ image: 'busybox' })).id;
    expect((await sh(neighbour, 'echo "neighbour data" > /root/own')).exit_code).toBe(0);
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  const ATTACKS = [
    {
      name: 'a writable path replaced by a symlink to /etc',
      writable: ['/root/data'],
      plant: 'rm -rf /root/data && ln -s /etc /root/data',
      write: 'echo pwned > /etc/dsec-pwned',
      refusal: /^sandbox [0-9a-f]{16}: writable path \/root\/data resolves through the symlink \/root\/data -> \/etc to \/etc, which is or contains the read-only path \/etc/,
      through: 'echo pwned > /root/data/dsec-pwned',
      readonly: '/etc',
    },
    {
      name: 'a writable path replaced by a relative symlink to /usr/bin',
      writable: ['/var/cache'],
      plant: 'rm -rf /var/cache && ln -s ../usr/bin /var/cache',
      write: 'cp /bin/busybox /usr/bin/dsec-pwned',
      refusal: /^sandbox [0-9a-f]{16}: writable path \/var\/cache resolves through the symlink \/var\/cache -> \.\.\/usr\/bin, which is in a writable part of the sandbox \(the sandbox may have made it\), to \/usr\/bin, outside its writable places/,
      through: 'echo pwned > /var/cache/dsec-pwned',
      readonly: '/usr/bin',
    },
    {
      name: 'a writable path replaced by a symlink to /',
      writable: ['/root/top'],
      plant: 'rm -rf /root/top && ln -s / /root/top',
      write: 'mkdir /dsec-pwned',
      refusal: /^sandbox [0-9a-f]{16}: writable path \/root\/top resolves to \/ through the symlink \/root\/top -> \//,
      through: 'mkdir /root/top/dsec-pwned',
      readonly: '/',
    },
    {
      name: 'a writable path replaced by a symlink through a missing directory and .. to /etc',
      writable: ['/root/conf'],
      // Nothing the sandbox could resolve, but creating /nope and then nope/../etc is /etc.
      plant: 'rm -rf /root/conf && ln -s /nope/../etc /root/conf',
      write: 'echo pwned > /etc/dsec-pwned',
      refusal: /^sandbox [0-9a-f]{16}: writable path \/root\/conf: the symlink \/root\/conf -> \/nope\/\.\.\/etc leads through the missing \/nope and then "\.\."/,
      through: 'echo pwned > /etc/dsec-pwned-too',
      readonly: '/etc',
    },
  ];

  describe.each(ATTACKS)('$name', (a) => {
    // What a start that is not refused shows: the write, and (for the link to /, which
    // leaves the root read-only) whether the top-level binds survived.
    const probe = `${a.write} && echo WROTE ${a.readonly}; touch /tmp/ok || echo "binds lost: /tmp is read-only"`;
    let sb: string;
    let snap: string;
    beforeAll(async () => {
      sb = (await d.client.createSandbox({ image: 'busybox', filesystem: { writable_paths: a.writable } })).id;
      // Created by dsecd, writable, and replaceable from inside: its parent is writable.
      const r = await sh(sb, `test -d ${a.writable[0]} && ${a.plant} && readlink ${a.writable[0]}`);
      expect({ code: r.exit_code, err: err(r) }).toEqual({ code: 0, err: '' });
      snap = (await d.client.snapshot(sb)).id;
    });

    it('after stop/start: the start is refused, the sandbox stays failed, an event names the path', async () => {
      await d.client.stopSandbox(sb);
      const since = Date.now();
      const r = await withNeighbour(() => attempt(() => d.client.startSandbox(sb), probe, false));
      expect(r).toEqual({ refused: { code: 'FailedPrecondition', reason: 'writable_path_refused', message: expect.stringMatching(a.refusal) } });
      const s = await d.client.getSandbox(sb);
      expect({ state: s.state, error: s.error }).toEqual({ state: 'failed', error: expect.stringMatching(/^start failed: sandbox [0-9a-f]{16}: writable path .*; the sandbox keeps its files: snapshot it and restore it without this writable path/) });
      const ev = await eventsOf('sandbox.writable_path_refused', since, sb);
      expect(ev.map((e) => e.message)).toEqual([expect.stringMatching(a.refusal)]);
      // A second start is refused the same way: nothing was half set up.
      expect(await attempt(() => d.client.startSandbox(sb), probe, false)).toEqual(r);
    });

    it('after a restore from a snapshot with the symlink: refused, no sandbox left', async () => {
      const before = await sandboxIds();
      const since = Date.now();
      const r = await withNeighbour(() => attempt(() => d.client.restore(snap), probe, true));
      expect(r).toEqual({ refused: { code: 'FailedPrecondition', reason: 'writable_path_refused', message: expect.stringMatching(/writable path/) } });
      expect(await sandboxIds()).toEqual(before);
      expect((await eventsOf('sandbox.writable_path_refused', since, null)).length).toBe(1);
    });

    it('after a fork of it: refused, no sandbox left', async () => {
      const before = await sandboxIds();
      const r = await withNeighbour(() => attempt(() => d.client.fork(snap, { count: 2 }), probe, true));
      expect(r).toEqual({ refused: { code: 'FailedPrecondition', reason: 'writable_path_refused', message: expect.stringMatching(/writable path/) } });
      expect(await sandboxIds()).toEqual(before);
    });

    it(`restored without that writable path it runs, and ${a.readonly} stays read-only, through the symlink too`, async () => {
      const r = await withNeighbour(() => d.client.restore(snap, { filesystem: { writable_paths: [] } }));
      try {
        for (const w of [a.write, a.through]) {
          const x = await sh(r.id, w);
          expect({ w, code: x.exit_code === 0 ? 0 : 'failed', out: out(x), err: err(x) }).toEqual({ w, code: 'failed', out: '', err: expect.stringMatching(/Read-only file system/) });
        }
        expect(out(await sh(r.id, `readlink ${a.writable[0]}; echo ok > /tmp/ok && cat /tmp/ok`))).toMatch(/\nok\n$/);
      } finally {
        await d.client.deleteSandbox(r.id, { force: true });
      }
    });
  });

  it('a symlink that stays inside the writable area is followed: /root/cache -> /tmp/cache after stop/start', async () => {
    const s = (await d.client.createSandbox({ image: 'busybox', filesystem: { writable_paths: ['/root/cache'] } })).id;
    try {
      expect((await sh(s, 'rm -rf /root/cache && mkdir /tmp/cache && ln -s /tmp/cache /root/cache')).exit_code).toBe(0);
      await d.client.stopSandbox(s);
      expect((await withNeighbour(() => d.client.startSandbox(s))).state).toBe('running');
      expect(out(await sh(s, 'echo in > /root/cache/f && cat /tmp/cache/f && readlink /root/cache; (echo x > /etc/x) 2>&1 | grep -c Read-only'))).toBe('in\n/tmp/cache\n1\n');
    } finally {
      await d.client.deleteSandbox(s, { force: true });
    }
  });
});
