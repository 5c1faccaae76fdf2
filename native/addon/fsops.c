/*
 * Filesystem operations of the addon for the writable-layer store (daemon/storage/):
 * btrfs subvolumes and qgroups, XFS project ids and project quotas. Each is one or a few
 * ioctls/quotactls on the store's own filesystem, so a sandbox's writable layer costs no
 * `btrfs`/`xfs_quota` process (create latency is a target: docs/ARCHITECTURE.md).
 *
 *   btrfsQuotaEnable(mnt, simple)          BTRFS_IOC_QUOTA_CTL: ENABLE_SIMPLE_QUOTA (Linux 6.7+)
 *                                          when `simple`, else ENABLE (full qgroups).
 *   btrfsSubvolCreate(parentDir, name)     BTRFS_IOC_SUBVOL_CREATE on parentDir.
 *   btrfsSubvolDestroy(parentDir, name) -> Promise<void>
 *                                          BTRFS_IOC_SNAP_DESTROY, on a libuv worker thread:
 *                                          the subvolume's name is gone when it resolves and
 *                                          the kernel's cleaner frees its extents in the
 *                                          background, so on-disk size does not matter; the
 *                                          ioctl itself prunes the subvolume's cached inodes
 *                                          and their page cache (hundreds of ms for 100k hot
 *                                          files), which is why it runs off the JS thread.
 *   btrfsSubvolId(path) -> number          BTRFS_IOC_INO_LOOKUP: the id of the subvolume
 *                                          holding `path` (its level-0 qgroup is 0/<id>).
 *   btrfsQgroupLimit(mnt, qgroupid, bytes) BTRFS_IOC_QGROUP_LIMIT on level-0 qgroup
 *                                          0/`qgroupid`, through a directory `mnt` of another
 *                                          subvolume (the top level): max referenced = bytes
 *                                          (0 clears the limit). Not through the limited
 *                                          subvolume itself: the ioctl reserves metadata in
 *                                          the fd's subvolume (btrfs_start_transaction since
 *                                          Linux 6.17 and stable backports), which its own
 *                                          qgroup refuses with EDQUOT once it is at its
 *                                          limit, so a full layer's limit could not be raised.
 *   btrfsQgroupRemove(mnt, qgroupid)       BTRFS_IOC_QGROUP_CREATE(create = 0): deletes a
 *                                          level-0 qgroup (EBUSY while it still has usage).
 *   btrfsQgroups(mnt) -> [{id, referenced, exclusive, maxReferenced}]
 *                                          BTRFS_IOC_TREE_SEARCH_V2 over the quota tree: every
 *                                          level-0 qgroup's committed counters and limit, in
 *                                          one or a few ioctls however many there are.
 *   btrfsFsid(mnt) -> string               BTRFS_IOC_FS_INFO: the filesystem's uuid (the name
 *                                          of its /sys/fs/btrfs/<uuid> directory).
 *   fsGetProject(path) -> {projid, inherit}
 *   fsSetProject(path, projid, inherit)    FS_IOC_FSGETXATTR / FS_IOC_FSSETXATTR: the project id
 *                                          of an inode and FS_XFLAG_PROJINHERIT (XFS, ext4).
 *   xfsQuotaState(mnt) -> {accounting, enforcing}
 *                                          quotactl_fd(Q_XGETQSTATV, PRJQUOTA): whether project
 *                                          quota is accounted and enforced on the mount.
 *   xfsSetProjectLimit(mnt, projid, bytes) quotactl_fd(Q_XSETQLIM, PRJQUOTA): block hard limit
 *                                          (0 clears it).
 *   xfsProjectUsage(mnt, projid) -> {usedBytes, hardLimitBytes} | null
 *                                          quotactl_fd(Q_XGETQUOTA, PRJQUOTA); null when the
 *                                          project has no quota record (ENOENT).
 *   loopAttach(image, directIo) -> {device, fd}
 *                                          LOOP_CTL_GET_FREE + LOOP_CONFIGURE: attaches `image`
 *                                          to a free loop device with LO_FLAGS_AUTOCLEAR (the
 *                                          device detaches itself when its last user, e.g. the
 *                                          filesystem mounted on it, lets go) and, when
 *                                          `directIo`, LO_FLAGS_DIRECT_IO (no second copy of the
 *                                          data in the host's page cache). `fd` keeps the device
 *                                          attached until the caller has mounted it; close it
 *                                          then (fs.closeSync). Another process taking the same
 *                                          free device (EBUSY) makes it try the next one.
 *   loopDetach(device)                     LOOP_CLR_FD (on a busy device the kernel only sets
 *                                          autoclear).
 *
 * Byte counts cross the boundary as JS numbers (exact below 2^53 bytes, 8 PiB). Errors
 * are thrown like the rest of the addon: an Error whose code is the errno name, with
 * syscall and path (throw_errno in dsec_native.c).
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/btrfs.h>
#include <linux/btrfs_tree.h>
#include <linux/dqblk_xfs.h>
#include <linux/fs.h>
#include <linux/loop.h>
#include <linux/quota.h>

#include "dsec_native.h"

/* Newer than Debian 12's headers (values are the kernel ABI). */
#ifndef BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA
#define BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA 4
#endif
#ifndef SYS_quotactl_fd
#define SYS_quotactl_fd 443
#endif
#ifndef FS_QSTATV_VERSION1
#define FS_QSTATV_VERSION1 1
#endif

#define FS_PATH_BUF 4096
/* Search results per TREE_SEARCH_V2 call: 256 KiB holds ~3,600 qgroup items. */
#define SEARCH_BUF (256 * 1024)

static int open_dir(napi_env env, const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno(env, errno, "open", path);
  return fd;
}

static int get_path(napi_env env, napi_value v, char *buf, const char *what) {
  return get_string(env, v, buf, FS_PATH_BUF, what);
}

/* A non-negative integer argument below 2^53 (byte counts, ids). */
static int get_u64(napi_env env, napi_value v, uint64_t *out, const char *what) {
  double d;
  if (napi_get_value_double(env, v, &d) != napi_ok || d < 0 || d > 9007199254740992.0 || d != (double)(uint64_t)d) {
    char m[128];
    snprintf(m, sizeof m, "%s must be an integer in [0, 2^53]", what);
    throw_type(env, m);
    return -1;
  }
  *out = (uint64_t)d;
  return 0;
}

static int get_boolean(napi_env env, napi_value v, bool *out, const char *what) {
  if (napi_get_value_bool(env, v, out) != napi_ok) {
    char m[128];
    snprintf(m, sizeof m, "%s must be a boolean", what);
    throw_type(env, m);
    return -1;
  }
  return 0;
}

static int set_num(napi_env env, napi_value obj, const char *name, double v) {
  napi_value n;
  if (napi_create_double(env, v, &n) != napi_ok) return -1;
  return napi_set_named_property(env, obj, name, n) == napi_ok ? 0 : -1;
}

static int set_bool(napi_env env, napi_value obj, const char *name, bool v) {
  napi_value b;
  if (napi_get_boolean(env, v, &b) != napi_ok) return -1;
  return napi_set_named_property(env, obj, name, b) == napi_ok ? 0 : -1;
}

/* A subvolume name: one path component that fits btrfs_ioctl_vol_args.name. */
static int check_name(napi_env env, const char *name) {
  if (strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..") || strlen(name) > BTRFS_PATH_NAME_MAX) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "subvolume name must be one path component of at most 4087 bytes");
    return -1;
  }
  return 0;
}

/* ---------- btrfs ---------- */

static napi_value js_btrfs_quota_enable(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  char mnt[FS_PATH_BUF];
  bool simple;
  if (get_args(env, info, 2, argv) || get_path(env, argv[0], mnt, "mnt") || get_boolean(env, argv[1], &simple, "simple")) return NULL;
  int fd = open_dir(env, mnt);
  if (fd < 0) return NULL;
  struct btrfs_ioctl_quota_ctl_args a;
  memset(&a, 0, sizeof a);
  a.cmd = simple ? BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA : BTRFS_QUOTA_CTL_ENABLE;
  int rc = ioctl(fd, BTRFS_IOC_QUOTA_CTL, &a);
  int e = errno;
  close(fd);
  if (rc < 0) throw_errno(env, e, simple ? "ioctl(BTRFS_IOC_QUOTA_CTL, ENABLE_SIMPLE_QUOTA)" : "ioctl(BTRFS_IOC_QUOTA_CTL, ENABLE)", mnt);
  return NULL;
}

/* SUBVOL_CREATE or SNAP_DESTROY of parent/name. */
static napi_value vol_op(napi_env env, napi_callback_info info, unsigned long req, const char *what) {
  napi_value argv[2];
  char parent[FS_PATH_BUF], name[FS_PATH_BUF];
  if (get_args(env, info, 2, argv) || get_path(env, argv[0], parent, "parentDir") || get_path(env, argv[1], name, "name") || check_name(env, name))
    return NULL;
  int fd = open_dir(env, parent);
  if (fd < 0) return NULL;
  struct btrfs_ioctl_vol_args a;
  memset(&a, 0, sizeof a);
  memcpy(a.name, name, strlen(name) + 1); /* check_name bounded it */
  int rc = ioctl(fd, req, &a);
  int e = errno;
  close(fd);
  if (rc < 0) {
    char p[FS_PATH_BUF * 2 + 2];
    snprintf(p, sizeof p, "%s/%s", parent, name);
    throw_errno(env, e, what, p);
  }
  return NULL;
}

static napi_value js_btrfs_subvol_create(napi_env env, napi_callback_info info) {
  return vol_op(env, info, BTRFS_IOC_SUBVOL_CREATE, "ioctl(BTRFS_IOC_SUBVOL_CREATE)");
}

/* The async SNAP_DESTROY: inputs, and the errno the worker thread saw. */
struct destroy_work {
  char parent[FS_PATH_BUF];
  char name[BTRFS_PATH_NAME_MAX + 1];
  int err;
  napi_deferred deferred;
  napi_async_work work;
};

static void destroy_execute(napi_env env, void *data) {
  (void)env;
  struct destroy_work *w = data;
  int fd = open(w->parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    w->err = errno;
    return;
  }
  struct btrfs_ioctl_vol_args a;
  memset(&a, 0, sizeof a);
  memcpy(a.name, w->name, strlen(w->name) + 1);
  w->err = ioctl(fd, BTRFS_IOC_SNAP_DESTROY, &a) < 0 ? errno : 0;
  close(fd);
}

/* Builds the same Error throw_errno would, as a value to reject with. */
static napi_value errno_error(napi_env env, int e, const char *call, const char *path) {
  throw_errno(env, e, call, path);
  napi_value err;
  napi_get_and_clear_last_exception(env, &err);
  return err;
}

static void destroy_complete(napi_env env, napi_status status, void *data) {
  struct destroy_work *w = data;
  if (status == napi_ok && w->err == 0) {
    napi_value u;
    napi_get_undefined(env, &u);
    napi_resolve_deferred(env, w->deferred, u);
  } else {
    char p[FS_PATH_BUF + BTRFS_PATH_NAME_MAX + 2];
    snprintf(p, sizeof p, "%s/%s", w->parent, w->name);
    napi_reject_deferred(env, w->deferred, errno_error(env, w->err ? w->err : EIO, "ioctl(BTRFS_IOC_SNAP_DESTROY)", p));
  }
  napi_delete_async_work(env, w->work);
  free(w);
}

static napi_value js_btrfs_subvol_destroy(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  struct destroy_work *w = calloc(1, sizeof *w);
  if (!w) {
    throw_errno(env, ENOMEM, "calloc", "");
    return NULL;
  }
  if (get_args(env, info, 2, argv) || get_path(env, argv[0], w->parent, "parentDir") ||
      get_string(env, argv[1], w->name, sizeof w->name, "name") || check_name(env, w->name)) {
    free(w);
    return NULL;
  }
  napi_value promise, rname;
  if (napi_create_promise(env, &w->deferred, &promise) != napi_ok ||
      napi_create_string_utf8(env, "dsec:btrfsSubvolDestroy", NAPI_AUTO_LENGTH, &rname) != napi_ok ||
      napi_create_async_work(env, NULL, rname, destroy_execute, destroy_complete, w, &w->work) != napi_ok ||
      napi_queue_async_work(env, w->work) != napi_ok) {
    free(w);
    napi_throw_error(env, NULL, "cannot queue btrfsSubvolDestroy");
    return NULL;
  }
  return promise;
}

static napi_value js_btrfs_subvol_id(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  char path[FS_PATH_BUF];
  if (get_args(env, info, 1, argv) || get_path(env, argv[0], path, "path")) return NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw_errno(env, errno, "open", path);
    return NULL;
  }
  struct btrfs_ioctl_ino_lookup_args a;
  memset(&a, 0, sizeof a);
  a.treeid = 0; /* 0: the tree of the fd's inode */
  a.objectid = BTRFS_FIRST_FREE_OBJECTID;
  int rc = ioctl(fd, BTRFS_IOC_INO_LOOKUP, &a);
  int e = errno;
  close(fd);
  if (rc < 0) {
    throw_errno(env, e, "ioctl(BTRFS_IOC_INO_LOOKUP)", path);
    return NULL;
  }
  napi_value r;
  napi_create_double(env, (double)a.treeid, &r);
  return r;
}

static napi_value js_btrfs_qgroup_limit(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  char path[FS_PATH_BUF];
  uint64_t id, bytes;
  if (get_args(env, info, 3, argv) || get_path(env, argv[0], path, "mnt") || get_u64(env, argv[1], &id, "qgroupid") ||
      get_u64(env, argv[2], &bytes, "bytes"))
    return NULL;
  if (id == 0) {
    throw_type(env, "qgroupid must be a subvolume id (not 0)");
    return NULL;
  }
  int fd = open_dir(env, path);
  if (fd < 0) return NULL;
  struct btrfs_ioctl_qgroup_limit_args a;
  memset(&a, 0, sizeof a);
  a.qgroupid = id; /* level 0: 0/<subvolume id> */
  a.lim.flags = BTRFS_QGROUP_LIMIT_MAX_RFER;
  a.lim.max_rfer = bytes ? bytes : (uint64_t)-1; /* -1 clears the limit */
  int rc = ioctl(fd, BTRFS_IOC_QGROUP_LIMIT, &a);
  int e = errno;
  close(fd);
  if (rc < 0) throw_errno(env, e, "ioctl(BTRFS_IOC_QGROUP_LIMIT)", path);
  return NULL;
}

static napi_value js_btrfs_qgroup_remove(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  char mnt[FS_PATH_BUF];
  uint64_t id;
  if (get_args(env, info, 2, argv) || get_path(env, argv[0], mnt, "mnt") || get_u64(env, argv[1], &id, "qgroupid")) return NULL;
  int fd = open_dir(env, mnt);
  if (fd < 0) return NULL;
  struct btrfs_ioctl_qgroup_create_args a;
  memset(&a, 0, sizeof a);
  a.create = 0;
  a.qgroupid = id;
  int rc = ioctl(fd, BTRFS_IOC_QGROUP_CREATE, &a);
  int e = errno;
  close(fd);
  if (rc < 0) throw_errno(env, e, "ioctl(BTRFS_IOC_QGROUP_CREATE, remove)", mnt);
  return NULL;
}

/* One level-0 qgroup as collected from the quota tree. */
struct qg {
  uint64_t id, rfer, excl, max_rfer;
  bool has_limit;
};

/* The entry for `id` in v[0..n), which is sorted by id unless `*sorted` was cleared. */
static struct qg *qg_find(struct qg *v, size_t n, uint64_t id, bool sorted) {
  if (sorted) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (v[mid].id < id) lo = mid + 1;
      else hi = mid;
    }
    return lo < n && v[lo].id == id ? &v[lo] : NULL;
  }
  for (size_t i = 0; i < n; i++)
    if (v[i].id == id) return &v[i];
  return NULL;
}

static napi_value js_btrfs_qgroups(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  char mnt[FS_PATH_BUF];
  if (get_args(env, info, 1, argv) || get_path(env, argv[0], mnt, "mnt")) return NULL;
  int fd = open_dir(env, mnt);
  if (fd < 0) return NULL;
  struct btrfs_ioctl_search_args_v2 *sa = calloc(1, sizeof *sa + SEARCH_BUF);
  size_t cap = 256, n = 0;
  struct qg *v = malloc(cap * sizeof *v);
  if (!sa || !v) {
    free(sa);
    free(v);
    close(fd);
    throw_errno(env, ENOMEM, "malloc", mnt);
    return NULL;
  }
  struct btrfs_ioctl_search_key *k = &sa->key;
  k->tree_id = BTRFS_QUOTA_TREE_OBJECTID;
  k->min_objectid = 0;
  k->max_objectid = 0; /* level-0 qgroups' items are keyed (0, type, qgroupid) */
  k->min_type = BTRFS_QGROUP_INFO_KEY;
  k->max_type = BTRFS_QGROUP_LIMIT_KEY;
  k->min_offset = 0;
  k->max_offset = (uint64_t)-1;
  k->min_transid = 0;
  k->max_transid = (uint64_t)-1;
  int err = 0;
  bool sorted = true;
  for (;;) {
    k->nr_items = (uint32_t)-1;
    sa->buf_size = SEARCH_BUF;
    if (ioctl(fd, BTRFS_IOC_TREE_SEARCH_V2, sa) < 0) {
      err = errno;
      break;
    }
    if (k->nr_items == 0) break;
    size_t off = 0;
    struct btrfs_ioctl_search_header h;
    for (uint32_t i = 0; i < k->nr_items; i++) {
      memcpy(&h, (char *)sa->buf + off, sizeof h);
      off += sizeof h;
      const char *item = (const char *)sa->buf + off;
      off += h.len;
      if (h.objectid != 0) continue;
      /* Info items come first, one per qgroup in id order: appending keeps v sorted. A
       * limit item finds its qgroup by binary search; one without an info item (never
       * seen in practice) is appended and the search turns linear. */
      struct qg *q = h.type == BTRFS_QGROUP_INFO_KEY ? NULL : qg_find(v, n, h.offset, sorted);
      if (!q) {
        if (h.type != BTRFS_QGROUP_INFO_KEY || (n > 0 && v[n - 1].id >= h.offset)) sorted = false;
        if (n == cap) {
          struct qg *nv = realloc(v, cap * 2 * sizeof *v);
          if (!nv) {
            err = ENOMEM;
            break;
          }
          v = nv;
          cap *= 2;
        }
        q = &v[n++];
        memset(q, 0, sizeof *q);
        q->id = h.offset;
      }
      if (h.type == BTRFS_QGROUP_INFO_KEY && h.len >= sizeof(struct btrfs_qgroup_info_item)) {
        struct btrfs_qgroup_info_item it;
        memcpy(&it, item, sizeof it);
        q->rfer = le64toh(it.rfer);
        q->excl = le64toh(it.excl);
      } else if (h.type == BTRFS_QGROUP_LIMIT_KEY && h.len >= sizeof(struct btrfs_qgroup_limit_item)) {
        struct btrfs_qgroup_limit_item it;
        memcpy(&it, item, sizeof it);
        if (le64toh(it.flags) & BTRFS_QGROUP_LIMIT_MAX_RFER) {
          q->has_limit = true;
          q->max_rfer = le64toh(it.max_rfer);
        }
      }
    }
    if (err) break;
    /* Continue after the last key returned. */
    k->min_type = h.type;
    k->min_offset = h.offset + 1;
    if (h.offset == (uint64_t)-1) {
      if (h.type >= BTRFS_QGROUP_LIMIT_KEY) break;
      k->min_type = h.type + 1;
      k->min_offset = 0;
    }
  }
  close(fd);
  free(sa);
  if (err) {
    free(v);
    throw_errno(env, err, "ioctl(BTRFS_IOC_TREE_SEARCH_V2, quota tree)", mnt);
    return NULL;
  }
  napi_value arr;
  napi_create_array_with_length(env, n, &arr);
  for (size_t i = 0; i < n; i++) {
    napi_value o, lim;
    napi_create_object(env, &o);
    set_num(env, o, "id", (double)v[i].id);
    set_num(env, o, "referenced", (double)v[i].rfer);
    set_num(env, o, "exclusive", (double)v[i].excl);
    if (v[i].has_limit && v[i].max_rfer != (uint64_t)-1) napi_create_double(env, (double)v[i].max_rfer, &lim);
    else napi_get_null(env, &lim);
    napi_set_named_property(env, o, "maxReferenced", lim);
    napi_set_element(env, arr, (uint32_t)i, o);
  }
  free(v);
  return arr;
}

static napi_value js_btrfs_fsid(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  char mnt[FS_PATH_BUF];
  if (get_args(env, info, 1, argv) || get_path(env, argv[0], mnt, "mnt")) return NULL;
  int fd = open_dir(env, mnt);
  if (fd < 0) return NULL;
  struct btrfs_ioctl_fs_info_args a;
  memset(&a, 0, sizeof a);
  int rc = ioctl(fd, BTRFS_IOC_FS_INFO, &a);
  int e = errno;
  close(fd);
  if (rc < 0) {
    throw_errno(env, e, "ioctl(BTRFS_IOC_FS_INFO)", mnt);
    return NULL;
  }
  char s[37];
  const unsigned char *u = a.fsid;
  snprintf(s, sizeof s, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3], u[4], u[5], u[6],
           u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  napi_value r;
  napi_create_string_utf8(env, s, NAPI_AUTO_LENGTH, &r);
  return r;
}

/* ---------- project ids (FS_IOC_FS[GS]ETXATTR) ---------- */

static napi_value js_fs_get_project(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  char path[FS_PATH_BUF];
  if (get_args(env, info, 1, argv) || get_path(env, argv[0], path, "path")) return NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw_errno(env, errno, "open", path);
    return NULL;
  }
  struct fsxattr x;
  memset(&x, 0, sizeof x);
  int rc = ioctl(fd, FS_IOC_FSGETXATTR, &x);
  int e = errno;
  close(fd);
  if (rc < 0) {
    throw_errno(env, e, "ioctl(FS_IOC_FSGETXATTR)", path);
    return NULL;
  }
  napi_value o;
  napi_create_object(env, &o);
  set_num(env, o, "projid", (double)x.fsx_projid);
  set_bool(env, o, "inherit", (x.fsx_xflags & FS_XFLAG_PROJINHERIT) != 0);
  return o;
}

static napi_value js_fs_set_project(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  char path[FS_PATH_BUF];
  uint64_t projid;
  bool inherit;
  if (get_args(env, info, 3, argv) || get_path(env, argv[0], path, "path") || get_u64(env, argv[1], &projid, "projid") ||
      get_boolean(env, argv[2], &inherit, "inherit"))
    return NULL;
  if (projid > UINT32_MAX) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "projid must fit in 32 bits");
    return NULL;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw_errno(env, errno, "open", path);
    return NULL;
  }
  struct fsxattr x;
  memset(&x, 0, sizeof x);
  int rc = ioctl(fd, FS_IOC_FSGETXATTR, &x);
  const char *call = "ioctl(FS_IOC_FSGETXATTR)";
  if (rc == 0) {
    x.fsx_projid = (uint32_t)projid;
    if (inherit) x.fsx_xflags |= FS_XFLAG_PROJINHERIT;
    else x.fsx_xflags &= ~FS_XFLAG_PROJINHERIT;
    rc = ioctl(fd, FS_IOC_FSSETXATTR, &x);
    call = "ioctl(FS_IOC_FSSETXATTR)";
  }
  int e = errno;
  close(fd);
  if (rc < 0) throw_errno(env, e, call, path);
  return NULL;
}

/* ---------- XFS project quota (quotactl_fd, Linux 5.14+) ---------- */

static long quotactl_at(int fd, unsigned cmd, uint32_t id, void *addr) {
  return syscall(SYS_quotactl_fd, fd, QCMD(cmd, PRJQUOTA), id, addr);
}

static napi_value js_xfs_quota_state(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  char mnt[FS_PATH_BUF];
  if (get_args(env, info, 1, argv) || get_path(env, argv[0], mnt, "mnt")) return NULL;
  int fd = open_dir(env, mnt);
  if (fd < 0) return NULL;
  struct fs_quota_statv st;
  memset(&st, 0, sizeof st);
  st.qs_version = FS_QSTATV_VERSION1;
  long rc = quotactl_at(fd, Q_XGETQSTATV, 0, &st);
  int e = errno;
  close(fd);
  if (rc < 0) {
    throw_errno(env, e, "quotactl_fd(Q_XGETQSTATV, PRJQUOTA)", mnt);
    return NULL;
  }
  napi_value o;
  napi_create_object(env, &o);
  set_bool(env, o, "accounting", (st.qs_flags & FS_QUOTA_PDQ_ACCT) != 0);
  set_bool(env, o, "enforcing", (st.qs_flags & FS_QUOTA_PDQ_ENFD) != 0);
  return o;
}

static napi_value js_xfs_set_project_limit(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  char mnt[FS_PATH_BUF];
  uint64_t projid, bytes;
  if (get_args(env, info, 3, argv) || get_path(env, argv[0], mnt, "mnt") || get_u64(env, argv[1], &projid, "projid") ||
      get_u64(env, argv[2], &bytes, "bytes"))
    return NULL;
  int fd = open_dir(env, mnt);
  if (fd < 0) return NULL;
  struct fs_disk_quota q;
  memset(&q, 0, sizeof q);
  q.d_version = FS_DQUOT_VERSION;
  q.d_flags = FS_PROJ_QUOTA;
  q.d_fieldmask = FS_DQ_BHARD | FS_DQ_BSOFT;
  q.d_id = (uint32_t)projid;
  q.d_blk_hardlimit = (bytes + 511) / 512; /* basic blocks of 512 bytes; 0 clears */
  q.d_blk_softlimit = 0;
  long rc = quotactl_at(fd, Q_XSETQLIM, (uint32_t)projid, &q);
  int e = errno;
  close(fd);
  if (rc < 0) throw_errno(env, e, "quotactl_fd(Q_XSETQLIM, PRJQUOTA)", mnt);
  return NULL;
}

static napi_value js_xfs_project_usage(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  char mnt[FS_PATH_BUF];
  uint64_t projid;
  if (get_args(env, info, 2, argv) || get_path(env, argv[0], mnt, "mnt") || get_u64(env, argv[1], &projid, "projid")) return NULL;
  int fd = open_dir(env, mnt);
  if (fd < 0) return NULL;
  struct fs_disk_quota q;
  memset(&q, 0, sizeof q);
  long rc = quotactl_at(fd, Q_XGETQUOTA, (uint32_t)projid, &q);
  int e = errno;
  close(fd);
  napi_value r;
  if (rc < 0) {
    if (e == ENOENT) {
      napi_get_null(env, &r);
      return r;
    }
    throw_errno(env, e, "quotactl_fd(Q_XGETQUOTA, PRJQUOTA)", mnt);
    return NULL;
  }
  napi_create_object(env, &r);
  set_num(env, r, "usedBytes", (double)q.d_bcount * 512.0);
  set_num(env, r, "hardLimitBytes", (double)q.d_blk_hardlimit * 512.0);
  return r;
}

/* ---------- loop devices ---------- */

/* Attempts at a free loop device before giving up: each failure is another process
 * winning the same device between LOOP_CTL_GET_FREE and LOOP_CONFIGURE. */
#define LOOP_ATTEMPTS 16

static napi_value js_loop_attach(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  char image[FS_PATH_BUF];
  bool dio;
  if (get_args(env, info, 2, argv) || get_path(env, argv[0], image, "image") || get_boolean(env, argv[1], &dio, "directIo")) return NULL;
  int img = open(image, O_RDWR | O_CLOEXEC);
  if (img < 0) {
    throw_errno(env, errno, "open", image);
    return NULL;
  }
  int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (ctl < 0) {
    int e = errno;
    close(img);
    throw_errno(env, e, "open", "/dev/loop-control");
    return NULL;
  }
  char dev[64] = "";
  int lfd = -1, e = 0;
  const char *call = "";
  for (int attempt = 0; attempt < LOOP_ATTEMPTS; attempt++) {
    int n = ioctl(ctl, LOOP_CTL_GET_FREE);
    if (n < 0) {
      e = errno;
      call = "ioctl(LOOP_CTL_GET_FREE)";
      break;
    }
    snprintf(dev, sizeof dev, "/dev/loop%d", n);
    lfd = open(dev, O_RDWR | O_CLOEXEC);
    if (lfd < 0) {
      e = errno;
      call = "open";
      break;
    }
    struct loop_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.fd = (uint32_t)img;
    cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | (dio ? LO_FLAGS_DIRECT_IO : 0);
    size_t len = strlen(image);
    if (len >= LO_NAME_SIZE) len = LO_NAME_SIZE - 1;
    memcpy(cfg.info.lo_file_name, image, len);
    if (ioctl(lfd, LOOP_CONFIGURE, &cfg) == 0) {
      e = 0;
      break;
    }
    e = errno;
    call = "ioctl(LOOP_CONFIGURE)";
    close(lfd);
    lfd = -1;
    if (e != EBUSY) break;
  }
  close(ctl);
  close(img); /* the loop device holds its own reference to the image */
  if (lfd < 0) {
    throw_errno(env, e ? e : EBUSY, call, dev[0] ? dev : image);
    return NULL;
  }
  napi_value o, d;
  napi_create_object(env, &o);
  napi_create_string_utf8(env, dev, NAPI_AUTO_LENGTH, &d);
  napi_set_named_property(env, o, "device", d);
  set_num(env, o, "fd", lfd);
  return o;
}

static napi_value js_loop_detach(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  char dev[FS_PATH_BUF];
  if (get_args(env, info, 1, argv) || get_path(env, argv[0], dev, "device")) return NULL;
  int fd = open(dev, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    throw_errno(env, errno, "open", dev);
    return NULL;
  }
  int rc = ioctl(fd, LOOP_CLR_FD, 0);
  int e = errno;
  close(fd);
  if (rc < 0) throw_errno(env, e, "ioctl(LOOP_CLR_FD)", dev);
  return NULL;
}

int dsec_fs_init(napi_env env, napi_value exports) {
  napi_property_descriptor fns[] = {
      {"btrfsQuotaEnable", NULL, js_btrfs_quota_enable, NULL, NULL, NULL, napi_enumerable, NULL},
      {"btrfsSubvolCreate", NULL, js_btrfs_subvol_create, NULL, NULL, NULL, napi_enumerable, NULL},
      {"btrfsSubvolDestroy", NULL, js_btrfs_subvol_destroy, NULL, NULL, NULL, napi_enumerable, NULL},
      {"btrfsSubvolId", NULL, js_btrfs_subvol_id, NULL, NULL, NULL, napi_enumerable, NULL},
      {"btrfsQgroupLimit", NULL, js_btrfs_qgroup_limit, NULL, NULL, NULL, napi_enumerable, NULL},
      {"btrfsQgroupRemove", NULL, js_btrfs_qgroup_remove, NULL, NULL, NULL, napi_enumerable, NULL},
      {"btrfsQgroups", NULL, js_btrfs_qgroups, NULL, NULL, NULL, napi_enumerable, NULL},
      {"btrfsFsid", NULL, js_btrfs_fsid, NULL, NULL, NULL, napi_enumerable, NULL},
      {"fsGetProject", NULL, js_fs_get_project, NULL, NULL, NULL, napi_enumerable, NULL},
      {"fsSetProject", NULL, js_fs_set_project, NULL, NULL, NULL, napi_enumerable, NULL},
      {"xfsQuotaState", NULL, js_xfs_quota_state, NULL, NULL, NULL, napi_enumerable, NULL},
      {"xfsSetProjectLimit", NULL, js_xfs_set_project_limit, NULL, NULL, NULL, napi_enumerable, NULL},
      {"xfsProjectUsage", NULL, js_xfs_project_usage, NULL, NULL, NULL, napi_enumerable, NULL},
      {"loopAttach", NULL, js_loop_attach, NULL, NULL, NULL, napi_enumerable, NULL},
      {"loopDetach", NULL, js_loop_detach, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  return napi_define_properties(env, exports, sizeof fns / sizeof fns[0], fns) == napi_ok ? 0 : -1;
}
