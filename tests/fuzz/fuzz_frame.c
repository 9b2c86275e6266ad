/*
 * fuzz_frame.c - libFuzzer harness for the frame header and the protobuf
 * body: what session.c does with every byte a client sends before anything
 * reaches dispatch.
 *
 * The input is read as a byte stream of frames, the way parse_frames reads
 * its buffer: header, check against a limit, body, decode.  For each part:
 *   - frame_header_unpack/pack round-trips and frame_header_check agrees
 *     with the rules of frame.h (magic, version, flags, length <= the limit
 *     capped at FRAME_MAX_BODY), with a message on every refusal;
 *   - a body that decodes is walked field by field the way session.c and
 *     dispatch.c read it (every oneof case that is set has its sub-message,
 *     strings are terminated, repeated fields hold what their counts say);
 *   - the fast decoders (frame_decode_fast, frame_decode_owned) build
 *     what protobuf-c builds (compared by protobuf-c's own packing), or
 *     decline;
 *   - frame_pieces_encode (libgpucmd's encoder) writes protobuf-c's bytes;
 *   - it is encoded again with frame_encode, and the encoding decodes to a
 *     frame that encodes to the same bytes.
 * The first input byte picks the limit the header is checked against.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "gpucmd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define expect(cond)                                                         \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "fuzz_frame: %s:%d: %s\n", __FILE__, \
				__LINE__, #cond);                            \
			abort();                                             \
		}                                                            \
	} while (0)

static volatile size_t sink;

static void touch_str(const char *s)
{
	expect(s != NULL);
	sink += strlen(s);
}

static void touch_bytes(ProtobufCBinaryData d)
{
	expect(d.len == 0 || d.data != NULL);
	for (size_t i = 0; i < d.len; i += 4096)
		sink += d.data[i];
	if (d.len > 0)
		sink += d.data[d.len - 1];
}

static void walk_layout(const Gpucmd__CopyLayout *l)
{
	if (l == NULL)
		return;
	expect(l->n_shape == 0 || l->shape != NULL);
	expect(l->n_strides == 0 || l->strides != NULL);
	for (size_t i = 0; i < l->n_shape; i++)
		sink += l->shape[i];
	for (size_t i = 0; i < l->n_strides; i++)
		sink += l->strides[i];
}

static void walk_kernel(const Gpucmd__OpKernel *k)
{
	touch_str(k->name);
	expect(k->n_grid == 0 || k->grid != NULL);
	expect(k->n_block == 0 || k->block != NULL);
	for (size_t i = 0; i < k->n_grid; i++)
		sink += k->grid[i];
	for (size_t i = 0; i < k->n_block; i++)
		sink += k->block[i];
	for (size_t i = 0; i < k->n_args; i++) {
		const Gpucmd__KernelArg *a = k->args[i];

		expect(a != NULL);
		switch (a->value_case) {
		case GPUCMD__KERNEL_ARG__VALUE_BUFFER:
			sink += a->buffer;
			break;
		case GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN:
			sink += a->buffer_in;
			break;
		case GPUCMD__KERNEL_ARG__VALUE_U32:
			sink += a->u32;
			break;
		case GPUCMD__KERNEL_ARG__VALUE_I32:
			sink += (size_t)a->i32;
			break;
		case GPUCMD__KERNEL_ARG__VALUE_U64:
			sink += a->u64;
			break;
		case GPUCMD__KERNEL_ARG__VALUE_F32:
			sink += (size_t)(a->f32 == a->f32);
			break;
		case GPUCMD__KERNEL_ARG__VALUE__NOT_SET:
		default:
			break;
		}
	}
}

/* The fields dispatch.c reads, op by op: each set case has its message. */
static void walk_request(const Gpucmd__Request *r)
{
	expect(r->n_ops == 0 || r->ops != NULL);
	for (size_t i = 0; i < r->n_ops; i++) {
		const Gpucmd__Op *op = r->ops[i];

		expect(op != NULL);
		switch (op->op_case) {
		case GPUCMD__OP__OP_EMPTY:
			expect(op->empty != NULL);
			sink += op->empty->size + op->empty->handle;
			break;
		case GPUCMD__OP__OP_CREATE_WITH_DATA:
			expect(op->create_with_data != NULL);
			touch_bytes(op->create_with_data->data);
			break;
		case GPUCMD__OP__OP_WRITE:
			expect(op->write != NULL);
			touch_bytes(op->write->data);
			walk_layout(op->write->layout);
			break;
		case GPUCMD__OP__OP_READ:
			expect(op->read != NULL);
			walk_layout(op->read->layout);
			sink += op->read->length;
			break;
		case GPUCMD__OP__OP_RELEASE:
			expect(op->release != NULL);
			break;
		case GPUCMD__OP__OP_KERNEL:
			expect(op->kernel != NULL);
			walk_kernel(op->kernel);
			break;
		case GPUCMD__OP__OP_SYNC:
			expect(op->sync != NULL);
			break;
		case GPUCMD__OP__OP_MEMORY_USAGE:
			expect(op->memory_usage != NULL);
			break;
		case GPUCMD__OP__OP_PING:
			expect(op->ping != NULL);
			break;
		case GPUCMD__OP__OP_MEMORY_REPORT:
			expect(op->memory_report != NULL);
			break;
		case GPUCMD__OP__OP_STATUS:
			expect(op->status != NULL);
			break;
		case GPUCMD__OP__OP_SHARE:
			expect(op->share != NULL);
			touch_str(op->share->name);
			sink += op->share->handle;
			break;
		case GPUCMD__OP__OP_IMPORT:
			expect(op->import != NULL);
			touch_str(op->import->name);
			sink += op->import->handle;
			break;
		case GPUCMD__OP__OP__NOT_SET:
		default:
			break;
		}
	}
}

static void walk_response(const Gpucmd__Response *r)
{
	for (size_t i = 0; i < r->n_results; i++) {
		const Gpucmd__OpResult *res = r->results[i];

		expect(res != NULL);
		if (res->result_case == GPUCMD__OP_RESULT__RESULT_DATA)
			touch_bytes(res->data);
		if (res->result_case == GPUCMD__OP_RESULT__RESULT_REPORT) {
			expect(res->report != NULL);
			for (size_t s = 0; s < res->report->n_services; s++) {
				const Gpucmd__ServiceReport *sr =
					res->report->services[s];

				touch_str(sr->name);
				/* What client/response.c copies of each. */
				expect(sr->n_shared == 0 || sr->shared != NULL);
				for (size_t k = 0; k < sr->n_shared; k++) {
					expect(sr->shared[k] != NULL);
					touch_str(sr->shared[k]->name);
					sink += sr->shared[k]->bytes;
				}
			}
		}
		if (res->result_case == GPUCMD__OP_RESULT__RESULT_STATUS) {
			expect(res->status != NULL);
			touch_str(res->status->version);
		}
	}
	if (r->error != NULL)
		touch_str(r->error->message);
}

/* What session.c reads of each kind of frame. */
static void walk_frame(const Gpucmd__Frame *f)
{
	switch (f->msg_case) {
	case GPUCMD__FRAME__MSG_HELLO:
		expect(f->hello != NULL);
		touch_str(f->hello->service);
		touch_str(f->hello->client_name);
		break;
	case GPUCMD__FRAME__MSG_WELCOME:
		expect(f->welcome != NULL);
		touch_str(f->welcome->service);
		break;
	case GPUCMD__FRAME__MSG_ERROR:
		expect(f->error != NULL);
		touch_str(f->error->message);
		break;
	case GPUCMD__FRAME__MSG_REQUEST:
		expect(f->request != NULL);
		walk_request(f->request);
		break;
	case GPUCMD__FRAME__MSG_RESPONSE:
		expect(f->response != NULL);
		walk_response(f->response);
		break;
	case GPUCMD__FRAME__MSG__NOT_SET:
	default:
		break;
	}
}

/* Whether m or a message inside it holds an unknown field numbered 0. */
static bool has_field_zero(const ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;

	for (unsigned k = 0; k < m->n_unknown_fields; k++)
		if (m->unknown_fields[k].tag == 0)
			return true;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *fd = &d->fields[i];
		const char *base = (const char *)m;

		if (fd->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n =
				*(const size_t *)(base + fd->quantifier_offset);
			ProtobufCMessage *const *arr =
				*(ProtobufCMessage *const *const *)(base +
								    fd->offset);

			for (size_t j = 0; j < n; j++)
				if (has_field_zero(arr[j]))
					return true;
			continue;
		}
		if ((fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
		    *(const uint32_t *)(base + fd->quantifier_offset) != fd->id)
			continue;
		if (*(ProtobufCMessage *const *)(base + fd->offset) != NULL &&
		    has_field_zero(
			    *(ProtobufCMessage *const *)(base + fd->offset)))
			return true;
	}
	return false;
}

/* protobuf-c's own bytes for f (not frame_encode's, which are hand-made). */
static uint8_t *pc_pack(const Gpucmd__Frame *f, size_t *len)
{
	uint8_t *b;

	*len = gpucmd__frame__get_packed_size(f);
	b = malloc(*len ? *len : 1);
	expect(b != NULL);
	expect(gpucmd__frame__pack(f, b) == *len);
	return b;
}

/* got decodes to what protobuf-c's slow decoding holds. */
static void same_as(const Gpucmd__Frame *slow, const Gpucmd__Frame *got)
{
	uint8_t *a, *b;
	size_t alen, blen;

	expect(slow != NULL);
	a = pc_pack(slow, &alen);
	b = pc_pack(got, &blen);
	expect(alen == blen && memcmp(a, b, alen) == 0);
	free(a);
	free(b);
}

/*
 * frame_decode's fast paths (requests, responses; in place for large
 * frames) build what protobuf-c builds from the same bytes, or decline;
 * they never take bytes protobuf-c refuses.
 */
static void fast_agrees(const uint8_t *buf, size_t len)
{
	Gpucmd__Frame *slow = gpucmd__frame__unpack(NULL, len, buf);
	Gpucmd__Frame *fast = frame_decode_fast(buf, len);
	uint8_t *own = frame_buf_alloc(len);
	Gpucmd__Frame *owned;

	if (fast != NULL)
		same_as(slow, fast);
	expect(own != NULL);
	if (len > 0)
		memcpy(own, buf, len);
	owned = frame_decode_owned(own, len);
	expect((owned != NULL) == (slow != NULL));
	if (owned != NULL)
		same_as(slow, owned);
	frame_free(owned);
	frame_free(fast);
	if (slow != NULL)
		gpucmd__frame__free_unpacked(slow, NULL);
}

/*
 * libgpucmd's encoder (frame_pieces_encode, by hand for requests) writes
 * the bytes frame_encode (protobuf-c) writes.
 */
static void pieces_agree(const Gpucmd__Frame *f, const uint8_t *enc, size_t len)
{
	struct frame_pieces p = { 0 };
	size_t at = 0;

	expect(frame_pieces_encode(&p, f) == 0);
	expect(p.total == len);
	for (size_t i = 0; i < p.n; i++) {
		expect(at + p.v[i].len <= len);
		expect(memcmp(frame_piece_data(&p, i), enc + at, p.v[i].len) ==
		       0);
		at += p.v[i].len;
	}
	expect(at == len);
	frame_pieces_free(&p);
}

/* Decode, walk, encode, decode again: the second encoding is the first. */
/*
 * The count the daemon makes of a large request before decoding it
 * (session.c) agrees with the decoding: the same id and attaches, and at
 * least as many ops (the count also has those of requests a later one
 * replaced).
 */
static void counts_agree(const uint8_t *buf, size_t len, const Gpucmd__Frame *f)
{
	struct frame_request_counts c;
	size_t attaches = 0;

	if (f->msg_case != GPUCMD__FRAME__MSG_REQUEST ||
	    !frame_request_counts(buf, len, &c))
		return;
	for (size_t i = 0; i < f->request->n_ops; i++)
		attaches += f->request->ops[i]->op_case ==
			    GPUCMD__OP__OP_REGION_ATTACH;
	expect(c.id == f->request->id);
	expect(c.attaches == attaches);
	expect(c.nops >= f->request->n_ops);
	for (size_t i = 0; i < f->request->n_ops; i++)
		if (f->request->ops[i]->op_case == GPUCMD__OP__OP_KERNEL)
			expect(c.max_args >=
			       f->request->ops[i]->kernel->n_args);
}

static void body(const uint8_t *buf, size_t len)
{
	Gpucmd__Frame *f = frame_decode(buf, len), *g;
	uint8_t *enc1 = NULL, *enc2 = NULL;
	size_t len1 = 0, len2 = 0;
	struct frame_header h;

	fast_agrees(buf, len);
	if (f == NULL)
		return;
	counts_agree(buf, len, f);
	walk_frame(f);
	expect(frame_encode(f, &enc1, &len1) == 0);
	expect(len1 >= FRAME_HEADER_SIZE);
	frame_header_unpack(enc1, &h);
	expect(frame_header_check(&h, FRAME_MAX_BODY, NULL, 0) == 0);
	expect(h.length == len1 - FRAME_HEADER_SIZE);
	g = frame_decode(enc1 + FRAME_HEADER_SIZE, h.length);
	if (g == NULL) {
		/*
		 * libprotobuf-c keeps an unknown field numbered 0 when its tag
		 * arrives as a non-minimal varint, writes it back as a one-byte
		 * tag and then refuses that.  The daemon never re-encodes what
		 * a client sent, so this is noted, not a failure.
		 */
		expect(has_field_zero(&f->base));
		free(enc1);
		frame_free(f);
		return;
	}
	expect(g->msg_case == f->msg_case);
	walk_frame(g);
	expect(frame_encode(g, &enc2, &len2) == 0);
	expect(len2 == len1 && memcmp(enc1, enc2, len1) == 0);
	pieces_agree(g, enc1, len1);
	free(enc1);
	free(enc2);
	frame_free(g);
	frame_free(f);
}

static const uint32_t limits[] = {
	0,
	1,
	4096,
	65536,
	FRAME_DEFAULT_MAX_BODY,
	FRAME_MAX_BODY,
	FRAME_MAX_BODY + 1,
	UINT32_MAX,
};

/* The header checks as frame.h describes them. */
static int header(const uint8_t *buf, uint32_t limit)
{
	struct frame_header h;
	uint8_t again[FRAME_HEADER_SIZE];
	char msg[256];
	uint32_t cap = limit > FRAME_MAX_BODY ? FRAME_MAX_BODY : limit;
	int rc, want;

	frame_header_unpack(buf, &h);
	frame_header_pack(&h, again);
	expect(memcmp(again, buf, FRAME_HEADER_SIZE) == 0);
	msg[0] = '\0';
	rc = frame_header_check(&h, limit, msg, sizeof(msg));
	if (h.magic != FRAME_MAGIC)
		want = GPUCMD_EPROTO;
	else if (h.version != GPUCMD_PROTOCOL_VERSION)
		want = GPUCMD_EVERSION;
	else if (h.flags != 0)
		want = GPUCMD_EPROTO;
	else if (h.length > cap)
		want = GPUCMD_ELIMIT;
	else
		want = 0;
	expect(rc == want);
	expect((rc == 0) == (msg[0] == '\0'));
	/* A refusal into a one-byte message buffer is still terminated. */
	msg[0] = 'x';
	if (frame_header_check(&h, limit, msg, 1) != 0)
		expect(msg[0] == '\0');
	return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint32_t limit;
	size_t off = 1;

	if (size < 1)
		return 0;
	limit = limits[data[0] % (sizeof(limits) / sizeof(limits[0]))];
	/* The whole rest as one body: the decoder alone. */
	body(data + 1, size - 1);
	/* The rest as a stream of frames, as the daemon reads a socket. */
	while (size - off >= FRAME_HEADER_SIZE) {
		struct frame_header h;

		if (header(data + off, limit) != 0)
			break;
		frame_header_unpack(data + off, &h);
		off += FRAME_HEADER_SIZE;
		if (h.length > size - off)
			break; /* truncated: the daemon waits for more */
		body(data + off, h.length);
		off += h.length;
	}
	return 0;
}
