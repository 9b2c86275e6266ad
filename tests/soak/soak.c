/*
 * soak.c - a bounded soak of gpucmdd: mixed load from several client
 * processes for a set time, every result verified, and the daemon's
 * resident memory and open descriptors watched for growth.
 *
 *   soak [--daemon PATH] [--socket PATH] [--seconds N] [--clients K]
 *        [--backend NAME] [--seed S] [--quiet]
 *
 * With --daemon (default $BUILD/gpucmdd, BUILD defaulting to "build") the
 * soak starts its own daemon on a private socket and stops it at the end
 * (SIGTERM, exit status 0 required).  With --socket and no --daemon it
 * loads a daemon that is already running and finds its pid through the
 * socket's peer credentials.
 *
 * Every client process loops over a random mix of work, checking every
 * byte it reads back against what it wrote: create/read/release of random
 * sizes, fill and copy kernels, writes at random offsets, data written on
 * one stream and read on another, pipelined batches answered out of order,
 * memory usage and reports, a faulting kernel whose fault must surface at
 * the next sync of its stream (and only there; the host backend only: on
 * CUDA a fault loses the device), short spins, and reconnects.  Shared
 * regions are attached, copied through both ways and released (in a round
 * trip, in a batch behind copies still in flight, or by the hang-up);
 * graphs are captured, replayed and checked against what the replays must
 * have computed; a module is loaded, its add_one launched and unloaded
 * (on the host backend, which loads no modules, the load must be refused
 * with GPUCMD_EUNSUPPORTED); an allocation past the service's memory
 * quota must be refused with GPUCMD_EQUOTA and leave the rest alone.
 * Clients that hang up with work in flight are part of the mix, and so
 * are connections of a forked helper killed with SIGKILL at a random
 * point, in the middle of a batch or of a frame, or evicted by another
 * connection of its service.
 *
 * Shared buffers: each client keeps a second connection of its service,
 * and its two connections and its helpers share buffers under three names
 * per service (soak/w0 to soak/w2), so that a share finds the name taken
 * (GPUCMD_EEXIST) and an import finds none (GPUCMD_ENOTFOUND) or one whose
 * copy waits behind a spin (GPUCMD_EBUSY; once that share is answered the
 * import must get it).  A shared buffer's first bytes say who made it and
 * how (its seed and length), so that an importer checks every byte against
 * what the sharer wrote.  Held buffers are read (whole, through the
 * scratch region, or a range), copied by a kernel that takes them as
 * buffer_in, read by a graph that keeps them from their release
 * (GPUCMD_EBUSY), shared again (GPUCMD_EINVAL), written to in four ways
 * that must all be refused with GPUCMD_EINVAL and leave every byte as it
 * was, and released in random order (some detached, some with a read of
 * them still queued on another stream, which must read the sharer's
 * bytes); hang-ups, kills and evictions leave the rest to the daemon.
 * Every client shares and imports under soak-tight's names too, where
 * imports cross processes and a share may be refused for its quota.  On
 * the host backend, work_fault shares a buffer behind a fault: the share
 * (or a read before it) reports the fault, the buffer is lost, an import
 * is refused with GPUCMD_ESTREAM, and once it is released the name is free.  Detached batches
 * (gpucmd_submit_detached) go among the work, some due to fail
 * (GPUCMD_ENOTFOUND, GPUCMD_EINVAL, GPUCMD_EQUOTA): once each stream they
 * went to was synced, gpucmd_detached_failures must count exactly those.
 *
 * A daemon the soak starts itself gets a configuration file that lists
 * the clients' services (soak-0 to soak-3, clients taking them in turn)
 * with memory and region quotas; soak-3 has none.  Besides, every client
 * keeps a connection of service soak-tight, whose 2 MiB of memory and of
 * regions the clients together go past all the time: there GPUCMD_EQUOTA
 * at the allocation or attach is an answer, and anything else must be
 * right.  Every 4 s the soak rewrites the file with soak-tight's quotas
 * at 1 or 2 MiB, and reloads the daemon (SIGHUP).
 *
 * The daemon's VmRSS and descriptor count are sampled every 250 ms, and
 * an observer's connection asks for its status as often (a daemon that
 * does not answer within 20 s is wedged) and cleans up one service's free
 * memory (gpucmd_cleanup) under its clients' feet.  The soak fails when
 * the last quarter's peak exceeds the first quarter's by more than
 * --rss-slack MiB (default 32) or --fd-slack descriptors (default 4; on
 * the fake CUDA driver device memory is the daemon's own, and its pools
 * follow the load: give a wider --rss-slack there), when a client sees a
 * wrong result, when the observer's memory report lists shared buffers
 * the clients cannot have made (more than the names, or bytes that do not
 * add up), when a soak of 10 s or more shared, imported, refused or
 * failed detached nothing, or when at the end the memory report is not
 * back to zero for every service: no bytes in use or reserved, no
 * allocations, no regions, no modules, no shared buffers.
 *
 * Exit status: 0 passed, 1 failed, 2 usage, 77 skipped (no daemon binary).
 */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpucmd.h"

#define MAX_CLIENTS 64
#define MAX_SAMPLES 100000
/* Clients take services soak-0 to soak-<NSERVICES - 1> in turn. */
#define NSERVICES 4
/* A client's scratch: the killed helper's megabyte, then the rest. */
#define MIB (1u << 20)
#define BUF_BYTES (2 * MIB)

static struct {
	const char *daemon;
	const char *socket;
	const char *backend;
	unsigned seconds;
	unsigned clients;
	unsigned seed;
	long rss_slack_kb;
	int fd_slack;
	bool quiet;
} opt = {
	.backend = "host",
	.seconds = 60,
	.clients = 4,
	.seed = 1,
	.rss_slack_kb = 32 * 1024,
	.fd_slack = 4,
};

static char sock_path[128];
static char tmp_dir[64];

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- the client processes ------------------------------------------------- */

/*
 * Shared buffers: every connection of a service shares under one of
 * SHARE_NAMES names, so that a client's two connections and its helpers
 * (all of one service take the same names) run into each other's shares:
 * GPUCMD_EEXIST at a share, GPUCMD_ENOTFOUND and GPUCMD_EBUSY at an import
 * are answers.  A shared buffer says what it is in its first SHARE_HEAD
 * bytes (a magic, its service and name, the sharer's seed and its length)
 * and the rest is the pattern of that seed: whoever imports it checks
 * every byte against what the sharer wrote without asking the sharer.
 */
#define SHARE_NAMES 3
#define SHARE_HEAD 16
#define SHARE_MAX (SHARE_HEAD + (256u << 10))
#define SHARE_MAGIC 0x6b616f73u
/* Shared buffers one connection holds at most, its own and imports. */
#define KEPT_SHARED 2

struct share_head {
	uint32_t magic;
	uint32_t seed;
	uint32_t len;
	uint8_t service;
	uint8_t name;
	uint8_t pad[2];
};

/* A shared buffer a connection of the client holds: its own, or an import. */
struct held_share {
	struct gpucmd_conn *conn;
	uint64_t handle;
	uint32_t seed;
	uint32_t len;
	uint8_t name;
	bool sharer;
};

/*
 * What a client saw of shares and detached batches, for the soak's
 * totals: in memory shared with the soak, one entry per client.
 */
struct soak_stats {
	uint64_t shares;
	uint64_t share_eexist;
	uint64_t share_equota;
	uint64_t lost;
	uint64_t imports;
	uint64_t import_enotfound;
	uint64_t import_ebusy;
	uint64_t shared_reads;
	uint64_t refused_writes;
	uint64_t detached;
	uint64_t detached_failed;
};

static struct soak_stats *stats;

struct client {
	int index;
	unsigned seed;
	struct gpucmd_conn *conn;
	struct gpucmd_conn *tight; /* of soak-tight, once work_tight ran */
	uint64_t next_handle;
	uint64_t next_id; /* regions, graphs and modules */
	uint64_t ops;
	uint64_t batches;
	uint64_t kills;
	uint64_t evictions;
	unsigned kept_regions; /* left attached for the next hang-up */
	unsigned kept_graphs;  /* left, with their buffers, for it too */
	bool cuda;	       /* the daemon drives CUDA (here the fake) */
	bool helper;	       /* work_killed's helper, which may be evicted */
	/* A second connection of its service, to import what one shares. */
	struct gpucmd_conn *peer;
	/* Its own and imports, on conn, peer and tight. */
	struct held_share held[3 * KEPT_SHARED];
	unsigned nheld;
	uint32_t share_seed;
	/*
	 * Per connection (conn, peer): detached failures due since the
	 * count was last asked for, their codes (code_bit) and the streams
	 * detached batches went to.
	 */
	uint64_t det_due[2];
	unsigned det_codes[2];
	unsigned det_streams[2];
	struct soak_stats st;
};

/*
 * A helper whose connection an eviction ended leaves quietly (status 3),
 * whatever call found out; everyone else says what went wrong.
 */
#define fail_client(c, ...)                                       \
	do {                                                      \
		if ((c)->helper && (c)->conn != NULL &&           \
		    gpucmd_conn_error((c)->conn, NULL) != 0)      \
			_exit(3);                                 \
		fprintf(stderr, "soak: client %d: ", (c)->index); \
		fprintf(stderr, __VA_ARGS__);                     \
		fputc('\n', stderr);                              \
		_exit(1);                                         \
	} while (0)

static unsigned rnd(struct client *c, unsigned n)
{
	return n ? (unsigned)rand_r(&c->seed) % n : 0;
}

/* A connection for service, retried while the daemon is full. */
static struct gpucmd_conn *connect_service(struct client *c,
					   const char *service)
{
	struct gpucmd_conn *conn = NULL;
	char msg[256] = "";
	int rc;

	for (int tries = 0;; tries++) {
		rc = gpucmd_connect(sock_path, service, &conn, msg,
				    sizeof(msg));
		if (rc == 0)
			return conn;
		if (tries > 100)
			fail_client(c, "connect to %s: %s (%s)", service,
				    gpucmd_strerror(rc), msg);
		usleep(10000);
	}
}

static void connect_client(struct client *c)
{
	char service[32];

	snprintf(service, sizeof(service), "soak-%d", c->index % NSERVICES);
	c->conn = connect_service(c, service);
	c->cuda = strcmp(gpucmd_info(c->conn)->backend, "cuda") == 0;
}

static struct gpucmd_batch *new_batch(struct client *c, uint32_t stream)
{
	struct gpucmd_batch *b = NULL;

	if (gpucmd_batch_new(c->conn, stream, &b) != 0)
		fail_client(c, "batch_new failed");
	return b;
}

/* Run b; it must succeed; the response is returned. */
static struct gpucmd_response *run(struct client *c, struct gpucmd_batch *b,
				   const char *what)
{
	struct gpucmd_response *r = NULL;
	size_t n = gpucmd_batch_count(b);
	int rc = gpucmd_run(b, &r);

	if (rc != 0)
		fail_client(c, "%s: run: %s", what, gpucmd_strerror(rc));
	if (gpucmd_response_error(r) != 0)
		fail_client(c, "%s: op %d failed: %s (%s)", what,
			    gpucmd_response_failed_index(r),
			    gpucmd_errname(gpucmd_response_error(r)),
			    gpucmd_response_message(r));
	if (gpucmd_response_count(r) != n)
		fail_client(c, "%s: %zu results for %zu ops", what,
			    gpucmd_response_count(r), n);
	c->ops += n;
	c->batches++;
	return r;
}

static void expect_bytes(struct client *c, const struct gpucmd_response *r,
			 size_t i, const uint8_t *want, size_t len,
			 const char *what)
{
	const uint8_t *got;
	size_t got_len;

	if (gpucmd_response_data(r, i, (const void **)&got, &got_len) != 0)
		fail_client(c, "%s: result %zu carries no data", what, i);
	if (got_len != len)
		fail_client(c, "%s: read %zu bytes, expected %zu", what,
			    got_len, len);
	for (size_t k = 0; k < len; k++)
		if (got[k] != want[k])
			fail_client(c,
				    "%s: byte %zu is 0x%02x, expected 0x%02x",
				    what, k, got[k], want[k]);
}

static void pattern(uint8_t *buf, size_t len, unsigned seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(seed + i * 31 + (i >> 9));
}

/* The most requests c may have in flight, want at most. */
static unsigned max_in_flight(const struct client *c, unsigned want)
{
	uint32_t n = gpucmd_info(c->conn)->max_in_flight;

	return n < want ? n : want;
}

static uint64_t handle(struct client *c)
{
	return ++c->next_handle;
}

/* create, read back, release: sizes from 1 byte to 256 KiB. */
static void work_roundtrip(struct client *c, uint8_t *buf)
{
	size_t len = 1 + rnd(c, 1u << (1 + rnd(c, 18)));
	uint32_t stream = rnd(c, 4);
	uint64_t h = handle(c);
	struct gpucmd_batch *b = new_batch(c, stream);
	struct gpucmd_response *r;

	pattern(buf, len, (unsigned)h);
	gpucmd_batch_create_with_data(b, h, buf, len);
	gpucmd_batch_read(b, h, 0, len);
	gpucmd_batch_release(b, h);
	r = run(c, b, "roundtrip");
	expect_bytes(c, r, 1, buf, len, "roundtrip");
	gpucmd_response_free(r);
}

/* fill_u32 on a fresh buffer (same stream), then read. */
static void work_fill(struct client *c, uint8_t *buf)
{
	uint32_t count = 1 + rnd(c, 16384), value = (uint32_t)rand_r(&c->seed);
	uint32_t grid[3] = { 1 + rnd(c, 64), 1, 1 }, block[3] = { 64, 1, 1 };
	uint32_t stream = rnd(c, 4);
	uint64_t h = handle(c);
	struct gpucmd_arg args[3] = {
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = h },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = value },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = count },
	};
	struct gpucmd_batch *b = new_batch(c, stream);
	struct gpucmd_response *r;

	gpucmd_batch_empty(b, h, (uint64_t)count * 4);
	gpucmd_batch_kernel(b, "fill_u32", grid, block, args, 3);
	gpucmd_batch_read(b, h, 0, (uint64_t)count * 4);
	gpucmd_batch_release(b, h);
	r = run(c, b, "fill");
	for (uint32_t i = 0; i < count; i++)
		memcpy(buf + (size_t)i * 4, &value, 4);
	expect_bytes(c, r, 2, buf, (size_t)count * 4, "fill");
	gpucmd_response_free(r);
}

/*
 * Data written on one stream and used on others: a copy kernel on a second
 * stream and a read on a third must see the write (the daemon orders them).
 */
static void work_cross_stream(struct client *c, uint8_t *buf)
{
	size_t len = 1 + rnd(c, 65536);
	uint64_t src = handle(c), dst = handle(c);
	uint32_t s1 = rnd(c, 4), s2 = rnd(c, 4), s3 = rnd(c, 4);
	uint32_t one[3] = { 1, 1, 1 };
	struct gpucmd_arg args[3] = {
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = dst },
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = src },
		{ .kind = GPUCMD_ARG_U64, .v.u64 = len },
	};
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	uint64_t ids[3];

	pattern(buf, len, (unsigned)src * 7);
	b = new_batch(c, s1);
	gpucmd_batch_create_with_data(b, src, buf, len);
	gpucmd_batch_create_with_data(b, dst, buf + 1,
				      len); /* not the answer */
	if (gpucmd_submit(b, &ids[0]) != 0)
		fail_client(c, "submit");
	b = new_batch(c, s2);
	gpucmd_batch_kernel(b, "copy", one, one, args, 3);
	if (gpucmd_submit(b, &ids[1]) != 0)
		fail_client(c, "submit");
	b = new_batch(c, s3);
	gpucmd_batch_read(b, dst, 0, len);
	gpucmd_batch_release(b, src);
	gpucmd_batch_release(b, dst);
	if (gpucmd_submit(b, &ids[2]) != 0)
		fail_client(c, "submit");
	/* Answers collected in reverse order. */
	for (int i = 2; i >= 0; i--) {
		if (gpucmd_wait(c->conn, ids[i], &r) != 0)
			fail_client(c, "wait");
		if (gpucmd_response_error(r) != 0)
			fail_client(c, "cross-stream batch %d: %s (%s)", i,
				    gpucmd_errname(gpucmd_response_error(r)),
				    gpucmd_response_message(r));
		if (i == 2)
			expect_bytes(c, r, 0, buf, len, "cross-stream copy");
		gpucmd_response_free(r);
		c->batches++;
	}
}

/* Writes at random offsets of a buffer, read back whole. */
static void work_writes(struct client *c, uint8_t *buf)
{
	size_t len = 64 + rnd(c, 32768);
	uint64_t h = handle(c);
	uint32_t stream = rnd(c, 4);
	struct gpucmd_batch *b = new_batch(c, stream);
	struct gpucmd_response *r;
	uint8_t *want = buf + 65536 * 4;

	pattern(want, len, 3);
	gpucmd_batch_create_with_data(b, h, want, len);
	for (int i = 0; i < 8; i++) {
		size_t off = rnd(c, (unsigned)len),
		       n = 1 + rnd(c, (unsigned)(len - off));

		pattern(want + off, n, (unsigned)(i * 11 + off));
		gpucmd_batch_write(b, h, off, want + off, n);
	}
	gpucmd_batch_read(b, h, 0, len);
	gpucmd_batch_release(b, h);
	r = run(c, b, "writes");
	expect_bytes(c, r, 9, want, len, "writes");
	gpucmd_response_free(r);
}

static void work_reports(struct client *c)
{
	struct gpucmd_batch *b = new_batch(c, rnd(c, 4));
	struct gpucmd_response *r;
	struct gpucmd_memory_usage u;
	struct gpucmd_report *rep = NULL;
	struct gpucmd_status st;

	gpucmd_batch_memory_usage(b);
	gpucmd_batch_ping(b);
	r = run(c, b, "usage");
	if (gpucmd_response_usage(r, 0, &u) != 0 ||
	    u.bytes_in_use > u.bytes_reserved)
		fail_client(c, "memory usage: %llu in use, %llu reserved",
			    (unsigned long long)u.bytes_in_use,
			    (unsigned long long)u.bytes_reserved);
	gpucmd_response_free(r);
	if (gpucmd_memory_report(c->conn, &rep) != 0)
		fail_client(c, "memory report");
	gpucmd_report_free(rep);
	if (gpucmd_status(c->conn, &st) != 0)
		fail_client(c, "status");
}

static void held_drop(struct client *c, struct held_share *e)
{
	*e = c->held[--c->nheld];
}

/* What conn held goes with it (a hang-up, a close). */
static void held_forget(struct client *c, const struct gpucmd_conn *conn)
{
	for (unsigned i = 0; i < c->nheld;)
		if (c->held[i].conn == conn)
			held_drop(c, &c->held[i]);
		else
			i++;
}

/* Forget the detached batches of conn: its close drops them uncounted. */
static void detached_forget(struct client *c, const struct gpucmd_conn *conn)
{
	int k = conn == c->peer;

	c->det_due[k] = 0;
	c->det_codes[k] = 0;
	c->det_streams[k] = 0;
}

/* Pipelined batches, then a hang-up with some still in flight. */
static void work_hangup(struct client *c, uint8_t *buf)
{
	uint64_t id;

	for (int i = 0; i < 1 + (int)rnd(c, max_in_flight(c, 16)); i++) {
		struct gpucmd_batch *b = new_batch(c, rnd(c, 4));
		uint64_t h = handle(c);

		gpucmd_batch_create_with_data(b, h, buf, 1 + rnd(c, 8192));
		if (rnd(c, 2))
			gpucmd_batch_sync(b);
		if (gpucmd_submit(b, &id) != 0)
			fail_client(c, "submit");
	}
	/* Shared buffers held and detached batches in flight go too. */
	held_forget(c, c->conn);
	detached_forget(c, c->conn);
	gpucmd_close(c->conn);
	c->conn = NULL;
	c->kept_regions = 0;
	c->kept_graphs = 0;
	connect_client(c);
}

static void work_spin(struct client *c)
{
	uint32_t one[3] = { 1, 1, 1 };
	struct gpucmd_arg a = { .kind = GPUCMD_ARG_U32,
				.v.u32 = 50 + rnd(c, 500) };
	struct gpucmd_batch *b = new_batch(c, rnd(c, 4));

	gpucmd_batch_kernel(b, "spin", one, one, &a, 1);
	gpucmd_batch_sync(b);
	gpucmd_response_free(run(c, b, "spin"));
}

static uint64_t next_id(struct client *c)
{
	return ++c->next_id;
}

/* Run b, whose op at index must fail with code; the response is returned. */
static struct gpucmd_response *run_refused(struct client *c,
					   struct gpucmd_batch *b, int index,
					   int code, const char *what)
{
	struct gpucmd_response *r = NULL;
	int rc = gpucmd_run(b, &r);

	if (rc != 0)
		fail_client(c, "%s: run: %s", what, gpucmd_strerror(rc));
	if (gpucmd_response_error(r) != code ||
	    gpucmd_response_failed_index(r) != index)
		fail_client(c,
			    "%s: op %d got %s (%s), expected op %d to get %s",
			    what, gpucmd_response_failed_index(r),
			    gpucmd_errname(gpucmd_response_error(r)),
			    gpucmd_response_message(r), index,
			    gpucmd_errname(code));
	c->batches++;
	return r;
}

/*
 * A fault: reported at the next sync of its stream, once, and only there;
 * or at a share on that stream (GPUCMD_ESTREAM, "faulted before this
 * share"), or at a read before a share in the batch, whose message names
 * the share: the buffer is lost, its import is refused with GPUCMD_ESTREAM
 * until its handle is released, and then the name is free.  The name is
 * the client's own, so that every answer is known.
 */
static void work_fault(struct client *c, uint8_t *buf)
{
	uint32_t one[3] = { 1, 1, 1 };
	uint32_t s = rnd(c, 4), other = (s + 1) % 4;
	struct gpucmd_conn *conn = c->conn;
	struct gpucmd_batch *b;
	struct gpucmd_response *r = NULL;
	uint64_t h = handle(c), imp = handle(c);
	int how = rnd(c, 3);
	char nm[16], want[96];

	b = new_batch(c, s);
	gpucmd_batch_kernel(b, "fault", one, one, NULL, 0);
	gpucmd_response_free(run(c, b, "fault launch"));
	b = new_batch(c, other);
	gpucmd_batch_sync(b);
	gpucmd_response_free(run(c, b, "sync of another stream"));
	if (how == 0) {
		b = new_batch(c, s);
		gpucmd_batch_sync(b);
		if (gpucmd_run(b, &r) != 0)
			fail_client(c, "fault sync: run");
		if (gpucmd_response_error(r) != GPUCMD_ESTREAM)
			fail_client(c,
				    "the sync after a fault got %s, not "
				    "GPUCMD_ESTREAM",
				    gpucmd_errname(gpucmd_response_error(r)));
		gpucmd_response_free(r);
		b = new_batch(c, s);
		gpucmd_batch_sync(b);
		gpucmd_response_free(
			run(c, b, "sync after the reported fault"));
		return;
	}
	snprintf(nm, sizeof(nm), "soak/f%d", c->index);
	pattern(buf, 64, (unsigned)h);
	b = new_batch(c, s);
	gpucmd_batch_create_with_data(b, h, buf, 64);
	if (how == 2)
		gpucmd_batch_read(b, h, 0, 64);
	gpucmd_batch_share(b, h, nm);
	r = run_refused(c, b, 1, GPUCMD_ESTREAM, "a share after a fault");
	if (how == 1)
		snprintf(want, sizeof(want), "faulted before this share");
	else
		snprintf(want, sizeof(want), "shared as '%s' at op 2, is lost",
			 nm);
	if (strstr(gpucmd_response_message(r), want) == NULL)
		fail_client(c, "a share after a fault: '%s' lacks '%s'",
			    gpucmd_response_message(r), want);
	gpucmd_response_free(r);
	c->st.lost++;
	/* Reported once: the stream is clean again. */
	b = new_batch(c, s);
	gpucmd_batch_sync(b);
	gpucmd_response_free(
		run(c, b, "sync after the fault a share reported"));
	/* Lost: no connection imports it (the peer, when there is one). */
	if (c->peer != NULL)
		c->conn = c->peer;
	b = new_batch(c, rnd(c, 4));
	gpucmd_batch_import(b, imp, nm);
	r = run_refused(c, b, 0, GPUCMD_ESTREAM, "import of a lost buffer");
	if (strstr(gpucmd_response_message(r), "was lost") == NULL)
		fail_client(c, "import of a lost buffer: '%s'",
			    gpucmd_response_message(r));
	gpucmd_response_free(r);
	c->conn = conn;
	/* Released (its only handle), the name is free. */
	b = new_batch(c, rnd(c, 4));
	gpucmd_batch_release(b, h);
	gpucmd_batch_sync(b);
	gpucmd_response_free(run(c, b, "release of a lost buffer"));
	if (c->peer != NULL)
		c->conn = c->peer;
	b = new_batch(c, rnd(c, 4));
	gpucmd_batch_import(b, imp, nm);
	gpucmd_response_free(run_refused(c, b, 0, GPUCMD_ENOTFOUND,
					 "import once a lost buffer was "
					 "released"));
	c->conn = conn;
}

/*
 * Regions and graphs a connection keeps between work items, and leaves to
 * its hang-up; a connection may hold 64 regions (the scratch region
 * included) and 1024 graphs.
 */
#define KEPT_REGIONS 4
#define KEPT_GRAPHS 16

/*
 * A shared region: a buffer made from one range of it and another written
 * from the same range, both read back into the region's second half, and
 * one of them inline too.  Then the region is released in a round trip, in
 * a batch with a copy from it still queued, or kept for the hang-up.
 */
static void work_region(struct client *c, uint8_t *buf)
{
	size_t size = 4096 + rnd(c, 256 << 10), half = size / 2;
	size_t n = 1 + rnd(c, (unsigned)half);
	size_t so = rnd(c, (unsigned)(half - n + 1));
	size_t d1 = half + rnd(c, (unsigned)(half - n + 1));
	uint64_t id = next_id(c), h1 = handle(c), h2 = handle(c), reg, off, len;
	uint32_t stream = rnd(c, 4);
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	uint8_t *p = NULL;
	int rc;

	rc = gpucmd_region_create(c->conn, id, size, (void **)&p);
	if (rc != 0)
		fail_client(c, "region_create of %zu bytes: %s (%s)", size,
			    gpucmd_errname(rc), gpucmd_last_message(c->conn));
	pattern(p, size, (unsigned)id * 13);
	memcpy(buf, p + so, n);
	b = new_batch(c, stream);
	gpucmd_batch_create_region(b, h1, id, so, n);
	gpucmd_batch_empty(b, h2, n);
	gpucmd_batch_write_region(b, h2, 0, id, so, n);
	gpucmd_batch_read_region(b, h1, 0, n, id, d1);
	gpucmd_batch_read(b, h2, 0, n);
	gpucmd_batch_release(b, h1);
	r = run(c, b, "region copies");
	expect_bytes(c, r, 4, buf, n, "region: inline read of a write_region");
	if (gpucmd_response_region(r, 3, &reg, &off, &len) != 0 || reg != id ||
	    off != d1 || len != n)
		fail_client(c,
			    "region: the read names region %llu "
			    "[%llu, +%llu)",
			    (unsigned long long)reg, (unsigned long long)off,
			    (unsigned long long)len);
	gpucmd_response_free(r);
	for (size_t k = 0; k < n; k++)
		if (p[d1 + k] != buf[k])
			fail_client(c,
				    "region: byte %zu read into the region is "
				    "0x%02x, expected 0x%02x",
				    k, p[d1 + k], buf[k]);

	switch (rnd(c, 4)) {
	case 0:
		/* A new range written from the region, released behind it. */
		pattern(p, half, (unsigned)id * 17);
		memcpy(buf, p, n);
		b = new_batch(c, stream);
		gpucmd_batch_write_region(b, h2, 0, id, 0, n);
		gpucmd_batch_release_region(b, id);
		gpucmd_response_free(run(c, b,
					 "region: released behind "
					 "a copy"));
		b = new_batch(c, rnd(c, 4));
		gpucmd_batch_read(b, h2, 0, n);
		gpucmd_batch_release(b, h2);
		r = run(c, b, "region: read after the release");
		expect_bytes(c, r, 0, buf, n,
			     "region: write queued before "
			     "its release");
		gpucmd_response_free(r);
		return;
	case 1:
		if (c->kept_regions < KEPT_REGIONS) {
			c->kept_regions++;
			break;
		}
		__attribute__((fallthrough));
	default:
		rc = gpucmd_region_release(c->conn, id);
		if (rc != 0)
			fail_client(c, "region_release: %s (%s)",
				    gpucmd_errname(rc),
				    gpucmd_last_message(c->conn));
		break;
	}
	b = new_batch(c, stream);
	gpucmd_batch_release(b, h2);
	gpucmd_response_free(run(c, b, "region: release"));
}

/*
 * The convenience transfers past GPUCMD_INLINE_MAX, which go through the
 * connection's scratch region.
 */
static void work_scratch(struct client *c, uint8_t *buf)
{
	size_t len = GPUCMD_INLINE_MAX + 1 + rnd(c, 160 << 10);
	uint8_t *got = buf + (256 << 10);
	uint32_t stream = rnd(c, 4);
	uint64_t h = handle(c);
	struct gpucmd_batch *b = new_batch(c, stream);
	int rc;

	gpucmd_batch_empty(b, h, len);
	gpucmd_response_free(run(c, b, "scratch: empty"));
	pattern(buf, len, (unsigned)h * 5);
	rc = gpucmd_write_buffer(c->conn, stream, h, 0, buf, len);
	if (rc != 0)
		fail_client(c, "write_buffer of %zu bytes: %s (%s)", len,
			    gpucmd_errname(rc), gpucmd_last_message(c->conn));
	memset(got, 0, len);
	rc = gpucmd_read_buffer(c->conn, rnd(c, 4), h, 0, len, got);
	if (rc != 0)
		fail_client(c, "read_buffer of %zu bytes: %s (%s)", len,
			    gpucmd_errname(rc), gpucmd_last_message(c->conn));
	for (size_t k = 0; k < len; k++)
		if (got[k] != buf[k])
			fail_client(c,
				    "scratch: byte %zu is 0x%02x, expected "
				    "0x%02x",
				    k, got[k], buf[k]);
	b = new_batch(c, stream);
	gpucmd_batch_release(b, h);
	gpucmd_response_free(run(c, b, "scratch: release"));
}

static uint32_t f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

/*
 * A graph of two kernels (x *= 2, then y = x) captured, replayed k times
 * and read back: x and y must be x0 * 2^k, to the bit.  Now and then the
 * graph and its buffers are left for the hang-up to clean.
 */
static void work_graph(struct client *c, uint8_t *buf)
{
	uint32_t n = 1 + rnd(c, 4096), k = 1 + rnd(c, 4);
	uint32_t grid[3] = { (n + 63) / 64, 1, 1 }, block[3] = { 64, 1, 1 };
	uint32_t one[3] = { 1, 1, 1 };
	uint64_t x = handle(c), y = handle(c), g = next_id(c);
	struct gpucmd_arg scale[3] = {
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = x },
		{ .kind = GPUCMD_ARG_F32, .v.f32 = 2.0f },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = n },
	};
	struct gpucmd_arg copy[3] = {
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = y },
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = x },
		{ .kind = GPUCMD_ARG_U64, .v.u64 = (uint64_t)n * 4 },
	};
	struct gpucmd_batch *b = new_batch(c, rnd(c, 4));
	struct gpucmd_response *r;
	uint8_t *want = buf + (256 << 10);

	for (uint32_t i = 0; i < n; i++) {
		float x0 = (float)(1 + (i + g) % 13);
		uint32_t v0 = f32_bits(x0), v = f32_bits(x0 * (float)(1u << k));

		memcpy(buf + (size_t)i * 4, &v0, 4);
		memcpy(want + (size_t)i * 4, &v, 4);
	}
	gpucmd_batch_create_with_data(b, x, buf, (size_t)n * 4);
	gpucmd_batch_empty(b, y, (uint64_t)n * 4);
	gpucmd_batch_capture_begin(b);
	gpucmd_batch_kernel(b, "scale_f32", grid, block, scale, 3);
	gpucmd_batch_kernel(b, "copy", one, one, copy, 3);
	gpucmd_batch_capture_end(b, g);
	for (uint32_t i = 0; i < k; i++)
		gpucmd_batch_graph_launch(b, g);
	gpucmd_batch_read(b, x, 0, (uint64_t)n * 4);
	gpucmd_batch_read(b, y, 0, (uint64_t)n * 4);
	if (rnd(c, 4) != 0 || c->kept_graphs == KEPT_GRAPHS) {
		gpucmd_batch_graph_destroy(b, g);
		gpucmd_batch_release(b, x);
		gpucmd_batch_release(b, y);
	} else {
		c->kept_graphs++;
	}
	r = run(c, b, "graph");
	expect_bytes(c, r, 6 + k, want, (size_t)n * 4, "graph: x replayed");
	expect_bytes(c, r, 7 + k, want, (size_t)n * 4, "graph: y replayed");
	gpucmd_response_free(r);
}

/*
 * add_one(p, n) adds one to n u32s at p: the fake CUDA driver runs it.  The
 * second form has globals, which count against the service's quota.
 */
static const char add_one_ptx[] =
	".version 8.0\n.target sm_90\n.address_size 64\n"
	".visible .entry add_one(\n.param .u64 add_one_param_0,\n"
	".param .u32 add_one_param_1\n)\n{\nret;\n}\n";
static const char add_one_globals_ptx[] =
	".version 8.0\n.target sm_90\n.address_size 64\n"
	".global .align 4 .b8 e[1048576];\n"
	".visible .entry add_one(\n.param .u64 add_one_param_0,\n"
	".param .u32 add_one_param_1\n)\n{\nret;\n}\n";

/*
 * A module loaded, its kernel launched on a buffer, unloaded with the
 * launch maybe still queued, and the buffer read back.  The host backend
 * loads no modules: there the load must be refused, and nothing else run.
 */
static void work_module(struct client *c, uint8_t *buf)
{
	const char *ptx = rnd(c, 2) ? add_one_ptx : add_one_globals_ptx;
	uint32_t n = 1 + rnd(c, 4096), one[3] = { 1, 1, 1 };
	uint64_t m = next_id(c), h = handle(c);
	struct gpucmd_arg args[2] = {
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = h },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = n },
	};
	struct gpucmd_batch *b = new_batch(c, rnd(c, 4));
	struct gpucmd_response *r;
	uint8_t *want = buf + (256 << 10);

	gpucmd_batch_load_module(b, m, "ptx", ptx, strlen(ptx));
	if (!c->cuda) {
		gpucmd_response_free(run_refused(c, b, 0, GPUCMD_EUNSUPPORTED,
						 "module load on host"));
		return;
	}
	pattern(buf, (size_t)n * 4, (unsigned)h);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t v;

		memcpy(&v, buf + (size_t)i * 4, 4);
		v++;
		memcpy(want + (size_t)i * 4, &v, 4);
	}
	gpucmd_batch_create_with_data(b, h, buf, (size_t)n * 4);
	gpucmd_batch_kernel_module(b, m, "add_one", one, one, 0, args, 2);
	gpucmd_batch_unload_module(b, m);
	gpucmd_batch_read(b, h, 0, (uint64_t)n * 4);
	gpucmd_batch_release(b, h);
	r = run(c, b, "module");
	expect_bytes(c, r, 4, want, (size_t)n * 4, "module: add_one");
	gpucmd_response_free(r);
}

/*
 * Past the memory quota: an allocation one byte over the service's limit
 * is refused, the buffer made before it in the same batch is intact, and
 * the service's report shows the limit.
 */
static void work_quota(struct client *c, uint8_t *buf)
{
	uint64_t limit = gpucmd_info(c->conn)->memory_limit;
	uint64_t h = handle(c), big = handle(c);
	size_t len = 1 + rnd(c, 4096);
	struct gpucmd_report *rep = NULL;
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	bool seen = false;

	if (limit == 0)
		return;
	pattern(buf, len, (unsigned)h);
	b = new_batch(c, rnd(c, 4));
	gpucmd_batch_create_with_data(b, h, buf, len);
	gpucmd_batch_empty(b, big, limit + 1);
	gpucmd_batch_release(b, big);
	gpucmd_response_free(run_refused(c, b, 1, GPUCMD_EQUOTA, "quota"));
	b = new_batch(c, rnd(c, 4));
	gpucmd_batch_read(b, h, 0, len);
	gpucmd_batch_release(b, h);
	r = run(c, b, "quota: the buffer before the refusal");
	expect_bytes(c, r, 0, buf, len, "quota: the buffer before the refusal");
	gpucmd_response_free(r);
	if (gpucmd_memory_report(c->conn, &rep) != 0)
		fail_client(c, "memory report");
	for (size_t i = 0; i < rep->nservices; i++) {
		const struct gpucmd_service_report *s = &rep->services[i];

		if (strcmp(s->name, gpucmd_info(c->conn)->service) != 0)
			continue;
		seen = true;
		if (s->limit_bytes != limit || s->oom_count == 0)
			fail_client(c,
				    "quota: %s reports a limit of %llu "
				    "(welcomed with %llu) and %llu refusals",
				    s->name, (unsigned long long)s->limit_bytes,
				    (unsigned long long)limit,
				    (unsigned long long)s->oom_count);
	}
	if (!seen)
		fail_client(c, "quota: the memory report lists no %s",
			    gpucmd_info(c->conn)->service);
	gpucmd_report_free(rep);
}

/* ---- shared buffers and detached batches ---------------------------------- */

static void share_name(char *out, size_t len, unsigned name)
{
	snprintf(out, len, "soak/w%u", name);
}

/* The bytes the sharer of (seed, name) writes, len of them, into buf. */
static void share_bytes(const struct client *c, uint8_t *buf, uint32_t len,
			uint32_t seed, unsigned name)
{
	struct share_head h = {
		.magic = SHARE_MAGIC,
		.seed = seed,
		.len = len,
		.service = (uint8_t)gpucmd_info(c->conn)->service_id,
		.name = (uint8_t)name,
	};

	memcpy(buf, &h, SHARE_HEAD);
	pattern(buf + SHARE_HEAD, len - SHARE_HEAD, seed);
}

static unsigned held_count(const struct client *c)
{
	unsigned n = 0;

	for (unsigned i = 0; i < c->nheld; i++)
		n += c->held[i].conn == c->conn;
	return n;
}

/* A shared handle c->conn holds, at random; NULL when none. */
static struct held_share *held_pick(struct client *c)
{
	unsigned n = held_count(c), k;

	if (n == 0)
		return NULL;
	k = rnd(c, n);
	for (unsigned i = 0; i < c->nheld; i++)
		if (c->held[i].conn == c->conn && k-- == 0)
			return &c->held[i];
	return NULL;
}

/* Which of the client's connections c->conn is, for the detached counts. */
static int conn_slot(const struct client *c)
{
	return c->conn == c->peer;
}

/* The failures work_detached makes, as bits of a mask. */
static unsigned code_bit(int code)
{
	switch (code) {
	case GPUCMD_ENOTFOUND:
		return 1;
	case GPUCMD_EINVAL:
		return 2;
	case GPUCMD_EQUOTA:
		return 4;
	default:
		return 8;
	}
}

/*
 * Send b detached; a failure is due from it when code is not 0.  A
 * helper counts nothing: it dies with its batches in flight.
 */
static void detach(struct client *c, struct gpucmd_batch *b, uint32_t stream,
		   int code)
{
	int k = conn_slot(c);

	if (gpucmd_submit_detached(b) != 0)
		fail_client(c, "submit_detached: %s",
			    gpucmd_last_message(c->conn));
	c->st.detached++;
	c->det_streams[k] |= 1u << stream;
	if (code == 0)
		return;
	c->det_due[k]++;
	c->det_codes[k] |= code_bit(code);
}

/*
 * Once a waited sync of every stream detached batches of c->conn went to
 * is answered, gpucmd_detached_failures must count exactly those due, and
 * the first one's code must be one of theirs.
 */
static void detached_check(struct client *c, const char *what)
{
	int k = conn_slot(c), code = 0;
	char msg[512] = "";
	uint64_t n;

	for (uint32_t s = 0; s < 4; s++) {
		struct gpucmd_batch *b;

		if (!(c->det_streams[k] & (1u << s)))
			continue;
		b = new_batch(c, s);
		gpucmd_batch_sync(b);
		gpucmd_response_free(run(c, b, "detached: sync"));
	}
	n = gpucmd_detached_failures(c->conn, &code, msg, sizeof(msg));
	if (n != c->det_due[k])
		fail_client(c,
			    "%s: %llu detached batches failed, %llu were to "
			    "(first: %s, %s)",
			    what, (unsigned long long)n,
			    (unsigned long long)c->det_due[k],
			    gpucmd_errname(code), msg);
	if (n > 0 && !(c->det_codes[k] & code_bit(code)))
		fail_client(c, "%s: a detached batch failed with %s (%s)", what,
			    gpucmd_errname(code), msg);
	c->st.detached_failed += n;
	c->det_due[k] = 0;
	c->det_codes[k] = 0;
	c->det_streams[k] = 0;
}

/* Whether batches of c->conn may go detached: their count is kept. */
static bool may_detach(const struct client *c)
{
	return !c->helper && c->conn != c->tight;
}

/*
 * Release e, in a round trip or detached, and forget it.  Half the time
 * a read of it waits on another stream behind a spin, sent before the
 * release: the release (the last handle of the buffer, often) must leave
 * the memory to it, and it reads what the sharer wrote.
 */
static void share_release(struct client *c, struct held_share *e, uint8_t *buf)
{
	uint32_t s = rnd(c, 4), s2 = (s + 1 + rnd(c, 3)) % 4;
	uint32_t one[3] = { 1, 1, 1 };
	struct gpucmd_arg spin = { .kind = GPUCMD_ARG_U32,
				   .v.u32 = 500 + rnd(c, 3000) };
	bool reading = max_in_flight(c, 2) == 2 && rnd(c, 2);
	size_t off = rnd(c, e->len), n = 1 + rnd(c, (unsigned)(e->len - off));
	struct gpucmd_response *r = NULL;
	struct gpucmd_batch *b;
	uint64_t id = 0;

	if (reading) {
		b = new_batch(c, s2);
		gpucmd_batch_kernel(b, "spin", one, one, &spin, 1);
		gpucmd_batch_read(b, e->handle, off, n);
		if (gpucmd_submit(b, &id) != 0)
			fail_client(c, "shared: submit");
	}
	b = new_batch(c, s);
	gpucmd_batch_release(b, e->handle);
	if (may_detach(c) && rnd(c, 2)) {
		detach(c, b, s, 0);
	} else {
		if (rnd(c, 2))
			gpucmd_batch_sync(b);
		gpucmd_response_free(run(c, b, "shared: release"));
	}
	if (reading) {
		if (gpucmd_wait(c->conn, id, &r) != 0)
			fail_client(c, "shared: wait");
		c->batches++;
		if (gpucmd_response_error(r) != 0)
			fail_client(c,
				    "shared: a read sent before the release: "
				    "op %d: %s (%s)",
				    gpucmd_response_failed_index(r),
				    gpucmd_errname(gpucmd_response_error(r)),
				    gpucmd_response_message(r));
		share_bytes(c, buf, e->len, e->seed, e->name);
		expect_bytes(c, r, 1, buf + off, n,
			     "shared: a read sent before the release");
		gpucmd_response_free(r);
		c->st.shared_reads++;
	}
	held_drop(c, e);
}

/* Room for one more shared handle on c->conn: a random one goes. */
static void share_room(struct client *c, uint8_t *buf)
{
	while (held_count(c) >= KEPT_SHARED)
		share_release(c, held_pick(c), buf);
}

/*
 * Read e whole and check every byte: inline, or through the scratch
 * region past GPUCMD_INLINE_MAX.  want gets what the sharer wrote.
 */
static void share_expect(struct client *c, const struct held_share *e,
			 uint8_t *want, uint8_t *got, const char *what)
{
	int rc;

	share_bytes(c, want, e->len, e->seed, e->name);
	memset(got, 0, e->len);
	rc = gpucmd_read_buffer(c->conn, rnd(c, 4), e->handle, 0, e->len, got);
	if (rc != 0)
		fail_client(c, "%s: read_buffer of %u bytes: %s (%s)", what,
			    e->len, gpucmd_errname(rc),
			    gpucmd_last_message(c->conn));
	for (size_t k = 0; k < e->len; k++)
		if (got[k] != want[k])
			fail_client(c,
				    "%s: byte %zu of the %u shared as "
				    "soak/w%u (seed %u) is 0x%02x, expected "
				    "0x%02x",
				    what, k, e->len, e->name, e->seed, got[k],
				    want[k]);
	c->st.shared_reads++;
}

/*
 * The batch that makes a buffer and shares it under a random name: made
 * in the batch of the share, or written on another stream first by a
 * detached batch (the share must copy what that write left), and with
 * spin, behind a spin of that many microseconds.  *p describes the share,
 * *at is the share's op.
 */
static struct gpucmd_batch *share_batch(struct client *c, uint8_t *buf,
					uint32_t spin, struct held_share *p,
					int *at)
{
	uint32_t len = SHARE_HEAD + rnd(c, 1u << (4 + rnd(c, 15)));
	uint32_t seed = ++c->share_seed, s = rnd(c, 4), s1 = rnd(c, 4);
	unsigned name = rnd(c, SHARE_NAMES);
	uint32_t one[3] = { 1, 1, 1 };
	struct gpucmd_arg a = { .kind = GPUCMD_ARG_U32, .v.u32 = spin };
	struct gpucmd_batch *b;
	char nm[16];

	*p = (struct held_share){ .conn = c->conn,
				  .handle = handle(c),
				  .seed = seed,
				  .len = len,
				  .name = (uint8_t)name,
				  .sharer = true };
	share_name(nm, sizeof(nm), name);
	/* Made with other bytes: the write after them is what is shared. */
	pattern(buf, len, seed ^ 0x5a5a);
	share_bytes(c, buf + SHARE_MAX, len, seed, name);
	if (may_detach(c) && s1 != s && rnd(c, 2)) {
		b = new_batch(c, s1);
		gpucmd_batch_create_with_data(b, p->handle, buf, len);
		gpucmd_batch_write(b, p->handle, 0, buf + SHARE_MAX, len);
		detach(c, b, s1, 0);
		b = new_batch(c, s);
		*at = 0;
	} else {
		b = new_batch(c, s);
		gpucmd_batch_create_with_data(b, p->handle, buf, len);
		gpucmd_batch_write(b, p->handle, 0, buf + SHARE_MAX, len);
		*at = 2;
	}
	if (spin != 0) {
		gpucmd_batch_kernel(b, "spin", one, one, &a, 1);
		++*at;
	}
	gpucmd_batch_share(b, p->handle, nm);
	return b;
}

/*
 * The answer r to the share p (at op at): held when it was shared,
 * released when the service shares the name already.  Whether it is held.
 */
static bool share_answer(struct client *c, const struct held_share *p, int at,
			 struct gpucmd_response *r)
{
	struct gpucmd_conn *conn = c->conn;
	int rc = gpucmd_response_error(r);
	int failed = gpucmd_response_failed_index(r);
	struct gpucmd_batch *b;
	bool quota;

	c->batches++;
	/* Under soak-tight's quota the allocation or the copy may not fit. */
	quota = rc == GPUCMD_EQUOTA && p->conn == c->tight &&
		(failed == 0 || failed == at);
	if (rc != 0 && !quota && (rc != GPUCMD_EEXIST || failed != at))
		fail_client(c,
			    "shared: share of %u bytes as soak/w%u: op %d: %s "
			    "(%s)",
			    p->len, p->name, failed, gpucmd_errname(rc),
			    gpucmd_response_message(r));
	gpucmd_response_free(r);
	if (rc == 0) {
		c->held[c->nheld++] = *p;
		c->st.shares++;
		return true;
	}
	if (quota)
		c->st.share_equota++;
	else
		c->st.share_eexist++;
	/* Refused at the allocation, there is nothing to release. */
	if (quota && failed == 0)
		return false;
	c->conn = p->conn;
	b = new_batch(c, rnd(c, 4));
	gpucmd_batch_release(b, p->handle);
	gpucmd_response_free(run(c, b, "shared: release after EEXIST"));
	c->conn = conn;
	return false;
}

/*
 * A buffer a graph writes cannot be shared (GPUCMD_EBUSY: the graph keeps
 * its address) until the graph is destroyed.  Under the client's own
 * name, so that the answer is known; the buffer is released after.
 */
static void share_under_graph(struct client *c)
{
	uint32_t one[3] = { 1, 1, 1 };
	uint64_t h = handle(c), g = next_id(c);
	struct gpucmd_arg fill[3] = {
		{ .kind = GPUCMD_ARG_BUFFER, .v.handle = h },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = 7 },
		{ .kind = GPUCMD_ARG_U32, .v.u32 = 16 },
	};
	uint32_t s = rnd(c, 4);
	struct gpucmd_batch *b = new_batch(c, s);
	char nm[16];

	snprintf(nm, sizeof(nm), "soak/f%d", c->index);
	gpucmd_batch_empty(b, h, 64);
	gpucmd_batch_capture_begin(b);
	gpucmd_batch_kernel(b, "fill_u32", one, one, fill, 3);
	gpucmd_batch_capture_end(b, g);
	gpucmd_batch_share(b, h, nm);
	gpucmd_response_free(
		run_refused(c, b, 4, GPUCMD_EBUSY, "shared: under a graph"));
	b = new_batch(c, s);
	gpucmd_batch_graph_destroy(b, g);
	gpucmd_batch_release(b, h);
	gpucmd_response_free(run(c, b, "shared: graph destroyed"));
}

static void share_one(struct client *c, uint8_t *buf)
{
	struct held_share p;
	struct gpucmd_batch *b;
	struct gpucmd_response *r = NULL;
	int at;

	if (!c->helper && c->conn != c->tight && rnd(c, 8) == 0)
		share_under_graph(c);
	share_room(c, buf);
	b = share_batch(c, buf, 0, &p, &at);
	if (gpucmd_run(b, &r) != 0)
		fail_client(c, "shared: share: run");
	if (share_answer(c, &p, at, r) && rnd(c, 2))
		share_expect(c, &c->held[c->nheld - 1], buf, buf + SHARE_MAX,
			     "shared: the sharer's read");
}

/*
 * An import of a random name on c->conn, its header read in the same
 * batch and then every byte: GPUCMD_ENOTFOUND (no such share) and
 * GPUCMD_EBUSY (its copy still to run) are answers.  Whether the rc it
 * got is the import's, 1 when imported (with *out the held entry).
 */
static int share_import(struct client *c, uint8_t *buf, unsigned name,
			struct held_share **out)
{
	struct gpucmd_batch *b;
	struct gpucmd_response *r = NULL;
	struct share_head head;
	struct held_share *e;
	uint64_t h = handle(c);
	const void *data;
	size_t len;
	char nm[16];
	int rc;

	share_room(c, buf);
	share_name(nm, sizeof(nm), name);
	b = new_batch(c, rnd(c, 4));
	gpucmd_batch_import(b, h, nm);
	gpucmd_batch_read(b, h, 0, SHARE_HEAD);
	if (gpucmd_run(b, &r) != 0)
		fail_client(c, "shared: import: run");
	c->batches++;
	rc = gpucmd_response_error(r);
	if (rc != 0) {
		if ((rc != GPUCMD_ENOTFOUND && rc != GPUCMD_EBUSY) ||
		    gpucmd_response_failed_index(r) != 0)
			fail_client(c, "shared: import of %s: op %d: %s (%s)",
				    nm, gpucmd_response_failed_index(r),
				    gpucmd_errname(rc),
				    gpucmd_response_message(r));
		if (rc == GPUCMD_ENOTFOUND)
			c->st.import_enotfound++;
		else
			c->st.import_ebusy++;
		gpucmd_response_free(r);
		return rc;
	}
	if (gpucmd_response_data(r, 1, &data, &len) != 0 || len != SHARE_HEAD)
		fail_client(c, "shared: the header of %s: %zu bytes", nm, len);
	memcpy(&head, data, sizeof(head));
	gpucmd_response_free(r);
	if (head.magic != SHARE_MAGIC ||
	    head.service != (uint8_t)gpucmd_info(c->conn)->service_id ||
	    head.name != name || head.len < SHARE_HEAD || head.len > SHARE_MAX)
		fail_client(c,
			    "shared: import of %s found magic 0x%08x, "
			    "service %u, name %u, %u bytes",
			    nm, head.magic, head.service, head.name, head.len);
	e = &c->held[c->nheld++];
	*e = (struct held_share){ .conn = c->conn,
				  .handle = h,
				  .seed = head.seed,
				  .len = head.len,
				  .name = (uint8_t)name };
	c->st.imports++;
	share_expect(c, e, buf, buf + SHARE_MAX, "shared: import");
	if (out != NULL)
		*out = e;
	return 0;
}

/*
 * A held shared buffer used: a range read and checked, copied by a
 * kernel that takes it as buffer_in (or as a plain input, which a
 * built-in's inputs may be), read by a graph that then keeps it from its
 * release (GPUCMD_EBUSY), or shared again (GPUCMD_EINVAL: once is all).
 */
static void share_use(struct client *c, uint8_t *buf)
{
	struct held_share *e = held_pick(c);
	uint8_t *want = buf;
	uint32_t one[3] = { 1, 1, 1 };
	uint64_t dst, g;
	struct gpucmd_batch *b;
	struct gpucmd_response *r;
	size_t off, n;
	char nm[16];

	if (e == NULL)
		return;
	share_bytes(c, want, e->len, e->seed, e->name);
	off = rnd(c, e->len);
	n = 1 + rnd(c, (unsigned)(e->len - off));
	/* Under soak-tight's quota, nothing that allocates. */
	switch (c->conn == c->tight ? 4 * rnd(c, 2) : rnd(c, 5)) {
	case 0:
	case 1:
		b = new_batch(c, rnd(c, 4));
		gpucmd_batch_read(b, e->handle, off, n);
		r = run(c, b, "shared: range read");
		expect_bytes(c, r, 0, want + off, n, "shared: range read");
		gpucmd_response_free(r);
		c->st.shared_reads++;
		return;
	case 2: {
		/* A copy from offset 0: the kernel takes the buffer whole. */
		struct gpucmd_arg copy[3] = {
			{ .kind = GPUCMD_ARG_BUFFER, .v.handle = handle(c) },
			{ .kind = rnd(c, 4) ? GPUCMD_ARG_BUFFER_IN :
					      GPUCMD_ARG_BUFFER,
			  .v.handle = e->handle },
			{ .kind = GPUCMD_ARG_U64, .v.u64 = n },
		};

		dst = copy[0].v.handle;
		b = new_batch(c, rnd(c, 4));
		gpucmd_batch_empty(b, dst, n);
		gpucmd_batch_kernel(b, "copy", one, one, copy, 3);
		gpucmd_batch_read(b, dst, 0, n);
		gpucmd_batch_release(b, dst);
		r = run(c, b, "shared: kernel input");
		expect_bytes(c, r, 2, want, n, "shared: copied by a kernel");
		gpucmd_response_free(r);
		c->st.shared_reads++;
		return;
	}
	case 3: {
		struct gpucmd_arg copy[3] = {
			{ .kind = GPUCMD_ARG_BUFFER, .v.handle = handle(c) },
			{ .kind = GPUCMD_ARG_BUFFER_IN, .v.handle = e->handle },
			{ .kind = GPUCMD_ARG_U64, .v.u64 = n },
		};
		uint32_t s = rnd(c, 4);

		dst = copy[0].v.handle;
		g = next_id(c);
		b = new_batch(c, s);
		gpucmd_batch_empty(b, dst, n);
		gpucmd_batch_capture_begin(b);
		gpucmd_batch_kernel(b, "copy", one, one, copy, 3);
		gpucmd_batch_capture_end(b, g);
		gpucmd_batch_graph_launch(b, g);
		gpucmd_batch_read(b, dst, 0, n);
		r = run(c, b, "shared: graph");
		expect_bytes(c, r, 5, want, n, "shared: read by a graph");
		gpucmd_response_free(r);
		b = new_batch(c, rnd(c, 4));
		gpucmd_batch_release(b, e->handle);
		gpucmd_response_free(run_refused(c, b, 0, GPUCMD_EBUSY,
						 "shared: release under a "
						 "graph"));
		b = new_batch(c, s);
		gpucmd_batch_graph_destroy(b, g);
		gpucmd_batch_release(b, dst);
		gpucmd_response_free(run(c, b, "shared: graph destroyed"));
		c->st.shared_reads++;
		return;
	}
	default:
		share_name(nm, sizeof(nm), rnd(c, SHARE_NAMES));
		b = new_batch(c, rnd(c, 4));
		gpucmd_batch_share(b, e->handle, nm);
		gpucmd_response_free(run_refused(c, b, 0, GPUCMD_EINVAL,
						 "shared: shared again"));
		return;
	}
}

/*
 * Writes into a held shared buffer, each refused with GPUCMD_EINVAL: at
 * a random offset inline, through the scratch region, as a built-in's
 * output, or queued behind a read of it.  Then every byte is checked: as
 * the sharer wrote them.
 */
static void share_write(struct client *c, uint8_t *buf)
{
	struct held_share *e = held_pick(c);
	uint32_t one[3] = { 1, 1, 1 };
	struct gpucmd_batch *b;
	size_t off, n;
	int rc;

	if (e == NULL)
		return;
	off = rnd(c, e->len);
	n = 1 + rnd(c, (unsigned)(e->len - off));
	memset(buf, 0xa5, e->len);
	switch (rnd(c, 4)) {
	case 0:
		b = new_batch(c, rnd(c, 4));
		gpucmd_batch_write(b, e->handle, off, buf, n);
		gpucmd_response_free(
			run_refused(c, b, 0, GPUCMD_EINVAL, "shared: write"));
		break;
	case 1:
		/* Past GPUCMD_INLINE_MAX when the buffer is that long. */
		rc = gpucmd_write_buffer(c->conn, rnd(c, 4), e->handle, 0, buf,
					 e->len);
		if (rc != GPUCMD_EINVAL)
			fail_client(c,
				    "shared: write_buffer of %u bytes got %s "
				    "(%s), not GPUCMD_EINVAL",
				    e->len, gpucmd_errname(rc),
				    gpucmd_last_message(c->conn));
		break;
	case 2: {
		struct gpucmd_arg fill[3] = {
			{ .kind = GPUCMD_ARG_BUFFER, .v.handle = e->handle },
			{ .kind = GPUCMD_ARG_U32, .v.u32 = 0xdeadbeef },
			{ .kind = GPUCMD_ARG_U32, .v.u32 = e->len / 4 },
		};

		b = new_batch(c, rnd(c, 4));
		gpucmd_batch_kernel(b, "fill_u32", one, one, fill, 3);
		gpucmd_response_free(run_refused(c, b, 0, GPUCMD_EINVAL,
						 "shared: a kernel's output"));
		break;
	}
	default:
		b = new_batch(c, rnd(c, 4));
		gpucmd_batch_read(b, e->handle, off, n);
		gpucmd_batch_write(b, e->handle, off, buf, n);
		gpucmd_response_free(run_refused(c, b, 1, GPUCMD_EINVAL,
						 "shared: write after a read"));
		break;
	}
	c->st.refused_writes++;
	share_expect(c, e, buf, buf + SHARE_MAX,
		     "shared: after a refused write");
}

/*
 * A share whose copy waits behind a spin, and an import of its name from
 * the other connection while it waits: GPUCMD_EBUSY (or GPUCMD_ENOTFOUND
 * before the share is dispatched, or someone else's buffer of that name).
 * Once the share is answered, an import of the name must get its bytes.
 */
static void share_busy(struct client *c, uint8_t *buf,
		       struct gpucmd_conn *other)
{
	struct gpucmd_conn *sharer = c->conn;
	struct gpucmd_response *r = NULL;
	struct held_share p, *e = NULL;
	struct gpucmd_batch *b;
	uint64_t id;
	int at;

	share_room(c, buf);
	b = share_batch(c, buf, 2000 + rnd(c, 6000), &p, &at);
	if (gpucmd_submit(b, &id) != 0)
		fail_client(c, "shared: submit");
	c->conn = other;
	share_import(c, buf, p.name, NULL);
	c->conn = sharer;
	if (gpucmd_wait(sharer, id, &r) != 0)
		fail_client(c, "shared: wait for the share");
	if (!share_answer(c, &p, at, r))
		return;
	c->conn = other;
	if (share_import(c, buf, p.name, &e) != 0 || e->seed != p.seed)
		fail_client(c,
			    "shared: the import of soak/w%u after its share "
			    "was answered did not get it",
			    p.name);
	c->conn = sharer;
}

/*
 * Detached batches on c->conn, on random streams: releases of buffers
 * made in the same batch, spins, reads nobody reads, pings; and some due
 * to fail (a release of a handle not live: GPUCMD_ENOTFOUND; a write into
 * a shared buffer: GPUCMD_EINVAL; an allocation past the quota:
 * GPUCMD_EQUOTA).  Now and then the count is asked for, after a sync of
 * each stream they went to.
 */
static void work_detached(struct client *c, uint8_t *buf)
{
	uint64_t limit = gpucmd_info(c->conn)->memory_limit;
	uint32_t one[3] = { 1, 1, 1 };
	int n = 1 + (int)rnd(c, 40);

	for (int i = 0; i < n; i++) {
		uint32_t s = rnd(c, 4);
		struct gpucmd_batch *b = new_batch(c, s);
		struct held_share *e = held_pick(c);
		uint64_t h = handle(c);
		size_t len = 1 + rnd(c, 4096);
		struct gpucmd_arg spin = { .kind = GPUCMD_ARG_U32,
					   .v.u32 = 10 + rnd(c, 200) };

		switch (rnd(c, 8)) {
		case 0:
			gpucmd_batch_release(b, (1ull << 40) + h);
			detach(c, b, s, GPUCMD_ENOTFOUND);
			break;
		case 1:
			if (e == NULL) {
				gpucmd_batch_ping(b);
				detach(c, b, s, 0);
				break;
			}
			gpucmd_batch_write(b, e->handle, 0, buf,
					   len < e->len ? len : e->len);
			detach(c, b, s, GPUCMD_EINVAL);
			break;
		case 2:
			if (limit == 0) {
				gpucmd_batch_kernel(b, "spin", one, one, &spin,
						    1);
				detach(c, b, s, 0);
				break;
			}
			gpucmd_batch_empty(b, h, limit + 1);
			detach(c, b, s, GPUCMD_EQUOTA);
			break;
		case 3:
			gpucmd_batch_kernel(b, "spin", one, one, &spin, 1);
			detach(c, b, s, 0);
			break;
		case 4:
			/* An answer with data that nobody reads. */
			gpucmd_batch_create_with_data(b, h, buf, len);
			gpucmd_batch_read(b, h, 0, len);
			gpucmd_batch_release(b, h);
			detach(c, b, s, 0);
			break;
		default:
			gpucmd_batch_create_with_data(b, h, buf, len);
			gpucmd_batch_write(b, h, 0, buf + 1, len - 1);
			gpucmd_batch_release(b, h);
			detach(c, b, s, 0);
			break;
		}
	}
	if (rnd(c, 2))
		detached_check(c, "detached");
}

/* work_detached on one of the client's connections. */
static void work_detached_on(struct client *c, uint8_t *buf)
{
	struct gpucmd_conn *main_conn = c->conn;

	if (c->peer != NULL && rnd(c, 2))
		c->conn = c->peer;
	work_detached(c, buf);
	c->conn = main_conn;
}

static void share_move(struct client *c, uint8_t *buf,
		       struct gpucmd_conn *other);

/* One of the shared-buffer moves, on one of the client's two connections. */
static void work_shared(struct client *c, uint8_t *buf)
{
	struct gpucmd_conn *main_conn = c->conn, *other;
	char service[32];

	if (c->peer == NULL) {
		snprintf(service, sizeof(service), "soak-%d",
			 c->index % NSERVICES);
		c->peer = connect_service(c, service);
	}
	if (rnd(c, 2))
		c->conn = c->peer;
	other = c->conn == c->peer ? main_conn : c->peer;
	share_move(c, buf, other);
	c->conn = main_conn;
}

/*
 * One move of the shared buffers on c->conn; with other (another
 * connection of its service), a share that an import from it races.
 */
static void share_move(struct client *c, uint8_t *buf,
		       struct gpucmd_conn *other)
{
	struct held_share *e;

	switch (rnd(c, other != NULL ? 10 : 9)) {
	case 0:
	case 1:
		share_one(c, buf);
		break;
	case 2:
	case 3:
		share_import(c, buf, rnd(c, SHARE_NAMES), NULL);
		break;
	case 4:
	case 5:
		share_use(c, buf);
		break;
	case 6:
		share_write(c, buf);
		break;
	case 9:
		share_busy(c, buf, other);
		break;
	default:
		e = held_pick(c);
		if (e != NULL)
			share_release(c, e, buf);
		break;
	}
}

/*
 * The helper of work_killed: a connection of its own that sends batches
 * as fast as it can, some with a megabyte of data in them, with a region
 * (attached before or after it says it is ready), graphs, module loads
 * and spins, until it is killed.  Whatever it reads back is checked, and
 * every batch it waits for must end as it should.
 */
static void killed_main(struct client *parent, uint8_t *buf, int ready)
{
	struct client c = { .index = parent->index,
			    .seed = parent->seed * 31 + 7,
			    .share_seed = (uint32_t)getpid() << 16,
			    .helper = true };
	uint32_t one[3] = { 1, 1, 1 };
	uint64_t ids[8], region = 0, cid;
	int codes[8], nids = 0;
	bool early = false;
	uint8_t *p = NULL;

	connect_client(&c);
	cid = gpucmd_info(c.conn)->connection_id;
	if (rnd(&c, 2)) {
		early = rnd(&c, 2);
		if (early && write(ready, &cid, sizeof(cid)) != sizeof(cid))
			_exit(1);
		region = next_id(&c);
		if (gpucmd_region_create(c.conn, region, MIB, (void **)&p) != 0)
			fail_client(&c, "killed helper: region_create");
	}
	if (!early && write(ready, &cid, sizeof(cid)) != sizeof(cid))
		fail_client(&c, "killed helper: write: %s", strerror(errno));
	for (;;) {
		struct gpucmd_batch *b = new_batch(&c, rnd(&c, 4));
		size_t len = 1 + rnd(&c, MIB);
		uint64_t h = handle(&c), g;
		struct gpucmd_arg spin = { .kind = GPUCMD_ARG_U32,
					   .v.u32 = 50 + rnd(&c, 500) };
		struct gpucmd_arg fill[3] = {
			{ .kind = GPUCMD_ARG_BUFFER, .v.handle = h },
			{ .kind = GPUCMD_ARG_U32, .v.u32 = (uint32_t)h },
			{ .kind = GPUCMD_ARG_U32, .v.u32 = 1 + rnd(&c, 1024) },
		};
		struct gpucmd_response *r = NULL;

		codes[nids] = 0;
		switch (rnd(&c, 5)) {
		case 0:
			/* A graph of one fill, replayed and destroyed. */
			g = next_id(&c);
			gpucmd_batch_empty(b, h, 4096);
			gpucmd_batch_capture_begin(b);
			gpucmd_batch_kernel(b, "fill_u32", one, one, fill, 3);
			gpucmd_batch_capture_end(b, g);
			gpucmd_batch_graph_launch(b, g);
			if (rnd(&c, 2))
				gpucmd_batch_graph_destroy(b, g);
			break;
		case 1:
			gpucmd_batch_load_module(b, next_id(&c), "ptx",
						 add_one_ptx,
						 strlen(add_one_ptx));
			if (!c.cuda)
				codes[nids] = GPUCMD_EUNSUPPORTED;
			break;
		case 2:
			/* Shares and imports, held when it is killed. */
			gpucmd_batch_free(b);
			if (rnd(&c, 2))
				share_one(&c, buf);
			else
				share_import(&c, buf, rnd(&c, SHARE_NAMES),
					     NULL);
			continue;
		default:
			pattern(buf, len, (unsigned)h);
			gpucmd_batch_create_with_data(b, h, buf, len);
			if (p != NULL) {
				gpucmd_batch_write_region(b, h, 0, region, 0,
							  len);
				gpucmd_batch_read_region(b, h, 0, len, region,
							 0);
			}
			if (rnd(&c, 4) == 0)
				gpucmd_batch_kernel(b, "spin", one, one, &spin,
						    1);
			if (rnd(&c, 8) == 0) {
				/* Read back now, and checked. */
				if (p != NULL)
					memcpy(buf, p, len);
				gpucmd_batch_read(b, h, 0, len);
				r = run(&c, b, "killed helper: read");
				expect_bytes(&c, r,
					     gpucmd_response_count(r) - 1, buf,
					     len, "killed helper: read");
				gpucmd_response_free(r);
				continue;
			}
			if (rnd(&c, 2))
				gpucmd_batch_release(b, h);
			if (rnd(&c, 4) == 0) {
				/* Nobody waits for it. */
				if (gpucmd_submit_detached(b) != 0)
					fail_client(&c, "killed helper: "
							"submit_detached");
				continue;
			}
			break;
		}
		if (gpucmd_submit(b, &ids[nids++]) != 0)
			fail_client(&c, "killed helper: submit");
		if (nids == (int)max_in_flight(&c, 8) || rnd(&c, 4) == 0) {
			if (gpucmd_wait(c.conn, ids[0], &r) != 0)
				fail_client(&c, "killed helper: wait");
			if (gpucmd_response_error(r) != codes[0])
				fail_client(&c,
					    "killed helper: a batch got %s "
					    "(%s), not %s",
					    gpucmd_errname(
						    gpucmd_response_error(r)),
					    gpucmd_response_message(r),
					    gpucmd_errname(codes[0]));
			gpucmd_response_free(r);
			nids--;
			memmove(ids, ids + 1, sizeof(ids[0]) * nids);
			memmove(codes, codes + 1, sizeof(codes[0]) * nids);
		}
	}
}

/*
 * A process with a connection of its own killed with SIGKILL at a random
 * point of its work: between frames, in the middle of one, with batches
 * queued and regions mapped.  The daemon must clean up as for a hang-up.
 * One time in three the connection is evicted instead (gpucmd_evict, by a
 * connection of the same service): the helper must find out within 20 s
 * and leave, and the daemon clean up as well.
 */
static void work_killed(struct client *c, uint8_t *buf)
{
	unsigned delay_us = rnd(c, 20000);
	bool evict = rnd(c, 3) == 0;
	int status = 0, ready[2], rc;
	uint64_t cid, count = 0;
	pid_t pid;

	c->seed++;
	if (pipe2(ready, O_CLOEXEC) != 0)
		fail_client(c, "pipe: %s", strerror(errno));
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		fail_client(c, "fork: %s", strerror(errno));
	if (pid == 0) {
		close(ready[0]);
		killed_main(c, buf, ready[1]);
	}
	close(ready[1]);
	/* Connected (or failed, and then the status says so), then ended. */
	if (read(ready[0], &cid, sizeof(cid)) != sizeof(cid))
		evict = false;
	else
		usleep(delay_us);
	close(ready[0]);
	if (evict) {
		rc = gpucmd_evict(c->conn, NULL, cid, &count);
		if (rc != 0 || count != 1)
			fail_client(c,
				    "evicting connection %llu: %s (%s), %llu "
				    "ended",
				    (unsigned long long)cid, gpucmd_errname(rc),
				    gpucmd_last_message(c->conn),
				    (unsigned long long)count);
		for (int i = 0; i < 2000; i++) {
			if (waitpid(pid, &status, WNOHANG) == pid)
				break;
			usleep(10000);
		}
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 3) {
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
			fail_client(c,
				    "the helper evicted did not leave quietly "
				    "within 20 s (status 0x%x)",
				    status);
		}
		c->evictions++;
		return;
	}
	kill(pid, SIGKILL);
	if (waitpid(pid, &status, 0) != pid)
		fail_client(c, "waitpid: %s", strerror(errno));
	if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL)
		fail_client(c, "the helper to kill ended first (status 0x%x)",
			    status);
	c->kills++;
}

/*
 * Under a quota the clients go past together: batches of soak-tight on
 * several streams at once, each allocating up to 1 MiB, filling part of
 * it, reading it back and releasing it.  GPUCMD_EQUOTA at the allocation
 * is a fair answer; anything else must be a success, every byte right.
 */
/*
 * A region of soak-tight, whose region_limit (as its memory_limit) the
 * clients go past together: GPUCMD_EQUOTA at the attach is an answer;
 * an attached region must carry its bytes to the device and back.
 */
static void tight_region(struct client *c, uint8_t *buf)
{
	size_t size = 2 + rnd(c, 3 * MIB / 2), half = size / 2;
	uint64_t id = next_id(c), h = handle(c);
	struct gpucmd_batch *b;
	struct gpucmd_response *r = NULL;
	uint8_t *p = NULL;
	int rc;

	rc = gpucmd_region_create(c->conn, id, size, (void **)&p);
	if (rc == GPUCMD_EQUOTA)
		return;
	if (rc != 0)
		fail_client(c, "tight: region_create of %zu bytes: %s (%s)",
			    size, gpucmd_errname(rc),
			    gpucmd_last_message(c->conn));
	pattern(p, half, (unsigned)id * 3);
	memcpy(buf, p, half);
	b = new_batch(c, rnd(c, 4));
	gpucmd_batch_create_region(b, h, id, 0, half);
	gpucmd_batch_read_region(b, h, 0, half, id, half);
	gpucmd_batch_release(b, h);
	if (gpucmd_run(b, &r) != 0)
		fail_client(c, "tight: region batch: run");
	c->batches++;
	rc = gpucmd_response_error(r);
	if (rc != 0 &&
	    !(rc == GPUCMD_EQUOTA && gpucmd_response_failed_index(r) == 0))
		fail_client(c, "tight: region batch op %d: %s (%s)",
			    gpucmd_response_failed_index(r), gpucmd_errname(rc),
			    gpucmd_response_message(r));
	gpucmd_response_free(r);
	if (rc == 0)
		for (size_t k = 0; k < half; k++)
			if (p[half + k] != buf[k])
				fail_client(c,
					    "tight: region byte %zu is "
					    "0x%02x, expected 0x%02x",
					    k, p[half + k], buf[k]);
	rc = gpucmd_region_release(c->conn, id);
	if (rc != 0)
		fail_client(c, "tight: region_release: %s", gpucmd_errname(rc));
}

static void work_tight(struct client *c, uint8_t *buf)
{
	uint32_t block[3] = { 64, 1, 1 }, grid[3] = { 16, 1, 1 };
	struct gpucmd_conn *main_conn = c->conn;
	uint64_t ids[4], hs[4];
	size_t lens[4];
	uint32_t counts[4], values[4];
	int nb = 1 + (int)rnd(c, max_in_flight(c, 4));

	if (c->tight == NULL)
		c->tight = connect_service(c, "soak-tight");
	c->conn = c->tight;
	if (rnd(c, 2))
		tight_region(c, buf);
	/*
	 * Every client shares under soak-tight's names: imports cross
	 * processes there, and a share may go past the quota.
	 */
	if (rnd(c, 2))
		share_move(c, buf, NULL);
	for (int i = 0; i < nb; i++) {
		struct gpucmd_batch *b = new_batch(c, (uint32_t)i);
		struct gpucmd_arg args[3] = {
			{ .kind = GPUCMD_ARG_BUFFER },
			{ .kind = GPUCMD_ARG_U32 },
			{ .kind = GPUCMD_ARG_U32 },
		};

		hs[i] = handle(c);
		lens[i] = 1 + rnd(c, MIB);
		counts[i] = (uint32_t)rnd(c, (unsigned)(lens[i] / 4 + 1));
		values[i] = (uint32_t)rand_r(&c->seed);
		args[0].v.handle = hs[i];
		args[1].v.u32 = values[i];
		args[2].v.u32 = counts[i];
		pattern(buf, lens[i], (unsigned)hs[i]);
		gpucmd_batch_create_with_data(b, hs[i], buf, lens[i]);
		gpucmd_batch_kernel(b, "fill_u32", grid, block, args, 3);
		gpucmd_batch_read(b, hs[i], 0, lens[i]);
		gpucmd_batch_release(b, hs[i]);
		if (gpucmd_submit(b, &ids[i]) != 0)
			fail_client(c, "tight: submit");
	}
	for (int i = 0; i < nb; i++) {
		struct gpucmd_response *r = NULL;
		int rc;

		if (gpucmd_wait(c->conn, ids[i], &r) != 0)
			fail_client(c, "tight: wait");
		rc = gpucmd_response_error(r);
		c->batches++;
		if (rc == GPUCMD_EQUOTA &&
		    gpucmd_response_failed_index(r) == 0) {
			gpucmd_response_free(r);
			continue;
		}
		if (rc != 0)
			fail_client(c, "tight: op %d of %zu bytes got %s (%s)",
				    gpucmd_response_failed_index(r), lens[i],
				    gpucmd_errname(rc),
				    gpucmd_response_message(r));
		pattern(buf, lens[i], (unsigned)hs[i]);
		for (uint32_t k = 0; k < counts[i]; k++)
			memcpy(buf + (size_t)k * 4, &values[i], 4);
		expect_bytes(c, r, 2, buf, lens[i], "tight: fill under quota");
		gpucmd_response_free(r);
	}
	c->conn = main_conn;
}

static void client_main(int index, uint64_t until_ms)
{
	struct client c = { .index = index,
			    .seed = opt.seed * 7919 + index,
			    .share_seed = (uint32_t)index << 24 };
	uint8_t *buf = malloc(BUF_BYTES);

	if (buf == NULL)
		fail_client(&c, "out of memory");
	connect_client(&c);
	while (now_ms() < until_ms) {
		unsigned w = rnd(&c, 115);

		if (w < 15)
			work_roundtrip(&c, buf);
		else if (w < 20)
			work_tight(&c, buf);
		else if (w < 28)
			work_fill(&c, buf);
		else if (w < 40)
			work_cross_stream(&c, buf);
		else if (w < 49)
			work_writes(&c, buf);
		else if (w < 53 && !c.cuda)
			work_fault(&c, buf);
		else if (w < 53)
			work_roundtrip(&c, buf);
		else if (w < 58)
			work_reports(&c);
		else if (w < 61)
			work_hangup(&c, buf);
		else if (w < 64)
			work_spin(&c);
		else if (w < 73)
			work_region(&c, buf);
		else if (w < 76)
			work_scratch(&c, buf);
		else if (w < 85)
			work_graph(&c, buf);
		else if (w < 90)
			work_module(&c, buf);
		else if (w < 97)
			work_quota(&c, buf);
		else if (w < 100)
			work_killed(&c, buf);
		else if (w < 110)
			work_shared(&c, buf);
		else
			work_detached_on(&c, buf);
	}
	/* Every detached failure due is counted before the close. */
	detached_check(&c, "detached at the end");
	if (c.peer != NULL) {
		struct gpucmd_conn *main_conn = c.conn;

		c.conn = c.peer;
		detached_check(&c, "detached at the end (second connection)");
		c.conn = main_conn;
		gpucmd_close(c.peer);
	}
	gpucmd_close(c.conn);
	if (c.tight != NULL)
		gpucmd_close(c.tight);
	free(buf);
	stats[index] = c.st;
	if (!opt.quiet)
		printf("soak: client %d: %llu batches, %llu ops, %llu helpers "
		       "killed, %llu evicted, %llu shares (%llu EEXIST), "
		       "%llu imports (%llu ENOTFOUND, %llu EBUSY), %llu "
		       "writes refused, %llu detached (%llu failed), all "
		       "verified\n",
		       index, (unsigned long long)c.batches,
		       (unsigned long long)c.ops, (unsigned long long)c.kills,
		       (unsigned long long)c.evictions,
		       (unsigned long long)c.st.shares,
		       (unsigned long long)c.st.share_eexist,
		       (unsigned long long)c.st.imports,
		       (unsigned long long)c.st.import_enotfound,
		       (unsigned long long)c.st.import_ebusy,
		       (unsigned long long)c.st.refused_writes,
		       (unsigned long long)c.st.detached,
		       (unsigned long long)c.st.detached_failed);
	fflush(stdout);
	_exit(0);
}

/* ---- the daemon ------------------------------------------------------------ */

/*
 * The services the clients use, with quotas well above what the mix holds
 * at once (work_quota goes past them on purpose), and one without; then
 * soak-tight, whose quota write_config sets.
 */
static const char soak_conf[] = "[service soak-0]\n"
				"memory_limit = 256M\n"
				"region_limit = 128M\n"
				"[service soak-1]\n"
				"memory_limit = 192M\n"
				"region_limit = 96M\n"
				"max_modules = 16\n"
				"[service soak-2]\n"
				"memory_limit = 160M\n"
				"[service soak-3]\n";

/*
 * Write the daemon's config with soak-tight's quota at tight_mib MiB:
 * into a file beside it, renamed over it, so that a reload never reads
 * half of it.
 */
static void write_config(const char *path, unsigned tight_mib)
{
	char tmp[160];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.new", path);
	f = fopen(tmp, "we");
	if (f == NULL || fputs(soak_conf, f) == EOF ||
	    fprintf(f,
		    "[service soak-tight]\nmemory_limit = %uM\n"
		    "region_limit = %uM\n",
		    tight_mib, tight_mib) < 0 ||
	    fclose(f) != 0 || rename(tmp, path) != 0) {
		fprintf(stderr, "soak: cannot write %s: %s\n", path,
			strerror(errno));
		exit(1);
	}
}

static pid_t start_daemon(void)
{
	pid_t pid;
	char log[128], conf[128];

	snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/gpucmd-soak-XXXXXX");
	if (mkdtemp(tmp_dir) == NULL) {
		perror("mkdtemp");
		exit(1);
	}
	snprintf(sock_path, sizeof(sock_path), "%s/s.sock", tmp_dir);
	snprintf(log, sizeof(log), "%s/daemon.log", tmp_dir);
	snprintf(conf, sizeof(conf), "%s/gpucmdd.conf", tmp_dir);
	write_config(conf, 2);
	pid = fork();
	if (pid < 0) {
		perror("fork");
		exit(1);
	}
	if (pid == 0) {
		FILE *f = freopen(log, "w", stderr);

		(void)f;
		execl(opt.daemon, opt.daemon, "--socket", sock_path,
		      "--backend", opt.backend, "--log-level", "notice",
		      "--config", conf, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 2000; i++) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), rc;

		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
		rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
		close(fd);
		if (rc == 0)
			return pid;
		if (waitpid(pid, NULL, WNOHANG) == pid) {
			fprintf(stderr, "soak: %s exited at start; see %s\n",
				opt.daemon, log);
			exit(1);
		}
		usleep(10000);
	}
	fprintf(stderr, "soak: the daemon did not listen within 20 s\n");
	kill(pid, SIGKILL);
	exit(1);
}

static pid_t peer_pid(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct ucred cred;
	socklen_t len = sizeof(cred);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
		fprintf(stderr, "soak: cannot reach the daemon on %s\n",
			sock_path);
		exit(1);
	}
	close(fd);
	return cred.pid;
}

static long rss_kb(pid_t pid)
{
	char path[64], line[256];
	long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, "VmRSS:", 6) == 0)
			v = strtol(line + 6, NULL, 10);
	fclose(f);
	return v;
}

static int fd_count(pid_t pid)
{
	char path[64];
	struct dirent *e;
	int n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (d == NULL)
		return -1;
	while ((e = readdir(d)) != NULL)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/*
 * Whether every service of rep holds nothing, and only the checking
 * connection is open; when say, what is still held goes to stderr.
 */
static bool report_is_zero(const struct gpucmd_report *rep, bool say)
{
	bool zero = rep->totals.connections == 1;

	if (!zero && say)
		fprintf(stderr, "soak: at the end %u connections are open\n",
			rep->totals.connections);
	for (size_t i = 0; i < rep->nservices; i++) {
		const struct gpucmd_service_report *s = &rep->services[i];

		if (s->bytes_in_use == 0 && s->allocations == 0 &&
		    s->bytes_reserved == 0 && s->regions == 0 &&
		    s->region_bytes == 0 && s->modules == 0 &&
		    s->module_bytes == 0 && s->bytes_released_pending == 0 &&
		    s->shared_buffers == 0 && s->shared_buffer_bytes == 0 &&
		    s->nshared == 0)
			continue;
		zero = false;
		if (say)
			fprintf(stderr,
				"soak: at the end service %s holds %llu "
				"bytes in %llu allocations (%llu released, "
				"pending; %llu reserved), %u regions of %llu "
				"bytes, %u modules with %llu bytes of "
				"globals, %u shared buffers of %llu bytes "
				"(%zu listed)\n",
				s->name, (unsigned long long)s->bytes_in_use,
				(unsigned long long)s->allocations,
				(unsigned long long)s->bytes_released_pending,
				(unsigned long long)s->bytes_reserved,
				s->regions, (unsigned long long)s->region_bytes,
				s->modules, (unsigned long long)s->module_bytes,
				s->shared_buffers,
				(unsigned long long)s->shared_buffer_bytes,
				s->nshared);
		for (size_t k = 0; say && k < s->nshared; k++)
			fprintf(stderr,
				"soak:   shared as %s: %llu bytes, %u handles, "
				"shared by connection %llu (%s), ready %d, "
				"lost %d\n",
				s->shared[k].name,
				(unsigned long long)s->shared[k].bytes,
				s->shared[k].handles,
				(unsigned long long)s->shared[k].connection_id,
				s->shared[k].sharer_open ? "open" : "gone",
				s->shared[k].ready, s->shared[k].lost);
	}
	return zero && rep->totals.bytes_in_use == 0 &&
	       rep->totals.allocations == 0 && rep->totals.regions == 0 &&
	       rep->totals.shared_buffers == 0 &&
	       rep->totals.shared_buffer_bytes == 0;
}

/*
 * An observer's connection that asks for the daemon's status beside each
 * sample of its RSS: a daemon that does not answer within 20 s is wedged.
 */
static struct gpucmd_conn *monitor_open(void)
{
	struct gpucmd_conn *c = NULL;
	char msg[256] = "";
	int rc;

	rc = gpucmd_connect_flags(sock_path, "", 20000, GPUCMD_CONNECT_OBSERVE,
				  &c, msg, sizeof(msg));
	if (rc != 0) {
		fprintf(stderr,
			"soak: cannot connect to watch the daemon: %s "
			"(%s)\n",
			gpucmd_strerror(rc), msg);
		return NULL;
	}
	return c;
}

/* Whether the daemon answers a status on mon. */
static bool answers(struct gpucmd_conn *mon)
{
	struct gpucmd_status st;
	int rc = gpucmd_status(mon, &st);

	if (rc != 0)
		fprintf(stderr,
			"soak: the daemon did not answer a status: %s\n",
			gpucmd_strerror(rc));
	return rc == 0;
}

/*
 * An admin's cleanup of one of the clients' services (they take turns
 * with k): whatever it frees must be free, which the clients' checked
 * reads would show.  Whether it was answered.
 */
/* What the admin's cleanups gave back, all told. */
static uint64_t cleaned_bytes;

static bool cleanup(struct gpucmd_conn *mon, size_t k)
{
	char service[32];
	uint64_t bytes = 0;
	int rc;

	if (k % (NSERVICES + 1) == NSERVICES)
		snprintf(service, sizeof(service), "soak-tight");
	else
		snprintf(service, sizeof(service), "soak-%zu",
			 k % (NSERVICES + 1));
	rc = gpucmd_cleanup(mon, service, &bytes);
	if (rc == 0)
		cleaned_bytes += bytes;
	if (rc != 0 && rc != GPUCMD_ENOTFOUND)
		fprintf(stderr, "soak: cleanup of %s: %s (%s)\n", service,
			gpucmd_errname(rc), gpucmd_last_message(mon));
	return rc == 0 || rc == GPUCMD_ENOTFOUND;
}

/*
 * Whether name is one the clients share under: soak/w0 to soak/w2, or a
 * client's soak/f<index>, which work_fault loses on purpose (lost then
 * true is fine).
 */
static bool soak_share_name(const char *name, bool lost)
{
	char *end;
	long k;

	if (strncmp(name, "soak/w", 6) == 0)
		return !lost && name[6] >= '0' && name[6] < '0' + SHARE_NAMES &&
		       name[7] == 0;
	if (strncmp(name, "soak/f", 6) != 0 || name[6] < '0' || name[6] > '9')
		return false;
	k = strtol(name + 6, &end, 10);
	return *end == 0 && k >= 0 && k < (long)opt.clients;
}

/*
 * The shared buffers the memory report lists while the clients work:
 * only the soak's names in the clients' services and soak-tight, as many
 * as the names at most, of the bytes the count says, and counted in the
 * service's bytes in use.  Whether they are; what is wrong goes to stderr.
 */
static bool shared_sane(struct gpucmd_conn *mon)
{
	struct gpucmd_report *rep = NULL;
	bool ok = true;
	int rc = gpucmd_memory_report(mon, &rep);

	if (rc != 0) {
		fprintf(stderr, "soak: the observer's memory report: %s\n",
			gpucmd_errname(rc));
		return false;
	}
	for (size_t i = 0; i < rep->nservices && ok; i++) {
		const struct gpucmd_service_report *s = &rep->services[i];
		bool client = strncmp(s->name, "soak-", 5) == 0 &&
			      s->name[5] >= '0' &&
			      s->name[5] < '0' + NSERVICES && s->name[6] == 0;
		bool tight = strcmp(s->name, "soak-tight") == 0;
		uint32_t most = client ? SHARE_NAMES + opt.clients :
				tight  ? SHARE_NAMES :
					 0;
		uint64_t bytes = 0;

		for (size_t k = 0; k < s->nshared; k++) {
			bytes += s->shared[k].bytes;
			if (!soak_share_name(s->shared[k].name,
					     s->shared[k].lost) ||
			    (tight && s->shared[k].name[5] != 'w') ||
			    s->shared[k].handles == 0)
				ok = false;
		}
		if (s->nshared != s->shared_buffers ||
		    s->shared_buffers > most ||
		    bytes != s->shared_buffer_bytes ||
		    s->shared_buffer_bytes > s->bytes_in_use)
			ok = false;
		if (ok)
			continue;
		fprintf(stderr,
			"soak: service %s reports %u shared buffers (%zu "
			"listed) of %llu bytes (%llu listed), %llu bytes in "
			"use\n",
			s->name, s->shared_buffers, s->nshared,
			(unsigned long long)s->shared_buffer_bytes,
			(unsigned long long)bytes,
			(unsigned long long)s->bytes_in_use);
		for (size_t k = 0; k < s->nshared; k++)
			fprintf(stderr,
				"soak:   '%s': %llu bytes, %u handles, "
				"ready %d, lost %d\n",
				s->shared[k].name,
				(unsigned long long)s->shared[k].bytes,
				s->shared[k].handles, s->shared[k].ready,
				s->shared[k].lost);
	}
	gpucmd_report_free(rep);
	return ok;
}

/* ---- main ------------------------------------------------------------------ */

static void usage(FILE *out)
{
	fprintf(out,
		"usage: soak [--daemon PATH | --socket PATH] [--seconds N] "
		"[--clients K]\n"
		"            [--backend NAME] [--seed S] [--rss-slack MiB] "
		"[--fd-slack N] [--quiet]\n");
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "daemon", required_argument, NULL, 'd' },
		{ "socket", required_argument, NULL, 's' },
		{ "seconds", required_argument, NULL, 't' },
		{ "clients", required_argument, NULL, 'c' },
		{ "backend", required_argument, NULL, 'b' },
		{ "seed", required_argument, NULL, 'r' },
		{ "rss-slack", required_argument, NULL, 'R' },
		{ "fd-slack", required_argument, NULL, 'F' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static long rss[MAX_SAMPLES];
	static int fds[MAX_SAMPLES];
	static pid_t kids[MAX_CLIENTS];
	char default_daemon[256];
	const char *build = getenv("BUILD");
	struct gpucmd_conn *mon;
	bool own = false, failed = false;
	size_t n = 0;
	pid_t daemon;
	uint64_t until;
	int ch;

	snprintf(default_daemon, sizeof(default_daemon), "%s/gpucmdd",
		 build != NULL && build[0] ? build : "build");
	while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (ch) {
		case 'd':
			opt.daemon = optarg;
			break;
		case 's':
			opt.socket = optarg;
			break;
		case 't':
			opt.seconds = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'c':
			opt.clients = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'b':
			opt.backend = optarg;
			break;
		case 'r':
			opt.seed = (unsigned)strtoul(optarg, NULL, 10);
			break;
		case 'R':
			opt.rss_slack_kb = strtol(optarg, NULL, 10) * 1024;
			break;
		case 'F':
			opt.fd_slack = (int)strtol(optarg, NULL, 10);
			break;
		case 'q':
			opt.quiet = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (opt.clients < 1 || opt.clients > MAX_CLIENTS || opt.seconds < 4) {
		fprintf(stderr,
			"soak: 1 to %d clients and at least 4 seconds\n",
			MAX_CLIENTS);
		return 2;
	}
	if (opt.socket == NULL) {
		struct stat st;

		if (opt.daemon == NULL)
			opt.daemon = default_daemon;
		if (stat(opt.daemon, &st) != 0) {
			printf("soak: skipped: %s is not built\n", opt.daemon);
			return 77;
		}
		daemon = start_daemon();
		own = true;
	} else {
		snprintf(sock_path, sizeof(sock_path), "%s", opt.socket);
		daemon = peer_pid();
	}
	signal(SIGPIPE, SIG_IGN);
	printf("soak: %u clients for %u s against gpucmdd pid %d\n",
	       opt.clients, opt.seconds, (int)daemon);
	fflush(stdout);

	stats = mmap(NULL, sizeof(*stats) * MAX_CLIENTS, PROT_READ | PROT_WRITE,
		     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (stats == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	until = now_ms() + (uint64_t)opt.seconds * 1000;
	for (unsigned i = 0; i < opt.clients; i++) {
		kids[i] = fork();
		if (kids[i] < 0) {
			perror("fork");
			return 1;
		}
		if (kids[i] == 0)
			client_main((int)i, until);
	}
	mon = monitor_open();
	failed = mon == NULL;
	while (!failed && now_ms() < until && n < MAX_SAMPLES) {
		rss[n] = rss_kb(daemon);
		fds[n] = fd_count(daemon);
		if (rss[n] < 0 || fds[n] < 0) {
			fprintf(stderr, "soak: the daemon (pid %d) is gone\n",
				(int)daemon);
			failed = true;
			break;
		}
		if (!answers(mon) || !shared_sane(mon)) {
			failed = true;
			break;
		}
		/*
		 * Each sample, an admin's cleanup gives a service's free
		 * memory back to the device under its clients' feet.
		 */
		if (!cleanup(mon, n)) {
			failed = true;
			break;
		}
		/*
		 * Every 4 s a reload (SIGHUP) moves soak-tight's quota
		 * between 1 and 2 MiB under the clients' feet.
		 */
		if (own && n % 16 == 15) {
			char conf[128];

			snprintf(conf, sizeof(conf), "%s/gpucmdd.conf",
				 tmp_dir);
			write_config(conf, n % 32 == 15 ? 1 : 2);
			kill(daemon, SIGHUP);
		}
		n++;
		usleep(250000);
	}
	if (mon != NULL)
		gpucmd_close(mon);
	if (!opt.quiet)
		printf("soak: the admin's cleanups gave back %llu bytes\n",
		       (unsigned long long)cleaned_bytes);
	for (unsigned i = 0; i < opt.clients; i++) {
		int status;

		waitpid(kids[i], &status, 0);
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			fprintf(stderr,
				"soak: client %u failed (status 0x%x)\n", i,
				status);
			failed = true;
		}
	}

	/*
	 * What the clients did with shared buffers and detached batches, all
	 * told: a soak where none were shared, imported, refused a write or
	 * failed detached tested none of it.
	 */
	if (!failed) {
		struct soak_stats t = { 0 };

		for (unsigned i = 0; i < opt.clients; i++) {
			t.shares += stats[i].shares;
			t.share_eexist += stats[i].share_eexist;
			t.share_equota += stats[i].share_equota;
			t.lost += stats[i].lost;
			t.imports += stats[i].imports;
			t.import_enotfound += stats[i].import_enotfound;
			t.import_ebusy += stats[i].import_ebusy;
			t.shared_reads += stats[i].shared_reads;
			t.refused_writes += stats[i].refused_writes;
			t.detached += stats[i].detached;
			t.detached_failed += stats[i].detached_failed;
		}
		printf("soak: %llu buffers shared (%llu EEXIST, %llu EQUOTA, "
		       "%llu lost to a fault), %llu imports "
		       "(%llu ENOTFOUND, %llu EBUSY), %llu shared reads "
		       "checked, %llu writes refused; %llu batches detached, "
		       "%llu failed as due\n",
		       (unsigned long long)t.shares,
		       (unsigned long long)t.share_eexist,
		       (unsigned long long)t.share_equota,
		       (unsigned long long)t.lost,
		       (unsigned long long)t.imports,
		       (unsigned long long)t.import_enotfound,
		       (unsigned long long)t.import_ebusy,
		       (unsigned long long)t.shared_reads,
		       (unsigned long long)t.refused_writes,
		       (unsigned long long)t.detached,
		       (unsigned long long)t.detached_failed);
		if (opt.seconds >= 10 &&
		    (t.shares == 0 || t.imports == 0 || t.refused_writes == 0 ||
		     t.detached_failed == 0)) {
			fprintf(stderr, "soak: the shared buffers and detached "
					"batches were not all exercised\n");
			failed = true;
		}
	}

	/* Growth: the last quarter's peak against the first quarter's. */
	if (!failed && n >= 8) {
		long rss_first = 0, rss_last = 0;
		int fd_first = 0, fd_last = 0;

		for (size_t i = 0; i < n / 4; i++) {
			if (rss[i] > rss_first)
				rss_first = rss[i];
			if (fds[i] > fd_first)
				fd_first = fds[i];
		}
		for (size_t i = n - n / 4; i < n; i++) {
			if (rss[i] > rss_last)
				rss_last = rss[i];
			if (fds[i] > fd_last)
				fd_last = fds[i];
		}
		printf("soak: daemon RSS peak %ld KiB in the first quarter, %ld "
		       "KiB in the last; descriptors %d and %d (%zu samples)\n",
		       rss_first, rss_last, fd_first, fd_last, n);
		if (rss_last > rss_first + opt.rss_slack_kb) {
			fprintf(stderr,
				"soak: the daemon's RSS grew by %ld KiB "
				"(allowed %ld)\n",
				rss_last - rss_first, opt.rss_slack_kb);
			failed = true;
		}
		if (fd_last > fd_first + opt.fd_slack) {
			fprintf(stderr,
				"soak: the daemon's descriptors grew "
				"from %d to %d\n",
				fd_first, fd_last);
			failed = true;
		}
	}

	/* Every client is gone: nothing may be held any more. */
	if (!failed) {
		struct gpucmd_conn *c = NULL;
		struct gpucmd_report *rep = NULL;
		char msg[256];
		bool zero = false;

		if (gpucmd_connect(sock_path, "soak-check", &c, msg,
				   sizeof(msg)) != 0) {
			fprintf(stderr, "soak: cannot connect at the end: %s\n",
				msg);
			failed = true;
		}
		for (int i = 0; c != NULL && i < 500 && !zero; i++) {
			if (gpucmd_memory_report(c, &rep) != 0) {
				failed = true;
				break;
			}
			zero = report_is_zero(rep, i == 499);
			gpucmd_report_free(rep);
			if (!zero)
				usleep(10000);
		}
		if (!zero)
			failed = true;
		if (c != NULL)
			gpucmd_close(c);
	}

	if (own) {
		int status = 0;

		kill(daemon, SIGTERM);
		for (int i = 0; i < 2000; i++) {
			if (waitpid(daemon, &status, WNOHANG) == daemon)
				break;
			usleep(10000);
		}
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			char cmd[256];

			fprintf(stderr,
				"soak: gpucmdd did not exit 0 after "
				"SIGTERM (status 0x%x); its log:\n",
				status);
			snprintf(cmd, sizeof(cmd),
				 "tail -n 20 %s/daemon.log >&2", tmp_dir);
			if (system(cmd) != 0)
				fprintf(stderr, "(no log)\n");
			kill(daemon, SIGKILL);
			waitpid(daemon, NULL, 0);
			failed = true;
		}
		if (!failed) {
			char path[160];

			snprintf(path, sizeof(path), "%s/daemon.log", tmp_dir);
			unlink(path);
			snprintf(path, sizeof(path), "%s/gpucmdd.conf",
				 tmp_dir);
			unlink(path);
			unlink(sock_path);
			rmdir(tmp_dir);
		} else {
			fprintf(stderr, "soak: daemon log kept in %s\n",
				tmp_dir);
		}
	}
	printf("soak: %s\n", failed ? "FAILED" : "passed");
	return failed ? 1 : 0;
}
