/*
 * pool_direct.h - a pool that takes any size and gives each reservation a
 * device allocation of its own (reference DirectPool, cubecl-runtime.md
 * §4.3).  A free allocation is reused only by a request of the same
 * effective size.  With reclaim_at set, free allocations are returned
 * before a new one would take the pool's reserved bytes over that mark; it
 * is a watermark, not a budget, so the new allocation is made regardless.
 * Free allocations also go back on an explicit cleanup, or when the owning
 * manager trims idle ones (pool_trim).
 *
 * Thread: the device thread only.
 */
#pragma once

#include "memory/pool.h"

/** A direct pool for resolved options (reclaim_at). */
int pool_direct_create(const struct memory_pool_options *opt,
		       const struct memory_storage *storage, uint64_t alignment,
		       struct pool **out);
