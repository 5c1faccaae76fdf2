/*
 * vmux: the guest side of the agent stream multiplexer over one virtio-serial port.
 * The wire format and its contracts are in docs/AGENT_PROTOCOL.md, "The VM transport:
 * stream multiplexer"; the host side is daemon/drivers/microvm/vmux.ts.
 *
 * Shape: vmux has an epoll instance of its own holding the port, a reconnect timer and
 * the mux end of every stream's socketpair; the agent watches that epoll fd like any
 * other fd and calls vmux_run() when it is readable. So the agent's loop, its
 * connection handling and its flow control are untouched: every mux stream is, to the
 * agent, one accepted connection (the other end of the socketpair).
 *
 * Contracts:
 *   - Nothing blocks: the port and the socketpair ends are non-blocking; frames for the
 *     port are queued (per mux, unbounded only by credits: see below).
 *   - Per-stream credit flow control. The host may have at most its announced window
 *     (HELLO) of bytes in flight to us per stream; we buffer what the agent has not read
 *     yet (at most that window) and return credit (CREDIT frames, in batches of a
 *     quarter window) as the agent reads. We read a stream's socketpair only while the
 *     host has given us credit for it. A stalled reader on either side therefore holds
 *     at most one window per stream and never blocks another stream.
 *   - The port as a whole: while more than PORT_OUT_HIGH bytes wait to be written to it
 *     (the host or QEMU is not reading), no stream is read, until the queue is below
 *     PORT_OUT_LOW. The host reads the port eagerly (its buffering is bounded by the
 *     credits), so this only throttles a saturated link, never one stalled stream.
 *   - Sessions. A HELLO from the host (any time) starts a new session: every stream of
 *     the previous one is dropped (its socketpair closed, so the agent sees its
 *     connection end and kills its execs, as for a dropped socket), then HELLO_ACK
 *     answers. Before the first HELLO, and after the host went away, frames are ignored.
 *   - The host going away (dsecd restarted, port read returns 0 or fails): every stream
 *     is dropped the same way; the port is taken out of epoll (a disconnected port polls
 *     as readable forever) and re-tried every RECONNECT_POLL_MS until the host is back.
 *   - Resynchronisation. Every frame has a magic and a CRC-32 over header and payload; a
 *     byte sequence that is not a valid frame (stale bytes of a previous session, a
 *     frame the old dsecd only half wrote) is skipped a byte at a time until the next
 *     valid frame. The host sends one maximal frame's worth of zero bytes before its
 *     first HELLO, so a truncated frame is always completed (and rejected) before it.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <linux/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/uio.h>

#include "vmux.h"

/* Header: u8 0xD5, u8 'X', u8 type, u8 flags, u32 stream, u32 length, u32 crc32 (all BE). */
#define MUX_HDR 16
#define MUX_MAGIC0 0xD5
#define MUX_MAGIC1 0x58
/* Largest payload of one mux frame: 64 KiB (a virtio-serial buffer is 4 KiB; larger
 * frames only amortise the header and the CRC). */
#define MUX_MAX_PAYLOAD 65536u
/* Mux protocol versions this side speaks. */
#define MUX_VERSION_MIN 1
#define MUX_VERSION_MAX 1
/* Bytes the host may send us per stream before we return credit: 256 KiB, a few
 * socket buffers, enough to keep the link busy while the agent reads. */
#define MUX_WINDOW (256u << 10)
#define MUX_CREDIT_BATCH (MUX_WINDOW / 4)
/* Port outbound queue marks (see the contracts above). */
#define PORT_OUT_HIGH (1u << 20)
#define PORT_OUT_LOW (256u << 10)
/* How often a disconnected port is tried again: 100 ms bounds the delay of a restarted
 * dsecd's reconnection at the cost of ten wake-ups a second while no dsecd is there. */
#define RECONNECT_POLL_MS 100
/* Input buffer: room for one maximal frame plus the bytes after it. */
#define INBUF_CAP (2 * (MUX_HDR + MUX_MAX_PAYLOAD))

enum { T_HELLO = 1, T_HELLO_ACK = 2, T_OPEN = 3, T_DATA = 4, T_CREDIT = 5, T_CLOSE = 6, T_OP = 7, T_OP_REPLY = 8 };
enum { OP_SYNC = 1, OP_KILL_ALL = 2, OP_PROCS = 3, OP_SET_TIME = 4, OP_RESEED = 5, OP_CONFINE = 6 };
enum { K_PORT = 1, K_TIMER, K_STREAM };

struct mchunk {
	struct mchunk *next;
	size_t len, off;
	unsigned char data[];
};

struct vstream {
	int kind; /* K_STREAM: first member, epoll data.ptr points here */
	uint32_t id;
	int fd;          /* the mux end of the socketpair */
	uint32_t events; /* registered epoll events (0: not registered) */
	uint64_t credit; /* bytes we may still send the host on this stream */
	struct mchunk *iq_head, *iq_tail;
	size_t iq_bytes;     /* host data not yet written to fd (at most MUX_WINDOW) */
	uint32_t unreported; /* bytes written to fd and not yet returned as credit */
	int in_dead;         /* the agent stopped reading (EPIPE): host data is discarded */
	int dropped;         /* off the list, freed at the end of vmux_run() */
	struct vstream *next, *prev;
	struct vstream *grave_next;
};

static struct {
	int ep, port, tfd;
	int port_kind, timer_kind; /* epoll data.ptr targets */
	uint32_t port_events;
	int port_registered;
	int gone;    /* host disconnected: port out of epoll, timer armed */
	int session; /* a HELLO was accepted */
	uint64_t nonce;
	uint32_t host_window;
	unsigned char *in;
	size_t in_len;
	struct mchunk *oq_head, *oq_tail;
	size_t oq_bytes;
	int out_paused;
	struct vstream *streams;
	struct vstream *grave;
	unsigned nstreams;
	uint64_t skipped; /* bytes skipped while resynchronising, since the last valid frame */
	vmux_adopt_fn adopt;
	vmux_log_fn log;
	vmux_confine_fn confine;
	vmux_op_fn ops;
} M = { .ep = -1, .port = -1, .tfd = -1, .port_kind = K_PORT, .timer_kind = K_TIMER };

/* ---- CRC-32 (IEEE 802.3, reflected 0xEDB88320; zlib's crc32), slicing by 8 ------------ */

static uint32_t crc_tab[8][256];

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
		crc_tab[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
}

/* crc_update(crc_update(0, a), b) == CRC-32 of a followed by b. */
static uint32_t crc_update(uint32_t crc, const unsigned char *p, size_t n)
{
	crc = ~crc;
	while (n >= 8) {
		uint32_t a = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
		uint32_t b = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
		crc = crc_tab[7][a & 0xff] ^ crc_tab[6][(a >> 8) & 0xff] ^ crc_tab[5][(a >> 16) & 0xff] ^ crc_tab[4][a >> 24] ^
		      crc_tab[3][b & 0xff] ^ crc_tab[2][(b >> 8) & 0xff] ^ crc_tab[1][(b >> 16) & 0xff] ^ crc_tab[0][b >> 24];
		p += 8;
		n -= 8;
	}
	while (n--)
		crc = crc_tab[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

/* ---- helpers -------------------------------------------------------------------------- */

static void put32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24);
	p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8);
	p[3] = (unsigned char)v;
}

static uint32_t get32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t get64(const unsigned char *p)
{
	return (uint64_t)get32(p) << 32 | get32(p + 4);
}

static void ep_set(int fd, void *ptr, uint32_t *cur, uint32_t want)
{
	if (*cur == want)
		return;
	struct epoll_event ev = { .events = want, .data.ptr = ptr };
	int op = *cur == 0 ? EPOLL_CTL_ADD : want == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
	if (epoll_ctl(M.ep, op, fd, &ev) < 0 && !(op == EPOLL_CTL_DEL && errno == ENOENT))
		M.log("vmux: epoll_ctl op=%d fd=%d: %s", op, fd, strerror(errno));
	*cur = want;
}

static void chunks_free(struct mchunk *c)
{
	while (c) {
		struct mchunk *n = c->next;
		free(c);
		c = n;
	}
}

/* ---- the port's outbound queue ---------------------------------------------------------- */

static void port_update_events(void);
static void streams_update_events(void);
static void host_gone(const char *why);

/* Queue one frame: header (with the CRC over header and both payload pieces), then p1, p2. */
static void send_frame(unsigned type, uint32_t stream, const void *p1, size_t n1, const void *p2, size_t n2)
{
	if (M.gone)
		return; /* nobody to send to; the new host starts a new session */
	struct mchunk *c = malloc(sizeof *c + MUX_HDR + n1 + n2);
	if (!c) {
		host_gone("out of memory queueing a frame");
		return;
	}
	unsigned char *h = c->data;
	h[0] = MUX_MAGIC0;
	h[1] = MUX_MAGIC1;
	h[2] = (unsigned char)type;
	h[3] = 0;
	put32(h + 4, stream);
	put32(h + 8, (uint32_t)(n1 + n2));
	if (n1)
		memcpy(h + MUX_HDR, p1, n1);
	if (n2)
		memcpy(h + MUX_HDR + n1, p2, n2);
	put32(h + 12, crc_update(crc_update(0, h, 12), h + MUX_HDR, n1 + n2));
	c->next = NULL;
	c->len = MUX_HDR + n1 + n2;
	c->off = 0;
	if (M.oq_tail)
		M.oq_tail->next = c;
	else
		M.oq_head = c;
	M.oq_tail = c;
	M.oq_bytes += c->len;
}

static void port_flush(void)
{
	while (M.oq_head && !M.gone) {
		struct iovec iov[32];
		int n = 0;
		for (struct mchunk *c = M.oq_head; c && n < 32; c = c->next, n++) {
			iov[n].iov_base = c->data + c->off;
			iov[n].iov_len = c->len - c->off;
		}
		ssize_t w = writev(M.port, iov, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				break;
			char why[96];
			snprintf(why, sizeof why, "write: %s", strerror(errno));
			host_gone(why);
			return;
		}
		M.oq_bytes -= (size_t)w;
		while (w > 0) {
			struct mchunk *c = M.oq_head;
			size_t left = c->len - c->off;
			if ((size_t)w < left) {
				c->off += (size_t)w;
				break;
			}
			w -= (ssize_t)left;
			M.oq_head = c->next;
			free(c);
		}
		if (!M.oq_head)
			M.oq_tail = NULL;
	}
	if (M.gone)
		return;
	int paused = M.out_paused;
	if (!M.out_paused && M.oq_bytes > PORT_OUT_HIGH)
		M.out_paused = 1;
	else if (M.out_paused && M.oq_bytes < PORT_OUT_LOW)
		M.out_paused = 0;
	if (paused != M.out_paused)
		streams_update_events();
	port_update_events();
}

static void port_update_events(void)
{
	if (M.gone)
		return;
	ep_set(M.port, &M.port_kind, &M.port_events, EPOLLIN | (M.oq_head ? EPOLLOUT : 0));
}

/* ---- streams ---------------------------------------------------------------------------- */

static struct vstream *stream_find(uint32_t id)
{
	for (struct vstream *s = M.streams; s; s = s->next)
		if (s->id == id)
			return s;
	return NULL;
}

static void stream_update_events(struct vstream *s)
{
	uint32_t want = 0;
	if (s->credit > 0 && !M.out_paused && !M.gone)
		want |= EPOLLIN;
	if (s->iq_head)
		want |= EPOLLOUT;
	/* Nothing wanted: unregistered, so a closed peer (EPOLLHUP, always reported while
	 * registered) cannot spin the loop. Its end of file is seen once credit returns. */
	ep_set(s->fd, s, &s->events, want);
}

static void streams_update_events(void)
{
	for (struct vstream *s = M.streams; s; s = s->next)
		stream_update_events(s);
}

/* Drops a stream: closes its socketpair end (the agent sees its connection end) and, when
 * `notify`, tells the host with CLOSE. */
static void stream_drop(struct vstream *s, int notify)
{
	if (notify)
		send_frame(T_CLOSE, s->id, NULL, 0, NULL, 0);
	if (s->events)
		epoll_ctl(M.ep, EPOLL_CTL_DEL, s->fd, NULL);
	close(s->fd);
	s->fd = -1;
	chunks_free(s->iq_head);
	s->iq_head = s->iq_tail = NULL;
	if (s->prev)
		s->prev->next = s->next;
	else
		M.streams = s->next;
	if (s->next)
		s->next->prev = s->prev;
	M.nstreams--;
	/* Events of this batch may still point here: freed at the end of vmux_run(). */
	s->dropped = 1;
	s->grave_next = M.grave;
	M.grave = s;
}

static void streams_drop_all(const char *why)
{
	if (M.nstreams)
		M.log("vmux: dropping %u stream(s): %s", M.nstreams, why);
	while (M.streams)
		stream_drop(M.streams, 0);
}

static void stream_maybe_credit(struct vstream *s)
{
	if (s->unreported >= MUX_CREDIT_BATCH) {
		unsigned char b[4];
		put32(b, s->unreported);
		send_frame(T_CREDIT, s->id, b, 4, NULL, 0);
		s->unreported = 0;
	}
}

/* The agent no longer reads this stream (it closed its end): host data is dropped from
 * now on, while what the agent wrote before closing is still read and sent. */
static void stream_in_dead(struct vstream *s)
{
	s->in_dead = 1;
	chunks_free(s->iq_head);
	s->iq_head = s->iq_tail = NULL;
	s->iq_bytes = 0;
}

/* Writes queued host data to the agent's end. */
static void stream_flush_in(struct vstream *s)
{
	while (s->iq_head) {
		struct mchunk *c = s->iq_head;
		ssize_t w = send(s->fd, c->data + c->off, c->len - c->off, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				break;
			stream_in_dead(s);
			break;
		}
		c->off += (size_t)w;
		s->iq_bytes -= (size_t)w;
		s->unreported += (uint32_t)w;
		if (c->off == c->len) {
			s->iq_head = c->next;
			if (!s->iq_head)
				s->iq_tail = NULL;
			free(c);
		}
	}
	stream_maybe_credit(s);
	stream_update_events(s);
}

static void on_open(uint32_t id)
{
	if (id == 0 || stream_find(id)) {
		M.log("vmux: OPEN for stream %u, which is %s; ignored", id, id == 0 ? "the control stream" : "already open");
		return;
	}
	int sp[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sp) < 0) {
		M.log("vmux: stream %u: socketpair: %s; refusing it", id, strerror(errno));
		send_frame(T_CLOSE, id, NULL, 0, NULL, 0);
		return;
	}
	struct vstream *s = calloc(1, sizeof *s);
	if (!s) {
		close(sp[0]);
		close(sp[1]);
		send_frame(T_CLOSE, id, NULL, 0, NULL, 0);
		return;
	}
	if (M.adopt(sp[1]) < 0) {
		close(sp[0]);
		free(s);
		send_frame(T_CLOSE, id, NULL, 0, NULL, 0);
		return;
	}
	s->kind = K_STREAM;
	s->id = id;
	s->fd = sp[0];
	s->credit = M.host_window;
	s->next = M.streams;
	if (M.streams)
		M.streams->prev = s;
	M.streams = s;
	M.nstreams++;
	stream_update_events(s);
}

static void on_data(uint32_t id, const unsigned char *p, uint32_t len)
{
	struct vstream *s = stream_find(id);
	if (!s || len == 0 || s->in_dead)
		return; /* closed meanwhile (or the agent stopped reading): data in flight is dropped */
	if (s->iq_bytes + len > MUX_WINDOW) {
		M.log("vmux: stream %u: the host sent %zu bytes beyond its %u-byte window; closing the stream", id,
		      s->iq_bytes + len - MUX_WINDOW, MUX_WINDOW);
		stream_drop(s, 1);
		return;
	}
	size_t off = 0;
	if (!s->iq_head) {
		while (off < len) {
			ssize_t w = send(s->fd, p + off, len - off, MSG_NOSIGNAL);
			if (w < 0) {
				if (errno == EINTR)
					continue;
				if (errno == EAGAIN)
					break;
				stream_in_dead(s);
				stream_update_events(s);
				return;
			}
			off += (size_t)w;
			s->unreported += (uint32_t)w;
		}
	}
	if (off < len) {
		struct mchunk *c = malloc(sizeof *c + (len - off));
		if (!c) {
			stream_drop(s, 1);
			return;
		}
		memcpy(c->data, p + off, len - off);
		c->next = NULL;
		c->len = len - off;
		c->off = 0;
		if (s->iq_tail)
			s->iq_tail->next = c;
		else
			s->iq_head = c;
		s->iq_tail = c;
		s->iq_bytes += c->len;
	}
	stream_maybe_credit(s);
	stream_update_events(s);
}

static void stream_readable(struct vstream *s)
{
	static unsigned char buf[MUX_MAX_PAYLOAD];
	if (s->credit == 0 || M.out_paused) {
		stream_update_events(s);
		return;
	}
	size_t want = s->credit < MUX_MAX_PAYLOAD ? (size_t)s->credit : MUX_MAX_PAYLOAD;
	ssize_t n;
	do
		n = read(s->fd, buf, want);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == EAGAIN)
		return;
	if (n <= 0) {
		stream_drop(s, 1); /* the agent closed the connection (or it failed) */
		return;
	}
	send_frame(T_DATA, s->id, buf, (size_t)n, NULL, 0);
	s->credit -= (uint64_t)n;
	if (s->credit == 0)
		stream_update_events(s);
}

/* ---- control: HELLO and guest operations -------------------------------------------------- */

static void on_hello(const unsigned char *p, uint32_t len)
{
	if (len < 16) {
		M.log("vmux: malformed HELLO (%u bytes); ignored", len);
		return;
	}
	unsigned vmin = (unsigned)p[0] << 8 | p[1], vmax = (unsigned)p[2] << 8 | p[3];
	uint64_t nonce = get64(p + 4);
	uint32_t window = get32(p + 12);
	unsigned char ack[18];
	if (!(M.session && nonce == M.nonce)) {
		streams_drop_all("a new host session began");
		/* Frames still queued belong to the previous session. */
		chunks_free(M.oq_head);
		M.oq_head = M.oq_tail = NULL;
		M.oq_bytes = 0;
		M.out_paused = 0;
		unsigned v = vmax < MUX_VERSION_MAX ? vmax : MUX_VERSION_MAX;
		if (vmin > MUX_VERSION_MAX || vmax < MUX_VERSION_MIN || v < vmin) {
			M.log("vmux: host speaks mux versions %u..%u, this agent %u..%u: no session", vmin, vmax, MUX_VERSION_MIN,
			      MUX_VERSION_MAX);
			M.session = 0;
			v = 0;
		} else {
			M.session = 1;
			M.nonce = nonce;
			M.host_window = window ? window : 1;
			M.log("vmux: session %016llx: mux version %u, host window %u bytes", (unsigned long long)nonce, v, M.host_window);
		}
		ack[0] = (unsigned char)(v >> 8);
		ack[1] = (unsigned char)v;
	} else {
		ack[0] = 0;
		ack[1] = 1; /* a repeated HELLO of the current session: answer it again */
	}
	ack[2] = 0;
	ack[3] = MUX_VERSION_MIN;
	ack[4] = 0;
	ack[5] = MUX_VERSION_MAX;
	memcpy(ack + 6, p + 4, 8);
	put32(ack + 14, MUX_WINDOW);
	send_frame(T_HELLO_ACK, 0, ack, sizeof ack, NULL, 0);
}

/* User processes in the guest other than the agent: every /proc/<pid> that is not us,
 * not a kernel thread (kthreadd, pid 2, and its children) and not a zombie. */
static int count_procs(void)
{
	DIR *d = opendir("/proc");
	if (!d)
		return -errno;
	int n = 0;
	pid_t self = getpid();
	struct dirent *de;
	while ((de = readdir(d))) {
		char *end;
		long pid = strtol(de->d_name, &end, 10);
		if (*end || pid <= 0 || pid == self || pid == 2)
			continue;
		char path[64], st[512];
		snprintf(path, sizeof path, "/proc/%ld/stat", pid);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t m = read(fd, st, sizeof st - 1);
		close(fd);
		if (m <= 0)
			continue;
		st[m] = 0;
		char *rp = strrchr(st, ')');
		char state;
		int ppid;
		if (rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid != 2 && state != 'Z' && state != 'X')
			n++;
	}
	closedir(d);
	return n;
}

static void on_op(const unsigned char *p, uint32_t len)
{
	if (len < 6)
		return;
	uint32_t seq = get32(p);
	unsigned op = (unsigned)p[4] << 8 | p[5];
	int32_t res;
	unsigned char extra[VMUX_OP_REPLY_MAX];
	uint32_t nextra = 0;
	switch (op) {
	case OP_SYNC:
		sync();
		res = 0;
		break;
	case OP_KILL_ALL:
		if (len < 10) {
			res = -EINVAL;
			break;
		}
		if (getpid() != 1) {
			res = -EPERM; /* only as the guest's init: kill(-1) elsewhere reaches far more */
			break;
		}
		/* From PID 1: every process but init itself (kernel threads ignore signals). */
		res = kill(-1, (int)get32(p + 6)) < 0 ? (errno == ESRCH ? 0 : -errno) : 0;
		break;
	case OP_PROCS:
		res = count_procs();
		break;
	case OP_SET_TIME: {
		if (len < 14) {
			res = -EINVAL;
			break;
		}
		if (getpid() != 1) {
			res = -EPERM; /* only as the guest's init: never the clock of a host */
			break;
		}
		uint64_t ns = get64(p + 6);
		struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull) };
		res = clock_settime(CLOCK_REALTIME, &ts) < 0 ? -errno : 0;
		break;
	}
	case OP_RESEED: {
		/* After a machine snapshot is restored (or forked), the guest's RNG state is the
		 * source's: mix in the host's fresh bytes as credited entropy and reseed the CRNG at
		 * once, so no two forks draw the same random numbers from then on. 16-256 bytes. */
		uint32_t n = len - 6;
		if (n < 16 || n > 256) {
			res = -EINVAL;
			break;
		}
		if (getpid() != 1) {
			res = -EPERM; /* only as the guest's init: never a host's pool */
			break;
		}
		struct { int entropy_count; int buf_size; unsigned char buf[256]; } e;
		e.entropy_count = (int)n * 8;
		e.buf_size = (int)n;
		memcpy(e.buf, p + 6, n);
		int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
		if (fd < 0) {
			res = -errno;
			break;
		}
		res = ioctl(fd, RNDADDENTROPY, &e) < 0 ? -errno : 0;
		if (res == 0 && ioctl(fd, RNDRESEEDCRNG) < 0)
			res = -errno;
		close(fd);
		break;
	}
	case OP_CONFINE:
		/* The confinement of the guest's commands (agent.c guest_confine): only as init. */
		res = getpid() != 1 ? -EPERM : M.confine ? M.confine(p + 6, len - 6) : -ENOSYS;
		break;
	default:
		/* Ops of other units (damon.c), with bytes appended to the reply. */
		res = M.ops ? M.ops(op, p + 6, len - 6, extra, &nextra) : -ENOSYS;
		if (nextra > sizeof extra)
			nextra = 0;
	}
	unsigned char r[8];
	put32(r, seq);
	put32(r + 4, (uint32_t)res);
	send_frame(T_OP_REPLY, 0, r, sizeof r, extra, nextra);
}

static void handle_frame(unsigned type, uint32_t stream, const unsigned char *p, uint32_t len)
{
	if (type == T_HELLO) {
		if (stream == 0)
			on_hello(p, len);
		return;
	}
	if (!M.session)
		return; /* before a session (or after the host left) nothing else counts */
	switch (type) {
	case T_OPEN:
		on_open(stream);
		break;
	case T_DATA:
		on_data(stream, p, len);
		break;
	case T_CREDIT: {
		struct vstream *s = stream_find(stream);
		if (s && len >= 4) {
			s->credit += get32(p);
			stream_update_events(s);
		}
		break;
	}
	case T_CLOSE: {
		struct vstream *s = stream_find(stream);
		if (s)
			stream_drop(s, 0);
		break;
	}
	case T_OP:
		if (stream == 0)
			on_op(p, len);
		break;
	default:
		break; /* HELLO_ACK, OP_REPLY or a type from a later version: ignored */
	}
}

/* ---- the port's input --------------------------------------------------------------------- */

/* Parses every complete frame in the input buffer, skipping bytes that do not start a valid
 * frame (see the resynchronisation contract). */
static void parse_input(void)
{
	size_t off = 0;
	while (M.in_len - off >= MUX_HDR) {
		const unsigned char *h = M.in + off;
		if (h[0] != MUX_MAGIC0 || h[1] != MUX_MAGIC1) {
			const unsigned char *q = memchr(h + 1, MUX_MAGIC0, M.in_len - off - 1);
			size_t skip = q ? (size_t)(q - h) : M.in_len - off;
			M.skipped += skip;
			off += skip;
			continue;
		}
		uint32_t len = get32(h + 8);
		if (len > MUX_MAX_PAYLOAD) {
			M.skipped++;
			off++;
			continue;
		}
		if (M.in_len - off < MUX_HDR + (size_t)len)
			break;
		if (crc_update(crc_update(0, h, 12), h + MUX_HDR, len) != get32(h + 12)) {
			M.skipped++;
			off++;
			continue;
		}
		if (M.skipped) {
			M.log("vmux: skipped %llu byte(s) that were no valid frame", (unsigned long long)M.skipped);
			M.skipped = 0;
		}
		handle_frame(h[2], get32(h + 4), h + MUX_HDR, len);
		off += MUX_HDR + (size_t)len;
		if (M.gone) {
			M.in_len = 0;
			return;
		}
	}
	if (off) {
		memmove(M.in, M.in + off, M.in_len - off);
		M.in_len -= off;
	}
}

/* The host went away: drop everything, take the port out of epoll, poll for its return. */
static void host_gone(const char *why)
{
	if (M.gone)
		return;
	M.log("vmux: host disconnected (%s)", why);
	streams_drop_all("the host disconnected");
	M.session = 0;
	M.gone = 1;
	M.in_len = 0;
	chunks_free(M.oq_head);
	M.oq_head = M.oq_tail = NULL;
	M.oq_bytes = 0;
	M.out_paused = 0;
	ep_set(M.port, &M.port_kind, &M.port_events, 0);
	struct itimerspec its = { .it_interval = { 0, RECONNECT_POLL_MS * 1000000L }, .it_value = { 0, RECONNECT_POLL_MS * 1000000L } };
	timerfd_settime(M.tfd, 0, &its, NULL);
}

/* Reads what the port has; returns 1 if it read data, 0 if none (EAGAIN), -1 if the host is gone. */
static int port_read_once(void)
{
	ssize_t n;
	do
		n = read(M.port, M.in + M.in_len, INBUF_CAP - M.in_len);
	while (n < 0 && errno == EINTR);
	if (n < 0 && errno == EAGAIN)
		return 0;
	if (n <= 0) {
		char why[96];
		snprintf(why, sizeof why, "%s", n == 0 ? "end of file on the port" : strerror(errno));
		if (!M.gone)
			host_gone(why);
		return -1;
	}
	M.in_len += (size_t)n;
	return 1;
}

static void on_port(uint32_t ev)
{
	if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
		for (int i = 0; i < 16 && !M.gone; i++) {
			int r = port_read_once();
			if (r <= 0)
				break;
			parse_input();
		}
	}
	if (!M.gone && (ev & EPOLLOUT))
		port_flush();
}

static void on_timer(void)
{
	uint64_t ticks;
	while (read(M.tfd, &ticks, sizeof ticks) < 0 && errno == EINTR)
		;
	if (!M.gone)
		return;
	ssize_t n;
	do
		n = read(M.port, M.in, INBUF_CAP);
	while (n < 0 && errno == EINTR);
	if (n == 0 || (n < 0 && errno != EAGAIN))
		return; /* still gone */
	M.gone = 0;
	M.in_len = n > 0 ? (size_t)n : 0;
	struct itimerspec off = { 0 };
	timerfd_settime(M.tfd, 0, &off, NULL);
	M.log("vmux: host connected");
	port_update_events();
	parse_input();
}

/* ---- entry points ------------------------------------------------------------------------- */

int vmux_open(const char *path, int fd, vmux_adopt_fn adopt, vmux_log_fn log)
{
	M.adopt = adopt;
	M.log = log;
	crc_init();
	if (path) {
		fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
		if (fd < 0) {
			log("fatal: --vmux: open %s: %s", path, strerror(errno));
			return -1;
		}
	} else {
		int fl = fcntl(fd, F_GETFL);
		if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
			log("fatal: --vmux-fd %d: %s", fd, strerror(errno));
			return -1;
		}
	}
	M.port = fd;
	M.in = malloc(INBUF_CAP);
	M.ep = epoll_create1(EPOLL_CLOEXEC);
	M.tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (!M.in || M.ep < 0 || M.tfd < 0) {
		log("fatal: vmux: %s", strerror(errno));
		return -1;
	}
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &M.timer_kind };
	if (epoll_ctl(M.ep, EPOLL_CTL_ADD, M.tfd, &ev) < 0) {
		log("fatal: vmux: epoll_ctl: %s", strerror(errno));
		return -1;
	}
	port_update_events();
	return M.ep;
}

void vmux_set_confine(vmux_confine_fn fn)
{
	M.confine = fn;
}

void vmux_set_ops(vmux_op_fn fn)
{
	M.ops = fn;
}

void vmux_run(void)
{
	struct epoll_event evs[64];
	int n = epoll_wait(M.ep, evs, 64, 0);
	for (int i = 0; i < n; i++) {
		int kind = *(int *)evs[i].data.ptr;
		if (kind == K_PORT) {
			on_port(evs[i].events);
		} else if (kind == K_TIMER) {
			on_timer();
		} else {
			struct vstream *s = evs[i].data.ptr;
			if (s->dropped)
				continue; /* dropped earlier in this batch */
			if (evs[i].events & EPOLLOUT)
				stream_flush_in(s);
			if (!s->dropped && (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && (s->events & EPOLLIN))
				stream_readable(s);
			else if (!s->dropped)
				stream_update_events(s);
		}
	}
	port_flush();
	while (M.grave) {
		struct vstream *s = M.grave;
		M.grave = s->grave_next;
		free(s);
	}
}
