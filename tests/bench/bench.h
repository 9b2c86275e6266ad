/*
 * bench.h - what the scenarios of gpucmd-bench share: the run's options,
 * the result table, clocks, statistics, the daemon's CPU time and the raw
 * Unix-socket floor that several scenarios measure themselves against.
 *
 * Every number gpucmd-bench reports is measured next to a floor taken in the
 * same run on the same machine (a raw socket ping-pong, memcpy, the backend's
 * own allocator, and on a GPU the CUDA driver API called directly), so a
 * ratio means the same on a noisy laptop, a CI runner and a GPU server.  Where the issue that asked for a scenario states an
 * absolute target (ops per second, microseconds per op), that target is
 * checked as stated and the floor is still printed beside it.
 *
 * Threads: the bench is single-threaded; scenarios that need several
 * clients fork processes, and a forked child only ever leaves with _exit().
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gpucmd.h"

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)

/* The run as the command line asked for it. */
struct bench_opts {
	bool quick;	     /* the whole run in under a minute */
	bool json;	     /* one JSON object on stdout instead of a table */
	bool progress;	     /* a progress line on stderr (a terminal) */
	const char *socket;  /* the daemon's socket */
	const char *backend; /* what our own daemon runs (host, cuda, auto) */
	const char *only;    /* run only scenarios whose name has this */
	pid_t daemon_pid;    /* from SO_PEERCRED; 0 when unknown */
	const char *tmpdir;  /* private scratch directory */
};

extern struct bench_opts bench;

/* How a row's value is judged. */
enum bench_target {
	TARGET_NONE,	 /* information only: met is always true */
	TARGET_RATIO_LE, /* ratio <= goal */
	TARGET_RATIO_GE, /* ratio >= goal */
	TARGET_VALUE_LE, /* value <= goal */
	TARGET_VALUE_GE, /* value >= goal */
};

/**
 * Record one row.  floor and ratio may be NAN (no floor); target describes
 * the goal (goal is unused for TARGET_NONE).
 */
void bench_add(const char *name, double value, const char *unit, double floor,
	       double ratio, enum bench_target target, double goal);
/** Record a sentence that belongs under the table (not a measurement). */
void bench_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* One row of the table. */
struct bench_row {
	char name[64];
	double value;
	char unit[16];
	double floor; /* NAN: none */
	double ratio; /* NAN: none */
	enum bench_target target;
	double goal;
};

/* What bench_add, bench_note and bench_error collected (bench_util.c). */
extern struct bench_row *bench_rows;
extern size_t bench_nrows;
extern char **bench_notes;
extern size_t bench_nnotes;
extern int bench_errors;

/** Say what the bench is doing now (stderr progress line, when enabled). */
void bench_progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/** Report an error of a scenario; the run goes on and exits non-zero. */
void bench_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/**
 * fork() for the bench's children: the child gets default SIGINT/SIGTERM
 * handling (the parent's handler stops the daemon), no progress line, and
 * SIGKILL when the bench dies.
 */
pid_t bench_fork(void);
/**
 * The path of a file called name in the bench's private directory, into
 * out; the file is removed when the bench ends, by a signal too.  0, or
 * -ENAMETOOLONG (also when there is no directory or no room to record it).
 */
int bench_scratch_path(const char *name, char *out, size_t len);
/** CLOCK_MONOTONIC in nanoseconds. */
uint64_t bench_now_ns(void);
/** Sort n samples in place and return the p-th percentile (0..100). */
double bench_percentile(uint64_t *samples, size_t n, double p);
/** The median of n doubles (sorted in place). */
double bench_median(double *v, size_t n);
/** Jain's fairness index of n non-negative values (1 = all equal). */
double bench_jain(const double *x, size_t n);

/** Connect to the daemon as service; NULL (and bench_error) on failure. */
struct gpucmd_conn *bench_connect(const char *service);
/**
 * Run batch b (consumed) and check that it succeeded: 0, or the error
 * (reported with what, through bench_error).
 */
int bench_run_ok(struct gpucmd_batch *b, const char *what);

/* CPU time of a process, split the way the daemon's threads are named. */
struct bench_cpu {
	uint64_t daemon_ns;  /* every thread except host stream workers */
	uint64_t streams_ns; /* the host backend's stream workers ("device") */
};
/** Read the CPU time of every thread of pid; 0 or -errno. */
int bench_cpu_read(pid_t pid, struct bench_cpu *out);
/** VmRSS of pid in bytes, or 0 when it cannot be read. */
uint64_t bench_rss(pid_t pid);

/*
 * The floor: a child process that answers every request of req_len bytes
 * with resp_len bytes on a Unix stream socket, doing nothing else.  It is the
 * least any local daemon can cost for the same bytes.
 */
struct bench_echo {
	pid_t pid;
	int fd; /* our end of the socketpair */
	size_t req_len;
	size_t resp_len;
	uint8_t *req;
	uint8_t *resp;
	bool spin; /* both sides watch before blocking */
	/* bench_echo_start_copying: what the child copies per request. */
	const uint8_t *copy_src;
	size_t copy_len;
};
/** Fork the echo child. */
int bench_echo_start(struct bench_echo *e, size_t req_len, size_t resp_len);
/**
 * The same with both sides watching the socket before they block, as
 * libgpucmd and gpucmdd do (GPUCMD_SPIN_US): the floor of a round trip
 * made with that technique.
 */
int bench_echo_start_spinning(struct bench_echo *e, size_t req_len,
			      size_t resp_len);
/**
 * The floor of a region copy: an echo that, before each answer, copies
 * copy_len bytes from src (memory it shares with this process, such as a
 * region) into its own buffer, as the daemon copies a region into device
 * memory on another CPU.  Both sides watch before blocking, this one as
 * long as libgpucmd does for a fenced batch (SPIN_AWAIT_US).
 */
int bench_echo_start_copying(struct bench_echo *e, size_t req_len,
			     size_t resp_len, const void *src, size_t copy_len);
/** One blocking round trip; 0 or -errno. */
int bench_echo_roundtrip(struct bench_echo *e);
/** Send one request without waiting; 0 or -errno. */
int bench_echo_send(struct bench_echo *e);
/** Collect one response; 0 or -errno. */
int bench_echo_recv(struct bench_echo *e);
/** Stop the child and reap it. */
void bench_echo_stop(struct bench_echo *e);

/* The ops whose frames the floors copy byte for byte. */
enum bench_op {
	BENCH_OP_PING,
	BENCH_OP_SYNC,
	BENCH_OP_SPIN0, /* kernel "spin", grid 1, block 1, u32 0 */
};
/** Bytes on the socket (header included) of a request of nops ops. */
size_t bench_wire_request(enum bench_op op, size_t nops);
/** Bytes on the socket of a response with nresults "done" results. */
size_t bench_wire_response(size_t nresults);

/** Append a spin(0) launch (grid 1, block 1) to b. */
int bench_add_spin0(struct gpucmd_batch *b);

/*
 * Pipelined spin(0) batches (bench_throughput.c), shared with bench_gpu so
 * that its launch row measures the daemon exactly as the throughput rows do.
 */
struct bench_tp {
	uint64_t ops;
	uint64_t wall_ns;
	struct bench_cpu cpu; /* CPU time used over the run */
};
/* Batches of 1024 spin(0) kept in flight at once. */
#define BENCH_SPIN_X1024_DEPTH 4
/** How long one batch size of the throughput scenario runs, in ns. */
uint64_t bench_spin_run_ns(void);
/**
 * Keep depth batches of nops spin(0) in flight on c for about dur_ns;
 * 0 or the first error (not reported).
 */
int bench_spin_batches(struct gpucmd_conn *c, size_t nops, size_t depth,
		       uint64_t dur_ns, struct bench_tp *out);

/*
 * Bytes to the device and back (bench_transfer.c), shared with bench_gpu:
 * one connection with one device buffer and two shared regions, a source
 * that region writes copy from and a destination that region reads fill.
 */
enum bench_xfer_way {
	BENCH_XFER_INLINE,   /* the bytes travel in the frame */
	BENCH_XFER_REGION,   /* the bytes are already in a region */
	BENCH_XFER_BORROWED, /* inline, written from the caller's buffer */
};
struct bench_xfer {
	struct gpucmd_conn *c;
	const char *who;     /* the scenario, for error messages */
	uint8_t *src_region; /* the source region's mapping */
	uint8_t *dst_region; /* the destination region's mapping */
};
/**
 * Allocate device_bytes on the device and create both regions of
 * region_bytes; 0, or -1 with the error reported.  Closing x->c frees all.
 */
int bench_xfer_setup(struct bench_xfer *x, uint64_t device_bytes,
		     size_t region_bytes);
/**
 * Run {write len bytes; sync}, from data inline or from the source region;
 * 0 or the error (reported once the batch ran).
 */
int bench_xfer_write(struct bench_xfer *x, enum bench_xfer_way way,
		     const uint8_t *data, size_t len);
/**
 * Read len bytes back, inline or into the destination region; when check
 * is not NULL, compare them with it.  0 or the error (reported).
 */
int bench_xfer_read(struct bench_xfer *x, enum bench_xfer_way way, size_t len,
		    const uint8_t *check);
/** "4 KiB", "16 MiB", "1.50 MiB": a size as the row names say it. */
void bench_size_name(char *buf, size_t len, size_t bytes);

/* The scenarios, in the order they run. */
void bench_daemon_memory(void);
void bench_roundtrip(void);
void bench_throughput(void);
void bench_transfer(void);
void bench_allocator(void);
void bench_scaling(void);
void bench_gpu(void);
