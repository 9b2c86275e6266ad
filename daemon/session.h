/*
 * session.h - one client connection, on the loop thread.
 *
 * A session reads frames off its socket (header first, length checked
 * against max_frame_bytes before a byte of body is allocated), runs the
 * Hello/Welcome handshake (which joins a service, or for an admin who asks
 * to observe, none: service.h), and hands each Request to the executor.  It
 * writes the responses the executor sends back, in whatever order they come
 * (clients match them by id).
 *
 * Limits: a session stops reading while max_in_flight of its batches are
 * not complete, or while its batches (or all its service's connections
 * together) hold max_bytes_in_flight (backpressure instead of an unbounded
 * queue), and is closed when more than max_pending_bytes of replies wait
 * for a client that does not read them.
 *
 * Teardown is two steps (house style): session_close marks the session dead
 * and stops reading; the executor then frees its device state and says so
 * (session_device_closed), and only the libuv close callback frees it.
 *
 * Thread: the loop thread only.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "executor.h"
#include "region.h"

struct server;
struct compile_job;
struct outbox_msg;

enum session_state {
	SESSION_HELLO,	 /* waiting for Hello */
	SESSION_READY,	 /* serving requests */
	SESSION_CLOSING, /* dead: waiting for the executor and libuv */
};

/* A reply's memory: a flat frame (frame_buf) or a reply in pieces. */
struct reply_owner {
	uint8_t *buf;
	struct reply_pieces *pieces;
};

/*
 * Replies from the executor queued by session_reply and written together
 * by session_flush: a pipelining client's answers that arrive in one
 * wake-up cost one write(2), not one each.  The arrays are kept.
 */
struct session_outq {
	uv_buf_t *bufs;
	unsigned nbufs;
	unsigned capbufs;
	size_t bytes;
	struct reply_owner *owners;
	unsigned nowners;
	unsigned capowners;
};

struct session {
	uv_pipe_t pipe;
	struct server *server;
	struct executor_conn econn;
	uint64_t id;
	uid_t uid;
	gid_t gid;
	pid_t pid;
	uint32_t *groups; /* primary and supplementary gids: */
	size_t ngroups;
	uint32_t groups_here[64]; /* groups points here, or to the heap */
	enum session_state state;
	bool reading;
	bool device_open;   /* the executor knows this session */
	bool handle_closed; /* uv_close was called */
	bool draining;	    /* shutdown: answer in-flight, then close */
	/*
	 * Writing the last replies or the refusal of a close: a write that
	 * fails then logs the close's reason, not the socket's error.
	 */
	bool close_flush;
	const char *close_why;

	/* Frame reassembly. */
	uint8_t *rbuf;
	size_t rpos; /* where the frames not yet handled start */
	size_t rlen;
	size_t rcap;
	uint8_t *body; /* a frame larger than rbuf */
	uint32_t body_len;
	uint32_t body_have;

	/*
	 * The stream numbers the device thread has created for this
	 * connection, mirrored by the same rule (first use, up to the limit),
	 * so the loop can answer pings on them without a trip there.
	 */
	uint32_t streams[64];
	uint32_t nstreams;
	uint32_t max_streams; /* 0 until the first request */
	uint32_t in_flight;
	uint64_t busy_since_ms; /* uv_now when in_flight last left 0 */
	/*
	 * request_cost of the batches submitted, ever; less the executor's
	 * econn.bytes_done, what is in flight against max_bytes_in_flight.
	 */
	uint64_t bytes_submitted;
	bool budget_wait; /* the next frame waits for that */
	/*
	 * On its service's budget_waiters, in turn: its next frame waits for
	 * the service's budget, or for those ahead of it.
	 */
	struct session *budget_next;
	struct session **budget_pprev; /* NULL: not on the list */
	/*
	 * The frame let in and not yet submitted or answered (a body being
	 * read, a request compiling): counted in its service's bytes_admitted.
	 */
	uint64_t admitted;
	/*
	 * A request whose modules compile on libuv's pool (module.h): the
	 * connection's later frames wait in rbuf until it is submitted.
	 */
	struct compile_job *compiling;
	/*
	 * Outbox messages set aside for the device thread's answers (server.c),
	 * guarded by the server's lock.
	 */
	struct outbox_msg *spare_msgs;
	uint32_t nspare_msgs;
	struct outbox_msg *close_msg;
	struct session_outq outq; /* replies not yet written */
	int fd;			  /* the socket, for session_read_direct */
	/*
	 * Descriptors that came with the bytes (SCM_RIGHTS), oldest first,
	 * whichever way the bytes were read: libuv's pending handles are
	 * moved here as they arrive, so region_attach ops take them in order.
	 */
	int fds[REGION_MAX_PER_CONNECTION];
	/*
	 * Where each came: the stream offsets [from, to) of the read that
	 * brought it.  The kernel ends a read with the message that carried
	 * descriptors, so they belong to a frame that starts in that range:
	 * a request takes only those, and ones left behind by earlier frames
	 * are a protocol error rather than another request's region.
	 */
	uint64_t fd_from[REGION_MAX_PER_CONNECTION];
	uint64_t fd_to[REGION_MAX_PER_CONNECTION];
	unsigned nfds;
	uint64_t rx_bytes;	/* read from the socket so far */
	uint64_t frame_at;	/* stream offset of the frame handled */
	uint64_t body_at;	/* ... of the frame s->body collects */
	uint64_t body_begun_ms; /* uv_now at its header */
	uint32_t body_ticked;	/* body_have at the last tick */
	/*
	 * Large frames wait for their turn (server_turn_wait): turn_wait, the
	 * next frame (in rbuf, or the whole of s->body) waits to be decoded;
	 * turn_granted, the turn came and the next large frame may go.
	 */
	bool turn_wait;
	bool turn_granted;
	bool turn_queued; /* on the server's queue of turns */
	/*
	 * The end of the stream (or a read error, read_end_why) came while a
	 * frame waited for its turn: the frames read before it are handled
	 * first, and the close comes where reading would resume.
	 */
	bool read_end;
	const char *read_end_why;
	/*
	 * A reply could not be written because the client closed (EPIPE,
	 * ECONNRESET): the requests it sent before still run, and their
	 * replies are dropped; the end of the stream closes (write_lost).
	 */
	bool replies_lost;
	/* Its replies in libuv's write queue, as counted in its service's. */
	uint64_t unwritten;
	uint64_t queued_total;	   /* bytes ever put in that queue */
	uint64_t written_ticked;   /* of those, written by the last tick */
	uint64_t unwritten_ticked; /* still queued at the last tick */
	struct session *turn_next;
	struct session *turn_prev;
	char peer[64];	      /* "pid 123 uid 1000" for logs */
	uint64_t accepted_ms; /* uv_now at accept: the Hello deadline */
	struct session *next;
	struct session *prev;
};

/*
 * A connection that has not sent its Hello this long after it was accepted
 * is refused (server.c's tick): an idle socket must not hold a place under
 * max_connections for ever.
 */
#define SESSION_HELLO_TIMEOUT_MS 10000
/*
 * The largest frame before the Hello is accepted: a Hello is a few hundred
 * bytes, and nobody known may make the daemon hold max_frame_bytes.
 */
#define SESSION_HELLO_MAX_BYTES 4096
/*
 * The least rate, in MiB a second, at which a large frame must arrive
 * beside [limits] frame_timeout (session_expire_frame).
 */
#define SESSION_FRAME_MIB_PER_S 8
/*
 * ...and an overdue frame is ended only once less than this came since the
 * tick before (two seconds) and nothing waits in the socket: a daemon slow
 * to read (a loaded machine, valgrind) is not the client's fault, but a
 * client that trickles a frame to keep its place in the budget is.
 */
#define SESSION_FRAME_MIN_PROGRESS (1u << 20)

/** Who is at the other end of s (SO_PEERCRED, groups): before session_start. */
void session_identify(struct session *s);
/** Start serving an accepted, identified client connection. */
int session_start(struct session *s);
/**
 * End the session: stop reading, tell the executor, close the socket once
 * it is done.  why is logged (NULL: the client left).
 */
void session_close(struct session *s, const char *why);
/**
 * Shutdown: stop reading, let the batches in flight finish and answer,
 * then close.
 */
void session_drain(struct session *s);
/**
 * A response (flat buf, or pieces; ownership passes; or lost, one that
 * could not be made, answered here) and/or a completion from the executor
 * arrived for s.  The response is queued: session_flush writes it.
 */
void session_reply(struct session *s, uint8_t *buf, size_t len,
		   struct reply_pieces *pieces, const struct reply_lost *lost,
		   bool completed);
/**
 * Read s's socket once without waiting (recvmsg, MSG_DONTWAIT) and handle
 * what came as libuv's read callback would: the loop's spin calls it for
 * the one connection that has been sending (server.c).  Returns 1 when
 * something happened (bytes, end of file, an error), 0 when nothing was
 * there, -1 when s is not being read now.
 */
int session_read_direct(struct session *s);
void session_take_turn(struct session *s);
/** Write the responses session_reply queued, together. */
void session_flush(struct session *s);
/**
 * Root, the daemon's own uid, and members of admin_group may see every
 * service and act on others.
 */
bool session_is_admin(const struct session *s);
/**
 * Close s, with the reason, when the frame larger than its read buffer that
 * it is sending has not arrived whole within [limits] frame_timeout seconds
 * plus one for each SESSION_FRAME_MIB_PER_S MiB of it, counted from its
 * header, less than SESSION_FRAME_MIN_PROGRESS of it came since the last
 * tick (server.c's tick, at now_ms) and none waits in the socket.  Such a frame holds its place in the
 * service's max_bytes_in_flight from its header on: a client announcing
 * large frames and sending nothing more would otherwise hold back the
 * service's other connections, and the memory, for as long as it liked.
 */
void session_expire_frame(struct session *s, uint64_t now_ms);
/**
 * At each tick: close s when its service's unread replies are over its
 * max_bytes_in_flight and s, with replies queued, read none of them since
 * the tick before (past twice the bound, over_byte_budget also holds the
 * service's requests back until its replies are read).
 */
void session_expire_unread(struct session *s);
/** The executor freed s's device state. */
void session_device_closed(struct session *s);
/**
 * Send a lone Error frame, then close the connection once it is written
 * (refusals, protocol errors).
 */
void session_refuse(struct session *s, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/** Log how many connection lines the rate limit left out (loop thread). */
void session_log_flush(void);
