/*
 * graph.h - recorded work a stream can replay: the daemon's side of graph
 * capture.
 *
 * Between capture_begin and capture_end on a stream, the backend records
 * the stream's kernels and copies instead of running them (CUDA: stream
 * capture; host backend: an op list).  struct graph keeps what the
 * recording needs to stay valid for as long as it can be replayed:
 *   - every handle it uses holds a reference (graph_refs), and a handle with
 *     references cannot be released: the graph would write freed memory;
 *   - the bytes of every write it recorded are copied and kept, because the
 *     request that carried them is freed when its batch completes;
 *   - every module it launches holds a cache reference (graph_hold_module),
 *     so the module is not evicted while a replay may run it.
 * Allocation, reads, syncs and profiles are refused while recording: their
 * results would belong to no replay.
 *
 * Owner: the connection's stream_set.  Thread: the device thread.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "memory/drop_queue.h"
#include "streams.h"

struct driver;
struct driver_graph;
struct handle;
struct module_cache;
struct module_entry;
struct service;

struct graph {
	uint64_t id;		 /* the client's name, 0 while recording */
	uint64_t serial;	 /* unique to it in the daemon's life */
	struct driver_graph *dg; /* NULL while recording */
	struct handle **handles;
	uint32_t nhandles;
	uint32_t handles_cap;
	void **blobs; /* copies of recorded write data */
	uint32_t nblobs;
	uint32_t blobs_cap;
	struct stream_set *set; /* counts it (ngraphs, graph_bytes) */
	uint64_t kept;		/* bytes of blobs */
	uint32_t nops;		/* ops recorded */
	struct module_cache *module_cache; /* of the modules held */
	struct service *service;	   /* charged for them (max_modules) */
	struct module_entry **modules;	   /* modules its launches use */
	uint32_t nmodules;
	uint32_t modules_cap;
	uint32_t nfences; /* once destroyed: replays to wait for */
	struct drop_fence fences[STREAMS_MAX];
	struct graph *next;
};

/** A new, empty recording of set (counted in set->ngraphs until freed). */
struct graph *graph_new(struct stream_set *set);
/** Reference h from g (once per graph). */
int graph_hold(struct graph *g, struct handle *h);
/**
 * Count one more op recorded in g.  0, or GPUCMD_ELIMIT when the set's
 * graphs hold STREAMS_GRAPH_OPS_MAX already.
 */
int graph_record_op(struct graph *g);
/**
 * Count n ops of g's as not recorded after all: those of an op that failed,
 * which the driver refused to record (or, failing after its call, left a
 * node that the bound then misses; one per batch at most).
 */
void graph_unrecord_ops(struct graph *g, uint32_t n);
/**
 * Hold module e of cache c for as long as g (once per graph), held by svc
 * too (service_module_ref).  0 or GPUCMD_ENOMEM.
 */
int graph_hold_module(struct graph *g, struct module_cache *c,
		      struct module_entry *e, struct service *svc);
/**
 * Copy len bytes of data into g, the copy (*out) living as long as g.  0,
 * GPUCMD_ELIMIT when the set's graphs would keep over
 * STREAMS_GRAPH_BYTES_MAX, or GPUCMD_ENOMEM.
 */
int graph_keep(struct graph *g, const void *data, size_t len, void **out);
/** Drop g's references, its copies, its driver graph, and g. */
void graph_free(struct driver *d, struct graph *g);
/**
 * Destroy g (already out of the set's list) once the replays enqueued so
 * far have run: they read its copies and its driver graph.
 */
void graph_retire(struct stream_set *set, struct stream *current,
		  struct graph *g);
/** Free the retired graphs whose replays have run. */
void graph_flush(struct stream_set *set);
/** The graph called id in list, or NULL. */
struct graph *graph_find(struct graph *list, uint64_t id);
