/*
 * dsec-builder: runs one command as dsec's BUILDER identity.
 *
 *   dsec-builder --base B [--count N] [--fds K] [--env NAME=VALUE]... -- PROG ARG...
 *
 * dsecd (root) uses it for every step that reads or writes a tree from an untrusted
 * source: extracting image tars, copying a sandbox's writable layer, mkfs.erofs. PROG
 * runs with these credentials and nothing more:
 *
 *   - a new user namespace whose uid_map and gid_map are "0 B N" (N defaults to 65536):
 *     uid/gid 0 inside is host uid/gid B, so PROG is "root" over files owned by
 *     B..B+N-1 (the tree it builds: in-image ownership 0..N-1 is kept exactly) and an
 *     unprivileged stranger to every other file on the host. Capabilities held in that
 *     namespace never apply to inodes whose owner is outside it, and never to the host:
 *     it cannot read a root-only file, write outside its tree, mknod a real device
 *     (CAP_MKNOD is checked in the initial namespace; overlay whiteouts, char 0:0, need
 *     none), set trusted.* xattrs or mount anything;
 *   - a new pid namespace in which PROG is pid 1: when PROG exits the kernel kills every
 *     process it left behind, so nothing of a build outlives it (a later step that root
 *     takes over the same tree, e.g. publishing a blob, never races a builder process);
 *   - new network and IPC namespaces: no network at all (not even loopback is up) and no
 *     SysV IPC shared with the host;
 *   - a capability bounding set reduced to what building a tree needs: CHOWN,
 *     DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER, FSETID, MKNOD, SETFCAP (file capabilities of
 *     the tree), all inside its own namespace only; no_new_privs; PR_SET_PDEATHSIG on
 *     dsec-builder and on PROG, so a killed dsecd takes every process of its builds with
 *     it (a new dsecd then never finds a build of the old one still writing);
 *   - the environment given with --env and nothing else (PATH defaults to the sbin and
 *     bin dirs); stdin/stdout/stderr and fds 3..3+K-1 (--fds K: inputs that root opened
 *     for it, e.g. a root-only tar or a detached idmapped mount of a writable layer,
 *     passed by fd rather than by a path it could not open); every other fd closed.
 *   - the working directory it was started in (root chooses a staging dir owned by B).
 *
 * Exit status: PROG's, or 128+signal when PROG was killed. 125 when dsec-builder itself
 * failed (the message on stderr starts with "dsec-builder:"), 126 when PROG could not be
 * executed, 127 when it was not found. SIGTERM, SIGINT and SIGHUP kill the whole build.
 *
 * Must run as root (it writes the id maps of a namespace over arbitrary host ids).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <grp.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

#define EXIT_RUNNER 125
#define EXIT_NOEXEC 126
#define EXIT_NOTFOUND 127
/* Most --env entries and argument words: far above what dsecd passes. */
#define MAX_ENV 64

static const char *DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/* Capabilities kept in the bounding set (numbers from <linux/capability.h>). */
static const int KEEP_CAPS[] = {CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER,
                                CAP_FSETID, CAP_MKNOD, CAP_SETFCAP};

static pid_t child_pid = -1;

static void die(const char *fmt, const char *arg, int err) {
  fprintf(stderr, "dsec-builder: ");
  fprintf(stderr, fmt, arg ? arg : "");
  if (err) fprintf(stderr, ": %s", strerror(err));
  fputc('\n', stderr);
  exit(EXIT_RUNNER);
}

static void usage(void) {
  fprintf(stderr, "usage: dsec-builder --base B [--count N] [--fds K] [--env NAME=VALUE]... -- PROG ARG...\n");
  exit(EXIT_RUNNER);
}

static uint32_t parse_u32(const char *s, const char *what) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *s == '\0' || *end != '\0' || v > UINT32_MAX) die("%s must be a number below 2^32", what, 0);
  return (uint32_t)v;
}

static int write_file(const char *path, const char *data) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t len = strlen(data);
  ssize_t n;
  do n = write(fd, data, len);
  while (n < 0 && errno == EINTR);
  int e = errno;
  close(fd);
  if (n < 0) {
    errno = e;
    return -1;
  }
  if ((size_t)n != len) {
    errno = EIO;
    return -1;
  }
  return 0;
}

static void forward_kill(int sig) {
  (void)sig;
  if (child_pid > 0) kill(child_pid, SIGKILL); /* pid 1 of the namespace: takes every process with it */
}

/* Reads exactly one byte; returns 1, or 0 on EOF / error. */
static int read_byte(int fd, char *c) {
  ssize_t n;
  do n = read(fd, c, 1);
  while (n < 0 && errno == EINTR);
  return n == 1;
}

/* The child, between clone and exec. Reports a failure as "<errno>:<step>" on errpipe and exits. */
static void child_fail(int errpipe, int err, const char *step) {
  char buf[256];
  int k = snprintf(buf, sizeof buf, "%d:%s", err, step);
  if (k > 0) {
    ssize_t w = write(errpipe, buf, (size_t)k < sizeof buf ? (size_t)k : sizeof buf - 1);
    (void)w;
  }
  _exit(err == ENOENT && strcmp(step, "exec") == 0 ? EXIT_NOTFOUND : strcmp(step, "exec") == 0 ? EXIT_NOEXEC : EXIT_RUNNER);
}

static void run_child(int syncfd, int errpipe, int nfds, char **argv, char **envp) {
  char c;
  /* Die with dsec-builder. Set before waiting, so a parent that dies first is seen as EOF. */
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) child_fail(errpipe, errno, "prctl(PR_SET_PDEATHSIG)");
  if (!read_byte(syncfd, &c) || c != 'm') _exit(EXIT_RUNNER); /* the parent failed and said why */
  close(syncfd);
  /* The id maps are written: become uid/gid 0 of the namespace (host B). */
  if (setgroups(0, NULL) < 0) child_fail(errpipe, errno, "setgroups");
  if (setresgid(0, 0, 0) < 0) child_fail(errpipe, errno, "setresgid(0)");
  if (setresuid(0, 0, 0) < 0) child_fail(errpipe, errno, "setresuid(0)");
  for (int cap = 0; cap <= CAP_LAST_CAP; cap++) {
    int keep = 0;
    for (size_t i = 0; i < sizeof KEEP_CAPS / sizeof KEEP_CAPS[0]; i++) keep |= KEEP_CAPS[i] == cap;
    if (!keep && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) child_fail(errpipe, errno, "prctl(PR_CAPBSET_DROP)");
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0) child_fail(errpipe, errno, "prctl(PR_CAP_AMBIENT_CLEAR_ALL)");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) child_fail(errpipe, errno, "prctl(PR_SET_NO_NEW_PRIVS)");
  /* Every fd beyond the passed ones goes at exec (errpipe too: CLOEXEC tells the parent exec worked). */
  if (syscall(SYS_close_range, 3 + nfds, ~0U, CLOSE_RANGE_CLOEXEC) < 0) child_fail(errpipe, errno, "close_range");
  for (int fd = 3; fd < 3 + nfds; fd++) {
    int fl = fcntl(fd, F_GETFD);
    if (fl < 0) child_fail(errpipe, errno, "fcntl(passed fd)");
    if (fd != errpipe && fcntl(fd, F_SETFD, fl & ~FD_CLOEXEC) < 0) child_fail(errpipe, errno, "fcntl(F_SETFD)");
  }
  execvpe(argv[0], argv, envp);
  child_fail(errpipe, errno, "exec");
}

int main(int argc, char **argv) {
  uint32_t base = 0, count = 65536;
  int have_base = 0, nfds = 0, nenv = 0, have_path = 0;
  char *envp[MAX_ENV + 2];
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (i + 1 >= argc) usage();
    if (strcmp(a, "--base") == 0) {
      base = parse_u32(argv[++i], "--base");
      have_base = 1;
    } else if (strcmp(a, "--count") == 0) {
      count = parse_u32(argv[++i], "--count");
    } else if (strcmp(a, "--fds") == 0) {
      nfds = (int)parse_u32(argv[++i], "--fds");
      if (nfds > 64) die("--fds %s: at most 64", argv[i], 0);
    } else if (strcmp(a, "--env") == 0) {
      const char *kv = argv[++i];
      if (!strchr(kv, '=') || kv[0] == '=') die("--env %s: want NAME=VALUE", kv, 0);
      if (nenv >= MAX_ENV) die("too many --env entries%s", "", 0);
      if (strncmp(kv, "PATH=", 5) == 0) have_path = 1;
      envp[nenv++] = (char *)kv;
    } else {
      usage();
    }
  }
  if (!have_base || i >= argc) usage();
  if (base == 0) die("--base must not be 0 (the builder is never host root)%s", "", 0);
  if (count == 0 || (uint64_t)base + count > UINT32_MAX) die("--base + --count must stay below 2^32-1%s", "", 0);
  if (geteuid() != 0) die("must run as root (it maps a range of host ids)%s", "", 0);
  if (!have_path) envp[nenv++] = (char *)DEFAULT_PATH;
  envp[nenv] = NULL;
  /* Die with dsecd (our parent): the build dies with us below. A parent that died before
   * the prctl shows as a changed parent pid. */
  pid_t parent = getppid();
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) die("prctl(PR_SET_PDEATHSIG)%s", "", errno);
  if (getppid() != parent) die("the parent exited before the build started%s", "", 0);
  for (int fd = 3; fd < 3 + nfds; fd++)
    if (fcntl(fd, F_GETFD) < 0) {
      char what[32];
      snprintf(what, sizeof what, "%d", fd);
      die("fd %s was not passed (--fds)", what, 0);
    }

  int sync[2], errp[2];
  if (pipe2(sync, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0) die("pipe%s", "", errno);
  /* Dup the pipe ends the child keeps above the passed fds, so they never shadow fd 3..3+K-1. */
  int csync = fcntl(sync[0], F_DUPFD_CLOEXEC, 3 + nfds);
  int cerr = fcntl(errp[1], F_DUPFD_CLOEXEC, 3 + nfds);
  if (csync < 0 || cerr < 0) die("fcntl(F_DUPFD)%s", "", errno);

  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = forward_kill;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);

  /* fork semantics (no new stack), straight into the new namespaces. */
  long pid = syscall(SYS_clone, CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | SIGCHLD, 0, 0, 0, 0);
  if (pid < 0) die("clone(CLONE_NEWUSER|CLONE_NEWPID|CLONE_NEWNET|CLONE_NEWIPC)%s", "", errno);
  if (pid == 0) {
    close(sync[1]);
    close(errp[0]);
    run_child(csync, cerr, nfds, &argv[i], envp);
  }
  child_pid = (pid_t)pid;
  close(csync);
  close(cerr);
  close(sync[0]);
  close(errp[1]);

  char path[64], map[64];
  snprintf(map, sizeof map, "0 %u %u\n", base, count);
  snprintf(path, sizeof path, "/proc/%ld/uid_map", pid);
  int ok = write_file(path, map) == 0;
  int err = errno;
  if (ok) {
    snprintf(path, sizeof path, "/proc/%ld/gid_map", pid);
    ok = write_file(path, map) == 0;
    err = errno;
  }
  if (!ok) {
    kill(child_pid, SIGKILL);
    waitpid(child_pid, NULL, 0);
    die("writing %s", path, err);
  }
  ssize_t w;
  do w = write(sync[1], "m", 1);
  while (w < 0 && errno == EINTR);
  close(sync[1]);

  /* The child's setup error, if any (EOF means exec succeeded). */
  char ebuf[256];
  ssize_t n;
  do n = read(errp[0], ebuf, sizeof ebuf - 1);
  while (n < 0 && errno == EINTR);
  close(errp[0]);

  int status;
  while (waitpid(child_pid, &status, 0) < 0) {
    if (errno != EINTR) die("waitpid%s", "", errno);
  }
  if (n > 0) {
    ebuf[n] = '\0';
    char *colon = strchr(ebuf, ':');
    int e = atoi(ebuf);
    fprintf(stderr, "dsec-builder: %s%s%s: %s\n", colon ? colon + 1 : "setup", colon && strcmp(colon + 1, "exec") == 0 ? " " : "",
            colon && strcmp(colon + 1, "exec") == 0 ? argv[i] : "", strerror(e));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return EXIT_RUNNER;
}
