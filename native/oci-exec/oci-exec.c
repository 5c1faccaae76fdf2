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
 * Standard streams: crun 1.8 fchowns fds 0-2 to the container's root unless they are
 * terminals (runc leaves them alone). A device there would be the host's device node
 * (dsecd's children get /dev/null as stdin), and the sandbox's root would own it: it
 * could chmod the host's /dev/null, which every host process and sandbox uses. So a
 * character or block device on fd 0 is replaced by the read end of an empty pipe, and one
 * on fd 1 or 2 by an anonymous memory file (memfd; dsecd gives a container's init a log
 * file there, so only the runtime's short commands write to it).
 *
 * Exit: the runtime's own status; 125 when this program cannot prepare the runtime
 * (message on stderr, prefixed "dsec-oci-exec:").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
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

/* 1 when fd is a character or block device, 0 otherwise (closed fds included). */
static int is_device(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 && (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode));
}

/* Keeps every device off fds 0-2 (see the file comment). */
static int no_device_stdio(void) {
  if (is_device(0)) {
    int p[2];
    if (pipe(p) != 0) return fail("pipe for stdin");
    close(p[1]);
    if (p[0] != 0) {
      if (dup2(p[0], 0) != 0) return fail("dup2 stdin");
      close(p[0]);
    }
  }
  for (int fd = 1; fd <= 2; fd++) {
    if (!is_device(fd)) continue;
    int m = memfd_create("dsec-oci-exec-stdio", MFD_CLOEXEC);
    if (m < 0) return fail("memfd_create for stdout/stderr");
    if (dup2(m, fd) != fd) return fail("dup2 stdout/stderr");
    close(m);
  }
  return 0;
}

int main(int argc, char **argv) {
  int i = 1;
  if (no_device_stdio() != 0) return 125;
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
