/*
 * dsec-seccomp-monitor: counts the system calls that dsec's seccomp profile denies, per
 * sandbox, and denies them.
 *
 * How it fits (docs/SECURITY.md "seccomp", daemon/security/seccomp-monitor.ts): the
 * profile's deny rules use SCMP_ACT_NOTIFY instead of SCMP_ACT_ERRNO(EPERM), with
 * `listenerPath` = this monitor's notify socket and `listenerMetadata` = the sandbox id.
 * runc installs the filter in the container's init and hands the notify fd to whatever
 * listens on listenerPath (one SCM_RIGHTS message carrying the OCI "container process
 * state" JSON). From then on every denied call of that sandbox blocks in the kernel until
 * this process answers it, and it always answers EPERM: this program never lets a call
 * through (it never sets SECCOMP_USER_NOTIF_FLAG_CONTINUE) and never reads or writes the
 * caller's memory. The verdict is the same as SCMP_ACT_ERRNO's; the difference is that the
 * denial is seen, attributed to its sandbox and counted exactly.
 *
 * It is a process of its own, not part of dsecd, so counting (and the EPERM answers)
 * go on while dsecd restarts; dsecd adopts it at start by its pid file. If it dies, the
 * kernel fails the notified calls with ENOSYS (there is no listener): still denied,
 * no longer counted, until the sandbox is restarted. When it holds no sandbox and no
 * controller is connected it exits, so an idle instance leaves nothing running.
 *
 *   dsec-seccomp-monitor --notify PATH --control PATH --lock PATH [--pid-file PATH] [--flood N]
 *
 * --lock is held (flock) for the monitor's whole life, taken before it binds its sockets
 * and released only after it removed them on an idle exit: a successor started meanwhile
 * waits on the lock, so it never has its fresh sockets removed by the one leaving.
 *
 * Control socket (dsecd connects; one controller at a time, a new one replaces the old):
 * newline-delimited JSON, monitor to dsecd only:
 *   {"type":"hello","pid":P,"sandboxes":[{"id":..,"total":N,"counts":{"<key>":n,..},"flooded":b},..]}
 *       key: the syscall number (x86-64 numbering; x32 calls keep their 0x40000000 bit),
 *       or number | 0x10000000 for an i386 call.
 *   {"type":"denied","id":..,"nr":N,"arch":A,"pid":P,"args":[a0,a1,a2],"total":N}
 *   {"type":"flood","id":..,"total":N}     counting stopped for this sandbox (see --flood)
 *   {"type":"gone","id":..,"total":N}      the sandbox's last filtered process exited
 * Events are dropped (never queued without bound) when dsecd does not read them; the
 * per-sandbox totals in the next hello stay exact.
 *
 * Flood guard: a sandbox whose denials exceed --flood (default 100000) in total has its
 * notify fd closed: its later denials fail in the kernel with ENOSYS without a round trip
 * here, so no sandbox can make this process (which runs outside every sandbox's CPU
 * quota) spend unbounded CPU on its behalf.
 *
 * Single-threaded epoll loop; every fd non-blocking; buffers bounded.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_ID 64
/* AUDIT_ARCH_I386 (linux/audit.h); i386 syscall numbers are counted under nr | I386_KEY_BIT. */
#define AUDIT_ARCH_I386 0x40000003u
#define I386_KEY_BIT 0x10000000
/* Distinct syscall numbers counted per sandbox; more are summed into the total only. */
#define MAX_NRS 64
/* Bytes of control output kept for a slow controller before events are dropped. */
#define OUT_CAP (1 << 20)

struct sandbox {
  int fd; /* notify fd, -1 once closed */
  char id[MAX_ID + 1];
  uint64_t total;
  int nnr;
  int nrs[MAX_NRS];
  uint64_t counts[MAX_NRS];
  int flooded;
  struct sandbox *next;
};

static struct sandbox *sandboxes;
static int epfd, notify_lfd, control_lfd, control_fd = -1;
static char out_buf[OUT_CAP];
static size_t out_len;
static uint64_t flood_limit = 100000;
static struct seccomp_notif_sizes sizes;

static void logmsg(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "dsec-seccomp-monitor: ");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static void die(const char *what) {
  logmsg("%s: %s", what, strerror(errno));
  exit(1);
}

/* Appends to the controller's output; drops the event when the buffer is full. */
static void emit(const char *fmt, ...) {
  if (control_fd < 0) return;
  char line[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n <= 0 || (size_t)n >= sizeof line || out_len + (size_t)n > OUT_CAP) return;
  memcpy(out_buf + out_len, line, (size_t)n);
  out_len += (size_t)n;
}

static void flush_control(void) {
  while (control_fd >= 0 && out_len > 0) {
    ssize_t w = write(control_fd, out_buf, out_len);
    if (w < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      close(control_fd);
      control_fd = -1;
      out_len = 0;
      return;
    }
    memmove(out_buf, out_buf + w, out_len - (size_t)w);
    out_len -= (size_t)w;
  }
}

static int listen_unix(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) die("socket");
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof a.sun_path) {
    errno = ENAMETOOLONG;
    die(path);
  }
  strcpy(a.sun_path, path);
  unlink(path);
  mode_t old = umask(0077); /* root only: both sockets carry or control seccomp verdicts */
  if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) die(path);
  umask(old);
  if (listen(fd, 256) != 0) die("listen");
  return fd;
}

static void ep_add(int fd, uint32_t events, void *ptr) {
  struct epoll_event ev = {.events = events, .data.ptr = ptr};
  if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll_ctl");
}

/* Tags for epoll data that is not a sandbox. */
static char TAG_NOTIFY_LISTEN, TAG_CONTROL_LISTEN, TAG_CONTROL;

/* Extracts the JSON string value of "metadata" (the sandbox id dsec put in the spec):
 * 1-64 characters of [0-9a-z-]; anything else is refused. JSON whitespace may stand
 * around the colon: runc sends compact JSON, crun pretty-prints it ("metadata": "id"). */
static int parse_id(const char *json, char *id) {
  const char *p = strstr(json, "\"metadata\"");
  if (!p) return -1;
  p += strlen("\"metadata\"");
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  if (*p++ != ':') return -1;
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  if (*p++ != '"') return -1;
  int n = 0;
  while (p[n] && p[n] != '"') {
    char c = p[n];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '-') || n >= MAX_ID) return -1;
    id[n] = c;
    n++;
  }
  if (p[n] != '"' || n == 0) return -1;
  id[n] = 0;
  return 0;
}

static void sandbox_hello_entry(struct sandbox *s, int first) {
  char counts[MAX_NRS * 32] = "";
  size_t off = 0;
  for (int i = 0; i < s->nnr; i++)
    off += (size_t)snprintf(counts + off, sizeof counts - off, "%s\"%d\":%llu", i ? "," : "", s->nrs[i], (unsigned long long)s->counts[i]);
  emit("%s{\"id\":\"%s\",\"total\":%llu,\"counts\":{%s},\"flooded\":%s}", first ? "" : ",", s->id,
       (unsigned long long)s->total, counts, s->flooded ? "true" : "false");
}

static void hello(void) {
  emit("{\"type\":\"hello\",\"pid\":%d,\"sandboxes\":[", (int)getpid());
  int first = 1;
  for (struct sandbox *s = sandboxes; s; s = s->next) {
    sandbox_hello_entry(s, first);
    first = 0;
  }
  emit("]}\n");
}

/* A new connection from runc on the notify socket: read the state and the fd. */
static void accept_notify(void) {
  for (;;) {
    int c = accept4(notify_lfd, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) return;
    /* runc sends one message right after connecting; wait for it briefly (blocking read
     * with a timeout keeps the loop simple: runc is on this host and writes at once). */
    struct timeval tv = {.tv_sec = 5};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[65536];
    char cbuf[CMSG_SPACE(sizeof(int) * 4)];
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf - 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
    ssize_t n = recvmsg(c, &m, MSG_CMSG_CLOEXEC);
    int fd = -1;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
      if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS) {
        int nfd = (int)((h->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        int *fds = (int *)CMSG_DATA(h);
        for (int i = 0; i < nfd; i++) {
          if (fd < 0) fd = fds[i];
          else close(fds[i]);
        }
      }
    }
    close(c);
    if (n <= 0 || fd < 0) {
      if (fd >= 0) close(fd);
      logmsg("notify connection without state or fd; ignored");
      continue;
    }
    buf[n] = 0;
    char id[MAX_ID + 1];
    if (parse_id(buf, id) != 0) {
      close(fd);
      logmsg("notify connection without a valid sandbox id in metadata; ignored");
      continue;
    }
    struct sandbox *s = calloc(1, sizeof *s);
    if (!s) die("calloc");
    s->fd = fd;
    memcpy(s->id, id, sizeof s->id);
    s->next = sandboxes;
    sandboxes = s;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    ep_add(fd, EPOLLIN, s);
  }
}

static void count(struct sandbox *s, int nr) {
  s->total++;
  for (int i = 0; i < s->nnr; i++)
    if (s->nrs[i] == nr) {
      s->counts[i]++;
      return;
    }
  if (s->nnr < MAX_NRS) {
    s->nrs[s->nnr] = nr;
    s->counts[s->nnr++] = 1;
  }
}

static void close_sandbox_fd(struct sandbox *s) {
  if (s->fd < 0) return;
  epoll_ctl(epfd, EPOLL_CTL_DEL, s->fd, NULL);
  close(s->fd);
  s->fd = -1;
}

static void remove_sandbox(struct sandbox *s) {
  close_sandbox_fd(s);
  for (struct sandbox **p = &sandboxes; *p; p = &(*p)->next)
    if (*p == s) {
      *p = s->next;
      break;
    }
  free(s);
}

/* Answers every pending notification of sandbox s with EPERM. */
static void serve(struct sandbox *s, uint32_t events) {
  if (events & (EPOLLHUP | EPOLLERR)) {
    emit("{\"type\":\"gone\",\"id\":\"%s\",\"total\":%llu}\n", s->id, (unsigned long long)s->total);
    remove_sandbox(s);
    return;
  }
  char req_buf[512], resp_buf[512];
  {
    struct seccomp_notif *req = (struct seccomp_notif *)req_buf;
    memset(req_buf, 0, sizes.seccomp_notif);
    /* One receive per readiness report (epoll is level-triggered: more pending calls
     * report again). The receive blocks when the notification it was woken for has been
     * withdrawn meanwhile (its caller killed), so it runs under a 100 ms interval timer
     * whose SIGALRM (no SA_RESTART) interrupts it with EINTR. */
    struct itimerval t = {.it_value = {.tv_usec = 100000}};
    setitimer(ITIMER_REAL, &t, NULL);
    int rc = ioctl(s->fd, SECCOMP_IOCTL_NOTIF_RECV, req);
    int e = errno;
    struct itimerval off = {0};
    setitimer(ITIMER_REAL, &off, NULL);
    if (rc != 0) {
      /* EINTR: withdrawn or timed out; ENOENT: the caller went away before we read it. */
      if (e == EAGAIN || e == EINTR || e == ENOENT) return;
      emit("{\"type\":\"gone\",\"id\":\"%s\",\"total\":%llu}\n", s->id, (unsigned long long)s->total);
      remove_sandbox(s);
      return;
    }
    struct seccomp_notif_resp *resp = (struct seccomp_notif_resp *)resp_buf;
    memset(resp_buf, 0, sizes.seccomp_notif_resp);
    resp->id = req->id;
    resp->error = -EPERM;
    resp->val = 0;
    resp->flags = 0;
    /* ENOENT here: the caller went away meanwhile; the denial still happened. */
    ioctl(s->fd, SECCOMP_IOCTL_NOTIF_SEND, resp);
    /* i386 numbers name other calls than x86-64 ones: keep them apart (see hello). */
    count(s, req->data.arch == AUDIT_ARCH_I386 ? (int)(req->data.nr | I386_KEY_BIT) : req->data.nr);
    emit("{\"type\":\"denied\",\"id\":\"%s\",\"nr\":%d,\"arch\":%u,\"pid\":%u,\"args\":[%llu,%llu,%llu],\"total\":%llu}\n", s->id,
         req->data.nr, req->data.arch, req->pid, (unsigned long long)req->data.args[0], (unsigned long long)req->data.args[1],
         (unsigned long long)req->data.args[2], (unsigned long long)s->total);
    if (s->total >= flood_limit) {
      s->flooded = 1;
      emit("{\"type\":\"flood\",\"id\":\"%s\",\"total\":%llu}\n", s->id, (unsigned long long)s->total);
      /* Keep the record (dsecd shows the total) but stop serving: later denials fail
       * with ENOSYS in the kernel, without a round trip here. */
      close_sandbox_fd(s);
      return;
    }
  }
}

static void on_alarm(int sig) { (void)sig; }

static void accept_control(void) {
  for (;;) {
    int c = accept4(control_lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) return;
    if (control_fd >= 0) {
      epoll_ctl(epfd, EPOLL_CTL_DEL, control_fd, NULL);
      close(control_fd);
    }
    control_fd = c;
    out_len = 0;
    ep_add(c, EPOLLIN | EPOLLRDHUP, &TAG_CONTROL);
    hello();
  }
}

static int live_sandboxes(void) {
  int n = 0;
  for (struct sandbox *s = sandboxes; s; s = s->next)
    if (s->fd >= 0) n++;
  return n;
}

int main(int argc, char **argv) {
  const char *notify_path = NULL, *control_path = NULL, *pid_file = NULL, *lock_path = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--notify") && i + 1 < argc) notify_path = argv[++i];
    else if (!strcmp(argv[i], "--control") && i + 1 < argc) control_path = argv[++i];
    else if (!strcmp(argv[i], "--pid-file") && i + 1 < argc) pid_file = argv[++i];
    else if (!strcmp(argv[i], "--lock") && i + 1 < argc) lock_path = argv[++i];
    else if (!strcmp(argv[i], "--flood") && i + 1 < argc) flood_limit = strtoull(argv[++i], NULL, 10);
    else {
      fprintf(stderr, "usage: dsec-seccomp-monitor --notify PATH --control PATH --lock PATH [--pid-file PATH] [--flood N]\n");
      return 2;
    }
  }
  if (!notify_path || !control_path || !lock_path || flood_limit == 0) {
    fprintf(stderr, "usage: dsec-seccomp-monitor --notify PATH --control PATH --lock PATH [--pid-file PATH] [--flood N]\n");
    return 2;
  }
  int lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0 || flock(lock_fd, LOCK_EX) != 0) die(lock_path);
  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa = {.sa_handler = on_alarm}; /* no SA_RESTART: interrupts a blocked receive */
  sigaction(SIGALRM, &sa, NULL);
  /* One notify fd per live sandbox: the density target is thousands per host. */
  struct rlimit rl = {.rlim_cur = 65536, .rlim_max = 65536};
  setrlimit(RLIMIT_NOFILE, &rl);
  if (syscall(__NR_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &sizes) != 0) die("seccomp(SECCOMP_GET_NOTIF_SIZES)");
  if (sizes.seccomp_notif > 512 || sizes.seccomp_notif_resp > 512) {
    logmsg("kernel notification structs are larger than expected (%u, %u)", sizes.seccomp_notif, sizes.seccomp_notif_resp);
    return 1;
  }
  epfd = epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0) die("epoll_create1");
  notify_lfd = listen_unix(notify_path);
  control_lfd = listen_unix(control_path);
  ep_add(notify_lfd, EPOLLIN, &TAG_NOTIFY_LISTEN);
  ep_add(control_lfd, EPOLLIN, &TAG_CONTROL_LISTEN);
  if (pid_file) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", pid_file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0 || rename(tmp, pid_file) != 0) die(pid_file);
  }
  /* Exit once idle: nothing to serve and nobody listening, for this long. */
  const int idle_exit_ms = 10000;
  struct timespec idle_since;
  int idle = 0;
  for (;;) {
    struct epoll_event evs[64];
    int n = epoll_wait(epfd, evs, 64, 1000);
    if (n < 0 && errno != EINTR) die("epoll_wait");
    for (int i = 0; i < n; i++) {
      void *p = evs[i].data.ptr;
      if (p == &TAG_NOTIFY_LISTEN) accept_notify();
      else if (p == &TAG_CONTROL_LISTEN) accept_control();
      else if (p == &TAG_CONTROL) {
        /* The controller sends nothing; readable means closed (or junk, discarded). */
        char junk[256];
        ssize_t r = read(control_fd, junk, sizeof junk);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR) || (evs[i].events & (EPOLLRDHUP | EPOLLHUP))) {
          epoll_ctl(epfd, EPOLL_CTL_DEL, control_fd, NULL);
          close(control_fd);
          control_fd = -1;
          out_len = 0;
        }
      } else serve((struct sandbox *)p, evs[i].events);
    }
    flush_control();
    if (out_len > 0 && control_fd >= 0) {
      /* Wait for writability only while output is pending. */
      struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLOUT, .data.ptr = &TAG_CONTROL};
      epoll_ctl(epfd, EPOLL_CTL_MOD, control_fd, &ev);
    } else if (control_fd >= 0) {
      struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = &TAG_CONTROL};
      epoll_ctl(epfd, EPOLL_CTL_MOD, control_fd, &ev);
    }
    if (live_sandboxes() == 0 && control_fd < 0) {
      struct timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      if (!idle) {
        idle = 1;
        idle_since = now;
      } else if ((now.tv_sec - idle_since.tv_sec) * 1000 + (now.tv_nsec - idle_since.tv_nsec) / 1000000 >= idle_exit_ms) {
        unlink(notify_path);
        unlink(control_path);
        if (pid_file) unlink(pid_file);
        return 0;
      }
    } else {
      idle = 0;
    }
  }
}
