/*
 * connection.c - the client's socket to gpucmdd.
 *
 * Everything is blocking I/O on the caller's thread: a connection is owned
 * by one thread at a time (gpucmd.h), so there is nothing to lock and no
 * event loop to drive.  The socket is opened close-on-exec and written with
 * MSG_NOSIGNAL, so a daemon that goes away shows up as
 * GPUCMD_EDISCONNECTED instead of a SIGPIPE that kills the client.
 *
 * Every submitted request owns a slot until its response is collected.  The
 * slots are the in-flight count (max_in_flight from the Welcome) and the
 * place where a response that arrives out of order waits for its own
 * gpucmd_wait.  Counting uncollected responses, not only unanswered
 * requests, keeps the client's count deterministic and never below the
 * daemon's, so a submit is refused here before the daemon would have to.
 *
 * A slot also remembers which shared regions its request releases: the
 * region leaves the table (and this process's address space) when the
 * response shows that the release ran, not when it was merely asked for,
 * so a batch that fails before its release keeps the region usable.
 */
#include "connection.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "batch.h"
#include "frame.h"
#include "regions.h"
#include "spin.h"

/* The service a connection speaks for when the caller names none. */
#define CONN_DEFAULT_SERVICE "default"
/* The GPUCMD_CONNECT_* flags this library knows. */
#define CONN_FLAGS ((unsigned)GPUCMD_CONNECT_OBSERVE)

/* A region_release op of a request: its index and the region. */
struct conn_release {
	size_t index;
	uint64_t region;
};

struct conn_slot {
	uint64_t id;
	bool awaits_device;   /* the reply waits for device work (fenced) */
	bool abandoned;	      /* its wait timed out: drop the reply */
	bool detached;	      /* ...or nobody waits for it: count a failure */
	Gpucmd__Frame *frame; /* NULL until the response is read */
	struct conn_release *releases; /* settled when collected */
	size_t nreleases;
};

/* Unwaited answers outstanding before a submit looks for them (conn_submit). */
#define CONN_DRAIN_AT 32

/* Read-ahead of the receive side; larger reads go straight to the body. */
#define CONN_RBUF 4096
/* Frame bodies this large are decoded in place (frame_decode_owned). */
#define CONN_OWNED_MIN (64u << 10)

struct gpucmd_conn {
	int fd;
	/*
	 * The process that opened the connection, and conn_forks then: a
	 * fork()ed child shares the socket and the regions' memory, and must
	 * not use them (conn_check_process).
	 */
	pid_t pid;
	unsigned forks;
	struct gpucmd_info info;
	uint64_t next_id;
	struct conn_slot *slots;
	size_t nslots;
	size_t slots_cap;
	size_t nabandoned; /* slots whose answer nobody will collect */
	/*
	 * Detached requests (gpucmd_submit_detached) that failed, since
	 * gpucmd_detached_failures last asked, and the first one's code and
	 * sentence.
	 */
	uint64_t detached_failed;
	int detached_code;
	char detached_message[640];
	int dead; /* 0, or the code the connection died with */
	/*
	 * Why (gpucmd_conn_error): room for the daemon's whole sentence (an
	 * Error frame's, up to 511 bytes: session_refuse).
	 */
	char dead_message[512];
	int timeout_ms; /* of every wait, -1: none (gpucmd_set_timeout) */
	/*
	 * Of the next recv of the frame being read, 0: none.  Each recv that
	 * brings bytes moves it to CONN_STALL_MS (or the timeout, if longer)
	 * from then: a frame that keeps coming is read whole, one that stops
	 * kills the connection.
	 */
	uint64_t deadline_ns;
	struct regions regions; /* shared regions attached by this process */
	struct batch_cache batches; /* spent batches kept for the next */
	/*
	 * Kept from frame to frame, so that large transfers do not map and
	 * fault in fresh pages each time (up to CONN_KEEP_BYTES).
	 */
	struct frame_pieces out; /* the request being sent */
	bool sending;  /* out is going: frames read meanwhile keep it */
	uint8_t *body; /* the frame body being read */
	size_t body_cap;
	/*
	 * Bytes read ahead of the frame being read: one recv takes a small
	 * frame's header and body together (and what follows), not one recv
	 * for each.
	 */
	uint8_t rbuf[CONN_RBUF];
	size_t rhead, rtail;
	char last_message[768]; /* gpucmd_last_message */
	unsigned spin_us;	/* $GPUCMD_SPIN_US: watch before blocking */
};

/* Least time a frame that has begun may pause before it counts as stopped. */
#define CONN_STALL_MS 1000

/* Microseconds a wait watches the socket before it blocks (spin.h). */
#define CONN_SPIN_US SPIN_DEFAULT_US

/* Connections of the process not yet closed (conn_none_open). */
static atomic_int conns_open;

/*
 * Moved in each child of fork() (pthread_atfork), so that the calls on the
 * hot path (every submit and wait) see that they may be in another process
 * with a load and a compare: getpid() is a system call in glibc 2.25 and
 * later (185 ns on the test machine, against a 10-30 us round trip).  A
 * child that pthread_atfork does not see (_Fork, a raw clone) is caught by
 * getpid() in the calls that write shared memory, and in gpucmd_close.
 */
static atomic_uint conn_forks;
static pthread_once_t conn_atfork_once = PTHREAD_ONCE_INIT;

static void conn_forked_child(void)
{
	atomic_fetch_add_explicit(&conn_forks, 1, memory_order_relaxed);
}

static void conn_watch_forks(void)
{
	(void)pthread_atfork(NULL, NULL, conn_forked_child);
}

/*
 * Whether c was opened by another process, which this one is a fork() of.
 * Unless sure, only when a fork was seen since c was opened is getpid()
 * asked.
 */
static bool conn_foreign(const struct gpucmd_conn *c, bool sure)
{
	if (!sure &&
	    atomic_load_explicit(&conn_forks, memory_order_relaxed) == c->forks)
		return false;
	return getpid() != c->pid;
}

int conn_check_process(struct gpucmd_conn *c, bool sure)
{
	if (!conn_foreign(c, sure))
		return 0;
	return conn_refuse(c, GPUCMD_EINVAL,
			   "this connection was opened by process %ld, not "
			   "this one (%ld): after fork() a child must open its "
			   "own with gpucmd_connect (and may gpucmd_close the "
			   "inherited one, which leaves the parent's alone)",
			   (long)c->pid, (long)getpid());
}

/* Pooled frame buffers unused this long are freed (frame_buf_trim). */
#define CONN_BUF_IDLE_NS (1000000000ull)

/* Buffers larger than this are freed after their frame. */
#define CONN_KEEP_BYTES (16u << 20)

static void conn_lose_detached(struct gpucmd_conn *c);

/* The connection is over: code (the first one sticks) and why. */
static int conn_fail_why(struct gpucmd_conn *c, int code, const char *why)
{
	if (c->dead == 0) {
		c->dead = code;
		snprintf(c->dead_message, sizeof(c->dead_message), "%s",
			 why != NULL && why[0] != '\0' ? why :
							 gpucmd_strerror(code));
		conn_lose_detached(c);
		/*
		 * Given up on this side: the daemon sees the end now and
		 * frees what the connection held, not at gpucmd_close.
		 */
		if (code == -ETIMEDOUT)
			(void)shutdown(c->fd, SHUT_RDWR);
	}
	return c->dead;
}

static int conn_fail(struct gpucmd_conn *c, int code)
{
	return conn_fail_why(c, code, NULL);
}

/* CLOCK_MONOTONIC ns when a wait of timeout_ms ends; 0 when it never does. */
static uint64_t deadline_after(int timeout_ms)
{
	if (timeout_ms < 0)
		return 0;
	return spin_now_ns() + (uint64_t)timeout_ms * 1000000u + 1;
}

/* How long a frame that has begun may pause before it is given up. */
static int stall_ms(const struct gpucmd_conn *c)
{
	return c->timeout_ms > CONN_STALL_MS ? c->timeout_ms : CONN_STALL_MS;
}

/* ...counted from now. */
static uint64_t stall_deadline(const struct gpucmd_conn *c)
{
	return deadline_after(stall_ms(c));
}

/* Milliseconds from now to deadline_ns, rounded up; 0 once it passed. */
static int ms_left(uint64_t deadline_ns)
{
	uint64_t now = spin_now_ns();

	if (now >= deadline_ns)
		return 0;
	return (int)((deadline_ns - now + 999999u) / 1000000u);
}

/*
 * Wait until fd has events (or an error or its end, which the next call
 * reports) or the deadline (0: none) passes: 1, or 0 when it passed.  A
 * deadline already past still looks once: what has arrived is there.
 */
static int wait_fd(int fd, short events, uint64_t deadline_ns)
{
	struct pollfd p = { .fd = fd, .events = events };

	if (deadline_ns == 0)
		return 1;
	for (;;) {
		int n = poll(&p, 1, ms_left(deadline_ns));

		if (n > 0 || (n < 0 && errno != EINTR))
			return 1;
		if (n == 0)
			return 0;
	}
}

static int wait_readable(int fd, uint64_t deadline_ns)
{
	return wait_fd(fd, POLLIN, deadline_ns);
}

/*
 * One recv for the frame being read, waiting no later than c->deadline_ns
 * (0: for ever), which bytes push back; 0 for EOF, -ETIMEDOUT, or the
 * code.
 */
static ssize_t recv_some(struct gpucmd_conn *c, void *buf, size_t len)
{
	if (!wait_readable(c->fd, c->deadline_ns))
		return -ETIMEDOUT;
	for (;;) {
		ssize_t n = recv(c->fd, buf, len, 0);

		if (n > 0 && c->deadline_ns != 0)
			c->deadline_ns = stall_deadline(c);
		if (n >= 0)
			return n;
		if (errno != EINTR)
			return errno == ECONNRESET ? GPUCMD_EDISCONNECTED :
						     -errno;
	}
}

/*
 * len bytes of the stream into buf: first what was read ahead, then
 * straight from the socket when the rest is large, else through the
 * read-ahead buffer.  0, GPUCMD_EDISCONNECTED when the peer closed before
 * len bytes, or -errno.
 */
static int conn_read(struct gpucmd_conn *c, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len > 0) {
		size_t have = c->rtail - c->rhead;
		ssize_t n;

		if (have > 0) {
			size_t k = have < len ? have : len;

			memcpy(p, c->rbuf + c->rhead, k);
			c->rhead += k;
			p += k;
			len -= k;
			continue;
		}
		if (len >= sizeof(c->rbuf)) {
			n = recv_some(c, p, len);
			if (n > 0) {
				p += n;
				len -= (size_t)n;
			}
		} else {
			n = recv_some(c, c->rbuf, sizeof(c->rbuf));
			c->rhead = 0;
			c->rtail = n > 0 ? (size_t)n : 0;
		}
		if (n < 0)
			return (int)n;
		if (n == 0)
			return GPUCMD_EDISCONNECTED;
	}
	return 0;
}

/* Pieces per sendmsg; IOV_MAX is 1024, a batch may have more. */
#define CONN_IOV 64

static int conn_recv_one(struct gpucmd_conn *c, unsigned spin_us,
			 uint64_t deadline_ns);

/*
 * While a send waits for room: 1 when the socket takes bytes again, 0 when
 * deadline_ns (0: none) passed first, or -errno.  With read_ahead, the
 * replies that arrive meanwhile are read and filed (conn_recv_one): the
 * daemon may hold this service's requests back until its clients read
 * what they were sent, so a client that only sent would wait on itself.
 * A frame read moves *deadline_ns as bytes sent do once the request has
 * begun (begun), not before: a request the daemon does not begin to take
 * in time is still not sent.  A connection that dies while reading ends
 * the send with c->dead.
 */
static int wait_room(struct gpucmd_conn *c, bool read_ahead, bool begun,
		     uint64_t *deadline_ns, int stall_ms)
{
	for (;;) {
		struct pollfd p = {
			.fd = c->fd,
			.events = POLLOUT | (read_ahead ? POLLIN : 0),
		};
		int n = poll(&p, 1,
			     *deadline_ns != 0 ? ms_left(*deadline_ns) : -1);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return 0;
		if ((p.revents & (POLLOUT | POLLERR)) != 0)
			return 1; /* the next sendmsg says */
		if (!read_ahead || (p.revents & (POLLIN | POLLHUP)) == 0)
			return 1;
		/* A frame has begun, or the peer is gone: read it. */
		if (conn_recv_one(c, 0,
				  *deadline_ns != 0 ? deadline_after(stall_ms) :
						      0) < 0 &&
		    c->dead)
			return 1; /* write_pieces sees c->dead */
		if (*deadline_ns != 0 && begun)
			*deadline_ns = deadline_after(stall_ms);
	}
}

/*
 * Send the encoded frame p, its pieces gathered by sendmsg (large payloads
 * go from the caller's buffers into the socket, copied by nobody else); the
 * nfds descriptors fds ride with the first sendmsg (SCM_RIGHTS), so they
 * reach the daemon with the frame's first byte.  The kernel delivers the
 * descriptors with the bytes of that call, and a stream socket never merges
 * them into bytes of another, which is how the daemon ties them to the
 * frame that announced them.
 *
 * deadline_ns (0: none) bounds the wait for the first byte to go; each
 * sendmsg that sends some moves it to stall_ms from then, as recv_some does
 * for a frame being read: a large request the daemon keeps taking is sent
 * whole however long it takes, one it stops taking is given up.  A full
 * socket is waited on by wait_room, which reads replies meanwhile when
 * read_ahead (after the handshake).
 */
static int write_pieces(struct gpucmd_conn *c, const struct frame_pieces *p,
			const int *fds, size_t nfds, uint64_t deadline_ns,
			int stall_ms, bool read_ahead, bool *partial)
{
	size_t ctl_len = nfds > 0 ? CMSG_SPACE(nfds * sizeof(int)) : 0;
	size_t piece = 0, skip = 0; /* the first byte not sent yet */
	void *ctl = NULL;
	int err = 0;

	if (ctl_len > 0) {
		struct cmsghdr *cm;

		/* calloc's alignment suits a cmsghdr; it is the first one. */
		ctl = calloc(1, ctl_len);
		if (ctl == NULL)
			return -ENOMEM;
		cm = ctl;
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
	}
	while (piece < p->n) {
		struct iovec iov[CONN_IOV];
		struct msghdr mh = { .msg_iov = iov,
				     .msg_control = ctl,
				     .msg_controllen =
					     ctl != NULL ? ctl_len : 0 };
		size_t k = 0;
		ssize_t n;

		if (c->dead) {
			/* A reply read meanwhile was the daemon's last word. */
			err = c->dead;
			*partial = piece > 0 || skip > 0;
			break;
		}
		for (size_t i = piece; i < p->n && k < CONN_IOV; i++, k++) {
			size_t off = i == piece ? skip : 0;

			iov[k].iov_base =
				(void *)(frame_piece_data(p, i) + off);
			iov[k].iov_len = p->v[i].len - off;
		}
		mh.msg_iovlen = k;
		/* A full socket is waited on with poll (wait_room). */
		n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			bool begun = piece > 0 || skip > 0;
			int w = wait_room(c, read_ahead, begun, &deadline_ns,
					  stall_ms);

			if (w > 0)
				continue;
			err = w < 0 ? w : -ETIMEDOUT;
			*partial = begun;
			break;
		}
		if (n < 0) {
			err = -errno;
			/* Part of the frame is out: the stream is out of step. */
			*partial = piece > 0 || skip > 0;
			break;
		}
		/* Sent once: the rest of the bytes go without them. */
		free(ctl);
		ctl = NULL;
		if (deadline_ns != 0 && n > 0)
			deadline_ns = deadline_after(stall_ms);
		/* Empty pieces are passed over, sent or not. */
		while (piece < p->n && (n > 0 || p->v[piece].len == skip)) {
			size_t left = p->v[piece].len - skip;

			if ((size_t)n < left) {
				skip += (size_t)n;
				break;
			}
			n -= (ssize_t)left;
			piece++;
			skip = 0;
		}
	}
	free(ctl);
	return err;
}

/* $GPUCMD_SPIN_US (0 to 10000), else CONN_SPIN_US. */
static unsigned spin_setting(void)
{
	const char *env = getenv("GPUCMD_SPIN_US");
	unsigned long v;
	char *end;

	if (env == NULL || env[0] == '\0')
		return CONN_SPIN_US;
	v = strtoul(env, &end, 10);
	return *end == '\0' && v <= 10000 ? (unsigned)v : CONN_SPIN_US;
}

/* A frame body that does not decode: GPUCMD_EPROTO, and why in msg. */
static int bad_body(uint32_t len, char *msg, size_t msg_len)
{
	if (msg != NULL)
		snprintf(msg, msg_len,
			 "the daemon sent a frame body of %u "
			 "bytes that is not a gpucmd message",
			 len);
	return GPUCMD_EPROTO;
}

/*
 * Read one whole frame, its body into *body (grown as needed and kept for
 * the next frame).  Any failure leaves the byte stream at an unknown
 * place, so the caller must treat it as the end of the connection.
 */
static int read_frame(struct gpucmd_conn *c, uint32_t max_body,
		      Gpucmd__Frame **out, char *msg, size_t msg_len)
{
	uint8_t head[FRAME_HEADER_SIZE];
	struct frame_header hdr;
	Gpucmd__Frame *f;
	int r;

	r = conn_read(c, head, sizeof(head));
	if (r < 0)
		return r;
	frame_header_unpack(head, &hdr);
	r = frame_header_check(&hdr, max_body, msg, msg_len);
	if (r == GPUCMD_ELIMIT) {
		/*
		 * Not a limit of this side's to respect: a daemon announces no
		 * more than the protocol allows, so the bytes are not the
		 * protocol (a runaway length, a stream out of step).
		 */
		if (msg != NULL)
			snprintf(
				msg, msg_len,
				"the daemon announced a frame "
				"body of %u bytes, over the %u this side "
				"accepts: it does not speak the gpucmd protocol",
				hdr.length, max_body);
		r = GPUCMD_EPROTO;
	}
	if (r < 0)
		return r;
	if (hdr.length >= CONN_OWNED_MIN) {
		/*
		 * A large frame (an inline read's data): read into a buffer of
		 * its own that the decoded frame keeps, so the bytes are not
		 * copied again, and that goes back to frame.c's pool with the
		 * response.
		 */
		uint8_t *own = frame_buf_alloc(hdr.length);

		if (own == NULL)
			return -ENOMEM;
		r = conn_read(c, own, hdr.length);
		if (r < 0) {
			frame_buf_free(own);
			return r;
		}
		f = frame_decode_owned(own, hdr.length);
		if (f == NULL)
			return bad_body(hdr.length, msg, msg_len);
		*out = f;
		return 0;
	}
	if (hdr.length > c->body_cap || c->body == NULL) {
		uint8_t *b = malloc(hdr.length > 0 ? hdr.length : 1);

		if (b == NULL)
			return -ENOMEM;
		free(c->body);
		c->body = b;
		c->body_cap = hdr.length;
	}
	r = conn_read(c, c->body, hdr.length);
	if (r < 0)
		return r;
	f = frame_decode(c->body, hdr.length);
	if (f == NULL)
		return bad_body(hdr.length, msg, msg_len);
	*out = f;
	return 0;
}

/* After a frame: a body buffer much larger than usual is given back. */
static void trim_buffers(struct gpucmd_conn *c)
{
	if (c->body_cap > CONN_KEEP_BYTES) {
		free(c->body);
		c->body = NULL;
		c->body_cap = 0;
	}
	if (c->out.cap > CONN_KEEP_BYTES && !c->sending)
		frame_pieces_free(&c->out);
	/*
	 * Large responses and ops come from frame.c's pool (read_frame,
	 * batch.c); its spares go back once none was taken for a second.
	 */
	frame_buf_trim(CONN_BUF_IDLE_NS);
}

static int write_frame(struct gpucmd_conn *c, const Gpucmd__Frame *f,
		       uint32_t max_body, const int *fds, size_t nfds)
{
	int r = frame_pieces_encode(&c->out, f);

	if (r == 0 && c->out.total - FRAME_HEADER_SIZE > max_body)
		r = GPUCMD_ELIMIT;
	if (r == 0) {
		bool partial = false;

		/* Replies are read while it waits, after the handshake. */
		c->sending = true;
		r = write_pieces(c, &c->out, fds, nfds,
				 deadline_after(c->timeout_ms), stall_ms(c),
				 f->msg_case == GPUCMD__FRAME__MSG_REQUEST,
				 &partial);
		c->sending = false;
		if (partial && r == -ETIMEDOUT)
			r = conn_fail_why(c, r,
					  "the daemon stopped reading in "
					  "the middle of a request for longer "
					  "than the timeout; the connection "
					  "is closed");
		else if (partial && r != -EPIPE && r != -ECONNRESET)
			r = conn_fail_why(c, r,
					  "sending a request failed after "
					  "part of it went out; the connection "
					  "is closed");
		/*
		 * A peer gone half way (the daemon evicted the connection, or
		 * stopped) is left to the caller, who reads the Error frame
		 * that says why before anything else is sent: the stream
		 * cannot carry another request, but what the daemon wrote
		 * before it closed is still there to read.
		 */
	}
	trim_buffers(c);
	return r;
}

/* The code carried by an Error frame; a daemon that sends none is broken. */
static int error_code(const Gpucmd__Error *e)
{
	if (e == NULL || e->code >= 0)
		return GPUCMD_EPROTO;
	return e->code;
}

static struct conn_slot *slot_find(struct gpucmd_conn *c, uint64_t id)
{
	for (size_t i = 0; i < c->nslots; i++)
		if (c->slots[i].id == id)
			return &c->slots[i];
	return NULL;
}

/* Forget slot s: its frame, its releases, its place. */
static void slot_drop(struct gpucmd_conn *c, struct conn_slot *s)
{
	frame_free(s->frame);
	free(s->releases);
	*s = c->slots[--c->nslots];
}

static void slot_settle(struct gpucmd_conn *c, struct conn_slot *s);

/* The answer of a detached request came: count it if it failed. */
static void note_detached(struct gpucmd_conn *c, const Gpucmd__Response *r)
{
	if (r->error == NULL || r->error->code == 0)
		return;
	if (c->detached_failed++ > 0)
		return;
	c->detached_code = r->error->code;
	snprintf(c->detached_message, sizeof(c->detached_message),
		 "detached request %llu failed at op %u: %s",
		 (unsigned long long)r->id, r->failed_index,
		 r->error->message != NULL ? r->error->message : "");
}

/*
 * The connection died with detached requests unanswered: whether they ran
 * is not known, and no answer will say, so each counts as a failure with
 * the connection's code and why (gpucmd_detached_failures) instead of
 * being lost without a word.  Their slots go, and those of abandoned
 * waits, which nobody asks about, with them: nabandoned is 0 again.  From
 * the end down, as slot_drop moves the last slot into the place it frees.
 */
static void conn_lose_detached(struct gpucmd_conn *c)
{
	for (size_t i = c->nslots; i-- > 0;) {
		struct conn_slot *s = &c->slots[i];

		if (!s->abandoned)
			continue;
		if (s->detached && c->detached_failed++ == 0) {
			c->detached_code = c->dead;
			snprintf(c->detached_message,
				 sizeof(c->detached_message),
				 "detached request %llu got no answer: the "
				 "connection ended first (%s); whether it ran "
				 "is not known",
				 (unsigned long long)s->id, c->dead_message);
		}
		slot_drop(c, s);
		c->nabandoned--;
	}
}

/*
 * Read one frame after the handshake and file it: a response goes to its
 * slot (or away, with its slot, when its wait was abandoned), an Error
 * frame (the daemon's last word before it closes) or anything unexpected
 * kills the connection.  -ETIMEDOUT when deadline_ns (0: none) passed
 * before a frame began, which leaves the connection as it was; a frame
 * that began and then stops for CONN_STALL_MS (or the timeout, if longer)
 * kills it.
 */
static int conn_recv_one(struct gpucmd_conn *c, unsigned spin_us,
			 uint64_t deadline_ns)
{
	Gpucmd__Frame *f;
	struct conn_slot *s;
	char why[256];
	int r;

	why[0] = '\0';

	/*
	 * The receive side accepts up to the protocol's hard ceiling, not the
	 * Welcome's max_frame_bytes: that limit is what the daemon accepts, and
	 * the answer to a read of nearly that many bytes is a few bytes longer.
	 * The daemon is trusted; the ceiling only stops a runaway length.
	 */
	if (c->rhead == c->rtail) {
		ssize_t n = spin_recv(c->fd, c->rbuf, sizeof(c->rbuf), spin_us);

		if (n < 0)
			return conn_fail(c, n == -ECONNRESET ?
						    GPUCMD_EDISCONNECTED :
						    (int)n);
		if (n == 0 && !wait_readable(c->fd, deadline_ns))
			return -ETIMEDOUT; /* nothing was read */
		c->rhead = 0;
		c->rtail = (size_t)n;
	}
	/* A frame has begun (or its bytes wait): it may only stall now. */
	c->deadline_ns = deadline_ns == 0 ? 0 : stall_deadline(c);
	r = read_frame(c, FRAME_MAX_BODY, &f, why, sizeof(why));
	c->deadline_ns = 0;
	trim_buffers(c);
	if (r == -ETIMEDOUT)
		return conn_fail_why(c, r,
				     "the daemon stopped in the middle "
				     "of a frame for longer than the timeout; "
				     "the connection is closed");
	if (r == GPUCMD_EDISCONNECTED)
		return conn_fail_why(c, r,
				     "the daemon closed the connection "
				     "without saying why");
	if (r < 0)
		return conn_fail_why(c, r, why);
	switch (f->msg_case) {
	case GPUCMD__FRAME__MSG_RESPONSE:
		s = slot_find(c, f->response->id);
		if (s == NULL || s->frame != NULL) {
			snprintf(why, sizeof(why),
				 "the daemon answered request "
				 "%llu, which is not outstanding",
				 (unsigned long long)f->response->id);
			break;
		}
		s->frame = f;
		if (s->abandoned) {
			if (s->detached)
				note_detached(c, f->response);
			slot_settle(c, s);
			slot_drop(c, s);
			c->nabandoned--;
		}
		return 0;
	case GPUCMD__FRAME__MSG_ERROR:
		r = error_code(f->error);
		conn_fail_why(c, r,
			      f->error != NULL ? f->error->message : NULL);
		frame_free(f);
		return r;
	default:
		snprintf(why, sizeof(why),
			 "the daemon sent a frame of type %d, "
			 "which a client never gets",
			 (int)f->msg_case);
		break;
	}
	/* A response nobody asked for, or a frame a client never gets. */
	frame_free(f);
	return conn_fail_why(c, GPUCMD_EPROTO, why);
}

/*
 * The region_release ops of req, for its slot: *out is NULL when there
 * are none.  0 or -ENOMEM.
 */
static int releases_of(const Gpucmd__Request *req, struct conn_release **out,
		       size_t *n)
{
	struct conn_release *v;
	size_t k = 0;

	*out = NULL;
	*n = 0;
	for (size_t i = 0; i < req->n_ops; i++)
		if (req->ops[i]->op_case == GPUCMD__OP__OP_REGION_RELEASE)
			k++;
	if (k == 0)
		return 0;
	v = calloc(k, sizeof(*v));
	if (v == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < req->n_ops; i++) {
		if (req->ops[i]->op_case != GPUCMD__OP__OP_REGION_RELEASE)
			continue;
		v[*n].index = i;
		v[*n].region = req->ops[i]->region_release->region;
		(*n)++;
	}
	*out = v;
	return 0;
}

/*
 * The response of slot s is in: the regions its request released, up to
 * the op that failed, leave the table.
 */
static void slot_settle(struct gpucmd_conn *c, struct conn_slot *s)
{
	const Gpucmd__Response *resp = s->frame->response;
	/*
	 * A stream fault is reported at the batch's first read or sync once
	 * every op has run: failed_index is not where the batch stopped.
	 */
	bool all_ran =
		resp->error == NULL || resp->error->code == GPUCMD_ESTREAM;

	for (size_t k = 0; k < s->nreleases; k++)
		if (all_ran || s->releases[k].index < resp->failed_index)
			regions_forget(&c->regions, s->releases[k].region);
	free(s->releases);
	s->releases = NULL;
	s->nreleases = 0;
}

/*
 * Read in the answers that have come, without waiting, while some nobody
 * waits for are outstanding (a deadline of 1 ns is already past: each
 * conn_recv_one looks once).
 */
static void conn_drain(struct gpucmd_conn *c)
{
	while (c->nabandoned > 0 && c->dead == 0 && conn_recv_one(c, 0, 1) == 0)
		;
}

int conn_submit(struct gpucmd_conn *c, Gpucmd__Request *req, const int *fds,
		size_t nfds, uint64_t *id)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	struct conn_release *rel;
	size_t nrel;
	int r;

	r = conn_check_process(c, false);
	if (r < 0)
		return r;
	if (c->dead)
		return c->dead;
	/*
	 * Answers nobody waits for that have come: read them in, without
	 * waiting, or a client that only detaches would leave them piling up
	 * in the socket and the daemon's write queue.  Once CONN_DRAIN_AT
	 * are outstanding, not at every submit: a look costs a poll(), and a
	 * loop of detached submits would pay one per batch.
	 */
	if (c->nabandoned >= CONN_DRAIN_AT)
		conn_drain(c);
	if (c->dead)
		return c->dead;
	/*
	 * Abandoned requests hold places until their answers come, which
	 * only reading collects: read them in before refusing, as long as
	 * the timeout allows (the daemon owes them).
	 */
	while (c->info.max_in_flight > 0 &&
	       c->nslots >= c->info.max_in_flight && c->nabandoned > 0 &&
	       c->dead == 0)
		if (conn_recv_one(c, c->spin_us,
				  deadline_after(c->timeout_ms)) == -ETIMEDOUT)
			break;
	if (c->dead)
		return c->dead;
	if (c->info.max_in_flight > 0 && c->nslots >= c->info.max_in_flight)
		return GPUCMD_ELIMIT;
	if (c->nslots == c->slots_cap) {
		size_t cap = c->slots_cap ? 2 * c->slots_cap : 16;
		struct conn_slot *s = realloc(c->slots, cap * sizeof(*s));

		if (s == NULL)
			return -ENOMEM;
		c->slots = s;
		c->slots_cap = cap;
	}
	if (releases_of(req, &rel, &nrel) < 0)
		return -ENOMEM;
	req->id = c->next_id;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = req;
	r = write_frame(c, &f, c->info.max_frame_bytes, fds, nfds);
	if (r < 0)
		free(rel);
	if (c->dead)
		return c->dead; /* a request stopped half way */
	if (r == GPUCMD_ELIMIT || r == -ENOMEM || r == -ETIMEDOUT)
		return r; /* nothing was sent; the connection is fine */
	if (r == -EPIPE || r == -ECONNRESET) {
		/*
		 * The daemon closed the socket, usually after an Error frame
		 * that says why, perhaps with the request half sent.  Reading
		 * cannot block on a closed peer, so collect what it sent
		 * before it went (answers to earlier requests, then its
		 * reason).
		 */
		while (c->dead == 0)
			if (conn_recv_one(c, c->spin_us,
					  deadline_after(c->timeout_ms)) ==
			    -ETIMEDOUT)
				conn_fail_why(c, GPUCMD_EDISCONNECTED,
					      "the daemon closed the "
					      "connection without saying why");
		return c->dead;
	}
	if (r < 0)
		return conn_fail(c, r);
	c->slots[c->nslots].id = c->next_id;
	c->slots[c->nslots].abandoned = false;
	c->slots[c->nslots].detached = false;
	/*
	 * A reply that waits for device work is watched for up to
	 * SPIN_AWAIT_US, as the daemon's threads do, instead of spin_us.  A
	 * 1 MiB region copy takes 40-100 us on the host backend: past a 50 us
	 * watch the client slept and its wake-up cost as much again (round
	 * trips of 384 KiB to 768 KiB copies went from 41-81 us to 30-46 us).
	 */
	c->slots[c->nslots].awaits_device = frame_request_awaits_device(req);
	c->slots[c->nslots].frame = NULL;
	c->slots[c->nslots].releases = rel;
	c->slots[c->nslots].nreleases = nrel;
	c->nslots++;
	c->next_id++;
	*id = req->id;
	return 0;
}

int conn_wait(struct gpucmd_conn *c, uint64_t id, int timeout_ms,
	      Gpucmd__Frame **out)
{
	struct conn_slot *s;
	uint64_t deadline = deadline_after(timeout_ms);
	unsigned spin_us;
	int r = conn_check_process(c, false);

	if (r < 0)
		return r;
	s = slot_find(c, id);
	if (s == NULL || s->abandoned)
		return GPUCMD_EINVAL;
	spin_us = spin_budget(c->spin_us, s->awaits_device);
	/*
	 * Slots move only when a submit adds one, this returns, or an
	 * abandoned one is dropped: find s again after each frame.
	 */
	while (s->frame == NULL) {
		if (c->dead)
			return c->dead;
		if (conn_recv_one(c, spin_us, deadline) == -ETIMEDOUT &&
		    c->dead == 0)
			return -ETIMEDOUT;
		s = slot_find(c, id);
		if (s == NULL)
			return GPUCMD_EPROTO; /* cannot happen */
	}
	slot_settle(c, s);
	*out = s->frame;
	*s = c->slots[--c->nslots];
	return 0;
}

void conn_abandon(struct gpucmd_conn *c, uint64_t id, bool detached)
{
	struct conn_slot *s = slot_find(c, id);

	if (s == NULL)
		return;
	if (s->frame != NULL || c->dead) {
		if (s->frame != NULL && detached)
			note_detached(c, s->frame->response);
		if (s->frame != NULL)
			slot_settle(c, s);
		slot_drop(c, s);
		return;
	}
	s->abandoned = true;
	s->detached = detached;
	c->nabandoned++;
}

GPUCMD_EXTERN uint64_t gpucmd_detached_failures(struct gpucmd_conn *c,
						int *code, char *msg,
						size_t len)
{
	uint64_t n;

	if (c == NULL)
		return 0;
	/*
	 * In a child of fork() the socket and the count are the parent's:
	 * read nothing, report nothing (conn_check_process leaves why for
	 * gpucmd_last_message).
	 */
	if (conn_check_process(c, false) < 0) {
		if (code != NULL)
			*code = 0;
		if (msg != NULL && len > 0)
			msg[0] = '\0';
		return 0;
	}
	/*
	 * What a service polls: the answers that have come are counted now,
	 * not only at a later wait or once CONN_DRAIN_AT are outstanding.
	 */
	conn_drain(c);
	n = c->detached_failed;
	if (code != NULL)
		*code = n > 0 ? c->detached_code : 0;
	if (msg != NULL && len > 0)
		snprintf(msg, len, "%s", n > 0 ? c->detached_message : "");
	c->detached_failed = 0;
	c->detached_code = 0;
	c->detached_message[0] = '\0';
	return n;
}

int conn_timeout(const struct gpucmd_conn *c)
{
	return c->timeout_ms;
}

int conn_fail_timeout(struct gpucmd_conn *c, int code)
{
	if (code == -ETIMEDOUT)
		return conn_fail_why(c, code,
				     "a transfer or region call timed "
				     "out; the daemon may still use its "
				     "shared memory, so the connection is "
				     "closed");
	return code;
}

/* $GPUCMD_SOCKET (when set and not empty), else the default path. */
static const char *socket_path(const char *path)
{
	const char *env;

	if (path != NULL)
		return path;
	env = getenv("GPUCMD_SOCKET");
	if (env != NULL && env[0] != '\0')
		return env;
	return GPUCMD_DEFAULT_SOCKET;
}

/*
 * Connect fd to sun.  A listener whose backlog is full keeps a blocking
 * connect waiting: with a timeout (>= 0 ms), SO_SNDTIMEO bounds that wait
 * (Linux's Unix sockets honour it in connect, failing with EAGAIN), and is
 * cleared after.  A Unix-socket connect does not go on in the background
 * when a signal interrupts it: it is simply made again, with the time
 * left.
 */
static int connect_unix(int fd, const struct sockaddr_un *sun, int timeout_ms)
{
	uint64_t deadline = deadline_after(timeout_ms);
	struct timeval none = { 0 };
	int err;

	for (;;) {
		if (timeout_ms >= 0) {
			int ms = ms_left(deadline);
			struct timeval tv = { .tv_sec = ms / 1000,
					      .tv_usec = (ms % 1000) * 1000 };

			if (ms == 0)
				return -ETIMEDOUT;
			(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv,
					 sizeof(tv));
		}
		err = connect(fd, (const struct sockaddr *)sun, sizeof(*sun)) ==
				      0 ?
			      0 :
			      errno;
		if (err != EINTR)
			break;
	}
	if (timeout_ms >= 0)
		(void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none,
				 sizeof(none));
	if (err == 0 || err == EISCONN)
		return 0;
	if (err == EAGAIN && timeout_ms >= 0)
		return -ETIMEDOUT;
	return -err;
}

static void info_from_welcome(struct gpucmd_info *info,
			      const Gpucmd__Welcome *w)
{
	const Gpucmd__DeviceInfo *d = w->device;
	const Gpucmd__Limits *l = w->limits;

	memset(info, 0, sizeof(*info));
	info->protocol_version = w->protocol_version;
	info->service_id = w->service_id;
	info->connection_id = w->connection_id;
	snprintf(info->service, sizeof(info->service), "%s", w->service);
	if (d != NULL) {
		snprintf(info->device_name, sizeof(info->device_name), "%s",
			 d->name);
		snprintf(info->backend, sizeof(info->backend), "%s",
			 d->backend);
		info->device_total_memory = d->total_memory;
		info->max_allocation = d->max_allocation;
		snprintf(info->device_uuid, sizeof(info->device_uuid), "%s",
			 d->uuid);
		snprintf(info->device_pci_bus_id,
			 sizeof(info->device_pci_bus_id), "%s", d->pci_bus_id);
	}
	if (l != NULL) {
		info->memory_limit = l->memory_limit;
		info->max_streams = l->max_streams;
		info->max_ops_per_batch = l->max_ops_per_batch;
		info->max_frame_bytes = l->max_frame_bytes;
		info->max_in_flight = l->max_in_flight;
		info->region_limit = l->region_limit;
	}
	/* A daemon that names no frame limit takes the protocol default. */
	if (info->max_frame_bytes == 0)
		info->max_frame_bytes = FRAME_DEFAULT_MAX_BODY;
}

/* Send Hello and read the answer: Welcome, or an Error that says why not. */
static int handshake(struct gpucmd_conn *c, const char *service, unsigned flags,
		     char *msg, size_t msg_len)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Hello hello = GPUCMD__HELLO__INIT;
	Gpucmd__Frame *answer;
	char name[64];
	int r;

	snprintf(name, sizeof(name), "%s[%ld]", program_invocation_short_name,
		 (long)getpid());
	hello.protocol_version = GPUCMD_PROTOCOL_VERSION;
	hello.service = (char *)service;
	hello.client_name = name;
	hello.observe = (flags & GPUCMD_CONNECT_OBSERVE) != 0;
	f.msg_case = GPUCMD__FRAME__MSG_HELLO;
	f.hello = &hello;
	r = write_frame(c, &f, FRAME_DEFAULT_MAX_BODY, NULL, 0);
	/* A refusing daemon may close before reading: its Error still waits. */
	if (r < 0 && r != -EPIPE && r != -ECONNRESET) {
		snprintf(msg, msg_len, "sending Hello: %s", gpucmd_strerror(r));
		return r;
	}
	msg[0] = '\0';
	c->deadline_ns = deadline_after(c->timeout_ms);
	r = read_frame(c, FRAME_DEFAULT_MAX_BODY, &answer, msg, msg_len);
	c->deadline_ns = 0;
	if (r < 0) {
		/* A bad header already wrote its sentence into msg. */
		if (r == GPUCMD_EDISCONNECTED)
			snprintf(msg, msg_len,
				 "the daemon closed the "
				 "connection without answering Hello");
		else if (r == -ETIMEDOUT)
			snprintf(msg, msg_len,
				 "the daemon accepted the "
				 "connection but did not answer Hello within "
				 "%d ms",
				 c->timeout_ms);
		else if (msg[0] == '\0')
			snprintf(msg, msg_len, "reading Welcome: %s",
				 gpucmd_strerror(r));
		return r;
	}
	switch (answer->msg_case) {
	case GPUCMD__FRAME__MSG_WELCOME:
		if (answer->welcome->protocol_version !=
		    GPUCMD_PROTOCOL_VERSION) {
			snprintf(
				msg, msg_len,
				"the daemon speaks protocol %u, this library %u",
				answer->welcome->protocol_version,
				GPUCMD_PROTOCOL_VERSION);
			r = GPUCMD_EVERSION;
			break;
		}
		info_from_welcome(&c->info, answer->welcome);
		break;
	case GPUCMD__FRAME__MSG_ERROR:
		r = error_code(answer->error);
		snprintf(msg, msg_len, "%s",
			 answer->error->message[0] != '\0' ?
				 answer->error->message :
				 gpucmd_strerror(r));
		break;
	default:
		snprintf(msg, msg_len,
			 "the daemon answered Hello with "
			 "frame type %d instead of Welcome",
			 (int)answer->msg_case);
		r = GPUCMD_EPROTO;
		break;
	}
	frame_free(answer);
	return r;
}

GPUCMD_EXTERN int gpucmd_connect(const char *path, const char *service,
				 struct gpucmd_conn **out, char *msg,
				 size_t msg_len)
{
	return gpucmd_connect_timeout(path, service, -1, out, msg, msg_len);
}

GPUCMD_EXTERN int gpucmd_connect_timeout(const char *path, const char *service,
					 int timeout_ms,
					 struct gpucmd_conn **out, char *msg,
					 size_t msg_len)
{
	return gpucmd_connect_flags(path, service, timeout_ms, 0, out, msg,
				    msg_len);
}

/*
 * The API has no options struct, so the ways to connect grow by flags on
 * one entry point: gpucmd_connect and gpucmd_connect_timeout keep their
 * signatures, and a program states what it wants in the call, not through
 * the environment (which its children would inherit).  Observing is public
 * because any admin tool (an exporter polling memory reports) has the
 * gpucmd tool's reason to join no service.
 */
GPUCMD_EXTERN int gpucmd_connect_flags(const char *path, const char *service,
				       int timeout_ms, unsigned flags,
				       struct gpucmd_conn **out, char *msg,
				       size_t msg_len)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	struct gpucmd_conn *c;
	char dummy[1];
	int r;

	if (msg == NULL || msg_len == 0) {
		msg = dummy;
		msg_len = sizeof(dummy);
	}
	path = socket_path(path);
	if (service == NULL)
		service = CONN_DEFAULT_SERVICE;
	if (out == NULL) {
		snprintf(msg, msg_len, "no place for the connection");
		return GPUCMD_EINVAL;
	}
	if ((flags & ~CONN_FLAGS) != 0) {
		snprintf(msg, msg_len,
			 "connect flags 0x%x are not known to "
			 "this libgpucmd",
			 flags & ~CONN_FLAGS);
		return GPUCMD_EINVAL;
	}
	if (timeout_ms == 0) {
		/* It would time out before the daemon could answer Hello. */
		snprintf(msg, msg_len,
			 "a connect timeout of 0 ms leaves no "
			 "time for the handshake: give 1 ms or more, or -1 "
			 "for none");
		return GPUCMD_EINVAL;
	}
	if (strlen(path) >= sizeof(sun.sun_path)) {
		snprintf(msg, msg_len, "socket path is longer than %zu bytes",
			 sizeof(sun.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	memcpy(sun.sun_path, path, strlen(path) + 1);

	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return -ENOMEM;
	(void)pthread_once(&conn_atfork_once, conn_watch_forks);
	c->pid = getpid();
	c->forks = atomic_load_explicit(&conn_forks, memory_order_relaxed);
	c->next_id = 1;
	c->spin_us = spin_setting();
	c->timeout_ms = timeout_ms < 0 ? -1 : timeout_ms;
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		r = -errno;
		snprintf(msg, msg_len, "socket: %s", strerror(-r));
		free(c);
		return r;
	}
	atomic_fetch_add(&conns_open, 1);
	r = connect_unix(c->fd, &sun, c->timeout_ms);
	if (r == -ETIMEDOUT) {
		snprintf(msg, msg_len,
			 "connect %s: the daemon did not accept "
			 "the connection within %d ms",
			 path, c->timeout_ms);
	} else if (r < 0) {
		snprintf(msg, msg_len, "connect %s: %s", path, strerror(-r));
	} else {
		r = handshake(c, service, flags, msg, msg_len);
	}
	if (r < 0) {
		gpucmd_close(c);
		return r;
	}
	*out = c;
	return 0;
}

/*
 * Nothing is sent.  In the process that opened it, the socket is shut down
 * before it is closed: the daemon sees the end now even where a child of
 * fork() still holds a copy of the descriptor (else it would keep the
 * connection, and all it holds, until the last copy closed).  In another
 * process (getpid(), not only the fork counter: shutdown() would end the
 * opener's connection too) only that process's copies go, the
 * descriptor, the mappings and the memory, and the opener's connection
 * goes on.
 */
GPUCMD_EXTERN void gpucmd_close(struct gpucmd_conn *c)
{
	bool foreign;

	if (c == NULL)
		return;
	foreign = conn_foreign(c, true);
	if (c->fd >= 0 && !foreign)
		(void)shutdown(c->fd, SHUT_RDWR);
	for (size_t i = 0; i < c->nslots; i++) {
		frame_free(c->slots[i].frame);
		free(c->slots[i].releases);
	}
	free(c->slots);
	regions_clear(&c->regions, !foreign);
	batch_cache_clear(&c->batches);
	frame_pieces_free(&c->out);
	free(c->body);
	if (c->fd >= 0)
		close(c->fd);
	free(c);
	/*
	 * The process-wide pool of large buffers (frame.c) keeps up to two
	 * spares, trimmed only when a later frame comes: give them back now,
	 * or a closed connection leaves up to 128 MiB behind (and responses
	 * freed later give theirs back, conn_none_open).
	 */
	atomic_fetch_sub(&conns_open, 1);
	frame_buf_trim(0);
}

bool conn_none_open(void)
{
	return atomic_load_explicit(&conns_open, memory_order_relaxed) == 0;
}

GPUCMD_EXTERN const struct gpucmd_info *gpucmd_info(const struct gpucmd_conn *c)
{
	return &c->info;
}

bool conn_has_room(const struct gpucmd_conn *c, size_t n)
{
	return c->info.max_in_flight == 0 ||
	       c->nslots + n <= c->info.max_in_flight;
}

struct regions *conn_regions(struct gpucmd_conn *c)
{
	return &c->regions;
}

struct batch_cache *conn_batch_cache(struct gpucmd_conn *c)
{
	return &c->batches;
}

void conn_set_message(struct gpucmd_conn *c, const char *msg)
{
	snprintf(c->last_message, sizeof(c->last_message), "%s",
		 msg != NULL ? msg : "");
}

int conn_refuse(struct gpucmd_conn *c, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->last_message, sizeof(c->last_message), fmt, ap);
	va_end(ap);
	return code;
}

GPUCMD_EXTERN const char *gpucmd_last_message(const struct gpucmd_conn *c)
{
	return c != NULL ? c->last_message : "";
}

GPUCMD_EXTERN void gpucmd_set_timeout(struct gpucmd_conn *c, int timeout_ms)
{
	if (c != NULL)
		c->timeout_ms = timeout_ms < 0 ? -1 : timeout_ms;
}

GPUCMD_EXTERN int gpucmd_conn_error(const struct gpucmd_conn *c,
				    const char **why)
{
	if (c == NULL) {
		if (why != NULL)
			*why = "no connection";
		return GPUCMD_EINVAL;
	}
	if (conn_foreign(c, false)) {
		if (why != NULL)
			*why = "this connection was opened by another process; "
			       "after fork() a child must open its own with "
			       "gpucmd_connect";
		return GPUCMD_EINVAL;
	}
	if (why != NULL)
		*why = c->dead ? c->dead_message : "";
	return c->dead;
}
