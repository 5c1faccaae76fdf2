/*
 * proto: the wire format of the dsec agent protocol, version 1 (docs/AGENT_PROTOCOL.md):
 * the frame header, frame types, the TLV fields of EXEC and of the file requests, and the
 * reader of a TLV payload. Constants only, plus tlv_next; what each frame means is in
 * conn.c (dispatch), exec.c (exec streams) and files.c (file streams).
 */
#ifndef DSEC_AGENT_PROTO_H
#define DSEC_AGENT_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define AGENT_NAME "dsec-agent"
#define AGENT_VERSION "0.1.0"
#define PROTOCOL_VERSION 1u

/* Frame header: u32 BE length, u8 type, u8 flags, u16 reserved, u32 BE stream id. */
#define HDR_LEN 12
/* Largest payload either side may send; a larger header is a fatal protocol error. */
#define MAX_PAYLOAD (1u << 20)

enum frame_type {
	F_HELLO = 1,
	F_PING = 2,
	F_PONG = 3,
	F_EXEC = 4,
	F_STARTED = 5,
	F_STDOUT = 6,
	F_STDERR = 7,
	F_STDIN = 8,
	F_STDIN_EOF = 9,
	F_SIGNAL = 10,
	F_EXIT = 11,
	F_EXEC_ERROR = 12,
	F_ERROR = 13,
	F_RESIZE = 14,
	F_FILE_READ = 15,
	F_FILE_INFO = 16,
	F_FILE_DATA = 17,
	F_FILE_DONE = 18,
	F_FILE_WRITE = 19,
	F_FILE_ERROR = 20,
	F_FILE_ACK = 21,
	F_FILE_STAT = 22,
	F_FILE_LIST = 23,
	F_FILE_ENTRY = 24,
	F_FILE_MKDIR = 25,
	F_FILE_REMOVE = 26,
	F_FILE_SYMLINK = 27,
};

enum exec_tag {
	T_ARGV = 1,
	T_ENV = 2,
	T_CWD = 3,
	T_USER = 4,
	T_TIMEOUT_MS = 5,
	T_STDIN = 6,
	T_TTY = 7,
	T_DETACHED = 8,
	T_ISOLATE = 9,
	T_SCRATCH = 10,
};

/* TLV tags of the file requests (FILE_READ, FILE_WRITE, FILE_STAT, ...). */
enum file_tag {
	FT_PATH = 1,
	FT_USER = 2,
	FT_OFFSET = 3,
	FT_LENGTH = 4,
	FT_MODE = 5,
	FT_FLAGS = 6,
	FT_NOFOLLOW = 7,
	FT_RECURSIVE = 9,
	FT_TARGET = 10,
};

/* FLAGS of FILE_WRITE (all four) and FILE_MKDIR (WF_PARENTS only). */
enum write_flag {
	WF_CREATE = 1,
	WF_APPEND = 2,
	WF_EXCL = 4,
	WF_PARENTS = 8,
};
#define WF_ALL (WF_CREATE | WF_APPEND | WF_EXCL | WF_PARENTS)

/* One field of a TLV payload (EXEC and file requests): u8 tag, u32 BE length, value. */
struct tlv {
	unsigned tag;
	uint32_t len;
	const unsigned char *v;
};

enum tlv_result { TLV_END = 0, TLV_FIELD, TLV_TRUNCATED, TLV_OVERRUN };

/* Read the field at *off of the payload p (len bytes) and advance *off past it. Returns
 * TLV_FIELD, TLV_END after the last field, TLV_TRUNCATED for a partial field header
 * (*off unchanged) or TLV_OVERRUN when the value runs past the payload (t->tag is set). */
static inline enum tlv_result tlv_next(const unsigned char *p, size_t len, size_t *off, struct tlv *t)
{
	if (*off >= len)
		return TLV_END;
	if (len - *off < 5)
		return TLV_TRUNCATED;
	t->tag = p[*off];
	t->len = get_u32(p + *off + 1);
	if (t->len > len - *off - 5)
		return TLV_OVERRUN;
	t->v = p + *off + 5;
	*off += 5 + (size_t)t->len;
	return TLV_FIELD;
}

#endif
