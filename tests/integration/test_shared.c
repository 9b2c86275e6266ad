/*
 * test_shared.c - buffers shared between the connections of one service
 * (share, import): the bytes, read-only for every holder, the memory that
 * outlives the connection that shared it and goes with the last handle,
 * names per service, the count in the memory report and the quota, and
 * clients that die holding one.
 */
#include "harness.h"

#define KIB 1024ull
#define MIB (1024ull * 1024)

static const uint32_t G1[3] = { 1, 1, 1 };
static const uint32_t B64[3] = { 64, 1, 1 };

static char conf_path[256];

static void start_with(const char *text)
{
	harness_config(text, conf_path, sizeof(conf_path));
	daemon_start_args(&the_daemon, "--config", conf_path, NULL);
}

/* Run b, which must fail at op idx with code and a message holding want. */
#define expect_fail(b, idx, code, want) \
	expect_fail_at(__LINE__, b, idx, code, want)
static void expect_fail_at(int line, struct gpucmd_batch *b, int idx, int code,
			   const char *want)
{
	struct gpucmd_response *r = NULL;
	const char *msg;

	ck_assert_int_eq(gpucmd_run(b, &r), 0);
	msg = gpucmd_response_message(r);
	ck_assert_msg(gpucmd_response_error(r) == code,
		      "line %d: expected %s, got %s: %s", line,
		      gpucmd_errname(code),
		      gpucmd_errname(gpucmd_response_error(r)), msg);
	ck_assert_msg(gpucmd_response_failed_index(r) == idx,
		      "line %d: failed at op %d, expected %d (%s)", line,
		      gpucmd_response_failed_index(r), idx, msg);
	ck_assert_msg(strstr(msg, want) != NULL,
		      "line %d: message '%s' lacks '%s'", line, msg, want);
	gpucmd_response_free(r);
}

static struct gpucmd_batch *batch(struct gpucmd_conn *c, uint32_t stream)
{
	struct gpucmd_batch *b = NULL;

	ck_assert_int_eq(gpucmd_batch_new(c, stream, &b), 0);
	return b;
}

/* n words of a pattern that tells buffers apart. */
static void pattern(uint32_t *w, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		w[i] = seed * 2654435761u + (uint32_t)i;
}

/* Allocate handle on c with n words of pattern seed, and share it. */
static void make_shared(struct gpucmd_conn *c, uint64_t handle,
			const char *name, size_t n, uint32_t seed)
{
	uint32_t *w = malloc(n * 4);
	struct gpucmd_batch *b = batch(c, 0);

	ck_assert_ptr_nonnull(w);
	pattern(w, n, seed);
	ck_assert_int_eq(gpucmd_batch_create_with_data(b, handle, w, n * 4), 0);
	ck_assert_int_eq(gpucmd_batch_share(b, handle, name), 0);
	gpucmd_response_free(run_ok(b));
	free(w);
}

/* Read n words of handle on c and check them against pattern seed. */
static void expect_pattern(struct gpucmd_conn *c, uint32_t stream,
			   uint64_t handle, size_t n, uint32_t seed)
{
	struct gpucmd_batch *b = batch(c, stream);
	struct gpucmd_response *r;
	uint32_t *want = malloc(n * 4);
	const void *data;
	size_t len;

	ck_assert_ptr_nonnull(want);
	pattern(want, n, seed);
	ck_assert_int_eq(gpucmd_batch_read(b, handle, 0, n * 4), 0);
	r = run_ok(b);
	ck_assert_int_eq(gpucmd_response_data(r, 0, &data, &len), 0);
	ck_assert_uint_eq(len, n * 4);
	ck_assert_int_eq(memcmp(data, want, n * 4), 0);
	gpucmd_response_free(r);
	free(want);
}

static void import_ok(struct gpucmd_conn *c, uint64_t handle, const char *name)
{
	struct gpucmd_batch *b = batch(c, 0);

	ck_assert_int_eq(gpucmd_batch_import(b, handle, name), 0);
	gpucmd_response_free(run_ok(b));
}

static void release_ok(struct gpucmd_conn *c, uint64_t handle)
{
	struct gpucmd_batch *b = batch(c, 0);

	ck_assert_int_eq(gpucmd_batch_release(b, handle), 0);
	ck_assert_int_eq(gpucmd_batch_sync(b), 0);
	gpucmd_response_free(run_ok(b));
}

/* The report's row of service name; its shared list is copied to sh. */
static struct gpucmd_service_report row_of(struct gpucmd_conn *c,
					   const char *name,
					   struct gpucmd_shared_buffer *sh,
					   size_t cap)
{
	struct gpucmd_report *rep = NULL;
	struct gpucmd_service_report out;
	bool found = false;

	memset(&out, 0, sizeof(out));
	ck_assert_int_eq(gpucmd_memory_report(c, &rep), 0);
	for (size_t i = 0; i < rep->nservices; i++) {
		if (strcmp(rep->services[i].name, name) != 0)
			continue;
		out = rep->services[i];
		found = true;
		ck_assert_uint_le(out.nshared, cap);
		if (out.nshared > 0)
			memcpy(sh, out.shared, out.nshared * sizeof(*sh));
	}
	ck_assert_msg(found, "service %s is not in the report", name);
	out.streams = NULL;
	out.shared = NULL;
	gpucmd_report_free(rep);
	return out;
}

/* ---- the bytes ------------------------------------------------------------ */

START_TEST(imported_buffer_holds_the_shared_bytes)
{
	struct gpucmd_conn *a = connect_as("infer");
	struct gpucmd_conn *b = connect_as("infer");
	struct gpucmd_arg args[3] = { buf_arg(20), gpucmd_arg_buffer_in(7),
				      u64_arg(4096) };
	struct gpucmd_batch *k;

	make_shared(a, 1, "weights", 1024, 11);
	/* The sharer keeps reading it through its own handle. */
	expect_pattern(a, 0, 1, 1024, 11);
	import_ok(b, 7, "weights");
	expect_pattern(b, 0, 7, 1024, 11);
	/* On another stream of the importer too, and through a kernel. */
	expect_pattern(b, 3, 7, 1024, 11);
	k = batch(b, 2);
	ck_assert_int_eq(gpucmd_batch_empty(k, 20, 4096), 0);
	ck_assert_int_eq(gpucmd_batch_kernel(k, "copy", G1, B64, args, 3), 0);
	gpucmd_response_free(run_ok(k));
	expect_pattern(b, 2, 20, 1024, 11);
	/* A built-in's input may be passed either way. */
	args[1] = buf_arg(7);
	k = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_kernel(k, "copy", G1, B64, args, 3), 0);
	gpucmd_response_free(run_ok(k));
	gpucmd_close(a);
	gpucmd_close(b);
}
END_TEST

START_TEST(shared_buffers_are_read_only_for_every_holder)
{
	struct gpucmd_conn *a = connect_as("infer");
	struct gpucmd_conn *b = connect_as("infer");
	struct gpucmd_arg fill[3] = { buf_arg(7), u32_arg(1), u32_arg(4) };
	struct gpucmd_arg copy[3] = { buf_arg(7), gpucmd_arg_buffer_in(9),
				      u64_arg(16) };
	struct gpucmd_batch *x;
	uint32_t w[4] = { 0 };

	make_shared(a, 1, "weights", 64, 3);
	import_ok(b, 7, "weights");
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_write(x, 7, 0, w, sizeof(w)), 0);
	expect_fail(x, 0, GPUCMD_EINVAL, "read-only");
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_kernel(x, "fill_u32", G1, B64, fill, 3),
			 0);
	expect_fail(x, 0, GPUCMD_EINVAL, "shared as 'weights'");
	/* Its sharer may not write it either. */
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_write(x, 1, 0, w, sizeof(w)), 0);
	expect_fail(x, 0, GPUCMD_EINVAL, "read-only");
	/* A buffer_in is no output, shared or not. */
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_empty(x, 9, 64), 0);
	copy[0] = gpucmd_arg_buffer_in(9);
	copy[1] = buf_arg(9);
	ck_assert_int_eq(gpucmd_batch_kernel(x, "copy", G1, B64, copy, 3), 0);
	expect_fail(x, 1, GPUCMD_EINVAL, "buffer_in");
	/* A capture that would write it is refused while recording. */
	x = batch(b, 4);
	ck_assert_int_eq(gpucmd_batch_capture_begin(x), 0);
	ck_assert_int_eq(gpucmd_batch_kernel(x, "fill_u32", G1, B64, fill, 3),
			 0);
	expect_fail(x, 1, GPUCMD_EINVAL, "read-only");
	x = batch(b, 4);
	ck_assert_int_eq(gpucmd_batch_capture_abort(x), 0);
	gpucmd_response_free(run_ok(x));
	expect_pattern(b, 0, 7, 16, 3);
	gpucmd_close(a);
	gpucmd_close(b);
}
END_TEST

START_TEST(graphs_replay_reads_of_a_shared_buffer)
{
	struct gpucmd_conn *a = connect_as("infer");
	struct gpucmd_conn *b = connect_as("infer");
	struct gpucmd_arg copy[3] = { buf_arg(2), gpucmd_arg_buffer_in(7),
				      u64_arg(256) };
	struct gpucmd_batch *x;

	make_shared(a, 1, "w", 64, 5);
	import_ok(b, 7, "w");
	x = batch(b, 1);
	ck_assert_int_eq(gpucmd_batch_empty(x, 2, 256), 0);
	ck_assert_int_eq(gpucmd_batch_capture_begin(x), 0);
	ck_assert_int_eq(gpucmd_batch_kernel(x, "copy", G1, B64, copy, 3), 0);
	ck_assert_int_eq(gpucmd_batch_capture_end(x, 40), 0);
	gpucmd_response_free(run_ok(x));
	x = batch(b, 1);
	ck_assert_int_eq(gpucmd_batch_graph_launch(x, 40), 0);
	gpucmd_response_free(run_ok(x));
	expect_pattern(b, 1, 2, 64, 5);
	/* The graph holds the handle: no release, nor a share of one. */
	x = batch(b, 1);
	ck_assert_int_eq(gpucmd_batch_release(x, 7), 0);
	expect_fail(x, 0, GPUCMD_EBUSY, "graph");
	x = batch(b, 1);
	ck_assert_int_eq(gpucmd_batch_share(x, 2, "out"), 0);
	expect_fail(x, 0, GPUCMD_EBUSY, "graph");
	x = batch(b, 1);
	ck_assert_int_eq(gpucmd_batch_graph_destroy(x, 40), 0);
	ck_assert_int_eq(gpucmd_batch_release(x, 7), 0);
	gpucmd_response_free(run_ok(x));
	gpucmd_close(a);
	gpucmd_close(b);
}
END_TEST

/* ---- lifetime ------------------------------------------------------------- */

START_TEST(shared_memory_outlives_its_sharer)
{
	struct gpucmd_conn *a = connect_as("infer");
	struct gpucmd_conn *b = connect_as("infer");
	struct gpucmd_conn *o = connect_as("watch");
	struct gpucmd_shared_buffer sh[4];
	struct gpucmd_service_report row;

	make_shared(a, 1, "weights", 16 * KIB / 4, 9);
	import_ok(b, 7, "weights");
	row = row_of(b, "infer", sh, 4);
	ck_assert_uint_eq(row.shared_buffers, 1);
	ck_assert_uint_eq(row.shared_buffer_bytes, 16 * KIB);
	ck_assert_uint_eq(row.nshared, 1);
	ck_assert_str_eq(sh[0].name, "weights");
	ck_assert_uint_eq(sh[0].bytes, 16 * KIB);
	ck_assert_uint_eq(sh[0].handles, 2);
	ck_assert_uint_eq(sh[0].imports, 1);
	ck_assert_uint_eq(sh[0].connection_id, gpucmd_info(a)->connection_id);
	ck_assert_int_eq(sh[0].ready, 1);
	ck_assert_int_eq(sh[0].sharer_open, 1);
	/* Counted once, whoever holds it. */
	ck_assert_uint_eq(row.bytes_in_use, 16 * KIB);
	ck_assert_uint_eq(row.allocations, 1);

	gpucmd_close(a);
	expect_pattern(b, 0, 7, 16 * KIB / 4, 9);
	/* status counts it too, though no connection's stream holds it. */
	{
		struct gpucmd_status st;

		ck_assert_int_eq(gpucmd_status(b, &st), 0);
		ck_assert_uint_eq(st.bytes_in_use, 16 * KIB);
		ck_assert_uint_ge(st.bytes_reserved, 16 * KIB);
	}
	row = row_of(b, "infer", sh, 4);
	ck_assert_uint_eq(row.shared_buffers, 1);
	ck_assert_uint_eq(sh[0].handles, 1);
	ck_assert_int_eq(sh[0].sharer_open, 0);
	ck_assert_uint_eq(row.bytes_in_use, 16 * KIB);

	/* The last handle takes it, and its name, away. */
	release_ok(b, 7);
	row = row_of(b, "infer", sh, 4);
	ck_assert_uint_eq(row.shared_buffers, 0);
	ck_assert_uint_eq(row.bytes_in_use, 0);
	ck_assert_uint_eq(row.allocations, 0);
	{
		struct gpucmd_batch *x = batch(b, 0);

		ck_assert_int_eq(gpucmd_batch_import(x, 8, "weights"), 0);
		expect_fail(x, 0, GPUCMD_ENOTFOUND, "shares no buffer");
	}
	/* The name is free again. */
	make_shared(b, 3, "weights", 8, 4);
	expect_pattern(b, 0, 3, 8, 4);
	/* Another service saw none of it. */
	ck_assert_uint_eq(row_of(o, "watch", sh, 4).shared_buffers, 0);
	gpucmd_close(b);
	gpucmd_close(o);
}
END_TEST

static int hold_import(void *arg)
{
	struct gpucmd_conn *c = NULL;
	struct gpucmd_batch *b = NULL;
	struct gpucmd_response *r = NULL;
	uint32_t spin[1];
	struct gpucmd_arg args[1];
	uint64_t id;

	(void)arg;
	if (gpucmd_connect(the_daemon.sock, "infer", &c, NULL, 0) != 0)
		return 2;
	if (gpucmd_batch_new(c, 0, &b) != 0 ||
	    gpucmd_batch_import(b, 5, "weights") != 0 ||
	    gpucmd_run(b, &r) != 0 || gpucmd_response_error(r) != 0)
		return 3;
	gpucmd_response_free(r);
	/* Work in flight on it when the client dies. */
	spin[0] = 10000;
	args[0] = u32_arg(spin[0]);
	if (gpucmd_batch_new(c, 1, &b) != 0 ||
	    gpucmd_batch_kernel(b, "spin", G1, G1, args, 1) != 0 ||
	    gpucmd_batch_read(b, 5, 0, 64) != 0 || gpucmd_submit(b, &id) != 0)
		return 4;
	return 0;
}

START_TEST(a_client_that_dies_leaves_its_imports_behind)
{
	struct gpucmd_conn *a = connect_as("infer");
	struct gpucmd_shared_buffer sh[2];
	pid_t child;

	make_shared(a, 1, "weights", 256, 2);
	child = harness_child_ready(hold_import, NULL);
	ck_assert_uint_eq(row_of(a, "infer", sh, 2).shared_buffers, 1);
	ck_assert_uint_eq(sh[0].handles, 2);
	harness_child_kill(child);
	/* The daemon frees the connection once its work has run. */
	for (int i = 0; i < 1000; i++) {
		row_of(a, "infer", sh, 2);
		if (sh[0].handles == 1)
			break;
		usleep(10000);
	}
	ck_assert_uint_eq(sh[0].handles, 1);
	expect_pattern(a, 0, 1, 64, 2);
	release_ok(a, 1);
	ck_assert_uint_eq(row_of(a, "infer", sh, 2).bytes_in_use, 0);
	gpucmd_close(a);
}
END_TEST

/* ---- names ---------------------------------------------------------------- */

START_TEST(names_belong_to_their_service)
{
	struct gpucmd_conn *a = connect_as("infer");
	struct gpucmd_conn *b = connect_as("infer");
	struct gpucmd_conn *t = connect_as("train");
	struct gpucmd_batch *x;

	make_shared(a, 1, "weights", 16, 1);
	/* Another service finds nothing by that name... */
	x = batch(t, 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 7, "weights"), 0);
	expect_fail(x, 0, GPUCMD_ENOTFOUND, "service 'train' shares no buffer");
	/* ...and may share one of its own under it. */
	make_shared(t, 2, "weights", 16, 2);
	import_ok(b, 7, "weights");
	expect_pattern(b, 0, 7, 16, 1);
	expect_pattern(t, 0, 2, 16, 2);

	/* A name is shared once per service. */
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_empty(x, 8, 64), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 8, "weights"), 0);
	expect_fail(x, 1, GPUCMD_EEXIST, "already");
	/* A handle is shared once. */
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 7, "again"), 0);
	expect_fail(x, 0, GPUCMD_EINVAL, "shared already, as 'weights'");
	/* An import takes a new id. */
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 8, "weights"), 0);
	expect_fail(x, 0, GPUCMD_EEXIST, "already live");
	/* Names the daemon refuses, and those the builder does. */
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 8, "a b"), 0);
	expect_fail(x, 0, GPUCMD_EINVAL, "cannot name a shared buffer");
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 8, ""), GPUCMD_EINVAL);
	ck_assert_int_eq(
		gpucmd_batch_import(
			x, 9,
			"0123456789012345678901234567890123456789012345678901234567890123"),
		GPUCMD_EINVAL);
	gpucmd_batch_free(x);
	/* A handle that does not exist is named. */
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 99, "x"), 0);
	expect_fail(x, 0, GPUCMD_ENOTFOUND, "handle 99");
	gpucmd_close(a);
	gpucmd_close(b);
	gpucmd_close(t);
}
END_TEST

/* ---- quota ---------------------------------------------------------------- */

START_TEST(a_shared_buffer_counts_once_against_the_quota)
{
	struct gpucmd_conn *a, *b, *c;
	struct gpucmd_shared_buffer sh[2];
	struct gpucmd_batch *x;

	start_with("[service q]\nmemory_limit = 1M\n");
	a = connect_as("q");
	b = connect_as("q");
	c = connect_as("q");
	make_shared(a, 1, "w", 512 * KIB / 4, 6);
	import_ok(b, 1, "w");
	import_ok(c, 1, "w");
	ck_assert_uint_eq(row_of(a, "q", sh, 2).bytes_in_use, 512 * KIB);
	/* 512K more fits under 1M; three copies would not have. */
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_empty(x, 2, 512 * KIB), 0);
	gpucmd_response_free(run_ok(x));
	x = batch(c, 0);
	ck_assert_int_eq(gpucmd_batch_empty(x, 2, 4 * KIB), 0);
	expect_fail(x, 0, GPUCMD_EQUOTA, "quota exceeded");
	gpucmd_close(a);
	gpucmd_close(b);
	gpucmd_close(c);
}
END_TEST

/* ---- the answer, and the order of the copy -------------------------------- */

/* Keep stream of c busy for n x 10 ms (a tenant's spins are 10 ms at most). */
static void keep_busy(struct gpucmd_batch *b, int n)
{
	struct gpucmd_arg spin[1] = { u32_arg(10000) };

	for (int i = 0; i < n; i++)
		ck_assert_int_eq(gpucmd_batch_kernel(b, "spin", G1, G1, spin,
						     1),
				 0);
}

/*
 * "Import it once that share was answered": the answer must come once the
 * copy ran, sync or none in the batch.  It used to come at dispatch, like
 * any batch without a read or sync, while the copy still waited behind the
 * stream's work: an import right after it was refused (GPUCMD_EBUSY, still
 * being copied) (on the fake CUDA backend every time).
 */
START_TEST(a_share_is_answered_once_its_copy_ran)
{
	struct gpucmd_conn *a = connect_as("infer");
	struct gpucmd_conn *b = connect_as("infer");
	struct gpucmd_batch *x;
	uint32_t w[64];

	pattern(w, 64, 21);
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 1, w, sizeof(w)), 0);
	keep_busy(x, 30);
	ck_assert_int_eq(gpucmd_batch_share(x, 1, "late"), 0);
	gpucmd_response_free(run_ok(x));
	import_ok(b, 7, "late");
	expect_pattern(b, 0, 7, 64, 21);
	/* A kernel after it in the batch: the answer still waits. */
	x = batch(a, 1);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 2, w, sizeof(w)), 0);
	keep_busy(x, 20);
	ck_assert_int_eq(gpucmd_batch_share(x, 2, "later"), 0);
	keep_busy(x, 1);
	gpucmd_response_free(run_ok(x));
	import_ok(b, 8, "later");
	expect_pattern(b, 2, 8, 64, 21);
	gpucmd_close(a);
	gpucmd_close(b);
}
END_TEST

/*
 * A share on stream 2 of a buffer last written on stream 1 of the same
 * connection copies what that write left, however late it runs.
 */
START_TEST(a_share_copies_the_last_write_of_another_stream)
{
	struct gpucmd_conn *a = connect_as("infer");
	struct gpucmd_conn *b = connect_as("infer");
	struct gpucmd_batch *x;
	uint32_t w[256];
	uint64_t id;

	pattern(w, 256, 1);
	x = batch(a, 1);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 1, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_sync(x), 0);
	gpucmd_response_free(run_ok(x));
	/* Stream 1 busy, then the write that the share must see. */
	pattern(w, 256, 2);
	x = batch(a, 1);
	keep_busy(x, 20);
	ck_assert_int_eq(gpucmd_batch_write(x, 1, 0, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_submit(x, &id), 0);
	x = batch(a, 2);
	ck_assert_int_eq(gpucmd_batch_share(x, 1, "w"), 0);
	ck_assert_int_eq(gpucmd_batch_sync(x), 0);
	gpucmd_response_free(run_ok(x));
	{
		struct gpucmd_response *r = NULL;

		ck_assert_int_eq(gpucmd_wait(a, id, &r), 0);
		ck_assert_int_eq(gpucmd_response_error(r), 0);
		gpucmd_response_free(r);
	}
	import_ok(b, 7, "w");
	expect_pattern(b, 3, 7, 256, 2);
	/* The sharer's own handle, on its first stream. */
	expect_pattern(a, 1, 1, 256, 2);
	gpucmd_close(a);
	gpucmd_close(b);
}
END_TEST

/*
 * An import read at once on another stream of the importer, and a graph of
 * the importer that reads it, replayed after the sharer left.
 */
START_TEST(a_graph_of_an_importer_outlives_the_sharer)
{
	struct gpucmd_conn *a = connect_as("infer");
	struct gpucmd_conn *b = connect_as("infer");
	struct gpucmd_arg copy[3] = { buf_arg(2), gpucmd_arg_buffer_in(7),
				      u64_arg(1024) };
	struct gpucmd_shared_buffer sh[2];
	struct gpucmd_batch *x;

	make_shared(a, 1, "w", 256, 8);
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 7, "w"), 0);
	gpucmd_response_free(run_ok(x));
	expect_pattern(b, 5, 7, 256, 8);
	x = batch(b, 3);
	ck_assert_int_eq(gpucmd_batch_empty(x, 2, 1024), 0);
	ck_assert_int_eq(gpucmd_batch_capture_begin(x), 0);
	ck_assert_int_eq(gpucmd_batch_kernel(x, "copy", G1, B64, copy, 3), 0);
	ck_assert_int_eq(gpucmd_batch_capture_end(x, 40), 0);
	gpucmd_response_free(run_ok(x));
	gpucmd_close(a);
	/* The sharer's handle went with it: the graph's import holds it. */
	for (int i = 0; i < 500; i++) {
		if (row_of(b, "infer", sh, 2).nshared == 1 &&
		    sh[0].handles == 1)
			break;
		usleep(10000);
	}
	ck_assert_uint_eq(sh[0].handles, 1);
	x = batch(b, 4);
	ck_assert_int_eq(gpucmd_batch_graph_launch(x, 40), 0);
	gpucmd_response_free(run_ok(x));
	expect_pattern(b, 6, 2, 256, 8);
	x = batch(b, 4);
	ck_assert_int_eq(gpucmd_batch_graph_destroy(x, 40), 0);
	ck_assert_int_eq(gpucmd_batch_release(x, 7), 0);
	ck_assert_int_eq(gpucmd_batch_release(x, 2), 0);
	ck_assert_int_eq(gpucmd_batch_sync(x), 0);
	gpucmd_response_free(run_ok(x));
	ck_assert_uint_eq(row_of(b, "infer", sh, 2).shared_buffers, 0);
	gpucmd_close(b);
}
END_TEST

/*
 * The report says whether the connection that shared a buffer is open:
 * whatever handles it still holds (none here once it released its own),
 * and no longer once it is gone, while an import keeps the buffer.
 */
START_TEST(the_report_says_whether_the_sharer_is_open)
{
	struct gpucmd_conn *a = connect_as("infer");
	struct gpucmd_conn *b = connect_as("infer");
	struct gpucmd_conn *c = connect_as("infer");
	uint64_t a_id = gpucmd_info(a)->connection_id;
	struct gpucmd_shared_buffer sh[4];
	struct gpucmd_service_report row;
	int gone = -1, kept = -1;

	make_shared(a, 1, "gone", 64, 3);
	make_shared(c, 1, "kept", 64, 4);
	import_ok(b, 7, "gone");
	release_ok(a, 1);
	row = row_of(b, "infer", sh, 4);
	ck_assert_uint_eq(row.nshared, 2);
	for (int i = 0; i < 2; i++)
		ck_assert_msg(sh[i].sharer_open == 1,
			      "'%s': sharer_open %d with its sharer open",
			      sh[i].name, sh[i].sharer_open);

	gpucmd_close(a);
	/* The close reaches the device thread on its own time. */
	for (int i = 0; i < 500; i++) {
		row = row_of(b, "infer", sh, 4);
		gone = strcmp(sh[0].name, "gone") == 0 ? 0 : 1;
		kept = 1 - gone;
		if (row.nshared != 2 || sh[gone].sharer_open == 0)
			break;
		usleep(10000);
	}
	ck_assert_uint_eq(row.nshared, 2);
	ck_assert_str_eq(sh[gone].name, "gone");
	ck_assert_int_eq(sh[gone].sharer_open, 0);
	ck_assert_uint_eq(sh[gone].connection_id, a_id);
	ck_assert_uint_eq(sh[gone].handles, 1);
	ck_assert_str_eq(sh[kept].name, "kept");
	ck_assert_int_eq(sh[kept].sharer_open, 1);
	ck_assert_uint_eq(sh[kept].connection_id,
			  gpucmd_info(c)->connection_id);
	/* The import still reads what the sharer wrote. */
	expect_pattern(b, 0, 7, 16, 3);
	gpucmd_close(b);
	gpucmd_close(c);
}
END_TEST

/* ---- the counts ----------------------------------------------------------- */

/* The report of service name once its released memory went back. */
static struct gpucmd_service_report settled_row(struct gpucmd_conn *c,
						const char *name)
{
	struct gpucmd_shared_buffer sh[4];
	struct gpucmd_service_report row;
	uint64_t bytes = 0;

	for (int i = 0; i < 500; i++) {
		ck_assert_int_eq(gpucmd_cleanup(c, name, &bytes), 0);
		row = row_of(c, name, sh, 4);
		if (row.bytes_in_use == 0 && row.bytes_released_pending == 0 &&
		    row.bytes_reserved == 0 && row.allocations == 0 &&
		    row.shared_buffers == 0)
			break;
		usleep(10000);
	}
	return row;
}

/*
 * Every count the service has goes back to nothing once every handle of a
 * shared buffer is gone, whichever connection held the last, and the
 * quota counts nothing either: the whole memory_limit may be taken again.
 */
START_TEST(every_count_goes_back_to_zero)
{
	struct gpucmd_conn *a, *b, *c;
	struct gpucmd_service_report row;
	struct gpucmd_arg copy[3] = { buf_arg(3), gpucmd_arg_buffer_in(7),
				      u64_arg(64 * KIB) };
	struct gpucmd_batch *x;

	start_with("[service z]\nmemory_limit = 1M\n");
	a = connect_as("z");
	b = connect_as("z");
	c = connect_as("z");
	/* Written on stream 1, shared on stream 2, kept by the sharer. */
	x = batch(a, 1);
	ck_assert_int_eq(gpucmd_batch_empty(x, 1, 256 * KIB), 0);
	ck_assert_int_eq(gpucmd_batch_sync(x), 0);
	gpucmd_response_free(run_ok(x));
	x = batch(a, 2);
	ck_assert_int_eq(gpucmd_batch_share(x, 1, "one"), 0);
	gpucmd_response_free(run_ok(x));
	make_shared(a, 2, "two", 64 * KIB / 4, 3);
	import_ok(b, 7, "one");
	import_ok(c, 7, "two");
	import_ok(c, 8, "one");
	x = batch(c, 3);
	ck_assert_int_eq(gpucmd_batch_empty(x, 3, 64 * KIB), 0);
	copy[1] = gpucmd_arg_buffer_in(7);
	ck_assert_int_eq(gpucmd_batch_kernel(x, "copy", G1, B64, copy, 3), 0);
	ck_assert_int_eq(gpucmd_batch_release(x, 3), 0);
	gpucmd_response_free(run_ok(x));
	{
		struct gpucmd_shared_buffer sh[4];

		row = row_of(a, "z", sh, 4);
		ck_assert_uint_eq(row.shared_buffers, 2);
		ck_assert_uint_eq(row.shared_buffer_bytes, 320 * KIB);
		ck_assert_uint_ge(row.bytes_in_use, 320 * KIB);
	}
	/* Handles go, in every order: the sharer first for "one". */
	release_ok(a, 1);
	release_ok(b, 7);
	release_ok(c, 8);
	/* The last of "two" goes with its connection. */
	release_ok(a, 2);
	gpucmd_close(c);
	gpucmd_close(b);
	row = settled_row(a, "z");
	ck_assert_uint_eq(row.shared_buffers, 0);
	ck_assert_uint_eq(row.shared_buffer_bytes, 0);
	ck_assert_uint_eq(row.bytes_in_use, 0);
	ck_assert_uint_eq(row.allocations, 0);
	ck_assert_uint_eq(row.bytes_released_pending, 0);
	ck_assert_uint_eq(row.bytes_reserved, 0);
	/* The live bytes the quota counts are back to 0 as well. */
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_empty(x, 9, 1024 * KIB), 0);
	ck_assert_int_eq(gpucmd_batch_release(x, 9), 0);
	ck_assert_int_eq(gpucmd_batch_sync(x), 0);
	gpucmd_response_free(run_ok(x));
	gpucmd_close(a);
}
END_TEST

/* ---- limits, admin calls, failures -------------------------------------- */

/* Faults that the daemon survives, and its allocation hook: host only. */
static bool host_backend_only(void)
{
	const char *backend = getenv("GPUCMD_TEST_BACKEND");

	if (backend != NULL && backend[0] != '\0' &&
	    strcmp(backend, "host") != 0) {
		printf("skipped: a host-backend case (backend %s)\n", backend);
		return false;
	}
	return true;
}

/*
 * max_handles counts imports; a refused import takes no reference (the
 * report's handles), and once the holders leave the counts are 0.
 */
START_TEST(an_import_counts_against_max_handles)
{
	struct gpucmd_conn *a, *b;
	struct gpucmd_shared_buffer sh[2];
	struct gpucmd_batch *x;

	start_with("[limits]\nmax_handles = 2\n");
	a = connect_as("infer");
	b = connect_as("infer");
	make_shared(a, 1, "w", 16, 4);
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_empty(x, 1, 64), 0);
	ck_assert_int_eq(gpucmd_batch_empty(x, 2, 64), 0);
	gpucmd_response_free(run_ok(x));
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 3, "w"), 0);
	expect_fail(x, 0, GPUCMD_ELIMIT, "max_handles");
	ck_assert_uint_eq(row_of(a, "infer", sh, 2).shared_buffers, 1);
	ck_assert_uint_eq(sh[0].handles, 1);
	ck_assert_uint_eq(sh[0].imports, 0);
	release_ok(b, 2);
	import_ok(b, 3, "w");
	expect_pattern(b, 0, 3, 16, 4);
	ck_assert_uint_eq(row_of(a, "infer", sh, 2).shared_buffers, 1);
	ck_assert_uint_eq(sh[0].handles, 2);
	gpucmd_close(b);
	release_ok(a, 1);
	ck_assert_uint_eq(settled_row(a, "infer").bytes_in_use, 0);
	gpucmd_close(a);
}
END_TEST

/* The sharer evicted: its import lives on; cleanup leaves shared memory. */
START_TEST(evict_and_cleanup_leave_shared_memory_alone)
{
	struct gpucmd_conn *a = connect_as("infer");
	struct gpucmd_conn *b = connect_as("infer");
	struct gpucmd_conn *c = connect_as("infer");
	struct gpucmd_shared_buffer sh[2];
	struct gpucmd_service_report row;
	uint64_t n = 0;

	make_shared(a, 1, "w", 4 * KIB, 12);
	import_ok(b, 7, "w");
	expect_pattern(b, 0, 7, 4 * KIB, 12);
	ck_assert_int_eq(gpucmd_evict(c, NULL, gpucmd_info(a)->connection_id,
				      &n),
			 0);
	ck_assert_uint_eq(n, 1);
	for (int i = 0; i < 500; i++) {
		if (row_of(c, "infer", sh, 2).nshared == 1 &&
		    sh[0].handles == 1)
			break;
		usleep(10000);
	}
	ck_assert_uint_eq(sh[0].handles, 1);
	ck_assert_int_eq(sh[0].sharer_open, 0);
	ck_assert_int_eq(gpucmd_cleanup(c, NULL, &n), 0);
	{
		/* The holder's own streams' cleanup, in a batch. */
		struct gpucmd_batch *x = batch(b, 2);

		ck_assert_int_eq(gpucmd_batch_memory_cleanup(x), 0);
		gpucmd_response_free(run_ok(x));
	}
	expect_pattern(b, 2, 7, 4 * KIB, 12);
	row = row_of(c, "infer", sh, 2);
	ck_assert_uint_eq(row.shared_buffer_bytes, 16 * KIB);
	ck_assert_uint_eq(row.bytes_in_use, 16 * KIB);
	ck_assert_uint_eq(row.allocations, 1);
	release_ok(b, 7);
	row = settled_row(c, "infer");
	ck_assert_uint_eq(row.bytes_in_use, 0);
	ck_assert_uint_eq(row.bytes_reserved, 0);
	ck_assert_uint_eq(row.allocations, 0);
	gpucmd_close(a);
	gpucmd_close(b);
	gpucmd_close(c);
}
END_TEST

/*
 * The device refuses the shared copy's memory: the share fails with the
 * numbers, the handle stays the connection's own and writable, and the
 * name stays free.
 */
START_TEST(a_share_the_device_refuses_leaves_the_handle_as_it_was)
{
	struct gpucmd_conn *a, *b;
	struct gpucmd_shared_buffer sh[2];
	struct gpucmd_service_report row;
	struct gpucmd_batch *x;
	uint32_t w[16];

	if (!host_backend_only())
		return;
	/* The first allocation is the buffer's page, the second the copy's. */
	daemon_start_args(&the_daemon, "--test-fail-alloc-at", "2", NULL);
	a = connect_as("infer");
	b = connect_as("infer");
	pattern(w, 16, 5);
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 1, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 1, "w"), 0);
	expect_fail(x, 1, GPUCMD_ENOMEM, "cannot share handle 1");
	row = row_of(a, "infer", sh, 2);
	ck_assert_uint_eq(row.shared_buffers, 0);
	ck_assert_uint_eq(row.allocations, 1);
	ck_assert_uint_eq(row.bytes_in_use, sizeof(w));
	/* Counted as the service's refusals are, with its sentence. */
	ck_assert_uint_eq(row.oom_count, 1);
	ck_assert_int_eq(row.last_refusal.code, GPUCMD_ENOMEM);
	ck_assert_uint_eq(row.last_refusal.size, sizeof(w));
	ck_assert_uint_eq(row.last_refusal.connection_id,
			  gpucmd_info(a)->connection_id);
	ck_assert_ptr_nonnull(
		strstr(row.last_refusal.message, "cannot share handle 1"));
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 7, "w"), 0);
	expect_fail(x, 0, GPUCMD_ENOTFOUND, "shares no buffer");
	pattern(w, 16, 6);
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_write(x, 1, 0, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 1, "w"), 0);
	gpucmd_response_free(run_ok(x));
	import_ok(b, 7, "w");
	expect_pattern(b, 0, 7, 16, 6);
	gpucmd_close(a);
	gpucmd_close(b);
}
END_TEST

/*
 * A fault on the sharer's stream before the copy (host backend: on CUDA a
 * fault loses the device).  The share is the batch's wait, so it reports
 * the fault; the name is taken all the same, but the buffer is lost: the
 * bytes may not be what the sharer meant, and an import says so.  Also
 * for a fault of an earlier batch that nobody was told of yet.
 */
START_TEST(a_fault_before_the_copy_is_reported_by_the_share)
{
	struct gpucmd_conn *a, *b;
	struct gpucmd_batch *x;
	struct gpucmd_response *r = NULL;
	uint32_t w[16];
	int e;

	if (!host_backend_only())
		return;
	a = connect_as("infer");
	b = connect_as("infer");
	pattern(w, 16, 9);
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 1, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_kernel(x, "fault", G1, G1, NULL, 0), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 1, "w"), 0);
	expect_fail(x, 2, GPUCMD_ESTREAM, "faulted before this share");
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 1, "again"), 0);
	expect_fail(x, 0, GPUCMD_EINVAL, "shared already, as 'w'");
	/* Reported once: the stream is usable again. */
	expect_pattern(a, 0, 1, 16, 9);
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 7, "w"), 0);
	ck_assert_int_eq(gpucmd_run(x, &r), 0);
	e = gpucmd_response_error(r);
	ck_assert_msg(e == GPUCMD_ESTREAM &&
			      strstr(gpucmd_response_message(r), "was lost"),
		      "import after a fault: %s: %s", gpucmd_errname(e),
		      gpucmd_response_message(r));
	gpucmd_response_free(r);

	/* A fault of an earlier batch, not reported before the share. */
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 2, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_kernel(x, "fault", G1, G1, NULL, 0), 0);
	gpucmd_response_free(run_ok(x));
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 2, "w2"), 0);
	expect_fail(x, 0, GPUCMD_ESTREAM, "faulted before this share");
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 8, "w2"), 0);
	expect_fail(x, 0, GPUCMD_ESTREAM, "was lost");
	/* A share after the fault was reported is a clean one. */
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 3, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 3, "w3"), 0);
	gpucmd_response_free(run_ok(x));
	import_ok(b, 9, "w3");
	expect_pattern(b, 0, 9, 16, 9);
	gpucmd_close(a);
	gpucmd_close(b);
	a = connect_as("infer");
	ck_assert_uint_eq(settled_row(a, "infer").allocations, 0);
	gpucmd_close(a);
}
END_TEST

/*
 * A fault before a read that comes before a share in the same batch: the
 * read reports it (the batch's wait), the share's copy ran after the
 * faulted work, and its buffer is lost -- the sentence must say so, with
 * the name and the handle, since the answer has no result for the share.
 * Two such shares are both named, and a share after the one that reports
 * the fault is named beside it.  When a kernel follows the read, the
 * fault is reported at a fence of its own (a barrier) before the share's
 * copy completes: that share is lost too (the answer did not confirm it,
 * so the sharer cannot know its name is taken), and named.
 */
START_TEST(a_fault_reported_at_a_read_names_the_share_it_lost)
{
	struct gpucmd_conn *a, *b;
	struct gpucmd_batch *x;
	struct gpucmd_response *r = NULL;
	const char *msg;
	uint32_t w[16];

	if (!host_backend_only())
		return;
	a = connect_as("infer");
	b = connect_as("infer");
	pattern(w, 16, 5);
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 1, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 2, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 3, w, sizeof(w)), 0);
	gpucmd_response_free(run_ok(x));

	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_kernel(x, "fault", G1, G1, NULL, 0), 0);
	ck_assert_int_eq(gpucmd_batch_read(x, 3, 0, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 1, "one"), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 2, "two"), 0);
	ck_assert_int_eq(gpucmd_run(x, &r), 0);
	msg = gpucmd_response_message(r);
	ck_assert_msg(gpucmd_response_error(r) == GPUCMD_ESTREAM &&
			      gpucmd_response_failed_index(r) == 1,
		      "%s at %d: %s", gpucmd_errname(gpucmd_response_error(r)),
		      gpucmd_response_failed_index(r), msg);
	ck_assert_msg(strstr(msg, "faulted before this read") != NULL, "%s",
		      msg);
	ck_assert_msg(strstr(msg,
			     "; handle 1, shared as 'one' at op 2, is "
			     "lost: release it and share it again") != NULL,
		      "share 'one' not named: %s", msg);
	ck_assert_msg(strstr(msg, "; handle 2, shared as 'two' at op 3, is "
				  "lost") != NULL,
		      "share 'two' not named: %s", msg);
	gpucmd_response_free(r);
	/*
	 * The report tells a lost buffer from one whose copy is still to
	 * run: "still copying" for good would send an operator waiting.
	 */
	{
		struct gpucmd_shared_buffer sh[8];
		struct gpucmd_service_report row = row_of(a, "infer", sh, 8);
		size_t lost = 0;

		for (size_t i = 0; i < row.nshared; i++) {
			ck_assert_int_eq(sh[i].ready, 0);
			lost += sh[i].lost != 0;
		}
		ck_assert_uint_eq(row.nshared, 2);
		ck_assert_uint_eq(lost, 2);
	}
	/* What the sentence says: both are lost, and their names taken. */
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 7, "one"), 0);
	expect_fail(x, 0, GPUCMD_ESTREAM, "was lost");
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 8, "two"), 0);
	expect_fail(x, 0, GPUCMD_ESTREAM, "was lost");
	/* Released, the name is free for a clean share again. */
	release_ok(a, 1);
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 1, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 1, "one"), 0);
	gpucmd_response_free(run_ok(x));
	import_ok(b, 7, "one");
	expect_pattern(b, 0, 7, 16, 5);
	{
		struct gpucmd_shared_buffer sh[8];
		struct gpucmd_service_report row = row_of(a, "infer", sh, 8);

		for (size_t i = 0; i < row.nshared; i++)
			if (strcmp(sh[i].name, "one") == 0)
				ck_assert_msg(sh[i].ready && !sh[i].lost,
					      "'one' shared clean: ready %d, "
					      "lost %d",
					      sh[i].ready, sh[i].lost);
	}

	/*
	 * A kernel after the read: the fault is reported before the copy,
	 * which then completes clean, and is lost all the same.
	 */
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_kernel(x, "fault", G1, G1, NULL, 0), 0);
	ck_assert_int_eq(gpucmd_batch_read(x, 3, 0, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 3, "three"), 0);
	keep_busy(x, 1);
	ck_assert_int_eq(gpucmd_run(x, &r), 0);
	msg = gpucmd_response_message(r);
	ck_assert_int_eq(gpucmd_response_error(r), GPUCMD_ESTREAM);
	ck_assert_int_eq(gpucmd_response_failed_index(r), 1);
	ck_assert_msg(strstr(msg,
			     "; handle 3, shared as 'three' at op 2, is "
			     "lost: release it and share it again") != NULL,
		      "the share after the barrier: %s", msg);
	gpucmd_response_free(r);
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_sync(x), 0);
	gpucmd_response_free(run_ok(x));
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 9, "three"), 0);
	expect_fail(x, 0, GPUCMD_ESTREAM, "was lost");
	/* As the sentence says: released and shared again, it is clean. */
	release_ok(a, 3);
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 3, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 3, "three"), 0);
	gpucmd_response_free(run_ok(x));
	import_ok(b, 9, "three");
	expect_pattern(b, 0, 9, 16, 5);

	/* Answered at the first share: the second is named too. */
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 10, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 11, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_kernel(x, "fault", G1, G1, NULL, 0), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 10, "p"), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 11, "q"), 0);
	ck_assert_int_eq(gpucmd_run(x, &r), 0);
	msg = gpucmd_response_message(r);
	ck_assert_int_eq(gpucmd_response_error(r), GPUCMD_ESTREAM);
	ck_assert_int_eq(gpucmd_response_failed_index(r), 3);
	ck_assert_msg(strstr(msg, "faulted before this share (the buffer it "
				  "shared is lost") != NULL &&
			      strstr(msg, "; handle 11, shared as 'q' at op 4, "
					  "is lost") != NULL &&
			      strstr(msg, "as 'p'") == NULL,
		      "the second share: %s", msg);
	gpucmd_response_free(r);
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 10, "q"), 0);
	expect_fail(x, 0, GPUCMD_ESTREAM, "was lost");

	/* Six lost, with the longest names: those that fit, and a count. */
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_kernel(x, "fault", G1, G1, NULL, 0), 0);
	ck_assert_int_eq(gpucmd_batch_read(x, 3, 0, sizeof(w)), 0);
	for (int i = 0; i < 6; i++) {
		char name[64];

		memset(name, 'a' + i, 63);
		name[63] = '\0';
		ck_assert_int_eq(gpucmd_batch_create_with_data(x, 20 + i, w,
							       sizeof(w)),
				 0);
		ck_assert_int_eq(gpucmd_batch_share(x, 20 + i, name), 0);
	}
	ck_assert_int_eq(gpucmd_run(x, &r), 0);
	msg = gpucmd_response_message(r);
	ck_assert_int_eq(gpucmd_response_error(r), GPUCMD_ESTREAM);
	ck_assert_msg(strstr(msg, "; handle 20, shared as 'aaa") != NULL &&
			      strstr(msg, "; handle 22, shared as 'ccc") !=
				      NULL &&
			      strstr(msg, "handle 23") == NULL,
		      "the first three shares: %s", msg);
	ck_assert_msg(strstr(msg, "; 3 more buffers this batch shared are "
				  "lost too") != NULL,
		      "no count of the other three: %s", msg);
	gpucmd_response_free(r);
	gpucmd_close(a);
	gpucmd_close(b);
}
END_TEST

/*
 * A handle shared, released and made again under the same id in the batch
 * whose read reports a fault: the first share's buffer went with its
 * release, and the sentence names the second share once, at its own op --
 * not the second buffer's name at the first share's op as well.
 */
START_TEST(a_reused_handle_id_is_named_once_at_its_own_share)
{
	struct gpucmd_conn *a;
	struct gpucmd_batch *x;
	struct gpucmd_response *r = NULL;
	const char *msg, *at;
	uint32_t w[16];

	if (!host_backend_only())
		return;
	a = connect_as("infer");
	pattern(w, 16, 6);
	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 1, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 3, w, sizeof(w)), 0);
	gpucmd_response_free(run_ok(x));

	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_kernel(x, "fault", G1, G1, NULL, 0), 0);
	ck_assert_int_eq(gpucmd_batch_read(x, 3, 0, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 1, "first"), 0);
	ck_assert_int_eq(gpucmd_batch_release(x, 1), 0);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 1, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 1, "second"), 0);
	ck_assert_int_eq(gpucmd_run(x, &r), 0);
	msg = gpucmd_response_message(r);
	ck_assert_int_eq(gpucmd_response_error(r), GPUCMD_ESTREAM);
	ck_assert_int_eq(gpucmd_response_failed_index(r), 1);
	at = strstr(msg, "; handle 1, shared as 'second' at op 5, is lost");
	ck_assert_msg(at != NULL, "the second share not named: %s", msg);
	ck_assert_msg(strstr(msg, "'second' at op 2") == NULL &&
			      strstr(at + 13, "shared as") == NULL &&
			      strstr(msg, "shared as") == at + 12,
		      "the released share named by the new buffer: %s", msg);
	gpucmd_response_free(r);
	gpucmd_close(a);
}
END_TEST

/*
 * The last handle goes on stream 0 while stream 1 of the same connection
 * still has a read of it queued behind 200 ms of spins: the memory stays
 * until that read ran (under ASan or valgrind, a free before it is a use
 * after free on the host backend's stream thread).
 */
START_TEST(the_last_release_waits_for_reads_on_other_streams)
{
	struct gpucmd_conn *a = connect_as("infer");
	struct gpucmd_conn *b = connect_as("infer");
	struct gpucmd_response *r = NULL;
	struct gpucmd_batch *x;
	uint32_t want[1024];
	const void *data;
	size_t len;
	uint64_t id;

	make_shared(a, 1, "w", 1024, 17);
	import_ok(b, 7, "w");
	release_ok(a, 1);
	gpucmd_close(a);
	x = batch(b, 1);
	keep_busy(x, 20);
	ck_assert_int_eq(gpucmd_batch_read(x, 7, 0, sizeof(want)), 0);
	ck_assert_int_eq(gpucmd_submit(x, &id), 0);
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_release(x, 7), 0);
	ck_assert_int_eq(gpucmd_batch_sync(x), 0);
	gpucmd_response_free(run_ok(x));
	ck_assert_int_eq(gpucmd_wait(b, id, &r), 0);
	ck_assert_int_eq(gpucmd_response_error(r), 0);
	ck_assert_int_eq(gpucmd_response_data(r, 20, &data, &len), 0);
	pattern(want, 1024, 17);
	ck_assert_uint_eq(len, sizeof(want));
	ck_assert_int_eq(memcmp(data, want, sizeof(want)), 0);
	gpucmd_response_free(r);
	ck_assert_uint_eq(settled_row(b, "infer").bytes_in_use, 0);
	gpucmd_close(b);
}
END_TEST

/*
 * An admin's observer connection belongs to no service: it may not share
 * or import, and its report shows every service's shared buffers.
 */
START_TEST(an_observer_sees_shared_buffers_and_cannot_import)
{
	struct gpucmd_conn *a = connect_as("infer");
	struct gpucmd_conn *o = NULL;
	struct gpucmd_shared_buffer sh[2];
	struct gpucmd_batch *x;
	char msg[256];

	ck_assert_int_eq(gpucmd_connect_flags(the_daemon.sock, "infer", -1,
					      GPUCMD_CONNECT_OBSERVE, &o, msg,
					      sizeof(msg)),
			 0);
	if (gpucmd_info(o)->service_id != 0) {
		printf("skipped: not an admin, the observer joined a service\n");
		gpucmd_close(o);
		gpucmd_close(a);
		return;
	}
	make_shared(a, 1, "w", 64, 2);
	x = batch(o, 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 7, "w"), 0);
	expect_fail(x, 0, GPUCMD_EPERM, "observer");
	ck_assert_uint_eq(row_of(o, "infer", sh, 2).shared_buffers, 1);
	ck_assert_uint_eq(sh[0].bytes, 256);
	ck_assert_uint_eq(report_totals(o).shared_buffer_bytes, 256);
	gpucmd_close(o);
	gpucmd_close(a);
}
END_TEST

/*
 * Edges: a zero-byte buffer has a name too; a share released in its own
 * batch goes with its name once the copy ran; an import in the batch of
 * its share is too early (still being copied).
 */
START_TEST(a_zero_byte_share_and_a_share_released_at_once)
{
	struct gpucmd_conn *a = connect_as("infer");
	struct gpucmd_conn *b = connect_as("infer");
	struct gpucmd_shared_buffer sh[2];
	struct gpucmd_batch *x;
	uint32_t w[8];

	x = batch(a, 0);
	ck_assert_int_eq(gpucmd_batch_empty(x, 1, 0), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 1, "none"), 0);
	gpucmd_response_free(run_ok(x));
	import_ok(b, 7, "none");
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_read(x, 7, 0, 0), 0);
	gpucmd_response_free(run_ok(x));
	ck_assert_uint_eq(row_of(a, "infer", sh, 2).shared_buffers, 1);
	ck_assert_uint_eq(sh[0].bytes, 0);
	ck_assert_uint_eq(sh[0].handles, 2);
	release_ok(a, 1);
	release_ok(b, 7);

	pattern(w, 8, 3);
	x = batch(a, 1);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 2, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 2, "brief"), 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 3, "brief"), 0);
	expect_fail(x, 2, GPUCMD_EBUSY, "still being copied");
	x = batch(a, 1);
	ck_assert_int_eq(gpucmd_batch_import(x, 3, "brief"), 0);
	ck_assert_int_eq(gpucmd_batch_release(x, 2), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 3, "again"), 0);
	expect_fail(x, 2, GPUCMD_EINVAL, "shared already, as 'brief'");
	release_ok(a, 3);
	ck_assert_uint_eq(settled_row(a, "infer").allocations, 0);
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 8, "brief"), 0);
	expect_fail(x, 0, GPUCMD_ENOTFOUND, "shares no buffer");
	/* Shared and released in one batch: gone, name and all, once answered. */
	x = batch(a, 2);
	ck_assert_int_eq(gpucmd_batch_create_with_data(x, 4, w, sizeof(w)), 0);
	ck_assert_int_eq(gpucmd_batch_share(x, 4, "gone"), 0);
	ck_assert_int_eq(gpucmd_batch_release(x, 4), 0);
	gpucmd_response_free(run_ok(x));
	x = batch(b, 0);
	ck_assert_int_eq(gpucmd_batch_import(x, 8, "gone"), 0);
	expect_fail(x, 0, GPUCMD_ENOTFOUND, "shares no buffer");
	ck_assert_uint_eq(settled_row(a, "infer").allocations, 0);
	gpucmd_close(a);
	gpucmd_close(b);
}
END_TEST

static Suite *shared_suite(void)
{
	Suite *s = suite_create("shared");
	TCase *t = tcase_create("bytes");
	TCase *l = tcase_create("lifetime");
	TCase *n = tcase_create("names");
	TCase *q = tcase_create("quota");

	tcase_add_checked_fixture(t, harness_setup, harness_teardown);
	tcase_set_timeout(t, 60);
	tcase_add_test(t, imported_buffer_holds_the_shared_bytes);
	tcase_add_test(t, shared_buffers_are_read_only_for_every_holder);
	tcase_add_test(t, graphs_replay_reads_of_a_shared_buffer);
	tcase_add_test(t, a_share_is_answered_once_its_copy_ran);
	tcase_add_test(t, a_share_copies_the_last_write_of_another_stream);
	suite_add_tcase(s, t);
	tcase_add_checked_fixture(l, harness_setup, harness_teardown);
	tcase_set_timeout(l, 60);
	tcase_add_test(l, shared_memory_outlives_its_sharer);
	tcase_add_test(l, a_client_that_dies_leaves_its_imports_behind);
	tcase_add_test(l, a_graph_of_an_importer_outlives_the_sharer);
	tcase_add_test(l, the_report_says_whether_the_sharer_is_open);
	tcase_add_test(l, evict_and_cleanup_leave_shared_memory_alone);
	tcase_add_test(l, the_last_release_waits_for_reads_on_other_streams);
	tcase_add_test(l, an_observer_sees_shared_buffers_and_cannot_import);
	tcase_add_test(l, a_fault_before_the_copy_is_reported_by_the_share);
	tcase_add_test(l, a_fault_reported_at_a_read_names_the_share_it_lost);
	tcase_add_test(l, a_reused_handle_id_is_named_once_at_its_own_share);
	suite_add_tcase(s, l);
	tcase_add_checked_fixture(n, harness_setup, harness_teardown);
	tcase_set_timeout(n, 60);
	tcase_add_test(n, names_belong_to_their_service);
	tcase_add_test(n, a_zero_byte_share_and_a_share_released_at_once);
	suite_add_tcase(s, n);
	tcase_add_checked_fixture(q, NULL, harness_teardown);
	tcase_set_timeout(q, 60);
	tcase_add_test(q, a_shared_buffer_counts_once_against_the_quota);
	tcase_add_test(q, every_count_goes_back_to_zero);
	tcase_add_test(q, an_import_counts_against_max_handles);
	tcase_add_test(q,
		       a_share_the_device_refuses_leaves_the_handle_as_it_was);
	suite_add_tcase(s, q);
	return s;
}

int main(void)
{
	return harness_main(shared_suite());
}
