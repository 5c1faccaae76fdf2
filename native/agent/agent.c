/*
 * dsec-agent: the in-sandbox agent (PID 1 of every container sandbox).
 *
 * It serves the dsec agent protocol (version 1, see docs/AGENT_PROTOCOL.md) on an
 * inherited, already-listening AF_UNIX SOCK_STREAM socket:
 *
 *     dsec-agent --listen-fd N
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
 * Logging: one line per event on fd 2, "<RFC 3339 UTC timestamp> dsec-agent[pid]: msg".
 *
 * Built with: gcc -static -O2 -Wall -Wextra (plain libc, no NSS: /etc/passwd and
 * /etc/group of the sandbox are parsed directly).
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
#include <time.h>
#include <unistd.h>
#include <grp.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>

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

#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

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
};

enum exec_tag {
	T_ARGV = 1,
	T_ENV = 2,
	T_CWD = 3,
	T_USER = 4,
	T_TIMEOUT_MS = 5,
	T_STDIN = 6,
};

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
};

enum watch_kind { W_LISTEN = 1, W_SIGNAL, W_CONN, W_STDOUT, W_STDERR, W_STDIN, W_STARTPIPE };

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
	struct exec *execs; /* live streams (final frame not yet sent) */
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
	uint64_t t0_ns;
	uint64_t deadline_ns; /* 0 = none / already fired */
	struct chunk *iq_head, *iq_tail;
	size_t iq_bytes;
	char *argv0, *cwd, *user; /* copies for messages and logs */
	struct exec *cnext, *cprev;
	struct exec *gnext, *gprev;
	struct exec *grave_next;
};

/* ---- globals ---------------------------------------------------------------------- */

static int g_epfd = -1;
static int g_sigfd = -1;
static int g_devnull = -1;
static int g_is_pid1;
static int g_quit;
static unsigned g_next_conn_id = 1;
static struct watch g_listen_w, g_sig_w;
static uint64_t g_listen_retry_ns; /* nonzero: listener paused until then */
static struct rlimit g_orig_nofile;
static struct conn *g_conns;
static struct conn *g_dirty;
static struct conn *g_conn_grave;
static struct exec *g_execs;      /* every not-yet-reaped exec */
static struct exec *g_exec_grave;
static unsigned g_deadlines;      /* # execs with deadline_ns != 0 */
static unsigned char g_rbuf[READ_CHUNK];

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

/* Queue one frame whose payload is the concatenation of (p1,n1) and (p2,n2). */
static void send_frame2(struct conn *c, unsigned type, uint32_t stream, const void *p1, size_t n1,
			const void *p2, size_t n2)
{
	if (!c || c->dead)
		return;
	size_t plen = n1 + n2;
	struct chunk *ch = xmalloc(sizeof *ch + HDR_LEN + plen);
	ch->next = NULL;
	ch->off = 0;
	ch->len = HDR_LEN + plen;
	put_u32(ch->data, (uint32_t)plen);
	ch->data[4] = (unsigned char)type;
	ch->data[5] = 0;
	ch->data[6] = 0;
	ch->data[7] = 0;
	put_u32(ch->data + 8, stream);
	if (n1)
		memcpy(ch->data + HDR_LEN, p1, n1);
	if (n2)
		memcpy(ch->data + HDR_LEN + n1, p2, n2);
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

static void send_frame(struct conn *c, unsigned type, uint32_t stream, const void *p, size_t n)
{
	send_frame2(c, type, stream, p, n, NULL, 0);
}

static void send_error(struct conn *c, uint32_t stream, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void send_error(struct conn *c, uint32_t stream, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t)n >= sizeof msg)
		n = sizeof msg - 1;
	logf_("conn=%u stream=%u error: %s", c->id, stream, msg);
	send_frame(c, F_ERROR, stream, msg, (size_t)n);
}

/* A fatal protocol error: ERROR on stream 0, stop reading, close once it is flushed. */
static void conn_fatal(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void conn_fatal(struct conn *c, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t)n >= sizeof msg)
		n = sizeof msg - 1;
	logf_("conn=%u fatal protocol error: %s", c->id, msg);
	send_frame(c, F_ERROR, 0, msg, (size_t)n);
	c->closing = 1;
	watch_set(&c->w, 0);
}

/* ---- exec bookkeeping ------------------------------------------------------------- */

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

static void stdin_queue_free(struct exec *e)
{
	struct chunk *ch = e->iq_head;
	while (ch) {
		struct chunk *n = ch->next;
		free(ch);
		ch = n;
	}
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
	if (e->cprev)
		e->cprev->cnext = e->cnext;
	else
		c->execs = e->cnext;
	if (e->cnext)
		e->cnext->cprev = e->cprev;
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
	if (e->gprev)
		e->gprev->gnext = e->gnext;
	else
		g_execs = e->gnext;
	if (e->gnext)
		e->gnext->gprev = e->gprev;
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
	default: return "spawn";
	}
}

static void exec_send_exec_error(struct exec *e, int stage, int err)
{
	char msg[1024];
	switch (stage) {
	case ST_CHDIR:
		snprintf(msg, sizeof msg, "chdir: %s: %s", e->cwd, strerror(err));
		break;
	case ST_USER_UNKNOWN:
		snprintf(msg, sizeof msg, "user: %s: unknown user", e->user);
		break;
	case ST_GROUP_UNKNOWN:
		snprintf(msg, sizeof msg, "user: %s: unknown group", e->user);
		break;
	case ST_SETGROUPS:
		snprintf(msg, sizeof msg, "user: %s: setgroups: %s", e->user, strerror(err));
		break;
	case ST_SETGID:
		snprintf(msg, sizeof msg, "user: %s: setgid: %s", e->user, strerror(err));
		break;
	case ST_SETUID:
		snprintf(msg, sizeof msg, "user: %s: setuid: %s", e->user, strerror(err));
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
		unsigned char b[4];
		put_u32(b, (uint32_t)err);
		send_frame2(e->c, F_EXEC_ERROR, e->stream, b, 4, msg, strlen(msg));
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
	if (!e->c)
		return;
	unsigned char b[4];
	put_u32(b, (uint32_t)e->pid);
	send_frame(e->c, F_STARTED, e->stream, b, 4);
	uint32_t ev = pipe_events(e);
	watch_set(&e->w_out, ev);
	watch_set(&e->w_err, ev);
}

/* Handle the error pipe: returns 1 once it is resolved (STARTED or EXEC_ERROR sent). */
static int exec_start_pipe_read(struct exec *e)
{
	int32_t rep[2];
	ssize_t n;
	do
		n = read(e->w_start.fd, rep, sizeof rep);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == EAGAIN)
		return 0;
	if (n == (ssize_t)sizeof rep) {
		exec_send_exec_error(e, rep[0], rep[1]);
		return 1;
	}
	if (n > 0) /* short report: cannot happen (< PIPE_BUF is atomic); be conservative */
		exec_send_exec_error(e, ST_SETUP, EIO);
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
			exec_send_exec_error(e, ST_SETUP, EIO);
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
		logf_("conn=%u stream=%u pid=%d %s %d%s after %llu us", e->c->id, e->stream, (int)e->pid,
		      how ? "killed by signal" : "exited with", code, e->timed_out ? " (timed out)" : "",
		      (unsigned long long)dur_us);
		send_frame(e->c, F_EXIT, e->stream, b, sizeof b);
	} else {
		logf_("reaped pid=%d (stream already closed) status=0x%x", (int)e->pid, status);
	}
	exec_finish(e);
	exec_free_later(e);
}

static struct exec *exec_by_pid(pid_t pid)
{
	for (struct exec *e = g_execs; e; e = e->gnext)
		if (e->pid == pid)
			return e;
	return NULL;
}

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
};

static void child_fail(int errfd, int stage, int err)
{
	int32_t rep[2] = { stage, err };
	ssize_t w = write(errfd, rep, sizeof rep);
	(void)w;
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
		if (split_fields(line, f, 7) < 4)
			continue;
		uint32_t u, g;
		if (parse_id(f[2], &u) || parse_id(f[3], &g))
			continue;
		if (name ? strcmp(f[0], name) == 0 : u == uid) {
			if (strlen(f[0]) >= sizeof out->name)
				continue;
			out->found = 1;
			strcpy(out->name, f[0]);
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

/* user spec: "uid", "uid:gid", "name", "name:group" (group numeric or a name). */
static void child_set_user(const char *spec, int errfd)
{
	char *u = strdup(spec);
	if (!u)
		child_fail(errfd, ST_SETUP, ENOMEM);
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
		if (!pw.found)
			child_fail(errfd, ST_USER_UNKNOWN, ENOENT);
		uid = pw.uid;
	}
	if (g) {
		if (parse_id(g, &gid) != 0 && group_lookup(g, &gid) != 0)
			child_fail(errfd, ST_GROUP_UNKNOWN, ENOENT);
	} else {
		gid = pw.found ? pw.gid : uid; /* numeric user without a passwd entry: gid = uid */
	}

	if (geteuid() != 0 && uid == geteuid() && gid == getegid())
		return; /* unprivileged agent (tests) asked for its own identity: nothing to do */

	gid_t groups[256];
	int ngroups = member_groups(pw.found ? pw.name : NULL, (gid_t)gid, groups, 256);
	if (setgroups((size_t)ngroups, groups) < 0)
		child_fail(errfd, ST_SETGROUPS, errno);
	if (setgid((gid_t)gid) < 0)
		child_fail(errfd, ST_SETGID, errno);
	if (setuid((uid_t)uid) < 0)
		child_fail(errfd, ST_SETUID, errno);
	free(u);
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

static void __attribute__((noreturn))
child_main(const struct exec_req *r, int in_r, int out_w, int err_w, int errfd)
{
	if (setsid() < 0)
		child_fail(errfd, ST_SETUP, errno);
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

	/* Default dispositions (the agent ignores SIGPIPE), then an empty mask. */
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = SIG_DFL;
	for (int s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP)
			sigaction(s, &sa, NULL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);

	if (chdir(r->cwd) < 0)
		child_fail(errfd, ST_CHDIR, errno);
	child_set_user(r->user, errfd);

	/* The agent's raised fd limit is not the sandbox's business. */
	setrlimit(RLIMIT_NOFILE, &g_orig_nofile);
	/* Everything the agent owns is already CLOEXEC; make sure nothing else leaks.
	 * errfd must survive until execve, and CLOEXEC closes it exactly then. */
	cloexec_from(3);
	child_exec(r->argv, r->envp, errfd);
	_exit(127);
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

static void handle_exec(struct conn *c, uint32_t stream, const unsigned char *p, size_t len)
{
	if (conn_find_exec(c, stream)) {
		send_error(c, stream, "stream %u is already in use", stream);
		return;
	}
	/* Pass 1: validate and size. */
	size_t nargv = 0, nenv = 0, strbytes = 0;
	const unsigned char *cwd = NULL, *user = NULL;
	size_t cwd_len = 0, user_len = 0;
	struct exec_req r = { 0 };
	r.cwd = "/";
	r.user = "0";
	size_t off = 0;
	while (off < len) {
		if (len - off < 5) {
			send_error(c, stream, "malformed EXEC: truncated field header at offset %zu", off);
			return;
		}
		unsigned tag = p[off];
		uint32_t flen = get_u32(p + off + 1);
		off += 5;
		if (flen > len - off) {
			send_error(c, stream, "malformed EXEC: field %u overruns the payload", tag);
			return;
		}
		const unsigned char *v = p + off;
		off += flen;
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
			if (!memchr(v, '=', flen)) {
				send_error(c, stream, "malformed EXEC: ENV entry without '='");
				return;
			}
			nenv++;
			strbytes += flen + 1;
			break;
		case T_CWD:
			if (flen == 0) {
				send_error(c, stream, "malformed EXEC: empty CWD");
				return;
			}
			cwd = v;
			cwd_len = flen;
			break;
		case T_USER:
			if (flen == 0) {
				send_error(c, stream, "malformed EXEC: empty USER");
				return;
			}
			user = v;
			user_len = flen;
			break;
		case T_TIMEOUT_MS:
			if (flen != 4) {
				send_error(c, stream, "malformed EXEC: TIMEOUT_MS must be 4 bytes");
				return;
			}
			r.timeout_ms = get_u32(v);
			break;
		case T_STDIN:
			if (flen != 1) {
				send_error(c, stream, "malformed EXEC: STDIN must be 1 byte");
				return;
			}
			r.want_stdin = v[0] != 0;
			break;
		default:
			break; /* unknown tags are ignored (forward compatibility) */
		}
	}
	if (nargv == 0) {
		send_error(c, stream, "malformed EXEC: at least one ARGV field is required");
		return;
	}

	/* Pass 2: build argv/envp in one block (freed right after fork; the child has a copy). */
	char **argv = xmalloc(sizeof(char *) * (nargv + 1));
	char **envp = xmalloc(sizeof(char *) * (nenv + 1));
	char *strs = xmalloc(strbytes);
	size_t ai = 0, ei = 0, so = 0;
	for (off = 0; off < len;) {
		unsigned tag = p[off];
		uint32_t flen = get_u32(p + off + 1);
		const unsigned char *v = p + off + 5;
		off += 5 + flen;
		if (tag != T_ARGV && tag != T_ENV)
			continue;
		memcpy(strs + so, v, flen);
		strs[so + flen] = 0;
		if (tag == T_ARGV)
			argv[ai++] = strs + so;
		else
			envp[ei++] = strs + so;
		so += flen + 1;
	}
	argv[ai] = NULL;
	envp[ei] = NULL;
	r.argv = argv;
	r.envp = envp;

	struct exec *e = xmalloc(sizeof *e);
	memset(e, 0, sizeof *e);
	e->w_out.fd = e->w_err.fd = e->w_in.fd = e->w_start.fd = -1;
	e->stream = stream;
	e->argv0 = xstrndup(argv[0], strlen(argv[0]));
	e->cwd = cwd ? xstrndup((const char *)cwd, cwd_len) : xstrndup("/", 1);
	e->user = user ? xstrndup((const char *)user, user_len) : xstrndup("0", 1);
	r.cwd = e->cwd;
	r.user = e->user;

	int in_p[2] = { -1, -1 }, out_p[2] = { -1, -1 }, err_p[2] = { -1, -1 }, st_p[2] = { -1, -1 };
	int err = 0;
	if ((r.want_stdin && pipe_cloexec(in_p) < 0) || pipe_cloexec(out_p) < 0 || pipe_cloexec(err_p) < 0 ||
	    pipe_cloexec(st_p) < 0)
		err = errno;
	if (!err && ((in_p[1] >= 0 && set_nonblock(in_p[1]) < 0) || set_nonblock(out_p[0]) < 0 ||
		     set_nonblock(err_p[0]) < 0 || set_nonblock(st_p[0]) < 0))
		err = errno;
	pid_t pid = -1;
	if (!err) {
		e->t0_ns = mono_ns();
		pid = fork();
		if (pid < 0)
			err = errno;
	}
	if (pid == 0) {
		close(st_p[0]);
		child_main(&r, in_p[0], out_p[1], err_p[1], st_p[1]);
	}
	free(argv);
	free(envp);
	free(strs);
	if (err) {
		close_pair(in_p);
		close_pair(out_p);
		close_pair(err_p);
		close_pair(st_p);
		char msg[256];
		snprintf(msg, sizeof msg, "spawn: %s", strerror(err));
		logf_("conn=%u stream=%u %s", c->id, stream, msg);
		unsigned char b[4];
		put_u32(b, (uint32_t)err);
		send_frame2(c, F_EXEC_ERROR, stream, b, 4, msg, strlen(msg));
		free(e->argv0);
		free(e->cwd);
		free(e->user);
		free(e);
		return;
	}
	close(in_p[0]);
	close(out_p[1]);
	close(err_p[1]);
	close(st_p[1]);
	e->pid = pid;
	e->c = c;
	e->cnext = c->execs;
	if (c->execs)
		c->execs->cprev = e;
	c->execs = e;
	e->gnext = g_execs;
	if (g_execs)
		g_execs->gprev = e;
	g_execs = e;
	if (r.timeout_ms) {
		e->deadline_ns = e->t0_ns + (uint64_t)r.timeout_ms * 1000000ull;
		g_deadlines++;
	}
	/* stdout/stderr are registered but not read until the child has exec'd (STARTED
	 * must come first); stdin gets EPOLLOUT only while data is queued. */
	if (watch_add(&e->w_out, W_STDOUT, out_p[0], e, 0) < 0 || watch_add(&e->w_err, W_STDERR, err_p[0], e, 0) < 0 ||
	    watch_add(&e->w_start, W_STARTPIPE, st_p[0], e, EPOLLIN) < 0 ||
	    (in_p[1] >= 0 && watch_add(&e->w_in, W_STDIN, in_p[1], e, 0) < 0))
		logf_("epoll_ctl ADD for stream %u: %s", stream, strerror(errno));
	if (in_p[1] >= 0)
		e->w_in.fd = in_p[1];
	logf_("conn=%u stream=%u pid=%d exec %s cwd=%s user=%s timeout_ms=%u stdin=%d", c->id, stream, (int)pid,
	      e->argv0, e->cwd, e->user, r.timeout_ms, r.want_stdin);
}

/* ---- inbound frames --------------------------------------------------------------- */

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
		char json[256];
		int n = snprintf(json, sizeof json,
				 "{\"agent\":\"" AGENT_NAME "\",\"version\":\"" AGENT_VERSION "\",\"protocol\":%u,\"pid\":%d}",
				 PROTOCOL_VERSION, (int)getpid());
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
	case F_STDIN:
	case F_STDIN_EOF:
	case F_SIGNAL: {
		if (stream == 0) {
			conn_fatal(c, "frame type %u on stream 0", type);
			return;
		}
		struct exec *e = conn_find_exec(c, stream);
		if (!e)
			return; /* the stream just ended (race with EXIT) or never existed: drop */
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
		if (stream == 0)
			conn_fatal(c, "unknown or unexpected frame type %u on stream 0", type);
		else
			send_error(c, stream, "unknown or unexpected frame type %u", type);
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
	/* Kill what is still running; the processes are reaped normally. */
	while (c->execs) {
		struct exec *e = c->execs;
		if (!e->reaped) {
			logf_("conn=%u stream=%u pid=%d killed: connection closed", c->id, e->stream, (int)e->pid);
			exec_kill(e, SIGKILL);
		}
		exec_finish(e); /* unlinks from c->execs */
	}
	watch_close(&c->w);
	struct chunk *ch = c->oq_head;
	while (ch) {
		struct chunk *n = ch->next;
		free(ch);
		ch = n;
	}
	c->oq_head = c->oq_tail = NULL;
	c->oq_bytes = 0;
	free(c->in);
	c->in = NULL;
	if (c->prev)
		c->prev->next = c->next;
	else
		g_conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
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
		struct conn *c = xmalloc(sizeof *c);
		memset(c, 0, sizeof *c);
		c->id = g_next_conn_id++;
		if (watch_add(&c->w, W_CONN, fd, c, EPOLLIN) < 0) {
			logf_("epoll_ctl ADD conn: %s", strerror(errno));
			close(fd);
			free(c);
			continue;
		}
		c->next = g_conns;
		if (g_conns)
			g_conns->prev = c;
		g_conns = c;
		logf_("conn=%u accepted", c->id);
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

static void usage(void)
{
	fprintf(stderr, "usage: " AGENT_NAME " --listen-fd N\n"
			"  N: an inherited, listening AF_UNIX SOCK_STREAM socket\n");
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
			struct {
				uint64_t ino;
				int64_t off;
				unsigned short reclen;
				unsigned char type;
				char name[];
			} *d = (void *)(buf + off);
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
	long listen_fd = -1;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *val = NULL;
		if (strcmp(a, "--listen-fd") == 0 && i + 1 < argc)
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
		listen_fd = strtol(val, &end, 10);
		if (errno || *end || end == val || listen_fd < 0 || listen_fd > INT_MAX) {
			usage();
			return 2;
		}
	}
	if (listen_fd < 0) {
		usage();
		return 2;
	}
	g_is_pid1 = getpid() == 1;

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

	int lfd = (int)listen_fd;
	int v = 0;
	socklen_t vl = sizeof v;
	if (getsockopt(lfd, SOL_SOCKET, SO_ACCEPTCONN, &v, &vl) < 0 || !v) {
		logf_("fatal: fd %d is not a listening socket", lfd);
		return 1;
	}
	vl = sizeof v;
	if (getsockopt(lfd, SOL_SOCKET, SO_DOMAIN, &v, &vl) < 0 || v != AF_UNIX) {
		logf_("fatal: fd %d is not an AF_UNIX socket", lfd);
		return 1;
	}
	vl = sizeof v;
	if (getsockopt(lfd, SOL_SOCKET, SO_TYPE, &v, &vl) < 0 || v != SOCK_STREAM) {
		logf_("fatal: fd %d is not a SOCK_STREAM socket", lfd);
		return 1;
	}
	cloexec_from(3);
	set_cloexec(lfd);
	set_nonblock(lfd);

	getrlimit(RLIMIT_NOFILE, &g_orig_nofile);
	struct rlimit rl = g_orig_nofile;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}

	signal(SIGPIPE, SIG_IGN);
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
	    watch_add(&g_listen_w, W_LISTEN, lfd, NULL, EPOLLIN) < 0) {
		logf_("fatal: epoll_ctl: %s", strerror(errno));
		return 1;
	}
	logf_("started version=" AGENT_VERSION " protocol=%u listen-fd=%d pid1=%s", PROTOCOL_VERSION, lfd,
	      g_is_pid1 ? "yes" : "no");
	reap_all(); /* children that existed before we exec'd, if any */

	struct epoll_event evs[64];
	while (!g_quit) {
		int n = epoll_wait(g_epfd, evs, 64, next_timeout_ms());
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
		flush_dirty();
		free_graveyard();
	}
	shutdown_execs();
	logf_("exiting");
	return 0;
}
