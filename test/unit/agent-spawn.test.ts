/**
 * How the agent starts a command (native/agent/spawn.c): a child made with
 * clone(CLONE_VM | CLONE_VFORK) that shares the agent's memory until it execs, with every
 * step of its setup computed by the agent beforehand (docs/ARCHITECTURE.md, "How an exec
 * starts"). The agent runs as a normal process on the host (test/fixtures/agent.ts).
 *
 * What a wrong child would break, and what each test watches:
 *   - the child allocating or writing agent state: the agent's heap grows with every exec,
 *     or a later exec sees another's plan (env, HOME, PATH search, user);
 *   - a wrong clone flag (CLONE_FILES, CLONE_FS, CLONE_SIGHAND): the child's dup2, chdir,
 *     sigaction or setuid land in the agent (its fds 0-2, cwd, mask, dispositions, uid);
 *   - the oom step: the agent's own oom_score_adj raised with its child's, or commands not
 *     raised, with and without the dsec-oom-adj helper;
 *   - failures before execve (a missing program, EACCES after the user switch, a bad cwd, an
 *     unknown user) not reported as EXEC_ERROR with the right errno, or the agent not
 *     serving afterwards.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import fs from 'node:fs';
import path from 'node:path';
import type { AgentClient, AgentExecResult } from '../../daemon/agent/client.js';
import { AgentHarness, BB, buildAgent, procState, waitFor, type RunningAgent } from '../fixtures/agent.js';

const ENV = ['PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin'];
const MiB = 1 << 20;

// 0755: commands run as nobody reach the files the tests put in an agent's directory.
const harness = new AgentHarness({ prefix: 'dsec-agent-spawn-test-', extraArgs: false, dirMode: 0o755 });

beforeAll(() => buildAgent());
afterEach(() => harness.cleanup());
afterAll(() => harness.removeAll());

function out(r: AgentExecResult): string {
  if (r.kind !== 'exit') throw new Error(`expected exit, got exec_error: ${r.message}`);
  if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode}: ${r.stderr.toString()}`);
  return r.stdout.toString();
}

/** A field of /proc/PID/status (e.g. "Uid", "SigBlk", "VmData"). */
function status(pid: number, field: string): string {
  const m = new RegExp(`^${field}:\\s+(.*)$`, 'm').exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`no ${field} in /proc/${pid}/status`);
  return m[1].trim();
}

/** What a child could wrongly change in the agent: fds 0-2, cwd, uid/gid, mask and dispositions. */
function agentState(pid: number): Record<string, string> {
  const fd = (n: number) => fs.readlinkSync(`/proc/${pid}/fd/${n}`);
  return {
    fd0: fd(0), fd1: fd(1), fd2: fd(2), cwd: fs.readlinkSync(`/proc/${pid}/cwd`),
    uid: status(pid, 'Uid'), gid: status(pid, 'Gid'), groups: status(pid, 'Groups'),
    sigblk: status(pid, 'SigBlk'), sigign: status(pid, 'SigIgn'), sigcgt: status(pid, 'SigCgt'),
    oom: fs.readFileSync(`/proc/${pid}/oom_score_adj`, 'utf8').trim(),
  };
}

/** A root-only directory with a root-only executable, and a writable scratch directory. */
function fixtures(a: RunningAgent): { rootOnly: string; work: string } {
  const dir = fs.mkdtempSync(path.join(a.dir, 'x-'));
  fs.chmodSync(dir, 0o755);
  const rootOnly = path.join(dir, 'busybox'); // busybox picks its applet by argv[0]: keep the name
  fs.copyFileSync(BB, rootOnly);
  fs.chmodSync(rootOnly, 0o700);
  const work = fs.mkdtempSync(path.join(a.dir, 'w-'));
  fs.chmodSync(work, 0o777);
  return { rootOnly, work };
}

describe('dsec-agent exec children (clone with CLONE_VM | CLONE_VFORK)', () => {
  it('reports every failure before execve with its errno, and the agent keeps serving', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const { rootOnly, work } = fixtures(a);
    const run = (argv: string[], more: { user?: string; cwd?: string; env?: string[] } = {}) =>
      c.exec({ argv, env: more.env ?? ENV, maxOutputBytes: MiB, ...(more.user ? { user: more.user } : {}), ...(more.cwd ? { cwd: more.cwd } : {}) });
    for (let i = 0; i < 3; i++) {
      expect(await run(['no-such-program-dsec'])).toMatchObject({ kind: 'exec_error', errno: 2, message: 'exec: no-such-program-dsec: No such file or directory' });
      expect(await run(['/nonexistent/dsec'])).toMatchObject({ kind: 'exec_error', errno: 2 });
      // Root may run it; nobody may not: EACCES comes after the user switch, in the child.
      expect(out(await run([rootOnly, 'echo', 'root ran it']))).toBe('root ran it\n');
      expect(await run([rootOnly, 'true'], { user: 'nobody' })).toMatchObject({ kind: 'exec_error', errno: 13, message: `exec: ${rootOnly}: Permission denied` });
      // Through the PATH search: a directory where the file is not executable, then none.
      expect(await run(['busybox', 'true'], { user: 'nobody', env: [`PATH=${path.dirname(rootOnly)}:/nonexistent`] }))
        .toMatchObject({ kind: 'exec_error', errno: 13 });
      expect(await run([BB, 'true'], { cwd: '/nonexistent-dsec' })).toMatchObject({ kind: 'exec_error', errno: 2, message: 'chdir: /nonexistent-dsec: No such file or directory' });
      expect(await run([BB, 'true'], { user: 'no-such-user-dsec' })).toMatchObject({ kind: 'exec_error', errno: 2, message: 'user: no-such-user-dsec: unknown user' });
      // A file without #! runs through /bin/sh with the request's argv (execvp's way).
      const bare = path.join(work, `bare${i}`);
      fs.writeFileSync(bare, 'echo "bare $1 $2 $HOME"\n', { mode: 0o755 });
      expect(out(await run([bare, 'x', 'y'], { user: 'nobody' }))).toBe('bare x y /nonexistent\n');
    }
    expect(out(await run([BB, 'echo', 'still serving']))).toBe('still serving\n');
  });

  it('runs many execs at once, PTYs and pipes, each with its own env, user, cwd and HOME', async () => {
    const a = await harness.start();
    const [c1, c2] = await Promise.all([harness.connect(a), harness.connect(a)]);
    const { work } = fixtures(a);
    const users = ['0', 'nobody', '4242:777', 'nobody:0'];
    const ids: Record<string, string> = { 0: '0 0', nobody: '65534 65534', '4242:777': '4242 777', 'nobody:0': '65534 0' };
    const homes: Record<string, string> = { 0: '/root', nobody: '/nonexistent', '4242:777': '/', 'nobody:0': '/nonexistent' };
    const script = 'echo "$TAG|$HOME|$(id -u) $(id -g)|$(pwd)|$(tty >/dev/null && echo tty || echo notty)"';
    const jobs = Array.from({ length: 48 }, async (_, i) => {
      const user = users[i % users.length];
      const tty = i % 3 === 0;
      const cwd = i % 2 ? work : '/';
      const env = [...ENV, `TAG=job-${i}-${'x'.repeat(i * 37)}`];
      const c = i % 2 ? c1 : c2;
      let text = '';
      if (tty) {
        const h = c.startExec({ argv: [BB, 'sh', '-c', script], env, user, cwd, tty: { rows: 24, cols: 200 } }, { onStdout: (b) => { text += b.toString(); } });
        const done = await h.done;
        expect(done).toMatchObject({ kind: 'exit', exitCode: 0 });
        text = text.replace(/\r\n/g, '\n');
      } else {
        text = out(await c.exec({ argv: [BB, 'sh', '-c', script], env, user, cwd, maxOutputBytes: MiB }));
      }
      expect(text).toBe(`job-${i}-${'x'.repeat(i * 37)}|${homes[user]}|${ids[user]}|${cwd}|${tty ? 'tty' : 'notty'}\n`);
    });
    await Promise.all(jobs);
  });

  it('leaves the agent as it was: fds 0-2, cwd, uid and groups, signal mask and dispositions, oom_score_adj', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const { work } = fixtures(a);
    const before = agentState(a.pid);
    expect(before.oom).toBe('0');
    for (const user of ['nobody', '4242:777', '0']) {
      expect(out(await c.exec({ argv: [BB, 'sh', '-c', 'cat /proc/self/oom_score_adj; pwd'], env: ENV, user, cwd: work, maxOutputBytes: MiB }))).toBe(`500\n${work}\n`);
      const t = c.startExec({ argv: [BB, 'true'], env: ENV, user, cwd: work, tty: { rows: 10, cols: 10 } });
      expect(await t.done).toMatchObject({ kind: 'exit', exitCode: 0 });
      expect(await c.exec({ argv: ['no-such-program-dsec'], env: ENV, user, cwd: work, maxOutputBytes: 1 })).toMatchObject({ kind: 'exec_error', errno: 2 });
    }
    expect(agentState(a.pid)).toEqual(before);
  });

  it('does not grow the agent\'s heap: the child allocates nothing in the memory it shares', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    // No HOME (the plan adds it), a PATH search over several directories, a user lookup:
    // every step that once allocated in the child.
    const req = { argv: ['true'], env: ['PATH=/nonexistent-a:/nonexistent-b:/usr/bin:/bin'], user: 'nobody', maxOutputBytes: 16 };
    const fail = { argv: ['no-such-program-dsec'], env: ['PATH=/nonexistent-a:/usr/bin:/bin'], user: 'nobody', maxOutputBytes: 16 };
    const data = () => Number(/^(\d+) kB$/.exec(status(a.pid, 'VmData'))![1]) * 1024;
    for (let i = 0; i < 200; i++) await c.exec(i % 2 ? req : fail);
    const d0 = data();
    for (let i = 0; i < 3000; i++) {
      const r = await c.exec(i % 2 ? req : fail);
      expect(r.kind).toBe(i % 2 ? 'exit' : 'exec_error');
    }
    // It does not grow at all once warm; malloc's heap grows by at least 128 KiB at a time
    // (M_TOP_PAD), and a child allocating the PATH search's buffer (~80 bytes) in every
    // exec grew it by 248 KiB here.
    expect(data() - d0).toBeLessThan(128 * 1024);
  });
});

describe('dsec-agent exec children: oom_score_adj', () => {
  it.each([
    ['not Landlocked: each child writes its own value', [] as string[]],
    ['--landlock: the dsec-oom-adj helper raises each child', ['--landlock', '--writable', '/tmp']],
  ])('%s; the agent stays at its own', async (_what, args) => {
    const a = await harness.start({ args });
    const c = await harness.connect(a);
    const adj = () => c.exec({ argv: [BB, 'cat', '/proc/self/oom_score_adj'], env: ENV, maxOutputBytes: 100 });
    const all = await Promise.all(Array.from({ length: 24 }, () => adj()));
    for (const r of all) expect(out(r)).toBe('500\n');
    expect(fs.readFileSync(`/proc/${a.pid}/oom_score_adj`, 'utf8')).toBe('0\n');
    if (args.length) {
      // Killing the helper only lowers commands to the agent's value; execs go on.
      const helper = fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p)).find((p) => {
        try {
          return fs.readFileSync(`/proc/${p}/comm`, 'utf8').trim() === 'dsec-oom-adj' && status(Number(p), 'PPid') === String(a.pid);
        } catch {
          return false;
        }
      });
      expect(helper).toBeDefined();
      process.kill(Number(helper), 'SIGKILL');
      await waitFor('the agent to reap the helper', () => procState(Number(helper)) === null);
      for (let i = 0; i < 3; i++) expect(out(await adj())).toBe('0\n');
      expect(fs.readFileSync(`/proc/${a.pid}/oom_score_adj`, 'utf8')).toBe('0\n');
    }
  });
});
