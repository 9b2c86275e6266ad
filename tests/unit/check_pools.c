/*
 * check_pools.c - the pool kinds on their own (memory/pool_*.c): carving,
 * merging, reuse rules, caps, cleanup rules and accounting, against a fake
 * storage that records every device allocation.
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memory/pool.h"
#include "memory/pool_direct.h"
#include "memory/pool_exclusive.h"
#include "memory/pool_persistent.h"
#include "memory/pool_sliced.h"
#include "memory_fake_storage.h"
#include "unit.h"

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define ALIGN 512

static struct fake_storage fs;
static struct memory_storage storage;

static void setup(void)
{
	storage = fake_storage_init(&fs, ALIGN, false);
}

static void teardown(void)
{
	fake_storage_fini(&fs);
}

static struct pool *sliced(uint64_t page, uint64_t max_slice, uint64_t cap)
{
	struct memory_pool_options opt = {
		.kind = MEMORY_POOL_SLICED,
		.page_size = page,
		.max_slice = max_slice,
		.max_pool_size = cap,
	};
	struct pool *p = NULL;

	ck_assert_int_eq(pool_sliced_create(&opt, &storage, ALIGN, &p), 0);
	return p;
}

static struct pool *exclusive(uint64_t max_alloc, uint64_t period)
{
	struct memory_pool_options opt = {
		.kind = MEMORY_POOL_EXCLUSIVE,
		.max_alloc = max_alloc,
		.dealloc_period = period,
	};
	struct pool *p = NULL;

	ck_assert_int_eq(pool_exclusive_create(&opt, &storage, ALIGN, &p), 0);
	return p;
}

static struct pool *direct(uint64_t reclaim_at)
{
	struct memory_pool_options opt = {
		.kind = MEMORY_POOL_DIRECT,
		.reclaim_at = reclaim_at,
	};
	struct pool *p = NULL;

	ck_assert_int_eq(pool_direct_create(&opt, &storage, ALIGN, &p), 0);
	return p;
}

static struct memory_slice *take(struct pool *p, uint64_t size)
{
	struct memory_slice *s = NULL;

	expect(pool_reserve(p, size, &s) == 0);
	expect(s != NULL);
	expect(s->ptr % ALIGN == 0);
	expect(s->size == size);
	return s;
}

static struct memory_pool_report report(const struct pool *p)
{
	struct memory_pool_report r;

	pool_report(p, &r);
	return r;
}

/* Destroy p and check that it gave every device allocation back. */
static void finish(struct pool *p)
{
	pool_destroy(p);
	ck_assert_uint_eq(fs.nlive, 0);
	ck_assert_uint_eq(fs.bytes, 0);
}

START_TEST(sliced_split)
{
	struct pool *p = sliced(64 * KIB, 0, 0);
	struct memory_slice *a, *b, *c;
	struct memory_pool_report r;
	uint64_t base;

	a = take(p, 1000);
	base = fs.live[0].ptr;
	b = take(p, 100);
	c = take(p, 0);
	ck_assert_uint_eq(a->ptr, base);
	ck_assert_uint_eq(a->effective, 1024);
	ck_assert_uint_eq(b->ptr, base + 1024);
	ck_assert_uint_eq(b->effective, 512);
	/* A zero-byte slice still gets an address of its own. */
	ck_assert_uint_eq(c->ptr, base + 1536);
	ck_assert_uint_eq(c->effective, 512);
	r = report(p);
	ck_assert_int_eq(r.kind, MEMORY_POOL_SLICED);
	ck_assert_uint_eq(r.page_size, 64 * KIB);
	ck_assert_uint_eq(r.max_slice, 64 * KIB);
	ck_assert_uint_eq(r.pages, 1);
	ck_assert_uint_eq(r.usage.allocations, 3);
	ck_assert_uint_eq(r.usage.bytes_in_use, 1100);
	ck_assert_uint_eq(r.usage.bytes_padding, 24 + 412 + 512);
	ck_assert_uint_eq(r.usage.bytes_reserved, 64 * KIB);
	ck_assert_uint_eq(r.largest_alloc, 1000);
	ck_assert_uint_eq(r.largest_free, 64 * KIB - 2048);
	ck_assert_uint_eq(fs.nlive, 1);
	finish(p);
}
END_TEST

START_TEST(sliced_coalesce)
{
	struct pool *p = sliced(64 * KIB, 0, 0);
	struct memory_slice *a, *b, *c, *d, *e;
	uint64_t base;

	a = take(p, 4096);
	base = a->ptr;
	b = take(p, 4096);
	c = take(p, 4096);
	d = take(p, 4096);
	ck_assert_uint_eq(d->ptr, base + 12288);
	pool_release(b);
	ck_assert_uint_eq(pool_largest_free(p), 64 * KIB - 16 * KIB);
	/* a and b merge into one 8 KiB block at the start of the page. */
	pool_release(a);
	e = take(p, 8192);
	ck_assert_uint_eq(e->ptr, base);
	/* c merges with nothing; then d joins c and the free tail. */
	pool_release(c);
	ck_assert_uint_eq(pool_largest_free(p), 48 * KIB);
	pool_release(d);
	ck_assert_uint_eq(pool_largest_free(p), 56 * KIB);
	pool_release(e);
	ck_assert_uint_eq(pool_largest_free(p), 64 * KIB);
	/* A whole-page request fits again in the same page. */
	a = take(p, 64 * KIB);
	ck_assert_uint_eq(a->ptr, base);
	ck_assert_uint_eq(report(p).pages, 1);
	ck_assert_uint_eq(report(p).usage.bytes_padding, 0);
	finish(p);
}
END_TEST

START_TEST(sliced_first_fit)
{
	struct pool *p = sliced(64 * KIB, 0, 0);
	struct memory_slice *s[8], *x, *y;
	uint64_t base;
	int i;

	for (i = 0; i < 8; i++)
		s[i] = take(p, 4096);
	base = s[0]->ptr;
	pool_release(s[5]);
	pool_release(s[1]);
	/* The lowest free block wins, not the most recently freed. */
	x = take(p, 4096);
	ck_assert_uint_eq(x->ptr, base + 4096);
	x = take(p, 4096);
	ck_assert_uint_eq(x->ptr, base + 5 * 4096);
	x = take(p, 4096);
	ck_assert_uint_eq(x->ptr, base + 8 * 4096);
	/* Two neighbours freed form 8 KiB, split by the next requests. */
	pool_release(s[2]);
	pool_release(s[3]);
	x = take(p, 1000);
	ck_assert_uint_eq(x->ptr, base + 2 * 4096);
	y = take(p, 7168);
	ck_assert_uint_eq(y->ptr, base + 2 * 4096 + 1024);
	ck_assert_uint_eq(pool_largest_free(p), 64 * KIB - 9 * 4096);
	finish(p);
}
END_TEST

START_TEST(sliced_accept_rule)
{
	struct pool *u = sliced(1 * MIB, 256 * KIB, 0);
	struct pool *c = sliced(1 * MIB, 256 * KIB, 2 * MIB);
	struct memory_slice *s;

	ck_assert(pool_accept(u, 0));
	ck_assert(pool_accept(u, 256 * KIB));
	ck_assert(!pool_accept(u, 256 * KIB + 1));
	ck_assert(!pool_accept(u, 300 * KIB));
	/* Near-page: accepted while (page - size) * 5 < page. */
	ck_assert(pool_accept(u, 838861));
	ck_assert(!pool_accept(u, 838860));
	ck_assert(pool_accept(u, 900 * KIB));
	ck_assert(pool_accept(u, 1 * MIB));
	ck_assert(!pool_accept(u, 1 * MIB + 1));
	ck_assert_uint_eq(pool_max_accept(u), 1 * MIB);
	/* A capped pool keeps to max_slice. */
	ck_assert(pool_accept(c, 256 * KIB));
	ck_assert(!pool_accept(c, 900 * KIB));
	ck_assert_uint_eq(pool_max_accept(c), 256 * KIB);
	/* A near-page slice takes most of a page; the next needs another. */
	s = take(u, 900 * KIB);
	ck_assert_uint_eq(pool_largest_free(u), 1 * MIB - 900 * KIB);
	take(u, 200 * KIB);
	ck_assert_uint_eq(report(u).pages, 2);
	ck_assert_uint_eq(report(u).largest_alloc, 900 * KIB);
	pool_release(s);
	finish(u);
	finish(c);
}
END_TEST

START_TEST(sliced_capacity)
{
	struct pool *p = sliced(64 * KIB, 0, 128 * KIB + 100);
	struct memory_slice *a, *b, *s = NULL;
	struct memory_pool_report r;

	a = take(p, 64 * KIB);
	b = take(p, 64 * KIB);
	ck_assert_int_eq(pool_reserve(p, 512, &s), GPUCMD_ECAPACITY);
	ck_assert_ptr_null(s);
	r = report(p);
	ck_assert_uint_eq(r.pages, 2);
	ck_assert_uint_eq(r.usage.allocations, 2);
	ck_assert_uint_eq(r.usage.bytes_reserved, 128 * KIB);
	/* Room inside the cap is still used. */
	pool_release(a);
	a = take(p, 512);
	s = take(p, 63 * KIB + 512);
	ck_assert_uint_eq(s->ptr, a->ptr + 512);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 128 * KIB);
	pool_release(b);
	finish(p);
}
END_TEST

START_TEST(sliced_cleanup)
{
	struct pool *p = sliced(64 * KIB, 0, 0);
	struct memory_slice *a, *b, *c;
	struct memory_pool_report r;

	a = take(p, 48 * KIB);
	b = take(p, 48 * KIB);
	c = take(p, 8 * KIB);
	ck_assert_uint_eq(c->ptr, a->ptr + 48 * KIB);
	ck_assert_uint_eq(report(p).pages, 2);
	pool_release(a);
	pool_release(c);
	/* Sliced pages never go periodically. */
	pool_cleanup(p, false, 1000000);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 128 * KIB);
	pool_cleanup(p, true, 0);
	r = report(p);
	ck_assert_uint_eq(r.usage.bytes_reserved, 64 * KIB);
	ck_assert_uint_eq(r.pages, 1);
	ck_assert_uint_eq(r.pages_peak, 2);
	ck_assert_uint_eq(fs.nlive, 1);
	ck_assert_uint_eq(fs.live[0].ptr, b->ptr);
	/* The surviving page still serves and releases. */
	a = take(p, 16 * KIB);
	ck_assert_uint_eq(a->ptr, b->ptr + 48 * KIB);
	pool_release(a);
	pool_release(b);
	pool_cleanup(p, true, 0);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 0);
	ck_assert_uint_eq(report(p).pages, 0);
	ck_assert_uint_eq(pool_largest_free(p), 0);
	ck_assert_uint_eq(fs.nlive, 0);
	finish(p);
}
END_TEST

START_TEST(sliced_storage_failure)
{
	struct pool *p = sliced(64 * KIB, 0, 0);
	struct memory_slice *s = NULL, *a;

	fs.fail = true;
	ck_assert_int_eq(pool_reserve(p, 1000, &s), GPUCMD_ENOMEM);
	ck_assert_ptr_null(s);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 0);
	ck_assert_uint_eq(report(p).usage.allocations, 0);
	fs.fail = false;
	a = take(p, 1000);
	/* Space in a held page needs no storage. */
	fs.fail = true;
	s = take(p, 1000);
	ck_assert_uint_eq(s->ptr, a->ptr + 1024);
	fs.fail = false;
	/* A misaligned page is refused and returned at once. */
	fs.misalign = true;
	s = NULL;
	ck_assert_int_eq(pool_reserve(p, 64 * KIB, &s), GPUCMD_EDRIVER);
	ck_assert_ptr_null(s);
	fs.misalign = false;
	ck_assert_uint_eq(fs.nlive, 1);
	ck_assert_uint_eq(report(p).pages, 1);
	finish(p);
}
END_TEST

/* Fisher-Yates with a fixed generator, so a failure reproduces. */
static void shuffle(struct memory_slice **s, size_t n, uint64_t *seed)
{
	size_t i, j;
	struct memory_slice *t;

	for (i = n; i > 1; i--) {
		*seed = *seed * 6364136223846793005ULL + 1442695040888963407ULL;
		j = (size_t)((*seed >> 33) % i);
		t = s[i - 1];
		s[i - 1] = s[j];
		s[j] = t;
	}
}

START_TEST(sliced_many_slices)
{
	enum { N = 65536 };
	struct pool *p = sliced(32 * MIB, 0, 0);
	struct memory_slice **s = calloc(N, sizeof(*s));
	uint64_t seed = 7, base;
	size_t i;

	ck_assert_ptr_nonnull(s);
	/* One page cut into 65536 slices, released in random order. */
	for (i = 0; i < N; i++)
		s[i] = take(p, i % 3 == 0 ? 0 : 1 + i % 512);
	base = s[0]->ptr;
	ck_assert_uint_eq(s[N - 1]->ptr, base + 32 * MIB - 512);
	ck_assert_uint_eq(pool_largest_free(p), 0);
	shuffle(s, N, &seed);
	for (i = 0; i < N / 2; i++)
		pool_release(s[i]);
	for (i = 0; i < N / 2; i++)
		s[i] = take(p, 512);
	ck_assert_uint_eq(report(p).pages, 1);
	shuffle(s, N, &seed);
	for (i = 0; i < N; i++)
		pool_release(s[i]);
	ck_assert_uint_eq(pool_largest_free(p), 32 * MIB);
	ck_assert_uint_eq(report(p).usage.allocations, 0);
	ck_assert_uint_eq(report(p).usage.bytes_padding, 0);
	free(s);
	finish(p);
}
END_TEST

START_TEST(sliced_many_pages)
{
	enum { N = 40000 };
	struct pool *p = sliced(1 * MIB, 0, 0);
	struct memory_slice **s = calloc(N, sizeof(*s));
	uint64_t seed = 11;
	size_t i;

	ck_assert_ptr_nonnull(s);
	for (i = 0; i < N; i++)
		s[i] = take(p, 1024 + (i % 4) * 512);
	ck_assert_uint_eq(report(p).pages, 69);
	shuffle(s, N, &seed);
	for (i = 0; i < N; i++)
		pool_release(s[i]);
	pool_cleanup(p, true, 0);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 0);
	free(s);
	finish(p);
}
END_TEST

START_TEST(sliced_bad_options)
{
	struct memory_pool_options opt = { .kind = MEMORY_POOL_SLICED };
	struct pool *p = NULL;

	ck_assert_int_eq(pool_sliced_create(&opt, &storage, ALIGN, &p),
			 GPUCMD_EINVAL);
	opt.page_size = 1000;
	ck_assert_int_eq(pool_sliced_create(&opt, &storage, ALIGN, &p),
			 GPUCMD_EINVAL);
	opt.page_size = 1024;
	opt.max_slice = 2048;
	ck_assert_int_eq(pool_sliced_create(&opt, &storage, ALIGN, &p),
			 GPUCMD_EINVAL);
	opt.max_slice = 0;
	opt.max_pool_size = 512;
	ck_assert_int_eq(pool_sliced_create(&opt, &storage, ALIGN, &p),
			 GPUCMD_EINVAL);
	ck_assert_ptr_null(p);
	opt.kind = MEMORY_POOL_PERSISTENT;
	ck_assert_int_eq(pool_create(&opt, &storage, ALIGN, &p), GPUCMD_EINVAL);
}
END_TEST

START_TEST(sliced_free_list_order)
{
	enum { N = 16 };
	static const int order[] = { 9, 3, 14, 1, 6, 11, 4, 12 };
	struct pool *p = sliced(64 * KIB, 0, 0);
	struct memory_slice *s[N], *x;
	uint64_t base;
	size_t i;

	/* A full page; every other slice released, in a scattered order. */
	for (i = 0; i < N; i++)
		s[i] = take(p, 4096);
	base = s[0]->ptr;
	for (i = 0; i < sizeof(order) / sizeof(order[0]); i++)
		pool_release(s[order[i]]);
	/* First fit by address, whatever order the holes were made in. */
	x = take(p, 4096);
	ck_assert_uint_eq(x->ptr, base + 1 * 4096);
	x = take(p, 4096);
	ck_assert_uint_eq(x->ptr, base + 3 * 4096);
	x = take(p, 8192);
	ck_assert_uint_eq(x->ptr, base + 11 * 4096);
	x = take(p, 4096);
	ck_assert_uint_eq(x->ptr, base + 4 * 4096);
	x = take(p, 4096);
	ck_assert_uint_eq(x->ptr, base + 6 * 4096);
	x = take(p, 4096);
	ck_assert_uint_eq(x->ptr, base + 9 * 4096);
	x = take(p, 4096);
	ck_assert_uint_eq(x->ptr, base + 14 * 4096);
	ck_assert_uint_eq(pool_largest_free(p), 0);
	finish(p);
}
END_TEST

START_TEST(sliced_sliding_window)
{
	enum { W = 32, STEPS = 1000 };
	struct pool *p = sliced(1 * MIB, 0, 0);
	struct memory_slice *s[W];
	uint64_t base;
	size_t i;

	/*
	 * A loop that gives back its oldest slice and takes one of the same
	 * size: the hole left at the front is reused at once, so the live
	 * slices cycle through the first W slots of the page.
	 */
	for (i = 0; i < W; i++)
		s[i] = take(p, 4096);
	base = s[0]->ptr;
	for (i = 0; i < STEPS; i++) {
		pool_release(s[i % W]);
		s[i % W] = take(p, 4096);
		expect(s[i % W]->ptr == base + (i % W) * 4096);
	}
	ck_assert_uint_eq(report(p).pages, 1);
	ck_assert_uint_eq(pool_largest_free(p), 1 * MIB - W * 4096);
	for (i = 0; i < W; i++)
		pool_release(s[i]);
	ck_assert_uint_eq(pool_largest_free(p), 1 * MIB);
	finish(p);
}
END_TEST

START_TEST(sliced_trim)
{
	struct pool_host host = { .clock = 10 };
	struct pool *p = sliced(64 * KIB, 0, 0);
	struct memory_slice *a, *b, *c;

	p->host = &host;
	a = take(p, 64 * KIB);
	b = take(p, 64 * KIB);
	c = take(p, 64 * KIB);
	ck_assert_uint_eq(report(p).pages, 3);
	host.clock = 20;
	pool_release(a);
	host.clock = 30;
	pool_release(c);
	host.clock = 40;
	/* Only pages idle since clock 25 or earlier: a's, not c's. */
	ck_assert_uint_eq(pool_trim(p, 25, UINT64_MAX), 64 * KIB);
	ck_assert_uint_eq(report(p).pages, 2);
	ck_assert_uint_eq(report(p).pages_peak, 3);
	ck_assert_uint_eq(host.reserved, 2 * 64 * KIB);
	/* A live page is never idle. */
	ck_assert_uint_eq(pool_trim(p, 30, UINT64_MAX), 64 * KIB);
	ck_assert_uint_eq(pool_trim(p, UINT64_MAX, UINT64_MAX), 0);
	ck_assert_uint_eq(fs.nlive, 1);
	ck_assert_uint_eq(fs.live[0].ptr, b->ptr);
	/* Enough is enough: one page covers want = 1. */
	a = take(p, 64 * KIB);
	c = take(p, 64 * KIB);
	pool_release(a);
	pool_release(c);
	ck_assert_uint_eq(pool_trim(p, UINT64_MAX, 1), 64 * KIB);
	ck_assert_uint_eq(report(p).pages, 2);
	/* The recycled block structs still carve and merge. */
	a = take(p, 1000);
	c = take(p, 2000);
	pool_release(a);
	pool_release(c);
	ck_assert_uint_eq(pool_largest_free(p), 64 * KIB);
	pool_release(b);
	finish(p);
}
END_TEST

START_TEST(pools_need_pow2_alignment)
{
	struct memory_pool_options opt = {
		.kind = MEMORY_POOL_SLICED,
		.page_size = 3 * 768,
		.max_alloc = 768,
	};
	struct pool *p = NULL;
	uint64_t v = 0;

	ck_assert_int_eq(pool_sliced_create(&opt, &storage, 768, &p),
			 GPUCMD_EINVAL);
	opt.kind = MEMORY_POOL_EXCLUSIVE;
	ck_assert_int_eq(pool_exclusive_create(&opt, &storage, 768, &p),
			 GPUCMD_EINVAL);
	opt.kind = MEMORY_POOL_DIRECT;
	ck_assert_int_eq(pool_direct_create(&opt, &storage, 768, &p),
			 GPUCMD_EINVAL);
	ck_assert_int_eq(pool_persistent_create(&storage, 768, &p),
			 GPUCMD_EINVAL);
	ck_assert_int_eq(pool_persistent_create(&storage, 0, &p),
			 GPUCMD_EINVAL);
	ck_assert_ptr_null(p);
	/* Rounding: a mask for powers of two, a division otherwise. */
	ck_assert(pool_round_up(1, 512, &v) && v == 512);
	ck_assert(pool_round_up(1024, 512, &v) && v == 1024);
	ck_assert(pool_round_up(1000, 768, &v) && v == 1536);
	ck_assert(!pool_round_up(UINT64_MAX - 10, 512, &v));
	ck_assert(!pool_round_up(UINT64_MAX - 10, 768, &v));
	ck_assert(pool_round_up(UINT64_MAX - 511, 512, &v) &&
		  v == UINT64_MAX - 511);
	ck_assert_uint_eq(pool_little_waste_min(1 * MIB), 838861);
	ck_assert_uint_eq(pool_little_waste_min(5), 5);
}
END_TEST

START_TEST(exclusive_exact_size)
{
	struct pool *p = exclusive(1024 * MIB, 0);
	struct memory_slice *a, *b, *c;
	struct memory_pool_report r;

	a = take(p, 3000);
	r = report(p);
	ck_assert_uint_eq(r.usage.bytes_reserved, 3072);
	ck_assert_uint_eq(r.pages, 1);
	ck_assert_uint_eq(r.page_size, 1024 * MIB);
	ck_assert_uint_eq(r.usage.bytes_padding, 72);
	/*
	 * 2560 of 3072 leaves a sixth unused: reused, and all of it is the
	 * slice's (the rest is padding, not free: nothing else can use it).
	 */
	pool_release(a);
	b = take(p, 2500);
	ck_assert_uint_eq(b->ptr, a->ptr);
	ck_assert_uint_eq(b->effective, 3072);
	r = report(p);
	ck_assert_uint_eq(r.usage.bytes_padding, 572);
	ck_assert_uint_eq(r.largest_free, 0);
	ck_assert_uint_eq(r.usage.bytes_reserved, 3072);
	ck_assert_uint_eq(r.largest_alloc, 3000);
	/* 1024 of 3072 would waste two thirds: a new exact allocation. */
	pool_release(b);
	c = take(p, 1000);
	ck_assert_uint_ne(c->ptr, a->ptr);
	r = report(p);
	ck_assert_uint_eq(r.usage.bytes_reserved, 3072 + 1024);
	ck_assert_uint_eq(r.pages, 2);
	ck_assert_uint_eq(r.largest_free, 3072);
	pool_release(c);
	finish(p);
}
END_TEST

START_TEST(exclusive_best_fit)
{
	struct pool *p = exclusive(1024 * MIB, 0);
	struct memory_slice *big, *small, *x, *y;

	big = take(p, 8192);
	small = take(p, 4096);
	pool_release(big);
	pool_release(small);
	x = take(p, 4000);
	ck_assert_uint_eq(x->ptr, small->ptr);
	y = take(p, 7000);
	ck_assert_uint_eq(y->ptr, big->ptr);
	ck_assert_uint_eq(report(p).pages, 2);
	ck_assert_uint_eq(pool_largest_free(p), 0);
	/* Nothing free fits: exact allocation. */
	x = take(p, 100);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 8192 + 4096 + 512);
	finish(p);
}
END_TEST

START_TEST(exclusive_accept)
{
	struct pool *z = exclusive(0, 0);
	struct pool *p = exclusive(64 * KIB, 0);
	struct memory_slice *s = NULL;

	ck_assert(pool_accept(z, 0));
	ck_assert(!pool_accept(z, 1));
	ck_assert_uint_eq(pool_max_accept(z), 0);
	s = take(z, 0);
	ck_assert_uint_eq(s->effective, 512);
	ck_assert_uint_eq(report(z).usage.bytes_reserved, 512);
	ck_assert_uint_eq(report(z).usage.bytes_padding, 512);
	ck_assert(pool_accept(p, 64 * KIB));
	ck_assert(!pool_accept(p, 64 * KIB + 1));
	s = NULL;
	ck_assert_int_eq(pool_reserve(p, 64 * KIB + 1, &s), GPUCMD_ETOOBIG);
	ck_assert_ptr_null(s);
	fs.fail = true;
	ck_assert_int_eq(pool_reserve(p, 100, &s), GPUCMD_ENOMEM);
	ck_assert_uint_eq(report(p).pages, 0);
	fs.fail = false;
	finish(z);
	finish(p);
}
END_TEST

START_TEST(exclusive_periodic)
{
	/* A period of 10 checks every 2 reservations. */
	struct pool *p = exclusive(1 * MIB, 10);
	struct memory_slice *a, *b, *live;

	live = take(p, 512);
	a = take(p, 4096);
	pool_release(a);
	pool_cleanup(p, false, 1);
	ck_assert_uint_eq(report(p).pages, 2);
	/* Never reused: freed at the first check. */
	pool_cleanup(p, false, 2);
	ck_assert_uint_eq(report(p).pages, 1);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 512);
	/* Reused once: survives one check, goes at the next. */
	b = take(p, 4096);
	pool_release(b);
	b = take(p, 4096);
	pool_release(b);
	pool_cleanup(p, false, 4);
	ck_assert_uint_eq(report(p).pages, 2);
	pool_cleanup(p, false, 5);
	ck_assert_uint_eq(report(p).pages, 2);
	pool_cleanup(p, false, 6);
	ck_assert_uint_eq(report(p).pages, 1);
	/* Live allocations are never touched. */
	pool_cleanup(p, false, 100);
	pool_cleanup(p, false, 200);
	ck_assert_uint_eq(fs.nlive, 1);
	ck_assert_uint_eq(fs.live[0].ptr, live->ptr);
	finish(p);
}
END_TEST

START_TEST(exclusive_explicit)
{
	struct pool *p = exclusive(1 * MIB, 0);
	struct memory_slice *a, *b;

	a = take(p, 1000);
	b = take(p, 2000);
	pool_release(a);
	/* Without a period only explicit cleanup frees. */
	pool_cleanup(p, false, 1000000);
	ck_assert_uint_eq(report(p).pages, 2);
	pool_cleanup(p, true, 0);
	ck_assert_uint_eq(report(p).pages, 1);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 2048);
	ck_assert_uint_eq(report(p).pages_peak, 2);
	pool_release(b);
	pool_cleanup(p, true, 0);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 0);
	finish(p);
}
END_TEST

START_TEST(dedicated_trim)
{
	struct pool_host host = { .clock = 1 };
	struct pool *p = exclusive(64 * MIB, 0);
	struct memory_slice *a, *b, *c, *d;

	p->host = &host;
	a = take(p, 1 * MIB);
	b = take(p, 2 * MIB);
	c = take(p, 4 * MIB);
	d = take(p, 8 * MIB);
	host.clock = 5;
	pool_release(a);
	pool_release(b);
	pool_release(c);
	host.clock = 9;
	pool_release(d);
	/* Largest first among the idle ones; d is too recent. */
	ck_assert_uint_eq(pool_trim(p, 5, 3 * MIB), 4 * MIB);
	ck_assert_uint_eq(report(p).pages, 3);
	ck_assert_uint_eq(pool_largest_free(p), 8 * MIB);
	ck_assert_uint_eq(pool_trim(p, 5, UINT64_MAX), 3 * MIB);
	ck_assert_uint_eq(report(p).pages, 1);
	ck_assert_uint_eq(host.reserved, 8 * MIB);
	ck_assert_uint_eq(pool_trim(p, 9, 0), 0);
	ck_assert_uint_eq(pool_trim(p, 9, 1), 8 * MIB);
	ck_assert_uint_eq(fs.nlive, 0);
	finish(p);
}
END_TEST

START_TEST(persistent_buckets)
{
	struct pool *p = NULL;
	struct memory_slice *a, *b, *c, *s = NULL;
	struct memory_pool_report r;

	ck_assert_int_eq(pool_persistent_create(&storage, ALIGN, &p), 0);
	ck_assert(pool_accept(p, UINT64_MAX));
	a = take(p, 1000);
	pool_release(a);
	/* Same effective size: reused. */
	b = take(p, 1020);
	ck_assert_uint_eq(b->ptr, a->ptr);
	pool_release(b);
	/* Larger effective size: never served from a larger bucket. */
	c = take(p, 1100);
	ck_assert_uint_ne(c->ptr, a->ptr);
	r = report(p);
	ck_assert_int_eq(r.kind, MEMORY_POOL_PERSISTENT);
	ck_assert_uint_eq(r.usage.bytes_reserved, 1024 + 1536);
	ck_assert_uint_eq(r.largest_free, 1024);
	/* 600 bytes round to the same 1024-byte bucket. */
	b = take(p, 600);
	ck_assert_uint_eq(b->ptr, a->ptr);
	pool_release(b);
	pool_cleanup(p, false, 100000);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 1024 + 1536);
	pool_cleanup(p, true, 0);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 1536);
	ck_assert_uint_eq(pool_largest_free(p), 0);
	ck_assert_int_eq(pool_reserve(p, UINT64_MAX, &s), GPUCMD_ETOOBIG);
	ck_assert_ptr_null(s);
	/* Nor is a smaller request served from a larger free bucket. */
	pool_release(c);
	b = take(p, 1000);
	ck_assert_uint_ne(b->ptr, c->ptr);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 1536 + 1024);
	finish(p);
}
END_TEST

START_TEST(direct_reclaim)
{
	struct pool *p = direct(8192);
	struct memory_slice *a, *b, *c, *d;

	ck_assert(pool_accept(p, UINT64_MAX - 4096));
	ck_assert_uint_eq(pool_max_accept(p), UINT64_MAX - 511);
	a = take(p, 4096);
	b = take(p, 4096);
	pool_release(a);
	pool_release(b);
	/* 8192 + 6144 would pass the mark: both free ones go first. */
	c = take(p, 6000);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 6144);
	ck_assert_uint_eq(report(p).pages, 1);
	ck_assert_uint_eq(fs.nlive, 1);
	/* A watermark, not a budget: nothing free, so it just allocates. */
	d = take(p, 4096);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 6144 + 4096);
	/* Exact-size reuse. */
	pool_release(d);
	a = take(p, 4000);
	ck_assert_uint_eq(a->ptr, d->ptr);
	pool_release(a);
	pool_release(c);
	pool_cleanup(p, false, 5000);
	ck_assert_uint_eq(report(p).pages, 2);
	pool_cleanup(p, true, 0);
	ck_assert_uint_eq(report(p).pages, 0);
	finish(p);
}
END_TEST

START_TEST(direct_no_watermark)
{
	struct pool *p = direct(0);
	struct memory_slice *a, *b;

	a = take(p, 100 * MIB);
	pool_release(a);
	b = take(p, 1 * MIB);
	ck_assert_uint_ne(b->ptr, a->ptr);
	ck_assert_uint_eq(report(p).usage.bytes_reserved, 101 * MIB);
	ck_assert_uint_eq(pool_largest_free(p), 100 * MIB);
	finish(p);
}
END_TEST

/* Live slices in real memory keep a fill byte; a clobbered one overlapped. */
START_TEST(real_memory_patterns)
{
	enum { N = 256, STEPS = 6000 };
	struct pool *pools[3];
	struct memory_slice *s[N] = { 0 };
	unsigned char fill[N];
	uint64_t seed = 3, size, k;
	size_t i, j;

	fake_storage_fini(&fs);
	storage = fake_storage_init(&fs, ALIGN, true);
	pools[0] = sliced(256 * KIB, 64 * KIB, 0);
	pools[1] = exclusive(256 * KIB, 20);
	pools[2] = direct(1 * MIB);
	for (k = 0; k < STEPS; k++) {
		seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
		i = (size_t)((seed >> 33) % N);
		if (s[i]) {
			unsigned char *m = (void *)(uintptr_t)s[i]->ptr;

			for (j = 0; j < s[i]->size; j++)
				expect(m[j] == fill[i]);
			pool_release(s[i]);
			s[i] = NULL;
			continue;
		}
		size = (seed >> 12) % (64 * KIB);
		if (size % 7 == 0)
			size = 0;
		s[i] = take(pools[i % 3], size);
		fill[i] = (unsigned char)(k * 31 + 1);
		memset((void *)(uintptr_t)s[i]->ptr, fill[i], size);
		if (k % 500 == 0)
			pool_cleanup(pools[k / 500 % 3], true, k);
		else
			pool_cleanup(pools[1], false, k);
	}
	for (i = 0; i < N; i++)
		if (s[i])
			pool_release(s[i]);
	for (i = 0; i < 3; i++)
		pool_destroy(pools[i]);
	ck_assert_uint_eq(fs.nlive, 0);
}
END_TEST

static Suite *pools_suite(void)
{
	Suite *s = suite_create("pools");
	TCase *tc;

	tc = tcase_create("sliced");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, sliced_split);
	tcase_add_test(tc, sliced_coalesce);
	tcase_add_test(tc, sliced_first_fit);
	tcase_add_test(tc, sliced_accept_rule);
	tcase_add_test(tc, sliced_capacity);
	tcase_add_test(tc, sliced_cleanup);
	tcase_add_test(tc, sliced_storage_failure);
	tcase_add_test(tc, sliced_bad_options);
	tcase_add_test(tc, sliced_free_list_order);
	tcase_add_test(tc, sliced_sliding_window);
	tcase_add_test(tc, sliced_trim);
	tcase_add_test(tc, pools_need_pow2_alignment);
	suite_add_tcase(s, tc);

	tc = tcase_create("scale");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, sliced_many_slices);
	tcase_add_test(tc, sliced_many_pages);
	tcase_add_test(tc, real_memory_patterns);
	suite_add_tcase(s, tc);

	tc = tcase_create("exclusive");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, exclusive_exact_size);
	tcase_add_test(tc, exclusive_best_fit);
	tcase_add_test(tc, exclusive_accept);
	tcase_add_test(tc, exclusive_periodic);
	tcase_add_test(tc, exclusive_explicit);
	tcase_add_test(tc, dedicated_trim);
	suite_add_tcase(s, tc);

	tc = tcase_create("persistent_direct");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, persistent_buckets);
	tcase_add_test(tc, direct_reclaim);
	tcase_add_test(tc, direct_no_watermark);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_main(pools_suite());
}
