/*
 * frame.c - packing and checking the frame header, encoding and decoding
 * Frame messages.  See frame.h for the layout.
 */
#include "frame.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpucmd.h"

static void put_le16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static uint16_t get_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
	       ((uint32_t)p[3] << 24);
}

void frame_header_pack(const struct frame_header *hdr, uint8_t *buf)
{
	put_le32(buf, hdr->magic);
	put_le16(buf + 4, hdr->version);
	put_le16(buf + 6, hdr->flags);
	put_le32(buf + 8, hdr->length);
}

void frame_header_unpack(const uint8_t *buf, struct frame_header *hdr)
{
	hdr->magic = get_le32(buf);
	hdr->version = get_le16(buf + 4);
	hdr->flags = get_le16(buf + 6);
	hdr->length = get_le32(buf + 8);
}

int frame_header_check(const struct frame_header *hdr, uint32_t max_body,
		       char *msg, size_t msg_len)
{
	char dummy[1];

	if (msg == NULL) {
		msg = dummy;
		msg_len = sizeof(dummy);
	}
	if (hdr->magic != FRAME_MAGIC) {
		snprintf(msg, msg_len,
			 "bad frame magic 0x%08x (expected 0x%08x \"GCMD\"): "
			 "the peer does not speak the gpucmd protocol",
			 hdr->magic, FRAME_MAGIC);
		return GPUCMD_EPROTO;
	}
	if (hdr->version != GPUCMD_PROTOCOL_VERSION) {
		snprintf(msg, msg_len,
			 "protocol version %u is not supported (this side "
			 "speaks %u): upgrade the older of client and daemon",
			 hdr->version, GPUCMD_PROTOCOL_VERSION);
		return GPUCMD_EVERSION;
	}
	if (hdr->flags != 0) {
		snprintf(msg, msg_len, "unknown frame flags 0x%04x",
			 hdr->flags);
		return GPUCMD_EPROTO;
	}
	if (max_body > FRAME_MAX_BODY)
		max_body = FRAME_MAX_BODY;
	if (hdr->length > max_body) {
		snprintf(msg, msg_len,
			 "frame body of %u bytes is over the limit of %u bytes "
			 "(max_frame_bytes): split the batch or move bulk data "
			 "through a shared region",
			 hdr->length, max_body);
		return GPUCMD_ELIMIT;
	}
	return 0;
}

/*
 * Responses are encoded by hand: a batch of 1024 kernels answers with 1024
 * OpResult{done}, and protobuf-c's generic pack (sizes, then bytes, each
 * through the descriptors) cost about 0.06 us per op, an eighth of the
 * daemon's CPU per batched launch.  The envelope and the `done` results are
 * written here; every other result and the error are packed by protobuf-c
 * in place.  Fields in field-number order, zero scalars left out, as
 * protobuf-c writes them: tests/unit/check_frame.c compares the bytes.
 */
static size_t varint_size(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

/* A field holding a sub-message of sub bytes: tag, length, body. */
static size_t field_size(size_t sub)
{
	return 1 + varint_size(sub) + sub;
}

static size_t result_size(const Gpucmd__OpResult *r)
{
	if (r->result_case == GPUCMD__OP_RESULT__RESULT_DONE &&
	    r->base.n_unknown_fields == 0)
		return 2;
	return protobuf_c_message_get_packed_size(&r->base);
}

static size_t response_size(const Gpucmd__Response *r)
{
	size_t n = 0;

	if (r->id != 0)
		n += 1 + varint_size(r->id);
	for (size_t i = 0; i < r->n_results; i++)
		n += field_size(result_size(r->results[i]));
	if (r->error != NULL)
		n += field_size(
			protobuf_c_message_get_packed_size(&r->error->base));
	if (r->failed_index != 0)
		n += 1 + varint_size(r->failed_index);
	return n;
}

static uint8_t *put_message(uint8_t *p, uint8_t tag, const ProtobufCMessage *m)
{
	size_t sub = protobuf_c_message_get_packed_size(m);

	*p++ = tag;
	p = put_varint(p, sub);
	return p + protobuf_c_message_pack(m, p);
}

static uint8_t *response_pack(const Gpucmd__Response *r, size_t body,
			      uint8_t *p)
{
	*p++ = (5 << 3) | 2; /* Frame.response */
	p = put_varint(p, body);
	if (r->id != 0) {
		*p++ = (1 << 3) | 0;
		p = put_varint(p, r->id);
	}
	for (size_t i = 0; i < r->n_results; i++) {
		const Gpucmd__OpResult *res = r->results[i];

		if (res->result_case == GPUCMD__OP_RESULT__RESULT_DONE &&
		    res->base.n_unknown_fields == 0) {
			*p++ = (2 << 3) | 2;
			*p++ = 2;
			*p++ = (1 << 3) | 0;
			*p++ = res->done ? 1 : 0;
		} else {
			p = put_message(p, (2 << 3) | 2, &res->base);
		}
	}
	if (r->error != NULL)
		p = put_message(p, (3 << 3) | 2, &r->error->base);
	if (r->failed_index != 0) {
		*p++ = (4 << 3) | 0;
		p = put_varint(p, r->failed_index);
	}
	return p;
}

/* A buffer for a frame of body bytes, its header written.  NULL: no memory. */
static uint8_t *frame_start(size_t body, bool pooled)
{
	struct frame_header hdr = {
		.magic = FRAME_MAGIC,
		.version = GPUCMD_PROTOCOL_VERSION,
		.flags = 0,
		.length = (uint32_t)body,
	};
	uint8_t *buf = pooled ? frame_buf_alloc(FRAME_HEADER_SIZE + body) :
				malloc(FRAME_HEADER_SIZE + body);

	if (buf != NULL)
		frame_header_pack(&hdr, buf);
	return buf;
}

static void frame_drop(uint8_t *buf, bool pooled)
{
	if (pooled)
		frame_buf_free(buf);
	else
		free(buf);
}

/* protobuf-c's encoding. */
static int encode_slow(const Gpucmd__Frame *f, bool pooled, uint8_t **out,
		       size_t *len)
{
	size_t body = gpucmd__frame__get_packed_size(f);
	uint8_t *buf;

	if (body > FRAME_MAX_BODY)
		return GPUCMD_ELIMIT;
	buf = frame_start(body, pooled);
	if (buf == NULL)
		return -ENOMEM;
	gpucmd__frame__pack(f, buf + FRAME_HEADER_SIZE);
	*out = buf;
	*len = FRAME_HEADER_SIZE + body;
	return 0;
}

static int encode(const Gpucmd__Frame *f, bool pooled, uint8_t **out,
		  size_t *len)
{
	size_t resp, body;
	uint8_t *buf;

	if (f->msg_case != GPUCMD__FRAME__MSG_RESPONSE ||
	    f->base.n_unknown_fields != 0 ||
	    f->response->base.n_unknown_fields != 0)
		return encode_slow(f, pooled, out, len);
	resp = response_size(f->response);
	body = field_size(resp);
	if (body > FRAME_MAX_BODY)
		return GPUCMD_ELIMIT;
	buf = frame_start(body, pooled);
	if (buf == NULL)
		return -ENOMEM;
	if (response_pack(f->response, resp, buf + FRAME_HEADER_SIZE) !=
	    buf + FRAME_HEADER_SIZE + body) {
		/*
		 * Sizes and writing disagree (a bug here): a pooled buffer
		 * holds an earlier frame's bytes, so never send it; protobuf-c
		 * encodes the frame instead.
		 */
		frame_drop(buf, pooled);
		return encode_slow(f, pooled, out, len);
	}
	*out = buf;
	*len = FRAME_HEADER_SIZE + body;
	return 0;
}

int frame_encode(const Gpucmd__Frame *f, uint8_t **out, size_t *len)
{
	return encode(f, false, out, len);
}

int frame_encode_buf(const Gpucmd__Frame *f, uint8_t **out, size_t *len)
{
	return encode(f, true, out, len);
}

/* ---- encoding as pieces ---------------------------------------------------- */

struct pieces_buffer {
	ProtobufCBuffer base; /* first: protobuf-c calls base.append */
	struct frame_pieces *p;
};

static int pieces_push(struct frame_pieces *p, const uint8_t *ext, size_t off,
		       size_t len)
{
	if (p->n == p->vcap) {
		size_t cap = p->vcap ? 2 * p->vcap : 16;
		struct frame_piece *v = realloc(p->v, cap * sizeof(*v));

		if (v == NULL)
			return -ENOMEM;
		p->v = v;
		p->vcap = cap;
	}
	p->v[p->n].ext = ext;
	p->v[p->n].off = off;
	p->v[p->n].len = len;
	p->n++;
	return 0;
}

/* Extend the scratch piece by len bytes for the caller to fill; NULL: no memory. */
static uint8_t *pieces_reserve(struct frame_pieces *p, size_t len)
{
	size_t at = p->used;

	if (p->used + len > p->cap) {
		size_t cap = p->cap ? p->cap : 1024;
		uint8_t *b;

		while (cap < p->used + len)
			cap *= 2;
		b = realloc(p->scratch, cap);
		if (b == NULL) {
			p->err = -ENOMEM;
			return NULL;
		}
		p->scratch = b;
		p->cap = cap;
	}
	if (p->n > 0 && p->v[p->n - 1].ext == NULL &&
	    p->v[p->n - 1].off + p->v[p->n - 1].len == at) {
		p->v[p->n - 1].len += len;
	} else if (pieces_push(p, NULL, at, len) != 0) {
		p->err = -ENOMEM;
		return NULL;
	}
	p->used += len;
	return p->scratch + at;
}

static void pieces_append(ProtobufCBuffer *buffer, size_t len,
			  const uint8_t *data)
{
	struct frame_pieces *p = ((struct pieces_buffer *)buffer)->p;
	uint8_t *to;

	if (p->err != 0 || len == 0)
		return;
	if (len >= FRAME_PIECE_REF_MIN &&
	    (p->may_ref == NULL || p->may_ref(data, len, p->may_ref_arg))) {
		if (pieces_push(p, data, 0, len) != 0)
			p->err = -ENOMEM;
		return;
	}
	to = pieces_reserve(p, len);
	if (to != NULL)
		memcpy(to, data, len);
}

/*
 * Requests are encoded by hand too, the client's side of the hot path:
 * protobuf-c's get_packed_size and pack took about half of libgpucmd's CPU
 * per op in a batch of 1024 kernels.  Kernels, pings, syncs and the flat
 * ops (no layout, no region) are written here in protobuf-c's order with
 * its rules (zero scalars and empty strings and bytes left out, oneof
 * members always written); a request with any other op is left to
 * protobuf-c.  tests/unit/check_frame.c compares the bytes.
 */
static size_t u64_field(uint64_t v)
{
	return v != 0 ? 1 + varint_size(v) : 0;
}

static size_t packed_u32_size(const uint32_t *v, size_t n)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++)
		k += varint_size(v[i]);
	return k;
}

static size_t arg_size(const Gpucmd__KernelArg *a)
{
	switch (a->value_case) {
	case GPUCMD__KERNEL_ARG__VALUE_BUFFER:
		return 1 + varint_size(a->buffer);
	case GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN:
		return 1 + varint_size(a->buffer_in);
	case GPUCMD__KERNEL_ARG__VALUE_U32:
		return 1 + varint_size(a->u32);
	case GPUCMD__KERNEL_ARG__VALUE_I32:
		return 1 + varint_size(((uint32_t)a->i32 << 1) ^
				       (uint32_t)(a->i32 >> 31));
	case GPUCMD__KERNEL_ARG__VALUE_U64:
		return 1 + varint_size(a->u64);
	case GPUCMD__KERNEL_ARG__VALUE_F32:
		return 5;
	default:
		return 0;
	}
}

/* The size of op's inner message, or false: not one written here. */
static bool op_inner_size(const Gpucmd__Op *op, size_t *out)
{
	size_t n = 0;

	if (op->base.n_unknown_fields != 0)
		return false;
	switch (op->op_case) {
	case GPUCMD__OP__OP_KERNEL: {
		const Gpucmd__OpKernel *k = op->kernel;
		size_t name = k->name != NULL ? strlen(k->name) : 0;

		if (k->base.n_unknown_fields != 0)
			return false;
		if (name > 0)
			n += field_size(name);
		if (k->n_grid > 0)
			n += field_size(packed_u32_size(k->grid, k->n_grid));
		if (k->n_block > 0)
			n += field_size(packed_u32_size(k->block, k->n_block));
		for (size_t i = 0; i < k->n_args; i++) {
			/* An argument of a kind not written here: protobuf-c. */
			if (k->args[i]->base.n_unknown_fields != 0 ||
			    arg_size(k->args[i]) == 0)
				return false;
			n += field_size(arg_size(k->args[i]));
		}
		n += u64_field(k->shared_bytes) + u64_field(k->module);
		break;
	}
	case GPUCMD__OP__OP_PING:
	case GPUCMD__OP__OP_SYNC:
		if (op->ping->base.n_unknown_fields != 0)
			return false;
		break;
	case GPUCMD__OP__OP_EMPTY:
		n = u64_field(op->empty->handle) + u64_field(op->empty->size);
		break;
	case GPUCMD__OP__OP_CREATE_WITH_DATA:
		if (op->create_with_data->region != NULL)
			return false;
		n = u64_field(op->create_with_data->handle);
		if (op->create_with_data->data.len > 0)
			n += field_size(op->create_with_data->data.len);
		break;
	case GPUCMD__OP__OP_WRITE:
		if (op->write->region != NULL || op->write->layout != NULL)
			return false;
		n = u64_field(op->write->handle) + u64_field(op->write->offset);
		if (op->write->data.len > 0)
			n += field_size(op->write->data.len);
		break;
	case GPUCMD__OP__OP_READ:
		if (op->read->into != NULL || op->read->layout != NULL)
			return false;
		n = u64_field(op->read->handle) + u64_field(op->read->offset) +
		    u64_field(op->read->length);
		break;
	case GPUCMD__OP__OP_RELEASE:
		n = u64_field(op->release->handle);
		break;
	default:
		return false;
	}
	if (op->op_case != GPUCMD__OP__OP_KERNEL &&
	    op->empty->base.n_unknown_fields != 0)
		return false;
	*out = n;
	return true;
}

static uint8_t *put_u64_field(uint8_t *p, unsigned number, uint64_t v)
{
	if (v == 0)
		return p;
	*p++ = (uint8_t)(number << 3);
	return put_varint(p, v);
}

static uint8_t *put_packed_u32(uint8_t *p, unsigned number, const uint32_t *v,
			       size_t n)
{
	if (n == 0)
		return p;
	*p++ = (uint8_t)((number << 3) | 2);
	p = put_varint(p, packed_u32_size(v, n));
	for (size_t i = 0; i < n; i++)
		p = put_varint(p, v[i]);
	return p;
}

static uint8_t *put_arg(uint8_t *p, const Gpucmd__KernelArg *a)
{
	uint32_t bits;

	*p++ = (4 << 3) | 2;
	*p++ = (uint8_t)arg_size(a); /* at most 11 bytes */
	switch (a->value_case) {
	case GPUCMD__KERNEL_ARG__VALUE_BUFFER:
		*p++ = (1 << 3) | 0;
		return put_varint(p, a->buffer);
	case GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN:
		*p++ = (6 << 3) | 0;
		return put_varint(p, a->buffer_in);
	case GPUCMD__KERNEL_ARG__VALUE_U32:
		*p++ = (2 << 3) | 0;
		return put_varint(p, a->u32);
	case GPUCMD__KERNEL_ARG__VALUE_I32:
		*p++ = (3 << 3) | 0;
		return put_varint(p, ((uint32_t)a->i32 << 1) ^
					     (uint32_t)(a->i32 >> 31));
	case GPUCMD__KERNEL_ARG__VALUE_U64:
		*p++ = (4 << 3) | 0;
		return put_varint(p, a->u64);
	case GPUCMD__KERNEL_ARG__VALUE_F32:
		*p++ = (5 << 3) | 5;
		memcpy(&bits, &a->f32, sizeof(bits));
		put_le32(p, bits);
		return p + 4;
	default:
		return p;
	}
}

/*
 * A bytes field: its tag and length into the scratch, its bytes too or,
 * when refs and large, referenced where they are.  The scratch position
 * after it, or NULL (out of memory).
 */
static uint8_t *put_bytes(struct frame_pieces *pc, uint8_t *p, unsigned number,
			  ProtobufCBinaryData d, bool refs)
{
	if (d.len == 0)
		return p;
	*p++ = (uint8_t)((number << 3) | 2);
	p = put_varint(p, d.len);
	if (!refs || d.len < FRAME_PIECE_REF_MIN) {
		memcpy(p, d.data, d.len);
		return p + d.len;
	}
	/* Close the scratch piece here, reference the bytes, go on after. */
	pc->used = (size_t)(p - pc->scratch);
	pc->v[pc->n - 1].len = pc->used - pc->v[pc->n - 1].off;
	if (pieces_push(pc, d.data, 0, d.len) != 0 ||
	    pieces_push(pc, NULL, pc->used, 0) != 0)
		return NULL;
	return p;
}

static uint8_t *put_op(struct frame_pieces *pc, uint8_t *p,
		       const Gpucmd__Op *op, size_t inner, bool refs)
{
	*p++ = (3 << 3) | 2; /* Request.ops */
	p = put_varint(p, 1 + varint_size(inner) + inner);
	*p++ = (uint8_t)(((unsigned)op->op_case << 3) | 2);
	p = put_varint(p, inner);
	switch (op->op_case) {
	case GPUCMD__OP__OP_KERNEL: {
		const Gpucmd__OpKernel *k = op->kernel;
		size_t name = k->name != NULL ? strlen(k->name) : 0;

		if (name > 0) {
			*p++ = (1 << 3) | 2;
			p = put_varint(p, name);
			memcpy(p, k->name, name);
			p += name;
		}
		p = put_packed_u32(p, 2, k->grid, k->n_grid);
		p = put_packed_u32(p, 3, k->block, k->n_block);
		for (size_t i = 0; i < k->n_args; i++)
			p = put_arg(p, k->args[i]);
		p = put_u64_field(p, 5, k->shared_bytes);
		return put_u64_field(p, 6, k->module);
	}
	case GPUCMD__OP__OP_EMPTY:
		p = put_u64_field(p, 1, op->empty->handle);
		return put_u64_field(p, 2, op->empty->size);
	case GPUCMD__OP__OP_CREATE_WITH_DATA:
		p = put_u64_field(p, 1, op->create_with_data->handle);
		return put_bytes(pc, p, 2, op->create_with_data->data, refs);
	case GPUCMD__OP__OP_WRITE:
		p = put_u64_field(p, 1, op->write->handle);
		p = put_u64_field(p, 2, op->write->offset);
		return put_bytes(pc, p, 3, op->write->data, refs);
	case GPUCMD__OP__OP_READ:
		p = put_u64_field(p, 1, op->read->handle);
		p = put_u64_field(p, 2, op->read->offset);
		return put_u64_field(p, 3, op->read->length);
	case GPUCMD__OP__OP_RELEASE:
		return put_u64_field(p, 1, op->release->handle);
	default:
		return p; /* ping, sync: empty */
	}
}

/*
 * f into p by hand: 0, a negative code, or 1 when f is not a request this
 * encoder writes (nothing was touched).
 */
static int pieces_fast(struct frame_pieces *pc, const Gpucmd__Frame *f)
{
	const Gpucmd__Request *r = f->request;
	size_t req = 0, body, inner, copied = 0;
	struct frame_header hdr;
	uint8_t *p;
	bool refs;

	/* A caller choosing what is referenced gets protobuf-c's path. */
	if (f->msg_case != GPUCMD__FRAME__MSG_REQUEST || pc->may_ref != NULL ||
	    f->base.n_unknown_fields != 0 || r->base.n_unknown_fields != 0)
		return 1;
	/* Each op is sized once: the sizes are written from this array. */
	if (r->n_ops > pc->sizes_cap) {
		size_t cap = r->n_ops < 64 ? 64 : r->n_ops;
		size_t *v = realloc(pc->sizes, cap * sizeof(*v));

		if (v == NULL)
			return -ENOMEM;
		pc->sizes = v;
		pc->sizes_cap = cap;
	}
	req = u64_field(r->id) + u64_field(r->stream);
	for (size_t i = 0; i < r->n_ops; i++) {
		if (!op_inner_size(r->ops[i], &inner))
			return 1;
		pc->sizes[i] = inner;
		req += field_size(field_size(inner));
	}
	body = field_size(req);
	if (body > FRAME_MAX_BODY)
		return GPUCMD_ELIMIT;
	refs = body > FRAME_PIECES_FLAT_MAX;
	/* The scratch holds all but the referenced bytes. */
	for (size_t i = 0; refs && i < r->n_ops; i++) {
		const Gpucmd__Op *op = r->ops[i];
		ProtobufCBinaryData d = { 0, NULL };

		if (op->op_case == GPUCMD__OP__OP_WRITE)
			d = op->write->data;
		else if (op->op_case == GPUCMD__OP__OP_CREATE_WITH_DATA)
			d = op->create_with_data->data;
		if (d.len >= FRAME_PIECE_REF_MIN)
			copied += d.len;
	}
	p = pieces_reserve(pc, FRAME_HEADER_SIZE + body - copied);
	if (p == NULL)
		return pc->err;
	hdr.magic = FRAME_MAGIC;
	hdr.version = GPUCMD_PROTOCOL_VERSION;
	hdr.flags = 0;
	hdr.length = (uint32_t)body;
	frame_header_pack(&hdr, p);
	p += FRAME_HEADER_SIZE;
	*p++ = (4 << 3) | 2; /* Frame.request */
	p = put_varint(p, req);
	p = put_u64_field(p, 1, r->id);
	p = put_u64_field(p, 2, r->stream);
	for (size_t i = 0; i < r->n_ops; i++) {
		p = put_op(pc, p, r->ops[i], pc->sizes[i], refs);
		if (p == NULL)
			return -ENOMEM;
	}
	/* Sizes and writing agree, or this encoder has a bug: say so. */
	if ((size_t)(p - pc->scratch) + copied != FRAME_HEADER_SIZE + body)
		return GPUCMD_EPROTO;
	/*
	 * The last scratch piece ends where the writing did; after data that
	 * ended the frame it is empty, and goes.
	 */
	pc->v[pc->n - 1].len = (size_t)(p - pc->scratch) - pc->v[pc->n - 1].off;
	if (pc->v[pc->n - 1].len == 0)
		pc->n--;
	pc->used = (size_t)(p - pc->scratch);
	pc->total = FRAME_HEADER_SIZE + body;
	return 0;
}

int frame_pieces_encode(struct frame_pieces *p, const Gpucmd__Frame *f)
{
	struct pieces_buffer buf = { .base.append = pieces_append, .p = p };
	size_t body;
	uint8_t head[FRAME_HEADER_SIZE];
	struct frame_header hdr;

	int rc;

	p->used = 0;
	p->n = 0;
	p->err = 0;
	p->total = 0;
	rc = pieces_fast(p, f);
	if (rc <= 0)
		return rc;
	body = gpucmd__frame__get_packed_size(f);
	if (body > FRAME_MAX_BODY)
		return GPUCMD_ELIMIT;
	hdr.magic = FRAME_MAGIC;
	hdr.version = GPUCMD_PROTOCOL_VERSION;
	hdr.flags = 0;
	hdr.length = (uint32_t)body;
	frame_header_pack(&hdr, head);
	pieces_append(&buf.base, sizeof(head), head);
	if (body <= FRAME_PIECES_FLAT_MAX) {
		/*
		 * Packing to a buffer sizes every sub-message again at each
		 * level; a frame without large payloads packs flat, faster.
		 */
		uint8_t *b = p->err == 0 ? pieces_reserve(p, body) : NULL;

		if (b != NULL && gpucmd__frame__pack(f, b) != body)
			p->err = GPUCMD_EPROTO;
	} else if (gpucmd__frame__pack_to_buffer(f, &buf.base) != body &&
		   p->err == 0) {
		p->err = GPUCMD_EPROTO;
	}
	if (p->err != 0)
		return p->err;
	p->total = FRAME_HEADER_SIZE + body;
	return 0;
}

const uint8_t *frame_piece_data(const struct frame_pieces *p, size_t i)
{
	return p->v[i].ext != NULL ? p->v[i].ext : p->scratch + p->v[i].off;
}

uint8_t *frame_pieces_join(const struct frame_pieces *p)
{
	uint8_t *out = frame_buf_alloc(p->total);
	size_t at = 0;

	for (size_t i = 0; out != NULL && i < p->n; i++) {
		if (p->v[i].len > p->total - at) {
			frame_buf_free(out);
			return NULL;
		}
		memcpy(out + at, frame_piece_data(p, i), p->v[i].len);
		at += p->v[i].len;
	}
	if (out != NULL && at != p->total) {
		frame_buf_free(out);
		return NULL;
	}
	return out;
}

void frame_pieces_free(struct frame_pieces *p)
{
	free(p->scratch);
	free(p->v);
	free(p->sizes);
	memset(p, 0, sizeof(*p));
}

/* ---- frame buffers ---------------------------------------------------------- */

/*
 * Buffers of whole frames: bodies read in one piece and encoded replies.
 * A large one is faulted in page by page when it is fresh (an inline write
 * of 64 MiB paid for 16384 page faults twice, and the socket itself was
 * four times faster than the daemon), so the last FRAME_BUF_SPARES large
 * buffers are kept for the next frames.  frame_buf_trim gives them back
 * once none was taken or given back for a while.  A small header before the bytes holds
 * the capacity.
 */
#define FRAME_BUF_POOL_MIN (64u << 10)
/* Larger ones (a max_frame_bytes raised past the default) are not kept. */
#define FRAME_BUF_POOL_MAX (FRAME_DEFAULT_MAX_BODY + (64u << 10))
#define FRAME_BUF_SPARES 2

struct frame_buf {
	size_t cap;
	max_align_t data[];
};

static _Atomic(struct frame_buf *) buf_spare[FRAME_BUF_SPARES];
static _Atomic uint64_t
	buf_used_ns; /* CLOCK_MONOTONIC of the last take or put */

static uint64_t buf_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static struct frame_buf *buf_of(uint8_t *p)
{
	return (struct frame_buf *)(p - offsetof(struct frame_buf, data));
}

static void spare_put(struct frame_buf *b)
{
	atomic_store_explicit(&buf_used_ns, buf_now_ns(), memory_order_relaxed);
	for (int i = 0; i < FRAME_BUF_SPARES; i++) {
		struct frame_buf *none = NULL;

		if (atomic_compare_exchange_strong(&buf_spare[i], &none, b))
			return;
	}
	free(b);
}

uint8_t *frame_buf_alloc(size_t len)
{
	struct frame_buf *b = NULL;

	if (len >= FRAME_BUF_POOL_MIN) {
		for (int i = 0; i < FRAME_BUF_SPARES && b == NULL; i++) {
			b = atomic_exchange(&buf_spare[i], NULL);
			if (b != NULL && b->cap < len) {
				free(b); /* smaller than frames are now */
				b = NULL;
			}
		}
		if (b != NULL) {
			atomic_store_explicit(&buf_used_ns, buf_now_ns(),
					      memory_order_relaxed);
			return (uint8_t *)b->data;
		}
	}
	if (len > SIZE_MAX - sizeof(*b))
		return NULL;
	b = malloc(sizeof(*b) + (len ? len : 1));
	if (b == NULL)
		return NULL;
	b->cap = len;
	return (uint8_t *)b->data;
}

void frame_buf_free(uint8_t *p)
{
	struct frame_buf *b;

	if (p == NULL)
		return;
	b = buf_of(p);
	if (b->cap >= FRAME_BUF_POOL_MIN && b->cap <= FRAME_BUF_POOL_MAX)
		spare_put(b);
	else
		free(b);
}

size_t frame_buf_spares(void)
{
	size_t n = 0;

	for (size_t i = 0; i < FRAME_BUF_SPARES; i++)
		n += atomic_load(&buf_spare[i]) != NULL;
	return n;
}

static bool arena_spares_large(void);
static void arena_spares_free(void);

void frame_buf_trim(uint64_t idle_ns)
{
	uint64_t last =
		atomic_load_explicit(&buf_used_ns, memory_order_relaxed);
	/*
	 * 0 (a closed connection, an emptied pool) gives back every kept
	 * arena, small ones too: only the large ones are counted, so a pool
	 * of small arenas alone would otherwise never be looked at.
	 */
	bool any = idle_ns == 0 || arena_spares_large();

	/* Called after every frame: no clock read when nothing is kept. */
	for (int i = 0; i < FRAME_BUF_SPARES; i++)
		any |= atomic_load_explicit(&buf_spare[i],
					    memory_order_relaxed) != NULL;
	if (!any)
		return;
	if (idle_ns > 0 && buf_now_ns() - last < idle_ns)
		return;
	for (int i = 0; i < FRAME_BUF_SPARES; i++)
		free(atomic_exchange(&buf_spare[i], NULL));
	arena_spares_free();
}

/*
 * Decoding into an arena.  protobuf-c's default unpack makes a malloc for
 * every message, string, byte field and repeated array of a frame (about
 * seven per kernel op) and as many frees later; an arena makes decoding a
 * bump of a pointer and freeing one or two free() calls.  protobuf-c
 * allocates the top-level message first, so the Frame sits at the start of
 * the arena's first chunk and frame_free finds the arena from it; that is
 * checked at the first decode, and if a protobuf-c ever did otherwise,
 * every frame is decoded the default way instead.
 */
#define ARENA_MAGIC 0x47434d41u /* "AMCG" */

struct arena_chunk {
	struct arena_chunk *next;
	size_t used;
	size_t cap;
	max_align_t data[];
};

struct arena {
	uint32_t magic;
	uint8_t *owned;		  /* the body, frame_buf_alloc'ed */
	struct arena_chunk *more; /* chunks after the first */
	size_t used;
	size_t cap;
	max_align_t data[];
};

/*
 * 1: arena decoding works; -1: it does not; 0: not known yet.  Decoding and
 * freeing happen on different threads in the daemon.
 */
static atomic_int arena_mode;

static size_t round16(size_t n)
{
	return (n + 15) & ~(size_t)15;
}

static void *arena_alloc(void *data, size_t size)
{
	struct arena *a = data;
	struct arena_chunk *c = a->more;
	size_t need = round16(size ? size : 1), cap;

	if (need <= a->cap - a->used) {
		void *p = (char *)a->data + a->used;
		a->used += need;
		return p;
	}
	/* Only the newest chunk has room worth looking for. */
	if (c != NULL && need <= c->cap - c->used) {
		void *p = (char *)c->data + c->used;
		c->used += need;
		return p;
	}
	/*
	 * Chunks double, so that a frame of many small ops (whose structs
	 * outgrow the first guess several times over) takes a handful of
	 * mallocs, not one per page.
	 */
	cap = c != NULL ? c->cap * 2 : a->cap;
	if (cap < need + 4096)
		cap = need + 4096;
	c = malloc(sizeof(*c) + cap);
	if (c == NULL)
		return NULL;
	c->cap = cap;
	c->used = need;
	c->next = a->more;
	a->more = c;
	return c->data;
}

static void arena_free_nothing(void *data, void *ptr)
{
	(void)data;
	(void)ptr;
}

/*
 * Spent arenas are kept for the next frames.  The daemon decodes on its
 * loop and frees on the device thread; a batch of 1024 kernels needs about
 * 400 KiB, which glibc gives back to the system at every free and faults
 * in again at the next malloc (a twentieth of the daemon's CPU per op).
 * A client keeps several such batches in flight (tests/bench: four), so
 * one spare was not enough: the loop still faulted in most arenas, and the
 * device thread unmapped them (perf: rep stos zeroing the first op struct
 * of each page, clear_page, unmap_page_range).  Up to ARENA_SPARES arenas
 * of at most ARENA_SPARE_MAX each are kept, and frame_buf_trim frees them
 * with the frame buffers once the daemon has been idle a while.
 */
#define ARENA_SPARE_MAX (2u << 20)
#define ARENA_SPARES 4

static _Atomic(struct arena *) arena_spare[ARENA_SPARES];
/* How many of them hold FRAME_BUF_POOL_MIN bytes or more (for the trim). */
static atomic_int arena_spares_big;

/* Take a from the spares' count (the caller took it out of its slot). */
static struct arena *arena_taken(struct arena *a)
{
	if (a != NULL && a->cap >= FRAME_BUF_POOL_MIN)
		atomic_fetch_sub(&arena_spares_big, 1);
	return a;
}

static struct arena *arena_new(size_t cap)
{
	struct arena *a = NULL;

	for (int i = 0; i < ARENA_SPARES && a == NULL; i++) {
		a = arena_taken(atomic_exchange(&arena_spare[i], NULL));
		if (a != NULL && a->cap < cap) {
			free(a); /* smaller than frames are now */
			a = NULL;
		}
	}
	if (a != NULL && a->cap >= FRAME_BUF_POOL_MIN)
		atomic_store_explicit(&buf_used_ns, buf_now_ns(),
				      memory_order_relaxed);
	if (a == NULL) {
		a = malloc(sizeof(*a) + cap);
		if (a == NULL)
			return NULL;
		a->cap = cap;
	}
	a->magic = ARENA_MAGIC;
	a->owned = NULL;
	a->more = NULL;
	a->used = 0;
	return a;
}

static void arena_destroy(struct arena *a)
{
	frame_buf_free(a->owned);
	a->owned = NULL;
	while (a->more != NULL) {
		struct arena_chunk *c = a->more;
		a->more = c->next;
		free(c);
	}
	a->magic = 0;
	if (a->cap <= ARENA_SPARE_MAX) {
		bool big = a->cap >= FRAME_BUF_POOL_MIN;

		if (big) {
			atomic_store_explicit(&buf_used_ns, buf_now_ns(),
					      memory_order_relaxed);
			/* Counted first: a taker may uncount it at once. */
			atomic_fetch_add(&arena_spares_big, 1);
		}
		for (int i = 0; i < ARENA_SPARES; i++) {
			struct arena *none = NULL;

			if (atomic_compare_exchange_strong(&arena_spare[i],
							   &none, a))
				return;
		}
		if (big)
			atomic_fetch_sub(&arena_spares_big, 1);
	}
	free(a);
}

/* Does a kept arena hold FRAME_BUF_POOL_MIN bytes or more? */
static bool arena_spares_large(void)
{
	return atomic_load_explicit(&arena_spares_big, memory_order_relaxed) >
	       0;
}

size_t frame_arena_spares(void)
{
	size_t n = 0;

	for (int i = 0; i < ARENA_SPARES; i++)
		n += atomic_load(&arena_spare[i]) != NULL;
	return n;
}

static void arena_spares_free(void)
{
	for (int i = 0; i < ARENA_SPARES; i++)
		free(arena_taken(atomic_exchange(&arena_spare[i], NULL)));
}

/*
 * The fast path for requests.
 *
 * protobuf-c's generic unpack costs about 0.25 us per kernel op (three
 * nested messages, each scanned twice through its descriptor): half of
 * the daemon's CPU per batched launch (tests/bench, "daemon CPU/op").  A
 * Request frame, the only kind a busy client sends, is therefore read here
 * by hand: the Frame and Request envelopes, and the ops that dominate
 * batches (kernel, ping, sync).  Every other op is handed to protobuf-c on
 * its own bytes, with the same arena.
 *
 * The rule that keeps the two decoders one: the fast path either builds
 * exactly what protobuf-c would build from the bytes, or declines (false)
 * and protobuf-c decodes the whole frame.  It declines on anything it does
 * not read in the one canonical way: an unknown or repeated field, a
 * non-packed repeated number, a number too large for its field, an
 * overlong varint, a malformed length.  It never refuses a frame itself.
 * tests/unit/check_frame.c compares the two on generated and mutated
 * frames, and the fuzz harness does on everything it tries.
 */
#define FAST_MAX_ARGS 64
#define FAST_MAX_OPS 65536

struct fast {
	ProtobufCAllocator *alloc;
	struct arena *arena;
	uint8_t *owned;	     /* the body, when bytes may point into it */
	const uint8_t *base; /* where the body starts */
	bool used;	     /* some bytes do point into it */
};

static inline bool fast_varint(const uint8_t **pp, const uint8_t *end,
			       uint64_t *v)
{
	const uint8_t *p = *pp;
	uint64_t r = 0;

	if (p < end && *p < 0x80) { /* most tags, lengths and numbers */
		*v = *p;
		*pp = p + 1;
		return true;
	}
	for (unsigned shift = 0; shift < 64 && p < end; shift += 7) {
		uint8_t b = *p++;

		if (shift == 63 && b > 1)
			return false; /* more than 64 bits */
		r |= (uint64_t)(b & 0x7f) << shift;
		if ((b & 0x80) == 0) {
			*pp = p;
			*v = r;
			return true;
		}
	}
	return false;
}

/*
 * A tag or a length prefix: protobuf-c reads at most five bytes of one and
 * refuses the frame otherwise, so a longer one declines.
 */
static inline bool fast_tag(const uint8_t **pp, const uint8_t *end, uint64_t *v)
{
	const uint8_t *start = *pp;

	return fast_varint(pp, end, v) && *pp - start <= 5;
}

static inline bool fast_u32(const uint8_t **pp, const uint8_t *end, uint32_t *v)
{
	uint64_t x;

	if (!fast_varint(pp, end, &x) || x > UINT32_MAX)
		return false;
	*v = (uint32_t)x;
	return true;
}

/* A length-delimited field's bytes: [*data, *data + *len). */
static bool fast_len(const uint8_t **pp, const uint8_t *end,
		     const uint8_t **data, size_t *len)
{
	uint64_t n;

	if (!fast_tag(pp, end, &n) || n > (uint64_t)(end - *pp))
		return false;
	*data = *pp;
	*len = (size_t)n;
	*pp += n;
	return true;
}

static inline void *fast_alloc(struct fast *fx, size_t size)
{
	struct arena *a = fx->arena;
	size_t need = round16(size ? size : 1);

	if (need <= a->cap - a->used) {
		void *p = (char *)a->data + a->used;
		a->used += need;
		return p;
	}
	return arena_alloc(a, size);
}

/* A packed repeated uint32 (the only way proto3 writes one). */
static bool fast_packed_u32(struct fast *fx, const uint8_t **pp,
			    const uint8_t *end, size_t *n, uint32_t **out)
{
	const uint8_t *data, *q, *qend;
	size_t len, count = 0;
	uint32_t *v;

	if (!fast_len(pp, end, &data, &len))
		return false;
	qend = data + len;
	for (q = data; q < qend; q++)
		count += (*q & 0x80) == 0;
	if (count == 0 || (qend[-1] & 0x80) != 0)
		return false; /* protobuf-c leaves empty ones NULL too: decline */
	v = fast_alloc(fx, count * sizeof(*v));
	if (v == NULL)
		return false;
	q = data;
	for (size_t i = 0; i < count; i++)
		if (!fast_u32(&q, qend, &v[i]))
			return false;
	*n = count;
	*out = v;
	return true;
}

static Gpucmd__KernelArg *fast_kernel_arg(struct fast *fx, const uint8_t *p,
					  const uint8_t *end)
{
	Gpucmd__KernelArg *a = fast_alloc(fx, sizeof(*a));
	uint64_t tag, x;

	if (a == NULL)
		return NULL;
	*a = (Gpucmd__KernelArg)GPUCMD__KERNEL_ARG__INIT;
	if (p == end)
		return a;
	/* One member of the oneof, and nothing else. */
	if (!fast_tag(&p, end, &tag))
		return NULL;
	switch (tag) {
	case (1 << 3) | 0:
		if (!fast_varint(&p, end, &x))
			return NULL;
		a->value_case = GPUCMD__KERNEL_ARG__VALUE_BUFFER;
		a->buffer = x;
		break;
	case (2 << 3) | 0:
		if (!fast_u32(&p, end, &a->u32))
			return NULL;
		a->value_case = GPUCMD__KERNEL_ARG__VALUE_U32;
		break;
	case (3 << 3) | 0: {
		uint32_t z;

		if (!fast_u32(&p, end, &z))
			return NULL;
		a->value_case = GPUCMD__KERNEL_ARG__VALUE_I32;
		a->i32 = (int32_t)((z >> 1) ^ (~(z & 1) + 1));
		break;
	}
	case (4 << 3) | 0:
		if (!fast_varint(&p, end, &x))
			return NULL;
		a->value_case = GPUCMD__KERNEL_ARG__VALUE_U64;
		a->u64 = x;
		break;
	case (5 << 3) | 5: {
		uint32_t bits;

		if (end - p < 4)
			return NULL;
		bits = get_le32(p);
		p += 4;
		a->value_case = GPUCMD__KERNEL_ARG__VALUE_F32;
		memcpy(&a->f32, &bits, sizeof(bits));
		break;
	}
	default:
		return NULL;
	}
	return p == end ? a : NULL;
}

static Gpucmd__OpKernel *fast_kernel(struct fast *fx, const uint8_t *p,
				     const uint8_t *end)
{
	Gpucmd__OpKernel *k = fast_alloc(fx, sizeof(*k));
	const uint8_t *argv[FAST_MAX_ARGS], *argend[FAST_MAX_ARGS];
	const uint8_t *data = NULL;
	unsigned seen = 0;
	size_t len, nargs = 0;
	uint64_t tag;

	if (k == NULL)
		return NULL;
	*k = (Gpucmd__OpKernel)GPUCMD__OP_KERNEL__INIT;
	while (p < end) {
		unsigned field;

		if (!fast_tag(&p, end, &tag))
			return NULL;
		field = (unsigned)(tag >> 3);
		/* Each field once, but args, which protobuf-c appends. */
		if (field > 6 || (field != 4 && (seen & (1u << field)) != 0))
			return NULL;
		switch (tag) {
		case (1 << 3) | 2:
			if (!fast_len(&p, end, &data, &len))
				return NULL;
			k->name = fast_alloc(fx, len + 1);
			if (k->name == NULL)
				return NULL;
			memcpy(k->name, data, len);
			k->name[len] = '\0';
			break;
		case (2 << 3) | 2:
			if (!fast_packed_u32(fx, &p, end, &k->n_grid, &k->grid))
				return NULL;
			break;
		case (3 << 3) | 2:
			if (!fast_packed_u32(fx, &p, end, &k->n_block,
					     &k->block))
				return NULL;
			break;
		case (4 << 3) | 2:
			if (nargs == FAST_MAX_ARGS ||
			    !fast_len(&p, end, &data, &len))
				return NULL;
			argv[nargs] = data;
			argend[nargs] = data + len;
			nargs++;
			break;
		case (5 << 3) | 0:
			if (!fast_u32(&p, end, &k->shared_bytes))
				return NULL;
			break;
		case (6 << 3) | 0:
			if (!fast_varint(&p, end, &k->module))
				return NULL;
			break;
		default:
			return NULL;
		}
		seen |= 1u << field;
	}
	if (nargs > 0) {
		k->args = fast_alloc(fx, nargs * sizeof(*k->args));
		if (k->args == NULL)
			return NULL;
		for (size_t i = 0; i < nargs; i++) {
			k->args[i] = fast_kernel_arg(fx, argv[i], argend[i]);
			if (k->args[i] == NULL)
				return NULL;
		}
		k->n_args = nargs;
	}
	return k;
}

/*
 * Ops made of numbers and at most one bytes field (empty, create_with_data,
 * write and read without a layout or region, release): a table says which
 * field goes where.  Bytes point into the body when the frame owns it
 * (frame_decode_owned: an inline write is not copied again), else they are
 * copied into the arena; empty ones are NULL, as protobuf-c leaves them.
 */
struct flat_field {
	uint8_t number;
	bool bytes;
	uint16_t offset;
};

struct flat_op {
	const ProtobufCMessageDescriptor *desc;
	struct flat_field fields[3];
	size_t nfields;
};

#define FLAT_U64(type, n, member) { n, false, offsetof(type, member) }
#define FLAT_BYTES(type, n, member) { n, true, offsetof(type, member) }

static const struct flat_op flat_ops[] = {
	[GPUCMD__OP__OP_EMPTY] = { &gpucmd__op_empty__descriptor,
				   { FLAT_U64(Gpucmd__OpEmpty, 1, handle),
				     FLAT_U64(Gpucmd__OpEmpty, 2, size) },
				   2 },
	[GPUCMD__OP__OP_CREATE_WITH_DATA] = { &gpucmd__op_create_with_data__descriptor,
					      { FLAT_U64(
							Gpucmd__OpCreateWithData,
							1, handle),
						FLAT_BYTES(
							Gpucmd__OpCreateWithData,
							2, data) },
					      2 },
	[GPUCMD__OP__OP_WRITE] = { &gpucmd__op_write__descriptor,
				   { FLAT_U64(Gpucmd__OpWrite, 1, handle),
				     FLAT_U64(Gpucmd__OpWrite, 2, offset),
				     FLAT_BYTES(Gpucmd__OpWrite, 3, data) },
				   3 },
	[GPUCMD__OP__OP_READ] = { &gpucmd__op_read__descriptor,
				  { FLAT_U64(Gpucmd__OpRead, 1, handle),
				    FLAT_U64(Gpucmd__OpRead, 2, offset),
				    FLAT_U64(Gpucmd__OpRead, 3, length) },
				  3 },
	[GPUCMD__OP__OP_RELEASE] = { &gpucmd__op_release__descriptor,
				     { FLAT_U64(Gpucmd__OpRelease, 1, handle) },
				     1 },
};

static void *fast_flat(struct fast *fx, const struct flat_op *fo,
		       const uint8_t *p, const uint8_t *end)
{
	void *m = fast_alloc(fx, fo->desc->sizeof_message);
	unsigned seen = 0;
	bool used = false; /* bytes point into the body (once m is kept) */
	uint64_t tag;

	if (m == NULL)
		return NULL;
	protobuf_c_message_init(fo->desc, m);
	while (p < end) {
		const struct flat_field *ff = NULL;

		if (!fast_tag(&p, end, &tag))
			return NULL;
		for (size_t i = 0; i < fo->nfields; i++)
			if (fo->fields[i].number == tag >> 3)
				ff = &fo->fields[i];
		if (ff == NULL || (seen & (1u << ff->number)) != 0 ||
		    (tag & 7) != (ff->bytes ? 2u : 0u))
			return NULL;
		seen |= 1u << ff->number;
		if (ff->bytes) {
			ProtobufCBinaryData *bd =
				(ProtobufCBinaryData *)((char *)m + ff->offset);
			const uint8_t *data;
			size_t len;

			if (!fast_len(&p, end, &data, &len))
				return NULL;
			bd->len = len;
			bd->data = NULL;
			if (len == 0)
				continue;
			if (fx->owned != NULL) {
				bd->data = fx->owned + (data - fx->base);
				used = true;
				continue;
			}
			bd->data = fast_alloc(fx, len);
			if (bd->data == NULL)
				return NULL;
			memcpy(bd->data, data, len);
		} else if (!fast_varint(&p, end,
					(uint64_t *)((char *)m + ff->offset))) {
			return NULL;
		}
	}
	fx->used |= used;
	return m;
}

/* An op the fast path reads, or NULL: protobuf-c reads it. */
static Gpucmd__Op *fast_op(struct fast *fx, const uint8_t *p,
			   const uint8_t *end)
{
	const uint8_t *data;
	size_t len;
	uint64_t tag;
	Gpucmd__Op *op;

	if (!fast_tag(&p, end, &tag) || (tag & 7) != 2 ||
	    !fast_len(&p, end, &data, &len) || p != end)
		return NULL; /* not exactly one sub-message */
	op = fast_alloc(fx, sizeof(*op));
	if (op == NULL)
		return NULL;
	*op = (Gpucmd__Op)GPUCMD__OP__INIT;
	switch (tag >> 3) {
	case GPUCMD__OP__OP_KERNEL:
		op->kernel = fast_kernel(fx, data, data + len);
		if (op->kernel == NULL)
			return NULL;
		break;
	case GPUCMD__OP__OP_PING:
		if (len != 0)
			return NULL;
		op->ping = fast_alloc(fx, sizeof(*op->ping));
		if (op->ping == NULL)
			return NULL;
		*op->ping = (Gpucmd__OpPing)GPUCMD__OP_PING__INIT;
		break;
	case GPUCMD__OP__OP_SYNC:
		if (len != 0)
			return NULL;
		op->sync = fast_alloc(fx, sizeof(*op->sync));
		if (op->sync == NULL)
			return NULL;
		*op->sync = (Gpucmd__OpSync)GPUCMD__OP_SYNC__INIT;
		break;
	case GPUCMD__OP__OP_EMPTY:
	case GPUCMD__OP__OP_CREATE_WITH_DATA:
	case GPUCMD__OP__OP_WRITE:
	case GPUCMD__OP__OP_READ:
	case GPUCMD__OP__OP_RELEASE:
		/* All members of the union are pointers at the same place. */
		op->empty =
			fast_flat(fx, &flat_ops[tag >> 3], data, data + len);
		if (op->empty == NULL)
			return NULL;
		break;
	default:
		return NULL;
	}
	op->op_case = (Gpucmd__Op__OpCase)(tag >> 3);
	return op;
}

/*
 * The frame keeps the body only when bytes point into it; when every byte
 * was copied (ops protobuf-c read), it goes back now.
 */
static void fast_keep_body(struct fast *fx)
{
	if (fx->used)
		fx->arena->owned = fx->owned;
	else
		frame_buf_free(fx->owned);
}

/*
 * The arena of a fast decode of n items (ops, results) of about per bytes
 * each, with the Frame first in it (frame_free finds it there), the
 * message of desc it carries (*msg) and the array of n items; bytes
 * fields need room too unless they stay in the body.  NULL: decline (more
 * items than the daemon's default max_ops_per_batch go to protobuf-c, and
 * the limit refuses them after; that also bounds the room asked for).
 */
static Gpucmd__Frame *fast_frame_new(struct fast *fx, ProtobufCAllocator *alloc,
				     size_t len, size_t n, size_t per,
				     const ProtobufCMessageDescriptor *desc,
				     void **msg, void ***items)
{
	Gpucmd__Frame *f;

	if (len > FRAME_MAX_BODY || n > FAST_MAX_OPS)
		return NULL;
	fx->arena = arena_new(round16((fx->owned != NULL ? 0 : len + len / 2) +
				      1024 + n * per));
	if (fx->arena == NULL)
		return NULL;
	alloc->allocator_data = fx->arena;
	f = fast_alloc(fx, sizeof(*f)); /* the arena has 1024 bytes at least */
	*f = (Gpucmd__Frame)GPUCMD__FRAME__INIT;
	*msg = fast_alloc(fx, desc->sizeof_message);
	*items = n > 0 ? fast_alloc(fx, n * sizeof(void *)) : NULL;
	if (*msg == NULL || (n > 0 && *items == NULL)) {
		arena_destroy(fx->arena);
		return NULL;
	}
	protobuf_c_message_init(desc, *msg);
	return f;
}

/*
 * A Request frame read by the fast path into a fresh arena, or NULL: not
 * one it reads (or out of memory), and protobuf-c decodes the body.  With
 * owned (the body itself, frame_buf_alloc'ed), bytes point into it and the
 * frame takes it over.
 */
static Gpucmd__Frame *fast_request(const uint8_t *body, size_t len,
				   uint8_t *owned)
{
	const uint8_t *p = body, *end = body + len, *req, *reqend;
	const uint8_t *data = NULL;
	ProtobufCAllocator alloc = {
		.alloc = arena_alloc,
		.free = arena_free_nothing,
	};
	struct fast fx = { .alloc = &alloc, .owned = owned, .base = body };
	Gpucmd__Frame *f;
	Gpucmd__Request *r;
	void *msg, **items;
	size_t rlen, olen = 0, nops = 0, i = 0;
	uint64_t tag, x;
	bool have_id = false, have_stream = false;

	/* The Frame: exactly one field, the request. */
	if (!fast_tag(&p, end, &tag) || tag != ((4 << 3) | 2) ||
	    !fast_len(&p, end, &req, &rlen) || p != end)
		return NULL;
	reqend = req + rlen;
	/* First pass: the envelope's fields, and how many ops. */
	for (p = req; p < reqend;) {
		if (!fast_tag(&p, reqend, &tag))
			return NULL;
		if (tag == ((1 << 3) | 0) && !have_id) {
			if (!fast_varint(&p, reqend, &x))
				return NULL;
			have_id = true;
		} else if (tag == ((2 << 3) | 0) && !have_stream) {
			uint32_t s;

			if (!fast_u32(&p, reqend, &s))
				return NULL;
			have_stream = true;
		} else if (tag == ((3 << 3) | 2)) {
			if (!fast_len(&p, reqend, &data, &olen))
				return NULL;
			nops++;
		} else {
			return NULL;
		}
	}
	/* Decoded structs take about ten times a small op's wire bytes. */
	f = fast_frame_new(&fx, &alloc, len, nops, 320,
			   &gpucmd__request__descriptor, &msg, &items);
	if (f == NULL)
		return NULL;
	r = msg;
	r->ops = (Gpucmd__Op **)items;
	f->msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f->request = r;
	/* Second pass: the same fields, now stored. */
	for (p = req; p < reqend;) {
		(void)fast_tag(&p, reqend, &tag);
		if (tag == ((1 << 3) | 0)) {
			(void)fast_varint(&p, reqend, &r->id);
		} else if (tag == ((2 << 3) | 0)) {
			(void)fast_u32(&p, reqend, &r->stream);
		} else {
			(void)fast_len(&p, reqend, &data, &olen);
			r->ops[i] = fast_op(&fx, data, data + olen);
			if (r->ops[i] == NULL)
				r->ops[i] =
					(Gpucmd__Op *)protobuf_c_message_unpack(
						&gpucmd__op__descriptor, &alloc,
						olen, data);
			if (r->ops[i] == NULL)
				goto decline;
			i++;
		}
	}
	r->n_ops = nops;
	fast_keep_body(&fx);
	return f;
decline:
	arena_destroy(fx.arena);
	return NULL;
}

/*
 * A result the fast path reads (done, data), or NULL: protobuf-c reads it.
 * Data points into the body when the frame owns it, as in fast_flat.
 */
static Gpucmd__OpResult *fast_result(struct fast *fx, const uint8_t *p,
				     const uint8_t *end)
{
	Gpucmd__OpResult *r;
	const uint8_t *data;
	size_t len;
	uint64_t tag, x;

	if (!fast_tag(&p, end, &tag))
		return NULL;
	r = fast_alloc(fx, sizeof(*r));
	if (r == NULL)
		return NULL;
	*r = (Gpucmd__OpResult)GPUCMD__OP_RESULT__INIT;
	switch (tag) {
	case (1 << 3) | 0:
		if (!fast_varint(&p, end, &x) || x > 1)
			return NULL;
		r->result_case = GPUCMD__OP_RESULT__RESULT_DONE;
		r->done = x != 0;
		break;
	case (2 << 3) | 2:
		if (!fast_len(&p, end, &data, &len))
			return NULL;
		r->result_case = GPUCMD__OP_RESULT__RESULT_DATA;
		r->data.len = len;
		if (len == 0)
			break;
		if (fx->owned != NULL)
			r->data.data = fx->owned + (data - fx->base);
		else if ((r->data.data = fast_alloc(fx, len)) != NULL)
			memcpy(r->data.data, data, len);
		else
			return NULL;
		break;
	default:
		return NULL;
	}
	if (p != end)
		return NULL; /* one member of the oneof, alone */
	/* The body is needed once a kept result points into it. */
	fx->used |= r->result_case == GPUCMD__OP_RESULT__RESULT_DATA &&
		    fx->owned != NULL && r->data.len > 0;
	return r;
}

/*
 * A Response frame, the other way round (libgpucmd reads them): the
 * envelope, done and data results by hand, other results and the error
 * by protobuf-c on their own bytes.  The same rule as fast_request.
 */
static Gpucmd__Frame *fast_response(const uint8_t *body, size_t len,
				    uint8_t *owned)
{
	const uint8_t *p = body, *end = body + len, *resp, *rend;
	const uint8_t *data = NULL;
	ProtobufCAllocator alloc = {
		.alloc = arena_alloc,
		.free = arena_free_nothing,
	};
	struct fast fx = { .alloc = &alloc, .owned = owned, .base = body };
	Gpucmd__Frame *f;
	Gpucmd__Response *r;
	void *msg, **items;
	size_t rlen, dlen = 0, n = 0, i = 0;
	unsigned seen = 0;
	uint64_t tag, x;

	if (!fast_tag(&p, end, &tag) || tag != ((5 << 3) | 2) ||
	    !fast_len(&p, end, &resp, &rlen) || p != end)
		return NULL;
	rend = resp + rlen;
	for (p = resp; p < rend;) {
		unsigned field;

		if (!fast_tag(&p, rend, &tag))
			return NULL;
		field = (unsigned)(tag >> 3);
		if (field < 1 || field > 4 ||
		    (field != 2 && (seen & (1u << field))))
			return NULL;
		seen |= 1u << field;
		if (tag == ((1 << 3) | 0)) {
			if (!fast_varint(&p, rend, &x))
				return NULL;
		} else if (tag == ((4 << 3) | 0)) {
			uint32_t v;

			if (!fast_u32(&p, rend, &v))
				return NULL;
		} else if (tag == ((2 << 3) | 2) || tag == ((3 << 3) | 2)) {
			if (!fast_len(&p, rend, &data, &dlen))
				return NULL;
			n += tag == ((2 << 3) | 2);
		} else {
			return NULL;
		}
	}
	f = fast_frame_new(&fx, &alloc, len, n, 64,
			   &gpucmd__response__descriptor, &msg, &items);
	if (f == NULL)
		return NULL;
	r = msg;
	r->results = (Gpucmd__OpResult **)items;
	f->msg_case = GPUCMD__FRAME__MSG_RESPONSE;
	f->response = r;
	for (p = resp; p < rend;) {
		(void)fast_tag(&p, rend, &tag);
		if (tag == ((1 << 3) | 0)) {
			(void)fast_varint(&p, rend, &r->id);
		} else if (tag == ((4 << 3) | 0)) {
			(void)fast_u32(&p, rend, &r->failed_index);
		} else if (tag == ((3 << 3) | 2)) {
			(void)fast_len(&p, rend, &data, &dlen);
			r->error = (Gpucmd__Error *)protobuf_c_message_unpack(
				&gpucmd__error__descriptor, &alloc, dlen, data);
			if (r->error == NULL)
				goto decline;
		} else {
			(void)fast_len(&p, rend, &data, &dlen);
			r->results[i] = fast_result(&fx, data, data + dlen);
			if (r->results[i] == NULL)
				r->results[i] = (Gpucmd__OpResult *)
					protobuf_c_message_unpack(
						&gpucmd__op_result__descriptor,
						&alloc, dlen, data);
			if (r->results[i] == NULL)
				goto decline;
			i++;
		}
	}
	r->n_results = n;
	fast_keep_body(&fx);
	return f;
decline:
	arena_destroy(fx.arena);
	return NULL;
}

/* Either kind of frame a busy connection carries, or NULL. */
/* Skip a field of wire type wt: false when it runs past end. */
static bool wire_skip(const uint8_t **pp, const uint8_t *end, unsigned wt)
{
	const uint8_t *data;
	uint64_t x;
	size_t n;

	switch (wt) {
	case 0:
		return fast_varint(pp, end, &x);
	case 1:
		if (end - *pp < 8)
			return false;
		*pp += 8;
		return true;
	case 2:
		return fast_len(pp, end, &data, &n);
	case 5:
		if (end - *pp < 4)
			return false;
		*pp += 4;
		return true;
	default:
		return false;
	}
}

/*
 * What protobuf-c keeps while decoding a message, for each field of it (its
 * ScannedMember), and for each field it does not know once decoded (its
 * ProtobufCMessageUnknownField, beside the copy of its bytes).
 */
#define DECODE_SCANNED_BYTES 40
#define DECODE_UNKNOWN_BYTES 24
/* Nesting past this is left to protobuf-c (it has a limit of its own). */
#define DECODE_MAX_DEPTH 32

struct decoded_walk {
	uint64_t total;	  /* persistent: structs, elements, bytes */
	uint64_t scanned; /* the largest message's field records */
	uint64_t fields;
	uint64_t limit;
	bool bad; /* not wire format: decoding stops there */
};

/* Elements of a packed repeated scalar field of n bytes. */
static uint64_t packed_count(const ProtobufCFieldDescriptor *f,
			     const uint8_t *p, size_t n)
{
	uint64_t k = 0;

	switch (f->type) {
	case PROTOBUF_C_TYPE_FIXED64:
	case PROTOBUF_C_TYPE_SFIXED64:
	case PROTOBUF_C_TYPE_DOUBLE:
		return n / 8;
	case PROTOBUF_C_TYPE_FIXED32:
	case PROTOBUF_C_TYPE_SFIXED32:
	case PROTOBUF_C_TYPE_FLOAT:
		return n / 4;
	default:
		/* Varints: one ends at each byte under 0x80. */
		for (size_t i = 0; i < n; i++)
			k += p[i] < 0x80;
		return k;
	}
}

/*
 * Walk the message of descriptor d in [p, end).  Bytes that are not wire
 * format set w->bad and end the walk: protobuf-c refuses them too, but only
 * once it got there, with what it kept of the fields before counted.
 */
static void decoded_walk(struct decoded_walk *w,
			 const ProtobufCMessageDescriptor *d, const uint8_t *p,
			 const uint8_t *end, unsigned depth)
{
	uint64_t nfields = 0;

	/* An allocation's rounding and header come with each struct. */
	w->total += round16(d->sizeof_message) + 16;
	while (p < end && !w->bad &&
	       w->total + nfields * DECODE_SCANNED_BYTES <= w->limit) {
		const ProtobufCFieldDescriptor *f;
		const uint8_t *data = p;
		uint64_t tag;
		size_t n = 0;
		bool ok;

		if (!fast_tag(&p, end, &tag) || (tag >> 3) == 0) {
			w->bad = true;
			break;
		}
		if ((tag & 7) == 2) {
			ok = fast_len(&p, end, &data, &n);
		} else {
			ok = wire_skip(&p, end, (unsigned)(tag & 7));
			n = (size_t)(p - data);
		}
		if (!ok) {
			w->bad = true;
			break;
		}
		nfields++;
		w->fields++;
		f = protobuf_c_message_descriptor_get_field(d, (unsigned)(tag >>
									  3));
		if (f == NULL) {
			w->total += DECODE_UNKNOWN_BYTES + n;
			continue;
		}
		if (f->label == PROTOBUF_C_LABEL_REPEATED)
			w->total += sizeof(void *) > 8 ? sizeof(void *) : 8;
		if (f->type == PROTOBUF_C_TYPE_MESSAGE && (tag & 7) == 2 &&
		    depth < DECODE_MAX_DEPTH) {
			decoded_walk(w, f->descriptor, data, data + n,
				     depth + 1);
		} else if (f->type == PROTOBUF_C_TYPE_BYTES ||
			   f->type == PROTOBUF_C_TYPE_STRING) {
			w->total += n + 1;
		} else if (f->label == PROTOBUF_C_LABEL_REPEATED &&
			   (tag & 7) == 2) {
			w->total += 8 * packed_count(f, data, n);
		}
	}
	if (nfields * DECODE_SCANNED_BYTES > w->scanned)
		w->scanned = nfields * DECODE_SCANNED_BYTES;
}

uint64_t frame_decoded_bound(const uint8_t *body, size_t len, uint64_t limit,
			     uint64_t *fields)
{
	struct decoded_walk w = { .limit = limit };

	decoded_walk(&w, &gpucmd__frame__descriptor, body, body + len, 0);
	*fields = w.fields;
	return w.total + w.scanned;
}

/* The args of the kernel op in [p, end) (an Op's bytes), 0 for another op. */
/* Arguments (OpKernel field 4) in the kernel message [k, kend). */
static size_t kernel_args(const uint8_t *k, const uint8_t *kend)
{
	size_t n = 0;
	uint64_t tag;

	while (k < kend) {
		if (!fast_tag(&k, kend, &tag))
			break;
		if (tag == ((4 << 3) | 2))
			n++;
		if (!wire_skip(&k, kend, (unsigned)(tag & 7)))
			break;
	}
	return n;
}

/*
 * The most arguments of any kernel message in an Op, and whether the Op is
 * a region_attach.  protobuf-c decodes every member of Op's oneof it meets,
 * the kernels included, before the last one on the wire wins: each one's
 * arguments cost memory, so the largest counts.
 */
static size_t op_kernel_args(const uint8_t *p, const uint8_t *end, bool *attach)
{
	const uint8_t *k;
	size_t n = 0, klen, a;
	uint64_t tag, last = 0;

	*attach = false;
	while (p < end) {
		if (!fast_tag(&p, end, &tag))
			return n;
		last = tag >> 3;
		if (tag == ((6 << 3) | 2)) {
			if (!fast_len(&p, end, &k, &klen))
				return n;
			a = kernel_args(k, k + klen);
			if (a > n)
				n = a;
		} else if (!wire_skip(&p, end, (unsigned)(tag & 7))) {
			return n;
		}
	}
	*attach = last == GPUCMD__OP__OP_REGION_ATTACH;
	return n;
}

bool frame_request_awaits_device(const Gpucmd__Request *req)
{
	for (size_t i = 0; i < req->n_ops; i++)
		if (req->ops[i] != NULL &&
		    (req->ops[i]->op_case == GPUCMD__OP__OP_SYNC ||
		     req->ops[i]->op_case == GPUCMD__OP__OP_READ))
			return true;
	return false;
}

bool frame_request_counts(const uint8_t *body, size_t len,
			  struct frame_request_counts *out)
{
	const uint8_t *p = body, *end = body + len, *req, *op;
	size_t rlen, olen;
	uint64_t tag;
	bool seen = false;

	memset(out, 0, sizeof(*out));
	/*
	 * Every Request of the Frame: protobuf-c decodes each one before a
	 * later one replaces it (the decoding arena keeps them all), so the
	 * ops of all count against the limit; the id and the attaches are
	 * the last one's, the request the daemon would run.
	 */
	while (p < end) {
		if (!fast_tag(&p, end, &tag))
			return false;
		if (tag != ((4 << 3) | 2)) {
			if (!wire_skip(&p, end, (unsigned)(tag & 7)))
				return false;
			continue;
		}
		if (!fast_len(&p, end, &req, &rlen))
			return false;
		seen = true;
		out->id = 0;
		out->attaches = 0;
		for (const uint8_t *q = req, *reqend = req + rlen;
		     q < reqend;) {
			size_t a;
			bool attach;

			if (!fast_tag(&q, reqend, &tag))
				return false;
			if (tag == ((1 << 3) | 0)) {
				if (!fast_varint(&q, reqend, &out->id))
					return false;
				continue;
			}
			if (tag != ((3 << 3) | 2)) {
				if (!wire_skip(&q, reqend, (unsigned)(tag & 7)))
					return false;
				continue;
			}
			if (!fast_len(&q, reqend, &op, &olen))
				return false;
			out->nops++;
			a = op_kernel_args(op, op + olen, &attach);
			if (a > out->max_args)
				out->max_args = a;
			out->attaches += attach;
		}
	}
	return seen;
}

static Gpucmd__Frame *fast_frame(const uint8_t *body, size_t len,
				 uint8_t *owned)
{
	if (len > 0 && body[0] == ((5 << 3) | 2))
		return fast_response(body, len, owned);
	return fast_request(body, len, owned);
}

Gpucmd__Frame *frame_decode_fast(const uint8_t *body, size_t len)
{
	return fast_frame(body, len, NULL);
}

static bool arena_known_good(void);
static Gpucmd__Frame *decode_generic(const uint8_t *body, size_t len);

/* protobuf-c's decoding, into an arena when its layout allows. */
static Gpucmd__Frame *decode_generic(const uint8_t *body, size_t len)
{
	ProtobufCAllocator alloc = {
		.alloc = arena_alloc,
		.free = arena_free_nothing,
	};
	/* Room for the bytes fields plus the structs of a typical frame. */
	size_t cap = round16(len + len / 2 + 1024);
	struct arena *a;
	Gpucmd__Frame *f;

	if (atomic_load(&arena_mode) < 0 || cap < len)
		return gpucmd__frame__unpack(NULL, len, body);
	a = arena_new(cap);
	if (a == NULL)
		return NULL;
	alloc.allocator_data = a;
	f = gpucmd__frame__unpack(&alloc, len, body);
	if (f == NULL) {
		arena_destroy(a);
		return NULL;
	}
	if ((void *)f != (void *)a->data) {
		/* Not the layout frame_free relies on: decode the plain way. */
		arena_destroy(a);
		atomic_store(&arena_mode, -1);
		return gpucmd__frame__unpack(NULL, len, body);
	}
	atomic_store(&arena_mode, 1);
	return f;
}

Gpucmd__Frame *frame_decode(const uint8_t *body, size_t len)
{
	Gpucmd__Frame *f;

	/* Once protobuf-c's layout is known to suit the arena (see above). */
	if (arena_known_good()) {
		f = fast_frame(body, len, NULL);
		if (f != NULL)
			return f;
	}
	return decode_generic(body, len);
}

/*
 * Whether frames may be built in arenas: learnt from the first frame
 * decoded, or from a Hello of no fields decoded here for the purpose.
 */
static bool arena_known_good(void)
{
	static const uint8_t hello[] = { 0x0a, 0x00 };

	if (atomic_load(&arena_mode) == 0)
		frame_free(decode_generic(hello, sizeof(hello)));
	return atomic_load(&arena_mode) > 0;
}

Gpucmd__Frame *frame_decode_owned(uint8_t *body, size_t len)
{
	Gpucmd__Frame *f = NULL;

	if (arena_known_good())
		f = fast_frame(body, len, body);
	if (f == NULL) {
		f = decode_generic(body, len);
		frame_buf_free(body);
	}
	return f;
}

size_t frame_held_bytes(const Gpucmd__Frame *f)
{
	const struct arena *a;
	const struct arena_chunk *c;
	size_t n;

	if (f == NULL || atomic_load(&arena_mode) < 0)
		return 0;
	a = (const struct arena *)((const char *)f -
				   offsetof(struct arena, data));
	if (a->magic != ARENA_MAGIC)
		return 0;
	/*
	 * What decoding used, not the capacity: the first block may be the
	 * spare of an earlier large frame (up to ARENA_SPARE_MAX), which would
	 * charge a ping megabytes.  Chunks grow by doubling, so their unused
	 * tails are at most what is used.
	 */
	n = a->used;
	for (c = a->more; c != NULL; c = c->next)
		n += c->used;
	return n;
}

void frame_free(Gpucmd__Frame *f)
{
	struct arena *a;

	if (f == NULL)
		return;
	if (atomic_load(&arena_mode) < 0) {
		gpucmd__frame__free_unpacked(f, NULL);
		return;
	}
	a = (struct arena *)((char *)f - offsetof(struct arena, data));
	if (a->magic != ARENA_MAGIC) {
		gpucmd__frame__free_unpacked(f, NULL);
		return;
	}
	a->magic = 0;
	arena_destroy(a);
}
