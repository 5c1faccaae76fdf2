/*
 * callhost: call hosts, namespace inits that serve an fncall worker's isolated execs one
 * after another instead of one init per call (docs/AGENT_PROTOCOL.md "Isolated execs").
 *
 * An isolated exec without TTY or DETACHED (every fncall call) goes to an idle call host,
 * or to a new one: a fork of the agent into fresh pid, mount, IPC and UTS namespaces, as
 * the per-call init of isolate.c is. A host makes its namespace's lasting part once (every
 * mount private and read-only, a fresh /proc with the sandbox's masks) and then, for each
 * call it is sent over its control socket (the request and the call's stdio and error
 * pipe ends, SCM_RIGHTS): a fresh IPC namespace (unshare), fresh tmpfs on /tmp, /dev/shm
 * and the SCRATCH paths and a fresh mqueue, ns_last_pid set back so the call's pids start
 * at 2 as in a new pid namespace, the call's Landlock ruleset; then it starts the command
 * (which enforces that ruleset and drops CAP_SYS_ADMIN in its own child before exec),
 * waits for it, SIGKILLs every other process of its pid namespace and reaps them all,
 * reports the command's wait status on the control socket, then removes the call's SysV
 * and POSIX IPC objects and takes a fresh IPC namespace for the next call, and unmounts
 * the call's tmpfs and mqueue through O_PATH fds of their roots taken when it mounted
 * them (fchdir and "."; no path the call could have redirected is looked up). So a call finds exactly what a fresh init
 * would give it, and what the host saves per call is the clone of a namespace init, the
 * copy and teardown of a mount namespace and the fresh /proc with its masks
 * (docs/BENCHMARKS.md "fncall-agent").
 *
 * What a call could change about the host itself (pid 1 of the call, same user): its
 * resource limits (prlimit), and where Landlock does not refuse /proc writes its
 * oom_score_adj, coredump_filter and its session's autogroup nice. The host compares them
 * after each call with their values when it became ready and retires when any changed
 * (its report carries CALLHOST_RETIRING). It keeps no signal blocked, so none stays
 * pending for a later call to read. A host serves a call only while no other exec of the
 * agent lives and the agent has no child but its hosts and the oom helper: a process
 * beside a hosted call could be handed a descriptor of the host's mount namespace and
 * would see later calls' mounts through it. The fresh /proc is mounted hidepid=invisible,
 * so a call does not see its host (non-dumpable, holding capabilities the call lacks) at
 * all: not its counters, which sum up its earlier calls' requests and resource use, nor
 * any of its /proc files.
 *
 * The exec's pid (STARTED, SIGNAL, timeouts) is the host's: the command stays in the
 * host's session and process group, so kill(-host, sig) reaches it and its group, while
 * the host, a pid namespace init, ignores every signal but SIGKILL; a SIGKILL (timeout,
 * SIGNAL 9, the connection gone) ends the host and the call with it, as with a per-call
 * init, and the next call gets a new host. A host that failed a call's setup exits
 * (after reporting on the call's error pipe). A host retires after CALLHOST_MAX_CALLS
 * calls, and idle hosts beyond CALLHOST_MAX_IDLE are retired (their control socket is
 * closed: they exit).
 */
#ifndef DSEC_AGENT_CALLHOST_H
#define DSEC_AGENT_CALLHOST_H

#include <sys/types.h>

#include "loop.h"
#include "spawn.h"

/* Calls a host serves before it retires: bounds what a long-lived namespace might
 * accumulate; a new host costs one per-call init's setup (~0.5 ms). */
#define CALLHOST_MAX_CALLS 1000
/* Idle hosts kept per agent: a worker serves one call at a time from dsecd's pools; more
 * only when one agent is driven with concurrent isolated execs. */
#define CALLHOST_MAX_IDLE 16

/* Flag of a host's report: it exits after this call (a call changed the host's own
 * limits or /proc settings, isolate.c host_state_same), so it gets no more calls. */
#define CALLHOST_RETIRING 1

struct callhost;

/* Whether the isolated exec r goes to a call host (no TTY, not DETACHED, and hosts not
 * turned off with --no-callhost). */
int callhost_wanted(const struct exec_req *r);
/* 1 unless main saw --no-callhost (every isolated exec then gets a per-call init). */
extern int g_callhost;

/* In the agent: send the call r to an idle host, or to a new one, with the child's ends
 * of its pipes (in_r may be -1: no stdin). Returns 0 with *host and *pid (the host's) set,
 * or an errno (the fds stay the caller's). */
int callhost_start(const struct exec_req *r, int in_r, int out_w, int err_w, int errfd, struct callhost **host, pid_t *pid);
/* In the agent: watch the host's control socket for the status of the call of `owner`
 * (an exec, exec.c exec_hosted_done). */
void callhost_attach(struct callhost *h, void *owner);
/* The control socket of a busy host is readable (loop.c): the status (the call is over:
 * exec_hosted_done, the host goes idle or retires) or EOF (the host is dying: reap_all
 * ends its call). */
void callhost_on_ctl(struct callhost *h);
/* A child was reaped: if it is a call host, forget it and return 1 (its call, if any, is
 * the exec with its pid, which reap_all ends with *status: the host's report when one
 * is waiting on its socket, else the host's own wait status as passed in); else 0. */
int callhost_reaped(pid_t pid, int *status);
/* Free the hosts forgotten in this loop iteration. */
void callhost_free_graveyard(void);

/* In the host, after the clone (isolate.c): read the next call from the control socket.
 * Fills *r (its strings and vectors in two allocations, mem[0] and mem[1], to free) and fds[4] (out_w, err_w, errfd, in_r or
 * -1). Returns 1, 0 on EOF (retired: the agent closed the socket), -1 on a malformed
 * request or a read error. */
int callhost_read_call(int ctl, struct exec_req *r, void *mem[2], int fds[4]);

#endif
