/*
 * reconnect.c - a service that outlives its daemon: reconnect, rebuild,
 * retry.
 *
 * On the CUDA backend a kernel that faults loses the device context for
 * every client, and gpucmdd exits so that systemd restarts it with a fresh
 * one; an upgrade or a crash ends it too.  Every connection then fails with
 * GPUCMD_EDISCONNECTED, and everything it held on the device (buffers,
 * graphs, regions) is gone.  Nothing comes back by itself: a service must
 * connect again, upload its weights again, capture its graphs again, and
 * decide what to do with the requests that were in flight.  This is that
 * loop.
 *
 * The "model" is y = w + ALPHA * x, and the answer to a request is y and
 * the sum of its elements.  The weights go to the device once per
 * connection, and the request's kernels are captured once per connection
 * as a graph; each request is then one batch: write x, replay the graph,
 * read y and the sum.  Every answer is checked against the same arithmetic
 * on the CPU.
 *
 * Requests come on stdin, one number a line (a stand-in for a queue: the
 * number seeds the input), so that you can stop and start the daemon
 * between requests and during them.  Each answer is a line "request N:
 * sum S"; each reconnect prints one line saying why the old connection
 * ended and how long the new one took.  At the end of stdin it prints the
 * "OK" line and exits 0; it says what failed and exits 1 when an answer is
 * wrong, when the daemon refuses something that retrying cannot mend, or
 * when no daemon answered within deadline-ms (10000 by default) of losing
 * the connection.
 *
 *   cc -o reconnect reconnect.c -Iinclude build/libgpucmd.a \
 *	$(pkg-config --libs libprotobuf-c) -lpthread
 *   GPUCMD_SOCKET=/run/gpucmd/gpucmd.sock ./reconnect [deadline-ms]
 *   (then type 1, 2, 3..., and systemctl restart gpucmdd in between)
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gpucmd.h>

#define N 1024
#define BYTES (N * sizeof(float))
#define ALPHA 2.0f
#define GRAPH 1

/* Back off from 50 ms, doubling, to at most 1 s between attempts. */
#define BACKOFF_FIRST_MS 50
#define BACKOFF_MAX_MS 1000
/* Tries per request: see serve_retrying. */
#define TRIES 3

enum { H_W = 1, H_X, H_Y, H_SUM };

static const uint32_t grid[3] = { 4, 1, 1 }, block[3] = { 256, 1, 1 };

struct service {
	struct gpucmd_conn *conn;
	int deadline_ms; /* to get a connection back after losing one */
	unsigned reconnects;
	float w[N];
};

static float input(unsigned req, size_t i)
{
	return (float)((i + req) % 5);
}

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000,
			       .tv_nsec = (ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/*
 * Codes that mean "no daemon to talk to, for now": the connection died
 * (the daemon exited or was killed, or evicted us), nobody listens on the
 * socket (-ECONNREFUSED: a dead daemon's socket file; -ENOENT: no file,
 * between a daemon's exit and its successor's bind), the daemon is
 * stopping (GPUCMD_ESHUTDOWN), or a daemon held by socket activation did
 * not answer our Hello in the time left (-ETIMEDOUT).  Anything else
 * (-EACCES, GPUCMD_EPERM, GPUCMD_EVERSION, a quota) is an answer that
 * waiting will not change.
 */
static int transient(int rc)
{
	switch (rc) {
	case GPUCMD_EDISCONNECTED:
	case GPUCMD_ESHUTDOWN:
	case -ECONNREFUSED:
	case -ECONNRESET:
	case -ENOENT:
	case -EPIPE:
	case -ETIMEDOUT:
		return 1;
	default:
		return 0;
	}
}

/* A failure that retrying cannot mend: say what and why, and stop. */
static void die(struct gpucmd_conn *conn, const char *what, int rc,
		const char *msg)
{
	const char *why = "";

	fprintf(stderr, "reconnect: %s: %s (%s)", what, gpucmd_errname(rc),
		gpucmd_strerror(rc));
	if (msg && *msg)
		fprintf(stderr, ": %s", msg);
	else if (conn && *gpucmd_last_message(conn))
		fprintf(stderr, ": %s", gpucmd_last_message(conn));
	if (conn && gpucmd_conn_error(conn, &why) && *why)
		fprintf(stderr, " [connection closed: %s]", why);
	fputc('\n', stderr);
	exit(1);
}

/*
 * The connection's device state, from nothing: the buffers, the weights,
 * and the request's kernels captured as a graph (y = copy of w; y += a*x;
 * sum = reduce(y)).  One batch, so a connection that dies half way leaves
 * nothing to tidy: the next one starts from nothing again.  0, a call's
 * code, or the code the batch failed with (msg then says why).
 */
static int rebuild(struct service *s, char *msg, size_t msg_len)
{
	struct gpucmd_arg cp[] = { gpucmd_arg_buffer(H_Y),
				   gpucmd_arg_buffer(H_W),
				   gpucmd_arg_u64(BYTES) };
	struct gpucmd_arg ax[] = { gpucmd_arg_buffer(H_Y),
				   gpucmd_arg_buffer(H_X),
				   gpucmd_arg_f32(ALPHA), gpucmd_arg_u32(N) };
	struct gpucmd_arg rs[] = { gpucmd_arg_buffer(H_SUM),
				   gpucmd_arg_buffer(H_Y), gpucmd_arg_u32(N) };
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	int rc;

	if ((rc = gpucmd_batch_new(s->conn, 0, &b)) < 0)
		return rc;
	gpucmd_batch_create_with_data(b, H_W, s->w, sizeof(s->w));
	gpucmd_batch_empty(b, H_X, BYTES);
	gpucmd_batch_empty(b, H_Y, BYTES);
	gpucmd_batch_empty(b, H_SUM, sizeof(float));
	gpucmd_batch_capture_begin(b);
	gpucmd_batch_kernel(b, "copy", grid, block, cp, 3);
	gpucmd_batch_kernel(b, "saxpy_f32", grid, block, ax, 4);
	gpucmd_batch_kernel(b, "reduce_sum_f32", grid, block, rs, 3);
	gpucmd_batch_capture_end(b, GRAPH);
	/* A builder's refusal comes back here, the batch unsent. */
	if ((rc = gpucmd_run(b, &r)) < 0) {
		snprintf(msg, msg_len, "%s", gpucmd_last_message(s->conn));
		return rc;
	}
	rc = gpucmd_response_error(r);
	if (rc != 0)
		snprintf(msg, msg_len, "op %d: %s",
			 gpucmd_response_failed_index(r),
			 gpucmd_response_message(r));
	gpucmd_response_free(r);
	return rc;
}

/*
 * Connect and rebuild, backing off between attempts while the daemon is
 * away, until deadline_ms have passed since start_ms.  Returns the number
 * of attempts; dies on a refusal that waiting will not change, and when
 * the deadline passes.
 */
static unsigned connect_retrying(struct service *s, long start_ms)
{
	long backoff = BACKOFF_FIRST_MS;
	unsigned attempts = 0;
	char msg[256];

	for (;;) {
		long left = s->deadline_ms - (now_ms() - start_ms);
		int rc;

		attempts++;
		msg[0] = '\0';
		/*
		 * Bound the handshake too: under socket activation the
		 * connect succeeds at once, and the Hello waits for the
		 * daemon to start.
		 */
		rc = gpucmd_connect_timeout(NULL, "example-reconnect",
					    left > 1 ? (int)left : 1, &s->conn,
					    msg, sizeof(msg));
		if (rc == 0) {
			/*
			 * The timeout stays the connection's: lift it.  A
			 * daemon that hangs is its watchdog's business
			 * (WatchdogSec=, gpucmdd(8)); the restart that
			 * follows closes this connection, which we handle.
			 */
			gpucmd_set_timeout(s->conn, -1);
			rc = rebuild(s, msg, sizeof(msg));
			if (rc == 0)
				return attempts;
			gpucmd_close(s->conn);
			s->conn = NULL;
		}
		/*
		 * A daemon that lost its device (GPUCMD_ESTREAM) may take a
		 * new connection and refuse its work while it stops.
		 */
		if (!transient(rc) && rc != GPUCMD_ESTREAM)
			die(NULL, "connecting", rc, msg);
		left = s->deadline_ms - (now_ms() - start_ms);
		if (left <= 0) {
			fprintf(stderr,
				"reconnect: no daemon within %d ms (%u "
				"attempts), giving up: %s (%s)%s%s\n",
				s->deadline_ms, attempts, gpucmd_errname(rc),
				gpucmd_strerror(rc), *msg ? ": " : "", msg);
			exit(1);
		}
		sleep_ms(backoff < left ? backoff : left);
		backoff = backoff * 2 < BACKOFF_MAX_MS ? backoff * 2 :
							 BACKOFF_MAX_MS;
	}
}

/*
 * Serve request req on the connection: 0 with the sum in *sum; the code of
 * a call that failed; or the code of a batch that ran and failed, with the
 * daemon's message in msg.  A wrong answer is not retried: it stops here.
 */
static int serve(struct service *s, unsigned req, float *sum, char *msg,
		 size_t msg_len)
{
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	float x[N], y[N];
	const void *data;
	size_t len;
	double want_sum = 0;
	int rc;

	for (size_t i = 0; i < N; i++)
		x[i] = input(req, i);
	if ((rc = gpucmd_batch_new(s->conn, 0, &b)) < 0)
		return rc;
	gpucmd_batch_write(b, H_X, 0, x, sizeof(x));
	gpucmd_batch_graph_launch(b, GRAPH);
	gpucmd_batch_read(b, H_Y, 0, BYTES);
	gpucmd_batch_read(b, H_SUM, 0, sizeof(float));
	if ((rc = gpucmd_run(b, &r)) < 0) {
		snprintf(msg, msg_len, "%s", gpucmd_last_message(s->conn));
		return rc;
	}
	if ((rc = gpucmd_response_error(r)) != 0) {
		snprintf(msg, msg_len, "op %d: %s",
			 gpucmd_response_failed_index(r),
			 gpucmd_response_message(r));
		gpucmd_response_free(r);
		return rc;
	}
	/* The two reads are the batch's ops 2 and 3. */
	if (gpucmd_response_data(r, 2, &data, &len) < 0 || len != BYTES) {
		fprintf(stderr, "reconnect: request %u: no y\n", req);
		exit(1);
	}
	memcpy(y, data, BYTES);
	if (gpucmd_response_data(r, 3, &data, &len) < 0 ||
	    len != sizeof(*sum)) {
		fprintf(stderr, "reconnect: request %u: no sum\n", req);
		exit(1);
	}
	memcpy(sum, data, sizeof(*sum));
	gpucmd_response_free(r);
	for (size_t i = 0; i < N; i++) {
		float want = s->w[i] + ALPHA * x[i];

		if (y[i] != want) {
			fprintf(stderr,
				"reconnect: request %u: y[%zu] is %g, want %g\n",
				req, i, y[i], want);
			exit(1);
		}
		want_sum += want;
	}
	if (*sum != (float)want_sum) {
		fprintf(stderr, "reconnect: request %u: sum is %g, want %g\n",
			req, *sum, want_sum);
		exit(1);
	}
	return 0;
}

/*
 * Serve req until it is answered, reconnecting when the connection is lost.
 *
 * Which requests are safe to retry?  One whose answer came is done: never
 * send it again (a client that pipelines still collects, with gpucmd_wait,
 * the answers that arrived before the connection died, and retries only
 * the requests whose wait fails).  One whose answer never came may or may
 * not have run, and we cannot know which.  It is safe to send again when
 * running it twice is the same as running it once, given the state we
 * rebuild: ours writes its own input, computes from the weights and that
 * input, and leaves nothing behind that a later request reads.  Whatever
 * it did on the old connection went with it (a restarted daemon has a new
 * device context; an evicted connection's memory is freed).  Not safe to
 * retry blindly: a request with effects outside the device (it told its
 * caller, it charged someone: do that only once its answer is in), and a
 * request that builds on device state earlier requests left (a running
 * total, a KV cache): that state is gone, so rebuild it first (replay the
 * requests that made it) or fail the session to its caller.
 *
 * GPUCMD_ESTREAM means work on our stream faulted.  On CUDA the device is
 * then lost for every client and the daemon is about to exit, so it is
 * a lost connection too; but the request that faulted may fault again,
 * and each time it would restart the daemon under every other client.
 * So a request gets TRIES tries, whatever ended them, and then fails (in a
 * real service: to its caller, and the loop goes on; here, the program
 * stops).  The built-in kernels check their bounds, so ours never fault.
 */
static float serve_retrying(struct service *s, unsigned req)
{
	char msg[256];
	float sum;

	for (unsigned try = 1;; try++) {
		const char *why = "";
		long lost_ms;
		unsigned attempts;
		int rc;

		msg[0] = '\0';
		rc = serve(s, req, &sum, msg, sizeof(msg));
		if (rc == 0)
			return sum;
		if (!transient(rc) && rc != GPUCMD_ESTREAM)
			die(s->conn, "serving a request", rc, msg);
		if (try == TRIES) {
			fprintf(stderr,
				"reconnect: request %u: %u tries, the last "
				"one %s: %s; giving up on it\n",
				req, TRIES, gpucmd_errname(rc), msg);
			exit(1);
		}
		/* Why the old connection ended, before it is closed. */
		if (gpucmd_conn_error(s->conn, &why) == 0 || !*why)
			why = *msg ? msg : gpucmd_strerror(rc);
		snprintf(msg, sizeof(msg), "%s", why);
		gpucmd_close(s->conn);
		s->conn = NULL;
		lost_ms = now_ms();
		attempts = connect_retrying(s, lost_ms);
		s->reconnects++;
		printf("reconnect: reconnected after %u attempt%s in %ld ms "
		       "(%s: %s); weights and graph rebuilt, retrying request "
		       "%u\n",
		       attempts, attempts == 1 ? "" : "s", now_ms() - lost_ms,
		       gpucmd_errname(rc), msg, req);
	}
}

int main(int argc, char **argv)
{
	static struct service s;
	unsigned served = 0;
	char line[64];

	s.deadline_ms = argc > 1 ? atoi(argv[1]) : 10000;
	if (s.deadline_ms <= 0) {
		fprintf(stderr, "usage: reconnect [deadline-ms] <requests\n");
		return 1;
	}
	/* Each line as it happens, also into a file or a pipe. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (size_t i = 0; i < N; i++)
		s.w[i] = (float)(i % 7);

	/* The daemon may be (re)starting as we start: wait for it alike. */
	connect_retrying(&s, now_ms());
	printf("connected to %s (%s backend) as service %s\n",
	       gpucmd_info(s.conn)->device_name, gpucmd_info(s.conn)->backend,
	       gpucmd_info(s.conn)->service);

	while (fgets(line, sizeof(line), stdin)) {
		char *end;
		unsigned long req = strtoul(line, &end, 10);

		if (end == line || (*end != '\n' && *end != '\0') ||
		    req > 1000000) {
			fprintf(stderr, "reconnect: not a request: %s", line);
			return 1;
		}
		printf("request %lu: sum %g\n", req,
		       serve_retrying(&s, (unsigned)req));
		served++;
	}
	gpucmd_close(s.conn); /* the daemon frees every handle we held */
	printf("reconnect: %u requests, %u reconnects: OK\n", served,
	       s.reconnects);
	return 0;
}
