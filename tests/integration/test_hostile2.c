/*
 * test_hostile2.c - what a hostile or broken client can do to a real
 * gpucmdd, beyond the framing cases of test_hostile.c: frames at and over
 * the limits, messages in the wrong place, absurd values in valid protobuf
 * (sizes and offsets near 2^64, zero and oversized grids, unknown kernels and
 * ops, wrong argument kinds), handles that are not the caller's, stream and
 * batch limits, a client that never reads, slowloris, connection floods,
 * descriptor floods, clients killed while they hold memory or in the middle
 * of batches, faulting kernels and out-of-memory at allocation sites.
 *
 * After every case a second, well-behaved client must get correct results,
 * and the memory report must be back to the baseline taken at the start of
 * the test (no bytes, allocations, reservations or connections left over).
 *
 * Three kinds of daemon: the default one, one with low limits from a
 * config file (16 ops per batch, 64 KiB frames and pending replies, 8
 * connections, 4 streams), and daemons a test starts itself (--host-memory,
 * --test-fail-alloc-at).
 */
#include <dirent.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/time.h>

#include "frame.h"
#include "harness.h"

#define LIMIT_OPS 16
#define LIMIT_FRAME 65536
#define LIMIT_PENDING 65536
#define LIMIT_CONNECTIONS 8
#define LIMIT_STREAMS 4

static struct gpucmd_conn *good;
static struct gpucmd_service_report baseline;

/* ---- raw protocol ---------------------------------------------------------- */

static int raw_connect(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct timeval tv = { .tv_sec = 20 };

	ck_assert_int_ge(fd, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", the_daemon.sock);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static void send_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		ck_assert_msg(n > 0, "send: %s", strerror(errno));
		p += n;
		len -= (size_t)n;
	}
}

static void send_frame(int fd, const Gpucmd__Frame *f)
{
	uint8_t *buf;
	size_t len;

	ck_assert_int_eq(frame_encode(f, &buf, &len), 0);
	send_all(fd, buf, len);
	free(buf);
}

static void header(uint8_t *buf, uint32_t length)
{
	struct frame_header h = { FRAME_MAGIC, GPUCMD_PROTOCOL_VERSION, 0,
				  length };

	frame_header_pack(&h, buf);
}

/* Read exactly len bytes; false at EOF or timeout. */
static bool recv_all(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = recv(fd, p, len, 0);

		if (n <= 0)
			return false;
		p += n;
		len -= (size_t)n;
	}
	return true;
}

/* The next frame from the daemon, or NULL when it closed (or 20 s passed). */
static Gpucmd__Frame *recv_frame(int fd)
{
	uint8_t head[FRAME_HEADER_SIZE], *body;
	struct frame_header h;
	Gpucmd__Frame *f;

	if (!recv_all(fd, head, sizeof(head)))
		return NULL;
	frame_header_unpack(head, &h);
	ck_assert_int_eq(frame_header_check(&h, FRAME_MAX_BODY, NULL, 0), 0);
	body = malloc(h.length + 1);
	ck_assert_ptr_nonnull(body);
	ck_assert_msg(recv_all(fd, body, h.length), "truncated frame body");
	f = frame_decode(body, h.length);
	free(body);
	ck_assert_ptr_nonnull(f);
	return f;
}

/*
 * The daemon closes the connection within 20 s: EOF, or ECONNRESET when
 * the close found bytes we sent still unread (AF_UNIX resets then, after
 * what the daemon sent before it has been read).
 */
static void expect_eof(int fd)
{
	uint8_t b;
	ssize_t n = recv(fd, &b, 1, 0);

	ck_assert_msg(n == 0 || (n < 0 && errno == ECONNRESET),
		      "the daemon did not close the connection "
		      "(recv %zd: %s)",
		      n, n < 0 ? strerror(errno) : "data");
}

/* The daemon answers with an Error frame of code naming what, then closes. */
static void expect_refusal(int fd, int code, const char *what)
{
	Gpucmd__Frame *f = recv_frame(fd);

	ck_assert_msg(f != NULL, "no Error frame before the close");
	ck_assert_int_eq(f->msg_case, GPUCMD__FRAME__MSG_ERROR);
	ck_assert_msg(f->error->code == code, "code %s, expected %s: %s",
		      gpucmd_errname(f->error->code), gpucmd_errname(code),
		      f->error->message);
	ck_assert_msg(strstr(f->error->message, what) != NULL,
		      "message '%s' does not name '%s'", f->error->message,
		      what);
	frame_free(f);
	expect_eof(fd);
	close(fd);
}

/* Hello as service; the Welcome's connection id. */
static uint64_t raw_hello(int fd, const char *service)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT, *w;
	Gpucmd__Hello hello = GPUCMD__HELLO__INIT;
	uint64_t id;

	hello.protocol_version = GPUCMD_PROTOCOL_VERSION;
	hello.service = (char *)service;
	hello.client_name = "test_hostile2";
	f.msg_case = GPUCMD__FRAME__MSG_HELLO;
	f.hello = &hello;
	send_frame(fd, &f);
	w = recv_frame(fd);
	ck_assert_ptr_nonnull(w);
	ck_assert_msg(w->msg_case == GPUCMD__FRAME__MSG_WELCOME,
		      "expected a Welcome, got message %d (%s)", w->msg_case,
		      w->msg_case == GPUCMD__FRAME__MSG_ERROR ?
			      w->error->message :
			      "");
	id = w->welcome->connection_id;
	frame_free(w);
	return id;
}

/* Encode a request of ops on stream and append its frame to *buf. */
static void append_request(uint8_t **buf, size_t *len, uint64_t id,
			   uint32_t stream, Gpucmd__Op **ops, size_t n)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	uint8_t *one, *all;
	size_t one_len;

	req.id = id;
	req.stream = stream;
	req.n_ops = n;
	req.ops = ops;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	ck_assert_int_eq(frame_encode(&f, &one, &one_len), 0);
	all = realloc(*buf, *len + one_len);
	ck_assert_ptr_nonnull(all);
	memcpy(all + *len, one, one_len);
	free(one);
	*buf = all;
	*len += one_len;
}

/* Send a Request of n ops and return its Response (the caller frees it). */
static Gpucmd__Frame *raw_run(int fd, uint64_t id, uint32_t stream,
			      Gpucmd__Op **ops, size_t n)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	Gpucmd__Frame *r;

	append_request(&buf, &len, id, stream, ops, n);
	send_all(fd, buf, len);
	free(buf);
	r = recv_frame(fd);
	ck_assert_msg(r != NULL, "no response to request %llu",
		      (unsigned long long)id);
	ck_assert_int_eq(r->msg_case, GPUCMD__FRAME__MSG_RESPONSE);
	ck_assert_uint_eq(r->response->id, id);
	return r;
}

/* ---- through the client library ---------------------------------------------- */

/* Run a batch that must fail at op index with code; the message names what. */
static void run_fails(struct gpucmd_batch *b, int index, int code,
		      const char *what)
{
	struct gpucmd_response *r = NULL;
	int rc = gpucmd_run(b, &r);

	ck_assert_msg(rc == 0, "run: %s", gpucmd_strerror(rc));
	ck_assert_msg(gpucmd_response_error(r) == code,
		      "got %s (%s) at op %d, expected %s at op %d",
		      gpucmd_errname(gpucmd_response_error(r)),
		      gpucmd_response_message(r),
		      gpucmd_response_failed_index(r), gpucmd_errname(code),
		      index);
	ck_assert_int_eq(gpucmd_response_failed_index(r), index);
	ck_assert_uint_eq(gpucmd_response_count(r), (size_t)index);
	ck_assert_msg(what == NULL ||
			      strstr(gpucmd_response_message(r), what) != NULL,
		      "message '%s' does not name '%s'",
		      gpucmd_response_message(r), what);
	gpucmd_response_free(r);
}

static struct gpucmd_batch *batch(struct gpucmd_conn *c, uint32_t stream)
{
	struct gpucmd_batch *b = NULL;

	ck_assert_int_eq(gpucmd_batch_new(c, stream, &b), 0);
	return b;
}

/* Write, read back and release on c: the answer must be right. */
static void still_served(struct gpucmd_conn *c)
{
	static const char text[] = "still served, byte for byte";
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_response *r;
	const void *data;
	size_t len;

	gpucmd_batch_create_with_data(b, 424242, text, sizeof(text));
	gpucmd_batch_read(b, 424242, 0, sizeof(text));
	gpucmd_batch_release(b, 424242);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_data(r, 1, &data, &len), 0);
	ck_assert_uint_eq(len, sizeof(text));
	ck_assert_int_eq(memcmp(data, text, sizeof(text)), 0);
	gpucmd_response_free(r);
}

/*
 * A connection of service "many" is taken again within 5 s, once the
 * daemon has seen the closes of after (which freed the places), and served.
 */
static void place_comes_back(const char *after)
{
	for (int i = 0; i < 500; i++) {
		struct gpucmd_conn *c = NULL;
		char msg[256];

		if (gpucmd_connect(the_daemon.sock, "many", &c, msg,
				   sizeof(msg)) == 0) {
			still_served(c);
			gpucmd_close(c);
			return;
		}
		ck_assert_msg(i < 499, "no place after %s: %s", after, msg);
		usleep(10000);
	}
}

/*
 * The end of every case: the good client is served, and within 10 s the
 * report is back to the baseline (teardown of a dead client is
 * asynchronous).
 */
static void back_to_baseline(void)
{
	struct gpucmd_service_report t = { 0 };

	still_served(good);
	for (int i = 0; i < 1000; i++) {
		t = report_totals(good);
		/*
		 * Reserved may end below the baseline: the good connection's
		 * idle pages may be reclaimed for the others meanwhile.
		 */
		if (t.bytes_in_use == baseline.bytes_in_use &&
		    t.allocations == baseline.allocations &&
		    t.bytes_reserved <= baseline.bytes_reserved &&
		    t.connections == baseline.connections)
			return;
		usleep(10000);
	}
	ck_abort_msg("memory report not back to baseline: %llu bytes in use "
		     "(baseline %llu), %llu allocations (%llu), %llu reserved "
		     "(at most %llu), %u connections (%u)",
		     (unsigned long long)t.bytes_in_use,
		     (unsigned long long)baseline.bytes_in_use,
		     (unsigned long long)t.allocations,
		     (unsigned long long)baseline.allocations,
		     (unsigned long long)t.bytes_reserved,
		     (unsigned long long)baseline.bytes_reserved, t.connections,
		     baseline.connections);
}

static void take_baseline(void)
{
	good = connect_as("good");
	still_served(good);
	baseline = report_totals(good);
	ck_assert_uint_eq(baseline.bytes_in_use, 0);
	ck_assert_uint_eq(baseline.allocations, 0);
}

/* A field of /proc/PID/status in kB ("VmRSS", "VmHWM"). */
static long daemon_status_kb(pid_t pid, const char *field)
{
	char path[64], line[256];
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	ck_assert_ptr_nonnull(f);
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, field, strlen(field)) == 0 &&
		    line[strlen(field)] == ':')
			v = strtol(line + strlen(field) + 1, NULL, 10);
	fclose(f);
	return v;
}

/* ---- fixtures ---------------------------------------------------------------- */

static void setup_default(void)
{
	harness_setup();
	take_baseline();
}

/* Start the daemon with text as its config file. */
static void setup_config(const char *text)
{
	char path[192];

	harness_config(text, path, sizeof(path));
	daemon_start_args(&the_daemon, "--config", path, NULL);
	take_baseline();
}

static void setup_limits(void)
{
	char text[512];

	snprintf(text, sizeof(text),
		 "[limits]\n"
		 "max_ops_per_batch = %d\n"
		 "max_frame_bytes = %d\n"
		 "max_pending_bytes = %d\n"
		 "max_connections = %d\n"
		 "max_streams = %d\n",
		 LIMIT_OPS, LIMIT_FRAME, LIMIT_PENDING, LIMIT_CONNECTIONS,
		 LIMIT_STREAMS);
	setup_config(text);
}

/* Default frames, little room for replies waiting on a client. */
#define PENDING_LIMIT (4u << 20)

static void setup_pending(void)
{
	char text[128];

	snprintf(text, sizeof(text), "[limits]\nmax_pending_bytes = %u\n",
		 PENDING_LIMIT);
	setup_config(text);
}

/* A small pinned pool: replies held for slow readers may take 4 MiB. */
#define PINNED_POOL (8u << 20)

static void setup_pinned(void)
{
	char text[128];

	snprintf(text, sizeof(text), "[daemon]\npinned_memory = %u\n",
		 PINNED_POOL);
	setup_config(text);
}

static void teardown(void)
{
	if (good != NULL)
		gpucmd_close(good);
	good = NULL;
	harness_teardown();
}

/* ---- frames in the wrong shape or place ---------------------------------------- */

/* Run b, whose op 1 is a read that must give the n bytes of want. */
static void run_reads_back(struct gpucmd_batch *b, const void *want, size_t n)
{
	struct gpucmd_response *r = run_ok(b);
	const void *data;
	size_t len;

	ck_assert_int_eq(gpucmd_response_data(r, 1, &data, &len), 0);
	ck_assert_uint_eq(len, n);
	ck_assert_int_eq(memcmp(data, want, n), 0);
	gpucmd_response_free(r);
}

START_TEST(truncated_body_then_hangup)
{
	uint8_t buf[FRAME_HEADER_SIZE + 500];
	int fd = raw_connect();

	raw_hello(fd, "hostile");
	header(buf, 1000);
	memset(buf + FRAME_HEADER_SIZE, 0x22, 500);
	send_all(fd, buf, sizeof(buf));
	usleep(50000);
	close(fd);
	back_to_baseline();
}
END_TEST

START_TEST(zero_length_body)
{
	uint8_t buf[FRAME_HEADER_SIZE];
	int fd = raw_connect();

	/* An empty body is a Frame with no message: not a Hello. */
	header(buf, 0);
	send_all(fd, buf, sizeof(buf));
	expect_refusal(fd, GPUCMD_EPROTO, "must be a Hello");

	/* After the handshake it is not a Request either. */
	fd = raw_connect();
	raw_hello(fd, "hostile");
	send_all(fd, buf, sizeof(buf));
	expect_refusal(fd, GPUCMD_EPROTO, "expected a Request");
	back_to_baseline();
}
END_TEST

/*
 * A Request padded (the data of a write to a handle that does not exist)
 * to exactly n body bytes.
 */
static uint8_t *padded_request(uint32_t n, size_t *len)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	Gpucmd__OpWrite w = GPUCMD__OP_WRITE__INIT;
	Gpucmd__Op op = GPUCMD__OP__INIT, *ops[1] = { &op };
	uint8_t *data = calloc(1, n);
	uint8_t *buf = NULL;
	size_t pad;

	ck_assert_ptr_nonnull(data);
	w.handle = 77;
	w.data.data = data;
	op.op_case = GPUCMD__OP__OP_WRITE;
	op.write = &w;
	req.id = 1;
	req.n_ops = 1;
	req.ops = ops;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	/* The size grows with the data by one byte per byte (or a varint step). */
	for (pad = n - 32; pad > 0 && pad <= n; pad++) {
		w.data.len = pad;
		if (gpucmd__frame__get_packed_size(&f) >= n)
			break;
	}
	ck_assert_uint_eq(gpucmd__frame__get_packed_size(&f), n);
	ck_assert_int_eq(frame_encode(&f, &buf, len), 0);
	free(data);
	return buf;
}

START_TEST(length_exactly_at_the_limit)
{
	size_t len;
	uint8_t *buf = padded_request(LIMIT_FRAME, &len);
	int fd = raw_connect();

	/* max_frame_bytes is the largest body accepted, not the first refused. */
	raw_hello(fd, "hostile");
	send_all(fd, buf, len);
	{
		Gpucmd__Frame *r = recv_frame(fd);

		ck_assert_ptr_nonnull(r);
		ck_assert_int_eq(r->msg_case, GPUCMD__FRAME__MSG_RESPONSE);
		ck_assert_ptr_nonnull(r->response->error);
		ck_assert_int_eq(r->response->error->code, GPUCMD_ENOTFOUND);
		frame_free(r);
	}
	close(fd);
	free(buf);

	buf = padded_request(LIMIT_FRAME + 1, &len);
	fd = raw_connect();
	raw_hello(fd, "hostile");
	send_all(fd, buf, FRAME_HEADER_SIZE);
	expect_refusal(fd, GPUCMD_ELIMIT,
		       "65537 bytes is over the limit of 65536");
	free(buf);
	back_to_baseline();
}
END_TEST

START_TEST(second_hello)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Hello hello = GPUCMD__HELLO__INIT;
	int fd = raw_connect();

	raw_hello(fd, "hostile");
	hello.protocol_version = GPUCMD_PROTOCOL_VERSION;
	hello.service = "other";
	f.msg_case = GPUCMD__FRAME__MSG_HELLO;
	f.hello = &hello;
	send_frame(fd, &f);
	expect_refusal(fd, GPUCMD_EPROTO, "expected a Request (got message 1)");
	back_to_baseline();
}
END_TEST

START_TEST(client_sends_welcome_or_response)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Welcome w = GPUCMD__WELCOME__INIT;
	Gpucmd__Response r = GPUCMD__RESPONSE__INIT;
	Gpucmd__Error e = GPUCMD__ERROR__INIT;
	int fd = raw_connect();

	w.service = "hostile";
	f.msg_case = GPUCMD__FRAME__MSG_WELCOME;
	f.welcome = &w;
	send_frame(fd, &f);
	expect_refusal(fd, GPUCMD_EPROTO, "first frame must be a Hello");

	fd = raw_connect();
	raw_hello(fd, "hostile");
	r.id = 1;
	f.msg_case = GPUCMD__FRAME__MSG_RESPONSE;
	f.response = &r;
	send_frame(fd, &f);
	expect_refusal(fd, GPUCMD_EPROTO, "expected a Request (got message 5)");

	fd = raw_connect();
	raw_hello(fd, "hostile");
	e.code = GPUCMD_EPROTO;
	e.message = "the client complains";
	f.msg_case = GPUCMD__FRAME__MSG_ERROR;
	f.error = &e;
	send_frame(fd, &f);
	expect_refusal(fd, GPUCMD_EPROTO, "expected a Request (got message 3)");
	back_to_baseline();
}
END_TEST

START_TEST(hello_with_bad_service_names)
{
	static const char *const names[] = { "", "a/b", "../etc", "x y",
					     "tab\tname" };
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Hello hello = GPUCMD__HELLO__INIT;
	char longname[100];

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) + 1; i++) {
		int fd = raw_connect();

		memset(longname, 'a', sizeof(longname) - 1);
		longname[sizeof(longname) - 1] = '\0';
		hello.protocol_version = GPUCMD_PROTOCOL_VERSION;
		hello.service = i < sizeof(names) / sizeof(names[0]) ?
					(char *)names[i] :
					longname;
		f.msg_case = GPUCMD__FRAME__MSG_HELLO;
		f.hello = &hello;
		send_frame(fd, &f);
		expect_refusal(fd, GPUCMD_EINVAL, "is not valid");
	}
	back_to_baseline();
}
END_TEST

START_TEST(unknown_op_field)
{
	/*
	 * Frame{request(4){id(1)=9, ops(3){field 99: varint 1}}}: valid
	 * protobuf whose op has an oneof number this daemon does not know.
	 */
	static const uint8_t body[] = {
		0x22, 0x07,	  /* Frame.request, 7 bytes */
		0x08, 0x09,	  /* id = 9 */
		0x1a, 0x03,	  /* ops, 3 bytes */
		0x98, 0x06, 0x01, /* field 99, varint 1 */
	};
	uint8_t buf[FRAME_HEADER_SIZE + sizeof(body)];
	Gpucmd__Frame *r;
	Gpucmd__Op ping = GPUCMD__OP__INIT;
	Gpucmd__OpPing p = GPUCMD__OP_PING__INIT;
	Gpucmd__Op *ops[1] = { &ping };
	int fd = raw_connect();

	raw_hello(fd, "hostile");
	memcpy(buf + FRAME_HEADER_SIZE, body, sizeof(body));
	header(buf, sizeof(body));
	send_all(fd, buf, sizeof(buf));
	r = recv_frame(fd);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(r->msg_case, GPUCMD__FRAME__MSG_RESPONSE);
	ck_assert_uint_eq(r->response->id, 9);
	ck_assert_ptr_nonnull(r->response->error);
	ck_assert_int_eq(r->response->error->code, GPUCMD_EPROTO);
	ck_assert_uint_eq(r->response->failed_index, 0);
	ck_assert_msg(strstr(r->response->error->message,
			     "does not know (Op field 99)"),
		      "%s", r->response->error->message);
	frame_free(r);
	/* The connection is still good for known ops. */
	ping.op_case = GPUCMD__OP__OP_PING;
	ping.ping = &p;
	r = raw_run(fd, 10, 0, ops, 1);
	ck_assert_ptr_null(r->response->error);
	ck_assert_uint_eq(r->response->n_results, 1);
	frame_free(r);
	close(fd);
	back_to_baseline();
}
END_TEST

/* ---- absurd values in valid requests -------------------------------------------- */

START_TEST(sizes_near_2_64)
{
	struct gpucmd_conn *c = connect_as("hostile");
	struct gpucmd_batch *b;
	char want[64];

	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, UINT64_MAX);
	run_fails(b, 0, GPUCMD_ETOOBIG, "18446744073709551615");
	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, UINT64_MAX - 4095);
	run_fails(b, 0, GPUCMD_ETOOBIG, "18446744073709547520");
	snprintf(want, sizeof(want), "%llu", 1ull << 63);
	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 1ull << 63);
	run_fails(b, 0, GPUCMD_ETOOBIG, want);

	/* Reads and writes of such lengths on a small buffer. */
	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 64);
	gpucmd_batch_read(b, 1, 0, UINT64_MAX);
	run_fails(b, 1, GPUCMD_EINVAL, "out of bounds");
	b = batch(c, 0);
	gpucmd_batch_read(b, 1, 1, UINT64_MAX);
	run_fails(b, 0, GPUCMD_EINVAL, "out of bounds");
	b = batch(c, 0);
	gpucmd_batch_reserve_cpu(b, UINT64_MAX);
	gpucmd_batch_release(b, 1);
	{
		struct gpucmd_response *r = NULL;

		/* Over the 1 GiB a host buffer may have: EINVAL, saying so. */
		ck_assert_int_eq(gpucmd_run(b, &r), 0);
		ck_assert_int_eq(gpucmd_response_error(r), GPUCMD_EINVAL);
		ck_assert_int_eq(gpucmd_response_failed_index(r), 0);
		ck_assert_msg(strstr(gpucmd_response_message(r),
				     "at most "
				     "1073741824 bytes") != NULL,
			      "%s", gpucmd_response_message(r));
		gpucmd_response_free(r);
	}
	gpucmd_close(c);
	back_to_baseline();
}
END_TEST

START_TEST(offsets_near_2_64)
{
	static const uint64_t offsets[] = {
		UINT64_MAX, UINT64_MAX - 3, UINT64_MAX - 63, 1ull << 63, 65,
	};
	struct gpucmd_conn *c = connect_as("hostile");
	struct gpucmd_batch *b = batch(c, 0);
	uint8_t data[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };

	gpucmd_batch_empty(b, 1, 64);
	gpucmd_response_free(run_ok(b));
	for (size_t i = 0; i < sizeof(offsets) / sizeof(offsets[0]); i++) {
		b = batch(c, i % 2);
		gpucmd_batch_write(b, 1, offsets[i], data, sizeof(data));
		run_fails(b, 0, GPUCMD_EINVAL, "out of bounds");
		b = batch(c, i % 2);
		gpucmd_batch_read(b, 1, offsets[i], 8);
		run_fails(b, 0, GPUCMD_EINVAL, "out of bounds");
	}
	/* The last bytes are still writable and readable. */
	b = batch(c, 0);
	gpucmd_batch_write(b, 1, 56, data, sizeof(data));
	gpucmd_batch_read(b, 1, 56, 8);
	gpucmd_batch_release(b, 1);
	{
		struct gpucmd_response *r = run_ok(b);
		const void *got;
		size_t len;

		ck_assert_int_eq(gpucmd_response_data(r, 1, &got, &len), 0);
		ck_assert_int_eq(memcmp(got, data, 8), 0);
		gpucmd_response_free(r);
	}
	gpucmd_close(c);
	back_to_baseline();
}
END_TEST

START_TEST(layouts_that_overflow)
{
	struct gpucmd_conn *c = connect_as("hostile");
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_layout l = {
		.rank = 2,
		.shape = { UINT64_MAX / 2, 4 },
		.strides = { 4, 1 },
		.elem_size = 4,
	};
	uint8_t data[24] = { 0 };

	gpucmd_batch_empty(b, 1, 4096);
	gpucmd_response_free(run_ok(b));
	/* More elements than 2^64 bytes hold. */
	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_read_layout(b, 1, 0, &l), 0);
	run_fails(b, 0, GPUCMD_EINVAL, "2^64");
	/* A pitch over 2^64 with a small shape. */
	l.shape[0] = 3;
	l.shape[1] = 2;
	l.strides[0] = UINT64_MAX / 2;
	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_read_layout(b, 1, 0, &l), 0);
	run_fails(b, 0, GPUCMD_EINVAL, NULL);
	/* A zero stride is refused, not divided by. */
	l.strides[0] = 0;
	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_write_layout(b, 1, 0, &l, data, 24), 0);
	run_fails(b, 0, GPUCMD_ESTRIDES, "strides");
	gpucmd_close(c);
	back_to_baseline();
}
END_TEST

static void launch_fails(struct gpucmd_conn *c, const uint32_t grid[3],
			 const uint32_t block[3], const char *what)
{
	struct gpucmd_arg args[3] = {
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = 1 },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = 7 },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = 16 },
	};
	struct gpucmd_batch *b = batch(c, 0);

	gpucmd_batch_kernel(b, "fill_u32", grid, block, args, 3);
	/* The refusal a driver would give (it invalidates open profiles). */
	run_fails(b, 0, GPUCMD_ELAUNCH, what);
}

START_TEST(grids_of_zero_and_over_the_limits)
{
	struct gpucmd_conn *c = connect_as("hostile");
	struct gpucmd_batch *b = batch(c, 0);
	const struct gpucmd_info *in = gpucmd_info(c);

	(void)in;
	gpucmd_batch_empty(b, 1, 64);
	gpucmd_response_free(run_ok(b));
	/* The message states the whole geometry that was asked for. */
	launch_fails(c, (uint32_t[3]){ 0, 1, 1 }, (uint32_t[3]){ 64, 1, 1 },
		     "grid 0x1x1 block 64x1x1 has a zero dimension");
	launch_fails(c, (uint32_t[3]){ 1, 1, 0 }, (uint32_t[3]){ 64, 1, 1 },
		     "grid 1x1x0 block 64x1x1 has a zero dimension");
	launch_fails(c, (uint32_t[3]){ 1, 1, 1 }, (uint32_t[3]){ 0, 0, 0 },
		     "grid 1x1x1 block 0x0x0 has a zero dimension");
	launch_fails(c, (uint32_t[3]){ 1, 65536, 1 }, (uint32_t[3]){ 64, 1, 1 },
		     "over the device");
	launch_fails(c, (uint32_t[3]){ UINT32_MAX, 1, 1 },
		     (uint32_t[3]){ 64, 1, 1 }, "over the device");
	launch_fails(c, (uint32_t[3]){ 1, 1, 1 }, (uint32_t[3]){ 2048, 1, 1 },
		     "over the device");
	launch_fails(c, (uint32_t[3]){ 1, 1, 1 }, (uint32_t[3]){ 64, 64, 1 },
		     "threads per block");
	/* The buffer was never touched by a refused launch. */
	b = batch(c, 0);
	gpucmd_batch_read(b, 1, 0, 64);
	gpucmd_batch_release(b, 1);
	{
		struct gpucmd_response *r = run_ok(b);
		const uint8_t *got;
		size_t len;

		ck_assert_int_eq(gpucmd_response_data(r, 0, (const void **)&got,
						      &len),
				 0);
		for (size_t i = 0; i < len; i++)
			ck_assert_uint_eq(got[i], 0);
		gpucmd_response_free(r);
	}
	gpucmd_close(c);
	back_to_baseline();
}
END_TEST

START_TEST(unknown_kernels_and_wrong_arguments)
{
	static const uint32_t one[3] = { 1, 1, 1 };
	struct gpucmd_conn *c = connect_as("hostile");
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_arg args[4] = {
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = 1 },
		{ .kind = GPUCMD_ARG_F32, .v.f32 = 1.0f },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = 16 },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = 16 },
	};

	gpucmd_batch_empty(b, 1, 64);
	gpucmd_response_free(run_ok(b));
	for (int i = 0; i < 3; i++) {
		static const char *const names[] = { "nope", "FILL_U32",
						     "fill_u32\n" };

		b = batch(c, 0);
		gpucmd_batch_ping(b);
		ck_assert_int_eq(gpucmd_batch_kernel(b, names[i], one, one,
						     args, 0),
				 0);
		run_fails(b, 1, GPUCMD_ENOKERNEL, "unknown kernel");
	}
	/* No name at all (the library refuses to send one). */
	{
		Gpucmd__Op op = GPUCMD__OP__INIT, *ops[1] = { &op };
		Gpucmd__OpKernel k = GPUCMD__OP_KERNEL__INIT;
		Gpucmd__Frame *r;
		int fd = raw_connect();

		raw_hello(fd, "hostile");
		op.op_case = GPUCMD__OP__OP_KERNEL;
		op.kernel = &k;
		r = raw_run(fd, 1, 0, ops, 1);
		ck_assert_ptr_nonnull(r->response->error);
		ck_assert_int_eq(r->response->error->code, GPUCMD_ENOKERNEL);
		frame_free(r);
		close(fd);
	}
	/* fill_u32(buf, value:u32, count:u32) with an f32 value. */
	b = batch(c, 0);
	gpucmd_batch_kernel(b, "fill_u32", one, one, args, 3);
	run_fails(b, 0, GPUCMD_EINVAL, "argument 1 has the wrong type");
	/* Too few and too many arguments. */
	b = batch(c, 0);
	gpucmd_batch_kernel(b, "fill_u32", one, one, args, 1);
	run_fails(b, 0, GPUCMD_EINVAL, "takes 3 arguments, got 1");
	args[1].kind = GPUCMD_ARG_U32;
	args[1].v.u32 = 5;
	b = batch(c, 0);
	gpucmd_batch_kernel(b, "fill_u32", one, one, args, 4);
	run_fails(b, 0, GPUCMD_EINVAL, "takes 3 arguments, got 4");
	/* A buffer argument given as a number (its address, say). */
	args[0].kind = GPUCMD_ARG_U64;
	args[0].v.u64 = 0x7f0000000000ull;
	b = batch(c, 0);
	gpucmd_batch_kernel(b, "fill_u32", one, one, args, 3);
	run_fails(b, 0, GPUCMD_EINVAL, "argument 0 has the wrong type");
	/* A count past the end of the buffer. */
	args[0].kind = GPUCMD_ARG_BUFFER;
	args[0].v.handle = 1;
	args[2].v.u32 = 17;
	b = batch(c, 0);
	gpucmd_batch_kernel(b, "fill_u32", one, one, args, 3);
	run_fails(b, 0, GPUCMD_EINVAL, "needs 68 bytes, the buffer has 64");
	/* spin over its cap. */
	args[0].kind = GPUCMD_ARG_U32;
	args[0].v.u32 = UINT32_MAX;
	b = batch(c, 0);
	gpucmd_batch_kernel(b, "spin", one, one, args, 1);
	run_fails(b, 0, GPUCMD_EINVAL, "over the limit");
	b = batch(c, 0);
	gpucmd_batch_release(b, 1);
	gpucmd_response_free(run_ok(b));
	gpucmd_close(c);
	back_to_baseline();
}
END_TEST

/* ---- handles ----------------------------------------------------------------- */

START_TEST(handles_never_allocated_and_released_twice)
{
	static const uint32_t one[3] = { 1, 1, 1 };
	struct gpucmd_conn *c = connect_as("hostile");
	struct gpucmd_batch *b;
	struct gpucmd_arg args[3] = {
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = 77 },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = 1 },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = 1 },
	};
	uint8_t byte = 1;

	b = batch(c, 0);
	gpucmd_batch_read(b, 12345, 0, 1);
	run_fails(b, 0, GPUCMD_ENOTFOUND, "handle 12345 names no live");
	b = batch(c, 0);
	gpucmd_batch_write(b, UINT64_MAX, 0, &byte, 1);
	run_fails(b, 0, GPUCMD_ENOTFOUND, "18446744073709551615");
	b = batch(c, 0);
	gpucmd_batch_kernel(b, "fill_u32", one, one, args, 3);
	run_fails(b, 0, GPUCMD_ENOTFOUND, "handle 77");
	/* Handle 0, which the library refuses to send. */
	{
		Gpucmd__Op op = GPUCMD__OP__INIT, *ops[1] = { &op };
		Gpucmd__OpEmpty e = GPUCMD__OP_EMPTY__INIT;
		Gpucmd__OpRelease rl = GPUCMD__OP_RELEASE__INIT;
		Gpucmd__Frame *r;
		int fd = raw_connect();

		raw_hello(fd, "hostile");
		op.op_case = GPUCMD__OP__OP_EMPTY;
		op.empty = &e;
		e.size = 64;
		r = raw_run(fd, 1, 0, ops, 1);
		ck_assert_ptr_nonnull(r->response->error);
		ck_assert_int_eq(r->response->error->code, GPUCMD_EINVAL);
		ck_assert_msg(strstr(r->response->error->message,
				     "handle 0 is invalid"),
			      "%s", r->response->error->message);
		frame_free(r);
		op.op_case = GPUCMD__OP__OP_RELEASE;
		op.release = &rl;
		r = raw_run(fd, 2, 0, ops, 1);
		ck_assert_ptr_nonnull(r->response->error);
		ck_assert_int_eq(r->response->error->code, GPUCMD_ENOTFOUND);
		frame_free(r);
		close(fd);
	}

	/* Released twice: in one batch, then in the next. */
	b = batch(c, 0);
	gpucmd_batch_empty(b, 5, 64);
	gpucmd_batch_release(b, 5);
	gpucmd_batch_release(b, 5);
	run_fails(b, 2, GPUCMD_ENOTFOUND, "handle 5");
	b = batch(c, 1);
	gpucmd_batch_release(b, 5);
	run_fails(b, 0, GPUCMD_ENOTFOUND, "handle 5");
	b = batch(c, 0);
	gpucmd_batch_read(b, 5, 0, 1);
	run_fails(b, 0, GPUCMD_ENOTFOUND, "handle 5");
	/* Allocated twice under one name. */
	b = batch(c, 0);
	gpucmd_batch_empty(b, 6, 64);
	gpucmd_batch_empty(b, 6, 64);
	run_fails(b, 1, GPUCMD_EEXIST, "already live");
	b = batch(c, 0);
	gpucmd_batch_release(b, 6);
	gpucmd_response_free(run_ok(b));
	gpucmd_close(c);
	back_to_baseline();
}
END_TEST

START_TEST(another_connections_handles)
{
	static const char secret[] = "service A's bytes";
	struct gpucmd_conn *a = connect_as("tenant-a");
	struct gpucmd_conn *a2 = connect_as("tenant-a");
	struct gpucmd_conn *b = connect_as("tenant-b");
	struct gpucmd_batch *bt;
	struct gpucmd_response *r;
	const void *data;
	size_t len;

	bt = batch(a, 0);
	gpucmd_batch_create_with_data(bt, 5, secret, sizeof(secret));
	gpucmd_response_free(run_ok(bt));
	/* The same id on another service's connection and on a sibling. */
	for (int i = 0; i < 2; i++) {
		struct gpucmd_conn *other = i ? a2 : b;

		bt = batch(other, 0);
		gpucmd_batch_read(bt, 5, 0, sizeof(secret));
		run_fails(bt, 0, GPUCMD_ENOTFOUND, "handle 5");
		bt = batch(other, 0);
		gpucmd_batch_write(bt, 5, 0, "overwrite", 9);
		run_fails(bt, 0, GPUCMD_ENOTFOUND, "handle 5");
		bt = batch(other, 0);
		gpucmd_batch_release(bt, 5);
		run_fails(bt, 0, GPUCMD_ENOTFOUND, "handle 5");
		/* Its own handle 5 is another buffer. */
		bt = batch(other, 0);
		gpucmd_batch_create_with_data(bt, 5, "mine", 4);
		gpucmd_batch_read(bt, 5, 0, 4);
		gpucmd_batch_release(bt, 5);
		r = run_ok(bt);
		ck_assert_int_eq(gpucmd_response_data(r, 1, &data, &len), 0);
		ck_assert_int_eq(memcmp(data, "mine", 4), 0);
		gpucmd_response_free(r);
	}
	/* A's bytes are untouched. */
	bt = batch(a, 0);
	gpucmd_batch_read(bt, 5, 0, sizeof(secret));
	r = run_ok(bt);
	ck_assert_int_eq(gpucmd_response_data(r, 0, &data, &len), 0);
	ck_assert_int_eq(memcmp(data, secret, sizeof(secret)), 0);
	gpucmd_response_free(r);
	gpucmd_close(b);
	gpucmd_close(a2);
	gpucmd_close(a);
	back_to_baseline();
}
END_TEST

/* ---- streams and batches (low limits) ------------------------------------------- */

START_TEST(batch_over_max_ops)
{
	int fd = raw_connect();
	Gpucmd__Op pings[LIMIT_OPS + 1], *ops[LIMIT_OPS + 1];
	Gpucmd__OpPing p = GPUCMD__OP_PING__INIT;
	Gpucmd__Frame *r;

	raw_hello(fd, "hostile");
	for (int i = 0; i <= LIMIT_OPS; i++) {
		gpucmd__op__init(&pings[i]);
		pings[i].op_case = GPUCMD__OP__OP_PING;
		pings[i].ping = &p;
		ops[i] = &pings[i];
	}
	r = raw_run(fd, 1, 0, ops, LIMIT_OPS);
	ck_assert_ptr_null(r->response->error);
	ck_assert_uint_eq(r->response->n_results, LIMIT_OPS);
	frame_free(r);
	r = raw_run(fd, 2, 0, ops, LIMIT_OPS + 1);
	ck_assert_ptr_nonnull(r->response->error);
	ck_assert_int_eq(r->response->error->code, GPUCMD_ELIMIT);
	ck_assert_uint_eq(r->response->n_results, 0);
	ck_assert_msg(strstr(r->response->error->message,
			     "batch of 17 ops is over the limit of 16"),
		      "%s", r->response->error->message);
	frame_free(r);
	/* Still usable. */
	r = raw_run(fd, 3, 0, ops, 1);
	ck_assert_ptr_null(r->response->error);
	frame_free(r);
	close(fd);
	back_to_baseline();
}
END_TEST

/* A request frame sent with descriptors (SCM_RIGHTS) in its sendmsg. */
static void send_request_fds(int fd, uint64_t id, Gpucmd__Op **ops, size_t n,
			     const int *fds, int nfds)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	uint8_t *buf;
	size_t len;

	req.id = id;
	req.n_ops = n;
	req.ops = ops;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	ck_assert_int_eq(frame_encode(&f, &buf, &len), 0);
	ck_assert_int_eq(harness_send_fds(fd, buf, len, fds, nfds),
			 (ssize_t)len);
	free(buf);
}

static int page_memfd(uint8_t fill)
{
	int fd = memfd_create("hostile2", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	uint8_t page[4096];

	ck_assert_int_ge(fd, 0);
	memset(page, fill, sizeof(page));
	ck_assert_int_eq(write(fd, page, sizeof(page)), (ssize_t)sizeof(page));
	ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
	return fd;
}

START_TEST(refused_batch_takes_its_descriptors_along)
{
	/*
	 * A batch over max_ops_per_batch is refused before it runs.  The
	 * memfd its attach brought must go with it: left queued, the next
	 * request's attaches took the wrong memfds, and a copy between the
	 * client's own regions read the refused one.
	 */
	int fd = raw_connect();
	int x = page_memfd('x'), y = page_memfd('y'), z = page_memfd('z');
	int yz[2] = { y, z };
	Gpucmd__OpRegionAttach att[3];
	Gpucmd__Op o_att[3], pings[LIMIT_OPS], o_e, o_w, o_r;
	Gpucmd__Op *ops[LIMIT_OPS + 1];
	Gpucmd__OpPing p = GPUCMD__OP_PING__INIT;
	Gpucmd__OpEmpty em = GPUCMD__OP_EMPTY__INIT;
	Gpucmd__RegionRef src = GPUCMD__REGION_REF__INIT;
	Gpucmd__RegionRef dst = GPUCMD__REGION_REF__INIT;
	Gpucmd__OpWrite wr = GPUCMD__OP_WRITE__INIT;
	Gpucmd__OpRead rd = GPUCMD__OP_READ__INIT;
	Gpucmd__Frame *r;
	uint8_t got[4096], want[4096];

	raw_hello(fd, "hostile");
	for (int i = 0; i < 3; i++) {
		gpucmd__op_region_attach__init(&att[i]);
		att[i].region = 10 + (uint64_t)i;
		att[i].size = 4096;
		gpucmd__op__init(&o_att[i]);
		o_att[i].op_case = GPUCMD__OP__OP_REGION_ATTACH;
		o_att[i].region_attach = &att[i];
	}
	/* Request 1: attach x and LIMIT_OPS pings, one op too many. */
	ops[0] = &o_att[0];
	for (int i = 0; i < LIMIT_OPS; i++) {
		gpucmd__op__init(&pings[i]);
		pings[i].op_case = GPUCMD__OP__OP_PING;
		pings[i].ping = &p;
		ops[i + 1] = &pings[i];
	}
	send_request_fds(fd, 1, ops, LIMIT_OPS + 1, &x, 1);
	r = recv_frame(fd);
	ck_assert_ptr_nonnull(r);
	ck_assert_ptr_nonnull(r->response->error);
	ck_assert_int_eq(r->response->error->code, GPUCMD_ELIMIT);
	frame_free(r);
	/* Request 2: attach y as 11, z as 12, copy 11 -> buffer -> 12. */
	em.handle = 1;
	em.size = 4096;
	gpucmd__op__init(&o_e);
	o_e.op_case = GPUCMD__OP__OP_EMPTY;
	o_e.empty = &em;
	src.region = 11;
	src.length = 4096;
	wr.handle = 1;
	wr.region = &src;
	gpucmd__op__init(&o_w);
	o_w.op_case = GPUCMD__OP__OP_WRITE;
	o_w.write = &wr;
	dst.region = 12;
	dst.length = 4096;
	rd.handle = 1;
	rd.length = 4096;
	rd.into = &dst;
	gpucmd__op__init(&o_r);
	o_r.op_case = GPUCMD__OP__OP_READ;
	o_r.read = &rd;
	ops[0] = &o_att[1];
	ops[1] = &o_att[2];
	ops[2] = &o_e;
	ops[3] = &o_w;
	ops[4] = &o_r;
	send_request_fds(fd, 2, ops, 5, yz, 2);
	r = recv_frame(fd);
	ck_assert_ptr_nonnull(r);
	ck_assert_msg(r->response->error == NULL, "request 2: %s",
		      r->response->error ? r->response->error->message : "");
	frame_free(r);
	ck_assert_int_eq(pread(z, got, sizeof(got), 0), (ssize_t)sizeof(got));
	memset(want, 'y', sizeof(want));
	ck_assert_msg(memcmp(got, want, sizeof(got)) == 0,
		      "region 12 holds '%c' bytes, not region 11's 'y'",
		      got[0]);
	close(x);
	close(y);
	close(z);
	close(fd);
	back_to_baseline();
}
END_TEST

START_TEST(a_billion_ops_claimed)
{
	/*
	 * A request whose ops field claims far more than the frame holds: a
	 * length-delimited field of 2^30 bytes in a 64 KiB frame.  It cannot
	 * decode, and nothing of that size may be allocated.
	 */
	static const uint8_t body[] = {
		0x22, 0x08, 0x08, 0x01, 0x1a, 0x80, 0x80, 0x80, 0x80, 0x04,
	};
	uint8_t buf[FRAME_HEADER_SIZE + sizeof(body)];
	int fd = raw_connect();

	raw_hello(fd, "hostile");
	header(buf, sizeof(body));
	memcpy(buf + FRAME_HEADER_SIZE, body, sizeof(body));
	send_all(fd, buf, sizeof(buf));
	expect_refusal(fd, GPUCMD_EPROTO, "not a valid gpucmd message");
	back_to_baseline();
}
END_TEST

START_TEST(huge_stream_numbers_and_too_many_streams)
{
	static const uint32_t streams[] = { UINT32_MAX, 0x80000000u, 7, 0 };
	struct gpucmd_conn *c = connect_as("hostile");
	struct gpucmd_batch *b;

	ck_assert_uint_eq(gpucmd_info(c)->max_streams, LIMIT_STREAMS);
	for (size_t i = 0; i < LIMIT_STREAMS; i++) {
		b = batch(c, streams[i]);
		gpucmd_batch_empty(b, 100 + i, 64);
		gpucmd_batch_sync(b);
		gpucmd_response_free(run_ok(b));
	}
	b = batch(c, 12345);
	gpucmd_batch_sync(b);
	run_fails(b, 0, GPUCMD_ELIMIT, "max_streams");
	/* A ping needs no stream (gpucmd-protocol(7)): it goes. */
	b = batch(c, 12345);
	gpucmd_batch_ping(b);
	gpucmd_response_free(run_ok(b));
	/* The old streams keep working, and every buffer is released. */
	for (size_t i = 0; i < LIMIT_STREAMS; i++) {
		b = batch(c, streams[(i + 1) % LIMIT_STREAMS]);
		gpucmd_batch_release(b, 100 + i);
		gpucmd_batch_sync(b);
		gpucmd_response_free(run_ok(b));
	}
	gpucmd_close(c);
	back_to_baseline();
}
END_TEST

/* ---- clients that misbehave over time -------------------------------------------- */

START_TEST(large_reply_to_a_prompt_reader)
{
	/*
	 * Replies as large as a frame allows (max_frame_bytes = 64 KiB, less
	 * the room for the rest), over and over, with max_pending_bytes =
	 * 64 KiB: a client that reads its replies promptly must get them all;
	 * only one that does not read may be cut off.
	 */
	struct gpucmd_conn *c = connect_as("hostile");
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_response *r = NULL;
	const uint8_t *got;
	size_t len;
	int rc;

	gpucmd_batch_empty(b, 1, 56 << 10);
	gpucmd_response_free(run_ok(b));
	for (int i = 0; i < 20; i++) {
		b = batch(c, 0);
		gpucmd_batch_read(b, 1, 0, 56 << 10);
		rc = gpucmd_run(b, &r);
		ck_assert_msg(rc == 0,
			      "a client reading its replies was cut "
			      "off: %s",
			      gpucmd_strerror(rc));
		ck_assert_int_eq(gpucmd_response_error(r), 0);
		ck_assert_int_eq(gpucmd_response_data(r, 0, (const void **)&got,
						      &len),
				 0);
		ck_assert_uint_eq(len, 56 << 10);
		gpucmd_response_free(r);
	}
	b = batch(c, 0);
	gpucmd_batch_read(b, 1, 0, 32 << 10);
	gpucmd_batch_read(b, 1, 0, 32 << 10);
	run_fails(b, 1, GPUCMD_ELIMIT, "max_frame_bytes");
	b = batch(c, 0);
	gpucmd_batch_release(b, 1);
	gpucmd_response_free(run_ok(b));
	gpucmd_close(c);
	back_to_baseline();
}
END_TEST

/*
 * A client of service that reads nothing: a tiny receive buffer (the
 * daemon's replies back up at once), then {empty handle 1 of size} and
 * read requests of len bytes of it, sent until the daemon stops taking
 * them or max have gone; the first `blocking` of them are sent whole
 * whatever it takes.  The socket, still open.
 */
static int never_reading_client_of(const char *service, uint64_t size,
				   uint64_t len, int blocking, int max,
				   void (*after_blocking)(void))
{
	Gpucmd__Op ops[2], *opp[2];
	Gpucmd__OpEmpty e = GPUCMD__OP_EMPTY__INIT;
	Gpucmd__OpRead rd = GPUCMD__OP_READ__INIT;
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	int fd = raw_connect(), rcvbuf = 4096;

	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
	raw_hello(fd, service);
	gpucmd__op__init(&ops[0]);
	gpucmd__op__init(&ops[1]);
	ops[0].op_case = GPUCMD__OP__OP_EMPTY;
	ops[0].empty = &e;
	e.handle = 1;
	e.size = size;
	ops[1].op_case = GPUCMD__OP__OP_READ;
	ops[1].read = &rd;
	rd.handle = 1;
	rd.length = len;
	opp[0] = &ops[0];
	opp[1] = &ops[1];
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	req.id = 1;
	req.ops = opp;
	req.n_ops = 1;
	send_frame(fd, &f);
	req.ops = &opp[1];
	for (int i = 0; i < max; i++) {
		uint8_t *buf;
		size_t n;

		if (i == blocking && after_blocking != NULL)
			after_blocking();
		req.id = (uint64_t)i + 2;
		if (i < blocking) {
			send_frame(fd, &f);
			continue;
		}
		ck_assert_int_eq(frame_encode(&f, &buf, &n), 0);
		if (send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT) !=
		    (ssize_t)n) {
			free(buf);
			break;
		}
		free(buf);
	}
	return fd;
}

static int never_reading_client(uint64_t size, uint64_t len, int blocking,
				int max, void (*after_blocking)(void))
{
	return never_reading_client_of("hostile", size, len, blocking, max,
				       after_blocking);
}

START_TEST(client_never_reads_replies)
{
	pid_t pid = the_daemon.pid;
	int fds_before = daemon_fds(pid), fd;
	bool closed = false;

	/* Replies of 32 KiB, each half of max_pending_bytes, 400 at most. */
	fd = never_reading_client(1u << 20, 32u << 10, 0, 398, NULL);
	/*
	 * The daemon must drop the connection: its memory back to baseline
	 * and its socket closed, while this client still holds its end open
	 * and reads nothing.
	 */
	back_to_baseline();
	for (int i = 0; i < 500 && !closed; i++) {
		closed = daemon_fds(pid) <= fds_before;
		if (!closed)
			usleep(10000);
	}
	ck_assert_msg(closed,
		      "the daemon still holds the connection of a "
		      "client that reads nothing (%d descriptors, %d before): "
		      "its queued replies stay in memory until the client "
		      "reads or hangs up",
		      daemon_fds(pid), fds_before);
	close(fd);
}
END_TEST

/* Two 1 MiB replies sent and not read: their staging is held. */
static void staging_is_held(void)
{
	uint64_t held = 0;

	for (int i = 0; i < 500 && held < (1u << 20); i++) {
		held = report_pinned_in_use(good);
		if (held < (1u << 20))
			usleep(10000);
	}
	ck_assert_msg(held >= (1u << 20),
		      "no staging held for replies "
		      "waiting on a client (%llu bytes)",
		      (unsigned long long)held);
}

START_TEST(client_never_reads_large_replies)
{
	/*
	 * Replies of 1 MiB are written from the daemon's read staging
	 * (executor.c's reply_pieces), which stays held while they wait.  A
	 * client that never reads them is cut off past max_pending_bytes,
	 * and every staging buffer goes back with its connection.
	 */
	int fd = never_reading_client(1u << 20, 1u << 20, 2, 64,
				      staging_is_held);
	uint64_t held = 1;

	back_to_baseline();
	for (int i = 0; i < 500 && held != 0; i++) {
		held = report_pinned_in_use(good);
		if (held != 0)
			usleep(10000);
	}
	ck_assert_msg(held == 0,
		      "%llu bytes of read staging still held "
		      "after the connection was cut off",
		      (unsigned long long)held);
	close(fd);
}
END_TEST

START_TEST(slow_reader_does_not_take_the_pinned_pool)
{
	/*
	 * Eight 1 MiB replies to a client that reads them only later: past
	 * half the pinned pool (4 MiB here) the waiting replies are copied
	 * out of their read staging, which goes back to the pool, and the
	 * client still gets every byte.
	 */
	enum { N = 8, LEN = 1 << 20 };
	struct gpucmd_conn *c = connect_as("slow");
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	uint8_t *src = malloc(LEN);
	uint64_t ids[N], held = 0, peak = 0;
	const void *data;
	size_t len;

	ck_assert_ptr_nonnull(src);
	for (size_t i = 0; i < LEN; i++)
		src[i] = (uint8_t)(i * 29 + (i >> 11));
	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(b, 1, src, LEN), 0);
	gpucmd_response_free(run_ok(b));
	for (int i = 0; i < N; i++) {
		b = batch(c, 0);
		ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, LEN), 0);
		ck_assert_int_eq(gpucmd_submit(b, &ids[i]), 0);
	}
	/* All eight run within this; none is read. */
	for (int i = 0; i < 30; i++) {
		usleep(10000);
		held = report_pinned_in_use(good);
		peak = held > peak ? held : peak;
	}
	ck_assert_msg(held <= PINNED_POOL / 2 + LEN,
		      "%llu bytes of read staging held for one slow reader "
		      "(half the pool is %u)",
		      (unsigned long long)held, PINNED_POOL / 2);
	ck_assert_msg(peak >= LEN,
		      "no reply went out from its staging "
		      "(peak %llu)",
		      (unsigned long long)peak);
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(gpucmd_wait(c, ids[i], &r), 0);
		ck_assert_int_eq(gpucmd_response_error(r), 0);
		ck_assert_int_eq(gpucmd_response_data(r, 0, &data, &len), 0);
		ck_assert_uint_eq(len, LEN);
		ck_assert_int_eq(memcmp(data, src, LEN), 0);
		gpucmd_response_free(r);
	}
	for (int i = 0; i < 500 && held != 0; i++) {
		held = report_pinned_in_use(good);
		if (held != 0)
			usleep(10000);
	}
	ck_assert_uint_eq(held, 0);
	free(src);
	gpucmd_close(c);
}
END_TEST

START_TEST(slowloris)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT, *w;
	Gpucmd__Hello hello = GPUCMD__HELLO__INIT;
	uint8_t *buf;
	size_t len;
	int fd = raw_connect();

	hello.protocol_version = GPUCMD_PROTOCOL_VERSION;
	hello.service = "slow";
	hello.client_name = "one byte at a time";
	f.msg_case = GPUCMD__FRAME__MSG_HELLO;
	f.hello = &hello;
	ck_assert_int_eq(frame_encode(&f, &buf, &len), 0);
	for (size_t i = 0; i < len; i++) {
		uint64_t t0;

		send_all(fd, buf + i, 1);
		/* Meanwhile another client is served at full speed. */
		t0 = harness_now_us();
		if (i % 8 == 0)
			still_served(good);
		ck_assert_msg(harness_now_us() - t0 < 2000000,
			      "a trickling client slowed another down");
		usleep(20000);
	}
	free(buf);
	w = recv_frame(fd);
	ck_assert_ptr_nonnull(w);
	ck_assert_int_eq(w->msg_case, GPUCMD__FRAME__MSG_WELCOME);
	frame_free(w);
	/* A request trickled the same way is still answered. */
	{
		Gpucmd__Op op = GPUCMD__OP__INIT, *ops[1] = { &op };
		Gpucmd__OpPing p = GPUCMD__OP_PING__INIT;
		Gpucmd__Request req = GPUCMD__REQUEST__INIT;
		Gpucmd__Frame *r;

		op.op_case = GPUCMD__OP__OP_PING;
		op.ping = &p;
		req.id = 77;
		req.n_ops = 1;
		req.ops = ops;
		f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
		f.request = &req;
		ck_assert_int_eq(frame_encode(&f, &buf, &len), 0);
		for (size_t i = 0; i < len; i++) {
			send_all(fd, buf + i, 1);
			usleep(5000);
		}
		free(buf);
		r = recv_frame(fd);
		ck_assert_ptr_nonnull(r);
		ck_assert_uint_eq(r->response->id, 77);
		ck_assert_ptr_null(r->response->error);
		frame_free(r);
	}
	close(fd);
	back_to_baseline();
}
END_TEST

START_TEST(flood_of_connections)
{
	enum { N = 200 };
	static int fds[N];
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Hello hello = GPUCMD__HELLO__INIT;
	uint64_t t0 = harness_now_us();
	uint8_t *buf;
	size_t len;
	int lines;

	hello.protocol_version = GPUCMD_PROTOCOL_VERSION;
	hello.service = "flood";
	f.msg_case = GPUCMD__FRAME__MSG_HELLO;
	f.hello = &hello;
	ck_assert_int_eq(frame_encode(&f, &buf, &len), 0);
	/* All at once: connect and say Hello before reading anything. */
	for (int i = 0; i < N; i++) {
		fds[i] = raw_connect();
		send_all(fds[i], buf, len);
	}
	free(buf);
	for (int i = 0; i < N; i++) {
		Gpucmd__Frame *w = recv_frame(fds[i]);

		ck_assert_msg(w != NULL, "connection %d got no Welcome", i);
		ck_assert_int_eq(w->msg_case, GPUCMD__FRAME__MSG_WELCOME);
		frame_free(w);
	}
	still_served(good);
	{
		struct gpucmd_service_report t = report_totals(good);

		ck_assert_uint_eq(t.connections, baseline.connections + N);
	}
	for (int i = 0; i < N; i++)
		close(fds[i]);
	back_to_baseline();
	/*
	 * 400 lines of connections coming and going, and the setup's: at
	 * most 200 pass in each 10 s window of the daemon's life (session.c
	 * conn_lines), which began a moment before t0.
	 */
	lines = harness_log_count("joined service") +
		harness_log_count(") left\n") + harness_log_count(") closed");
	ck_assert_int_le(lines,
			 200 * (int)((harness_now_us() - t0) / 10000000 + 2));
}
END_TEST

/* Places past max_connections kept for admins (server.c). */
#define ADMIN_SPARE 4

START_TEST(connection_over_the_limit)
{
	int fds[LIMIT_CONNECTIONS + ADMIN_SPARE];
	int fd;

	/*
	 * The good client holds one of the LIMIT_CONNECTIONS; the test runs
	 * as root, an admin, who gets ADMIN_SPARE more (test_services checks
	 * that anyone else is refused at the limit itself).
	 */
	for (int i = 0; i < LIMIT_CONNECTIONS - 1 + ADMIN_SPARE; i++) {
		fds[i] = raw_connect();
		raw_hello(fds[i], "many");
	}
	fd = raw_connect();
	expect_refusal(fd, GPUCMD_ELIMIT, "max_connections");
	/* A freed place is taken again. */
	close(fds[0]);
	place_comes_back("a hang-up");
	for (int i = 1; i < LIMIT_CONNECTIONS - 1 + ADMIN_SPARE; i++)
		close(fds[i]);
	back_to_baseline();
}
END_TEST

/* Send n copies of descriptor fd with one byte of data. */
static int send_fds(int sock, int fd, int n, const void *byte)
{
	int fds[250];

	ck_assert_int_le(n, 250);
	for (int i = 0; i < n; i++)
		fds[i] = fd;
	return (int)harness_send_fds(sock, byte, 1, fds, n);
}

START_TEST(descriptors_nobody_asked_for)
{
	/*
	 * A client may pass memfds for region_attach.  One that sends
	 * descriptors with every byte of a frame it never finishes must not
	 * fill the daemon's descriptor table: the daemon holds at most a
	 * bounded number of them, or drops the client.
	 */
	pid_t pid = the_daemon.pid;
	int before = daemon_fds(pid), peak = 0;
	int mfd = page_memfd('n'); /* anything else is refused at once */
	uint8_t hdr[FRAME_HEADER_SIZE];
	int fd = raw_connect();

	raw_hello(fd, "hostile");
	header(hdr, 100);
	for (int i = 0; i < 8; i++) {
		int n;

		if (send_fds(fd, mfd, 250, &hdr[i]) < 0)
			break; /* the daemon hung up: fine */
		usleep(20000);
		n = daemon_fds(pid);
		if (n > peak)
			peak = n;
	}
	close(mfd);
	ck_assert_msg(peak - before <= 2 * 64 + 8,
		      "the daemon held %d descriptors a client pushed on it "
		      "without asking for any",
		      peak - before);
	close(fd);
	back_to_baseline();
	for (int i = 0; i < 500 && daemon_fds(pid) > before; i++)
		usleep(10000);
	ck_assert_int_le(daemon_fds(pid), before);
}
END_TEST

/* ---- clients that die -------------------------------------------------------- */

/* Memory on three streams and a 0.2 s kernel in flight. */
static int victim_holding_memory(void *arg)
{
	struct gpucmd_conn *conn = NULL;
	struct gpucmd_batch *b = NULL;
	struct gpucmd_response *r = NULL;
	uint32_t one[3] = { 1, 1, 1 };
	struct gpucmd_arg spin = { .kind = GPUCMD_ARG_U32, .v.u32 = 200000 };
	uint64_t id;

	(void)arg;
	if (gpucmd_connect(the_daemon.sock, "victim", &conn, NULL, 0) != 0)
		return 1;
	for (uint32_t s = 0; s < 3; s++) {
		gpucmd_batch_new(conn, s, &b);
		gpucmd_batch_empty(b, 1 + s, 8u << 20);
		gpucmd_batch_empty(b, 10 + s, 1000);
		if (gpucmd_run(b, &r) != 0 || gpucmd_response_error(r))
			return 2;
		gpucmd_response_free(r);
	}
	gpucmd_batch_new(conn, 0, &b);
	gpucmd_batch_kernel(b, "spin", one, one, &spin, 1);
	gpucmd_batch_sync(b);
	return gpucmd_submit(b, &id) != 0 ? 3 : 0;
}

START_TEST(kill_9_client_holding_memory)
{
	pid_t pid = harness_child_ready(victim_holding_memory, NULL);
	struct gpucmd_service_report t = report_totals(good);

	ck_assert_uint_eq(t.bytes_in_use,
			  baseline.bytes_in_use + 3 * ((8u << 20) + 1000));
	harness_child_kill(pid);
	/* Teardown waits for the spin (0.2 s) the device is running. */
	back_to_baseline();
}
END_TEST

START_TEST(kill_storm)
{
	/*
	 * Clients killed at random points under load: 120 of them, 8 at a
	 * time, each running batches in a loop until it is killed after
	 * 0-30 ms.  Bounded to about 5 s.
	 */
	enum { TOTAL = 120, AT_ONCE = 8 };
	pid_t pids[AT_ONCE] = { 0 };
	unsigned seed = 12345;
	uint64_t t0 = harness_now_us();

	for (int started = 0, k = 0; started < TOTAL; k = (k + 1) % AT_ONCE) {
		if (pids[k] > 0) {
			kill(pids[k], SIGKILL);
			waitpid(pids[k], NULL, 0);
			pids[k] = 0;
		}
		pids[k] = fork();
		ck_assert_int_ge(pids[k], 0);
		if (pids[k] == 0) {
			struct gpucmd_conn *conn = NULL;
			uint8_t data[4096];

			memset(data, 0x5a, sizeof(data));
			if (gpucmd_connect(the_daemon.sock, "storm", &conn,
					   NULL, 0) != 0)
				_exit(0);
			for (uint64_t h = 1;; h++) {
				struct gpucmd_batch *b = NULL;
				uint64_t id;

				gpucmd_batch_new(conn, (uint32_t)(h % 3), &b);
				gpucmd_batch_create_with_data(b, h, data,
							      sizeof(data));
				gpucmd_batch_empty(b, h + (1ull << 40), 10000);
				gpucmd_batch_read(b, h, 0, sizeof(data));
				if (h % 2)
					gpucmd_batch_release(b, h);
				if (gpucmd_submit(b, &id) != 0)
					_exit(0);
			}
		}
		started++;
		usleep((useconds_t)(rand_r(&seed) % 30000));
	}
	for (int k = 0; k < AT_ONCE; k++) {
		if (pids[k] > 0) {
			kill(pids[k], SIGKILL);
			waitpid(pids[k], NULL, 0);
		}
	}
	ck_assert_msg(harness_now_us() - t0 < 20000000,
		      "the storm took %llu us",
		      (unsigned long long)(harness_now_us() - t0));
	back_to_baseline();
}
END_TEST

START_TEST(hangup_with_batches_in_flight)
{
	Gpucmd__Op ops[3], *opp[3];
	Gpucmd__OpCreateWithData cw = GPUCMD__OP_CREATE_WITH_DATA__INIT;
	Gpucmd__OpRead rd = GPUCMD__OP_READ__INIT;
	Gpucmd__OpSync sy = GPUCMD__OP_SYNC__INIT;
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	static uint8_t data[8192];
	int fd = raw_connect();

	raw_hello(fd, "hostile");
	for (int i = 0; i < 3; i++) {
		gpucmd__op__init(&ops[i]);
		opp[i] = &ops[i];
	}
	ops[0].op_case = GPUCMD__OP__OP_CREATE_WITH_DATA;
	ops[0].create_with_data = &cw;
	cw.data.data = data;
	cw.data.len = sizeof(data);
	ops[1].op_case = GPUCMD__OP__OP_READ;
	ops[1].read = &rd;
	rd.length = sizeof(data);
	ops[2].op_case = GPUCMD__OP__OP_SYNC;
	ops[2].sync = &sy;
	req.ops = opp;
	req.n_ops = 3;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	for (uint64_t i = 1; i <= 100; i++) {
		req.id = i;
		req.stream = (uint32_t)(i % 4);
		cw.handle = i;
		rd.handle = i;
		send_frame(fd, &f);
	}
	close(fd);
	back_to_baseline();
}
END_TEST

/*
 * A client shuts down only its reading side (shutdown(SHUT_RD)) and goes
 * on sending pings.  Its first reply meets EPIPE; since it can still send,
 * it never reaches the end of its stream, and without a close it could
 * make the daemon run work whose replies nobody holds, for good.  The
 * daemon closes it and says why; its next sends fail.
 */
START_TEST(a_client_that_stops_reading_but_sends_is_closed)
{
	Gpucmd__OpPing p = GPUCMD__OP_PING__INIT;
	Gpucmd__Op op = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[1] = { &op };
	const char *why = "shut down its reading side but still sends";
	int before = harness_log_count(why), fd = raw_connect(), sent = 0;
	uint8_t *buf = NULL;
	size_t len = 0;
	ssize_t n = 0;

	raw_hello(fd, "hostile");
	ck_assert_int_eq(shutdown(fd, SHUT_RD), 0);
	op.op_case = GPUCMD__OP__OP_PING;
	op.ping = &p;
	append_request(&buf, &len, 1, 0, ops, 1);
	/* 10 s of a ping every 10 ms at most; the close comes after one. */
	for (; sent < 1000; sent++) {
		n = send(fd, buf, len, MSG_NOSIGNAL);
		if (n < 0)
			break;
		ck_assert_int_eq(n, (ssize_t)len);
		usleep(10000);
	}
	ck_assert_msg(n < 0 && (errno == EPIPE || errno == ECONNRESET),
		      "%d pings sent after shutdown(SHUT_RD) and the daemon "
		      "still reads them (last send: %zd, %s)",
		      sent, n, n < 0 ? strerror(errno) : "ok");
	ck_assert_int_ge(sent, 1);
	harness_wait_log(why, before);
	free(buf);
	close(fd);
	back_to_baseline();
}
END_TEST

/* ---- faults and ordering ------------------------------------------------------- */

/* On CUDA a fault loses the context for everyone (tests/gpu/run.sh checks
 * that the daemon then exits 1); these cases are about the host backend. */
static bool host_backend_only(void)
{
	const char *b = getenv("GPUCMD_TEST_BACKEND");

	if (b != NULL && b[0] != '\0' && strcmp(b, "host") != 0) {
		printf("skipped: a host-backend case (backend %s)\n", b);
		return false;
	}
	return true;
}

START_TEST(kernel_fault_stays_on_its_stream)
{
	static const uint32_t one[3] = { 1, 1, 1 };
	struct gpucmd_conn *a, *b;
	struct gpucmd_batch *bt;
	struct gpucmd_response *r;
	uint64_t id;

	if (!host_backend_only())
		return;
	a = connect_as("faulty");
	b = connect_as("bystander");
	/* A buffer on stream 0, a fault after it, and another stream busy. */
	bt = batch(a, 1);
	gpucmd_batch_create_with_data(bt, 9, "on stream one", 13);
	gpucmd_response_free(run_ok(bt));
	bt = batch(a, 0);
	gpucmd_batch_kernel(bt, "fault", one, one, NULL, 0);
	ck_assert_int_eq(gpucmd_submit(bt, &id), 0);
	ck_assert_int_eq(gpucmd_wait(a, id, &r), 0);
	/* The launch itself is accepted: the fault happens on the device. */
	ck_assert_int_eq(gpucmd_response_error(r), 0);
	gpucmd_response_free(r);

	/* Other clients and the connection's other stream do not see it. */
	still_served(b);
	bt = batch(a, 1);
	gpucmd_batch_read(bt, 9, 0, 13);
	gpucmd_batch_sync(bt);
	r = run_ok(bt);
	gpucmd_response_free(r);

	/* The next sync on stream 0 reports it, with a sentence. */
	bt = batch(a, 0);
	gpucmd_batch_ping(bt);
	gpucmd_batch_sync(bt);
	run_fails(bt, 1, GPUCMD_ESTREAM, "stream fault");
	/* Once: the stream is usable again. */
	bt = batch(a, 0);
	gpucmd_batch_create_with_data(bt, 10, "after", 5);
	gpucmd_batch_read(bt, 10, 0, 5);
	gpucmd_batch_release(bt, 10);
	gpucmd_batch_sync(bt);
	run_reads_back(bt, "after", 5);
	/*
	 * A fault after the read in the same batch is not the read's: the
	 * data it read before it is good, and the next wait reports the
	 * fault.  (The batch's one fence used to pin it on the read, drop
	 * the data, and leave the later sync nothing to report.)
	 */
	bt = batch(a, 0);
	gpucmd_batch_create_with_data(bt, 11, "before", 6);
	gpucmd_batch_read(bt, 11, 0, 6);
	gpucmd_batch_kernel(bt, "fault", one, one, NULL, 0);
	gpucmd_batch_release(bt, 11);
	run_reads_back(bt, "before", 6);
	bt = batch(a, 0);
	gpucmd_batch_sync(bt);
	run_fails(bt, 0, GPUCMD_ESTREAM, "stream fault");
	/* A fault followed by a read in the same batch: the read reports it. */
	bt = batch(a, 0);
	gpucmd_batch_kernel(bt, "fault", one, one, NULL, 0);
	gpucmd_batch_read(bt, 9, 0, 13);
	run_fails(bt, 1, GPUCMD_ESTREAM, "read");
	/*
	 * The same with a later op that fails on its own: the batch reports
	 * its own error (ESTREAM would say that every op ran), and the next
	 * wait on the stream reports the fault.
	 */
	bt = batch(a, 0);
	gpucmd_batch_kernel(bt, "fault", one, one, NULL, 0);
	gpucmd_batch_read(bt, 9, 0, 13);
	gpucmd_batch_release(bt, 999);
	run_fails(bt, 2, GPUCMD_ENOTFOUND, "999");
	bt = batch(a, 0);
	gpucmd_batch_sync(bt);
	run_fails(bt, 0, GPUCMD_ESTREAM, "stream fault");
	bt = batch(a, 1);
	gpucmd_batch_release(bt, 9);
	gpucmd_batch_sync(bt);
	gpucmd_response_free(run_ok(bt));
	still_served(b);
	gpucmd_close(a);
	gpucmd_close(b);
	back_to_baseline();
}
END_TEST

START_TEST(fresh_buffer_written_from_another_stream)
{
	/*
	 * Fresh device memory is zeroed on the stream that allocates it.  A
	 * write on another stream right after the allocation must land after
	 * that zeroing (the write waits for it), or the zeroing wipes it.
	 * Stream 0 is kept busy for 300 ms so the zeroing comes late.
	 */
	static const uint32_t one[3] = { 1, 1, 1 };
	struct gpucmd_conn *c = connect_as("hostile");
	struct gpucmd_arg spin = { .kind = GPUCMD_ARG_U32, .v.u32 = 300000 };
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	const void *data;
	size_t len;
	uint64_t id0, id1;

	b = batch(c, 0);
	gpucmd_batch_kernel(b, "spin", one, one, &spin, 1);
	gpucmd_batch_empty(b, 1, 4096);
	gpucmd_batch_sync(b); /* answered once stream 0 is done */
	ck_assert_int_eq(gpucmd_submit(b, &id0), 0);
	b = batch(c, 1);
	gpucmd_batch_write(b, 1, 0, "written", 7);
	gpucmd_batch_read(b, 1, 0, 7);
	ck_assert_int_eq(gpucmd_submit(b, &id1), 0);
	ck_assert_int_eq(gpucmd_wait(c, id1, &r), 0);
	ck_assert_int_eq(gpucmd_response_error(r), 0);
	ck_assert_int_eq(gpucmd_response_data(r, 1, &data, &len), 0);
	ck_assert_msg(memcmp(data, "written", 7) == 0,
		      "the read after the write saw %02x %02x %02x...",
		      ((const uint8_t *)data)[0], ((const uint8_t *)data)[1],
		      ((const uint8_t *)data)[2]);
	gpucmd_response_free(r);
	ck_assert_int_eq(gpucmd_wait(c, id0, &r), 0);
	gpucmd_response_free(r);
	/* After stream 0 finished: the bytes are still there. */
	b = batch(c, 1);
	gpucmd_batch_sync(b);
	gpucmd_response_free(run_ok(b));
	b = batch(c, 1);
	gpucmd_batch_read(b, 1, 0, 7);
	gpucmd_batch_release(b, 1);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_data(r, 0, &data, &len), 0);
	ck_assert_msg(memcmp(data, "written", 7) == 0,
		      "the zeroing of the fresh buffer on stream 0 wiped a "
		      "write made on stream 1 (now %02x %02x %02x...)",
		      ((const uint8_t *)data)[0], ((const uint8_t *)data)[1],
		      ((const uint8_t *)data)[2]);
	gpucmd_response_free(r);
	gpucmd_close(c);
	back_to_baseline();
}
END_TEST

/* ---- out of memory --------------------------------------------------------------- */

/*
 * A daemon of 64 MiB (host backend only) replaces the fixture's for the
 * test; false on other backends, where the test has nothing to do.
 */
static bool restart_with_64m(void)
{
	if (!host_backend_only())
		return false;
	gpucmd_close(good);
	good = NULL;
	ck_assert_int_eq(daemon_stop(&the_daemon), 0);
	daemon_cleanup_dir(&the_daemon);
	daemon_start_args(&the_daemon, "--host-memory", "64M", NULL);
	take_baseline();
	return true;
}

START_TEST(small_host_memory)
{
	struct gpucmd_conn *c;
	struct gpucmd_batch *b;
	struct gpucmd_response *r = NULL;
	int failed = -1;

	if (!restart_with_64m())
		return;

	c = connect_as("hungry");
	/* One buffer over the whole device. */
	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 100u << 20);
	{
		ck_assert_int_eq(gpucmd_run(b, &r), 0);
		ck_assert_msg(gpucmd_response_error(r) == GPUCMD_ETOOBIG ||
				      gpucmd_response_error(r) == GPUCMD_ENOMEM,
			      "%s", gpucmd_response_message(r));
		ck_assert_msg(strstr(gpucmd_response_message(r), "104857600"),
			      "%s", gpucmd_response_message(r));
		gpucmd_response_free(r);
	}
	/* 8 MiB at a time until the 64 MiB run out. */
	b = batch(c, 0);
	for (uint64_t h = 1; h <= 12; h++)
		gpucmd_batch_empty(b, h, 8u << 20);
	ck_assert_int_eq(gpucmd_run(b, &r), 0);
	ck_assert_msg(gpucmd_response_error(r) == GPUCMD_ENOMEM,
		      "12 x 8 MiB in 64 MiB: %s (%s)",
		      gpucmd_errname(gpucmd_response_error(r)),
		      gpucmd_response_message(r));
	failed = gpucmd_response_failed_index(r);
	ck_assert_int_ge(failed, 4);
	ck_assert_int_le(failed, 8);
	/* The numbers that explain it. */
	ck_assert_msg(strstr(gpucmd_response_message(r), "8388608") &&
			      strstr(gpucmd_response_message(r), "67108864"),
		      "%s", gpucmd_response_message(r));
	gpucmd_response_free(r);
	{
		struct gpucmd_service_report t = report_totals(good);

		ck_assert_uint_eq(t.bytes_in_use,
				  (uint64_t)failed * (8u << 20));
		ck_assert_uint_ge(t.oom_count, 1);
	}
	b = batch(c, 0);
	for (int h = 1; h <= failed; h++)
		gpucmd_batch_release(b, (uint64_t)h);
	gpucmd_batch_sync(b);
	gpucmd_response_free(run_ok(b));
	gpucmd_close(c);
	back_to_baseline();
}
END_TEST

/*
 * The device is shared: a service that allocated much once and went quiet
 * keeps its pages reserved with nothing live in them, and another
 * service's allocation takes them back instead of failing (64 MiB device:
 * 48 MiB reserved and free in "holder", then 32 MiB for "victim").  The
 * daemon used to reclaim only the asking connection's own streams.
 */
START_TEST(idle_reserve_of_another_service_is_reclaimed)
{
	struct gpucmd_conn *holder, *victim;
	struct gpucmd_batch *b;
	struct gpucmd_service_report t;

	if (!restart_with_64m())
		return;

	holder = connect_as("holder");
	victim = connect_as("victim");
	b = batch(holder, 0);
	for (uint64_t h = 1; h <= 3; h++)
		gpucmd_batch_empty(b, h, 16u << 20);
	gpucmd_response_free(run_ok(b));
	b = batch(holder, 0);
	for (uint64_t h = 1; h <= 3; h++)
		gpucmd_batch_release(b, h);
	gpucmd_batch_sync(b);
	gpucmd_response_free(run_ok(b));
	t = report_totals(good);
	ck_assert_uint_eq(t.bytes_in_use, 0);
	ck_assert_uint_ge(t.bytes_reserved, 48u << 20);

	/* 48 + 32 MiB do not fit in 64 without the holder's pages. */
	b = batch(victim, 0);
	gpucmd_batch_empty(b, 1, 16u << 20);
	gpucmd_batch_empty(b, 2, 16u << 20);
	gpucmd_batch_write(b, 2, (16u << 20) - 4, "tail", 4);
	gpucmd_batch_read(b, 2, (16u << 20) - 4, 4);
	{
		struct gpucmd_response *r = run_ok(b);
		const void *data;
		size_t len;

		ck_assert_int_eq(gpucmd_response_data(r, 3, &data, &len), 0);
		ck_assert_uint_eq(len, 4);
		ck_assert_int_eq(memcmp(data, "tail", 4), 0);
		gpucmd_response_free(r);
	}
	t = report_totals(good);
	ck_assert_uint_eq(t.bytes_in_use, 32u << 20);
	ck_assert_uint_le(t.bytes_reserved, 64u << 20);
	/* The holder can still allocate what is left. */
	b = batch(holder, 0);
	gpucmd_batch_empty(b, 9, 16u << 20);
	gpucmd_response_free(run_ok(b));
	gpucmd_close(holder);
	gpucmd_close(victim);
	back_to_baseline();
}
END_TEST

START_TEST(fail_every_allocation_site)
{
	/*
	 * --test-fail-alloc-at N fails the Nth device allocation.  A client
	 * makes five allocations, each the first on a fresh stream (so each
	 * takes device memory): four buffers written and read back, and one
	 * reservation bound later.  For each N, the failure either reaches the
	 * client as GPUCMD_ENOMEM with the hook's sentence and the numbers, or
	 * the daemon's reclaim-and-retry absorbs it; every buffer that was
	 * made holds its bytes, and once the client leaves nothing is held.
	 */
	for (int n = 1; n <= 6; n++) {
		char arg[16];
		struct gpucmd_conn *c;
		int failures = 0;
		uint64_t held = 0;

		if (good != NULL)
			gpucmd_close(good);
		good = NULL;
		ck_assert_int_eq(daemon_stop(&the_daemon), 0);
		daemon_cleanup_dir(&the_daemon);
		/* +1: the good client's first allocation comes first. */
		snprintf(arg, sizeof(arg), "%d", n + 1);
		daemon_start_args(&the_daemon, "--test-fail-alloc-at", arg,
				  NULL);
		take_baseline();
		c = connect_as("oom");
		for (uint32_t k = 1; k <= 5; k++) {
			struct gpucmd_batch *b = batch(c, k);
			struct gpucmd_response *r = NULL;
			char text[32];
			int e;

			snprintf(text, sizeof(text), "allocation %u", k);
			if (k == 4) {
				gpucmd_batch_reserve(b, 40, 24u << 20);
				gpucmd_batch_bind(b, 40, k);
			} else {
				gpucmd_batch_empty(b, k, 24u << 20);
			}
			gpucmd_batch_write(b, k, 1000, text, sizeof(text));
			gpucmd_batch_read(b, k, 1000, sizeof(text));
			ck_assert_int_eq(gpucmd_run(b, &r), 0);
			e = gpucmd_response_error(r);
			if (e == 0) {
				const void *data;
				size_t len;

				ck_assert_int_eq(gpucmd_response_data(
							 r,
							 gpucmd_response_count(
								 r) -
								 1,
							 &data, &len),
						 0);
				ck_assert_int_eq(memcmp(data, text, len), 0);
				held += 24u << 20;
			} else {
				ck_assert_msg(e == GPUCMD_ENOMEM,
					      "N=%d allocation %u: %s (%s)", n,
					      k, gpucmd_errname(e),
					      gpucmd_response_message(r));
				ck_assert_int_eq(gpucmd_response_failed_index(
							 r),
						 0);
				ck_assert_msg(
					strstr(gpucmd_response_message(r),
					       "fails on purpose") &&
						strstr(gpucmd_response_message(
							       r),
						       "25165824"),
					"%s", gpucmd_response_message(r));
				failures++;
			}
			gpucmd_response_free(r);
		}
		ck_assert_msg(failures <= 1, "N=%d: %d failures", n, failures);
		{
			struct gpucmd_service_report t = report_totals(good);

			ck_assert_uint_eq(t.bytes_in_use,
					  baseline.bytes_in_use + held);
		}
		still_served(c);
		gpucmd_close(c);
		back_to_baseline();
	}
}
END_TEST

START_TEST(reads_beyond_one_frame)
{
	/*
	 * A batch whose reads together exceed a frame (max_frame_bytes) is
	 * stopped at the read that would cross it, so the daemon never holds
	 * more read data for one batch than a frame: its peak memory stays
	 * far below the 1.25 GiB asked for.
	 */
	struct gpucmd_conn *c = connect_as("greedy");
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_response *r = NULL;
	pid_t pid = the_daemon.pid;
	long hwm0 = daemon_status_kb(pid, "VmHWM"), hwm1;
	const int n = 80; /* 80 x 16 MiB = 1.25 GiB */

	gpucmd_batch_empty(b, 1, 16u << 20);
	gpucmd_response_free(run_ok(b));
	b = batch(c, 0);
	for (int i = 0; i < n; i++)
		gpucmd_batch_read(b, 1, 0, 16u << 20);
	ck_assert_int_eq(gpucmd_run(b, &r), 0);
	ck_assert_int_eq(gpucmd_response_error(r), GPUCMD_ELIMIT);
	/*
	 * Replies obey max_frame_bytes (64M here): the read that would take
	 * the reply over it fails, the ones before ran (3 x 16 MiB).
	 */
	ck_assert_int_eq(gpucmd_response_failed_index(r), 3);
	ck_assert_uint_eq(gpucmd_response_count(r), 3);
	ck_assert_msg(strstr(gpucmd_response_message(r), "max_frame_bytes") !=
			      NULL,
		      "message: %s", gpucmd_response_message(r));
	gpucmd_response_free(r);
	hwm1 = daemon_status_kb(pid, "VmHWM");
	/* ThreadSanitizer's shadow multiplies resident memory: no bound there. */
	if (strstr(harness_build(), "san-thread") == NULL)
		ck_assert_msg(hwm1 - hwm0 < 512 * 1024,
			      "the daemon's peak memory grew by %ld MiB for a "
			      "batch it refused",
			      (hwm1 - hwm0) / 1024);
	b = batch(c, 0);
	gpucmd_batch_release(b, 1);
	gpucmd_response_free(run_ok(b));
	gpucmd_close(c);
	back_to_baseline();
}
END_TEST

/* Append v as a varint at *p. */
static void put_varint(uint8_t **p, uint64_t v)
{
	while (v >= 0x80) {
		*(*p)++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*(*p)++ = (uint8_t)v;
}

/*
 * A whole frame (header and body) of one Request of id 1 whose ops field
 * is inner (already encoded); *len gets its size.
 */
static uint8_t *request_frame(const uint8_t *inner, size_t inner_len,
			      size_t *len)
{
	uint8_t *buf = malloc(FRAME_HEADER_SIZE + inner_len + 32), *p, *body;
	size_t rlen = 2 + inner_len;

	ck_assert_ptr_nonnull(buf);
	p = body = buf + FRAME_HEADER_SIZE;
	*p++ = (4 << 3) | 2; /* Frame.request */
	put_varint(&p, rlen);
	*p++ = (1 << 3) | 0; /* Request.id = 1 */
	*p++ = 1;
	memcpy(p, inner, inner_len);
	p += inner_len;
	header(buf, (uint32_t)(p - body));
	*len = (size_t)(p - buf);
	return buf;
}

/* A ping on a raw connection is answered. */
static void raw_ping(int fd, uint64_t id)
{
	Gpucmd__OpPing p = GPUCMD__OP_PING__INIT;
	Gpucmd__Op op = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[1] = { &op };
	Gpucmd__Frame *r;

	op.op_case = GPUCMD__OP__OP_PING;
	op.ping = &p;
	r = raw_run(fd, id, 0, ops, 1);
	ck_assert_ptr_null(r->response->error);
	frame_free(r);
}

/* The Response to request 1 is a refusal of code naming what. */
static void expect_batch_refusal(int fd, int code, const char *what)
{
	Gpucmd__Frame *r = recv_frame(fd);

	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(r->msg_case, GPUCMD__FRAME__MSG_RESPONSE);
	ck_assert_uint_eq(r->response->id, 1);
	ck_assert_ptr_nonnull(r->response->error);
	ck_assert_int_eq(r->response->error->code, code);
	ck_assert_uint_eq(r->response->n_results, 0);
	ck_assert_msg(strstr(r->response->error->message, what) != NULL,
		      "message '%s' does not name '%s'",
		      r->response->error->message, what);
	frame_free(r);
}

/*
 * A new connection sends the request of ops inner (request_frame): it is
 * refused unread with GPUCMD_ELIMIT naming words, and a ping after it is
 * answered.  The connection, still open.
 */
static int refused_unread(const uint8_t *inner, size_t inner_len,
			  const char *words)
{
	size_t len;
	uint8_t *frame = request_frame(inner, inner_len, &len);
	int fd = raw_connect();

	raw_hello(fd, "hostile");
	send_all(fd, frame, len);
	expect_batch_refusal(fd, GPUCMD_ELIMIT, words);
	raw_ping(fd, 2);
	free(frame);
	return fd;
}

/*
 * Fields the daemon does not know, or millions of repeated entries, take
 * protobuf-c far more memory to decode than their bytes (a record of each
 * field while it decodes, a kept copy of each unknown one): a 60 MB frame
 * took 2.2 GB and stalled the loop for 5 s.  A counted frame whose fields
 * would take more than its size and 4096 bytes for each of
 * max_ops_per_batch is refused undecoded: a request with 6 M unknown fields
 * (12 MiB) is answered with GPUCMD_ELIMIT and the connection goes on; a
 * frame of nothing but such fields closes it.  The daemon's peak memory
 * hardly moves.
 */
START_TEST(unknown_fields_are_refused_undecoded)
{
	enum { NFIELDS = 6 << 20 };
	uint8_t *inner = malloc(2 * (size_t)NFIELDS + 16), *frame;
	long before = daemon_status_kb(the_daemon.pid, "VmHWM"), after;
	int fd;

	ck_assert_ptr_nonnull(inner);
	inner[0] = (3 << 3) | 2; /* Request.ops: an empty Op */
	inner[1] = 0;
	for (size_t i = 1; i <= NFIELDS; i++) {
		inner[2 * i] = (15 << 3) | 0; /* field 15 = 0, unknown */
		inner[2 * i + 1] = 0;
	}
	fd = refused_unread(inner, 2 * (size_t)NFIELDS + 2,
			    "fields would take");

	/* The same fields in the Frame, with no request: the close. */
	frame = malloc(FRAME_HEADER_SIZE + 2 * (size_t)NFIELDS);
	ck_assert_ptr_nonnull(frame);
	memcpy(frame + FRAME_HEADER_SIZE, inner + 2, 2 * (size_t)NFIELDS);
	header(frame, 2 * (uint32_t)NFIELDS);
	send_all(fd, frame, FRAME_HEADER_SIZE + 2 * (size_t)NFIELDS);
	expect_refusal(fd, GPUCMD_ELIMIT, "fields would take");
	free(frame);
	free(inner);
	after = daemon_status_kb(the_daemon.pid, "VmHWM");
	ck_assert_msg(after - before < 128 * 1024,
		      "the daemon's peak grew by %ld KiB", after - before);
	back_to_baseline();
}
END_TEST

/*
 * Large requests are counted before protobuf-c decodes them: 8 M empty ops
 * in 16 MiB (which decoded take gigabytes and seconds of the loop) or one
 * kernel of a million empty arguments are refused unread, with the answer
 * a small batch over the limits gets (they closed the connection), and the
 * daemon's peak memory hardly moves.  A refused one's attach takes its
 * descriptor along: the next attach gets its own.
 */
START_TEST(huge_op_counts_are_refused_undecoded)
{
	enum { NOPS = 8 << 20, NARGS = 1 << 20 };
	uint8_t *inner = malloc(2 * (size_t)NOPS + 16), *frame, *p;
	long before = daemon_status_kb(the_daemon.pid, "VmHWM"), after;
	size_t len;
	int fd;

	ck_assert_ptr_nonnull(inner);
	for (size_t i = 0; i < NOPS; i++) {
		inner[2 * i] = (3 << 3) | 2; /* Request.ops, empty Op */
		inner[2 * i + 1] = 0;
	}
	fd = refused_unread(inner, 2 * (size_t)NOPS, "8388608 ops");

	/* The same with a region_attach first, its memfd in the sendmsg. */
	{
		int x = page_memfd('x'), y = page_memfd('y');
		Gpucmd__OpRegionAttach att = GPUCMD__OP_REGION_ATTACH__INIT;
		Gpucmd__Op o_att = GPUCMD__OP__INIT;
		Gpucmd__Op *ops[1] = { &o_att };

		/*
		 * Request.ops: Op{region_attach (field 29, a two-byte tag)
		 * {region 7, size 4096}}, in the place of the first five
		 * empty ops.
		 */
		static const uint8_t attach[10] = {
			(3 << 3) | 2, 8, 0xea,	       0x01, 5,
			(1 << 3) | 0, 7, (2 << 3) | 0, 0x80, 0x20,
		};

		memcpy(inner, attach, sizeof(attach));
		frame = request_frame(inner, 2 * (size_t)NOPS, &len);
		ck_assert_int_eq(harness_send_fds(fd, frame, len, &x, 1),
				 (ssize_t)len);
		expect_batch_refusal(fd, GPUCMD_ELIMIT, "8388604 ops");
		free(frame);
		att.region = 8;
		att.size = 4096;
		o_att.op_case = GPUCMD__OP__OP_REGION_ATTACH;
		o_att.region_attach = &att;
		send_request_fds(fd, 3, ops, 1, &y, 1);
		{
			Gpucmd__Frame *r = recv_frame(fd);

			ck_assert_ptr_nonnull(r);
			ck_assert_int_eq(r->msg_case,
					 GPUCMD__FRAME__MSG_RESPONSE);
			ck_assert_uint_eq(r->response->id, 3);
			ck_assert_ptr_null(r->response->error);
			frame_free(r);
		}
		close(x);
		close(y);
		close(fd);
		for (size_t i = 0; i < NOPS; i++) {
			inner[2 * i] = (3 << 3) | 2;
			inner[2 * i + 1] = 0;
		}
	}

	/* One op: kernel (Op field 6) with NARGS empty args (field 4). */
	p = inner;
	*p++ = (3 << 3) | 2;
	put_varint(&p, 1 + 4 + 2 * (uint64_t)NARGS);
	*p++ = (6 << 3) | 2;
	put_varint(&p, 2 * (uint64_t)NARGS);
	for (size_t i = 0; i < NARGS; i++) {
		*p++ = (4 << 3) | 2;
		*p++ = 0;
	}
	frame = request_frame(inner, (size_t)(p - inner), &len);
	fd = raw_connect();
	raw_hello(fd, "hostile");
	send_all(fd, frame, len);
	expect_batch_refusal(fd, GPUCMD_EINVAL, "1048576 arguments");
	raw_ping(fd, 2);
	close(fd);
	free(frame);
	free(inner);
	after = daemon_status_kb(the_daemon.pid, "VmHWM");
	ck_assert_msg(after - before < 96 * 1024,
		      "the daemon's peak grew from %ld to %ld KiB", before,
		      after);
	still_served(good);
	back_to_baseline();
}
END_TEST

static void setup_one_in_flight(void)
{
	setup_config("[limits]\nmax_in_flight = 1\n");
}

/* A spin kernel op of us microseconds, on a 1x1x1 launch. */
struct raw_spin {
	Gpucmd__KernelArg arg;
	Gpucmd__KernelArg *args[1];
	Gpucmd__OpKernel k;
	uint32_t one[3];
	Gpucmd__Op op;
};

static Gpucmd__Op *raw_spin_op(struct raw_spin *s, uint32_t us)
{
	gpucmd__kernel_arg__init(&s->arg);
	s->arg.value_case = GPUCMD__KERNEL_ARG__VALUE_U32;
	s->arg.u32 = us;
	s->args[0] = &s->arg;
	gpucmd__op_kernel__init(&s->k);
	s->one[0] = s->one[1] = s->one[2] = 1;
	s->k.name = "spin";
	s->k.n_grid = 3;
	s->k.grid = s->one;
	s->k.n_block = 3;
	s->k.block = s->one;
	s->k.n_args = 1;
	s->k.args = s->args;
	gpucmd__op__init(&s->op);
	s->op.op_case = GPUCMD__OP__OP_KERNEL;
	s->op.kernel = &s->k;
	return &s->op;
}

/*
 * max_in_flight holds for a client that writes many requests at once: with
 * a limit of 1, a sync on an idle stream sent right behind a long kernel
 * (in the same write) waits for the kernel's answer.  The daemon used to
 * submit every whole frame it had read, whatever the limit.
 */
START_TEST(pipelined_requests_keep_to_max_in_flight)
{
	struct raw_spin spin;
	Gpucmd__OpSync sy = GPUCMD__OP_SYNC__INIT;
	Gpucmd__Op os = GPUCMD__OP__INIT;
	Gpucmd__Op *spin_ops[2] = { raw_spin_op(&spin, 300000), &os };
	Gpucmd__Op *sync_ops[1] = { &os };
	uint8_t *buf = NULL;
	size_t len = 0;
	int fd = raw_connect();

	raw_hello(fd, "inflight");
	os.op_case = GPUCMD__OP__OP_SYNC;
	os.sync = &sy;
	append_request(&buf, &len, 1, 0, spin_ops, 2);
	append_request(&buf, &len, 2, 1, sync_ops, 1);
	send_all(fd, buf, len);
	free(buf);
	for (uint64_t want = 1; want <= 2; want++) {
		Gpucmd__Frame *r = recv_frame(fd);

		ck_assert_ptr_nonnull(r);
		ck_assert_int_eq(r->msg_case, GPUCMD__FRAME__MSG_RESPONSE);
		ck_assert_msg(r->response->id == want,
			      "answer %llu came before answer %llu: two "
			      "requests were in flight under max_in_flight = 1",
			      (unsigned long long)r->response->id,
			      (unsigned long long)want);
		ck_assert_ptr_null(r->response->error);
		frame_free(r);
	}
	close(fd);
}
END_TEST

/* Attach memfd z (4 KiB) as region id on fd; the response frame. */
static Gpucmd__Frame *attach_region(int fd, uint64_t id, int z)
{
	Gpucmd__OpRegionAttach att = GPUCMD__OP_REGION_ATTACH__INIT;
	Gpucmd__Op o_att, *ops[1] = { &o_att };
	Gpucmd__Frame *r;

	att.region = id;
	att.size = 4096;
	gpucmd__op__init(&o_att);
	o_att.op_case = GPUCMD__OP__OP_REGION_ATTACH;
	o_att.region_attach = &att;
	send_request_fds(fd, 1, ops, 1, &z, 1);
	r = recv_frame(fd);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(r->msg_case, GPUCMD__FRAME__MSG_RESPONSE);
	return r;
}

/* A connection of service with the 4 KiB memfd z attached as region 20. */
static int connect_with_region(const char *service, int z)
{
	int fd = raw_connect();
	Gpucmd__Frame *r;

	raw_hello(fd, service);
	r = attach_region(fd, 20, z);
	ck_assert_msg(r->response->error == NULL, "attach: %s",
		      r->response->error ? r->response->error->message : "");
	frame_free(r);
	return fd;
}

/*
 * Append request id on stream 0: handle 1 made of data (len bytes, filled
 * with 'q' here), and its first n bytes read into region 20.
 */
static void append_copy_to_region(uint8_t **buf, size_t *buf_len, uint64_t id,
				  uint8_t *data, size_t len, size_t n)
{
	Gpucmd__OpCreateWithData cd = GPUCMD__OP_CREATE_WITH_DATA__INIT;
	Gpucmd__RegionRef dst = GPUCMD__REGION_REF__INIT;
	Gpucmd__OpRead rd = GPUCMD__OP_READ__INIT;
	Gpucmd__Op o_cd, o_rd, *ops[2] = { &o_cd, &o_rd };

	memset(data, 'q', len);
	cd.handle = 1;
	cd.data.data = data;
	cd.data.len = len;
	gpucmd__op__init(&o_cd);
	o_cd.op_case = GPUCMD__OP__OP_CREATE_WITH_DATA;
	o_cd.create_with_data = &cd;
	dst.region = 20;
	dst.length = n;
	rd.handle = 1;
	rd.length = n;
	rd.into = &dst;
	gpucmd__op__init(&o_rd);
	o_rd.op_case = GPUCMD__OP__OP_READ;
	o_rd.read = &rd;
	append_request(buf, buf_len, id, 0, ops, 2);
}

/* The first n bytes (4 KiB at most) of memfd z become 'q' within 3 s. */
static void expect_region_copied(int z, size_t n, const char *what)
{
	uint8_t got[4096];
	bool copied = false;

	for (int i = 0; i < 300 && !copied; i++) {
		ck_assert_int_eq(pread(z, got, n, 0), (ssize_t)n);
		copied = got[0] == 'q' && got[n - 1] == 'q';
		if (!copied)
			usleep(10000);
	}
	ck_assert_msg(copied, "%s did not run: the region holds '%c' bytes",
		      what, got[0]);
}

/*
 * A region id already attached, or 0, is refused with the reason (the
 * client library checks before sending; a raw client does not), and the
 * region attached first still works.
 */
START_TEST(region_ids_taken_or_zero_are_refused)
{
	int z = page_memfd('z'), y = page_memfd('y');
	int fd = connect_with_region("hostile", z);
	static uint8_t data[1024];
	struct {
		uint64_t id;
		int code;
		const char *says;
	} bad[] = {
		{ 20, GPUCMD_EEXIST, "region id 20 is already attached" },
		{ 0, GPUCMD_EINVAL, "region id 0 is invalid" },
	};
	uint8_t *buf = NULL;
	size_t len = 0;
	Gpucmd__Frame *r;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		r = attach_region(fd, bad[i].id, y);
		ck_assert_ptr_nonnull(r->response->error);
		ck_assert_int_eq(r->response->error->code, bad[i].code);
		ck_assert_msg(strstr(r->response->error->message,
				     bad[i].says) != NULL,
			      "message: %s", r->response->error->message);
		frame_free(r);
	}
	append_copy_to_region(&buf, &len, 2, data, sizeof(data), sizeof(data));
	send_all(fd, buf, len);
	r = recv_frame(fd);
	ck_assert_ptr_nonnull(r);
	ck_assert_msg(r->response->error == NULL, "copy: %s",
		      r->response->error ? r->response->error->message : "");
	frame_free(r);
	expect_region_copied(z, sizeof(data), "the copy into region 20");
	free(buf);
	close(fd);
	close(y);
	close(z);
	back_to_baseline();
}
END_TEST

/*
 * A client sends a long batch and, behind it, one that copies into its
 * region, then closes without reading.  Under max_in_flight = 1 the second
 * waits for the first; the first one's reply then meets a closed socket
 * (EPIPE).  The second still runs: a client's requests are not lost
 * because it did not stay for the answers.
 */
START_TEST(batches_sent_before_a_close_all_run)
{
	int z = page_memfd('z'), fd = connect_with_region("inflight", z);
	struct raw_spin spin;
	static uint8_t data[1024];
	Gpucmd__Op *ops[1];
	uint8_t *buf = NULL;
	size_t len = 0;

	/* 200 ms of spinning, answered when the client is long gone. */
	ops[0] = raw_spin_op(&spin, 200000);
	append_request(&buf, &len, 2, 0, ops, 1);
	append_copy_to_region(&buf, &len, 3, data, sizeof(data), sizeof(data));
	send_all(fd, buf, len);
	close(fd);
	expect_region_copied(z, sizeof(data),
			     "the batch sent behind a long one, before the "
			     "close,");
	free(buf);
	close(z);
	back_to_baseline();
}
END_TEST

static void setup_small_byte_budget(void)
{
	setup_config("[limits]\nmax_bytes_in_flight = 1M\n");
}

/* One op's request, appended to *buf (append_request's shapes). */
static void append_op(uint8_t **buf, size_t *len, uint64_t id, uint32_t stream,
		      Gpucmd__Op *op)
{
	Gpucmd__Op *ops[1] = { op };

	append_request(buf, len, id, stream, ops, 1);
}

/* o: an empty op of size bytes for handle, in e. */
static void op_empty(Gpucmd__Op *o, Gpucmd__OpEmpty *e, uint64_t handle,
		     uint64_t size)
{
	e->handle = handle;
	e->size = size;
	o->op_case = GPUCMD__OP__OP_EMPTY;
	o->empty = e;
}

/* o: an inline write of len bytes at data to handle, in w. */
static void op_write(Gpucmd__Op *o, Gpucmd__OpWrite *w, uint64_t handle,
		     uint8_t *data, size_t len)
{
	w->handle = handle;
	w->data.len = len;
	w->data.data = data;
	o->op_case = GPUCMD__OP__OP_WRITE;
	o->write = w;
}

START_TEST(a_socket_sent_as_a_region_is_refused)
{
	/*
	 * A client sends the daemon its own end of the connection with a
	 * request (SCM_RIGHTS), then dies.  Held for a region_attach, it
	 * would leave the daemon holding both ends: no EOF ever, and the
	 * connection, with its 1 MiB, alive for good.  Only memfds may come.
	 */
	int fd = raw_connect();
	Gpucmd__OpEmpty em = GPUCMD__OP_EMPTY__INIT;
	Gpucmd__OpPing p = GPUCMD__OP_PING__INIT;
	Gpucmd__Op o_e = GPUCMD__OP__INIT, o_p = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[1] = { &o_e };
	Gpucmd__Frame *r;

	raw_hello(fd, "hostile");
	op_empty(&o_e, &em, 1, 1u << 20);
	r = raw_run(fd, 1, 0, ops, 1);
	ck_assert_ptr_null(r->response->error);
	frame_free(r);
	o_p.op_case = GPUCMD__OP__OP_PING;
	o_p.ping = &p;
	ops[0] = &o_p;
	send_request_fds(fd, 2, ops, 1, &fd, 1);
	expect_refusal(fd, GPUCMD_EPROTO, "not a memfd");
	back_to_baseline();
}
END_TEST

START_TEST(report_ops_are_bounded_per_batch)
{
	/*
	 * Each report op walks the daemon's streams on the device thread and
	 * builds its answer: a request of thousands (a few bytes each) held
	 * every service up for seconds and made the daemon build gigabytes.
	 * Sixteen fit a batch, the seventeenth is refused with the reason.
	 */
	int fd = raw_connect();
	Gpucmd__OpMemoryReport mr = GPUCMD__OP_MEMORY_REPORT__INIT;
	Gpucmd__OpStatus st = GPUCMD__OP_STATUS__INIT;
	Gpucmd__Op o_r = GPUCMD__OP__INIT, o_s = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[17];
	struct gpucmd_batch *b;
	Gpucmd__Frame *r;

	raw_hello(fd, "hostile");
	o_r.op_case = GPUCMD__OP__OP_MEMORY_REPORT;
	o_r.memory_report = &mr;
	o_s.op_case = GPUCMD__OP__OP_STATUS;
	o_s.status = &st;
	for (int i = 0; i < 17; i++)
		ops[i] = i % 2 ? &o_s : &o_r;
	r = raw_run(fd, 1, 0, ops, 16);
	ck_assert_ptr_null(r->response->error);
	ck_assert_uint_eq(r->response->n_results, 16);
	ck_assert_int_eq(r->response->results[0]->result_case,
			 GPUCMD__OP_RESULT__RESULT_REPORT);
	ck_assert_int_eq(r->response->results[15]->result_case,
			 GPUCMD__OP_RESULT__RESULT_STATUS);
	frame_free(r);
	r = raw_run(fd, 2, 0, ops, 17);
	ck_assert_ptr_nonnull(r->response->error);
	ck_assert_int_eq(r->response->error->code, GPUCMD_ELIMIT);
	ck_assert_uint_eq(r->response->failed_index, 16);
	ck_assert_msg(strstr(r->response->error->message,
			     "more than 16 report ops") != NULL,
		      "message '%s'", r->response->error->message);
	frame_free(r);
	close(fd);

	/* stream_report counts too, through the client library. */
	b = batch(good, 0);
	for (int i = 0; i < 17; i++)
		ck_assert_int_eq(gpucmd_batch_stream_report(b), 0);
	run_fails(b, 16, GPUCMD_ELIMIT, "stream_report");
	still_served(good);
}
END_TEST

/*
 * Send what fd takes of buf for about ms milliseconds without blocking,
 * then make fd blocking again; answers the bytes sent.
 */
static size_t offer(int fd, const uint8_t *buf, size_t len, int ms)
{
	int fl = fcntl(fd, F_GETFL);
	size_t sent = 0;
	ssize_t n;

	ck_assert_int_eq(fcntl(fd, F_SETFL, fl | O_NONBLOCK), 0);
	for (int tries = 0; tries < ms && sent < len; tries++) {
		n = send(fd, buf + sent, len - sent, MSG_NOSIGNAL);
		if (n > 0)
			sent += (size_t)n;
		else
			usleep(1000);
	}
	ck_assert_int_eq(fcntl(fd, F_SETFL, fl), 0);
	return sent;
}

/*
 * Bytes a client sends behind a long kernel wait in the socket, not in
 * the daemon: with max_bytes_in_flight = 1M, 32 inline writes of 1 MiB
 * queued behind a 1.5 s kernel do not go into the daemon's memory while
 * it runs (the socket stops taking them after a few hundred KiB), and all
 * of them land, in order, once it has run.  A request over the budget
 * alone still goes: each of these is.  The daemon used to read them all
 * at once, max_in_flight x max_frame_bytes (64 GiB) at worst.
 */
START_TEST(bytes_behind_a_kernel_wait_in_the_socket)
{
	enum { N = 32, MIB = 1 << 20 };
	struct raw_spin spin;
	Gpucmd__OpEmpty e = GPUCMD__OP_EMPTY__INIT;
	Gpucmd__OpWrite w = GPUCMD__OP_WRITE__INIT;
	Gpucmd__OpRead rd = GPUCMD__OP_READ__INIT;
	Gpucmd__Op oe = GPUCMD__OP__INIT;
	Gpucmd__Op ow = GPUCMD__OP__INIT, orr = GPUCMD__OP__INIT;
	uint8_t *head = NULL, *writes = NULL, *data = malloc(MIB);
	size_t head_len = 0, writes_len = 0, sent = 0;
	int fd = raw_connect(), other = raw_connect();
	Gpucmd__Frame *r;

	ck_assert_ptr_nonnull(data);
	raw_hello(fd, "budget");
	raw_hello(other, "bystander");
	op_empty(&oe, &e, 1, MIB);
	append_op(&head, &head_len, 1, 0, &oe);
	append_op(&head, &head_len, 2, 0, raw_spin_op(&spin, 1500000));
	op_write(&ow, &w, 1, data, MIB);
	for (int i = 0; i < N; i++) {
		memset(data, 'a' + i % 26, MIB);
		append_op(&writes, &writes_len, 10 + (uint64_t)i, 0, &ow);
	}
	rd.handle = 1;
	rd.length = 16;
	orr.op_case = GPUCMD__OP__OP_READ;
	orr.read = &rd;
	append_op(&writes, &writes_len, 100, 0, &orr);

	send_all(fd, head, head_len);
	/* Both answered at once; the kernel runs for 1.5 s. */
	for (uint64_t want = 1; want <= 2; want++) {
		r = recv_frame(fd);
		ck_assert_ptr_nonnull(r);
		ck_assert_uint_eq(r->response->id, want);
		ck_assert_ptr_null(r->response->error);
		frame_free(r);
	}
	/* Offer the writes for 300 ms of the kernel's run, never blocking. */
	sent = offer(fd, writes, writes_len, 300);
	ck_assert_msg(sent < 4u * MIB,
		      "the daemon took %zu bytes behind a running kernel "
		      "under max_bytes_in_flight = 1M",
		      sent);
	ck_assert_uint_gt(sent, 0);
	/* The connection is not stuck for others meanwhile. */
	raw_ping(other, 7);
	send_all(fd, writes + sent, writes_len - sent);
	for (uint64_t want = 10; want < 10 + N; want++) {
		r = recv_frame(fd);
		ck_assert_ptr_nonnull(r);
		ck_assert_uint_eq(r->response->id, want);
		ck_assert_ptr_null(r->response->error);
		frame_free(r);
	}
	r = recv_frame(fd);
	ck_assert_ptr_nonnull(r);
	ck_assert_uint_eq(r->response->id, 100);
	ck_assert_ptr_null(r->response->error);
	ck_assert_uint_eq(r->response->n_results, 1);
	/* The last write won: 'a' + 31 % 26. */
	ck_assert_uint_eq(r->response->results[0]->data.len, 16);
	ck_assert_int_eq(r->response->results[0]->data.data[0],
			 'a' + (N - 1) % 26);
	ck_assert_int_eq(r->response->results[0]->data.data[15],
			 'a' + (N - 1) % 26);
	frame_free(r);
	free(head);
	free(writes);
	free(data);
	close(fd);
	close(other);
}
END_TEST

static void setup_byte_budget_16m(void)
{
	setup_config("[limits]\nmax_bytes_in_flight = 16M\n");
}

/*
 * What a request costs against max_bytes_in_flight is what it holds once
 * decoded, not only its bytes on the wire: a kernel op of 100000 empty
 * arguments is 200 KB on the wire (under the 256 KiB below which frames
 * are decoded without counting first) and ~5.6 MB of structs.  Forty of
 * them behind a 1.5 s kernel, each refused only when the device thread
 * reaches it, used to pass the 16M budget at their wire size and hold
 * ~220 MB of the daemon; now the loop stops reading after a few.
 */
START_TEST(decoded_size_counts_against_the_byte_budget)
{
	enum { N = 40, NARGS = 100000 };
	struct raw_spin spin, wide;
	Gpucmd__KernelArg empty = GPUCMD__KERNEL_ARG__INIT;
	Gpucmd__KernelArg **args = malloc(NARGS * sizeof(*args));
	uint8_t *head = NULL, *frames = NULL;
	size_t head_len = 0, frames_len = 0, sent = 0;
	int fd = raw_connect();
	long rss0, rss1;
	Gpucmd__Frame *r;

	ck_assert_ptr_nonnull(args);
	for (size_t i = 0; i < NARGS; i++)
		args[i] = &empty;
	raw_hello(fd, "budget");
	append_op(&head, &head_len, 1, 0, raw_spin_op(&spin, 1500000));
	raw_spin_op(&wide, 0);
	wide.k.n_args = NARGS;
	wide.k.args = args;
	for (int i = 0; i < N; i++)
		append_op(&frames, &frames_len, 10 + (uint64_t)i, 0, &wide.op);
	ck_assert_uint_lt(frames_len / N, 256 * 1024);
	send_all(fd, head, head_len);
	r = recv_frame(fd);
	ck_assert_ptr_nonnull(r);
	ck_assert_uint_eq(r->response->id, 1);
	frame_free(r);
	rss0 = daemon_status_kb(the_daemon.pid, "VmRSS");
	/* Offer the frames for 300 ms of the kernel's run. */
	sent = offer(fd, frames, frames_len, 300);
	rss1 = daemon_status_kb(the_daemon.pid, "VmRSS");
	ck_assert_msg(rss1 - rss0 < 64 * 1024,
		      "the daemon grew by %ld KiB holding %zu bytes of "
		      "requests behind a kernel, under max_bytes_in_flight = "
		      "16M",
		      rss1 - rss0, sent);
	ck_assert_uint_lt(sent, frames_len);
	/* Every one is answered, refused for its arguments, in order. */
	send_all(fd, frames + sent, frames_len - sent);
	for (uint64_t want = 10; want < 10 + N; want++) {
		r = recv_frame(fd);
		ck_assert_ptr_nonnull(r);
		ck_assert_uint_eq(r->response->id, want);
		ck_assert_ptr_nonnull(r->response->error);
		ck_assert_int_eq(r->response->error->code, GPUCMD_EINVAL);
		frame_free(r);
	}
	free(head);
	free(frames);
	free(args);
	close(fd);
}
END_TEST

/*
 * Send buf[sent[k]..len) on each of the n sockets fds[k], to whichever
 * takes bytes first (poll), until all is sent.
 */
static void send_all_poll(const int *fds, int n, const uint8_t *buf, size_t len,
			  size_t *sent)
{
	struct pollfd p[64];
	int left;

	ck_assert_int_le(n, 64);
	for (;;) {
		left = 0;
		for (int k = 0; k < n; k++) {
			p[k].fd = sent[k] < len ? fds[k] : -1;
			p[k].events = POLLOUT;
			p[k].revents = 0;
			left += sent[k] < len;
		}
		if (left == 0)
			return;
		ck_assert_int_gt(poll(p, (nfds_t)n, 20000), 0);
		for (int k = 0; k < n; k++) {
			ssize_t m;

			if (!(p[k].revents & (POLLOUT | POLLERR | POLLHUP)))
				continue;
			m = send(fds[k], buf + sent[k], len - sent[k],
				 MSG_NOSIGNAL | MSG_DONTWAIT);
			ck_assert_msg(m > 0 || errno == EAGAIN, "send: %s",
				      strerror(errno));
			if (m > 0)
				sent[k] += (size_t)m;
		}
	}
}

static void setup_service_budget_4m(void)
{
	setup_config("[service many]\nmax_bytes_in_flight = 4M\n"
		     "[service tight]\nmax_bytes_in_flight = 64K\n");
}

/*
 * A service's connections together keep to its max_bytes_in_flight: eight
 * connections of one service, each behind its own 1.5 s kernel, offer four
 * inline writes of 1 MiB each.  Each connection alone is far under the
 * daemon's per-connection budget (256M), so the daemon used to take all
 * 32 MiB; under the service's 4M it takes the first few and leaves the
 * rest in the sockets (what the sockets themselves hold counts in sent),
 * while another service is answered.  Once the kernels have run, every
 * write lands, in order.
 */
START_TEST(connections_of_a_service_share_its_byte_budget)
{
	enum { NC = 8, NW = 4, MIB = 1 << 20 };
	struct raw_spin spin;
	Gpucmd__OpEmpty e = GPUCMD__OP_EMPTY__INIT;
	Gpucmd__OpWrite w = GPUCMD__OP_WRITE__INIT;
	Gpucmd__Op oe = GPUCMD__OP__INIT, ow = GPUCMD__OP__INIT;
	uint8_t *head = NULL, *writes = NULL, *data = malloc(MIB);
	size_t head_len = 0, writes_len = 0, sent[NC], total = 0;
	int fd[NC], other = raw_connect();
	Gpucmd__Frame *r;

	ck_assert_ptr_nonnull(data);
	memset(data, 'w', MIB);
	raw_hello(other, "bystander");
	op_empty(&oe, &e, 1, MIB);
	append_op(&head, &head_len, 1, 0, &oe);
	append_op(&head, &head_len, 2, 0, raw_spin_op(&spin, 1500000));
	op_write(&ow, &w, 1, data, MIB);
	for (int i = 0; i < NW; i++)
		append_op(&writes, &writes_len, 10 + (uint64_t)i, 0, &ow);
	for (int k = 0; k < NC; k++) {
		fd[k] = raw_connect();
		raw_hello(fd[k], "many");
		send_all(fd[k], head, head_len);
		for (uint64_t want = 1; want <= 2; want++) {
			r = recv_frame(fd[k]);
			ck_assert_ptr_nonnull(r);
			ck_assert_uint_eq(r->response->id, want);
			ck_assert_ptr_null(r->response->error);
			frame_free(r);
		}
	}
	/* Offer every connection's writes for 100 ms, never blocking. */
	for (int k = 0; k < NC; k++) {
		sent[k] = offer(fd[k], writes, writes_len, 100);
		total += sent[k];
	}
	ck_assert_msg(total < 12u * MIB,
		      "the daemon took %zu bytes from %d connections of a "
		      "service whose max_bytes_in_flight is 4M",
		      total, NC);
	raw_ping(other, 7);
	/*
	 * The rest goes to whichever connection takes it, as from a client
	 * of one thread per connection: a frame the daemon let in holds its
	 * place in the budget until all of it came, so a client that left
	 * frames half sent and blocked on another connection would wait on
	 * itself.
	 */
	send_all_poll(fd, NC, writes, writes_len, sent);
	for (int k = 0; k < NC; k++) {
		for (uint64_t want = 10; want < 10 + NW; want++) {
			r = recv_frame(fd[k]);
			ck_assert_ptr_nonnull(r);
			ck_assert_uint_eq(r->response->id, want);
			ck_assert_ptr_null(r->response->error);
			frame_free(r);
		}
		close(fd[k]);
	}
	free(head);
	free(writes);
	free(data);
	close(other);
}
END_TEST

/*
 * Replies a service's clients leave unread count against its
 * max_bytes_in_flight: four connections of "many" (4M) ask for eight reads
 * of 1 MiB each and read nothing.  Each stays far under max_pending_bytes
 * (256M), so the daemon used to hold all 32 MiB for as long as they stayed
 * connected; now the lagging connections are cut off once the service's
 * unread replies pass 4M, saying so, and everything comes back.
 */
START_TEST(unread_replies_count_against_the_service_budget)
{
	const char *why = "its service's connections have";
	int before = harness_log_count(why), fd[4];

	for (int k = 0; k < 4; k++)
		fd[k] = never_reading_client_of("many", 1u << 20, 1u << 20, 0,
						8, NULL);
	harness_wait_log(why, before);
	for (int k = 0; k < 4; k++)
		close(fd[k]);
	back_to_baseline();
}
END_TEST

/* Pipelines rounds of n reads of len bytes on c, collecting each round. */
static void pipelined_reads(struct gpucmd_conn *c, int rounds, int n,
			    uint64_t len)
{
	struct gpucmd_response *r;
	uint64_t id[8];

	ck_assert_int_le(n, 8);
	for (int round = 0; round < rounds; round++) {
		for (int k = 0; k < n; k++) {
			struct gpucmd_batch *b = batch(c, 0);

			ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, len), 0);
			ck_assert_int_eq(gpucmd_submit(b, &id[k]), 0);
		}
		for (int k = 0; k < n; k++) {
			const char *died = "";
			int rc = gpucmd_wait(c, id[k], &r);

			if (rc != 0)
				(void)gpucmd_conn_error(c, &died);
			ck_assert_msg(rc == 0, "round %d: read %d: %s (%s)",
				      round, k, gpucmd_errname(rc), died);
			ck_assert_int_eq(gpucmd_response_error(r), 0);
			gpucmd_response_free(r);
		}
	}
}

/*
 * In service "many" (max_bytes_in_flight = 4M), a client that pipelines
 * reads and reads their replies as they come is not closed, even when
 * the replies it has not read yet go over the bound for a while: alone,
 * four 1.5 MiB reads at a time, and two of 5 MiB (over twice the bound:
 * held back, not closed); then beside a lazy connection that leaves
 * one 6 MiB reply unread (alone never cut off at once), two 1 MiB reads
 * at a time.  The connection that leaves the most unread and reads
 * nothing for a tick is the one closed: the lazy one, not whichever got a
 * reply while another was queued (that closed a prompt reader for the
 * lazy one's bytes).
 */
START_TEST(a_prompt_reader_is_not_closed_for_anothers_unread_replies)
{
	const char *why = "none read since the check before";
	int before = harness_log_count(why);
	struct gpucmd_conn *c = connect_as("many");
	struct gpucmd_batch *b = batch(c, 0);
	int lazy;

	gpucmd_batch_empty(b, 1, 5u << 20);
	gpucmd_response_free(run_ok(b));
	pipelined_reads(c, 10, 4, 3u << 19);
	pipelined_reads(c, 5, 2, 5u << 20); /* past twice the bound */
	lazy = never_reading_client_of("many", 6u << 20, 6u << 20, 0, 1, NULL);
	usleep(200000); /* the lazy reply queued */
	pipelined_reads(c, 20, 2, 1u << 20);
	harness_wait_log(why, before);
	/* What its socket holds of the reply, then the end. */
	for (;;) {
		uint8_t sink[65536];
		ssize_t n = recv(lazy, sink, sizeof(sink), 0);

		ck_assert_int_ge(n, 0);
		if (n == 0)
			break;
	}
	close(lazy);
	still_served(good);
	gpucmd_close(c);
	back_to_baseline();
}
END_TEST

/*
 * The bytes of a connection closed for not reading stop counting at its
 * close: a lazy connection of "many" leaves a 7 MiB reply unread, and a
 * 6 s kernel behind it keeps its teardown waiting once it is closed (by
 * the tick, or at twice the bound); a prompt reader of the service that pipelines two 1 MiB reads
 * meanwhile was then closed too, for the lazy one's bytes still counted.
 */
START_TEST(a_closed_readers_bytes_do_not_close_another)
{
	const char *why = "does not read its replies";
	int before = harness_log_count(why);
	struct gpucmd_conn *lazy = connect_as("many"), *c = connect_as("many");
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_arg us = { .kind = GPUCMD_ARG_U32, .v.u32 = 6000000 };
	uint32_t one[3] = { 1, 1, 1 };
	uint64_t id, t0;
	int rounds = 0;

	gpucmd_batch_empty(b, 1, 1u << 20);
	gpucmd_response_free(run_ok(b));
	b = batch(lazy, 0);
	gpucmd_batch_empty(b, 1, 7u << 20);
	gpucmd_response_free(run_ok(b));
	t0 = harness_now_us();
	b = batch(lazy, 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, 7u << 20), 0);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	b = batch(lazy, 0);
	ck_assert_int_eq(gpucmd_batch_kernel(b, "spin", one, one, &us, 1), 0);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	while (harness_now_us() - t0 < 5500000) {
		pipelined_reads(c, 1, 2, 1u << 20);
		rounds++;
	}
	ck_assert_msg(harness_log_count(why) > before,
		      "the lazy connection was not closed in 5.5 s");
	ck_assert_int_gt(rounds, 10);
	gpucmd_close(lazy);
	gpucmd_close(c);
	back_to_baseline();
}
END_TEST

/*
 * A libgpucmd client reads its replies while a send of its waits for room:
 * in service "many" (4M), one connection asks for two reads of 5 MiB and
 * leaves them unread, so its service is past twice its bound and the
 * daemon holds its requests back; then it submits a 3 MiB write.  The
 * library used to only wait to send, so the client waited on itself until
 * the tick closed it for not reading ("none read since the check
 * before"); now the send reads the two replies meanwhile and goes on, and
 * each wait finds its answer.
 */
START_TEST(a_client_blocked_sending_reads_its_replies)
{
	const char *why = "none read since the check before";
	int before = harness_log_count(why);
	struct gpucmd_conn *c = connect_as("many");
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_response *r;
	uint8_t *data = malloc(3u << 20);
	const void *got;
	uint64_t id[3];
	size_t len;
	const char *died = "";

	ck_assert_ptr_nonnull(data);
	memset(data, 0x5a, 3u << 20);
	gpucmd_batch_empty(b, 1, 5u << 20);
	gpucmd_response_free(run_ok(b));
	for (int k = 0; k < 2; k++) {
		b = batch(c, 0);
		ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, 5u << 20), 0);
		ck_assert_int_eq(gpucmd_submit(b, &id[k]), 0);
	}
	usleep(300000); /* both replies queued, unread */
	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_write_borrowed(b, 1, 0, data, 3u << 20),
			 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 1, (3u << 20) - 4, 4), 0);
	ck_assert_msg(gpucmd_submit(b, &id[2]) == 0 ||
			      (gpucmd_conn_error(c, &died), false),
		      "the write was not sent: %s", died);
	for (int k = 0; k < 3; k++) {
		int rc = gpucmd_wait(c, id[k], &r);

		if (rc != 0)
			(void)gpucmd_conn_error(c, &died);
		ck_assert_msg(rc == 0, "wait %d: %s (%s)", k,
			      gpucmd_errname(rc), died);
		ck_assert_int_eq(gpucmd_response_error(r), 0);
		if (k == 2) {
			ck_assert_int_eq(gpucmd_response_data(r, 1, &got, &len),
					 0);
			ck_assert_uint_eq(len, 4);
			ck_assert_int_eq(memcmp(got, data, 4), 0);
		}
		gpucmd_response_free(r);
	}
	ck_assert_int_eq(harness_log_count(why), before);
	free(data);
	gpucmd_close(c);
	back_to_baseline();
}
END_TEST

/*
 * A frame the service's budget lets in counts from the moment it is let
 * in, not only once it is submitted: eight connections of a service whose
 * max_bytes_in_flight is 4M each start a 16 MiB write and send all of it
 * but its last byte.  The daemon used to let every one in (nothing was
 * submitted yet, so each was "the service's first request") and hold all
 * 128 MiB of bodies; now the second and later wait in their sockets.
 * Once each connection's last byte comes, every write is answered.
 */
START_TEST(frames_being_read_count_against_the_service_budget)
{
	enum { NC = 8, MIB = 1 << 20, SIZE = 16 * MIB };
	Gpucmd__OpEmpty e = GPUCMD__OP_EMPTY__INIT;
	Gpucmd__OpWrite w = GPUCMD__OP_WRITE__INIT;
	Gpucmd__Op oe = GPUCMD__OP__INIT, ow = GPUCMD__OP__INIT;
	uint8_t *head = NULL, *frame = NULL, *data = calloc(1, SIZE);
	size_t head_len = 0, frame_len = 0, sent[NC], total = 0;
	int fd[NC];
	long rss0, rss1;
	Gpucmd__Frame *r;

	ck_assert_ptr_nonnull(data);
	op_empty(&oe, &e, 1, SIZE);
	append_op(&head, &head_len, 1, 0, &oe);
	op_write(&ow, &w, 1, data, SIZE);
	append_op(&frame, &frame_len, 2, 0, &ow);
	for (int k = 0; k < NC; k++) {
		fd[k] = raw_connect();
		raw_hello(fd[k], "many");
		send_all(fd[k], head, head_len);
		r = recv_frame(fd[k]);
		ck_assert_ptr_nonnull(r);
		ck_assert_ptr_null(r->response->error);
		frame_free(r);
	}
	rss0 = daemon_status_kb(the_daemon.pid, "VmRSS");
	/* Each connection offers its write but the last byte, 300 ms each. */
	for (int k = 0; k < NC; k++) {
		sent[k] = offer(fd[k], frame, frame_len - 1, 300);
		total += sent[k];
	}
	rss1 = daemon_status_kb(the_daemon.pid, "VmRSS");
	ck_assert_msg(total < 2u * SIZE,
		      "the daemon took %zu bytes (grew by %ld KiB) of %d "
		      "frames of 16 MiB still being read, from connections "
		      "of a service whose max_bytes_in_flight is 4M",
		      total, rss1 - rss0, NC);
	send_all_poll(fd, NC, frame, frame_len, sent);
	for (int k = 0; k < NC; k++) {
		r = recv_frame(fd[k]);
		ck_assert_ptr_nonnull(r);
		ck_assert_uint_eq(r->response->id, 2);
		ck_assert_ptr_null(r->response->error);
		frame_free(r);
		close(fd[k]);
	}
	free(head);
	free(frame);
	free(data);
	back_to_baseline();
}
END_TEST

static void setup_frame_timeout(void)
{
	setup_config("[limits]\nframe_timeout = 1\n"
		     "[service stall]\nmax_bytes_in_flight = 4M\n");
}

/*
 * A frame that stops half way does not hold its service's budget for
 * ever.  In service "stall" (max_bytes_in_flight = 4M, frame_timeout = 1)
 * two connections each send the header of a 3 MiB frame and nothing more:
 * the first holds 3 MiB of the budget from its header on, the second
 * waits for room, and so does a third connection's ping behind it.  That
 * was a wedge of the whole service for 24 bytes, as long as the two stayed
 * connected.  Now each is closed about 1.4 s after its header (and the
 * tick of 2 s), told why, and the ping is answered.
 */
START_TEST(a_frame_stopped_half_way_is_ended)
{
	uint8_t head[FRAME_HEADER_SIZE];
	int fd[2], pinger = raw_connect();
	uint64_t t0;

	raw_hello(pinger, "stall");
	header(head, 3u << 20);
	for (int k = 0; k < 2; k++) {
		fd[k] = raw_connect();
		raw_hello(fd[k], "stall");
		send_all(fd[k], head, sizeof(head));
	}
	t0 = harness_now_us();
	raw_ping(pinger, 1);
	ck_assert_uint_gt(harness_now_us() - t0, 900000);
	for (int k = 0; k < 2; k++)
		expect_refusal(fd[k], GPUCMD_EPROTO,
			       "a frame of 3145728 bytes did not arrive whole "
			       "within 1.4 s of its header (0 bytes came; "
			       "[limits] frame_timeout is 1 s");
	raw_ping(pinger, 2);
	close(pinger);
	back_to_baseline();
}
END_TEST

/*
 * Trickling does not keep a frame's place either: a client that sends the
 * 3 MiB frame 8 KiB every 50 ms (160 KiB/s; whole in 19 s) kept its place
 * in the service's budget for as long as it went on, since some of it came
 * at every tick.  Past its 1.4 s, with less than 1 MiB come in two seconds
 * and nothing waiting in the socket, it is ended.
 */
START_TEST(a_trickled_frame_is_ended)
{
	uint8_t head[FRAME_HEADER_SIZE], chunk[8192];
	int fd = raw_connect();
	uint64_t t0, took = 0;

	memset(chunk, 0, sizeof(chunk));
	raw_hello(fd, "stall");
	header(head, 3u << 20);
	send_all(fd, head, sizeof(head));
	t0 = harness_now_us();
	while (harness_now_us() - t0 < 12000000) {
		if (send(fd, chunk, sizeof(chunk), MSG_NOSIGNAL) < 0) {
			took = harness_now_us() - t0;
			break;
		}
		usleep(50000);
	}
	ck_assert_msg(took != 0, "a frame trickled at 160 KiB/s was not "
				 "ended in 12 s (frame_timeout = 1)");
	ck_assert_msg(took < 8000000, "ended only after %.1f s",
		      (double)took / 1e6);
	expect_refusal(fd, GPUCMD_EPROTO, "did not arrive whole within 1.4 s");
	back_to_baseline();
}
END_TEST

/*
 * The connections of a service waiting for its budget go in turn: in
 * service "tight" (max_bytes_in_flight = 64K) one client queues 150
 * requests of a 4 KiB write and a 20 ms kernel, which keep the budget
 * nearly full for three seconds; another connection of the service then
 * sends one request of a 32 KiB write and the same kernel.  Its answer
 * must come within a few of the first client's batches.  The connection
 * whose batch completed used to take back the room it freed before the
 * waiters looked, so a frame larger than that room waited until the other
 * client stopped sending: for ever, for a client that never stops.
 */
START_TEST(a_pipelining_connection_does_not_starve_its_service)
{
	enum { NB = 150, KIB = 1024, SIZE = 4 * KIB, BIG = 32 * KIB };
	struct raw_spin spin;
	Gpucmd__OpEmpty e = GPUCMD__OP_EMPTY__INIT;
	Gpucmd__OpWrite w = GPUCMD__OP_WRITE__INIT;
	Gpucmd__Op oe = GPUCMD__OP__INIT, ow = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[2] = { &ow, raw_spin_op(&spin, 20000) };
	uint8_t *head = NULL, *flood = NULL, *one = NULL, data[SIZE], big[BIG];
	size_t head_len = 0, flood_len = 0, one_len = 0;
	int hog = raw_connect(), victim = raw_connect();
	uint64_t t0, waited_ms;
	pid_t sender;
	Gpucmd__Frame *r;
	int status;

	memset(data, 'h', sizeof(data));
	memset(big, 'v', sizeof(big));
	raw_hello(hog, "tight");
	raw_hello(victim, "tight");
	op_empty(&oe, &e, 1, BIG);
	append_op(&head, &head_len, 1, 0, &oe);
	op_write(&ow, &w, 1, data, SIZE);
	for (int i = 0; i < NB; i++)
		append_request(&flood, &flood_len, 10 + (uint64_t)i, 0, ops, 2);
	/* The victim's one request writes 32 KiB: half the budget. */
	w.data.len = BIG;
	w.data.data = big;
	append_request(&one, &one_len, 2, 0, ops, 2);
	for (int k = 0; k < 2; k++) {
		int fd = k ? victim : hog;

		send_all(fd, head, head_len);
		r = recv_frame(fd);
		ck_assert_ptr_nonnull(r);
		ck_assert_ptr_null(r->response->error);
		frame_free(r);
	}
	/* The hog's requests go in from a child: the daemon reads them slowly. */
	sender = fork();
	ck_assert_int_ge(sender, 0);
	if (sender == 0) {
		const uint8_t *p = flood;
		size_t left = flood_len;

		while (left > 0) {
			ssize_t n = send(hog, p, left, MSG_NOSIGNAL);

			if (n <= 0)
				_exit(1);
			p += n;
			left -= (size_t)n;
		}
		_exit(0);
	}
	usleep(300000);
	t0 = harness_now_us();
	send_all(victim, one, one_len);
	r = recv_frame(victim);
	waited_ms = (harness_now_us() - t0) / 1000;
	ck_assert_ptr_nonnull(r);
	ck_assert_uint_eq(r->response->id, 2);
	ck_assert_ptr_null(r->response->error);
	frame_free(r);
	ck_assert_msg(waited_ms < 1000,
		      "a request of 32 KiB waited %llu ms for its service's "
		      "budget of 64K while another connection's %d batches "
		      "of 4 KiB and 20 ms went ahead of it",
		      (unsigned long long)waited_ms, NB);
	for (int i = 0; i < NB; i++) {
		r = recv_frame(hog);
		ck_assert_ptr_nonnull(r);
		frame_free(r);
	}
	ck_assert_int_eq(waitpid(sender, &status, 0), sender);
	ck_assert_int_eq(status, 0);
	free(head);
	free(flood);
	free(one);
	close(hog);
	close(victim);
	back_to_baseline();
}
END_TEST

/*
 * Descriptors belong to the frame whose sendmsg carried them.  A memfd
 * sent with a ping used to wait in the connection's queue and be taken by
 * the next request's region_attach, which then mapped the wrong file
 * without a word; now that request is refused (the connection closes).
 * Sent together in one sendmsg, a ping and an attach share the memfd
 * rightly: the attach takes it.
 */
START_TEST(descriptors_go_with_their_frame)
{
	int fd = raw_connect(), a = page_memfd('a'), b2 = page_memfd('b');
	Gpucmd__OpRegionAttach att = GPUCMD__OP_REGION_ATTACH__INIT;
	Gpucmd__OpPing p = GPUCMD__OP_PING__INIT;
	Gpucmd__Op o_att = GPUCMD__OP__INIT, o_ping = GPUCMD__OP__INIT;
	Gpucmd__Op *ping_ops[1] = { &o_ping }, *att_ops[1] = { &o_att };
	uint8_t *buf = NULL;
	size_t len = 0;
	Gpucmd__Frame *r;

	raw_hello(fd, "hostile");
	o_ping.op_case = GPUCMD__OP__OP_PING;
	o_ping.ping = &p;
	att.region = 5;
	att.size = 4096;
	o_att.op_case = GPUCMD__OP__OP_REGION_ATTACH;
	o_att.region_attach = &att;

	/* One sendmsg: a ping, then the attach; the memfd is the attach's. */
	append_request(&buf, &len, 1, 0, ping_ops, 1);
	append_request(&buf, &len, 2, 0, att_ops, 1);
	ck_assert_int_eq(harness_send_fds(fd, buf, len, &b2, 1), (ssize_t)len);
	free(buf);
	for (uint64_t want = 1; want <= 2; want++) {
		r = recv_frame(fd);
		ck_assert_ptr_nonnull(r);
		ck_assert_int_eq(r->msg_case, GPUCMD__FRAME__MSG_RESPONSE);
		ck_assert_uint_eq(r->response->id, want);
		ck_assert_msg(r->response->error == NULL, "request %llu: %s",
			      (unsigned long long)want,
			      r->response->error ? r->response->error->message :
						   "");
		frame_free(r);
	}

	/* The memfd rides with a ping; the attach comes in its own sendmsg. */
	send_request_fds(fd, 3, ping_ops, 1, &a, 1);
	r = recv_frame(fd);
	ck_assert_ptr_nonnull(r);
	ck_assert_uint_eq(r->response->id, 3);
	frame_free(r);
	att.region = 6;
	send_request_fds(fd, 4, att_ops, 1, &b2, 1);
	expect_refusal(fd, GPUCMD_EPROTO, "attached no regions");
	close(a);
	close(b2);
	back_to_baseline();
}
END_TEST

/*
 * Other connections whose slow large batches (TURN_FRAMES of TURN_PINGS
 * pings each) are read together and fill the loop's queue of turns
 * (server.c: on_turns), so that a large frame sent next waits for its turn
 * over several polls.  The daemon is stopped while they send, so that one
 * poll reads them all.
 */
enum { TURN_PINGS = 6000, TURN_OTHERS = 12, TURN_FRAMES = 6 };

static Gpucmd__Op **ping_ops(size_t n)
{
	static Gpucmd__Op o_ping[TURN_PINGS], *ops[TURN_PINGS];
	static Gpucmd__OpPing p = GPUCMD__OP_PING__INIT;

	ck_assert_uint_le(n, TURN_PINGS);
	for (size_t i = 0; i < n; i++) {
		gpucmd__op__init(&o_ping[i]);
		o_ping[i].op_case = GPUCMD__OP__OP_PING;
		o_ping[i].ping = &p;
		ops[i] = &o_ping[i];
	}
	return ops;
}

static void hold_the_turns(int other[TURN_OTHERS])
{
	uint8_t *many = NULL;
	size_t many_len = 0;

	for (int k = 0; k < TURN_FRAMES; k++)
		append_request(&many, &many_len, 1 + (uint64_t)k, 0,
			       ping_ops(TURN_PINGS), TURN_PINGS);
	for (int o = 0; o < TURN_OTHERS; o++) {
		other[o] = raw_connect();
		raw_hello(other[o], "hostile");
	}
	ck_assert_int_eq(kill(the_daemon.pid, SIGSTOP), 0);
	for (int o = 0; o < TURN_OTHERS; o++)
		send_all(other[o], many, many_len);
	ck_assert_int_eq(kill(the_daemon.pid, SIGCONT), 0);
	usleep(2000);
	free(many);
}

/* Their answers, every one, then they leave. */
static void release_the_turns(const int other[TURN_OTHERS])
{
	for (int o = 0; o < TURN_OTHERS; o++) {
		for (int k = 0; k < TURN_FRAMES; k++) {
			Gpucmd__Frame *r = recv_frame(other[o]);

			ck_assert_ptr_nonnull(r);
			ck_assert_int_eq(r->msg_case,
					 GPUCMD__FRAME__MSG_RESPONSE);
			frame_free(r);
		}
		close(other[o]);
	}
}

/*
 * While a large frame waits for its decoding turn (session.c: turn_wait),
 * the loop goes on reading the frames behind it, and the descriptors that
 * come with them wait in the connection's queue (s->fds) until those
 * frames are decoded.  That queue is capped (REGION_MAX_PER_CONNECTION:
 * past it the client is refused for sending "descriptors no region_attach
 * asked for").  A client that pipelines a large batch, then requests whose
 * own region_attach ops take the memfds of their own sendmsg, did nothing
 * wrong and must be served, as it was when each frame was decoded as it
 * was read.
 */
START_TEST(descriptors_behind_a_frame_waiting_for_its_turn)
{
	enum { FRAMES = 12, PER = 8 };
	int fd = raw_connect(), m = page_memfd('m'), other[TURN_OTHERS];
	int fds[PER];
	Gpucmd__OpRegionAttach att[PER];
	Gpucmd__OpRegionRelease rel[PER];
	Gpucmd__Op o_att[PER], o_rel[PER], *ops[2 * PER];
	uint8_t *big = NULL;
	size_t big_len = 0;

	raw_hello(fd, "hostile");
	for (int i = 0; i < PER; i++)
		fds[i] = m;
	append_request(&big, &big_len, 1, 0, ping_ops(TURN_PINGS), TURN_PINGS);
	ck_assert_uint_gt(big_len, FRAME_HEADER_SIZE + 4096);
	hold_the_turns(other);
	/* A batch over 4 KiB: it waits for its turn behind theirs. */
	send_all(fd, big, big_len);
	/* Then FRAMES requests that each attach and release PER regions. */
	for (int k = 0; k < FRAMES; k++) {
		for (int i = 0; i < PER; i++) {
			gpucmd__op_region_attach__init(&att[i]);
			att[i].region = 100 + (uint64_t)(k * PER + i);
			att[i].size = 4096;
			gpucmd__op__init(&o_att[i]);
			o_att[i].op_case = GPUCMD__OP__OP_REGION_ATTACH;
			o_att[i].region_attach = &att[i];
			gpucmd__op_region_release__init(&rel[i]);
			rel[i].region = att[i].region;
			gpucmd__op__init(&o_rel[i]);
			o_rel[i].op_case = GPUCMD__OP__OP_REGION_RELEASE;
			o_rel[i].region_release = &rel[i];
			ops[i] = &o_att[i];
			ops[PER + i] = &o_rel[i];
		}
		send_request_fds(fd, 2 + (uint64_t)k, ops, 2 * PER, fds, PER);
	}
	for (int k = 0; k < 1 + FRAMES; k++) {
		Gpucmd__Frame *r = recv_frame(fd);

		ck_assert_msg(r != NULL,
			      "the daemon closed the connection "
			      "after %d responses",
			      k);
		ck_assert_msg(r->msg_case == GPUCMD__FRAME__MSG_RESPONSE,
			      "refused after %d responses: %s", k,
			      r->msg_case == GPUCMD__FRAME__MSG_ERROR ?
				      r->error->message :
				      "(not an Error)");
		ck_assert_msg(r->response->error == NULL, "request %llu: %s",
			      (unsigned long long)r->response->id,
			      r->response->error ? r->response->error->message :
						   "");
		frame_free(r);
	}
	release_the_turns(other);
	free(big);
	close(m);
	close(fd);
	back_to_baseline();
}
END_TEST

/*
 * A client that sends a batch and closes at once (fire and forget) has the
 * batch run, also when it waited for its turn behind other connections'
 * large frames and the loop read the end of the stream meanwhile: here the
 * batch copies 4 KiB into the client's memfd region, which outlives the
 * connection.
 */
START_TEST(end_of_stream_behind_a_frame_waiting_for_its_turn)
{
	int z = page_memfd('z'), fd = connect_with_region("hostile", z);
	int other[TURN_OTHERS];
	static uint8_t data[8192];
	uint8_t *last = NULL;
	size_t last_len = 0;

	/* The last batch: over 4 KiB, so it waits for its turn. */
	append_copy_to_region(&last, &last_len, 2, data, sizeof(data), 4096);
	ck_assert_uint_gt(last_len, FRAME_HEADER_SIZE + 4096);
	hold_the_turns(other);
	send_all(fd, last, last_len);
	close(fd);
	release_the_turns(other);
	expect_region_copied(z, 4096, "the batch sent before the close");
	free(last);
	close(z);
	back_to_baseline();
}
END_TEST

/*
 * Send the one-op request op as id on stream: it must fail with code, the
 * message naming what (NULL: succeed).
 */
static void raw_op(int fd, uint64_t id, uint32_t stream, Gpucmd__Op *op,
		   int code, const char *what)
{
	Gpucmd__Op *ops[1] = { op };
	Gpucmd__Frame *r = raw_run(fd, id, stream, ops, 1);
	const Gpucmd__Error *e = r->response->error;

	if (what == NULL) {
		ck_assert_msg(e == NULL, "request %llu: %s",
			      (unsigned long long)id, e ? e->message : "");
	} else {
		ck_assert_msg(e != NULL, "request %llu was not refused",
			      (unsigned long long)id);
		ck_assert_msg(e->code == code && strstr(e->message, what),
			      "request %llu: got %d '%s', expected %d naming "
			      "'%s'",
			      (unsigned long long)id, e->code, e->message, code,
			      what);
		ck_assert_uint_eq(r->response->failed_index, 0);
		ck_assert_uint_eq(r->response->n_results, 0);
	}
	frame_free(r);
}

/* A raw connection of service hostile whose handle 1 has 4096 bytes. */
static int raw_with_a_buffer(void)
{
	Gpucmd__Op op = GPUCMD__OP__INIT;
	Gpucmd__OpEmpty empty = GPUCMD__OP_EMPTY__INIT;
	int fd = raw_connect();

	raw_hello(fd, "hostile");
	op.op_case = GPUCMD__OP__OP_EMPTY;
	op.empty = &empty;
	empty.handle = 1;
	empty.size = 4096;
	raw_op(fd, 1, 0, &op, 0, NULL);
	return fd;
}

/*
 * Ops that libgpucmd never builds, sent raw: each is refused with
 * GPUCMD_EINVAL and a sentence naming what is wrong, and the connection
 * goes on.  Layouts without dimensions or with a stride missing, an op
 * with both inline bytes and a region range, a fourth grid dimension, an
 * allocation mode past the enum, more pools than a layout takes, and a
 * preset nobody knows.  The presets the daemon does know install by name.
 */
START_TEST(malformed_ops_are_refused_one_by_one)
{
	Gpucmd__Op op = GPUCMD__OP__INIT;
	Gpucmd__OpEmpty empty = GPUCMD__OP_EMPTY__INIT;
	Gpucmd__OpWrite w = GPUCMD__OP_WRITE__INIT;
	Gpucmd__CopyLayout layout = GPUCMD__COPY_LAYOUT__INIT;
	Gpucmd__RegionRef ref = GPUCMD__REGION_REF__INIT;
	Gpucmd__OpKernel k = GPUCMD__OP_KERNEL__INIT;
	Gpucmd__KernelArg arg = GPUCMD__KERNEL_ARG__INIT, *argp = &arg;
	Gpucmd__OpAllocationMode mode = GPUCMD__OP_ALLOCATION_MODE__INIT;
	Gpucmd__OpInstallPools install = GPUCMD__OP_INSTALL_POOLS__INIT;
	Gpucmd__MemoryLayout ml = GPUCMD__MEMORY_LAYOUT__INIT;
	Gpucmd__PoolOptions pool = GPUCMD__POOL_OPTIONS__INIT;
	Gpucmd__PoolOptions *pools[33];
	uint64_t shape[2] = { 2, 2 }, strides[1] = { 1 };
	uint32_t grid[4] = { 1, 1, 1, 1 }, block[1] = { 1 };
	uint8_t bytes[4] = { 1, 2, 3, 4 };
	int fd = raw_with_a_buffer();

	op.op_case = GPUCMD__OP__OP_WRITE;
	op.write = &w;
	w.handle = 1;
	w.data.data = bytes;
	w.data.len = sizeof(bytes);
	w.layout = &layout;
	raw_op(fd, 2, 0, &op, GPUCMD_EINVAL, "1 to 8 dimensions");
	layout.n_shape = 2;
	layout.shape = shape;
	layout.n_strides = 1;
	layout.strides = strides;
	layout.elem_size = 1;
	raw_op(fd, 3, 0, &op, GPUCMD_EINVAL, "(got 2 shape, 1 strides)");
	w.layout = NULL;
	w.region = &ref;
	ref.region = 1;
	ref.length = sizeof(bytes);
	raw_op(fd, 4, 0, &op, GPUCMD_EINVAL,
	       "either inline data or a region range, not both");

	op.op_case = GPUCMD__OP__OP_KERNEL;
	op.kernel = &k;
	k.name = "spin";
	k.n_args = 1;
	k.args = &argp;
	arg.value_case = GPUCMD__KERNEL_ARG__VALUE_U32;
	k.n_grid = 4;
	k.grid = grid;
	k.n_block = 1;
	k.block = block;
	raw_op(fd, 5, 0, &op, GPUCMD_EINVAL,
	       "grid and block take 1 to 3 dimensions (got 4 and 1)");

	op.op_case = GPUCMD__OP__OP_ALLOCATION_MODE;
	op.allocation_mode = &mode;
	mode.mode = 7;
	raw_op(fd, 6, 0, &op, GPUCMD_EINVAL,
	       "allocation mode 7 is neither auto (0) nor persistent (1)");

	op.op_case = GPUCMD__OP__OP_INSTALL_POOLS;
	op.install_pools = &install;
	install.layout = &ml;
	ml.preset = "custom";
	pool.kind = "direct";
	for (size_t i = 0; i < 33; i++)
		pools[i] = &pool;
	ml.n_pools = 33;
	ml.pools = pools;
	raw_op(fd, 7, 1, &op, GPUCMD_EINVAL, "at most 32 pools (got 33)");
	ml.n_pools = 0;
	ml.preset = "lavish";
	raw_op(fd, 8, 1, &op, GPUCMD_EINVAL,
	       "layout preset 'lavish' is not subslices, exclusive or custom");
	/* Known presets, by name, on fresh streams; memory comes after. */
	ml.preset = "exclusive";
	raw_op(fd, 9, 1, &op, 0, NULL);
	ml.preset = "subslices";
	raw_op(fd, 10, 2, &op, 0, NULL);
	op.op_case = GPUCMD__OP__OP_EMPTY;
	op.empty = &empty;
	empty.handle = 2;
	empty.size = 1000;
	raw_op(fd, 11, 1, &op, 0, NULL);
	empty.handle = 3;
	raw_op(fd, 12, 2, &op, 0, NULL);
	raw_ping(fd, 13);
	close(fd);
	back_to_baseline();
}
END_TEST

/*
 * Copy layouts the checks refuse before any byte moves, sent raw: an
 * element size of 0, higher dimensions that are not packed, elements
 * whose bytes pass 2^64, and a write whose layout holds more than the op
 * brings.  Each names what is wrong; a good layout then copies.
 */
START_TEST(layouts_the_copy_cannot_take)
{
	Gpucmd__Op op = GPUCMD__OP__INIT;
	Gpucmd__OpWrite w = GPUCMD__OP_WRITE__INIT;
	Gpucmd__CopyLayout layout = GPUCMD__COPY_LAYOUT__INIT;
	uint64_t shape[3] = { 2, 2, 2 }, strides[3] = { 5, 2, 1 };
	uint8_t bytes[16] = { 0 };
	int fd = raw_with_a_buffer();

	op.op_case = GPUCMD__OP__OP_WRITE;
	op.write = &w;
	w.handle = 1;
	w.data.data = bytes;
	w.data.len = 8;
	w.layout = &layout;
	layout.shape = shape;
	layout.strides = strides;
	layout.n_shape = layout.n_strides = 1;
	layout.elem_size = 0;
	raw_op(fd, 2, 0, &op, GPUCMD_EINVAL,
	       "non-zero element size (got rank 1, element size 0)");
	/* The outer stride is not inner stride x inner shape (4). */
	layout.n_shape = layout.n_strides = 3;
	layout.elem_size = 1;
	raw_op(fd, 3, 0, &op, GPUCMD_ESTRIDES, "higher dimensions packed");
	/* 2^62 elements of 8 bytes. */
	shape[0] = UINT64_C(1) << 62;
	strides[0] = 1;
	layout.n_shape = layout.n_strides = 1;
	layout.elem_size = 8;
	raw_op(fd, 4, 0, &op, GPUCMD_EINVAL, "more than 2^64 bytes");
	/* 4 elements of 4 bytes from 8 bytes of data. */
	shape[0] = 4;
	layout.elem_size = 4;
	raw_op(fd, 5, 0, &op, GPUCMD_EINVAL,
	       "write of 8 bytes does not match the 16 bytes its layout "
	       "describes");
	w.data.len = 16;
	raw_op(fd, 6, 0, &op, 0, NULL);
	raw_ping(fd, 7);
	close(fd);
	back_to_baseline();
}
END_TEST

/*
 * A client that shuts down its writing side after its last request
 * (shutdown(SHUT_WR), as a client that has no more to send may) still
 * reads: every response comes, whole, and then the end of the stream.  The
 * daemon used to take the end of what it read for a client gone, close at
 * once and drop the responses of the batches still running.
 */
START_TEST(a_client_that_shuts_down_its_writing_side_gets_its_replies)
{
	enum { N = 8, LEN = 4096 };
	struct raw_spin spin;
	Gpucmd__OpEmpty e = GPUCMD__OP_EMPTY__INIT;
	Gpucmd__OpWrite w = GPUCMD__OP_WRITE__INIT;
	Gpucmd__OpRead rd = GPUCMD__OP_READ__INIT;
	Gpucmd__Op oe = GPUCMD__OP__INIT, ow = GPUCMD__OP__INIT;
	Gpucmd__Op orr = GPUCMD__OP__INIT;
	static uint8_t data[LEN];
	bool seen[4 + N] = { false };
	uint8_t *buf = NULL;
	size_t len = 0;
	int fd = raw_connect();

	raw_hello(fd, "halfclose");
	memset(data, 'h', sizeof(data));
	op_empty(&oe, &e, 1, LEN);
	append_op(&buf, &len, 1, 0, &oe);
	/* The requests behind it still run when the end of the stream comes. */
	append_op(&buf, &len, 2, 0, raw_spin_op(&spin, 300000));
	op_write(&ow, &w, 1, data, LEN);
	append_op(&buf, &len, 3, 0, &ow);
	rd.handle = 1;
	rd.length = LEN;
	orr.op_case = GPUCMD__OP__OP_READ;
	orr.read = &rd;
	for (uint64_t id = 4; id < 4 + N; id++)
		append_op(&buf, &len, id, 0, &orr);
	send_all(fd, buf, len);
	ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
	for (int i = 1; i < 4 + N; i++) {
		Gpucmd__Frame *r = recv_frame(fd);
		uint64_t id;

		ck_assert_msg(r != NULL,
			      "%d of %d responses came after the "
			      "client shut down its writing side",
			      i - 1, 3 + N);
		ck_assert_int_eq(r->msg_case, GPUCMD__FRAME__MSG_RESPONSE);
		id = r->response->id;
		ck_assert_msg(id >= 1 && id < 4 + N && !seen[id],
			      "response %llu", (unsigned long long)id);
		seen[id] = true;
		ck_assert_msg(r->response->error == NULL, "request %llu: %s",
			      (unsigned long long)id,
			      r->response->error->message);
		if (id >= 4) {
			ck_assert_uint_eq(r->response->n_results, 1);
			ck_assert_uint_eq(r->response->results[0]->data.len,
					  LEN);
			ck_assert_int_eq(memcmp(r->response->results[0]
							->data.data,
						data, LEN),
					 0);
		}
		frame_free(r);
	}
	expect_eof(fd);
	close(fd);
	free(buf);
	back_to_baseline();
}
END_TEST

/* ---- what the system refuses ------------------------------------------------ */

/* The daemon's RLIMIT_NOFILE in the "descriptors" tcase. */
#define FEW_DESCRIPTORS 64

static void setup_few_descriptors(void)
{
	harness_nofile.rlim_cur = FEW_DESCRIPTORS;
	harness_nofile.rlim_max = FEW_DESCRIPTORS;
	harness_setup();
	take_baseline();
}

/*
 * Say Hello on fd: true when the daemon welcomes it, false when it refuses
 * it for want of descriptors, which it must say, with the numbers.
 */
static bool welcomed_or_out_of_descriptors(int fd)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT, *w;
	Gpucmd__Hello hello = GPUCMD__HELLO__INIT;
	uint8_t *buf;
	size_t len;
	ssize_t n;

	hello.protocol_version = GPUCMD_PROTOCOL_VERSION;
	hello.service = "many";
	hello.client_name = "test_hostile2";
	f.msg_case = GPUCMD__FRAME__MSG_HELLO;
	f.hello = &hello;
	ck_assert_int_eq(frame_encode(&f, &buf, &len), 0);
	/* A refused connection may be closed before the Hello arrives. */
	n = send(fd, buf, len, MSG_NOSIGNAL);
	(void)n;
	free(buf);
	w = recv_frame(fd);
	ck_assert_msg(w != NULL, "the daemon closed a connection without a "
				 "word (no Welcome, no Error)");
	if (w->msg_case == GPUCMD__FRAME__MSG_WELCOME) {
		frame_free(w);
		return true;
	}
	ck_assert_int_eq(w->msg_case, GPUCMD__FRAME__MSG_ERROR);
	ck_assert_msg(w->error->code == GPUCMD_ELIMIT, "code %s: %s",
		      gpucmd_errname(w->error->code), w->error->message);
	ck_assert_msg(strstr(w->error->message, "out of file descriptors") &&
			      strstr(w->error->message,
				     "(RLIMIT_NOFILE) is ") &&
			      strstr(w->error->message, "LimitNOFILE="),
		      "message '%s'", w->error->message);
	frame_free(w);
	return false;
}

/*
 * A daemon at its RLIMIT_NOFILE refuses a new connection with an Error
 * that names the numbers and the setting, before the accept itself could
 * fail: libuv answers an accept that meets EMFILE by closing the client's
 * socket unanswered, and used to, leaving the client "disconnected" and
 * the log silent.  The operator gets a warning; the connections already
 * open carry on, and places come back as they close.
 */
/*
 * Connections into fds until the daemon refuses one for descriptors: how
 * many it took.
 */
static int connect_until_out_of_descriptors(int *fds)
{
	int n;

	for (n = 0; n < FEW_DESCRIPTORS; n++) {
		fds[n] = raw_connect();
		if (!welcomed_or_out_of_descriptors(fds[n]))
			break;
	}
	ck_assert_msg(n < FEW_DESCRIPTORS,
		      "%d connections, none refused "
		      "under RLIMIT_NOFILE %d",
		      n, FEW_DESCRIPTORS);
	ck_assert_int_gt(n, 0);
	close(fds[n]);
	return n;
}

START_TEST(out_of_descriptors_is_said_and_passes)
{
	int fds[FEW_DESCRIPTORS];
	int n = connect_until_out_of_descriptors(fds);

	harness_wait_log("descriptors open and its RLIMIT_NOFILE", 0);
	still_served(good);
	for (int i = 0; i < n; i++)
		close(fds[i]);
	/* A place comes back once the daemon has seen them close. */
	place_comes_back("the hang-ups");
	back_to_baseline();
}
END_TEST

/* RLIMIT_NOFILE 64 for the daemon, its hard limit left as it is. */
static void setup_soft_descriptors(void)
{
	struct rlimit rl;

	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 512)
		ck_abort_msg("this test needs a hard RLIMIT_NOFILE of 512 at "
			     "least, not %llu",
			     (unsigned long long)rl.rlim_max);
	harness_nofile.rlim_cur = FEW_DESCRIPTORS;
	harness_nofile.rlim_max = rl.rlim_max;
	harness_setup();
	take_baseline();
}

/*
 * A daemon started with a soft RLIMIT_NOFILE below what max_connections
 * needs (a shell's 1024 under a larger max_connections; here 64 under the
 * default 256) raises it up to its hard limit, and says so: it used to
 * refuse connections far below max_connections.
 */
START_TEST(a_low_soft_descriptor_limit_is_raised)
{
	enum { N = 3 * FEW_DESCRIPTORS / 2 };
	int fds[N];

	/* Valgrind keeps RLIMIT_NOFILE to itself: its client cannot raise it. */
	if (getenv("GPUCMD_TEST_VALGRIND") != NULL) {
		printf("a_low_soft_descriptor_limit_is_raised: skipped: "
		       "valgrind refuses the daemon's setrlimit\n");
		return;
	}
	ck_assert_int_eq(harness_log_count("RLIMIT_NOFILE raised from "), 1);
	for (int i = 0; i < N; i++) {
		fds[i] = raw_connect();
		ck_assert_msg(welcomed_or_out_of_descriptors(fds[i]),
			      "connection %d of %d refused", i + 1, N);
	}
	for (int i = 0; i < N; i++)
		close(fds[i]);
	back_to_baseline();
}
END_TEST

/*
 * Memfds a connection sends when the daemon has no room for them: the
 * kernel installs what fits and drops the rest, and taking them fails.
 * That connection is refused for want of descriptors, with the numbers;
 * it used to be told it broke the protocol, with the errno of a later
 * system call ("cannot take a descriptor the client sent: Operation not
 * permitted").  The others carry on.
 */
START_TEST(memfds_past_the_descriptor_limit_are_said)
{
	int fds[FEW_DESCRIPTORS];
	int n = connect_until_out_of_descriptors(fds);
	int z = page_memfd('z');
	Gpucmd__Frame *f;
	uint8_t byte = 0;

	/* More than the reserve left: the first byte of a frame header. */
	ck_assert_int_eq(send_fds(fds[0], z, 40, &byte), 1);
	f = recv_frame(fds[0]);
	ck_assert_msg(f != NULL, "no Error frame before the close");
	ck_assert_int_eq(f->msg_case, GPUCMD__FRAME__MSG_ERROR);
	ck_assert_msg(f->error->code == GPUCMD_ELIMIT &&
			      strstr(f->error->message,
				     "out of file descriptors (at least ") &&
			      strstr(f->error->message, "RLIMIT_NOFILE is ") &&
			      strstr(f->error->message, "memfds this "
							"connection sent were "
							"lost"),
		      "code %s: %s", gpucmd_errname(f->error->code),
		      f->error->message);
	frame_free(f);
	expect_eof(fds[0]);
	close(fds[0]);
	close(z);
	still_served(good);
	for (int i = 1; i < n; i++)
		close(fds[i]);
	back_to_baseline();
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("hostile2");
	TCase *d = tcase_create("default");
	TCase *l = tcase_create("limits");
	TCase *p = tcase_create("pending");
	TCase *pin = tcase_create("pinned");

	tcase_add_checked_fixture(d, setup_default, teardown);
	tcase_set_timeout(d, 120);
	tcase_add_test(d, truncated_body_then_hangup);
	tcase_add_test(d, zero_length_body);
	tcase_add_test(d, second_hello);
	tcase_add_test(d, client_sends_welcome_or_response);
	tcase_add_test(d, hello_with_bad_service_names);
	tcase_add_test(d, unknown_op_field);
	tcase_add_test(d, sizes_near_2_64);
	tcase_add_test(d, offsets_near_2_64);
	tcase_add_test(d, layouts_that_overflow);
	tcase_add_test(d, malformed_ops_are_refused_one_by_one);
	tcase_add_test(d, layouts_the_copy_cannot_take);
	tcase_add_test(d, grids_of_zero_and_over_the_limits);
	tcase_add_test(d, unknown_kernels_and_wrong_arguments);
	tcase_add_test(d, handles_never_allocated_and_released_twice);
	tcase_add_test(d, another_connections_handles);
	tcase_add_test(d, slowloris);
	tcase_add_test(d, flood_of_connections);
	tcase_add_test(d, descriptors_nobody_asked_for);
	tcase_add_test(d, a_socket_sent_as_a_region_is_refused);
	tcase_add_test(d, report_ops_are_bounded_per_batch);
	tcase_add_test(d, descriptors_go_with_their_frame);
	tcase_add_test(d, descriptors_behind_a_frame_waiting_for_its_turn);
	tcase_add_test(d, end_of_stream_behind_a_frame_waiting_for_its_turn);
	tcase_add_test(
		d, a_client_that_shuts_down_its_writing_side_gets_its_replies);
	tcase_add_test(d, region_ids_taken_or_zero_are_refused);
	tcase_add_test(d, kill_9_client_holding_memory);
	tcase_add_test(d, kill_storm);
	tcase_add_test(d, hangup_with_batches_in_flight);
	tcase_add_test(d, a_client_that_stops_reading_but_sends_is_closed);
	tcase_add_test(d, kernel_fault_stays_on_its_stream);
	tcase_add_test(d, fresh_buffer_written_from_another_stream);
	tcase_add_test(d, small_host_memory);
	tcase_add_test(d, idle_reserve_of_another_service_is_reclaimed);
	tcase_add_test(d, fail_every_allocation_site);
	tcase_add_test(d, reads_beyond_one_frame);
	tcase_add_test(d, unknown_fields_are_refused_undecoded);
	tcase_add_test(d, huge_op_counts_are_refused_undecoded);
	suite_add_tcase(s, d);

	tcase_add_checked_fixture(l, setup_limits, teardown);
	tcase_set_timeout(l, 120);
	tcase_add_test(l, length_exactly_at_the_limit);
	tcase_add_test(l, batch_over_max_ops);
	tcase_add_test(l, refused_batch_takes_its_descriptors_along);
	tcase_add_test(l, a_billion_ops_claimed);
	tcase_add_test(l, huge_stream_numbers_and_too_many_streams);
	tcase_add_test(l, large_reply_to_a_prompt_reader);
	tcase_add_test(l, client_never_reads_replies);
	tcase_add_test(l, connection_over_the_limit);
	suite_add_tcase(s, l);

	tcase_add_checked_fixture(p, setup_pending, teardown);
	tcase_set_timeout(p, 120);
	tcase_add_test(p, client_never_reads_large_replies);
	suite_add_tcase(s, p);

	{
		TCase *f = tcase_create("inflight");

		tcase_add_checked_fixture(f, setup_one_in_flight, teardown);
		tcase_set_timeout(f, 60);
		tcase_add_test(f, pipelined_requests_keep_to_max_in_flight);
		tcase_add_test(f, batches_sent_before_a_close_all_run);
		suite_add_tcase(s, f);
	}
	{
		TCase *bb = tcase_create("budget");

		tcase_add_checked_fixture(bb, setup_small_byte_budget,
					  teardown);
		tcase_set_timeout(bb, 60);
		tcase_add_test(bb, bytes_behind_a_kernel_wait_in_the_socket);
		suite_add_tcase(s, bb);
	}
	{
		TCase *bd = tcase_create("budget_decoded");

		tcase_add_checked_fixture(bd, setup_byte_budget_16m, teardown);
		tcase_set_timeout(bd, 60);
		tcase_add_test(bd, decoded_size_counts_against_the_byte_budget);
		suite_add_tcase(s, bd);
	}
	{
		TCase *bs = tcase_create("budget_service");

		tcase_add_checked_fixture(bs, setup_service_budget_4m,
					  teardown);
		tcase_set_timeout(bs, 60);
		tcase_add_test(bs,
			       connections_of_a_service_share_its_byte_budget);
		tcase_add_test(
			bs, frames_being_read_count_against_the_service_budget);
		tcase_add_test(
			bs,
			a_pipelining_connection_does_not_starve_its_service);
		tcase_add_test(bs,
			       unread_replies_count_against_the_service_budget);
		tcase_add_test(
			bs,
			a_prompt_reader_is_not_closed_for_anothers_unread_replies);
		tcase_add_test(bs, a_closed_readers_bytes_do_not_close_another);
		tcase_add_test(bs, a_client_blocked_sending_reads_its_replies);
		suite_add_tcase(s, bs);
	}
	{
		TCase *ft = tcase_create("frame_timeout");

		tcase_add_checked_fixture(ft, setup_frame_timeout, teardown);
		tcase_set_timeout(ft, 60);
		tcase_add_test(ft, a_frame_stopped_half_way_is_ended);
		tcase_add_test(ft, a_trickled_frame_is_ended);
		suite_add_tcase(s, ft);
	}

	{
		TCase *fd = tcase_create("descriptors");

		tcase_add_checked_fixture(fd, setup_few_descriptors, teardown);
		tcase_set_timeout(fd, 60);
		tcase_add_test(fd, out_of_descriptors_is_said_and_passes);
		tcase_add_test(fd, memfds_past_the_descriptor_limit_are_said);
		suite_add_tcase(s, fd);
	}
	{
		TCase *sd = tcase_create("soft_descriptors");

		tcase_add_checked_fixture(sd, setup_soft_descriptors, teardown);
		tcase_set_timeout(sd, 60);
		tcase_add_test(sd, a_low_soft_descriptor_limit_is_raised);
		suite_add_tcase(s, sd);
	}

	tcase_add_checked_fixture(pin, setup_pinned, teardown);
	tcase_set_timeout(pin, 120);
	tcase_add_test(pin, slow_reader_does_not_take_the_pinned_pool);
	suite_add_tcase(s, pin);
	return s;
}

int main(void)
{
	return harness_main(make_suite());
}
