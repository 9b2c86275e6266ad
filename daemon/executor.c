/*
 * executor.c - the device thread: inbox, batches, completions, teardown.
 * See executor.h.
 */
#include "executor.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dispatch.h"
#include "frame.h"
#include "gpucmd.h"
#include "log.h"
#include "module.h"
#include "memory/handle.h"
#include "memory/pinned.h"
#include "memory/shared_buffer.h"
#include "rounds.h"
#include "service.h"
#include "spin.h"
#include "streams.h"

struct executor {
	struct config cfg;
	struct executor_callbacks cb;
	struct driver *driver;
	struct command_ctx cmd;
	struct memory_configuration layout;
	pthread_t thread;

	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* Guarded by lock: work from the loop, completions from the backend. */
	struct batch *inbox_head;
	struct batch **inbox_tail;
	struct fence *done_head;
	struct fence **done_tail;
	bool stop;
	atomic_uint work; /* inbox, done or stop set (spin.h) */
	/* Startup handshake, guarded by lock. */
	bool started;
	int start_rc;
	char start_why[512];

	/* Device thread only. */
	struct stream_set *sets;
	struct executor_conn *closing; /* linked through next_closing */
	struct rounds rounds;	       /* services with batches waiting */
	uint64_t start_ms;

	uint64_t fences_out; /* enqueued, not completed */
	atomic_uint_fast64_t batches;
	bool lost; /* the device faulted for good */
};

static uint64_t monotonic_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A close request travels the inbox as a batch without a frame. */
static bool is_close(const struct batch *b)
{
	return b->frame == NULL;
}

static void push(struct batch ***tail, struct batch *b)
{
	b->next = NULL;
	**tail = b;
	*tail = &b->next;
}

/* ---- backend -------------------------------------------------------------- */

static int open_backend(struct executor *ex, char *why, size_t why_len)
{
	struct driver_options opt = {
		.device = ex->cfg.device,
		.device_id = ex->cfg.device_id,
		.host_memory = ex->cfg.host_memory,
		.host_fail_alloc_at = ex->cfg.host_fail_alloc_at,
		.spin_us = ex->cfg.spin_us,
		.stream_nice = ex->cfg.host_stream_nice,
		.test_compile_delay_ms = ex->cfg.test_compile_delay_ms,
	};
	char cuda_why[512] = "";
	int rc;

	if (ex->cfg.backend != CONFIG_BACKEND_HOST) {
		rc = driver_cuda_create(&opt, &ex->driver, cuda_why,
					sizeof(cuda_why));
		if (rc == 0) {
			rc = ex->driver->ops->open(ex->driver, opt.device,
						   &ex->driver->props);
			if (rc != 0) {
				snprintf(cuda_why, sizeof(cuda_why), "%s",
					 ex->driver->error);
				ex->driver->ops->close(ex->driver);
				ex->driver = NULL;
			}
		}
		if (rc == 0)
			return 0;
		if (ex->cfg.backend == CONFIG_BACKEND_CUDA) {
			snprintf(why, why_len,
				 "--backend cuda: no usable CUDA device: %s",
				 cuda_why);
			return rc;
		}
		/*
		 * An index past the last is refused by the host backend too;
		 * a GPU named by UUID or bus id must not become the CPU
		 * either (a GPU swapped, a typo): clients would get host
		 * memory where the operator chose a device.
		 */
		if (ex->cfg.device_id[0] != '\0') {
			snprintf(why, why_len,
				 "device %s names a GPU, and no CUDA device "
				 "is it (%s); the host backend serves none: "
				 "correct device (--device), or remove it to "
				 "serve the host backend",
				 ex->cfg.device_id, cuda_why);
			return GPUCMD_EINVAL;
		}
		log_notice("no usable CUDA device (%s); using the host backend",
			   cuda_why);
	} else if (ex->cfg.device_id[0] != '\0') {
		snprintf(why, why_len,
			 "device %s names a GPU, and backend host serves "
			 "none: remove device (--device), or choose backend "
			 "cuda or auto",
			 ex->cfg.device_id);
		return GPUCMD_EINVAL;
	}
	rc = driver_host_create(&opt, &ex->driver);
	if (rc == 0) {
		rc = ex->driver->ops->open(ex->driver, opt.device,
					   &ex->driver->props);
		if (rc != 0) {
			snprintf(why, why_len, "host backend: %s",
				 ex->driver->error);
			ex->driver->ops->close(ex->driver);
			ex->driver = NULL;
		}
	} else {
		snprintf(why, why_len, "host backend: %s", gpucmd_strerror(rc));
	}
	return rc;
}

/* ---- replies ------------------------------------------------------------- */

/*
 * Below this much inline read data a reply is packed flat: one buffer, one
 * write, and the copy is cheaper than the pieces' bookkeeping.
 */
#define REPLY_PIECES_MIN FRAME_PIECES_FLAT_MAX

struct reply_pieces {
	struct frame_pieces frame;
	struct command_ctx *ctx;  /* the pinned pool the reads came from */
	struct host_bytes *reads; /* the batch's, per op */
	size_t nreads;
};

const struct frame_pieces *reply_pieces_frame(const struct reply_pieces *rp)
{
	return &rp->frame;
}

void reply_pieces_free(struct reply_pieces *rp)
{
	if (rp == NULL)
		return;
	for (size_t i = 0; i < rp->nreads; i++)
		if (rp->reads[i].data != NULL)
			command_free_cpu(rp->ctx, &rp->reads[i]);
	free(rp->reads);
	frame_pieces_free(&rp->frame);
	free(rp);
}

/* Only read data lives on past the batch: nothing else is referenced. */
static bool read_may_ref(const uint8_t *data, size_t len, void *arg)
{
	const struct reply_pieces *rp = arg;

	for (size_t i = 0; i < rp->nreads; i++) {
		const uint8_t *d = rp->reads[i].data;

		if (d != NULL && data >= d && len <= rp->reads[i].len &&
		    (size_t)(data - d) <= rp->reads[i].len - len)
			return true;
	}
	return false;
}

/*
 * The response in pieces, taking the batch's read data over; NULL when the
 * reads are small or the pieces cannot be made (the flat path answers).
 */
static struct reply_pieces *encode_pieces(struct executor *ex, struct batch *b,
					  const Gpucmd__Frame *frame)
{
	struct reply_pieces *rp;

	if (b->reply_bytes < REPLY_PIECES_MIN || b->reads == NULL ||
	    b->nresults == 0)
		return NULL;
	rp = calloc(1, sizeof(*rp));
	if (rp == NULL)
		return NULL;
	rp->ctx = &ex->cmd;
	rp->reads = b->reads;
	rp->nreads = b->req->n_ops;
	rp->frame.may_ref = read_may_ref;
	rp->frame.may_ref_arg = rp;
	if (frame_pieces_encode(&rp->frame, frame) != 0) {
		frame_pieces_free(&rp->frame);
		free(rp);
		return NULL;
	}
	b->reads = NULL;
	return rp;
}

void reply_lost_message(const struct reply_lost *l, char *buf, size_t len)
{
	const char *what = "their results are lost";
	const char *redo = "repeat any read or report whose result you need "
			   "(a smaller one needs less of the daemon's memory) "
			   "once the host has memory again";
	unsigned long long id = (unsigned long long)l->id;

	if (l->error == 0)
		snprintf(buf, len,
			 "gpucmdd's host ran out of memory answering "
			 "request %llu: all %u of its ops ran, but %s; %s",
			 id, l->nops, what, redo);
	else if (l->ran == 0)
		snprintf(buf, len,
			 "gpucmdd's host ran out of memory answering "
			 "request %llu: none of its ops ran, it failed with %s "
			 "at op %u, and the reason is lost; send it again to "
			 "see why once the host has memory again",
			 id, gpucmd_errname(l->error), l->failed_index);
	else if (l->ran == l->nops)
		snprintf(buf, len,
			 "gpucmdd's host ran out of memory answering "
			 "request %llu: all %u of its ops ran, and it failed "
			 "with %s at op %u, but %s, and the reason with them; "
			 "%s",
			 id, l->nops, gpucmd_errname(l->error), l->failed_index,
			 what, redo);
	else
		snprintf(
			buf, len,
			"gpucmdd's host ran out of memory answering "
			"request %llu: the ops before op %u ran, then it "
			"failed with %s at op %u and the rest did not run, but "
			"%s, and the reason with them; %s",
			id, l->ran, gpucmd_errname(l->error), l->failed_index,
			what, redo);
}

/*
 * Hand the loop a response for b (buf, pieces or lost, or none of them)
 * and/or b's completion, which gives the batch's bytes back to its
 * connection's budget first: the outbox's lock publishes the count with
 * the message.
 */
static void post_reply(struct executor *ex, struct batch *b, uint8_t *buf,
		       size_t len, struct reply_pieces *pieces,
		       const struct reply_lost *lost, bool completed)
{
	if (completed) {
		atomic_fetch_add_explicit(&b->conn->bytes_done, b->cost,
					  memory_order_relaxed);
		atomic_fetch_add_explicit(&b->conn->service->bytes_done,
					  b->cost, memory_order_relaxed);
		b->cost = 0;
	}
	ex->cb.reply(b->conn->conn, buf, len, pieces, lost, completed,
		     ex->cb.arg);
}

/*
 * Answer b.  With device_done (every fence of the batch has passed) a reply
 * with large read data goes in pieces, taking the staging along; before
 * that, or when the batch's completion is unknown, the device may still
 * write into the staging, so the data is copied and the batch keeps it.
 */
static void send_reply(struct executor *ex, struct batch *b, bool completed,
		       bool device_done)
{
	Gpucmd__Frame frame = GPUCMD__FRAME__INIT;
	Gpucmd__Response resp = GPUCMD__RESPONSE__INIT;
	Gpucmd__Error err = GPUCMD__ERROR__INIT;
	struct reply_lost lost;
	struct reply_pieces *pieces;
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc;

	resp.id = b->req != NULL ? b->req->id : 0;
	resp.n_results = b->nresults;
	resp.results = b->result_ptrs;
	if (b->error != 0) {
		err.code = b->error;
		err.message = b->message;
		resp.error = &err;
		resp.failed_index = b->failed_index;
	}
	frame.msg_case = GPUCMD__FRAME__MSG_RESPONSE;
	frame.response = &resp;
	pieces = device_done ? encode_pieces(ex, b, &frame) : NULL;
	if (pieces != NULL) {
		b->replied = true;
		post_reply(ex, b, NULL, 0, pieces, NULL, completed);
		return;
	}
	rc = frame_encode_buf(&frame, &buf, &len);
	if (rc == 0) {
		b->replied = true;
		post_reply(ex, b, buf, len, NULL, NULL, completed);
		return;
	}
	lost.id = resp.id;
	lost.nops = b->req != NULL ? (uint32_t)b->req->n_ops : 0;
	lost.ran = (uint32_t)b->ran;
	lost.error = b->error;
	lost.failed_index = b->failed_index;
	/* A short error instead, which says why the results are not there. */
	if (rc == GPUCMD_ELIMIT) {
		/* Dispatch's reply_cap keeps this from happening. */
		snprintf(b->message, sizeof(b->message),
			 "the response is too large for one frame: the first "
			 "%u of the %u ops ran, but their results are lost; "
			 "read less per batch",
			 lost.ran, lost.nops);
		err.code = GPUCMD_ELIMIT;
		/* As for a lost response: what ran, not "refused". */
		resp.failed_index = lost.ran;
	} else {
		reply_lost_message(&lost, b->message, sizeof(b->message));
		err.code = GPUCMD_ENOMEM;
		resp.failed_index = lost.ran;
	}
	err.message = b->message;
	resp.error = &err;
	resp.n_results = 0;
	rc = frame_encode_buf(&frame, &buf, &len);
	b->replied = true;
	if (rc == 0) {
		post_reply(ex, b, buf, len, NULL, NULL, completed);
		return;
	}
	/*
	 * Not even that: the host is out of memory.  The loop answers for
	 * the request (or closes the connection), so that the client is not
	 * left waiting for it.
	 */
	log_err("connection %llu: cannot encode the response to request %llu "
		"(%s); the loop answers it",
		(unsigned long long)b->conn->id, (unsigned long long)resp.id,
		gpucmd_strerror(rc));
	post_reply(ex, b, NULL, 0, NULL, &lost, completed);
}

/* What the batch's load_module ops did not file in the cache. */
static void free_compiled(struct executor *ex, struct module_compiled *c,
			  size_t n)
{
	if (c == NULL)
		return;
	for (size_t i = 0; i < n; i++)
		module_compiled_release(ex->cmd.modules, &c[i]);
	free(c);
}

static void free_batch(struct executor *ex, struct batch *b)
{
	if (b->req != NULL)
		free_compiled(ex, b->compiled, b->req->n_ops);
	dispatch_batch_free(&ex->cmd, b);
	frame_free(b->frame);
	free(b);
}

/* ---- completions --------------------------------------------------------- */

/* One completion callback of a batch: the stream passed sequence seq. */
struct fence {
	struct batch *batch;
	struct stream *stream;
	uint64_t seq;
	uint64_t cursor; /* the stream's cursor when it was enqueued */
	bool barrier;	 /* right after the batch's first read/sync */
	int status;
	struct fence *next;
};

/* Backend thread: hand the fence back to the device thread. */
static void on_fence(void *arg, int status)
{
	struct fence *f = arg;
	struct executor *ex = f->batch->ex;

	pthread_mutex_lock(&ex->lock);
	f->status = status;
	f->next = NULL;
	*ex->done_tail = f;
	ex->done_tail = &f->next;
	atomic_store(&ex->work, 1);
	pthread_cond_signal(&ex->cond);
	pthread_mutex_unlock(&ex->lock);
}

static int enqueue_fence(struct executor *ex, struct batch *b, bool barrier)
{
	struct driver *d = ex->driver;
	struct fence *f;
	int rc;

	/*
	 * A held stream (run_batch: a completion could not be enqueued) has
	 * submitted at UINT64_MAX: a fence after it would wrap to 0 and move
	 * completed backwards, and every later fence would pass at once, so
	 * memory could be freed or reused under running work.  It tracks
	 * nothing more; its batches are held too.
	 */
	if (b->stream->submitted == UINT64_MAX) {
		snprintf(d->error, sizeof(d->error),
			 "stream %u is held: an earlier completion could not "
			 "be enqueued; reconnect to use a new stream",
			 b->stream->number);
		return GPUCMD_EDRIVER;
	}
	f = calloc(1, sizeof(*f));
	if (f == NULL)
		return GPUCMD_ENOMEM;
	f->batch = b;
	f->stream = b->stream;
	f->seq = b->stream->submitted + 1;
	f->cursor = b->stream->cursor;
	f->barrier = barrier;
	rc = d->ops->host_callback(d, b->stream->ds, on_fence, f);
	if (rc != 0) {
		free(f);
		return rc;
	}
	b->stream->submitted = f->seq;
	b->pending++;
	ex->fences_out++;
	return 0;
}

int executor_fence(struct executor *ex, struct batch *b)
{
	return enqueue_fence(ex, b, false);
}

void executor_barrier(struct executor *ex, struct batch *b)
{
	/*
	 * Without it the batch's last fence answers the read or sync, as
	 * it does when nothing that can fault follows them.
	 */
	if (enqueue_fence(ex, b, true) == 0)
		b->barrier = true;
}

/* Fill the profile results whose events have now completed. */
static void finish_profiles(struct executor *ex, struct batch *b)
{
	struct driver *d = ex->driver;

	for (struct profile_result *p = b->profiles; p != NULL; p = p->next) {
		Gpucmd__Profile *w = b->results[p->op].profile;
		float ms = 0;

		if (w == NULL)
			continue;
		/*
		 * Work that faulted between its begin and its end (the
		 * batch's fences have passed, and a stream's pass in order):
		 * as in the reference, whose surfaced errors mark every open
		 * profile, the time is not the work's.
		 */
		if (p->valid && p->stream->fault_seq != 0 &&
		    p->stream->fault_seq >= p->from_seq) {
			p->valid = false;
			snprintf(p->reason, sizeof(p->reason),
				 "work on stream %u faulted while the profile "
				 "was open",
				 p->stream->number);
		}
		w->valid = p->valid;
		if (p->valid &&
		    d->ops->event_elapsed(d, p->start, p->end, &ms) != 0) {
			w->valid = false;
			snprintf(p->reason, sizeof(p->reason),
				 "the device could not time the events: %s",
				 d->error);
		}
		w->device_ms = ms;
		w->reason = p->reason;
	}
}

/* See executor_conn.quiet. */
static bool conn_quiet(const struct executor *ex, const struct stream_set *set)
{
	if (ex->lost)
		return false;
	for (uint32_t i = 0; i < set->nstreams; i++) {
		const struct stream *s = set->slots[i];

		if (s->capturing || s->fault_pending ||
		    s->completed != s->submitted)
			return false;
	}
	return true;
}

/* Every op ran and every fence completed: answer and free. */
static void finish_batch(struct executor *ex, struct batch *b)
{
	/* Published by the reply's hand-over (the outbox lock). */
	atomic_store_explicit(&b->conn->quiet, conn_quiet(ex, b->conn->set),
			      memory_order_relaxed);
	if (!b->replied) {
		finish_profiles(ex, b);
		send_reply(ex, b, true, true);
	} else {
		post_reply(ex, b, NULL, 0, NULL, NULL, true);
	}
	streams_flush_drops(b->conn->set);
	free_batch(ex, b);
}

/*
 * The shares of b after op from, which the answer (a fault reported at
 * from) does not confirm, as "; handle 5, shared as 'w' at op 3, is lost:
 * ..." into buf.  Without this the client would not know that its names
 * are taken by buffers nobody may import.  Those the fault lost settled so
 * before (streams_fills_done: their copy came after the faulted work, in
 * the fence that reports it); those after a barrier fence are still
 * copying, and are lost too when their copy completes (unconfirmed): the
 * sharer was told the batch stopped at from, and a share it was not told
 * of must not be importable, whatever its bytes.
 */
static void lost_shares(const struct batch *b, size_t from, char *buf,
			size_t len)
{
	const struct stream_set *set = b->conn->set;
	size_t used = 0, left_out = 0;

	buf[0] = '\0';
	for (size_t i = from + 1; i < b->ran && i < b->req->n_ops; i++) {
		const Gpucmd__Op *op = b->req->ops[i];
		const struct handle *h;
		char one[256]; /* a name of SHARED_NAME_MAX fits */
		int n;

		if (op == NULL || op->op_case != GPUCMD__OP__OP_SHARE)
			continue;
		h = handle_table_find(set->handles, op->share->handle);
		/*
		 * Released since, in the batch: it goes by itself.  The id
		 * may name a buffer made after that release, shared at a
		 * later op under another name: that op names it, not this.
		 */
		if (h == NULL || h->shared == NULL ||
		    h->shared->state == SHARED_READY ||
		    op->share->name == NULL ||
		    strcmp(h->shared->name, op->share->name) != 0)
			continue;
		h->shared->unconfirmed = true;
		n = snprintf(
			one, sizeof(one),
			"; handle %llu, shared as '%s' at op %zu, is lost: "
			"release it and share it again",
			(unsigned long long)h->id, h->shared->name, i);
		/* Room for the count of those left out, should more come. */
		if (n < 0 || (size_t)n >= sizeof(one) ||
		    used + (size_t)n + 48 >= len) {
			left_out++;
			continue;
		}
		memcpy(buf + used, one, (size_t)n + 1);
		used += (size_t)n;
	}
	if (left_out > 0)
		snprintf(buf + used, len - used,
			 "; %zu more buffers this batch shared are lost too",
			 left_out);
}

/* A fault the stream had not reported yet goes to this batch's sync/read. */
static void report_fault(struct batch *b, struct stream *s)
{
	const struct driver_properties *p = &b->ex->driver->props;
	char lost[512];
	const char *what;

	if (b->replied || !s->fault_pending || b->error != 0 ||
	    b->fence_index < 0)
		return;
	switch (b->req->ops[b->fence_index]->op_case) {
	case GPUCMD__OP__OP_READ:
		what = "read";
		break;
	case GPUCMD__OP__OP_SHARE:
		/* streams_fills_done marked the shared buffer lost. */
		what = "share (the buffer it shared is lost: release it and "
		       "share again)";
		break;
	default:
		what = "sync";
		break;
	}
	b->error = GPUCMD_ESTREAM;
	b->failed_index = (uint32_t)b->fence_index;
	b->nresults = (size_t)b->fence_index;
	/*
	 * Where a fault is sticky (CUDA) nothing stays usable: the daemon
	 * is about to exit (device_lost), and a client told otherwise would
	 * retry on a connection that is going away.
	 */
	if (p->fault_is_fatal)
		snprintf(b->message, sizeof(b->message),
			 "stream fault: work on stream %u faulted before this "
			 "%s, and on the %s backend a fault loses the device "
			 "for every client: gpucmdd restarts with a fresh "
			 "context, and every buffer is gone; reconnect and "
			 "start over",
			 s->number, what, p->backend);
	else {
		lost_shares(b, (size_t)b->fence_index, lost, sizeof(lost));
		snprintf(b->message, sizeof(b->message),
			 "stream fault: work on stream %u faulted before this "
			 "%s; results since the previous sync are not valid, "
			 "the stream stays usable%s",
			 s->number, what, lost);
	}
	s->fault_pending = false;
}

/*
 * Ops that enqueue nothing on the device (no copy, kernel, memset or
 * event): a batch of only these, on a stream with nothing in flight, is
 * complete as soon as it ran, without a round through the driver.
 */
static bool light(const struct batch *b)
{
	for (size_t i = 0; i < b->req->n_ops; i++) {
		switch (b->req->ops[i]->op_case) {
		case GPUCMD__OP__OP_PING:
		case GPUCMD__OP__OP_SYNC:
		case GPUCMD__OP__OP_MEMORY_USAGE:
		case GPUCMD__OP__OP_MEMORY_REPORT:
		case GPUCMD__OP__OP_STATUS:
		case GPUCMD__OP__OP_STREAM_REPORT:
		case GPUCMD__OP__OP_CURSOR:
		case GPUCMD__OP__OP_FLUSH_DROPS:
		case GPUCMD__OP__OP_MEMORY_CLEANUP:
		case GPUCMD__OP__OP_ALLOCATION_MODE:
		case GPUCMD__OP__OP_RESERVE_CPU:
		case GPUCMD__OP__OP_RELEASE:
		case GPUCMD__OP__OP_CLEANUP:
			continue;
		default:
			return false;
		}
	}
	return true;
}

/*
 * A fault on a backend where it is sticky (CUDA): the context is gone for
 * every client, and the daemon must restart (the fatal callback).  s is
 * NULL for a batch on no stream (dispatch_needs_stream) whose driver call,
 * a module load, found the context faulted.
 */
static void device_lost(struct executor *ex, const struct batch *b,
			const struct stream *s)
{
	char why[256];

	if (!ex->driver->props.fault_is_fatal || ex->lost)
		return;
	ex->lost = true;
	if (s != NULL)
		snprintf(why, sizeof(why),
			 "a kernel of connection %llu (service %s) faulted on "
			 "stream %u and the %s device is lost for every client",
			 (unsigned long long)b->conn->id,
			 b->conn->service->name, s->number,
			 ex->driver->props.backend);
	else
		snprintf(why, sizeof(why),
			 "the %s context faulted (found by a batch of "
			 "connection %llu, service %s, on no stream) and the "
			 "device is lost for every client",
			 ex->driver->props.backend,
			 (unsigned long long)b->conn->id,
			 b->conn->service->name);
	ex->cb.fatal(why, ex->cb.arg);
}

static void complete_fence(struct executor *ex, struct fence *f)
{
	struct batch *b = f->batch;
	struct stream *s = f->stream;

	s->completed = f->seq;
	if (f->cursor > s->completed_cursor)
		s->completed_cursor = f->cursor;
	if (f->status != 0) {
		s->fault_pending = true;
		s->fault_seq = f->seq;
		device_lost(ex, b, s);
	}
	/* Before the fault is reported: it decides the shares' fate. */
	if (s->filling > 0)
		streams_fills_done(s, f->seq);
	/*
	 * The batch's read or sync is answered by the fault of the work
	 * before it, which its barrier covers (fences of a stream complete
	 * in order): a fault of later work stays pending for the next wait.
	 */
	if (f->barrier)
		report_fault(b, s);
	free(f);
	/*
	 * A held batch was answered as completed already (run_batch): an
	 * earlier fence of it passing must not answer, or free, it again.
	 */
	if (--b->pending > 0 || !b->dispatched || b->held)
		return;
	if (!b->barrier)
		report_fault(b, s);
	finish_batch(ex, b);
}

/* ---- running batches ----------------------------------------------------- */

static void link_set(struct executor *ex, struct stream_set *set)
{
	set->prev = NULL;
	set->next = ex->sets;
	if (ex->sets != NULL)
		ex->sets->prev = set;
	ex->sets = set;
}

static void unlink_set(struct executor *ex, struct stream_set *set)
{
	if (set->prev != NULL)
		set->prev->next = set->next;
	else
		ex->sets = set->next;
	if (set->next != NULL)
		set->next->prev = set->prev;
}

static void fail_whole(struct executor *ex, struct batch *b, int rc)
{
	b->error = rc;
	b->failed_index = 0;
	b->nresults = 0;
	send_reply(ex, b, true, false);
	free_batch(ex, b);
}

static void run_batch(struct executor *ex, struct batch *b)
{
	struct executor_conn *conn = b->conn;
	struct driver *d = ex->driver;
	int rc;

	if (conn->set == NULL) {
		rc = stream_set_create(d, conn->service, conn->id,
				       &conn->limits, &ex->layout, &conn->set);
		if (rc != 0) {
			snprintf(b->message, sizeof(b->message),
				 "cannot set up this connection's device "
				 "state: %s",
				 gpucmd_strerror(rc));
			fail_whole(ex, b, rc);
			return;
		}
		conn->set->module_cache = ex->cmd.modules;
		link_set(ex, conn->set);
	}
	atomic_fetch_add(&ex->batches, 1);
	conn->service->batches++;
	atomic_store_explicit(&conn->quiet, false, memory_order_relaxed);
	dispatch_batch(&ex->cmd, b);
	/*
	 * A driver call that found the context faulted (a sticky error,
	 * GPUCMD_ESTREAM at dispatch): no completion may ever come to say
	 * so (cuLaunchHostFunc's callbacks do not run after one).
	 */
	if (b->error == GPUCMD_ESTREAM)
		device_lost(ex, b, b->stream);
	if (b->stream == NULL) {
		/*
		 * Connection-wide ops (dispatch_needs_stream), or a stream
		 * that could not be had: nothing was enqueued, and the
		 * connection's streams are as the batch found them.
		 */
		atomic_store_explicit(&conn->quiet, conn_quiet(ex, conn->set),
				      memory_order_relaxed);
		send_reply(ex, b, true, false);
		free_batch(ex, b);
		return;
	}
	b->dispatched = true;
	/*
	 * The batch's last fence: not while the stream records a graph
	 * (nothing ran; a fence there would be recorded into the graph).
	 */
	if (b->pending == 0 && !b->stream->capturing && light(b) &&
	    b->stream->completed == b->stream->submitted) {
		/* Nothing in flight and nothing enqueued: done already. */
		b->stream->completed = ++b->stream->submitted;
		b->stream->completed_cursor = b->stream->cursor;
		report_fault(b, b->stream);
		finish_batch(ex, b);
		return;
	}
	if (!b->stream->capturing) {
		rc = executor_fence(ex, b);
		if (rc != 0) {
			/*
			 * Without a completion the daemon cannot know when
			 * the device is done with this batch's memory, so the
			 * batch (and the connection's device state) is kept
			 * for good.  A host out of memory gets here, and a
			 * context that faulted since the batch's last call
			 * (its own kernel may have run and faulted already:
			 * CUDA's errors are sticky, and the completion is
			 * refused with the fault's code): then the device is
			 * lost, and the batch says so.
			 */
			bool lost = rc == GPUCMD_ESTREAM;

			if (lost)
				device_lost(ex, b, b->stream);
			else
				log_err("connection %llu: cannot enqueue a "
					"completion on stream %u (%s); its "
					"memory stays held until restart",
					(unsigned long long)conn->id,
					b->stream->number, d->error);
			b->stream->held_after = b->stream->submitted;
			b->stream->submitted = UINT64_MAX;
			b->held = true;
			if (!b->replied && b->error == 0) {
				b->error =
					lost ? GPUCMD_ESTREAM : GPUCMD_EDRIVER;
				b->failed_index = 0;
				b->nresults = 0;
				snprintf(b->message, sizeof(b->message),
					 lost ? "stream fault: the device "
						"faulted while this batch was "
						"enqueued, and is lost for "
						"every client until gpucmdd "
						"restarts: %s" :
						"the daemon could not track "
						"this batch's completion: %s",
					 d->error);
			}
			send_reply(ex, b, true, false);
			return;
		}
	}
	/* The batch's work starts now, in one hand-over where the backend can. */
	if (d->ops->flush != NULL)
		d->ops->flush(d, b->stream->ds);
	if (b->pending == 0) {
		finish_batch(ex, b);
		return;
	}
	if (b->fence_index < 0 && b->profiles == NULL)
		send_reply(ex, b, false, false);
}

/* ---- closing connections ------------------------------------------------- */

static void begin_close(struct executor *ex, struct executor_conn *conn)
{
	if (conn->set != NULL)
		streams_closing(conn->set);
	conn->next_closing = ex->closing;
	ex->closing = conn;
}

static void finish_closing(struct executor *ex)
{
	struct executor_conn **pp = &ex->closing;

	while (*pp != NULL) {
		struct executor_conn *conn = *pp;

		/*
		 * Once the device is lost a held stream's work will never
		 * complete, and nothing may wait for it: the daemon is
		 * stopping, and must exit for a fresh context.
		 */
		if (conn->set != NULL &&
		    !(ex->lost ? streams_idle_lost(conn->set) :
				 streams_idle(conn->set))) {
			pp = &conn->next_closing;
			continue;
		}
		*pp = conn->next_closing;
		if (conn->set != NULL) {
			struct memory_usage u;

			/*
			 * Its memory stayed the service's until its queued work
			 * was done: say when it goes back.
			 */
			streams_usage(conn->set, &u);
			if (u.bytes_reserved > 0)
				log_info(
					"connection %llu (service %s) is gone "
					"and its queued work done: %llu bytes of "
					"device memory (%llu in use) go back",
					(unsigned long long)conn->id,
					conn->service->name,
					(unsigned long long)u.bytes_reserved,
					(unsigned long long)u.bytes_in_use);
			unlink_set(ex, conn->set);
			stream_set_destroy(conn->set);
			conn->set = NULL;
		}
		ex->cb.closed(conn->conn, ex->cb.arg);
	}
}

/* ---- fairness ------------------------------------------------------------- */

/*
 * Batches wait in a queue per service, across wake-ups, and the device
 * thread serves them in rounds (rounds.h): each round gives every service
 * with work up to its weight in batches, services that had none first, and
 * stops early to look at completions and new arrivals.  A connection's own
 * jobs keep their order (its close stays after its batches); a flooding
 * service cannot put another's batch behind its backlog.
 */
static void enqueue_job(struct executor *ex, struct batch *b)
{
	struct service *svc = b->conn->service;

	b->next = NULL;
	if (svc->queue_tail == NULL)
		svc->queue_tail = &svc->queue_head;
	*svc->queue_tail = b;
	svc->queue_tail = &b->next;
	if (b == svc->queue_head)
		rounds_add(&ex->rounds, svc);
}

static void run_job(struct executor *ex, struct batch *b)
{
	if (is_close(b)) {
		begin_close(ex, b->conn);
		free(b);
	} else {
		run_batch(ex, b);
	}
}

/* rounds_serve_fn: svc's next batch. */
static bool serve_next(void *arg, struct service *svc)
{
	struct batch *b = svc->queue_head;

	svc->queue_head = b->next;
	if (svc->queue_head == NULL)
		svc->queue_tail = &svc->queue_head;
	run_job(arg, b);
	return svc->queue_head != NULL;
}

/* ---- the thread ---------------------------------------------------------- */

static void *device_main(void *arg)
{
	struct executor *ex = arg;
	char why[512] = "";
	int rc;

	rc = open_backend(ex, why, sizeof(why));
	if (rc == 0) {
		char msg[256];

		ex->cmd.driver = ex->driver;
		ex->cmd.sets = &ex->sets;
		ex->cmd.props.max_page_size = ex->driver->props.max_page_size;
		ex->cmd.props.alignment = ex->driver->props.alignment;
		memset(&ex->layout, 0, sizeof(ex->layout));
		ex->layout.preset = strcmp(ex->cfg.layout, "exclusive") == 0 ?
					    MEMORY_PRESET_EXCLUSIVE_PAGES :
					    MEMORY_PRESET_SUBSLICES;
		rc = memory_configuration_resolve(&ex->layout, &ex->cmd.props,
						  msg, sizeof(msg));
		if (rc != 0)
			snprintf(why, sizeof(why), "memory layout: %s", msg);
		/* Without a pinned pool reserve_cpu still answers, from the heap. */
		if (rc == 0 &&
		    pinned_pool_create(ex->driver, ex->cfg.pinned_memory,
				       &ex->cmd.pinned) != 0)
			ex->cmd.pinned = NULL;
		if (rc == 0) {
			rc = module_cache_create(ex->driver, &ex->cmd.modules);
			if (rc != 0)
				snprintf(why, sizeof(why), "out of memory");
		}
	}
	pthread_mutex_lock(&ex->lock);
	ex->started = true;
	ex->start_rc = rc;
	snprintf(ex->start_why, sizeof(ex->start_why), "%s", why);
	pthread_cond_broadcast(&ex->cond);
	pthread_mutex_unlock(&ex->lock);
	if (rc != 0)
		return NULL;

	for (;;) {
		struct batch *jobs;
		struct fence *done;
		bool stop;

		/* Stay awake a while for the next batch or completion. */
		if (rounds_empty(&ex->rounds))
			spin_wait(&ex->work, spin_budget(ex->cfg.spin_us,
							 ex->fences_out != 0));
		pthread_mutex_lock(&ex->lock);
		while (!ex->stop && ex->inbox_head == NULL &&
		       ex->done_head == NULL && rounds_empty(&ex->rounds))
			pthread_cond_wait(&ex->cond, &ex->lock);
		atomic_store(&ex->work, 0);
		jobs = ex->inbox_head;
		done = ex->done_head;
		ex->inbox_head = NULL;
		ex->inbox_tail = &ex->inbox_head;
		ex->done_head = NULL;
		ex->done_tail = &ex->done_head;
		stop = ex->stop;
		pthread_mutex_unlock(&ex->lock);

		while (done != NULL) {
			struct fence *next = done->next;
			complete_fence(ex, done);
			ex->fences_out--;
			done = next;
		}
		while (jobs != NULL) {
			struct batch *next = jobs->next;
			enqueue_job(ex, jobs);
			jobs = next;
		}
		rounds_run(&ex->rounds, serve_next, ex, &ex->work);
		finish_closing(ex);
		if (stop && ex->sets == NULL && ex->closing == NULL &&
		    rounds_empty(&ex->rounds))
			break;
	}
	return NULL;
}

int executor_start(const struct config *cfg,
		   const struct executor_callbacks *cb, struct executor **out,
		   char *why, size_t why_len)
{
	struct executor *ex = calloc(1, sizeof(*ex));
	int rc;

	if (ex == NULL)
		return GPUCMD_ENOMEM;
	ex->cfg = *cfg;
	/* The service list belongs to the loop (reload frees it). */
	ex->cfg.services = NULL;
	ex->cfg.nservices = 0;
	ex->cb = *cb;
	ex->inbox_tail = &ex->inbox_head;
	ex->done_tail = &ex->done_head;
	rounds_init(&ex->rounds);
	atomic_init(&ex->batches, 0);
	atomic_init(&ex->work, 0);
	ex->start_ms = monotonic_ms();
	pthread_mutex_init(&ex->lock, NULL);
	pthread_cond_init(&ex->cond, NULL);
	rc = pthread_create(&ex->thread, NULL, device_main, ex);
	if (rc != 0) {
		snprintf(why, why_len, "cannot start the device thread: %s",
			 strerror(rc));
		free(ex);
		return -rc;
	}
	pthread_mutex_lock(&ex->lock);
	while (!ex->started)
		pthread_cond_wait(&ex->cond, &ex->lock);
	rc = ex->start_rc;
	snprintf(why, why_len, "%s", ex->start_why);
	pthread_mutex_unlock(&ex->lock);
	if (rc != 0) {
		pthread_join(ex->thread, NULL);
		pthread_mutex_destroy(&ex->lock);
		pthread_cond_destroy(&ex->cond);
		free(ex);
		return rc;
	}
	*out = ex;
	return 0;
}

void executor_stop(struct executor *ex)
{
	if (ex == NULL)
		return;
	pthread_mutex_lock(&ex->lock);
	ex->stop = true;
	atomic_store(&ex->work, 1);
	pthread_cond_signal(&ex->cond);
	pthread_mutex_unlock(&ex->lock);
	pthread_join(ex->thread, NULL);
	module_cache_destroy(ex->cmd.modules);
	pinned_pool_destroy(ex->cmd.pinned);
	if (ex->driver != NULL)
		ex->driver->ops->close(ex->driver);
	pthread_mutex_destroy(&ex->lock);
	pthread_cond_destroy(&ex->cond);
	free(ex);
}

const struct driver_properties *executor_properties(const struct executor *ex)
{
	return &ex->driver->props;
}

static int enqueue(struct executor *ex, struct batch *b)
{
	pthread_mutex_lock(&ex->lock);
	push(&ex->inbox_tail, b);
	atomic_store(&ex->work, 1);
	pthread_cond_signal(&ex->cond);
	pthread_mutex_unlock(&ex->lock);
	return 0;
}

int executor_submit(struct executor *ex, struct executor_conn *conn,
		    Gpucmd__Frame *frame, int *fds, size_t nfds,
		    struct module_compiled *compiled, uint64_t cost)
{
	struct batch *b = calloc(1, sizeof(*b));

	if (b == NULL) {
		for (size_t i = 0; i < nfds; i++)
			close(fds[i]);
		free(fds);
		free_compiled(ex, compiled, frame->request->n_ops);
		return GPUCMD_ENOMEM;
	}
	b->compiled = compiled;
	b->fds = fds;
	b->nfds = nfds;
	b->ex = ex;
	b->conn = conn;
	b->frame = frame;
	b->req = frame->request;
	b->fence_index = -1;
	b->cost = cost;
	return enqueue(ex, b);
}

int executor_conn_prepare(struct executor_conn *conn)
{
	if (conn->close_job == NULL)
		conn->close_job = calloc(1, sizeof(*conn->close_job));
	return conn->close_job != NULL ? 0 : GPUCMD_ENOMEM;
}

void executor_conn_unprepare(struct executor_conn *conn)
{
	free(conn->close_job);
	conn->close_job = NULL;
}

int executor_close(struct executor *ex, struct executor_conn *conn)
{
	struct batch *b = conn->close_job;

	/* Set aside at the start (executor_conn_prepare), if it was. */
	conn->close_job = NULL;
	if (b == NULL && (b = calloc(1, sizeof(*b))) == NULL)
		return GPUCMD_ENOMEM;
	b->ex = ex;
	b->conn = conn;
	return enqueue(ex, b);
}

void executor_release_compiled(struct executor *ex,
			       struct module_compiled *compiled, size_t n)
{
	free_compiled(ex, compiled, n);
}

struct module_cache *executor_modules(struct executor *ex)
{
	return ex->cmd.modules;
}

uint64_t executor_batches(const struct executor *ex)
{
	return atomic_load(&((struct executor *)ex)->batches);
}

struct stream_set *executor_sets(struct executor *ex)
{
	return ex->sets;
}

uint64_t executor_uptime_ms(const struct executor *ex)
{
	return monotonic_ms() - ex->start_ms;
}
