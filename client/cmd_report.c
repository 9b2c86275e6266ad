/*
 * cmd_report.c - gpucmd memory-report: who holds what on the device, one
 * row per service the caller may see and a totals row, as a table for
 * people or one JSON object for scripts.
 *
 * The table is laid out in two passes (format every cell, then size the
 * columns to the widest cell) so exact byte counts (--bytes) and long
 * service names stay aligned; with human-readable sizes and ordinary names
 * it fits in 100 columns.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"

static const char report_usage[] =
	"usage: gpucmd memory-report [--json] [--bytes]\n"
	"  --json   print one JSON object (sizes in bytes)\n"
	"  --bytes  exact byte counts instead of 1.5 MiB\n";

enum {
	COL_NAME,
	COL_ID,
	COL_CONN,
	COL_IN_USE,
	COL_RESERVED,
	COL_PADDING,
	COL_ALLOCS,
	COL_PEAK,
	COL_LIMIT,
	COL_OOMS,
	NCOLS,
};

static const char *const headings[NCOLS] = {
	"SERVICE", "ID", "CONN", "IN USE", "RESERVED",
	"PADDING", "ALLOCS", "PEAK", "LIMIT", "OOMS",
};

#define CELL_LEN 72	/* a 63-byte service name and its NUL fit */

static void format_row(char row[NCOLS][CELL_LEN], const struct gpucmd_service_report *s,
		       int is_total, int exact)
{
	snprintf(row[COL_NAME], CELL_LEN, "%s", is_total ? "total" : s->name);
	if (is_total)
		snprintf(row[COL_ID], CELL_LEN, "-");
	else
		snprintf(row[COL_ID], CELL_LEN, "%u", s->id);
	snprintf(row[COL_CONN], CELL_LEN, "%u", s->connections);
	tool_size(s->bytes_in_use, exact, row[COL_IN_USE], CELL_LEN);
	tool_size(s->bytes_reserved, exact, row[COL_RESERVED], CELL_LEN);
	tool_size(s->bytes_padding, exact, row[COL_PADDING], CELL_LEN);
	snprintf(row[COL_ALLOCS], CELL_LEN, "%" PRIu64, s->allocations);
	tool_size(s->peak_bytes_in_use, exact, row[COL_PEAK], CELL_LEN);
	if (s->limit_bytes == 0)
		snprintf(row[COL_LIMIT], CELL_LEN, "-");
	else
		tool_size(s->limit_bytes, exact, row[COL_LIMIT], CELL_LEN);
	snprintf(row[COL_OOMS], CELL_LEN, "%" PRIu64, s->oom_count);
}

static void print_row(char row[NCOLS][CELL_LEN], const int *width)
{
	for (int c = 0; c < NCOLS; c++) {
		if (c == COL_NAME)
			printf("%-*s", width[c], row[c]);
		else
			printf("  %*s", width[c], row[c]);
	}
	printf("\n");
}

static int report_text(const struct gpucmd_report *rep, int exact)
{
	size_t nrows = rep->nservices + 2;	/* heading, services, total */
	char(*rows)[NCOLS][CELL_LEN] = calloc(nrows, sizeof(*rows));
	int width[NCOLS] = { 0 };
	char total[TOOL_SIZE_LEN];

	if (rows == NULL) {
		fprintf(stderr, "gpucmd: memory-report: out of memory\n");
		return TOOL_EXIT_FAIL;
	}
	for (int c = 0; c < NCOLS; c++)
		snprintf(rows[0][c], CELL_LEN, "%s", headings[c]);
	for (size_t i = 0; i < rep->nservices; i++)
		format_row(rows[i + 1], &rep->services[i], 0, exact);
	format_row(rows[nrows - 1], &rep->totals, 1, exact);
	for (size_t i = 0; i < nrows; i++)
		for (int c = 0; c < NCOLS; c++) {
			int w = (int)strlen(rows[i][c]);

			if (w > width[c])
				width[c] = w;
		}

	printf("device: %s, %s backend, %s\n\n", rep->device_name, rep->backend,
	       tool_size(rep->device_total_memory, exact, total,
			 sizeof(total)));
	for (size_t i = 0; i < nrows; i++)
		print_row(rows[i], width);
	free(rows);
	return TOOL_EXIT_OK;
}

static void json_service(const struct gpucmd_service_report *s)
{
	printf("{\"name\":");
	tool_json_string(stdout, s->name);
	printf(",\"id\":%u,\"connections\":%u,\"bytes_in_use\":%" PRIu64
	       ",\"bytes_reserved\":%" PRIu64 ",\"bytes_padding\":%" PRIu64
	       ",\"allocations\":%" PRIu64 ",\"peak_bytes_in_use\":%" PRIu64
	       ",\"limit_bytes\":%" PRIu64 ",\"oom_count\":%" PRIu64 "}",
	       s->id, s->connections, s->bytes_in_use, s->bytes_reserved,
	       s->bytes_padding, s->allocations, s->peak_bytes_in_use,
	       s->limit_bytes, s->oom_count);
}

static void report_json(const struct gpucmd_report *rep)
{
	printf("{\"device\":{\"name\":");
	tool_json_string(stdout, rep->device_name);
	printf(",\"backend\":");
	tool_json_string(stdout, rep->backend);
	printf(",\"total_memory\":%" PRIu64 "},\"services\":[",
	       rep->device_total_memory);
	for (size_t i = 0; i < rep->nservices; i++) {
		if (i > 0)
			printf(",");
		json_service(&rep->services[i]);
	}
	printf("],\"totals\":");
	json_service(&rep->totals);
	printf("}\n");
}

int cmd_memory_report(const struct tool_opts *o, int argc, char **argv)
{
	struct gpucmd_conn *conn;
	struct gpucmd_report *rep;
	int json = 0, exact = 0;
	int r;

	r = tool_flags(argc, argv, report_usage, &json, &exact);
	if (r >= 0)
		return r;
	r = tool_connect(o, NULL, &conn);
	if (r != 0)
		return r;
	r = gpucmd_memory_report(conn, &rep);
	gpucmd_close(conn);
	if (r < 0)
		return tool_fail("memory-report", r);
	if (json) {
		report_json(rep);
		r = TOOL_EXIT_OK;
	} else {
		r = report_text(rep, exact);
	}
	gpucmd_report_free(rep);
	return r;
}
