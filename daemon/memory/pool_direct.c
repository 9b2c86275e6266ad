/*
 * pool_direct.c - one device allocation per reservation, any size.
 *
 * Only alignment padding is wasted.  Reuse needs the same effective size,
 * as in the reference.  Where the reference returns free allocations in
 * index order when reclaim_at is passed, this returns the largest first:
 * fewer driver frees bring the total under the mark, and the small ones,
 * the likelier to be asked for again, stay.
 */
#include "memory/pool_direct.h"

#include <stdlib.h>

#include "memory/pool_dedicated.h"

struct direct_pool {
	struct dedicated_pool d; /* first: destroy frees through it */
	uint64_t reclaim_at;	 /* 0: no watermark */
};

static int direct_reserve(struct pool *pool, uint64_t size,
			  struct memory_slice **out)
{
	struct direct_pool *dp =
		pool_container_of(pool, struct direct_pool, d.base);

	return pool_dedicated_reserve_exact(&dp->d, size, dp->reclaim_at, out);
}

static const struct pool_ops direct_ops = {
	.max_accept = pool_dedicated_max_any,
	.reserve = direct_reserve,
	.release = pool_dedicated_release,
	.cleanup = pool_dedicated_cleanup_explicit,
	.trim = pool_dedicated_trim,
	.largest_free = pool_dedicated_largest_free,
	.busy_idle = pool_dedicated_busy_idle,
	.destroy = pool_dedicated_destroy,
};

int pool_direct_create(const struct memory_pool_options *opt,
		       const struct memory_storage *storage, uint64_t alignment,
		       struct pool **out)
{
	struct direct_pool *dp;

	if (!pool_is_pow2(alignment))
		return GPUCMD_EINVAL;
	dp = calloc(1, sizeof(*dp));
	if (!dp)
		return GPUCMD_ENOMEM;
	pool_dedicated_init(&dp->d, &direct_ops, MEMORY_POOL_DIRECT, storage,
			    alignment);
	dp->reclaim_at = opt->reclaim_at;
	*out = &dp->d.base;
	return 0;
}
