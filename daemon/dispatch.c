/*
 * dispatch.c - one function per wire op, each turning the op into Command
 * calls.  See dispatch.h.
 */
#include "dispatch.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver/kernels/builtin.h"
#include "executor.h"
#include "frame.h"
#include "graph.h"
#include "module.h"
#include "module_image.h"
#include "region.h"
#include "gpucmd.h"
#include "memory/drop_queue.h"
#include "memory/handle.h"
#include "memory/pinned.h"
#include "memory/shared_buffer.h"
#include "service.h"
#include "streams.h"

/* ---- a per-batch arena for result sub-messages --------------------------- */

struct arena_block {
	struct arena_block *next;
	max_align_t data[];
};

static void *arena_alloc(struct batch *b, size_t size)
{
	struct arena_block *blk = calloc(1, sizeof(*blk) + size);

	if (blk == NULL)
		return NULL;
	blk->next = b->arena;
	b->arena = blk;
	return blk->data;
}

static void arena_free(struct batch *b)
{
	struct arena_block *blk = b->arena;

	while (blk != NULL) {
		struct arena_block *next = blk->next;
		free(blk);
		blk = next;
	}
	b->arena = NULL;
}

/* ---- helpers -------------------------------------------------------------- */

/*
 * Replies obey the connection's max_frame_bytes like requests do: the read
 * data of one batch may fill a frame less this much room for the rest.
 */
#define REPLY_ROOM 4096u

/* Set the batch's message; the op's code is the return value. */
static int fail(struct batch *b, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail(struct batch *b, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b->message, sizeof(b->message), fmt, ap);
	va_end(ap);
	return rc;
}

/* The most of the batch's reply its read data and reports may fill. */
static uint64_t reply_cap(const struct batch *b)
{
	uint32_t max = b->conn->limits.max_frame_bytes;

	return max > REPLY_ROOM ? max - REPLY_ROOM : 0;
}

/* Whether bytes more would take the reply past reply_cap. */
static bool reply_over(const struct batch *b, uint64_t bytes)
{
	uint64_t cap = reply_cap(b);

	return bytes > cap || b->reply_bytes > cap - bytes;
}

/*
 * Report ops (memory_report, stream_report, status) one batch may carry:
 * each walks the daemon's streams on the device thread and builds its
 * answer in the batch's arena, so a request full of them (a few bytes
 * each) held the device thread, and every service, for seconds and made
 * the daemon build gigabytes.
 */
#define REPORTS_PER_BATCH_MAX 16

static int report_allowed(struct batch *b, const char *what)
{
	if (++b->reports <= REPORTS_PER_BATCH_MAX)
		return 0;
	return fail(b, GPUCMD_ELIMIT,
		    "this batch has more than %d report ops (%s is one of "
		    "memory_report, stream_report and status): ask again in "
		    "another batch",
		    REPORTS_PER_BATCH_MAX, what);
}

/*
 * A report of packed bytes joins the reply: within the frame the reply
 * may fill with the batch's reads (reply_cap), else GPUCMD_ELIMIT.
 */
static int report_fits(struct batch *b, const char *what, size_t bytes)
{
	uint64_t cap = reply_cap(b);

	if (reply_over(b, bytes))
		return fail(b, GPUCMD_ELIMIT,
			    "the %s of %zu bytes would make this batch's "
			    "reply %llu bytes, over the %llu that "
			    "max_frame_bytes allows: ask for it in a batch of "
			    "its own, or raise max_frame_bytes",
			    what, bytes,
			    (unsigned long long)(b->reply_bytes + bytes),
			    (unsigned long long)cap);
	b->reply_bytes += bytes;
	return 0;
}

static int lookup(struct batch *b, uint64_t id, struct handle **out)
{
	struct handle *h = handle_table_find(b->conn->set->handles, id);

	if (h == NULL)
		return fail(b, GPUCMD_ENOTFOUND,
			    "handle %llu names no live allocation on this "
			    "connection: allocate it first (empty/create) and "
			    "do not use it after release",
			    (unsigned long long)id);
	*out = h;
	return 0;
}

/* Resolve the streams over the bindings and build the op's Command. */
static int begin(struct command_ctx *ctx, struct batch *b,
		 const struct binding *bind, size_t n, struct command *cmd)
{
	struct resolved r;
	int rc;

	for (size_t i = 0; i < n; i++)
		if (bind[i].write && bind[i].handle->shared != NULL)
			return fail(b, GPUCMD_EINVAL,
				    "handle %llu names the buffer shared as "
				    "'%s', which is read-only for every "
				    "connection: write into a buffer of your "
				    "own, and pass shared ones to kernels as "
				    "buffer_in (gpucmd_arg_buffer_in)",
				    (unsigned long long)bind[i].handle->id,
				    bind[i].handle->shared->name);
	ctx->driver->error[0] = '\0';
	rc = streams_resolve(b->conn->set, b->stream, bind, n, &r);
	if (rc != 0)
		return fail(b, rc,
			    "cannot order stream %u behind the streams "
			    "that used its buffers: %s",
			    b->stream->number, ctx->driver->error);
	if (b->stream->recording != NULL &&
	    graph_record_op(b->stream->recording) != 0)
		return fail(b, GPUCMD_ELIMIT,
			    "this connection's graphs hold %u recorded ops, "
			    "the most a connection may: end the capture "
			    "sooner, or destroy graphs",
			    STREAMS_GRAPH_OPS_MAX);
	/* A recording keeps every buffer it touches alive. */
	for (size_t i = 0; b->stream->recording != NULL && i < n; i++)
		if (graph_hold(b->stream->recording, bind[i].handle) != 0)
			return fail(b, GPUCMD_ENOMEM, "out of host memory");
	command_init(cmd, ctx, &r, b->conn->service);
	return 0;
}

/* Ops whose results would belong to no replay are refused in a capture. */
static int not_while_capturing(struct batch *b, const char *what)
{
	if (!b->stream->capturing)
		return 0;
	return fail(b, GPUCMD_EINVAL,
		    "%s is not allowed while stream %u records a graph: do it "
		    "before capture_begin or after capture_end",
		    what, b->stream->number);
}

/* The Command's own sentence becomes the batch's. */
static int command_failed(struct batch *b, const struct command *cmd, int rc)
{
	if (rc != 0)
		snprintf(b->message, sizeof(b->message), "%s",
			 cmd->msg[0] ? cmd->msg : gpucmd_strerror(rc));
	return rc;
}

static int layout_descriptor(struct batch *b, uint64_t handle, uint64_t offset,
			     uint64_t len, const Gpucmd__CopyLayout *layout,
			     struct copy_descriptor *d)
{
	memset(d, 0, sizeof(*d));
	d->handle = handle;
	d->offset = offset;
	if (layout == NULL) {
		d->rank = 1;
		d->shape[0] = len;
		d->strides[0] = 1;
		d->elem_size = 1;
		return 0;
	}
	if (layout->n_shape == 0 || layout->n_shape > COMMAND_MAX_RANK ||
	    layout->n_shape != layout->n_strides)
		return fail(b, GPUCMD_EINVAL,
			    "a copy layout needs 1 to %d dimensions and one "
			    "stride per dimension (got %zu shape, %zu strides)",
			    COMMAND_MAX_RANK, layout->n_shape,
			    layout->n_strides);
	d->rank = (uint32_t)layout->n_shape;
	memcpy(d->shape, layout->shape, d->rank * sizeof(uint64_t));
	memcpy(d->strides, layout->strides, d->rank * sizeof(uint64_t));
	d->elem_size = layout->elem_size;
	return 0;
}

static int region_bytes(struct batch *b, const Gpucmd__RegionRef *ref,
			uint8_t **out);

/* An op's bytes: inline, or a range of a shared region (not both). */
static int payload(struct batch *b, const ProtobufCBinaryData *inline_data,
		   const Gpucmd__RegionRef *ref, const uint8_t **data,
		   size_t *len)
{
	uint8_t *p;
	int rc;

	*data = inline_data->data;
	*len = inline_data->len;
	if (ref == NULL)
		return 0;
	if (inline_data->len != 0)
		return fail(b, GPUCMD_EINVAL,
			    "an op carries either inline data or a region "
			    "range, not both");
	rc = region_bytes(b, ref, &p);
	if (rc != 0)
		return rc;
	*data = p;
	*len = (size_t)ref->length;
	return 0;
}

static void result_done(Gpucmd__OpResult *r)
{
	r->result_case = GPUCMD__OP_RESULT__RESULT_DONE;
	r->done = 1;
}

static void usage_to_wire(const struct memory_usage *u, Gpucmd__MemoryUsage *w)
{
	gpucmd__memory_usage__init(w);
	w->allocations = u->allocations;
	w->bytes_in_use = u->bytes_in_use;
	w->bytes_padding = u->bytes_padding;
	w->bytes_reserved = u->bytes_reserved;
}

/* ---- ops ------------------------------------------------------------------ */

static int op_empty(struct command_ctx *ctx, struct batch *b, size_t i,
		    const Gpucmd__OpEmpty *op)
{
	struct command cmd;
	int rc = begin(ctx, b, NULL, 0, &cmd);

	if (rc == 0)
		rc = command_failed(b, &cmd,
				    command_empty(&cmd, op->size, op->handle));
	if (rc == 0)
		result_done(&b->results[i]);
	return rc;
}

static int op_create(struct command_ctx *ctx, struct batch *b, size_t i,
		     const Gpucmd__OpCreateWithData *op)
{
	const uint8_t *data = op->data.data;
	size_t len = op->data.len;
	struct command cmd;
	int rc;

	rc = payload(b, &op->data, op->region, &data, &len);
	if (rc == 0)
		rc = begin(ctx, b, NULL, 0, &cmd);
	if (rc == 0)
		rc = command_failed(b, &cmd,
				    command_create_with_data(&cmd, data, len,
							     op->handle));
	if (rc == 0)
		result_done(&b->results[i]);
	return rc;
}

static int op_write(struct command_ctx *ctx, struct batch *b, size_t i,
		    const Gpucmd__OpWrite *op)
{
	struct copy_descriptor desc;
	struct binding bind;
	struct command cmd;
	const uint8_t *src;
	const void *data;
	size_t len;
	int rc;

	rc = lookup(b, op->handle, &bind.handle);
	if (rc == 0)
		rc = payload(b, &op->data, op->region, &src, &len);
	if (rc == 0)
		rc = layout_descriptor(b, op->handle, op->offset, len,
				       op->layout, &desc);
	if (rc != 0)
		return rc;
	bind.write = true;
	data = src;
	if (b->stream->recording != NULL) {
		/*
		 * Replays read these bytes long after the request (or the
		 * region) is gone: the graph keeps its own copy.
		 */
		uint64_t kept = b->conn->set->graph_bytes;
		void *copy;

		rc = graph_keep(b->stream->recording, src, len, &copy);
		if (rc == GPUCMD_ELIMIT)
			return fail(b, rc,
				    "recording this write would make this "
				    "connection's graphs keep %llu bytes of "
				    "write data, over the %llu a connection "
				    "may: destroy graphs, or write from "
				    "before the capture",
				    (unsigned long long)(kept + len),
				    (unsigned long long)
					    STREAMS_GRAPH_BYTES_MAX);
		if (rc != 0)
			return fail(b, rc, "out of host memory");
		data = copy;
	}
	rc = begin(ctx, b, &bind, 1, &cmd);
	if (rc == 0)
		rc = command_failed(b, &cmd,
				    command_write_to_gpu(&cmd, &desc, data,
							 len));
	if (rc == 0)
		result_done(&b->results[i]);
	return rc;
}

/* A read whose bytes land in a shared region: the reply says where. */
static int read_into_region(struct command_ctx *ctx, struct batch *b, size_t i,
			    const Gpucmd__OpRead *op,
			    const struct copy_descriptor *desc,
			    const struct binding *bind)
{
	Gpucmd__RegionRef *where = arena_alloc(b, sizeof(*where));
	struct host_bytes bytes;
	struct command cmd;
	uint64_t span, dense;
	uint8_t *dst;
	int rc;

	if (where == NULL)
		return fail(b, GPUCMD_ENOMEM, "out of host memory");
	rc = region_bytes(b, op->into, &dst);
	if (rc != 0)
		return rc;
	rc = command_check_layout(desc, bind->handle->alloc.size, &span, &dense,
				  b->message, sizeof(b->message));
	if (rc != 0)
		return rc;
	rc = begin(ctx, b, bind, 1, &cmd);
	if (rc != 0)
		return rc;
	bytes.data = dst;
	bytes.len = (size_t)op->into->length;
	bytes.pinned = true;
	rc = command_failed(b, &cmd,
			    command_write_to_cpu(&cmd, desc, &bytes, NULL));
	if (rc != 0)
		return rc;
	gpucmd__region_ref__init(where);
	where->region = op->into->region;
	where->offset = op->into->offset;
	where->length = dense; /* what landed, not the range's size */
	b->results[i].result_case = GPUCMD__OP_RESULT__RESULT_REGION;
	b->results[i].region = where;
	return 0;
}

static int op_read(struct command_ctx *ctx, struct batch *b, size_t i,
		   const Gpucmd__OpRead *op)
{
	struct copy_descriptor desc;
	struct binding bind;
	struct command cmd;
	Gpucmd__OpResult *r = &b->results[i];
	uint64_t dense;
	int rc;

	rc = not_while_capturing(b, "a read");
	if (rc != 0)
		return rc;
	rc = lookup(b, op->handle, &bind.handle);
	if (rc == 0)
		rc = layout_descriptor(b, op->handle, op->offset, op->length,
				       op->layout, &desc);
	if (rc != 0)
		return rc;
	bind.write = false;
	if (op->into != NULL)
		return read_into_region(ctx, b, i, op, &desc, &bind);
	{
		uint64_t span;

		rc = command_check_layout(&desc, bind.handle->alloc.size, &span,
					  &dense, b->message,
					  sizeof(b->message));
		if (rc != 0)
			return rc;
		if (reply_over(b, dense))
			return fail(b, GPUCMD_ELIMIT,
				    "reading %llu more bytes would make this "
				    "batch's reply %llu bytes, over the %llu "
				    "that max_frame_bytes allows: read through "
				    "a shared region or split the batch",
				    (unsigned long long)dense,
				    (unsigned long long)(b->reply_bytes +
							 dense),
				    (unsigned long long)reply_cap(b));
	}
	/* Most batches read nothing: their per-op slots come with a read. */
	if (b->reads == NULL) {
		b->reads = calloc(b->req->n_ops, sizeof(*b->reads));
		if (b->reads == NULL)
			return fail(b, GPUCMD_ENOMEM,
				    "the daemon is out of host memory for the "
				    "reads of a batch of %zu ops",
				    b->req->n_ops);
	}
	rc = begin(ctx, b, &bind, 1, &cmd);
	if (rc == 0)
		rc = command_failed(b, &cmd,
				    command_read_async(&cmd, &desc, 1,
						       &b->reads[i]));
	if (rc != 0)
		return rc;
	b->reply_bytes += dense; /* only a read that will answer counts */
	r->result_case = GPUCMD__OP_RESULT__RESULT_DATA;
	r->data.data = b->reads[i].data;
	r->data.len = b->reads[i].len;
	return 0;
}

static int op_release(struct command_ctx *ctx, struct batch *b, size_t i,
		      const Gpucmd__OpRelease *op)
{
	struct handle *h = NULL;
	int rc;

	(void)ctx;
	rc = lookup(b, op->handle, &h);
	if (rc != 0)
		return rc;
	rc = streams_release(b->conn->set, b->stream, h);
	if (rc == GPUCMD_EBUSY)
		return fail(b, rc,
			    "handle %llu is used by %u graph(s): "
			    "destroy them (or end the capture) before "
			    "releasing it",
			    (unsigned long long)op->handle, h->graph_refs);
	if (rc != 0)
		return fail(b, rc, "cannot queue handle %llu for release: %s",
			    (unsigned long long)op->handle,
			    gpucmd_strerror(rc));
	result_done(&b->results[i]);
	return 0;
}

/* ---- buffers shared between a service's connections --------------------- */

static int shared_name(struct batch *b, const char *name)
{
	if (shared_buffer_name_check(name) == 0)
		return 0;
	return fail(b, GPUCMD_EINVAL,
		    "'%.64s' cannot name a shared buffer: use 1 to %d letters, "
		    "digits, '.', '_', '-', '/' or ':'",
		    name != NULL ? name : "", SHARED_NAME_MAX);
}

/* The device has no room for the shared copy: say how much it has. */
static int share_oom(struct command_ctx *ctx, struct batch *b,
		     const struct handle *h, int rc)
{
	struct driver *d = ctx->driver;
	uint64_t free_bytes = 0, total = 0;

	if (d->ops->mem_info(d, &free_bytes, &total) != 0)
		total = d->props.total_memory;
	fail(b, rc,
	     "cannot share handle %llu: its %llu bytes move into device "
	     "memory of the service's own, and the device refused "
	     "that allocation (%s; %llu of %llu bytes free): release "
	     "buffers, or share before allocating the rest",
	     (unsigned long long)h->id, (unsigned long long)h->alloc.size,
	     gpucmd_strerror(rc), (unsigned long long)free_bytes,
	     (unsigned long long)total);
	/* The report's oom_count and last refusal, as an allocation's. */
	service_note_refusal(b->conn->service, b->conn->set->connection_id,
			     b->stream->number, h->alloc.size, rc, b->message);
	return rc;
}

static bool may_fault_after(const Gpucmd__Request *req, size_t i);

static int op_share(struct command_ctx *ctx, struct batch *b, size_t i,
		    const Gpucmd__OpShare *op)
{
	struct service *svc = b->conn->service;
	uint64_t limit = atomic_load(&svc->memory_limit);
	const struct shared_buffer *other;
	struct shared_buffer *sb;
	struct binding bind;
	struct command cmd;
	struct handle *h = NULL;
	int rc = not_while_capturing(b, "share");

	if (rc == 0)
		rc = lookup(b, op->handle, &h);
	if (rc == 0)
		rc = shared_name(b, op->name);
	if (rc != 0)
		return rc;
	if (h->shared != NULL)
		return fail(b, GPUCMD_EINVAL,
			    "handle %llu is shared already, as '%s': other "
			    "connections of the service import it by that name",
			    (unsigned long long)op->handle, h->shared->name);
	if (h->graph_refs > 0)
		return fail(
			b, GPUCMD_EBUSY,
			"handle %llu is used by %u graph(s), which keep its "
			"address: share it before capturing, or destroy "
			"them first",
			(unsigned long long)op->handle, h->graph_refs);
	other = shared_buffer_find(svc, op->name);
	if (other != NULL)
		return fail(
			b, GPUCMD_EEXIST,
			"service '%s' shares a buffer as '%s' already (%llu "
			"bytes, shared by connection %llu): import it, or "
			"choose another name",
			svc->name, op->name, (unsigned long long)other->size,
			(unsigned long long)other->connection);
	if (svc->nshared >= SHARED_MAX_PER_SERVICE)
		return fail(
			b, GPUCMD_ELIMIT,
			"service '%s' shares %u buffers, the most a service "
			"may: release every handle of one before sharing "
			"another",
			svc->name, svc->nshared);
	/* For the time of the copy the buffer is there twice. */
	if (limit != 0 &&
	    service_reserve_over(svc, limit,
				 shared_buffer_reserved(ctx->driver,
							h->alloc.size),
				 true)) {
		fail(b, GPUCMD_EQUOTA,
		     "quota exceeded: sharing handle %llu copies its "
		     "%llu bytes into memory of service '%s''s own, "
		     "which would take the device memory the service "
		     "holds from %llu bytes past the %llu its "
		     "memory_limit of %llu allows: release buffers (and "
		     "memory_cleanup) first, or raise memory_limit",
		     (unsigned long long)op->handle,
		     (unsigned long long)h->alloc.size, svc->name,
		     (unsigned long long)svc->bytes_reserved,
		     (unsigned long long)service_reserve_cap(limit),
		     (unsigned long long)limit);
		service_note_refusal(svc, b->conn->set->connection_id,
				     b->stream->number, h->alloc.size,
				     GPUCMD_EQUOTA, b->message);
		return GPUCMD_EQUOTA;
	}
	bind.handle = h;
	bind.write = false;
	rc = begin(ctx, b, &bind, 1, &cmd);
	if (rc != 0)
		return rc;
	rc = shared_buffer_create(ctx->driver, svc, op->name, h->alloc.size,
				  &sb);
	if (rc == GPUCMD_ENOMEM)
		return share_oom(ctx, b, h, rc);
	if (rc != 0)
		return fail(b, rc, "cannot share handle %llu: %s",
			    (unsigned long long)op->handle,
			    gpucmd_strerror(rc));
	ctx->driver->error[0] = '\0';
	rc = streams_share(b->conn->set, b->stream, h, sb);
	if (rc != 0)
		return fail(b, rc,
			    "cannot copy handle %llu into its shared memory: "
			    "%s",
			    (unsigned long long)op->handle,
			    ctx->driver->error[0] ? ctx->driver->error :
						    gpucmd_strerror(rc));
	/*
	 * Answered once the copy ran, as a sync is: an import that follows
	 * the answer must find the buffer ready, and a batch with no read
	 * or sync is otherwise answered as soon as it is enqueued.
	 */
	if (b->fence_index < 0) {
		b->fence_index = (int)i;
		if (may_fault_after(b->req, i))
			executor_barrier(b->ex, b);
	}
	result_done(&b->results[i]);
	return 0;
}

static int op_import(struct command_ctx *ctx, struct batch *b, size_t i,
		     const Gpucmd__OpImport *op)
{
	struct service *svc = b->conn->service;
	struct stream_set *set = b->conn->set;
	struct shared_buffer *sb;
	int rc = not_while_capturing(b, "import");

	(void)ctx;
	if (rc == 0)
		rc = shared_name(b, op->name);
	if (rc != 0)
		return rc;
	sb = shared_buffer_find(svc, op->name);
	if (sb == NULL)
		return fail(
			b, GPUCMD_ENOTFOUND,
			"service '%s' shares no buffer as '%s': share it "
			"first (on the connection that made it), and import "
			"it once that share was answered",
			svc->name, op->name);
	if (!streams_shared_ready(sb) && sb->state == SHARED_LOST)
		return fail(b, GPUCMD_ESTREAM,
			    "the buffer shared as '%s' was lost: its copy on "
			    "connection %llu's stream came after a fault or "
			    "with one (the share was answered with it), or "
			    "that stream went before the copy ran; release "
			    "every handle of it and share it again",
			    op->name, (unsigned long long)sb->connection);
	if (sb->state != SHARED_READY)
		return fail(b, GPUCMD_EBUSY,
			    "the buffer shared as '%s' is still being copied "
			    "on connection %llu: import it once that share was "
			    "answered",
			    op->name, (unsigned long long)sb->connection);
	if (op->handle == 0 || handle_table_find(set->handles, op->handle))
		return fail(b, op->handle ? GPUCMD_EEXIST : GPUCMD_EINVAL,
			    "handle %llu is %s: choose another non-zero id",
			    (unsigned long long)op->handle,
			    op->handle ? "already live on this connection" :
					 "invalid");
	rc = streams_import(set, b->stream, op->handle, sb);
	if (rc == GPUCMD_ELIMIT)
		return fail(b, rc,
			    "this connection already holds %u handles, the "
			    "limit (max_handles): release some first",
			    handle_table_count(set->handles));
	if (rc != 0)
		return fail(b, rc, "cannot import '%s': %s", op->name,
			    gpucmd_strerror(rc));
	result_done(&b->results[i]);
	return 0;
}

/* The handle of a buffer argument, whichever way it was passed. */
static uint64_t arg_handle(const Gpucmd__KernelArg *a)
{
	return a->value_case == GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN ?
		       a->buffer_in :
		       a->buffer;
}

static bool arg_matches(char kind, const Gpucmd__KernelArg *a)
{
	switch (kind) {
	case BUILTIN_ARG_BUF_OUT:
	case BUILTIN_ARG_BUF_IN:
		return a->value_case == GPUCMD__KERNEL_ARG__VALUE_BUFFER ||
		       a->value_case == GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN;
	case BUILTIN_ARG_U32:
		return a->value_case == GPUCMD__KERNEL_ARG__VALUE_U32;
	case BUILTIN_ARG_I32:
		return a->value_case == GPUCMD__KERNEL_ARG__VALUE_I32;
	case BUILTIN_ARG_U64:
		return a->value_case == GPUCMD__KERNEL_ARG__VALUE_U64;
	case BUILTIN_ARG_F32:
		return a->value_case == GPUCMD__KERNEL_ARG__VALUE_F32;
	default:
		return false;
	}
}

/*
 * The seed's rule for a refused launch: the refusal is returned, and every
 * open profile on this path is invalidated here, by the caller.
 */
static void invalidate_profiles(struct batch *b, const char *kernel, int rc)
{
	for (struct profile *p = b->conn->set->profiles; p; p = p->next) {
		if (p->stream != b->stream || !p->valid)
			continue;
		p->valid = false;
		snprintf(p->reason, sizeof(p->reason),
			 "launch of %.40s refused on stream %u: %s", kernel,
			 b->stream->number, gpucmd_strerror(rc));
	}
}

/*
 * A geometry the device cannot run is the refusal the driver would give:
 * GPUCMD_ELAUNCH, and the open profiles on the stream are invalidated,
 * exactly as for a refusal that comes from the driver itself.
 */
static int launch_refused(struct batch *b, const char *kernel, const char *fmt,
			  ...) __attribute__((format(printf, 3, 4)));

static int launch_refused(struct batch *b, const char *kernel, const char *fmt,
			  ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b->message, sizeof(b->message), fmt, ap);
	va_end(ap);
	invalidate_profiles(b, kernel, GPUCMD_ELAUNCH);
	return GPUCMD_ELAUNCH;
}

static int geometry(struct batch *b, const struct driver_properties *p,
		    const Gpucmd__OpKernel *op, uint32_t grid[3],
		    uint32_t block[3])
{
	uint64_t threads = 1;

	if (op->n_grid > 3 || op->n_block > 3)
		return fail(b, GPUCMD_EINVAL,
			    "grid and block take 1 to 3 dimensions (got %zu "
			    "and %zu)",
			    op->n_grid, op->n_block);
	/* All three first: a message may print any of them. */
	for (int d = 0; d < 3; d++) {
		grid[d] = (size_t)d < op->n_grid ? op->grid[d] : 1;
		block[d] = (size_t)d < op->n_block ? op->block[d] : 1;
	}
	for (int d = 0; d < 3; d++) {
		if (grid[d] == 0 || block[d] == 0)
			return launch_refused(
				b, op->name,
				"kernel %s: grid %ux%ux%u block %ux%ux%u "
				"has a zero dimension",
				op->name, grid[0], grid[1], grid[2], block[0],
				block[1], block[2]);
		if (grid[d] > p->max_grid[d] || block[d] > p->max_block[d])
			return launch_refused(
				b, op->name,
				"kernel %s: dimension %d of grid %u or "
				"block %u is over the device's %u / %u",
				op->name, d, grid[d], block[d], p->max_grid[d],
				p->max_block[d]);
		threads *= block[d];
	}
	if (threads > p->max_threads_per_block)
		return launch_refused(
			b, op->name,
			"kernel %s: %llu threads per block, over the "
			"device's %u",
			op->name, (unsigned long long)threads,
			p->max_threads_per_block);
	return 0;
}

static int op_kernel_builtin(struct command_ctx *ctx, struct batch *b, size_t i,
			     const Gpucmd__OpKernel *op);
static struct module_ref *find_module(struct stream_set *set, uint64_t id);

/*
 * A kernel of a loaded module: its signature is the client's to know, so
 * arguments go as given (buffers as device addresses, ordered as writes),
 * without the bounds checks the built-ins get.
 */
static int op_kernel_module(struct command_ctx *ctx, struct batch *b, size_t i,
			    const Gpucmd__OpKernel *op)
{
	struct module_ref *m = find_module(b->conn->set, op->module);
	union builtin_value vals[32];
	struct binding bind[32];
	void *params[32];
	size_t sizes[32];
	struct driver_function *fn;
	uint32_t grid[3], block[3];
	struct command cmd;
	size_t nbind = 0;
	int rc;

	if (m == NULL)
		return fail(b, GPUCMD_ENOKERNEL,
			    "module %llu is not loaded on this connection",
			    (unsigned long long)op->module);
	if (op->n_args > 32)
		return fail(b, GPUCMD_EINVAL,
			    "kernel %s: %zu arguments, at most 32", op->name,
			    op->n_args);
	rc = geometry(b, &ctx->driver->props, op, grid, block);
	if (rc != 0)
		return rc;
	ctx->driver->error[0] = '\0';
	rc = module_function(ctx->modules, m->entry, op->name, &fn);
	if (rc != 0)
		return fail(b, GPUCMD_ENOKERNEL,
			    "module %llu has no function '%.64s': %s",
			    (unsigned long long)op->module, op->name,
			    ctx->driver->error);
	for (size_t a = 0; a < op->n_args; a++) {
		const Gpucmd__KernelArg *arg = op->args[a];

		sizes[a] = 4;
		switch (arg->value_case) {
		case GPUCMD__KERNEL_ARG__VALUE_BUFFER:
		case GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN:
			rc = lookup(b, arg_handle(arg), &bind[nbind].handle);
			if (rc != 0)
				return rc;
			/* The caller's word: a buffer_in the kernel writes is
			 * its own service's loss, never another's. */
			bind[nbind].write = arg->value_case ==
					    GPUCMD__KERNEL_ARG__VALUE_BUFFER;
			vals[a].buf = bind[nbind].handle->alloc.ptr;
			nbind++;
			sizes[a] = 8;
			break;
		case GPUCMD__KERNEL_ARG__VALUE_U32:
			vals[a].u32 = arg->u32;
			break;
		case GPUCMD__KERNEL_ARG__VALUE_I32:
			vals[a].i32 = arg->i32;
			break;
		case GPUCMD__KERNEL_ARG__VALUE_U64:
			vals[a].u64 = arg->u64;
			sizes[a] = 8;
			break;
		case GPUCMD__KERNEL_ARG__VALUE_F32:
			vals[a].f32 = arg->f32;
			break;
		default:
			return fail(b, GPUCMD_EINVAL,
				    "kernel %s argument %zu has no value",
				    op->name, a);
		}
		params[a] = &vals[a];
	}
	rc = begin(ctx, b, bind, nbind, &cmd);
	/*
	 * A recording keeps the module loaded for its replays (the service
	 * holds it already, through the id: no new quota).
	 */
	if (rc == 0 && b->stream->recording != NULL &&
	    graph_hold_module(b->stream->recording, ctx->modules, m->entry,
			      b->conn->service) != 0)
		rc = fail(b, GPUCMD_ENOMEM, "out of host memory");
	if (rc == 0)
		rc = command_failed(b, &cmd,
				    command_kernel(&cmd, fn, grid, block,
						   op->shared_bytes, params,
						   sizes, op->n_args));
	if (rc != 0) {
		invalidate_profiles(b, op->name, rc);
		return rc;
	}
	result_done(&b->results[i]);
	return 0;
}

static int op_kernel(struct command_ctx *ctx, struct batch *b, size_t i,
		     const Gpucmd__OpKernel *op)
{
	if (op->module != 0)
		return op_kernel_module(ctx, b, i, op);
	return op_kernel_builtin(ctx, b, i, op);
}

static int op_kernel_builtin(struct command_ctx *ctx, struct batch *b, size_t i,
			     const Gpucmd__OpKernel *op)
{
	const struct builtin_kernel *k;
	union builtin_value vals[BUILTIN_MAX_ARGS];
	struct binding bind[BUILTIN_MAX_ARGS];
	void *params[BUILTIN_MAX_ARGS];
	size_t sizes[BUILTIN_MAX_ARGS];
	struct driver_function *fn;
	uint32_t grid[3], block[3];
	struct command cmd;
	size_t nargs, nbind = 0;
	int rc;

	/* Batches launch the same kernel many times: look it up once. */
	if (b->last_kernel != NULL &&
	    strcmp(b->last_kernel->name, op->name) == 0) {
		k = b->last_kernel;
	} else {
		k = builtin_find(op->name);
		b->last_fn = NULL;
	}
	if (k == NULL)
		return fail(b, GPUCMD_ENOKERNEL,
			    "unknown kernel '%s': the built-ins are fill_u32, "
			    "copy, add_f32, scale_f32, saxpy_f32, "
			    "reduce_sum_f32, spin and fault",
			    op->name);
	/*
	 * On CUDA a fault poisons the one context every service shares and
	 * the daemon exits to get a fresh one: a tenant, even one given the
	 * built-ins only (max_modules = 0), must not be able to do that to
	 * the others with one op.
	 */
	if (k->faults && ctx->driver->props.fault_is_fatal && !b->conn->admin)
		return fail(b, GPUCMD_EPERM,
			    "kernel %s is refused: on the %s backend a fault "
			    "loses the device for every service, so only an "
			    "admin may launch it",
			    k->name, ctx->driver->props.backend);
	nargs = strlen(k->signature);
	if (op->n_args != nargs)
		return fail(b, GPUCMD_EINVAL,
			    "kernel %s takes %zu arguments, got %zu: %s",
			    k->name, nargs, op->n_args, k->usage);
	rc = geometry(b, &ctx->driver->props, op, grid, block);
	if (rc != 0)
		return rc;
	for (size_t a = 0; a < nargs; a++) {
		const Gpucmd__KernelArg *arg = op->args[a];
		char kind = k->signature[a];

		if (!arg_matches(kind, arg))
			return fail(b, GPUCMD_EINVAL,
				    "kernel %s argument %zu has the wrong "
				    "type: %s",
				    k->name, a, k->usage);
		if (kind == BUILTIN_ARG_BUF_OUT &&
		    arg->value_case == GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN)
			return fail(b, GPUCMD_EINVAL,
				    "kernel %s writes argument %zu, which was "
				    "passed as buffer_in (read only): pass it "
				    "as a buffer (%s)",
				    k->name, a, k->usage);
		switch (arg->value_case) {
		case GPUCMD__KERNEL_ARG__VALUE_BUFFER:
		case GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN:
			rc = lookup(b, arg_handle(arg), &bind[nbind].handle);
			if (rc != 0)
				return rc;
			bind[nbind].write = kind == BUILTIN_ARG_BUF_OUT;
			vals[a].buf = bind[nbind].handle->alloc.ptr;
			nbind++;
			break;
		case GPUCMD__KERNEL_ARG__VALUE_U32:
			vals[a].u32 = arg->u32;
			break;
		case GPUCMD__KERNEL_ARG__VALUE_I32:
			vals[a].i32 = arg->i32;
			break;
		case GPUCMD__KERNEL_ARG__VALUE_U64:
			vals[a].u64 = arg->u64;
			break;
		case GPUCMD__KERNEL_ARG__VALUE_F32:
			vals[a].f32 = arg->f32;
			break;
		default:
			return fail(b, GPUCMD_EINVAL,
				    "kernel %s argument %zu has no value",
				    k->name, a);
		}
		params[a] = &vals[a];
		sizes[a] = builtin_arg_size(kind);
	}
	/* Bounds: a built-in must never run past the end of a buffer. */
	for (size_t a = 0, n = 0; a < nargs; a++) {
		uint64_t need = builtin_extent(k, vals, a);
		const struct handle *h;

		if (op->args[a]->value_case !=
			    GPUCMD__KERNEL_ARG__VALUE_BUFFER &&
		    op->args[a]->value_case !=
			    GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN)
			continue;
		h = bind[n++].handle;
		if (need > h->alloc.size)
			return fail(b, GPUCMD_EINVAL,
				    "kernel %s argument %zu (handle %llu) "
				    "needs %llu bytes, the buffer has %llu",
				    k->name, a, (unsigned long long)h->id,
				    (unsigned long long)need,
				    (unsigned long long)h->alloc.size);
	}
	rc = builtin_check(k, vals, b->message, sizeof(b->message));
	if (rc != 0)
		return rc;
	if (k->tenant_max_arg0 != 0 && vals[0].u32 > k->tenant_max_arg0 &&
	    !b->conn->admin)
		return fail(b, GPUCMD_ELIMIT,
			    "%s of %u us is over a service's limit of %u us "
			    "a launch (while it runs it holds the device from "
			    "the other services): split it into launches of "
			    "%u us or less; an admin may spin up to %u us",
			    k->name, vals[0].u32, k->tenant_max_arg0,
			    k->tenant_max_arg0, k->max_arg0);
	fn = b->last_kernel == k ? b->last_fn : NULL;
	if (fn == NULL) {
		rc = ctx->driver->ops->builtin_function(ctx->driver, k->name,
							&fn);
		if (rc != 0)
			return fail(b, rc,
				    "kernel %s is not available on "
				    "this backend: %s",
				    k->name, ctx->driver->error);
		b->last_kernel = k;
		b->last_fn = fn;
	}
	rc = begin(ctx, b, bind, nbind, &cmd);
	if (rc != 0)
		return rc;
	rc = command_failed(b, &cmd,
			    command_kernel(&cmd, fn, grid, block,
					   op->shared_bytes, params, sizes,
					   nargs));
	if (rc != 0) {
		invalidate_profiles(b, k->name, rc);
		return rc;
	}
	result_done(&b->results[i]);
	return 0;
}

static int op_sync(struct command_ctx *ctx, struct batch *b, size_t i)
{
	struct command cmd;
	int rc = not_while_capturing(b, "sync");

	if (rc == 0)
		rc = begin(ctx, b, NULL, 0, &cmd);
	if (rc == 0)
		rc = command_failed(b, &cmd, command_sync(&cmd));
	if (rc == 0)
		result_done(&b->results[i]);
	return rc;
}

static int op_memory_usage(struct command_ctx *ctx, struct batch *b, size_t i)
{
	Gpucmd__MemoryUsage *w = arena_alloc(b, sizeof(*w));
	struct memory_usage u;
	struct command cmd;
	int rc;

	if (w == NULL)
		return fail(b, GPUCMD_ENOMEM, "out of host memory");
	rc = begin(ctx, b, NULL, 0, &cmd);
	if (rc != 0)
		return rc;
	command_memory_usage(&cmd, &u);
	usage_to_wire(&u, w);
	b->results[i].result_case = GPUCMD__OP_RESULT__RESULT_USAGE;
	b->results[i].usage = w;
	return 0;
}

/* ---- the daemon-wide report ---------------------------------------------- */

static Gpucmd__DeviceInfo *device_info(struct batch *b, struct driver *d)
{
	const struct driver_properties *p = &d->props;
	Gpucmd__DeviceInfo *dev = arena_alloc(b, sizeof(*dev));
	uint64_t free_bytes, total;

	if (dev == NULL)
		return NULL;
	gpucmd__device_info__init(dev);
	/* A report is cheap: this is a counter on the host, one call on CUDA. */
	if (d->ops->mem_info(d, &free_bytes, &total) == 0) {
		dev->free_memory = free_bytes;
		dev->free_memory_known = true;
	}
	dev->name = (char *)p->name;
	dev->backend = (char *)p->backend;
	dev->uuid = (char *)p->uuid;
	dev->pci_bus_id = (char *)p->pci_bus_id;
	dev->total_memory = p->total_memory;
	dev->max_allocation = p->max_page_size;
	dev->alignment = p->alignment;
	return dev;
}

static void add_usage(Gpucmd__MemoryUsage *sum, const struct memory_usage *u)
{
	sum->allocations += u->allocations;
	sum->bytes_in_use += u->bytes_in_use;
	sum->bytes_padding += u->bytes_padding;
	sum->bytes_reserved += u->bytes_reserved;
}

static Gpucmd__StreamReport *stream_report(struct batch *b,
					   const struct stream *s)
{
	struct memory_pool_report pools[MEMORY_MAX_POOLS + 1];
	Gpucmd__StreamReport *sr = arena_alloc(b, sizeof(*sr));
	size_t n;
	struct memory_usage u;

	if (sr == NULL)
		return NULL;
	gpucmd__stream_report__init(sr);
	sr->connection_id = s->set->connection_id;
	sr->stream = s->number;
	sr->closing = s->set->closing;
	memory_manager_usage(s->memory, &u);
	sr->usage = arena_alloc(b, sizeof(*sr->usage));
	n = memory_manager_report(s->memory, pools, MEMORY_MAX_POOLS + 1);
	if (n > MEMORY_MAX_POOLS + 1)
		n = MEMORY_MAX_POOLS + 1;
	sr->pools = arena_alloc(b, n * sizeof(*sr->pools) + 1);
	if (sr->usage == NULL || sr->pools == NULL)
		return NULL;
	usage_to_wire(&u, sr->usage);
	for (size_t p = 0; p < n; p++) {
		Gpucmd__PoolReport *pr = arena_alloc(b, sizeof(*pr));
		if (pr == NULL)
			return NULL;
		gpucmd__pool_report__init(pr);
		pr->kind = (char *)memory_pool_kind_name(pools[p].kind);
		pr->page_size = pools[p].page_size;
		pr->max_slice = pools[p].max_slice;
		pr->pages = pools[p].pages;
		pr->pages_peak = pools[p].pages_peak;
		pr->usage = arena_alloc(b, sizeof(*pr->usage));
		if (pr->usage == NULL)
			return NULL;
		usage_to_wire(&pools[p].usage, pr->usage);
		pr->largest_alloc = pools[p].largest_alloc;
		pr->largest_free = pools[p].largest_free;
		sr->pools[sr->n_pools++] = pr;
	}
	return sr;
}

/*
 * Add the memory of the buffers svc's connections share to u: in no
 * stream's pools, so counted here, once, whoever holds them (failed
 * shares' too, until their copy has run and they go).
 */
static void shared_usage(const struct service *svc, Gpucmd__MemoryUsage *u)
{
	u->allocations += svc->nshared;
	u->bytes_in_use += svc->shared_bytes;
	for (const struct shared_buffer *sb = svc->shared; sb; sb = sb->next)
		u->bytes_reserved += sb->reserved;
}

static void status_shared(struct service *svc, void *arg)
{
	if (!svc->observer)
		shared_usage(svc, arg);
}

/*
 * The buffers svc's connections share: in no stream's pools, so added to
 * the service's usage here, once, whoever holds them.
 */
static int shared_rows(struct batch *b, struct service *svc,
		       Gpucmd__ServiceReport *sr)
{
	sr->shared = arena_alloc(b, svc->nshared * sizeof(*sr->shared) + 1);
	if (sr->shared == NULL)
		return GPUCMD_ENOMEM;
	for (struct shared_buffer *sb = svc->shared; sb; sb = sb->next) {
		Gpucmd__SharedBuffer *w;

		if (!sb->charged)
			continue; /* a failed share, gone once its copy ran */
		w = arena_alloc(b, sizeof(*w));
		if (w == NULL)
			return GPUCMD_ENOMEM;
		gpucmd__shared_buffer__init(w);
		w->name = arena_alloc(b, sizeof(sb->name));
		if (w->name == NULL)
			return GPUCMD_ENOMEM;
		memcpy(w->name, sb->name, sizeof(sb->name));
		w->bytes = sb->size;
		w->handles = sb->refs;
		w->connection_id = sb->connection;
		w->sharer_open = sb->sharer_open;
		w->imports = sb->imports;
		w->ready = streams_shared_ready(sb);
		w->lost = sb->state == SHARED_LOST;
		sr->shared[sr->n_shared++] = w;
		sr->shared_buffers++;
		sr->shared_buffer_bytes += sb->size;
	}
	shared_usage(svc, sr->usage);
	return 0;
}

struct report_state {
	struct batch *b;
	Gpucmd__MemoryReport *rep;
	Gpucmd__ServiceReport *totals;
	uint32_t cap; /* rows allocated: services counted at the start */
	int rc;
};

static void service_row(struct service *svc, void *arg)
{
	struct report_state *st = arg;
	struct batch *b = st->b;
	struct executor_conn *me = b->conn;
	Gpucmd__ServiceReport *sr;
	size_t nstreams = 0;
	uint64_t ordered;

	if (st->rc != 0 || (!me->admin && svc != me->service))
		return;
	/* A service the loop created after the count has no row. */
	if (st->rep->n_services >= st->cap)
		return;
	for (struct stream_set *set = executor_sets(b->ex); set;
	     set = set->next)
		if (set->service == svc)
			nstreams += set->nstreams;
	sr = arena_alloc(b, sizeof(*sr));
	if (sr == NULL)
		goto oom;
	gpucmd__service_report__init(sr);
	sr->usage = arena_alloc(b, sizeof(*sr->usage));
	sr->streams = arena_alloc(b, nstreams * sizeof(*sr->streams) + 1);
	if (sr->usage == NULL || sr->streams == NULL)
		goto oom;
	gpucmd__memory_usage__init(sr->usage);
	/*
	 * A copy: the reply is encoded after the registry lock is let go,
	 * and the loop may retire (free) an idle service meanwhile.
	 */
	sr->name = arena_alloc(b, sizeof(svc->name));
	if (sr->name == NULL)
		goto oom;
	memcpy(sr->name, svc->name, sizeof(svc->name));
	sr->id = svc->id;
	sr->connections = atomic_load(&svc->connections);
	sr->limit_bytes = atomic_load(&svc->memory_limit);
	sr->oom_count = svc->oom_count;
	sr->region_bytes = svc->region_bytes;
	sr->regions = svc->regions;
	sr->region_limit = atomic_load(&svc->region_limit);
	sr->region_refusals = svc->region_refusals;
	sr->bytes_released_pending = svc->release_pending_bytes;
	sr->modules = atomic_load(&svc->modules);
	sr->max_modules = atomic_load(&svc->max_modules);
	sr->module_bytes = svc->module_bytes;
	if (svc->last_refusal.unix_ms != 0) {
		const struct service_refusal *from = &svc->last_refusal;
		Gpucmd__Refusal *to = arena_alloc(b, sizeof(*to));
		size_t len = strlen(from->message) + 1;

		if (to == NULL)
			goto oom;
		gpucmd__refusal__init(to);
		to->unix_ms = from->unix_ms;
		to->size = from->size;
		to->connection_id = from->connection;
		to->stream = from->stream;
		to->code = from->code;
		to->message = arena_alloc(b, len);
		if (to->message == NULL)
			goto oom;
		memcpy(to->message, from->message, len);
		sr->last_refusal = to;
	}
	for (struct stream_set *set = executor_sets(b->ex); set;
	     set = set->next) {
		if (set->service != svc)
			continue;
		for (uint32_t s = 0; s < set->nstreams; s++) {
			Gpucmd__StreamReport *str =
				stream_report(b, set->slots[s]);
			struct memory_usage u;
			if (str == NULL)
				goto oom;
			memory_manager_usage(set->slots[s]->memory, &u);
			add_usage(sr->usage, &u);
			sr->streams[sr->n_streams++] = str;
		}
		/*
		 * Released to their own stream's pools, not reused, and with
		 * work queued before the release still to run: released but
		 * still used, like the drop queues' (which the pools count as
		 * in use), so in use and pending count them too.
		 */
		ordered = streams_ordered_held(set, true);
		sr->bytes_released_pending += ordered;
		sr->usage->bytes_in_use += ordered;
	}
	if (shared_rows(b, svc, sr) != 0)
		goto oom;
	/*
	 * The peak counts as in use counts: service_charge does not see the
	 * releases to their own streams added above, so what a report counts
	 * raises it too (never a peak under what is in use).
	 */
	if (sr->usage->bytes_in_use > svc->peak_bytes_in_use)
		svc->peak_bytes_in_use = sr->usage->bytes_in_use;
	sr->peak_bytes_in_use = svc->peak_bytes_in_use;
	st->rep->services[st->rep->n_services++] = sr;
	st->totals->connections += sr->connections;
	st->totals->peak_bytes_in_use += sr->peak_bytes_in_use;
	st->totals->oom_count += sr->oom_count;
	/* No limit_bytes, no region_limit: a sum of quotas limits nothing. */
	st->totals->region_bytes += sr->region_bytes;
	st->totals->regions += sr->regions;
	st->totals->region_refusals += sr->region_refusals;
	st->totals->bytes_released_pending += sr->bytes_released_pending;
	st->totals->modules += sr->modules; /* max_modules: no sum */
	st->totals->module_bytes += sr->module_bytes;
	st->totals->shared_buffers += sr->shared_buffers;
	st->totals->shared_buffer_bytes += sr->shared_buffer_bytes;
	st->totals->usage->allocations += sr->usage->allocations;
	st->totals->usage->bytes_in_use += sr->usage->bytes_in_use;
	st->totals->usage->bytes_padding += sr->usage->bytes_padding;
	st->totals->usage->bytes_reserved += sr->usage->bytes_reserved;
	return;
oom:
	st->rc = GPUCMD_ENOMEM;
}

static int op_memory_report(struct command_ctx *ctx, struct batch *b, size_t i)
{
	struct report_state st = { .b = b };
	uint32_t nsvc = service_count();
	int rc = report_allowed(b, "memory_report");

	if (rc != 0)
		return rc;
	st.rep = arena_alloc(b, sizeof(*st.rep));
	st.totals = arena_alloc(b, sizeof(*st.totals));
	if (st.rep == NULL || st.totals == NULL)
		return fail(b, GPUCMD_ENOMEM, "out of host memory");
	gpucmd__memory_report__init(st.rep);
	gpucmd__service_report__init(st.totals);
	st.totals->name = "total";
	st.totals->usage = arena_alloc(b, sizeof(*st.totals->usage));
	st.rep->services = arena_alloc(b, nsvc * sizeof(*st.rep->services) + 1);
	st.rep->device = device_info(b, ctx->driver);
	if (st.totals->usage == NULL || st.rep->services == NULL ||
	    st.rep->device == NULL)
		return fail(b, GPUCMD_ENOMEM, "out of host memory");
	gpucmd__memory_usage__init(st.totals->usage);
	st.rep->totals = st.totals;
	/* How much of it is staging reads tells how busy the others are. */
	if (ctx->pinned != NULL && b->conn->admin) {
		struct memory_usage pu;

		st.rep->pinned_host =
			arena_alloc(b, sizeof(*st.rep->pinned_host));
		if (st.rep->pinned_host == NULL)
			return fail(b, GPUCMD_ENOMEM, "out of host memory");
		pinned_pool_usage(ctx->pinned, &pu);
		usage_to_wire(&pu, st.rep->pinned_host);
	}
	/* Services created after the count was taken are left out. */
	st.rep->n_services = 0;
	st.cap = nsvc;
	service_foreach(service_row, &st);
	if (st.rc != 0)
		return fail(b, st.rc, "out of host memory building the report");
	rc = report_fits(b, "memory report",
			 gpucmd__memory_report__get_packed_size(st.rep));
	if (rc != 0)
		return rc;
	b->results[i].result_case = GPUCMD__OP_RESULT__RESULT_REPORT;
	b->results[i].report = st.rep;
	return 0;
}

static void count_connections(struct service *svc, void *arg)
{
	*(uint32_t *)arg += atomic_load(&svc->connections);
}

static int op_status(struct command_ctx *ctx, struct batch *b, size_t i)
{
	Gpucmd__Status *st;
	struct memory_usage total = { 0 };
	uint32_t conns = 0;
	int rc = report_allowed(b, "status");

	if (rc != 0)
		return rc;
	st = arena_alloc(b, sizeof(*st));
	if (st == NULL)
		return fail(b, GPUCMD_ENOMEM, "out of host memory");
	gpucmd__status__init(st);
	st->version = GPUCMD_VERSION_STRING;
	st->device = device_info(b, ctx->driver);
	st->usage = arena_alloc(b, sizeof(*st->usage));
	if (st->device == NULL || st->usage == NULL)
		return fail(b, GPUCMD_ENOMEM, "out of host memory");
	/*
	 * A tenant sees its own service; admins see the daemon's services,
	 * not the observers that look at them (service.h).
	 */
	for (struct stream_set *set = executor_sets(b->ex); set;
	     set = set->next) {
		struct memory_usage u;

		if (!b->conn->admin && set->service != b->conn->service)
			continue;
		if (set->service->observer)
			continue;
		streams_usage(set, &u);
		total.allocations += u.allocations;
		total.bytes_in_use += u.bytes_in_use;
		total.bytes_padding += u.bytes_padding;
		total.bytes_reserved += u.bytes_reserved;
	}
	/*
	 * Connections as the memory report counts them, from Hello on: one
	 * whose first batch has not reached this thread has no stream set.
	 */
	if (b->conn->admin)
		service_foreach(count_connections, &conns);
	else
		conns = atomic_load(&b->conn->service->connections);
	usage_to_wire(&total, st->usage);
	/* Shared buffers are in no connection's streams. */
	if (b->conn->admin)
		service_foreach(status_shared, st->usage);
	else
		shared_usage(b->conn->service, st->usage);
	st->uptime_ms = executor_uptime_ms(b->ex);
	st->services = b->conn->admin ? service_count() : 1;
	st->connections = conns;
	/* Another service's count would tell a tenant how busy it is. */
	st->batches = b->conn->admin ? executor_batches(b->ex) :
				       b->conn->service->batches;
	b->results[i].result_case = GPUCMD__OP_RESULT__RESULT_STATUS;
	b->results[i].status = st;
	return 0;
}

/* ---- the seed's memory methods ------------------------------------------- */

static int op_reserve(struct command_ctx *ctx, struct batch *b, size_t i,
		      const Gpucmd__OpReserve *op)
{
	struct stream_set *set = b->conn->set;
	struct managed_memory m;
	struct command cmd;
	struct handle *h;
	int rc;

	if (op->reservation == 0 ||
	    handle_table_find(set->reservations, op->reservation) != NULL)
		return fail(b, op->reservation ? GPUCMD_EEXIST : GPUCMD_EINVAL,
			    "reservation %llu is %s: choose another non-zero "
			    "id",
			    (unsigned long long)op->reservation,
			    op->reservation ? "already live" : "invalid");
	rc = begin(ctx, b, NULL, 0, &cmd);
	if (rc == 0)
		rc = command_failed(b, &cmd,
				    command_reserve(&cmd, op->size, &m));
	if (rc != 0)
		return rc;
	h = handle_new(op->reservation, m.origin, &m.alloc);
	rc = h != NULL ? handle_table_insert(set->reservations, h) :
			 GPUCMD_ENOMEM;
	if (rc != 0) {
		handle_free(h);
		command_unreserve(&cmd, &m);
		return fail(b, rc, "cannot hold reservation %llu: %s",
			    (unsigned long long)op->reservation,
			    gpucmd_strerror(rc));
	}
	result_done(&b->results[i]);
	return 0;
}

static int op_bind(struct command_ctx *ctx, struct batch *b, size_t i,
		   const Gpucmd__OpBind *op)
{
	struct stream_set *set = b->conn->set;
	struct handle *r =
		handle_table_find(set->reservations, op->reservation);
	struct managed_memory m;
	struct command cmd;
	int rc;

	if (r == NULL)
		return fail(b, GPUCMD_EINVAL,
			    "reservation %llu has no storage to give: reserve "
			    "it first (and bind it only once)",
			    (unsigned long long)op->reservation);
	m.alloc = r->alloc;
	m.origin = r->owner;
	rc = begin(ctx, b, NULL, 0, &cmd);
	if (rc == 0)
		rc = command_failed(b, &cmd,
				    command_bind(&cmd, &m, op->handle));
	if (rc != 0)
		return rc;
	handle_table_remove(set->reservations, op->reservation);
	handle_free(r);
	result_done(&b->results[i]);
	return 0;
}

static int op_cursor(struct command_ctx *ctx, struct batch *b, size_t i)
{
	struct command cmd;
	int rc = begin(ctx, b, NULL, 0, &cmd);

	if (rc != 0)
		return rc;
	b->results[i].result_case = GPUCMD__OP_RESULT__RESULT_VALUE;
	b->results[i].value = command_cursor(&cmd);
	return 0;
}

static int op_stream_report(struct command_ctx *ctx, struct batch *b, size_t i)
{
	struct command cmd;
	Gpucmd__StreamReport *sr;
	int rc = report_allowed(b, "stream_report");

	if (rc == 0)
		rc = begin(ctx, b, NULL, 0, &cmd);
	if (rc != 0)
		return rc;
	sr = stream_report(b, command_stream(&cmd));
	if (sr == NULL)
		return fail(b, GPUCMD_ENOMEM, "out of host memory");
	rc = report_fits(b, "stream report",
			 gpucmd__stream_report__get_packed_size(sr));
	if (rc != 0)
		return rc;
	b->results[i].result_case = GPUCMD__OP_RESULT__RESULT_STREAM_REPORT;
	b->results[i].stream_report = sr;
	return 0;
}

static int op_memory_cleanup(struct command_ctx *ctx, struct batch *b, size_t i)
{
	struct command cmd;
	int rc = begin(ctx, b, NULL, 0, &cmd);

	if (rc != 0)
		return rc;
	command_memory_cleanup(&cmd);
	result_done(&b->results[i]);
	return 0;
}

static int op_flush_drops(struct command_ctx *ctx, struct batch *b, size_t i)
{
	struct command cmd;
	int rc = begin(ctx, b, NULL, 0, &cmd);

	if (rc != 0)
		return rc;
	command_flush_drops(&cmd);
	result_done(&b->results[i]);
	return 0;
}

static int op_allocation_mode(struct command_ctx *ctx, struct batch *b,
			      size_t i, const Gpucmd__OpAllocationMode *op)
{
	struct command cmd;
	int rc;

	if (op->mode != GPUCMD__ALLOCATION_MODE__AUTO &&
	    op->mode != GPUCMD__ALLOCATION_MODE__PERSISTENT)
		return fail(b, GPUCMD_EINVAL,
			    "allocation mode %d is neither auto (0) nor "
			    "persistent (1)",
			    (int)op->mode);
	rc = begin(ctx, b, NULL, 0, &cmd);
	if (rc != 0)
		return rc;
	command_allocation_mode(
		&cmd, op->mode == GPUCMD__ALLOCATION_MODE__PERSISTENT ?
			      MEMORY_MODE_PERSISTENT :
			      MEMORY_MODE_AUTO);
	result_done(&b->results[i]);
	return 0;
}

static int pool_kind(const char *name, enum memory_pool_kind *out)
{
	if (strcmp(name, "sliced") == 0)
		*out = MEMORY_POOL_SLICED;
	else if (strcmp(name, "exclusive") == 0)
		*out = MEMORY_POOL_EXCLUSIVE;
	else if (strcmp(name, "direct") == 0)
		*out = MEMORY_POOL_DIRECT;
	else
		return -1;
	return 0;
}

static int op_install_pools(struct command_ctx *ctx, struct batch *b, size_t i,
			    const Gpucmd__OpInstallPools *op)
{
	const Gpucmd__MemoryLayout *l = op->layout;
	struct memory_configuration cfg;
	struct command cmd;
	char msg[256];
	int rc;

	memset(&cfg, 0, sizeof(cfg));
	if (l == NULL || strcmp(l->preset, "subslices") == 0) {
		cfg.preset = MEMORY_PRESET_SUBSLICES;
	} else if (strcmp(l->preset, "exclusive") == 0) {
		cfg.preset = MEMORY_PRESET_EXCLUSIVE_PAGES;
	} else if (strcmp(l->preset, "custom") == 0) {
		cfg.preset = MEMORY_PRESET_CUSTOM;
		if (l->n_pools > MEMORY_MAX_POOLS)
			return fail(b, GPUCMD_EINVAL,
				    "a layout takes at most %d pools (got %zu)",
				    MEMORY_MAX_POOLS, l->n_pools);
		for (size_t p = 0; p < l->n_pools; p++) {
			const Gpucmd__PoolOptions *o = l->pools[p];
			struct memory_pool_options *c = &cfg.pools[p];

			if (pool_kind(o->kind, &c->kind) != 0)
				return fail(
					b, GPUCMD_EINVAL,
					"pool %zu: kind '%s' is not sliced, "
					"exclusive or direct",
					p, o->kind);
			c->page_size = o->page_size;
			c->max_slice = o->max_slice;
			c->max_pool_size = o->max_pool_size;
			c->max_alloc = o->max_alloc;
			c->dealloc_period = o->dealloc_period;
			c->reclaim_at = o->reclaim_at;
		}
		cfg.npools = l->n_pools;
	} else {
		return fail(b, GPUCMD_EINVAL,
			    "layout preset '%s' is not subslices, exclusive or "
			    "custom",
			    l->preset);
	}
	rc = memory_configuration_resolve(&cfg, &ctx->props, msg, sizeof(msg));
	if (rc != 0)
		return fail(b, rc, "invalid pool layout: %s", msg);
	rc = begin(ctx, b, NULL, 0, &cmd);
	if (rc == 0)
		rc = command_failed(b, &cmd,
				    command_install_memory_pools(&cmd, &cfg));
	if (rc == 0)
		result_done(&b->results[i]);
	return rc;
}

static int op_reserve_cpu(struct command_ctx *ctx, struct batch *b, size_t i,
			  const Gpucmd__OpReserveCpu *op)
{
	Gpucmd__CpuBuffer *w = arena_alloc(b, sizeof(*w));
	struct host_bytes bytes;
	struct command cmd;
	int rc;

	if (w == NULL)
		return fail(b, GPUCMD_ENOMEM, "out of host memory");
	rc = begin(ctx, b, NULL, 0, &cmd);
	if (rc != 0)
		return rc;
	if (op->size > FRAME_MAX_BODY)
		return fail(b, GPUCMD_EINVAL,
			    "reserve_cpu of %llu bytes: host buffers are at "
			    "most %u bytes (1 GiB), the most one frame can "
			    "carry; ask for less",
			    (unsigned long long)op->size, FRAME_MAX_BODY);
	/*
	 * It answers what a reservation of that size gets and gives it back
	 * at once: no copy comes of it, so heap bytes are not pinned (a batch
	 * of them would pin and unpin gigabytes on the device thread).
	 */
	command_reserve_cpu_unpinned(&cmd, op->size, &bytes);
	if (bytes.data == NULL)
		return fail(b, GPUCMD_ENOMEM,
			    "the daemon's host has no %llu bytes to spare",
			    (unsigned long long)op->size);
	gpucmd__cpu_buffer__init(w);
	w->size = bytes.len;
	w->pinned = bytes.pinned;
	command_free_cpu(ctx, &bytes);
	b->results[i].result_case = GPUCMD__OP_RESULT__RESULT_CPU;
	b->results[i].cpu = w;
	return 0;
}

/* ---- profiling ------------------------------------------------------------ */

static int op_profile_begin(struct command_ctx *ctx, struct batch *b, size_t i,
			    const Gpucmd__OpProfileBegin *op)
{
	struct driver *d = ctx->driver;
	struct stream_set *set = b->conn->set;
	struct profile *p;
	int rc = not_while_capturing(b, "a profile");

	if (rc != 0)
		return rc;
	for (p = set->profiles; p != NULL; p = p->next)
		if (p->id == op->profile)
			return fail(b, GPUCMD_EEXIST,
				    "profile %llu is already open",
				    (unsigned long long)op->profile);
	if (set->nprofiles >= STREAMS_MAX_PROFILES)
		return fail(b, GPUCMD_ELIMIT,
			    "this connection has %u profiles open, the most it "
			    "may: end some first",
			    set->nprofiles);
	p = calloc(1, sizeof(*p));
	if (p == NULL)
		return fail(b, GPUCMD_ENOMEM, "out of host memory");
	rc = d->ops->event_create(d, &p->start);
	if (rc == 0)
		rc = d->ops->event_record(d, p->start, b->stream->ds);
	if (rc != 0) {
		if (p->start != NULL)
			d->ops->event_destroy(d, p->start);
		free(p);
		return fail(b, rc, "cannot start profile: %s", d->error);
	}
	p->id = op->profile;
	p->stream = b->stream;
	p->valid = true;
	/*
	 * A fault reported by this fence or a later one may be in the work
	 * the profile times (the one before the begin in this batch too:
	 * a fence covers its whole batch).
	 */
	p->from_seq = stream_next_fence(b->stream);
	p->next = set->profiles;
	set->profiles = p;
	set->nprofiles++;
	result_done(&b->results[i]);
	return 0;
}

static int op_profile_end(struct command_ctx *ctx, struct batch *b, size_t i,
			  const Gpucmd__OpProfileEnd *op)
{
	struct driver *d = ctx->driver;
	struct stream_set *set = b->conn->set;
	struct profile **pp, *p;
	struct profile_result *res;
	Gpucmd__Profile *w;
	int rc = not_while_capturing(b, "a profile");

	if (rc != 0)
		return rc;
	for (pp = &set->profiles; *pp != NULL; pp = &(*pp)->next)
		if ((*pp)->id == op->profile)
			break;
	p = *pp;
	if (p == NULL)
		return fail(b, GPUCMD_EINVAL, "profile %llu is not open",
			    (unsigned long long)op->profile);
	if (p->stream != b->stream)
		return fail(b, GPUCMD_EINVAL,
			    "profile %llu was opened on stream %u; end it on "
			    "that stream",
			    (unsigned long long)op->profile, p->stream->number);
	res = calloc(1, sizeof(*res));
	w = arena_alloc(b, sizeof(*w));
	if (res == NULL || w == NULL) {
		free(res);
		return fail(b, GPUCMD_ENOMEM, "out of host memory");
	}
	rc = d->ops->event_create(d, &res->end);
	if (rc == 0)
		rc = d->ops->event_record(d, res->end, b->stream->ds);
	if (rc != 0) {
		if (res->end != NULL)
			d->ops->event_destroy(d, res->end);
		free(res);
		return fail(b, rc, "cannot end profile: %s", d->error);
	}
	*pp = p->next;
	set->nprofiles--;
	res->op = i;
	res->start = p->start;
	res->valid = p->valid;
	snprintf(res->reason, sizeof(res->reason), "%s", p->reason);
	res->stream = p->stream;
	res->from_seq = p->from_seq;
	res->next = b->profiles;
	b->profiles = res;
	free(p);
	gpucmd__profile__init(w);
	b->results[i].result_case = GPUCMD__OP_RESULT__RESULT_PROFILE;
	b->results[i].profile = w;
	return 0;
}

/* ---- graph capture -------------------------------------------------------- */

static int op_capture_begin(struct command_ctx *ctx, struct batch *b, size_t i)
{
	struct driver *d = ctx->driver;
	struct stream *s = b->stream;
	int rc = not_while_capturing(b, "capture_begin");

	if (rc != 0)
		return rc;
	if (b->conn->set->ngraphs >= STREAMS_MAX_GRAPHS)
		return fail(b, GPUCMD_ELIMIT,
			    "this connection has %u graphs (kept, or destroyed "
			    "with replays still to run), the most it may: "
			    "destroy some first",
			    b->conn->set->ngraphs);
	s->recording = graph_new(b->conn->set);
	if (s->recording == NULL)
		return fail(b, GPUCMD_ENOMEM, "out of host memory");
	/* What ran before the capture completes on its own fence. */
	rc = executor_fence(b->ex, b);
	if (rc == 0)
		rc = d->ops->capture_begin(d, s->ds);
	if (rc != 0) {
		graph_free(d, s->recording);
		s->recording = NULL;
		return fail(b, rc, "cannot begin a capture on stream %u: %s",
			    s->number, d->error);
	}
	s->capturing = true;
	memory_manager_set_capture(s->memory, true);
	result_done(&b->results[i]);
	return 0;
}

static int op_capture_end(struct command_ctx *ctx, struct batch *b, size_t i,
			  const Gpucmd__OpCaptureEnd *op)
{
	struct driver *d = ctx->driver;
	struct stream_set *set = b->conn->set;
	struct stream *s = b->stream;
	struct graph *g = s->recording;
	int rc;

	if (!s->capturing)
		return fail(b, GPUCMD_EINVAL,
			    "stream %u is not recording: capture_begin first",
			    s->number);
	if (op->graph != 0 && graph_find(set->graphs, op->graph) != NULL)
		return fail(b, GPUCMD_EEXIST,
			    "graph id %llu is already taken: choose another "
			    "non-zero id, or 0 to discard the capture (the "
			    "capture goes on)",
			    (unsigned long long)op->graph);
	rc = d->ops->capture_end(d, s->ds, &g->dg);
	s->capturing = false;
	s->recording = NULL;
	memory_manager_set_capture(s->memory, false);
	/*
	 * Graph 0 discards what was recorded (capture_abort): the way out
	 * of a capture that a failed batch left open, whatever the driver
	 * made of it.
	 */
	if (op->graph == 0) {
		if (rc != 0)
			g->dg = NULL;
		graph_free(d, g);
		streams_flush_drops(set);
		result_done(&b->results[i]);
		return 0;
	}
	if (rc != 0) {
		g->dg = NULL;
		graph_free(d, g);
		return fail(b, rc, "the capture on stream %u failed: %s",
			    s->number, d->error);
	}
	g->id = op->graph;
	g->next = set->graphs;
	set->graphs = g;
	/* The window is closed: the deferred drops may go now. */
	streams_flush_drops(set);
	result_done(&b->results[i]);
	return 0;
}

static int op_graph_launch(struct command_ctx *ctx, struct batch *b, size_t i,
			   const Gpucmd__OpGraphLaunch *op)
{
	struct driver *d = ctx->driver;
	struct graph *g = graph_find(b->conn->set->graphs, op->graph);
	struct binding *bind;
	struct command cmd;
	int rc = not_while_capturing(b, "a graph launch");

	if (rc != 0)
		return rc;
	if (g == NULL)
		return fail(b, GPUCMD_ENOTFOUND,
			    "graph %llu does not exist on this connection",
			    (unsigned long long)op->graph);
	if (d->props.graph_launch_copies &&
	    b->conn->set->replay_ops + g->nops > STREAMS_REPLAY_OPS_MAX)
		return fail(b, GPUCMD_ELIMIT,
			    "graph %llu replays %u ops, and this connection's "
			    "launches not yet complete hold %llu, the most a "
			    "connection may is %u: wait for earlier launches "
			    "(sync) before more",
			    (unsigned long long)op->graph, g->nops,
			    (unsigned long long)b->conn->set->replay_ops,
			    STREAMS_REPLAY_OPS_MAX);
	/* Order the replay behind every use of every buffer it touches. */
	bind = calloc(g->nhandles + 1, sizeof(*bind));
	if (bind == NULL)
		return fail(b, GPUCMD_ENOMEM, "out of host memory");
	for (uint32_t h = 0; h < g->nhandles; h++) {
		bind[h].handle = g->handles[h];
		/* The capture refused to record a write of a shared one. */
		bind[h].write = g->handles[h]->shared == NULL;
	}
	rc = begin(ctx, b, bind, g->nhandles, &cmd);
	free(bind);
	if (rc != 0)
		return rc;
	rc = d->ops->graph_launch(d, g->dg, b->stream->ds);
	if (rc != 0)
		return fail(b, rc,
			    "the driver refused to launch graph %llu: "
			    "%s",
			    (unsigned long long)op->graph, d->error);
	/* Counted until the batch completes (dispatch_batch_free). */
	b->conn->set->replay_ops += g->nops;
	b->replay_ops += g->nops;
	result_done(&b->results[i]);
	return 0;
}

static int op_graph_destroy(struct command_ctx *ctx, struct batch *b, size_t i,
			    const Gpucmd__OpGraphDestroy *op)
{
	struct graph **pp;

	for (pp = &b->conn->set->graphs; *pp != NULL; pp = &(*pp)->next) {
		struct graph *g = *pp;

		if (g->id != op->graph)
			continue;
		*pp = g->next;
		/* Replays already enqueued still read its copies. */
		graph_retire(b->conn->set, b->stream, g);
		result_done(&b->results[i]);
		return 0;
	}
	return fail(b, GPUCMD_ENOTFOUND,
		    "graph %llu does not exist on this connection",
		    (unsigned long long)op->graph);
}

/* ---- cleanup of a service ------------------------------------------------- */

static int op_cleanup(struct command_ctx *ctx, struct batch *b, size_t i,
		      const Gpucmd__OpCleanup *op)
{
	const struct service *target = b->conn->service;
	uint64_t before = 0, after = 0;

	(void)ctx;
	if (op->service[0] != '\0' && strcmp(op->service, target->name) != 0) {
		if (!b->conn->admin)
			return fail(b, GPUCMD_EPERM,
				    "only an admin may clean up service '%s' "
				    "(you speak for '%s')",
				    op->service, target->name);
		if (!service_known(op->service))
			return fail(b, GPUCMD_ENOTFOUND, SERVICE_UNKNOWN_FMT,
				    op->service);
		target = NULL;
	}
	for (struct stream_set *set = executor_sets(b->ex); set;
	     set = set->next) {
		struct memory_usage u;

		if (target != NULL ?
			    set->service != target :
			    strcmp(set->service->name, op->service) != 0)
			continue;
		streams_usage(set, &u);
		before += u.bytes_reserved;
		for (uint32_t s = 0; s < set->nstreams; s++) {
			if (set->slots[s]->capturing)
				continue;
			drop_queue_flush(set->slots[s]->drops);
			memory_manager_cleanup(set->slots[s]->memory, true);
		}
		streams_usage(set, &u);
		after += u.bytes_reserved;
	}
	b->results[i].result_case = GPUCMD__OP_RESULT__RESULT_VALUE;
	b->results[i].value = before - after;
	return 0;
}

/* ---- modules ------------------------------------------------------------- */

static struct module_ref *find_module(struct stream_set *set, uint64_t id)
{
	struct module_ref *m;

	for (m = set->modules; m != NULL; m = m->next)
		if (m->id == id)
			return m;
	return NULL;
}

/*
 * A service keeps at most max_modules distinct modules loaded (0: none,
 * the built-in kernels only), so that one service cannot fill the daemon's
 * module cache for the others.  Content the service already holds costs
 * nothing more; the check comes before any compile.
 */
static int module_quota(struct command_ctx *ctx, struct batch *b, uint64_t id,
			int fmt, const void *data, size_t len)
{
	const struct service *svc = b->conn->service;
	unsigned max = atomic_load(&svc->max_modules);
	unsigned held = atomic_load(&svc->modules);
	const struct module_entry *known;

	if (max == 0)
		return fail(b, GPUCMD_EPERM,
			    "cannot load module %llu: service '%s' runs the "
			    "built-in kernels only (max_modules = 0 in "
			    "gpucmdd.conf)",
			    (unsigned long long)id, svc->name);
	known = module_cache_lookup(ctx->modules,
				    (enum driver_module_format)fmt, data, len,
				    svc->id);
	if (held >= max && !(known && service_module_held(svc, known)))
		return fail(b, GPUCMD_ELIMIT,
			    "cannot load module %llu: service '%s' holds %u "
			    "modules (loaded, launched by its graphs, or "
			    "unloaded with launches still to run), and its "
			    "max_modules is %u; unload one or destroy a graph "
			    "and let its stream finish, or raise max_modules "
			    "in gpucmdd.conf",
			    (unsigned long long)id, svc->name, held, max);
	return 0;
}

/*
 * Whether module id, whose globals take bytes of device memory while it is
 * loaded, fits the service's memory_limit beside its live buffers and the
 * globals of the modules it holds already (module_image.h); else the
 * batch fails with GPUCMD_EQUOTA.
 */
static int module_fits(const struct command_ctx *ctx, struct batch *b,
		       uint64_t id, uint64_t bytes)
{
	struct service *svc = b->conn->service;
	uint64_t limit = atomic_load(&svc->memory_limit);
	uint64_t closing;
	char gone[160] = "";

	if (!service_over_limit(svc, limit, bytes))
		return 0;
	closing = command_closing_live(ctx, svc);
	if (closing > 0)
		snprintf(gone, sizeof(gone),
			 ", %llu of them of closed connections, back once "
			 "the work they queued has run",
			 (unsigned long long)closing);
	fail(b, GPUCMD_EQUOTA,
	     "quota exceeded: module %llu's global variables take %llu "
	     "bytes of device memory while it is loaded, which would "
	     "take service '%s' past its memory_limit of %llu bytes "
	     "(live buffers %llu%s; globals of the modules it holds "
	     "%llu); release buffers or unload modules, make the "
	     "module's __device__ arrays smaller, or raise the "
	     "memory_limit",
	     (unsigned long long)id, (unsigned long long)bytes, svc->name,
	     (unsigned long long)limit, (unsigned long long)svc->bytes_in_use,
	     gone, (unsigned long long)svc->module_bytes);
	/* A load runs on no stream: the one its request named. */
	service_note_refusal(svc, b->conn->set->connection_id, b->req->stream,
			     bytes, GPUCMD_EQUOTA, b->message);
	return GPUCMD_EQUOTA;
}

static int op_load_module(struct command_ctx *ctx, struct batch *b, size_t i,
			  const Gpucmd__OpLoadModule *op)
{
	struct stream_set *set = b->conn->set;
	struct module_compiled *pre = b->compiled ? &b->compiled[i] : NULL;
	const uint8_t *data;
	struct module_ref *m;
	char err[256], log[400];
	size_t len;
	int fmt, rc;

	if (op->module == 0 || find_module(set, op->module) != NULL)
		return fail(b, op->module ? GPUCMD_EEXIST : GPUCMD_EINVAL,
			    "module id %llu is %s: choose another non-zero id",
			    (unsigned long long)op->module,
			    op->module ? "already loaded" : "invalid");
	fmt = module_format_parse(op->format);
	if (fmt < 0)
		return fail(b, GPUCMD_EINVAL,
			    "module format '%.32s' is not ptx, cubin, fatbin "
			    "or cuda",
			    op->format);
	rc = payload(b, &op->data, op->region, &data, &len);
	if (rc != 0)
		return rc;
	rc = module_quota(ctx, b, op->module, fmt, data, len);
	if (rc != 0)
		return rc;
	/*
	 * A module not in the cache whose globals could not fit is refused
	 * before it is loaded: loading it would take their memory from the
	 * other services, if only until the check after.  (CUDA C is sized
	 * once compiled, below.  One compiled off this thread already, which
	 * the session does only for globals within the memory_limit, is
	 * unloaded with the batch.)
	 */
	if (fmt != DRIVER_MODULE_CUDA_C &&
	    module_cache_lookup(ctx->modules, (enum driver_module_format)fmt,
				data, len, b->conn->service->id) == NULL) {
		rc = module_fits(ctx, b, op->module,
				 module_image_static_bytes(data, len, NULL));
		if (rc != 0)
			return rc;
	}
	m = streams_module_ref_new();
	if (m == NULL)
		return fail(b, GPUCMD_ENOMEM, "out of host memory");
	rc = module_cache_get(ctx->modules, (enum driver_module_format)fmt,
			      data, len, b->conn->service->id, pre, &m->entry,
			      err, sizeof(err), log, sizeof(log));
	if (rc != 0) {
		bool same = strcmp(log, err) == 0;

		streams_module_ref_free(m);
		return fail(b, rc,
			    "cannot load module %llu (%s, %zu bytes): "
			    "%s%s%s",
			    (unsigned long long)op->module, op->format, len,
			    err, log[0] && !same ? "; log: " : "",
			    same ? "" : log);
	}
	if (!service_module_held(b->conn->service, m->entry)) {
		rc = module_fits(ctx, b, op->module,
				 module_entry_static_bytes(m->entry));
		if (rc != 0) {
			/* Unloaded at once if its globals are large. */
			module_cache_put(ctx->modules, m->entry);
			streams_module_ref_free(m);
			return rc;
		}
	}
	if (service_module_ref(b->conn->service, m->entry,
			       module_entry_static_bytes(m->entry)) != 0) {
		module_cache_put(ctx->modules, m->entry);
		streams_module_ref_free(m);
		return fail(b, GPUCMD_ENOMEM, "out of host memory");
	}
	m->id = op->module;
	m->next = set->modules;
	set->modules = m;
	result_done(&b->results[i]);
	return 0;
}

static int op_unload_module(struct command_ctx *ctx, struct batch *b, size_t i,
			    const Gpucmd__OpUnloadModule *op)
{
	struct module_ref **pp;

	for (pp = &b->conn->set->modules; *pp != NULL; pp = &(*pp)->next) {
		struct module_ref *m = *pp;

		if (m->id != op->module)
			continue;
		*pp = m->next;
		/*
		 * The id is gone at once; the cache reference, and the
		 * service's count of it, stay until the launches already
		 * enqueued have run (streams.c), so the module cannot be
		 * evicted under them, and a service cannot hold more than
		 * its max_modules by unloading what still runs.
		 */
		streams_drop_module(b->conn->set, b->stream, m);
		result_done(&b->results[i]);
		return 0;
	}
	return fail(b, GPUCMD_ENOTFOUND,
		    "module %llu is not loaded on this connection",
		    (unsigned long long)op->module);
}

/* ---- shared regions ------------------------------------------------------- */

static int op_region_attach(struct command_ctx *ctx, struct batch *b, size_t i,
			    const Gpucmd__OpRegionAttach *op)
{
	int fd, rc;

	(void)ctx;
	if (b->fds_used >= b->nfds)
		return fail(b, GPUCMD_EPROTO,
			    "region %llu: no descriptor came with this request",
			    (unsigned long long)op->region);
	fd = b->fds[b->fds_used++];
	rc = region_attach(b->conn->set, op->region, fd, op->size, b->message,
			   sizeof(b->message));
	if (rc == 0)
		result_done(&b->results[i]);
	return rc;
}

static int op_region_release(struct command_ctx *ctx, struct batch *b, size_t i,
			     const Gpucmd__OpRegionRelease *op)
{
	(void)ctx;
	if (region_release(b->conn->set, b->stream, op->region) != 0)
		return fail(b, GPUCMD_ENOTFOUND,
			    "region %llu is not attached to this connection",
			    (unsigned long long)op->region);
	result_done(&b->results[i]);
	return 0;
}

/* The bytes a RegionRef names, bounds-checked. */
static int region_bytes(struct batch *b, const Gpucmd__RegionRef *ref,
			uint8_t **out)
{
	struct region *r = region_find(b->conn->set, ref->region);

	if (r == NULL)
		return fail(b, GPUCMD_ENOTFOUND,
			    "region %llu is not attached to this connection",
			    (unsigned long long)ref->region);
	if (region_check(r, ref->offset, ref->length, b->message,
			 sizeof(b->message)) != 0)
		return GPUCMD_EINVAL;
	/*
	 * Its release waits for this batch (a copy may come of it).  A batch
	 * on no stream (dispatch_needs_stream: a load_module from a region)
	 * reads the bytes there and then and enqueues nothing: no fence.
	 */
	if (b->stream != NULL)
		region_note_use(r, b->stream);
	*out = r->base + ref->offset;
	return 0;
}

/* ---- the batch ------------------------------------------------------------ */

static int run_op(struct command_ctx *ctx, struct batch *b, size_t i)
{
	const Gpucmd__Op *op = b->req->ops[i];

	switch (op->op_case) {
	case GPUCMD__OP__OP_EMPTY:
		return op_empty(ctx, b, i, op->empty);
	case GPUCMD__OP__OP_CREATE_WITH_DATA:
		return op_create(ctx, b, i, op->create_with_data);
	case GPUCMD__OP__OP_WRITE:
		return op_write(ctx, b, i, op->write);
	case GPUCMD__OP__OP_READ:
		return op_read(ctx, b, i, op->read);
	case GPUCMD__OP__OP_RELEASE:
		return op_release(ctx, b, i, op->release);
	case GPUCMD__OP__OP_KERNEL:
		return op_kernel(ctx, b, i, op->kernel);
	case GPUCMD__OP__OP_SYNC:
		return op_sync(ctx, b, i);
	case GPUCMD__OP__OP_MEMORY_USAGE:
		return op_memory_usage(ctx, b, i);
	case GPUCMD__OP__OP_PING:
		result_done(&b->results[i]);
		return 0;
	case GPUCMD__OP__OP_MEMORY_REPORT:
		return op_memory_report(ctx, b, i);
	case GPUCMD__OP__OP_STATUS:
		return op_status(ctx, b, i);
	case GPUCMD__OP__OP_RESERVE:
		return op_reserve(ctx, b, i, op->reserve);
	case GPUCMD__OP__OP_BIND:
		return op_bind(ctx, b, i, op->bind);
	case GPUCMD__OP__OP_CURSOR:
		return op_cursor(ctx, b, i);
	case GPUCMD__OP__OP_STREAM_REPORT:
		return op_stream_report(ctx, b, i);
	case GPUCMD__OP__OP_MEMORY_CLEANUP:
		return op_memory_cleanup(ctx, b, i);
	case GPUCMD__OP__OP_FLUSH_DROPS:
		return op_flush_drops(ctx, b, i);
	case GPUCMD__OP__OP_ALLOCATION_MODE:
		return op_allocation_mode(ctx, b, i, op->allocation_mode);
	case GPUCMD__OP__OP_INSTALL_POOLS:
		return op_install_pools(ctx, b, i, op->install_pools);
	case GPUCMD__OP__OP_RESERVE_CPU:
		return op_reserve_cpu(ctx, b, i, op->reserve_cpu);
	case GPUCMD__OP__OP_PROFILE_BEGIN:
		return op_profile_begin(ctx, b, i, op->profile_begin);
	case GPUCMD__OP__OP_PROFILE_END:
		return op_profile_end(ctx, b, i, op->profile_end);
	case GPUCMD__OP__OP_CAPTURE_BEGIN:
		return op_capture_begin(ctx, b, i);
	case GPUCMD__OP__OP_CAPTURE_END:
		return op_capture_end(ctx, b, i, op->capture_end);
	case GPUCMD__OP__OP_GRAPH_LAUNCH:
		return op_graph_launch(ctx, b, i, op->graph_launch);
	case GPUCMD__OP__OP_GRAPH_DESTROY:
		return op_graph_destroy(ctx, b, i, op->graph_destroy);
	case GPUCMD__OP__OP_CLEANUP:
		return op_cleanup(ctx, b, i, op->cleanup);
	case GPUCMD__OP__OP_REGION_ATTACH:
		return op_region_attach(ctx, b, i, op->region_attach);
	case GPUCMD__OP__OP_REGION_RELEASE:
		return op_region_release(ctx, b, i, op->region_release);
	case GPUCMD__OP__OP_LOAD_MODULE:
		return op_load_module(ctx, b, i, op->load_module);
	case GPUCMD__OP__OP_UNLOAD_MODULE:
		return op_unload_module(ctx, b, i, op->unload_module);
	case GPUCMD__OP__OP_SHARE:
		return op_share(ctx, b, i, op->share);
	case GPUCMD__OP__OP_IMPORT:
		return op_import(ctx, b, i, op->import);
	case GPUCMD__OP__OP_EVICT:
		return fail(b, GPUCMD_EINVAL,
			    "evict must be the only op of its request");
	case GPUCMD__OP__OP__NOT_SET:
	default:
		/* protobuf-c keeps a member it does not know as unknown. */
		if (op->base.n_unknown_fields > 0)
			return fail(b, GPUCMD_EPROTO,
				    "op %zu is of a kind this daemon does not "
				    "know (Op field %u): upgrade gpucmdd or "
				    "leave it out",
				    i,
				    (unsigned)op->base.unknown_fields[0].tag);
		return fail(b, GPUCMD_EPROTO,
			    "op %zu names no operation (no field of Op is "
			    "set)",
			    i);
	}
}

bool dispatch_needs_stream(const Gpucmd__Request *req)
{
	if (req->n_ops == 0)
		return true; /* an empty batch is a stream's no-op */
	for (size_t i = 0; i < req->n_ops; i++) {
		if (req->ops[i] == NULL)
			return true; /* refused the usual way */
		switch (req->ops[i]->op_case) {
		case GPUCMD__OP__OP_PING:
		case GPUCMD__OP__OP_STATUS:
		case GPUCMD__OP__OP_MEMORY_REPORT:
		case GPUCMD__OP__OP_CLEANUP:
		case GPUCMD__OP__OP_REGION_ATTACH:
		case GPUCMD__OP__OP_REGION_RELEASE:
		case GPUCMD__OP__OP_LOAD_MODULE:
		/*
		 * Refused here (evict must be alone; the loop runs that one),
		 * and an observer may send it: no stream for it either.
		 */
		case GPUCMD__OP__OP_EVICT:
			break;
		default:
			return true;
		}
	}
	return false;
}

/*
 * Whether an op after op i runs device code, which can fault: a read or
 * sync at i then needs a fence of its own, or the batch's last fence
 * would pin that later fault on it (executor_barrier).
 */
static bool may_fault_after(const Gpucmd__Request *req, size_t i)
{
	for (size_t k = i + 1; k < req->n_ops; k++) {
		if (req->ops[k] == NULL)
			return false; /* the batch stops there */
		if (req->ops[k]->op_case == GPUCMD__OP__OP_KERNEL ||
		    req->ops[k]->op_case == GPUCMD__OP__OP_GRAPH_LAUNCH)
			return true;
	}
	return false;
}

void dispatch_batch(struct command_ctx *ctx, struct batch *b)
{
	size_t n = b->req->n_ops;
	size_t i;
	int rc;

	b->results = calloc(n + 1, sizeof(*b->results));
	b->result_ptrs = calloc(n + 1, sizeof(*b->result_ptrs));
	if (b->results == NULL || b->result_ptrs == NULL) {
		b->error = fail(b, GPUCMD_ENOMEM,
				"the daemon is out of host memory for a batch "
				"of %zu ops",
				n);
		return;
	}
	/*
	 * A batch of connection-wide ops runs on no stream (b->stream stays
	 * NULL, and the executor answers it as soon as its ops ran): none of
	 * them enqueues device work or orders anything on a stream.
	 */
	b->stream = NULL;
	if (dispatch_needs_stream(b->req)) {
		rc = streams_get(b->conn->set, b->req->stream, &b->stream,
				 b->message, sizeof(b->message));
		if (rc != 0) {
			b->stream = NULL;
			b->error = rc;
			return;
		}
	}
	for (i = 0; i < n; i++) {
		gpucmd__op_result__init(&b->results[i]);
		b->result_ptrs[i] = &b->results[i];
		if (b->req->ops[i] == NULL) {
			rc = fail(b, GPUCMD_EPROTO, "op %zu is empty", i);
		} else {
			struct graph *rec =
				b->stream != NULL ? b->stream->recording : NULL;
			uint32_t before = rec != NULL ? rec->nops : 0;

			rc = run_op(ctx, b, i);
			/*
			 * A failed op recorded nothing: it does not use up the
			 * connection's bound on recorded ops.  (Its graph
			 * holds stay, as buffers kept alive a little longer.)
			 */
			if (rc != 0 && rec != NULL &&
			    rec == b->stream->recording && rec->nops > before)
				graph_unrecord_ops(rec, rec->nops - before);
		}
		if (rc != 0)
			break;
		if (b->fence_index < 0 &&
		    (b->req->ops[i]->op_case == GPUCMD__OP__OP_READ ||
		     b->req->ops[i]->op_case == GPUCMD__OP__OP_SYNC)) {
			b->fence_index = (int)i;
			if (may_fault_after(b->req, i))
				executor_barrier(b->ex, b);
		}
	}
	b->nresults = i;
	b->ran = i;
	if (rc != 0) {
		b->error = rc;
		b->failed_index = (uint32_t)i;
	}
}

void dispatch_batch_free(struct command_ctx *ctx, struct batch *b)
{
	/* Its replays have run: the batch completed, or was never run. */
	if (b->replay_ops != 0)
		b->conn->set->replay_ops -= b->replay_ops;
	b->replay_ops = 0;
	/* Descriptors no attach op took (the batch failed before them). */
	for (size_t i = b->fds_used; i < b->nfds; i++)
		close(b->fds[i]);
	free(b->fds);
	while (b->profiles != NULL) {
		struct profile_result *p = b->profiles;

		b->profiles = p->next;
		ctx->driver->ops->event_destroy(ctx->driver, p->start);
		ctx->driver->ops->event_destroy(ctx->driver, p->end);
		free(p);
	}
	if (b->reads != NULL)
		for (size_t i = 0; i < b->req->n_ops; i++)
			if (b->reads[i].data != NULL)
				command_free_cpu(ctx, &b->reads[i]);
	free(b->reads);
	free(b->results);
	free(b->result_ptrs);
	arena_free(b);
}
