/*
 * pool_exclusive.c - a device allocation per slice, sized exactly.
 *
 * Sizing: a new allocation is the request's effective size.  The reference
 * allocates max(running average, size), whose average starts at half of
 * max_alloc, so a first 3 GiB request on an 80 GiB device took about
 * 10 GiB (cubecl-runtime.md §11.2).  Exact sizing wastes nothing up front;
 * what it gives up, reuse by slightly larger requests later, the reuse rule
 * below recovers only where it is cheap.
 *
 * Reuse: the smallest free allocation that holds the request (best fit),
 * and only when under a fifth of it would be left unused (the same 20%
 * the sliced pool allows for a near-page request).  The smallest fit is the
 * only candidate worth checking: any larger one wastes more.  So memory
 * held by live slices stays under 1.25 times their effective size, and a
 * request never pins an allocation much larger than itself that a larger
 * request could use.  The reference instead takes the fitting allocation
 * with the lowest free_count, of any size.
 *
 * Periodic cleanup (reference §4.3): every dealloc_period / 5 reservations
 * each free allocation gains a point, and it is freed on reaching 5.  New
 * allocations start at 4 and each reuse takes a point off, so one that is
 * never reused goes at the first check after it becomes free, and one in
 * steady use earns a check of grace per reuse.
 */
#include "memory/pool_exclusive.h"

#include <stdlib.h>

#include "memory/pool_dedicated.h"

enum {
	EXCLUSIVE_NEW_COUNT = 4,     /* free_count of a new allocation */
	EXCLUSIVE_FREE_AT = 5,	     /* free_count that frees it */
	EXCLUSIVE_CHECK_DIVISOR = 5, /* checks per dealloc period */
};

struct exclusive_pool {
	struct dedicated_pool d; /* first: destroy frees through it */
	uint64_t max_alloc;
	uint64_t dealloc_period; /* 0: no periodic cleanup */
	uint64_t last_check;	 /* clock of the last check */
};

static struct exclusive_pool *to_exclusive(struct pool *pool)
{
	return pool_container_of(pool, struct exclusive_pool, d.base);
}

static const struct exclusive_pool *to_exclusive_const(const struct pool *pool)
{
	return pool_container_of(pool, const struct exclusive_pool, d.base);
}

static uint64_t exclusive_max_accept(const struct pool *pool)
{
	return to_exclusive_const(pool)->max_alloc;
}

static int exclusive_reserve(struct pool *pool, uint64_t size,
			     struct memory_slice **out)
{
	struct exclusive_pool *ep = to_exclusive(pool);
	uint64_t effective = pool_effective(pool, size);
	struct dedicated_slice *node;
	size_t i;
	int rc;

	if (effective == 0 || size > ep->max_alloc)
		return GPUCMD_ETOOBIG;
	i = pool_dedicated_fit(&ep->d, effective);
	if (i < ep->d.nfree &&
	    pool_wastes_little(effective, ep->d.free[i]->length)) {
		node = pool_dedicated_take(&ep->d, i, size, out);
		if (node->free_count > 0)
			node->free_count--;
		return 0;
	}
	rc = pool_dedicated_alloc(&ep->d, size, effective, &node, out);
	if (rc == 0)
		node->free_count = EXCLUSIVE_NEW_COUNT;
	return rc;
}

/* One periodic check for a free allocation: whether its time is up. */
static bool exclusive_aged(struct dedicated_slice *node, uint64_t unused)
{
	node->free_count++;
	return node->free_count >= EXCLUSIVE_FREE_AT;
}

/* The clock of the next periodic check, for the manager to wait for. */
static void exclusive_set_due(struct exclusive_pool *ep)
{
	uint64_t step = ep->dealloc_period / EXCLUSIVE_CHECK_DIVISOR;

	if (ep->dealloc_period == 0)
		ep->d.base.cleanup_due = UINT64_MAX;
	else if (ep->last_check > UINT64_MAX - step)
		ep->d.base.cleanup_due = UINT64_MAX;
	else
		ep->d.base.cleanup_due = ep->last_check + step;
}

static void exclusive_cleanup(struct pool *pool, bool explicit_call,
			      uint64_t clock)
{
	struct exclusive_pool *ep = to_exclusive(pool);

	if (explicit_call) {
		pool_dedicated_drop_free(&ep->d);
		return;
	}
	if (ep->dealloc_period == 0 || clock < ep->last_check ||
	    clock - ep->last_check <
		    ep->dealloc_period / EXCLUSIVE_CHECK_DIVISOR)
		return;
	ep->last_check = clock;
	exclusive_set_due(ep);
	pool_dedicated_sweep(&ep->d, exclusive_aged, 0);
}

static const struct pool_ops exclusive_ops = {
	.max_accept = exclusive_max_accept,
	.reserve = exclusive_reserve,
	.release = pool_dedicated_release,
	.cleanup = exclusive_cleanup,
	.trim = pool_dedicated_trim,
	.largest_free = pool_dedicated_largest_free,
	.busy_idle = pool_dedicated_busy_idle,
	.destroy = pool_dedicated_destroy,
};

int pool_exclusive_create(const struct memory_pool_options *opt,
			  const struct memory_storage *storage,
			  uint64_t alignment, struct pool **out)
{
	struct exclusive_pool *ep;

	if (!pool_is_pow2(alignment))
		return GPUCMD_EINVAL;
	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return GPUCMD_ENOMEM;
	pool_dedicated_init(&ep->d, &exclusive_ops, MEMORY_POOL_EXCLUSIVE,
			    storage, alignment);
	ep->d.base.stats.page_size = opt->max_alloc;
	ep->d.base.stats.max_slice = opt->max_alloc;
	ep->d.base.accept_max = opt->max_alloc;
	ep->max_alloc = opt->max_alloc;
	ep->dealloc_period = opt->dealloc_period;
	exclusive_set_due(ep);
	*out = &ep->d.base;
	return 0;
}
