/*
 * pinned.h - the daemon's pool of pinned (page-locked) host memory.
 *
 * Pinned pages copy to and from the device by DMA without a bounce
 * buffer, but they are scarce, so the pool has a budget; reserve_cpu falls
 * back to the heap when the pool cannot serve (the seed's rule: it always
 * answers).  Inside, it is a memory manager (sub-slices) over the driver's
 * pinned allocations, so small buffers share pages.
 *
 * Owner: the executor (one per daemon).  Thread: the device thread, except
 * that release and usage may come from any thread (a reply is written from
 * its read staging by the loop, which gives the staging back): a mutex
 * guards the pool, and release never calls the driver.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "memory/memory_manager.h"

struct driver;
struct pinned_pool;

/* Larger requests go to the heap at once: pinning them would take the pool. */
#define PINNED_MAX_REQUEST (100u << 20)

/** A pool of at most budget bytes of pinned memory from d. */
int pinned_pool_create(struct driver *d, uint64_t budget,
		       struct pinned_pool **out);
/** Return everything to the driver (every slice must be released). */
void pinned_pool_destroy(struct pinned_pool *p);
/** size bytes of pinned memory; GPUCMD_ENOMEM when the pool cannot. */
int pinned_pool_reserve(struct pinned_pool *p, size_t size, void **ptr,
			struct memory_slice **slice);
/** Give a reservation back. */
void pinned_pool_release(struct pinned_pool *p, struct memory_slice *slice);
/** The pool's usage. */
void pinned_pool_usage(struct pinned_pool *p, struct memory_usage *out);
