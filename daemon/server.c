/*
 * server.c - see server.h.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "frame.h"
#include "gpucmd.h"
#include "log.h"
#include "sd.h"
#include "service.h"
#include "session.h"
#include "spin.h"

/* One message from the device thread to the loop. */
struct outbox_msg {
	struct session *session;
	uint8_t *buf;
	size_t len;
	struct reply_pieces *pieces;
	/*
	 * With has_lost, the response could not be made: lost says what the
	 * loop answers instead (executor.h).  Kept here, not allocated, so
	 * that the host out of memory cannot lose it too.
	 */
	bool has_lost;
	struct reply_lost lost;
	bool completed;
	bool closed;
	struct outbox_msg *next;
};

/* ---- the outbox (device thread -> loop) ---------------------------------- */

/*
 * Losing a message would wedge a client or leak a session, so the device
 * thread never allocates one: the loop sets aside two per batch before it
 * submits it (an early answer and a completion are the most a batch
 * sends), on the session's spare list under srv->lock, and one for the
 * close when the session is accepted.  A loop out of memory refuses the
 * batch or the connection instead, with a message.  Messages the loop has
 * handled go back to their session's spares, so a client's steady stream
 * of batches allocates none; the spares beyond two per batch in flight
 * (and two more) are freed as they come back (give_back).
 */
#define SERVER_MSGS_PER_BATCH 2

/* Large frame buffers unused this long are freed at the tick (frame.h). */
#define SERVER_BUF_IDLE_NS (2000000000ull)

/*
 * The loop's tick (watchdog, STATUS=, the Hello deadline): a connection
 * that never says Hello goes within SESSION_HELLO_TIMEOUT_MS plus this.
 */
#define SERVER_TICK_MS 2000

/* Clients the listening socket queues until the loop accepts them. */
#define SERVER_BACKLOG 128

/* Connections past max_connections that admins may still open. */
#define SERVER_ADMIN_SPARE 4

/*
 * Descriptors below RLIMIT_NOFILE that a new connection may not take
 * (fds_short); admins may take half of them.  The connections already
 * open need some after their accept (the memfds of their regions arrive
 * as descriptors), and so do a reload and the driver.  An accept that
 * meets the limit itself gets no say: libuv closes the client's socket
 * unanswered to get out of the EMFILE (its "emfile trick"), and the client
 * only sees the connection end.
 */
#define SERVER_FD_RESERVE 32

/* Append m to the outbox; srv->lock held. */
static void post_locked(struct server *srv, struct outbox_msg *m)
{
	m->next = NULL;
	*srv->out_tail = m;
	srv->out_tail = &m->next;
	atomic_store_explicit(&srv->out_ready, 1, memory_order_release);
}

static void on_exec_reply(void *conn, uint8_t *buf, size_t len,
			  struct reply_pieces *pieces,
			  const struct reply_lost *lost, bool completed,
			  void *arg)
{
	struct server *srv = arg;
	struct session *s = conn;
	struct outbox_msg *m;

	pthread_mutex_lock(&srv->lock);
	m = s->spare_msgs;
	/* Set aside at submit: a batch sends no more than it was given. */
	require(m != NULL);
	s->spare_msgs = m->next;
	s->nspare_msgs--;
	m->session = s;
	m->buf = buf;
	m->len = len;
	m->pieces = pieces;
	m->has_lost = lost != NULL;
	if (lost != NULL)
		m->lost = *lost;
	m->completed = completed;
	m->closed = false;
	post_locked(srv, m);
	pthread_mutex_unlock(&srv->lock);
	uv_async_send(&srv->wakeup);
}

static void on_exec_closed(void *conn, void *arg)
{
	struct server *srv = arg;
	struct session *s = conn;
	struct outbox_msg *m;

	pthread_mutex_lock(&srv->lock);
	m = s->close_msg;
	require(m != NULL);
	s->close_msg = NULL;
	m->session = s;
	m->closed = true;
	post_locked(srv, m);
	pthread_mutex_unlock(&srv->lock);
	uv_async_send(&srv->wakeup);
}

int server_reserve_replies(struct server *srv, struct session *s)
{
	struct outbox_msg *got = NULL;
	size_t need = SERVER_MSGS_PER_BATCH * ((size_t)s->in_flight + 1);
	size_t have, n = 0;

	/* Spares come back from earlier batches: usually nothing to make. */
	pthread_mutex_lock(&srv->lock);
	have = s->nspare_msgs;
	pthread_mutex_unlock(&srv->lock);
	for (; have + n < need; n++) {
		struct outbox_msg *m = calloc(1, sizeof(*m));

		if (m == NULL) {
			while (got != NULL) {
				m = got->next;
				free(got);
				got = m;
			}
			return GPUCMD_ENOMEM;
		}
		m->next = got;
		got = m;
	}
	if (got == NULL)
		return 0;
	pthread_mutex_lock(&srv->lock);
	while (got != NULL) {
		struct outbox_msg *m = got;

		got = m->next;
		m->next = s->spare_msgs;
		s->spare_msgs = m;
		s->nspare_msgs++;
	}
	pthread_mutex_unlock(&srv->lock);
	return 0;
}

/*
 * Messages the loop has handled go back among s's spares, for its next
 * batches (the device thread may take them at once: they are not touched
 * after), in one turn of the lock; past what the batches in flight may
 * need, they are freed.
 */
static void give_back(struct server *srv, struct session *s,
		      struct outbox_msg *first, struct outbox_msg *last,
		      uint32_t n)
{
	struct outbox_msg *extra = NULL;

	pthread_mutex_lock(&srv->lock);
	last->next = s->spare_msgs;
	s->spare_msgs = first;
	s->nspare_msgs += n;
	while (s->nspare_msgs >
	       SERVER_MSGS_PER_BATCH * ((size_t)s->in_flight + 1)) {
		struct outbox_msg *m = s->spare_msgs;

		s->spare_msgs = m->next;
		s->nspare_msgs--;
		m->next = extra;
		extra = m;
	}
	pthread_mutex_unlock(&srv->lock);
	while (extra != NULL) {
		struct outbox_msg *next = extra->next;

		free(extra);
		extra = next;
	}
}

static void on_exec_fatal(const char *why, void *arg)
{
	struct server *srv = arg;

	pthread_mutex_lock(&srv->lock);
	snprintf(srv->fatal, sizeof(srv->fatal), "%s", why);
	pthread_mutex_unlock(&srv->lock);
	uv_async_send(&srv->wakeup);
}

static void on_wakeup(uv_async_t *async)
{
	struct server *srv = async->data;
	struct outbox_msg *m, *run = NULL, *run_last = NULL;
	uint32_t nrun = 0;
	char fatal[sizeof(srv->fatal)];

	pthread_mutex_lock(&srv->lock);
	m = srv->out_head;
	srv->out_head = NULL;
	srv->out_tail = &srv->out_head;
	atomic_store_explicit(&srv->out_ready, 0, memory_order_relaxed);
	memcpy(fatal, srv->fatal, sizeof(fatal));
	srv->fatal[0] = '\0';
	pthread_mutex_unlock(&srv->lock);
	if (fatal[0] != '\0' && !srv->stopping) {
		log_err("%s; stopping with exit status 1 so that the service "
			"manager restarts gpucmdd with a fresh device context",
			fatal);
		srv->exit_code = 1;
		snprintf(srv->stop_reason, sizeof(srv->stop_reason),
			 "%s; gpucmdd stops and restarts with a fresh device "
			 "context: connect again, then upload buffers and "
			 "capture graphs again (libgpucmd(3), "
			 "examples/reconnect.c)",
			 fatal);
		server_stop(srv);
	}

	/* More replies tend to follow: a pipelining client's next batch. */
	if (m != NULL && !srv->stopping)
		server_spin(srv, false);
	while (m != NULL) {
		struct outbox_msg *next = m->next;

		if (m->closed) {
			session_device_closed(m->session);
			free(m);
		} else {
			struct session *s = m->session;

			session_reply(s, m->buf, m->len, m->pieces,
				      m->has_lost ? &m->lost : NULL,
				      m->completed);
			/*
			 * A session's run of replies in this wake-up: one
			 * write, one turn of the lock for their messages.
			 * Submitting happens elsewhere in the loop, so no
			 * batch needs them back sooner.
			 */
			if (run == NULL)
				run_last = m;
			m->next = run;
			run = m;
			nrun++;
			if (next == NULL || next->session != s ||
			    next->closed) {
				session_flush(s);
				give_back(srv, s, run, run_last, nrun);
				run = NULL;
				nrun = 0;
			}
		}
		m = next;
	}
}

/* ---- polling the outbox (spin.h) ----------------------------------------- */

/*
 * While the loop spins and one connection alone has been sending (a client
 * in a round-trip loop), the spin reads that connection's socket itself, a
 * few times between polls: a request that arrives then costs one recvmsg,
 * as in the echo floor, instead of epoll_wait, libuv's turn and recvmsg
 * (ping p50 ~1.4x -> ~1.2x the echo on the 2-core VM).  With several
 * connections sending, every read goes through the poll, so no connection
 * is served ahead of the others.
 */
#define SPIN_DIRECT_READS 8

void server_note_read(struct server *srv, struct session *s)
{
	srv->hot = s;
	srv->reads++;
}

static void on_spin(uv_idle_t *h)
{
	struct server *srv = h->data;
	uint64_t now;

	if (srv->reads > 0) {
		srv->hot_alone = srv->reads == 1;
		srv->reads = 0;
	}
	for (unsigned i = 0;; i++) {
		if (atomic_load_explicit(&srv->out_ready,
					 memory_order_acquire)) {
			on_wakeup(&srv->wakeup);
			return;
		}
		if (i == SPIN_DIRECT_READS || !srv->hot_alone ||
		    srv->hot == NULL)
			break;
		if (session_read_direct(srv->hot) != 0)
			break;
	}
	now = spin_now_ns();
	/*
	 * Runnable work on this CPU goes first; if there was some, sleep.  A
	 * poll is already a system call (epoll_wait), so the yield comes every
	 * fourth: a request is seen a third sooner (ping p50 ~6.6 -> ~5.8 us
	 * on the 2-core VM).
	 */
	if (now >= srv->spin_until ||
	    ((++srv->spin_turns & 3) == 0 && !spin_yield(&now))) {
		uv_idle_stop(h);
		/* A sender that went quiet is not read directly next time. */
		srv->hot_alone = false;
	}
}

void server_spin(struct server *srv, bool awaiting)
{
	unsigned us = spin_budget(srv->spin_us, awaiting);
	uint64_t until;

	if (us == 0)
		return;
	until = spin_now_ns() + (uint64_t)us * 1000u;
	/*
	 * A longer watch already running (for a reply that waits for the
	 * device) is not cut short by another connection's bytes.
	 */
	if (!uv_is_active((uv_handle_t *)&srv->spin) || until > srv->spin_until)
		srv->spin_until = until;
	if (!uv_is_active((uv_handle_t *)&srv->spin))
		uv_idle_start(&srv->spin, on_spin);
}

/* ---- turns: one large frame at a time ------------------------------------ */

/*
 * How long the loop decodes large frames before it polls the sockets again:
 * about one batch of 256 kernel launches (0.07 us an op, tests/bench).  A
 * ping that comes while 16 clients each have batches read waits for this,
 * not for all of them: before turns, a read decoded every whole frame it
 * brought, and one poll's reads took milliseconds under such a flood.
 */
#define SERVER_TURN_NS 20000u

static void on_turns(uv_idle_t *h);

void server_turn_wait(struct server *srv, struct session *s)
{
	if (s->turn_queued)
		return;
	s->turn_queued = true;
	s->turn_next = NULL;
	s->turn_prev = srv->turn_tail;
	if (srv->turn_tail != NULL)
		srv->turn_tail->turn_next = s;
	else
		srv->turn_head = s;
	srv->turn_tail = s;
	if (!uv_is_active((uv_handle_t *)&srv->turns))
		uv_idle_start(&srv->turns, on_turns);
}

void server_turn_forget(struct server *srv, struct session *s)
{
	if (!s->turn_queued)
		return;
	if (s->turn_prev != NULL)
		s->turn_prev->turn_next = s->turn_next;
	else
		srv->turn_head = s->turn_next;
	if (s->turn_next != NULL)
		s->turn_next->turn_prev = s->turn_prev;
	else
		srv->turn_tail = s->turn_prev;
	s->turn_queued = false;
	s->turn_next = NULL;
	s->turn_prev = NULL;
}

/*
 * The connections' turns, oldest first, for SERVER_TURN_NS: one whose next
 * frame is large again goes to the back (session_take_turn calls
 * server_turn_wait), so the clients sending batches take turns frame by
 * frame, and a client alone has its frames decoded one after the other.
 */
static void on_turns(uv_idle_t *h)
{
	struct server *srv = h->data;
	uint64_t end = spin_now_ns() + SERVER_TURN_NS;

	while (srv->turn_head != NULL) {
		struct session *s = srv->turn_head;

		server_turn_forget(srv, s);
		session_take_turn(s);
		if (spin_now_ns() >= end)
			break;
	}
	if (srv->turn_head == NULL)
		uv_idle_stop(h);
}

/* ---- accepting ----------------------------------------------------------- */

/*
 * A connection that has not said Hello yet belongs to no service, so no
 * service's share of max_connections bounds it: one uid that kept
 * reopening silent sockets (each closed at the Hello deadline) could hold
 * every place and keep everyone else out.  One uid's silent connections
 * may take half of max_connections; s, a non-admin's, is refused (true)
 * past that.  A walk of at most max_connections sessions per accept.
 */
static bool silent_over(struct server *srv, struct session *s)
{
	uint32_t cap = srv->cfg.limits.max_connections / 2, silent = 0;

	if (cap == 0)
		cap = 1;
	for (const struct session *t = srv->sessions; t != NULL; t = t->next)
		if (t != s && t->state == SESSION_HELLO && t->uid == s->uid)
			silent++;
	if (silent < cap)
		return false;
	session_refuse(s, GPUCMD_ELIMIT,
		       "uid %u has %u connections that have not said Hello "
		       "yet, the most one uid may (half of max_connections, "
		       "%u): say Hello at once after connecting",
		       (unsigned)s->uid, silent,
		       srv->cfg.limits.max_connections);
	return true;
}

/*
 * Descriptors the daemon holds besides its connections' and the reserve:
 * the loop's, the log's, the driver's, a module compiling.
 */
#define SERVER_FD_OWN 64

/*
 * Raise the soft RLIMIT_NOFILE to what max_connections needs, up to the
 * hard limit.  A daemon started from a shell gets the soft 1024 that
 * systemd and most logins give for select()'s sake (libuv polls with
 * epoll) and would refuse connections below max_connections for want of
 * descriptors; where the hard limit is lower still, the operator hears
 * it now rather than from clients later.
 */
static void fit_nofile(const struct server *srv)
{
	rlim_t need = (rlim_t)srv->cfg.limits.max_connections +
		      SERVER_ADMIN_SPARE + SERVER_FD_RESERVE + SERVER_FD_OWN;
	struct rlimit rl;
	rlim_t fit;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need)
		return;
	if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max > rl.rlim_cur) {
		struct rlimit want = rl;

		want.rlim_cur = need;
		if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need)
			want.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &want) == 0) {
			log_info("RLIMIT_NOFILE raised from %llu to %llu for "
				 "max_connections %u",
				 (unsigned long long)rl.rlim_cur,
				 (unsigned long long)want.rlim_cur,
				 srv->cfg.limits.max_connections);
			rl = want;
		}
	}
	if (rl.rlim_cur >= need)
		return;
	fit = rl.rlim_cur > SERVER_FD_RESERVE + SERVER_FD_OWN ?
		      rl.rlim_cur - SERVER_FD_RESERVE - SERVER_FD_OWN :
		      0;
	log_warn("max_connections %u needs about %llu file descriptors and "
		 "RLIMIT_NOFILE allows %llu (hard limit %llu): connections "
		 "past about %llu will be refused; raise LimitNOFILE= (or "
		 "ulimit -n) or lower max_connections",
		 srv->cfg.limits.max_connections, (unsigned long long)need,
		 (unsigned long long)rl.rlim_cur,
		 (unsigned long long)rl.rlim_max, (unsigned long long)fit);
}

/* How long accepting pauses after an accept failed for descriptors. */
#define SERVER_ACCEPT_PAUSE_MS 1000

/* Accepts that failed: one a loop iteration while descriptors lack. */
static struct log_limit accept_lines = LOG_LIMIT_INIT("accept failures", 10, 3);

static void on_accept_resume(uv_timer_t *t);
static void on_connection(uv_stream_t *listener, int status);

static void on_listener_paused(uv_handle_t *h)
{
	struct server *srv = h->data;

	if (!srv->stopping)
		uv_timer_start(&srv->accept_resume, on_accept_resume,
			       SERVER_ACCEPT_PAUSE_MS, 0);
}

/*
 * Stop accepting for SERVER_ACCEPT_PAUSE_MS.  libuv gets out of an EMFILE
 * in accept by closing a descriptor it keeps and the pending connections
 * with it; when another thread takes that descriptor first, or the system
 * file table is full (ENFILE), the accept fails again, libuv calls
 * on_connection again at once, and the loop spins there for good, deaf
 * to every connection.  Only a listener closed ends that: closing it keeps
 * the socket (listen_spare) and its queue of clients, which wait.
 */
static void accept_pause(struct server *srv)
{
	if (!srv->listening || srv->listen_spare < 0)
		return;
	srv->listening = false;
	srv->accept_paused = true;
	uv_close((uv_handle_t *)&srv->listener, on_listener_paused);
}

/*
 * Serve the listening socket fd on srv->listener: 0, or libuv's error,
 * after which the caller closes the handle.  *opened (when not NULL) says
 * whether the handle took fd, which it then closes with itself.
 */
static int listen_on(struct server *srv, int fd, bool *opened)
{
	int rc;

	uv_pipe_init(srv->loop, &srv->listener, 0);
	srv->listener.data = srv;
	rc = uv_pipe_open(&srv->listener, fd);
	if (opened != NULL)
		*opened = rc == 0;
	if (rc == 0)
		rc = uv_listen((uv_stream_t *)&srv->listener, SERVER_BACKLOG,
			       on_connection);
	return rc;
}

/*
 * Listen again on listen_spare, keeping a spare of it: 0, or an error
 * after which accept_resume tries again in SERVER_ACCEPT_PAUSE_MS.
 */
static int resume_listening(struct server *srv)
{
	int fd = srv->listen_spare, spare, rc;
	bool opened;

	/* The listener takes fd; the socket needs a spare again. */
	spare = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (spare < 0) {
		rc = -errno;
		uv_timer_start(&srv->accept_resume, on_accept_resume,
			       SERVER_ACCEPT_PAUSE_MS, 0);
		return rc;
	}
	rc = listen_on(srv, fd, &opened);
	if (rc != 0) {
		if (log_limit_take(&accept_lines))
			log_warn("cannot listen again: %s; trying again in "
				 "%d ms",
				 uv_strerror(rc), SERVER_ACCEPT_PAUSE_MS);
		/*
		 * A handle that took fd closes it with itself: the spare is
		 * the socket then, or the retry would use a closed (or
		 * reused) descriptor.
		 */
		if (opened)
			srv->listen_spare = spare;
		else
			close(spare);
		/* on_listener_paused starts accept_resume. */
		uv_close((uv_handle_t *)&srv->listener, on_listener_paused);
		return rc;
	}
	srv->listen_spare = spare;
	srv->listening = true;
	srv->accept_paused = false;
	return 0;
}

static void on_accept_resume(uv_timer_t *t)
{
	struct server *srv = t->data;

	if (srv->stopping || !srv->accept_paused)
		return;
	if (resume_listening(srv) == 0)
		log_notice("accepting connections again");
}

/* Refusals for descriptors: a client may reconnect in a loop. */
static struct log_limit fd_lines = LOG_LIMIT_INIT("descriptor refusals", 10, 3);

/*
 * Whether s, just accepted, took one of the last SERVER_FD_RESERVE
 * descriptors below RLIMIT_NOFILE: then it is refused, with the numbers,
 * and true returned.  A new descriptor is the lowest free one, so at
 * least its number plus one are open.  The limit is read at each accept,
 * so that one raised while the daemon runs (prlimit) is heard at once.
 */
static bool fds_short(struct session *s)
{
	unsigned reserve =
		session_is_admin(s) ? SERVER_FD_RESERVE / 2 : SERVER_FD_RESERVE;
	unsigned long long open, limit;
	struct rlimit rl;
	uv_os_fd_t fd;

	if (uv_fileno((uv_handle_t *)&s->pipe, &fd) != 0 ||
	    getrlimit(RLIMIT_NOFILE, &rl) != 0 ||
	    rl.rlim_cur == RLIM_INFINITY || (rlim_t)fd + reserve < rl.rlim_cur)
		return false;
	open = (unsigned long long)fd + 1;
	limit = (unsigned long long)rl.rlim_cur;
	if (log_limit_take(&fd_lines))
		log_warn("connection %llu (%s) refused: the daemon has at "
			 "least %llu descriptors open and its RLIMIT_NOFILE "
			 "is %llu, the last %u kept for the connections "
			 "already open: raise LimitNOFILE= (or lower "
			 "max_connections)",
			 (unsigned long long)s->id, s->peer, open, limit,
			 reserve);
	session_refuse(s, GPUCMD_ELIMIT,
		       "gpucmdd is out of file descriptors: at least %llu "
		       "are open and its limit (RLIMIT_NOFILE) is %llu, the "
		       "last %u kept for the connections already open: try "
		       "again once other connections have closed, or have "
		       "the operator raise LimitNOFILE=",
		       open, limit, reserve);
	return true;
}

static void no_memory_to_accept(struct server *srv)
{
	if (log_limit_take(&accept_lines))
		log_err("out of memory accepting a connection: it is closed, "
			"and new connections wait %d ms in the socket's queue",
			SERVER_ACCEPT_PAUSE_MS);
	accept_pause(srv);
}

static void on_connection(uv_stream_t *listener, int status)
{
	struct server *srv = listener->data;
	struct session *s;
	int rc;

	if (status < 0) {
		bool fds = status == UV_EMFILE || status == UV_ENFILE;

		if (log_limit_take(&accept_lines))
			log_warn("accept failed: %s%s", uv_strerror(status),
				 fds ? "; new connections wait 1 s in the "
				       "socket's queue (raise LimitNOFILE= if "
				       "this comes back)" :
				       "");
		if (fds)
			accept_pause(srv);
		return;
	}
	/*
	 * A client libuv accepted and we do not take with uv_accept stops the
	 * listener for good: libuv waits for that uv_accept before it polls
	 * again.  Out of memory for it, accepting pauses instead, which
	 * closes that client's socket (accept_pause).
	 */
	s = calloc(1, sizeof(*s));
	if (s == NULL) {
		no_memory_to_accept(srv);
		return;
	}
	s->server = srv;
	s->id = ++srv->next_id;
	/* Without it the device thread could not say it is done. */
	s->close_msg = calloc(1, sizeof(*s->close_msg));
	if (s->close_msg == NULL) {
		free(s);
		no_memory_to_accept(srv);
		return;
	}
	/* IPC mode: clients pass region memfds with SCM_RIGHTS. */
	uv_pipe_init(srv->loop, &s->pipe, 1);
	s->pipe.data = s;
	rc = uv_accept(listener, (uv_stream_t *)&s->pipe);
	s->prev = NULL;
	s->next = srv->sessions;
	if (srv->sessions != NULL)
		srv->sessions->prev = s;
	srv->sessions = s;
	srv->nsessions++;
	if (rc != 0) {
		log_warn("accept failed: %s", uv_strerror(rc));
		session_close(s, NULL);
		return;
	}
	if (srv->stopping) {
		session_refuse(s, GPUCMD_ESHUTDOWN,
			       "gpucmdd is shutting down: try again once it "
			       "has restarted");
		return;
	}
	session_identify(s);
	if (fds_short(s))
		return;
	/*
	 * Admins get a few places past the limit, so that an operator can
	 * still look and evict when clients took every one.
	 */
	if (srv->nsessions >
	    srv->cfg.limits.max_connections +
		    (session_is_admin(s) ? SERVER_ADMIN_SPARE : 0)) {
		session_refuse(s, GPUCMD_ELIMIT,
			       "too many connections: %u are open, the limit "
			       "is %u (max_connections)",
			       srv->nsessions - 1,
			       srv->cfg.limits.max_connections);
		return;
	}
	if (!session_is_admin(s) && silent_over(srv, s))
		return;
	session_start(s);
}

void server_session_gone(struct server *srv, struct session *s)
{
	/* The device thread is done with s (closed came): no lock needed. */
	while (s->spare_msgs != NULL) {
		struct outbox_msg *m = s->spare_msgs;

		s->spare_msgs = m->next;
		free(m);
	}
	free(s->close_msg);
	s->close_msg = NULL;
	if (srv->hot == s) {
		srv->hot = NULL;
		srv->hot_alone = false;
	}
	server_turn_forget(srv, s);
	if (s->prev != NULL)
		s->prev->next = s->next;
	else
		srv->sessions = s->next;
	if (s->next != NULL)
		s->next->prev = s->prev;
	srv->nsessions--;
	if (srv->stopping && srv->nsessions == 0)
		uv_stop(srv->loop);
}

/* ---- the socket ---------------------------------------------------------- */

/*
 * Why the socket could not be bound, in words an operator can act on:
 * libuv reports a missing directory as EACCES, which sends root chasing
 * permissions.
 */
static void listen_failed(const char *path, int rc, char *why, size_t why_len)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];
	const char *slash = strrchr(path, '/');
	struct stat st;

	if (slash != NULL && (size_t)(slash - path) < sizeof(dir)) {
		size_t n = slash == path ? 1 : (size_t)(slash - path);

		memcpy(dir, path, n);
		dir[n] = '\0';
		if (stat(dir, &st) != 0 && errno == ENOENT) {
			snprintf(why, why_len,
				 "cannot listen on %s: the directory %s does "
				 "not exist: create it (the package's "
				 "tmpfiles.d does) or choose another --socket",
				 path, dir);
			return;
		}
	}
	snprintf(why, why_len, "cannot listen on %s: %s", path,
		 uv_strerror(rc));
}

/*
 * A socket file left by a daemon that died is removed; one a live daemon
 * still answers on is not, and we refuse to start.
 */
static int clear_stale_socket(const char *path, char *why, size_t why_len)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, rc;

	if (lstat(path, &st) != 0)
		return 0;
	if (!S_ISSOCK(st.st_mode)) {
		snprintf(why, why_len,
			 "%s exists and is not a socket: remove it or choose "
			 "another --socket",
			 path);
		return GPUCMD_EEXIST;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	close(fd);
	if (rc == 0) {
		snprintf(why, why_len,
			 "another gpucmdd is already serving on %s: stop it or "
			 "choose another --socket",
			 path);
		return GPUCMD_EEXIST;
	}
	unlink(path);
	return 0;
}

/*
 * A socket bound at the configured path with its mode and group: its
 * descriptor, or a negative code with why filled in (and no file left).
 */
static int bind_path(const struct server *srv, char *why, size_t why_len)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct stat st;
	const char *path = srv->cfg.socket_path;
	int fd, rc = 0;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		listen_failed(path, rc, why, why_len);
		return rc;
	}
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		rc = -errno;
		listen_failed(path, rc, why, why_len);
		close(fd);
		return rc;
	}
	/*
	 * Not through a symlink: the tick binds the path again when it is
	 * gone, and in a directory others may write, one could put a link
	 * there between the bind and these calls.
	 */
	if (fchmodat(AT_FDCWD, path, srv->cfg.socket_mode,
		     AT_SYMLINK_NOFOLLOW) != 0)
		rc = -errno;
	/* Some setups lack what glibc needs for it (/proc): not a link. */
	if (rc != 0 && lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		rc = chmod(path, srv->cfg.socket_mode) == 0 ? 0 : -errno;
	if (rc == 0 && srv->cfg.socket_group[0] != '\0') {
		struct group *g = getgrnam(srv->cfg.socket_group);

		if (g == NULL) {
			snprintf(why, why_len,
				 "socket_group '%s' does not exist: create it "
				 "(the package's sysusers.d does) or change "
				 "the setting",
				 srv->cfg.socket_group);
			rc = GPUCMD_EINVAL;
		} else if (lchown(path, (uid_t)-1, g->gr_gid) != 0) {
			rc = -errno;
		}
	}
	if (rc != 0) {
		if (rc != GPUCMD_EINVAL)
			listen_failed(path, rc, why, why_len);
		unlink(path);
		close(fd);
		return rc;
	}
	return fd;
}

static int listen_socket(struct server *srv, char *why, size_t why_len)
{
	const char *path = srv->cfg.socket_path;
	struct stat st;
	bool opened;
	int rc, fd;

	rc = sd_listen_fd(&fd, why, why_len);
	if (rc != 0)
		return rc;
	if (fd >= 0) {
		/* Socket activation: systemd owns the path, mode and group. */
		rc = listen_on(srv, fd, NULL);
		if (rc != 0) {
			snprintf(why, why_len,
				 "cannot listen on the socket "
				 "systemd passed: %s",
				 uv_strerror(rc));
			uv_close((uv_handle_t *)&srv->listener, NULL);
			return rc;
		}
		srv->listening = true;
		srv->activated = true;
		srv->listen_spare = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		return 0;
	}
	rc = clear_stale_socket(path, why, why_len);
	if (rc != 0)
		return rc;
	fd = bind_path(srv, why, why_len);
	if (fd < 0)
		return fd;
	if (lstat(path, &st) == 0) {
		srv->sock_dev = (uint64_t)st.st_dev;
		srv->sock_ino = (uint64_t)st.st_ino;
	}
	/*
	 * Opened, not bound by libuv: a pipe libuv bound removes its path
	 * when it closes, whatever file the path names by then; server_stop
	 * removes ours only (socket_is_ours).
	 */
	rc = listen_on(srv, fd, &opened);
	if (!opened)
		close(fd);
	if (rc != 0) {
		listen_failed(path, rc, why, why_len);
		uv_close((uv_handle_t *)&srv->listener, NULL);
		unlink(path);
		return rc;
	}
	srv->listening = true;
	srv->listen_spare = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	return 0;
}

/*
 * Whether the path we bound still names our socket.  Someone may remove it
 * while the daemon runs (a cleanup of the runtime directory, an operator),
 * and another gpucmdd may then bind the path anew: it is its socket then,
 * which our stop must not remove.
 */
static bool socket_is_ours(const struct server *srv)
{
	struct stat st;

	return lstat(srv->cfg.socket_path, &st) == 0 && S_ISSOCK(st.st_mode) &&
	       (uint64_t)st.st_dev == srv->sock_dev &&
	       (uint64_t)st.st_ino == srv->sock_ino;
}

/* "1 connection", "3 connections": n and its noun, in buf (returned). */
static const char *counted(char *buf, size_t len, uint64_t n, const char *one,
			   const char *many)
{
	snprintf(buf, len, "%llu %s", (unsigned long long)n,
		 n == 1 ? one : many);
	return buf;
}

/* The listener closed for a socket bound anew: listen on the new one. */
static void on_listener_rebound(uv_handle_t *h)
{
	struct server *srv = h->data;

	if (!srv->stopping && srv->accept_paused)
		(void)resume_listening(srv);
}

/*
 * Nothing at the socket's path: bind a new socket there and serve it in
 * place of the old one.  The old one closes with the clients in its queue
 * not yet accepted (they connected before the file went; they see the
 * connection end).  True once bound; false, the reason said once per
 * loss, to try again at the next tick.
 */
static bool socket_rebind(struct server *srv)
{
	const char *path = srv->cfg.socket_path;
	char why[256], n[32];
	struct stat st;
	int fd;

	fd = bind_path(srv, why, sizeof(why));
	if (fd >= 0 && listen(fd, SERVER_BACKLOG) != 0) {
		snprintf(why, sizeof(why), "cannot listen on %s: %s", path,
			 strerror(errno));
		unlink(path);
		close(fd);
		fd = -1;
	}
	if (fd < 0) {
		if (srv->sock_state != SOCK_UNBOUND)
			log_warn("the socket %s was removed while gpucmdd "
				 "runs, and binding it again failed: %s; new "
				 "clients cannot connect (%s open carry on); "
				 "trying again every %d s",
				 path, why,
				 counted(n, sizeof(n), srv->nsessions,
					 "connection", "connections"),
				 SERVER_TICK_MS / 1000);
		return false;
	}
	if (lstat(path, &st) == 0) {
		srv->sock_dev = (uint64_t)st.st_dev;
		srv->sock_ino = (uint64_t)st.st_ino;
	}
	if (srv->listen_spare >= 0)
		close(srv->listen_spare);
	srv->listen_spare = fd;
	srv->listening = false;
	srv->accept_paused = true;
	uv_close((uv_handle_t *)&srv->listener, on_listener_rebound);
	log_notice("the socket %s was removed while gpucmdd runs: bound it "
		   "again, new clients can connect (%s open carried on)",
		   path,
		   counted(n, sizeof(n), srv->nsessions, "connection",
			   "connections"));
	return true;
}

/*
 * At the tick: a socket file removed (a cleanup of the runtime directory
 * or of /tmp, an operator) is bound again.  One that is another's now (a
 * daemon started on the path since, or a file put there) is left alone,
 * said once, and once that ours is back (a rename back).  Clients that
 * connect by path cannot reach this daemon meanwhile; those connected
 * carry on.
 */
static void socket_gone(struct server *srv)
{
	const char *path = srv->cfg.socket_path;
	struct stat st;
	char n[32];

	if (!srv->listening || srv->activated)
		return;
	if (socket_is_ours(srv)) {
		/* A rename back, after a rename or a failed bind. */
		if (srv->sock_state != SOCK_OURS)
			log_notice("the socket %s is back: clients can connect "
				   "again",
				   path);
		srv->sock_state = SOCK_OURS;
	} else if (lstat(path, &st) != 0 && errno == ENOENT) {
		srv->sock_state = socket_rebind(srv) ? SOCK_OURS : SOCK_UNBOUND;
	} else if (srv->sock_state != SOCK_ANOTHERS) {
		/* Also after binding again failed: that stops trying. */
		log_warn("the socket %s was replaced while gpucmdd runs: new "
			 "clients reach what listens there now, not this "
			 "daemon (%s open carry on); stop this one once they "
			 "are done, or remove that file and this daemon binds "
			 "the path again",
			 path,
			 counted(n, sizeof(n), srv->nsessions, "connection",
				 "connections"));
		srv->sock_state = SOCK_ANOTHERS;
	}
}

/* ---- signals and lifetime ------------------------------------------------ */

/*
 * Services the daemon knows that the file does not list take the defaults
 * ([services] default_*), as they did when they were created.  One whose
 * section was removed is unlisted from now on: it takes the defaults too
 * (an operator who removes a section to take back a large quota must not
 * leave it to whoever joins the name next) and may be retired when its
 * place is needed (gpucmdd.conf(5)).
 */
static void apply_defaults(struct service *svc, void *arg)
{
	const struct config *cfg = arg;

	if (config_find_service(cfg, svc->name) == NULL) {
		atomic_store(&svc->listed, false);
		service_apply(svc, &cfg->default_service);
	}
}

/*
 * Services the file lists get their (new) limits, the others the defaults:
 * those first, so that services the file no longer lists may be retired
 * to make room for the ones it adds.  A listed service with no room (the
 * registry full of services in use) joins at its first Hello that finds
 * room, with its limits (session.c).
 */
static void apply_services(struct server *srv)
{
	service_foreach(apply_defaults, &srv->cfg);
	for (uint32_t i = 0; i < srv->cfg.nservices; i++) {
		const struct config_service *cs = &srv->cfg.services[i];
		struct service *svc = service_get(cs->name, cs);

		if (svc != NULL) {
			service_apply(svc, cs);
			atomic_store(&svc->listed, true);
		} else {
			log_err("service %s is listed but the daemon cannot "
				"register it: it knows %d services already, "
				"each with a connection, memory or a module, "
				"or listed; it is registered when one of them "
				"goes and a client asks for it",
				cs->name, SERVICE_MAX);
		}
	}
}

static int64_t resolve_admin_gid(const struct config *cfg)
{
	struct group *g;

	if (cfg->admin_group[0] == '\0')
		return -1;
	g = getgrnam(cfg->admin_group);
	if (g == NULL) {
		log_warn("admin_group '%s' does not exist: only root and the "
			 "daemon's own user are admins",
			 cfg->admin_group);
		return -1;
	}
	return g->gr_gid;
}

static void status_line(struct server *srv, char *buf, size_t len);

/*
 * Keys of the file that a reload cannot take (gpucmdd.conf(5), RELOADING):
 * say which ones changed, so that an operator who edited one and reloaded
 * is not left thinking it applies.
 */
static void warn_restart_keys(const struct config *run,
			      const struct config *next)
{
	char keys[256] = "";
	size_t n = 0;
	const struct {
		bool changed;
		const char *name;
	} k[] = {
		{ strcmp(run->socket_path, next->socket_path) != 0, "socket" },
		{ run->socket_mode != next->socket_mode, "socket_mode" },
		{ strcmp(run->socket_group, next->socket_group) != 0,
		  "socket_group" },
		{ run->backend != next->backend, "backend" },
		{ run->device != next->device ||
			  strcmp(run->device_id, next->device_id) != 0,
		  "device" },
		{ run->host_memory != next->host_memory, "host_memory" },
		{ run->pinned_memory != next->pinned_memory, "pinned_memory" },
		{ run->log_level != next->log_level, "log_level" },
		{ strcmp(run->layout, next->layout) != 0, "layout" },
		{ run->spin_us != next->spin_us, "spin_us" },
		{ run->host_stream_nice != next->host_stream_nice,
		  "host_stream_nice" },
	};

	for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++)
		if (k[i].changed && n < sizeof(keys))
			n += (size_t)snprintf(keys + n, sizeof(keys) - n,
					      "%s%s", n ? ", " : "", k[i].name);
	if (n != 0)
		log_warn(
			"reload: [daemon] %s changed in %s, but only a restart "
			"applies %s; the daemon keeps running with the old "
			"value%s",
			keys, run->path, strchr(keys, ',') ? "them" : "it",
			strchr(keys, ',') ? "s" : "");
}

int server_reload(struct server *srv)
{
	struct config next;
	char err[512];
	int rc;

	if (srv->cfg.path[0] == '\0' || srv->rebuild == NULL) {
		log_notice("reload: no config file was read at start, nothing "
			   "to reload");
		return 0;
	}
	rc = srv->rebuild(&next, err, sizeof(err));
	if (rc != 0) {
		log_err("reload failed, keeping the current settings: %s", err);
		return rc;
	}
	/*
	 * Only what can change under live connections is taken; the socket,
	 * backend and device need a restart.
	 */
	warn_restart_keys(&srv->cfg, &next);
	srv->cfg.limits = next.limits;
	fit_nofile(srv);
	/* Read only when a stop begins, and SIGHUP is ignored after that. */
	srv->cfg.stop_timeout = next.stop_timeout;
	srv->cfg.unknown_services = next.unknown_services;
	srv->cfg.default_service = next.default_service;
	snprintf(srv->cfg.admin_group, sizeof(srv->cfg.admin_group), "%s",
		 next.admin_group);
	config_free(&srv->cfg);
	srv->cfg.services = next.services;
	srv->cfg.nservices = next.nservices;
	next.services = NULL;
	srv->admin_gid = resolve_admin_gid(&srv->cfg);
	apply_services(srv);
	log_notice("reloaded %s: %u services configured", srv->cfg.path,
		   srv->cfg.nservices);
	return 0;
}

/*
 * systemctl reload only sends the signal (ExecReload=): RELOADING=1 and
 * READY=1 around the reload let systemd show the unit as reloading until
 * the file has been read.  READY=1 follows a refused file too, since the
 * daemon goes on serving with the settings it had.
 */
static void on_sighup(uv_signal_t *sig, int signum)
{
	struct server *srv = sig->data;
	char buf[256];

	(void)signum;
	if (srv->stopping)
		return;
	sd_reloading();
	server_reload(srv);
	status_line(srv, buf, sizeof(buf));
	sd_ready(buf);
}

/*
 * What a stop waits for, "the batches in flight of 3 connections": the
 * drain's STATUS= line and log, and the line of an exit that cuts it short.
 */
static const char *drain_what(const struct server *srv, char *buf, size_t len)
{
	char n[32];

	snprintf(buf, len, "the batches in flight of %s",
		 counted(n, sizeof(n), srv->nsessions, "connection",
			 "connections"));
	return buf;
}

/* Whole seconds, rounded up, until the stop's deadline; 0 once past it. */
static uint64_t stop_left_s(struct server *srv)
{
	uint64_t end =
		srv->stop_began_ms + (uint64_t)srv->cfg.stop_timeout * 1000u;
	uint64_t now = uv_now(srv->loop);

	return now >= end ? 0 : (end - now + 999) / 1000;
}

/*
 * The drain's progress, for STATUS= and every 10 s the log: what it waits
 * for and how long it still will, so that a slow stop does not look wedged.
 */
static void stop_status(struct server *srv, char *buf, size_t len)
{
	char what[96];

	if (srv->cfg.stop_timeout == 0)
		snprintf(buf, len,
			 "stopping: waiting for %s, with no deadline "
			 "(stop_timeout = 0; a second SIGTERM or SIGINT exits "
			 "now)",
			 drain_what(srv, what, sizeof(what)));
	else
		snprintf(buf, len,
			 "stopping: waiting for %s, %llu s left "
			 "before the daemon exits anyway (stop_timeout; a "
			 "second SIGTERM or SIGINT exits now)",
			 drain_what(srv, what, sizeof(what)),
			 (unsigned long long)stop_left_s(srv));
}

static void on_signal(uv_signal_t *sig, int signum)
{
	struct server *srv = sig->data;
	char what[96];

	/*
	 * A second signal while batches drain (a long spin, an operator's
	 * second Ctrl-C): exit now, as systemd's SIGKILL at TimeoutStopSec=
	 * would, but with a line that says what was left.
	 */
	if (srv->stopping) {
		log_warn("%s again: exiting now, without waiting for %s",
			 strsignal(signum),
			 drain_what(srv, what, sizeof(what)));
		_exit(1);
	}
	log_notice("%s: shutting down (%s open)", strsignal(signum),
		   counted(what, sizeof(what), srv->nsessions, "connection",
			   "connections"));
	server_stop(srv);
}

/*
 * Services named in the line that ends a stop at its deadline: a few, so
 * that the line stays one line with every connection of a large daemon.
 */
#define STOP_NAMED_SERVICES 8
/* Connections the deadline lists one line each; the rest are counted. */
#define STOP_LISTED_CONNECTIONS 32

/*
 * One connection that held the stop up to its deadline: draining (the
 * usual case: its batches run), or closed and not yet gone.  Its service
 * stays while it is on the list (service.h, holders), closed or not.
 */
static void stop_log_session(const struct session *s, uint64_t now_ms,
			     uint64_t waited_ms)
{
	const char *svc =
		s->econn.service != NULL ? s->econn.service->name : "(none)";
	const char *why = "";
	char n[32], busy[64] = "";

	if (s->state == SESSION_CLOSING)
		why = s->device_open ? "; it had closed, and the device "
				       "thread had not freed its memory yet" :
				       "; it had closed, and its last replies "
				       "were not written yet";
	/* How long it has had work: the one stuck for minutes stands out. */
	if (s->in_flight > 0)
		snprintf(busy, sizeof(busy),
			 ", with work for %.1f s without a "
			 "pause",
			 (double)(now_ms - s->busy_since_ms) / 1000.0);
	log_warn("stop_timeout: connection %llu (%s, service %s) still had "
		 "%s in flight%s, %.1f s into the stop%s",
		 (unsigned long long)s->id, s->peer, svc,
		 counted(n, sizeof(n), s->in_flight, "batch", "batches"), busy,
		 (double)waited_ms / 1000.0, why);
}

/*
 * [daemon] stop_timeout passed and connections still hold work (a client's
 * long spin, many launches queued): say who, with numbers, and exit 1 as a
 * second SIGTERM does.  Nothing waits for the device thread, which may be
 * inside a kernel that cannot be cut short: that is why there is a
 * deadline.
 */
static void on_stop_deadline(uv_timer_t *t)
{
	struct server *srv = t->data;
	const struct service *named[STOP_NAMED_SERVICES];
	uint64_t waited = uv_now(srv->loop) - srv->stop_began_ms;
	uint64_t batches = 0;
	uint32_t listed = 0, nnamed = 0;
	bool more_services = false;
	/* Room for every name with its ", ": snprintf never truncates. */
	char services[STOP_NAMED_SERVICES * (SERVICE_NAME_MAX + 2) + 1];
	char nb[32], nc[32];
	size_t used = 0;

	/* The last session went in this turn of the loop, which now ends. */
	if (srv->nsessions == 0)
		return;
	services[0] = '\0';
	for (const struct session *s = srv->sessions; s != NULL; s = s->next) {
		const struct service *svc = s->econn.service;
		uint32_t i;

		batches += s->in_flight;
		if (listed++ < STOP_LISTED_CONNECTIONS)
			stop_log_session(s, uv_now(srv->loop), waited);
		if (svc == NULL)
			continue;
		for (i = 0; i < nnamed && named[i] != svc; i++)
			;
		if (i < nnamed)
			continue;
		if (nnamed == STOP_NAMED_SERVICES) {
			more_services = true;
			continue;
		}
		named[nnamed++] = svc;
		used += (size_t)snprintf(services + used,
					 sizeof(services) - used, "%s%s",
					 used != 0 ? ", " : "", svc->name);
	}
	if (listed > STOP_LISTED_CONNECTIONS)
		log_warn("stop_timeout: and %u more connections",
			 listed - STOP_LISTED_CONNECTIONS);
	counted(nb, sizeof(nb), batches, "batch", "batches");
	counted(nc, sizeof(nc), srv->nsessions, "connection", "connections");
	log_err("stop_timeout (%u s) passed with %s in flight on %s "
		"(%s%s%s): exiting with status 1 without waiting for them",
		srv->cfg.stop_timeout, nb, nc,
		nnamed == 0 ? "no service" :
		nnamed == 1 ? "service " :
			      "services ",
		services, more_services ? ", ..." : "");
	sd_status("stopped at stop_timeout (%u s) with %s in flight on %s",
		  srv->cfg.stop_timeout, nb, nc);
	session_log_flush();
	_exit(1);
}

void server_stop(struct server *srv)
{
	struct session *s, *next;
	char buf[256];

	if (srv->stopping)
		return;
	srv->stopping = true;
	srv->stop_began_ms = uv_now(srv->loop);
	if (srv->stop_reason[0] == '\0')
		snprintf(srv->stop_reason, sizeof(srv->stop_reason),
			 "gpucmdd is shutting down: connect again once it has "
			 "restarted (buffers, graphs and regions do not "
			 "survive it)");
	sd_stopping();
	if (srv->listening) {
		/*
		 * Not another daemon's, bound since ours was removed; and
		 * before the close, while a daemon starting on the path
		 * still finds ours live (clear_stale_socket).
		 */
		if (!srv->activated && socket_is_ours(srv))
			unlink(srv->cfg.socket_path);
		uv_close((uv_handle_t *)&srv->listener, NULL);
		srv->listening = false;
	} else if (srv->accept_paused) {
		uv_timer_stop(&srv->accept_resume);
		if (!srv->activated && socket_is_ours(srv))
			unlink(srv->cfg.socket_path);
	}
	if (srv->listen_spare >= 0) {
		close(srv->listen_spare);
		srv->listen_spare = -1;
	}
	for (s = srv->sessions; s != NULL; s = next) {
		next = s->next;
		session_drain(s);
	}
	if (srv->nsessions == 0) {
		uv_stop(srv->loop);
		return;
	}
	if (srv->cfg.stop_timeout != 0)
		uv_timer_start(&srv->stop_deadline, on_stop_deadline,
			       (uint64_t)srv->cfg.stop_timeout * 1000u, 0);
	/* The time left at once, not at the next tick. */
	stop_status(srv, buf, sizeof(buf));
	sd_status("%s", buf);
	log_notice("%s", buf);
}

static void pool_nothing(uv_work_t *w)
{
	(void)w;
}

static void pool_started(uv_work_t *w, int status)
{
	(void)w;
	(void)status;
}

/*
 * libuv starts its thread pool, where modules compile, at the first work
 * queued, and aborts the process when it cannot start one of its threads.
 * Out of threads then (RLIMIT_NPROC, TasksMax=; the host backend's stream
 * workers count too), a client's load_module would end the daemon and
 * every other client's work with it.  Started here, before READY, the
 * pool can only fail a start.
 */
static void start_pool(struct server *srv)
{
	srv->pool_start.data = srv;
	/* It fails only without a work callback. */
	(void)uv_queue_work(srv->loop, &srv->pool_start, pool_nothing,
			    pool_started);
}

int server_init(struct server *srv, uv_loop_t *loop, const struct config *cfg,
		char *why, size_t why_len)
{
	struct executor_callbacks cb = {
		.reply = on_exec_reply,
		.closed = on_exec_closed,
		.fatal = on_exec_fatal,
		.arg = srv,
	};
	int rc;

	memset(srv, 0, sizeof(*srv));
	srv->loop = loop;
	srv->listen_spare = -1;
	if (config_copy(&srv->cfg, cfg) != 0)
		return -ENOMEM;
	srv->admin_gid = resolve_admin_gid(cfg);
	apply_services(srv);
	fit_nofile(srv);
	srv->out_tail = &srv->out_head;
	pthread_mutex_init(&srv->lock, NULL);
	sd_status("opening the device (backend %s)",
		  config_backend_name(cfg->backend));
	rc = executor_start(&srv->cfg, &cb, &srv->ex, why, why_len);
	if (rc != 0) {
		config_free(&srv->cfg);
		return rc;
	}
	uv_async_init(loop, &srv->wakeup, on_wakeup);
	srv->wakeup.data = srv;
	uv_idle_init(loop, &srv->spin);
	srv->spin.data = srv;
	srv->spin_us = cfg->spin_us;
	srv->pieces_cap = cfg->pinned_memory / 2;
	/* Polling never keeps the loop from ending. */
	uv_unref((uv_handle_t *)&srv->spin);
	uv_idle_init(loop, &srv->turns);
	srv->turns.data = srv;
	uv_unref((uv_handle_t *)&srv->turns);
	uv_signal_init(loop, &srv->sigint);
	uv_signal_init(loop, &srv->sigterm);
	srv->sigint.data = srv;
	srv->sigterm.data = srv;
	uv_signal_start(&srv->sigint, on_signal, SIGINT);
	uv_signal_start(&srv->sigterm, on_signal, SIGTERM);
	uv_signal_init(loop, &srv->sighup);
	srv->sighup.data = srv;
	uv_signal_start(&srv->sighup, on_sighup, SIGHUP);
	/* Started by server_stop; the drain ends the loop, not the timer. */
	uv_timer_init(loop, &srv->stop_deadline);
	srv->stop_deadline.data = srv;
	uv_unref((uv_handle_t *)&srv->stop_deadline);
	uv_timer_init(loop, &srv->accept_resume);
	srv->accept_resume.data = srv;
	rc = listen_socket(srv, why, why_len);
	if (rc != 0) {
		uv_close((uv_handle_t *)&srv->accept_resume, NULL);
		uv_close((uv_handle_t *)&srv->stop_deadline, NULL);
		uv_close((uv_handle_t *)&srv->wakeup, NULL);
		uv_close((uv_handle_t *)&srv->spin, NULL);
		uv_close((uv_handle_t *)&srv->turns, NULL);
		uv_close((uv_handle_t *)&srv->sigint, NULL);
		uv_close((uv_handle_t *)&srv->sigterm, NULL);
		uv_close((uv_handle_t *)&srv->sighup, NULL);
		uv_run(loop, UV_RUN_NOWAIT);
		executor_stop(srv->ex);
		srv->ex = NULL;
		config_free(&srv->cfg);
		return rc;
	}
	start_pool(srv);
	return 0;
}

static void close_walk(uv_handle_t *h, void *arg)
{
	(void)arg;
	if (!uv_is_closing(h))
		uv_close(h, NULL);
}

static void status_line(struct server *srv, char *buf, size_t len)
{
	const struct driver_properties *p = executor_properties(srv->ex);

	snprintf(buf, len,
		 "serving %s (%s) on %s: %u connections, %u "
		 "services, %llu batches",
		 p->name, p->backend,
		 srv->activated ? "the systemd socket" : srv->cfg.socket_path,
		 srv->nsessions, service_count(),
		 (unsigned long long)executor_batches(srv->ex));
}

/*
 * Refuse the connections that have not said Hello in time, and those whose
 * large frame stopped half way (session_expire_frame).
 */
static void expire_sessions(struct server *srv)
{
	uint64_t now = uv_now(srv->loop);
	struct session *s, *next;

	for (s = srv->sessions; s != NULL; s = next) {
		next = s->next;
		if (s->state == SESSION_HELLO &&
		    now - s->accepted_ms >= SESSION_HELLO_TIMEOUT_MS)
			session_refuse(s, GPUCMD_EPROTO,
				       "no Hello within %d s of connecting",
				       SESSION_HELLO_TIMEOUT_MS / 1000);
		else
			session_expire_frame(s, now);
	}
	/*
	 * Apart: one may close another of its service (sessions leave the
	 * list only once their handle has closed, after this).
	 */
	for (s = srv->sessions; s != NULL; s = s->next)
		session_expire_unread(s);
}

/*
 * The watchdog ping comes from the loop itself: if the loop wedges, the
 * pings stop and systemd restarts the daemon.  The same tick refreshes
 * STATUS= and ends connections that never said Hello or stopped sending a
 * frame half way.
 */
static void on_tick(uv_timer_t *t)
{
	struct server *srv = t->data;
	char buf[256];

	/*
	 * While stopping, the drain waits for work a client queued (a spin
	 * may run a minute): say so, in systemctl status and every 10 s in
	 * the log, with the time left (stop_status).
	 */
	if (srv->stopping)
		stop_status(srv, buf, sizeof(buf));
	else
		status_line(srv, buf, sizeof(buf));
	sd_status("%s", buf);
	if (sd_watchdog_usec() != 0)
		sd_watchdog_ping();
	session_log_flush();
	log_limit_flush(&fd_lines);
	log_limit_flush(&accept_lines);
	if (srv->stopping) {
		if (++srv->stop_ticks % (10000 / SERVER_TICK_MS) == 0)
			log_notice("%s", buf);
		return;
	}
	expire_sessions(srv);
	socket_gone(srv);
	/* Frame buffers kept for large transfers go back when unused. */
	frame_buf_trim(SERVER_BUF_IDLE_NS);
}

int server_run(struct server *srv)
{
	uint64_t wd = sd_watchdog_usec();
	uint64_t period_ms = SERVER_TICK_MS;
	char buf[256];

	if (wd != 0 && wd / 2000 < period_ms)
		period_ms = wd / 2000 ? wd / 2000 : 1;
	uv_timer_init(srv->loop, &srv->watchdog);
	srv->watchdog.data = srv;
	uv_timer_start(&srv->watchdog, on_tick, period_ms, period_ms);
	uv_unref((uv_handle_t *)&srv->watchdog);
	status_line(srv, buf, sizeof(buf));
	sd_ready(buf);
	uv_run(srv->loop, UV_RUN_DEFAULT);
	/* Every session is gone; the device thread can finish. */
	executor_stop(srv->ex);
	srv->ex = NULL;
	on_wakeup(&srv->wakeup);
	uv_walk(srv->loop, close_walk, NULL);
	uv_run(srv->loop, UV_RUN_DEFAULT);
	pthread_mutex_destroy(&srv->lock);
	config_free(&srv->cfg);
	return srv->exit_code;
}
