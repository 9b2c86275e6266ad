/*
 * dispatch.h - from wire ops to Commands.
 *
 * dispatch_batch walks a decoded Request: for each op it checks the
 * arguments a client controls (sizes, bounds, handles, kernel signatures),
 * resolves the streams over the handles the op touches, builds a Command
 * and calls the method; its result goes into the batch's Response.  The
 * first op that fails stops the batch with its index and a sentence.
 *
 * Thread: the device thread only.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "command.h"
#include "gpucmd.pb-c.h"

struct builtin_kernel;
struct executor;
struct executor_conn;

/* One request being run, from decode to its completion callback. */
struct batch {
	struct executor *ex;
	struct executor_conn *conn;
	Gpucmd__Frame *frame; /* owns the request and its write data */
	Gpucmd__Request *req;
	struct stream *stream;
	uint32_t pending; /* fences enqueued, not yet completed */
	bool dispatched;  /* every op has run */
	bool held;	  /* no completion could be enqueued: kept for good */
	size_t nresults;  /* ops that ran */
	/*
	 * Ops dispatch ran, which a later error (a fault reported at the
	 * batch's read or sync, a completion that could not be enqueued)
	 * does not change, though it trims the results: what a response
	 * that was lost can still say (executor.h, reply_lost).
	 */
	size_t ran;
	Gpucmd__OpResult *results; /* one per op */
	Gpucmd__OpResult **result_ptrs;
	struct host_bytes *reads; /* per op; read data */
	void *arena;		  /* sub-messages of the results */
	int error;
	uint32_t failed_index;
	int fence_index; /* first read/sync op, -1 when none */
	bool barrier;	 /* a fence of its own follows that op */
	bool replied;
	char message[768];
	struct batch *next; /* executor inbox */
	struct profile_result
		*profiles; /* profile_end ops, filled at completion */
	const struct builtin_kernel *last_kernel; /* lookup cache of a batch */
	struct driver_function *last_fn;
	uint64_t reply_bytes; /* inline read data and reports so far */
	uint32_t reports;     /* report ops run (REPORTS_PER_BATCH_MAX) */
	uint64_t cost;	      /* executor_submit's, until completed */
	uint64_t replay_ops;  /* in its set's replay_ops until freed */
	int *fds;	      /* region descriptors sent with the frame */
	size_t nfds;
	size_t fds_used;
	/* Per op, or NULL: load_module ops compiled off this thread. */
	struct module_compiled *compiled;
};

/* A profile_end waiting for its events to complete. */
struct profile_result {
	size_t op;
	struct driver_event *start;
	struct driver_event *end;
	bool valid;
	char reason[128];
	/* Invalid too when a fence of stream from from_seq on faulted. */
	const struct stream *stream;
	uint64_t from_seq;
	struct profile_result *next;
};

/**
 * Whether req needs a stream of its own: false when every op is one that
 * concerns the connection, not a stream (ping, status, memory_report,
 * cleanup, region_attach, region_release, load_module; and evict, refused
 * when not alone).  Such a batch runs on no stream whatever number it
 * names, so it neither creates one nor counts against max_streams:
 * libgpucmd's status, report, cleanup and region calls name stream 0, and
 * an observer (which may send only such ops) never has a stream.  Pure;
 * any thread.
 */
bool dispatch_needs_stream(const Gpucmd__Request *req);
/** Run every op of b on its stream; fills b's results and error. */
void dispatch_batch(struct command_ctx *ctx, struct batch *b);
/** Free what dispatch allocated for b's results. */
void dispatch_batch_free(struct command_ctx *ctx, struct batch *b);
