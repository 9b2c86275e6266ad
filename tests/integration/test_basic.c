/*
 * test_basic.c - one client against a real gpucmdd: allocate, write,
 * launch every built-in, read back, release; the errors a client can hit;
 * pipelining.
 */
#include <dirent.h>
#include <math.h>

#include "harness.h"

static const uint32_t G1[3] = { 4, 1, 1 };
static const uint32_t B64[3] = { 64, 1, 1 };

START_TEST(fill_and_read_back)
{
	struct gpucmd_conn *c = connect_as("basic");
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	struct gpucmd_arg args[3] = { buf_arg(1), u32_arg(0xdeadbeef),
				      u32_arg(100) };
	const void *data;
	size_t len;
	const uint32_t *w;

	ck_assert_str_eq(gpucmd_info(c)->service, "basic");
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 1, 512), 0);
	ck_assert_int_eq(gpucmd_batch_kernel(b, "fill_u32", G1, B64, args, 3),
			 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, 512), 0);
	r = run_ok(b);
	ck_assert_uint_eq(gpucmd_response_count(r), 3);
	ck_assert_int_eq(gpucmd_response_failed_index(r), -1);
	ck_assert_int_eq(gpucmd_response_data(r, 2, &data, &len), 0);
	ck_assert_uint_eq(len, 512);
	w = data;
	for (int i = 0; i < 100; i++)
		ck_assert_uint_eq(w[i], 0xdeadbeef);
	/* Fresh memory is zeroed: past the fill it must read 0. */
	for (int i = 100; i < 128; i++)
		ck_assert_uint_eq(w[i], 0);
	/* Reading a result that is not data is refused. */
	ck_assert_int_eq(gpucmd_response_data(r, 0, &data, &len),
			 GPUCMD_EINVAL);
	gpucmd_response_free(r);
	gpucmd_close(c);
}
END_TEST

START_TEST(write_offset_and_create)
{
	struct gpucmd_conn *c = connect_as("basic");
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	const uint8_t hello[] = "hello, device";
	const uint8_t *d;
	const void *data;
	size_t len;

	ck_assert_int_eq(gpucmd_batch_new(c, 3, &b), 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(b, 7, hello,
						       sizeof(hello)),
			 0);
	ck_assert_int_eq(gpucmd_batch_write(b, 7, 7, "DEVICE", 6), 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 7, 0, sizeof(hello)), 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 7, 7, 3), 0);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_data(r, 2, &data, &len), 0);
	ck_assert_uint_eq(len, sizeof(hello));
	ck_assert_str_eq((const char *)data, "hello, DEVICE");
	ck_assert_int_eq(gpucmd_response_data(r, 3, &data, &len), 0);
	d = data;
	ck_assert_uint_eq(len, 3);
	ck_assert_int_eq(memcmp(d, "DEV", 3), 0);
	gpucmd_response_free(r);
	gpucmd_close(c);
}
END_TEST

/*
 * Inline data large enough to travel by reference (the client's pieces)
 * and to be decoded in place (the daemon's and the client's large frames),
 * as the last op of a batch and in the middle of one: every byte lands and
 * comes back.
 */
START_TEST(large_inline_data_round_trips)
{
	enum { BIG = 1 << 20, MID = 300 << 10 };
	struct gpucmd_conn *c = connect_as("basic");
	uint8_t *src = malloc(BIG);
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	const void *data;
	size_t len;

	ck_assert_ptr_nonnull(src);
	for (size_t i = 0; i < BIG; i++)
		src[i] = (uint8_t)(i * 131 + (i >> 12));
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 1, BIG), 0);
	ck_assert_int_eq(gpucmd_batch_write(b, 1, 0, src, BIG), 0);
	gpucmd_response_free(run_ok(b));
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(b, 2, src + 7, MID), 0);
	ck_assert_int_eq(gpucmd_batch_ping(b), 0);
	ck_assert_int_eq(gpucmd_batch_write(b, 1, 64, src + 5, MID), 0);
	gpucmd_response_free(run_ok(b));
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, BIG), 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 2, 0, MID), 0);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_data(r, 0, &data, &len), 0);
	ck_assert_uint_eq(len, BIG);
	ck_assert_int_eq(memcmp(data, src, 64), 0);
	ck_assert_int_eq(memcmp((const uint8_t *)data + 64, src + 5, MID), 0);
	ck_assert_int_eq(memcmp((const uint8_t *)data + 64 + MID,
				src + 64 + MID, BIG - 64 - MID),
			 0);
	ck_assert_int_eq(gpucmd_response_data(r, 1, &data, &len), 0);
	ck_assert_uint_eq(len, MID);
	ck_assert_int_eq(memcmp(data, src + 7, MID), 0);
	gpucmd_response_free(r);
	free(src);
	gpucmd_close(c);
}
END_TEST

/* Wait (up to 5 s) until the pinned pool is unused again; its last value. */
static uint64_t pinned_settles(struct gpucmd_conn *c)
{
	uint64_t v = report_pinned_in_use(c);

	for (int i = 0; v != 0 && i < 500; i++) {
		usleep(10000);
		v = report_pinned_in_use(c);
	}
	return v;
}

/* A handle of len bytes on c, filled with a pattern seeded by seed. */
static uint8_t *fill_handle(struct gpucmd_conn *c, uint64_t h, size_t len,
			    unsigned seed)
{
	uint8_t *src = malloc(len);
	struct gpucmd_batch *b;

	ck_assert_ptr_nonnull(src);
	for (size_t i = 0; i < len; i++)
		src[i] = (uint8_t)(i * 131 + (i >> 12) + seed);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(b, h, src, len), 0);
	gpucmd_response_free(run_ok(b));
	return src;
}

/*
 * Large read data is written to the client from the daemon's staging,
 * without a copy into the frame (executor.c's reply_pieces): a client
 * that reads its reply late still gets every byte, the staging is held
 * meanwhile and given back once the reply is written, and a client that
 * dies with such a reply unread leaves nothing held.
 */
START_TEST(large_read_reply_from_staging)
{
	enum { BIG = 16 << 20 };
	struct gpucmd_conn *c = connect_as("basic");
	struct gpucmd_conn *watch = connect_as("watch");
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	const void *data;
	uint8_t *src = fill_handle(c, 1, BIG, 0);
	uint64_t id, held;
	size_t len;
	pid_t pid;
	int st;

	ck_assert_uint_eq(pinned_settles(watch), 0);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, BIG), 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 1, 4096, 8192), 0);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	/* The reply cannot fit the socket: its staging waits with it. */
	usleep(200000);
	held = report_pinned_in_use(watch);
	ck_assert_msg(held >= (uint64_t)BIG,
		      "pinned in use %llu while a %d-byte "
		      "reply waits",
		      (unsigned long long)held, BIG);
	ck_assert_int_eq(gpucmd_wait(c, id, &r), 0);
	ck_assert_int_eq(gpucmd_response_error(r), 0);
	ck_assert_int_eq(gpucmd_response_data(r, 0, &data, &len), 0);
	ck_assert_uint_eq(len, BIG);
	ck_assert_int_eq(memcmp(data, src, BIG), 0);
	ck_assert_int_eq(gpucmd_response_data(r, 1, &data, &len), 0);
	ck_assert_uint_eq(len, 8192);
	ck_assert_int_eq(memcmp(data, src + 4096, 8192), 0);
	gpucmd_response_free(r);
	ck_assert_uint_eq(pinned_settles(watch), 0);

	/* A client that leaves with its reply unread. */
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct gpucmd_conn *k = NULL;
		struct gpucmd_batch *kb;

		if (gpucmd_connect(the_daemon.sock, "quitter", &k, NULL, 0) !=
			    0 ||
		    gpucmd_batch_new(k, 0, &kb) != 0 ||
		    gpucmd_batch_empty(kb, 1, BIG) != 0 ||
		    gpucmd_batch_read(kb, 1, 0, BIG) != 0 ||
		    gpucmd_submit(kb, &id) != 0)
			_exit(1);
		usleep(200000);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d", st);
	ck_assert_uint_eq(pinned_settles(watch), 0);
	ck_assert_uint_eq(report_totals(watch).bytes_in_use, BIG);
	free(src);
	gpucmd_close(watch);
	gpucmd_close(c);
}
END_TEST

/*
 * gpucmd_batch_write_borrowed: the bytes go from the caller's buffer at
 * submit, large and small, beside copied writes; once gpucmd_submit has
 * returned the buffer may change; the builder's refusals.
 */
START_TEST(borrowed_write_sent_at_submit)
{
	enum { BIG = 1 << 20, SMALL = 100 };
	struct gpucmd_conn *c = connect_as("basic");
	uint8_t *src = malloc(BIG), *want = malloc(BIG);
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	const void *data;
	size_t len;
	uint64_t id;

	ck_assert_ptr_nonnull(src);
	ck_assert_ptr_nonnull(want);
	for (size_t i = 0; i < BIG; i++)
		src[i] = (uint8_t)(i * 37 + (i >> 10));
	memcpy(want, src, BIG);
	memset(want + 4096, 0xab, SMALL); /* the copied write below */
	memcpy(want + 8192, src, SMALL);  /* the small borrowed one */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 1, BIG), 0);
	ck_assert_int_eq(gpucmd_batch_write_borrowed(b, 1, 0, src, BIG), 0);
	{
		uint8_t ab[SMALL];

		memset(ab, 0xab, sizeof(ab));
		ck_assert_int_eq(gpucmd_batch_write(b, 1, 4096, ab, SMALL), 0);
	}
	ck_assert_int_eq(gpucmd_batch_write_borrowed(b, 1, 8192, src, SMALL),
			 0);
	ck_assert_int_eq(gpucmd_batch_sync(b), 0);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	/* Submitted: the bytes left; the buffer is the caller's again. */
	memset(src, 0, BIG);
	ck_assert_int_eq(gpucmd_wait(c, id, &r), 0);
	ck_assert_int_eq(gpucmd_response_error(r), 0);
	gpucmd_response_free(r);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, BIG), 0);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_data(r, 0, &data, &len), 0);
	ck_assert_uint_eq(len, BIG);
	ck_assert_int_eq(memcmp(data, want, BIG), 0);
	gpucmd_response_free(r);

	/* Refused like gpucmd_batch_write; a batch freed unsent is fine. */
	for (int i = 0; i < 3; i++) {
		const void *from = i == 1 ? NULL : src;
		size_t n = i == 2 ? gpucmd_info(c)->max_frame_bytes + 1 : 8;

		ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
		ck_assert_int_eq(gpucmd_batch_write_borrowed(b, i == 0 ? 0 : 1,
							     0, from, n),
				 i == 2 ? GPUCMD_ELIMIT : GPUCMD_EINVAL);
		ck_assert_uint_eq(gpucmd_batch_count(b), 0);
		gpucmd_batch_free(b);
	}
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_write_borrowed(b, 1, 0, src, BIG), 0);
	ck_assert_uint_eq(gpucmd_batch_count(b), 1);
	gpucmd_batch_free(b);
	free(src);
	free(want);
	gpucmd_close(c);
}
END_TEST

/*
 * libgpucmd keeps a submitted batch and its small op blocks for the next
 * batches of the connection: what those carry starts clean (other
 * handles, offsets, lengths, streams), over many rounds.
 */
START_TEST(recycled_batches_start_clean)
{
	struct gpucmd_conn *c = connect_as("basic");
	uint8_t bytes[256];
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	const void *data;
	size_t len;

	for (int i = 0; i < 256; i++)
		bytes[i] = (uint8_t)i;
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(b, 1, bytes, 256), 0);
	gpucmd_response_free(run_ok(b));
	for (unsigned round = 0; round < 200; round++) {
		uint64_t off = round % 200, n = 1 + round % 50;
		uint32_t stream = round % 3;

		ck_assert_int_eq(gpucmd_batch_new(c, stream, &b), 0);
		if (round % 2 == 0) {
			ck_assert_int_eq(gpucmd_batch_empty(b, 100 + round, 8),
					 0);
			ck_assert_int_eq(gpucmd_batch_ping(b), 0);
		}
		ck_assert_int_eq(gpucmd_batch_read(b, 1, off, n), 0);
		if (round % 2 == 0)
			ck_assert_int_eq(gpucmd_batch_release(b, 100 + round),
					 0);
		r = run_ok(b);
		ck_assert_uint_eq(gpucmd_response_count(r),
				  round % 2 == 0 ? 4 : 1);
		ck_assert_int_eq(gpucmd_response_data(r, round % 2 == 0 ? 2 : 0,
						      &data, &len),
				 0);
		ck_assert_uint_eq(len, n);
		ck_assert_int_eq(memcmp(data, bytes + off, n), 0);
		gpucmd_response_free(r);
	}
	ck_assert_uint_eq(report_totals(c).allocations, 1);
	gpucmd_close(c);
}
END_TEST

/* The first line of path into buf; false when it cannot be read. */
static bool first_line(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	bool ok = f != NULL && fgets(buf, (int)len, f) != NULL;

	if (f != NULL)
		fclose(f);
	return ok;
}

/* Field 19 of a /proc stat line: the nice value. */
static int stat_nice(const char *line)
{
	const char *p = strrchr(line, ')'); /* after the name */

	ck_assert_ptr_nonnull(p);
	for (int field = 2; field < 19 && p != NULL; field++)
		p = strchr(p + 1, ' ');
	ck_assert_ptr_nonnull(p);
	return atoi(p + 1);
}

/* The nice value of pid's main thread. */
static int nice_of_main(pid_t pid)
{
	char path[64], line[512];

	snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)pid,
		 (int)pid);
	ck_assert_msg(first_line(path, line, sizeof(line)), "%s", path);
	return stat_nice(line);
}

/*
 * The nice value of every thread of pid named comm: -100 when none, -200
 * when two such threads differ (one has not reniced itself yet).
 */
static int nice_of_threads(pid_t pid, const char *comm)
{
	char path[96], line[512];
	struct dirent *e;
	int nice = -100;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)) != NULL) {
		char name[64] = "";
		int n;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid,
			 e->d_name);
		if (!first_line(path, name, sizeof(name)))
			continue; /* the thread left */
		name[strcspn(name, "\n")] = '\0';
		if (strcmp(name, comm) != 0)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/stat", (int)pid,
			 e->d_name);
		if (!first_line(path, line, sizeof(line)))
			continue;
		n = stat_nice(line);
		if (nice != -100 && n != nice) {
			nice = -200;
			break;
		}
		nice = n;
	}
	closedir(d);
	return nice;
}

/*
 * The host backend's stream workers (which play the GPU) run nicer than
 * the daemon's loop, by host_stream_nice (default 10).
 */
START_TEST(stream_workers_run_nicer)
{
	const char *backend = getenv("GPUCMD_TEST_BACKEND");
	struct gpucmd_conn *c;
	struct gpucmd_batch *b;
	int daemon_nice, workers = -100, want;

	/* On CUDA the streams are the driver's: no threads of ours. */
	if (backend != NULL && backend[0] && strcmp(backend, "host") != 0) {
		printf("skipped: the %s backend has no stream workers\n",
		       backend);
		return;
	}
	c = connect_as("basic");
	for (uint32_t s = 0; s < 2; s++) {
		ck_assert_int_eq(gpucmd_batch_new(c, s, &b), 0);
		ck_assert_int_eq(gpucmd_batch_sync(b), 0);
		gpucmd_response_free(run_ok(b));
	}
	daemon_nice = nice_of_main(the_daemon.pid);
	want = daemon_nice + 10 < 19 ? daemon_nice + 10 : 19;
	/*
	 * A worker renices itself when it first runs, which may come after
	 * its stream answered a sync (slow under valgrind): wait up to 10 s.
	 */
	for (int i = 0; i < 1000; i++) {
		workers = nice_of_threads(the_daemon.pid, "gpucmd-stream");
		if (workers == want || workers == -100)
			break;
		usleep(10000);
	}
	/* Under valgrind the threads do not carry their names. */
	if (workers != -100 || getenv("GPUCMD_TEST_VALGRIND") == NULL)
		ck_assert_int_eq(workers, want);
	gpucmd_close(c);
}
END_TEST

START_TEST(every_builtin)
{
	struct gpucmd_conn *c = connect_as("basic");
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	enum { N = 1000 };
	float x[N], y[N];
	double sum = 0;
	const float *out;
	const void *data;
	size_t len;

	for (int i = 0; i < N; i++) {
		x[i] = (float)i * 0.5f;
		y[i] = (float)(N - i);
	}
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_create_with_data(b, 1, x, sizeof(x));
	gpucmd_batch_create_with_data(b, 2, y, sizeof(y));
	gpucmd_batch_empty(b, 3, sizeof(x));
	gpucmd_batch_empty(b, 4, 4);
	gpucmd_batch_empty(b, 5, sizeof(x));
	{
		struct gpucmd_arg add[4] = { buf_arg(3), buf_arg(1), buf_arg(2),
					     u32_arg(N) };
		struct gpucmd_arg scale[3] = { buf_arg(3), f32_arg(2.0f),
					       u32_arg(N) };
		struct gpucmd_arg saxpy[4] = { buf_arg(2), buf_arg(1),
					       f32_arg(3.0f), u32_arg(N) };
		struct gpucmd_arg red[3] = { buf_arg(4), buf_arg(1),
					     u32_arg(N) };
		struct gpucmd_arg cp[3] = { buf_arg(5), buf_arg(3),
					    u64_arg(sizeof(x)) };
		struct gpucmd_arg spin[1] = { u32_arg(1000) };

		ck_assert_int_eq(gpucmd_batch_kernel(b, "add_f32", G1, B64, add,
						     4),
				 0);
		ck_assert_int_eq(gpucmd_batch_kernel(b, "scale_f32", G1, B64,
						     scale, 3),
				 0);
		ck_assert_int_eq(gpucmd_batch_kernel(b, "saxpy_f32", G1, B64,
						     saxpy, 4),
				 0);
		ck_assert_int_eq(gpucmd_batch_kernel(b, "reduce_sum_f32", G1,
						     B64, red, 3),
				 0);
		ck_assert_int_eq(gpucmd_batch_kernel(b, "copy", G1, B64, cp, 3),
				 0);
		ck_assert_int_eq(gpucmd_batch_kernel(b, "spin", G1, B64, spin,
						     1),
				 0);
	}
	gpucmd_batch_read(b, 3, 0, sizeof(x)); /* 11 */
	gpucmd_batch_read(b, 2, 0, sizeof(y)); /* 12 */
	gpucmd_batch_read(b, 4, 0, 4);	       /* 13 */
	gpucmd_batch_read(b, 5, 0, sizeof(x)); /* 14 */
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_data(r, 11, &data, &len), 0);
	out = data;
	for (int i = 0; i < N; i++)
		ck_assert_float_eq(out[i], 2.0f * (x[i] + y[i]));
	ck_assert_int_eq(gpucmd_response_data(r, 12, &data, &len), 0);
	out = data;
	for (int i = 0; i < N; i++)
		ck_assert_float_eq(out[i], 3.0f * x[i] + y[i]);
	ck_assert_int_eq(gpucmd_response_data(r, 13, &data, &len), 0);
	for (int i = 0; i < N; i++)
		sum += x[i];
	ck_assert_double_eq_tol(*(const float *)data, sum, sum * 1e-5);
	ck_assert_int_eq(gpucmd_response_data(r, 14, &data, &len), 0);
	ck_assert_int_eq(gpucmd_response_data(r, 11, (const void **)&out, &len),
			 0);
	{
		const void *copy;
		size_t clen;
		gpucmd_response_data(r, 14, &copy, &clen);
		ck_assert_int_eq(memcmp(copy, out, sizeof(x)), 0);
	}
	gpucmd_response_free(r);
	gpucmd_close(c);
}
END_TEST

/* Run a batch that must fail at index idx with code; returns the message. */
#define expect_fail(b, idx, code, needle) \
	expect_fail_at(__LINE__, b, idx, code, needle)
static void expect_fail_at(int line, struct gpucmd_batch *b, int idx, int code,
			   const char *needle)
{
	struct gpucmd_response *r = NULL;

	ck_assert_int_eq(gpucmd_run(b, &r), 0);
	ck_assert_msg(gpucmd_response_error(r) == code,
		      "line %d: expected %s, got %s: %s", line,
		      gpucmd_errname(code),
		      gpucmd_errname(gpucmd_response_error(r)),
		      gpucmd_response_message(r));
	ck_assert_int_eq(gpucmd_response_failed_index(r), idx);
	ck_assert_uint_eq(gpucmd_response_count(r), (size_t)idx);
	ck_assert_msg(strstr(gpucmd_response_message(r), needle) != NULL,
		      "message '%s' lacks '%s'", gpucmd_response_message(r),
		      needle);
	gpucmd_response_free(r);
}

START_TEST(client_errors)
{
	struct gpucmd_conn *c = connect_as("basic");
	struct gpucmd_batch *b;
	struct gpucmd_arg fill[3] = { buf_arg(1), u32_arg(1), u32_arg(1000) };
	struct gpucmd_arg wrong[2] = { buf_arg(1), u32_arg(1) };
	/* 400 bytes: what handle 1 holds once the first batch made it. */
	struct gpucmd_arg fill100[3] = { buf_arg(1), u32_arg(1), u32_arg(100) };
	uint32_t zero[3] = { 0, 1, 1 };

	/* A handle never allocated. */
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_ping(b);
	gpucmd_batch_read(b, 99, 0, 4);
	gpucmd_batch_ping(b);
	expect_fail(b, 1, GPUCMD_ENOTFOUND, "handle 99");

	/* A kernel that would run past the buffer. */
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_empty(b, 1, 400);
	gpucmd_batch_kernel(b, "fill_u32", G1, B64, fill, 3);
	expect_fail(b, 1, GPUCMD_EINVAL,
		    "needs 4000 bytes, the buffer has 400");

	/* Wrong argument count, unknown kernel, zero grid. */
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_kernel(b, "fill_u32", G1, B64, wrong, 2);
	expect_fail(b, 0, GPUCMD_EINVAL, "takes 3 arguments");
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_kernel(b, "no_such_kernel", G1, B64, NULL, 0);
	expect_fail(b, 0, GPUCMD_ENOKERNEL, "no_such_kernel");
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_kernel(b, "fill_u32", zero, B64, fill, 3);
	expect_fail(b, 0, GPUCMD_ELAUNCH, "zero dimension");
	/*
	 * The driver's own sentence (the host's or CUDA's), once: not
	 * "launch refused: " from gpucmd_strerror() before it as well.
	 */
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_kernel_shared(b, "fill_u32", G1, B64, 1u << 30, fill100,
				   3);
	{
		struct gpucmd_response *r = NULL;
		const char *m;

		ck_assert_int_eq(gpucmd_run(b, &r), 0);
		ck_assert_int_eq(gpucmd_response_error(r), GPUCMD_ELAUNCH);
		m = gpucmd_response_message(r);
		ck_assert_msg(strncmp(m, "launch refused by the driver: ",
				      30) == 0 &&
				      strstr(m, "1073741824 bytes") != NULL &&
				      strstr(m, "launch refused: ") == NULL,
			      "%s", m);
		gpucmd_response_free(r);
	}

	/* Handle 0 (refused by the library), a live handle again, reads out
	 * of bounds. */
	gpucmd_batch_new(c, 0, &b);
	ck_assert_int_eq(gpucmd_batch_empty(b, 0, 16), GPUCMD_EINVAL);
	ck_assert_uint_eq(gpucmd_batch_count(b), 0);
	gpucmd_batch_free(b);
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_empty(b, 1, 16);
	expect_fail(b, 0, GPUCMD_EEXIST, "already live");
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_read(b, 1, 390, 20);
	expect_fail(b, 0, GPUCMD_EINVAL, "out of bounds");
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_write(b, 1, UINT64_MAX - 2, "abcd", 4);
	expect_fail(b, 0, GPUCMD_EINVAL, "out of bounds");

	/* Released twice. */
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_release(b, 1);
	gpucmd_batch_release(b, 1);
	expect_fail(b, 1, GPUCMD_ENOTFOUND, "handle 1");

	/* Too big for any pool. */
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_empty(b, 5, UINT64_MAX / 2);
	expect_fail(b, 0, GPUCMD_ETOOBIG, "buffer too big");

	/* The connection still serves after all of it. */
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_ping(b);
	gpucmd_response_free(run_ok(b));
	gpucmd_close(c);
}
END_TEST

/*
 * Lengths near SIZE_MAX, whose sum with the room an op needs around its
 * bytes wraps to a small number, are refused as over max_frame_bytes: no
 * op is added and nothing is copied (the wrapped sum once sized the copy).
 */
START_TEST(lengths_that_wrap_are_refused)
{
	struct gpucmd_conn *c = connect_as("basic");
	struct gpucmd_layout l = {
		.rank = 1, .shape = { 16 }, .strides = { 1 }, .elem_size = 1
	};
	const size_t lens[] = { SIZE_MAX, SIZE_MAX - 3, SIZE_MAX - 40,
				SIZE_MAX - 200 };
	struct gpucmd_batch *b;
	uint8_t small[16] = { 0 };

	for (size_t i = 0; i < 5 * sizeof(lens) / sizeof(lens[0]); i++) {
		size_t len = lens[i / 5];
		int r = 0;

		ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
		switch (i % 5) {
		case 0:
			r = gpucmd_batch_write(b, 1, 0, small, len);
			break;
		case 1:
			r = gpucmd_batch_write_borrowed(b, 1, 0, small, len);
			break;
		case 2:
			r = gpucmd_batch_write_layout(b, 1, 0, &l, small, len);
			break;
		case 3:
			r = gpucmd_batch_create_with_data(b, 2, small, len);
			break;
		case 4:
			r = gpucmd_batch_load_module(b, 3, "ptx", small, len);
			break;
		}
		ck_assert_int_eq(r, GPUCMD_ELIMIT);
		ck_assert_uint_eq(gpucmd_batch_count(b), 0);
		gpucmd_batch_free(b);
	}
	/* The connection is as before. */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_ping(b), 0);
	gpucmd_response_free(run_ok(b));
	gpucmd_close(c);
}
END_TEST

START_TEST(release_returns_usage)
{
	struct gpucmd_conn *c = connect_as("basic");
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	struct gpucmd_memory_usage u;

	gpucmd_batch_new(c, 0, &b);
	for (uint64_t h = 1; h <= 100; h++)
		gpucmd_batch_empty(b, h, h * 100);
	gpucmd_batch_memory_usage(b);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_usage(r, 100, &u), 0);
	ck_assert_uint_eq(u.allocations, 100);
	ck_assert_uint_eq(u.bytes_in_use, 100 * 101 / 2 * 100);
	ck_assert_uint_ge(u.bytes_reserved, u.bytes_in_use + u.bytes_padding);
	gpucmd_response_free(r);

	gpucmd_batch_new(c, 0, &b);
	for (uint64_t h = 1; h <= 100; h++)
		gpucmd_batch_release(b, h);
	gpucmd_batch_sync(b);
	r = run_ok(b);
	gpucmd_response_free(r);
	/* After the release's batch completed, the drops are free. */
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_sync(b);
	gpucmd_batch_memory_usage(b);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_usage(r, 1, &u), 0);
	ck_assert_uint_eq(u.allocations, 0);
	ck_assert_uint_eq(u.bytes_in_use, 0);
	gpucmd_response_free(r);
	ck_assert_uint_eq(report_totals(c).bytes_in_use, 0);
	gpucmd_close(c);
}
END_TEST

START_TEST(pipelined_out_of_order)
{
	struct gpucmd_conn *c = connect_as("basic");
	enum { N = 64 };
	uint64_t ids[N];

	for (int i = 0; i < N; i++) {
		struct gpucmd_batch *b;
		uint32_t v = (uint32_t)i * 7;

		ck_assert_int_eq(gpucmd_batch_new(c, (uint32_t)(i % 4), &b), 0);
		gpucmd_batch_create_with_data(b, (uint64_t)i + 1, &v, 4);
		gpucmd_batch_read(b, (uint64_t)i + 1, 0, 4);
		ck_assert_int_eq(gpucmd_submit(b, &ids[i]), 0);
	}
	for (int i = N - 1; i >= 0; i--) {
		struct gpucmd_response *r;
		const void *data;
		size_t len;

		ck_assert_int_eq(gpucmd_wait(c, ids[i], &r), 0);
		ck_assert_int_eq(gpucmd_response_error(r), 0);
		ck_assert_int_eq(gpucmd_response_data(r, 1, &data, &len), 0);
		ck_assert_uint_eq(*(const uint32_t *)data, (uint32_t)i * 7);
		gpucmd_response_free(r);
	}
	gpucmd_close(c);
}
END_TEST

START_TEST(status_and_report)
{
	struct gpucmd_conn *c = connect_as("alpha");
	struct gpucmd_batch *b;
	struct gpucmd_status st;
	struct gpucmd_report *rep;

	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_empty(b, 1, 1000);
	gpucmd_batch_empty(b, 2, 3000);
	gpucmd_response_free(run_ok(b));
	ck_assert_int_eq(gpucmd_status(c, &st), 0);
	ck_assert_str_eq(st.backend, getenv("GPUCMD_TEST_BACKEND") ?
					     getenv("GPUCMD_TEST_BACKEND") :
					     "host");
	ck_assert_uint_eq(st.bytes_in_use, 4000);
	ck_assert_uint_ge(st.connections, 1);
	ck_assert_int_eq(gpucmd_memory_report(c, &rep), 0);
	ck_assert_uint_eq(rep->nservices, 1);
	ck_assert_str_eq(rep->services[0].name, "alpha");
	ck_assert_uint_eq(rep->services[0].bytes_in_use, 4000);
	ck_assert_uint_eq(rep->services[0].allocations, 2);
	ck_assert_uint_eq(rep->services[0].peak_bytes_in_use, 4000);
	ck_assert_uint_eq(rep->totals.bytes_in_use, 4000);
	gpucmd_report_free(rep);
	gpucmd_close(c);
}
END_TEST

START_TEST(bad_service_name_refused)
{
	struct gpucmd_conn *c = NULL;
	char msg[256] = "";
	int rc = gpucmd_connect(the_daemon.sock, "no spaces/allowed", &c, msg,
				sizeof(msg));

	ck_assert_int_eq(rc, GPUCMD_EINVAL);
	ck_assert_ptr_null(c);
	ck_assert_msg(strstr(msg, "not valid") != NULL, "message: %s", msg);
	/*
	 * A connect timeout of 0 ms is refused for what it is (it used to
	 * time out at once and blame the daemon); 1 ms is a timeout.
	 */
	rc = gpucmd_connect_timeout(the_daemon.sock, "basic", 0, &c, msg,
				    sizeof(msg));
	ck_assert_int_eq(rc, GPUCMD_EINVAL);
	ck_assert_ptr_null(c);
	ck_assert_msg(strstr(msg, "timeout of 0 ms") != NULL, "message: %s",
		      msg);
}
END_TEST

/*
 * gpucmd_strerror's text is static, as the header says: a caller may keep
 * it, print two at once, or call it from several threads.  A negative
 * errno that names no error used to come from strerror(), whose "Unknown
 * error N" lives in a buffer that the next such call overwrites.
 */
START_TEST(error_texts_are_static)
{
	const char *a = gpucmd_strerror(-4000);
	const char *b = gpucmd_strerror(-4001);

	ck_assert_str_eq(a, "unknown error");
	ck_assert_str_eq(b, "unknown error");
	ck_assert_str_eq(gpucmd_strerror(-ENOENT), "No such file or directory");
	ck_assert_str_eq(gpucmd_errname(-ENOENT), "ENOENT");
	ck_assert_str_eq(gpucmd_strerror(GPUCMD_EBUSY), "busy");
	ck_assert_str_eq(gpucmd_strerror(1), "unknown error");
	ck_assert_str_eq(gpucmd_errname(-4000), "EUNKNOWN");
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("basic");
	TCase *tc = tcase_create("basic");

	tcase_add_checked_fixture(tc, harness_setup, harness_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, fill_and_read_back);
	tcase_add_test(tc, write_offset_and_create);
	tcase_add_test(tc, large_inline_data_round_trips);
	tcase_add_test(tc, large_read_reply_from_staging);
	tcase_add_test(tc, stream_workers_run_nicer);
	tcase_add_test(tc, borrowed_write_sent_at_submit);
	tcase_add_test(tc, recycled_batches_start_clean);
	tcase_add_test(tc, every_builtin);
	tcase_add_test(tc, client_errors);
	tcase_add_test(tc, lengths_that_wrap_are_refused);
	tcase_add_test(tc, release_returns_usage);
	tcase_add_test(tc, pipelined_out_of_order);
	tcase_add_test(tc, status_and_report);
	tcase_add_test(tc, bad_service_name_refused);
	tcase_add_test(tc, error_texts_are_static);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return harness_main(make_suite());
}
