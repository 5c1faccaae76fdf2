/** watchExit (daemon/host/pidwatch.ts over native/addon/spawn.c pidWatch): exits seen through pidfds. Real processes, no root. */
import { spawn } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { watchExit } from '../../daemon/host/pidwatch.js';
import { procStartTime } from '../../daemon/host/proc.js';

/** A `sleep` child of this process, with its start time. */
function sleeper() {
  const c = spawn('sleep', ['60'], { stdio: 'ignore' });
  const exited = new Promise<void>((r) => c.on('exit', () => r()));
  return { c, pid: c.pid!, start: procStartTime(c.pid!)!, exited };
}

describe('watchExit', () => {
  it('calls back once the process exits, whoever reaps it', async () => {
    const s = sleeper();
    let calls = 0;
    const seen = new Promise<void>((resolve) => {
      expect(watchExit(s.pid, s.start, () => { calls++; resolve(); })).not.toBeNull();
    });
    s.c.kill('SIGKILL');
    await seen;
    await s.exited;
    await new Promise((r) => setTimeout(r, 50));
    expect(calls).toBe(1);
  });

  it('refuses a start time that is not the process\'s (a reused pid) and a pid that does not exist', async () => {
    const s = sleeper();
    try {
      expect(watchExit(s.pid, s.start + 1, () => { throw new Error('called'); })).toBeNull();
    } finally {
      s.c.kill('SIGKILL');
      await s.exited;
    }
    // Reaped: neither the pid nor a zombie is left.
    expect(watchExit(s.pid, s.start, () => { throw new Error('called'); })).toBeNull();
  });

  it('a cancelled watch never calls back', async () => {
    const s = sleeper();
    let called = false;
    const w = watchExit(s.pid, s.start, () => { called = true; })!;
    w.cancel();
    w.cancel();
    s.c.kill('SIGKILL');
    await s.exited;
    await new Promise((r) => setTimeout(r, 100));
    expect(called).toBe(false);
  });

  it('watches many at once, each reported for its own process', async () => {
    const ss = Array.from({ length: 32 }, () => sleeper());
    const got: number[] = [];
    const all = Promise.all(ss.map((s) => new Promise<void>((resolve) => {
      watchExit(s.pid, s.start, () => { got.push(s.pid); resolve(); });
    })));
    // Kill the odd ones first: only they are reported until the even ones die too.
    for (const [i, s] of ss.entries()) if (i % 2) s.c.kill('SIGKILL');
    await Promise.all(ss.filter((_, i) => i % 2).map((s) => s.exited));
    await new Promise((r) => setTimeout(r, 100));
    expect(got.sort()).toEqual(ss.filter((_, i) => i % 2).map((s) => s.pid).sort());
    for (const [i, s] of ss.entries()) if (i % 2 === 0) s.c.kill('SIGKILL');
    await all;
    expect(got.length).toBe(32);
  });
});
