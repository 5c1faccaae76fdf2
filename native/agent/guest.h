/*
 * guest: the agent as a microVM guest's init, the glue between the agent and its VM
 * transport (docs/AGENT_PROTOCOL.md "The VM transport: stream multiplexer"). In a guest
 * the agent has no listening socket: vmux.c serves the stream multiplexer on one
 * virtio-serial port and hands each new stream to conn.c as a connection; its guest
 * operations are CONFINE (confine.c guest_confine) and RECLAIM / RECLAIM_STATS (damon.c).
 */
#ifndef DSEC_AGENT_GUEST_H
#define DSEC_AGENT_GUEST_H

/* Open the mux on the port at `path` (--vmux) or, when path is NULL, on the inherited fd
 * `fd` (--vmux-fd, tests), wire its streams and guest operations, and watch it in the
 * loop. 0, or -1 (logged). */
int guest_transport_start(const char *path, int fd);

#endif
