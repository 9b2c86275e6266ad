/*
 * libcuda.c - a fake NVIDIA driver library (libcuda.so.1) that runs on the
 * host, so that CI, which has no GPU, exercises the CUDA backend
 * (daemon/driver/cuda.c): `gpucmdd --backend cuda` with LD_LIBRARY_PATH
 * pointing at $(BUILD)/fakecuda loads this instead of the driver.
 *
 * It implements exactly the entry points of daemon/driver/cuda_api.h, under
 * the same (versioned) symbol names, and no more: a call cuda.c adds without
 * adding it here makes dlsym fail, and the test says so.
 *
 * The model, kept as close to the documented driver behaviour as cheap:
 *
 *  - One device ("gpucmd fake CUDA device", compute capability 9.0, 8 GiB or
 *    $FAKECUDA_TOTAL_MB), or $FAKECUDA_DEVICES alike (at most 16) with one
 *    context between them.  Device N's UUID is
 *    GPU-facec0da-0000-0000-0000-0000000000NN (hex) and its PCI bus id
 *    0000:NN:00.0 with NN = 0x3B + N, in upper case as the driver has
 *    it.  Device memory is host memory from mmap (lazy, so a page of 2 GiB
 *    costs nothing until touched), and a CUdeviceptr is its
 *    address.  cuMemGetInfo counts what cuMemAlloc handed out; allocating
 *    past the total is CUDA_ERROR_OUT_OF_MEMORY.  Copies and built-in kernels
 *    check that device ranges lie inside one allocation: a copy that does
 *    not is refused (CUDA_ERROR_INVALID_VALUE), a kernel that does not
 *    faults (CUDA_ERROR_ILLEGAL_ADDRESS, sticky), as on a GPU.
 *  - Every stream is a worker thread that runs its queue in order.  Stream
 *    callbacks and host functions run on that thread, never inside the
 *    call that enqueued them, and any driver call made from one fails with
 *    CUDA_ERROR_NOT_PERMITTED (the driver forbids them there).
 *  - The current context is per thread, as in the driver: calls that
 *    allocate, free or create need it (else CUDA_ERROR_INVALID_CONTEXT).
 *    Calls on a stream or an event handle do not.
 *  - Pageable host memory: a copy from it is staged at the call (the caller
 *    may reuse the source at once), a copy into it waits until done, as
 *    the driver documents.  Pinned memory (cuMemHostAlloc, registered
 *    ranges) is copied asynchronously, on the stream's thread.
 *    cuMemHostRegister of more than $FAKECUDA_REGISTER_MAX_MB (when set)
 *    is CUDA_ERROR_OUT_OF_MEMORY, as when the driver cannot pin that much.
 *  - Events carry a timestamp taken when the stream reaches them.  A
 *    never-recorded event is complete.  An event recorded during a
 *    capture is "captured": querying or waiting on it outside the capture
 *    is CUDA_ERROR_CAPTURED_EVENT.
 *  - Capture records the stream's copies, memsets, launches and host
 *    functions into the graph instead of running them; a graph launch
 *    replays them in order as one item of the stream.  cuStreamAddCallback
 *    during a capture is CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, a wait on
 *    an event from outside the capture CUDA_ERROR_STREAM_CAPTURE_ISOLATION.
 *  - Modules: any image loads.  A PTX image (text) must have a .version
 *    directive (else CUDA_ERROR_INVALID_PTX with a line in the JIT log), and
 *    cuModuleGetFunction finds only its ".entry NAME" kernels (else
 *    CUDA_ERROR_NOT_FOUND); a cubin or fatbin has every name.
 *  - Kernels: the daemon's built-ins (kernels/builtin.h) and add_one (the
 *    tests' own PTX kernel: p[i] += 1 for i < n) are interpreted by name,
 *    reading kernelParams by their signature, which cuFuncGetParamInfo
 *    describes.  Launching any other function succeeds and does nothing,
 *    and cuFuncGetParamInfo knows nothing of it (CUDA_ERROR_NOT_SUPPORTED).
 *    fault() ends with CUDA_ERROR_LAUNCH_FAILED, which is sticky: every
 *    later call returns it, stream callbacks get it as their status, and
 *    host functions are no longer called.
 *  - Built with FAKECUDA_NO_PARAM_INFO (fakecuda.mk's cuda-12.2 copy) it
 *    is a driver older than CUDA 12.4: cuFuncGetParamInfo is not exported
 *    at all, and the backend must check launches by what the module image
 *    declares.
 *  - Not modelled: the legacy NULL stream's implicit synchronisation (the
 *    NULL stream is one more stream), per-thread default streams, more than
 *    one context, peer access, timing of anything.
 */
#include "driver/cuda_api.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

/* Not in cuda_api.h: the daemon never needs to name them. */
#define FAKE_ERROR_NOT_INITIALIZED ((CUresult)3)
#define FAKE_EVENT_DISABLE_TIMING 2u

#define FAKE_DEFAULT_TOTAL (8ull << 30)
#define FAKE_DEFAULT_SHARED (48 * 1024)
#define FAKE_OPTIN_SHARED (227 * 1024)
#define FAKE_MAX_ARGS 8

/* ---- state ------------------------------------------------------------- */

/* One range of memory: a device allocation or pinned host memory. */
struct fake_range {
	uintptr_t base;
	size_t size;
	bool host_alloc; /* from cuMemHostAlloc (else registered) */
	struct fake_range *next;
};

struct CUctx_st {
	int refs; /* primary context retains */
};

/* A kernel the fake knows how to run: its argument kinds and its body. */
struct fake_kernel {
	const char *name;
	const char *signature; /* 'p' pointer, 'u' u32, 'U' u64, 'f' f32 */
	CUresult (*run)(const uint64_t *args);
};

struct CUfunc_st {
	const struct fake_kernel *kernel; /* NULL: launches do nothing */
	int max_dynamic_shared;
	struct CUfunc_st *next; /* in its module */
	char name[];
};

struct CUmod_st {
	char *ptx; /* the PTX text; NULL for a binary image */
	struct CUfunc_st *functions;
};

enum fake_op_kind {
	FAKE_OP_COPY,
	FAKE_OP_COPY2D,
	FAKE_OP_MEMSET,
	FAKE_OP_KERNEL,
	FAKE_OP_CALLBACK,
	FAKE_OP_HOST_FN,
	FAKE_OP_RECORD,
	FAKE_OP_WAIT,
	FAKE_OP_GRAPH,
	FAKE_OP_EXIT,
};

/* One item of a stream's queue or of a graph. */
struct fake_op {
	enum fake_op_kind kind;
	struct fake_op *next;
	union {
		struct {
			void *dst;
			const void *src;
			size_t n;
		} copy;
		struct {
			char *dst;
			const char *src;
			size_t dpitch, spitch, width, height;
		} copy2d;
		struct {
			void *dst;
			unsigned char value;
			size_t n;
		} memset;
		struct {
			CUfunction fn;
			uint64_t args[FAKE_MAX_ARGS];
		} kernel;
		struct {
			CUstream stream;
			CUstreamCallback fn;
			void *user;
		} callback;
		struct {
			CUhostFn fn;
			void *user;
		} host_fn;
		struct {
			CUevent event;
			unsigned long seq;
		} event;
		CUgraphExec graph;
	} u;
	void *bounce; /* staged pageable source, freed after */
};

struct CUgraph_st {
	struct fake_op *head, *tail;
};

struct CUgraphExec_st {
	struct fake_op *ops;
	int launches;	/* queued or running */
	bool destroyed; /* freed when the last launch ends */
};

struct CUevent_st {
	unsigned int flags;
	unsigned long recorded; /* records enqueued */
	unsigned long done;	/* records the stream reached */
	bool captured;		/* last recorded during a capture */
	struct timespec when;
};

struct CUstream_st {
	pthread_t thread;
	pthread_cond_t wake;
	struct fake_op *head, *tail;
	struct CUgraph_st *capture; /* non-NULL while capturing */
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t changed; /* an op ended: pending, events */
	bool initialized;
	int ndevices; /* $FAKECUDA_DEVICES, 1 to 16 (default 1) */
	size_t total;
	size_t used;
	struct fake_range *device;
	struct fake_range *host;
	unsigned long pending; /* ops queued on every stream, not yet done */
	CUstream null_stream;
	/*
	 * Destroyed streams' threads: exiting counts those told to end that
	 * have not ended yet, ended lists the ones to join.  The last context
	 * release joins them, so no thread is still on its way out when the
	 * process exits (LeakSanitizer's tracer can crash on one that is).
	 */
	unsigned long exiting;
	struct fake_ended {
		pthread_t thread;
		struct fake_ended *next;
	} *ended;
} fake = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.changed = PTHREAD_COND_INITIALIZER,
};

/* The sticky error, read without the lock by the stream threads. */
static int fake_sticky;
static struct CUctx_st fake_ctx;
static _Thread_local CUcontext fake_current;
static _Thread_local bool fake_in_callback;

static CUresult fake_sticky_get(void)
{
	return (CUresult)__atomic_load_n(&fake_sticky, __ATOMIC_ACQUIRE);
}

static void fake_sticky_set(CUresult r)
{
	int none = 0;

	__atomic_compare_exchange_n(&fake_sticky, &none, (int)r, false,
				    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/*
 * The checks at the top of every entry point: initialised, not inside a
 * stream callback, a current context when the call needs one, and no sticky
 * error.  Returns CUDA_SUCCESS or the error the call must return.
 */
static CUresult fake_enter(const char *call, bool need_ctx)
{
	CUresult sticky;

	if (!fake.initialized)
		return FAKE_ERROR_NOT_INITIALIZED;
	if (fake_in_callback) {
		fprintf(stderr,
			"fakecuda: %s called from a stream callback or "
			"host function, which the driver forbids\n",
			call);
		return CUDA_ERROR_NOT_PERMITTED;
	}
	if (need_ctx && fake_current == NULL) {
		fprintf(stderr,
			"fakecuda: %s called on a thread with no "
			"current context\n",
			call);
		return CUDA_ERROR_INVALID_CONTEXT;
	}
	sticky = fake_sticky_get();
	return sticky;
}

#define FAKE_ENTER(need_ctx)                                        \
	do {                                                        \
		CUresult enter_ = fake_enter(__func__, (need_ctx)); \
		if (enter_ != CUDA_SUCCESS)                         \
			return enter_;                              \
	} while (0)

/* ---- ranges ------------------------------------------------------------ */

/* The range of list holding [p, p + n), or NULL.  Under the lock. */
static struct fake_range *fake_range_find(struct fake_range *list, uintptr_t p,
					  size_t n)
{
	for (struct fake_range *r = list; r; r = r->next)
		if (p >= r->base && p - r->base <= r->size &&
		    n <= r->size - (p - r->base))
			return r;
	return NULL;
}

/* Whether [p, p + n) is inside one device allocation. */
static bool fake_device_ok(uint64_t p, size_t n)
{
	bool ok;

	pthread_mutex_lock(&fake.lock);
	ok = fake_range_find(fake.device, (uintptr_t)p, n) != NULL;
	pthread_mutex_unlock(&fake.lock);
	return ok;
}

/* Whether [p, p + n) is pinned host memory. */
static bool fake_pinned(const void *p, size_t n)
{
	bool ok;

	pthread_mutex_lock(&fake.lock);
	ok = fake_range_find(fake.host, (uintptr_t)p, n) != NULL;
	pthread_mutex_unlock(&fake.lock);
	return ok;
}

/* ---- kernels ----------------------------------------------------------- */

static CUresult fake_k_fill_u32(const uint64_t *a)
{
	uint32_t *buf = (uint32_t *)(uintptr_t)a[0];
	uint32_t n = (uint32_t)a[2];

	if (n && !fake_device_ok(a[0], (size_t)n * 4))
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	for (uint32_t i = 0; i < n; i++)
		buf[i] = (uint32_t)a[1];
	return CUDA_SUCCESS;
}

static CUresult fake_k_copy(const uint64_t *a)
{
	if (a[2] == 0)
		return CUDA_SUCCESS;
	if (!fake_device_ok(a[0], a[2]) || !fake_device_ok(a[1], a[2]))
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	memmove((void *)(uintptr_t)a[0], (void *)(uintptr_t)a[1], a[2]);
	return CUDA_SUCCESS;
}

static float fake_f32(uint64_t bits)
{
	uint32_t u = (uint32_t)bits;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static CUresult fake_k_add_f32(const uint64_t *a)
{
	float *o = (float *)(uintptr_t)a[0];
	const float *x = (const float *)(uintptr_t)a[1];
	const float *y = (const float *)(uintptr_t)a[2];
	uint32_t n = (uint32_t)a[3];

	if (n && (!fake_device_ok(a[0], (size_t)n * 4) ||
		  !fake_device_ok(a[1], (size_t)n * 4) ||
		  !fake_device_ok(a[2], (size_t)n * 4)))
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	for (uint32_t i = 0; i < n; i++)
		o[i] = x[i] + y[i];
	return CUDA_SUCCESS;
}

static CUresult fake_k_scale_f32(const uint64_t *a)
{
	float *buf = (float *)(uintptr_t)a[0];
	float factor = fake_f32(a[1]);
	uint32_t n = (uint32_t)a[2];

	if (n && !fake_device_ok(a[0], (size_t)n * 4))
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	for (uint32_t i = 0; i < n; i++)
		buf[i] *= factor;
	return CUDA_SUCCESS;
}

static CUresult fake_k_saxpy_f32(const uint64_t *a)
{
	float *y = (float *)(uintptr_t)a[0];
	const float *x = (const float *)(uintptr_t)a[1];
	float alpha = fake_f32(a[2]);
	uint32_t n = (uint32_t)a[3];

	if (n && (!fake_device_ok(a[0], (size_t)n * 4) ||
		  !fake_device_ok(a[1], (size_t)n * 4)))
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	for (uint32_t i = 0; i < n; i++)
		y[i] = alpha * x[i] + y[i];
	return CUDA_SUCCESS;
}

static CUresult fake_k_reduce_sum_f32(const uint64_t *a)
{
	const float *in = (const float *)(uintptr_t)a[1];
	uint32_t n = (uint32_t)a[2];
	double sum = 0;

	if (!fake_device_ok(a[0], 4) ||
	    (n && !fake_device_ok(a[1], (size_t)n * 4)))
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	for (uint32_t i = 0; i < n; i++)
		sum += in[i];
	*(float *)(uintptr_t)a[0] = (float)sum;
	return CUDA_SUCCESS;
}

static CUresult fake_k_spin(const uint64_t *a)
{
	uint32_t usec = (uint32_t)a[0];
	struct timespec end;

	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += usec / 1000000u;
	end.tv_nsec += (long)(usec % 1000000u) * 1000;
	if (end.tv_nsec >= 1000000000) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000;
	}
	/* Sleeping, not spinning: CI machines have few cores. */
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &end, NULL) ==
	       EINTR)
		;
	return CUDA_SUCCESS;
}

static CUresult fake_k_fault(const uint64_t *a)
{
	(void)a;
	/* __trap() in builtin.cu: the launch fails, the context is lost. */
	return CUDA_ERROR_LAUNCH_FAILED;
}

static CUresult fake_k_add_one(const uint64_t *a)
{
	uint32_t *p = (uint32_t *)(uintptr_t)a[0];
	uint32_t n = (uint32_t)a[1];

	if (n && !fake_device_ok(a[0], (size_t)n * 4))
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	for (uint32_t i = 0; i < n; i++)
		p[i] += 1;
	return CUDA_SUCCESS;
}

static const struct fake_kernel fake_kernels[] = {
	{ "fill_u32", "puu", fake_k_fill_u32 },
	{ "copy", "ppU", fake_k_copy },
	{ "add_f32", "pppu", fake_k_add_f32 },
	{ "scale_f32", "pfu", fake_k_scale_f32 },
	{ "saxpy_f32", "ppfu", fake_k_saxpy_f32 },
	{ "reduce_sum_f32", "ppu", fake_k_reduce_sum_f32 },
	{ "spin", "u", fake_k_spin },
	{ "fault", "", fake_k_fault },
	{ "add_one", "pu", fake_k_add_one },
};

static const struct fake_kernel *fake_kernel_find(const char *name)
{
	for (size_t i = 0; i < sizeof(fake_kernels) / sizeof(fake_kernels[0]);
	     i++)
		if (strcmp(fake_kernels[i].name, name) == 0)
			return &fake_kernels[i];
	return NULL;
}

/* ---- running ops ------------------------------------------------------- */

static void fake_graph_exec_free(CUgraphExec g);

static void fake_ops_free(struct fake_op *op)
{
	while (op) {
		struct fake_op *next = op->next;

		free(op->bounce);
		free(op);
		op = next;
	}
}

/* Run one op on a stream's thread (no lock held). */
static void fake_op_run(struct fake_op *op)
{
	CUresult sticky = fake_sticky_get();
	CUresult r;

	switch (op->kind) {
	case FAKE_OP_COPY:
		if (!sticky)
			memmove(op->u.copy.dst, op->u.copy.src, op->u.copy.n);
		break;
	case FAKE_OP_COPY2D:
		for (size_t y = 0; !sticky && y < op->u.copy2d.height; y++)
			memmove(op->u.copy2d.dst + y * op->u.copy2d.dpitch,
				op->u.copy2d.src + y * op->u.copy2d.spitch,
				op->u.copy2d.width);
		break;
	case FAKE_OP_MEMSET:
		if (!sticky)
			memset(op->u.memset.dst, op->u.memset.value,
			       op->u.memset.n);
		break;
	case FAKE_OP_KERNEL:
		if (sticky || !op->u.kernel.fn->kernel)
			break;
		r = op->u.kernel.fn->kernel->run(op->u.kernel.args);
		if (r != CUDA_SUCCESS) {
			fprintf(stderr,
				"fakecuda: kernel %s faulted (%d): the "
				"context is lost\n",
				op->u.kernel.fn->name, (int)r);
			fake_sticky_set(r);
		}
		break;
	case FAKE_OP_CALLBACK:
		/* Called always, with the stream's status (the driver's
		 * promise for cuStreamAddCallback). */
		fake_in_callback = true;
		op->u.callback.fn(op->u.callback.stream, sticky,
				  op->u.callback.user);
		fake_in_callback = false;
		break;
	case FAKE_OP_HOST_FN:
		/* Not called at all once the context has faulted. */
		if (sticky)
			break;
		fake_in_callback = true;
		op->u.host_fn.fn(op->u.host_fn.user);
		fake_in_callback = false;
		break;
	case FAKE_OP_GRAPH:
		for (struct fake_op *g = op->u.graph->ops; g; g = g->next)
			fake_op_run(g);
		pthread_mutex_lock(&fake.lock);
		op->u.graph->launches--;
		if (op->u.graph->destroyed && op->u.graph->launches == 0)
			fake_graph_exec_free(op->u.graph);
		pthread_mutex_unlock(&fake.lock);
		break;
	case FAKE_OP_RECORD:
	case FAKE_OP_WAIT:
	case FAKE_OP_EXIT:
		break;
	}
}

/* A stream's thread: runs its queue in order until FAKE_OP_EXIT. */
static void *fake_stream_main(void *arg)
{
	CUstream s = arg;
	struct fake_ended *end = malloc(sizeof(*end));
	bool exit = false;

	pthread_mutex_lock(&fake.lock);
	while (!exit) {
		struct fake_op *op;

		while (!s->head)
			pthread_cond_wait(&s->wake, &fake.lock);
		op = s->head;
		s->head = op->next;
		if (!s->head)
			s->tail = NULL;
		switch (op->kind) {
		case FAKE_OP_EXIT:
			exit = true;
			break;
		case FAKE_OP_RECORD:
			clock_gettime(CLOCK_MONOTONIC,
				      &op->u.event.event->when);
			if (op->u.event.seq > op->u.event.event->done)
				op->u.event.event->done = op->u.event.seq;
			break;
		case FAKE_OP_WAIT:
			while (op->u.event.event->done < op->u.event.seq &&
			       !fake_sticky_get())
				pthread_cond_wait(&fake.changed, &fake.lock);
			break;
		default:
			pthread_mutex_unlock(&fake.lock);
			fake_op_run(op);
			pthread_mutex_lock(&fake.lock);
			break;
		}
		free(op->bounce);
		free(op);
		fake.pending--;
		pthread_cond_broadcast(&fake.changed);
	}
	if (end) {
		end->thread = s->thread;
		end->next = fake.ended;
		fake.ended = end;
	} else {
		pthread_detach(s->thread);
	}
	fake.exiting--;
	pthread_cond_broadcast(&fake.changed);
	pthread_mutex_unlock(&fake.lock);
	pthread_cond_destroy(&s->wake);
	free(s);
	return NULL;
}

/* A new op of kind, or NULL. */
static struct fake_op *fake_op_new(enum fake_op_kind kind)
{
	struct fake_op *op = calloc(1, sizeof(*op));

	if (op)
		op->kind = kind;
	return op;
}

static CUstream fake_stream_of(CUstream s)
{
	return s ? s : fake.null_stream;
}

/*
 * Queue op on stream s, or append it to the graph s is capturing.  Takes
 * op (frees it on failure).
 */
/* Queue op on stream s (resolved), or into its capture; fake.lock held. */
static void fake_enqueue_locked(CUstream s, struct fake_op *op)
{
	if (s->capture) {
		struct CUgraph_st *g = s->capture;

		if (g->tail)
			g->tail->next = op;
		else
			g->head = op;
		g->tail = op;
	} else {
		if (s->tail)
			s->tail->next = op;
		else
			s->head = op;
		s->tail = op;
		fake.pending++;
		pthread_cond_signal(&s->wake);
	}
}

static CUresult fake_enqueue(CUstream s, struct fake_op *op)
{
	s = fake_stream_of(s);
	pthread_mutex_lock(&fake.lock);
	fake_enqueue_locked(s, op);
	pthread_mutex_unlock(&fake.lock);
	return CUDA_SUCCESS;
}

/* Whether stream s is capturing. */
static bool fake_capturing(CUstream s)
{
	bool c;

	s = fake_stream_of(s);
	pthread_mutex_lock(&fake.lock);
	c = s->capture != NULL;
	pthread_mutex_unlock(&fake.lock);
	return c;
}

/* Wait until everything queued on every stream has run. */
static void fake_drain(void)
{
	pthread_mutex_lock(&fake.lock);
	while (fake.pending)
		pthread_cond_wait(&fake.changed, &fake.lock);
	pthread_mutex_unlock(&fake.lock);
}

/*
 * A copy into pageable host memory returns only once done (the driver's
 * documented behaviour): queue a record of a private event and wait for it.
 */
static CUresult fake_wait_stream(CUstream s)
{
	struct CUevent_st ev = { 0 };
	struct fake_op *op = fake_op_new(FAKE_OP_RECORD);

	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ev.recorded = 1;
	op->u.event.event = &ev;
	op->u.event.seq = 1;
	fake_enqueue(s, op);
	pthread_mutex_lock(&fake.lock);
	while (ev.done < 1)
		pthread_cond_wait(&fake.changed, &fake.lock);
	pthread_mutex_unlock(&fake.lock);
	return fake_sticky_get();
}

/* ---- errors and init --------------------------------------------------- */

FAKE_EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr)
{
#define FAKE_NAME(name, value)       \
	if (error == (value)) {      \
		*pStr = #name;       \
		return CUDA_SUCCESS; \
	}
	CUDA_API_RESULTS(FAKE_NAME)
#undef FAKE_NAME
	if (error == FAKE_ERROR_NOT_INITIALIZED) {
		*pStr = "CUDA_ERROR_NOT_INITIALIZED";
		return CUDA_SUCCESS;
	}
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

FAKE_EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr)
{
	const char *name;

	if (cuGetErrorName(error, &name) != CUDA_SUCCESS) {
		*pStr = NULL;
		return CUDA_ERROR_INVALID_VALUE;
	}
	/* The name says it; the fake has no prose of its own. */
	*pStr = "reported by the gpucmd fake CUDA driver";
	return CUDA_SUCCESS;
}

static CUresult fake_stream_new(CUstream *out);

FAKE_EXPORT CUresult cuInit(unsigned int Flags)
{
	const char *mb = getenv("FAKECUDA_TOTAL_MB");
	const char *nd = getenv("FAKECUDA_DEVICES");
	CUresult r = CUDA_SUCCESS;

	if (Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fake.lock);
	if (!fake.initialized) {
		fake.total = FAKE_DEFAULT_TOTAL;
		if (mb && atoll(mb) > 0)
			fake.total = (size_t)atoll(mb) << 20;
		fake.ndevices =
			nd && atoi(nd) > 0 && atoi(nd) <= 16 ? atoi(nd) : 1;
	}
	pthread_mutex_unlock(&fake.lock);
	if (!fake.null_stream)
		r = fake_stream_new(&fake.null_stream);
	if (r == CUDA_SUCCESS)
		fake.initialized = true;
	return r;
}

/* ---- device and context ------------------------------------------------ */

FAKE_EXPORT CUresult cuDeviceGetCount(int *count)
{
	FAKE_ENTER(false);
	*count = fake.ndevices;
	return CUDA_SUCCESS;
}

static bool fake_device(CUdevice dev)
{
	return dev >= 0 && dev < fake.ndevices;
}

/* The first byte of the PCI bus number of device 0. */
#define FAKE_PCI_BUS 0x3b

FAKE_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	FAKE_ENTER(false);
	if (!fake_device(ordinal))
		return CUDA_ERROR_INVALID_DEVICE;
	*device = ordinal;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	FAKE_ENTER(false);
	if (!fake_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "gpucmd fake CUDA device");
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	static const unsigned char head[4] = { 0xfa, 0xce, 0xc0, 0xda };

	FAKE_ENTER(false);
	if (!fake_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	memset(uuid->bytes, 0, sizeof(uuid->bytes));
	memcpy(uuid->bytes, head, sizeof(head));
	uuid->bytes[15] = (char)dev;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
	FAKE_ENTER(false);
	if (!fake_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	if (!pciBusId || len < 13)
		return CUDA_ERROR_INVALID_VALUE;
	/* The driver's digits are upper case, "0000:3B:00.0". */
	snprintf(pciBusId, (size_t)len, "0000:%02X:00.0", FAKE_PCI_BUS + dev);
	return CUDA_SUCCESS;
}

/* "[domain:]bus:device.function", in hex, as the driver takes it. */
FAKE_EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
	unsigned dom = 0, bus, d, fn;
	char end;

	FAKE_ENTER(false);
	if (!dev || !pciBusId)
		return CUDA_ERROR_INVALID_VALUE;
	if (sscanf(pciBusId, "%x:%x:%x.%x%c", &dom, &bus, &d, &fn, &end) != 4 &&
	    (dom = 0, sscanf(pciBusId, "%x:%x.%x%c", &bus, &d, &fn, &end)) != 3)
		return CUDA_ERROR_INVALID_VALUE;
	if (dom != 0 || d != 0 || fn != 0 || bus < FAKE_PCI_BUS ||
	    !fake_device((CUdevice)(bus - FAKE_PCI_BUS)))
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = (CUdevice)(bus - FAKE_PCI_BUS);
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib,
					  CUdevice dev)
{
	FAKE_ENTER(false);
	if (!fake_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	/* An H100's numbers. */
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y:
		*pi = 1024;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z:
		*pi = 64;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X:
		*pi = 2147483647;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z:
		*pi = 65535;
		break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
		*pi = 9;
		break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
		*pi = 0;
		break;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
		*pi = FAKE_OPTIN_SHARED;
		break;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
	FAKE_ENTER(false);
	if (!fake_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = fake.total;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	FAKE_ENTER(false);
	if (!fake_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&fake.lock);
	fake_ctx.refs++;
	pthread_mutex_unlock(&fake.lock);
	*pctx = &fake_ctx;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
	struct fake_ended *ended = NULL;
	CUresult r = CUDA_SUCCESS;

	/* Works after a fault too: it is how a context is let go. */
	if (!fake.initialized)
		return FAKE_ERROR_NOT_INITIALIZED;
	if (!fake_device(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&fake.lock);
	if (fake_ctx.refs <= 0)
		r = CUDA_ERROR_INVALID_CONTEXT;
	else
		fake_ctx.refs--;
	if (fake_ctx.refs == 0) {
		while (fake.exiting > 0)
			pthread_cond_wait(&fake.changed, &fake.lock);
		ended = fake.ended;
		fake.ended = NULL;
	}
	pthread_mutex_unlock(&fake.lock);
	while (ended) {
		struct fake_ended *next = ended->next;

		pthread_join(ended->thread, NULL);
		free(ended);
		ended = next;
	}
	return r;
}

FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
	if (!fake.initialized)
		return FAKE_ERROR_NOT_INITIALIZED;
	if (ctx && ctx != &fake_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	fake_current = ctx;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxSynchronize(void)
{
	FAKE_ENTER(true);
	fake_drain();
	return fake_sticky_get();
}

/* ---- memory ------------------------------------------------------------ */

FAKE_EXPORT CUresult cuMemGetInfo(size_t *free_bytes, size_t *total)
{
	FAKE_ENTER(true);
	pthread_mutex_lock(&fake.lock);
	*free_bytes = fake.total - fake.used;
	*total = fake.total;
	pthread_mutex_unlock(&fake.lock);
	return CUDA_SUCCESS;
}

/* Map n bytes of zeroed host memory, lazily; NULL when out. */
static void *fake_map(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

FAKE_EXPORT CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
	struct fake_range *r;
	void *p;

	FAKE_ENTER(true);
	if (bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	r = calloc(1, sizeof(*r));
	if (!r)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&fake.lock);
	if (bytesize > fake.total - fake.used) {
		pthread_mutex_unlock(&fake.lock);
		free(r);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	fake.used += bytesize;
	pthread_mutex_unlock(&fake.lock);
	p = fake_map(bytesize);
	pthread_mutex_lock(&fake.lock);
	if (!p) {
		fake.used -= bytesize;
		pthread_mutex_unlock(&fake.lock);
		free(r);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	r->base = (uintptr_t)p;
	r->size = bytesize;
	r->next = fake.device;
	fake.device = r;
	pthread_mutex_unlock(&fake.lock);
	*dptr = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

/* Unlink the range of list that starts at p; NULL when none does. */
static struct fake_range *fake_range_take(struct fake_range **list, uintptr_t p)
{
	for (struct fake_range **rp = list; *rp; rp = &(*rp)->next) {
		struct fake_range *r = *rp;

		if (r->base == p) {
			*rp = r->next;
			return r;
		}
	}
	return NULL;
}

FAKE_EXPORT CUresult cuMemFree(CUdeviceptr dptr)
{
	struct fake_range *r;

	FAKE_ENTER(true);
	/* cuMemFree synchronizes with the device's work first. */
	fake_drain();
	pthread_mutex_lock(&fake.lock);
	r = fake_range_take(&fake.device, (uintptr_t)dptr);
	if (r)
		fake.used -= r->size;
	pthread_mutex_unlock(&fake.lock);
	if (!r) {
		fprintf(stderr,
			"fakecuda: cuMemFree of %#llx, which is not "
			"an allocation\n",
			(unsigned long long)dptr);
		return CUDA_ERROR_INVALID_VALUE;
	}
	munmap((void *)r->base, r->size);
	free(r);
	return CUDA_SUCCESS;
}

/* Add [p, p + n) to the pinned ranges, unless it overlaps one. */
static CUresult fake_pin(void *p, size_t n, bool host_alloc)
{
	struct fake_range *r = calloc(1, sizeof(*r));
	uintptr_t b = (uintptr_t)p;

	if (!r)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&fake.lock);
	for (struct fake_range *o = fake.host; o; o = o->next) {
		if (b < o->base + o->size && o->base < b + n) {
			pthread_mutex_unlock(&fake.lock);
			free(r);
			return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
		}
	}
	r->base = b;
	r->size = n;
	r->host_alloc = host_alloc;
	r->next = fake.host;
	fake.host = r;
	pthread_mutex_unlock(&fake.lock);
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize,
				    unsigned int Flags)
{
	void *p;
	CUresult r;

	FAKE_ENTER(true);
	if (bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	p = fake_map(bytesize);
	if (!p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	r = fake_pin(p, bytesize, true);
	if (r != CUDA_SUCCESS) {
		munmap(p, bytesize);
		return r;
	}
	*pp = p;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemFreeHost(void *p)
{
	struct fake_range *r;

	FAKE_ENTER(true);
	pthread_mutex_lock(&fake.lock);
	r = fake_range_take(&fake.host, (uintptr_t)p);
	if (r && !r->host_alloc) {
		/* Registered, not allocated: put it back. */
		r->next = fake.host;
		fake.host = r;
		r = NULL;
	}
	pthread_mutex_unlock(&fake.lock);
	if (!r)
		return CUDA_ERROR_INVALID_VALUE;
	munmap((void *)r->base, r->size);
	free(r);
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemHostRegister(void *p, size_t bytesize,
				       unsigned int Flags)
{
	const char *max = getenv("FAKECUDA_REGISTER_MAX_MB");

	FAKE_ENTER(true);
	if (!p || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (max && atoll(max) > 0 && bytesize > (size_t)atoll(max) << 20)
		return CUDA_ERROR_OUT_OF_MEMORY;
	return fake_pin(p, bytesize, false);
}

FAKE_EXPORT CUresult cuMemHostUnregister(void *p)
{
	struct fake_range *r;

	FAKE_ENTER(true);
	pthread_mutex_lock(&fake.lock);
	r = fake_range_take(&fake.host, (uintptr_t)p);
	if (r && r->host_alloc) {
		r->next = fake.host;
		fake.host = r;
		r = NULL;
	}
	pthread_mutex_unlock(&fake.lock);
	if (!r)
		return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
	free(r);
	return CUDA_SUCCESS;
}

/* ---- copies ------------------------------------------------------------ */

/* Queue a linear copy; src_host/dst_host say which side is host memory. */
static CUresult fake_copy(void *dst, const void *src, size_t n, bool dst_host,
			  bool src_host, CUstream s)
{
	struct fake_op *op;
	bool capturing = fake_capturing(s);
	bool wait = false;

	if ((!dst_host && !fake_device_ok((uintptr_t)dst, n)) ||
	    (!src_host && !fake_device_ok((uintptr_t)src, n)))
		return CUDA_ERROR_INVALID_VALUE;
	op = fake_op_new(FAKE_OP_COPY);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	/* A graph reads and writes host memory at replay, pageable or not. */
	if (src_host && !capturing && !fake_pinned(src, n)) {
		op->bounce = malloc(n);
		if (!op->bounce) {
			free(op);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		memcpy(op->bounce, src, n);
		src = op->bounce;
	}
	if (dst_host && !capturing && !fake_pinned(dst, n))
		wait = true;
	op->u.copy.dst = dst;
	op->u.copy.src = src;
	op->u.copy.n = n;
	fake_enqueue(s, op);
	return wait ? fake_wait_stream(s) : CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemcpyHtoDAsync(CUdeviceptr dstDevice,
				       const void *srcHost, size_t ByteCount,
				       CUstream hStream)
{
	FAKE_ENTER(false);
	return fake_copy((void *)(uintptr_t)dstDevice, srcHost, ByteCount,
			 false, true, hStream);
}

FAKE_EXPORT CUresult cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice,
				       size_t ByteCount, CUstream hStream)
{
	FAKE_ENTER(false);
	return fake_copy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount,
			 true, false, hStream);
}

FAKE_EXPORT CUresult cuMemcpyDtoDAsync(CUdeviceptr dstDevice,
				       CUdeviceptr srcDevice, size_t ByteCount,
				       CUstream hStream)
{
	FAKE_ENTER(false);
	return fake_copy((void *)(uintptr_t)dstDevice,
			 (const void *)(uintptr_t)srcDevice, ByteCount, false,
			 false, hStream);
}

/* Bytes a 2D copy spans from its first byte: its footprint in memory. */
static size_t fake_span(size_t pitch, size_t width, size_t height)
{
	return (height - 1) * pitch + width;
}

FAKE_EXPORT CUresult cuMemcpy2DAsync(const CUDA_MEMCPY2D *c, CUstream hStream)
{
	struct fake_op *op;
	const char *src;
	char *dst;
	size_t ss, ds;
	bool capturing, wait = false;

	FAKE_ENTER(false);
	if (c->WidthInBytes == 0 || c->Height == 0)
		return CUDA_SUCCESS;
	if (c->srcPitch < c->WidthInBytes + c->srcXInBytes ||
	    c->dstPitch < c->WidthInBytes + c->dstXInBytes)
		return CUDA_ERROR_INVALID_VALUE;
	if ((c->srcMemoryType != CU_MEMORYTYPE_HOST &&
	     c->srcMemoryType != CU_MEMORYTYPE_DEVICE) ||
	    (c->dstMemoryType != CU_MEMORYTYPE_HOST &&
	     c->dstMemoryType != CU_MEMORYTYPE_DEVICE))
		return CUDA_ERROR_INVALID_VALUE;
	src = c->srcMemoryType == CU_MEMORYTYPE_HOST ?
		      (const char *)c->srcHost :
		      (const char *)(uintptr_t)c->srcDevice;
	dst = c->dstMemoryType == CU_MEMORYTYPE_HOST ?
		      (char *)c->dstHost :
		      (char *)(uintptr_t)c->dstDevice;
	src += c->srcY * c->srcPitch + c->srcXInBytes;
	dst += c->dstY * c->dstPitch + c->dstXInBytes;
	ss = fake_span(c->srcPitch, c->WidthInBytes, c->Height);
	ds = fake_span(c->dstPitch, c->WidthInBytes, c->Height);
	if ((c->srcMemoryType == CU_MEMORYTYPE_DEVICE &&
	     !fake_device_ok((uintptr_t)src, ss)) ||
	    (c->dstMemoryType == CU_MEMORYTYPE_DEVICE &&
	     !fake_device_ok((uintptr_t)dst, ds)))
		return CUDA_ERROR_INVALID_VALUE;
	op = fake_op_new(FAKE_OP_COPY2D);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	capturing = fake_capturing(hStream);
	if (c->srcMemoryType == CU_MEMORYTYPE_HOST && !capturing &&
	    !fake_pinned(src, ss)) {
		op->bounce = malloc(ss);
		if (!op->bounce) {
			free(op);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		memcpy(op->bounce, src, ss);
		src = op->bounce;
	}
	if (c->dstMemoryType == CU_MEMORYTYPE_HOST && !capturing &&
	    !fake_pinned(dst, ds))
		wait = true;
	op->u.copy2d.dst = dst;
	op->u.copy2d.src = src;
	op->u.copy2d.dpitch = c->dstPitch;
	op->u.copy2d.spitch = c->srcPitch;
	op->u.copy2d.width = c->WidthInBytes;
	op->u.copy2d.height = c->Height;
	fake_enqueue(hStream, op);
	return wait ? fake_wait_stream(hStream) : CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc,
				     size_t N, CUstream hStream)
{
	struct fake_op *op;

	FAKE_ENTER(false);
	if (N == 0)
		return CUDA_SUCCESS;
	if (!fake_device_ok(dstDevice, N))
		return CUDA_ERROR_INVALID_VALUE;
	op = fake_op_new(FAKE_OP_MEMSET);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->u.memset.dst = (void *)(uintptr_t)dstDevice;
	op->u.memset.value = uc;
	op->u.memset.n = N;
	return fake_enqueue(hStream, op);
}

/* ---- streams ----------------------------------------------------------- */

static CUresult fake_stream_new(CUstream *out)
{
	CUstream s = calloc(1, sizeof(*s));

	if (!s)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_cond_init(&s->wake, NULL);
	if (pthread_create(&s->thread, NULL, fake_stream_main, s) != 0) {
		pthread_cond_destroy(&s->wake);
		free(s);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*out = s;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	FAKE_ENTER(true);
	return fake_stream_new(phStream);
}

FAKE_EXPORT CUresult cuStreamDestroy(CUstream hStream)
{
	struct fake_op *op;
	CUstream s;

	/* Like the driver: it returns at once, and the stream's thread ends
	 * once the work queued before has run. */
	FAKE_ENTER(false);
	if (!hStream)
		return CUDA_ERROR_INVALID_HANDLE;
	op = fake_op_new(FAKE_OP_EXIT);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	/* The capture check and the queueing under one hold of the lock: a
	 * capture begun in between would otherwise take the EXIT op into
	 * its graph and leave the stream's thread running. */
	s = fake_stream_of(hStream);
	pthread_mutex_lock(&fake.lock);
	if (s->capture) {
		pthread_mutex_unlock(&fake.lock);
		free(op);
		return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
	}
	fake.exiting++;
	fake_enqueue_locked(s, op);
	pthread_mutex_unlock(&fake.lock);
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent,
				       unsigned int Flags)
{
	struct fake_op *op;
	unsigned long seq;
	bool captured;

	FAKE_ENTER(false);
	if (!hEvent)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&fake.lock);
	seq = hEvent->recorded;
	captured = hEvent->captured;
	pthread_mutex_unlock(&fake.lock);
	if (fake_capturing(hStream))
		/* Only events of this capture join into it; the daemon
		 * records none, so any wait is on one from outside. */
		return captured ? CUDA_SUCCESS :
				  CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
	if (captured)
		return CUDA_ERROR_CAPTURED_EVENT;
	if (seq == 0)
		return CUDA_SUCCESS; /* never recorded: nothing to wait for */
	op = fake_op_new(FAKE_OP_WAIT);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->u.event.event = hEvent;
	op->u.event.seq = seq;
	return fake_enqueue(hStream, op);
}

FAKE_EXPORT CUresult cuStreamAddCallback(CUstream hStream,
					 CUstreamCallback callback,
					 void *userData, unsigned int flags)
{
	struct fake_op *op;

	FAKE_ENTER(false);
	if (!callback || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (fake_capturing(hStream))
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	op = fake_op_new(FAKE_OP_CALLBACK);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->u.callback.stream = hStream;
	op->u.callback.fn = callback;
	op->u.callback.user = userData;
	return fake_enqueue(hStream, op);
}

FAKE_EXPORT CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn,
				      void *userData)
{
	struct fake_op *op;

	FAKE_ENTER(false);
	if (!fn)
		return CUDA_ERROR_INVALID_VALUE;
	op = fake_op_new(FAKE_OP_HOST_FN);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->u.host_fn.fn = fn;
	op->u.host_fn.user = userData;
	return fake_enqueue(hStream, op);
}

/* ---- capture and graphs ------------------------------------------------ */

FAKE_EXPORT CUresult cuStreamBeginCapture(CUstream hStream,
					  CUstreamCaptureMode mode)
{
	struct CUgraph_st *g;
	CUstream s;

	FAKE_ENTER(false);
	if (!hStream)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	g = calloc(1, sizeof(*g));
	if (!g)
		return CUDA_ERROR_OUT_OF_MEMORY;
	s = hStream;
	pthread_mutex_lock(&fake.lock);
	if (s->capture) {
		pthread_mutex_unlock(&fake.lock);
		free(g);
		return CUDA_ERROR_ILLEGAL_STATE;
	}
	s->capture = g;
	pthread_mutex_unlock(&fake.lock);
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
	struct CUgraph_st *g;

	FAKE_ENTER(false);
	if (!hStream)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&fake.lock);
	g = hStream->capture;
	hStream->capture = NULL;
	pthread_mutex_unlock(&fake.lock);
	if (!g)
		return CUDA_ERROR_ILLEGAL_STATE;
	*phGraph = g;
	return CUDA_SUCCESS;
}

/* A copy of a graph's ops; false when out of memory. */
static bool fake_ops_copy(const struct fake_op *from, struct fake_op **to)
{
	struct fake_op **tail = to;

	*to = NULL;
	for (; from; from = from->next) {
		struct fake_op *op = malloc(sizeof(*op));

		if (!op) {
			fake_ops_free(*to);
			*to = NULL;
			return false;
		}
		*op = *from;
		op->next = NULL;
		op->bounce = NULL;
		*tail = op;
		tail = &op->next;
	}
	return true;
}

FAKE_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec,
						 CUgraph hGraph,
						 unsigned long long flags)
{
	struct CUgraphExec_st *e;

	FAKE_ENTER(false);
	if (!hGraph)
		return CUDA_ERROR_INVALID_HANDLE;
	e = calloc(1, sizeof(*e));
	if (!e)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (!fake_ops_copy(hGraph->head, &e->ops)) {
		free(e);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*phGraphExec = e;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	struct fake_op *op;

	FAKE_ENTER(false);
	if (!hGraphExec)
		return CUDA_ERROR_INVALID_HANDLE;
	if (fake_capturing(hStream))
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	op = fake_op_new(FAKE_OP_GRAPH);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->u.graph = hGraphExec;
	pthread_mutex_lock(&fake.lock);
	hGraphExec->launches++;
	pthread_mutex_unlock(&fake.lock);
	return fake_enqueue(hStream, op);
}

/* Under the lock, with no launch left. */
static void fake_graph_exec_free(CUgraphExec g)
{
	fake_ops_free(g->ops);
	free(g);
}

FAKE_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	FAKE_ENTER(false);
	if (!hGraphExec)
		return CUDA_ERROR_INVALID_HANDLE;
	/* Launches still queued keep it until they end, as in the driver. */
	pthread_mutex_lock(&fake.lock);
	hGraphExec->destroyed = true;
	if (hGraphExec->launches == 0)
		fake_graph_exec_free(hGraphExec);
	pthread_mutex_unlock(&fake.lock);
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphDestroy(CUgraph hGraph)
{
	FAKE_ENTER(false);
	if (!hGraph)
		return CUDA_ERROR_INVALID_HANDLE;
	fake_ops_free(hGraph->head);
	free(hGraph);
	return CUDA_SUCCESS;
}

/* ---- events ------------------------------------------------------------ */

FAKE_EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	CUevent e;

	FAKE_ENTER(true);
	e = calloc(1, sizeof(*e));
	if (!e)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->flags = Flags;
	*phEvent = e;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventDestroy(CUevent hEvent)
{
	FAKE_ENTER(false);
	if (!hEvent)
		return CUDA_ERROR_INVALID_HANDLE;
	/*
	 * The driver lets an event go while a record is still queued and
	 * frees it later; the fake waits instead, so its stream thread
	 * never touches freed memory.
	 */
	pthread_mutex_lock(&fake.lock);
	while (hEvent->done < hEvent->recorded && !hEvent->captured &&
	       !fake_sticky_get())
		pthread_cond_wait(&fake.changed, &fake.lock);
	pthread_mutex_unlock(&fake.lock);
	free(hEvent);
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
	struct fake_op *op;

	FAKE_ENTER(false);
	if (!hEvent)
		return CUDA_ERROR_INVALID_HANDLE;
	if (fake_capturing(hStream)) {
		/* Becomes a node joining the capture; nothing runs. */
		pthread_mutex_lock(&fake.lock);
		hEvent->captured = true;
		pthread_mutex_unlock(&fake.lock);
		return CUDA_SUCCESS;
	}
	op = fake_op_new(FAKE_OP_RECORD);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&fake.lock);
	hEvent->captured = false;
	op->u.event.event = hEvent;
	op->u.event.seq = ++hEvent->recorded;
	pthread_mutex_unlock(&fake.lock);
	return fake_enqueue(hStream, op);
}

FAKE_EXPORT CUresult cuEventQuery(CUevent hEvent)
{
	CUresult r;

	FAKE_ENTER(false);
	if (!hEvent)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&fake.lock);
	if (hEvent->captured)
		r = CUDA_ERROR_CAPTURED_EVENT;
	else if (hEvent->done < hEvent->recorded)
		r = CUDA_ERROR_NOT_READY;
	else
		r = CUDA_SUCCESS;
	pthread_mutex_unlock(&fake.lock);
	return r;
}

FAKE_EXPORT CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart,
					CUevent hEnd)
{
	CUresult r = CUDA_SUCCESS;

	FAKE_ENTER(false);
	if (!hStart || !hEnd)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&fake.lock);
	if ((hStart->flags | hEnd->flags) & FAKE_EVENT_DISABLE_TIMING)
		r = CUDA_ERROR_INVALID_HANDLE;
	else if (hStart->captured || hEnd->captured)
		r = CUDA_ERROR_CAPTURED_EVENT;
	else if (hStart->recorded == 0 || hEnd->recorded == 0)
		r = CUDA_ERROR_INVALID_HANDLE;
	else if (hStart->done < hStart->recorded || hEnd->done < hEnd->recorded)
		r = CUDA_ERROR_NOT_READY;
	else
		*pMilliseconds = (float)((double)(hEnd->when.tv_sec -
						  hStart->when.tv_sec) *
						 1e3 +
					 (double)(hEnd->when.tv_nsec -
						  hStart->when.tv_nsec) /
						 1e6);
	pthread_mutex_unlock(&fake.lock);
	return r;
}

/* ---- modules and launches ---------------------------------------------- */

/* Put text into the JIT error log that options name, if they name one. */
static void fake_jit_log(unsigned int n, const CUjit_option *options,
			 void **values, const char *text)
{
	char *buf = NULL;
	size_t len = 0;

	for (unsigned int i = 0; i < n; i++) {
		if (options[i] == CU_JIT_ERROR_LOG_BUFFER)
			buf = values[i];
		else if (options[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
			len = (size_t)(uintptr_t)values[i];
	}
	if (buf && len)
		snprintf(buf, len, "%s", text);
}

FAKE_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image,
					unsigned int numOptions,
					CUjit_option *options,
					void **optionValues)
{
	static const unsigned char elf[4] = { 0x7f, 'E', 'L', 'F' };
	static const unsigned char fatbin[4] = { 0x50, 0xed, 0x55, 0xba };
	CUmodule m;

	FAKE_ENTER(true);
	if (!image)
		return CUDA_ERROR_INVALID_VALUE;
	m = calloc(1, sizeof(*m));
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (memcmp(image, elf, 4) != 0 && memcmp(image, fatbin, 4) != 0) {
		/* PTX: NUL-terminated text. */
		if (!strstr(image, ".version")) {
			fake_jit_log(numOptions, options, optionValues,
				     "ptxas fatal   : fake CUDA: no .version "
				     "directive in the PTX");
			free(m);
			return CUDA_ERROR_INVALID_PTX;
		}
		m->ptx = strdup(image);
		if (!m->ptx) {
			free(m);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	*module = m;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
	FAKE_ENTER(true);
	if (!hmod)
		return CUDA_ERROR_INVALID_HANDLE;
	while (hmod->functions) {
		struct CUfunc_st *f = hmod->functions;

		hmod->functions = f->next;
		free(f);
	}
	free(hmod->ptx);
	free(hmod);
	return CUDA_SUCCESS;
}

/* Whether PTX text has a kernel ".entry name(". */
static bool fake_ptx_has(const char *ptx, const char *name)
{
	size_t len = strlen(name);

	for (const char *p = ptx; (p = strstr(p, ".entry")); p += 6) {
		const char *q = p + 6;

		while (*q == ' ' || *q == '\t')
			q++;
		if (strncmp(q, name, len) == 0) {
			q += len;
			while (*q == ' ' || *q == '\t' || *q == '\n')
				q++;
			if (*q == '(' || *q == '{')
				return true;
		}
	}
	return false;
}

FAKE_EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod,
					 const char *name)
{
	struct CUfunc_st *f;
	size_t len;

	FAKE_ENTER(false);
	if (!hmod || !name)
		return CUDA_ERROR_INVALID_VALUE;
	for (f = hmod->functions; f; f = f->next) {
		if (strcmp(f->name, name) == 0) {
			*hfunc = f;
			return CUDA_SUCCESS;
		}
	}
	if (hmod->ptx && !fake_ptx_has(hmod->ptx, name))
		return CUDA_ERROR_NOT_FOUND;
	len = strlen(name);
	f = calloc(1, sizeof(*f) + len + 1);
	if (!f)
		return CUDA_ERROR_OUT_OF_MEMORY;
	memcpy(f->name, name, len + 1);
	f->kernel = fake_kernel_find(name);
	f->max_dynamic_shared = FAKE_DEFAULT_SHARED;
	f->next = hmod->functions;
	hmod->functions = f;
	*hfunc = f;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuFuncSetAttribute(CUfunction hfunc,
					CUfunction_attribute attrib, int value)
{
	FAKE_ENTER(false);
	if (!hfunc)
		return CUDA_ERROR_INVALID_HANDLE;
	if (attrib != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
		return CUDA_ERROR_INVALID_VALUE;
	if (value < 0 || value > FAKE_OPTIN_SHARED)
		return CUDA_ERROR_INVALID_VALUE;
	hfunc->max_dynamic_shared = value;
	return CUDA_SUCCESS;
}

#ifndef FAKECUDA_NO_PARAM_INFO
/*
 * The parameters of a kernel the fake interprets, laid out as nvcc does
 * (each aligned to its size); past the last one CUDA_ERROR_INVALID_VALUE,
 * as the driver says.  Of any other function the fake knows no signature:
 * CUDA_ERROR_NOT_SUPPORTED, which the backend takes as "cannot check".
 */
FAKE_EXPORT CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex,
					size_t *paramOffset, size_t *paramSize)
{
	const char *sig;
	size_t offset = 0;

	FAKE_ENTER(false);
	if (!func || !paramOffset)
		return CUDA_ERROR_INVALID_VALUE;
	if (!func->kernel)
		return CUDA_ERROR_NOT_SUPPORTED;
	sig = func->kernel->signature;
	if (paramIndex >= strlen(sig))
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0;; i++) {
		size_t size = sig[i] == 'p' || sig[i] == 'U' ? 8 : 4;

		offset = (offset + size - 1) / size * size;
		if (i == paramIndex) {
			*paramOffset = offset;
			if (paramSize)
				*paramSize = size;
			return CUDA_SUCCESS;
		}
		offset += size;
	}
}
#endif /* FAKECUDA_NO_PARAM_INFO */

FAKE_EXPORT CUresult cuLaunchKernel(
	CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
	unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
	unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
	void **kernelParams, void **extra)
{
	struct fake_op *op;
	const char *sig;

	FAKE_ENTER(false);
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!gridDimX || !gridDimY || !gridDimZ || !blockDimX || !blockDimY ||
	    !blockDimZ || gridDimX > 2147483647u || gridDimY > 65535 ||
	    gridDimZ > 65535 || blockDimX > 1024 || blockDimY > 1024 ||
	    blockDimZ > 64 ||
	    (unsigned long long)blockDimX * blockDimY * blockDimZ > 1024)
		return CUDA_ERROR_INVALID_VALUE;
	if (sharedMemBytes > (unsigned int)f->max_dynamic_shared)
		return CUDA_ERROR_INVALID_VALUE;
	if (kernelParams && extra)
		return CUDA_ERROR_INVALID_VALUE;
	/*
	 * FAKECUDA_FAULT_AT_LAUNCH: fault() faults at once, before the call
	 * returns, so the caller's next call finds the context lost (on a
	 * GPU a fast fault can beat the next call; on the stream thread it
	 * usually does not).  FAKECUDA_FAULT_CODE names the sticky CUresult
	 * (a number; CUDA_ERROR_LAUNCH_FAILED by default), for the other
	 * errors that lose a context.
	 */
	if (f->kernel && f->kernel->run == fake_k_fault &&
	    getenv("FAKECUDA_FAULT_AT_LAUNCH") != NULL) {
		const char *code = getenv("FAKECUDA_FAULT_CODE");

		fprintf(stderr,
			"fakecuda: kernel %s faulted at launch: the "
			"context is lost\n",
			f->name);
		fake_sticky_set(code != NULL && atoi(code) > 0 ?
					(CUresult)atoi(code) :
					CUDA_ERROR_LAUNCH_FAILED);
		return CUDA_SUCCESS;
	}
	op = fake_op_new(FAKE_OP_KERNEL);
	if (!op)
		return CUDA_ERROR_OUT_OF_MEMORY;
	op->u.kernel.fn = f;
	/* Parameters are copied at the launch, as the driver does. */
	sig = f->kernel ? f->kernel->signature : "";
	if (sig[0] && !kernelParams) {
		free(op);
		return CUDA_ERROR_INVALID_VALUE;
	}
	for (size_t i = 0; sig[i]; i++) {
		uint32_t u32;

		switch (sig[i]) {
		case 'p':
		case 'U':
			memcpy(&op->u.kernel.args[i], kernelParams[i], 8);
			break;
		default:
			memcpy(&u32, kernelParams[i], 4);
			op->u.kernel.args[i] = u32;
			break;
		}
	}
	return fake_enqueue(hStream, op);
}
