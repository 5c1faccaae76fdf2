/*
 * exec: exec streams on the agent's side (docs/AGENT_PROTOCOL.md "Exec"). An EXEC frame
 * is validated and turned into a request (handle_exec) that spawn.c starts; from then on
 * this unit owns the process: STARTED once the child has exec'd (its error pipe reached
 * EOF) or EXEC_ERROR naming the step that failed, STDOUT/STDERR frames from the pipes (or
 * the pty master), STDIN frames queued to the child's stdin without blocking, RESIZE,
 * SIGNAL (to the process group), the timeout (SIGKILL to the group), and EXIT once the
 * process is reaped, after draining what the pipes already hold.
 *
 * An exec is linked on its connection until its final frame and on a global list until
 * it is reaped; the agent reaps every child, including orphans of its execs. When its
 * connection goes, an exec is killed, or, DETACHED, keeps running with its output read
 * and discarded (orphaned). Memory is freed only at the end of a loop iteration
 * (exec_free_graveyard).
 */
#ifndef DSEC_AGENT_EXEC_H
#define DSEC_AGENT_EXEC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "conn.h"
#include "loop.h"

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

/* --worker: no log line for an exec that starts and exits normally (a worker runs
 * ~1,000 calls/s; errors, timeouts and deaths by signal are still logged). Set by main. */
extern int g_quiet_execs;

/* The live exec of a stream of c, or NULL. */
struct exec *conn_find_exec(struct conn *c, uint32_t stream);
/* An EXEC frame on `stream` (not 0): validate it and start the exec, or answer ERROR
 * (malformed) or EXEC_ERROR (not startable: guest confinement pending, isolation
 * unavailable, pipes, clone). */
void handle_exec(struct conn *c, uint32_t stream, const unsigned char *p, size_t len);
/* RESIZE, SIGNAL, STDIN or STDIN_EOF on the live exec e of c. */
void exec_stream_frame(struct conn *c, struct exec *e, unsigned type, const unsigned char *p, size_t len);
/* Stop (paused) or resume reading the stdout/stderr pipes of c's started execs: the
 * outbound queue of c is above OUTQ_HIGH / back below OUTQ_LOW (conn.c). */
void exec_pipes_set_paused(struct conn *c, int paused);
/* Read a stdout/stderr pipe once (at most READ_CHUNK) and queue a frame. Returns the
 * bytes read, 0 on EOF or error (the watch is closed), -1 if nothing is available now. */
ssize_t exec_pipe_read(struct exec *e, struct watch *w);
/* Write as much of the stdin queue as the pipe takes, without blocking. */
void exec_stdin_flush(struct exec *e);
/* Drop the stdin queue and close the child's stdin. */
void exec_close_stdin(struct exec *e);
/* The child's error pipe is readable: STARTED on EOF, EXEC_ERROR on a report. Returns 1
 * once resolved, 0 if nothing could be read yet. */
int exec_start_pipe_read(struct exec *e);
/* Send sig to the exec's process group (to the child itself if it has none yet). */
void exec_kill(struct exec *e, int sig);
/* No more frames for this stream (final frame sent, or connection gone); the exec stays
 * on the global list until it is reaped. */
void exec_finish(struct exec *e);
/* The connection of a DETACHED exec is going away: it keeps running, output discarded. */
void exec_orphan(struct exec *e);
/* Whether any exec (of any kind, on any connection) is running or not yet reaped. */
int exec_any_live(void);
/* A call host reported the status of the call it served for `owner` (an exec): end the
 * exec as if its process had been reaped with that status. */
void exec_hosted_done(void *owner, int status);
/* Reap every child that has exited (execs, the OOM helper, orphans). Never blocks. */
void reap_all(void);
/* The earliest exec deadline (CLOCK_MONOTONIC ns), 0 when none. */
uint64_t exec_next_deadline(void);
/* SIGKILL the process group of every exec whose deadline is past at `now` (timed out). */
void exec_run_deadlines(uint64_t now);
/* Free the execs reaped in this iteration. */
void exec_free_graveyard(void);
/* Not PID 1, shutting down: SIGKILL every exec's process group and every other child,
 * then reap for up to 2 s. */
void shutdown_execs(void);

#endif
