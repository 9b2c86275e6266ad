/*
 * bench_memory.c - the memory of the daemon itself: its resident set when
 * idle, and what each connection adds (after the handshake alone, and once
 * the connection has run a sync, which gives it a stream and that stream's
 * pools; on the host backend a stream is also a worker thread).
 *
 * Read from /proc/PID/status (VmRSS) of the daemon, whose pid comes from the
 * socket's peer credentials, so this works with --socket too.  It runs first
 * so that "idle" means a daemon no scenario has touched yet.  There is no
 * floor and no target: these rows are for watching, release to release.
 */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Let the daemon finish what it was doing before /proc is read. */
static uint64_t settled_rss(pid_t pid)
{
	usleep(100000);
	return bench_rss(pid);
}

/* Wait until the daemon has torn down all connections but ours. */
static void wait_connections(struct gpucmd_conn *c, uint32_t want)
{
	for (int i = 0; i < 200; i++) {
		struct gpucmd_status st;

		if (gpucmd_status(c, &st) != 0 || st.connections <= want)
			return;
		usleep(10000);
	}
}

void bench_daemon_memory(void)
{
	const size_t n = bench.quick ? 32 : 64;
	struct gpucmd_conn **conns, *watch;
	pid_t pid = bench.daemon_pid;
	uint64_t idle, hello, stream, after;
	size_t opened = 0, streams = 0;

	if (pid <= 0 || bench_rss(pid) == 0) {
		bench_note("daemon memory: cannot read the daemon's /proc "
			   "entry (pid unknown or not ours); rows left out");
		return;
	}
	conns = calloc(n, sizeof(*conns));
	if (conns == NULL) {
		bench_error("daemon memory: out of memory");
		return;
	}
	idle = settled_rss(pid);

	bench_progress("memory: %zu connections (handshake)", n);
	for (; opened < n; opened++) {
		conns[opened] = bench_connect("bench-memory");
		if (conns[opened] == NULL)
			break;
	}
	hello = settled_rss(pid);

	bench_progress("memory: %zu connections with a stream", n);
	/*
	 * A sync, not a ping: a ping runs on no stream (the loop answers
	 * it), so it would measure the handshake again.  A sync needs the
	 * connection's stream 0, which it creates.
	 */
	for (size_t i = 0; i < opened; i++) {
		struct gpucmd_batch *b;

		if (gpucmd_batch_new(conns[i], 0, &b) != 0)
			break;
		if (gpucmd_batch_sync(b) != 0) {
			gpucmd_batch_free(b);
			break;
		}
		if (bench_run_ok(b, "daemon memory: sync") != 0)
			break;
		streams++;
	}
	stream = settled_rss(pid);

	for (size_t i = 0; i < opened; i++)
		gpucmd_close(conns[i]);
	free(conns);
	watch = bench_connect("bench-memory");
	if (watch != NULL) {
		wait_connections(watch, 1);
		gpucmd_close(watch);
	}
	after = settled_rss(pid);
	/* Divided by n below: a row over fewer would say too much. */
	if (opened < n || streams < n)
		return;

	bench_add("daemon RSS idle", (double)idle / (double)MIB, "MiB", NAN,
		  NAN, TARGET_NONE, 0);
	bench_add("daemon RSS per connection (hello)",
		  ((double)hello - (double)idle) / (double)n / (double)KIB,
		  "KiB", NAN, NAN, TARGET_NONE, 0);
	bench_add("daemon RSS per connection (1 stream)",
		  ((double)stream - (double)idle) / (double)n / (double)KIB,
		  "KiB", NAN, NAN, TARGET_NONE, 0);
	/* What stays after every client left, against idle. */
	bench_add("daemon RSS after clients left", (double)after / (double)MIB,
		  "MiB", (double)idle / (double)MIB,
		  (double)after / (double)idle, TARGET_NONE, 0);
}
