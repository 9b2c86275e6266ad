/*
 * check_host.c - unit tests of the host backend (daemon/driver/host.c) and
 * its kernels (daemon/driver/kernels/host_kernels.c).
 *
 * Everything on a stream is asynchronous, so a test waits for its work the
 * way the daemon does: it enqueues a host callback and blocks on a semaphore
 * that the callback posts (finish).  Timing bounds are deliberately loose:
 * they tell "waited for the spin" from "did not", not how fast anything is.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "driver/driver.h"
#include "driver/kernels/builtin.h"
#include "gpucmd.h"
#include "unit.h"

#define MIB (UINT64_C(1) << 20)

/*
 * This suite is linked with -Wl,--wrap=pthread_create (Makefile, UNIT_LDFLAGS):
 * while refuse_threads is not 0, the backend's pthread_create fails with it,
 * as it does for a daemon at its RLIMIT_NPROC or its unit's TasksMax=.
 */
static atomic_int refuse_threads;

int __real_pthread_create(pthread_t *t, const pthread_attr_t *attr,
			  void *(*fn)(void *), void *arg);

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr,
			  void *(*fn)(void *), void *arg)
{
	int rc = atomic_load(&refuse_threads);

	if (rc != 0)
		return rc;
	return __real_pthread_create(t, attr, fn, arg);
}

/* The fixture's driver and two streams. */
static struct driver *d;
static struct driver_stream *s1, *s2;

static struct driver *create(uint64_t memory, uint64_t fail_at)
{
	struct driver_options opt = {
		.device = 0,
		.host_memory = memory,
		.host_fail_alloc_at = fail_at,
	};
	struct driver_properties props;
	struct driver *dr;

	ck_assert_int_eq(driver_host_create(&opt, &dr), 0);
	ck_assert_int_eq(dr->ops->open(dr, 0, &props), 0);
	return dr;
}

static void setup(void)
{
	d = create(64 * MIB, 0);
	ck_assert_int_eq(d->ops->stream_create(d, &s1), 0);
	ck_assert_int_eq(d->ops->stream_create(d, &s2), 0);
}

static void teardown(void)
{
	d->ops->stream_destroy(d, s1);
	d->ops->stream_destroy(d, s2);
	d->ops->close(d);
}

static double now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

struct done {
	sem_t sem;
	int status;
};

static void on_done(void *arg, int status)
{
	struct done *x = arg;

	x->status = status;
	sem_post(&x->sem);
}

static void done_wait(struct done *x)
{
	struct timespec t;
	int rc;

	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_sec += 5;
	while ((rc = sem_timedwait(&x->sem, &t)) != 0 && errno == EINTR)
		;
	ck_assert_msg(rc == 0, "a host callback did not fire within 5 s");
	sem_destroy(&x->sem);
}

/* Wait for everything enqueued on s of dr; the callback's status. */
static int finish_on(struct driver *dr, struct driver_stream *s)
{
	struct done x;

	sem_init(&x.sem, 0, 0);
	ck_assert_int_eq(dr->ops->host_callback(dr, s, on_done, &x), 0);
	done_wait(&x);
	return x.status;
}

static int finish(struct driver_stream *s)
{
	return finish_on(d, s);
}

static uint64_t dalloc(uint64_t size)
{
	uint64_t p;

	ck_assert_int_eq(d->ops->mem_alloc(d, size, &p), 0);
	return p;
}

static int launch_geometry(struct driver_stream *s, const char *name,
			   union builtin_value *args, size_t nargs,
			   const uint32_t grid[3], const uint32_t block[3],
			   uint32_t shared)
{
	struct driver_function *f;
	void *params[BUILTIN_MAX_ARGS];
	size_t sizes[BUILTIN_MAX_ARGS];
	const char *sig = builtin_find(name)->signature;

	ck_assert_int_eq(d->ops->builtin_function(d, name, &f), 0);
	for (size_t i = 0; i < nargs; i++) {
		params[i] = &args[i];
		sizes[i] = strchr("BbU", sig[i]) ? 8 : 4;
	}
	return d->ops->launch(d, s, f, grid, block, shared, params, sizes,
			      nargs);
}

static const uint32_t grid1[3] = { 4, 1, 1 };
static const uint32_t block1[3] = { 128, 1, 1 };

static int launch_args(struct driver_stream *s, const char *name,
		       union builtin_value *args, size_t nargs)
{
	return launch_geometry(s, name, args, nargs, grid1, block1, 0);
}

/* LAUNCH(stream, "name", {.buf = x}, {.u32 = n}) */
#define ARGS(...) ((union builtin_value[]){ __VA_ARGS__ })
#define NARGS(...) (sizeof(ARGS(__VA_ARGS__)) / sizeof(union builtin_value))
#define LAUNCH(s, name, ...) \
	launch_args(s, name, ARGS(__VA_ARGS__), NARGS(__VA_ARGS__))

static int launch_none(struct driver_stream *s, const char *name)
{
	return launch_args(s, name, NULL, 0);
}

static int spin(struct driver_stream *s, uint32_t usec)
{
	return LAUNCH(s, "spin", { .u32 = usec });
}

/* Milliseconds that finish(s) took: how much of s's work was left. */
static double finish_ms(struct driver_stream *s)
{
	double t0 = now_ms();

	ck_assert_int_eq(finish(s), 0);
	return now_ms() - t0;
}

static void sleep_ms(long ms)
{
	struct timespec t = { ms / 1000, (ms % 1000) * 1000000 };

	while (nanosleep(&t, &t) != 0 && errno == EINTR)
		;
}

/*
 * Wait, with no call that would start s's work, until e is done: only the
 * record itself may have started it.
 */
static void event_wait_done(struct driver_event *e)
{
	double t0 = now_ms();

	while (d->ops->event_query(d, e) != 1) {
		ck_assert_msg(now_ms() - t0 < 5000.0,
			      "an event recorded on a stream with pending work "
			      "did not complete within 5 s");
		sleep_ms(1);
	}
}

/* ---- device ------------------------------------------------------------ */

START_TEST(test_properties)
{
	struct driver_properties p;
	struct driver *dflt;

	ck_assert_int_eq(d->ops->open(d, 0, &p), 0);
	ck_assert_str_eq(p.name, "host (CPU)");
	ck_assert_str_eq(p.backend, "host");
	ck_assert_str_eq(d->ops->name, "host");
	ck_assert_uint_eq(p.total_memory, 64 * MIB);
	ck_assert_uint_eq(p.max_page_size, 16 * MIB);
	ck_assert_uint_eq(p.alignment, 256);
	ck_assert_uint_eq(p.max_threads_per_block, 1024);
	ck_assert_uint_eq(p.max_grid[0], 2147483647u);
	ck_assert_uint_eq(p.max_grid[1], 65535);
	ck_assert_uint_eq(p.max_grid[2], 65535);
	ck_assert_uint_eq(p.max_block[0], 1024);
	ck_assert_uint_eq(p.max_block[1], 1024);
	ck_assert_uint_eq(p.max_block[2], 64);
	ck_assert_uint_eq(p.max_shared_bytes, 48 * 1024);

	ck_assert_int_eq(d->ops->open(d, 1, &p), GPUCMD_EINVAL);
	ck_assert_ptr_nonnull(strstr(driver_last_error(d), "device 1"));

	dflt = create(0, 0);
	ck_assert_uint_eq(dflt->props.total_memory, UINT64_C(4) << 30);
	ck_assert_uint_eq(dflt->props.max_page_size, UINT64_C(1) << 30);
	dflt->ops->close(dflt);
}
END_TEST

START_TEST(test_stream_order)
{
	enum { N = 4096 };
	float *in = malloc(N * sizeof(float)), *out = calloc(N, sizeof(float));
	uint64_t buf = dalloc(N * sizeof(float));

	for (int i = 0; i < N; i++)
		in[i] = (float)i;
	/* A slow kernel first: were the ops not serial, the read would see
	 * the write's bytes but not the scale. */
	ck_assert_int_eq(spin(s1, 20000), 0);
	ck_assert_int_eq(d->ops->copy_htod(d, s1, buf, in, N * 4), 0);
	ck_assert_int_eq(LAUNCH(s1, "scale_f32", { .buf = buf },
				{ .f32 = 2.0f }, { .u32 = N }),
			 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, out, buf, N * 4), 0);
	ck_assert_int_eq(finish(s1), 0);
	for (int i = 0; i < N; i++)
		ck_assert_float_eq(out[i], 2.0f * (float)i);
	d->ops->mem_free(d, buf);
	free(in);
	free(out);
}
END_TEST

/* ---- kernels ----------------------------------------------------------- */

START_TEST(test_fill_copy_memset)
{
	enum { N = 128, FILLED = 100 };
	uint32_t out[N];
	uint64_t a = dalloc(N * 4), b = dalloc(N * 4);

	ck_assert_int_eq(d->ops->memset_d8(d, s1, a, 0, N * 4), 0);
	ck_assert_int_eq(d->ops->memset_d8(d, s1, b, 0xff, N * 4), 0);
	ck_assert_int_eq(LAUNCH(s1, "fill_u32", { .buf = a },
				{ .u32 = 0xdeadbeef }, { .u32 = FILLED }),
			 0);
	ck_assert_int_eq(LAUNCH(s1, "copy", { .buf = b }, { .buf = a },
				{ .u64 = FILLED * 4 + 8 }),
			 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, out, b, sizeof(out)), 0);
	ck_assert_int_eq(finish(s1), 0);
	for (int i = 0; i < N; i++) {
		uint32_t want = i < FILLED     ? 0xdeadbeef :
				i < FILLED + 2 ? 0 :
						 0xffffffff;

		ck_assert_uint_eq(out[i], want);
	}
	/* dtod: the other direction. */
	ck_assert_int_eq(d->ops->copy_dtod(d, s1, a, b + 4 * (N - 4), 16), 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, out, a, sizeof(out)), 0);
	ck_assert_int_eq(finish(s1), 0);
	ck_assert_uint_eq(out[0], 0xffffffff);
	ck_assert_uint_eq(out[3], 0xffffffff);
	ck_assert_uint_eq(out[4], 0xdeadbeef);
}
END_TEST

START_TEST(test_float_kernels)
{
	enum { N = 1000 };
	float x[N], y[N], o[N];
	uint64_t dx = dalloc(sizeof(x)), dy = dalloc(sizeof(y)),
		 dout = dalloc(sizeof(o));

	/* Small integers: every result below is exact in float. */
	for (int i = 0; i < N; i++) {
		x[i] = (float)i;
		y[i] = (float)(3 * i - 7);
	}
	ck_assert_int_eq(d->ops->copy_htod(d, s1, dx, x, sizeof(x)), 0);
	ck_assert_int_eq(d->ops->copy_htod(d, s1, dy, y, sizeof(y)), 0);
	ck_assert_int_eq(LAUNCH(s1, "add_f32", { .buf = dout }, { .buf = dx },
				{ .buf = dy }, { .u32 = N }),
			 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, o, dout, sizeof(o)), 0);
	ck_assert_int_eq(finish(s1), 0);
	for (int i = 0; i < N; i++)
		ck_assert_float_eq(o[i], (float)(4 * i - 7));

	ck_assert_int_eq(LAUNCH(s1, "scale_f32", { .buf = dout },
				{ .f32 = -0.5f }, { .u32 = N }),
			 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, o, dout, sizeof(o)), 0);
	ck_assert_int_eq(finish(s1), 0);
	for (int i = 0; i < N; i++)
		ck_assert_float_eq(o[i], -0.5f * (float)(4 * i - 7));

	ck_assert_int_eq(LAUNCH(s1, "saxpy_f32", { .buf = dy }, { .buf = dx },
				{ .f32 = 3.0f }, { .u32 = N }),
			 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, o, dy, sizeof(o)), 0);
	ck_assert_int_eq(finish(s1), 0);
	for (int i = 0; i < N; i++)
		ck_assert_float_eq(o[i], (float)(6 * i - 7));
}
END_TEST

START_TEST(test_reduce_sum)
{
	enum { N = 100000 };
	float *in = malloc(N * sizeof(float)), sum = -1.0f;
	uint64_t din = dalloc(N * sizeof(float)), dsum = dalloc(4);
	double want = 0;

	for (int i = 0; i < N; i++) {
		in[i] = 0.1f * (float)(i % 10) - 0.3f;
		want += in[i];
	}
	ck_assert_int_eq(d->ops->copy_htod(d, s1, din, in, N * 4), 0);
	ck_assert_int_eq(LAUNCH(s1, "reduce_sum_f32", { .buf = dsum },
				{ .buf = din }, { .u32 = N }),
			 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, &sum, dsum, 4), 0);
	ck_assert_int_eq(finish(s1), 0);
	ck_assert_double_eq_tol(sum, want, 1e-3 * fabs(want) + 1e-3);

	/* n = 0 sums nothing. */
	ck_assert_int_eq(LAUNCH(s1, "reduce_sum_f32", { .buf = dsum },
				{ .buf = din }, { .u32 = 0 }),
			 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, &sum, dsum, 4), 0);
	ck_assert_int_eq(finish(s1), 0);
	ck_assert_float_eq(sum, 0.0f);
	free(in);
}
END_TEST

START_TEST(test_spin_and_elapsed)
{
	struct driver_event *a, *b;
	float ms = -1;

	ck_assert_int_eq(d->ops->event_create(d, &a), 0);
	ck_assert_int_eq(d->ops->event_create(d, &b), 0);
	ck_assert_int_eq(d->ops->event_elapsed(d, a, b, &ms), GPUCMD_EINVAL);
	ck_assert_int_eq(d->ops->event_record(d, a, s1), 0);
	ck_assert_int_eq(spin(s1, 30000), 0);
	ck_assert_int_eq(d->ops->event_record(d, b, s1), 0);
	ck_assert_int_eq(spin(s1, 500), 0); /* a short, busy one */
	ck_assert_int_eq(finish(s1), 0);
	ck_assert_int_eq(d->ops->event_elapsed(d, a, b, &ms), 0);
	ck_assert_msg(ms >= 29.9f && ms < 2000.0f,
		      "a 30 ms spin measured %f ms", (double)ms);
	d->ops->event_destroy(d, a);
	d->ops->event_destroy(d, b);
}
END_TEST

START_TEST(test_fault)
{
	uint32_t out[4] = { 0 };
	uint64_t buf = dalloc(sizeof(out));

	ck_assert_int_eq(launch_none(s1, "fault"), 0);
	ck_assert_int_eq(LAUNCH(s1, "fill_u32", { .buf = buf }, { .u32 = 9 },
				{ .u32 = 4 }),
			 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, out, buf, sizeof(out)), 0);
	ck_assert_int_eq(finish(s1), GPUCMD_ESTREAM);
	/* The fault is reported once, and later work still ran. */
	ck_assert_int_eq(finish(s1), 0);
	ck_assert_uint_eq(out[0], 9);
	ck_assert_uint_eq(out[3], 9);
	/* A fault on one stream is not another's. */
	ck_assert_int_eq(launch_none(s1, "fault"), 0);
	ck_assert_int_eq(finish(s2), 0);
	ck_assert_int_eq(finish(s1), GPUCMD_ESTREAM);
}
END_TEST

/* ---- events ------------------------------------------------------------ */

START_TEST(test_event_cross_stream)
{
	enum { N = 1024 };
	static uint32_t out[N];
	uint64_t src = dalloc(N * 4), dst = dalloc(N * 4);
	struct driver_event *e;

	ck_assert_int_eq(d->ops->event_create(d, &e), 0);
	ck_assert_int_eq(d->ops->memset_d8(d, s1, src, 0, N * 4), 0);
	ck_assert_int_eq(finish(s1), 0);

	ck_assert_int_eq(spin(s1, 50000), 0);
	ck_assert_int_eq(LAUNCH(s1, "fill_u32", { .buf = src }, { .u32 = 42 },
				{ .u32 = N }),
			 0);
	ck_assert_int_eq(d->ops->event_record(d, e, s1), 0);
	ck_assert_int_eq(d->ops->event_wait(d, s2, e), 0);
	ck_assert_int_eq(d->ops->copy_dtod(d, s2, dst, src, N * 4), 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s2, out, dst, N * 4), 0);
	ck_assert_int_eq(finish(s2), 0);
	for (int i = 0; i < N; i++)
		ck_assert_uint_eq(out[i], 42);
	d->ops->event_destroy(d, e);
}
END_TEST

START_TEST(test_event_query)
{
	struct driver_event *e;
	float ms;

	ck_assert_int_eq(d->ops->event_create(d, &e), 0);
	/* Never recorded: nothing to wait for. */
	ck_assert_int_eq(d->ops->event_query(d, e), 1);
	ck_assert_int_eq(d->ops->event_wait(d, s2, e), 0);
	ck_assert_int_eq(finish(s2), 0);

	ck_assert_int_eq(spin(s1, 200000), 0);
	ck_assert_int_eq(d->ops->event_record(d, e, s1), 0);
	ck_assert_int_eq(d->ops->event_query(d, e), 0);
	ck_assert_int_eq(d->ops->event_elapsed(d, e, e, &ms), GPUCMD_EBUSY);
	ck_assert_int_eq(finish(s1), 0);
	ck_assert_int_eq(d->ops->event_query(d, e), 1);
	ck_assert_int_eq(d->ops->event_elapsed(d, e, e, &ms), 0);
	ck_assert_float_eq(ms, 0.0f);
	d->ops->event_destroy(d, e);
}
END_TEST

/*
 * A wait waits for the record current when the wait was enqueued, not for a
 * record that came after it.
 */
START_TEST(test_event_rerecord)
{
	struct driver_event *e;
	double t0, t;

	ck_assert_int_eq(d->ops->event_create(d, &e), 0);
	t0 = now_ms();
	ck_assert_int_eq(spin(s1, 50000), 0);
	ck_assert_int_eq(d->ops->event_record(d, e, s1), 0);
	ck_assert_int_eq(d->ops->event_wait(d, s2, e), 0);
	ck_assert_int_eq(spin(s1, 1500000), 0);
	ck_assert_int_eq(d->ops->event_record(d, e, s1), 0);
	/* The event may go before the work that uses it. */
	d->ops->event_destroy(d, e);
	ck_assert_int_eq(finish(s2), 0);
	t = now_ms() - t0;
	ck_assert_msg(t >= 49.0 && t < 1000.0,
		      "stream 2 waited %f ms for a 50 ms spin", t);
	ck_assert_int_eq(finish(s1), 0);
}
END_TEST

/* Destroying a stream blocked in an event wait returns promptly. */
START_TEST(test_destroy_waiting_stream)
{
	struct driver_stream *s3;
	struct driver_event *e;
	double t0;

	ck_assert_int_eq(d->ops->stream_create(d, &s3), 0);
	ck_assert_int_eq(d->ops->event_create(d, &e), 0);
	ck_assert_int_eq(spin(s1, 1000000), 0);
	ck_assert_int_eq(d->ops->event_record(d, e, s1), 0);
	ck_assert_int_eq(d->ops->event_wait(d, s3, e), 0);
	/* Queued behind the wait: dropped unrun. */
	ck_assert_int_eq(d->ops->memset_d8(d, s3, 0, 0, 0), 0);
	/* Handed to the worker, which blocks in the wait. */
	d->ops->flush(d, s3);
	sleep_ms(20);
	t0 = now_ms();
	d->ops->stream_destroy(d, s3);
	ck_assert_double_lt(now_ms() - t0, 500.0);
	d->ops->event_destroy(d, e);
	ck_assert_int_eq(finish(s1), 0);
}
END_TEST

/* The device thread never waits for a worker. */
START_TEST(test_enqueue_does_not_block)
{
	struct done x;
	double t0, t1;

	sem_init(&x.sem, 0, 0);
	t0 = now_ms();
	ck_assert_int_eq(spin(s1, 200000), 0);
	ck_assert_int_eq(d->ops->host_callback(d, s1, on_done, &x), 0);
	t1 = now_ms();
	ck_assert_msg(t1 - t0 < 100.0, "enqueueing took %f ms", t1 - t0);
	done_wait(&x);
	ck_assert_int_eq(x.status, 0);
	ck_assert_double_ge(now_ms() - t0, 199.0);
}
END_TEST

/* ---- batching: pending ops and flush ------------------------------------ */

/*
 * Ops wait on the stream's pending list until the batch is flushed: a copy
 * from host memory reads what the host memory holds at the flush, not at the
 * enqueue.  Each of flush, event_record and host_callback starts them.  (A
 * kernel comes first each time: on a quiet stream a small copy runs at
 * once, test_quiet_inline.)
 */
START_TEST(test_pending_until_flush)
{
	uint32_t src = 1, out = 0;
	uint64_t buf = dalloc(4);
	struct driver_event *e;

	ck_assert_ptr_nonnull(d->ops->flush);
	ck_assert_int_eq(d->ops->event_create(d, &e), 0);

	/* host_callback. */
	ck_assert_int_eq(spin(s1, 0), 0);
	ck_assert_int_eq(d->ops->copy_htod(d, s1, buf, &src, 4), 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, &out, buf, 4), 0);
	sleep_ms(20);
	src = 2; /* no race: the copy has not started */
	ck_assert_int_eq(finish(s1), 0);
	ck_assert_uint_eq(out, 2);

	/* event_record, waited for with event_query only. */
	ck_assert_int_eq(spin(s1, 0), 0);
	ck_assert_int_eq(d->ops->copy_htod(d, s1, buf, &src, 4), 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, &out, buf, 4), 0);
	sleep_ms(20);
	src = 3;
	ck_assert_int_eq(d->ops->event_record(d, e, s1), 0);
	event_wait_done(e);
	ck_assert_uint_eq(out, 3);

	/*
	 * flush: nothing is observable on s1 without a call that starts its
	 * work, so time it instead.  A flushed 150 ms spin is over by the
	 * time finish is called; an unflushed one would start only then.
	 */
	ck_assert_int_eq(spin(s1, 150000), 0);
	d->ops->flush(d, s1);
	sleep_ms(400);
	ck_assert_double_lt(finish_ms(s1), 150.0);
	/* And the same spin left pending takes its full time at finish. */
	ck_assert_int_eq(spin(s1, 150000), 0);
	sleep_ms(200);
	ck_assert_double_ge(finish_ms(s1), 149.0);

	/* A flush with nothing pending, on a busy or an idle stream. */
	d->ops->flush(d, s1);
	d->ops->flush(d, s2);
	ck_assert_int_eq(finish(s1), 0);
	d->ops->event_destroy(d, e);
	d->ops->mem_free(d, buf);
}
END_TEST

/*
 * On a stream with nothing pending, queued or running, a small copy, a
 * memset and a host callback run at once on the calling thread (host.c's
 * host_submit, HOST_INLINE_MAX); behind other work they keep the stream's
 * order.
 */
START_TEST(test_quiet_inline)
{
	uint32_t src = 5, out = 0;
	uint64_t buf = dalloc(4);
	struct done x;

	ck_assert_int_eq(finish(s1), 0);
	ck_assert_int_eq(d->ops->copy_htod(d, s1, buf, &src, 4), 0);
	ck_assert_int_eq(d->ops->memset_d8(d, s1, buf, 9, 1), 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, &out, buf, 4), 0);
	ck_assert_uint_eq(out, 9); /* no flush, no finish */
	sem_init(&x.sem, 0, 0);
	ck_assert_int_eq(d->ops->host_callback(d, s1, on_done, &x), 0);
	ck_assert_int_eq(sem_trywait(&x.sem), 0); /* already called */
	ck_assert_int_eq(x.status, 0);

	/* Behind a running kernel the copy waits its turn. */
	ck_assert_int_eq(spin(s1, 50000), 0);
	d->ops->flush(d, s1);
	src = 6;
	ck_assert_int_eq(d->ops->copy_htod(d, s1, buf, &src, 4), 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, &out, buf, 4), 0);
	ck_assert_uint_eq(out, 9);
	ck_assert_double_ge(finish_ms(s1), 20.0);
	ck_assert_uint_eq(out, 6);
	d->ops->mem_free(d, buf);
}
END_TEST

/*
 * Copies that may run inline racing the worker's last op, and a callback:
 * each round's copy must see that round's kernel (quiet is exact).
 */
START_TEST(test_quiet_race_stress)
{
	enum { N = 256, ROUNDS = 3000 };
	static uint32_t out[N];
	uint64_t buf = dalloc(N * 4);

	for (uint32_t k = 1; k <= ROUNDS; k++) {
		struct done x;

		ck_assert_int_eq(LAUNCH(s1, "fill_u32", { .buf = buf },
					{ .u32 = k }, { .u32 = N }),
				 0);
		d->ops->flush(d, s1);
		for (volatile unsigned j = 0; j < (k * 37u) % 2000u; j++)
			;
		ck_assert_int_eq(d->ops->copy_dtoh(d, s1, out, buf, N * 4), 0);
		sem_init(&x.sem, 0, 0);
		ck_assert_int_eq(d->ops->host_callback(d, s1, on_done, &x), 0);
		done_wait(&x);
		for (int i = 0; i < N; i++)
			ck_assert_uint_eq(out[i], k);
	}
	d->ops->mem_free(d, buf);
}
END_TEST

/*
 * Stream 2 waits on an event of stream 1 whose work is still pending and is
 * never flushed: the record starts it, so stream 2 cannot deadlock, and work
 * pending on stream 1 after the record is not needed.
 */
START_TEST(test_pending_cross_stream)
{
	enum { N = 1024 };
	static uint32_t out[N];
	uint64_t src = dalloc(N * 4), dst = dalloc(N * 4), other = dalloc(4);
	struct driver_event *e;

	memset(out, 0, sizeof(out));
	ck_assert_int_eq(d->ops->event_create(d, &e), 0);
	ck_assert_int_eq(spin(s1, 30000), 0);
	ck_assert_int_eq(LAUNCH(s1, "fill_u32", { .buf = src }, { .u32 = 42 },
				{ .u32 = N }),
			 0);
	ck_assert_int_eq(d->ops->event_record(d, e, s1), 0);
	/* Pending behind the record, and left so until the end. */
	ck_assert_int_eq(LAUNCH(s1, "fill_u32", { .buf = other }, { .u32 = 7 },
				{ .u32 = 1 }),
			 0);
	ck_assert_int_eq(d->ops->event_wait(d, s2, e), 0);
	ck_assert_int_eq(d->ops->copy_dtod(d, s2, dst, src, N * 4), 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s2, out, dst, N * 4), 0);
	ck_assert_int_eq(finish(s2), 0);
	for (int i = 0; i < N; i++)
		ck_assert_uint_eq(out[i], 42);

	/* The other order: the waiter is flushed before the recorder has
	 * recorded anything new; its wait is on the earlier record. */
	ck_assert_int_eq(d->ops->event_wait(d, s2, e), 0);
	d->ops->flush(d, s2);
	ck_assert_int_eq(spin(s1, 20000), 0);
	ck_assert_int_eq(d->ops->event_record(d, e, s1), 0);
	ck_assert_int_eq(d->ops->event_wait(d, s2, e), 0);
	ck_assert_int_eq(finish(s2), 0);
	ck_assert_int_eq(d->ops->event_query(d, e), 1);

	ck_assert_int_eq(finish(s1), 0);
	d->ops->event_destroy(d, e);
}
END_TEST

/*
 * A long batch starts before its flush: the 256th pending op (host.c's
 * HOST_PENDING_MAX) hands the list over, while 255 stay pending.
 */
static double long_batch(unsigned nops)
{
	double t0 = now_ms();

	ck_assert_int_eq(spin(s1, 200000), 0);
	for (unsigned i = 1; i < nops; i++)
		ck_assert_int_eq(d->ops->memset_d8(d, s1, 0, 0, 0), 0);
	sleep_ms(400 - (long)(now_ms() - t0));
	return finish_ms(s1);
}

START_TEST(test_long_batch_starts)
{
	ck_assert_double_ge(long_batch(255), 199.0);
	ck_assert_double_lt(long_batch(256), 200.0);
	/* Past the threshold the count starts again. */
	ck_assert_double_lt(long_batch(1000), 200.0);
}
END_TEST

/*
 * Op blocks are reused batch after batch (ASan checks that none is lost or
 * used after its return); the results stay right.
 */
START_TEST(test_many_batches)
{
	enum { N = 64, BATCHES = 40, OPS = 600 };
	uint32_t out[N];
	uint64_t buf = dalloc(N * 4);
	struct driver_graph *g;

	for (uint32_t b = 0; b < BATCHES; b++) {
		for (uint32_t i = 0; i < OPS; i++)
			ck_assert_int_eq(LAUNCH(s1, "fill_u32", { .buf = buf },
						{ .u32 = b * OPS + i },
						{ .u32 = N }),
					 0);
		ck_assert_int_eq(d->ops->copy_dtoh(d, s1, out, buf,
						   sizeof(out)),
				 0);
		d->ops->flush(d, s1);
		if (b % 8 == 7) {
			ck_assert_int_eq(finish(s1), 0);
			for (int i = 0; i < N; i++)
				ck_assert_uint_eq(out[i], b * OPS + OPS - 1);
		}
	}
	ck_assert_int_eq(finish(s1), 0);

	/* A graph launch goes behind pending ops, in order. */
	ck_assert_int_eq(d->ops->capture_begin(d, s2), 0);
	ck_assert_int_eq(LAUNCH(s2, "fill_u32", { .buf = buf }, { .u32 = 5 },
				{ .u32 = N }),
			 0);
	ck_assert_int_eq(d->ops->capture_end(d, s2, &g), 0);
	for (int r = 0; r < 300; r++)
		ck_assert_int_eq(LAUNCH(s1, "fill_u32", { .buf = buf },
					{ .u32 = 9 }, { .u32 = N }),
				 0);
	ck_assert_int_eq(d->ops->graph_launch(d, g, s1), 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, out, buf, sizeof(out)), 0);
	ck_assert_int_eq(finish(s1), 0);
	for (int i = 0; i < N; i++)
		ck_assert_uint_eq(out[i], 5);
	d->ops->graph_destroy(d, g);
	d->ops->mem_free(d, buf);
}
END_TEST

/*
 * A stream destroyed with ops still pending (a wait holding a marker among
 * them) drops them unrun and frees them; capture is unaffected by pending.
 */
START_TEST(test_destroy_pending)
{
	struct driver_stream *s3;
	struct driver_event *e;
	struct driver_graph *g;
	uint32_t out = 0;
	uint64_t buf = dalloc(4);

	ck_assert_int_eq(d->ops->stream_create(d, &s3), 0);
	ck_assert_int_eq(d->ops->event_create(d, &e), 0);
	ck_assert_int_eq(d->ops->event_record(d, e, s1), 0);
	ck_assert_int_eq(d->ops->memset_d8(d, s3, buf, 1, 4), 0);
	ck_assert_int_eq(d->ops->event_wait(d, s3, e), 0);
	d->ops->event_destroy(d, e);
	d->ops->stream_destroy(d, s3);

	/* Pending before a capture stays pending, and runs at the flush. */
	ck_assert_int_eq(d->ops->memset_d8(d, s1, buf, 0, 4), 0);
	ck_assert_int_eq(d->ops->capture_begin(d, s1), 0);
	ck_assert_int_eq(d->ops->memset_d8(d, s1, buf, 3, 4), 0);
	d->ops->flush(d, s1);
	ck_assert_int_eq(d->ops->capture_end(d, s1, &g), 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, &out, buf, 4), 0);
	ck_assert_int_eq(finish(s1), 0);
	ck_assert_uint_eq(out, 0);
	ck_assert_int_eq(d->ops->graph_launch(d, g, s1), 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, &out, buf, 4), 0);
	ck_assert_int_eq(finish(s1), 0);
	ck_assert_uint_eq(out, 0x03030303);
	d->ops->graph_destroy(d, g);
}
END_TEST

/* ---- memory ------------------------------------------------------------ */

START_TEST(test_memory_budget)
{
	struct driver *dr = create(MIB, 0);
	struct driver_stream *s;
	uint64_t a, b, c;
	const char *err;

	ck_assert_uint_eq(dr->props.total_memory, MIB);
	ck_assert_int_eq(dr->ops->mem_alloc(dr, MIB / 2, &a), 0);
	ck_assert_int_eq(dr->ops->mem_alloc(dr, MIB / 2 - 300, &b), 0);
	ck_assert_uint_eq(a % 256, 0);
	ck_assert_uint_eq(b % 256, 0);
	/* b counts as rounded up to the alignment: 256 bytes are left. */
	ck_assert_int_eq(dr->ops->mem_alloc(dr, 257, &c), GPUCMD_ENOMEM);
	err = driver_last_error(dr);
	ck_assert_ptr_nonnull(strstr(err, "257 bytes"));
	ck_assert_ptr_nonnull(strstr(err, "1048320 of 1048576 bytes in use"));
	ck_assert_int_eq(dr->ops->mem_alloc(dr, 256, &c), 0);
	ck_assert_int_eq(dr->ops->mem_alloc(dr, 1, &c), GPUCMD_ENOMEM);
	ck_assert_int_eq(dr->ops->mem_alloc(dr, UINT64_MAX, &c), GPUCMD_ENOMEM);
	ck_assert_int_eq(dr->ops->mem_alloc(dr, 0, &c), GPUCMD_EINVAL);

	/* Freeing gives the budget back; the memory is real. */
	dr->ops->mem_free(dr, a);
	ck_assert_int_eq(dr->ops->mem_alloc(dr, MIB / 2, &a), 0);
	ck_assert_int_eq(dr->ops->stream_create(dr, &s), 0);
	ck_assert_int_eq(dr->ops->memset_d8(dr, s, a, 0x5a, MIB / 2), 0);
	ck_assert_int_eq(finish_on(dr, s), 0);
	ck_assert_uint_eq(((unsigned char *)(uintptr_t)a)[MIB / 2 - 1], 0x5a);
	dr->ops->stream_destroy(dr, s);
	dr->ops->mem_free(dr, b);
	ck_assert_int_eq(dr->ops->mem_alloc(dr, MIB / 2 - 256, &b), 0);
	/* c is left allocated: close frees it. */
	dr->ops->close(dr);
}
END_TEST

/* Lines of /proc/self/maps: the process's mappings. */
static int mappings(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	int n = 0, c;

	ck_assert_ptr_nonnull(f);
	while ((c = fgetc(f)) != EOF)
		n += c == '\n';
	fclose(f);
	return n;
}

START_TEST(test_small_blocks_take_no_mapping_each)
{
	/*
	 * 20000 buffers of 256 bytes, every other one freed: a mapping each
	 * left 10000 of them apart, toward vm.max_map_count, after which no
	 * service could allocate.  Small blocks come from the heap, and come
	 * zeroed even where the heap hands back a block just written.
	 */
	enum { N = 20000 };
	struct driver *dr = create(64 * MIB, 0);
	uint64_t *p = calloc(N, sizeof(*p)), q;
	int before = mappings();

	ck_assert_ptr_nonnull(p);
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(dr->ops->mem_alloc(dr, 256, &p[i]), 0);
		ck_assert_uint_eq(p[i] % 256, 0);
		memset((void *)(uintptr_t)p[i], 0xab, 256);
	}
	for (int i = 0; i < N; i += 2)
		dr->ops->mem_free(dr, p[i]);
	ck_assert_msg(mappings() - before < 100,
		      "%d mappings more for %d small blocks",
		      mappings() - before, N / 2);
	for (int i = 0; i < 64; i++) {
		const unsigned char *b;

		ck_assert_int_eq(dr->ops->mem_alloc(dr, 256, &q), 0);
		b = (const unsigned char *)(uintptr_t)q;
		for (int k = 0; k < 256; k++)
			ck_assert_uint_eq(b[k], 0);
	}
	/* A large block is still the kernel's: one mapping, zeroed. */
	ck_assert_int_eq(dr->ops->mem_alloc(dr, 4 * MIB, &q), 0);
	ck_assert_uint_eq(((unsigned char *)(uintptr_t)q)[4 * MIB - 1], 0);
	free(p);
	dr->ops->close(dr); /* frees the rest, small and large */
}
END_TEST

START_TEST(test_fail_alloc_at)
{
	struct driver *dr = create(MIB, 3);
	uint64_t p[4];

	ck_assert_int_eq(dr->ops->mem_alloc(dr, 1024, &p[0]), 0);
	ck_assert_int_eq(dr->ops->mem_alloc(dr, 1024, &p[1]), 0);
	ck_assert_int_eq(dr->ops->mem_alloc(dr, 1024, &p[2]), GPUCMD_ENOMEM);
	ck_assert_ptr_nonnull(
		strstr(driver_last_error(dr), "host_fail_alloc_at"));
	ck_assert_int_eq(dr->ops->mem_alloc(dr, 1024, &p[3]), 0);
	dr->ops->mem_free(dr, p[0]);
	dr->ops->mem_free(dr, p[1]);
	dr->ops->mem_free(dr, p[3]);
	dr->ops->close(dr);
}
END_TEST

/*
 * A stream the system will not give a thread is refused with EAGAIN and a
 * message that names the limits that cause it and the way out (it used to
 * say "cannot start a stream worker: Resource temporarily unavailable"
 * alone); the next stream, once threads are there again, is made.
 */
START_TEST(test_stream_without_a_thread)
{
	struct driver_stream *s3 = NULL;
	const char *msg;

	atomic_store(&refuse_threads, EAGAIN);
	ck_assert_int_eq(d->ops->stream_create(d, &s3), -EAGAIN);
	atomic_store(&refuse_threads, 0);
	ck_assert_ptr_null(s3);
	msg = driver_last_error(d);
	ck_assert_msg(strstr(msg, "RLIMIT_NPROC") != NULL &&
			      strstr(msg, "TasksMax=") != NULL &&
			      strstr(msg, "one a stream, 2 now") != NULL,
		      "message '%s'", msg);
	atomic_store(&refuse_threads, ENOMEM);
	ck_assert_int_eq(d->ops->stream_create(d, &s3), -ENOMEM);
	atomic_store(&refuse_threads, 0);
	ck_assert_ptr_nonnull(strstr(driver_last_error(d),
				     "worker thread: Cannot allocate memory"));
	ck_assert_int_eq(d->ops->stream_create(d, &s3), 0);
	ck_assert_int_eq(finish(s3), 0);
	d->ops->stream_destroy(d, s3);
}
END_TEST

/* A host callback that records the nice value of the thread it runs on. */
struct nice_seen {
	struct done done;
	int nice;
};

static void on_nice(void *arg, int status)
{
	struct nice_seen *n = arg;

	errno = 0;
	n->nice = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
	on_done(&n->done, status);
}

/* The nice value a stream worker of a driver with stream_nice runs at. */
static int worker_nice(unsigned stream_nice)
{
	struct driver_options opt = { .host_memory = MIB,
				      .stream_nice = stream_nice };
	struct driver_properties props;
	struct driver_stream *s;
	struct nice_seen seen;
	struct driver_function *f;
	uint32_t zero = 0;
	void *params[1] = { &zero };
	size_t sizes[1] = { 4 };
	struct driver *dr;

	ck_assert_int_eq(driver_host_create(&opt, &dr), 0);
	ck_assert_int_eq(dr->ops->open(dr, 0, &props), 0);
	ck_assert_int_eq(dr->ops->stream_create(dr, &s), 0);
	sem_init(&seen.done.sem, 0, 0);
	/* Pending work first: on a quiet stream the callback would run on
	 * this thread (test_quiet_inline). */
	ck_assert_int_eq(dr->ops->builtin_function(dr, "spin", &f), 0);
	ck_assert_int_eq(dr->ops->launch(dr, s, f, grid1, block1, 0, params,
					 sizes, 1),
			 0);
	ck_assert_int_eq(dr->ops->host_callback(dr, s, on_nice, &seen), 0);
	done_wait(&seen.done);
	dr->ops->stream_destroy(dr, s);
	dr->ops->close(dr);
	return seen.nice;
}

/* Stream workers run stream_nice nicer than the thread that made them. */
START_TEST(test_stream_nice)
{
	int mine;

	errno = 0;
	mine = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
	ck_assert_int_eq(errno, 0);
	ck_assert_int_eq(worker_nice(7), mine + 7 < 19 ? mine + 7 : 19);
	/* The creating thread keeps its own. */
	ck_assert_int_eq(getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid)),
			 mine);
	/* 0 leaves the workers as they are. */
	ck_assert_int_eq(worker_nice(0), mine);
}
END_TEST

START_TEST(test_host_memory)
{
	struct driver *dr = create(MIB, 0);
	void *p;

	/* Pinned memory does not count against the device budget. */
	ck_assert_int_eq(dr->ops->host_alloc(dr, 2 * MIB, &p), 0);
	ck_assert_uint_eq((uintptr_t)p % 256, 0);
	memset(p, 1, 2 * MIB);
	ck_assert_int_eq(dr->ops->host_register(dr, p, 2 * MIB), 0);
	dr->ops->host_unregister(dr, p);
	dr->ops->host_free(dr, p);
	ck_assert_int_eq(dr->ops->host_alloc(dr, 0, &p), GPUCMD_EINVAL);
	dr->ops->close(dr);
}
END_TEST

START_TEST(test_copy_2d)
{
	enum { ROWS = 5, WIDTH = 12 };
	enum { SRC_PITCH = 20, DEV_PITCH = 16, DST_PITCH = 24 };
	unsigned char src[ROWS * SRC_PITCH], dst[ROWS * DST_PITCH],
		dev[ROWS * DEV_PITCH];
	struct driver_copy2d in = {
		.width = WIDTH,
		.height = ROWS,
		.src_pitch = SRC_PITCH,
		.dst_pitch = DEV_PITCH,
	};
	struct driver_copy2d out = {
		.width = WIDTH,
		.height = ROWS,
		.src_pitch = DEV_PITCH,
		.dst_pitch = DST_PITCH,
	};
	struct driver_copy2d bad = in;
	uint64_t buf = dalloc(sizeof(dev));

	for (size_t i = 0; i < sizeof(src); i++)
		src[i] = (unsigned char)i;
	memset(dst, 0x55, sizeof(dst));
	ck_assert_int_eq(d->ops->memset_d8(d, s1, buf, 0xaa, sizeof(dev)), 0);
	ck_assert_int_eq(d->ops->copy_htod_2d(d, s1, buf, src, &in), 0);
	ck_assert_int_eq(d->ops->copy_dtoh_2d(d, s1, dst, buf, &out), 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, dev, buf, sizeof(dev)), 0);
	ck_assert_int_eq(finish(s1), 0);
	for (int r = 0; r < ROWS; r++) {
		const unsigned char *row = &src[r * SRC_PITCH];

		for (int c = 0; c < DST_PITCH; c++) {
			if (c < DEV_PITCH)
				ck_assert_uint_eq(dev[r * DEV_PITCH + c],
						  c < WIDTH ? row[c] : 0xaa);
			ck_assert_uint_eq(dst[r * DST_PITCH + c],
					  c < WIDTH ? row[c] : 0x55);
		}
	}

	bad.width = DEV_PITCH + 1;
	ck_assert_int_eq(d->ops->copy_htod_2d(d, s1, buf, src, &bad),
			 GPUCMD_EINVAL);
	ck_assert_ptr_nonnull(strstr(driver_last_error(d), "pitch"));
}
END_TEST

/* ---- graphs ------------------------------------------------------------ */

enum { GN = 512 };

/* y = 1; y = 2x + y; y *= 0.5; read y: the result is x + 0.5. */
static void graph_work(struct driver_stream *s, uint64_t dx, uint64_t dy,
		       const float *x, float *out)
{
	uint32_t one;
	float f = 1.0f;

	memcpy(&one, &f, 4);
	ck_assert_int_eq(d->ops->copy_htod(d, s, dx, x, GN * 4), 0);
	ck_assert_int_eq(LAUNCH(s, "fill_u32", { .buf = dy }, { .u32 = one },
				{ .u32 = GN }),
			 0);
	ck_assert_int_eq(LAUNCH(s, "saxpy_f32", { .buf = dy }, { .buf = dx },
				{ .f32 = 2.0f }, { .u32 = GN }),
			 0);
	ck_assert_int_eq(LAUNCH(s, "scale_f32", { .buf = dy }, { .f32 = 0.5f },
				{ .u32 = GN }),
			 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s, out, dy, GN * 4), 0);
}

static void check_graph_result(const float *x, const float *out)
{
	for (int i = 0; i < GN; i++)
		ck_assert_float_eq(out[i], x[i] + 0.5f);
}

START_TEST(test_graph)
{
	static float x[GN], out[GN], eager[GN];
	uint64_t dx = dalloc(GN * 4), dy = dalloc(GN * 4);
	struct driver_graph *g, *g2;
	struct driver_event *e;

	for (int i = 0; i < GN; i++)
		x[i] = (float)(i * 2);
	ck_assert_int_eq(d->ops->capture_end(d, s1, &g), GPUCMD_EINVAL);
	ck_assert_int_eq(d->ops->capture_begin(d, s1), 0);
	ck_assert_int_eq(d->ops->capture_begin(d, s1), GPUCMD_EINVAL);
	graph_work(s1, dx, dy, x, out);
	ck_assert_int_eq(d->ops->capture_end(d, s1, &g), 0);
	/* Captured, not run. */
	ck_assert_int_eq(finish(s1), 0);
	for (int i = 0; i < GN; i++)
		ck_assert_float_eq(out[i], 0.0f);

	ck_assert_int_eq(d->ops->graph_launch(d, g, s1), 0);
	ck_assert_int_eq(finish(s1), 0);
	check_graph_result(x, out);
	memset(out, 0, sizeof(out));
	ck_assert_int_eq(d->ops->graph_launch(d, g, s2), 0);
	ck_assert_int_eq(finish(s2), 0);
	check_graph_result(x, out);

	graph_work(s1, dx, dy, x, eager);
	ck_assert_int_eq(finish(s1), 0);
	ck_assert_mem_eq(out, eager, sizeof(out));
	d->ops->graph_destroy(d, g);

	/* Markers and callbacks belong to one moment, not to a graph. */
	ck_assert_int_eq(d->ops->event_create(d, &e), 0);
	ck_assert_int_eq(d->ops->event_record(d, e, s2), 0);
	ck_assert_int_eq(d->ops->capture_begin(d, s1), 0);
	ck_assert_int_eq(d->ops->event_record(d, e, s1), GPUCMD_EINVAL);
	ck_assert_ptr_nonnull(strstr(driver_last_error(d), "captured"));
	ck_assert_int_eq(d->ops->event_wait(d, s1, e), GPUCMD_EINVAL);
	ck_assert_int_eq(d->ops->host_callback(d, s1, on_done, NULL),
			 GPUCMD_EINVAL);
	ck_assert_int_eq(d->ops->capture_end(d, s1, &g2), 0);
	ck_assert_int_eq(d->ops->capture_begin(d, s1), 0);
	ck_assert_int_eq(d->ops->graph_launch(d, g2, s1), GPUCMD_EINVAL);
	ck_assert_int_eq(d->ops->capture_end(d, s1, &g), 0);
	d->ops->graph_destroy(d, g);
	d->ops->graph_destroy(d, g2);
	d->ops->event_destroy(d, e);
	/* A stream destroyed mid-capture frees its graph (teardown). */
	ck_assert_int_eq(d->ops->capture_begin(d, s2), 0);
	ck_assert_int_eq(d->ops->memset_d8(d, s2, dx, 0, 4), 0);
}
END_TEST

/* ---- functions and launches -------------------------------------------- */

START_TEST(test_functions)
{
	struct driver_function *f;
	struct driver_module *m;
	size_t n;
	const struct builtin_kernel *all = builtin_all(&n);
	char log[256] = "";

	for (size_t i = 0; i < n; i++)
		ck_assert_int_eq(d->ops->builtin_function(d, all[i].name, &f),
				 0);
	ck_assert_int_eq(d->ops->builtin_function(d, "matmul", &f),
			 GPUCMD_ENOKERNEL);
	ck_assert_ptr_nonnull(strstr(driver_last_error(d), "\"matmul\""));
	ck_assert_int_eq(d->ops->module_load(d, DRIVER_MODULE_PTX, "x", 1, &m,
					     log, sizeof(log)),
			 GPUCMD_EUNSUPPORTED);
	ck_assert_ptr_nonnull(strstr(driver_last_error(d), "CUDA backend"));
	ck_assert_ptr_nonnull(strstr(log, "CUDA backend"));
}
END_TEST

START_TEST(test_launch_refused)
{
	static const uint32_t big_block[3] = { 2048, 1, 1 };
	static const uint32_t cube[3] = { 32, 32, 2 };
	static const uint32_t no_grid[3] = { 0, 1, 1 };
	union builtin_value args[3] = { { .u32 = 10 } };
	struct driver_function *f;
	void *params[1] = { &args[0] };
	size_t wrong_size[1] = { 8 };
	uint32_t out = 0;
	uint64_t buf = dalloc(4);

	ck_assert_int_eq(launch_geometry(s1, "spin", args, 1, grid1, big_block,
					 0),
			 GPUCMD_ELAUNCH);
	ck_assert_int_eq(launch_geometry(s1, "spin", args, 1, grid1, cube, 0),
			 GPUCMD_ELAUNCH);
	ck_assert_ptr_nonnull(strstr(driver_last_error(d), "2048 threads"));
	ck_assert_int_eq(launch_geometry(s1, "spin", args, 1, no_grid, block1,
					 0),
			 GPUCMD_ELAUNCH);
	ck_assert_int_eq(launch_geometry(s1, "spin", args, 1, grid1, block1,
					 64 * 1024),
			 GPUCMD_ELAUNCH);
	ck_assert_int_eq(launch_args(s1, "spin", args, 2), GPUCMD_EINVAL);
	ck_assert_int_eq(d->ops->builtin_function(d, "spin", &f), 0);
	ck_assert_int_eq(d->ops->launch(d, s1, f, grid1, block1, 0, params,
					wrong_size, 1),
			 GPUCMD_EINVAL);
	ck_assert_int_eq(spin(s1, BUILTIN_SPIN_MAX_USEC + 1), GPUCMD_EINVAL);
	ck_assert_ptr_nonnull(strstr(driver_last_error(d), "limit"));
	/* None of it reached the stream, which still works. */
	ck_assert_int_eq(LAUNCH(s1, "fill_u32", { .buf = buf }, { .u32 = 5 },
				{ .u32 = 1 }),
			 0);
	ck_assert_int_eq(d->ops->copy_dtoh(d, s1, &out, buf, 4), 0);
	ck_assert_int_eq(finish(s1), 0);
	ck_assert_uint_eq(out, 5);
}
END_TEST

static TCase *tcase(const char *name, int timeout)
{
	TCase *tc = tcase_create(name);

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, timeout);
	return tc;
}

static Suite *host_suite(void)
{
	Suite *s = suite_create("host");
	TCase *tc;

	tc = tcase("device", 10);
	tcase_add_test(tc, test_properties);
	tcase_add_test(tc, test_stream_nice);
	tcase_add_test(tc, test_stream_order);
	tcase_add_test(tc, test_functions);
	tcase_add_test(tc, test_launch_refused);
	tcase_add_test(tc, test_stream_without_a_thread);
	suite_add_tcase(s, tc);

	tc = tcase("kernels", 10);
	tcase_add_test(tc, test_fill_copy_memset);
	tcase_add_test(tc, test_float_kernels);
	tcase_add_test(tc, test_reduce_sum);
	tcase_add_test(tc, test_spin_and_elapsed);
	tcase_add_test(tc, test_fault);
	suite_add_tcase(s, tc);

	tc = tcase("events", 15);
	tcase_add_test(tc, test_event_cross_stream);
	tcase_add_test(tc, test_event_query);
	tcase_add_test(tc, test_event_rerecord);
	tcase_add_test(tc, test_destroy_waiting_stream);
	tcase_add_test(tc, test_enqueue_does_not_block);
	suite_add_tcase(s, tc);

	tc = tcase("batching", 20);
	tcase_add_test(tc, test_pending_until_flush);
	tcase_add_test(tc, test_quiet_inline);
	tcase_add_test(tc, test_quiet_race_stress);
	tcase_add_test(tc, test_pending_cross_stream);
	tcase_add_test(tc, test_long_batch_starts);
	tcase_add_test(tc, test_many_batches);
	tcase_add_test(tc, test_destroy_pending);
	suite_add_tcase(s, tc);

	tc = tcase("memory", 10);
	tcase_add_test(tc, test_memory_budget);
	tcase_add_test(tc, test_small_blocks_take_no_mapping_each);
	tcase_add_test(tc, test_fail_alloc_at);
	tcase_add_test(tc, test_host_memory);
	tcase_add_test(tc, test_copy_2d);
	suite_add_tcase(s, tc);

	tc = tcase("graphs", 10);
	tcase_add_test(tc, test_graph);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_main(host_suite());
}
