/*
 * bench_transfer.c - bulk data inline in the frame, host to device and back,
 * against memcpy of the same size in the same process.
 *
 * A write is the batch {write S bytes; sync}, so the bytes have reached the
 * device when the reply comes; a read is the batch {read S bytes}, whose
 * reply carries them.  Sizes run from 4 KiB to the largest that fits one
 * frame (max_frame_bytes from the Welcome, less room for the message
 * around the bytes).  Every size is checked once for correctness (what was
 * written reads back) before it is timed.
 *
 * The target for inline copies (>= 0.3x memcpy) is checked from
 * 1 MiB up: below that a copy is a round trip with a payload, and the round
 * trip rows judge that.  Shared-memory regions (issue 11) do not exist yet;
 * their rows are left out with a note.
 */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XFER_HANDLE 1
/* Room in a frame for everything around the payload. */
#define XFER_FRAME_SLACK (64 * KIB)

static int xfer_write(struct gpucmd_conn *c, const uint8_t *data, size_t len)
{
	struct gpucmd_batch *b;
	int rc = gpucmd_batch_new(c, 0, &b);

	if (rc != 0)
		return rc;
	rc = gpucmd_batch_write(b, XFER_HANDLE, 0, data, len);
	if (rc == 0)
		rc = gpucmd_batch_sync(b);
	if (rc != 0) {
		gpucmd_batch_free(b);
		return rc;
	}
	return bench_run_ok(b, "transfer: write");
}

/* Read len bytes; when check is not NULL, compare them with it. */
static int xfer_read(struct gpucmd_conn *c, size_t len, const uint8_t *check)
{
	struct gpucmd_response *r = NULL;
	struct gpucmd_batch *b;
	const void *data;
	size_t got;
	int rc = gpucmd_batch_new(c, 0, &b);

	if (rc != 0)
		return rc;
	rc = gpucmd_batch_read(b, XFER_HANDLE, 0, len);
	if (rc != 0) {
		gpucmd_batch_free(b);
		return rc;
	}
	rc = gpucmd_run(b, &r);
	if (rc == 0)
		rc = gpucmd_response_error(r);
	if (rc == 0)
		rc = gpucmd_response_data(r, 0, &data, &got);
	if (rc != 0) {
		bench_error("transfer: read of %zu bytes: %s", len,
			    gpucmd_strerror(rc));
	} else if (got != len ||
		   (check != NULL && memcmp(data, check, len) != 0)) {
		bench_error("transfer: %zu bytes read back differ from what "
			    "was written", len);
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

static void size_name(char *buf, size_t len, size_t bytes)
{
	if (bytes >= MIB && bytes % MIB == 0)
		snprintf(buf, len, "%zu MiB", bytes / MIB);
	else if (bytes >= MIB)
		snprintf(buf, len, "%.2f MiB", (double)bytes / (double)MIB);
	else
		snprintf(buf, len, "%zu KiB", bytes / KIB);
}

static void add_row(const char *dir, size_t len, double secs, double floor)
{
	char name[64], sz[32];
	double gbs = (double)len / secs / 1e9;
	double fgbs = (double)len / floor / 1e9;

	size_name(sz, sizeof(sz), len);
	snprintf(name, sizeof(name), "%s inline %s", dir, sz);
	bench_add(name, gbs, "GB/s", fgbs, gbs / fgbs,
		  len >= MIB ? TARGET_RATIO_GE : TARGET_NONE, 0.3);
}

void bench_transfer(void)
{
	size_t sizes[8], nsizes = 0, max;
	struct gpucmd_conn *c = bench_connect("bench-transfer");
	struct gpucmd_batch *b;
	uint8_t *src = NULL, *dst = NULL;

	if (c == NULL)
		return;
	max = gpucmd_info(c)->max_frame_bytes;
	max = max > XFER_FRAME_SLACK + 4 * KIB ? max - XFER_FRAME_SLACK : 4 * KIB;
	max -= max % (4 * KIB);
	for (size_t s = 4 * KIB; s < max && nsizes < 7; s *= 16)
		sizes[nsizes++] = s;
	sizes[nsizes++] = max;

	src = malloc(max);
	dst = malloc(max);
	if (src == NULL || dst == NULL) {
		bench_error("transfer: cannot hold %zu bytes", max);
		goto out;
	}
	for (size_t i = 0; i < max; i++)
		src[i] = (uint8_t)(i * 2654435761u >> 13);
	memset(dst, 0, max);
	if (gpucmd_batch_new(c, 0, &b) != 0 ||
	    gpucmd_batch_empty(b, XFER_HANDLE, max) != 0 ||
	    bench_run_ok(b, "transfer: allocate") != 0)
		goto out;

	for (size_t i = 0; i < nsizes; i++) {
		size_t len = sizes[i], reps = reps_for(len);
		double *tw = calloc(reps, sizeof(double));
		double *tr = calloc(reps, sizeof(double));
		double floor, w, r;
		bool ok = tw != NULL && tr != NULL;

		bench_progress("transfer: %zu bytes", len);
		/* Correct first, and warm (pages of both sides touched). */
		ok = ok && xfer_write(c, src, len) == 0 &&
		     xfer_read(c, len, src) == 0;
		for (size_t k = 0; ok && k < reps; k++) {
			uint64_t t0 = bench_now_ns();

			ok = xfer_write(c, src, len) == 0;
			tw[k] = (double)(bench_now_ns() - t0) / 1e9;
			t0 = bench_now_ns();
			ok = ok && xfer_read(c, len, NULL) == 0;
			tr[k] = (double)(bench_now_ns() - t0) / 1e9;
		}
		if (ok) {
			floor = memcpy_seconds(dst, src, len, reps < 5 ? 5 : reps);
			w = bench_median(tw, reps);
			r = bench_median(tr, reps);
			add_row("write", len, w, floor);
			add_row("read", len, r, floor);
		}
		free(tw);
		free(tr);
		if (!ok)
			break;
	}
	bench_note("transfers through shared-memory regions (issue 11) are not "
		   "available yet: only inline rows are measured");
out:
	free(src);
	free(dst);
	gpucmd_close(c);
}
