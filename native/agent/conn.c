/*
 * conn: connections, frame I/O and the dispatch of inbound frames (conn.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "conn.h"
#include "exec.h"
#include "files.h"
#include "isolate.h"
#include "landlock.h"
#include "proto.h"
#include "util.h"

/* Outbound queue high-water mark per connection: above it the exec pipes of that
 * connection stop being read (EPOLLIN off) so one slow client cannot grow the agent
 * without bound; reading resumes once the queue is below OUTQ_LOW. */
#define OUTQ_HIGH (4u << 20)
#define OUTQ_LOW (1u << 20)
/* How long the listener is paused after accept() hits EMFILE/ENFILE. */
#define ACCEPT_RETRY_MS 100

struct conn *g_conns;
static unsigned g_next_conn_id = 1;
static struct conn *g_dirty;      /* connections with output queued in this iteration */
static struct conn *g_conn_grave; /* destroyed in this iteration, freed at its end */
static struct watch g_listen_w;
static uint64_t g_listen_retry_ns; /* nonzero: listener paused until then */

/* ---- outbound frames -------------------------------------------------------------- */

static void conn_mark_dirty(struct conn *c)
{
	if (!c->dirty) {
		c->dirty = 1;
		c->dirty_next = g_dirty;
		g_dirty = c;
	}
}

/* A frame with room for up to cap payload bytes at ch->data + HDR_LEN; queue it with
 * frame_queue() once the payload is in place. */
struct chunk *frame_alloc(unsigned type, uint32_t stream, size_t cap)
{
	struct chunk *ch = xmalloc(sizeof *ch + HDR_LEN + cap);
	ch->next = NULL;
	ch->off = 0;
	ch->len = HDR_LEN + cap;
	put_u32(ch->data, (uint32_t)cap);
	ch->data[4] = (unsigned char)type;
	ch->data[5] = 0;
	ch->data[6] = 0;
	ch->data[7] = 0;
	put_u32(ch->data + 8, stream);
	return ch;
}

/* Queue a frame from frame_alloc() whose payload is plen bytes (<= its cap). */
void frame_queue(struct conn *c, struct chunk *ch, size_t plen)
{
	if (!c || c->dead) {
		free(ch);
		return;
	}
	ch->len = HDR_LEN + plen;
	put_u32(ch->data, (uint32_t)plen);
	if (c->oq_tail)
		c->oq_tail->next = ch;
	else
		c->oq_head = ch;
	c->oq_tail = ch;
	c->oq_bytes += ch->len;
	conn_mark_dirty(c);
	if (!c->out_paused && c->oq_bytes > OUTQ_HIGH)
		exec_pipes_set_paused(c, 1);
}

/* Queue one frame whose payload is the concatenation of (p1,n1) and (p2,n2). */
void send_frame2(struct conn *c, unsigned type, uint32_t stream, const void *p1, size_t n1,
			const void *p2, size_t n2)
{
	if (!c || c->dead)
		return;
	struct chunk *ch = frame_alloc(type, stream, n1 + n2);
	if (n1)
		memcpy(ch->data + HDR_LEN, p1, n1);
	if (n2)
		memcpy(ch->data + HDR_LEN + n1, p2, n2);
	frame_queue(c, ch, n1 + n2);
}

void send_frame(struct conn *c, unsigned type, uint32_t stream, const void *p, size_t n)
{
	send_frame2(c, type, stream, p, n, NULL, 0);
}

/* EXEC_ERROR or FILE_ERROR: u32 errno, then the message (n bytes). */
void send_errno_frame(struct conn *c, unsigned type, uint32_t stream, int err, const char *msg, size_t n)
{
	unsigned char b[4];
	put_u32(b, (uint32_t)err);
	send_frame2(c, type, stream, b, 4, msg, n);
}

void send_error(struct conn *c, uint32_t stream, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	size_t n = vformat(msg, sizeof msg, fmt, ap);
	va_end(ap);
	logf_("conn=%u stream=%u error: %s", c->id, stream, msg);
	send_frame(c, F_ERROR, stream, msg, n);
}

/* A fatal protocol error: ERROR on stream 0, stop reading, close once it is flushed. */
void conn_fatal(struct conn *c, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	size_t n = vformat(msg, sizeof msg, fmt, ap);
	va_end(ap);
	logf_("conn=%u fatal protocol error: %s", c->id, msg);
	send_frame(c, F_ERROR, 0, msg, n);
	c->closing = 1;
	watch_set(&c->w, 0);
}

/* Free a queue of chunks (stdin or outbound). */
void chunks_free(struct chunk *ch)
{
	while (ch) {
		struct chunk *n = ch->next;
		free(ch);
		ch = n;
	}
}

static void conn_process(struct conn *c);

/* ---- inbound frames --------------------------------------------------------------- */

/* A frame that belongs to a stream is a fatal protocol error on stream 0 (the control
 * stream). Returns 1 if it came on stream 0. */
static int on_control_stream(struct conn *c, unsigned type, uint32_t stream)
{
	if (stream != 0)
		return 0;
	conn_fatal(c, "frame type %u on stream 0", type);
	return 1;
}

/* Reading the connection was paused for stdin backpressure and may resume now. */
void conn_resume_input(struct conn *c)
{
	if (c->closing || c->dead || c->stdin_over)
		return;
	watch_set(&c->w, c->w.events | EPOLLIN);
	conn_process(c); /* frames already buffered would otherwise wait for new input */
}

/* A new stream (EXEC or a file request) must not reuse a live stream id: answers ERROR and
 * returns 1 if it does. */
int stream_in_use(struct conn *c, uint32_t stream)
{
	if (!conn_find_exec(c, stream) && !conn_find_fop(c, stream))
		return 0;
	send_error(c, stream, "stream %u is already in use", stream);
	return 1;
}

static void handle_frame(struct conn *c, unsigned type, uint32_t stream, const unsigned char *p, size_t len)
{
	if (!c->helloed) {
		if (type != F_HELLO || stream != 0) {
			conn_fatal(c, "expected HELLO on stream 0 as the first frame, got type %u on stream %u", type, stream);
			return;
		}
		if (len < 4) {
			conn_fatal(c, "malformed HELLO: payload must start with a u32 protocol version");
			return;
		}
		uint32_t v = get_u32(p);
		if (v != PROTOCOL_VERSION) {
			conn_fatal(c, "unsupported protocol version %u (this agent speaks %u)", v, PROTOCOL_VERSION);
			return;
		}
		c->helloed = 1;
		char json[640];
		int enforced = strcmp(g_landlock_scope, "off") != 0;
		const char *why = enforced ? "" : !g_landlock ? "not requested (the agent runs without --landlock)" : g_landlock_why;
		int n = snprintf(json, sizeof json,
				 "{\"agent\":\"" AGENT_NAME "\",\"version\":\"" AGENT_VERSION "\",\"protocol\":%u,\"pid\":%d,"
				 "\"features\":[\"tty\",\"detached\",\"files\"%s],"
				 "\"landlock\":{\"enforced\":%s,\"abi\":%d,\"scope\":\"%s\",\"writable\":%d,\"reason\":\"%s\"}}",
				 PROTOCOL_VERSION, (int)getpid(), g_isolate ? ",\"isolate\"" : "", enforced ? "true" : "false",
				 g_landlock_abi, g_landlock_scope, g_nwritable, why);
		if (n < 0 || (size_t)n >= sizeof json)
			n = (int)strlen(json);
		unsigned char b[4];
		put_u32(b, PROTOCOL_VERSION);
		send_frame2(c, F_HELLO, 0, b, 4, json, (size_t)n);
		logf_("conn=%u hello protocol=%u", c->id, v);
		return;
	}
	switch (type) {
	case F_HELLO:
		conn_fatal(c, "HELLO after the handshake");
		return;
	case F_PING:
		if (stream != 0) {
			send_error(c, stream, "PING is only valid on stream 0");
			return;
		}
		send_frame(c, F_PONG, 0, p, len);
		return;
	case F_EXEC:
		if (stream == 0) {
			conn_fatal(c, "EXEC on stream 0");
			return;
		}
		handle_exec(c, stream, p, len);
		return;
	case F_FILE_READ:
	case F_FILE_WRITE:
	case F_FILE_STAT:
	case F_FILE_LIST:
	case F_FILE_MKDIR:
	case F_FILE_REMOVE:
	case F_FILE_SYMLINK:
		if (on_control_stream(c, type, stream) || stream_in_use(c, stream))
			return;
		handle_file_request(c, type, stream, p, len);
		return;
	case F_FILE_DATA:
	case F_FILE_DONE:
	case F_FILE_ERROR: {
		if (on_control_stream(c, type, stream))
			return;
		struct fop *f = conn_find_fop(c, stream);
		if (f)
			handle_file_stream_frame(c, f, type, p, len);
		else if (conn_find_exec(c, stream))
			send_error(c, stream, "frame type %u is not valid on an exec stream", type);
		/* else: the file stream already ended (race with its final frame): drop */
		return;
	}
	case F_RESIZE:
	case F_STDIN:
	case F_STDIN_EOF:
	case F_SIGNAL: {
		if (on_control_stream(c, type, stream))
			return;
		struct exec *e = conn_find_exec(c, stream);
		if (!e) {
			struct fop *f = conn_find_fop(c, stream);
			if (f) {
				send_error(c, stream, "frame type %u is not valid on a file stream", type);
				fop_free(f);
			}
			return; /* the stream just ended (race with EXIT) or never existed: drop */
		}
		exec_stream_frame(c, e, type, p, len);
		return;
	}
	default:
		if (stream == 0) {
			conn_fatal(c, "unknown or unexpected frame type %u on stream 0", type);
		} else {
			send_error(c, stream, "unknown or unexpected frame type %u", type);
			struct fop *f = conn_find_fop(c, stream);
			if (f)
				fop_free(f); /* ERROR is the final frame of a file stream */
		}
		return;
	}
}

/* Dispatch every complete buffered frame (unless reading is paused or closing). */
static void conn_process(struct conn *c)
{
	if (c->processing)
		return; /* re-entered from a handler: the outer loop picks up where it stands */
	c->processing = 1;
	size_t off = 0;
	while (!c->closing && !c->dead && c->stdin_over == 0 && c->in_len - off >= HDR_LEN) {
		const unsigned char *h = c->in + off;
		uint32_t len = get_u32(h);
		if (len > MAX_PAYLOAD) {
			conn_fatal(c, "frame payload of %u bytes exceeds the %u byte limit", len, MAX_PAYLOAD);
			break;
		}
		if (c->in_len - off < HDR_LEN + (size_t)len)
			break;
		/* flags and reserved are ignored by receivers (forward compatibility). */
		handle_frame(c, h[4], get_u32(h + 8), h + HDR_LEN, len);
		off += HDR_LEN + (size_t)len;
	}
	c->processing = 0;
	if (c->dead)
		return;
	if (off) {
		memmove(c->in, c->in + off, c->in_len - off);
		c->in_len -= off;
	}
}

/* ---- connections ------------------------------------------------------------------ */

static void conn_destroy(struct conn *c, const char *why)
{
	if (c->dead)
		return;
	logf_("conn=%u closed (%s)", c->id, why);
	c->dead = 1;
	/* Kill what is still running (unless DETACHED); the processes are reaped normally. */
	while (c->execs) {
		struct exec *e = c->execs;
		if (e->detached && !e->reaped) {
			exec_orphan(e); /* unlinks from c->execs */
			continue;
		}
		if (!e->reaped) {
			logf_("conn=%u stream=%u pid=%d killed: connection closed", c->id, e->stream, (int)e->pid);
			exec_kill(e, SIGKILL);
		}
		exec_finish(e); /* unlinks from c->execs */
	}
	while (c->fops)
		fop_free(c->fops); /* uncommitted writes leave no temp file behind */
	watch_close(&c->w);
	chunks_free(c->oq_head);
	c->oq_head = c->oq_tail = NULL;
	c->oq_bytes = 0;
	free(c->in);
	c->in = NULL;
	DL_UNLINK(g_conns, c, next, prev);
	c->grave_next = g_conn_grave;
	g_conn_grave = c;
}

static void conn_read(struct conn *c)
{
	/* Room for one READ_CHUNK, or for the rest of the frame being assembled. */
	size_t need = c->in_len + READ_CHUNK;
	if (c->in_len >= HDR_LEN) {
		uint32_t len = get_u32(c->in);
		if (len <= MAX_PAYLOAD && HDR_LEN + (size_t)len > need)
			need = HDR_LEN + (size_t)len;
	}
	if (need > c->in_cap) {
		unsigned char *nb = realloc(c->in, need);
		if (!nb) {
			conn_destroy(c, "out of memory");
			return;
		}
		c->in = nb;
		c->in_cap = need;
	}
	ssize_t n;
	do
		n = read(c->w.fd, c->in + c->in_len, c->in_cap - c->in_len);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		if (errno == EAGAIN)
			return;
		conn_destroy(c, strerror(errno));
		return;
	}
	if (n == 0) {
		conn_destroy(c, "peer closed");
		return;
	}
	c->in_len += (size_t)n;
	conn_process(c);
	/* Give back a large frame buffer once it is no longer needed. */
	if (!c->dead && c->in_cap > 4 * READ_CHUNK && c->in_len < READ_CHUNK) {
		unsigned char *nb = realloc(c->in, READ_CHUNK + HDR_LEN);
		if (nb) {
			c->in = nb;
			c->in_cap = READ_CHUNK + HDR_LEN;
		}
	}
}

static void conn_flush(struct conn *c)
{
	while (c->oq_head) {
		struct iovec iov[64];
		int n = 0;
		for (struct chunk *ch = c->oq_head; ch && n < 64; ch = ch->next, n++) {
			iov[n].iov_base = ch->data + ch->off;
			iov[n].iov_len = ch->len - ch->off;
		}
		ssize_t w = writev(c->w.fd, iov, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				break;
			conn_destroy(c, strerror(errno));
			return;
		}
		c->oq_bytes -= (size_t)w;
		while (w > 0) {
			struct chunk *ch = c->oq_head;
			size_t left = ch->len - ch->off;
			if ((size_t)w < left) {
				ch->off += (size_t)w;
				break;
			}
			w -= (ssize_t)left;
			c->oq_head = ch->next;
			free(ch);
		}
		if (!c->oq_head)
			c->oq_tail = NULL;
	}
	if (c->closing && !c->oq_head) {
		conn_destroy(c, "protocol error");
		return;
	}
	uint32_t ev = (c->closing || c->stdin_over) ? 0 : EPOLLIN;
	if (c->oq_head)
		ev |= EPOLLOUT;
	watch_set(&c->w, ev);
	if (c->out_paused && c->oq_bytes < OUTQ_LOW)
		exec_pipes_set_paused(c, 0);
}

/* Serves fd (a connected, non-blocking, close-on-exec stream socket) as a connection: an
 * accepted one, or a stream of the VM mux (vmux.c). Returns -1 (fd closed) on failure. */
int conn_adopt(int fd)
{
	struct conn *c = xmalloc(sizeof *c);
	memset(c, 0, sizeof *c);
	c->id = g_next_conn_id++;
	if (watch_add(&c->w, W_CONN, fd, c, EPOLLIN) < 0) {
		logf_("epoll_ctl ADD conn: %s", strerror(errno));
		close(fd);
		free(c);
		return -1;
	}
	DL_PUSH(g_conns, c, next, prev);
	logf_("conn=%u accepted", c->id);
	return 0;
}

void conn_accept(void)
{
	for (int i = 0; i < 64; i++) {
		int fd = accept4(g_listen_w.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				logf_("accept: %s; pausing the listener for %d ms", strerror(errno), ACCEPT_RETRY_MS);
				watch_set(&g_listen_w, 0);
				g_listen_retry_ns = mono_ns() + (uint64_t)ACCEPT_RETRY_MS * 1000000ull;
			} else if (errno != EAGAIN) {
				logf_("accept: %s", strerror(errno));
			}
			return;
		}
		conn_adopt(fd);
	}
}

/* ---- what the loop calls (loop.c) ----------------------------------------------- */

int conn_listen(int fd)
{
	return watch_add(&g_listen_w, W_LISTEN, fd, NULL, EPOLLIN);
}

void conn_on_event(struct conn *c, uint32_t ev)
{
	if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
		if (c->closing && (ev & (EPOLLHUP | EPOLLERR))) {
			conn_destroy(c, "peer closed");
			return;
		}
		if (!c->closing)
			conn_read(c);
	}
	if (!c->dead && (ev & EPOLLOUT))
		conn_flush(c);
}

uint64_t listen_retry_at(void)
{
	return g_listen_retry_ns;
}

void listen_retry_run(uint64_t now)
{
	if (g_listen_retry_ns && now >= g_listen_retry_ns) {
		g_listen_retry_ns = 0;
		watch_set(&g_listen_w, EPOLLIN);
	}
}

void conn_flush_dirty(void)
{
	while (g_dirty) {
		struct conn *c = g_dirty;
		g_dirty = c->dirty_next;
		c->dirty = 0;
		if (!c->dead)
			conn_flush(c);
	}
}

void conn_free_graveyard(void)
{
	while (g_conn_grave) {
		struct conn *c = g_conn_grave;
		g_conn_grave = c->grave_next;
		free(c);
	}
}
