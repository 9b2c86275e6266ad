/*
 * batch.c - building a batch (the protobuf Request of one round trip) and
 * the submit / wait / run calls that send it and collect its response.
 *
 * Each queued op is one allocation: the Op, its message, and a tail holding
 * whatever the op points at (inline data, kernel arguments, the kernel's
 * name).  Copying inline data there lets the caller free its buffer as soon
 * as the builder returns, and lets a batch be freed op by op without caring
 * which kind each op is.
 *
 * Limits from the Welcome are checked as ops are queued where the answer is
 * already known (ops per batch, data larger than a frame), so the caller
 * learns at the op that broke it, not at submit.
 *
 * Ops on shared regions name a range (region, offset, length) instead of
 * carrying bytes; whether the range lies inside the region is the
 * daemon's to say, with the numbers.  A batch that attaches regions holds
 * their descriptors (borrowed from the region table) in op order, and
 * submit sends them with the frame.
 */
#include "batch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connection.h"
#include "frame.h"
#include "response.h"

struct gpucmd_batch {
	struct gpucmd_conn *conn;
	Gpucmd__Request req; /* ops point into batch_op blocks */
	size_t cap;
	int *fds; /* of the region_attach ops, in op order */
	size_t nfds;
	int error;	 /* the first builder's refusal, or 0 */
	size_t error_op; /* the index the refused op would have had */
};

struct batch_op {
	Gpucmd__Op op;
	union {
		Gpucmd__OpEmpty empty;
		Gpucmd__OpCreateWithData create_with_data;
		Gpucmd__OpWrite write;
		Gpucmd__OpRead read;
		Gpucmd__OpRelease release;
		Gpucmd__OpKernel kernel;
		Gpucmd__OpSync sync;
		Gpucmd__OpMemoryUsage memory_usage;
		Gpucmd__OpPing ping;
		Gpucmd__OpMemoryReport memory_report;
		Gpucmd__OpStatus status;
		Gpucmd__OpReserve reserve;
		Gpucmd__OpBind bind;
		Gpucmd__OpCursor cursor;
		Gpucmd__OpStreamReport stream_report;
		Gpucmd__OpMemoryCleanup memory_cleanup;
		Gpucmd__OpFlushDrops flush_drops;
		Gpucmd__OpAllocationMode allocation_mode;
		Gpucmd__OpInstallPools install_pools;
		Gpucmd__OpReserveCpu reserve_cpu;
		Gpucmd__OpProfileBegin profile_begin;
		Gpucmd__OpProfileEnd profile_end;
		Gpucmd__OpCaptureBegin capture_begin;
		Gpucmd__OpCaptureEnd capture_end;
		Gpucmd__OpGraphLaunch graph_launch;
		Gpucmd__OpGraphDestroy graph_destroy;
		Gpucmd__OpEvict evict;
		Gpucmd__OpCleanup cleanup;
		Gpucmd__OpRegionAttach region_attach;
		Gpucmd__OpRegionRelease region_release;
		Gpucmd__OpLoadModule load_module;
		Gpucmd__OpUnloadModule unload_module;
		Gpucmd__OpShare share;
		Gpucmd__OpImport import;
	} m;
	Gpucmd__RegionRef ref; /* write, read, create: a region range */
	bool pooled;	       /* from frame_buf_alloc (a large tail) */
	bool plain;	       /* no tail: may go to the connection's spares */
	struct batch_op *next; /* among the spares */
	/* extra bytes follow; the struct's size keeps them 8-byte aligned */
};

/*
 * Ops with this much tail (an inline write's copy of its data) come from
 * frame.c's pool of large buffers: a fresh 64 MiB block was zeroed and then
 * faulted in page by page while the data was copied in.
 */
#define BATCH_POOLED_MIN (64u << 10)

/* Free an op block from batch_push. */
static void op_free(Gpucmd__Op *op)
{
	struct batch_op *o = (struct batch_op *)op; /* op is its first member */

	if (o == NULL)
		return;
	if (o->pooled)
		frame_buf_free((uint8_t *)o);
	else
		free(o);
}

/*
 * Spare op blocks a connection keeps, and the ops array a spare batch may
 * keep.
 */
#define BATCH_CACHE_OPS 64
#define BATCH_CACHE_CAP 64

GPUCMD_EXTERN int gpucmd_batch_new(struct gpucmd_conn *conn, uint32_t stream,
				   struct gpucmd_batch **out)
{
	struct batch_cache *cache;
	struct gpucmd_batch *b;
	Gpucmd__Op **ops = NULL;
	size_t cap = 0;

	if (conn == NULL || out == NULL)
		return GPUCMD_EINVAL;
	cache = conn_batch_cache(conn);
	b = cache->batch;
	if (b != NULL) {
		cache->batch = NULL;
		ops = b->req.ops;
		cap = b->cap;
		memset(b, 0, sizeof(*b));
	} else {
		b = calloc(1, sizeof(*b));
		if (b == NULL)
			return -ENOMEM;
	}
	b->conn = conn;
	gpucmd__request__init(&b->req);
	b->req.ops = ops;
	b->cap = cap;
	b->req.stream = stream;
	*out = b;
	return 0;
}

GPUCMD_EXTERN void gpucmd_batch_free(struct gpucmd_batch *b)
{
	if (b == NULL)
		return;
	/* Each op is one block starting with its Op (struct batch_op). */
	for (size_t i = 0; i < b->req.n_ops; i++)
		op_free(b->req.ops[i]);
	free(b->req.ops);
	free(b->fds);
	free(b);
}

/*
 * A submitted batch: its small parts go to the connection's spares (the
 * connection is alive: submit just used it), the rest is freed.
 */
static void batch_recycle(struct gpucmd_batch *b)
{
	struct batch_cache *cache = conn_batch_cache(b->conn);

	for (size_t i = 0; i < b->req.n_ops; i++) {
		struct batch_op *o = (struct batch_op *)b->req.ops[i];

		if (o->plain && cache->nops < BATCH_CACHE_OPS) {
			o->next = cache->ops;
			cache->ops = o;
			cache->nops++;
		} else {
			op_free(&o->op);
		}
	}
	b->req.n_ops = 0;
	free(b->fds);
	b->fds = NULL;
	if (cache->batch == NULL && b->cap <= BATCH_CACHE_CAP) {
		cache->batch = b;
		return;
	}
	free(b->req.ops);
	free(b);
}

void batch_cache_clear(struct batch_cache *c)
{
	while (c->ops != NULL) {
		struct batch_op *o = c->ops;

		c->ops = o->next;
		free(o);
	}
	c->nops = 0;
	if (c->batch != NULL) {
		free(c->batch->req.ops);
		free(c->batch);
		c->batch = NULL;
	}
}

GPUCMD_EXTERN size_t gpucmd_batch_count(const struct gpucmd_batch *b)
{
	return b != NULL ? b->req.n_ops : 0;
}

GPUCMD_EXTERN int gpucmd_batch_error(const struct gpucmd_batch *b)
{
	return b != NULL ? b->error : GPUCMD_EINVAL;
}

/* Tail of an op block: where its variable-length parts live. */
static void *op_tail(struct batch_op *o)
{
	return o + 1;
}

/*
 * Append an op of kind with extra tail bytes; the caller fills in its
 * message.  The block is zeroed so an unfilled field reads as absent.
 */
/*
 * a + b, or SIZE_MAX where that overflows: a tail of a caller's length plus
 * more, which batch_push then refuses (GPUCMD_ELIMIT) instead of taking the
 * wrapped sum for the room to copy len bytes into.
 */
static size_t tail_sum(size_t a, size_t b)
{
	return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

/*
 * A builder's refusal: the op is not queued, and the batch remembers the
 * first one, so that later builders add nothing and submit sends nothing
 * (a batch that ran without one of its ops would compute something else).
 * Returns the first refusal.
 */
static int batch_refuse(struct gpucmd_batch *b, int code)
{
	if (b == NULL)
		return code;
	if (b->error == 0) {
		b->error = code;
		b->error_op = b->req.n_ops;
	}
	return b->error;
}

static int batch_push(struct gpucmd_batch *b, Gpucmd__Op__OpCase kind,
		      size_t extra, struct batch_op **out)
{
	const struct gpucmd_info *info;
	struct batch_op *o;

	if (b == NULL)
		return GPUCMD_EINVAL;
	if (b->error != 0)
		return b->error;
	info = gpucmd_info(b->conn);
	if (info->max_ops_per_batch > 0 &&
	    b->req.n_ops >= info->max_ops_per_batch)
		return batch_refuse(b, GPUCMD_ELIMIT);
	if (extra > info->max_frame_bytes)
		return batch_refuse(b, GPUCMD_ELIMIT);
	if (b->req.n_ops == b->cap) {
		size_t cap = b->cap ? 2 * b->cap : 8;
		Gpucmd__Op **ops = realloc(b->req.ops, cap * sizeof(*ops));

		if (ops == NULL)
			return batch_refuse(b, -ENOMEM);
		b->req.ops = ops;
		b->cap = cap;
	}
	if (sizeof(*o) + extra >= BATCH_POOLED_MIN) {
		/* Every user of a large tail writes all of it. */
		o = (struct batch_op *)frame_buf_alloc(sizeof(*o) + extra);
		if (o == NULL)
			return batch_refuse(b, -ENOMEM);
		memset(o, 0, sizeof(*o));
		o->pooled = true;
	} else if (extra == 0 && conn_batch_cache(b->conn)->ops != NULL) {
		struct batch_cache *cache = conn_batch_cache(b->conn);

		o = cache->ops;
		cache->ops = o->next;
		cache->nops--;
		memset(o, 0, sizeof(*o));
		o->plain = true;
	} else {
		o = calloc(1, sizeof(*o) + extra);
		if (o == NULL)
			return batch_refuse(b, -ENOMEM);
		o->plain = extra == 0;
	}
	gpucmd__op__init(&o->op);
	o->op.op_case = kind;
	b->req.ops[b->req.n_ops++] = &o->op;
	*out = o;
	return 0;
}

/* Undo the last batch_push (an op that turned out to be invalid). */
static void batch_pop(struct gpucmd_batch *b)
{
	op_free(b->req.ops[--b->req.n_ops]);
}

/* Copy len bytes of data to where (in an op's tail) and describe them. */
static void copy_data(void *where, const void *data, size_t len,
		      ProtobufCBinaryData *to)
{
	if (len > 0)
		memcpy(where, data, len);
	to->data = len > 0 ? where : NULL;
	to->len = len;
}

GPUCMD_EXTERN int gpucmd_batch_empty(struct gpucmd_batch *b, uint64_t handle,
				     uint64_t size)
{
	struct batch_op *o;
	int r;

	if (handle == 0)
		return batch_refuse(b, GPUCMD_EINVAL);
	r = batch_push(b, GPUCMD__OP__OP_EMPTY, 0, &o);
	if (r < 0)
		return r;
	gpucmd__op_empty__init(&o->m.empty);
	o->m.empty.handle = handle;
	o->m.empty.size = size;
	o->op.empty = &o->m.empty;
	return 0;
}

/* The op's region range: region, offset, length. */
static Gpucmd__RegionRef *range(struct batch_op *o, uint64_t region,
				uint64_t offset, uint64_t length)
{
	gpucmd__region_ref__init(&o->ref);
	o->ref.region = region;
	o->ref.offset = offset;
	o->ref.length = length;
	return &o->ref;
}

GPUCMD_EXTERN int gpucmd_batch_create_with_data(struct gpucmd_batch *b,
						uint64_t handle,
						const void *data, size_t len)
{
	struct batch_op *o;
	int r;

	if (handle == 0 || (data == NULL && len > 0))
		return batch_refuse(b, GPUCMD_EINVAL);
	r = batch_push(b, GPUCMD__OP__OP_CREATE_WITH_DATA, len, &o);
	if (r < 0)
		return r;
	gpucmd__op_create_with_data__init(&o->m.create_with_data);
	o->m.create_with_data.handle = handle;
	copy_data(op_tail(o), data, len, &o->m.create_with_data.data);
	o->op.create_with_data = &o->m.create_with_data;
	return 0;
}

GPUCMD_EXTERN int gpucmd_batch_create_region(struct gpucmd_batch *b,
					     uint64_t handle, uint64_t region,
					     uint64_t region_offset,
					     uint64_t len)
{
	struct batch_op *o;
	int r;

	if (handle == 0 || region == 0)
		return batch_refuse(b, GPUCMD_EINVAL);
	r = batch_push(b, GPUCMD__OP__OP_CREATE_WITH_DATA, 0, &o);
	if (r < 0)
		return r;
	gpucmd__op_create_with_data__init(&o->m.create_with_data);
	o->m.create_with_data.handle = handle;
	o->m.create_with_data.region = range(o, region, region_offset, len);
	o->op.create_with_data = &o->m.create_with_data;
	return 0;
}

/* Room in an op's tail for a copy layout: the message, shape, strides. */
static size_t layout_tail(const struct gpucmd_layout *l)
{
	return l != NULL ? sizeof(Gpucmd__CopyLayout) +
				   2 * l->rank * sizeof(uint64_t) :
			   0;
}

/*
 * A layout the daemon could make sense of: 1 to GPUCMD_MAX_RANK dimensions
 * and elements of some size.  Whether the strides are ones it copies is the
 * daemon's to say (GPUCMD_ESTRIDES), so that every client gets one answer.
 */
static int layout_check(const struct gpucmd_layout *l)
{
	if (l == NULL)
		return 0;
	if (l->rank == 0 || l->rank > GPUCMD_MAX_RANK || l->elem_size == 0)
		return GPUCMD_EINVAL;
	return 0;
}

/*
 * Put a copy of l at the start of the op's tail and return where the
 * tail goes on (the CopyLayout comes first: it has the strictest alignment).
 */
static uint8_t *layout_copy(struct batch_op *o, const struct gpucmd_layout *l,
			    Gpucmd__CopyLayout **out)
{
	uint8_t *tail = op_tail(o);
	Gpucmd__CopyLayout *w;

	if (l == NULL) {
		*out = NULL;
		return tail;
	}
	w = (Gpucmd__CopyLayout *)tail;
	gpucmd__copy_layout__init(w);
	w->shape = (uint64_t *)(w + 1);
	w->strides = w->shape + l->rank;
	memcpy(w->shape, l->shape, l->rank * sizeof(uint64_t));
	memcpy(w->strides, l->strides, l->rank * sizeof(uint64_t));
	w->n_shape = l->rank;
	w->n_strides = l->rank;
	w->elem_size = l->elem_size;
	*out = w;
	return (uint8_t *)(w->strides + l->rank);
}

/* Bytes a (checked) layout's elements take packed; EINVAL past 2^64. */
static int layout_bytes(const struct gpucmd_layout *l, uint64_t *out)
{
	uint64_t n = l->elem_size;

	for (uint32_t i = 0; i < l->rank; i++)
		if (__builtin_mul_overflow(n, l->shape[i], &n))
			return GPUCMD_EINVAL;
	*out = n;
	return 0;
}

/*
 * A write of len bytes: inline data, or (region not 0, data NULL) the
 * range of region at region_offset.
 */
static int batch_write(struct gpucmd_batch *b, uint64_t handle, uint64_t offset,
		       const struct gpucmd_layout *layout, const void *data,
		       size_t len, uint64_t region, uint64_t region_offset)
{
	size_t inline_len = region != 0 ? 0 : len;
	struct batch_op *o;
	uint8_t *tail;
	int r;

	if (handle == 0 || (data == NULL && inline_len > 0))
		return batch_refuse(b, GPUCMD_EINVAL);
	r = layout_check(layout);
	if (r < 0)
		return batch_refuse(b, r);
	r = batch_push(b, GPUCMD__OP__OP_WRITE,
		       tail_sum(layout_tail(layout), inline_len), &o);
	if (r < 0)
		return r;
	gpucmd__op_write__init(&o->m.write);
	o->m.write.handle = handle;
	o->m.write.offset = offset;
	tail = layout_copy(o, layout, &o->m.write.layout);
	if (region != 0)
		o->m.write.region = range(o, region, region_offset, len);
	else
		copy_data(tail, data, len, &o->m.write.data);
	o->op.write = &o->m.write;
	return 0;
}

GPUCMD_EXTERN int gpucmd_batch_write(struct gpucmd_batch *b, uint64_t handle,
				     uint64_t offset, const void *data,
				     size_t len)
{
	return batch_write(b, handle, offset, NULL, data, len, 0, 0);
}

GPUCMD_EXTERN int gpucmd_batch_write_borrowed(struct gpucmd_batch *b,
					      uint64_t handle, uint64_t offset,
					      const void *data, size_t len)
{
	struct batch_op *o;
	int r;

	if (b == NULL || handle == 0 || (data == NULL && len > 0))
		return batch_refuse(b, GPUCMD_EINVAL);
	/* What batch_push checks of a copy's tail. */
	if (len > gpucmd_info(b->conn)->max_frame_bytes)
		return batch_refuse(b, GPUCMD_ELIMIT);
	r = batch_push(b, GPUCMD__OP__OP_WRITE, 0, &o);
	if (r < 0)
		return r;
	gpucmd__op_write__init(&o->m.write);
	o->m.write.handle = handle;
	o->m.write.offset = offset;
	/* The encoder references large data where it is (frame.h). */
	o->m.write.data.data = len > 0 ? (uint8_t *)(uintptr_t)data : NULL;
	o->m.write.data.len = len;
	o->op.write = &o->m.write;
	return 0;
}

GPUCMD_EXTERN int gpucmd_batch_write_layout(struct gpucmd_batch *b,
					    uint64_t handle, uint64_t offset,
					    const struct gpucmd_layout *layout,
					    const void *data, size_t len)
{
	if (layout == NULL)
		return batch_refuse(b, GPUCMD_EINVAL);
	return batch_write(b, handle, offset, layout, data, len, 0, 0);
}

GPUCMD_EXTERN int gpucmd_batch_write_region(struct gpucmd_batch *b,
					    uint64_t handle, uint64_t offset,
					    uint64_t region,
					    uint64_t region_offset,
					    uint64_t len)
{
	if (region == 0)
		return batch_refuse(b, GPUCMD_EINVAL);
	return batch_write(b, handle, offset, NULL, NULL, len, region,
			   region_offset);
}

GPUCMD_EXTERN int
gpucmd_batch_write_region_layout(struct gpucmd_batch *b, uint64_t handle,
				 uint64_t offset,
				 const struct gpucmd_layout *layout,
				 uint64_t region, uint64_t region_offset)
{
	uint64_t len;
	int r;

	if (layout == NULL || region == 0)
		return batch_refuse(b, GPUCMD_EINVAL);
	r = layout_check(layout);
	if (r == 0)
		r = layout_bytes(layout, &len);
	if (r < 0)
		return batch_refuse(b, r);
	return batch_write(b, handle, offset, layout, NULL, len, region,
			   region_offset);
}

/*
 * A read of len bytes (a layout's, when there is one): into the reply, or
 * (region not 0) into the range of region at region_offset.
 */
static int batch_read(struct gpucmd_batch *b, uint64_t handle, uint64_t offset,
		      uint64_t len, const struct gpucmd_layout *layout,
		      uint64_t region, uint64_t region_offset)
{
	uint64_t dense = len;
	struct batch_op *o;
	int r;

	if (handle == 0)
		return batch_refuse(b, GPUCMD_EINVAL);
	r = layout_check(layout);
	if (r == 0 && layout != NULL && region != 0)
		r = layout_bytes(layout, &dense);
	if (r < 0)
		return batch_refuse(b, r);
	r = batch_push(b, GPUCMD__OP__OP_READ, layout_tail(layout), &o);
	if (r < 0)
		return r;
	gpucmd__op_read__init(&o->m.read);
	o->m.read.handle = handle;
	o->m.read.offset = offset;
	o->m.read.length = len;
	layout_copy(o, layout, &o->m.read.layout);
	if (region != 0)
		o->m.read.into = range(o, region, region_offset, dense);
	o->op.read = &o->m.read;
	return 0;
}

GPUCMD_EXTERN int gpucmd_batch_read(struct gpucmd_batch *b, uint64_t handle,
				    uint64_t offset, uint64_t len)
{
	return batch_read(b, handle, offset, len, NULL, 0, 0);
}

GPUCMD_EXTERN int gpucmd_batch_read_layout(struct gpucmd_batch *b,
					   uint64_t handle, uint64_t offset,
					   const struct gpucmd_layout *layout)
{
	if (layout == NULL)
		return batch_refuse(b, GPUCMD_EINVAL);
	return batch_read(b, handle, offset, 0, layout, 0, 0);
}

GPUCMD_EXTERN int gpucmd_batch_read_region(struct gpucmd_batch *b,
					   uint64_t handle, uint64_t offset,
					   uint64_t len, uint64_t region,
					   uint64_t region_offset)
{
	if (region == 0)
		return batch_refuse(b, GPUCMD_EINVAL);
	return batch_read(b, handle, offset, len, NULL, region, region_offset);
}

GPUCMD_EXTERN int
gpucmd_batch_read_region_layout(struct gpucmd_batch *b, uint64_t handle,
				uint64_t offset,
				const struct gpucmd_layout *layout,
				uint64_t region, uint64_t region_offset)
{
	if (layout == NULL || region == 0)
		return batch_refuse(b, GPUCMD_EINVAL);
	return batch_read(b, handle, offset, 0, layout, region, region_offset);
}

GPUCMD_EXTERN int gpucmd_batch_release(struct gpucmd_batch *b, uint64_t handle)
{
	struct batch_op *o;
	int r;

	if (handle == 0)
		return batch_refuse(b, GPUCMD_EINVAL);
	r = batch_push(b, GPUCMD__OP__OP_RELEASE, 0, &o);
	if (r < 0)
		return r;
	gpucmd__op_release__init(&o->m.release);
	o->m.release.handle = handle;
	o->op.release = &o->m.release;
	return 0;
}

/*
 * Queue an op whose message has no field, or (v not NULL) one uint64
 * field.  protobuf-c's descriptors say which message an op kind carries
 * and where its field is, so one function serves them all, and a kind
 * whose message does not have that shape is refused, not half-filled.
 */
static int batch_add_simple(struct gpucmd_batch *b, Gpucmd__Op__OpCase kind,
			    const uint64_t *v)
{
	const ProtobufCFieldDescriptor *f =
		protobuf_c_message_descriptor_get_field(&gpucmd__op__descriptor,
							(unsigned)kind);
	const ProtobufCMessageDescriptor *md;
	struct batch_op *o;
	int r;

	if (f == NULL || f->type != PROTOBUF_C_TYPE_MESSAGE)
		return batch_refuse(b, GPUCMD_EINVAL);
	md = f->descriptor;
	if (md->n_fields != (v != NULL ? 1u : 0u) ||
	    (v != NULL && md->fields[0].type != PROTOBUF_C_TYPE_UINT64) ||
	    md->sizeof_message > sizeof(o->m))
		return batch_refuse(b, GPUCMD_EINVAL);
	r = batch_push(b, kind, 0, &o);
	if (r < 0)
		return r;
	protobuf_c_message_init(md, &o->m);
	if (v != NULL)
		memcpy((uint8_t *)&o->m + md->fields[0].offset, v, sizeof(*v));
	/* The op's oneof member is the pointer at the field's offset. */
	*(void **)((uint8_t *)&o->op + f->offset) = &o->m;
	return 0;
}

int batch_add_plain(struct gpucmd_batch *b, Gpucmd__Op__OpCase kind)
{
	return batch_add_simple(b, kind, NULL);
}

static int batch_add_u64(struct gpucmd_batch *b, Gpucmd__Op__OpCase kind,
			 uint64_t v)
{
	return batch_add_simple(b, kind, &v);
}

/* An evict or a cleanup: a service name (NULL: "") in the op's tail. */
static int batch_add_service(struct gpucmd_batch *b, Gpucmd__Op__OpCase kind,
			     const char *service, uint64_t connection_id)
{
	struct batch_op *o;
	char *name;
	int r;

	if (service == NULL)
		service = "";
	r = batch_push(b, kind, strlen(service) + 1, &o);
	if (r < 0)
		return r;
	name = op_tail(o);
	memcpy(name, service, strlen(service) + 1);
	if (kind == GPUCMD__OP__OP_EVICT) {
		gpucmd__op_evict__init(&o->m.evict);
		o->m.evict.service = name;
		o->m.evict.connection_id = connection_id;
		o->op.evict = &o->m.evict;
	} else {
		gpucmd__op_cleanup__init(&o->m.cleanup);
		o->m.cleanup.service = name;
		o->op.cleanup = &o->m.cleanup;
	}
	return 0;
}

int batch_add_evict(struct gpucmd_batch *b, const char *service,
		    uint64_t connection_id)
{
	return batch_add_service(b, GPUCMD__OP__OP_EVICT, service,
				 connection_id);
}

int batch_add_cleanup(struct gpucmd_batch *b, const char *service)
{
	return batch_add_service(b, GPUCMD__OP__OP_CLEANUP, service, 0);
}

int batch_add_region_attach(struct gpucmd_batch *b, uint64_t region,
			    uint64_t size, int fd)
{
	struct batch_op *o;
	int *fds;
	int r;

	if (b == NULL || fd < 0)
		return batch_refuse(b, GPUCMD_EINVAL);
	fds = realloc(b->fds, (b->nfds + 1) * sizeof(*fds));
	if (fds == NULL)
		return batch_refuse(b, -ENOMEM);
	b->fds = fds;
	r = batch_push(b, GPUCMD__OP__OP_REGION_ATTACH, 0, &o);
	if (r < 0)
		return r;
	gpucmd__op_region_attach__init(&o->m.region_attach);
	o->m.region_attach.region = region;
	o->m.region_attach.size = size;
	o->op.region_attach = &o->m.region_attach;
	b->fds[b->nfds++] = fd;
	return 0;
}

GPUCMD_EXTERN int gpucmd_batch_release_region(struct gpucmd_batch *b,
					      uint64_t region)
{
	/* The library's own regions are released by the library. */
	if (region == 0 || region >= GPUCMD_REGION_ID_RESERVED)
		return batch_refuse(b, GPUCMD_EINVAL);
	return batch_add_u64(b, GPUCMD__OP__OP_REGION_RELEASE, region);
}

int batch_add_region_release(struct gpucmd_batch *b, uint64_t region)
{
	return batch_add_u64(b, GPUCMD__OP__OP_REGION_RELEASE, region);
}

GPUCMD_EXTERN int gpucmd_batch_sync(struct gpucmd_batch *b)
{
	return batch_add_plain(b, GPUCMD__OP__OP_SYNC);
}

GPUCMD_EXTERN int gpucmd_batch_memory_usage(struct gpucmd_batch *b)
{
	return batch_add_plain(b, GPUCMD__OP__OP_MEMORY_USAGE);
}

GPUCMD_EXTERN int gpucmd_batch_ping(struct gpucmd_batch *b)
{
	return batch_add_plain(b, GPUCMD__OP__OP_PING);
}

GPUCMD_EXTERN int gpucmd_batch_reserve(struct gpucmd_batch *b,
				       uint64_t reservation, uint64_t size)
{
	struct batch_op *o;
	int r;

	if (reservation == 0)
		return batch_refuse(b, GPUCMD_EINVAL);
	r = batch_push(b, GPUCMD__OP__OP_RESERVE, 0, &o);
	if (r < 0)
		return r;
	gpucmd__op_reserve__init(&o->m.reserve);
	o->m.reserve.reservation = reservation;
	o->m.reserve.size = size;
	o->op.reserve = &o->m.reserve;
	return 0;
}

GPUCMD_EXTERN int gpucmd_batch_bind(struct gpucmd_batch *b,
				    uint64_t reservation, uint64_t handle)
{
	struct batch_op *o;
	int r;

	/* An unknown reservation is the daemon's to refuse: it knows. */
	if (handle == 0)
		return batch_refuse(b, GPUCMD_EINVAL);
	r = batch_push(b, GPUCMD__OP__OP_BIND, 0, &o);
	if (r < 0)
		return r;
	gpucmd__op_bind__init(&o->m.bind);
	o->m.bind.reservation = reservation;
	o->m.bind.handle = handle;
	o->op.bind = &o->m.bind;
	return 0;
}

GPUCMD_EXTERN int gpucmd_batch_cursor(struct gpucmd_batch *b)
{
	return batch_add_plain(b, GPUCMD__OP__OP_CURSOR);
}

GPUCMD_EXTERN int gpucmd_batch_stream_report(struct gpucmd_batch *b)
{
	return batch_add_plain(b, GPUCMD__OP__OP_STREAM_REPORT);
}

GPUCMD_EXTERN int gpucmd_batch_memory_cleanup(struct gpucmd_batch *b)
{
	return batch_add_plain(b, GPUCMD__OP__OP_MEMORY_CLEANUP);
}

GPUCMD_EXTERN int gpucmd_batch_flush_drops(struct gpucmd_batch *b)
{
	return batch_add_plain(b, GPUCMD__OP__OP_FLUSH_DROPS);
}

GPUCMD_EXTERN int gpucmd_batch_allocation_mode(struct gpucmd_batch *b,
					       enum gpucmd_allocation_mode mode)
{
	struct batch_op *o;
	int r;

	if (mode != GPUCMD_MODE_AUTO && mode != GPUCMD_MODE_PERSISTENT)
		return batch_refuse(b, GPUCMD_EINVAL);
	r = batch_push(b, GPUCMD__OP__OP_ALLOCATION_MODE, 0, &o);
	if (r < 0)
		return r;
	gpucmd__op_allocation_mode__init(&o->m.allocation_mode);
	o->m.allocation_mode.mode =
		mode == GPUCMD_MODE_PERSISTENT ?
			GPUCMD__ALLOCATION_MODE__PERSISTENT :
			GPUCMD__ALLOCATION_MODE__AUTO;
	o->op.allocation_mode = &o->m.allocation_mode;
	return 0;
}

/*
 * The tail of an install_pools op, in order of decreasing alignment: the
 * MemoryLayout, the PoolOptions, the pointers to them, then the strings
 * (preset, each pool's kind).  Kinds are checked by the daemon, which
 * names the pool that is wrong; the library only needs them to be there.
 */
GPUCMD_EXTERN int
gpucmd_batch_install_pools(struct gpucmd_batch *b, const char *preset,
			   const struct gpucmd_pool_options *pools,
			   size_t npools)
{
	Gpucmd__MemoryLayout *l;
	Gpucmd__PoolOptions *w;
	struct batch_op *o;
	size_t extra;
	char *str;
	int r;

	/* The cap on npools only keeps the size below from overflowing. */
	if (preset == NULL || (pools == NULL && npools > 0) ||
	    npools > UINT16_MAX)
		return batch_refuse(b, GPUCMD_EINVAL);
	if (npools > 0 && strcmp(preset, "custom") != 0)
		return batch_refuse(b, GPUCMD_EINVAL);
	extra = sizeof(*l) + npools * (sizeof(*w) + sizeof(w)) +
		strlen(preset) + 1;
	for (size_t i = 0; i < npools; i++) {
		if (pools[i].kind == NULL)
			return batch_refuse(b, GPUCMD_EINVAL);
		extra += strlen(pools[i].kind) + 1;
	}
	r = batch_push(b, GPUCMD__OP__OP_INSTALL_POOLS, extra, &o);
	if (r < 0)
		return r;
	l = op_tail(o);
	gpucmd__memory_layout__init(l);
	w = (Gpucmd__PoolOptions *)(l + 1);
	l->pools = (Gpucmd__PoolOptions **)(w + npools);
	str = (char *)(l->pools + npools);
	l->preset = str;
	str = stpcpy(str, preset) + 1;
	for (size_t i = 0; i < npools; i++) {
		gpucmd__pool_options__init(&w[i]);
		w[i].kind = str;
		str = stpcpy(str, pools[i].kind) + 1;
		w[i].page_size = pools[i].page_size;
		w[i].max_slice = pools[i].max_slice;
		w[i].max_pool_size = pools[i].max_pool_size;
		w[i].max_alloc = pools[i].max_alloc;
		w[i].dealloc_period = pools[i].dealloc_period;
		w[i].reclaim_at = pools[i].reclaim_at;
		l->pools[i] = &w[i];
	}
	l->n_pools = npools;
	if (npools == 0)
		l->pools = NULL;
	gpucmd__op_install_pools__init(&o->m.install_pools);
	o->m.install_pools.layout = l;
	o->op.install_pools = &o->m.install_pools;
	return 0;
}

GPUCMD_EXTERN int gpucmd_batch_reserve_cpu(struct gpucmd_batch *b,
					   uint64_t size)
{
	return batch_add_u64(b, GPUCMD__OP__OP_RESERVE_CPU, size);
}

GPUCMD_EXTERN int gpucmd_batch_profile_begin(struct gpucmd_batch *b,
					     uint64_t profile)
{
	return batch_add_u64(b, GPUCMD__OP__OP_PROFILE_BEGIN, profile);
}

GPUCMD_EXTERN int gpucmd_batch_profile_end(struct gpucmd_batch *b,
					   uint64_t profile)
{
	return batch_add_u64(b, GPUCMD__OP__OP_PROFILE_END, profile);
}

GPUCMD_EXTERN int gpucmd_batch_capture_begin(struct gpucmd_batch *b)
{
	return batch_add_plain(b, GPUCMD__OP__OP_CAPTURE_BEGIN);
}

GPUCMD_EXTERN int gpucmd_batch_capture_end(struct gpucmd_batch *b,
					   uint64_t graph)
{
	return batch_add_u64(b, GPUCMD__OP__OP_CAPTURE_END, graph);
}

GPUCMD_EXTERN int gpucmd_batch_capture_abort(struct gpucmd_batch *b)
{
	/* capture_end of graph 0: the daemon discards the recording. */
	return batch_add_u64(b, GPUCMD__OP__OP_CAPTURE_END, 0);
}

GPUCMD_EXTERN int gpucmd_batch_graph_launch(struct gpucmd_batch *b,
					    uint64_t graph)
{
	return batch_add_u64(b, GPUCMD__OP__OP_GRAPH_LAUNCH, graph);
}

GPUCMD_EXTERN int gpucmd_batch_graph_destroy(struct gpucmd_batch *b,
					     uint64_t graph)
{
	return batch_add_u64(b, GPUCMD__OP__OP_GRAPH_DESTROY, graph);
}

/* Fill a wire argument from a public one; GPUCMD_EINVAL for a bad kind. */
static int kernel_arg(Gpucmd__KernelArg *w, const struct gpucmd_arg *a)
{
	gpucmd__kernel_arg__init(w);
	switch (a->kind) {
	case GPUCMD_ARG_BUFFER:
		if (a->v.handle == 0)
			return GPUCMD_EINVAL;
		w->value_case = GPUCMD__KERNEL_ARG__VALUE_BUFFER;
		w->buffer = a->v.handle;
		return 0;
	case GPUCMD_ARG_BUFFER_IN:
		if (a->v.handle == 0)
			return GPUCMD_EINVAL;
		w->value_case = GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN;
		w->buffer_in = a->v.handle;
		return 0;
	case GPUCMD_ARG_U32:
		w->value_case = GPUCMD__KERNEL_ARG__VALUE_U32;
		w->u32 = a->v.u32;
		return 0;
	case GPUCMD_ARG_I32:
		w->value_case = GPUCMD__KERNEL_ARG__VALUE_I32;
		w->i32 = a->v.i32;
		return 0;
	case GPUCMD_ARG_U64:
		w->value_case = GPUCMD__KERNEL_ARG__VALUE_U64;
		w->u64 = a->v.u64;
		return 0;
	case GPUCMD_ARG_F32:
		w->value_case = GPUCMD__KERNEL_ARG__VALUE_F32;
		w->f32 = a->v.f32;
		return 0;
	}
	return GPUCMD_EINVAL;
}

/*
 * The tail of a kernel op, in order of decreasing alignment: the argument
 * messages, the pointers to them, grid, block, and the name.  A missing
 * grid or block means one block of one thread.
 */
GPUCMD_EXTERN int gpucmd_batch_kernel(struct gpucmd_batch *b, const char *name,
				      const uint32_t grid[3],
				      const uint32_t block[3],
				      const struct gpucmd_arg *args,
				      size_t nargs)
{
	return gpucmd_batch_kernel_shared(b, name, grid, block, 0, args, nargs);
}

static int kernel_op(struct gpucmd_batch *b, uint64_t module, const char *name,
		     const uint32_t grid[3], const uint32_t block[3],
		     uint32_t shared_bytes, const struct gpucmd_arg *args,
		     size_t nargs);

GPUCMD_EXTERN int
gpucmd_batch_kernel_shared(struct gpucmd_batch *b, const char *name,
			   const uint32_t grid[3], const uint32_t block[3],
			   uint32_t shared_bytes, const struct gpucmd_arg *args,
			   size_t nargs)
{
	return kernel_op(b, 0, name, grid, block, shared_bytes, args, nargs);
}

GPUCMD_EXTERN int
gpucmd_batch_kernel_module(struct gpucmd_batch *b, uint64_t module,
			   const char *function, const uint32_t grid[3],
			   const uint32_t block[3], uint32_t shared_bytes,
			   const struct gpucmd_arg *args, size_t nargs)
{
	if (module == 0)
		return batch_refuse(b, GPUCMD_EINVAL);
	return kernel_op(b, module, function, grid, block, shared_bytes, args,
			 nargs);
}

GPUCMD_EXTERN int gpucmd_batch_load_module(struct gpucmd_batch *b,
					   uint64_t module, const char *format,
					   const void *data, size_t len)
{
	size_t flen;
	struct batch_op *o;
	int r;

	if (module == 0 || format == NULL || (data == NULL && len > 0))
		return batch_refuse(b, GPUCMD_EINVAL);
	flen = strlen(format) + 1;
	r = batch_push(b, GPUCMD__OP__OP_LOAD_MODULE, tail_sum(len, flen), &o);
	if (r < 0)
		return r;
	gpucmd__op_load_module__init(&o->m.load_module);
	o->m.load_module.module = module;
	copy_data(op_tail(o), data, len, &o->m.load_module.data);
	o->m.load_module.format = (char *)op_tail(o) + len;
	memcpy(o->m.load_module.format, format, flen);
	o->op.load_module = &o->m.load_module;
	return 0;
}

/* share and import: a handle and a name (copied into the op's tail). */
static int shared_op(struct gpucmd_batch *b, Gpucmd__Op__OpCase kind,
		     uint64_t handle, const char *name)
{
	struct batch_op *o;
	size_t len;
	int r;

	if (handle == 0 || name == NULL)
		return batch_refuse(b, GPUCMD_EINVAL);
	len = strlen(name);
	if (len == 0 || len > 63)
		return batch_refuse(b, GPUCMD_EINVAL);
	r = batch_push(b, kind, len + 1, &o);
	if (r < 0)
		return r;
	memcpy(op_tail(o), name, len + 1);
	if (kind == GPUCMD__OP__OP_SHARE) {
		gpucmd__op_share__init(&o->m.share);
		o->m.share.handle = handle;
		o->m.share.name = op_tail(o);
		o->op.share = &o->m.share;
	} else {
		gpucmd__op_import__init(&o->m.import);
		o->m.import.handle = handle;
		o->m.import.name = op_tail(o);
		o->op.import = &o->m.import;
	}
	return 0;
}

GPUCMD_EXTERN int gpucmd_batch_share(struct gpucmd_batch *b, uint64_t handle,
				     const char *name)
{
	return shared_op(b, GPUCMD__OP__OP_SHARE, handle, name);
}

GPUCMD_EXTERN int gpucmd_batch_import(struct gpucmd_batch *b, uint64_t handle,
				      const char *name)
{
	return shared_op(b, GPUCMD__OP__OP_IMPORT, handle, name);
}

GPUCMD_EXTERN int gpucmd_batch_unload_module(struct gpucmd_batch *b,
					     uint64_t module)
{
	struct batch_op *o;
	int r;

	if (module == 0)
		return batch_refuse(b, GPUCMD_EINVAL);
	r = batch_push(b, GPUCMD__OP__OP_UNLOAD_MODULE, 0, &o);
	if (r < 0)
		return r;
	gpucmd__op_unload_module__init(&o->m.unload_module);
	o->m.unload_module.module = module;
	o->op.unload_module = &o->m.unload_module;
	return 0;
}

static int kernel_op(struct gpucmd_batch *b, uint64_t module, const char *name,
		     const uint32_t grid[3], const uint32_t block[3],
		     uint32_t shared_bytes, const struct gpucmd_arg *args,
		     size_t nargs)
{
	static const uint32_t one[3] = { 1, 1, 1 };
	Gpucmd__OpKernel *k;
	Gpucmd__KernelArg *wargs;
	struct batch_op *o;
	size_t name_len;
	uint8_t *tail;
	int r;

	/* The cap on nargs only keeps the size below from overflowing. */
	if (name == NULL || name[0] == '\0' || (args == NULL && nargs > 0) ||
	    nargs > UINT16_MAX)
		return batch_refuse(b, GPUCMD_EINVAL);
	name_len = strlen(name) + 1;
	r = batch_push(b, GPUCMD__OP__OP_KERNEL,
		       nargs * (sizeof(*wargs) + sizeof(wargs)) +
			       6 * sizeof(uint32_t) + name_len,
		       &o);
	if (r < 0)
		return r;
	k = &o->m.kernel;
	gpucmd__op_kernel__init(k);
	tail = op_tail(o);
	wargs = (Gpucmd__KernelArg *)tail;
	k->args = (Gpucmd__KernelArg **)(wargs + nargs);
	k->grid = (uint32_t *)(k->args + nargs);
	k->block = k->grid + 3;
	k->name = (char *)(k->block + 3);
	for (size_t i = 0; i < nargs; i++) {
		r = kernel_arg(&wargs[i], &args[i]);
		if (r < 0) {
			batch_pop(b);
			return batch_refuse(b, r);
		}
		k->args[i] = &wargs[i];
	}
	k->n_args = nargs;
	memcpy(k->grid, grid != NULL ? grid : one, 3 * sizeof(uint32_t));
	memcpy(k->block, block != NULL ? block : one, 3 * sizeof(uint32_t));
	k->n_grid = 3;
	k->n_block = 3;
	k->shared_bytes = shared_bytes;
	k->module = module;
	memcpy(k->name, name, name_len);
	if (nargs == 0)
		k->args = NULL;
	o->op.kernel = k;
	return 0;
}

/*
 * Why submit sends no batch: the refusal its builders met, with what
 * each code means there (the builders return only the code).
 */
static int batch_refused(struct gpucmd_batch *b)
{
	const struct gpucmd_info *info = gpucmd_info(b->conn);
	char why[200];

	if (b->error == GPUCMD_ELIMIT)
		snprintf(why, sizeof(why),
			 "the batch held max_ops_per_batch (%u) ops, or the "
			 "op's data was over max_frame_bytes (%u)",
			 info->max_ops_per_batch, info->max_frame_bytes);
	else if (b->error == GPUCMD_EINVAL)
		snprintf(why, sizeof(why),
			 "an argument was invalid: a handle, region or "
			 "module of 0, a NULL pointer with a length, an empty "
			 "name, a bad layout, pool or kernel argument");
	else if (b->error == -ENOMEM)
		snprintf(why, sizeof(why), "this process ran out of memory");
	else
		snprintf(why, sizeof(why), "%s", gpucmd_strerror(b->error));
	return conn_refuse(b->conn, b->error,
			   "the batch was not sent (a batch goes whole or "
			   "not at all): the builder of its op %zu (counting "
			   "from 0) refused it with %s: %s",
			   b->error_op, gpucmd_errname(b->error), why);
}

GPUCMD_EXTERN int gpucmd_submit(struct gpucmd_batch *b, uint64_t *id)
{
	uint64_t got;
	int r;

	/* Without an id the response could never be collected. */
	if (b == NULL || id == NULL) {
		gpucmd_batch_free(b);
		return GPUCMD_EINVAL;
	}
	if (b->error != 0) {
		r = batch_refused(b);
		gpucmd_batch_free(b);
		return r;
	}
	r = conn_submit(b->conn, &b->req, b->fds, b->nfds, &got);
	batch_recycle(b);
	if (r < 0)
		return r;
	*id = got;
	return 0;
}

GPUCMD_EXTERN int gpucmd_submit_detached(struct gpucmd_batch *b)
{
	struct gpucmd_conn *conn;
	uint64_t id;
	int r;

	if (b == NULL)
		return GPUCMD_EINVAL;
	conn = b->conn;
	r = gpucmd_submit(b, &id);
	if (r < 0)
		return r;
	conn_abandon(conn, id, true);
	return 0;
}

GPUCMD_EXTERN int gpucmd_wait_timeout(struct gpucmd_conn *conn, uint64_t id,
				      int timeout_ms,
				      struct gpucmd_response **out)
{
	Gpucmd__Frame *f;
	int r;

	if (conn == NULL || out == NULL)
		return GPUCMD_EINVAL;
	r = conn_wait(conn, id, timeout_ms, &f);
	if (r < 0)
		return r;
	r = response_new(f, out);
	if (r < 0)
		frame_free(f);
	return r;
}

GPUCMD_EXTERN int gpucmd_wait(struct gpucmd_conn *conn, uint64_t id,
			      struct gpucmd_response **out)
{
	if (conn == NULL)
		return GPUCMD_EINVAL;
	return gpucmd_wait_timeout(conn, id, conn_timeout(conn), out);
}

GPUCMD_EXTERN int gpucmd_run(struct gpucmd_batch *b,
			     struct gpucmd_response **out)
{
	struct gpucmd_conn *conn;
	uint64_t id;
	int r;

	if (b == NULL || out == NULL) {
		gpucmd_batch_free(b);
		return GPUCMD_EINVAL;
	}
	conn = b->conn;
	r = gpucmd_submit(b, &id);
	if (r < 0)
		return r;
	r = gpucmd_wait(conn, id, out);
	/* The caller never saw id: nobody could collect it later. */
	if (r == -ETIMEDOUT)
		conn_abandon(conn, id, false);
	return r;
}
