/*
 * bench_alloc.c - the daemon's pooled allocator against the backend's raw
 * allocation, in this process, without the socket in between.
 *
 * The memory manager (daemon/memory/memory_manager.h) is built the way a
 * stream builds it (daemon/streams.c): the SubSlices preset sized from the
 * backend's properties, over a storage whose alloc/free are the backend's
 * mem_alloc/mem_free.  The daemon's storage also zeroes fresh memory on the
 * stream; that is asynchronous device work and the same for both sides, so
 * it is left out here.  The raw side calls mem_alloc/mem_free directly:
 * what every reservation would cost without pools.
 *
 * Two measurements:
 *   speed   reserve+release pairs per second on a mix of sizes (mostly
 *           small activations, some medium, a few large), a window of live
 *           allocations sliding over a fixed pseudo-random sequence; the
 *           pooled side is timed after one warm-up pass, as in a service
 *           that has been running.  Target: >= 50x the raw pairs/s.
 *   memory  the bytes the pools reserve from the device at their peak,
 *           against the peak of bytes in use, on a training-step trace of
 *           a small transformer (weights kept, saved activations that grow
 *           through the forward pass and drain in the backward pass,
 *           transient scores and gradients, a batch shape that changes
 *           every step).  Target: reserved/peak <= 1.3.
 *
 * The backend is the one --backend names (host by default); cuda makes the
 * raw side cuMemAlloc/cuMemFree on the real device.
 *
 * One row goes through the daemon: 64 rounds of {empty 16 MiB; release} on
 * one stream behind a kernel that outlasts them, as an inference loop that
 * runs ahead of the device does.  The stream reuses what it released
 * (stream-ordered reuse), so the pools should hold one buffer's memory,
 * not 64: the row is reserved bytes against 16 MiB (watched, no target).
 */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"
#include "memory/memory_manager.h"

/* The host backend's default "device" memory, as the daemon's (4 GiB). */
#define ALLOC_HOST_MEMORY (UINT64_C(4) << 30)
/* Live allocations at once in the speed test. */
#define ALLOC_WINDOW 32
/* Length of the size sequence (it repeats). */
#define ALLOC_SEQ 4096

static int storage_alloc(void *ctx, uint64_t size, uint64_t *ptr)
{
	struct driver *d = ctx;

	return d->ops->mem_alloc(d, size, ptr);
}

static void storage_free(void *ctx, uint64_t ptr, uint64_t size)
{
	(void)size;
	struct driver *d = ctx;

	d->ops->mem_free(d, ptr);
}

/* The backend the bench was asked for; host when cuda cannot be had. */
static struct driver *open_driver(void)
{
	struct driver_options opt = { .device = 0,
				      .host_memory = ALLOC_HOST_MEMORY };
	struct driver *d = NULL;
	char why[256] = "";
	int rc;

	if (strcmp(bench.backend, "host") != 0) {
		rc = driver_cuda_create(&opt, &d, why, sizeof(why));
		if (rc == 0) {
			rc = d->ops->open(d, 0, &d->props);
			if (rc == 0)
				return d;
			snprintf(why, sizeof(why), "%s", d->error);
			d->ops->close(d);
			d = NULL;
		}
		bench_note("allocator: no CUDA device (%s); measured on the "
			   "host backend",
			   why);
	}
	rc = driver_host_create(&opt, &d);
	if (rc == 0) {
		rc = d->ops->open(d, 0, &d->props);
		if (rc == 0)
			return d;
		d->ops->close(d);
	}
	bench_error("allocator: cannot open the host backend: %s",
		    gpucmd_strerror(rc));
	return NULL;
}

static int manager_create(struct driver *d, struct memory_manager **out)
{
	struct memory_configuration cfg = { .preset = MEMORY_PRESET_SUBSLICES };
	struct memory_device_properties props = {
		.max_page_size = d->props.max_page_size,
		.alignment = d->props.alignment,
	};
	struct memory_storage storage = {
		.alloc = storage_alloc,
		.free = storage_free,
		.ctx = d,
	};
	char msg[256];
	int rc = memory_configuration_resolve(&cfg, &props, msg, sizeof(msg));

	if (rc != 0) {
		bench_error("allocator: SubSlices layout: %s", msg);
		return rc;
	}
	rc = memory_manager_create(&cfg, &props, &storage, out);
	if (rc != 0)
		bench_error("allocator: memory_manager_create: %s",
			    gpucmd_strerror(rc));
	return rc;
}

/* ---- speed ----------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
	/* xorshift64*: fixed seed, same sequence every run. */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 2685821657736338717ull;
}

/* Log-uniform in [lo, hi), rounded to 16 bytes like real tensors. */
static uint64_t log_uniform(uint64_t *s, uint64_t lo, uint64_t hi)
{
	double u = (double)(rng_next(s) >> 11) / 9007199254740992.0;
	uint64_t v = (uint64_t)exp(log((double)lo) +
				   u * (log((double)hi) - log((double)lo)));

	return (v + 15) & ~(uint64_t)15;
}

enum size_mix { MIX_ALL, MIX_SMALL, MIX_LARGE };

/*
 * The mix: 70% small (256 B to 64 KiB: norms, biases, small activations),
 * 25% medium (64 KiB to 4 MiB), 5% large (4 to 64 MiB: weights, big
 * activations).  MIX_SMALL and MIX_LARGE keep only one end.
 */
static void make_sizes(uint64_t *sizes, enum size_mix mix)
{
	uint64_t s = 0x9e3779b97f4a7c15ull;

	for (size_t i = 0; i < ALLOC_SEQ; i++) {
		unsigned pick = (unsigned)(rng_next(&s) % 100);

		if (mix == MIX_SMALL || (mix == MIX_ALL && pick < 70))
			sizes[i] = log_uniform(&s, 256, 64 * KIB);
		else if (mix == MIX_ALL && pick < 95)
			sizes[i] = log_uniform(&s, 64 * KIB, 4 * MIB);
		else
			sizes[i] = log_uniform(&s, 4 * MIB, 64 * MIB);
	}
}

/* Pairs per second of pooled reserve+release over steps steps. */
static double pooled_rate(struct memory_manager *mm, const uint64_t *sizes,
			  size_t steps)
{
	struct memory_slice *live[ALLOC_WINDOW] = { 0 };
	uint64_t t0 = 0;

	/* One untimed pass first: the pools hold their pages. */
	for (size_t pass = 0; pass < 2; pass++) {
		size_t n = pass == 0 ? ALLOC_SEQ : steps;

		if (pass == 1)
			t0 = bench_now_ns();
		for (size_t i = 0; i < n; i++) {
			size_t w = i % ALLOC_WINDOW;
			struct memory_alloc a;

			if (live[w] != NULL)
				memory_manager_release(mm, live[w]);
			live[w] = NULL;
			if (memory_manager_reserve(mm, sizes[i % ALLOC_SEQ],
						   &a) != 0) {
				bench_error("allocator: pooled reserve of "
					    "%llu bytes failed",
					    (unsigned long long)
						    sizes[i % ALLOC_SEQ]);
				return NAN;
			}
			live[w] = a.slice;
		}
	}
	t0 = bench_now_ns() - t0;
	for (size_t w = 0; w < ALLOC_WINDOW; w++)
		if (live[w] != NULL)
			memory_manager_release(mm, live[w]);
	return (double)steps * 1e9 / (double)t0;
}

static double raw_rate(struct driver *d, const uint64_t *sizes, size_t steps)
{
	uint64_t live[ALLOC_WINDOW] = { 0 };
	uint64_t t0 = 0;

	/*
	 * One untimed pass first, so that the C library has settled (glibc
	 * raises its mmap threshold as large blocks come and go).
	 */
	for (size_t pass = 0; pass < 2; pass++) {
		size_t n = pass == 0 ? ALLOC_SEQ : steps;

		if (pass == 1)
			t0 = bench_now_ns();
		for (size_t i = 0; i < n; i++) {
			size_t w = i % ALLOC_WINDOW;

			if (live[w] != 0)
				d->ops->mem_free(d, live[w]);
			live[w] = 0;
			if (d->ops->mem_alloc(d, sizes[i % ALLOC_SEQ],
					      &live[w]) != 0) {
				bench_error("allocator: raw mem_alloc of "
					    "%llu bytes failed: %s",
					    (unsigned long long)
						    sizes[i % ALLOC_SEQ],
					    d->error);
				return NAN;
			}
		}
	}
	t0 = bench_now_ns() - t0;
	for (size_t w = 0; w < ALLOC_WINDOW; w++)
		if (live[w] != 0)
			d->ops->mem_free(d, live[w]);
	return (double)steps * 1e9 / (double)t0;
}

static void speed(struct driver *d, enum size_mix mix, const char *name)
{
	/* Whole passes over the sequence: both sides see the same sizes. */
	const size_t pooled_steps = (bench.quick ? 48 : 512) * ALLOC_SEQ;
	size_t raw_steps = (bench.quick ? 4 : 32) * ALLOC_SEQ;
	uint64_t *sizes = calloc(ALLOC_SEQ, sizeof(*sizes));
	struct memory_manager *mm = NULL;
	double pooled, raw;

	if (sizes == NULL || manager_create(d, &mm) != 0) {
		free(sizes);
		return;
	}
	/* The CUDA allocator is slow enough that one pass tells. */
	if (strcmp(d->props.backend, "host") != 0)
		raw_steps = ALLOC_SEQ;
	make_sizes(sizes, mix);
	pooled = pooled_rate(mm, sizes, pooled_steps);
	memory_manager_destroy(mm);
	raw = raw_rate(d, sizes, raw_steps);
	free(sizes);
	if (isnan(pooled) || isnan(raw))
		return;
	bench_add(name, pooled, "pair/s", raw, pooled / raw,
		  mix == MIX_ALL ? TARGET_RATIO_GE : TARGET_NONE, 50);
}

/* ---- memory on a trace ------------------------------------------------------ */

/* A transformer small enough for the host backend's 4 GiB (fp16). */
#define T_LAYERS 8
#define T_DMODEL 1024
#define T_HEADS 16
#define T_FFN (4 * T_DMODEL)
#define T_VOCAB 32000
#define T_MAXSEQ 512
#define T_DTYPE 2

/* The weights of one layer, in order. */
enum {
	W_LN1_G,
	W_LN1_B,
	W_QKV,
	W_QKV_B,
	W_O,
	W_O_B,
	W_LN2_G,
	W_LN2_B,
	W_FC1,
	W_FC1_B,
	W_FC2,
	W_FC2_B,
	W_PER_LAYER,
};

/* What a layer saves for its backward pass. */
enum {
	A_LN1,
	A_LN1_STATS,
	A_QKV,
	A_PROBS,
	A_ATTN,
	A_X1,
	A_LN2,
	A_LN2_STATS,
	A_H,
	A_GELU,
	A_X2,
	A_PER_LAYER,
};

struct trace {
	struct memory_manager *mm;
	uint64_t in_use; /* requested bytes of live allocations */
	uint64_t peak_in_use;
	uint64_t peak_reserved;
	uint64_t reservations;
	int rc;
};

static struct memory_slice *t_alloc(struct trace *t, uint64_t size,
				    uint64_t *held)
{
	struct memory_alloc a;
	struct memory_usage u;
	int rc;

	if (t->rc != 0)
		return NULL;
	rc = memory_manager_reserve(t->mm, size, &a);
	if (rc != 0) {
		/* As command_reserve does: clean up once and retry. */
		memory_manager_cleanup(t->mm, true);
		rc = memory_manager_reserve(t->mm, size, &a);
	}
	if (rc != 0) {
		bench_error("allocator: trace reserve of %llu bytes failed: "
			    "%s",
			    (unsigned long long)size, gpucmd_strerror(rc));
		t->rc = rc;
		return NULL;
	}
	t->reservations++;
	t->in_use += size;
	*held = size;
	if (t->in_use > t->peak_in_use)
		t->peak_in_use = t->in_use;
	memory_manager_usage(t->mm, &u);
	if (u.bytes_reserved > t->peak_reserved)
		t->peak_reserved = u.bytes_reserved;
	return a.slice;
}

static void t_free(struct trace *t, struct memory_slice **s, uint64_t *held)
{
	if (*s == NULL)
		return;
	memory_manager_release(t->mm, *s);
	t->in_use -= *held;
	*s = NULL;
	*held = 0;
}

struct tensor {
	struct memory_slice *s;
	uint64_t size;
};

static void t_new(struct trace *t, struct tensor *x, uint64_t size)
{
	x->s = t_alloc(t, size, &x->size);
}

static void t_del(struct trace *t, struct tensor *x)
{
	t_free(t, &x->s, &x->size);
}

static uint64_t weight_size(int w)
{
	switch (w) {
	case W_QKV:
		return 3ull * T_DMODEL * T_DMODEL * T_DTYPE;
	case W_QKV_B:
		return 3ull * T_DMODEL * T_DTYPE;
	case W_O:
		return (uint64_t)T_DMODEL * T_DMODEL * T_DTYPE;
	case W_FC1:
	case W_FC2:
		return (uint64_t)T_DMODEL * T_FFN * T_DTYPE;
	case W_FC1_B:
		return (uint64_t)T_FFN * T_DTYPE;
	default: /* norms and the remaining biases */
		return (uint64_t)T_DMODEL * T_DTYPE;
	}
}

/* One training step with batch b and sequence length seq. */
static void train_step(struct trace *t, uint64_t batch, uint64_t seq)
{
	const uint64_t n = batch * seq;		      /* tokens */
	const uint64_t act = n * T_DMODEL * T_DTYPE;  /* one activation */
	const uint64_t stats = n * 2 * sizeof(float); /* mean, rstd */
	const uint64_t scores = batch * T_HEADS * seq * seq * T_DTYPE;
	struct tensor saved[T_LAYERS][A_PER_LAYER];
	struct tensor grads[T_LAYERS][W_PER_LAYER];
	struct tensor x, tmp, tmp2, logits, dlogits, dx, dtmp, demb, ids;

	memset(saved, 0, sizeof(saved));
	memset(grads, 0, sizeof(grads));
	t_new(t, &ids, n * sizeof(int32_t));
	t_new(t, &x, act); /* embeddings */
	for (int l = 0; l < T_LAYERS; l++) {
		struct tensor *s = saved[l];

		t_new(t, &s[A_LN1], act);
		t_new(t, &s[A_LN1_STATS], stats);
		t_new(t, &s[A_QKV], 3 * act);
		t_new(t, &tmp, scores); /* raw scores */
		t_new(t, &s[A_PROBS], scores);
		t_del(t, &tmp);
		t_new(t, &s[A_ATTN], act);
		t_new(t, &tmp, act);	 /* output projection */
		t_new(t, &s[A_X1], act); /* residual */
		t_del(t, &tmp);
		t_new(t, &s[A_LN2], act);
		t_new(t, &s[A_LN2_STATS], stats);
		t_new(t, &s[A_H], 4 * act);
		t_new(t, &s[A_GELU], 4 * act);
		t_new(t, &tmp, act); /* fc2 */
		t_new(t, &s[A_X2], act);
		t_del(t, &tmp);
	}
	t_new(t, &tmp, act); /* final norm */
	t_new(t, &logits, n * T_VOCAB * T_DTYPE);
	t_new(t, &tmp2, n * sizeof(float)); /* per-token loss */
	t_new(t, &dlogits, n * T_VOCAB * T_DTYPE);
	t_del(t, &logits);
	t_del(t, &tmp2);
	t_new(t, &dx, act);
	t_del(t, &dlogits);
	t_del(t, &tmp);
	for (int l = T_LAYERS - 1; l >= 0; l--) {
		struct tensor *s = saved[l];

		for (int w = 0; w < W_PER_LAYER; w++)
			t_new(t, &grads[l][w], weight_size(w));
		t_new(t, &dtmp, 4 * act); /* d(gelu) */
		t_del(t, &s[A_X2]);
		t_del(t, &s[A_GELU]);
		t_new(t, &tmp, 4 * act); /* d(h) */
		t_del(t, &dtmp);
		t_del(t, &s[A_H]);
		t_new(t, &tmp2, act); /* d(ln2) */
		t_del(t, &tmp);
		t_del(t, &s[A_LN2]);
		t_del(t, &s[A_LN2_STATS]);
		t_del(t, &tmp2);
		t_new(t, &tmp, act); /* d(attn) */
		t_del(t, &s[A_X1]);
		t_del(t, &s[A_ATTN]);
		t_new(t, &dtmp, scores); /* d(probs) */
		t_del(t, &s[A_PROBS]);
		t_new(t, &tmp2, 3 * act); /* d(qkv) */
		t_del(t, &dtmp);
		t_del(t, &tmp);
		t_del(t, &s[A_QKV]);
		t_new(t, &tmp, act); /* d(ln1) */
		t_del(t, &tmp2);
		t_del(t, &s[A_LN1]);
		t_del(t, &s[A_LN1_STATS]);
		t_del(t, &tmp);
	}
	t_new(t, &demb, (uint64_t)T_VOCAB * T_DMODEL * T_DTYPE);
	t_del(t, &dx);
	t_del(t, &x);
	t_del(t, &ids);
	/* The optimizer step, then the gradients go (zero_grad to None). */
	t_del(t, &demb);
	for (int l = 0; l < T_LAYERS; l++)
		for (int w = 0; w < W_PER_LAYER; w++)
			t_del(t, &grads[l][w]);
}

static void trace_memory(struct driver *d)
{
	static const uint64_t seqs[] = { 128, 256, 384, 512 };
	const int steps = bench.quick ? 6 : 24;
	struct tensor weights[T_LAYERS][W_PER_LAYER], emb, pos;
	struct trace t = { 0 };
	uint64_t rng = 12345;

	if (manager_create(d, &t.mm) != 0)
		return;
	memset(weights, 0, sizeof(weights));
	t_new(&t, &emb, (uint64_t)T_VOCAB * T_DMODEL * T_DTYPE);
	t_new(&t, &pos, (uint64_t)T_MAXSEQ * T_DMODEL * T_DTYPE);
	for (int l = 0; l < T_LAYERS; l++)
		for (int w = 0; w < W_PER_LAYER; w++)
			t_new(&t, &weights[l][w], weight_size(w));
	for (int i = 0; i < steps && t.rc == 0; i++) {
		uint64_t batch = 1 + rng_next(&rng) % 4;
		uint64_t seq = seqs[rng_next(&rng) % 4];

		train_step(&t, batch, seq);
	}
	for (int l = 0; l < T_LAYERS; l++)
		for (int w = 0; w < W_PER_LAYER; w++)
			t_del(&t, &weights[l][w]);
	t_del(&t, &pos);
	t_del(&t, &emb);
	memory_manager_destroy(t.mm);
	if (t.rc != 0)
		return;
	bench_add("alloc trace: peak reserved (transformer)",
		  (double)t.peak_reserved / (double)MIB, "MiB",
		  (double)t.peak_in_use / (double)MIB,
		  (double)t.peak_reserved / (double)t.peak_in_use,
		  TARGET_RATIO_LE, 1.3);
}

/* Reserved bytes of stream 0 after 64 x {empty; release} behind a kernel. */
static void reuse_behind_kernel(void)
{
	enum { ROUNDS = 64 };
	const uint64_t size = UINT64_C(16) << 20;
	const uint32_t one[3] = { 1, 1, 1 };
	const struct gpucmd_arg spin = { .kind = GPUCMD_ARG_U32,
					 .v.u32 = 500000 };
	struct gpucmd_conn *c = bench_connect("bench-alloc");
	struct gpucmd_memory_usage u;
	struct gpucmd_response *r = NULL;
	struct gpucmd_batch *b;
	int ok = c != NULL;

	if (ok && (gpucmd_batch_new(c, 0, &b) != 0 ||
		   gpucmd_batch_kernel(b, "spin", one, one, &spin, 1) != 0 ||
		   bench_run_ok(b, "alloc behind a kernel: spin") != 0))
		ok = 0;
	for (int i = 0; ok && i < ROUNDS; i++)
		ok = gpucmd_batch_new(c, 0, &b) == 0 &&
		     gpucmd_batch_empty(b, 1, size) == 0 &&
		     gpucmd_batch_release(b, 1) == 0 &&
		     bench_run_ok(b, "alloc behind a kernel: round") == 0;
	if (ok &&
	    (gpucmd_batch_new(c, 0, &b) != 0 ||
	     gpucmd_batch_memory_usage(b) != 0 || gpucmd_run(b, &r) != 0 ||
	     gpucmd_response_usage(r, 0, &u) != 0))
		ok = 0;
	if (ok)
		bench_add("alloc behind a kernel: reserved (64 x 16 MiB)",
			  (double)u.bytes_reserved / (1 << 20), "MiB", 16,
			  (double)u.bytes_reserved / (double)size, TARGET_NONE,
			  0);
	else
		bench_error("alloc behind a kernel: could not measure");
	gpucmd_response_free(r);
	if (c != NULL)
		gpucmd_close(c);
}

void bench_allocator(void)
{
	struct driver *d = open_driver();

	if (d == NULL)
		return;
	bench_progress("allocator: mixed sizes");
	speed(d, MIX_ALL, "alloc reserve+release (mix)");
	bench_progress("allocator: small sizes");
	speed(d, MIX_SMALL, "alloc reserve+release (<= 64 KiB)");
	bench_progress("allocator: large sizes");
	speed(d, MIX_LARGE, "alloc reserve+release (4-64 MiB)");
	bench_progress("allocator: transformer trace");
	trace_memory(d);
	d->ops->close(d);
	bench_progress("allocator: releases behind a kernel");
	reuse_behind_kernel();
}
