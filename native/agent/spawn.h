/*
 * spawn: starting an exec, in the agent and in the forked child, up to execve.
 *
 * exec_spawn makes the exec's pipes (or its pseudo-terminal) and forks (clone into fresh
 * namespaces for an isolated exec, isolate.c). The child, in order: its own session and
 * its stdio on fds 0-2 (child_stdio); the OOM wait (oom.c); default signal dispositions
 * and an empty mask; the working directory; a VM guest's Landlock and capability sets
 * (confine.c); the user (setgroups, setgid, setuid from the sandbox's /etc/passwd and
 * /etc/group, user.c); the original RLIMIT_NOFILE; every fd >= 3 close-on-exec; a
 * worker's second seccomp filter and a guest's filter (confine.c); execve with execvpe
 * semantics over the request's PATH and HOME from the user's entry when the request has
 * none. A step that fails is reported on the child's error pipe (CLOEXEC, so EOF means
 * the command was exec'd) as `i32 stage, i32 errno[, text]` in one write below PIPE_BUF,
 * and the child exits 127; exec.c turns it into EXEC_ERROR.
 *
 * The child is a fork of the single-threaded agent, a copy of its memory, so it may
 * allocate (the user lookup, HOME) on its way to execve. A child sharing the agent's
 * memory (clone with CLONE_VM) would change the agent's own heap: those steps would have
 * to move before the clone.
 */
#ifndef DSEC_AGENT_SPAWN_H
#define DSEC_AGENT_SPAWN_H

#include <stdint.h>
#include <sys/types.h>

/* The exec child's report on the error pipe: i32 stage, i32 errno, then (ST_ISOLATE only)
 * a text naming the step. One write below PIPE_BUF, so the agent reads it in one piece. */
#define CHILD_REPORT_TEXT 480
/* At most this many SCRATCH mounts per exec (docs/AGENT_PROTOCOL.md "Isolated execs"). */
#define ISO_MAX_SCRATCH 8

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

/* A validated EXEC request (exec.c handle_exec); strings live until exec_spawn returns. */
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

/* The agent's side of a started exec: the pid, when it was forked, and the parent's ends
 * (all non-blocking and close-on-exec; -1 for those the exec does not have). */
struct exec_spawned {
	pid_t pid;
	uint64_t t0_ns;   /* CLOCK_MONOTONIC just before the fork */
	int out;          /* stdout pipe, read end; the pty master for a TTY exec */
	int err;          /* stderr pipe, read end; -1 for a TTY exec */
	int in;           /* stdin pipe, write end, or (TTY) a dup of the master; -1 without STDIN */
	int start;        /* the error pipe, read end: a report, or EOF once the command exec'd */
	int status;       /* isolated: the namespace init's status pipe (i32 wait status); else -1 */
	int clone_failed; /* on failure: it was the clone of an isolated exec that failed */
};

/* --worker: every process the agent starts installs confine.c's worker_filter_install
 * before its command runs. Set by main. */
extern int g_worker_filter;

/* Start the exec r: pipes or pty, then fork (r->isolate: clone_isolated). Returns 0 with
 * *s filled (the child's ends closed), or an errno with every fd closed (s->clone_failed
 * set when the clone failed). In the child it never returns. */
int exec_spawn(const struct exec_req *r, struct exec_spawned *s);

/* At start, before any exec: raise the agent's RLIMIT_NOFILE soft limit to the hard limit
 * (children get the original back), ... */
void spawn_raise_nofile(void);
/* ... ignore SIGPIPE and record which signals are not at SIG_DFL (children reset exactly
 * those), ... */
void spawn_record_signals(void);
/* ... and open /dev/null for the stdin of execs without STDIN (none in the sandbox: an
 * empty pipe is used instead). */
void spawn_open_devnull(void);

/* In a child: write the report (stage, errno, optional text) to the error pipe. */
void child_report(int errfd, int stage, int err, const char *text);
/* In a child: report and _exit(127). */
void child_fail(int errfd, int stage, int err);
/* In a child: setsid, then the stdio (the pty slave as controlling terminal, or the pipes
 * and /dev/null) on fds 0-2. */
void child_stdio(const struct exec_req *r, int in_r, int out_w, int err_w, int errfd);
/* In a child: default dispositions for the signals recorded at start, empty mask. */
void child_reset_signals(void);
/* In a child, after child_stdio: everything up to and including execve (see above). */
void __attribute__((noreturn)) child_run(const struct exec_req *r, int errfd);

#endif
