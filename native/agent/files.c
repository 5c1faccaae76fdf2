/*
 * files: file operations as a user, streamed reads, lists and atomic writes (files.h).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/openat2.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "conn.h"
#include "files.h"
#include "proto.h"
#include "spawn.h"
#include "user.h"
#include "util.h"

/* File transfer: FILE_DATA frames the agent sends are at most FILE_CHUNK bytes; a
 * FILE_ACK is sent every FILE_ACK_EVERY bytes written; a streaming file job (read, list)
 * produces at most FILE_STEP_BUDGET bytes per loop iteration so execs stay responsive. */
#define FILE_CHUNK (256u << 10)
#define FILE_ACK_EVERY (1u << 20)
#define FILE_STEP_BUDGET (1u << 20)
/* getdents64 buffer of a FILE_LIST job. */
#define LIST_BUF 32768
/* Deepest directory nesting FILE_REMOVE with RECURSIVE descends into. */
#define RM_MAX_DEPTH 1024
#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

/* The agent's own filesystem identity, restored after every file operation. */
static uid_t g_fsuid0;
static gid_t g_fsgid0;
static int g_ngroups0;
static gid_t *g_groups0;
static mode_t g_umask0;
static int g_cred_active;

void files_init(void)
{
	g_fsuid0 = (uid_t)setfsuid((uid_t)-1);
	g_fsgid0 = (gid_t)setfsgid((gid_t)-1);
	int ng = getgroups(0, NULL);
	if (ng > 0) {
		g_groups0 = xmalloc(sizeof(gid_t) * (size_t)ng);
		g_ngroups0 = getgroups(ng, g_groups0);
		if (g_ngroups0 < 0)
			g_ngroups0 = 0;
	}
	/* Test hook: behave as on a kernel without openat2 (< 5.6). */
	const char *no2 = getenv("DSEC_AGENT_NO_OPENAT2");
	if (no2 && strcmp(no2, "1") == 0)
		g_no_openat2 = 1;
}

/* ---- file operations ---------------------------------------------------------------- */

static void cred_leave(void);

/* Switch the agent's filesystem identity to cr for one step of a file operation: umask 0
 * (modes in requests are exact), supplementary groups, fsgid, then fsuid (a nonzero
 * fsuid drops the filesystem capabilities from the effective set; fsuid 0 brings them
 * back). Every cred_enter is followed by cred_leave on every path; if switching fails
 * the identity is already restored. Returns 0 or an errno. */
static int cred_enter(const struct creds *cr)
{
	if (g_cred_active) { /* a bug: never nest; restore first so nothing leaks */
		logf_("bug: nested cred_enter");
		cred_leave();
	}
	g_cred_active = 1;
	g_umask0 = umask(0);
	if (cr->noop)
		return 0;
	if (setgroups((size_t)cr->ngroups, cr->groups) < 0) {
		int err = errno;
		cred_leave();
		return err;
	}
	setfsgid((gid_t)cr->gid);
	if ((uint32_t)setfsgid((gid_t)-1) != cr->gid) {
		cred_leave();
		return EPERM;
	}
	setfsuid((uid_t)cr->uid);
	if ((uint32_t)setfsuid((uid_t)-1) != cr->uid) {
		cred_leave();
		return EPERM;
	}
	return 0;
}

/* Restore the agent's own fsuid, fsgid, groups and umask. Preserves errno. */
static void cred_leave(void)
{
	if (!g_cred_active)
		return;
	g_cred_active = 0;
	int saved = errno;
	setfsuid(g_fsuid0);
	setfsgid(g_fsgid0);
	if (geteuid() == 0 && setgroups((size_t)g_ngroups0, g_groups0) < 0)
		logf_("cannot restore supplementary groups: %s", strerror(errno));
	if ((uid_t)setfsuid((uid_t)-1) != g_fsuid0 || (gid_t)setfsgid((gid_t)-1) != g_fsgid0)
		logf_("cannot restore fsuid %u / fsgid %u", (unsigned)g_fsuid0, (unsigned)g_fsgid0);
	umask(g_umask0);
	errno = saved;
}

/* Open path (absolute, or relative to dirfd) refusing /proc magic links anywhere in the
 * resolution (openat2 RESOLVE_NO_MAGICLINKS). Without openat2 (kernel < 5.6) it falls
 * back to openat with O_NOFOLLOW when last is set, i.e. when the final component is the
 * object of the operation: a final symlink is then refused, magic or not. */
static int open_res(int dirfd, const char *path, int flags, mode_t mode, int last)
{
	flags |= O_CLOEXEC;
	if (!g_no_openat2) {
		struct open_how how;
		memset(&how, 0, sizeof how);
		how.flags = (uint64_t)(unsigned)flags;
		how.mode = (flags & O_CREAT) ? mode : 0;
		how.resolve = RESOLVE_NO_MAGICLINKS;
		long fd;
		do
			fd = syscall(SYS_openat2, dirfd, path, &how, sizeof how);
		while (fd < 0 && errno == EINTR);
		if (fd >= 0 || errno != ENOSYS)
			return (int)fd;
		g_no_openat2 = 1;
		logf_("openat2 is not available: falling back to O_NOFOLLOW on the final component");
	}
	return openat(dirfd, path, flags | (last ? O_NOFOLLOW : 0), mode);
}

/* Normalize an absolute path: repeated '/' collapse, '.' components and a trailing '/'
 * are dropped. A relative path, a NUL byte or any '..' component is EINVAL; an
 * over-long path or component ENAMETOOLONG. On success *out is a malloc'd string. */
static int path_norm(const unsigned char *p, size_t n, char **out)
{
	if (n == 0 || p[0] != '/' || memchr(p, 0, n))
		return EINVAL;
	if (n >= PATH_MAX)
		return ENAMETOOLONG;
	char *o = xmalloc(n + 2);
	size_t k = 0, i = 0;
	while (i < n) {
		while (i < n && p[i] == '/')
			i++;
		size_t s = i;
		while (i < n && p[i] != '/')
			i++;
		size_t cl = i - s;
		if (cl == 0)
			break;
		if (cl == 1 && p[s] == '.')
			continue;
		if (cl == 2 && p[s] == '.' && p[s + 1] == '.') {
			free(o);
			return EINVAL;
		}
		if (cl > NAME_MAX) {
			free(o);
			return ENAMETOOLONG;
		}
		o[k++] = '/';
		memcpy(o + k, p + s, cl);
		k += cl;
	}
	if (k == 0)
		o[k++] = '/';
	o[k] = 0;
	*out = o;
	return 0;
}

/* O_PATH fd of the directory containing a normalized path; *name points at the final
 * component inside path ("" for "/"). Returns -1 with errno on failure. */
static int open_parent(const char *path, const char **name)
{
	const char *slash = strrchr(path, '/');
	*name = slash + 1;
	if (slash == path)
		return open_res(AT_FDCWD, "/", O_PATH | O_DIRECTORY, 0, 0);
	char *dir = xstrndup(path, (size_t)(slash - path));
	int fd = open_res(AT_FDCWD, dir, O_PATH | O_DIRECTORY, 0, 0);
	int err = errno;
	free(dir);
	errno = err;
	return fd;
}

/* Create the final component of a normalized path: a directory with mode, or a symlink
 * to target when target is set. Returns 0 or an errno (EEXIST for "/"). */
static int create_final(const char *path, const char *target, mode_t mode)
{
	const char *name;
	int dfd = open_parent(path, &name);
	if (dfd < 0)
		return errno;
	int err = 0;
	if (!*name)
		err = EEXIST;
	else if ((target ? symlinkat(target, dfd, name) : mkdirat(dfd, name, mode)) < 0)
		err = errno;
	close(dfd);
	return err;
}

/* mkdir -p: create every missing directory of a normalized path (the final component
 * too when include_last; it gets last_mode, the others 0755), following symlinks to
 * directories like mkdir -p. Returns an O_PATH fd of the deepest directory handled, or
 * -1 with errno (ENOTDIR if a component exists and is not a directory). */
static int mkdir_p(const char *path, mode_t last_mode, int include_last)
{
	int dfd = open_res(AT_FDCWD, "/", O_PATH | O_DIRECTORY, 0, 0);
	if (dfd < 0)
		return -1;
	const char *p = path;
	while (*p == '/')
		p++;
	while (*p) {
		const char *e = strchr(p, '/');
		size_t l = e ? (size_t)(e - p) : strlen(p);
		int last = !e;
		if (last && !include_last)
			break;
		char comp[NAME_MAX + 1];
		memcpy(comp, p, l);
		comp[l] = 0;
		if (mkdirat(dfd, comp, last ? last_mode : 0755) < 0 && errno != EEXIST) {
			int err = errno;
			close(dfd);
			errno = err;
			return -1;
		}
		int nfd = open_res(dfd, comp, O_PATH | O_DIRECTORY, 0, 0);
		int err = errno;
		close(dfd);
		if (nfd < 0) {
			errno = err;
			return -1;
		}
		dfd = nfd;
		if (!e)
			break;
		p = e + 1;
	}
	return dfd;
}

static int dot_or_dotdot(const char *n)
{
	return n[0] == '.' && (n[1] == 0 || (n[1] == '.' && n[2] == 0));
}

/* Remove directory name (in parentfd) and everything below it. Never follows symlinks
 * (they are unlinked); crosses into mounted filesystems like rm -r (whose mount points
 * then fail with EBUSY). Returns 0 or an errno. */
static int rm_tree(int parentfd, const char *name, int depth)
{
	if (depth > RM_MAX_DEPTH)
		return ENAMETOOLONG;
	int fd = openat(parentfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : errno;
	unsigned char *buf = xmalloc(LIST_BUF);
	int err = 0;
	/* Entries can be missed while the directory changes under us: rescan until a pass
	 * finds nothing (at most three passes; rmdir then reports ENOTEMPTY). */
	for (int pass = 0; pass < 3 && !err; pass++) {
		int found = 0;
		for (;;) {
			long n = syscall(SYS_getdents64, fd, buf, LIST_BUF);
			if (n < 0) {
				err = errno;
				break;
			}
			if (n == 0)
				break;
			for (long off = 0; off < n && !err;) {
				struct dirent64_ *d = (void *)(buf + off);
				off += d->reclen;
				if (dot_or_dotdot(d->name))
					continue;
				found = 1;
				if (d->type == DT_DIR) {
					err = rm_tree(fd, d->name, depth + 1);
				} else if (unlinkat(fd, d->name, 0) < 0) {
					if (errno == EISDIR)
						err = rm_tree(fd, d->name, depth + 1);
					else if (errno != ENOENT)
						err = errno;
				}
			}
			if (err)
				break;
		}
		if (err || !found)
			break;
		lseek(fd, 0, SEEK_SET);
	}
	free(buf);
	close(fd);
	if (!err && unlinkat(parentfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		err = errno;
	return err;
}

/* FILE_INFO fields: u64 size, u32 st_mode, u32 uid, u32 gid, u64 mtime_ns, u8 type. */
#define INFO_LEN 29

static void put_info(unsigned char *b, const struct stat *st)
{
	put_u64(b, (uint64_t)st->st_size);
	put_u32(b + 8, (uint32_t)st->st_mode);
	put_u32(b + 12, (uint32_t)st->st_uid);
	put_u32(b + 16, (uint32_t)st->st_gid);
	uint64_t mt = st->st_mtim.tv_sec < 0 ? 0
					      : (uint64_t)st->st_mtim.tv_sec * 1000000000ull + (uint64_t)st->st_mtim.tv_nsec;
	put_u64(b + 20, mt);
	b[28] = S_ISREG(st->st_mode) ? 0 : S_ISDIR(st->st_mode) ? 1 : S_ISLNK(st->st_mode) ? 2 : 3;
}

static const char *file_op_name(unsigned type)
{
	switch (type) {
	case F_FILE_READ: return "read";
	case F_FILE_WRITE: return "write";
	case F_FILE_STAT: return "stat";
	case F_FILE_LIST: return "list";
	case F_FILE_MKDIR: return "mkdir";
	case F_FILE_REMOVE: return "remove";
	case F_FILE_SYMLINK: return "symlink";
	default: return "file";
	}
}

/* FILE_ERROR: u32 errno, then a UTF-8 message. The final frame of a file stream. */
static void send_file_error(struct conn *c, uint32_t stream, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void send_file_error(struct conn *c, uint32_t stream, int err, const char *fmt, ...)
{
	char msg[1400];
	va_list ap;
	va_start(ap, fmt);
	size_t n = vformat(msg, sizeof msg, fmt, ap);
	va_end(ap);
	logf_("conn=%u stream=%u file error: %s", c->id, stream, msg);
	send_errno_frame(c, F_FILE_ERROR, stream, err, msg, n);
}

/* "<op> <path>: <strerror>"; ELOOP gets a hint, since a refused magic link reports it. */
static void file_fail(struct conn *c, uint32_t stream, const char *op, const char *path, int err)
{
	send_file_error(c, stream, err, "%s %.1024s: %s%s", op, path, strerror(err),
			err == ELOOP ? " (a symlink loop, or a /proc magic link, which is refused)" : "");
}

/* The end of the part of a file operation that runs as the user: restore the agent's
 * identity (cred_leave), then, if err is set, answer FILE_ERROR (err -1: EINVAL "not a
 * regular file"). Returns 0 when err was 0, else -1 (the caller cleans up and stops). */
static int file_leave(struct conn *c, uint32_t stream, const char *op, const char *path, int err)
{
	cred_leave();
	if (!err)
		return 0;
	if (err < 0)
		send_file_error(c, stream, EINVAL, "%s %s: not a regular file", op, path);
	else
		file_fail(c, stream, op, path, err);
	return -1;
}

/* FILE_ACK or FILE_DONE carrying a u64 byte count. */
static void send_u64(struct conn *c, unsigned type, uint32_t stream, uint64_t v)
{
	unsigned char b[8];
	put_u64(b, v);
	send_frame(c, type, stream, b, 8);
}

struct file_req {
	char *path;         /* normalized */
	char *raw;          /* as sent, for messages when it is refused */
	int path_err;
	char *user;         /* NULL: "0" */
	uint64_t offset, length;
	uint32_t mode;
	int have_mode;
	unsigned flags;
	int have_flags;
	int nofollow, recursive;
	char *target;
};

static void file_req_free(struct file_req *fr)
{
	free(fr->path);
	free(fr->raw);
	free(fr->user);
	free(fr->target);
	memset(fr, 0, sizeof *fr);
}

/* Parse the TLV fields of a file request. On failure sends FILE_ERROR (EINVAL, or
 * ENAMETOOLONG for the path) and returns -1. */
static int file_req_parse(struct conn *c, uint32_t stream, const char *op, const unsigned char *p, size_t len,
			  struct file_req *fr)
{
	memset(fr, 0, sizeof *fr);
	const char *bad = NULL;
	int bad_tag = 0;
	size_t off = 0;
	struct tlv t;
	enum tlv_result rc;
	while (!bad && (rc = tlv_next(p, len, &off, &t)) != TLV_END) {
		if (rc == TLV_TRUNCATED) {
			bad = "truncated field header";
			break;
		}
		if (rc == TLV_OVERRUN) {
			bad = "field overruns the payload";
			bad_tag = (int)t.tag;
			break;
		}
		unsigned tag = t.tag;
		uint32_t flen = t.len;
		const unsigned char *v = t.v;
		switch (tag) {
		case FT_PATH:
			free(fr->path);
			free(fr->raw);
			fr->path = NULL;
			fr->raw = xstrndup((const char *)v, flen > 512 ? 512 : flen);
			fr->path_err = path_norm(v, flen, &fr->path);
			break;
		case FT_USER:
			if (flen == 0 || memchr(v, 0, flen)) {
				bad = "USER must be non-empty and without NUL bytes";
				break;
			}
			free(fr->user);
			fr->user = xstrndup((const char *)v, flen);
			break;
		case FT_OFFSET:
		case FT_LENGTH:
			if (flen != 8) {
				bad = "OFFSET and LENGTH must be 8 bytes";
				break;
			}
			if (tag == FT_OFFSET)
				fr->offset = get_u64(v);
			else
				fr->length = get_u64(v);
			break;
		case FT_MODE:
			if (flen != 4 || (get_u32(v) & ~07777u)) {
				bad = "MODE must be a u32 within 07777";
				break;
			}
			fr->mode = get_u32(v);
			fr->have_mode = 1;
			break;
		case FT_FLAGS:
		case FT_NOFOLLOW:
		case FT_RECURSIVE:
			if (flen != 1) {
				bad = "FLAGS, NOFOLLOW and RECURSIVE must be 1 byte";
				break;
			}
			if (tag == FT_FLAGS) {
				fr->flags = v[0];
				fr->have_flags = 1;
			}
			else if (tag == FT_NOFOLLOW)
				fr->nofollow = v[0] != 0;
			else
				fr->recursive = v[0] != 0;
			break;
		case FT_TARGET:
			if (flen == 0 || memchr(v, 0, flen) || flen >= PATH_MAX) {
				bad = "TARGET must be non-empty, shorter than PATH_MAX and without NUL bytes";
				break;
			}
			free(fr->target);
			fr->target = xstrndup((const char *)v, flen);
			break;
		default:
			break; /* unknown tags are ignored (forward compatibility) */
		}
	}
	if (!bad && !fr->raw)
		bad = "PATH is required";
	if (bad) {
		if (bad_tag)
			send_file_error(c, stream, EINVAL, "%s: malformed request: field %d: %s", op, bad_tag, bad);
		else
			send_file_error(c, stream, EINVAL, "%s: malformed request: %s", op, bad);
		file_req_free(fr);
		return -1;
	}
	if (fr->path_err) {
		if (fr->path_err == EINVAL)
			send_file_error(c, stream, EINVAL,
					"%s %s: invalid path: it must be absolute, without NUL bytes or '..' components", op,
					fr->raw);
		else
			send_file_error(c, stream, fr->path_err, "%s %s: %s", op, fr->raw, strerror(fr->path_err));
		file_req_free(fr);
		return -1;
	}
	return 0;
}

/* Resolve USER and switch to it. On failure sends FILE_ERROR and returns -1; on success
 * the caller must cred_leave(). */
static int file_enter(struct conn *c, uint32_t stream, const char *op, const struct file_req *fr, struct creds *cr)
{
	const char *spec = fr->user ? fr->user : "0";
	int st = user_resolve(spec, cr);
	if (st == ST_USER_UNKNOWN || st == ST_GROUP_UNKNOWN) {
		send_file_error(c, stream, ENOENT, "%s %s: user: %s: unknown %s", op, fr->path, spec,
				st == ST_USER_UNKNOWN ? "user" : "group");
		return -1;
	}
	if (st) {
		file_fail(c, stream, op, fr->path, ENOMEM);
		return -1;
	}
	int err = cred_enter(cr);
	if (err) {
		send_file_error(c, stream, err, "%s %s: user: %s: cannot switch to uid %u gid %u: %s", op, fr->path, spec,
				cr->uid, cr->gid, strerror(err));
		return -1;
	}
	return 0;
}

struct fop *conn_find_fop(struct conn *c, uint32_t stream)
{
	for (struct fop *f = c->fops; f; f = f->next)
		if (f->stream == stream)
			return f;
	return NULL;
}

static struct fop *fop_new(struct conn *c, uint32_t stream, int kind, struct file_req *fr, const struct creds *cr)
{
	struct fop *f = xmalloc(sizeof *f);
	memset(f, 0, sizeof *f);
	f->c = c;
	f->stream = stream;
	f->kind = kind;
	f->fd = f->dirfd = -1;
	f->cr = *cr;
	f->path = fr->path; /* ownership moves to the fop */
	fr->path = NULL;
	DL_PUSH(c->fops, f, next, prev);
	return f;
}

/* Forget a file operation (after its final frame, or with its connection). A write that
 * was not committed leaves nothing behind: its temp file is removed. */
void fop_free(struct fop *f)
{
	struct conn *c = f->c;
	DL_UNLINK(c->fops, f, next, prev);
	if (f->fd >= 0)
		close(f->fd);
	if (f->tmpname && f->dirfd >= 0) {
		int err = cred_enter(&f->cr);
		(void)err; /* if switching fails, the agent's own identity removes it */
		if (unlinkat(f->dirfd, f->tmpname, 0) < 0)
			logf_("conn=%u stream=%u cannot remove temp file %s of %s: %s", c->id, f->stream, f->tmpname, f->path,
			      strerror(errno));
		cred_leave();
	}
	if (f->dirfd >= 0)
		close(f->dirfd);
	free(f->dbuf);
	free(f->path);
	free(f->name);
	free(f->tmpname);
	free(f);
}

static void op_stat(struct conn *c, uint32_t stream, struct file_req *fr)
{
	struct creds cr;
	if (file_enter(c, stream, "stat", fr, &cr) < 0)
		return;
	int err = 0;
	unsigned char b[INFO_LEN + PATH_MAX];
	size_t n = INFO_LEN;
	struct stat st;
	int fd = open_res(AT_FDCWD, fr->path, O_PATH | (fr->nofollow ? O_NOFOLLOW : 0), 0, 1);
	if (fd < 0 || fstat(fd, &st) < 0) {
		err = errno;
	} else {
		put_info(b, &st);
		if (S_ISLNK(st.st_mode)) {
			ssize_t k = readlinkat(fd, "", (char *)b + INFO_LEN, PATH_MAX);
			if (k < 0)
				err = errno;
			else
				n += (size_t)k;
		}
	}
	if (fd >= 0)
		close(fd);
	if (file_leave(c, stream, "stat", fr->path, err))
		return;
	send_frame(c, F_FILE_INFO, stream, b, n);
	send_frame(c, F_FILE_DONE, stream, NULL, 0);
}

static void op_mkdir(struct conn *c, uint32_t stream, struct file_req *fr)
{
	if (fr->flags & ~(unsigned)WF_PARENTS) {
		send_file_error(c, stream, EINVAL, "mkdir %s: unknown FLAGS 0x%x (only 8 = parents)", fr->path, fr->flags);
		return;
	}
	struct creds cr;
	if (file_enter(c, stream, "mkdir", fr, &cr) < 0)
		return;
	mode_t mode = fr->have_mode ? fr->mode : 0755;
	int err = 0;
	if (fr->flags & WF_PARENTS) {
		int fd = mkdir_p(fr->path, mode, 1);
		if (fd < 0)
			err = errno;
		else
			close(fd);
	} else {
		err = create_final(fr->path, NULL, mode);
	}
	if (file_leave(c, stream, "mkdir", fr->path, err))
		return;
	logf_("conn=%u stream=%u mkdir %s mode=%o parents=%d", c->id, stream, fr->path, (unsigned)mode,
	      !!(fr->flags & WF_PARENTS));
	send_frame(c, F_FILE_DONE, stream, NULL, 0);
}

static void op_remove(struct conn *c, uint32_t stream, struct file_req *fr)
{
	if (strcmp(fr->path, "/") == 0) {
		send_file_error(c, stream, EBUSY, "remove /: refusing to remove the root directory");
		return;
	}
	struct creds cr;
	if (file_enter(c, stream, "remove", fr, &cr) < 0)
		return;
	int err = 0;
	const char *name;
	int dfd = open_parent(fr->path, &name);
	if (dfd < 0) {
		err = errno;
	} else if (fr->recursive) {
		struct stat st;
		if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			err = errno;
		else if (S_ISDIR(st.st_mode))
			err = rm_tree(dfd, name, 0);
		else if (unlinkat(dfd, name, 0) < 0)
			err = errno;
	} else if (unlinkat(dfd, name, 0) < 0) {
		err = errno;
		if (err == EISDIR)
			err = unlinkat(dfd, name, AT_REMOVEDIR) < 0 ? errno : 0;
	}
	if (dfd >= 0)
		close(dfd);
	if (file_leave(c, stream, "remove", fr->path, err))
		return;
	logf_("conn=%u stream=%u remove %s recursive=%d", c->id, stream, fr->path, fr->recursive);
	send_frame(c, F_FILE_DONE, stream, NULL, 0);
}

static void op_symlink(struct conn *c, uint32_t stream, struct file_req *fr)
{
	if (!fr->target) {
		send_file_error(c, stream, EINVAL, "symlink %s: malformed request: TARGET is required", fr->path);
		return;
	}
	struct creds cr;
	if (file_enter(c, stream, "symlink", fr, &cr) < 0)
		return;
	int err = create_final(fr->path, fr->target, 0);
	if (file_leave(c, stream, "symlink", fr->path, err))
		return;
	send_frame(c, F_FILE_DONE, stream, NULL, 0);
}

static void op_read(struct conn *c, uint32_t stream, struct file_req *fr)
{
	struct creds cr;
	if (file_enter(c, stream, "read", fr, &cr) < 0)
		return;
	int err = 0, fd = -1;
	struct stat st, st2;
	/* Look before opening: opening a FIFO would block and opening a device can have
	 * side effects, so only a regular file is ever opened for reading. */
	int pfd = open_res(AT_FDCWD, fr->path, O_PATH, 0, 1);
	if (pfd < 0 || fstat(pfd, &st) < 0) {
		err = errno;
	} else if (S_ISDIR(st.st_mode)) {
		err = EISDIR;
	} else if (S_ISLNK(st.st_mode)) {
		err = ELOOP; /* only without openat2: the final symlink is not followed */
	} else if (!S_ISREG(st.st_mode)) {
		err = -1;
	} else {
		fd = open_res(AT_FDCWD, fr->path, O_RDONLY | O_NOCTTY | O_NONBLOCK, 0, 1);
		if (fd < 0 || fstat(fd, &st2) < 0)
			err = errno;
		else if (!S_ISREG(st2.st_mode) || st2.st_ino != st.st_ino || st2.st_dev != st.st_dev)
			err = EAGAIN; /* replaced between the two opens */
	}
	if (pfd >= 0)
		close(pfd);
	if (file_leave(c, stream, "read", fr->path, err)) {
		if (fd >= 0)
			close(fd);
		return;
	}
	unsigned char b[INFO_LEN];
	put_info(b, &st2);
	send_frame(c, F_FILE_INFO, stream, b, INFO_LEN);
	struct fop *f = fop_new(c, stream, FOP_READ, fr, &cr);
	f->fd = fd;
	f->pos = fr->offset;
	f->remaining = fr->length ? fr->length : UINT64_MAX;
	logf_("conn=%u stream=%u read %s user=%s offset=%llu length=%llu size=%lld", c->id, stream, f->path,
	      fr->user ? fr->user : "0", (unsigned long long)fr->offset, (unsigned long long)fr->length,
	      (long long)st2.st_size);
}

static void op_list(struct conn *c, uint32_t stream, struct file_req *fr)
{
	struct creds cr;
	if (file_enter(c, stream, "list", fr, &cr) < 0)
		return;
	int fd = open_res(AT_FDCWD, fr->path, O_RDONLY | O_DIRECTORY, 0, 1);
	if (file_leave(c, stream, "list", fr->path, fd < 0 ? errno : 0))
		return;
	struct fop *f = fop_new(c, stream, FOP_LIST, fr, &cr);
	f->fd = fd;
	f->dbuf = xmalloc(LIST_BUF);
}

static void op_write(struct conn *c, uint32_t stream, struct file_req *fr)
{
	if (!fr->have_flags)
		fr->flags = WF_CREATE; /* no FLAGS field: create or replace */
	if (fr->flags & ~(unsigned)WF_ALL) {
		send_file_error(c, stream, EINVAL, "write %s: unknown FLAGS 0x%x", fr->path, fr->flags);
		return;
	}
	if (strcmp(fr->path, "/") == 0) {
		file_fail(c, stream, "write", fr->path, EISDIR);
		return;
	}
	struct creds cr;
	if (file_enter(c, stream, "write", fr, &cr) < 0)
		return;
	int err = 0, dfd = -1, fd = -1;
	int append = !!(fr->flags & WF_APPEND), excl = !!(fr->flags & WF_EXCL), create = !!(fr->flags & WF_CREATE);
	const char *name = strrchr(fr->path, '/') + 1;
	char tmp[NAME_MAX + 1] = "";
	struct stat st;
	int exists = 0;
	uint32_t mode = fr->have_mode ? fr->mode : 0644;
	if (fr->flags & WF_PARENTS) {
		char *dir = xstrndup(fr->path, (size_t)(name - 1 - fr->path));
		dfd = mkdir_p(*dir ? dir : "/", 0755, 1);
		free(dir);
	} else {
		dfd = open_parent(fr->path, &name);
	}
	if (dfd < 0) {
		err = errno;
		goto out;
	}
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
		exists = 1;
	else if (errno != ENOENT) {
		err = errno;
		goto out;
	}
	if (append) {
		/* In place, through a final symlink if there is one; never a non-regular file. */
		struct stat fst;
		if (exists && fstatat(dfd, name, &fst, 0) == 0 && !S_ISREG(fst.st_mode)) {
			err = S_ISDIR(fst.st_mode) ? EISDIR : -1;
			goto out;
		}
		int of = O_WRONLY | O_APPEND | O_NOCTTY | ((create || excl) ? O_CREAT : 0) | (excl ? O_EXCL : 0);
		fd = open_res(dfd, name, of, mode, 1);
		if (fd < 0)
			err = errno;
		goto out;
	}
	/* Replace: a temp file in the same directory, renamed over PATH on FILE_DONE. A
	 * symlink at PATH is replaced, not followed. */
	if (exists && S_ISDIR(st.st_mode)) {
		err = EISDIR;
		goto out;
	}
	if (exists && excl) {
		err = EEXIST;
		goto out;
	}
	if (!exists && !create && !excl) {
		err = ENOENT;
		goto out;
	}
	if (exists && S_ISREG(st.st_mode) && !fr->have_mode)
		mode = st.st_mode & 07777;
	static unsigned tmp_seq;
	for (int i = 0; i < 100; i++) {
		tmp_seq++;
		int k = snprintf(tmp, sizeof tmp, ".%s.dsec-%d-%u.tmp", name, (int)getpid(), tmp_seq);
		if (k < 0 || (size_t)k >= sizeof tmp)
			snprintf(tmp, sizeof tmp, ".dsec-%d-%u.tmp", (int)getpid(), tmp_seq);
		fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, 0600);
		if (fd >= 0 || errno != EEXIST)
			break;
	}
	if (fd < 0)
		err = errno;
out:
	if (file_leave(c, stream, "write", fr->path, err)) {
		if (fd >= 0)
			close(fd);
		if (dfd >= 0)
			close(dfd);
		return;
	}
	struct fop *f = fop_new(c, stream, FOP_WRITE, fr, &cr);
	f->fd = fd;
	f->dirfd = dfd;
	f->name = xstrndup(name, strlen(name));
	f->tmpname = append ? NULL : xstrndup(tmp, strlen(tmp));
	f->mode = mode;
	f->excl = excl;
	if (!append && exists && S_ISREG(st.st_mode)) {
		f->preserve_owner = 1;
		f->owner_uid = st.st_uid;
		f->owner_gid = st.st_gid;
	}
	logf_("conn=%u stream=%u write %s user=%s flags=0x%x mode=%o", c->id, stream, f->path,
	      fr->user ? fr->user : "0", fr->flags, (unsigned)mode);
	send_u64(c, F_FILE_ACK, stream, 0); /* open: the client may stream */
}

/* FILE_DATA of a write: write it all now (regular files do not block for long). */
static void fop_write_data(struct fop *f, const unsigned char *p, size_t len)
{
	struct conn *c = f->c;
	int err = cred_enter(&f->cr);
	size_t off = 0;
	while (!err && off < len) {
		ssize_t n = write(f->fd, p + off, len - off);
		if (n < 0) {
			if (errno != EINTR)
				err = errno;
			continue;
		}
		off += (size_t)n;
	}
	if (file_leave(c, f->stream, "write", f->path, err)) {
		fop_free(f);
		return;
	}
	f->written += len;
	if (f->written - f->acked >= FILE_ACK_EVERY) {
		send_u64(c, F_FILE_ACK, f->stream, f->written);
		f->acked = f->written;
	}
}

/* FILE_DONE of a write: mode and owner, close, then rename over PATH (atomic). */
static void fop_write_commit(struct fop *f)
{
	struct conn *c = f->c;
	int err = cred_enter(&f->cr);
	if (!err && f->tmpname) {
		/* Replacing: the new file keeps the old one's owner when the writer may do
		 * that (root), and gets the requested (or the old) mode exactly. chown first:
		 * it clears set-id bits. */
		if (f->preserve_owner && fchown(f->fd, f->owner_uid, f->owner_gid) < 0 && errno != EPERM)
			err = errno;
		if (!err && fchmod(f->fd, f->mode) < 0)
			err = errno;
	}
	if (!err) {
		int fd = f->fd;
		f->fd = -1;
		if (close(fd) < 0 && errno != EINTR)
			err = errno;
	}
	if (!err && f->tmpname) {
		if (f->excl) {
			if (renameat2(f->dirfd, f->tmpname, f->dirfd, f->name, RENAME_NOREPLACE) < 0) {
				err = errno;
				if (err == EINVAL || err == ENOSYS) { /* filesystem without RENAME_NOREPLACE */
					err = linkat(f->dirfd, f->tmpname, f->dirfd, f->name, 0) < 0 ? errno : 0;
					if (!err)
						unlinkat(f->dirfd, f->tmpname, 0);
				}
			}
		} else if (renameat(f->dirfd, f->tmpname, f->dirfd, f->name) < 0) {
			err = errno;
		}
		if (!err) {
			free(f->tmpname);
			f->tmpname = NULL;
		}
	}
	if (!file_leave(c, f->stream, "write", f->path, err)) {
		logf_("conn=%u stream=%u write %s: %llu bytes", c->id, f->stream, f->path, (unsigned long long)f->written);
		send_u64(c, F_FILE_DONE, f->stream, f->written);
	}
	fop_free(f);
}

/* One slice of a READ: FILE_DATA frames until the budget is spent, the connection's
 * queue is above its high-water mark, or the end (FILE_DONE). */
static void fop_step_read(struct fop *f)
{
	struct conn *c = f->c;
	size_t budget = FILE_STEP_BUDGET;
	while (!c->out_paused && budget > 0) {
		size_t want = FILE_CHUNK;
		if (f->remaining < want)
			want = (size_t)f->remaining;
		if (want == 0)
			break;
		struct chunk *ch = frame_alloc(F_FILE_DATA, f->stream, want);
		ssize_t n;
		do
			n = pread(f->fd, ch->data + HDR_LEN, want, (off_t)f->pos);
		while (n < 0 && errno == EINTR);
		if (n < 0) {
			int err = errno;
			free(ch);
			file_fail(c, f->stream, "read", f->path, err);
			fop_free(f);
			return;
		}
		if (n == 0) {
			free(ch);
			f->remaining = 0;
			break;
		}
		if ((size_t)n + 16384 < want) { /* a short tail: do not queue a mostly empty buffer */
			struct chunk *nc = realloc(ch, sizeof *ch + HDR_LEN + (size_t)n);
			if (nc)
				ch = nc;
		}
		frame_queue(c, ch, (size_t)n);
		f->pos += (uint64_t)n;
		f->remaining -= (uint64_t)n;
		budget -= (size_t)n < budget ? (size_t)n : budget;
	}
	if (f->remaining == 0) {
		send_frame(c, F_FILE_DONE, f->stream, NULL, 0);
		fop_free(f);
	}
}

/* One slice of a LIST: FILE_ENTRY frames (lstat of each entry as the user). */
static void fop_step_list(struct fop *f)
{
	struct conn *c = f->c;
	size_t budget = FILE_STEP_BUDGET;
	int err = cred_enter(&f->cr);
	char failed[NAME_MAX + 1] = "";
	while (!err && !c->out_paused && budget > 0) {
		if (f->doff >= f->dlen) {
			long n = syscall(SYS_getdents64, f->fd, f->dbuf, LIST_BUF);
			if (n < 0) {
				err = errno;
				break;
			}
			if (n == 0) {
				f->eof = 1;
				break;
			}
			f->dlen = (size_t)n;
			f->doff = 0;
		}
		struct dirent64_ *d = (void *)(f->dbuf + f->doff);
		f->doff += d->reclen;
		if (dot_or_dotdot(d->name))
			continue;
		struct stat st;
		if (fstatat(f->fd, d->name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno == ENOENT)
				continue; /* removed since getdents */
			err = errno;
			snprintf(failed, sizeof failed, "%s", d->name);
			break;
		}
		char target[PATH_MAX];
		ssize_t tl = 0;
		if (S_ISLNK(st.st_mode)) {
			tl = readlinkat(f->fd, d->name, target, sizeof target);
			if (tl < 0)
				tl = 0;
		}
		size_t nl = strlen(d->name);
		size_t plen = INFO_LEN + 2 + nl + (size_t)tl;
		struct chunk *ch = frame_alloc(F_FILE_ENTRY, f->stream, plen);
		unsigned char *b = ch->data + HDR_LEN;
		put_info(b, &st);
		b[INFO_LEN] = (unsigned char)(nl >> 8);
		b[INFO_LEN + 1] = (unsigned char)nl;
		memcpy(b + INFO_LEN + 2, d->name, nl);
		if (tl)
			memcpy(b + INFO_LEN + 2 + nl, target, (size_t)tl);
		frame_queue(c, ch, plen);
		budget -= plen + HDR_LEN < budget ? plen + HDR_LEN : budget;
	}
	cred_leave();
	if (err) {
		if (*failed)
			send_file_error(c, f->stream, err, "list %.1024s: %s: %s", f->path, failed, strerror(err));
		else
			file_fail(c, f->stream, "list", f->path, err);
		fop_free(f);
		return;
	}
	if (f->eof) {
		send_frame(c, F_FILE_DONE, f->stream, NULL, 0);
		fop_free(f);
	}
}

/* Is any READ or LIST job able to produce output now? (Then the loop does not sleep.) */
int file_jobs_runnable(void)
{
	for (struct conn *c = g_conns; c; c = c->next) {
		if (c->dead || c->closing || c->out_paused)
			continue;
		for (struct fop *f = c->fops; f; f = f->next)
			if (f->kind != FOP_WRITE)
				return 1;
	}
	return 0;
}

/* Advance every READ and LIST job by one slice, on connections that take output. */
void run_file_jobs(void)
{
	for (struct conn *c = g_conns; c; c = c->next) {
		if (c->dead || c->closing)
			continue;
		for (struct fop *f = c->fops, *next; f && !c->out_paused; f = next) {
			next = f->next;
			if (f->kind == FOP_READ)
				fop_step_read(f);
			else if (f->kind == FOP_LIST)
				fop_step_list(f);
		}
	}
}

void handle_file_request(struct conn *c, unsigned type, uint32_t stream, const unsigned char *p, size_t len)
{
	struct file_req fr;
	if (file_req_parse(c, stream, file_op_name(type), p, len, &fr) < 0)
		return;
	switch (type) {
	case F_FILE_READ: op_read(c, stream, &fr); break;
	case F_FILE_WRITE: op_write(c, stream, &fr); break;
	case F_FILE_STAT: op_stat(c, stream, &fr); break;
	case F_FILE_LIST: op_list(c, stream, &fr); break;
	case F_FILE_MKDIR: op_mkdir(c, stream, &fr); break;
	case F_FILE_REMOVE: op_remove(c, stream, &fr); break;
	case F_FILE_SYMLINK: op_symlink(c, stream, &fr); break;
	}
	file_req_free(&fr);
}

/* FILE_DATA, FILE_DONE or FILE_ERROR from the client on a live file stream. */
void handle_file_stream_frame(struct conn *c, struct fop *f, unsigned type, const unsigned char *p, size_t len)
{
	const char *op = f->kind == FOP_READ ? "read" : f->kind == FOP_LIST ? "list" : "write";
	if (type == F_FILE_DATA && f->kind == FOP_WRITE) {
		if (len)
			fop_write_data(f, p, len);
		return;
	}
	if (type == F_FILE_DONE && f->kind == FOP_WRITE) {
		fop_write_commit(f);
		return;
	}
	if (type == F_FILE_DATA) {
		send_error(c, f->stream, "FILE_DATA on a %s stream", op);
		fop_free(f);
		return;
	}
	/* FILE_DONE on a read/list, FILE_ERROR on any: the client cancels. */
	logf_("conn=%u stream=%u %s %s cancelled by the client", c->id, f->stream, op, f->path);
	send_file_error(c, f->stream, ECANCELED, "%s %.1024s: cancelled by the client", op, f->path);
	fop_free(f);
}
