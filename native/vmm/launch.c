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
 * Then it execs PROGRAM (PATH search), so the pid dsecd spawned is the VMM's. Exit status
 * 125: a setup step failed (message on stderr); 127: PROGRAM could not be executed.
 *
 * This is the seam for the rest of the VMM's confinement (a mount namespace of its own,
 * a seccomp filter, an unprivileged uid): each is one more step here, before exec.
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
#include <sys/prctl.h>
#include <sys/resource.h>

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

int main(int argc, char **argv)
{
	int i = 1, sched_idle = 0, no_thp = 0;
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
		} else {
			fprintf(stderr, "usage: dsec-vmm-launch [--cgroup-procs FILE]... [--sched-idle] [--no-thp] -- PROGRAM [ARG]...\n"
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
	execvp(argv[i], argv + i);
	fprintf(stderr, "dsec-vmm-launch: exec %s: %s\n", argv[i], strerror(errno));
	return 127;
}
