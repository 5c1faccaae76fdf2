/*
 * vmux: the guest side of the agent stream multiplexer (docs/AGENT_PROTOCOL.md, "The VM
 * transport: stream multiplexer"). Compiled into the static agent (vmux.c).
 *
 * In a microVM the agent has no listening socket: dsecd reaches it through one
 * virtio-serial port, a single byte stream. vmux carries many independent logical
 * streams over it and hands each new stream to the agent as one end of a fresh
 * socketpair, which the agent serves exactly like a connection accepted on its
 * listening socket. The agent's main loop watches the one fd vmux_open() returns (an
 * epoll fd of vmux's own) and calls vmux_run() when it is readable.
 */
#ifndef DSEC_VMUX_H
#define DSEC_VMUX_H

#include <stdint.h>

/* Serve fd (AF_UNIX SOCK_STREAM, non-blocking, close-on-exec) as an accepted connection.
 * Returns 0, or -1 when it cannot (the callee then has closed fd). */
typedef int (*vmux_adopt_fn)(int fd);
/* printf-like logging to the agent's log. */
typedef void (*vmux_log_fn)(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Opens the mux on the port at `path` (opened O_RDWR|O_NONBLOCK|O_CLOEXEC) or, when path
 * is NULL, on the inherited fd `fd` (tests: a socketpair end). Returns an fd to watch for
 * EPOLLIN (never blocks), or -1 with the reason logged. */
int vmux_open(const char *path, int fd, vmux_adopt_fn adopt, vmux_log_fn log);

/* Handler of the op CONFINE (the confinement of the guest's commands, agent.c
 * guest_confine): gets the op's argument bytes, returns its result (>= 0, or -errno).
 * Without one, CONFINE answers -ENOSYS. */
typedef int32_t (*vmux_confine_fn)(const unsigned char *p, uint32_t len);
void vmux_set_confine(vmux_confine_fn fn);

/* Largest reply payload an extension op may append to its OP_REPLY (bytes). */
#define VMUX_OP_REPLY_MAX 1024

/* Handler of the guest operations vmux itself does not serve (op numbers 7 and above:
 * damon.c's RECLAIM and RECLAIM_STATS): gets the op number and its argument bytes, may
 * append up to VMUX_OP_REPLY_MAX bytes to the reply (out, *outlen set to their number;
 * 0 on entry) and returns the result (>= 0, or -errno). Without one, those ops answer
 * -ENOSYS. */
typedef int32_t (*vmux_op_fn)(unsigned op, const unsigned char *p, uint32_t len, unsigned char *out, uint32_t *outlen);
void vmux_set_ops(vmux_op_fn fn);

/* Handles every event that is ready on the mux (port, streams, reconnect timer); never
 * blocks. Call when the fd from vmux_open() is readable. */
void vmux_run(void);

#endif
