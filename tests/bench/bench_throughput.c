/*
 * bench_throughput.c - batched launches: batches of 1, 8, 64 and 1024
 * spin(0) kernels (the built-in "spin" for 0 µs, grid 1, block 1), kept
 * several batches deep in flight the way a real client pipelines.
 *
 * Two numbers per batch size:
 *   throughput       ops per second, wall clock, client included;
 *   daemon CPU/op    CPU time of the daemon's own threads (loop and device
 *                    thread; everything but the host backend's stream
 *                    workers, which stand in for the GPU and run the
 *                    kernels) divided by the ops: the daemon's overhead per
 *                    op, whatever the client and the scheduler did.
 * The floor of both is the echo child moving the same request and response
 * bytes at the same pipeline depth: what any local daemon costs for them.
 */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int submit_spins(struct gpucmd_conn *c, size_t nops, uint64_t *id)
{
	struct gpucmd_batch *b;
	int rc = gpucmd_batch_new(c, 0, &b);

	for (size_t i = 0; rc == 0 && i < nops; i++)
		rc = bench_add_spin0(b);
	if (rc != 0) {
		gpucmd_batch_free(b);
		return rc;
	}
	return gpucmd_submit(b, id);
}

static int collect(struct gpucmd_conn *c, uint64_t id)
{
	struct gpucmd_response *r = NULL;
	int rc = gpucmd_wait(c, id, &r);

	if (rc == 0)
		rc = gpucmd_response_error(r);
	gpucmd_response_free(r);
	return rc;
}

static void cpu_delta(struct bench_cpu *d, const struct bench_cpu *a,
		      const struct bench_cpu *b)
{
	d->daemon_ns = b->daemon_ns - a->daemon_ns;
	d->streams_ns = b->streams_ns - a->streams_ns;
}

uint64_t bench_spin_run_ns(void)
{
	return bench.quick ? 400000000ull : 3000000000ull;
}

/* Keep depth batches of nops spins in flight for about dur_ns. */
int bench_spin_batches(struct gpucmd_conn *c, size_t nops, size_t depth,
		       uint64_t dur_ns, struct bench_tp *out)
{
	uint64_t *ids = calloc(depth, sizeof(*ids));
	struct bench_cpu c0, c1;
	uint64_t t0, end, batches = 0;
	size_t head = 0, inflight = 0;
	int rc = 0;

	if (ids == NULL)
		return -1;
	bench_cpu_read(bench.daemon_pid, &c0);
	t0 = bench_now_ns();
	end = t0 + dur_ns;
	for (;;) {
		bool more = bench_now_ns() < end;

		while (more && inflight < depth) {
			rc = submit_spins(c, nops,
					  &ids[(head + inflight) % depth]);
			if (rc != 0)
				goto out;
			inflight++;
		}
		if (inflight == 0)
			break;
		rc = collect(c, ids[head]);
		if (rc != 0)
			goto out;
		head = (head + 1) % depth;
		inflight--;
		batches++;
	}
	out->wall_ns = bench_now_ns() - t0;
	bench_cpu_read(bench.daemon_pid, &c1);
	cpu_delta(&out->cpu, &c0, &c1);
	out->ops = batches * nops;
out:
	free(ids);
	return rc;
}

/* The same bytes at the same depth through the echo child. */
static int run_floor(size_t nops, size_t depth, uint64_t dur_ns,
		     struct bench_tp *out)
{
	struct bench_echo e;
	struct bench_cpu c0, c1;
	uint64_t t0, end, batches = 0;
	size_t inflight = 0;
	int rc;

	rc = bench_echo_start(&e, bench_wire_request(BENCH_OP_SPIN0, nops),
			      bench_wire_response(nops));
	if (rc != 0)
		return rc;
	bench_cpu_read(e.pid, &c0);
	t0 = bench_now_ns();
	end = t0 + dur_ns;
	for (;;) {
		bool more = bench_now_ns() < end;

		while (more && inflight < depth) {
			rc = bench_echo_send(&e);
			if (rc != 0)
				goto out;
			inflight++;
		}
		if (inflight == 0)
			break;
		rc = bench_echo_recv(&e);
		if (rc != 0)
			goto out;
		inflight--;
		batches++;
	}
	out->wall_ns = bench_now_ns() - t0;
	bench_cpu_read(e.pid, &c1);
	cpu_delta(&out->cpu, &c0, &c1);
	out->ops = batches * nops;
out:
	bench_echo_stop(&e);
	return rc;
}

void bench_throughput(void)
{
	static const size_t sizes[] = { 1, 8, 64, 1024 };
	/* Deep enough to keep the daemon busy, shallow enough for buffers. */
	static const size_t depths[] = { 64, 32, 16, BENCH_SPIN_X1024_DEPTH };
	const uint64_t dur = bench_spin_run_ns();
	struct gpucmd_conn *c = bench_connect("bench-throughput");
	uint64_t id;

	if (c == NULL)
		return;
	if (bench.daemon_pid <= 0)
		bench_note("throughput: the daemon's pid is unknown, so its "
			   "CPU per op is left out");
	/* Warm up: the stream and its worker exist, the kernel is looked up. */
	if (submit_spins(c, 64, &id) != 0 || collect(c, id) != 0) {
		bench_error("throughput: a batch of spin(0) failed");
		gpucmd_close(c);
		return;
	}
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		size_t n = sizes[i], depth = depths[i];
		struct bench_tp d = { 0 }, f = { 0 };
		double ops_s, f_ops_s, cpu_op, f_cpu_op, dev_op;
		char name[64];

		bench_progress("throughput: batches of %zu spin(0)", n);
		if (bench_spin_batches(c, n, depth, dur, &d) != 0) {
			bench_error("throughput: batches of %zu spin(0) failed",
				    n);
			break;
		}
		if (run_floor(n, depth, dur / 2, &f) != 0) {
			bench_error("throughput: the echo floor failed");
			break;
		}
		ops_s = (double)d.ops * 1e9 / (double)d.wall_ns;
		f_ops_s = (double)f.ops * 1e9 / (double)f.wall_ns;
		cpu_op = (double)d.cpu.daemon_ns / (double)d.ops / 1e3;
		dev_op = (double)d.cpu.streams_ns / (double)d.ops / 1e3;
		f_cpu_op = (double)f.cpu.daemon_ns / (double)f.ops / 1e3;
		snprintf(name, sizeof(name), "spin(0) x%zu: throughput", n);
		bench_add(name, ops_s, "op/s", f_ops_s, ops_s / f_ops_s,
			  n == 1024 ? TARGET_VALUE_GE : TARGET_NONE, 1e6);
		if (bench.daemon_pid <= 0)
			continue;
		snprintf(name, sizeof(name), "spin(0) x%zu: daemon CPU/op", n);
		bench_add(name, cpu_op, "us", f_cpu_op, cpu_op / f_cpu_op,
			  n == 1024 ? TARGET_VALUE_LE : TARGET_NONE, 0.3);
		if (n == 1024) {
			/* The "GPU" of the host backend, for the profile. */
			snprintf(name, sizeof(name),
				 "spin(0) x%zu: host stream CPU/op", n);
			bench_add(name, dev_op, "us", NAN, NAN, TARGET_NONE, 0);
		}
	}
	gpucmd_close(c);
}
