/*
 * dsec-oci-exec [--cgroup-procs FILE]... RUNTIME [ARG...]: runs an OCI runtime (crun)
 * inside a sandbox's cgroups and with the hybrid cgroup hierarchy's controllers hidden
 * from it, so that crun 1.8 accepts a hybrid cgroup v1 host (DESIGN.md §5).
 *
 *   --cgroup-procs FILE  write "0" to FILE (a cgroup.procs file): join that cgroup before
 *                        anything else; one per hierarchy (v1 has several). dsecd creates
 *                        the cgroups and writes their limits and device rules; the runtime
 *                        runs with --cgroup-manager=disabled, so the container's processes
 *                        are in the sandbox's cgroups from their first instruction because
 *                        the runtime is (the same rule as dsec-vmm-launch).
 *
 * Why: crun refuses a hybrid host whose cgroup2 mount has any controller bound to it
 * ("cgroups in hybrid mode not supported, drop all controllers from cgroupv2"; here that
 * is hugetlb, which no v1 hierarchy mounts and dsec never limits). It decides by reading
 * <unified>/cgroup.controllers. This program gives the runtime a mount namespace of its
 * own in which that one file reads empty (a bind mount of /dev/null over it), then
 * execs the runtime.
 *
 * The namespace is a slave copy of the caller's: nothing mounted in it reaches the
 * host's, and it ends when the runtime (and the containers it unshares from it, which
 * pivot_root away) no longer use it. Where cgroup.controllers is missing or empty
 * (pure v1 or v2 hosts), the runtime is exec'd in a fresh namespace all the same, so
 * every invocation sees one view.
 *
 * Exit: the runtime's own status; 125 when this program cannot prepare the namespace
 * (message on stderr, prefixed "dsec-oci-exec:").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#define CONTROLLERS "/sys/fs/cgroup/unified/cgroup.controllers"

static int fail(const char *what) {
  fprintf(stderr, "dsec-oci-exec: %s: %s\n", what, strerror(errno));
  return 125;
}

/* 1 when CONTROLLERS exists and lists at least one controller, 0 otherwise. */
static int has_v2_controllers(void) {
  int fd = open(CONTROLLERS, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[256];
  ssize_t n = read(fd, buf, sizeof buf);
  close(fd);
  for (ssize_t i = 0; i < n; i++)
    if (buf[i] != ' ' && buf[i] != '\n') return 1;
  return 0;
}

/* Joins the cgroup whose cgroup.procs is `file`. */
static int join(const char *file) {
  int fd = open(file, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = write(fd, "0", 1);
  int saved = errno;
  close(fd);
  errno = saved;
  return n == 1 ? 0 : -1;
}

int main(int argc, char **argv) {
  int i = 1;
  while (i + 1 < argc && strcmp(argv[i], "--cgroup-procs") == 0) {
    if (join(argv[i + 1]) != 0) {
      fprintf(stderr, "dsec-oci-exec: join cgroup through %s: %s\n", argv[i + 1], strerror(errno));
      return 125;
    }
    i += 2;
  }
  if (i >= argc || argv[i][0] != '/') {
    fprintf(stderr, "usage: dsec-oci-exec [--cgroup-procs FILE]... /ABSOLUTE/PATH/TO/RUNTIME [ARG...]\n");
    return 125;
  }
  if (unshare(CLONE_NEWNS) != 0) return fail("unshare(CLONE_NEWNS)");
  if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0) return fail("make / rslave");
  if (has_v2_controllers() && mount("/dev/null", CONTROLLERS, NULL, MS_BIND, NULL) != 0)
    return fail("bind /dev/null over " CONTROLLERS);
  execv(argv[i], argv + i);
  return fail(argv[i]);
}
