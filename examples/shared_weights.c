/*
 * shared_weights.c - worker processes of one service over one copy of
 * the weights.
 *
 * A service that forks workers (a pre-fork server, one process per
 * request queue) gives each its own connection: a connection does not
 * cross fork(), and its handles mean nothing on any other.  Without
 * sharing, every worker uploads the weights for itself and the device
 * holds N copies of them.  Here the parent uploads them once and shares
 * them under a name (gpucmd_batch_share); each worker, on a connection of
 * its own to the same service, imports that name (gpucmd_batch_import) and
 * so names the very same device memory.  One copy, counted once against
 * the service's memory_limit, however many workers.
 *
 * The rules this shows:
 *   - A shared buffer is read-only, for every holder, the sharer included:
 *     connections order only their own streams, so a write on one could
 *     not be ordered before another's reads.  Kernels take it as
 *     gpucmd_arg_buffer_in; a write (or a kernel's output) is refused with
 *     GPUCMD_EINVAL.  The parent provokes that refusal once and prints it.
 *   - Sharing copies the buffer once, on the device, into memory of the
 *     service's own.  Import only after the share was answered (a name
 *     whose copy has not run is GPUCMD_EBUSY); the sync in the share's
 *     batch makes that answer wait for the copy.
 *   - The memory belongs to nobody in particular: it goes once every
 *     handle naming it, on every connection, is released (or its
 *     connection closed) and the work queued with it has run.  The parent
 *     releases its own handle while the workers still compute, and the
 *     memory report shows the weights gone only after the last worker.
 *
 * Each worker computes y = w + k * x for its own x and k, and its sum,
 * and checks every element (small integers: float sums are exact).  Each
 * prints one line, the parent one at the end; exits 0, else says what
 * failed and exits 1.
 *
 *   cc -o shared_weights shared_weights.c -Iinclude build/libgpucmd.a \
 *	$(pkg-config --libs libprotobuf-c) -lpthread
 *   GPUCMD_SOCKET=/run/gpucmd/gpucmd.sock ./shared_weights [workers]
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <gpucmd.h>

#define SERVICE "example-shared"
#define NAME "example/weights" /* letters, digits and . _ - / : */
#define N 16384		       /* elements of w, x and y */
#define BYTES (N * sizeof(float))
#define MAX_WORKERS 16

/*
 * Handles are per connection: the parent's weights and a worker's import
 * may both be handle 1, and are the same memory only through the name.
 */
enum { H_W = 1, H_X, H_Y, H_SUM };

static const uint32_t grid[3] = { 64, 1, 1 }, block[3] = { 256, 1, 1 };
static const char *who = "shared_weights";

/* A call that returns only a code: what failed, and the sentence. */
static int fail(struct gpucmd_conn *conn, const char *what, int rc)
{
	const char *why = "";

	fprintf(stderr, "%s: %s: %s (%s)", who, what, gpucmd_errname(rc),
		gpucmd_strerror(rc));
	if (conn != NULL && *gpucmd_last_message(conn))
		fprintf(stderr, ": %s", gpucmd_last_message(conn));
	if (conn != NULL && gpucmd_conn_error(conn, &why))
		fprintf(stderr, " [connection closed: %s]", why);
	fputc('\n', stderr);
	return -1;
}

/* A batch that ran and failed: which op, and why. */
static int fail_response(struct gpucmd_response *r, const char *what)
{
	int rc = gpucmd_response_error(r);

	if (rc == 0)
		return 0;
	fprintf(stderr, "%s: %s: op %d: %s: %s\n", who, what,
		gpucmd_response_failed_index(r), gpucmd_errname(rc),
		gpucmd_response_message(r));
	return -1;
}

/* Run b and check its response; *out (when not NULL) keeps it. */
static int run(struct gpucmd_conn *conn, struct gpucmd_batch *b,
	       const char *what, struct gpucmd_response **out)
{
	struct gpucmd_response *r;
	int rc = gpucmd_run(b, &r);

	if (rc < 0)
		return fail(conn, what, rc);
	rc = fail_response(r, what);
	if (rc == 0 && out != NULL)
		*out = r;
	else
		gpucmd_response_free(r);
	return rc;
}

static float weight(size_t i)
{
	return (float)(i % 7);
}

static float input(unsigned worker, size_t i)
{
	return (float)((i + worker) % 5);
}

/* ---- the workers ---------------------------------------------------------- */

/*
 * One worker: its own connection, the weights imported, y = w + k * x.
 * ready gets one byte once the import was answered; the worker then
 * waits for go to close (the parent has released its handle by then).
 */
static int worker(unsigned index, int ready, int go)
{
	float k = (float)(index + 1);
	struct gpucmd_arg cp[] = { gpucmd_arg_buffer(H_Y),
				   gpucmd_arg_buffer_in(H_W),
				   gpucmd_arg_u64(BYTES) };
	struct gpucmd_arg ax[] = { gpucmd_arg_buffer(H_Y),
				   gpucmd_arg_buffer(H_X), gpucmd_arg_f32(k),
				   gpucmd_arg_u32(N) };
	struct gpucmd_arg rs[] = { gpucmd_arg_buffer(H_SUM),
				   gpucmd_arg_buffer(H_Y), gpucmd_arg_u32(N) };
	struct gpucmd_conn *conn;
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	const void *data;
	double want_sum = 0;
	float *x, sum;
	size_t len;
	char msg[256], c;
	int rc;

	rc = gpucmd_connect(NULL, SERVICE, &conn, msg, sizeof(msg));
	if (rc < 0) {
		fprintf(stderr, "%s: connect: %s: %s\n", who,
			gpucmd_errname(rc), msg);
		return -1;
	}
	/*
	 * The import names the parent's weights with handle H_W of this
	 * connection; the worker's input and outputs are its own buffers.
	 */
	x = malloc(BYTES);
	if (x == NULL)
		rc = fail(NULL, "malloc", -ENOMEM);
	else if ((rc = gpucmd_batch_new(conn, 0, &b)) < 0)
		rc = fail(conn, "batch_new", rc);
	if (rc == 0) {
		for (size_t i = 0; i < N; i++)
			x[i] = input(index, i);
		gpucmd_batch_import(b, H_W, NAME);
		gpucmd_batch_create_with_data(b, H_X, x, BYTES);
		gpucmd_batch_empty(b, H_Y, BYTES);
		gpucmd_batch_empty(b, H_SUM, sizeof(float));
		rc = run(conn, b, "import", NULL);
	}
	/*
	 * One byte for the parent either way ('i': imported), and our end of
	 * ready closed: a worker that fails or dies never leaves the parent
	 * waiting.
	 */
	if (write(ready, rc == 0 ? "i" : "x", 1) != 1 && rc == 0)
		rc = fail(NULL, "write to the parent", -errno);
	close(ready);
	/* The end of go: the parent released its handle of the weights. */
	while (rc == 0 && read(go, &c, 1) < 0 && errno == EINTR)
		;
	if (rc < 0)
		goto out;

	/*
	 * y = w, y += k * x, sum = reduce(y), all on this connection's
	 * stream.  copy only reads its source: the shared w goes as
	 * buffer_in.  (Built-in kernels take any input either way; a module
	 * kernel's plain buffer argument counts as a write, and is refused
	 * for a shared buffer.)
	 */
	if ((rc = gpucmd_batch_new(conn, 0, &b)) < 0) {
		rc = fail(conn, "batch_new", rc);
		goto out;
	}
	gpucmd_batch_kernel(b, "copy", grid, block, cp, 3);
	gpucmd_batch_kernel(b, "saxpy_f32", grid, block, ax, 4);
	gpucmd_batch_kernel(b, "reduce_sum_f32", grid, block, rs, 3);
	gpucmd_batch_read(b, H_Y, 0, BYTES);
	gpucmd_batch_read(b, H_SUM, 0, sizeof(float));
	if ((rc = run(conn, b, "compute", &r)) < 0)
		goto out;
	rc = gpucmd_response_data(r, 3, &data, &len);
	if (rc == 0 && len != BYTES)
		rc = -1;
	for (size_t i = 0; rc == 0 && i < N; i++) {
		float y, want = weight(i) + k * x[i];

		memcpy(&y, (const char *)data + i * sizeof(y), sizeof(y));
		if (y != want) {
			fprintf(stderr, "%s: y[%zu] is %g, want %g\n", who, i,
				y, want);
			rc = -1;
		}
		want_sum += want;
	}
	if (rc == 0 && gpucmd_response_data(r, 4, &data, &len) == 0 &&
	    len == sizeof(sum)) {
		memcpy(&sum, data, sizeof(sum));
		if (sum != (float)want_sum) {
			fprintf(stderr, "%s: sum is %g, want %g\n", who, sum,
				want_sum);
			rc = -1;
		}
	} else if (rc == 0) {
		fprintf(stderr, "%s: no data in the response\n", who);
		rc = -1;
	}
	gpucmd_response_free(r);
	if (rc == 0)
		printf("worker %u: y = w + %g * x, sum %.0f: OK\n", index,
		       (double)k, (double)sum);
out:
	free(x);
	/* Its import goes with the connection, once its work has run. */
	gpucmd_close(conn);
	return rc;
}

/* ---- the parent ----------------------------------------------------------- */

/*
 * The service's row of the memory report, its shared list included; NULL
 * (and *rep freed) when the report fails or lists no such service.
 */
static const struct gpucmd_service_report *
service_row(struct gpucmd_conn *conn, struct gpucmd_report **rep)
{
	int rc = gpucmd_memory_report(conn, rep);

	if (rc < 0) {
		fail(conn, "memory_report", rc);
		return NULL;
	}
	for (size_t i = 0; i < (*rep)->nservices; i++)
		if (strcmp((*rep)->services[i].name, SERVICE) == 0)
			return &(*rep)->services[i];
	fprintf(stderr, "%s: the memory report has no service %s\n", who,
		SERVICE);
	gpucmd_report_free(*rep);
	return NULL;
}

/* Upload the weights once and share them; -1 on failure (said why). */
static int share_weights(struct gpucmd_conn *conn)
{
	struct gpucmd_batch *b;
	float *w = malloc(BYTES);
	int rc;

	if (w == NULL)
		return fail(NULL, "malloc", -ENOMEM);
	for (size_t i = 0; i < N; i++)
		w[i] = weight(i);
	/* Any size: a large buffer goes through the library's region. */
	rc = gpucmd_create_buffer(conn, 0, H_W, w, BYTES);
	free(w);
	if (rc < 0)
		return fail(conn, "uploading the weights", rc);
	/*
	 * One device copy into memory of the service's own, on this stream.
	 * From now on H_W names that memory and is read-only.  The sync
	 * answers once the copy has run, so the workers forked after this
	 * find the name ready.
	 */
	if ((rc = gpucmd_batch_new(conn, 0, &b)) < 0)
		return fail(conn, "batch_new", rc);
	gpucmd_batch_share(b, H_W, NAME);
	gpucmd_batch_sync(b);
	return run(conn, b, "share", NULL);
}

/* Write into the shared weights: refused, for the sharer too. */
static int show_read_only(struct gpucmd_conn *conn)
{
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	float one = 1;
	int rc;

	if ((rc = gpucmd_batch_new(conn, 0, &b)) < 0)
		return fail(conn, "batch_new", rc);
	gpucmd_batch_write(b, H_W, 0, &one, sizeof(one));
	if ((rc = gpucmd_run(b, &r)) < 0)
		return fail(conn, "write", rc);
	rc = gpucmd_response_error(r);
	if (rc == GPUCMD_EINVAL)
		printf("expected refusal, writing shared weights: op %d: %s: "
		       "%s\n",
		       gpucmd_response_failed_index(r), gpucmd_errname(rc),
		       gpucmd_response_message(r));
	else
		fprintf(stderr, "%s: a write into shared weights gave %s\n",
			who, gpucmd_errname(rc));
	gpucmd_response_free(r);
	return rc == GPUCMD_EINVAL ? 0 : -1;
}

/* Imports counted, the parent's handle released; -1 on failure. */
static int release_ours(struct gpucmd_conn *conn, unsigned nworkers)
{
	const struct gpucmd_service_report *s;
	struct gpucmd_report *rep;
	struct gpucmd_batch *b;
	int rc = -1;

	/* One buffer, one copy of its bytes, a handle per holder. */
	s = service_row(conn, &rep);
	if (s == NULL)
		return -1;
	if (s->nshared == 1 && strcmp(s->shared[0].name, NAME) == 0 &&
	    s->shared[0].bytes == BYTES &&
	    s->shared[0].handles == nworkers + 1 &&
	    s->shared[0].imports == nworkers && s->shared[0].ready) {
		printf("shared: '%s', %llu bytes once, %u handles, %llu "
		       "imports\n",
		       s->shared[0].name,
		       (unsigned long long)s->shared[0].bytes,
		       s->shared[0].handles,
		       (unsigned long long)s->shared[0].imports);
		fflush(stdout);
		rc = 0;
	} else {
		fprintf(stderr,
			"%s: the report lists %zu shared buffers, "
			"not '%s' with %u handles\n",
			who, s->nshared, NAME, nworkers + 1);
	}
	gpucmd_report_free(rep);
	if (rc < 0)
		return rc;
	/* The workers hold it now: the sharer may let go. */
	if ((rc = gpucmd_batch_new(conn, 0, &b)) < 0)
		return fail(conn, "batch_new", rc);
	gpucmd_batch_release(b, H_W);
	return run(conn, b, "release", NULL);
}

/* Once the workers' connections are gone, so are the weights (<= 5 s). */
static int await_gone(struct gpucmd_conn *conn)
{
	const struct timespec tick = { 0, 50 * 1000 * 1000 };

	for (int i = 0; i < 100; i++) {
		const struct gpucmd_service_report *s;
		struct gpucmd_report *rep;
		uint32_t n;

		s = service_row(conn, &rep);
		if (s == NULL)
			return -1;
		n = s->shared_buffers;
		gpucmd_report_free(rep);
		if (n == 0)
			return 0;
		nanosleep(&tick, NULL);
	}
	fprintf(stderr, "%s: the weights outlived every handle\n", who);
	return -1;
}

int main(int argc, char **argv)
{
	unsigned nworkers = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 4;
	unsigned started = 0, imported, ok = 0;
	struct gpucmd_conn *conn;
	int ready[2], go[2];
	char msg[256], c;
	int rc;

	if (nworkers < 1 || nworkers > MAX_WORKERS) {
		fprintf(stderr, "%s: 1 to %d workers\n", who, MAX_WORKERS);
		return 1;
	}
	rc = gpucmd_connect(NULL, SERVICE, &conn, msg, sizeof(msg));
	if (rc < 0) {
		fprintf(stderr, "%s: cannot connect: %s: %s\n", who,
			gpucmd_errname(rc), msg);
		return 1;
	}
	if (share_weights(conn) < 0 || show_read_only(conn) < 0) {
		gpucmd_close(conn);
		return 1;
	}
	if (pipe(ready) != 0 || pipe(go) != 0) {
		perror("shared_weights: pipe");
		gpucmd_close(conn);
		return 1;
	}

	/* Nothing buffered may reach the children: they would print it too. */
	fflush(stdout);
	for (; started < nworkers; started++) {
		pid_t pid = fork();

		if (pid < 0) {
			perror("shared_weights: fork");
			break;
		}
		if (pid == 0) {
			/*
			 * The parent's connection is no use here (the library
			 * refuses it in a child): closing it frees this copy
			 * and leaves the parent's working.
			 */
			gpucmd_close(conn);
			close(ready[0]);
			close(go[1]);
			rc = worker(started, ready[1], go[0]);
			fflush(stdout);
			_exit(rc < 0);
		}
	}
	close(ready[1]);
	close(go[0]);
	/*
	 * Every worker says whether it imported; a read of 0 bytes means
	 * every worker has closed its end (one died before it could say).
	 */
	imported = 0;
	for (unsigned i = 0; i < started; i++)
		if (read(ready[0], &c, 1) == 1 && c == 'i')
			imported++;
	close(ready[0]);
	rc = imported == nworkers ? release_ours(conn, nworkers) : -1;
	close(go[1]); /* the workers compute on */
	for (unsigned i = 0; i < started; i++) {
		int status;

		if (wait(&status) > 0 && WIFEXITED(status) &&
		    WEXITSTATUS(status) == 0)
			ok++;
	}
	if (rc == 0 && ok == nworkers)
		rc = await_gone(conn);
	gpucmd_close(conn);
	if (rc < 0 || ok != nworkers) {
		fprintf(stderr, "%s: %u of %u workers succeeded\n", who, ok,
			nworkers);
		return 1;
	}
	printf("shared_weights: %u workers, one copy of %zu bytes of weights: "
	       "OK\n",
	       nworkers, BYTES);
	return 0;
}
