/*
 * test_clients.c - several client processes at once, and clients that die:
 * every client gets its own right answers, and a client killed mid-batch
 * leaves nothing behind.
 */
#include <sys/mman.h>

#include "harness.h"

#include "frame.h"

static const uint32_t GRID[3] = { 8, 1, 1 };
static const uint32_t BLOCK[3] = { 128, 1, 1 };

/* One worker process: its own service, buffers, kernels; exit 0 if right. */
static int worker(int id, int rounds)
{
	char svc[32];
	struct gpucmd_conn *c = NULL;
	char msg[256];

	snprintf(svc, sizeof(svc), "worker-%d", id);
	if (gpucmd_connect(the_daemon.sock, svc, &c, msg, sizeof(msg)) != 0)
		return 10;
	for (int r = 0; r < rounds; r++) {
		enum { N = 4096 };
		static float x[N];
		struct gpucmd_batch *b;
		struct gpucmd_response *resp;
		const float *out;
		const void *data;
		size_t len;
		uint32_t value = (uint32_t)(id * 1000 + r);
		struct gpucmd_arg fill[3] = {
			{ .kind = GPUCMD_ARG_BUFFER, .v.handle = 1 },
			{ .kind = GPUCMD_ARG_U32, .v.u32 = value },
			{ .kind = GPUCMD_ARG_U32, .v.u32 = N },
		};
		struct gpucmd_arg scale[3] = {
			{ .kind = GPUCMD_ARG_BUFFER, .v.handle = 2 },
			{ .kind = GPUCMD_ARG_F32, .v.f32 = (float)id },
			{ .kind = GPUCMD_ARG_U32, .v.u32 = N },
		};

		for (int i = 0; i < N; i++)
			x[i] = (float)(i + r);
		if (gpucmd_batch_new(c, (uint32_t)(r % 3), &b) != 0)
			return 11;
		gpucmd_batch_empty(b, 1, N * 4);
		gpucmd_batch_kernel(b, "fill_u32", GRID, BLOCK, fill, 3);
		gpucmd_batch_create_with_data(b, 2, x, sizeof(x));
		gpucmd_batch_kernel(b, "scale_f32", GRID, BLOCK, scale, 3);
		gpucmd_batch_read(b, 1, 0, N * 4);
		gpucmd_batch_read(b, 2, 0, N * 4);
		gpucmd_batch_release(b, 1);
		gpucmd_batch_release(b, 2);
		if (gpucmd_run(b, &resp) != 0 ||
		    gpucmd_response_error(resp) != 0)
			return 12;
		if (gpucmd_response_data(resp, 4, &data, &len) != 0 ||
		    len != N * 4)
			return 13;
		for (int i = 0; i < N; i++)
			if (((const uint32_t *)data)[i] != value)
				return 14;
		if (gpucmd_response_data(resp, 5, &data, &len) != 0)
			return 15;
		out = data;
		for (int i = 0; i < N; i++)
			if (out[i] != x[i] * (float)id)
				return 16;
		gpucmd_response_free(resp);
	}
	gpucmd_close(c);
	return 0;
}

START_TEST(four_clients_at_once)
{
	pid_t pids[4];
	struct gpucmd_conn *c;
	struct gpucmd_service_report t;

	for (int i = 0; i < 4; i++) {
		pids[i] = fork();
		ck_assert_int_ge(pids[i], 0);
		if (pids[i] == 0)
			_exit(worker(i + 1, 25));
	}
	for (int i = 0; i < 4; i++) {
		int status;
		ck_assert_int_eq(waitpid(pids[i], &status, 0), pids[i]);
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
			      "worker %d failed with status %d", i + 1,
			      WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	}
	c = connect_as("observer");
	t = report_totals(c);
	ck_assert_uint_eq(t.bytes_in_use, 0);
	ck_assert_uint_eq(t.allocations, 0);
	gpucmd_close(c);
}
END_TEST

/* Poll the report until the daemon has freed everything (10 s at most). */
static struct gpucmd_service_report wait_for_zero(struct gpucmd_conn *c)
{
	struct gpucmd_service_report t;

	for (int i = 0; i < 1000; i++) {
		t = report_totals(c);
		if (t.bytes_in_use == 0 && t.bytes_reserved == 0 &&
		    t.allocations == 0)
			break;
		usleep(10000);
	}
	return t;
}

/* The daemon gives back every byte and allocation, within 10 s. */
static void expect_all_freed(struct gpucmd_conn *c)
{
	struct gpucmd_service_report t = wait_for_zero(c);

	ck_assert_uint_eq(t.bytes_in_use, 0);
	ck_assert_uint_eq(t.bytes_reserved, 0);
	ck_assert_uint_eq(t.allocations, 0);
}

/* The victim: 600 allocations on 3 streams, each behind a 0.5 s spin. */
static int victim_mid_batch(void *arg)
{
	struct gpucmd_conn *c = NULL;
	struct gpucmd_batch *b;
	uint64_t id;
	struct gpucmd_arg spin = { .kind = GPUCMD_ARG_U32, .v.u32 = 500000 };

	(void)arg;
	if (gpucmd_connect(the_daemon.sock, "victim", &c, NULL, 0) != 0)
		return 1;
	for (uint32_t s = 0; s < 3; s++) {
		gpucmd_batch_new(c, s, &b);
		for (uint64_t h = 1; h <= 200; h++)
			gpucmd_batch_empty(b, s * 1000 + h, h * 1000);
		gpucmd_batch_kernel(b, "spin", GRID, BLOCK, &spin, 1);
		gpucmd_batch_sync(b);
		gpucmd_submit(b, &id);
	}
	return 0;
}

START_TEST(killed_mid_batch_leaves_nothing)
{
	struct gpucmd_conn *obs = connect_as("observer");
	struct gpucmd_service_report t;
	pid_t pid = harness_child_ready(victim_mid_batch, NULL);

	usleep(100000); /* the batches are running: the spin holds them */
	t = report_totals(obs);
	ck_assert_uint_gt(t.bytes_in_use, 0);
	harness_child_kill(pid);
	expect_all_freed(obs);
	gpucmd_close(obs);
}
END_TEST

START_TEST(killed_at_random_points)
{
	struct gpucmd_conn *obs = connect_as("observer");
	struct gpucmd_service_report t;

	srand(1234);
	for (int round = 0; round < 20; round++) {
		pid_t pid = fork();

		ck_assert_int_ge(pid, 0);
		if (pid == 0)
			_exit(worker(round, 1000));
		usleep((useconds_t)(rand() % 30000));
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	t = wait_for_zero(obs);
	ck_assert_uint_eq(t.bytes_in_use, 0);
	ck_assert_uint_eq(t.bytes_reserved, 0);
	/* And the daemon still answers correctly. */
	ck_assert_int_eq(worker(99, 2), 0);
	gpucmd_close(obs);
}
END_TEST

/*
 * A client waiting on a long kernel must not hold up another client: the
 * device thread never waits, so B's round trips finish while A's sync is
 * still pending.
 */
START_TEST(slow_sync_does_not_block_others)
{
	struct gpucmd_conn *a = connect_as("slow");
	struct gpucmd_conn *b = connect_as("fast");
	struct gpucmd_arg spin = { .kind = GPUCMD_ARG_U32, .v.u32 = 1500000 };
	struct gpucmd_batch *batch;
	struct gpucmd_response *r;
	uint64_t id, t0, fast_done;

	gpucmd_batch_new(a, 0, &batch);
	gpucmd_batch_kernel(batch, "spin", GRID, BLOCK, &spin, 1);
	gpucmd_batch_sync(batch);
	t0 = harness_now_us();
	ck_assert_int_eq(gpucmd_submit(batch, &id), 0);
	for (int i = 0; i < 20; i++) {
		struct gpucmd_batch *p;
		gpucmd_batch_new(b, 0, &p);
		gpucmd_batch_empty(p, 1, 64);
		gpucmd_batch_sync(p);
		gpucmd_batch_release(p, 1);
		gpucmd_response_free(run_ok(p));
	}
	fast_done = harness_now_us() - t0;
	ck_assert_int_eq(gpucmd_wait(a, id, &r), 0);
	ck_assert_int_eq(gpucmd_response_error(r), 0);
	gpucmd_response_free(r);
	ck_assert_msg(fast_done < 1000000,
		      "20 round trips of another client took %llu us while a "
		      "1.5 s kernel ran",
		      (unsigned long long)fast_done);
	ck_assert_uint_ge(harness_now_us() - t0, 1500000);
	gpucmd_close(a);
	gpucmd_close(b);
}
END_TEST

/*
 * The same for copies: one client's batch of many region writes of 1 MiB
 * (each small enough for the host backend to run at once on a quiet
 * stream, host.c HOST_INLINE_MAX) must not hold the device thread, and so
 * another client, for the whole batch: the host backend runs at most
 * HOST_INLINE_MAX bytes of a batch inline.  (Found by a review: the first
 * round trip of the other client came only with the end of the batch.)
 */
START_TEST(many_small_copies_do_not_block_others)
{
	enum { N = 8192 };
	const uint64_t MIB = UINT64_C(1) << 20;
	struct gpucmd_conn *a = connect_as("copier");
	struct gpucmd_conn *b = connect_as("fast");
	struct gpucmd_batch *batch;
	struct gpucmd_response *r;
	uint64_t id, t0, first, fast_done, a_done;
	void *p;

	/*
	 * Valgrind runs one thread at a time: the worker's copies hold the
	 * device thread there whatever the daemon does.
	 */
	if (getenv("GPUCMD_TEST_VALGRIND") != NULL) {
		printf("many_small_copies_do_not_block_others: skipped: "
		       "valgrind serialises the daemon's threads\n");
		gpucmd_close(a);
		gpucmd_close(b);
		return;
	}
	ck_assert_int_eq(gpucmd_region_create(a, 3, MIB, &p), 0);
	memset(p, 7, MIB);
	gpucmd_batch_new(a, 0, &batch);
	gpucmd_batch_empty(batch, 1, MIB);
	gpucmd_batch_sync(batch);
	gpucmd_response_free(run_ok(batch));
	/* B's stream exists and is warm. */
	gpucmd_batch_new(b, 0, &batch);
	gpucmd_batch_empty(batch, 1, 64);
	gpucmd_batch_sync(batch);
	gpucmd_batch_release(batch, 1);
	gpucmd_response_free(run_ok(batch));

	gpucmd_batch_new(a, 0, &batch);
	for (int i = 0; i < N; i++)
		ck_assert_int_eq(gpucmd_batch_write_region(batch, 1, 0, 3, 0,
							   MIB),
				 0);
	gpucmd_batch_sync(batch);
	t0 = harness_now_us();
	ck_assert_int_eq(gpucmd_submit(batch, &id), 0);
	usleep(20000); /* A's batch reaches the device thread first */
	first = 0;
	for (int i = 0; i < 20; i++) {
		struct gpucmd_batch *q;
		gpucmd_batch_new(b, 0, &q);
		gpucmd_batch_empty(q, 1, 64);
		gpucmd_batch_sync(q);
		gpucmd_batch_release(q, 1);
		gpucmd_response_free(run_ok(q));
		if (i == 0)
			first = harness_now_us() - t0;
	}
	fast_done = harness_now_us() - t0;
	ck_assert_int_eq(gpucmd_wait(a, id, &r), 0);
	ck_assert_int_eq(gpucmd_response_error(r), 0);
	gpucmd_response_free(r);
	a_done = harness_now_us() - t0;
	fprintf(stderr,
		"copier batch %llu us; other client's first round "
		"trip done at %llu us, 20 at %llu us\n",
		(unsigned long long)a_done, (unsigned long long)first,
		(unsigned long long)fast_done);
	ck_assert_msg(first * 3 < a_done,
		      "another client's first round trip took %llu us, the "
		      "copier's batch %llu us: the device thread was held",
		      (unsigned long long)first, (unsigned long long)a_done);
	gpucmd_close(a);
	gpucmd_close(b);
}
END_TEST

/*
 * Large frames wait for the loop's decoding turns (server.c: on_turns)
 * while small ones are handled as they are read; one connection's requests
 * must still run in the order it sent them.  Pipelined writes of big bytes
 * each followed by a read of 16 bytes (small): every read sees its own
 * write.  8 KiB writes wait in the read buffer, 64 KiB ones are read into
 * a buffer of their own (session.c: s->body); both kinds, alternating, and
 * with another connection sending large frames at the same time.
 */
static void pipeline_writes_and_reads(struct gpucmd_conn *c, size_t big,
				      size_t other)
{
	enum { ROUNDS = 40 };
	static uint8_t data[ROUNDS][64 * 1024 + 1];
	uint64_t wid[ROUNDS], rid[ROUNDS];
	struct gpucmd_batch *b;
	struct gpucmd_response *r;

	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_empty(b, 1, big > other ? big : other);
	gpucmd_response_free(run_ok(b));
	for (int k = 0; k < ROUNDS; k++) {
		size_t len = k % 2 == 0 ? big : other;

		memset(data[k], 0x40 + k, len);
		ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
		ck_assert_int_eq(gpucmd_batch_write(b, 1, 0, data[k], len), 0);
		ck_assert_int_eq(gpucmd_submit(b, &wid[k]), 0);
		ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
		ck_assert_int_eq(gpucmd_batch_read(b, 1, len - 16, 16), 0);
		ck_assert_int_eq(gpucmd_submit(b, &rid[k]), 0);
	}
	for (int k = 0; k < ROUNDS; k++) {
		const void *got;
		size_t len;
		uint8_t want[16];

		ck_assert_int_eq(gpucmd_wait(c, wid[k], &r), 0);
		ck_assert_int_eq(gpucmd_response_error(r), 0);
		gpucmd_response_free(r);
		ck_assert_int_eq(gpucmd_wait(c, rid[k], &r), 0);
		ck_assert_int_eq(gpucmd_response_error(r), 0);
		ck_assert_int_eq(gpucmd_response_data(r, 0, &got, &len), 0);
		ck_assert_uint_eq(len, 16);
		memset(want, 0x40 + k, sizeof(want));
		ck_assert_msg(memcmp(got, want, 16) == 0,
			      "read %d saw another write's bytes (0x%02x)", k,
			      ((const uint8_t *)got)[0]);
		gpucmd_response_free(r);
	}
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_release(b, 1);
	gpucmd_response_free(run_ok(b));
}

START_TEST(pipelined_large_and_small_keep_order)
{
	struct gpucmd_conn *c = connect_as("order");
	pid_t pid;
	int status;

	pipeline_writes_and_reads(c, 64 * 1024, 64 * 1024);
	pipeline_writes_and_reads(c, 8 * 1024, 8 * 1024);
	pipeline_writes_and_reads(c, 8 * 1024, 64 * 1024 + 1);
	/* Frames that leave a partial one at the end of the read buffer. */
	pipeline_writes_and_reads(c, 40 * 1024, 20 * 1024);
	/* Turns are taken by all connections' large frames in one queue. */
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		struct gpucmd_conn *o = connect_as("order-other");

		for (int i = 0; i < 5; i++)
			pipeline_writes_and_reads(o, 16 * 1024, 64 * 1024);
		gpucmd_close(o);
		_exit(0);
	}
	for (int i = 0; i < 5; i++)
		pipeline_writes_and_reads(c, 8 * 1024, 32 * 1024);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "the other connection's pipeline failed (status %#x)",
		      status);
	gpucmd_close(c);
}
END_TEST

/*
 * A client that leaves while its large frames wait for their turn (closed
 * right after sending them, or killed: the loop reads the end of the stream
 * behind frames it has not decoded yet) leaves nothing behind, and the
 * connections whose frames wait with them are served.
 */
static void leave_with_frames_queued(bool kill_it)
{
	struct gpucmd_conn *obs = connect_as("observer");
	struct gpucmd_conn *c = connect_as("turns-stay");
	static uint8_t data[32 * 1024];

	for (int round = 0; round < 12; round++) {
		pid_t pid = fork();
		uint64_t ids[8];

		ck_assert_int_ge(pid, 0);
		if (pid == 0) {
			struct gpucmd_conn *l = connect_as("turns-leave");
			struct gpucmd_batch *b;
			uint64_t id;

			/* 8 KiB frames, a few: the read buffer takes them all
			 * and the end of the stream. */
			for (uint32_t h = 1; h <= (uint32_t)(round % 6 + 1);
			     h++) {
				if (gpucmd_batch_new(l, h % 4, &b) != 0 ||
				    gpucmd_batch_create_with_data(b, h, data,
								  8 * 1024) !=
					    0 ||
				    gpucmd_submit(b, &id) != 0)
					_exit(1);
			}
			if (kill_it)
				raise(SIGKILL);
			gpucmd_close(l);
			_exit(0);
		}
		/*
		 * This connection's large frames queue with the others': slow
		 * to decode (2000 ops), so turns run out of time with the
		 * leaving client's frames still waiting.
		 */
		for (int i = 0; i < 8; i++) {
			struct gpucmd_batch *b;

			memset(data, i + round, sizeof(data));
			ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
			ck_assert_int_eq(gpucmd_batch_create_with_data(
						 b, (uint32_t)(i + 1), data,
						 sizeof(data)),
					 0);
			for (int k = 0; k < 2000; k++)
				ck_assert_int_eq(gpucmd_batch_ping(b), 0);
			ck_assert_int_eq(gpucmd_batch_read(b, (uint32_t)(i + 1),
							   100, 1),
					 0);
			ck_assert_int_eq(gpucmd_batch_release(b, (uint32_t)(i +
									    1)),
					 0);
			ck_assert_int_eq(gpucmd_submit(b, &ids[i]), 0);
		}
		for (int i = 0; i < 8; i++) {
			struct gpucmd_response *r;
			const void *got;
			size_t len;

			ck_assert_int_eq(gpucmd_wait(c, ids[i], &r), 0);
			ck_assert_int_eq(gpucmd_response_error(r), 0);
			ck_assert_int_eq(gpucmd_response_data(r, 2001, &got,
							      &len),
					 0);
			ck_assert_uint_eq(len, 1);
			ck_assert_uint_eq(*(const uint8_t *)got,
					  (uint8_t)(i + round));
			gpucmd_response_free(r);
		}
		waitpid(pid, NULL, 0);
	}
	gpucmd_close(c);
	expect_all_freed(obs);
	gpucmd_close(obs);
}

START_TEST(closed_with_frames_waiting_for_their_turn)
{
	leave_with_frames_queued(false);
}
END_TEST

START_TEST(killed_with_frames_waiting_for_their_turn)
{
	leave_with_frames_queued(true);
}
END_TEST

/* ---- timeouts ------------------------------------------------------------- */

/* Submit {spin(usec); sync} on stream of c. */
static uint64_t submit_spin(struct gpucmd_conn *c, uint32_t stream,
			    uint32_t usec)
{
	struct gpucmd_arg spin = { .kind = GPUCMD_ARG_U32, .v.u32 = usec };
	struct gpucmd_batch *b;
	uint64_t id;

	ck_assert_int_eq(gpucmd_batch_new(c, stream, &b), 0);
	ck_assert_int_eq(gpucmd_batch_kernel(b, "spin", GRID, BLOCK, &spin, 1),
			 0);
	ck_assert_int_eq(gpucmd_batch_sync(b), 0);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	return id;
}

/*
 * A wait that times out returns -ETIMEDOUT after about its timeout, leaves
 * the connection usable and the request outstanding: a later wait gets
 * its answer.
 */
START_TEST(wait_timeout_keeps_the_request)
{
	struct gpucmd_conn *c = connect_as("timeouts");
	struct gpucmd_response *r = NULL;
	const char *why = NULL;
	uint64_t id, t0, took;

	id = submit_spin(c, 0, 600000);
	t0 = harness_now_us();
	ck_assert_int_eq(gpucmd_wait_timeout(c, id, 100, &r), -ETIMEDOUT);
	took = harness_now_us() - t0;
	ck_assert_ptr_null(r);
	ck_assert_uint_ge(took, 100000);
	ck_assert_msg(took < 550000, "a 100 ms wait took %llu us",
		      (unsigned long long)took);
	ck_assert_int_eq(gpucmd_conn_error(c, &why), 0);
	ck_assert_str_eq(why, "");
	/* Zero means a look without blocking. */
	ck_assert_int_eq(gpucmd_wait_timeout(c, id, 0, &r), -ETIMEDOUT);
	ck_assert_int_eq(gpucmd_wait_timeout(c, id, -1, &r), 0);
	ck_assert_int_eq(gpucmd_response_error(r), 0);
	gpucmd_response_free(r);
	/* Collected: the id is no longer outstanding. */
	ck_assert_int_eq(gpucmd_wait_timeout(c, id, 10, &r), GPUCMD_EINVAL);
	gpucmd_close(c);
}
END_TEST

/*
 * gpucmd_run under the connection's timeout: the caller never saw the id,
 * so its late answer is dropped and its in-flight slot freed; every later
 * request still gets its own answer, up to max_in_flight at once.
 */
START_TEST(run_timeout_drops_the_late_answer)
{
	struct gpucmd_conn *c = connect_as("timeouts");
	struct gpucmd_arg spin = { .kind = GPUCMD_ARG_U32, .v.u32 = 300000 };
	const struct gpucmd_info *info = gpucmd_info(c);
	struct gpucmd_response *r = NULL;
	struct gpucmd_batch *b;
	uint32_t n = info->max_in_flight;
	uint64_t *ids;

	ck_assert_uint_gt(n, 1);
	gpucmd_set_timeout(c, 50);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_kernel(b, "spin", GRID, BLOCK, &spin, 1);
	gpucmd_batch_sync(b);
	ck_assert_int_eq(gpucmd_run(b, &r), -ETIMEDOUT);
	ck_assert_int_eq(gpucmd_conn_error(c, NULL), 0);
	gpucmd_set_timeout(c, -1);
	/* Stream 0 is still spinning: this one comes after it. */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_empty(b, 7, 64);
	gpucmd_batch_sync(b);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_count(r), 2);
	gpucmd_response_free(r);
	/* The dropped answer gave its slot back: n fit in flight again. */
	ids = calloc(n, sizeof(*ids));
	ck_assert_ptr_nonnull(ids);
	for (uint32_t k = 0; k < n; k++) {
		ck_assert_int_eq(gpucmd_batch_new(c, 1, &b), 0);
		gpucmd_batch_ping(b);
		ck_assert_int_eq(gpucmd_submit(b, &ids[k]), 0);
	}
	for (uint32_t k = 0; k < n; k++) {
		ck_assert_int_eq(gpucmd_wait(c, ids[k], &r), 0);
		ck_assert_int_eq(gpucmd_response_error(r), 0);
		gpucmd_response_free(r);
	}
	free(ids);
	gpucmd_close(c);
}
END_TEST

/*
 * A transfer call that times out closes the connection: its requests use
 * the connection's scratch region, which the daemon may still read.
 */
START_TEST(transfer_timeout_closes_the_connection)
{
	struct gpucmd_conn *c = connect_as("timeouts");
	struct gpucmd_batch *b;
	const char *why = NULL;
	size_t len = 1 << 20;
	uint8_t *data = calloc(1, len);

	ck_assert_ptr_nonnull(data);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_empty(b, 1, len);
	gpucmd_response_free(run_ok(b));
	(void)submit_spin(c, 0, 400000);
	gpucmd_set_timeout(c, 50);
	ck_assert_int_eq(gpucmd_write_buffer(c, 0, 1, 0, data, len),
			 -ETIMEDOUT);
	ck_assert_int_eq(gpucmd_conn_error(c, &why), -ETIMEDOUT);
	ck_assert_msg(strstr(why, "shared memory") != NULL, "why: %s", why);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_ping(b);
	{
		uint64_t id;

		ck_assert_int_eq(gpucmd_submit(b, &id), -ETIMEDOUT);
	}
	gpucmd_close(c);
	free(data);
}
END_TEST

/*
 * A large response freed after its connection closed gives its buffer
 * back: the pool of large buffers (frame.c) is trimmed only when a frame
 * is read, and with no connection left none ever is (a review found the
 * 1 MiB buffer still held at exit).
 */
START_TEST(responses_freed_after_close_keep_no_buffers)
{
	enum { N = 1 << 20 };
	struct gpucmd_response *r;
	struct gpucmd_conn *c;
	struct gpucmd_batch *b;
	const void *got;
	size_t len;

	c = connect_as("timeouts");
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 1, N), 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, N), 0);
	ck_assert_int_eq(gpucmd_run(b, &r), 0);
	ck_assert_int_eq(gpucmd_response_data(r, 1, &got, &len), 0);
	ck_assert_uint_eq(len, N);
	gpucmd_close(c);
	gpucmd_response_free(r);
	ck_assert_uint_eq(frame_buf_spares(), 0);
}
END_TEST

/*
 * A timeout of 0 looks at what has arrived: a reply already in the socket
 * is collected whole, even one larger than a read-ahead and with the
 * watch before blocking off ($GPUCMD_SPIN_US=0).
 */
START_TEST(zero_timeout_collects_what_arrived)
{
	enum { N = 64 * 1024 };
	struct gpucmd_conn *c;
	struct gpucmd_response *r = NULL;
	struct gpucmd_batch *b;
	static uint8_t data[N];
	const void *got;
	size_t len;
	uint64_t id;
	char msg[256];

	for (size_t i = 0; i < N; i++)
		data[i] = (uint8_t)(i * 7);
	setenv("GPUCMD_SPIN_US", "0", 1);
	ck_assert_int_eq(gpucmd_connect(the_daemon.sock, "timeouts", &c, msg,
					sizeof(msg)),
			 0);
	unsetenv("GPUCMD_SPIN_US");
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_create_with_data(b, 1, data, N);
	gpucmd_batch_read(b, 1, 0, N);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	/*
	 * Look until the answer has come: each look that finds nothing
	 * leaves the connection as it was, and the one that finds the
	 * answer's first bytes reads it whole.
	 */
	for (int i = 0;; i++) {
		int rc = gpucmd_wait_timeout(c, id, 0, &r);

		if (rc == 0)
			break;
		ck_assert_int_eq(rc, -ETIMEDOUT);
		ck_assert_int_eq(gpucmd_conn_error(c, NULL), 0);
		ck_assert_msg(i < 3000, "no answer in 30 s");
		usleep(10000);
	}
	ck_assert_int_eq(gpucmd_response_error(r), 0);
	ck_assert_int_eq(gpucmd_response_data(r, 1, &got, &len), 0);
	ck_assert_uint_eq(len, N);
	ck_assert_int_eq(memcmp(got, data, N), 0);
	gpucmd_response_free(r);
	ck_assert_int_eq(gpucmd_conn_error(c, NULL), 0);
	gpucmd_close(c);
}
END_TEST

/*
 * Timed-out runs leave answers nobody collects: they hold in-flight
 * places until they come, and a later submit reads them in rather than
 * refusing for good.
 */
START_TEST(abandoned_answers_give_their_places_back)
{
	struct gpucmd_conn *c = connect_as("timeouts");
	/* Long enough for all the submits, under valgrind too. */
	struct gpucmd_arg spin = {
		.kind = GPUCMD_ARG_U32,
		.v.u32 = getenv("GPUCMD_TEST_VALGRIND") ? 20000000 : 3000000,
	};
	uint32_t n = gpucmd_info(c)->max_in_flight;
	struct gpucmd_response *r = NULL;
	struct gpucmd_batch *b;
	uint32_t timed_out = 0;

	ck_assert_uint_gt(n, 0);
	gpucmd_set_timeout(c, 0);
	/* The first spins; the rest queue behind it on its stream. */
	for (uint32_t k = 0; k < n; k++) {
		int rc;

		ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
		gpucmd_batch_kernel(b, "spin", GRID, BLOCK, &spin, 1);
		gpucmd_batch_sync(b);
		spin.v.u32 = 1;
		rc = gpucmd_run(b, &r);
		ck_assert_msg(rc == 0 || rc == -ETIMEDOUT, "run %u: %s", k,
			      gpucmd_errname(rc));
		if (rc == 0)
			gpucmd_response_free(r);
		else
			timed_out++;
	}
	/* All in flight, none collected: the next submit finds the limit. */
	ck_assert_uint_eq(timed_out, n);
	ck_assert_int_eq(gpucmd_conn_error(c, NULL), 0);
	gpucmd_set_timeout(c, -1);
	ck_assert_int_eq(gpucmd_batch_new(c, 1, &b), 0);
	gpucmd_batch_ping(b);
	gpucmd_response_free(run_ok(b));
	gpucmd_close(c);
}
END_TEST

/*
 * A daemon that stops reading (SIGSTOP) in the middle of a large request:
 * the send gives up too, and since half a request went, the connection is
 * closed.
 */
START_TEST(send_timeout_on_a_stopped_daemon)
{
	enum { BIG = 8 << 20 };
	struct gpucmd_conn *c = connect_as("timeouts");
	struct gpucmd_batch *b;
	const char *why = NULL;
	uint8_t *data = calloc(1, BIG);
	uint64_t id, t0, took;
	int rc;

	ck_assert_ptr_nonnull(data);
	gpucmd_set_timeout(c, 200);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_create_with_data(b, 1, data, BIG);
	kill(the_daemon.pid, SIGSTOP);
	t0 = harness_now_us();
	rc = gpucmd_submit(b, &id);
	took = harness_now_us() - t0;
	kill(the_daemon.pid, SIGCONT);
	ck_assert_int_eq(rc, -ETIMEDOUT);
	ck_assert_msg(took < 5000000, "the send took %llu us",
		      (unsigned long long)took);
	ck_assert_int_eq(gpucmd_conn_error(c, &why), -ETIMEDOUT);
	ck_assert_msg(strstr(why, "middle of a request") != NULL, "why: %s",
		      why);
	gpucmd_close(c);
	free(data);
	/* The daemon itself goes on. */
	c = connect_as("timeouts");
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_ping(b);
	gpucmd_response_free(run_ok(b));
	gpucmd_close(c);
}
END_TEST

/*
 * A socket that accepts but never answers Hello (a wedged daemon, or not
 * a daemon at all): gpucmd_connect_timeout gives up and says so.
 */
START_TEST(connect_timeout_on_a_silent_listener)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	struct gpucmd_conn *c = NULL;
	char msg[256] = "";
	uint64_t t0, took;
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);

	ck_assert_int_ge(fd, 0);
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s.silent",
		 the_daemon.sock);
	unlink(sun.sun_path);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	ck_assert_int_eq(listen(fd, 4), 0);
	t0 = harness_now_us();
	ck_assert_int_eq(gpucmd_connect_timeout(sun.sun_path, "x", 150, &c, msg,
						sizeof(msg)),
			 -ETIMEDOUT);
	took = harness_now_us() - t0;
	ck_assert_ptr_null(c);
	ck_assert_uint_ge(took, 150000);
	ck_assert_msg(took < 2000000, "a 150 ms connect took %llu us",
		      (unsigned long long)took);
	ck_assert_msg(strstr(msg, "did not answer Hello within 150 ms") != NULL,
		      "msg: %s", msg);
	close(fd);
	unlink(sun.sun_path);
}
END_TEST

/*
 * A connection inherited across fork(): the child's every call on it is
 * refused at once (GPUCMD_EINVAL, and a sentence that names the opener),
 * and the parent's connection goes on as if the child did not exist.
 */

/* The start of the refusal's sentence, which names the opener's pid. */
#define FORK_SENTENCE "this connection was opened by process "

/* What the child saw, sent back through a pipe. */
struct fork_seen {
	int submit, wait, run, status, report, cleanup, conn_error;
	int region_create, region_release, write_buffer, read_buffer;
	int create_buffer;
	int refused_in_loop; /* submits refused while the parent pinged */
	char message[768];   /* gpucmd_last_message after the submit */
	char region_message[768];
	int own_connect, own_bytes_ok, own_connections;
};

/* The child of fork_child_is_refused: try everything, report, _exit. */
static void fork_child(struct gpucmd_conn *c, uint64_t parent_id, int out,
		       int go)
{
	static uint8_t big[100000]; /* through the scratch region */
	struct fork_seen seen;
	struct gpucmd_response *resp = NULL;
	struct gpucmd_report *rep = NULL;
	struct gpucmd_status st;
	struct gpucmd_conn *own = NULL;
	struct gpucmd_batch *b;
	const char *why = NULL;
	uint64_t id = 0, n = 0;
	void *p = NULL;
	char x;

	memset(&seen, 0, sizeof(seen));
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_ping(b);
	seen.submit = gpucmd_submit(b, &id);
	snprintf(seen.message, sizeof(seen.message), "%s",
		 gpucmd_last_message(c));
	/* The parent's request, answered or not: not the child's to take. */
	seen.wait = gpucmd_wait(c, parent_id, &resp);
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_ping(b);
	seen.run = gpucmd_run(b, &resp);
	seen.status = gpucmd_status(c, &st);
	seen.report = gpucmd_memory_report(c, &rep);
	seen.cleanup = gpucmd_cleanup(c, NULL, &n);
	seen.conn_error = gpucmd_conn_error(c, &why);
	seen.region_create = gpucmd_region_create(c, 8, 4096, &p);
	snprintf(seen.region_message, sizeof(seen.region_message), "%s",
		 gpucmd_last_message(c));
	seen.region_release = gpucmd_region_release(c, 7);
	memset(big, 0x5a, sizeof(big));
	seen.write_buffer = gpucmd_write_buffer(c, 0, 1, 0, big, sizeof(big));
	seen.read_buffer = gpucmd_read_buffer(c, 0, 1, 0, sizeof(big), big);
	seen.create_buffer = gpucmd_create_buffer(c, 0, 9, big, 64);
	/* While the parent pings: every submit refused, none sent. */
	if (read(go, &x, 1) != 1)
		_exit(120);
	for (int i = 0; i < 200; i++) {
		gpucmd_batch_new(c, 0, &b);
		gpucmd_batch_ping(b);
		seen.refused_in_loop += gpucmd_submit(b, &id) == GPUCMD_EINVAL;
	}
	/* Its own connection works. */
	seen.own_connect =
		gpucmd_connect(the_daemon.sock, "forked", &own, NULL, 0);
	if (seen.own_connect == 0) {
		uint8_t mine[256];
		const void *data = NULL;
		size_t len = 0;

		for (size_t i = 0; i < sizeof(mine); i++)
			mine[i] = (uint8_t)(i * 7 + 3);
		gpucmd_batch_new(own, 0, &b);
		gpucmd_batch_create_with_data(b, 1, mine, sizeof(mine));
		gpucmd_batch_read(b, 1, 0, sizeof(mine));
		if (gpucmd_run(b, &resp) == 0 &&
		    gpucmd_response_error(resp) == 0 &&
		    gpucmd_response_data(resp, 1, &data, &len) == 0)
			seen.own_bytes_ok = len == sizeof(mine) &&
					    memcmp(data, mine, len) == 0;
		gpucmd_response_free(resp);
		if (gpucmd_status(own, &st) == 0)
			seen.own_connections = (int)st.connections;
		gpucmd_close(own);
	}
	gpucmd_close(c); /* the inherited one: nothing may reach the daemon */
	if (write(out, &seen, sizeof(seen)) != (ssize_t)sizeof(seen))
		_exit(121);
	_exit(0);
}

/* The parent's connection still right: a ping, and bytes that round trip. */
static void parent_still_works(struct gpucmd_conn *c, uint8_t seed)
{
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	uint8_t in[64], out[64];
	const void *data;
	size_t len;

	for (size_t i = 0; i < sizeof(in); i++)
		in[i] = (uint8_t)(seed + i);
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_ping(b);
	gpucmd_batch_write(b, 1, 0, in, sizeof(in));
	gpucmd_batch_read(b, 1, 0, sizeof(in));
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_data(r, 2, &data, &len), 0);
	ck_assert_uint_eq(len, sizeof(in));
	ck_assert_mem_eq(data, in, sizeof(in));
	gpucmd_response_free(r);
	/* And through gpucmd_read_buffer (inline at this size). */
	ck_assert_int_eq(gpucmd_read_buffer(c, 0, 1, 0, sizeof(out), out), 0);
	ck_assert_mem_eq(out, in, sizeof(out));
	ck_assert_int_eq(gpucmd_conn_error(c, NULL), 0);
}

START_TEST(fork_child_is_refused)
{
	struct gpucmd_conn *c = connect_as("alpha");
	struct gpucmd_service_report t;
	struct gpucmd_response *r;
	struct gpucmd_status st;
	struct gpucmd_batch *b;
	struct fork_seen seen;
	char want[128];
	uint64_t pending;
	uint8_t *region;
	void *p = NULL;
	int res[2], go[2], wst = 0;
	pid_t pid;

	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_empty(b, 1, 64);
	gpucmd_response_free(run_ok(b));
	ck_assert_int_eq(gpucmd_region_create(c, 7, 4096, &p), 0);
	region = p;
	memset(region, 0xaa, 4096);
	/* Outstanding across the fork: its answer is the parent's. */
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_ping(b);
	ck_assert_int_eq(gpucmd_submit(b, &pending), 0);
	ck_assert_int_eq(pipe(res), 0);
	ck_assert_int_eq(pipe(go), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		close(res[0]);
		close(go[1]);
		fork_child(c, pending, res[1], go[0]);
	}
	close(res[1]);
	close(go[0]);
	/* Ping while the child tries its 200 submits. */
	ck_assert_int_eq(write(go[1], "g", 1), 1);
	for (int i = 0; i < 200; i++) {
		gpucmd_batch_new(c, 0, &b);
		gpucmd_batch_ping(b);
		gpucmd_response_free(run_ok(b));
	}
	ck_assert_int_eq(read(res[0], &seen, sizeof(seen)),
			 (ssize_t)sizeof(seen));
	ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
	ck_assert(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
	close(res[0]);
	close(go[1]);

	ck_assert_int_eq(seen.submit, GPUCMD_EINVAL);
	snprintf(want, sizeof(want), FORK_SENTENCE "%ld, not this one (%ld)",
		 (long)getpid(), (long)pid);
	ck_assert_msg(strstr(seen.message, want) == seen.message, "message: %s",
		      seen.message);
	ck_assert_msg(strstr(seen.message, "gpucmd_connect") != NULL,
		      "message: %s", seen.message);
	ck_assert_str_eq(seen.region_message, seen.message);
	ck_assert_int_eq(seen.wait, GPUCMD_EINVAL);
	ck_assert_int_eq(seen.run, GPUCMD_EINVAL);
	ck_assert_int_eq(seen.status, GPUCMD_EINVAL);
	ck_assert_int_eq(seen.report, GPUCMD_EINVAL);
	ck_assert_int_eq(seen.cleanup, GPUCMD_EINVAL);
	ck_assert_int_eq(seen.conn_error, GPUCMD_EINVAL);
	ck_assert_int_eq(seen.region_create, GPUCMD_EINVAL);
	ck_assert_int_eq(seen.region_release, GPUCMD_EINVAL);
	ck_assert_int_eq(seen.write_buffer, GPUCMD_EINVAL);
	ck_assert_int_eq(seen.read_buffer, GPUCMD_EINVAL);
	ck_assert_int_eq(seen.create_buffer, GPUCMD_EINVAL);
	ck_assert_int_eq(seen.refused_in_loop, 200);
	ck_assert_int_eq(seen.own_connect, 0);
	ck_assert_int_eq(seen.own_bytes_ok, 1);
	ck_assert_int_eq(seen.own_connections, 2);

	/* The parent's: its request answered here, everything in its place. */
	ck_assert_int_eq(gpucmd_wait(c, pending, &r), 0);
	ck_assert_int_eq(gpucmd_response_error(r), 0);
	gpucmd_response_free(r);
	parent_still_works(c, 11);
	ck_assert_uint_eq(region[0], 0xaa);
	ck_assert_uint_eq(region[4095], 0xaa);
	ck_assert_int_eq(gpucmd_status(c, &st), 0);
	ck_assert_uint_eq(st.connections, 1);
	t = report_totals(c);
	/* Handle 1 only: not the child's 9, nor its own connection's. */
	ck_assert_uint_eq(t.bytes_in_use, 64);
	ck_assert_uint_eq(t.allocations, 1);
	ck_assert_uint_eq(t.connections, 1);
	/* Region 7: not the child's 8, nor a scratch region of its writes. */
	ck_assert_uint_eq(t.regions, 1);
	ck_assert_uint_eq(t.region_bytes, 4096);
	ck_assert_int_eq(gpucmd_region_release(c, 7), 0);
	gpucmd_close(c);
}
END_TEST

/* A child that leaves without gpucmd_close, by exit or by _exit. */
START_TEST(fork_child_exits_without_close)
{
	struct gpucmd_conn *c = connect_as("alpha");
	struct gpucmd_batch *b;
	struct gpucmd_status st;

	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_empty(b, 1, 64);
	gpucmd_response_free(run_ok(b));
	for (int how = 0; how < 2; how++) {
		int wst = 0;
		pid_t pid = fork();

		ck_assert_int_ge(pid, 0);
		if (pid == 0) {
			if (how == 0)
				exit(0); /* atexit handlers, stdio flushed */
			_exit(0);
		}
		ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
		ck_assert(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
		parent_still_works(c, (uint8_t)(40 + how));
	}
	ck_assert_int_eq(gpucmd_status(c, &st), 0);
	ck_assert_uint_eq(st.connections, 1);
	ck_assert_uint_eq(st.bytes_in_use, 64);
	gpucmd_close(c);
}
END_TEST

/* The daemon's count of connections, as conn sees it (at most 5 s). */
static void wait_connections(struct gpucmd_conn *conn, uint32_t want)
{
	struct gpucmd_status st = { 0 };

	for (int i = 0; i < 500; i++) {
		ck_assert_int_eq(gpucmd_status(conn, &st), 0);
		if (st.connections == want)
			return;
		usleep(10000);
	}
	ck_abort_msg("the daemon counts %u connections, not %u", st.connections,
		     want);
}

/*
 * The parent closes while its child still holds the inherited descriptor
 * (a prefork master and its workers): the daemon ends the connection and
 * frees what it held at once, not when the last worker exits.
 */
START_TEST(fork_parent_close_ends_connection)
{
	struct gpucmd_conn *c = connect_as("alpha");
	struct gpucmd_conn *o = connect_as("beta");
	struct gpucmd_service_report t;
	struct gpucmd_batch *b;
	int hold[2], wst = 0;
	void *p = NULL;
	pid_t pid;
	char x;

	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_empty(b, 1, 4096);
	gpucmd_response_free(run_ok(b));
	ck_assert_int_eq(gpucmd_region_create(c, 7, 8192, &p), 0);
	wait_connections(o, 2);
	ck_assert_int_eq(pipe(hold), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		/* Holds the descriptor until told, and never closes it. */
		close(hold[1]);
		_exit(read(hold[0], &x, 1) == 0 ? 0 : 1);
	}
	close(hold[0]);
	gpucmd_close(c);
	wait_connections(o, 1);
	for (int i = 0; i < 500; i++) {
		t = report_totals(o);
		if (t.bytes_in_use == 0 && t.regions == 0)
			break;
		usleep(10000);
	}
	ck_assert_uint_eq(t.bytes_in_use, 0);
	ck_assert_uint_eq(t.regions, 0);
	close(hold[1]);
	ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
	ck_assert(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
	gpucmd_close(o);
}
END_TEST

/*
 * A child that fork's handlers did not see (_Fork): gpucmd_close asks
 * getpid(), so it does not shut the parent's connection down, and the
 * region and transfer calls are refused.
 */
START_TEST(fork_unseen_child_leaves_the_parent_alone)
{
	struct gpucmd_conn *c = connect_as("alpha");
	struct gpucmd_batch *b;
	int wst = 0;
	pid_t pid;

	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_empty(b, 1, 64);
	gpucmd_response_free(run_ok(b));
	pid = _Fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		uint8_t big[64] = { 0 };
		void *p = NULL;
		int rc = 0;

		if (gpucmd_region_create(c, 8, 4096, &p) != GPUCMD_EINVAL)
			rc |= 1;
		if (gpucmd_write_buffer(c, 0, 1, 0, big, sizeof(big)) !=
		    GPUCMD_EINVAL)
			rc |= 2;
		gpucmd_close(c);
		_exit(rc);
	}
	ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
	ck_assert_msg(WIFEXITED(wst) && WEXITSTATUS(wst) == 0,
		      "the child saw %d", WEXITSTATUS(wst));
	parent_still_works(c, 77);
	gpucmd_close(c);
}
END_TEST

/*
 * A child does not inherit the connection's regions (MADV_DONTFORK): a
 * pointer into one names nothing there, so a write through it faults
 * instead of changing the parent's bytes the daemon copies from.  And a
 * gpucmd_close in the child unmaps nothing: what the child mapped since at
 * those addresses is its own.
 */
START_TEST(fork_child_inherits_no_region)
{
	struct gpucmd_conn *c = connect_as("alpha");
	const size_t len = 64 * 1024;
	struct gpucmd_batch *b;
	uint8_t *p = NULL;
	int wst = 0;
	pid_t pid;

	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_empty(b, 1, 64);
	gpucmd_response_free(run_ok(b));
	ck_assert_int_eq(gpucmd_region_create(c, 5, len, (void **)&p), 0);
	memset(p, 0x5a, len);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		/* The range is free here: a fixed mapping that may not
		 * replace anything gets it. */
		uint8_t *q =
			mmap(p, len, PROT_READ | PROT_WRITE,
			     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
			     -1, 0);

		if (q != p)
			_exit(1);
		q[0] = 0x11;
		q[len - 1] = 0x22;
		gpucmd_close(c);
		/* Still the child's own. */
		_exit(q[0] == 0x11 && q[len - 1] == 0x22 ? 0 : 2);
	}
	ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
	ck_assert_msg(WIFEXITED(wst) && WEXITSTATUS(wst) == 0,
		      "the child saw %d", WEXITSTATUS(wst));
	for (size_t i = 0; i < len; i++)
		ck_assert_uint_eq(p[i], 0x5a);
	parent_still_works(c, 78);
	ck_assert_int_eq(gpucmd_region_release(c, 5), 0);
	gpucmd_close(c);
}
END_TEST

/*
 * Detached batches: nobody waits for them, their answers are read in by
 * later calls, and a failure is counted with the first one's code and
 * sentence.  Once a later batch of that stream that waits (a read) was
 * answered, their answers came before it, and the count is complete.
 */
START_TEST(detached_batches_count_their_failures)
{
	struct gpucmd_conn *c = connect_as("alpha");
	struct gpucmd_batch *b;
	char msg[640];
	int code = -1;

	ck_assert_uint_eq(gpucmd_detached_failures(c, &code, msg, sizeof(msg)),
			  0);
	ck_assert_int_eq(code, 0);
	ck_assert_str_eq(msg, "");
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_empty(b, 1, 64);
	ck_assert_int_eq(gpucmd_submit_detached(b), 0);
	for (int i = 0; i < 2000; i++) {
		gpucmd_batch_new(c, 0, &b);
		gpucmd_batch_ping(b);
		ck_assert_int_eq(gpucmd_submit_detached(b), 0);
	}
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_release(b, 99);
	ck_assert_int_eq(gpucmd_submit_detached(b), 0);
	gpucmd_batch_new(c, 0, &b);
	gpucmd_batch_write(b, 1, 64, "x", 1); /* past the end */
	ck_assert_int_eq(gpucmd_submit_detached(b), 0);
	/* A batch refused by its builder is not sent, and says so now. */
	gpucmd_batch_new(c, 0, &b);
	ck_assert_int_eq(gpucmd_batch_empty(b, 0, 64), GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_submit_detached(b), GPUCMD_EINVAL);
	/* Answered after them on the same stream: they are counted. */
	parent_still_works(c, 9);
	ck_assert_uint_eq(gpucmd_detached_failures(c, &code, msg, sizeof(msg)),
			  2);
	ck_assert_int_eq(code, GPUCMD_ENOTFOUND);
	ck_assert_msg(strstr(msg, "detached request") != NULL &&
			      strstr(msg, "at op 0") != NULL &&
			      strstr(msg, "handle 99") != NULL,
		      "%s", msg);
	/* Asking starts the count again. */
	ck_assert_uint_eq(gpucmd_detached_failures(c, NULL, NULL, 0), 0);
	gpucmd_close(c);
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("clients");
	TCase *tc = tcase_create("clients");

	tcase_add_checked_fixture(tc, harness_setup, harness_teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, four_clients_at_once);
	tcase_add_test(tc, killed_mid_batch_leaves_nothing);
	tcase_add_test(tc, killed_at_random_points);
	tcase_add_test(tc, slow_sync_does_not_block_others);
	tcase_add_test(tc, many_small_copies_do_not_block_others);
	tcase_add_test(tc, pipelined_large_and_small_keep_order);
	tcase_add_test(tc, closed_with_frames_waiting_for_their_turn);
	tcase_add_test(tc, killed_with_frames_waiting_for_their_turn);
	suite_add_tcase(s, tc);

	tc = tcase_create("timeouts");
	tcase_add_checked_fixture(tc, harness_setup, harness_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, wait_timeout_keeps_the_request);
	tcase_add_test(tc, run_timeout_drops_the_late_answer);
	tcase_add_test(tc, transfer_timeout_closes_the_connection);
	tcase_add_test(tc, connect_timeout_on_a_silent_listener);
	tcase_add_test(tc, zero_timeout_collects_what_arrived);
	tcase_add_test(tc, responses_freed_after_close_keep_no_buffers);
	tcase_add_test(tc, abandoned_answers_give_their_places_back);
	tcase_add_test(tc, detached_batches_count_their_failures);
	tcase_add_test(tc, send_timeout_on_a_stopped_daemon);
	suite_add_tcase(s, tc);

	tc = tcase_create("fork");
	tcase_add_checked_fixture(tc, harness_setup, harness_teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, fork_child_is_refused);
	tcase_add_test(tc, fork_child_exits_without_close);
	tcase_add_test(tc, fork_parent_close_ends_connection);
	tcase_add_test(tc, fork_unseen_child_leaves_the_parent_alone);
	tcase_add_test(tc, fork_child_inherits_no_region);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return harness_main(make_suite());
}
