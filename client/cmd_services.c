/*
 * cmd_services.c - gpucmd services: the services the daemon knows (those
 * the caller may see), one line each, from the memory report: name, id,
 * connections, bytes in use and limit, modules loaded and their limit.
 * The short answer to "who is on this GPU"; memory-report has the
 * details.
 */
#include <inttypes.h>
#include <stdio.h>

#include "cmd.h"
#include "cmd_table.h"

static const char services_usage[] =
	"usage: gpucmd services [--json] [--bytes]\n"
	"  --json   print a JSON array, one object per service\n"
	"  --bytes  exact byte counts instead of 1.5 MiB\n";

static int services_text(const struct gpucmd_report *rep, int exact)
{
	static const char *const headings[] = {
		"SERVICE", "ID", "CONN", "IN USE", "LIMIT", "MODULES",
	};
	char sz[TOOL_SIZE_LEN];
	struct table t;
	int r;

	table_init(&t, sizeof(headings) / sizeof(headings[0]), headings);
	for (size_t i = 0; i < rep->nservices; i++) {
		const struct gpucmd_service_report *s = &rep->services[i];

		table_row(&t);
		table_set(&t, 0, "%s", s->name);
		table_set(&t, 1, "%u", s->id);
		table_set(&t, 2, "%u", s->connections);
		table_set(&t, 3, "%s",
			  tool_size(s->bytes_in_use, exact, sz, sizeof(sz)));
		if (s->limit_bytes != 0)
			table_set(&t, 4, "%s",
				  tool_size(s->limit_bytes, exact, sz,
					    sizeof(sz)));
		else
			table_set(&t, 4, "-");
		if (s->module_bytes > 0)
			table_set(&t, 5, "%u/%u (%s)", s->modules,
				  s->max_modules,
				  tool_size(s->module_bytes, exact, sz,
					    sizeof(sz)));
		else
			table_set(&t, 5, "%u/%u", s->modules, s->max_modules);
	}
	r = table_print(&t, stdout, 0);
	table_free(&t);
	if (r < 0) {
		fprintf(stderr, "gpucmd: services: out of memory\n");
		return TOOL_EXIT_FAIL;
	}
	return TOOL_EXIT_OK;
}

static void services_json(const struct gpucmd_report *rep)
{
	printf("[");
	for (size_t i = 0; i < rep->nservices; i++) {
		const struct gpucmd_service_report *s = &rep->services[i];

		printf("%s{\"name\":", i > 0 ? "," : "");
		tool_json_string(stdout, s->name);
		printf(",\"id\":%u,\"connections\":%u,\"bytes_in_use\":%" PRIu64
		       ",\"limit_bytes\":%" PRIu64 ",\"modules\":%u"
		       ",\"max_modules\":%u,\"module_bytes\":%" PRIu64 "}",
		       s->id, s->connections, s->bytes_in_use, s->limit_bytes,
		       s->modules, s->max_modules, s->module_bytes);
	}
	printf("]\n");
}

int cmd_services(const struct tool_opts *o, int argc, char **argv)
{
	struct gpucmd_conn *conn;
	struct gpucmd_report *rep;
	int json = 0, exact = 0;
	int r;

	r = tool_flags(argc, argv, services_usage, &json, &exact);
	if (r >= 0)
		return r;
	r = tool_observe(o, &conn);
	if (r != 0)
		return r;
	r = gpucmd_memory_report(conn, &rep);
	if (r < 0) {
		r = tool_fail_conn("services", r, conn);
		gpucmd_close(conn);
		return r;
	}
	gpucmd_close(conn);
	if (json) {
		services_json(rep);
		r = TOOL_EXIT_OK;
	} else {
		r = services_text(rep, exact);
	}
	gpucmd_report_free(rep);
	return r;
}
