/*
 * bench_roundtrip.c - the round trip of a one-op batch, against a raw Unix
 * socket ping-pong of the same bytes between two processes.
 *
 * Two ops: ping (the daemon answers without touching the device) and sync
 * on an idle stream (answered by the daemon's loop from what the device
 * thread said when the connection's last batch completed; the first sync
 * of the run goes through the device thread).  The time is the client's whole call:
 * building the batch, encoding, the socket both ways, decoding.  The floor
 * is an echo child (bench_util.c) that reads exactly the request's bytes and
 * writes exactly the response's bytes, both sides watching the socket
 * before they block as libgpucmd and gpucmdd do (GPUCMD_SPIN_US): a
 * sleeping echo can take 80 us a round trip on a virtual machine, which
 * would flatter the daemon.
 *
 * Machines drift (frequency, other tenants), so the four measurements take
 * turns in short rounds and each percentile pools every round's samples.
 */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { RT_PING, RT_SYNC, RT_FLOOR_PING, RT_FLOOR_SYNC, RT_KINDS };

/* One daemon round trip of a one-op batch; its duration, or 0 on error. */
static uint64_t one_batch(struct gpucmd_conn *c, enum bench_op op)
{
	struct gpucmd_response *r = NULL;
	struct gpucmd_batch *b;
	uint64_t t0 = bench_now_ns(), t1;
	int rc;

	rc = gpucmd_batch_new(c, 0, &b);
	if (rc == 0)
		rc = op == BENCH_OP_PING ? gpucmd_batch_ping(b) :
					   gpucmd_batch_sync(b);
	if (rc == 0)
		rc = gpucmd_run(b, &r);
	else
		gpucmd_batch_free(b);
	t1 = bench_now_ns();
	if (rc == 0)
		rc = gpucmd_response_error(r);
	gpucmd_response_free(r);
	if (rc != 0) {
		bench_error("round trip: %s", gpucmd_strerror(rc));
		return 0;
	}
	return t1 - t0;
}

static uint64_t one_echo(struct bench_echo *e)
{
	uint64_t t0 = bench_now_ns();

	if (bench_echo_roundtrip(e) != 0) {
		bench_error("round trip: the echo floor failed");
		return 0;
	}
	return bench_now_ns() - t0;
}

static void add_rows(const char *what, uint64_t *s, size_t n, uint64_t *f,
		     size_t nf)
{
	double p50 = bench_percentile(s, n, 50) / 1e3;
	double p99 = bench_percentile(s, n, 99) / 1e3;
	double f50 = bench_percentile(f, nf, 50) / 1e3;
	double f99 = bench_percentile(f, nf, 99) / 1e3;
	char name[64];

	snprintf(name, sizeof(name), "round trip %s p50", what);
	bench_add(name, p50, "us", f50, p50 / f50, TARGET_RATIO_LE, 1.3);
	snprintf(name, sizeof(name), "round trip %s p99", what);
	bench_add(name, p99, "us", f99, p99 / f99, TARGET_NONE, 0);
}

void bench_roundtrip(void)
{
	const size_t rounds = bench.quick ? 5 : 20;
	const size_t per_round = bench.quick ? 600 : 3000;
	const size_t total = rounds * per_round;
	struct bench_echo echo[2];
	struct gpucmd_conn *c;
	uint64_t *s[RT_KINDS];
	size_t n[RT_KINDS] = { 0 };
	bool ok = true;

	c = bench_connect("bench-roundtrip");
	if (c == NULL)
		return;
	for (int k = 0; k < RT_KINDS; k++) {
		s[k] = calloc(total, sizeof(uint64_t));
		ok = ok && s[k] != NULL;
	}
	if (!ok ||
	    bench_echo_start_spinning(&echo[0],
				      bench_wire_request(BENCH_OP_PING, 1),
				      bench_wire_response(1)) != 0) {
		bench_error("round trip: cannot set up");
		goto out;
	}
	if (bench_echo_start_spinning(&echo[1],
				      bench_wire_request(BENCH_OP_SYNC, 1),
				      bench_wire_response(1)) != 0) {
		bench_echo_stop(&echo[0]);
		bench_error("round trip: cannot set up");
		goto out;
	}
	/* Warm up: the stream exists, caches and branch predictors are hot. */
	for (int i = 0; i < 200; i++) {
		one_batch(c, BENCH_OP_PING);
		one_batch(c, BENCH_OP_SYNC);
		one_echo(&echo[0]);
		one_echo(&echo[1]);
	}
	for (size_t r = 0; r < rounds && ok; r++) {
		bench_progress("round trip: round %zu of %zu", r + 1, rounds);
		for (int k = 0; k < RT_KINDS && ok; k++) {
			for (size_t i = 0; i < per_round; i++) {
				uint64_t t;

				switch (k) {
				case RT_PING:
					t = one_batch(c, BENCH_OP_PING);
					break;
				case RT_SYNC:
					t = one_batch(c, BENCH_OP_SYNC);
					break;
				case RT_FLOOR_PING:
					t = one_echo(&echo[0]);
					break;
				default:
					t = one_echo(&echo[1]);
					break;
				}
				if (t == 0) {
					ok = false;
					break;
				}
				s[k][n[k]++] = t;
			}
		}
	}
	bench_echo_stop(&echo[0]);
	bench_echo_stop(&echo[1]);
	if (ok) {
		add_rows("ping", s[RT_PING], n[RT_PING], s[RT_FLOOR_PING],
			 n[RT_FLOOR_PING]);
		add_rows("sync (idle stream)", s[RT_SYNC], n[RT_SYNC],
			 s[RT_FLOOR_SYNC], n[RT_FLOOR_SYNC]);
	}
out:
	for (int k = 0; k < RT_KINDS; k++)
		free(s[k]);
	gpucmd_close(c);
}
