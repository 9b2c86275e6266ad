/*
 * fuzz_dispatch.c - libFuzzer harness for decoded batches run through the
 * daemon's executor and dispatch against the host backend: handles,
 * reservations, streams, kernels, layouts, profiles, graph capture and
 * buffers shared between the connections of a service in any order, on
 * two connections, pipelined.
 *
 * Set-up (once): two executors on the host backend with 64 MiB of "device"
 * memory each, one with the subslices layout and one with exclusive pages,
 * and small limits (4 streams, 8 handles per connection) so the limit paths
 * are reachable.  Their callbacks record every reply and completion.
 *
 * Per input: the bytes are turned into up to 32 Requests, either by a small
 * op interpreter (handle ids from a set of ten so ops hit each other,
 * streams 0-3 and two out of range, built-ins by name with right and wrong
 * arguments, buffers passed as buffer or buffer_in, share and import under
 * a few names, good and bad, sizes and offsets near every limit) or, when
 * the first byte says so, by decoding length-prefixed Request messages.
 * The two connections speak for two services, or (flag 0x40) for the same
 * one, so that one imports what the other shares.  Each request is
 * encoded, decoded the way session.c decodes it, and submitted with
 * executor_submit on one of two fake connections; some wait for their
 * reply, the rest stay in flight.  Then both connections are closed with
 * executor_close and the harness waits for the closed callbacks.
 *
 * It aborts when:
 *   - a reply or completion arrives after its connection's closed callback,
 *     or a batch gets anything but exactly one response and one completion;
 *   - a response is malformed: unknown id, results count not the failed
 *     index, a result of the wrong kind or a read of the wrong length, an
 *     error without a message;
 *   - the outcome contradicts a model of each connection: a batch on a fifth
 *     stream that is not refused with GPUCMD_ELIMIT, an op on a handle the
 *     model says is gone that succeeds, ENOTFOUND for live handles, bytes
 *     read back that differ from what the batches wrote (bytes whose value
 *     the model knows: written, filled, copied, or fresh memory that must be
 *     zero), a GPUCMD_ESTREAM where no fault ran or a fault that is never
 *     reported to the next sync or read of its stream (data and fault checks
 *     are skipped for inputs that record graphs: a replay runs later), a
 *     write into a shared or imported handle, or a kernel output passed as
 *     buffer_in, that succeeds, a share of a handle shared already that is
 *     not GPUCMD_EINVAL, an import that finds a handle live which the model
 *     says is not (GPUCMD_EEXIST);
 *   - after the closed callbacks, a service still has bytes or allocations
 *     charged to it, or shares a buffer.
 * Nothing waits longer than 30 s: a wedged executor aborts too.  spin()
 * launches are capped at 1000 us so every input stays short.
 *
 * FUZZ_TRACE=1 in the environment prints every batch and its outcome, to
 * read a reproducer.  Built with -DFUZZ_TOLERATE_ZEROING_RACE (exploration
 * only, see fuzz.mk) the model stops checking bytes of a buffer once a
 * stream other than its owner touches it, so fuzzing can go on past that
 * known daemon bug (tests/fuzz/regressions/fuzz_dispatch/
 * empty-zeroing-not-ordered) until it is fixed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "dispatch.h"
#include "executor.h"
#include "frame.h"
#include "gpucmd.h"
#include "log.h"
#include "service.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);
const char *__asan_default_options(void);

/* A client asking for 2^62 bytes of host memory gets ENOMEM, not a crash. */
const char *__asan_default_options(void)
{
	return "allocator_may_return_null=1";
}

#define expect(cond)                                                  \
	do {                                                          \
		if (!(cond)) {                                        \
			fprintf(stderr, "fuzz_dispatch: %s:%d: %s\n", \
				__FILE__, __LINE__, #cond);           \
			abort();                                      \
		}                                                     \
	} while (0)
#define expectf(cond, ...)                                              \
	do {                                                            \
		if (!(cond)) {                                          \
			fprintf(stderr,                                 \
				"fuzz_dispatch: %s:%d: %s: ", __FILE__, \
				__LINE__, #cond);                       \
			fprintf(stderr, __VA_ARGS__);                   \
			fputc('\n', stderr);                            \
			abort();                                        \
		}                                                       \
	} while (0)

#define HOST_MEMORY (64u << 20)
#define MAX_STREAMS 4
#define NO_STREAM MAX_STREAMS
#define MAX_HANDLES 8
#define MAX_BATCHES 32
#define MAX_OPS 64
#define MAX_READ_TOTAL (64u << 20) /* read bytes per input */
#define MAX_WRITE_TOTAL (4u << 20) /* write bytes per input */
#define MAX_SPIN_USEC 1000u
#define MAX_SPIN_TOTAL_USEC 2000000u /* per input, replays counted */
#define MODEL_MAX_SIZE (1u << 20)    /* larger buffers: no data model */
#define WAIT_SECONDS 30

/* ---- the executors and their callbacks ------------------------------------ */

struct fconn {
	struct executor_conn econn;
	struct service *svc;
	bool used;
	bool closed;
	uint32_t replies;     /* response frames */
	uint32_t completions; /* completed=true */
	uint32_t submitted;
	Gpucmd__Frame *responses[MAX_BATCHES];
	uint32_t nresponses;
};

/*
 * Two executors, the daemon's two layouts; an input runs on one of them
 * (its first byte).  Each has services of its own, as the daemon's one
 * executor has: a service stays in its executor's rounds for a pass after
 * its queue empties (rounds.h), and a batch queued meanwhile through the
 * other executor would be run by the first one.
 */
static struct executor *executors[2];
static unsigned ex_index; /* the current input's */
static struct config cfg;
static struct fconn conns[2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static uint64_t next_conn_id;

/* A reply in pieces, made one flat frame (its staging freed). */
static uint8_t *flatten(struct reply_pieces *pieces, size_t *len)
{
	const struct frame_pieces *fp = reply_pieces_frame(pieces);
	uint8_t *buf = frame_pieces_join(fp);

	expectf(buf != NULL, "a reply's pieces do not add up to %zu bytes",
		fp->total);
	*len = fp->total;
	reply_pieces_free(pieces);
	return buf;
}

static void on_reply(void *conn, uint8_t *buf, size_t len,
		     struct reply_pieces *pieces, const struct reply_lost *lost,
		     bool completed, void *arg)
{
	struct fconn *c = conn;

	(void)arg;
	/* Only the host out of memory loses a response: never here. */
	expectf(lost == NULL, "request %llu's response was lost",
		lost != NULL ? (unsigned long long)lost->id : 0ull);
	if (pieces != NULL) {
		expectf(buf == NULL, "a reply both flat and in pieces");
		buf = flatten(pieces, &len);
	}
	pthread_mutex_lock(&lock);
	expectf(!c->closed, "a reply after the closed callback");
	if (buf != NULL) {
		struct frame_header h;
		Gpucmd__Frame *f;

		expect(len >= FRAME_HEADER_SIZE);
		frame_header_unpack(buf, &h);
		expect(frame_header_check(&h, FRAME_MAX_BODY, NULL, 0) == 0);
		expect(h.length == len - FRAME_HEADER_SIZE);
		f = frame_decode(buf + FRAME_HEADER_SIZE, h.length);
		expect(f != NULL);
		expect(f->msg_case == GPUCMD__FRAME__MSG_RESPONSE);
		expectf(c->nresponses < MAX_BATCHES &&
				c->nresponses < c->submitted,
			"more responses (%u) than batches (%u)",
			c->nresponses + 1, c->submitted);
		c->responses[c->nresponses++] = f;
		c->replies++;
		frame_buf_free(buf);
	} else {
		/* A reply without a frame only ever carries a completion. */
		expectf(completed, "a reply with neither frame nor completion");
	}
	if (completed)
		c->completions++;
	expectf(c->completions <= c->submitted, "%u completions for %u batches",
		c->completions, c->submitted);
	pthread_cond_broadcast(&cond);
	pthread_mutex_unlock(&lock);
}

static void on_closed(void *conn, void *arg)
{
	struct fconn *c = conn;

	(void)arg;
	pthread_mutex_lock(&lock);
	expectf(!c->closed, "closed twice");
	c->closed = true;
	pthread_cond_broadcast(&cond);
	pthread_mutex_unlock(&lock);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct executor_callbacks cb = {
		.reply = on_reply,
		.closed = on_closed,
	};
	char why[512];

	(void)argc;
	(void)argv;
	log_set_level(LOG_LEVEL_ERR);
	config_defaults(&cfg);
	cfg.backend = CONFIG_BACKEND_HOST;
	cfg.host_memory = HOST_MEMORY;
	cfg.limits.max_streams = MAX_STREAMS;
	cfg.limits.max_handles = MAX_HANDLES;
	for (int i = 0; i < 2; i++) {
		snprintf(cfg.layout, sizeof(cfg.layout), "%s",
			 i ? "exclusive" : "subslices");
		if (executor_start(&cfg, &cb, &executors[i], why,
				   sizeof(why)) != 0) {
			fprintf(stderr, "fuzz_dispatch: executor: %s\n", why);
			abort();
		}
	}
	return 0;
}

/* Wait (at most WAIT_SECONDS) until done(c) holds; abort if it never does. */
static void wait_for(struct fconn *c, bool (*done)(const struct fconn *),
		     const char *what)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += WAIT_SECONDS;
	pthread_mutex_lock(&lock);
	while (!done(c)) {
		if (pthread_cond_timedwait(&cond, &lock, &until) == ETIMEDOUT &&
		    !done(c)) {
			fprintf(stderr,
				"fuzz_dispatch: wedged waiting for %s: %u "
				"batches, %u replies, %u completions, closed %d\n",
				what, c->submitted, c->replies, c->completions,
				c->closed);
			abort();
		}
	}
	pthread_mutex_unlock(&lock);
}

static bool all_replied(const struct fconn *c)
{
	return c->replies == c->submitted;
}

static bool is_closed(const struct fconn *c)
{
	return c->closed;
}

/* ---- building requests ---------------------------------------------------- */

/* A bump allocator for the messages of one request. */
struct arena {
	void *blocks[4096];
	size_t n;
};

static void *arena_get(struct arena *a, size_t size)
{
	void *p;

	if (a->n == sizeof(a->blocks) / sizeof(a->blocks[0]))
		return NULL;
	p = calloc(1, size ? size : 1);
	expect(p != NULL);
	a->blocks[a->n++] = p;
	return p;
}

static void arena_clear(struct arena *a)
{
	while (a->n > 0)
		free(a->blocks[--a->n]);
}

struct reader {
	const uint8_t *p;
	size_t n;
};

static uint8_t rd8(struct reader *r)
{
	if (r->n == 0)
		return 0;
	r->n--;
	return *r->p++;
}

static uint16_t rd16(struct reader *r)
{
	uint16_t lo = rd8(r);

	return (uint16_t)(lo | (rd8(r) << 8));
}

#define PICK(r, table) (table[rd8(r) % (sizeof(table) / sizeof(table[0]))])

static const uint64_t handle_ids[] = {
	1, 2, 3, 4, 5, 6, 7, 0, UINT64_MAX, (1ull << 32) | 1,
};
static const uint32_t stream_ids[] = { 0, 1, 2, 3, 4, UINT32_MAX };
static const uint64_t sizes[] = {
	0,
	1,
	2,
	3,
	4,
	5,
	7,
	8,
	12,
	16,
	64,
	100,
	256,
	1000,
	4096,
	4097,
	65536,
	1u << 20,
	4u << 20,
	16u << 20,
	64u << 20,
	(64u << 20) + 1,
	1ull << 32,
	UINT64_MAX,
	UINT64_MAX - 4095,
	1ull << 63,
};
static const uint64_t offsets[] = {
	0,	    1,	   2,	     3,		 4,
	8,	    16,	   100,	     255,	 256,
	4096,	    65535, 1u << 20, UINT64_MAX, UINT64_MAX - 3,
	1ull << 63,
};
static const uint32_t u32s[] = {
	0,   1,	   2,	 3,	   4,	     16,       64,
	256, 1024, 4096, 1u << 18, 1u << 20, 1u << 30, UINT32_MAX,
};
static const uint32_t dims[] = {
	1,    1,  1,  2,     32,    0,		 1024,
	1025, 64, 65, 65535, 65536, 0x7fffffffu, UINT32_MAX,
};
static const uint32_t spins[] = { 0, 1, 10, 100, MAX_SPIN_USEC };

static const float f32s[] = { 0.0f, 1.0f, -1.0f, 2.5f, NAN, INFINITY };
static const uint32_t shared_sizes[] = { 0, 1024, 48u << 10, 1u << 20,
					 UINT32_MAX };
static const uint64_t cpu_sizes[] = { 0,	1,	    4096,
				      1u << 20, UINT64_MAX, 1ull << 62 };
static const char *const kernel_names[] = {
	"fill_u32",	  "copy", "add_f32", "scale_f32", "saxpy_f32",
	"reduce_sum_f32", "spin", "fault",   "nope",	  "",
};
static const char *const kernel_sigs[] = {
	"Buu", "BbU", "Bbbu", "Bfu", "Bbfu", "Bbu", "u", "", "", "",
};
static const uint64_t region_ids[] = { 1, 2, 3, 1, 2, 0, 99 };
static const uint64_t region_sizes[] = {
	0, 1, 4096, 65536, 1u << 20, 8u << 20, UINT64_MAX, 1ull << 40,
};
static const char *const svc_names[2][4] = {
	{ "", "fuzzA", "fuzzB", "nobody" },
	{ "", "fuzzA1", "fuzzB1", "nobody" },
};
static const char *const presets[] = { "subslices", "exclusive", "custom",
				       "bogus" };
/* Names of shared buffers: mostly good ones that meet, some refused. */
static const char *const shared_names[] = {
	"w",
	"w",
	"weights",
	"model/layer.0:w-q_k",
	"",
	"a b",
	"\xc3\xa9",
	"0123456789012345678901234567890123456789012345678901234567890ab",
	"0123456789012345678901234567890123456789012345678901234567890abc",
};
static const char *const pool_kinds[] = { "sliced", "exclusive", "direct",
					  "?" };

/* What the interpreter plans; the model checks what really happened. */
#define MAX_FDS 8

/* A descriptor to pass with a region_attach, made at submit time. */
enum fd_kind {
	FD_SEALED,	 /* memfd sealed against shrinking, as announced */
	FD_LARGER,	 /* sealed, larger than announced */
	FD_UNSEALED,	 /* memfd without seals */
	FD_SMALLER,	 /* sealed, smaller than announced */
	FD_PIPE,	 /* not a memfd at all */
	FD_WRITE_SEALED, /* sealed against writes too: cannot be mapped */
	FD_KINDS
};

struct fd_spec {
	uint8_t kind;
	uint64_t size; /* what the attach announces */
};

struct plan {
	struct arena arena;
	Gpucmd__Request req;
	Gpucmd__Op *ops[MAX_OPS];
	struct fd_spec fds[MAX_FDS];
	uint32_t nfds;
	uint64_t planned_size[sizeof(handle_ids) / sizeof(handle_ids[0])];
	uint64_t read_total;
	uint64_t write_total;
};

static Gpucmd__Op *new_op(struct plan *p)
{
	Gpucmd__Op *op;

	if (p->req.n_ops == MAX_OPS)
		return NULL;
	op = arena_get(&p->arena, sizeof(*op));
	if (op == NULL)
		return NULL;
	gpucmd__op__init(op);
	p->ops[p->req.n_ops++] = op;
	return op;
}

static size_t handle_slot(uint64_t id)
{
	for (size_t i = 0; i < sizeof(handle_ids) / sizeof(handle_ids[0]); i++)
		if (handle_ids[i] == id)
			return i;
	return 0;
}

/* An offset or length: from the table, or relative to the planned size. */
static uint64_t pick_extent(struct reader *r, const struct plan *p,
			    uint64_t handle, uint64_t base)
{
	uint64_t size = p->planned_size[handle_slot(handle)];
	uint8_t how = rd8(r);

	switch (how % 6) {
	case 0:
		return PICK(r, offsets);
	case 1:
		return size > base ? size - base : 0;
	case 2:
		return size > base + 1 ? size - base - 1 : 0;
	case 3:
		return size / 2;
	case 4:
		return size - base + 1;
	default:
		return rd8(r);
	}
}

static ProtobufCBinaryData pattern(struct plan *p, struct reader *r,
				   uint64_t len)
{
	ProtobufCBinaryData d = { 0, NULL };
	uint8_t seed = rd8(r);

	if (len > 65536 || p->write_total + len > MAX_WRITE_TOTAL)
		len = rd8(r);
	d.data = arena_get(&p->arena, len);
	if (d.data == NULL)
		return d;
	d.len = len;
	for (uint64_t i = 0; i < len; i++)
		d.data[i] = (uint8_t)(seed + i * 7 + (i >> 8));
	p->write_total += len;
	return d;
}

static Gpucmd__CopyLayout *layout(struct plan *p, struct reader *r,
				  uint64_t *dense)
{
	static const uint64_t shape_vals[] = { 0, 1, 2, 3, 4, 8, 16 };
	static const uint32_t elem_sizes[] = { 1, 2, 4, 8, 0 };
	Gpucmd__CopyLayout *l = arena_get(&p->arena, sizeof(*l));
	uint8_t how = rd8(r);
	uint32_t rank = 1 + how % 3;
	uint64_t elems = 1;

	if (l == NULL)
		return NULL;
	gpucmd__copy_layout__init(l);
	if (how & 0x80)
		rank = (how >> 3) % 10; /* 0 and over COMMAND_MAX_RANK too */
	l->shape = arena_get(&p->arena, (rank + 1) * sizeof(uint64_t));
	l->strides = arena_get(&p->arena, (rank + 1) * sizeof(uint64_t));
	if (l->shape == NULL || l->strides == NULL)
		return NULL;
	l->n_shape = rank;
	l->n_strides = rank;
	if (how & 0x40)
		l->n_strides = (rank + 1) % 10;
	for (uint32_t i = 0; i < rank; i++) {
		l->shape[i] = PICK(r, shape_vals);
		elems *= l->shape[i];
	}
	/* Pitched row-major strides, with a pad on the rows; or garbage. */
	if (rank > 0) {
		uint8_t pad = rd8(r) % 4;

		l->strides[rank - 1] = 1;
		if (rank > 1)
			l->strides[rank - 2] = l->shape[rank - 1] + pad;
		for (int i = (int)rank - 3; i >= 0; i--)
			l->strides[i] = l->strides[i + 1] * l->shape[i + 1];
		if (how & 0x20)
			l->strides[rd8(r) % rank] = PICK(r, shape_vals);
	}
	l->elem_size = PICK(r, elem_sizes);
	*dense = elems * l->elem_size;
	return l;
}

/* The handle a buffer or buffer_in argument names; 0 for the others. */
static uint64_t arg_handle(const Gpucmd__KernelArg *a)
{
	if (a->value_case == GPUCMD__KERNEL_ARG__VALUE_BUFFER)
		return a->buffer;
	if (a->value_case == GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN)
		return a->buffer_in;
	return 0;
}

static bool is_buffer_arg(const Gpucmd__KernelArg *a)
{
	return a->value_case == GPUCMD__KERNEL_ARG__VALUE_BUFFER ||
	       a->value_case == GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN;
}

static void kernel(struct plan *p, struct reader *r, Gpucmd__Op *op)
{
	Gpucmd__OpKernel *k = arena_get(&p->arena, sizeof(*k));
	uint8_t which = rd8(r) % 10, flags = rd8(r);
	const char *sig = kernel_sigs[which];
	size_t nargs = strlen(sig);
	uint64_t first_buf = 0;
	bool have_buf = false;

	if (k == NULL)
		return;
	gpucmd__op_kernel__init(k);
	op->op_case = GPUCMD__OP__OP_KERNEL;
	op->kernel = k;
	k->name = (char *)kernel_names[which];
	if (flags & 1)
		nargs = (nargs + 1 + (flags >> 6)) % 6; /* a wrong count */
	k->n_grid = (flags & 2) ? (size_t)(rd8(r) % 5) : 1;
	k->n_block = (flags & 2) ? (size_t)(rd8(r) % 5) : 1;
	k->grid = arena_get(&p->arena, 5 * sizeof(uint32_t));
	k->block = arena_get(&p->arena, 5 * sizeof(uint32_t));
	k->args = arena_get(&p->arena, (nargs + 1) * sizeof(*k->args));
	if (k->grid == NULL || k->block == NULL || k->args == NULL)
		return;
	for (size_t d = 0; d < 5; d++) {
		k->grid[d] = (flags & 2) ? PICK(r, dims) : 1;
		k->block[d] = (flags & 2) ? PICK(r, dims) : 64;
	}
	if (flags & 4)
		k->shared_bytes = PICK(r, shared_sizes);
	for (size_t a = 0; a < nargs; a++) {
		Gpucmd__KernelArg *arg = arena_get(&p->arena, sizeof(*arg));
		char kind = a < strlen(sig) ? sig[a] : 'u';
		uint8_t ab = rd8(r);

		if (arg == NULL)
			return;
		gpucmd__kernel_arg__init(arg);
		if (flags & 8 && (ab & 0x80)) /* a wrong kind */
			kind = "Buifx"[ab % 5];
		switch (kind) {
		case 'B':
		case 'b':
			/*
			 * An input goes as buffer_in half the time (a built-in
			 * takes both), an output seldom (refused).
			 */
			if (kind == 'b' ? (ab & 0x40) != 0 :
					  (ab & 0x7f) == 0x7f) {
				arg->value_case =
					GPUCMD__KERNEL_ARG__VALUE_BUFFER_IN;
				arg->buffer_in = PICK(r, handle_ids);
			} else {
				arg->value_case =
					GPUCMD__KERNEL_ARG__VALUE_BUFFER;
				arg->buffer = PICK(r, handle_ids);
			}
			if (!have_buf) {
				first_buf = arg_handle(arg);
				have_buf = true;
			}
			break;
		case 'u':
			arg->value_case = GPUCMD__KERNEL_ARG__VALUE_U32;
			if (strcmp(k->name, "spin") == 0)
				arg->u32 = PICK(r, spins);
			else if (have_buf && (ab & 1))
				arg->u32 =
					(uint32_t)(pick_extent(r, p, first_buf,
							       0) /
						   4);
			else
				arg->u32 = PICK(r, u32s);
			break;
		case 'i':
			arg->value_case = GPUCMD__KERNEL_ARG__VALUE_I32;
			arg->i32 = (int32_t)PICK(r, u32s);
			break;
		case 'U':
			arg->value_case = GPUCMD__KERNEL_ARG__VALUE_U64;
			arg->u64 = have_buf ? pick_extent(r, p, first_buf, 0) :
					      PICK(r, sizes);
			break;
		case 'f':
			arg->value_case = GPUCMD__KERNEL_ARG__VALUE_F32;
			arg->f32 = PICK(r, f32s);
			break;
		default:
			break; /* no value at all */
		}
		k->args[k->n_args++] = arg;
	}
}

static void install_pools(struct plan *p, struct reader *r, Gpucmd__Op *op)
{
	Gpucmd__OpInstallPools *ip = arena_get(&p->arena, sizeof(*ip));
	Gpucmd__MemoryLayout *l = arena_get(&p->arena, sizeof(*l));
	uint8_t how = rd8(r);
	size_t n = how % 6;

	if (ip == NULL || l == NULL)
		return;
	gpucmd__op_install_pools__init(ip);
	gpucmd__memory_layout__init(l);
	op->op_case = GPUCMD__OP__OP_INSTALL_POOLS;
	op->install_pools = ip;
	if (how & 0x80)
		return; /* no layout: the default preset */
	ip->layout = l;
	l->preset = (char *)PICK(r, presets);
	l->pools = arena_get(&p->arena, (n + 1) * sizeof(*l->pools));
	if (l->pools == NULL)
		return;
	for (size_t i = 0; i < n; i++) {
		Gpucmd__PoolOptions *o = arena_get(&p->arena, sizeof(*o));

		if (o == NULL)
			return;
		gpucmd__pool_options__init(o);
		o->kind = (char *)PICK(r, pool_kinds);
		o->page_size = PICK(r, sizes);
		o->max_slice = PICK(r, sizes);
		o->max_pool_size = rd8(r) & 1 ? PICK(r, sizes) : 0;
		o->max_alloc = rd8(r) & 1 ? PICK(r, sizes) : 0;
		o->dealloc_period = rd8(r);
		o->reclaim_at = rd8(r) & 1 ? PICK(r, sizes) : 0;
		l->pools[l->n_pools++] = o;
	}
}

static Gpucmd__RegionRef *region_ref(struct plan *p, struct reader *r)
{
	Gpucmd__RegionRef *ref = arena_get(&p->arena, sizeof(*ref));
	uint8_t how = rd8(r);

	if (ref == NULL)
		return NULL;
	gpucmd__region_ref__init(ref);
	ref->region = PICK(r, region_ids);
	ref->offset = (how & 1) ? PICK(r, offsets) : rd8(r);
	ref->length = (how & 2) ? PICK(r, sizes) : rd8(r);
	if ((how & 4) && ref->length > 65536)
		ref->length = 65536;
	return ref;
}

/* One op of the interpreter; false at the end of a batch. */
static bool interpret_op(struct plan *p, struct reader *r)
{
	uint8_t code;
	Gpucmd__Op *op;
	uint64_t h, len, dense;

	if (r->n == 0)
		return false;
	code = rd8(r) % 40;
	if (code == 13)
		return false;
	op = new_op(p);
	if (op == NULL)
		return false;
#define SUB(field, type, init, kase)                            \
	do {                                                    \
		op->field = arena_get(&p->arena, sizeof(type)); \
		if (op->field == NULL)                          \
			return false;                           \
		init(op->field);                                \
		op->op_case = kase;                             \
	} while (0)
	switch (code) {
	case 0:
		SUB(empty, Gpucmd__OpEmpty, gpucmd__op_empty__init,
		    GPUCMD__OP__OP_EMPTY);
		op->empty->handle = h = PICK(r, handle_ids);
		op->empty->size = PICK(r, sizes);
		p->planned_size[handle_slot(h)] = op->empty->size;
		break;
	case 1:
		SUB(create_with_data, Gpucmd__OpCreateWithData,
		    gpucmd__op_create_with_data__init,
		    GPUCMD__OP__OP_CREATE_WITH_DATA);
		op->create_with_data->handle = h = PICK(r, handle_ids);
		op->create_with_data->data = pattern(p, r, PICK(r, sizes));
		p->planned_size[handle_slot(h)] =
			op->create_with_data->data.len;
		break;
	case 2:
		SUB(write, Gpucmd__OpWrite, gpucmd__op_write__init,
		    GPUCMD__OP__OP_WRITE);
		op->write->handle = h = PICK(r, handle_ids);
		op->write->offset = pick_extent(r, p, h, 0);
		op->write->data =
			pattern(p, r, pick_extent(r, p, h, op->write->offset));
		break;
	case 3:
		SUB(read, Gpucmd__OpRead, gpucmd__op_read__init,
		    GPUCMD__OP__OP_READ);
		op->read->handle = h = PICK(r, handle_ids);
		op->read->offset = pick_extent(r, p, h, 0);
		len = pick_extent(r, p, h, op->read->offset);
		if (len > MAX_READ_TOTAL - p->read_total)
			len = rd8(r);
		p->read_total += len;
		op->read->length = len;
		break;
	case 4:
		SUB(release, Gpucmd__OpRelease, gpucmd__op_release__init,
		    GPUCMD__OP__OP_RELEASE);
		op->release->handle = PICK(r, handle_ids);
		break;
	case 5:
		kernel(p, r, op);
		break;
	case 6:
		SUB(sync, Gpucmd__OpSync, gpucmd__op_sync__init,
		    GPUCMD__OP__OP_SYNC);
		break;
	case 7:
		SUB(memory_usage, Gpucmd__OpMemoryUsage,
		    gpucmd__op_memory_usage__init, GPUCMD__OP__OP_MEMORY_USAGE);
		break;
	case 8:
		SUB(ping, Gpucmd__OpPing, gpucmd__op_ping__init,
		    GPUCMD__OP__OP_PING);
		break;
	case 9:
		SUB(memory_report, Gpucmd__OpMemoryReport,
		    gpucmd__op_memory_report__init,
		    GPUCMD__OP__OP_MEMORY_REPORT);
		break;
	case 10:
		SUB(status, Gpucmd__OpStatus, gpucmd__op_status__init,
		    GPUCMD__OP__OP_STATUS);
		break;
	case 11:
		SUB(write, Gpucmd__OpWrite, gpucmd__op_write__init,
		    GPUCMD__OP__OP_WRITE);
		op->write->handle = h = PICK(r, handle_ids);
		op->write->offset = pick_extent(r, p, h, 0);
		op->write->layout = layout(p, r, &dense);
		if (rd8(r) & 1)
			dense++; /* not what the layout holds */
		op->write->data = pattern(p, r, dense);
		break;
	case 12:
		SUB(read, Gpucmd__OpRead, gpucmd__op_read__init,
		    GPUCMD__OP__OP_READ);
		op->read->handle = h = PICK(r, handle_ids);
		op->read->offset = pick_extent(r, p, h, 0);
		op->read->layout = layout(p, r, &dense);
		op->read->length = rd8(r); /* ignored with a layout */
		p->read_total += dense;
		break;
	case 14:
		SUB(reserve, Gpucmd__OpReserve, gpucmd__op_reserve__init,
		    GPUCMD__OP__OP_RESERVE);
		op->reserve->reservation = PICK(r, handle_ids);
		op->reserve->size = PICK(r, sizes);
		break;
	case 15:
		SUB(bind, Gpucmd__OpBind, gpucmd__op_bind__init,
		    GPUCMD__OP__OP_BIND);
		op->bind->reservation = PICK(r, handle_ids);
		op->bind->handle = h = PICK(r, handle_ids);
		p->planned_size[handle_slot(h)] = 4096;
		break;
	case 16:
		SUB(cursor, Gpucmd__OpCursor, gpucmd__op_cursor__init,
		    GPUCMD__OP__OP_CURSOR);
		break;
	case 17:
		SUB(stream_report, Gpucmd__OpStreamReport,
		    gpucmd__op_stream_report__init,
		    GPUCMD__OP__OP_STREAM_REPORT);
		break;
	case 18:
		SUB(memory_cleanup, Gpucmd__OpMemoryCleanup,
		    gpucmd__op_memory_cleanup__init,
		    GPUCMD__OP__OP_MEMORY_CLEANUP);
		break;
	case 19:
		SUB(flush_drops, Gpucmd__OpFlushDrops,
		    gpucmd__op_flush_drops__init, GPUCMD__OP__OP_FLUSH_DROPS);
		break;
	case 20:
		SUB(allocation_mode, Gpucmd__OpAllocationMode,
		    gpucmd__op_allocation_mode__init,
		    GPUCMD__OP__OP_ALLOCATION_MODE);
		op->allocation_mode->mode =
			(Gpucmd__AllocationMode)(rd8(r) % 3);
		break;
	case 21:
		install_pools(p, r, op);
		break;
	case 22:
		SUB(reserve_cpu, Gpucmd__OpReserveCpu,
		    gpucmd__op_reserve_cpu__init, GPUCMD__OP__OP_RESERVE_CPU);
		op->reserve_cpu->size = PICK(r, cpu_sizes);
		break;
	case 23:
		SUB(profile_begin, Gpucmd__OpProfileBegin,
		    gpucmd__op_profile_begin__init,
		    GPUCMD__OP__OP_PROFILE_BEGIN);
		op->profile_begin->profile = rd8(r) % 4;
		break;
	case 24:
		SUB(profile_end, Gpucmd__OpProfileEnd,
		    gpucmd__op_profile_end__init, GPUCMD__OP__OP_PROFILE_END);
		op->profile_end->profile = rd8(r) % 4;
		break;
	case 25:
		SUB(capture_begin, Gpucmd__OpCaptureBegin,
		    gpucmd__op_capture_begin__init,
		    GPUCMD__OP__OP_CAPTURE_BEGIN);
		break;
	case 26:
		SUB(capture_end, Gpucmd__OpCaptureEnd,
		    gpucmd__op_capture_end__init, GPUCMD__OP__OP_CAPTURE_END);
		op->capture_end->graph = rd8(r) % 4;
		break;
	case 27:
		SUB(graph_launch, Gpucmd__OpGraphLaunch,
		    gpucmd__op_graph_launch__init, GPUCMD__OP__OP_GRAPH_LAUNCH);
		op->graph_launch->graph = rd8(r) % 4;
		break;
	case 28:
		SUB(graph_destroy, Gpucmd__OpGraphDestroy,
		    gpucmd__op_graph_destroy__init,
		    GPUCMD__OP__OP_GRAPH_DESTROY);
		op->graph_destroy->graph = rd8(r) % 4;
		break;
	case 29:
		SUB(evict, Gpucmd__OpEvict, gpucmd__op_evict__init,
		    GPUCMD__OP__OP_EVICT);
		op->evict->service = (char *)PICK(r, svc_names[ex_index]);
		op->evict->connection_id = rd8(r);
		break;
	case 30:
		SUB(cleanup, Gpucmd__OpCleanup, gpucmd__op_cleanup__init,
		    GPUCMD__OP__OP_CLEANUP);
		op->cleanup->service = (char *)PICK(r, svc_names[ex_index]);
		break;
	case 32:
		SUB(region_attach, Gpucmd__OpRegionAttach,
		    gpucmd__op_region_attach__init,
		    GPUCMD__OP__OP_REGION_ATTACH);
		op->region_attach->region = PICK(r, region_ids);
		op->region_attach->size = PICK(r, region_sizes);
		if (p->nfds < MAX_FDS) {
			uint8_t k = rd8(r);

			/* Mostly good descriptors; sometimes none at all. */
			p->fds[p->nfds].kind =
				k < 160 ? FD_SEALED : k % FD_KINDS;
			p->fds[p->nfds].size = op->region_attach->size;
			if (k != 255)
				p->nfds++;
		}
		break;
	case 33:
		SUB(region_release, Gpucmd__OpRegionRelease,
		    gpucmd__op_region_release__init,
		    GPUCMD__OP__OP_REGION_RELEASE);
		op->region_release->region = PICK(r, region_ids);
		break;
	case 34:
		SUB(write, Gpucmd__OpWrite, gpucmd__op_write__init,
		    GPUCMD__OP__OP_WRITE);
		op->write->handle = h = PICK(r, handle_ids);
		op->write->offset = pick_extent(r, p, h, 0);
		op->write->region = region_ref(p, r);
		if (op->write->region == NULL)
			return false;
		if (rd8(r) == 0)
			op->write->data = pattern(p, r, 1); /* both: refused */
		break;
	case 35:
		SUB(create_with_data, Gpucmd__OpCreateWithData,
		    gpucmd__op_create_with_data__init,
		    GPUCMD__OP__OP_CREATE_WITH_DATA);
		op->create_with_data->handle = h = PICK(r, handle_ids);
		op->create_with_data->region = region_ref(p, r);
		if (op->create_with_data->region == NULL)
			return false;
		p->planned_size[handle_slot(h)] =
			op->create_with_data->region->length;
		break;
	case 36:
		SUB(read, Gpucmd__OpRead, gpucmd__op_read__init,
		    GPUCMD__OP__OP_READ);
		op->read->handle = h = PICK(r, handle_ids);
		op->read->offset = pick_extent(r, p, h, 0);
		op->read->into = region_ref(p, r);
		if (op->read->into == NULL)
			return false;
		op->read->length =
			(rd8(r) & 1) ? op->read->into->length :
				       pick_extent(r, p, h, op->read->offset);
		break;
	case 37:
		SUB(empty, Gpucmd__OpEmpty, gpucmd__op_empty__init,
		    GPUCMD__OP__OP_EMPTY);
		op->empty->handle = h = PICK(r, handle_ids);
		op->empty->size = rd8(r) * 16u;
		p->planned_size[handle_slot(h)] = op->empty->size;
		break;
	case 38:
		SUB(share, Gpucmd__OpShare, gpucmd__op_share__init,
		    GPUCMD__OP__OP_SHARE);
		op->share->handle = PICK(r, handle_ids);
		op->share->name = (char *)PICK(r, shared_names);
		break;
	case 39:
		SUB(import, Gpucmd__OpImport, gpucmd__op_import__init,
		    GPUCMD__OP__OP_IMPORT);
		op->import->handle = h = PICK(r, handle_ids);
		op->import->name = (char *)PICK(r, shared_names);
		/* Its size is the sharer's: not known here. */
		p->planned_size[handle_slot(h)] = 0;
		break;
	default:
		break; /* an Op with no case set */
	}
#undef SUB
	return r->n > 0;
}

/* ---- the model ------------------------------------------------------------ */

struct mhandle {
	uint64_t id;
	int owner; /* stream index that allocated it */
	bool live;
	bool shared; /* shared or imported: read-only from then on */
	uint64_t size;
	uint8_t *data;	/* NULL: no data model for it */
	uint8_t *known; /* 1 where data[] is the truth */
};

struct mconn {
	struct mhandle h[64];
	size_t nh;
	uint32_t streams[MAX_STREAMS];
	/*
	 * allocated and fault_pending have one slot more, NO_STREAM: a batch
	 * of connection-wide ops runs on no stream (dispatch_needs_stream)
	 * and touches neither.
	 */
	uint32_t nstreams;
	bool allocated[MAX_STREAMS + 1]; /* a reservation was made on it */
	bool fault_pending[MAX_STREAMS + 1];
	bool overflow; /* too many ids: liveness unknown */
};

static struct mhandle *mfind(struct mconn *m, uint64_t id)
{
	for (size_t i = 0; i < m->nh; i++)
		if (m->h[i].id == id)
			return &m->h[i];
	if (m->nh == sizeof(m->h) / sizeof(m->h[0])) {
		m->overflow = true;
		return NULL;
	}
	m->h[m->nh].id = id;
	return &m->h[m->nh++];
}

static bool mlive(struct mconn *m, uint64_t id)
{
	struct mhandle *h = mfind(m, id);

	return h != NULL && h->live;
}

static void mdrop(struct mhandle *h)
{
	free(h->data);
	free(h->known);
	h->data = NULL;
	h->known = NULL;
	h->live = false;
	h->shared = false;
	h->size = 0;
}

static __attribute__((unused)) void mdrop_data(struct mhandle *h)
{
	free(h->data);
	free(h->known);
	h->data = NULL;
	h->known = NULL;
}

static void mnew(struct mhandle *h, uint64_t size, bool zero)
{
	mdrop(h);
	h->live = true;
	h->size = size;
	if (size > MODEL_MAX_SIZE)
		return;
	h->data = calloc(1, size + 1);
	h->known = calloc(1, size + 1);
	expect(h->data != NULL && h->known != NULL);
	if (zero)
		memset(h->known, 1, size);
}

static int stream_index(struct mconn *m, uint32_t number)
{
	for (uint32_t i = 0; i < m->nstreams; i++)
		if (m->streams[i] == number)
			return (int)i;
	return -1;
}

/* Geometry of a layout the daemon accepted: rows of width at pitch. */
struct rows {
	uint64_t height, width, pitch;
};

static bool layout_rows(const Gpucmd__CopyLayout *l, uint64_t len,
			struct rows *out)
{
	if (l == NULL) {
		out->height = 1;
		out->width = len;
		out->pitch = len;
		return true;
	}
	if (l->n_shape == 0 || l->n_shape != l->n_strides)
		return false;
	out->width = l->shape[l->n_shape - 1] * l->elem_size;
	out->height = 1;
	for (size_t i = 0; i + 1 < l->n_shape; i++)
		out->height *= l->shape[i];
	out->pitch = l->n_shape > 1 ?
			     l->strides[l->n_shape - 2] * l->elem_size :
			     out->width;
	return true;
}

static uint64_t layout_dense(const Gpucmd__CopyLayout *l, uint64_t len)
{
	uint64_t n = 1;

	if (l == NULL)
		return len;
	for (size_t i = 0; i < l->n_shape; i++)
		n *= l->shape[i];
	return n * l->elem_size;
}

static void apply_write(struct mhandle *h, uint64_t offset,
			const Gpucmd__CopyLayout *l, const uint8_t *src,
			uint64_t len)
{
	struct rows rw;

	if (h->data == NULL || !layout_rows(l, len, &rw) || rw.width == 0)
		return;
	for (uint64_t y = 0; y < rw.height; y++) {
		uint64_t at = offset + y * rw.pitch;

		expect(at + rw.width <= h->size);
		memcpy(h->data + at, src + y * rw.width, rw.width);
		memset(h->known + at, 1, rw.width);
	}
}

static void check_read(const struct mhandle *h, uint64_t offset,
		       const Gpucmd__CopyLayout *l, const uint8_t *got,
		       uint64_t len, size_t batch, size_t op)
{
	struct rows rw;

	if (h == NULL || h->data == NULL || !layout_rows(l, len, &rw))
		return;
	for (uint64_t y = 0; y < rw.height; y++) {
		uint64_t at = offset + y * rw.pitch;

		for (uint64_t x = 0; x < rw.width; x++) {
			uint64_t i = at + x;

			if (!h->known[i])
				continue;
			expectf(got[y * rw.width + x] == h->data[i],
				"batch %zu op %zu: read of handle %llu byte %llu "
				"is 0x%02x, the batches wrote 0x%02x",
				batch, op, (unsigned long long)h->id,
				(unsigned long long)i, got[y * rw.width + x],
				h->data[i]);
		}
	}
}

static void unknown(struct mhandle *h, uint64_t from, uint64_t len)
{
	if (h == NULL || h->data == NULL)
		return;
	if (from >= h->size)
		return;
	if (len > h->size - from)
		len = h->size - from;
	memset(h->known + from, 0, len);
}

static void apply_kernel(struct mconn *m, const Gpucmd__OpKernel *k)
{
	struct mhandle *out;

	if (k->n_args == 0 ||
	    k->args[0]->value_case != GPUCMD__KERNEL_ARG__VALUE_BUFFER)
		return;
	out = mfind(m, k->args[0]->buffer);
	if (out == NULL || out->data == NULL)
		return;
	if (strcmp(k->name, "fill_u32") == 0) {
		uint32_t v = k->args[1]->u32, n = k->args[2]->u32;

		expect((uint64_t)n * 4 <= out->size);
		for (uint32_t i = 0; i < n; i++) {
			uint8_t *p = out->data + (uint64_t)i * 4;

			p[0] = (uint8_t)v;
			p[1] = (uint8_t)(v >> 8);
			p[2] = (uint8_t)(v >> 16);
			p[3] = (uint8_t)(v >> 24);
		}
		memset(out->known, 1, (uint64_t)n * 4);
	} else if (strcmp(k->name, "copy") == 0) {
		struct mhandle *src = mfind(m, arg_handle(k->args[1]));
		uint64_t n = k->args[2]->u64;

		expect(n <= out->size);
		if (src == NULL || src->data == NULL) {
			unknown(out, 0, n);
			return;
		}
		expect(n <= src->size);
		memmove(out->data, src->data, n);
		memmove(out->known, src->known, n);
	} else if (strcmp(k->name, "reduce_sum_f32") == 0) {
		unknown(out, 0, 4);
	} else {
		/* Float results: the model does not compute them. */
		unknown(out, 0, (uint64_t)k->args[k->n_args - 1]->u32 * 4);
	}
}

/* The result an op that succeeded must carry. */
static void check_result(const Gpucmd__Op *op, const Gpucmd__OpResult *res,
			 size_t batch, size_t i)
{
	expect(res != NULL);
	switch (op->op_case) {
	case GPUCMD__OP__OP_READ:
		if (op->read->into != NULL) {
			expect(res->result_case ==
			       GPUCMD__OP_RESULT__RESULT_REGION);
			/* The part of the range the read filled. */
			expect(res->region != NULL &&
			       res->region->region == op->read->into->region &&
			       res->region->offset == op->read->into->offset &&
			       res->region->length <= op->read->into->length);
			break;
		}
		expectf(res->result_case == GPUCMD__OP_RESULT__RESULT_DATA,
			"batch %zu op %zu: read without data", batch, i);
		expectf(res->data.len == layout_dense(op->read->layout,
						      op->read->length),
			"batch %zu op %zu: read of %zu bytes, asked for %llu",
			batch, i, res->data.len,
			(unsigned long long)layout_dense(op->read->layout,
							 op->read->length));
		break;
	case GPUCMD__OP__OP_MEMORY_USAGE:
		expect(res->result_case == GPUCMD__OP_RESULT__RESULT_USAGE);
		expect(res->usage != NULL);
		expect(res->usage->bytes_in_use <= res->usage->bytes_reserved);
		break;
	case GPUCMD__OP__OP_MEMORY_REPORT:
		expect(res->result_case == GPUCMD__OP_RESULT__RESULT_REPORT);
		expect(res->report != NULL && res->report->totals != NULL);
		break;
	case GPUCMD__OP__OP_STATUS:
		expect(res->result_case == GPUCMD__OP_RESULT__RESULT_STATUS);
		break;
	case GPUCMD__OP__OP_CURSOR:
	case GPUCMD__OP__OP_CLEANUP:
		expect(res->result_case == GPUCMD__OP_RESULT__RESULT_VALUE);
		break;
	case GPUCMD__OP__OP_STREAM_REPORT:
		expect(res->result_case ==
		       GPUCMD__OP_RESULT__RESULT_STREAM_REPORT);
		break;
	case GPUCMD__OP__OP_PROFILE_END:
		expect(res->result_case == GPUCMD__OP_RESULT__RESULT_PROFILE);
		expect(res->profile != NULL);
		expect(res->profile->valid || res->profile->reason[0] != '\0');
		break;
	case GPUCMD__OP__OP_RESERVE_CPU:
		expect(res->result_case == GPUCMD__OP_RESULT__RESULT_CPU);
		expect(res->cpu != NULL &&
		       res->cpu->size == op->reserve_cpu->size);
		break;
	default:
		expectf(res->result_case == GPUCMD__OP_RESULT__RESULT_DONE &&
				res->done,
			"batch %zu op %zu (case %d): result case %d", batch, i,
			(int)op->op_case, (int)res->result_case);
		break;
	}
}

/* The handles an op names that must be live for it to succeed. */
static size_t needs_live(const Gpucmd__Op *op, uint64_t *ids)
{
	size_t n = 0;

	switch (op->op_case) {
	case GPUCMD__OP__OP_WRITE:
		ids[n++] = op->write->handle;
		break;
	case GPUCMD__OP__OP_READ:
		ids[n++] = op->read->handle;
		break;
	case GPUCMD__OP__OP_RELEASE:
		ids[n++] = op->release->handle;
		break;
	case GPUCMD__OP__OP_KERNEL:
		for (size_t a = 0; a < op->kernel->n_args && n < 8; a++)
			if (is_buffer_arg(op->kernel->args[a]))
				ids[n++] = arg_handle(op->kernel->args[a]);
		break;
	case GPUCMD__OP__OP_SHARE:
		ids[n++] = op->share->handle;
		break;
	default:
		break;
	}
	return n;
}

/* A built-in whose first argument is its output. */
static bool writes_first_arg(const Gpucmd__OpKernel *k)
{
	static const char *const writers[] = {
		"fill_u32",  "copy",	  "add_f32",
		"scale_f32", "saxpy_f32", "reduce_sum_f32",
	};

	if (k->module != 0 || k->n_args == 0 || !is_buffer_arg(k->args[0]))
		return false;
	for (size_t i = 0; i < sizeof(writers) / sizeof(writers[0]); i++)
		if (strcmp(k->name, writers[i]) == 0)
			return true;
	return false;
}

/* The effect of an op that ran on the model. */
static void apply(struct mconn *m, int si, const Gpucmd__Op *op,
		  const Gpucmd__OpResult *res, bool data_model, size_t batch,
		  size_t i)
{
	struct mhandle *h;
	uint64_t ids[8];
	size_t n = needs_live(op, ids);

#ifdef FUZZ_TOLERATE_ZEROING_RACE
	/*
	 * Exploration only: while fresh memory is zeroed on its owner stream
	 * without other streams ordering behind it, data used on another
	 * stream is not modelled.
	 */
	for (size_t k = 0; k < n; k++) {
		h = mfind(m, ids[k]);
		if (h != NULL && h->live && h->owner != si)
			mdrop_data(h);
	}
#endif

	for (size_t k = 0; k < n; k++)
		expectf(m->overflow || mlive(m, ids[k]),
			"batch %zu op %zu (case %d) succeeded on handle %llu, "
			"which is not live",
			batch, i, (int)op->op_case, (unsigned long long)ids[k]);
	switch (op->op_case) {
	case GPUCMD__OP__OP_EMPTY:
		h = mfind(m, op->empty->handle);
		expectf(op->empty->handle != 0, "empty of handle 0 succeeded");
		if (h == NULL)
			break;
		expectf(m->overflow || !h->live,
			"batch %zu op %zu: empty of live handle %llu succeeded",
			batch, i, (unsigned long long)h->id);
		/* The first reservation of a stream is fresh, zeroed memory. */
		mnew(h, op->empty->size, data_model && !m->allocated[si]);
		h->owner = si;
		m->allocated[si] = true;
		break;
	case GPUCMD__OP__OP_CREATE_WITH_DATA:
		h = mfind(m, op->create_with_data->handle);
		expectf(op->create_with_data->handle != 0,
			"create of handle 0 succeeded");
		if (h == NULL)
			break;
		expectf(m->overflow || !h->live,
			"batch %zu op %zu: create of live handle %llu succeeded",
			batch, i, (unsigned long long)h->id);
		if (op->create_with_data->region != NULL) {
			/* Region bytes: the model does not follow them. */
			mnew(h, op->create_with_data->region->length, false);
			h->owner = si;
			m->allocated[si] = true;
			break;
		}
		mnew(h, op->create_with_data->data.len, false);
		h->owner = si;
		if (data_model)
			apply_write(h, 0, NULL, op->create_with_data->data.data,
				    op->create_with_data->data.len);
		m->allocated[si] = true;
		break;
	case GPUCMD__OP__OP_RESERVE:
		m->allocated[si] = true;
		break;
	case GPUCMD__OP__OP_BIND:
		h = mfind(m, op->bind->handle);
		expectf(op->bind->handle != 0, "bind to handle 0 succeeded");
		if (h == NULL)
			break;
		expectf(m->overflow || !h->live,
			"batch %zu op %zu: bind to live handle %llu succeeded",
			batch, i, (unsigned long long)h->id);
		/* The size is the reservation's: not modelled. */
		mnew(h, UINT64_MAX, false);
		h->owner = si;
		break;
	case GPUCMD__OP__OP_WRITE:
		h = mfind(m, op->write->handle);
		expectf(h == NULL || !h->shared,
			"batch %zu op %zu: a write into handle %llu, shared, "
			"succeeded",
			batch, i, (unsigned long long)op->write->handle);
		if (h != NULL && op->write->region != NULL)
			unknown(h, 0, h->size);
		else if (h != NULL && data_model)
			apply_write(h, op->write->offset, op->write->layout,
				    op->write->data.data, op->write->data.len);
		break;
	case GPUCMD__OP__OP_READ:
		h = mfind(m, op->read->handle);
		if (data_model && op->read->into == NULL)
			check_read(h, op->read->offset, op->read->layout,
				   res->data.data, res->data.len, batch, i);
		break;
	case GPUCMD__OP__OP_RELEASE:
		h = mfind(m, op->release->handle);
		if (h != NULL)
			mdrop(h);
		break;
	case GPUCMD__OP__OP_SHARE:
		/* The bytes stay what they were: the copy moved them. */
		h = mfind(m, op->share->handle);
		if (h == NULL)
			break;
		expectf(m->overflow || !h->shared,
			"batch %zu op %zu: handle %llu was shared twice", batch,
			i, (unsigned long long)h->id);
		h->shared = true;
		h->owner = si;
		break;
	case GPUCMD__OP__OP_IMPORT:
		h = mfind(m, op->import->handle);
		expectf(op->import->handle != 0,
			"import to handle 0 succeeded");
		if (h == NULL)
			break;
		expectf(m->overflow || !h->live,
			"batch %zu op %zu: import to live handle %llu succeeded",
			batch, i, (unsigned long long)h->id);
		/* Another connection's bytes, of a size not known here. */
		mnew(h, UINT64_MAX, false);
		h->shared = true;
		h->owner = si;
		break;
	case GPUCMD__OP__OP_KERNEL:
		if (writes_first_arg(op->kernel)) {
			const Gpucmd__KernelArg *out = op->kernel->args[0];

			h = mfind(m, arg_handle(out));
			expectf(out->value_case ==
					GPUCMD__KERNEL_ARG__VALUE_BUFFER,
				"batch %zu op %zu: %s ran with its output "
				"passed as buffer_in",
				batch, i, op->kernel->name);
			expectf(h == NULL || !h->shared,
				"batch %zu op %zu: %s wrote handle %llu, shared",
				batch, i, op->kernel->name,
				(unsigned long long)arg_handle(out));
		}
		if (data_model)
			apply_kernel(m, op->kernel);
		if (strcmp(op->kernel->name, "fault") == 0)
			m->fault_pending[si] = true;
		break;
	default:
		break;
	}
}

/*
 * A write, inline, packed, inside a buffer of known size and not recorded,
 * fails only for the read-only rule, if at all.
 */
static void check_shared_write(struct mconn *m, const Gpucmd__OpWrite *w,
			       int code, const char *msg, size_t batch,
			       size_t i)
{
	const struct mhandle *h = mfind(m, w->handle);

	if (h == NULL || !h->shared || w->layout != NULL ||
	    h->size == UINT64_MAX || w->offset >= h->size ||
	    w->data.len > h->size - w->offset)
		return;
	expectf(code == GPUCMD_EINVAL && strstr(msg, "read-only") != NULL,
		"batch %zu op %zu: write into shared handle %llu gave %d (%s)",
		batch, i, (unsigned long long)w->handle, code, msg);
}

/* What a failed op's code must be, given the model. */
static void check_failure(struct mconn *m, const Gpucmd__Op *op, int code,
			  const char *msg, bool capture, size_t batch, size_t i)
{
	uint64_t ids[8], id = 0;
	size_t n = needs_live(op, ids);
	bool all_live = true;

	expectf(code < 0, "batch %zu op %zu: error code %d", batch, i, code);
	expectf(msg != NULL && msg[0] != '\0',
		"batch %zu op %zu: error %d without a message", batch, i, code);
	bool region = (op->op_case == GPUCMD__OP__OP_WRITE &&
		       op->write->region != NULL) ||
		      (op->op_case == GPUCMD__OP__OP_READ &&
		       op->read->into != NULL) ||
		      (op->op_case == GPUCMD__OP__OP_CREATE_WITH_DATA &&
		       op->create_with_data->region != NULL);

	if (m->overflow)
		return;
	for (size_t k = 0; k < n; k++)
		all_live = all_live && mlive(m, ids[k]);
	if (code == GPUCMD_ENOTFOUND && n > 0 && !region)
		expectf(!all_live,
			"batch %zu op %zu: ENOTFOUND (%s) with every handle live",
			batch, i, msg);
	switch (op->op_case) {
	case GPUCMD__OP__OP_WRITE:
	case GPUCMD__OP__OP_RELEASE:
	case GPUCMD__OP__OP_READ:
		/* The handle is looked up first (a read in a capture aside). */
		if (!all_live && !(capture && code == GPUCMD_EINVAL))
			expectf(code == GPUCMD_ENOTFOUND,
				"batch %zu op %zu: %d (%s) for a handle never "
				"allocated or released",
				batch, i, code, msg);
		if (op->op_case == GPUCMD__OP__OP_WRITE && all_live &&
		    !capture && !region)
			check_shared_write(m, op->write, code, msg, batch, i);
		break;
	case GPUCMD__OP__OP_EMPTY:
		id = op->empty->handle;
		__attribute__((fallthrough));
	case GPUCMD__OP__OP_CREATE_WITH_DATA:
		if (op->op_case == GPUCMD__OP__OP_CREATE_WITH_DATA)
			id = op->create_with_data->handle;
		if (region)
			break; /* the region range is checked first */
		if (id == 0)
			expectf(code == GPUCMD_EINVAL,
				"batch %zu op %zu: "
				"handle 0 gave %d (%s)",
				batch, i, code, msg);
		else if (mlive(m, id))
			expectf(code == GPUCMD_EEXIST,
				"batch %zu op %zu: "
				"live handle gave %d (%s)",
				batch, i, code, msg);
		else
			expectf(code != GPUCMD_EEXIST &&
					(code != GPUCMD_ENOTFOUND || region),
				"batch %zu op %zu: free handle %llu gave %d (%s)",
				batch, i, (unsigned long long)id, code, msg);
		break;
	case GPUCMD__OP__OP_SHARE: {
		struct mhandle *h = mfind(m, op->share->handle);

		/* Looked up first (in a capture: refused before that). */
		if (!all_live && !(capture && code == GPUCMD_EINVAL))
			expectf(code == GPUCMD_ENOTFOUND,
				"batch %zu op %zu: share of a handle never "
				"allocated or released gave %d (%s)",
				batch, i, code, msg);
		/* A name refused, or shared already: EINVAL both ways. */
		if (h != NULL && h->live && h->shared)
			expectf(code == GPUCMD_EINVAL,
				"batch %zu op %zu: share of shared handle %llu "
				"gave %d (%s)",
				batch, i, (unsigned long long)h->id, code, msg);
		break;
	}
	case GPUCMD__OP__OP_IMPORT:
		if (code == GPUCMD_EEXIST)
			expectf(mlive(m, op->import->handle),
				"batch %zu op %zu: import to free handle %llu "
				"gave EEXIST (%s)",
				batch, i,
				(unsigned long long)op->import->handle, msg);
		break;
	case GPUCMD__OP__OP__NOT_SET:
		expect(code == GPUCMD_EPROTO);
		break;
	case GPUCMD__OP__OP_EVICT:
		expect(code == GPUCMD_EINVAL);
		break;
	default:
		break;
	}
}

static bool is_fence_op(const Gpucmd__Op *op)
{
	return op->op_case == GPUCMD__OP__OP_READ ||
	       op->op_case == GPUCMD__OP__OP_SYNC;
}

/* FUZZ_TRACE=1 prints every batch and its outcome (to read a crash). */
static void trace(const Gpucmd__Request *req, const Gpucmd__Response *resp,
		  int conn)
{
	static int on = -1;

	if (on < 0)
		on = getenv("FUZZ_TRACE") != NULL;
	if (!on)
		return;
	fprintf(stderr,
		"batch id %llu conn %d stream %u:", (unsigned long long)req->id,
		conn, req->stream);
	for (size_t i = 0; i < req->n_ops; i++) {
		const Gpucmd__Op *op = req->ops[i];

		fprintf(stderr, " [%zu]%d", i, (int)op->op_case);
		if (op->op_case == GPUCMD__OP__OP_EMPTY)
			fprintf(stderr, "(h%llu,%llu)",
				(unsigned long long)op->empty->handle,
				(unsigned long long)op->empty->size);
		if (op->op_case == GPUCMD__OP__OP_READ)
			fprintf(stderr, "(h%llu,@%llu,%llu)",
				(unsigned long long)op->read->handle,
				(unsigned long long)op->read->offset,
				(unsigned long long)op->read->length);
		if (op->op_case == GPUCMD__OP__OP_WRITE)
			fprintf(stderr, "(h%llu,@%llu,%zu)",
				(unsigned long long)op->write->handle,
				(unsigned long long)op->write->offset,
				op->write->data.len);
		if (op->op_case == GPUCMD__OP__OP_KERNEL)
			fprintf(stderr, "(%s)", op->kernel->name);
		if (op->op_case == GPUCMD__OP__OP_RELEASE)
			fprintf(stderr, "(h%llu)",
				(unsigned long long)op->release->handle);
		if (op->op_case == GPUCMD__OP__OP_SHARE)
			fprintf(stderr, "(h%llu,'%s')",
				(unsigned long long)op->share->handle,
				op->share->name);
		if (op->op_case == GPUCMD__OP__OP_IMPORT)
			fprintf(stderr, "(h%llu,'%s')",
				(unsigned long long)op->import->handle,
				op->import->name);
	}
	if (resp->error != NULL)
		fprintf(stderr, " -> %s at %u: %s\n",
			gpucmd_errname(resp->error->code), resp->failed_index,
			resp->error->message);
	else
		fprintf(stderr, " -> ok\n");
}

/* Check one batch's response against the model and update it. */
static void verify(struct mconn *m, const Gpucmd__Request *req,
		   const Gpucmd__Response *resp, bool capture, size_t batch)
{
	size_t n = req->n_ops, ran, fence = SIZE_MAX;
	bool at_fence = false, later_fault = false;
	int code = resp->error != NULL ? resp->error->code : 0;
	const char *msg = resp->error != NULL ? resp->error->message : NULL;
	int si = stream_index(m, req->stream);
	bool data_model = !capture;

	expect(resp->id == req->id);
	if (si < 0 && !dispatch_needs_stream(req)) {
		si = NO_STREAM;
		m->allocated[si] = false;
		m->fault_pending[si] = false;
	} else if (si < 0) {
		if (m->nstreams == MAX_STREAMS) {
			/* A fifth stream: refused before any op runs. */
			expectf(code == GPUCMD_ELIMIT && resp->n_results == 0 &&
					resp->failed_index == 0,
				"batch %zu on a fifth stream: code %d, %zu results",
				batch, code, resp->n_results);
			expect(strstr(msg, "max_streams") != NULL);
			return;
		}
		si = (int)m->nstreams;
		m->streams[m->nstreams++] = req->stream;
		m->allocated[si] = false;
		m->fault_pending[si] = false;
	}
	if (code == 0) {
		expectf(resp->n_results == n,
			"batch %zu: %zu results for %zu ops", batch,
			resp->n_results, n);
		ran = n;
	} else if (code == GPUCMD_ESTREAM) {
		/* Every op ran; the fault is reported at the first fence. */
		expectf(resp->failed_index < n &&
				is_fence_op(req->ops[resp->failed_index]),
			"batch %zu: ESTREAM at op %u, not a read or sync",
			batch, resp->failed_index);
		for (size_t i = 0; i < resp->failed_index; i++)
			expect(!is_fence_op(req->ops[i]));
		expect(resp->n_results == resp->failed_index);
		ran = n;
	} else {
		expectf(resp->failed_index < n ||
				(n == 0 && resp->failed_index == 0),
			"batch %zu: failed_index %u of %zu ops", batch,
			resp->failed_index, n);
		expectf(resp->n_results == resp->failed_index,
			"batch %zu: %zu results, failed at %u (%d %s)", batch,
			resp->n_results, resp->failed_index, code, msg);
		ran = resp->failed_index;
	}
	for (size_t i = 0; i < ran; i++) {
		const Gpucmd__OpResult *res =
			i < resp->n_results ? resp->results[i] : NULL;

		if (res != NULL)
			check_result(req->ops[i], res, batch, i);
		if (fence == SIZE_MAX && is_fence_op(req->ops[i])) {
			fence = i;
			at_fence = m->fault_pending[si];
		} else if (fence != SIZE_MAX &&
			   req->ops[i]->op_case == GPUCMD__OP__OP_KERNEL &&
			   strcmp(req->ops[i]->kernel->name, "fault") == 0) {
			later_fault = true;
		}
		/* Reads past the reported fence have no data to check. */
		if (res == NULL && req->ops[i]->op_case == GPUCMD__OP__OP_READ)
			continue;
		apply(m, si, req->ops[i], res, data_model, batch, i);
	}
	if (code != 0 && code != GPUCMD_ESTREAM && n > 0)
		check_failure(m, req->ops[resp->failed_index], code, msg,
			      capture, batch, resp->failed_index);
	/*
	 * Faults: a fault is reported by the first batch on its stream that
	 * has a fence and no error of its own, once the faulting work is
	 * done (the same batch or a later one).  The fence answers for the
	 * work before it: a fault of a kernel after it in the same batch
	 * stays pending for the next one (executor_barrier).
	 */
	if (!capture) {
		bool eligible = fence != SIZE_MAX &&
				(code == 0 || code == GPUCMD_ESTREAM);

		expectf((code == GPUCMD_ESTREAM) == (eligible && at_fence),
			"batch %zu on stream %u: code %d, fence %d, fault "
			"pending %d at it",
			batch, req->stream, code, fence != SIZE_MAX, at_fence);
		if (code == GPUCMD_ESTREAM)
			m->fault_pending[si] = later_fault;
	}
}

/* ---- descriptors ---------------------------------------------------------- */

#define REGION_FILE_MAX (64u << 20)

static int make_fd(const struct fd_spec *f)
{
	uint64_t size = f->size > REGION_FILE_MAX ? REGION_FILE_MAX : f->size;
	int fd, seals = F_SEAL_SHRINK;

	if (f->kind == FD_PIPE) {
		int p[2];

		expect(pipe2(p, O_CLOEXEC) == 0);
		close(p[1]);
		return p[0];
	}
	fd = memfd_create("fuzzregion", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	expect(fd >= 0);
	if (f->kind == FD_LARGER)
		size += 4096;
	if (f->kind == FD_SMALLER)
		size /= 2;
	expect(ftruncate(fd, (off_t)size) == 0);
	if (size > 0) {
		uint8_t pat[256];

		for (size_t i = 0; i < sizeof(pat); i++)
			pat[i] = (uint8_t)(i * 13 + 5);
		expect(pwrite(fd, pat, size < sizeof(pat) ? size : sizeof(pat),
			      0) >= 0);
	}
	if (f->kind == FD_WRITE_SEALED)
		seals |= F_SEAL_WRITE;
	if (f->kind != FD_UNSEALED)
		expect(fcntl(fd, F_ADD_SEALS, seals) == 0);
	return fd;
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	expect(d != NULL);
	while ((e = readdir(d)) != NULL)
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1; /* the directory's own descriptor */
}

/* Mappings of our region memfds that are still in place. */
static int count_region_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	int n = 0;

	expect(f != NULL);
	while (fgets(line, sizeof(line), f) != NULL)
		n += strstr(line, "memfd:fuzzregion") != NULL;
	fclose(f);
	return n;
}

/* ---- one input ------------------------------------------------------------ */

struct planned {
	uint8_t *frame; /* header + body */
	size_t len;
	int conn;
	bool wait;
	struct fd_spec fds[MAX_FDS];
	uint32_t nfds;
};

/* In raw mode: refuse what would make the input slow, not what is bad. */
static bool raw_bounded(const Gpucmd__Request *req, uint64_t *reads)
{
	for (size_t i = 0; i < req->n_ops; i++) {
		const Gpucmd__Op *op = req->ops[i];

		if (op->op_case == GPUCMD__OP__OP_KERNEL &&
		    strcmp(op->kernel->name, "spin") == 0)
			for (size_t a = 0; a < op->kernel->n_args; a++)
				if (op->kernel->args[a]->value_case ==
					    GPUCMD__KERNEL_ARG__VALUE_U32 &&
				    op->kernel->args[a]->u32 > MAX_SPIN_USEC)
					return false;
		if (op->op_case == GPUCMD__OP__OP_RESERVE_CPU &&
		    op->reserve_cpu->size > MAX_READ_TOTAL)
			return false;
		if (op->op_case == GPUCMD__OP__OP_READ) {
			const Gpucmd__CopyLayout *l = op->read->layout;
			uint64_t n = l != NULL ? 1 : op->read->length;

			for (size_t d = 0; l != NULL && d < l->n_shape; d++)
				if (__builtin_mul_overflow(n, l->shape[d], &n))
					return false;
			if (l != NULL &&
			    __builtin_mul_overflow(n, l->elem_size, &n))
				return false;
			if (n > MAX_READ_TOTAL || *reads + n > MAX_READ_TOTAL)
				return false;
			*reads += n;
		}
	}
	return true;
}

static size_t plan_raw(struct reader *r, struct planned *out)
{
	size_t n = 0;
	uint64_t reads = 0;

	while (r->n > 0 && n < MAX_BATCHES) {
		uint8_t hdr = rd8(r);
		size_t len = rd16(r);
		Gpucmd__Request *req;
		Gpucmd__Frame f = GPUCMD__FRAME__INIT;

		if (len > r->n)
			len = r->n;
		req = gpucmd__request__unpack(NULL, len, r->p);
		r->p += len;
		r->n -= len;
		if (req == NULL)
			continue;
		if (raw_bounded(req, &reads)) {
			out[n].nfds = 0;
			for (size_t i = 0; i < req->n_ops; i++) {
				const Gpucmd__Op *op = req->ops[i];

				if (op->op_case ==
					    GPUCMD__OP__OP_REGION_ATTACH &&
				    out[n].nfds < MAX_FDS) {
					out[n].fds[out[n].nfds].kind =
						FD_SEALED;
					out[n].fds[out[n].nfds].size =
						op->region_attach->size;
					out[n].nfds++;
				}
			}
			req->id = n + 1;
			f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
			f.request = req;
			if (frame_encode(&f, &out[n].frame, &out[n].len) == 0) {
				Gpucmd__Frame *check =
					frame_decode(out[n].frame +
							     FRAME_HEADER_SIZE,
						     out[n].len -
							     FRAME_HEADER_SIZE);

				/*
				 * libprotobuf-c keeps an unknown field numbered
				 * 0 when its tag is a two-byte varint but refuses
				 * the one-byte tag it writes back: such a request
				 * no longer decodes, so it is left out here.
				 */
				if (check != NULL) {
					out[n].conn = hdr & 1;
					out[n].wait = hdr & 2;
					n++;
				} else {
					free(out[n].frame);
				}
				frame_free(check);
			}
		}
		gpucmd__request__free_unpacked(req, NULL);
	}
	return n;
}

static size_t plan_ops(struct reader *r, struct planned *out)
{
	static struct plan p;
	size_t n = 0;
	uint8_t hdr = 0;

	memset(p.planned_size, 0, sizeof(p.planned_size));
	p.read_total = 0;
	p.write_total = 0;
	while (r->n > 0 && n < MAX_BATCHES) {
		Gpucmd__Frame f = GPUCMD__FRAME__INIT;

		gpucmd__request__init(&p.req);
		p.req.id = n + 1;
		p.req.stream = stream_ids[(hdr >> 2) % 6];
		p.req.ops = p.ops;
		p.req.n_ops = 0;
		p.nfds = 0;
		while (interpret_op(&p, r))
			;
		memcpy(out[n].fds, p.fds, sizeof(p.fds));
		out[n].nfds = p.nfds;
		f.msg_case = GPUCMD__FRAME__MSG_REQUEST;
		f.request = &p.req;
		if (frame_encode(&f, &out[n].frame, &out[n].len) == 0) {
			out[n].conn = hdr & 1;
			out[n].wait = hdr & 2;
			n++;
		}
		arena_clear(&p.arena);
		hdr = rd8(r); /* the next batch's conn, wait and stream */
	}
	return n;
}

static Gpucmd__Frame *decode(const struct planned *pl)
{
	struct frame_header h;
	Gpucmd__Frame *f;

	frame_header_unpack(pl->frame, &h);
	expect(frame_header_check(&h, FRAME_DEFAULT_MAX_BODY, NULL, 0) == 0);
	f = frame_decode(pl->frame + FRAME_HEADER_SIZE, h.length);
	expect(f != NULL && f->msg_case == GPUCMD__FRAME__MSG_REQUEST);
	return f;
}

/*
 * Whether the input records graphs (then replays run later than the model
 * thinks), and a bound on its spin time: every spin may be replayed by
 * every graph launch.
 */
static bool survey(const struct planned *pl, size_t n, uint64_t *spin_us)
{
	uint64_t nspin = 0, launches = 0;
	bool capture = false;

	for (size_t b = 0; b < n; b++) {
		Gpucmd__Frame *f = decode(&pl[b]);

		for (size_t i = 0; i < f->request->n_ops; i++) {
			const Gpucmd__Op *op = f->request->ops[i];

			if (op->op_case == GPUCMD__OP__OP_CAPTURE_BEGIN)
				capture = true;
			if (op->op_case == GPUCMD__OP__OP_GRAPH_LAUNCH)
				launches++;
			if (op->op_case == GPUCMD__OP__OP_KERNEL &&
			    strcmp(op->kernel->name, "spin") == 0)
				nspin++;
		}
		frame_free(f);
	}
	*spin_us = nspin * (launches + 1) * MAX_SPIN_USEC;
	return capture;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct planned pl[MAX_BATCHES];
	static struct mconn model[2];
	struct reader r = { data, size };
	struct executor *ex;
	uint8_t flags;
	uint64_t spin_us;
	int fds_before;
	size_t n;
	bool capture;

	if (size < 2)
		return 0;
	flags = rd8(&r);
	ex_index = flags & 1;
	ex = executors[ex_index];
	n = (flags & 0x10) ? plan_raw(&r, pl) : plan_ops(&r, pl);
	capture = survey(pl, n, &spin_us);
	fds_before = count_fds();
	if (spin_us > MAX_SPIN_TOTAL_USEC) {
		for (size_t b = 0; b < n; b++)
			free(pl[b].frame);
		return 0; /* too slow to be worth it */
	}

	for (int c = 0; c < 2; c++) {
		struct fconn *fc = &conns[c];
		struct config_service limits = cfg.default_service;
		/* Flag 0x40: one service, so that one imports the other's. */
		bool same = c == 1 && (flags & 0x40);

		memset(fc, 0, sizeof(*fc));
		if (c == 0 && (flags & 2))
			limits.memory_limit = 8u << 20;
		fc->svc = same ? conns[0].svc :
				 service_get(svc_names[ex_index][c ? 2 : 1],
					     &limits);
		expect(fc->svc != NULL);
		if (!same)
			service_apply(fc->svc, &limits);
		fc->econn.conn = fc;
		fc->econn.service = fc->svc;
		fc->econn.id = ++next_conn_id;
		fc->econn.admin = flags & (4 << c);
		fc->econn.limits = cfg.limits;
	}
	for (size_t b = 0; b < n; b++) {
		struct fconn *fc = &conns[pl[b].conn];

		pthread_mutex_lock(&lock);
		fc->submitted++;
		fc->used = true;
		pthread_mutex_unlock(&lock);
		int *fds = calloc(MAX_FDS, sizeof(int));

		expect(fds != NULL);
		for (uint32_t k = 0; k < pl[b].nfds; k++)
			fds[k] = make_fd(&pl[b].fds[k]);
		expect(executor_submit(ex, &fc->econn, decode(&pl[b]), fds,
				       pl[b].nfds, NULL, 0) == 0);
		if (pl[b].wait)
			wait_for(fc, all_replied, "a reply");
	}
	/* Closing with batches in flight is part of the game (flag 0x20). */
	for (int c = 0; c < 2; c++) {
		if (!(flags & 0x20))
			wait_for(&conns[c], all_replied, "the replies");
		expect(executor_close(ex, &conns[c].econn) == 0);
	}
	/* Both first: with flag 0x40 they hold the same service's memory. */
	for (int c = 0; c < 2; c++)
		wait_for(&conns[c], is_closed, "the closed callback");
	for (int c = 0; c < 2; c++) {
		struct fconn *fc = &conns[c];

		/* Everything was answered before the device state went. */
		expectf(fc->replies == fc->submitted &&
				fc->completions == fc->submitted,
			"conn %d closed with %u batches, %u replies, %u "
			"completions",
			c, fc->submitted, fc->replies, fc->completions);
		expectf(fc->svc->bytes_in_use == 0 && fc->svc->allocations == 0,
			"service %s keeps %llu bytes in %llu allocations after "
			"its connection closed",
			fc->svc->name,
			(unsigned long long)fc->svc->bytes_in_use,
			(unsigned long long)fc->svc->allocations);
		/* A shared buffer goes with the last handle naming it. */
		expectf(fc->svc->shared == NULL && fc->svc->nshared == 0 &&
				fc->svc->shared_bytes == 0,
			"service %s shares %u buffers (%llu bytes) after its "
			"connections closed",
			fc->svc->name, fc->svc->nshared,
			(unsigned long long)fc->svc->shared_bytes);
	}

	/* Every descriptor passed was closed, every region unmapped. */
	expectf(count_fds() == fds_before, "%d descriptors open, %d before",
		count_fds(), fds_before);
	expectf(count_region_maps() == 0, "%d region mappings left",
		count_region_maps());

	/* Responses in submission order, per connection, against the model. */
	for (int c = 0; c < 2; c++) {
		struct mconn *m = &model[c];
		struct fconn *fc = &conns[c];
		size_t seen = 0;

		for (size_t i = 0; i < m->nh; i++)
			mdrop(&m->h[i]);
		memset(m, 0, sizeof(*m));
		for (size_t b = 0; b < n; b++) {
			Gpucmd__Frame *req, *resp = NULL;

			if (pl[b].conn != c)
				continue;
			req = decode(&pl[b]);
			for (uint32_t k = 0; k < fc->nresponses; k++)
				if (fc->responses[k]->response->id ==
				    req->request->id)
					resp = fc->responses[k];
			expectf(resp != NULL, "no response to batch %zu", b);
			trace(req->request, resp->response, c);
			verify(m, req->request, resp->response, capture, b);
			frame_free(req);
			seen++;
		}
		expect(seen == fc->nresponses);
		for (uint32_t k = 0; k < fc->nresponses; k++)
			frame_free(fc->responses[k]);
		for (size_t i = 0; i < m->nh; i++)
			mdrop(&m->h[i]);
	}
	for (size_t b = 0; b < n; b++)
		free(pl[b].frame);
	return 0;
}
