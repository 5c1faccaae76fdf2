/**
 * spawnNative (daemon/host/spawn.ts over native/addon/spawn.c): children started with
 * posix_spawn on the addon's thread and reaped through pidfds. Real processes, no root.
 */
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { spawnNative } from '../../daemon/host/spawn.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'dsec-spawn-test-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('spawnNative', () => {
  it('reports the exit status and captures stdout and stderr separately', async () => {
    const r = await spawnNative('sh', ['-c', 'echo out; echo err >&2; exit 3']);
    expect(r).toMatchObject({ exitCode: 3, signal: null, stdout: 'out\n', stderr: 'err\n', timedOut: false });
    expect(r.pid).toBeGreaterThan(1);
  });

  it('feeds stdin, runs in cwd with exactly the env given', async () => {
    const r = await spawnNative('/bin/sh', ['-c', 'cat; pwd; env | sort'], { input: 'in\n', cwd: dir, env: { A: '1', PATH: '/usr/bin:/bin' } });
    // sh adds PWD (and may add SHLVL/_); nothing of this process's environment leaks in.
    expect(r.stdout.startsWith(`in\n${dir}\nA=1\nPATH=/usr/bin:/bin\n`)).toBe(true);
    expect(r.stdout).not.toContain('HOME=');
  });

  it('keeps at most maxOutputBytes of each stream', async () => {
    const r = await spawnNative('sh', ['-c', 'head -c 100000 /dev/zero | tr "\\0" a'], { maxOutputBytes: 1000 });
    expect(r.exitCode).toBe(0);
    expect(r.stdout).toBe('a'.repeat(1000));
  });

  it('maps the fds it is given and closes every other fd of the caller in the child', async () => {
    const f = path.join(dir, 'fd3');
    const fd = openSync(f, 'w');
    // An fd of ours without close-on-exec, which a fork-based spawn would leak.
    const leaky = openSync(path.join(dir, 'leaky'), 'w');
    let r;
    try {
      r = await spawnNative('sh', ['-c', 'echo via3 >&3; ls /proc/self/fd'], { fds: { 3: fd } });
    } finally {
      closeSync(fd);
      closeSync(leaky);
    }
    expect(readFileSync(f, 'utf8')).toBe('via3\n');
    // 0, 1, 2, 3 and the directory fd `ls` itself opens.
    expect(r.stdout.trim().split('\n').map(Number).sort((a, b) => a - b)).toEqual([0, 1, 2, 3, 4]);
  });

  it('a source fd equal to another mapping target is not clobbered', async () => {
    const a = openSync(path.join(dir, 'a'), 'w');
    const b = openSync(path.join(dir, 'b'), 'w');
    try {
      // Child fd 3 <- our b, child fd 4 <- our a: the dup2 order must not matter.
      const r = await spawnNative('sh', ['-c', 'echo B >&3; echo A >&4'], { fds: { 3: b, 4: a } });
      expect(r.exitCode).toBe(0);
    } finally {
      closeSync(a);
      closeSync(b);
    }
    expect(readFileSync(path.join(dir, 'a'), 'utf8')).toBe('A\n');
    expect(readFileSync(path.join(dir, 'b'), 'utf8')).toBe('B\n');
  });

  it('starts the child with default signal dispositions and nothing blocked (Node ignores SIGPIPE)', async () => {
    const r = await spawnNative('sh', ['-c', 'grep -E "^Sig(Ign|Blk)" /proc/self/status']);
    const ign = BigInt(`0x${/SigIgn:\s+([0-9a-f]+)/.exec(r.stdout)![1]}`);
    const blk = BigInt(`0x${/SigBlk:\s+([0-9a-f]+)/.exec(r.stdout)![1]}`);
    expect(ign & (1n << 12n)).toBe(0n); // SIGPIPE (13) is bit 12
    expect(blk).toBe(0n);
  });

  it('SIGKILLs a child that outlives its timeout', async () => {
    const r = await spawnNative('sleep', ['30'], { timeoutMs: 50 });
    expect(r).toMatchObject({ exitCode: null, signal: 'SIGKILL', timedOut: true });
  });

  it('rejects with an errno-coded error when the program cannot be started', async () => {
    await expect(spawnNative('/nonexistent/prog', [])).rejects.toMatchObject({ code: 'ENOENT', syscall: 'posix_spawn' });
    await expect(spawnNative('dsec-no-such-program-anywhere', [])).rejects.toMatchObject({ code: 'ENOENT' });
  });

  it('refuses an fd number outside 0..63', async () => {
    await expect(spawnNative('true', [], { fds: { 64: 1 } })).rejects.toThrow(/fds/);
  });

  it('runs many at once, each reaped once with its own status', async () => {
    const rs = await Promise.all(Array.from({ length: 64 }, (_, i) => spawnNative('sh', ['-c', `exit ${i % 7}`])));
    expect(rs.map((r) => r.exitCode)).toEqual(Array.from({ length: 64 }, (_, i) => i % 7));
    expect(new Set(rs.map((r) => r.pid)).size).toBe(64);
  });
});
