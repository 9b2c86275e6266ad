/*
 * streams.h - one connection's streams and the ordering between them.
 *
 * A client names streams by small numbers; the first use of a number
 * creates a device stream with its own memory manager (memory belongs to
 * the stream that created it) and its own drop queue.  struct stream_set is
 * everything the device thread holds for one connection: its streams and
 * its handle table.
 *
 * Ordering (the seed's "resolve"): before a command runs on stream S with
 * some handles, S is made to wait, on the device (event record + wait, never
 * a host block), for
 *   - the last write of each handle it reads or writes, and
 *   - every read since that write of each handle it writes,
 * when those happened on other streams and S has not already waited past
 * them.  Unlike the reference (cubecl-runtime.md §3.6) the last *writer* is
 * tracked, not only the allocating stream, so a reader always sees the last
 * write.  Each stream's cursor counts its commands; `synced[j]` is the
 * cursor of stream j that S has already waited for.
 *
 * Completion: every batch gets a sequence number on its stream (`submitted`)
 * and a driver callback after its work; `completed` follows the callbacks.
 * Released memory waits in the owner's drop queue until every stream that
 * used it has completed the batch in which it was released; memory that
 * only its owner used, released on the owner, is free for the owner's next
 * reservation at once (stream order keeps the new work after the old), and
 * only its device allocation waits for that batch to complete.
 *
 * Thread: the device thread only (stream_completed may be read by anyone
 * on that thread; callbacks hand completions over through the executor).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "driver/driver.h"
#include "memory/drop_queue.h"
#include "memory/handle.h"
#include "memory/memory_manager.h"
#include "module.h"

#define STREAMS_MAX 64

/*
 * Per connection: open profiles (each holds a device event), graphs (kept
 * or retired with replays still to run), and the bytes of write data its
 * graphs keep (host memory no quota counts otherwise).  Past them:
 * GPUCMD_ELIMIT with the numbers.
 */
#define STREAMS_MAX_PROFILES 1024
#define STREAMS_MAX_GRAPHS 1024
#define STREAMS_GRAPH_BYTES_MAX (256ull << 20)
/*
 * Ops the graphs of a connection hold (each is the backend's record of it,
 * about a hundred bytes of host memory), so that a capture never ended
 * cannot grow without bound one small launch at a time.
 */
#define STREAMS_GRAPH_OPS_MAX (1u << 18)
/*
 * Ops that a connection's graph launches have enqueued and whose batches
 * have not completed.  A launch of a few bytes on the wire copies the
 * graph's whole op list onto the stream (the host backend, on the device
 * thread), so without a bound one batch of launches of a large graph made
 * the daemon hold gigabytes and the device thread copy for seconds while
 * every other service waited.  As many as the graphs may record: one
 * graph of the largest size, whose copy takes the device thread about as
 * long as a batch of max_ops_per_batch launches.  Only on a backend whose
 * launch copies them (driver_properties.graph_launch_copies): CUDA's
 * cuGraphLaunch is one call whatever the graph holds, and there pipelined
 * replays of a captured graph are the fast path, not to be refused.
 */
#define STREAMS_REPLAY_OPS_MAX STREAMS_GRAPH_OPS_MAX

struct drop_queue;
struct graph;
struct module_cache;
struct region;
struct service;
struct shared_buffer;
struct stream_set;

/* An open profile: device time from its start event to its end. */
struct profile {
	uint64_t id;
	struct stream *stream;
	struct driver_event *start;
	bool valid; /* false once a launch on its stream was refused */
	char reason[128];
	/* The stream's first fence that may cover work timed by it. */
	uint64_t from_seq;
	struct profile *next;
};

struct stream {
	struct stream_set *set;
	uint32_t number; /* the client's name for it */
	uint16_t slot;	 /* index in set->slots */
	struct driver_stream *ds;
	struct driver_event *event; /* recorded when another stream must wait */
	struct memory_manager *memory;
	struct drop_queue *drops;
	uint64_t cursor;    /* commands resolved on this stream */
	uint64_t submitted; /* sequence of the last batch enqueued */
	/* A held stream (submitted UINT64_MAX): what it had enqueued then. */
	uint64_t held_after;
	uint64_t completed;	   /* sequence of the last batch completed */
	uint64_t completed_cursor; /* cursor covered by that completion */
	uint64_t synced[STREAMS_MAX];
	/*
	 * Bytes released on this stream by its own buffers (stream-ordered
	 * reuse) whose work is not yet done: free in its pools, or reused.
	 */
	uint64_t ordered_pending;
	/*
	 * Of those, about what is free, not reused: released minus what
	 * reservations took from busy memory since; 0 whenever none is busy.
	 */
	uint64_t ordered_free;
	bool fault_pending;	 /* a fault not yet reported to a sync/read */
	uint64_t fault_seq;	 /* the last fence that reported a fault */
	bool capturing;		 /* recording a graph */
	uint32_t filling;	 /* shares whose copy is queued here */
	struct graph *recording; /* what the capture holds on to */
};

/*
 * A connection's module_ref, with the room its unload needs: once
 * unloaded, it waits for the launches before it (streams_drop_module),
 * which then needs no memory it could fail to get.
 */
struct module_drop {
	struct module_ref ref;
	uint32_t nfences;
	struct drop_fence fences[STREAMS_MAX];
	struct module_drop *next;
};

/*
 * A released handle of a shared buffer (memory/shared_buffer.h): its
 * reference goes once this connection's uses of it have run.
 */
struct shared_drop {
	struct shared_buffer *sb;
	uint32_t nfences;
	struct drop_fence fences[STREAMS_MAX];
	struct shared_drop *next;
};

struct stream_set {
	struct driver *driver;
	struct service *service;
	uint64_t connection_id;
	uint32_t max_streams;
	uint32_t nstreams;
	struct stream *slots[STREAMS_MAX];
	struct handle_table *handles;
	struct handle_table *reservations; /* reserve without bind yet */
	struct profile *profiles;	   /* open profiles */
	uint32_t nprofiles;
	struct graph *graphs;	   /* captured graphs */
	struct graph *dead_graphs; /* destroyed, replays may still run */
	uint32_t ngraphs;	   /* both lists, and the recordings */
	uint64_t graph_bytes;	   /* write data the graphs keep */
	uint32_t graph_ops;	   /* ops they recorded */
	/* Ops graph launches enqueued, batches not complete (REPLAY_OPS_MAX). */
	uint64_t replay_ops;
	struct region *regions;		   /* attached shared regions */
	struct module_cache *module_cache; /* the daemon's, for teardown */
	struct module_ref *modules;	   /* modules this connection loaded */
	struct module_drop *dropped_modules; /* unloaded, maybe still running */
	struct shared_drop *dropped_shared;  /* released, maybe still used */
	struct region *released_regions;     /* waiting for their fences */
	/* New streams' layout: the config's, or the last one installed. */
	struct memory_configuration layout;
	struct memory_device_properties props; /* the device's */
	bool closing; /* its connection is gone: work drains */
	/* storage_alloc refused this many bytes for the reserve quota. */
	uint64_t quota_refused;
	/* A reservation of a request's own size is under way (the full cap). */
	bool reserve_exact;
	/*
	 * While command_reserve decides (quota_limit_held), the memory_limit
	 * it read: storage_alloc uses it rather than read one a reload may
	 * have changed since.
	 */
	bool quota_limit_held;
	uint64_t quota_limit;
	/*
	 * A trial reservation that may take only memory the pools hold
	 * already (command_reserve, over the bound on released memory): a
	 * refusal must not leave a new page behind.
	 */
	bool reuse_only;
	struct stream_set *next; /* executor's list of live sets */
	struct stream_set *prev;
};

/* A handle a command uses, and whether it writes it. */
struct binding {
	struct handle *handle;
	bool write;
};

/* What resolve produced for one command. */
struct resolved {
	struct stream_set *set;
	struct stream *current;
	uint64_t cursor; /* current's cursor after the bump */
};

/** A set for one connection of svc, with the given limits and pool layout. */
int stream_set_create(struct driver *d, struct service *svc,
		      uint64_t connection_id, const struct config_limits *lim,
		      const struct memory_configuration *layout,
		      struct stream_set **out);
/**
 * Free everything the set holds: handles, memory, streams.  Every stream
 * must be idle (its last batch completed).
 */
void stream_set_destroy(struct stream_set *set);
/**
 * The set's connection is gone: mark it closing (its queued work drains),
 * and the buffers it shared no longer open (the memory report).
 */
void streams_closing(struct stream_set *set);
/**
 * The stream numbered number, created on first use.  GPUCMD_ELIMIT past
 * max_streams (msg says so).
 */
int streams_get(struct stream_set *set, uint32_t number, struct stream **out,
		char *msg, size_t msg_len);
/**
 * Order current behind the other streams' uses of the bindings, bump its
 * cursor and note the bindings' new uses.  0 or the driver's error.
 */
int streams_resolve(struct stream_set *set, struct stream *current,
		    const struct binding *b, size_t n, struct resolved *out);
/**
 * Drop h: it leaves the handle table and its memory goes to the owner's
 * drop queue, fenced on every stream that used it, or straight back to the
 * owner's pools when only the owner used it and current is the owner (not
 * recording a graph); h is freed.  On failure nothing changed.
 */
int streams_release(struct stream_set *set, struct stream *current,
		    struct handle *h);
/**
 * What s released to its own pools (stream-ordered reuse) that work queued
 * before may still use and that the stream has not reused: at most its
 * ordered_pending, at most its ordered_free, at most the bytes of its
 * device allocations that hold nothing live and are still busy
 * (memory_manager_busy_idle).  Memory a cleanup could free (cached, its
 * work done) does not count.
 */
uint64_t stream_ordered_held(const struct stream *s);
/**
 * The same without the walk of the pools: at most ordered_pending, at most
 * ordered_free (an upper bound of stream_ordered_held, in O(1)).
 */
uint64_t stream_ordered_bound(const struct stream *s);
/**
 * After a reservation on s that took reused bytes of its busy memory
 * (memory_manager_take_reused): they are no longer free (ordered_free);
 * answers how much came off, for a give-back.
 */
uint64_t stream_take_released(struct stream *s, uint64_t reused);
/**
 * The device properties set's preset layouts are sized from: the
 * device's, with max_page_size cut to four times the larger of the
 * service's memory_limit and SERVICE_MIN_PAGE_UNIT (so that no sliced
 * page, a quarter of it at most, is larger than that), and min_page_size
 * SERVICE_MIN_PAGE.
 */
void streams_layout_props(const struct stream_set *set,
			  struct memory_device_properties *out);
/**
 * stream_ordered_held (exact) or stream_ordered_bound summed over the set's
 * streams.
 */
uint64_t streams_ordered_held(const struct stream_set *set, bool exact);
/**
 * A fence on every stream of the set covering the work enqueued so far
 * (current's is its next fence): writes up to STREAMS_MAX, returns how
 * many.
 */
uint32_t streams_fence_all(const struct stream_set *set,
			   const struct stream *current,
			   struct drop_fence *out);
/**
 * The fence of the batch being dispatched on s (its sequence once
 * submitted); a held stream's (executor.c) never passes.
 */
uint64_t stream_next_fence(const struct stream *s);
/** True when every fence has passed. */
bool streams_fences_passed(const struct drop_fence *f, uint32_t n);
/** The last batch sequence whose completion arrived. */
uint64_t stream_completed(const struct stream *s);
/** A zeroed module_ref a connection can unload later; NULL: no memory. */
struct module_ref *streams_module_ref_new(void);
/** Free a module_ref from streams_module_ref_new (NULL: nothing). */
void streams_module_ref_free(struct module_ref *ref);
/**
 * Share h as sb (new, of h's size, in SHARED_FILLING): enqueue the copy of
 * h's bytes into sb on current (which the caller resolved h on), release
 * h's own memory behind it, and make h name sb, read-only.  On failure h
 * is unchanged and sb is dropped once nothing can use it.
 */
int streams_share(struct stream_set *set, struct stream *current,
		  struct handle *h, struct shared_buffer *sb);
/** Whether sb's copy has completed clean, so that it may be imported. */
bool streams_shared_ready(struct shared_buffer *sb);
/**
 * Fence seq of s completed (executor.c, after noting its fault): the
 * shares whose copy it covers are ready, or lost when a fault not yet
 * reported came before or with it (their share is answered with it).
 */
void streams_fills_done(struct stream *s, uint64_t seq);
/**
 * A new handle id on set naming sb (ready), read-only, owned by current.
 * GPUCMD_EEXIST, GPUCMD_ELIMIT (max_handles) or GPUCMD_ENOMEM.
 */
int streams_import(struct stream_set *set, struct stream *current, uint64_t id,
		   struct shared_buffer *sb);
/**
 * ref's module was unloaded on current: its cache reference goes back, and
 * the service's count of modules (max_modules) goes down, once every
 * stream of the set has run the work enqueued so far.  ref is freed then.
 */
void streams_drop_module(struct stream_set *set, struct stream *current,
			 struct module_ref *ref);
/** Free what the drop queues of every stream in the set allow. */
void streams_flush_drops(struct stream_set *set);
/** Sum of the memory usage of every stream of the set. */
void streams_usage(const struct stream_set *set, struct memory_usage *out);
/** True when every stream has completed its last batch. */
bool streams_idle(const struct stream_set *set);
/**
 * The same once the device is lost: a held stream (no completion could
 * be enqueued) is idle once what it had enqueued before completed, since
 * nothing after it will ever run.
 */
bool streams_idle_lost(const struct stream_set *set);
