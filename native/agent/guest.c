/*
 * guest: the VM transport's wiring into the agent (guest.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/epoll.h>

#include "confine.h"
#include "conn.h"
#include "damon.h"
#include "guest.h"
#include "loop.h"
#include "util.h"
#include "vmux.h"

static struct watch g_vmux_w;

int guest_transport_start(const char *path, int fd)
{
	/* Connections are the streams of the mux on the port (vmux.c). */
	int vfd = vmux_open(path, fd, conn_adopt, logf_);
	vmux_set_confine(guest_confine);
	damon_init(logf_);
	vmux_set_ops(damon_op); /* RECLAIM, RECLAIM_STATS (damon.c) */
	if (vfd < 0)
		return -1;
	if (watch_add(&g_vmux_w, W_VMUX, vfd, NULL, EPOLLIN) < 0) {
		logf_("fatal: epoll_ctl: %s", strerror(errno));
		return -1;
	}
	return 0;
}
