/*
 * cmd_ping.c - gpucmd ping: COUNT round trips of a one-op batch (OpPing),
 * each timed from submit to response, then min/avg/max.
 *
 * The batch is built before the clock starts, so a time is the library's
 * encode, the socket both ways and the daemon's dispatch: the cost every
 * batch pays on top of its own work.
 */
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>

#include "cmd.h"

#define PING_DEFAULT_COUNT 4

static const char ping_usage[] =
	"usage: gpucmd ping [-c COUNT]\n"
	"  -c, --count COUNT  round trips to make (default 4)\n";

static volatile sig_atomic_t ping_stop;

/*
 * The first SIGINT or SIGTERM ends the pings after the one under way, and
 * the summary covers those made, as ping(8)'s does; the next one, should
 * a daemon that stopped answering hold that ping, ends the tool.
 */
static void on_interrupt(int sig)
{
	ping_stop = 1;
	signal(sig, SIG_DFL);
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* One timed round trip: 0 and the time in *us, or a library code. */
static int ping_once(struct gpucmd_conn *conn, double *us)
{
	struct gpucmd_batch *b;
	struct gpucmd_response *resp;
	double start;
	int r;

	r = gpucmd_batch_new(conn, 0, &b);
	if (r < 0)
		return r;
	r = gpucmd_batch_ping(b);
	if (r < 0) {
		gpucmd_batch_free(b);
		return r;
	}
	start = now_us();
	r = gpucmd_run(b, &resp);
	if (r < 0)
		return r;
	*us = now_us() - start;
	r = gpucmd_response_error(resp);
	gpucmd_response_free(resp);
	return r;
}

int cmd_ping(const struct tool_opts *o, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "count", required_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct gpucmd_conn *conn;
	uint64_t count = PING_DEFAULT_COUNT, done = 0;
	struct sigaction sa = { 0 };
	double min = 0, max = 0, sum = 0;
	int c, r;

	while ((c = getopt_long(argc, argv, "+c:h", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			if (tool_parse_u64(optarg, 0, &count) < 0 ||
			    count == 0 || count > UINT32_MAX)
				return tool_usage(argv[0], ping_usage,
						  TOOL_EXIT_USAGE,
						  "bad count '%s' (a number "
						  "of round trips from 1 to "
						  "%" PRIu32 ")",
						  optarg, UINT32_MAX);
			break;
		case 'h':
			return tool_usage(argv[0], ping_usage, TOOL_EXIT_OK,
					  NULL);
		default:
			return tool_usage(argv[0], ping_usage, TOOL_EXIT_USAGE,
					  NULL);
		}
	}
	if (optind < argc)
		return tool_usage(argv[0], ping_usage, TOOL_EXIT_USAGE,
				  "unexpected argument '%s'", argv[optind]);
	r = tool_connect(o, NULL, &conn);
	if (r != 0)
		return r;
	printf("PING gpucmdd at %s, service %s\n", tool_socket_path(o),
	       gpucmd_info(conn)->service);
	sa.sa_handler = on_interrupt;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	for (uint64_t i = 1; i <= count && !ping_stop; i++) {
		double us;

		r = ping_once(conn, &us);
		if (r < 0)
			break;
		printf("pong %" PRIu64 ": time=%.1f us\n", i, us);
		fflush(stdout);
		if (i == 1 || us < min)
			min = us;
		if (i == 1 || us > max)
			max = us;
		sum += us;
		done = i;
	}
	if (r < 0) {
		r = tool_fail_conn("ping", r, conn);
		gpucmd_close(conn);
		return r;
	}
	gpucmd_close(conn);
	if (done == 0) {
		/* Stopped before the first answer. */
		printf("--- 0 pings\n");
		return TOOL_EXIT_OK;
	}
	printf("--- %" PRIu64 " pings: min/avg/max = %.1f/%.1f/%.1f us\n", done,
	       min, sum / (double)done, max);
	return TOOL_EXIT_OK;
}
