/*
 * pool.h - the interface every pool kind implements, and the bookkeeping
 * they share.  memory_manager.c sees pools only through this table of
 * functions, the accept bounds and counters of struct pool, and struct
 * pool_host, its side of the bargain; the kinds live in pool_sliced.c, pool_exclusive.c,
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
 * checks that.  The alignment is a power of two (memory_configuration_resolve
 * and every pool's create refuse others), so rounding is a mask.
 *
 * The calls made on every reservation and release (accept, effective size,
 * the usage counters, dispatch) are inline here: a pooled reserve+release
 * costs tens of nanoseconds, and a call across files is a visible share.
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
	struct pool *pool;  /* the owner, for release */
	uint64_t ptr;	    /* device address of the first byte */
	uint64_t size;	    /* bytes requested */
	uint64_t effective; /* size rounded up, at least one unit */
	uint64_t cursor;    /* set at bind time, 0 when handed out */
	/*
	 * Set by memory_manager_release_after just before the release: the
	 * owner stream's fence after which the device is done with the
	 * memory (0: it is done already).  The pool keeps the largest such
	 * fence of each device allocation and frees none before it passed.
	 */
	uint64_t busy_until;
};

/* The functions a pool kind provides. */
struct pool_ops {
	/* The largest size the pool takes (its accept bounds may say more). */
	uint64_t (*max_accept)(const struct pool *pool);
	/* Reuse free space or allocate: 0, ECAPACITY, ENOMEM or ETOOBIG. */
	int (*reserve)(struct pool *pool, uint64_t size,
		       struct memory_slice **out);
	/* Take back a live slice of this pool. */
	void (*release)(struct pool *pool, struct memory_slice *slice);
	/*
	 * Return free memory to the storage; clock counts reservations.  The
	 * periodic kind (explicit_call false) keeps pool.cleanup_due current.
	 */
	void (*cleanup)(struct pool *pool, bool explicit_call, uint64_t clock);
	/*
	 * Return to the storage device allocations that hold nothing live
	 * and have held nothing since clock idle_since or earlier, until at
	 * least want bytes are returned; answers the bytes returned.
	 */
	uint64_t (*trim)(struct pool *pool, uint64_t idle_since, uint64_t want);
	/* Largest contiguous free block held (0 when none). */
	uint64_t (*largest_free)(const struct pool *pool);
	/*
	 * Bytes of device allocations that hold nothing live but that the
	 * device may still use (pool_busy): no cleanup can free them yet.
	 */
	uint64_t (*busy_idle)(const struct pool *pool);
	/* Free every device allocation, live ones too, and the pool. */
	void (*destroy)(struct pool *pool);
};

/*
 * What a manager shares with the pools it owns: its clock, which pools read
 * to date the moment an allocation became idle, and a hook that runs before
 * any of them takes more memory from the storage (memory_manager.c uses it
 * to give back what other pools hold idle first).
 */
struct pool_host {
	uint64_t clock;	      /* reservations so far */
	uint64_t reserved;    /* bytes the pools hold from the storage */
	uint64_t in_use;      /* effective bytes of the live slices */
	uint64_t in_use_peak; /* the most in_use has been */
	/*
	 * The owner stream's count of completed fences (NULL: every release
	 * comes after the device is done, and nothing is ever busy).
	 */
	const uint64_t *completed;
	/*
	 * Effective bytes handed out from allocations still busy: the stream
	 * reusing what it released (memory_manager_take_reused reads it).
	 */
	uint64_t reused_busy;
	void (*before_alloc)(struct pool_host *host, struct pool *pool,
			     uint64_t size);
};

/* State every kind shares; each kind embeds it as its first member. */
struct pool {
	const struct pool_ops *ops;
	struct memory_storage storage;
	uint64_t alignment;  /* a power of two */
	uint64_t align_mask; /* alignment - 1 */
	/*
	 * The sizes the pool takes, set by the kind when it is made: up to
	 * accept_max, and from near_min to near_max (none when near_min is
	 * above near_max).  Routing compares against these on every request,
	 * so they are data, not a call.
	 */
	uint64_t accept_max;
	uint64_t near_min, near_max;
	/*
	 * The earliest clock at which cleanup(explicit_call false) can free
	 * anything; UINT64_MAX when it never does.  The manager runs the
	 * periodic cleanup only once the earliest pool is due.
	 */
	uint64_t cleanup_due;
	struct pool_host *host; /* the owning manager; NULL on its own */
	/* Counters kept current on every change; largest_free is computed. */
	struct memory_pool_report stats;
};

/**
 * Fill the shared part of a new pool; counters start at zero, it accepts
 * no size but 0 until the kind sets its bounds, it has no periodic cleanup
 * and no host.
 */
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

/** Whether x is a power of two (0 is not). */
static inline bool pool_is_pow2(uint64_t x)
{
	return x != 0 && (x & (x - 1)) == 0;
}

/**
 * Whether using used bytes of a block of whole bytes leaves under a fifth of
 * it unused: the reference's rule for serving a request from a block larger
 * than it (sliced near-page accept, exclusive reuse).
 */
bool pool_wastes_little(uint64_t used, uint64_t whole);

/** The smallest used for which pool_wastes_little(used, whole) holds. */
uint64_t pool_little_waste_min(uint64_t whole);

/** The effective size of a request, or 0 when rounding overflows. */
static inline uint64_t pool_effective(const struct pool *pool, uint64_t size)
{
	if (size == 0)
		return pool->alignment;
	if (size > UINT64_MAX - pool->align_mask)
		return 0;
	return (size + pool->align_mask) & ~pool->align_mask;
}

/** The manager's clock, or 0 for a pool on its own. */
static inline uint64_t pool_now(const struct pool *pool)
{
	return pool->host ? pool->host->clock : 0;
}

/**
 * Allocate size bytes from the storage and count them as reserved:
 * 0, GPUCMD_ENOMEM (the storage refused) or GPUCMD_EDRIVER (unaligned).
 */
int pool_device_alloc(struct pool *pool, uint64_t size, uint64_t *ptr);

/** Return an allocation of size bytes to the storage. */
void pool_device_free(struct pool *pool, uint64_t ptr, uint64_t size);

/** Count slice as handed out for size bytes covering effective bytes. */
static inline void pool_slice_lend(struct pool *pool,
				   struct memory_slice *slice, uint64_t size,
				   uint64_t effective)
{
	struct memory_pool_report *st = &pool->stats;

	slice->pool = pool;
	slice->size = size;
	slice->effective = effective;
	slice->cursor = 0;
	slice->busy_until = 0;
	st->usage.allocations++;
	st->usage.bytes_in_use += size;
	st->usage.bytes_padding += effective - size;
	if (size > st->largest_alloc)
		st->largest_alloc = size;
	if (pool->host) {
		pool->host->in_use += effective;
		if (pool->host->in_use > pool->host->in_use_peak)
			pool->host->in_use_peak = pool->host->in_use;
	}
}

/** Count slice as no longer live. */
static inline void pool_slice_return(struct pool *pool,
				     struct memory_slice *slice)
{
	struct memory_usage *u = &pool->stats.usage;

	u->allocations--;
	u->bytes_in_use -= slice->size;
	u->bytes_padding -= slice->effective - slice->size;
	if (pool->host)
		pool->host->in_use -= slice->effective;
}

/*
 * Whether a device allocation whose largest release fence is busy_until may
 * still be in use by the device: it can be handed out again (the owner
 * stream runs later work after earlier work), but not returned to the
 * storage.  Every path that frees a free allocation, except destroy (which
 * comes after the stream is idle), skips busy ones.
 */
static inline bool pool_busy(const struct pool *pool, uint64_t busy_until)
{
	return busy_until != 0 && pool->host != NULL &&
	       pool->host->completed != NULL &&
	       *pool->host->completed < busy_until;
}

/* Note a slice of effective bytes handed out of an allocation busy_until. */
static inline void pool_note_reuse(struct pool *pool, uint64_t busy_until,
				   uint64_t effective)
{
	if (pool_busy(pool, busy_until))
		pool->host->reused_busy += effective;
}

/** Whether pool serves size (dispatch helper). */
static inline bool pool_accept(const struct pool *pool, uint64_t size)
{
	return size <= pool->accept_max ||
	       (size >= pool->near_min && size <= pool->near_max);
}

/** The largest size pool serves. */
uint64_t pool_max_accept(const struct pool *pool);

/** Reserve size bytes from pool. */
static inline int pool_reserve(struct pool *pool, uint64_t size,
			       struct memory_slice **out)
{
	return pool->ops->reserve(pool, size, out);
}

/** Give slice back to the pool that handed it out. */
static inline void pool_release(struct memory_slice *slice)
{
	slice->pool->ops->release(slice->pool, slice);
}

/** Run the pool's cleanup rule. */
void pool_cleanup(struct pool *pool, bool explicit_call, uint64_t clock);

/** Return allocations idle since idle_since or earlier, about want bytes. */
uint64_t pool_trim(struct pool *pool, uint64_t idle_since, uint64_t want);

/** Largest free block the pool holds. */
uint64_t pool_largest_free(const struct pool *pool);

/** Bytes of its allocations the pool holds idle but busy. */
uint64_t pool_busy_idle(const struct pool *pool);

/** The pool's report, largest_free included. */
void pool_report(const struct pool *pool, struct memory_pool_report *out);

/** Free the pool and everything it holds. */
void pool_destroy(struct pool *pool);
