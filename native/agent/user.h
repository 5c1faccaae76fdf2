/*
 * user: who an exec or a file operation runs as. The sandbox's own /etc/passwd and
 * /etc/group are read directly on each use (the agent is static: no NSS), so a user added
 * to the image or by a command is seen at once.
 */
#ifndef DSEC_AGENT_USER_H
#define DSEC_AGENT_USER_H

#include <stdint.h>
#include <sys/types.h>

/* The identity a file operation runs as (fsuid/fsgid + supplementary groups). */
struct creds {
	int noop;           /* unprivileged agent asked for its own identity: no switch */
	char home[512];     /* the user's home from /etc/passwd ("/" when it has no entry) */
	uint32_t uid, gid;
	int ngroups;
	gid_t groups[256];
};

/* Resolve a user spec: "uid", "uid:gid", "name", "name:group" (group numeric or a name)
 * against the sandbox's /etc/passwd and /etc/group into *cr: uid and gid (a numeric user
 * without an entry gets gid = uid), the home ("/" without one), the supplementary groups
 * (the primary gid first, then every group listing the user; at most 256) and noop (an
 * unprivileged agent asked for its own identity). Used by execs and by file operations,
 * always in the agent (an exec's child shares the agent's memory and must not allocate). Returns 0, ST_USER_UNKNOWN, ST_GROUP_UNKNOWN (errno
 * ENOENT) or ST_SETUP (ENOMEM), the stage codes of spawn.h. */
int user_resolve(const char *spec, struct creds *cr);

#endif
