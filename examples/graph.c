/*
 * graph.c - capture a request's work once as a graph, replay it per
 * request, and handle the errors the daemon answers with.
 *
 * As with CUDA graphs, everything the graph uses is allocated before the
 * capture (allocation is refused while a stream records).  Unlike a CUDA
 * graph's memcpy node, a write recorded into a graph keeps its bytes as
 * they were at capture time, even a write from a shared region: replays
 * write those same bytes.  So the graph holds only the kernels, and each
 * request is one batch: write the input from a shared region, replay the
 * graph, read the result.
 *
 * The second half provokes three refusals a service meets in practice
 * and prints what the library and the daemon say about them: an unknown
 * graph, a buffer released while a graph uses it, and a launch past the
 * end of a buffer.  Each leaves the connection usable, which
 * gpucmd_conn_error() confirms.  Prints "OK" and exits 0, else says what
 * failed and exits 1.
 *
 *   cc -o graph graph.c -Iinclude build/libgpucmd.a \
 *	$(pkg-config --libs libprotobuf-c) -lpthread
 *   GPUCMD_SOCKET=/run/gpucmd/gpucmd.sock ./graph [requests]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gpucmd.h>

#define N 1024
#define BYTES (N * sizeof(float))

enum { H_X = 1, H_W, H_Y, H_SUM };
#define GRAPH 7
#define REGION 1

static const uint32_t grid[3] = { 4, 1, 1 }, block[3] = { 256, 1, 1 };

static void die(struct gpucmd_conn *conn, const char *what, int rc)
{
	const char *why = "";

	fprintf(stderr, "graph: %s: %s (%s)", what, gpucmd_errname(rc),
		gpucmd_strerror(rc));
	if (*gpucmd_last_message(conn))
		fprintf(stderr, ": %s", gpucmd_last_message(conn));
	if (gpucmd_conn_error(conn, &why))
		fprintf(stderr, " [connection closed: %s]", why);
	fputc('\n', stderr);
	exit(1);
}

/*
 * Run a batch that must succeed; the response is the caller's.  The
 * builders that made b need no checks of their own: one that refused its
 * op made the batch keep the refusal, and gpucmd_run then sends nothing and
 * returns it, with gpucmd_last_message naming the op (die prints it).
 */
static struct gpucmd_response *run(struct gpucmd_conn *conn,
				   struct gpucmd_batch *b, const char *what)
{
	struct gpucmd_response *r;
	int rc;

	if ((rc = gpucmd_run(b, &r)) < 0)
		die(conn, what, rc);
	if ((rc = gpucmd_response_error(r)) != 0) {
		fprintf(stderr, "graph: %s: op %d: %s: %s\n", what,
			gpucmd_response_failed_index(r), gpucmd_errname(rc),
			gpucmd_response_message(r));
		exit(1);
	}
	return r;
}

/*
 * Run a batch that must fail with code want at operation index; print
 * the daemon's message, and check that the connection lives on.
 */
static void expect_refusal(struct gpucmd_conn *conn, struct gpucmd_batch *b,
			   int want, int index, const char *what)
{
	struct gpucmd_response *r;
	int rc;

	if ((rc = gpucmd_run(b, &r)) < 0)
		die(conn, what, rc);
	rc = gpucmd_response_error(r);
	if (rc != want || gpucmd_response_failed_index(r) != index) {
		fprintf(stderr,
			"graph: %s: got %s at op %d, want %s at op %d\n", what,
			gpucmd_errname(rc), gpucmd_response_failed_index(r),
			gpucmd_errname(want), index);
		exit(1);
	}
	printf("expected refusal, %s: op %d: %s: %s\n", what, index,
	       gpucmd_errname(rc), gpucmd_response_message(r));
	gpucmd_response_free(r);
	if ((rc = gpucmd_conn_error(conn, NULL)) != 0)
		die(conn, "the connection died after a refusal", rc);
}

static struct gpucmd_batch *batch(struct gpucmd_conn *conn)
{
	struct gpucmd_batch *b;
	int rc;

	if ((rc = gpucmd_batch_new(conn, 0, &b)) < 0)
		die(conn, "batch_new", rc);
	return b;
}

int main(int argc, char **argv)
{
	unsigned requests =
		argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 32;
	struct gpucmd_arg scale[] = { gpucmd_arg_buffer(H_X),
				      gpucmd_arg_f32(0.5f), gpucmd_arg_u32(N) };
	struct gpucmd_arg add[] = { gpucmd_arg_buffer(H_Y),
				    gpucmd_arg_buffer(H_X),
				    gpucmd_arg_buffer(H_W), gpucmd_arg_u32(N) };
	struct gpucmd_arg sum[] = { gpucmd_arg_buffer(H_SUM),
				    gpucmd_arg_buffer(H_Y), gpucmd_arg_u32(N) };
	struct gpucmd_arg past_end[] = { gpucmd_arg_buffer(H_Y),
					 gpucmd_arg_buffer(H_X),
					 gpucmd_arg_buffer(H_W),
					 gpucmd_arg_u32(N + 1) };
	struct gpucmd_conn *conn;
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	float *in, w[N];
	void *p;
	char msg[256];
	int rc;

	rc = gpucmd_connect(NULL, "example-graph", &conn, msg, sizeof(msg));
	if (rc < 0) {
		fprintf(stderr, "graph: cannot connect: %s: %s\n",
			gpucmd_errname(rc), msg);
		return 1;
	}
	if ((rc = gpucmd_region_create(conn, REGION, BYTES, &p)) < 0)
		die(conn, "region_create", rc);
	in = p;

	/* Allocate everything first, then record: x = region; x *= 0.5;
	 * y = x + w; sum = reduce(y). */
	for (size_t i = 0; i < N; i++)
		w[i] = (float)(i % 3);
	b = batch(conn);
	gpucmd_batch_empty(b, H_X, BYTES);
	gpucmd_batch_create_with_data(b, H_W, w, sizeof(w));
	gpucmd_batch_empty(b, H_Y, BYTES);
	gpucmd_batch_empty(b, H_SUM, sizeof(float));
	gpucmd_batch_capture_begin(b);
	gpucmd_batch_kernel(b, "scale_f32", grid, block, scale, 3);
	gpucmd_batch_kernel(b, "add_f32", grid, block, add, 4);
	gpucmd_batch_kernel(b, "reduce_sum_f32", grid, block, sum, 3);
	gpucmd_batch_capture_end(b, GRAPH);
	gpucmd_response_free(run(conn, b, "capture"));

	for (unsigned req = 0; req < requests; req++) {
		const void *data;
		size_t len;
		double want_sum = 0;
		float s;

		for (size_t i = 0; i < N; i++)
			in[i] = (float)(2 * ((i + req) % 11));
		b = batch(conn);
		gpucmd_batch_write_region(b, H_X, 0, REGION, 0, BYTES);
		gpucmd_batch_graph_launch(b, GRAPH);
		gpucmd_batch_read(b, H_Y, 0, BYTES);
		gpucmd_batch_read(b, H_SUM, 0, sizeof(float));
		r = run(conn, b, "replay");
		if (gpucmd_response_data(r, 2, &data, &len) < 0 ||
		    len != BYTES) {
			fprintf(stderr, "graph: request %u: no y\n", req);
			return 1;
		}
		for (size_t i = 0; i < N; i++) {
			float y, want = in[i] * 0.5f + w[i];

			memcpy(&y, (const char *)data + i * sizeof(y),
			       sizeof(y));
			if (y != want) {
				fprintf(stderr,
					"graph: request %u: y[%zu] is %g, want %g\n",
					req, i, y, want);
				return 1;
			}
			want_sum += want;
		}
		if (gpucmd_response_data(r, 3, &data, &len) < 0 ||
		    len != sizeof(s)) {
			fprintf(stderr, "graph: request %u: no sum\n", req);
			return 1;
		}
		memcpy(&s, data, sizeof(s));
		if (s != (float)want_sum) {
			fprintf(stderr, "graph: request %u: sum %g, want %g\n",
				req, s, want_sum);
			return 1;
		}
		gpucmd_response_free(r);
	}
	printf("graph: %u replays checked\n", requests);

	/* Refusals: each names the operation and says why. */
	b = batch(conn);
	gpucmd_batch_graph_launch(b, GRAPH + 1);
	expect_refusal(conn, b, GPUCMD_ENOTFOUND, 0, "an unknown graph");

	b = batch(conn);
	gpucmd_batch_sync(b);
	gpucmd_batch_release(b, H_W);
	expect_refusal(conn, b, GPUCMD_EBUSY, 1, "releasing what a graph uses");

	b = batch(conn);
	gpucmd_batch_kernel(b, "add_f32", grid, block, past_end, 4);
	expect_refusal(conn, b, GPUCMD_EINVAL, 0,
		       "a launch past a buffer's end");

	/* Once the graph is gone its buffers may go too. */
	b = batch(conn);
	gpucmd_batch_graph_destroy(b, GRAPH);
	gpucmd_batch_release(b, H_X);
	gpucmd_batch_release(b, H_W);
	gpucmd_batch_release(b, H_Y);
	gpucmd_batch_release(b, H_SUM);
	gpucmd_response_free(run(conn, b, "teardown"));
	if ((rc = gpucmd_region_release(conn, REGION)) < 0)
		die(conn, "region_release", rc);
	gpucmd_close(conn);
	printf("graph: OK\n");
	return 0;
}
