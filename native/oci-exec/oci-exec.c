/*
 * dsec-oci-exec [--error-log FILE] [STEP]... RUNTIME [ARG...]: creates a sandbox's
 * cgroups, joins them and runs an OCI runtime (crun) inside them, with the hybrid cgroup
 * hierarchy's controllers hidden from it, so that crun 1.8 accepts a hybrid cgroup v1
 * host (DESIGN.md §5). The steps run in the order given, before anything else:
 *
 *   --mkdir DIR          mkdir DIR (mode 0755); an existing DIR is fine
 *   --copy FROM TO       write FROM's contents to TO unless TO already reads non-empty
 *                        (a new v1 cpuset cgroup's cpus and mems, from its parent's)
 *   --write FILE VALUE   write VALUE to FILE in one write(2) (a limit, a device rule)
 *   --cgroup-procs FILE  write "0" to FILE (a cgroup.procs file): join that cgroup; one
 *                        per hierarchy (v1 has several)
 *
 * dsecd builds the steps (CgroupManager.launchPlan: the limits and runc's device rules)
 * and runs the runtime with --cgroup-manager=disabled, so the container's processes are
 * in the sandbox's cgroups from their first instruction because the runtime is (the same
 * rule as dsec-vmm-launch). The cgroupfs work runs here, not on dsecd's event loop.
 * `--error-log FILE` (first, optional): a failure is also appended to FILE as one JSON
 * line {"level":"error","msg":...}, the runtime's own log format, where dsecd reads it.
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

static const char *error_log;

/* Reports "dsec-oci-exec: WHAT[: ARG]: strerror(errno)" on stderr and in the error log. */
static int fail2(const char *what, const char *arg) {
  int e = errno;
  char msg[1024];
  snprintf(msg, sizeof msg, "dsec-oci-exec: %s%s%s: %s", what, arg ? " " : "", arg ? arg : "", strerror(e));
  fprintf(stderr, "%s\n", msg);
  if (error_log) {
    int fd = open(error_log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) {
      char line[2200];
      size_t n = 0;
      n += (size_t)snprintf(line, sizeof line, "{\"level\":\"error\",\"msg\":\"");
      for (const char *c = msg; *c && n < sizeof line - 8; c++) {
        if (*c == '"' || *c == '\\') line[n++] = '\\';
        line[n++] = (*c >= 0x20) ? *c : '?';
      }
      n += (size_t)snprintf(line + n, sizeof line - n, "\"}\n");
      if (write(fd, line, n) < 0) { /* nothing more to report to */ }
      close(fd);
    }
  }
  return 125;
}

static int fail(const char *what) {
  return fail2(what, NULL);
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
    if (dup2(p[0], 0) != 0) return fail("dup2 stdin");
    close(p[0]);
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

/* Writes `value` to `file` in one write(2); -1 with errno on failure. */
static int write_file(const char *file, const char *value) {
  int fd = open(file, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t len = strlen(value);
  ssize_t n = write(fd, value, len);
  int saved = errno;
  close(fd);
  errno = saved;
  if (n >= 0 && (size_t)n != len) errno = EIO;
  return n >= 0 && (size_t)n == len ? 0 : -1;
}

/* --copy: `from`'s contents to `to` unless `to` reads non-empty. */
static int copy_file(const char *from, const char *to) {
  char cur[4096], buf[4096];
  int fd = open(to, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, cur, sizeof cur - 1);
  close(fd);
  if (n < 0) return -1;
  for (ssize_t k = 0; k < n; k++)
    if (cur[k] != ' ' && cur[k] != '\n') return 0;
  fd = open(from, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n < 0) return -1;
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) n--;
  if (n == 0) return 0;
  buf[n] = 0;
  return write_file(to, buf);
}

int main(int argc, char **argv) {
  int i = 1;
  if (i + 1 < argc && strcmp(argv[i], "--error-log") == 0) {
    error_log = argv[i + 1];
    i += 2;
  }
  if (no_device_stdio() != 0) return 125;
  for (;;) {
    if (i + 1 < argc && strcmp(argv[i], "--mkdir") == 0) {
      if (mkdir(argv[i + 1], 0755) != 0 && errno != EEXIST) return fail2("mkdir", argv[i + 1]);
      i += 2;
    } else if (i + 2 < argc && strcmp(argv[i], "--copy") == 0) {
      if (copy_file(argv[i + 1], argv[i + 2]) != 0) return fail2("copy to", argv[i + 2]);
      i += 3;
    } else if (i + 2 < argc && strcmp(argv[i], "--write") == 0) {
      if (write_file(argv[i + 1], argv[i + 2]) != 0) return fail2("write", argv[i + 1]);
      i += 3;
    } else if (i + 1 < argc && strcmp(argv[i], "--cgroup-procs") == 0) {
      if (write_file(argv[i + 1], "0") != 0) return fail2("join cgroup through", argv[i + 1]);
      i += 2;
    } else {
      break;
    }
  }
  if (i >= argc || argv[i][0] != '/') {
    fprintf(stderr, "usage: dsec-oci-exec [--error-log FILE] [--mkdir DIR | --copy FROM TO | --write FILE VALUE | --cgroup-procs FILE]... /ABSOLUTE/PATH/TO/RUNTIME [ARG...]\n");
    return 125;
  }
  if (unshare(CLONE_NEWNS) != 0) return fail("unshare(CLONE_NEWNS)");
  if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0) return fail("make / rslave");
  if (has_v2_controllers() && mount("/dev/null", CONTROLLERS, NULL, MS_BIND, NULL) != 0)
    return fail("bind /dev/null over " CONTROLLERS);
  execv(argv[i], argv + i);
  return fail(argv[i]);
}
