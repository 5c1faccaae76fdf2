/*
 * builder.c: views of directory trees for dsec's builder identity (daemon/host/builder.ts).
 *
 *   openTreeIdmapped(src, inner, outer, count, readonly) -> fd
 *       A DETACHED idmapped clone of the directory `src` (open_tree OPEN_TREE_CLONE, not
 *       recursive: mounts below `src` are not part of the view), returned as an O_CLOEXEC
 *       fd and attached nowhere, so it never appears in any mount table and vanishes when
 *       the last fd on it is closed. Through it, a file whose on-disk owner is host id
 *       `inner + k` (k < count) appears owned by host id `outer + k`; every other owner
 *       appears as the overflow id (65534). The idmap is the user namespace
 *       "inner outer count" (gids likewise). `readonly` adds MOUNT_ATTR_RDONLY.
 *
 *       dsecd passes such an fd to a builder process (host ids outer..outer+count-1 are
 *       uid 0..count-1 of its user namespace), which then reads the tree through
 *       /proc/self/fd/N as if it owned it: with inner = 0 a root-owned image tree keeps
 *       its in-image owners; with inner = a sandbox's base uid, a writable layer's files
 *       appear with their in-image owners (the ownership shift of a commit, done by the
 *       kernel). The builder needs no permission on `src` itself or on its parents.
 *
 * Errors throw like the other functions of the addon (code = errno name, syscall, path):
 * EINVAL from mount_setattr typically means the filesystem of `src` has no idmapped
 * mount support.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <node_api.h>

#include "dsec_native.h"

#ifndef SYS_open_tree
#define SYS_open_tree 428
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

#define PATH_BUF 4096

static int get_u32_arg(napi_env env, napi_value v, uint32_t *out, const char *what) {
  double d;
  if (napi_get_value_double(env, v, &d) != napi_ok || d < 0 || d > 4294967295.0 || d != (double)(uint32_t)d) {
    char m[128];
    snprintf(m, sizeof m, "%s must be an integer in [0, 2^32)", what);
    throw_type(env, m);
    return -1;
  }
  *out = (uint32_t)d;
  return 0;
}

static napi_value js_open_tree_idmapped(napi_env env, napi_callback_info info) {
  napi_value argv[5];
  char src[PATH_BUF], nspath[PATH_BUF];
  uint32_t inner, outer, count;
  bool ro;
  if (get_args(env, info, 5, argv) || get_string(env, argv[0], src, sizeof src, "src") ||
      get_u32_arg(env, argv[1], &inner, "inner") || get_u32_arg(env, argv[2], &outer, "outer") ||
      get_u32_arg(env, argv[3], &count, "count"))
    return NULL;
  if (napi_get_value_bool(env, argv[4], &ro) != napi_ok) {
    throw_type(env, "readonly must be a boolean");
    return NULL;
  }
  if (count == 0 || (uint64_t)inner + count > UINT32_MAX || (uint64_t)outer + count > UINT32_MAX) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "count must be > 0 and inner + count, outer + count below 2^32");
    return NULL;
  }
  const char *call = "";
  int nsfd = dsec_make_userns(inner, outer, outer, count, &call, nspath);
  if (nsfd < 0) {
    throw_errno(env, errno, call, nspath);
    return NULL;
  }
  int tfd = (int)syscall(SYS_open_tree, AT_FDCWD, src, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (tfd < 0) {
    int e = errno;
    close(nsfd);
    throw_errno(env, e, "open_tree", src);
    return NULL;
  }
  struct mount_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.attr_set = MOUNT_ATTR_IDMAP | (ro ? MOUNT_ATTR_RDONLY : 0);
  attr.userns_fd = (uint64_t)nsfd;
  int rc = (int)syscall(SYS_mount_setattr, tfd, "", AT_EMPTY_PATH, &attr, sizeof attr);
  int e = errno;
  close(nsfd); /* the mount holds its own reference to the namespace */
  if (rc < 0) {
    close(tfd);
    throw_errno(env, e, "mount_setattr(MOUNT_ATTR_IDMAP)", src);
    return NULL;
  }
  napi_value r = make_int(env, tfd);
  if (!r) close(tfd);
  return r;
}

int dsec_builder_init(napi_env env, napi_value exports) {
  napi_value fn;
  if (napi_create_function(env, "openTreeIdmapped", NAPI_AUTO_LENGTH, js_open_tree_idmapped, NULL, &fn) != napi_ok) return -1;
  return napi_set_named_property(env, exports, "openTreeIdmapped", fn) == napi_ok ? 0 : -1;
}
