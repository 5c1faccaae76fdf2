/**
 * The in-sandbox agent (native/agent) and its client (daemon/agent), run as a normal
 * (non-PID-1) process on the host: every test gets its own agent on a fresh listening
 * socket (test/fixtures/agent.ts). PID-1 behaviour is in test/integration/agent-pid1.test.ts.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { AgentClient, type AgentExecResult } from '../../daemon/agent/client.js';
import {
  ExecTag, FrameDecoder, FrameType, HEADER_LENGTH, MAX_PAYLOAD, ProtocolError,
  decodeExecRequest, decodeExit, decodeTlv, encodeExecRequest, encodeExit, encodeFrame,
  encodeTlv, encodeU32, type Frame,
} from '../../daemon/agent/protocol.js';
import { AGENT, AgentHarness, BB, EXTRA_AGENT_ARGS, buildAgent, procState, waitFor } from '../fixtures/agent.js';

const ENV = ['PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin'];
const MiB = 1 << 20;

// ---- harness ------------------------------------------------------------------------

const harness = new AgentHarness({ prefix: 'dsec-agent-test-' });

function ppidOf(pid: number): number | null {
  try {
    const m = /^PPid:\s+(\d+)/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : null;
  } catch {
    return null;
  }
}

function sh(script: string, ...args: string[]): string[] {
  return [BB, 'sh', '-c', script, 'sh', ...args];
}

function expectExit(r: AgentExecResult, code: number): void {
  if (r.kind !== 'exit') throw new Error(`expected exit, got exec_error: ${r.message}`);
  expect({ exitCode: r.exitCode, signal: r.signal, stderr: r.stderr.toString() })
    .toEqual({ exitCode: code, signal: null, stderr: expect.any(String) });
}

beforeAll(() => {
  buildAgent();
  expect(fs.existsSync(AGENT)).toBe(true);
});

afterEach(() => harness.cleanup());

afterAll(() => harness.removeAll());

// ---- protocol codec (no agent) --------------------------------------------------------

describe('protocol codec', () => {
  it('decodes frames split at every byte and many frames per chunk', () => {
    const frames = [
      encodeFrame(FrameType.STDOUT, 7, Buffer.from('hello')),
      encodeFrame(FrameType.PONG, 0),
      encodeFrame(FrameType.STDERR, 0xffffffff, randomBytes(70_000)),
    ];
    const all = Buffer.concat(frames);
    const one = new FrameDecoder().push(all);
    expect(one.map((f) => [f.type, f.stream, f.payload.length])).toEqual([
      [FrameType.STDOUT, 7, 5], [FrameType.PONG, 0, 0], [FrameType.STDERR, 0xffffffff, 70_000],
    ]);
    const d = new FrameDecoder();
    const got: Frame[] = [];
    for (let i = 0; i < all.length; i++) got.push(...d.push(all.subarray(i, i + 1)));
    expect(got.map((f) => f.payload.toString('hex'))).toEqual(one.map((f) => f.payload.toString('hex')));
    expect(d.pendingBytes).toBe(0);
  });

  it('rejects a header announcing more than 1 MiB', () => {
    const h = Buffer.alloc(HEADER_LENGTH);
    h.writeUInt32BE(MAX_PAYLOAD + 1, 0);
    h.writeUInt8(FrameType.STDOUT, 4);
    expect(() => new FrameDecoder().push(h)).toThrow(ProtocolError);
    expect(() => encodeFrame(FrameType.STDIN, 1, Buffer.alloc(MAX_PAYLOAD + 1))).toThrow(ProtocolError);
  });

  it('round-trips EXEC TLV, EXIT and skips unknown tags', () => {
    const req = { argv: ['a', 'b c', ''], env: ['A=1', 'B='], cwd: '/tmp', user: '1:2', timeoutMs: 1500, stdin: true };
    const p = encodeExecRequest(req);
    expect(decodeExecRequest(p)).toEqual(req);
    const withUnknown = Buffer.concat([encodeTlv([{ tag: 99, value: Buffer.from('x') }]), p]);
    expect(decodeExecRequest(withUnknown)).toEqual(req);
    expect(decodeTlv(p).filter((f) => f.tag === ExecTag.ARGV)).toHaveLength(3);
    expect(() => decodeTlv(p.subarray(0, p.length - 1))).toThrow(ProtocolError);
    expect(() => encodeExecRequest({ argv: [], env: [] })).toThrow(/argv/);
    expect(() => encodeExecRequest({ argv: ['a\0b'], env: [] })).toThrow(/NUL/);
    expect(() => encodeExecRequest({ argv: ['a'], env: ['NOEQUALS'] })).toThrow(/K=V/);
    const x = { how: 1 as const, code: 9, timedOut: true, durationUs: 123456789012n };
    expect(decodeExit(encodeExit(x))).toEqual(x);
  });
});

// ---- the agent ----------------------------------------------------------------------

describe('dsec-agent (not PID 1)', () => {
  it('answers HELLO and PING and logs timestamped lines', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    // "isolate" is listed when the agent holds CAP_SYS_ADMIN, as it inherits from a root
    // test runner (test/unit/agent-isolated.test.ts and docs/AGENT_PROTOCOL.md).
    const capEff = BigInt('0x' + (/^CapEff:\s+([0-9a-f]+)/m.exec(fs.readFileSync('/proc/self/status', 'utf8'))?.[1] ?? '0'));
    const isolate = (capEff >> 21n) & 1n ? ['isolate'] : [];
    expect(c.info).toEqual({
      agent: 'dsec-agent', version: '0.1.0', protocol: 1, pid: a.pid, features: ['tty', 'detached', 'files', ...isolate],
      // Without --landlock unless DSEC_TEST_AGENT_ARGS adds it (test/unit/agent-landlock.test.ts covers it).
      landlock: EXTRA_AGENT_ARGS.includes('--landlock')
        ? { enforced: true, abi: expect.any(Number), scope: 'agent', writable: EXTRA_AGENT_ARGS.filter((x) => x === '--writable').length, reason: '' }
        : { enforced: false, abi: expect.any(Number), scope: 'off', writable: 0, reason: expect.stringMatching(/not requested/) },
    });
    expect(typeof (await c.ping())).toBe('number');
    expect(c.closed).toBe(false);
    c.close();
    expect(c.closed).toBe(true);
    await waitFor('log lines', () => fs.readFileSync(a.logPath, 'utf8').includes('closed'));
    const lines = fs.readFileSync(a.logPath, 'utf8').trim().split('\n');
    expect(lines.length).toBeGreaterThanOrEqual(3);
    for (const l of lines) expect(l).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z dsec-agent\[\d+\]: /);
  });

  it('passes argv exactly and keeps stdout and stderr apart', async () => {
    const c = await harness.connect(await harness.start());
    const r = await c.exec({
      argv: sh('echo out1; echo err1 >&2; printf "%s|" "$@"; echo err2 >&2', 'a b', '', "c'd"),
      env: ENV, maxOutputBytes: MiB,
    });
    expectExit(r, 0);
    expect(r.stdout.toString()).toBe("out1\na b||c'd|");
    expect(r.stderr.toString()).toBe('err1\nerr2\n');
    expect(r.stdoutTruncated || r.stderrTruncated).toBe(false);
  });

  it('gives the program only the request env (plus HOME from passwd when absent), and searches PATH from it', async () => {
    const c = await harness.connect(await harness.start());
    const r = await c.exec({ argv: ['busybox', 'env'], env: ['PATH=/nonexistent:/bin', 'FOO=bar baz', 'HOME=/h'], maxOutputBytes: MiB });
    expectExit(r, 0);
    expect(r.stdout.toString().trim().split('\n').sort()).toEqual(['FOO=bar baz', 'HOME=/h', 'PATH=/nonexistent:/bin']);
    // Without HOME, the user's passwd entry supplies it (root here: /root).
    const h = await c.exec({ argv: ['busybox', 'env'], env: ['PATH=/bin'], maxOutputBytes: MiB });
    expect(h.stdout.toString().trim().split('\n').sort()).toEqual(['HOME=/root', 'PATH=/bin']);
    const miss = await c.exec({ argv: ['busybox', 'true'], env: ['PATH=/nonexistent'], maxOutputBytes: MiB });
    expect(miss).toMatchObject({ kind: 'exec_error', errno: 2, message: 'exec: busybox: No such file or directory' });
    // No PATH in env: the default PATH finds `env` in /usr/bin or /bin.
    const dflt = await c.exec({ argv: ['env'], env: ['HOME=/x'], maxOutputBytes: MiB });
    expectExit(dflt, 0);
    expect(dflt.stdout.toString()).toBe('HOME=/x\n');
  });

  it('runs in the requested cwd and reports a bad cwd as exec_error', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const r = await c.exec({ argv: [BB, 'pwd'], env: ENV, cwd: a.dir, maxOutputBytes: MiB });
    expectExit(r, 0);
    expect(r.stdout.toString()).toBe(`${a.dir}\n`);
    const bad = await c.exec({ argv: [BB, 'pwd'], env: ENV, cwd: '/nonexistent-dsec', maxOutputBytes: MiB });
    expect(bad).toMatchObject({ kind: 'exec_error', errno: 2, message: 'chdir: /nonexistent-dsec: No such file or directory' });
  });

  it('resolves users from /etc/passwd and /etc/group', async () => {
    const c = await harness.connect(await harness.start());
    const id = async (user: string) => {
      const r = await c.exec({ argv: sh('echo $(id -u) $(id -g) $(id -G)'), env: ENV, user, maxOutputBytes: MiB });
      if (r.kind !== 'exit') return r.message;
      return r.stdout.toString().trim();
    };
    const passwd = fs.readFileSync('/etc/passwd', 'utf8');
    expect(passwd).toMatch(/^nobody:[^:]*:65534:65534:/m);
    expect(passwd).not.toMatch(/^[^:]*:[^:]*:4242:/m);
    expect(await id('0')).toMatch(/^0 0 0( |$)/);
    expect(await id('nobody')).toBe('65534 65534 65534');
    expect(await id('4242')).toBe('4242 4242 4242'); // no passwd entry: gid = uid
    expect(await id('4242:777')).toBe('4242 777 777');
    expect(await id('nobody:0')).toBe('65534 0 0');
    expect(await id('no-such-user-dsec')).toBe('user: no-such-user-dsec: unknown user');
    expect(await id('4242:no-such-group-dsec')).toBe('user: 4242:no-such-group-dsec: unknown group');
    const r = await c.exec({ argv: [BB, 'true'], env: ENV, user: 'no-such-user-dsec', maxOutputBytes: 10 });
    expect(r).toMatchObject({ kind: 'exec_error', errno: 2 });
  });

  it('is binary safe in both directions (all 256 byte values)', async () => {
    const c = await harness.connect(await harness.start());
    const all = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
    const fmt = Array.from(all, (b) => `\\${b.toString(8).padStart(3, '0')}`).join('');
    const out = await c.exec({ argv: [BB, 'printf', fmt], env: ENV, maxOutputBytes: MiB });
    expectExit(out, 0);
    expect(out.stdout.equals(all)).toBe(true);
    const payload = Buffer.concat(Array.from({ length: 64 }, () => all));
    const rt = await c.exec({ argv: [BB, 'cat'], env: ENV, stdin: payload, maxOutputBytes: MiB });
    expectExit(rt, 0);
    expect(rt.stdout.equals(payload)).toBe(true);
  });

  it('streams large stdin through a slow reader without loss', async () => {
    const c = await harness.connect(await harness.start());
    const data = randomBytes(9 * MiB); // above the agent's 4 MiB stdin high-water mark
    const r = await c.exec({
      argv: sh('sleep 0.3; sha256sum | cut -d" " -f1'), env: ENV, stdin: data, maxOutputBytes: MiB,
    });
    expectExit(r, 0);
    expect(r.stdout.toString().trim()).toBe(createHash('sha256').update(data).digest('hex'));
    // The connection still serves other streams afterwards.
    expectExit(await c.exec({ argv: [BB, 'true'], env: ENV, maxOutputBytes: 1 }), 0);
  });

  it('supports interactive stdin through startExec', async () => {
    const c = await harness.connect(await harness.start());
    const chunks: string[] = [];
    const h = c.startExec({ argv: [BB, 'cat'], env: ENV, stdin: true }, { onStdout: (b) => chunks.push(b.toString()) });
    expect(await h.pid).toBeGreaterThan(0);
    h.writeStdin(Buffer.from('ping\n'));
    await waitFor('echo of the first line', () => chunks.join('') === 'ping\n');
    h.writeStdin(Buffer.from('pong\n'));
    h.closeStdin();
    h.closeStdin(); // safe twice
    expect(() => h.writeStdin(Buffer.from('x'))).toThrow(/already closed/);
    expect(await h.done).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(chunks.join('')).toBe('ping\npong\n');
    const noStdin = c.startExec({ argv: [BB, 'true'], env: ENV });
    expect(() => noStdin.writeStdin(Buffer.from('x'))).toThrow(/without stdin/);
    await noStdin.done;
  });

  it('reports exit codes and death by signal', async () => {
    const c = await harness.connect(await harness.start());
    for (const code of [0, 1, 7, 255]) {
      const r = await c.exec({ argv: sh(`exit ${code}`), env: ENV, maxOutputBytes: 10 });
      expect(r).toMatchObject({ kind: 'exit', exitCode: code, signal: null, timedOut: false });
    }
    const killed = await c.exec({ argv: sh('kill -SEGV $$'), env: ENV, maxOutputBytes: 10 });
    expect(killed).toMatchObject({ kind: 'exit', exitCode: null, signal: 11, timedOut: false });
    if (killed.kind === 'exit') expect(killed.durationMs).toBeGreaterThan(0);
  });

  it('kills the process group when the timeout elapses', async () => {
    const c = await harness.connect(await harness.start());
    const r = await c.exec({ argv: sh('sleep 10 & echo $!; sleep 10'), env: ENV, timeoutMs: 200, maxOutputBytes: 100 });
    expect(r).toMatchObject({ kind: 'exit', exitCode: null, signal: 9, timedOut: true });
    const bg = Number(r.stdout.toString().trim());
    harness.strayPids.push(bg);
    await waitFor('the background sleep to be killed and reaped', () => procState(bg) === null);
    const fast = await c.exec({ argv: [BB, 'true'], env: ENV, timeoutMs: 60_000, maxOutputBytes: 10 });
    expect(fast).toMatchObject({ kind: 'exit', exitCode: 0, timedOut: false });
  });

  it('reports a missing program and a non-executable file as exec_error', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const missing = await c.exec({ argv: ['/nonexistent/dsec-prog'], env: ENV, maxOutputBytes: 10 });
    expect(missing).toMatchObject({ kind: 'exec_error', errno: 2, message: 'exec: /nonexistent/dsec-prog: No such file or directory' });
    const h = c.startExec({ argv: ['no-such-program-dsec'], env: ENV });
    await expect(h.pid).rejects.toThrow('exec: no-such-program-dsec: No such file or directory');
    expect(await h.done).toMatchObject({ kind: 'exec_error', errno: 2 });

    const script = path.join(a.dir, 'noexec.sh');
    fs.writeFileSync(script, '#!/bin/sh\necho hi\n', { mode: 0o644 });
    const direct = await c.exec({ argv: [script], env: ENV, maxOutputBytes: 10 });
    expect(direct).toMatchObject({ kind: 'exec_error', errno: 13, message: `exec: ${script}: Permission denied` });
    const viaPath = await c.exec({ argv: ['noexec.sh'], env: [`PATH=/nonexistent:${a.dir}`], maxOutputBytes: 10 });
    expect(viaPath).toMatchObject({ kind: 'exec_error', errno: 13 });
    // A script without #! runs through /bin/sh, like execvp.
    const bare = path.join(a.dir, 'bare');
    fs.writeFileSync(bare, 'echo bare $1\n', { mode: 0o755 });
    const r = await c.exec({ argv: [bare, 'x'], env: ENV, maxOutputBytes: 100 });
    expectExit(r, 0);
    expect(r.stdout.toString()).toBe('bare x\n');
  });

  it('runs many execs at once on one connection and across two', async () => {
    const a = await harness.start();
    const [c1, c2] = await Promise.all([harness.connect(a), harness.connect(a)]);
    const run = (c: AgentClient, i: number) =>
      c.exec({ argv: sh('sleep 0.1; echo "$1"; echo "e$1" >&2; exit $(($1 % 5))', String(i)), env: ENV, maxOutputBytes: 100 });
    const results = await Promise.all([
      ...Array.from({ length: 20 }, (_, i) => run(c1, i)),
      ...Array.from({ length: 10 }, (_, i) => run(c2, 100 + i)),
    ]);
    const ids = [...Array.from({ length: 20 }, (_, i) => i), ...Array.from({ length: 10 }, (_, i) => 100 + i)];
    results.forEach((r, k) => {
      expect(r).toMatchObject({ kind: 'exit', exitCode: ids[k] % 5 });
      expect(r.stdout.toString()).toBe(`${ids[k]}\n`);
      expect(r.stderr.toString()).toBe(`e${ids[k]}\n`);
    });
  });

  it('truncates large output at maxOutputBytes without deadlocking', async () => {
    const c = await harness.connect(await harness.start());
    const big = await c.exec({ argv: [BB, 'head', '-c', String(20 * MiB), '/dev/zero'], env: ENV, maxOutputBytes: MiB });
    expectExit(big, 0);
    expect(big.stdout.length).toBe(MiB);
    expect(big.stdoutTruncated).toBe(true);
    expect(big.stdout.every((b) => b === 0)).toBe(true);
    const both = await c.exec({
      argv: sh(`head -c ${12 * MiB} /dev/zero >&2 & head -c ${12 * MiB} /dev/zero; wait`), env: ENV, maxOutputBytes: 100,
    });
    expectExit(both, 0);
    expect([both.stdout.length, both.stderr.length, both.stdoutTruncated, both.stderrTruncated]).toEqual([100, 100, true, true]);
    const exact = await c.exec({ argv: [BB, 'head', '-c', String(3 * MiB + 17), '/dev/urandom'], env: ENV, maxOutputBytes: 4 * MiB });
    expectExit(exact, 0);
    expect([exact.stdout.length, exact.stdoutTruncated]).toEqual([3 * MiB + 17, false]);
  });

  it('never loses or reorders output produced before exit', async () => {
    const c = await harness.connect(await harness.start());
    for (let round = 0; round < 5; round++) {
      const r = await c.exec({
        argv: sh('i=0; while [ $i -lt 3000 ]; do echo "line $i"; i=$((i+1)); done; echo last >&2'),
        env: ENV, maxOutputBytes: MiB,
      });
      expectExit(r, 0);
      const lines = r.stdout.toString().trim().split('\n');
      expect(lines).toHaveLength(3000);
      expect(lines.every((l, i) => l === `line ${i}`)).toBe(true);
      expect(r.stderr.toString()).toBe('last\n');
    }
  });

  it('sends EXIT without waiting for EOF held by a backgrounded grandchild', async () => {
    const c = await harness.connect(await harness.start());
    const r = await c.exec({ argv: sh('sleep 100 & echo $!; echo started'), env: ENV, maxOutputBytes: 100 });
    expectExit(r, 0);
    const [bg, msg] = r.stdout.toString().trim().split('\n');
    harness.strayPids.push(Number(bg));
    expect(msg).toBe('started');
  });

  it('delivers SIGNAL to the process group', async () => {
    const c = await harness.connect(await harness.start());
    const h = c.startExec({ argv: [BB, 'sleep', '100'], env: ENV });
    expect(await h.pid).toBeGreaterThan(0);
    h.signal(15);
    expect(await h.done).toMatchObject({ kind: 'exit', exitCode: null, signal: 15, timedOut: false });

    let out = '';
    const t = c.startExec(
      { argv: sh('trap "echo got TERM; exit 42" TERM; echo ready; while :; do sleep 0.05; done') , env: ENV },
      { onStdout: (b) => { out += b.toString(); } },
    );
    await waitFor('the trap to be installed', () => out.includes('ready'));
    t.signal(15);
    expect(await t.done).toMatchObject({ kind: 'exit', exitCode: 42 });
    expect(out).toBe('ready\ngot TERM\n');
    expect(() => t.signal(0)).toThrow(/signal number/);
  });

  it('kills running execs when their connection closes', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    let out = '';
    const h = c.startExec({ argv: sh('sleep 100 & echo $!; wait'), env: ENV }, { onStdout: (b) => { out += b.toString(); } });
    const shPid = await h.pid;
    await waitFor('the background pid', () => out.includes('\n'));
    const bgPid = Number(out.trim());
    harness.strayPids.push(shPid, bgPid);
    expect(ppidOf(shPid)).toBe(a.pid);
    c.close();
    await expect(h.done).rejects.toThrow(/agent connection lost/);
    await waitFor('both processes to be killed and reaped', () => procState(shPid) === null && procState(bgPid) === null);
    // The agent keeps serving other connections.
    const c2 = await harness.connect(a);
    expectExit(await c2.exec({ argv: [BB, 'true'], env: ENV, maxOutputBytes: 1 }), 0);
  });

  it('rejects pending execs and calls onLost when the agent goes away', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const lost: Error[] = [];
    c.onLost((e) => lost.push(e));
    const h = c.startExec({ argv: [BB, 'sleep', '100'], env: ENV });
    const pid = await h.pid;
    harness.strayPids.push(pid);
    const ping = c.ping();
    await ping;
    process.kill(a.pid, 'SIGTERM');
    await expect(h.done).rejects.toThrow(/agent connection lost/);
    expect(c.closed).toBe(true);
    expect(lost).toHaveLength(1);
    expect(lost[0].message).toMatch(/agent connection lost/);
    await expect(c.ping()).rejects.toThrow(/agent connection lost/);
    const late = c.startExec({ argv: [BB, 'true'], env: ENV });
    await expect(late.done).rejects.toThrow(/agent connection lost/);
    await a.exited;
    expect(procState(pid)).toBeNull(); // killed and reaped by the agent before it exited
  });

  it('reaps orphans of its execs (as a child subreaper)', async () => {
    const a = await harness.start();
    const c = await harness.connect(a);
    const r = await c.exec({ argv: sh('sleep 0.3 & echo $!; exit 0'), env: ENV, maxOutputBytes: 100 });
    expectExit(r, 0);
    const orphan = Number(r.stdout.toString().trim());
    harness.strayPids.push(orphan);
    const ppid = ppidOf(orphan);
    if (ppid !== null) expect(ppid).toBe(a.pid); // reparented to the agent, not to host init
    await waitFor('the orphan to exit and be reaped', () => procState(orphan) === null);
    expectExit(await c.exec({ argv: sh('sleep 0 & exit 0'), env: ENV, maxOutputBytes: 1 }), 0);
    await waitFor('the reap to be logged', () => fs.readFileSync(a.logPath, 'utf8').includes(`reaped orphan pid=${orphan}`));
  });

  it('leaks no fds into execs', async () => {
    const c = await harness.connect(await harness.start());
    const r = await c.exec({ argv: [BB, 'ls', '/proc/self/fd'], env: ENV, maxOutputBytes: 1000 });
    expectExit(r, 0);
    // 0-2 plus the directory fd ls itself opened to list /proc/self/fd.
    expect(r.stdout.toString().trim().split(/\s+/).map(Number).sort((x, y) => x - y)).toEqual([0, 1, 2, 3]);
    const stdin = await c.exec({ argv: [BB, 'readlink', '/proc/self/fd/0'], env: ENV, maxOutputBytes: 1000 });
    expect(stdin.stdout.toString().trim()).toBe('/dev/null');
  });

  it('is not dumpable: sandbox code without CAP_SYS_PTRACE cannot read its fds', async () => {
    // Like in a container: the agent and its execs share a capability set without
    // CAP_SYS_PTRACE. Then only dumpability decides whether /proc/PID/fd/N can be read.
    const noPtrace = ['setpriv', '--bounding-set=-sys_ptrace', '--inh-caps=-sys_ptrace'];
    const a = await harness.start({ wrapper: noPtrace });
    const c = await harness.connect(a);
    const sibling = c.startExec({ argv: [BB, 'sleep', '100'], env: ENV });
    const siblingPid = await sibling.pid;
    harness.strayPids.push(siblingPid);
    const readFd0 = (pid: number) => c.exec({ argv: [BB, 'readlink', `/proc/${pid}/fd/0`], env: ENV, maxOutputBytes: 1000 });
    const control = await readFd0(siblingPid); // an ordinary (dumpable) process: readable
    expectExit(control, 0);
    expect(control.stdout.toString().trim()).toBe('/dev/null');
    const agent = await readFd0(a.pid);
    expect(agent).toMatchObject({ kind: 'exit', exitCode: 1 });
    expect(agent.stdout.length).toBe(0);
    sibling.signal(9);
    await sibling.done;
  });
});

describe('dsec-agent protocol errors', () => {
  it('answers a wrong protocol version with ERROR and closes', async () => {
    const a = await harness.start();
    const raw = harness.raw(a.socketPath);
    raw.send(FrameType.HELLO, 0, encodeU32(2));
    const f = await raw.next();
    expect([f.type, f.stream]).toEqual([FrameType.ERROR, 0]);
    expect(f.payload.toString()).toMatch(/unsupported protocol version 2/);
    await raw.closed();
  });

  it('requires HELLO first and closes on an oversized frame', async () => {
    const a = await harness.start();
    const r1 = harness.raw(a.socketPath);
    r1.send(FrameType.PING, 0, Buffer.from('x'));
    expect((await r1.next()).payload.toString()).toMatch(/expected HELLO/);
    await r1.closed();

    const r2 = harness.raw(a.socketPath);
    await r2.hello();
    const h = Buffer.alloc(HEADER_LENGTH);
    h.writeUInt32BE(MAX_PAYLOAD + 1, 0);
    h.writeUInt8(FrameType.STDIN, 4);
    h.writeUInt32BE(1, 8);
    r2.sock.write(h);
    const f = await r2.next();
    expect([f.type, f.stream]).toEqual([FrameType.ERROR, 0]);
    expect(f.payload.toString()).toMatch(/exceeds/);
    await r2.closed();
  });

  it('answers unknown types and bad EXECs on their stream and stays open', async () => {
    const a = await harness.start();
    const raw = harness.raw(a.socketPath);
    await raw.hello();
    raw.send(30, 5, Buffer.from('future')); // 28–31 are still reserved
    let f = await raw.next();
    expect([f.type, f.stream]).toEqual([FrameType.ERROR, 5]);
    expect(f.payload.toString()).toMatch(/unknown or unexpected frame type 30/);
    raw.send(FrameType.FILE_INFO, 5, Buffer.alloc(29)); // an agent→client type from a client
    f = await raw.next();
    expect([f.type, f.stream, f.payload.toString()]).toEqual([FrameType.ERROR, 5, 'unknown or unexpected frame type 16']);

    raw.send(FrameType.EXEC, 6, encodeTlv([{ tag: ExecTag.ENV, value: Buffer.from('A=1') }]));
    f = await raw.next();
    expect([f.type, f.stream]).toEqual([FrameType.ERROR, 6]);
    expect(f.payload.toString()).toMatch(/ARGV/);

    raw.send(FrameType.EXEC, 7, Buffer.from([1, 0, 0]));
    f = await raw.next();
    expect([f.type, f.stream, f.payload.toString()]).toEqual([FrameType.ERROR, 7, expect.stringMatching(/truncated/)]);

    // Unknown TLV tags are ignored; a live stream id cannot be reused.
    const req = Buffer.concat([
      encodeTlv([{ tag: 99, value: Buffer.from('ignored') }]),
      encodeExecRequest({ argv: sh('read x; echo "got $x"'), env: ENV, stdin: true }),
    ]);
    raw.send(FrameType.EXEC, 8, req);
    f = await raw.next();
    expect([f.type, f.stream]).toEqual([FrameType.STARTED, 8]);
    raw.send(FrameType.EXEC, 8, encodeExecRequest({ argv: [BB, 'true'], env: [] }));
    f = await raw.next();
    expect([f.type, f.stream]).toEqual([FrameType.ERROR, 8]);
    expect(f.payload.toString()).toMatch(/already in use/);
    raw.send(FrameType.STDIN, 8, Buffer.from('hi\n'));
    raw.send(FrameType.STDIN_EOF, 8);
    f = await raw.next();
    expect([f.type, f.stream, f.payload.toString()]).toEqual([FrameType.STDOUT, 8, 'got hi\n']);
    f = await raw.next();
    expect([f.type, f.stream]).toEqual([FrameType.EXIT, 8]);
    expect(decodeExit(f.payload)).toMatchObject({ how: 0, code: 0, timedOut: false });

    // Frames for streams that are not live are dropped silently; PING still works.
    raw.send(FrameType.STDIN, 8, Buffer.from('late'));
    raw.send(FrameType.SIGNAL, 123, encodeU32(9));
    raw.send(FrameType.PING, 0, Buffer.from('still here'));
    f = await raw.next();
    expect([f.type, f.stream, f.payload.toString()]).toEqual([FrameType.PONG, 0, 'still here']);
  });

  it('reassembles frames that arrive one byte at a time', async () => {
    const a = await harness.start();
    const raw = harness.raw(a.socketPath);
    const bytes = Buffer.concat([
      encodeFrame(FrameType.HELLO, 0, encodeU32(1)),
      encodeFrame(FrameType.PING, 0, Buffer.from('abc')),
    ]);
    for (const b of bytes) {
      raw.sock.write(Buffer.from([b]));
      await new Promise((r) => setImmediate(r));
    }
    expect((await raw.next()).type).toBe(FrameType.HELLO);
    const f = await raw.next();
    expect([f.type, f.payload.toString()]).toEqual([FrameType.PONG, 'abc']);
  });

  it('keeps serving others while one client does not read (backpressure)', async () => {
    const a = await harness.start();
    const slow = harness.raw(a.socketPath);
    await slow.hello();
    const total = 40 * MiB;
    slow.send(FrameType.EXEC, 1, encodeExecRequest({ argv: [BB, 'head', '-c', String(total), '/dev/zero'], env: ENV }));
    expect((await slow.next()).type).toBe(FrameType.STARTED);
    slow.sock.pause();
    // While the slow client's queue is full, another connection is served normally.
    const c = await harness.connect(a);
    for (let i = 0; i < 3; i++) await c.ping();
    expectExit(await c.exec({ argv: [BB, 'echo', 'fine'], env: ENV, maxOutputBytes: 100 }), 0);
    const status = fs.readFileSync(`/proc/${a.pid}/status`, 'utf8');
    const rssKb = Number(/^VmRSS:\s+(\d+)/m.exec(status)?.[1]);
    expect(rssKb).toBeLessThan(32 * 1024); // the 40 MiB were not buffered in the agent
    slow.sock.resume();
    let got = 0;
    for (;;) {
      const f = await slow.next();
      if (f.type === FrameType.STDOUT) { got += f.payload.length; continue; }
      expect(f.type).toBe(FrameType.EXIT);
      expect(decodeExit(f.payload)).toMatchObject({ how: 0, code: 0 });
      break;
    }
    expect(got).toBe(total);
  });
});

describe('AgentClient.connect failures', () => {
  it('rejects clearly when nothing listens', async () => {
    await expect(AgentClient.connect(path.join(harness.tmpRoot, 'missing.sock'))).rejects.toThrow(/cannot connect to agent at .*missing\.sock/);
  });

  it('rejects on timeout and on a protocol version mismatch', async () => {
    const dir = fs.mkdtempSync(path.join(harness.tmpRoot, 'fake-'));
    const conns = new Set<net.Socket>();
    const mute = net.createServer((s) => { conns.add(s); /* never answers */ });
    await new Promise<void>((r) => mute.listen(path.join(dir, 'mute.sock'), r));
    const wrong = net.createServer((s) => {
      conns.add(s);
      s.once('data', () => s.write(encodeFrame(FrameType.HELLO, 0, Buffer.concat([encodeU32(2), Buffer.from('{}')]))));
    });
    await new Promise<void>((r) => wrong.listen(path.join(dir, 'wrong.sock'), r));
    try {
      await expect(AgentClient.connect(path.join(dir, 'mute.sock'), { timeoutMs: 200 })).rejects.toThrow(/did not complete within 200 ms/);
      await expect(AgentClient.connect(path.join(dir, 'wrong.sock'))).rejects.toThrow(/speaks protocol version 2/);
    } finally {
      for (const s of conns) s.destroy();
      await Promise.all([mute, wrong].map((s) => new Promise<void>((r) => s.close(() => r()))));
    }
  });
});
