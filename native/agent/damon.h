/*
 * damon: guest-side memory reclaim with DAMON (docs/AGENT_PROTOCOL.md, "Guest memory
 * reclaim"). Compiled into the static agent (damon.c); served as the mux's guest
 * operations RECLAIM and RECLAIM_STATS (vmux.h vmux_set_ops).
 *
 * The agent, as the guest's init, owns one DAMON sysfs kdamond on the guest's physical
 * address space (`paddr`) with one DAMOS `pageout` scheme for regions not accessed for
 * a minimum age, bounded by a time quota, a size quota and optional free-memory
 * watermarks. Pages it frees go back to the host through virtio-balloon free-page
 * reporting; anonymous pages need the guest's swap (dsecd's swap disk, /init).
 */
#ifndef DSEC_DAMON_H
#define DSEC_DAMON_H

#include <stdint.h>

/* Guest operation numbers (the mux's OP frame; vmux.c serves 1-6 itself). */
enum { DAMON_OP_RECLAIM = 7, DAMON_OP_RECLAIM_STATS = 8 };

/* Bytes of the RECLAIM argument that starts a scheme (the layout is in damon.c and
 * docs/AGENT_PROTOCOL.md); a 1-byte argument 0 stops it. */
#define DAMON_RECLAIM_ARG_LEN 44
/* Bytes RECLAIM_STATS appends to its reply: u8 state, 7 bytes 0, then 9 u64 (BE). */
#define DAMON_STATS_REPLY_LEN 80

/* printf-like logging to the agent's log. */
typedef void (*damon_log_fn)(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Sets the log function and reads the test hook DSEC_AGENT_DAMON_ROOT (a directory that
 * stands for `/`: its sys/kernel/mm/damon, proc/iomem and proc/meminfo are used instead
 * of the kernel's; only then does RECLAIM run in an agent that is not PID 1). Call once. */
void damon_init(damon_log_fn log);

/* The vmux_op_fn of the DAMON ops (see vmux.h): RECLAIM and RECLAIM_STATS; -ENOSYS for
 * any other op. Never blocks on the kernel's kdamond: a stats refresh runs in a child. */
int32_t damon_op(unsigned op, const unsigned char *p, uint32_t len, unsigned char *out, uint32_t *outlen);

#endif
