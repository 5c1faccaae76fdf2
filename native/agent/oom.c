/*
 * oom: commands start at a raised oom_score_adj; the dsec-oom-adj helper (oom.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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
 * How: an exec child (clone with CLONE_VM | CLONE_VFORK, spawn.h) raises itself before
 * it execs, so every command starts raised; the agent's own value never changes. While it
 * shares the agent's memory the child still has a value of its own: the kernel does not
 * pass a write to a vfork child's value on to the other users of its memory (fs/proc/
 * base.c, __set_oom_adj skips tasks with vfork_done), and never picks a task in vfork as
 * the OOM victim (mm/oom_kill.c, oom_badness: in_vfork), so the child puts the agent at no
 * risk. An agent that does not restrict itself with Landlock (an fncall worker, where each
 * isolated call is restricted instead; --landlock off; a kernel without it) has children
 * that may write /proc/self/oom_score_adj: each does. A Landlocked one cannot: Landlock
 * denies the agent and everything it starts writes under /proc. Raising the agent's own
 * value around the start of a child (children copy it) left the agent at +500 for that
 * time, and a fork while an earlier command's orphan kept the cgroup at its limit made
 * the fork's own allocation kill the agent (seen in CI: `.dsec-agent invoked oom-killer
 * ... oom_score_adj=500`, then the agent killed). So a helper process does it: forked once
 * at start, before Landlock (oom_helper_start), it reads pids from a socketpair (the
 * agent's end is inherited by each exec child and closed at its exec) and raises each
 * one's value (raising needs no privilege). The child sends its own pid first thing, does
 * the rest of its setup meanwhile, and before its seccomp filters and execve waits, at
 * most OOM_RAISE_WAIT_MS from the send, until its value reads raised (reading /proc/self
 * is allowed, after the user switch too). The agent is suspended while its child waits
 * (CLONE_VFORK): ~0.1 ms on an idle host. An isolated
 * exec's namespace init is a fork, not a vfork child: the agent raises it (or sends its
 * pid to the helper) right after the fork, and the init waits the same way before it
 * starts its command, which inherits the value. The helper is one more process in the
 * sandbox (~100 KiB of its own). A command may lower itself back to the agent's value (not below:
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
static int g_oom_child_wait; /* set in a namespace init forked while raising was on */

/* Reads this process's oom_score_adj into *v. Returns 0, or -1 when /proc cannot tell (not
 * mounted). Only system calls: it runs in exec children sharing the agent's memory. */
static int own_oom_adj(int *v)
{
	int fd = open("/proc/self/oom_score_adj", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	char buf[16];
	ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
	close(fd);
	if (n <= 0)
		return -1;
	int neg = buf[0] == '-', x = 0;
	for (ssize_t i = neg; i < n && buf[i] >= '0' && buf[i] <= '9'; i++)
		x = x * 10 + (buf[i] - '0');
	*v = neg ? -x : x;
	return 0;
}

/* Spin, then sleep in 50 us steps, until this process's value reads raised or `until`
 * (CLOCK_MONOTONIC ns) has passed. Only system calls. */
static void wait_raised_until(uint64_t until)
{
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

/* In the agent, right after forking a namespace init: raise it, or ask the helper to. */
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

pid_t oom_helper_pid(void)
{
	return g_oomh_pid;
}

int oom_helper_reaped(pid_t pid, int status)
{
	if (!g_oomh_pid || pid != g_oomh_pid)
		return 0;
	oom_helper_gone(pid, status);
	return 1;
}

/* In the forked namespace init, before it starts its command: wait until raised. */
void oom_wait_raised(void)
{
	if (!g_oom_child_wait)
		return;
	g_oom_child_wait = 0; /* the init's own copy: once */
	wait_raised_until(mono_ns() + (uint64_t)OOM_RAISE_WAIT_MS * 1000000ull);
}

void oom_child_prepare(struct oom_child *o)
{
	o->err = 0;
	o->sent = 0;
	o->until_ns = 0;
	o->fd = g_oomh_fd;
	o->mode = g_oom_direct ? OOM_CHILD_SELF : g_oomh_fd >= 0 ? OOM_CHILD_HELPER : OOM_CHILD_NONE;
}

/* The value as text: "500". */
#define OOM_VALUE_TEXT "500"
_Static_assert(EXEC_OOM_SCORE_ADJ == 500, "OOM_VALUE_TEXT must spell EXEC_OOM_SCORE_ADJ");

void oom_child_start(struct oom_child *o)
{
	if (o->mode == OOM_CHILD_SELF) {
		int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
		if (fd < 0 || write(fd, OOM_VALUE_TEXT, sizeof OOM_VALUE_TEXT - 1) < 0)
			o->err = errno ? errno : EIO;
		if (fd >= 0)
			close(fd);
		return;
	}
	if (o->mode != OOM_CHILD_HELPER)
		return;
	o->until_ns = mono_ns() + (uint64_t)OOM_RAISE_WAIT_MS * 1000000ull;
	int32_t pid = (int32_t)getpid();
	for (;;) {
		if (send(o->fd, &pid, sizeof pid, MSG_NOSIGNAL) == (ssize_t)sizeof pid) {
			o->sent = 1;
			return;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN) { /* the helper is gone: the agent stops using it */
			o->err = errno;
			return;
		}
		/* Its queue is full (the socket is non-blocking: the agent's end): wait for room. */
		uint64_t now = mono_ns();
		if (now >= o->until_ns)
			return;
		struct pollfd pfd = { .fd = o->fd, .events = POLLOUT };
		poll(&pfd, 1, (int)((o->until_ns - now) / 1000000ull) + 1);
	}
}

void oom_child_wait(const struct oom_child *o)
{
	if (o->mode == OOM_CHILD_HELPER && o->sent)
		wait_raised_until(o->until_ns);
}

void oom_child_done(const struct oom_child *o)
{
	if (!o->err)
		return;
	if (o->mode == OOM_CHILD_SELF) {
		logf_("oom_score_adj: /proc/self/oom_score_adj of an exec child: %s; commands start at the agent's value from now on",
		      strerror(o->err));
		g_oom_direct = 0;
	} else if (o->mode == OOM_CHILD_HELPER && g_oomh_fd == o->fd) {
		logf_("oom_score_adj helper: send: %s; commands start at the agent's value from now on", strerror(o->err));
		close(g_oomh_fd);
		g_oomh_fd = -1;
	}
}
