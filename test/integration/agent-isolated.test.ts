/**
 * Isolated execs (EXEC ISOLATE) in a real fncall worker (slot 24): a dsecd (harness.ts)
 * makes an ordinary busybox sandbox, and a worker container runs beside it on the same
 * rootfs with the spec `buildSpec({ worker: true })` makes (test/fixtures/worker.ts; dsecd
 * does not create workers through its API yet). Calls go straight to the worker's agent.
 *
 * Proves that nothing of a call survives it — files in /tmp, /dev/shm and scratch mounts,
 * background and daemonized processes (checked from the host in the worker's cgroup),
 * environment, SysV shm/sem/msg, POSIX shm and message queues — that a timeout kills the
 * whole tree, that exit codes, signals and exec errors are reported exactly as for plain
 * execs, and that the command never holds more capabilities than a plain exec (the
 * worker's agent and its call hosts hold CAP_SYS_ADMIN for themselves only, out of every
 * call's reach). Calls without a TTY go to call hosts (native/agent/callhost.h), which
 * serve one call after another; a TTY call gets a namespace init of its own.
 *
 * SysV IPC and message queues are probed with a tiny static C helper compiled here
 * (busybox has no ipcs and the image has no python), copied into the sandbox.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentClient, type AgentExecRequest, type AgentExecResult } from '../../daemon/agent/client.js';
import { DEFAULT_CAPS } from '../../daemon/drivers/container/spec.js';
import { buildAgent, waitFor } from '../fixtures/agent.js';
import { startWorkerBeside, type WorkerContainer } from '../fixtures/worker.js';
import { installStaticHelper, isCallHost as isWorkerCallHost } from './callhost-helpers.js';
import { IS_ROOT, TestDaemon } from './harness.js';

const MiB = 1 << 20;
const ENV = ['PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin'];
const PROBE = '/opt/dsec-test/ipc-probe';
const CAP_SYS_ADMIN = 21;

/**
 * `ipc-probe create|check|remove KEY`: create a SysV shm segment (holding "secret"), a
 * semaphore set and a message queue with that key, and the POSIX message queue
 * /dsec-probe; check prints whether each exists plus how many SysV objects of each kind
 * the IPC namespace holds; remove deletes them.
 */
const PROBE_C = String.raw`
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <mqueue.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
static const char *st(int rc) { return rc >= 0 ? "present" : errno == ENOENT ? "absent" : strerror(errno); }
int main(int argc, char **argv) {
  if (argc != 3) return 2;
  key_t key = (key_t)atoi(argv[2]);
  if (!strcmp(argv[1], "create")) {
    int shm = shmget(key, 4096, IPC_CREAT | IPC_EXCL | 0600);
    if (shm < 0) { perror("shmget"); return 1; }
    char *p = shmat(shm, NULL, 0);
    if (p == (void *)-1) { perror("shmat"); return 1; }
    strcpy(p, "secret");
    shmdt(p);
    if (semget(key, 1, IPC_CREAT | IPC_EXCL | 0600) < 0) { perror("semget"); return 1; }
    if (msgget(key, IPC_CREAT | IPC_EXCL | 0600) < 0) { perror("msgget"); return 1; }
    mqd_t q = mq_open("/dsec-probe", O_CREAT | O_EXCL | O_RDWR, 0600, NULL);
    if (q == (mqd_t)-1) { perror("mq_open"); return 1; }
    mq_close(q);
    printf("created\n");
    return 0;
  }
  if (!strcmp(argv[1], "check")) {
    struct shm_info si; struct seminfo se; struct msginfo mi;
    int nshm = shmctl(0, SHM_INFO, (struct shmid_ds *)&si) >= 0 ? si.used_ids : -1;
    int nsem = semctl(0, 0, SEM_INFO, &se) >= 0 ? se.semusz : -1;
    int nmsg = msgctl(0, MSG_INFO, (struct msqid_ds *)&mi) >= 0 ? mi.msgpool : -1;
    int shm = shmget(key, 0, 0); printf("shm=%s ", st(shm));
    int sem = semget(key, 0, 0); printf("sem=%s ", st(sem));
    int msg = msgget(key, 0); printf("msg=%s ", st(msg));
    mqd_t q = mq_open("/dsec-probe", O_RDONLY); printf("mq=%s ", st(q == (mqd_t)-1 ? -1 : 0));
    printf("shm_ids=%d sem_ids=%d msg_queues=%d\n", nshm, nsem, nmsg);
    return 0;
  }
  if (!strcmp(argv[1], "remove")) {
    shmctl(shmget(key, 0, 0), IPC_RMID, NULL);
    semctl(semget(key, 0, 0), 0, IPC_RMID);
    msgctl(msgget(key, 0), IPC_RMID, NULL);
    mq_unlink("/dsec-probe");
    return 0;
  }
  return 2;
}
`;

function sh(script: string): string[] {
  return ['sh', '-c', script];
}

function ok(r: AgentExecResult): string {
  if (r.kind !== 'exit') throw new Error(`exec failed: ${r.message}`);
  if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode} signal ${r.signal}: ${r.stderr.toString()}`);
  return r.stdout.toString();
}

/** The parts of an outcome that must be identical for plain and isolated execs. */
function outcome(r: AgentExecResult): Record<string, unknown> {
  return r.kind === 'exit'
    ? { kind: r.kind, exitCode: r.exitCode, signal: r.signal, timedOut: r.timedOut, stdout: r.stdout.toString(), stderr: r.stderr.toString() }
    : { kind: r.kind, errno: r.errno, message: r.message };
}

/** Cap* lines of /proc/self/status as a map (CapInh, CapPrm, CapEff, CapBnd, CapAmb). */
function caps(status: string): Record<string, bigint> {
  const out: Record<string, bigint> = {};
  for (const m of status.matchAll(/^(Cap\w+):\s+([0-9a-f]+)$/gm)) out[m[1]] = BigInt(`0x${m[2]}`);
  return out;
}

/** The capability mask of DEFAULT_CAPS (kernel numbering). */
function defaultCapMask(): bigint {
  const num: Record<string, number> = {
    CAP_CHOWN: 0, CAP_DAC_OVERRIDE: 1, CAP_FOWNER: 3, CAP_FSETID: 4, CAP_KILL: 5, CAP_SETGID: 6, CAP_SETUID: 7,
    CAP_SETPCAP: 8, CAP_NET_BIND_SERVICE: 10, CAP_NET_RAW: 13, CAP_SYS_CHROOT: 18, CAP_MKNOD: 27, CAP_AUDIT_WRITE: 29,
    CAP_SETFCAP: 31,
  };
  return DEFAULT_CAPS.reduce((m, c) => m | (1n << BigInt(num[c])), 0n);
}

describe.skipIf(!IS_ROOT)('isolated execs in an fncall worker', () => {
  let d: TestDaemon;
  let sb: string;
  let w: WorkerContainer;
  let c: AgentClient;
  /** A connection to the ordinary sandbox's agent (the worker's twin without `worker`). */
  let ordinary: AgentClient;
  const iso = (req: Omit<AgentExecRequest, 'env'> & { env?: string[]; stdin?: Buffer }, isolate = {}) =>
    c.exec({ env: ENV, maxOutputBytes: MiB, ...req, isolate });
  const plain = (req: Omit<AgentExecRequest, 'env'> & { env?: string[]; stdin?: Buffer }) => c.exec({ env: ENV, maxOutputBytes: MiB, ...req });
  /** Whether host pid p is one of the worker agent's call hosts (callhost-helpers.ts). */
  const isCallHost = (p: number): boolean => isWorkerCallHost(w.pid, p);
  /** Host pids in the worker's cgroup other than its agent and its call hosts. */
  const strays = async () => (await w.cgroups.pids(w.id)).filter((p) => p !== w.pid && !isCallHost(p));

  beforeAll(async () => {
    buildAgent();
    d = await TestDaemon.start({ slot: 24 });
    // The probe's directory is a writable place of the ordinary sandbox (dsecd creates it; the top level is read-only).
    sb = (await d.client.createSandbox({ image: 'busybox', filesystem: { writable_paths: [path.dirname(PROBE)] } })).id;
    ordinary = await AgentClient.connect(path.join(d.root, 'sandboxes', sb, 'agent.sock'));
    // The probe goes in through the ordinary sandbox (the worker's image is read-only).
    await installStaticHelper(ordinary, PROBE, PROBE_C);
    w = await startWorkerBeside(d.root, sb, `wk-iso-${process.pid}`);
    c = await AgentClient.connect(w.socketPath);
  });

  afterAll(async () => {
    c?.close();
    ordinary?.close();
    await w?.stop();
    await d?.cleanup();
  });

  it('only a worker agent offers "isolate"; it keeps CAP_SYS_ADMIN out of its bounding set', async () => {
    expect(c.info.features).toContain('isolate');
    expect(c.info.pid).toBe(1);
    expect(ordinary.info.features).not.toContain('isolate');
    expect(() => ordinary.startExec({ argv: ['true'], env: ENV, isolate: {} })).toThrow(/does not support "isolate"/);
    const log = fs.readFileSync(w.logPath, 'utf8');
    expect(log).toMatch(/worker: CAP_SYS_ADMIN dropped from the bounding set/);
    expect(log).toMatch(/isolate=yes/);
    // The agent itself: CAP_SYS_ADMIN effective, not in the bounding set (read from the host).
    const agent = caps(fs.readFileSync(`/proc/${w.pid}/status`, 'utf8'));
    expect((agent.CapEff >> BigInt(CAP_SYS_ADMIN)) & 1n).toBe(1n);
    expect((agent.CapBnd >> BigInt(CAP_SYS_ADMIN)) & 1n).toBe(0n);
    expect(agent.CapInh).toBe(0n);
  });

  it('commands hold exactly the capabilities of a plain exec in an ordinary sandbox; the call host keeps CAP_SYS_ADMIN out of their reach', async () => {
    const read = 'cat /proc/self/status';
    const inOrdinary = caps(ok(await ordinary.exec({ argv: sh(read), env: ENV, maxOutputBytes: MiB })));
    const plainW = caps(ok(await plain({ argv: sh(read) })));
    const isoW = caps(ok(await iso({ argv: sh(read) })));
    expect(inOrdinary.CapEff).toBe(defaultCapMask());
    expect(plainW).toEqual(inOrdinary);
    expect(isoW).toEqual(inOrdinary);
    // A non-root user gets nothing, as in a plain exec.
    const nobody = caps(ok(await iso({ argv: sh(read), user: '65534' })));
    expect([nobody.CapEff, nobody.CapPrm]).toEqual([0n, 0n]);
    // pid 1 of the call is its call host: CAP_SYS_ADMIN effective (it mounts each call's
    // tmpfs), out of its bounding and inheritable sets (read from the host), non-dumpable;
    // the call does not even see it (the fresh /proc is hidepid=invisible), let alone read
    // its memory, environment, root or fds.
    const hosts = (await w.cgroups.pids(w.id)).filter(isCallHost);
    expect(hosts.length).toBeGreaterThan(0);
    for (const h of hosts) {
      const hc = caps(fs.readFileSync(`/proc/${h}/status`, 'utf8'));
      expect((hc.CapEff >> BigInt(CAP_SYS_ADMIN)) & 1n).toBe(1n);
      for (const set of ['CapInh', 'CapBnd'] as const) expect((hc[set] >> BigInt(CAP_SYS_ADMIN)) & 1n).toBe(0n);
    }
    const reach = ok(await iso({ argv: sh('for f in /proc/1/status /proc/1/mem /proc/1/environ /proc/1/root/etc/passwd; do head -c1 $f >/dev/null 2>&1 && echo "$f readable" || echo "$f refused"; done; readlink /proc/1/fd/0 >/dev/null 2>&1 && echo fds readable || echo fds refused') }));
    expect(reach).toBe('/proc/1/status refused\n/proc/1/mem refused\n/proc/1/environ refused\n/proc/1/root/etc/passwd refused\nfds refused\n');
    // So the command cannot mount or make namespaces of its own.
    const r = await iso({ argv: sh('mount -t tmpfs x /tmp 2>&1; unshare -m true 2>&1; echo done') });
    expect(ok(r)).toMatch(/Operation not permitted|Permission denied/);
  });

  it('a file written in /tmp, /dev/shm or a scratch dir by one call is gone in the next', async () => {
    const scratch = [{ path: '/tmp/work', bytes: 2 * MiB }];
    ok(await iso({ argv: sh('echo a > /tmp/f && echo b > /dev/shm/f && echo c > /tmp/work/f && cat /tmp/f /dev/shm/f /tmp/work/f') }, { scratch }));
    const r = await iso({ argv: sh('ls -A /tmp /dev/shm; ls /tmp/work 2>&1; true') });
    expect(ok(r)).toBe('/dev/shm:\n\n/tmp:\nls: /tmp/work: No such file or directory\n');
    // Nor did anything reach the worker itself (its plain execs see the image's dirs).
    expect(ok(await plain({ argv: sh('ls -A /tmp /dev/shm') }))).toBe('/dev/shm:\n\n/tmp:\n');
  });

  it('everything outside the fresh mounts is read-only, including /dev', async () => {
    const r = await iso({ argv: sh('for p in /etc/x /root/x /dev/x /x; do touch $p 2>&1; done; echo x > /dev/null && echo devnull-ok') });
    expect(ok(r)).toBe([
      'touch: /etc/x: Read-only file system', 'touch: /root/x: Read-only file system',
      'touch: /dev/x: Read-only file system', 'touch: /x: Read-only file system', 'devnull-ok', '',
    ].join('\n'));
  });

  it('a background process left by a call is killed when the call returns (checked in the worker cgroup from the host)', async () => {
    // Control: a plain exec's background process outlives it, and the check sees it.
    const p = ok(await plain({ argv: sh('sleep 100 >/dev/null 2>&1 & echo $!') }));
    expect(Number(p)).toBeGreaterThan(1);
    expect((await strays()).length).toBe(1);
    ok(await plain({ argv: ['kill', '-9', p.trim()] }));
    await waitFor('the plain background sleep to go', async () => (await strays()).length === 0);

    const r = await iso({ argv: sh('sleep 100 & setsid sleep 100 & (sleep 100 &); echo started') });
    expect(ok(r)).toBe('started\n');
    // No waiting: the kernel killed and reaped the call's pid namespace before the agent saw its init exit.
    expect(await strays()).toEqual([]);
  });

  it('an environment change does not persist', async () => {
    ok(await iso({ argv: sh('export LEAK=1; echo "export LEAK2=1" >> /root/.profile 2>/dev/null; echo LEAK3=1 > /tmp/env; true') }));
    const r = await iso({ argv: ['env'], env: [...ENV, 'HOME=/root'] });
    expect(ok(r).trim().split('\n').sort()).toEqual(['HOME=/root', ...ENV].sort());
  });

  it('SysV shm, semaphores, message queues, POSIX mqueues and /dev/shm do not persist, and calls do not see the worker\'s', async () => {
    const empty = 'shm=absent sem=absent msg=absent mq=absent shm_ids=0 sem_ids=0 msg_queues=0\n';
    expect(ok(await iso({ argv: sh(`${PROBE} create 4242 && ${PROBE} check 4242 && echo s > /dev/shm/sem.x && ls /dev/shm`) }))).toBe(
      'created\nshm=present sem=present msg=present mq=present shm_ids=1 sem_ids=1 msg_queues=1\nsem.x\n');
    expect(ok(await iso({ argv: [PROBE, 'check', '4242'] }))).toBe(empty);
    expect(ok(await iso({ argv: ['ls', '/dev/shm'] }))).toBe('');
    // Nor did they land in the worker's own IPC namespace.
    expect(ok(await plain({ argv: [PROBE, 'check', '4242'] }))).toBe(empty);
    // The other way round: objects of the worker (a plain exec's) are invisible to calls.
    ok(await plain({ argv: [PROBE, 'create', '4343'] }));
    try {
      expect(ok(await plain({ argv: [PROBE, 'check', '4343'] }))).toMatch(/^shm=present sem=present msg=present mq=present/);
      expect(ok(await iso({ argv: [PROBE, 'check', '4343'] }))).toBe(empty);
    } finally {
      ok(await plain({ argv: [PROBE, 'remove', '4343'] }));
    }
  });

  it('a timeout kills the whole tree, daemonized processes included', async () => {
    const r = await iso({ argv: sh('sleep 100 & setsid sleep 100 & (sleep 100 &); (trap "" TERM HUP; sleep 100) & sleep 100'), timeoutMs: 700 });
    expect(r).toMatchObject({ kind: 'exit', exitCode: null, signal: 9, timedOut: true });
    expect(await strays()).toEqual([]);
  });

  it('reports exit codes, signals, exec errors and timeouts exactly like a plain exec', async () => {
    const cases: { argv: string[]; timeoutMs?: number; user?: string; cwd?: string; stdin?: Buffer }[] = [
      { argv: ['true'] },
      { argv: sh('exit 42') },
      { argv: sh('echo out; echo err >&2; exit 3') },
      { argv: sh('kill -TERM $$') },
      { argv: sh('kill -SEGV $$') },
      { argv: sh('kill -KILL $$') },
      { argv: sh('sleep 5'), timeoutMs: 200 },
      { argv: ['/nonexistent'] },
      { argv: ['/etc/passwd'] },
      { argv: ['true'], user: 'no-such-user' },
      { argv: ['pwd'], cwd: '/nonexistent' },
      { argv: ['pwd'], cwd: '/tmp' },
      { argv: sh('id -u; id -g'), user: '65534:65534' },
      { argv: ['cat'], stdin: Buffer.from('through stdin') },
    ];
    for (const k of cases) {
      const [a, b] = [await plain(k), await iso(k)];
      expect({ argv: k.argv, ...outcome(b) }).toEqual({ argv: k.argv, ...outcome(a) });
    }
    // A signal sent with SIGNAL reaches the command (the namespace init ignores it and
    // reports the command's death, not its own).
    for (const sig of [15, 2, 9]) {
      const h = c.startExec({ argv: ['sleep', '100'], env: ENV, isolate: {} });
      await h.pid;
      h.signal(sig);
      expect(await h.done).toMatchObject({ kind: 'exit', exitCode: null, signal: sig, timedOut: false });
    }
    expect(await strays()).toEqual([]);
  });

  it('works with a tty, and STARTED carries the namespace init\'s pid', async () => {
    const out: Buffer[] = [];
    const h = c.startExec({ argv: sh('tty; echo pid=$$ ppid=$PPID'), env: ENV, tty: { rows: 24, cols: 80 }, isolate: {} }, { onStdout: (b) => out.push(b) });
    const pid = await h.pid;
    expect(pid).toBeGreaterThan(1);
    expect(await h.done).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(Buffer.concat(out).toString()).toMatch(/^\/dev\/pts\/\d+\r\npid=2 ppid=1\r\n$/);
  });

  it('/proc shows only the call, with the sandbox\'s /proc masks; sizes are bounded', async () => {
    // Only the call: pid 2 the shell (echo is a builtin); pid 1, the namespace init, is not
    // listed (hidepid: the call may not ptrace-read it).
    expect(ok(await iso({ argv: sh('cd /proc && echo [0-9]*') }))).toBe('2\n');
    // The same mounts below /proc as the worker's own (runc's masked and read-only paths),
    // the topmost of each mount point (the sandbox's own /proc is still below the fresh one).
    const below = 'awk \'$5 ~ "^/proc/" { m[$5] = $9 } END { for (k in m) print k, m[k] }\' /proc/self/mountinfo | sort';
    const own = ok(await plain({ argv: sh(below) }));
    expect(own).toMatch(/^\/proc\/sys proc$/m);
    expect(ok(await iso({ argv: sh(below) }))).toBe(own);
    expect(ok(await iso({ argv: sh('{ echo 1 > /proc/sys/kernel/hostname; } 2>&1; wc -c < /proc/timer_list') }))).toMatch(/Read-only file system\n0\n$/);
    // tmpfs sizes from the request (64 MiB each by default).
    const df = (r: AgentExecResult) => ok(r).trim().split('\n').slice(1).map((l) => l.split(/\s+/).slice(1, 2)[0]);
    expect(df(await iso({ argv: sh('df -k /tmp /dev/shm') }))).toEqual(['65536', '65536']);
    expect(df(await iso({ argv: sh('df -k /tmp /dev/shm /tmp/w') }, { tmpBytes: 4 * MiB, shmBytes: 2 * MiB, scratch: [{ path: '/tmp/w', bytes: MiB }] })))
      .toEqual(['4096', '2048', '1024']);
    const full = await iso({ argv: sh('dd if=/dev/zero of=/tmp/w/f bs=64k count=32 2>&1') }, { scratch: [{ path: '/tmp/w', bytes: MiB }] });
    expect(full).toMatchObject({ kind: 'exit', exitCode: 1 });
    expect(full.kind === 'exit' && full.stdout.toString()).toMatch(/No space left on device/);
    // A scratch path outside the fresh mounts must exist in the (read-only) image.
    expect(await iso({ argv: ['true'] }, { scratch: [{ path: '/nonexistent/w', bytes: MiB }] }))
      .toMatchObject({ kind: 'exec_error', errno: 30, message: 'isolate: mkdir /nonexistent/w: Read-only file system' });
    expect(ok(await iso({ argv: sh('df -k /root | tail -1 | awk "{print \\$2}"') }, { scratch: [{ path: '/root', bytes: 3 * MiB }] }))).toBe('3072\n');
  });

  it('consecutive calls share a call host, and each call starts as in a fresh pid namespace', async () => {
    const one = async () => {
      const out: Buffer[] = [];
      const h = c.startExec({ argv: sh('echo $$; cd /proc && echo [0-9]*'), env: ENV, isolate: {} }, { onStdout: (b) => out.push(b) });
      const pid = await h.pid;
      expect(await h.done).toMatchObject({ kind: 'exit', exitCode: 0 });
      return { pid, out: Buffer.concat(out).toString() };
    };
    const [a, b] = [await one(), await one()];
    expect(a.pid).toBe(b.pid); // STARTED names the host (its pid in the worker), which served both
    expect((await w.cgroups.pids(w.id)).filter(isCallHost).length).toBeGreaterThan(0);
    expect([a.out, b.out]).toEqual(['2\n2\n', '2\n2\n']); // pids start at 2 in each call
    // A host killed with its call (SIGNAL 9) is replaced by a new one.
    const h = c.startExec({ argv: ['sleep', '100'], env: ENV, isolate: {} });
    const killed = await h.pid;
    h.signal(9);
    expect(await h.done).toMatchObject({ kind: 'exit', signal: 9 });
    const next = await one();
    expect(next.out).toBe('2\n2\n');
    expect(next.pid).not.toBe(killed);
  });

  it('concurrent calls do not see each other', async () => {
    const n = 16;
    const rs = await Promise.all(Array.from({ length: n }, (_, i) => iso({
      argv: sh(`echo ${i} > /tmp/mine; sleep 0.2; ls /tmp; cat /tmp/mine; cd /proc && echo [0-9]*`),
    })));
    rs.forEach((r, i) => expect(ok(r)).toBe(`mine\n${i}\n2\n`));
    expect(await strays()).toEqual([]);
  });

  it('the namespace init holds none of the agent\'s fds: another exec\'s stdin still sees EOF while a call runs', async () => {
    // cat's stdin pipe exists before the call's init is cloned from the agent.
    const out: Buffer[] = [];
    const cat = c.startExec({ argv: ['cat'], env: ENV, stdin: true }, { onStdout: (b) => out.push(b) });
    await cat.pid;
    const call = c.startExec({ argv: ['sleep', '10'], env: ENV, isolate: {} });
    await call.pid;
    cat.writeStdin(Buffer.from('x'));
    cat.closeStdin();
    const first = await Promise.race([cat.done.then(() => 'cat'), call.done.then(() => 'call')]);
    expect(first).toBe('cat'); // 'call': cat saw EOF only once the call's init was gone
    expect(await cat.done).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(Buffer.concat(out).toString()).toBe('x');
    call.signal(9);
    expect(await call.done).toMatchObject({ kind: 'exit', signal: 9 });
  });

  it('a worker does not log calls that went well (its log would grow by ~2,000 lines/s)', async () => {
    const before = fs.readFileSync(w.logPath, 'utf8').split('\n').length;
    for (let i = 0; i < 20; i++) ok(await iso({ argv: sh('exit 0') }));
    expect(await iso({ argv: sh('exit 7') })).toMatchObject({ exitCode: 7 });
    expect(fs.readFileSync(w.logPath, 'utf8').split('\n').length).toBe(before);
    await iso({ argv: sh('kill -9 $$') });
    expect(fs.readFileSync(w.logPath, 'utf8')).toMatch(/killed by signal 9 after/);
  });

  it('a worker spec without CAP_SYS_ADMIN does not start (the agent refuses --worker)', async () => {
    await expect(startWorkerBeside(d.root, sb, `wk-nocap-${process.pid}`, {
      mutateSpec: (s) => {
        for (const k of ['bounding', 'effective', 'permitted']) s.process.capabilities[k] = s.process.capabilities[k].filter((x: string) => x !== 'CAP_SYS_ADMIN');
      },
    })).rejects.toThrow(/fatal: --worker: the agent has no CAP_SYS_ADMIN/);
  });
});
