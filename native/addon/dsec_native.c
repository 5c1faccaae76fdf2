/*
 * dsec_native: the few Linux syscalls dsecd needs that Node does not expose.
 *
 *   userns(uidBase, gidBase, count) -> fd
 *       A user namespace whose uid_map and gid_map are "0 <base> <count>", returned as an
 *       O_CLOEXEC fd on /proc/<pid>/ns/user. A short-lived helper is cloned into a new
 *       user namespace, mapped, its namespace opened, then killed and reaped.
 *       The caller owns the fd (close it with fs.closeSync).
 *   idmapMountFd(src, dst, nsfd, readonly)
 *       Clone the mount at src (open_tree OPEN_TREE_CLONE), make the clone idmapped to
 *       the user namespace nsfd (mount_setattr MOUNT_ATTR_IDMAP, plus MOUNT_ATTR_RDONLY
 *       when readonly), and attach it at dst (move_mount).
 *   idmapMount(src, dst, uidBase, gidBase, count, readonly)
 *       userns() + idmapMountFd() + close, for a single layer.
 *   mount(source, target, fstype, flags, data|null)   -- mount(2)
 *   umount(target, flags)                              -- umount2(2)
 *   isMountpoint(path) -> boolean                      -- statx STATX_ATTR_MOUNT_ROOT
 *   isReadOnly(path) -> boolean                        -- statvfs ST_RDONLY: the mount or
 *       its superblock is read-only (the kernel ORs the two into f_flag)
 *   schedCoreProbe() -> 0 | errno                     -- prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET)
 *       on the calling thread: 0 when the kernel has core scheduling and it is usable
 *       (CONFIG_SCHED_CORE and SMT present), else the errno (EINVAL: not compiled in;
 *       ENODEV: compiled in but no SMT siblings). Never throws.
 *   schedIdleProbe() -> 0 | errno                     -- sched_setscheduler(SCHED_IDLE)
 *       on a short-lived thread of its own (policies are per thread), so the caller's
 *       threads keep their policy. Never throws.
 *   unmountAllAsync(target) -> Promise<number>          -- the unmount loop of
 *       daemon/host/native.ts unmountAll, run on the libuv threadpool (each umount2 of an
 *       overlay waits for an RCU grace period; see below)
 *   resolveBeneath(dir, rel) -> "" | errno name          -- openat2(dirfd, rel, O_PATH,
 *       RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS): "" when rel (symlinks followed, the
 *       final one too) resolves to something that exists below dir, else the errno name:
 *       "EXDEV" when the resolution would leave dir (a ".." above it, an absolute symlink),
 *       "ENOENT", "ENOTDIR", "ELOOP", ..., and "ENOSYS" on kernels without openat2 (< 5.6).
 *       The extra guard of `dsec cp`'s local extraction (cli/util/extract.ts). Never throws
 *       for the resolution itself (only for bad arguments).
 *   constants: { MS_*, MNT_* } used by the TypeScript wrappers.
 *
 * Every failure throws an Error whose `code` is the errno name (e.g. "ENOENT"), with
 * `errno` (number), `syscall` and `path` properties and a message naming the syscall and
 * the path, like Node's own fs errors.
 *
 * All calls but unmountAllAsync are synchronous and short (a mount or an idmap setup is
 * tens of microseconds; userns() clones one helper, well under a millisecond), so they
 * run on the JS thread rather than a worker. spawn.c adds spawn/spawnKill; overlay.c
 * adds mountOverlayAsync (a sandbox's root overlay from fds, on the threadpool).
 *
 * Headers: only <linux/mount.h> is included for the mount API (never together with
 * <sys/mount.h>, which conflicts with it on glibc 2.36), and syscalls go through
 * syscall(2) so no libc wrapper is needed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <linux/mount.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <node_api.h>

#include <linux/openat2.h>

#include "dsec_native.h"

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

/* Fallbacks for older kernel headers (values are the kernel ABI). */
#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef OPEN_TREE_CLOEXEC
#define OPEN_TREE_CLOEXEC O_CLOEXEC
#endif
#ifndef AT_EMPTY_PATH
#define AT_EMPTY_PATH 0x1000
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#ifndef MNT_DETACH
#define MNT_DETACH 2
#endif
#ifndef MNT_FORCE
#define MNT_FORCE 1
#endif
#ifndef UMOUNT_NOFOLLOW
#define UMOUNT_NOFOLLOW 8
#endif
#ifndef STATX_ATTR_MOUNT_ROOT
#define STATX_ATTR_MOUNT_ROOT 0x00002000
#endif

/* Core scheduling (Linux 5.14); values are the kernel ABI of <linux/prctl.h>. */
#ifndef PR_SCHED_CORE
#define PR_SCHED_CORE 62
#endif
#ifndef PR_SCHED_CORE_GET
#define PR_SCHED_CORE_GET 0
#endif
#ifndef PR_SCHED_CORE_SCOPE_THREAD
#define PR_SCHED_CORE_SCOPE_THREAD 0 /* PIDTYPE_PID */
#endif

#define PATH_BUF 4096
#define DATA_BUF 4096 /* mount(2) copies at most one page of data: longer is refused, not cut */

/* ---------- error helpers ---------- */

static const char *errno_name(int e) {
  const char *n = strerrorname_np(e); /* glibc >= 2.32 */
  return n ? n : "EUNKNOWN";
}

/* Throws Error(`${syscall}(${path}): ${strerror}`) with code/errno/syscall/path set. */
void throw_errno(napi_env env, int e, const char *syscall_name, const char *path) {
  char msg[PATH_BUF + 256];
  if (path && *path)
    snprintf(msg, sizeof msg, "%s(%s): %s", syscall_name, path, strerror(e));
  else
    snprintf(msg, sizeof msg, "%s: %s", syscall_name, strerror(e));
  napi_value code, message, err, v;
  if (napi_create_string_utf8(env, errno_name(e), NAPI_AUTO_LENGTH, &code) != napi_ok ||
      napi_create_string_utf8(env, msg, NAPI_AUTO_LENGTH, &message) != napi_ok ||
      napi_create_error(env, code, message, &err) != napi_ok) {
    napi_throw_error(env, errno_name(e), msg);
    return;
  }
  if (napi_create_int32(env, -e, &v) == napi_ok) napi_set_named_property(env, err, "errno", v);
  if (napi_create_string_utf8(env, syscall_name, NAPI_AUTO_LENGTH, &v) == napi_ok)
    napi_set_named_property(env, err, "syscall", v);
  if (path && napi_create_string_utf8(env, path, NAPI_AUTO_LENGTH, &v) == napi_ok)
    napi_set_named_property(env, err, "path", v);
  napi_throw(env, err);
}

void throw_type(napi_env env, const char *msg) {
  napi_throw_type_error(env, "ERR_INVALID_ARG_TYPE", msg);
}

/* ---------- argument helpers: return 0 on success, -1 with a pending exception ---------- */

int get_args(napi_env env, napi_callback_info info, size_t want, napi_value *argv) {
  size_t argc = want;
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) {
    napi_throw_error(env, NULL, "napi_get_cb_info failed");
    return -1;
  }
  if (argc < want) {
    throw_type(env, "too few arguments");
    return -1;
  }
  return 0;
}

int get_string(napi_env env, napi_value v, char *buf, size_t cap, const char *what) {
  size_t len = 0;
  if (napi_get_value_string_utf8(env, v, NULL, 0, &len) != napi_ok) {
    char m[128];
    snprintf(m, sizeof m, "%s must be a string", what);
    throw_type(env, m);
    return -1;
  }
  if (len + 1 > cap || len == 0) {
    char m[128];
    snprintf(m, sizeof m, "%s must be a non-empty string shorter than %zu bytes", what, cap);
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", m);
    return -1;
  }
  napi_get_value_string_utf8(env, v, buf, cap, &len);
  if (strlen(buf) != len) {
    char m[128];
    snprintf(m, sizeof m, "%s must not contain NUL bytes", what);
    throw_type(env, m);
    return -1;
  }
  return 0;
}

/* A string, or null/undefined (-> *out = NULL). */
static int get_opt_string(napi_env env, napi_value v, char *buf, size_t cap, const char **out,
                          const char *what) {
  napi_valuetype t;
  if (napi_typeof(env, v, &t) != napi_ok) return -1;
  if (t == napi_null || t == napi_undefined) {
    *out = NULL;
    return 0;
  }
  if (get_string(env, v, buf, cap, what) != 0) return -1;
  *out = buf;
  return 0;
}

static int get_u32(napi_env env, napi_value v, uint32_t *out, const char *what) {
  double d;
  if (napi_get_value_double(env, v, &d) != napi_ok || d < 0 || d > 4294967295.0 ||
      d != (double)(uint32_t)d) {
    char m[128];
    snprintf(m, sizeof m, "%s must be an integer in [0, 2^32)", what);
    throw_type(env, m);
    return -1;
  }
  *out = (uint32_t)d;
  return 0;
}

static int get_bool(napi_env env, napi_value v, bool *out, const char *what) {
  if (napi_get_value_bool(env, v, out) != napi_ok) {
    char m[128];
    snprintf(m, sizeof m, "%s must be a boolean", what);
    throw_type(env, m);
    return -1;
  }
  return 0;
}

static int get_fd(napi_env env, napi_value v, int *out, const char *what) {
  int32_t fd;
  if (napi_get_value_int32(env, v, &fd) != napi_ok || fd < 0) {
    char m[128];
    snprintf(m, sizeof m, "%s must be a non-negative integer fd", what);
    throw_type(env, m);
    return -1;
  }
  *out = fd;
  return 0;
}

/* ---------- syscalls ---------- */

static int write_all_file(const char *path, const char *data) {
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

static void reap(pid_t pid) {
  kill(pid, SIGKILL);
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
  }
}

/*
 * The helper child for make_userns(). It runs on its own small stack but shares the
 * parent's memory, fd table and TLS (CLONE_VM | CLONE_FILES), so it makes raw syscalls
 * only (no errno, no libc state) and does nothing but wait to be killed. PDEATHSIG makes
 * it die with the daemon if the daemon dies between clone() and the kill below.
 */
static int userns_helper(void *arg) {
  pid_t parent = (pid_t)(intptr_t)arg;
  syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (syscall(SYS_getppid) != parent) syscall(SYS_exit, 0);
  for (;;) syscall(SYS_pause);
  return 0;
}

#define HELPER_STACK (64 * 1024)

/*
 * Creates a user namespace mapped "<inner> <base> <count>" (inner is 0 for every sandbox;
 * builder.c maps a sandbox's range onto the builder's) and returns an O_CLOEXEC fd on it,
 * or -1 with errno set and *failed_call / failed_path naming the step.
 *
 * A user namespace needs a process to be created in, so a helper is cloned straight
 * into a new one (clone(CLONE_NEWUSER)), its uid_map and gid_map written, its
 * /proc/<pid>/ns/user opened, and the helper killed and reaped on every path. The clone
 * shares the parent's memory and fd table (like posix_spawn's vfork-style clone), so its
 * cost does not grow with the daemon's heap the way fork() would.
 */
int dsec_make_userns(uint32_t inner, uint32_t uid_base, uint32_t gid_base, uint32_t count,
                     const char **failed_call, char *failed_path) {
  failed_path[0] = '\0';
  void *stack = mmap(NULL, HELPER_STACK, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) {
    *failed_call = "mmap";
    return -1;
  }
  pid_t pid = clone(userns_helper, (char *)stack + HELPER_STACK,
                    CLONE_NEWUSER | CLONE_VM | CLONE_FILES | SIGCHLD,
                    (void *)(intptr_t)getpid());
  if (pid < 0) {
    int e = errno;
    munmap(stack, HELPER_STACK);
    errno = e;
    *failed_call = "clone(CLONE_NEWUSER)";
    return -1;
  }

  int fd = -1, e = 0;
  char buf[64];
  snprintf(buf, sizeof buf, "%u %u %u\n", inner, uid_base, count);
  snprintf(failed_path, PATH_BUF, "/proc/%d/uid_map", (int)pid);
  if (write_all_file(failed_path, buf) < 0) {
    e = errno;
    *failed_call = "write";
    goto out;
  }
  snprintf(buf, sizeof buf, "%u %u %u\n", inner, gid_base, count);
  snprintf(failed_path, PATH_BUF, "/proc/%d/gid_map", (int)pid);
  if (write_all_file(failed_path, buf) < 0) {
    e = errno;
    *failed_call = "write";
    goto out;
  }
  snprintf(failed_path, PATH_BUF, "/proc/%d/ns/user", (int)pid);
  fd = open(failed_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    e = errno;
    *failed_call = "open";
    goto out;
  }
  failed_path[0] = '\0';
out:
  reap(pid);
  munmap(stack, HELPER_STACK); /* only after the helper is gone */
  if (fd < 0) errno = e;
  return fd;
}

/* Returns 0, or -1 with errno set and *failed_call naming the step. */
static int do_idmap_mount(const char *src, const char *dst, int nsfd, bool readonly,
                          const char **failed_call, const char **failed_path) {
  int tfd = (int)syscall(SYS_open_tree, AT_FDCWD, src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (tfd < 0) {
    *failed_call = "open_tree";
    *failed_path = src;
    return -1;
  }
  struct mount_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.attr_set = MOUNT_ATTR_IDMAP | (readonly ? MOUNT_ATTR_RDONLY : 0);
  attr.userns_fd = (uint64_t)nsfd;
  if (syscall(SYS_mount_setattr, tfd, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0) {
    int e = errno;
    close(tfd);
    errno = e;
    *failed_call = "mount_setattr";
    *failed_path = src;
    return -1;
  }
  if (syscall(SYS_move_mount, tfd, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH) < 0) {
    int e = errno;
    close(tfd);
    errno = e;
    *failed_call = "move_mount";
    *failed_path = dst;
    return -1;
  }
  close(tfd); /* the mount stays attached at dst */
  return 0;
}

/* ---------- JS entry points ---------- */

static napi_value js_userns(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  uint32_t ub, gb, cnt;
  if (get_args(env, info, 3, argv) || get_u32(env, argv[0], &ub, "uidBase") ||
      get_u32(env, argv[1], &gb, "gidBase") || get_u32(env, argv[2], &cnt, "count"))
    return NULL;
  if (cnt == 0) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "count must be > 0");
    return NULL;
  }
  const char *call = "";
  char path[PATH_BUF];
  int fd = dsec_make_userns(0, ub, gb, cnt, &call, path);
  if (fd < 0) {
    throw_errno(env, errno, call, path);
    return NULL;
  }
  napi_value r;
  if (napi_create_int32(env, fd, &r) != napi_ok) {
    close(fd);
    napi_throw_error(env, NULL, "napi_create_int32 failed");
    return NULL;
  }
  return r;
}

static napi_value js_idmap_mount_fd(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  char src[PATH_BUF], dst[PATH_BUF];
  int nsfd;
  bool ro;
  if (get_args(env, info, 4, argv) || get_string(env, argv[0], src, sizeof src, "src") ||
      get_string(env, argv[1], dst, sizeof dst, "dst") || get_fd(env, argv[2], &nsfd, "nsfd") ||
      get_bool(env, argv[3], &ro, "readonly"))
    return NULL;
  const char *call = "", *p = "";
  if (do_idmap_mount(src, dst, nsfd, ro, &call, &p) < 0) {
    throw_errno(env, errno, call, p);
    return NULL;
  }
  return NULL;
}

static napi_value js_idmap_mount(napi_env env, napi_callback_info info) {
  napi_value argv[6];
  char src[PATH_BUF], dst[PATH_BUF], nspath[PATH_BUF];
  uint32_t ub, gb, cnt;
  bool ro;
  if (get_args(env, info, 6, argv) || get_string(env, argv[0], src, sizeof src, "src") ||
      get_string(env, argv[1], dst, sizeof dst, "dst") || get_u32(env, argv[2], &ub, "uidBase") ||
      get_u32(env, argv[3], &gb, "gidBase") || get_u32(env, argv[4], &cnt, "count") ||
      get_bool(env, argv[5], &ro, "readonly"))
    return NULL;
  if (cnt == 0) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "count must be > 0");
    return NULL;
  }
  const char *call = "";
  int nsfd = dsec_make_userns(0, ub, gb, cnt, &call, nspath);
  if (nsfd < 0) {
    throw_errno(env, errno, call, nspath);
    return NULL;
  }
  const char *p = "";
  int rc = do_idmap_mount(src, dst, nsfd, ro, &call, &p);
  int e = errno;
  close(nsfd);
  if (rc < 0) throw_errno(env, e, call, p);
  return NULL;
}

static napi_value js_mount(napi_env env, napi_callback_info info) {
  napi_value argv[5];
  char source[PATH_BUF], target[PATH_BUF], fstype[64], data[DATA_BUF];
  const char *sp, *fp, *dp;
  uint32_t flags;
  if (get_args(env, info, 5, argv) ||
      get_opt_string(env, argv[0], source, sizeof source, &sp, "source") ||
      get_string(env, argv[1], target, sizeof target, "target") ||
      get_opt_string(env, argv[2], fstype, sizeof fstype, &fp, "fstype") ||
      get_u32(env, argv[3], &flags, "flags") ||
      get_opt_string(env, argv[4], data, sizeof data, &dp, "data"))
    return NULL;
  if (syscall(SYS_mount, sp, target, fp, (unsigned long)flags, dp) < 0) {
    throw_errno(env, errno, "mount", target);
    return NULL;
  }
  return NULL;
}

static napi_value js_umount(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  char target[PATH_BUF];
  uint32_t flags;
  if (get_args(env, info, 2, argv) || get_string(env, argv[0], target, sizeof target, "target") ||
      get_u32(env, argv[1], &flags, "flags"))
    return NULL;
  if (syscall(SYS_umount2, target, (int)flags) < 0) {
    throw_errno(env, errno, "umount2", target);
    return NULL;
  }
  return NULL;
}

static napi_value js_is_mountpoint(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  char path[PATH_BUF];
  if (get_args(env, info, 1, argv) || get_string(env, argv[0], path, sizeof path, "path"))
    return NULL;
  struct statx stx;
  memset(&stx, 0, sizeof stx);
  if (syscall(SYS_statx, AT_FDCWD, path, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT, 0, &stx) < 0) {
    throw_errno(env, errno, "statx", path);
    return NULL;
  }
  if (!(stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT)) {
    throw_errno(env, ENOTSUP, "statx (STATX_ATTR_MOUNT_ROOT)", path);
    return NULL;
  }
  napi_value r;
  napi_get_boolean(env, (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0, &r);
  return r;
}

/* isReadOnly(path): statvfs(3) f_flag & ST_RDONLY. The kernel sets it when either the
 * mount at `path` or the filesystem's superblock is read-only, so a filesystem that
 * fell back to read-only on its own (overlayfs without a usable work dir, btrfs after
 * an I/O error) shows here although it was mounted read-write. Follows symlinks. */
static napi_value js_is_read_only(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  char path[PATH_BUF];
  if (get_args(env, info, 1, argv) || get_string(env, argv[0], path, sizeof path, "path"))
    return NULL;
  struct statvfs st;
  if (statvfs(path, &st) < 0) {
    throw_errno(env, errno, "statvfs", path);
    return NULL;
  }
  napi_value r;
  napi_get_boolean(env, (st.f_flag & ST_RDONLY) != 0, &r);
  return r;
}

/* dropCache(path): evict a file's clean pages from the page cache
 * (posix_fadvise(POSIX_FADV_DONTNEED) over the whole file). Used after a
 * blob is hashed for verification, so the hash pass does not leave the whole layer
 * resident: a layer's pages should arrive on demand, when sandboxes read them. */
static napi_value js_drop_cache(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  char path[PATH_BUF];
  if (get_args(env, info, 1, argv) || get_string(env, argv[0], path, sizeof path, "path"))
    return NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw_errno(env, errno, "open", path);
    return NULL;
  }
  int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
  if (rc != 0) throw_errno(env, rc, "posix_fadvise", path);
  return NULL;
}

static int set_u32(napi_env env, napi_value obj, const char *name, uint32_t v);

/* peerCred(fd): the credentials of the process at the other end of a connected Unix
 * socket, as the kernel recorded them at connect time (SO_PEERCRED): {pid, uid, gid}.
 * dsecd uses the uid to give execs an owner. */
static napi_value js_peer_cred(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  int fd;
  if (get_args(env, info, 1, argv) || get_fd(env, argv[0], &fd, "fd")) return NULL;
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
    throw_errno(env, errno, "getsockopt(SO_PEERCRED)", "");
    return NULL;
  }
  napi_value obj;
  if (napi_create_object(env, &obj) != napi_ok) return NULL;
  if (set_u32(env, obj, "pid", (uint32_t)cred.pid) || set_u32(env, obj, "uid", cred.uid) || set_u32(env, obj, "gid", cred.gid)) return NULL;
  return obj;
}

/* ---------- scheduling probes (dsec host info; daemon/host/sched.ts) ---------- */

napi_value make_int(napi_env env, int v) {
  napi_value n;
  return napi_create_int32(env, v, &n) == napi_ok ? n : NULL;
}

/* schedCoreProbe(): prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET, 0 (this thread), PIDTYPE_PID,
 * &cookie). Returns 0 or the errno: a kernel without CONFIG_SCHED_CORE does not know the
 * option (EINVAL); one with it but without SMT refuses every command (ENODEV). */
static napi_value js_sched_core_probe(napi_env env, napi_callback_info info) {
  (void)info;
  unsigned long long cookie = 0; /* 8-byte aligned, as the kernel requires */
  int rc = prctl(PR_SCHED_CORE, PR_SCHED_CORE_GET, 0, PR_SCHED_CORE_SCOPE_THREAD, (unsigned long)&cookie);
  return make_int(env, rc == 0 ? 0 : errno);
}

static void *sched_idle_thread(void *arg) {
  struct sched_param sp = {.sched_priority = 0};
  int *out = arg;
  /* pid 0 is the calling thread: only this helper thread changes policy. */
  if (sched_setscheduler(0, SCHED_IDLE, &sp) < 0) *out = errno;
  else *out = sched_getscheduler(0) == SCHED_IDLE ? 0 : EINVAL;
  return NULL;
}

/* schedIdleProbe(): switch a short-lived thread of ours to SCHED_IDLE. Returns 0 or the
 * errno (e.g. EPERM under a seccomp or LSM policy that forbids it). */
static napi_value js_sched_idle_probe(napi_env env, napi_callback_info info) {
  (void)info;
  pthread_t t;
  int result = 0;
  int rc = pthread_create(&t, NULL, sched_idle_thread, &result);
  if (rc != 0) return make_int(env, rc);
  pthread_join(t, NULL);
  return make_int(env, result);
}

/* ---------- unmountAllAsync: the unmount loop of daemon/host/native.ts on the threadpool ---------- */

/* Each umount2 of an overlay or EROFS mount waits for an RCU grace period in the kernel
 * (a millisecond or more under load), so a teardown that unmounts on the JS thread stalls
 * every request behind it. This runs the same loop as the synchronous unmountAll on the
 * libuv threadpool. */
struct unmount_work {
  char target[PATH_BUF];
  napi_async_work work;
  napi_deferred deferred;
  int count;       /* mounts removed */
  int err;         /* errno of the failing step, 0 on success */
  const char *step; /* the failing syscall */
};

/* 1 mount root, 0 not (or missing), -1 with errno for another statx failure. */
static int mount_root_or_missing(const char *path) {
  struct statx stx;
  memset(&stx, 0, sizeof stx);
  if (syscall(SYS_statx, AT_FDCWD, path, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT, 0, &stx) < 0)
    return errno == ENOENT || errno == ENOTDIR ? 0 : -1;
  if (!(stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT)) {
    errno = ENOTSUP;
    return -1;
  }
  return (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
}

static void unmount_execute(napi_env env, void *data) {
  (void)env;
  struct unmount_work *w = data;
  for (;;) {
    int m = mount_root_or_missing(w->target);
    if (m < 0) {
      w->err = errno;
      w->step = "statx";
      return;
    }
    if (m == 0) return;
    if (w->count >= 64) {
      w->err = EBUSY;
      w->step = "umount2 (still mounted after 64 unmounts)";
      return;
    }
    if (syscall(SYS_umount2, w->target, 0) < 0) {
      int e = errno;
      if (e == EBUSY) {
        if (syscall(SYS_umount2, w->target, MNT_DETACH) < 0) {
          w->err = errno;
          w->step = "umount2";
          return;
        }
      } else if (e == EINVAL || e == ENOENT) {
        return;
      } else {
        w->err = e;
        w->step = "umount2";
        return;
      }
    }
    w->count++;
  }
}

static void unmount_complete(napi_env env, napi_status status, void *data) {
  struct unmount_work *w = data;
  if (status != napi_ok && !w->err) {
    w->err = ECANCELED;
    w->step = "umount2";
  }
  if (w->err) {
    /* throw_errno builds the error and throws it: take it back as the rejection value. */
    throw_errno(env, w->err, w->step, w->target);
    napi_value e;
    napi_get_and_clear_last_exception(env, &e);
    napi_reject_deferred(env, w->deferred, e);
  } else {
    napi_resolve_deferred(env, w->deferred, make_int(env, w->count));
  }
  napi_delete_async_work(env, w->work);
  free(w);
}

/* unmountAllAsync(target) -> Promise<number>: see daemon/host/native.ts unmountAllAsync. */
static napi_value js_unmount_all_async(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  if (get_args(env, info, 1, argv) != 0) return NULL;
  struct unmount_work *w = calloc(1, sizeof *w);
  if (!w) {
    throw_errno(env, ENOMEM, "unmountAllAsync", NULL);
    return NULL;
  }
  if (get_string(env, argv[0], w->target, sizeof w->target, "target") != 0) {
    free(w);
    return NULL;
  }
  napi_value promise, name;
  napi_create_string_utf8(env, "dsec-unmount", NAPI_AUTO_LENGTH, &name);
  if (napi_create_promise(env, &w->deferred, &promise) != napi_ok ||
      napi_create_async_work(env, NULL, name, unmount_execute, unmount_complete, w, &w->work) != napi_ok ||
      napi_queue_async_work(env, w->work) != napi_ok) {
    free(w);
    napi_throw_error(env, NULL, "queueing the unmount failed");
    return NULL;
  }
  return promise;
}

/* resolveBeneath(dir, rel) -> "" | errno name: see the file comment. EAGAIN (a rename
 * raced a ".." of the lookup, which RESOLVE_BENEATH refuses to guess about) is retried a
 * few times, then reported. */
static napi_value js_resolve_beneath(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  char dir[PATH_BUF], rel[PATH_BUF];
  if (get_args(env, info, 2, argv) || get_string(env, argv[0], dir, sizeof dir, "dir") ||
      get_string(env, argv[1], rel, sizeof rel, "rel"))
    return NULL;
  int err = 0;
  int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    err = errno;
  } else {
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    long fd = -1;
    for (int tries = 0; tries < 8; tries++) {
      fd = syscall(SYS_openat2, dfd, rel, &how, sizeof how);
      if (fd >= 0 || (errno != EAGAIN && errno != EINTR)) break;
    }
    if (fd >= 0)
      close((int)fd);
    else
      err = errno;
    close(dfd);
  }
  napi_value r;
  napi_create_string_utf8(env, err ? errno_name(err) : "", NAPI_AUTO_LENGTH, &r);
  return r;
}

/* ---------- module init ---------- */

static int set_u32(napi_env env, napi_value obj, const char *name, uint32_t v) {
  napi_value n;
  if (napi_create_uint32(env, v, &n) != napi_ok) return -1;
  return napi_set_named_property(env, obj, name, n) == napi_ok ? 0 : -1;
}

static napi_value init(napi_env env, napi_value exports) {
  napi_property_descriptor fns[] = {
      {"userns", NULL, js_userns, NULL, NULL, NULL, napi_enumerable, NULL},
      {"idmapMountFd", NULL, js_idmap_mount_fd, NULL, NULL, NULL, napi_enumerable, NULL},
      {"idmapMount", NULL, js_idmap_mount, NULL, NULL, NULL, napi_enumerable, NULL},
      {"mount", NULL, js_mount, NULL, NULL, NULL, napi_enumerable, NULL},
      {"umount", NULL, js_umount, NULL, NULL, NULL, napi_enumerable, NULL},
      {"isMountpoint", NULL, js_is_mountpoint, NULL, NULL, NULL, napi_enumerable, NULL},
      {"isReadOnly", NULL, js_is_read_only, NULL, NULL, NULL, napi_enumerable, NULL},
      {"dropCache", NULL, js_drop_cache, NULL, NULL, NULL, napi_enumerable, NULL},
      {"peerCred", NULL, js_peer_cred, NULL, NULL, NULL, napi_enumerable, NULL},
      {"schedCoreProbe", NULL, js_sched_core_probe, NULL, NULL, NULL, napi_enumerable, NULL},
      {"schedIdleProbe", NULL, js_sched_idle_probe, NULL, NULL, NULL, napi_enumerable, NULL},
      {"unmountAllAsync", NULL, js_unmount_all_async, NULL, NULL, NULL, napi_enumerable, NULL},
      {"resolveBeneath", NULL, js_resolve_beneath, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  if (napi_define_properties(env, exports, sizeof fns / sizeof fns[0], fns) != napi_ok) return NULL;
  /* Functions of the other source files (each documents its own). */
  if (dsec_bpf_init(env, exports) != 0 || dsec_fs_init(env, exports) != 0 || dsec_builder_init(env, exports) != 0 ||
      dsec_spawn_init(env, exports) != 0 || dsec_overlay_init(env, exports) != 0) return NULL;

  napi_value c;
  if (napi_create_object(env, &c) != napi_ok) return NULL;
  if (set_u32(env, c, "MS_RDONLY", 1) || set_u32(env, c, "MS_NOSUID", 2) ||
      set_u32(env, c, "MS_NODEV", 4) || set_u32(env, c, "MS_NOEXEC", 8) ||
      set_u32(env, c, "MS_REMOUNT", 32) || set_u32(env, c, "MS_NOATIME", 1024) ||
      set_u32(env, c, "MS_BIND", 4096) || set_u32(env, c, "MS_REC", 16384) ||
      set_u32(env, c, "MS_PRIVATE", 1 << 18) || set_u32(env, c, "MS_SLAVE", 1 << 19) ||
      set_u32(env, c, "MNT_FORCE", MNT_FORCE) || set_u32(env, c, "MNT_DETACH", MNT_DETACH) ||
      set_u32(env, c, "UMOUNT_NOFOLLOW", UMOUNT_NOFOLLOW))
    return NULL;
  napi_set_named_property(env, exports, "constants", c);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
