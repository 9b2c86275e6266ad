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

int frame_encode(const Gpucmd__Frame *f, uint8_t **out, size_t *len)
{
	size_t body = gpucmd__frame__get_packed_size(f);
	uint8_t *buf;
	struct frame_header hdr;

	if (body > FRAME_MAX_BODY)
		return GPUCMD_ELIMIT;
	buf = malloc(FRAME_HEADER_SIZE + body);
	if (buf == NULL)
		return -ENOMEM;
	hdr.magic = FRAME_MAGIC;
	hdr.version = GPUCMD_PROTOCOL_VERSION;
	hdr.flags = 0;
	hdr.length = (uint32_t)body;
	frame_header_pack(&hdr, buf);
	gpucmd__frame__pack(f, buf + FRAME_HEADER_SIZE);
	*out = buf;
	*len = FRAME_HEADER_SIZE + body;
	return 0;
}

/* ---- encoding as pieces ---------------------------------------------------- */

struct pieces_buffer {
	ProtobufCBuffer base;	/* first: protobuf-c calls base.append */
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
	if (len >= FRAME_PIECE_REF_MIN) {
		if (pieces_push(p, data, 0, len) != 0)
			p->err = -ENOMEM;
		return;
	}
	to = pieces_reserve(p, len);
	if (to != NULL)
		memcpy(to, data, len);
}

int frame_pieces_encode(struct frame_pieces *p, const Gpucmd__Frame *f)
{
	struct pieces_buffer buf = { .base.append = pieces_append, .p = p };
	size_t body = gpucmd__frame__get_packed_size(f);
	uint8_t head[FRAME_HEADER_SIZE];
	struct frame_header hdr;

	p->used = 0;
	p->n = 0;
	p->err = 0;
	p->total = 0;
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

void frame_pieces_free(struct frame_pieces *p)
{
	free(p->scratch);
	free(p->v);
	memset(p, 0, sizeof(*p));
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
#define ARENA_MAGIC 0x47434d41u	/* "AMCG" */

struct arena_chunk {
	struct arena_chunk *next;
	size_t used;
	size_t cap;
	max_align_t data[];
};

struct arena {
	uint32_t magic;
	struct arena_chunk *more;	/* chunks after the first */
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
	struct arena_chunk *c;
	size_t need = round16(size ? size : 1);

	if (need <= a->cap - a->used) {
		void *p = (char *)a->data + a->used;
		a->used += need;
		return p;
	}
	for (c = a->more; c != NULL; c = c->next) {
		if (need <= c->cap - c->used) {
			void *p = (char *)c->data + c->used;
			c->used += need;
			return p;
		}
	}
	c = malloc(sizeof(*c) + need + 4096);
	if (c == NULL)
		return NULL;
	c->cap = need + 4096;
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

static void arena_destroy(struct arena *a)
{
	while (a->more != NULL) {
		struct arena_chunk *c = a->more;
		a->more = c->next;
		free(c);
	}
	free(a);
}

Gpucmd__Frame *frame_decode(const uint8_t *body, size_t len)
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
	a = malloc(sizeof(*a) + cap);
	if (a == NULL)
		return NULL;
	a->magic = ARENA_MAGIC;
	a->more = NULL;
	a->used = 0;
	a->cap = cap;
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
