/*
 * pool_sliced.h - a pool of equal pages carved into slices (reference
 * SlicedPool, cubecl-runtime.md §4.3).
 *
 * Each page is split first-fit on reserve and its adjacent free slices are
 * merged on release, so a page whose slices are all released is one free
 * block again.  Pages go back to the storage on an explicit cleanup, or
 * when the owning manager trims pages idle for a while (pool_trim).
 * A pool with max_pool_size holds at most max_pool_size / page_size pages
 * and answers GPUCMD_ECAPACITY beyond that, which lets the manager spill
 * the request to the next pool.
 *
 * Thread: the device thread only.
 */
#pragma once

#include "memory/pool.h"

/** A sliced pool for resolved options (page_size, max_slice, max_pool_size). */
int pool_sliced_create(const struct memory_pool_options *opt,
		       const struct memory_storage *storage, uint64_t alignment,
		       struct pool **out);
