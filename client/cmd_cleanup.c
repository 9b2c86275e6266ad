/*
 * cmd_cleanup.c - gpucmd cleanup: return a service's free memory (pages
 * with nothing live in them, drops the device is done with) to the device,
 * and say how much went back.  Without SERVICE it is the one --service
 * names; another service needs an admin.  An admin observes, in no
 * service (tool_observe), so the service is always sent by name.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>

#include "cmd.h"

static const char cleanup_usage[] =
	"usage: gpucmd cleanup [SERVICE]\n"
	"  SERVICE  the service to clean up (default: the one given with\n"
	"           the global --service; another one needs an admin)\n";

int cmd_cleanup(const struct tool_opts *o, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *service = NULL;
	struct gpucmd_conn *conn;
	uint64_t bytes;
	int c, r;

	while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1)
		return tool_usage(argv[0], cleanup_usage,
				  c == 'h' ? TOOL_EXIT_OK : TOOL_EXIT_USAGE,
				  NULL);
	/* "" would be the caller's own service, or EPERM for an admin. */
	if (optind < argc && argv[optind][0] == '\0')
		return tool_usage(argv[0], cleanup_usage, TOOL_EXIT_USAGE,
				  "the SERVICE name is empty");
	if (optind < argc)
		service = argv[optind++];
	if (optind < argc)
		return tool_usage(argv[0], cleanup_usage, TOOL_EXIT_USAGE,
				  "unexpected argument '%s'", argv[optind]);
	/* The daemon's "" would be the caller's own, which an observer lacks. */
	if (service == NULL)
		service = o->service;
	r = tool_observe(o, &conn);
	if (r != 0)
		return r;
	r = gpucmd_cleanup(conn, service, &bytes);
	if (r < 0) {
		r = tool_fail_conn("cleanup", r, conn);
		gpucmd_close(conn);
		return r;
	}
	gpucmd_close(conn);
	printf("cleanup: returned %" PRIu64 " bytes to the device\n", bytes);
	return TOOL_EXIT_OK;
}
