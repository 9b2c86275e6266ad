/*
 * batch.h - what the rest of the library needs from the batch builder
 * beyond the public gpucmd_batch_* calls: ops that have no public builder
 * because a library call wraps them in a round trip of its own.
 *
 * A batch is the protobuf Request being built; it belongs to the thread of
 * its connection and is consumed by gpucmd_submit.
 */
#pragma once

#include "gpucmd.h"
#include "gpucmd.pb-c.h"

/*
 * What a connection keeps of its submitted batches, so that a steady stream
 * of small ones makes no malloc or free per batch: freeing a block next to
 * the top of glibc's heap made it consolidate its fast bins every time, a
 * tenth of the client's user CPU per ping.  One spare batch (its ops array
 * kept) and spare op blocks without a tail.
 */
struct batch_cache {
	struct gpucmd_batch *batch;
	struct batch_op *ops;
	unsigned nops;
};

/** Free what c keeps (gpucmd_close). */
void batch_cache_clear(struct batch_cache *c);

/**
 * Queue an op that carries no fields (sync, memory_usage, ping,
 * memory_report, status, cursor, stream_report, memory_cleanup,
 * flush_drops, capture_begin); GPUCMD_EINVAL for any other kind.
 */
int batch_add_plain(struct gpucmd_batch *b, Gpucmd__Op__OpCase kind);
/** Queue an evict (service NULL = any); it must be the request's only op. */
int batch_add_evict(struct gpucmd_batch *b, const char *service,
		    uint64_t connection_id);
/** Queue a cleanup of service (NULL = the caller's own). */
int batch_add_cleanup(struct gpucmd_batch *b, const char *service);
/**
 * Queue a region_attach of region (size bytes) whose memfd fd (borrowed:
 * it must stay open until submit) goes with the request's frame.
 */
int batch_add_region_attach(struct gpucmd_batch *b, uint64_t region,
			    uint64_t size, int fd);
/** Queue a region_release of any region, the library's own included. */
int batch_add_region_release(struct gpucmd_batch *b, uint64_t region);
