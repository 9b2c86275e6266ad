/*
 * pool_dedicated.h - the engine under the pools whose every slice is a
 * device allocation of its own: exclusive, persistent and direct.
 *
 * Those kinds differ only in which requests they take, which free
 * allocation they are willing to reuse and when they give free ones back;
 * the holding of allocations is the same and lives here.  Free allocations
 * are kept in an array sorted by length, so the smallest one that holds a
 * request is a binary search away; live ones are only counted, and sit on
 * one list with the free ones so that destroy can find them all.
 *
 * Thread: the device thread only.
 */
#pragma once

#include "memory/pool.h"

/* One device allocation and the slice it serves. */
struct dedicated_slice {
	/* ptr is the allocation; effective is the current slice's cover. */
	struct memory_slice slice;
	uint64_t length;     /* bytes held from the storage */
	uint64_t idle_since; /* the clock when it last became free */
	uint64_t busy_until; /* the largest release fence (pool_busy) */
	uint32_t free_count; /* exclusive pool: grace before freeing */
	bool free;
	struct dedicated_slice *prev, *next; /* every allocation */
};

/* The shared state; a kind embeds it first and adds its own settings. */
struct dedicated_pool {
	struct pool base;
	struct dedicated_slice *all;
	struct dedicated_slice **free; /* sorted by length, then age */
	size_t nfree;
	size_t free_cap;
};

/**
 * Initialise d (embedded in a kind's pool) with that kind's ops; it takes
 * any size until the kind narrows pool.accept_max.
 */
void pool_dedicated_init(struct dedicated_pool *d, const struct pool_ops *ops,
			 enum memory_pool_kind kind,
			 const struct memory_storage *storage,
			 uint64_t alignment);

/** The dedicated pool a struct pool is the base of. */
struct dedicated_pool *pool_dedicated_of(struct pool *pool);

/** Index of the shortest free allocation of length or more (nfree: none). */
size_t pool_dedicated_fit(const struct dedicated_pool *d, uint64_t length);

/** Hand out the free allocation at index i for size bytes. */
struct dedicated_slice *pool_dedicated_take(struct dedicated_pool *d, size_t i,
					    uint64_t size,
					    struct memory_slice **out);

/**
 * Reserve for the exact-size kinds: reuse a free allocation of exactly the
 * request's effective size, else allocate that size.  With reclaim_at (0:
 * none), free allocations, largest first, go back to the storage while the
 * new one would take reserved bytes over it.
 */
int pool_dedicated_reserve_exact(struct dedicated_pool *d, uint64_t size,
				 uint64_t reclaim_at,
				 struct memory_slice **out);

/** Allocate length bytes from the storage and hand them out for size bytes. */
int pool_dedicated_alloc(struct dedicated_pool *d, uint64_t size,
			 uint64_t length, struct dedicated_slice **node,
			 struct memory_slice **out);

/** Return the free allocation at index i, not busy, to the storage. */
void pool_dedicated_drop(struct dedicated_pool *d, size_t i);

/** Return every free allocation to the storage. */
void pool_dedicated_drop_free(struct dedicated_pool *d);

/**
 * Visit the free allocations in order and return to the storage those for
 * which doomed(node, arg) says true (NULL: all); doomed may update the node
 * it gets.  Allocations the device may still use (pool_busy) are kept and
 * not shown to doomed.  Answers the bytes returned.
 */
uint64_t pool_dedicated_sweep(struct dedicated_pool *d,
			      bool (*doomed)(struct dedicated_slice *node,
					     uint64_t arg),
			      uint64_t arg);

/** Cleanup op of the kinds that free only on an explicit cleanup. */
void pool_dedicated_cleanup_explicit(struct pool *pool, bool explicit_call,
				     uint64_t clock);

/** Release op shared by the dedicated kinds. */
void pool_dedicated_release(struct pool *pool, struct memory_slice *slice);

/** Trim op shared by the dedicated kinds: free allocations idle long enough. */
uint64_t pool_dedicated_trim(struct pool *pool, uint64_t idle_since,
			     uint64_t want);

/** Busy-idle op shared by the dedicated kinds. */
uint64_t pool_dedicated_busy_idle(const struct pool *pool);

/** Largest free op shared by the dedicated kinds. */
uint64_t pool_dedicated_largest_free(const struct pool *pool);

/** Destroy op shared by the dedicated kinds. */
void pool_dedicated_destroy(struct pool *pool);

/** Max accept op of the kinds that take any size. */
uint64_t pool_dedicated_max_any(const struct pool *pool);
