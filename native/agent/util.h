/*
 * util: what every unit of the agent uses: the log, the monotonic clock, big-endian
 * integers, allocation that never returns NULL, fd flags, whole small files, decimal ids
 * and the intrusive doubly linked lists. It holds no state but g_no_openat2.
 */
#ifndef DSEC_AGENT_UTIL_H
#define DSEC_AGENT_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/types.h>

/* System call numbers the libc headers may lack (the same on every architecture). */
#ifndef SYS_openat2
#define SYS_openat2 437
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* Set when openat2 (Linux 5.6) is unavailable: by the first ENOSYS (files.c open_res) or
 * by the test hook DSEC_AGENT_NO_OPENAT2=1 (files_init). Path resolution then falls back
 * to O_NOFOLLOW on the final component (files.c, landlock.c). */
extern int g_no_openat2;

/* One log line on fd 2: "<RFC 3339 UTC timestamp, ms> dsec-agent[pid]: msg" (at most
 * 1 KiB, truncated). Best effort: a failed write is ignored. Safe in a forked child. */
void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* CLOCK_MONOTONIC in ns. */
uint64_t mono_ns(void);

/* Big-endian (network order) integers, as every field of the protocol is. */
static inline void put_u32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24);
	p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8);
	p[3] = (unsigned char)v;
}

static inline uint32_t get_u32(const unsigned char *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline void put_u64(unsigned char *p, uint64_t v)
{
	put_u32(p, (uint32_t)(v >> 32));
	put_u32(p + 4, (uint32_t)v);
}

static inline uint64_t get_u64(const unsigned char *p)
{
	return ((uint64_t)get_u32(p) << 32) | get_u32(p + 4);
}

/* malloc that never returns NULL: out of memory logs and exits 111 (as PID 1 that ends
 * the sandbox; there is nothing better to do). n = 0 allocates 1 byte. */
void *xmalloc(size_t n);
/* The n bytes at s and a NUL, in memory from xmalloc. */
char *xstrndup(const char *s, size_t n);
/* Add O_NONBLOCK / FD_CLOEXEC to fd. 0, or -1 with errno. */
int set_nonblock(int fd);
int set_cloexec(int fd);
/* Mark every fd >= from close-on-exec (close_range, or a walk up to RLIMIT_NOFILE). */
void cloexec_from(int from);
/* vsnprintf into msg (cap bytes); returns the length of what fits (truncated, never < 0). */
size_t vformat(char *msg, size_t cap, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));
/* A whole small file (at most 64 MiB), NUL-terminated, in memory from malloc; NULL if it
 * cannot be opened or memory runs out. */
char *slurp(const char *path);
/* Parse a decimal id into *out; returns 0, or -1 for empty, signs, overflow and -1. */
int parse_id(const char *s, uint32_t *out);

/* A record of getdents64(2) (struct linux_dirent64; glibc has no declaration of it). */
struct dirent64_ {
	uint64_t ino;
	int64_t off;
	unsigned short reclen;
	unsigned char type;
	char name[];
};

/* Doubly linked lists threaded through a pair of next/prev fields of their elements
 * (conn.next/prev, exec.cnext/cprev and gnext/gprev, fop.next/prev): push x at the head,
 * or unlink x (its own next/prev fields are left as they are). */
#define DL_PUSH(head, x, next, prev)          \
	do {                                  \
		(x)->next = (head);           \
		if (head)                     \
			(head)->prev = (x);   \
		(head) = (x);                 \
	} while (0)
#define DL_UNLINK(head, x, next, prev)                \
	do {                                          \
		if ((x)->prev)                        \
			(x)->prev->next = (x)->next;  \
		else                                  \
			(head) = (x)->next;           \
		if ((x)->next)                        \
			(x)->next->prev = (x)->prev;  \
	} while (0)

#endif
