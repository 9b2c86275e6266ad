/*
 * check_executor.c - a response the host has no memory for is still
 * answered (executor.h, reply_lost): the device thread posts what it knows
 * of the batch, the loop answers the request with GPUCMD_ENOMEM saying
 * which ops ran, and when even that cannot be made it closes the
 * connection, so the client reads the end of the stream instead of
 * waiting for ever.
 *
 * gpucmd has no malloc fault injection: this suite alone is linked with
 * -Wl,--wrap=frame_encode_buf (Makefile, UNIT_LDFLAGS), so every encoding
 * of a response in the daemon's code goes through __wrap_frame_encode_buf
 * below, which fails the next fail_left of them with -ENOMEM, as a host out
 * of memory would, and counts them.  libgpucmd never calls it (it encodes
 * in pieces), and Welcome frames pass.  calloc is wrapped too, to fail
 * one allocation of a struct session (__wrap_calloc), and accept4 stands
 * in for libc's in libuv (accept_errno).
 *
 * The "executor" case drives an executor on the host backend with callbacks
 * of its own and looks at what it posts; the "loop" case runs the whole
 * daemon (server_init, server_run on a thread) on a private socket in this
 * process, and a libgpucmd client looks at what reaches it.
 */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "config.h"
#include "executor.h"
#include "frame.h"
#include "gpucmd.h"
#include "log.h"
#include "server.h"
#include "service.h"
#include "session.h"
#include "unit.h"

/* ---- the failing encoder ------------------------------------------------- */

static atomic_int fail_left; /* response encodings still to fail */
static atomic_int encodes;   /* response encodings tried since arm() */
static atomic_int fail_code = -ENOMEM; /* what a failing one returns */

int __real_frame_encode_buf(const Gpucmd__Frame *f, uint8_t **out, size_t *len);

int __wrap_frame_encode_buf(const Gpucmd__Frame *f, uint8_t **out, size_t *len)
{
	if (f->msg_case == GPUCMD__FRAME__MSG_RESPONSE) {
		int left = atomic_load(&fail_left);

		atomic_fetch_add(&encodes, 1);
		while (left > 0)
			if (atomic_compare_exchange_weak(&fail_left, &left,
							 left - 1))
				return atomic_load(&fail_code);
	}
	return __real_frame_encode_buf(f, out, len);
}

/*
 * calloc too is wrapped (Makefile): while fail_sessions is set, the next
 * allocation of a struct session, on_connection's, fails, as it would on
 * a host out of memory.  Nothing else allocates one.
 */
static atomic_int fail_sessions;

void *__real_calloc(size_t n, size_t size);

void *__wrap_calloc(size_t n, size_t size)
{
	int one = 1;

	if (n == 1 && size == sizeof(struct session) &&
	    atomic_compare_exchange_strong(&fail_sessions, &one, 0))
		return NULL;
	return __real_calloc(n, size);
}

/* The next n responses the daemon encodes fail. */
static void arm(int n)
{
	atomic_store(&encodes, 0);
	atomic_store(&fail_code, -ENOMEM);
	atomic_store(&fail_left, n);
}

/* ---- an executor of our own ---------------------------------------------- */

/* What the executor posted for the connection, in order. */
struct post {
	bool frame;		/* a response frame came */
	Gpucmd__Frame *decoded; /* it, when flat */
	bool has_lost;
	struct reply_lost lost;
	bool completed;
};

#define MAX_POSTS 8

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct post posts[MAX_POSTS];
	unsigned n;
	bool closed;
} rec = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static struct config ecfg;
static struct executor *ex;
static struct executor_conn econn;

static void on_reply(void *conn, uint8_t *buf, size_t len,
		     struct reply_pieces *pieces, const struct reply_lost *lost,
		     bool completed, void *arg)
{
	struct post *p;

	(void)conn;
	(void)arg;
	pthread_mutex_lock(&rec.lock);
	ck_assert_uint_lt(rec.n, MAX_POSTS);
	p = &rec.posts[rec.n++];
	p->frame = buf != NULL || pieces != NULL;
	if (buf != NULL)
		p->decoded = frame_decode(buf + FRAME_HEADER_SIZE,
					  len - FRAME_HEADER_SIZE);
	p->has_lost = lost != NULL;
	if (lost != NULL)
		p->lost = *lost;
	p->completed = completed;
	pthread_cond_broadcast(&rec.cond);
	pthread_mutex_unlock(&rec.lock);
	frame_buf_free(buf);
	reply_pieces_free(pieces);
}

static void on_closed(void *conn, void *arg)
{
	(void)conn;
	(void)arg;
	pthread_mutex_lock(&rec.lock);
	rec.closed = true;
	pthread_cond_broadcast(&rec.cond);
	pthread_mutex_unlock(&rec.lock);
}

static void on_fatal(const char *why, void *arg)
{
	(void)arg;
	ck_abort_msg("the device is lost: %s", why);
}

/* Wait (10 s at most) until n posts came, or the close with n == 0. */
static void wait_posts(unsigned n)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 10;
	pthread_mutex_lock(&rec.lock);
	while (n > 0 ? rec.n < n : !rec.closed)
		if (pthread_cond_timedwait(&rec.cond, &rec.lock, &until) ==
		    ETIMEDOUT)
			break;
	ck_assert_uint_ge(rec.n, n);
	pthread_mutex_unlock(&rec.lock);
}

static void executor_up(void)
{
	struct executor_callbacks cb = {
		.reply = on_reply,
		.closed = on_closed,
		.fatal = on_fatal,
	};
	char why[512] = "";

	config_defaults(&ecfg);
	ecfg.backend = CONFIG_BACKEND_HOST;
	ecfg.host_memory = 64u << 20;
	ecfg.pinned_memory = 16u << 20;
	ck_assert_msg(executor_start(&ecfg, &cb, &ex, why, sizeof(why)) == 0,
		      "executor_start: %s", why);
	econn.conn = &rec;
	econn.service = service_get("lost", &ecfg.default_service);
	ck_assert_ptr_nonnull(econn.service);
	econn.id = 1;
	econn.limits = ecfg.limits;
	atomic_init(&econn.quiet, false);
	atomic_init(&econn.bytes_done, 0);
}

static void executor_down(void)
{
	ck_assert_int_eq(executor_close(ex, &econn), 0);
	wait_posts(0);
	ck_assert(rec.closed);
	executor_stop(ex);
	for (unsigned i = 0; i < rec.n; i++)
		frame_free(rec.posts[i].decoded);
	config_free(&ecfg);
	service_registry_free();
}

/* Submit request id of the n ops on stream 1, as the loop would. */
static void submit_ops(uint64_t id, Gpucmd__Op **ops, size_t n)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	Gpucmd__Frame *d;
	uint8_t *buf;
	size_t len;

	req.id = id;
	req.stream = 1;
	req.n_ops = n;
	req.ops = ops;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	ck_assert_int_eq(frame_encode(&f, &buf, &len), 0);
	d = frame_decode(buf + FRAME_HEADER_SIZE, len - FRAME_HEADER_SIZE);
	free(buf);
	ck_assert_ptr_nonnull(d);
	ck_assert_int_eq(executor_submit(ex, &econn, d, NULL, 0, NULL, 0), 0);
}

/* Ops for the tests: empty, write, read of a handle; a ping. */
static Gpucmd__OpEmpty op_empty_1 = { PROTOBUF_C_MESSAGE_INIT(
					      &gpucmd__op_empty__descriptor),
				      .handle = 1, .size = 64 };
static uint8_t bytes64[64];
static Gpucmd__OpWrite op_write_1 = {
	PROTOBUF_C_MESSAGE_INIT(&gpucmd__op_write__descriptor), .handle = 1,
	.data = { sizeof(bytes64), bytes64 }
};
static Gpucmd__OpRead op_read_1 = { PROTOBUF_C_MESSAGE_INIT(
					    &gpucmd__op_read__descriptor),
				    .handle = 1, .length = 64 };
static Gpucmd__OpRead op_read_99 = { PROTOBUF_C_MESSAGE_INIT(
					     &gpucmd__op_read__descriptor),
				     .handle = 99, .length = 1 };
static Gpucmd__OpPing op_ping = { PROTOBUF_C_MESSAGE_INIT(
	&gpucmd__op_ping__descriptor) };

static Gpucmd__Op op(Gpucmd__Op__OpCase kind, void *msg)
{
	Gpucmd__Op o = GPUCMD__OP__INIT;

	o.op_case = kind;
	o.empty = msg; /* a oneof: every member shares the pointer */
	return o;
}

static void assert_lost(const struct post *p, uint64_t id, uint32_t nops,
			uint32_t ran, int error, uint32_t failed_index)
{
	ck_assert(!p->frame);
	ck_assert(p->has_lost);
	ck_assert_uint_eq(p->lost.id, id);
	ck_assert_uint_eq(p->lost.nops, nops);
	ck_assert_uint_eq(p->lost.ran, ran);
	ck_assert_int_eq(p->lost.error, error);
	ck_assert_uint_eq(p->lost.failed_index, failed_index);
}

/*
 * Neither the response nor the short error can be encoded: the device
 * thread posts, in the response's place, which ops ran and how the batch
 * ended, with the batch's completion.
 */
START_TEST(executor_posts_what_ran)
{
	Gpucmd__Op o[3] = { op(GPUCMD__OP__OP_EMPTY, &op_empty_1),
			    op(GPUCMD__OP__OP_WRITE, &op_write_1),
			    op(GPUCMD__OP__OP_READ, &op_read_1) };
	Gpucmd__Op *ops[3] = { &o[0], &o[1], &o[2] };
	Gpucmd__Op f[2] = { op(GPUCMD__OP__OP_WRITE, &op_write_1),
			    op(GPUCMD__OP__OP_READ, &op_read_99) };
	Gpucmd__Op *fops[2] = { &f[0], &f[1] };
	Gpucmd__Op p[2] = { op(GPUCMD__OP__OP_PING, &op_ping),
			    op(GPUCMD__OP__OP_PING, &op_ping) };
	Gpucmd__Op *pops[2] = { &p[0], &p[1] };

	executor_up();
	arm(2);
	submit_ops(7, ops, 3);
	wait_posts(1);
	ck_assert_int_eq(atomic_load(&encodes), 2);
	assert_lost(&rec.posts[0], 7, 3, 3, 0, 0);
	ck_assert(rec.posts[0].completed);

	/*
	 * A batch that failed at op 1: op 0 ran.  (Its read never ran, so it
	 * is answered once enqueued, and completes after.)
	 */
	arm(2);
	submit_ops(8, fops, 2);
	wait_posts(3);
	assert_lost(&rec.posts[1], 8, 2, 1, GPUCMD_ENOTFOUND, 1);
	ck_assert(!rec.posts[1].completed);
	ck_assert(!rec.posts[2].frame && !rec.posts[2].has_lost);
	ck_assert(rec.posts[2].completed);

	/* A batch on no stream, answered as soon as it ran. */
	arm(2);
	submit_ops(9, pops, 2);
	wait_posts(4);
	assert_lost(&rec.posts[3], 9, 2, 2, 0, 0);
	ck_assert(rec.posts[3].completed);
	executor_down();
}
END_TEST

/*
 * A batch answered before it completes (no read or sync): the lost answer
 * comes first, its completion alone after it, as a response would.
 */
START_TEST(executor_early_answer_lost)
{
	Gpucmd__Op o[1] = { op(GPUCMD__OP__OP_EMPTY, &op_empty_1) };
	Gpucmd__Op *ops[1] = { &o[0] };

	executor_up();
	arm(2);
	submit_ops(11, ops, 1);
	wait_posts(2);
	assert_lost(&rec.posts[0], 11, 1, 1, 0, 0);
	ck_assert(!rec.posts[0].completed);
	ck_assert(!rec.posts[1].frame);
	ck_assert(!rec.posts[1].has_lost);
	ck_assert(rec.posts[1].completed);
	executor_down();
}
END_TEST

/*
 * Request id of an empty, a write and a read, whose response fails to
 * encode once with code: the device thread's short error answers (and
 * nothing is posted as lost) with code2, no results, failed_index 3 (every
 * op ran) and msg.
 */
static void short_error(uint64_t id, int code, int code2, const char *msg)
{
	Gpucmd__Op o[3] = { op(GPUCMD__OP__OP_EMPTY, &op_empty_1),
			    op(GPUCMD__OP__OP_WRITE, &op_write_1),
			    op(GPUCMD__OP__OP_READ, &op_read_1) };
	Gpucmd__Op *ops[3] = { &o[0], &o[1], &o[2] };
	const Gpucmd__Response *r;

	executor_up();
	arm(1);
	atomic_store(&fail_code, code);
	submit_ops(id, ops, 3);
	wait_posts(1);
	ck_assert_int_eq(atomic_load(&encodes), 2);
	ck_assert(rec.posts[0].frame);
	ck_assert(!rec.posts[0].has_lost);
	ck_assert_ptr_nonnull(rec.posts[0].decoded);
	r = rec.posts[0].decoded->response;
	ck_assert_ptr_nonnull(r);
	ck_assert_uint_eq(r->id, id);
	ck_assert_ptr_nonnull(r->error);
	ck_assert_int_eq(r->error->code, code2);
	ck_assert_uint_eq(r->failed_index, 3);
	ck_assert_uint_eq(r->n_results, 0);
	ck_assert_str_eq(r->error->message, msg);
	executor_down();
}

/* Only the response cannot be encoded: GPUCMD_ENOMEM says what ran. */
START_TEST(executor_short_error_says_enomem)
{
	short_error(12, -ENOMEM, GPUCMD_ENOMEM,
		    "gpucmdd's host ran out of memory answering request 12: "
		    "all 3 of its ops ran, but their results are lost; repeat "
		    "any read or report whose result you need (a smaller one "
		    "needs less of the daemon's memory) once the host has "
		    "memory again");
}
END_TEST

/*
 * A response too large for a frame (dispatch's reply_cap keeps it from
 * happening): every op ran, and the short error says so, with the count,
 * rather than "refused" (failed_index 0).
 */
START_TEST(executor_too_large_says_what_ran)
{
	short_error(13, GPUCMD_ELIMIT, GPUCMD_ELIMIT,
		    "the response is too large for one frame: the first 3 of "
		    "the 3 ops ran, but their results are lost; read less per "
		    "batch");
}
END_TEST

/* The sentences, case by case. */
START_TEST(lost_message_says_what_is_known)
{
	struct reply_lost none = {
		.id = 5, .nops = 4, .ran = 0, .error = GPUCMD_EINVAL
	};
	struct reply_lost all = { .id = 5,
				  .nops = 4,
				  .ran = 4,
				  .error = GPUCMD_ESTREAM,
				  .failed_index = 2 };
	char msg[512];

	reply_lost_message(&none, msg, sizeof(msg));
	ck_assert_str_eq(msg,
			 "gpucmdd's host ran out of memory answering "
			 "request 5: none of its ops ran, it failed with "
			 "GPUCMD_EINVAL at op 0, and the reason is lost; send "
			 "it again to see why once the host has memory again");
	reply_lost_message(&all, msg, sizeof(msg));
	ck_assert_ptr_nonnull(strstr(msg,
				     "request 5: all 4 of its ops ran, "
				     "and it failed with GPUCMD_ESTREAM at op "
				     "2, but their results are lost"));
}
END_TEST

/* ---- the daemon in this process ------------------------------------------ */

static struct {
	char dir[64];
	char sock[128];
	struct config cfg;
	uv_loop_t loop;
	struct server srv;
	uv_async_t stop;
	pthread_t thread;
	int rc;
} td;

static void *loop_main(void *arg)
{
	(void)arg;
	td.rc = server_run(&td.srv);
	return NULL;
}

/* On the loop thread: stop as SIGTERM would. */
static void on_stop(uv_async_t *a)
{
	uv_close((uv_handle_t *)a, NULL);
	server_stop(&td.srv);
}

static void daemon_up(void)
{
	char why[512] = "";

	snprintf(td.dir, sizeof(td.dir), "/tmp/gpucmd-check-executor-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(td.dir));
	snprintf(td.sock, sizeof(td.sock), "%s/sock", td.dir);
	config_defaults(&td.cfg);
	td.cfg.backend = CONFIG_BACKEND_HOST;
	td.cfg.host_memory = 64u << 20;
	td.cfg.pinned_memory = 16u << 20;
	snprintf(td.cfg.socket_path, sizeof(td.cfg.socket_path), "%s", td.sock);
	signal(SIGPIPE, SIG_IGN);
	ck_assert_int_eq(uv_loop_init(&td.loop), 0);
	ck_assert_msg(server_init(&td.srv, &td.loop, &td.cfg, why,
				  sizeof(why)) == 0,
		      "server_init: %s", why);
	ck_assert_int_eq(uv_async_init(&td.loop, &td.stop, on_stop), 0);
	ck_assert_int_eq(pthread_create(&td.thread, NULL, loop_main, NULL), 0);
}

static void daemon_down(void)
{
	uv_async_send(&td.stop);
	ck_assert_int_eq(pthread_join(td.thread, NULL), 0);
	ck_assert_int_eq(td.rc, 0);
	uv_loop_close(&td.loop);
	config_free(&td.cfg);
	service_registry_free();
	rmdir(td.dir);
}

/* A client whose every wait gives up after 10 s: a lost reply fails. */
static struct gpucmd_conn *client(void)
{
	struct gpucmd_conn *c = NULL;
	char msg[256] = "";

	ck_assert_msg(gpucmd_connect_timeout(td.sock, "lost", 10000, &c, msg,
					     sizeof(msg)) == 0,
		      "connect: %s", msg);
	return c;
}

/* {empty 1 (64 bytes), write 1, read 1} on stream 1, submitted: its id. */
static uint64_t submit_write_read(struct gpucmd_conn *c, uint8_t fill)
{
	struct gpucmd_batch *b;
	uint8_t data[64];
	uint64_t id;

	memset(data, fill, sizeof(data));
	ck_assert_int_eq(gpucmd_batch_new(c, 1, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 1, sizeof(data)), 0);
	ck_assert_int_eq(gpucmd_batch_write(b, 1, 0, data, sizeof(data)), 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, sizeof(data)), 0);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	return id;
}

/* Handle 1 of c holds 64 bytes of fill: a batch's write ran. */
static void assert_holds(struct gpucmd_conn *c, uint8_t fill)
{
	struct gpucmd_response *resp;
	struct gpucmd_batch *b;
	uint8_t want[64];
	const void *data;
	size_t len;

	memset(want, fill, sizeof(want));
	ck_assert_int_eq(gpucmd_batch_new(c, 1, &b), 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, sizeof(want)), 0);
	ck_assert_int_eq(gpucmd_run(b, &resp), 0);
	ck_assert_int_eq(gpucmd_response_error(resp), 0);
	ck_assert_int_eq(gpucmd_response_data(resp, 0, &data, &len), 0);
	ck_assert_uint_eq(len, sizeof(want));
	ck_assert_mem_eq(data, want, sizeof(want));
	gpucmd_response_free(resp);
}

/* A write and its read back on c answer, and c holds fill after them. */
static void round_trip_holds(struct gpucmd_conn *c, uint8_t fill)
{
	struct gpucmd_response *resp;

	ck_assert_int_eq(gpucmd_wait(c, submit_write_read(c, fill), &resp), 0);
	ck_assert_int_eq(gpucmd_response_error(resp), 0);
	gpucmd_response_free(resp);
	assert_holds(c, fill);
}

/*
 * Both of the device thread's tries fail (the response, then the short
 * error): the loop's third answers the request, with GPUCMD_ENOMEM, no
 * results, failed_index past the last op (all of them ran) and a sentence
 * that says so.  The ops did run, and the connection goes on.
 */
START_TEST(loop_answers_a_lost_response)
{
	struct gpucmd_response *resp;
	struct gpucmd_conn *c;
	char want[128];
	uint64_t id;

	daemon_up();
	c = client();
	arm(2);
	id = submit_write_read(c, 0x5a);
	ck_assert_int_eq(gpucmd_wait(c, id, &resp), 0);
	ck_assert_int_eq(atomic_load(&encodes), 3);
	ck_assert_int_eq(gpucmd_response_error(resp), GPUCMD_ENOMEM);
	ck_assert_int_eq(gpucmd_response_failed_index(resp), 3);
	ck_assert_uint_eq(gpucmd_response_count(resp), 0);
	snprintf(want, sizeof(want),
		 "ran out of memory answering request "
		 "%llu: all 3 of its ops ran, but their results are lost",
		 (unsigned long long)id);
	ck_assert_msg(strstr(gpucmd_response_message(resp), want) != NULL,
		      "message: %s", gpucmd_response_message(resp));
	gpucmd_response_free(resp);
	ck_assert_int_eq(gpucmd_conn_error(c, NULL), 0);
	assert_holds(c, 0x5a);
	gpucmd_close(c);
	daemon_down();
}
END_TEST

/*
 * The device thread's first try fails (no memory for the whole response):
 * its short error, GPUCMD_ENOMEM with what ran, answers, not the "too large
 * for one frame" that only a response over FRAME_MAX_BODY deserves.  And a
 * batch that failed says so: the ops before op 1 ran, op 1 failed.
 */
START_TEST(device_thread_answers_with_enomem)
{
	struct gpucmd_response *resp;
	struct gpucmd_batch *b;
	struct gpucmd_conn *c;
	char want[160];
	uint64_t id;

	daemon_up();
	c = client();
	arm(1);
	id = submit_write_read(c, 0x33);
	ck_assert_int_eq(gpucmd_wait(c, id, &resp), 0);
	ck_assert_int_eq(atomic_load(&encodes), 2);
	ck_assert_int_eq(gpucmd_response_error(resp), GPUCMD_ENOMEM);
	ck_assert_int_eq(gpucmd_response_failed_index(resp), 3);
	ck_assert_ptr_null(strstr(gpucmd_response_message(resp), "too large"));
	gpucmd_response_free(resp);

	ck_assert_int_eq(gpucmd_batch_new(c, 1, &b), 0);
	ck_assert_int_eq(gpucmd_batch_write(b, 1, 0, "x", 1), 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 99, 0, 1), 0);
	ck_assert_int_eq(gpucmd_batch_sync(b), 0);
	arm(2);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	ck_assert_int_eq(gpucmd_wait(c, id, &resp), 0);
	ck_assert_int_eq(atomic_load(&encodes), 3);
	ck_assert_int_eq(gpucmd_response_error(resp), GPUCMD_ENOMEM);
	ck_assert_int_eq(gpucmd_response_failed_index(resp), 1);
	snprintf(want, sizeof(want),
		 "request %llu: the ops before op 1 ran, "
		 "then it failed with GPUCMD_ENOTFOUND at op 1 and the rest "
		 "did not run",
		 (unsigned long long)id);
	ck_assert_msg(strstr(gpucmd_response_message(resp), want) != NULL,
		      "message: %s", gpucmd_response_message(resp));
	gpucmd_response_free(resp);
	gpucmd_close(c);
	daemon_down();
}
END_TEST

/*
 * Not even the loop's try: the connection closes with the reason logged,
 * and the client reads the end of the stream (GPUCMD_EDISCONNECTED) at
 * once, not its timeout.  Another client is still served.
 */
START_TEST(loop_closes_when_nothing_can_be_encoded)
{
	struct gpucmd_response *resp = NULL;
	struct gpucmd_conn *c, *other;
	char want[160], log[8192] = "";
	FILE *f = tmpfile();
	uint64_t id, id2;
	size_t n;

	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(dup2(fileno(f), STDERR_FILENO), STDERR_FILENO);
	daemon_up();
	c = client();
	arm(3);
	id = submit_write_read(c, 0x11);
	ck_assert_int_eq(gpucmd_wait(c, id, &resp), GPUCMD_EDISCONNECTED);
	ck_assert_ptr_null(resp);
	ck_assert_int_eq(atomic_load(&encodes), 3);
	gpucmd_close(c);

	other = client();
	arm(0);
	id2 = submit_write_read(other, 0x22);
	ck_assert_int_eq(gpucmd_wait(other, id2, &resp), 0);
	ck_assert_int_eq(gpucmd_response_error(resp), 0);
	gpucmd_response_free(resp);
	assert_holds(other, 0x22);
	gpucmd_close(other);
	daemon_down();
	rewind(f);
	n = fread(log, 1, sizeof(log) - 1, f);
	log[n] = '\0';
	snprintf(want, sizeof(want),
		 "closed: the host is out of memory: the "
		 "response to request %llu could not be made",
		 (unsigned long long)id);
	ck_assert_msg(strstr(log, want) != NULL, "log: %s", log);
	fclose(f);
}
END_TEST

/*
 * A batch the loop answers itself (pings): its response too is answered
 * with GPUCMD_ENOMEM when it cannot be encoded, and closes the connection
 * when that cannot either.
 */
START_TEST(loop_answer_lost_too)
{
	struct gpucmd_response *resp;
	struct gpucmd_batch *b;
	struct gpucmd_conn *c;
	uint64_t id;

	daemon_up();
	c = client();
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_ping(b), 0);
	ck_assert_int_eq(gpucmd_batch_ping(b), 0);
	arm(1);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	ck_assert_int_eq(gpucmd_wait(c, id, &resp), 0);
	ck_assert_int_eq(atomic_load(&encodes), 2);
	ck_assert_int_eq(gpucmd_response_error(resp), GPUCMD_ENOMEM);
	ck_assert_int_eq(gpucmd_response_failed_index(resp), 2);
	ck_assert_ptr_nonnull(
		strstr(gpucmd_response_message(resp), "all 2 of its ops ran"));
	gpucmd_response_free(resp);

	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_ping(b), 0);
	arm(2);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	ck_assert_int_eq(gpucmd_wait(c, id, &resp), GPUCMD_EDISCONNECTED);
	ck_assert_int_eq(atomic_load(&encodes), 2);
	gpucmd_close(c);
	daemon_down();
}
END_TEST

/*
 * gpucmd_region_create whose attach ran but whose answer was lost: the
 * daemon holds the region, so libgpucmd keeps it too, as created (a
 * forgotten one would keep its id taken there).  It is usable, and
 * releasing it succeeds on both sides.
 */
START_TEST(region_attach_whose_answer_was_lost_is_kept)
{
	struct gpucmd_conn *c;
	void *p = NULL;

	daemon_up();
	c = client();
	arm(2);
	ck_assert_int_eq(gpucmd_region_create(c, 7, 4096, &p), 0);
	ck_assert_int_eq(atomic_load(&encodes), 3);
	ck_assert_ptr_nonnull(p);
	memset(p, 0x42, 4096);
	ck_assert_int_eq(gpucmd_region_release(c, 7), 0);
	ck_assert_int_eq(gpucmd_region_create(c, 7, 4096, &p), 0);
	ck_assert_int_eq(gpucmd_region_release(c, 7), 0);
	gpucmd_close(c);
	daemon_down();
}
END_TEST

/* ---- an accept that keeps failing ---------------------------------------- */

/*
 * accept4 as libuv calls it: this executable's definition, exported
 * (Makefile), comes before libc's for libuv too.  While accept_errno is not 0 it fails with it, as
 * the kernel does for a daemon out of descriptors when libuv's way out (it
 * closes a descriptor it keeps for this, then accepts again) cannot help:
 * another thread took that descriptor first, or the system's file table is
 * full (ENFILE).
 */
static atomic_int accept_errno;

/* Visible, unlike the rest of the build: a hidden one is not exported. */
__attribute__((visibility("default"))) int
accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	int err = atomic_load(&accept_errno);

	if (err != 0) {
		errno = err;
		return -1;
	}
	return (int)syscall(SYS_accept4, fd, addr, len, flags);
}

/*
 * While accepts fail for descriptors, the loop goes on serving the
 * connections it has, and once they succeed again the clients that
 * waited in the socket's queue, and new ones, are served.  libuv calls
 * on_connection again at once after such a failure, for as long as the
 * listener is open: the loop used to spin there, deaf to everyone, with
 * an "accept failed" warning each time round.
 */
START_TEST(accepts_failing_for_descriptors_do_not_wedge_the_loop)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct gpucmd_conn *c, *late;
	int waiting;

	daemon_up();
	c = client();
	atomic_store(&accept_errno, ENFILE);
	waiting = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(waiting, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", td.sock);
	ck_assert_int_eq(connect(waiting, (struct sockaddr *)&sa, sizeof(sa)),
			 0);
	/* The second round trip needs the loop past the failed accept. */
	round_trip_holds(c, 0x11);
	atomic_store(&accept_errno, 0);
	late = client();
	round_trip_holds(late, 0x22);
	close(waiting);
	gpucmd_close(late);
	gpucmd_close(c);
	daemon_down();
}
END_TEST

/*
 * No memory for a connection libuv accepted: the daemon closes it (it has
 * no memory to say why) and goes on accepting.  Not taken, the accepted
 * client stopped the listener for good, libuv waiting for the uv_accept
 * that never came: every later client waited, unanswered.
 */
START_TEST(no_memory_for_a_connection_does_not_stop_accepting)
{
	struct gpucmd_response *resp;
	struct gpucmd_conn *c, *refused = NULL, *late;
	char msg[256] = "";

	daemon_up();
	c = client();
	atomic_store(&fail_sessions, 1);
	ck_assert_int_eq(gpucmd_connect_timeout(td.sock, "lost", 10000,
						&refused, msg, sizeof(msg)),
			 GPUCMD_EDISCONNECTED);
	ck_assert_int_eq(atomic_load(&fail_sessions), 0);
	late = client();
	round_trip_holds(late, 0x33);
	ck_assert_int_eq(gpucmd_wait(c, submit_write_read(c, 0x44), &resp), 0);
	ck_assert_int_eq(gpucmd_response_error(resp), 0);
	gpucmd_response_free(resp);
	gpucmd_close(late);
	gpucmd_close(c);
	daemon_down();
}
END_TEST

/*
 * pthread_create for everyone in this process, libuv's pool included: the
 * executable's definition, exported (Makefile), comes first.  While
 * refuse_threads is set it fails with EAGAIN, as for a daemon at its
 * RLIMIT_NPROC or TasksMax=; else it is the next one (libc's, or a
 * sanitizer's).
 */
static atomic_int refuse_threads;

__attribute__((visibility("default"))) int
pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *),
	       void *arg)
{
	static int (*next)(pthread_t *, const pthread_attr_t *,
			   void *(*)(void *), void *);

	if (atomic_load(&refuse_threads))
		return EAGAIN;
	if (next == NULL)
		*(void **)&next = dlsym(RTLD_NEXT, "pthread_create");
	return next(t, attr, fn, arg);
}

static const char some_ptx[] = ".version 7.0\n.target sm_50\n";

/* A batch of one op, empty handle 9 of 64 bytes, on stream; its answer. */
static struct gpucmd_response *run_empty(struct gpucmd_conn *c, uint32_t stream)
{
	struct gpucmd_response *resp;
	struct gpucmd_batch *b;

	ck_assert_int_eq(gpucmd_batch_new(c, stream, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 9, 64), 0);
	ck_assert_int_eq(gpucmd_run(b, &resp), 0);
	return resp;
}

/*
 * A load_module with no thread to be had: libuv starts its pool at the
 * first work queued and aborts when it cannot start a thread, so the
 * first module compiled then took the daemon down with every client.  The
 * daemon starts the pool at its start: the load is answered (the host
 * backend loads no modules), a new stream is refused for its thread with
 * the limit named, and once threads come back it is made.
 */
START_TEST(a_module_compiled_out_of_threads_does_not_abort)
{
	struct gpucmd_response *resp;
	struct gpucmd_batch *b;
	struct gpucmd_conn *c;

	daemon_up();
	c = client();
	atomic_store(&refuse_threads, 1);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_load_module(b, 7, "ptx", some_ptx,
						  sizeof(some_ptx) - 1),
			 0);
	ck_assert_int_eq(gpucmd_run(b, &resp), 0);
	ck_assert_msg(gpucmd_response_error(resp) == GPUCMD_EUNSUPPORTED,
		      "load_module: %s", gpucmd_response_message(resp));
	gpucmd_response_free(resp);
	resp = run_empty(c, 3);
	atomic_store(&refuse_threads, 0);
	ck_assert_int_eq(gpucmd_response_error(resp), -EAGAIN);
	ck_assert_msg(strstr(gpucmd_response_message(resp), "RLIMIT_NPROC"),
		      "message: %s", gpucmd_response_message(resp));
	gpucmd_response_free(resp);
	resp = run_empty(c, 3);
	ck_assert_msg(gpucmd_response_error(resp) == 0, "empty: %s",
		      gpucmd_response_message(resp));
	gpucmd_response_free(resp);
	gpucmd_close(c);
	daemon_down();
}
END_TEST

static Suite *executor_suite(void)
{
	Suite *s = suite_create("executor");
	TCase *tc = tcase_create("executor");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, executor_posts_what_ran);
	tcase_add_test(tc, executor_early_answer_lost);
	tcase_add_test(tc, executor_short_error_says_enomem);
	tcase_add_test(tc, executor_too_large_says_what_ran);
	tcase_add_test(tc, lost_message_says_what_is_known);
	suite_add_tcase(s, tc);

	tc = tcase_create("loop");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, loop_answers_a_lost_response);
	tcase_add_test(tc, device_thread_answers_with_enomem);
	tcase_add_test(tc, loop_closes_when_nothing_can_be_encoded);
	tcase_add_test(tc, loop_answer_lost_too);
	tcase_add_test(tc, region_attach_whose_answer_was_lost_is_kept);
	tcase_add_test(tc,
		       accepts_failing_for_descriptors_do_not_wedge_the_loop);
	tcase_add_test(tc, no_memory_for_a_connection_does_not_stop_accepting);
	tcase_add_test(tc, a_module_compiled_out_of_threads_does_not_abort);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_main(executor_suite());
}
