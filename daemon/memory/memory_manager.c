/*
 * memory_manager.c - routing of one stream's reservations over its pools
 * (reference MemoryManagement, cubecl-runtime.md §4.1, §4.4–4.6, §4.9).
 *
 * A reservation in persistent mode goes to the persistent pool, whatever
 * its size.  Otherwise the dynamic pools are tried in order, skipping those
 * that do not accept the size; the first that accepts reuses free space or
 * allocates.  A capped pool that is full answers GPUCMD_ECAPACITY and the
 * request spills to the next accepting pool; if none is left the capacity
 * error is the answer, and if no pool accepted at all it is GPUCMD_ETOOBIG.
 * Where the reference reports an earlier capacity error in preference to a
 * later storage refusal, this reports the refusal (GPUCMD_ENOMEM): the
 * request did find a pool with room in its layout, and what stopped it was
 * the device, which is what the caller's cleanup-and-retry addresses.
 *
 * Every reservation advances a clock that paces the periodic cleanup of
 * exclusive pools; the manager keeps the earliest clock at which any pool's
 * periodic cleanup can free something, and visits the pools only then.
 * While a graph capture is open no cleanup of any kind runs, and the pools
 * are not rebuilt, since the captured graph may still name memory that is
 * free as far as the pools know.
 *
 * Reclaim before growth: sliced pages otherwise go back only on an explicit
 * cleanup, so each pool would keep its own high-water mark and the memory
 * reserved would be the sum of the pools' peaks rather than the peak of
 * their sum (a training loop whose batch shape changes moves the same
 * tensor from pool to pool from step to step).  So when a dynamic pool is
 * about to take memory from the storage and the bytes reserved would then
 * pass the need by more than 1/RECLAIM_SLACK (the need: the most effective
 * bytes ever live at once, the request included), the manager first
 * returns device allocations that the dynamic pools, the asking one too,
 * have held with nothing live for RECLAIM_IDLE reservations or more,
 * later pools (larger pages) first, just enough to come under that mark.
 *
 * What keeps the driver from a storm of frees and allocations (cuMemFree
 * synchronizes): nothing is returned while reserved stays within the
 * slack; memory a workload frees and takes again within RECLAIM_IDLE
 * reservations (the pattern pools exist for) is never returned; and when a
 * pool that was trimmed has to grow again within RECLAIM_REGRET
 * reservations, with no more memory live at the peak than when it was
 * trimmed, the trim bought nothing (the workload's working set is larger
 * than its live bytes, fragmentation being what it is), so the manager
 * raises the mark to what is reserved then, with the same slack, and
 * leaves that much alone from then on.  A workload whose live peak keeps
 * growing is not blamed for the pages it needs back.
 *
 * The report otherwise follows the reference: an explicit cleanup returns
 * every free page, and pages_peak counts pages a trim returned too.
 *
 * Layouts: the SubSlices and ExclusivePages presets are expanded here from
 * the device properties, as in the reference's build_pools; a custom list
 * is validated and normalised by memory_configuration_resolve.
 */
#include "memory/memory_manager.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memory/pool.h"
#include "memory/pool_persistent.h"

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)

/* SubSlices: the smallest page of the ladder is at least this large. */
#define SUBSLICES_MIN_PAGE (8 * MIB)
/* ExclusivePages: this many buckets, log-spaced from the smallest. */
#define EXCLUSIVE_PAGES_BUCKETS 24
#define EXCLUSIVE_PAGES_SMALLEST (32 * KIB)
/* Dealloc period: this many reservations per GiB of bucket, plus one. */
#define DEALLOC_PERIOD_BASE 5000
/* Reclaim before growth: idle for this many reservations at least, ... */
#define RECLAIM_IDLE 64
/* ... and only once reserved would pass 1 + 1/RECLAIM_SLACK of the need. */
#define RECLAIM_SLACK 8
/* A pool that must grow again this soon after a trim was trimmed wrongly. */
#define RECLAIM_REGRET 1024

/* Sizes of one bit length whose first accepting pool differs: scan all. */
#define ROUTE_SCAN UINT8_MAX

/* When the manager last trimmed a pool (reclaim before growth). */
struct manager_trim {
	uint64_t clock;	      /* 0: never */
	uint64_t in_use_peak; /* pool_host.in_use_peak at that moment */
};

struct memory_manager {
	struct memory_storage storage;
	/* host.clock counts reservations: paces periodic cleanup, dates idling. */
	struct pool_host host;
	struct pool *pools[MEMORY_MAX_POOLS]; /* dynamic, in order */
	size_t npools;
	struct pool *persistent;
	/*
	 * For each bit length of a size (0 for size 0), the first dynamic
	 * pool that accepts every size of that length (npools: none does),
	 * or ROUTE_SCAN where the answer changes within the length.
	 */
	uint8_t route[65];
	uint64_t cleanup_due; /* the earliest pool.cleanup_due */
	/*
	 * Reclaim before growth: reserved bytes that trimming has been seen
	 * to undercut (the workload needed them back at once), and for each
	 * dynamic pool when it was last trimmed and the in-use high-water
	 * mark then.
	 */
	uint64_t regret_cap;
	struct manager_trim trims[MEMORY_MAX_POOLS];
	uint64_t windows;    /* persistent windows open */
	uint64_t busy_until; /* the largest fence of release_after */
	bool capture;
};

const char *memory_pool_kind_name(enum memory_pool_kind kind)
{
	switch (kind) {
	case MEMORY_POOL_SLICED:
		return "sliced";
	case MEMORY_POOL_EXCLUSIVE:
		return "exclusive";
	case MEMORY_POOL_PERSISTENT:
		return "persistent";
	case MEMORY_POOL_DIRECT:
		return "direct";
	}
	return "unknown";
}

/* Write a sentence for the caller and answer GPUCMD_EINVAL. */
__attribute__((format(printf, 3, 4))) static int
config_error(char *msg, size_t msg_len, const char *fmt, ...)
{
	va_list ap;

	if (msg && msg_len > 0) {
		va_start(ap, fmt);
		vsnprintf(msg, msg_len, fmt, ap);
		va_end(ap);
	}
	return GPUCMD_EINVAL;
}

/* Round a configured size up to the alignment, or say it is too large. */
static int round_option(uint64_t *value, uint64_t alignment, size_t index,
			const char *kind, const char *field, char *msg,
			size_t msg_len)
{
	if (pool_round_up(*value, alignment, value))
		return 0;
	return config_error(msg, msg_len,
			    "pool %zu (%s): %s %llu is too large to align",
			    index, kind, field, (unsigned long long)*value);
}

static int resolve_sliced(struct memory_pool_options *p, size_t i,
			  uint64_t alignment, char *msg, size_t msg_len)
{
	const char *kind = "sliced";

	if (p->page_size == 0)
		return config_error(msg, msg_len,
				    "pool %zu (sliced): page_size is 0", i);
	if (p->max_slice == 0)
		p->max_slice = p->page_size;
	if (round_option(&p->page_size, alignment, i, kind, "page_size", msg,
			 msg_len) ||
	    round_option(&p->max_slice, alignment, i, kind, "max_slice", msg,
			 msg_len) ||
	    round_option(&p->max_pool_size, alignment, i, kind, "max_pool_size",
			 msg, msg_len))
		return GPUCMD_EINVAL;
	if (p->max_slice > p->page_size)
		return config_error(
			msg, msg_len,
			"pool %zu (sliced): max_slice %llu is larger than page_size %llu",
			i, (unsigned long long)p->max_slice,
			(unsigned long long)p->page_size);
	if (p->max_pool_size != 0 && p->max_pool_size < p->page_size)
		return config_error(
			msg, msg_len,
			"pool %zu (sliced): max_pool_size %llu is smaller than one page of %llu",
			i, (unsigned long long)p->max_pool_size,
			(unsigned long long)p->page_size);
	return 0;
}

static int resolve_pool(struct memory_pool_options *p, size_t i,
			uint64_t alignment, char *msg, size_t msg_len)
{
	switch (p->kind) {
	case MEMORY_POOL_SLICED:
		return resolve_sliced(p, i, alignment, msg, msg_len);
	case MEMORY_POOL_EXCLUSIVE:
		if (p->max_alloc == 0)
			return config_error(
				msg, msg_len,
				"pool %zu (exclusive): max_alloc is 0", i);
		return round_option(&p->max_alloc, alignment, i, "exclusive",
				    "max_alloc", msg, msg_len);
	case MEMORY_POOL_DIRECT:
		return 0;
	case MEMORY_POOL_PERSISTENT:
		break;
	}
	return config_error(
		msg, msg_len,
		"pool %zu: kind %d is not a dynamic pool kind (sliced, exclusive or direct)",
		i, (int)p->kind);
}

int memory_configuration_resolve(struct memory_configuration *cfg,
				 const struct memory_device_properties *props,
				 char *msg, size_t msg_len)
{
	struct memory_configuration c = *cfg;
	size_t i;
	int rc;

	if (props->alignment == 0)
		return config_error(msg, msg_len,
				    "the device reports an alignment of 0");
	if (!pool_is_pow2(props->alignment))
		return config_error(
			msg, msg_len,
			"the device reports an alignment of %llu, which is not a power of two",
			(unsigned long long)props->alignment);
	switch (c.preset) {
	case MEMORY_PRESET_SUBSLICES:
	case MEMORY_PRESET_EXCLUSIVE_PAGES:
		/* Presets are sized from the device when a manager is made. */
		if (props->max_page_size < props->alignment)
			return config_error(
				msg, msg_len,
				"the device's max_page_size %llu is smaller than its alignment %llu",
				(unsigned long long)props->max_page_size,
				(unsigned long long)props->alignment);
		return 0;
	case MEMORY_PRESET_CUSTOM:
		break;
	default:
		return config_error(msg, msg_len, "unknown memory preset %d",
				    (int)c.preset);
	}
	if (c.npools == 0)
		return config_error(
			msg, msg_len,
			"the custom pool list is empty; give at least one pool");
	if (c.npools > MEMORY_MAX_POOLS)
		return config_error(msg, msg_len,
				    "%zu pools given; at most %d are allowed",
				    c.npools, MEMORY_MAX_POOLS);
	for (i = 0; i < c.npools; i++) {
		rc = resolve_pool(&c.pools[i], i, props->alignment, msg,
				  msg_len);
		if (rc < 0)
			return rc;
	}
	*cfg = c;
	return 0;
}

/* The reference's period for a bucket: 5000 per GiB, rounded, plus one. */
static uint64_t dealloc_period_for(uint64_t size)
{
	uint64_t gib = size / GIB + (size % GIB >= GIB / 2);

	return DEALLOC_PERIOD_BASE * (1 + gib);
}

static uint64_t align_down(uint64_t x, uint64_t alignment)
{
	return x & ~(alignment - 1);
}

/* x rounded up to the alignment, or down where up would overflow. */
static uint64_t align_near(uint64_t x, uint64_t alignment)
{
	uint64_t up;

	return pool_round_up(x, alignment, &up) ? up : align_down(x, alignment);
}

static void layout_add(struct memory_configuration *layout,
		       struct memory_pool_options opt)
{
	if (layout->npools < MEMORY_MAX_POOLS)
		layout->pools[layout->npools++] = opt;
}

/*
 * SubSlices (reference §4.5): an exclusive pool for zero-byte requests, a
 * ladder of uncapped sliced pools whose pages are quarters of
 * max_page_size, and an exclusive tail up to max_page_size.
 */
static void preset_subslices(const struct memory_device_properties *props,
			     struct memory_configuration *layout)
{
	uint64_t align = props->alignment;
	uint64_t pages[MEMORY_MAX_POOLS] = { 0 };
	uint64_t cur = props->max_page_size, page, slice, tail;
	uint64_t floor = props->min_page_size ? props->min_page_size :
						SUBSLICES_MIN_PAGE;
	size_t n = 0, k;

	/*
	 * Zero-byte requests get an allocation of their own (one alignment
	 * unit): some backends cannot bind an empty range at an offset.
	 */
	layout_add(layout,
		   (struct memory_pool_options){ .kind = MEMORY_POOL_EXCLUSIVE,
						 .max_alloc = 0 });
	while (cur / 4 >= floor && n < MEMORY_MAX_POOLS - 2) {
		cur /= 4;
		pages[n++] = align_near(cur, align);
	}
	/* Smallest pages first; the largest rung slices at half a page. */
	for (k = n; k-- > 0;) {
		page = pages[k];
		slice = align_near(page >> (k + 1), align);
		if (slice < align)
			slice = align;
		layout_add(layout,
			   (struct memory_pool_options){
				   .kind = MEMORY_POOL_SLICED,
				   .page_size = page,
				   .max_slice = slice > page ? page : slice,
			   });
	}
	tail = align_down(props->max_page_size, align);
	layout_add(layout, (struct memory_pool_options){
				   .kind = MEMORY_POOL_EXCLUSIVE,
				   .max_alloc = tail,
				   .dealloc_period = dealloc_period_for(tail),
			   });
}

/* ExclusivePages (reference §4.5): log-spaced exclusive buckets. */
static void preset_exclusive_pages(const struct memory_device_properties *props,
				   struct memory_configuration *layout)
{
	uint64_t hi = props->max_page_size;
	uint64_t lo =
		hi < EXCLUSIVE_PAGES_SMALLEST ? hi : EXCLUSIVE_PAGES_SMALLEST;
	double ratio = (double)hi / (double)lo, x;
	uint64_t size, last = 0;
	int i;

	for (i = 0; i < EXCLUSIVE_PAGES_BUCKETS; i++) {
		x = (double)lo *
		    pow(ratio, (double)i / (EXCLUSIVE_PAGES_BUCKETS - 1));
		size = i == EXCLUSIVE_PAGES_BUCKETS - 1 || x >= (double)hi ?
			       hi :
			       (uint64_t)x;
		size = align_near(size, props->alignment);
		if (layout->npools > 0 && size <= last)
			continue;
		last = size;
		layout_add(layout,
			   (struct memory_pool_options){
				   .kind = MEMORY_POOL_EXCLUSIVE,
				   .max_alloc = size,
				   .dealloc_period = dealloc_period_for(size),
			   });
	}
}

/* The dynamic pools cfg describes for props, checked. */
static int layout_build(const struct memory_configuration *cfg,
			const struct memory_device_properties *props,
			struct memory_configuration *layout)
{
	struct memory_configuration c = *cfg;
	int rc;

	rc = memory_configuration_resolve(&c, props, NULL, 0);
	if (rc < 0)
		return rc;
	if (c.preset == MEMORY_PRESET_CUSTOM) {
		*layout = c;
		return 0;
	}
	*layout = (struct memory_configuration){ .preset = c.preset };
	if (c.preset == MEMORY_PRESET_SUBSLICES)
		preset_subslices(props, layout);
	else
		preset_exclusive_pages(props, layout);
	return 0;
}

/*
 * pool_host.before_alloc: a dynamic pool is about to take size bytes from
 * the storage.  Return what the dynamic pools have held idle for long
 * enough first, within the limits the top of this file explains.
 */
/* a + b, or UINT64_MAX where that overflows (a request may be huge). */
static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static void manager_before_alloc(struct pool_host *host, struct pool *pool,
				 uint64_t size)
{
	struct memory_manager *mm =
		pool_container_of(host, struct memory_manager, host);
	uint64_t after = sat_add(host->reserved, size);
	uint64_t need = host->in_use_peak, cap, want, freed;
	size_t i;

	if (mm->capture || host->clock < RECLAIM_IDLE)
		return;
	for (i = 0; i < mm->npools && mm->pools[i] != pool; i++)
		;
	/*
	 * The asking pool gave pages back a moment ago and nobody has needed
	 * more memory since: the trim only moved a working set out and back
	 * in.  Hold what the workload holds now, with the same slack, from
	 * here on.
	 */
	if (i < mm->npools && mm->trims[i].clock != 0 &&
	    host->clock - mm->trims[i].clock < RECLAIM_REGRET &&
	    mm->trims[i].in_use_peak == host->in_use_peak) {
		cap = sat_add(after, after / RECLAIM_SLACK);
		if (cap > mm->regret_cap)
			mm->regret_cap = cap;
		/* One trim, one lesson: its pool's later growth is not news. */
		mm->trims[i].clock = 0;
	}
	if (sat_add(host->in_use, size) > need)
		need = sat_add(host->in_use, size);
	cap = sat_add(need, need / RECLAIM_SLACK);
	if (cap < mm->regret_cap)
		cap = mm->regret_cap;
	if (after <= cap)
		return;
	/*
	 * Later pools first: in the presets they have the largest pages, so
	 * the fewest driver frees bring reserved under the mark.
	 */
	want = after - cap;
	for (i = mm->npools; i-- > 0 && want > 0;) {
		freed = pool_trim(mm->pools[i], host->clock - RECLAIM_IDLE,
				  want);
		if (freed == 0)
			continue;
		mm->trims[i] = (struct manager_trim){
			.clock = host->clock,
			.in_use_peak = host->in_use_peak,
		};
		want -= freed < want ? freed : want;
	}
}

/* The earliest clock at which a periodic cleanup can free anything. */
static void manager_update_due(struct memory_manager *mm)
{
	uint64_t due = UINT64_MAX;
	size_t i;

	for (i = 0; i < mm->npools; i++)
		if (mm->pools[i]->cleanup_due < due)
			due = mm->pools[i]->cleanup_due;
	mm->cleanup_due = due;
}

/* The bit length of size: 0 for 0, else the position of its top bit + 1. */
static unsigned size_bits(uint64_t size)
{
	return size ? 64 - (unsigned)__builtin_clzll(size) : 0;
}

/* The first dynamic pool that accepts size (npools: none). */
static size_t route_first(const struct memory_manager *mm, uint64_t size)
{
	size_t i;

	for (i = 0; i < mm->npools && !pool_accept(mm->pools[i], size); i++)
		;
	return i;
}

/* Whether x is a size where what pool accepts changes (x - 1 vs x). */
static bool route_edge(const struct pool *pool, uint64_t x)
{
	return pool_accept(pool, x - 1) != pool_accept(pool, x);
}

/* Fill mm->route from the pools' accept bounds. */
static void route_build(struct memory_manager *mm)
{
	uint64_t lo, hi, edges[3];
	unsigned b, k;
	size_t i;
	bool same;

	for (b = 0; b <= 64; b++) {
		lo = b == 0 ? 0 : UINT64_C(1) << (b - 1);
		hi = b == 0 ? 0 : b == 64 ? UINT64_MAX : (UINT64_C(1) << b) - 1;
		same = true;
		for (i = 0; i < mm->npools && same; i++) {
			const struct pool *p = mm->pools[i];

			edges[0] = p->accept_max + (p->accept_max < UINT64_MAX);
			edges[1] = p->near_min;
			edges[2] = p->near_max + (p->near_max < UINT64_MAX);
			for (k = 0; k < 3; k++)
				if (edges[k] > lo && edges[k] <= hi &&
				    route_edge(p, edges[k]))
					same = false;
		}
		mm->route[b] = same ? (uint8_t)route_first(mm, lo) : ROUTE_SCAN;
	}
}

/* Make mm the host of its pools and learn when they need cleaning. */
static void manager_adopt(struct memory_manager *mm)
{
	size_t i;

	route_build(mm);
	for (i = 0; i < mm->npools; i++)
		mm->pools[i]->host = &mm->host;
	mm->persistent->host = &mm->host;
	manager_update_due(mm);
}

static void pools_destroy(struct pool **pools, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		pool_destroy(pools[i]);
}

static int pools_create(const struct memory_configuration *layout,
			const struct memory_storage *storage,
			uint64_t alignment, struct pool **pools)
{
	size_t i;
	int rc;

	for (i = 0; i < layout->npools; i++) {
		rc = pool_create(&layout->pools[i], storage, alignment,
				 &pools[i]);
		if (rc < 0) {
			pools_destroy(pools, i);
			return rc;
		}
	}
	return 0;
}

int memory_manager_create(const struct memory_configuration *cfg,
			  const struct memory_device_properties *props,
			  const struct memory_storage *storage,
			  struct memory_manager **out)
{
	struct memory_configuration layout;
	struct memory_manager *mm;
	int rc;

	if (!storage->alloc || !storage->free)
		return GPUCMD_EINVAL;
	rc = layout_build(cfg, props, &layout);
	if (rc < 0)
		return rc;
	mm = calloc(1, sizeof(*mm));
	if (!mm)
		return GPUCMD_ENOMEM;
	mm->storage = *storage;
	mm->host.before_alloc = manager_before_alloc;
	rc = pool_persistent_create(storage, props->alignment, &mm->persistent);
	if (rc < 0) {
		free(mm);
		return rc;
	}
	rc = pools_create(&layout, storage, props->alignment, mm->pools);
	if (rc < 0) {
		pool_destroy(mm->persistent);
		free(mm);
		return rc;
	}
	mm->npools = layout.npools;
	manager_adopt(mm);
	*out = mm;
	return 0;
}

void memory_manager_destroy(struct memory_manager *mm)
{
	if (!mm)
		return;
	pools_destroy(mm->pools, mm->npools);
	pool_destroy(mm->persistent);
	free(mm);
}

/* Run every dynamic pool's periodic cleanup (nothing while capturing). */
static void manager_periodic(struct memory_manager *mm)
{
	size_t i;

	if (mm->capture)
		return;
	for (i = 0; i < mm->npools; i++)
		pool_cleanup(mm->pools[i], false, mm->host.clock);
	manager_update_due(mm);
}

/* The dynamic route: first accepting pool, spilling past full ones. */
static int reserve_dynamic(struct memory_manager *mm, uint64_t size,
			   struct memory_slice **slice)
{
	size_t i = mm->route[size_bits(size)];
	bool full = false;
	int rc;

	/* Pools before the routed one do not accept the size. */
	if (i == ROUTE_SCAN)
		i = 0;
	for (; i < mm->npools; i++) {
		if (!pool_accept(mm->pools[i], size))
			continue;
		rc = pool_reserve(mm->pools[i], size, slice);
		if (rc != GPUCMD_ECAPACITY)
			return rc;
		full = true;
	}
	return full ? GPUCMD_ECAPACITY : GPUCMD_ETOOBIG;
}

/* A reservation from the pools, or (exact) in an allocation of its own. */
static int reserve_with(struct memory_manager *mm, uint64_t size,
			struct memory_alloc *out, bool exact)
{
	struct memory_slice *slice;
	int rc;

	mm->host.clock++;
	/* A reservation that failed after noting a reuse leaves no count. */
	mm->host.reused_busy = 0;
	if (!exact && mm->host.clock >= mm->cleanup_due)
		manager_periodic(mm);
	if (exact || mm->windows > 0)
		rc = pool_reserve(mm->persistent, size, &slice);
	else
		rc = reserve_dynamic(mm, size, &slice);
	if (rc < 0)
		return rc;
	out->ptr = slice->ptr;
	out->size = size;
	out->slice = slice;
	return 0;
}

int memory_manager_reserve(struct memory_manager *mm, uint64_t size,
			   struct memory_alloc *out)
{
	return reserve_with(mm, size, out, false);
}

int memory_manager_reserve_exact(struct memory_manager *mm, uint64_t size,
				 struct memory_alloc *out)
{
	return reserve_with(mm, size, out, true);
}

void memory_manager_release(struct memory_manager *mm,
			    struct memory_slice *slice)
{
	if (slice)
		pool_release(slice);
}

void memory_manager_release_after(struct memory_manager *mm,
				  struct memory_slice *slice, uint64_t fence)
{
	if (slice == NULL)
		return;
	slice->busy_until = fence;
	if (fence > mm->busy_until)
		mm->busy_until = fence;
	pool_release(slice);
}

void memory_manager_set_completed(struct memory_manager *mm,
				  const uint64_t *completed)
{
	mm->host.completed = completed;
}

bool memory_manager_busy(const struct memory_manager *mm)
{
	return mm->busy_until != 0 && mm->host.completed != NULL &&
	       *mm->host.completed < mm->busy_until;
}

uint64_t memory_manager_take_reused(struct memory_manager *mm)
{
	uint64_t n = mm->host.reused_busy;

	mm->host.reused_busy = 0;
	return n;
}

uint64_t memory_manager_busy_idle(const struct memory_manager *mm)
{
	uint64_t sum;

	if (!memory_manager_busy(mm))
		return 0;
	sum = pool_busy_idle(mm->persistent);
	for (size_t i = 0; i < mm->npools; i++)
		sum += pool_busy_idle(mm->pools[i]);
	return sum;
}

void memory_manager_cleanup(struct memory_manager *mm, bool explicit_call)
{
	size_t i;

	if (mm->capture)
		return;
	for (i = 0; i < mm->npools; i++)
		pool_cleanup(mm->pools[i], explicit_call, mm->host.clock);
	pool_cleanup(mm->persistent, explicit_call, mm->host.clock);
	manager_update_due(mm);
}

static void usage_add(struct memory_usage *sum, const struct pool *pool)
{
	const struct memory_usage *u = &pool->stats.usage;

	sum->allocations += u->allocations;
	sum->bytes_in_use += u->bytes_in_use;
	sum->bytes_padding += u->bytes_padding;
	sum->bytes_reserved += u->bytes_reserved;
}

static void usage_dynamic(const struct memory_manager *mm,
			  struct memory_usage *out)
{
	size_t i;

	*out = (struct memory_usage){ 0 };
	for (i = 0; i < mm->npools; i++)
		usage_add(out, mm->pools[i]);
}

void memory_manager_usage(const struct memory_manager *mm,
			  struct memory_usage *out)
{
	usage_dynamic(mm, out);
	usage_add(out, mm->persistent);
}

/* The largest value f gives over the dynamic pools (0 when none). */
static uint64_t pools_max(const struct memory_manager *mm,
			  uint64_t (*f)(const struct pool *pool))
{
	uint64_t largest = 0, v;
	size_t i;

	for (i = 0; i < mm->npools; i++) {
		v = f(mm->pools[i]);
		if (v > largest)
			largest = v;
	}
	return largest;
}

uint64_t memory_manager_largest_free(const struct memory_manager *mm)
{
	uint64_t dynamic = pools_max(mm, pool_largest_free);
	uint64_t persistent = pool_largest_free(mm->persistent);

	return dynamic > persistent ? dynamic : persistent;
}

void memory_manager_describe_capacity(const struct memory_manager *mm,
				      uint64_t size, char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < mm->npools && n < len; i++) {
		const struct pool *p = mm->pools[i];

		if (p->stats.max_pool_size == 0 || !pool_accept(p, size))
			continue;
		n += (size_t)
			snprintf(buf + n, len - n,
				 "%spool %zu (%s, "
				 "pages of %llu) holds %llu of its "
				 "max_pool_size of %llu bytes",
				 n ? ", " : "", i,
				 memory_pool_kind_name(p->stats.kind),
				 (unsigned long long)p->stats.page_size,
				 (unsigned long long)(p->stats.pages *
						      p->stats.page_size),
				 (unsigned long long)p->stats.max_pool_size);
	}
}

size_t memory_manager_report(const struct memory_manager *mm,
			     struct memory_pool_report *out, size_t max)
{
	size_t i;

	for (i = 0; i < mm->npools && i < max; i++)
		pool_report(mm->pools[i], &out[i]);
	if (mm->npools < max)
		pool_report(mm->persistent, &out[mm->npools]);
	return mm->npools + 1;
}

uint64_t memory_manager_max_alloc(const struct memory_manager *mm)
{
	return pools_max(mm, pool_max_accept);
}

void memory_manager_mode(struct memory_manager *mm,
			 enum memory_allocation_mode mode)
{
	if (mode == MEMORY_MODE_PERSISTENT && mm->windows < UINT64_MAX)
		mm->windows++;
	else if (mode == MEMORY_MODE_AUTO && mm->windows > 0)
		mm->windows--;
}

enum memory_allocation_mode
memory_manager_current_mode(const struct memory_manager *mm)
{
	return mm->windows > 0 ? MEMORY_MODE_PERSISTENT : MEMORY_MODE_AUTO;
}

int memory_manager_install_pools(struct memory_manager *mm,
				 const struct memory_configuration *cfg,
				 const struct memory_device_properties *props,
				 uint64_t *bytes_in_use)
{
	struct memory_configuration layout;
	struct pool *pools[MEMORY_MAX_POOLS];
	struct memory_usage dyn;
	int rc;

	rc = layout_build(cfg, props, &layout);
	if (rc < 0)
		return rc;
	memory_manager_cleanup(mm, true);
	usage_dynamic(mm, &dyn);
	/*
	 * Live slices point into the old pools, so those must stay.  Count
	 * slices rather than bytes: a zero-byte slice is live too.  An open
	 * capture may name memory the pools think free, and work queued
	 * before a release_after may still use it; keep them then too.
	 */
	if (dyn.allocations > 0 || mm->capture || memory_manager_busy(mm)) {
		if (bytes_in_use)
			*bytes_in_use = dyn.bytes_in_use;
		return GPUCMD_EPOOLSINUSE;
	}
	rc = pools_create(&layout, &mm->storage, props->alignment, pools);
	if (rc < 0)
		return rc;
	pools_destroy(mm->pools, mm->npools);
	for (mm->npools = 0; mm->npools < layout.npools; mm->npools++)
		mm->pools[mm->npools] = pools[mm->npools];
	/* What the old layout taught about trimming says nothing of this. */
	memset(mm->trims, 0, sizeof(mm->trims));
	mm->regret_cap = 0;
	manager_adopt(mm);
	if (bytes_in_use)
		*bytes_in_use = 0;
	return 0;
}

void memory_manager_set_capture(struct memory_manager *mm, bool active)
{
	mm->capture = active;
}

uint64_t memory_slice_effective(const struct memory_slice *slice)
{
	return slice->effective;
}

uint64_t memory_slice_cursor(const struct memory_slice *slice)
{
	return slice->cursor;
}

void memory_slice_set_cursor(struct memory_slice *slice, uint64_t cursor)
{
	slice->cursor = cursor;
}
