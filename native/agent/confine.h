/*
 * confine: what confines the commands the agent starts, besides Landlock (landlock.h):
 * capability sets, seccomp filters, and a VM guest's read-only paths.
 *
 *   - An fncall worker (--worker): the agent keeps CAP_SYS_ADMIN for isolated execs but
 *     drops it from its bounding set at start (worker_setup), and every process it starts
 *     installs a second seccomp filter that denies mount and mount_setattr again
 *     (worker_filter_install), the two syscalls runc's filter leaves to a worker's agent.
 *   - A microVM guest (--guest-confine): the agent is the guest's PID 1 with every
 *     capability. dsecd sends the confinement once per boot (the vmux op CONFINE,
 *     guest_confine): read-only binds and a read-only root applied at once, then, for
 *     every command, in its child: Landlock, the capability sets reduced to a mask, no
 *     new privileges and a seccomp filter built from dsecd's rules. Until it has been
 *     applied, no exec starts (guest_confine_pending).
 */
#ifndef DSEC_AGENT_CONFINE_H
#define DSEC_AGENT_CONFINE_H

#include <stdint.h>
#include <linux/capability.h>

/* This thread's capability sets (v3: two 32-bit words). 0, or -1 with errno. */
int caps_get(struct __user_cap_data_struct d[2]);
int caps_set(struct __user_cap_data_struct d[2]);
/* Remove one capability from this thread's effective, permitted and inheritable sets. */
int caps_drop(int cap);
/* 1 when this thread has cap in its effective set. */
int caps_has_effective(int cap);

/* --worker, at start: CAP_SYS_ADMIN out of the bounding, inheritable and ambient sets,
 * kept effective for the agent. Returns -1 (logged "fatal: --worker: ...") on any
 * failure: a worker must not run execs with CAP_SYS_ADMIN, nor run without isolation. */
int worker_setup(void);
/* In a worker's exec child, before execve: the seccomp filter denying mount and
 * mount_setattr (EPERM). 0, or -1 with errno. */
int worker_filter_install(void);

/* --guest-confine: refuse every exec until CONFINE has been applied. */
void guest_confine_require(void);
/* 1 while --guest-confine was given and CONFINE has not been applied. */
int guest_confine_pending(void);
/* 1 once CONFINE has been applied (every command's child then confines itself). */
int guest_confine_applied(void);
/* The vmux op CONFINE (vmux_confine_fn, once per boot; the directives are in confine.c):
 * applies the mounts, keeps the rest for every command. Returns the Landlock ABI the
 * commands get (0: none), or -errno (-EALREADY the second time); on failure no exec is
 * ever started. */
int32_t guest_confine(const unsigned char *p, uint32_t len);
/* In a command's child, before the user switch: Landlock (when asked and the guest kernel
 * has it), then the bounding, ambient, effective, permitted and inheritable sets reduced
 * to the mask. 0, or an errno. */
int guest_confine_child_caps(void);
/* In a command's child, after the user switch: no_new_privs and the seccomp filter. 0, or
 * an errno. */
int guest_confine_child_filter(void);

#endif
