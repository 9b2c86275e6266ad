/*
 * cmd_evict.c - gpucmd evict: end every connection of a service, or one
 * connection by id, as if the client had exited; the daemon frees what
 * they held.  Admins may evict anyone, others only connections of the
 * service they speak for (--service); the tool's own connection is spared.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>

#include "cmd.h"

static const char evict_usage[] =
	"usage: gpucmd evict SERVICE\n"
	"       gpucmd evict --connection ID\n"
	"  SERVICE           end every connection of this service\n"
	"  --connection ID   end the connection with this id (see memory-report --streams)\n";

int cmd_evict(const struct tool_opts *o, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "connection", required_argument, NULL, 'c' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *service = NULL;
	uint64_t id = 0, count;
	struct gpucmd_conn *conn;
	int c, r;

	while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			if (tool_parse_u64(optarg, 0, &id) < 0 || id == 0)
				return tool_usage(argv[0], evict_usage,
						  TOOL_EXIT_USAGE,
						  "bad connection id '%s'",
						  optarg);
			break;
		case 'h':
			return tool_usage(argv[0], evict_usage, TOOL_EXIT_OK,
					  NULL);
		default:
			return tool_usage(argv[0], evict_usage, TOOL_EXIT_USAGE,
					  NULL);
		}
	}
	if (optind < argc && argv[optind][0] == '\0')
		return tool_usage(argv[0], evict_usage, TOOL_EXIT_USAGE,
				  "the SERVICE name is empty");
	if (optind < argc)
		service = argv[optind++];
	if (optind < argc)
		return tool_usage(argv[0], evict_usage, TOOL_EXIT_USAGE,
				  "unexpected argument '%s'", argv[optind]);
	if ((service == NULL) == (id == 0))
		return tool_usage(argv[0], evict_usage, TOOL_EXIT_USAGE,
				  "give a SERVICE or --connection ID (one "
				  "of them)");
	r = tool_observe(o, &conn);
	if (r != 0)
		return r;
	r = gpucmd_evict(conn, service, id, &count);
	if (r < 0) {
		r = tool_fail_conn("evict", r, conn);
		gpucmd_close(conn);
		return r;
	}
	gpucmd_close(conn);
	printf("evicted %" PRIu64 " connection%s\n", count,
	       count == 1 ? "" : "s");
	return TOOL_EXIT_OK;
}
