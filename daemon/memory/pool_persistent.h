/*
 * pool_persistent.h - the manager's persistent pool (reference
 * PersistentPool, cubecl-runtime.md §4.3): exact-size slices, each a device
 * allocation of its own, reused only by a request of the same effective
 * size.  It serves every request made in persistent mode, of any size, and
 * survives a rebuild of the dynamic pools.  Free slices go back to the
 * storage on an explicit cleanup only.
 *
 * Thread: the device thread only.
 */
#pragma once

#include "memory/pool.h"

/** The persistent pool of a manager. */
int pool_persistent_create(const struct memory_storage *storage,
			   uint64_t alignment, struct pool **out);
