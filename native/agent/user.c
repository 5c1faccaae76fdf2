/*
 * user: users and groups from the sandbox's /etc/passwd and /etc/group (user.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "spawn.h"
#include "user.h"
#include "util.h"

/* Split a colon-separated line in place into at most max fields; returns the count. */
static int split_fields(char *line, char **f, int max)
{
	int n = 0;
	f[n++] = line;
	for (char *p = line; *p && n < max; p++)
		if (*p == ':') {
			*p = 0;
			f[n++] = p + 1;
		}
	return n;
}

struct pwent {
	int found;
	char name[256];
	char home[512];
	uint32_t uid, gid;
};

/* Look an entry up in the sandbox's /etc/passwd, by name (if name) or by uid. */
static void passwd_lookup(const char *name, uint32_t uid, struct pwent *out)
{
	out->found = 0;
	char *buf = slurp("/etc/passwd");
	if (!buf)
		return;
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *f[7];
		if (line[0] == '#' || line[0] == '+' || line[0] == '-')
			continue;
		int split_n = split_fields(line, f, 7);
		if (split_n < 4)
			continue;
		uint32_t u, g;
		if (parse_id(f[2], &u) || parse_id(f[3], &g))
			continue;
		if (name ? strcmp(f[0], name) == 0 : u == uid) {
			if (strlen(f[0]) >= sizeof out->name)
				continue;
			out->found = 1;
			strcpy(out->name, f[0]);
			out->home[0] = 0;
			if (split_n >= 6 && strlen(f[5]) < sizeof out->home)
				strcpy(out->home, f[5]);
			out->uid = u;
			out->gid = g;
			break;
		}
	}
	free(buf);
}

/* Resolve a group name to a gid via /etc/group; returns 0 if found. */
static int group_lookup(const char *name, uint32_t *gid)
{
	char *buf = slurp("/etc/group");
	int rc = -1;
	if (!buf)
		return -1;
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *f[4];
		if (line[0] == '#' || split_fields(line, f, 4) < 3)
			continue;
		uint32_t g;
		if (strcmp(f[0], name) == 0 && parse_id(f[2], &g) == 0) {
			*gid = g;
			rc = 0;
			break;
		}
	}
	free(buf);
	return rc;
}

/* Supplementary groups: primary gid first, then every /etc/group entry listing user. */
static int member_groups(const char *user, gid_t primary, gid_t *out, int max)
{
	int n = 0;
	out[n++] = primary;
	if (!user)
		return n;
	char *buf = slurp("/etc/group");
	if (!buf)
		return n;
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line && n < max; line = strtok_r(NULL, "\n", &save)) {
		char *f[4];
		if (line[0] == '#' || split_fields(line, f, 4) < 4)
			continue;
		uint32_t g;
		if (parse_id(f[2], &g))
			continue;
		char *save2 = NULL;
		for (char *m = strtok_r(f[3], ",", &save2); m; m = strtok_r(NULL, ",", &save2)) {
			if (strcmp(m, user) == 0) {
				int dup = 0;
				for (int i = 0; i < n; i++)
					if (out[i] == (gid_t)g)
						dup = 1;
				if (!dup)
					out[n++] = (gid_t)g;
				break;
			}
		}
	}
	free(buf);
	return n;
}

/* Resolve a user spec: "uid", "uid:gid", "name", "name:group" (group numeric or a
 * name) against the sandbox's /etc/passwd and /etc/group. Used by execs and by file
 * operations, in the agent. Returns 0, ST_USER_UNKNOWN, ST_GROUP_UNKNOWN
 * (errno ENOENT) or ST_SETUP (ENOMEM). */
int user_resolve(const char *spec, struct creds *cr)
{
	char *u = strdup(spec);
	if (!u)
		return ST_SETUP;
	char *g = strchr(u, ':');
	if (g)
		*g++ = 0;
	if (g && !*g)
		g = NULL;

	struct pwent pw;
	uint32_t uid, gid;
	if (parse_id(u, &uid) == 0) {
		passwd_lookup(NULL, uid, &pw);
	} else {
		passwd_lookup(u, 0, &pw);
		if (!pw.found) {
			free(u);
			return ST_USER_UNKNOWN;
		}
		uid = pw.uid;
	}
	if (g) {
		if (parse_id(g, &gid) != 0 && group_lookup(g, &gid) != 0) {
			free(u);
			return ST_GROUP_UNKNOWN;
		}
	} else {
		gid = pw.found ? pw.gid : uid; /* numeric user without a passwd entry: gid = uid */
	}
	free(u);
	cr->uid = uid;
	cr->gid = gid;
	strcpy(cr->home, pw.found && pw.home[0] ? pw.home : "/");
	/* Unprivileged agent (tests) asked for its own identity: nothing to switch. */
	cr->noop = geteuid() != 0 && uid == geteuid() && gid == getegid();
	cr->ngroups = member_groups(pw.found ? pw.name : NULL, (gid_t)gid, cr->groups, 256);
	return 0;
}
