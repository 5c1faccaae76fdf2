/*
 * eBPF side of the addon, over libbpf 1.1: load dsec's BPF object files, attach their
 * programs to cgroups (egress policy) or to kernel functions (denial counters), and read
 * and write their maps. TypeScript wrapper and contracts: daemon/host/bpf.ts.
 *
 *   bpfObjectOpen(path, pinRoot, maxEntries) -> { handle, programs[], maps[] }
 *       bpf_object__open_file with pin_root_path = pinRoot (maps declared with
 *       LIBBPF_PIN_BY_NAME are pinned there, and reused when a compatible pin exists, so
 *       their contents outlive dsecd), max_entries overrides per map name, then load.
 *       programs: { name, fd, section, attachType }; maps: { name, fd, type, keySize,
 *       valueSize, maxEntries }. The object stays loaded until bpfObjectClose.
 *   bpfObjectClose(handle)
 *   bpfCgroupAttach(progFd, cgroupPath, attachType, progName) -> "present"|"replaced"|"attached"
 *       BPF_F_ALLOW_MULTI attachment to a cgroup2 directory. A program of the same name
 *       already attached there (an earlier dsecd's load of it) is replaced atomically
 *       (BPF_F_REPLACE), so a restart never leaves two copies enforcing or counting.
 *   bpfCgroupDetach(cgroupPath, attachType, progName) -> count of detached programs
 *   bpfCgroupQuery(cgroupPath, attachType) -> [{ id, name }]
 *   bpfTracingAttach(handle, progName, linkPinPath, force) -> "present"|"replaced"|"attached"
 *       fentry/fexit programs: attach and pin the link at linkPinPath so it outlives
 *       dsecd. A pinned link whose program has the same tag (same code) is kept unless
 *       force; otherwise it is unpinned (the kernel detaches it when its last reference
 *       goes) and the new program attached and pinned.
 *   bpfMapUpdate(fd, key, value, flags)        flags: BPF_ANY 0, BPF_NOEXIST 1, BPF_EXIST 2
 *   bpfMapLookup(fd, key, valueSize) -> Buffer | null
 *   bpfMapDelete(fd, key) -> boolean (false: no such key)
 *   bpfMapNextKey(fd, key | null, keySize) -> Buffer | null (null: no more keys)
 *
 * Errors throw like the rest of the addon (code = errno name). Failures inside libbpf
 * carry the tail of libbpf's log (the verifier's output for a rejected program) in the
 * message, because "EINVAL" alone says nothing about which instruction was refused.
 *
 * Everything is synchronous: a map operation is one bpf(2) call (about a microsecond);
 * loading an object (verification) takes milliseconds and happens once per dsecd start.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "dsec_native.h"

/* Objects loaded at once: dsecd loads two (egress, seccomp counters); 16 leaves room. */
#define MAX_OBJECTS 16
static struct bpf_object *objects[MAX_OBJECTS];

/* libbpf's log, kept as a ring of the last LOG_CAP bytes for error messages. */
#define LOG_CAP 8192
static char log_buf[LOG_CAP];
static size_t log_len;

static int log_print(enum libbpf_print_level level, const char *fmt, va_list ap) {
  if (level == LIBBPF_DEBUG) return 0;
  char line[1024];
  int n = vsnprintf(line, sizeof line, fmt, ap);
  if (n <= 0) return 0;
  if ((size_t)n >= sizeof line) n = sizeof line - 1;
  if (log_len + (size_t)n >= LOG_CAP) {
    /* Keep the newest half: the verifier's last lines say why it refused. */
    size_t keep = LOG_CAP / 2 < log_len ? LOG_CAP / 2 : log_len;
    memmove(log_buf, log_buf + log_len - keep, keep);
    log_len = keep;
  }
  memcpy(log_buf + log_len, line, (size_t)n);
  log_len += (size_t)n;
  log_buf[log_len] = 0;
  return 0;
}

/* Throws an errno error whose message also carries libbpf's log tail (last 1.5 KiB). */
static void throw_libbpf(napi_env env, int e, const char *what, const char *path) {
  if (log_len == 0) {
    throw_errno(env, e, what, path);
    return;
  }
  const char *tail = log_len > 1536 ? log_buf + log_len - 1536 : log_buf;
  char ctx[1800];
  int n = snprintf(ctx, sizeof ctx, "%.200s; libbpf: ", path ? path : "");
  if (n < 0) n = 0;
  size_t room = sizeof ctx - (size_t)n - 1, tl = strlen(tail);
  if (tl > room) tail += tl - room;
  memcpy(ctx + n, tail, strlen(tail) + 1);
  /* Trailing newlines of the log would end the message oddly. */
  size_t l = strlen(ctx);
  while (l > 0 && (ctx[l - 1] == '\n' || ctx[l - 1] == ' ')) ctx[--l] = 0;
  throw_errno(env, e, what, ctx);
}

static int get_u32(napi_env env, napi_value v, uint32_t *out, const char *what) {
  if (napi_get_value_uint32(env, v, out) != napi_ok) {
    char m[128];
    snprintf(m, sizeof m, "%s must be a non-negative integer", what);
    throw_type(env, m);
    return -1;
  }
  return 0;
}

static int get_i32(napi_env env, napi_value v, int32_t *out, const char *what) {
  if (napi_get_value_int32(env, v, out) != napi_ok) {
    char m[128];
    snprintf(m, sizeof m, "%s must be an integer", what);
    throw_type(env, m);
    return -1;
  }
  return 0;
}

static int get_buffer(napi_env env, napi_value v, void **data, size_t *len, const char *what) {
  bool is;
  if (napi_is_buffer(env, v, &is) != napi_ok || !is) {
    char m[128];
    snprintf(m, sizeof m, "%s must be a Buffer", what);
    throw_type(env, m);
    return -1;
  }
  return napi_get_buffer_info(env, v, data, len) == napi_ok ? 0 : -1;
}

static int set_str(napi_env env, napi_value obj, const char *k, const char *v) {
  napi_value s;
  if (napi_create_string_utf8(env, v ? v : "", NAPI_AUTO_LENGTH, &s) != napi_ok) return -1;
  return napi_set_named_property(env, obj, k, s) == napi_ok ? 0 : -1;
}

static int set_num(napi_env env, napi_value obj, const char *k, double v) {
  napi_value n;
  if (napi_create_double(env, v, &n) != napi_ok) return -1;
  return napi_set_named_property(env, obj, k, n) == napi_ok ? 0 : -1;
}

static struct bpf_object *get_object(napi_env env, napi_value v) {
  uint32_t h;
  if (get_u32(env, v, &h, "handle") != 0) return NULL;
  if (h >= MAX_OBJECTS || !objects[h]) {
    napi_throw_range_error(env, "ERR_OUT_OF_RANGE", "no loaded BPF object with that handle");
    return NULL;
  }
  return objects[h];
}

/* bpfObjectOpen(path, pinRoot, maxEntries {name: n}) */
static napi_value js_object_open(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  if (get_args(env, info, 3, argv) != 0) return NULL;
  char path[4096], pin_root[4096];
  if (get_string(env, argv[0], path, sizeof path, "path") != 0) return NULL;
  if (get_string(env, argv[1], pin_root, sizeof pin_root, "pinRoot") != 0) return NULL;
  int slot = -1;
  for (int i = 0; i < MAX_OBJECTS; i++)
    if (!objects[i]) {
      slot = i;
      break;
    }
  if (slot < 0) {
    throw_errno(env, EMFILE, "bpf_object__open_file", path);
    return NULL;
  }
  log_len = 0;
  log_buf[0] = 0;
  LIBBPF_OPTS(bpf_object_open_opts, opts, .pin_root_path = pin_root);
  struct bpf_object *obj = bpf_object__open_file(path, &opts);
  if (!obj) {
    throw_libbpf(env, errno ? errno : EINVAL, "bpf_object__open_file", path);
    return NULL;
  }
  /* max_entries overrides, by map name. */
  napi_value names;
  uint32_t nnames = 0;
  if (napi_get_property_names(env, argv[2], &names) == napi_ok) napi_get_array_length(env, names, &nnames);
  for (uint32_t i = 0; i < nnames; i++) {
    napi_value k, v;
    char name[128];
    uint32_t n;
    if (napi_get_element(env, names, i, &k) != napi_ok || get_string(env, k, name, sizeof name, "map name") != 0 ||
        napi_get_property(env, argv[2], k, &v) != napi_ok || get_u32(env, v, &n, "maxEntries value") != 0) {
      bpf_object__close(obj);
      return NULL;
    }
    struct bpf_map *m = bpf_object__find_map_by_name(obj, name);
    if (!m) {
      bpf_object__close(obj);
      throw_errno(env, ENOENT, "bpf_object__find_map_by_name", name);
      return NULL;
    }
    int rc = bpf_map__set_max_entries(m, n);
    if (rc) {
      bpf_object__close(obj);
      throw_libbpf(env, -rc, "bpf_map__set_max_entries", name);
      return NULL;
    }
  }
  /* The verifier gives up with EAGAIN when a signal is pending for the loading thread
   * (seen with node --cpu-prof: SIGPROF several times a millisecond); blocked for the
   * length of the load, signals stay pending and are delivered right after. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  int rc = bpf_object__load(obj);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    bpf_object__close(obj);
    throw_libbpf(env, -rc, "bpf_object__load", path);
    return NULL;
  }
  objects[slot] = obj;

  napi_value res, progs, maps;
  napi_create_object(env, &res);
  napi_create_array(env, &progs);
  napi_create_array(env, &maps);
  set_num(env, res, "handle", slot);
  uint32_t i = 0;
  struct bpf_program *p;
  bpf_object__for_each_program(p, obj) {
    napi_value o;
    napi_create_object(env, &o);
    set_str(env, o, "name", bpf_program__name(p));
    set_str(env, o, "section", bpf_program__section_name(p));
    set_num(env, o, "fd", bpf_program__fd(p));
    set_num(env, o, "attachType", bpf_program__expected_attach_type(p));
    napi_set_element(env, progs, i++, o);
  }
  i = 0;
  struct bpf_map *m;
  bpf_object__for_each_map(m, obj) {
    napi_value o;
    napi_create_object(env, &o);
    set_str(env, o, "name", bpf_map__name(m));
    set_num(env, o, "fd", bpf_map__fd(m));
    set_num(env, o, "type", bpf_map__type(m));
    set_num(env, o, "keySize", bpf_map__key_size(m));
    set_num(env, o, "valueSize", bpf_map__value_size(m));
    set_num(env, o, "maxEntries", bpf_map__max_entries(m));
    napi_set_element(env, maps, i++, o);
  }
  napi_set_named_property(env, res, "programs", progs);
  napi_set_named_property(env, res, "maps", maps);
  return res;
}

static napi_value js_object_close(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  if (get_args(env, info, 1, argv) != 0) return NULL;
  uint32_t h;
  if (get_u32(env, argv[0], &h, "handle") != 0) return NULL;
  if (h < MAX_OBJECTS && objects[h]) {
    bpf_object__close(objects[h]);
    objects[h] = NULL;
  }
  return NULL;
}

/* Name and tag of a program fd; 0 or -errno. */
static int prog_info(int fd, struct bpf_prog_info *pi) {
  __u32 len = sizeof *pi;
  memset(pi, 0, sizeof *pi);
  return bpf_obj_get_info_by_fd(fd, pi, &len) ? -errno : 0;
}

/* Up to 64 program ids attached to cgroup fd cg for attach type t; count or -errno. */
#define MAX_ATTACHED 64
static int query_ids(int cg, enum bpf_attach_type t, __u32 *ids) {
  __u32 cnt = MAX_ATTACHED, flags = 0;
  if (bpf_prog_query(cg, t, 0, &flags, ids, &cnt)) return -errno;
  return (int)cnt;
}

static int open_cgroup(napi_env env, napi_value v, char *path, size_t cap) {
  if (get_string(env, v, path, cap, "cgroupPath") != 0) return -1;
  int cg = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (cg < 0) {
    throw_errno(env, errno, "open", path);
    return -1;
  }
  return cg;
}

static napi_value make_str(napi_env env, const char *s) {
  napi_value v;
  return napi_create_string_utf8(env, s, NAPI_AUTO_LENGTH, &v) == napi_ok ? v : NULL;
}

/* bpfCgroupAttach(progFd, cgroupPath, attachType, progName) */
static napi_value js_cgroup_attach(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  if (get_args(env, info, 4, argv) != 0) return NULL;
  int32_t prog_fd;
  uint32_t type;
  char path[4096], name[64];
  if (get_i32(env, argv[0], &prog_fd, "progFd") != 0 || get_u32(env, argv[2], &type, "attachType") != 0 ||
      get_string(env, argv[3], name, sizeof name, "progName") != 0)
    return NULL;
  int cg = open_cgroup(env, argv[1], path, sizeof path);
  if (cg < 0) return NULL;
  struct bpf_prog_info mine;
  int rc = prog_info(prog_fd, &mine);
  if (rc) {
    close(cg);
    throw_errno(env, -rc, "bpf_obj_get_info_by_fd", name);
    return NULL;
  }
  __u32 ids[MAX_ATTACHED];
  int n = query_ids(cg, (enum bpf_attach_type)type, ids);
  if (n < 0) {
    close(cg);
    throw_errno(env, -n, "bpf_prog_query", path);
    return NULL;
  }
  int old_fd = -1;
  for (int i = 0; i < n; i++) {
    if (ids[i] == mine.id) {
      close(cg);
      if (old_fd >= 0) close(old_fd);
      return make_str(env, "present");
    }
    if (old_fd >= 0) continue;
    int fd = bpf_prog_get_fd_by_id(ids[i]);
    if (fd < 0) continue;
    struct bpf_prog_info pi;
    /* The kernel keeps the first 15 bytes of a program name (BPF_OBJ_NAME_LEN). */
    if (prog_info(fd, &pi) == 0 && strncmp(pi.name, name, sizeof pi.name - 1) == 0)
      old_fd = fd;
    else
      close(fd);
  }
  LIBBPF_OPTS(bpf_prog_attach_opts, opts, .flags = BPF_F_ALLOW_MULTI);
  if (old_fd >= 0) {
    opts.flags |= BPF_F_REPLACE;
    opts.replace_prog_fd = old_fd;
  }
  rc = bpf_prog_attach_opts(prog_fd, cg, (enum bpf_attach_type)type, &opts);
  int e = errno;
  if (old_fd >= 0) close(old_fd);
  close(cg);
  if (rc) {
    throw_errno(env, e, "bpf_prog_attach", path);
    return NULL;
  }
  return make_str(env, old_fd >= 0 ? "replaced" : "attached");
}

/* bpfCgroupDetach(cgroupPath, attachType, progName) -> count */
static napi_value js_cgroup_detach(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  if (get_args(env, info, 3, argv) != 0) return NULL;
  uint32_t type;
  char path[4096], name[64];
  if (get_u32(env, argv[1], &type, "attachType") != 0 || get_string(env, argv[2], name, sizeof name, "progName") != 0) return NULL;
  int cg = open_cgroup(env, argv[0], path, sizeof path);
  if (cg < 0) return NULL;
  __u32 ids[MAX_ATTACHED];
  int n = query_ids(cg, (enum bpf_attach_type)type, ids);
  if (n < 0) {
    close(cg);
    throw_errno(env, -n, "bpf_prog_query", path);
    return NULL;
  }
  int detached = 0;
  for (int i = 0; i < n; i++) {
    int fd = bpf_prog_get_fd_by_id(ids[i]);
    if (fd < 0) continue;
    struct bpf_prog_info pi;
    if (prog_info(fd, &pi) == 0 && strncmp(pi.name, name, sizeof pi.name - 1) == 0 &&
        bpf_prog_detach2(fd, cg, (enum bpf_attach_type)type) == 0)
      detached++;
    close(fd);
  }
  close(cg);
  return make_int(env, detached);
}

/* bpfCgroupQuery(cgroupPath, attachType) -> [{id, name}] */
static napi_value js_cgroup_query(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  if (get_args(env, info, 2, argv) != 0) return NULL;
  uint32_t type;
  char path[4096];
  if (get_u32(env, argv[1], &type, "attachType") != 0) return NULL;
  int cg = open_cgroup(env, argv[0], path, sizeof path);
  if (cg < 0) return NULL;
  __u32 ids[MAX_ATTACHED];
  int n = query_ids(cg, (enum bpf_attach_type)type, ids);
  close(cg);
  if (n < 0) {
    throw_errno(env, -n, "bpf_prog_query", path);
    return NULL;
  }
  napi_value arr;
  napi_create_array(env, &arr);
  for (int i = 0; i < n; i++) {
    napi_value o;
    napi_create_object(env, &o);
    set_num(env, o, "id", ids[i]);
    int fd = bpf_prog_get_fd_by_id(ids[i]);
    struct bpf_prog_info pi;
    if (fd >= 0 && prog_info(fd, &pi) == 0) set_str(env, o, "name", pi.name);
    else set_str(env, o, "name", "");
    if (fd >= 0) close(fd);
    napi_set_element(env, arr, (uint32_t)i, o);
  }
  return arr;
}

/* bpfTracingAttach(handle, progName, linkPinPath, force) */
static napi_value js_tracing_attach(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  if (get_args(env, info, 4, argv) != 0) return NULL;
  struct bpf_object *obj = get_object(env, argv[0]);
  if (!obj) return NULL;
  char name[128], pin[4096];
  bool force = false;
  if (get_string(env, argv[1], name, sizeof name, "progName") != 0 || get_string(env, argv[2], pin, sizeof pin, "linkPinPath") != 0)
    return NULL;
  napi_get_value_bool(env, argv[3], &force);
  struct bpf_program *p = bpf_object__find_program_by_name(obj, name);
  if (!p) {
    throw_errno(env, ENOENT, "bpf_object__find_program_by_name", name);
    return NULL;
  }
  struct bpf_prog_info mine;
  int rc = prog_info(bpf_program__fd(p), &mine);
  if (rc) {
    throw_errno(env, -rc, "bpf_obj_get_info_by_fd", name);
    return NULL;
  }
  bool replaced = false;
  int lfd = bpf_obj_get(pin);
  if (lfd >= 0) {
    struct bpf_link_info li;
    __u32 len = sizeof li;
    memset(&li, 0, sizeof li);
    bool same = false;
    if (!force && bpf_obj_get_info_by_fd(lfd, &li, &len) == 0) {
      int pfd = bpf_prog_get_fd_by_id(li.prog_id);
      struct bpf_prog_info old;
      if (pfd >= 0 && prog_info(pfd, &old) == 0) same = memcmp(old.tag, mine.tag, sizeof old.tag) == 0;
      if (pfd >= 0) close(pfd);
    }
    close(lfd);
    if (same) return make_str(env, "present");
    if (unlink(pin) != 0 && errno != ENOENT) {
      throw_errno(env, errno, "unlink", pin);
      return NULL;
    }
    replaced = true;
  }
  log_len = 0;
  struct bpf_link *link = bpf_program__attach(p);
  if (!link) {
    throw_libbpf(env, errno ? errno : EINVAL, "bpf_program__attach", name);
    return NULL;
  }
  rc = bpf_link__pin(link, pin);
  if (rc) {
    bpf_link__destroy(link);
    throw_libbpf(env, -rc, "bpf_link__pin", pin);
    return NULL;
  }
  /* The pin holds the link; our reference goes, the attachment stays. */
  bpf_link__disconnect(link);
  bpf_link__destroy(link);
  return make_str(env, replaced ? "replaced" : "attached");
}

static napi_value js_map_update(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  if (get_args(env, info, 4, argv) != 0) return NULL;
  int32_t fd;
  uint32_t flags;
  void *k, *v;
  size_t kl, vl;
  if (get_i32(env, argv[0], &fd, "fd") != 0 || get_buffer(env, argv[1], &k, &kl, "key") != 0 ||
      get_buffer(env, argv[2], &v, &vl, "value") != 0 || get_u32(env, argv[3], &flags, "flags") != 0)
    return NULL;
  if (bpf_map_update_elem(fd, k, v, flags)) {
    throw_errno(env, errno, "bpf_map_update_elem", NULL);
    return NULL;
  }
  return NULL;
}

static napi_value js_map_lookup(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  if (get_args(env, info, 3, argv) != 0) return NULL;
  int32_t fd;
  uint32_t vsize;
  void *k;
  size_t kl;
  if (get_i32(env, argv[0], &fd, "fd") != 0 || get_buffer(env, argv[1], &k, &kl, "key") != 0 ||
      get_u32(env, argv[2], &vsize, "valueSize") != 0)
    return NULL;
  void *out;
  napi_value buf;
  if (napi_create_buffer(env, vsize, &out, &buf) != napi_ok) return NULL;
  if (bpf_map_lookup_elem(fd, k, out)) {
    if (errno == ENOENT) {
      napi_value nul;
      napi_get_null(env, &nul);
      return nul;
    }
    throw_errno(env, errno, "bpf_map_lookup_elem", NULL);
    return NULL;
  }
  return buf;
}

static napi_value js_map_delete(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  if (get_args(env, info, 2, argv) != 0) return NULL;
  int32_t fd;
  void *k;
  size_t kl;
  if (get_i32(env, argv[0], &fd, "fd") != 0 || get_buffer(env, argv[1], &k, &kl, "key") != 0) return NULL;
  napi_value r;
  if (bpf_map_delete_elem(fd, k)) {
    if (errno == ENOENT) {
      napi_get_boolean(env, false, &r);
      return r;
    }
    throw_errno(env, errno, "bpf_map_delete_elem", NULL);
    return NULL;
  }
  napi_get_boolean(env, true, &r);
  return r;
}

static napi_value js_map_next_key(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  if (get_args(env, info, 3, argv) != 0) return NULL;
  int32_t fd;
  uint32_t ksize;
  if (get_i32(env, argv[0], &fd, "fd") != 0 || get_u32(env, argv[2], &ksize, "keySize") != 0) return NULL;
  napi_valuetype t;
  napi_typeof(env, argv[1], &t);
  void *k = NULL;
  size_t kl = 0;
  if (t != napi_null && t != napi_undefined && get_buffer(env, argv[1], &k, &kl, "key") != 0) return NULL;
  void *out;
  napi_value buf;
  if (napi_create_buffer(env, ksize, &out, &buf) != napi_ok) return NULL;
  if (bpf_map_get_next_key(fd, k, out)) {
    if (errno == ENOENT) {
      napi_value nul;
      napi_get_null(env, &nul);
      return nul;
    }
    throw_errno(env, errno, "bpf_map_get_next_key", NULL);
    return NULL;
  }
  return buf;
}

int dsec_bpf_init(napi_env env, napi_value exports) {
  libbpf_set_print(log_print);
  napi_property_descriptor fns[] = {
      {"bpfObjectOpen", NULL, js_object_open, NULL, NULL, NULL, napi_enumerable, NULL},
      {"bpfObjectClose", NULL, js_object_close, NULL, NULL, NULL, napi_enumerable, NULL},
      {"bpfCgroupAttach", NULL, js_cgroup_attach, NULL, NULL, NULL, napi_enumerable, NULL},
      {"bpfCgroupDetach", NULL, js_cgroup_detach, NULL, NULL, NULL, napi_enumerable, NULL},
      {"bpfCgroupQuery", NULL, js_cgroup_query, NULL, NULL, NULL, napi_enumerable, NULL},
      {"bpfTracingAttach", NULL, js_tracing_attach, NULL, NULL, NULL, napi_enumerable, NULL},
      {"bpfMapUpdate", NULL, js_map_update, NULL, NULL, NULL, napi_enumerable, NULL},
      {"bpfMapLookup", NULL, js_map_lookup, NULL, NULL, NULL, napi_enumerable, NULL},
      {"bpfMapDelete", NULL, js_map_delete, NULL, NULL, NULL, napi_enumerable, NULL},
      {"bpfMapNextKey", NULL, js_map_next_key, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  return napi_define_properties(env, exports, sizeof fns / sizeof fns[0], fns) == napi_ok ? 0 : -1;
}
