/*
 * command.h - one unit of work against the device: the seed's Command
 * (../shared/seed/command-api.txt), one C function per method.
 *
 * A command is built per operation, never held: command_init takes the
 * context (driver, kernel cache), the streams that resolve produced (resolving
 * is what ordered the current stream behind the owners of the buffers), and
 * the service it runs for.  Hold this file beside the seed: every method is
 * here, in the seed's order, with the seed's errors.
 *
 *   seed                    here
 *   new                     command_init
 *   stream                  command_stream
 *   resource                command_resource
 *   memory_usage            command_memory_usage
 *   memory_report           command_memory_report
 *   memory_cleanup          command_memory_cleanup
 *   flush_drops             command_flush_drops
 *   allocation_mode         command_allocation_mode
 *   install_memory_pools    command_install_memory_pools
 *   reserve                 command_reserve
 *   cursor                  command_cursor
 *   empty                   command_empty
 *   bind                    command_bind
 *   reserve_cpu             command_reserve_cpu
 *   read_async              command_read_async
 *   write_to_cpu            command_write_to_cpu
 *   write_to_gpu            command_write_to_gpu
 *   create_with_data        command_create_with_data
 *   sync                    command_sync
 *   kernel                  command_kernel
 *
 * Futures: read_async and sync do not wait.  They enqueue their work and set
 * cmd->fence; the executor answers the batch once the driver signals that
 * the stream passed the batch's end (the seed's future, resolved without a
 * blocked thread).
 *
 * Errors: every method returns 0 or a negative GPUCMD_E* code and, on
 * failure, leaves a sentence with the numbers in cmd->msg.
 *
 * Thread: the device thread only.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "driver/driver.h"
#include "memory/memory_manager.h"
#include "streams.h"

struct service;
struct handle;
struct pinned_pool;
struct module_cache;

/*
 * What commands share: the device (which holds the compiled kernels: the
 * built-ins are loaded once by the backend) and its memory properties.
 */
struct command_ctx {
	struct driver *driver;
	struct memory_device_properties props;
	struct pinned_pool *pinned;   /* reserve_cpu's pool */
	struct module_cache *modules; /* loaded device code, shared */
	/*
	 * The executor's live connections (their stream sets, linked by
	 * next): an allocation the device cannot satisfy takes back the
	 * memory other connections keep reserved with nothing live in it.
	 */
	struct stream_set *const *sets;
};

/* The seed's BufferBinding resolved to device memory. */
struct device_resource {
	uint64_t ptr;  /* device address of the binding's first byte */
	uint64_t size; /* bytes of the allocation */
	struct handle *handle;
};

/*
 * The seed's CopyDescriptor: a handle, a byte offset into it, and a
 * row-major layout.  rank 0 means rank 1 with shape {len} (plain bytes).
 */
#define COMMAND_MAX_RANK 8
struct copy_descriptor {
	uint64_t handle;
	uint64_t offset;
	uint32_t rank;
	uint64_t shape[COMMAND_MAX_RANK];
	uint64_t strides[COMMAND_MAX_RANK]; /* in elements */
	uint32_t elem_size;
};

/* The seed's ManagedMemoryHandle: reserved memory and the stream whose pools hold it. */
struct managed_memory {
	struct memory_alloc alloc;
	struct stream *origin;
	uint64_t reused; /* taken off origin->ordered_free */
};

/* Host memory from reserve_cpu: pinned when the pool served it. */
struct host_bytes {
	void *data;
	size_t len;
	bool pinned;
	bool registered;	    /* heap pages pinned by host_register */
	struct memory_slice *slice; /* the pinned pool's, when pinned */
};

struct command {
	struct command_ctx *ctx;
	struct stream_set *set;
	struct stream *current;
	uint64_t cursor;
	struct service *service;
	bool fence; /* read_async/sync asked for the batch's fence */
	char msg[768];
};

/** new: a command against ctx over the streams resolved, for service. */
void command_init(struct command *cmd, struct command_ctx *ctx,
		  const struct resolved *resolved, struct service *service);
/**
 * Live bytes of svc held by connections that are gone, whose queued work
 * has still to run before their memory goes back (for messages).
 */
uint64_t command_closing_live(const struct command_ctx *ctx,
			      const struct service *svc);
/** stream: the stream this command is issued on. */
struct stream *command_stream(struct command *cmd);
/**
 * resource: the allocation handle names, looked up in the connection's
 * table and resolved on the stream that created it.  GPUCMD_ENOTFOUND.
 */
int command_resource(struct command *cmd, uint64_t handle,
		     struct device_resource *out);
/** memory_usage: the current stream's device memory usage. */
void command_memory_usage(struct command *cmd, struct memory_usage *out);
/**
 * memory_report: per-pool report of the current stream's device memory;
 * writes up to max pools, returns how many there are.
 */
size_t command_memory_report(struct command *cmd,
			     struct memory_pool_report *out, size_t max);
/** memory_cleanup: release everything the current stream holds that nothing needs. */
void command_memory_cleanup(struct command *cmd);
/**
 * flush_drops: free what the device is known to be done with.  Deferred
 * while the stream records a graph; the capture window drains it on close.
 */
void command_flush_drops(struct command *cmd);
/** allocation_mode: set (nest) the current stream's allocation mode. */
void command_allocation_mode(struct command *cmd,
			     enum memory_allocation_mode mode);
/**
 * install_memory_pools: rebuild the current stream's pools with config,
 * keeping the old layout when something lives in them (GPUCMD_EPOOLSINUSE).
 * Once installed, it is also the layout of the connection's later streams.
 * Presets are sized from the device, with pages scaled to the service's
 * quota (streams_layout_props).
 */
int command_install_memory_pools(struct command *cmd,
				 const struct memory_configuration *config);
/**
 * reserve: size bytes on the current stream.  GPUCMD_ETOOBIG when no pool,
 * or no device of this size, could ever fit it; GPUCMD_EQUOTA over the service's limit; any other
 * failure is retried once after a cleanup.
 */
/**
 * Give back a reservation that nothing was bound to (its memory goes back
 * to the pools at once, and its charge and reuse count are undone).
 */
void command_unreserve(struct command *cmd, const struct managed_memory *m);
int command_reserve(struct command *cmd, uint64_t size,
		    struct managed_memory *out);
/** cursor: the current stream's cursor. */
uint64_t command_cursor(const struct command *cmd);
/** empty: allocate size bytes and name them handle. */
int command_empty(struct command *cmd, uint64_t size, uint64_t handle);
/**
 * bind: give the reservation's storage to handle new.  GPUCMD_EINVAL when
 * the reservation holds no storage; GPUCMD_EEXIST / GPUCMD_ELIMIT from the
 * handle table.  On failure the reservation is still the caller's.
 */
int command_bind(struct command *cmd, const struct managed_memory *reserved,
		 uint64_t new_handle);
/**
 * reserve_cpu: size bytes of host memory, pinned when the pool can serve it,
 * else heap (pinned by host_register where pageable copies would block:
 * driver_properties.pageable_copies_block).  Answers with a buffer of the
 * size asked for unless the host itself is out of memory (then data is
 * NULL).
 */
void command_reserve_cpu(struct command *cmd, size_t size,
			 struct stream *origin, struct host_bytes *out);
/**
 * command_reserve_cpu for bytes no copy will use: the pool when it can
 * serve, else plain heap (never pinned by host_register).
 */
void command_reserve_cpu_unpinned(struct command *cmd, size_t size,
				  struct host_bytes *out);
/** Give back what command_reserve_cpu returned (any thread). */
void command_free_cpu(struct command_ctx *ctx, struct host_bytes *bytes);
/**
 * read_async: copy each descriptor's device memory into fresh host bytes;
 * the bytes are valid once the batch's fence has passed (cmd->fence set).
 * On failure the bytes already reserved are freed.
 */
int command_read_async(struct command *cmd, const struct copy_descriptor *descs,
		       size_t n, struct host_bytes *out);
/**
 * write_to_cpu: enqueue a copy of the descriptor's device memory into
 * bytes, on stream (NULL: the current stream).
 */
int command_write_to_cpu(struct command *cmd,
			 const struct copy_descriptor *desc,
			 struct host_bytes *bytes, struct stream *stream);
/**
 * write_to_gpu: enqueue a copy of data into the descriptor's device memory.
 * data must stay valid until the batch's fence has passed.
 */
int command_write_to_gpu(struct command *cmd,
			 const struct copy_descriptor *desc, const void *data,
			 size_t len);
/** create_with_data: allocate len bytes named handle and copy data in. */
int command_create_with_data(struct command *cmd, const void *data, size_t len,
			     uint64_t handle);
/** sync: the batch answers once everything enqueued on the stream ran. */
int command_sync(struct command *cmd);
/**
 * kernel: enqueue an already-compiled kernel.  The driver's refusal is
 * returned whether or not a profile is open.
 */
int command_kernel(struct command *cmd, struct driver_function *kernel,
		   const uint32_t grid[3], const uint32_t block[3],
		   uint32_t shared_bytes, void **params,
		   const size_t *param_sizes, size_t nparams);

/**
 * Check a copy descriptor against the pitched row-major rule and the
 * allocation's size: 0, GPUCMD_ESTRIDES or GPUCMD_EINVAL (msg says why).
 * *span gets the bytes the layout covers from the offset, *dense the bytes
 * of host data it takes.
 */
int command_check_layout(const struct copy_descriptor *desc, uint64_t size,
			 uint64_t *span, uint64_t *dense, char *msg,
			 size_t msg_len);
