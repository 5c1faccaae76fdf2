/*
 * isolate: the namespace init of an isolated exec, and the /proc masks (isolate.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/capability.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "confine.h"
#include "callhost.h"
#include "isolate.h"
#include "landlock.h"
#include "oom.h"
#include "spawn.h"
#include "util.h"

/* Isolated execs (EXEC ISOLATE): mount_setattr (Linux 5.12) with its ABI spelled out, so
 * the build does not depend on the libc headers having it. */
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#define MOUNT_ATTR_RDONLY_ 0x00000001
struct mount_attr_ {
	uint64_t attr_set, attr_clr, propagation, userns_fd;
};
/* At most this many mounts below /proc that an isolated exec re-creates on its fresh
 * /proc (runc's masked and read-only paths: 16). */
#define ISO_MAX_PROC_MASKS 64

/* Isolated execs: available (feature "isolate" in HELLO) when the agent holds
 * CAP_SYS_ADMIN in its user namespace, the kernel has mount_setattr and /proc could be
 * read; g_isolate_why says why not otherwise. */
int g_isolate;
char g_isolate_why[160];
/* The mounts below the sandbox's /proc (runc's maskedPaths and readonlyPaths), found in
 * /proc/self/mountinfo at start and re-created on the fresh /proc of every isolated exec. */
enum proc_mask_kind { PM_NULL = 1, PM_EMPTY_DIR, PM_RO_BIND, PM_BIND };
struct proc_mask {
	char *path;
	int kind;
};
static struct proc_mask g_proc_masks[ISO_MAX_PROC_MASKS];
static int g_nproc_masks;

/*
 * An isolated exec (EXEC ISOLATE, docs/AGENT_PROTOCOL.md "Isolated execs") runs in fresh
 * pid, mount, IPC and UTS namespaces, so nothing it does survives it:
 *
 *   agent --clone(NEWPID|NEWNS|NEWIPC|NEWUTS)--> namespace init (pid 1 of the call)
 *                                          --clone(VM|VFORK)--> the command (pid 2)
 *
 * The init makes every mount private and read-only (one recursive mount_setattr), mounts
 * fresh tmpfs on /tmp, /dev/shm and the SCRATCH paths, a fresh mqueue on /dev/mqueue (the
 * new IPC namespace's), a fresh /proc for the new pid namespace with the sandbox's /proc
 * masks re-created on it, applies Landlock (--landlock), drops CAP_SYS_ADMIN, starts the
 * command (spawn.c: it shares the init's memory until it execs), reaps whatever gets
 * reparented to it, and when the command has exited writes its wait status to the status
 * pipe and exits. The kernel then SIGKILLs everything left in the pid namespace and waits
 * for it before the agent sees the init exit; the mount namespace (with its tmpfs pages)
 * and the IPC namespace (SysV shm/sem/msg, POSIX mqueues) go with their last process.
 *
 * Signals: the init is a session leader and the command stays in its process group, so
 * SIGNAL (kill(-pid)) reaches the command and its group; the init ignores every signal
 * but SIGKILL from the agent (a pid namespace's init with default dispositions), and
 * SIGKILL of the init (timeout, connection loss) takes the whole call down.
 *
 * Why CAP_SYS_ADMIN in the sandbox's user namespace and not a nested user namespace per
 * call (which needs no extra capability): measured in a worker container here, a nested
 * user namespace cannot mount the fresh /proc at all — every mount copied into a less
 * privileged user namespace is locked, and the kernel refuses a new proc mount while the
 * existing /proc has locked mounts over files (runc's masked /proc/kcore etc.; EPERM from
 * mount_too_revealing) — and even without /proc it cost ~1.1-2.1 ms per call against
 * ~0.9-1.0 ms, for the uid/gid map writes and the parent/child handshake. The capability
 * stays with the agent and this init: a worker's agent drops it from its bounding set at
 * start (--worker), so no program it executes can hold it, and the init drops it from
 * its own sets once the mounts are made.
 */

/* The init failed at some step: report it (stage ST_ISOLATE, errno, a text) and exit. */
static void __attribute__((noreturn, format(printf, 3, 4))) iso_fail(int errfd, int err, const char *fmt, ...)
{
	char text[CHILD_REPORT_TEXT];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	child_report(errfd, ST_ISOLATE, err, text);
	_exit(127);
}

/* close_range(first, last) for a possibly empty range; 0 or -1 (ENOSYS: kernel < 5.9). */
static int close_span(int first, int last)
{
	if (first > last)
		return 0;
	return (int)syscall(SYS_close_range, (unsigned)first, (unsigned)last, 0);
}

/* Close every fd >= 3 except keep1 and keep2 (two distinct fds >= 3). */
static void close_all_but(int keep1, int keep2)
{
	int lo = keep1 < keep2 ? keep1 : keep2, hi = keep1 < keep2 ? keep2 : keep1;
	if (close_span(3, lo - 1) == 0 && close_span(lo + 1, hi - 1) == 0 &&
	    syscall(SYS_close_range, (unsigned)hi + 1, ~0U, 0) == 0)
		return;
	/* Kernel < 5.9: walk the table up to the soft limit. */
	struct rlimit rl;
	long max = 65536;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 1048576)
		max = (long)rl.rlim_cur;
	for (long fd = 3; fd < max; fd++)
		if (fd != keep1 && fd != keep2)
			close((int)fd);
}

/* mkdir -p (0755) of an absolute path; existing components are fine. */
static int mkdir_parents(const char *path)
{
	char buf[PATH_MAX];
	size_t n = strlen(path);
	if (n >= sizeof buf)
		return errno = ENAMETOOLONG, -1;
	memcpy(buf, path, n + 1);
	for (char *p = buf + 1;; p++) {
		if (*p == '/' || *p == 0) {
			char c = *p;
			*p = 0;
			if (mkdir(buf, 0755) < 0 && errno != EEXIST)
				return -1;
			*p = c;
			if (!c)
				return 0;
		}
	}
}

/* A fresh tmpfs of `bytes` on `path` (mode 1777). `optional`: a missing mount point is
 * skipped (an image without /tmp); otherwise it is created (mkdir -p), which only works
 * below another fresh tmpfs since everything else is read-only by then. Returns 1 when
 * mounted, 0 when skipped. */
static int iso_tmpfs(int errfd, const char *path, uint64_t bytes, unsigned long flags, int optional)
{
	char opts[64];
	snprintf(opts, sizeof opts, "size=%llu,mode=1777", (unsigned long long)bytes);
	if (mount("tmpfs", path, "tmpfs", flags, opts) == 0)
		return 1;
	if (errno == ENOENT && optional)
		return 0;
	if (errno == ENOENT) {
		if (mkdir_parents(path) < 0)
			iso_fail(errfd, errno, "mkdir %s", path);
		if (mount("tmpfs", path, "tmpfs", flags, opts) == 0)
			return 1;
	}
	iso_fail(errfd, errno, "mount tmpfs on %s", path);
}

/* What every call in a namespace init sees, made once per init: nothing propagates, every
 * inherited mount read-only, a fresh /proc for the new pid namespace with the sandbox's
 * masks re-created on it. `last_pid_fd` (when not NULL): ns_last_pid of the fresh /proc,
 * opened for writing before the masks make /proc/sys read-only (a call host sets it back
 * before each call, callhost_main), or -1 when it cannot be opened. */
static void iso_setup_once(int errfd, int *last_pid_fd)
{
	/* 1. Nothing propagates into or out of this mount namespace. */
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		iso_fail(errfd, errno, "make mounts private");
	/* 2. Every inherited mount read-only: the image, /dev (a tmpfs), /dev/pts, ...; device
	 *    nodes stay usable (a read-only mount only refuses changes to the filesystem). */
	struct mount_attr_ ma = { .attr_set = MOUNT_ATTR_RDONLY_ };
	if (syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE, &ma, sizeof ma) < 0)
		iso_fail(errfd, errno, "make mounts read-only");
	/* 3. /proc of the new pid namespace, with the sandbox's masks re-created on it.
	 *    hidepid=invisible (2; per mount since Linux 5.8): a process the reader may not
	 *    ptrace-read is not listed, so the namespace init (non-dumpable, holding
	 *    capabilities the call lacks) is invisible to the call: neither its counters
	 *    (which a call host sums over its calls) nor its /proc files are there. */
	if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2") < 0)
		iso_fail(errfd, errno, "mount proc on /proc");
	if (last_pid_fd)
		*last_pid_fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC);
	for (int i = 0; i < g_nproc_masks; i++) {
		const struct proc_mask *m = &g_proc_masks[i];
		int rc;
		switch (m->kind) {
		case PM_NULL:
			rc = mount("/dev/null", m->path, NULL, MS_BIND, NULL);
			break;
		case PM_EMPTY_DIR:
			rc = mount("tmpfs", m->path, "tmpfs", MS_RDONLY, NULL);
			break;
		default:
			rc = mount(m->path, m->path, NULL, MS_BIND | MS_REC, NULL);
			if (rc == 0 && m->kind == PM_RO_BIND)
				rc = mount(NULL, m->path, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
					   NULL);
			break;
		}
		/* A path this kernel's proc lacks is fine, as runc has it. */
		if (rc < 0 && errno != ENOENT)
			iso_fail(errfd, errno, "mask %s", m->path);
	}
}

/* A call's mounts (iso_setup_call), each held by an O_PATH fd of its root (-1: not made),
 * so that a call host unmounts exactly those mounts whatever the call did to the paths
 * leading to them (renamed parents, symlinks: iso_undo_call never looks a path up). */
struct iso_mounts {
	int tmp, shm, mqueue;
	int nscratch;
	int scratch[ISO_MAX_SCRATCH];
};

/* The O_PATH fd of the mount just made on `path` (a path this process resolved itself,
 * before anything of the call ran), or -1 when `want` is 0. */
static int iso_mount_fd(int errfd, const char *path, int want)
{
	if (!want)
		return -1;
	int fd = open(path, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		iso_fail(errfd, errno, "open %s", path);
	return fd;
}

/* A call's own writable places: fresh tmpfs on /tmp and /dev/shm (each skipped when the
 * image lacks the directory), a fresh mqueue on /dev/mqueue (the current IPC namespace's),
 * and the SCRATCH tmpfs mounts in request order (one may lie below another). */
static void iso_setup_call(const struct exec_req *r, int errfd, struct iso_mounts *made)
{
	made->tmp = made->shm = made->mqueue = -1;
	made->nscratch = 0;
	made->tmp = iso_mount_fd(errfd, "/tmp", iso_tmpfs(errfd, "/tmp", r->tmp_bytes, MS_NOSUID | MS_NODEV, 1));
	made->shm = iso_mount_fd(errfd, "/dev/shm", iso_tmpfs(errfd, "/dev/shm", r->shm_bytes, MS_NOSUID | MS_NODEV | MS_NOEXEC, 1));
	if (mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) == 0)
		made->mqueue = iso_mount_fd(errfd, "/dev/mqueue", 1);
	else if (errno != ENOENT && errno != ENODEV)
		iso_fail(errfd, errno, "mount mqueue on /dev/mqueue");
	for (int i = 0; i < r->nscratch; i++) {
		iso_tmpfs(errfd, r->scratch[i], r->scratch_bytes[i], MS_NOSUID | MS_NODEV, 0);
		made->scratch[i] = iso_mount_fd(errfd, r->scratch[i], 1);
		made->nscratch = i + 1;
	}
}

/* Close the fds of iso_mounts (the mounts stay). */
static void iso_mounts_close(struct iso_mounts *made)
{
	int *all[] = { &made->tmp, &made->shm, &made->mqueue };
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		if (*all[i] >= 0) {
			close(*all[i]);
			*all[i] = -1;
		}
	for (int i = 0; i < made->nscratch; i++)
		close(made->scratch[i]);
	made->nscratch = 0;
}

/* The places a call may write, for its Landlock ruleset: /tmp when the image has it and
 * the SCRATCH paths (from index *from on: the --writable paths). Returns the count. */
static int iso_writable(const struct exec_req *r, const char **w, int *from)
{
	int nw = 0;
	if (access("/tmp", F_OK) == 0)
		w[nw++] = "/tmp";
	for (int i = 0; i < r->nscratch; i++)
		w[nw++] = r->scratch[i];
	*from = nw;
	for (int i = 0; i < g_nwritable; i++)
		w[nw++] = g_writable[i];
	return nw;
}

static void iso_setup(const struct exec_req *r, int errfd)
{
	struct iso_mounts made;
	iso_setup_once(errfd, NULL);
	iso_setup_call(r, errfd, &made);
	iso_mounts_close(&made);
	/* Landlock (--landlock): after the mounts, since a Landlock domain forbids mount(2).
	 * The call's writable places are its fresh tmpfs mounts (/tmp when the image has it,
	 * the SCRATCH paths; /dev/shm is in every ruleset) and any --writable path. */
	if (g_landlock && g_landlock_abi) {
		const char *w[1 + ISO_MAX_SCRATCH + LL_MAX_WRITABLE];
		int from;
		int nw = iso_writable(r, w, &from);
		char err[PATH_MAX + 64];
		if (landlock_apply(w, nw, from, err, sizeof err) < 0)
			iso_fail(errfd, errno, "landlock: %s", err);
	}
	/* Done with CAP_SYS_ADMIN. */
	if (caps_drop(CAP_SYS_ADMIN) < 0)
		iso_fail(errfd, errno, "drop CAP_SYS_ADMIN");
}

void __attribute__((noreturn)) ns_init_main(struct spawn_plan *pl, int statusfd)
{
	const struct exec_req *r = pl->r;
	int errfd = pl->errfd;
	/* If the agent goes away (a non-PID-1 agent killed), so does the call. */
	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	child_stdio(r, pl->in_r, pl->out_w, pl->err_w, errfd);
	child_reset_signals();
	/* This process lives as long as the call: it must not keep copies of the agent's
	 * sockets and pipes (another exec's stdin would never see EOF). */
	close_all_but(errfd, statusfd);
	iso_setup(r, errfd);
	/* The helper raises this init (the pid the agent saw); the command inherits it. */
	oom_wait_raised();
	/* The command shares this init's memory until it execs (spawn.c); statusfd, like
	 * every fd, is close-on-exec there. */
	pid_t cmd = spawn_command(pl);
	if (cmd < 0)
		iso_fail(errfd, errno, "clone the command");
	/* The error pipe reaches EOF once the command has exec'd (its copy is CLOEXEC). */
	close(errfd);
	close(0);
	close(1);
	close(2);
	for (;;) {
		int st;
		pid_t p = waitpid(-1, &st, 0);
		if (p == cmd) {
			int32_t v = st;
			ssize_t w = write(statusfd, &v, sizeof v);
			(void)w;
			_exit(0);
		}
		if (p < 0 && errno != EINTR)
			_exit(126); /* ECHILD: cannot happen while cmd is unreaped */
	}
}

/* Unmount the mount whose root fd is `fd` and close fd: the working directory is moved
 * to that root (fchdir) and "." unmounted, so no path is looked up at all (a call could
 * have put a SCRATCH tmpfs with symlinks anywhere a path goes through, /proc/self/fd
 * included). MNT_DETACH: nothing of the call is left to hold it, and a mount below it
 * goes with it. The working directory is "/" again after. 0, or -1 with errno. */
static int iso_umount_fd(int fd)
{
	int rc = fchdir(fd) < 0 ? -1 : umount2(".", MNT_DETACH);
	int e = errno;
	close(fd);
	if (chdir("/") < 0 && rc == 0) {
		rc = -1;
		e = errno;
	}
	errno = e;
	return rc;
}

/* Undo a call's mounts (iso_setup_call), last first. A SCRATCH mount below /tmp may be
 * gone with /tmp already if a later one failed: EINVAL there is not an error. */
static int iso_undo_call(struct iso_mounts *made)
{
	int rc = 0;
	for (int i = made->nscratch - 1; i >= 0; i--)
		if (iso_umount_fd(made->scratch[i]) < 0 && errno != EINVAL)
			rc = -1;
	made->nscratch = 0;
	int *top[] = { &made->mqueue, &made->shm, &made->tmp };
	for (size_t i = 0; i < sizeof top / sizeof top[0]; i++) {
		if (*top[i] >= 0 && iso_umount_fd(*top[i]) < 0)
			rc = -1;
		*top[i] = -1;
	}
	return rc;
}

/* Empty the current IPC namespace (a call's) at once, then leave it for a fresh one: the
 * POSIX message queues in the call's mqueue mount (its root fd `mq`, or -1) unlinked,
 * every SysV shared memory segment, semaphore set and message queue listed in
 * /proc/sysvipc removed (IPC_RMID; the host holds CAP_SYS_ADMIN in the namespace's user
 * namespace), then unshare(CLONE_NEWIPC). The kernel frees an IPC namespace itself only
 * in deferred work; removing the objects first gives back their memory and the user's
 * RLIMIT_MSGQUEUE budget before the call's report, not at some later point. 0, or -1
 * with errno (of the unshare; a failed removal is left to the namespace's own end). */
static int iso_fresh_ipc(int mq)
{
	if (mq >= 0) {
		int d = openat(mq, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		DIR *dir = d >= 0 ? fdopendir(d) : NULL;
		if (dir) {
			for (struct dirent *de; (de = readdir(dir));)
				if (de->d_name[0] != '.')
					unlinkat(d, de->d_name, 0);
			closedir(dir);
		} else if (d >= 0) {
			close(d);
		}
	}
	static const char *const kinds[3] = { "/proc/sysvipc/shm", "/proc/sysvipc/sem", "/proc/sysvipc/msg" };
	for (int k = 0; k < 3; k++) {
		char *t = slurp(kinds[k]);
		if (!t)
			continue;
		/* A header line, then "key id ..." per object. */
		char *line = strchr(t, '\n');
		while (line && *++line) {
			long key, id;
			if (sscanf(line, "%ld %ld", &key, &id) == 2) {
				if (k == 0)
					shmctl((int)id, IPC_RMID, NULL);
				else if (k == 1)
					semctl((int)id, 0, IPC_RMID);
				else
					msgctl((int)id, IPC_RMID, NULL);
			}
			line = strchr(line, '\n');
		}
		free(t);
	}
	return unshare(CLONE_NEWIPC);
}

/* Reap the command (its status into *status), then SIGKILL whatever else of the call is
 * in this pid namespace and reap it all: every process of the namespace descends from
 * the host and is reparented to it, so ECHILD means none is left. The kill is repeated
 * after each reap: a process forked before its parent died is signalled by the next one. */
static void callhost_reap_call(pid_t cmd, int *status)
{
	int have = 0;
	for (;;) {
		int st;
		pid_t p = waitpid(-1, &st, 0);
		if (p < 0 && errno == EINTR)
			continue;
		if (p < 0)
			break; /* ECHILD */
		if (p == cmd) {
			*status = st;
			have = 1;
		}
		if (have)
			kill(-1, SIGKILL);
	}
	if (!have)
		*status = 127 << 8;
}

/* What a call's processes can change about their host (pid 1, same user) that a later
 * call could see or suffer: its resource limits (prlimit on pid 1), and, where no Landlock
 * refuses writes to /proc, its oom_score_adj, its coredump_filter and the nice of its
 * session's autogroup (the command shares the host's session). The host reads them once
 * ready and after each call, and retires when any changed (host_state_same). */
struct host_state {
	struct rlimit rl[RLIM_NLIMITS];
	char proc[3][64];
};

/* /proc/self/{oom_score_adj,coredump_filter,autogroup}, opened once the host is ready
 * (-1 when absent) and read with pread after each call. */
static int g_host_state_fd[3] = { -1, -1, -1 };

static void host_state_open(void)
{
	static const char *const f[3] = { "/proc/self/oom_score_adj", "/proc/self/coredump_filter", "/proc/self/autogroup" };
	for (int i = 0; i < 3; i++)
		g_host_state_fd[i] = open(f[i], O_RDONLY | O_CLOEXEC);
}

static void host_state_read(struct host_state *s)
{
	for (int i = 0; i < RLIM_NLIMITS; i++)
		if (getrlimit(i, &s->rl[i]) < 0)
			s->rl[i].rlim_cur = s->rl[i].rlim_max = 0;
	for (int i = 0; i < 3; i++) {
		memset(s->proc[i], 0, sizeof s->proc[i]);
		if (g_host_state_fd[i] >= 0 && pread(g_host_state_fd[i], s->proc[i], sizeof s->proc[i] - 1, 0) < 0)
			s->proc[i][0] = 0;
	}
}

/* Whether `now` (just read) equals `was`; on a difference, *what names it. */
static int host_state_same(const struct host_state *was, const struct host_state *now, const char **what)
{
	for (int i = 0; i < RLIM_NLIMITS; i++)
		if (was->rl[i].rlim_cur != now->rl[i].rlim_cur || was->rl[i].rlim_max != now->rl[i].rlim_max) {
			*what = "a resource limit";
			return 0;
		}
	static const char *const names[3] = { "oom_score_adj", "coredump_filter", "the autogroup's nice" };
	for (int i = 0; i < 3; i++)
		if (strcmp(was->proc[i], now->proc[i]) != 0) {
			*what = names[i];
			return 0;
		}
	return 1;
}

void __attribute__((noreturn)) callhost_main(int ctl)
{
	/* If the agent goes away, so does the host and whatever call it serves. */
	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	/* Its own session: a call's command stays in this process group (SIGNAL, timeouts). */
	if (setsid() < 0)
		_exit(127);
	/* Default dispositions and nothing blocked: as a pid namespace's init it then drops
	 * every signal but the agent's SIGKILL instead of keeping any pending, where the next
	 * call could read them (/proc/1/status). */
	child_reset_signals();
	/* Nothing of the agent's but the control socket and /dev/null (stdin of calls
	 * without STDIN); fds 0-2 stay the agent's (its log). */
	int devnull = spawn_devnull();
	close_all_but(ctl, devnull >= 3 ? devnull : ctl);
	int ready = 0, last_pid_fd = -1, broken = 0;
	struct host_state at_start, now;
	for (;;) {
		struct exec_req r;
		void *mem[2] = { NULL, NULL };
		int fds[4];
		int got = callhost_read_call(ctl, &r, mem, fds);
		if (got == 0)
			_exit(0); /* retired */
		if (got < 0) {
			logf_("call host: malformed call on the control socket; exiting");
			_exit(127);
		}
		int out_w = fds[0], err_w = fds[1], errfd = fds[2], in_r = fds[3];
		if (broken)
			iso_fail(errfd, broken, "clean up after the previous call on this call host");
		if (!ready) {
			/* The agent raises this host's oom_score_adj; its commands inherit it. */
			oom_wait_raised();
			iso_setup_once(errfd, &last_pid_fd);
			if (last_pid_fd < 0)
				iso_fail(errfd, errno, "open /proc/sys/kernel/ns_last_pid");
			host_state_open();
			host_state_read(&at_start);
			ready = 1;
		}
		/* The call's own SysV IPC objects and POSIX message queues: the host's first call
		 * has the clone's fresh IPC namespace, each later one the namespace the previous
		 * call's cleanup made (iso_fresh_ipc). */
		struct iso_mounts made;
		iso_setup_call(&r, errfd, &made);
		/* Pids start at 2 again, as in a fresh pid namespace (the host is 1 and alone). */
		if (pwrite(last_pid_fd, "1", 1, 0) != 1)
			iso_fail(errfd, errno, "reset ns_last_pid");
		int rs = -1;
		if (g_landlock && g_landlock_abi) {
			const char *w[1 + ISO_MAX_SCRATCH + LL_MAX_WRITABLE];
			int from;
			int nw = iso_writable(&r, w, &from);
			char err[PATH_MAX + 64];
			rs = landlock_build(w, nw, from, err, sizeof err);
			if (rs < 0)
				iso_fail(errfd, errno, "landlock: %s", err);
		}
		struct spawn_plan pl;
		spawn_plan_make(&pl, &r, in_r, out_w, err_w, errfd);
		pl.ll_fd = rs;
		pid_t cmd = spawn_hosted_command(&pl);
		if (cmd < 0)
			iso_fail(errfd, errno, "clone the command");
		/* The command's setuid reset the dumpability of the memory it shared with the
		 * host: the host, which keeps CAP_SYS_ADMIN, stays non-dumpable (no ptrace,
		 * pidfd_getfd or /proc/1/mem from the calls it serves). */
		prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
		spawn_plan_free(&pl);
		/* The call's pipes now belong to its command: the error pipe reaches EOF once it
		 * has exec'd, the output pipes once every process of the call is gone. */
		close(errfd);
		close(out_w);
		close(err_w);
		if (in_r >= 0)
			close(in_r);
		if (rs >= 0)
			close(rs);
		int status;
		callhost_reap_call(cmd, &status);
		host_state_read(&now);
		const char *changed = NULL;
		int same = host_state_same(&at_start, &now, &changed);
		/* The report: the status, and whether this host retires (the agent then sends it
		 * nothing more; a host that exits while a call is on its way would end that call
		 * with its own status, as if it had run). */
		int32_t rep[2] = { status, same ? 0 : CALLHOST_RETIRING };
		if (send(ctl, rep, sizeof rep, MSG_NOSIGNAL) != (ssize_t)sizeof rep)
			_exit(0); /* the agent is gone or retired this host */
		if (!same) {
			logf_("call host: a call changed %s of the host; retiring", changed);
			_exit(0); /* the mounts go with this namespace */
		}
		/* Cleaned up after the report (the call's answer does not wait for the RCU grace
		 * period of an unmount); a failure fails the next call, with its reason. */
		if (iso_fresh_ipc(made.mqueue) < 0 && !broken)
			broken = errno ? errno : EIO;
		if (iso_undo_call(&made) < 0 && !broken)
			broken = errno ? errno : EIO;
		free(mem[1]);
		free(mem[0]);
	}
}

/* fork() into fresh pid, mount, IPC and UTS namespaces: a raw clone without a new stack
 * behaves like fork (the agent is single-threaded, so this is safe). The child is pid 1
 * of its pid namespace. A fork, not a CLONE_VM child: the init runs beside the agent for
 * the whole call, so it needs memory of its own. */
pid_t clone_isolated(void)
{
	return (pid_t)syscall(SYS_clone, (unsigned long)(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD),
			      NULL, NULL, NULL, NULL);
}

/* Decode the octal escapes (\040 etc.) of a mountinfo field in place. */
static void mountinfo_unescape(char *s)
{
	char *o = s;
	for (char *p = s; *p; p++) {
		if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' && p[3] >= '0' && p[3] <= '7') {
			*o++ = (char)(((p[1] - '0') << 6) | ((p[2] - '0') << 3) | (p[3] - '0'));
			p += 3;
		} else {
			*o++ = *p;
		}
	}
	*o = 0;
}

/* Find the mounts below the visible /proc (runc's masks) in /proc/self/mountinfo, in
 * mount order, and how to re-create each on a fresh proc: a proc bind (a readonlyPath) is
 * bound again, read-only if it was; anything else over a directory (a masked directory's
 * tmpfs, binfmt_misc) becomes an empty read-only tmpfs; anything else over a file (a
 * masked file: /dev/null) becomes a /dev/null bind. Returns 0, or -1 with a reason. */
static int proc_masks_scan(char *why, size_t whylen)
{
	char *mi = slurp("/proc/self/mountinfo");
	if (!mi) {
		snprintf(why, whylen, "cannot read /proc/self/mountinfo: %s", strerror(errno));
		return -1;
	}
	/* Pass 1: the id of the topmost mount on /proc. Pass 2: its descendants. */
	struct ent {
		long id, parent;
		char *mp, *fstype, *opts;
	} *ents = NULL;
	size_t n = 0, cap = 0;
	long proc_id = -1;
	for (char *line = mi, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		char *f[24];
		int nf = 0;
		char *save = NULL;
		for (char *tok = strtok_r(line, " ", &save); tok && nf < 24; tok = strtok_r(NULL, " ", &save))
			f[nf++] = tok;
		if (nf < 10)
			continue;
		int dash = -1;
		for (int i = 6; i < nf; i++)
			if (strcmp(f[i], "-") == 0) {
				dash = i;
				break;
			}
		if (dash < 0 || dash + 1 >= nf)
			continue;
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			struct ent *ne = realloc(ents, cap * sizeof *ents);
			if (!ne) {
				free(ents);
				free(mi);
				snprintf(why, whylen, "out of memory");
				return -1;
			}
			ents = ne;
		}
		mountinfo_unescape(f[4]);
		ents[n] = (struct ent){ strtol(f[0], NULL, 10), strtol(f[1], NULL, 10), f[4], f[dash + 1], f[5] };
		if (strcmp(f[4], "/proc") == 0 && strcmp(f[dash + 1], "proc") == 0)
			proc_id = ents[n].id;
		n++;
	}
	if (proc_id < 0) {
		free(ents);
		free(mi);
		snprintf(why, whylen, "no proc mount on /proc");
		return -1;
	}
	/* Descendants of proc_id: mountinfo lists a mount after its parent. */
	long *ids = xmalloc(sizeof(long) * (n + 1));
	size_t nids = 0;
	ids[nids++] = proc_id;
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		int under = 0;
		for (size_t k = 0; k < nids; k++)
			if (ents[i].parent == ids[k] && ents[i].id != proc_id)
				under = 1;
		if (!under || strncmp(ents[i].mp, "/proc/", 6) != 0)
			continue;
		ids[nids++] = ents[i].id;
		if (g_nproc_masks == ISO_MAX_PROC_MASKS) {
			snprintf(why, whylen, "more than %d mounts below /proc", ISO_MAX_PROC_MASKS);
			rc = -1;
			break;
		}
		struct proc_mask *m = &g_proc_masks[g_nproc_masks++];
		m->path = xstrndup(ents[i].mp, strlen(ents[i].mp));
		if (strcmp(ents[i].fstype, "proc") == 0) {
			int ro = strncmp(ents[i].opts, "ro", 2) == 0 && (ents[i].opts[2] == ',' || ents[i].opts[2] == 0);
			m->kind = ro ? PM_RO_BIND : PM_BIND;
		} else {
			struct stat st;
			m->kind = stat(ents[i].mp, &st) == 0 && S_ISDIR(st.st_mode) ? PM_EMPTY_DIR : PM_NULL;
		}
	}
	free(ids);
	free(ents);
	free(mi);
	return rc;
}

/* At start: can this agent serve isolated execs? Sets g_isolate / g_isolate_why. */
void isolate_probe(void)
{
	if (!caps_has_effective(CAP_SYS_ADMIN)) {
		snprintf(g_isolate_why, sizeof g_isolate_why, "no CAP_SYS_ADMIN in the agent's user namespace (not a worker)");
		return;
	}
	if (syscall(SYS_mount_setattr, -1, NULL, 0, NULL, (size_t)0) < 0 && errno == ENOSYS) {
		snprintf(g_isolate_why, sizeof g_isolate_why, "the kernel has no mount_setattr (Linux < 5.12)");
		return;
	}
	if (proc_masks_scan(g_isolate_why, sizeof g_isolate_why) < 0)
		return;
	g_isolate = 1;
	char list[1024];
	size_t off = 0;
	list[0] = 0;
	for (int i = 0; i < g_nproc_masks && off < sizeof list; i++) {
		static const char *kinds[] = { "", "null", "empty", "ro", "bind" };
		int n = snprintf(list + off, sizeof list - off, "%s%s(%s)", i ? " " : "", g_proc_masks[i].path,
				 kinds[g_proc_masks[i].kind]);
		if (n < 0)
			break;
		off += (size_t)n;
	}
	logf_("isolate: %d /proc masks re-created per call: %s", g_nproc_masks, g_nproc_masks ? list : "none");
}
