/*
 * dsec-agent: the in-sandbox agent (PID 1 of every container sandbox, and the init of
 * every VM guest). This file is its main: the flags, the order of the start-up steps,
 * and the loop's start and end.
 *
 * It serves the dsec agent protocol (version 1, see docs/AGENT_PROTOCOL.md) on an
 * inherited, already-listening AF_UNIX SOCK_STREAM socket, or, in a VM guest, on the
 * streams of the mux on a virtio-serial port (guest.c):
 *
 *     dsec-agent --listen-fd N [--sched-idle] [--core-sched] [--worker [--no-callhost]] [--landlock [--writable PATH]...]
 *     dsec-agent (--vmux PORT | --vmux-fd N) [--guest-confine] [...]
 *     dsec-agent --landlock-abi
 *
 * Priority flags (applied once at start, before the first connection is accepted, and
 * inherited by every process the agent forks; see docs/AGENT_PROTOCOL.md, "Agent flags"):
 *   --sched-idle  lower the agent's RLIMIT_NICE to 0 (soft and hard) and switch it to
 *                 SCHED_IDLE: a batch sandbox. Failure is fatal (exit 1): a batch sandbox
 *                 silently running at normal priority would hurt its latency neighbours.
 *   --core-sched  give the agent's thread group a core-scheduling cookie of its own
 *                 (PR_SCHED_CORE_CREATE): no task outside the sandbox shares an SMT core
 *                 with its tasks at the same time. On a kernel without core scheduling
 *                 (EINVAL: not compiled in; ENODEV: no SMT) it logs one line and continues.
 *   --worker      an fncall worker: the spec granted CAP_SYS_ADMIN for isolated execs; the
 *                 agent drops it from its bounding set at start (no exec'd program can
 *                 ever hold it) and logs per-exec lines only for failures. Fatal (exit 1)
 *                 if it cannot isolate. Every process it starts installs a second seccomp
 *                 filter (worker_filter_install) that denies mount, mount_setattr and umount2,
 *                 the three syscalls runc's filter leaves to a worker's agent.
 *   --landlock    restrict file access with Landlock (see "Landlock" below): the agent
 *                 itself at start, or, with --worker, each isolated call after its
 *                 mounts; --writable PATH (repeatable) names the places left writable.
 *                 A kernel without Landlock is logged and reported in HELLO; any other
 *                 failure to apply it is fatal (exit 1).
 *   --landlock-abi  print the kernel's Landlock ABI as JSON and exit (for dsecd).
 *
 * Lifecycle contracts:
 *   - As PID 1 it never exits: SIGTERM/SIGINT/SIGHUP are blocked (consumed through a
 *     signalfd and logged) and every child is reaped, including orphans it did not spawn.
 *   - When not PID 1 (tests, or a guest agent run under another init) it marks itself a
 *     child subreaper, so orphans of its execs are still reaped by it, and it exits on
 *     SIGTERM/SIGINT after SIGKILLing the process groups of its running execs.
 *   - Every fd it owns is close-on-exec; PR_SET_DUMPABLE is 0 so sandbox code cannot
 *     open /proc/1/fd or ptrace it.
 *   - One thread, one epoll loop, level-triggered. Nothing in the loop blocks on a peer:
 *     sockets and the parent ends of exec pipes are non-blocking, and outbound data is
 *     queued per connection with a 4 MiB high-water mark (see OUTQ_HIGH).
 *
 * Isolated execs (EXEC ISOLATE, feature "isolate"): the exec runs under a namespace init
 * in fresh pid/mount/IPC/UTS namespaces with fresh tmpfs mounts, so nothing of it survives
 * the call; see isolate.c and docs/AGENT_PROTOCOL.md.
 *
 * Besides execs (pipes or a pseudo-terminal, optionally detached from the connection) it
 * serves file operations (read, write, stat, list, mkdir, remove, symlink) inside the
 * sandbox's mount namespace as a given user: the agent switches its fsuid/fsgid and
 * supplementary groups around each step (cred_enter/cred_leave) and always restores them.
 *
 * Logging: one line per event on fd 2, "<RFC 3339 UTC timestamp> dsec-agent[pid]: msg".
 *
 * Built with: gcc -static -O2 -Wall -Wextra (plain libc, no NSS: /etc/passwd and
 * /etc/group of the sandbox are parsed directly).
 *
 * The units, each with a header stating its contract (from the bottom up):
 *   util      the log, the clock, big-endian integers, allocation, fd flags, small files
 *   proto     the wire format: frame header, frame types, TLV tags, the TLV reader
 *   loop      the epoll loop, its watches, the signalfd and the timers
 *   conn      connections: frame I/O (queue, flush, backpressure) and inbound dispatch
 *   exec      exec streams: EXEC requests, STARTED, output, stdin, signals, timeouts, EXIT
 *   spawn     exec start: pipes or a pty, the child (clone with CLONE_VM|CLONE_VFORK) up to execve
 *   user      users and groups from the sandbox's /etc/passwd and /etc/group
 *   files     file operations as a user, streamed reads and lists, atomic writes
 *   landlock  the Landlock ruleset and where it is applied
 *   confine   capabilities, the worker's seccomp filter, a VM guest's confinement
 *   oom       commands start at a raised oom_score_adj (the dsec-oom-adj helper)
 *   isolate   the namespace init of an isolated exec, and a call host's loop (fncall workers)
 *   callhost  call hosts: namespace inits serving a worker's calls one after another
 *   guest     the VM transport's wiring: vmux.c (the mux), damon.c (guest reclaim)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "confine.h"
#include "conn.h"
#include "exec.h"
#include "files.h"
#include "guest.h"
#include "callhost.h"
#include "isolate.h"
#include "landlock.h"
#include "loop.h"
#include "oom.h"
#include "proto.h"
#include "spawn.h"
#include "util.h"

/* Core scheduling (Linux 5.14, <linux/prctl.h>); values are the kernel ABI. */
#ifndef PR_SCHED_CORE
#define PR_SCHED_CORE 62
#endif
#ifndef PR_SCHED_CORE_CREATE
#define PR_SCHED_CORE_CREATE 1
#endif
#ifndef PR_SCHED_CORE_SCOPE_THREAD_GROUP
#define PR_SCHED_CORE_SCOPE_THREAD_GROUP 1 /* PIDTYPE_TGID */
#endif

/* An int SOL_SOCKET option of fd, or -1 if it cannot be read. */
static int sock_opt(int fd, int opt)
{
	int v = 0;
	socklen_t vl = sizeof v;
	return getsockopt(fd, SOL_SOCKET, opt, &v, &vl) < 0 ? -1 : v;
}

static void usage(void)
{
	fprintf(stderr, "usage: " AGENT_NAME " (--listen-fd N | --vmux PORT | --vmux-fd N) [--sched-idle] [--core-sched] [--worker] [--landlock [--writable PATH]...] [--guest-confine]\n"
			"  --listen-fd N: an inherited, listening AF_UNIX SOCK_STREAM socket\n"
			"  --vmux PORT: a VM guest: serve the stream mux on this virtio-serial port (e.g. /dev/virtio-ports/dsec.agent)\n"
			"  --vmux-fd N: the stream mux on an inherited fd (tests: a socketpair end)\n"
			"  --sched-idle: run as SCHED_IDLE with RLIMIT_NICE 0 (a batch sandbox; inherited by every exec)\n"
			"  --core-sched: own core-scheduling cookie for the agent and its execs (skipped if the kernel lacks it)\n"
			"  --worker: an fncall worker: keep CAP_SYS_ADMIN for isolated execs only (dropped from the bounding set)\n"
			"  --no-callhost: a namespace init per isolated exec instead of call hosts that serve one call after another\n"
			"  --landlock: restrict file access with Landlock (the agent at start; a worker: each isolated call)\n"
			"  --writable PATH: a place Landlock leaves fully writable, repeatable (absolute, at most %d)\n"
			"  --guest-confine: (a microVM guest) refuse execs until dsecd sent the confinement of commands (vmux op CONFINE)\n"
			"  --landlock-abi: print {\"abi\":N} (N = 0: no Landlock, with \"reason\") and exit\n", LL_MAX_WRITABLE);
}

/*
 * --sched-idle. RLIMIT_NICE goes to 0 first (soft and hard; lowering needs no privilege):
 * the kernel lets an unprivileged task leave SCHED_IDLE for SCHED_OTHER/SCHED_BATCH only
 * when RLIMIT_NICE would permit nice 0 (rlimit >= 20 - nice, so any limit >= 1 can open a
 * way out); otherwise it needs CAP_SYS_NICE in the initial user namespace, which no
 * sandbox process has. Raising the hard limit again needs CAP_SYS_RESOURCE there too.
 * Returns -1 (logged) on failure.
 */
static int sched_idle_setup(void)
{
	struct rlimit nl = { 0, 0 };
	if (setrlimit(RLIMIT_NICE, &nl) < 0) {
		logf_("fatal: setrlimit(RLIMIT_NICE, 0): %s", strerror(errno));
		return -1;
	}
	struct sched_param sp = { .sched_priority = 0 };
	if (sched_setscheduler(0, SCHED_IDLE, &sp) < 0) {
		logf_("fatal: sched_setscheduler(SCHED_IDLE): %s", strerror(errno));
		return -1;
	}
	return 0;
}

/* --core-sched: a new cookie for our own thread group (pid 0 = us), inherited across fork.
 * Best effort: logs exactly one line either way and never fails the agent. */
static void core_sched_setup(void)
{
	if (prctl(PR_SCHED_CORE, PR_SCHED_CORE_CREATE, 0, PR_SCHED_CORE_SCOPE_THREAD_GROUP, 0) == 0) {
		logf_("core scheduling: own cookie for pid %d and its children", (int)getpid());
		return;
	}
	int e = errno;
	if (e == EINVAL || e == ENODEV)
		logf_("core scheduling unavailable (prctl(PR_SCHED_CORE_CREATE): %s, errno %d: %s); continuing without a cookie",
		      e == EINVAL ? "EINVAL" : "ENODEV", e, e == EINVAL ? "not in this kernel" : "no SMT siblings");
	else
		logf_("core scheduling failed (prctl(PR_SCHED_CORE_CREATE): errno %d: %s); continuing without a cookie", e,
		      strerror(e));
}

int main(int argc, char **argv)
{
	long listen_fd = -1, vmux_fd = -1;
	const char *vmux_path = NULL;
	int sched_idle = 0, core_sched = 0, worker = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *val = NULL;
		if (strcmp(a, "--sched-idle") == 0) {
			sched_idle = 1;
			continue;
		}
		if (strcmp(a, "--core-sched") == 0) {
			core_sched = 1;
			continue;
		}
		if (strcmp(a, "--guest-confine") == 0) {
			guest_confine_require();
			continue;
		}
		if (strcmp(a, "--worker") == 0) {
			worker = 1;
			continue;
		}
		if (strcmp(a, "--no-callhost") == 0) {
			g_callhost = 0;
			continue;
		}
		if (strcmp(a, "--landlock") == 0) {
			g_landlock = 1;
			continue;
		}
		if (strcmp(a, "--landlock-abi") == 0) {
			landlock_probe();
			if (g_landlock_abi)
				printf("{\"abi\":%d}\n", g_landlock_abi);
			else
				printf("{\"abi\":0,\"reason\":\"%s\"}\n", g_landlock_why);
			return 0;
		}
		if (strcmp(a, "--writable") == 0 || strncmp(a, "--writable=", 11) == 0) {
			const char *w = a[10] == '=' ? a + 11 : i + 1 < argc ? argv[++i] : NULL;
			if (!w || w[0] != '/' || g_nwritable == LL_MAX_WRITABLE) {
				usage();
				return 2;
			}
			g_writable[g_nwritable++] = w;
			continue;
		}
		if (strcmp(a, "--vmux") == 0 && i + 1 < argc && argv[i + 1][0] == '/') {
			vmux_path = argv[++i];
			continue;
		}
		long *dst = &listen_fd;
		if (strcmp(a, "--vmux-fd") == 0 && i + 1 < argc) {
			val = argv[++i];
			dst = &vmux_fd;
		} else if (strcmp(a, "--listen-fd") == 0 && i + 1 < argc)
			val = argv[++i];
		else if (strncmp(a, "--listen-fd=", 12) == 0)
			val = a + 12;
		else if (strcmp(a, "--version") == 0) {
			printf(AGENT_NAME " " AGENT_VERSION " (protocol %u)\n", PROTOCOL_VERSION);
			return 0;
		} else {
			usage();
			return 2;
		}
		char *end;
		errno = 0;
		*dst = strtol(val, &end, 10);
		if (errno || *end || end == val || *dst < 0 || *dst > INT_MAX) {
			usage();
			return 2;
		}
	}
	/* Exactly one transport. */
	if ((listen_fd >= 0) + (vmux_fd >= 0) + (vmux_path != NULL) != 1) {
		usage();
		return 2;
	}
	g_is_pid1 = getpid() == 1;
	oom_adj_open();

	/* fds 0-2 must be open so no pipe or socket of ours ever lands on them. */
	for (int fd = 0; fd < 3; fd++)
		if (fcntl(fd, F_GETFD) < 0) {
			int n = open("/dev/null", O_RDWR);
			if (n >= 0 && n != fd) {
				dup2(n, fd);
				close(n);
			}
		}

	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	if (!g_is_pid1)
		prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);

	/* Priority class: before the listening socket is served, so no exec ever starts
	 * outside it (children inherit the policy, RLIMIT_NICE and the core cookie). */
	if (sched_idle && sched_idle_setup() < 0)
		return 1;
	if (core_sched)
		core_sched_setup();
	if (worker && worker_setup() < 0)
		return 1;
	g_quiet_execs = worker;
	g_worker_filter = worker;

	int lfd = (int)listen_fd;
	if (lfd >= 0 && sock_opt(lfd, SO_ACCEPTCONN) <= 0) {
		logf_("fatal: fd %d is not a listening socket", lfd);
		return 1;
	}
	if (lfd >= 0 && sock_opt(lfd, SO_DOMAIN) != AF_UNIX) {
		logf_("fatal: fd %d is not an AF_UNIX socket", lfd);
		return 1;
	}
	if (lfd >= 0 && sock_opt(lfd, SO_TYPE) != SOCK_STREAM) {
		logf_("fatal: fd %d is not a SOCK_STREAM socket", lfd);
		return 1;
	}
	cloexec_from(3);
	if (lfd >= 0) {
		set_cloexec(lfd);
		set_nonblock(lfd);
	}

	/* What the units record before anything is served: the identity file operations
	 * return to (files.c), the RLIMIT_NOFILE and signal dispositions children get back
	 * (spawn.c); then the loop, and /dev/null for execs without STDIN. */
	files_init();
	spawn_raise_nofile();
	spawn_record_signals();
	if (loop_open() < 0)
		return 1;
	spawn_open_devnull();
	spawn_map_stack();
	if (lfd >= 0 && conn_listen(lfd) < 0) {
		logf_("fatal: epoll_ctl: %s", strerror(errno));
		return 1;
	}
	/* A VM guest: connections are the streams of the mux on the port (guest.c). */
	if (lfd < 0 && guest_transport_start(vmux_path, (int)vmux_fd) < 0)
		return 1;
	isolate_probe();
	if (worker && !g_isolate) {
		logf_("fatal: --worker: isolated execs are unavailable: %s", g_isolate_why);
		return 1;
	}
	/* Landlock last, once everything the agent opens for itself is open: from here on
	 * the agent (ordinary sandbox) or each isolated call (worker) is restricted. */
	landlock_probe(); /* also without --landlock: HELLO reports the kernel's ABI either way */
	/* Before Landlock: the helper must be free to write other processes' /proc files. */
	oom_helper_start(g_landlock && !worker && g_landlock_abi);
	if (g_landlock) {
		if (worker) {
			if (g_landlock_abi) {
				g_landlock_scope = "isolated_execs";
				logf_("landlock: ABI %d, applied by each isolated call after its mounts", g_landlock_abi);
			} else {
				logf_("landlock unavailable: %s; isolated calls are not restricted by it", g_landlock_why);
			}
		} else if (landlock_self_setup() < 0) {
			return 1;
		}
	}
	char transport[PATH_MAX + 16];
	if (lfd >= 0)
		snprintf(transport, sizeof transport, "listen-fd=%d", lfd);
	else if (vmux_path)
		snprintf(transport, sizeof transport, "vmux=%s", vmux_path);
	else
		snprintf(transport, sizeof transport, "vmux-fd=%ld", vmux_fd);
	logf_("started version=" AGENT_VERSION " protocol=%u %s pid1=%s sched=%s isolate=%s landlock=%s", PROTOCOL_VERSION, transport,
	      g_is_pid1 ? "yes" : "no", sched_idle ? "idle" : "other", g_isolate ? "yes" : "no", g_landlock_scope);
	if (!g_isolate)
		logf_("isolated execs unavailable: %s", g_isolate_why);
	reap_all(); /* children that existed before we exec'd, if any */

	if (loop_run())
		return 1;
	shutdown_execs();
	logf_("exiting");
	return 0;
}
