/**
 * Container sandboxes end to end against real runc, EROFS + overlayfs, cgroups v1 and
 * SQLite: lifecycle, exec semantics, limits (OOM, pids), isolation.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readFileSync, statSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { IS_ROOT, TestDaemon, runCli } from './harness.js';
import { waitFor } from '../fixtures/agent.js';

describe.skipIf(!IS_ROOT)('container sandbox lifecycle', () => {
  let d: TestDaemon;
  beforeAll(async () => {
    d = await TestDaemon.start({ slot: 1 });
  });
  afterAll(async () => {
    await d?.cleanup();
  });

  it('create -> exec -> stop -> start -> destroy keeps the writable layer across stop/start', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', labels: { job: 'lc', round: '1' }, env: { GREETING: 'hi' } });
    expect(sb).toMatchObject({ state: 'running', backend: 'container', image: 'busybox:latest', labels: { job: 'lc', round: '1' } });
    expect(sb.init_pid).toBeGreaterThan(0);
    // The init is the agent and lives in the sandbox's cgroup.
    const cg = await d.cgroups();
    expect(await cg.pids(sb.id)).toContain(sb.init_pid);

    // /root: the top level is read-only (docs/SECURITY.md "Filesystem"), /root is a writable place.
    const r = await d.client.exec(sb.id, { argv: ['sh', '-c', 'echo $GREETING > /root/state; cat /root/state; id -u; echo err >&2; exit 3'] });
    expect(r.exit_code).toBe(3);
    expect(r.stdout.toString()).toBe('hi\n0\n');
    expect(r.stderr.toString()).toBe('err\n');
    expect(r.signal).toBeNull();

    const stopped = await d.client.stopSandbox(sb.id);
    expect(stopped.state).toBe('stopped');
    expect(stopped.init_pid).toBeNull();
    expect(await cg.pids(sb.id)).toEqual([]);
    await expect(d.client.exec(sb.id, { argv: ['true'] })).rejects.toMatchObject({ code: 'FailedPrecondition', status: 412 });

    const started = await d.client.startSandbox(sb.id);
    expect(started.state).toBe('running');
    expect(started.init_pid).not.toBe(sb.init_pid);
    const r2 = await d.client.exec(sb.id, { argv: ['cat', '/root/state'] });
    expect(r2.stdout.toString()).toBe('hi\n');

    const gone = await d.client.deleteSandbox(sb.id, { force: true });
    expect(gone.state).toBe('destroyed');
    await expect(d.client.getSandbox(sb.id)).rejects.toMatchObject({ code: 'NotFound', status: 404 });
    const t = await d.traces();
    expect(t.rows).not.toContain(sb.id);
    expect(t.dirs).not.toContain(sb.id);
    expect(t.cgroups).not.toContain(sb.id);
    expect(t.runtime).not.toContain(sb.id);
    expect(t.mounts.filter((m) => m.includes(sb.id))).toEqual([]);
  });

  it('exec: stdin, env, cwd, user, binary output, timeout, not found, not executable, signals', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    try {
      const cat = await d.client.exec(sb.id, { argv: ['cat'], stdin: Buffer.from('from stdin') });
      expect(cat.stdout.toString()).toBe('from stdin');
      const env = await d.client.exec(sb.id, { argv: ['sh', '-c', 'echo $A-$B; pwd'], env: { A: '1', B: 'two' }, cwd: '/tmp' });
      expect(env.stdout.toString()).toBe('1-two\n/tmp\n');
      const user = await d.client.exec(sb.id, { argv: ['id'], user: 'nobody' });
      expect(user.stdout.toString()).toMatch(/uid=65534\(nobody\)/);
      const num = await d.client.exec(sb.id, { argv: ['id', '-u'], user: '1234:1234' });
      expect(num.stdout.toString()).toBe('1234\n');
      const bin = await d.client.exec(sb.id, { argv: ['sh', '-c', 'printf "\\000\\001\\377"'] });
      expect([...bin.stdout]).toEqual([0, 1, 255]);
      const slow = await d.client.exec(sb.id, { argv: ['sleep', '30'], timeoutMs: 300 });
      expect(slow).toMatchObject({ timed_out: true, exit_code: null, signal: 'SIGKILL' });
      const missing = await d.client.exec(sb.id, { argv: ['no-such-binary'] });
      expect(missing.exit_code).toBe(127);
      expect(missing.stderr.toString()).toMatch(/no-such-binary/);
      await d.client.exec(sb.id, { argv: ['sh', '-c', 'echo x > /tmp/f; chmod 644 /tmp/f'] });
      const noexec = await d.client.exec(sb.id, { argv: ['/tmp/f'] });
      expect(noexec.exit_code).toBe(126);
      const killed = await d.client.exec(sb.id, { argv: ['sh', '-c', 'kill -TERM $$'] });
      expect(killed).toMatchObject({ exit_code: null, signal: 'SIGTERM' });
      await expect(d.client.exec(sb.id, { argv: ['true'], cwd: '/does/not/exist' })).rejects.toMatchObject({ code: 'InvalidArgument' });
      await expect(d.client.exec(sb.id, { argv: ['true'], user: 'nosuchuser' })).rejects.toMatchObject({ code: 'InvalidArgument' });
      // Several execs at once on one sandbox.
      const many = await Promise.all(Array.from({ length: 8 }, (_, i) => d.client.exec(sb.id, { argv: ['sh', '-c', `sleep 0.2; echo ${i}`] })));
      expect(many.map((m) => m.stdout.toString())).toEqual(Array.from({ length: 8 }, (_, i) => `${i}\n`));
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('output beyond the cap is truncated and flagged, and the daemon keeps serving', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    try {
      const big = await d.client.exec(sb.id, { argv: ['sh', '-c', 'head -c 10000000 /dev/zero; echo tail >&2'] });
      expect(big.stdout_truncated).toBe(true);
      expect(big.stdout.length).toBe(4 * 1024 * 1024);
      expect(big.stderr.toString()).toBe('tail\n');
      expect(big.exit_code).toBe(0);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('a memory hog is OOM-killed inside its sandbox only, and the result says oom', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', memory_bytes: 32 * 1024 * 1024 });
    const bystander = await d.client.createSandbox({ image: 'busybox' });
    try {
      const r = await d.client.exec(sb.id, { argv: ['sh', '-c', 'x=$(head -c 200000000 /dev/zero | tr "\\000" a); echo survived'] });
      expect(r.oom).toBe(true);
      expect(r.stdout.toString()).not.toContain('survived');
      // The sandbox (its init) and the other sandbox are unaffected.
      const after = await d.client.exec(sb.id, { argv: ['echo', 'alive'] });
      expect(after.stdout.toString()).toBe('alive\n');
      expect(after.oom).toBe(false);
      expect((await d.client.getSandbox(sb.id)).state).toBe('running');
      expect((await d.client.exec(bystander.id, { argv: ['true'] })).exit_code).toBe(0);
      // A stop and start makes the sandbox's memory cgroup anew (dsecd reads its counter
      // through a kept-open file): the next OOM kill is reported all the same.
      await d.client.stopSandbox(sb.id);
      await d.client.startSandbox(sb.id);
      const again = await d.client.exec(sb.id, { argv: ['sh', '-c', 'x=$(head -c 200000000 /dev/zero | tr "\\000" a); echo survived'] });
      expect(again.oom).toBe(true);
      expect(again.oom_kills).toBeGreaterThan(0);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
      await d.client.deleteSandbox(bystander.id, { force: true });
    }
  });

  /**
   * Waits until the sandbox's memory charge is below half its limit. The pages of an
   * unlinked tmpfs file are freed when its last holder's reference is dropped, which the
   * kernel may defer (a reference dropped by the OOM reaper or in a kernel thread goes
   * through delayed fput), so on a loaded host the cgroup can still be full when the exec
   * that freed it has returned, and the next command would be the OOM victim. A hang
   * detector bounds the wait, not a timing check.
   */
  async function chargeFreed(id: string): Promise<void> {
    const limit = (await d.client.sandboxStats(id)).memory_limit_bytes!;
    try {
      await waitFor('the sandbox memory charge to fall below half its limit', async () => (await d.client.sandboxStats(id)).memory_bytes! < limit / 2, 60_000);
    } catch (e) {
      // What still holds the charge: the sandbox's processes and whoever has a /dev/shm file open.
      const ps = await d.client.exec(id, { argv: ['sh', '-c', 'ps -o pid,stat,rss,args; ls -l /proc/[0-9]*/fd 2>/dev/null | grep -i shm; df -k /dev/shm'] })
        .then((r) => r.stdout.toString(), (e2: Error) => `exec failed: ${e2.message}`);
      throw new Error(`${(e as Error).message}\nstats: ${JSON.stringify(await d.client.sandboxStats(id))}\n${ps}`);
    }
  }

  it('the OOM killer takes a command, never the agent, even when the charge is in no process (tmpfs pages)', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', memory_bytes: 32 * 1024 * 1024 });
    try {
      // The agent (init) keeps dsecd's value; what it starts runs at EXEC_OOM_SCORE_ADJ.
      const adj = await d.client.exec(sb.id, { argv: ['sh', '-c', 'cat /proc/1/oom_score_adj /proc/self/oom_score_adj'] });
      expect(adj.stdout.toString()).toBe('0\n500\n');
      // Pages of an unlinked tmpfs file are charged to the cgroup but are in no process's
      // RSS, so the OOM killer picks by RSS alone among equals: at equal adj the agent
      // (~1 MiB resident) outranks `sh` and `head`, and the sandbox fails. The pages go
      // with the last process holding the file, so the cgroup recovers by itself.
      await d.client.exec(sb.id, {
        argv: ['sh', '-c', 'exec 3<>/dev/shm/fill; rm /dev/shm/fill; head -c 64000000 /dev/zero >&3; echo survived'],
      });
      expect((await d.client.sandboxStats(sb.id)).oom_kills).toBeGreaterThan(0);
      expect((await d.client.getSandbox(sb.id)).state).toBe('running');
      await chargeFreed(sb.id);
      expect((await d.client.exec(sb.id, { argv: ['echo', 'alive'] })).stdout.toString()).toBe('alive\n');
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('orphans allocating at the cgroup limit are what the next exec fork kills, never the agent; killing the helper only lowers commands', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', memory_bytes: 32 * 1024 * 1024 });
    try {
      const init = (await d.client.getSandbox(sb.id)).init_pid;
      // Background loops keep the cgroup at its limit after the exec returned: each `head`
      // fills an unlinked tmpfs file (the charge is in no process) until it is OOM-killed,
      // and the next one starts. Every fork of the agent then allocates in a full cgroup:
      // the victim must be a command (+500: a loop, or the new command itself), never the
      // agent. An agent that raised itself to +500 around each fork would be, larger than
      // `head` or `sh`, the first choice in that window (the sandbox failed within a few execs).
      await d.client.exec(sb.id, {
        argv: ['sh', '-c', 'for i in 1 2; do (exec 3<>/dev/shm/fill$i; rm /dev/shm/fill$i; while :; do head -c 64000000 /dev/zero >&3; done) >/dev/null 2>&1 & echo $! >> /tmp/loops; done'],
      });
      // The execs below must fork while the loops hold the cgroup at its limit. Filling 32
      // MiB takes the loops the better part of a second (busybox `head` under the
      // sandbox's CPU quota), longer on a loaded host, while 20 execs on a warm dsecd can
      // be done sooner: they would then check nothing (and oom_kills would read 0). So the
      // execs start once the first OOM kill shows the limit reached; the loops restart
      // `head` after each kill and keep the cgroup full until their subshells are killed.
      await waitFor('the loops to reach the memory limit (an OOM kill)', async () => (await d.client.sandboxStats(sb.id)).oom_kills! > 0, 60_000);
      for (let i = 0; i < 20; i++) {
        // Throws once the agent is gone (the sandbox is failed); the command itself may be
        // the victim, which is the kernel's choice among equals.
        await d.client.exec(sb.id, { argv: ['echo', `alive ${i}`] });
      }
      expect(await d.client.getSandbox(sb.id)).toMatchObject({ state: 'running', init_pid: init });
      // Stop the loops; their last `head` dies at its next OOM or write, which frees the files.
      for (let i = 0; i < 20; i++) {
        const k = await d.client.exec(sb.id, { argv: ['sh', '-c', 'kill -9 $(cat /tmp/loops) 2>/dev/null; for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = head ] && kill -9 ${p#/proc/}; done; ps -o comm | grep -c "^head$"'] });
        if (k.stdout.toString().trim() === '0') break;
      }
      await chargeFreed(sb.id);
      expect((await d.client.exec(sb.id, { argv: ['echo', 'alive'] })).stdout.toString()).toBe('alive\n');
      const adj = await d.client.exec(sb.id, { argv: ['sh', '-c', 'cat /proc/1/oom_score_adj /proc/self/oom_score_adj; for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = dsec-oom-adj ] && echo ${p#/proc/}; done'] });
      const [agentAdj, cmdAdj, helper] = adj.stdout.toString().trim().split('\n');
      expect([agentAdj, cmdAdj]).toEqual(['0', '500']);
      // The helper is the agent's, not the sandbox's to need: killing it leaves commands at
      // the agent's value and the sandbox working.
      await d.client.exec(sb.id, { argv: ['kill', '-9', helper] });
      const after = await d.client.exec(sb.id, { argv: ['cat', '/proc/self/oom_score_adj'] });
      expect(after.stdout.toString()).toBe('0\n');
      expect((await d.client.getSandbox(sb.id)).state).toBe('running');
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('a fork bomb stops at the pids limit and the sandbox recovers', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox', pids: 32 });
    try {
      const r = await d.client.exec(sb.id, { argv: ['sh', '-c', 'i=0; while [ $i -lt 200 ]; do sleep 1000 & i=$((i+1)); done; wait'], timeoutMs: 10_000 });
      expect(r.exit_code).not.toBe(0);
      expect(r.stderr.toString()).toMatch(/can't fork|Resource temporarily unavailable/);
      const cg = await d.cgroups();
      const paths = cg.sandboxPaths(sb.id);
      const events = readFileSync(path.join(paths.pids, 'pids.events'), 'utf8');
      expect(Number(/max (\d+)/.exec(events)![1])).toBeGreaterThan(0);
      expect(Number(readFileSync(path.join(paths.pids, 'pids.max'), 'utf8'))).toBe(32);
      expect(Number(readFileSync(path.join(paths.pids, 'pids.current'), 'utf8'))).toBeLessThanOrEqual(32);
      // The background sleeps hold the sandbox at its limit; killing them from inside frees it.
      await d.client.exec(sb.id, { argv: ['kill', '-9', '-1'] });
      const ok = await d.client.exec(sb.id, { argv: ['echo', 'ok'] });
      expect(ok.stdout.toString()).toBe('ok\n');
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('root in a sandbox is an unprivileged uid on the host and cannot write host files', async () => {
    // System paths writable (readonly_paths []): this is about the upper dir and host
    // uids, so root inside must be able to replace image files (read-only paths:
    // test/attacks/filesystem.test.ts).
    const sb = await d.client.createSandbox({ image: 'busybox', filesystem: { readonly_paths: [] } });
    try {
      await d.client.exec(sb.id, { argv: ['sh', '-c', 'echo mine > /root/owned'] });
      const upper = path.join(d.upperDir(sb.id), 'root', 'owned');
      expect(statSync(upper).uid).toBe(sb.uid_base);
      const attempts = [
        'echo x > /dev/.dsec-agent',
        'echo x > /proc/sysrq-trigger',
        'echo 1 > /proc/sys/vm/drop_caches',
        'echo x > /sys/kernel/uevent_helper',
        'mknod /tmp/sda b 8 0',
        'mount -t tmpfs none /mnt',
        'touch /bin/busybox.new && mv /bin/busybox.new /bin/busybox && chown 0:0 /bin/busybox',
      ];
      for (const a of attempts.slice(0, 6)) {
        const r = await d.client.exec(sb.id, { argv: ['sh', '-c', a] });
        expect(r.exit_code, a).not.toBe(0);
      }
      // Replacing a file of the image only changes this sandbox's upper dir, never the shared layer.
      const replaced = await d.client.exec(sb.id, { argv: ['sh', '-c', 'echo gotcha > /bin/cat-copy && rm /bin/ls'] });
      expect(replaced.exit_code).toBe(0);
      const other = await d.client.createSandbox({ image: 'busybox' });
      try {
        const ls = await d.client.exec(other.id, { argv: ['ls', '/bin/ls'] });
        expect(ls.exit_code).toBe(0);
      } finally {
        await d.client.deleteSandbox(other.id, { force: true });
      }
      // No file under the sandbox's writable layer is owned by host root.
      const walk = (dir: string): string[] => readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
        const p = path.join(dir, e.name);
        return e.isDirectory() ? [p, ...walk(p)] : [p];
      });
      for (const p of walk(d.upperDir(sb.id))) {
        const st = statSync(p, { throwIfNoEntry: false });
        // Overlay whiteouts (char device 0:0 marking a deleted lower file) are created with
        // the mounter's credentials; they hold no data and cannot be opened.
        const whiteout = st?.isCharacterDevice() && st.rdev === 0;
        if (st && !whiteout) expect(st.uid, p).toBeGreaterThanOrEqual(sb.uid_base!);
      }
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('a file written in one sandbox is invisible in another, and sandboxes never share uids', async () => {
    const a = await d.client.createSandbox({ image: 'busybox' });
    const b = await d.client.createSandbox({ image: 'busybox' });
    try {
      expect(a.uid_base).not.toBe(b.uid_base);
      expect(Math.abs(a.uid_base! - b.uid_base!)).toBeGreaterThanOrEqual(a.uid_count!);
      await d.client.exec(a.id, { argv: ['sh', '-c', 'echo secret > /root/answer; echo secret > /tmp/answer'] });
      const r = await d.client.exec(b.id, { argv: ['sh', '-c', 'cat /root/answer /tmp/answer; ls /proc | grep -c "^[0-9]"'] });
      expect(r.stdout.toString()).not.toContain('secret');
      // b sees only its own processes (pid namespace): init + sh + ls/grep.
      expect(Number(r.stdout.toString().trim().split('\n').pop())).toBeLessThan(6);
      // Both share the one mounted EROFS blob of the image.
      expect(d.layerMounts().length).toBe(1);
    } finally {
      await d.client.deleteSandbox(a.id, { force: true });
      await d.client.deleteSandbox(b.id, { force: true });
    }
  });

  it('dsec run prints the output and exits with the command status', async () => {
    const r = await runCli(d, ['run', '--image', 'busybox', '--', 'sh', '-c', 'echo hello; exit 3']);
    expect(r.stdout).toBe('hello\n');
    expect(r.code).toBe(3);
    const k = await runCli(d, ['run', '--', 'sh', '-c', 'kill -KILL $$']);
    expect(k.code).toBe(137);
    const nf = await runCli(d, ['run', '--', 'nope']);
    expect(nf.code).toBe(127);
    // run destroys its sandbox
    expect((await d.client.listSandboxes())).toEqual([]);
  });

  it('stop sends SIGTERM first and waits out the grace period before killing', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    try {
      // The exec returns only once the background shell has installed its trap (marker file).
      const trapper = 'rm -f /root/ready; sh -c \'trap "echo got-term > /root/term; exit 0" TERM; touch /root/ready; while true; do sleep 0.1; done\' >/dev/null 2>&1 & while [ ! -e /root/ready ]; do sleep 0.05; done';
      await d.client.exec(sb.id, { argv: ['sh', '-c', trapper] });
      await d.client.request('POST', `/v1/sandboxes/${sb.id}/stop`, { timeout_ms: 5000 });
      await d.client.startSandbox(sb.id);
      expect((await d.client.exec(sb.id, { argv: ['cat', '/root/term'] })).stdout.toString()).toBe('got-term\n');
      // timeout_ms 0 kills at once: the trap never runs.
      await d.client.exec(sb.id, { argv: ['sh', '-c', `rm /root/term; ${trapper}`] });
      await d.client.request('POST', `/v1/sandboxes/${sb.id}/stop`, { timeout_ms: 0 });
      await d.client.startSandbox(sb.id);
      expect((await d.client.exec(sb.id, { argv: ['ls', '/root/term'] })).exit_code).not.toBe(0);
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('the reaper notices an init killed from outside without any exec', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    try {
      process.kill(sb.init_pid!, 'SIGKILL');
      let state = 'running';
      for (let i = 0; i < 300 && state === 'running'; i++) {
        await new Promise((r) => setTimeout(r, 100));
        state = (await d.client.getSandbox(sb.id)).state;
      }
      expect(state).toBe('failed');
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('a stop or destroy that races an exec answers Conflict, not a lost connection', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    const ex = d.client.exec(sb.id, { argv: ['sleep', '30'] }).then(() => null, (e: unknown) => e);
    await new Promise((r) => setTimeout(r, 300));
    await d.client.deleteSandbox(sb.id, { force: true });
    expect(await ex).toMatchObject({ code: 'Conflict', message: expect.stringMatching(/destroyed while the command ran/) });
  });

  it('a sandbox whose init is killed from outside becomes failed, and start brings it back', async () => {
    const sb = await d.client.createSandbox({ image: 'busybox' });
    try {
      await d.client.exec(sb.id, { argv: ['sh', '-c', 'echo persisted > /root/p'] });
      process.kill(sb.init_pid!, 'SIGKILL');
      await expect(d.client.exec(sb.id, { argv: ['true'] })).rejects.toMatchObject({ code: 'FailedPrecondition' });
      const f = await d.client.getSandbox(sb.id);
      expect(f).toMatchObject({ state: 'failed', init_pid: null });
      expect(f.error).toMatch(/init exited/);
      const t = await d.traces();
      expect(t.runtime).not.toContain(sb.id);
      expect(t.mounts.filter((m) => m.includes(sb.id))).toEqual([]);
      await d.client.startSandbox(sb.id);
      expect((await d.client.exec(sb.id, { argv: ['cat', '/root/p'] })).stdout.toString()).toBe('persisted\n');
    } finally {
      await d.client.deleteSandbox(sb.id, { force: true });
    }
  });

  it('lists by selector and reports events', async () => {
    const a = await d.client.createSandbox({ labels: { job: 'sel', round: '1' } });
    const b = await d.client.createSandbox({ labels: { job: 'sel', round: '2' } });
    try {
      const l = await d.client.listSandboxes({ selector: 'job=sel,round=2' });
      expect(l.map((s) => s.id)).toEqual([b.id]);
      expect((await d.client.listSandboxes({ selector: "job=sel" })).length).toBe(2);
      const evs = [];
      for await (const e of d.client.events({ selector: 'job=sel' })) evs.push(e);
      expect(evs.filter((e) => e.type === 'sandbox.created').map((e) => e.sandbox_id)).toEqual([a.id, b.id]);
    } finally {
      await d.client.deleteSandbox(a.id, { force: true });
      await d.client.deleteSandbox(b.id, { force: true });
    }
  });
});
