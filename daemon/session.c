/*
 * session.c - one client connection: framing, handshake, requests, replies.
 * See session.h.
 */
#include "session.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dispatch.h"
#include "frame.h"
#include "gpucmd.h"
#include "log.h"
#include "module.h"
#include "module_image.h"
#include "region.h"
#include "server.h"
#include "service.h"
#include "spin.h"

/* Small frames are read many at a time into this buffer. */
#define SESSION_RBUF 65536
/*
 * A frame body larger than this waits for its turn to be decoded
 * (server_turn_wait); smaller ones are handled as they are read.  A batch
 * of about 50 kernel launches: a few microseconds of decoding.
 */
#define SESSION_TURN_BYTES 4096u
/* While a frame waits for its turn, reading stops with less room left. */
#define SESSION_TURN_ROOM 4096u
/* Requests this large are counted before they are decoded. */
#define SESSION_COUNT_FIRST (256u << 10)
/* Past this many arguments a kernel op is refused undecoded (32 run). */
#define SESSION_MAX_KERNEL_ARGS 64
/*
 * What decoding a counted frame may take beyond its own bytes, for each op
 * max_ops_per_batch allows: a kernel op of 32 arguments takes about 2 KiB
 * of structs.  Past it (frame_decoded_bound: fields the daemon does not
 * know, kept with a copy each, or millions of repeated entries), the frame
 * is refused undecoded instead of taking gigabytes, and the loop seconds,
 * to decode.
 */
#define SESSION_DECODE_PER_OP 4096u

/* A write libuv finishes later, and the replies whose bytes it holds. */
struct write_req {
	uv_write_t req;
	struct session *s;
	uint64_t pieces_bytes; /* counted in server.pieces_queued */
	unsigned nowners;
	struct reply_owner owners[];
};

/*
 * The lines of connections coming and going (joined, left, closed, and
 * why), which a client can cause at will: at most 200 in 10 s (log.h).
 * The loop thread's only.
 */
static struct log_limit conn_lines =
	LOG_LIMIT_INIT("connection lines (joined, left, closed)", 10, 200);

void session_log_flush(void)
{
	log_limit_flush(&conn_lines);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void parse_frames(struct session *s);

static void stop_reading(struct session *s)
{
	if (s->reading) {
		uv_read_stop((uv_stream_t *)&s->pipe);
		s->reading = false;
	}
}

/* ---- writing ------------------------------------------------------------- */

static void drop_replies(const struct reply_owner *o, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		frame_buf_free(o[i].buf);
		reply_pieces_free(o[i].pieces);
	}
}

/* Why to log a failed write: the reason of the close it was part of. */
static const char *write_failed(const struct session *s, int rc)
{
	return s->close_flush ? s->close_why : uv_strerror(rc);
}

/*
 * Whether the client can send no more: it closed, or shut down its
 * writing side, so that reading on reaches the end of the stream.  A
 * client that shut down only its reading side (shutdown(SHUT_RD)) still
 * can.
 */
static bool peer_sends_no_more(struct session *s)
{
	uv_os_fd_t fd;
	struct pollfd p = { .events = POLLRDHUP };

	if (uv_fileno((uv_handle_t *)&s->pipe, &fd) != 0)
		return true;
	p.fd = fd;
	return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP));
}

/*
 * Whether the client can still read what we write: it did not close, nor
 * shut down its reading side.  A client that shut down only its writing
 * side (shutdown(SHUT_WR)) can, and waits for its replies.
 */
static bool peer_reads_on(struct session *s)
{
	uv_os_fd_t fd;
	struct pollfd p = { .events = POLLOUT };

	if (uv_fileno((uv_handle_t *)&s->pipe, &fd) != 0)
		return false;
	p.fd = fd;
	return poll(&p, 1, 0) >= 0 && !(p.revents & (POLLHUP | POLLERR));
}

/*
 * Writing a reply failed with rc.  A client that closed its end (EPIPE,
 * ECONNRESET) may have sent requests that are not handled yet: they wait
 * in rbuf or the socket for max_in_flight, a byte budget or their turn.
 * Like the end of the stream read while a frame waits (read_end), that
 * does not drop them: they still run, in order, their replies (nobody
 * can read them) are dropped, and reading on reaches the end of the
 * stream, which closes.
 *
 * A client that shut down only its reading side would never reach that
 * end: it could go on sending work whose replies nobody holds, past every
 * bound that unread replies set.  It is closed at once, as is one on any
 * other failure, or on one while closing.  (The kernel marks a closing
 * peer dead a moment before it marks this end shut; a write in between
 * closes too, and a client that was going anyway loses only requests
 * that had not run.)
 */
static void write_lost(struct session *s, int rc)
{
	if ((rc == UV_EPIPE || rc == UV_ECONNRESET) && !s->close_flush &&
	    s->state == SESSION_READY) {
		if (s->replies_lost)
			return;
		if (!peer_sends_no_more(s)) {
			session_close(s, "the client shut down its reading "
					 "side but still sends: its replies "
					 "cannot be delivered");
			return;
		}
		log_debug("connection %llu (%s): %s writing a reply; the "
			  "requests it sent still run",
			  (unsigned long long)s->id, s->peer, uv_strerror(rc));
		s->replies_lost = true;
		return;
	}
	session_close(s, write_failed(s, rc));
}

/*
 * Bring what s's service counts of its unwritten replies up to libuv's
 * write queue (0 once the handle is closed).
 */
static void note_unwritten(struct session *s)
{
	struct service *svc = s->econn.service;
	uint64_t now =
		s->handle_closed || s->state == SESSION_CLOSING ?
			0 :
			uv_stream_get_write_queue_size((uv_stream_t *)&s->pipe);

	if (svc != NULL)
		svc->bytes_unwritten =
			svc->bytes_unwritten - s->unwritten + now;
	s->unwritten = now;
}

static void wake_budget_waiters(struct service *svc);
static bool over_unwritten(const struct session *s, unsigned times);

static void on_write(uv_write_t *req, int status)
{
	struct write_req *w = (struct write_req *)req;
	struct session *s = w->s;
	struct service *svc = s->econn.service;

	note_unwritten(s);
	s->server->pieces_queued -= w->pieces_bytes;
	drop_replies(w->owners, w->nowners);
	free(w);
	if (status < 0 && status != UV_ECANCELED && s->state != SESSION_CLOSING)
		write_lost(s, status);
	/* Unread replies held the service's requests back: room again. */
	if (svc != NULL && svc->budget_waiters != NULL && !over_unwritten(s, 2))
		wake_budget_waiters(svc);
}

/* Bytes of read staging the replies in pieces among owners hold. */
static uint64_t pieces_bytes(const struct reply_owner *owners, unsigned n)
{
	uint64_t sum = 0;

	for (unsigned i = 0; i < n; i++)
		if (owners[i].pieces != NULL)
			sum += reply_pieces_frame(owners[i].pieces)->total;
	return sum;
}

/*
 * The n bufs (len bytes in all) copied into one flat buffer: the replies
 * waiting in them no longer hold read staging.  NULL without memory.
 */
static uint8_t *flatten(const uv_buf_t *bufs, unsigned n, size_t len)
{
	uint8_t *flat = frame_buf_alloc(len), *at = flat;

	for (unsigned i = 0; flat != NULL && i < n; i++) {
		memcpy(at, bufs[i].base, bufs[i].len);
		at += bufs[i].len;
	}
	return flat;
}

/*
 * Whether the replies s's service's clients have not read take it over
 * times its max_bytes_in_flight: replies are bytes the daemon holds for
 * the service as much as requests are, and without this, connections each
 * under max_pending_bytes could make it hold that many times the service's
 * bound.
 */
static bool over_unwritten(const struct session *s, unsigned times)
{
	const struct service *svc = s->econn.service;
	uint64_t limit;

	if (svc == NULL)
		return false;
	limit = atomic_load_explicit(&svc->max_bytes_in_flight,
				     memory_order_relaxed);
	return limit != 0 && svc->bytes_unwritten / times > limit;
}

/*
 * Queue the n bufs of whole frames (total bytes) for the client; the
 * nowners replies hold their bytes, and their ownership passes.
 */
static void send_bufs(struct session *s, uv_buf_t *bufs, unsigned n,
		      size_t total, const struct reply_owner *owners,
		      unsigned nowners)
{
	struct server *srv = s->server;
	struct reply_owner one;
	struct write_req *w;
	uv_buf_t flat_buf;
	size_t queued_before, sent;
	uint64_t held;
	uint8_t *flat;
	int rc;

	if (s->handle_closed || s->replies_lost) {
		drop_replies(owners, nowners);
		return;
	}
	/*
	 * Nothing queued: write now.  A reply the socket takes whole costs one
	 * write(2); through uv_write it would also cost a request and, when
	 * libuv drains it, an epoll_ctl (a tenth of a ping's round trip).
	 * uv_try_write refuses while anything is queued, so order is kept.
	 */
	rc = uv_try_write((uv_stream_t *)&s->pipe, bufs, n);
	if (rc >= 0 && (size_t)rc == total) {
		drop_replies(owners, nowners);
		return;
	}
	if (rc < 0 && rc != UV_EAGAIN) {
		drop_replies(owners, nowners);
		write_lost(s, rc);
		return;
	}
	/* The rest goes through uv_write (which copies the bufs array). */
	sent = rc > 0 ? (size_t)rc : 0;
	total -= sent;
	for (; sent >= bufs->len; n--, bufs++)
		sent -= bufs->len;
	bufs->base += sent;
	bufs->len -= sent;
	held = pieces_bytes(owners, nowners);
	if (held > 0 && srv->pieces_cap > 0 &&
	    srv->pieces_queued + held > srv->pieces_cap &&
	    (flat = flatten(bufs, n, total)) != NULL) {
		/* The client reads slowly and the staging is wanted. */
		drop_replies(owners, nowners);
		one = (struct reply_owner){ flat, NULL };
		owners = &one;
		nowners = 1;
		bufs = &flat_buf;
		*bufs = uv_buf_init((char *)flat, (unsigned int)total);
		n = 1;
		held = 0;
	}
	w = malloc(sizeof(*w) + nowners * sizeof(w->owners[0]));
	if (w == NULL) {
		drop_replies(owners, nowners);
		session_close(s, "out of memory queueing a reply");
		return;
	}
	w->s = s;
	w->pieces_bytes = held;
	w->nowners = nowners;
	memcpy(w->owners, owners, nowners * sizeof(w->owners[0]));
	queued_before = uv_stream_get_write_queue_size((uv_stream_t *)&s->pipe);
	rc = uv_write(&w->req, (uv_stream_t *)&s->pipe, bufs, n, on_write);
	if (rc != 0) {
		drop_replies(w->owners, w->nowners);
		free(w);
		write_lost(s, rc);
		return;
	}
	srv->pieces_queued += held;
	s->queued_total += total;
	note_unwritten(s);
	/*
	 * A client that does not read: bytes were still waiting for it when
	 * this reply came, and now more than the limit wait.  One large reply
	 * to a client that reads is never cut off.
	 */
	if (queued_before > 0 &&
	    uv_stream_get_write_queue_size((uv_stream_t *)&s->pipe) >
		    s->server->cfg.limits.max_pending_bytes &&
	    s->state != SESSION_CLOSING) {
		char why[160];

		snprintf(why, sizeof(why),
			 "the client does not read its replies: %llu bytes "
			 "queued, over max_pending_bytes %llu",
			 (unsigned long long)uv_stream_get_write_queue_size(
				 (uv_stream_t *)&s->pipe),
			 (unsigned long long)
				 s->server->cfg.limits.max_pending_bytes);
		session_close(s, why);
	}
	/*
	 * Past the service's bound on unread replies, its connections take
	 * no new request while those replies are over twice it
	 * (over_byte_budget), and one that reads none of them for a tick is
	 * closed (session_expire_unread): a client that pipelines reads and
	 * reads their replies as they come is held back, not cut off.
	 */
}

/* Queue buf, a whole frame of len bytes (ownership passes). */
static void send_buf(struct session *s, uint8_t *buf, size_t len)
{
	uv_buf_t b = uv_buf_init((char *)buf, (unsigned int)len);
	struct reply_owner o = { buf, NULL };

	/* After the executor's replies queued before it. */
	session_flush(s);
	send_bufs(s, &b, 1, len, &o, 1);
}

/*
 * Replies queued for one write: this many bufs at most (writev takes
 * IOV_MAX, 1024), and once this many bytes wait they are written.
 */
#define OUTQ_MAX_BUFS 256
#define OUTQ_FLUSH_BYTES (256u << 10)
/* Arrays grown past this (one huge reply) are freed after the write. */
#define OUTQ_KEEP_BUFS 1024

static bool outq_room(struct session_outq *q, unsigned bufs)
{
	if (q->nbufs + bufs > q->capbufs) {
		unsigned cap = q->capbufs ? q->capbufs : 16;
		uv_buf_t *v;

		while (cap < q->nbufs + bufs)
			cap *= 2;
		v = realloc(q->bufs, cap * sizeof(*v));
		if (v == NULL)
			return false;
		q->bufs = v;
		q->capbufs = cap;
	}
	if (q->nowners == q->capowners) {
		unsigned cap = q->capowners ? 2 * q->capowners : 8;
		struct reply_owner *o = realloc(q->owners, cap * sizeof(*o));

		if (o == NULL)
			return false;
		q->owners = o;
		q->capowners = cap;
	}
	return true;
}

/* Queue a flat frame or a reply in pieces (ownership passes). */
static void queue_reply(struct session *s, uint8_t *buf, size_t len,
			struct reply_pieces *pieces)
{
	struct session_outq *q = &s->outq;
	const struct frame_pieces *fp =
		pieces != NULL ? reply_pieces_frame(pieces) : NULL;
	unsigned n = fp != NULL ? (unsigned)fp->n : 1;

	if (q->nbufs > 0 &&
	    (q->nbufs + n > OUTQ_MAX_BUFS || q->bytes >= OUTQ_FLUSH_BYTES))
		session_flush(s);
	if (!outq_room(q, n)) {
		struct reply_owner o = { buf, pieces };

		drop_replies(&o, 1);
		session_close(s, "out of memory queueing a reply");
		return;
	}
	if (fp == NULL) {
		q->bufs[q->nbufs++] = uv_buf_init((char *)buf, (unsigned)len);
		q->bytes += len;
	} else {
		for (size_t i = 0; i < fp->n; i++)
			q->bufs[q->nbufs++] =
				uv_buf_init((char *)frame_piece_data(fp, i),
					    (unsigned int)fp->v[i].len);
		q->bytes += fp->total;
	}
	q->owners[q->nowners++] = (struct reply_owner){ buf, pieces };
}

void session_flush(struct session *s)
{
	struct session_outq *q = &s->outq;
	unsigned nbufs = q->nbufs, nowners = q->nowners;
	size_t bytes = q->bytes;

	if (nowners == 0)
		return;
	/* Emptied first: send_bufs may close the session, which flushes. */
	q->nbufs = 0;
	q->nowners = 0;
	q->bytes = 0;
	if (s->state == SESSION_CLOSING)
		drop_replies(q->owners, nowners);
	else
		send_bufs(s, q->bufs, nbufs, bytes, q->owners, nowners);
	/* A reply of many thousand pieces does not size the arrays for good. */
	if (q->capbufs > OUTQ_KEEP_BUFS) {
		free(q->bufs);
		q->bufs = NULL;
		q->capbufs = 0;
	}
	if (q->capowners > OUTQ_KEEP_BUFS) {
		free(q->owners);
		q->owners = NULL;
		q->capowners = 0;
	}
}

/*
 * The response to request lost->id could not be made (the host out of
 * memory: executor.h, reply_lost), by the device thread or by the loop.
 * Try once more, with a short GPUCMD_ENOMEM that says what ran; failing
 * that, the client must not wait for ever for the answer: the connection
 * closes, and the client reads the end of the stream.  Written at once,
 * after the replies queued before it: this may come outside a wake-up,
 * and nothing else would flush it then.
 */
static void answer_lost(struct session *s, const struct reply_lost *lost)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Response r = GPUCMD__RESPONSE__INIT;
	Gpucmd__Error e = GPUCMD__ERROR__INIT;
	char msg[512];
	uint8_t *buf;
	size_t len;

	reply_lost_message(lost, msg, sizeof(msg));
	e.code = GPUCMD_ENOMEM;
	e.message = msg;
	r.id = lost->id;
	r.error = &e;
	/* The ops before it ran; it and those after did not. */
	r.failed_index = lost->ran;
	f.msg_case = GPUCMD__FRAME__MSG_RESPONSE;
	f.response = &r;
	if (frame_encode_buf(&f, &buf, &len) != 0) {
		snprintf(msg, sizeof(msg),
			 "the host is out of memory: the response to request "
			 "%llu could not be made, not even as an error, and "
			 "the client is not left waiting for it",
			 (unsigned long long)lost->id);
		session_close(s, msg);
		return;
	}
	send_buf(s, buf, len);
}

static void send_frame(struct session *s, const Gpucmd__Frame *f)
{
	uint8_t *buf;
	size_t len;

	if (frame_encode_buf(f, &buf, &len) == 0) {
		send_buf(s, buf, len);
	} else if (f->msg_case == GPUCMD__FRAME__MSG_RESPONSE) {
		/* The loop's own answers: every result is of an op that ran. */
		const Gpucmd__Response *r = f->response;
		struct reply_lost lost = {
			.id = r->id,
			.nops = (uint32_t)r->n_results,
			.ran = (uint32_t)r->n_results,
			.error = r->error != NULL ? r->error->code : 0,
			.failed_index = r->failed_index,
		};

		answer_lost(s, &lost);
	} else {
		session_close(s, "cannot encode a frame");
	}
}

static void send_error(struct session *s, int code, const char *msg)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Error e = GPUCMD__ERROR__INIT;

	e.code = code;
	e.message = (char *)msg;
	f.msg_case = GPUCMD__FRAME__MSG_ERROR;
	f.error = &e;
	send_frame(s, &f);
}

/* ---- teardown ------------------------------------------------------------ */

static void on_closed(uv_handle_t *h)
{
	struct session *s = h->data;

	server_session_gone(s->server, s);
	note_unwritten(s);
	/* Its connection is gone from the device thread too (maybe_free). */
	if (s->econn.service != NULL && !s->econn.service->observer)
		service_leave(s->econn.service);
	for (unsigned i = 0; i < s->nfds; i++)
		close(s->fds[i]);
	drop_replies(s->outq.owners, s->outq.nowners);
	free(s->outq.bufs);
	free(s->outq.owners);
	free(s->rbuf);
	frame_buf_free(s->body);
	if (s->groups != s->groups_here)
		free(s->groups);
	/* Refused after it was set aside: the executor never saw it. */
	executor_conn_unprepare(&s->econn);
	free(s);
}

/* Take s off its service's budget_waiters, if it is there. */
static void budget_unwait(struct session *s)
{
	if (s->budget_pprev == NULL)
		return;
	*s->budget_pprev = s->budget_next;
	if (s->budget_next != NULL)
		s->budget_next->budget_pprev = s->budget_pprev;
	s->budget_next = NULL;
	s->budget_pprev = NULL;
}

/*
 * The frame s is reading (or compiling) no longer holds its place in the
 * service's budget: it was submitted (its request_cost counts from now on)
 * or it will never be.  False when s held none.
 */
static bool budget_release(struct session *s)
{
	if (s->admitted == 0)
		return false;
	s->econn.service->bytes_admitted -= s->admitted;
	s->admitted = 0;
	return true;
}

static void wake_budget_waiters(struct service *svc);

/* budget_release, and the waiters' turn when room came back. */
static void budget_give_back(struct session *s)
{
	if (budget_release(s) && s->econn.service->budget_waiters != NULL)
		wake_budget_waiters(s->econn.service);
}

/* Close the socket once the executor no longer refers to the session. */
static void maybe_free(struct session *s)
{
	if (s->state != SESSION_CLOSING || s->device_open || s->handle_closed ||
	    s->compiling != NULL)
		return;
	s->handle_closed = true;
	uv_close((uv_handle_t *)&s->pipe, on_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
	struct session *s = req->data;

	(void)status;
	free(req);
	maybe_free(s);
}

void session_close(struct session *s, const char *why)
{
	uv_shutdown_t *req;
	bool had_unwritten, logged;

	if (s->state == SESSION_CLOSING)
		return;
	/*
	 * Replies already queued still go out, ahead of the shutdown: the
	 * last answers of a draining connection among them.
	 */
	s->close_flush = true;
	s->close_why = why;
	session_flush(s);
	s->close_flush = false;
	s->close_why = NULL;
	if (s->state == SESSION_CLOSING)
		return; /* the flush found the socket broken, and closed */
	/* A line for a joined connection, and for a refused one. */
	logged = (s->state == SESSION_READY || why != NULL) &&
		 log_limit_take(&conn_lines);
	if (s->state == SESSION_READY) {
		struct service *svc = s->econn.service;

		if (logged && why != NULL)
			log_notice(
				"connection %llu (%s, service %s) closed: %s",
				(unsigned long long)s->id, s->peer, svc->name,
				why);
		else if (logged)
			log_info("connection %llu (%s, service %s) left",
				 (unsigned long long)s->id, s->peer, svc->name);
		atomic_fetch_sub(&svc->connections, 1);
	} else if (logged) {
		log_info("connection %llu (%s) closed before its handshake: %s",
			 (unsigned long long)s->id, s->peer, why);
	}
	s->state = SESSION_CLOSING;
	had_unwritten = s->unwritten > 0;
	note_unwritten(s); /* its queue no longer counts against others */
	if (s->econn.service != NULL) {
		struct service *svc = s->econn.service;
		bool head = svc->budget_waiters == s;
		bool freed = (s->compiling == NULL && budget_release(s)) ||
			     had_unwritten;

		/*
		 * The head of the queue leaving, or room its frame or its
		 * unread replies held coming back, is the next one's turn:
		 * nothing else may come to say so.
		 */
		budget_unwait(s);
		if ((head || freed) && svc->budget_waiters != NULL)
			wake_budget_waiters(svc);
	}
	s->turn_wait = false;
	server_turn_forget(s->server, s);
	stop_reading(s);
	if (s->device_open && executor_close(s->server->ex, &s->econn) != 0) {
		/* Cannot tell the executor: keep the session rather than free
		 * memory it may still refer to. */
		log_err("connection %llu: cannot queue its teardown; its "
			"device memory stays held",
			(unsigned long long)s->id);
		return;
	}
	/* Let queued replies (a refusal, say) reach the client first. */
	req = malloc(sizeof(*req));
	if (req != NULL) {
		req->data = s;
		if (uv_shutdown(req, (uv_stream_t *)&s->pipe, on_shutdown) == 0)
			return;
		free(req);
	}
	maybe_free(s);
}

void session_device_closed(struct session *s)
{
	s->device_open = false;
	maybe_free(s);
}

void session_refuse(struct session *s, int code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	s->close_flush = true;
	s->close_why = msg;
	send_error(s, code, msg);
	s->close_flush = false;
	s->close_why = NULL;
	session_close(s, msg);
}

/* ---- reading ------------------------------------------------------------- */

/* Bytes of requests submitted and not yet completed (request_cost). */
static uint64_t bytes_in_flight(const struct session *s)
{
	return s->bytes_submitted -
	       atomic_load_explicit(&s->econn.bytes_done, memory_order_relaxed);
}

/*
 * Whether a frame of len body bytes would take what the connection's
 * service holds in the daemon past the service's max_bytes_in_flight
 * (all its connections together).  When the service holds nothing in the
 * daemon, a frame goes whatever its size.
 */
static bool over_service_budget(const struct session *s, uint32_t len)
{
	struct service *svc = s->econn.service;
	uint64_t limit = atomic_load_explicit(&svc->max_bytes_in_flight,
					      memory_order_relaxed);
	uint64_t held;

	if (limit == 0)
		return false;
	held = svc->bytes_submitted -
	       atomic_load_explicit(&svc->bytes_done, memory_order_relaxed) +
	       svc->bytes_admitted;
	return held > 0 && held + FRAME_HEADER_SIZE + len > limit;
}

/*
 * Whether a frame of len body bytes must wait in the socket for earlier
 * batches to complete: the connection's hold max_bytes_in_flight, or would
 * with it (a request alone always goes, whatever its size), or its
 * service's do (over_service_budget).  The service's connections wait in
 * turn, on its budget_waiters: while any waits, the others' frames queue
 * behind it, so one that keeps pipelining cannot take every bit of room
 * the service's completions free while a larger frame waits for ever.
 */
static bool over_byte_budget(struct session *s, uint32_t len)
{
	struct service *svc;
	uint64_t held;

	if (s->state != SESSION_READY)
		return false;
	held = bytes_in_flight(s);
	if (s->in_flight > 0 && held > 0 &&
	    held + FRAME_HEADER_SIZE + len >
		    s->server->cfg.limits.max_bytes_in_flight) {
		/*
		 * Its own batches hold it (a reload lowered the limit): it
		 * waits for them, which wake it, out of the service's queue.
		 * Its callers (session_reply, the walk) then wake the next.
		 */
		budget_unwait(s);
		return true;
	}
	svc = s->econn.service;
	if ((svc->budget_waiters != NULL && svc->budget_waiters != s) ||
	    over_service_budget(s, len) || over_unwritten(s, 2)) {
		if (s->budget_pprev == NULL) {
			struct session **pp = &svc->budget_waiters;

			while (*pp != NULL)
				pp = &(*pp)->budget_next;
			*pp = s;
			s->budget_pprev = pp;
			s->budget_next = NULL;
		}
		return true;
	}
	/* Its turn: the head of the queue goes. */
	budget_unwait(s);
	return false;
}

/* Whether the session may take more requests now. */
static bool may_take_more(const struct session *s)
{
	return s->in_flight < s->server->cfg.limits.max_in_flight &&
	       !s->budget_wait;
}

/*
 * While a frame waits for its turn, reading goes on into the rest of rbuf
 * (the frames behind it wait there in order) until little room is left;
 * a large frame read whole into s->body leaves none.  Nor does a
 * descriptor that came with the bytes: it waits in s->fds for its frame to
 * be decoded, and reading on would pile up those of frame after frame
 * until keep_fd took the client for one that sends descriptors no
 * region_attach asks for (REGION_MAX_PER_CONNECTION); stopped here, one
 * read's worth waits, as when frames were decoded as they were read.
 */
static bool turn_holds_reading(const struct session *s)
{
	return s->turn_wait && (s->body != NULL || s->nfds > 0 ||
				s->rcap - s->rlen < SESSION_TURN_ROOM);
}

static void resume_reading(struct session *s)
{
	if (s->reading || s->state == SESSION_CLOSING || s->compiling != NULL ||
	    s->budget_wait || turn_holds_reading(s))
		return;
	if (s->read_end) {
		/*
		 * Every whole frame read before the end has been handled.  A
		 * client that only shut down its writing side still reads:
		 * its connection closes once the last reply is on its way.
		 */
		if (!s->turn_wait &&
		    (s->in_flight == 0 || s->read_end_why != NULL ||
		     !peer_reads_on(s)))
			session_close(s, s->read_end_why);
		return;
	}
	if (uv_read_start((uv_stream_t *)&s->pipe, on_alloc, on_read) == 0)
		s->reading = true;
}

/*
 * A connection the daemon closes as it stops: an Error frame says why
 * (else the client reads only "closed without saying why"), after the
 * replies already queued.  One not yet joined is only closed.
 */
static void stop_close(struct session *s)
{
	if (s->state == SESSION_READY)
		session_refuse(s, GPUCMD_EDISCONNECTED, "%s",
			       s->server->stop_reason);
	else
		session_close(s, "the daemon is shutting down");
}

void session_drain(struct session *s)
{
	if (s->state != SESSION_READY || s->in_flight == 0) {
		stop_close(s);
		return;
	}
	s->draining = true;
	stop_reading(s);
}

static void parse_frames(struct session *s);

/*
 * Room came back in svc's budget (a batch completed, a frame let in left
 * without a batch, the head of the queue left): the sessions waiting for
 * it look at their next frame again, in turn, until the head of the queue
 * still waits.  A frame handled here may close sessions or free room
 * again (session_close calls back in): the walk then goes on from the
 * queue as it is.
 */
static void wake_budget_waiters(struct service *svc)
{
	struct session *w;

	if (svc->budget_waking) {
		svc->budget_rewake = true;
		return;
	}
	svc->budget_waking = true;
	while ((w = svc->budget_waiters) != NULL) {
		svc->budget_rewake = false;
		if (!w->draining && !w->server->stopping &&
		    w->in_flight < w->server->cfg.limits.max_in_flight) {
			parse_frames(w);
			if (w->state != SESSION_CLOSING && may_take_more(w))
				resume_reading(w);
		}
		if (svc->budget_waiters == w && !svc->budget_rewake)
			break;
	}
	svc->budget_waking = false;
}

void session_reply(struct session *s, uint8_t *buf, size_t len,
		   struct reply_pieces *pieces, const struct reply_lost *lost,
		   bool completed)
{
	if (s->state == SESSION_CLOSING) {
		struct reply_owner o = { buf, pieces };

		drop_replies(&o, 1);
	} else if (buf != NULL || pieces != NULL) {
		queue_reply(s, buf, len, pieces);
	} else if (lost != NULL) {
		answer_lost(s, lost);
	}
	if (!completed)
		return;
	s->in_flight--;
	if (s->draining) {
		if (s->in_flight == 0)
			stop_close(s);
	} else if (s->in_flight < s->server->cfg.limits.max_in_flight) {
		/*
		 * Whole frames read ahead wait in rbuf for their turn, and a
		 * frame over the byte budget in the socket.
		 */
		parse_frames(s);
		if (s->state != SESSION_CLOSING && may_take_more(s))
			resume_reading(s);
	}
	/* The service's budget has room again for its other connections. */
	if (s->econn.service != NULL)
		wake_budget_waiters(s->econn.service);
}

/*
 * The service hello asks to join, when the peer may: created if new.  NULL
 * after refusing the connection with the reason.
 */
static struct service *join(struct session *s, const Gpucmd__Hello *hello,
			    bool admin)
{
	const struct config *cfg = &s->server->cfg;
	const struct config_service *cs;
	struct service *svc;
	unsigned max;

	if (service_name_check(hello->service) != 0) {
		session_refuse(s, GPUCMD_EINVAL,
			       "service name '%.80s' is not valid: use 1 to %d "
			       "letters, digits, '.', '_' or '-'",
			       hello->service, SERVICE_NAME_MAX);
		return NULL;
	}
	cs = config_find_service(cfg, hello->service);
	if (cs == NULL) {
		if (cfg->unknown_services == CONFIG_UNKNOWN_REFUSE && !admin) {
			session_refuse(
				s, GPUCMD_EPERM,
				"service '%s' is not configured and this "
				"daemon refuses unknown services: add a "
				"[service %s] section to %s",
				hello->service, hello->service,
				config_file(cfg));
			return NULL;
		}
		cs = &cfg->default_service;
	}
	/* [services] default_uids/gids guard unlisted services too. */
	if (!admin && !service_allows(cs, s->uid, s->groups, s->ngroups)) {
		session_refuse(s, GPUCMD_EPERM,
			       "uid %u (gid %u) may not connect as service "
			       "'%s': its uids and gids in %s do not include "
			       "them",
			       (unsigned)s->uid, (unsigned)s->gid,
			       hello->service, config_file(cfg));
		return NULL;
	}
	svc = service_join(hello->service, cs);
	/* Listed, but the reload found no room for it (apply_services). */
	if (svc != NULL && cs != &cfg->default_service)
		atomic_store(&svc->listed, true);
	if (svc == NULL) {
		session_refuse(
			s, GPUCMD_ELIMIT,
			"too many services: the daemon knows %d already, "
			"each with a connection, memory or a module "
			"loaded, or listed in the configuration file",
			SERVICE_MAX);
		return NULL;
	}
	/*
	 * [limits] max_connections is the daemon's: without a share per
	 * service, one service's clients could take every place and lock
	 * the others out for as long as they stay connected.  Admins keep
	 * their way in, as past max_connections.
	 */
	max = atomic_load(&svc->max_connections);
	if (!admin && max != 0 && atomic_load(&svc->connections) >= max) {
		session_refuse(s, GPUCMD_ELIMIT,
			       "service '%s' has %u connection%s open, and its "
			       "max_connections in %s is %u: close one, or "
			       "raise it",
			       svc->name,
			       (unsigned)atomic_load(&svc->connections),
			       atomic_load(&svc->connections) == 1 ? "" : "s",
			       config_file(cfg), max);
		service_leave(svc);
		return NULL;
	}
	return svc;
}

static void handle_hello(struct session *s, const Gpucmd__Hello *hello)
{
	struct server *srv = s->server;
	const struct driver_properties *p = executor_properties(srv->ex);
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Welcome w = GPUCMD__WELCOME__INIT;
	Gpucmd__DeviceInfo dev = GPUCMD__DEVICE_INFO__INIT;
	Gpucmd__Limits lim = GPUCMD__LIMITS__INIT;
	const char *client =
		hello->client_name[0] ? hello->client_name : "unnamed client";
	struct service *svc;
	bool admin = session_is_admin(s), logged;

	if (hello->protocol_version != GPUCMD_PROTOCOL_VERSION) {
		session_refuse(s, GPUCMD_EVERSION,
			       "protocol version %u is not supported; this "
			       "gpucmdd speaks %u: use a matching libgpucmd",
			       hello->protocol_version,
			       GPUCMD_PROTOCOL_VERSION);
		return;
	}
	/* Its end must never wait for memory: set aside now. */
	if (executor_conn_prepare(&s->econn) != 0) {
		session_refuse(s, GPUCMD_ENOMEM,
			       "gpucmdd's host is out of memory: try again "
			       "later");
		return;
	}
	/*
	 * An admin who only reads reports and runs admin ops (observe: the
	 * gpucmd reports, evict and cleanup ask for it) joins no service.
	 * Joining the one its Hello names would create it, and the admin
	 * would then read it, with one connection nobody configured, in the
	 * very report it came for.  Anyone else joins as always: observing
	 * is only for those who may see every service.
	 */
	if (hello->observe && admin)
		svc = service_observers();
	else if ((svc = join(s, hello, admin)) == NULL)
		return;
	atomic_fetch_add(&svc->connections, 1);
	s->econn.conn = s;
	s->econn.service = svc;
	s->econn.id = s->id;
	s->econn.admin = admin;
	s->econn.limits = srv->cfg.limits;
	s->state = SESSION_READY;
	s->device_open = true;
	logged = log_limit_take(&conn_lines);
	if (logged && svc->observer)
		log_info("connection %llu (%s, %s) observes: an admin in no "
			 "service",
			 (unsigned long long)s->id, s->peer, client);
	else if (logged)
		log_info("connection %llu (%s, %s) joined service %s (id %u)",
			 (unsigned long long)s->id, s->peer, client, svc->name,
			 svc->id);

	dev.name = (char *)p->name;
	dev.backend = (char *)p->backend;
	dev.uuid = (char *)p->uuid;
	dev.pci_bus_id = (char *)p->pci_bus_id;
	dev.total_memory = p->total_memory;
	dev.max_allocation = p->max_page_size;
	dev.alignment = p->alignment;
	lim.memory_limit = atomic_load(&svc->memory_limit);
	/*
	 * The value region.c enforces: the service's own (service_apply, at
	 * creation and on a reload), not the section of the file.
	 */
	lim.region_limit = atomic_load(&svc->region_limit);
	lim.max_streams = srv->cfg.limits.max_streams;
	if (atomic_load(&svc->max_streams) != 0 &&
	    atomic_load(&svc->max_streams) < lim.max_streams)
		lim.max_streams = atomic_load(&svc->max_streams);
	/*
	 * The connection keeps the stream limit it is welcomed with: a
	 * reload's max_streams is for connections opened after it
	 * (gpucmdd.conf(5), RELOADING), however long this one waits before
	 * its first request.
	 */
	s->econn.limits.max_streams = lim.max_streams;
	lim.max_ops_per_batch = srv->cfg.limits.max_ops_per_batch;
	lim.max_frame_bytes = srv->cfg.limits.max_frame_bytes;
	lim.max_in_flight = srv->cfg.limits.max_in_flight;
	lim.max_handles = srv->cfg.limits.max_handles;
	w.protocol_version = GPUCMD_PROTOCOL_VERSION;
	/* An observer's: id 0 and no name, which no real service has. */
	w.service_id = svc->id;
	w.service = svc->observer ? "" : svc->name;
	w.connection_id = s->id;
	w.device = &dev;
	w.limits = &lim;
	f.msg_case = GPUCMD__FRAME__MSG_WELCOME;
	f.welcome = &w;
	send_frame(s, &f);
}

/* A request that breaks a limit is answered with an error, not run. */
static void reply_error(struct session *s, uint64_t id, int code,
			const char *msg)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Response r = GPUCMD__RESPONSE__INIT;
	Gpucmd__Error e = GPUCMD__ERROR__INIT;

	e.code = code;
	e.message = (char *)msg;
	r.id = id;
	r.error = &e;
	f.msg_case = GPUCMD__FRAME__MSG_RESPONSE;
	f.response = &r;
	send_frame(s, &f);
}

static void free_handle(uv_handle_t *h)
{
	free(h);
}

/*
 * Whether the daemon has fewer free descriptors below RLIMIT_NOFILE than
 * one message may bring (REGION_MAX_PER_CONNECTION): the kernel then
 * drops those a client sends that it cannot install, and libuv does not
 * say so.  *open (at least that many are open: a new descriptor is the
 * lowest free one) and *limit say how far it is.
 */
static bool fds_short(const struct session *s, unsigned long long *open,
		      unsigned long long *limit)
{
	struct rlimit rl;
	int probe;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
		return false;
	*limit = (unsigned long long)rl.rlim_cur;
	probe = fcntl(s->fd >= 0 ? s->fd : 0, F_DUPFD_CLOEXEC, 0);
	if (probe < 0) {
		*open = *limit;
		return errno == EMFILE;
	}
	close(probe);
	*open = (unsigned long long)probe;
	return *open + REGION_MAX_PER_CONNECTION >= *limit;
}

/*
 * A descriptor the client sent could not be taken for want of them: the
 * connection, whose region_attach ops can no longer get the memfds meant
 * for them, is refused; it did nothing wrong, so no protocol error.
 */
static void refuse_out_of_fds(struct session *s, unsigned long long open,
			      unsigned long long limit)
{
	session_refuse(s, GPUCMD_ELIMIT,
		       "gpucmdd is out of file descriptors (at least %llu "
		       "open, its limit RLIMIT_NOFILE is %llu): memfds this "
		       "connection sent were lost; connect again once other "
		       "connections have closed, or have the operator raise "
		       "LimitNOFILE=",
		       open, limit);
}

/*
 * Descriptors that came with the bytes join s->fds, oldest first.  A client
 * may not make the daemon hold more than a request could ask for: past
 * REGION_MAX_PER_CONNECTION the extra ones are closed and the connection
 * is refused, as it is for a descriptor that is not a memfd.  Returns
 * false when it was.
 */
static bool keep_fd(struct session *s, int fd, size_t nread)
{
	/*
	 * Only a memfd can make a region (region_attach), and a client may
	 * send nothing else.  Held until a later frame, a socket could keep
	 * a connection alive after its client died, the client having sent
	 * its own end of it (or another of its connections'), and with it
	 * everything the connection holds; a memfd cannot carry descriptors.
	 */
	if (fcntl(fd, F_GET_SEALS) < 0) {
		close(fd);
		session_refuse(s, GPUCMD_EPROTO,
			       "the client sent a descriptor that is not a "
			       "memfd: send only memfds created with "
			       "MFD_ALLOW_SEALING, each with the request whose "
			       "region_attach takes it");
		return false;
	}
	if (s->nfds >= REGION_MAX_PER_CONNECTION) {
		close(fd);
		session_refuse(s, GPUCMD_EPROTO,
			       "more than %d descriptors were sent that no "
			       "region_attach asked for",
			       REGION_MAX_PER_CONNECTION);
		return false;
	}
	s->fd_from[s->nfds] = s->rx_bytes;
	s->fd_to[s->nfds] = s->rx_bytes + nread;
	s->fds[s->nfds++] = fd;
	return true;
}

/*
 * libuv holds each descriptor that came with the bytes it read as a pending
 * handle of the IPC pipe; accepting it into a scratch pipe hands us the
 * descriptor, which we duplicate (close-on-exec) before the scratch handle
 * closes.
 */
static bool keep_pending_fds(struct session *s, size_t nread)
{
	while (uv_pipe_pending_count(&s->pipe) > 0) {
		uv_pipe_t *tmp = malloc(sizeof(*tmp));
		uv_os_fd_t fd;
		int rc, dup = -1, err = 0;

		if (tmp == NULL) {
			session_refuse(s, GPUCMD_ENOMEM, "out of memory");
			return false;
		}
		uv_pipe_init(s->server->loop, tmp, 0);
		rc = uv_accept((uv_stream_t *)&s->pipe, (uv_stream_t *)tmp);
		if (rc == 0)
			rc = uv_fileno((uv_handle_t *)tmp, &fd);
		if (rc == 0) {
			dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
			err = errno; /* before the close's system calls */
		}
		uv_close((uv_handle_t *)tmp, free_handle);
		if (dup < 0 && rc == 0 && (err == EMFILE || err == ENFILE)) {
			unsigned long long open = 0, limit = 0;

			fds_short(s, &open, &limit);
			refuse_out_of_fds(s, open, limit);
			return false;
		}
		if (dup < 0) {
			session_refuse(s, GPUCMD_EPROTO,
				       "cannot take a descriptor the client "
				       "sent: %s",
				       rc != 0 ? uv_strerror(rc) :
						 strerror(err));
			return false;
		}
		if (!keep_fd(s, dup, nread))
			return false;
	}
	return true;
}

/*
 * The descriptors of a request's region_attach ops, in op order.  A
 * request naming more attaches than descriptors arrived is a protocol
 * error; so is a pile of descriptors no request asked for (a client cannot
 * make the daemon hold descriptors without bound).
 */
static int take_fds_n(struct session *s, uint64_t id, size_t want, int **out,
		      size_t *n)
{
	unsigned stale = 0, mine = 0;
	int *fds;

	*out = NULL;
	*n = 0;
	/* Oldest first: ones whose read ended before this frame began. */
	while (stale < s->nfds && s->fd_to[stale] <= s->frame_at)
		stale++;
	if (stale > 0) {
		session_refuse(
			s, GPUCMD_EPROTO,
			"%u descriptors came with frames before request "
			"%llu that attached no regions with them: send "
			"each memfd with the request whose region_attach "
			"takes it",
			stale, (unsigned long long)id);
		return GPUCMD_EPROTO;
	}
	while (mine < s->nfds && s->fd_from[mine] <= s->frame_at)
		mine++;
	if (want == 0)
		return 0;
	if (want > mine) {
		unsigned long long open, limit;

		if (fds_short(s, &open, &limit)) {
			refuse_out_of_fds(s, open, limit);
			return GPUCMD_ELIMIT;
		}
		session_refuse(s, GPUCMD_EPROTO,
			       "request %llu has %zu region_attach ops but "
			       "only %u descriptors came with it: send each "
			       "memfd with SCM_RIGHTS in the frame's sendmsg",
			       (unsigned long long)id, want, mine);
		return GPUCMD_EPROTO;
	}
	fds = calloc(want, sizeof(*fds));
	if (fds == NULL) {
		session_refuse(s, GPUCMD_ENOMEM, "out of memory");
		return GPUCMD_ENOMEM;
	}
	memcpy(fds, s->fds, want * sizeof(*fds));
	s->nfds -= (unsigned)want;
	memmove(s->fds, s->fds + want, s->nfds * sizeof(*fds));
	memmove(s->fd_from, s->fd_from + want, s->nfds * sizeof(s->fd_from[0]));
	memmove(s->fd_to, s->fd_to + want, s->nfds * sizeof(s->fd_to[0]));
	*out = fds;
	*n = want;
	return 0;
}

/* The region_attach ops of a decoded request. */
static size_t attach_count(const Gpucmd__Request *req)
{
	size_t want = 0;

	for (size_t i = 0; i < req->n_ops; i++)
		if (req->ops[i] != NULL &&
		    req->ops[i]->op_case == GPUCMD__OP__OP_REGION_ATTACH)
			want++;
	return want;
}

/* take_fds_n for the region_attach ops of a decoded request. */
static int take_fds(struct session *s, const Gpucmd__Request *req, int **out,
		    size_t *n)
{
	return take_fds_n(s, req->id, attach_count(req), out, n);
}

/*
 * Answer request id with code and msg without running it.  The
 * descriptors its attaches brought go with it: left queued, they would
 * reach the next request's attaches.
 */
static void refuse_unrun(struct session *s, uint64_t id, size_t attaches,
			 int code, const char *msg)
{
	int *fds = NULL;
	size_t nfds = 0;

	if (take_fds_n(s, id, attaches, &fds, &nfds) != 0)
		return; /* refused: the descriptors did not match */
	for (size_t i = 0; i < nfds; i++)
		close(fds[i]);
	free(fds);
	reply_error(s, id, code, msg);
}

/* The sentence of a batch over max_ops_per_batch. */
static void ops_over_limit(char *msg, size_t len, size_t nops, uint32_t max)
{
	snprintf(msg, len,
		 "batch of %zu ops is over the limit of %u "
		 "(max_ops_per_batch): split it",
		 nops, max);
}

/*
 * An evict of one connection that cannot end it is refused with the
 * reason, rather than answered "0 connections": false after the answer.
 */
static bool may_evict_connection(struct session *s, uint64_t id,
				 const Gpucmd__OpEvict *op)
{
	struct session *t;
	char why[200];

	for (t = s->server->sessions; t != NULL; t = t->next)
		if (t->id == op->connection_id && t->state == SESSION_READY)
			break;
	/*
	 * Another service's connection looks to a non-admin like one that is
	 * not open: the ids, like the reports, must not tell a tenant who
	 * else is connected.
	 */
	if (t != NULL && !s->econn.admin &&
	    t->econn.service != s->econn.service)
		t = NULL;
	if (t == NULL) {
		if (s->econn.admin)
			snprintf(why, sizeof(why),
				 "no connection %llu is open (gpucmd "
				 "memory-report --streams lists them)",
				 (unsigned long long)op->connection_id);
		else
			snprintf(why, sizeof(why),
				 "no connection %llu of service '%s' is open "
				 "(gpucmd memory-report --streams lists them; "
				 "an admin may evict any service's)",
				 (unsigned long long)op->connection_id,
				 s->econn.service->name);
		reply_error(s, id, GPUCMD_ENOTFOUND, why);
		return false;
	}
	if (t == s) {
		reply_error(s, id, GPUCMD_EINVAL,
			    "a connection cannot evict itself: close it");
		return false;
	}
	return true;
}

/*
 * Evict runs on the loop thread, which owns the connections: every session
 * of the named service (or the one connection id) is closed, which frees
 * its memory like a client exit would.  Admins may evict anyone; others only
 * connections of their own service.  The caller itself is spared.
 */
static void handle_evict(struct session *s, uint64_t id,
			 const Gpucmd__OpEvict *op)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Response r = GPUCMD__RESPONSE__INIT;
	Gpucmd__OpResult res = GPUCMD__OP_RESULT__INIT;
	Gpucmd__OpResult *results[1] = { &res };
	struct session *t, *next;
	uint64_t n = 0;
	char why[160];

	if (op->service[0] == '\0' && op->connection_id == 0) {
		reply_error(s, id, GPUCMD_EINVAL,
			    "evict needs a service name or a connection id");
		return;
	}
	if (op->service[0] != '\0' && service_name_check(op->service) != 0) {
		reply_error(s, id, GPUCMD_EINVAL,
			    "a service name is 1 to 63 letters, digits, '.', "
			    "'_' or '-'");
		return;
	}
	if (op->connection_id != 0 && !may_evict_connection(s, id, op))
		return;
	if (!s->econn.admin && op->service[0] != '\0' &&
	    strcmp(op->service, s->econn.service->name) != 0) {
		snprintf(why, sizeof(why),
			 "only an admin may evict service '%.64s' (you speak "
			 "for '%s')",
			 op->service, s->econn.service->name);
		reply_error(s, id, GPUCMD_EPERM, why);
		return;
	}
	/* A typo must not read as "evicted 0 connections" (after the
	 * EPERM: others learn nothing of which services exist). */
	if (op->service[0] != '\0' && !service_known(op->service)) {
		snprintf(why, sizeof(why), SERVICE_UNKNOWN_FMT, op->service);
		reply_error(s, id, GPUCMD_ENOTFOUND, why);
		return;
	}
	snprintf(why, sizeof(why), "evicted by connection %llu (%s)",
		 (unsigned long long)s->id, s->peer);
	for (t = s->server->sessions; t != NULL; t = next) {
		next = t->next;
		if (t == s || t->state != SESSION_READY)
			continue;
		if (op->connection_id != 0 && t->id != op->connection_id)
			continue;
		if (op->service[0] != '\0' &&
		    strcmp(t->econn.service->name, op->service) != 0)
			continue;
		if (!s->econn.admin && t->econn.service != s->econn.service)
			continue;
		session_refuse(t, GPUCMD_EDISCONNECTED, "%s", why);
		n++;
	}
	res.result_case = GPUCMD__OP_RESULT__RESULT_VALUE;
	res.value = n;
	r.id = id;
	r.n_results = 1;
	r.results = results;
	f.msg_case = GPUCMD__FRAME__MSG_RESPONSE;
	f.response = &r;
	send_frame(s, &f);
}

/*
 * A batch of pings is the daemon's liveness check: the loop thread answers
 * it itself, without a trip through the device thread.  So does a batch of
 * syncs (and pings) when the connection has nothing out: every batch it
 * sent was answered to the end, and the device thread's word from the last
 * of them (executor_conn.quiet) says no stream records a graph, holds an
 * unreported fault or runs anything, so the answer the device thread
 * would give is known.
 */
static bool stream_known(const struct session *s, uint32_t number)
{
	for (uint32_t i = 0; i < s->nstreams; i++)
		if (s->streams[i] == number)
			return true;
	return false;
}

/* Mirror streams_get: a new number becomes a stream while under the limit. */
static void note_stream(struct session *s, uint32_t number)
{
	if (s->max_streams == 0) {
		/* The service's limit is in it since the Welcome. */
		s->max_streams = s->econn.limits.max_streams;
		if (s->max_streams > 64)
			s->max_streams = 64;
	}
	if (!stream_known(s, number) && s->nstreams < s->max_streams)
		s->streams[s->nstreams++] = number;
}

static bool loop_answers(const struct session *s, const Gpucmd__Request *req)
{
	bool syncs = false;

	if (req->n_ops == 0 || req->n_ops > 64)
		return false;
	for (size_t i = 0; i < req->n_ops; i++) {
		if (req->ops[i] == NULL)
			return false;
		if (req->ops[i]->op_case == GPUCMD__OP__OP_SYNC)
			syncs = true;
		else if (req->ops[i]->op_case != GPUCMD__OP__OP_PING)
			return false;
	}
	/*
	 * Pings need no stream (dispatch_needs_stream); a sync on a number
	 * the connection has no stream for would create one.
	 */
	return !syncs ||
	       (stream_known(s, req->stream) && s->in_flight == 0 &&
		atomic_load_explicit(&s->econn.quiet, memory_order_relaxed));
}

static void answer_on_loop(struct session *s, const Gpucmd__Request *req)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Response r = GPUCMD__RESPONSE__INIT;
	Gpucmd__OpResult res[64], *results[64];

	for (size_t i = 0; i < req->n_ops; i++) {
		gpucmd__op_result__init(&res[i]);
		res[i].result_case = GPUCMD__OP_RESULT__RESULT_DONE;
		res[i].done = 1;
		results[i] = &res[i];
	}
	r.id = req->id;
	r.n_results = req->n_ops;
	r.results = results;
	f.msg_case = GPUCMD__FRAME__MSG_RESPONSE;
	f.response = &r;
	send_frame(s, &f);
}

/* ---- compiling modules off the device thread (module.h) ------------------ */

struct compile_job {
	uv_work_t work;
	struct session *s;
	Gpucmd__Frame *frame;
	uint64_t cost; /* request_cost */
	int *fds;
	size_t nfds;
	struct module_cache *cache;
	struct module_compiled *compiled; /* one per op */
	uint64_t memory_limit;		  /* the service's, at the start */
	uint32_t owner;			  /* its id (module_cache_has) */
};

/* An op loading a module from inline bytes: the loop can hand those on. */
static const Gpucmd__OpLoadModule *inline_module(const Gpucmd__Op *op)
{
	if (op == NULL || op->op_case != GPUCMD__OP__OP_LOAD_MODULE ||
	    op->load_module == NULL)
		return NULL;
	if (op->load_module->region != NULL || op->load_module->data.len == 0 ||
	    module_format_parse(op->load_module->format) < 0)
		return NULL;
	return op->load_module;
}

static bool needs_compile(struct session *s, const Gpucmd__Request *req)
{
	const struct service *svc = s->econn.service;

	if (!module_cache_compiles_shared(executor_modules(s->server->ex)))
		return false;
	/*
	 * The device thread refuses every load of a service that may hold
	 * none: compile nothing.  (A service at its max_modules is not
	 * refused here: the same request may unload first, and the device
	 * thread would then compile what the loop skipped, holding every
	 * service meanwhile.)
	 */
	if (atomic_load(&svc->max_modules) == 0)
		return false;
	for (size_t i = 0; i < req->n_ops; i++)
		if (inline_module(req->ops[i]) != NULL)
			return true;
	return false;
}

/* A thread of libuv's pool. */
static void compile_work(uv_work_t *w)
{
	struct compile_job *job = w->data;
	const Gpucmd__Request *req = job->frame->request;

	for (size_t i = 0; i < req->n_ops; i++) {
		const Gpucmd__OpLoadModule *lm = inline_module(req->ops[i]);
		enum driver_module_format fmt;

		if (lm == NULL)
			continue;
		fmt = (enum driver_module_format)module_format_parse(
			lm->format);
		/* Known content is filed by the device thread in no time. */
		if (module_cache_has(job->cache, fmt, lm->data.data,
				     lm->data.len, job->owner))
			continue;
		/*
		 * Globals larger than the service's whole memory_limit are
		 * not loaded even for a moment: left uncompiled, the device
		 * thread refuses the module before loading it (dispatch.c,
		 * module_fits).
		 */
		if (job->memory_limit != 0 && fmt != DRIVER_MODULE_CUDA_C &&
		    module_image_static_bytes(lm->data.data, lm->data.len,
					      NULL) > job->memory_limit)
			continue;
		module_compile(job->cache, fmt, lm->data.data, lm->data.len,
			       &job->compiled[i]);
	}
}

static void compile_job_free(struct compile_job *job)
{
	const Gpucmd__Request *req = job->frame->request;

	for (size_t i = 0; job->compiled != NULL && i < req->n_ops; i++)
		module_compiled_release(job->cache, &job->compiled[i]);
	free(job->compiled);
	for (size_t i = 0; i < job->nfds; i++)
		close(job->fds[i]);
	free(job->fds);
	frame_free(job->frame);
	free(job);
}

static void submit(struct session *s, Gpucmd__Frame *frame, int *fds,
		   size_t nfds, struct module_compiled *compiled,
		   uint64_t cost);

/* Back on the loop: the request goes on, then the frames behind it. */
static void compile_done(uv_work_t *w, int status)
{
	struct compile_job *job = w->data;
	struct session *s = job->s;

	(void)status;
	s->compiling = NULL;
	if (s->state == SESSION_CLOSING) {
		/* The client left meanwhile: nothing reaches the device. */
		s->in_flight--;
		compile_job_free(job);
		budget_give_back(s);
		maybe_free(s);
		return;
	}
	s->in_flight--;
	submit(s, job->frame, job->fds, job->nfds, job->compiled, job->cost);
	free(job);
	budget_give_back(s);
	if (s->state == SESSION_CLOSING)
		return;
	if (s->draining) {
		/*
		 * The daemon is shutting down: the compiled request ran (or
		 * was answered), and no frame behind it is taken, as when a
		 * batch completes (session_reply).
		 */
		if (s->in_flight == 0)
			stop_close(s);
		return;
	}
	parse_frames(s);
	if (s->state != SESSION_CLOSING && may_take_more(s))
		resume_reading(s);
}

/* One more batch in flight; since when s has had work, for the stop. */
static void in_flight_add(struct session *s)
{
	if (s->in_flight++ == 0)
		s->busy_since_ms = uv_now(s->server->loop);
}

/*
 * Compile the request's modules on the pool; true when it went there (and
 * owns frame and fds), false to go on without (the device thread then
 * compiles).
 */
static bool start_compile(struct session *s, Gpucmd__Frame *frame, int *fds,
			  size_t nfds, uint64_t cost)
{
	struct compile_job *job = calloc(1, sizeof(*job));

	if (job == NULL)
		return false;
	job->compiled = calloc(frame->request->n_ops, sizeof(*job->compiled));
	if (job->compiled == NULL) {
		free(job);
		return false;
	}
	job->s = s;
	job->frame = frame;
	job->fds = fds;
	job->nfds = nfds;
	job->cost = cost;
	job->cache = executor_modules(s->server->ex);
	job->memory_limit = atomic_load(&s->econn.service->memory_limit);
	job->owner = s->econn.service->id;
	job->work.data = job;
	if (uv_queue_work(s->server->loop, &job->work, compile_work,
			  compile_done) != 0) {
		free(job->compiled);
		free(job);
		return false;
	}
	s->compiling = job;
	in_flight_add(s);
	stop_reading(s);
	return true;
}

static void submit(struct session *s, Gpucmd__Frame *frame, int *fds,
		   size_t nfds, struct module_compiled *compiled, uint64_t cost)
{
	const struct config_limits *lim = &s->server->cfg.limits;
	uint64_t id = frame->request->id;
	bool awaiting;
	size_t nops;
	int rc;

	rc = server_reserve_replies(s->server, s);
	if (rc != 0) {
		reply_error(s, id, rc,
			    "the daemon is out of memory for this batch");
		for (size_t i = 0; i < nfds; i++)
			close(fds[i]);
		free(fds);
		executor_release_compiled(s->server->ex, compiled,
					  frame->request->n_ops);
		frame_free(frame);
		return;
	}
	nops = frame->request->n_ops;
	/*
	 * A reply that waits for device work is watched for as long as the
	 * device thread watches (SPIN_AWAIT_US).  A {write_region 1 MiB;
	 * sync} takes ~50 us on the device thread, past the 50 us spin: the
	 * loop slept, and at the reply it waited 20-25 us for the CPU the
	 * client spun on, which its own spinning had made it too far ahead of
	 * to get at once (perf sched on the 2-core VM; round trips 107-131 ->
	 * 79-101 us).  Decided before the hand-off: the device thread frees
	 * the frame.
	 */
	awaiting = nops <= SPIN_REPLY_MAX_OPS &&
		   frame_request_awaits_device(frame->request);
	rc = executor_submit(s->server->ex, &s->econn, frame, fds, nfds,
			     compiled, cost);
	if (rc != 0) {
		reply_error(s, id, rc,
			    "the daemon is out of memory for this batch");
		frame_free(frame);
		return;
	}
	in_flight_add(s);
	s->bytes_submitted += cost;
	s->econn.service->bytes_submitted += cost;
	/* Watch for the reply only when it can come within the spin. */
	if (nops <= SPIN_REPLY_MAX_OPS)
		server_spin(s->server, awaiting);
	if (s->in_flight >= lim->max_in_flight) {
		/* Backpressure: the client's writes block until we catch up. */
		stop_reading(s);
	}
}

/*
 * What a request holds in the daemon until it completes, against
 * max_bytes_in_flight: its frame, the structs decoding made of it (tens of
 * times the frame for many small nested messages: a kernel of 100000 empty
 * arguments is 200 KB on the wire and 5.6 MB decoded), and the staging of
 * its inline reads (which cannot pass a frame together: the reply must fit
 * one).
 */
static uint64_t request_cost(const struct session *s,
			     const Gpucmd__Frame *frame, size_t len)
{
	const Gpucmd__Request *req = frame->request;
	uint64_t reads = 0;

	for (size_t i = 0; i < req->n_ops; i++) {
		const Gpucmd__Op *op = req->ops[i];

		if (op != NULL && op->op_case == GPUCMD__OP__OP_READ &&
		    op->read != NULL && op->read->into == NULL)
			reads += op->read->length < UINT32_MAX ?
					 op->read->length :
					 UINT32_MAX;
	}
	if (reads > s->server->cfg.limits.max_frame_bytes)
		reads = s->server->cfg.limits.max_frame_bytes;
	return FRAME_HEADER_SIZE + len + frame_held_bytes(frame) + reads;
}

/*
 * May an observer run op?  Reads that need no stream (ping, status, the
 * daemon-wide report) and the admin ops that act on a service by name;
 * nothing that allocates, launches, maps or loads, whose memory would
 * belong to no service, and nothing of a stream.
 */
static bool observer_may(const Gpucmd__Op *op)
{
	switch (op->op_case) {
	/*
	 * Only ops that need no stream (dispatch_needs_stream): an observer
	 * has no streams, since its set belongs to no service and would show
	 * in no report.
	 */
	case GPUCMD__OP__OP_PING:
	case GPUCMD__OP__OP_STATUS:
	case GPUCMD__OP__OP_MEMORY_REPORT:
	case GPUCMD__OP__OP_EVICT:
		return true;
	case GPUCMD__OP__OP_CLEANUP:
		/* "" is the caller's own service, and an observer has none. */
		return op->cleanup != NULL && op->cleanup->service[0] != '\0';
	default:
		return false;
	}
}

/*
 * Refuse, unrun, a request of an observer connection with an op it may not
 * run: true when it was.  Before anything reaches the device thread, so
 * the observer's device state never holds memory.
 */
static bool observer_refuses(struct session *s, const Gpucmd__Request *req)
{
	const ProtobufCFieldDescriptor *fd;
	const Gpucmd__Op *op = NULL;
	char msg[400];
	size_t i;

	for (i = 0; i < req->n_ops; i++) {
		op = req->ops[i];
		if (op != NULL && !observer_may(op))
			break;
	}
	if (i == req->n_ops)
		return false;
	fd = protobuf_c_message_descriptor_get_field(&gpucmd__op__descriptor,
						     op->op_case);
	if (op->op_case == GPUCMD__OP__OP_CLEANUP)
		snprintf(msg, sizeof(msg),
			 "op %zu (cleanup) names no service, and an observer "
			 "connection speaks for none: name the service to "
			 "clean up",
			 i);
	else
		snprintf(msg, sizeof(msg),
			 "op %zu (%s) is refused: an observer connection may "
			 "only read reports and status (ping, status, "
			 "memory_report) and run admin ops (evict, cleanup of "
			 "a named service); "
			 "connect as a service (a Hello without observe) to "
			 "allocate, copy, launch, map regions or load modules",
			 i, fd != NULL ? fd->name : "unknown");
	refuse_unrun(s, req->id, attach_count(req), GPUCMD_EPERM, msg);
	return true;
}

static void handle_request(struct session *s, Gpucmd__Frame *frame, size_t len)
{
	const struct config_limits *lim = &s->server->cfg.limits;
	Gpucmd__Request *req = frame->request;
	int *fds = NULL;
	size_t nfds = 0;
	uint64_t cost;
	int rc;

	if (s->econn.service->observer && observer_refuses(s, req)) {
		frame_free(frame);
		return;
	}
	if (req->n_ops == 1 && req->ops[0] != NULL &&
	    req->ops[0]->op_case == GPUCMD__OP__OP_EVICT) {
		handle_evict(s, req->id, req->ops[0]->evict);
		frame_free(frame);
		return;
	}

	if (req->n_ops > lim->max_ops_per_batch) {
		char msg[200];

		ops_over_limit(msg, sizeof(msg), req->n_ops,
			       lim->max_ops_per_batch);
		refuse_unrun(s, req->id, attach_count(req), GPUCMD_ELIMIT, msg);
		frame_free(frame);
		return;
	}
	if (loop_answers(s, req)) {
		answer_on_loop(s, req);
		frame_free(frame);
		return;
	}
	rc = take_fds(s, req, &fds, &nfds);
	if (rc != 0) {
		frame_free(frame);
		return;
	}
	if (dispatch_needs_stream(req))
		note_stream(s, req->stream);
	cost = request_cost(s, frame, len);
	if (needs_compile(s, req) && start_compile(s, frame, fds, nfds, cost))
		return;
	submit(s, frame, fds, nfds, NULL, cost);
}

static void handle_frame(struct session *s, Gpucmd__Frame *frame, size_t len)
{
	if (frame == NULL) {
		session_refuse(
			s, GPUCMD_EPROTO,
			"a frame body of %zu bytes is not a valid gpucmd "
			"message: is the client's libgpucmd from this "
			"release?",
			len);
		return;
	}
	if (s->state == SESSION_HELLO) {
		if (frame->msg_case == GPUCMD__FRAME__MSG_HELLO)
			handle_hello(s, frame->hello);
		else
			session_refuse(s, GPUCMD_EPROTO,
				       "the first frame must be a Hello "
				       "(got message %d)",
				       (int)frame->msg_case);
		frame_free(frame);
		return;
	}
	if (frame->msg_case != GPUCMD__FRAME__MSG_REQUEST) {
		session_refuse(s, GPUCMD_EPROTO,
			       "expected a Request (got message %d)",
			       (int)frame->msg_case);
		frame_free(frame);
		return;
	}
	handle_request(s, frame, len);
}

/*
 * A large request is counted before it is decoded: protobuf-c turns each
 * small op into tens of times its bytes (a 64 MiB frame of empty ops took
 * 3 GiB and stalled the loop for seconds), so one over max_ops_per_batch,
 * or with a kernel of more arguments than any kernel takes, is refused
 * unread, with the same per-batch answer a smaller frame gets after its
 * decoding.  The count gives its id and its attaches, whose descriptors
 * go with it.  True when the frame was answered (or the connection
 * refused).
 */
static bool too_large_to_decode(struct session *s, const uint8_t *body,
				size_t len)
{
	uint32_t max_ops = s->server->cfg.limits.max_ops_per_batch;
	uint64_t limit = len + (uint64_t)max_ops * SESSION_DECODE_PER_OP;
	struct frame_request_counts c;
	uint64_t need, fields;
	bool counted;
	char msg[320];
	int code;

	if (len < SESSION_COUNT_FIRST || s->state != SESSION_READY)
		return false;
	counted = frame_request_counts(body, len, &c);
	if (counted && c.nops > max_ops) {
		code = GPUCMD_ELIMIT;
		ops_over_limit(msg, sizeof(msg), c.nops, max_ops);
	} else if (counted && c.max_args > SESSION_MAX_KERNEL_ARGS) {
		code = GPUCMD_EINVAL;
		snprintf(msg, sizeof(msg),
			 "a kernel op with %zu arguments: "
			 "kernels take at most 32",
			 c.max_args);
	} else if ((need = frame_decoded_bound(body, len, limit, &fields)) >
		   limit) {
		code = GPUCMD_ELIMIT;
		snprintf(msg, sizeof(msg),
			 "a frame of %zu bytes whose first %llu fields would "
			 "take %llu bytes to decode, over the %llu the "
			 "daemon gives it (its size and %u bytes for each op "
			 "of max_ops_per_batch): send fewer fields, or fields "
			 "this daemon knows, per frame",
			 len, (unsigned long long)fields,
			 (unsigned long long)need, (unsigned long long)limit,
			 SESSION_DECODE_PER_OP);
		if (!counted) {
			/* Not a request: nothing to answer but the close. */
			session_refuse(s, code, "%s", msg);
			return true;
		}
	} else {
		return false;
	}
	refuse_unrun(s, c.id, c.attaches, code, msg);
	return true;
}

/* A frame in the read buffer: decoded into memory of its own. */

static void handle_body(struct session *s, const uint8_t *body, size_t len)
{
	if (too_large_to_decode(s, body, len))
		return;
	handle_frame(s, frame_decode(body, len), len);
}

/*
 * A large frame read into a buffer of its own (frame_buf_alloc): the frame
 * takes it over, and an inline write's bytes are not copied again.
 */
static void handle_owned_body(struct session *s, uint8_t *body, size_t len)
{
	if (too_large_to_decode(s, body, len)) {
		frame_buf_free(body);
		return;
	}
	handle_frame(s, frame_decode_owned(body, len), len);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct session *s = h->data;

	(void)suggested;
	if (s->body != NULL) {
		/* A large frame: read straight into its body. */
		*buf = uv_buf_init((char *)s->body + s->body_have,
				   s->body_len - s->body_have);
		return;
	}
	if (s->rbuf == NULL) {
		s->rbuf = malloc(SESSION_RBUF);
		s->rcap = s->rbuf != NULL ? SESSION_RBUF : 0;
	}
	*buf = uv_buf_init((char *)s->rbuf + s->rlen,
			   (unsigned int)(s->rcap - s->rlen));
}

/*
 * Whether a whole frame of len body bytes waits for its turn: a large one,
 * unless its turn came (a frame let in before the Hello never does).
 */
static bool needs_turn(const struct session *s, uint32_t len)
{
	return s->state == SESSION_READY && len > SESSION_TURN_BYTES &&
	       !s->turn_granted;
}

/* The next frame waits for the loop's turn (server.c: on_turns). */
static void wait_turn(struct session *s)
{
	s->turn_wait = true;
	server_turn_wait(s->server, s);
	if (s->body != NULL)
		stop_reading(s);
}

/* The large frame s->body collected is whole: decode and handle it. */
static void finish_body(struct session *s)
{
	uint8_t *body = s->body;

	s->body = NULL;
	s->frame_at = s->body_at;
	s->turn_granted = false;
	handle_owned_body(s, body, s->body_len);
	if (s->compiling == NULL)
		budget_give_back(s);
}

/*
 * Parse every whole frame in rbuf, up to max_in_flight requests in flight
 * (the rest wait there until answers come: session_reply); start a body
 * for a large one.
 */
static void parse_frames(struct session *s)
{
	size_t off = s->rpos;

	if (s->turn_wait) {
		if (turn_holds_reading(s))
			stop_reading(s);
		return;
	}
	s->budget_wait = false;
	while (s->state != SESSION_CLOSING && s->compiling == NULL &&
	       s->in_flight < s->server->cfg.limits.max_in_flight &&
	       s->rlen - off >= FRAME_HEADER_SIZE) {
		struct frame_header hdr;
		char msg[256];
		size_t have;
		int rc;

		frame_header_unpack(s->rbuf + off, &hdr);
		rc = frame_header_check(&hdr,
					s->state == SESSION_HELLO ?
						SESSION_HELLO_MAX_BYTES :
						s->server->cfg.limits
							.max_frame_bytes,
					msg, sizeof(msg));
		if (rc == GPUCMD_ELIMIT && s->state == SESSION_HELLO)
			snprintf(msg, sizeof(msg),
				 "a first frame of %u bytes is over the limit "
				 "of %d bytes before a Hello (a Hello is a few "
				 "hundred)",
				 hdr.length, SESSION_HELLO_MAX_BYTES);
		if (rc != 0) {
			session_refuse(s, rc, "%s", msg);
			return;
		}
		have = s->rlen - off - FRAME_HEADER_SIZE;
		if (needs_turn(s, hdr.length) && have >= hdr.length) {
			wait_turn(s);
			break;
		}
		if (over_byte_budget(s, hdr.length)) {
			/*
			 * It waits, unread, until earlier batches complete
			 * (session_reply): behind a long kernel a client could
			 * otherwise make the daemon hold max_in_flight frames
			 * of max_frame_bytes.
			 */
			s->budget_wait = true;
			stop_reading(s);
			break;
		}
		/*
		 * Let in, the frame holds its place in the service's budget
		 * until it is submitted or answered: a large body being read
		 * (or a request compiling) counts for the other connections.
		 */
		if (s->state == SESSION_READY) {
			s->admitted = FRAME_HEADER_SIZE + (uint64_t)hdr.length;
			s->econn.service->bytes_admitted += s->admitted;
		}
		/* rbuf holds the last rlen bytes read. */
		s->frame_at = s->rx_bytes - s->rlen + off;
		if (have >= hdr.length) {
			/* A turn is for the frame that waited: the first one. */
			s->turn_granted = false;
			off += FRAME_HEADER_SIZE;
			handle_body(s, s->rbuf + off, hdr.length);
			off += hdr.length;
			if (s->compiling == NULL)
				budget_give_back(s);
			continue;
		}
		if (FRAME_HEADER_SIZE + (size_t)hdr.length <= s->rcap) {
			/* Looked at again once the rest arrives. */
			budget_release(s);
			break;
		}
		/* Larger than the buffer: collect it on its own. */
		s->body = frame_buf_alloc(hdr.length);
		if (s->body == NULL) {
			session_refuse(s, GPUCMD_ENOMEM,
				       "the daemon cannot hold a frame of %u "
				       "bytes now: retry with smaller batches",
				       hdr.length);
			return;
		}
		s->body_len = hdr.length;
		s->body_have = (uint32_t)have;
		s->body_at = s->frame_at;
		s->body_begun_ms = uv_now(s->server->loop);
		s->body_ticked = s->body_have;
		memcpy(s->body, s->rbuf + off + FRAME_HEADER_SIZE, have);
		off = s->rlen;
		break;
	}
	/*
	 * What is left goes to the front of rbuf, so a partial frame has the
	 * whole of it to grow into; but while a frame waits for its turn, only
	 * once little room is left: the turns take one frame at a time, and
	 * moving the rest at each would copy a full buffer about as many
	 * times as it holds frames.
	 */
	if (s->turn_wait && s->rcap - s->rlen >= SESSION_TURN_ROOM) {
		s->rpos = off;
	} else if (off > 0 && s->rbuf != NULL) {
		memmove(s->rbuf, s->rbuf + off, s->rlen - off);
		s->rlen -= off;
		s->rpos = 0;
	}
	if (turn_holds_reading(s))
		stop_reading(s);
}

void session_expire_unread(struct session *s)
{
	uint64_t written;

	if (s->state != SESSION_READY || s->handle_closed)
		return;
	note_unwritten(s);
	written = s->queued_total - s->unwritten;
	if (s->unwritten > 0 && s->unwritten_ticked > 0 &&
	    written == s->written_ticked && over_unwritten(s, 1)) {
		/* This one, not the worst: that one may be reading. */
		char why[320];

		snprintf(why, sizeof(why),
			 "the client does not read its replies: %llu bytes "
			 "queued for it and none read since the check before; "
			 "its service's connections have %llu unread, over "
			 "the service's max_bytes_in_flight %llu",
			 (unsigned long long)s->unwritten,
			 (unsigned long long)s->econn.service->bytes_unwritten,
			 (unsigned long long)atomic_load(
				 &s->econn.service->max_bytes_in_flight));
		session_close(s, why);
		return;
	}
	s->written_ticked = written;
	s->unwritten_ticked = s->unwritten;
}

/* Whether bytes the client sent wait in the socket, not yet read. */
static bool socket_waiting(const struct session *s)
{
	int waiting = 0;

	return s->fd >= 0 && ioctl(s->fd, FIONREAD, &waiting) == 0 &&
	       waiting > 0;
}

void session_expire_frame(struct session *s, uint64_t now_ms)
{
	uint32_t limit_s = s->server->cfg.limits.frame_timeout;
	uint64_t allowed_ms;
	uint32_t gained;

	/* Not while the daemon holds the rest back (a turn, a shutdown). */
	if (s->body == NULL || s->body_have >= s->body_len || !s->reading ||
	    s->state == SESSION_CLOSING || limit_s == 0)
		return;
	gained = s->body_have - s->body_ticked;
	s->body_ticked = s->body_have;
	allowed_ms = (uint64_t)limit_s * 1000 +
		     (uint64_t)s->body_len * 1000 /
			     ((uint64_t)SESSION_FRAME_MIB_PER_S << 20);
	if (now_ms - s->body_begun_ms < allowed_ms)
		return;
	/*
	 * Overdue.  A daemon slow to read is not the client's fault: bytes
	 * the client sent then still wait in the socket, or came steadily
	 * since the tick before (SESSION_FRAME_MIN_PROGRESS: a slow daemon
	 * under a sanitizer, a client that keeps up with it).  A socket with
	 * nothing waiting and little come means the client stopped, or
	 * trickles to keep the frame's place in its service's budget: ended.
	 */
	if (gained >= SESSION_FRAME_MIN_PROGRESS || socket_waiting(s))
		return;
	session_refuse(s, GPUCMD_EPROTO,
		       "a frame of %u bytes did not arrive whole within %.1f s "
		       "of its header (%u bytes came; [limits] frame_timeout "
		       "is %u s, plus 1 s for each %d MiB), and %u came "
		       "since the check before: the connection is closed; "
		       "send each frame whole once it has begun",
		       s->body_len, (double)allowed_ms / 1000.0, s->body_have,
		       limit_s, SESSION_FRAME_MIB_PER_S, gained);
}

/* What came from the socket, read by libuv or by session_read_direct. */
static void got_bytes(struct session *s, ssize_t nread)
{
	if (nread < 0 && s->turn_wait) {
		/*
		 * Frames read before the end wait for their turn: a client
		 * may send a batch and close without waiting for the answer,
		 * and the batch still runs, as when frames were decoded as
		 * they were read (resume_reading closes).
		 */
		s->read_end = true;
		s->read_end_why =
			nread == UV_EOF ? NULL : uv_strerror((int)nread);
		stop_reading(s);
		return;
	}
	if (nread == UV_EOF && s->state == SESSION_READY && s->in_flight > 0 &&
	    peer_reads_on(s)) {
		/*
		 * shutdown(SHUT_WR) after the last request, as a client that
		 * wants its replies may do: they go out first, and the close
		 * comes with the last (resume_reading).
		 */
		s->read_end = true;
		s->read_end_why = NULL;
		stop_reading(s);
		return;
	}
	if (nread == UV_EOF) {
		session_close(s, NULL);
		return;
	}
	if (nread < 0) {
		session_close(s, uv_strerror((int)nread));
		return;
	}
	if (nread == 0)
		return;
	s->rx_bytes += (uint64_t)nread;
	/* A client that sent one batch tends to send the next soon. */
	server_spin(s->server, false);
	server_note_read(s->server, s);
	if (s->body != NULL) {
		s->body_have += (uint32_t)nread;
		if (s->body_have < s->body_len)
			return;
		if (needs_turn(s, s->body_len)) {
			wait_turn(s);
			return;
		}
		finish_body(s);
		return;
	}
	if (s->rbuf == NULL) {
		session_close(s, "out of memory for the read buffer");
		return;
	}
	s->rlen += (size_t)nread;
	parse_frames(s);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
	struct session *s = stream->data;

	(void)buf;
	if (nread > 0 && !keep_pending_fds(s, (size_t)nread))
		return;
	got_bytes(s, nread);
}

/*
 * The descriptors of one recvmsg.  DESIGN.md has libuv receive a region's
 * memfd as a pending handle of the IPC pipe; that stays the way for every
 * read the poll makes.  session_read_direct reads around libuv, so it takes
 * the descriptors from the control message itself, into the same queue:
 * both ways keep the byte stream's order.  libuv takes up to 64 with a
 * read; so do we.
 */
static bool keep_cmsg_fds(struct session *s, struct msghdr *mh, size_t nread)
{
	bool ok = true;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c != NULL;
	     c = CMSG_NXTHDR(mh, c)) {
		size_t n;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
			if (!ok)
				close(fd);
			else
				ok = keep_fd(s, fd, nread);
		}
	}
	/*
	 * libuv drops such descriptors without a word when it reads; here the
	 * loss is seen, and the connection, whose attaches could no longer
	 * get the descriptors meant for them, is refused.
	 */
	if (ok && (mh->msg_flags & MSG_CTRUNC)) {
		unsigned long long open, limit;

		if (fds_short(s, &open, &limit)) {
			refuse_out_of_fds(s, open, limit);
			return false;
		}
		session_refuse(s, GPUCMD_EPROTO,
			       "descriptors that came with a message were "
			       "lost: more than %d in one message, or the "
			       "daemon is out of descriptors",
			       REGION_MAX_PER_CONNECTION);
		ok = false;
	}
	return ok;
}

/*
 * The loop's turn for s's large frame (server_turn_wait): decode and handle
 * it, then the frames behind it, up to the next large one, which waits for
 * another turn.
 */
void session_take_turn(struct session *s)
{
	if (!s->turn_wait || s->state == SESSION_CLOSING || s->draining)
		return;
	s->turn_wait = false;
	s->turn_granted = true;
	if (s->body != NULL && s->body_have == s->body_len)
		finish_body(s);
	else
		parse_frames(s);
	if (s->state != SESSION_CLOSING && !s->draining && may_take_more(s))
		resume_reading(s);
}

int session_read_direct(struct session *s)
{
	union {
		char buf[CMSG_SPACE(sizeof(int) * REGION_MAX_PER_CONNECTION)];
		struct cmsghdr align;
	} cmsg;
	struct msghdr mh;
	struct iovec iov;
	uv_buf_t buf;
	ssize_t n;

	if (!s->reading || s->fd < 0)
		return -1;
	on_alloc((uv_handle_t *)&s->pipe, 0, &buf);
	if (buf.base == NULL || buf.len == 0)
		return -1;
	iov.iov_base = buf.base;
	iov.iov_len = buf.len;
	memset(&mh, 0, sizeof(mh));
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = cmsg.buf;
	mh.msg_controllen = sizeof(cmsg.buf);
	do
		n = recvmsg(s->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return 0;
	if (n < 0) {
		got_bytes(s, -errno); /* libuv's codes are -errno here */
		return 1;
	}
	if (n == 0) {
		got_bytes(s, UV_EOF);
		return 1;
	}
	if (keep_cmsg_fds(s, &mh, (size_t)n))
		got_bytes(s, n);
	return 1;
}

/*
 * The peer's supplementary groups as they were when it connected
 * (SO_PEERGROUPS, like SO_PEERCRED), all of them: a group past some room
 * could be the one that grants a service or admin.  /proc/PID/status,
 * read now, could be another process's once the client has exited and
 * its pid is reused, so it is read only where the kernel (before 4.13)
 * cannot tell.
 */
static void read_groups(struct session *s)
{
	gid_t here[64], *g = here;
	socklen_t len = sizeof(here);
	char path[64], line[1024];
	size_t n, room = sizeof(s->groups_here) / sizeof(s->groups_here[0]);
	FILE *f;

	s->groups = s->groups_here;
	s->groups[0] = (uint32_t)s->gid;
	s->ngroups = 1;
	if (s->fd < 0)
		return;
	if (getsockopt(s->fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) == 0) {
		/* All of them fit here. */
	} else if (errno == ERANGE) {
		/* len is now what they take. */
		g = malloc(len);
		if (g == NULL || getsockopt(s->fd, SOL_SOCKET, SO_PEERGROUPS, g,
					    &len) != 0) {
			log_warn("connection %llu (%s): cannot read its %zu "
				 "supplementary groups: it is taken as in its "
				 "primary group only",
				 (unsigned long long)s->id, s->peer,
				 (size_t)len / sizeof(gid_t));
			free(g);
			return;
		}
	} else if (errno == ENOPROTOOPT) {
		goto proc;
	} else {
		return;
	}
	n = len / sizeof(g[0]);
	if (n + 1 > room) {
		uint32_t *heap = malloc((n + 1) * sizeof(*heap));

		if (heap == NULL) {
			log_warn("connection %llu (%s): no memory for its %zu "
				 "supplementary groups: only the first %zu "
				 "count",
				 (unsigned long long)s->id, s->peer, n,
				 room - 1);
			n = room - 1;
		} else {
			heap[0] = s->groups[0];
			s->groups = heap;
		}
	}
	for (size_t i = 0; i < n; i++)
		s->groups[s->ngroups++] = (uint32_t)g[i];
	if (g != here)
		free(g);
	return;
proc:
	snprintf(path, sizeof(path), "/proc/%d/status", (int)s->pid);
	f = fopen(path, "re");
	if (f == NULL)
		return;
	while (fgets(line, sizeof(line), f) != NULL) {
		char *p, *end;

		if (strncmp(line, "Groups:", 7) != 0)
			continue;
		p = line + 7;
		for (;;) {
			unsigned long gid = strtoul(p, &end, 10);

			if (end == p || s->ngroups == room)
				break;
			s->groups[s->ngroups++] = (uint32_t)gid;
			p = end;
		}
		break;
	}
	fclose(f);
}

bool session_is_admin(const struct session *s)
{
	int64_t admin_gid = s->server->admin_gid;

	if (s->uid == 0 || s->uid == geteuid())
		return true;
	for (size_t i = 0; admin_gid >= 0 && i < s->ngroups; i++)
		if (s->groups[i] == (uint32_t)admin_gid)
			return true;
	return false;
}

void session_identify(struct session *s)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	uv_os_fd_t fd;

	s->fd = -1;
	if (uv_fileno((uv_handle_t *)&s->pipe, &fd) == 0)
		s->fd = fd;
	if (s->fd >= 0 &&
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
		s->uid = cred.uid;
		s->gid = cred.gid;
		s->pid = cred.pid;
	} else {
		s->uid = (uid_t)-1;
		s->gid = (gid_t)-1;
	}
	snprintf(s->peer, sizeof(s->peer), "pid %d uid %d", (int)s->pid,
		 (int)s->uid);
	read_groups(s);
}

int session_start(struct session *s)
{
	s->state = SESSION_HELLO;
	s->accepted_ms = uv_now(s->server->loop);
	resume_reading(s);
	if (!s->reading) {
		session_close(s, "cannot read from the socket");
		return GPUCMD_EDISCONNECTED;
	}
	return 0;
}
