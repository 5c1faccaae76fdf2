/*
 * Shared helpers of the dsec_native addon's source files (dsec_native.c defines them).
 * Each source file adds its functions to the module's exports through its own
 * dsec_*_init(), called once from the module init; 0 on success, -1 with a pending
 * JavaScript exception.
 */
#ifndef DSEC_NATIVE_H
#define DSEC_NATIVE_H
#include <stddef.h>
#include <stdint.h>
#include <node_api.h>

/* Throws Error(`${syscall}(${path}): ${strerror}`) with code (errno name), errno (negated), syscall and path set. */
void throw_errno(napi_env env, int e, const char *syscall_name, const char *path);
/* Throws a TypeError with code ERR_INVALID_ARG_TYPE. */
void throw_type(napi_env env, const char *msg);
/* Reads exactly `want` arguments into argv; 0, or -1 with a pending exception. */
int get_args(napi_env env, napi_callback_info info, size_t want, napi_value *argv);
/* Copies a non-empty string argument without NUL bytes into buf (cap bytes with the NUL); 0, or -1 with a pending exception. */
int get_string(napi_env env, napi_value v, char *buf, size_t cap, const char *what);
/* A JS number for v, or NULL. */
napi_value make_int(napi_env env, int v);
/* A user namespace mapped "<inner> <uid_base> <count>" (gid likewise) as an O_CLOEXEC fd, or
 * -1 with errno set and *failed_call / failed_path (PATH_MAX bytes) naming the step. */
int dsec_make_userns(uint32_t inner, uint32_t uid_base, uint32_t gid_base, uint32_t count,
                     const char **failed_call, char *failed_path);

/* bpf.c: eBPF programs and maps (egress policy, denial counters). */
int dsec_bpf_init(napi_env env, napi_value exports);
/* fsops.c: filesystem operations for the writable-layer store (quotas, subvolumes). */
int dsec_fs_init(napi_env env, napi_value exports);
/* builder.c: detached idmapped views of trees for the builder identity. */
int dsec_builder_init(napi_env env, napi_value exports);
/* spawn.c: child processes through posix_spawn, reaped by a thread of the addon's own. */
int dsec_spawn_init(napi_env env, napi_value exports);
/* overlay.c: a sandbox's root overlay mounted from fds of detached layer clones. */
int dsec_overlay_init(napi_env env, napi_value exports);
#endif
