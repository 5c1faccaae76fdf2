/*
 * conn: protocol framing and dispatch. A connection is one byte stream to dsecd: a socket
 * accepted on the listening socket (--listen-fd) or a stream of the VM mux (guest.c).
 *
 * Inbound: bytes are assembled into frames (12-byte header, payload <= MAX_PAYLOAD; a
 * larger one is a fatal protocol error) and dispatched in order: HELLO first, then PING,
 * EXEC (exec.c), the file requests (files.c) and the frames of live streams. Reading a
 * connection stops while one of its execs has more than STDINQ_HIGH of stdin queued
 * (exec.c) and while a fatal error is being flushed.
 *
 * Outbound: every frame is queued on its connection and written (writev) once per loop
 * iteration, never blocking. Above OUTQ_HIGH queued bytes the connection's exec pipes
 * stop being read (exec_pipes_set_paused) and its file jobs pause, until the queue is
 * below OUTQ_LOW. A fatal error (conn_fatal) sends ERROR on stream 0, stops reading and
 * closes once flushed. A closed connection kills its execs (DETACHED ones keep running,
 * orphaned) and drops its file streams.
 *
 * Memory: a connection is freed only at the end of a loop iteration (conn_free_graveyard).
 */
#ifndef DSEC_AGENT_CONN_H
#define DSEC_AGENT_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "loop.h"

/* Read size for exec pipes and connections: one pipe buffer's worth (Linux default). */
#define READ_CHUNK 65536

/* One queued buffer: an outbound frame (header + payload) or a piece of an exec's stdin. */
struct chunk {
	struct chunk *next;
	size_t len, off;
	unsigned char data[];
};

struct exec;
struct fop;

struct conn {
	struct watch w;
	unsigned id;
	int helloed;
	int closing;        /* fatal error sent: flush, then destroy */
	int dead;
	int out_paused;     /* exec pipes not read: outbound queue above OUTQ_HIGH */
	int stdin_over;     /* # execs whose stdin queue is above STDINQ_HIGH */
	int dirty;
	int processing;     /* inside conn_process (guards re-entry) */
	unsigned char *in;
	size_t in_len, in_cap;
	struct chunk *oq_head, *oq_tail;
	size_t oq_bytes;
	struct exec *execs; /* live exec streams (final frame not yet sent) */
	struct fop *fops;   /* live file streams */
	struct conn *next, *prev;
	struct conn *dirty_next;
	struct conn *grave_next;
};

/* Every live connection (newest first). */
extern struct conn *g_conns;

/* A frame with room for up to cap payload bytes at ch->data + HDR_LEN; queue it with
 * frame_queue() once the payload is in place. */
struct chunk *frame_alloc(unsigned type, uint32_t stream, size_t cap);
/* Queue a frame from frame_alloc() whose payload is plen bytes (<= its cap); takes it
 * (freed at once when c is NULL or dead). */
void frame_queue(struct conn *c, struct chunk *ch, size_t plen);
/* Queue one frame whose payload is (p1,n1) then (p2,n2); nothing when c is NULL or dead. */
void send_frame2(struct conn *c, unsigned type, uint32_t stream, const void *p1, size_t n1, const void *p2, size_t n2);
void send_frame(struct conn *c, unsigned type, uint32_t stream, const void *p, size_t n);
/* EXEC_ERROR or FILE_ERROR: u32 errno, then the message (n bytes). */
void send_errno_frame(struct conn *c, unsigned type, uint32_t stream, int err, const char *msg, size_t n);
/* ERROR on a stream (logged; at most 511 bytes of message). */
void send_error(struct conn *c, uint32_t stream, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A fatal protocol error: ERROR on stream 0, stop reading, close once it is flushed. */
void conn_fatal(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Free a queue of chunks. */
void chunks_free(struct chunk *ch);

/* Reading was paused for stdin backpressure and may resume now: re-arm EPOLLIN and
 * dispatch the frames already buffered (a no-op while closing, dead or still over). */
void conn_resume_input(struct conn *c);
/* A new stream (EXEC or a file request) must not reuse a live stream id: answers ERROR
 * and returns 1 if it does. */
int stream_in_use(struct conn *c, uint32_t stream);

/* Serve fd (a connected, non-blocking, close-on-exec stream socket) as a connection: an
 * accepted one, or a stream of the VM mux. 0, or -1 (fd closed, logged). */
int conn_adopt(int fd);
/* Watch the listening socket fd (--listen-fd). 0, or -1 with errno. */
int conn_listen(int fd);
/* The listening socket is readable: accept up to 64 connections. On EMFILE, ENFILE,
 * ENOBUFS or ENOMEM the listener pauses for ACCEPT_RETRY_MS (100 ms). */
void conn_accept(void);
/* Events of a connection's watch (W_CONN). */
void conn_on_event(struct conn *c, uint32_t ev);
/* When the paused listener is to resume (CLOCK_MONOTONIC ns), 0 when it is not paused. */
uint64_t listen_retry_at(void);
/* Resume the listener if its pause is over at `now`. */
void listen_retry_run(uint64_t now);
/* Write what every connection touched in this iteration has queued. */
void conn_flush_dirty(void);
/* Free the connections that died in this iteration. */
void conn_free_graveyard(void);

#endif
