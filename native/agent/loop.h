/*
 * loop: the agent's one thread and its one epoll loop (level-triggered). Every fd the
 * agent waits on is a struct watch: the listening socket (conn.c), the signalfd (here),
 * connections (conn.c), exec pipes (exec.c) and the VM mux (guest.c). One iteration:
 * epoll_wait (no timeout while a file job can run, else until the nearest timer), the
 * ready watches in the order epoll reports them, the timers (listener retry, exec
 * deadlines), one slice of every file job, the flush of every connection with queued
 * output, and the freeing of what died in the iteration (nothing an event of the same
 * batch may still point at is freed earlier).
 *
 * Signals: SIGCHLD, SIGTERM, SIGINT and SIGHUP are blocked and read from a signalfd.
 * SIGCHLD reaps (exec.c reap_all); SIGTERM and SIGINT end the loop unless the agent is
 * PID 1, which never exits; anything else is logged and ignored.
 */
#ifndef DSEC_AGENT_LOOP_H
#define DSEC_AGENT_LOOP_H

#include <stdint.h>

/* What a watch is (dispatch in loop.c calls the unit that owns it). */
enum watch_kind { W_LISTEN = 1, W_SIGNAL, W_CONN, W_STDOUT, W_STDERR, W_STDIN, W_STARTPIPE, W_VMUX, W_CALLHOST };

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

/* 1 when the agent is PID 1 of its pid namespace (set once by main, before loop_open). */
extern int g_is_pid1;

/* Register fd for `events` (0: remember it, unregistered). 0, or -1 with errno. */
int watch_add(struct watch *w, int kind, int fd, void *obj, uint32_t events);
/* Change the event mask: 0 unregisters, nonzero (re-)registers. Failures are logged. */
void watch_set(struct watch *w, uint32_t events);
/* Unregister and close; fd becomes -1 (a no-op on a closed watch). */
void watch_close(struct watch *w);

/* Blocks SIGCHLD, SIGTERM, SIGINT and SIGHUP, creates the signalfd and the epoll set and
 * watches the signalfd. 0, or -1 (logged "fatal: ..."). */
int loop_open(void);
/* Runs the loop until SIGTERM or SIGINT (never as PID 1). Returns 0 then, or 1 when
 * epoll_wait failed in an agent that is not PID 1 (PID 1 logs and goes on). */
int loop_run(void);

#endif
