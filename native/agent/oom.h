/*
 * oom: every command the agent starts runs at oom_score_adj EXEC_OOM_SCORE_ADJ (+500; or
 * the agent's own value when that is higher), while the agent stays where dsecd started
 * it, so a memory cgroup's OOM kill takes a command, not the agent (the reasons and the
 * history are in oom.c). Right after each fork the child is raised, by the agent itself
 * (an agent without Landlock) or by the dsec-oom-adj helper process (a Landlocked agent
 * may not write under /proc), and the child waits until it reads raised (at most
 * OOM_RAISE_WAIT_MS) before it execs. Without the helper, or without /proc, commands
 * start at the agent's value; nothing fails.
 */
#ifndef DSEC_AGENT_OOM_H
#define DSEC_AGENT_OOM_H

#include <sys/types.h>

/* At start: read the agent's own value; commands are raised only when it is lower. */
void oom_adj_open(void);
/* At start, before Landlock and before serving: with agent_landlocked fork the
 * dsec-oom-adj helper (a socketpair only the agent holds; PR_SET_PDEATHSIG), otherwise
 * let the agent write each child's value itself. Failures are logged. */
void oom_helper_start(int agent_landlocked);
/* In the agent, just before fork(): children forked now are to wait until raised. */
void oom_before_fork(void);
/* In the agent, right after fork(): raise `child`, or ask the helper to. On failure
 * (logged) commands start at the agent's value from then on. */
void oom_raise_child(pid_t child);
/* In a child, before it execs (or forks its command): wait until it reads raised. */
void oom_wait_raised(void);
/* A child was reaped: if it is the helper, stop using it (logged) and return 1; else 0. */
int oom_helper_reaped(pid_t pid, int status);

#endif
