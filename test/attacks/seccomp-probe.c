/*
 * Seccomp probe for test/attacks/seccomp.test.ts: performs the named system call (or
 * ioctl) once, with arguments that would otherwise fail harmlessly, and prints
 * "<name> <errno name>" (or "<name> ok"). Built static on the host (gcc -static) and
 * copied into the sandbox. Every call is harmless when it succeeds: the test only cares
 * whether the filter answered EPERM before the kernel looked at the arguments.
 *
 *   probe NAME [FILE [FILE2]]
 *
 * ioctl probes act on FILE (default /tmp/.seccomp-probe). XFS_IOC_SWAPEXT and its
 * high-bits variant given two files ask for a real extent swap of FILE with FILE2
 * (test/attacks/disk.test.ts, on an XFS upper); XFS refuses it harmlessly because the
 * recorded stat of the target does not match.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/socket.h>

static const char *ename(int e)
{
	switch (e) {
	case 0: return "ok";
	case EPERM: return "EPERM";
	case ENOSYS: return "ENOSYS";
	case EINVAL: return "EINVAL";
	case ENOTTY: return "ENOTTY";
	case EBADF: return "EBADF";
	case EFAULT: return "EFAULT";
	case ENOENT: return "ENOENT";
	case EACCES: return "EACCES";
	case EOPNOTSUPP: return "EOPNOTSUPP";
	case EBUSY: return "EBUSY";
	default: return strerror(e);
	}
}

static const char *probe_file = "/tmp/.seccomp-probe";
static const char *probe_file2;

/* struct xfs_swapext of <xfs/xfs_fs.h>: the header is not installed on every host. */
struct swapext {
	long long sx_version, sx_fdtarget, sx_fdtmp, sx_offset, sx_length;
	char sx_pad[16];
	char sx_stat[128]; /* struct xfs_bstat of the target before the copy */
};

/* socket(family, SOCK_STREAM or SOCK_DGRAM, 0), closed at once: creating it is all a probe does (nothing connects). */
static long socket_probe(unsigned long family, int type)
{
	long fd = syscall(SYS_socket, family, type, 0);
	if (fd >= 0)
		close((int)fd);
	return fd;
}

static long ioctl_probe(unsigned long cmd)
{
	static char buf[4096];
	int fd = open(probe_file, O_RDWR | O_CREAT, 0600);
	if (fd < 0)
		fd = 0;
	if (probe_file2 && (unsigned int)cmd == 0xc0c0586dU) {
		struct swapext *sx = (struct swapext *)buf;
		int fd2 = open(probe_file2, O_RDWR);
		sx->sx_version = 0; /* XFS_SX_VERSION */
		sx->sx_fdtarget = fd;
		sx->sx_fdtmp = fd2;
		sx->sx_offset = 0;
		sx->sx_length = lseek(fd, 0, SEEK_END);
	}
	return syscall(SYS_ioctl, fd, cmd, buf);
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: probe NAME\n");
		return 2;
	}
	const char *n = argv[1];
	if (argc > 2)
		probe_file = argv[2];
	if (argc > 3)
		probe_file2 = argv[3];
	static char buf[4096];
	long rc;
	errno = 0;
	if (!strcmp(n, "mount"))
		rc = syscall(SYS_mount, "none", "/tmp", "tmpfs", 0UL, NULL);
	else if (!strcmp(n, "umount2"))
		rc = syscall(SYS_umount2, "/proc", 0);
	else if (!strcmp(n, "mount_setattr"))
		rc = syscall(SYS_mount_setattr, -1, "", 0, NULL, 0UL);
	else if (!strcmp(n, "open_tree"))
		rc = syscall(SYS_open_tree, -1, "/", 0);
	else if (!strcmp(n, "fsopen"))
		rc = syscall(SYS_fsopen, "tmpfs", 0);
	else if (!strcmp(n, "pivot_root"))
		rc = syscall(SYS_pivot_root, "/", "/");
	else if (!strcmp(n, "bpf"))
		rc = syscall(SYS_bpf, 0 /* BPF_MAP_CREATE */, buf, 16);
	else if (!strcmp(n, "keyctl"))
		rc = syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3, 0);
	else if (!strcmp(n, "add_key"))
		rc = syscall(SYS_add_key, "user", "x", "y", 1, -3);
	else if (!strcmp(n, "userfaultfd"))
		rc = syscall(SYS_userfaultfd, 0);
	else if (!strcmp(n, "perf_event_open"))
		rc = syscall(SYS_perf_event_open, buf, 0, -1, -1, 0);
	else if (!strcmp(n, "io_uring_setup"))
		rc = syscall(SYS_io_uring_setup, 1, buf);
	else if (!strcmp(n, "open_by_handle_at"))
		rc = syscall(SYS_open_by_handle_at, -1, buf, 0);
	else if (!strcmp(n, "kexec_load"))
		rc = syscall(SYS_kexec_load, 0UL, 0UL, NULL, 0UL);
	else if (!strcmp(n, "init_module"))
		rc = syscall(SYS_init_module, buf, 0UL, "");
	else if (!strcmp(n, "ptrace"))
		rc = syscall(SYS_ptrace, 0 /* PTRACE_TRACEME */, 0, 0, 0);
	else if (!strcmp(n, "pidfd_getfd"))
		rc = syscall(SYS_pidfd_getfd, -1, 0, 0);
	else if (!strcmp(n, "process_vm_readv"))
		rc = syscall(SYS_process_vm_readv, 1, NULL, 0, NULL, 0, 0);
	else if (!strcmp(n, "setns"))
		rc = syscall(SYS_setns, -1, 0);
	else if (!strcmp(n, "unshare_user"))
		rc = syscall(SYS_unshare, CLONE_NEWUSER);
	else if (!strcmp(n, "clone_user"))
		rc = syscall(SYS_clone, (unsigned long)(CLONE_NEWUSER | 17 /* SIGCHLD */), NULL, NULL, NULL, NULL);
	else if (!strcmp(n, "clone3"))
		rc = syscall(SYS_clone3, NULL, 0UL);
	else if (!strcmp(n, "swapon"))
		rc = syscall(SYS_swapon, "/nonexistent", 0);
	else if (!strcmp(n, "syslog"))
		rc = syscall(SYS_syslog, 10 /* SYSLOG_ACTION_SIZE_BUFFER */, NULL, 0);
	else if (!strcmp(n, "settimeofday"))
		rc = syscall(SYS_settimeofday, NULL, NULL);
	else if (!strcmp(n, "vsock")) /* AF_VSOCK = 40: not per network namespace */
		rc = socket_probe(40, SOCK_STREAM);
	else if (!strcmp(n, "vsock_hibits")) /* the kernel reads the family as an int */
		rc = socket_probe(0x100000000UL | 40, SOCK_STREAM);
	else if (!strcmp(n, "socket_tipc")) /* AF_TIPC = 30 */
		rc = socket_probe(30, SOCK_DGRAM);
	else if (!strcmp(n, "socket_rds")) /* AF_RDS = 21 */
		rc = socket_probe(21, SOCK_SEQPACKET);
	else if (!strcmp(n, "socket_unix")) /* control */
		rc = socket_probe(AF_UNIX, SOCK_STREAM);
	else if (!strcmp(n, "socket_inet")) /* control */
		rc = socket_probe(AF_INET, SOCK_DGRAM);
	else if (!strcmp(n, "socket_netlink")) /* control */
		rc = socket_probe(AF_NETLINK, SOCK_DGRAM);
	else if (!strcmp(n, "XFS_IOC_SWAPEXT"))
		rc = ioctl_probe(0xc0c0586dUL);
	else if (!strcmp(n, "XFS_IOC_SWAPEXT_HIBITS")) /* the kernel truncates cmd to 32 bits */
		rc = ioctl_probe(0xffffffff00000000UL | 0xc0c0586dUL);
	else if (!strcmp(n, "XFS_IOC_EXCHANGE_RANGE"))
		rc = ioctl_probe(0x40285881UL);
	else if (!strcmp(n, "FIFREEZE"))
		rc = ioctl_probe(0xc0045877UL);
	else if (!strcmp(n, "XFS_IOC_GOINGDOWN"))
		rc = ioctl_probe(0x8004587dUL);
	else if (!strcmp(n, "TIOCSTI"))
		rc = ioctl_probe(0x5412UL);
	else if (!strcmp(n, "FIONREAD")) /* control: an ordinary ioctl still reaches the filesystem */
		rc = ioctl_probe(0x541bUL);
	else if (!strcmp(n, "getpid")) /* control */
		rc = syscall(SYS_getpid);
	else if (!strcmp(n, "kcmp")) /* allowed by the default profile; denied by test profiles */
		rc = syscall(SYS_kcmp, getpid(), getpid(), 0 /* KCMP_FILE */, 0, 0);
	else {
		fprintf(stderr, "unknown probe %s\n", n);
		return 2;
	}
	printf("%s %s\n", n, rc < 0 ? ename(errno) : "ok");
	return 0;
}
