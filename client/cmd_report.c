/*
 * cmd_report.c - gpucmd memory-report: who holds what on the device.  One
 * row per service the caller may see and a totals row, each service
 * optionally expanded into its streams and their pools; as a table for
 * people, one JSON object for scripts, or the Prometheus text format for
 * a scrape or node_exporter's textfile collector.  --watch redraws it.
 *
 * Also here, because exec's `report` line prints the same thing for one
 * stream: the definition of fragmentation and the pool table and JSON.
 *
 * Every output is built from the same figures (struct report_view), so the
 * table, the JSON and the metrics cannot disagree.  Totals are sums over
 * the services shown, which with --service is the one service; they carry
 * no limit, since a sum of quotas limits nothing.
 *
 * Shared regions (host memory clients share with the daemon, pinned on
 * CUDA) are counted per service beside the device memory: in the text as a
 * line per service under the table (only for services that have regions or
 * a region_limit, so the table keeps its columns), in JSON and Prometheus
 * as figures of every service.
 *
 * Buffers a service's connections share (gpucmd_batch_share) are device
 * memory of the service's own, counted once in its usage whoever holds
 * them, and in no stream: the text lists them in a table under the
 * service table (who shared each and whether that connection is still
 * open, how many handles name it), JSON lists them per service,
 * Prometheus has their count and bytes per service, and how many of them
 * their sharer left behind (a per-buffer series would be one per name,
 * unbounded).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cmd.h"
#include "cmd_table.h"

static const char report_usage[] =
	"usage: gpucmd memory-report [--json | --prometheus] [--bytes]\n"
	"                            [--streams] [--pools] [--service NAME]\n"
	"                            [--watch SECONDS]\n"
	"  --json            print one JSON object (exact bytes, every stream and pool)\n"
	"  --prometheus      print the Prometheus text exposition format\n"
	"  --bytes           exact byte counts instead of 1.5 MiB\n"
	"  --streams         show each service's streams\n"
	"  --pools           show each stream's pools (implies --streams)\n"
	"  --service NAME    only the service NAME\n"
	"  --watch SECONDS   redraw every SECONDS until interrupted\n"
	"fragmentation = 1 - largest free block / (reserved - in use - padding)\n";

/* ---- figures shared with exec ------------------------------------------- */

double tool_fragmentation(const struct gpucmd_memory_usage *u,
			  uint64_t largest_free)
{
	uint64_t used = u->bytes_in_use + u->bytes_padding;
	uint64_t free_bytes;

	if (u->bytes_reserved <= used)
		return 0;
	free_bytes = u->bytes_reserved - used;
	/* A daemon that reports a block larger than what is free is wrong. */
	if (largest_free >= free_bytes)
		return 0;
	return 1.0 - (double)largest_free / (double)free_bytes;
}

uint64_t tool_stream_largest_free(const struct gpucmd_stream_report *sr)
{
	uint64_t max = 0;

	for (size_t p = 0; p < sr->npools; p++)
		if (sr->pools[p].largest_free > max)
			max = sr->pools[p].largest_free;
	return max;
}
/* Columns col to col + 2: in use, padding and reserved of u. */
static void table_set_usage(struct table *t, size_t col,
			    const struct gpucmd_memory_usage *u, int exact)
{
	char sz[TOOL_SIZE_LEN];

	table_set(t, col, "%s",
		  tool_size(u->bytes_in_use, exact, sz, sizeof(sz)));
	table_set(t, col + 1, "%s",
		  tool_size(u->bytes_padding, exact, sz, sizeof(sz)));
	table_set(t, col + 2, "%s",
		  tool_size(u->bytes_reserved, exact, sz, sizeof(sz)));
}

/* "12.5%" of a fragmentation. */
static const char *percent(double f, char *buf, size_t len)
{
	snprintf(buf, len, "%.1f%%", f * 100.0);
	return buf;
}

int tool_pool_table(const struct gpucmd_stream_report *sr, int exact,
		    int indent)
{
	static const char *const headings[] = {
		"#",	  "KIND",    "PAGE SIZE", "PAGES",	  "ALLOCS",
		"IN USE", "PADDING", "RESERVED",  "LARGEST FREE", "FRAG",
	};
	char sz[TOOL_SIZE_LEN];
	struct table t;
	int r;

	table_init(&t, sizeof(headings) / sizeof(headings[0]), headings);
	table_left(&t, 1);
	for (size_t p = 0; p < sr->npools; p++) {
		const struct gpucmd_pool_report *pr = &sr->pools[p];

		table_row(&t);
		table_set(&t, 0, "%zu", p);
		table_set(&t, 1, "%s", pr->kind);
		table_set(&t, 2, "%s",
			  pr->page_size != 0 ? tool_size(pr->page_size, exact,
							 sz, sizeof(sz)) :
					       "-");
		table_set(&t, 3, "%" PRIu64, pr->pages);
		table_set(&t, 4, "%" PRIu64, pr->usage.allocations);
		table_set_usage(&t, 5, &pr->usage, exact);
		table_set(&t, 8, "%s",
			  tool_size(pr->largest_free, exact, sz, sizeof(sz)));
		table_set(&t, 9, "%s",
			  percent(tool_fragmentation(&pr->usage,
						     pr->largest_free),
				  sz, sizeof(sz)));
	}
	r = table_print(&t, stdout, indent);
	table_free(&t);
	return r;
}

void tool_json_usage(const struct gpucmd_memory_usage *u)
{
	printf("\"allocations\":%" PRIu64 ",\"bytes_in_use\":%" PRIu64
	       ",\"bytes_padding\":%" PRIu64 ",\"bytes_reserved\":%" PRIu64,
	       u->allocations, u->bytes_in_use, u->bytes_padding,
	       u->bytes_reserved);
}

void tool_json_stream(const struct gpucmd_stream_report *sr)
{
	uint64_t lf = tool_stream_largest_free(sr);

	printf("\"connection_id\":%" PRIu64 ",\"stream\":%u,\"closing\":%s,",
	       sr->connection_id, sr->stream, sr->closing ? "true" : "false");
	tool_json_usage(&sr->usage);
	printf(",\"largest_free\":%" PRIu64 ",\"fragmentation\":%.6f"
	       ",\"pools\":[",
	       lf, tool_fragmentation(&sr->usage, lf));
	for (size_t p = 0; p < sr->npools; p++) {
		const struct gpucmd_pool_report *pr = &sr->pools[p];

		printf("%s{\"kind\":", p > 0 ? "," : "");
		tool_json_string(stdout, pr->kind);
		printf(",\"page_size\":%" PRIu64 ",\"max_slice\":%" PRIu64
		       ",\"pages\":%" PRIu64 ",\"pages_peak\":%" PRIu64 ",",
		       pr->page_size, pr->max_slice, pr->pages, pr->pages_peak);
		tool_json_usage(&pr->usage);
		printf(",\"largest_alloc\":%" PRIu64
		       ",\"largest_free\":%" PRIu64 ",\"fragmentation\":%.6f}",
		       pr->largest_alloc, pr->largest_free,
		       tool_fragmentation(&pr->usage, pr->largest_free));
	}
	printf("]");
}

/* ---- the report as shown -------------------------------------------------- */

/* A service as shown: its report and the figures derived from it. */
struct service_view {
	const struct gpucmd_service_report *s;
	struct gpucmd_memory_usage usage;
	uint64_t largest_free;	     /* over every pool of every stream */
	uint64_t stream_largest_sum; /* each stream's largest, summed */
	double fragmentation;
};

struct report_view {
	const struct gpucmd_report *rep;
	struct service_view *services;
	size_t n;
	struct {
		uint32_t connections;
		struct gpucmd_memory_usage usage;
		uint64_t peak_bytes_in_use;
		uint64_t oom_count;
		uint64_t largest_free;
		uint64_t stream_largest_sum;
		double fragmentation;
		uint64_t region_bytes;
		uint32_t regions;
		uint64_t region_refusals;
		uint64_t released_pending;
		uint64_t module_bytes;
		uint32_t shared_buffers;
		uint64_t shared_buffer_bytes;
	} total;
};

struct report_opts {
	int json;
	int prometheus;
	int exact;
	int streams;
	int pools;
	const char *service; /* filter, NULL: all */
	double watch;	     /* seconds, 0: once */
};

static void usage_of(const struct gpucmd_service_report *s,
		     struct gpucmd_memory_usage *u)
{
	u->allocations = s->allocations;
	u->bytes_in_use = s->bytes_in_use;
	u->bytes_padding = s->bytes_padding;
	u->bytes_reserved = s->bytes_reserved;
}

/* The services of rep that o shows, with their figures; -ENOMEM. */
static int view_build(const struct gpucmd_report *rep,
		      const struct report_opts *o, struct report_view *v)
{
	memset(v, 0, sizeof(*v));
	v->rep = rep;
	v->services = calloc(rep->nservices + 1, sizeof(*v->services));
	if (v->services == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < rep->nservices; i++) {
		const struct gpucmd_service_report *s = &rep->services[i];
		struct service_view *sv = &v->services[v->n];

		if (o->service != NULL && strcmp(s->name, o->service) != 0)
			continue;
		sv->s = s;
		usage_of(s, &sv->usage);
		for (size_t j = 0; j < s->nstreams; j++) {
			uint64_t lf = tool_stream_largest_free(&s->streams[j]);

			if (lf > sv->largest_free)
				sv->largest_free = lf;
			sv->stream_largest_sum += lf;
		}
		/*
		 * Each stream allocates from its own pools: free memory split
		 * between streams is not fragmentation (gpucmd(1)).
		 */
		sv->fragmentation =
			tool_fragmentation(&sv->usage, sv->stream_largest_sum);
		v->n++;

		v->total.connections += s->connections;
		v->total.usage.allocations += s->allocations;
		v->total.usage.bytes_in_use += s->bytes_in_use;
		v->total.usage.bytes_padding += s->bytes_padding;
		v->total.usage.bytes_reserved += s->bytes_reserved;
		v->total.peak_bytes_in_use += s->peak_bytes_in_use;
		v->total.oom_count += s->oom_count;
		v->total.region_bytes += s->region_bytes;
		v->total.regions += s->regions;
		v->total.region_refusals += s->region_refusals;
		v->total.released_pending += s->bytes_released_pending;
		v->total.module_bytes += s->module_bytes;
		v->total.shared_buffers += s->shared_buffers;
		v->total.shared_buffer_bytes += s->shared_buffer_bytes;
		if (sv->largest_free > v->total.largest_free)
			v->total.largest_free = sv->largest_free;
		v->total.stream_largest_sum += sv->stream_largest_sum;
	}
	v->total.fragmentation =
		tool_fragmentation(&v->total.usage,
				   v->total.stream_largest_sum);
	return 0;
}

/* ---- text ------------------------------------------------------------------ */

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
	COL_FRAG,
	NCOLS,
};

static const char *const service_headings[NCOLS] = {
	"SERVICE", "ID",   "CONN",  "IN USE", "RESERVED", "PADDING",
	"ALLOCS",  "PEAK", "LIMIT", "OOMS",   "FRAG",
};

/* The cells of a service row (id 0 and limit 0 print as "-"). */
static void service_cells(struct table *t, const char *name, uint32_t id,
			  uint32_t connections,
			  const struct gpucmd_memory_usage *u, uint64_t peak,
			  uint64_t limit, uint64_t ooms, double frag, int exact)
{
	char sz[TOOL_SIZE_LEN];

	table_row(t);
	table_set(t, COL_NAME, "%s", name);
	if (id != 0)
		table_set(t, COL_ID, "%u", id);
	else
		table_set(t, COL_ID, "-");
	table_set(t, COL_CONN, "%u", connections);
	table_set(t, COL_IN_USE, "%s",
		  tool_size(u->bytes_in_use, exact, sz, sizeof(sz)));
	table_set(t, COL_RESERVED, "%s",
		  tool_size(u->bytes_reserved, exact, sz, sizeof(sz)));
	table_set(t, COL_PADDING, "%s",
		  tool_size(u->bytes_padding, exact, sz, sizeof(sz)));
	table_set(t, COL_ALLOCS, "%" PRIu64, u->allocations);
	table_set(t, COL_PEAK, "%s", tool_size(peak, exact, sz, sizeof(sz)));
	if (limit != 0)
		table_set(t, COL_LIMIT, "%s",
			  tool_size(limit, exact, sz, sizeof(sz)));
	else
		table_set(t, COL_LIMIT, "-");
	table_set(t, COL_OOMS, "%" PRIu64, ooms);
	table_set(t, COL_FRAG, "%s", percent(frag, sz, sizeof(sz)));
}

static int streams_table(const struct service_view *sv, int exact)
{
	static const char *const headings[] = {
		"CONNECTION", "STREAM",	  "ALLOCS",	  "IN USE",
		"PADDING",    "RESERVED", "LARGEST FREE", "FRAG",
	};
	const struct gpucmd_service_report *s = sv->s;
	char sz[TOOL_SIZE_LEN];
	struct table t;
	int r;

	table_init(&t, sizeof(headings) / sizeof(headings[0]), headings);
	for (size_t j = 0; j < s->nstreams; j++) {
		const struct gpucmd_stream_report *sr = &s->streams[j];
		uint64_t lf = tool_stream_largest_free(sr);

		table_row(&t);
		table_set(&t, 0, "%" PRIu64 "%s", sr->connection_id,
			  sr->closing ? " (closed)" : "");
		table_set(&t, 1, "%u", sr->stream);
		table_set(&t, 2, "%" PRIu64, sr->usage.allocations);
		table_set_usage(&t, 3, &sr->usage, exact);
		table_set(&t, 6, "%s", tool_size(lf, exact, sz, sizeof(sz)));
		table_set(&t, 7, "%s",
			  percent(tool_fragmentation(&sr->usage, lf), sz,
				  sizeof(sz)));
	}
	r = table_print(&t, stdout, 2);
	table_free(&t);
	return r;
}

/* With --pools: each stream as a line, then its pools. */
static int streams_with_pools(const struct service_view *sv, int exact)
{
	const struct gpucmd_service_report *s = sv->s;
	char a[TOOL_SIZE_LEN], b[TOOL_SIZE_LEN], c[TOOL_SIZE_LEN];
	int r = 0;

	for (size_t j = 0; j < s->nstreams; j++) {
		const struct gpucmd_stream_report *sr = &s->streams[j];
		uint64_t lf = tool_stream_largest_free(sr);

		printf("  connection %" PRIu64 "%s stream %u: %" PRIu64
		       " allocs, %s in use, %s padding, %s reserved, "
		       "fragmentation %.1f%%\n",
		       sr->connection_id,
		       sr->closing ? " (closed, its work still running)" : "",
		       sr->stream, sr->usage.allocations,
		       tool_size(sr->usage.bytes_in_use, exact, a, sizeof(a)),
		       tool_size(sr->usage.bytes_padding, exact, b, sizeof(b)),
		       tool_size(sr->usage.bytes_reserved, exact, c, sizeof(c)),
		       tool_fragmentation(&sr->usage, lf) * 100.0);
		if (tool_pool_table(sr, exact, 4) < 0)
			r = -1;
	}
	return r;
}

/*
 * Under the table: a line per service with shared regions, a region_limit
 * or refused attaches ("NAME: 2 regions, 30.1 MiB (limit 256.0 MiB), 3
 * attaches refused"), and a total when there are several; nothing when no
 * service has any.
 */
/* The end of a region line: attaches refused over region_limit, if any. */
static void refusals(uint64_t n)
{
	if (n != 0)
		printf(", %" PRIu64 " attach%s refused over the limit", n,
		       n == 1 ? "" : "es");
	printf("\n");
}

static void region_lines(const struct report_view *v, int exact)
{
	char a[TOOL_SIZE_LEN], b[TOOL_SIZE_LEN];
	size_t shown = 0;

	for (size_t i = 0; i < v->n; i++) {
		const struct gpucmd_service_report *s = v->services[i].s;

		if (s->regions == 0 && s->region_bytes == 0 &&
		    s->region_limit == 0 && s->region_refusals == 0)
			continue;
		if (shown++ == 0)
			printf("\nshared regions (host memory mapped for "
			       "clients, pinned on CUDA):\n");
		printf("  %s: %u region%s, %s", s->name, s->regions,
		       s->regions == 1 ? "" : "s",
		       tool_size(s->region_bytes, exact, a, sizeof(a)));
		if (s->region_limit != 0)
			printf(" (limit %s)",
			       tool_size(s->region_limit, exact, b, sizeof(b)));
		else
			printf(" (no limit)");
		refusals(s->region_refusals);
	}
	if (shown > 1) {
		printf("  total: %u region%s, %s", v->total.regions,
		       v->total.regions == 1 ? "" : "s",
		       tool_size(v->total.region_bytes, exact, a, sizeof(a)));
		refusals(v->total.region_refusals);
	}
}

/*
 * Under the table: memory the services released that the device may still
 * use ("NAME: 2.0 MiB"), nothing when there is none.  It is part of "in
 * use" above, and it is why an allocation under the limit may still get
 * GPUCMD_EQUOTA (the quota allows as much again of it).
 */
static void released_lines(const struct report_view *v, int exact)
{
	char a[TOOL_SIZE_LEN];

	if (v->total.released_pending == 0)
		return;
	printf("\nreleased, still used by work queued on the device (in use "
	       "above until that work is done):\n");
	for (size_t i = 0; i < v->n; i++) {
		const struct gpucmd_service_report *s = v->services[i].s;

		if (s->bytes_released_pending != 0)
			printf("  %s: %s\n", s->name,
			       tool_size(s->bytes_released_pending, exact, a,
					 sizeof(a)));
	}
}

/*
 * Under the table: device memory the globals of the services' loaded
 * modules hold ("NAME: 3 modules, 40.0 MiB"), nothing when there is none.
 * It is not in "in use" above, yet counts against the limit beside it: an
 * allocation under the limit by the table may still get GPUCMD_EQUOTA.
 */
static void module_lines(const struct report_view *v, int exact)
{
	char a[TOOL_SIZE_LEN];

	if (v->total.module_bytes == 0)
		return;
	printf("\nglobals of loaded modules (device memory counted against "
	       "the limit beside in use):\n");
	for (size_t i = 0; i < v->n; i++) {
		const struct gpucmd_service_report *s = v->services[i].s;

		if (s->module_bytes != 0)
			printf("  %s: %u module%s, %s\n", s->name, s->modules,
			       s->modules == 1 ? "" : "s",
			       tool_size(s->module_bytes, exact, a, sizeof(a)));
	}
}

/*
 * Under the table: the buffers each service's connections share, one row
 * each -- the answer to "who holds what" for memory that no stream owns:
 * its size, the handles naming it on every connection (it goes with the
 * last), the imports since it was shared, the connection that shared it
 * ("(gone)" once it closed: the memory outlives it, held by imports
 * only), and whether its copy has
 * run (until then an import is refused with GPUCMD_EBUSY).  Nothing when
 * no service shares any.  -1 when rows were lost for lack of memory.
 */
static int shared_lines(const struct report_view *v, int exact)
{
	static const char *const headings[] = {
		"SERVICE", "NAME",	"SIZE",	 "HANDLES",
		"IMPORTS", "SHARED BY", "READY",
	};
	char sz[TOOL_SIZE_LEN];
	struct table t;
	int r;

	if (v->total.shared_buffers == 0)
		return 0;
	printf("\nbuffers shared between the connections of a service "
	       "(counted once in in use above):\n");
	table_init(&t, sizeof(headings) / sizeof(headings[0]), headings);
	table_left(&t, 1);
	table_left(&t, 5);
	table_left(&t, 6);
	for (size_t i = 0; i < v->n; i++) {
		const struct gpucmd_service_report *s = v->services[i].s;

		for (size_t j = 0; j < s->nshared; j++) {
			const struct gpucmd_shared_buffer *sb = &s->shared[j];

			table_row(&t);
			table_set(&t, 0, "%s", s->name);
			table_set(&t, 1, "%s", sb->name);
			table_set(&t, 2, "%s",
				  tool_size(sb->bytes, exact, sz, sizeof(sz)));
			table_set(&t, 3, "%u", sb->handles);
			table_set(&t, 4, "%" PRIu64, sb->imports);
			table_set(&t, 5, "connection %" PRIu64 "%s",
				  sb->connection_id,
				  sb->sharer_open ? "" : " (gone)");
			table_set(&t, 6, "%s",
				  sb->ready ?
					  "yes" :
				  sb->lost ?
					  "no, lost: release and share again" :
					  "no, still copying");
		}
	}
	r = table_print(&t, stdout, 2);
	table_free(&t);
	return r;
}

/* "3 s", "4 min", "2 h", "5 d": how long ago unix_ms was (now_ms). */
static void ago(uint64_t unix_ms, uint64_t now_ms, char *buf, size_t len)
{
	uint64_t s = now_ms > unix_ms ? (now_ms - unix_ms) / 1000 : 0;

	if (s < 120)
		snprintf(buf, len, "%" PRIu64 " s", s);
	else if (s < 120 * 60)
		snprintf(buf, len, "%" PRIu64 " min", s / 60);
	else if (s < 48 * 3600)
		snprintf(buf, len, "%" PRIu64 " h", s / 3600);
	else
		snprintf(buf, len, "%" PRIu64 " d", s / 86400);
}

/*
 * Under the table: each service's last refused allocation, as its client
 * was told, and when (local time) -- the answer to "why did my allocation
 * fail" after the fact.  Nothing when no service had one.
 */
static void refusal_lines(const struct report_view *v, int exact)
{
	char size[TOOL_SIZE_LEN], when[64], since[32];
	struct timespec now;
	size_t shown = 0;

	clock_gettime(CLOCK_REALTIME, &now);
	for (size_t i = 0; i < v->n; i++) {
		const struct gpucmd_service_report *s = v->services[i].s;
		const struct gpucmd_refusal *r = &s->last_refusal;
		time_t t = (time_t)(r->unix_ms / 1000);
		struct tm tm;

		if (r->unix_ms == 0)
			continue;
		if (shown++ == 0)
			printf("\nlast refused allocation of each service that "
			       "had one (what its client was told):\n");
		if (localtime_r(&t, &tm) == NULL ||
		    strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S %Z", &tm) ==
			    0)
			snprintf(when, sizeof(when), "%" PRIu64 " ms",
				 r->unix_ms);
		ago(r->unix_ms,
		    (uint64_t)now.tv_sec * 1000 +
			    (uint64_t)now.tv_nsec / 1000000,
		    since, sizeof(since));
		printf("  %s: %s at %s (%s ago), connection %" PRIu64
		       ", stream %u: %s\n    %s\n",
		       s->name, tool_size(r->size, exact, size, sizeof(size)),
		       when, since, r->connection_id, r->stream,
		       gpucmd_errname(r->code), r->message);
	}
}

static int report_text(const struct report_view *v, const struct report_opts *o)
{
	const struct gpucmd_report *rep = v->rep;
	char a[TOOL_SIZE_LEN], b[TOOL_SIZE_LEN];
	struct table t;
	int r;

	printf("device: %s, %s backend, %s total, ", rep->device_name,
	       rep->backend,
	       tool_size(rep->device_total_memory, o->exact, a, sizeof(a)));
	if (rep->has_device_free_memory)
		printf("%s free\n", tool_size(rep->device_free_memory, o->exact,
					      b, sizeof(b)));
	else
		printf("free n/a\n");
	if (rep->device_uuid[0] != '\0' || rep->device_pci_bus_id[0] != '\0')
		printf("gpu: %s, PCI %s\n",
		       rep->device_uuid[0] ? rep->device_uuid : "(no UUID)",
		       rep->device_pci_bus_id[0] ? rep->device_pci_bus_id :
						   "(unknown)");
	/*
	 * What the daemon holds for itself beside the services: its pinned
	 * host pool (the device context and modules are not measured).
	 */
	if (rep->has_pinned_host)
		printf("daemon overhead: pinned host pool %s reserved, %s in "
		       "use\n\n",
		       tool_size(rep->pinned_host.bytes_reserved, o->exact, a,
				 sizeof(a)),
		       tool_size(rep->pinned_host.bytes_in_use, o->exact, b,
				 sizeof(b)));
	else
		printf("daemon overhead: n/a (shown to administrators only, "
		       "or not reported by this gpucmdd)\n\n");

	table_init(&t, NCOLS, service_headings);
	for (size_t i = 0; i < v->n; i++) {
		const struct service_view *sv = &v->services[i];
		const struct gpucmd_service_report *s = sv->s;

		service_cells(&t, s->name, s->id, s->connections, &sv->usage,
			      s->peak_bytes_in_use, s->limit_bytes,
			      s->oom_count, sv->fragmentation, o->exact);
	}
	service_cells(&t, "total", 0, v->total.connections, &v->total.usage,
		      v->total.peak_bytes_in_use, 0, v->total.oom_count,
		      v->total.fragmentation, o->exact);
	r = table_print(&t, stdout, 0);
	table_free(&t);
	region_lines(v, o->exact);
	released_lines(v, o->exact);
	module_lines(v, o->exact);
	if (shared_lines(v, o->exact) < 0)
		r = -1;
	refusal_lines(v, o->exact);

	for (size_t i = 0; (o->streams || o->pools) && i < v->n; i++) {
		const struct service_view *sv = &v->services[i];

		printf("\nservice %s (id %u): %zu stream%s\n", sv->s->name,
		       sv->s->id, sv->s->nstreams,
		       sv->s->nstreams == 1 ? "" : "s");
		if (sv->s->nstreams == 0)
			continue;
		if ((o->pools ? streams_with_pools(sv, o->exact) :
				streams_table(sv, o->exact)) < 0)
			r = -1;
	}
	if (r < 0) {
		fprintf(stderr, "gpucmd: memory-report: out of memory\n");
		return TOOL_EXIT_FAIL;
	}
	return TOOL_EXIT_OK;
}

/* ---- JSON ------------------------------------------------------------------ */

/* Shared regions of a service or the totals (limit 0 = none). */
struct json_regions {
	uint64_t bytes;
	uint32_t count;
	uint64_t limit;
	uint64_t refusals;
};

/* The members every service and the totals have. */
static void json_service_figures(uint32_t connections,
				 const struct gpucmd_memory_usage *u,
				 uint64_t peak, uint64_t limit, uint64_t ooms,
				 uint64_t largest_free, double frag,
				 const struct json_regions *rg,
				 uint64_t released_pending)
{
	printf("\"connections\":%u,", connections);
	tool_json_usage(u);
	printf(",\"peak_bytes_in_use\":%" PRIu64 ",\"limit_bytes\":%" PRIu64
	       ",\"oom_count\":%" PRIu64 ",\"largest_free\":%" PRIu64
	       ",\"fragmentation\":%.6f",
	       peak, limit, ooms, largest_free, frag);
	printf(",\"region_bytes\":%" PRIu64 ",\"regions\":%u"
	       ",\"region_limit\":%" PRIu64 ",\"region_refusals\":%" PRIu64,
	       rg->bytes, rg->count, rg->limit, rg->refusals);
	printf(",\"bytes_released_pending\":%" PRIu64, released_pending);
}

/* The shared buffers' count and bytes, of a service or the totals. */
static void json_shared_figures(uint32_t count, uint64_t bytes)
{
	printf(",\"shared_buffers\":%u,\"shared_buffer_bytes\":%" PRIu64, count,
	       bytes);
}

static void report_json(const struct report_view *v)
{
	const struct gpucmd_report *rep = v->rep;

	printf("{\"device\":{\"name\":");
	tool_json_string(stdout, rep->device_name);
	printf(",\"backend\":");
	tool_json_string(stdout, rep->backend);
	printf(",\"uuid\":");
	tool_json_string(stdout, rep->device_uuid);
	printf(",\"pci_bus_id\":");
	tool_json_string(stdout, rep->device_pci_bus_id);
	printf(",\"total_memory\":%" PRIu64 ",\"free_memory\":",
	       rep->device_total_memory);
	if (rep->has_device_free_memory)
		printf("%" PRIu64, rep->device_free_memory);
	else
		printf("null");
	printf("},\"daemon_overhead\":");
	if (rep->has_pinned_host)
		printf("{\"pinned_host_bytes_reserved\":%" PRIu64
		       ",\"pinned_host_bytes_in_use\":%" PRIu64 "}",
		       rep->pinned_host.bytes_reserved,
		       rep->pinned_host.bytes_in_use);
	else
		printf("null");
	printf(",\"services\":[");
	for (size_t i = 0; i < v->n; i++) {
		const struct service_view *sv = &v->services[i];
		const struct gpucmd_service_report *s = sv->s;
		struct json_regions rg = { s->region_bytes, s->regions,
					   s->region_limit,
					   s->region_refusals };

		printf("%s{\"name\":", i > 0 ? "," : "");
		tool_json_string(stdout, s->name);
		printf(",\"id\":%u,", s->id);
		json_service_figures(s->connections, &sv->usage,
				     s->peak_bytes_in_use, s->limit_bytes,
				     s->oom_count, sv->largest_free,
				     sv->fragmentation, &rg,
				     s->bytes_released_pending);
		printf(",\"module_bytes\":%" PRIu64, s->module_bytes);
		json_shared_figures(s->shared_buffers, s->shared_buffer_bytes);
		printf(",\"last_refusal\":");
		if (s->last_refusal.unix_ms != 0) {
			const struct gpucmd_refusal *r = &s->last_refusal;

			printf("{\"unix_ms\":%" PRIu64 ",\"size\":%" PRIu64
			       ",\"connection_id\":%" PRIu64
			       ",\"stream\":%u,\"code\":",
			       r->unix_ms, r->size, r->connection_id,
			       r->stream);
			tool_json_string(stdout, gpucmd_errname(r->code));
			printf(",\"message\":");
			tool_json_string(stdout, r->message);
			printf("}");
		} else {
			printf("null");
		}
		printf(",\"streams\":[");
		for (size_t j = 0; j < s->nstreams; j++) {
			printf("%s{", j > 0 ? "," : "");
			tool_json_stream(&s->streams[j]);
			printf("}");
		}
		printf("],\"shared\":[");
		for (size_t j = 0; j < s->nshared; j++) {
			const struct gpucmd_shared_buffer *sb = &s->shared[j];

			printf("%s{\"name\":", j > 0 ? "," : "");
			tool_json_string(stdout, sb->name);
			printf(",\"bytes\":%" PRIu64 ",\"handles\":%u"
			       ",\"connection_id\":%" PRIu64
			       ",\"sharer_open\":%s"
			       ",\"imports\":%" PRIu64 ",\"ready\":%s"
			       ",\"lost\":%s}",
			       sb->bytes, sb->handles, sb->connection_id,
			       sb->sharer_open ? "true" : "false", sb->imports,
			       sb->ready ? "true" : "false",
			       sb->lost ? "true" : "false");
		}
		printf("]}");
	}
	printf("],\"totals\":{");
	{
		struct json_regions rg = { v->total.region_bytes,
					   v->total.regions, 0,
					   v->total.region_refusals };

		json_service_figures(v->total.connections, &v->total.usage,
				     v->total.peak_bytes_in_use, 0,
				     v->total.oom_count, v->total.largest_free,
				     v->total.fragmentation, &rg,
				     v->total.released_pending);
		printf(",\"module_bytes\":%" PRIu64, v->total.module_bytes);
		json_shared_figures(v->total.shared_buffers,
				    v->total.shared_buffer_bytes);
	}
	printf("}}\n");
}

/* ---- Prometheus ------------------------------------------------------------ */

/*
 * The text exposition format wants every sample of a metric family right
 * after its HELP and TYPE lines, so the output goes family by family, each
 * over every service (stream, pool).  Integer figures print exactly;
 * ratios with six decimals.
 */

/* A label value, escaped as the format says (\\, \" and \n). */
static void prom_label(const char *name, const char *value, int first)
{
	printf("%s%s=\"", first ? "" : ",", name);
	for (const char *p = value; *p != '\0'; p++) {
		if (*p == '\\' || *p == '"')
			printf("\\%c", *p);
		else if (*p == '\n')
			printf("\\n");
		else
			putchar(*p);
	}
	putchar('"');
}

static void prom_family(const char *name, const char *type, const char *help)
{
	printf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One value: an exact integer, or a ratio when is_ratio. */
struct prom_value {
	uint64_t u;
	double ratio;
	int is_ratio;
};

static void prom_value(const struct prom_value *v)
{
	if (v->is_ratio)
		printf(" %.6f\n", v->ratio);
	else
		printf(" %" PRIu64 "\n", v->u);
}

enum prom_level { PROM_SERVICE, PROM_STREAM, PROM_POOL };

/* Where a sample is: the service view, and a stream and pool in it. */
struct prom_at {
	const struct service_view *sv;
	const struct gpucmd_stream_report *sr;
	size_t pool;
};

struct prom_metric {
	enum prom_level level;
	const char *name;
	const char *type;
	const char *help;
	struct prom_value (*get)(const struct prom_at *at);
};

static struct prom_value pv(uint64_t u)
{
	return (struct prom_value){ .u = u };
}

static struct prom_value pr(double r)
{
	return (struct prom_value){ .ratio = r, .is_ratio = 1 };
}

static const struct gpucmd_pool_report *pool_at(const struct prom_at *at)
{
	return &at->sr->pools[at->pool];
}

static struct prom_value svc_connections(const struct prom_at *at)
{
	return pv(at->sv->s->connections);
}

static struct prom_value svc_in_use(const struct prom_at *at)
{
	return pv(at->sv->usage.bytes_in_use);
}

static struct prom_value svc_reserved(const struct prom_at *at)
{
	return pv(at->sv->usage.bytes_reserved);
}

static struct prom_value svc_padding(const struct prom_at *at)
{
	return pv(at->sv->usage.bytes_padding);
}

static struct prom_value svc_allocations(const struct prom_at *at)
{
	return pv(at->sv->usage.allocations);
}

static struct prom_value svc_peak(const struct prom_at *at)
{
	return pv(at->sv->s->peak_bytes_in_use);
}

static struct prom_value svc_limit(const struct prom_at *at)
{
	return pv(at->sv->s->limit_bytes);
}

static struct prom_value svc_ooms(const struct prom_at *at)
{
	return pv(at->sv->s->oom_count);
}

static struct prom_value svc_last_refusal(const struct prom_at *at)
{
	return pr((double)at->sv->s->last_refusal.unix_ms / 1000);
}

static struct prom_value svc_module_bytes(const struct prom_at *at)
{
	return pv(at->sv->s->module_bytes);
}

static struct prom_value svc_shared_buffers(const struct prom_at *at)
{
	return pv(at->sv->s->shared_buffers);
}

static struct prom_value svc_shared_buffer_bytes(const struct prom_at *at)
{
	return pv(at->sv->s->shared_buffer_bytes);
}

static struct prom_value svc_shared_sharer_gone(const struct prom_at *at)
{
	const struct gpucmd_service_report *s = at->sv->s;
	uint64_t n = 0;

	for (size_t j = 0; j < s->nshared; j++)
		n += !s->shared[j].sharer_open;
	return pv(n);
}

static struct prom_value svc_region_bytes(const struct prom_at *at)
{
	return pv(at->sv->s->region_bytes);
}

static struct prom_value svc_regions(const struct prom_at *at)
{
	return pv(at->sv->s->regions);
}

static struct prom_value svc_region_limit(const struct prom_at *at)
{
	return pv(at->sv->s->region_limit);
}

static struct prom_value svc_region_refusals(const struct prom_at *at)
{
	return pv(at->sv->s->region_refusals);
}

static struct prom_value svc_released_pending(const struct prom_at *at)
{
	return pv(at->sv->s->bytes_released_pending);
}

static struct prom_value svc_largest_free(const struct prom_at *at)
{
	return pv(at->sv->largest_free);
}

static struct prom_value svc_fragmentation(const struct prom_at *at)
{
	return pr(at->sv->fragmentation);
}

static struct prom_value str_in_use(const struct prom_at *at)
{
	return pv(at->sr->usage.bytes_in_use);
}

static struct prom_value str_reserved(const struct prom_at *at)
{
	return pv(at->sr->usage.bytes_reserved);
}

static struct prom_value str_padding(const struct prom_at *at)
{
	return pv(at->sr->usage.bytes_padding);
}

static struct prom_value str_allocations(const struct prom_at *at)
{
	return pv(at->sr->usage.allocations);
}

static struct prom_value str_fragmentation(const struct prom_at *at)
{
	return pr(tool_fragmentation(&at->sr->usage,
				     tool_stream_largest_free(at->sr)));
}

static struct prom_value pool_page_size(const struct prom_at *at)
{
	return pv(pool_at(at)->page_size);
}

static struct prom_value pool_pages(const struct prom_at *at)
{
	return pv(pool_at(at)->pages);
}

static struct prom_value pool_in_use(const struct prom_at *at)
{
	return pv(pool_at(at)->usage.bytes_in_use);
}

static struct prom_value pool_reserved(const struct prom_at *at)
{
	return pv(pool_at(at)->usage.bytes_reserved);
}

static struct prom_value pool_padding(const struct prom_at *at)
{
	return pv(pool_at(at)->usage.bytes_padding);
}

static struct prom_value pool_allocations(const struct prom_at *at)
{
	return pv(pool_at(at)->usage.allocations);
}

static struct prom_value pool_largest_free(const struct prom_at *at)
{
	return pv(pool_at(at)->largest_free);
}

static struct prom_value pool_fragmentation(const struct prom_at *at)
{
	const struct gpucmd_pool_report *p = pool_at(at);

	return pr(tool_fragmentation(&p->usage, p->largest_free));
}

static const struct prom_metric prom_metrics[] = {
	{ PROM_SERVICE, "gpucmd_service_connections", "gauge",
	  "Connections open for the service.", svc_connections },
	{ PROM_SERVICE, "gpucmd_service_bytes_in_use", "gauge",
	  "Bytes the service's live allocations asked for.", svc_in_use },
	{ PROM_SERVICE, "gpucmd_service_bytes_reserved", "gauge",
	  "Bytes held from the device for the service, free or in use.",
	  svc_reserved },
	{ PROM_SERVICE, "gpucmd_service_bytes_padding", "gauge",
	  "Alignment padding of the service's live allocations.", svc_padding },
	{ PROM_SERVICE, "gpucmd_service_allocations", "gauge",
	  "Live allocations of the service.", svc_allocations },
	{ PROM_SERVICE, "gpucmd_service_peak_bytes_in_use", "gauge",
	  "Most bytes the service has had in use at once.", svc_peak },
	{ PROM_SERVICE, "gpucmd_service_limit_bytes", "gauge",
	  "Memory quota of the service (0 = none).", svc_limit },
	{ PROM_SERVICE, "gpucmd_service_oom_total", "counter",
	  "Allocations refused for lack of memory or quota.", svc_ooms },
	{ PROM_SERVICE, "gpucmd_service_last_oom_timestamp_seconds", "gauge",
	  "When the service's last allocation was refused (Unix time; 0 = "
	  "none since the daemon started).",
	  svc_last_refusal },
	{ PROM_SERVICE, "gpucmd_service_largest_free_bytes", "gauge",
	  "Largest free block in any pool of the service.", svc_largest_free },
	{ PROM_SERVICE, "gpucmd_service_fragmentation_ratio", "gauge",
	  "1 - largest free block / (reserved - in use - padding).",
	  svc_fragmentation },
	{ PROM_SERVICE, "gpucmd_service_bytes_released_pending", "gauge",
	  "Bytes the service released that the device may still use (part "
	  "of bytes_in_use).",
	  svc_released_pending },
	{ PROM_SERVICE, "gpucmd_service_module_bytes", "gauge",
	  "Device memory the globals of the service's loaded modules hold "
	  "(counted in its quota).",
	  svc_module_bytes },
	{ PROM_SERVICE, "gpucmd_service_shared_buffers", "gauge",
	  "Buffers the service's connections share (share and import).",
	  svc_shared_buffers },
	{ PROM_SERVICE, "gpucmd_service_shared_buffer_bytes", "gauge",
	  "Bytes of the buffers the service's connections share (part of "
	  "bytes_in_use, counted once).",
	  svc_shared_buffer_bytes },
	{ PROM_SERVICE, "gpucmd_service_shared_buffers_sharer_gone", "gauge",
	  "Buffers the service's connections share whose sharing connection "
	  "has closed (held by imports only).",
	  svc_shared_sharer_gone },
	{ PROM_SERVICE, "gpucmd_service_region_bytes", "gauge",
	  "Bytes of shared regions mapped for the service (pinned host "
	  "memory on CUDA).",
	  svc_region_bytes },
	{ PROM_SERVICE, "gpucmd_service_regions", "gauge",
	  "Shared regions mapped for the service.", svc_regions },
	{ PROM_SERVICE, "gpucmd_service_region_limit_bytes", "gauge",
	  "Quota of the service's shared region bytes (0 = none).",
	  svc_region_limit },
	{ PROM_SERVICE, "gpucmd_service_region_refusals_total", "counter",
	  "Region attaches refused over the service's region_limit.",
	  svc_region_refusals },
	{ PROM_STREAM, "gpucmd_stream_bytes_in_use", "gauge",
	  "Bytes the stream's live allocations asked for.", str_in_use },
	{ PROM_STREAM, "gpucmd_stream_bytes_reserved", "gauge",
	  "Bytes held from the device by the stream's pools.", str_reserved },
	{ PROM_STREAM, "gpucmd_stream_bytes_padding", "gauge",
	  "Alignment padding of the stream's live allocations.", str_padding },
	{ PROM_STREAM, "gpucmd_stream_allocations", "gauge",
	  "Live allocations of the stream.", str_allocations },
	{ PROM_STREAM, "gpucmd_stream_fragmentation_ratio", "gauge",
	  "1 - largest free block / (reserved - in use - padding).",
	  str_fragmentation },
	{ PROM_POOL, "gpucmd_pool_page_size_bytes", "gauge",
	  "Page size of the pool (exclusive: its largest allocation).",
	  pool_page_size },
	{ PROM_POOL, "gpucmd_pool_pages", "gauge",
	  "Device allocations the pool holds.", pool_pages },
	{ PROM_POOL, "gpucmd_pool_bytes_in_use", "gauge",
	  "Bytes the pool's live allocations asked for.", pool_in_use },
	{ PROM_POOL, "gpucmd_pool_bytes_reserved", "gauge",
	  "Bytes the pool holds from the device.", pool_reserved },
	{ PROM_POOL, "gpucmd_pool_bytes_padding", "gauge",
	  "Alignment padding of the pool's live allocations.", pool_padding },
	{ PROM_POOL, "gpucmd_pool_allocations", "gauge",
	  "Live allocations in the pool.", pool_allocations },
	{ PROM_POOL, "gpucmd_pool_largest_free_bytes", "gauge",
	  "Largest free block the pool holds.", pool_largest_free },
	{ PROM_POOL, "gpucmd_pool_fragmentation_ratio", "gauge",
	  "1 - largest free block / (reserved - in use - padding).",
	  pool_fragmentation },
};

static void prom_sample(const struct prom_metric *m, const struct prom_at *at)
{
	char num[24];
	struct prom_value v = m->get(at);

	printf("%s{", m->name);
	prom_label("service", at->sv->s->name, 1);
	if (m->level >= PROM_STREAM) {
		snprintf(num, sizeof(num), "%" PRIu64, at->sr->connection_id);
		prom_label("connection", num, 0);
		snprintf(num, sizeof(num), "%u", at->sr->stream);
		prom_label("stream", num, 0);
	}
	if (m->level == PROM_POOL) {
		snprintf(num, sizeof(num), "%zu", at->pool);
		prom_label("pool", num, 0);
		prom_label("kind", pool_at(at)->kind, 0);
	}
	printf("}");
	prom_value(&v);
}

static void report_prometheus(const struct report_view *v)
{
	const struct gpucmd_report *rep = v->rep;

	prom_family("gpucmd_device_memory_bytes", "gauge",
		    "Total memory of the device.");
	printf("gpucmd_device_memory_bytes{");
	prom_label("device", rep->device_name, 1);
	prom_label("backend", rep->backend, 0);
	prom_label("uuid", rep->device_uuid, 0);
	printf("} %" PRIu64 "\n", rep->device_total_memory);
	if (rep->has_device_free_memory) {
		prom_family("gpucmd_device_free_memory_bytes", "gauge",
			    "Free memory of the device.");
		printf("gpucmd_device_free_memory_bytes{");
		prom_label("device", rep->device_name, 1);
		prom_label("backend", rep->backend, 0);
		prom_label("uuid", rep->device_uuid, 0);
		printf("} %" PRIu64 "\n", rep->device_free_memory);
	}
	if (rep->has_pinned_host) {
		prom_family("gpucmd_daemon_pinned_host_bytes", "gauge",
			    "The daemon's own pinned host pool.");
		printf("gpucmd_daemon_pinned_host_bytes{state=\"reserved\"} %" PRIu64
		       "\n",
		       rep->pinned_host.bytes_reserved);
		printf("gpucmd_daemon_pinned_host_bytes{state=\"in_use\"} %" PRIu64
		       "\n",
		       rep->pinned_host.bytes_in_use);
	}
	for (size_t k = 0; k < sizeof(prom_metrics) / sizeof(prom_metrics[0]);
	     k++) {
		const struct prom_metric *m = &prom_metrics[k];

		prom_family(m->name, m->type, m->help);
		for (size_t i = 0; i < v->n; i++) {
			struct prom_at at = { .sv = &v->services[i] };
			const struct gpucmd_service_report *s = at.sv->s;

			if (m->level == PROM_SERVICE) {
				prom_sample(m, &at);
				continue;
			}
			for (size_t j = 0; j < s->nstreams; j++) {
				at.sr = &s->streams[j];
				if (m->level == PROM_STREAM) {
					prom_sample(m, &at);
					continue;
				}
				for (at.pool = 0; at.pool < at.sr->npools;
				     at.pool++)
					prom_sample(m, &at);
			}
		}
	}
}

/* ---- the command ----------------------------------------------------------- */

static volatile sig_atomic_t watch_stop;
static struct timespec watch_stop_at;

/*
 * The first SIGINT or SIGTERM asks the loop to stop after this report; one
 * that comes half a second later or more ends the tool even while a daemon
 * that stopped answering keeps it waiting inside the library.  One sent
 * twice at once (timeout(1) signals the command and its process group)
 * still stops it cleanly.
 */
static void on_interrupt(int sig)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	if (!watch_stop) {
		watch_stop_at = now;
		watch_stop = 1;
		return;
	}
	if ((now.tv_sec - watch_stop_at.tv_sec) * 1000000000L +
		    (now.tv_nsec - watch_stop_at.tv_nsec) >=
	    500000000L) {
		signal(sig, SIG_DFL);
		raise(sig);
	}
}

/* Sleep for seconds, or until SIGINT or SIGTERM. */
static void watch_sleep(double seconds)
{
	struct timespec ts = {
		.tv_sec = (time_t)seconds,
		.tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9),
	};

	while (!watch_stop && nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* One report, printed the way o asks. */
static int report_once(struct gpucmd_conn *conn, const struct report_opts *o)
{
	struct gpucmd_report *rep;
	struct report_view v;
	int r;

	r = gpucmd_memory_report(conn, &rep);
	if (r < 0)
		return tool_fail_conn("memory-report", r, conn);
	if (view_build(rep, o, &v) < 0) {
		gpucmd_report_free(rep);
		fprintf(stderr, "gpucmd: memory-report: out of memory\n");
		return TOOL_EXIT_FAIL;
	}
	if (o->service != NULL && v.n == 0) {
		fprintf(stderr,
			"gpucmd: memory-report: no service '%s' in "
			"the report (unknown to the daemon, or not visible to "
			"this user)\n",
			o->service);
		r = TOOL_EXIT_FAIL;
	} else if (o->json) {
		report_json(&v);
		r = TOOL_EXIT_OK;
	} else if (o->prometheus) {
		report_prometheus(&v);
		r = TOOL_EXIT_OK;
	} else {
		r = report_text(&v, o);
	}
	free(v.services);
	gpucmd_report_free(rep);
	fflush(stdout);
	return r;
}

static int report_args(int argc, char **argv, struct report_opts *o)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "prometheus", no_argument, NULL, 'p' },
		{ "bytes", no_argument, NULL, 'b' },
		{ "streams", no_argument, NULL, 's' },
		{ "pools", no_argument, NULL, 'P' },
		{ "service", required_argument, NULL, 'S' },
		{ "watch", required_argument, NULL, 'w' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	char *end;
	int c;

	while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
		switch (c) {
		case 'j':
			o->json = 1;
			break;
		case 'p':
			o->prometheus = 1;
			break;
		case 'b':
			o->exact = 1;
			break;
		case 's':
			o->streams = 1;
			break;
		case 'P':
			o->pools = 1;
			break;
		case 'S':
			o->service = optarg;
			break;
		case 'w':
			errno = 0;
			o->watch = strtod(optarg, &end);
			if (*optarg == '\0' || *end != '\0' || errno != 0 ||
			    !(o->watch >= 0.1 && o->watch <= 86400))
				return tool_usage(argv[0], report_usage,
						  TOOL_EXIT_USAGE,
						  "--watch takes seconds from "
						  "0.1 to 86400, not '%s'",
						  optarg);
			break;
		case 'h':
			return tool_usage(argv[0], report_usage, TOOL_EXIT_OK,
					  NULL);
		default:
			return tool_usage(argv[0], report_usage,
					  TOOL_EXIT_USAGE, NULL);
		}
	}
	if (optind < argc)
		return tool_usage(argv[0], report_usage, TOOL_EXIT_USAGE,
				  "unexpected argument '%s'", argv[optind]);
	if (o->json && o->prometheus)
		return tool_usage(argv[0], report_usage, TOOL_EXIT_USAGE,
				  "--json and --prometheus exclude each other");
	return -1;
}

int cmd_memory_report(const struct tool_opts *opts, int argc, char **argv)
{
	struct report_opts o = { 0 };
	struct sigaction sa = { .sa_handler = on_interrupt };
	struct gpucmd_conn *conn;
	int tty, r;

	r = report_args(argc, argv, &o);
	if (r >= 0)
		return r;
	/*
	 * Expositions one after the other repeat every metric family, which
	 * no Prometheus reader takes from a file or a pipe.
	 */
	if (o.watch != 0 && o.prometheus && !isatty(STDOUT_FILENO))
		return tool_usage(
			argv[0], report_usage, TOOL_EXIT_USAGE,
			"--prometheus --watch into a file or a pipe "
			"would repeat every metric: run memory-report "
			"--prometheus once per scrape, writing a "
			"temporary file and renaming it (gpucmd(1), "
			"EXAMPLES)");
	r = tool_observe(opts, &conn);
	if (r != 0)
		return r;
	if (o.watch == 0) {
		r = report_once(conn, &o);
		gpucmd_close(conn);
		return r;
	}
	/* No SA_RESTART: the signal must cut the sleep short. */
	sa.sa_flags = 0;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	tty = isatty(STDOUT_FILENO);
	for (int first = 1; !watch_stop; first = 0) {
		/* Home and clear only on a terminal; a file gets every frame. */
		if (tty)
			printf("\033[H\033[2J");
		else if (!first && !o.json && !o.prometheus)
			printf("\n");
		r = report_once(conn, &o);
		if (r != TOOL_EXIT_OK)
			break;
		/* A reader that went away (a closed pipe, a full disk). */
		if (fflush(stdout) != 0 || ferror(stdout))
			break; /* main says so and exits 1 */
		watch_sleep(o.watch);
	}
	gpucmd_close(conn);
	return r;
}
