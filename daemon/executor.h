/*
 * executor.h - the device thread.
 *
 * The executor owns the driver and everything on the device: it is the
 * only thread that calls the backend.  The loop thread hands it work through
 * an inbox (batches to run, connections to close); backend threads hand it
 * completions (a batch's stream passed its end).  It hands results back to
 * the loop through the callbacks it was created with, which must be safe to
 * call from the device thread (the server queues them and wakes its loop).
 *
 * A batch runs all its ops in order, enqueueing work on its stream; then a
 * driver callback is enqueued after them.  A batch without read or sync is
 * answered at once; one with them is answered when that callback fires, so
 * no thread ever waits on the device.  Either way the loop learns when the
 * batch completed (the connection's in-flight count) and its request frame,
 * which holds the bytes of its writes, is freed only then.
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "driver/driver.h"
#include "gpucmd.pb-c.h"

struct executor;
struct module_cache;
struct module_compiled;
struct service;
struct stream_set;

/*
 * A response with large inline read data, in pieces: the header and the
 * small fields in a buffer of their own, the read data written (writev)
 * from the staging memory the device copied it into, instead of being
 * copied once more into a flat frame.  Whoever holds it frees it once it is
 * written or dropped, from any thread: that gives the staging back.
 */
struct reply_pieces;
struct frame_pieces;

const struct frame_pieces *reply_pieces_frame(const struct reply_pieces *rp);
void reply_pieces_free(struct reply_pieces *rp);

/*
 * A response the device thread could not encode, not even as a short error
 * (the host out of memory): what is known of its batch, posted in the
 * response's place.  The loop then answers the request itself with
 * GPUCMD_ENOMEM, saying which ops ran, or, when that cannot be encoded
 * either, closes the connection (session.c, answer_lost): a client never
 * waits for an answer that will not come.  No memory is needed to post it:
 * it travels inside the outbox message set aside at submit (server.c).
 */
struct reply_lost {
	uint64_t id;	       /* the request's */
	uint32_t nops;	       /* ops in the batch */
	uint32_t ran;	       /* of those, how many ran: 0 to nops */
	int error;	       /* the batch's own outcome: 0 or its code */
	uint32_t failed_index; /* with error: the op its response names */
};

/**
 * The sentence of the GPUCMD_ENOMEM response that answers for a lost one:
 * what ran, what failed, what to do (any thread).
 */
void reply_lost_message(const struct reply_lost *lost, char *buf, size_t len);

/* How the executor talks back to the loop (called on the device thread). */
struct executor_callbacks {
	/*
	 * A response for conn: a frame, flat (buf from frame_buf_alloc: free
	 * it with frame_buf_free) or in pieces (buf NULL, pieces set: free
	 * it with reply_pieces_free), whose ownership passes; or lost, with
	 * buf and pieces NULL, when the frame could not be made (the callee
	 * copies it).  And/or completed=true when one of conn's batches
	 * finished.  buf, pieces and lost are all NULL only for a
	 * completion alone: a response is never dropped on the way.
	 */
	void (*reply)(void *conn, uint8_t *buf, size_t len,
		      struct reply_pieces *pieces,
		      const struct reply_lost *lost, bool completed, void *arg);
	/* conn's device state is gone: the loop may free conn. */
	void (*closed)(void *conn, void *arg);
	/*
	 * The device is lost (a fault on a backend where faults are fatal):
	 * the daemon should stop and exit non-zero so it is restarted.
	 */
	void (*fatal)(const char *why, void *arg);
	void *arg;
};

/* Who sent a batch: the loop's connection and what the executor keeps. */
struct executor_conn {
	void *conn; /* the loop's session, opaque here */
	struct service *service;
	uint64_t id;
	bool admin;			    /* may see every service */
	struct config_limits limits;	    /* as they were at Hello */
	struct stream_set *set;		    /* device thread only */
	struct executor_conn *next_closing; /* device thread only */
	/*
	 * The job executor_close queues, set aside by executor_conn_prepare
	 * before the connection's first batch: a teardown that could not be
	 * queued for want of memory would leave the client hanging and its
	 * device memory held.
	 */
	struct batch *close_job;
	/*
	 * Written by the device thread before each batch's last reply: no
	 * stream of the connection records a graph, holds an unreported
	 * fault or has work in flight, and the device is not lost.  When the
	 * loop has no batch of the connection out (every last reply came
	 * back), that is the connection's state now, and a sync needs no trip
	 * through the device thread (session.c).
	 */
	atomic_bool quiet;
	/*
	 * The costs (executor_submit) of the connection's batches completed
	 * so far, added by the device thread before it posts each completion:
	 * the loop's byte budget (max_bytes_in_flight) is what it submitted
	 * less this.
	 */
	_Atomic uint64_t bytes_done;
};

/*
 * Start the device thread: open the backend cfg asks for and wait until it
 * answers.  0, or an error with a sentence in why.
 */
int executor_start(const struct config *cfg,
		   const struct executor_callbacks *cb, struct executor **out,
		   char *why, size_t why_len);
/** Stop the thread and close the device; every connection must be closed. */
void executor_stop(struct executor *ex);
/** The device's properties (fixed once started; any thread). */
const struct driver_properties *executor_properties(const struct executor *ex);
/**
 * Queue a decoded Request frame from conn with the descriptors that came
 * with it, and its load_module ops compiled already (one per op, or NULL;
 * module.h).  Ownership of frame, fds and compiled passes, also on
 * failure.  cost (the bytes the batch holds in the daemon) goes to
 * conn->bytes_done when the batch completes.
 */
int executor_submit(struct executor *ex, struct executor_conn *conn,
		    Gpucmd__Frame *frame, int *fds, size_t nfds,
		    struct module_compiled *compiled, uint64_t cost);
/** Any thread: free modules compiled for a request that was not submitted. */
void executor_release_compiled(struct executor *ex,
			       struct module_compiled *compiled, size_t n);
/** The daemon's module cache (module.h says which calls any thread may make). */
struct module_cache *executor_modules(struct executor *ex);
/**
 * Queue the end of conn: after its earlier batches, once its streams are
 * idle, its memory is freed and callbacks.closed(conn) runs.
 */
int executor_close(struct executor *ex, struct executor_conn *conn);
/**
 * Set aside what executor_close will need: before the connection is known
 * to the executor.  GPUCMD_ENOMEM when the host has no memory for it.
 * executor_conn_unprepare gives it back for a connection that never was.
 */
int executor_conn_prepare(struct executor_conn *conn);
void executor_conn_unprepare(struct executor_conn *conn);
/** Batches run since start (any thread). */
uint64_t executor_batches(const struct executor *ex);
/** Milliseconds since the executor started (any thread). */
uint64_t executor_uptime_ms(const struct executor *ex);
struct batch;
/**
 * Enqueue a completion fence for batch b on its stream (device thread):
 * b answers only once every fence it enqueued has completed.
 */
int executor_fence(struct executor *ex, struct batch *b);
/**
 * Enqueue a fence for batch b right after its first read or sync (device
 * thread), when work that may fault follows them in the batch: that
 * fence, not the batch's last, says whether the read or sync saw a fault.
 * Nothing changes when it cannot be enqueued.
 */
void executor_barrier(struct executor *ex, struct batch *b);
/** The live connections' device state, linked by next (device thread). */
struct stream_set *executor_sets(struct executor *ex);
