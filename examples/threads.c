/*
 * threads.c - a multi-threaded service on gpucmd.
 *
 * A connection, and the batches and responses made from it, belong to
 * one thread at a time and the library takes no locks, so each worker
 * thread opens a connection of its own (all of them speaking for the same
 * service, whose quota and memory report they share).  Handles mean
 * something only on their connection: a thread cannot name another
 * thread's buffers, so each uploads what it needs.
 *
 * Within its connection each worker uses two streams, as a PyTorch
 * program would use a side stream: stream 1 produces a (a slow kernel,
 * then a fill and a scale), stream 2 consumes it (o = a + b) and reduces
 * o.  The two batches are submitted back to back without waiting: the
 * daemon orders stream 2's use of a behind stream 1's last write of it on
 * the device (no event to record, no host wait), so the sum is right.
 * Each worker checks every element and the sum.  Prints "OK" and exits 0,
 * else says what failed and exits 1.
 *
 *   cc -o threads threads.c -Iinclude build/libgpucmd.a \
 *	$(pkg-config --libs libprotobuf-c) -lpthread
 *   GPUCMD_SOCKET=/run/gpucmd/gpucmd.sock ./threads [threads] [rounds]
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gpucmd.h>

#define N 4096
#define BYTES (N * sizeof(float))
#define MAX_THREADS 16

enum { H_A = 1, H_B, H_O, H_SUM };
enum { PRODUCER = 1, CONSUMER = 2 }; /* stream numbers */

struct worker {
	pthread_t thread;
	unsigned index;
	unsigned rounds;
	int failed;
	char error[512];
};

static const uint32_t grid[3] = { 16, 1, 1 }, block[3] = { 256, 1, 1 };

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

/*
 * Record a call's failure in w->error, with the daemon's sentence, or the
 * library's when it sent nothing (a builder refused one of the batch's ops).
 */
static int fail_rc(struct worker *w, struct gpucmd_conn *conn, const char *what,
		   int rc)
{
	const char *why = "";

	if (conn && gpucmd_conn_error(conn, &why))
		snprintf(w->error, sizeof(w->error),
			 "%s: %s (connection closed: %s)", what,
			 gpucmd_errname(rc), why);
	else
		snprintf(w->error, sizeof(w->error), "%s: %s (%s)%s%s", what,
			 gpucmd_errname(rc), gpucmd_strerror(rc),
			 conn && *gpucmd_last_message(conn) ? ": " : "",
			 conn ? gpucmd_last_message(conn) : "");
	return -1;
}

/* 0 when the batch succeeded, else its failure in w->error. */
static int fail_response(struct worker *w, struct gpucmd_response *r,
			 const char *what)
{
	int rc = gpucmd_response_error(r);

	if (rc == 0)
		return 0;
	snprintf(w->error, sizeof(w->error), "%s: op %d: %s: %s", what,
		 gpucmd_response_failed_index(r), gpucmd_errname(rc),
		 gpucmd_response_message(r));
	return -1;
}

/* One round: produce a on stream 1, consume it on stream 2, check. */
static int round_trip(struct worker *w, struct gpucmd_conn *conn,
		      unsigned round)
{
	/*
	 * a = 3 * (worker + round), b = round, o = a + b: small integers,
	 * exact in float, and different every round, so that a consumer
	 * that ran before the producer would read a wrong value.
	 */
	float k = (float)(w->index + 1 + round), want = k * 3 + (float)round;
	struct gpucmd_arg spin[] = { gpucmd_arg_u32(500) };
	struct gpucmd_arg fill_a[] = { gpucmd_arg_buffer(H_A),
				       gpucmd_arg_u32(f32_bits(k)),
				       gpucmd_arg_u32(N) };
	struct gpucmd_arg scale_a[] = { gpucmd_arg_buffer(H_A),
					gpucmd_arg_f32(3), gpucmd_arg_u32(N) };
	struct gpucmd_arg fill_b[] = { gpucmd_arg_buffer(H_B),
				       gpucmd_arg_u32(f32_bits((float)round)),
				       gpucmd_arg_u32(N) };
	struct gpucmd_arg add[] = { gpucmd_arg_buffer(H_O),
				    gpucmd_arg_buffer(H_A),
				    gpucmd_arg_buffer(H_B), gpucmd_arg_u32(N) };
	struct gpucmd_arg sum[] = { gpucmd_arg_buffer(H_SUM),
				    gpucmd_arg_buffer(H_O), gpucmd_arg_u32(N) };
	struct gpucmd_batch *p, *c;
	struct gpucmd_response *r;
	uint64_t pid, cid;
	const void *data;
	size_t len;
	float s;
	int rc;

	/*
	 * Producer: a slow kernel first, so that the consumer's batch
	 * reaches the daemon while a is still being written.
	 */
	if ((rc = gpucmd_batch_new(conn, PRODUCER, &p)) < 0)
		return fail_rc(w, conn, "batch_new", rc);
	gpucmd_batch_kernel(p, "spin", NULL, NULL, spin, 1);
	gpucmd_batch_kernel(p, "fill_u32", grid, block, fill_a, 3);
	gpucmd_batch_kernel(p, "scale_f32", grid, block, scale_a, 3);
	/* Consumer: no sync, no event; the daemon orders it behind a. */
	if ((rc = gpucmd_batch_new(conn, CONSUMER, &c)) < 0) {
		gpucmd_batch_free(p);
		return fail_rc(w, conn, "batch_new", rc);
	}
	gpucmd_batch_kernel(c, "fill_u32", grid, block, fill_b, 3);
	gpucmd_batch_kernel(c, "add_f32", grid, block, add, 4);
	gpucmd_batch_kernel(c, "reduce_sum_f32", grid, block, sum, 3);
	gpucmd_batch_read(c, H_O, 0, BYTES);
	gpucmd_batch_read(c, H_SUM, 0, sizeof(float));
	/*
	 * A submit consumes its batch whether or not it succeeds, and fails,
	 * sending nothing, when one of the builders above refused its op
	 * (their codes need no checking one by one).
	 */
	if ((rc = gpucmd_submit(p, &pid)) < 0) {
		gpucmd_batch_free(c);
		return fail_rc(w, conn, "submit producer", rc);
	}
	if ((rc = gpucmd_submit(c, &cid)) < 0)
		return fail_rc(w, conn, "submit consumer", rc);

	/* Any order of waits is fine; the consumer's answer comes last. */
	if ((rc = gpucmd_wait(conn, cid, &r)) < 0)
		return fail_rc(w, conn, "wait consumer", rc);
	if (fail_response(w, r, "consumer") < 0) {
		gpucmd_response_free(r);
		return -1;
	}
	rc = gpucmd_response_data(r, 3, &data, &len);
	for (size_t i = 0; rc == 0 && i < N; i++) {
		float o;

		memcpy(&o, (const char *)data + i * sizeof(o), sizeof(o));
		if (len != BYTES || o != want) {
			snprintf(w->error, sizeof(w->error),
				 "round %u: o[%zu] is %g, want %g", round, i, o,
				 want);
			rc = -1;
		}
	}
	if (rc == 0 && gpucmd_response_data(r, 4, &data, &len) == 0) {
		memcpy(&s, data, sizeof(s));
		if (s != want * N) {
			snprintf(w->error, sizeof(w->error),
				 "round %u: sum is %g, want %g", round, s,
				 want * N);
			rc = -1;
		}
	}
	gpucmd_response_free(r);
	if (rc < 0)
		return rc;
	/* The producer's batch answered when it was queued: collect it too. */
	if ((rc = gpucmd_wait(conn, pid, &r)) < 0)
		return fail_rc(w, conn, "wait producer", rc);
	rc = fail_response(w, r, "producer");
	gpucmd_response_free(r);
	return rc;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct gpucmd_conn *conn;
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	char msg[256];
	int rc;

	rc = gpucmd_connect(NULL, "example-threads", &conn, msg, sizeof(msg));
	if (rc < 0) {
		snprintf(w->error, sizeof(w->error), "connect: %s: %s",
			 gpucmd_errname(rc), msg);
		w->failed = 1;
		return NULL;
	}
	/* Buffers live on the stream that allocated them; any stream may use them. */
	if ((rc = gpucmd_batch_new(conn, PRODUCER, &b)) < 0) {
		w->failed = fail_rc(w, conn, "batch_new", rc) < 0;
		goto out;
	}
	gpucmd_batch_empty(b, H_A, BYTES);
	gpucmd_batch_empty(b, H_B, BYTES);
	gpucmd_batch_empty(b, H_O, BYTES);
	gpucmd_batch_empty(b, H_SUM, sizeof(float));
	if ((rc = gpucmd_run(b, &r)) < 0) {
		w->failed = fail_rc(w, conn, "setup", rc) < 0;
		goto out;
	}
	w->failed = fail_response(w, r, "setup") < 0;
	gpucmd_response_free(r);
	for (unsigned i = 0; !w->failed && i < w->rounds; i++)
		w->failed = round_trip(w, conn, i) < 0;
out:
	gpucmd_close(conn);
	return NULL;
}

int main(int argc, char **argv)
{
	unsigned nthreads = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 4;
	unsigned rounds = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 20;
	struct worker workers[MAX_THREADS];
	int failed = 0;

	if (nthreads < 1 || nthreads > MAX_THREADS) {
		fprintf(stderr, "threads: 1 to %d threads\n", MAX_THREADS);
		return 1;
	}
	for (unsigned i = 0; i < nthreads; i++) {
		workers[i] = (struct worker){ .index = i, .rounds = rounds };
		if (pthread_create(&workers[i].thread, NULL, worker_main,
				   &workers[i]) != 0) {
			fprintf(stderr, "threads: pthread_create failed\n");
			return 1;
		}
	}
	for (unsigned i = 0; i < nthreads; i++) {
		pthread_join(workers[i].thread, NULL);
		if (workers[i].failed) {
			fprintf(stderr, "threads: worker %u: %s\n", i,
				workers[i].error);
			failed = 1;
		}
	}
	if (failed)
		return 1;
	printf("threads: %u threads x %u rounds, 2 streams each: OK\n",
	       nthreads, rounds);
	return 0;
}
