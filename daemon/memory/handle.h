/*
 * handle.h - client handles and the per-connection table that maps them to
 * device memory.
 *
 * A handle is a 64-bit id the client chose (0 is invalid).  It means
 * something only on its connection: each connection has its own table, so
 * no service can name another's memory.  A struct handle binds the id to a
 * slice of its owner stream's memory manager, and carries what streams.c
 * needs to order other streams behind its last write and its last reads.
 *
 * Thread: the device thread only.
 */
#pragma once

#include <stdint.h>

#include "memory/memory_manager.h"

struct shared_buffer;
struct stream;

/* A stream's last use of a handle, as that stream's cursor. */
struct handle_use {
	uint16_t slot;
	uint64_t cursor;
};

struct handle {
	uint64_t id;
	struct stream *owner;	   /* whose pools hold the memory */
	struct memory_alloc alloc; /* device address, size, slice */
	/* Ordering (streams.c): last writer and reads since that write. */
	int32_t writer_slot; /* -1: never written on the device */
	uint64_t writer_cursor;
	uint32_t nreaders;
	uint32_t readers_cap;
	struct handle_use *readers;
	uint32_t graph_refs; /* graphs that use it: no release while > 0 */
	/*
	 * Shared within its service (memory/shared_buffer.h): alloc names
	 * the shared buffer's memory, not owner's pools (alloc.slice NULL),
	 * and nothing may write it.
	 */
	struct shared_buffer *shared;
	uint64_t graph_last; /* serial of the last graph to hold it */
};

struct handle_table;

/** An empty table holding at most max handles. */
int handle_table_create(uint32_t max, struct handle_table **out);
/** Free the table (not the handles: empty it with handle_table_drain first). */
void handle_table_destroy(struct handle_table *t);
/** Add h; GPUCMD_EINVAL for id 0, GPUCMD_EEXIST, GPUCMD_ELIMIT. */
int handle_table_insert(struct handle_table *t, struct handle *h);
/** The handle named id, or NULL. */
struct handle *handle_table_find(const struct handle_table *t, uint64_t id);
/** Remove and return the handle named id, or NULL. */
struct handle *handle_table_remove(struct handle_table *t, uint64_t id);
/** Empty the table, calling fn on every handle it held (teardown). */
void handle_table_drain(struct handle_table *t,
			void (*fn)(struct handle *h, void *arg), void *arg);
/** Number of live handles. */
uint32_t handle_table_count(const struct handle_table *t);
/** The most handles the table takes. */
uint32_t handle_table_max(const struct handle_table *t);

/** A new handle for id with its memory; no table entry yet. */
struct handle *handle_new(uint64_t id, struct stream *owner,
			  const struct memory_alloc *alloc);
/** Free a handle's own bookkeeping (not its memory). */
void handle_free(struct handle *h);
