/*
 * memory_manager.h - one stream's device memory: an ordered list of dynamic
 * pools plus a persistent pool, in front of a storage (the driver's
 * allocate/free).  This is the C counterpart of the reference's
 * MemoryManagement (../shared/reference/cubecl-runtime.md §4).
 *
 * Owner: the stream that created it (daemon/streams.c).  Thread: the device
 * thread only.  The manager never waits on the device: a slice handed to
 * memory_manager_release must already be unused by the device (the stream's
 * drop queue, memory/drop_queue.c, decides when that is).  A slice that only
 * the owner stream has used may instead be released at once with
 * memory_manager_release_after: later reservations reuse it, since the
 * stream runs their work after the work before the release, but no device
 * allocation holding it goes back to the storage before the owner stream's
 * completed count (memory_manager_set_completed) reaches the fence.  This is
 * the stream-ordered reuse of PyTorch's caching allocator and of CubeCL.
 *
 * Pool kinds (memory/pool_*.c):
 *   sliced     pages of page_size carved first-fit into slices (split on
 *              reserve, coalesce on reuse), slices up to max_slice
 *   exclusive  one slice per device allocation, up to max_alloc; sized
 *              exactly (rounded to the alignment), not to a running average
 *   persistent exact-size slices, each its own allocation (mode persistent)
 *   direct     one device allocation per reservation, any size
 *
 * Errors: GPUCMD_ETOOBIG (no pool accepts the size), GPUCMD_ENOMEM (the
 * storage refused), GPUCMD_ECAPACITY (a capped pool is full and nothing else
 * accepts), GPUCMD_EPOOLSINUSE (install while dynamic pools hold live
 * slices), GPUCMD_EINVAL (a bad configuration).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpucmd.h"

/* How a manager gets and returns device memory. */
struct memory_storage {
	int (*alloc)(void *ctx, uint64_t size, uint64_t *ptr);
	void (*free)(void *ctx, uint64_t ptr,
		     uint64_t size); /* size: alloc's */
	void *ctx;
};

/* What the device says about allocations (driver_properties). */
struct memory_device_properties {
	uint64_t max_page_size;
	uint64_t alignment;
	/*
	 * The smallest page the SubSlices ladder goes down to (0: 8 MiB):
	 * each stream that holds a small buffer keeps one such page.
	 */
	uint64_t min_page_size;
};

enum memory_pool_kind {
	MEMORY_POOL_SLICED = 1,
	MEMORY_POOL_EXCLUSIVE = 2,
	MEMORY_POOL_PERSISTENT = 3,
	MEMORY_POOL_DIRECT = 4,
};

/* One dynamic pool of a custom layout. */
struct memory_pool_options {
	enum memory_pool_kind kind; /* sliced, exclusive or direct */
	uint64_t page_size;	    /* sliced: page size */
	uint64_t max_slice;	    /* sliced: largest slice (0 = page_size) */
	uint64_t max_pool_size; /* sliced: cap on pages*page_size (0 = none) */
	uint64_t max_alloc;	/* exclusive: largest allocation */
	uint64_t
		dealloc_period; /* exclusive: reservations between periodic cleanups (0 = never) */
	uint64_t reclaim_at; /* direct: reserved-bytes watermark (0 = none) */
};

enum memory_preset {
	MEMORY_PRESET_SUBSLICES = 1, /* the default ladder (reference §4.5) */
	MEMORY_PRESET_EXCLUSIVE_PAGES = 2,
	MEMORY_PRESET_CUSTOM = 3,
};

#define MEMORY_MAX_POOLS 32

struct memory_configuration {
	enum memory_preset preset;
	size_t npools; /* custom only */
	struct memory_pool_options pools[MEMORY_MAX_POOLS];
};

enum memory_allocation_mode {
	MEMORY_MODE_AUTO = 0,
	MEMORY_MODE_PERSISTENT = 1,
};

/* MemoryUsage of the reference: sums over live slices and held memory. */
struct memory_usage {
	uint64_t allocations;	 /* live slices */
	uint64_t bytes_in_use;	 /* requested bytes of live slices */
	uint64_t bytes_padding;	 /* alignment padding of live slices */
	uint64_t bytes_reserved; /* everything held from the storage */
};

/* One pool's report. */
struct memory_pool_report {
	enum memory_pool_kind kind;
	uint64_t page_size; /* sliced: page size; exclusive: max_alloc */
	uint64_t max_slice;
	uint64_t
		max_pool_size; /* sliced: the cap on its pages' bytes (0 none) */
	uint64_t pages;	       /* device allocations held now */
	uint64_t pages_peak;
	struct memory_usage usage;
	uint64_t largest_alloc; /* largest request served (pre-padding) */
	uint64_t largest_free;	/* largest free block held */
};

struct memory_manager;
/* A live allocation inside a pool; owned by the manager. */
struct memory_slice;

/* The result of a reservation. */
struct memory_alloc {
	uint64_t ptr;  /* device address of the first byte */
	uint64_t size; /* bytes requested */
	struct memory_slice *slice;
};

/** Human name of a pool kind ("sliced", ...). */
const char *memory_pool_kind_name(enum memory_pool_kind kind);

/**
 * Check and normalise cfg for props (sizes rounded up to the alignment,
 * max_slice defaulted): 0, or GPUCMD_EINVAL with a sentence in msg.
 */
int memory_configuration_resolve(struct memory_configuration *cfg,
				 const struct memory_device_properties *props,
				 char *msg, size_t msg_len);

/** A manager with the pools cfg describes over storage. */
int memory_manager_create(const struct memory_configuration *cfg,
			  const struct memory_device_properties *props,
			  const struct memory_storage *storage,
			  struct memory_manager **out);
/** Return every allocation to the storage and free mm, live slices too. */
void memory_manager_destroy(struct memory_manager *mm);

/**
 * Reserve size bytes (size 0 is allowed and gets a distinct slice).  Does
 * not retry: the caller (command_reserve) cleans up and retries once.
 */
int memory_manager_reserve(struct memory_manager *mm, uint64_t size,
			   struct memory_alloc *out);
/**
 * Reserve size bytes in an allocation of their own (the persistent pool's
 * exact sizes), whatever the mode: for a request the quota refused a
 * larger page for (command_reserve).
 */
int memory_manager_reserve_exact(struct memory_manager *mm, uint64_t size,
				 struct memory_alloc *out);
/** Give a slice back to its pool; the device must be done with it. */
void memory_manager_release(struct memory_manager *mm,
			    struct memory_slice *slice);
/**
 * Give back a slice that the owner stream's work up to fence may still use:
 * it is free for this manager's later reservations now, and its device
 * allocation is not freed (cleanup, trim) before the fence has completed.
 */
void memory_manager_release_after(struct memory_manager *mm,
				  struct memory_slice *slice, uint64_t fence);
/**
 * Where the owner stream counts its completed fences (read, on the device
 * thread, whenever the manager is about to free a device allocation).
 * Without it, release_after is the same as release.
 */
void memory_manager_set_completed(struct memory_manager *mm,
				  const uint64_t *completed);
/** Whether a release_after fence has not yet completed. */
bool memory_manager_busy(const struct memory_manager *mm);
/**
 * Bytes the last reservation took from allocations still busy (what the
 * stream reused of its own releases); resets the count.
 */
uint64_t memory_manager_take_reused(struct memory_manager *mm);
/**
 * Bytes of device allocations that hold nothing live and that work before
 * a release_after fence may still use: no cleanup can free them yet.
 */
uint64_t memory_manager_busy_idle(const struct memory_manager *mm);
/**
 * Free what nothing uses.  explicit: every pool returns its free pages and
 * slices; otherwise only periodic (exclusive) deallocation runs.  Does
 * nothing while a capture is active.
 */
void memory_manager_cleanup(struct memory_manager *mm, bool explicit_call);
/** Usage summed over every pool. */
void memory_manager_usage(const struct memory_manager *mm,
			  struct memory_usage *out);
/** Largest free block held in any pool (0 when none). */
uint64_t memory_manager_largest_free(const struct memory_manager *mm);
/**
 * Why size was GPUCMD_ECAPACITY, as a sentence into buf: the capped pools
 * that take the size and the max_pool_size each holds ("" when none).
 */
void memory_manager_describe_capacity(const struct memory_manager *mm,
				      uint64_t size, char *buf, size_t len);
/**
 * Per-pool report, dynamic pools in routing order then the persistent pool;
 * writes up to max entries, returns how many pools there are.
 */
size_t memory_manager_report(const struct memory_manager *mm,
			     struct memory_pool_report *out, size_t max);
/** Largest size any dynamic pool accepts (persistent mode takes any). */
uint64_t memory_manager_max_alloc(const struct memory_manager *mm);
/**
 * Nest the allocation mode: persistent opens a window, auto closes one;
 * the mode is persistent while any window is open.
 */
void memory_manager_mode(struct memory_manager *mm,
			 enum memory_allocation_mode mode);
/** The effective mode now. */
enum memory_allocation_mode
memory_manager_current_mode(const struct memory_manager *mm);
/**
 * Rebuild the dynamic pools with cfg after an explicit cleanup.  When they
 * still hold live slices: GPUCMD_EPOOLSINUSE, *bytes_in_use set, old layout
 * kept.  The persistent pool is untouched.
 */
int memory_manager_install_pools(struct memory_manager *mm,
				 const struct memory_configuration *cfg,
				 const struct memory_device_properties *props,
				 uint64_t *bytes_in_use);
/** Mark a graph capture open or closed (no cleanup while open). */
void memory_manager_set_capture(struct memory_manager *mm, bool active);

/** The bytes a slice covers (its size rounded up, at least one unit). */
uint64_t memory_slice_effective(const struct memory_slice *slice);
/** The cursor recorded on a slice at bind time (0 before). */
uint64_t memory_slice_cursor(const struct memory_slice *slice);
/** Record the cursor of the command that bound the slice. */
void memory_slice_set_cursor(struct memory_slice *slice, uint64_t cursor);
