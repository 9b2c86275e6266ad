/*
 * driver.h - the backend interface: everything gpucmdd asks of a device.
 *
 * A backend is one table of functions (struct driver_ops) plus its private
 * state behind struct driver.  Two exist: host (driver/host.c, runs
 * everywhere: "device" memory is host memory and every stream is a worker
 * thread) and cuda (driver/cuda.c, the CUDA driver API through dlopen).
 *
 * Threads: every function here is called from the device thread only.
 * Completion callbacks registered with host_callback run on a backend
 * thread (a host stream worker, or CUDA's callback thread), or, on the host
 * backend when the stream is quiet, at once on the device thread inside
 * host_callback itself; either way they must not call back into the
 * driver or block, only hand work to the device thread.
 *
 * Device addresses are uint64_t (CUdeviceptr on CUDA, a host pointer cast on
 * the host backend).  Every function returns 0 or a negative GPUCMD_E* code;
 * when a function fails it writes a sentence for the client into the
 * driver's error buffer (driver_last_error).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct driver;
struct driver_stream;
struct driver_event;
struct driver_module;
struct driver_function;
struct driver_graph;

/* What a device tells about itself. */
struct driver_properties {
	char name[128];
	char backend[16]; /* "host" or "cuda" */
	/*
	 * Which GPU, in the forms nvidia-smi prints ("" where the backend
	 * has none): "GPU-" and the UUID, and the PCI bus id
	 * "0000:3b:00.0".  Ordinals change with CUDA_VISIBLE_DEVICES and
	 * CUDA_DEVICE_ORDER; these do not.
	 */
	char uuid[48];
	char pci_bus_id[32];
	uint64_t total_memory;	/* bytes the device can hand out */
	uint64_t max_page_size; /* sizes the pool layouts (total / 4) */
	uint64_t alignment;	/* offset alignment of buffers */
	uint32_t max_threads_per_block;
	uint32_t max_grid[3];
	uint32_t max_block[3];
	uint32_t max_shared_bytes;
	/*
	 * A fault leaves the device unusable for everyone (CUDA's sticky
	 * errors): the daemon must restart rather than carry on.
	 */
	bool fault_is_fatal;
	/* mem_alloc hands out zeroed memory (the daemon need not zero it). */
	bool mem_alloc_zeroes;
	/*
	 * A copy between the device and pageable host memory returns only
	 * once it is done (CUDA's cuMemcpy*Async do): enqueued behind a
	 * stream's kernels, it would hold the device thread, shared by every
	 * service, until they finish.  The daemon registers (pins) such host
	 * memory before it copies (command_reserve_cpu).
	 */
	bool pageable_copies_block;
	/*
	 * A graph launch copies the graph's ops onto the stream (the host
	 * backend plays a graph back op by op): launches in flight cost the
	 * daemon memory and device-thread time per op, and are bounded by
	 * their ops (STREAMS_REPLAY_OPS_MAX).  CUDA's cuGraphLaunch does not.
	 */
	bool graph_launch_copies;
};

/* Module formats accepted by module_load. */
enum driver_module_format {
	DRIVER_MODULE_PTX = 1,
	DRIVER_MODULE_CUBIN = 2,
	DRIVER_MODULE_FATBIN = 3,
	DRIVER_MODULE_CUDA_C = 4, /* compiled through NVRTC */
};

/*
 * Called on a backend thread once the stream has run everything enqueued
 * before the callback.  status is 0, or GPUCMD_ESTREAM when work on the stream
 * faulted since the previous callback (the fault is then cleared and the
 * stream keeps running later work).
 */
typedef void (*driver_callback_fn)(void *arg, int status);

/* A 2D copy: height rows of width bytes, each side with its own pitch. */
struct driver_copy2d {
	size_t width;
	size_t height;
	size_t src_pitch;
	size_t dst_pitch;
};

struct driver_ops {
	const char *name;

	/* Open the device (index) and fill *props; 0 or an error. */
	int (*open)(struct driver *d, int device,
		    struct driver_properties *props);
	/* Close the device and free d; streams must already be destroyed. */
	void (*close)(struct driver *d);

	int (*stream_create)(struct driver *d, struct driver_stream **out);
	/* Destroy a stream whose work has completed (a callback fired). */
	void (*stream_destroy)(struct driver *d, struct driver_stream *s);

	int (*event_create)(struct driver *d, struct driver_event **out);
	void (*event_destroy)(struct driver *d, struct driver_event *e);
	/* Capture in e the work enqueued on s so far. */
	int (*event_record)(struct driver *d, struct driver_event *e,
			    struct driver_stream *s);
	/* Make s wait, on the device, for the work e captured when recorded. */
	int (*event_wait)(struct driver *d, struct driver_stream *s,
			  struct driver_event *e);
	/* 1 when the captured work has completed, 0 when not yet. */
	int (*event_query)(struct driver *d, struct driver_event *e);
	/* Device time in milliseconds between two completed events. */
	int (*event_elapsed)(struct driver *d, struct driver_event *start,
			     struct driver_event *end, float *ms);

	/*
	 * Start the work enqueued on s since the last flush.  The device
	 * thread calls it once at the end of each batch, so a backend may
	 * gather a batch's ops and hand them over at once (optional: NULL
	 * means every enqueue starts at once).  event_record and
	 * host_callback must start what they follow on their own, since
	 * another stream or a completion may be waiting on them.
	 */
	void (*flush)(struct driver *d, struct driver_stream *s);

	/* Run fn(arg, status) after everything enqueued on s so far. */
	int (*host_callback)(struct driver *d, struct driver_stream *s,
			     driver_callback_fn fn, void *arg);

	/* Device memory: GPUCMD_ENOMEM when the device has no room. */
	int (*mem_alloc)(struct driver *d, uint64_t size, uint64_t *ptr);
	void (*mem_free)(struct driver *d, uint64_t ptr);
	/* Free and total device memory now (others' use included on CUDA). */
	int (*mem_info)(struct driver *d, uint64_t *free_bytes,
			uint64_t *total_bytes);
	/* Pinned (page-locked) host memory. */
	int (*host_alloc)(struct driver *d, size_t size, void **ptr);
	void (*host_free)(struct driver *d, void *ptr);
	/* Pin existing host memory (a shared region) / undo it. */
	int (*host_register)(struct driver *d, void *ptr, size_t size);
	/* Any thread (the loop frees read staging after the reply). */
	void (*host_unregister)(struct driver *d, void *ptr);

	/* Asynchronous copies on s.  Host memory must stay valid until then. */
	int (*copy_htod)(struct driver *d, struct driver_stream *s,
			 uint64_t dst, const void *src, size_t n);
	int (*copy_dtoh)(struct driver *d, struct driver_stream *s, void *dst,
			 uint64_t src, size_t n);
	int (*copy_dtod)(struct driver *d, struct driver_stream *s,
			 uint64_t dst, uint64_t src, size_t n);
	int (*copy_htod_2d)(struct driver *d, struct driver_stream *s,
			    uint64_t dst, const void *src,
			    const struct driver_copy2d *c);
	int (*copy_dtoh_2d)(struct driver *d, struct driver_stream *s,
			    void *dst, uint64_t src,
			    const struct driver_copy2d *c);
	/* Set n bytes at dst to value. */
	int (*memset_d8)(struct driver *d, struct driver_stream *s,
			 uint64_t dst, uint8_t value, size_t n);

	/* Load a module; a compile log goes to log (log_len bytes). */
	int (*module_load)(struct driver *d, enum driver_module_format fmt,
			   const void *data, size_t len,
			   struct driver_module **out, char *log,
			   size_t log_len);
	/*
	 * The same from any thread, beside the device thread: compilation
	 * (NVRTC, the PTX JIT) runs here, off the device thread's hot path.
	 * The failure message goes to err, never to d->error.  Optional:
	 * NULL when the backend cannot load modules anywhere but the device
	 * thread.
	 */
	int (*module_load_shared)(struct driver *d,
				  enum driver_module_format fmt,
				  const void *data, size_t len,
				  struct driver_module **out, char *err,
				  size_t err_len, char *log, size_t log_len);
	/* Any thread; the module's launches must be enqueued already. */
	void (*module_unload)(struct driver *d, struct driver_module *m);
	/*
	 * The device memory m's global variables hold while it is loaded,
	 * read from the image the backend loaded (for CUDA C, what it
	 * compiled).  Optional: NULL, and the cache reads the image the
	 * client sent (module_image.h).
	 */
	uint64_t (*module_static_bytes)(struct driver *d,
					const struct driver_module *m);
	int (*module_function)(struct driver *d, struct driver_module *m,
			       const char *name, struct driver_function **out);
	/* A built-in kernel by name (kernels/builtin.h); GPUCMD_ENOKERNEL. */
	int (*builtin_function)(struct driver *d, const char *name,
				struct driver_function **out);

	/*
	 * Launch f on s.  params[i] points at the value of argument i
	 * (cuLaunchKernel's convention); the values are copied before return.
	 * param_sizes[i] is its size in bytes.
	 */
	int (*launch)(struct driver *d, struct driver_stream *s,
		      struct driver_function *f, const uint32_t grid[3],
		      const uint32_t block[3], uint32_t shared_bytes,
		      void **params, const size_t *param_sizes, size_t nparams);

	/* Graph capture: work enqueued on s between begin and end is recorded. */
	int (*capture_begin)(struct driver *d, struct driver_stream *s);
	int (*capture_end)(struct driver *d, struct driver_stream *s,
			   struct driver_graph **out);
	int (*graph_launch)(struct driver *d, struct driver_graph *g,
			    struct driver_stream *s);
	void (*graph_destroy)(struct driver *d, struct driver_graph *g);
};

/* Common head of every backend's state; a backend embeds it first. */
struct driver {
	const struct driver_ops *ops;
	struct driver_properties props;
	char error[512]; /* last failure, for the client */
};

/* Backend options from the command line / config. */
struct driver_options {
	int device; /* device index */
	/*
	 * The device by "GPU-" UUID (or a unique prefix of it) or PCI bus
	 * id instead of device ("": by index); driver_cuda_create resolves
	 * it into device.
	 */
	const char *device_id;
	uint64_t host_memory; /* host backend: bytes of "device" memory */
	uint64_t
		host_fail_alloc_at; /* host backend test hook: fail the Nth mem_alloc (0 = never) */
	unsigned
		spin_us; /* host backend: a stream worker's spin before it sleeps (spin.h) */
	unsigned
		stream_nice; /* host backend: stream workers run this much nicer (0-19) */
	unsigned
		test_compile_delay_ms; /* host backend test hook: module_load_shared sleeps this long */
};

/* The host backend (driver/host.c). */
int driver_host_create(const struct driver_options *opt, struct driver **out);
/* The CUDA backend (driver/cuda.c); GPUCMD_EUNSUPPORTED when not built. */
int driver_cuda_create(struct driver_options *opt, struct driver **out,
		       char *why, size_t why_len);

/** Last error sentence of d ("" when none). */
static inline const char *driver_last_error(const struct driver *d)
{
	return d->error;
}
