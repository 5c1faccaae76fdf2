/*
 * overlay.c: a sandbox's root overlay mounted from file descriptors, so that the mount
 * table names no host path.
 *
 *   mountOverlayAsync(target, lowers, nsfd, layerDir, upperName, workName, options)
 *       -> Promise<void>
 *
 *   lowers     the layer directories (mounted EROFS blobs), TOP layer first, as overlayfs
 *              stacks `lowerdir+` in the order given;
 *   nsfd       a user namespace fd (dsec_make_userns): every lower is attached idmapped to
 *              it, read-only;
 *   layerDir   the directory holding the writable layer's upper and work dirs, named
 *              upperName and workName inside it (overlayfs wants both on one mount);
 *   options    further "key=value" overlay options (index=off, ...), set as strings;
 *   target     where the overlay is attached (move_mount).
 *
 * Each lower is cloned (open_tree OPEN_TREE_CLONE) and made idmapped and read-only
 * (mount_setattr) but never attached anywhere; layerDir is cloned the same way (plain).
 * Directory fds opened inside those detached clones are handed to overlayfs with
 * fsconfig(FSCONFIG_SET_FD, "lowerdir+" / "upperdir" / "workdir") (Linux 6.13+; cloning
 * detached mounts as layers needs 6.15+). overlayfs keeps, for /proc/<pid>/mountinfo and
 * /proc/<pid>/mounts, the path of each fd as d_path(3) gives it at that moment: inside a
 * detached clone that is the path from the clone's root, so the options read
 * `lowerdir+=/,...,upperdir=/upper,workdir=/work` instead of host paths. overlayfs takes
 * private clones of every layer when the superblock is created (FSCONFIG_CMD_CREATE), so
 * the detached clones are closed (dissolved) right after it, and nothing but the overlay
 * itself is left in the host mount table.
 *
 * It runs on the libuv threadpool: closing a detached clone unmounts it, which waits for an
 * RCU grace period. The promise rejects with an Error shaped like throw_errno's (code,
 * errno, syscall naming the failing step, path) whose message also carries the kernel's
 * own explanation from the fs_context log (e.g. "overlayfs: workdir and upperdir must
 * reside under the same mount") when there is one. EINVAL/ENOPARAM from `lowerdir+`, or
 * EINVAL at CMD_CREATE on a kernel that refuses detached layers, means the kernel cannot
 * do this; the caller then mounts with path options instead (daemon/image/rootfs.ts).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <node_api.h>

#include "dsec_native.h"

#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#ifndef SYS_fsopen
#define SYS_fsopen 430
#endif
#ifndef SYS_fsconfig
#define SYS_fsconfig 431
#endif
#ifndef SYS_fsmount
#define SYS_fsmount 432
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

#define OVL_PATH 4096
/* overlayfs's own limit on stacked layers (OVL_MAX_STACK). */
#define OVL_MAX_LOWERS 500
#define OVL_MAX_OPTIONS 32
#define OVL_LOG 1024

struct overlay_work {
  napi_async_work work;
  napi_deferred deferred;
  char target[OVL_PATH];
  char layer_dir[OVL_PATH];
  char upper[256];
  char workdir[256];
  int nsfd;
  int nlowers;
  char **lowers;
  int noptions;
  char **options; /* "key=value" */
  /* result */
  int err;
  char step[64];
  char path[OVL_PATH];
  char log[OVL_LOG];
};

static void free_work(struct overlay_work *w) {
  for (int i = 0; i < w->nlowers; i++) free(w->lowers[i]);
  free(w->lowers);
  for (int i = 0; i < w->noptions; i++) free(w->options[i]);
  free(w->options);
  free(w);
}

static void fail(struct overlay_work *w, const char *step, const char *path) {
  w->err = errno;
  snprintf(w->step, sizeof w->step, "%s", step);
  snprintf(w->path, sizeof w->path, "%s", path ? path : "");
}

/* Appends the fs_context's pending messages ("e overlayfs: ...") to w->log. */
static void read_fs_log(struct overlay_work *w, int fsfd) {
  char buf[512];
  for (int i = 0; i < 8; i++) {
    ssize_t n = read(fsfd, buf, sizeof buf - 1);
    if (n <= 0) break;
    buf[n] = '\0';
    if (buf[n - 1] == '\n') buf[n - 1] = '\0';
    size_t used = strlen(w->log);
    snprintf(w->log + used, sizeof w->log - used, "%s%s", used ? "; " : "", buf);
  }
}

static int fsconfig_call(int fd, unsigned cmd, const char *key, const void *value, int aux) {
  return (int)syscall(SYS_fsconfig, fd, cmd, key, value, aux);
}

static void overlay_execute(napi_env env, void *data) {
  (void)env;
  struct overlay_work *w = data;
  int n = w->nlowers;
  int *trees = calloc((size_t)n, sizeof(int));
  int *dirs = calloc((size_t)n, sizeof(int));
  int ltree = -1, ufd = -1, wfd = -1, fsfd = -1, mfd = -1;
  if (!trees || !dirs) {
    errno = ENOMEM;
    fail(w, "calloc", NULL);
    goto out;
  }
  for (int i = 0; i < n; i++) trees[i] = dirs[i] = -1;

  for (int i = 0; i < n; i++) {
    trees[i] = (int)syscall(SYS_open_tree, AT_FDCWD, w->lowers[i], OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (trees[i] < 0) {
      fail(w, "open_tree", w->lowers[i]);
      goto out;
    }
    struct mount_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY;
    attr.userns_fd = (uint64_t)w->nsfd;
    if (syscall(SYS_mount_setattr, trees[i], "", AT_EMPTY_PATH, &attr, sizeof attr) < 0) {
      fail(w, "mount_setattr", w->lowers[i]);
      goto out;
    }
    /* open_tree's fd is an O_PATH file, which fsconfig does not take: open the clone's root. */
    dirs[i] = openat(trees[i], ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirs[i] < 0) {
      fail(w, "openat", w->lowers[i]);
      goto out;
    }
  }
  ltree = (int)syscall(SYS_open_tree, AT_FDCWD, w->layer_dir, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (ltree < 0) {
    fail(w, "open_tree", w->layer_dir);
    goto out;
  }
  ufd = openat(ltree, w->upper, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (ufd < 0) {
    fail(w, "openat", w->upper);
    goto out;
  }
  wfd = openat(ltree, w->workdir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (wfd < 0) {
    fail(w, "openat", w->workdir);
    goto out;
  }

  fsfd = (int)syscall(SYS_fsopen, "overlay", FSOPEN_CLOEXEC);
  if (fsfd < 0) {
    fail(w, "fsopen", "overlay");
    goto out;
  }
  if (fsconfig_call(fsfd, FSCONFIG_SET_STRING, "source", "overlay", 0) < 0) {
    fail(w, "fsconfig:source", NULL);
    goto out;
  }
  for (int i = 0; i < w->noptions; i++) {
    char *eq = strchr(w->options[i], '=');
    if (eq) *eq = '\0';
    int rc = eq ? fsconfig_call(fsfd, FSCONFIG_SET_STRING, w->options[i], eq + 1, 0)
                : fsconfig_call(fsfd, FSCONFIG_SET_FLAG, w->options[i], NULL, 0);
    if (rc < 0) {
      fail(w, "fsconfig", w->options[i]);
      if (eq) *eq = '=';
      goto out;
    }
    if (eq) *eq = '=';
  }
  for (int i = 0; i < n; i++) {
    if (fsconfig_call(fsfd, FSCONFIG_SET_FD, "lowerdir+", NULL, dirs[i]) < 0) {
      fail(w, "fsconfig:lowerdir+", w->lowers[i]);
      goto out;
    }
  }
  if (fsconfig_call(fsfd, FSCONFIG_SET_FD, "upperdir", NULL, ufd) < 0) {
    fail(w, "fsconfig:upperdir", w->layer_dir);
    goto out;
  }
  if (fsconfig_call(fsfd, FSCONFIG_SET_FD, "workdir", NULL, wfd) < 0) {
    fail(w, "fsconfig:workdir", w->layer_dir);
    goto out;
  }
  if (fsconfig_call(fsfd, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0) {
    fail(w, "fsconfig:create", w->target);
    goto out;
  }
  mfd = (int)syscall(SYS_fsmount, fsfd, FSMOUNT_CLOEXEC, 0);
  if (mfd < 0) {
    fail(w, "fsmount", w->target);
    goto out;
  }
  if (syscall(SYS_move_mount, mfd, "", AT_FDCWD, w->target, MOVE_MOUNT_F_EMPTY_PATH) < 0) {
    fail(w, "move_mount", w->target);
    goto out;
  }
out:
  if (w->err && fsfd >= 0) read_fs_log(w, fsfd);
  /* Closing mfd after a failed move_mount dissolves the overlay again; closing the clones
   * dissolves them (overlayfs holds clones of its own). */
  if (mfd >= 0) close(mfd);
  if (fsfd >= 0) close(fsfd);
  if (ufd >= 0) close(ufd);
  if (wfd >= 0) close(wfd);
  if (ltree >= 0) close(ltree);
  for (int i = 0; dirs && i < n; i++) if (dirs[i] >= 0) close(dirs[i]);
  for (int i = 0; trees && i < n; i++) if (trees[i] >= 0) close(trees[i]);
  free(trees);
  free(dirs);
}

static void overlay_complete(napi_env env, napi_status status, void *data) {
  struct overlay_work *w = data;
  if (status != napi_ok && !w->err) {
    w->err = ECANCELED;
    snprintf(w->step, sizeof w->step, "mountOverlayAsync");
  }
  if (w->err) {
    throw_errno(env, w->err, w->step, w->path);
    napi_value e;
    napi_get_and_clear_last_exception(env, &e);
    if (w->log[0]) {
      napi_value msg, log;
      char text[OVL_PATH + OVL_LOG + 256];
      size_t len = 0;
      napi_value old;
      if (napi_get_named_property(env, e, "message", &old) == napi_ok &&
          napi_get_value_string_utf8(env, old, text, sizeof text - OVL_LOG - 16, &len) == napi_ok) {
        snprintf(text + len, sizeof text - len, " (kernel: %s)", w->log);
        if (napi_create_string_utf8(env, text, NAPI_AUTO_LENGTH, &msg) == napi_ok)
          napi_set_named_property(env, e, "message", msg);
      }
      if (napi_create_string_utf8(env, w->log, NAPI_AUTO_LENGTH, &log) == napi_ok)
        napi_set_named_property(env, e, "kernelLog", log);
    }
    napi_reject_deferred(env, w->deferred, e);
  } else {
    napi_value u;
    napi_get_undefined(env, &u);
    napi_resolve_deferred(env, w->deferred, u);
  }
  napi_delete_async_work(env, w->work);
  free_work(w);
}

/* Copies a JS array of strings into a malloc'd array; 0, or -1 with a pending exception. */
static int get_string_array(napi_env env, napi_value v, int max, char ***out, int *count, const char *what) {
  bool is_array = false;
  uint32_t len = 0;
  if (napi_is_array(env, v, &is_array) != napi_ok || !is_array || napi_get_array_length(env, v, &len) != napi_ok) {
    char m[128];
    snprintf(m, sizeof m, "%s must be an array of strings", what);
    throw_type(env, m);
    return -1;
  }
  if ((int)len > max) {
    char m[128];
    snprintf(m, sizeof m, "%s has more than %d entries", what, max);
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", m);
    return -1;
  }
  char **arr = calloc(len ? len : 1, sizeof(char *));
  if (!arr) {
    throw_errno(env, ENOMEM, "calloc", NULL);
    return -1;
  }
  for (uint32_t i = 0; i < len; i++) {
    napi_value el;
    char buf[OVL_PATH];
    int bad = napi_get_element(env, v, i, &el) != napi_ok;
    if (bad) throw_type(env, what);
    if (bad || get_string(env, el, buf, sizeof buf, what) != 0) { /* get_string threw */
      for (uint32_t j = 0; j < i; j++) free(arr[j]);
      free(arr);
      return -1;
    }
    arr[i] = strdup(buf);
    if (!arr[i]) {
      for (uint32_t j = 0; j < i; j++) free(arr[j]);
      free(arr);
      throw_errno(env, ENOMEM, "strdup", NULL);
      return -1;
    }
  }
  *out = arr;
  *count = (int)len;
  return 0;
}

static napi_value js_mount_overlay_async(napi_env env, napi_callback_info info) {
  napi_value argv[7];
  if (get_args(env, info, 7, argv) != 0) return NULL;
  struct overlay_work *w = calloc(1, sizeof *w);
  if (!w) {
    throw_errno(env, ENOMEM, "mountOverlayAsync", NULL);
    return NULL;
  }
  int32_t nsfd = -1;
  if (get_string(env, argv[0], w->target, sizeof w->target, "target") != 0 ||
      get_string_array(env, argv[1], OVL_MAX_LOWERS, &w->lowers, &w->nlowers, "lowers") != 0) {
    free_work(w);
    return NULL;
  }
  if (napi_get_value_int32(env, argv[2], &nsfd) != napi_ok || nsfd < 0) {
    free_work(w);
    throw_type(env, "nsfd must be a non-negative integer fd");
    return NULL;
  }
  w->nsfd = nsfd;
  if (get_string(env, argv[3], w->layer_dir, sizeof w->layer_dir, "layerDir") != 0 ||
      get_string(env, argv[4], w->upper, sizeof w->upper, "upperName") != 0 ||
      get_string(env, argv[5], w->workdir, sizeof w->workdir, "workName") != 0 ||
      get_string_array(env, argv[6], OVL_MAX_OPTIONS, &w->options, &w->noptions, "options") != 0) {
    free_work(w);
    return NULL;
  }
  if (w->nlowers == 0 || strchr(w->upper, '/') || strchr(w->workdir, '/')) {
    free_work(w);
    throw_type(env, "mountOverlayAsync needs at least one lower, and plain names for upperName and workName");
    return NULL;
  }
  napi_value promise, name;
  napi_create_string_utf8(env, "dsec-overlay", NAPI_AUTO_LENGTH, &name);
  if (napi_create_promise(env, &w->deferred, &promise) != napi_ok ||
      napi_create_async_work(env, NULL, name, overlay_execute, overlay_complete, w, &w->work) != napi_ok ||
      napi_queue_async_work(env, w->work) != napi_ok) {
    free_work(w);
    napi_throw_error(env, NULL, "queueing the overlay mount failed");
    return NULL;
  }
  return promise;
}

int dsec_overlay_init(napi_env env, napi_value exports) {
  napi_value fn;
  if (napi_create_function(env, "mountOverlayAsync", NAPI_AUTO_LENGTH, js_mount_overlay_async, NULL, &fn) != napi_ok) return -1;
  return napi_set_named_property(env, exports, "mountOverlayAsync", fn) == napi_ok ? 0 : -1;
}
