/*
 * pool_dedicated.c - holding one device allocation per slice.
 *
 * The free array is sorted by length and, among equal lengths, by the time
 * the allocation became free, so a search hands out the allocation that has
 * waited longest.  Insertion and removal move pointers with memmove; free
 * allocations are few next to live ones (cleanup rules bound them), so that
 * costs little even when tens of thousands of slices are live, and the
 * live ones are never searched at all.
 */
#include "memory/pool_dedicated.h"

#include <stdlib.h>
#include <string.h>

void pool_dedicated_init(struct dedicated_pool *d, const struct pool_ops *ops,
			 enum memory_pool_kind kind,
			 const struct memory_storage *storage,
			 uint64_t alignment)
{
	pool_init(&d->base, ops, kind, storage, alignment);
	d->base.accept_max = UINT64_MAX;
	d->all = NULL;
	d->free = NULL;
	d->nfree = 0;
	d->free_cap = 0;
}

struct dedicated_pool *pool_dedicated_of(struct pool *pool)
{
	return pool_container_of(pool, struct dedicated_pool, base);
}

static const struct dedicated_pool *dedicated_const(const struct pool *pool)
{
	return pool_container_of(pool, const struct dedicated_pool, base);
}

/* First index whose length is above length (after every equal one). */
static size_t free_upper(const struct dedicated_pool *d, uint64_t length)
{
	size_t lo = 0, hi = d->nfree, mid;

	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (d->free[mid]->length <= length)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

size_t pool_dedicated_fit(const struct dedicated_pool *d, uint64_t length)
{
	size_t lo = 0, hi = d->nfree, mid;

	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (d->free[mid]->length < length)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void free_remove(struct dedicated_pool *d, size_t i)
{
	memmove(&d->free[i], &d->free[i + 1],
		(d->nfree - i - 1) * sizeof(d->free[0]));
	d->nfree--;
}

struct dedicated_slice *pool_dedicated_take(struct dedicated_pool *d, size_t i,
					    uint64_t size,
					    struct memory_slice **out)
{
	struct dedicated_slice *node = d->free[i];

	free_remove(d, i);
	pool_note_reuse(&d->base, node->busy_until, node->length);
	node->free = false;
	/*
	 * The whole node is lent, larger than the request's effective size
	 * when a pool reuses a bigger free one: the rest counts as padding,
	 * or it would look free (reserved = in use + padding + free) and a
	 * full pool would report all of it fragmented.
	 */
	pool_slice_lend(&d->base, &node->slice, size, node->length);
	*out = &node->slice;
	return node;
}

int pool_dedicated_alloc(struct dedicated_pool *d, uint64_t size,
			 uint64_t length, struct dedicated_slice **node_out,
			 struct memory_slice **out)
{
	struct dedicated_slice **arr, *node;
	int rc;

	/*
	 * Make room in the free array now: release must not fail, and the
	 * array can then always take every allocation this pool holds.
	 */
	arr = pool_grow(d->free, &d->free_cap, d->base.stats.pages + 1,
			sizeof(*arr));
	if (!arr)
		return GPUCMD_ENOMEM;
	d->free = arr;
	node = calloc(1, sizeof(*node));
	if (!node)
		return GPUCMD_ENOMEM;
	rc = pool_device_alloc(&d->base, length, &node->slice.ptr);
	if (rc < 0) {
		free(node);
		return rc;
	}
	node->length = length;
	node->next = d->all;
	if (d->all)
		d->all->prev = node;
	d->all = node;
	pool_slice_lend(&d->base, &node->slice, size,
			pool_effective(&d->base, size));
	if (node_out)
		*node_out = node;
	*out = &node->slice;
	return 0;
}

/* Return node, already off the free array, to the storage. */
static void dedicated_free_node(struct dedicated_pool *d,
				struct dedicated_slice *node)
{
	if (node->prev)
		node->prev->next = node->next;
	else
		d->all = node->next;
	if (node->next)
		node->next->prev = node->prev;
	pool_device_free(&d->base, node->slice.ptr, node->length);
	free(node);
}

void pool_dedicated_drop(struct dedicated_pool *d, size_t i)
{
	struct dedicated_slice *node = d->free[i];

	free_remove(d, i);
	dedicated_free_node(d, node);
}

uint64_t pool_dedicated_sweep(struct dedicated_pool *d,
			      bool (*doomed)(struct dedicated_slice *node,
					     uint64_t arg),
			      uint64_t arg)
{
	uint64_t freed = 0;
	size_t i, kept = 0;

	/* One compacting pass keeps the order of the survivors. */
	for (i = 0; i < d->nfree; i++) {
		if (!pool_busy(&d->base, d->free[i]->busy_until) &&
		    (!doomed || doomed(d->free[i], arg))) {
			freed += d->free[i]->length;
			dedicated_free_node(d, d->free[i]);
		} else {
			d->free[kept++] = d->free[i];
		}
	}
	d->nfree = kept;
	return freed;
}

void pool_dedicated_drop_free(struct dedicated_pool *d)
{
	pool_dedicated_sweep(d, NULL, 0);
}

uint64_t pool_dedicated_trim(struct pool *pool, uint64_t idle_since,
			     uint64_t want)
{
	struct dedicated_pool *d = pool_dedicated_of(pool);
	uint64_t freed = 0;
	size_t i = d->nfree;

	/* Largest first: the fewest driver frees return what is wanted. */
	while (i-- > 0 && freed < want) {
		if (d->free[i]->idle_since > idle_since ||
		    pool_busy(&d->base, d->free[i]->busy_until))
			continue;
		freed += d->free[i]->length;
		pool_dedicated_drop(d, i);
	}
	return freed;
}

int pool_dedicated_reserve_exact(struct dedicated_pool *d, uint64_t size,
				 uint64_t reclaim_at, struct memory_slice **out)
{
	uint64_t effective = pool_effective(&d->base, size);
	const struct memory_usage *u = &d->base.stats.usage;
	size_t i;

	if (effective == 0)
		return GPUCMD_ETOOBIG;
	i = pool_dedicated_fit(d, effective);
	if (i < d->nfree && d->free[i]->length == effective) {
		pool_dedicated_take(d, i, size, out);
		return 0;
	}
	/*
	 * Largest first: the fewest driver frees bring the total under.
	 * Allocations the device may still use stay.
	 */
	for (i = d->nfree; reclaim_at != 0 && i-- > 0 &&
			   (u->bytes_reserved > reclaim_at ||
			    effective > reclaim_at - u->bytes_reserved);)
		if (!pool_busy(&d->base, d->free[i]->busy_until))
			pool_dedicated_drop(d, i);
	return pool_dedicated_alloc(d, size, effective, NULL, out);
}

void pool_dedicated_cleanup_explicit(struct pool *pool, bool explicit_call,
				     uint64_t clock)
{
	if (explicit_call)
		pool_dedicated_drop_free(pool_dedicated_of(pool));
}

void pool_dedicated_release(struct pool *pool, struct memory_slice *slice)
{
	struct dedicated_pool *d = pool_dedicated_of(pool);
	struct dedicated_slice *node =
		pool_container_of(slice, struct dedicated_slice, slice);
	size_t i;

	if (node->free)
		return;
	pool_slice_return(pool, slice);
	node->free = true;
	node->idle_since = pool_now(pool);
	if (slice->busy_until > node->busy_until)
		node->busy_until = slice->busy_until;
	/* After its equals: among equal lengths the oldest is reused first. */
	i = free_upper(d, node->length);
	memmove(&d->free[i + 1], &d->free[i],
		(d->nfree - i) * sizeof(d->free[0]));
	d->free[i] = node;
	d->nfree++;
}

uint64_t pool_dedicated_busy_idle(const struct pool *pool)
{
	const struct dedicated_pool *d = dedicated_const(pool);
	uint64_t sum = 0;

	for (size_t i = 0; i < d->nfree; i++)
		if (pool_busy(pool, d->free[i]->busy_until))
			sum += d->free[i]->length;
	return sum;
}

uint64_t pool_dedicated_largest_free(const struct pool *pool)
{
	const struct dedicated_pool *d = dedicated_const(pool);

	return d->nfree ? d->free[d->nfree - 1]->length : 0;
}

void pool_dedicated_destroy(struct pool *pool)
{
	struct dedicated_pool *d = pool_dedicated_of(pool);

	while (d->all)
		dedicated_free_node(d, d->all);
	free(d->free);
	/* The kind's struct starts with d, so this frees all of it. */
	free(d);
}

uint64_t pool_dedicated_max_any(const struct pool *pool)
{
	/* The largest size whose effective size does not overflow. */
	return UINT64_MAX - UINT64_MAX % pool->alignment;
}
