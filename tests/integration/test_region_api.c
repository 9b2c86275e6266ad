/*
 * test_region_api.c - shared regions through the client library: round
 * trips of every size class at odd offsets and lengths, strided copies,
 * bounds and id errors with the daemon's numbers, a release in the same
 * batch as a copy still in flight, a client killed with regions mapped and
 * copies queued, ids reused after release, and the convenience calls that
 * pick a region when a transfer would not fit a frame.
 *
 * test_regions.c checks the same daemon side at the wire level; this one
 * checks the library (descriptor passing, the region table, settling a
 * release when its response is collected) against a real daemon.
 */
#include <dirent.h>
#include <sys/mman.h>

#include "harness.h"

#define MIB (UINT64_C(1) << 20)

static const uint32_t ONE[3] = { 1, 1, 1 };

/* Deterministic bytes that differ for every (seed, index). */
static void fill(uint8_t *p, size_t len, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 1;

	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (uint8_t)x;
	}
}

static bool is_host_backend(void)
{
	const char *b = getenv("GPUCMD_TEST_BACKEND");

	return b == NULL || b[0] == '\0' || strcmp(b, "host") == 0;
}

/* A batch with one op added by the caller, run, and its error. */
static int run_code(struct gpucmd_batch *b, char *msg, size_t msg_len)
{
	struct gpucmd_response *r = NULL;
	int rc = gpucmd_run(b, &r);

	ck_assert_msg(rc == 0, "run: %s", gpucmd_strerror(rc));
	rc = gpucmd_response_error(r);
	if (msg != NULL)
		snprintf(msg, msg_len, "%s", gpucmd_response_message(r));
	gpucmd_response_free(r);
	return rc;
}

/*
 * A new batch on stream that empties size bytes as handle and writes into
 * it at offset length bytes of region from region_offset; the caller adds
 * the rest and runs it.
 */
static struct gpucmd_batch *
empty_write_batch(struct gpucmd_conn *c, uint32_t stream, uint64_t handle,
		  uint64_t size, uint64_t offset, uint64_t region,
		  uint64_t region_offset, uint64_t length)
{
	struct gpucmd_batch *b;

	ck_assert_int_eq(gpucmd_batch_new(c, stream, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, handle, size), 0);
	ck_assert_int_eq(gpucmd_batch_write_region(b, handle, offset, region,
						   region_offset, length),
			 0);
	return b;
}

static void spin_op(struct gpucmd_batch *b, uint32_t usec)
{
	struct gpucmd_arg a = { .kind = GPUCMD_ARG_U32, .v.u32 = usec };

	ck_assert_int_eq(gpucmd_batch_kernel(b, "spin", ONE, ONE, &a, 1), 0);
}

/*
 * Every size class, from one byte to 16 MiB, with odd offsets on the
 * device and in the region: write from the region, read back into another
 * part of it, compare byte for byte, and check the bytes around the range
 * were not touched.  create_region makes a buffer from a range too.
 */
/* The library's last sentence on c contains want. */
static void expect_message(struct gpucmd_conn *c, const char *want)
{
	ck_assert_msg(strstr(gpucmd_last_message(c), want) != NULL,
		      "message '%s', expected it to contain '%s'",
		      gpucmd_last_message(c), want);
}

START_TEST(round_trips_of_every_size)
{
	static const size_t sizes[] = { 1,     7,   4095,     4096,
					65537, MIB, MIB + 13, 16 * MIB };
	const size_t size = 40 * MIB, dst_at = 20 * MIB + 3;
	struct gpucmd_conn *c = connect_as("regions");
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	uint64_t region, off, len;
	uint8_t *m;
	void *p;

	ck_assert_int_eq(gpucmd_region_create(c, 5, size, &p), 0);
	m = p;
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t n = sizes[k];

		fill(m + 1, n, (uint32_t)k + 1);
		memset(m + dst_at - 1, 0xee, n + 2);
		b = empty_write_batch(c, 1, 10 + k, n + 5, 3, 5, 1, n);
		ck_assert_int_eq(gpucmd_batch_read_region(b, 10 + k, 3, n, 5,
							  dst_at),
				 0);
		ck_assert_int_eq(gpucmd_batch_release(b, 10 + k), 0);
		r = run_ok(b);
		ck_assert_int_eq(gpucmd_response_region(r, 2, &region, &off,
							&len),
				 0);
		ck_assert_uint_eq(region, 5);
		ck_assert_uint_eq(off, dst_at);
		ck_assert_uint_eq(len, n);
		/* Not a read into a region: refused. */
		ck_assert_int_eq(gpucmd_response_region(r, 1, &region, &off,
							&len),
				 GPUCMD_EINVAL);
		gpucmd_response_free(r);
		ck_assert_msg(memcmp(m + dst_at, m + 1, n) == 0,
			      "%zu bytes differ after the round trip", n);
		ck_assert_uint_eq(m[dst_at - 1], 0xee);
		ck_assert_uint_eq(m[dst_at + n], 0xee);

		/* create_region: a buffer born from a range, read back. */
		memset(m + dst_at, 0, n);
		ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
		ck_assert_int_eq(gpucmd_batch_create_region(b, 100 + k, 5, 1,
							    n),
				 0);
		ck_assert_int_eq(gpucmd_batch_read_region(b, 100 + k, 0, n, 5,
							  dst_at),
				 0);
		ck_assert_int_eq(gpucmd_batch_release(b, 100 + k), 0);
		gpucmd_response_free(run_ok(b));
		ck_assert_msg(memcmp(m + dst_at, m + 1, n) == 0,
			      "create_region: %zu bytes differ", n);
	}
	ck_assert_int_eq(gpucmd_region_release(c, 5), 0);
	gpucmd_close(c);
}
END_TEST

/* Strided writes from and reads into a region: the pitched rows land. */
START_TEST(strided_copies)
{
	/* 5 rows of 7 u32, row pitch 13 elements on the device. */
	struct gpucmd_layout l = { .rank = 2,
				   .shape = { 5, 7 },
				   .strides = { 13, 1 },
				   .elem_size = 4 };
	const size_t packed = 5 * 7 * 4, pitch = 13 * 4;
	struct gpucmd_conn *c = connect_as("regions");
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	uint64_t region, off, len;
	const uint8_t *dev;
	const void *data;
	size_t got;
	uint8_t *m;
	void *p;

	ck_assert_int_eq(gpucmd_region_create(c, 2, 4096, &p), 0);
	m = p;
	fill(m + 9, packed, 77);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 1, 5 * pitch), 0);
	ck_assert_int_eq(gpucmd_batch_write_region_layout(b, 1, 0, &l, 2, 9),
			 0);
	ck_assert_int_eq(gpucmd_batch_read_region_layout(b, 1, 0, &l, 2, 1001),
			 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, 5 * pitch), 0);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_region(r, 2, &region, &off, &len), 0);
	ck_assert_uint_eq(region, 2);
	ck_assert_uint_eq(off, 1001);
	ck_assert_uint_eq(len, packed);
	ck_assert_int_eq(memcmp(m + 1001, m + 9, packed), 0);
	ck_assert_int_eq(gpucmd_response_data(r, 3, &data, &got), 0);
	dev = data;
	for (size_t row = 0; row < 5; row++)
		ck_assert_int_eq(memcmp(dev + row * pitch, m + 9 + row * 28,
					28),
				 0);
	gpucmd_response_free(r);
	/* A layout that cannot be described is the library's to refuse. */
	l.rank = 0;
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_write_region_layout(b, 1, 0, &l, 2, 0),
			 GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_batch_read_region_layout(b, 1, 0, NULL, 2, 0),
			 GPUCMD_EINVAL);
	gpucmd_batch_free(b);
	gpucmd_close(c);
}
END_TEST

/* Ranges past the end, unknown regions and bad ids: clear errors. */
START_TEST(bounds_and_id_errors)
{
	struct gpucmd_conn *c = connect_as("regions");
	struct gpucmd_batch *b;
	char msg[512];
	void *p;
	int rc;

	ck_assert_int_eq(gpucmd_region_create(c, 3, 4096, &p), 0);
	/* Write range past the end: the numbers are in the message. */
	b = empty_write_batch(c, 0, 1, 8192, 0, 3, 4000, 200);
	rc = run_code(b, msg, sizeof(msg));
	ck_assert_int_eq(rc, GPUCMD_EINVAL);
	ck_assert_msg(strstr(msg, "200 bytes at offset 4000") != NULL &&
			      strstr(msg, "4096") != NULL,
		      "message: %s", msg);
	/* Read into a range past the end. */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 2, 8192), 0);
	ck_assert_int_eq(gpucmd_batch_read_region(b, 2, 0, 4097, 3, 0), 0);
	rc = run_code(b, msg, sizeof(msg));
	ck_assert_int_eq(rc, GPUCMD_EINVAL);
	ck_assert_msg(strstr(msg, "4097 bytes at offset 0") != NULL,
		      "message: %s", msg);
	/* An offset that wraps around 2^64. */
	b = empty_write_batch(c, 0, 3, 64, 0, 3, UINT64_MAX - 8, 16);
	ck_assert_int_eq(run_code(b, NULL, 0), GPUCMD_EINVAL);
	/* create_region of a range past the end allocates nothing. */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_create_region(b, 4, 3, 1, 4096), 0);
	ck_assert_int_eq(run_code(b, msg, sizeof(msg)), GPUCMD_EINVAL);
	/* A region that was never attached. */
	b = empty_write_batch(c, 0, 5, 64, 0, 99, 0, 8);
	rc = run_code(b, msg, sizeof(msg));
	ck_assert_int_eq(rc, GPUCMD_ENOTFOUND);
	ck_assert_msg(strstr(msg, "region 99") != NULL, "message: %s", msg);
	/*
	 * Ids: 0 and the library's are refused here, a live one is taken;
	 * each refusal of this side says why, as the daemon's do.
	 */
	ck_assert_int_eq(gpucmd_region_create(c, 0, 4096, &p), GPUCMD_EINVAL);
	expect_message(c, "region id 0: an id is 1 to 2^63 - 1");
	ck_assert_int_eq(gpucmd_region_create(c, GPUCMD_REGION_ID_RESERVED,
					      4096, &p),
			 GPUCMD_EINVAL);
	expect_message(c,
		       "GPUCMD_REGION_ID_RESERVED and above are the library's");
	ck_assert_int_eq(gpucmd_region_create(c, 4, 0, &p), GPUCMD_EINVAL);
	expect_message(c, "region 4: a size of 0 bytes");
	ck_assert_int_eq(gpucmd_region_create(c, 3, 4096, &p), GPUCMD_EEXIST);
	expect_message(c, "region 3 is already attached on this connection");
	ck_assert_int_eq(gpucmd_region_release(c, 42), GPUCMD_ENOTFOUND);
	expect_message(c, "region 42 is not attached on this connection");
	ck_assert_int_eq(gpucmd_region_release(c, GPUCMD_REGION_ID_RESERVED),
			 GPUCMD_EINVAL);
	expect_message(c, "an id is 1 to 2^63 - 1");
	ck_assert_int_eq(gpucmd_write_buffer(c, 0, 0, 0, "x", 1),
			 GPUCMD_EINVAL);
	expect_message(c, "gpucmd_write_buffer: handle 0 names no buffer");
	ck_assert_int_eq(gpucmd_read_buffer(c, 0, 1, 0, 8, NULL),
			 GPUCMD_EINVAL);
	expect_message(c, "gpucmd_read_buffer: nowhere to put");
	/* A call that succeeds leaves no sentence behind. */
	ck_assert_int_eq(gpucmd_region_create(c, 4, 4096, &p), 0);
	ck_assert_str_eq(gpucmd_last_message(c), "");
	ck_assert_int_eq(gpucmd_region_release(c, 4), 0);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_write_region(b, 1, 0, 0, 0, 8),
			 GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_batch_read_region(b, 1, 0, 8, 0, 0),
			 GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_batch_create_region(b, 1, 0, 0, 8),
			 GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_batch_release_region(b, 0), GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_batch_release_region(b,
						     GPUCMD_REGION_ID_RESERVED),
			 GPUCMD_EINVAL);
	ck_assert_uint_eq(gpucmd_batch_count(b), 0);
	gpucmd_batch_free(b);
	ck_assert_int_eq(gpucmd_region_release(c, 3), 0);
	/* A region of an odd size: all of it is usable, not a byte more. */
	ck_assert_int_eq(gpucmd_region_create(c, 11, 4097, &p), 0);
	fill(p, 4097, 6);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_create_region(b, 20, 11, 0, 4097), 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 20, 0, 4097), 0);
	{
		struct gpucmd_response *r = run_ok(b);
		const void *data;
		size_t len;

		ck_assert_int_eq(gpucmd_response_data(r, 1, &data, &len), 0);
		ck_assert_uint_eq(len, 4097);
		ck_assert_int_eq(memcmp(data, p, 4097), 0);
		gpucmd_response_free(r);
	}
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_read_region(b, 20, 0, 4097, 11, 1), 0);
	rc = run_code(b, msg, sizeof(msg));
	ck_assert_int_eq(rc, GPUCMD_EINVAL);
	ck_assert_msg(strstr(msg, "the region has 4097") != NULL, "message: %s",
		      msg);
	gpucmd_close(c);
}
END_TEST

/*
 * A write from a region, queued behind a long kernel, and the region's
 * release in the same batch: the response comes while the copy waits, the
 * library unmaps its side, and the bytes still arrive.
 */
START_TEST(release_in_same_batch_as_copy_in_flight)
{
	enum { N = 4 << 20 };
	struct gpucmd_conn *c = connect_as("regions");
	uint8_t *want = malloc(N), *got = malloc(N);
	struct gpucmd_batch *b;
	uint64_t t0, took;
	void *p;

	ck_assert_ptr_nonnull(want);
	ck_assert_ptr_nonnull(got);
	ck_assert_int_eq(gpucmd_region_create(c, 7, N, &p), 0);
	fill(p, N, 99);
	memcpy(want, p, N);
	ck_assert_int_eq(gpucmd_batch_new(c, 2, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 1, N), 0);
	spin_op(b, 1500000);
	ck_assert_int_eq(gpucmd_batch_write_region(b, 1, 0, 7, 0, N), 0);
	ck_assert_int_eq(gpucmd_batch_release_region(b, 7), 0);
	t0 = harness_now_us();
	gpucmd_response_free(run_ok(b));
	took = harness_now_us() - t0;
	/*
	 * The copy was still queued behind the spin when the answer came
	 * (1.5 s of spin, so a daemon under valgrind on a loaded machine
	 * has 1.2 s to answer).
	 */
	if (is_host_backend())
		ck_assert_msg(took < 1200000,
			      "the batch took %llu us: the "
			      "release did not overlap the copy",
			      (unsigned long long)took);
	/* Gone on both sides: the id is free, the daemon does not know it. */
	ck_assert_int_eq(gpucmd_region_release(c, 7), GPUCMD_ENOTFOUND);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_write_region(b, 1, 0, 7, 0, 1), 0);
	ck_assert_int_eq(run_code(b, NULL, 0), GPUCMD_ENOTFOUND);
	/* The id is free again here. */
	ck_assert_int_eq(gpucmd_region_create(c, 7, 4096, &p), 0);
	/* The bytes arrived (read on stream 2, after the copy). */
	ck_assert_int_eq(gpucmd_read_buffer(c, 2, 1, 0, N, got), 0);
	ck_assert_int_eq(memcmp(got, want, N), 0);
	free(want);
	free(got);
	gpucmd_close(c);
}
END_TEST

/*
 * A release that never runs (an earlier op of its batch failed) keeps the
 * region usable; ids are reused after a release, with another size.
 */
START_TEST(region_ids_reused_after_release)
{
	struct gpucmd_conn *c = connect_as("regions");
	struct gpucmd_batch *b;
	uint8_t *m;
	void *p;

	ck_assert_int_eq(gpucmd_region_create(c, 1, 4096, &p), 0);
	/* The write fails (no handle 9): the release after it does not run. */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_write_region(b, 9, 0, 1, 0, 8), 0);
	ck_assert_int_eq(gpucmd_batch_release_region(b, 1), 0);
	ck_assert_int_eq(run_code(b, NULL, 0), GPUCMD_ENOTFOUND);
	ck_assert_int_eq(gpucmd_region_create(c, 1, 4096, &p), GPUCMD_EEXIST);
	/* Still mapped here and attached there. */
	m = p;
	fill(m, 16, 3);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_create_region(b, 1, 1, 0, 16), 0);
	ck_assert_int_eq(gpucmd_batch_read_region(b, 1, 0, 16, 1, 100), 0);
	gpucmd_response_free(run_ok(b));
	ck_assert_int_eq(memcmp(m + 100, m, 16), 0);
	for (int round = 0; round < 5; round++) {
		size_t size = (size_t)4096 << round;

		ck_assert_int_eq(gpucmd_region_release(c, 1), 0);
		ck_assert_int_eq(gpucmd_region_create(c, 1, size, &p), 0);
		m = p;
		/* A new memfd: fresh zeroes, the whole new size usable. */
		ck_assert_uint_eq(m[0], 0);
		ck_assert_uint_eq(m[100], 0);
		fill(m + size - 16, 16, (uint32_t)round);
		ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
		ck_assert_int_eq(gpucmd_batch_write_region(b, 1, 0, 1,
							   size - 16, 16),
				 0);
		ck_assert_int_eq(gpucmd_batch_read_region(b, 1, 0, 16, 1, 0),
				 0);
		gpucmd_response_free(run_ok(b));
		ck_assert_int_eq(memcmp(m, m + size - 16, 16), 0);
	}
	/* Many creates and releases stay under the per-connection limit. */
	for (int i = 0; i < 200; i++) {
		ck_assert_int_eq(gpucmd_region_create(c, 1000 + (uint64_t)i % 3,
						      4096, &p),
				 0);
		ck_assert_int_eq(gpucmd_region_release(c,
						       1000 + (uint64_t)i % 3),
				 0);
	}
	gpucmd_close(c);
}
END_TEST

/* Past the daemon's count of regions per connection: GPUCMD_ELIMIT. */
START_TEST(region_count_limit)
{
	struct gpucmd_conn *c = connect_as("regions");
	uint64_t id;
	void *p;
	int rc = 0;

	for (id = 1; id <= 1000; id++) {
		rc = gpucmd_region_create(c, id, 4096, &p);
		if (rc != 0)
			break;
	}
	ck_assert_int_eq(rc, GPUCMD_ELIMIT);
	ck_assert_uint_gt(id, 1);
	/* One released makes room for one more. */
	ck_assert_int_eq(gpucmd_region_release(c, 1), 0);
	ck_assert_int_eq(gpucmd_region_create(c, id, 4096, &p), 0);
	gpucmd_close(c);
}
END_TEST

/*
 * A client killed (SIGKILL) with regions mapped and a copy from one
 * queued behind a long kernel: the daemon ends up holding nothing, and
 * serves the next client.
 */
/* Two regions, copies to and from them queued behind a 0.3 s spin. */
static int doomed_with_copies(void *arg)
{
	struct gpucmd_arg spin = { .kind = GPUCMD_ARG_U32, .v.u32 = 300000 };
	struct gpucmd_conn *c = NULL;
	struct gpucmd_batch *b;
	uint64_t id;
	void *p, *q;

	(void)arg;
	if (gpucmd_connect(the_daemon.sock, "doomed", &c, NULL, 0) != 0 ||
	    gpucmd_region_create(c, 1, 8 << 20, &p) != 0 ||
	    gpucmd_region_create(c, 2, 8 << 20, &q) != 0 ||
	    gpucmd_batch_new(c, 0, &b) != 0)
		return 1;
	fill(p, 8 << 20, 1);
	gpucmd_batch_empty(b, 1, 8 << 20);
	gpucmd_batch_kernel(b, "spin", ONE, ONE, &spin, 1);
	gpucmd_batch_write_region(b, 1, 0, 1, 0, 8 << 20);
	gpucmd_batch_read_region(b, 1, 0, 8 << 20, 2, 0);
	return gpucmd_submit(b, &id) != 0;
}

START_TEST(client_killed_with_regions_and_copies_in_flight)
{
	struct gpucmd_conn *obs = connect_as("observer");
	struct gpucmd_service_report t;
	pid_t pid = harness_child_ready(doomed_with_copies, NULL);

	/* Let the daemon take the request, then kill mid-spin. */
	usleep(50000);
	harness_child_kill(pid);
	for (int i = 0; i < 1000; i++) {
		t = report_totals(obs);
		if (t.bytes_reserved == 0 && t.allocations == 0 &&
		    t.connections == 1)
			break;
		usleep(10000);
	}
	t = report_totals(obs);
	ck_assert_uint_eq(t.allocations, 0);
	ck_assert_uint_eq(t.bytes_in_use, 0);
	ck_assert_uint_eq(t.bytes_reserved, 0);
	ck_assert_uint_eq(t.connections, 1);
	gpucmd_close(obs);
	/* And a new client with a region of its own is served. */
	{
		struct gpucmd_conn *c = connect_as("after");
		uint8_t buf[64];
		void *p;

		ck_assert_int_eq(gpucmd_region_create(c, 1, 4096, &p), 0);
		fill(p, 64, 4);
		{
			struct gpucmd_batch *b;

			ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
			ck_assert_int_eq(gpucmd_batch_create_region(b, 1, 1, 0,
								    64),
					 0);
			gpucmd_response_free(run_ok(b));
		}
		ck_assert_int_eq(gpucmd_read_buffer(c, 0, 1, 0, 64, buf), 0);
		ck_assert_int_eq(memcmp(buf, p, 64), 0);
		gpucmd_close(c);
	}
}
END_TEST

/* Convenience calls of sizes around the threshold round-trip. */
START_TEST(convenience_round_trips)
{
	static const size_t sizes[] = {
		0,	    1, 4097, GPUCMD_INLINE_MAX, GPUCMD_INLINE_MAX + 1,
		3 * MIB + 5
	};
	struct gpucmd_conn *c = connect_as("regions");
	size_t max = 3 * MIB + 5;
	uint8_t *want = malloc(max + 8), *got = malloc(max + 8);
	struct gpucmd_batch *b;

	ck_assert_ptr_nonnull(want);
	ck_assert_ptr_nonnull(got);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 1, max + 8), 0);
	gpucmd_response_free(run_ok(b));
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t n = sizes[k];

		fill(want, n, (uint32_t)k + 40);
		memset(got, 0xee, n + 1);
		ck_assert_int_eq(gpucmd_write_buffer(c, 0, 1, 3, want, n), 0);
		ck_assert_int_eq(gpucmd_read_buffer(c, 0, 1, 3, n, got), 0);
		ck_assert_msg(memcmp(got, want, n) == 0, "%zu bytes differ", n);
		ck_assert_uint_eq(got[n], 0xee);
	}
	/* Errors of the copy come back as the call's. */
	ck_assert_int_eq(gpucmd_read_buffer(c, 0, 1, max, 16, got),
			 GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_read_buffer(c, 0, 1, 0, max + 9, got),
			 GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_write_buffer(c, 0, 77, 0, want, 2 * MIB),
			 GPUCMD_ENOTFOUND);
	ck_assert_int_eq(gpucmd_write_buffer(c, 0, 0, 0, want, 1),
			 GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_read_buffer(c, 0, 1, 0, 1, NULL),
			 GPUCMD_EINVAL);
	/* The caller's ids are untouched by the scratch region. */
	{
		void *p;

		ck_assert_int_eq(gpucmd_region_create(c, 1, 4096, &p), 0);
		ck_assert_int_eq(gpucmd_region_release(c, 1), 0);
	}
	free(want);
	free(got);
	gpucmd_close(c);
}
END_TEST

/*
 * gpucmd_create_buffer allocates and fills a buffer of any size in one
 * call (inline up to the frame, else through the scratch region), and
 * leaves no buffer when it fails: an allocation refused, or a fill that
 * failed after the allocation (a fault on the stream), which releases it.
 */
START_TEST(create_buffer_of_any_size)
{
	static const size_t sizes[] = { 1, GPUCMD_INLINE_MAX,
					GPUCMD_INLINE_MAX + 1, 3 * MIB + 5 };
	struct gpucmd_conn *c = connect_as("regions");
	size_t max = 3 * MIB + 5;
	uint8_t *want = malloc(max), *got = malloc(max);
	struct gpucmd_batch *b;
	char msg[512];

	ck_assert_ptr_nonnull(want);
	ck_assert_ptr_nonnull(got);
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t n = sizes[k];

		fill(want, n, (uint32_t)k + 7);
		ck_assert_int_eq(gpucmd_create_buffer(c, 0, 10 + k, want, n),
				 0);
		ck_assert_str_eq(gpucmd_last_message(c), "");
		memset(got, 0, n);
		ck_assert_int_eq(gpucmd_read_buffer(c, 0, 10 + k, 0, n, got),
				 0);
		ck_assert_msg(memcmp(got, want, n) == 0, "%zu bytes differ", n);
		/* Exactly n bytes: one more is out of bounds. */
		ck_assert_int_eq(gpucmd_read_buffer(c, 0, 10 + k, n, 1, got),
				 GPUCMD_EINVAL);
	}
	/* Refusals, with their sentences; nothing is left. */
	ck_assert_int_eq(gpucmd_create_buffer(c, 0, 10, want, 4),
			 GPUCMD_EEXIST);
	ck_assert_int_eq(gpucmd_create_buffer(c, 0, 0, want, 4), GPUCMD_EINVAL);
	expect_message(c, "gpucmd_create_buffer: handle 0 names no buffer");
	ck_assert_int_eq(gpucmd_create_buffer(c, 0, 20, NULL, 4),
			 GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_create_buffer(c, 0, 20, want,
					      UINT64_C(1) << 50),
			 GPUCMD_ETOOBIG);
	ck_assert_msg(strstr(gpucmd_last_message(c), "too big") != NULL,
		      "message: '%s'", gpucmd_last_message(c));
	ck_assert_int_eq(gpucmd_read_buffer(c, 0, 20, 0, 1, got),
			 GPUCMD_ENOTFOUND);

	/* A fault on the stream fails the fill: the buffer goes again. */
	ck_assert_int_eq(gpucmd_batch_new(c, 3, &b), 0);
	ck_assert_int_eq(gpucmd_batch_kernel(b, "fault", ONE, ONE, NULL, 0), 0);
	ck_assert_int_eq(run_code(b, msg, sizeof(msg)), 0);
	ck_assert_int_eq(gpucmd_create_buffer(c, 3, 21, want, 2 * MIB),
			 GPUCMD_ESTREAM);
	ck_assert_msg(strstr(gpucmd_last_message(c), "fault") != NULL,
		      "message: '%s'", gpucmd_last_message(c));
	ck_assert_int_eq(gpucmd_read_buffer(c, 0, 21, 0, 1, got),
			 GPUCMD_ENOTFOUND);
	free(want);
	free(got);
	gpucmd_close(c);
}
END_TEST

/* A daemon whose frames hold at most 1 MiB. */
static void small_frames_setup(void)
{
	daemon_start_args(&the_daemon, "--max-frame-bytes", "1M", NULL);
}

/*
 * With 1 MiB frames, 64 MiB (and 100 MiB, in pieces through the largest
 * scratch region) still move in one call each: they went through a
 * region.  Inline, 2 MiB does not fit.
 */
START_TEST(convenience_uses_a_region_when_frames_are_small)
{
	const size_t n = 100 * MIB;
	struct gpucmd_conn *c = connect_as("regions");
	uint8_t *want = malloc(n), *got = malloc(n);
	struct gpucmd_batch *b;
	int rc;

	ck_assert_ptr_nonnull(want);
	ck_assert_ptr_nonnull(got);
	ck_assert_uint_eq(gpucmd_info(c)->max_frame_bytes, MIB);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 1, n), 0);
	gpucmd_response_free(run_ok(b));
	/* Inline cannot carry it. */
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	rc = gpucmd_batch_write(b, 1, 0, want, 2 * MIB);
	ck_assert_int_eq(rc, GPUCMD_ELIMIT);
	gpucmd_batch_free(b);

	fill(want, 64 * MIB, 11);
	ck_assert_int_eq(gpucmd_write_buffer(c, 0, 1, 0, want, 64 * MIB), 0);
	memset(got, 0, 64 * MIB);
	ck_assert_int_eq(gpucmd_read_buffer(c, 0, 1, 0, 64 * MIB, got), 0);
	ck_assert_int_eq(memcmp(got, want, 64 * MIB), 0);

	fill(want, n, 12);
	ck_assert_int_eq(gpucmd_write_buffer(c, 3, 1, 0, want, n), 0);
	memset(got, 0, n);
	ck_assert_int_eq(gpucmd_read_buffer(c, 3, 1, 0, n, got), 0);
	ck_assert_int_eq(memcmp(got, want, n), 0);
	/* An odd piece at an odd offset. */
	ck_assert_int_eq(gpucmd_read_buffer(c, 0, 1, 12345, n - 12346, got), 0);
	ck_assert_int_eq(memcmp(got, want + 12345, n - 12346), 0);
	free(want);
	free(got);
	gpucmd_close(c);
}
END_TEST

/* Descriptors this process has open. */
static int open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while (readdir(d) != NULL)
		n++;
	closedir(d);
	return n;
}

/*
 * A stream fault is reported at the batch's first read once every op of
 * it has run, the region_release after that read included: the library
 * forgets the region (its memfd and mapping go), and the id can be made
 * again.  It used to keep the entry for good (EEXIST), and a release of it
 * that the daemon no longer knows now forgets it too.
 */
START_TEST(release_after_a_fault_is_settled)
{
	struct gpucmd_conn *c = connect_as("regions");
	struct gpucmd_batch *b;
	int fds0 = open_fds();
	void *p;

	ck_assert_int_eq(gpucmd_region_create(c, 5, 4096, &p), 0);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 1, 4096), 0);
	ck_assert_int_eq(gpucmd_batch_kernel(b, "fault", ONE, ONE, NULL, 0), 0);
	ck_assert_int_eq(gpucmd_batch_read_region(b, 1, 0, 4096, 5, 0), 0);
	ck_assert_int_eq(gpucmd_batch_release_region(b, 5), 0);
	ck_assert_int_eq(run_code(b, NULL, 0), GPUCMD_ESTREAM);
	ck_assert_int_eq(open_fds(), fds0);
	ck_assert_int_eq(gpucmd_region_create(c, 5, 4096, &p), 0);
	ck_assert_int_eq(gpucmd_region_release(c, 5), 0);
	ck_assert_int_eq(open_fds(), fds0);
	gpucmd_close(c);
}
END_TEST

/*
 * A piece of a convenience write that fails keeps its sentence, though a
 * piece after it succeeded (70 MiB into 69: pieces of 32, 32 and 6 MiB).
 */
START_TEST(convenience_failure_keeps_its_message)
{
	const size_t n = 70 * MIB;
	struct gpucmd_conn *c = connect_as("regions");
	struct gpucmd_batch *b;
	uint8_t *data = calloc(1, n);

	ck_assert_ptr_nonnull(data);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 1, 69 * MIB), 0);
	gpucmd_response_free(run_ok(b));
	ck_assert_int_eq(gpucmd_write_buffer(c, 0, 1, 0, data, n),
			 GPUCMD_EINVAL);
	ck_assert_msg(strstr(gpucmd_last_message(c), "out of bounds") != NULL,
		      "message: '%s'", gpucmd_last_message(c));
	free(data);
	gpucmd_close(c);
}
END_TEST

/* One request in flight, and 8 MiB of regions for the service. */
static void tight_setup(void)
{
	char conf[192];

	harness_config("[limits]\nmax_in_flight = 1\n"
		       "[service regions]\nregion_limit = 8M\n"
		       "[service little]\nregion_limit = 3M\n",
		       conf, sizeof(conf));
	daemon_start_args(&the_daemon, "--config", conf, "--max-frame-bytes",
			  "64K", NULL);
}

/*
 * With max_in_flight = 1 the convenience calls move one piece at a time
 * (they kept two in flight and failed with ELIMIT); their scratch region
 * takes a quarter of region_limit at most, and gives way to the caller's
 * own region when that would not fit beside it.
 */
START_TEST(convenience_within_tight_limits)
{
	const size_t n = 6 * MIB + 123;
	struct gpucmd_conn *c = connect_as("regions");
	uint8_t *want = malloc(n), *got = malloc(n);
	struct gpucmd_batch *b;
	void *p;

	ck_assert_ptr_nonnull(want);
	ck_assert_ptr_nonnull(got);
	ck_assert_uint_eq(gpucmd_info(c)->max_in_flight, 1);
	ck_assert_uint_eq(gpucmd_info(c)->region_limit, 8 * MIB);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 1, n), 0);
	gpucmd_response_free(run_ok(b));
	fill(want, n, 21);
	ck_assert_int_eq(gpucmd_write_buffer(c, 0, 1, 0, want, n), 0);
	memset(got, 0, n);
	ck_assert_int_eq(gpucmd_read_buffer(c, 0, 1, 0, n, got), 0);
	ck_assert_int_eq(memcmp(got, want, n), 0);
	/* 7 MiB fit only if the scratch region makes way. */
	ck_assert_int_eq(gpucmd_region_create(c, 3, 7 * MIB, &p), 0);
	memset(got, 0, n);
	ck_assert_int_eq(gpucmd_read_buffer(c, 0, 1, 0, n, got), 0);
	ck_assert_int_eq(memcmp(got, want, n), 0);
	ck_assert_int_eq(gpucmd_region_release(c, 3), 0);
	free(want);
	free(got);
	gpucmd_close(c);
}
END_TEST

/* Handle 1 on c, n bytes, written and read back by the convenience calls. */
static void buffer_round_trip(struct gpucmd_conn *c, size_t n, unsigned seed)
{
	uint8_t *want = malloc(n), *got = calloc(1, n);
	struct gpucmd_batch *b;

	ck_assert_ptr_nonnull(want);
	ck_assert_ptr_nonnull(got);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, &b), 0);
	ck_assert_int_eq(gpucmd_batch_empty(b, 1, n), 0);
	gpucmd_response_free(run_ok(b));
	fill(want, n, seed);
	ck_assert_int_eq(gpucmd_write_buffer(c, 0, 1, 0, want, n), 0);
	ck_assert_int_eq(gpucmd_read_buffer(c, 0, 1, 0, n, got), 0);
	ck_assert_int_eq(memcmp(got, want, n), 0);
	ck_assert_int_eq(gpucmd_write_buffer(c, 0, 1, 0, want, n), 0);
	free(want);
	free(got);
}

/* The report's row of service, as c sees it. */
static struct gpucmd_service_report row_of(struct gpucmd_conn *c,
					   const char *service)
{
	struct gpucmd_report *rep = NULL;
	struct gpucmd_service_report row = { .id = 0 };

	ck_assert_int_eq(gpucmd_memory_report(c, &rep), 0);
	for (size_t i = 0; i < rep->nservices; i++)
		if (strcmp(rep->services[i].name, service) == 0)
			row = rep->services[i];
	gpucmd_report_free(rep);
	ck_assert_msg(row.id != 0, "no row for service %s", service);
	row.streams = NULL;
	return row;
}

/*
 * A service whose quarter of region_limit is under the scratch region's
 * least size (1 MiB) gets no scratch region: the convenience calls go
 * inline, so its own regions keep the whole limit.  The scratch region
 * used to take 1 MiB of a 3M limit anyway, and another connection of the
 * service was then refused a region of 2.2 MiB it could not free.
 */
START_TEST(no_scratch_region_past_a_quarter_of_a_small_limit)
{
	struct gpucmd_conn *a = connect_as("little"),
			   *b2 = connect_as("little");
	void *p;

	buffer_round_trip(a, 2 * MIB, 5);
	ck_assert_uint_eq(row_of(a, "little").region_bytes, 0);
	ck_assert_int_eq(gpucmd_region_create(b2, 5, 2 * MIB + MIB / 5, &p), 0);
	ck_assert_int_eq(gpucmd_region_release(b2, 5), 0);
	gpucmd_close(b2);
	gpucmd_close(a);
}
END_TEST

/*
 * Under a limit of 8M whose place the caller's own region takes (7.5 MiB),
 * the scratch region is refused: the transfers go inline, and only the
 * first asks (for 2 MiB, then 1 MiB: two refusals, not two per transfer).
 */
START_TEST(a_refused_scratch_region_is_not_asked_for_again)
{
	struct gpucmd_conn *c = connect_as("regions");
	void *p;

	ck_assert_int_eq(gpucmd_region_create(c, 3, 7 * MIB + MIB / 2, &p), 0);
	buffer_round_trip(c, 2 * MIB, 9);
	ck_assert_uint_eq(row_of(c, "regions").region_refusals, 2);
	ck_assert_int_eq(gpucmd_region_release(c, 3), 0);
	gpucmd_close(c);
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("region_api");
	TCase *tc = tcase_create("regions");
	TCase *small = tcase_create("small_frames");

	tcase_add_checked_fixture(tc, harness_setup, harness_teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, round_trips_of_every_size);
	tcase_add_test(tc, strided_copies);
	tcase_add_test(tc, bounds_and_id_errors);
	tcase_add_test(tc, release_in_same_batch_as_copy_in_flight);
	tcase_add_test(tc, region_ids_reused_after_release);
	tcase_add_test(tc, region_count_limit);
	tcase_add_test(tc, client_killed_with_regions_and_copies_in_flight);
	tcase_add_test(tc, convenience_round_trips);
	tcase_add_test(tc, create_buffer_of_any_size);
	tcase_add_test(tc, release_after_a_fault_is_settled);
	tcase_add_test(tc, convenience_failure_keeps_its_message);
	suite_add_tcase(s, tc);
	{
		TCase *tight = tcase_create("tight");

		tcase_add_checked_fixture(tight, tight_setup, harness_teardown);
		tcase_set_timeout(tight, 120);
		tcase_add_test(tight, convenience_within_tight_limits);
		tcase_add_test(
			tight,
			no_scratch_region_past_a_quarter_of_a_small_limit);
		tcase_add_test(tight,
			       a_refused_scratch_region_is_not_asked_for_again);
		suite_add_tcase(s, tight);
	}
	tcase_add_checked_fixture(small, small_frames_setup, harness_teardown);
	tcase_set_timeout(small, 120);
	tcase_add_test(small, convenience_uses_a_region_when_frames_are_small);
	suite_add_tcase(s, small);
	return s;
}

int main(void)
{
	return harness_main(make_suite());
}
