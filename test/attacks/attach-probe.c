/* Tries to reach another process's fd: `attach-probe PID FD` runs
 *   ptrace(PTRACE_ATTACH, PID), then pidfd_open(PID) + pidfd_getfd(pidfd, FD)
 * and prints "ptrace <ok|ERRNO>" and "pidfd_getfd <ok|ERRNO>". Built static on the host and
 * run inside a sandbox against the agent (PID 1, listening socket on fd 3), and on the host
 * against a child of its own, where both succeed (the probe can tell success apart). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *name(int e) { const char *n = strerrorname_np(e); return n ? n : "E?"; }

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  pid_t pid = atoi(argv[1]);
  int fd = atoi(argv[2]);
  if (ptrace(PTRACE_ATTACH, pid, 0, 0) == 0) {
    waitpid(pid, NULL, __WALL);
    ptrace(PTRACE_DETACH, pid, 0, 0);
    printf("ptrace ok\n");
  } else {
    printf("ptrace %s\n", name(errno));
  }
  int pfd = syscall(SYS_pidfd_open, pid, 0);
  if (pfd < 0) {
    printf("pidfd_getfd %s\n", name(errno));
    return 0;
  }
  int got = syscall(SYS_pidfd_getfd, pfd, fd, 0);
  printf("pidfd_getfd %s\n", got >= 0 ? "ok" : name(errno));
  return 0;
}
