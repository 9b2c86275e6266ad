/*
 * pool.h - the interface every pool kind implements, and the bookkeeping
 * they share.  memory_manager.c sees pools only through this table of
 * functions; the kinds live in pool_sliced.c, pool_exclusive.c,
 * pool_persistent.c and pool_direct.c (the last three are built on the
 * one-allocation-per-slice engine of pool_dedicated.c).
 *
 * A pool owns its device allocations (pages) and the slices carved from
 * them.  A slice handed out is a struct memory_slice embedded at the start
 * of the kind's own node, so release finds the pool and the node from the
 * slice alone.
 *
 * Sizes: every slice covers its effective size, the request rounded up to
 * the alignment and never less than one alignment unit.  The unit for a
 * zero-byte request gives it an address no other live slice has, and keeps
 * every device allocation non-empty (cuMemAlloc refuses 0 bytes).  The
 * storage must return addresses aligned to the alignment; pool_device_alloc
 * checks that.
 *
 * Thread: the device thread only, like the manager that owns the pools.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memory/memory_manager.h"

/* The node type that embeds member, from a pointer to that member. */
#define pool_container_of(ptr, type, member) \
	((type *)(void *)((char *)(ptr) - offsetof(type, member)))

struct pool;

/* What a live allocation looks like to the manager and its caller. */
struct memory_slice {
	struct pool *pool;	/* the owner, for release */
	uint64_t ptr;		/* device address of the first byte */
	uint64_t size;		/* bytes requested */
	uint64_t effective;	/* size rounded up, at least one unit */
	uint64_t cursor;	/* set at bind time, 0 when handed out */
};

/* The functions a pool kind provides. */
struct pool_ops {
	/* Whether this pool serves a request of size bytes at all. */
	bool (*accept)(const struct pool *pool, uint64_t size);
	/* The largest size accept takes. */
	uint64_t (*max_accept)(const struct pool *pool);
	/* Reuse free space or allocate: 0, ECAPACITY, ENOMEM or ETOOBIG. */
	int (*reserve)(struct pool *pool, uint64_t size,
		       struct memory_slice **out);
	/* Take back a live slice of this pool. */
	void (*release)(struct pool *pool, struct memory_slice *slice);
	/* Return free memory to the storage; clock counts reservations. */
	void (*cleanup)(struct pool *pool, bool explicit_call, uint64_t clock);
	/* Largest contiguous free block held (0 when none). */
	uint64_t (*largest_free)(const struct pool *pool);
	/* Free every device allocation, live ones too, and the pool. */
	void (*destroy)(struct pool *pool);
};

/* State every kind shares; each kind embeds it as its first member. */
struct pool {
	const struct pool_ops *ops;
	struct memory_storage storage;
	uint64_t alignment;
	/* Counters kept current on every change; largest_free is computed. */
	struct memory_pool_report stats;
};

/** Fill the shared part of a new pool; counters start at zero. */
void pool_init(struct pool *pool, const struct pool_ops *ops,
	       enum memory_pool_kind kind, const struct memory_storage *storage,
	       uint64_t alignment);

/** A pool of the kind opt names (never persistent): 0 or a negative code. */
int pool_create(const struct memory_pool_options *opt,
		const struct memory_storage *storage, uint64_t alignment,
		struct pool **out);

/**
 * arr, grown so that it holds at least need elements of elem bytes (*cap
 * is updated); NULL, with arr untouched, when memory is short.
 */
void *pool_grow(void *arr, size_t *cap, size_t need, size_t elem);

/** Round x up to a multiple of unit; false when that overflows. */
bool pool_round_up(uint64_t x, uint64_t unit, uint64_t *out);

/**
 * Whether using used bytes of a block of whole bytes leaves under a fifth of
 * it unused: the reference's rule for serving a request from a block larger
 * than it (sliced near-page accept, exclusive reuse).
 */
bool pool_wastes_little(uint64_t used, uint64_t whole);

/** The effective size of a request, or 0 when rounding overflows. */
uint64_t pool_effective(const struct pool *pool, uint64_t size);

/**
 * Allocate size bytes from the storage and count them as reserved:
 * 0, GPUCMD_ENOMEM (the storage refused) or GPUCMD_EDRIVER (unaligned).
 */
int pool_device_alloc(struct pool *pool, uint64_t size, uint64_t *ptr);

/** Return an allocation of size bytes to the storage. */
void pool_device_free(struct pool *pool, uint64_t ptr, uint64_t size);

/** Count slice as handed out for size bytes covering effective bytes. */
void pool_slice_lend(struct pool *pool, struct memory_slice *slice,
		     uint64_t size, uint64_t effective);

/** Count slice as no longer live. */
void pool_slice_return(struct pool *pool, struct memory_slice *slice);

/** Whether pool serves size (dispatch helper). */
bool pool_accept(const struct pool *pool, uint64_t size);

/** The largest size pool serves. */
uint64_t pool_max_accept(const struct pool *pool);

/** Reserve size bytes from pool. */
int pool_reserve(struct pool *pool, uint64_t size, struct memory_slice **out);

/** Give slice back to the pool that handed it out. */
void pool_release(struct memory_slice *slice);

/** Run the pool's cleanup rule. */
void pool_cleanup(struct pool *pool, bool explicit_call, uint64_t clock);

/** Largest free block the pool holds. */
uint64_t pool_largest_free(const struct pool *pool);

/** The pool's report, largest_free included. */
void pool_report(const struct pool *pool, struct memory_pool_report *out);

/** Free the pool and everything it holds. */
void pool_destroy(struct pool *pool);
