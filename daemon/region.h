/*
 * region.h - shared regions: memory a client shares with the daemon once
 * (a memfd passed over the socket) and then only names, so bulk data moves
 * between the client and the device without passing through the socket.
 *
 * Safety: a region is mapped only when its memfd is sealed against
 * shrinking (F_SEAL_SHRINK) and at least as large as announced, so the
 * client cannot truncate it under the daemon and turn a copy into SIGBUS.
 * Every access is bounds-checked against the announced size.  On CUDA the
 * mapping is registered as pinned memory, so a copy is one DMA.
 *
 * Lifetime: each op that copies from or into a region notes its stream
 * and batch (region_note_use); release unmaps the region once those
 * batches have completed, like released device memory (drop_queue.h), and
 * at once when none is still to run.  The end of the connection unmaps
 * everything (its streams are idle by then).
 *
 * Accounting: a region's bytes count against its service's region_limit
 * (gpucmdd.conf(5)) from the attach until it is really unmapped, released
 * ones waiting for their fences included: that is when the pinned pages go
 * back.  A connection that ends returns all of its regions' bytes.
 *
 * Owner: the connection's stream_set.  Thread: the device thread.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memory/drop_queue.h"
#include "streams.h"

#define REGION_MAX_PER_CONNECTION 64

struct region {
	uint64_t id;
	int fd;
	uint8_t *base;
	uint64_t size;
	bool registered; /* pinned with the driver */
	/*
	 * The last batch on each stream with a copy from or into it: what a
	 * release waits for.
	 */
	uint32_t nfences;
	struct drop_fence fences[STREAMS_MAX];
	struct region *next;
};

/**
 * Map the memfd fd (ownership passes, closed on failure) as region id of
 * size bytes and charge it to the set's service.  GPUCMD_EINVAL (not
 * sealed, too small, not a memfd), GPUCMD_EEXIST, GPUCMD_ELIMIT (regions
 * per connection), GPUCMD_EQUOTA (over the service's region_limit; nothing
 * is mapped), GPUCMD_ENOMEM; a sentence in msg.
 */
int region_attach(struct stream_set *set, uint64_t id, int fd, uint64_t size,
		  char *msg, size_t msg_len);
/** The live region id, or NULL. */
struct region *region_find(struct stream_set *set, uint64_t id);
/**
 * Check that [offset, offset+length) lies inside r: 0 or GPUCMD_EINVAL
 * with the numbers in msg.
 */
int region_check(const struct region *r, uint64_t offset, uint64_t length,
		 char *msg, size_t msg_len);
/** An op of the batch being dispatched on stream s copies from or into r. */
void region_note_use(struct region *r, const struct stream *s);
/**
 * Release region id: it leaves the table at once and is unmapped once the
 * batches that copy from or into it have completed (at once when they
 * have).  GPUCMD_ENOTFOUND.
 */
int region_release(struct stream_set *set, struct stream *current, uint64_t id);
/** Unmap released regions whose fences passed, uncharging the service. */
void region_flush(struct stream_set *set);
/** Unmap everything, uncharging the service (teardown: streams idle). */
void region_teardown(struct stream_set *set);
