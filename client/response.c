/*
 * response.c - reading a collected response, and the library calls that
 * are a round trip of their own (memory report, status, evict, cleanup)
 * and convert the daemon's answer into the plain structs of gpucmd.h.
 *
 * A response keeps the decoded frame and the accessors read it in place,
 * so read data is not copied a second time; it lives until
 * gpucmd_response_free.
 */
#include "response.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "connection.h"
#include "frame.h"

struct gpucmd_response {
	Gpucmd__Frame *frame;
	const Gpucmd__Response *r; /* frame->response */
};

int response_new(Gpucmd__Frame *frame, struct gpucmd_response **out)
{
	struct gpucmd_response *resp;

	if (frame->msg_case != GPUCMD__FRAME__MSG_RESPONSE)
		return GPUCMD_EPROTO;
	resp = malloc(sizeof(*resp));
	if (resp == NULL)
		return -ENOMEM;
	resp->frame = frame;
	resp->r = frame->response;
	*out = resp;
	return 0;
}

GPUCMD_EXTERN void gpucmd_response_free(struct gpucmd_response *resp)
{
	if (resp == NULL)
		return;
	frame_free(resp->frame);
	free(resp);
	/* Its buffer went to the pool, which no connection will trim now. */
	if (conn_none_open())
		frame_buf_trim(0);
}

GPUCMD_EXTERN int gpucmd_response_error(const struct gpucmd_response *resp)
{
	const Gpucmd__Error *e = resp->r->error;

	if (e == NULL)
		return 0;
	/* An error without a code still failed; say the daemon misspoke. */
	return e->code < 0 ? e->code : GPUCMD_EPROTO;
}

GPUCMD_EXTERN const char *
gpucmd_response_message(const struct gpucmd_response *resp)
{
	const Gpucmd__Error *e = resp->r->error;

	return e != NULL && e->message != NULL ? e->message : "";
}

GPUCMD_EXTERN int
gpucmd_response_failed_index(const struct gpucmd_response *resp)
{
	return resp->r->error != NULL ? (int)resp->r->failed_index : -1;
}

GPUCMD_EXTERN size_t gpucmd_response_count(const struct gpucmd_response *resp)
{
	return resp->r->n_results;
}

/* Result i when it is of the kind wanted, else NULL. */
static const Gpucmd__OpResult *result_at(const struct gpucmd_response *resp,
					 size_t i,
					 Gpucmd__OpResult__ResultCase kind)
{
	const Gpucmd__OpResult *res;

	if (resp == NULL || i >= resp->r->n_results)
		return NULL;
	res = resp->r->results[i];
	return res->result_case == kind ? res : NULL;
}

GPUCMD_EXTERN int gpucmd_response_data(const struct gpucmd_response *resp,
				       size_t i, const void **data, size_t *len)
{
	const Gpucmd__OpResult *res =
		result_at(resp, i, GPUCMD__OP_RESULT__RESULT_DATA);

	if (res == NULL || data == NULL || len == NULL)
		return GPUCMD_EINVAL;
	*data = res->data.data;
	*len = res->data.len;
	return 0;
}

GPUCMD_EXTERN int gpucmd_response_region(const struct gpucmd_response *resp,
					 size_t i, uint64_t *region,
					 uint64_t *offset, uint64_t *len)
{
	const Gpucmd__OpResult *res =
		result_at(resp, i, GPUCMD__OP_RESULT__RESULT_REGION);

	if (res == NULL || res->region == NULL || region == NULL ||
	    offset == NULL || len == NULL)
		return GPUCMD_EINVAL;
	*region = res->region->region;
	*offset = res->region->offset;
	*len = res->region->length;
	return 0;
}

static void usage_from_wire(struct gpucmd_memory_usage *out,
			    const Gpucmd__MemoryUsage *u)
{
	memset(out, 0, sizeof(*out));
	if (u == NULL)
		return;
	out->allocations = u->allocations;
	out->bytes_in_use = u->bytes_in_use;
	out->bytes_padding = u->bytes_padding;
	out->bytes_reserved = u->bytes_reserved;
}

GPUCMD_EXTERN int gpucmd_response_usage(const struct gpucmd_response *resp,
					size_t i,
					struct gpucmd_memory_usage *out)
{
	const Gpucmd__OpResult *res =
		result_at(resp, i, GPUCMD__OP_RESULT__RESULT_USAGE);

	if (res == NULL || out == NULL)
		return GPUCMD_EINVAL;
	usage_from_wire(out, res->usage);
	return 0;
}

GPUCMD_EXTERN int gpucmd_response_value(const struct gpucmd_response *resp,
					size_t i, uint64_t *out)
{
	const Gpucmd__OpResult *res =
		result_at(resp, i, GPUCMD__OP_RESULT__RESULT_VALUE);

	if (res == NULL || out == NULL)
		return GPUCMD_EINVAL;
	*out = res->value;
	return 0;
}

GPUCMD_EXTERN int gpucmd_response_profile(const struct gpucmd_response *resp,
					  size_t i, struct gpucmd_profile *out)
{
	const Gpucmd__OpResult *res =
		result_at(resp, i, GPUCMD__OP_RESULT__RESULT_PROFILE);
	const Gpucmd__Profile *p;

	if (res == NULL || out == NULL || res->profile == NULL)
		return GPUCMD_EINVAL;
	p = res->profile;
	out->device_ms = p->device_ms;
	out->valid = p->valid ? 1 : 0;
	/* An invalid profile always says why, if only that it is. */
	if (p->reason != NULL && p->reason[0] != '\0')
		out->reason = p->reason;
	else
		out->reason = p->valid ? "" : "invalid";
	return 0;
}

GPUCMD_EXTERN int gpucmd_response_cpu(const struct gpucmd_response *resp,
				      size_t i, struct gpucmd_cpu_buffer *out)
{
	const Gpucmd__OpResult *res =
		result_at(resp, i, GPUCMD__OP_RESULT__RESULT_CPU);

	if (res == NULL || out == NULL || res->cpu == NULL)
		return GPUCMD_EINVAL;
	out->size = res->cpu->size;
	out->pinned = res->cpu->pinned ? 1 : 0;
	return 0;
}

static void pool_from_wire(struct gpucmd_pool_report *out,
			   const Gpucmd__PoolReport *p)
{
	memset(out, 0, sizeof(*out));
	snprintf(out->kind, sizeof(out->kind), "%s", p->kind);
	out->page_size = p->page_size;
	out->max_slice = p->max_slice;
	out->pages = p->pages;
	out->pages_peak = p->pages_peak;
	usage_from_wire(&out->usage, p->usage);
	out->largest_alloc = p->largest_alloc;
	out->largest_free = p->largest_free;
}

/*
 * Fill out from a wire stream report; its pools go into an array of their
 * own (NULL when there are none), which the caller frees.
 */
static int stream_from_wire(struct gpucmd_stream_report *out,
			    const Gpucmd__StreamReport *s)
{
	memset(out, 0, sizeof(*out));
	out->connection_id = s->connection_id;
	out->stream = s->stream;
	out->closing = s->closing;
	usage_from_wire(&out->usage, s->usage);
	if (s->n_pools == 0)
		return 0;
	out->pools = calloc(s->n_pools, sizeof(*out->pools));
	if (out->pools == NULL)
		return -ENOMEM;
	for (size_t p = 0; p < s->n_pools; p++)
		pool_from_wire(&out->pools[p], s->pools[p]);
	out->npools = s->n_pools;
	return 0;
}

GPUCMD_EXTERN int
gpucmd_response_stream_report(const struct gpucmd_response *resp, size_t i,
			      struct gpucmd_stream_report **out)
{
	const Gpucmd__OpResult *res =
		result_at(resp, i, GPUCMD__OP_RESULT__RESULT_STREAM_REPORT);
	struct gpucmd_stream_report *sr;
	int r;

	if (res == NULL || out == NULL || res->stream_report == NULL)
		return GPUCMD_EINVAL;
	sr = malloc(sizeof(*sr));
	if (sr == NULL)
		return -ENOMEM;
	r = stream_from_wire(sr, res->stream_report);
	if (r < 0) {
		free(sr);
		return r;
	}
	*out = sr;
	return 0;
}

GPUCMD_EXTERN void gpucmd_stream_report_free(struct gpucmd_stream_report *sr)
{
	if (sr == NULL)
		return;
	free(sr->pools);
	free(sr);
}

/*
 * Run b, a batch of one op on conn, and hand back the response with its
 * result, which must be of kind want.  The caller frees *resp.  The
 * daemon's reason for a refusal stays for gpucmd_last_message.
 */
static int query_run(struct gpucmd_conn *conn, struct gpucmd_batch *b,
		     Gpucmd__OpResult__ResultCase want,
		     struct gpucmd_response **resp,
		     const Gpucmd__OpResult **res)
{
	struct gpucmd_response *got;
	int r;

	conn_set_message(conn, "");
	r = gpucmd_run(b, &got);
	if (r < 0)
		return r;
	r = gpucmd_response_error(got);
	if (r < 0)
		conn_set_message(conn, gpucmd_response_message(got));
	if (r == 0) {
		*res = result_at(got, 0, want);
		if (*res == NULL)
			r = GPUCMD_EPROTO;
	}
	if (r < 0) {
		gpucmd_response_free(got);
		return r;
	}
	*resp = got;
	return 0;
}

/* query_run for a batch of the single field-less op kind. */
static int query(struct gpucmd_conn *conn, Gpucmd__Op__OpCase kind,
		 Gpucmd__OpResult__ResultCase want,
		 struct gpucmd_response **resp, const Gpucmd__OpResult **res)
{
	struct gpucmd_batch *b;
	int r;

	r = gpucmd_batch_new(conn, 0, &b);
	if (r < 0)
		return r;
	r = batch_add_plain(b, kind);
	if (r < 0) {
		gpucmd_batch_free(b);
		return r;
	}
	return query_run(conn, b, want, resp, res);
}

/* Fill out from s; with streams, also its streams (the totals have none). */
static int service_from_wire(struct gpucmd_service_report *out,
			     const Gpucmd__ServiceReport *s, int streams)
{
	struct gpucmd_memory_usage u;

	memset(out, 0, sizeof(*out));
	if (s == NULL)
		return 0;
	usage_from_wire(&u, s->usage);
	snprintf(out->name, sizeof(out->name), "%s", s->name);
	out->id = s->id;
	out->connections = s->connections;
	out->bytes_in_use = u.bytes_in_use;
	out->bytes_reserved = u.bytes_reserved;
	out->bytes_padding = u.bytes_padding;
	out->allocations = u.allocations;
	out->peak_bytes_in_use = s->peak_bytes_in_use;
	out->limit_bytes = s->limit_bytes;
	out->oom_count = s->oom_count;
	out->region_bytes = s->region_bytes;
	out->regions = s->regions;
	out->region_limit = s->region_limit;
	out->region_refusals = s->region_refusals;
	out->bytes_released_pending = s->bytes_released_pending;
	out->modules = s->modules;
	out->max_modules = s->max_modules;
	out->module_bytes = s->module_bytes;
	if (s->last_refusal != NULL) {
		const Gpucmd__Refusal *r = s->last_refusal;

		out->last_refusal.unix_ms = r->unix_ms;
		out->last_refusal.size = r->size;
		out->last_refusal.connection_id = r->connection_id;
		out->last_refusal.stream = r->stream;
		out->last_refusal.code = r->code;
		snprintf(out->last_refusal.message,
			 sizeof(out->last_refusal.message), "%s",
			 r->message != NULL ? r->message : "");
	}
	out->shared_buffers = s->shared_buffers;
	out->shared_buffer_bytes = s->shared_buffer_bytes;
	if (streams && s->n_shared > 0) {
		out->shared = calloc(s->n_shared, sizeof(*out->shared));
		if (out->shared == NULL)
			return -ENOMEM;
		for (size_t i = 0; i < s->n_shared; i++) {
			const Gpucmd__SharedBuffer *w = s->shared[i];
			struct gpucmd_shared_buffer *o = &out->shared[i];

			if (w == NULL)
				continue;
			snprintf(o->name, sizeof(o->name), "%s",
				 w->name != NULL ? w->name : "");
			o->bytes = w->bytes;
			o->handles = w->handles;
			o->connection_id = w->connection_id;
			o->imports = w->imports;
			o->ready = w->ready;
			o->sharer_open = w->sharer_open;
			o->lost = w->lost;
		}
		out->nshared = s->n_shared;
	}
	if (!streams || s->n_streams == 0)
		return 0;
	out->streams = calloc(s->n_streams, sizeof(*out->streams));
	if (out->streams == NULL)
		return -ENOMEM;
	/* Counted as they are filled, so a failure frees only what exists. */
	for (size_t i = 0; i < s->n_streams; i++) {
		int r = stream_from_wire(&out->streams[i], s->streams[i]);

		if (r < 0)
			return r;
		out->nstreams++;
	}
	return 0;
}

/* Totals for a daemon that sent none: sums, and no limit. */
static void add_totals(struct gpucmd_report *rep)
{
	struct gpucmd_service_report *t = &rep->totals;

	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "total");
	for (size_t i = 0; i < rep->nservices; i++) {
		const struct gpucmd_service_report *s = &rep->services[i];

		t->connections += s->connections;
		t->bytes_in_use += s->bytes_in_use;
		t->bytes_reserved += s->bytes_reserved;
		t->bytes_padding += s->bytes_padding;
		t->allocations += s->allocations;
		t->peak_bytes_in_use += s->peak_bytes_in_use;
		t->oom_count += s->oom_count;
		t->region_bytes += s->region_bytes;
		t->regions += s->regions;
		t->region_refusals += s->region_refusals;
		t->bytes_released_pending += s->bytes_released_pending;
		t->modules += s->modules;
		t->shared_buffers += s->shared_buffers;
		t->shared_buffer_bytes += s->shared_buffer_bytes;
	}
}

GPUCMD_EXTERN int gpucmd_memory_report(struct gpucmd_conn *conn,
				       struct gpucmd_report **out)
{
	struct gpucmd_response *resp;
	const Gpucmd__OpResult *res;
	const Gpucmd__MemoryReport *m;
	struct gpucmd_report *rep;
	int r;

	if (conn == NULL || out == NULL)
		return GPUCMD_EINVAL;
	r = query(conn, GPUCMD__OP__OP_MEMORY_REPORT,
		  GPUCMD__OP_RESULT__RESULT_REPORT, &resp, &res);
	if (r < 0)
		return r;
	m = res->report;
	rep = calloc(1, sizeof(*rep));
	if (rep != NULL && m->n_services > 0) {
		rep->services = calloc(m->n_services, sizeof(*rep->services));
		if (rep->services == NULL) {
			free(rep);
			rep = NULL;
		}
	}
	if (rep == NULL) {
		gpucmd_response_free(resp);
		return -ENOMEM;
	}
	if (m->device != NULL) {
		snprintf(rep->device_name, sizeof(rep->device_name), "%s",
			 m->device->name);
		snprintf(rep->backend, sizeof(rep->backend), "%s",
			 m->device->backend);
		rep->device_total_memory = m->device->total_memory;
		rep->device_free_memory = m->device->free_memory;
		rep->has_device_free_memory = m->device->free_memory_known;
		snprintf(rep->device_uuid, sizeof(rep->device_uuid), "%s",
			 m->device->uuid);
		snprintf(rep->device_pci_bus_id, sizeof(rep->device_pci_bus_id),
			 "%s", m->device->pci_bus_id);
	}
	if (m->pinned_host != NULL) {
		rep->has_pinned_host = 1;
		rep->pinned_host.allocations = m->pinned_host->allocations;
		rep->pinned_host.bytes_in_use = m->pinned_host->bytes_in_use;
		rep->pinned_host.bytes_padding = m->pinned_host->bytes_padding;
		rep->pinned_host.bytes_reserved =
			m->pinned_host->bytes_reserved;
	}
	/* Counted as they are filled, so gpucmd_report_free frees what is. */
	for (size_t i = 0; r == 0 && i < m->n_services; i++) {
		r = service_from_wire(&rep->services[i], m->services[i], 1);
		rep->nservices++;
	}
	if (m->totals != NULL)
		service_from_wire(&rep->totals, m->totals, 0);
	else
		add_totals(rep);
	gpucmd_response_free(resp);
	if (r < 0) {
		gpucmd_report_free(rep);
		return r;
	}
	*out = rep;
	return 0;
}

GPUCMD_EXTERN void gpucmd_report_free(struct gpucmd_report *rep)
{
	if (rep == NULL)
		return;
	for (size_t i = 0; i < rep->nservices; i++) {
		struct gpucmd_service_report *s = &rep->services[i];

		for (size_t j = 0; j < s->nstreams; j++)
			free(s->streams[j].pools);
		free(s->streams);
		free(s->shared);
	}
	free(rep->services);
	free(rep);
}

GPUCMD_EXTERN int gpucmd_status(struct gpucmd_conn *conn,
				struct gpucmd_status *out)
{
	struct gpucmd_response *resp;
	const Gpucmd__OpResult *res;
	const Gpucmd__Status *s;
	struct gpucmd_memory_usage u;
	struct gpucmd_status st;
	int r;

	if (conn == NULL || out == NULL)
		return GPUCMD_EINVAL;
	r = query(conn, GPUCMD__OP__OP_STATUS, GPUCMD__OP_RESULT__RESULT_STATUS,
		  &resp, &res);
	if (r < 0)
		return r;
	s = res->status;
	memset(&st, 0, sizeof(st));
	snprintf(st.version, sizeof(st.version), "%s", s->version);
	if (s->device != NULL) {
		snprintf(st.backend, sizeof(st.backend), "%s",
			 s->device->backend);
		snprintf(st.device_name, sizeof(st.device_name), "%s",
			 s->device->name);
		st.device_total_memory = s->device->total_memory;
	}
	st.uptime_ms = s->uptime_ms;
	st.services = s->services;
	st.connections = s->connections;
	st.batches = s->batches;
	usage_from_wire(&u, s->usage);
	st.bytes_in_use = u.bytes_in_use;
	st.bytes_reserved = u.bytes_reserved;
	gpucmd_response_free(resp);
	*out = st;
	return 0;
}

/*
 * Run b, whose one op (queued with the result added, a negative code when
 * that failed) answers with a value, and store the value in *out.
 */
static int run_value(struct gpucmd_conn *conn, struct gpucmd_batch *b,
		     int added, uint64_t *out)
{
	struct gpucmd_response *resp;
	const Gpucmd__OpResult *res;
	int r;

	if (added < 0) {
		gpucmd_batch_free(b);
		return added;
	}
	r = query_run(conn, b, GPUCMD__OP_RESULT__RESULT_VALUE, &resp, &res);
	if (r < 0)
		return r;
	*out = res->value;
	gpucmd_response_free(resp);
	return 0;
}

GPUCMD_EXTERN int gpucmd_evict(struct gpucmd_conn *conn, const char *service,
			       uint64_t connection_id, uint64_t *count)
{
	struct gpucmd_batch *b;
	int r;

	if (conn == NULL || count == NULL ||
	    ((service == NULL || service[0] == '\0') && connection_id == 0))
		return GPUCMD_EINVAL;
	r = gpucmd_batch_new(conn, 0, &b);
	if (r < 0)
		return r;
	return run_value(conn, b, batch_add_evict(b, service, connection_id),
			 count);
}

GPUCMD_EXTERN int gpucmd_cleanup(struct gpucmd_conn *conn, const char *service,
				 uint64_t *bytes)
{
	struct gpucmd_batch *b;
	int r;

	if (conn == NULL || bytes == NULL)
		return GPUCMD_EINVAL;
	r = gpucmd_batch_new(conn, 0, &b);
	if (r < 0)
		return r;
	return run_value(conn, b, batch_add_cleanup(b, service), bytes);
}
