/*
 * exec: exec streams: request, STARTED, output, stdin, signals, timeouts, EXIT (exec.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "confine.h"
#include "conn.h"
#include "exec.h"
#include "callhost.h"
#include "isolate.h"
#include "oom.h"
#include "proto.h"
#include "spawn.h"
#include "util.h"

/* Per-exec stdin queue high-water mark: above it the agent stops reading the
 * connection (all its streams) until the child has consumed the queue below STDINQ_LOW. */
#define STDINQ_HIGH (4u << 20)
#define STDINQ_LOW (1u << 20)
/* At reap, drain at most this much per pipe: a backgrounded grandchild that keeps
 * writing must not keep the loop busy forever. */
#define EXIT_DRAIN_MAX (4u << 20)

int g_quiet_execs;
static struct exec *g_execs;      /* every not-yet-reaped exec */
static struct exec *g_exec_grave; /* reaped in this iteration, freed at its end */
static unsigned g_deadlines;      /* # execs with deadline_ns != 0 */
static unsigned char g_rbuf[READ_CHUNK];

/* ---- exec bookkeeping ------------------------------------------------------------- */

/* Output of an orphaned (detached, connection gone) exec is read and discarded. */
static uint32_t pipe_events(struct exec *e)
{
	return (e->c && e->c->out_paused) ? 0 : EPOLLIN;
}

void exec_pipes_set_paused(struct conn *c, int paused)
{
	c->out_paused = paused;
	for (struct exec *e = c->execs; e; e = e->cnext) {
		if (!e->started)
			continue;
		watch_set(&e->w_out, paused ? 0 : EPOLLIN);
		watch_set(&e->w_err, paused ? 0 : EPOLLIN);
	}
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
	chunks_free(e->iq_head);
	e->iq_head = e->iq_tail = NULL;
	e->iq_bytes = 0;
	stdin_over_update(e);
}

void exec_close_stdin(struct exec *e)
{
	stdin_queue_free(e);
	watch_close(&e->w_in);
}

/* Write as much of the stdin queue as the pipe takes, without blocking. */
void exec_stdin_flush(struct exec *e)
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
void exec_kill(struct exec *e, int sig)
{
	if (e->reaped)
		return;
	if (kill(-e->pid, sig) < 0)
		kill(e->pid, sig);
}

/* After the final frame (or connection loss): no more frames for this stream. The exec
 * stays in g_execs until reaped. */
void exec_finish(struct exec *e)
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
ssize_t exec_pipe_read(struct exec *e, struct watch *w)
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
int exec_start_pipe_read(struct exec *e)
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
void exec_orphan(struct exec *e)
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

int exec_any_live(void)
{
	return g_execs != NULL;
}

void exec_hosted_done(void *owner, int status)
{
	/* The call is over and every process of it gone; the host lives on. */
	exec_on_reaped(owner, status);
}

static struct exec *exec_by_pid(pid_t pid)
{
	for (struct exec *e = g_execs; e; e = e->gnext)
		if (e->pid == pid)
			return e;
	return NULL;
}

void reap_all(void)
{
	for (;;) {
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);
		if (pid < 0 && errno == EINTR)
			continue;
		if (pid <= 0)
			return;
		struct exec *e = exec_by_pid(pid);
		int host = callhost_reaped(pid, &status);
		if (e)
			exec_on_reaped(e, status);
		else if (!host && !oom_helper_reaped(pid, status))
			logf_("reaped orphan pid=%d status=0x%x", (int)pid, status);
	}
}

/* ---- exec requests ---------------------------------------------------------------- */

struct exec *conn_find_exec(struct conn *c, uint32_t stream)
{
	for (struct exec *e = c->execs; e; e = e->cnext)
		if (e->stream == stream)
			return e;
	return NULL;
}

/* In handle_exec: if bad, answer ERROR "malformed EXEC: <what>" on the stream. Returns bad. */
static int exec_malformed(struct conn *c, uint32_t stream, int bad, const char *what)
{
	if (bad)
		send_error(c, stream, "malformed EXEC: %s", what);
	return bad;
}

void handle_exec(struct conn *c, uint32_t stream, const unsigned char *p, size_t len)
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
			for (size_t k = 0; k + 1 < sl; k++) {
				if (sp[k] == '/' && sp[k + 1] == '.' && k + 2 < sl && sp[k + 2] == '.' &&
				    (k + 3 == sl || sp[k + 3] == '/'))
					dotdot = 1;
				/* A "." component too: the path is compared by its text below. */
				if (sp[k] == '/' && sp[k + 1] == '.' && (k + 2 == sl || sp[k + 2] == '/'))
					dotdot = 1;
			}
			int root_only = 1;
			for (size_t k = 0; k < sl; k++)
				if (sp[k] != '/')
					root_only = 0;
			if (exec_malformed(c, stream, dotdot || root_only, "SCRATCH path must not be / or contain '.' or '..' components"))
				return;
			/* Nothing may be mounted over /proc or /sys or below them: the namespace init
			 * reads its own /proc, and a call host unmounts through it. */
			static const char *const kernel_fs[] = { "/proc", "/sys" };
			int under_kernel_fs = 0;
			for (size_t k = 0; k < sizeof kernel_fs / sizeof kernel_fs[0]; k++) {
				size_t kl = strlen(kernel_fs[k]);
				size_t lead = 0;
				while (lead < sl && sp[lead] == '/')
					lead++;
				/* sp without its leading slashes, against the name without its one. */
				const char *rest = sp + lead;
				size_t rl = sl - lead;
				if (rl >= kl - 1 && memcmp(rest, kernel_fs[k] + 1, kl - 1) == 0 && (rl == kl - 1 || rest[kl - 1] == '/'))
					under_kernel_fs = 1;
			}
			if (exec_malformed(c, stream, under_kernel_fs, "SCRATCH path must not be /proc or /sys or below them"))
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
	if (guest_confine_pending()) {
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

	/* Pass 2: build argv/envp in one block (freed once exec_spawn returns: the child has
 * exec'd or failed by then).
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

	struct exec_spawned sp;
	int err = exec_spawn(&r, &sp);
	free(argv);
	free(envp);
	free(strs);
	for (int i = 0; i < r.nscratch; i++)
		free(r.scratch[i]);
	if (err) {
		char msg[256];
		snprintf(msg, sizeof msg, sp.clone_failed ? "isolate: clone: %s" : "spawn: %s", strerror(err));
		logf_("conn=%u stream=%u %s", c->id, stream, msg);
		send_errno_frame(c, F_EXEC_ERROR, stream, err, msg, strlen(msg));
		free(e->argv0);
		free(e->cwd);
		free(e->user);
		free(e);
		return;
	}
	pid_t pid = sp.pid;
	e->t0_ns = sp.t0_ns;
	if (r.isolate) {
		e->status_fd = sp.status;
		e->isolated = 1;
	}
	if (sp.host)
		callhost_attach(sp.host, e);
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
	if (watch_add(&e->w_out, W_STDOUT, sp.out, e, 0) < 0 ||
	    (sp.err >= 0 && watch_add(&e->w_err, W_STDERR, sp.err, e, 0) < 0) ||
	    watch_add(&e->w_start, W_STARTPIPE, sp.start, e, EPOLLIN) < 0 ||
	    (sp.in >= 0 && watch_add(&e->w_in, W_STDIN, sp.in, e, 0) < 0))
		logf_("epoll_ctl ADD for stream %u: %s", stream, strerror(errno));
	if (sp.in >= 0)
		e->w_in.fd = sp.in;
	char ttyd[32] = "none";
	if (r.tty)
		snprintf(ttyd, sizeof ttyd, "%ux%u", r.rows, r.cols);
	if (!g_quiet_execs)
		logf_("conn=%u stream=%u pid=%d exec %s cwd=%s user=%s timeout_ms=%u stdin=%d tty=%s detached=%d isolate=%d",
		      c->id, stream, (int)pid, e->argv0, e->cwd, e->user, r.timeout_ms, r.want_stdin, ttyd, r.detached,
		      r.isolate);
}

void exec_stream_frame(struct conn *c, struct exec *e, unsigned type, const unsigned char *p, size_t len)
{
	uint32_t stream = e->stream;
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
}

/* ---- timeouts and shutdown --------------------------------------------------------- */

uint64_t exec_next_deadline(void)
{
	uint64_t next = 0;
	if (g_deadlines)
		for (struct exec *e = g_execs; e; e = e->gnext)
			if (e->deadline_ns && (!next || e->deadline_ns < next))
				next = e->deadline_ns;
	return next;
}

void exec_run_deadlines(uint64_t now)
{
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

void exec_free_graveyard(void)
{
	while (g_exec_grave) {
		struct exec *e = g_exec_grave;
		g_exec_grave = e->grave_next;
		free(e->argv0);
		free(e->cwd);
		free(e->user);
		free(e);
	}
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
void shutdown_execs(void)
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
