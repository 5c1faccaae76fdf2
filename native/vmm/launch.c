/*
 * dsec-vmm-launch: starts a VMM (QEMU) for dsecd inside the sandbox's cgroup, so that the
 * VMM's memory (the guest's RAM) and CPU are charged to the sandbox from its first page.
 * Node cannot run code between fork and exec, hence this small exec wrapper.
 *
 *   dsec-vmm-launch [--cgroup-procs FILE]... [--sched-idle] [--no-thp] -- PROGRAM [ARG]...
 *   dsec-vmm-launch --tsc-khz
 *
 *   --cgroup-procs FILE  write "0" to FILE (a cgroup.procs file): join that cgroup; one per
 *                        hierarchy (cgroup v1 has several). Joined before anything else.
 *   --sched-idle         RLIMIT_NICE 0 and SCHED_IDLE for the VMM (a batch sandbox), as
 *                        the agent's --sched-idle does for container sandboxes.
 *   --no-thp             prctl(PR_SET_THP_DISABLE): no transparent huge pages for the VMM
 *                        (inherited across exec). QEMU madvises guest RAM for THP, so a
 *                        guest touching one byte of a 2 MiB region makes the host back
 *                        all of it: measured here, an idle 512 MiB guest using ~46 MiB had
 *                        138 MiB resident with THP and far less without.
 *   --tsc-khz            print the host's TSC frequency in kHz (measured against
 *                        CLOCK_MONOTONIC_RAW over 3 x 20 ms, median) and exit: a TCG guest's
 *                        TSC runs at the host's rate, and telling the guest kernel
 *                        (tsc_early_khz=) spares it a calibration that fails on a busy host.
 *
 * Confinement of the VMM (docs/SECURITY.md "VMM confinement"), each optional, applied in
 * this order after the cgroup join, THP and scheduling steps:
 *
 *   --new-root DIR       a mount namespace of its own (unshare(CLONE_NEWNS), every mount
 *                        made private) whose root is a fresh tmpfs mounted on DIR (an empty
 *                        host directory) holding only the paths given by --ro/--rw/--dev, at
 *                        the same paths as on the host; then pivot_root into it, the old
 *                        root detached, and the tmpfs remounted read-only. Nothing else of
 *                        the host is visible: no /proc, /sys, /etc, /home, no other sandbox.
 *   --ro PATH            bind PATH (file or directory; symlinks resolved on the host side)
 *                        read-only, nosuid, nodev into the new root. Repeatable.
 *   --rw PATH            the same, writable (the sandbox dir: disk, sockets, logs).
 *   --dev PATH           bind a device node (/dev/null, /dev/urandom, /dev/kvm): read-write,
 *                        nosuid, device access kept.
 *   --uid N --gid N      drop to this uid/gid (setgroups, setresgid, setresuid) after the
 *                        mounts: every capability goes with uid 0. dsecd passes the
 *                        sandbox's own host uid (the base of its uid range).
 *   --groups G[,G...]    supplementary groups kept after the drop (e.g. /dev/kvm's group).
 *   --seccomp            no_new_privs and dsec's seccomp filter (below), installed last, so
 *                        it covers QEMU from its first instruction; QEMU's own `-sandbox`
 *                        filter stacks on top of it.
 *
 * dsec's filter answers EPERM for system calls a VMM never needs and that would widen what
 * a compromised QEMU can reach: namespaces and mounts (unshare, setns, mount, umount2,
 * pivot_root, chroot, the new mount API, open_by_handle_at), other processes (ptrace,
 * process_vm_readv/writev, kcmp, pidfd_getfd), the kernel's larger attack surfaces (bpf,
 * perf_event_open, keyctl/add_key/request_key, userfaultfd, io_uring, fanotify), modules
 * and kexec, clocks, swap, reboot, quotas, iopl/ioperm, personality. QEMU's own filter
 * (-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny)
 * kills on set*id, fork/exec and scheduling changes. A foreign architecture or x32 system
 * call kills the process.
 *
 * Then it execs PROGRAM (PATH search, or the absolute path inside the new root), so the pid
 * dsecd spawned is the VMM's. Exit status 125: a setup step failed (message on stderr);
 * 127: PROGRAM could not be executed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <grp.h>
#include <limits.h>
#include <stddef.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

static int fail(const char *what, const char *arg)
{
	fprintf(stderr, "dsec-vmm-launch: %s%s%s: %s\n", what, arg ? " " : "", arg ? arg : "", strerror(errno));
	return 125;
}

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
static uint64_t ns_raw(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static int tsc_khz(void)
{
	uint64_t khz[3];
	for (int i = 0; i < 3; i++) {
		uint64_t t0 = ns_raw(), c0 = __rdtsc();
		struct timespec d = { 0, 20000000 };
		nanosleep(&d, NULL);
		uint64_t t1 = ns_raw(), c1 = __rdtsc();
		khz[i] = (c1 - c0) * 1000000ull / (t1 - t0);
	}
	qsort(khz, 3, sizeof khz[0], cmp_u64);
	printf("%llu\n", (unsigned long long)khz[1]);
	return 0;
}
#else
static int tsc_khz(void)
{
	fprintf(stderr, "dsec-vmm-launch: --tsc-khz: not an x86 host\n");
	return 125;
}
#endif


/* One path to bind into the new root. */
struct bind {
	const char *path;
	int kind; /* 0 read-only, 1 read-write, 2 device */
};

#define MAX_BINDS 512
#define MAX_GROUPS 16

/* mkdir -p of `p` (every component, mode 0755); EEXIST is fine. */
static int mkdirs(const char *p)
{
	char buf[PATH_MAX];
	size_t n = strlen(p);
	if (n >= sizeof buf) {
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(buf, p, n + 1);
	for (char *s = buf + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(buf, 0755) < 0 && errno != EEXIST)
			return -1;
		*s = '/';
	}
	if (mkdir(buf, 0755) < 0 && errno != EEXIST)
		return -1;
	return 0;
}

/* Binds host path b->path at root + b->path (made as an empty file or dir first). */
static int bind_one(const char *root, const struct bind *b)
{
	char src[PATH_MAX], dst[PATH_MAX], parent[PATH_MAX];
	struct stat st;
	if (!realpath(b->path, src))
		return fail("resolve", b->path);
	if (stat(src, &st) < 0)
		return fail("stat", src);
	if (snprintf(dst, sizeof dst, "%s%s", root, b->path) >= (int)sizeof dst) {
		errno = ENAMETOOLONG;
		return fail("bind target for", b->path);
	}
	snprintf(parent, sizeof parent, "%s", dst);
	char *slash = strrchr(parent, '/');
	if (slash && slash != parent) {
		*slash = 0;
		if (mkdirs(parent) < 0)
			return fail("mkdir", parent);
	}
	if (S_ISDIR(st.st_mode)) {
		if (mkdir(dst, 0755) < 0 && errno != EEXIST)
			return fail("mkdir", dst);
	} else {
		int fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		if (fd < 0 && errno != EEXIST && errno != EISDIR)
			return fail("create bind target", dst);
		if (fd >= 0)
			close(fd);
	}
	if (mount(src, dst, NULL, MS_BIND, NULL) < 0)
		return fail("bind", src);
	unsigned long fl = MS_REMOUNT | MS_BIND | MS_NOSUID;
	if (b->kind == 0)
		fl |= MS_RDONLY | MS_NODEV;
	else if (b->kind == 1)
		fl |= MS_NODEV;
	if (mount(NULL, dst, NULL, fl, NULL) < 0)
		return fail("remount bind", dst);
	return 0;
}

/* The mount namespace step (see the header comment). */
static int new_root(const char *root, const struct bind *binds, int nbinds)
{
	if (unshare(CLONE_NEWNS) < 0)
		return fail("unshare(CLONE_NEWNS)", NULL);
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		return fail("make mounts private", NULL);
	if (mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m,nr_inodes=4096") < 0)
		return fail("mount tmpfs on", root);
	for (int i = 0; i < nbinds; i++)
		if (bind_one(root, &binds[i]))
			return 125;
	if (chdir(root) < 0)
		return fail("chdir", root);
	/* pivot_root(".", "."): the old root ends up on top of the new one; detach it. */
	if (syscall(SYS_pivot_root, ".", ".") < 0)
		return fail("pivot_root", root);
	if (umount2(".", MNT_DETACH) < 0)
		return fail("detach the old root", NULL);
	if (chdir("/") < 0)
		return fail("chdir /", NULL);
	if (mount(NULL, "/", NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0755") < 0)
		return fail("remount the new root read-only", NULL);
	return 0;
}

#if defined(__x86_64__)
#define DSEC_AUDIT_ARCH AUDIT_ARCH_X86_64
/* System calls dsec's filter answers with EPERM (see the header comment). */
static const int denied[] = {
	SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev, SYS_kcmp,
	SYS_bpf, SYS_perf_event_open, SYS_keyctl, SYS_add_key, SYS_request_key,
	SYS_userfaultfd, SYS_io_uring_setup, SYS_io_uring_enter, SYS_io_uring_register,
	SYS_fanotify_init, SYS_unshare, SYS_setns, SYS_mount, SYS_umount2, SYS_pivot_root,
	SYS_chroot, SYS_open_by_handle_at, SYS_name_to_handle_at,
	SYS_open_tree, SYS_move_mount, SYS_fsopen, SYS_fsconfig, SYS_fsmount, SYS_fspick,
	SYS_mount_setattr, SYS_init_module, SYS_finit_module, SYS_delete_module,
	SYS_kexec_load, SYS_kexec_file_load, SYS_reboot, SYS_swapon, SYS_swapoff, SYS_acct,
	SYS_settimeofday, SYS_clock_settime, SYS_clock_adjtime, SYS_adjtimex,
	SYS_quotactl, SYS_iopl, SYS_ioperm, SYS_personality, SYS_syslog, SYS_sethostname,
	SYS_setdomainname, SYS_vhangup, SYS_lookup_dcookie, SYS_uselib, SYS_pidfd_getfd,
#ifdef SYS_quotactl_fd
	SYS_quotactl_fd,
#endif
};

static int install_seccomp(void)
{
	enum { N = sizeof denied / sizeof denied[0] };
	/*
	 * 0 arch; 1 right arch? skip; 2 kill; 3 nr; 4 x32 (bit 30)? to the last slot (kill);
	 * then one (nr == denied[i]? EPERM) pair per entry; ALLOW; KILL.
	 */
	struct sock_filter f[7 + 2 * N];
	int k = 0;
	f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
	f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, DSEC_AUDIT_ARCH, 1, 0);
	f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
	f[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
	f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 2 * N + 1, 0);
	for (int i = 0; i < N; i++) {
		f[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)denied[i], 0, 1);
		f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA));
	}
	f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
	f[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
	struct sock_fprog prog = { .len = (unsigned short)k, .filter = f };
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return fail("prctl(PR_SET_NO_NEW_PRIVS)", NULL);
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0)
		return fail("seccomp(SECCOMP_SET_MODE_FILTER)", NULL);
	return 0;
}
#else
static int install_seccomp(void)
{
	fprintf(stderr, "dsec-vmm-launch: --seccomp: dsec's filter is built for x86_64 only\n");
	return 125;
}
#endif

int main(int argc, char **argv)
{
	int i = 1, sched_idle = 0, no_thp = 0, seccomp = 0, nbinds = 0, ngroups = 0;
	long uid = -1, gid = -1;
	const char *root = NULL;
	static struct bind binds[MAX_BINDS];
	gid_t groups[MAX_GROUPS];
	if (argc == 2 && strcmp(argv[1], "--tsc-khz") == 0)
		return tsc_khz();
	for (; i < argc; i++) {
		if (strcmp(argv[i], "--") == 0) {
			i++;
			break;
		}
		if (strcmp(argv[i], "--cgroup-procs") == 0 && i + 1 < argc) {
			const char *f = argv[++i];
			int fd = open(f, O_WRONLY | O_CLOEXEC);
			if (fd < 0)
				return fail("open", f);
			if (write(fd, "0", 1) != 1)
				return fail("join cgroup through", f);
			close(fd);
		} else if (strcmp(argv[i], "--sched-idle") == 0) {
			sched_idle = 1;
		} else if (strcmp(argv[i], "--no-thp") == 0) {
			no_thp = 1;
		} else if (strcmp(argv[i], "--new-root") == 0 && i + 1 < argc) {
			root = argv[++i];
		} else if ((strcmp(argv[i], "--ro") == 0 || strcmp(argv[i], "--rw") == 0 || strcmp(argv[i], "--dev") == 0) && i + 1 < argc) {
			if (nbinds >= MAX_BINDS) {
				fprintf(stderr, "dsec-vmm-launch: more than %d paths to bind\n", MAX_BINDS);
				return 125;
			}
			binds[nbinds].kind = argv[i][2] == 'o' ? 0 : argv[i][2] == 'w' ? 1 : 2;
			binds[nbinds++].path = argv[++i];
		} else if (strcmp(argv[i], "--uid") == 0 && i + 1 < argc) {
			uid = strtol(argv[++i], NULL, 10);
		} else if (strcmp(argv[i], "--gid") == 0 && i + 1 < argc) {
			gid = strtol(argv[++i], NULL, 10);
		} else if (strcmp(argv[i], "--groups") == 0 && i + 1 < argc) {
			char *s = argv[++i], *end;
			while (*s && ngroups < MAX_GROUPS) {
				groups[ngroups++] = (gid_t)strtoul(s, &end, 10);
				s = *end == ',' ? end + 1 : end;
				if (end == s && *s)
					break;
			}
		} else if (strcmp(argv[i], "--seccomp") == 0) {
			seccomp = 1;
		} else {
			fprintf(stderr, "usage: dsec-vmm-launch [--cgroup-procs FILE]... [--sched-idle] [--no-thp] [--new-root DIR [--ro|--rw|--dev PATH]...]\n"
					"                       [--uid N --gid N [--groups G,...]] [--seccomp] -- PROGRAM [ARG]...\n"
					"       dsec-vmm-launch --tsc-khz\n");
			return 125;
		}
	}
	if (i >= argc) {
		fprintf(stderr, "dsec-vmm-launch: no program given after --\n");
		return 125;
	}
	if (no_thp && prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) < 0)
		return fail("prctl(PR_SET_THP_DISABLE)", NULL);
	if (sched_idle) {
		struct rlimit nl = { 0, 0 };
		struct sched_param sp = { .sched_priority = 0 };
		if (setrlimit(RLIMIT_NICE, &nl) < 0)
			return fail("setrlimit(RLIMIT_NICE, 0)", NULL);
		if (sched_setscheduler(0, SCHED_IDLE, &sp) < 0)
			return fail("sched_setscheduler(SCHED_IDLE)", NULL);
	}
	if ((uid < 0) != (gid < 0)) {
		fprintf(stderr, "dsec-vmm-launch: --uid and --gid go together\n");
		return 125;
	}
	if (root) {
		int r = new_root(root, binds, nbinds);
		if (r)
			return r;
	}
	if (uid >= 0) {
		if (setgroups((size_t)ngroups, groups) < 0)
			return fail("setgroups", NULL);
		if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) < 0)
			return fail("setresgid", NULL);
		if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) < 0)
			return fail("setresuid", NULL);
	}
	if (seccomp && install_seccomp())
		return 125;
	execvp(argv[i], argv + i);
	fprintf(stderr, "dsec-vmm-launch: exec %s: %s\n", argv[i], strerror(errno));
	return 127;
}
