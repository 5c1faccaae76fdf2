/*
 * isolate: isolated execs (EXEC ISOLATE, docs/AGENT_PROTOCOL.md "Isolated execs"), how
 * an fncall worker runs each call. The exec is cloned into fresh pid, mount, IPC and UTS
 * namespaces; its first process, the namespace init, makes every mount private and
 * read-only, mounts fresh tmpfs on /tmp, /dev/shm and the SCRATCH paths, a fresh mqueue
 * and a fresh /proc with the sandbox's /proc masks re-created, applies Landlock
 * (--landlock), drops CAP_SYS_ADMIN, starts the command, reaps, and reports the command's
 * wait status on a status pipe before it exits, taking everything of the call with it.
 * isolate.c says why it is built this way.
 *
 * Available (HELLO feature "isolate") only when the agent holds CAP_SYS_ADMIN in its user
 * namespace, the kernel has mount_setattr (5.12) and /proc/self/mountinfo shows the
 * /proc mounts (isolate_probe).
 */
#ifndef DSEC_AGENT_ISOLATE_H
#define DSEC_AGENT_ISOLATE_H

#include <sys/types.h>

#include "spawn.h"

/* Size of the per-call tmpfs on /tmp and on /dev/shm when the request gives 0: 64 MiB,
 * the size the OCI spec gives a sandbox's /dev/shm (daemon/drivers/container/spec.ts). */
#define ISO_DEFAULT_TMPFS_BYTES (64ull << 20)

/* Set by isolate_probe: whether isolated execs can be served, and why not otherwise. */
extern int g_isolate;
extern char g_isolate_why[160];

/* At start: can this agent serve isolated execs? Sets g_isolate / g_isolate_why and
 * records the /proc masks every call re-creates (logged). */
void isolate_probe(void);
/* fork() into fresh pid, mount, IPC and UTS namespaces (the child is pid 1 of its pid
 * namespace): the pid, 0 in the child, or -1 with errno. */
pid_t clone_isolated(void);
/* In the cloned child: be the call's namespace init (see above). pl is the exec's plan
 * (spawn.h: the request, the stdio ends, the error pipe), statusfd the status pipe. Never
 * returns. */
void __attribute__((noreturn)) ns_init_main(struct spawn_plan *pl, int statusfd);
/* In the cloned child: be a call host (callhost.h) serving the calls sent on ctl. Never
 * returns. */
void __attribute__((noreturn)) callhost_main(int ctl);

#endif
