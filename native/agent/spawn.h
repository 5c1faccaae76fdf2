/*
 * spawn: starting an exec, in the agent and in its child, up to execve.
 *
 * exec_spawn makes the exec's pipes (or its pseudo-terminal) and a spawn plan: everything
 * the child will need, computed in the agent (the user from the sandbox's /etc/passwd and
 * /etc/group, the env with HOME, the PATH search buffer, how the child starts at a raised
 * oom_score_adj). It then starts the child with clone(CLONE_VM | CLONE_VFORK): the child
 * runs on a stack of its own in the agent's memory, and the agent is suspended until the
 * child has exec'd or exited, so no page table is copied (fork copied all of the agent's;
 * a quarter of an exec's time in the agent on a loaded host). An isolated exec instead
 * forks its namespace init (clone into fresh namespaces, isolate.c), which lives as long
 * as the call and so needs memory of its own; the init starts the command the same way.
 *
 * The child, in order: its raised oom_score_adj, or its pid sent to the helper that raises
 * it (oom.c); its own session and its stdio on fds 0-2 (child_stdio); default signal
 * dispositions and an empty mask; the working directory; a VM guest's Landlock and
 * capability sets (confine.c); the user (setgroups, setgid, setuid); the original
 * RLIMIT_NOFILE; every fd >= 3 close-on-exec; the wait for the helper's raise; a worker's
 * second seccomp filter and a guest's filter (confine.c); execve with execvpe semantics
 * over the request's PATH. A step that fails is reported on the child's error pipe
 * (CLOEXEC, so EOF means the command was exec'd) as `i32 stage, i32 errno[, text]` in one
 * write below PIPE_BUF, and the child exits 127; exec.c turns it into EXEC_ERROR.
 *
 * What the child may do, since it shares the agent's memory: system calls (through libc's
 * thin wrappers) and reads of the plan and of globals set at start; it writes only its
 * own stack, the fields of the plan meant for it (oom.err, oom.sent, oom.until_ns,
 * script_argv[1], pathbuf) and
 * errno (the agent's, through the thread pointer the child shares; the agent reads errno
 * only after a failed clone). No malloc (a block allocated by the child would be the
 * agent's, never freed), no stdio, no locks, no strerror, no signal handler (the agent
 * installs none: it takes signals through a signalfd, and all are blocked across the
 * clone). The user switch is done with raw system calls: libc's setuid may consult its
 * thread list, which the child shares with the agent.
 */
#ifndef DSEC_AGENT_SPAWN_H
#define DSEC_AGENT_SPAWN_H

#include <stdint.h>
#include <sys/types.h>

#include "user.h"

struct callhost;

/* The exec child's report on the error pipe: i32 stage, i32 errno, then (ST_ISOLATE only)
 * a text naming the step. One write below PIPE_BUF, so the agent reads it in one piece. */
#define CHILD_REPORT_TEXT 480
/* At most this many SCRATCH mounts per exec (docs/AGENT_PROTOCOL.md "Isolated execs"). */
#define ISO_MAX_SCRATCH 8

/* Stage codes the exec child reports (with errno) over its CLOEXEC error pipe. */
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

/* The agent's side of a started exec: the pid, when it was started, and the parent's ends
 * (all non-blocking and close-on-exec; -1 for those the exec does not have). */
struct exec_spawned {
	pid_t pid;
	uint64_t t0_ns;   /* CLOCK_MONOTONIC just before the clone */
	int out;          /* stdout pipe, read end; the pty master for a TTY exec */
	int err;          /* stderr pipe, read end; -1 for a TTY exec */
	int in;           /* stdin pipe, write end, or (TTY) a dup of the master; -1 without STDIN */
	int start;        /* the error pipe, read end: a report, or EOF once the command exec'd */
	int status;       /* isolated: the namespace init's status pipe (i32 wait status); else -1 */
	int clone_failed; /* on failure: it was the clone of an isolated exec that failed */
	struct callhost *host; /* a call host serves it (callhost.h): pid is the host's; else NULL */
};

/* How a child starts at a raised oom_score_adj (oom.h): chosen by the agent before the
 * clone, carried out by the child; err is the child's report back. */
struct oom_child {
	int mode; /* OOM_CHILD_NONE, OOM_CHILD_SELF or OOM_CHILD_HELPER (oom.h) */
	int fd;   /* OOM_CHILD_HELPER: the agent's end of the socketpair to the helper */
	int err;  /* written by the child: 0, or the errno of a failed raise (the agent logs it) */
	int sent; /* written by the child: its pid went to the helper */
	uint64_t until_ns; /* written by the child: when its wait for the helper ends (CLOCK_MONOTONIC) */
};

/* Everything an exec child needs, made by the agent before the clone (exec_spawn) and
 * only read by the child, but for the fields named in the comment at the top. */
struct spawn_plan {
	const struct exec_req *r;
	int in_r, out_w, err_w; /* the child's stdio ends (in_r: the pty slave for a TTY exec) */
	int errfd;              /* the error pipe, write end */
	int user_stage;         /* 0, or the stage the user lookup failed at (reported at the user step) */
	struct creds cr;        /* the user, when user_stage is 0 */
	char **envp;            /* the request's env, plus HOME from the user's entry when it has none */
	char *pathbuf;          /* the PATH search's candidate path: room for the longest one */
	char **script_argv;     /* /bin/sh, the file, argv[1..], NULL: a file without #! (execvp's way) */
	struct oom_child oom;
	void *mem;              /* the one allocation holding envp, pathbuf and script_argv */
	int ll_fd;              /* a call host's command: the Landlock ruleset to enforce, or -1 */
};

/* --worker: every process the agent starts installs confine.c's worker_filter_install
 * before its command runs. Set by main. */
extern int g_worker_filter;

/* Start the exec r: pipes or pty, the spawn plan, then the child (clone with CLONE_VM |
 * CLONE_VFORK; r->isolate: clone_isolated, a fork into fresh namespaces). Returns once the
 * child has exec'd or failed (its report is then on the error pipe): 0 with *s filled (the
 * child's ends closed), or an errno with every fd closed (s->clone_failed set when the
 * clone of an isolated exec failed). In a forked namespace init it never returns. */
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
/* That /dev/null fd, or -1 (a call host keeps it: callhost.c). */
int spawn_devnull(void);
/* ... and map the exec children's stack (spawn.c child_stack_map), so that a forked
 * namespace init inherits it instead of mapping its own per call. A failure is logged;
 * each exec then tries again. */
void spawn_map_stack(void);

/* In a child: write the report (stage, errno, optional text) to the error pipe. */
void child_report(int errfd, int stage, int err, const char *text);
/* In a child: report and _exit(127). */
void child_fail(int errfd, int stage, int err);
/* In a child: setsid, then the stdio (the pty slave as controlling terminal, or the pipes
 * and /dev/null) on fds 0-2. */
void child_stdio(const struct exec_req *r, int in_r, int out_w, int err_w, int errfd);
/* In a child: the stdio of child_stdio without its setsid (a call host's command stays in
 * the host's session and process group). */
void child_dup_stdio(const struct exec_req *r, int in_r, int out_w, int err_w, int errfd);
/* In a child: default dispositions for the signals recorded at start, empty mask. */
void child_reset_signals(void);
/* In an isolated call's namespace init, after its setup: start the command (clone with
 * CLONE_VM | CLONE_VFORK; the child runs everything from the signal reset to execve, its
 * stdio and oom_score_adj being the init's). Returns the command's pid once it has exec'd or failed, or -1 with
 * errno when the clone failed. */
pid_t spawn_command(struct spawn_plan *pl);
/* In a call host (callhost.c): start its call's command like spawn_command, the child
 * putting its stdio in place (child_dup_stdio), enforcing pl->ll_fd (when >= 0) and
 * dropping CAP_SYS_ADMIN before child_run. Same returns. */
pid_t spawn_hosted_command(struct spawn_plan *pl);
/* Everything an exec child needs (the user from the sandbox's /etc/passwd, HOME, the PATH
 * search buffer), computed before the clone; allocates pl->mem (spawn_plan_free). ll_fd
 * starts at -1, oom.mode at OOM_CHILD_NONE. */
void spawn_plan_make(struct spawn_plan *pl, const struct exec_req *r, int in_r, int out_w, int err_w, int errfd);
/* Frees what spawn_plan_make allocated. */
void spawn_plan_free(struct spawn_plan *pl);

#endif
