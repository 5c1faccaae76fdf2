/*
 * damon: guest-side memory reclaim with DAMON. The wire format of its two guest
 * operations is in docs/AGENT_PROTOCOL.md ("Guest memory reclaim"); the host side is
 * daemon/drivers/microvm/reclaim.ts.
 *
 * What the agent sets up, through the kernel's DAMON sysfs interface
 * (Documentation/admin-guide/mm/damon/usage.rst), in the documented order (each
 * directory exists only once its parent's nr_* file was written):
 *
 *   kdamonds/nr_kdamonds = 1                       (only when it is 0: see "Ownership")
 *   kdamonds/0/contexts/nr_contexts = 1
 *   contexts/0/operations = paddr                  (after checking avail_operations)
 *   contexts/0/monitoring_attrs/intervals/{sample_us,aggr_us}
 *   contexts/0/targets/nr_targets = 1
 *   targets/0/regions/nr_regions = R, regions/<i>/{start,end}
 *                                                  (the guest's System RAM ranges from
 *                                                  /proc/iomem: sysfs sets no default
 *                                                  region for paddr)
 *   contexts/0/schemes/nr_schemes = 1
 *   schemes/0/action = pageout
 *   schemes/0/access_pattern/{sz,nr_accesses,age}/{min,max}
 *                                                  (nr_accesses 0..0: not accessed at all;
 *                                                  age >= the minimum age, in aggregation
 *                                                  intervals)
 *   schemes/0/quotas/{ms,bytes,reset_interval_ms}, quotas/weights/{sz,nr_accesses,age}_permil
 *   schemes/0/watermarks/{metric,interval_us,high,mid,low}
 *   kdamonds/0/state = on
 *   kdamonds/0/refresh_ms = 1000                   (where the kernel has it: stats refresh
 *                                                  themselves)
 *
 * paddr, not vaddr: the guest is the sandbox, so its whole physical memory is the target
 * (page cache included), and no process list has to be followed as commands come and go.
 *
 * Ownership: the agent creates the guest's only kdamond. If kdamonds exist that it did not
 * create (a command of a vm-tier guest made some), RECLAIM answers -EBUSY and writes
 * nothing: writing nr_kdamonds would tear theirs down.
 *
 * Never blocking the agent: writing `on` and `off` returns at once (the kdamond thread is
 * started, or woken and joined). Writing `update_schemes_stats` (and `commit`) waits for
 * the kdamond to handle it, up to an aggregation or watermark-check interval on 6.12, so
 * RECLAIM_STATS answers with the stats of the last refresh and starts the next one in a
 * short-lived thread; on kernels with `refresh_ms` the kernel refreshes them itself.
 * A changed configuration is applied as `off`, rewrite, `on` (not `commit`, which waits).
 *
 * The admin directory is opened once at start (damon_init), before dsecd's confinement
 * of commands makes /sys read-only in the guest (a read-only bind mount over it: CONFINE,
 * agent.c guest_confine); every file is then opened relative to that descriptor, so
 * the agent keeps writing to the sysfs mount underneath while commands see it read-only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "damon.h"

/* Most System RAM ranges given to DAMON as initial regions (a microVM has two or three). */
#define MAX_RAM_RANGES 16
/* Smallest System RAM range worth monitoring: 4 MiB (skips the legacy low 640 KiB). */
#define MIN_RAM_RANGE (4ull << 20)
/* refresh_ms written where the kernel has it: stats at most one second old. */
#define AUTO_REFRESH_MS 1000

static struct {
	damon_log_fn log;
	int admin;               /* O_PATH fd of <root>/sys/kernel/mm/damon/admin, or -1 */
	int admin_errno;         /* why it could not be opened */
	char root[PATH_MAX / 2]; /* "" in a guest; the test root otherwise */
	int test;                /* DSEC_AGENT_DAMON_ROOT was set */
	int ours;                /* kdamonds/0 was created by us */
	int started;             /* a scheme was started at least once */
	int auto_refresh;        /* the kernel refreshes the stats (refresh_ms) */
	atomic_int refreshing;   /* a refresh thread is running */
} D = { .admin = -1 };

static void nolog(const char *fmt, ...)
{
	(void)fmt;
}

void damon_init(damon_log_fn log)
{
	D.log = log ? log : nolog;
	const char *r = getenv("DSEC_AGENT_DAMON_ROOT");
	if (r && *r && strlen(r) < sizeof D.root) {
		snprintf(D.root, sizeof D.root, "%s", r);
		D.test = 1;
	}
	char path[PATH_MAX];
	snprintf(path, sizeof path, "%s/sys/kernel/mm/damon/admin", D.root);
	D.admin = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	D.admin_errno = D.admin < 0 ? errno : 0;
}

static uint32_t be32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t be64(const unsigned char *p)
{
	return (uint64_t)be32(p) << 32 | be32(p + 4);
}

static void put_be64(unsigned char *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--, v >>= 8)
		p[i] = (unsigned char)v;
}

/* Path of `rel` below the root (for /proc files; admin files go through D.admin). */
static void path_of(char *out, size_t cap, const char *rel)
{
	snprintf(out, cap, "%s/%s", D.root, rel);
}

/* Opens `rel` below the DAMON admin directory (or from `/` with abs = 1). fd or -1 with errno. */
static int open_at(const char *rel, int abs, int flags)
{
	if (abs) {
		char path[PATH_MAX];
		path_of(path, sizeof path, rel);
		return open(path, flags | O_CLOEXEC | O_NOFOLLOW);
	}
	if (D.admin < 0) {
		errno = D.admin_errno ? D.admin_errno : ENOENT;
		return -1;
	}
	return openat(D.admin, rel, flags | O_CLOEXEC | O_NOFOLLOW);
}

/* Writes the formatted value to the admin file `rel`. 0, or -errno (logged with the file). */
static int wr(const char *rel, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int wr(const char *rel, const char *fmt, ...)
{
	char val[64];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(val, sizeof val, fmt, ap);
	va_end(ap);
	int fd = open_at(rel, 0, O_WRONLY | (D.test ? O_TRUNC : 0));
	if (fd < 0) {
		int e = errno;
		D.log("damon: open %s: %s", rel, strerror(e));
		return -e;
	}
	ssize_t w = write(fd, val, (size_t)n);
	int e = w < 0 ? errno : w != n ? EIO : 0;
	close(fd);
	if (e) {
		D.log("damon: write '%s' to %s: %s", val, rel, strerror(e));
		return -e;
	}
	return 0;
}

/* Reads a small file (`rel` below the admin dir, or from `/` with abs) into buf, newline
 * stripped. Returns its length, or -errno. */
static int rd(const char *rel, int abs, char *buf, size_t cap)
{
	int fd = open_at(rel, abs, O_RDONLY);
	if (fd < 0)
		return -errno;
	ssize_t n = read(fd, buf, cap - 1);
	int e = n < 0 ? errno : 0;
	close(fd);
	if (n < 0)
		return -e;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		n--;
	buf[n] = 0;
	return (int)n;
}

static uint64_t rd_u64(const char *rel)
{
	char b[32];
	return rd(rel, 0, b, sizeof b) > 0 ? strtoull(b, NULL, 10) : 0;
}

static int exists(const char *rel)
{
	struct stat st;
	return D.admin >= 0 && fstatat(D.admin, rel, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* The guest's System RAM ranges of at least MIN_RAM_RANGE, from /proc/iomem (top-level
 * lines "start-end : System RAM", end inclusive), as [start, end). Returns the count. */
static int ram_ranges(uint64_t (*r)[2], int max)
{
	char path[PATH_MAX];
	path_of(path, sizeof path, "proc/iomem");
	FILE *f = fopen(path, "re");
	if (!f)
		return -errno;
	char line[256];
	int n = 0;
	while (n < max && fgets(line, sizeof line, f)) {
		if (line[0] == ' ' || !strstr(line, ": System RAM"))
			continue;
		uint64_t a, b;
		if (sscanf(line, "%" SCNx64 "-%" SCNx64, &a, &b) != 2 || b <= a || b - a + 1 < MIN_RAM_RANGE)
			continue;
		r[n][0] = a;
		r[n][1] = b + 1;
		n++;
	}
	fclose(f);
	return n;
}

/* MemTotal, MemFree, SwapTotal, SwapFree of /proc/meminfo, bytes. */
static void meminfo(uint64_t v[4])
{
	static const char *const keys[4] = { "MemTotal:", "MemFree:", "SwapTotal:", "SwapFree:" };
	char path[PATH_MAX];
	memset(v, 0, 4 * sizeof v[0]);
	path_of(path, sizeof path, "proc/meminfo");
	FILE *f = fopen(path, "re");
	if (!f)
		return;
	char line[128];
	while (fgets(line, sizeof line, f)) {
		for (int i = 0; i < 4; i++) {
			size_t k = strlen(keys[i]);
			if (strncmp(line, keys[i], k) == 0)
				v[i] = strtoull(line + k, NULL, 10) * 1024;
		}
	}
	fclose(f);
}

#define K "kdamonds/0"
#define C K "/contexts/0"
#define S C "/schemes/0"

/* The parameters of RECLAIM (docs/AGENT_PROTOCOL.md "Guest memory reclaim"). */
struct reclaim_params {
	uint32_t min_age_ms, sample_us, aggr_us, quota_ms, reset_ms, wmark_interval_ms;
	uint64_t quota_bytes;
	uint16_t high, mid, low;
};

static void parse(const unsigned char *p, struct reclaim_params *r)
{
	r->min_age_ms = be32(p + 4);
	r->sample_us = be32(p + 8) ? be32(p + 8) : 5000;
	r->aggr_us = be32(p + 12) ? be32(p + 12) : 100000;
	r->quota_ms = be32(p + 16);
	r->reset_ms = be32(p + 20) ? be32(p + 20) : 1000;
	r->quota_bytes = be64(p + 24);
	r->high = (uint16_t)(p[32] << 8 | p[33]);
	r->mid = (uint16_t)(p[34] << 8 | p[35]);
	r->low = (uint16_t)(p[36] << 8 | p[37]);
	r->wmark_interval_ms = be32(p + 40) ? be32(p + 40) : 1000;
}

/* Stops our kdamond if it runs. 0 or -errno. */
static int stop(void)
{
	char st[16];
	if (!D.ours || rd(K "/state", 0, st, sizeof st) < 0 || strcmp(st, "on") != 0)
		return 0;
	return wr(K "/state", "off");
}

static int start(const struct reclaim_params *r)
{
	char buf[256];
	if (D.admin < 0 || !exists("kdamonds/nr_kdamonds")) {
		D.log("damon: the guest kernel has no DAMON sysfs interface (/sys/kernel/mm/damon/admin)");
		return -ENOENT;
	}
	int e;
	if (!D.ours) {
		if (rd_u64("kdamonds/nr_kdamonds") != 0) {
			D.log("damon: kdamonds exist that the agent did not create; leaving them alone");
			return -EBUSY;
		}
		if ((e = wr("kdamonds/nr_kdamonds", "1")) < 0)
			return e;
		D.ours = 1;
	} else if ((e = stop()) < 0) {
		return e;
	}
	if ((e = wr(K "/contexts/nr_contexts", "1")) < 0)
		return e;
	if (rd(C "/avail_operations", 0, buf, sizeof buf) < 0 || !strstr(buf, "paddr")) {
		D.log("damon: the guest kernel's DAMON has no paddr operations (avail_operations: %s)", buf);
		return -EOPNOTSUPP;
	}
	uint64_t ram[MAX_RAM_RANGES][2];
	int nr = ram_ranges(ram, MAX_RAM_RANGES);
	if (nr <= 0) {
		D.log("damon: no System RAM ranges in /proc/iomem");
		return nr < 0 ? nr : -ENOENT;
	}
	/* Age in aggregation intervals, rounded up: a region must be idle at least min_age_ms. */
	uint64_t age = ((uint64_t)r->min_age_ms * 1000 + r->aggr_us - 1) / r->aggr_us;
	int wm = r->high || r->mid || r->low;
	char rel[128];
	if ((e = wr(C "/operations", "paddr")) < 0 ||
	    (e = wr(C "/monitoring_attrs/intervals/sample_us", "%" PRIu32, r->sample_us)) < 0 ||
	    (e = wr(C "/monitoring_attrs/intervals/aggr_us", "%" PRIu32, r->aggr_us)) < 0 ||
	    (e = wr(C "/targets/nr_targets", "1")) < 0 ||
	    (e = wr(C "/targets/0/regions/nr_regions", "%d", nr)) < 0)
		return e;
	for (int i = 0; i < nr; i++) {
		snprintf(rel, sizeof rel, C "/targets/0/regions/%d/start", i);
		if ((e = wr(rel, "%" PRIu64, ram[i][0])) < 0)
			return e;
		snprintf(rel, sizeof rel, C "/targets/0/regions/%d/end", i);
		if ((e = wr(rel, "%" PRIu64, ram[i][1])) < 0)
			return e;
	}
	if ((e = wr(C "/schemes/nr_schemes", "1")) < 0 ||
	    (e = wr(S "/action", "pageout")) < 0 ||
	    (e = wr(S "/access_pattern/sz/min", "4096")) < 0 ||
	    (e = wr(S "/access_pattern/sz/max", "%lu", ULONG_MAX)) < 0 ||
	    (e = wr(S "/access_pattern/nr_accesses/min", "0")) < 0 ||
	    (e = wr(S "/access_pattern/nr_accesses/max", "0")) < 0 ||
	    (e = wr(S "/access_pattern/age/min", "%" PRIu64, age)) < 0 ||
	    (e = wr(S "/access_pattern/age/max", "%u", UINT_MAX)) < 0 ||
	    (e = wr(S "/quotas/ms", "%" PRIu32, r->quota_ms)) < 0 ||
	    (e = wr(S "/quotas/bytes", "%" PRIu64, r->quota_bytes)) < 0 ||
	    (e = wr(S "/quotas/reset_interval_ms", "%" PRIu32, r->reset_ms)) < 0 ||
	    /* Under a quota, the oldest regions go first. */
	    (e = wr(S "/quotas/weights/sz_permil", "0")) < 0 ||
	    (e = wr(S "/quotas/weights/nr_accesses_permil", "0")) < 0 ||
	    (e = wr(S "/quotas/weights/age_permil", "1000")) < 0 ||
	    (e = wr(S "/watermarks/metric", wm ? "free_mem_rate" : "none")) < 0 ||
	    (e = wr(S "/watermarks/interval_us", "%" PRIu64, (uint64_t)r->wmark_interval_ms * 1000)) < 0 ||
	    (e = wr(S "/watermarks/high", "%u", r->high)) < 0 ||
	    (e = wr(S "/watermarks/mid", "%u", r->mid)) < 0 ||
	    (e = wr(S "/watermarks/low", "%u", r->low)) < 0 ||
	    (e = wr(K "/state", "on")) < 0)
		return e;
	D.auto_refresh = exists(K "/refresh_ms") && wr(K "/refresh_ms", "%d", AUTO_REFRESH_MS) == 0;
	D.started = 1;
	D.log("damon: pageout of regions idle for %" PRIu32 " ms (age %" PRIu64 " x %" PRIu32 " us) on %d RAM range(s); quota %" PRIu32
	      " ms and %" PRIu64 " bytes per %" PRIu32 " ms; watermarks %s %u/%u/%u",
	      r->min_age_ms, age, r->aggr_us, nr, r->quota_ms, r->quota_bytes, r->reset_ms, wm ? "free_mem_rate" : "none", r->high, r->mid, r->low);
	return 0;
}

/* A stats refresh: blocks until the kdamond handled it (see the module comment). */
static void *refresh_main(void *arg)
{
	(void)arg;
	wr(K "/state", "update_schemes_stats");
	atomic_store(&D.refreshing, 0);
	return NULL;
}

static void refresh_async(void)
{
	int no = 0;
	if (!atomic_compare_exchange_strong(&D.refreshing, &no, 1))
		return; /* one in flight */
	pthread_attr_t a;
	pthread_t t;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&a, 64 << 10);
	if (pthread_create(&t, &a, refresh_main, NULL) != 0)
		atomic_store(&D.refreshing, 0);
	pthread_attr_destroy(&a);
}

static int32_t stats(unsigned char *out, uint32_t *outlen)
{
	if (!D.started)
		return -ENOENT;
	char st[16];
	int on = rd(K "/state", 0, st, sizeof st) > 0 && strcmp(st, "on") == 0;
	static const char *const names[5] = { "nr_tried", "sz_tried", "nr_applied", "sz_applied", "qt_exceeds" };
	memset(out, 0, DAMON_STATS_REPLY_LEN);
	out[0] = (unsigned char)on;
	char rel[128];
	for (int i = 0; i < 5; i++) {
		snprintf(rel, sizeof rel, S "/stats/%s", names[i]);
		put_be64(out + 8 + 8 * i, rd_u64(rel));
	}
	uint64_t mi[4];
	meminfo(mi);
	for (int i = 0; i < 4; i++)
		put_be64(out + 48 + 8 * i, mi[i]);
	*outlen = DAMON_STATS_REPLY_LEN;
	if (on && !D.auto_refresh)
		refresh_async();
	return 0;
}

int32_t damon_op(unsigned op, const unsigned char *p, uint32_t len, unsigned char *out, uint32_t *outlen)
{
	if (op == DAMON_OP_RECLAIM_STATS)
		return stats(out, outlen);
	if (op != DAMON_OP_RECLAIM)
		return -ENOSYS;
	if (getpid() != 1 && !D.test)
		return -EPERM; /* only as the guest's init: never a host's kdamonds */
	if (len >= 1 && p[0] == 0)
		return stop();
	if (len < DAMON_RECLAIM_ARG_LEN || p[0] != 1)
		return -EINVAL;
	struct reclaim_params r;
	parse(p, &r);
	if (r.aggr_us < r.sample_us || (r.high || r.mid || r.low ? !(r.high >= r.mid && r.mid >= r.low && r.high <= 1000) : 0))
		return -EINVAL;
	return start(&r);
}
