/*
 * loop: the epoll loop, its watches, signals and timers (loop.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>

#include "conn.h"
#include "callhost.h"
#include "exec.h"
#include "files.h"
#include "loop.h"
#include "util.h"
#include "vmux.h"

int g_is_pid1;
static int g_epfd = -1;
static int g_sigfd = -1;
static struct watch g_sig_w;
static int g_quit;

/* ---- epoll watches ---------------------------------------------------------------- */

/* Register fd with the given events. An empty event mask means "not registered": epoll
 * reports EPOLLHUP/EPOLLERR even for an empty mask, so a paused or not-yet-started pipe
 * must be out of the set entirely. */
int watch_add(struct watch *w, int kind, int fd, void *obj, uint32_t events)
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
void watch_set(struct watch *w, uint32_t events)
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
void watch_close(struct watch *w)
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

/* epoll_wait timeout in ms until the nearest timer (listener retry, exec deadline), -1 if none. */
static int next_timeout_ms(void)
{
	uint64_t next = listen_retry_at();
	uint64_t d = exec_next_deadline();
	if (d && (!next || d < next))
		next = d;
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
	listen_retry_run(now);
	exec_run_deadlines(now);
}

/* ---- main loop -------------------------------------------------------------------- */

static void dispatch(struct watch *w, uint32_t ev)
{
	if (w->fd < 0)
		return; /* closed earlier in this batch */
	switch (w->kind) {
	case W_LISTEN:
		conn_accept();
		break;
	case W_SIGNAL:
		on_signalfd();
		break;
	case W_CONN:
		conn_on_event(w->obj, ev);
		break;
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
	case W_CALLHOST:
		callhost_on_ctl(w->obj);
		break;
	}
}

int loop_open(void)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigprocmask(SIG_BLOCK, &set, NULL);
	g_sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	g_epfd = epoll_create1(EPOLL_CLOEXEC);
	if (g_sigfd < 0 || g_epfd < 0) {
		logf_("fatal: signalfd/epoll_create1: %s", strerror(errno));
		return -1;
	}
	if (watch_add(&g_sig_w, W_SIGNAL, g_sigfd, NULL, EPOLLIN) < 0) {
		logf_("fatal: epoll_ctl: %s", strerror(errno));
		return -1;
	}
	return 0;
}

int loop_run(void)
{
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
		conn_flush_dirty();
		conn_free_graveyard();
		exec_free_graveyard();
		callhost_free_graveyard();
	}
	return 0;
}
