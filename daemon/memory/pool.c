/*
 * pool.c - the shared part of every pool: size arithmetic, device
 * allocations with their accounting, the usage counters of live slices, and
 * dispatch through struct pool_ops.
 *
 * Counters are updated at the moment memory changes hands rather than
 * recomputed on demand, so usage and reports cost O(pools) however many
 * slices are live.
 */
#include "memory/pool.h"

#include <stdlib.h>

#include "memory/pool_direct.h"
#include "memory/pool_exclusive.h"
#include "memory/pool_sliced.h"

void pool_init(struct pool *pool, const struct pool_ops *ops,
	       enum memory_pool_kind kind, const struct memory_storage *storage,
	       uint64_t alignment)
{
	*pool = (struct pool){
		.ops = ops,
		.storage = *storage,
		.alignment = alignment,
		.align_mask = alignment - 1,
		.accept_max = 0,
		.near_min = 1,
		.near_max = 0,
		.cleanup_due = UINT64_MAX,
		.stats = { .kind = kind },
	};
}

int pool_create(const struct memory_pool_options *opt,
		const struct memory_storage *storage, uint64_t alignment,
		struct pool **out)
{
	switch (opt->kind) {
	case MEMORY_POOL_SLICED:
		return pool_sliced_create(opt, storage, alignment, out);
	case MEMORY_POOL_EXCLUSIVE:
		return pool_exclusive_create(opt, storage, alignment, out);
	case MEMORY_POOL_DIRECT:
		return pool_direct_create(opt, storage, alignment, out);
	case MEMORY_POOL_PERSISTENT:
		break;
	}
	/* The persistent pool is the manager's own, never part of a layout. */
	return GPUCMD_EINVAL;
}

void *pool_grow(void *arr, size_t *cap, size_t need, size_t elem)
{
	size_t n = *cap ? *cap : 8;

	if (need <= *cap)
		return arr;
	while (n < need)
		n *= 2;
	arr = realloc(arr, n * elem);
	if (arr)
		*cap = n;
	return arr;
}

bool pool_round_up(uint64_t x, uint64_t unit, uint64_t *out)
{
	uint64_t rem;

	if (pool_is_pow2(unit)) {
		if (x > UINT64_MAX - (unit - 1))
			return false;
		*out = (x + unit - 1) & ~(unit - 1);
		return true;
	}
	rem = x % unit;
	if (rem == 0) {
		*out = x;
		return true;
	}
	if (x > UINT64_MAX - (unit - rem))
		return false;
	*out = x + (unit - rem);
	return true;
}

bool pool_wastes_little(uint64_t used, uint64_t whole)
{
	if (used > whole)
		return false;
	/* (whole - used) * 5 < whole, written so that it cannot overflow. */
	return whole - used < whole / 5 + (whole % 5 != 0);
}

uint64_t pool_little_waste_min(uint64_t whole)
{
	/* used > whole - ceil(whole / 5), the same rule solved for used. */
	return whole - (whole / 5 + (whole % 5 != 0)) + 1;
}

int pool_device_alloc(struct pool *pool, uint64_t size, uint64_t *ptr)
{
	struct memory_pool_report *st = &pool->stats;
	uint64_t addr = 0;

	/*
	 * Whatever the storage says (its own code, or the driver's), to the
	 * caller it means the device had no memory for us: command_reserve
	 * reclaims and retries on exactly that.  The owner may first give
	 * back memory that other pools hold idle.
	 */
	if (pool->host && pool->host->before_alloc)
		pool->host->before_alloc(pool->host, pool, size);
	if (pool->storage.alloc(pool->storage.ctx, size, &addr) < 0)
		return GPUCMD_ENOMEM;
	if ((addr & pool->align_mask) != 0) {
		/* Slices would break the alignment promise; refuse the page. */
		pool->storage.free(pool->storage.ctx, addr, size);
		return GPUCMD_EDRIVER;
	}
	st->usage.bytes_reserved += size;
	st->pages++;
	if (pool->host)
		pool->host->reserved += size;
	if (st->pages > st->pages_peak)
		st->pages_peak = st->pages;
	*ptr = addr;
	return 0;
}

void pool_device_free(struct pool *pool, uint64_t ptr, uint64_t size)
{
	pool->storage.free(pool->storage.ctx, ptr, size);
	pool->stats.usage.bytes_reserved -= size;
	pool->stats.pages--;
	if (pool->host)
		pool->host->reserved -= size;
}

uint64_t pool_max_accept(const struct pool *pool)
{
	return pool->ops->max_accept(pool);
}

void pool_cleanup(struct pool *pool, bool explicit_call, uint64_t clock)
{
	pool->ops->cleanup(pool, explicit_call, clock);
}

uint64_t pool_trim(struct pool *pool, uint64_t idle_since, uint64_t want)
{
	return pool->ops->trim(pool, idle_since, want);
}

uint64_t pool_largest_free(const struct pool *pool)
{
	return pool->ops->largest_free(pool);
}

uint64_t pool_busy_idle(const struct pool *pool)
{
	return pool->ops->busy_idle(pool);
}

void pool_report(const struct pool *pool, struct memory_pool_report *out)
{
	*out = pool->stats;
	out->largest_free = pool->ops->largest_free(pool);
}

void pool_destroy(struct pool *pool)
{
	pool->ops->destroy(pool);
}
