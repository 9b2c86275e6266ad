/*
 * check_frame.c - unit tests of frame decoding (proto/frame.c): the
 * hand-written fast paths (Request frames decoded, Response frames
 * encoded) against protobuf-c's unpack and pack.
 *
 * The rule under test: frame_decode_fast either builds exactly what
 * protobuf-c builds from the same bytes (compared by packing both again
 * with protobuf-c, which writes every field it holds), or declines; it
 * never accepts bytes protobuf-c refuses.  Frames come from a seeded
 * generator of realistic requests, from hand-written odd encodings (each
 * legal protobuf that a client library other than ours could send), and
 * from random mutations of both; canonical batches of kernels, pings and
 * syncs must take the fast path, not only agree when it declines.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "unit.h"

/* ---- helpers ------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rnd(void)
{
	/* xorshift64*: reproducible from the seed in the failure message. */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

static unsigned rnd_below(unsigned n)
{
	return (unsigned)(rnd() % n);
}

/* The body of f, packed by protobuf-c into a malloc'ed buffer. */
static uint8_t *pack(const Gpucmd__Frame *f, size_t *len)
{
	uint8_t *buf;

	*len = gpucmd__frame__get_packed_size(f);
	buf = malloc(*len ? *len : 1);
	ck_assert_ptr_nonnull(buf);
	ck_assert_uint_eq(gpucmd__frame__pack(f, buf), *len);
	return buf;
}

/*
 * Decode body both ways and check the rule.  Returns whether the fast
 * path took it.
 */
/* got (from one of frame.c's decoders) packs to protobuf-c's bytes of slow. */
static void same_as_slow(const Gpucmd__Frame *slow, const Gpucmd__Frame *got,
			 const char *what, const char *decoder)
{
	uint8_t *a, *b;
	size_t alen, blen;

	ck_assert_msg(slow != NULL,
		      "%s: %s accepted bytes that protobuf-c "
		      "refuses",
		      what, decoder);
	a = pack(slow, &alen);
	b = pack(got, &blen);
	ck_assert_msg(alen == blen && memcmp(a, b, alen) == 0,
		      "%s: %s decoded differently from protobuf-c (%zu vs %zu "
		      "bytes packed again)",
		      what, decoder, blen, alen);
	free(a);
	free(b);
}

static bool compare(const uint8_t *body, size_t len, const char *what)
{
	Gpucmd__Frame *slow = gpucmd__frame__unpack(NULL, len, body);
	Gpucmd__Frame *fast = frame_decode_fast(body, len);
	Gpucmd__Frame *both = frame_decode(body, len);
	uint8_t *own = frame_buf_alloc(len);
	Gpucmd__Frame *owned;
	bool took = fast != NULL;

	if (fast != NULL)
		same_as_slow(slow, fast, what, "the fast path");
	/* frame_decode (either path) agrees with protobuf-c on validity. */
	ck_assert_msg((both != NULL) == (slow != NULL),
		      "%s: frame_decode %s %zu bytes protobuf-c %s", what,
		      both ? "accepted" : "refused", len,
		      slow ? "accepts" : "refuses");
	if (both != NULL)
		same_as_slow(slow, both, what, "frame_decode");
	/* The owned variant (the daemon's large frames) agrees as well. */
	ck_assert_ptr_nonnull(own);
	memcpy(own, body, len);
	owned = frame_decode_owned(own, len);
	ck_assert_msg((owned != NULL) == (slow != NULL),
		      "%s: frame_decode_owned disagrees on validity", what);
	if (owned != NULL)
		same_as_slow(slow, owned, what, "frame_decode_owned");
	frame_free(owned);
	frame_free(fast);
	frame_free(both);
	if (slow != NULL)
		gpucmd__frame__free_unpacked(slow, NULL);
	return took;
}

/* ---- a generator of requests --------------------------------------------- */

#define MAX_OPS 40

struct gen {
	Gpucmd__Frame f;
	Gpucmd__Request req;
	Gpucmd__Op op[MAX_OPS];
	Gpucmd__Op *ops[MAX_OPS];
	Gpucmd__OpKernel k[MAX_OPS];
	Gpucmd__KernelArg arg[MAX_OPS][6];
	Gpucmd__KernelArg *args[MAX_OPS][6];
	uint32_t grid[MAX_OPS][3], block[MAX_OPS][3];
	char name[MAX_OPS][24];
	Gpucmd__OpPing ping;
	Gpucmd__OpSync sync;
	Gpucmd__OpWrite write[MAX_OPS];
	uint8_t data[MAX_OPS][16];
	Gpucmd__OpRelease rel[MAX_OPS];
};

static uint32_t rnd_u32(void)
{
	/* Small numbers most of the time, the edges sometimes. */
	switch (rnd_below(4)) {
	case 0:
		return 0;
	case 1:
		return UINT32_MAX - rnd_below(3);
	default:
		return (uint32_t)rnd() >> rnd_below(32);
	}
}

static void gen_kernel(struct gen *g, size_t i)
{
	Gpucmd__OpKernel *k = &g->k[i];
	size_t nargs = rnd_below(7);

	*k = (Gpucmd__OpKernel)GPUCMD__OP_KERNEL__INIT;
	snprintf(g->name[i], sizeof(g->name[i]), "%s",
		 (const char *[]){ "spin", "", "fill_u32", "k\xc3\xa9rnel",
				   "a_much_longer_kernel_nm" }[rnd_below(5)]);
	k->name = g->name[i];
	k->n_grid = rnd_below(4);
	k->n_block = rnd_below(4);
	for (size_t d = 0; d < 3; d++) {
		g->grid[i][d] = rnd_u32();
		g->block[i][d] = rnd_u32();
	}
	k->grid = k->n_grid ? g->grid[i] : NULL;
	k->block = k->n_block ? g->block[i] : NULL;
	for (size_t a = 0; a < nargs; a++) {
		Gpucmd__KernelArg *ka = &g->arg[i][a];

		*ka = (Gpucmd__KernelArg)GPUCMD__KERNEL_ARG__INIT;
		switch (rnd_below(7)) {
		case 0:
			ka->value_case = GPUCMD__KERNEL_ARG__VALUE_BUFFER;
			ka->buffer = rnd() >> rnd_below(64);
			break;
		case 5:
			ka->value_case = GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN;
			ka->buffer_in = rnd() >> rnd_below(64);
			break;
		case 1:
			ka->value_case = GPUCMD__KERNEL_ARG__VALUE_U32;
			ka->u32 = rnd_u32();
			break;
		case 2:
			ka->value_case = GPUCMD__KERNEL_ARG__VALUE_I32;
			ka->i32 = (int32_t)rnd_u32();
			break;
		case 3:
			ka->value_case = GPUCMD__KERNEL_ARG__VALUE_U64;
			ka->u64 = rnd();
			break;
		case 4:
			ka->value_case = GPUCMD__KERNEL_ARG__VALUE_F32;
			ka->f32 = (float)(int32_t)rnd_u32() / 7.0f;
			break;
		default:
			break; /* an argument with no value set */
		}
		g->args[i][a] = ka;
	}
	k->n_args = nargs;
	k->args = nargs ? g->args[i] : NULL;
	k->shared_bytes = rnd_below(3) == 0 ? rnd_u32() : 0;
	k->module = rnd_below(3) == 0 ? rnd() >> rnd_below(64) : 0;
	g->op[i].op_case = GPUCMD__OP__OP_KERNEL;
	g->op[i].kernel = k;
}

/*
 * A request of nops ops; with mixed, also ops the fast path leaves to
 * protobuf-c (writes with inline data, releases).
 */
static void gen_request(struct gen *g, size_t nops, bool mixed)
{
	memset(g, 0, sizeof(*g));
	g->f = (Gpucmd__Frame)GPUCMD__FRAME__INIT;
	g->req = (Gpucmd__Request)GPUCMD__REQUEST__INIT;
	g->ping = (Gpucmd__OpPing)GPUCMD__OP_PING__INIT;
	g->sync = (Gpucmd__OpSync)GPUCMD__OP_SYNC__INIT;
	for (size_t i = 0; i < nops; i++) {
		g->op[i] = (Gpucmd__Op)GPUCMD__OP__INIT;
		switch (rnd_below(mixed ? 6 : 4)) {
		case 0:
			g->op[i].op_case = GPUCMD__OP__OP_PING;
			g->op[i].ping = &g->ping;
			break;
		case 1:
			g->op[i].op_case = GPUCMD__OP__OP_SYNC;
			g->op[i].sync = &g->sync;
			break;
		case 4:
			g->write[i] = (Gpucmd__OpWrite)GPUCMD__OP_WRITE__INIT;
			g->write[i].handle = rnd();
			for (size_t b = 0; b < sizeof(g->data[i]); b++)
				g->data[i][b] = (uint8_t)rnd();
			g->write[i].data.data = g->data[i];
			g->write[i].data.len = rnd_below(17);
			g->op[i].op_case = GPUCMD__OP__OP_WRITE;
			g->op[i].write = &g->write[i];
			break;
		case 5:
			g->rel[i] = (Gpucmd__OpRelease)GPUCMD__OP_RELEASE__INIT;
			g->rel[i].handle = rnd();
			g->op[i].op_case = GPUCMD__OP__OP_RELEASE;
			g->op[i].release = &g->rel[i];
			break;
		default:
			gen_kernel(g, i);
			break;
		}
		g->ops[i] = &g->op[i];
	}
	g->req.id = rnd() >> rnd_below(64);
	g->req.stream = rnd_below(2) ? rnd_u32() : 0;
	g->req.n_ops = nops;
	g->req.ops = nops ? g->ops : NULL;
	g->f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	g->f.request = &g->req;
}

static void seed(uint64_t s)
{
	rng_state = s * 0x9e3779b97f4a7c15ull + 1;
}

/* ---- tests --------------------------------------------------------------- */

/* Batches of kernels, pings and syncs, as clients send them: fast and equal. */
START_TEST(canonical_batches_take_the_fast_path)
{
	static struct gen g;

	seed(1);
	for (int iter = 0; iter < 3000; iter++) {
		uint8_t *body;
		size_t len;
		char what[64];

		gen_request(&g, rnd_below(MAX_OPS + 1), false);
		body = pack(&g.f, &len);
		snprintf(what, sizeof(what), "canonical request %d", iter);
		ck_assert_msg(compare(body, len, what),
			      "%s: the fast path declined a canonical batch",
			      what);
		free(body);
	}
}
END_TEST

/* Other ops go to protobuf-c one by one; the frame is still equal. */
START_TEST(mixed_batches_agree)
{
	static struct gen g;

	seed(2);
	for (int iter = 0; iter < 3000; iter++) {
		uint8_t *body;
		size_t len;
		char what[64];

		gen_request(&g, rnd_below(MAX_OPS + 1), true);
		body = pack(&g.f, &len);
		snprintf(what, sizeof(what), "mixed request %d", iter);
		ck_assert_msg(compare(body, len, what),
			      "%s: a frame with some slow ops should still "
			      "take the fast path",
			      what);
		free(body);
	}
}
END_TEST

/* Flipped, dropped, inserted and truncated bytes: the rule holds. */
START_TEST(mutated_frames_agree)
{
	static struct gen g;
	uint8_t buf[8192];
	unsigned took = 0, refused = 0;

	seed(3);
	for (int iter = 0; iter < 40000; iter++) {
		uint8_t *body;
		size_t len;
		char what[64];
		unsigned edits = 1 + rnd_below(4);

		gen_request(&g, 1 + rnd_below(6), rnd_below(2));
		body = pack(&g.f, &len);
		ck_assert_uint_le(len, sizeof(buf) - 8);
		memcpy(buf, body, len);
		free(body);
		for (unsigned e = 0; e < edits && len > 0; e++) {
			size_t at = rnd_below((unsigned)len);

			switch (rnd_below(5)) {
			case 0:
				buf[at] ^= (uint8_t)(1u << rnd_below(8));
				break;
			case 1:
				buf[at] = (uint8_t)rnd();
				break;
			case 2:
				memmove(buf + at, buf + at + 1, len - at - 1);
				len--;
				break;
			case 3:
				memmove(buf + at + 1, buf + at, len - at);
				buf[at] = (uint8_t)rnd();
				len++;
				break;
			default:
				len = at;
				break;
			}
		}
		snprintf(what, sizeof(what), "mutation %d", iter);
		if (compare(buf, len, what)) {
			took++;
		} else {
			Gpucmd__Frame *slow =
				gpucmd__frame__unpack(NULL, len, buf);

			if (slow == NULL)
				refused++;
			else
				gpucmd__frame__free_unpacked(slow, NULL);
		}
	}
	/* The mutations reach both sides of the rule. */
	ck_assert_uint_gt(took, 1000);
	ck_assert_uint_gt(refused, 1000);
}
END_TEST

/*
 * Legal protobuf that our client never writes: each is decoded by
 * protobuf-c (the fast path declines or agrees), never refused wrongly.
 */
START_TEST(odd_encodings_agree)
{
	static const struct {
		const char *what;
		uint8_t bytes[40];
		size_t len;
		bool fast; /* the fast path must take it */
	} cases[] = {
#define REQ(...) { __VA_ARGS__ }, sizeof((uint8_t[]){ __VA_ARGS__ })
		/* Frame{request{id 7, ops[kernel{name "ab"}]}} */
		{ "plain kernel",
		  REQ(0x22, 0x0a, 0x08, 0x07, 0x1a, 0x06, 0x32, 0x04, 0x0a,
		      0x02, 'a', 'b'),
		  true },
		{ "empty request", REQ(0x22, 0x00), true },
		{ "id repeated (last wins)",
		  REQ(0x22, 0x04, 0x08, 0x07, 0x08, 0x09), false },
		{ "stream above 32 bits",
		  REQ(0x22, 0x07, 0x10, 0x80, 0x80, 0x80, 0x80, 0x10), false },
		{ "overlong varint id", REQ(0x22, 0x04, 0x08, 0x81, 0x80, 0x00),
		  true },
		{ "unknown request field", REQ(0x22, 0x02, 0x20, 0x01), false },
		{ "grid not packed",
		  REQ(0x22, 0x06, 0x1a, 0x04, 0x32, 0x02, 0x10, 0x05), false },
		{ "grid packed twice",
		  REQ(0x22, 0x0a, 0x1a, 0x08, 0x32, 0x06, 0x12, 0x01, 0x02,
		      0x12, 0x01, 0x03),
		  false },
		{ "empty packed grid",
		  REQ(0x22, 0x05, 0x1a, 0x03, 0x32, 0x01, 0x12, 0x00), false },
		{ "args apart",
		  REQ(0x22, 0x0c, 0x1a, 0x0a, 0x32, 0x08, 0x22, 0x02, 0x10,
		      0x05, 0x28, 0x01, 0x22, 0x00),
		  true },
		{ "negative i32",
		  REQ(0x22, 0x08, 0x1a, 0x06, 0x32, 0x04, 0x22, 0x02, 0x18,
		      0x05),
		  true },
		{ "two values in one arg (last wins)",
		  REQ(0x22, 0x0a, 0x1a, 0x08, 0x32, 0x06, 0x22, 0x04, 0x10,
		      0x05, 0x08, 0x01),
		  false },
		{ "f32 arg",
		  REQ(0x22, 0x0b, 0x1a, 0x09, 0x32, 0x07, 0x22, 0x05, 0x2d,
		      0x00, 0x00, 0x80, 0x3f),
		  true },
		{ "truncated f32",
		  REQ(0x22, 0x0a, 0x1a, 0x08, 0x32, 0x06, 0x22, 0x04, 0x2d,
		      0x00, 0x00, 0x80),
		  false },
		{ "u32 arg above 32 bits",
		  REQ(0x22, 0x0d, 0x1a, 0x0b, 0x32, 0x09, 0x22, 0x07, 0x10,
		      0x80, 0x80, 0x80, 0x80, 0x10, 0x00),
		  false },
		{ "ping with a field inside",
		  REQ(0x22, 0x06, 0x1a, 0x04, 0x4a, 0x02, 0x08, 0x01), false },
		{ "op with two cases (last wins)",
		  REQ(0x22, 0x06, 0x1a, 0x04, 0x4a, 0x00, 0x3a, 0x00), false },
		{ "empty op", REQ(0x22, 0x02, 0x1a, 0x00), false },
		{ "request twice in the frame (merged)",
		  REQ(0x22, 0x02, 0x08, 0x01, 0x22, 0x02, 0x10, 0x02), false },
		{ "hello, not a request", REQ(0x0a, 0x00), false },
		{ "length past the end", REQ(0x22, 0x05, 0x08, 0x01), false },
		{ "varint of eleven bytes",
		  REQ(0x22, 0x0c, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
		      0xff, 0xff, 0xff, 0xff, 0x01),
		  false },
		{ "module and shared bytes",
		  REQ(0x22, 0x0b, 0x1a, 0x09, 0x32, 0x07, 0x28, 0x80, 0x02,
		      0x30, 0xff, 0xff, 0x03),
		  true },
		/* Frame{request{ops[write{handle 1, offset 2, data "xy"}]}} */
		{ "plain write",
		  REQ(0x22, 0x0c, 0x1a, 0x0a, 0x1a, 0x08, 0x08, 0x01, 0x10,
		      0x02, 0x1a, 0x02, 'x', 'y'),
		  true },
		{ "write, fields backwards",
		  REQ(0x22, 0x0c, 0x1a, 0x0a, 0x1a, 0x08, 0x1a, 0x02, 'x', 'y',
		      0x10, 0x02, 0x08, 0x01),
		  true },
		{ "write with empty data",
		  REQ(0x22, 0x06, 0x1a, 0x04, 0x1a, 0x02, 0x1a, 0x00), true },
		{ "write data twice (last wins)",
		  REQ(0x22, 0x0a, 0x1a, 0x08, 0x1a, 0x06, 0x1a, 0x01, 'x', 0x1a,
		      0x01, 'y'),
		  false },
		{ "write with a layout",
		  REQ(0x22, 0x08, 0x1a, 0x06, 0x1a, 0x04, 0x08, 0x01, 0x22,
		      0x00),
		  false },
		{ "read with a wire type 2 handle",
		  REQ(0x22, 0x07, 0x1a, 0x05, 0x22, 0x03, 0x0a, 0x01, 0x01),
		  false },
		{ "release of a large handle",
		  REQ(0x22, 0x0f, 0x1a, 0x0d, 0x2a, 0x0b, 0x08, 0xff, 0xff,
		      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
		  true },
		{ "empty with an unknown field",
		  REQ(0x22, 0x06, 0x1a, 0x04, 0x0a, 0x02, 0x18, 0x01), false },
		/* protobuf-c reads at most five bytes of a tag or a length. */
		{ "six-byte tag",
		  REQ(0x22, 0x07, 0x88, 0x80, 0x80, 0x80, 0x80, 0x00, 0x07),
		  false },
		{ "six-byte request length",
		  REQ(0x22, 0x82, 0x80, 0x80, 0x80, 0x80, 0x00, 0x08, 0x07),
		  false },
		{ "six-byte response length",
		  REQ(0x2a, 0x82, 0x80, 0x80, 0x80, 0x80, 0x00, 0x08, 0x07),
		  false },
		{ "six-byte op length",
		  REQ(0x22, 0x08, 0x1a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00,
		      0x4a, 0x00),
		  false },
		{ "five-byte tag",
		  REQ(0x22, 0x06, 0x88, 0x80, 0x80, 0x80, 0x00, 0x07), true },
		{ "five-byte op length",
		  REQ(0x22, 0x09, 0x1a, 0x82, 0x80, 0x80, 0x80, 0x00, 0x4a,
		      0x00, 0x00),
		  false },
		{ "five-byte ping length",
		  REQ(0x22, 0x08, 0x1a, 0x06, 0x4a, 0x80, 0x80, 0x80, 0x80,
		      0x00),
		  true },
#undef REQ
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		bool took =
			compare(cases[i].bytes, cases[i].len, cases[i].what);

		if (cases[i].fast)
			ck_assert_msg(took, "%s: the fast path should take it",
				      cases[i].what);
	}
}
END_TEST

/*
 * 1024 spin launches on stream 3, the bench's batch (grid of 3 dimensions,
 * block of 1, one i32 argument of -3), packed by protobuf-c.
 */
static uint8_t *large_batch_body(size_t *len)
{
	static const uint32_t one[3] = { 1, 1, 1 };
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	Gpucmd__Op o = GPUCMD__OP__INIT;
	Gpucmd__OpKernel k = GPUCMD__OP_KERNEL__INIT;
	Gpucmd__KernelArg arg = GPUCMD__KERNEL_ARG__INIT;
	Gpucmd__KernelArg *args[1] = { &arg };
	Gpucmd__Op *ops[1024];

	arg.value_case = GPUCMD__KERNEL_ARG__VALUE_I32;
	arg.i32 = -3;
	k.name = "spin";
	k.n_grid = 3;
	k.grid = (uint32_t *)one;
	k.n_block = 1;
	k.block = (uint32_t *)one;
	k.n_args = 1;
	k.args = args;
	o.op_case = GPUCMD__OP__OP_KERNEL;
	o.kernel = &k;
	for (size_t i = 0; i < 1024; i++)
		ops[i] = &o;
	req.id = 42;
	req.stream = 3;
	req.n_ops = 1024;
	req.ops = ops;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	return pack(&f, len);
}

/*
 * Which replies wait for device work (libgpucmd and the loop watch longer
 * for them): a sync or a read anywhere in the batch, nothing else.
 */
START_TEST(awaits_device_means_a_sync_or_a_read)
{
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	Gpucmd__Op k = GPUCMD__OP__INIT, w = GPUCMD__OP__INIT;
	Gpucmd__Op sync = GPUCMD__OP__INIT, rd = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[3];

	k.op_case = GPUCMD__OP__OP_KERNEL;
	w.op_case = GPUCMD__OP__OP_WRITE;
	sync.op_case = GPUCMD__OP__OP_SYNC;
	rd.op_case = GPUCMD__OP__OP_READ;
	req.ops = ops;
	ck_assert(!frame_request_awaits_device(&req));
	ops[0] = &k;
	ops[1] = &w;
	req.n_ops = 2;
	ck_assert(!frame_request_awaits_device(&req));
	ops[2] = &sync;
	req.n_ops = 3;
	ck_assert(frame_request_awaits_device(&req));
	ops[2] = &rd;
	ck_assert(frame_request_awaits_device(&req));
	ops[0] = NULL; /* never from a decoder; not read through */
	ck_assert(frame_request_awaits_device(&req));
}
END_TEST

/* The bench's batch decodes to the values the client set. */
START_TEST(large_batch_values)
{
	Gpucmd__Frame *d;
	size_t len;
	uint8_t *body = large_batch_body(&len);

	d = frame_decode_fast(body, len);
	ck_assert_ptr_nonnull(d);
	ck_assert_int_eq(d->msg_case, GPUCMD__FRAME__MSG_REQUEST);
	ck_assert_uint_eq(d->request->id, 42);
	ck_assert_uint_eq(d->request->stream, 3);
	ck_assert_uint_eq(d->request->n_ops, 1024);
	for (size_t i = 0; i < 1024; i++) {
		const Gpucmd__OpKernel *dk = d->request->ops[i]->kernel;

		ck_assert_int_eq(d->request->ops[i]->op_case,
				 GPUCMD__OP__OP_KERNEL);
		ck_assert_str_eq(dk->name, "spin");
		ck_assert_uint_eq(dk->n_grid, 3);
		ck_assert_uint_eq(dk->grid[2], 1);
		ck_assert_uint_eq(dk->n_block, 1);
		ck_assert_uint_eq(dk->n_args, 1);
		ck_assert_int_eq(dk->args[0]->value_case,
				 GPUCMD__KERNEL_ARG__VALUE_I32);
		ck_assert_int_eq(dk->args[0]->i32, -3);
		ck_assert_uint_eq(dk->shared_bytes, 0);
		ck_assert_uint_eq(dk->module, 0);
	}
	frame_free(d);
	free(body);
}
END_TEST

/*
 * Responses are encoded by hand in frame_encode: the bytes are protobuf-c's,
 * for every kind of result, with and without an error; and decoded by hand
 * in frame_decode, to what protobuf-c decodes.
 */
START_TEST(responses_encode_as_protobuf_c_does)
{
	static Gpucmd__OpResult res[MAX_OPS];
	static Gpucmd__OpResult *ptrs[MAX_OPS];
	static Gpucmd__MemoryUsage usage[MAX_OPS];
	static uint8_t data[MAX_OPS][200];

	seed(4);
	for (int iter = 0; iter < 2500; iter++) {
		Gpucmd__Frame f = GPUCMD__FRAME__INIT;
		Gpucmd__Response r = GPUCMD__RESPONSE__INIT;
		Gpucmd__Error err = GPUCMD__ERROR__INIT;
		size_t n = rnd_below(MAX_OPS + 1), want_len;
		uint8_t *got, *want;
		size_t got_len;
		char msg[64];

		for (size_t i = 0; i < n; i++) {
			res[i] = (Gpucmd__OpResult)GPUCMD__OP_RESULT__INIT;
			switch (rnd_below(5)) {
			case 0:
				res[i].result_case =
					GPUCMD__OP_RESULT__RESULT_VALUE;
				res[i].value = rnd() >> rnd_below(64);
				break;
			case 1:
				res[i].result_case =
					GPUCMD__OP_RESULT__RESULT_DATA;
				res[i].data.len = rnd_below(200);
				res[i].data.data = data[i];
				memset(data[i], (int)i, sizeof(data[i]));
				break;
			case 2:
				usage[i] = (Gpucmd__MemoryUsage)
					GPUCMD__MEMORY_USAGE__INIT;
				usage[i].bytes_in_use = rnd() >> rnd_below(64);
				usage[i].allocations = rnd_below(3);
				res[i].result_case =
					GPUCMD__OP_RESULT__RESULT_USAGE;
				res[i].usage = &usage[i];
				break;
			default:
				res[i].result_case =
					GPUCMD__OP_RESULT__RESULT_DONE;
				res[i].done = rnd_below(8) != 0;
				break;
			}
			ptrs[i] = &res[i];
		}
		r.id = rnd_below(4) == 0 ? 0 : rnd() >> rnd_below(64);
		r.n_results = n;
		r.results = n ? ptrs : NULL;
		if (rnd_below(4) == 0) {
			snprintf(msg, sizeof(msg), "op %d failed", iter);
			err.code = -(int32_t)rnd_below(40);
			err.message = msg;
			r.error = &err;
			r.failed_index = rnd_below(3) == 0 ? 0 : rnd_u32();
		}
		f.msg_case = GPUCMD__FRAME__MSG_RESPONSE;
		f.response = &r;
		want = pack(&f, &want_len);
		ck_assert_int_eq(frame_encode(&f, &got, &got_len), 0);
		ck_assert_uint_eq(got_len, FRAME_HEADER_SIZE + want_len);
		ck_assert_msg(memcmp(got + FRAME_HEADER_SIZE, want, want_len) ==
				      0,
			      "response %d: frame_encode's bytes differ from "
			      "protobuf-c's",
			      iter);
		/* Decoding it back (libgpucmd's side) takes the fast path. */
		snprintf(msg, sizeof(msg), "response %d", iter);
		ck_assert_msg(compare(want, want_len, msg),
			      "%s: the fast path declined a response", msg);
		/* And mutations of it keep the rule. */
		for (int m = 0; m < 4 && want_len > 0; m++) {
			uint8_t *bad = malloc(want_len);
			size_t at = rnd_below((unsigned)want_len);

			ck_assert_ptr_nonnull(bad);
			memcpy(bad, want, want_len);
			bad[at] ^= (uint8_t)(1u << rnd_below(8));
			compare(bad, rnd_below(4) ? want_len : at, msg);
			free(bad);
		}
		free(got);
		free(want);
	}
}
END_TEST

/*
 * A request of one write of data[0..n) to handle 5 at offset 64 (with
 * layout, when not NULL), decoded by frame_decode_owned from a pooled copy
 * of its bytes; *body and *len say where that copy is.
 */
static Gpucmd__Frame *owned_write(const uint8_t *data, size_t n,
				  Gpucmd__CopyLayout *layout, uint8_t **body,
				  size_t *len)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	Gpucmd__Op o = GPUCMD__OP__INIT, *ops[1] = { &o };
	Gpucmd__OpWrite w = GPUCMD__OP_WRITE__INIT;
	Gpucmd__Frame *d;
	uint8_t *packed;

	w.handle = 5;
	w.offset = 64;
	w.data.data = (uint8_t *)data;
	w.data.len = n;
	w.layout = layout;
	o.op_case = GPUCMD__OP__OP_WRITE;
	o.write = &w;
	req.id = 9;
	req.n_ops = 1;
	req.ops = ops;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	packed = pack(&f, len);
	*body = frame_buf_alloc(*len);
	ck_assert_ptr_nonnull(*body);
	memcpy(*body, packed, *len);
	free(packed);
	d = frame_decode_owned(*body, *len);
	ck_assert_ptr_nonnull(d);
	ck_assert_uint_eq(d->request->ops[0]->write->handle, 5);
	ck_assert_uint_eq(d->request->ops[0]->write->offset, 64);
	ck_assert_uint_eq(d->request->ops[0]->write->data.len, n);
	ck_assert_int_eq(memcmp(d->request->ops[0]->write->data.data, data, n),
			 0);
	return d;
}

/* Empty the pool (LeakSanitizer and valgrind see it). */
static void pool_empty(void)
{
	frame_buf_trim(0);
}

/*
 * Spent decoding arenas are kept for the next frames, several of them: a
 * client keeps batches of 1024 kernels four deep in flight, and with one
 * spare the daemon faulted in most arenas afresh (~400 KiB each) and
 * unmapped them again.  Four are kept; the trim gives them back once idle.
 */
START_TEST(spent_arenas_are_kept_for_the_next_frames)
{
	Gpucmd__Frame *d[6];
	size_t len;
	uint8_t *body = large_batch_body(&len);

	pool_empty();
	ck_assert_uint_eq(frame_arena_spares(), 0);
	for (size_t i = 0; i < 6; i++) {
		d[i] = frame_decode(body, len);
		ck_assert_ptr_nonnull(d[i]);
		ck_assert_uint_eq(d[i]->request->n_ops, 1024);
	}
	for (size_t i = 0; i < 6; i++)
		frame_free(d[i]);
	/* Four kept, the other two freed. */
	ck_assert_uint_eq(frame_arena_spares(), 4);
	/* The next frames decode into them: the Frame opens its arena. */
	d[0] = frame_decode(body, len);
	ck_assert_ptr_nonnull(d[0]);
	ck_assert_uint_eq(frame_arena_spares(), 3);
	ck_assert_str_eq(d[0]->request->ops[1023]->kernel->name, "spin");
	frame_free(d[0]);
	/* Used a moment ago: a trim of what is idle a second keeps them. */
	frame_buf_trim(1000000000ull);
	ck_assert_uint_eq(frame_arena_spares(), 4);
	pool_empty();
	ck_assert_uint_eq(frame_arena_spares(), 0);
	free(body);
}
END_TEST

/*
 * A small frame's spent arena is kept too, but not counted among the large
 * ones a timed trim looks for; a trim of now (a closed connection of
 * libgpucmd, pool_empty) still gives it back, or it stays for the life of
 * the process.
 */
START_TEST(small_spent_arenas_go_back_at_a_trim_of_now)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	Gpucmd__Frame *d;
	uint8_t *body;
	size_t len;

	req.id = 7;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	body = pack(&f, &len);
	pool_empty();
	d = frame_decode(body, len);
	ck_assert_ptr_nonnull(d);
	ck_assert_uint_eq(d->request->id, 7);
	frame_free(d);
	ck_assert_uint_eq(frame_arena_spares(), 1);
	/* Nothing large is kept: a timed trim reads no clock, frees nothing. */
	frame_buf_trim(1);
	ck_assert_uint_eq(frame_arena_spares(), 1);
	pool_empty();
	ck_assert_uint_eq(frame_arena_spares(), 0);
	free(body);
}
END_TEST

/*
 * A large frame the daemon reads into a buffer of its own: the inline
 * write's bytes stay where they are, and the buffer is kept for the next
 * frame of that size.
 */
START_TEST(owned_write_is_not_copied)
{
	enum { N = 256 << 10 };
	uint8_t *data = malloc(N), *body, *again;
	Gpucmd__Frame *d;
	size_t len;

	ck_assert_ptr_nonnull(data);
	for (size_t i = 0; i < N; i++)
		data[i] = (uint8_t)(i * 7);
	d = owned_write(data, N, NULL, &body, &len);
	/* The bytes are the body's, at the end of the frame. */
	ck_assert_ptr_eq(d->request->ops[0]->write->data.data, body + len - N);
	frame_free(d);
	/* Taken a moment ago: a trim for buffers idle a second keeps it. */
	frame_buf_trim(1000000000ull);
	/* The buffer went back for the next large frame. */
	again = frame_buf_alloc(len - 100);
	ck_assert_ptr_eq(again, body);
	frame_buf_free(again);
	pool_empty();
	again = frame_buf_alloc(len);
	frame_buf_free(again);
	pool_empty();
	free(data);
}
END_TEST

/*
 * A large frame whose bytes were all copied (a write with a layout goes to
 * protobuf-c) does not keep its body: it is back in the pool at once.
 */
START_TEST(owned_body_given_back_when_unused)
{
	enum { N = 200 << 10 };
	Gpucmd__CopyLayout layout = GPUCMD__COPY_LAYOUT__INIT;
	uint64_t shape[1] = { N }, strides[1] = { 1 };
	uint8_t *data = calloc(1, N), *body, *again;
	Gpucmd__Frame *d;
	size_t len;

	ck_assert_ptr_nonnull(data);
	layout.n_shape = 1;
	layout.shape = shape;
	layout.n_strides = 1;
	layout.strides = strides;
	d = owned_write(data, N, &layout, &body, &len);
	ck_assert_ptr_nonnull(d->request->ops[0]->write->layout);
	/* Copied, so the body was not needed: the pool has it again. */
	again = frame_buf_alloc(len);
	ck_assert_ptr_eq(again, body);
	memset(again, 0xee, len);
	ck_assert_int_eq(memcmp(d->request->ops[0]->write->data.data, data, N),
			 0);
	frame_buf_free(again);
	frame_free(d);
	pool_empty();
	free(data);
}
END_TEST

/* The pieces of p, joined: they must add up to p->total exactly. */
static uint8_t *join(const struct frame_pieces *p)
{
	uint8_t *out = frame_pieces_join(p);

	ck_assert_msg(out != NULL, "the pieces do not add up to %zu bytes",
		      p->total);
	return out;
}

/* frame_pieces_encode's bytes are the header and protobuf-c's body. */
static void pieces_agree(struct frame_pieces *pc, const Gpucmd__Frame *f,
			 const char *what)
{
	uint8_t *want, *got;
	size_t len;

	want = pack(f, &len);
	ck_assert_int_eq(frame_pieces_encode(pc, f), 0);
	ck_assert_uint_eq(pc->total, FRAME_HEADER_SIZE + len);
	got = join(pc);
	ck_assert_msg(
		memcmp(got + FRAME_HEADER_SIZE, want, len) == 0,
		"%s: frame_pieces_encode's body differs from protobuf-c's",
		what);
	frame_buf_free(got);
	free(want);
}

/* Requests are encoded by hand in frame_pieces_encode: protobuf-c's bytes. */
START_TEST(requests_encode_as_protobuf_c_does)
{
	static struct gen g;
	struct frame_pieces pc = { 0 };

	seed(5);
	for (int iter = 0; iter < 4000; iter++) {
		char what[64];

		gen_request(&g, rnd_below(MAX_OPS + 1), iter % 2 == 0);
		snprintf(what, sizeof(what), "request %d", iter);
		pieces_agree(&pc, &g.f, what);
	}
	frame_pieces_free(&pc);
}
END_TEST

/*
 * A request over FRAME_PIECES_FLAT_MAX: large write data is referenced
 * where it is (not copied), small data and the rest are copied, and the
 * bytes are still protobuf-c's.
 */
START_TEST(large_request_references_its_data)
{
	enum { BIG = 300 << 10, MID = 5000 };
	static uint8_t big[BIG], mid[MID], small[100];
	static struct gen g;
	struct frame_pieces pc = { 0 };
	Gpucmd__OpWrite w[3];
	Gpucmd__OpCreateWithData cw = GPUCMD__OP_CREATE_WITH_DATA__INIT;
	bool saw_big = false, saw_mid = false;

	seed(6);
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (uint8_t)rnd();
	memset(mid, 7, sizeof(mid));
	memset(small, 9, sizeof(small));
	gen_request(&g, 8, false);
	for (int i = 0; i < 3; i++) {
		w[i] = (Gpucmd__OpWrite)GPUCMD__OP_WRITE__INIT;
		w[i].handle = (uint64_t)i + 1;
		w[i].offset = (uint64_t)i * 4096;
		g.op[i] = (Gpucmd__Op)GPUCMD__OP__INIT;
		g.op[i].op_case = GPUCMD__OP__OP_WRITE;
		g.op[i].write = &w[i];
	}
	w[0].data = (ProtobufCBinaryData){ BIG, big };
	w[1].data = (ProtobufCBinaryData){ sizeof(small), small };
	w[2].data = (ProtobufCBinaryData){ MID, mid };
	cw.handle = 9;
	cw.data = (ProtobufCBinaryData){ MID, mid };
	g.op[5] = (Gpucmd__Op)GPUCMD__OP__INIT;
	g.op[5].op_case = GPUCMD__OP__OP_CREATE_WITH_DATA;
	g.op[5].create_with_data = &cw;
	pieces_agree(&pc, &g.f, "large request");
	for (size_t i = 0; i < pc.n; i++) {
		saw_big |= pc.v[i].ext == big && pc.v[i].len == BIG;
		saw_mid |= pc.v[i].ext == mid && pc.v[i].len == MID;
		ck_assert_msg(pc.v[i].ext != small,
			      "small data was referenced");
	}
	ck_assert(saw_big);
	ck_assert(saw_mid);
	/* Data that ends the frame leaves no empty piece after it. */
	g.req.n_ops = 1;
	pieces_agree(&pc, &g.f, "a request ending with large data");
	ck_assert_uint_eq(pc.n, 2);
	for (size_t i = 0; i < pc.n; i++)
		ck_assert_uint_gt(pc.v[i].len, 0);
	ck_assert_ptr_eq(pc.v[1].ext, big);
	/* Reused for a small request: one flat piece again. */
	gen_request(&g, 3, false);
	pieces_agree(&pc, &g.f, "small request after a large one");
	ck_assert_uint_eq(pc.n, 1);
	frame_pieces_free(&pc);
}
END_TEST

/* may_ref's test: only bytes inside the range at arg are referenced. */
static bool inside(const uint8_t *data, size_t len, void *arg)
{
	const ProtobufCBinaryData *ok = arg;

	return data >= ok->data && len <= ok->len &&
	       (size_t)(data - ok->data) <= ok->len - len;
}

/*
 * A response over FRAME_PIECES_FLAT_MAX with a caller's may_ref (the
 * daemon's reply from read staging): the large data may_ref accepts is
 * referenced, the large data it refuses is copied, and the bytes are
 * protobuf-c's.
 */
START_TEST(large_response_references_what_may_ref_allows)
{
	enum { BIG = 300 << 10, OTHER = 8192 };
	static uint8_t big[BIG], other[OTHER];
	ProtobufCBinaryData allowed = { BIG, big };
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Response resp = GPUCMD__RESPONSE__INIT;
	Gpucmd__OpResult res[3], *ptrs[3];
	struct frame_pieces pc = { 0 };
	bool saw_big = false;

	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (uint8_t)(i * 7 + (i >> 9));
	memset(other, 3, sizeof(other));
	for (int i = 0; i < 3; i++) {
		res[i] = (Gpucmd__OpResult)GPUCMD__OP_RESULT__INIT;
		res[i].result_case = GPUCMD__OP_RESULT__RESULT_DATA;
		ptrs[i] = &res[i];
	}
	res[0].data = (ProtobufCBinaryData){ OTHER, other };
	res[1].data = (ProtobufCBinaryData){ BIG - 100, big + 100 };
	res[2].data = (ProtobufCBinaryData){ 10, big };
	resp.id = 77;
	resp.n_results = 3;
	resp.results = ptrs;
	f.msg_case = GPUCMD__FRAME__MSG_RESPONSE;
	f.response = &resp;
	pc.may_ref = inside;
	pc.may_ref_arg = &allowed;
	pieces_agree(&pc, &f, "large response");
	for (size_t i = 0; i < pc.n; i++) {
		saw_big |= pc.v[i].ext == big + 100 && pc.v[i].len == BIG - 100;
		ck_assert_msg(pc.v[i].ext != other,
			      "data may_ref refused was referenced");
	}
	ck_assert(saw_big);
	/* Pieces that do not add up to the total are not joined. */
	pc.total++;
	ck_assert_ptr_null(frame_pieces_join(&pc));
	pc.total -= 2;
	ck_assert_ptr_null(frame_pieces_join(&pc));
	pc.total++;
	/* Without may_ref every large field is referenced. */
	pc.may_ref = NULL;
	pieces_agree(&pc, &f, "large response, no may_ref");
	saw_big = false;
	for (size_t i = 0; i < pc.n; i++)
		saw_big |= pc.v[i].ext == other;
	ck_assert(saw_big);
	frame_pieces_free(&pc);
}
END_TEST

/*
 * frame_held_bytes: what a decoded frame holds, which the daemon charges
 * against max_bytes_in_flight.  A kernel of 10000 empty arguments is ~20 KB
 * on the wire and over 400 KB decoded, through either decoder; a ping holds
 * little.
 */
/*
 * A Request frame (header and body) of id 9 with one kernel op "spin" of
 * nargs empty arguments, from frame_encode.
 */
static void kernel_request(size_t nargs, uint8_t **buf, size_t *len)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	Gpucmd__KernelArg a = GPUCMD__KERNEL_ARG__INIT;
	Gpucmd__KernelArg **args = malloc(nargs * sizeof(*args) + 1);
	Gpucmd__OpKernel k = GPUCMD__OP_KERNEL__INIT;
	Gpucmd__Op ok = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[1] = { &ok };

	ck_assert_ptr_nonnull(args);
	for (size_t i = 0; i < nargs; i++)
		args[i] = &a;
	k.name = "spin";
	k.n_args = nargs;
	k.args = args;
	ok.op_case = GPUCMD__OP__OP_KERNEL;
	ok.kernel = &k;
	req.id = 9;
	req.n_ops = 1;
	req.ops = ops;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	ck_assert_int_eq(frame_encode(&f, buf, len), 0);
	free(args);
}

START_TEST(held_bytes_count_the_decoded_structs)
{
	enum { NARGS = 10000 };
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	Gpucmd__OpPing p = GPUCMD__OP_PING__INIT;
	Gpucmd__Op op = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[1] = { &op };
	Gpucmd__Frame *d;
	uint8_t *buf;
	size_t len, held;

	kernel_request(NARGS, &buf, &len);
	ck_assert_uint_lt(len, 30000);
	d = frame_decode(buf + FRAME_HEADER_SIZE, len - FRAME_HEADER_SIZE);
	ck_assert_ptr_nonnull(d);
	ck_assert_uint_eq(d->request->ops[0]->kernel->n_args, NARGS);
	held = frame_held_bytes(d);
	ck_assert_uint_ge(held, NARGS * (sizeof(Gpucmd__KernelArg) +
					 sizeof(Gpucmd__KernelArg *)));
	frame_free(d);
	free(buf);

	op.op_case = GPUCMD__OP__OP_PING;
	op.ping = &p;
	req.n_ops = 1;
	req.ops = ops;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	ck_assert_int_eq(frame_encode(&f, &buf, &len), 0);
	d = frame_decode(buf + FRAME_HEADER_SIZE, len - FRAME_HEADER_SIZE);
	ck_assert_ptr_nonnull(d);
	ck_assert_uint_gt(frame_held_bytes(d), 0);
	frame_free(d);
	free(buf);
	ck_assert_uint_eq(frame_held_bytes(NULL), 0);
}
END_TEST

/*
 * frame_decoded_bound, the walk by the schema that bounds what decoding
 * would take: at least what the decoded frame holds (frame_held_bytes), for
 * a kernel of 10000 arguments and for a ping; a request's unknown fields
 * count their record and their copy each; the walk stops past its limit;
 * bytes that stop being wire format end it with what came before counted.
 */
START_TEST(decoded_bound_covers_what_decoding_holds)
{
	enum { NARGS = 10000, NUNKNOWN = 10000 };
	Gpucmd__Frame *d;
	uint8_t *buf, *body, *unk;
	size_t len, blen;
	uint64_t fields, bound;

	kernel_request(NARGS, &buf, &len);
	body = buf + FRAME_HEADER_SIZE;
	blen = len - FRAME_HEADER_SIZE;
	bound = frame_decoded_bound(body, blen, UINT64_MAX, &fields);
	ck_assert_uint_ge(fields, NARGS);
	d = frame_decode(body, blen);
	ck_assert_ptr_nonnull(d);
	ck_assert_uint_ge(bound, frame_held_bytes(d));
	frame_free(d);
	/* Stopped past a limit: over it, and short of the whole walk. */
	ck_assert_uint_gt(frame_decoded_bound(body, blen, 4096, &fields), 4096);
	ck_assert_uint_lt(fields, NARGS);
	/* Cut in the middle of an argument: what came before counts. */
	ck_assert_uint_gt(frame_decoded_bound(body, blen - 1, UINT64_MAX,
					      &fields),
			  0);
	free(buf);

	/* A Request {id 1} followed by unknown field 15 many times. */
	unk = malloc(4 + 2 * NUNKNOWN);
	ck_assert_ptr_nonnull(unk);
	unk[0] = (4 << 3) | 2;
	unk[1] = 2;
	unk[2] = (1 << 3) | 0;
	unk[3] = 1;
	for (size_t i = 0; i < NUNKNOWN; i++) {
		unk[4 + 2 * i] = (15 << 3) | 0;
		unk[4 + 2 * i + 1] = 0;
	}
	bound = frame_decoded_bound(unk, 4 + 2 * NUNKNOWN, UINT64_MAX, &fields);
	ck_assert_uint_eq(fields, NUNKNOWN + 2);
	ck_assert_uint_ge(bound, (uint64_t)NUNKNOWN * (24 + 40));
	d = frame_decode(unk, 4 + 2 * NUNKNOWN);
	ck_assert_ptr_nonnull(d);
	ck_assert_uint_eq(d->request->id, 1);
	frame_free(d);
	free(unk);
}
END_TEST

/*
 * The count a large request gets before it is decoded: its id, its ops,
 * the most arguments of a kernel, its region_attach ops (an Op is the
 * last member of its oneof on the wire, as protobuf-c decodes it).
 */
START_TEST(request_counts_without_decoding)
{
	Gpucmd__Frame f = GPUCMD__FRAME__INIT;
	Gpucmd__Request req = GPUCMD__REQUEST__INIT;
	Gpucmd__KernelArg a = GPUCMD__KERNEL_ARG__INIT;
	Gpucmd__KernelArg *args[3] = { &a, &a, &a };
	Gpucmd__OpKernel k = GPUCMD__OP_KERNEL__INIT;
	Gpucmd__OpRegionAttach att = GPUCMD__OP_REGION_ATTACH__INIT;
	Gpucmd__OpPing p = GPUCMD__OP_PING__INIT;
	Gpucmd__Op ok = GPUCMD__OP__INIT, oa = GPUCMD__OP__INIT;
	Gpucmd__Op op = GPUCMD__OP__INIT;
	Gpucmd__Op *ops[5] = { &ok, &oa, &op, &oa, &op };
	struct frame_request_counts c;
	/* Op{kernel{one arg}, region_attach{}}: an attach. */
	static const uint8_t both[] = {
		(4 << 3) | 2,
		11, /* Frame.request */
		(1 << 3) | 0,
		5, /* id 5 */
		(3 << 3) | 2,
		7, /* ops */
		(6 << 3) | 2,
		2,
		(4 << 3) | 2,
		0, /* kernel, one arg */
		0xea,
		0x01,
		0, /* region_attach{} */
	};
	uint8_t *buf;
	size_t len;

	a.value_case = GPUCMD__KERNEL_ARG__VALUE_U32;
	a.u32 = 1;
	k.name = "fill_u32";
	k.n_args = 3;
	k.args = args;
	ok.op_case = GPUCMD__OP__OP_KERNEL;
	ok.kernel = &k;
	att.region = 3;
	att.size = 4096;
	oa.op_case = GPUCMD__OP__OP_REGION_ATTACH;
	oa.region_attach = &att;
	op.op_case = GPUCMD__OP__OP_PING;
	op.ping = &p;
	req.id = 1234567890123ull;
	req.n_ops = 5;
	req.ops = ops;
	f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
	f.request = &req;
	ck_assert_int_eq(frame_encode(&f, &buf, &len), 0);
	ck_assert(frame_request_counts(buf + FRAME_HEADER_SIZE,
				       len - FRAME_HEADER_SIZE, &c));
	ck_assert_uint_eq(c.id, 1234567890123ull);
	ck_assert_uint_eq(c.nops, 5);
	ck_assert_uint_eq(c.max_args, 3);
	ck_assert_uint_eq(c.attaches, 2);
	free(buf);

	ck_assert(frame_request_counts(both, sizeof(both), &c));
	ck_assert_uint_eq(c.id, 5);
	ck_assert_uint_eq(c.nops, 1);
	ck_assert_uint_eq(c.max_args, 1); /* decoded, then replaced */
	ck_assert_uint_eq(c.attaches, 1);
	/* Not a request, or cut short: declined. */
	ck_assert(!frame_request_counts(both + 2, sizeof(both) - 2, &c));
	ck_assert(!frame_request_counts(both, sizeof(both) - 1, &c));
}
END_TEST

/*
 * What protobuf-c decodes, the count counts: a kernel followed by another
 * member of Op's oneof was decoded, arguments and all, before the later
 * member won (the count looked at the last member only), and a Frame with
 * two requests decodes both, keeping the second (the count read only the
 * first).
 */
START_TEST(request_counts_follow_protobuf_c)
{
	/* Op{kernel{3 empty args}, ping{}} */
	static const uint8_t kernel_then_ping[] = {
		(4 << 3) | 2, 14, (1 << 3) | 0, 9, (3 << 3) | 2, 10,
		(6 << 3) | 2, 6,  (4 << 3) | 2, 0, (4 << 3) | 2, 0,
		(4 << 3) | 2, 0,  (9 << 3) | 2, 0,
	};
	/* Frame{request{id 1, one ping}, request{id 2, two pings,
	 * region_attach{}}} */
	static const uint8_t two_requests[] = {
		(4 << 3) | 2,
		6,
		(1 << 3) | 0,
		1,
		(3 << 3) | 2,
		2,
		(9 << 3) | 2,
		0,
		(4 << 3) | 2,
		15,
		(1 << 3) | 0,
		2,
		(3 << 3) | 2,
		2,
		(9 << 3) | 2,
		0,
		(3 << 3) | 2,
		2,
		(9 << 3) | 2,
		0,
		(3 << 3) | 2,
		3,
		0xea,
		0x01,
		0,
	};
	struct frame_request_counts c;
	Gpucmd__Frame *f;
	size_t attaches = 0;

	ck_assert(frame_request_counts(kernel_then_ping,
				       sizeof(kernel_then_ping), &c));
	ck_assert_uint_eq(c.id, 9);
	ck_assert_uint_eq(c.nops, 1);
	ck_assert_uint_eq(c.max_args, 3);
	ck_assert_uint_eq(c.attaches, 0);
	f = frame_decode(kernel_then_ping, sizeof(kernel_then_ping));
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(f->request->ops[0]->op_case, GPUCMD__OP__OP_PING);
	frame_free(f);

	ck_assert(frame_request_counts(two_requests, sizeof(two_requests), &c));
	f = frame_decode(two_requests, sizeof(two_requests));
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(f->msg_case, GPUCMD__FRAME__MSG_REQUEST);
	for (size_t i = 0; i < f->request->n_ops; i++)
		attaches += f->request->ops[i]->op_case ==
			    GPUCMD__OP__OP_REGION_ATTACH;
	ck_assert_uint_eq(f->request->n_ops, 3);
	ck_assert_uint_eq(c.id, f->request->id);
	ck_assert_uint_eq(c.attaches, attaches);
	ck_assert_uint_eq(c.nops, 4); /* both requests were decoded */
	ck_assert_uint_eq(c.id, 2);
	ck_assert_uint_eq(c.attaches, 1);
	frame_free(f);
}
END_TEST

static Suite *frame_suite(void)
{
	Suite *s = suite_create("frame");
	TCase *tc = tcase_create("fast_decode");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, canonical_batches_take_the_fast_path);
	tcase_add_test(tc, mixed_batches_agree);
	tcase_add_test(tc, mutated_frames_agree);
	tcase_add_test(tc, odd_encodings_agree);
	tcase_add_test(tc, large_batch_values);
	tcase_add_test(tc, awaits_device_means_a_sync_or_a_read);
	tcase_add_test(tc, spent_arenas_are_kept_for_the_next_frames);
	tcase_add_test(tc, small_spent_arenas_go_back_at_a_trim_of_now);
	tcase_add_test(tc, owned_write_is_not_copied);
	tcase_add_test(tc, owned_body_given_back_when_unused);
	tcase_add_test(tc, request_counts_without_decoding);
	tcase_add_test(tc, request_counts_follow_protobuf_c);
	tcase_add_test(tc, held_bytes_count_the_decoded_structs);
	tcase_add_test(tc, decoded_bound_covers_what_decoding_holds);
	suite_add_tcase(s, tc);

	tc = tcase_create("fast_encode");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, responses_encode_as_protobuf_c_does);
	tcase_add_test(tc, requests_encode_as_protobuf_c_does);
	tcase_add_test(tc, large_request_references_its_data);
	tcase_add_test(tc, large_response_references_what_may_ref_allows);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_main(frame_suite());
}
