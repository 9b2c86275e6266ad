/*
 * bench_transfer.c - bulk data host to device and back, inline in the frame
 * and through shared-memory regions, against memcpy of the same size in the
 * same process.
 *
 * Inline, a write is the batch {write S bytes; sync}, so the bytes have
 * reached the device when the reply comes; a read is the batch {read S
 * bytes}, whose reply carries them.  Inline sizes stop at the largest that
 * fits one frame (max_frame_bytes from the Welcome, less room for the
 * message around the bytes).
 *
 * Through a region the bytes are already in a region the bench shares with
 * the daemon (gpucmd_region_create): a write is {write_region S bytes;
 * sync}, a read is {read_region S bytes} into a second region, complete
 * when its reply comes.  Region sizes run up to 256 MiB (64 MiB with
 * --quick).  Both kinds share the sizes from 64 KiB to 4 MiB, where
 * GPUCMD_INLINE_MAX (the size above which the convenience calls switch to
 * a region) is chosen.
 *
 * From 1 MiB up, a "write inline borrowed" row times the same write
 * through gpucmd_batch_write_borrowed, without libgpucmd's copy of the
 * data into the batch (no target: the targets judge the copying call).
 *
 * From 1 MiB up, a "raw socket" row times the same bytes sent to a child
 * process over a Unix socket (and 16 bytes back), against the same memcpy:
 * inline bytes cross a socket, so its best run is the most any inline row
 * can reach on this machine.  A "raw socket ... median" row gives its
 * typical run, to compare with the inline rows (medians as well).  The
 * "raw copy" rows do the same for regions: a child process, asked by a
 * 64-byte message, copies the region (shared with it as with the daemon)
 * into its own memory and answers, the least a region row can cost.
 *
 * Every size is checked once for correctness (what was written reads
 * back) before it is timed.  The targets are checked from 1 MiB
 * up: region copies >= 0.8x memcpy, inline >= 0.3x; below that a copy is a
 * round trip with a payload, and the round trip rows judge that.
 *
 * The connection, the copies and their check are bench.h's bench_xfer_*, so
 * that bench_gpu times region copies exactly as here against cuMemcpy.
 */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XFER_HANDLE 1
/* The regions written from and read into. */
#define XFER_SRC_REGION 1
#define XFER_DST_REGION 2
/* Room in a frame for everything around the payload. */
#define XFER_FRAME_SLACK (64 * KIB)

int bench_xfer_setup(struct bench_xfer *x, uint64_t device_bytes,
		     size_t region_bytes)
{
	struct gpucmd_batch *b;
	char what[64];
	void *p;

	snprintf(what, sizeof(what), "%s: allocate", x->who);
	if (gpucmd_batch_new(x->c, 0, &b) != 0)
		return -1;
	if (gpucmd_batch_empty(b, XFER_HANDLE, device_bytes) != 0) {
		gpucmd_batch_free(b);
		return -1;
	}
	if (bench_run_ok(b, what) != 0)
		return -1;
	if (gpucmd_region_create(x->c, XFER_SRC_REGION, region_bytes, &p) !=
	    0) {
		bench_error("%s: cannot create a region of %zu bytes", x->who,
			    region_bytes);
		return -1;
	}
	x->src_region = p;
	if (gpucmd_region_create(x->c, XFER_DST_REGION, region_bytes, &p) !=
	    0) {
		bench_error("%s: cannot create a region of %zu bytes", x->who,
			    region_bytes);
		return -1;
	}
	x->dst_region = p;
	return 0;
}

int bench_xfer_write(struct bench_xfer *x, enum bench_xfer_way way,
		     const uint8_t *data, size_t len)
{
	struct gpucmd_batch *b;
	char what[64];
	int rc = gpucmd_batch_new(x->c, 0, &b);

	if (rc != 0)
		return rc;
	if (way == BENCH_XFER_INLINE)
		rc = gpucmd_batch_write(b, XFER_HANDLE, 0, data, len);
	else if (way == BENCH_XFER_BORROWED)
		rc = gpucmd_batch_write_borrowed(b, XFER_HANDLE, 0, data, len);
	else
		rc = gpucmd_batch_write_region(b, XFER_HANDLE, 0,
					       XFER_SRC_REGION, 0, len);
	if (rc == 0)
		rc = gpucmd_batch_sync(b);
	if (rc != 0) {
		gpucmd_batch_free(b);
		return rc;
	}
	snprintf(what, sizeof(what), "%s: write", x->who);
	return bench_run_ok(b, what);
}

int bench_xfer_read(struct bench_xfer *x, enum bench_xfer_way way, size_t len,
		    const uint8_t *check)
{
	struct gpucmd_response *r = NULL;
	struct gpucmd_batch *b;
	const void *data = NULL;
	size_t got = 0;
	uint64_t region, off, rlen;
	int rc = gpucmd_batch_new(x->c, 0, &b);

	if (rc != 0)
		return rc;
	if (way == BENCH_XFER_INLINE)
		rc = gpucmd_batch_read(b, XFER_HANDLE, 0, len);
	else
		rc = gpucmd_batch_read_region(b, XFER_HANDLE, 0, len,
					      XFER_DST_REGION, 0);
	if (rc != 0) {
		gpucmd_batch_free(b);
		return rc;
	}
	rc = gpucmd_run(b, &r);
	if (rc == 0)
		rc = gpucmd_response_error(r);
	if (rc == 0 && way == BENCH_XFER_INLINE) {
		rc = gpucmd_response_data(r, 0, &data, &got);
	} else if (rc == 0) {
		rc = gpucmd_response_region(r, 0, &region, &off, &rlen);
		data = x->dst_region;
		got = (size_t)rlen;
	}
	if (rc != 0) {
		bench_error("%s: read of %zu bytes: %s", x->who, len,
			    gpucmd_strerror(rc));
	} else if (got != len ||
		   (check != NULL && memcmp(data, check, len) != 0)) {
		bench_error("%s: %zu bytes read back differ from what "
			    "was written",
			    x->who, len);
		rc = GPUCMD_EPROTO;
	}
	gpucmd_response_free(r);
	return rc;
}

/* Median seconds of one memcpy of len bytes between warm buffers. */
static double memcpy_seconds(uint8_t *dst, const uint8_t *src, size_t len,
			     size_t reps)
{
	/* Small copies are timed in bunches so the clock does not dominate. */
	size_t inner = len >= MIB ? 1 : (size_t)(MIB / len) * 4;
	double *t = calloc(reps, sizeof(*t)), med;

	if (t == NULL)
		return NAN;
	for (size_t r = 0; r < reps; r++) {
		uint64_t t0 = bench_now_ns();

		for (size_t i = 0; i < inner; i++) {
			memcpy(dst, src, len);
			/* Keep the compiler from merging the copies. */
			__asm__ volatile("" : : "r"(dst) : "memory");
		}
		t[r] = (double)(bench_now_ns() - t0) / 1e9 / (double)inner;
	}
	med = bench_median(t, reps);
	free(t);
	return med;
}

static size_t reps_for(size_t len)
{
	if (len <= 64 * KIB)
		return bench.quick ? 100 : 500;
	if (len <= MIB)
		return bench.quick ? 20 : 100;
	if (len <= 16 * MIB)
		return bench.quick ? 4 : 15;
	return bench.quick ? 3 : 7;
}

void bench_size_name(char *buf, size_t len, size_t bytes)
{
	if (bytes >= MIB && bytes % MIB == 0)
		snprintf(buf, len, "%zu MiB", bytes / MIB);
	else if (bytes >= MIB)
		snprintf(buf, len, "%.2f MiB", (double)bytes / (double)MIB);
	else
		snprintf(buf, len, "%zu KiB", bytes / KIB);
}

static void add_row(const char *dir, enum bench_xfer_way way, size_t len,
		    double secs, double floor)
{
	char name[64], sz[32];
	double gbs = (double)len / secs / 1e9;
	double fgbs = (double)len / floor / 1e9;

	bench_size_name(sz, sizeof(sz), len);
	snprintf(name, sizeof(name), "%s %s %s", dir,
		 way == BENCH_XFER_INLINE ? "inline" : "region", sz);
	bench_add(name, gbs, "GB/s", fgbs, gbs / fgbs,
		  len >= MIB ? TARGET_RATIO_GE : TARGET_NONE,
		  way == BENCH_XFER_INLINE ? 0.3 : 0.8);
}

/*
 * The seconds e took to answer reps requests (after one to warm it: the
 * child's buffer, the socket's pages).  *best is the fewest, *median the
 * typical; false when it could not be measured.  e is stopped.
 */
static bool echo_seconds(struct bench_echo *e, size_t reps, double *best,
			 double *median)
{
	double *t = calloc(reps, sizeof(double));
	size_t k = 0;

	*best = *median = NAN;
	if (t != NULL && bench_echo_roundtrip(e) == 0) {
		for (k = 0; k < reps; k++) {
			uint64_t t0 = bench_now_ns();

			if (bench_echo_roundtrip(e) != 0)
				break;
			t[k] = (double)(bench_now_ns() - t0) / 1e9;
		}
	}
	if (t != NULL && k == reps) {
		for (size_t i = 0; i < reps; i++)
			if (isnan(*best) || t[i] < *best)
				*best = t[i];
		*median = bench_median(t, reps);
	}
	bench_echo_stop(e);
	free(t);
	return t != NULL && k == reps;
}

/*
 * The machine's ceiling for a transfer of len bytes, as two rows against
 * the memcpy floor: its best run and its median.  Inline: a child process
 * receives the bytes over a Unix socket and answers 16 (inline bytes cross
 * a socket, so where this is under 0.3x memcpy, so is any inline row).
 * Region: a child process, asked by a small message, copies the bytes out
 * of the region it shares with this one and answers (the daemon copies a
 * region on another CPU, from memory this CPU last touched).
 */
static void add_ceiling(enum bench_xfer_way way, size_t len, size_t reps,
			const void *region, double floor)
{
	struct bench_echo e;
	double best, median;
	char name[80], sz[32];
	int rc;

	rc = way == BENCH_XFER_INLINE ?
		     bench_echo_start(&e, len, 16) :
		     bench_echo_start_copying(&e, 64, 16, region, len);
	if (rc != 0 || !echo_seconds(&e, reps < 5 ? 5 : reps, &best, &median))
		return;
	bench_size_name(sz, sizeof(sz), len);
	if (way == BENCH_XFER_INLINE)
		snprintf(name, sizeof(name), "raw socket %s (inline's ceiling)",
			 sz);
	else
		snprintf(name, sizeof(name),
			 "raw copy %s by another process (region's ceiling)",
			 sz);
	bench_add(name, (double)len / best / 1e9, "GB/s",
		  (double)len / floor / 1e9, floor / best, TARGET_NONE, 0);
	snprintf(name, sizeof(name), "%s %s median",
		 way == BENCH_XFER_INLINE ? "raw socket" : "raw copy", sz);
	bench_add(name, (double)len / median / 1e9, "GB/s",
		  (double)len / floor / 1e9, floor / median, TARGET_NONE, 0);
}

/*
 * Check one size, then time reps writes and reads of it; the memcpy floor
 * is taken right after, on the same sizes.  false when something failed.
 */
static bool measure(struct bench_xfer *x, enum bench_xfer_way way, size_t len,
		    const uint8_t *src, uint8_t *dst)
{
	size_t reps = reps_for(len);
	double *tw = calloc(reps, sizeof(double));
	double *tr = calloc(reps, sizeof(double));
	bool ok = tw != NULL && tr != NULL;
	double floor;

	bench_progress("transfer: %s %zu bytes",
		       way == BENCH_XFER_INLINE ? "inline" : "region", len);
	if (way == BENCH_XFER_REGION && ok) {
		memcpy(x->src_region, src, len);
		memset(x->dst_region, 0, len);
	}
	/* Correct first, and warm (pages of both sides touched). */
	ok = ok && bench_xfer_write(x, way, src, len) == 0 &&
	     bench_xfer_read(x, way, len, src) == 0;
	for (size_t k = 0; ok && k < reps; k++) {
		uint64_t t0 = bench_now_ns();

		ok = bench_xfer_write(x, way, src, len) == 0;
		tw[k] = (double)(bench_now_ns() - t0) / 1e9;
		t0 = bench_now_ns();
		ok = ok && bench_xfer_read(x, way, len, NULL) == 0;
		tr[k] = (double)(bench_now_ns() - t0) / 1e9;
	}
	if (ok) {
		floor = memcpy_seconds(dst, src, len, reps < 5 ? 5 : reps);
		add_row("write", way, len, bench_median(tw, reps), floor);
		add_row("read", way, len, bench_median(tr, reps), floor);
	}
	if (ok && way == BENCH_XFER_INLINE && len >= MIB) {
		/* Without libgpucmd's copy of the data into the batch. */
		for (size_t k = 0; ok && k < reps; k++) {
			uint64_t t0 = bench_now_ns();

			ok = bench_xfer_write(x, BENCH_XFER_BORROWED, src,
					      len) == 0;
			tw[k] = (double)(bench_now_ns() - t0) / 1e9;
		}
		if (ok) {
			char name[64], sz[32];
			double secs = bench_median(tw, reps);

			bench_size_name(sz, sizeof(sz), len);
			snprintf(name, sizeof(name), "write inline borrowed %s",
				 sz);
			bench_add(name, (double)len / secs / 1e9, "GB/s",
				  (double)len / floor / 1e9, floor / secs,
				  TARGET_NONE, 0);
		}
	}
	if (ok && len >= MIB)
		add_ceiling(way, len, reps, x->src_region, floor);
	free(tw);
	free(tr);
	return ok;
}

void bench_transfer(void)
{
	/* Every size both ways fit; the largest of each comes on top. */
	static const size_t common[] = { 4 * KIB, 64 * KIB, 256 * KIB,
					 MIB,	  4 * MIB,  16 * MIB };
	size_t sizes[16], nsizes = 0, inline_max, region_max, max;
	struct bench_xfer x = { bench_connect("bench-transfer"), "transfer",
				NULL, NULL };
	uint8_t *src = NULL, *dst = NULL;

	if (x.c == NULL)
		return;
	inline_max = gpucmd_info(x.c)->max_frame_bytes;
	inline_max = inline_max > XFER_FRAME_SLACK + 4 * KIB ?
			     inline_max - XFER_FRAME_SLACK :
			     4 * KIB;
	inline_max -= inline_max % (4 * KIB);
	region_max = bench.quick ? 64 * MIB : 256 * MIB;
	max = inline_max > region_max ? inline_max : region_max;
	for (size_t i = 0; i < sizeof(common) / sizeof(common[0]); i++)
		sizes[nsizes++] = common[i];
	if (!bench.quick)
		sizes[nsizes++] = 64 * MIB;
	sizes[nsizes++] = region_max;

	src = malloc(max);
	dst = malloc(max);
	if (src == NULL || dst == NULL) {
		bench_error("transfer: cannot hold %zu bytes", max);
		goto out;
	}
	for (size_t i = 0; i < max; i++)
		src[i] = (uint8_t)(i * 2654435761u >> 13);
	memset(dst, 0, max);
	if (bench_xfer_setup(&x, max, region_max) != 0)
		goto out;

	for (size_t i = 0; i < nsizes; i++) {
		size_t len = sizes[i];

		/* The largest inline size replaces those over the frame. */
		if (len <= inline_max &&
		    !measure(&x, BENCH_XFER_INLINE, len, src, dst))
			break;
		if (len > inline_max && i > 0 && sizes[i - 1] < inline_max &&
		    !measure(&x, BENCH_XFER_INLINE, inline_max, src, dst))
			break;
		if (!measure(&x, BENCH_XFER_REGION, len, src, dst))
			break;
	}
	bench_note("region rows copy between the device and a region the "
		   "client shares with the daemon (bytes already there); "
		   "inline rows carry the bytes in the frame; both against "
		   "memcpy of the same size in this process");
out:
	free(src);
	free(dst);
	/* Closing unmaps the regions. */
	gpucmd_close(x.c);
}
