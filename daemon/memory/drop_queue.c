/*
 * drop_queue.c - see drop_queue.h.  Entries are kept in release order in a
 * growable array; flush compacts it in one pass.
 */
#include "memory/drop_queue.h"

#include <stdlib.h>
#include <string.h>

#include "gpucmd.h"
#include "memory/memory_manager.h"
#include "streams.h"

struct drop_entry {
	struct memory_slice *slice; /* NULL: counted only (push_ordered) */
	uint64_t *counter;	    /* where charged is counted, or NULL */
	uint64_t *local;	    /* and a second place, or NULL */
	uint64_t charged;
	uint32_t nfences;
	struct drop_fence *fences;
};

struct drop_queue {
	struct memory_manager *mm;
	uint64_t *pending;    /* the owner's count, or NULL */
	uint64_t *ordered;    /* the same for push_ordered */
	uint64_t slice_bytes; /* charged of the entries with a slice */
	struct drop_entry *entries;
	uint32_t count;
	uint32_t cap;
};

int drop_queue_create(struct memory_manager *mm, uint64_t *pending,
		      uint64_t *ordered, struct drop_queue **out)
{
	struct drop_queue *q = calloc(1, sizeof(*q));

	if (q == NULL)
		return GPUCMD_ENOMEM;
	q->mm = mm;
	q->pending = pending;
	q->ordered = ordered;
	*out = q;
	return 0;
}

/* The entry's bytes leave its counters. */
static void uncount(struct drop_queue *q, const struct drop_entry *e)
{
	if (e->slice != NULL)
		q->slice_bytes -= e->charged;
	if (e->counter != NULL)
		*e->counter -= e->charged;
	if (e->local != NULL)
		*e->local -= e->charged;
}

void drop_queue_destroy(struct drop_queue *q)
{
	if (q == NULL)
		return;
	for (uint32_t i = 0; i < q->count; i++) {
		uncount(q, &q->entries[i]);
		memory_manager_release(q->mm, q->entries[i].slice);
		free(q->entries[i].fences);
	}
	free(q->entries);
	free(q);
}

/* Queue an entry whose bytes are counted in counter (may be NULL). */
static int push(struct drop_queue *q, struct memory_slice *slice,
		uint64_t *counter, uint64_t *local, uint64_t charged,
		const struct drop_fence *fences, uint32_t nfences)
{
	struct drop_entry *e;
	struct drop_fence *copy;

	if (q->count == q->cap) {
		uint32_t cap = q->cap ? q->cap * 2 : 16;
		struct drop_entry *n = realloc(q->entries, cap * sizeof(*n));
		if (n == NULL)
			return GPUCMD_ENOMEM;
		q->entries = n;
		q->cap = cap;
	}
	copy = malloc(nfences * sizeof(*copy) + 1);
	if (copy == NULL)
		return GPUCMD_ENOMEM;
	memcpy(copy, fences, nfences * sizeof(*copy));
	e = &q->entries[q->count++];
	e->slice = slice;
	e->counter = counter;
	e->local = local;
	e->charged = charged;
	if (slice != NULL)
		q->slice_bytes += charged;
	if (counter != NULL)
		*counter += charged;
	if (local != NULL)
		*local += charged;
	e->nfences = nfences;
	e->fences = copy;
	return 0;
}

int drop_queue_push(struct drop_queue *q, struct memory_slice *slice,
		    uint64_t charged, const struct drop_fence *fences,
		    uint32_t nfences)
{
	return push(q, slice, q->pending, NULL, charged, fences, nfences);
}

int drop_queue_push_ordered(struct drop_queue *q, uint64_t charged,
			    const struct drop_fence *fence, uint64_t *local)
{
	return push(q, NULL, q->ordered, local, charged, fence, 1);
}

uint32_t drop_queue_flush(struct drop_queue *q)
{
	uint32_t kept = 0;
	uint32_t freed = 0;

	for (uint32_t i = 0; i < q->count; i++) {
		struct drop_entry *e = &q->entries[i];
		if (streams_fences_passed(e->fences, e->nfences)) {
			memory_manager_release(q->mm, e->slice);
			uncount(q, e);
			free(e->fences);
			freed++;
		} else {
			q->entries[kept++] = *e;
		}
	}
	q->count = kept;
	return freed;
}

uint32_t drop_queue_length(const struct drop_queue *q)
{
	return q->count;
}

uint64_t drop_queue_bytes(const struct drop_queue *q)
{
	return q->slice_bytes;
}
