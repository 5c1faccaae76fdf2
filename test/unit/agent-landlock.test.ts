/**
 * Landlock in the agent (`--landlock`, `--writable PATH`; native/agent/landlock.c,
 * docs/AGENT_PROTOCOL.md "Agent flags"), with the agent run as a normal process on the
 * host (test/fixtures/agent.ts). Landlock needs no privilege and holds for root too, so
 * the ruleset can be checked here exactly as a sandbox gets it: what is granted works
 * (writable paths, /dev/null, terminals, pipes, signals between execs, the file API),
 * what is not is refused (writes elsewhere, /proc/self/..., device ioctls), and each
 * refusal is shown to be Landlock's by the same command succeeding without `--landlock`.
 * The ruleset inside real sandboxes and fncall workers: test/attacks/filesystem.test.ts.
 * The other agent suites run under Landlock too with
 * `DSEC_TEST_AGENT_ARGS="--landlock --writable /tmp" npx vitest run test/unit/agent*.test.ts`.
 */
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import type { AgentClient, AgentExecResult } from '../../daemon/agent/client.js';
import { AGENT, AgentHarness, BB, buildAgent, waitFor } from '../fixtures/agent.js';

const ENV = ['PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin'];
const harness = new AgentHarness({ prefix: 'dsec-agent-ll-', extraArgs: false });
buildAgent();
/** The kernel's Landlock ABI (0: none), from the agent itself; read at collection time, so tests can be skipped on a kernel without it. */
const abi = (JSON.parse(execFileSync(AGENT, ['--landlock-abi'], { encoding: 'utf8' })) as { abi: number }).abi;

afterEach(() => harness.cleanup());
afterAll(() => harness.removeAll());

async function sh(c: AgentClient, script: string): Promise<AgentExecResult> {
  return c.exec({ argv: [BB, 'sh', '-c', script], env: ENV, maxOutputBytes: 1 << 20 });
}

function text(r: AgentExecResult): { code: number | null; out: string; err: string } {
  if (r.kind !== 'exit') throw new Error(`exec_error: ${r.message}`);
  return { code: r.exitCode, out: r.stdout.toString(), err: r.stderr.toString() };
}

/** Two fresh directories root may write: one the agent is told is writable, one it is not. */
function dirs(): { writable: string; other: string } {
  const writable = fs.mkdtempSync(path.join(harness.tmpRoot, 'w-'));
  const other = fs.mkdtempSync(path.join(harness.tmpRoot, 'o-'));
  return { writable, other };
}

describe('--landlock-abi', () => {
  it('prints the ABI the kernel has (7 on this host: Linux 6.18)', () => {
    expect(abi).toBeGreaterThanOrEqual(1);
  });
});

describe.skipIf(abi === 0)('the agent under Landlock', () => {
  it('HELLO says whether Landlock is in force, and its scope', async () => {
    const plain = await harness.connect(await harness.start());
    expect(plain.info.landlock).toEqual({ enforced: false, abi, scope: 'off', writable: 0, reason: expect.stringMatching(/not requested/) });
    const { writable } = dirs();
    const ll = await harness.connect(await harness.start({ args: ['--landlock', '--writable', writable] }));
    expect(ll.info.landlock).toEqual({ enforced: true, abi, scope: 'agent', writable: 1, reason: '' });
  });

  it('writable paths get every right; everything else is read and execute only', async () => {
    const { writable: w, other: o } = dirs();
    fs.writeFileSync(path.join(o, 'old'), 'old\n');
    const c = await harness.connect(await harness.start({ args: ['--landlock', '--writable', w] }));
    // Everything a build does in its work dir: create, write, rename across dirs, link, fifo, truncate, remove.
    expect(text(await sh(c, `cd ${w} && echo hi > a && mkdir d && mv a d/b && ln -s b d/l && ln d/b h && mkfifo f && : > d/b && cat ${o}/old && rm -r d h f && ls -A`)))
      .toEqual({ code: 0, out: 'old\n', err: '' });
    for (const cmd of [`echo x > ${o}/new`, `echo x >> ${o}/old`, `mkdir ${o}/d`, `rm ${o}/old`, `mv ${o}/old ${w}/moved`, `ln -s x ${o}/l`]) {
      const r = text(await sh(c, cmd));
      expect({ cmd, code: r.code, err: r.err }).toEqual({ cmd, code: expect.any(Number), err: expect.stringMatching(/Permission denied/) });
      expect(r.code).not.toBe(0);
    }
    expect(fs.readdirSync(o)).toEqual(['old']);
    expect(fs.readFileSync(path.join(o, 'old'), 'utf8')).toBe('old\n');
    // Reading and running anything stays allowed.
    expect(text(await sh(c, 'ls / >/dev/null && cat /proc/self/status >/dev/null && echo ok'))).toEqual({ code: 0, out: 'ok\n', err: '' });
  });

  it('/dev: /dev/null and friends work; /proc/self/... and device ioctls do not (Landlock, not permissions: both work without it)', async () => {
    const probe = 'echo x > /dev/null && head -c 8 /dev/urandom | wc -c && echo y > /proc/self/comm; echo comm=$?; stty -F /dev/null 2>&1; echo stty=$?';
    const plain = text(await sh(await harness.connect(await harness.start()), probe));
    expect(plain.out).toMatch(/^8\ncomm=0\n.*Inappropriate ioctl.*\nstty=1\n$/s);
    const { writable } = dirs();
    const ll = text(await sh(await harness.connect(await harness.start({ args: ['--landlock', '--writable', writable] })), probe));
    expect(ll.out).toMatch(/^8\ncomm=1\n/);
    expect(ll.err).toMatch(/\/proc\/self\/comm.*Permission denied/);
    // IOCTL_DEV (ABI 5): a device ioctl is refused with EACCES instead of reaching the driver (ENOTTY).
    if (abi >= 5) expect(ll.out).toMatch(/stty: \/dev\/null: Permission denied\nstty=1\n$/);
  });

  it('terminals keep their ioctls: a PTY exec sets and reads its window size', async () => {
    const { writable } = dirs();
    const c = await harness.connect(await harness.start({ args: ['--landlock', '--writable', writable] }));
    let out = '';
    const h = c.startExec({ argv: [BB, 'sh', '-c', 'stty size; stty -echo && echo raw=$?; tty >/dev/null && echo tty'], env: ENV, tty: { rows: 33, cols: 77 } }, {
      onStdout: (b) => { out += b.toString(); },
    });
    const r = await h.done;
    expect(r).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(out.replace(/\r/g, '')).toBe('33 77\nraw=0\ntty\n');
  });

  it('execs share one domain: one exec signals another', async () => {
    const { writable } = dirs();
    const c = await harness.connect(await harness.start({ args: ['--landlock', '--writable', writable] }));
    const bg = text(await sh(c, 'sleep 60 >/dev/null 2>&1 & echo $!'));
    const pid = Number(bg.out.trim());
    harness.strayPids.push(pid);
    expect(text(await sh(c, `kill ${pid} && echo sent`))).toEqual({ code: 0, out: 'sent\n', err: '' });
    await waitFor('the signalled sleep to exit', () => !fs.existsSync(`/proc/${pid}`) || fs.readFileSync(`/proc/${pid}/stat`, 'utf8').includes(') Z'));
  });

  it('the file API is restricted like execs', async () => {
    const { writable: w, other: o } = dirs();
    const c = await harness.connect(await harness.start({ args: ['--landlock', '--writable', w] }));
    await c.mkdir(path.join(w, 'sub/deeper'), { parents: true });
    expect(await c.writeFile(path.join(w, 'sub/deeper/f'), Buffer.from('data'))).toEqual({ bytes: 4 });
    await expect(c.writeFile(path.join(o, 'f'), Buffer.from('data'))).rejects.toMatchObject({ kind: 'FailedPrecondition', errno: 13 });
    await expect(c.mkdir(path.join(o, 'd'))).rejects.toMatchObject({ kind: 'FailedPrecondition', errno: 13 });
    expect(fs.readdirSync(o)).toEqual([]);
    expect(fs.readFileSync(path.join(w, 'sub/deeper/f'), 'utf8')).toBe('data');
  });

  it('a --writable path that does not exist is fatal at start (exit 1), never skipped', async () => {
    const a = await harness.start({ args: ['--landlock', '--writable', '/nonexistent-dsec-path'] });
    await a.exited;
    expect(a.child.exitCode).toBe(1);
    expect(fs.readFileSync(a.logPath, 'utf8')).toMatch(/fatal: --landlock: open \/nonexistent-dsec-path: No such file or directory/);
  });

  it('a --writable path with a symlink in it is fatal at start, never granted to the target (also without openat2)', async () => {
    const { writable, other } = dirs();
    fs.symlinkSync(other, path.join(writable, 'last'));
    fs.mkdirSync(path.join(other, 'sub'));
    fs.symlinkSync(other, path.join(writable, 'mid'));
    for (const [w, env] of [[path.join(writable, 'last'), {}], [path.join(writable, 'mid', 'sub'), {}], [path.join(writable, 'last'), { DSEC_AGENT_NO_OPENAT2: '1' }]] as const) {
      const a = await harness.start({ args: ['--landlock', '--writable', w], env: { ...process.env, ...env } });
      await a.exited;
      expect({ w, env, code: a.child.exitCode }).toEqual({ w, env, code: 1 });
      expect(fs.readFileSync(a.logPath, 'utf8')).toContain(`fatal: --landlock: open ${w}: Too many levels of symbolic links (a writable path must not contain a symlink)`);
    }
    // The same directory named without the symlink is fine.
    const ok = await harness.connect(await harness.start({ args: ['--landlock', '--writable', other] }));
    expect(ok.info.landlock.enforced).toBe(true);
  });

  it('refuses a relative --writable path (usage, exit 2)', async () => {
    const a = await harness.start({ args: ['--landlock', '--writable', 'relative'] });
    await a.exited;
    expect(a.child.exitCode).toBe(2);
  });
});
