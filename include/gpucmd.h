/*
 * gpucmd.h - the public client API of gpucmd, and the error codes that the
 * daemon, the wire and the client share.
 *
 * A client process opens a connection (gpucmd_connect) that speaks for one
 * service, builds batches of operations (gpucmd_batch_*), submits them and
 * waits for their responses.  Operations of one batch run in order on one
 * stream; the first one that fails stops the batch and the response names it.
 * Many batches may be in flight on one connection (pipelining); responses are
 * matched to requests by id.
 *
 * Buffers are named by client-chosen 64-bit handles (0 is invalid) that mean
 * something only on the connection that made them, so one batch can allocate,
 * write, launch and read back in a single round trip.
 *
 * Threading: a connection and its batches belong to one thread at a time.
 * fork(): a connection belongs to the process that opened it.  A child
 * shares its socket and regions, so there every call that would use them
 * (submit, wait, run, the region and transfer calls, reports, admin calls)
 * fails at once with GPUCMD_EINVAL, sends nothing, and gpucmd_last_message
 * says so; the child opens its own with gpucmd_connect, and may
 * gpucmd_close the inherited one, which leaves the parent's alone.  It must
 * not write through the region pointers it inherited: they are the
 * parent's memory.
 * Every function returns 0 (or a count) on success and a negative GPUCMD_E*
 * code, or a negative errno, on failure; out-parameters are written only on
 * success.  gpucmd_strerror() names any of them.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define GPUCMD_EXTERN __attribute__((visibility("default")))
#else
#define GPUCMD_EXTERN
#endif

/* Version of this library; the wire protocol has its own (gpucmd-protocol(7)). */
#define GPUCMD_VERSION_MAJOR 0
#define GPUCMD_VERSION_MINOR 1
#define GPUCMD_VERSION_PATCH 0
#define GPUCMD_VERSION_STRING "0.1.0"

/* Socket used when neither the caller nor $GPUCMD_SOCKET names one. */
#define GPUCMD_DEFAULT_SOCKET "/run/gpucmd/gpucmd.sock"

/*
 * Error codes.  They live far below the errno range so that a system error
 * can travel as a plain negative errno beside them.  Values are part of the
 * wire protocol: never renumber one.
 */
enum gpucmd_error {
	GPUCMD_OK = 0,
	GPUCMD_ENOTFOUND = -1001,   /* storage handle not found */
	GPUCMD_ETOOBIG = -1002,	    /* too big for any pool, or the device */
	GPUCMD_ENOMEM = -1003,	    /* out of device (or daemon host) memory */
	GPUCMD_ECAPACITY = -1004,   /* pool capacity exceeded */
	GPUCMD_ESTRIDES = -1005,    /* unsupported strides / layout */
	GPUCMD_EPOOLSINUSE = -1006, /* pools in use, layout kept */
	GPUCMD_ELAUNCH = -1007,	    /* launch refused by the driver */
	GPUCMD_ESTREAM = -1008,	    /* stream fault (kernel faulted) */
	GPUCMD_ENOKERNEL = -1009,   /* kernel or module not found */
	GPUCMD_EINVAL = -1010,	    /* invalid argument */
	GPUCMD_EQUOTA = -1011, /* service quota exceeded (memory, regions) */
	GPUCMD_EPERM = -1012,  /* permission denied */
	GPUCMD_EPROTO = -1013, /* protocol error (bad frame) */
	GPUCMD_EUNSUPPORTED = -1014,  /* unsupported by this backend */
	GPUCMD_EDISCONNECTED = -1015, /* connection closed */
	GPUCMD_ELIMIT = -1016,	      /* a configured limit was reached */
	GPUCMD_EVERSION = -1017,      /* protocol version mismatch */
	GPUCMD_ESHUTDOWN = -1018,     /* daemon is shutting down */
	GPUCMD_EDRIVER = -1019,	      /* other driver failure */
	GPUCMD_EEXIST = -1020,	      /* handle or id already in use */
	GPUCMD_EBUSY = -1021,	      /* object still in use */
};

/* A short, static description of any code this API returns (errno too). */
GPUCMD_EXTERN const char *gpucmd_strerror(int code);
/* The symbolic name of a code, e.g. "GPUCMD_ENOMEM" or "ENOENT". */
GPUCMD_EXTERN const char *gpucmd_errname(int code);

struct gpucmd_conn;
struct gpucmd_batch;
struct gpucmd_response;

/* What the daemon said about itself and this connection in its Welcome. */
struct gpucmd_info {
	uint32_t protocol_version;
	uint32_t service_id;
	uint64_t connection_id;
	char service[64];
	char device_name[128];
	char backend[16]; /* "host" or "cuda" */
	uint64_t device_total_memory;
	uint64_t max_allocation; /* the device's largest reservation */
	uint64_t memory_limit;	 /* service quota, 0 = none */
	uint32_t max_streams;
	uint32_t max_ops_per_batch;
	uint32_t max_frame_bytes;
	uint32_t max_in_flight;
	uint64_t region_limit; /* shared region bytes, 0 = none */
	/*
	 * Which GPU, as nvidia-smi names it: "GPU-" and its UUID, and its
	 * PCI bus id ("0000:3b:00.0"); "" on the host backend.
	 */
	char device_uuid[48];
	char device_pci_bus_id[32];
};

/* Device memory usage of a stream (or a service, or the daemon). */
struct gpucmd_memory_usage {
	uint64_t allocations;	 /* live, and released ones still in use */
	uint64_t bytes_in_use;	 /* requested bytes of those */
	uint64_t bytes_padding;	 /* alignment padding of live allocations */
	uint64_t bytes_reserved; /* held from the device, free or live */
};

/*
 * Open a connection to the daemon at socket_path (NULL: $GPUCMD_SOCKET, else
 * GPUCMD_DEFAULT_SOCKET) speaking for the service named service, and run the
 * Hello/Welcome handshake.  On refusal the code says why and, when msg is not
 * NULL, the daemon's message is copied there (msg_len bytes at most).  The
 * connection is this process's: after fork() a child opens its own (see
 * the top of this file).
 */
GPUCMD_EXTERN int gpucmd_connect(const char *socket_path, const char *service,
				 struct gpucmd_conn **out, char *msg,
				 size_t msg_len);
/*
 * gpucmd_connect, giving up after timeout_ms (-1: never) on a daemon that
 * does not accept or answer Hello (-ETIMEDOUT); the timeout then stays the
 * connection's, as gpucmd_set_timeout sets it.  0 is GPUCMD_EINVAL: no
 * handshake fits in it.
 */
GPUCMD_EXTERN int gpucmd_connect_timeout(const char *socket_path,
					 const char *service, int timeout_ms,
					 struct gpucmd_conn **out, char *msg,
					 size_t msg_len);
/* Flags of gpucmd_connect_flags. */
enum gpucmd_connect_flag {
	/*
	 * Only read reports and status and run admin calls (gpucmd_evict,
	 * gpucmd_cleanup naming a service).  An admin then joins no service:
	 * none is created, none lists it, and gpucmd_info says service_id 0
	 * and service "".  Its batches may hold only those ops, pings and
	 * syncs; others fail with GPUCMD_EPERM.  Anyone else joins service as
	 * without the flag.
	 */
	GPUCMD_CONNECT_OBSERVE = 1 << 0,
};

/*
 * gpucmd_connect_timeout with flags, GPUCMD_CONNECT_* or'ed (0: the same
 * as gpucmd_connect_timeout).  Unknown flags are GPUCMD_EINVAL.
 */
GPUCMD_EXTERN int gpucmd_connect_flags(const char *socket_path,
				       const char *service, int timeout_ms,
				       unsigned flags, struct gpucmd_conn **out,
				       char *msg, size_t msg_len);
/*
 * How long each wait on conn may block (-1, the default: for ever): a
 * gpucmd_wait or gpucmd_run, and the calls built on them, that gets no
 * answer in time returns -ETIMEDOUT.  After gpucmd_wait the request stays
 * outstanding; after gpucmd_run its answer is dropped when it comes; after
 * a region or transfer call the connection is closed (the daemon may still
 * be using the shared memory).  The daemon still runs what was sent.
 */
GPUCMD_EXTERN void gpucmd_set_timeout(struct gpucmd_conn *conn, int timeout_ms);
/*
 * 0 while conn can be used.  Once the daemon closed it, sent an Error
 * frame, or a timeout closed it, the code it died with (every later submit
 * and wait returns it), and *why (when why is not NULL) says what
 * happened: the daemon's message when it sent one.  GPUCMD_EINVAL in a
 * process other than the one that opened conn (a child after fork()).
 */
GPUCMD_EXTERN int gpucmd_conn_error(const struct gpucmd_conn *conn,
				    const char **why);
/*
 * Close the connection; the daemon releases every handle it held (at once,
 * even while a child of fork() still holds a copy of the socket), and
 * every shared region is unmapped here.  In a child after fork() it only
 * frees the child's copy (memory, descriptor, mappings) and sends nothing:
 * the parent's connection goes on.
 */
GPUCMD_EXTERN void gpucmd_close(struct gpucmd_conn *conn);
/* The daemon's Welcome for this connection. */
GPUCMD_EXTERN const struct gpucmd_info *
gpucmd_info(const struct gpucmd_conn *conn);

/* A new, empty batch for stream (a small client-chosen number). */
GPUCMD_EXTERN int gpucmd_batch_new(struct gpucmd_conn *conn, uint32_t stream,
				   struct gpucmd_batch **out);
/* Free a batch that was not submitted (submitting consumes it). */
GPUCMD_EXTERN void gpucmd_batch_free(struct gpucmd_batch *batch);
/* Number of operations queued in the batch. */
GPUCMD_EXTERN size_t gpucmd_batch_count(const struct gpucmd_batch *batch);
/*
 * The builders below (gpucmd_batch_empty to gpucmd_batch_graph_destroy)
 * return 0 when they queued their op.  A refusal (GPUCMD_EINVAL for a bad
 * argument, GPUCMD_ELIMIT when the batch already holds max_ops_per_batch
 * ops or the op is over max_frame_bytes, -ENOMEM) queues nothing, and the
 * batch keeps it: later builders queue nothing and return the first
 * refusal, and gpucmd_submit and gpucmd_run free the batch and return it
 * with gpucmd_last_message naming the op.  So a batch is built with every
 * op or sent with none, and a caller may check the builders' codes or
 * only the submit's.  To fill batches to the limit, compare
 * gpucmd_batch_count with gpucmd_info(conn)->max_ops_per_batch.
 */
/* The batch's first builder refusal, or 0 (GPUCMD_EINVAL for NULL). */
GPUCMD_EXTERN int gpucmd_batch_error(const struct gpucmd_batch *batch);

/* Allocate size bytes of device memory and name it handle. */
GPUCMD_EXTERN int gpucmd_batch_empty(struct gpucmd_batch *b, uint64_t handle,
				     uint64_t size);
/* Allocate len bytes named handle and copy data into them. */
GPUCMD_EXTERN int gpucmd_batch_create_with_data(struct gpucmd_batch *b,
						uint64_t handle,
						const void *data, size_t len);
/* Copy len bytes of data into handle at offset. */
GPUCMD_EXTERN int gpucmd_batch_write(struct gpucmd_batch *b, uint64_t handle,
				     uint64_t offset, const void *data,
				     size_t len);
/*
 * Like gpucmd_batch_write, without copying data into the batch: the bytes
 * go from data straight into the socket when the batch is submitted, so
 * data must stay valid and unchanged until gpucmd_submit (or gpucmd_run)
 * has returned, or the batch is freed.  For large writes: it saves a copy
 * of the whole payload.
 */
GPUCMD_EXTERN int gpucmd_batch_write_borrowed(struct gpucmd_batch *b,
					      uint64_t handle, uint64_t offset,
					      const void *data, size_t len);
/* Read len bytes of handle at offset; the bytes come back in the result. */
GPUCMD_EXTERN int gpucmd_batch_read(struct gpucmd_batch *b, uint64_t handle,
				    uint64_t offset, uint64_t len);
/*
 * Drop handle.  When only the handle's own stream used it and the release
 * comes on that stream, later allocations on the stream reuse its memory at
 * once (the stream runs their work after the work queued before); otherwise
 * its memory is reused once the device is done with it.
 */
GPUCMD_EXTERN int gpucmd_batch_release(struct gpucmd_batch *b, uint64_t handle);
/* Wait for everything already enqueued on the batch's stream. */
GPUCMD_EXTERN int gpucmd_batch_sync(struct gpucmd_batch *b);
/* Ask for the stream's device memory usage. */
GPUCMD_EXTERN int gpucmd_batch_memory_usage(struct gpucmd_batch *b);
/* A no-op that the daemon answers; measures the round trip. */
GPUCMD_EXTERN int gpucmd_batch_ping(struct gpucmd_batch *b);

/* One kernel argument. */
enum gpucmd_arg_kind {
	GPUCMD_ARG_BUFFER =
		1, /* a handle; the kernel gets its device address */
	GPUCMD_ARG_U32 = 2,
	GPUCMD_ARG_I32 = 3,
	GPUCMD_ARG_U64 = 4,
	GPUCMD_ARG_F32 = 5,
	/*
	 * A handle the kernel only reads: how a module's kernel takes a
	 * shared buffer (gpucmd_batch_share; a built-in's inputs take
	 * either kind), and other streams may read it meanwhile.
	 */
	GPUCMD_ARG_BUFFER_IN = 6,
};
struct gpucmd_arg {
	enum gpucmd_arg_kind kind;
	union {
		uint64_t handle;
		uint32_t u32;
		int32_t i32;
		uint64_t u64;
		float f32;
	} v;
};

/*
 * One argument of each kind, for an argument list written in place:
 * struct gpucmd_arg args[] = { gpucmd_arg_buffer(h), gpucmd_arg_u32(n) };
 */
static inline struct gpucmd_arg gpucmd_arg_buffer(uint64_t handle)
{
	struct gpucmd_arg a;

	a.kind = GPUCMD_ARG_BUFFER;
	a.v.handle = handle;
	return a;
}

static inline struct gpucmd_arg gpucmd_arg_buffer_in(uint64_t handle)
{
	struct gpucmd_arg a;

	a.kind = GPUCMD_ARG_BUFFER_IN;
	a.v.handle = handle;
	return a;
}

static inline struct gpucmd_arg gpucmd_arg_u32(uint32_t v)
{
	struct gpucmd_arg a;

	a.kind = GPUCMD_ARG_U32;
	a.v.u32 = v;
	return a;
}

static inline struct gpucmd_arg gpucmd_arg_i32(int32_t v)
{
	struct gpucmd_arg a;

	a.kind = GPUCMD_ARG_I32;
	a.v.i32 = v;
	return a;
}

static inline struct gpucmd_arg gpucmd_arg_u64(uint64_t v)
{
	struct gpucmd_arg a;

	a.kind = GPUCMD_ARG_U64;
	a.v.u64 = v;
	return a;
}

static inline struct gpucmd_arg gpucmd_arg_f32(float v)
{
	struct gpucmd_arg a;

	a.kind = GPUCMD_ARG_F32;
	a.v.f32 = v;
	return a;
}

/*
 * Launch kernel name (a built-in: fill_u32, copy, add_f32, scale_f32,
 * saxpy_f32, reduce_sum_f32, spin, fault; gpucmd(1) says what each takes
 * and computes) with grid x block threads (NULL: 1, 1, 1).  A built-in
 * covers all of its elements whatever the geometry.
 */
GPUCMD_EXTERN int gpucmd_batch_kernel(struct gpucmd_batch *b, const char *name,
				      const uint32_t grid[3],
				      const uint32_t block[3],
				      const struct gpucmd_arg *args,
				      size_t nargs);
/*
 * gpucmd_batch_kernel with shared_bytes of dynamic shared memory per block;
 * a value over the device's limit is refused by the driver (GPUCMD_ELAUNCH),
 * which invalidates the stream's open profiles.
 */
GPUCMD_EXTERN int
gpucmd_batch_kernel_shared(struct gpucmd_batch *b, const char *name,
			   const uint32_t grid[3], const uint32_t block[3],
			   uint32_t shared_bytes, const struct gpucmd_arg *args,
			   size_t nargs);

/*
 * Buffers shared between the connections of one service (weights that
 * several worker processes use, kept once).  share moves the live buffer
 * `handle` of this connection into device memory of the service's own,
 * under `name` (1 to 63 of letters, digits, '.', '_', '-', '/', ':'): one
 * device-to-device copy on the batch's stream, and the reply comes once
 * it has run.  From then on the buffer is read-only for every holder:
 * reads, copies from it, and kernels that take it as
 * gpucmd_arg_buffer_in; a write is refused with GPUCMD_EINVAL.  import
 * names it with a new handle of this connection (another connection of
 * the same service; GPUCMD_ENOTFOUND for a name the service does not
 * share, GPUCMD_EBUSY while the share's copy has not run, GPUCMD_ESTREAM
 * when it is lost: the share was answered with a fault of its stream).
 * The memory goes back once every handle naming it, on every connection,
 * is released; it counts once against the service's memory_limit.
 */
GPUCMD_EXTERN int gpucmd_batch_share(struct gpucmd_batch *b, uint64_t handle,
				     const char *name);
GPUCMD_EXTERN int gpucmd_batch_import(struct gpucmd_batch *b, uint64_t handle,
				      const char *name);

/*
 * Device code: load a module (format "ptx", "cubin", "fatbin", or "cuda"
 * for CUDA C compiled by NVRTC) under a client-chosen id.  The daemon
 * compiles each distinct module once for every service.  The host backend
 * refuses (GPUCMD_EUNSUPPORTED).
 */
GPUCMD_EXTERN int gpucmd_batch_load_module(struct gpucmd_batch *b,
					   uint64_t module, const char *format,
					   const void *data, size_t len);
/* Forget a module id (launches already queued still run). */
GPUCMD_EXTERN int gpucmd_batch_unload_module(struct gpucmd_batch *b,
					     uint64_t module);
/*
 * Launch function of a loaded module.  Its arguments go as given (buffers
 * as device addresses): unlike the built-ins, no bounds are checked.
 */
GPUCMD_EXTERN int
gpucmd_batch_kernel_module(struct gpucmd_batch *b, uint64_t module,
			   const char *function, const uint32_t grid[3],
			   const uint32_t block[3], uint32_t shared_bytes,
			   const struct gpucmd_arg *args, size_t nargs);

/*
 * Memory of the batch's stream.  A reservation is memory without a handle:
 * reservation ids are chosen by the client in a namespace of their own
 * (non-zero; GPUCMD_EEXIST while live), and bind turns one into a handle.
 */

/* Reserve size bytes as reservation (GPUCMD_ETOOBIG: nothing could fit it). */
GPUCMD_EXTERN int gpucmd_batch_reserve(struct gpucmd_batch *b,
				       uint64_t reservation, uint64_t size);
/* Give reservation's memory to handle (unknown or bound: GPUCMD_EINVAL). */
GPUCMD_EXTERN int gpucmd_batch_bind(struct gpucmd_batch *b,
				    uint64_t reservation, uint64_t handle);
/* Ask for the stream's cursor, the commands resolved on it. */
GPUCMD_EXTERN int gpucmd_batch_cursor(struct gpucmd_batch *b);
/* Ask for the stream's pools: gpucmd_response_stream_report. */
GPUCMD_EXTERN int gpucmd_batch_stream_report(struct gpucmd_batch *b);
/* Flush the stream's drops and return its free pages to the device. */
GPUCMD_EXTERN int gpucmd_batch_memory_cleanup(struct gpucmd_batch *b);
/* Free released memory the device is past (deferred during a capture). */
GPUCMD_EXTERN int gpucmd_batch_flush_drops(struct gpucmd_batch *b);

enum gpucmd_allocation_mode {
	GPUCMD_MODE_AUTO = 0,	    /* closes one persistent window */
	GPUCMD_MODE_PERSISTENT = 1, /* opens one: exact-size persistent pool */
};
/* Nest the stream's allocation mode: persistent while any window is open. */
GPUCMD_EXTERN int
gpucmd_batch_allocation_mode(struct gpucmd_batch *b,
			     enum gpucmd_allocation_mode mode);

/* One pool of a custom layout; sizes in bytes, 0 = the daemon's default. */
struct gpucmd_pool_options {
	const char *kind;	 /* "sliced", "exclusive" or "direct" */
	uint64_t page_size;	 /* sliced: page size */
	uint64_t max_slice;	 /* sliced: largest slice */
	uint64_t max_pool_size;	 /* sliced: cap on its pages */
	uint64_t max_alloc;	 /* exclusive: largest allocation */
	uint64_t dealloc_period; /* exclusive: reservations between cleanups */
	uint64_t reclaim_at;	 /* direct: reserved-bytes watermark */
};
/*
 * Replace the stream's dynamic pools with preset "subslices", "exclusive"
 * or "custom" (then npools pools, else none).  While buffers live in them:
 * GPUCMD_EPOOLSINUSE with the bytes in use in the message, old layout kept.
 */
GPUCMD_EXTERN int
gpucmd_batch_install_pools(struct gpucmd_batch *b, const char *preset,
			   const struct gpucmd_pool_options *pools,
			   size_t npools);
/* Reserve size bytes of the daemon's host memory: gpucmd_response_cpu. */
GPUCMD_EXTERN int gpucmd_batch_reserve_cpu(struct gpucmd_batch *b,
					   uint64_t size);

/* Most dimensions of a copy layout. */
#define GPUCMD_MAX_RANK 8
/*
 * A strided copy: shape and strides (in elements) of rank dimensions,
 * row-major.  Only pitched layouts copy (last stride 1, each row pitch at
 * least its row, higher dimensions packed); the daemon refuses any other
 * with GPUCMD_ESTRIDES.  The host side is always dense.
 */
struct gpucmd_layout {
	uint32_t rank;
	uint64_t shape[GPUCMD_MAX_RANK];
	uint64_t strides[GPUCMD_MAX_RANK];
	uint32_t elem_size; /* bytes per element */
};
/* Copy len packed bytes (the layout's size) into handle at offset. */
GPUCMD_EXTERN int gpucmd_batch_write_layout(struct gpucmd_batch *b,
					    uint64_t handle, uint64_t offset,
					    const struct gpucmd_layout *layout,
					    const void *data, size_t len);
/* Read the layout's elements of handle at offset; they come back dense. */
GPUCMD_EXTERN int gpucmd_batch_read_layout(struct gpucmd_batch *b,
					   uint64_t handle, uint64_t offset,
					   const struct gpucmd_layout *layout);

/*
 * Shared regions: memory this process shares with the daemon once (a
 * sealed memfd whose descriptor travels with SCM_RIGHTS) and afterwards
 * only names, so bulk bytes move between it and the device without
 * passing through the socket.  Region ids are the caller's, per connection
 * (non-zero, below GPUCMD_REGION_ID_RESERVED); a connection holds at most
 * 64 regions, the library's scratch region included, and a released region
 * counts until the daemon unmaps it (once the copies enqueued with it are
 * done; GPUCMD_ELIMIT past that).  Ranges are checked
 * by the daemon against the region's size (GPUCMD_EINVAL, with the
 * numbers in the message).
 *
 * A write from a region reads the bytes when the device gets to it, not
 * when the batch is answered: leave the range alone until something later
 * on the stream has completed (a sync, a read).  A read into a region is
 * complete when its response is in.  Releasing a region, or closing the
 * connection, with copies still in flight is safe: the daemon unmaps only
 * after them.
 */

/* Ids from here up are the library's own (its scratch region). */
#define GPUCMD_REGION_ID_RESERVED (UINT64_C(1) << 63)
/*
 * Transfers of up to this many bytes go inline in the frame in the
 * convenience calls (gpucmd_write_buffer, gpucmd_read_buffer) and in
 * gpucmd exec; larger ones go through a shared region.  Measured on the
 * host backend (one round trip each, the bytes copied into or out of the
 * region included): the region is within 5% of inline at 16 KiB, 1.2x
 * faster at 32 KiB, 1.3x at 48 KiB and 1.5x at 64 KiB, so from 32 KiB up
 * the region wins clearly.  The gpucmd_batch_* calls never switch.
 */
#define GPUCMD_INLINE_MAX (32u << 10)

/*
 * Create region id of size bytes: a memfd sealed against shrinking and
 * growing, mapped shared at *ptr, attached to the daemon in a round trip
 * of its own.  The mapping lives until gpucmd_region_release or
 * gpucmd_close.  GPUCMD_EEXIST when id is live on this connection,
 * GPUCMD_ELIMIT past the daemon's count, GPUCMD_EQUOTA past the service's
 * region_limit (bytes of shared regions), -errno when the memfd fails.
 */
GPUCMD_EXTERN int gpucmd_region_create(struct gpucmd_conn *conn, uint64_t id,
				       size_t size, void **ptr);
/*
 * Release region id (a round trip), then unmap it here; the daemon keeps
 * its mapping until the copies already enqueued are done.
 * GPUCMD_ENOTFOUND when id is not live.
 */
GPUCMD_EXTERN int gpucmd_region_release(struct gpucmd_conn *conn, uint64_t id);
/*
 * Queue the release of region; it is unmapped here when the response of
 * the batch is collected, if the op ran (until then the id stays taken).
 */
GPUCMD_EXTERN int gpucmd_batch_release_region(struct gpucmd_batch *b,
					      uint64_t region);
/* Copy len bytes of region at region_offset into handle at offset. */
GPUCMD_EXTERN int gpucmd_batch_write_region(struct gpucmd_batch *b,
					    uint64_t handle, uint64_t offset,
					    uint64_t region,
					    uint64_t region_offset,
					    uint64_t len);
/* A strided write from the layout's packed bytes at region_offset. */
GPUCMD_EXTERN int
gpucmd_batch_write_region_layout(struct gpucmd_batch *b, uint64_t handle,
				 uint64_t offset,
				 const struct gpucmd_layout *layout,
				 uint64_t region, uint64_t region_offset);
/* Allocate len bytes named handle from len bytes of region at region_offset. */
GPUCMD_EXTERN int gpucmd_batch_create_region(struct gpucmd_batch *b,
					     uint64_t handle, uint64_t region,
					     uint64_t region_offset,
					     uint64_t len);
/*
 * Read len bytes of handle at offset into region at region_offset; the
 * result names the range (gpucmd_response_region).
 */
GPUCMD_EXTERN int gpucmd_batch_read_region(struct gpucmd_batch *b,
					   uint64_t handle, uint64_t offset,
					   uint64_t len, uint64_t region,
					   uint64_t region_offset);
/* A strided read whose elements land packed in region at region_offset. */
GPUCMD_EXTERN int
gpucmd_batch_read_region_layout(struct gpucmd_batch *b, uint64_t handle,
				uint64_t offset,
				const struct gpucmd_layout *layout,
				uint64_t region, uint64_t region_offset);

/*
 * Convenience transfers, each a round trip of its own on stream: up to
 * GPUCMD_INLINE_MAX bytes (or what fits max_frame_bytes) inline, larger
 * ones through a scratch region the connection keeps (up to 64 MiB; more
 * goes in pieces).  A write returns once the bytes are on the device (it
 * syncs the stream); a read once they are in out.
 */
GPUCMD_EXTERN int gpucmd_write_buffer(struct gpucmd_conn *conn, uint32_t stream,
				      uint64_t handle, uint64_t offset,
				      const void *data, size_t len);
GPUCMD_EXTERN int gpucmd_read_buffer(struct gpucmd_conn *conn, uint32_t stream,
				     uint64_t handle, uint64_t offset,
				     size_t len, void *out);
/*
 * Allocate len bytes named handle on stream and copy data into them, of
 * any size (gpucmd_batch_create_with_data is bounded by the frame): one
 * round trip inline, else an allocation and gpucmd_write_buffer.  Returns
 * once the bytes are on the device; on a failure no buffer is left.
 */
GPUCMD_EXTERN int gpucmd_create_buffer(struct gpucmd_conn *conn,
				       uint32_t stream, uint64_t handle,
				       const void *data, size_t len);

/*
 * Profiles time the device between begin and end on one stream (ids are
 * the client's, per connection).  A launch the driver refuses on the
 * stream in between, or work on it that faults from the batch of the begin
 * to that of the end, makes the result invalid, with the reason.
 */

/* Open profile on the stream (GPUCMD_EEXIST if it is open). */
GPUCMD_EXTERN int gpucmd_batch_profile_begin(struct gpucmd_batch *b,
					     uint64_t profile);
/* Close profile on the stream that opened it: gpucmd_response_profile. */
GPUCMD_EXTERN int gpucmd_batch_profile_end(struct gpucmd_batch *b,
					   uint64_t profile);

/*
 * Graph capture: the stream's kernels and copies between capture_begin
 * and capture_end are recorded, not run, into a graph the client names.
 * While recording, allocation, reads, sync and profiles are refused with
 * GPUCMD_EINVAL (reserve memory before), and releasing a handle a graph
 * uses is GPUCMD_EBUSY until the graph is destroyed.  A recorded write,
 * from a region too, keeps its bytes as they were at the capture: every
 * replay writes those (per-replay input goes in a write before the launch).
 */

/* Start recording the stream. */
GPUCMD_EXTERN int gpucmd_batch_capture_begin(struct gpucmd_batch *b);
/*
 * Stop recording into graph (not in use: else GPUCMD_EEXIST, and the
 * capture goes on; 0 is gpucmd_batch_capture_abort).
 */
GPUCMD_EXTERN int gpucmd_batch_capture_end(struct gpucmd_batch *b,
					   uint64_t graph);
/*
 * Stop recording and discard what was recorded: the way out of a capture
 * that a failed batch left open (its capture_end never ran).  Buffers the
 * recording held may be released again.
 */
GPUCMD_EXTERN int gpucmd_batch_capture_abort(struct gpucmd_batch *b);
/* Replay graph on the stream (GPUCMD_ENOTFOUND if it does not exist). */
GPUCMD_EXTERN int gpucmd_batch_graph_launch(struct gpucmd_batch *b,
					    uint64_t graph);
/* Destroy graph; replays already queued still run. */
GPUCMD_EXTERN int gpucmd_batch_graph_destroy(struct gpucmd_batch *b,
					     uint64_t graph);

/*
 * Send the batch (consuming it) and return its request id in *id.  The
 * response is collected with gpucmd_wait.  Fails with GPUCMD_ELIMIT when
 * max_in_flight requests are already outstanding.
 */
GPUCMD_EXTERN int gpucmd_submit(struct gpucmd_batch *b, uint64_t *id);
/*
 * Send the batch (consuming it) and let the library drop its response:
 * for batches whose results nobody needs (a release, launches whose
 * output a later batch reads).  Its answer is read in by later calls on
 * the connection (a submit with 32 or more of them outstanding reads what
 * has come, without waiting); until then it holds a place in flight,
 * which a submit that finds none free waits for (up to the connection's
 * timeout) instead of failing with GPUCMD_ELIMIT at once.  A detached
 * batch that failed is counted for gpucmd_detached_failures: once a later
 * batch of the same stream that waits (a sync or a read) was answered,
 * the detached ones sent before it there are counted.  One still
 * unanswered when the connection ends counts as failed, with the
 * connection's code; gpucmd_close drops them uncounted.  The same
 * refusals as gpucmd_submit.
 */
GPUCMD_EXTERN int gpucmd_submit_detached(struct gpucmd_batch *b);
/*
 * How many detached batches failed since the last call (0: none, of those
 * whose answers were read in: it first reads in, without waiting, those
 * that have arrived), and the first one's code and the daemon's sentence,
 * into msg (len bytes; "" when none).  Each call starts the count again.
 * In a child of fork(): 0, and nothing read.  A call on the connection
 * like any other: from the thread that uses it, not a monitor beside it.
 */
GPUCMD_EXTERN uint64_t gpucmd_detached_failures(struct gpucmd_conn *conn,
						int *code, char *msg,
						size_t len);
/* Wait for the response to request id (any order of ids is fine). */
GPUCMD_EXTERN int gpucmd_wait(struct gpucmd_conn *conn, uint64_t id,
			      struct gpucmd_response **out);
/*
 * gpucmd_wait for at most timeout_ms (-1: for ever) instead of the
 * connection's timeout; -ETIMEDOUT leaves id outstanding, to wait again.
 */
GPUCMD_EXTERN int gpucmd_wait_timeout(struct gpucmd_conn *conn, uint64_t id,
				      int timeout_ms,
				      struct gpucmd_response **out);
/* gpucmd_submit then gpucmd_wait. */
GPUCMD_EXTERN int gpucmd_run(struct gpucmd_batch *b,
			     struct gpucmd_response **out);

/* The batch's outcome: 0, or the code of the operation that failed. */
GPUCMD_EXTERN int gpucmd_response_error(const struct gpucmd_response *r);
/* The daemon's message for a failure ("" when none). */
GPUCMD_EXTERN const char *
gpucmd_response_message(const struct gpucmd_response *r);
/*
 * The daemon's message for the last failure of a call that returns only a
 * code (gpucmd_region_create, gpucmd_region_release, gpucmd_write_buffer,
 * gpucmd_read_buffer, gpucmd_create_buffer, gpucmd_evict, gpucmd_cleanup, gpucmd_status,
 * gpucmd_memory_report and the other reports): what happened, with the
 * numbers; for the region and transfer calls, also the library's own
 * refusals (a bad id, an id already attached).  "" when that call
 * succeeded.  Also why gpucmd_submit or gpucmd_run sent no batch (a
 * builder had refused one of its ops).  Valid until the next such call on
 * conn.
 */
GPUCMD_EXTERN const char *gpucmd_last_message(const struct gpucmd_conn *conn);
/* Index of the failing operation, or -1 when the batch succeeded. */
GPUCMD_EXTERN int gpucmd_response_failed_index(const struct gpucmd_response *r);
/* Number of results (one per operation that ran; result i is op i's). */
GPUCMD_EXTERN size_t gpucmd_response_count(const struct gpucmd_response *r);
/* Bytes returned by a read at result index i (GPUCMD_EINVAL if not a read). */
GPUCMD_EXTERN int gpucmd_response_data(const struct gpucmd_response *r,
				       size_t i, const void **data,
				       size_t *len);
/* The region range a read into a region at result index i filled. */
GPUCMD_EXTERN int gpucmd_response_region(const struct gpucmd_response *r,
					 size_t i, uint64_t *region,
					 uint64_t *offset, uint64_t *len);
/* Memory usage returned by a memory_usage at result index i. */
GPUCMD_EXTERN int gpucmd_response_usage(const struct gpucmd_response *r,
					size_t i,
					struct gpucmd_memory_usage *out);
/* The number returned at result i (a cursor). */
GPUCMD_EXTERN int gpucmd_response_value(const struct gpucmd_response *r,
					size_t i, uint64_t *out);

/* A closed profile. */
struct gpucmd_profile {
	double device_ms;   /* device time between begin and end */
	int valid;	    /* 0: a launch in between was refused, or faulted */
	const char *reason; /* why not valid, "" when valid (lives with r) */
};
/* The profile returned by a profile_end at result i. */
GPUCMD_EXTERN int gpucmd_response_profile(const struct gpucmd_response *r,
					  size_t i, struct gpucmd_profile *out);

/* What a reserve_cpu got. */
struct gpucmd_cpu_buffer {
	uint64_t size; /* always the size asked for */
	int pinned;    /* 1: the pinned pool served it, 0: the heap */
};
/* The host buffer returned by a reserve_cpu at result i. */
GPUCMD_EXTERN int gpucmd_response_cpu(const struct gpucmd_response *r, size_t i,
				      struct gpucmd_cpu_buffer *out);

/* One pool of a stream. */
struct gpucmd_pool_report {
	char kind[16];	    /* "sliced", "exclusive", "persistent", "direct" */
	uint64_t page_size; /* sliced: page; exclusive: max_alloc */
	uint64_t max_slice;
	uint64_t pages; /* device allocations held now */
	uint64_t pages_peak;
	struct gpucmd_memory_usage usage;
	uint64_t largest_alloc; /* largest request served */
	uint64_t largest_free;	/* largest free block held */
};
/* One stream's memory: its usage is the sum of its pools'. */
struct gpucmd_stream_report {
	uint64_t connection_id;
	uint32_t stream;
	int closing; /* 1: its connection is gone, its queued work still runs */
	struct gpucmd_memory_usage usage;
	size_t npools;
	struct gpucmd_pool_report *pools;
};
/* A copy of the stream report at result i (gpucmd_stream_report_free). */
GPUCMD_EXTERN int
gpucmd_response_stream_report(const struct gpucmd_response *r, size_t i,
			      struct gpucmd_stream_report **out);
/* Free a report from gpucmd_response_stream_report. */
GPUCMD_EXTERN void gpucmd_stream_report_free(struct gpucmd_stream_report *sr);
/* Free a response and everything its accessors pointed into. */
GPUCMD_EXTERN void gpucmd_response_free(struct gpucmd_response *r);

/*
 * A service's last refused allocation: when (milliseconds since the epoch;
 * 0: none since the daemon started, and always 0 in totals), the bytes
 * asked for, by which connection on which stream, the code and the
 * daemon's sentence with its numbers.  Declared here, not inside
 * gpucmd_service_report, so that C++ names it as C does.
 */
struct gpucmd_refusal {
	uint64_t unix_ms;
	uint64_t size;
	uint64_t connection_id;
	uint32_t stream;
	int code;
	char message[768];
};
/*
 * A buffer a service's connections share (gpucmd_batch_share): its name,
 * size, the handles naming it on all connections, the connection that
 * shared it, the imports since, whether its copy has run (until then an
 * import is refused with GPUCMD_EBUSY), and whether the connection that
 * shared it is still open (0: it is gone, and only imports hold the
 * buffer; also 0 from a daemon older than the field), and whether it is
 * lost (its copy came after a fault, or the share's batch was answered
 * before it: imports are refused with GPUCMD_ESTREAM until every handle of
 * it is released; 0 from a daemon older than the field).
 */
struct gpucmd_shared_buffer {
	char name[64];
	uint64_t bytes;
	uint32_t handles;
	uint64_t connection_id;
	uint64_t imports;
	int ready;
	int sharer_open;
	int lost;
};
/* Daemon-wide memory report, one entry per service the caller may see. */
struct gpucmd_service_report {
	char name[64];
	uint32_t id;
	uint32_t connections;
	uint64_t bytes_in_use;
	uint64_t bytes_reserved;
	uint64_t bytes_padding;
	uint64_t allocations;
	uint64_t peak_bytes_in_use;
	uint64_t limit_bytes; /* 0 = no limit */
	uint64_t oom_count;
	/* Its streams, on every connection (none in totals). */
	size_t nstreams;
	struct gpucmd_stream_report *streams;
	/*
	 * Shared regions mapped for its connections (released ones still
	 * waiting for copies in flight included) and its quota of them
	 * (region_limit; 0 = no limit, and always 0 in totals).
	 */
	uint64_t region_bytes;
	uint32_t regions;
	uint64_t region_limit;
	/*
	 * Region attaches refused since the daemon started because they would
	 * have taken the service over its region_limit (GPUCMD_EQUOTA).
	 */
	uint64_t region_refusals;
	/*
	 * Device memory the service released that the device may still use
	 * (work enqueued before the release is not done): part of
	 * bytes_in_use, no longer in any buffer.  Live buffers plus this may
	 * reach twice limit_bytes.
	 */
	uint64_t bytes_released_pending;
	/*
	 * Device-code modules the service's connections hold loaded, and the
	 * most they may (max_modules, gpucmdd.conf(5); 0 = built-in kernels
	 * only, and always 0 in totals).
	 */
	uint32_t modules;
	uint32_t max_modules;
	/*
	 * Device memory the global variables of those modules hold while
	 * they are loaded; counted in limit_bytes beside bytes_in_use.
	 */
	uint64_t module_bytes;
	/*
	 * The last allocation the service was refused (GPUCMD_ENOMEM, or
	 * GPUCMD_EQUOTA over its memory_limit; oom_count counts them all),
	 * as its client was told (struct gpucmd_refusal, above).
	 */
	struct gpucmd_refusal last_refusal;
	/*
	 * Buffers its connections share: part of bytes_in_use (and of
	 * bytes_reserved) once, whoever holds them; the list is empty in
	 * totals.
	 */
	uint32_t shared_buffers;
	uint64_t shared_buffer_bytes;
	size_t nshared;
	struct gpucmd_shared_buffer *shared;
};
struct gpucmd_report {
	char device_name[128];
	char backend[16];
	uint64_t device_total_memory;
	size_t nservices;
	struct gpucmd_service_report *services;
	struct gpucmd_service_report totals;
	uint64_t device_free_memory; /* valid when has_device_free_memory */
	/* The daemon's own pinned host pool (its overhead beside the services). */
	int has_pinned_host;
	struct gpucmd_memory_usage pinned_host;
	/* 0: the backend could not say how much is free (not a full device). */
	int has_device_free_memory;
	/* As in struct gpucmd_info. */
	char device_uuid[48];
	char device_pci_bus_id[32];
};
/* Ask for the memory report (a round trip of its own). */
GPUCMD_EXTERN int gpucmd_memory_report(struct gpucmd_conn *conn,
				       struct gpucmd_report **out);
/* Free a memory report, its services, streams and pools. */
GPUCMD_EXTERN void gpucmd_report_free(struct gpucmd_report *r);

/*
 * End connections: every one of service (NULL or "": any service), or only
 * connection_id (0: any); at least one of them must be given.  Admins may
 * evict anyone, others only their own service's connections; the caller's
 * own connection is spared.  *count gets how many ended.  A round trip of
 * its own (evict must be the only op of its request).
 */
GPUCMD_EXTERN int gpucmd_evict(struct gpucmd_conn *conn, const char *service,
			       uint64_t connection_id, uint64_t *count);
/*
 * Return the free memory of service (NULL or "": the caller's own, which
 * an observer has not: GPUCMD_EPERM; another needs an admin) to the
 * device; *bytes gets how much went back.
 */
GPUCMD_EXTERN int gpucmd_cleanup(struct gpucmd_conn *conn, const char *service,
				 uint64_t *bytes);

/* Daemon status: version, backend, uptime, counts. */
struct gpucmd_status {
	char version[32];
	char backend[16];
	char device_name[128];
	uint64_t uptime_ms;
	uint32_t services;
	uint32_t connections;
	uint64_t batches; /* batches run since start */
	uint64_t bytes_in_use;
	uint64_t bytes_reserved;
	uint64_t device_total_memory;
};
/* Ask for the daemon's status (a round trip of its own). */
GPUCMD_EXTERN int gpucmd_status(struct gpucmd_conn *conn,
				struct gpucmd_status *out);

#ifdef __cplusplus
}
#endif
