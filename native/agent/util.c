/*
 * util: the log, the clock, allocation, fd flags, small files and ids (util.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include "proto.h"
#include "util.h"

int g_no_openat2;

void logf_(const char *fmt, ...)
{
	char line[1024];
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ " AGENT_NAME "[%d]: ",
			 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
			 ts.tv_nsec / 1000000, (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	size_t len = (size_t)n + (size_t)m;
	if (len > sizeof line - 2)
		len = sizeof line - 2;
	line[len++] = '\n';
	/* Best effort: a log write must never take the agent down. */
	ssize_t w = write(2, line, len);
	(void)w;
}

uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p) {
		logf_("fatal: out of memory (%zu bytes)", n);
		/* As PID 1 exiting panics the sandbox; there is nothing better to do. */
		_exit(111);
	}
	return p;
}

char *xstrndup(const char *s, size_t n)
{
	char *p = xmalloc(n + 1);
	memcpy(p, s, n);
	p[n] = 0;
	return p;
}

int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -1;
	return fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

int set_cloexec(int fd)
{
	int fl = fcntl(fd, F_GETFD);
	if (fl < 0)
		return -1;
	return fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
}

/* Mark every fd >= from close-on-exec. */
void cloexec_from(int from)
{
	if (syscall(SYS_close_range, (unsigned)from, ~0U, CLOSE_RANGE_CLOEXEC) == 0)
		return;
	/* Kernel < 5.11: walk the table up to the soft limit. */
	struct rlimit rl;
	long max = 65536;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 1048576)
		max = (long)rl.rlim_cur;
	for (long fd = from; fd < max; fd++)
		set_cloexec((int)fd);
}

/* vsnprintf into msg (cap bytes); returns the length of what fits (truncated, never < 0). */
size_t vformat(char *msg, size_t cap, const char *fmt, va_list ap)
{
	int n = vsnprintf(msg, cap, fmt, ap);
	if (n < 0)
		return 0;
	return (size_t)n >= cap ? cap - 1 : (size_t)n;
}

/* Read a whole small file (passwd/group). Returns NULL if it cannot be read. */
char *slurp(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	size_t cap = 8192, len = 0;
	char *buf = malloc(cap);
	while (buf) {
		if (len + 1 >= cap) {
			if (cap >= (64u << 20))
				break; /* absurdly large: use what we have */
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap *= 2;
		}
		ssize_t n = read(fd, buf + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	if (buf)
		buf[len] = 0;
	return buf;
}

/* Parse a decimal id; returns 0 on success. Rejects empty, signs, overflow and -1. */
int parse_id(const char *s, uint32_t *out)
{
	if (!*s)
		return -1;
	uint64_t v = 0;
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		v = v * 10 + (uint64_t)(*p - '0');
		if (v >= 0xFFFFFFFFull)
			return -1;
	}
	*out = (uint32_t)v;
	return 0;
}
