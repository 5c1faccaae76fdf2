/*
 * files: file operations inside the sandbox's mount namespace (docs/AGENT_PROTOCOL.md
 * "Files"): READ, WRITE, STAT, LIST, MKDIR, REMOVE, SYMLINK, each as a given user.
 *
 * Identity: around each step the agent switches its fsuid, fsgid, supplementary groups
 * and umask (0) to the user's (cred_enter) and always restores its own (cred_leave), so
 * permission checks are the user's; nothing of the user's identity outlives the step.
 * Paths are absolute and normalized ('..' refused); resolution refuses /proc magic links
 * (openat2 RESOLVE_NO_MAGICLINKS; without openat2, O_NOFOLLOW on the final component).
 * A WRITE that replaces goes to a temporary file in the same directory, renamed over the
 * target on FILE_DONE (atomic); one never committed leaves nothing behind.
 *
 * Streaming operations (READ and LIST to dsecd, WRITE from it) are file jobs that live on
 * their connection until their final frame; READ and LIST produce at most
 * FILE_STEP_BUDGET (1 MiB) per loop iteration and pause while their connection's
 * outbound queue is above its high-water mark, so execs stay responsive.
 */
#ifndef DSEC_AGENT_FILES_H
#define DSEC_AGENT_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "user.h"

enum fop_kind { FOP_READ = 1, FOP_WRITE, FOP_LIST };

/* A file operation that spans more than one loop iteration: a streaming read or list
 * (agent->client), or a write (client->agent). Lives on its connection's fops list until
 * its final frame. */
struct fop {
	struct conn *c;
	uint32_t stream;
	int kind;
	int fd;             /* READ: the file; LIST: the directory; WRITE: temp file or target */
	int dirfd;          /* WRITE: O_PATH fd of the target's directory */
	struct creds cr;
	char *path;         /* normalized path, for messages and logs */
	/* READ */
	uint64_t pos, remaining;
	/* LIST */
	unsigned char *dbuf;
	size_t dlen, doff;
	int eof;
	/* WRITE */
	char *name, *tmpname; /* tmpname NULL: writing the target in place (APPEND) */
	uint32_t mode;
	int excl;
	int preserve_owner;
	uint32_t owner_uid, owner_gid;
	uint64_t written, acked;
	struct fop *next, *prev;
};

/* At start: remember the agent's own fsuid, fsgid and groups (restored after every
 * step), and read the test hook DSEC_AGENT_NO_OPENAT2=1 (behave as before Linux 5.6). */
void files_init(void);
/* The live file stream of c with that id, or NULL. */
struct fop *conn_find_fop(struct conn *c, uint32_t stream);
/* A file request frame (FILE_READ ... FILE_SYMLINK) opening `stream`: parse, run as the
 * user, answer (FILE_INFO, FILE_ENTRY, FILE_ACK, FILE_DONE or FILE_ERROR), or start a job. */
void handle_file_request(struct conn *c, unsigned type, uint32_t stream, const unsigned char *p, size_t len);
/* FILE_DATA, FILE_DONE or FILE_ERROR from dsecd on the live file stream f. */
void handle_file_stream_frame(struct conn *c, struct fop *f, unsigned type, const unsigned char *p, size_t len);
/* Forget a file stream (after its final frame, or with its connection); an uncommitted
 * write's temporary file is removed. */
void fop_free(struct fop *f);
/* 1 when a READ or LIST job can produce output now (the loop must not sleep). */
int file_jobs_runnable(void);
/* Advance every READ and LIST job by one slice, on connections that take output. */
void run_file_jobs(void);

#endif
