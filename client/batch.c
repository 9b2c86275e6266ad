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
 */
#include "batch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "connection.h"
#include "frame.h"
#include "response.h"

struct gpucmd_batch {
	struct gpucmd_conn *conn;
	Gpucmd__Request req;	/* ops point into batch_op blocks */
	size_t cap;
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
	} m;
	/* extra bytes follow; the struct's size keeps them 8-byte aligned */
};

GPUCMD_EXTERN int gpucmd_batch_new(struct gpucmd_conn *conn, uint32_t stream,
				   struct gpucmd_batch **out)
{
	struct gpucmd_batch *b;

	if (conn == NULL || out == NULL)
		return GPUCMD_EINVAL;
	b = calloc(1, sizeof(*b));
	if (b == NULL)
		return -ENOMEM;
	b->conn = conn;
	gpucmd__request__init(&b->req);
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
		free(b->req.ops[i]);
	free(b->req.ops);
	free(b);
}

GPUCMD_EXTERN size_t gpucmd_batch_count(const struct gpucmd_batch *b)
{
	return b != NULL ? b->req.n_ops : 0;
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
static int batch_push(struct gpucmd_batch *b, Gpucmd__Op__OpCase kind,
		      size_t extra, struct batch_op **out)
{
	const struct gpucmd_info *info;
	struct batch_op *o;

	if (b == NULL)
		return GPUCMD_EINVAL;
	info = gpucmd_info(b->conn);
	if (info->max_ops_per_batch > 0 &&
	    b->req.n_ops >= info->max_ops_per_batch)
		return GPUCMD_ELIMIT;
	if (extra > info->max_frame_bytes)
		return GPUCMD_ELIMIT;
	if (b->req.n_ops == b->cap) {
		size_t cap = b->cap ? 2 * b->cap : 8;
		Gpucmd__Op **ops = realloc(b->req.ops, cap * sizeof(*ops));

		if (ops == NULL)
			return -ENOMEM;
		b->req.ops = ops;
		b->cap = cap;
	}
	o = calloc(1, sizeof(*o) + extra);
	if (o == NULL)
		return -ENOMEM;
	gpucmd__op__init(&o->op);
	o->op.op_case = kind;
	b->req.ops[b->req.n_ops++] = &o->op;
	*out = o;
	return 0;
}

/* Undo the last batch_push (an op that turned out to be invalid). */
static void batch_pop(struct gpucmd_batch *b)
{
	free(b->req.ops[--b->req.n_ops]);
}

/* Copy len bytes of data into the op's tail and describe them. */
static void copy_data(struct batch_op *o, const void *data, size_t len,
		      ProtobufCBinaryData *to)
{
	if (len > 0)
		memcpy(op_tail(o), data, len);
	to->data = len > 0 ? op_tail(o) : NULL;
	to->len = len;
}

GPUCMD_EXTERN int gpucmd_batch_empty(struct gpucmd_batch *b, uint64_t handle,
				     uint64_t size)
{
	struct batch_op *o;
	int r;

	if (handle == 0)
		return GPUCMD_EINVAL;
	r = batch_push(b, GPUCMD__OP__OP_EMPTY, 0, &o);
	if (r < 0)
		return r;
	gpucmd__op_empty__init(&o->m.empty);
	o->m.empty.handle = handle;
	o->m.empty.size = size;
	o->op.empty = &o->m.empty;
	return 0;
}

GPUCMD_EXTERN int gpucmd_batch_create_with_data(struct gpucmd_batch *b,
						uint64_t handle,
						const void *data, size_t len)
{
	struct batch_op *o;
	int r;

	if (handle == 0 || (data == NULL && len > 0))
		return GPUCMD_EINVAL;
	r = batch_push(b, GPUCMD__OP__OP_CREATE_WITH_DATA, len, &o);
	if (r < 0)
		return r;
	gpucmd__op_create_with_data__init(&o->m.create_with_data);
	o->m.create_with_data.handle = handle;
	copy_data(o, data, len, &o->m.create_with_data.data);
	o->op.create_with_data = &o->m.create_with_data;
	return 0;
}

GPUCMD_EXTERN int gpucmd_batch_write(struct gpucmd_batch *b, uint64_t handle,
				     uint64_t offset, const void *data,
				     size_t len)
{
	struct batch_op *o;
	int r;

	if (handle == 0 || (data == NULL && len > 0))
		return GPUCMD_EINVAL;
	r = batch_push(b, GPUCMD__OP__OP_WRITE, len, &o);
	if (r < 0)
		return r;
	gpucmd__op_write__init(&o->m.write);
	o->m.write.handle = handle;
	o->m.write.offset = offset;
	copy_data(o, data, len, &o->m.write.data);
	o->op.write = &o->m.write;
	return 0;
}

GPUCMD_EXTERN int gpucmd_batch_read(struct gpucmd_batch *b, uint64_t handle,
				    uint64_t offset, uint64_t len)
{
	struct batch_op *o;
	int r;

	if (handle == 0)
		return GPUCMD_EINVAL;
	r = batch_push(b, GPUCMD__OP__OP_READ, 0, &o);
	if (r < 0)
		return r;
	gpucmd__op_read__init(&o->m.read);
	o->m.read.handle = handle;
	o->m.read.offset = offset;
	o->m.read.length = len;
	o->op.read = &o->m.read;
	return 0;
}

GPUCMD_EXTERN int gpucmd_batch_release(struct gpucmd_batch *b, uint64_t handle)
{
	struct batch_op *o;
	int r;

	if (handle == 0)
		return GPUCMD_EINVAL;
	r = batch_push(b, GPUCMD__OP__OP_RELEASE, 0, &o);
	if (r < 0)
		return r;
	gpucmd__op_release__init(&o->m.release);
	o->m.release.handle = handle;
	o->op.release = &o->m.release;
	return 0;
}

int batch_add_plain(struct gpucmd_batch *b, Gpucmd__Op__OpCase kind)
{
	struct batch_op *o;
	int r;

	r = batch_push(b, kind, 0, &o);
	if (r < 0)
		return r;
	switch (kind) {
	case GPUCMD__OP__OP_SYNC:
		gpucmd__op_sync__init(&o->m.sync);
		o->op.sync = &o->m.sync;
		return 0;
	case GPUCMD__OP__OP_MEMORY_USAGE:
		gpucmd__op_memory_usage__init(&o->m.memory_usage);
		o->op.memory_usage = &o->m.memory_usage;
		return 0;
	case GPUCMD__OP__OP_PING:
		gpucmd__op_ping__init(&o->m.ping);
		o->op.ping = &o->m.ping;
		return 0;
	case GPUCMD__OP__OP_MEMORY_REPORT:
		gpucmd__op_memory_report__init(&o->m.memory_report);
		o->op.memory_report = &o->m.memory_report;
		return 0;
	case GPUCMD__OP__OP_STATUS:
		gpucmd__op_status__init(&o->m.status);
		o->op.status = &o->m.status;
		return 0;
	default:
		batch_pop(b);
		return GPUCMD_EINVAL;
	}
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
		return GPUCMD_EINVAL;
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
			return r;
		}
		k->args[i] = &wargs[i];
	}
	k->n_args = nargs;
	memcpy(k->grid, grid != NULL ? grid : one, 3 * sizeof(uint32_t));
	memcpy(k->block, block != NULL ? block : one, 3 * sizeof(uint32_t));
	k->n_grid = 3;
	k->n_block = 3;
	memcpy(k->name, name, name_len);
	if (nargs == 0)
		k->args = NULL;
	o->op.kernel = k;
	return 0;
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
	r = conn_submit(b->conn, &b->req, &got);
	gpucmd_batch_free(b);
	if (r < 0)
		return r;
	*id = got;
	return 0;
}

GPUCMD_EXTERN int gpucmd_wait(struct gpucmd_conn *conn, uint64_t id,
			      struct gpucmd_response **out)
{
	Gpucmd__Frame *f;
	int r;

	if (conn == NULL || out == NULL)
		return GPUCMD_EINVAL;
	r = conn_wait(conn, id, &f);
	if (r < 0)
		return r;
	r = response_new(f, out);
	if (r < 0)
		frame_free(f);
	return r;
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
	return gpucmd_wait(conn, id, out);
}
