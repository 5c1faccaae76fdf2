/*
 * callhost: call hosts, the agent's side and the request on the control socket
 * (callhost.h). The host's own loop is isolate.c's callhost_main.
 *
 * The control socket is a SOCK_STREAM socketpair. A call is one sendmsg of a 12-byte
 * header (u32 body length, u32 number of fds, u32 zero) carrying the fds (SCM_RIGHTS:
 * out_w, err_w, errfd, then in_r when the call has stdin), then the body: u64 tmp bytes,
 * u64 shm bytes, u32 argc, u32 envc, u32 nscratch, nscratch × u64 scratch bytes, then
 * NUL-terminated strings: cwd, user, argv..., env..., scratch paths.... The host answers
 * each call with two i32: its command's wait status, once every process of the call is
 * gone, and flags (CALLHOST_RETIRING: the host exits now and takes no more calls).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>

#include "callhost.h"
#include "exec.h"
#include "isolate.h"
#include "oom.h"
#include "proto.h"
#include "util.h"

/* Longest a blocking send of a call to a host may take, s (SO_SNDTIMEO). */
#define CALLHOST_SEND_TIMEOUT_S 5
/* The largest request body a host accepts, bytes: its strings come from one EXEC frame
 * (at most MAX_PAYLOAD), each NUL-terminated instead of a 6-byte TLV header. */
#define CALLHOST_MAX_BODY (2u * MAX_PAYLOAD)

int g_callhost = 1;

enum { CH_IDLE = 1, CH_BUSY, CH_GONE };

struct callhost {
	pid_t pid;
	struct watch w;     /* the agent's end of the control socket (blocking; reads use MSG_DONTWAIT) */
	unsigned calls;     /* calls sent to it */
	int state;
	void *owner;        /* the exec it serves while busy */
	struct callhost *next, *prev;
	struct callhost *grave_next;
};

static struct callhost *g_hosts; /* every live host */
static struct callhost *g_idle_hosts[CALLHOST_MAX_IDLE];
static int g_nidle;
static struct callhost *g_host_grave;

static struct callhost *host_by_pid(pid_t pid)
{
	for (struct callhost *h = g_hosts; h; h = h->next)
		if (h->pid == pid)
			return h;
	return NULL;
}

/* Whether the agent has a child that is neither a call host nor the oom helper: the
 * process of an exec, or (the agent being the sandbox's init) any process whose parent
 * died, such as a plain exec's daemonized background process. Read from
 * /proc/self/task/TID/children (Linux 3.5 with CONFIG_PROC_CHILDREN); when that cannot be
 * read, every child counts as foreign. */
static int foreign_children(void)
{
	char path[64], buf[4096];
	snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 1;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n < 0 || n == (ssize_t)sizeof buf - 1)
		return 1; /* unreadable, or more children than fit: as if foreign */
	buf[n] = 0;
	pid_t helper = oom_helper_pid();
	for (char *p = buf, *end; *p; p = end) {
		long pid = strtol(p, &end, 10);
		if (end == p)
			break;
		if ((pid_t)pid != helper && !host_by_pid((pid_t)pid))
			return 1;
	}
	return 0;
}

int callhost_wanted(const struct exec_req *r)
{
	/* Only while nothing else runs on this agent: a process that coexists with a hosted
	 * call could be handed a descriptor of the host's mount namespace (a dirfd of "/",
	 * over an abstract socket of the worker's shared network namespace) and would see the
	 * mounts of the host's later calls through it; a call whose command ends while such
	 * a process lives is followed by calls on other hosts or inits, never by its host's
	 * next call before that process is gone. The same holds for a process no exec owns
	 * any more (a plain exec's background process, reparented to the agent): any child
	 * of the agent but its hosts and the oom helper. dsecd's pools run one call per
	 * worker and nothing else on it. */
	return g_callhost && r->isolate && !r->tty && !r->detached && !exec_any_live() && !foreign_children();
}

/* Closes the control socket: an idle host reads EOF and exits; reaped as any child. */
static void host_retire(struct callhost *h)
{
	watch_close(&h->w);
}


/* A new host: the clone into fresh namespaces (isolate.c callhost_main runs in the child). */
static struct callhost *host_new(int *err)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
		*err = errno;
		return NULL;
	}
	oom_before_fork();
	pid_t pid = clone_isolated();
	if (pid == 0) {
		close(sv[0]);
		callhost_main(sv[1]);
	}
	close(sv[1]);
	if (pid < 0) {
		*err = errno;
		close(sv[0]);
		return NULL;
	}
	oom_raise_child(pid);
	/* A host reads its next call at once, or right after unmounting the last one's tmpfs;
	 * one that does not within this long is wedged, and the agent's loop must not wait. */
	struct timeval tv = { .tv_sec = CALLHOST_SEND_TIMEOUT_S };
	setsockopt(sv[0], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	struct callhost *h = xmalloc(sizeof *h);
	memset(h, 0, sizeof *h);
	h->pid = pid;
	h->w.fd = -1;
	/* Remembered, not registered (events 0: cannot fail); callhost_attach watches it. */
	watch_add(&h->w, W_CALLHOST, sv[0], h, 0);
	h->state = CH_IDLE;
	DL_PUSH(g_hosts, h, next, prev);
	return h;
}

/* Append n bytes to a growing buffer. */
struct buf {
	char *p;
	size_t len, cap;
};

static void buf_put(struct buf *b, const void *v, size_t n)
{
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 1024;
		while (cap < b->len + n)
			cap *= 2;
		char *np = realloc(b->p, cap);
		if (!np) {
			logf_("fatal: out of memory");
			abort();
		}
		b->p = np;
		b->cap = cap;
	}
	memcpy(b->p + b->len, v, n);
	b->len += n;
}

static void buf_str(struct buf *b, const char *s)
{
	buf_put(b, s, strlen(s) + 1);
}

/* Writes all of p (a blocking socket). 0, or -1 with errno. */
static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Sends the call to h: 0, or -1 with errno (the host is then unusable). */
static int host_send(struct callhost *h, const struct exec_req *r, const int *fds, int nfds)
{
	struct buf b = { 0 };
	uint32_t argc = 0, envc = 0, ns = (uint32_t)r->nscratch;
	while (r->argv[argc])
		argc++;
	while (r->envp[envc])
		envc++;
	buf_put(&b, &r->tmp_bytes, 8);
	buf_put(&b, &r->shm_bytes, 8);
	buf_put(&b, &argc, 4);
	buf_put(&b, &envc, 4);
	buf_put(&b, &ns, 4);
	for (int i = 0; i < r->nscratch; i++)
		buf_put(&b, &r->scratch_bytes[i], 8);
	buf_str(&b, r->cwd);
	buf_str(&b, r->user);
	for (uint32_t i = 0; i < argc; i++)
		buf_str(&b, r->argv[i]);
	for (uint32_t i = 0; i < envc; i++)
		buf_str(&b, r->envp[i]);
	for (int i = 0; i < r->nscratch; i++)
		buf_str(&b, r->scratch[i]);
	uint32_t hdr[3] = { (uint32_t)b.len, (uint32_t)nfds, 0 };
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	memset(&u, 0, sizeof u);
	struct iovec iov = { .iov_base = hdr, .iov_len = sizeof hdr };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
	memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
	ssize_t n;
	do
		n = sendmsg(h->w.fd, &m, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	int rc = n == (ssize_t)sizeof hdr ? write_all(h->w.fd, b.p, b.len) : -1;
	if (n >= 0 && n != (ssize_t)sizeof hdr)
		errno = EIO;
	int e = errno;
	free(b.p);
	errno = e;
	return rc;
}

int callhost_start(const struct exec_req *r, int in_r, int out_w, int err_w, int errfd, struct callhost **host, pid_t *pid)
{
	int fds[4] = { out_w, err_w, errfd, in_r };
	int nfds = in_r >= 0 ? 4 : 3;
	for (int attempt = 0; attempt < 2; attempt++) {
		struct callhost *h = g_nidle ? g_idle_hosts[--g_nidle] : NULL;
		int fresh = !h;
		if (fresh) {
			int err = 0;
			h = host_new(&err);
			if (!h)
				return err;
		}
		if (host_send(h, r, fds, nfds) == 0) {
			h->state = CH_BUSY;
			h->calls++;
			*host = h;
			*pid = h->pid;
			return 0;
		}
		/* A pooled host that died while idle (its reap not seen yet): retire it and take
		 * a new one; a new host that cannot be reached is a real failure. */
		int err = errno;
		logf_("call host pid=%d: sending a call: %s; killed", (int)h->pid, strerror(err));
		h->state = CH_GONE;
		kill(h->pid, SIGKILL);
		host_retire(h);
		if (fresh)
			return err;
	}
	return EIO;
}

void callhost_attach(struct callhost *h, void *owner)
{
	h->owner = owner;
	watch_set(&h->w, EPOLLIN);
}

void callhost_on_ctl(struct callhost *h)
{
	int32_t rep[2];
	ssize_t n;
	do
		n = recv(h->w.fd, rep, sizeof rep, MSG_DONTWAIT | MSG_WAITALL);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == EAGAIN)
		return;
	if (n != (ssize_t)sizeof rep) {
		/* EOF (or a torn report): the host is dying; reap_all ends its call. */
		watch_set(&h->w, 0);
		h->state = CH_GONE;
		return;
	}
	void *owner = h->owner;
	h->owner = NULL;
	watch_set(&h->w, 0);
	int32_t st = rep[0];
	if (!(rep[1] & CALLHOST_RETIRING) && h->calls < CALLHOST_MAX_CALLS && g_nidle < CALLHOST_MAX_IDLE) {
		h->state = CH_IDLE;
		g_idle_hosts[g_nidle++] = h;
	} else {
		h->state = CH_GONE;
		host_retire(h);
	}
	exec_hosted_done(owner, st);
}

int callhost_reaped(pid_t pid, int *status)
{
	struct callhost *h = host_by_pid(pid);
	if (!h)
		return 0;
	/* A host that reported and then exited (retiring) may be reaped before its report is
	 * read: the report, not the host's own exit status, is its call's outcome. */
	if (h->state == CH_BUSY && h->w.fd >= 0) {
		int32_t rep[2];
		if (recv(h->w.fd, rep, sizeof rep, MSG_DONTWAIT | MSG_WAITALL) == (ssize_t)sizeof rep)
			*status = rep[0];
	}
	for (int i = 0; i < g_nidle; i++)
		if (g_idle_hosts[i] == h) {
			g_idle_hosts[i] = g_idle_hosts[--g_nidle];
			break;
		}
	watch_close(&h->w);
	DL_UNLINK(g_hosts, h, next, prev);
	h->grave_next = g_host_grave;
	g_host_grave = h;
	return 1;
}

void callhost_free_graveyard(void)
{
	while (g_host_grave) {
		struct callhost *h = g_host_grave;
		g_host_grave = h->grave_next;
		free(h);
	}
}

/* ---- the host's side ------------------------------------------------------------- */

/* Reads exactly n bytes (blocking). 1, 0 on EOF before any byte, -1 otherwise. */
static int read_full(int fd, void *p, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t k = read(fd, (char *)p + got, n - got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return got == 0 && k == 0 ? 0 : -1;
		got += (size_t)k;
	}
	return 1;
}

/* The next NUL-terminated string of [*p, end), or NULL when none is left. */
static char *next_str(char **p, char *end)
{
	char *s = *p;
	char *z = s < end ? memchr(s, 0, (size_t)(end - s)) : NULL;
	if (!z)
		return NULL;
	*p = z + 1;
	return s;
}

int callhost_read_call(int ctl, struct exec_req *r, void *mem[2], int fds[4])
{
	uint32_t hdr[3];
	union {
		char buf[CMSG_SPACE(4 * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = hdr, .iov_len = sizeof hdr };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf };
	ssize_t n;
	do
		n = recvmsg(ctl, &m, MSG_CMSG_CLOEXEC | MSG_WAITALL);
	while (n < 0 && errno == EINTR);
	if (n == 0)
		return 0;
	fds[0] = fds[1] = fds[2] = fds[3] = -1;
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
	int nfds = 0;
	if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
		nfds = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		memcpy(fds, CMSG_DATA(cm), sizeof(int) * (size_t)(nfds > 4 ? 4 : nfds));
	}
	if (n != (ssize_t)sizeof hdr || (m.msg_flags & MSG_CTRUNC) || nfds < 3 || nfds > 4 || hdr[1] != (uint32_t)nfds ||
	    hdr[0] < 28 || hdr[0] > CALLHOST_MAX_BODY)
		return -1;
	char *body = xmalloc(hdr[0]);
	if (read_full(ctl, body, hdr[0]) != 1) {
		free(body);
		return -1;
	}
	memset(r, 0, sizeof *r);
	r->isolate = 1;
	uint32_t argc, envc, ns;
	memcpy(&r->tmp_bytes, body, 8);
	memcpy(&r->shm_bytes, body + 8, 8);
	memcpy(&argc, body + 16, 4);
	memcpy(&envc, body + 20, 4);
	memcpy(&ns, body + 24, 4);
	char *p = body + 28, *end = body + hdr[0];
	if (ns > ISO_MAX_SCRATCH || argc == 0 || argc > hdr[0] || envc > hdr[0] || (size_t)(end - p) < 8u * ns) {
		free(body);
		return -1;
	}
	r->nscratch = (int)ns;
	for (uint32_t i = 0; i < ns; i++, p += 8)
		memcpy(&r->scratch_bytes[i], p, 8);
	/* argv and envp share one array (argv, NULL, envp, NULL), freed with the body. */
	char **v = malloc(sizeof(char *) * ((size_t)argc + envc + 2));
	char *cwd = next_str(&p, end), *user = next_str(&p, end);
	int ok = v && cwd && user;
	for (uint32_t i = 0; ok && i < argc; i++)
		ok = (v[i] = next_str(&p, end)) != NULL;
	for (uint32_t i = 0; ok && i < envc; i++)
		ok = (v[argc + 1 + i] = next_str(&p, end)) != NULL;
	for (uint32_t i = 0; ok && i < ns; i++)
		ok = (r->scratch[i] = next_str(&p, end)) != NULL;
	if (!ok) {
		free(v);
		free(body);
		return -1;
	}
	v[argc] = NULL;
	v[argc + 1 + envc] = NULL;
	r->argv = v;
	r->envp = v + argc + 1;
	r->cwd = cwd;
	r->user = user;
	mem[0] = body;
	mem[1] = v;
	return 1;
}
