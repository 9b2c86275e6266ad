/*
 * check_memory_manager.c - routing, layouts, validation, modes, rebuilds
 * and accounting of memory/memory_manager.c, plus a randomized model test:
 * thousands of seeded steps, each checked against a plain list of what
 * should be live (no overlap, alignment, exact usage, everything inside a
 * device allocation the storage handed out).
 */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memory/memory_manager.h"
#include "memory/pool.h"
#include "memory_fake_storage.h"
#include "unit.h"

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)
#define ALIGN 512

static struct fake_storage fs;
static struct memory_storage storage;

/* An 80 GiB device: max_page_size is a quarter of memory. */
static const struct memory_device_properties dev80 = {
	.max_page_size = 20 * GIB,
	.alignment = ALIGN,
};

static void setup(void)
{
	storage = fake_storage_init(&fs, ALIGN, false);
}

static void teardown(void)
{
	fake_storage_fini(&fs);
}

static struct memory_configuration preset(enum memory_preset p)
{
	return (struct memory_configuration){ .preset = p };
}

static struct memory_pool_options sliced(uint64_t page, uint64_t max_slice,
					 uint64_t cap)
{
	return (struct memory_pool_options){
		.kind = MEMORY_POOL_SLICED,
		.page_size = page,
		.max_slice = max_slice,
		.max_pool_size = cap,
	};
}

static struct memory_pool_options exclusive(uint64_t max_alloc, uint64_t period)
{
	return (struct memory_pool_options){
		.kind = MEMORY_POOL_EXCLUSIVE,
		.max_alloc = max_alloc,
		.dealloc_period = period,
	};
}

static struct memory_pool_options direct(uint64_t reclaim_at)
{
	return (struct memory_pool_options){
		.kind = MEMORY_POOL_DIRECT,
		.reclaim_at = reclaim_at,
	};
}

static struct memory_configuration custom(size_t n,
					  const struct memory_pool_options *p)
{
	struct memory_configuration c = { .preset = MEMORY_PRESET_CUSTOM };

	c.npools = n;
	memcpy(c.pools, p, n * sizeof(*p));
	return c;
}

static struct memory_manager *make(const struct memory_configuration *cfg,
				   const struct memory_device_properties *props)
{
	struct memory_manager *mm = NULL;

	ck_assert_int_eq(memory_manager_create(cfg, props, &storage, &mm), 0);
	ck_assert_ptr_nonnull(mm);
	return mm;
}

static struct memory_slice *take(struct memory_manager *mm, uint64_t size)
{
	struct memory_alloc a = { 0 };

	expect(memory_manager_reserve(mm, size, &a) == 0);
	expect(a.slice != NULL);
	expect(a.size == size);
	expect(a.ptr % ALIGN == 0);
	return a.slice;
}

static struct memory_usage usage(const struct memory_manager *mm)
{
	struct memory_usage u;

	memory_manager_usage(mm, &u);
	return u;
}

/* Destroy mm and check that the storage got everything back. */
static void finish(struct memory_manager *mm)
{
	memory_manager_destroy(mm);
	ck_assert_uint_eq(fs.nlive, 0);
	ck_assert_uint_eq(fs.bytes, 0);
}

/* Resolve cfg and expect EINVAL with a message containing needle. */
static void expect_invalid(struct memory_configuration cfg,
			   const struct memory_device_properties *props,
			   const char *needle)
{
	struct memory_configuration before = cfg;
	struct memory_manager *mm = NULL;
	char msg[256] = "";

	ck_assert_int_eq(memory_configuration_resolve(&cfg, props, msg,
						      sizeof(msg)),
			 GPUCMD_EINVAL);
	ck_assert_msg(strstr(msg, needle), "message \"%s\" lacks \"%s\"", msg,
		      needle);
	ck_assert_int_eq(memcmp(&cfg, &before, sizeof(cfg)), 0);
	ck_assert_int_eq(memory_manager_create(&cfg, props, &storage, &mm),
			 GPUCMD_EINVAL);
	ck_assert_ptr_null(mm);
}

START_TEST(resolve_rejects)
{
	struct memory_pool_options p[MEMORY_MAX_POOLS + 1];
	struct memory_device_properties bad = dev80;
	struct memory_configuration c;
	size_t i;

	for (i = 0; i < MEMORY_MAX_POOLS + 1; i++)
		p[i] = direct(0);
	expect_invalid(custom(0, p), &dev80, "empty");
	c = custom(MEMORY_MAX_POOLS, p);
	c.npools = MEMORY_MAX_POOLS + 1;
	expect_invalid(c, &dev80, "33 pools given; at most 32");
	p[0] = sliced(0, 0, 0);
	expect_invalid(custom(1, p), &dev80, "pool 0 (sliced): page_size is 0");
	p[0] = direct(0);
	p[1] = exclusive(0, 0);
	expect_invalid(custom(2, p), &dev80,
		       "pool 1 (exclusive): max_alloc is 0");
	p[1] = sliced(1000, 2000, 0);
	expect_invalid(custom(2, p), &dev80,
		       "max_slice 2048 is larger than page_size 1024");
	p[1] = sliced(4096, 0, 1000);
	expect_invalid(custom(2, p), &dev80,
		       "max_pool_size 1024 is smaller than one page of 4096");
	p[1] = sliced(UINT64_MAX, 0, 0);
	expect_invalid(custom(2, p), &dev80, "too large");
	p[1] = (struct memory_pool_options){ .kind = MEMORY_POOL_PERSISTENT };
	expect_invalid(custom(2, p), &dev80, "not a dynamic pool kind");
	p[1] = (struct memory_pool_options){ .kind = 0 };
	expect_invalid(custom(2, p), &dev80, "kind 0");
	expect_invalid(preset(99), &dev80, "unknown memory preset 99");
	bad.alignment = 0;
	expect_invalid(preset(MEMORY_PRESET_SUBSLICES), &bad, "alignment of 0");
	/* Rounding is a mask, so the alignment must be a power of two. */
	bad.alignment = 768;
	expect_invalid(preset(MEMORY_PRESET_SUBSLICES), &bad,
		       "alignment of 768, which is not a power of two");
	expect_invalid(custom(2, p), &bad, "not a power of two");
	bad.alignment = 4096;
	bad.max_page_size = 1024;
	expect_invalid(preset(MEMORY_PRESET_EXCLUSIVE_PAGES), &bad,
		       "smaller than its alignment");
	/* No message buffer is fine. */
	c = custom(0, p);
	ck_assert_int_eq(memory_configuration_resolve(&c, &dev80, NULL, 0),
			 GPUCMD_EINVAL);
}
END_TEST

START_TEST(resolve_normalises)
{
	struct memory_pool_options p[3] = {
		sliced(1000, 0, 3000),
		exclusive(100, 7),
		direct(12345),
	};
	struct memory_configuration c = custom(3, p);
	struct memory_configuration s = preset(MEMORY_PRESET_SUBSLICES);
	char msg[64] = "";

	ck_assert_int_eq(memory_configuration_resolve(&c, &dev80, msg,
						      sizeof(msg)),
			 0);
	ck_assert_uint_eq(c.npools, 3);
	ck_assert_uint_eq(c.pools[0].page_size, 1024);
	ck_assert_uint_eq(c.pools[0].max_slice, 1024);
	ck_assert_uint_eq(c.pools[0].max_pool_size, 3072);
	ck_assert_uint_eq(c.pools[1].max_alloc, 512);
	ck_assert_uint_eq(c.pools[1].dealloc_period, 7);
	ck_assert_uint_eq(c.pools[2].reclaim_at, 12345);
	/* Presets are left as they are: the manager sizes them. */
	ck_assert_int_eq(memory_configuration_resolve(&s, &dev80, NULL, 0), 0);
	ck_assert_int_eq(s.preset, MEMORY_PRESET_SUBSLICES);
	ck_assert_uint_eq(s.npools, 0);
}
END_TEST

START_TEST(subslices_layout_80g)
{
	struct memory_configuration c = preset(MEMORY_PRESET_SUBSLICES);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_pool_report r[16];
	static const uint64_t page[] = {
		20 * MIB, 80 * MIB, 320 * MIB, 1280 * MIB, 5 * GIB,
	};
	static const uint64_t slice[] = {
		640 * KIB, 5 * MIB, 40 * MIB, 320 * MIB, 2560 * MIB,
	};
	size_t i;

	ck_assert_uint_eq(memory_manager_report(mm, r, 16), 8);
	ck_assert_int_eq(r[0].kind, MEMORY_POOL_EXCLUSIVE);
	ck_assert_uint_eq(r[0].page_size, 0);
	for (i = 0; i < 5; i++) {
		ck_assert_int_eq(r[i + 1].kind, MEMORY_POOL_SLICED);
		ck_assert_uint_eq(r[i + 1].page_size, page[i]);
		ck_assert_uint_eq(r[i + 1].max_slice, slice[i]);
	}
	ck_assert_int_eq(r[6].kind, MEMORY_POOL_EXCLUSIVE);
	ck_assert_uint_eq(r[6].page_size, 20 * GIB);
	ck_assert_int_eq(r[7].kind, MEMORY_POOL_PERSISTENT);
	ck_assert_uint_eq(memory_manager_max_alloc(mm), 20 * GIB);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 0);
	ck_assert_uint_eq(memory_manager_largest_free(mm), 0);
	finish(mm);
}
END_TEST

START_TEST(subslices_layout_24g)
{
	struct memory_configuration c = preset(MEMORY_PRESET_SUBSLICES);
	struct memory_device_properties d24 = { 6 * GIB, ALIGN, 0 };
	struct memory_manager *mm = make(&c, &d24);
	struct memory_pool_report r[16];

	ck_assert_uint_eq(memory_manager_report(mm, r, 16), 7);
	ck_assert_uint_eq(r[1].page_size, 24 * MIB);
	ck_assert_uint_eq(r[2].page_size, 96 * MIB);
	ck_assert_uint_eq(r[3].page_size, 384 * MIB);
	ck_assert_uint_eq(r[4].page_size, 1536 * MIB);
	ck_assert_uint_eq(r[4].max_slice, 768 * MIB);
	ck_assert_uint_eq(r[1].max_slice, 24 * MIB / 16);
	ck_assert_uint_eq(r[5].page_size, 6 * GIB);
	finish(mm);
}
END_TEST

/*
 * A service's quota caps the layout (streams_layout_props): 4 x a 32M
 * limit is a max_page_size of 128M, and min_page_size takes the ladder
 * down to 2M pages, so small buffers on many streams keep small pages.
 */
START_TEST(subslices_layout_min_page)
{
	struct memory_configuration c = preset(MEMORY_PRESET_SUBSLICES);
	struct memory_device_properties capped = { 128 * MIB, ALIGN, 2 * MIB };
	struct memory_device_properties plain = { 128 * MIB, ALIGN, 0 };
	struct memory_manager *mm = make(&c, &capped);
	struct memory_pool_report r[16];

	ck_assert_uint_eq(memory_manager_report(mm, r, 16), 6);
	ck_assert_uint_eq(r[1].page_size, 2 * MIB);
	ck_assert_uint_eq(r[1].max_slice, 2 * MIB / 8);
	ck_assert_uint_eq(r[2].page_size, 8 * MIB);
	ck_assert_uint_eq(r[2].max_slice, 8 * MIB / 4);
	ck_assert_uint_eq(r[3].page_size, 32 * MIB);
	ck_assert_uint_eq(r[3].max_slice, 16 * MIB);
	ck_assert_int_eq(r[4].kind, MEMORY_POOL_EXCLUSIVE);
	ck_assert_uint_eq(r[4].page_size, 128 * MIB);
	finish(mm);
	/* Without it, the ladder stops at 8M, as before. */
	mm = make(&c, &plain);
	ck_assert_uint_eq(memory_manager_report(mm, r, 16), 5);
	ck_assert_uint_eq(r[1].page_size, 8 * MIB);
	ck_assert_uint_eq(r[2].page_size, 32 * MIB);
	finish(mm);
}
END_TEST

START_TEST(exclusive_pages_layout)
{
	struct memory_configuration c = preset(MEMORY_PRESET_EXCLUSIVE_PAGES);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_pool_report r[MEMORY_MAX_POOLS + 1];
	size_t n, i;

	n = memory_manager_report(mm, r, MEMORY_MAX_POOLS + 1);
	ck_assert_uint_eq(n, 25);
	ck_assert_uint_eq(r[0].page_size, 32 * KIB);
	ck_assert_uint_eq(r[23].page_size, 20 * GIB);
	for (i = 0; i < 24; i++) {
		ck_assert_int_eq(r[i].kind, MEMORY_POOL_EXCLUSIVE);
		ck_assert_uint_eq(r[i].page_size % ALIGN, 0);
		if (i > 0)
			ck_assert_uint_gt(r[i].page_size, r[i - 1].page_size);
	}
	/* A bucket's request is sized exactly, not to the bucket. */
	take(mm, 33 * KIB);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 33 * KIB);
	take(mm, 0);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 33 * KIB + 512);
	finish(mm);
}
END_TEST

START_TEST(routing_subslices)
{
	struct memory_configuration c = preset(MEMORY_PRESET_SUBSLICES);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_pool_report r[8];
	struct memory_alloc a = { 0 };
	struct memory_usage u;

	take(mm, 0);
	take(mm, 100 * KIB);
	/* The tail sizes a 3 GiB request exactly: 3 GiB, not ~10. */
	take(mm, 3 * GIB);
	/* 4.5 GiB fills 90% of a 5 GiB page: the last rung takes it. */
	take(mm, 4608 * MIB);
	memory_manager_report(mm, r, 8);
	ck_assert_uint_eq(r[0].usage.allocations, 1);
	ck_assert_uint_eq(r[0].usage.bytes_reserved, 512);
	ck_assert_uint_eq(r[1].usage.allocations, 1);
	ck_assert_uint_eq(r[1].usage.bytes_reserved, 20 * MIB);
	ck_assert_uint_eq(r[5].usage.allocations, 1);
	ck_assert_uint_eq(r[5].usage.bytes_reserved, 5 * GIB);
	ck_assert_uint_eq(r[6].usage.allocations, 1);
	ck_assert_uint_eq(r[6].usage.bytes_reserved, 3 * GIB);
	ck_assert_uint_eq(r[6].largest_alloc, 3 * GIB);
	u = usage(mm);
	ck_assert_uint_eq(u.allocations, 4);
	ck_assert_uint_eq(u.bytes_in_use, 100 * KIB + 3 * GIB + 4608 * MIB);
	ck_assert_uint_eq(u.bytes_padding, 512);
	ck_assert_uint_eq(u.bytes_reserved, 512 + 20 * MIB + 3 * GIB + 5 * GIB);
	/* The 5 GiB page has half a GiB left. */
	ck_assert_uint_eq(memory_manager_largest_free(mm), 512 * MIB);
	/* Above max_page_size nothing accepts: final, usage untouched. */
	ck_assert_int_eq(memory_manager_reserve(mm, 20 * GIB + 1, &a),
			 GPUCMD_ETOOBIG);
	ck_assert_ptr_null(a.slice);
	ck_assert_uint_eq(usage(mm).bytes_reserved, u.bytes_reserved);
	take(mm, 20 * GIB);
	finish(mm);
}
END_TEST

START_TEST(routing_within_bit_lengths)
{
	/*
	 * Boundaries that fall inside a power-of-two range (3 KiB, the
	 * near-page rule at 52429, 98 KiB) must route exactly as pool_accept
	 * says, whatever shortcut the manager takes per bit length.
	 */
	struct memory_pool_options p[3] = {
		sliced(64 * KIB, 3 * KIB, 0),
		exclusive(98 * KIB, 0),
		direct(0),
	};
	struct memory_configuration c = custom(3, p);
	struct memory_manager *mm = make(&c, &dev80);
	static const struct {
		uint64_t size;
		size_t pool;
	} cases[] = {
		{ 0, 0 },
		{ 1, 0 },
		{ 3 * KIB, 0 },
		{ 3 * KIB + 1, 1 },
		{ 4 * KIB, 1 },
		{ 52428, 1 },
		{ 52429, 0 },
		{ 64 * KIB, 0 },
		{ 64 * KIB + 1, 1 },
		{ 98 * KIB, 1 },
		{ 98 * KIB + 1, 2 },
		{ 128 * KIB, 2 },
		{ 1 * GIB + 3, 2 },
	};
	struct memory_pool_report r[4];
	uint64_t before[3] = { 0 };
	size_t i, k;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		take(mm, cases[i].size);
		memory_manager_report(mm, r, 4);
		for (k = 0; k < 3; k++) {
			ck_assert_msg(r[k].usage.allocations ==
					      before[k] + (k == cases[i].pool),
				      "size %llu went to the wrong pool",
				      (unsigned long long)cases[i].size);
			before[k] = r[k].usage.allocations;
		}
	}
	finish(mm);
}
END_TEST

START_TEST(persistent_mode)
{
	struct memory_configuration c = preset(MEMORY_PRESET_SUBSLICES);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_pool_report r[8];
	struct memory_slice *s, *t;

	ck_assert_int_eq(memory_manager_current_mode(mm), MEMORY_MODE_AUTO);
	memory_manager_mode(mm, MEMORY_MODE_PERSISTENT);
	memory_manager_mode(mm, MEMORY_MODE_PERSISTENT);
	memory_manager_mode(mm, MEMORY_MODE_AUTO);
	ck_assert_int_eq(memory_manager_current_mode(mm),
			 MEMORY_MODE_PERSISTENT);
	/* Persistent mode takes sizes no dynamic pool accepts. */
	s = take(mm, 21 * GIB);
	t = take(mm, 1000);
	memory_manager_report(mm, r, 8);
	ck_assert_uint_eq(r[7].usage.allocations, 2);
	ck_assert_uint_eq(r[7].usage.bytes_reserved, 21 * GIB + 1024);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 21 * GIB + 1024);
	/* Exact-size reuse. */
	memory_manager_release(mm, t);
	ck_assert_ptr_eq(take(mm, 1010), t);
	memory_manager_mode(mm, MEMORY_MODE_AUTO);
	ck_assert_int_eq(memory_manager_current_mode(mm), MEMORY_MODE_AUTO);
	/* Closing more windows than were opened saturates at zero. */
	memory_manager_mode(mm, MEMORY_MODE_AUTO);
	memory_manager_mode(mm, MEMORY_MODE_PERSISTENT);
	ck_assert_int_eq(memory_manager_current_mode(mm),
			 MEMORY_MODE_PERSISTENT);
	memory_manager_mode(mm, MEMORY_MODE_AUTO);
	ck_assert_int_eq(memory_manager_current_mode(mm), MEMORY_MODE_AUTO);
	take(mm, 1000);
	memory_manager_report(mm, r, 8);
	ck_assert_uint_eq(r[7].usage.allocations, 2);
	ck_assert_uint_eq(r[1].usage.allocations, 1);
	/* Explicit cleanup frees free persistent slices. */
	memory_manager_release(mm, s);
	memory_manager_cleanup(mm, false);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 21 * GIB + 1024 + 20 * MIB);
	memory_manager_cleanup(mm, true);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 1024 + 20 * MIB);
	finish(mm);
}
END_TEST

START_TEST(capacity_spill)
{
	struct memory_pool_options p[2] = {
		sliced(64 * KIB, 0, 128 * KIB),
		sliced(1 * MIB, 0, 0),
	};
	struct memory_configuration c = custom(2, p);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_pool_report r[3];
	struct memory_alloc a = { 0 };

	take(mm, 64 * KIB);
	take(mm, 64 * KIB);
	take(mm, 64 * KIB);
	ck_assert_uint_eq(memory_manager_report(mm, r, 3), 3);
	ck_assert_uint_eq(r[0].usage.allocations, 2);
	ck_assert_uint_eq(r[0].pages, 2);
	ck_assert_uint_eq(r[1].usage.allocations, 1);
	ck_assert_uint_eq(r[1].usage.bytes_reserved, 1 * MIB);
	/* 896 KiB fills most of a page: it takes pool 1's remainder. */
	take(mm, 896 * KIB);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 128 * KIB + 1 * MIB);
	/*
	 * Pool 0 is full, pool 1 needs a page and the storage refuses: the
	 * refusal is the answer, not the spill that preceded it.
	 */
	fs.fail = true;
	take(mm, 64 * KIB);
	ck_assert_int_eq(memory_manager_reserve(mm, 64 * KIB, &a),
			 GPUCMD_ENOMEM);
	ck_assert_int_eq(memory_manager_reserve(mm, 2 * MIB, &a),
			 GPUCMD_ETOOBIG);
	ck_assert_ptr_null(a.slice);
	fs.fail = false;
	finish(mm);
}
END_TEST

START_TEST(capacity_exceeded)
{
	struct memory_pool_options p[2] = {
		sliced(64 * KIB, 0, 128 * KIB),
		exclusive(1 * KIB, 0),
	};
	struct memory_configuration c = custom(2, p);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_alloc a = { 0 };
	struct memory_slice *s;

	s = take(mm, 64 * KIB);
	take(mm, 64 * KIB);
	/* Too large for the exclusive pool: nothing else accepts. */
	ck_assert_int_eq(memory_manager_reserve(mm, 2 * KIB, &a),
			 GPUCMD_ECAPACITY);
	ck_assert_ptr_null(a.slice);
	/* The sentence names the cap that refused it. */
	{
		char why[256];

		memory_manager_describe_capacity(mm, 2 * KIB, why, sizeof(why));
		ck_assert_str_eq(why, "pool 0 (sliced, pages of 65536) holds "
				      "131072 of its max_pool_size of 131072 "
				      "bytes");
		/* A size no capped pool takes: nothing to name. */
		memory_manager_describe_capacity(mm, 100 * KIB, why,
						 sizeof(why));
		ck_assert_str_eq(why, "");
	}
	/* Small enough for it: spills there. */
	take(mm, 1 * KIB);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 128 * KIB + 1 * KIB);
	memory_manager_release(mm, s);
	take(mm, 2 * KIB);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 128 * KIB + 1 * KIB);
	finish(mm);
}
END_TEST

START_TEST(storage_refusal)
{
	struct memory_configuration c = preset(MEMORY_PRESET_SUBSLICES);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_alloc a = { 0 };

	fs.fail = true;
	ck_assert_int_eq(memory_manager_reserve(mm, 1000, &a), GPUCMD_ENOMEM);
	memory_manager_mode(mm, MEMORY_MODE_PERSISTENT);
	ck_assert_int_eq(memory_manager_reserve(mm, 1000, &a), GPUCMD_ENOMEM);
	memory_manager_mode(mm, MEMORY_MODE_AUTO);
	ck_assert_ptr_null(a.slice);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 0);
	ck_assert_uint_eq(usage(mm).allocations, 0);
	fs.fail = false;
	take(mm, 1000);
	finish(mm);
}
END_TEST

START_TEST(pools_in_use)
{
	struct memory_configuration c = preset(MEMORY_PRESET_SUBSLICES);
	struct memory_pool_options p[2] = {
		sliced(1 * MIB, 0, 0),
		direct(0),
	};
	struct memory_configuration next = custom(2, p);
	struct memory_configuration bad = custom(0, p);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_slice *a, *z, *per, *freed;
	struct memory_pool_report r[8];
	uint64_t bytes = 99;

	a = take(mm, 1000);
	z = take(mm, 0);
	freed = take(mm, 4 * GIB);
	memory_manager_release(mm, freed);
	memory_manager_mode(mm, MEMORY_MODE_PERSISTENT);
	per = take(mm, 5000);
	memory_manager_mode(mm, MEMORY_MODE_AUTO);
	ck_assert_int_eq(memory_manager_install_pools(mm, &next, &dev80,
						      &bytes),
			 GPUCMD_EPOOLSINUSE);
	ck_assert_uint_eq(bytes, 1000);
	ck_assert_uint_eq(memory_manager_report(mm, r, 8), 8);
	/* The explicit cleanup ran: the free 4 GiB page is gone. */
	ck_assert_uint_eq(usage(mm).bytes_reserved, 20 * MIB + 512 + 5120);
	/* A live zero-byte slice still pins the layout. */
	memory_manager_release(mm, a);
	bytes = 99;
	ck_assert_int_eq(memory_manager_install_pools(mm, &next, &dev80,
						      &bytes),
			 GPUCMD_EPOOLSINUSE);
	ck_assert_uint_eq(bytes, 0);
	memory_manager_release(mm, z);
	/* A bad layout is refused and the old one kept. */
	ck_assert_int_eq(memory_manager_install_pools(mm, &bad, &dev80, NULL),
			 GPUCMD_EINVAL);
	ck_assert_uint_eq(memory_manager_report(mm, r, 8), 8);
	/* An open capture keeps the pools too. */
	memory_manager_set_capture(mm, true);
	ck_assert_int_eq(memory_manager_install_pools(mm, &next, &dev80,
						      &bytes),
			 GPUCMD_EPOOLSINUSE);
	memory_manager_set_capture(mm, false);
	ck_assert_int_eq(memory_manager_install_pools(mm, &next, &dev80,
						      &bytes),
			 0);
	ck_assert_uint_eq(memory_manager_report(mm, r, 8), 3);
	ck_assert_int_eq(r[0].kind, MEMORY_POOL_SLICED);
	ck_assert_uint_eq(r[0].pages_peak, 0);
	ck_assert_int_eq(r[1].kind, MEMORY_POOL_DIRECT);
	/* The persistent pool and its live slice survive the rebuild. */
	ck_assert_int_eq(r[2].kind, MEMORY_POOL_PERSISTENT);
	ck_assert_uint_eq(r[2].usage.allocations, 1);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 5120);
	ck_assert_uint_eq(fs.nlive, 1);
	ck_assert_uint_eq(memory_manager_max_alloc(mm), UINT64_MAX - 511);
	take(mm, 30 * GIB);
	memory_manager_release(mm, per);
	memory_manager_cleanup(mm, true);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 30 * GIB);
	finish(mm);
}
END_TEST

START_TEST(capture_blocks_cleanup)
{
	struct memory_pool_options p[1] = { exclusive(1 * MIB, 5) };
	struct memory_configuration c = custom(1, p);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_slice *a;

	/* A period of 5 checks on every reservation. */
	a = take(mm, 4096);
	memory_manager_release(mm, a);
	memory_manager_set_capture(mm, true);
	take(mm, 100 * KIB);
	memory_manager_cleanup(mm, true);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 4096 + 100 * KIB);
	memory_manager_set_capture(mm, false);
	/* The next reservation's periodic check frees the idle page. */
	take(mm, 200 * KIB);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 100 * KIB + 200 * KIB);
	finish(mm);
}
END_TEST

START_TEST(periodic_through_manager)
{
	/* A period of 10 checks every second reservation. */
	struct memory_pool_options p[2] = {
		exclusive(1 * MIB, 10),
		sliced(1 * MIB, 0, 0),
	};
	struct memory_configuration c = custom(2, p);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_slice *a;

	a = take(mm, 8192);
	memory_manager_release(mm, a);
	memory_manager_cleanup(mm, false);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 8192);
	take(mm, 100);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 512);
	finish(mm);
}
END_TEST

START_TEST(periodic_when_due)
{
	/* A period of 500 checks every 100 reservations, first at clock 100. */
	struct memory_pool_options p[2] = {
		exclusive(1 * MIB, 500),
		direct(0),
	};
	struct memory_configuration c = custom(2, p);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_slice *a;
	int i;

	a = take(mm, 4096);
	memory_manager_release(mm, a);
	a = take(mm, 2 * MIB);
	memory_manager_release(mm, a);
	for (i = 2; i < 99; i++)
		memory_manager_release(mm, take(mm, 2 * MIB));
	ck_assert_uint_eq(usage(mm).bytes_reserved, 4096 + 2 * MIB);
	/* The hundredth reservation is due: the never-reused 4 KiB goes. */
	memory_manager_release(mm, take(mm, 2 * MIB));
	ck_assert_uint_eq(usage(mm).bytes_reserved, 2 * MIB);
	finish(mm);
}
END_TEST

/*
 * Reclaim before growth.  The layout: pool 0 slices 1 MiB pages (up to
 * 256 KiB), pool 1 gives larger requests an allocation each.  The manager
 * returns memory only when growing would take reserved over 9/8 of the
 * most ever live, only what has been idle for 64 reservations, and stops
 * returning what a pool needs back within 1024 reservations.
 */
static struct memory_manager *reclaim_setup(uint64_t peak,
					    struct memory_slice **small)
{
	struct memory_pool_options p[2] = {
		sliced(1 * MIB, 256 * KIB, 0),
		exclusive(64 * MIB, 0),
	};
	struct memory_configuration c = custom(2, p);
	struct memory_manager *mm = make(&c, &dev80);
	int i;

	/* Clock 1: the high-water mark of live memory. */
	memory_manager_release(mm, take(mm, peak));
	/* Clocks 2-9: two pages of pool 0, idle from clock 9. */
	for (i = 0; i < 8; i++)
		small[i] = take(mm, 256 * KIB);
	for (i = 0; i < 8; i++)
		memory_manager_release(mm, small[i]);
	ck_assert_uint_eq(usage(mm).bytes_reserved, peak + 2 * MIB);
	return mm;
}

/* n reservations that reuse the peak allocation: the clock moves on. */
static void reclaim_filler(struct memory_manager *mm, uint64_t peak, int n)
{
	while (n-- > 0)
		memory_manager_release(mm, take(mm, peak));
}

static uint64_t pool_pages(struct memory_manager *mm, size_t i)
{
	struct memory_pool_report r[3];

	memory_manager_report(mm, r, 3);
	return r[i].pages;
}

START_TEST(reclaim_idle_pages)
{
	struct memory_slice *s[8];
	struct memory_manager *mm = reclaim_setup(4 * MIB, s);
	struct memory_slice *y;

	reclaim_filler(mm, 4 * MIB, 80);
	/*
	 * Clock 90: 3 MiB needs a new allocation, and 4 + 2 + 3 MiB is over
	 * 4.5.  Pool 0's pages have been idle 81 reservations: they go.  The
	 * 4 MiB allocation, free since clock 89, stays.
	 */
	y = take(mm, 3 * MIB);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 4 * MIB + 3 * MIB);
	ck_assert_uint_eq(pool_pages(mm, 0), 0);
	ck_assert_uint_eq(fs.nlive, 2);
	memory_manager_release(mm, y);
	/* Long after, pool 0 grows again: not a regret; the 3 MiB goes. */
	reclaim_filler(mm, 4 * MIB, 1100);
	s[0] = take(mm, 256 * KIB);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 4 * MIB + 1 * MIB);
	ck_assert_uint_eq(pool_pages(mm, 1), 1);
	memory_manager_release(mm, s[0]);
	/* An explicit cleanup still returns everything free. */
	memory_manager_cleanup(mm, true);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 0);
	finish(mm);
}
END_TEST

START_TEST(reclaim_only_what_is_needed)
{
	struct memory_slice *s[8];
	struct memory_manager *mm = reclaim_setup(16 * MIB, s);

	reclaim_filler(mm, 16 * MIB, 80);
	/*
	 * 16 + 2 + 0.5 MiB against a mark of 18 MiB: one idle page is
	 * enough, so the other stays.
	 */
	take(mm, 512 * KIB);
	ck_assert_uint_eq(pool_pages(mm, 0), 1);
	ck_assert_uint_eq(usage(mm).bytes_reserved,
			  16 * MIB + 1 * MIB + 512 * KIB);
	finish(mm);
}
END_TEST

START_TEST(reclaim_waits_for_idle)
{
	struct memory_slice *s[8];
	struct memory_manager *mm = reclaim_setup(4 * MIB, s);

	reclaim_filler(mm, 4 * MIB, 79);
	/* Clock 89: the first page is used again, and idle only from 89. */
	memory_manager_release(mm, take(mm, 256 * KIB));
	take(mm, 3 * MIB);
	ck_assert_uint_eq(pool_pages(mm, 0), 1);
	ck_assert_uint_eq(usage(mm).bytes_reserved,
			  4 * MIB + 1 * MIB + 3 * MIB);
	finish(mm);
}
END_TEST

START_TEST(reclaim_not_while_capturing)
{
	struct memory_slice *s[8];
	struct memory_manager *mm = reclaim_setup(4 * MIB, s);

	reclaim_filler(mm, 4 * MIB, 80);
	/* The captured graph may name the idle pages: they stay. */
	memory_manager_set_capture(mm, true);
	take(mm, 3 * MIB);
	ck_assert_uint_eq(pool_pages(mm, 0), 2);
	ck_assert_uint_eq(usage(mm).bytes_reserved,
			  4 * MIB + 2 * MIB + 3 * MIB);
	memory_manager_set_capture(mm, false);
	finish(mm);
}
END_TEST

START_TEST(reclaim_regret)
{
	struct memory_slice *s[8];
	struct memory_manager *mm = reclaim_setup(4 * MIB, s);
	struct memory_slice *y;
	int i;

	reclaim_filler(mm, 4 * MIB, 80);
	y = take(mm, 3 * MIB);
	ck_assert_uint_eq(pool_pages(mm, 0), 0);
	memory_manager_release(mm, y);
	/*
	 * Pool 0 needs its pages back 81 reservations after the trim, with
	 * no more memory live than before it: the trim bought nothing.  From
	 * now on the manager keeps 9/8 of what it holds then (8 MiB), so the
	 * idle 3 MiB allocation stays where a trim would have taken it.
	 */
	reclaim_filler(mm, 4 * MIB, 80);
	for (i = 0; i < 8; i++)
		s[i] = take(mm, 256 * KIB);
	ck_assert_uint_eq(pool_pages(mm, 0), 2);
	ck_assert_uint_eq(pool_pages(mm, 1), 2);
	ck_assert_uint_eq(usage(mm).bytes_reserved,
			  4 * MIB + 3 * MIB + 2 * MIB);
	for (i = 0; i < 8; i++)
		memory_manager_release(mm, s[i]);
	finish(mm);
}
END_TEST

START_TEST(cursor_and_report)
{
	struct memory_configuration c = preset(MEMORY_PRESET_SUBSLICES);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_pool_report r[4];
	struct memory_slice *s;

	s = take(mm, 5000);
	ck_assert_uint_eq(memory_slice_cursor(s), 0);
	memory_slice_set_cursor(s, 42);
	ck_assert_uint_eq(memory_slice_cursor(s), 42);
	memory_manager_release(mm, s);
	s = take(mm, 5000);
	ck_assert_uint_eq(memory_slice_cursor(s), 0);
	memset(r, 0xab, sizeof(r));
	ck_assert_uint_eq(memory_manager_report(mm, r, 3), 8);
	ck_assert_int_eq(r[1].kind, MEMORY_POOL_SLICED);
	ck_assert_uint_eq(r[1].usage.bytes_in_use, 5000);
	ck_assert_uint_eq(r[1].usage.bytes_padding, 120);
	ck_assert_uint_eq(r[1].largest_alloc, 5000);
	ck_assert_uint_eq(r[1].pages, 1);
	ck_assert_uint_eq(r[1].pages_peak, 1);
	ck_assert_uint_eq(r[1].largest_free, 20 * MIB - 5120);
	ck_assert_uint_eq(r[3].page_size, 0xababababababababULL);
	ck_assert_uint_eq(memory_manager_report(mm, NULL, 0), 8);
	memory_manager_release(mm, NULL);
	ck_assert_str_eq(memory_pool_kind_name(MEMORY_POOL_SLICED), "sliced");
	ck_assert_str_eq(memory_pool_kind_name(MEMORY_POOL_EXCLUSIVE),
			 "exclusive");
	ck_assert_str_eq(memory_pool_kind_name(MEMORY_POOL_PERSISTENT),
			 "persistent");
	ck_assert_str_eq(memory_pool_kind_name(MEMORY_POOL_DIRECT), "direct");
	ck_assert_str_eq(memory_pool_kind_name(0), "unknown");
	finish(mm);
}
END_TEST

START_TEST(destroy_with_live_slices)
{
	struct memory_configuration c = preset(MEMORY_PRESET_SUBSLICES);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_alloc a = { 0 };
	int i;

	for (i = 0; i < 100; i++)
		take(mm, (uint64_t)i * 12345 * (i % 7 + 1));
	take(mm, 10 * GIB);
	memory_manager_mode(mm, MEMORY_MODE_PERSISTENT);
	take(mm, 30 * GIB);
	ck_assert_int_eq(memory_manager_reserve(mm, UINT64_MAX, &a),
			 GPUCMD_ETOOBIG);
	ck_assert_uint_gt(fs.nlive, 5);
	finish(mm);
	memory_manager_destroy(NULL);
}
END_TEST

/* ---- randomized model test ---------------------------------------------- */

struct model_slice {
	struct memory_slice *slice;
	uint64_t ptr;
	uint64_t size;
	uint64_t effective;
	uint64_t cursor;
	bool persistent;
};

struct model {
	struct memory_manager *mm;
	struct model_slice *live;
	size_t nlive;
	uint64_t windows;
	bool capture;
	uint64_t seed;
	uint64_t max_alloc;
	uint64_t pages[MEMORY_MAX_POOLS + 1]; /* sizes to aim near */
	size_t npages;
	uint64_t installs; /* attempted */
	/* What happened, so that a change in the mix cannot go unnoticed. */
	uint64_t n_dynamic, n_persistent, n_too_big, n_refused, n_installed,
		n_busy;
	struct fake_alloc *sorted;  /* scratch for checks */
	struct model_slice *by_ptr; /* scratch for checks */
	/*
	 * Stream order: fences submitted and completed, and the slices
	 * released with release_after whose fence has not completed (their
	 * device allocations must stay).
	 */
	uint64_t submitted, completed, busy_until;
	struct model_slice *busy;
	size_t nbusy;
	uint64_t n_after;
};

static uint64_t rnd(struct model *m)
{
	/* splitmix64 */
	uint64_t z = (m->seed += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static uint64_t rnd_below(struct model *m, uint64_t n)
{
	return n ? rnd(m) % n : 0;
}

static void model_layout_changed(struct model *m)
{
	struct memory_pool_report r[MEMORY_MAX_POOLS + 1];
	size_t n, i;

	m->max_alloc = memory_manager_max_alloc(m->mm);
	n = memory_manager_report(m->mm, r, MEMORY_MAX_POOLS + 1);
	m->npages = 0;
	for (i = 0; i + 1 < n; i++) {
		if (r[i].page_size)
			m->pages[m->npages++] = r[i].page_size;
		if (r[i].max_slice && r[i].max_slice != r[i].page_size)
			m->pages[m->npages++] = r[i].max_slice;
		if (m->npages >= MEMORY_MAX_POOLS - 1)
			break;
	}
}

static uint64_t model_size(struct model *m)
{
	/* A direct pool takes anything; keep the fake address space sane. */
	uint64_t top = m->max_alloc < 64 * GIB ? m->max_alloc : 64 * GIB;
	uint64_t near;

	switch (rnd_below(m, 12)) {
	case 0:
		return 0;
	case 1:
		return 1 + rnd_below(m, 511);
	case 2:
		return 512 + rnd_below(m, 64 * KIB);
	case 3:
		return KIB * (1 + rnd_below(m, 1024));
	case 4:
		return MIB * (1 + rnd_below(m, 64)) + rnd_below(m, 4096);
	case 5:
	case 6:
		/* Near a page or slice limit of some pool: both sides. */
		if (m->npages == 0)
			return 4096;
		near = m->pages[rnd_below(m, m->npages)];
		if (rnd_below(m, 2))
			return near + rnd_below(m, 2048);
		return near > 4096 ? near - rnd_below(m, 4096) : near;
	case 7:
		/* Near the near-page rule: 75-100% of a page. */
		if (m->npages == 0)
			return 4096;
		near = m->pages[rnd_below(m, m->npages)];
		return near - rnd_below(m, near / 4);
	case 8:
		return top - rnd_below(m, 64 * MIB);
	case 9:
		if (rnd_below(m, 8) == 0)
			return top + 1 + rnd_below(m, GIB);
		return 512 * (1 + rnd_below(m, 16));
	default:
		return 1 + rnd_below(m, 8 * KIB);
	}
}

static int cmp_fake(const void *a, const void *b)
{
	const struct fake_alloc *x = a, *y = b;

	return x->ptr < y->ptr ? -1 : x->ptr > y->ptr;
}

static int cmp_slice(const void *a, const void *b)
{
	const struct model_slice *x = a, *y = b;

	return x->ptr < y->ptr ? -1 : x->ptr > y->ptr;
}

/* The device allocation holding ptr, from the storage's own record. */
static const struct fake_alloc *holder(const struct fake_alloc *v, size_t n,
				       uint64_t ptr)
{
	size_t lo = 0, hi = n, mid;

	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (v[mid].ptr <= ptr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo ? &v[lo - 1] : NULL;
}

/* Everything the model knows must hold after every step. */
static void model_check(struct model *m)
{
	struct memory_usage u;
	uint64_t in_use = 0, padding = 0;
	const struct fake_alloc *h;
	size_t i;

	memory_manager_usage(m->mm, &u);
	for (i = 0; i < m->nlive; i++) {
		in_use += m->live[i].size;
		padding += m->live[i].effective - m->live[i].size;
	}
	expect(u.allocations == m->nlive);
	expect(u.bytes_in_use == in_use);
	expect(u.bytes_padding == padding);
	expect(u.bytes_reserved == fs.bytes);
	expect(u.bytes_reserved >= u.bytes_in_use + u.bytes_padding);
	expect(memory_manager_largest_free(m->mm) <=
	       u.bytes_reserved - u.bytes_in_use - u.bytes_padding);
	expect(memory_manager_current_mode(m->mm) ==
	       (m->windows ? MEMORY_MODE_PERSISTENT : MEMORY_MODE_AUTO));

	if (fs.nlive)
		memcpy(m->sorted, fs.live, fs.nlive * sizeof(*fs.live));
	qsort(m->sorted, fs.nlive, sizeof(*m->sorted), cmp_fake);
	memcpy(m->by_ptr, m->live, m->nlive * sizeof(*m->live));
	qsort(m->by_ptr, m->nlive, sizeof(*m->by_ptr), cmp_slice);
	for (i = 0; i < m->nlive; i++) {
		const struct model_slice *s = &m->by_ptr[i];

		expect(s->ptr % ALIGN == 0);
		expect(s->effective >= 512 && s->effective >= s->size);
		/* Effective ranges are disjoint, zero-byte slices included. */
		if (i > 0)
			expect(m->by_ptr[i - 1].ptr +
				       m->by_ptr[i - 1].effective <=
			       s->ptr);
		h = holder(m->sorted, fs.nlive, s->ptr);
		expect(h != NULL);
		expect(s->ptr + s->effective <= h->ptr + h->size);
		expect(memory_slice_cursor(s->slice) == s->cursor);
	}
	for (i = 0; i < m->nbusy; i++) {
		const struct model_slice *s = &m->busy[i];

		h = holder(m->sorted, fs.nlive, s->ptr);
		expect(h != NULL && s->ptr + s->effective <= h->ptr + h->size);
	}
	expect(memory_manager_busy(m->mm) == (m->busy_until > m->completed));
}

/* Fences complete: forget the busy slices they covered. */
static void model_complete(struct model *m, uint64_t upto)
{
	size_t i, kept = 0;

	m->completed = upto;
	for (i = 0; i < m->nbusy; i++)
		if (m->busy[i].cursor > upto)
			m->busy[kept++] = m->busy[i];
	m->nbusy = kept;
}

/* With nothing live, every sliced page is one free block again. */
static void model_check_merged(struct model *m)
{
	struct memory_pool_report r[MEMORY_MAX_POOLS + 1];
	uint64_t largest = 0;
	size_t n, i;

	n = memory_manager_report(m->mm, r, MEMORY_MAX_POOLS + 1);
	for (i = 0; i < n; i++) {
		if (r[i].kind == MEMORY_POOL_SLICED && r[i].pages > 0)
			ck_assert_uint_eq(r[i].largest_free, r[i].page_size);
		ck_assert_uint_eq(r[i].usage.allocations, 0);
	}
	for (i = 0; i < fs.nlive; i++)
		if (fs.live[i].size > largest)
			largest = fs.live[i].size;
	ck_assert_uint_eq(memory_manager_largest_free(m->mm), largest);
}

static void model_reserve(struct model *m)
{
	struct memory_alloc a = { 0 };
	uint64_t size = model_size(m);
	bool persistent = m->windows > 0;
	struct model_slice *s;
	int rc;

	rc = memory_manager_reserve(m->mm, size, &a);
	if (!persistent && size > m->max_alloc) {
		expect(rc == GPUCMD_ETOOBIG);
		m->n_too_big++;
		return;
	}
	if (fs.fail) {
		expect(rc == 0 || rc == GPUCMD_ENOMEM);
		m->n_refused += rc != 0;
		if (rc)
			return;
	}
	expect(rc == 0);
	if (persistent)
		m->n_persistent++;
	else
		m->n_dynamic++;
	expect(a.size == size && a.slice != NULL);
	s = &m->live[m->nlive++];
	s->slice = a.slice;
	s->ptr = a.ptr;
	s->size = size;
	s->effective = size == 0 ? ALIGN : (size + ALIGN - 1) / ALIGN * ALIGN;
	/*
	 * A dedicated pool may lend a larger free allocation (exclusive:
	 * under 1.25 times the size): all of it is the slice's, as padding.
	 */
	expect(a.slice->effective >= s->effective);
	expect(a.slice->effective - s->effective <= s->effective / 4 + ALIGN);
	s->effective = a.slice->effective;
	s->persistent = persistent;
	s->cursor = 0;
	if (rnd_below(m, 2)) {
		s->cursor = rnd(m);
		memory_slice_set_cursor(a.slice, s->cursor);
	}
}

static void model_release(struct model *m)
{
	size_t i;

	if (m->nlive == 0)
		return;
	i = (size_t)rnd_below(m, m->nlive);
	if (rnd_below(m, 2)) {
		/* Work up to the next fence may still use it. */
		struct model_slice *b = &m->busy[m->nbusy++];

		*b = m->live[i];
		b->cursor = m->submitted + 1; /* the fence */
		if (b->cursor > m->busy_until)
			m->busy_until = b->cursor;
		memory_manager_release_after(m->mm, m->live[i].slice,
					     b->cursor);
		/* A fence completed already leaves nothing busy. */
		if (b->cursor <= m->completed)
			m->nbusy--;
		m->n_after++;
	} else {
		memory_manager_release(m->mm, m->live[i].slice);
	}
	m->live[i] = m->live[--m->nlive];
}

static void model_install(struct model *m,
			  const struct memory_configuration *next)
{
	uint64_t bytes = 0, dyn_bytes = 0;
	size_t i, dyn = 0;
	int rc;

	for (i = 0; i < m->nlive; i++) {
		if (!m->live[i].persistent) {
			dyn++;
			dyn_bytes += m->live[i].size;
		}
	}
	rc = memory_manager_install_pools(m->mm, next, &dev80, &bytes);
	if (dyn > 0 || m->capture || m->busy_until > m->completed) {
		expect(rc == GPUCMD_EPOOLSINUSE);
		expect(bytes == dyn_bytes);
		m->n_busy++;
		return;
	}
	expect(rc == 0);
	m->n_installed++;
	model_layout_changed(m);
}

/*
 * One random step.  Persistent windows and captures are opened rarely and
 * closed often, so most reservations exercise the dynamic pools.
 */
static void model_step(struct model *m, const struct memory_configuration *a,
		       const struct memory_configuration *b, int *fail_left)
{
	uint64_t r = rnd_below(m, 1000), reserved;

	/* Keep a few hundred slices live: reserve more when few. */
	if (r < 500 && (m->nlive < 400 || r < 200)) {
		model_reserve(m);
	} else if (r < 950) {
		model_release(m);
	} else if (r < 958) {
		/* The stream ends a batch, or work completes up to one. */
		if (rnd_below(m, 2))
			m->submitted++;
		else if (m->completed < m->submitted)
			model_complete(m,
				       m->completed + 1 +
					       rnd_below(m,
							 m->submitted -
								 m->completed));
	} else if (r < 965) {
		memory_manager_cleanup(m->mm, false);
	} else if (r < 971) {
		reserved = usage(m->mm).bytes_reserved;
		memory_manager_cleanup(m->mm, true);
		if (m->capture)
			expect(usage(m->mm).bytes_reserved == reserved);
	} else if (r < 975) {
		memory_manager_mode(m->mm, MEMORY_MODE_PERSISTENT);
		m->windows++;
	} else if (r < 990) {
		memory_manager_mode(m->mm, MEMORY_MODE_AUTO);
		if (m->windows)
			m->windows--;
	} else if (r < 991 || (r < 994 && m->capture)) {
		m->capture = !m->capture;
		memory_manager_set_capture(m->mm, m->capture);
	} else if (r < 997) {
		/* Release nearly everything so that installs can succeed. */
		while (m->nlive && rnd_below(m, 16))
			model_release(m);
		if (rnd_below(m, 2))
			model_complete(m, m->submitted + 1);
		if (m->nlive == 0)
			model_check_merged(m);
		model_install(m, m->installs++ % 2 ? a : b);
	} else {
		fs.fail = true;
		*fail_left = 1 + (int)rnd_below(m, 20);
	}
}

static void model_run(const struct memory_configuration *first,
		      const struct memory_configuration *second, uint64_t seed,
		      int steps)
{
	struct model m = { .seed = seed };
	struct memory_usage before;
	int step, fail_left = 0;

	m.mm = make(first, &dev80);
	m.live = calloc((size_t)steps + 1, sizeof(*m.live));
	m.by_ptr = calloc((size_t)steps + 1, sizeof(*m.by_ptr));
	m.sorted = calloc((size_t)steps + 64, sizeof(*m.sorted));
	m.busy = calloc((size_t)steps + 1, sizeof(*m.busy));
	ck_assert(m.live && m.by_ptr && m.sorted && m.busy);
	memory_manager_set_completed(m.mm, &m.completed);
	model_layout_changed(&m);
	for (step = 0; step < steps; step++) {
		model_step(&m, first, second, &fail_left);
		if (fail_left > 0 && --fail_left == 0)
			fs.fail = false;
		model_check(&m);
	}
	fs.fail = false;
	while (m.nlive)
		model_release(&m);
	model_check(&m);
	model_check_merged(&m);
	m.capture = false;
	memory_manager_set_capture(m.mm, false);
	model_complete(&m, m.submitted + 1);
	memory_manager_cleanup(m.mm, true);
	model_check(&m);
	before = usage(m.mm);
	ck_assert_uint_eq(before.allocations, 0);
	ck_assert_uint_eq(before.bytes_in_use, 0);
	ck_assert_uint_eq(before.bytes_padding, 0);
	ck_assert_uint_eq(before.bytes_reserved, 0);
	ck_assert_uint_eq(memory_manager_largest_free(m.mm), 0);
	ck_assert_uint_eq(fs.nlive, 0);
	ck_assert_uint_gt(fs.allocs, 100);
	ck_assert_uint_gt(m.n_dynamic, 2 * m.n_persistent);
	ck_assert_uint_gt(m.n_persistent, 200);
	ck_assert_uint_gt(m.n_too_big, 20);
	ck_assert_uint_gt(m.n_refused, 5);
	ck_assert_uint_gt(m.n_installed, 5);
	ck_assert_uint_gt(m.n_busy, 5);
	ck_assert_uint_gt(m.n_after, 1000);
	free(m.busy);
	free(m.live);
	free(m.by_ptr);
	free(m.sorted);
	finish(m.mm);
}

START_TEST(model_subslices)
{
	struct memory_pool_options p[4] = {
		sliced(64 * KIB, 16 * KIB, 256 * KIB),
		sliced(1 * MIB, 256 * KIB, 0),
		exclusive(4 * MIB, 50),
		direct(64 * MIB),
	};
	struct memory_configuration a = preset(MEMORY_PRESET_SUBSLICES);
	struct memory_configuration b = custom(4, p);

	model_run(&a, &b, 0x5eed, 20000);
}
END_TEST

START_TEST(model_custom)
{
	struct memory_pool_options p[4] = {
		sliced(64 * KIB, 16 * KIB, 256 * KIB),
		sliced(1 * MIB, 256 * KIB, 0),
		exclusive(4 * MIB, 50),
		direct(64 * MIB),
	};
	struct memory_configuration a = custom(4, p);
	struct memory_configuration b = preset(MEMORY_PRESET_EXCLUSIVE_PAGES);

	model_run(&a, &b, 0xfeed, 20000);
}
END_TEST

/*
 * Stream-ordered reuse: a slice released with a fence the owner stream has
 * not completed is free for the next reservation at once, but no device
 * allocation holding it goes back to the storage (cleanup, trim, periodic
 * or watermark frees, a new layout) until the fence has completed.  Every
 * pool kind: sliced, exclusive, direct and persistent.
 */
START_TEST(release_after_reuses_at_once)
{
	struct memory_pool_options p[3] = {
		sliced(1 * MIB, 256 * KIB, 0),
		exclusive(4 * MIB, 5),
		direct(0),
	};
	static const uint64_t sizes[4] = { 100 * KIB, 2 * MIB, 32 * MIB,
					   3 * MIB };
	struct memory_configuration c = custom(3, p);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_slice *a, *b;
	uint64_t completed = 0, fence = 0, reserved, in_use = 7;

	memory_manager_set_completed(mm, &completed);
	for (int k = 0; k < 4; k++) {
		/* The last size goes to the persistent pool. */
		if (k == 3)
			memory_manager_mode(mm, MEMORY_MODE_PERSISTENT);
		a = take(mm, sizes[k]);
		memory_manager_release_after(mm, a, ++fence);
		ck_assert_uint_eq(usage(mm).allocations, 0);
		b = take(mm, sizes[k]);
		ck_assert_ptr_eq(b, a);
		memory_manager_release_after(mm, b, ++fence);
	}
	memory_manager_mode(mm, MEMORY_MODE_AUTO);
	reserved = usage(mm).bytes_reserved;
	ck_assert_uint_eq(reserved, 1 * MIB + 2 * MIB + 32 * MIB + 3 * MIB);
	ck_assert_uint_eq(fs.nlive, 4);
	ck_assert(memory_manager_busy(mm));
	/* Nothing goes back while the device may still be reading it ... */
	memory_manager_cleanup(mm, true);
	ck_assert_uint_eq(usage(mm).bytes_reserved, reserved);
	ck_assert_int_eq(memory_manager_install_pools(mm, &c, &dev80, &in_use),
			 GPUCMD_EPOOLSINUSE);
	ck_assert_uint_eq(in_use, 0);
	/* Each allocation goes once its own last fence passed. */
	completed = fence - 1;
	memory_manager_cleanup(mm, true);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 3 * MIB);
	ck_assert(memory_manager_busy(mm));
	completed = fence;
	ck_assert(!memory_manager_busy(mm));
	memory_manager_cleanup(mm, true);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 0);
	ck_assert_uint_eq(fs.nlive, 0);
	ck_assert_int_eq(memory_manager_install_pools(mm, &c, &dev80, NULL), 0);
	finish(mm);
}
END_TEST

/*
 * What a reservation reused of busy memory (memory_manager_take_reused,
 * which command_reserve's bound on released memory trusts) is what the
 * block it came from held, not its page: in a 1 MiB page, K, A and L of
 * 256 KiB each, A released behind fence 1; 256 KiB take A's place (all of
 * it reused), and 256 KiB more come from the never used rest of the page
 * (nothing reused: it counted as reused because A's release made the page
 * busy).  What merges with a busy block stays busy, as a whole.
 */
START_TEST(reuse_counts_the_busy_block_not_its_page)
{
	struct memory_pool_options p[1] = { sliced(1 * MIB, 512 * KIB, 0) };
	struct memory_configuration c = custom(1, p);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_slice *k, *a, *l, *x, *y, *z;
	uint64_t completed = 0, at;

	memory_manager_set_completed(mm, &completed);
	k = take(mm, 256 * KIB);
	a = take(mm, 256 * KIB);
	l = take(mm, 256 * KIB);
	at = a->ptr;
	(void)memory_manager_take_reused(mm);
	memory_manager_release_after(mm, a, 1);
	x = take(mm, 256 * KIB);
	ck_assert_uint_eq(x->ptr, at);
	ck_assert_uint_eq(memory_manager_take_reused(mm), 256 * KIB);
	y = take(mm, 256 * KIB);
	ck_assert_uint_eq(memory_manager_take_reused(mm), 0);
	/* x, released behind fence 2 between live k and l, merges with l. */
	memory_manager_release_after(mm, x, 2);
	memory_manager_release(mm, l);
	z = take(mm, 512 * KIB);
	ck_assert_uint_eq(z->ptr, at);
	ck_assert_uint_eq(memory_manager_take_reused(mm), 512 * KIB);
	memory_manager_release(mm, z);
	memory_manager_release(mm, y);
	memory_manager_release(mm, k);
	completed = 2;
	finish(mm);
}
END_TEST

/* A slice used again and released plainly keeps its page busy. */
START_TEST(release_after_then_plain_release)
{
	struct memory_pool_options p[2] = {
		sliced(1 * MIB, 256 * KIB, 0),
		exclusive(4 * MIB, 0),
	};
	struct memory_configuration c = custom(2, p);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_slice *a;
	uint64_t completed = 0;

	memory_manager_set_completed(mm, &completed);
	memory_manager_release_after(mm, take(mm, 64 * KIB), 1);
	memory_manager_release_after(mm, take(mm, 2 * MIB), 1);
	/* A reservation that fails to bind is released at once. */
	a = take(mm, 64 * KIB);
	memory_manager_release(mm, a);
	memory_manager_release(mm, take(mm, 2 * MIB));
	memory_manager_cleanup(mm, true);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 1 * MIB + 2 * MIB);
	completed = 1;
	memory_manager_cleanup(mm, true);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 0);
	finish(mm);
}
END_TEST

/* Without a completed count, release_after is a plain release. */
START_TEST(release_after_without_completed)
{
	struct memory_manager *mm = make(
		&(struct memory_configuration){
			.preset = MEMORY_PRESET_SUBSLICES },
		&dev80);

	memory_manager_release_after(mm, take(mm, 4 * KIB), 99);
	ck_assert(!memory_manager_busy(mm));
	memory_manager_cleanup(mm, true);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 0);
	finish(mm);
}
END_TEST

/* Reclaim before growth leaves busy pages alone, and takes them after. */
START_TEST(reclaim_skips_busy)
{
	struct memory_pool_options p[2] = {
		sliced(1 * MIB, 256 * KIB, 0),
		exclusive(64 * MIB, 0),
	};
	struct memory_configuration c = custom(2, p);
	struct memory_manager *mm = make(&c, &dev80);
	struct memory_slice *s[8], *y;
	uint64_t completed = 0;
	int i;

	memory_manager_set_completed(mm, &completed);
	memory_manager_release(mm, take(mm, 4 * MIB));
	for (i = 0; i < 8; i++)
		s[i] = take(mm, 256 * KIB);
	for (i = 0; i < 8; i++)
		memory_manager_release_after(mm, s[i], 1);
	reclaim_filler(mm, 4 * MIB, 80);
	/* reclaim_idle_pages would trim both pages here. */
	y = take(mm, 3 * MIB);
	ck_assert_uint_eq(pool_pages(mm, 0), 2);
	memory_manager_release(mm, y);
	completed = 1;
	reclaim_filler(mm, 4 * MIB, 80);
	y = take(mm, 5 * MIB);
	ck_assert_uint_eq(pool_pages(mm, 0), 0);
	memory_manager_release(mm, y);
	finish(mm);
}
END_TEST

/* The exclusive pool's periodic frees and the direct watermark wait too. */
START_TEST(periodic_and_watermark_skip_busy)
{
	struct memory_pool_options p[2] = {
		exclusive(1 * MIB, 5),
		direct(3 * MIB),
	};
	struct memory_configuration c = custom(2, p);
	struct memory_manager *mm = make(&c, &dev80);
	uint64_t completed = 0;

	memory_manager_set_completed(mm, &completed);
	/* A period of 5 checks on every reservation. */
	memory_manager_release_after(mm, take(mm, 4096), 1);
	take(mm, 100 * KIB);
	ck_assert_uint_eq(usage(mm).bytes_reserved, 4096 + 100 * KIB);
	/* Direct: 2 + 1.5 MiB is over the 3 MiB mark, but 2 MiB is busy. */
	memory_manager_release_after(mm, take(mm, 2 * MIB), 1);
	take(mm, 3 * MIB / 2);
	ck_assert_uint_eq(usage(mm).bytes_reserved,
			  4096 + 100 * KIB + 2 * MIB + 3 * MIB / 2);
	completed = 1;
	take(mm, 200 * KIB);
	take(mm, 1 * MIB + 512);
	ck_assert_uint_eq(usage(mm).bytes_reserved,
			  100 * KIB + 200 * KIB + 3 * MIB / 2 + 1 * MIB + 512);
	finish(mm);
}
END_TEST

static Suite *memory_manager_suite(void)
{
	Suite *s = suite_create("memory_manager");
	TCase *tc;

	tc = tcase_create("config");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, resolve_rejects);
	tcase_add_test(tc, resolve_normalises);
	tcase_add_test(tc, subslices_layout_80g);
	tcase_add_test(tc, subslices_layout_24g);
	tcase_add_test(tc, subslices_layout_min_page);
	tcase_add_test(tc, exclusive_pages_layout);
	suite_add_tcase(s, tc);

	tc = tcase_create("routing");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, routing_subslices);
	tcase_add_test(tc, routing_within_bit_lengths);
	tcase_add_test(tc, persistent_mode);
	tcase_add_test(tc, capacity_spill);
	tcase_add_test(tc, capacity_exceeded);
	tcase_add_test(tc, storage_refusal);
	tcase_add_test(tc, destroy_with_live_slices);
	suite_add_tcase(s, tc);

	tc = tcase_create("lifecycle");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, pools_in_use);
	tcase_add_test(tc, capture_blocks_cleanup);
	tcase_add_test(tc, periodic_through_manager);
	tcase_add_test(tc, periodic_when_due);
	tcase_add_test(tc, reclaim_idle_pages);
	tcase_add_test(tc, reclaim_only_what_is_needed);
	tcase_add_test(tc, reclaim_waits_for_idle);
	tcase_add_test(tc, reclaim_not_while_capturing);
	tcase_add_test(tc, reclaim_regret);
	tcase_add_test(tc, cursor_and_report);
	suite_add_tcase(s, tc);

	tc = tcase_create("ordered");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, release_after_reuses_at_once);
	tcase_add_test(tc, release_after_then_plain_release);
	tcase_add_test(tc, reuse_counts_the_busy_block_not_its_page);
	tcase_add_test(tc, release_after_without_completed);
	tcase_add_test(tc, reclaim_skips_busy);
	tcase_add_test(tc, periodic_and_watermark_skip_busy);
	suite_add_tcase(s, tc);

	tc = tcase_create("model");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, model_subslices);
	tcase_add_test(tc, model_custom);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_main(memory_manager_suite());
}
