/*
 * connection.h - one client connection to gpucmdd: the socket, the
 * Hello/Welcome handshake, frame I/O and the matching of responses to
 * requests.  The public half (gpucmd_connect, gpucmd_close, gpucmd_info) is
 * declared in gpucmd.h; this header is what the rest of the library uses.
 *
 * A connection belongs to the caller's thread and does blocking I/O on it.
 * Requests go out in submit order and are remembered in a slot until their
 * response is collected; responses come back in any order, and one that
 * arrives while the caller waits for another is kept in its slot until its
 * own wait.  Once the daemon closes the socket or sends an Error frame the
 * connection is dead: waits for responses that never came and every later
 * submit return that code (gpucmd_conn_error says it and why), while
 * responses that did arrive can still be collected.  Waits may have a
 * timeout (gpucmd_set_timeout, gpucmd_wait_timeout): -ETIMEDOUT.
 *
 * A request may carry descriptors (the memfds of its region_attach ops, in
 * op order): they go with SCM_RIGHTS in the sendmsg that starts the frame.
 * The connection also keeps the table of shared regions (regions.h) and
 * settles it when a response is collected: a region whose region_release
 * op ran leaves the table then.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpucmd.h"
#include "gpucmd.pb-c.h"

/**
 * Give req the next request id, send it with the nfds descriptors fds
 * (borrowed: they stay open here), and write the id to *id.  Fails with
 * GPUCMD_ELIMIT when max_in_flight requests are uncollected or the frame
 * is over max_frame_bytes, or with the code that killed the connection.
 */
int conn_submit(struct gpucmd_conn *conn, Gpucmd__Request *req, const int *fds,
		size_t nfds, uint64_t *id);

/**
 * Block until the response to request id is in, then hand over its frame
 * (free it with frame_free).  GPUCMD_EINVAL when id is not outstanding.
 * -ETIMEDOUT when timeout_ms (-1: none) passed first: id stays outstanding
 * and the connection usable (unless the daemon stopped mid-frame, which
 * kills it).
 */
int conn_wait(struct gpucmd_conn *conn, uint64_t id, int timeout_ms,
	      Gpucmd__Frame **out);
/**
 * Nobody will wait for request id any more (its wait timed out where the
 * caller cannot resume it, or it was detached): its response is dropped
 * when it comes, its region releases settled, and its slot freed then; a
 * detached one's failure is counted (gpucmd_detached_failures).
 */
void conn_abandon(struct gpucmd_conn *conn, uint64_t id, bool detached);
/** The connection's timeout for waits (gpucmd_set_timeout), -1: none. */
int conn_timeout(const struct gpucmd_conn *conn);
/**
 * code, after killing the connection when code is -ETIMEDOUT: for the
 * region and transfer calls, whose requests use this process's shared
 * memory and cannot be left running behind the caller's back.
 */
int conn_fail_timeout(struct gpucmd_conn *conn, int code);

/** The connection's table of shared regions. */
struct regions *conn_regions(struct gpucmd_conn *conn);
/** The connection's spare batches and op blocks (batch.h). */
struct batch_cache *conn_batch_cache(struct gpucmd_conn *conn);
/** Whether n more requests may be submitted now (max_in_flight). */
bool conn_has_room(const struct gpucmd_conn *c, size_t n);
/*
 * Whether every connection of the process is closed: a response freed then
 * gives the large-buffer pool back at once (gpucmd_response_free).
 */
bool conn_none_open(void);
/**
 * 0 when conn was opened by this process; else (a child of fork() that
 * inherited it) refuse with GPUCMD_EINVAL and a sentence that says what to
 * do.  Cheap unless sure: then getpid() is asked even when no fork was
 * seen (pthread_atfork misses _Fork and raw clones).
 */
int conn_check_process(struct gpucmd_conn *conn, bool sure);
/** Remember the daemon's message of a failure (gpucmd_last_message). */
void conn_set_message(struct gpucmd_conn *conn, const char *msg);
/** Refuse a call on this side: keep the sentence (printf), return code. */
int conn_refuse(struct gpucmd_conn *conn, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
