/*
 * libdsec-mkfs.so: an LD_PRELOAD shim for mkfs.erofs run as dsec's builder identity
 * (dsec-builder.c). It changes two things mkfs.erofs 1.5 would otherwise get wrong when
 * it is not real root; nothing else.
 *
 * 1. The source directory is reached through a file descriptor. Root hands the builder
 *    the tree as an fd (a staging dir whose parents the builder may not traverse, or a
 *    detached idmapped mount that has no path at all) and mkfs.erofs is given
 *    "/proc/self/fd/N". mkfs.erofs canonicalises its source with realpath(3), which on
 *    such a path yields a name the builder cannot walk (or "/" for a detached mount). So
 *    realpath() of exactly $DSEC_MKFS_SOURCE returns that string unchanged; every path
 *    mkfs.erofs then builds ("/proc/self/fd/N/<relative path>") resolves through the fd.
 *
 * 2. Overlay opaque directories. Overlayfs marks a directory that hides everything the
 *    layers below have under it with `trusted.overlay.opaque=y`. trusted.* xattrs can
 *    only be read or set with CAP_SYS_ADMIN in the initial user namespace, which the
 *    builder never has, so mkfs.erofs would drop every marker. Root decides which
 *    directories are opaque (the importer's `.wh..wh..opq` entries, or a scan of a
 *    writable layer or source tree as root) and passes the list; for exactly those
 *    directories
 *      llistxattr(path)  also lists `trusted.overlay.opaque`, and
 *      lgetxattr(path, "trusted.overlay.opaque")  returns "y".
 *    mkfs.erofs 1.5 reads xattrs with exactly these two calls (`nm -D $(which mkfs.erofs)`).
 *
 * Environment:
 *   DSEC_MKFS_SOURCE  the source directory exactly as given to mkfs.erofs;
 *   DSEC_OPAQUE_FD    optional: an fd on a regular file holding the opaque directories'
 *                     paths relative to the source ("" is the source itself), each ended
 *                     by a NUL byte. It is read with pread from offset 0 and left open,
 *                     so every process of a build that loads the shim (a wrapper script
 *                     around mkfs.erofs, then mkfs.erofs) reads the same list.
 * A list that cannot be read aborts the process with exit 125, rather than let a layer
 * be built without its opaque markers.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

static const char OPAQUE[] = "trusted.overlay.opaque";

static char **paths; /* sorted */
static size_t npaths;
static const char *source; /* DSEC_MKFS_SOURCE */
static size_t sourcelen;

static ssize_t (*real_llistxattr)(const char *, char *, size_t);
static ssize_t (*real_lgetxattr)(const char *, const char *, void *, size_t);
static char *(*real_realpath)(const char *, char *);

static int cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void fail(const char *what) {
  fprintf(stderr, "libdsec-mkfs: %s: %s\n", what, strerror(errno));
  _exit(125);
}

__attribute__((constructor)) static void load(void) {
  real_llistxattr = (ssize_t(*)(const char *, char *, size_t))dlsym(RTLD_NEXT, "llistxattr");
  real_lgetxattr = (ssize_t(*)(const char *, const char *, void *, size_t))dlsym(RTLD_NEXT, "lgetxattr");
  real_realpath = (char *(*)(const char *, char *))dlsym(RTLD_NEXT, "realpath");
  source = getenv("DSEC_MKFS_SOURCE");
  if (source) {
    sourcelen = strlen(source);
    while (sourcelen > 1 && source[sourcelen - 1] == '/') sourcelen--;
  }
  const char *fds = getenv("DSEC_OPAQUE_FD");
  if (!fds) return;
  if (!source) {
    errno = EINVAL;
    fail("DSEC_OPAQUE_FD is set without DSEC_MKFS_SOURCE");
  }
  int fd = atoi(fds);
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  if (!buf) fail("malloc");
  for (;;) {
    if (len == cap) {
      cap *= 2;
      char *nb = realloc(buf, cap);
      if (!nb) fail("realloc");
      buf = nb;
    }
    ssize_t n = pread(fd, buf + len, cap - len, (off_t)len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("reading the opaque list (DSEC_OPAQUE_FD)");
    if (n == 0) break;
    len += (size_t)n;
  }
  for (size_t i = 0; i < len; i++) npaths += buf[i] == '\0';
  paths = calloc(npaths ? npaths : 1, sizeof *paths);
  if (!paths) fail("calloc");
  size_t k = 0, start = 0;
  for (size_t i = 0; i < len; i++) {
    if (buf[i] != '\0') continue;
    paths[k++] = buf + start;
    start = i + 1;
  }
  npaths = k;
  qsort(paths, npaths, sizeof *paths, cmp);
}

char *realpath(const char *path, char *resolved) {
  if (!source || !path || strcmp(path, source) != 0) return real_realpath(path, resolved);
  size_t n = strlen(path);
  if (n >= PATH_MAX) {
    errno = ENAMETOOLONG;
    return NULL;
  }
  char *out = resolved ? resolved : malloc(PATH_MAX);
  if (!out) {
    errno = ENOMEM;
    return NULL;
  }
  memcpy(out, path, n + 1);
  return out;
}

/* True when `path` (as mkfs.erofs built it) names a directory of the list. */
static int is_opaque(const char *path) {
  if (!npaths || strncmp(path, source, sourcelen) != 0) return 0;
  const char *rel = path + sourcelen;
  if (*rel != '\0' && *rel != '/') return 0;
  while (*rel == '/') rel++;
  return bsearch(&rel, paths, npaths, sizeof *paths, cmp) != NULL;
}

ssize_t llistxattr(const char *path, char *list, size_t size) {
  if (!is_opaque(path)) return real_llistxattr(path, list, size);
  ssize_t have = real_llistxattr(path, NULL, 0);
  if (have < 0) have = 0;
  char *tmp = malloc((size_t)have + sizeof OPAQUE);
  if (!tmp) {
    errno = ENOMEM;
    return -1;
  }
  ssize_t got = have ? real_llistxattr(path, tmp, (size_t)have) : 0;
  if (got < 0) got = 0;
  int present = 0;
  for (ssize_t off = 0; off < got; off += (ssize_t)strlen(tmp + off) + 1) present |= strcmp(tmp + off, OPAQUE) == 0;
  if (!present) {
    memcpy(tmp + got, OPAQUE, sizeof OPAQUE);
    got += (ssize_t)sizeof OPAQUE;
  }
  if (size != 0 && (size_t)got > size) {
    free(tmp);
    errno = ERANGE;
    return -1;
  }
  if (size != 0) memcpy(list, tmp, (size_t)got);
  free(tmp);
  return got;
}

ssize_t lgetxattr(const char *path, const char *name, void *value, size_t size) {
  if (strcmp(name, OPAQUE) != 0 || !is_opaque(path)) return real_lgetxattr(path, name, value, size);
  if (size != 0) *(char *)value = 'y';
  return 1;
}
