/*
 * host.c - the host backend: a "device" made of host memory and threads, so
 * that the whole daemon runs, and is tested, on machines without a GPU.
 *
 * Memory: device memory is host memory, zeroed (mmap, or malloc's heap for
 * small blocks: HOST_SMALL_BLOCK); a device address
 * is the host pointer.  Each block carries a header (in the HOST_ALIGNMENT
 * bytes before the address) with its size, so that mem_free gives the budget
 * back, and a link in the heap's list, so that close frees what is left, as
 * destroying a CUDA context does.  The budget (driver_options.host_memory)
 * plays the part of the card's memory size.
 *
 * Streams: each stream is a worker thread that runs its queue of ops in FIFO
 * order.  The device thread never waits for a worker, as with a real GPU.  It
 * appends ops to the stream's pending list, which only it touches, and hands
 * the whole list to the worker in one step (the stream's mutex held for a
 * splice, and a signal only when the worker sleeps): at flush, the end of a
 * daemon batch; at event_record and host_callback, which another stream or a
 * completion may wait on; and whenever HOST_PENDING_MAX ops are pending, so
 * that a long batch starts early.  The worker takes everything queued at
 * once, runs it without the lock, and gives the spent op blocks back in one
 * step the next time it takes the lock; the device thread reuses them, so an
 * op costs no malloc once a stream has warmed up.  The worker runs the ops
 * and owns the stream's fault flag, with one exception: a copy or memset
 * (at most HOST_INLINE_MAX bytes a batch), or a host callback, that comes to
 * a quiet stream (nothing pending, queued or running) runs at once on the
 * device thread, which saves the two hand-offs a {copy; sync} batch would
 * cost.
 *
 * Events: a record creates a marker, a small reference-counted object that
 * the worker marks done (with a CLOCK_MONOTONIC timestamp) when it reaches
 * it.  The event points at its latest marker; a wait holds on to the marker
 * current at the time of the wait call, so recording the event again later
 * does not move what the wait waits for.  All markers share one driver-wide
 * mutex and condvar: the waits are few and short, and one lock keeps the
 * reference counts simple.
 *
 * Graphs: while a stream captures, its copies, memsets and launches are
 * appended to the graph's op list instead of the queue; a graph launch
 * appends a copy of that list to a stream's queue in one step.
 *
 * Threads: every driver_ops function runs on the device thread; the fields
 * a worker touches are named as such below.
 */
#include "driver.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpucmd.h"
#include "kernels/builtin.h"
#include "spin.h"
#include "kernels/host_kernels.h"

/* Offset alignment of every block, as a GPU's allocator gives. */
#define HOST_ALIGNMENT 256u
/* Budget when driver_options.host_memory is 0. */
#define HOST_DEFAULT_MEMORY (UINT64_C(4) << 30)
/*
 * A stream's worker is handed its pending ops once this many have gathered,
 * without waiting for the batch's flush (tests/unit/check_host.c knows it).
 */
#define HOST_PENDING_MAX 256u
/*
 * Spent op blocks a stream keeps for reuse; more go back to malloc.  A
 * client keeping batches of 1024 launches four deep in flight has ~4096
 * in circulation: at 1024, a third of all launches malloc'd a block and
 * the next flush freed one (tests/bench x1024).  8192 blocks are ~0.8 MiB,
 * held only by a stream that once had that many ops in flight.
 */
#define HOST_SPARE_MAX 8192u
/*
 * A copy or memset of at most this many bytes, and a host callback, that
 * come to a stream with nothing pending, queued or running run at once on
 * the device thread (host_submit): handing them to the worker and their
 * completion back costs two thread hand-offs, and on a small machine the
 * worker (niced, see host_stream_nice) waits for a CPU behind the threads
 * that spin for its result (write region 1 MiB: ~130 us a batch for a
 * 40 us memcpy on the 2-core VM, BENCHMARKS.md).  1 MiB is ~40 us of
 * memcpy, about what the device thread spends on a batch of a few hundred
 * ops.  It bounds a batch, not an op: the bytes run inline between two
 * flushes (one batch) are at most this, or a batch of many small copies
 * would hold the device thread, and every other client, for as long as it
 * liked (test_clients many_small_copies_do_not_block_others).
 */
#define HOST_INLINE_MAX (UINT64_C(1) << 20)

/*
 * The header of a block, in the HOST_ALIGNMENT bytes in front of the address
 * handed out (so that the address keeps its alignment).
 */
struct host_block {
	struct host_block *prev;
	struct host_block *next;
	uint64_t size; /* rounded up to HOST_ALIGNMENT */
	bool small;    /* from malloc's heap (HOST_SMALL_BLOCK) */
};

/*
 * Blocks (header included) under this size come from malloc's heap, zeroed
 * here, and larger ones straight from the kernel.  A mapping each would
 * cost small buffers a page and a mapping apiece: 65536 buffers of 256
 * bytes (16 MiB of a service's quota) took 256 MiB, and, every other one
 * released, filled the process's vm.max_map_count, after which no service
 * could allocate at all.  Under glibc's mmap threshold (128 KiB at least),
 * so that malloc does not map them one by one either.
 */
#define HOST_SMALL_BLOCK (UINT64_C(64) << 10)

_Static_assert(sizeof(struct host_block) <= HOST_ALIGNMENT,
	       "the block header must fit in front of an aligned address");

/* Device memory, or pinned host memory: counted apart. */
struct host_heap {
	const char *what; /* for error sentences */
	uint64_t limit;
	uint64_t in_use;
	struct host_block blocks; /* sentinel of a circular list */
};

/* The kinds up to HOST_OP_LAUNCH are work, which a graph can capture. */
enum host_op_kind {
	HOST_OP_COPY = 1, /* every direction: all memory is host's */
	HOST_OP_MEMSET,
	HOST_OP_LAUNCH,
	HOST_OP_RECORD,
	HOST_OP_WAIT,
	HOST_OP_CALLBACK,
};

/* What an op is called in error sentences, by kind. */
static const char *const host_op_names[] = {
	[HOST_OP_COPY] = "a copy",
	[HOST_OP_MEMSET] = "a memset",
	[HOST_OP_LAUNCH] = "a launch",
	[HOST_OP_RECORD] = "an event record",
	[HOST_OP_WAIT] = "an event wait",
	[HOST_OP_CALLBACK] = "a host callback",
};

/* The completion of the work an event record captured. */
struct host_marker {
	unsigned refs;	    /* under events_lock */
	bool done;	    /* under events_lock */
	struct timespec at; /* when done; written before done is set */
};

struct host_op {
	struct host_op *next;
	enum host_op_kind kind;
	union {
		struct {
			void *dst;
			const void *src;
			struct driver_copy2d shape;
		} copy;
		struct {
			void *dst;
			size_t n;
			uint8_t value;
		} memset;
		struct {
			host_kernel_fn fn;
			union builtin_value args[BUILTIN_MAX_ARGS];
		} launch;
		struct host_marker *marker; /* record and wait */
		struct {
			driver_callback_fn fn;
			void *arg;
		} callback;
	} u;
};

/* A FIFO of ops: a stream's queue or a graph. */
struct host_op_list {
	struct host_op *head;
	struct host_op **tail;
};

struct host_driver {
	struct driver base; /* first, for host_of */
	struct host_heap device;
	struct host_heap pinned;
	uint64_t fail_alloc_at; /* test hook, 0 = never */
	uint64_t alloc_calls;
	unsigned spin_us;	   /* a worker's spin before it sleeps */
	unsigned stream_nice;	   /* workers' nice, above the daemon's */
	unsigned compile_delay_ms; /* test hook of module_load_shared */
	/* One per built-in, at its index in the builtin table. */
	struct driver_function *functions;
	/* The one builtin_function found last: a batch asks for one kernel
	 * over and over. */
	struct driver_function *last_function;
	pthread_mutex_t events_lock;
	pthread_cond_t events_done; /* a marker done, a stream stops */
	atomic_uint workers;	    /* streams' worker threads */
};

struct driver_stream {
	struct host_driver *hd;
	pthread_t thread;
	pthread_mutex_t lock;	      /* guards queue, returned, idle, busy */
	pthread_cond_t wake;	      /* work queued, or stop set */
	struct host_op_list queue;    /* handed to the worker, not yet taken */
	struct host_op_list returned; /* spent blocks the worker gave back */
	size_t nreturned;
	bool idle;	  /* the worker waits on wake */
	bool busy;	  /* the worker runs ops it took */
	atomic_uint kick; /* queue filled or stop set (spin.h) */
	atomic_bool stop; /* worker: leave, drop the queue */
	/* Since the last callback; the worker's, or the device thread's
	 * while the stream is quiet (host_stream_quiet). */
	bool faulted;
	/* Device thread only: */
	struct host_op_list pending; /* enqueued, not yet handed over */
	size_t npending;
	struct host_op_list spare; /* blocks to reuse */
	size_t nspare;
	struct driver_graph *capture; /* the graph being captured, or NULL */
	uint64_t inline_left;	      /* inline bytes left to this batch */
};

struct driver_event {
	struct host_marker *last; /* latest record; NULL before one */
};

struct driver_function {
	const struct builtin_kernel *kernel;
	host_kernel_fn fn;
};

struct driver_graph {
	struct host_op_list ops;
};

static struct host_driver *host_of(struct driver *d)
{
	return (struct host_driver *)d;
}

/* A device address of this backend is a host pointer. */
static void *host_ptr(uint64_t addr)
{
	return (void *)(uintptr_t)addr;
}

__attribute__((format(printf, 3, 4))) static int
host_fail(struct host_driver *hd, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(hd->base.error, sizeof(hd->base.error), fmt, ap);
	va_end(ap);
	return code;
}

/* ---- memory ------------------------------------------------------------ */

static void host_heap_init(struct host_heap *h, const char *what,
			   uint64_t limit)
{
	h->what = what;
	h->limit = limit;
	h->in_use = 0;
	h->blocks.prev = &h->blocks;
	h->blocks.next = &h->blocks;
}

static int host_heap_alloc(struct host_driver *hd, struct host_heap *h,
			   uint64_t size, void **out)
{
	struct host_block *b;
	uint64_t rounded;
	bool small;

	if (size == 0)
		return host_fail(hd, GPUCMD_EINVAL,
				 "cannot allocate 0 bytes of %s", h->what);
	/* Checked before rounding, which could overflow otherwise. */
	if (size > h->limit - h->in_use || size > SIZE_MAX - 2 * HOST_ALIGNMENT)
		goto full;
	rounded = (size + HOST_ALIGNMENT - 1) & ~(uint64_t)(HOST_ALIGNMENT - 1);
	if (rounded > h->limit - h->in_use)
		goto full;
	/*
	 * Large blocks straight from the kernel: pages come zeroed (so the
	 * daemon need not zero them) and go back to the system at free,
	 * instead of staying in malloc's heap after a tenant leaves.  Small
	 * ones from the heap (HOST_SMALL_BLOCK), zeroed here.
	 */
	small = HOST_ALIGNMENT + rounded < HOST_SMALL_BLOCK;
	if (small) {
		b = aligned_alloc(HOST_ALIGNMENT, HOST_ALIGNMENT + rounded);
		if (b != NULL)
			memset(b, 0, HOST_ALIGNMENT + rounded);
	} else {
		b = mmap(NULL, HOST_ALIGNMENT + rounded, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (b == MAP_FAILED)
			b = NULL;
	}
	if (b == NULL)
		return host_fail(hd, GPUCMD_ENOMEM,
				 "cannot allocate %" PRIu64 " bytes of %s: the "
				 "host itself is out of memory",
				 size, h->what);
	b->size = rounded;
	b->small = small;
	b->prev = h->blocks.prev;
	b->next = &h->blocks;
	b->prev->next = b;
	h->blocks.prev = b;
	h->in_use += rounded;
	*out = (unsigned char *)b + HOST_ALIGNMENT;
	return 0;
full:
	return host_fail(hd, GPUCMD_ENOMEM,
			 "cannot allocate %" PRIu64 " bytes of %s: %" PRIu64
			 " of %" PRIu64 " bytes in use",
			 size, h->what, h->in_use, h->limit);
}

static void host_heap_free_block(struct host_heap *h, struct host_block *b)
{
	b->prev->next = b->next;
	b->next->prev = b->prev;
	h->in_use -= b->size;
	if (b->small)
		free(b);
	else
		munmap(b, HOST_ALIGNMENT + b->size);
}

static void host_heap_free(struct host_heap *h, void *p)
{
	if (p != NULL)
		host_heap_free_block(h,
				     (struct host_block *)((unsigned char *)p -
							   HOST_ALIGNMENT));
}

static void host_heap_clear(struct host_heap *h)
{
	while (h->blocks.next != &h->blocks)
		host_heap_free_block(h, h->blocks.next);
}

static int host_mem_alloc(struct driver *d, uint64_t size, uint64_t *ptr)
{
	struct host_driver *hd = host_of(d);
	void *p = NULL;
	int rc;

	hd->alloc_calls++;
	if (hd->fail_alloc_at != 0 && hd->alloc_calls == hd->fail_alloc_at)
		return host_fail(hd, GPUCMD_ENOMEM,
				 "cannot allocate %" PRIu64 " bytes of %s: "
				 "call %" PRIu64 " fails on purpose (test hook "
				 "host_fail_alloc_at); %" PRIu64 " of %" PRIu64
				 " bytes in use",
				 size, hd->device.what, hd->alloc_calls,
				 hd->device.in_use, hd->device.limit);
	rc = host_heap_alloc(hd, &hd->device, size, &p);
	if (rc == 0)
		*ptr = (uint64_t)(uintptr_t)p;
	return rc;
}

static int host_mem_info(struct driver *d, uint64_t *free_bytes,
			 uint64_t *total_bytes)
{
	struct host_driver *hd = host_of(d);

	*free_bytes = hd->device.limit - hd->device.in_use;
	*total_bytes = hd->device.limit;
	return 0;
}

static void host_mem_free(struct driver *d, uint64_t ptr)
{
	host_heap_free(&host_of(d)->device, host_ptr(ptr));
}

static int host_host_alloc(struct driver *d, size_t size, void **ptr)
{
	struct host_driver *hd = host_of(d);

	return host_heap_alloc(hd, &hd->pinned, size, ptr);
}

static void host_host_free(struct driver *d, void *ptr)
{
	host_heap_free(&host_of(d)->pinned, ptr);
}

/* Host memory needs no pinning: every copy is a memcpy. */
static int host_host_register(struct driver *d, void *ptr, size_t size)
{
	return 0;
}

static void host_host_unregister(struct driver *d, void *ptr)
{
}

/* ---- op lists and markers ------------------------------------------------ */

static void host_op_list_init(struct host_op_list *l)
{
	l->head = NULL;
	l->tail = &l->head;
}

static void host_op_list_append(struct host_op_list *l, struct host_op *op)
{
	op->next = NULL;
	*l->tail = op;
	l->tail = &op->next;
}

/* Move every op of from to the end of to. */
static void host_op_list_splice(struct host_op_list *to,
				struct host_op_list *from)
{
	if (from->head == NULL)
		return;
	*to->tail = from->head;
	to->tail = from->tail;
	host_op_list_init(from);
}

static struct host_op *host_op_list_pop(struct host_op_list *l)
{
	struct host_op *op = l->head;

	if (op != NULL) {
		l->head = op->next;
		if (l->head == NULL)
			l->tail = &l->head;
	}
	return op;
}

static void host_marker_ref(struct host_driver *hd, struct host_marker *m)
{
	pthread_mutex_lock(&hd->events_lock);
	m->refs++;
	pthread_mutex_unlock(&hd->events_lock);
}

static void host_marker_unref(struct host_driver *hd, struct host_marker *m)
{
	bool last;

	pthread_mutex_lock(&hd->events_lock);
	last = --m->refs == 0;
	pthread_mutex_unlock(&hd->events_lock);
	if (last)
		free(m);
}

/* Drop what an op holds besides its block: a marker reference. */
static void host_op_release(struct host_driver *hd, struct host_op *op)
{
	if (op->kind == HOST_OP_RECORD || op->kind == HOST_OP_WAIT)
		host_marker_unref(hd, op->u.marker);
}

static void host_op_free(struct host_driver *hd, struct host_op *op)
{
	host_op_release(hd, op);
	free(op);
}

static void host_op_list_free(struct host_driver *hd, struct host_op_list *l)
{
	struct host_op *op;

	while ((op = host_op_list_pop(l)) != NULL)
		host_op_free(hd, op);
}

/* Free the blocks of a list whose ops were released already. */
static void host_op_list_free_blocks(struct host_op_list *l)
{
	struct host_op *op;

	while ((op = host_op_list_pop(l)) != NULL)
		free(op);
}

/* A copy of tmpl in a block s has spare, or a new one (device thread). */
static struct host_op *host_op_dup(struct driver_stream *s,
				   const struct host_op *tmpl)
{
	struct host_op *op = host_op_list_pop(&s->spare);

	if (op != NULL)
		s->nspare--;
	else
		op = malloc(sizeof(*op));
	if (op != NULL)
		*op = *tmpl;
	return op;
}

/* ---- the worker -------------------------------------------------------- */

static void host_run_copy(void *dst_base, const void *src_base,
			  const struct driver_copy2d *c)
{
	const unsigned char *src = src_base;
	unsigned char *dst = dst_base;

	/* memcpy with a NULL pointer is undefined even for 0 bytes. */
	if (c->width == 0)
		return;
	/* memmove: a device-to-device copy may stay within one buffer. */
	for (size_t row = 0; row < c->height; row++)
		memmove(dst + row * c->dst_pitch, src + row * c->src_pitch,
			c->width);
}

static void host_marker_complete(struct host_driver *hd, struct host_marker *m)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	pthread_mutex_lock(&hd->events_lock);
	m->at = now;
	m->done = true;
	pthread_cond_broadcast(&hd->events_done);
	pthread_mutex_unlock(&hd->events_lock);
}

/* Block this worker until m is done, or its stream is being destroyed. */
static void host_marker_wait(struct driver_stream *s, struct host_marker *m)
{
	struct host_driver *hd = s->hd;

	pthread_mutex_lock(&hd->events_lock);
	while (!m->done && !atomic_load(&s->stop))
		pthread_cond_wait(&hd->events_done, &hd->events_lock);
	pthread_mutex_unlock(&hd->events_lock);
}

static void host_op_run(struct driver_stream *s, struct host_op *op)
{
	int status;

	switch (op->kind) {
	case HOST_OP_COPY:
		host_run_copy(op->u.copy.dst, op->u.copy.src,
			      &op->u.copy.shape);
		break;
	case HOST_OP_MEMSET:
		if (op->u.memset.n != 0)
			memset(op->u.memset.dst, op->u.memset.value,
			       op->u.memset.n);
		break;
	case HOST_OP_LAUNCH:
		if (op->u.launch.fn(op->u.launch.args) != 0)
			s->faulted = true;
		break;
	case HOST_OP_RECORD:
		host_marker_complete(s->hd, op->u.marker);
		break;
	case HOST_OP_WAIT:
		host_marker_wait(s, op->u.marker);
		break;
	case HOST_OP_CALLBACK:
		status = s->faulted ? GPUCMD_ESTREAM : 0;
		s->faulted = false;
		op->u.callback.fn(op->u.callback.arg, status);
		break;
	}
}

/*
 * Give back the spent blocks of done and take everything queued into work;
 * false when the stream stops.  One lock round for both directions.
 */
static bool host_stream_take(struct driver_stream *s, struct host_op_list *work,
			     struct host_op_list *done, size_t *ndone)
{
	bool stop;

	bool spun = false;

	pthread_mutex_lock(&s->lock);
	s->busy = false;
	host_op_list_splice(&s->returned, done);
	s->nreturned += *ndone;
	*ndone = 0;
	while (!(stop = atomic_load(&s->stop)) && s->queue.head == NULL) {
		if (!spun && s->hd->spin_us != 0) {
			/* Stay awake a while for the next hand-over. */
			spun = true;
			pthread_mutex_unlock(&s->lock);
			spin_wait(&s->kick, s->hd->spin_us);
			pthread_mutex_lock(&s->lock);
			continue;
		}
		s->idle = true;
		pthread_cond_wait(&s->wake, &s->lock);
		s->idle = false;
	}
	atomic_store(&s->kick, 0);
	if (!stop) {
		host_op_list_splice(work, &s->queue);
		s->busy = work->head != NULL;
	}
	pthread_mutex_unlock(&s->lock);
	return !stop;
}

/*
 * The workers play the GPU, whose work costs a real one no host CPU: they
 * run nicer than the daemon's loop and device thread, so that kernels
 * flooding the host backend take the CPU the answers need last (under 16
 * flooding clients on two CPUs, a ping's median went from 24-60 us to
 * 15-26 us with +10).  Raising one's own nice needs no privilege; on Linux
 * PRIO_PROCESS with a thread id sets that thread alone.
 */
static void host_stream_nice(unsigned nice)
{
	id_t tid = (id_t)syscall(SYS_gettid);
	int now;

	if (nice == 0)
		return;
	errno = 0;
	now = getpriority(PRIO_PROCESS, tid);
	if (now == -1 && errno != 0)
		return;
	now += (int)nice;
	/* An optimisation: a worker that cannot be niced runs anyway. */
	(void)setpriority(PRIO_PROCESS, tid, now < 19 ? now : 19);
}

static void *host_stream_main(void *arg)
{
	struct driver_stream *s = arg;
	struct host_op_list work, done;
	struct host_op *op;
	size_t ndone = 0;

	host_op_list_init(&work);
	host_op_list_init(&done);
	host_stream_nice(s->hd->stream_nice);
	while (host_stream_take(s, &work, &done, &ndone)) {
		/* stop also drops what was taken but has not run yet. */
		while (!atomic_load(&s->stop) &&
		       (op = host_op_list_pop(&work)) != NULL) {
			host_op_run(s, op);
			host_op_release(s->hd, op);
			host_op_list_append(&done, op);
			ndone++;
		}
	}
	/* Left for stream_destroy, which joins this thread, to free. */
	pthread_mutex_lock(&s->lock);
	host_op_list_splice(&s->queue, &work);
	host_op_list_splice(&s->returned, &done);
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* ---- enqueueing -------------------------------------------------------- */

/*
 * Hand the pending ops to the worker, and take back the blocks it is done
 * with (device thread).  The lock is held for two splices: the worker holds
 * it only as briefly, so the device thread never waits on a running op.
 */
static void host_stream_start(struct driver_stream *s)
{
	struct host_op_list back;
	size_t nback;

	if (s->pending.head == NULL)
		return;
	pthread_mutex_lock(&s->lock);
	host_op_list_splice(&s->queue, &s->pending);
	atomic_store(&s->kick, 1);
	if (s->idle)
		pthread_cond_signal(&s->wake);
	host_op_list_init(&back);
	host_op_list_splice(&back, &s->returned);
	nback = s->nreturned;
	s->nreturned = 0;
	pthread_mutex_unlock(&s->lock);
	s->npending = 0;
	host_op_list_splice(&s->spare, &back);
	s->nspare += nback;
	while (s->nspare > HOST_SPARE_MAX) {
		free(host_op_list_pop(&s->spare));
		s->nspare--;
	}
}

/* Append n ops to s's pending list; a long list starts at once. */
static void host_stream_add(struct driver_stream *s, struct host_op_list *l,
			    size_t n)
{
	host_op_list_splice(&s->pending, l);
	s->npending += n;
	if (s->npending >= HOST_PENDING_MAX)
		host_stream_start(s);
}

/*
 * Nothing of s is pending, queued or running (device thread): an op run
 * now keeps the stream's order.  The lock orders what the worker did
 * before it went quiet (its copies, faulted) before what follows.
 */
static bool host_stream_quiet(struct driver_stream *s)
{
	bool quiet;

	if (s->capture != NULL || s->pending.head != NULL)
		return false;
	pthread_mutex_lock(&s->lock);
	quiet = s->queue.head == NULL && !s->busy && !atomic_load(&s->stop);
	pthread_mutex_unlock(&s->lock);
	return quiet;
}

/*
 * Whether tmpl is cheap enough to run on the device thread (see above):
 * its bytes (*bytes) fit what the stream's batch may still run inline.
 */
static bool host_op_inline(const struct driver_stream *s,
			   const struct host_op *tmpl, uint64_t *bytes)
{
	switch (tmpl->kind) {
	case HOST_OP_COPY:
		if (tmpl->u.copy.shape.height == 0 ||
		    tmpl->u.copy.shape.width >
			    s->inline_left / tmpl->u.copy.shape.height)
			return false;
		*bytes = (uint64_t)tmpl->u.copy.shape.width *
			 tmpl->u.copy.shape.height;
		return true;
	case HOST_OP_MEMSET:
		*bytes = tmpl->u.memset.n;
		return tmpl->u.memset.n <= s->inline_left;
	case HOST_OP_CALLBACK:
		*bytes = 0;
		return true;
	default:
		return false;
	}
}

/*
 * Queue a copy of tmpl on s, or append it to the graph s is capturing.  Only
 * the work itself is captured: markers and callbacks belong to one moment,
 * not to a graph that can be replayed.  A record or a callback starts
 * everything pending before it: another stream, or the daemon, may wait on it
 * and on nothing else.
 */
static int host_submit(struct host_driver *hd, struct driver_stream *s,
		       const struct host_op *tmpl)
{
	struct host_op *op;
	uint64_t bytes;

	/* A quiet stream: nothing to hand over, nothing to wait behind. */
	if (host_op_inline(s, tmpl, &bytes) && host_stream_quiet(s)) {
		struct host_op now = *tmpl;

		s->inline_left -= bytes;
		host_op_run(s, &now);
		return 0;
	}

	if (s->capture != NULL && tmpl->kind > HOST_OP_LAUNCH)
		return host_fail(hd, GPUCMD_EINVAL,
				 "%s cannot be captured into a graph: end the "
				 "capture first",
				 host_op_names[tmpl->kind]);
	op = host_op_dup(s, tmpl);
	if (op == NULL)
		return host_fail(hd, -ENOMEM,
				 "the host is out of memory to queue %s",
				 host_op_names[tmpl->kind]);
	if (s->capture != NULL) {
		host_op_list_append(&s->capture->ops, op);
		return 0;
	}
	host_op_list_append(&s->pending, op);
	if (++s->npending >= HOST_PENDING_MAX || tmpl->kind == HOST_OP_RECORD ||
	    tmpl->kind == HOST_OP_CALLBACK)
		host_stream_start(s);
	return 0;
}

static int host_copy(struct host_driver *hd, struct driver_stream *s, void *dst,
		     const void *src, const struct driver_copy2d *c)
{
	struct host_op op = { .kind = HOST_OP_COPY };

	if (c->height > 1 &&
	    (c->width > c->src_pitch || c->width > c->dst_pitch))
		return host_fail(hd, GPUCMD_EINVAL,
				 "a 2D copy's rows of %zu bytes do not fit its "
				 "pitches (source %zu, destination %zu bytes)",
				 c->width, c->src_pitch, c->dst_pitch);
	op.u.copy.dst = dst;
	op.u.copy.src = src;
	op.u.copy.shape = *c;
	return host_submit(hd, s, &op);
}

static int host_copy_linear(struct host_driver *hd, struct driver_stream *s,
			    void *dst, const void *src, size_t n)
{
	struct driver_copy2d c = {
		.width = n,
		.height = 1,
		.src_pitch = n,
		.dst_pitch = n,
	};

	return host_copy(hd, s, dst, src, &c);
}

static int host_copy_htod(struct driver *d, struct driver_stream *s,
			  uint64_t dst, const void *src, size_t n)
{
	return host_copy_linear(host_of(d), s, host_ptr(dst), src, n);
}

static int host_copy_dtoh(struct driver *d, struct driver_stream *s, void *dst,
			  uint64_t src, size_t n)
{
	return host_copy_linear(host_of(d), s, dst, host_ptr(src), n);
}

static int host_copy_dtod(struct driver *d, struct driver_stream *s,
			  uint64_t dst, uint64_t src, size_t n)
{
	return host_copy_linear(host_of(d), s, host_ptr(dst), host_ptr(src), n);
}

static int host_copy_htod_2d(struct driver *d, struct driver_stream *s,
			     uint64_t dst, const void *src,
			     const struct driver_copy2d *c)
{
	return host_copy(host_of(d), s, host_ptr(dst), src, c);
}

static int host_copy_dtoh_2d(struct driver *d, struct driver_stream *s,
			     void *dst, uint64_t src,
			     const struct driver_copy2d *c)
{
	return host_copy(host_of(d), s, dst, host_ptr(src), c);
}

static int host_memset_d8(struct driver *d, struct driver_stream *s,
			  uint64_t dst, uint8_t value, size_t n)
{
	struct host_op op = { .kind = HOST_OP_MEMSET };

	op.u.memset.dst = host_ptr(dst);
	op.u.memset.value = value;
	op.u.memset.n = n;
	return host_submit(host_of(d), s, &op);
}

static void host_flush(struct driver *d, struct driver_stream *s)
{
	s->inline_left = HOST_INLINE_MAX;
	host_stream_start(s);
}

static int host_host_callback(struct driver *d, struct driver_stream *s,
			      driver_callback_fn fn, void *arg)
{
	struct host_op op = { .kind = HOST_OP_CALLBACK };

	op.u.callback.fn = fn;
	op.u.callback.arg = arg;
	return host_submit(host_of(d), s, &op);
}

/* ---- streams ----------------------------------------------------------- */

/*
 * The system would not start a stream's worker (pthread_create's rc).
 * EAGAIN is a limit on threads: RLIMIT_NPROC counts the threads of every
 * process of the daemon's user, and a unit's TasksMax= (the cgroup's
 * pids.max) those of the daemon; say which and how to get out.
 */
static int worker_refused(struct host_driver *hd, int rc)
{
	struct rlimit rl;
	char nproc[32] = "unlimited";

	if (rc != EAGAIN)
		return host_fail(hd, -rc,
				 "cannot start the stream's worker "
				 "thread: %s",
				 strerror(rc));
	if (getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		snprintf(nproc, sizeof(nproc), "%llu",
			 (unsigned long long)rl.rlim_cur);
	return host_fail(hd, -rc,
			 "the system refused the stream a worker "
			 "thread (the host backend runs one a stream, %u "
			 "now): the daemon's user is at its RLIMIT_NPROC "
			 "(%s) or its unit at TasksMax= (pids.max); release "
			 "streams, or raise the limit",
			 atomic_load(&hd->workers), nproc);
}

static int host_stream_create(struct driver *d, struct driver_stream **out)
{
	struct host_driver *hd = host_of(d);
	struct driver_stream *s;
	sigset_t all, old;
	int rc;

	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return host_fail(hd, -ENOMEM,
				 "the host is out of memory for a stream");
	s->hd = hd;
	s->inline_left = HOST_INLINE_MAX;
	host_op_list_init(&s->queue);
	host_op_list_init(&s->returned);
	host_op_list_init(&s->pending);
	host_op_list_init(&s->spare);
	atomic_init(&s->stop, false);
	atomic_init(&s->kick, 0);
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->wake, NULL);
	/*
	 * The worker starts with every signal blocked (it inherits the mask),
	 * so that signals keep going to the thread that handles them.
	 */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&s->thread, NULL, host_stream_main, s);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		pthread_cond_destroy(&s->wake);
		pthread_mutex_destroy(&s->lock);
		free(s);
		return worker_refused(hd, rc);
	}
	atomic_fetch_add(&hd->workers, 1);
	pthread_setname_np(s->thread, "gpucmd-stream");
	*out = s;
	return 0;
}

/*
 * The caller destroys idle streams only; should work still be queued or
 * pending, it is dropped unrun (callbacks included), and a worker blocked in
 * an event wait is released, so that destroying never hangs the device
 * thread.  A kernel already running finishes first.
 */
static void host_stream_destroy(struct driver *d, struct driver_stream *s)
{
	struct host_driver *hd = host_of(d);

	pthread_mutex_lock(&s->lock);
	atomic_store(&s->stop, true);
	atomic_store(&s->kick, 1);
	pthread_cond_signal(&s->wake);
	pthread_mutex_unlock(&s->lock);
	/* stop is set before this lock is taken: the waiter cannot miss it. */
	pthread_mutex_lock(&hd->events_lock);
	pthread_cond_broadcast(&hd->events_done);
	pthread_mutex_unlock(&hd->events_lock);
	pthread_join(s->thread, NULL);
	atomic_fetch_sub(&hd->workers, 1);

	host_op_list_free(hd, &s->queue);
	host_op_list_free(hd, &s->pending);
	host_op_list_free_blocks(&s->returned);
	host_op_list_free_blocks(&s->spare);
	if (s->capture != NULL) {
		host_op_list_free(hd, &s->capture->ops);
		free(s->capture);
	}
	pthread_cond_destroy(&s->wake);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

/* ---- events ------------------------------------------------------------ */

static int host_event_create(struct driver *d, struct driver_event **out)
{
	struct driver_event *e = calloc(1, sizeof(*e));

	if (e == NULL)
		return host_fail(host_of(d), -ENOMEM,
				 "the host is out of memory for an event");
	*out = e;
	return 0;
}

static void host_event_destroy(struct driver *d, struct driver_event *e)
{
	if (e->last != NULL)
		host_marker_unref(host_of(d), e->last);
	free(e);
}

static int host_event_record(struct driver *d, struct driver_event *e,
			     struct driver_stream *s)
{
	struct host_driver *hd = host_of(d);
	struct host_op op = { .kind = HOST_OP_RECORD };
	struct host_marker *m;
	int rc;

	m = calloc(1, sizeof(*m));
	if (m == NULL)
		return host_fail(hd, -ENOMEM,
				 "the host is out of memory to record an "
				 "event");
	/* The event's reference and the queued op's: the worker may finish
	 * with its own before this function returns. */
	m->refs = 2;
	op.u.marker = m;
	rc = host_submit(hd, s, &op);
	if (rc != 0) {
		free(m);
		return rc;
	}
	if (e->last != NULL)
		host_marker_unref(hd, e->last);
	e->last = m;
	return 0;
}

static int host_event_wait(struct driver *d, struct driver_stream *s,
			   struct driver_event *e)
{
	struct host_driver *hd = host_of(d);
	struct host_op op = { .kind = HOST_OP_WAIT };
	int rc;

	/* Like CUDA, an event never recorded has nothing to wait for. */
	if (e->last == NULL)
		return 0;
	host_marker_ref(hd, e->last);
	op.u.marker = e->last;
	rc = host_submit(hd, s, &op);
	if (rc != 0)
		host_marker_unref(hd, e->last);
	return rc;
}

static bool host_marker_done(struct host_driver *hd, struct host_marker *m)
{
	bool done;

	pthread_mutex_lock(&hd->events_lock);
	done = m->done;
	pthread_mutex_unlock(&hd->events_lock);
	return done;
}

static int host_event_query(struct driver *d, struct driver_event *e)
{
	return e->last == NULL || host_marker_done(host_of(d), e->last);
}

static int host_event_elapsed(struct driver *d, struct driver_event *start,
			      struct driver_event *end, float *ms)
{
	struct host_driver *hd = host_of(d);
	struct host_marker *a = start->last, *b = end->last;
	double diff;

	if (a == NULL || b == NULL)
		return host_fail(hd, GPUCMD_EINVAL,
				 "event_elapsed needs two events that were "
				 "recorded");
	if (!host_marker_done(hd, a) || !host_marker_done(hd, b))
		return host_fail(hd, GPUCMD_EBUSY,
				 "event_elapsed needs two completed events; "
				 "the work before one is still running");
	/* Done markers are never written again: at is read without the lock
	 * (host_marker_done's lock ordered it after the write). */
	diff = (double)(b->at.tv_sec - a->at.tv_sec) * 1e3 +
	       (double)(b->at.tv_nsec - a->at.tv_nsec) / 1e6;
	*ms = (float)diff;
	return 0;
}

/* ---- kernels ----------------------------------------------------------- */

static const char host_no_modules[] =
	"the host backend cannot load PTX/cubin modules; run gpucmdd on the "
	"CUDA backend";

static int host_module_load(struct driver *d, enum driver_module_format fmt,
			    const void *data, size_t len,
			    struct driver_module **out, char *log,
			    size_t log_len)
{
	if (log != NULL && log_len > 0)
		snprintf(log, log_len, "%s", host_no_modules);
	return host_fail(host_of(d), GPUCMD_EUNSUPPORTED, "%s",
			 host_no_modules);
}

/*
 * The same refusal from a compile thread, after the test hook's delay
 * (driver_options.test_compile_delay_ms): it stands for a long compile, so
 * that tests can show one does not hold the device thread up.
 */
static int host_module_load_shared(struct driver *d,
				   enum driver_module_format fmt,
				   const void *data, size_t len,
				   struct driver_module **out, char *err,
				   size_t err_len, char *log, size_t log_len)
{
	unsigned ms = host_of(d)->compile_delay_ms;
	struct timespec ts = {
		.tv_sec = ms / 1000,
		.tv_nsec = (long)(ms % 1000) * 1000000,
	};

	(void)fmt;
	(void)data;
	(void)len;
	(void)out;
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
	snprintf(err, err_len, "%s", host_no_modules);
	if (log != NULL && log_len > 0)
		snprintf(log, log_len, "%s", host_no_modules);
	return GPUCMD_EUNSUPPORTED;
}

/* No module can have been loaded. */
static void host_module_unload(struct driver *d, struct driver_module *m)
{
}

static int host_module_function(struct driver *d, struct driver_module *m,
				const char *name, struct driver_function **out)
{
	return host_fail(host_of(d), GPUCMD_EUNSUPPORTED,
			 "the host backend has no modules; only the built-in "
			 "kernels run on it");
}

static int host_builtin_function(struct driver *d, const char *name,
				 struct driver_function **out)
{
	struct host_driver *hd = host_of(d);
	const struct builtin_kernel *k, *all;
	struct driver_function *f = hd->last_function;
	size_t n;

	if (f != NULL && strcmp(f->kernel->name, name) == 0) {
		*out = f;
		return 0;
	}
	k = builtin_find(name);
	all = builtin_all(&n);
	f = k != NULL ? &hd->functions[k - all] : NULL;
	if (f != NULL && f->fn == NULL) {
		f->fn = host_kernel_find(name);
		f->kernel = k;
	}
	if (f == NULL || f->fn == NULL)
		return host_fail(hd, GPUCMD_ENOKERNEL,
				 "there is no built-in kernel named \"%.64s\" "
				 "(gpucmd status lists them)",
				 name);
	hd->last_function = f;
	*out = f;
	return 0;
}

/* Bytes of one argument of the given signature character. */
static size_t host_arg_size(char kind)
{
	switch (kind) {
	case BUILTIN_ARG_BUF_OUT:
	case BUILTIN_ARG_BUF_IN:
	case BUILTIN_ARG_U64:
		return 8;
	default:
		return 4;
	}
}

/* The limits a GPU would refuse a launch on, from the properties. */
static int host_check_geometry(struct host_driver *hd, const char *name,
			       const uint32_t grid[3], const uint32_t block[3],
			       uint32_t shared_bytes)
{
	const struct driver_properties *p = &hd->base.props;
	uint64_t threads = (uint64_t)block[0] * block[1] * block[2];

	for (int i = 0; i < 3; i++)
		if (grid[i] == 0 || grid[i] > p->max_grid[i] || block[i] == 0 ||
		    block[i] > p->max_block[i])
			return host_fail(hd, GPUCMD_ELAUNCH,
					 "launch of %s refused: grid %ux%ux%u "
					 "and block %ux%ux%u must be at least "
					 "1 and at most %ux%ux%u and "
					 "%ux%ux%u",
					 name, grid[0], grid[1], grid[2],
					 block[0], block[1], block[2],
					 p->max_grid[0], p->max_grid[1],
					 p->max_grid[2], p->max_block[0],
					 p->max_block[1], p->max_block[2]);
	if (threads > p->max_threads_per_block)
		return host_fail(hd, GPUCMD_ELAUNCH,
				 "launch of %s refused: a block of %" PRIu64
				 " threads is over the limit of %u",
				 name, threads, p->max_threads_per_block);
	if (shared_bytes > p->max_shared_bytes)
		return host_fail(hd, GPUCMD_ELAUNCH,
				 "launch of %s refused: %u bytes of shared "
				 "memory are over the limit of %u",
				 name, shared_bytes, p->max_shared_bytes);
	return 0;
}

static int host_launch(struct driver *d, struct driver_stream *s,
		       struct driver_function *f, const uint32_t grid[3],
		       const uint32_t block[3], uint32_t shared_bytes,
		       void **params, const size_t *param_sizes, size_t nparams)
{
	struct host_driver *hd = host_of(d);
	const struct builtin_kernel *k = f->kernel;
	struct host_op op = { .kind = HOST_OP_LAUNCH };
	size_t want = strlen(k->signature);
	int rc;

	rc = host_check_geometry(hd, k->name, grid, block, shared_bytes);
	if (rc != 0)
		return rc;
	if (nparams != want)
		return host_fail(hd, GPUCMD_EINVAL,
				 "%s takes %zu arguments, not %zu", k->usage,
				 want, nparams);
	for (size_t i = 0; i < nparams; i++) {
		size_t size = host_arg_size(k->signature[i]);

		if (params[i] == NULL || param_sizes[i] != size)
			return host_fail(hd, GPUCMD_EINVAL,
					 "argument %zu of %s must be a value "
					 "of %zu bytes, not %zu",
					 i, k->usage, size, param_sizes[i]);
		/* All members of the union start at its address. */
		memcpy(&op.u.launch.args[i], params[i], size);
	}
	rc = builtin_check(k, op.u.launch.args, hd->base.error,
			   sizeof(hd->base.error));
	if (rc != 0)
		return rc;
	op.u.launch.fn = f->fn;
	return host_submit(hd, s, &op);
}

/* ---- graphs ------------------------------------------------------------ */

static int host_capture_begin(struct driver *d, struct driver_stream *s)
{
	struct host_driver *hd = host_of(d);
	struct driver_graph *g;

	if (s->capture != NULL)
		return host_fail(hd, GPUCMD_EINVAL,
				 "the stream is already capturing a graph");
	g = calloc(1, sizeof(*g));
	if (g == NULL)
		return host_fail(hd, -ENOMEM,
				 "the host is out of memory for a graph");
	host_op_list_init(&g->ops);
	s->capture = g;
	return 0;
}

static int host_capture_end(struct driver *d, struct driver_stream *s,
			    struct driver_graph **out)
{
	if (s->capture == NULL)
		return host_fail(host_of(d), GPUCMD_EINVAL,
				 "capture_end on a stream that is not "
				 "capturing");
	*out = s->capture;
	s->capture = NULL;
	return 0;
}

static int host_graph_launch(struct driver *d, struct driver_graph *g,
			     struct driver_stream *s)
{
	struct host_driver *hd = host_of(d);
	struct host_op_list copy;
	size_t n = 0;

	if (s->capture != NULL)
		return host_fail(hd, GPUCMD_EINVAL,
				 "a graph launch cannot be captured into a "
				 "graph: end the capture first");
	/*
	 * Copied whole before anything is queued: all or nothing.  The copy
	 * goes behind the stream's pending ops, like any other work.
	 */
	host_op_list_init(&copy);
	for (const struct host_op *op = g->ops.head; op; op = op->next) {
		struct host_op *dup = host_op_dup(s, op);

		if (dup == NULL) {
			/* Captured ops hold no marker: blocks only. */
			host_op_list_free_blocks(&copy);
			return host_fail(hd, -ENOMEM,
					 "the host is out of memory to launch "
					 "a graph");
		}
		host_op_list_append(&copy, dup);
		n++;
	}
	host_stream_add(s, &copy, n);
	return 0;
}

static void host_graph_destroy(struct driver *d, struct driver_graph *g)
{
	host_op_list_free(host_of(d), &g->ops);
	free(g);
}

/* ---- the device -------------------------------------------------------- */

static int host_open(struct driver *d, int device,
		     struct driver_properties *props)
{
	if (device != 0)
		return host_fail(host_of(d), GPUCMD_EINVAL,
				 "the host backend has one device, 0; there "
				 "is no device %d",
				 device);
	*props = d->props;
	return 0;
}

static void host_close(struct driver *d)
{
	struct host_driver *hd = host_of(d);

	/* What is still allocated goes with the device, as with CUDA. */
	host_heap_clear(&hd->device);
	host_heap_clear(&hd->pinned);
	pthread_cond_destroy(&hd->events_done);
	pthread_mutex_destroy(&hd->events_lock);
	free(hd->functions);
	free(hd);
}

static const struct driver_ops host_ops = {
	.name = "host",
	.open = host_open,
	.close = host_close,
	.stream_create = host_stream_create,
	.stream_destroy = host_stream_destroy,
	.event_create = host_event_create,
	.event_destroy = host_event_destroy,
	.event_record = host_event_record,
	.event_wait = host_event_wait,
	.event_query = host_event_query,
	.event_elapsed = host_event_elapsed,
	.flush = host_flush,
	.host_callback = host_host_callback,
	.mem_alloc = host_mem_alloc,
	.mem_free = host_mem_free,
	.host_alloc = host_host_alloc,
	.host_free = host_host_free,
	.host_register = host_host_register,
	.host_unregister = host_host_unregister,
	.copy_htod = host_copy_htod,
	.copy_dtoh = host_copy_dtoh,
	.copy_dtod = host_copy_dtod,
	.copy_htod_2d = host_copy_htod_2d,
	.copy_dtoh_2d = host_copy_dtoh_2d,
	.memset_d8 = host_memset_d8,
	.mem_info = host_mem_info,
	.module_load = host_module_load,
	.module_load_shared = host_module_load_shared,
	.module_unload = host_module_unload,
	.module_function = host_module_function,
	.builtin_function = host_builtin_function,
	.launch = host_launch,
	.capture_begin = host_capture_begin,
	.capture_end = host_capture_end,
	.graph_launch = host_graph_launch,
	.graph_destroy = host_graph_destroy,
};

static void host_properties(struct driver_properties *p, uint64_t budget)
{
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "host (CPU)");
	snprintf(p->backend, sizeof(p->backend), "host");
	p->total_memory = budget;
	p->max_page_size = budget / 4;
	p->alignment = HOST_ALIGNMENT;
	p->mem_alloc_zeroes = true;
	p->graph_launch_copies = true;
	p->max_threads_per_block = 1024;
	p->max_grid[0] = INT32_MAX;
	p->max_grid[1] = 65535;
	p->max_grid[2] = 65535;
	p->max_block[0] = 1024;
	p->max_block[1] = 1024;
	p->max_block[2] = 64;
	p->max_shared_bytes = 48 * 1024;
}

int driver_host_create(const struct driver_options *opt, struct driver **out)
{
	uint64_t budget =
		opt->host_memory ? opt->host_memory : HOST_DEFAULT_MEMORY;
	struct host_driver *hd;
	size_t nbuiltins;

	hd = calloc(1, sizeof(*hd));
	if (hd == NULL)
		return -ENOMEM;
	builtin_all(&nbuiltins);
	hd->functions = calloc(nbuiltins, sizeof(*hd->functions));
	if (hd->functions == NULL) {
		free(hd);
		return -ENOMEM;
	}
	hd->base.ops = &host_ops;
	host_properties(&hd->base.props, budget);
	host_heap_init(&hd->device, "host-backend device memory", budget);
	host_heap_init(&hd->pinned, "pinned host memory", UINT64_MAX);
	hd->fail_alloc_at = opt->host_fail_alloc_at;
	hd->spin_us = opt->spin_us;
	hd->stream_nice = opt->stream_nice;
	hd->compile_delay_ms = opt->test_compile_delay_ms;
	pthread_mutex_init(&hd->events_lock, NULL);
	pthread_cond_init(&hd->events_done, NULL);
	*out = &hd->base;
	return 0;
}
