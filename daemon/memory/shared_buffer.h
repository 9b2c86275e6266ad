/*
 * shared_buffer.h - device buffers a service's connections share.
 *
 * A handle means something to its own connection only (DESIGN.md): no
 * service can name another's memory.  A service that runs several
 * processes (or threads with a connection each) over the same weights
 * would keep a copy per connection; `share` gives a buffer a name within
 * its service, and `import` on another connection of that service names
 * the same device memory with a handle of that connection.
 *
 * Memory belongs to the stream that created it and goes with its
 * connection; a shared buffer must outlive the connection that shared it.
 * So `share` moves the bytes into an allocation of their own, owned by the
 * service (one device-to-device copy, enqueued on the sharing stream), and
 * the sharing handle names that allocation from then on.  The allocation
 * is freed once the last handle naming it, on any connection, is released
 * and the work queued with it has run (streams.c).
 *
 * A shared buffer is read-only, for every holder, from the moment it is
 * shared: connections order their own streams only, so a write on one
 * connection could not be ordered before another connection's reads.
 * Kernels read it through buffer_in arguments.
 *
 * Counted once against its service: in bytes_in_use and the memory_limit
 * (as the buffer it was), and in bytes_reserved (the reserve quota).
 *
 * Thread: the device thread only (the list hangs off struct service).
 */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct driver;
struct service;
struct stream;

#define SHARED_NAME_MAX 63
/* Shared buffers one service may hold at once. */
#define SHARED_MAX_PER_SERVICE 1024

enum shared_state {
	SHARED_FILLING, /* the copy from the shared buffer is queued */
	SHARED_READY,	/* its fence passed: importers may name it */
	SHARED_LOST,	/* its stream went before the copy completed */
};

struct shared_buffer {
	char name[SHARED_NAME_MAX + 1];
	struct service *service;
	uint64_t ptr;
	uint64_t size;	     /* the buffer's size, as charged */
	uint64_t reserved;   /* what the device allocation holds */
	uint32_t refs;	     /* handles naming it, on every connection */
	bool charged;	     /* its live bytes are the service's (shared) */
	uint64_t connection; /* the one that shared it */
	bool sharer_open;    /* ... and it is still open (the report) */
	uint64_t imports;    /* imports so far (the report) */
	/* Until SHARED_READY: the copy completes with fill_seq on filler. */
	enum shared_state state;
	struct stream *filler;
	uint64_t fill_seq;
	/*
	 * Its batch was answered with a fault at an op before the share, so
	 * the sharer was told of no share: the copy settles SHARED_LOST.
	 */
	bool unconfirmed;
	struct shared_buffer *next;
};

/**
 * Check a shared buffer's name: 1 to 63 characters of letters, digits,
 * '.', '_', '-', '/', ':'.  0 or GPUCMD_EINVAL.
 */
int shared_buffer_name_check(const char *name);
/** svc's shared buffer called name, or NULL. */
struct shared_buffer *shared_buffer_find(const struct service *svc,
					 const char *name);
/** The device memory a shared buffer of size bytes holds; 0: too big. */
uint64_t shared_buffer_reserved(const struct driver *d, uint64_t size);
/**
 * A new shared buffer of size bytes for svc, called name, with one
 * reference, in device memory of its own (not zeroed: the caller fills
 * all size bytes).  GPUCMD_EEXIST, GPUCMD_ELIMIT, or the driver's
 * refusal (GPUCMD_ENOMEM); bytes_in_use is the caller's to keep.
 */
int shared_buffer_create(struct driver *d, struct service *svc,
			 const char *name, uint64_t size,
			 struct shared_buffer **out);
/** One more handle names sb. */
void shared_buffer_get(struct shared_buffer *sb);
/**
 * One handle fewer names sb, and the device is done with that handle's
 * uses; at the last, its memory goes back to the device and its bytes
 * off the service's counts.
 */
void shared_buffer_put(struct driver *d, struct shared_buffer *sb);
