/*
 * pool_persistent.c - exact-size slices for persistent mode.
 *
 * The reference indexes free slices by effective size; the dedicated
 * engine's length-sorted free array is that index, searched for an equal
 * length.  No size limit is checked: persistent mode exists to place what
 * the dynamic pools refuse.
 */
#include "memory/pool_persistent.h"

#include <stdlib.h>

#include "memory/pool_dedicated.h"

static int persistent_reserve(struct pool *pool, uint64_t size,
			      struct memory_slice **out)
{
	return pool_dedicated_reserve_exact(pool_dedicated_of(pool), size, 0,
					    out);
}

static const struct pool_ops persistent_ops = {
	.max_accept = pool_dedicated_max_any,
	.reserve = persistent_reserve,
	.release = pool_dedicated_release,
	.cleanup = pool_dedicated_cleanup_explicit,
	.trim = pool_dedicated_trim,
	.largest_free = pool_dedicated_largest_free,
	.busy_idle = pool_dedicated_busy_idle,
	.destroy = pool_dedicated_destroy,
};

int pool_persistent_create(const struct memory_storage *storage,
			   uint64_t alignment, struct pool **out)
{
	struct dedicated_pool *d;

	if (!pool_is_pow2(alignment))
		return GPUCMD_EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return GPUCMD_ENOMEM;
	pool_dedicated_init(d, &persistent_ops, MEMORY_POOL_PERSISTENT, storage,
			    alignment);
	*out = &d->base;
	return 0;
}
