/*
 * landlock: the file-access restriction of a sandbox (docs/SECURITY.md "Landlock"),
 * applied with --landlock: by the agent to itself once at start (landlock_self_setup),
 * or, in an fncall worker, by each isolated call's namespace init after its mounts
 * (isolate.c), or, in a VM guest, by each command's child (confine.c). The ruleset is
 * described in landlock.c: read and execute everywhere, every right on the writable
 * places, the few device rights terminals need, nothing more.
 *
 * A kernel without Landlock is a property of the host: logged, reported in HELLO, and
 * the sandbox is served unrestricted. Any other failure is fatal to what applies it.
 */
#ifndef DSEC_AGENT_LANDLOCK_H
#define DSEC_AGENT_LANDLOCK_H

#include <stddef.h>

/* Most --writable paths: 128, twice what a request may name (64 writable paths) plus the
 * top-level directories of any sane image. */
#define LL_MAX_WRITABLE 128

/* Set by main from the flags: --landlock, and each --writable PATH (absolute). */
extern int g_landlock;
extern const char *g_writable[LL_MAX_WRITABLE];
extern int g_nwritable;
/* Set by landlock_probe: the kernel's Landlock ABI version (0: none) and, then, why. */
extern int g_landlock_abi;
extern char g_landlock_why[160];
/* For HELLO: "agent" (the agent is restricted), "isolated_execs" (a worker's calls are)
 * or "off". */
extern const char *g_landlock_scope;

/* Once at start: the kernel's ABI version into g_landlock_abi, or 0 and g_landlock_why. */
void landlock_probe(void);
/* Restrict the calling process and everything it forks from now on: read and execute
 * everywhere; every right on the nwritable places in `writable` (those from index
 * nofollow_from on are --writable paths, opened without following any symlink); the
 * device rules. Returns 0, or -1 with errno and `err` naming the step (err may be NULL:
 * no text, and then only system calls are made, as an exec child sharing the agent's
 * memory requires). Needs g_landlock_abi > 0. */
int landlock_apply(const char *const *writable, int nwritable, int nofollow_from, char *err, size_t errlen);
/* landlock_apply in two halves, for a namespace init that keeps mounting between calls
 * (callhost.c): the ruleset's fd (close-on-exec) built by the init, or -1 with errno and
 * `err`; then, in the command's child, no_new_privs and the domain (system calls only).
 * landlock_enforce returns 0, or -1 with errno. */
int landlock_build(const char *const *writable, int nwritable, int nofollow_from, char *err, size_t errlen);
int landlock_enforce(int rs);
/* --landlock without --worker: restrict the agent itself, once, before serving (sets
 * g_landlock_scope "agent"). Returns 0 (also when the kernel has no Landlock: logged), or
 * -1 (logged) when the ruleset cannot be applied. */
int landlock_self_setup(void);

#endif
