/*
 * cmd_status.c - gpucmd status: what the daemon says about itself (one
 * OpStatus round trip) and what its Welcome said about this connection,
 * as text for people or as one JSON object for scripts.
 *
 * The connection's limits are shown because they are what a client runs
 * into (frame size, ops per batch, requests in flight), and the Welcome is
 * the only place they are visible from outside the daemon's config.
 */
#include <inttypes.h>
#include <stdio.h>

#include "cmd.h"

static const char status_usage[] = "usage: gpucmd status [--json]\n"
				   "  --json  print one JSON object\n";

/* "3d 04:05:06" for long uptimes, "04:05:06" otherwise. */
static void print_uptime(uint64_t ms)
{
	uint64_t s = ms / 1000;

	if (s >= 86400)
		printf("%" PRIu64 "d ", s / 86400);
	printf("%02" PRIu64 ":%02" PRIu64 ":%02" PRIu64 "\n", s / 3600 % 24,
	       s / 60 % 60, s % 60);
}

static void status_text(const struct gpucmd_status *st,
			const struct gpucmd_info *in)
{
	char a[TOOL_SIZE_LEN], b[TOOL_SIZE_LEN], c[TOOL_SIZE_LEN];

	printf("gpucmdd %s, protocol %u\n", st->version, in->protocol_version);
	printf("device       %s, %s backend, %s\n", st->device_name,
	       st->backend,
	       tool_size(st->device_total_memory, 0, a, sizeof(a)));
	/* What nvidia-smi -L and -q call it: the host backend has none. */
	if (in->device_uuid[0] != '\0' || in->device_pci_bus_id[0] != '\0')
		printf("gpu          %s, PCI %s\n",
		       in->device_uuid[0] ? in->device_uuid : "(no UUID)",
		       in->device_pci_bus_id[0] ? in->device_pci_bus_id :
						  "(unknown)");
	printf("uptime       ");
	print_uptime(st->uptime_ms);
	printf("services     %u\n", st->services);
	printf("connections  %u\n", st->connections);
	printf("batches      %" PRIu64 "\n", st->batches);
	printf("memory       %s in use, %s reserved\n",
	       tool_size(st->bytes_in_use, 0, a, sizeof(a)),
	       tool_size(st->bytes_reserved, 0, b, sizeof(b)));
	/*
	 * An admin observes (GPUCMD_CONNECT_OBSERVE): service id 0, and no
	 * service whose quotas it could be told.
	 */
	if (in->service_id == 0) {
		printf("this client  an observer in no service, connection %" PRIu64
		       "\n",
		       in->connection_id);
		printf("limits       ");
	} else {
		printf("this client  service %s (id %u), connection %" PRIu64
		       "\n",
		       in->service, in->service_id, in->connection_id);
		printf("limits       memory %s, regions %s, ",
		       in->memory_limit != 0 ?
			       tool_size(in->memory_limit, 0, a, sizeof(a)) :
			       "unlimited",
		       in->region_limit != 0 ?
			       tool_size(in->region_limit, 0, c, sizeof(c)) :
			       "unlimited");
	}
	printf("streams %u, ops per batch %u, frame %s, in flight %u\n",
	       in->max_streams, in->max_ops_per_batch,
	       tool_size(in->max_frame_bytes, 0, b, sizeof(b)),
	       in->max_in_flight);
}

static void status_json(const struct gpucmd_status *st,
			const struct gpucmd_info *in)
{
	printf("{\"version\":");
	tool_json_string(stdout, st->version);
	printf(",\"protocol_version\":%u,\"backend\":", in->protocol_version);
	tool_json_string(stdout, st->backend);
	printf(",\"device_name\":");
	tool_json_string(stdout, st->device_name);
	printf(",\"device_uuid\":");
	tool_json_string(stdout, in->device_uuid);
	printf(",\"device_pci_bus_id\":");
	tool_json_string(stdout, in->device_pci_bus_id);
	printf(",\"device_total_memory\":%" PRIu64 ",\"uptime_ms\":%" PRIu64
	       ",\"services\":%u,\"connections\":%u,\"batches\":%" PRIu64
	       ",\"bytes_in_use\":%" PRIu64 ",\"bytes_reserved\":%" PRIu64,
	       st->device_total_memory, st->uptime_ms, st->services,
	       st->connections, st->batches, st->bytes_in_use,
	       st->bytes_reserved);
	printf(",\"client\":{\"observer\":%s,\"service\":",
	       in->service_id == 0 ? "true" : "false");
	tool_json_string(stdout, in->service);
	printf(",\"service_id\":%u,\"connection_id\":%" PRIu64, in->service_id,
	       in->connection_id);
	/* An observer has no service, so no quota (0 would read unlimited). */
	if (in->service_id == 0)
		printf(",\"memory_limit\":null,\"region_limit\":null");
	else
		printf(",\"memory_limit\":%" PRIu64
		       ",\"region_limit\":%" PRIu64,
		       in->memory_limit, in->region_limit);
	printf(",\"max_streams\":%u,\"max_ops_per_batch\":%u"
	       ",\"max_frame_bytes\":%u,\"max_in_flight\":%u}}\n",
	       in->max_streams, in->max_ops_per_batch, in->max_frame_bytes,
	       in->max_in_flight);
}

int cmd_status(const struct tool_opts *o, int argc, char **argv)
{
	struct gpucmd_conn *conn;
	struct gpucmd_status st;
	struct gpucmd_info info;
	int json = 0;
	int r;

	r = tool_flags(argc, argv, status_usage, &json, NULL);
	if (r >= 0)
		return r;
	r = tool_observe(o, &conn);
	if (r != 0)
		return r;
	info = *gpucmd_info(conn);
	r = gpucmd_status(conn, &st);
	if (r < 0) {
		r = tool_fail_conn("status", r, conn);
		gpucmd_close(conn);
		return r;
	}
	gpucmd_close(conn);
	if (json)
		status_json(&st, &info);
	else
		status_text(&st, &info);
	return TOOL_EXIT_OK;
}
