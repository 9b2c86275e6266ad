/*
 * test_detached.c - detached batches (gpucmd_submit_detached) as a service
 * uses them: mixed with submits and waits on several streams, by the
 * hundred thousand without a wait, next to runs whose wait timed out,
 * refused as gpucmd_submit refuses, counted when asked, on a connection
 * that ends under them, in a child of fork(), and on a connection per
 * thread.  Every count gpucmd_detached_failures gives is asserted
 * exactly.
 */
#include <pthread.h>

#include "harness.h"

static const uint32_t GRID[3] = { 1, 1, 1 };
static const uint32_t BLOCK[3] = { 1, 1, 1 };

/* A daemon with these [limits] (config text), for one test. */
static void start_with(const char *text)
{
	char path[192];

	harness_config(text, path, sizeof(path));
	daemon_start_args(&the_daemon, "--config", path, NULL);
}

/* Submit a batch that spins stream for usec, then syncs; its id. */
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

/* A detached batch on stream that fails: a release of a handle not held. */
static void detach_bad_release(struct gpucmd_conn *c, uint32_t stream,
			       uint64_t handle)
{
	struct gpucmd_batch *b;

	ck_assert_int_eq(gpucmd_batch_new(c, stream, &b), 0);
	ck_assert_int_eq(gpucmd_batch_release(b, handle), 0);
	ck_assert_int_eq(gpucmd_submit_detached(b), 0);
}

static void detach_ping(struct gpucmd_conn *c)
{
	struct gpucmd_batch *b;

	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_ping(b), 0);
	ck_assert_int_eq(gpucmd_submit_detached(b), 0);
}

/* A sync of stream, run to its answer: what was detached there before is
 * answered. */
static void sync_stream(struct gpucmd_conn *c, uint32_t stream)
{
	struct gpucmd_batch *b;

	ck_assert_int_eq(gpucmd_batch_new(c, stream, &b), 0);
	ck_assert_int_eq(gpucmd_batch_sync(b), 0);
	gpucmd_response_free(run_ok(b));
}

/* A batch that writes 8 bytes of v to handle and reads them back. */
static uint64_t submit_echo(struct gpucmd_conn *c, uint32_t stream,
			    uint64_t handle, uint64_t v)
{
	struct gpucmd_batch *b;
	uint64_t id;

	ck_assert_int_eq(gpucmd_batch_new(c, stream, &b), 0);
	ck_assert_int_eq(gpucmd_batch_write(b, handle, 0, &v, sizeof(v)), 0);
	ck_assert_int_eq(gpucmd_batch_read(b, handle, 0, sizeof(v)), 0);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	return id;
}

/* Wait for an echo of v and insist that it carries v. */
static void wait_echo(struct gpucmd_conn *c, uint64_t id, uint64_t v)
{
	struct gpucmd_response *r = NULL;
	const void *data;
	size_t len;
	uint64_t got;

	ck_assert_int_eq(gpucmd_wait(c, id, &r), 0);
	ck_assert_int_eq(gpucmd_response_error(r), 0);
	ck_assert_int_eq(gpucmd_response_data(r, 1, &data, &len), 0);
	ck_assert_uint_eq(len, sizeof(got));
	memcpy(&got, data, sizeof(got));
	ck_assert_uint_eq(got, v);
	gpucmd_response_free(r);
}

/*
 * Detached batches on two streams, among echoes that are submitted and
 * waited for out of order (some waits read detached answers in before
 * their own): every echo gets its own bytes, and the failures counted,
 * asked for now and then and once both streams are synced, add up to
 * exactly the ones detached.
 */
START_TEST(mixed_with_waits_on_two_streams)
{
	enum { ROUNDS = 600, PEND = 5 };
	struct gpucmd_conn *c = connect_as("mixed");
	struct gpucmd_batch *b;
	uint64_t ids[PEND], vals[PEND], failed = 0, counted = 0;
	unsigned npend = 0;
	char msg[640];
	int code;

	for (uint32_t s = 0; s < 2; s++) {
		ck_assert_int_eq(gpucmd_batch_new(c, s, &b), 0);
		gpucmd_batch_empty(b, 10 + s, 64);
		gpucmd_batch_empty(b, 20 + s, 64);
		gpucmd_response_free(run_ok(b));
	}
	for (unsigned i = 0; i < ROUNDS; i++) {
		uint32_t s = i % 2;
		uint64_t v = 1000 + i;

		if (i % 7 == 0) {
			detach_bad_release(c, s, 900 + i);
			failed++;
		} else {
			ck_assert_int_eq(gpucmd_batch_new(c, s, &b), 0);
			ck_assert_int_eq(gpucmd_batch_write(b, 10 + s, 8, &v,
							    sizeof(v)),
					 0);
			ck_assert_int_eq(gpucmd_submit_detached(b), 0);
		}
		if (i % 3 == 0) {
			ids[npend] = submit_echo(c, 1 - s, 20 + (1 - s), v);
			vals[npend++] = v;
		}
		/* Full: the newest first, then the oldest. */
		if (npend == PEND) {
			wait_echo(c, ids[PEND - 1], vals[PEND - 1]);
			for (unsigned k = 0; k < PEND - 1; k++)
				wait_echo(c, ids[k], vals[k]);
			npend = 0;
		}
		if (i % 50 == 49)
			counted += gpucmd_detached_failures(c, NULL, NULL, 0);
	}
	for (unsigned k = 0; k < npend; k++)
		wait_echo(c, ids[k], vals[k]);
	sync_stream(c, 0);
	sync_stream(c, 1);
	counted += gpucmd_detached_failures(c, &code, msg, sizeof(msg));
	ck_assert_uint_eq(counted, failed);
	ck_assert_int_eq(gpucmd_detached_failures(c, &code, msg, sizeof(msg)),
			 0);
	ck_assert_int_eq(code, 0);
	ck_assert_str_eq(msg, "");
	/* The last detached write of each stream is in its buffer. */
	for (uint32_t s = 0; s < 2; s++) {
		uint64_t got = 0, want = 1000 + (ROUNDS - 2 + s);

		ck_assert_int_eq(gpucmd_read_buffer(c, s, 10 + s, 8,
						    sizeof(got), &got),
				 0);
		ck_assert_uint_eq(got, want);
	}
	ck_assert_int_eq(gpucmd_conn_error(c, NULL), 0);
	gpucmd_close(c);
}
END_TEST

/*
 * 100 000 detached batches and no wait (10 000 with the daemon under
 * valgrind), under max_in_flight = 64 and the least max_pending_bytes: the
 * library reads their answers as it goes, so no submit is refused for
 * want of places, the daemon never holds 64 KiB of unread answers for it
 * (it would close the connection), and nothing waits on anything.
 */
START_TEST(many_without_a_wait_stay_bounded)
{
	bool slow = getenv("GPUCMD_TEST_VALGRIND") != NULL;
	unsigned N = slow ? 10000 : 100000;
	struct gpucmd_conn *c;
	struct gpucmd_status st;
	uint64_t t0, took;
	char msg[640];
	int code;

	start_with("[limits]\nmax_in_flight = 64\nmax_pending_bytes = 64K\n");
	c = connect_as("many");
	ck_assert_uint_eq(gpucmd_info(c)->max_in_flight, 64);
	t0 = harness_now_us();
	for (unsigned i = 0; i < N; i++) {
		if (i % 1000 == 999)
			detach_bad_release(c, 0, 5000 + i);
		else
			detach_ping(c);
	}
	took = harness_now_us() - t0;
	ck_assert_int_eq(gpucmd_conn_error(c, NULL), 0);
	sync_stream(c, 0);
	ck_assert_uint_eq(gpucmd_detached_failures(c, &code, msg, sizeof(msg)),
			  N / 1000);
	ck_assert_int_eq(code, GPUCMD_ENOTFOUND);
	ck_assert_msg(strstr(msg, "handle 5999") != NULL, "%s", msg);
	ck_assert_int_eq(gpucmd_status(c, &st), 0);
	ck_assert_uint_eq(st.connections, 1);
	/* About 0.5 s here; a stall of seconds would be a client waiting. */
	ck_assert_msg(slow || took < 10000000,
		      "%u detached batches took %llu us", N,
		      (unsigned long long)took);
	gpucmd_close(c);
}
END_TEST

/*
 * The same with answers that bring data (a detached read of 4 KiB each,
 * 5000 of them, 20 MiB in all): under max_in_flight = 8 and the least
 * max_pending_bytes, a client that only detaches keeps reading them, so
 * the daemon never holds 64 KiB for it and closes nothing.  (The answers
 * a client leaves unread are at most max_in_flight of them, as with
 * submits it waits for later: under the default 1024 in flight, answers
 * of 4 KiB can pass a max_pending_bytes of 64 KiB either way.)
 */
START_TEST(answers_with_data_stay_bounded)
{
	enum { N = 5000 };
	struct gpucmd_conn *c;
	struct gpucmd_batch *b;
	const char *why = "";

	start_with("[limits]\nmax_in_flight = 8\nmax_pending_bytes = 64K\n");
	c = connect_as("many");
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_empty(b, 1, 4096);
	gpucmd_response_free(run_ok(b));
	for (unsigned i = 0; i < N; i++) {
		int rc;

		ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
		ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, 4096), 0);
		rc = gpucmd_submit_detached(b);
		(void)gpucmd_conn_error(c, &why);
		ck_assert_msg(rc == 0, "detached read %u: %s (%s)", i,
			      gpucmd_errname(rc), why);
	}
	sync_stream(c, 0);
	ck_assert_uint_eq(gpucmd_detached_failures(c, NULL, NULL, 0), 0);
	ck_assert_int_eq(gpucmd_conn_error(c, NULL), 0);
	gpucmd_close(c);
}
END_TEST

/*
 * gpucmd_detached_failures is what a service polls: the failures whose
 * answers have come are counted by it, not only after a later wait or
 * the 32nd detached submit.
 */
START_TEST(failures_counted_when_asked)
{
	struct gpucmd_conn *c = connect_as("asked");
	char msg[640];
	int code = 0;
	uint64_t n = 0;

	detach_bad_release(c, 0, 77);
	/* Ask until the answer has come (the daemon answers at once). */
	for (int i = 0; i < 2000 && n == 0; i++) {
		n = gpucmd_detached_failures(c, &code, msg, sizeof(msg));
		if (n == 0)
			usleep(5000);
	}
	ck_assert_uint_eq(n, 1);
	ck_assert_int_eq(code, GPUCMD_ENOTFOUND);
	ck_assert_msg(strstr(msg, "handle 77") != NULL, "%s", msg);
	ck_assert_int_eq(gpucmd_conn_error(c, NULL), 0);
	gpucmd_close(c);
}
END_TEST

/*
 * A run whose wait timed out leaves an abandoned answer that is not a
 * detached one: when it comes, failed (its kernel faulted the stream), it
 * is dropped and not counted; the
 * detached failures around it are, each once.  Its place and theirs come
 * back: under max_in_flight = 4, four submits then fit, and the fifth is
 * refused at once (a count of abandoned answers left behind would make it
 * wait for answers that never come).
 */
START_TEST(abandoned_runs_are_not_counted)
{
	struct gpucmd_conn *c;
	struct gpucmd_response *r = NULL;
	struct gpucmd_arg spin = { .kind = GPUCMD_ARG_U32, .v.u32 = 300000 };
	struct gpucmd_batch *b;
	uint64_t ids[4], id, t0;
	char msg[640];
	int code;

	start_with("[limits]\nmax_in_flight = 4\n");
	c = connect_as("abandon");
	detach_bad_release(c, 0, 41);
	gpucmd_set_timeout(c, 50);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_kernel(b, "spin", GRID, BLOCK, &spin, 1);
	gpucmd_batch_kernel(b, "fault", GRID, BLOCK, NULL, 0);
	gpucmd_batch_sync(b);
	ck_assert_int_eq(gpucmd_run(b, &r), -ETIMEDOUT);
	ck_assert_ptr_null(r);
	detach_bad_release(c, 0, 43);
	gpucmd_set_timeout(c, -1);
	sync_stream(c, 0);
	ck_assert_uint_eq(gpucmd_detached_failures(c, &code, msg, sizeof(msg)),
			  2);
	ck_assert_int_eq(code, GPUCMD_ENOTFOUND);
	ck_assert_msg(strstr(msg, "handle 41") != NULL, "%s", msg);
	/* Every place is free again. */
	for (int k = 0; k < 4; k++) {
		ck_assert_int_eq(gpucmd_batch_new(c, 1, &b), 0);
		gpucmd_batch_ping(b);
		ck_assert_int_eq(gpucmd_submit(b, &ids[k]), 0);
	}
	gpucmd_set_timeout(c, 2000);
	t0 = harness_now_us();
	ck_assert_int_eq(gpucmd_batch_new(c, 1, &b), 0);
	gpucmd_batch_ping(b);
	ck_assert_int_eq(gpucmd_submit(b, &id), GPUCMD_ELIMIT);
	ck_assert_uint_lt(harness_now_us() - t0, 500000);
	for (int k = 3; k >= 0; k--) {
		ck_assert_int_eq(gpucmd_wait(c, ids[k], &r), 0);
		ck_assert_int_eq(gpucmd_response_error(r), 0);
		gpucmd_response_free(r);
	}
	/* A detached id is nobody's to wait for. */
	detach_ping(c);
	ck_assert_int_eq(gpucmd_wait_timeout(c, ids[3] + 1, 100, &r),
			 GPUCMD_EINVAL);
	ck_assert_uint_eq(gpucmd_detached_failures(c, NULL, NULL, 0), 0);
	gpucmd_close(c);
}
END_TEST

/*
 * Detached batches still waiting behind a spin when the connection is
 * evicted get no answer: each is counted as failed, with the connection's
 * code and why, not lost without a word.
 */
START_TEST(evicted_with_detached_outstanding)
{
	struct gpucmd_conn *c = connect_as("evicted");
	struct gpucmd_conn *admin = connect_as("evicted");
	struct gpucmd_batch *b;
	uint64_t count = 0, n = 0;
	char msg[640];
	int code = 0;

	(void)submit_spin(c, 0, 300000);
	for (int i = 0; i < 5; i++) {
		ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
		gpucmd_batch_sync(b);
		ck_assert_int_eq(gpucmd_submit_detached(b), 0);
	}
	ck_assert_int_eq(gpucmd_evict(admin, NULL,
				      gpucmd_info(c)->connection_id, &count),
			 0);
	ck_assert_uint_eq(count, 1);
	/* Asking finds the connection gone, once the daemon closed it. */
	for (int i = 0; i < 2000 && n == 0; i++) {
		n = gpucmd_detached_failures(c, &code, msg, sizeof(msg));
		if (n == 0)
			usleep(5000);
	}
	ck_assert_uint_eq(n, 5);
	ck_assert_int_eq(code, GPUCMD_EDISCONNECTED);
	ck_assert_msg(strstr(msg, "no answer") != NULL &&
			      strstr(msg, "evicted") != NULL,
		      "%s", msg);
	ck_assert_int_eq(gpucmd_conn_error(c, NULL), GPUCMD_EDISCONNECTED);
	/* Counted once; a later detached submit is refused. */
	ck_assert_uint_eq(gpucmd_detached_failures(c, NULL, NULL, 0), 0);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_ping(b);
	ck_assert_int_eq(gpucmd_submit_detached(b), GPUCMD_EDISCONNECTED);
	ck_assert_uint_eq(gpucmd_detached_failures(c, NULL, NULL, 0), 0);
	gpucmd_close(c);
	gpucmd_close(admin);
}
END_TEST

/*
 * The daemon killed with detached batches out: the next look at the count
 * finds the connection gone, and counts them.
 */
START_TEST(daemon_gone_with_detached_outstanding)
{
	struct gpucmd_conn *c = connect_as("gone");
	struct gpucmd_batch *b;
	char msg[640];
	int code = 0;
	uint64_t n;

	(void)submit_spin(c, 0, 2000000);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
		gpucmd_batch_sync(b);
		ck_assert_int_eq(gpucmd_submit_detached(b), 0);
	}
	kill(the_daemon.pid, SIGKILL);
	ck_assert_int_eq(daemon_wait_exit(&the_daemon), 128 + SIGKILL);
	n = gpucmd_detached_failures(c, &code, msg, sizeof(msg));
	ck_assert_uint_eq(n, 3);
	ck_assert_int_eq(code, GPUCMD_EDISCONNECTED);
	ck_assert_msg(strstr(msg, "no answer") != NULL, "%s", msg);
	ck_assert_int_eq(gpucmd_conn_error(c, NULL), GPUCMD_EDISCONNECTED);
	gpucmd_close(c);
}
END_TEST

/* What gpucmd_submit refuses, gpucmd_submit_detached refuses alike. */
START_TEST(refused_like_submit)
{
	struct gpucmd_conn *c = connect_as("refused");
	struct gpucmd_batch *b;

	ck_assert_int_eq(gpucmd_submit_detached(NULL), GPUCMD_EINVAL);
	/* A builder's refusal: not sent, and said at once. */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_ping(b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 0, 64), GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_batch_ping(b), GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_submit_detached(b), GPUCMD_EINVAL);
	ck_assert_msg(strstr(gpucmd_last_message(c), "was not sent") != NULL &&
			      strstr(gpucmd_last_message(c), "op 1") != NULL,
		      "%s", gpucmd_last_message(c));
	/* An empty batch is a batch like any other: answered, no failure. */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_submit_detached(b), 0);
	sync_stream(c, 0);
	ck_assert_uint_eq(gpucmd_detached_failures(c, NULL, NULL, 0), 0);
	ck_assert_int_eq(gpucmd_conn_error(c, NULL), 0);
	gpucmd_close(c);
}
END_TEST

/*
 * In a child of fork(), a detached submit is refused as a submit is, and
 * the count is not the parent's: the child reads nothing from the
 * parent's socket, and the parent then counts its own failure.
 */
START_TEST(fork_child_is_refused)
{
	struct gpucmd_conn *c = connect_as("forked");
	struct gpucmd_batch *b;
	int res[2], st = 0;
	pid_t pid;
	char msg[640];
	int code = 0;

	detach_bad_release(c, 0, 61);
	sync_stream(c, 0); /* counted, not yet asked for */
	detach_bad_release(c, 0, 62);
	usleep(50000); /* its answer waits in the socket */
	ck_assert_int_eq(pipe(res), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int out[3];

		close(res[0]);
		out[0] = gpucmd_batch_new(c, 0, &b);
		if (out[0] == 0) {
			gpucmd_batch_ping(b);
			out[0] = gpucmd_submit_detached(b);
		}
		out[1] = strstr(gpucmd_last_message(c), "after fork()") != NULL;
		out[2] = (int)gpucmd_detached_failures(c, NULL, NULL, 0);
		_exit(write(res[1], out, sizeof(out)) == (ssize_t)sizeof(out) ?
			      0 :
			      1);
	}
	close(res[1]);
	{
		int out[3];

		ck_assert_int_eq(read(res[0], out, sizeof(out)),
				 (ssize_t)sizeof(out));
		ck_assert_int_eq(out[0], GPUCMD_EINVAL);
		ck_assert_int_eq(out[1], 1);
		ck_assert_int_eq(out[2], 0);
	}
	close(res[0]);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	ck_assert_uint_eq(gpucmd_detached_failures(c, &code, msg, sizeof(msg)),
			  2);
	ck_assert_msg(strstr(msg, "handle 61") != NULL, "%s", msg);
	ck_assert_int_eq(gpucmd_conn_error(c, NULL), 0);
	gpucmd_close(c);
}
END_TEST

/*
 * A stream fault is reported once, at the stream's next sync or read: a
 * detached one takes it, so it shows in the count (GPUCMD_ESTREAM) and
 * not in the sync waited for after it.  Without a detached sync in
 * between, the waited sync gets it.
 */
START_TEST(detached_sync_takes_the_fault)
{
	struct gpucmd_conn *c = connect_as("fault");
	struct gpucmd_response *r = NULL;
	struct gpucmd_batch *b;
	char msg[640];
	int code = 0;

	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_kernel(b, "fault", GRID, BLOCK, NULL, 0);
	ck_assert_int_eq(gpucmd_submit_detached(b), 0);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_sync(b);
	ck_assert_int_eq(gpucmd_submit_detached(b), 0);
	sync_stream(c, 0);
	ck_assert_uint_eq(gpucmd_detached_failures(c, &code, msg, sizeof(msg)),
			  1);
	ck_assert_int_eq(code, GPUCMD_ESTREAM);
	/* The same fault with no detached sync: the waited sync has it. */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_kernel(b, "fault", GRID, BLOCK, NULL, 0);
	ck_assert_int_eq(gpucmd_submit_detached(b), 0);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	gpucmd_batch_sync(b);
	ck_assert_int_eq(gpucmd_run(b, &r), 0);
	ck_assert_int_eq(gpucmd_response_error(r), GPUCMD_ESTREAM);
	gpucmd_response_free(r);
	ck_assert_uint_eq(gpucmd_detached_failures(c, NULL, NULL, 0), 0);
	gpucmd_close(c);
}
END_TEST

/* One thread's connection: its own detached batches and count. */
struct counter {
	pthread_t thread;
	unsigned fail_every; /* one detached batch in this many fails */
	uint64_t failed;     /* how many were made to fail */
	uint64_t counted;    /* what gpucmd_detached_failures said */
	int code;	     /* 0, or where it went wrong */
};

static void *count_alone(void *arg)
{
	struct counter *t = arg;
	struct gpucmd_conn *c = NULL;
	struct gpucmd_response *r = NULL;
	struct gpucmd_batch *b;

	if (gpucmd_connect(the_daemon.sock, "threads", &c, NULL, 0) != 0) {
		t->code = 1;
		return NULL;
	}
	for (unsigned i = 0; i < 2000 && t->code == 0; i++) {
		if (gpucmd_batch_new(c, 0, &b) != 0) {
			t->code = 2;
			break;
		}
		if (i % t->fail_every == 0) {
			gpucmd_batch_release(b, 100 + i);
			t->failed++;
		} else {
			gpucmd_batch_ping(b);
		}
		if (gpucmd_submit_detached(b) != 0)
			t->code = 3;
		if (i % 100 == 99)
			t->counted +=
				gpucmd_detached_failures(c, NULL, NULL, 0);
	}
	if (t->code == 0 && gpucmd_batch_new(c, 0, &b) == 0) {
		gpucmd_batch_sync(b);
		if (gpucmd_run(b, &r) != 0 || gpucmd_response_error(r) != 0)
			t->code = 4;
		gpucmd_response_free(r);
	}
	t->counted += gpucmd_detached_failures(c, NULL, NULL, 0);
	gpucmd_close(c);
	return NULL;
}

/*
 * Different connections may be used by different threads at once
 * (libgpucmd.3): four threads detaching on a connection each count
 * exactly their own failures, none of another's.
 */
START_TEST(threads_each_count_their_own)
{
	struct counter t[4];

	for (unsigned k = 0; k < 4; k++) {
		t[k] = (struct counter){ .fail_every = 3 + 4 * k };
		ck_assert_int_eq(pthread_create(&t[k].thread, NULL, count_alone,
						&t[k]),
				 0);
	}
	for (unsigned k = 0; k < 4; k++) {
		ck_assert_int_eq(pthread_join(t[k].thread, NULL), 0);
		ck_assert_msg(t[k].code == 0, "thread %u: step %d failed", k,
			      t[k].code);
		ck_assert_uint_eq(t[k].failed, (2000 + t[k].fail_every - 1) /
						       t[k].fail_every);
		ck_assert_uint_eq(t[k].counted, t[k].failed);
	}
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("detached");
	TCase *tc = tcase_create("detached");

	tcase_add_checked_fixture(tc, harness_setup, harness_teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, mixed_with_waits_on_two_streams);
	tcase_add_test(tc, failures_counted_when_asked);
	tcase_add_test(tc, evicted_with_detached_outstanding);
	tcase_add_test(tc, refused_like_submit);
	tcase_add_test(tc, fork_child_is_refused);
	tcase_add_test(tc, threads_each_count_their_own);
	tcase_add_test(tc, detached_sync_takes_the_fault);
	suite_add_tcase(s, tc);

	/* Each starts a daemon with limits of its own (start_with). */
	tc = tcase_create("limits");
	tcase_add_checked_fixture(tc, NULL, harness_teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, many_without_a_wait_stay_bounded);
	tcase_add_test(tc, answers_with_data_stay_bounded);
	tcase_add_test(tc, abandoned_runs_are_not_counted);
	suite_add_tcase(s, tc);

	tc = tcase_create("gone");
	tcase_add_checked_fixture(tc, harness_setup, harness_teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, daemon_gone_with_detached_outstanding);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return harness_main(make_suite());
}
