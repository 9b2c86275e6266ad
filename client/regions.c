/*
 * regions.c - shared regions on the client side: a memfd created, sealed
 * and mapped here, attached with one round trip (its descriptor rides with
 * the frame), released with another; the per-connection table; and the
 * convenience transfers that move bytes inline or through a scratch region
 * the connection owns, whichever is cheaper for their size.
 *
 * The memfd is sealed against shrinking and growing, and the seals are
 * sealed: the daemon maps only memfds that cannot shrink under it, and
 * this process has no reason to resize one either.
 *
 * The scratch region has the library's own id (GPUCMD_REGION_ID_RESERVED),
 * which gpucmd_region_create refuses to callers.  It grows to the next
 * power of two of the largest transfer, up to REGIONS_SCRATCH_MAX; larger
 * transfers go through it in pieces, two halves in turn so that copying one
 * piece here overlaps the daemon's copy of the other.
 */
#include "regions.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "batch.h"
#include "connection.h"

/* The scratch region of the convenience calls. */
#define REGIONS_SCRATCH_ID GPUCMD_REGION_ID_RESERVED
/* Its largest size; the smallest is one of these granules. */
#define REGIONS_SCRATCH_MAX (64u << 20)
#define REGIONS_SCRATCH_MIN (1u << 20)
/* Room in a frame for what surrounds inline bytes. */
#define REGIONS_FRAME_SLACK 4096u

/* ---- the table ------------------------------------------------------------ */

struct regions_entry *regions_find(struct regions *t, uint64_t id)
{
	for (size_t i = 0; i < t->n; i++)
		if (t->v[i].id == id)
			return &t->v[i];
	return NULL;
}

static void entry_unmap(struct regions_entry *e, bool mapped)
{
	if (mapped)
		munmap(e->base, e->size);
	close(e->fd);
}

void regions_forget(struct regions *t, uint64_t id)
{
	struct regions_entry *e = regions_find(t, id);

	if (e == NULL)
		return;
	entry_unmap(e, true);
	*e = t->v[--t->n];
	/* A region of the caller's gone: a larger scratch may fit again. */
	if (id != REGIONS_SCRATCH_ID)
		t->scratch_refused = 0;
}

void regions_clear(struct regions *t, bool mapped)
{
	for (size_t i = 0; i < t->n; i++)
		entry_unmap(&t->v[i], mapped);
	free(t->v);
	memset(t, 0, sizeof(*t));
}

/* Room for one more entry, so that an attach the daemon took is kept. */
static int regions_reserve(struct regions *t)
{
	struct regions_entry *v;
	size_t cap;

	if (t->n < t->cap)
		return 0;
	cap = t->cap ? 2 * t->cap : 8;
	v = realloc(t->v, cap * sizeof(*v));
	if (v == NULL)
		return -ENOMEM;
	t->v = v;
	t->cap = cap;
	return 0;
}

/* ---- attach and release --------------------------------------------------- */

/* A sealed memfd of size bytes, mapped shared: 0 or -errno. */
static int memfd_map(size_t size, int *fd_out, uint8_t **base_out)
{
	int fd = memfd_create("gpucmd-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	void *base;
	int r;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)size) != 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
		    0) {
		r = -errno;
		close(fd);
		return r;
	}
	base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED) {
		r = -errno;
		close(fd);
		return r;
	}
	/*
	 * Not inherited across fork(): the region is the parent
	 * connection's, which the daemon may be copying from or into, and
	 * the library refuses the child every call on it (conn_check_process).
	 * A child that still writes through a pointer into it faults at once
	 * (SIGSEGV) instead of changing the parent's data unseen.  A failure
	 * only leaves it inherited, as before.
	 */
	(void)madvise(base, size, MADV_DONTFORK);
	*fd_out = fd;
	*base_out = base;
	return 0;
}

/*
 * Wait for request id and return the batch's outcome (its message kept),
 * and in *ran (when not NULL) how many of its ops ran: on a failure, those
 * before failed_index.  A timeout closes the connection
 * (conn_fail_timeout).
 */
static int wait_checked(struct gpucmd_conn *conn, uint64_t id, size_t *ran)
{
	struct gpucmd_response *resp;
	int r = gpucmd_wait(conn, id, &resp);

	if (r < 0)
		return conn_fail_timeout(conn, r);
	r = gpucmd_response_error(resp);
	conn_set_message(conn, r != 0 ? gpucmd_response_message(resp) : "");
	if (ran != NULL)
		*ran = r != 0 ? (size_t)gpucmd_response_failed_index(resp) :
				gpucmd_response_count(resp);
	gpucmd_response_free(resp);
	return r;
}

/* Run b on conn and return its outcome (its message kept). */
static int run_checked(struct gpucmd_conn *conn, struct gpucmd_batch *b)
{
	uint64_t id;
	int r = gpucmd_submit(b, &id);

	return r < 0 ? r : wait_checked(conn, id, NULL);
}

/* Create, attach and record region id of size bytes (any id). */
static int regions_attach(struct gpucmd_conn *conn, uint64_t id, size_t size,
			  struct regions_entry **out)
{
	struct regions *t = conn_regions(conn);
	struct regions_entry *e;
	struct gpucmd_batch *b;
	uint8_t *base = NULL;
	uint64_t rid;
	size_t ran = 0;
	int fd = -1, r;

	if (regions_find(t, id) != NULL)
		return conn_refuse(conn, GPUCMD_EEXIST,
				   "region %llu is already attached on this "
				   "connection: release it first, or use "
				   "another id",
				   (unsigned long long)id);
	r = regions_reserve(t);
	if (r < 0)
		return conn_refuse(conn, r, "no memory for the region table");
	r = memfd_map(size, &fd, &base);
	if (r < 0)
		return conn_refuse(conn, r,
				   "region %llu: cannot make and map "
				   "a memfd of %zu bytes: %s",
				   (unsigned long long)id, size, strerror(-r));
	r = gpucmd_batch_new(conn, 0, &b);
	if (r == 0) {
		r = batch_add_region_attach(b, id, size, fd);
		if (r < 0)
			gpucmd_batch_free(b);
		else
			r = gpucmd_submit(b, &rid);
		if (r == 0)
			r = wait_checked(conn, rid, &ran);
	}
	/*
	 * The attach ran, but its answer was lost (the daemon's host out of
	 * memory: GPUCMD_ENOMEM past the op): the daemon holds the region.
	 * Forgotten here, it would keep the id and the service's quota there
	 * with nothing left to release it, so it is kept, as created.
	 */
	if (r < 0 && ran > 0) {
		conn_set_message(conn, "");
		r = 0;
	}
	if (r < 0) {
		munmap(base, size);
		close(fd);
		return r;
	}
	e = &t->v[t->n++];
	e->id = id;
	e->fd = fd;
	e->base = base;
	e->size = size;
	*out = e;
	return 0;
}

/* Release region id (any id); the table forgets it when the answer is in. */
static int regions_release(struct gpucmd_conn *conn, uint64_t id)
{
	struct gpucmd_batch *b;
	int r;

	if (regions_find(conn_regions(conn), id) == NULL)
		return conn_refuse(conn, GPUCMD_ENOTFOUND,
				   "region %llu is not attached on this "
				   "connection (gpucmd_region_create)",
				   (unsigned long long)id);
	r = gpucmd_batch_new(conn, 0, &b);
	if (r < 0)
		return r;
	r = batch_add_region_release(b, id);
	if (r < 0) {
		gpucmd_batch_free(b);
		return r;
	}
	r = run_checked(conn, b);
	/*
	 * The daemon has no such region: a release it ran without this side
	 * knowing (a batch that failed after it).  Nothing can use the entry.
	 */
	if (r == GPUCMD_ENOTFOUND)
		regions_forget(conn_regions(conn), id);
	return r;
}

/*
 * How the region and transfer calls begin: the connection is this
 * process's (checked before a region, the opener's memory too, is
 * touched), and gpucmd_last_message starts empty.
 */
static int call_begin(struct gpucmd_conn *conn)
{
	int r;

	if (conn == NULL)
		return GPUCMD_EINVAL;
	r = conn_check_process(conn, true);
	if (r < 0)
		return r;
	conn_set_message(conn, "");
	return 0;
}

GPUCMD_EXTERN int gpucmd_region_create(struct gpucmd_conn *conn, uint64_t id,
				       size_t size, void **ptr)
{
	struct regions_entry *e;
	int r;

	if (ptr == NULL)
		return GPUCMD_EINVAL;
	r = call_begin(conn);
	if (r < 0)
		return r;
	if (id == 0 || id >= GPUCMD_REGION_ID_RESERVED)
		return conn_refuse(conn, GPUCMD_EINVAL,
				   "region id %llu: an id is 1 to 2^63 - 1 "
				   "(GPUCMD_REGION_ID_RESERVED and above are "
				   "the library's)",
				   (unsigned long long)id);
	if (size == 0 || size > (size_t)INT64_MAX)
		return conn_refuse(conn, GPUCMD_EINVAL,
				   "region %llu: a size of %zu bytes; a region "
				   "has 1 to 2^63 - 1",
				   (unsigned long long)id, size);
	r = regions_attach(conn, id, size, &e);
	/*
	 * The library's scratch region (idle between calls) may hold the
	 * service's region_limit or a place: the caller's region comes first.
	 */
	if ((r == GPUCMD_EQUOTA || r == GPUCMD_ELIMIT) &&
	    regions_find(conn_regions(conn), REGIONS_SCRATCH_ID) != NULL &&
	    regions_release(conn, REGIONS_SCRATCH_ID) == 0) {
		conn_set_message(conn, "");
		r = regions_attach(conn, id, size, &e);
	}
	if (r < 0)
		return r;
	*ptr = e->base;
	return 0;
}

GPUCMD_EXTERN int gpucmd_region_release(struct gpucmd_conn *conn, uint64_t id)
{
	int r;

	r = call_begin(conn);
	if (r < 0)
		return r;
	if (id == 0 || id >= GPUCMD_REGION_ID_RESERVED)
		return conn_refuse(conn, GPUCMD_EINVAL,
				   "region id %llu: an id is 1 to 2^63 - 1 "
				   "(GPUCMD_REGION_ID_RESERVED and above are "
				   "the library's)",
				   (unsigned long long)id);
	return regions_release(conn, id);
}

/* ---- convenience transfers ------------------------------------------------ */

/* The largest transfer that goes inline on this connection. */
static size_t inline_limit(struct gpucmd_conn *conn)
{
	size_t frame = gpucmd_info(conn)->max_frame_bytes;
	size_t room =
		frame > REGIONS_FRAME_SLACK ? frame - REGIONS_FRAME_SLACK : 0;

	return room < GPUCMD_INLINE_MAX ? room : GPUCMD_INLINE_MAX;
}

/*
 * The scratch region, at least want bytes or REGIONS_SCRATCH_MAX, but no
 * more than the service's region_limit allows: a smaller one carries the
 * transfer in pieces.  When the attach is refused for the limit (other
 * regions of the service take part of it), smaller ones are tried, down
 * to REGIONS_SCRATCH_MIN.
 */
static int scratch_get(struct gpucmd_conn *conn, size_t want,
		       struct regions_entry **out)
{
	struct regions_entry *e =
		regions_find(conn_regions(conn), REGIONS_SCRATCH_ID);
	uint64_t limit = gpucmd_info(conn)->region_limit;
	size_t refused = conn_regions(conn)->scratch_refused;
	size_t size = REGIONS_SCRATCH_MIN;
	int r;

	/*
	 * A quarter of region_limit at most: the service's own come first.
	 * Under the least size, none at all where the caller can go inline.
	 */
	if (limit != 0 && limit / 4 < REGIONS_SCRATCH_MIN &&
	    inline_limit(conn) > 0)
		return GPUCMD_EQUOTA;
	while (size < want && size < REGIONS_SCRATCH_MAX &&
	       (limit == 0 || 4 * 2 * (uint64_t)size <= limit) &&
	       (refused == 0 || 2 * size < refused))
		size *= 2;
	if (e != NULL && e->size >= size) {
		*out = e;
		return 0;
	}
	/*
	 * Refused before at this size: the caller goes inline, where it can
	 * (else the attach is tried again: the quota may have room now).
	 */
	if (e == NULL && refused != 0 && size >= refused &&
	    inline_limit(conn) > 0)
		return GPUCMD_EQUOTA;
	/* Too small: a bigger one replaces it. */
	if (e != NULL) {
		r = regions_release(conn, REGIONS_SCRATCH_ID);
		if (r < 0)
			return r;
	}
	for (;;) {
		r = regions_attach(conn, REGIONS_SCRATCH_ID, size, out);
		/* Refused by the daemon: a quota, a count, or no memory. */
		if (r != GPUCMD_EQUOTA && r != GPUCMD_ELIMIT &&
		    r != GPUCMD_ENOMEM)
			return r;
		conn_regions(conn)->scratch_refused = size;
		if (size <= REGIONS_SCRATCH_MIN) {
			char msg[600];

			/* The daemon named it by its id, 2^63. */
			snprintf(msg, sizeof(msg),
				 "libgpucmd's scratch region "
				 "for large transfers was refused: %s",
				 gpucmd_last_message(conn));
			conn_set_message(conn, msg);
			return r;
		}
		size /= 2;
	}
}

/*
 * Pieces of a transfer through the scratch region: the whole transfer
 * when it fits, else halves of the region in turn.
 */
struct piece {
	size_t at; /* offset in the caller's bytes */
	size_t len;
	uint64_t roff; /* offset in the scratch region */
	uint64_t id;   /* its request while in flight */
	int busy;
};

static size_t piece_size(const struct regions_entry *e, size_t len)
{
	return len <= e->size ? len : e->size / 2;
}

/* Queue and submit the write of piece p (already in the region). */
static int write_piece(struct gpucmd_conn *conn, uint32_t stream,
		       uint64_t handle, uint64_t offset, struct piece *p)
{
	struct gpucmd_batch *b;
	int r = gpucmd_batch_new(conn, stream, &b);

	if (r < 0)
		return r;
	r = gpucmd_batch_write_region(b, handle, offset + p->at,
				      REGIONS_SCRATCH_ID, p->roff, p->len);
	/* The reply must mean the bytes left the region: it is reused. */
	if (r == 0)
		r = gpucmd_batch_sync(b);
	if (r < 0) {
		gpucmd_batch_free(b);
		return r;
	}
	r = gpucmd_submit(b, &p->id);
	p->busy = r == 0;
	return r;
}

/*
 * Collect the answers still due after a failure (or at the end); the
 * sentence of the first failure stays for gpucmd_last_message.
 */
static int drain(struct gpucmd_conn *conn, struct piece *pieces, int err)
{
	for (int k = 0; k < 2; k++) {
		struct gpucmd_response *resp;
		int r;

		if (!pieces[k].busy)
			continue;
		pieces[k].busy = 0;
		if (err == 0) {
			err = wait_checked(conn, pieces[k].id, NULL);
			continue;
		}
		r = gpucmd_wait(conn, pieces[k].id, &resp);
		if (r < 0)
			return conn_fail_timeout(conn, r);
		gpucmd_response_free(resp);
	}
	return err;
}

/*
 * The checks every transfer call starts with: call_begin (before the
 * scratch region is touched), then the handle is not 0 and bytes (data or
 * out) are there for len.  0, or the refusal with call's sentence.
 */
static int transfer_check(struct gpucmd_conn *conn, const char *call,
			  uint64_t handle, const void *bytes, size_t len,
			  const char *no_bytes)
{
	int r;

	r = call_begin(conn);
	if (r < 0)
		return r;
	if (handle == 0 || (bytes == NULL && len > 0))
		return conn_refuse(conn, GPUCMD_EINVAL, "%s: %s", call,
				   handle == 0 ? "handle 0 names no buffer" :
						 no_bytes);
	return 0;
}

/* A write small enough to go in the frame, run at once (a round trip). */
static int write_inline(struct gpucmd_conn *conn, uint32_t stream,
			uint64_t handle, uint64_t offset, const void *data,
			size_t len)
{
	struct gpucmd_batch *b;
	int r = gpucmd_batch_new(conn, stream, &b);

	if (r < 0)
		return r;
	/* Run at once: data outlives the batch. */
	r = gpucmd_batch_write_borrowed(b, handle, offset, data, len);
	if (r == 0)
		r = gpucmd_batch_sync(b);
	if (r < 0) {
		gpucmd_batch_free(b);
		return r;
	}
	return run_checked(conn, b);
}

GPUCMD_EXTERN int gpucmd_write_buffer(struct gpucmd_conn *conn, uint32_t stream,
				      uint64_t handle, uint64_t offset,
				      const void *data, size_t len)
{
	struct piece pieces[2] = { { 0 } };
	struct regions_entry *e;
	size_t chunk, done;
	int r = 0, k;

	r = transfer_check(conn, "gpucmd_write_buffer", handle, data, len,
			   "no data for a length of more than 0");
	if (r < 0)
		return r;
	if (len <= inline_limit(conn))
		return write_inline(conn, stream, handle, offset, data, len);
	r = scratch_get(conn, len, &e);
	if ((r == GPUCMD_EQUOTA || r == GPUCMD_ELIMIT || r == GPUCMD_ENOMEM) &&
	    inline_limit(conn) > 0) {
		/* No region to be had: inline, a frame's worth at a time. */
		chunk = inline_limit(conn);
		for (done = 0, r = 0; r == 0 && done < len; done += chunk)
			r = write_inline(conn, stream, handle, offset + done,
					 (const uint8_t *)data + done,
					 len - done < chunk ? len - done :
							      chunk);
		return r;
	}
	if (r < 0)
		return r;
	chunk = piece_size(e, len);
	for (done = 0, k = 0; r == 0 && done < len; done += chunk, k ^= 1) {
		struct piece *p = &pieces[k];

		/* The half is free once its last write answered. */
		if (p->busy) {
			p->busy = 0;
			r = wait_checked(conn, p->id, NULL);
			if (r < 0)
				break;
		}
		/* No place for two in flight (max_in_flight): one at a time. */
		if (pieces[k ^ 1].busy && !conn_has_room(conn, 1)) {
			pieces[k ^ 1].busy = 0;
			r = wait_checked(conn, pieces[k ^ 1].id, NULL);
			if (r < 0)
				break;
		}
		p->at = done;
		p->len = len - done < chunk ? len - done : chunk;
		p->roff = (uint64_t)k * chunk;
		memcpy(e->base + p->roff, (const uint8_t *)data + done, p->len);
		r = write_piece(conn, stream, handle, offset, p);
	}
	return drain(conn, pieces, r);
}

/*
 * Allocate handle and fill it with data in one call: inline when it fits
 * the frame (one round trip), else an allocation then gpucmd_write_buffer.
 * A failed fill releases the allocation, so the call leaves either a full
 * buffer or none.
 */
GPUCMD_EXTERN int gpucmd_create_buffer(struct gpucmd_conn *conn,
				       uint32_t stream, uint64_t handle,
				       const void *data, size_t len)
{
	struct gpucmd_batch *b;
	char why[768]; /* the room of gpucmd_last_message */
	int r;

	r = transfer_check(conn, "gpucmd_create_buffer", handle, data, len,
			   "no data for a length of more than 0");
	if (r < 0)
		return r;
	r = gpucmd_batch_new(conn, stream, &b);
	if (r < 0)
		return r;
	if (len <= inline_limit(conn)) {
		gpucmd_batch_create_with_data(b, handle, data, len);
		gpucmd_batch_sync(b);
		return run_checked(conn, b);
	}
	gpucmd_batch_empty(b, handle, len);
	r = run_checked(conn, b);
	if (r < 0)
		return r;
	r = gpucmd_write_buffer(conn, stream, handle, 0, data, len);
	if (r == 0 || gpucmd_conn_error(conn, NULL) != 0)
		return r;
	/* Keep the write's sentence over the release's. */
	snprintf(why, sizeof(why), "%s", gpucmd_last_message(conn));
	if (gpucmd_batch_new(conn, stream, &b) == 0) {
		gpucmd_batch_release(b, handle);
		(void)run_checked(conn, b);
	}
	conn_set_message(conn, why);
	return r;
}

/* Submit the read of piece p into the region. */
static int read_piece(struct gpucmd_conn *conn, uint32_t stream,
		      uint64_t handle, uint64_t offset, struct piece *p)
{
	struct gpucmd_batch *b;
	int r = gpucmd_batch_new(conn, stream, &b);

	if (r < 0)
		return r;
	r = gpucmd_batch_read_region(b, handle, offset + p->at, p->len,
				     REGIONS_SCRATCH_ID, p->roff);
	if (r < 0) {
		gpucmd_batch_free(b);
		return r;
	}
	r = gpucmd_submit(b, &p->id);
	p->busy = r == 0;
	return r;
}

/* Wait for piece p's read and copy its bytes out of the region. */
static int collect_read(struct gpucmd_conn *conn, const struct regions_entry *e,
			struct piece *p, void *out)
{
	int r;

	p->busy = 0;
	r = wait_checked(conn, p->id, NULL);
	if (r == 0)
		memcpy((uint8_t *)out + p->at, e->base + p->roff, p->len);
	return r;
}

/* A read small enough to come back in the reply. */
static int read_inline(struct gpucmd_conn *conn, uint32_t stream,
		       uint64_t handle, uint64_t offset, size_t len, void *out)
{
	struct gpucmd_response *resp;
	struct gpucmd_batch *b;
	const void *data;
	size_t got;
	int r = gpucmd_batch_new(conn, stream, &b);

	if (r < 0)
		return r;
	r = gpucmd_batch_read(b, handle, offset, len);
	if (r < 0) {
		gpucmd_batch_free(b);
		return r;
	}
	r = gpucmd_run(b, &resp);
	if (r < 0)
		return conn_fail_timeout(conn, r);
	r = gpucmd_response_error(resp);
	/* "" on success: a scratch region refused before may have said why. */
	conn_set_message(conn, r != 0 ? gpucmd_response_message(resp) : "");
	if (r == 0 &&
	    (gpucmd_response_data(resp, 0, &data, &got) < 0 || got != len))
		r = GPUCMD_EPROTO;
	if (r == 0 && len > 0)
		memcpy(out, data, len);
	gpucmd_response_free(resp);
	return r;
}

GPUCMD_EXTERN int gpucmd_read_buffer(struct gpucmd_conn *conn, uint32_t stream,
				     uint64_t handle, uint64_t offset,
				     size_t len, void *out)
{
	struct piece pieces[2] = { { 0 } };
	struct regions_entry *e;
	size_t chunk, next;
	int r, k;

	r = transfer_check(conn, "gpucmd_read_buffer", handle, out, len,
			   "nowhere to put a length of more than 0");
	if (r < 0)
		return r;
	if (len <= inline_limit(conn))
		return read_inline(conn, stream, handle, offset, len, out);
	r = scratch_get(conn, len, &e);
	if ((r == GPUCMD_EQUOTA || r == GPUCMD_ELIMIT || r == GPUCMD_ENOMEM) &&
	    inline_limit(conn) > 0) {
		/* No region to be had: inline, a frame's worth at a time. */
		chunk = inline_limit(conn);
		for (next = 0, r = 0; r == 0 && next < len; next += chunk)
			r = read_inline(conn, stream, handle, offset + next,
					len - next < chunk ? len - next : chunk,
					(uint8_t *)out + next);
		return r;
	}
	if (r < 0)
		return r;
	chunk = piece_size(e, len);
	/*
	 * One piece is in flight while the one before it is copied out:
	 * piece k is submitted, then piece k-1 collected and copied.
	 */
	for (next = 0, k = 0; r == 0; k ^= 1) {
		struct piece *p = &pieces[k], *prev = &pieces[k ^ 1];

		/* No place for two in flight (max_in_flight): one at a time. */
		if (next < len && prev->busy && !conn_has_room(conn, 1)) {
			r = collect_read(conn, e, prev, out);
			if (r < 0)
				break;
		}
		if (next < len) {
			p->at = next;
			p->len = len - next < chunk ? len - next : chunk;
			p->roff = (uint64_t)k * chunk;
			next += p->len;
			r = read_piece(conn, stream, handle, offset, p);
			if (r < 0)
				break;
		}
		if (prev->busy) {
			r = collect_read(conn, e, prev, out);
			if (r < 0)
				break;
		}
		if (!p->busy && !prev->busy && next >= len)
			break;
	}
	return drain(conn, pieces, r);
}
