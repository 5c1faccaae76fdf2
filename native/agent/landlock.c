/*
 * landlock: the ruleset and where it is applied (landlock.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <linux/openat2.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "landlock.h"
#include "util.h"

/*
 * Landlock (docs/SECURITY.md "Landlock"): the file-access restriction dsec applies where
 * the kernel has no AppArmor. Unlike the read-only mounts it needs no privilege and it
 * holds for root inside the sandbox too: a Landlock domain limits what its processes may
 * do to files, whatever their uid and capabilities, and every process forked inside it
 * inherits it for good (it can only be narrowed further, never lifted).
 *
 * Where it is applied (--landlock):
 *   - an ordinary sandbox: the agent restricts itself once at start, before it serves
 *     anything (landlock_self_setup), so every exec and every file operation runs under
 *     one domain. All processes of the sandbox share it, so they can still signal and
 *     ptrace each other as before;
 *   - an fncall worker (--worker): the agent must mount for each isolated call, and a
 *     Landlock domain forbids mount(2), so the agent stays unrestricted and each call's
 *     namespace init applies the ruleset after its mounts (iso_setup), with the call's
 *     fresh tmpfs mounts as its writable places. Plain (non-isolated) execs of a worker
 *     are not restricted; dsecd runs every fncall isolated.
 *
 * The ruleset (landlock_apply): "handled" is every filesystem right of the kernel's ABI,
 * so anything not granted below is denied; rights granted on a directory hold for
 * everything beneath it, across mount points, and add up along a path (a rule can only
 * grant, never take away). Hence:
 *   /                      read files, read directories, execute: the whole tree is
 *                          readable and runnable, nothing is writable unless a rule
 *                          below grants it; the top level itself can never be changed
 *                          (no new, removed or renamed top-level entries);
 *   each --writable PATH   every right: the sandbox's writable places, the same list
 *                          dsecd bound read-write (daemon/security/filesystem.ts);
 *   /dev                   also write files (/dev/null, /dev/zero, /dev/full, /dev/urandom),
 *                          nothing else: no new nodes, no device ioctls;
 *   /dev/pts, /dev/ptmx, /dev/tty, /dev/console
 *                          also write files and device ioctls (LANDLOCK_ACCESS_FS_IOCTL_DEV,
 *                          ABI 5): terminals need TCSETS, TIOCSCTTY, TIOCSWINSZ, TIOCGPTPEER;
 *                          every other device refuses ioctls (EACCES) except the few
 *                          Landlock always allows (FIONREAD, FIOCLEX, FIONBIO, ...);
 *   /dev/shm, /dev/mqueue  every right (POSIX shared memory and message queues);
 *   /proc, /sys            nothing beyond what / grants (read; execute is moot, both are
 *                          mounted noexec): no write to /proc/self/..., /proc/sys or sysfs,
 *                          whatever the mount options say;
 *   isolated calls         /tmp, /dev/shm and each SCRATCH path (the call's fresh tmpfs
 *                          mounts) every right, instead of the --writable list.
 *
 * Not used: the ABI 6 scopes (LANDLOCK_SCOPE_SIGNAL, LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET).
 * They refuse signals and abstract-socket connections to processes outside the domain,
 * and a sandbox has none to reach: its pid namespace shows no process outside it, and
 * abstract sockets live per network namespace, of which the sandbox has its own. So they
 * would be a second, ABI-6-only mechanism for what the namespaces enforce on every
 * kernel, with an EPERM that looks like neither. (In an fncall worker, whose concurrent
 * calls have separate domains but share the worker's network namespace, the abstract
 * socket scope would separate those calls; dsec's pools run one call per worker at a
 * time instead, docs/SECURITY.md "fncall workers".) ABI 7 added flags for audit logging
 * of denials, which dsec does not read; they stay at their defaults.
 *
 * Failure is never silent: on a kernel without Landlock (ENOSYS, or EOPNOTSUPP when it is
 * built but not enabled at boot) the agent logs why, reports {"enforced":false} in HELLO
 * and serves unrestricted, because that is a property of the host which dsecd reports in
 * `dsec host info`; any other failure while building or applying the ruleset is fatal
 * (exit 1 at start, EXEC_ERROR for an isolated call).
 */
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#endif
#ifndef SYS_landlock_add_rule
#define SYS_landlock_add_rule 445
#endif
#ifndef SYS_landlock_restrict_self
#define SYS_landlock_restrict_self 446
#endif
/* Spelled out from include/uapi/linux/landlock.h (Linux 6.18): Debian 12's headers stop
 * at ABI 2. The comment after each right is the ABI that added it. */
#define LL_CREATE_RULESET_VERSION (1u << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_FS_EXECUTE (1ull << 0)      /* 1 */
#define LL_FS_WRITE_FILE (1ull << 1)   /* 1 */
#define LL_FS_READ_FILE (1ull << 2)    /* 1 */
#define LL_FS_READ_DIR (1ull << 3)     /* 1 */
#define LL_FS_REMOVE_DIR (1ull << 4)   /* 1 */
#define LL_FS_REMOVE_FILE (1ull << 5)  /* 1 */
#define LL_FS_MAKE_CHAR (1ull << 6)    /* 1 */
#define LL_FS_MAKE_DIR (1ull << 7)     /* 1 */
#define LL_FS_MAKE_REG (1ull << 8)     /* 1 */
#define LL_FS_MAKE_SOCK (1ull << 9)    /* 1 */
#define LL_FS_MAKE_FIFO (1ull << 10)   /* 1 */
#define LL_FS_MAKE_BLOCK (1ull << 11)  /* 1 */
#define LL_FS_MAKE_SYM (1ull << 12)    /* 1 */
#define LL_FS_REFER (1ull << 13)       /* 2: rename/link across directories */
#define LL_FS_TRUNCATE (1ull << 14)    /* 3 */
#define LL_FS_IOCTL_DEV (1ull << 15)   /* 5: ioctl on character and block devices */
/* The rights a rule on a non-directory may carry (the kernel refuses others: EINVAL). */
#define LL_FS_FILE_RIGHTS (LL_FS_EXECUTE | LL_FS_WRITE_FILE | LL_FS_READ_FILE | LL_FS_TRUNCATE | LL_FS_IOCTL_DEV)

struct ll_ruleset_attr {
	uint64_t handled_access_fs; /* the first member; later ABIs append more, which the kernel zero-fills */
};
struct ll_path_beneath_attr {
	uint64_t allowed_access;
	int32_t parent_fd;
} __attribute__((packed));

int g_landlock;                    /* --landlock: restrict the sandbox's file access */
int g_landlock_abi;                /* the kernel's Landlock ABI version, 0: none */
char g_landlock_why[160];          /* why not, when g_landlock_abi is 0 */
const char *g_landlock_scope = "off"; /* HELLO: "agent", "isolated_execs" or "off" */
const char *g_writable[LL_MAX_WRITABLE]; /* --writable paths */
int g_nwritable;

/* The filesystem rights an ABI version knows: every one of them is handled. */
static uint64_t ll_handled(int abi)
{
	uint64_t h = (LL_FS_MAKE_SYM << 1) - 1; /* ABI 1: bits 0-12 */
	if (abi >= 2)
		h |= LL_FS_REFER;
	if (abi >= 3)
		h |= LL_FS_TRUNCATE;
	if (abi >= 5)
		h |= LL_FS_IOCTL_DEV;
	return h;
}

/* Once at start: the kernel's ABI version (g_landlock_abi), or 0 and why. */
void landlock_probe(void)
{
	long abi = syscall(SYS_landlock_create_ruleset, NULL, (size_t)0, LL_CREATE_RULESET_VERSION);
	if (abi > 0) {
		g_landlock_abi = (int)abi;
		return;
	}
	int e = errno;
	g_landlock_abi = 0;
	if (e == ENOSYS)
		snprintf(g_landlock_why, sizeof g_landlock_why, "the kernel has no Landlock (ENOSYS: built without CONFIG_SECURITY_LANDLOCK or before Linux 5.13)");
	else if (e == EOPNOTSUPP)
		snprintf(g_landlock_why, sizeof g_landlock_why, "Landlock is built into the kernel but not enabled (EOPNOTSUPP: add landlock to the lsm= boot parameter)");
	else
		snprintf(g_landlock_why, sizeof g_landlock_why, "landlock_create_ruleset(VERSION): %s", strerror(e));
}

/* The text of a failed step into err (errlen bytes), unless err is NULL: an exec child
 * sharing the agent's memory (confine.c guest_confine_child_caps) must not format (no
 * strerror there). */
#define LL_ERR(err, errlen, ...)                          \
	do {                                              \
		if (err)                                  \
			snprintf(err, errlen, __VA_ARGS__); \
	} while (0)

/* O_PATH fd of `path`: symlinks followed, or with `nofollow` none at all (openat2
 * RESOLVE_NO_SYMLINKS: ELOOP for a symlink anywhere in it; without openat2, O_NOFOLLOW
 * on the last component, and a symlink there is ELOOP too). */
static int ll_open(const char *path, int nofollow)
{
	if (!nofollow)
		return open(path, O_PATH | O_CLOEXEC);
	if (!g_no_openat2) {
		struct open_how how;
		memset(&how, 0, sizeof how);
		how.flags = O_PATH | O_CLOEXEC;
		how.resolve = RESOLVE_NO_SYMLINKS;
		int fd = (int)syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof how);
		if (fd >= 0 || errno != ENOSYS)
			return fd;
	}
	int fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	if (fd >= 0 && fstat(fd, &st) == 0 && S_ISLNK(st.st_mode)) {
		close(fd);
		errno = ELOOP;
		return -1;
	}
	return fd;
}

/* One path-beneath rule: `access` (limited to what is handled, and to file rights when
 * `path` is not a directory) on `path`, symlinks followed (/dev/ptmx is runc's symlink to
 * pts/ptmx) unless `nofollow` (see ll_open: a --writable path is dsecd's resolved plan,
 * which has no symlink; one that has is refused rather than granting its target). A
 * missing `path` is skipped when `optional`. Returns 0, or -1 with `err`. */
static int ll_rule(int rs, const char *path, uint64_t access, uint64_t handled, int optional, int nofollow, char *err, size_t errlen)
{
	int fd = ll_open(path, nofollow);
	if (fd < 0) {
		if (errno == ENOENT && optional)
			return 0;
		int e = errno;
		LL_ERR(err, errlen, "open %s: %s%s", path, strerror(e), e == ELOOP && nofollow ? " (a writable path must not contain a symlink)" : "");
		errno = e;
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		LL_ERR(err, errlen, "stat %s: %s", path, strerror(e));
		close(fd);
		errno = e;
		return -1;
	}
	struct ll_path_beneath_attr pb = { .allowed_access = access & handled, .parent_fd = fd };
	if (!S_ISDIR(st.st_mode))
		pb.allowed_access &= LL_FS_FILE_RIGHTS;
	int rc = (int)syscall(SYS_landlock_add_rule, rs, LL_RULE_PATH_BENEATH, &pb, 0);
	int e = errno;
	if (rc < 0)
		LL_ERR(err, errlen, "landlock_add_rule %s: %s", path, strerror(e));
	close(fd);
	errno = e;
	return rc;
}

/* Builds the ruleset described above: its fd (close-on-exec), or -1 with `err` naming the
 * step. `writable`: the places with every right; those from index `nofollow_from` on are
 * --writable paths, opened without following any symlink. Needs g_landlock_abi > 0. */
int landlock_build(const char *const *writable, int nwritable, int nofollow_from, char *err, size_t errlen)
{
	uint64_t h = ll_handled(g_landlock_abi);
	const uint64_t rx = LL_FS_READ_FILE | LL_FS_READ_DIR | LL_FS_EXECUTE;
	const uint64_t rw_files = LL_FS_READ_FILE | LL_FS_WRITE_FILE;
	struct ll_ruleset_attr attr = { .handled_access_fs = h };
	int rs = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0u);
	if (rs < 0) {
		LL_ERR(err, errlen, "landlock_create_ruleset: %s", strerror(errno));
		return -1;
	}
	int rc = ll_rule(rs, "/", rx, h, 0, 0, err, errlen);
	for (int i = 0; rc == 0 && i < nwritable; i++)
		rc = ll_rule(rs, writable[i], h, h, 0, i >= nofollow_from, err, errlen);
	static const char *const terminals[] = { "/dev/pts", "/dev/ptmx", "/dev/tty", "/dev/console" };
	static const char *const shared[] = { "/dev/shm", "/dev/mqueue" };
	if (rc == 0)
		rc = ll_rule(rs, "/dev", rw_files, h, 1, 0, err, errlen);
	for (size_t i = 0; rc == 0 && i < sizeof terminals / sizeof terminals[0]; i++)
		rc = ll_rule(rs, terminals[i], rw_files | LL_FS_IOCTL_DEV, h, 1, 0, err, errlen);
	for (size_t i = 0; rc == 0 && i < sizeof shared / sizeof shared[0]; i++)
		rc = ll_rule(rs, shared[i], h, h, 1, 0, err, errlen);
	if (rc < 0) {
		int e = errno;
		close(rs);
		errno = e;
		return -1;
	}
	return rs;
}

/* Restricts the calling task by the ruleset rs: no_new_privs (needed by
 * landlock_restrict_self without CAP_SYS_ADMIN; runc has set it already on a sandbox's
 * init), then the domain. System calls only: safe in an exec child sharing the agent's
 * memory. 0, or -1 with errno. */
int landlock_enforce(int rs)
{
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return -1;
	return (int)syscall(SYS_landlock_restrict_self, rs, 0u) < 0 ? -1 : 0;
}

int landlock_apply(const char *const *writable, int nwritable, int nofollow_from, char *err, size_t errlen)
{
	int rs = landlock_build(writable, nwritable, nofollow_from, err, errlen);
	if (rs < 0)
		return -1;
	int rc = landlock_enforce(rs);
	int e = errno;
	if (rc < 0)
		LL_ERR(err, errlen, "landlock_restrict_self: %s", strerror(e));
	close(rs);
	errno = e;
	return rc;
}

/* --landlock without --worker: restrict the agent itself, once, before serving. Returns
 * -1 (logged) when the ruleset cannot be applied on a kernel that has Landlock. */
int landlock_self_setup(void)
{
	if (!g_landlock_abi) {
		logf_("landlock unavailable: %s; file access is not restricted", g_landlock_why);
		return 0;
	}
	char err[PATH_MAX + 64];
	if (landlock_apply(g_writable, g_nwritable, 0, err, sizeof err) < 0) {
		logf_("fatal: --landlock: %s", err);
		return -1;
	}
	g_landlock_scope = "agent";
	logf_("landlock: ABI %d, agent restricted: read and execute everywhere, every right on %d writable path(s)%s",
	      g_landlock_abi, g_nwritable, g_nwritable ? "" : " (none)");
	for (int i = 0; i < g_nwritable; i++)
		logf_("landlock: writable %s", g_writable[i]);
	return 0;
}
