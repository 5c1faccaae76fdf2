/*
 * spawn: pipes or pty, the spawn plan, the CLONE_VM child up to execve (spawn.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <linux/capability.h>

#include "callhost.h"
#include "confine.h"
#include "isolate.h"
#include "landlock.h"
#include "oom.h"
#include "spawn.h"
#include "user.h"
#include "util.h"

#ifndef TIOCGPTPEER
#define TIOCGPTPEER _IO('T', 0x41)
#endif

#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

int g_worker_filter;
static int g_devnull = -1;             /* /dev/null, read-only: stdin of an exec without STDIN */
static struct rlimit g_orig_nofile;    /* RLIMIT_NOFILE as the agent found it */
/* Signals whose disposition was not SIG_DFL once the agent had set itself up; every exec
 * child resets exactly these (child_reset_signals). */
static int g_sig_nondefault[64];
static int g_nsig_nondefault;

/* ---- the child side of an exec ---------------------------------------------------- */

void child_report(int errfd, int stage, int err, const char *text)
{
	unsigned char b[8 + CHILD_REPORT_TEXT];
	int32_t v[2] = { stage, err };
	memcpy(b, v, 8);
	size_t n = text ? strnlen(text, CHILD_REPORT_TEXT) : 0;
	if (n)
		memcpy(b + 8, text, n);
	ssize_t w = write(errfd, b, 8 + n);
	(void)w;
}

void child_fail(int errfd, int stage, int err)
{
	child_report(errfd, stage, err, NULL);
	_exit(127);
}

/* The PATH the search uses: the env's, or the default. */
static const char *plan_path(char **envp)
{
	for (char **e = envp; *e; e++)
		if (strncmp(*e, "PATH=", 5) == 0)
			return *e + 5;
	return DEFAULT_PATH;
}

/* setgroups, setgid, setuid as raw system calls: libc's wrappers may look at the thread
 * list (to apply the change to every thread), which the child shares with the agent. */
static void child_set_user(const struct spawn_plan *pl)
{
	int errfd = pl->errfd;
	if (pl->user_stage)
		child_fail(errfd, pl->user_stage, pl->user_stage == ST_SETUP ? ENOMEM : ENOENT);
	if (pl->cr.noop)
		return;
	if (syscall(SYS_setgroups, (size_t)pl->cr.ngroups, pl->cr.groups) < 0)
		child_fail(errfd, ST_SETGROUPS, errno);
	if (syscall(SYS_setgid, (gid_t)pl->cr.gid) < 0)
		child_fail(errfd, ST_SETGID, errno);
	if (syscall(SYS_setuid, (uid_t)pl->cr.uid) < 0)
		child_fail(errfd, ST_SETUID, errno);
}

/* A file with no #! line: run it with /bin/sh, as execvp does. */
static void exec_script(const struct spawn_plan *pl, const char *path)
{
	pl->script_argv[1] = (char *)path;
	execve("/bin/sh", pl->script_argv, pl->envp);
}

/* execvpe semantics, but PATH comes from the request's env (the plan's envp), not the
 * agent's. */
static void child_exec(const struct spawn_plan *pl)
{
	char **argv = pl->r->argv, **envp = pl->envp;
	int errfd = pl->errfd;
	const char *file = argv[0];
	if (!*file)
		child_fail(errfd, ST_EXEC, ENOENT);
	if (strchr(file, '/')) {
		execve(file, argv, envp);
		int err = errno;
		if (err == ENOEXEC)
			exec_script(pl, file);
		child_fail(errfd, ST_EXEC, err);
	}
	const char *path = plan_path(envp);
	char *buf = pl->pathbuf;
	size_t flen = strlen(file);
	int seen_eacces = 0;
	const char *p = path;
	for (;;) {
		const char *colon = strchr(p, ':');
		size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
		if (dlen == 0) {
			memcpy(buf, file, flen + 1); /* empty element = current directory */
		} else {
			memcpy(buf, p, dlen);
			buf[dlen] = '/';
			memcpy(buf + dlen + 1, file, flen + 1);
		}
		execve(buf, argv, envp);
		switch (errno) {
		case EACCES:
			seen_eacces = 1;
			break;
		case ENOENT:
		case ENOTDIR:
		case ESTALE:
		case ENODEV:
		case ETIMEDOUT:
		case ELOOP:
		case ENAMETOOLONG:
			break;
		case ENOEXEC:
			exec_script(pl, buf);
			child_fail(errfd, ST_EXEC, ENOEXEC);
			break;
		default:
			child_fail(errfd, ST_EXEC, errno);
		}
		if (!colon)
			break;
		p = colon + 1;
	}
	child_fail(errfd, ST_EXEC, seen_eacces ? EACCES : ENOENT);
}

/* The first half of an exec child: its own session (so its process group id is
 * its pid: SIGNAL and timeouts reach the whole group) and its stdio on fds 0-2. For an
 * isolated exec this runs in the namespace init, and the command inherits both (a call
 * host's command, callhost.c, puts only its stdio in place: it stays in the host's
 * session and process group). */
void child_stdio(const struct exec_req *r, int in_r, int out_w, int err_w, int errfd)
{
	if (setsid() < 0)
		child_fail(errfd, ST_SETUP, errno);
	child_dup_stdio(r, in_r, out_w, err_w, errfd);
}

void child_dup_stdio(const struct exec_req *r, int in_r, int out_w, int err_w, int errfd)
{
	if (r->tty) {
		/* The slave becomes stdin/stdout/stderr and, as the first tty this new session
		 * leader acquires explicitly, its controlling terminal. */
		if (dup2(in_r, 0) < 0 || dup2(in_r, 1) < 0 || dup2(in_r, 2) < 0)
			child_fail(errfd, ST_SETUP, errno);
		if (ioctl(0, TIOCSCTTY, 0) < 0)
			child_fail(errfd, ST_SETUP, errno);
		return;
	}
	/* Move the stdio ends into place. Every source fd is >= 3 (fds 0-2 are always open
	 * in the agent), so dup2 cannot clobber a source before it is used. */
	int src_in = in_r >= 0 ? in_r : g_devnull;
	int empty[2] = { -1, -1 };
	if (src_in < 0) { /* no /dev/null in this sandbox: an empty pipe reads as EOF */
		if (pipe(empty) < 0)
			child_fail(errfd, ST_SETUP, errno);
		close(empty[1]);
		src_in = empty[0];
	}
	if (dup2(src_in, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)
		child_fail(errfd, ST_SETUP, errno);
}

/* Default dispositions (the agent ignores SIGPIPE, and may have inherited other
 * non-default ones), then an empty mask. Only the signals found non-default at start are
 * reset (g_sig_nondefault): the agent never changes a disposition afterwards, and this
 * saves ~60 system calls per exec. */
void child_reset_signals(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = SIG_DFL;
	for (int i = 0; i < g_nsig_nondefault; i++)
		sigaction(g_sig_nondefault[i], &sa, NULL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
}

/* The second half: signals, working directory, confinement, user, limits, fds, the oom
 * wait, execve. */
static void __attribute__((noreturn)) child_run(struct spawn_plan *pl)
{
	const struct exec_req *r = pl->r;
	int errfd = pl->errfd;
	child_reset_signals();
	if (chdir(r->cwd) < 0)
		child_fail(errfd, ST_CHDIR, errno);
	if (guest_confine_applied()) {
		int err = guest_confine_child_caps();
		if (err)
			child_fail(errfd, ST_SETUP, err);
	}
	child_set_user(pl);

	/* The agent's raised fd limit is not the sandbox's business. */
	setrlimit(RLIMIT_NOFILE, &g_orig_nofile);
	/* Everything the agent owns is already CLOEXEC; make sure nothing else leaks.
	 * errfd must survive until execve, and CLOEXEC closes it exactly then. */
	cloexec_from(3);
	/* Before the filters, which may refuse the open of /proc/self (a guest's rules). */
	oom_child_wait(&pl->oom);
	if (g_worker_filter && worker_filter_install() < 0)
		child_fail(errfd, ST_SETUP, errno);
	if (guest_confine_applied()) {
		int err = guest_confine_child_filter();
		if (err)
			child_fail(errfd, ST_SETUP, err);
	}
	child_exec(pl);
	_exit(127);
}

/* The entry of an exec child (clone's fn). */
static int child_main(void *arg)
{
	struct spawn_plan *pl = arg;
	/* First, so the helper (if any) raises it while the child sets itself up. */
	oom_child_start(&pl->oom);
	child_stdio(pl->r, pl->in_r, pl->out_w, pl->err_w, pl->errfd);
	child_run(pl);
}

/* The entry of an isolated call's command (its stdio is the namespace init's). */
static int command_main(void *arg)
{
	child_run(arg);
}

/* The entry of a call host's command (callhost.c): its stdio from the plan, in the host's
 * session and process group; then the confinement the host keeps for itself between
 * calls: the call's Landlock domain (pl->ll_fd, built by the host) and no CAP_SYS_ADMIN. */
static int hosted_command_main(void *arg)
{
	struct spawn_plan *pl = arg;
	int errfd = pl->errfd;
	child_dup_stdio(pl->r, pl->in_r, pl->out_w, pl->err_w, errfd);
	if (pl->ll_fd >= 0 && landlock_enforce(pl->ll_fd) < 0) {
		child_report(errfd, ST_ISOLATE, errno, "landlock_restrict_self");
		_exit(127);
	}
	if (caps_drop(CAP_SYS_ADMIN) < 0) {
		child_report(errfd, ST_ISOLATE, errno, "drop CAP_SYS_ADMIN");
		_exit(127);
	}
	child_run(pl);
}

/* ---- the plan and the clone ------------------------------------------------------- */

void spawn_plan_make(struct spawn_plan *pl, const struct exec_req *r, int in_r, int out_w, int err_w, int errfd)
{
	memset(pl, 0, sizeof *pl);
	pl->ll_fd = -1;
	pl->r = r;
	pl->in_r = in_r;
	pl->out_w = out_w;
	pl->err_w = err_w;
	pl->errfd = errfd;
	pl->user_stage = user_resolve(r->user, &pl->cr);
	size_t nenv = 0, argc = 0, homelen = 0;
	int has_home = 0;
	for (; r->envp[nenv]; nenv++)
		if (strncmp(r->envp[nenv], "HOME=", 5) == 0)
			has_home = 1;
	while (r->argv[argc])
		argc++;
	/* HOME from the user's passwd entry when the request has none (as login, docker and
	 * podman do). */
	int add_home = !has_home && !pl->user_stage;
	if (add_home)
		homelen = 5 + strlen(pl->cr.home) + 1;
	size_t pathlen = strlen(plan_path(r->envp)) + strlen(r->argv[0]) + 3;
	size_t envb = add_home ? sizeof(char *) * (nenv + 2) : 0;
	size_t argb = sizeof(char *) * (argc + 2);
	char *m = xmalloc(envb + argb + homelen + pathlen);
	pl->mem = m;
	pl->script_argv = (char **)m;
	pl->script_argv[0] = (char *)"/bin/sh";
	pl->script_argv[1] = NULL;
	for (size_t i = 1; i <= argc; i++)
		pl->script_argv[i + 1] = r->argv[i];
	m += argb;
	pl->envp = r->envp;
	if (add_home) {
		char **env = (char **)m;
		m += envb;
		memcpy(env, r->envp, sizeof(char *) * nenv);
		memcpy(m, "HOME=", 5);
		memcpy(m + 5, pl->cr.home, homelen - 5);
		env[nenv] = m;
		env[nenv + 1] = NULL;
		m += homelen;
		pl->envp = env;
	}
	pl->pathbuf = m;
}

void spawn_plan_free(struct spawn_plan *pl)
{
	free(pl->mem);
	pl->mem = NULL;
}

/* Size of the exec child's stack, and the guard page below it. The deepest path (a VM
 * guest's Landlock and capability steps, the error report) uses a few KiB. */
#define CHILD_STACK_BYTES (64u << 10)
static char *g_child_stack; /* the top of the mapping (the stack grows down), or NULL */

/* Map the child stack once (a forked namespace init has its own copy of the mapping).
 * Only what a child touches becomes resident. 0, or -1 with errno. */
static int child_stack_map(void)
{
	if (g_child_stack)
		return 0;
	long pg = sysconf(_SC_PAGESIZE);
	size_t len = CHILD_STACK_BYTES + (size_t)pg;
	char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
	if (m == MAP_FAILED)
		return -1;
	if (mprotect(m, (size_t)pg, PROT_NONE) < 0) { /* the guard page */
		int err = errno;
		munmap(m, len);
		errno = err;
		return -1;
	}
	g_child_stack = m + len;
	return 0;
}

/* Start fn(pl) in a child sharing this process's memory, on the child stack: clone with
 * CLONE_VM | CLONE_VFORK (and SIGCHLD as its exit signal, so it is reaped as any child).
 * Not CLONE_FILES, CLONE_FS or CLONE_SIGHAND: the child's dup2, chdir and sigaction are
 * its own. Every signal is blocked across the clone, so no handler could ever run on the
 * child's side of the shared memory (the child sets its own mask). Returns once the
 * child has exec'd or exited: its pid, or -1 with errno. */
static pid_t spawn_clone(int (*fn)(void *), struct spawn_plan *pl)
{
	if (child_stack_map() < 0)
		return -1;
	sigset_t all, old;
	sigfillset(&all);
	sigprocmask(SIG_SETMASK, &all, &old);
	pid_t pid = clone(fn, g_child_stack, CLONE_VM | CLONE_VFORK | SIGCHLD, pl);
	int err = errno;
	sigprocmask(SIG_SETMASK, &old, NULL);
	errno = err;
	return pid;
}

pid_t spawn_command(struct spawn_plan *pl)
{
	return spawn_clone(command_main, pl);
}

pid_t spawn_hosted_command(struct spawn_plan *pl)
{
	return spawn_clone(hosted_command_main, pl);
}

/* ---- exec start ------------------------------------------------------------------- */

static int pipe_cloexec(int p[2])
{
	return pipe2(p, O_CLOEXEC);
}

static void close_pair(int p[2])
{
	if (p[0] >= 0)
		close(p[0]);
	if (p[1] >= 0)
		close(p[1]);
	p[0] = p[1] = -1;
}

/* Open a pty master through one ptmx path and unlock it; -1 with errno on failure. */
static int pty_master(const char *ptmx)
{
	int m = open(ptmx, O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (m < 0)
		return -1;
	if (grantpt(m) < 0 || unlockpt(m) < 0) { /* e.g. not a ptmx at all (ENOTTY) */
		int err = errno;
		close(m);
		errno = err;
		return -1;
	}
	return m;
}

/* Allocate a pseudo-terminal inside the sandbox: the master via /dev/ptmx (what
 * posix_openpt opens) or, if that fails at any step (missing, not a ptmx, or bound to
 * another devpts instance), via /dev/pts/ptmx of the sandbox's own devpts (newinstance,
 * ptmxmode=0666). The slave is opened with TIOCGPTPEER (no path lookup, always the
 * master's devpts instance), or by ptsname on kernels before 4.13. Both O_NOCTTY: the
 * agent itself must never acquire a controlling terminal. Returns 0 or -1 with errno. */
static int pty_open(int *master, int *slave, uint16_t rows, uint16_t cols)
{
	int m = pty_master("/dev/ptmx");
	if (m < 0) {
		int e1 = errno;
		m = pty_master("/dev/pts/ptmx");
		if (m < 0) {
			if (errno == ENOENT)
				errno = e1;
			return -1;
		}
	}
	int s = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (s < 0) {
		char name[128];
		if (ptsname_r(m, name, sizeof name) != 0)
			goto fail;
		s = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (s < 0)
			goto fail;
	}
	struct winsize ws = { .ws_row = rows, .ws_col = cols };
	if (ioctl(m, TIOCSWINSZ, &ws) < 0)
		goto fail;
	*master = m;
	*slave = s;
	return 0;
fail:;
	int err = errno;
	if (s >= 0)
		close(s);
	close(m);
	errno = err;
	return -1;
}

int exec_spawn(const struct exec_req *r, struct exec_spawned *s)
{
	s->clone_failed = 0;
	s->host = NULL;
	int hosted = callhost_wanted(r);
	int in_p[2] = { -1, -1 }, out_p[2] = { -1, -1 }, err_p[2] = { -1, -1 }, st_p[2] = { -1, -1 };
	int stat_p[2] = { -1, -1 }; /* isolated: the namespace init's status report */
	int err = 0;
	if (r->tty) {
		/* in_p[0] = slave (the child's stdio), out_p[0] = master (read: output),
		 * in_p[1] = a dup of the master (written: STDIN frames), so reading and writing
		 * have their own epoll registrations. O_NONBLOCK is shared by both master fds. */
		if (pty_open(&out_p[0], &in_p[0], r->rows, r->cols) < 0 ||
		    (in_p[1] = fcntl(out_p[0], F_DUPFD_CLOEXEC, 3)) < 0 || pipe_cloexec(st_p) < 0)
			err = errno;
		if (!err && (set_nonblock(out_p[0]) < 0 || set_nonblock(st_p[0]) < 0))
			err = errno;
	} else {
		if ((r->want_stdin && pipe_cloexec(in_p) < 0) || pipe_cloexec(out_p) < 0 || pipe_cloexec(err_p) < 0 ||
		    pipe_cloexec(st_p) < 0)
			err = errno;
		if (!err && ((in_p[1] >= 0 && set_nonblock(in_p[1]) < 0) || set_nonblock(out_p[0]) < 0 ||
			     set_nonblock(err_p[0]) < 0 || set_nonblock(st_p[0]) < 0))
			err = errno;
	}
	if (!err && r->isolate && !hosted && (pipe_cloexec(stat_p) < 0 || set_nonblock(stat_p[0]) < 0))
		err = errno;
	pid_t pid = -1;
	struct spawn_plan pl = { 0 };
	if (!err && hosted) {
		s->t0_ns = mono_ns();
		err = callhost_start(r, in_p[0], out_p[1], err_p[1], st_p[1], &s->host, &pid);
		if (err)
			s->clone_failed = 1;
	} else if (!err) {
		spawn_plan_make(&pl, r, in_p[0], out_p[1], err_p[1], st_p[1]);
		s->t0_ns = mono_ns();
		if (r->isolate) {
			/* The namespace init raises itself through oom_wait_raised; its command
			 * inherits the value. */
			pl.oom.mode = OOM_CHILD_NONE;
			oom_before_fork();
			pid = clone_isolated();
			if (pid == 0) {
				close(st_p[0]);
				close(stat_p[0]);
				ns_init_main(&pl, stat_p[1]);
			}
			if (pid > 0)
				oom_raise_child(pid);
			else
				s->clone_failed = 1;
		} else {
			oom_child_prepare(&pl.oom);
			pid = spawn_clone(child_main, &pl);
			if (pid > 0) {
				oom_child_done(&pl.oom);
				/* The child's setuid reset the dumpability of the memory it shared
				 * with the agent to the host's fs.suid_dumpable: the agent stays
				 * non-dumpable (agent.c). */
				prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
			}
		}
		if (pid < 0)
			err = errno;
		spawn_plan_free(&pl);
	}
	if (err) {
		close_pair(in_p);
		close_pair(out_p);
		close_pair(err_p);
		close_pair(st_p);
		close_pair(stat_p);
		return err;
	}
	close(in_p[0]);
	if (out_p[1] >= 0)
		close(out_p[1]);
	if (err_p[1] >= 0)
		close(err_p[1]);
	close(st_p[1]);
	if (stat_p[1] >= 0)
		close(stat_p[1]);
	s->pid = pid;
	s->out = out_p[0];
	s->err = err_p[0];
	s->in = in_p[1];
	s->start = st_p[0];
	s->status = stat_p[0];
	return 0;
}

void spawn_raise_nofile(void)
{
	getrlimit(RLIMIT_NOFILE, &g_orig_nofile);
	struct rlimit rl = g_orig_nofile;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

void spawn_record_signals(void)
{
	signal(SIGPIPE, SIG_IGN);
	for (int sig = 1; sig < NSIG && g_nsig_nondefault < (int)(sizeof g_sig_nondefault / sizeof g_sig_nondefault[0]); sig++) {
		struct sigaction old;
		if (sig != SIGKILL && sig != SIGSTOP && sigaction(sig, NULL, &old) == 0 && old.sa_handler != SIG_DFL)
			g_sig_nondefault[g_nsig_nondefault++] = sig;
	}
}

void spawn_open_devnull(void)
{
	g_devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

int spawn_devnull(void)
{
	return g_devnull;
}

void spawn_map_stack(void)
{
	if (child_stack_map() < 0)
		logf_("spawn: mapping the exec child stack: %s; retried at each exec", strerror(errno));
}
