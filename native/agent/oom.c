/*
 * oom: commands start at a raised oom_score_adj; the dsec-oom-adj helper (oom.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#include "oom.h"
#include "util.h"

/*
 * Every command starts at oom_score_adj EXEC_OOM_SCORE_ADJ (or the agent's own value if
 * that is higher); the agent stays where dsecd started it (normally 0). A memory
 * cgroup's OOM kill takes the process with the largest badness, RSS + adj/1000 x the
 * cgroup's limit. When the charge is in no process's RSS (tmpfs or memfd pages), or a
 * second OOM comes while the first victim's memory is still being freed, the agent
 * (about 1 MiB resident, more than `head` or `sh`) was the next choice at equal adj and
 * the whole sandbox failed (seen in CI: dmesg showed `sh`, then `.dsec-agent` killed).
 * At +500 a command outranks any agent smaller than half the cgroup's limit.
 *
 * How: right after each fork the child's value is raised, and the child waits, at most
 * OOM_RAISE_WAIT_MS, until its own value reads raised (reading /proc/self is allowed)
 * before it execs, so every command starts raised; the agent's own value never changes.
 * An agent that does not restrict itself with Landlock (an fncall worker, where each
 * isolated call is restricted instead; --landlock off; a kernel without it) writes the
 * child's /proc/<pid>/oom_score_adj itself. A Landlocked one cannot: Landlock denies it
 * writes under /proc, as it does every command it starts. Raising the agent's own value around fork() (children copy it) left the agent
 * at +500 for the length of each fork, and a fork while an earlier command's orphan kept
 * the cgroup at its limit made the fork's own allocation kill the agent (seen in CI:
 * `.dsec-agent invoked oom-killer ... oom_score_adj=500`, then the agent killed). So a
 * helper process does it: forked once at start, before Landlock (oom_helper_start), it
 * reads child pids from a socketpair only the agent holds and raises each one's value
 * (raising needs no privilege); after each fork the agent sends it the child's pid. It
 * is one more process in the sandbox (~100 KiB of its own). A command may lower itself back to the agent's value (not below:
 * the kernel's oom_score_adj_min), or kill the helper (same uid; it is not dumpable, so
 * it cannot be ptraced), which only hurts its own sandbox: from then on commands start
 * at the agent's value, as they do when the helper could not be started. On the host the
 * same value puts sandbox commands ahead of host daemons in a global OOM, the order an
 * operator wants. Without /proc at start (a guest before its mounts) nothing changes.
 */
#define EXEC_OOM_SCORE_ADJ 500
/* How long a child waits for the helper to raise it before it execs anyway: 1 s. The
 * helper takes ~0.1 ms on an idle host, but it is one more runnable process in the
 * sandbox's cgroup, and on a loaded host (two test files running beside each other on 2
 * cores) it was seen to need more than 20 ms. The wait ends as soon as the value reads
 * raised; the bound is only paid in full when the helper died and the agent has not yet
 * reaped it (from then on no child waits). */
#define OOM_RAISE_WAIT_MS 1000
static int g_oom_enabled;   /* commands are to start raised (the agent's value is lower) */
static int g_oom_direct;    /* the agent is not Landlocked: it writes each child's value itself */
static int g_oomh_fd = -1;  /* the agent's end of the socketpair to the helper, or -1 */
static pid_t g_oomh_pid;   /* the helper's pid, 0 when none */
static int g_oom_child_wait; /* set in a child forked while the helper was up */

/* Reads this process's oom_score_adj into *v. Returns 0, or -1 when /proc cannot tell (not mounted). */
static int own_oom_adj(int *v)
{
	int fd = open("/proc/self/oom_score_adj", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	char buf[16] = { 0 };
	ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
	close(fd);
	if (n <= 0)
		return -1;
	*v = atoi(buf);
	return 0;
}

/* At start: the agent's own value decides whether commands are raised at all. */
void oom_adj_open(void)
{
	int v;
	if (own_oom_adj(&v) == 0)
		g_oom_enabled = v < EXEC_OOM_SCORE_ADJ; /* else commands inherit a value already as high */
}

/* The helper: raise every pid read from fd 3 to EXEC_OOM_SCORE_ADJ, until the agent is gone. */
static void __attribute__((noreturn)) oom_helper_main(void)
{
	char v[16];
	int vlen = snprintf(v, sizeof v, "%d", EXEC_OOM_SCORE_ADJ);
	for (;;) {
		int32_t pid;
		ssize_t n = read(3, &pid, sizeof pid);
		if (n < 0 && errno == EINTR)
			continue;
		if (n != (ssize_t)sizeof pid)
			_exit(0); /* the agent closed its end */
		if (pid <= 0)
			continue;
		char path[48];
		snprintf(path, sizeof path, "/proc/%d/oom_score_adj", (int)pid);
		int fd = open(path, O_WRONLY | O_CLOEXEC);
		if (fd < 0)
			continue; /* it exited already */
		if (write(fd, v, (size_t)vlen) < 0) { /* raced its exit: nothing to do */ }
		close(fd);
	}
}

/* At start, before Landlock and before serving. An agent that will not restrict itself
 * with Landlock (an fncall worker, --landlock off, a kernel without it) writes each
 * child's value itself; only a Landlocked one needs the helper (see above). */
void oom_helper_start(int agent_landlocked)
{
	if (!g_oom_enabled)
		return;
	if (!agent_landlocked) {
		g_oom_direct = 1;
		return;
	}
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
		logf_("oom_score_adj helper: socketpair: %s; commands start at the agent's value", strerror(errno));
		return;
	}
	pid_t agent = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		logf_("oom_score_adj helper: fork: %s; commands start at the agent's value", strerror(errno));
		close(sv[0]);
		close(sv[1]);
		return;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
		if (getppid() != agent)
			_exit(0);
		prctl(PR_SET_NAME, "dsec-oom-adj", 0, 0, 0);
		prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
		/* Only its socket (as fd 3) and the agent's log (stderr) stay open. */
		if (dup2(sv[1], 3) < 0)
			_exit(1);
		syscall(SYS_close_range, 4u, ~0u, 0u);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		oom_helper_main();
	}
	close(sv[1]);
	set_nonblock(sv[0]);
	g_oomh_fd = sv[0];
	g_oomh_pid = pid;
}

void oom_before_fork(void)
{
	g_oom_child_wait = g_oomh_fd >= 0 || g_oom_direct;
}

/* In the agent, right after fork(): raise `child`, or ask the helper to. */
void oom_raise_child(pid_t child)
{
	if (g_oom_direct) {
		char path[48], v[16];
		snprintf(path, sizeof path, "/proc/%d/oom_score_adj", (int)child);
		int vlen = snprintf(v, sizeof v, "%d", EXEC_OOM_SCORE_ADJ);
		int fd = open(path, O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, v, (size_t)vlen) < 0) {
			logf_("oom_score_adj: %s: %s; commands start at the agent's value from now on", path, strerror(errno));
			g_oom_direct = 0;
		}
		if (fd >= 0)
			close(fd);
		return;
	}
	if (g_oomh_fd < 0)
		return;
	int32_t p = (int32_t)child;
	if (send(g_oomh_fd, &p, sizeof p, MSG_NOSIGNAL) != (ssize_t)sizeof p && errno != EAGAIN) {
		logf_("oom_score_adj helper: send: %s; commands start at the agent's value from now on", strerror(errno));
		close(g_oomh_fd);
		g_oomh_fd = -1;
	}
}

/* The helper was reaped: stop using it. */
static void oom_helper_gone(pid_t pid, int status)
{
	if (pid != g_oomh_pid || !g_oomh_pid)
		return;
	logf_("oom_score_adj helper pid=%d exited (status 0x%x); commands start at the agent's value from now on", (int)pid, status);
	if (g_oomh_fd >= 0)
		close(g_oomh_fd);
	g_oomh_fd = -1;
	g_oomh_pid = 0;
}

int oom_helper_reaped(pid_t pid, int status)
{
	if (!g_oomh_pid || pid != g_oomh_pid)
		return 0;
	oom_helper_gone(pid, status);
	return 1;
}

/* In a child, before it execs (or forks its command): wait until the helper raised it. */
void oom_wait_raised(void)
{
	if (!g_oom_child_wait)
		return;
	g_oom_child_wait = 0; /* once per child (an isolated call's command inherits it) */
	uint64_t until = mono_ns() + (uint64_t)OOM_RAISE_WAIT_MS * 1000000ull;
	for (int i = 0;; i++) {
		int v;
		if (own_oom_adj(&v) < 0 || v >= EXEC_OOM_SCORE_ADJ || mono_ns() >= until)
			return;
		if (i < 8) {
			sched_yield();
		} else {
			struct timespec ts = { 0, 50000 };
			nanosleep(&ts, NULL);
		}
	}
}
