/*
 * check_module.c - unit tests of the daemon's module cache (daemon/module.c)
 * over a fake backend that counts loads and unloads: one compile per
 * content, eviction of the module unused longest when the cache is full,
 * never of one somebody holds (a connection's id, a graph, an unload whose
 * launches have not run), and a clear refusal when every module is held.
 *
 * The host backend cannot load modules, so this is where the cache's
 * policy is tested without a GPU.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"
#include "gpucmd.h"
#include "module.h"
#include "module_image.h"
#include "service.h"
#include "unit.h"

/* A loaded fake module: which content it came from. */
struct driver_module {
	uint32_t tag;
};

static unsigned loads, unloads;
static uint32_t unloaded_tags[16];

static int fake_load(struct driver *d, enum driver_module_format fmt,
		     const void *data, size_t len, struct driver_module **out,
		     char *log, size_t log_len)
{
	struct driver_module *m = malloc(sizeof(*m));

	(void)d;
	(void)fmt;
	(void)log;
	(void)log_len;
	if (m == NULL)
		return GPUCMD_ENOMEM;
	m->tag = 0;
	memcpy(&m->tag, data, len < sizeof(m->tag) ? len : sizeof(m->tag));
	loads++;
	*out = m;
	return 0;
}

static void fake_unload(struct driver *d, struct driver_module *m)
{
	(void)d;
	if (unloads < 16)
		unloaded_tags[unloads] = m->tag;
	unloads++;
	free(m);
}

static const struct driver_ops fake_ops = {
	.module_load = fake_load,
	.module_unload = fake_unload,
};

static struct driver fake = { .ops = &fake_ops };
static struct module_cache *cache;

static void setup(void)
{
	loads = unloads = 0;
	memset(unloaded_tags, 0, sizeof(unloaded_tags));
	ck_assert_int_eq(module_cache_create(&fake, &cache), 0);
}

static void teardown(void)
{
	module_cache_destroy(cache);
	cache = NULL;
}

/* Get the module whose content is the 4 bytes of tag. */
static int get(uint32_t tag, struct module_entry **out, char *err,
	       size_t err_len)
{
	char log[64], mine[256];

	if (err == NULL) {
		err = mine;
		err_len = sizeof(mine);
	}
	return module_cache_get(cache, DRIVER_MODULE_PTX, &tag, sizeof(tag), 1,
				NULL, out, err, err_len, log, sizeof(log));
}

static struct module_entry *get_ok(uint32_t tag)
{
	struct module_entry *e = NULL;
	char err[256];

	ck_assert_msg(get(tag, &e, err, sizeof(err)) == 0, "tag %u: %s", tag,
		      err);
	ck_assert_ptr_nonnull(e);
	return e;
}

START_TEST(same_content_compiles_once)
{
	struct module_entry *a = get_ok(1), *b = get_ok(1), *c = get_ok(2);
	uint64_t loaded, hits, evicted;

	ck_assert_ptr_eq(a, b);
	ck_assert_ptr_ne(a, c);
	ck_assert_uint_eq(loads, 2);
	module_cache_stats(cache, &loaded, &hits, &evicted);
	ck_assert_uint_eq(loaded, 2);
	ck_assert_uint_eq(hits, 1);
	ck_assert_uint_eq(evicted, 0);
	ck_assert_uint_eq(module_cache_count(cache), 2);
	/* Unreferenced, it stays compiled for the next sender. */
	module_cache_put(cache, a);
	module_cache_put(cache, b);
	ck_assert_ptr_eq(get_ok(1), a);
	ck_assert_uint_eq(loads, 2);
	ck_assert_uint_eq(unloads, 0);
}
END_TEST

/*
 * Full of held modules, a new one is refused with the reason; once one is
 * put back, the next new module takes its place and the count stays at
 * the limit.
 */
START_TEST(full_cache_evicts_only_what_nobody_holds)
{
	static struct module_entry *e[MODULE_CACHE_MAX];
	struct module_entry *x = NULL;
	uint64_t loaded, hits, evicted;
	char err[256];

	for (uint32_t i = 0; i < MODULE_CACHE_MAX; i++)
		e[i] = get_ok(100 + i);
	ck_assert_uint_eq(module_cache_count(cache), MODULE_CACHE_MAX);
	ck_assert_int_eq(get(5, &x, err, sizeof(err)), GPUCMD_ELIMIT);
	ck_assert_msg(strstr(err, "every one is in use") != NULL, "%s", err);
	ck_assert_msg(strstr(err, "max_modules") != NULL, "%s", err);
	ck_assert_uint_eq(unloads, 0);
	/* Content already cached is still found when full. */
	ck_assert_ptr_eq(get_ok(100 + 7), e[7]);
	module_cache_put(cache, e[7]);

	module_cache_put(cache, e[300]);
	x = get_ok(5);
	ck_assert_uint_eq(unloads, 1);
	ck_assert_uint_eq(unloaded_tags[0], 100 + 300);
	ck_assert_uint_eq(module_cache_count(cache), MODULE_CACHE_MAX);
	module_cache_stats(cache, &loaded, &hits, &evicted);
	ck_assert_uint_eq(loaded, MODULE_CACHE_MAX + 1);
	ck_assert_uint_eq(evicted, 1);
	/* Evicted content compiles again when it comes back. */
	module_cache_put(cache, x);
	ck_assert_ptr_nonnull(get_ok(100 + 300));
	ck_assert_uint_eq(unloads, 2);
	ck_assert_uint_eq(unloaded_tags[1], 5);
	ck_assert_uint_eq(loads, MODULE_CACHE_MAX + 2);
}
END_TEST

/* Of the modules nobody holds, the one used longest ago goes first. */
START_TEST(eviction_takes_the_least_recently_used)
{
	static struct module_entry *e[MODULE_CACHE_MAX];

	for (uint32_t i = 0; i < MODULE_CACHE_MAX; i++)
		e[i] = get_ok(100 + i);
	/* 10 was loaded before 20 but used again after it... */
	module_cache_put(cache, get_ok(100 + 10));
	module_cache_put(cache, e[10]);
	module_cache_put(cache, e[20]);
	/* ...so 20 goes first, then 10. */
	(void)get_ok(1);
	ck_assert_uint_eq(unloads, 1);
	ck_assert_uint_eq(unloaded_tags[0], 100 + 20);
	(void)get_ok(2);
	ck_assert_uint_eq(unloads, 2);
	ck_assert_uint_eq(unloaded_tags[1], 100 + 10);
}
END_TEST

/* A graph's hold (module_cache_hold) keeps a module no id names. */
START_TEST(a_hold_keeps_a_module_loaded)
{
	static struct module_entry *e[MODULE_CACHE_MAX];
	struct module_entry *x = NULL;

	for (uint32_t i = 0; i < MODULE_CACHE_MAX; i++)
		e[i] = get_ok(100 + i);
	module_cache_hold(cache, e[0]); /* the graph */
	module_cache_put(cache, e[0]);	/* the id */
	ck_assert_int_eq(get(5, &x, NULL, 0), GPUCMD_ELIMIT);
	ck_assert_uint_eq(unloads, 0);
	module_cache_put(cache, e[0]); /* the graph is gone */
	(void)get_ok(5);
	ck_assert_uint_eq(unloads, 1);
	ck_assert_uint_eq(unloaded_tags[0], 100);
}
END_TEST

/*
 * A service's max_modules counts distinct modules: a module held by an id,
 * a graph and a pending unload at once counts once, until its last holder
 * lets go; the others keep their places when one leaves.
 */
START_TEST(service_counts_distinct_modules)
{
	struct service *svc = calloc(1, sizeof(*svc));
	static char many[20];
	int a, b, c;

	ck_assert_ptr_nonnull(svc);
	ck_assert_int_eq(service_module_ref(svc, &a, 100), 0); /* an id */
	ck_assert_int_eq(service_module_ref(svc, &a, 100), 0); /* a graph */
	ck_assert_int_eq(service_module_ref(svc, &b, 20), 0);
	ck_assert_int_eq(service_module_ref(svc, &c, 0), 0);
	ck_assert_uint_eq(atomic_load(&svc->modules), 3);
	/* Globals count once per distinct module, as modules do. */
	ck_assert_uint_eq(svc->module_bytes, 120);
	ck_assert(service_module_held(svc, &a));
	service_module_unref(svc, &a);
	ck_assert_uint_eq(atomic_load(&svc->modules), 3);
	ck_assert(service_module_held(svc, &a));
	service_module_unref(svc, &a);
	ck_assert_uint_eq(atomic_load(&svc->modules), 2);
	ck_assert_uint_eq(svc->module_bytes, 20);
	ck_assert(!service_module_held(svc, &a));
	ck_assert(service_module_held(svc, &b));
	ck_assert(service_module_held(svc, &c));
	/* Past the first growth of the table, and back down to none. */
	for (int i = 0; i < 20; i++)
		ck_assert_int_eq(service_module_ref(svc, many + i, 1), 0);
	ck_assert_uint_eq(atomic_load(&svc->modules), 22);
	for (int i = 0; i < 20; i++)
		service_module_unref(svc, many + i);
	service_module_unref(svc, &b);
	service_module_unref(svc, &c);
	ck_assert_uint_eq(atomic_load(&svc->modules), 0);
	ck_assert_uint_eq(svc->module_bytes, 0);
	/* An entry it does not hold changes nothing. */
	service_module_unref(svc, &c);
	ck_assert_uint_eq(atomic_load(&svc->modules), 0);
	free(svc->module_refs);
	free(svc);
}
END_TEST

/* The module of the PTX text (its globals sized) for service owner. */
static struct module_entry *get_text_as(const char *ptx, uint32_t owner)
{
	struct module_entry *e = NULL;
	char err[256], log[64];

	ck_assert_int_eq(module_cache_get(cache, DRIVER_MODULE_PTX, ptx,
					  strlen(ptx), owner, NULL, &e, err,
					  sizeof(err), log, sizeof(log)),
			 0);
	return e;
}

static struct module_entry *get_text(const char *ptx)
{
	return get_text_as(ptx, 1);
}

/*
 * A module with global variables is one copy of them in device memory, so
 * it is shared only by the connections of one service: the same code from
 * another service is loaded again, and found again by each owner (the
 * cache used to hand service 2 the module service 1's kernels had written
 * their globals in).  Code without globals is still compiled once for all.
 */
START_TEST(modules_with_globals_are_shared_within_a_service_only)
{
	const char *g = ".global .u32 counter;", *plain = ".entry f() {}";
	struct module_entry *a1 = get_text_as(g, 1), *a2 = get_text_as(g, 2);
	struct module_entry *p1 = get_text_as(plain, 1);

	ck_assert_ptr_ne(a1, a2);
	ck_assert_uint_eq(loads, 3);
	ck_assert_ptr_eq(get_text_as(g, 1), a1);
	ck_assert_ptr_eq(get_text_as(g, 2), a2);
	ck_assert_ptr_eq(module_cache_lookup(cache, DRIVER_MODULE_PTX, g,
					     strlen(g), 2),
			 a2);
	ck_assert_ptr_null(
		module_cache_lookup(cache, DRIVER_MODULE_PTX, g, strlen(g), 3));
	ck_assert(!module_cache_has(cache, DRIVER_MODULE_PTX, g, strlen(g), 3));
	ck_assert_ptr_eq(get_text_as(plain, 2), p1);
	ck_assert(module_cache_has(cache, DRIVER_MODULE_PTX, plain,
				   strlen(plain), 3));
	ck_assert_uint_eq(loads, 3);
	for (int i = 0; i < 2; i++) {
		module_cache_put(cache, a1);
		module_cache_put(cache, a2);
		module_cache_put(cache, p1);
	}
}
END_TEST

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/*
 * A module whose globals cannot be sized before loading (a fatbin entry
 * in the older, non-zstd compression) may have some: it is shared within
 * its service only, as one with globals is (it counted 0, and so was
 * shared by every service, globals and all).
 */
START_TEST(modules_whose_globals_are_unknown_stay_their_services)
{
	uint8_t img[16 + 0x40 + 64];
	struct module_entry *a = NULL, *b = NULL, *again = NULL;
	enum module_image_known known;
	char err[256], log[64];

	memset(img, 0xab, sizeof(img));
	put_le(img, 0xBA55ED50u, 4); /* fatbin magic */
	put_le(img + 4, 1, 2);
	put_le(img + 6, 16, 2);	       /* header size */
	put_le(img + 8, 0x40 + 64, 8); /* entries' size */
	memset(img + 16, 0, 0x40);
	put_le(img + 16, 2, 2);		    /* kind: ELF */
	put_le(img + 16 + 4, 0x40, 4);	    /* entry header size */
	put_le(img + 16 + 8, 64, 8);	    /* payload size */
	put_le(img + 16 + 0x28, 0x2000, 8); /* the older compression */
	ck_assert_uint_eq(module_image_static_bytes(img, sizeof(img), &known),
			  0);
	ck_assert_int_ne(known, MODULE_IMAGE_KNOWN);
	ck_assert_int_eq(module_cache_get(cache, DRIVER_MODULE_FATBIN, img,
					  sizeof(img), 1, NULL, &a, err,
					  sizeof(err), log, sizeof(log)),
			 0);
	ck_assert_int_eq(module_cache_get(cache, DRIVER_MODULE_FATBIN, img,
					  sizeof(img), 2, NULL, &b, err,
					  sizeof(err), log, sizeof(log)),
			 0);
	ck_assert_ptr_ne(a, b);
	ck_assert_uint_eq(loads, 2);
	ck_assert_int_eq(module_cache_get(cache, DRIVER_MODULE_FATBIN, img,
					  sizeof(img), 1, NULL, &again, err,
					  sizeof(err), log, sizeof(log)),
			 0);
	ck_assert_ptr_eq(again, a);
	module_cache_put(cache, a);
	module_cache_put(cache, again);
	module_cache_put(cache, b);
}
END_TEST

/*
 * The globals of a module nobody references belong to no service: the
 * cache keeps at most MODULE_CACHE_IDLE_BYTES of them, unloading the ones
 * unused longest past that; modules without globals stay as before.
 */
START_TEST(idle_modules_keep_little_device_memory)
{
	struct module_entry *a = get_text(".global .b8 a[41943040];");
	struct module_entry *b = get_text(".global .b8 b[41943040];");
	struct module_entry *small = get_text(".global .u32 counter;");
	struct module_entry *none = get_ok(7);

	ck_assert_uint_eq(module_entry_static_bytes(a), 40u << 20);
	ck_assert_uint_eq(module_entry_static_bytes(small), 4);
	ck_assert_uint_eq(module_entry_static_bytes(none), 0);
	module_cache_put(cache, none);
	module_cache_put(cache, small);
	module_cache_put(cache, a);
	ck_assert_uint_eq(module_cache_idle_bytes(cache), (40u << 20) + 4);
	ck_assert_uint_eq(unloads, 0);
	/* 80 MiB idle is past 64 MiB: a, unused longest of the large, goes. */
	module_cache_put(cache, b);
	ck_assert_uint_eq(unloads, 1);
	ck_assert_uint_eq(module_cache_count(cache), 3);
	ck_assert_uint_eq(module_cache_idle_bytes(cache), (40u << 20) + 4);
	/* Taken again, b's memory is a holder's, not idle. */
	ck_assert_ptr_eq(get_text(".global .b8 b[41943040];"), b);
	ck_assert_uint_eq(module_cache_idle_bytes(cache), 4);
	ck_assert_uint_eq(loads, 4);
	module_cache_put(cache, b);
	ck_assert_uint_eq(module_cache_idle_bytes(cache), (40u << 20) + 4);
}
END_TEST

/*
 * A module whose globals alone are past what idle modules may keep cannot
 * stay loaded once put back: it goes, and only it; the small idle modules
 * used before it stay (LRU alone would unload them first, for nothing).
 */
START_TEST(a_huge_idle_module_goes_alone)
{
	struct module_entry *small = get_text(".global .u32 counter;");
	struct module_entry *mid = get_text(".global .b8 m[8388608];");
	struct module_entry *huge = get_text(".global .b8 h[104857600];");

	module_cache_put(cache, small);
	module_cache_put(cache, mid);
	ck_assert_uint_eq(module_cache_idle_bytes(cache), (8u << 20) + 4);
	module_cache_put(cache, huge);
	ck_assert_uint_eq(unloads, 1);
	ck_assert_uint_eq(module_cache_count(cache), 2);
	ck_assert_uint_eq(module_cache_idle_bytes(cache), (8u << 20) + 4);
	/* Still compiled: taken again without a load. */
	ck_assert_ptr_eq(get_text(".global .u32 counter;"), small);
	ck_assert_ptr_eq(get_text(".global .b8 m[8388608];"), mid);
	ck_assert_uint_eq(loads, 3);
	module_cache_put(cache, small);
	module_cache_put(cache, mid);
}
END_TEST

static Suite *module_suite(void)
{
	Suite *s = suite_create("module");
	TCase *tc = tcase_create("cache");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, same_content_compiles_once);
	tcase_add_test(tc, full_cache_evicts_only_what_nobody_holds);
	tcase_add_test(tc, eviction_takes_the_least_recently_used);
	tcase_add_test(tc, a_hold_keeps_a_module_loaded);
	tcase_add_test(tc, service_counts_distinct_modules);
	tcase_add_test(tc, idle_modules_keep_little_device_memory);
	tcase_add_test(tc, a_huge_idle_module_goes_alone);
	tcase_add_test(tc,
		       modules_with_globals_are_shared_within_a_service_only);
	tcase_add_test(tc,
		       modules_whose_globals_are_unknown_stay_their_services);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_main(module_suite());
}
