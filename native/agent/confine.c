/*
 * confine: capabilities, seccomp filters and a VM guest's confinement (confine.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/audit.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "confine.h"
#include "landlock.h"
#include "util.h"

/* ---- capabilities ------------------------------------------------------------------ */

/* Capability sets of this thread (v3: two 32-bit words). */
int caps_get(struct __user_cap_data_struct d[2])
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	return (int)syscall(SYS_capget, &h, d);
}

int caps_set(struct __user_cap_data_struct d[2])
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	return (int)syscall(SYS_capset, &h, d);
}

/* Remove one capability from this thread's effective, permitted and inheritable sets. */
int caps_drop(int cap)
{
	struct __user_cap_data_struct d[2];
	if (caps_get(d) < 0)
		return -1;
	uint32_t bit = 1u << (cap & 31);
	int w = cap >> 5;
	if (!((d[w].effective | d[w].permitted | d[w].inheritable) & bit))
		return 0;
	d[w].effective &= ~bit;
	d[w].permitted &= ~bit;
	d[w].inheritable &= ~bit;
	return caps_set(d);
}

int caps_has_effective(int cap)
{
	struct __user_cap_data_struct d[2];
	if (caps_get(d) < 0)
		return 0;
	return (d[cap >> 5].effective >> (cap & 31)) & 1;
}

/* ---- fncall workers ----------------------------------------------------------------- */

/* --worker: the spec gave the agent CAP_SYS_ADMIN for isolated execs. Keep it in the
 * agent's effective/permitted sets, but drop it from the bounding set (and the
 * inheritable and ambient sets) before anything runs: after execve a program's
 * capabilities come from the bounding set (root) or from inheritable/ambient, so no
 * program the agent ever executes can hold it. Any failure is fatal: a worker must not
 * run execs with CAP_SYS_ADMIN, nor run without isolation. */
int worker_setup(void)
{
	if (!caps_has_effective(CAP_SYS_ADMIN)) {
		logf_("fatal: --worker: the agent has no CAP_SYS_ADMIN in its user namespace (the sandbox spec must grant it)");
		return -1;
	}
	if (prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) < 0) {
		logf_("fatal: --worker: prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN): %s", strerror(errno));
		return -1;
	}
	struct __user_cap_data_struct d[2];
	if (caps_get(d) < 0) {
		logf_("fatal: --worker: capget: %s", strerror(errno));
		return -1;
	}
	d[CAP_SYS_ADMIN >> 5].inheritable &= ~(1u << (CAP_SYS_ADMIN & 31));
	if (caps_set(d) < 0) {
		logf_("fatal: --worker: capset: %s", strerror(errno));
		return -1;
	}
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL) {
		logf_("fatal: --worker: clearing the ambient set: %s", strerror(errno));
		return -1;
	}
	logf_("worker: CAP_SYS_ADMIN dropped from the bounding set, kept by the agent for isolated execs");
	return 0;
}

/* A worker's second seccomp filter. runc's filter of a worker (daemon/security/seccomp.ts,
 * WORKER_AGENT_SYSCALLS) leaves mount, mount_setattr and umount2 allowed, because this
 * agent and each isolated call's namespace init mount (and a call host unmounts what it
 * mounted for the call before); every other denial of the default profile stays in force.
 * This filter, installed in every process the agent starts before its command's execve,
 * denies those three again with EPERM. seccomp filters stack and the
 * strictest verdict wins, so a worker's commands run under the full default profile.
 * Installing needs no privilege: runc set no_new_privs on the sandbox's init.
 * Numbers: arch/x86/entry/syscalls/syscall_64.tbl (mount 165, umount2 166, mount_setattr
 * 442; x32 uses the same numbers with bit 30 set) and syscall_32.tbl (mount 21, umount2
 * 52, mount_setattr 442).
 * Any other architecture is refused by runc's filter already and passes here. */
int worker_filter_install(void)
{
	/* Jump offsets are relative to the next instruction. */
	enum { I386 = 8, ALLOW32 = 13, DENY = 14 };
	struct sock_filter f[] = {
		/* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		/* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, I386 - 2),
		/* 2 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		/* 3 */ BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~0x40000000u),
		/* 4 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 165, DENY - 5, 0),
		/* 5 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 166, DENY - 6, 0),
		/* 6 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 442, DENY - 7, 0),
		/* 7 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		/* 8 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_I386, 0, ALLOW32 - 9),
		/* 9 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		/* 10 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 21, DENY - 11, 0),
		/* 11 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 52, DENY - 12, 0),
		/* 12 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 442, DENY - 13, 0),
		/* 13 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		/* 14 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
	};
	struct sock_fprog prog = { .len = (unsigned short)(sizeof f / sizeof f[0]), .filter = f };
	return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
}

/* ---- guest confinement (microvm tier) ------------------------------------------------ */

/*
 * Inside a microVM the agent is the guest's PID 1, root with every capability, and it
 * keeps them: it mounts (the read-only paths below), runs file operations for dsecd and
 * reaps. What it starts is confined like a container sandbox's processes
 * (docs/SECURITY.md "The microvm tier: inside the guest"). With --guest-confine the agent
 * refuses every exec until dsecd has sent the confinement (vmux op CONFINE, once per
 * boot; guest_confine below), so no command ever runs unconfined.
 *
 * The CONFINE payload is text, one directive a line (dsecd: daemon/drivers/microvm/confine.ts):
 *   mkdir PATH              a writable_paths directory the image lacks (mode 0755, root)
 *   bind PATH ro|rw         a bind of PATH onto itself, read-only or read-write, in order
 *   rootro                  make the root mount read-only (after the binds)
 *   caps MASK               decimal: the capabilities commands keep (bounding, effective,
 *                           permitted, inheritable; ambient cleared)
 *   rule NR ERRNO [ARG MASK DATUM [GE]]
 *                           x86-64 syscall NR fails with ERRNO, unconditionally or when
 *                           (low 32 bits of argument ARG & MASK) == DATUM, or with GE 1
 *                           when the whole 64-bit argument >= DATUM
 *   landlock 0|1            restrict commands with Landlock on the writable places
 *   writable PATH           a writable place (Landlock: every right)
 * Every command then gets, in its child before execve: Landlock (when asked and the
 * guest kernel has it), the bounding set and capabilities reduced to MASK, no_new_privs,
 * and the seccomp filter built from the rules (any ABI but x86-64 kills the process:
 * i386 and x32 numbers differ and are not in the table).
 */
#define GC_MAX_RULES 512
#define GC_MAX_MOUNTS 256

struct gc_rule {
	uint32_t nr, err;
	int arg; /* -1: unconditional */
	uint32_t mask, datum;
	int ge; /* 1: the whole 64-bit argument >= datum (mask unused); 0: (low word & mask) == datum */
};

static struct {
	int required; /* --guest-confine */
	int applied;
	uint64_t caps;
	int landlock;
	int nwritable;
	char *writable[LL_MAX_WRITABLE];
	struct sock_filter *filter;
	unsigned short flen;
} g_gc;

void guest_confine_require(void)
{
	g_gc.required = 1;
}

int guest_confine_pending(void)
{
	return g_gc.required && !g_gc.applied;
}

int guest_confine_applied(void)
{
	return g_gc.applied;
}

/* The seccomp program of `rules` (see the comment above); NULL on ENOMEM or too many. */
static struct sock_filter *gc_build_filter(const struct gc_rule *rules, int n, unsigned short *len)
{
	size_t cap = 8 + (size_t)n * 8;
	if (cap > 4096)
		return NULL;
	struct sock_filter *f = calloc(cap, sizeof *f);
	if (!f)
		return NULL;
	size_t i = 0;
	f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
	f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
	f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
	f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
	f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1); /* x32 */
	f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
	for (int k = 0; k < n; k++) {
		const struct gc_rule *r = &rules[k];
		uint32_t ret = SECCOMP_RET_ERRNO | (r->err & SECCOMP_RET_DATA);
		if (r->arg < 0) {
			f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, r->nr, 0, 1);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, ret);
		} else if (r->ge) {
			/* 64-bit unsigned >= datum: any high bit set is >= it; else compare the low word. */
			f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, r->nr, 0, 7);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args) + 8u * (unsigned)r->arg + 4u);
			f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, ret);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args) + 8u * (unsigned)r->arg);
			f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, r->datum, 0, 1);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, ret);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
		} else {
			/* A is nr on entry and on every way out. Low word first: x86-64 is little-endian. */
			f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, r->nr, 0, 5);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args) + 8u * (unsigned)r->arg);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_ALU | BPF_AND | BPF_K, r->mask);
			f[i++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, r->datum, 0, 1);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, ret);
			f[i++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
		}
	}
	f[i++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
	*len = (unsigned short)i;
	return f;
}

/* The vmux op CONFINE (once per boot): applies the mounts, keeps the rest for every
 * command. Returns the Landlock ABI the commands get (0: none), or -errno; on failure no
 * exec is ever started (g_gc.applied stays 0). */
int32_t guest_confine(const unsigned char *p, uint32_t len)
{
	if (g_gc.applied)
		return -EALREADY;
	char *text = xstrndup((const char *)p, len);
	static struct gc_rule rules[GC_MAX_RULES];
	int nrules = 0, rc = 0;
	uint64_t caps = 0;
	int have_caps = 0, landlock = 0;
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char *arg = strchr(line, ' ');
		if (arg)
			*arg++ = 0;
		if (strcmp(line, "mkdir") == 0 && arg && arg[0] == '/') {
			if (mkdir(arg, 0755) < 0 && errno != EEXIST) {
				rc = -errno;
				logf_("confine: mkdir %s: %s", arg, strerror(errno));
				break;
			}
			struct stat st;
			if (lstat(arg, &st) < 0 || !S_ISDIR(st.st_mode)) {
				rc = -ENOTDIR;
				logf_("confine: %s is not a directory", arg);
				break;
			}
		} else if (strcmp(line, "bind") == 0 && arg) {
			char *mode = strrchr(arg, ' ');
			if (!mode || arg[0] != '/') {
				rc = -EINVAL;
				break;
			}
			*mode++ = 0;
			if (mount(arg, arg, NULL, MS_BIND, NULL) < 0 ||
			    (strcmp(mode, "ro") == 0 && mount(NULL, arg, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) < 0)) {
				rc = -errno;
				logf_("confine: bind %s %s: %s", arg, mode, strerror(errno));
				break;
			}
		} else if (strcmp(line, "rootro") == 0) {
			if (mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) < 0) {
				rc = -errno;
				logf_("confine: remount / read-only: %s", strerror(errno));
				break;
			}
		} else if (strcmp(line, "caps") == 0 && arg) {
			caps = strtoull(arg, NULL, 10);
			have_caps = 1;
		} else if (strcmp(line, "rule") == 0 && arg && nrules < GC_MAX_RULES) {
			struct gc_rule *r = &rules[nrules];
			unsigned long long nr, err, a, mask, datum, ge = 0;
			int k = sscanf(arg, "%llu %llu %llu %llu %llu %llu", &nr, &err, &a, &mask, &datum, &ge);
			if ((k != 2 && k != 5 && k != 6) || nr >= 0x40000000u || err > 4095 || (k >= 5 && (a > 5 || mask > 0xffffffffu || datum > 0xffffffffu)) || ge > 1) {
				rc = -EINVAL;
				break;
			}
			*r = (struct gc_rule){ .nr = (uint32_t)nr, .err = (uint32_t)err, .arg = k >= 5 ? (int)a : -1, .mask = (uint32_t)(k >= 5 ? mask : 0), .datum = (uint32_t)(k >= 5 ? datum : 0), .ge = (int)ge };
			nrules++;
		} else if (strcmp(line, "landlock") == 0 && arg) {
			landlock = strcmp(arg, "1") == 0;
		} else if (strcmp(line, "writable") == 0 && arg && arg[0] == '/' && g_gc.nwritable < LL_MAX_WRITABLE) {
			g_gc.writable[g_gc.nwritable++] = xstrndup(arg, strlen(arg));
		} else {
			rc = -EINVAL;
			logf_("confine: bad directive %s", line);
			break;
		}
	}
	free(text);
	if (rc == 0 && !have_caps)
		rc = -EINVAL;
	if (rc == 0 && !(g_gc.filter = gc_build_filter(rules, nrules, &g_gc.flen)))
		rc = -E2BIG;
	if (rc < 0)
		return rc;
	g_gc.caps = caps;
	g_gc.landlock = landlock && g_landlock_abi > 0;
	g_gc.applied = 1;
	logf_("confine: commands keep capabilities %#llx, %d seccomp rule(s), landlock %s", (unsigned long long)caps, nrules,
	      g_gc.landlock ? "on" : landlock ? "asked, but the guest kernel has none" : "off");
	return g_gc.landlock ? g_landlock_abi : 0;
}

/* In the exec child, before the user switch: Landlock, then the capability sets. Only
 * system calls (the child shares the agent's memory, spawn.h). */
int guest_confine_child_caps(void)
{
	if (g_gc.landlock) {
		if (landlock_apply((const char *const *)g_gc.writable, g_gc.nwritable, 0, NULL, 0) < 0)
			return errno ? errno : EPERM;
	}
	for (int cap = 0; cap < 64; cap++) {
		if (g_gc.caps >> cap & 1)
			continue;
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
			if (errno == EINVAL)
				break; /* past the kernel's last capability */
			return errno;
		}
	}
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
		return errno;
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d) < 0)
		return errno;
	for (int w = 0; w < 2; w++) {
		uint32_t keep = (uint32_t)(g_gc.caps >> (32 * w));
		d[w].effective &= keep;
		d[w].permitted &= keep;
		d[w].inheritable &= keep;
	}
	if (syscall(SYS_capset, &h, d) < 0)
		return errno;
	return 0;
}

/* In the exec child, after the user switch: no_new_privs and the seccomp filter. */
int guest_confine_child_filter(void)
{
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return errno;
	struct sock_fprog prog = { .len = g_gc.flen, .filter = g_gc.filter };
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0)
		return errno;
	return 0;
}
