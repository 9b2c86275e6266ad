/*
 * drop_queue.h - memory a client released that the device may still use.
 *
 * A released handle's slice cannot go back to its pool at once: work
 * enqueued before the release (on its owner stream, or on another stream
 * that used it) may not have run yet.  The slice waits here with one fence
 * per stream that used it: that stream's batch sequence number at release
 * time.  A stream's `completed` sequence moves forward as its batches'
 * completion callbacks arrive; an entry is freed once every fence passed.
 *
 * A slice that only its owner stream used, released on that stream, goes
 * back to the pools at once instead (stream-ordered reuse, streams.c); an
 * entry without a slice then keeps only its bytes counted, against the
 * quota, until the fence has passed (drop_queue_push_ordered).
 *
 * One queue per stream (the owner of the memory).  Thread: device thread.
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct memory_manager;
struct memory_slice;
struct stream;

/* A stream must have completed batch `seq` before the entry is free. */
struct drop_fence {
	const struct stream *stream;
	uint64_t seq;
};

struct drop_queue;

/**
 * An empty queue for slices of mm.  pending (may be NULL) is a counter the
 * queue keeps the bytes of its entries in (the `charged` of each push),
 * from push until the entry is freed: a service's released memory that
 * the device may still use.  ordered (may be NULL) is the counter of
 * drop_queue_push_ordered's entries.
 */
int drop_queue_create(struct memory_manager *mm, uint64_t *pending,
		      uint64_t *ordered, struct drop_queue **out);
/** Free the queue; entries still held are released to the manager. */
void drop_queue_destroy(struct drop_queue *q);
/**
 * Queue slice until every fence has passed (fences are copied).  On
 * allocation failure the caller must keep the slice alive itself.
 */
int drop_queue_push(struct drop_queue *q, struct memory_slice *slice,
		    uint64_t charged, const struct drop_fence *fences,
		    uint32_t nfences);
/**
 * Count charged bytes in the ordered counter, and in local (may be NULL),
 * until fence has passed: a slice already back in the pools
 * (memory_manager_release_after) that work before the fence may still use.
 */
int drop_queue_push_ordered(struct drop_queue *q, uint64_t charged,
			    const struct drop_fence *fence, uint64_t *local);
/** Release every entry whose fences passed; returns how many. */
uint32_t drop_queue_flush(struct drop_queue *q);
/** Entries waiting. */
uint32_t drop_queue_length(const struct drop_queue *q);
/**
 * Bytes of the slices waiting (push's charged): the pools still count them
 * in use, though no handle holds them.
 */
uint64_t drop_queue_bytes(const struct drop_queue *q);
