/*
 * dsec-agent: the in-sandbox agent (PID 1 of every container sandbox).
 *
 * It serves the dsec agent protocol (version 1, see docs/AGENT_PROTOCOL.md) on an
 * inherited, already-listening AF_UNIX SOCK_STREAM socket:
 *
 *     dsec-agent --listen-fd N [--sched-idle] [--core-sched] [--worker] [--landlock [--writable PATH]...]
 *     dsec-agent --landlock-abi
 *
 * Priority flags (applied once at start, before the first connection is accepted, and
 * inherited by every process the agent forks; see docs/AGENT_PROTOCOL.md, "Agent flags"):
 *   --sched-idle  lower the agent's RLIMIT_NICE to 0 (soft and hard) and switch it to
 *                 SCHED_IDLE: a batch sandbox. Failure is fatal (exit 1): a batch sandbox
 *                 silently running at normal priority would hurt its latency neighbours.
 *   --core-sched  give the agent's thread group a core-scheduling cookie of its own
 *                 (PR_SCHED_CORE_CREATE): no task outside the sandbox shares an SMT core
 *                 with its tasks at the same time. On a kernel without core scheduling
 *                 (EINVAL: not compiled in; ENODEV: no SMT) it logs one line and continues.
 *   --worker      an fncall worker: the spec granted CAP_SYS_ADMIN for isolated execs; the
 *                 agent drops it from its bounding set at start (no exec'd program can
 *                 ever hold it) and logs per-exec lines only for failures. Fatal (exit 1)
 *                 if it cannot isolate. Every process it starts installs a second seccomp
 *                 filter (worker_filter_install) that denies mount and mount_setattr,
 *                 the two syscalls runc's filter leaves to a worker's agent.
 *   --landlock    restrict file access with Landlock (see "Landlock" below): the agent
 *                 itself at start, or, with --worker, each isolated call after its
 *                 mounts; --writable PATH (repeatable) names the places left writable.
 *                 A kernel without Landlock is logged and reported in HELLO; any other
 *                 failure to apply it is fatal (exit 1).
 *   --landlock-abi  print the kernel's Landlock ABI as JSON and exit (for dsecd).
 *
 * Lifecycle contracts:
 *   - As PID 1 it never exits: SIGTERM/SIGINT/SIGHUP are blocked (consumed through a
 *     signalfd and logged) and every child is reaped, including orphans it did not spawn.
 *   - When not PID 1 (tests, or a guest agent run under another init) it marks itself a
 *     child subreaper, so orphans of its execs are still reaped by it, and it exits on
 *     SIGTERM/SIGINT after SIGKILLing the process groups of its running execs.
 *   - Every fd it owns is close-on-exec; PR_SET_DUMPABLE is 0 so sandbox code cannot
 *     open /proc/1/fd or ptrace it.
 *   - One thread, one epoll loop, level-triggered. Nothing in the loop blocks on a peer:
 *     sockets and the parent ends of exec pipes are non-blocking, and outbound data is
 *     queued per connection with a 4 MiB high-water mark (see OUTQ_HIGH).
 *
 * Isolated execs (EXEC ISOLATE, feature "isolate"): the exec runs under a namespace init
 * in fresh pid/mount/IPC/UTS namespaces with fresh tmpfs mounts, so nothing of it survives
 * the call; see "isolated execs" below and docs/AGENT_PROTOCOL.md.
 *
 * Besides execs (pipes or a pseudo-terminal, optionally detached from the connection) it
 * serves file operations (read, write, stat, list, mkdir, remove, symlink) inside the
 * sandbox's mount namespace as a given user: the agent switches its fsuid/fsgid and
 * supplementary groups around each step (cred_enter/cred_leave) and always restores them.
 *
 * Logging: one line per event on fd 2, "<RFC 3339 UTC timestamp> dsec-agent[pid]: msg".
 *
 * Built with: gcc -static -O2 -Wall -Wextra (plain libc, no NSS: /etc/passwd and
 * /etc/group of the sandbox are parsed directly).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <grp.h>
#include <sys/epoll.h>
#include <sys/fsuid.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <termios.h>
#include <linux/capability.h>
#include <linux/openat2.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <stddef.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#include "damon.h"
#include "vmux.h"

/* Core scheduling (Linux 5.14, <linux/prctl.h>); values are the kernel ABI. */
#ifndef PR_SCHED_CORE
#define PR_SCHED_CORE 62
#endif
#ifndef PR_SCHED_CORE_CREATE
#define PR_SCHED_CORE_CREATE 1
#endif
#ifndef PR_SCHED_CORE_SCOPE_THREAD_GROUP
#define PR_SCHED_CORE_SCOPE_THREAD_GROUP 1 /* PIDTYPE_TGID */
#endif

#define AGENT_NAME "dsec-agent"
#define AGENT_VERSION "0.1.0"
#define PROTOCOL_VERSION 1u

/* Frame header: u32 BE length, u8 type, u8 flags, u16 reserved, u32 BE stream id. */
#define HDR_LEN 12
/* Largest payload either side may send; a larger header is a fatal protocol error. */
#define MAX_PAYLOAD (1u << 20)
/* Read size for exec pipes and connections: one pipe buffer's worth (Linux default). */
#define READ_CHUNK 65536
/* Outbound queue high-water mark per connection: above it the exec pipes of that
 * connection stop being read (EPOLLIN off) so one slow client cannot grow the agent
 * without bound; reading resumes once the queue is below OUTQ_LOW. */
#define OUTQ_HIGH (4u << 20)
#define OUTQ_LOW (1u << 20)
/* Per-exec stdin queue high-water mark: above it the agent stops reading the
 * connection (all its streams) until the child has consumed the queue below STDINQ_LOW. */
#define STDINQ_HIGH (4u << 20)
#define STDINQ_LOW (1u << 20)
/* At reap, drain at most this much per pipe: a backgrounded grandchild that keeps
 * writing must not keep the loop busy forever. */
#define EXIT_DRAIN_MAX (4u << 20)
/* How long the listener is paused after accept() hits EMFILE/ENFILE. */
#define ACCEPT_RETRY_MS 100

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

#ifndef TIOCGPTPEER
#define TIOCGPTPEER _IO('T', 0x41)
#endif
#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

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
/* Size of the per-call tmpfs on /tmp and on /dev/shm when the request gives 0: 64 MiB,
 * the size the OCI spec gives a sandbox's /dev/shm (daemon/drivers/container/spec.ts). */
#define ISO_DEFAULT_TMPFS_BYTES (64ull << 20)
/* At most this many SCRATCH mounts per exec, and this many mounts below /proc that an
 * isolated exec re-creates on its fresh /proc (runc's masked and read-only paths: 16). */
#define ISO_MAX_SCRATCH 8
#define ISO_MAX_PROC_MASKS 64
/* The exec child's report on the error pipe: i32 stage, i32 errno, then (ST_ISOLATE only)
 * a text naming the step. One write below PIPE_BUF, so the agent reads it in one piece. */
#define CHILD_REPORT_TEXT 480

enum frame_type {
	F_HELLO = 1,
	F_PING = 2,
	F_PONG = 3,
	F_EXEC = 4,
	F_STARTED = 5,
	F_STDOUT = 6,
	F_STDERR = 7,
	F_STDIN = 8,
	F_STDIN_EOF = 9,
	F_SIGNAL = 10,
	F_EXIT = 11,
	F_EXEC_ERROR = 12,
	F_ERROR = 13,
	F_RESIZE = 14,
	F_FILE_READ = 15,
	F_FILE_INFO = 16,
	F_FILE_DATA = 17,
	F_FILE_DONE = 18,
	F_FILE_WRITE = 19,
	F_FILE_ERROR = 20,
	F_FILE_ACK = 21,
	F_FILE_STAT = 22,
	F_FILE_LIST = 23,
	F_FILE_ENTRY = 24,
	F_FILE_MKDIR = 25,
	F_FILE_REMOVE = 26,
	F_FILE_SYMLINK = 27,
};

enum exec_tag {
	T_ARGV = 1,
	T_ENV = 2,
	T_CWD = 3,
	T_USER = 4,
	T_TIMEOUT_MS = 5,
	T_STDIN = 6,
	T_TTY = 7,
	T_DETACHED = 8,
	T_ISOLATE = 9,
	T_SCRATCH = 10,
};

/* TLV tags of the file requests (FILE_READ, FILE_WRITE, FILE_STAT, ...). */
enum file_tag {
	FT_PATH = 1,
	FT_USER = 2,
	FT_OFFSET = 3,
	FT_LENGTH = 4,
	FT_MODE = 5,
	FT_FLAGS = 6,
	FT_NOFOLLOW = 7,
	FT_RECURSIVE = 9,
	FT_TARGET = 10,
};

/* FLAGS of FILE_WRITE (all four) and FILE_MKDIR (WF_PARENTS only). */
enum write_flag {
	WF_CREATE = 1,
	WF_APPEND = 2,
	WF_EXCL = 4,
	WF_PARENTS = 8,
};
#define WF_ALL (WF_CREATE | WF_APPEND | WF_EXCL | WF_PARENTS)

/* Stage codes the forked child reports (with errno) over its CLOEXEC error pipe. */
enum child_stage {
	ST_SETUP = 1,
	ST_CHDIR = 2,
	ST_USER_UNKNOWN = 3,
	ST_GROUP_UNKNOWN = 4,
	ST_SETGROUPS = 5,
	ST_SETGID = 6,
	ST_SETUID = 7,
	ST_EXEC = 8,
	ST_ISOLATE = 9, /* the namespace init of an isolated exec failed; a text follows */
};

enum watch_kind { W_LISTEN = 1, W_SIGNAL, W_CONN, W_STDOUT, W_STDERR, W_STDIN, W_STARTPIPE, W_VMUX };

/* One registered fd. data.ptr of its epoll event points here; fd == -1 once closed, so a
 * stale event later in the same epoll batch is skipped. Objects are freed only at the end
 * of a loop iteration (graveyard), never while events may still point at them. */
struct watch {
	int kind;
	int fd;
	int registered;
	uint32_t events;
	void *obj;
};

struct chunk {
	struct chunk *next;
	size_t len, off;
	unsigned char data[];
};

struct exec;
struct fop;

struct conn {
	struct watch w;
	unsigned id;
	int helloed;
	int closing;        /* fatal error sent: flush, then destroy */
	int dead;
	int out_paused;     /* exec pipes not read: outbound queue above OUTQ_HIGH */
	int stdin_over;     /* # execs whose stdin queue is above STDINQ_HIGH */
	int dirty;
	int processing;     /* inside conn_process (guards re-entry) */
	unsigned char *in;
	size_t in_len, in_cap;
	struct chunk *oq_head, *oq_tail;
	size_t oq_bytes;
	struct exec *execs; /* live exec streams (final frame not yet sent) */
	struct fop *fops;   /* live file streams */
	struct conn *next, *prev;
	struct conn *dirty_next;
	struct conn *grave_next;
};

struct exec {
	struct conn *c;     /* NULL once detached (final frame sent or connection gone) */
	uint32_t stream;
	pid_t pid;
	struct watch w_out, w_err, w_in, w_start;
	int started;        /* STARTED sent */
	int finished;       /* final frame sent, or connection gone: no more frames */
	int reaped;
	int timed_out;
	int stdin_eof;      /* STDIN_EOF received: close stdin once the queue is empty */
	int stdin_over;
	int is_tty;         /* w_out is the pty master, w_in a dup of it, no w_err */
	int detached;       /* DETACHED: survives the loss of its connection */
	int orphaned;       /* detached and its connection is gone: output discarded */
	int isolated;       /* ISOLATE: pid is the namespace init, status_fd carries the command's status */
	int status_fd;      /* isolated: read end of the status pipe (-1 otherwise / once read) */
	uint64_t t0_ns;
	uint64_t deadline_ns; /* 0 = none / already fired */
	struct chunk *iq_head, *iq_tail;
	size_t iq_bytes;
	char *argv0, *cwd, *user; /* copies for messages and logs */
	struct exec *cnext, *cprev;
	struct exec *gnext, *gprev;
	struct exec *grave_next;
};

/* The identity a file operation runs as (fsuid/fsgid + supplementary groups). */
struct creds {
	int noop;           /* unprivileged agent asked for its own identity: no switch */
	char home[512];     /* the user's home from /etc/passwd ("/" when it has no entry) */
	uint32_t uid, gid;
	int ngroups;
	gid_t groups[256];
};

enum fop_kind { FOP_READ = 1, FOP_WRITE, FOP_LIST };

/* A file operation that spans more than one loop iteration: a streaming read or list
 * (agent->client), or a write (client->agent). Lives on its connection's fops list until
 * its final frame. */
struct fop {
	struct conn *c;
	uint32_t stream;
	int kind;
	int fd;             /* READ: the file; LIST: the directory; WRITE: temp file or target */
	int dirfd;          /* WRITE: O_PATH fd of the target's directory */
	struct creds cr;
	char *path;         /* normalized path, for messages and logs */
	/* READ */
	uint64_t pos, remaining;
	/* LIST */
	unsigned char *dbuf;
	size_t dlen, doff;
	int eof;
	/* WRITE */
	char *name, *tmpname; /* tmpname NULL: writing the target in place (APPEND) */
	uint32_t mode;
	int excl;
	int preserve_owner;
	uint32_t owner_uid, owner_gid;
	uint64_t written, acked;
	struct fop *next, *prev;
};

/* Doubly linked lists threaded through a pair of next/prev fields of their elements
 * (conn.next/prev, exec.cnext/cprev and gnext/gprev, fop.next/prev): push x at the head,
 * or unlink x (its own next/prev fields are left as they are). */
#define DL_PUSH(head, x, next, prev)          \
	do {                                  \
		(x)->next = (head);           \
		if (head)                     \
			(head)->prev = (x);   \
		(head) = (x);                 \
	} while (0)
#define DL_UNLINK(head, x, next, prev)                \
	do {                                          \
		if ((x)->prev)                        \
			(x)->prev->next = (x)->next;  \
		else                                  \
			(head) = (x)->next;           \
		if ((x)->next)                        \
			(x)->next->prev = (x)->prev;  \
	} while (0)

/* ---- globals ---------------------------------------------------------------------- */

static int g_epfd = -1;
static int g_sigfd = -1;
static int g_devnull = -1;
static int g_is_pid1;
static int g_quit;
static unsigned g_next_conn_id = 1;
static struct watch g_listen_w, g_sig_w, g_vmux_w;
static uint64_t g_listen_retry_ns; /* nonzero: listener paused until then */
static struct rlimit g_orig_nofile;
static struct conn *g_conns;
static struct conn *g_dirty;
static struct conn *g_conn_grave;
static struct exec *g_execs;      /* every not-yet-reaped exec */
static struct exec *g_exec_grave;
static unsigned g_deadlines;      /* # execs with deadline_ns != 0 */
static unsigned char g_rbuf[READ_CHUNK];
static int g_no_openat2;          /* openat2 unavailable (ENOSYS): O_NOFOLLOW fallback */
/* Isolated execs: available (feature "isolate" in HELLO) when the agent holds
 * CAP_SYS_ADMIN in its user namespace, the kernel has mount_setattr and /proc could be
 * read; g_isolate_why says why not otherwise. */
static int g_isolate;
static char g_isolate_why[160];
/* --worker: no log line for an exec that starts and exits normally (a worker runs
 * ~1,000 calls/s; errors, timeouts and deaths by signal are still logged). */
static int g_quiet_execs;
/* --worker: every process the agent starts installs worker_filter before its command
 * runs (see worker_filter_install). */
static int g_worker_filter;
/* Signals whose disposition was not SIG_DFL once the agent had set itself up; every exec
 * child resets exactly these (child_reset_signals). */
static int g_sig_nondefault[64];
static int g_nsig_nondefault;
/* The mounts below the sandbox's /proc (runc's maskedPaths and readonlyPaths), found in
 * /proc/self/mountinfo at start and re-created on the fresh /proc of every isolated exec. */
enum proc_mask_kind { PM_NULL = 1, PM_EMPTY_DIR, PM_RO_BIND, PM_BIND };
struct proc_mask {
	char *path;
	int kind;
};
static struct proc_mask g_proc_masks[ISO_MAX_PROC_MASKS];
static int g_nproc_masks;
/* The agent's own filesystem identity, restored after every file operation. */
static uid_t g_fsuid0;
static gid_t g_fsgid0;
static int g_ngroups0;
static gid_t *g_groups0;
static mode_t g_umask0;
static int g_cred_active;

/* ---- small helpers ---------------------------------------------------------------- */

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
	char line[1024];
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ " AGENT_NAME "[%d]: ",
			 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
			 ts.tv_nsec / 1000000, (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	size_t len = (size_t)n + (size_t)m;
	if (len > sizeof line - 2)
		len = sizeof line - 2;
	line[len++] = '\n';
	/* Best effort: a log write must never take the agent down. */
	ssize_t w = write(2, line, len);
	(void)w;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void put_u32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24);
	p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8);
	p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static void put_u64(unsigned char *p, uint64_t v)
{
	put_u32(p, (uint32_t)(v >> 32));
	put_u32(p + 4, (uint32_t)v);
}

static uint64_t get_u64(const unsigned char *p)
{
	return ((uint64_t)get_u32(p) << 32) | get_u32(p + 4);
}

/* One field of a TLV payload (EXEC and file requests): u8 tag, u32 BE length, value. */
struct tlv {
	unsigned tag;
	uint32_t len;
	const unsigned char *v;
};

enum tlv_result { TLV_END = 0, TLV_FIELD, TLV_TRUNCATED, TLV_OVERRUN };

/* Read the field at *off of the payload p (len bytes) and advance *off past it. Returns
 * TLV_FIELD, TLV_END after the last field, TLV_TRUNCATED for a partial field header
 * (*off unchanged) or TLV_OVERRUN when the value runs past the payload (t->tag is set). */
static enum tlv_result tlv_next(const unsigned char *p, size_t len, size_t *off, struct tlv *t)
{
	if (*off >= len)
		return TLV_END;
	if (len - *off < 5)
		return TLV_TRUNCATED;
	t->tag = p[*off];
	t->len = get_u32(p + *off + 1);
	if (t->len > len - *off - 5)
		return TLV_OVERRUN;
	t->v = p + *off + 5;
	*off += 5 + (size_t)t->len;
	return TLV_FIELD;
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p) {
		logf_("fatal: out of memory (%zu bytes)", n);
		/* As PID 1 exiting panics the sandbox; there is nothing better to do. */
		_exit(111);
	}
	return p;
}

static char *xstrndup(const char *s, size_t n)
{
	char *p = xmalloc(n + 1);
	memcpy(p, s, n);
	p[n] = 0;
	return p;
}

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -1;
	return fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int set_cloexec(int fd)
{
	int fl = fcntl(fd, F_GETFD);
	if (fl < 0)
		return -1;
	return fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
}

#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* Mark every fd >= from close-on-exec. */
static void cloexec_from(int from)
{
	if (syscall(SYS_close_range, (unsigned)from, ~0U, CLOSE_RANGE_CLOEXEC) == 0)
		return;
	/* Kernel < 5.11: walk the table up to the soft limit. */
	struct rlimit rl;
	long max = 65536;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 1048576)
		max = (long)rl.rlim_cur;
	for (long fd = from; fd < max; fd++)
		set_cloexec((int)fd);
}

/* ---- epoll watches ---------------------------------------------------------------- */

/* Register fd with the given events. An empty event mask means "not registered": epoll
 * reports EPOLLHUP/EPOLLERR even for an empty mask, so a paused or not-yet-started pipe
 * must be out of the set entirely. */
static int watch_add(struct watch *w, int kind, int fd, void *obj, uint32_t events)
{
	w->kind = kind;
	w->fd = fd;
	w->obj = obj;
	w->events = 0;
	w->registered = 0;
	if (!events)
		return 0;
	struct epoll_event ev = { .events = events, .data.ptr = w };
	if (epoll_ctl(g_epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
		return -1;
	w->events = events;
	w->registered = 1;
	return 0;
}

/* Change the event mask; 0 unregisters, nonzero (re-)registers. */
static void watch_set(struct watch *w, uint32_t events)
{
	if (w->fd < 0 || (w->registered && w->events == events) || (!w->registered && !events))
		return;
	struct epoll_event ev = { .events = events, .data.ptr = w };
	int op = !events ? EPOLL_CTL_DEL : w->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
	if (epoll_ctl(g_epfd, op, w->fd, &ev) < 0) {
		logf_("epoll_ctl op=%d fd=%d: %s", op, w->fd, strerror(errno));
		return;
	}
	w->events = events;
	w->registered = events != 0;
}

/* Unregister and close. The explicit EPOLL_CTL_DEL matters: a forked child that has not
 * exec'd yet still holds a copy of the fd, and epoll only drops an entry when every fd
 * of the open file description is closed. */
static void watch_close(struct watch *w)
{
	if (w->fd < 0)
		return;
	if (w->registered)
		epoll_ctl(g_epfd, EPOLL_CTL_DEL, w->fd, NULL);
	close(w->fd);
	w->fd = -1;
	w->kind = 0;
	w->registered = 0;
	w->events = 0;
}

/* ---- outbound frames -------------------------------------------------------------- */

static void exec_pipes_set_paused(struct conn *c, int paused);

static void conn_mark_dirty(struct conn *c)
{
	if (!c->dirty) {
		c->dirty = 1;
		c->dirty_next = g_dirty;
		g_dirty = c;
	}
}

/* A frame with room for up to cap payload bytes at ch->data + HDR_LEN; queue it with
 * frame_queue() once the payload is in place. */
static struct chunk *frame_alloc(unsigned type, uint32_t stream, size_t cap)
{
	struct chunk *ch = xmalloc(sizeof *ch + HDR_LEN + cap);
	ch->next = NULL;
	ch->off = 0;
	ch->len = HDR_LEN + cap;
	put_u32(ch->data, (uint32_t)cap);
	ch->data[4] = (unsigned char)type;
	ch->data[5] = 0;
	ch->data[6] = 0;
	ch->data[7] = 0;
	put_u32(ch->data + 8, stream);
	return ch;
}

/* Queue a frame from frame_alloc() whose payload is plen bytes (<= its cap). */
static void frame_queue(struct conn *c, struct chunk *ch, size_t plen)
{
	if (!c || c->dead) {
		free(ch);
		return;
	}
	ch->len = HDR_LEN + plen;
	put_u32(ch->data, (uint32_t)plen);
	if (c->oq_tail)
		c->oq_tail->next = ch;
	else
		c->oq_head = ch;
	c->oq_tail = ch;
	c->oq_bytes += ch->len;
	conn_mark_dirty(c);
	if (!c->out_paused && c->oq_bytes > OUTQ_HIGH)
		exec_pipes_set_paused(c, 1);
}

/* Queue one frame whose payload is the concatenation of (p1,n1) and (p2,n2). */
static void send_frame2(struct conn *c, unsigned type, uint32_t stream, const void *p1, size_t n1,
			const void *p2, size_t n2)
{
	if (!c || c->dead)
		return;
	struct chunk *ch = frame_alloc(type, stream, n1 + n2);
	if (n1)
		memcpy(ch->data + HDR_LEN, p1, n1);
	if (n2)
		memcpy(ch->data + HDR_LEN + n1, p2, n2);
	frame_queue(c, ch, n1 + n2);
}

static void send_frame(struct conn *c, unsigned type, uint32_t stream, const void *p, size_t n)
{
	send_frame2(c, type, stream, p, n, NULL, 0);
}

/* EXEC_ERROR or FILE_ERROR: u32 errno, then the message (n bytes). */
static void send_errno_frame(struct conn *c, unsigned type, uint32_t stream, int err, const char *msg, size_t n)
{
	unsigned char b[4];
	put_u32(b, (uint32_t)err);
	send_frame2(c, type, stream, b, 4, msg, n);
}

/* vsnprintf into msg (cap bytes); returns the length of what fits (truncated, never < 0). */
static size_t vformat(char *msg, size_t cap, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));
static size_t vformat(char *msg, size_t cap, const char *fmt, va_list ap)
{
	int n = vsnprintf(msg, cap, fmt, ap);
	if (n < 0)
		return 0;
	return (size_t)n >= cap ? cap - 1 : (size_t)n;
}

static void send_error(struct conn *c, uint32_t stream, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void send_error(struct conn *c, uint32_t stream, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	size_t n = vformat(msg, sizeof msg, fmt, ap);
	va_end(ap);
	logf_("conn=%u stream=%u error: %s", c->id, stream, msg);
	send_frame(c, F_ERROR, stream, msg, n);
}

/* A fatal protocol error: ERROR on stream 0, stop reading, close once it is flushed. */
static void conn_fatal(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void conn_fatal(struct conn *c, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	size_t n = vformat(msg, sizeof msg, fmt, ap);
	va_end(ap);
	logf_("conn=%u fatal protocol error: %s", c->id, msg);
	send_frame(c, F_ERROR, 0, msg, n);
	c->closing = 1;
	watch_set(&c->w, 0);
}

/* ---- exec bookkeeping ------------------------------------------------------------- */

/* Output of an orphaned (detached, connection gone) exec is read and discarded. */
static uint32_t pipe_events(struct exec *e)
{
	return (e->c && e->c->out_paused) ? 0 : EPOLLIN;
}

static void exec_pipes_set_paused(struct conn *c, int paused)
{
	c->out_paused = paused;
	for (struct exec *e = c->execs; e; e = e->cnext) {
		if (!e->started)
			continue;
		watch_set(&e->w_out, paused ? 0 : EPOLLIN);
		watch_set(&e->w_err, paused ? 0 : EPOLLIN);
	}
}

static void conn_process(struct conn *c);

/* Reading the connection was paused for stdin backpressure and may resume now. */
static void conn_resume_input(struct conn *c)
{
	if (c->closing || c->dead || c->stdin_over)
		return;
	watch_set(&c->w, c->w.events | EPOLLIN);
	conn_process(c); /* frames already buffered would otherwise wait for new input */
}

static void stdin_over_update(struct exec *e)
{
	struct conn *c = e->c;
	int over = e->stdin_over ? e->iq_bytes > STDINQ_LOW : e->iq_bytes > STDINQ_HIGH;
	if (over == e->stdin_over)
		return;
	e->stdin_over = over;
	if (!c)
		return;
	int before = c->stdin_over;
	c->stdin_over += over ? 1 : -1;
	if (before == 0 && c->stdin_over > 0) {
		watch_set(&c->w, c->w.events & ~(uint32_t)EPOLLIN);
	} else if (before > 0 && c->stdin_over == 0) {
		conn_resume_input(c);
	}
}

/* Free a queue of chunks (stdin or outbound). */
static void chunks_free(struct chunk *ch)
{
	while (ch) {
		struct chunk *n = ch->next;
		free(ch);
		ch = n;
	}
}

static void stdin_queue_free(struct exec *e)
{
	chunks_free(e->iq_head);
	e->iq_head = e->iq_tail = NULL;
	e->iq_bytes = 0;
	stdin_over_update(e);
}

static void exec_close_stdin(struct exec *e)
{
	stdin_queue_free(e);
	watch_close(&e->w_in);
}

/* Write as much of the stdin queue as the pipe takes, without blocking. */
static void exec_stdin_flush(struct exec *e)
{
	while (e->iq_head && e->w_in.fd >= 0) {
		struct chunk *ch = e->iq_head;
		ssize_t n = write(e->w_in.fd, ch->data + ch->off, ch->len - ch->off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				break;
			/* EPIPE: the child closed its stdin; what it did not read is dropped. */
			exec_close_stdin(e);
			return;
		}
		ch->off += (size_t)n;
		e->iq_bytes -= (size_t)n;
		if (ch->off == ch->len) {
			e->iq_head = ch->next;
			if (!e->iq_head)
				e->iq_tail = NULL;
			free(ch);
		}
	}
	if (e->w_in.fd < 0)
		return;
	stdin_over_update(e);
	if (!e->iq_head && e->stdin_eof) {
		watch_close(&e->w_in);
		return;
	}
	watch_set(&e->w_in, e->iq_head ? EPOLLOUT : 0);
}

static void conn_unlink_exec(struct exec *e)
{
	struct conn *c = e->c;
	if (!c)
		return;
	if (e->stdin_over) {
		e->stdin_over = 0;
		c->stdin_over--;
		conn_resume_input(c);
	}
	DL_UNLINK(c->execs, e, cnext, cprev);
	e->cnext = e->cprev = NULL;
	e->c = NULL;
}

/* SIGKILL the exec's process group. The child calls setsid() first thing, so its pgid is
 * its pid; if it has not got that far yet, kill the child itself. */
static void exec_kill(struct exec *e, int sig)
{
	if (e->reaped)
		return;
	if (kill(-e->pid, sig) < 0)
		kill(e->pid, sig);
}

/* After the final frame (or connection loss): no more frames for this stream. The exec
 * stays in g_execs until reaped. */
static void exec_finish(struct exec *e)
{
	if (e->finished)
		return;
	e->finished = 1;
	watch_close(&e->w_out);
	watch_close(&e->w_err);
	watch_close(&e->w_start);
	exec_close_stdin(e);
	if (e->deadline_ns) {
		e->deadline_ns = 0;
		g_deadlines--;
	}
	conn_unlink_exec(e);
}

static void exec_free_later(struct exec *e)
{
	DL_UNLINK(g_execs, e, gnext, gprev);
	e->gnext = e->gprev = NULL;
	e->grave_next = g_exec_grave;
	g_exec_grave = e;
}

static const char *stage_name(int stage)
{
	switch (stage) {
	case ST_SETUP: return "setup";
	case ST_CHDIR: return "chdir";
	case ST_USER_UNKNOWN:
	case ST_GROUP_UNKNOWN:
	case ST_SETGROUPS:
	case ST_SETGID:
	case ST_SETUID: return "user";
	case ST_EXEC: return "exec";
	case ST_ISOLATE: return "isolate";
	default: return "spawn";
	}
}

static void exec_send_exec_error(struct exec *e, int stage, int err, const char *text)
{
	char msg[1024];
	switch (stage) {
	case ST_ISOLATE:
		snprintf(msg, sizeof msg, "isolate: %s: %s", text && *text ? text : "setup", strerror(err));
		break;
	case ST_CHDIR:
		snprintf(msg, sizeof msg, "chdir: %s: %s", e->cwd, strerror(err));
		break;
	case ST_USER_UNKNOWN:
	case ST_GROUP_UNKNOWN:
		snprintf(msg, sizeof msg, "user: %s: unknown %s", e->user, stage == ST_USER_UNKNOWN ? "user" : "group");
		break;
	case ST_SETGROUPS:
	case ST_SETGID:
	case ST_SETUID:
		snprintf(msg, sizeof msg, "user: %s: %s: %s", e->user,
			 stage == ST_SETGROUPS ? "setgroups" : stage == ST_SETGID ? "setgid" : "setuid", strerror(err));
		break;
	case ST_EXEC:
		snprintf(msg, sizeof msg, "exec: %s: %s", e->argv0, strerror(err));
		break;
	default:
		snprintf(msg, sizeof msg, "%s: %s", stage_name(stage), strerror(err));
		break;
	}
	if (e->c) {
		logf_("conn=%u stream=%u pid=%d exec error: %s", e->c->id, e->stream, (int)e->pid, msg);
		send_errno_frame(e->c, F_EXEC_ERROR, e->stream, err, msg, strlen(msg));
	}
	exec_finish(e);
}

/* Read from a stdout/stderr pipe once (at most READ_CHUNK) and queue a frame.
 * Returns bytes read, 0 on EOF/error (pipe closed), -1 if nothing is available now. */
static ssize_t exec_pipe_read(struct exec *e, struct watch *w)
{
	ssize_t n;
	do
		n = read(w->fd, g_rbuf, sizeof g_rbuf);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == EAGAIN)
		return -1;
	if (n <= 0) {
		watch_close(w);
		return 0;
	}
	if (e->c)
		send_frame(e->c, w->kind == W_STDOUT ? F_STDOUT : F_STDERR, e->stream, g_rbuf, (size_t)n);
	return n;
}

/* The child reported nothing and its error pipe hit EOF: it exec'd. */
static void exec_mark_started(struct exec *e)
{
	watch_close(&e->w_start);
	e->started = 1;
	if (e->c) {
		unsigned char b[4];
		put_u32(b, (uint32_t)e->pid);
		send_frame(e->c, F_STARTED, e->stream, b, 4);
	}
	uint32_t ev = pipe_events(e);
	watch_set(&e->w_out, ev);
	watch_set(&e->w_err, ev);
}

/* Handle the error pipe: returns 1 once it is resolved (STARTED or EXEC_ERROR sent). */
static int exec_start_pipe_read(struct exec *e)
{
	unsigned char b[8 + CHILD_REPORT_TEXT + 1];
	ssize_t n;
	do
		n = read(e->w_start.fd, b, sizeof b - 1);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == EAGAIN)
		return 0;
	if (n >= 8) {
		int32_t v[2];
		memcpy(v, b, 8);
		b[n] = 0;
		exec_send_exec_error(e, v[0], v[1], (const char *)b + 8);
		return 1;
	}
	if (n > 0) /* short report: cannot happen (< PIPE_BUF is atomic); be conservative */
		exec_send_exec_error(e, ST_SETUP, EIO, NULL);
	else
		exec_mark_started(e);
	return 1;
}

static void exec_on_reaped(struct exec *e, int status)
{
	e->reaped = 1;
	uint64_t dur_us = (mono_ns() - e->t0_ns) / 1000;
	if (!e->finished && !e->started && e->w_start.fd >= 0) {
		/* The child is gone, so its end of the error pipe is closed: this read cannot
		 * block and tells STARTED from EXEC_ERROR. */
		set_nonblock(e->w_start.fd);
		if (!exec_start_pipe_read(e))
			exec_send_exec_error(e, ST_SETUP, EIO, NULL);
	}
	if (e->status_fd >= 0) {
		/* An isolated exec: the namespace init reports the command's own wait status
		 * just before it exits. Without a report (the init was SIGKILLed: timeout,
		 * SIGNAL 9, connection loss), the init's status is the exec's. */
		int32_t st;
		ssize_t n;
		do
			n = read(e->status_fd, &st, sizeof st);
		while (n < 0 && errno == EINTR);
		if (n == (ssize_t)sizeof st)
			status = st;
		close(e->status_fd);
		e->status_fd = -1;
	}
	if (!e->finished && e->c) {
		/* Drain what is already in the pipes, without waiting for EOF: a backgrounded
		 * grandchild may hold the write ends forever. */
		struct watch *ws[2] = { &e->w_out, &e->w_err };
		for (int i = 0; i < 2; i++) {
			size_t total = 0;
			while (ws[i]->fd >= 0 && total < EXIT_DRAIN_MAX) {
				ssize_t n = exec_pipe_read(e, ws[i]);
				if (n <= 0)
					break;
				total += (size_t)n;
			}
		}
		unsigned char b[14];
		int how, code;
		if (WIFSIGNALED(status)) {
			how = 1;
			code = WTERMSIG(status);
		} else {
			how = 0;
			code = WEXITSTATUS(status);
		}
		b[0] = (unsigned char)how;
		put_u32(b + 1, (uint32_t)code);
		b[5] = (unsigned char)(e->timed_out ? 1 : 0);
		put_u32(b + 6, (uint32_t)(dur_us >> 32));
		put_u32(b + 10, (uint32_t)dur_us);
		if (!g_quiet_execs || how || e->timed_out)
			logf_("conn=%u stream=%u pid=%d %s %d%s after %llu us", e->c->id, e->stream, (int)e->pid,
			      how ? "killed by signal" : "exited with", code, e->timed_out ? " (timed out)" : "",
			      (unsigned long long)dur_us);
		send_frame(e->c, F_EXIT, e->stream, b, sizeof b);
	} else if (e->orphaned) {
		logf_("stream=%u pid=%d (detached, connection gone) reaped: status=0x%x after %llu us", e->stream,
		      (int)e->pid, status, (unsigned long long)dur_us);
	} else {
		logf_("reaped pid=%d (stream already closed) status=0x%x", (int)e->pid, status);
	}
	exec_finish(e);
	exec_free_later(e);
}

/* The connection of a DETACHED exec is going away: the exec keeps running (and its
 * timeout keeps counting); its stdin is closed, its output is read and discarded (so it
 * never blocks on a full pipe or pty) and it is reaped as usual. */
static void exec_orphan(struct exec *e)
{
	struct conn *c = e->c;
	logf_("conn=%u stream=%u pid=%d detached: keeps running, output discarded", c->id, e->stream, (int)e->pid);
	exec_close_stdin(e);
	conn_unlink_exec(e);
	e->orphaned = 1;
	if (e->started) {
		watch_set(&e->w_out, EPOLLIN);
		watch_set(&e->w_err, EPOLLIN);
	}
}

static struct exec *exec_by_pid(pid_t pid)
{
	for (struct exec *e = g_execs; e; e = e->gnext)
		if (e->pid == pid)
			return e;
	return NULL;
}

static pid_t g_oomh_pid;
static void oom_helper_gone(pid_t pid, int status);
static void oom_wait_raised(void);

static void reap_all(void)
{
	for (;;) {
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);
		if (pid < 0 && errno == EINTR)
			continue;
		if (pid <= 0)
			return;
		struct exec *e = exec_by_pid(pid);
		if (e)
			exec_on_reaped(e, status);
		else if (pid == g_oomh_pid)
			oom_helper_gone(pid, status);
		else
			logf_("reaped orphan pid=%d status=0x%x", (int)pid, status);
	}
}

/* ---- the child side of an exec ---------------------------------------------------- */

struct exec_req {
	char **argv;
	char **envp;
	const char *cwd;
	const char *user;
	uint32_t timeout_ms;
	int want_stdin;
	int tty;            /* TTY requested: in_r is the pty slave, out_w/err_w unused */
	uint16_t rows, cols;
	int detached;
	int isolate;        /* ISOLATE: fresh pid/mount/IPC/UTS namespaces for this exec */
	uint64_t tmp_bytes, shm_bytes;
	int nscratch;
	char *scratch[ISO_MAX_SCRATCH];
	uint64_t scratch_bytes[ISO_MAX_SCRATCH];
};


static void child_report(int errfd, int stage, int err, const char *text)
{
	unsigned char b[8 + CHILD_REPORT_TEXT];
	int32_t v[2] = { stage, err };
	memcpy(b, v, 8);
	size_t n = text ? strnlen(text, CHILD_REPORT_TEXT) : 0;
	if (n)
		memcpy(b + 8, text, n);
	ssize_t w = write(errfd, b, 8 + n);
	(void)w;
}

static void child_fail(int errfd, int stage, int err)
{
	child_report(errfd, stage, err, NULL);
	_exit(127);
}

/* Read a whole small file (passwd/group). Returns NULL if it cannot be read. */
static char *slurp(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	size_t cap = 8192, len = 0;
	char *buf = malloc(cap);
	while (buf) {
		if (len + 1 >= cap) {
			if (cap >= (64u << 20))
				break; /* absurdly large: use what we have */
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap *= 2;
		}
		ssize_t n = read(fd, buf + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	if (buf)
		buf[len] = 0;
	return buf;
}

/* Split a colon-separated line in place into at most max fields; returns the count. */
static int split_fields(char *line, char **f, int max)
{
	int n = 0;
	f[n++] = line;
	for (char *p = line; *p && n < max; p++)
		if (*p == ':') {
			*p = 0;
			f[n++] = p + 1;
		}
	return n;
}

/* Parse a decimal id; returns 0 on success. Rejects empty, signs, overflow and -1. */
static int parse_id(const char *s, uint32_t *out)
{
	if (!*s)
		return -1;
	uint64_t v = 0;
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		v = v * 10 + (uint64_t)(*p - '0');
		if (v >= 0xFFFFFFFFull)
			return -1;
	}
	*out = (uint32_t)v;
	return 0;
}

struct pwent {
	int found;
	char name[256];
	char home[512];
	uint32_t uid, gid;
};

/* Look an entry up in the sandbox's /etc/passwd, by name (if name) or by uid. */
static void passwd_lookup(const char *name, uint32_t uid, struct pwent *out)
{
	out->found = 0;
	char *buf = slurp("/etc/passwd");
	if (!buf)
		return;
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *f[7];
		if (line[0] == '#' || line[0] == '+' || line[0] == '-')
			continue;
		int split_n = split_fields(line, f, 7);
		if (split_n < 4)
			continue;
		uint32_t u, g;
		if (parse_id(f[2], &u) || parse_id(f[3], &g))
			continue;
		if (name ? strcmp(f[0], name) == 0 : u == uid) {
			if (strlen(f[0]) >= sizeof out->name)
				continue;
			out->found = 1;
			strcpy(out->name, f[0]);
			out->home[0] = 0;
			if (split_n >= 6 && strlen(f[5]) < sizeof out->home)
				strcpy(out->home, f[5]);
			out->uid = u;
			out->gid = g;
			break;
		}
	}
	free(buf);
}

/* Resolve a group name to a gid via /etc/group; returns 0 if found. */
static int group_lookup(const char *name, uint32_t *gid)
{
	char *buf = slurp("/etc/group");
	int rc = -1;
	if (!buf)
		return -1;
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *f[4];
		if (line[0] == '#' || split_fields(line, f, 4) < 3)
			continue;
		uint32_t g;
		if (strcmp(f[0], name) == 0 && parse_id(f[2], &g) == 0) {
			*gid = g;
			rc = 0;
			break;
		}
	}
	free(buf);
	return rc;
}

/* Supplementary groups: primary gid first, then every /etc/group entry listing user. */
static int member_groups(const char *user, gid_t primary, gid_t *out, int max)
{
	int n = 0;
	out[n++] = primary;
	if (!user)
		return n;
	char *buf = slurp("/etc/group");
	if (!buf)
		return n;
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line && n < max; line = strtok_r(NULL, "\n", &save)) {
		char *f[4];
		if (line[0] == '#' || split_fields(line, f, 4) < 4)
			continue;
		uint32_t g;
		if (parse_id(f[2], &g))
			continue;
		char *save2 = NULL;
		for (char *m = strtok_r(f[3], ",", &save2); m; m = strtok_r(NULL, ",", &save2)) {
			if (strcmp(m, user) == 0) {
				int dup = 0;
				for (int i = 0; i < n; i++)
					if (out[i] == (gid_t)g)
						dup = 1;
				if (!dup)
					out[n++] = (gid_t)g;
				break;
			}
		}
	}
	free(buf);
	return n;
}

/* Resolve a user spec: "uid", "uid:gid", "name", "name:group" (group numeric or a
 * name) against the sandbox's /etc/passwd and /etc/group. Used by execs (in the child)
 * and by file operations (in the agent). Returns 0, ST_USER_UNKNOWN, ST_GROUP_UNKNOWN
 * (errno ENOENT) or ST_SETUP (ENOMEM). */
static int user_resolve(const char *spec, struct creds *cr)
{
	char *u = strdup(spec);
	if (!u)
		return ST_SETUP;
	char *g = strchr(u, ':');
	if (g)
		*g++ = 0;
	if (g && !*g)
		g = NULL;

	struct pwent pw;
	uint32_t uid, gid;
	if (parse_id(u, &uid) == 0) {
		passwd_lookup(NULL, uid, &pw);
	} else {
		passwd_lookup(u, 0, &pw);
		if (!pw.found) {
			free(u);
			return ST_USER_UNKNOWN;
		}
		uid = pw.uid;
	}
	if (g) {
		if (parse_id(g, &gid) != 0 && group_lookup(g, &gid) != 0) {
			free(u);
			return ST_GROUP_UNKNOWN;
		}
	} else {
		gid = pw.found ? pw.gid : uid; /* numeric user without a passwd entry: gid = uid */
	}
	free(u);
	cr->uid = uid;
	cr->gid = gid;
	strcpy(cr->home, pw.found && pw.home[0] ? pw.home : "/");
	/* Unprivileged agent (tests) asked for its own identity: nothing to switch. */
	cr->noop = geteuid() != 0 && uid == geteuid() && gid == getegid();
	cr->ngroups = member_groups(pw.found ? pw.name : NULL, (gid_t)gid, cr->groups, 256);
	return 0;
}

static struct creds g_child_cr; /* in the forked child only */

static void child_set_user(const char *spec, int errfd)
{
	int st = user_resolve(spec, &g_child_cr);
	if (st)
		child_fail(errfd, st, st == ST_SETUP ? ENOMEM : ENOENT);
	if (g_child_cr.noop)
		return;
	if (setgroups((size_t)g_child_cr.ngroups, g_child_cr.groups) < 0)
		child_fail(errfd, ST_SETGROUPS, errno);
	if (setgid((gid_t)g_child_cr.gid) < 0)
		child_fail(errfd, ST_SETGID, errno);
	if (setuid((uid_t)g_child_cr.uid) < 0)
		child_fail(errfd, ST_SETUID, errno);
}

/* In the child: the request's env, plus HOME from the user's passwd entry when the
 * request has none (as login, docker and podman do). Returns envp or a new array. */
static char **child_env_with_home(char **envp)
{
	size_t n = 0;
	for (; envp[n]; n++)
		if (strncmp(envp[n], "HOME=", 5) == 0)
			return envp;
	char **out = malloc(sizeof(char *) * (n + 2));
	char *home = malloc(strlen(g_child_cr.home) + 6);
	if (!out || !home)
		return envp;
	memcpy(out, envp, sizeof(char *) * n);
	strcpy(home, "HOME=");
	strcat(home, g_child_cr.home);
	out[n] = home;
	out[n + 1] = NULL;
	return out;
}

/* A file with no #! line: run it with /bin/sh, as execvp does. */
static void exec_script(const char *path, char **argv, char **envp)
{
	int argc = 0;
	while (argv[argc])
		argc++;
	char **nargv = malloc(sizeof(char *) * (size_t)(argc + 2));
	if (!nargv)
		return;
	nargv[0] = (char *)"/bin/sh";
	nargv[1] = (char *)path;
	for (int i = 1; i <= argc; i++)
		nargv[i + 1] = argv[i];
	execve("/bin/sh", nargv, envp);
	free(nargv);
}

/* execvpe semantics, but PATH comes from the request's env (envp), not the agent's. */
static void child_exec(char **argv, char **envp, int errfd)
{
	const char *file = argv[0];
	if (!*file)
		child_fail(errfd, ST_EXEC, ENOENT);
	if (strchr(file, '/')) {
		execve(file, argv, envp);
		int err = errno;
		if (err == ENOEXEC)
			exec_script(file, argv, envp);
		child_fail(errfd, ST_EXEC, err);
	}
	const char *path = NULL;
	for (char **e = envp; *e; e++)
		if (strncmp(*e, "PATH=", 5) == 0) {
			path = *e + 5;
			break;
		}
	if (!path)
		path = DEFAULT_PATH;
	size_t flen = strlen(file);
	char *buf = malloc(strlen(path) + flen + 3);
	if (!buf)
		child_fail(errfd, ST_SETUP, ENOMEM);
	int seen_eacces = 0, last = ENOENT;
	const char *p = path;
	for (;;) {
		const char *colon = strchr(p, ':');
		size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
		if (dlen == 0) {
			memcpy(buf, file, flen + 1); /* empty element = current directory */
		} else {
			memcpy(buf, p, dlen);
			buf[dlen] = '/';
			memcpy(buf + dlen + 1, file, flen + 1);
		}
		execve(buf, argv, envp);
		switch (errno) {
		case EACCES:
			seen_eacces = 1;
			break;
		case ENOENT:
		case ENOTDIR:
		case ESTALE:
		case ENODEV:
		case ETIMEDOUT:
		case ELOOP:
		case ENAMETOOLONG:
			break;
		case ENOEXEC:
			exec_script(buf, argv, envp);
			child_fail(errfd, ST_EXEC, ENOEXEC);
			break;
		default:
			child_fail(errfd, ST_EXEC, errno);
		}
		last = errno;
		if (!colon)
			break;
		p = colon + 1;
	}
	(void)last;
	child_fail(errfd, ST_EXEC, seen_eacces ? EACCES : ENOENT);
}

/* The first half of a forked exec child: its own session (so its process group id is
 * its pid: SIGNAL and timeouts reach the whole group) and its stdio on fds 0-2. For an
 * isolated exec this runs in the namespace init, and the command inherits both. */
static void child_stdio(const struct exec_req *r, int in_r, int out_w, int err_w, int errfd)
{
	if (setsid() < 0)
		child_fail(errfd, ST_SETUP, errno);
	if (r->tty) {
		/* The slave becomes stdin/stdout/stderr and, as the first tty this new session
		 * leader acquires explicitly, its controlling terminal. */
		if (dup2(in_r, 0) < 0 || dup2(in_r, 1) < 0 || dup2(in_r, 2) < 0)
			child_fail(errfd, ST_SETUP, errno);
		if (ioctl(0, TIOCSCTTY, 0) < 0)
			child_fail(errfd, ST_SETUP, errno);
		return;
	}
	/* Move the stdio ends into place. Every source fd is >= 3 (fds 0-2 are always open
	 * in the agent), so dup2 cannot clobber a source before it is used. */
	int src_in = in_r >= 0 ? in_r : g_devnull;
	int empty[2] = { -1, -1 };
	if (src_in < 0) { /* no /dev/null in this sandbox: an empty pipe reads as EOF */
		if (pipe(empty) < 0)
			child_fail(errfd, ST_SETUP, errno);
		close(empty[1]);
		src_in = empty[0];
	}
	if (dup2(src_in, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)
		child_fail(errfd, ST_SETUP, errno);
}

/* Default dispositions (the agent ignores SIGPIPE, and may have inherited other
 * non-default ones), then an empty mask. Only the signals found non-default at start are
 * reset (g_sig_nondefault): the agent never changes a disposition afterwards, and this
 * saves ~60 system calls per exec. */
static void child_reset_signals(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = SIG_DFL;
	for (int i = 0; i < g_nsig_nondefault; i++)
		sigaction(g_sig_nondefault[i], &sa, NULL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
}

/* A worker's second seccomp filter. runc's filter of a worker (daemon/security/seccomp.ts,
 * WORKER_AGENT_SYSCALLS) leaves mount and mount_setattr allowed, because this agent and
 * each isolated call's namespace init mount; every other denial of the default profile
 * stays in force. This filter, installed in every process the agent starts before its
 * command's execve, denies those two again with EPERM. seccomp filters stack and the
 * strictest verdict wins, so a worker's commands run under the full default profile.
 * Installing needs no privilege: runc set no_new_privs on the sandbox's init.
 * Numbers: arch/x86/entry/syscalls/syscall_64.tbl (mount 165, mount_setattr 442; x32
 * uses the same numbers with bit 30 set) and syscall_32.tbl (mount 21, mount_setattr 442).
 * Any other architecture is refused by runc's filter already and passes here. */
static int worker_filter_install(void)
{
	/* Jump offsets are relative to the next instruction. */
	enum { I386 = 7, ALLOW32 = 11, DENY = 12 };
	struct sock_filter f[] = {
		/* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		/* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, I386 - 2),
		/* 2 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		/* 3 */ BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~0x40000000u),
		/* 4 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 165, DENY - 5, 0),
		/* 5 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 442, DENY - 6, 0),
		/* 6 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		/* 7 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_I386, 0, ALLOW32 - 8),
		/* 8 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		/* 9 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 21, DENY - 10, 0),
		/* 10 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 442, DENY - 11, 0),
		/* 11 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		/* 12 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
	};
	struct sock_fprog prog = { .len = (unsigned short)(sizeof f / sizeof f[0]), .filter = f };
	return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
}

/* ---- Landlock ------------------------------------------------------------------------ */

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
/* Most --writable paths: 128, twice what a request may name (64 writable paths) plus the
 * top-level directories of any sane image. */
#define LL_MAX_WRITABLE 128

struct ll_ruleset_attr {
	uint64_t handled_access_fs; /* the first member; later ABIs append more, which the kernel zero-fills */
};
struct ll_path_beneath_attr {
	uint64_t allowed_access;
	int32_t parent_fd;
} __attribute__((packed));

static int g_landlock;             /* --landlock: restrict the sandbox's file access */
static int g_landlock_abi;         /* the kernel's Landlock ABI version, 0: none */
static char g_landlock_why[160];   /* why not, when g_landlock_abi is 0 */
static const char *g_landlock_scope = "off"; /* HELLO: "agent", "isolated_execs" or "off" */
static const char *g_writable[LL_MAX_WRITABLE]; /* --writable paths */
static int g_nwritable;

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
static void landlock_probe(void)
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
		snprintf(err, errlen, "open %s: %s%s", path, strerror(e), e == ELOOP && nofollow ? " (a writable path must not contain a symlink)" : "");
		errno = e;
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		snprintf(err, errlen, "stat %s: %s", path, strerror(e));
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
		snprintf(err, errlen, "landlock_add_rule %s: %s", path, strerror(e));
	close(fd);
	errno = e;
	return rc;
}

/* Builds the ruleset described above and restricts the calling process (and everything
 * it forks from now on). `writable`: the places with every right; those from index
 * `nofollow_from` on are --writable paths, opened without following any symlink. Returns
 * 0, or -1 with `err` naming the step. Needs g_landlock_abi > 0. */
static int landlock_apply(const char *const *writable, int nwritable, int nofollow_from, char *err, size_t errlen)
{
	uint64_t h = ll_handled(g_landlock_abi);
	const uint64_t rx = LL_FS_READ_FILE | LL_FS_READ_DIR | LL_FS_EXECUTE;
	const uint64_t rw_files = LL_FS_READ_FILE | LL_FS_WRITE_FILE;
	struct ll_ruleset_attr attr = { .handled_access_fs = h };
	int rs = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0u);
	if (rs < 0) {
		snprintf(err, errlen, "landlock_create_ruleset: %s", strerror(errno));
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
	/* Needed by landlock_restrict_self without CAP_SYS_ADMIN; runc has set it already on
	 * a sandbox's init, so this only matters for an agent run by hand (tests). */
	if (rc == 0 && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
		snprintf(err, errlen, "prctl(PR_SET_NO_NEW_PRIVS): %s", strerror(errno));
		rc = -1;
	}
	if (rc == 0 && syscall(SYS_landlock_restrict_self, rs, 0u) < 0) {
		snprintf(err, errlen, "landlock_restrict_self: %s", strerror(errno));
		rc = -1;
	}
	int e = errno;
	close(rs);
	errno = e;
	return rc;
}

/* --landlock without --worker: restrict the agent itself, once, before serving. Returns
 * -1 (logged) when the ruleset cannot be applied on a kernel that has Landlock. */
static int landlock_self_setup(void)
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

/* ---- guest confinement (microvm tier) ------------------------------------------------ */

/*
 * Inside a microVM the agent is the guest's PID 1, root with every capability, and it
 * keeps them: it mounts (the read-only paths below), runs file operations for dsecd and
 * reaps. What it starts is confined like a container sandbox's processes
 * (docs/SECURITY.md "The microvm tier: inside the guest"). With --guest-confine the agent
 * refuses every exec until dsecd has sent the confinement (vmux op CONFINE, once per
 * boot; guest_confine below), so no command ever runs unconfined.
 *
 * The CONFINE payload is text, one directive a line (dsecd: daemon/drivers/microvm/confine.ts):
 *   mkdir PATH              a writable_paths directory the image lacks (mode 0755, root)
 *   bind PATH ro|rw         a bind of PATH onto itself, read-only or read-write, in order
 *   rootro                  make the root mount read-only (after the binds)
 *   caps MASK               decimal: the capabilities commands keep (bounding, effective,
 *                           permitted, inheritable; ambient cleared)
 *   rule NR ERRNO [ARG MASK DATUM [GE]]
 *                           x86-64 syscall NR fails with ERRNO, unconditionally or when
 *                           (low 32 bits of argument ARG & MASK) == DATUM, or with GE 1
 *                           when the whole 64-bit argument >= DATUM
 *   landlock 0|1            restrict commands with Landlock on the writable places
 *   writable PATH           a writable place (Landlock: every right)
 * Every command then gets, in its forked child before execve: Landlock (when asked and the
 * guest kernel has it), the bounding set and capabilities reduced to MASK, no_new_privs,
 * and the seccomp filter built from the rules (any ABI but x86-64 kills the process:
 * i386 and x32 numbers differ and are not in the table).
 */
#define GC_MAX_RULES 512
#define GC_MAX_MOUNTS 256

struct gc_rule {
	uint32_t nr, err;
	int arg; /* -1: unconditional */
	uint32_t mask, datum;
	int ge; /* 1: the whole 64-bit argument >= datum (mask unused); 0: (low word & mask) == datum */
};

static struct {
	int required; /* --guest-confine */
	int applied;
	uint64_t caps;
	int landlock;
	int nwritable;
	char *writable[LL_MAX_WRITABLE];
	struct sock_filter *filter;
	unsigned short flen;
} g_gc;

/* The seccomp program of `rules` (see the comment above); NULL on ENOMEM or too many. */
static struct sock_filter *gc_build_filter(const struct gc_rule *rules, int n, unsigned short *len)
{
	size_t cap = 8 + (size_t)n * 8;
	if (cap > 4096)
		return NULL;
	struct sock_filter *f = calloc(cap, sizeof *f);
	if (!f)
		return NULL;
	size_t i = 0;
	f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
	f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
	f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
	f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
	f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1); /* x32 */
	f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
	for (int k = 0; k < n; k++) {
		const struct gc_rule *r = &rules[k];
		uint32_t ret = SECCOMP_RET_ERRNO | (r->err & SECCOMP_RET_DATA);
		if (r->arg < 0) {
			f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, r->nr, 0, 1);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, ret);
		} else if (r->ge) {
			/* 64-bit unsigned >= datum: any high bit set is >= it; else compare the low word. */
			f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, r->nr, 0, 7);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args) + 8u * (unsigned)r->arg + 4u);
			f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, ret);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args) + 8u * (unsigned)r->arg);
			f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, r->datum, 0, 1);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, ret);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
		} else {
			/* A is nr on entry and on every way out. Low word first: x86-64 is little-endian. */
			f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, r->nr, 0, 5);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args) + 8u * (unsigned)r->arg);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_ALU | BPF_AND | BPF_K, r->mask);
			f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, r->datum, 0, 1);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, ret);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
		}
	}
	f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
	*len = (unsigned short)i;
	return f;
}

/* The vmux op CONFINE (once per boot): applies the mounts, keeps the rest for every
 * command. Returns the Landlock ABI the commands get (0: none), or -errno; on failure no
 * exec is ever started (g_gc.applied stays 0). */
static int32_t guest_confine(const unsigned char *p, uint32_t len)
{
	if (g_gc.applied)
		return -EALREADY;
	char *text = xstrndup((const char *)p, len);
	static struct gc_rule rules[GC_MAX_RULES];
	int nrules = 0, rc = 0;
	uint64_t caps = 0;
	int have_caps = 0, landlock = 0;
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *arg = strchr(line, ' ');
		if (arg)
			*arg++ = 0;
		if (strcmp(line, "mkdir") == 0 && arg && arg[0] == '/') {
			if (mkdir(arg, 0755) < 0 && errno != EEXIST) {
				rc = -errno;
				logf_("confine: mkdir %s: %s", arg, strerror(errno));
				break;
			}
			struct stat st;
			if (lstat(arg, &st) < 0 || !S_ISDIR(st.st_mode)) {
				rc = -ENOTDIR;
				logf_("confine: %s is not a directory", arg);
				break;
			}
		} else if (strcmp(line, "bind") == 0 && arg) {
			char *mode = strrchr(arg, ' ');
			if (!mode || arg[0] != '/') {
				rc = -EINVAL;
				break;
			}
			*mode++ = 0;
			if (mount(arg, arg, NULL, MS_BIND, NULL) < 0 ||
			    (strcmp(mode, "ro") == 0 && mount(NULL, arg, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) < 0)) {
				rc = -errno;
				logf_("confine: bind %s %s: %s", arg, mode, strerror(errno));
				break;
			}
		} else if (strcmp(line, "rootro") == 0) {
			if (mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) < 0) {
				rc = -errno;
				logf_("confine: remount / read-only: %s", strerror(errno));
				break;
			}
		} else if (strcmp(line, "caps") == 0 && arg) {
			caps = strtoull(arg, NULL, 10);
			have_caps = 1;
		} else if (strcmp(line, "rule") == 0 && arg && nrules < GC_MAX_RULES) {
			struct gc_rule *r = &rules[nrules];
			unsigned long long nr, err, a, mask, datum, ge = 0;
			int k = sscanf(arg, "%llu %llu %llu %llu %llu %llu", &nr, &err, &a, &mask, &datum, &ge);
			if ((k != 2 && k != 5 && k != 6) || nr >= 0x40000000u || err > 4095 || (k >= 5 && (a > 5 || mask > 0xffffffffu || datum > 0xffffffffu)) || ge > 1) {
				rc = -EINVAL;
				break;
			}
			*r = (struct gc_rule){ .nr = (uint32_t)nr, .err = (uint32_t)err, .arg = k >= 5 ? (int)a : -1, .mask = (uint32_t)(k >= 5 ? mask : 0), .datum = (uint32_t)(k >= 5 ? datum : 0), .ge = (int)ge };
			nrules++;
		} else if (strcmp(line, "landlock") == 0 && arg) {
			landlock = strcmp(arg, "1") == 0;
		} else if (strcmp(line, "writable") == 0 && arg && arg[0] == '/' && g_gc.nwritable < LL_MAX_WRITABLE) {
			g_gc.writable[g_gc.nwritable++] = xstrndup(arg, strlen(arg));
		} else {
			rc = -EINVAL;
			logf_("confine: bad directive %s", line);
			break;
		}
	}
	free(text);
	if (rc == 0 && !have_caps)
		rc = -EINVAL;
	if (rc == 0 && !(g_gc.filter = gc_build_filter(rules, nrules, &g_gc.flen)))
		rc = -E2BIG;
	if (rc < 0)
		return rc;
	g_gc.caps = caps;
	g_gc.landlock = landlock && g_landlock_abi > 0;
	g_gc.applied = 1;
	logf_("confine: commands keep capabilities %#llx, %d seccomp rule(s), landlock %s", (unsigned long long)caps, nrules,
	      g_gc.landlock ? "on" : landlock ? "asked, but the guest kernel has none" : "off");
	return g_gc.landlock ? g_landlock_abi : 0;
}

/* In the forked child, before the user switch: Landlock, then the capability sets. */
static void gc_child_caps(int errfd)
{
	if (g_gc.landlock) {
		char err[PATH_MAX + 64];
		if (landlock_apply((const char *const *)g_gc.writable, g_gc.nwritable, 0, err, sizeof err) < 0)
			child_fail(errfd, ST_SETUP, errno ? errno : EPERM);
	}
	for (int cap = 0; cap < 64; cap++) {
		if (g_gc.caps >> cap & 1)
			continue;
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
			if (errno == EINVAL)
				break; /* past the kernel's last capability */
			child_fail(errfd, ST_SETUP, errno);
		}
	}
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
		child_fail(errfd, ST_SETUP, errno);
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d) < 0)
		child_fail(errfd, ST_SETUP, errno);
	for (int w = 0; w < 2; w++) {
		uint32_t keep = (uint32_t)(g_gc.caps >> (32 * w));
		d[w].effective &= keep;
		d[w].permitted &= keep;
		d[w].inheritable &= keep;
	}
	if (syscall(SYS_capset, &h, d) < 0)
		child_fail(errfd, ST_SETUP, errno);
}

/* In the forked child, after the user switch: no_new_privs and the seccomp filter. */
static void gc_child_filter(int errfd)
{
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		child_fail(errfd, ST_SETUP, errno);
	struct sock_fprog prog = { .len = g_gc.flen, .filter = g_gc.filter };
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0)
		child_fail(errfd, ST_SETUP, errno);
}

/* The second half: working directory, user, limits, fds, execve. */
static void __attribute__((noreturn)) child_run(const struct exec_req *r, int errfd)
{
	oom_wait_raised();
	child_reset_signals();
	if (chdir(r->cwd) < 0)
		child_fail(errfd, ST_CHDIR, errno);
	if (g_gc.applied)
		gc_child_caps(errfd);
	child_set_user(r->user, errfd);

	/* The agent's raised fd limit is not the sandbox's business. */
	setrlimit(RLIMIT_NOFILE, &g_orig_nofile);
	/* Everything the agent owns is already CLOEXEC; make sure nothing else leaks.
	 * errfd must survive until execve, and CLOEXEC closes it exactly then. */
	cloexec_from(3);
	if (g_worker_filter && worker_filter_install() < 0)
		child_fail(errfd, ST_SETUP, errno);
	if (g_gc.applied)
		gc_child_filter(errfd);
	child_exec(r->argv, child_env_with_home(r->envp), errfd);
	_exit(127);
}

static void __attribute__((noreturn))
child_main(const struct exec_req *r, int in_r, int out_w, int err_w, int errfd)
{
	child_stdio(r, in_r, out_w, err_w, errfd);
	child_run(r, errfd);
}

/*
 * Every command starts at oom_score_adj EXEC_OOM_SCORE_ADJ (or the agent's own value if
 * that is higher); the agent stays where dsecd started it (normally 0). A memory
 * cgroup's OOM kill takes the process with the largest badness, RSS + adj/1000 x the
 * cgroup's limit. When the charge is in no process's RSS (tmpfs or memfd pages), or a
 * second OOM comes while the first victim's memory is still being freed, the agent
 * (about 1 MiB resident, more than `head` or `sh`) was the next choice at equal adj and
 * the whole sandbox failed (seen in CI: dmesg showed `sh`, then `.dsec-agent` killed).
 * At +500 a command outranks any agent smaller than half the cgroup's limit.
 *
 * How: right after each fork the child's value is raised, and the child waits, at most
 * OOM_RAISE_WAIT_MS, until its own value reads raised (reading /proc/self is allowed)
 * before it execs, so every command starts raised; the agent's own value never changes.
 * An agent that does not restrict itself with Landlock (an fncall worker, where each
 * isolated call is restricted instead; --landlock off; a kernel without it) writes the
 * child's /proc/<pid>/oom_score_adj itself. A Landlocked one cannot: Landlock denies it
 * writes under /proc, as it does every command it starts. Raising the agent's own value around fork() (children copy it) left the agent
 * at +500 for the length of each fork, and a fork while an earlier command's orphan kept
 * the cgroup at its limit made the fork's own allocation kill the agent (seen in CI:
 * `.dsec-agent invoked oom-killer ... oom_score_adj=500`, then the agent killed). So a
 * helper process does it: forked once at start, before Landlock (oom_helper_start), it
 * reads child pids from a socketpair only the agent holds and raises each one's value
 * (raising needs no privilege); after each fork the agent sends it the child's pid. It
 * is one more process in the sandbox (~100 KiB of its own). A command may lower itself back to the agent's value (not below:
 * the kernel's oom_score_adj_min), or kill the helper (same uid; it is not dumpable, so
 * it cannot be ptraced), which only hurts its own sandbox: from then on commands start
 * at the agent's value, as they do when the helper could not be started. On the host the
 * same value puts sandbox commands ahead of host daemons in a global OOM, the order an
 * operator wants. Without /proc at start (a guest before its mounts) nothing changes.
 */
#define EXEC_OOM_SCORE_ADJ 500
/* How long a child waits for the helper to raise it before it execs anyway: 1 s. The
 * helper takes ~0.1 ms on an idle host, but it is one more runnable process in the
 * sandbox's cgroup, and on a loaded host (two test files running beside each other on 2
 * cores) it was seen to need more than 20 ms. The wait ends as soon as the value reads
 * raised; the bound is only paid in full when the helper died and the agent has not yet
 * reaped it (from then on no child waits). */
#define OOM_RAISE_WAIT_MS 1000
static int g_oom_enabled;   /* commands are to start raised (the agent's value is lower) */
static int g_oom_direct;    /* the agent is not Landlocked: it writes each child's value itself */
static int g_oomh_fd = -1;  /* the agent's end of the socketpair to the helper, or -1 */
/* g_oomh_pid (declared above reap_all): the helper's pid, 0 when none */
static int g_oom_child_wait; /* set in a child forked while the helper was up */

/* Reads this process's oom_score_adj into *v. Returns 0, or -1 when /proc cannot tell (not mounted). */
static int own_oom_adj(int *v)
{
	int fd = open("/proc/self/oom_score_adj", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	char buf[16] = { 0 };
	ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
	close(fd);
	if (n <= 0)
		return -1;
	*v = atoi(buf);
	return 0;
}

/* At start: the agent's own value decides whether commands are raised at all. */
static void oom_adj_open(void)
{
	int v;
	if (own_oom_adj(&v) == 0)
		g_oom_enabled = v < EXEC_OOM_SCORE_ADJ; /* else commands inherit a value already as high */
}

/* The helper: raise every pid read from fd 3 to EXEC_OOM_SCORE_ADJ, until the agent is gone. */
static void __attribute__((noreturn)) oom_helper_main(void)
{
	char v[16];
	int vlen = snprintf(v, sizeof v, "%d", EXEC_OOM_SCORE_ADJ);
	for (;;) {
		int32_t pid;
		ssize_t n = read(3, &pid, sizeof pid);
		if (n < 0 && errno == EINTR)
			continue;
		if (n != (ssize_t)sizeof pid)
			_exit(0); /* the agent closed its end */
		if (pid <= 0)
			continue;
		char path[48];
		snprintf(path, sizeof path, "/proc/%d/oom_score_adj", (int)pid);
		int fd = open(path, O_WRONLY | O_CLOEXEC);
		if (fd < 0)
			continue; /* it exited already */
		if (write(fd, v, (size_t)vlen) < 0) { /* raced its exit: nothing to do */ }
		close(fd);
	}
}

/* At start, before Landlock and before serving. An agent that will not restrict itself
 * with Landlock (an fncall worker, --landlock off, a kernel without it) writes each
 * child's value itself; only a Landlocked one needs the helper (see above). */
static void oom_helper_start(int agent_landlocked)
{
	if (!g_oom_enabled)
		return;
	if (!agent_landlocked) {
		g_oom_direct = 1;
		return;
	}
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		logf_("oom_score_adj helper: socketpair: %s; commands start at the agent's value", strerror(errno));
		return;
	}
	pid_t agent = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		logf_("oom_score_adj helper: fork: %s; commands start at the agent's value", strerror(errno));
		close(sv[0]);
		close(sv[1]);
		return;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
		if (getppid() != agent)
			_exit(0);
		prctl(PR_SET_NAME, "dsec-oom-adj", 0, 0, 0);
		prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
		/* Only its socket (as fd 3) and the agent's log (stderr) stay open. */
		if (dup2(sv[1], 3) < 0)
			_exit(1);
		syscall(SYS_close_range, 4u, ~0u, 0u);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		oom_helper_main();
	}
	close(sv[1]);
	set_nonblock(sv[0]);
	g_oomh_fd = sv[0];
	g_oomh_pid = pid;
}

/* In the agent, right after fork(): raise `child`, or ask the helper to. */
static void oom_raise_child(pid_t child)
{
	if (g_oom_direct) {
		char path[48], v[16];
		snprintf(path, sizeof path, "/proc/%d/oom_score_adj", (int)child);
		int vlen = snprintf(v, sizeof v, "%d", EXEC_OOM_SCORE_ADJ);
		int fd = open(path, O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, v, (size_t)vlen) < 0) {
			logf_("oom_score_adj: %s: %s; commands start at the agent's value from now on", path, strerror(errno));
			g_oom_direct = 0;
		}
		if (fd >= 0)
			close(fd);
		return;
	}
	if (g_oomh_fd < 0)
		return;
	int32_t p = (int32_t)child;
	if (send(g_oomh_fd, &p, sizeof p, MSG_NOSIGNAL) != (ssize_t)sizeof p && errno != EAGAIN) {
		logf_("oom_score_adj helper: send: %s; commands start at the agent's value from now on", strerror(errno));
		close(g_oomh_fd);
		g_oomh_fd = -1;
	}
}

/* The helper was reaped: stop using it. */
static void oom_helper_gone(pid_t pid, int status)
{
	if (pid != g_oomh_pid || !g_oomh_pid)
		return;
	logf_("oom_score_adj helper pid=%d exited (status 0x%x); commands start at the agent's value from now on", (int)pid, status);
	if (g_oomh_fd >= 0)
		close(g_oomh_fd);
	g_oomh_fd = -1;
	g_oomh_pid = 0;
}

/* In a child, before it execs (or forks its command): wait until the helper raised it. */
static void oom_wait_raised(void)
{
	if (!g_oom_child_wait)
		return;
	g_oom_child_wait = 0; /* once per child (an isolated call's command inherits it) */
	uint64_t until = mono_ns() + (uint64_t)OOM_RAISE_WAIT_MS * 1000000ull;
	for (int i = 0;; i++) {
		int v;
		if (own_oom_adj(&v) < 0 || v >= EXEC_OOM_SCORE_ADJ || mono_ns() >= until)
			return;
		if (i < 8) {
			sched_yield();
		} else {
			struct timespec ts = { 0, 50000 };
			nanosleep(&ts, NULL);
		}
	}
}

/* ---- isolated execs: the namespace init --------------------------------------------- */

/*
 * An isolated exec (EXEC ISOLATE, docs/AGENT_PROTOCOL.md "Isolated execs") runs in fresh
 * pid, mount, IPC and UTS namespaces, so nothing it does survives it:
 *
 *   agent --clone(NEWPID|NEWNS|NEWIPC|NEWUTS)--> namespace init (pid 1 of the call)
 *                                                   --fork--> the command (pid 2)
 *
 * The init makes every mount private and read-only (one recursive mount_setattr), mounts
 * fresh tmpfs on /tmp, /dev/shm and the SCRATCH paths, a fresh mqueue on /dev/mqueue (the
 * new IPC namespace's), a fresh /proc for the new pid namespace with the sandbox's /proc
 * masks re-created on it, applies Landlock (--landlock), drops CAP_SYS_ADMIN, forks the command, reaps whatever gets
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

/* Capability sets of this thread (v3: two 32-bit words). */
static int caps_get(struct __user_cap_data_struct d[2])
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	return (int)syscall(SYS_capget, &h, d);
}

static int caps_set(struct __user_cap_data_struct d[2])
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	return (int)syscall(SYS_capset, &h, d);
}

/* Remove one capability from this thread's effective, permitted and inheritable sets. */
static int caps_drop(int cap)
{
	struct __user_cap_data_struct d[2];
	if (caps_get(d) < 0)
		return -1;
	uint32_t bit = 1u << (cap & 31);
	int w = cap >> 5;
	if (!((d[w].effective | d[w].permitted | d[w].inheritable) & bit))
		return 0;
	d[w].effective &= ~bit;
	d[w].permitted &= ~bit;
	d[w].inheritable &= ~bit;
	return caps_set(d);
}

static int caps_has_effective(int cap)
{
	struct __user_cap_data_struct d[2];
	if (caps_get(d) < 0)
		return 0;
	return (d[cap >> 5].effective >> (cap & 31)) & 1;
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
 * below another fresh tmpfs since everything else is read-only by then. */
static void iso_tmpfs(int errfd, const char *path, uint64_t bytes, unsigned long flags, int optional)
{
	char opts[64];
	snprintf(opts, sizeof opts, "size=%llu,mode=1777", (unsigned long long)bytes);
	if (mount("tmpfs", path, "tmpfs", flags, opts) == 0)
		return;
	if (errno == ENOENT && optional)
		return;
	if (errno == ENOENT) {
		if (mkdir_parents(path) < 0)
			iso_fail(errfd, errno, "mkdir %s", path);
		if (mount("tmpfs", path, "tmpfs", flags, opts) == 0)
			return;
	}
	iso_fail(errfd, errno, "mount tmpfs on %s", path);
}

static void iso_setup(const struct exec_req *r, int errfd)
{
	/* 1. Nothing propagates into or out of this mount namespace. */
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		iso_fail(errfd, errno, "make mounts private");
	/* 2. Every inherited mount read-only: the image, /dev (a tmpfs), /dev/pts, ...; device
	 *    nodes stay usable (a read-only mount only refuses changes to the filesystem). */
	struct mount_attr_ ma = { .attr_set = MOUNT_ATTR_RDONLY_ };
	if (syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE, &ma, sizeof ma) < 0)
		iso_fail(errfd, errno, "make mounts read-only");
	/* 3. Fresh writable places. */
	iso_tmpfs(errfd, "/tmp", r->tmp_bytes, MS_NOSUID | MS_NODEV, 1);
	iso_tmpfs(errfd, "/dev/shm", r->shm_bytes, MS_NOSUID | MS_NODEV | MS_NOEXEC, 1);
	/* The new IPC namespace's POSIX message queues (the old mount shows the sandbox's). */
	if (mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0 && errno != ENOENT &&
	    errno != ENODEV)
		iso_fail(errfd, errno, "mount mqueue on /dev/mqueue");
	/* 4. /proc of the new pid namespace, with the sandbox's masks re-created on it. */
	if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
		iso_fail(errfd, errno, "mount proc on /proc");
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
	/* 5. Scratch directories, in request order (one may lie below another). */
	for (int i = 0; i < r->nscratch; i++)
		iso_tmpfs(errfd, r->scratch[i], r->scratch_bytes[i], MS_NOSUID | MS_NODEV, 0);
	/* 6. Landlock (--landlock): after the mounts, since a Landlock domain forbids mount(2).
	 *    The call's writable places are its fresh tmpfs mounts (/tmp when the image has
	 *    it, the SCRATCH paths; /dev/shm is in every ruleset) and any --writable path. */
	if (g_landlock && g_landlock_abi) {
		const char *w[1 + ISO_MAX_SCRATCH + LL_MAX_WRITABLE];
		int nw = 0;
		if (access("/tmp", F_OK) == 0)
			w[nw++] = "/tmp";
		for (int i = 0; i < r->nscratch; i++)
			w[nw++] = r->scratch[i];
		int from = nw;
		for (int i = 0; i < g_nwritable; i++)
			w[nw++] = g_writable[i];
		char err[PATH_MAX + 64];
		if (landlock_apply(w, nw, from, err, sizeof err) < 0)
			iso_fail(errfd, errno, "landlock: %s", err);
	}
	/* 7. Done with CAP_SYS_ADMIN. */
	if (caps_drop(CAP_SYS_ADMIN) < 0)
		iso_fail(errfd, errno, "drop CAP_SYS_ADMIN");
}

static void __attribute__((noreturn))
ns_init_main(const struct exec_req *r, int in_r, int out_w, int err_w, int errfd, int statusfd)
{
	/* If the agent goes away (a non-PID-1 agent killed), so does the call. */
	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	child_stdio(r, in_r, out_w, err_w, errfd);
	child_reset_signals();
	/* This process lives as long as the call: it must not keep copies of the agent's
	 * sockets and pipes (another exec's stdin would never see EOF). */
	close_all_but(errfd, statusfd);
	iso_setup(r, errfd);
	/* The helper raises this init (the pid the agent saw); the command inherits it. */
	oom_wait_raised();
	pid_t cmd = vfork();
	if (cmd < 0)
		iso_fail(errfd, errno, "fork");
	if (cmd == 0) {
		close(statusfd);
		child_run(r, errfd);
	}
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

/* fork() into fresh pid, mount, IPC and UTS namespaces: a raw clone without a new stack
 * behaves like fork (the agent is single-threaded, so this is safe). The child is pid 1
 * of its pid namespace. */
static pid_t clone_isolated(void)
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
static void isolate_probe(void)
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

/* ---- exec start ------------------------------------------------------------------- */

static struct exec *conn_find_exec(struct conn *c, uint32_t stream)
{
	for (struct exec *e = c->execs; e; e = e->cnext)
		if (e->stream == stream)
			return e;
	return NULL;
}

static int pipe_cloexec(int p[2])
{
	return pipe2(p, O_CLOEXEC);
}

static void close_pair(int p[2])
{
	if (p[0] >= 0)
		close(p[0]);
	if (p[1] >= 0)
		close(p[1]);
	p[0] = p[1] = -1;
}

/* Open a pty master through one ptmx path and unlock it; -1 with errno on failure. */
static int pty_master(const char *ptmx)
{
	int m = open(ptmx, O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (m < 0)
		return -1;
	if (grantpt(m) < 0 || unlockpt(m) < 0) { /* e.g. not a ptmx at all (ENOTTY) */
		int err = errno;
		close(m);
		errno = err;
		return -1;
	}
	return m;
}

/* Allocate a pseudo-terminal inside the sandbox: the master via /dev/ptmx (what
 * posix_openpt opens) or, if that fails at any step (missing, not a ptmx, or bound to
 * another devpts instance), via /dev/pts/ptmx of the sandbox's own devpts (newinstance,
 * ptmxmode=0666). The slave is opened with TIOCGPTPEER (no path lookup, always the
 * master's devpts instance), or by ptsname on kernels before 4.13. Both O_NOCTTY: the
 * agent itself must never acquire a controlling terminal. Returns 0 or -1 with errno. */
static int pty_open(int *master, int *slave, uint16_t rows, uint16_t cols)
{
	int m = pty_master("/dev/ptmx");
	if (m < 0) {
		int e1 = errno;
		m = pty_master("/dev/pts/ptmx");
		if (m < 0) {
			if (errno == ENOENT)
				errno = e1;
			return -1;
		}
	}
	int s = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (s < 0) {
		char name[128];
		if (ptsname_r(m, name, sizeof name) != 0)
			goto fail;
		s = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (s < 0)
			goto fail;
	}
	struct winsize ws = { .ws_row = rows, .ws_col = cols };
	if (ioctl(m, TIOCSWINSZ, &ws) < 0)
		goto fail;
	*master = m;
	*slave = s;
	return 0;
fail:;
	int err = errno;
	if (s >= 0)
		close(s);
	close(m);
	errno = err;
	return -1;
}

static struct fop *conn_find_fop(struct conn *c, uint32_t stream)
{
	for (struct fop *f = c->fops; f; f = f->next)
		if (f->stream == stream)
			return f;
	return NULL;
}

/* A new stream (EXEC or a file request) must not reuse a live stream id: answers ERROR and
 * returns 1 if it does. */
static int stream_in_use(struct conn *c, uint32_t stream)
{
	if (!conn_find_exec(c, stream) && !conn_find_fop(c, stream))
		return 0;
	send_error(c, stream, "stream %u is already in use", stream);
	return 1;
}

/* In handle_exec: if bad, answer ERROR "malformed EXEC: <what>" on the stream. Returns bad. */
static int exec_malformed(struct conn *c, uint32_t stream, int bad, const char *what)
{
	if (bad)
		send_error(c, stream, "malformed EXEC: %s", what);
	return bad;
}

static void handle_exec(struct conn *c, uint32_t stream, const unsigned char *p, size_t len)
{
	if (stream_in_use(c, stream))
		return;
	/* Pass 1: validate and size. */
	size_t nargv = 0, nenv = 0, strbytes = 0;
	const unsigned char *cwd = NULL, *user = NULL;
	size_t cwd_len = 0, user_len = 0;
	struct exec_req r = { 0 };
	const char *scratch_src[ISO_MAX_SCRATCH];
	size_t scratch_len[ISO_MAX_SCRATCH];
	r.cwd = "/";
	r.user = "0";
	size_t off = 0;
	struct tlv t;
	enum tlv_result rc;
	while ((rc = tlv_next(p, len, &off, &t)) != TLV_END) {
		if (rc == TLV_TRUNCATED) {
			send_error(c, stream, "malformed EXEC: truncated field header at offset %zu", off);
			return;
		}
		if (rc == TLV_OVERRUN) {
			send_error(c, stream, "malformed EXEC: field %u overruns the payload", t.tag);
			return;
		}
		unsigned tag = t.tag;
		uint32_t flen = t.len;
		const unsigned char *v = t.v;
		switch (tag) {
		case T_ARGV:
		case T_ENV:
		case T_CWD:
		case T_USER:
			if (memchr(v, 0, flen)) {
				send_error(c, stream, "malformed EXEC: field %u contains a NUL byte", tag);
				return;
			}
			break;
		default:
			break;
		}
		switch (tag) {
		case T_ARGV:
			nargv++;
			strbytes += flen + 1;
			break;
		case T_ENV:
			if (exec_malformed(c, stream, !memchr(v, '=', flen), "ENV entry without '='"))
				return;
			nenv++;
			strbytes += flen + 1;
			break;
		case T_CWD:
			if (exec_malformed(c, stream, flen == 0, "empty CWD"))
				return;
			cwd = v;
			cwd_len = flen;
			break;
		case T_USER:
			if (exec_malformed(c, stream, flen == 0, "empty USER"))
				return;
			user = v;
			user_len = flen;
			break;
		case T_TIMEOUT_MS:
			if (exec_malformed(c, stream, flen != 4, "TIMEOUT_MS must be 4 bytes"))
				return;
			r.timeout_ms = get_u32(v);
			break;
		case T_STDIN:
			if (exec_malformed(c, stream, flen != 1, "STDIN must be 1 byte"))
				return;
			r.want_stdin = v[0] != 0;
			break;
		case T_TTY:
			if (exec_malformed(c, stream, flen != 4, "TTY must be 4 bytes (u16 rows, u16 cols)"))
				return;
			r.tty = 1;
			r.rows = (uint16_t)((v[0] << 8) | v[1]);
			r.cols = (uint16_t)((v[2] << 8) | v[3]);
			break;
		case T_DETACHED:
			if (exec_malformed(c, stream, flen != 1, "DETACHED must be 1 byte"))
				return;
			r.detached = v[0] != 0;
			break;
		case T_ISOLATE:
			if (exec_malformed(c, stream, flen != 16, "ISOLATE must be 16 bytes (u64 tmp bytes, u64 shm bytes)"))
				return;
			r.isolate = 1;
			r.tmp_bytes = get_u64(v);
			r.shm_bytes = get_u64(v + 8);
			break;
		case T_SCRATCH: {
			const char *sp = (const char *)v + 8;
			size_t sl = flen >= 8 ? flen - 8 : 0;
			if (exec_malformed(c, stream, flen < 10 || get_u64(v) == 0,
					   "SCRATCH must be a u64 size > 0 and an absolute path") ||
			    exec_malformed(c, stream, r.nscratch == ISO_MAX_SCRATCH, "more than 8 SCRATCH fields") ||
			    exec_malformed(c, stream, sp[0] != '/' || memchr(sp, 0, sl) || sl >= PATH_MAX,
					   "SCRATCH path must be absolute, without NUL, shorter than PATH_MAX"))
				return;
			int dotdot = 0;
			for (size_t k = 0; k + 1 < sl; k++)
				if (sp[k] == '/' && sp[k + 1] == '.' && k + 2 < sl && sp[k + 2] == '.' &&
				    (k + 3 == sl || sp[k + 3] == '/'))
					dotdot = 1;
			int root_only = 1;
			for (size_t k = 0; k < sl; k++)
				if (sp[k] != '/')
					root_only = 0;
			if (exec_malformed(c, stream, dotdot || root_only, "SCRATCH path must not be / or contain '..'"))
				return;
			scratch_src[r.nscratch] = sp;
			scratch_len[r.nscratch] = sl;
			r.scratch_bytes[r.nscratch++] = get_u64(v);
			break;
		}
		default:
			break; /* unknown tags are ignored (forward compatibility) */
		}
	}
	if (exec_malformed(c, stream, nargv == 0, "at least one ARGV field is required") ||
	    exec_malformed(c, stream, r.nscratch && !r.isolate, "SCRATCH needs ISOLATE"))
		return;
	if (g_gc.required && !g_gc.applied) {
		static const char msg[] = "guest: the confinement of commands is not applied yet (dsecd sends it at boot); no exec runs unconfined";
		logf_("conn=%u stream=%u %s", c->id, stream, msg);
		send_errno_frame(c, F_EXEC_ERROR, stream, EAGAIN, msg, sizeof msg - 1);
		return;
	}
	if (r.isolate && !g_isolate) {
		char msg[256];
		snprintf(msg, sizeof msg, "isolate: unavailable in this sandbox: %s", g_isolate_why);
		logf_("conn=%u stream=%u %s", c->id, stream, msg);
		send_errno_frame(c, F_EXEC_ERROR, stream, ENOTSUP, msg, strlen(msg));
		return;
	}
	for (int i = 0; i < r.nscratch; i++)
		r.scratch[i] = xstrndup(scratch_src[i], scratch_len[i]);
	if (r.isolate && !r.tmp_bytes)
		r.tmp_bytes = ISO_DEFAULT_TMPFS_BYTES;
	if (r.isolate && !r.shm_bytes)
		r.shm_bytes = ISO_DEFAULT_TMPFS_BYTES;

	/* Pass 2: build argv/envp in one block (freed right after fork; the child has a copy).
	 * envp has room for TERM=xterm, added for a TTY exec whose ENV has no TERM. */
	char **argv = xmalloc(sizeof(char *) * (nargv + 1));
	char **envp = xmalloc(sizeof(char *) * (nenv + 2));
	char *strs = xmalloc(strbytes);
	size_t ai = 0, ei = 0, so = 0;
	for (off = 0; tlv_next(p, len, &off, &t) == TLV_FIELD;) {
		if (t.tag != T_ARGV && t.tag != T_ENV)
			continue;
		memcpy(strs + so, t.v, t.len);
		strs[so + t.len] = 0;
		if (t.tag == T_ARGV)
			argv[ai++] = strs + so;
		else
			envp[ei++] = strs + so;
		so += t.len + 1;
	}
	if (r.tty) {
		int has_term = 0;
		for (size_t i = 0; i < ei; i++)
			if (strncmp(envp[i], "TERM=", 5) == 0)
				has_term = 1;
		if (!has_term)
			envp[ei++] = (char *)"TERM=xterm";
	}
	argv[ai] = NULL;
	envp[ei] = NULL;
	r.argv = argv;
	r.envp = envp;

	struct exec *e = xmalloc(sizeof *e);
	memset(e, 0, sizeof *e);
	e->w_out.fd = e->w_err.fd = e->w_in.fd = e->w_start.fd = -1;
	e->status_fd = -1;
	e->stream = stream;
	e->argv0 = xstrndup(argv[0], strlen(argv[0]));
	e->cwd = cwd ? xstrndup((const char *)cwd, cwd_len) : xstrndup("/", 1);
	e->user = user ? xstrndup((const char *)user, user_len) : xstrndup("0", 1);
	r.cwd = e->cwd;
	r.user = e->user;

	int in_p[2] = { -1, -1 }, out_p[2] = { -1, -1 }, err_p[2] = { -1, -1 }, st_p[2] = { -1, -1 };
	int stat_p[2] = { -1, -1 }; /* isolated: the namespace init's status report */
	int err = 0;
	if (r.tty) {
		/* in_p[0] = slave (the child's stdio), out_p[0] = master (read: output),
		 * in_p[1] = a dup of the master (written: STDIN frames), so reading and writing
		 * have their own epoll registrations. O_NONBLOCK is shared by both master fds. */
		if (pty_open(&out_p[0], &in_p[0], r.rows, r.cols) < 0 ||
		    (in_p[1] = fcntl(out_p[0], F_DUPFD_CLOEXEC, 3)) < 0 || pipe_cloexec(st_p) < 0)
			err = errno;
		if (!err && (set_nonblock(out_p[0]) < 0 || set_nonblock(st_p[0]) < 0))
			err = errno;
	} else {
		if ((r.want_stdin && pipe_cloexec(in_p) < 0) || pipe_cloexec(out_p) < 0 || pipe_cloexec(err_p) < 0 ||
		    pipe_cloexec(st_p) < 0)
			err = errno;
		if (!err && ((in_p[1] >= 0 && set_nonblock(in_p[1]) < 0) || set_nonblock(out_p[0]) < 0 ||
			     set_nonblock(err_p[0]) < 0 || set_nonblock(st_p[0]) < 0))
			err = errno;
	}
	if (!err && r.isolate && (pipe_cloexec(stat_p) < 0 || set_nonblock(stat_p[0]) < 0))
		err = errno;
	pid_t pid = -1;
	int clone_failed = 0;
	if (!err) {
		e->t0_ns = mono_ns();
		g_oom_child_wait = g_oomh_fd >= 0 || g_oom_direct;
		pid = r.isolate ? clone_isolated() : fork();
		if (pid > 0)
			oom_raise_child(pid);
		if (pid < 0) {
			err = errno;
			clone_failed = r.isolate;
		}
	}
	if (pid == 0) {
		close(st_p[0]);
		if (r.isolate) {
			close(stat_p[0]);
			ns_init_main(&r, in_p[0], out_p[1], err_p[1], st_p[1], stat_p[1]);
		}
		child_main(&r, in_p[0], out_p[1], err_p[1], st_p[1]);
	}
	free(argv);
	free(envp);
	free(strs);
	for (int i = 0; i < r.nscratch; i++)
		free(r.scratch[i]);
	if (err) {
		close_pair(in_p);
		close_pair(out_p);
		close_pair(err_p);
		close_pair(st_p);
		close_pair(stat_p);
		char msg[256];
		snprintf(msg, sizeof msg, clone_failed ? "isolate: clone: %s" : "spawn: %s", strerror(err));
		logf_("conn=%u stream=%u %s", c->id, stream, msg);
		send_errno_frame(c, F_EXEC_ERROR, stream, err, msg, strlen(msg));
		free(e->argv0);
		free(e->cwd);
		free(e->user);
		free(e);
		return;
	}
	close(in_p[0]);
	if (out_p[1] >= 0)
		close(out_p[1]);
	if (err_p[1] >= 0)
		close(err_p[1]);
	close(st_p[1]);
	if (r.isolate) {
		close(stat_p[1]);
		e->status_fd = stat_p[0];
		e->isolated = 1;
	}
	e->pid = pid;
	e->is_tty = r.tty;
	e->detached = r.detached;
	e->c = c;
	DL_PUSH(c->execs, e, cnext, cprev);
	DL_PUSH(g_execs, e, gnext, gprev);
	if (r.timeout_ms) {
		e->deadline_ns = e->t0_ns + (uint64_t)r.timeout_ms * 1000000ull;
		g_deadlines++;
	}
	/* stdout/stderr are registered but not read until the child has exec'd (STARTED
	 * must come first); stdin gets EPOLLOUT only while data is queued. */
	if (watch_add(&e->w_out, W_STDOUT, out_p[0], e, 0) < 0 ||
	    (err_p[0] >= 0 && watch_add(&e->w_err, W_STDERR, err_p[0], e, 0) < 0) ||
	    watch_add(&e->w_start, W_STARTPIPE, st_p[0], e, EPOLLIN) < 0 ||
	    (in_p[1] >= 0 && watch_add(&e->w_in, W_STDIN, in_p[1], e, 0) < 0))
		logf_("epoll_ctl ADD for stream %u: %s", stream, strerror(errno));
	if (in_p[1] >= 0)
		e->w_in.fd = in_p[1];
	char ttyd[32] = "none";
	if (r.tty)
		snprintf(ttyd, sizeof ttyd, "%ux%u", r.rows, r.cols);
	if (!g_quiet_execs)
		logf_("conn=%u stream=%u pid=%d exec %s cwd=%s user=%s timeout_ms=%u stdin=%d tty=%s detached=%d isolate=%d",
		      c->id, stream, (int)pid, e->argv0, e->cwd, e->user, r.timeout_ms, r.want_stdin, ttyd, r.detached,
		      r.isolate);
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

struct dirent64_ {
	uint64_t ino;
	int64_t off;
	unsigned short reclen;
	unsigned char type;
	char name[];
};

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
static void fop_free(struct fop *f)
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
static int file_jobs_runnable(void)
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
static void run_file_jobs(void)
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

static void handle_file_request(struct conn *c, unsigned type, uint32_t stream, const unsigned char *p, size_t len)
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
static void handle_file_stream_frame(struct conn *c, struct fop *f, unsigned type, const unsigned char *p, size_t len)
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

/* ---- inbound frames --------------------------------------------------------------- */

/* A frame that belongs to a stream is a fatal protocol error on stream 0 (the control
 * stream). Returns 1 if it came on stream 0. */
static int on_control_stream(struct conn *c, unsigned type, uint32_t stream)
{
	if (stream != 0)
		return 0;
	conn_fatal(c, "frame type %u on stream 0", type);
	return 1;
}

static void handle_frame(struct conn *c, unsigned type, uint32_t stream, const unsigned char *p, size_t len)
{
	if (!c->helloed) {
		if (type != F_HELLO || stream != 0) {
			conn_fatal(c, "expected HELLO on stream 0 as the first frame, got type %u on stream %u", type, stream);
			return;
		}
		if (len < 4) {
			conn_fatal(c, "malformed HELLO: payload must start with a u32 protocol version");
			return;
		}
		uint32_t v = get_u32(p);
		if (v != PROTOCOL_VERSION) {
			conn_fatal(c, "unsupported protocol version %u (this agent speaks %u)", v, PROTOCOL_VERSION);
			return;
		}
		c->helloed = 1;
		char json[640];
		int enforced = strcmp(g_landlock_scope, "off") != 0;
		const char *why = enforced ? "" : !g_landlock ? "not requested (the agent runs without --landlock)" : g_landlock_why;
		int n = snprintf(json, sizeof json,
				 "{\"agent\":\"" AGENT_NAME "\",\"version\":\"" AGENT_VERSION "\",\"protocol\":%u,\"pid\":%d,"
				 "\"features\":[\"tty\",\"detached\",\"files\"%s],"
				 "\"landlock\":{\"enforced\":%s,\"abi\":%d,\"scope\":\"%s\",\"writable\":%d,\"reason\":\"%s\"}}",
				 PROTOCOL_VERSION, (int)getpid(), g_isolate ? ",\"isolate\"" : "", enforced ? "true" : "false",
				 g_landlock_abi, g_landlock_scope, g_nwritable, why);
		if (n < 0 || (size_t)n >= sizeof json)
			n = (int)strlen(json);
		unsigned char b[4];
		put_u32(b, PROTOCOL_VERSION);
		send_frame2(c, F_HELLO, 0, b, 4, json, (size_t)n);
		logf_("conn=%u hello protocol=%u", c->id, v);
		return;
	}
	switch (type) {
	case F_HELLO:
		conn_fatal(c, "HELLO after the handshake");
		return;
	case F_PING:
		if (stream != 0) {
			send_error(c, stream, "PING is only valid on stream 0");
			return;
		}
		send_frame(c, F_PONG, 0, p, len);
		return;
	case F_EXEC:
		if (stream == 0) {
			conn_fatal(c, "EXEC on stream 0");
			return;
		}
		handle_exec(c, stream, p, len);
		return;
	case F_FILE_READ:
	case F_FILE_WRITE:
	case F_FILE_STAT:
	case F_FILE_LIST:
	case F_FILE_MKDIR:
	case F_FILE_REMOVE:
	case F_FILE_SYMLINK:
		if (on_control_stream(c, type, stream) || stream_in_use(c, stream))
			return;
		handle_file_request(c, type, stream, p, len);
		return;
	case F_FILE_DATA:
	case F_FILE_DONE:
	case F_FILE_ERROR: {
		if (on_control_stream(c, type, stream))
			return;
		struct fop *f = conn_find_fop(c, stream);
		if (f)
			handle_file_stream_frame(c, f, type, p, len);
		else if (conn_find_exec(c, stream))
			send_error(c, stream, "frame type %u is not valid on an exec stream", type);
		/* else: the file stream already ended (race with its final frame): drop */
		return;
	}
	case F_RESIZE:
	case F_STDIN:
	case F_STDIN_EOF:
	case F_SIGNAL: {
		if (on_control_stream(c, type, stream))
			return;
		struct exec *e = conn_find_exec(c, stream);
		if (!e) {
			struct fop *f = conn_find_fop(c, stream);
			if (f) {
				send_error(c, stream, "frame type %u is not valid on a file stream", type);
				fop_free(f);
			}
			return; /* the stream just ended (race with EXIT) or never existed: drop */
		}
		if (type == F_RESIZE) {
			if (len != 4) {
				send_error(c, stream, "malformed RESIZE: payload must be u16 rows, u16 cols");
				return;
			}
			if (!e->is_tty) {
				send_error(c, stream, "resize: exec has no tty");
				return;
			}
			struct winsize ws = { .ws_row = (unsigned short)((p[0] << 8) | p[1]),
					      .ws_col = (unsigned short)((p[2] << 8) | p[3]) };
			/* Either master fd will do; both are closed only once the exec is over. */
			int mfd = e->w_out.fd >= 0 ? e->w_out.fd : e->w_in.fd;
			if (mfd >= 0 && ioctl(mfd, TIOCSWINSZ, &ws) < 0)
				logf_("conn=%u stream=%u resize: %s", c->id, stream, strerror(errno));
			logf_("conn=%u stream=%u pid=%d resize %ux%u", c->id, stream, (int)e->pid, ws.ws_row, ws.ws_col);
			return;
		}
		if (type == F_SIGNAL) {
			if (len != 4) {
				send_error(c, stream, "malformed SIGNAL: payload must be a u32 signal number");
				return;
			}
			uint32_t sig = get_u32(p);
			if (sig < 1 || sig >= (uint32_t)NSIG) {
				send_error(c, stream, "invalid signal number %u", sig);
				return;
			}
			logf_("conn=%u stream=%u pid=%d signal %u", c->id, stream, (int)e->pid, sig);
			exec_kill(e, (int)sig);
			return;
		}
		if (e->w_in.fd < 0)
			return; /* no stdin requested, already closed, or the child closed it */
		if (type == F_STDIN_EOF) {
			if (e->is_tty)
				return; /* a terminal has no EOF of its own: the client sends ^D */
			e->stdin_eof = 1;
			if (!e->iq_head)
				watch_close(&e->w_in);
			return;
		}
		if (e->stdin_eof || len == 0)
			return;
		struct chunk *ch = xmalloc(sizeof *ch + len);
		ch->next = NULL;
		ch->off = 0;
		ch->len = len;
		memcpy(ch->data, p, len);
		if (e->iq_tail)
			e->iq_tail->next = ch;
		else
			e->iq_head = ch;
		e->iq_tail = ch;
		e->iq_bytes += len;
		exec_stdin_flush(e);
		return;
	}
	default:
		if (stream == 0) {
			conn_fatal(c, "unknown or unexpected frame type %u on stream 0", type);
		} else {
			send_error(c, stream, "unknown or unexpected frame type %u", type);
			struct fop *f = conn_find_fop(c, stream);
			if (f)
				fop_free(f); /* ERROR is the final frame of a file stream */
		}
		return;
	}
}

/* Dispatch every complete buffered frame (unless reading is paused or closing). */
static void conn_process(struct conn *c)
{
	if (c->processing)
		return; /* re-entered from a handler: the outer loop picks up where it stands */
	c->processing = 1;
	size_t off = 0;
	while (!c->closing && !c->dead && c->stdin_over == 0 && c->in_len - off >= HDR_LEN) {
		const unsigned char *h = c->in + off;
		uint32_t len = get_u32(h);
		if (len > MAX_PAYLOAD) {
			conn_fatal(c, "frame payload of %u bytes exceeds the %u byte limit", len, MAX_PAYLOAD);
			break;
		}
		if (c->in_len - off < HDR_LEN + (size_t)len)
			break;
		/* flags and reserved are ignored by receivers (forward compatibility). */
		handle_frame(c, h[4], get_u32(h + 8), h + HDR_LEN, len);
		off += HDR_LEN + (size_t)len;
	}
	c->processing = 0;
	if (c->dead)
		return;
	if (off) {
		memmove(c->in, c->in + off, c->in_len - off);
		c->in_len -= off;
	}
}

/* ---- connections ------------------------------------------------------------------ */

static void conn_destroy(struct conn *c, const char *why)
{
	if (c->dead)
		return;
	logf_("conn=%u closed (%s)", c->id, why);
	c->dead = 1;
	/* Kill what is still running (unless DETACHED); the processes are reaped normally. */
	while (c->execs) {
		struct exec *e = c->execs;
		if (e->detached && !e->reaped) {
			exec_orphan(e); /* unlinks from c->execs */
			continue;
		}
		if (!e->reaped) {
			logf_("conn=%u stream=%u pid=%d killed: connection closed", c->id, e->stream, (int)e->pid);
			exec_kill(e, SIGKILL);
		}
		exec_finish(e); /* unlinks from c->execs */
	}
	while (c->fops)
		fop_free(c->fops); /* uncommitted writes leave no temp file behind */
	watch_close(&c->w);
	chunks_free(c->oq_head);
	c->oq_head = c->oq_tail = NULL;
	c->oq_bytes = 0;
	free(c->in);
	c->in = NULL;
	DL_UNLINK(g_conns, c, next, prev);
	c->grave_next = g_conn_grave;
	g_conn_grave = c;
}

static void conn_read(struct conn *c)
{
	/* Room for one READ_CHUNK, or for the rest of the frame being assembled. */
	size_t need = c->in_len + READ_CHUNK;
	if (c->in_len >= HDR_LEN) {
		uint32_t len = get_u32(c->in);
		if (len <= MAX_PAYLOAD && HDR_LEN + (size_t)len > need)
			need = HDR_LEN + (size_t)len;
	}
	if (need > c->in_cap) {
		unsigned char *nb = realloc(c->in, need);
		if (!nb) {
			conn_destroy(c, "out of memory");
			return;
		}
		c->in = nb;
		c->in_cap = need;
	}
	ssize_t n;
	do
		n = read(c->w.fd, c->in + c->in_len, c->in_cap - c->in_len);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno == EAGAIN)
			return;
		conn_destroy(c, strerror(errno));
		return;
	}
	if (n == 0) {
		conn_destroy(c, "peer closed");
		return;
	}
	c->in_len += (size_t)n;
	conn_process(c);
	/* Give back a large frame buffer once it is no longer needed. */
	if (!c->dead && c->in_cap > 4 * READ_CHUNK && c->in_len < READ_CHUNK) {
		unsigned char *nb = realloc(c->in, READ_CHUNK + HDR_LEN);
		if (nb) {
			c->in = nb;
			c->in_cap = READ_CHUNK + HDR_LEN;
		}
	}
}

static void conn_flush(struct conn *c)
{
	while (c->oq_head) {
		struct iovec iov[64];
		int n = 0;
		for (struct chunk *ch = c->oq_head; ch && n < 64; ch = ch->next, n++) {
			iov[n].iov_base = ch->data + ch->off;
			iov[n].iov_len = ch->len - ch->off;
		}
		ssize_t w = writev(c->w.fd, iov, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				break;
			conn_destroy(c, strerror(errno));
			return;
		}
		c->oq_bytes -= (size_t)w;
		while (w > 0) {
			struct chunk *ch = c->oq_head;
			size_t left = ch->len - ch->off;
			if ((size_t)w < left) {
				ch->off += (size_t)w;
				break;
			}
			w -= (ssize_t)left;
			c->oq_head = ch->next;
			free(ch);
		}
		if (!c->oq_head)
			c->oq_tail = NULL;
	}
	if (c->closing && !c->oq_head) {
		conn_destroy(c, "protocol error");
		return;
	}
	uint32_t ev = (c->closing || c->stdin_over) ? 0 : EPOLLIN;
	if (c->oq_head)
		ev |= EPOLLOUT;
	watch_set(&c->w, ev);
	if (c->out_paused && c->oq_bytes < OUTQ_LOW)
		exec_pipes_set_paused(c, 0);
}

/* Serves fd (a connected, non-blocking, close-on-exec stream socket) as a connection: an
 * accepted one, or a stream of the VM mux (vmux.c). Returns -1 (fd closed) on failure. */
static int conn_adopt(int fd)
{
	struct conn *c = xmalloc(sizeof *c);
	memset(c, 0, sizeof *c);
	c->id = g_next_conn_id++;
	if (watch_add(&c->w, W_CONN, fd, c, EPOLLIN) < 0) {
		logf_("epoll_ctl ADD conn: %s", strerror(errno));
		close(fd);
		free(c);
		return -1;
	}
	DL_PUSH(g_conns, c, next, prev);
	logf_("conn=%u accepted", c->id);
	return 0;
}

static void on_accept(void)
{
	for (int i = 0; i < 64; i++) {
		int fd = accept4(g_listen_w.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				logf_("accept: %s; pausing the listener for %d ms", strerror(errno), ACCEPT_RETRY_MS);
				watch_set(&g_listen_w, 0);
				g_listen_retry_ns = mono_ns() + (uint64_t)ACCEPT_RETRY_MS * 1000000ull;
			} else if (errno != EAGAIN) {
				logf_("accept: %s", strerror(errno));
			}
			return;
		}
		conn_adopt(fd);
	}
}

/* ---- signals ---------------------------------------------------------------------- */

static void on_signalfd(void)
{
	struct signalfd_siginfo si;
	for (;;) {
		ssize_t n = read(g_sigfd, &si, sizeof si);
		if (n < 0 && errno == EINTR)
			continue;
		if (n != (ssize_t)sizeof si)
			break;
		switch (si.ssi_signo) {
		case SIGCHLD:
			break; /* reaped below, once per batch */
		case SIGTERM:
		case SIGINT:
			if (g_is_pid1) {
				logf_("ignoring signal %u from pid %u (PID 1 never exits)", si.ssi_signo, si.ssi_pid);
			} else {
				logf_("signal %u from pid %u: shutting down", si.ssi_signo, si.ssi_pid);
				g_quit = 1;
			}
			break;
		default:
			logf_("ignoring signal %u from pid %u", si.ssi_signo, si.ssi_pid);
			break;
		}
	}
	reap_all();
}

/* ---- timers ----------------------------------------------------------------------- */

/* epoll_wait timeout in ms until the nearest deadline, -1 if none. */
static int next_timeout_ms(void)
{
	uint64_t next = 0;
	if (g_listen_retry_ns)
		next = g_listen_retry_ns;
	if (g_deadlines)
		for (struct exec *e = g_execs; e; e = e->gnext)
			if (e->deadline_ns && (!next || e->deadline_ns < next))
				next = e->deadline_ns;
	if (!next)
		return -1;
	uint64_t now = mono_ns();
	if (next <= now)
		return 0;
	uint64_t ms = (next - now + 999999) / 1000000;
	return ms > INT_MAX ? INT_MAX : (int)ms;
}

static void run_timers(void)
{
	uint64_t now = mono_ns();
	if (g_listen_retry_ns && now >= g_listen_retry_ns) {
		g_listen_retry_ns = 0;
		watch_set(&g_listen_w, EPOLLIN);
	}
	if (!g_deadlines)
		return;
	for (struct exec *e = g_execs; e; e = e->gnext) {
		if (e->deadline_ns && now >= e->deadline_ns) {
			e->deadline_ns = 0;
			g_deadlines--;
			e->timed_out = 1;
			logf_("stream=%u pid=%d timed out: SIGKILL to its process group", e->stream, (int)e->pid);
			exec_kill(e, SIGKILL);
		}
	}
}

/* ---- main loop -------------------------------------------------------------------- */

static void dispatch(struct watch *w, uint32_t ev)
{
	if (w->fd < 0)
		return; /* closed earlier in this batch */
	switch (w->kind) {
	case W_LISTEN:
		on_accept();
		break;
	case W_SIGNAL:
		on_signalfd();
		break;
	case W_CONN: {
		struct conn *c = w->obj;
		if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
			if (c->closing && (ev & (EPOLLHUP | EPOLLERR))) {
				conn_destroy(c, "peer closed");
				break;
			}
			if (!c->closing)
				conn_read(c);
		}
		if (!c->dead && (ev & EPOLLOUT))
			conn_flush(c);
		break;
	}
	case W_STDOUT:
	case W_STDERR:
		exec_pipe_read(w->obj, w);
		break;
	case W_STDIN: {
		struct exec *e = w->obj;
		if (ev & EPOLLERR) /* reader gone */
			exec_close_stdin(e);
		else
			exec_stdin_flush(e);
		break;
	}
	case W_STARTPIPE:
		exec_start_pipe_read(w->obj);
		break;
	case W_VMUX:
		vmux_run();
		break;
	}
}

static void free_graveyard(void)
{
	while (g_conn_grave) {
		struct conn *c = g_conn_grave;
		g_conn_grave = c->grave_next;
		free(c);
	}
	while (g_exec_grave) {
		struct exec *e = g_exec_grave;
		g_exec_grave = e->grave_next;
		free(e->argv0);
		free(e->cwd);
		free(e->user);
		free(e);
	}
}

static void flush_dirty(void)
{
	while (g_dirty) {
		struct conn *c = g_dirty;
		g_dirty = c->dirty_next;
		c->dirty = 0;
		if (!c->dead)
			conn_flush(c);
	}
}

/* An int SOL_SOCKET option of fd, or -1 if it cannot be read. */
static int sock_opt(int fd, int opt)
{
	int v = 0;
	socklen_t vl = sizeof v;
	return getsockopt(fd, SOL_SOCKET, opt, &v, &vl) < 0 ? -1 : v;
}

static void usage(void)
{
	fprintf(stderr, "usage: " AGENT_NAME " (--listen-fd N | --vmux PORT | --vmux-fd N) [--sched-idle] [--core-sched] [--worker] [--landlock [--writable PATH]...] [--guest-confine]\n"
			"  --listen-fd N: an inherited, listening AF_UNIX SOCK_STREAM socket\n"
			"  --vmux PORT: a VM guest: serve the stream mux on this virtio-serial port (e.g. /dev/virtio-ports/dsec.agent)\n"
			"  --vmux-fd N: the stream mux on an inherited fd (tests: a socketpair end)\n"
			"  --sched-idle: run as SCHED_IDLE with RLIMIT_NICE 0 (a batch sandbox; inherited by every exec)\n"
			"  --core-sched: own core-scheduling cookie for the agent and its execs (skipped if the kernel lacks it)\n"
			"  --worker: an fncall worker: keep CAP_SYS_ADMIN for isolated execs only (dropped from the bounding set)\n"
			"  --landlock: restrict file access with Landlock (the agent at start; a worker: each isolated call)\n"
			"  --writable PATH: a place Landlock leaves fully writable, repeatable (absolute, at most %d)\n"
			"  --guest-confine: (a microVM guest) refuse execs until dsecd sent the confinement of commands (vmux op CONFINE)\n"
			"  --landlock-abi: print {\"abi\":N} (N = 0: no Landlock, with \"reason\") and exit\n", LL_MAX_WRITABLE);
}

/* --worker: the spec gave the agent CAP_SYS_ADMIN for isolated execs. Keep it in the
 * agent's effective/permitted sets, but drop it from the bounding set (and the
 * inheritable and ambient sets) before anything runs: after execve a program's
 * capabilities come from the bounding set (root) or from inheritable/ambient, so no
 * program the agent ever executes can hold it. Any failure is fatal: a worker must not
 * run execs with CAP_SYS_ADMIN, nor run without isolation. */
static int worker_setup(void)
{
	if (!caps_has_effective(CAP_SYS_ADMIN)) {
		logf_("fatal: --worker: the agent has no CAP_SYS_ADMIN in its user namespace (the sandbox spec must grant it)");
		return -1;
	}
	if (prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) < 0) {
		logf_("fatal: --worker: prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN): %s", strerror(errno));
		return -1;
	}
	struct __user_cap_data_struct d[2];
	if (caps_get(d) < 0) {
		logf_("fatal: --worker: capget: %s", strerror(errno));
		return -1;
	}
	d[CAP_SYS_ADMIN >> 5].inheritable &= ~(1u << (CAP_SYS_ADMIN & 31));
	if (caps_set(d) < 0) {
		logf_("fatal: --worker: capset: %s", strerror(errno));
		return -1;
	}
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL) {
		logf_("fatal: --worker: clearing the ambient set: %s", strerror(errno));
		return -1;
	}
	logf_("worker: CAP_SYS_ADMIN dropped from the bounding set, kept by the agent for isolated execs");
	return 0;
}

/*
 * --sched-idle. RLIMIT_NICE goes to 0 first (soft and hard; lowering needs no privilege):
 * the kernel lets an unprivileged task leave SCHED_IDLE for SCHED_OTHER/SCHED_BATCH only
 * when RLIMIT_NICE would permit nice 0 (rlimit >= 20 - nice, so any limit >= 1 can open a
 * way out); otherwise it needs CAP_SYS_NICE in the initial user namespace, which no
 * sandbox process has. Raising the hard limit again needs CAP_SYS_RESOURCE there too.
 * Returns -1 (logged) on failure.
 */
static int sched_idle_setup(void)
{
	struct rlimit nl = { 0, 0 };
	if (setrlimit(RLIMIT_NICE, &nl) < 0) {
		logf_("fatal: setrlimit(RLIMIT_NICE, 0): %s", strerror(errno));
		return -1;
	}
	struct sched_param sp = { .sched_priority = 0 };
	if (sched_setscheduler(0, SCHED_IDLE, &sp) < 0) {
		logf_("fatal: sched_setscheduler(SCHED_IDLE): %s", strerror(errno));
		return -1;
	}
	return 0;
}

/* --core-sched: a new cookie for our own thread group (pid 0 = us), inherited across fork.
 * Best effort: logs exactly one line either way and never fails the agent. */
static void core_sched_setup(void)
{
	if (prctl(PR_SCHED_CORE, PR_SCHED_CORE_CREATE, 0, PR_SCHED_CORE_SCOPE_THREAD_GROUP, 0) == 0) {
		logf_("core scheduling: own cookie for pid %d and its children", (int)getpid());
		return;
	}
	int e = errno;
	if (e == EINVAL || e == ENODEV)
		logf_("core scheduling unavailable (prctl(PR_SCHED_CORE_CREATE): %s, errno %d: %s); continuing without a cookie",
		      e == EINVAL ? "EINVAL" : "ENODEV", e, e == EINVAL ? "not in this kernel" : "no SMT siblings");
	else
		logf_("core scheduling failed (prctl(PR_SCHED_CORE_CREATE): errno %d: %s); continuing without a cookie", e,
		      strerror(e));
}

/* SIGKILL every child of ours found in /proc (orphans reparented to us as subreaper).
 * Returns the number signalled; 0 if /proc is unavailable. */
static int kill_children_via_proc(void)
{
	int fd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	char buf[4096];
	int killed = 0;
	pid_t self = getpid();
	for (;;) {
		long n = syscall(SYS_getdents64, fd, buf, sizeof buf);
		if (n <= 0)
			break;
		for (long off = 0; off < n;) {
			struct dirent64_ *d = (void *)(buf + off);
			off += d->reclen;
			uint32_t pid;
			if (parse_id(d->name, &pid) != 0)
				continue;
			char path[64], st[512];
			snprintf(path, sizeof path, "/proc/%u/stat", pid);
			int sfd = open(path, O_RDONLY | O_CLOEXEC);
			if (sfd < 0)
				continue;
			ssize_t m = read(sfd, st, sizeof st - 1);
			close(sfd);
			if (m <= 0)
				continue;
			st[m] = 0;
			/* "pid (comm) S ppid ...": comm may contain anything, so parse after the last ')'. */
			char *rp = strrchr(st, ')');
			int ppid;
			char state;
			if (rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == self && state != 'Z') {
				kill((pid_t)pid, SIGKILL);
				killed++;
			}
		}
	}
	close(fd);
	return killed;
}

/* Non-PID-1 shutdown: SIGKILL every running exec's process group and every other child
 * (orphans reparented to us), then reap for up to 2 s so the host's init (which may not
 * reap at all) is not left with our zombies. */
static void shutdown_execs(void)
{
	for (struct exec *e = g_execs; e; e = e->gnext)
		exec_kill(e, SIGKILL);
	uint64_t until = mono_ns() + 2000000000ull;
	while (mono_ns() < until) {
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);
		if (pid < 0 && errno == EINTR)
			continue;
		if (pid < 0)
			return; /* ECHILD: nothing left */
		if (pid == 0) {
			kill_children_via_proc();
			struct timespec ts = { 0, 10000000 };
			nanosleep(&ts, NULL);
		}
	}
}

int main(int argc, char **argv)
{
	long listen_fd = -1, vmux_fd = -1;
	const char *vmux_path = NULL;
	int sched_idle = 0, core_sched = 0, worker = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *val = NULL;
		if (strcmp(a, "--sched-idle") == 0) {
			sched_idle = 1;
			continue;
		}
		if (strcmp(a, "--core-sched") == 0) {
			core_sched = 1;
			continue;
		}
		if (strcmp(a, "--guest-confine") == 0) {
			g_gc.required = 1;
			continue;
		}
		if (strcmp(a, "--worker") == 0) {
			worker = 1;
			continue;
		}
		if (strcmp(a, "--landlock") == 0) {
			g_landlock = 1;
			continue;
		}
		if (strcmp(a, "--landlock-abi") == 0) {
			landlock_probe();
			if (g_landlock_abi)
				printf("{\"abi\":%d}\n", g_landlock_abi);
			else
				printf("{\"abi\":0,\"reason\":\"%s\"}\n", g_landlock_why);
			return 0;
		}
		if (strcmp(a, "--writable") == 0 || strncmp(a, "--writable=", 11) == 0) {
			const char *w = a[10] == '=' ? a + 11 : i + 1 < argc ? argv[++i] : NULL;
			if (!w || w[0] != '/' || g_nwritable == LL_MAX_WRITABLE) {
				usage();
				return 2;
			}
			g_writable[g_nwritable++] = w;
			continue;
		}
		if (strcmp(a, "--vmux") == 0 && i + 1 < argc && argv[i + 1][0] == '/') {
			vmux_path = argv[++i];
			continue;
		}
		long *dst = &listen_fd;
		if (strcmp(a, "--vmux-fd") == 0 && i + 1 < argc) {
			val = argv[++i];
			dst = &vmux_fd;
		} else if (strcmp(a, "--listen-fd") == 0 && i + 1 < argc)
			val = argv[++i];
		else if (strncmp(a, "--listen-fd=", 12) == 0)
			val = a + 12;
		else if (strcmp(a, "--version") == 0) {
			printf(AGENT_NAME " " AGENT_VERSION " (protocol %u)\n", PROTOCOL_VERSION);
			return 0;
		} else {
			usage();
			return 2;
		}
		char *end;
		errno = 0;
		*dst = strtol(val, &end, 10);
		if (errno || *end || end == val || *dst < 0 || *dst > INT_MAX) {
			usage();
			return 2;
		}
	}
	/* Exactly one transport. */
	if ((listen_fd >= 0) + (vmux_fd >= 0) + (vmux_path != NULL) != 1) {
		usage();
		return 2;
	}
	g_is_pid1 = getpid() == 1;
	oom_adj_open();

	/* fds 0-2 must be open so no pipe or socket of ours ever lands on them. */
	for (int fd = 0; fd < 3; fd++)
		if (fcntl(fd, F_GETFD) < 0) {
			int n = open("/dev/null", O_RDWR);
			if (n >= 0 && n != fd) {
				dup2(n, fd);
				close(n);
			}
		}

	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	if (!g_is_pid1)
		prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);

	/* Priority class: before the listening socket is served, so no exec ever starts
	 * outside it (children inherit the policy, RLIMIT_NICE and the core cookie). */
	if (sched_idle && sched_idle_setup() < 0)
		return 1;
	if (core_sched)
		core_sched_setup();
	if (worker && worker_setup() < 0)
		return 1;
	g_quiet_execs = worker;
	g_worker_filter = worker;

	int lfd = (int)listen_fd;
	if (lfd >= 0 && sock_opt(lfd, SO_ACCEPTCONN) <= 0) {
		logf_("fatal: fd %d is not a listening socket", lfd);
		return 1;
	}
	if (lfd >= 0 && sock_opt(lfd, SO_DOMAIN) != AF_UNIX) {
		logf_("fatal: fd %d is not an AF_UNIX socket", lfd);
		return 1;
	}
	if (lfd >= 0 && sock_opt(lfd, SO_TYPE) != SOCK_STREAM) {
		logf_("fatal: fd %d is not a SOCK_STREAM socket", lfd);
		return 1;
	}
	cloexec_from(3);
	if (lfd >= 0) {
		set_cloexec(lfd);
		set_nonblock(lfd);
	}

	/* The identity file operations return to after each step. */
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

	getrlimit(RLIMIT_NOFILE, &g_orig_nofile);
	struct rlimit rl = g_orig_nofile;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}

	signal(SIGPIPE, SIG_IGN);
	for (int sig = 1; sig < NSIG && g_nsig_nondefault < (int)(sizeof g_sig_nondefault / sizeof g_sig_nondefault[0]); sig++) {
		struct sigaction old;
		if (sig != SIGKILL && sig != SIGSTOP && sigaction(sig, NULL, &old) == 0 && old.sa_handler != SIG_DFL)
			g_sig_nondefault[g_nsig_nondefault++] = sig;
	}
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigprocmask(SIG_BLOCK, &set, NULL);
	g_sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	g_epfd = epoll_create1(EPOLL_CLOEXEC);
	g_devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (g_sigfd < 0 || g_epfd < 0) {
		logf_("fatal: signalfd/epoll_create1: %s", strerror(errno));
		return 1;
	}
	if (watch_add(&g_sig_w, W_SIGNAL, g_sigfd, NULL, EPOLLIN) < 0 ||
	    (lfd >= 0 && watch_add(&g_listen_w, W_LISTEN, lfd, NULL, EPOLLIN) < 0)) {
		logf_("fatal: epoll_ctl: %s", strerror(errno));
		return 1;
	}
	if (lfd < 0) {
		/* A VM guest: connections are the streams of the mux on the port (vmux.c). */
		int vfd = vmux_open(vmux_path, (int)vmux_fd, conn_adopt, logf_);
		vmux_set_confine(guest_confine);
		damon_init(logf_);
		vmux_set_ops(damon_op); /* RECLAIM, RECLAIM_STATS (damon.c) */
		if (vfd < 0)
			return 1;
		if (watch_add(&g_vmux_w, W_VMUX, vfd, NULL, EPOLLIN) < 0) {
			logf_("fatal: epoll_ctl: %s", strerror(errno));
			return 1;
		}
	}
	isolate_probe();
	if (worker && !g_isolate) {
		logf_("fatal: --worker: isolated execs are unavailable: %s", g_isolate_why);
		return 1;
	}
	/* Landlock last, once everything the agent opens for itself is open: from here on
	 * the agent (ordinary sandbox) or each isolated call (worker) is restricted. */
	landlock_probe(); /* also without --landlock: HELLO reports the kernel's ABI either way */
	/* Before Landlock: the helper must be free to write other processes' /proc files. */
	oom_helper_start(g_landlock && !worker && g_landlock_abi);
	if (g_landlock) {
		if (worker) {
			if (g_landlock_abi) {
				g_landlock_scope = "isolated_execs";
				logf_("landlock: ABI %d, applied by each isolated call after its mounts", g_landlock_abi);
			} else {
				logf_("landlock unavailable: %s; isolated calls are not restricted by it", g_landlock_why);
			}
		} else if (landlock_self_setup() < 0) {
			return 1;
		}
	}
	char transport[PATH_MAX + 16];
	if (lfd >= 0)
		snprintf(transport, sizeof transport, "listen-fd=%d", lfd);
	else if (vmux_path)
		snprintf(transport, sizeof transport, "vmux=%s", vmux_path);
	else
		snprintf(transport, sizeof transport, "vmux-fd=%ld", vmux_fd);
	logf_("started version=" AGENT_VERSION " protocol=%u %s pid1=%s sched=%s isolate=%s landlock=%s", PROTOCOL_VERSION, transport,
	      g_is_pid1 ? "yes" : "no", sched_idle ? "idle" : "other", g_isolate ? "yes" : "no", g_landlock_scope);
	if (!g_isolate)
		logf_("isolated execs unavailable: %s", g_isolate_why);
	reap_all(); /* children that existed before we exec'd, if any */

	struct epoll_event evs[64];
	while (!g_quit) {
		int n = epoll_wait(g_epfd, evs, 64, file_jobs_runnable() ? 0 : next_timeout_ms());
		if (n < 0) {
			if (errno == EINTR)
				continue;
			logf_("epoll_wait: %s", strerror(errno));
			if (!g_is_pid1)
				return 1;
			continue;
		}
		for (int i = 0; i < n; i++)
			dispatch(evs[i].data.ptr, evs[i].events);
		run_timers();
		run_file_jobs();
		flush_dirty();
		free_graveyard();
	}
	shutdown_execs();
	logf_("exiting");
	return 0;
}
