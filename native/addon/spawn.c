/*
 * spawn.c: child processes started with posix_spawn(3) and reaped by a thread of the
 * addon's own, so that starting one costs the same whatever the size of the caller.
 *
 * Why: Node's child_process forks the whole process (libuv's uv_spawn calls fork(2)), and
 * the fork runs on the JS thread. On this development host a spawn from a Node process
 * blocks its event loop 6 ms at 50 MiB RSS and 10-15 ms at 150-350 MiB (page tables are
 * copied, then every page the parent writes takes a copy-on-write fault), which made the
 * runtime binary spawns the largest share of dsecd's CPU under a creation burst. glibc's
 * posix_spawn clones with CLONE_VM|CLONE_VFORK: no page table copy, ~0.35 ms whatever
 * the parent's size (docs/BENCHMARKS.md, "Where the create time goes").
 *
 *   spawn(file, argv, envp, cwd, fds, stdin, capture) -> [Promise<result>, handle]
 *     file   program path; without a '/', searched in this process's PATH (posix_spawnp)
 *     argv   array of strings (argv[0] included)
 *     envp   array of "K=V" strings, or null for this process's environment
 *     cwd    working directory, or null for this process's
 *     fds    flat array [childFd, parentFd, ...]: the child's fd childFd is a dup of
 *            the caller's parentFd (childFd 0..63), taken before spawn returns, so the
 *            caller may close parentFd right away. Unnamed 0/1/2 are /dev/null, or the
 *            stdin contents and captured output below. Every other fd of the caller is
 *            closed in the child (closefrom above the highest named fd), whatever its
 *            close-on-exec flag.
 *     stdin  Buffer fed to the child's fd 0 (through a memfd, no pipe), or null
 *     capture  bytes of fd 1 and fd 2 to keep (each through a memfd); 0: /dev/null.
 *            Output beyond that is still written by the child, and dropped.
 *   result: { pid, exitCode: number | null, signal: number | null, stdout: Buffer | null,
 *            stderr: Buffer | null } -- exitCode when it exited, signal (the number) when
 *            it was killed.
 *   spawnKill(handle, signo) -> boolean
 *     pidfd_send_signal to the child (sent as it starts when it has not started yet);
 *     false once it has completed. Safe at any time: the pidfd names this child, never a
 *     process that reuses its pid.
 *
 * Threads: spawn only prepares the job (argument copies, fd dups, memfds) and queues it;
 * the posix_spawn itself runs on the addon's thread. With CLONE_VFORK the caller of
 * posix_spawn is suspended until the child has exec'd, which on a loaded host includes
 * waiting for the child to be scheduled: ~6 ms per runtime spawn under a creation burst
 * here, which stays off the event loop this way.
 *
 *   pidWatch(pid) -> [Promise<true>, handle] | null, pidUnwatch(handle) -> boolean
 *     the exit of any process (sandbox inits: daemon/host/pidwatch.ts), through a pidfd on
 *     the same thread's epoll; see js_pid_watch.
 *
 * Signals: the child starts with every signal at its default action and none blocked
 * (Node ignores SIGPIPE, and an ignored signal would otherwise survive the exec).
 *
 * Reaping: each child gets a pidfd (pidfd_open, Linux 5.3) watched by the same thread
 * through epoll; on exit it is reaped with waitid(P_PIDFD) (Linux 5.4), the captured
 * output read, and the promise resolved on the JS thread through a thread-safe function. Only these children are reaped: libuv waits for its own by pid.
 * While a spawn is pending the event loop is kept alive, as Node's own children keep it.
 *
 * Errors: spawn throws a TypeError for bad arguments; the promise rejects (code = errno
 * name, syscall "posix_spawn", path = file) when the program cannot be started (ENOENT,
 * EACCES, ...), and otherwise resolves whatever the child did.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <node_api.h>

#include "dsec_native.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif
#ifndef P_PIDFD
#define P_PIDFD 3
#endif

/* Highest child fd a caller may name: 64 leaves room for any runtime's --preserve-fds. */
#define MAX_CHILD_FD 64
/* Arguments and environment entries per spawn (a sandbox env is capped far below this). */
#define MAX_STRINGS 4096

extern char **environ;

/* One child. Created on the JS thread; the spawner thread starts it, watches it and
 * reaps it; the JS thread completes it. Fields marked (mu) are shared under the spawner's
 * mutex; the rest belong to whichever thread holds the job at the time. */
struct job {
  int watch;          /* a pidWatch of a process that is not our child (no spawn, no reap) */
  int canceled;       /* (mu) pidUnwatch came first: the exit is not reported */
  int fired;          /* (mu) the exit was seen: pidUnwatch is too late */
  struct job *next;   /* queue of jobs to start */
  char *file;
  char **argv, **envp;
  char *cwd;
  int tmp[MAX_CHILD_FD]; /* the child's fds, as dups above every target; -1 unnamed */
  int highest;        /* highest child fd named */
  pid_t pid;          /* (mu) 0 until started */
  int pidfd;          /* (mu) -1 until started, and again once completed */
  int kill_pending;   /* (mu) signal asked for before the child was started, 0 none */
  int spawn_err;      /* errno of posix_spawn / pidfd_open, 0 started */
  int out_fd, err_fd; /* capture memfds, or -1 */
  size_t capture;
  int code, sig;      /* exit status */
  char *out, *err;    /* captured bytes (malloc), lengths below */
  size_t out_len, err_len;
  napi_deferred deferred;
  int done;           /* (mu) completed on the JS thread: kill refused */
  int refs;           /* the JS handle and the pending completion; freed at 0 (JS thread) */
};

/* Per-environment state: the spawner thread and the way back to the JS thread. */
struct spawner {
  int epfd, wakefd;
  pthread_t thread;
  int running;
  int stopping;       /* (mu) */
  pthread_mutex_t mu;
  struct job *queue, *queue_tail; /* (mu) jobs to start, oldest first */
  struct job *unwatched;          /* (mu) watches stopped, handed back by the spawner thread */
  napi_threadsafe_function tsfn;
  unsigned pending; /* spawned, not yet completed on the JS thread (JS thread only) */
};

static struct spawner *g_sp; /* per-process: dsecd and each test worker load one environment */

/* Reads up to cap bytes of memfd fd from offset 0 into a malloc'd buffer. */
static char *read_memfd(int fd, size_t cap, size_t *len) {
  *len = 0;
  if (fd < 0 || cap == 0) return NULL;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  size_t got = 0;
  while (got < cap) {
    ssize_t r = pread(fd, buf + got, cap - got, (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  *len = got;
  return buf;
}

static void free_vector(char **v) {
  if (!v) return;
  for (char **p = v; *p; p++) free(*p);
  free(v);
}

static void close_tmp(struct job *j) {
  for (int c = 0; c < MAX_CHILD_FD; c++)
    if (j->tmp[c] != -1) {
      close(j->tmp[c]);
      j->tmp[c] = -1;
    }
}

/* Closes the job's fds and buffers (idempotent). */
static void close_job(struct job *j) {
  close_tmp(j);
  if (j->pidfd >= 0) close(j->pidfd);
  if (j->out_fd >= 0) close(j->out_fd);
  if (j->err_fd >= 0) close(j->err_fd);
  j->pidfd = j->out_fd = j->err_fd = -1;
  free(j->out);
  free(j->err);
  j->out = j->err = NULL;
}

static void free_job(struct job *j) {
  close_job(j);
  free(j->file);
  free(j->cwd);
  free_vector(j->argv);
  free_vector(j->envp);
  free(j);
}

/* Drops one reference (JS thread only). */
static void unref_job(struct job *j) {
  if (--j->refs <= 0) free_job(j);
}

/* Finalizer of the JS handle. */
static void handle_finalize(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  unref_job(data);
}

/* On the spawner thread: fills in the exit status and captured output, hands the job to the JS thread. */
static void finish(struct spawner *sp, struct job *j, const siginfo_t *si, int rc) {
  if (rc == 0 && si->si_code == CLD_EXITED) {
    j->code = si->si_status;
    j->sig = -1;
  } else if (rc == 0) {
    j->code = -1;
    j->sig = si->si_status;
  } else {
    j->code = -1; /* reaped by someone else: status unknown */
    j->sig = -1;
  }
  j->out = read_memfd(j->out_fd, j->capture, &j->out_len);
  j->err = read_memfd(j->err_fd, j->capture, &j->err_len);
  /* napi_closing: the environment is going away and nobody will read the result. */
  napi_call_threadsafe_function(sp->tsfn, j, napi_tsfn_blocking);
}

/* On the spawner thread: posix_spawn the job and start watching it. */
static void start_job(struct spawner *sp, struct job *j) {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  for (int c = 0; c < MAX_CHILD_FD; c++)
    if (j->tmp[c] != -1) posix_spawn_file_actions_adddup2(&fa, j->tmp[c], c);
  posix_spawn_file_actions_addclosefrom_np(&fa, j->highest + 1);
  if (j->cwd) posix_spawn_file_actions_addchdir_np(&fa, j->cwd);
  posix_spawnattr_init(&attr);
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  char **envp = j->envp ? j->envp : environ;
  int rc = strchr(j->file, '/') ? posix_spawn(&pid, j->file, &fa, &attr, j->argv, envp)
                                : posix_spawnp(&pid, j->file, &fa, &attr, j->argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close_tmp(j);
  if (rc != 0) {
    j->spawn_err = rc;
    napi_call_threadsafe_function(sp->tsfn, j, napi_tsfn_blocking);
    return;
  }
  int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (pidfd < 0) {
    /* Only on fd exhaustion: our own unreaped child always has a pidfd. */
    j->spawn_err = errno;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    napi_call_threadsafe_function(sp->tsfn, j, napi_tsfn_blocking);
    return;
  }
  fcntl(pidfd, F_SETFD, FD_CLOEXEC);
  pthread_mutex_lock(&sp->mu);
  j->pid = pid;
  j->pidfd = pidfd;
  if (j->kill_pending) syscall(SYS_pidfd_send_signal, pidfd, j->kill_pending, NULL, 0);
  pthread_mutex_unlock(&sp->mu);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = j};
  if (epoll_ctl(sp->epfd, EPOLL_CTL_ADD, pidfd, &ev) != 0) {
    /* Never expected (pidfds are pollable): wait for it here. */
    siginfo_t si;
    memset(&si, 0, sizeof si);
    int w;
    do w = waitid(P_PIDFD, (id_t)pidfd, &si, WEXITED);
    while (w < 0 && errno == EINTR);
    finish(sp, j, &si, w);
  }
}

static void *spawner_main(void *arg) {
  struct spawner *sp = arg;
  struct epoll_event evs[64];
  for (;;) {
    int n = epoll_wait(sp->epfd, evs, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return NULL;
    }
    for (int i = 0; i < n; i++) {
      struct job *j = evs[i].data.ptr;
      if (!j) {
        /* The wake fd: jobs to start, or the environment is going away. */
        uint64_t cnt;
        if (read(sp->wakefd, &cnt, sizeof cnt) < 0) { /* nothing to read */ }
        for (;;) {
          pthread_mutex_lock(&sp->mu);
          if (sp->stopping) {
            pthread_mutex_unlock(&sp->mu);
            return NULL;
          }
          struct job *q = sp->queue;
          if (q) {
            sp->queue = q->next;
            if (!sp->queue) sp->queue_tail = NULL;
          }
          pthread_mutex_unlock(&sp->mu);
          if (!q) break;
          start_job(sp, q);
        }
        continue;
      }
      if (j->watch) {
        pthread_mutex_lock(&sp->mu);
        int report = !j->canceled;
        if (report) {
          j->fired = 1;
          epoll_ctl(sp->epfd, EPOLL_CTL_DEL, j->pidfd, NULL);
        }
        pthread_mutex_unlock(&sp->mu);
        if (report)
          napi_call_threadsafe_function(sp->tsfn, j, napi_tsfn_blocking);
        continue;
      }
      siginfo_t si;
      memset(&si, 0, sizeof si);
      int rc;
      do rc = waitid(P_PIDFD, (id_t)j->pidfd, &si, WEXITED);
      while (rc < 0 && errno == EINTR);
      epoll_ctl(sp->epfd, EPOLL_CTL_DEL, j->pidfd, NULL);
      finish(sp, j, &si, rc);
    }
    /* Stopped watches go back to the JS thread (which frees them) only now: an event of
     * theirs fetched before the stop was in this batch at the latest. */
    pthread_mutex_lock(&sp->mu);
    struct job *u = sp->unwatched;
    sp->unwatched = NULL;
    pthread_mutex_unlock(&sp->mu);
    while (u) {
      struct job *next = u->next;
      napi_call_threadsafe_function(sp->tsfn, u, napi_tsfn_blocking);
      u = next;
    }
  }
}

static napi_value buffer_or_null(napi_env env, const char *data, size_t len, int have) {
  napi_value v;
  if (!have) {
    napi_get_null(env, &v);
    return v;
  }
  void *dst;
  if (napi_create_buffer_copy(env, len, data ? data : "", &dst, &v) != napi_ok) napi_get_null(env, &v);
  return v;
}

/* On the JS thread: settle the job's promise and release it. */
static void complete_js(napi_env env, napi_value js_cb, void *context, void *data) {
  (void)js_cb;
  struct spawner *sp = context;
  struct job *j = data;
  if (j->watch) {
    /* An exit report resolves the promise; a stopped watch's never settles. */
    if (env && !j->canceled) {
      napi_value t;
      napi_get_boolean(env, true, &t);
      napi_resolve_deferred(env, j->deferred, t);
    }
  } else if (env) {
    if (j->spawn_err) {
      /* throw_errno builds the usual errno-coded Error: take it back as the rejection. */
      throw_errno(env, j->spawn_err, "posix_spawn", j->file);
      napi_value e;
      napi_get_and_clear_last_exception(env, &e);
      napi_reject_deferred(env, j->deferred, e);
    } else {
      napi_value res, v;
      napi_create_object(env, &res);
      napi_create_int32(env, j->pid, &v);
      napi_set_named_property(env, res, "pid", v);
      if (j->code >= 0) napi_create_int32(env, j->code, &v); else napi_get_null(env, &v);
      napi_set_named_property(env, res, "exitCode", v);
      if (j->sig >= 0) napi_create_int32(env, j->sig, &v); else napi_get_null(env, &v);
      napi_set_named_property(env, res, "signal", v);
      napi_set_named_property(env, res, "stdout", buffer_or_null(env, j->out, j->out_len, j->out_fd >= 0));
      napi_set_named_property(env, res, "stderr", buffer_or_null(env, j->err, j->err_len, j->err_fd >= 0));
      napi_resolve_deferred(env, j->deferred, res);
    }
    if (sp && --sp->pending == 0) napi_unref_threadsafe_function(env, sp->tsfn);
  }
  if (sp) pthread_mutex_lock(&sp->mu);
  j->done = 1;
  close_job(j);
  if (sp) pthread_mutex_unlock(&sp->mu);
  unref_job(j);
}

static void spawner_cleanup(void *arg) {
  struct spawner *sp = arg;
  if (sp->running) {
    pthread_mutex_lock(&sp->mu);
    sp->stopping = 1;
    pthread_mutex_unlock(&sp->mu);
    uint64_t one = 1;
    if (write(sp->wakefd, &one, sizeof one) < 0) { /* the thread is already gone */ }
    pthread_join(sp->thread, NULL);
  }
  napi_release_threadsafe_function(sp->tsfn, napi_tsfn_abort);
  close(sp->epfd);
  close(sp->wakefd);
  pthread_mutex_destroy(&sp->mu);
  if (g_sp == sp) g_sp = NULL;
  /* Jobs still queued or running are left: the process is exiting. */
  free(sp);
}

/* The environment's spawner, created on first use; NULL with a pending exception. */
static struct spawner *spawner(napi_env env) {
  if (g_sp) return g_sp;
  struct spawner *sp = calloc(1, sizeof *sp);
  if (!sp) {
    throw_errno(env, ENOMEM, "spawn", NULL);
    return NULL;
  }
  pthread_mutex_init(&sp->mu, NULL);
  sp->epfd = epoll_create1(EPOLL_CLOEXEC);
  sp->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (sp->epfd < 0 || sp->wakefd < 0) {
    int e = errno;
    if (sp->epfd >= 0) close(sp->epfd);
    if (sp->wakefd >= 0) close(sp->wakefd);
    free(sp);
    throw_errno(env, e, "epoll_create1", NULL);
    return NULL;
  }
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
  epoll_ctl(sp->epfd, EPOLL_CTL_ADD, sp->wakefd, &ev);
  napi_value name;
  napi_create_string_utf8(env, "dsec-spawn", NAPI_AUTO_LENGTH, &name);
  if (napi_create_threadsafe_function(env, NULL, NULL, name, 0, 1, NULL, NULL, sp, complete_js, &sp->tsfn) != napi_ok) {
    close(sp->epfd);
    close(sp->wakefd);
    free(sp);
    napi_throw_error(env, NULL, "napi_create_threadsafe_function failed");
    return NULL;
  }
  napi_unref_threadsafe_function(env, sp->tsfn);
  int rc = pthread_create(&sp->thread, NULL, spawner_main, sp);
  if (rc != 0) {
    napi_release_threadsafe_function(sp->tsfn, napi_tsfn_abort);
    close(sp->epfd);
    close(sp->wakefd);
    free(sp);
    throw_errno(env, rc, "pthread_create", NULL);
    return NULL;
  }
  sp->running = 1;
  napi_add_env_cleanup_hook(env, spawner_cleanup, sp);
  g_sp = sp;
  return sp;
}

/* Copies a JS array of strings into a NULL-terminated malloc'd vector; NULL with a pending exception. */
static char **string_vector(napi_env env, napi_value arr, const char *what) {
  bool is_arr = false;
  uint32_t n = 0;
  if (napi_is_array(env, arr, &is_arr) != napi_ok || !is_arr || napi_get_array_length(env, arr, &n) != napi_ok || n > MAX_STRINGS) {
    char m[96];
    snprintf(m, sizeof m, "%s must be an array of at most %d strings", what, MAX_STRINGS);
    throw_type(env, m);
    return NULL;
  }
  char **v = calloc(n + 1, sizeof *v);
  if (!v) {
    throw_errno(env, ENOMEM, "spawn", NULL);
    return NULL;
  }
  for (uint32_t i = 0; i < n; i++) {
    napi_value e;
    size_t len = 0;
    if (napi_get_element(env, arr, i, &e) != napi_ok || napi_get_value_string_utf8(env, e, NULL, 0, &len) != napi_ok) {
      char m[96];
      snprintf(m, sizeof m, "%s[%u] must be a string", what, i);
      throw_type(env, m);
      goto fail;
    }
    v[i] = malloc(len + 1);
    if (!v[i]) {
      throw_errno(env, ENOMEM, "spawn", NULL);
      goto fail;
    }
    napi_get_value_string_utf8(env, e, v[i], len + 1, &len);
    if (strlen(v[i]) != len) {
      char m[96];
      snprintf(m, sizeof m, "%s[%u] must not contain NUL bytes", what, i);
      throw_type(env, m);
      goto fail;
    }
  }
  return v;
fail:
  for (uint32_t i = 0; i < n; i++) free(v[i]);
  free(v);
  return NULL;
}


static int is_nullish(napi_env env, napi_value v) {
  napi_valuetype t;
  return napi_typeof(env, v, &t) == napi_ok && (t == napi_null || t == napi_undefined);
}

/* A memfd holding `len` bytes of `data`, positioned at 0; -1 with errno. */
static int memfd_with(const char *name, const void *data, size_t len) {
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return -1;
  size_t off = 0;
  while (off < len) {
    ssize_t w = write(fd, (const char *)data + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      int e = errno;
      close(fd);
      errno = e;
      return -1;
    }
    off += (size_t)w;
  }
  if (lseek(fd, 0, SEEK_SET) < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

static napi_value js_spawn(napi_env env, napi_callback_info info) {
  napi_value a[7];
  if (get_args(env, info, 7, a) != 0) return NULL;
  struct spawner *sp = spawner(env);
  if (!sp) return NULL;

  int map[MAX_CHILD_FD]; /* child fd -> caller fd, -1 unnamed */
  for (int i = 0; i < MAX_CHILD_FD; i++) map[i] = -1;
  int devnull = -1, in_fd = -1;
  napi_value result = NULL;
  char buf[4096];
  struct job *j = calloc(1, sizeof *j);
  if (!j) {
    throw_errno(env, ENOMEM, "spawn", NULL);
    return NULL;
  }
  j->pidfd = j->out_fd = j->err_fd = -1;
  for (int i = 0; i < MAX_CHILD_FD; i++) j->tmp[i] = -1;

  if (get_string(env, a[0], buf, sizeof buf, "file") != 0 || !(j->file = strdup(buf))) goto fail;
  if (!(j->argv = string_vector(env, a[1], "argv"))) goto fail;
  if (!j->argv[0]) {
    throw_type(env, "argv must name at least argv[0]");
    goto fail;
  }
  if (!is_nullish(env, a[2]) && !(j->envp = string_vector(env, a[2], "envp"))) goto fail;
  if (!is_nullish(env, a[3]) && (get_string(env, a[3], buf, sizeof buf, "cwd") != 0 || !(j->cwd = strdup(buf)))) goto fail;
  {
    bool is_arr = false;
    uint32_t n = 0;
    if (napi_is_array(env, a[4], &is_arr) != napi_ok || !is_arr || napi_get_array_length(env, a[4], &n) != napi_ok || n % 2) {
      throw_type(env, "fds must be an array of [childFd, parentFd] pairs, flattened");
      goto fail;
    }
    for (uint32_t i = 0; i < n; i += 2) {
      napi_value c, p;
      int32_t cfd = -1, pfd = -1;
      napi_get_element(env, a[4], i, &c);
      napi_get_element(env, a[4], i + 1, &p);
      if (napi_get_value_int32(env, c, &cfd) != napi_ok || napi_get_value_int32(env, p, &pfd) != napi_ok ||
          cfd < 0 || cfd >= MAX_CHILD_FD || pfd < 0 || map[cfd] != -1) {
        throw_type(env, "fds: each child fd must be in [0, 64) and named once, each parent fd >= 0");
        goto fail;
      }
      map[cfd] = pfd;
    }
  }
  {
    double d = 0;
    if (napi_get_value_double(env, a[6], &d) != napi_ok || d < 0 || d > (double)(64u << 20)) {
      throw_type(env, "capture must be a number of bytes in [0, 64 MiB]");
      goto fail;
    }
    j->capture = (size_t)d;
  }
  if (!is_nullish(env, a[5])) {
    void *data;
    size_t len;
    bool is_buf = false;
    if (napi_is_buffer(env, a[5], &is_buf) != napi_ok || !is_buf || napi_get_buffer_info(env, a[5], &data, &len) != napi_ok) {
      throw_type(env, "stdin must be a Buffer or null");
      goto fail;
    }
    if ((in_fd = memfd_with("dsec-spawn-stdin", data, len)) < 0) {
      throw_errno(env, errno, "memfd_create", NULL);
      goto fail;
    }
    if (map[0] == -1) map[0] = in_fd;
  }
  if (j->capture) {
    if (map[1] == -1) {
      if ((j->out_fd = memfd_create("dsec-spawn-stdout", MFD_CLOEXEC)) < 0) {
        throw_errno(env, errno, "memfd_create", NULL);
        goto fail;
      }
      map[1] = j->out_fd;
    }
    if (map[2] == -1) {
      if ((j->err_fd = memfd_create("dsec-spawn-stderr", MFD_CLOEXEC)) < 0) {
        throw_errno(env, errno, "memfd_create", NULL);
        goto fail;
      }
      map[2] = j->err_fd;
    }
  }
  if (map[0] == -1 || map[1] == -1 || map[2] == -1) {
    if ((devnull = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0) {
      throw_errno(env, errno, "open", "/dev/null");
      goto fail;
    }
    for (int i = 0; i < 3; i++) if (map[i] == -1) map[i] = devnull;
  }
  /* The caller may close its fds as soon as this returns: the child gets dups, made here,
   * above every target (F_DUPFD_CLOEXEC from 64), so a dup2 onto one target never
   * clobbers the source of another. */
  j->highest = 2;
  for (int c = 0; c < MAX_CHILD_FD; c++) {
    if (map[c] == -1) continue;
    if ((j->tmp[c] = fcntl(map[c], F_DUPFD_CLOEXEC, MAX_CHILD_FD)) < 0) {
      int e = errno;
      char what[32];
      snprintf(what, sizeof what, "fd %d", map[c]);
      throw_errno(env, e, "fcntl(F_DUPFD_CLOEXEC)", what);
      goto fail;
    }
    if (c > j->highest) j->highest = c;
  }
  napi_value promise, handle;
  if (napi_create_promise(env, &j->deferred, &promise) != napi_ok) {
    napi_throw_error(env, NULL, "napi_create_promise failed");
    goto fail;
  }
  if (devnull >= 0) close(devnull);
  if (in_fd >= 0) close(in_fd);
  j->refs = 2;
  napi_create_external(env, j, handle_finalize, NULL, &handle);
  napi_create_array_with_length(env, 2, &result);
  napi_set_element(env, result, 0, promise);
  napi_set_element(env, result, 1, handle);
  if (sp->pending++ == 0) napi_ref_threadsafe_function(env, sp->tsfn);
  pthread_mutex_lock(&sp->mu);
  if (sp->queue_tail) sp->queue_tail->next = j;
  else sp->queue = j;
  sp->queue_tail = j;
  pthread_mutex_unlock(&sp->mu);
  uint64_t one = 1;
  if (write(sp->wakefd, &one, sizeof one) < 0) { /* EAGAIN: the counter is already non-zero */ }
  return result;

fail:
  if (devnull >= 0) close(devnull);
  if (in_fd >= 0) close(in_fd);
  free_job(j);
  return NULL;
}

/* pidWatch(pid) -> [Promise<true>, handle] | null: the promise resolves once process `pid`
 * (any process, not only our children) has exited, seen through a pidfd on the spawner
 * thread's epoll; nothing is reaped. null when there is no such process now (ESRCH).
 * Watches do not keep the event loop alive. The caller checks that the pidfd names the
 * process it means (a start time read after this returns) and unwatches otherwise. */
static napi_value js_pid_watch(napi_env env, napi_callback_info info) {
  napi_value a[1];
  if (get_args(env, info, 1, a) != 0) return NULL;
  struct spawner *sp = spawner(env);
  if (!sp) return NULL;
  int32_t pid;
  if (napi_get_value_int32(env, a[0], &pid) != napi_ok || pid <= 0) {
    throw_type(env, "pid must be a positive integer");
    return NULL;
  }
  napi_value result;
  int fd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) {
    if (errno == ESRCH) {
      napi_get_null(env, &result);
      return result;
    }
    char what[32];
    snprintf(what, sizeof what, "pid %d", (int)pid);
    throw_errno(env, errno, "pidfd_open", what);
    return NULL;
  }
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  struct job *j = calloc(1, sizeof *j);
  if (!j) {
    close(fd);
    throw_errno(env, ENOMEM, "pidWatch", NULL);
    return NULL;
  }
  for (int i = 0; i < MAX_CHILD_FD; i++) j->tmp[i] = -1;
  j->out_fd = j->err_fd = -1;
  j->watch = 1;
  j->pid = pid;
  j->pidfd = fd;
  napi_value promise, handle;
  if (napi_create_promise(env, &j->deferred, &promise) != napi_ok) {
    free_job(j);
    napi_throw_error(env, NULL, "napi_create_promise failed");
    return NULL;
  }
  j->refs = 2; /* the handle, and the exit report or the unwatch */
  napi_create_external(env, j, handle_finalize, NULL, &handle);
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = j};
  if (epoll_ctl(sp->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
    int e = errno;
    j->canceled = 1;
    close_job(j);
    j->refs--;
    throw_errno(env, e, "epoll_ctl", NULL);
    return NULL;
  }
  napi_create_array_with_length(env, 2, &result);
  napi_set_element(env, result, 0, promise);
  napi_set_element(env, result, 1, handle);
  return result;
}

/* pidUnwatch(handle) -> boolean: stop watching; false when the exit was already seen (its
 * report is on its way) or the watch was already stopped. A stopped watch's promise never
 * settles. */
static napi_value js_pid_unwatch(napi_env env, napi_callback_info info) {
  napi_value a[1];
  if (get_args(env, info, 1, a) != 0) return NULL;
  struct job *j;
  if (napi_get_value_external(env, a[0], (void **)&j) != napi_ok || !j || !j->watch) {
    throw_type(env, "handle must be the handle pidWatch returned");
    return NULL;
  }
  struct spawner *sp = g_sp;
  int stopped = 0;
  if (sp) {
    pthread_mutex_lock(&sp->mu);
    if (!j->fired && !j->canceled) {
      /* The spawner thread may hold an event of this watch fetched before the DEL: the
       * job goes back through it (end of its batch) and is released on this thread. */
      j->canceled = 1;
      epoll_ctl(sp->epfd, EPOLL_CTL_DEL, j->pidfd, NULL);
      j->next = sp->unwatched;
      sp->unwatched = j;
      stopped = 1;
    }
    pthread_mutex_unlock(&sp->mu);
    if (stopped) {
      uint64_t one = 1;
      if (write(sp->wakefd, &one, sizeof one) < 0) { /* EAGAIN: a wake is pending already */ }
    }
  }
  napi_value r;
  napi_get_boolean(env, stopped, &r);
  return r;
}

static napi_value js_spawn_kill(napi_env env, napi_callback_info info) {
  napi_value a[2];
  if (get_args(env, info, 2, a) != 0) return NULL;
  struct job *j;
  int32_t sig;
  if (napi_get_value_external(env, a[0], (void **)&j) != napi_ok || !j) {
    throw_type(env, "handle must be the handle spawn returned");
    return NULL;
  }
  if (napi_get_value_int32(env, a[1], &sig) != napi_ok || sig < 0 || sig > 64) {
    throw_type(env, "signo must be a signal number");
    return NULL;
  }
  napi_value r;
  int ok = 0;
  struct spawner *sp = g_sp;
  if (sp) pthread_mutex_lock(&sp->mu);
  if (j->done) ok = 0; /* completed: the child is gone, its pidfd closed */
  else if (j->pidfd < 0) { /* not started yet: sent as it starts */
    j->kill_pending = sig;
    ok = 1;
  }
  else ok = syscall(SYS_pidfd_send_signal, j->pidfd, sig, NULL, 0) == 0;
  if (sp) pthread_mutex_unlock(&sp->mu);
  napi_get_boolean(env, ok, &r);
  return r;
}

int dsec_spawn_init(napi_env env, napi_value exports) {
  napi_property_descriptor fns[] = {
      {"spawn", NULL, js_spawn, NULL, NULL, NULL, napi_enumerable, NULL},
      {"spawnKill", NULL, js_spawn_kill, NULL, NULL, NULL, napi_enumerable, NULL},
      {"pidWatch", NULL, js_pid_watch, NULL, NULL, NULL, napi_enumerable, NULL},
      {"pidUnwatch", NULL, js_pid_unwatch, NULL, NULL, NULL, napi_enumerable, NULL},
  };
  return napi_define_properties(env, exports, sizeof fns / sizeof fns[0], fns) == napi_ok ? 0 : -1;
}
