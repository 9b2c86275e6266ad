/*
 * test_ops.c - every op of the seed's Command API through the client
 * library against a real gpucmdd, one test per op and per error it can
 * return, asserting the values that come back: reservations and bind,
 * cursor, stream reports that add up, cleanup and drops, allocation modes,
 * pool layouts, strided copies, profiles, graph capture and replay, evict
 * and cleanup of a service, and cross-stream ordering under random delays.
 */
#include <stdint.h>

#include "harness.h"

static const uint32_t ONE[3] = { 1, 1, 1 };
static const uint32_t B64[3] = { 64, 1, 1 };

/* The bit pattern of a float, for fill_u32. */
static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static struct gpucmd_batch *batch(struct gpucmd_conn *c, uint32_t stream)
{
	struct gpucmd_batch *b = NULL;

	ck_assert_int_eq(gpucmd_batch_new(c, stream, &b), 0);
	return b;
}

/*
 * Run b, which must come back as a response (the round trip works), and
 * return the batch's own outcome; *index gets the failing op (when not
 * NULL) and the message is kept for the caller's assertions.
 */
static char last_message[1024];

static int run_code(struct gpucmd_batch *b, int *index)
{
	struct gpucmd_response *r = NULL;
	int rc = gpucmd_run(b, &r);

	ck_assert_msg(rc == 0, "run: %s", gpucmd_strerror(rc));
	rc = gpucmd_response_error(r);
	if (index != NULL)
		*index = gpucmd_response_failed_index(r);
	snprintf(last_message, sizeof(last_message), "%s",
		 gpucmd_response_message(r));
	gpucmd_response_free(r);
	return rc;
}

static void run_done(struct gpucmd_batch *b)
{
	gpucmd_response_free(run_ok(b));
}

/* Run b, which a limit must refuse with a message holding words. */
static void run_over_limit(struct gpucmd_batch *b, const char *words)
{
	int idx;

	ck_assert_int_eq(run_code(b, &idx), GPUCMD_ELIMIT);
	ck_assert_msg(strstr(last_message, words) != NULL, "%s", last_message);
}

/* End the capture on c's stream 0 as graph id, destroy it, and sync. */
static void end_and_destroy(struct gpucmd_conn *c, uint64_t id)
{
	struct gpucmd_batch *b = batch(c, 0);

	gpucmd_batch_capture_end(b, id);
	gpucmd_batch_graph_destroy(b, id);
	gpucmd_batch_sync(b);
	run_done(b);
}

/* The pool kinds of sr, in routing order, as one string "sliced,direct,...". */
static const char *pool_kinds(const struct gpucmd_stream_report *sr)
{
	static char kinds[512];

	kinds[0] = '\0';
	for (size_t p = 0; p < sr->npools; p++)
		snprintf(kinds + strlen(kinds), sizeof(kinds) - strlen(kinds),
			 "%s%s", p ? "," : "", sr->pools[p].kind);
	return kinds;
}

static struct gpucmd_stream_report *stream_report(struct gpucmd_conn *c,
						  uint32_t stream);

/*
 * As in the reference (cubecl-runtime.md §4.9, §11.7): an installed layout
 * rebuilds the caller's stream and is the layout of the streams the
 * connection makes later; its other streams keep theirs, and so do other
 * connections.
 */
START_TEST(installed_layout_applies_to_later_streams)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_conn *other = connect_as("ops");
	const struct gpucmd_pool_options pools[] = {
		{ .kind = "sliced",
		  .page_size = 1 << 20,
		  .max_slice = 256 << 10 },
		{ .kind = "direct" },
	};
	struct gpucmd_stream_report *sr;
	struct gpucmd_batch *b;
	char before[512];

	sr = stream_report(c, 1);
	snprintf(before, sizeof(before), "%s", pool_kinds(sr));
	ck_assert_uint_gt(sr->npools, 3);
	gpucmd_stream_report_free(sr);
	b = batch(c, 0);
	gpucmd_batch_install_pools(b, "custom", pools, 2);
	run_done(b);
	sr = stream_report(c, 0);
	ck_assert_str_eq(pool_kinds(sr), "sliced,direct,persistent");
	gpucmd_stream_report_free(sr);
	/* A stream made after the install gets the installed layout. */
	sr = stream_report(c, 2);
	ck_assert_str_eq(pool_kinds(sr), "sliced,direct,persistent");
	ck_assert_uint_eq(sr->pools[0].page_size, 1 << 20);
	ck_assert_uint_eq(sr->pools[0].max_slice, 256 << 10);
	gpucmd_stream_report_free(sr);
	/* One made before keeps its own, as does another connection. */
	sr = stream_report(c, 1);
	ck_assert_str_eq(pool_kinds(sr), before);
	gpucmd_stream_report_free(sr);
	sr = stream_report(other, 2);
	ck_assert_str_eq(pool_kinds(sr), before);
	gpucmd_stream_report_free(sr);
	/* A refused install changes nothing for later streams either. */
	b = batch(c, 1);
	gpucmd_batch_empty(b, 1, 64);
	gpucmd_batch_install_pools(b, "exclusive", NULL, 0);
	ck_assert_int_eq(run_code(b, NULL), GPUCMD_EPOOLSINUSE);
	sr = stream_report(c, 3);
	ck_assert_str_eq(pool_kinds(sr), "sliced,direct,persistent");
	gpucmd_stream_report_free(sr);
	gpucmd_close(other);
	gpucmd_close(c);
}
END_TEST

static struct gpucmd_memory_usage usage(struct gpucmd_conn *c, uint32_t stream)
{
	struct gpucmd_batch *b = batch(c, stream);
	struct gpucmd_response *r;
	struct gpucmd_memory_usage u;

	ck_assert_int_eq(gpucmd_batch_memory_usage(b), 0);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_usage(r, 0, &u), 0);
	gpucmd_response_free(r);
	return u;
}

static struct gpucmd_stream_report *stream_report(struct gpucmd_conn *c,
						  uint32_t stream)
{
	struct gpucmd_batch *b = batch(c, stream);
	struct gpucmd_stream_report *sr = NULL;
	struct gpucmd_response *r;

	ck_assert_int_eq(gpucmd_batch_stream_report(b), 0);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_stream_report(r, 0, &sr), 0);
	gpucmd_response_free(r);
	return sr;
}

static uint64_t cursor(struct gpucmd_conn *c, uint32_t stream)
{
	struct gpucmd_batch *b = batch(c, stream);
	struct gpucmd_response *r;
	uint64_t v;

	ck_assert_int_eq(gpucmd_batch_cursor(b), 0);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_value(r, 0, &v), 0);
	gpucmd_response_free(r);
	return v;
}

static void add_usage(struct gpucmd_memory_usage *sum,
		      const struct gpucmd_memory_usage *u)
{
	sum->allocations += u->allocations;
	sum->bytes_in_use += u->bytes_in_use;
	sum->bytes_padding += u->bytes_padding;
	sum->bytes_reserved += u->bytes_reserved;
}

static void assert_usage_eq(const struct gpucmd_memory_usage *a,
			    const struct gpucmd_memory_usage *b)
{
	ck_assert_uint_eq(a->allocations, b->allocations);
	ck_assert_uint_eq(a->bytes_in_use, b->bytes_in_use);
	ck_assert_uint_eq(a->bytes_padding, b->bytes_padding);
	ck_assert_uint_eq(a->bytes_reserved, b->bytes_reserved);
}

static struct gpucmd_memory_usage
pools_sum(const struct gpucmd_stream_report *sr)
{
	struct gpucmd_memory_usage sum = { 0 };

	for (size_t p = 0; p < sr->npools; p++)
		add_usage(&sum, &sr->pools[p].usage);
	return sum;
}

/* The pool of kind holding allocations, or NULL. */
static const struct gpucmd_pool_report *
pool_with(const struct gpucmd_stream_report *sr, const char *kind)
{
	for (size_t p = 0; p < sr->npools; p++)
		if (strcmp(sr->pools[p].kind, kind) == 0 &&
		    sr->pools[p].usage.allocations > 0)
			return &sr->pools[p];
	return NULL;
}

/* The service named name in a fresh memory report (copied), or -1. */
static int service_usage(struct gpucmd_conn *c, const char *name,
			 struct gpucmd_service_report *out)
{
	struct gpucmd_report *rep = NULL;
	int found = -1;

	ck_assert_int_eq(gpucmd_memory_report(c, &rep), 0);
	for (size_t i = 0; i < rep->nservices; i++) {
		if (strcmp(rep->services[i].name, name) != 0)
			continue;
		*out = rep->services[i];
		out->streams = NULL; /* they go with the report */
		found = 0;
	}
	gpucmd_report_free(rep);
	return found;
}

/* ---- reserve and bind ------------------------------------------------------ */

START_TEST(reserve_bind_write_read)
{
	struct gpucmd_conn *c = connect_as("ops");
	const char text[] = "written through a bound reservation";
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_response *r;
	struct gpucmd_memory_usage u;
	const void *data;
	size_t len;

	ck_assert_int_eq(gpucmd_batch_reserve(b, 5, 256), 0);
	ck_assert_int_eq(gpucmd_batch_memory_usage(b), 0);
	ck_assert_int_eq(gpucmd_batch_bind(b, 5, 40), 0);
	ck_assert_int_eq(gpucmd_batch_write(b, 40, 8, text, sizeof(text)), 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 40, 0, 8 + sizeof(text)), 0);
	r = run_ok(b);
	/* The reservation is memory already: counted before any bind. */
	ck_assert_int_eq(gpucmd_response_usage(r, 1, &u), 0);
	ck_assert_uint_eq(u.allocations, 1);
	ck_assert_uint_eq(u.bytes_in_use, 256);
	ck_assert_int_eq(gpucmd_response_data(r, 4, &data, &len), 0);
	ck_assert_uint_eq(len, 8 + sizeof(text));
	ck_assert_int_eq(memcmp((const uint8_t *)data + 8, text, sizeof(text)),
			 0);
	/* Fresh memory reads as zeros before the write. */
	for (int i = 0; i < 8; i++)
		ck_assert_uint_eq(((const uint8_t *)data)[i], 0);
	gpucmd_response_free(r);
	/* Bound: the handle now owns it, and release returns it. */
	b = batch(c, 0);
	gpucmd_batch_release(b, 40);
	gpucmd_batch_sync(b);
	run_done(b);
	u = usage(c, 0);
	ck_assert_uint_eq(u.allocations, 0);
	ck_assert_uint_eq(u.bytes_in_use, 0);
	gpucmd_close(c);
}
END_TEST

START_TEST(bind_unknown_or_used_reservation)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_batch *b;
	int idx;

	/* Never reserved. */
	b = batch(c, 0);
	gpucmd_batch_bind(b, 77, 1);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	ck_assert_int_eq(idx, 0);
	ck_assert_msg(strstr(last_message, "77") != NULL, "%s", last_message);
	/* Bound once, then again. */
	b = batch(c, 0);
	gpucmd_batch_reserve(b, 3, 64);
	gpucmd_batch_bind(b, 3, 1);
	gpucmd_batch_bind(b, 3, 2);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	ck_assert_int_eq(idx, 2);
	/* A live reservation id cannot be reserved again. */
	b = batch(c, 0);
	gpucmd_batch_reserve(b, 9, 64);
	gpucmd_batch_reserve(b, 9, 64);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EEXIST);
	ck_assert_int_eq(idx, 1);
	/* Binding to a handle that is live keeps the reservation. */
	b = batch(c, 0);
	gpucmd_batch_bind(b, 9, 1);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EEXIST);
	b = batch(c, 0);
	gpucmd_batch_bind(b, 9, 2);
	run_done(b);
	/* Zero ids never leave the library. */
	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_reserve(b, 0, 64), GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_batch_bind(b, 9, 0), GPUCMD_EINVAL);
	ck_assert_uint_eq(gpucmd_batch_count(b), 0);
	gpucmd_batch_free(b);
	gpucmd_close(c);
}
END_TEST

START_TEST(reserve_too_big)
{
	struct gpucmd_conn *c = connect_as("ops");
	uint64_t huge = gpucmd_info(c)->device_total_memory * 4;
	struct gpucmd_batch *b;
	struct gpucmd_service_report s;
	int idx;

	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 100);
	gpucmd_batch_empty(b, 2, huge);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_ETOOBIG);
	ck_assert_int_eq(idx, 1);
	ck_assert_msg(strstr(last_message, "too big") != NULL, "%s",
		      last_message);
	b = batch(c, 0);
	gpucmd_batch_reserve(b, 1, huge);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_ETOOBIG);
	/* Nothing of the refused sizes was charged. */
	ck_assert_int_eq(service_usage(c, "ops", &s), 0);
	ck_assert_uint_eq(s.bytes_in_use, 100);
	ck_assert_uint_eq(s.allocations, 1);
	gpucmd_close(c);
}
END_TEST

static struct gpucmd_memory_usage usage(struct gpucmd_conn *c, uint32_t stream);

/*
 * The seed's BufferTooBig: no device could ever fit it.  A size over the
 * device's memory is that in every mode and layout, persistent and direct
 * ones too, whose pools take any size: it is refused at once, without
 * taking back the memory other connections keep for reuse first.
 */
START_TEST(reserve_over_the_device_is_too_big)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_conn *other = connect_as("ops");
	uint64_t total = gpucmd_info(c)->device_total_memory;
	const struct gpucmd_pool_options direct = { .kind = "direct" };
	struct gpucmd_memory_usage u;
	struct gpucmd_batch *b;
	uint64_t kept;
	int idx;

	/* Memory the other connection keeps with nothing live in it. */
	b = batch(other, 0);
	gpucmd_batch_empty(b, 1, 1 << 20);
	gpucmd_batch_release(b, 1);
	gpucmd_batch_sync(b);
	run_done(b);
	u = usage(other, 0);
	ck_assert_uint_eq(u.bytes_in_use, 0);
	kept = u.bytes_reserved;
	ck_assert_uint_gt(kept, 0);
	b = batch(c, 0);
	gpucmd_batch_allocation_mode(b, GPUCMD_MODE_PERSISTENT);
	gpucmd_batch_empty(b, 2, total + 1);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_ETOOBIG);
	ck_assert_int_eq(idx, 1);
	ck_assert_msg(strstr(last_message, "too big") != NULL, "%s",
		      last_message);
	b = batch(c, 1);
	gpucmd_batch_install_pools(b, "custom", &direct, 1);
	gpucmd_batch_reserve(b, 3, 2 * total);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_ETOOBIG);
	ck_assert_int_eq(idx, 1);
	u = usage(other, 0);
	ck_assert_uint_eq(u.bytes_reserved, kept);
	gpucmd_close(other);
	gpucmd_close(c);
}
END_TEST

/* ---- cursor and reports --------------------------------------------------- */

START_TEST(cursor_counts_ops)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	uint64_t before, after;
	enum { N = 7 };

	before = cursor(c, 2);
	b = batch(c, 2);
	for (int i = 0; i < N; i++)
		gpucmd_batch_empty(b, (uint64_t)i + 1, 64);
	gpucmd_batch_cursor(b);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_value(r, N, &after), 0);
	/* One per command resolved on the stream, the cursor op too. */
	ck_assert_uint_eq(after, before + N + 1);
	/* Another stream has a cursor of its own. */
	ck_assert_int_eq(gpucmd_response_value(r, 0, &after), GPUCMD_EINVAL);
	gpucmd_response_free(r);
	ck_assert_uint_eq(cursor(c, 3), 1);
	gpucmd_close(c);
}
END_TEST

START_TEST(stream_report_adds_up)
{
	struct gpucmd_conn *c = connect_as("ops");
	static const uint64_t sizes[] = { 1,	   100,	    4096,    5000,
					  1 << 20, 3 << 20, 40 << 20 };
	struct gpucmd_batch *b = batch(c, 1);
	struct gpucmd_stream_report *sr = NULL;
	struct gpucmd_memory_usage u, sum;
	struct gpucmd_response *r;
	uint64_t in_use = 0;

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		gpucmd_batch_empty(b, i + 1, sizes[i]);
		in_use += sizes[i];
	}
	/* One exact-size buffer in the persistent pool too. */
	gpucmd_batch_allocation_mode(b, GPUCMD_MODE_PERSISTENT);
	gpucmd_batch_empty(b, 100, 777);
	gpucmd_batch_allocation_mode(b, GPUCMD_MODE_AUTO);
	in_use += 777;
	gpucmd_batch_release(b, 2);
	in_use -= 100;
	gpucmd_batch_sync(b);
	run_done(b);

	b = batch(c, 1);
	gpucmd_batch_stream_report(b);
	gpucmd_batch_memory_usage(b);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_stream_report(r, 0, &sr), 0);
	ck_assert_int_eq(gpucmd_response_usage(r, 1, &u), 0);
	gpucmd_response_free(r);
	ck_assert_uint_eq(sr->stream, 1);
	ck_assert_uint_eq(sr->connection_id, gpucmd_info(c)->connection_id);
	ck_assert_uint_ge(sr->npools, 2);
	sum = pools_sum(sr);
	assert_usage_eq(&sum, &u);
	assert_usage_eq(&sr->usage, &u);
	ck_assert_uint_eq(u.bytes_in_use, in_use);
	ck_assert_uint_eq(u.allocations, 7);
	ck_assert_uint_ge(u.bytes_reserved, u.bytes_in_use + u.bytes_padding);
	for (size_t p = 0; p < sr->npools; p++) {
		const struct gpucmd_pool_report *pr = &sr->pools[p];

		ck_assert_uint_ge(pr->usage.bytes_reserved,
				  pr->usage.bytes_in_use +
					  pr->usage.bytes_padding);
		ck_assert_uint_le(pr->largest_free,
				  pr->usage.bytes_reserved -
					  pr->usage.bytes_in_use -
					  pr->usage.bytes_padding);
		ck_assert_uint_le(pr->pages, pr->pages_peak);
	}
	gpucmd_stream_report_free(sr);
	gpucmd_close(c);
}
END_TEST

/* ---- cleanup, drops, modes, layouts ----------------------------------------- */

START_TEST(memory_cleanup_returns_free_pages)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_stream_report *sr;
	const struct gpucmd_pool_report *held;
	struct gpucmd_memory_usage before, after;

	gpucmd_batch_empty(b, 1, 1000);
	gpucmd_batch_empty(b, 2, 5 << 20);
	gpucmd_batch_empty(b, 3, 200 << 20);
	gpucmd_batch_sync(b);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_release(b, 2);
	gpucmd_batch_release(b, 3);
	gpucmd_batch_sync(b);
	run_done(b);

	before = usage(c, 0);
	ck_assert_uint_eq(before.allocations, 1);
	ck_assert_uint_ge(before.bytes_reserved, (200 << 20) + (5 << 20));
	b = batch(c, 0);
	gpucmd_batch_memory_cleanup(b);
	run_done(b);
	after = usage(c, 0);
	/* What is left is exactly the page that holds the live buffer. */
	sr = stream_report(c, 0);
	held = pool_with(sr, "sliced");
	ck_assert_ptr_nonnull(held);
	ck_assert_uint_eq(held->pages, 1);
	ck_assert_uint_eq(after.bytes_reserved, held->page_size);
	ck_assert_uint_eq(held->usage.bytes_reserved, held->page_size);
	for (size_t p = 0; p < sr->npools; p++)
		if (sr->pools[p].usage.allocations == 0) {
			ck_assert_uint_eq(sr->pools[p].pages, 0);
			ck_assert_uint_eq(sr->pools[p].usage.bytes_reserved, 0);
		}
	ck_assert_uint_eq(after.bytes_in_use, 1000);
	gpucmd_stream_report_free(sr);
	gpucmd_close(c);
}
END_TEST

/*
 * A buffer whose every use the device is known to have finished (a sync
 * in an earlier request covered it) holds nothing once released, even
 * while the release's own request is still running: a cleanup or a new
 * layout after it in the same request sees the memory free, as the seed
 * has it ("nothing still needs", "keeping the old one when something is
 * still live").  One used in the same request still waits for its work.
 */
START_TEST(release_after_finished_uses_frees_at_once)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_arg fill[3] = { buf_arg(2), u32_arg(7), u32_arg(4) };
	struct gpucmd_arg spin = u32_arg(200000);
	struct gpucmd_memory_usage u;
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	int idx;

	/* Its own stream's buffer, then a layout in the same request. */
	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 1 << 20);
	gpucmd_batch_sync(b);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_release(b, 1);
	gpucmd_batch_install_pools(b, "exclusive", NULL, 0);
	gpucmd_batch_memory_usage(b);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_usage(r, 2, &u), 0);
	ck_assert_uint_eq(u.allocations, 0);
	ck_assert_uint_eq(u.bytes_reserved, 0);
	gpucmd_response_free(r);
	/* Written on another stream, released and cleaned up on its own. */
	b = batch(c, 0);
	gpucmd_batch_empty(b, 2, 64 << 10);
	gpucmd_batch_sync(b);
	run_done(b);
	b = batch(c, 1);
	gpucmd_batch_kernel(b, "fill_u32", ONE, B64, fill, 3);
	gpucmd_batch_sync(b);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_release(b, 2);
	gpucmd_batch_memory_cleanup(b);
	gpucmd_batch_memory_usage(b);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_usage(r, 2, &u), 0);
	ck_assert_uint_eq(u.allocations, 0);
	ck_assert_uint_eq(u.bytes_in_use, 0);
	ck_assert_uint_eq(u.bytes_reserved, 0);
	gpucmd_response_free(r);
	/* Used by work of the same request: it waits for that work. */
	b = batch(c, 0);
	gpucmd_batch_empty(b, 3, 4096);
	gpucmd_batch_kernel(b, "spin", ONE, ONE, &spin, 1);
	gpucmd_batch_read(b, 3, 0, 16);
	gpucmd_batch_release(b, 3);
	gpucmd_batch_install_pools(b, "subslices", NULL, 0);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EPOOLSINUSE);
	ck_assert_int_eq(idx, 4);
	gpucmd_close(c);
}
END_TEST

START_TEST(cleanup_of_the_service)
{
	struct gpucmd_conn *c = connect_as("tidy");
	struct gpucmd_service_report s0, s1;
	struct gpucmd_batch *b;
	uint64_t bytes = 1;

	/* Two streams, each with a page that empties. */
	for (uint32_t st = 0; st < 2; st++) {
		b = batch(c, st);
		gpucmd_batch_empty(b, 10 + st, 64);
		gpucmd_batch_empty(b, 20 + st, 3 << 20);
		gpucmd_batch_sync(b);
		run_done(b);
		b = batch(c, st);
		gpucmd_batch_release(b, 20 + st);
		gpucmd_batch_sync(b);
		run_done(b);
	}
	ck_assert_int_eq(service_usage(c, "tidy", &s0), 0);
	ck_assert_int_eq(gpucmd_cleanup(c, NULL, &bytes), 0);
	ck_assert_int_eq(service_usage(c, "tidy", &s1), 0);
	/* The value is exactly what left the service's reserved bytes. */
	ck_assert_uint_gt(bytes, 0);
	ck_assert_uint_eq(bytes, s0.bytes_reserved - s1.bytes_reserved);
	ck_assert_uint_eq(s1.bytes_in_use, 128);
	/* Nothing more to give: a second cleanup returns nothing. */
	ck_assert_int_eq(gpucmd_cleanup(c, "tidy", &bytes), 0);
	ck_assert_uint_eq(bytes, 0);
	/* A service the daemon does not know is named as such. */
	ck_assert_int_eq(gpucmd_cleanup(c, "nobody-here", &bytes),
			 GPUCMD_ENOTFOUND);
	ck_assert_ptr_nonnull(strstr(gpucmd_last_message(c),
				     "no service 'nobody-here' is known"));
	gpucmd_close(c);
}
END_TEST

START_TEST(flush_drops_deferred_during_capture)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	struct gpucmd_memory_usage u1, u2;

	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 1000);
	gpucmd_batch_empty(b, 2, 64);
	gpucmd_batch_sync(b);
	run_done(b);
	/*
	 * Released on stream 1 while stream 0 records, buffer 1 waits in
	 * stream 0's drop queue for both streams.  The sync answers once
	 * stream 1's fence has landed, so the release is past the device;
	 * only the capture keeps it queued.
	 */
	b = batch(c, 0);
	gpucmd_batch_sync(b);
	gpucmd_batch_capture_begin(b);
	run_done(b);
	b = batch(c, 1);
	gpucmd_batch_release(b, 1);
	gpucmd_batch_sync(b);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_memory_usage(b);
	gpucmd_batch_flush_drops(b);
	gpucmd_batch_memory_usage(b);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_usage(r, 0, &u1), 0);
	ck_assert_int_eq(gpucmd_response_usage(r, 2, &u2), 0);
	gpucmd_response_free(r);
	ck_assert_uint_eq(u1.allocations, 2);
	ck_assert_uint_eq(u2.allocations, 2);
	ck_assert_uint_eq(u2.bytes_in_use, 1064);
	/* The window closes: the queue drains. */
	b = batch(c, 0);
	gpucmd_batch_capture_end(b, 1);
	gpucmd_batch_sync(b);
	run_done(b);
	u1 = usage(c, 0);
	ck_assert_uint_eq(u1.allocations, 1);
	ck_assert_uint_eq(u1.bytes_in_use, 64);
	/* And outside a capture a flush is an op like any other. */
	b = batch(c, 0);
	gpucmd_batch_release(b, 2);
	gpucmd_batch_sync(b);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_flush_drops(b);
	gpucmd_batch_memory_usage(b);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_usage(r, 1, &u1), 0);
	ck_assert_uint_eq(u1.allocations, 0);
	gpucmd_response_free(r);
	gpucmd_close(c);
}
END_TEST

START_TEST(persistent_mode_nests)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_stream_report *sr;
	const struct gpucmd_pool_report *pp;

	ck_assert_int_eq(gpucmd_batch_allocation_mode(b, 7), GPUCMD_EINVAL);
	gpucmd_batch_free(b);
	b = batch(c, 0);
	gpucmd_batch_allocation_mode(b, GPUCMD_MODE_PERSISTENT);
	gpucmd_batch_allocation_mode(b, GPUCMD_MODE_PERSISTENT);
	gpucmd_batch_allocation_mode(b, GPUCMD_MODE_AUTO);
	/* One window is still open: persistent. */
	gpucmd_batch_empty(b, 1, 300);
	gpucmd_batch_allocation_mode(b, GPUCMD_MODE_AUTO);
	/* All closed: a dynamic pool. */
	gpucmd_batch_empty(b, 2, 500);
	run_done(b);
	sr = stream_report(c, 0);
	pp = pool_with(sr, "persistent");
	ck_assert_ptr_nonnull(pp);
	ck_assert_uint_eq(pp->usage.allocations, 1);
	ck_assert_uint_eq(pp->usage.bytes_in_use, 300);
	ck_assert_uint_eq(pp->largest_alloc, 300);
	pp = pool_with(sr, "sliced");
	ck_assert_ptr_nonnull(pp);
	ck_assert_uint_eq(pp->usage.allocations, 1);
	ck_assert_uint_eq(pp->usage.bytes_in_use, 500);
	gpucmd_stream_report_free(sr);
	gpucmd_close(c);
}
END_TEST

START_TEST(install_pools_refused_while_in_use)
{
	struct gpucmd_conn *c = connect_as("ops");
	const struct gpucmd_pool_options pools[] = {
		{ .kind = "sliced",
		  .page_size = 1 << 20,
		  .max_slice = 256 << 10 },
		{ .kind = "exclusive", .max_alloc = 64 << 20 },
		{ .kind = "direct" },
	};
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_stream_report *sr;
	int idx;

	gpucmd_batch_empty(b, 1, 1234);
	gpucmd_batch_install_pools(b, "custom", pools, 3);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EPOOLSINUSE);
	ck_assert_int_eq(idx, 1);
	ck_assert_msg(strstr(last_message, "1234 bytes") != NULL, "%s",
		      last_message);
	/* The old layout stayed: the buffer is still readable. */
	b = batch(c, 0);
	gpucmd_batch_read(b, 1, 0, 1234);
	run_done(b);
	/*
	 * Released behind a kernel on its own stream, the buffer is free in
	 * the pools at once, but the kernel may still use their memory: the
	 * layout waits for a sync, and says so.
	 */
	{
		struct gpucmd_arg spin = u32_arg(300000);

		b = batch(c, 0);
		gpucmd_batch_kernel(b, "spin", ONE, ONE, &spin, 1);
		gpucmd_batch_release(b, 1);
		gpucmd_batch_install_pools(b, "custom", pools, 3);
		ck_assert_int_eq(run_code(b, &idx), GPUCMD_EPOOLSINUSE);
		ck_assert_int_eq(idx, 2);
		ck_assert_msg(strstr(last_message, "sync the stream") != NULL,
			      "%s", last_message);
		/*
		 * A sync in the same request does not make the layout wait
		 * for it (the device thread never waits on the device): the
		 * message says to sync in an earlier request, as it must.
		 */
		b = batch(c, 0);
		gpucmd_batch_empty(b, 5, 4096);
		gpucmd_batch_kernel(b, "spin", ONE, ONE, &spin, 1);
		gpucmd_batch_release(b, 5);
		gpucmd_batch_sync(b);
		gpucmd_batch_install_pools(b, "custom", pools, 3);
		ck_assert_int_eq(run_code(b, &idx), GPUCMD_EPOOLSINUSE);
		ck_assert_int_eq(idx, 4);
		ck_assert_msg(strstr(last_message, "in an earlier request") !=
				      NULL,
			      "%s", last_message);
	}
	b = batch(c, 0);
	gpucmd_batch_sync(b);
	run_done(b);
	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_install_pools(b, "subslices", pools, 3),
			 GPUCMD_EINVAL);
	gpucmd_batch_free(b);
	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_install_pools(b, "custom", pools, 3), 0);
	gpucmd_batch_empty(b, 2, 1000);
	gpucmd_batch_empty(b, 3, 10 << 20);
	gpucmd_batch_empty(b, 4, 100 << 20);
	run_done(b);
	sr = stream_report(c, 0);
	/* The three pools, in order, then the persistent pool. */
	ck_assert_uint_eq(sr->npools, 4);
	ck_assert_str_eq(sr->pools[0].kind, "sliced");
	ck_assert_uint_eq(sr->pools[0].page_size, 1 << 20);
	ck_assert_uint_eq(sr->pools[0].usage.bytes_in_use, 1000);
	ck_assert_str_eq(sr->pools[1].kind, "exclusive");
	ck_assert_uint_eq(sr->pools[1].usage.bytes_in_use, 10 << 20);
	ck_assert_str_eq(sr->pools[2].kind, "direct");
	ck_assert_uint_eq(sr->pools[2].usage.bytes_in_use, 100 << 20);
	ck_assert_str_eq(sr->pools[3].kind, "persistent");
	gpucmd_stream_report_free(sr);
	/* A layout the daemon cannot use is refused with EINVAL. */
	b = batch(c, 1);
	{
		struct gpucmd_pool_options bad = { .kind = "sliced" };

		gpucmd_batch_install_pools(b, "custom", &bad, 1);
	}
	ck_assert_int_eq(run_code(b, NULL), GPUCMD_EINVAL);
	b = batch(c, 1);
	{
		struct gpucmd_pool_options bad = { .kind = "cubes" };

		gpucmd_batch_install_pools(b, "custom", &bad, 1);
	}
	ck_assert_int_eq(run_code(b, NULL), GPUCMD_EINVAL);
	b = batch(c, 1);
	gpucmd_batch_install_pools(b, "mystery", NULL, 0);
	ck_assert_int_eq(run_code(b, NULL), GPUCMD_EINVAL);
	/*
	 * The persistent pool stays across layouts: what lives in it does
	 * not hold the layout back, nor counts in the refusal's numbers.
	 */
	b = batch(c, 3);
	gpucmd_batch_allocation_mode(b, GPUCMD_MODE_PERSISTENT);
	gpucmd_batch_empty(b, 6, 1000);
	gpucmd_batch_allocation_mode(b, GPUCMD_MODE_AUTO);
	gpucmd_batch_install_pools(b, "exclusive", NULL, 0);
	gpucmd_batch_reserve(b, 7, 64);
	gpucmd_batch_install_pools(b, "subslices", NULL, 0);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EPOOLSINUSE);
	ck_assert_int_eq(idx, 5);
	ck_assert_msg(strstr(last_message, " 1 allocations (64 bytes)") != NULL,
		      "%s", last_message);
	gpucmd_close(c);
}
END_TEST

START_TEST(reserve_cpu_answers)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_cpu_buffer cpu, big;
	struct gpucmd_response *r;

	gpucmd_batch_reserve_cpu(b, 4096);
	gpucmd_batch_reserve_cpu(b, 3 << 20);
	gpucmd_batch_reserve_cpu(b, 200 << 20);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_cpu(r, 0, &cpu), 0);
	ck_assert_int_eq(gpucmd_response_cpu(r, 1, &big), 0);
	ck_assert_uint_eq(cpu.size, 4096);
	ck_assert_uint_eq(big.size, 3 << 20);
	/* The pinned pool (256M by default) serves what it can ... */
	ck_assert_int_eq(cpu.pinned, 1);
	ck_assert_int_eq(big.pinned, 1);
	/* ... and a request over 100M comes from the heap, whole. */
	ck_assert_int_eq(gpucmd_response_cpu(r, 2, &big), 0);
	ck_assert_uint_eq(big.size, 200 << 20);
	ck_assert_int_eq(big.pinned, 0);
	gpucmd_response_free(r);
	/* Above what one frame carries it is refused, not answered. */
	b = batch(c, 0);
	gpucmd_batch_reserve_cpu(b, (1ull << 30) + 1);
	ck_assert_int_eq(run_code(b, NULL), GPUCMD_EINVAL);
	ck_assert_msg(strstr(last_message, "1 GiB") != NULL, "%s",
		      last_message);
	gpucmd_close(c);
}
END_TEST

/* ---- strided copies ----------------------------------------------------------- */

START_TEST(strided_write_read_round_trip)
{
	struct gpucmd_conn *c = connect_as("ops");
	/* 3 rows of 5 u32 in a buffer with a pitch of 8 elements. */
	struct gpucmd_layout l = {
		.rank = 2,
		.shape = { 3, 5 },
		.strides = { 8, 1 },
		.elem_size = 4,
	};
	uint32_t in[15], raw[24];
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_response *r;
	const void *data;
	size_t len;

	for (int i = 0; i < 15; i++)
		in[i] = 0x1000u + (uint32_t)i;
	gpucmd_batch_empty(b, 1, sizeof(raw));
	ck_assert_int_eq(gpucmd_batch_write_layout(b, 1, 0, &l, in, sizeof(in)),
			 0);
	gpucmd_batch_read(b, 1, 0, sizeof(raw));
	ck_assert_int_eq(gpucmd_batch_read_layout(b, 1, 0, &l), 0);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_data(r, 2, &data, &len), 0);
	ck_assert_uint_eq(len, sizeof(raw));
	memcpy(raw, data, sizeof(raw));
	for (int row = 0; row < 3; row++)
		for (int col = 0; col < 8; col++)
			ck_assert_uint_eq(raw[row * 8 + col],
					  col < 5 ? in[row * 5 + col] : 0);
	ck_assert_int_eq(gpucmd_response_data(r, 3, &data, &len), 0);
	ck_assert_uint_eq(len, sizeof(in));
	ck_assert_int_eq(memcmp(data, in, sizeof(in)), 0);
	gpucmd_response_free(r);

	/* At an offset: the second row onwards, two rows of 5. */
	l.shape[0] = 2;
	b = batch(c, 0);
	gpucmd_batch_read_layout(b, 1, 8 * 4, &l);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_data(r, 0, &data, &len), 0);
	ck_assert_uint_eq(len, 10 * 4);
	ck_assert_int_eq(memcmp(data, in + 5, 10 * 4), 0);
	gpucmd_response_free(r);
	gpucmd_close(c);
}
END_TEST

START_TEST(strided_errors)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_layout t = {
		/* a transpose: column-major */
		.rank = 2,
		.shape = { 2, 3 },
		.strides = { 1, 2 },
		.elem_size = 4,
	};
	struct gpucmd_layout overlap = {
		/* rows overlap */
		.rank = 2,
		.shape = { 2, 4 },
		.strides = { 2, 1 },
		.elem_size = 4,
	};
	struct gpucmd_layout past = {
		/* runs past the end */
		.rank = 2,
		.shape = { 4, 4 },
		.strides = { 8, 1 },
		.elem_size = 4,
	};
	uint32_t v[16] = { 0 };
	struct gpucmd_batch *b;

	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 64);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_write_layout(b, 1, 0, &t, v, 6 * 4);
	ck_assert_int_eq(run_code(b, NULL), GPUCMD_ESTRIDES);
	b = batch(c, 0);
	gpucmd_batch_read_layout(b, 1, 0, &t);
	ck_assert_int_eq(run_code(b, NULL), GPUCMD_ESTRIDES);
	b = batch(c, 0);
	gpucmd_batch_read_layout(b, 1, 0, &overlap);
	ck_assert_int_eq(run_code(b, NULL), GPUCMD_ESTRIDES);
	b = batch(c, 0);
	gpucmd_batch_read_layout(b, 1, 0, &past);
	ck_assert_int_eq(run_code(b, NULL), GPUCMD_EINVAL);
	/* Data that is not the layout's size. */
	b = batch(c, 0);
	overlap.strides[0] = 4;
	gpucmd_batch_write_layout(b, 1, 0, &overlap, v, 4);
	ck_assert_int_eq(run_code(b, NULL), GPUCMD_EINVAL);
	/* What the library refuses by itself. */
	b = batch(c, 0);
	t.rank = 0;
	ck_assert_int_eq(gpucmd_batch_read_layout(b, 1, 0, &t), GPUCMD_EINVAL);
	t.rank = GPUCMD_MAX_RANK + 1;
	ck_assert_int_eq(gpucmd_batch_read_layout(b, 1, 0, &t), GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_batch_read_layout(b, 1, 0, NULL),
			 GPUCMD_EINVAL);
	ck_assert_uint_eq(gpucmd_batch_count(b), 0);
	gpucmd_batch_free(b);
	gpucmd_close(c);
}
END_TEST

/*
 * A copy of nothing still names a place in the buffer: its offset may be
 * the buffer's end, not past it, as for any other copy.
 */
START_TEST(empty_copies_check_their_offset)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_layout none = {
		/* no rows */
		.rank = 2,
		.shape = { 0, 4 },
		.strides = { 8, 1 },
		.elem_size = 4,
	};
	struct gpucmd_response *r;
	struct gpucmd_batch *b;
	const void *data;
	size_t len;
	int idx;

	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 100);
	gpucmd_batch_read(b, 1, 100, 0);
	gpucmd_batch_write(b, 1, 100, NULL, 0);
	gpucmd_batch_read_layout(b, 1, 100, &none);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_data(r, 1, &data, &len), 0);
	ck_assert_uint_eq(len, 0);
	gpucmd_response_free(r);
	b = batch(c, 0);
	gpucmd_batch_read(b, 1, 101, 0);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	ck_assert_msg(strstr(last_message, "offset 101") != NULL, "%s",
		      last_message);
	b = batch(c, 0);
	gpucmd_batch_write(b, 1, UINT64_MAX, NULL, 0);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	b = batch(c, 0);
	gpucmd_batch_read_layout(b, 1, 4096, &none);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	b = batch(c, 0);
	gpucmd_batch_write_layout(b, 1, 4096, &none, NULL, 0);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	gpucmd_close(c);
}
END_TEST

/* ---- profiles --------------------------------------------------------------- */

START_TEST(profile_times_a_spin)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_arg spin = u32_arg(20000);
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_response *r;
	struct gpucmd_profile p;

	gpucmd_batch_profile_begin(b, 1);
	gpucmd_batch_kernel(b, "spin", ONE, ONE, &spin, 1);
	gpucmd_batch_profile_end(b, 1);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_profile(r, 2, &p), 0);
	ck_assert_int_eq(p.valid, 1);
	ck_assert_str_eq(p.reason, "");
	ck_assert_msg(p.device_ms >= 15.0 && p.device_ms < 2000.0,
		      "spin of 20 ms timed %.3f ms", p.device_ms);
	ck_assert_int_eq(gpucmd_response_profile(r, 1, &p), GPUCMD_EINVAL);
	gpucmd_response_free(r);
	gpucmd_close(c);
}
END_TEST

START_TEST(profile_errors)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_batch *b;

	b = batch(c, 0);
	gpucmd_batch_profile_end(b, 4);
	ck_assert_int_eq(run_code(b, NULL), GPUCMD_EINVAL);
	b = batch(c, 0);
	gpucmd_batch_profile_begin(b, 4);
	gpucmd_batch_profile_begin(b, 4);
	ck_assert_int_eq(run_code(b, NULL), GPUCMD_EEXIST);
	/* Ended only on the stream that opened it. */
	b = batch(c, 1);
	gpucmd_batch_profile_end(b, 4);
	ck_assert_int_eq(run_code(b, NULL), GPUCMD_EINVAL);
	ck_assert_msg(strstr(last_message, "stream 0") != NULL, "%s",
		      last_message);
	gpucmd_close(c);
}
END_TEST

START_TEST(refused_launch_invalidates_profile)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_arg args[3] = { buf_arg(1), u32_arg(1), u32_arg(4) };
	struct gpucmd_arg spin = u32_arg(1000);
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	struct gpucmd_profile p;
	int idx;

	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 16);
	gpucmd_batch_profile_begin(b, 8);
	gpucmd_batch_profile_begin(b, 9);
	run_done(b);
	/*
	 * The geometry passes the daemon's own checks; the driver refuses
	 * the shared memory, which is over every device's 48 KiB default.
	 */
	b = batch(c, 0);
	gpucmd_batch_kernel(b, "spin", ONE, ONE, &spin, 1);
	gpucmd_batch_kernel_shared(b, "fill_u32", ONE, ONE, 1u << 20, args, 3);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_ELAUNCH);
	ck_assert_int_eq(idx, 1);
	b = batch(c, 0);
	gpucmd_batch_profile_end(b, 8);
	gpucmd_batch_kernel(b, "fill_u32", ONE, B64, args, 3);
	gpucmd_batch_profile_end(b, 9);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_profile(r, 0, &p), 0);
	ck_assert_int_eq(p.valid, 0);
	ck_assert_msg(strstr(p.reason, "refused") != NULL, "reason: %s",
		      p.reason);
	ck_assert_int_eq(gpucmd_response_profile(r, 2, &p), 0);
	ck_assert_int_eq(p.valid, 0);
	gpucmd_response_free(r);
	/* A profile opened after the refusal is valid again. */
	b = batch(c, 0);
	gpucmd_batch_profile_begin(b, 10);
	gpucmd_batch_kernel(b, "fill_u32", ONE, B64, args, 3);
	gpucmd_batch_profile_end(b, 10);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_profile(r, 2, &p), 0);
	ck_assert_int_eq(p.valid, 1);
	ck_assert(p.device_ms >= 0);
	gpucmd_response_free(r);
	gpucmd_close(c);
}
END_TEST

/*
 * Work that faults while a profile is open leaves nothing worth timing: the
 * reference marks every open profile errored when the fault surfaces, and
 * so does the daemon, for the profiles of the stream that faulted.  The
 * fault is still reported to the stream's next sync.
 */
START_TEST(faulted_work_invalidates_profile)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_arg spin = u32_arg(100);
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	struct gpucmd_profile p;
	int idx;

	/* On CUDA a fault loses the device, and the daemon with it. */
	if (strcmp(gpucmd_info(c)->backend, "host") != 0) {
		printf("skipped: faults are fatal on the %s backend\n",
		       gpucmd_info(c)->backend);
		gpucmd_close(c);
		return;
	}
	/* In one batch. */
	b = batch(c, 0);
	gpucmd_batch_profile_begin(b, 1);
	gpucmd_batch_kernel(b, "fault", ONE, ONE, NULL, 0);
	gpucmd_batch_profile_end(b, 1);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_profile(r, 2, &p), 0);
	ck_assert_int_eq(p.valid, 0);
	ck_assert_msg(strstr(p.reason, "fault") != NULL, "reason: %s",
		      p.reason);
	gpucmd_response_free(r);
	b = batch(c, 0);
	gpucmd_batch_sync(b);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_ESTREAM);
	/* Over three, with the fault's sync on another stream's profile. */
	b = batch(c, 0);
	gpucmd_batch_profile_begin(b, 2);
	run_done(b);
	b = batch(c, 1);
	gpucmd_batch_profile_begin(b, 3);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_kernel(b, "fault", ONE, ONE, NULL, 0);
	gpucmd_batch_sync(b);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_ESTREAM);
	b = batch(c, 0);
	gpucmd_batch_profile_end(b, 2);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_profile(r, 0, &p), 0);
	ck_assert_int_eq(p.valid, 0);
	gpucmd_response_free(r);
	b = batch(c, 1);
	gpucmd_batch_kernel(b, "spin", ONE, ONE, &spin, 1);
	gpucmd_batch_profile_end(b, 3);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_profile(r, 1, &p), 0);
	ck_assert_msg(p.valid == 1, "reason: %s", p.reason);
	gpucmd_response_free(r);
	/* A profile opened after the fault was reported times again. */
	b = batch(c, 0);
	gpucmd_batch_profile_begin(b, 4);
	gpucmd_batch_kernel(b, "spin", ONE, ONE, &spin, 1);
	gpucmd_batch_profile_end(b, 4);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_profile(r, 2, &p), 0);
	ck_assert_msg(p.valid == 1, "reason: %s", p.reason);
	ck_assert(p.device_ms > 0);
	gpucmd_response_free(r);
	gpucmd_close(c);
}
END_TEST

/* ---- graphs ----------------------------------------------------------------- */

enum { GN = 256 };

/*
 * The work a graph records and the eager run repeats: fill w with 1.0,
 * scale it by 3, scale x by 1.5, y = x + w.
 */
static void graph_work(struct gpucmd_batch *b, uint64_t w, uint64_t x,
		       uint64_t y)
{
	struct gpucmd_arg fill[3] = { buf_arg(w), u32_arg(f32_bits(1.0f)),
				      u32_arg(GN) };
	struct gpucmd_arg scale_w[3] = { buf_arg(w), f32_arg(3.0f),
					 u32_arg(GN) };
	struct gpucmd_arg scale_x[3] = { buf_arg(x), f32_arg(1.5f),
					 u32_arg(GN) };
	struct gpucmd_arg add[4] = { buf_arg(y), buf_arg(x), buf_arg(w),
				     u32_arg(GN) };
	const uint32_t grid[3] = { GN / 64, 1, 1 };

	ck_assert_int_eq(gpucmd_batch_kernel(b, "fill_u32", grid, B64, fill, 3),
			 0);
	ck_assert_int_eq(gpucmd_batch_kernel(b, "scale_f32", grid, B64, scale_w,
					     3),
			 0);
	ck_assert_int_eq(gpucmd_batch_kernel(b, "scale_f32", grid, B64, scale_x,
					     3),
			 0);
	ck_assert_int_eq(gpucmd_batch_kernel(b, "add_f32", grid, B64, add, 4),
			 0);
}

START_TEST(graph_replay_equals_eager)
{
	struct gpucmd_conn *c = connect_as("ops");
	float x0[GN];
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	const void *d[6];
	size_t len;

	for (int i = 0; i < GN; i++)
		x0[i] = (float)i * 0.25f - 7.0f;
	/* Graph buffers 1-3, eager buffers 11-13, the same start. */
	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, sizeof(x0));
	gpucmd_batch_create_with_data(b, 2, x0, sizeof(x0));
	gpucmd_batch_empty(b, 3, sizeof(x0));
	gpucmd_batch_empty(b, 11, sizeof(x0));
	gpucmd_batch_create_with_data(b, 12, x0, sizeof(x0));
	gpucmd_batch_empty(b, 13, sizeof(x0));
	gpucmd_batch_sync(b);
	run_done(b);

	b = batch(c, 0);
	gpucmd_batch_capture_begin(b);
	graph_work(b, 1, 2, 3);
	gpucmd_batch_capture_end(b, 42);
	gpucmd_batch_graph_launch(b, 42);
	gpucmd_batch_graph_launch(b, 42);
	graph_work(b, 11, 12, 13);
	graph_work(b, 11, 12, 13);
	for (uint64_t h = 1; h <= 3; h++)
		gpucmd_batch_read(b, h, 0, sizeof(x0));
	for (uint64_t h = 11; h <= 13; h++)
		gpucmd_batch_read(b, h, 0, sizeof(x0));
	r = run_ok(b);
	for (size_t k = 0; k < 6; k++) {
		ck_assert_int_eq(gpucmd_response_data(r, 16 + k, &d[k], &len),
				 0);
		ck_assert_uint_eq(len, sizeof(x0));
	}
	for (int k = 0; k < 3; k++)
		ck_assert_msg(memcmp(d[k], d[k + 3], sizeof(x0)) == 0,
			      "buffer %d differs between replay and eager", k);
	/* And both are what the arithmetic says. */
	for (int i = 0; i < GN; i++) {
		const float *y = d[2];

		ck_assert_float_eq(y[i], x0[i] * 1.5f * 1.5f + 3.0f);
	}
	gpucmd_response_free(r);
	gpucmd_close(c);
}
END_TEST

START_TEST(graph_holds_its_handles)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_arg fill[3] = { buf_arg(1), u32_arg(5), u32_arg(4) };
	struct gpucmd_batch *b;
	int idx;

	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 16);
	gpucmd_batch_capture_begin(b);
	gpucmd_batch_kernel(b, "fill_u32", ONE, B64, fill, 3);
	gpucmd_batch_capture_end(b, 7);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_release(b, 1);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EBUSY);
	ck_assert_msg(strstr(last_message, "graph") != NULL, "%s",
		      last_message);
	/* Replayable still, and released once the graph is gone. */
	b = batch(c, 0);
	gpucmd_batch_graph_launch(b, 7);
	gpucmd_batch_graph_destroy(b, 7);
	gpucmd_batch_release(b, 1);
	gpucmd_batch_sync(b);
	run_done(b);
	ck_assert_uint_eq(usage(c, 0).allocations, 0);
	gpucmd_close(c);
}
END_TEST

/*
 * A recording stream cannot be ordered with work still running on another
 * stream (on CUDA the wait would pull that stream into the capture): a
 * buffer last used by unfinished work elsewhere is refused in a capture,
 * and one used in a capture is refused on other streams until it ends.
 * Work that has finished needs no ordering at all.
 */
/* Word w of the data that result i of r read (its bytes must hold it). */
static uint32_t read_u32(const struct gpucmd_response *r, size_t i, size_t w)
{
	const void *d;
	size_t len;
	uint32_t v;

	ck_assert_int_eq(gpucmd_response_data(r, i, &d, &len), 0);
	ck_assert_uint_ge(len, (w + 1) * sizeof(v));
	memcpy(&v, (const uint8_t *)d + w * sizeof(v), sizeof(v));
	return v;
}

START_TEST(capture_and_other_streams)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_arg spin[1] = { u32_arg(400000) };
	struct gpucmd_arg fill1[3] = { buf_arg(1), u32_arg(5), u32_arg(4) };
	struct gpucmd_arg fill2[3] = { buf_arg(2), u32_arg(6), u32_arg(4) };
	struct gpucmd_batch *b;
	int idx;

	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 16);
	gpucmd_batch_empty(b, 2, 16);
	gpucmd_batch_sync(b);
	run_done(b);
	/* Buffer 1 written on stream 1 behind a spin: still running. */
	b = batch(c, 1);
	gpucmd_batch_kernel(b, "spin", ONE, B64, spin, 1);
	gpucmd_batch_kernel(b, "fill_u32", ONE, B64, fill1, 3);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_capture_begin(b);
	gpucmd_batch_kernel(b, "fill_u32", ONE, B64, fill1, 3);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	ck_assert_int_eq(idx, 1);
	ck_assert_msg(strstr(last_message, "sync stream 1 before "
					   "capture_begin") != NULL,
		      "%s", last_message);
	/* Synced, stream 1's work is done: no ordering is needed. */
	b = batch(c, 1);
	gpucmd_batch_sync(b);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_kernel(b, "fill_u32", ONE, B64, fill1, 3);
	gpucmd_batch_kernel(b, "fill_u32", ONE, B64, fill2, 3);
	gpucmd_batch_capture_end(b, 9);
	run_done(b);
	/* Recording on stream 0 again: buffer 2 is its, not stream 1's. */
	b = batch(c, 0);
	gpucmd_batch_capture_begin(b);
	gpucmd_batch_kernel(b, "fill_u32", ONE, B64, fill2, 3);
	run_done(b);
	b = batch(c, 1);
	gpucmd_batch_kernel(b, "fill_u32", ONE, B64, fill2, 3);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	ck_assert_msg(strstr(last_message, "records a graph") != NULL &&
			      strstr(last_message, "after capture_end") != NULL,
		      "%s", last_message);
	b = batch(c, 0);
	gpucmd_batch_capture_end(b, 10);
	gpucmd_batch_graph_launch(b, 9);
	gpucmd_batch_read(b, 1, 0, 16);
	gpucmd_batch_read(b, 2, 0, 16);
	{
		struct gpucmd_response *r = run_ok(b);

		ck_assert_uint_eq(read_u32(r, 2, 3), 5);
		ck_assert_uint_eq(read_u32(r, 3, 3), 6);
		gpucmd_response_free(r);
	}
	gpucmd_close(c);
}
END_TEST

/*
 * Uses that completed need no ordering, whatever their stream does now:
 * while stream 0 records a graph that never touches buffer 1, stream 1
 * reads and writes buffer 1 (filled and synced on stream 0 before); and a
 * capture may read buffer 3, whose write on stream 1 was synced, while
 * stream 1 runs later, unrelated work.  Both were refused with EINVAL and
 * a message that was not true.
 */
START_TEST(capture_ignores_uses_that_completed)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_arg spin[1] = { u32_arg(400000) };
	struct gpucmd_arg fill1[3] = { buf_arg(1), u32_arg(42), u32_arg(4) };
	struct gpucmd_arg fill1b[3] = { buf_arg(1), u32_arg(43), u32_arg(4) };
	struct gpucmd_arg fill2[3] = { buf_arg(2), u32_arg(7), u32_arg(4) };
	struct gpucmd_arg fill3[3] = { buf_arg(3), u32_arg(9), u32_arg(4) };
	struct gpucmd_arg copy[3] = { buf_arg(2), buf_arg(3), u64_arg(16) };
	struct gpucmd_response *r;
	struct gpucmd_batch *b;

	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 16);
	gpucmd_batch_empty(b, 2, 16);
	gpucmd_batch_kernel(b, "fill_u32", ONE, B64, fill1, 3);
	gpucmd_batch_sync(b);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_capture_begin(b);
	gpucmd_batch_kernel(b, "fill_u32", ONE, B64, fill2, 3);
	run_done(b);
	b = batch(c, 1);
	gpucmd_batch_read(b, 1, 0, 16);
	r = run_ok(b);
	ck_assert_uint_eq(read_u32(r, 0, 3), 42);
	gpucmd_response_free(r);
	b = batch(c, 1);
	gpucmd_batch_kernel(b, "fill_u32", ONE, B64, fill1b, 3);
	gpucmd_batch_sync(b);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_capture_end(b, 20);
	run_done(b);

	/* Buffer 3 written on stream 1 and synced; then stream 1 is busy. */
	b = batch(c, 1);
	gpucmd_batch_empty(b, 3, 16);
	gpucmd_batch_kernel(b, "fill_u32", ONE, B64, fill3, 3);
	gpucmd_batch_sync(b);
	run_done(b);
	b = batch(c, 1);
	gpucmd_batch_kernel(b, "spin", ONE, B64, spin, 1);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_capture_begin(b);
	gpucmd_batch_kernel(b, "copy", ONE, B64, copy, 3);
	gpucmd_batch_capture_end(b, 21);
	gpucmd_batch_graph_launch(b, 21);
	gpucmd_batch_read(b, 2, 0, 16);
	gpucmd_batch_read(b, 1, 0, 16);
	r = run_ok(b);
	ck_assert_uint_eq(read_u32(r, 4, 3), 9);
	ck_assert_uint_eq(read_u32(r, 5, 3), 43);
	gpucmd_response_free(r);
	gpucmd_close(c);
}
END_TEST

/*
 * What a connection may hold that no memory quota counts is bounded:
 * open profiles (1024), graphs (1024) and the write data its graphs keep
 * (256 MiB), each refused past that with ELIMIT and the numbers.
 */
START_TEST(profiles_and_graphs_are_bounded)
{
	enum { MAX = 1024, BIG = 64 << 20 };
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_batch *b;
	void *region;

	b = batch(c, 0);
	for (uint64_t k = 1; k <= MAX; k++)
		gpucmd_batch_profile_begin(b, k);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_profile_begin(b, MAX + 1);
	run_over_limit(b, "1024 profiles open");
	b = batch(c, 0);
	gpucmd_batch_profile_end(b, 7);
	gpucmd_batch_profile_begin(b, MAX + 1);
	run_done(b);

	b = batch(c, 0);
	for (uint64_t k = 1; k <= MAX; k++) {
		gpucmd_batch_capture_begin(b);
		gpucmd_batch_capture_end(b, k);
	}
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_capture_begin(b);
	run_over_limit(b, "1024 graphs");
	b = batch(c, 0);
	for (uint64_t k = 1; k <= MAX; k++)
		gpucmd_batch_graph_destroy(b, k);
	gpucmd_batch_sync(b);
	run_done(b);

	/* Four 64 MiB writes fit in a capture; a fifth does not. */
	ck_assert_int_eq(gpucmd_region_create(c, 1, BIG, &region), 0);
	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, BIG);
	gpucmd_batch_capture_begin(b);
	for (int k = 0; k < 4; k++)
		gpucmd_batch_write_region(b, 1, 0, 1, 0, BIG);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_write_region(b, 1, 0, 1, 0, BIG);
	run_over_limit(b, "335544320 bytes");
	/* Destroyed, a graph gives its bytes back. */
	end_and_destroy(c, 1);
	b = batch(c, 0);
	gpucmd_batch_capture_begin(b);
	gpucmd_batch_write_region(b, 1, 0, 1, 0, BIG);
	gpucmd_batch_capture_end(b, 2);
	run_done(b);
	gpucmd_close(c);
}
END_TEST

/*
 * A capture's ops are bounded too: 262144 recorded launches per connection
 * (4 batches of 65536 on one buffer), then GPUCMD_ELIMIT with the number;
 * destroying the graph gives them back.  Ops that failed are not counted.  Each launch used to be recorded
 * without a bound (about 100 bytes of the daemon's memory each, for as
 * long as the capture lasted), and holding the buffer once per graph took
 * a walk of every buffer the graph held, so a capture over many buffers
 * held the device thread, and every service, for seconds per batch.
 */
START_TEST(captured_ops_are_bounded)
{
	enum { PER_BATCH = 65536, BATCHES = 4 };
	struct gpucmd_arg fill[3] = { buf_arg(1), u32_arg(7), u32_arg(1) };
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_batch *b;

	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 64);
	gpucmd_batch_capture_begin(b);
	run_done(b);
	/* Ops that fail record nothing and take none of the bound. */
	for (int k = 0; k < 3; k++) {
		b = batch(c, 0);
		gpucmd_batch_write(b, 1, 64, "abcd", 4);
		ck_assert_int_eq(run_code(b, NULL), GPUCMD_EINVAL);
	}
	for (int k = 0; k < BATCHES; k++) {
		b = batch(c, 0);
		for (int i = 0; i < PER_BATCH; i++)
			ck_assert_int_eq(gpucmd_batch_kernel(b, "fill_u32", ONE,
							     ONE, fill, 3),
					 0);
		run_done(b);
	}
	b = batch(c, 0);
	gpucmd_batch_kernel(b, "fill_u32", ONE, ONE, fill, 3);
	run_over_limit(b, "262144 recorded ops");
	end_and_destroy(c, 1);
	b = batch(c, 0);
	gpucmd_batch_capture_begin(b);
	gpucmd_batch_kernel(b, "fill_u32", ONE, ONE, fill, 3);
	gpucmd_batch_capture_end(b, 2);
	gpucmd_batch_graph_launch(b, 2);
	gpucmd_batch_read(b, 1, 0, 4);
	run_done(b);
	gpucmd_close(c);
}
END_TEST

/*
 * Graph launches are bounded by the ops they enqueue: a connection's
 * launches not yet complete may replay 262144 ops (one graph of the
 * largest size), then GPUCMD_ELIMIT with the numbers.  A launch is a few
 * bytes on the wire but copies the whole graph onto the stream: one batch
 * of 300 launches of a 65000-op graph used to make the daemon hold 2.4 GB
 * and keep the device thread, and every other service, for 7 s.  Not on
 * CUDA, where a launch does not copy the graph's ops.
 */
START_TEST(graph_replays_are_bounded)
{
	enum { OPS = 65000, FIT = (1 << 18) / OPS };
	struct gpucmd_arg fill[3] = { buf_arg(1), u32_arg(7), u32_arg(1) };
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_batch *b;
	int idx = -1;

	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 64);
	gpucmd_batch_capture_begin(b);
	for (int i = 0; i < OPS; i++)
		gpucmd_batch_kernel(b, "fill_u32", ONE, ONE, fill, 3);
	gpucmd_batch_capture_end(b, 1);
	run_done(b);
	b = batch(c, 0);
	for (int i = 0; i < 2 * FIT; i++)
		gpucmd_batch_graph_launch(b, 1);
	/* On CUDA a launch is one driver call, whatever the graph holds. */
	if (strcmp(gpucmd_info(c)->backend, "cuda") == 0) {
		gpucmd_batch_sync(b);
		run_done(b);
		gpucmd_close(c);
		return;
	}
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_ELIMIT);
	ck_assert_int_eq(idx, FIT);
	ck_assert_msg(strstr(last_message, "262144") != NULL, "%s",
		      last_message);
	/* Once a batch of launches completed, its ops count no more. */
	b = batch(c, 0);
	gpucmd_batch_sync(b);
	run_done(b);
	for (int k = 0; k < 2; k++) {
		b = batch(c, 0);
		for (int i = 0; i < FIT; i++)
			gpucmd_batch_graph_launch(b, 1);
		gpucmd_batch_sync(b);
		run_done(b);
	}
	gpucmd_close(c);
}
END_TEST

/*
 * A batch that fails after its capture_begin leaves the stream recording;
 * capture_abort ends the capture and discards it: nothing recorded runs,
 * reads work again, and the buffers the recording held may be released.
 */
START_TEST(capture_abort_discards_the_recording)
{
	static const uint32_t one[3] = { 1, 1, 1 }, block[3] = { 4, 1, 1 };
	static const uint8_t zero[16];
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_arg fill[3] = { gpucmd_arg_buffer(1), gpucmd_arg_u32(7),
				      gpucmd_arg_u32(4) };
	struct gpucmd_response *r;
	struct gpucmd_batch *b;
	const void *data;
	size_t len;
	int idx;

	b = batch(c, 0);
	gpucmd_batch_create_with_data(b, 1, zero, sizeof(zero));
	gpucmd_batch_sync(b);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_capture_begin(b);
	gpucmd_batch_kernel(b, "fill_u32", one, block, fill, 3);
	gpucmd_batch_kernel(b, "no_such_kernel", one, one, NULL, 0);
	gpucmd_batch_capture_end(b, 9);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_ENOKERNEL);
	ck_assert_int_eq(idx, 2);
	/* Still recording: a read is refused. */
	b = batch(c, 0);
	gpucmd_batch_read(b, 1, 0, 16);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	ck_assert_msg(strstr(last_message, "record") != NULL, "%s",
		      last_message);

	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_capture_abort(b), 0);
	gpucmd_batch_read(b, 1, 0, 16);
	ck_assert_int_eq(gpucmd_run(b, &r), 0);
	ck_assert_int_eq(gpucmd_response_error(r), 0);
	/* The recorded fill never ran, and no graph 9 was kept. */
	ck_assert_int_eq(gpucmd_response_data(r, 1, &data, &len), 0);
	ck_assert_uint_eq(len, 16);
	ck_assert_int_eq(memcmp(data, zero, 16), 0);
	gpucmd_response_free(r);
	b = batch(c, 0);
	gpucmd_batch_graph_launch(b, 9);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_ENOTFOUND);
	/* The buffer is no graph's: it may go. */
	b = batch(c, 0);
	gpucmd_batch_release(b, 1);
	run_done(b);
	/* Not recording now: another abort is refused. */
	b = batch(c, 0);
	gpucmd_batch_capture_abort(b);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	ck_assert_msg(strstr(last_message, "not recording") != NULL, "%s",
		      last_message);
	gpucmd_close(c);
}
END_TEST

START_TEST(capture_refuses_reads_syncs_allocations)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_batch *b;
	int idx;

	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 16);
	gpucmd_batch_reserve(b, 2, 16);
	gpucmd_batch_capture_begin(b);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_read(b, 1, 0, 16);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	b = batch(c, 0);
	gpucmd_batch_sync(b);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	b = batch(c, 0);
	gpucmd_batch_empty(b, 3, 16);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	ck_assert_msg(strstr(last_message, "capture") != NULL, "%s",
		      last_message);
	b = batch(c, 0);
	gpucmd_batch_profile_begin(b, 1);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	b = batch(c, 0);
	gpucmd_batch_capture_begin(b);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	/*
	 * The pools are not rebuilt under a recording, whatever they hold:
	 * the refusal says so, not that buffers are in use.
	 */
	b = batch(c, 0);
	gpucmd_batch_install_pools(b, "exclusive", NULL, 0);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EPOOLSINUSE);
	ck_assert_msg(strstr(last_message, "records a graph") != NULL &&
			      strstr(last_message, "capture_end") != NULL,
		      "%s", last_message);
	/* Memory reserved before the capture may be bound during it. */
	b = batch(c, 0);
	gpucmd_batch_bind(b, 2, 4);
	gpucmd_batch_write(b, 4, 0, "0123456789abcdef", 16);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_capture_end(b, 5);
	gpucmd_batch_graph_launch(b, 5);
	gpucmd_batch_read(b, 4, 0, 16);
	run_done(b);
	/* Not capturing any more: a second end is refused. */
	b = batch(c, 0);
	gpucmd_batch_capture_end(b, 6);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	/* A taken id is EEXIST. */
	b = batch(c, 0);
	gpucmd_batch_capture_begin(b);
	gpucmd_batch_capture_end(b, 5);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EEXIST);
	ck_assert_int_eq(idx, 1);
	b = batch(c, 0);
	gpucmd_batch_capture_end(b, 6);
	run_done(b);
	gpucmd_close(c);
}
END_TEST

START_TEST(graph_destroy_then_launch)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_batch *b;
	int idx;

	b = batch(c, 0);
	gpucmd_batch_capture_begin(b);
	gpucmd_batch_capture_end(b, 3);
	gpucmd_batch_graph_launch(b, 3);
	gpucmd_batch_graph_destroy(b, 3);
	gpucmd_batch_graph_launch(b, 3);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_ENOTFOUND);
	ck_assert_int_eq(idx, 4);
	b = batch(c, 0);
	gpucmd_batch_graph_destroy(b, 3);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_ENOTFOUND);
	/* Graphs belong to their connection. */
	{
		struct gpucmd_conn *other = connect_as("ops");

		b = batch(c, 0);
		gpucmd_batch_capture_begin(b);
		gpucmd_batch_capture_end(b, 8);
		run_done(b);
		b = batch(other, 0);
		gpucmd_batch_graph_launch(b, 8);
		ck_assert_int_eq(run_code(b, &idx), GPUCMD_ENOTFOUND);
		gpucmd_close(other);
	}
	gpucmd_close(c);
}
END_TEST

/* ---- evict ------------------------------------------------------------------ */

/* Poll the report until service name holds nothing (at most 10 s). */
static struct gpucmd_service_report wait_service_empty(struct gpucmd_conn *c,
						       const char *name)
{
	struct gpucmd_service_report s;

	for (int i = 0; i < 1000; i++) {
		ck_assert_int_eq(service_usage(c, name, &s), 0);
		if (s.bytes_reserved == 0 && s.connections == 0)
			break;
		usleep(10000);
	}
	return s;
}

START_TEST(evict_a_service)
{
	struct gpucmd_conn *victim = connect_as("victim");
	struct gpucmd_conn *admin = connect_as("admin");
	struct gpucmd_service_report s;
	struct gpucmd_batch *b;
	struct gpucmd_response *r = NULL;
	uint64_t n = 0;

	b = batch(victim, 0);
	gpucmd_batch_empty(b, 1, 1 << 20);
	gpucmd_batch_empty(b, 2, 12345);
	gpucmd_batch_sync(b);
	run_done(b);
	ck_assert_int_eq(service_usage(admin, "victim", &s), 0);
	ck_assert_uint_eq(s.bytes_in_use, (1 << 20) + 12345);
	ck_assert_uint_eq(s.connections, 1);

	ck_assert_int_eq(gpucmd_evict(admin, "victim", 0, &n), 0);
	ck_assert_uint_eq(n, 1);
	/* The victim's next batch finds the connection gone. */
	b = batch(victim, 0);
	gpucmd_batch_ping(b);
	ck_assert_int_eq(gpucmd_run(b, &r), GPUCMD_EDISCONNECTED);
	/* ... and can say why: the daemon's Error frame. */
	{
		const char *why = NULL;

		ck_assert_int_eq(gpucmd_conn_error(victim, &why),
				 GPUCMD_EDISCONNECTED);
		ck_assert_msg(strstr(why, "evicted by connection") != NULL,
			      "why: %s", why);
	}
	gpucmd_close(victim);
	s = wait_service_empty(admin, "victim");
	ck_assert_uint_eq(s.bytes_in_use, 0);
	ck_assert_uint_eq(s.bytes_reserved, 0);
	ck_assert_uint_eq(s.allocations, 0);
	ck_assert_uint_eq(s.connections, 0);
	/* Nobody left to evict; the caller itself is never counted. */
	ck_assert_int_eq(gpucmd_evict(admin, "victim", 0, &n), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_int_eq(gpucmd_evict(admin, "admin", 0, &n), 0);
	ck_assert_uint_eq(n, 0);
	/* The admin's own connection still works. */
	b = batch(admin, 0);
	gpucmd_batch_ping(b);
	run_done(b);
	ck_assert_int_eq(gpucmd_evict(admin, NULL, 0, &n), GPUCMD_EINVAL);
	gpucmd_close(admin);
}
END_TEST

START_TEST(evict_one_connection)
{
	struct gpucmd_conn *a = connect_as("pair");
	struct gpucmd_conn *b2 = connect_as("pair");
	struct gpucmd_conn *admin = connect_as("admin"), *o;
	struct gpucmd_batch *b;
	struct gpucmd_response *r = NULL;
	struct gpucmd_service_report s;
	uint64_t n = 0;

	b = batch(a, 0);
	gpucmd_batch_empty(b, 1, 1000);
	run_done(b);
	b = batch(b2, 0);
	gpucmd_batch_empty(b, 1, 3000);
	run_done(b);
	ck_assert_int_eq(gpucmd_evict(admin, NULL,
				      gpucmd_info(a)->connection_id, &n),
			 0);
	ck_assert_uint_eq(n, 1);
	b = batch(a, 0);
	gpucmd_batch_ping(b);
	ck_assert_int_eq(gpucmd_run(b, &r), GPUCMD_EDISCONNECTED);
	gpucmd_close(a);
	/* The other connection of the service is untouched. */
	b = batch(b2, 0);
	gpucmd_batch_read(b, 1, 0, 4);
	run_done(b);
	/* The connection count drops at once, its memory once it is idle. */
	for (int i = 0; i < 1000; i++) {
		ck_assert_int_eq(service_usage(admin, "pair", &s), 0);
		if (s.connections == 1 && s.bytes_in_use == 3000)
			break;
		usleep(10000);
	}
	ck_assert_uint_eq(s.connections, 1);
	ck_assert_uint_eq(s.bytes_in_use, 3000);
	/* A service name and an id that do not match end nothing. */
	o = connect_as("other");
	ck_assert_int_eq(gpucmd_evict(admin, "other",
				      gpucmd_info(b2)->connection_id, &n),
			 0);
	ck_assert_uint_eq(n, 0);
	gpucmd_close(o);
	gpucmd_close(b2);
	gpucmd_close(admin);
}
END_TEST

/*
 * The report's in use counts released buffers the device may still use,
 * and its peak counts the same way (it counted live buffers only, so in
 * use could read above the peak); the device's free memory is reported
 * as such, and the totals carry no limit.  The release comes on stream 1,
 * behind a kernel there: on its own stream 0 the memory would be reused
 * at once.
 */
START_TEST(report_peak_counts_pending_releases)
{
	struct gpucmd_conn *c = connect_as("peaky");
	struct gpucmd_arg spin = u32_arg(400000);
	struct gpucmd_service_report s;
	struct gpucmd_report *rep = NULL;
	struct gpucmd_batch *b;

	b = batch(c, 0);
	gpucmd_batch_empty(b, 1, 1 << 20);
	run_done(b);
	b = batch(c, 1);
	gpucmd_batch_kernel(b, "spin", ONE, ONE, &spin, 1);
	gpucmd_batch_release(b, 1);
	run_done(b);
	b = batch(c, 0);
	gpucmd_batch_empty(b, 2, 1 << 20);
	run_done(b);
	ck_assert_int_eq(service_usage(c, "peaky", &s), 0);
	/* Unless the 0.4 s spin is already over. */
	if (s.bytes_released_pending != 0) {
		ck_assert_uint_eq(s.bytes_released_pending, 1 << 20);
		ck_assert_uint_eq(s.bytes_in_use, 2 << 20);
	}
	ck_assert_uint_ge(s.peak_bytes_in_use, 2 << 20);
	ck_assert_uint_ge(s.peak_bytes_in_use, s.bytes_in_use);

	ck_assert_int_eq(gpucmd_memory_report(c, &rep), 0);
	ck_assert_int_eq(rep->has_device_free_memory, 1);
	ck_assert_uint_le(rep->device_free_memory, rep->device_total_memory);
	ck_assert_uint_eq(rep->totals.limit_bytes, 0);
	gpucmd_report_free(rep);
	b = batch(c, 0);
	gpucmd_batch_release(b, 2);
	gpucmd_batch_sync(b);
	run_done(b);
	gpucmd_close(c);
}
END_TEST

START_TEST(evict_arguments)
{
	struct gpucmd_conn *c = connect_as("ops");
	uint64_t n = 5;

	/* Neither a service nor a connection: refused before sending. */
	ck_assert_int_eq(gpucmd_evict(c, "", 0, &n), GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_evict(c, "ops", 0, NULL), GPUCMD_EINVAL);
	ck_assert_uint_eq(n, 5);
	/* An id nobody has, or the caller's own, is refused with why. */
	ck_assert_int_eq(gpucmd_evict(c, NULL, 999999, &n), GPUCMD_ENOTFOUND);
	ck_assert_msg(strstr(gpucmd_last_message(c), "no connection 999999 "
						     "is open") != NULL,
		      "message: %s", gpucmd_last_message(c));
	ck_assert_int_eq(gpucmd_evict(c, NULL, gpucmd_info(c)->connection_id,
				      &n),
			 GPUCMD_EINVAL);
	ck_assert_msg(strstr(gpucmd_last_message(c), "cannot evict itself") !=
			      NULL,
		      "message: %s", gpucmd_last_message(c));
	/* A name no service can have. */
	ck_assert_int_eq(gpucmd_evict(c, "bad name!", 0, &n), GPUCMD_EINVAL);
	ck_assert_msg(strstr(gpucmd_last_message(c), "service name") != NULL,
		      "message: %s", gpucmd_last_message(c));
	ck_assert_uint_eq(n, 5);
	/* A service the daemon does not know (a typo): not "evicted 0". */
	ck_assert_int_eq(gpucmd_evict(c, "nobody-here", 0, &n),
			 GPUCMD_ENOTFOUND);
	ck_assert_str_eq(gpucmd_last_message(c),
			 "no service 'nobody-here' is known to the daemon "
			 "(gpucmd services lists them)");
	ck_assert_uint_eq(n, 5);
	/* A known one with no other connection; a success clears the
	 * message. */
	ck_assert_int_eq(gpucmd_evict(c, "ops", 0, &n), 0);
	ck_assert_uint_eq(n, 0);
	ck_assert_str_eq(gpucmd_last_message(c), "");
	gpucmd_close(c);
}
END_TEST

/* ---- streams ----------------------------------------------------------------- */

START_TEST(cross_stream_ordering_random)
{
	struct gpucmd_conn *c = connect_as("order");
	enum { N = 1024, ROUNDS = 50 };
	struct gpucmd_batch *b;
	unsigned seed = (unsigned)harness_now_us();

	b = batch(c, 1);
	gpucmd_batch_empty(b, 1, N * 4);
	gpucmd_batch_empty(b, 2, N * 4);
	gpucmd_batch_sync(b);
	run_done(b);
	for (uint32_t round = 1; round <= ROUNDS; round++) {
		struct gpucmd_arg spin =
			u32_arg((uint32_t)(rand_r(&seed) % 3000));
		struct gpucmd_arg fill[3] = { buf_arg(1), u32_arg(round),
					      u32_arg(N) };
		struct gpucmd_arg copy[3] = { buf_arg(2), buf_arg(1),
					      u64_arg(N * 4) };
		const uint32_t grid[3] = { N / 64, 1, 1 };
		uint32_t consumer = 2 + (uint32_t)(rand_r(&seed) % 3);
		int direct = rand_r(&seed) % 2;
		uint64_t id1, id2;
		struct gpucmd_response *r;
		const uint32_t *v;
		const void *data;
		size_t len;

		/* Producer on stream 1: a delay, then the new value. */
		b = batch(c, 1);
		gpucmd_batch_kernel(b, "spin", ONE, ONE, &spin, 1);
		gpucmd_batch_kernel(b, "fill_u32", grid, B64, fill, 3);
		ck_assert_int_eq(gpucmd_submit(b, &id1), 0);
		/* Consumer on another stream, sent before the producer ends. */
		b = batch(c, consumer);
		if (direct) {
			gpucmd_batch_read(b, 1, 0, N * 4);
		} else {
			gpucmd_batch_kernel(b, "copy", grid, B64, copy, 3);
			gpucmd_batch_read(b, 2, 0, N * 4);
		}
		ck_assert_int_eq(gpucmd_submit(b, &id2), 0);
		ck_assert_int_eq(gpucmd_wait(c, id2, &r), 0);
		ck_assert_int_eq(gpucmd_response_error(r), 0);
		ck_assert_int_eq(gpucmd_response_data(r, direct ? 0 : 1, &data,
						      &len),
				 0);
		ck_assert_uint_eq(len, N * 4);
		v = data;
		for (int i = 0; i < N; i++)
			ck_assert_msg(v[i] == round,
				      "round %u (stream %u, %s): element %d "
				      "is %u",
				      round, consumer, direct ? "read" : "copy",
				      i, v[i]);
		gpucmd_response_free(r);
		ck_assert_int_eq(gpucmd_wait(c, id1, &r), 0);
		ck_assert_int_eq(gpucmd_response_error(r), 0);
		gpucmd_response_free(r);
	}
	gpucmd_close(c);
}
END_TEST

START_TEST(report_streams_add_up_to_service)
{
	struct gpucmd_conn *c = connect_as("sum");
	struct gpucmd_conn *c2 = connect_as("sum");
	struct gpucmd_report *rep = NULL;
	const struct gpucmd_service_report *s = NULL;
	struct gpucmd_memory_usage total = { 0 }, svc;
	struct gpucmd_batch *b;
	size_t ours = 0;

	for (uint32_t st = 0; st < 3; st++) {
		b = batch(st == 2 ? c2 : c, st);
		/* Handles are per connection: one range per stream. */
		for (uint64_t i = 1; i <= 5; i++)
			gpucmd_batch_empty(b, 10 * st + i,
					   i * 1000 * (st + 1) + i);
		gpucmd_batch_release(b, 10 * st + 3);
		gpucmd_batch_sync(b);
		run_done(b);
	}
	ck_assert_int_eq(gpucmd_memory_report(c, &rep), 0);
	for (size_t i = 0; i < rep->nservices; i++)
		if (strcmp(rep->services[i].name, "sum") == 0)
			s = &rep->services[i];
	ck_assert_ptr_nonnull(s);
	for (size_t j = 0; j < s->nstreams; j++) {
		const struct gpucmd_stream_report *sr = &s->streams[j];
		struct gpucmd_memory_usage p = pools_sum(sr);

		assert_usage_eq(&p, &sr->usage);
		add_usage(&total, &sr->usage);
		if (sr->connection_id == gpucmd_info(c)->connection_id ||
		    sr->connection_id == gpucmd_info(c2)->connection_id)
			ours++;
	}
	ck_assert_uint_eq(ours, s->nstreams);
	ck_assert_uint_ge(s->nstreams, 3);
	svc.allocations = s->allocations;
	svc.bytes_in_use = s->bytes_in_use;
	svc.bytes_padding = s->bytes_padding;
	svc.bytes_reserved = s->bytes_reserved;
	assert_usage_eq(&total, &svc);
	ck_assert_uint_eq(s->allocations, 12);
	/* (1+2+4+5) * 1000 * (1+2+3) + (1+2+4+5) * 3 */
	ck_assert_uint_eq(s->bytes_in_use, 12 * 1000 * 6 + 12 * 3);
	ck_assert_uint_eq(s->connections, 2);
	ck_assert_uint_eq(rep->totals.bytes_in_use, s->bytes_in_use);
	gpucmd_report_free(rep);
	gpucmd_close(c2);
	gpucmd_close(c);
}
END_TEST

START_TEST(accessors_check_the_kind)
{
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_batch *b = batch(c, 0);
	struct gpucmd_response *r;
	struct gpucmd_stream_report *sr;
	struct gpucmd_cpu_buffer cpu;
	struct gpucmd_profile p;
	uint64_t v;

	gpucmd_batch_ping(b);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_value(r, 0, &v), GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_response_cpu(r, 0, &cpu), GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_response_profile(r, 0, &p), GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_response_stream_report(r, 0, &sr),
			 GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_response_value(r, 5, &v), GPUCMD_EINVAL);
	gpucmd_response_free(r);
	gpucmd_stream_report_free(NULL);
	gpucmd_close(c);
}
END_TEST

/*
 * The batch builders check their arguments: each call below is refused
 * with GPUCMD_EINVAL and adds nothing, and the batch keeps the refusal, so
 * it is never sent without the op.  A batch takes max_ops_per_batch ops
 * and then GPUCMD_ELIMIT; a
 * submit without somewhere to put the id frees the batch.  An i32
 * argument goes to the daemon, which names the argument it does not take.
 */
/*
 * call, on a fresh batch b, is refused with code: it queues nothing, and
 * the batch keeps the refusal.
 */
#define REFUSED(call, code)                                      \
	do {                                                     \
		b = batch(c, 0);                                 \
		ck_assert_int_eq((call), (code));                \
		ck_assert_uint_eq(gpucmd_batch_count(b), 0);     \
		ck_assert_int_eq(gpucmd_batch_error(b), (code)); \
		gpucmd_batch_free(b);                            \
	} while (0)

START_TEST(batch_calls_check_their_arguments)
{
	static const uint32_t one[3] = { 1, 1, 1 };
	static const uint8_t data[4] = { 1, 2, 3, 4 };
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_batch *b = NULL, *full;
	struct gpucmd_arg args[3] = {
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = 0 },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = 7 },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = 1 },
	};
	struct gpucmd_pool_options pool = { .kind = NULL };
	struct gpucmd_layout l = {
		.rank = 2,
		.shape = { UINT64_C(1) << 40, UINT64_C(1) << 40 },
		.strides = { UINT64_C(1) << 40, 1 },
		.elem_size = 1,
	};
	uint64_t id = 0;
	int idx = -1;

	ck_assert_int_eq(gpucmd_batch_new(NULL, 0, &b), GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_batch_new(c, 0, NULL), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_create_with_data(b, 0, data, 4), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_create_with_data(b, 1, NULL, 4), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_write(b, 0, 0, data, 4), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_write(b, 1, 0, NULL, 4), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_write_layout(b, 1, 0, NULL, data, 4),
		GPUCMD_EINVAL);
	/* From region 0, and 2^80 elements from a region. */
	REFUSED(gpucmd_batch_write_region(b, 1, 0, 0, 0, 4), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_write_region_layout(b, 1, 0, &l, 5, 0),
		GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_read(b, 0, 0, 4), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_release(b, 0), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_load_module(b, 0, "ptx", data, 4), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_load_module(b, 1, NULL, data, 4), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_load_module(b, 1, "ptx", NULL, 4), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_unload_module(b, 0), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_kernel_module(b, 0, "f", one, one, 0, NULL, 0),
		GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_kernel(b, NULL, one, one, NULL, 0), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_kernel(b, "", one, one, NULL, 0), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_kernel(b, "fill_u32", one, one, NULL, 3),
		GPUCMD_EINVAL);
	/* A buffer argument of handle 0, and a kind nobody knows. */
	REFUSED(gpucmd_batch_kernel(b, "fill_u32", one, one, args, 3),
		GPUCMD_EINVAL);
	args[0].v.handle = 1;
	args[2].kind = (enum gpucmd_arg_kind)99;
	REFUSED(gpucmd_batch_kernel(b, "fill_u32", one, one, args, 3),
		GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_install_pools(b, NULL, NULL, 0), GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_install_pools(b, "custom", NULL, 2),
		GPUCMD_EINVAL);
	REFUSED(gpucmd_batch_install_pools(b, "custom", &pool, 1),
		GPUCMD_EINVAL);

	/*
	 * A refusal sticks: later builders queue nothing and return it, and
	 * the submit sends nothing, saying which op it was.
	 */
	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_ping(b), 0);
	ck_assert_int_eq(gpucmd_batch_write(b, 0, 0, data, 4), GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_batch_error(b), GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_batch_create_with_data(b, 1, data, 4),
			 GPUCMD_EINVAL);
	ck_assert_int_eq(gpucmd_batch_ping(b), GPUCMD_EINVAL);
	ck_assert_uint_eq(gpucmd_batch_count(b), 1);
	ck_assert_int_eq(gpucmd_submit(b, &id), GPUCMD_EINVAL);
	ck_assert_msg(strstr(gpucmd_last_message(c),
			     "the builder of its op 1 (counting from 0) "
			     "refused it with GPUCMD_EINVAL: an argument was "
			     "invalid") != NULL,
		      "%s", gpucmd_last_message(c));
	/* Nothing ran: handle 1 does not exist, and the connection serves. */
	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_read(b, 1, 0, 4), 0);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_ENOTFOUND);
	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_error(b), 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(b, 1, data, 4), 0);
	ck_assert_int_eq(gpucmd_batch_ping(b), 0);
	ck_assert_uint_eq(gpucmd_batch_count(b), 2);
	ck_assert_int_eq(gpucmd_batch_error(NULL), GPUCMD_EINVAL);
	run_done(b);

	/* An i32 where fill_u32 takes a u32: the daemon names the argument. */
	args[2].kind = GPUCMD_ARG_I32;
	args[2].v.i32 = -1;
	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_kernel(b, "fill_u32", one, one, args, 3),
			 0);
	ck_assert_int_eq(run_code(b, &idx), GPUCMD_EINVAL);
	ck_assert_int_eq(idx, 0);
	ck_assert_msg(strstr(last_message, "argument 2") != NULL, "%s",
		      last_message);

	/* max_ops_per_batch ops, then no more. */
	full = batch(c, 0);
	for (uint32_t i = 0; i < gpucmd_info(c)->max_ops_per_batch; i++)
		ck_assert_int_eq(gpucmd_batch_ping(full), 0);
	ck_assert_int_eq(gpucmd_batch_ping(full), GPUCMD_ELIMIT);
	ck_assert_int_eq(gpucmd_submit(full, &id), GPUCMD_ELIMIT);
	ck_assert_msg(strstr(gpucmd_last_message(c),
			     "held max_ops_per_batch (") != NULL,
		      "%s", gpucmd_last_message(c));

	/* A submit needs the batch and a place for its id. */
	ck_assert_int_eq(gpucmd_submit(NULL, &id), GPUCMD_EINVAL);
	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_ping(b), 0);
	ck_assert_int_eq(gpucmd_submit(b, NULL), GPUCMD_EINVAL);
	b = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_ping(b), 0);
	run_done(b);
	gpucmd_close(c);
}
END_TEST

/*
 * A sync on a connection with nothing out is answered by the loop thread
 * (no batch runs on the device thread), and still in order: behind a
 * batch in flight it waits for it, and after a capture or a fault the
 * device thread answers (capture_refuses_reads_syncs_allocations and
 * test_hostile2's fault test check those answers).
 */
START_TEST(sync_when_quiet_and_in_order)
{
	struct gpucmd_arg us = { .kind = GPUCMD_ARG_U32, .v.u32 = 200000 };
	struct gpucmd_conn *c = connect_as("ops");
	struct gpucmd_response *r = NULL;
	struct gpucmd_status st0, st1;
	struct gpucmd_batch *b;
	uint64_t id, t0, waited;

	b = batch(c, 0);
	gpucmd_batch_kernel(b, "spin", ONE, ONE, &us, 1);
	gpucmd_batch_sync(b);
	run_done(b);
	ck_assert_int_eq(gpucmd_status(c, &st0), 0);
	for (int i = 0; i < 50; i++) {
		b = batch(c, 0);
		gpucmd_batch_sync(b);
		gpucmd_batch_ping(b);
		gpucmd_batch_sync(b);
		run_done(b);
	}
	ck_assert_int_eq(gpucmd_status(c, &st1), 0);
	/* Only the status batch itself ran on the device thread. */
	ck_assert_uint_eq(st1.batches - st0.batches, 1);

	/* Behind a 200 ms kernel, a sync is answered after it. */
	b = batch(c, 0);
	gpucmd_batch_kernel(b, "spin", ONE, ONE, &us, 1);
	ck_assert_int_eq(gpucmd_submit(b, &id), 0);
	t0 = harness_now_us();
	b = batch(c, 0);
	gpucmd_batch_sync(b);
	run_done(b);
	waited = harness_now_us() - t0;
	ck_assert_msg(waited >= 150000,
		      "the sync came back after %llu us, "
		      "before the kernel it follows",
		      (unsigned long long)waited);
	ck_assert_int_eq(gpucmd_wait(c, id, &r), 0);
	ck_assert_int_eq(gpucmd_response_error(r), 0);
	gpucmd_response_free(r);

	/* A stream that never ran anything: the sync still succeeds. */
	b = batch(c, 7);
	gpucmd_batch_sync(b);
	run_done(b);
	gpucmd_close(c);
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("ops");
	TCase *tc = tcase_create("ops");

	tcase_add_checked_fixture(tc, harness_setup, harness_teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, reserve_bind_write_read);
	tcase_add_test(tc, bind_unknown_or_used_reservation);
	tcase_add_test(tc, reserve_too_big);
	tcase_add_test(tc, reserve_over_the_device_is_too_big);
	tcase_add_test(tc, cursor_counts_ops);
	tcase_add_test(tc, stream_report_adds_up);
	tcase_add_test(tc, memory_cleanup_returns_free_pages);
	tcase_add_test(tc, release_after_finished_uses_frees_at_once);
	tcase_add_test(tc, cleanup_of_the_service);
	tcase_add_test(tc, flush_drops_deferred_during_capture);
	tcase_add_test(tc, persistent_mode_nests);
	tcase_add_test(tc, install_pools_refused_while_in_use);
	tcase_add_test(tc, installed_layout_applies_to_later_streams);
	tcase_add_test(tc, reserve_cpu_answers);
	tcase_add_test(tc, strided_write_read_round_trip);
	tcase_add_test(tc, strided_errors);
	tcase_add_test(tc, empty_copies_check_their_offset);
	tcase_add_test(tc, profile_times_a_spin);
	tcase_add_test(tc, profile_errors);
	tcase_add_test(tc, refused_launch_invalidates_profile);
	tcase_add_test(tc, faulted_work_invalidates_profile);
	tcase_add_test(tc, graph_replay_equals_eager);
	tcase_add_test(tc, graph_holds_its_handles);
	tcase_add_test(tc, capture_refuses_reads_syncs_allocations);
	tcase_add_test(tc, capture_abort_discards_the_recording);
	tcase_add_test(tc, capture_and_other_streams);
	tcase_add_test(tc, capture_ignores_uses_that_completed);
	tcase_add_test(tc, profiles_and_graphs_are_bounded);
	tcase_add_test(tc, captured_ops_are_bounded);
	tcase_add_test(tc, graph_replays_are_bounded);
	tcase_add_test(tc, graph_destroy_then_launch);
	tcase_add_test(tc, evict_a_service);
	tcase_add_test(tc, evict_one_connection);
	tcase_add_test(tc, evict_arguments);
	tcase_add_test(tc, report_peak_counts_pending_releases);
	tcase_add_test(tc, cross_stream_ordering_random);
	tcase_add_test(tc, report_streams_add_up_to_service);
	tcase_add_test(tc, accessors_check_the_kind);
	tcase_add_test(tc, batch_calls_check_their_arguments);
	tcase_add_test(tc, sync_when_quiet_and_in_order);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return harness_main(make_suite());
}
