/*
 * regions.h - the shared regions of one connection as this process sees
 * them: memfds it created, sealed and mapped, and announced to the daemon
 * with a region_attach op (the descriptor travels with SCM_RIGHTS in the
 * same sendmsg as the frame, connection.c).  The public calls
 * (gpucmd_region_create, gpucmd_region_release, gpucmd_write_buffer,
 * gpucmd_read_buffer) are declared in gpucmd.h; this header is what the
 * connection uses to keep the table.
 *
 * The table is the client's half of the daemon's: an id is in it from the
 * attach's success until the response of a batch whose region_release ran
 * is collected (connection.c settles that), or until gpucmd_close.  The
 * daemon keeps its own mapping of the memfd until the copies enqueued
 * before the release are done, so this process may unmap at once.
 *
 * Owner: the connection (embedded in it).  Thread: the connection's.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One region of the table. */
struct regions_entry {
	uint64_t id;
	int fd;	       /* the memfd, close-on-exec */
	uint8_t *base; /* shared mapping of size bytes */
	size_t size;
};

struct regions {
	struct regions_entry *v;
	size_t n;
	size_t cap;
	/*
	 * The smallest scratch region size the daemon refused (quota or
	 * count), 0 for none: that size and larger ones are not asked for
	 * again until the caller releases a region of its own, so a transfer
	 * does not cost a refused attach each time.
	 */
	size_t scratch_refused;
};

/** The live region id, or NULL. */
struct regions_entry *regions_find(struct regions *t, uint64_t id);
/** Drop region id from the table: unmap it and close its memfd. */
void regions_forget(struct regions *t, uint64_t id);
/**
 * Close every region (the connection is closing), and unmap them when
 * mapped: not in a child of fork(), which did not inherit the mappings
 * (MADV_DONTFORK) and may have mapped something else at their addresses.
 */
void regions_clear(struct regions *t, bool mapped);
