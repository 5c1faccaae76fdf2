/**
 * Attacks on call hosts (native/agent/callhost.c, isolate.c callhost_main): a namespace
 * init that serves an fncall worker's isolated calls one after another. The contract
 * (docs/AGENT_PROTOCOL.md "Isolated execs", docs/SECURITY.md "fncall workers"): nothing
 * of one call is visible to the next call on the same host, and no call reaches the
 * host's CAP_SYS_ADMIN.
 *
 * Setup as test/integration/agent-isolated.test.ts: a dsecd (slot 25) with an ordinary
 * busybox sandbox, and three worker containers beside it on the same rootfs: `c` (call
 * hosts and Landlock, the default), `cn` (call hosts without --landlock, where writes to
 * /proc are not refused by a ruleset) and `co` (`--no-callhost`: a namespace init per
 * call, for comparison). A static C helper (CHK) is compiled here and copied in through
 * the ordinary sandbox.
 *
 * Every test asserts the contract; a failing test is a leak or an escape. What the host
 * does about each: unmounts a call's mounts through fds of their roots, never by path
 * (symlinks planted at nested SCRATCH paths); retires when a call changed its limits or
 * /proc settings (prlimit, oom_score_adj, coredump_filter, the autogroup's nice); keeps
 * no signal pending; serves a next call only while no other exec of the agent lives (a
 * dirfd of the host's "/" handed to a concurrent call); and a call's fresh /proc does not
 * list the host, whose counters sum its earlier calls. Tests that taint a host kill it afterwards
 * (a call SIGNAL 9'd on it), so they do not depend on each other.
 */
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AgentClient, AgentExecRequest } from '../../daemon/agent/client.js';
import type { WorkerContainer } from '../fixtures/worker.js';
import { ENV, call, isCallHost, killNextHost, kv, ok, sh, startCallhostRig, strays, type CallhostRig, type Iso } from './callhost-helpers.js';
import { IS_ROOT } from './harness.js';

const MiB = 1 << 20;
const CHK = '/opt/dsec-attack/chk';

const CHK_C = String.raw`
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>

#define IOPRIO_WHO_PROCESS 1
#define IOPRIO_CLASS_IDLE 3
static const char *res(long rc) { return rc >= 0 ? "ok" : strerror(errno); }
static void pr(const char *what, long rc) { printf("%s=%s\n", what, res(rc)); }
static void slurp(const char *label, const char *path) {
  char b[4096]; int fd = open(path, O_RDONLY); ssize_t n = fd >= 0 ? read(fd, b, sizeof b - 1) : -1;
  if (fd >= 0) close(fd);
  if (n < 0) { printf("%s=%s\n", label, strerror(errno)); return; }
  b[n] = 0; if (n && b[n - 1] == '\n') b[n - 1] = 0;
  printf("%s=%s\n", label, b);
}
static void *sleeper(void *a) { (void)a; for (;;) pause(); return NULL; }
static int clonefn(void *a) { (void)a; for (;;) pause(); return 0; }

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc < 2) return 2;
  const char *m = argv[1];
  if (!strcmp(m, "taint-sched")) {
    pr("setpriority", setpriority(PRIO_PROCESS, 1, 15));
    struct sched_param sp = { 0 };
    pr("sched_setscheduler", sched_setscheduler(1, SCHED_BATCH, &sp));
    cpu_set_t s; CPU_ZERO(&s); sched_getaffinity(0, sizeof s, &s);
    int first = -1; for (int i = 0; i < CPU_SETSIZE; i++) if (CPU_ISSET(i, &s)) { first = i; break; }
    CPU_ZERO(&s); CPU_SET(first, &s);
    pr("sched_setaffinity", sched_setaffinity(1, sizeof s, &s));
    pr("ioprio_set", syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, 1, (IOPRIO_CLASS_IDLE << 13) | 7));
    return 0;
  }
  if (!strcmp(m, "taint-rlimit")) {
    struct rlimit r = { 4096, 4096 };
    pr("prlimit_fsize", prlimit(1, RLIMIT_FSIZE, &r, NULL));
    struct rlimit n = { 100, 100 };
    pr("prlimit_nofile", prlimit(1, RLIMIT_NOFILE, &n, NULL));
    struct rlimit q = { 1000, 1000 };
    pr("prlimit_msgqueue", prlimit(1, RLIMIT_MSGQUEUE, &q, NULL));
    return 0;
  }
  if (!strcmp(m, "taint-nofile3")) {
    struct rlimit n = { 3, 3 };
    pr("prlimit_nofile3", prlimit(1, RLIMIT_NOFILE, &n, NULL));
    return 0;
  }
  if (!strcmp(m, "fd-send") || !strcmp(m, "fd-spy")) {
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    size_t l = strlen(argv[2]); memcpy(a.sun_path + 1, argv[2], l);
    socklen_t al = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + l);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    char byte = 'x';
    union { char b[CMSG_SPACE(sizeof(int))]; struct cmsghdr al; } u;
    struct iovec iov = { &byte, 1 };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b };
    if (!strcmp(m, "fd-send")) { /* hand this call's root ("/" of the host's mount namespace) to another call */
      int root = open("/", O_PATH | O_DIRECTORY);
      if (connect(s, (void *)&a, al) < 0) { printf("connect=%s\n", strerror(errno)); return 1; }
      struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
      cm->cmsg_level = SOL_SOCKET; cm->cmsg_type = SCM_RIGHTS; cm->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(cm), &root, sizeof root);
      printf("sent=%s\n", res(sendmsg(s, &mh, 0)));
      return 0;
    }
    if (bind(s, (void *)&a, al) < 0 || listen(s, 1) < 0) { printf("listen=%s\n", strerror(errno)); return 1; }
    printf("ready\n");
    int cfd = accept(s, NULL, NULL);
    if (cfd < 0 || recvmsg(cfd, &mh, 0) < 0) { printf("recv=%s\n", strerror(errno)); return 1; }
    int root; memcpy(&root, CMSG_DATA(CMSG_FIRSTHDR(&mh)), sizeof root);
    printf("got-root\n");
    int found_tmp = 0, found_cmd = 0, found_env = 0;
    for (int i = 0; i < atoi(argv[3]) * 20 && !(found_tmp && found_cmd && found_env); i++) {
      char b[4096]; ssize_t n; int f;
      if (!found_tmp && (f = openat(root, "tmp/secret", O_RDONLY)) >= 0) { n = read(f, b, sizeof b - 1); close(f); if (n > 0) { b[n] = 0; printf("tmp/secret: %s", b); found_tmp = 1; int w = openat(root, "tmp/planted-by-x", O_CREAT | O_WRONLY, 0644); printf("plant=%s\n", res(w)); } }
      for (int pid = 2; pid < 6; pid++) {
        char pth[64];
        snprintf(pth, sizeof pth, "proc/%d/cmdline", pid);
        if (!found_cmd && (f = openat(root, pth, O_RDONLY)) >= 0) { n = read(f, b, sizeof b - 1); close(f); if (n > 0) { for (ssize_t k = 0; k < n; k++) if (!b[k]) b[k] = ' '; b[n] = 0; if (strstr(b, "victim")) { printf("%s: %s\n", pth, b); found_cmd = 1; } } }
        snprintf(pth, sizeof pth, "proc/%d/environ", pid);
        if (!found_env && (f = openat(root, pth, O_RDONLY)) >= 0) { n = read(f, b, sizeof b - 1); close(f); if (n > 0) { for (ssize_t k = 0; k < n; k++) if (!b[k]) b[k] = ' '; b[n] = 0; char *v = strstr(b, "VICTIM"); if (v) { printf("%s: %s\n", pth, v); found_env = 1; } } }
      }
      usleep(50000);
    }
    printf("done\n");
    return 0;
  }
  if (!strcmp(m, "show")) {
    errno = 0; int nice = getpriority(PRIO_PROCESS, 0);
    printf("nice=%d\n", nice);
    printf("policy=%d\n", sched_getscheduler(0));
    cpu_set_t s; CPU_ZERO(&s); sched_getaffinity(0, sizeof s, &s);
    printf("cpus=%d\n", CPU_COUNT(&s));
    printf("ioprio=%ld\n", syscall(SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0));
    struct rlimit r;
    getrlimit(RLIMIT_FSIZE, &r); printf("fsize=%lld\n", (long long)r.rlim_cur);
    getrlimit(RLIMIT_NOFILE, &r); printf("nofile=%lld\n", (long long)r.rlim_cur);
    getrlimit(RLIMIT_MSGQUEUE, &r); printf("msgqueue=%lld\n", (long long)r.rlim_cur);
    slurp("oom_score_adj", "/proc/self/oom_score_adj");
    slurp("coredump_filter", "/proc/self/coredump_filter");
    char ag[256]; int fd = open("/proc/self/autogroup", O_RDONLY); ssize_t k = fd >= 0 ? read(fd, ag, sizeof ag - 1) : -1;
    if (k > 0) { ag[k] = 0; char *p = strstr(ag, "nice"); printf("autogroup=%s", p ? p : "?\n"); } else printf("autogroup=none\n");
    return 0;
  }
  if (!strcmp(m, "faults")) { /* exactly N minor page faults within 1 MiB */
    long n = atol(argv[2]); size_t len = 1 << 20; long pg = 4096;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    long done = 0;
    while (done < n) {
      for (size_t o = 0; o < len && done < n; o += pg, done++) p[o] = 1;
      madvise(p, len, MADV_DONTNEED);
    }
    printf("faulted=%ld\n", done);
    return 0;
  }
  if (!strcmp(m, "escape")) {
    /* a) a child that stops itself */
    if (fork() == 0) { setsid(); raise(SIGSTOP); for (;;) pause(); }
    /* b) a vfork parent blocked on a vfork child that never execs */
    if (fork() == 0) { if (vfork() == 0) { for (;;) pause(); } for (;;) pause(); }
    /* c) a clone child with no exit signal (a "clone child" waitpid without __WALL skips) */
    static char st1[65536], st2[65536];
    long c1 = clone(clonefn, st1 + sizeof st1, 0, NULL);
    /* d) CLONE_PARENT: a sibling of this command, i.e. a child of the host */
    long c2 = clone(clonefn, st2 + sizeof st2, CLONE_PARENT, NULL);
    /* e) a pid hopper: forks a child and exits, forever */
    if (fork() == 0) { signal(SIGHUP, SIG_IGN); signal(SIGTERM, SIG_IGN); for (;;) { pid_t p = fork(); if (p > 0) _exit(0); if (p < 0) usleep(1000); } }
    /* f) a thread group whose leader has exited */
    if (fork() == 0) { pthread_t t; pthread_create(&t, NULL, sleeper, NULL); pthread_exit(NULL); }
    /* g) a subreaper with a grandchild */
    if (fork() == 0) { prctl(PR_SET_CHILD_SUBREAPER, 1); if (fork() == 0) { if (fork() == 0) for (;;) pause(); _exit(0); } for (;;) pause(); }
    /* h) a process ignoring every catchable signal, in its own session */
    if (fork() == 0) { setsid(); for (int i = 1; i < 32; i++) signal(i, SIG_IGN); if (fork() == 0) for (;;) pause(); for (;;) pause(); }
    printf("spawned clone=%s clone_parent=%s\n", c1 > 0 ? "ok" : strerror(errno), c2 > 0 ? "ok" : strerror(errno));
    usleep(50000);
    return 0;
  }
  if (!strcmp(m, "abstract-listen") || !strcmp(m, "abstract-connect")) {
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    size_t l = strlen(argv[2]); memcpy(a.sun_path + 1, argv[2], l);
    socklen_t al = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + l);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (!strcmp(m, "abstract-connect")) { printf("connect=%s\n", res(connect(s, (void *)&a, al))); return 0; }
    if (bind(s, (void *)&a, al) < 0 || listen(s, 8) < 0) { printf("listen=%s\n", strerror(errno)); return 1; }
    if (fork() == 0) { setsid(); for (;;) { int c = accept(s, NULL, NULL); if (c >= 0) { (void)!write(c, "x", 1); close(c); } } }
    printf("listening\n");
    return 0;
  }
  if (!strcmp(m, "host-reach")) {
    int fd = (int)syscall(SYS_pidfd_open, 1, 0);
    pr("pidfd_open", fd);
    pr("pidfd_send_signal_STOP", syscall(SYS_pidfd_send_signal, fd, SIGSTOP, NULL, 0));
    pr("pidfd_send_signal_KILL", syscall(SYS_pidfd_send_signal, fd, SIGKILL, NULL, 0));
    pr("pidfd_getfd", syscall(SYS_pidfd_getfd, fd, 0, 0));
    pr("kill_KILL", kill(1, SIGKILL));
    pr("kill_STOP", kill(1, SIGSTOP));
    pr("sethostname", sethostname("evil", 4));
    pr("umount2_tmp", umount2("/tmp", MNT_DETACH));
    pr("umount2_proc", umount2("/proc", MNT_DETACH));
    pr("mount_tmpfs", mount("x", "/tmp", "tmpfs", 0, NULL));
    pr("unshare_ns", unshare(CLONE_NEWNS));
    pr("unshare_user", unshare(CLONE_NEWUSER));
    pr("unshare_ipc", unshare(CLONE_NEWIPC));
    pr("setpgid_1", setpgid(1, 0));
    usleep(20000);
    return 0;
  }
  return 2;
}
`;

describe.skipIf(!IS_ROOT)('attacks on call hosts', () => {
  let rig: CallhostRig;
  /** Worker with call hosts (the change under review). */
  let w: WorkerContainer;
  let c: AgentClient;
  /** Worker with --no-callhost (a namespace init per call: the old behaviour). */
  let wo: WorkerContainer;
  let co: AgentClient;
  /** Worker with call hosts but without --landlock (a kernel without Landlock, or a sandbox with `landlock: false`). */
  let wn: WorkerContainer;
  let cn: AgentClient;

  const iso = (cl: AgentClient, req: Omit<AgentExecRequest, 'env'> & { env?: string[]; stdin?: Buffer }, isolate: Iso = {}) =>
    cl.exec({ env: ENV, maxOutputBytes: 4 * MiB, ...req, isolate });

  beforeAll(async () => {
    rig = await startCallhostRig(25, 'atk', { path: CHK, source: CHK_C });
    ({ w, c, wo, co, wn, cn } = rig);
  }, 180_000);

  afterAll(async () => {
    await rig?.close();
  });

  // ---- what a call can do to its host (pid 1), which the host hands on to the next call ----

  /**
   * baseline (a fresh host's command) -> call A runs `taint` -> call B on the same host
   * shows what its command inherited. Returns A's output, the two views and whether the
   * same host served A and B.
   */
  async function taintThenShow(cl: AgentClient, taint: string[]) {
    await killNextHost(cl); // a fresh host for this test
    const base = await call(cl, [CHK, 'show']);
    const a = await call(cl, taint);
    const b = await call(cl, [CHK, 'show']);
    await killNextHost(cl);
    return { sameHost: base.pid === a.pid && a.pid === b.pid, a: a.out + a.err, base: kv(base.out), after: kv(b.out) };
  }

  it('nice, scheduling policy, CPU affinity and I/O priority set on pid 1 by one call do not reach the next call', async () => {
    const t = await taintThenShow(c, [CHK, 'taint-sched']);
    const old = await taintThenShow(co, [CHK, 'taint-sched']);
    console.log('[sched] callhost: A =', JSON.stringify(t.a), 'sameHost', t.sameHost, '\nbase', t.base, '\nafter', t.after);
    console.log('[sched] no-callhost: A =', JSON.stringify(old.a), '\nbase', old.base, '\nafter', old.after);
    // The old per-call init: nothing carries over.
    expect(old.after).toEqual(old.base);
    // The contract for call hosts.
    expect(t.sameHost).toBe(true);
    expect({ nice: t.after.nice, policy: t.after.policy, cpus: t.after.cpus, ioprio: t.after.ioprio })
      .toEqual({ nice: t.base.nice, policy: t.base.policy, cpus: t.base.cpus, ioprio: t.base.ioprio });
  });

  it('rlimits set on pid 1 (prlimit) by one call do not reach the next call', async () => {
    const t = await taintThenShow(c, [CHK, 'taint-rlimit']);
    const old = await taintThenShow(co, [CHK, 'taint-rlimit']);
    // A hard RLIMIT_NOFILE of 3 on the host: it can no longer receive the next call's pipe fds.
    await killNextHost(c);
    const a3 = await call(c, [CHK, 'taint-nofile3']);
    const b3 = await call(c, sh('echo hi'));
    const b3o = (await call(co, [CHK, 'taint-nofile3']), await call(co, sh('echo hi')));
    console.log('[rlimit] after a hard RLIMIT_NOFILE=3 on pid 1: A', JSON.stringify(a3.out), 'next call (same host?', a3.pid === b3.pid, '):', b3.r, JSON.stringify(b3.out + b3.err), '| no-callhost next call:', b3o.r, JSON.stringify(b3o.out));
    console.log('[rlimit] callhost: A =', JSON.stringify(t.a), '\nbase', t.base, '\nafter', t.after);
    console.log('[rlimit] no-callhost: A =', JSON.stringify(old.a), '\nafter', old.after);
    expect(old.after).toEqual(old.base);
    // The host saw its limits changed after the call and retired: the next call is another host's.
    expect(t.sameHost).toBe(false);
    expect({ fsize: t.after.fsize, nofile: t.after.nofile, msgqueue: t.after.msgqueue })
      .toEqual({ fsize: t.base.fsize, nofile: t.base.nofile, msgqueue: t.base.msgqueue });
    expect(b3o.out).toBe('hi\n');
    expect(b3.out).toBe('hi\n'); // the next (innocent) call must run
  });

  it('/proc/1/oom_score_adj, /proc/1/coredump_filter and the session\'s autogroup nice written by one call do not reach the next call', async () => {
    const taint = sh('echo 1000 > /proc/1/oom_score_adj; echo oom=$?; echo 0x1ff > /proc/1/coredump_filter; echo cdf=$?; echo 19 > /proc/self/autogroup; echo ag=$?');
    const t = await taintThenShow(cn, taint); // without Landlock: /proc writes are not refused by the ruleset
    const ll = await taintThenShow(c, taint);
    const old = await taintThenShow(co, taint);
    console.log('[proc1] callhost+landlock: A =', JSON.stringify(ll.a), '\nafter', ll.after);
    console.log('[proc1] callhost: A =', JSON.stringify(t.a), '\nbase', t.base, '\nafter', t.after);
    console.log('[proc1] no-callhost: A =', JSON.stringify(old.a), '\nafter', old.after);
    expect(old.after).toEqual(old.base);
    // Without Landlock the writes land, the host sees them after the call and retires.
    expect(t.sameHost).toBe(false);
    // With Landlock they are refused and the host serves on.
    expect(ll.sameHost).toBe(true);
    expect({ oom: ll.after.oom_score_adj, cdf: ll.after.coredump_filter, ag: ll.after.autogroup })
      .toEqual({ oom: ll.base.oom_score_adj, cdf: ll.base.coredump_filter, ag: ll.base.autogroup });
    expect({ oom: t.after.oom_score_adj, cdf: t.after.coredump_filter, ag: t.after.autogroup })
      .toEqual({ oom: t.base.oom_score_adj, cdf: t.base.coredump_filter, ag: t.base.autogroup });
  });

  it('signals a call sends to pid 1 leave nothing the next call can see (/proc/1/status SigPnd/ShdPnd)', async () => {
    const pend = (s: string) => Object.fromEntries([...s.matchAll(/^(SigPnd|ShdPnd|SigBlk):\s+([0-9a-f]+)$/gm)].map((m) => [m[1], m[2]]));
    const run = async (cl: AgentClient) => {
      await killNextHost(cl);
      await call(cl, ['true']);
      const base = await call(cl, ['cat', '/proc/1/status']);
      const a = await call(cl, sh('kill -TERM 1; kill -HUP 1; kill -INT 1; kill -USR1 1; echo sent'));
      const b = await call(cl, ['cat', '/proc/1/status']);
      await killNextHost(cl);
      return { same: base.pid === b.pid && a.pid === b.pid, base: pend(base.out), after: pend(b.out) };
    };
    const t = await run(c);
    const old = await run(co);
    console.log('[signals] callhost', t, '\n[signals] no-callhost', old);
    expect(old.after.ShdPnd).toBe(old.base.ShdPnd);
    expect(t.same).toBe(true);
    expect(t.after.ShdPnd).toBe(t.base.ShdPnd);
  });

  it('pid 1\'s counters, which sum its earlier calls\' resource use, are not listed for a call', async () => {
    // /proc/1/stat's children totals (cminflt, cutime, ...) add up every call a host
    // reaped. The call's fresh /proc is hidepid=invisible: the host is not there at all.
    await killNextHost(c);
    await call(c, [CHK, 'faults', '50000']);
    const b = await call(c, sh('cat /proc/1/stat 2>&1; ls /proc | grep -c "^1$"'));
    await killNextHost(c);
    expect(b.out).toBe("cat: can't open '/proc/1/stat': No such file or directory\n0\n");
  });

  // ---- mounts: the host's per-call unmount follows paths the call controlled ----

  it('a call cannot make its host unmount /proc (or a mask on it) through a symlink at a nested SCRATCH path', async () => {
    const scratch = [{ path: '/tmp/a/b', bytes: MiB }];
    const PROCVIEW = 'cd /proc && echo [0-9]*; grep -c " /proc/sys " /proc/self/mountinfo; v=$(cat /proc/sys/net/ipv4/ping_group_range); (echo "$v" > /proc/sys/net/ipv4/ping_group_range) 2>/dev/null && echo sys-written || echo sys-refused';
    const run = async (cl: AgentClient, target: string) => {
      await killNextHost(cl);
      const before = await call(cl, sh(PROCVIEW));
      // A: swap the scratch mount point's parent for a directory holding a symlink to `target`.
      const a = await call(cl, sh(`mv /tmp/a /tmp/z && mkdir /tmp/a && ln -s ${target} /tmp/a/b && echo planted`), { scratch });
      const after = await call(cl, sh(`${PROCVIEW}; cat /proc/1/cmdline | tr "\\0" " "; echo`));
      await killNextHost(cl);
      return { same: before.pid === after.pid && a.pid === after.pid, a: a.out + a.err, before: before.out, after: after.out + after.err };
    };
    const t = await run(c, '/proc');
    const o = await run(co, '/proc');
    console.log('[umount-redirect /proc] callhost', t, '\n[umount-redirect /proc] no-callhost', o);
    const m = await run(c, '/proc/sys');
    console.log('[umount-redirect /proc/sys] callhost', m);
    const mn = await run(cn, '/proc/sys');
    console.log('[umount-redirect /proc/sys] callhost without landlock', mn);
    expect(o.after.split('\n')[0]).toBe('2');
    expect(t.same).toBe(true);
    // The contract: the next call sees only itself in /proc, with the masks of a fresh init.
    expect(t.after.split('\n')[0]).toBe('2');
    expect(m.after.split('\n').slice(1, 3)).toEqual(m.before.split('\n').slice(1, 3));
    expect(mn.after.split('\n').slice(1, 3)).toEqual(mn.before.split('\n').slice(1, 3));
  });

  it('the SCRATCH path fncall run-code uses (/tmp/io, right below /tmp) cannot be moved or replaced by the call', async () => {
    const a = await call(c, sh('mv /tmp/io /tmp/x 2>&1; rmdir /tmp/io 2>&1; rm -rf /tmp/io 2>&1; ls -d /tmp/io'), { scratch: [{ path: '/tmp/io', bytes: MiB }] });
    console.log('[scratch /tmp/io]', a.out);
    expect(a.out).toMatch(/\/tmp\/io\n$/);
    expect(a.out).toMatch(/busy/i);
  });

  it('impact of the /proc redirect: the next call on the poisoned host sees concurrent calls of other hosts (argv, environ, /tmp, mem)', async () => {
    const scratch = [{ path: '/tmp/a/b', bytes: MiB }];
    // B lists every process it can see and, for the victim's (found by its argv), what it can read of it.
    const scan = 'sleep 1; for p in /proc/[0-9]*; do c=$(tr "\\0" " " 2>/dev/null < $p/cmdline); echo "${p#/proc/}: $c" | cut -c1-60; case "$c" in *victim-ar[g]v*) echo "victim argv: $c" | cut -c 45-; (tr "\\0" "\\n" < $p/environ | grep VICTIM) 2>&1 | head -1; cat $p/root/tmp/secret 2>&1 | head -1; (exec 3<$p/mem) 2>/dev/null && echo mem-open-ok || echo mem-refused;; esac; done; echo scanned';
    const results: Record<string, string> = {};
    for (const [name, cl] of [['landlock', c], ['no-landlock', cn]] as const) {
      await killNextHost(cl);
      const a = await call(cl, sh('mv /tmp/a /tmp/z && mkdir /tmp/a && ln -s /proc /tmp/a/b && echo planted'), { scratch });
      const out: Buffer[] = [];
      const hb = cl.startExec({ argv: sh(scan), env: ENV, isolate: {} }, { onStdout: (b) => out.push(b), onStderr: (b) => out.push(b) });
      const bpid = await hb.pid;
      const hv = cl.startExec({ argv: ['sh', '-c', 'echo topsecret-file > /tmp/secret; sleep 3; true', 'victim-argv', 'topsecret-arg'], env: [...ENV, 'VICTIM_TOKEN=topsecret-env'], isolate: {} });
      const vpid = await hv.pid;
      await hb.done;
      hv.signal(9);
      await hv.done;
      await killNextHost(cl); // the poisoned host
      results[name] = Buffer.concat(out).toString();
      console.log(`[impact ${name}] poisoned host ${a.pid}, B on ${bpid}, victim on ${vpid}:\n${results[name]}`);
      expect(bpid).toBe(a.pid);
      expect(vpid).not.toBe(a.pid);
    }
    for (const r of Object.values(results)) expect(r).not.toMatch(/topsecret/);
  });

  it('a call cannot keep a window into its host\'s mount namespace: a dirfd of "/" handed to a concurrent call does not reach the next call\'s /tmp and /proc', async () => {
    const results: Record<string, string> = {};
    for (const [name, cl] of [['callhost', c], ['callhost-no-landlock', cn], ['no-callhost', co]] as const) {
      await killNextHost(cl);
      const sock = `dsec-spy-${name}-${process.pid}`;
      const xout: Buffer[] = [];
      // X: the attacker's long-running call (another host), waiting for the fd.
      const hx = cl.startExec({ argv: [CHK, 'fd-spy', sock, '3'], env: ENV, isolate: {} }, { onStdout: (b) => xout.push(b), onStderr: (b) => xout.push(b) });
      const xpid = await hx.pid;
      const t0 = Date.now();
      while (!Buffer.concat(xout).toString().includes('ready') && Date.now() - t0 < 10_000) await new Promise((r) => setTimeout(r, 20));
      // A: the attacker's call on host H hands "/" of H's mount namespace to X, and ends.
      const a = await call(cl, [CHK, 'fd-send', sock]);
      // B: the victim, next on H.
      const b = await call(cl, ['sh', '-c', 'echo topsecret-file > /tmp/secret; sleep 1; ls /tmp', 'victim-argv', 'topsecret-arg'], {}, { env: [...ENV, 'VICTIM_TOKEN=topsecret-env'] });
      await hx.done;
      console.log(`[root-fd ${name}] B's /tmp at its end: ${JSON.stringify(b.out)}`);
      results[name] = Buffer.concat(xout).toString();
      console.log(`[root-fd ${name}] X on ${xpid}, A on ${a.pid} (${a.out.trim()}), B on ${b.pid}:\n${results[name]}`);
      // While X (another exec of this agent) lives, no host serves a next call: B gets a
      // namespace init of its own, so X's dirfd of A's "/" never shows B's mounts.
      if (name !== 'no-callhost') {
        expect(b.pid).not.toBe(a.pid);
        expect(xpid).not.toBe(a.pid);
      }
    }
    expect(results['no-callhost']).not.toMatch(/topsecret|victim/);
    expect(results.callhost).not.toMatch(/topsecret|victim/);
    expect(results['callhost-no-landlock']).not.toMatch(/topsecret|victim/);
  });

  // ---- processes ----

  it('no process of a call survives it: stopped, vfork-blocked, clone children without exit signal, CLONE_PARENT, pid hoppers, zombie leaders, subreapers', async () => {
    for (const [name, cl, wk] of [['callhost', c, w], ['no-callhost', co, wo]] as const) {
      const a = await call(cl, [CHK, 'escape']);
      expect(a.r).toMatchObject({ kind: 'exit', exitCode: 0 });
      expect(a.out).toBe('spawned clone=ok clone_parent=ok\n');
      const s = await strays(wk);
      console.log(`[escape] ${name} strays`, s);
      expect(s).toEqual([]);
      const b = await call(cl, sh('echo $$; cd /proc && echo [0-9]*'));
      expect(b.out).toBe('2\n2\n');
    }
  });

  it('pid 1 is out of a call\'s reach: pidfd signals, kill -9/-STOP 1, sethostname, umount, mount, unshare; the host serves the next call', async () => {
    await killNextHost(c);
    const a = await call(c, [CHK, 'host-reach']);
    const o = await call(co, [CHK, 'host-reach']);
    console.log('[host-reach] callhost', a.out, '\n[host-reach] no-callhost', o.out);
    expect(a.r).toMatchObject({ kind: 'exit', exitCode: 0 });
    const r = kv(a.out);
    expect(r.pidfd_open).toBe('ok'); // any visible pid
    // Signals from inside the namespace are dropped by the kernel for its init (or refused).
    expect(r.pidfd_getfd).not.toBe('ok');
    for (const k of ['sethostname', 'umount2_tmp', 'umount2_proc', 'mount_tmpfs', 'unshare_ns', 'unshare_user', 'unshare_ipc', 'setpgid_1']) expect(r[k], k).not.toBe('ok');
    const b = await call(c, sh('echo $$; hostname; cd /proc && echo [0-9]*'));
    expect(b.pid).toBe(a.pid); // the host survived and served again
    expect(b.out).toMatch(/^2\n[^\n]+\n2\n$/);
    expect(b.out).not.toMatch(/evil/);
    expect(kv(o.out)).toEqual(r); // same answers as a per-call init
  });

  it('/proc/1 of the host: memory, environ, root, cwd, fds, namespaces, maps, stack refused', async () => {
    const probe = sh('for f in mem environ root/etc/passwd cwd/. fd/0 fdinfo/0 ns/mnt ns/pid maps stack syscall auxv pagemap io timerslack_ns; do head -c1 /proc/1/$f >/dev/null 2>&1 && echo "$f readable" || echo "$f refused"; done; ls /proc/1/fd 2>/dev/null | wc -l; readlink /proc/1/ns/mnt /proc/1/cwd /proc/1/root 2>/dev/null | wc -l');
    const a = await call(c, probe);
    const o = await call(co, probe);
    console.log('[proc1-reach] callhost\n' + a.out + '[proc1-reach] no-callhost\n' + o.out);
    const body = (x: string) => x.split('\n').filter((l) => / (readable|refused)$/.test(l)).join('\n');
    expect(body(a.out)).toBe(body(o.out));
    expect(a.out).not.toMatch(/^(mem|environ|root\/etc\/passwd|fd\/0|fdinfo\/0|maps|stack|syscall|auxv|pagemap|io) readable$/m);
  });

  it('an abstract unix socket listening in one call is dead in the next (shared network namespace)', async () => {
    const name = `dsec-atk-${process.pid}`;
    expect(ok(await iso(c, { argv: [CHK, 'abstract-listen', name] }))).toBe('listening\n');
    expect(ok(await iso(c, { argv: [CHK, 'abstract-connect', name] }))).toBe('connect=Connection refused\n');
    expect(await strays(w)).toEqual([]);
  });

  // ---- requests and lifecycle ----

  it('a near-1 MiB argv+env through a call host is delivered intact, as in a plain exec; then the host serves normally', async () => {
    const big = (ch: string, n: number) => ch.repeat(n);
    const env = [...ENV, ...Array.from({ length: 7 }, (_, i) => `BIG${i}=${big(String.fromCharCode(97 + i), 130_000)}`)];
    const argv = sh('env | sort | md5sum; echo "$#" "${#0}"');
    const args = [...argv, big('z', 100_000)];
    const plain = ok(await c.exec({ argv: args, env, maxOutputBytes: MiB }));
    const a = await call(c, args, {}, { env });
    const o = await call(co, args, {}, { env });
    expect(a.r).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(a.out).toBe(plain);
    expect(o.out).toBe(plain);
    const b = await call(c, sh('echo $$; ls -A /tmp'));
    expect(b.out).toBe('2\n');
  });

  it('a command that closes its stdout early (a background process keeps a copy) still ends, and the next call is clean', async () => {
    const a = await call(c, sh('sleep 100 & exec >&- 2>&-; exit 5'));
    expect(a.r).toMatchObject({ kind: 'exit', exitCode: 5 });
    const b = await call(c, sh('echo $$; cd /proc && echo [0-9]*'));
    expect(b.out).toBe('2\n2\n');
    expect(await strays(w)).toEqual([]);
  });

  it('24 concurrent calls, then 24 consecutive ones: fresh pids and /tmp every time, no strays, at most 16 idle hosts', async () => {
    const rs = await Promise.all(Array.from({ length: 24 }, (_, i) => iso(c, {
      argv: sh(`ls -A /tmp /dev/shm | tr -d "\\n"; echo ${i} > /tmp/mine; echo x > /dev/shm/x; sleep 0.2; echo; cat /tmp/mine; echo $$; cd /proc && echo [0-9]*`),
    })));
    rs.forEach((r, i) => expect(ok(r)).toBe(`/dev/shm:/tmp:\n${i}\n2\n2\n`));
    for (let i = 0; i < 24; i++) {
      expect(ok(await iso(c, { argv: sh('ls -A /tmp /dev/shm | tr -d "\\n"; echo; echo $$; echo y > /tmp/y; sleep 0 &') }))).toBe('/dev/shm:/tmp:\n2\n');
    }
    expect(await strays(w)).toEqual([]);
    const hosts = (await w.cgroups.pids(w.id)).filter((p) => isCallHost(w.pid, p));
    expect(hosts.length).toBeLessThanOrEqual(16);
  });

  it('a call timing out mid-call (host killed) is followed by a clean call on a new host', async () => {
    const t = await call(c, sh('echo left > /tmp/left; sleep 100 & sleep 100'), {}, { timeoutMs: 500 });
    expect(t.r).toMatchObject({ kind: 'exit', signal: 9, timedOut: true });
    const b = await call(c, sh('echo $$; ls -A /tmp; cd /proc && echo [0-9]*'));
    expect(b.out).toBe('2\n2\n');
    expect(b.pid).not.toBe(t.pid);
    expect(await strays(w)).toEqual([]);
  });

  it('a command sees the same /proc/self/status as under a per-call init (signal mask, ignored signals, no_new_privs, seccomp, caps, affinity)', async () => {
    const fields = /^(SigBlk|SigIgn|SigCgt|NoNewPrivs|Seccomp|Seccomp_filters|Cap\w+|Cpus_allowed_list|Umask|Speculation_Store_Bypass):.*$/gm;
    const pick = (s: string) => (s.match(fields) ?? []).join('\n');
    await killNextHost(c);
    const a = pick((await call(c, ['cat', '/proc/self/status'])).out);
    const o = pick((await call(co, ['cat', '/proc/self/status'])).out);
    expect(a).toBe(o);
    // The host itself, as its command sees it, against the per-call init.
    const h = pick((await call(c, ['cat', '/proc/1/status'])).out);
    const i = pick((await call(co, ['cat', '/proc/1/status'])).out);
    console.log('[pid1 status] callhost\n' + h + '\n[pid1 status] no-callhost\n' + i);
  });
});
