/*
 * test_fake_daemon.c - what libgpucmd makes of a daemon that misbehaves: a
 * fake one (a forked process on a socket of the test's own) reads Hello,
 * maybe answers with a Welcome and reads one request, then sends what the
 * case wants: a length no daemon sends, bytes that are not protobuf, an
 * answer to a request nobody made, a frame cut short or stalled, another
 * protocol version, a frame only a client sends.  The
 * client must get a code (GPUCMD_EPROTO for what is not the protocol, as
 * libgpucmd(3) says), a sentence from gpucmd_conn_error, and the same code
 * from every later call; never a crash, a hang or a huge allocation.
 */
#include <sys/resource.h>

#include "frame.h"
#include "harness.h"

static const char *const MAGIC_CUT = "cut";

enum fake_mode {
	FAKE_HELLO_RUNAWAY, /* answer Hello with a 4 GiB header */
	FAKE_RUNAWAY,	    /* answer the request with a header over 1 GiB */
	FAKE_NOT_PROTOBUF,  /* a body that does not decode */
	FAKE_UNKNOWN_ID,    /* a response to a request never made */
	FAKE_CUT,	    /* half a frame, then close */
	FAKE_STALL,	    /* half a frame, then nothing */
	FAKE_EVICT_MID_REQUEST, /* read part of a request, Error, close */
	FAKE_SLOW_READER,	/* read the request slowly, then answer it */
	FAKE_STOP_READING,	/* read part of a request, then nothing */
	FAKE_OTHER_VERSION,	/* a Welcome for another protocol version */
	FAKE_HELLO_FOR_HELLO,	/* answer Hello with a Hello */
	FAKE_HELLO_FOR_REQUEST, /* answer the request with a Hello */
};

/* FAKE_SLOW_READER's pace: this many bytes, then a pause of this long. */
#define SLOW_CHUNK (8u << 10)
#define SLOW_PAUSE_US 5000

static const char *const EVICT_WHY = "evicted by connection 7 (pid 1)";

static char fake_sock[160];

static int read_full(int fd, void *buf, size_t n)
{
	for (size_t got = 0; got < n;) {
		ssize_t k = read(fd, (char *)buf + got, n - got);

		if (k <= 0)
			return -1;
		got += (size_t)k;
	}
	return 0;
}

/* One frame from the client, decoded (NULL when it does not come). */
static Gpucmd__Frame *fake_read(int fd)
{
	uint8_t head[FRAME_HEADER_SIZE], *body;
	struct frame_header h;
	Gpucmd__Frame *f;

	if (read_full(fd, head, sizeof(head)) != 0)
		return NULL;
	frame_header_unpack(head, &h);
	body = malloc(h.length + 1);
	if (body == NULL || read_full(fd, body, h.length) != 0) {
		free(body);
		return NULL;
	}
	f = gpucmd__frame__unpack(NULL, h.length, body);
	free(body);
	return f;
}

static void fake_write(int fd, const void *buf, size_t n)
{
	if (write(fd, buf, n) != (ssize_t)n)
		_exit(3);
}

static void fake_header(int fd, uint32_t length)
{
	struct frame_header h = { FRAME_MAGIC, GPUCMD_PROTOCOL_VERSION, 0,
				  length };
	uint8_t buf[FRAME_HEADER_SIZE];

	frame_header_pack(&h, buf);
	fake_write(fd, buf, sizeof(buf));
}

static void fake_send(int fd, const Gpucmd__Frame *f)
{
	uint8_t *buf;
	size_t n;

	if (frame_encode(f, &buf, &n) != 0)
		_exit(3);
	fake_write(fd, buf, n);
	free(buf);
}

/* A Hello, which only a client sends. */
static void fake_hello(int fd)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Hello h = GPUCMD__HELLO__INIT;

	h.protocol_version = GPUCMD_PROTOCOL_VERSION;
	h.service = "fake";
	f.msg_case = GPUCMD__FRAME__MSG_HELLO;
	f.hello = &h;
	fake_send(fd, &f);
}

static void fake_welcome_as(int fd, uint32_t version)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Welcome w = GPUCMD__WELCOME__INIT;
	Gpucmd__Limits l = GPUCMD__LIMITS__INIT;
	Gpucmd__DeviceInfo d = GPUCMD__DEVICE_INFO__INIT;

	w.protocol_version = version;
	w.service = "fake";
	w.connection_id = 1;
	d.name = "fake";
	d.backend = "host";
	l.max_in_flight = 16;
	l.max_ops_per_batch = 64;
	w.device = &d;
	w.limits = &l;
	f.msg_case = GPUCMD__FRAME__MSG_WELCOME;
	f.welcome = &w;
	fake_send(fd, &f);
}

static void fake_welcome(int fd)
{
	fake_welcome_as(fd, GPUCMD_PROTOCOL_VERSION);
}

static void fake_serve(int lfd, enum fake_mode mode)
{
	int fd = accept(lfd, NULL, NULL);
	Gpucmd__Frame *req;
	uint64_t id = 0;

	if (fd < 0 || fake_read(fd) == NULL)
		_exit(3);
	if (mode == FAKE_HELLO_RUNAWAY) {
		fake_header(fd, UINT32_MAX);
		pause();
	}
	if (mode == FAKE_OTHER_VERSION || mode == FAKE_HELLO_FOR_HELLO) {
		if (mode == FAKE_OTHER_VERSION)
			fake_welcome_as(fd, GPUCMD_PROTOCOL_VERSION + 1);
		else
			fake_hello(fd);
		pause();
	}
	fake_welcome(fd);
	if (mode == FAKE_SLOW_READER) {
		/*
		 * A daemon that keeps taking a large request, slower than the
		 * client's timeout allows for the whole of it.
		 */
		Gpucmd__Frame f = GPUCMD__FRAME__INIT;
		Gpucmd__Response r = GPUCMD__RESPONSE__INIT;
		uint8_t head[FRAME_HEADER_SIZE];
		static uint8_t chunk[SLOW_CHUNK];
		struct frame_header h;

		if (read_full(fd, head, sizeof(head)) != 0)
			_exit(3);
		frame_header_unpack(head, &h);
		for (uint32_t left = h.length; left > 0;) {
			uint32_t k = left < SLOW_CHUNK ? left : SLOW_CHUNK;

			if (read_full(fd, chunk, k) != 0)
				_exit(3);
			left -= k;
			usleep(SLOW_PAUSE_US);
		}
		/* The client's first request is id 1. */
		r.id = 1;
		f.msg_case = GPUCMD__FRAME__MSG_RESPONSE;
		f.response = &r;
		fake_send(fd, &f);
		pause();
	}
	if (mode == FAKE_STOP_READING) {
		static char part[FRAME_HEADER_SIZE + 4096];

		if (read_full(fd, part, sizeof(part)) != 0)
			_exit(3);
		pause();
	}
	if (mode == FAKE_EVICT_MID_REQUEST) {
		/*
		 * As the daemon evicts a connection whose large request is
		 * still arriving: it stops reading, says why, and closes with
		 * the rest of the request unread.
		 */
		static char part[FRAME_HEADER_SIZE + 4096];
		Gpucmd__Frame f = GPUCMD__FRAME__INIT;
		Gpucmd__Error e = GPUCMD__ERROR__INIT;

		if (read_full(fd, part, sizeof(part)) != 0)
			_exit(3);
		e.code = GPUCMD_EDISCONNECTED;
		e.message = (char *)EVICT_WHY;
		f.msg_case = GPUCMD__FRAME__MSG_ERROR;
		f.error = &e;
		fake_send(fd, &f);
		close(fd);
		_exit(0);
	}
	req = fake_read(fd);
	if (req != NULL && req->msg_case == GPUCMD__FRAME__MSG_REQUEST)
		id = req->request->id;
	switch (mode) {
	case FAKE_RUNAWAY:
		fake_header(fd, FRAME_MAX_BODY + 1u);
		pause();
		break;
	case FAKE_NOT_PROTOBUF:
		fake_header(fd, 8);
		fake_write(fd, "\xff\xff\xff\xff\xff\xff\xff\xff", 8);
		pause();
		break;
	case FAKE_UNKNOWN_ID: {
		Gpucmd__Frame f = GPUCMD__FRAME__INIT;
		Gpucmd__Response r = GPUCMD__RESPONSE__INIT;

		r.id = id + 100;
		f.msg_case = GPUCMD__FRAME__MSG_RESPONSE;
		f.response = &r;
		fake_send(fd, &f);
		pause();
		break;
	}
	case FAKE_HELLO_FOR_REQUEST:
		fake_hello(fd);
		pause();
		break;
	case FAKE_CUT:
	case FAKE_STALL:
		fake_header(fd, 100);
		fake_write(fd, MAGIC_CUT, 3);
		if (mode == FAKE_STALL)
			pause();
		break;
	default:
		break;
	}
	close(fd);
	_exit(0);
}

/* Start the fake daemon for mode; it goes when the test process does. */
static pid_t fake_start(enum fake_mode mode)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	const char *base = getenv("GPUCMD_TEST_TMP");
	pid_t pid;
	int lfd;

	snprintf(fake_sock, sizeof(fake_sock), "%s/fake-%ld.sock",
		 base != NULL && base[0] ? base : "/tmp", (long)getpid());
	unlink(fake_sock);
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", fake_sock);
	lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	ck_assert_int_ge(lfd, 0);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	ck_assert_int_eq(listen(lfd, 4), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		fake_serve(lfd, mode);
	}
	close(lfd);
	return pid;
}

static void fake_stop(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	unlink(fake_sock);
}

/* Connect to the fake daemon (which must welcome us) with timeout_ms. */
static struct gpucmd_conn *fake_connect(int timeout_ms)
{
	struct gpucmd_conn *c = NULL;
	char msg[256] = "";
	int rc = gpucmd_connect_timeout(fake_sock, "fake", timeout_ms, &c, msg,
					sizeof(msg));

	ck_assert_msg(rc == 0, "connect: %s (%s)", gpucmd_errname(rc), msg);
	return c;
}

/* A ping run on c: its code. */
static int ping(struct gpucmd_conn *c)
{
	struct gpucmd_batch *b;
	struct gpucmd_response *r = NULL;
	int rc;

	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_ping(b), 0);
	rc = gpucmd_run(b, &r);
	if (rc == 0)
		gpucmd_response_free(r);
	return rc;
}

/*
 * c died with code, for the reason containing words: every later call
 * says so at once.
 */
static void assert_dead(struct gpucmd_conn *c, int code, const char *words)
{
	struct gpucmd_status st;
	const char *why = NULL;
	char buf[16];

	ck_assert_int_eq(gpucmd_conn_error(c, &why), code);
	ck_assert_msg(strstr(why, words) != NULL,
		      "why: \"%s\", expected \"%s\"", why, words);
	ck_assert_int_eq(ping(c), code);
	ck_assert_int_eq(gpucmd_status(c, &st), code);
	ck_assert_int_eq(gpucmd_read_buffer(c, 0, 1, 0, sizeof(buf), buf),
			 code);
}

static void expect_ping_kills(enum fake_mode mode, int timeout_ms, int code,
			      const char *words);

/* Connecting to a fake daemon in mode fails with code; msg names words. */
static void connect_refused(enum fake_mode mode, int code, const char *words)
{
	pid_t pid = fake_start(mode);
	struct gpucmd_conn *c = NULL;
	char msg[256] = "";

	ck_assert_int_eq(gpucmd_connect_timeout(fake_sock, "fake", 5000, &c,
						msg, sizeof(msg)),
			 code);
	ck_assert_ptr_null(c);
	ck_assert_msg(strstr(msg, words) != NULL, "msg: %s", msg);
	fake_stop(pid);
}

START_TEST(hello_answered_with_a_runaway_length)
{
	connect_refused(FAKE_HELLO_RUNAWAY, GPUCMD_EPROTO, "4294967295 bytes");
}
END_TEST

/* A daemon of another protocol version is named with both versions. */
START_TEST(welcome_of_another_version)
{
	char words[80];

	snprintf(words, sizeof(words),
		 "the daemon speaks protocol %u, this library %u",
		 GPUCMD_PROTOCOL_VERSION + 1, GPUCMD_PROTOCOL_VERSION);
	connect_refused(FAKE_OTHER_VERSION, GPUCMD_EVERSION, words);
}
END_TEST

/* Frames a client never gets, for Hello and for a request: EPROTO. */
START_TEST(frames_a_client_never_gets)
{
	connect_refused(FAKE_HELLO_FOR_HELLO, GPUCMD_EPROTO,
			"answered Hello with frame type 1 instead of Welcome");
	expect_ping_kills(FAKE_HELLO_FOR_REQUEST, 5000, GPUCMD_EPROTO,
			  "frame of type 1, which a client never gets");
}
END_TEST

START_TEST(reply_with_a_runaway_length)
{
	pid_t pid = fake_start(FAKE_RUNAWAY);
	struct gpucmd_conn *c = fake_connect(5000);
	struct rusage ru;

	ck_assert_int_eq(ping(c), GPUCMD_EPROTO);
	assert_dead(c, GPUCMD_EPROTO, "1073741825 bytes");
	/* Nothing was allocated for the body that never comes. */
	ck_assert_int_eq(getrusage(RUSAGE_SELF, &ru), 0);
	ck_assert_int_lt(ru.ru_maxrss, 256 * 1024);
	gpucmd_close(c);
	fake_stop(pid);
}
END_TEST

/*
 * Against a fake daemon in mode, a ping fails with code, and the
 * connection is dead saying words; timeout_ms as fake_connect.
 */
static void expect_ping_kills(enum fake_mode mode, int timeout_ms, int code,
			      const char *words)
{
	pid_t pid = fake_start(mode);
	struct gpucmd_conn *c = fake_connect(timeout_ms);

	ck_assert_int_eq(ping(c), code);
	assert_dead(c, code, words);
	gpucmd_close(c);
	fake_stop(pid);
}

START_TEST(reply_that_is_not_protobuf)
{
	expect_ping_kills(FAKE_NOT_PROTOBUF, 5000, GPUCMD_EPROTO,
			  "not a gpucmd message");
}
END_TEST

START_TEST(reply_to_a_request_never_made)
{
	expect_ping_kills(FAKE_UNKNOWN_ID, 5000, GPUCMD_EPROTO, "request 101");
}
END_TEST

START_TEST(reply_cut_short_by_a_close)
{
	expect_ping_kills(FAKE_CUT, -1, GPUCMD_EDISCONNECTED,
			  "closed the connection");
}
END_TEST

START_TEST(reply_that_stalls_half_way)
{
	pid_t pid = fake_start(FAKE_STALL);
	struct gpucmd_conn *c = fake_connect(200);
	uint64_t t0 = harness_now_us();

	ck_assert_int_eq(ping(c), -ETIMEDOUT);
	/* A frame that began may pause a second before it counts as stopped. */
	ck_assert_uint_lt(harness_now_us() - t0, 5000000);
	assert_dead(c, -ETIMEDOUT, "middle of a frame");
	gpucmd_close(c);
	fake_stop(pid);
}
END_TEST

/* A one-write batch of n zero bytes run on c: its code. */
static int run_large_write(struct gpucmd_conn *c, size_t n)
{
	char *data = calloc(1, n);
	struct gpucmd_batch *b;
	struct gpucmd_response *r = NULL;
	int rc;

	ck_assert_ptr_nonnull(data);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_write_borrowed(b, 1, 0, data, n), 0);
	rc = gpucmd_run(b, &r);
	gpucmd_response_free(r);
	free(data);
	return rc;
}

/*
 * The daemon ends the connection while a request larger than the socket's
 * buffers is going out: the send fails half way, and the reason the
 * daemon sent before it closed is still read and reported (it was
 * "sending a request failed after part of it went out").
 */
START_TEST(eviction_in_the_middle_of_a_request_says_why)
{
	pid_t pid = fake_start(FAKE_EVICT_MID_REQUEST);
	struct gpucmd_conn *c = fake_connect(5000);

	ck_assert_int_eq(run_large_write(c, 8u << 20), GPUCMD_EDISCONNECTED);
	assert_dead(c, GPUCMD_EDISCONNECTED, EVICT_WHY);
	gpucmd_close(c);
	fake_stop(pid);
}
END_TEST

/*
 * The timeout bounds the wait for a request to begin going out; once it
 * goes, it goes whole while the daemon keeps taking it (it was one
 * deadline for the whole send, so this one, taking 256 x 5 ms and more
 * against a timeout of 500 ms, was cut off and the connection closed).
 */
START_TEST(request_taken_slowly_is_sent_whole)
{
	pid_t pid = fake_start(FAKE_SLOW_READER);
	/*
	 * 256 pauses of 5 ms against a timeout of 500 ms: the whole send
	 * takes more than twice the timeout.  A sender blocked on a full
	 * AF_UNIX socket wakes only when most of its buffer (~160 KiB here)
	 * has been read, 20 pauses, so each wait is ~100 ms of the 500 (it
	 * was 2 ms x 16 KiB against 20 ms, and 10 pauses came to the whole
	 * timeout: under ASan on a busy CI machine a wait passed it).
	 */
	struct gpucmd_conn *c = fake_connect(500);
	uint64_t t0 = harness_now_us();
	size_t n = 2u << 20;

	ck_assert_int_eq(run_large_write(c, n), 0);
	/* It did take longer than the timeout. */
	ck_assert_uint_gt(harness_now_us() - t0,
			  (n / SLOW_CHUNK) * SLOW_PAUSE_US / 2);
	ck_assert_int_eq(gpucmd_conn_error(c, NULL), 0);
	gpucmd_close(c);
	fake_stop(pid);
}
END_TEST

/* ...and a request the daemon stops taking half way closes it. */
START_TEST(request_the_daemon_stops_taking_closes)
{
	pid_t pid = fake_start(FAKE_STOP_READING);
	struct gpucmd_conn *c = fake_connect(200);
	uint64_t t0 = harness_now_us();

	ck_assert_int_eq(run_large_write(c, 8u << 20), -ETIMEDOUT);
	/* A request that began may pause a second before it counts as
	 * stopped. */
	ck_assert_uint_gt(harness_now_us() - t0, 900000);
	ck_assert_uint_lt(harness_now_us() - t0, 10000000);
	assert_dead(c, -ETIMEDOUT,
		    "stopped reading in the middle of a request");
	gpucmd_close(c);
	fake_stop(pid);
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("fake_daemon");
	TCase *tc = tcase_create("fake_daemon");

	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, hello_answered_with_a_runaway_length);
	tcase_add_test(tc, welcome_of_another_version);
	tcase_add_test(tc, frames_a_client_never_gets);
	tcase_add_test(tc, reply_with_a_runaway_length);
	tcase_add_test(tc, reply_that_is_not_protobuf);
	tcase_add_test(tc, reply_to_a_request_never_made);
	tcase_add_test(tc, reply_cut_short_by_a_close);
	tcase_add_test(tc, reply_that_stalls_half_way);
	tcase_add_test(tc, eviction_in_the_middle_of_a_request_says_why);
	tcase_add_test(tc, request_taken_slowly_is_sent_whole);
	tcase_add_test(tc, request_the_daemon_stops_taking_closes);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return harness_main(make_suite());
}
