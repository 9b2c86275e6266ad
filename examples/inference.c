/*
 * inference.c - the shape of an inference service on gpucmd.
 *
 * The "model" is y = a * x + w + bias, and the answer to a request is y
 * and the sum of its elements.  The weights w and bias go to the device
 * once, at start.  Each request then writes its input x through a shared
 * memory region (no copy through the socket), launches the built-in
 * kernels copy, saxpy_f32, add_f32 and reduce_sum_f32, and reads y back
 * into the region and the sum inline, all in one batch: one round trip.
 * DEPTH batches are kept in flight (pipelining); each owns a slot of the
 * region, and a slot is refilled only once the batch that used it has
 * answered.
 *
 * Every result is checked against the same arithmetic on the CPU (the
 * values are small integers, so float sums are exact).  Prints "OK" and
 * exits 0, else says what failed and exits 1.
 *
 *   cc -o inference inference.c -Iinclude build/libgpucmd.a \
 *	$(pkg-config --libs libprotobuf-c) -lpthread
 *   GPUCMD_SOCKET=/run/gpucmd/gpucmd.sock ./inference [requests]
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gpucmd.h>

#define N 16384 /* elements of x, w and y */
#define BYTES (N * sizeof(float))
#define DEPTH 4 /* batches in flight */
#define ALPHA 2.0f

/* Handles and ids are ours to choose; 0 is never valid. */
enum { H_W = 1, H_BIAS, H_X0 = 100, H_Y0 = 200, H_SUM0 = 300 };
#define REGION 1

static const uint32_t grid[3] = { 64, 1, 1 }, block[3] = { 256, 1, 1 };

/*
 * A call that returns only a code: name it, and the sentence that goes
 * with it (the daemon's, or the library's when it sent nothing: a batch
 * one of whose builders refused an op).
 */
static void die(struct gpucmd_conn *conn, const char *what, int rc)
{
	const char *why = "";

	fprintf(stderr, "inference: %s: %s (%s)", what, gpucmd_errname(rc),
		gpucmd_strerror(rc));
	if (conn && *gpucmd_last_message(conn))
		fprintf(stderr, ": %s", gpucmd_last_message(conn));
	if (conn && gpucmd_conn_error(conn, &why))
		fprintf(stderr, " [connection closed: %s]", why);
	fputc('\n', stderr);
	exit(1);
}

/* A batch that ran but failed names the operation and says why. */
static void check_response(struct gpucmd_response *r, const char *what)
{
	int rc = gpucmd_response_error(r);

	if (rc == 0)
		return;
	fprintf(stderr, "inference: %s: op %d: %s: %s\n", what,
		gpucmd_response_failed_index(r), gpucmd_errname(rc),
		gpucmd_response_message(r));
	exit(1);
}

static float weight(size_t i)
{
	return (float)(i % 7);
}

static float input(unsigned req, size_t i)
{
	return (float)((i + req) % 5);
}

/*
 * Queue one request on slot: x from the region, y = copy of w, y += a*x,
 * y += bias, sum = reduce(y), then y back into the region and the sum
 * inline.  The builders' codes need no checking: a refused builder (a bad
 * argument, a limit) queues nothing, and the batch keeps the refusal, so
 * gpucmd_submit sends nothing and returns it, with gpucmd_last_message
 * naming the op.
 */
static void queue_request(struct gpucmd_batch *b, unsigned slot)
{
	uint64_t x = H_X0 + slot, y = H_Y0 + slot;
	size_t off = (size_t)slot * 2 * BYTES;
	struct gpucmd_arg cp[] = { gpucmd_arg_buffer(y), gpucmd_arg_buffer(H_W),
				   gpucmd_arg_u64(BYTES) };
	struct gpucmd_arg ax[] = { gpucmd_arg_buffer(y), gpucmd_arg_buffer(x),
				   gpucmd_arg_f32(ALPHA), gpucmd_arg_u32(N) };
	struct gpucmd_arg ab[] = { gpucmd_arg_buffer(y), gpucmd_arg_buffer(y),
				   gpucmd_arg_buffer(H_BIAS),
				   gpucmd_arg_u32(N) };
	struct gpucmd_arg rs[] = { gpucmd_arg_buffer(H_SUM0 + slot),
				   gpucmd_arg_buffer(y), gpucmd_arg_u32(N) };

	gpucmd_batch_write_region(b, x, 0, REGION, off, BYTES);
	gpucmd_batch_kernel(b, "copy", grid, block, cp, 3);
	gpucmd_batch_kernel(b, "saxpy_f32", grid, block, ax, 4);
	gpucmd_batch_kernel(b, "add_f32", grid, block, ab, 4);
	gpucmd_batch_kernel(b, "reduce_sum_f32", grid, block, rs, 3);
	gpucmd_batch_read_region(b, y, 0, BYTES, REGION, off + BYTES);
	gpucmd_batch_read(b, H_SUM0 + slot, 0, sizeof(float));
}

/* Check the answer of request req, which used slot. */
static int check_answer(struct gpucmd_response *r, unsigned req,
			const unsigned char *region, unsigned slot)
{
	const float *y =
		(const float *)(region + (size_t)slot * 2 * BYTES + BYTES);
	const void *data;
	size_t len;
	double want_sum = 0;
	float sum;
	int rc;

	for (size_t i = 0; i < N; i++) {
		float want = ALPHA * input(req, i) + weight(i) + 1.0f;

		if (y[i] != want) {
			fprintf(stderr, "request %u: y[%zu] is %g, want %g\n",
				req, i, y[i], want);
			return -1;
		}
		want_sum += want;
	}
	/* The read of the sum is the batch's last operation: result 6. */
	rc = gpucmd_response_data(r, 6, &data, &len);
	if (rc < 0 || len != sizeof(sum)) {
		fprintf(stderr, "request %u: no sum in the response (%s)\n",
			req, gpucmd_errname(rc));
		return -1;
	}
	memcpy(&sum, data, sizeof(sum));
	if (sum != (float)want_sum) {
		fprintf(stderr, "request %u: sum is %g, want %g\n", req, sum,
			want_sum);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	unsigned requests =
		argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 64;
	struct gpucmd_conn *conn;
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	uint64_t ids[DEPTH];
	unsigned sent = 0, done = 0;
	unsigned char *region;
	void *p;
	float *host;
	char msg[256];
	int rc;

	rc = gpucmd_connect(NULL, "example-inference", &conn, msg, sizeof(msg));
	if (rc < 0) {
		fprintf(stderr, "inference: cannot connect: %s: %s\n",
			gpucmd_errname(rc), msg);
		return 1;
	}
	printf("connected to %s (%s backend) as service %s\n",
	       gpucmd_info(conn)->device_name, gpucmd_info(conn)->backend,
	       gpucmd_info(conn)->service);

	/* Weights and bias, once.  A large upload goes through the library's
	 * scratch region; the handle must exist first. */
	host = malloc(BYTES);
	if (!host)
		die(NULL, "malloc", -ENOMEM);
	for (size_t i = 0; i < N; i++)
		host[i] = weight(i);
	if ((rc = gpucmd_batch_new(conn, 0, &b)) < 0)
		die(conn, "batch_new", rc);
	/* A builder's refusal is gpucmd_run's code: one check serves all. */
	gpucmd_batch_empty(b, H_W, BYTES);
	gpucmd_batch_empty(b, H_BIAS, BYTES);
	gpucmd_batch_kernel(b, "fill_u32", grid, block,
			    (struct gpucmd_arg[]){ gpucmd_arg_buffer(H_BIAS),
						   gpucmd_arg_u32(0x3f800000),
						   gpucmd_arg_u32(N) },
			    3);
	for (unsigned s = 0; s < DEPTH; s++) {
		gpucmd_batch_empty(b, H_X0 + s, BYTES);
		gpucmd_batch_empty(b, H_Y0 + s, BYTES);
		gpucmd_batch_empty(b, H_SUM0 + s, sizeof(float));
	}
	if ((rc = gpucmd_run(b, &r)) < 0)
		die(conn, "setup", rc);
	check_response(r, "setup");
	gpucmd_response_free(r);
	if ((rc = gpucmd_write_buffer(conn, 0, H_W, 0, host, BYTES)) < 0)
		die(conn, "uploading the weights", rc);
	free(host);

	/* Per slot: BYTES of input, then BYTES of output. */
	if ((rc = gpucmd_region_create(conn, REGION, DEPTH * 2 * BYTES, &p)) <
	    0)
		die(conn, "region_create", rc);
	region = p;

	while (done < requests) {
		/* Fill the pipeline: request sent uses slot sent % DEPTH. */
		while (sent < requests && sent - done < DEPTH) {
			unsigned slot = sent % DEPTH;
			float *x = (float *)(region + (size_t)slot * 2 * BYTES);

			for (size_t i = 0; i < N; i++)
				x[i] = input(sent, i);
			if ((rc = gpucmd_batch_new(conn, 0, &b)) < 0)
				die(conn, "batch_new", rc);
			queue_request(b, slot);
			/*
			 * submit consumes the batch, even when it fails; a
			 * builder's refusal fails it before anything is sent
			 */
			if ((rc = gpucmd_submit(b, &ids[slot])) < 0)
				die(conn, "submit", rc);
			sent++;
		}
		/* Collect the oldest; its slot is then free to refill. */
		unsigned slot = done % DEPTH;

		if ((rc = gpucmd_wait(conn, ids[slot], &r)) < 0)
			die(conn, "wait", rc);
		check_response(r, "request");
		rc = check_answer(r, done, region, slot);
		gpucmd_response_free(r);
		if (rc < 0)
			return 1;
		done++;
	}

	if ((rc = gpucmd_region_release(conn, REGION)) < 0)
		die(conn, "region_release", rc);
	gpucmd_close(conn); /* the daemon frees every handle we held */
	printf("inference: %u requests, %d in flight: OK\n", requests, DEPTH);
	return 0;
}
