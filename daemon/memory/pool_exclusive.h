/*
 * pool_exclusive.h - a pool where every slice is a device allocation of its
 * own, for requests up to max_alloc (reference ExclusiveMemoryPool,
 * cubecl-runtime.md §4.3, with exact sizing instead of the running average
 * of §11.2).
 *
 * A free allocation is reused for a request it holds with under a fifth of
 * it left unused; otherwise a new allocation of exactly the request's
 * effective size is made.  Free allocations go back to the storage on an
 * explicit cleanup, after some periodic checks (dealloc_period) without
 * being reused, or when the owning manager trims idle ones (pool_trim).
 *
 * Thread: the device thread only.
 */
#pragma once

#include "memory/pool.h"

/** An exclusive pool for resolved options (max_alloc, dealloc_period). */
int pool_exclusive_create(const struct memory_pool_options *opt,
			  const struct memory_storage *storage,
			  uint64_t alignment, struct pool **out);
