/*
 * oom: every command the agent starts runs at oom_score_adj EXEC_OOM_SCORE_ADJ (+500; or
 * the agent's own value when that is higher), while the agent stays where dsecd started
 * it, so a memory cgroup's OOM kill takes a command, not the agent (the reasons and the
 * history are in oom.c). An exec child (clone with CLONE_VM | CLONE_VFORK, spawn.h) raises
 * itself before it execs: it writes its own value (an agent without Landlock), or sends
 * its pid to the dsec-oom-adj helper process (a Landlocked agent and its children may not
 * write under /proc) as it starts and, before its execve, waits until it reads raised (at
 * most OOM_RAISE_WAIT_MS). An
 * isolated exec's namespace init, a fork, is raised by the agent or the helper right after
 * the fork and waits the same way; its command inherits the value. Without the helper, or
 * without /proc, commands start at the agent's value; nothing fails.
 */
#ifndef DSEC_AGENT_OOM_H
#define DSEC_AGENT_OOM_H

#include <sys/types.h>

#include "spawn.h"

/* struct oom_child's modes (spawn.h). */
enum { OOM_CHILD_NONE = 0, OOM_CHILD_SELF = 1, OOM_CHILD_HELPER = 2 };

/* At start: read the agent's own value; commands are raised only when it is lower. */
void oom_adj_open(void);
/* At start, before Landlock and before serving: with agent_landlocked fork the
 * dsec-oom-adj helper (a socketpair only the agent holds; PR_SET_PDEATHSIG), otherwise
 * let the agent write each child's value itself. Failures are logged. */
void oom_helper_start(int agent_landlocked);
/* In the agent, before the clone of an exec child: how the child is to raise itself. */
void oom_child_prepare(struct oom_child *o);
/* In an exec child sharing the agent's memory, first thing: raise itself (a write to
 * /proc/self), or send its pid to the helper. Only system calls; a failure is left in
 * o->err. */
void oom_child_start(struct oom_child *o);
/* In that child, after its user switch and before its seccomp filters and execve: with
 * the helper, wait until its value reads raised (at most OOM_RAISE_WAIT_MS from the
 * send). Only system calls. */
void oom_child_wait(const struct oom_child *o);
/* In the agent, once the clone has returned: a failure the child left in o->err is logged,
 * and commands start at the agent's value from then on. */
void oom_child_done(const struct oom_child *o);
/* In the agent, just before forking an isolated exec's namespace init: the init is to wait
 * until raised. */
void oom_before_fork(void);
/* In the agent, right after that fork: raise the init, or ask the helper to. On failure
 * (logged) commands start at the agent's value from then on. */
void oom_raise_child(pid_t child);
/* In the forked namespace init, before it starts its command: wait until it reads raised. */
void oom_wait_raised(void);
/* A child was reaped: if it is the helper, stop using it (logged) and return 1; else 0. */
int oom_helper_reaped(pid_t pid, int status);
/* The helper's pid, 0 when there is none. */
pid_t oom_helper_pid(void);

#endif
