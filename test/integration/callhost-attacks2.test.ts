/**
 * More attacks on call hosts (native/agent/callhost.h, isolate.c callhost_main), after
 * test/integration/callhost-attacks.test.ts: ways for one call to leave state that a
 * later call sees or suffers, to change its host, or to reach the host's CAP_SYS_ADMIN,
 * that the first round did not cover. The contract (docs/AGENT_PROTOCOL.md "Isolated
 * execs", "Call hosts"; docs/SECURITY.md "fncall workers"): a call finds what a fresh
 * init would give it, and does not see its host at all (the fresh /proc is
 * hidepid=invisible).
 *
 * Same setup as the first round (own daemon, slot 26): a busybox sandbox and three
 * worker containers beside it on its rootfs: `c` (call hosts, Landlock), `cn` (call hosts
 * without --landlock: /proc writes are not refused by a ruleset) and `co`
 * (--no-callhost: a namespace init per call, for comparison). CHK is a static C helper
 * compiled here and copied in through the ordinary sandbox.
 *
 * Covered, with what answers each: keyrings (seccomp); pid 1's /proc files beyond the
 * host's list (clear_refs) and what pid 1's own counters tell of earlier requests (pid 1
 * is not listed); the previous call's IPC objects while the host idles (removed, and the
 * IPC namespace replaced, right after each call); SCRATCH mounts on or below /proc or /sys
 * (refused; the host unmounts by fd, never by path); a plain exec's background process
 * (no host serves while the agent has a child other than its hosts); fork bombs, file
 * locks, vfork, writable places; hosts that die with a call pending or under memory
 * pressure.
 *
 * Every test asserts the contract; a failing test is a leak, an escape or a wrong report.
 * Tests that taint a host kill it afterwards (killNextHost), so they do not depend on
 * each other. Nothing here exhausts a budget shared beyond the worker: the POSIX message
 * queue test holds one queue (the RLIMIT_MSGQUEUE budget of the user that created the
 * containers' user namespaces is shared by every container on the machine, so filling it
 * would fail other sandboxes' mq_open) and detects the leftover against a limit the
 * probing call lowers for itself.
 */
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AgentClient } from '../../daemon/agent/client.js';
import type { WorkerContainer } from '../fixtures/worker.js';
import { ENV, call, isCallHost, killNextHost, kv, sh, startCallhostRig, strays, type CallhostRig } from './callhost-helpers.js';
import { IS_ROOT } from './harness.js';

const MiB = 1 << 20;
const CHK = '/opt/dsec-attack2/chk';

const CHK_C = String.raw`
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <mqueue.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/file.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <linux/keyctl.h>

static const char *res(long rc) { return rc >= 0 ? "ok" : strerror(errno); }
static void pr(const char *what, long rc) { printf("%s=%s\n", what, res(rc)); }
static void *sleeper(void *a) { (void)a; for (;;) pause(); return NULL; }

/* One write of v to path: ok or the error. */
static void wr(const char *label, const char *path, const char *v) {
  int fd = open(path, O_WRONLY);
  if (fd < 0) { printf("%s=open:%s\n", label, strerror(errno)); return; }
  ssize_t n = write(fd, v, strlen(v));
  printf("%s=%s\n", label, n >= 0 ? "ok" : strerror(errno));
  close(fd);
}

/* Create-and-remove a file in every directory below dir (same filesystem walk, no /proc, /sys). */
static void walk(const char *dir, int depth) {
  if (depth > 12) return;
  char p[4096];
  snprintf(p, sizeof p, "%s/.dsec-w-%d", strcmp(dir, "/") ? dir : "", getpid());
  int fd = open(p, O_CREAT | O_EXCL | O_WRONLY, 0600);
  if (fd >= 0) { close(fd); unlink(p); printf("writable %s\n", dir); }
  else if (mkdir(p, 0700) == 0) { rmdir(p); printf("writable %s\n", dir); }
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", strcmp(dir, "/") ? dir : "", e->d_name);
    if (!strcmp(p, "/proc") || !strcmp(p, "/sys")) continue;
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) walk(p, depth + 1);
  }
  closedir(d);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc < 2) return 2;
  const char *m = argv[1];
  if (!strcmp(m, "mq-fill")) { /* POSIX queues until the user's RLIMIT_MSGQUEUE is used up */
    struct mq_attr a = { .mq_maxmsg = 10, .mq_msgsize = 8192 };
    int n = 0; char name[32];
    for (;; n++) { snprintf(name, sizeof name, "/dsec-q%d", n); if (mq_open(name, O_CREAT | O_RDWR, 0600, &a) < 0) break; }
    printf("mq_opened=%d stop=%s\n", n, strerror(errno));
    return 0;
  }
  if (!strcmp(m, "mq-try")) { /* one queue; retried for up to argv[2] ms while refused for the quota */
    struct mq_attr a = { .mq_maxmsg = 10, .mq_msgsize = 8192 };
    int ms = argc > 2 ? atoi(argv[2]) : 0, first = -1; mqd_t q;
    for (int t = 0;; t += 20) {
      q = mq_open("/dsec-probe", O_CREAT | O_RDWR, 0600, &a);
      if (first < 0) first = q >= 0 ? 0 : errno;
      if (q >= 0 || t >= ms) break;
      usleep(20000);
    }
    printf("first=%s\nmq_open=%s\n", first ? strerror(first) : "ok", res(q));
    return 0;
  }
  if (!strcmp(m, "shm-fill")) { /* a SysV shm segment of argv[2] MiB, touched, left in the IPC namespace */
    size_t len = (size_t)atol(argv[2]) << 20;
    int id = shmget(IPC_PRIVATE, len, IPC_CREAT | 0600);
    if (id < 0) { printf("shmget=%s\n", strerror(errno)); return 1; }
    char *p = shmat(id, NULL, 0);
    if (p == (void *)-1) { printf("shmat=%s\n", strerror(errno)); return 1; }
    memset(p, 0x5a, len);
    shmdt(p);
    printf("shm=ok\n");
    return 0;
  }
  if (!strcmp(m, "keys")) {
    pr("add_key_user", syscall(SYS_add_key, "user", "dsec-k", "v", 1, KEY_SPEC_USER_KEYRING));
    pr("join_session", syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, "dsec-s"));
    pr("session_to_parent", syscall(SYS_keyctl, KEYCTL_SESSION_TO_PARENT));
    pr("request_key", syscall(SYS_request_key, "user", "dsec-k", NULL, 0));
    return 0;
  }
  if (!strcmp(m, "proc1-write")) { /* writes to pid 1's /proc files outside the host's list */
    wr("comm", "/proc/1/comm", "evil");
    wr("task_comm", "/proc/1/task/1/comm", "evil");
    wr("attr_current", "/proc/1/attr/current", "x");
    wr("attr_exec", "/proc/1/attr/exec", "x");
    wr("timerslack_ns", "/proc/1/timerslack_ns", "1000000");
    wr("sched", "/proc/1/sched", "0");
    wr("loginuid", "/proc/1/loginuid", "1000");
    wr("oom_adj", "/proc/1/oom_adj", "15");
    wr("clear_refs_5", "/proc/1/clear_refs", "5");
    wr("clear_refs_1", "/proc/1/clear_refs", "1");
    wr("make_it_fail", "/proc/1/make-it-fail", "1");
    wr("fail_nth", "/proc/1/fail-nth", "1");
    wr("setgroups", "/proc/1/setgroups", "deny");
    wr("uid_map", "/proc/1/uid_map", "0 0 1");
    wr("timens_offsets", "/proc/1/timens_offsets", "monotonic 10 0");
    wr("mem", "/proc/1/mem", "x");
    wr("task_clear_refs", "/proc/1/task/1/clear_refs", "5");
    return 0;
  }
  if (!strcmp(m, "pid1")) { /* pid 1's own counters, as any call reads them */
    char b[8192]; int fd = open("/proc/1/status", O_RDONLY); ssize_t n = read(fd, b, sizeof b - 1); close(fd);
    b[n > 0 ? n : 0] = 0;
    const char *keys[] = { "VmPeak:", "VmHWM:", "VmRSS:", "RssAnon:", "VmData:", "voluntary_ctxt_switches:" };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
      char *p = strstr(b, keys[i]); if (!p) continue;
      printf("%.*s=%ld\n", (int)strlen(keys[i]) - 1, keys[i], strtol(p + strlen(keys[i]), NULL, 10));
    }
    fd = open("/proc/1/stat", O_RDONLY); n = read(fd, b, sizeof b - 1); close(fd);
    b[n > 0 ? n : 0] = 0;
    char *q = strrchr(b, ')'); /* fields from 3 on */
    long f[20] = { 0 }; int k = 3;
    for (char *t = strtok(q + 2, " "); t && k < 20; t = strtok(NULL, " "), k++) f[k] = atol(t);
    printf("minflt=%ld\nutime=%ld\nstime=%ld\n", f[10], f[14], f[15]);
    return 0;
  }
  if (!strcmp(m, "mq-hold")) { /* one queue (about 80 KiB of RLIMIT_MSGQUEUE), left in the IPC namespace */
    struct mq_attr a = { .mq_maxmsg = 10, .mq_msgsize = 8192 };
    pr("mq_open", mq_open("/dsec-held", O_CREAT | O_RDWR, 0600, &a));
    return 0;
  }
  if (!strcmp(m, "mq-room")) { /* with RLIMIT_MSGQUEUE of 120000 bytes, room for one such queue only if nobody else holds one; retried for argv[2] ms */
    struct rlimit r = { 120000, 120000 };
    pr("setrlimit", setrlimit(RLIMIT_MSGQUEUE, &r));
    struct mq_attr a = { .mq_maxmsg = 10, .mq_msgsize = 8192 };
    int ms = argc > 2 ? atoi(argv[2]) : 0, first = -1; mqd_t q;
    for (int t = 0;; t += 20) {
      q = mq_open("/dsec-room", O_CREAT | O_RDWR, 0600, &a);
      if (first < 0) first = q >= 0 ? 0 : errno;
      if (q >= 0 || t >= ms) break;
      usleep(20000);
    }
    printf("first=%s\nmq_open=%s\n", first ? strerror(first) : "ok", res(q));
    return 0;
  }
  if (!strcmp(m, "taint-sched")) {
    pr("setpriority", setpriority(PRIO_PROCESS, 1, 15));
    struct sched_param sp = { 0 };
    pr("sched_setscheduler", sched_setscheduler(1, SCHED_BATCH, &sp));
    pr("ioprio_set", syscall(SYS_ioprio_set, 1, 1, (3 << 13) | 7));
    return 0;
  }
  if (!strcmp(m, "show-sched")) {
    errno = 0; printf("nice=%d\npolicy=%d\nioprio=%ld\n", getpriority(PRIO_PROCESS, 0), sched_getscheduler(0), syscall(SYS_ioprio_get, 1, 0));
    return 0;
  }
  if (!strcmp(m, "plant-fd-links")) { /* the call's scratch tmpfs covers its host's /proc/1/fd: names the host resolves in its unmount */
    int n = 0;
    for (int i = 0; i < 64; i++) { char p[64]; snprintf(p, sizeof p, "/proc/1/fd/%d", i); if (symlink(argv[2], p) == 0) n++; }
    printf("planted=%d\n", n);
    return 0;
  }
  if (!strcmp(m, "bomb")) { /* processes until the pids limit refuses a fork */
    int n = 0;
    for (;;) { pid_t p = fork(); if (p == 0) { for (;;) pause(); } if (p < 0) break; n++; }
    printf("forked=%d stop=%s\n", n, strerror(errno));
    return 0;
  }
  if (!strcmp(m, "flock-hold")) { /* an exclusive flock and an OFD lock on a read-only image file, held by a child in its own session */
    int fd = open(argv[2], O_RDONLY);
    pr("flock", flock(fd, LOCK_EX | LOCK_NB));
    struct flock fl = { .l_type = F_RDLCK, .l_whence = SEEK_SET };
    pr("ofd_rdlck", fcntl(fd, F_OFD_SETLK, &fl));
    if (fork() == 0) { setsid(); for (;;) pause(); }
    return 0;
  }
  if (!strcmp(m, "flock-try")) {
    int fd = open(argv[2], O_RDONLY);
    pr("flock", flock(fd, LOCK_EX | LOCK_NB));
    return 0;
  }
  if (!strcmp(m, "vfork-exit")) { /* the command (pid 2) exits from another thread while its main thread is in vfork */
    pthread_t t;
    pthread_create(&t, NULL, sleeper, NULL);
    if (fork() == 0) { /* a grandchild that vforks a child that never execs */
      if (vfork() == 0) { for (;;) pause(); }
      _exit(0);
    }
    usleep(20000);
    printf("exiting\n");
    exit(7);
  }
  if (!strcmp(m, "walk")) { walk("/", 0); printf("walked\n"); return 0; }
  if (!strcmp(m, "fd-send") || !strcmp(m, "fd-spy")) {
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    size_t l = strlen(argv[2]); memcpy(a.sun_path + 1, argv[2], l);
    socklen_t al = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + l);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    char byte = 'x';
    union { char b[CMSG_SPACE(sizeof(int))]; struct cmsghdr al; } u;
    struct iovec iov = { &byte, 1 };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b };
    if (!strcmp(m, "fd-send")) {
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
    int found_tmp = 0, found_cmd = 0;
    for (int i = 0; i < atoi(argv[3]) * 20 && !(found_tmp && found_cmd); i++) {
      char b[4096]; ssize_t n; int f;
      if (!found_tmp && (f = openat(root, "tmp/secret", O_RDONLY)) >= 0) { n = read(f, b, sizeof b - 1); close(f); if (n > 0) { b[n] = 0; printf("tmp/secret: %s", b); found_tmp = 1; } }
      for (int pid = 2; pid < 6; pid++) {
        char pth[64];
        snprintf(pth, sizeof pth, "proc/%d/cmdline", pid);
        if (!found_cmd && (f = openat(root, pth, O_RDONLY)) >= 0) { n = read(f, b, sizeof b - 1); close(f); if (n > 0) { for (ssize_t k = 0; k < n; k++) if (!b[k]) b[k] = ' '; b[n] = 0; if (strstr(b, "victim")) { printf("%s: %s\n", pth, b); found_cmd = 1; } } }
      }
      usleep(50000);
    }
    printf("done\n");
    return 0;
  }
  return 2;
}
`;

/** key=number lines as a map. */
function nums(s: string): Record<string, number> {
  return Object.fromEntries(Object.entries(kv(s)).map(([k, v]) => [k, Number(v)]));
}

describe.skipIf(!IS_ROOT)('more attacks on call hosts', () => {
  let rig: CallhostRig;
  /** Worker with call hosts and Landlock (what dsecd runs). */
  let w: WorkerContainer;
  let c: AgentClient;
  /** Worker with --no-callhost (a namespace init per call). */
  let wo: WorkerContainer;
  let co: AgentClient;
  /** Worker with call hosts but without --landlock. */
  let wn: WorkerContainer;
  let cn: AgentClient;

  const hostPids = async (wk: WorkerContainer) => (await wk.cgroups.pids(wk.id)).filter((p) => isCallHost(wk.pid, p));
  /** The host pid (this host's pid namespace) of the call host whose pid in the worker is `nspid`. */
  const hostGlobalPid = async (wk: WorkerContainer, nspid: number) => {
    for (const p of await hostPids(wk)) {
      const ns = /^NSpid:\s+(.*)$/m.exec(fs.readFileSync(`/proc/${p}/status`, 'utf8'))?.[1].trim().split(/\s+/).map(Number) ?? [];
      if (ns[1] === nspid) return p;
    }
    return -1;
  };
  /** The worker's memory cgroup charge, bytes (the cgroup manager's stats). */
  const memCurrent = async (wk: WorkerContainer): Promise<number> => (await wk.cgroups.stats(wk.id)).memoryBytes;
  /** argv+env of about 840 KB (each string below execve's 128 KiB per-string limit). */
  const BIG_ENV = [...ENV, ...Array.from({ length: 7 }, (_, i) => `BIG${i}=${String.fromCharCode(97 + i).repeat(120_000)}`)];
  const CLEAN = sh('echo $$; cd /proc && echo [0-9]*; ls -A /tmp /dev/shm | tr -d "\\n"; echo');
  const CLEAN_OUT = '2\n2\n/dev/shm:/tmp:\n';

  beforeAll(async () => {
    rig = await startCallhostRig(26, 'atk2', { path: CHK, source: CHK_C });
    ({ w, c, wo, co, wn, cn } = rig);
  }, 180_000);

  afterAll(async () => {
    await rig?.close();
  });

  // ---- what a call can change about its host (pid 1) ----

  it('keyrings are out of reach: add_key, keyctl (joining a session keyring, KEYCTL_SESSION_TO_PARENT onto the host) and request_key are refused', async () => {
    // KEYCTL_SESSION_TO_PARENT would replace the host's session keyring (the command is
    // its child, same uid), which every later command inherits; the user keyring is
    // per uid and would outlive every call.
    for (const cl of [c, cn, co]) {
      const r = kv((await call(cl, [CHK, 'keys'])).out);
      expect(r).toEqual({ add_key_user: 'Operation not permitted', join_session: 'Operation not permitted', session_to_parent: 'Operation not permitted', request_key: 'Operation not permitted' });
    }
  });

  it('writes to pid 1\'s other /proc files (comm, attr, timerslack_ns, loginuid, maps, timens_offsets, mem) are refused even without Landlock: pid 1 is not even listed', async () => {
    await killNextHost(cn);
    const a = await call(cn, [CHK, 'proc1-write']);
    const b = await call(cn, sh('cat /proc/1/comm 2>&1'));
    await killNextHost(cn);
    const r = kv(a.out);
    console.log('[proc1-write] without landlock', r);
    for (const k of ['comm', 'task_comm', 'attr_current', 'attr_exec', 'timerslack_ns', 'loginuid', 'setgroups', 'uid_map', 'timens_offsets', 'mem']) expect(r[k], k).not.toBe('ok');
    // The fresh /proc is mounted hidepid=invisible: the host (non-dumpable, holding
    // capabilities the call lacks) is not there for the call.
    expect(b.out).toMatch(/No such file or directory/);
  });

  it('/proc/1/clear_refs written by one call (no Landlock) does not change what the next call sees of its host', async () => {
    // clear_refs has no ptrace check, only the file's mode: pid 1 is non-dumpable, so its
    // /proc files belong to root of the worker's user namespace, which the command is.
    // "5" resets the host's peak RSS (VmHWM in /proc/1/status), "1" clears its pages'
    // referenced bits; the host does not compare either after a call.
    await killNextHost(cn);
    await call(cn, ['true'], {}, { env: BIG_ENV }); // a peak above the host's current RSS
    const r1 = await call(cn, [CHK, 'pid1']);
    const a = await call(cn, sh('echo 5 > /proc/1/clear_refs && echo written'));
    const r2 = await call(cn, [CHK, 'pid1']);
    await killNextHost(cn);
    console.log('[clear_refs] A', JSON.stringify(a.out + a.err), 'hosts', r1.pid, a.pid, r2.pid, '\nbefore', nums(r1.out), '\nafter', nums(r2.out));
    const same = r1.pid === a.pid && a.pid === r2.pid;
    // The contract: either the host noticed and retired, or the next call sees it unchanged.
    if (same) expect(nums(r2.out).VmHWM).toBe(nums(r1.out).VmHWM);
  });

  it('what the next call reads of pid 1 does not tell the size of an earlier call\'s request (argv and env): pid 1 is not listed', async () => {
    // The host parses each request into its own heap: its peak RSS and peak size and its
    // minor faults would grow with each request's size. A call cannot read any of them:
    // the fresh /proc is mounted hidepid=invisible and the host is not ptrace-readable.
    for (const cl of [c, cn]) {
      await killNextHost(cl);
      await call(cl, ['true'], {}, { env: BIG_ENV });
      const r = await call(cl, sh('cat /proc/1/status /proc/1/stat 2>&1; ls /proc | grep -c "^1$"'));
      await killNextHost(cl);
      expect(r.out).toBe('cat: can\'t open \'/proc/1/status\': No such file or directory\ncat: can\'t open \'/proc/1/stat\': No such file or directory\n0\n');
    }
  });

  // ---- IPC: the host keeps a finished call's IPC namespace until its next call ----

  it('a finished call\'s POSIX message queues and SysV shm do not outlive it while its host is idle', async () => {
    // The host unshares a new IPC namespace at the start of its next call, so between
    // calls it is the last holder of the previous call's: its queues (charged to the
    // worker's RLIMIT_MSGQUEUE) and shm segments (charged to its memory cgroup) stay.
    // Calls that run meanwhile elsewhere (here: while a plain exec lives, so they get
    // inits of their own) find the quota and the memory taken. B lowers its own
    // RLIMIT_MSGQUEUE to 120,000 bytes: room for its one queue (~82 KB) only if A's is
    // gone. B retries for up to 5 s: the kernel frees an IPC namespace in deferred work.
    const run = async (cl: AgentClient, wk: WorkerContainer) => {
      await killNextHost(cl);
      const m0 = await memCurrent(wk);
      const z = await call(cl, [CHK, 'mq-room', '5000']); // room while nobody holds a queue
      const a = await call(cl, sh(`${CHK} mq-hold; ${CHK} shm-fill 192`));
      const l = cl.startExec({ argv: ['sleep', '60'], env: ENV });
      await l.pid;
      const b = await call(cl, [CHK, 'mq-room', '5000']);
      // Freeing a namespace's shm takes a moment after its queues went: wait for it, up to 5 s.
      let m1 = await memCurrent(wk);
      for (let k = 0; k < 50 && m1 - m0 >= 96 * MiB; k++) {
        await new Promise((r) => setTimeout(r, 100));
        m1 = await memCurrent(wk);
      }
      l.signal(9);
      await l.done;
      await killNextHost(cl);
      return { z: kv(z.out), a: a.out, b: kv(b.out), aHost: a.pid, bHost: b.pid, held: m1 - m0 };
    };
    const t = await run(c, w);
    const o = await run(co, wo);
    console.log('[ipc held] callhost', t, '\n[ipc held] no-callhost', o);
    expect(t.a).toBe('mq_open=ok\nshm=ok\n');
    expect(o.z.mq_open).toBe('ok');
    expect(o.b.mq_open).toBe('ok');
    expect(o.held).toBeLessThan(96 * MiB);
    expect(t.z.mq_open).toBe('ok');
    expect(t.bHost).not.toBe(t.aHost); // B ran beside the plain exec: an init of its own
    expect(t.b.mq_open).toBe('ok');
    expect(t.held).toBeLessThan(96 * MiB);
  });

  // ---- the host's unmount and the no-other-exec rule ----

  it('a SCRATCH path on or below /proc or /sys is refused before anything runs, and the host serves the next call with its fresh /proc', async () => {
    // A scratch tmpfs on /proc/1/fd once let a call plant symlinks where the host's
    // unmount looked paths up; the host now unmounts by fd (fchdir, then "."), and the
    // agent refuses such paths as malformed.
    for (const path of ['/proc/1/fd', '/proc', '/sys/fs', '//proc/x', '/./proc/x']) {
      await killNextHost(c);
      await expect(call(c, [CHK, 'plant-fd-links', '/proc'], { scratch: [{ path, bytes: MiB }] }), path)
        .rejects.toThrow(/malformed EXEC: SCRATCH path must not be/);
      const b = await call(c, CLEAN);
      await killNextHost(c);
      expect(b.out, path).toBe(CLEAN_OUT);
    }
  });

  it('a background process left by a plain exec is no window into the next calls: a dirfd of the host\'s "/" handed to it does not show later calls\' /tmp and argv', async () => {
    // The host serves only while no other exec of the agent lives, but a plain exec ends
    // when its command exits (a background process it started runs on, reparented to the
    // agent), and then counts no more. Such a process (here started by the client with a
    // plain exec; dsecd itself runs only isolated calls on workers) takes the dirfd of "/"
    // from call A (an abstract socket of the worker's network namespace) and reads the
    // next call's mounts and /proc through it.
    const sock = `dsec-orphan-${process.pid}`;
    await killNextHost(c);
    const p = await call(c, sh(`rm -f /dev/shm/spy.out; (setsid ${CHK} fd-spy ${sock} 4 > /dev/shm/spy.out 2>&1 &); for i in $(seq 200); do grep -q ready /dev/shm/spy.out 2>/dev/null && break; sleep 0.05; done; grep -q ready /dev/shm/spy.out && echo spy-ready`), null);
    expect(p.out).toBe('spy-ready\n');
    const a = await call(c, [CHK, 'fd-send', sock]);
    const b = await call(c, ['sh', '-c', 'echo topsecret-file > /tmp/secret; sleep 1; true', 'victim-argv'], {});
    const s = await call(c, sh('for i in $(seq 150); do grep -q done /dev/shm/spy.out && break; sleep 0.1; done; cat /dev/shm/spy.out; rm -f /dev/shm/spy.out'), null);
    await killNextHost(c);
    console.log(`[orphan spy] A on ${a.pid} (${a.out.trim()}), B on ${b.pid}; the spy saw:\n${s.out}`);
    expect(b.r).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(s.out).toMatch(/done/);
    expect(s.out).not.toMatch(/topsecret|victim/);
  });

  // ---- processes, locks, writable places ----

  it('a fork bomb up to the worker\'s pids limit leaves the host able to serve the next call, with pids from 2', async () => {
    await killNextHost(c);
    const a = await call(c, [CHK, 'bomb']);
    const b = await call(c, CLEAN);
    console.log('[bomb]', a.out.trim(), JSON.stringify(a.r), '| next on the same host:', a.pid === b.pid);
    expect(a.r).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(a.out).toMatch(/^forked=\d+ stop=Resource temporarily unavailable\n$/);
    expect(b.pid).toBe(a.pid);
    expect(b.out).toBe(CLEAN_OUT);
    expect(await strays(w)).toEqual([]);
  });

  it('an flock and an OFD lock taken on a read-only image file by a daemonized process are gone for the next call', async () => {
    const a = await call(c, [CHK, 'flock-hold', '/etc/passwd']);
    const b = await call(c, [CHK, 'flock-try', '/etc/passwd']);
    expect(kv(a.out)).toEqual({ flock: 'ok', ofd_rdlck: 'ok' });
    expect(b.pid).toBe(a.pid);
    expect(kv(b.out)).toEqual({ flock: 'ok' });
  });

  it('a command that exits from one thread while another process of the call is a vfork parent: its status is reported and nothing survives', async () => {
    const a = await call(c, [CHK, 'vfork-exit']);
    const b = await call(c, CLEAN);
    expect(a.r).toMatchObject({ kind: 'exit', exitCode: 7 });
    expect(b.pid).toBe(a.pid);
    expect(b.out).toBe(CLEAN_OUT);
    expect(await strays(w)).toEqual([]);
  });

  it('a call can write only its own fresh mounts (/tmp, /dev/shm, /dev/mqueue): no other directory of the host\'s mount namespace takes a file, with or without Landlock', async () => {
    for (const cl of [c, cn]) {
      const r = await call(cl, [CHK, 'walk']);
      expect(r.out.split('\n').filter((l) => l.startsWith('writable ')).sort()).toEqual(['writable /dev/mqueue', 'writable /dev/shm', 'writable /tmp']);
      expect(r.out).toMatch(/walked\n$/);
    }
  });

  // ---- reports when the host dies ----

  it('a call sent to a host that dies before reading it (stopped, then SIGKILLed, as by the OOM killer) is not reported as a success; the next call runs on a new host', async () => {
    await killNextHost(c);
    const a = await call(c, ['true']);
    const g = await hostGlobalPid(w, a.pid);
    expect(g).toBeGreaterThan(0);
    process.kill(g, 'SIGSTOP');
    const out: Buffer[] = [];
    const h = c.startExec({ argv: sh('echo ran-$$'), env: ENV, isolate: {} }, { onStdout: (x) => out.push(x) });
    h.pid.catch(() => {});
    // The agent handles one connection's frames in order, and sends a call to its host
    // while handling its EXEC: once a plain exec sent after it is over, the call is on
    // the stopped host's control socket.
    expect((await call(c, ['true'], null)).r).toMatchObject({ kind: 'exit', exitCode: 0 });
    process.kill(g, 'SIGKILL');
    const r = await h.done;
    const n = await call(c, sh('echo ran-$$'));
    console.log('[host killed with a call pending]', JSON.stringify(r), JSON.stringify(Buffer.concat(out).toString()), '| next on', n.pid, JSON.stringify(n.r), n.out);
    if (r.kind === 'exit' && r.exitCode === 0) expect(Buffer.concat(out).toString()).toBe('ran-2\n');
    expect(Buffer.concat(out).toString()).not.toMatch(/ran-(?!2\n)/);
    expect(n.pid).not.toBe(a.pid);
    expect(n.r).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(n.out).toBe('ran-2\n');
  });

  it('a call that runs its worker out of memory (tmpfs pages, in no process\'s RSS) is followed by a call that really runs', async () => {
    await killNextHost(c);
    const a = await call(c, sh('dd if=/dev/zero of=/tmp/fill bs=1M count=700 2>/dev/null; echo dd=$?'), { tmpBytes: 2048 * MiB });
    const b = await call(c, sh('echo ran-$$; ls -A /tmp'));
    console.log('[oom]', JSON.stringify(a.r), a.out.trim(), '| next', JSON.stringify(b.r), JSON.stringify(b.out), a.pid === b.pid ? 'same host' : 'new host');
    expect(b.r).toMatchObject({ kind: 'exit', exitCode: 0 });
    expect(b.out).toBe('ran-2\n');
    expect(await strays(w)).toEqual([]);
  });
});
