/*
 * streams.c - see streams.h.
 */
#include "streams.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpucmd.h"
#include "log.h"
#include "graph.h"
#include "memory/drop_queue.h"
#include "memory/shared_buffer.h"
#include "module.h"
#include "region.h"
#include "service.h"

/*
 * The storage behind a stream's memory manager.  Fresh device memory is
 * zeroed on the owning stream before anything can use it, so a service never
 * sees bytes another service left in memory the device handed back out.
 *
 * It also keeps the service's quota on device memory itself: what all its
 * streams' pools hold (pages and allocations, live, cached or busy) stays
 * within service_reserve_cap (4 x its memory_limit, 256M at least).  The
 * quota on live bytes alone would let small buffers, each keeping a whole
 * page, hold many times the limit over many streams, memory no other
 * service could reclaim.  A refusal is noted
 * on the set (quota_refused) for command_reserve, which gives back what the
 * service holds idle and tries again before it answers GPUCMD_EQUOTA.
 */
static int storage_alloc(void *ctx, uint64_t size, uint64_t *ptr)
{
	struct stream *s = ctx;
	struct driver *d = s->set->driver;
	struct service *svc = s->set->service;
	uint64_t limit = s->set->quota_limit_held ?
				 s->set->quota_limit :
				 atomic_load(&svc->memory_limit);
	uint64_t p;
	int rc;

	if (s->set->reuse_only)
		return GPUCMD_ENOMEM;
	if (limit != 0 &&
	    service_reserve_over(svc, limit, size, s->set->reserve_exact)) {
		s->set->quota_refused = size;
		return GPUCMD_EQUOTA;
	}
	rc = d->ops->mem_alloc(d, size, &p);
	if (rc != 0)
		return rc;
	if (!d->props.mem_alloc_zeroes) {
		rc = d->ops->memset_d8(d, s->ds, p, 0, size);
		if (rc != 0) {
			d->ops->mem_free(d, p);
			return rc;
		}
	}
	svc->bytes_reserved += size;
	*ptr = p;
	return 0;
}

static void storage_free(void *ctx, uint64_t ptr, uint64_t size)
{
	struct stream *s = ctx;
	struct driver *d = s->set->driver;

	d->ops->mem_free(d, ptr);
	s->set->service->bytes_reserved -= size;
}

int stream_set_create(struct driver *d, struct service *svc,
		      uint64_t connection_id, const struct config_limits *lim,
		      const struct memory_configuration *layout,
		      struct stream_set **out)
{
	struct stream_set *set = calloc(1, sizeof(*set));
	int rc;

	if (set == NULL)
		return GPUCMD_ENOMEM;
	rc = handle_table_create(lim->max_handles, &set->handles);
	if (rc == 0)
		rc = handle_table_create(lim->max_handles, &set->reservations);
	if (rc != 0) {
		handle_table_destroy(set->handles);
		free(set);
		return rc;
	}
	set->driver = d;
	set->service = svc;
	set->connection_id = connection_id;
	/*
	 * lim is the connection's, service limit included, as its Welcome
	 * said: a reload since then does not change it.
	 */
	set->max_streams =
		lim->max_streams < STREAMS_MAX ? lim->max_streams : STREAMS_MAX;
	set->layout = *layout;
	set->props.max_page_size = d->props.max_page_size;
	set->props.alignment = d->props.alignment;
	*out = set;
	return 0;
}

static void stream_destroy(struct stream *s)
{
	struct driver *d = s->set->driver;

	/* The drop queue gives its slices back before the manager goes. */
	drop_queue_destroy(s->drops);
	if (s->memory != NULL)
		memory_manager_destroy(s->memory);
	if (s->event != NULL)
		d->ops->event_destroy(d, s->event);
	if (s->ds != NULL)
		d->ops->stream_destroy(d, s->ds);
	free(s);
}

static void fill_settle(struct shared_buffer *sb, enum shared_state state)
{
	sb->filler->filling--;
	sb->filler = NULL;
	sb->state = state;
}

/*
 * One reference of sb goes (its holder's uses have run).  The last one
 * frees it; should its copy still count as in flight then (it cannot: the
 * copy's fence is among the holders'), its stream's count is set right.
 */
static void shared_put(struct stream_set *set, struct shared_buffer *sb)
{
	if (sb->refs == 1 && sb->state == SHARED_FILLING)
		fill_settle(sb, SHARED_LOST);
	shared_buffer_put(set->driver, sb);
}

static void release_at_teardown(struct handle *h, void *arg)
{
	struct stream_set *set = arg;

	if (h->shared != NULL) {
		/* Every stream is idle: this connection is done with it. */
		shared_put(set, h->shared);
	} else {
		service_uncharge(set->service, h->alloc.size);
		memory_manager_release(h->owner->memory, h->alloc.slice);
	}
	handle_free(h);
}

/* Give back the references of released shared handles whose uses ran. */
static void shared_drops_flush(struct stream_set *set, bool all)
{
	struct shared_drop **pp = &set->dropped_shared;

	while (*pp != NULL) {
		struct shared_drop *d = *pp;

		if (!all && !streams_fences_passed(d->fences, d->nfences)) {
			pp = &d->next;
			continue;
		}
		*pp = d->next;
		shared_put(set, d->sb);
		free(d);
	}
}

/*
 * A buffer this connection shared whose copy is still on one of its
 * streams: complete once its fence passed, lost if the stream goes
 * without it (held, or the device lost), for import to say so.
 */
static void shared_fills_settle(struct stream_set *set)
{
	for (struct shared_buffer *sb = set->service->shared; sb;
	     sb = sb->next) {
		if (sb->state != SHARED_FILLING || sb->filler->set != set)
			continue;
		fill_settle(sb, stream_completed(sb->filler) >= sb->fill_seq &&
						!sb->filler->fault_pending &&
						!sb->unconfirmed ?
					SHARED_READY :
					SHARED_LOST);
	}
}

void streams_fills_done(struct stream *s, uint64_t seq)
{
	for (struct shared_buffer *sb = s->set->service->shared;
	     sb != NULL && s->filling > 0; sb = sb->next) {
		if (sb->state != SHARED_FILLING || sb->filler != s ||
		    sb->fill_seq > seq)
			continue;
		/*
		 * A fault of the work before the copy, or of the copy: the
		 * bytes may not be what the sharer meant, and the share's
		 * answer says so (it is the batch's wait).
		 */
		fill_settle(sb, s->fault_pending || sb->unconfirmed ?
					SHARED_LOST :
					SHARED_READY);
	}
}

/*
 * Give back the cache references of unloaded modules whose earlier
 * launches have run (all of them when every stream is idle).
 */
static void module_drops_flush(struct stream_set *set, bool all)
{
	struct module_drop **pp = &set->dropped_modules;

	while (*pp != NULL) {
		struct module_drop *d = *pp;

		if (!all && !streams_fences_passed(d->fences, d->nfences)) {
			pp = &d->next;
			continue;
		}
		*pp = d->next;
		module_cache_put(set->module_cache, d->ref.entry);
		service_module_unref(set->service, d->ref.entry);
		free(d);
	}
}

static struct module_drop *drop_of(struct module_ref *ref)
{
	return (struct module_drop *)((char *)ref -
				      offsetof(struct module_drop, ref));
}

_Static_assert(offsetof(struct module_drop, ref) == 0,
	       "a module_ref is its module_drop's address");

struct module_ref *streams_module_ref_new(void)
{
	/* The ref opens the record, so its address is the allocation's. */
	return calloc(1, sizeof(struct module_drop));
}

void streams_module_ref_free(struct module_ref *ref)
{
	if (ref != NULL)
		free(drop_of(ref));
}

void streams_drop_module(struct stream_set *set, struct stream *current,
			 struct module_ref *ref)
{
	struct module_drop *d = drop_of(ref);

	d->nfences = streams_fence_all(set, current, d->fences);
	d->next = set->dropped_modules;
	set->dropped_modules = d;
}

void streams_closing(struct stream_set *set)
{
	set->closing = true;
	/*
	 * Its own handles of them go later, with the set; from now on only
	 * imports can keep them for anyone, and the report says that.
	 */
	for (struct shared_buffer *sb = set->service->shared; sb; sb = sb->next)
		if (sb->charged && sb->connection == set->connection_id)
			sb->sharer_open = false;
}

void stream_set_destroy(struct stream_set *set)
{
	struct driver *d;

	if (set == NULL)
		return;
	d = set->driver;
	/* Graphs first: they hold references on handles. */
	for (uint32_t i = 0; i < set->nstreams; i++) {
		struct stream *s = set->slots[i];
		struct driver_graph *dg = NULL;

		if (s->capturing && d->ops->capture_end(d, s->ds, &dg) == 0 &&
		    dg != NULL)
			d->ops->graph_destroy(d, dg);
		graph_free(d, s->recording);
		s->recording = NULL;
		s->capturing = false;
	}
	for (int l = 0; l < 2; l++) {
		struct graph **list = l ? &set->dead_graphs : &set->graphs;

		while (*list != NULL) {
			struct graph *g = *list;
			*list = g->next;
			graph_free(d, g);
		}
	}
	while (set->profiles != NULL) {
		struct profile *p = set->profiles;
		set->profiles = p->next;
		d->ops->event_destroy(d, p->start);
		free(p);
	}
	region_teardown(set);
	/* Every stream is idle: nothing runs the modules any more. */
	module_drops_flush(set, true);
	shared_fills_settle(set);
	shared_drops_flush(set, true);
	while (set->modules != NULL) {
		struct module_ref *m = set->modules;
		set->modules = m->next;
		module_cache_put(set->module_cache, m->entry);
		service_module_unref(set->service, m->entry);
		streams_module_ref_free(m);
	}
	handle_table_drain(set->reservations, release_at_teardown, set);
	handle_table_destroy(set->reservations);
	handle_table_drain(set->handles, release_at_teardown, set);
	handle_table_destroy(set->handles);
	for (uint32_t i = 0; i < set->nstreams; i++)
		stream_destroy(set->slots[i]);
	free(set);
}

/*
 * The device properties a preset layout of set is sized from: the
 * device's, with max_page_size at most four times the service's
 * memory_limit (or SERVICE_MIN_PAGE_UNIT, if larger), so that the
 * largest sliced page (a quarter of it) is no larger than that.  One
 * small live buffer (or a release the device still uses) keeps its whole
 * page, and the service may hold four times its limit in all
 * (service_reserve_cap): on a large device, pages sized to the device
 * (an H200's largest are 8.8 GB) would let one small buffer take a
 * 1 GB service past it.  Read at each stream's creation and layout, so
 * a reloaded limit applies to the streams made after it.
 */
void streams_layout_props(const struct stream_set *set,
			  struct memory_device_properties *out)
{
	uint64_t limit = atomic_load(&set->service->memory_limit);
	uint64_t align = set->props.alignment;
	uint64_t cap;

	*out = set->props;
	if (limit == 0 || align == 0)
		return;
	if (limit < SERVICE_MIN_PAGE_UNIT)
		limit = SERVICE_MIN_PAGE_UNIT;
	if (limit > out->max_page_size / 4)
		return;
	cap = (4 * limit) & ~(align - 1);
	if (cap >= align && cap < out->max_page_size) {
		out->max_page_size = cap;
		/* Small buffers on many streams: small pages for them. */
		out->min_page_size = SERVICE_MIN_PAGE;
	}
}

static int stream_create(struct stream_set *set, uint32_t number,
			 struct stream **out)
{
	struct driver *d = set->driver;
	struct stream *s = calloc(1, sizeof(*s));
	struct memory_storage storage;
	int rc;

	if (s == NULL)
		return GPUCMD_ENOMEM;
	s->set = set;
	s->number = number;
	s->slot = (uint16_t)set->nstreams;
	storage.alloc = storage_alloc;
	storage.free = storage_free;
	storage.ctx = s;
	rc = d->ops->stream_create(d, &s->ds);
	if (rc == 0)
		rc = d->ops->event_create(d, &s->event);
	if (rc == 0) {
		struct memory_device_properties props;

		streams_layout_props(set, &props);
		rc = memory_manager_create(&set->layout, &props, &storage,
					   &s->memory);
	}
	if (rc == 0) {
		memory_manager_set_completed(s->memory, &s->completed);
		rc = drop_queue_create(s->memory,
				       &set->service->release_pending_bytes,
				       &set->service->ordered_pending_bytes,
				       &s->drops);
	}
	if (rc != 0) {
		stream_destroy(s);
		return rc;
	}
	*out = s;
	return 0;
}

/*
 * Streams the system would not make (threads, host memory, the driver): a
 * client may ask again at once, but the operator must hear of it.  Device
 * thread only.
 */
static struct log_limit refused_lines =
	LOG_LIMIT_INIT("stream creation failures", 10, 3);

int streams_get(struct stream_set *set, uint32_t number, struct stream **out,
		char *msg, size_t msg_len)
{
	struct stream *s;
	int rc;

	for (uint32_t i = 0; i < set->nstreams; i++) {
		if (set->slots[i]->number == number) {
			*out = set->slots[i];
			return 0;
		}
	}
	if (set->nstreams >= set->max_streams) {
		snprintf(msg, msg_len,
			 "stream %u would be a new stream, and this connection "
			 "has streams up to its limit of %u (max_streams): "
			 "reuse one of its stream numbers",
			 number, set->max_streams);
		return GPUCMD_ELIMIT;
	}
	rc = stream_create(set, number, &s);
	if (rc != 0) {
		snprintf(msg, msg_len, "cannot create stream %u: %s%s%s",
			 number, gpucmd_strerror(rc),
			 set->driver->error[0] ? ": " : "", set->driver->error);
		if (log_limit_take(&refused_lines))
			log_warn("service %s: %s", set->service->name, msg);
		return rc;
	}
	set->slots[set->nstreams++] = s;
	*out = s;
	return 0;
}

/* Make current wait for stream `slot` up to at least its cursor `upto`. */
static int wait_for(struct stream_set *set, struct stream *current,
		    uint32_t slot, uint64_t upto)
{
	struct driver *d = set->driver;
	struct stream *other = set->slots[slot];
	int rc;

	if (slot == current->slot || current->synced[slot] >= upto)
		return 0;
	/*
	 * The use has completed (a fence after it passed): nothing to wait
	 * for, even while other records a graph or runs later work.
	 */
	if (upto <= other->completed_cursor) {
		current->synced[slot] = other->completed_cursor;
		return 0;
	}
	/* Everything enqueued on other has completed: nothing to wait for. */
	if (!other->capturing && other->completed == other->submitted) {
		current->synced[slot] = other->cursor;
		return 0;
	}
	/*
	 * A recording stream's work has not run, and waiting across a
	 * capture would pull the other stream into it (CUDA: its work is
	 * recorded instead of run, or the capture is invalidated).
	 */
	if (other->capturing) {
		snprintf(d->error, sizeof(d->error),
			 "this buffer was last used on stream %u, which "
			 "records a graph: use it on stream %u only after "
			 "capture_end",
			 other->number, current->number);
		return GPUCMD_EINVAL;
	}
	if (current->capturing) {
		snprintf(d->error, sizeof(d->error),
			 "stream %u records a graph, and this buffer's last "
			 "use on stream %u has not finished: sync stream %u "
			 "before capture_begin",
			 current->number, other->number, other->number);
		return GPUCMD_EINVAL;
	}
	rc = d->ops->event_record(d, other->event, other->ds);
	if (rc == 0)
		rc = d->ops->event_wait(d, current->ds, other->event);
	if (rc != 0)
		return rc;
	current->synced[slot] = other->cursor;
	return 0;
}

static int note_reader(struct handle *h, uint16_t slot, uint64_t cursor)
{
	for (uint32_t i = 0; i < h->nreaders; i++) {
		if (h->readers[i].slot == slot) {
			h->readers[i].cursor = cursor;
			return 0;
		}
	}
	if (h->nreaders == h->readers_cap) {
		uint32_t cap = h->readers_cap ? h->readers_cap * 2 : 2;
		struct handle_use *n = realloc(h->readers, cap * sizeof(*n));
		if (n == NULL)
			return GPUCMD_ENOMEM;
		h->readers = n;
		h->readers_cap = cap;
	}
	h->readers[h->nreaders].slot = slot;
	h->readers[h->nreaders].cursor = cursor;
	h->nreaders++;
	return 0;
}

int streams_resolve(struct stream_set *set, struct stream *current,
		    const struct binding *b, size_t n, struct resolved *out)
{
	int rc;

	/* First every wait, so the command is ordered behind all of them. */
	for (size_t i = 0; i < n; i++) {
		const struct handle *h = b[i].handle;

		if (h->writer_slot >= 0) {
			rc = wait_for(set, current, (uint32_t)h->writer_slot,
				      h->writer_cursor);
			if (rc != 0)
				return rc;
		}
		if (!b[i].write)
			continue;
		for (uint32_t r = 0; r < h->nreaders; r++) {
			rc = wait_for(set, current, h->readers[r].slot,
				      h->readers[r].cursor);
			if (rc != 0)
				return rc;
		}
	}
	current->cursor++;
	/* Then record the new uses at the cursor of this command. */
	for (size_t i = 0; i < n; i++) {
		struct handle *h = b[i].handle;

		if (b[i].write) {
			h->writer_slot = current->slot;
			h->writer_cursor = current->cursor;
			h->nreaders = 0;
		} else {
			rc = note_reader(h, current->slot, current->cursor);
			if (rc != 0)
				return rc;
		}
	}
	out->set = set;
	out->current = current;
	out->cursor = current->cursor;
	return 0;
}

/*
 * The fence that covers everything enqueued on s so far: its last one for
 * other streams (their batches have ended, each with a fence), the next one
 * for the stream whose batch is running now (its fence comes at the batch's
 * end, or at the next real batch when it is recording a graph).
 */
static void add_fence(struct drop_fence *f, uint32_t *n, const struct stream *s,
		      const struct stream *current)
{
	for (uint32_t i = 0; i < *n; i++)
		if (f[i].stream == s)
			return;
	f[*n].stream = s;
	f[*n].seq = s == current ? stream_next_fence(s) : s->submitted;
	(*n)++;
}

/* Everything s was given so far has run (its fences passed). */
static bool stream_done(const struct stream *s)
{
	return !s->capturing && s->completed == s->submitted &&
	       s->completed_cursor >= s->cursor;
}

/*
 * Whether the device is known to be done with h, as streams_release's
 * fences would tell once passed: the owner and current have run all they
 * were given (a kernel may hold the buffer's address without naming it),
 * and its last write and the reads since (the write waited for what came
 * before) ran under fences that have passed, as wait_for judges a use.
 */
static bool uses_completed(const struct stream_set *set,
			   const struct stream *current, const struct handle *h)
{
	if (!stream_done(h->owner) || !stream_done(current) ||
	    h->writer_slot < 0 ||
	    h->writer_cursor > set->slots[h->writer_slot]->completed_cursor)
		return false;
	for (uint32_t i = 0; i < h->nreaders; i++)
		if (h->readers[i].cursor >
		    set->slots[h->readers[i].slot]->completed_cursor)
			return false;
	return true;
}

/*
 * Everyone who may still touch h's memory: the owner (it zeroed and may
 * have used it), the last writer, the readers since, and the stream the
 * release arrives on.  Earlier writers and readers were waited on by the
 * last writer, so its fence covers them.
 */
static uint32_t use_fences(const struct stream_set *set,
			   const struct stream *current, const struct handle *h,
			   struct drop_fence *fences)
{
	uint32_t n = 0;

	add_fence(fences, &n, h->owner, current);
	add_fence(fences, &n, current, current);
	if (h->writer_slot >= 0)
		add_fence(fences, &n, set->slots[h->writer_slot], current);
	for (uint32_t i = 0; i < h->nreaders; i++)
		add_fence(fences, &n, set->slots[h->readers[i].slot], current);
	return n;
}

/* Give h's memory back to its owner's pools, now or after its fences. */
static int release_memory(struct stream_set *set, struct stream *current,
			  struct handle *h)
{
	struct drop_fence fences[STREAMS_MAX];
	uint32_t n;
	int rc;

	/*
	 * Every use has finished (a sync in an earlier request saw to it),
	 * and nothing was queued since: the memory is free now, for a
	 * cleanup or a layout later in this very batch too, not only once
	 * the batch's own fence has passed.
	 */
	if (uses_completed(set, current, h)) {
		memory_manager_release(h->owner->memory, h->alloc.slice);
		return 0;
	}
	n = use_fences(set, current, h, fences);
	/*
	 * Only the owner used it, and the release comes on the owner: the
	 * owner's later work runs after its earlier work, so the slice is
	 * free for the owner's next reservation at once (stream-ordered
	 * reuse); only its device allocation waits for the fence.  Not while
	 * the owner records a graph: the graph may run the earlier work
	 * again, any time later.
	 */
	if (n == 1 && h->owner == current && !current->capturing) {
		/*
		 * Its bytes stay counted against the quota until the fence:
		 * its device memory cannot be given back before then, and a
		 * loop of new sizes behind a long kernel would otherwise grow
		 * without a bound (the stream reuses only what fits).
		 */
		rc = drop_queue_push_ordered(h->owner->drops, h->alloc.size,
					     &fences[0],
					     &h->owner->ordered_pending);
		if (rc != 0)
			return rc;
		if (!memory_manager_busy(h->owner->memory))
			h->owner->ordered_free = 0;
		h->owner->ordered_free += h->alloc.size;
		memory_manager_release_after(h->owner->memory, h->alloc.slice,
					     fences[0].seq);
		return 0;
	}
	return drop_queue_push(h->owner->drops, h->alloc.slice, h->alloc.size,
			       fences, n);
}

/*
 * Drop one reference of a shared buffer once this connection's uses of h
 * have run; d is the record that waits for them (taken, or freed).
 */
static void release_shared(struct stream_set *set, struct stream *current,
			   const struct handle *h, struct shared_buffer *sb,
			   struct shared_drop *d)
{
	if (uses_completed(set, current, h)) {
		free(d);
		shared_put(set, sb);
		return;
	}
	d->sb = sb;
	d->nfences = use_fences(set, current, h, d->fences);
	d->next = set->dropped_shared;
	set->dropped_shared = d;
}

int streams_release(struct stream_set *set, struct stream *current,
		    struct handle *h)
{
	int rc;

	if (h->graph_refs > 0)
		return GPUCMD_EBUSY;
	if (h->shared != NULL) {
		struct shared_drop *d = malloc(sizeof(*d));

		if (d == NULL)
			return GPUCMD_ENOMEM;
		release_shared(set, current, h, h->shared, d);
	} else {
		rc = release_memory(set, current, h);
		if (rc != 0)
			return rc;
		service_uncharge(set->service, h->alloc.size);
	}
	handle_table_remove(set->handles, h->id);
	handle_free(h);
	return 0;
}

int streams_share(struct stream_set *set, struct stream *current,
		  struct handle *h, struct shared_buffer *sb)
{
	struct driver *d = set->driver;
	struct shared_drop *spare = malloc(sizeof(*spare));
	int rc;

	if (spare == NULL)
		return GPUCMD_ENOMEM;
	/* current waited for h's last write (the caller resolved h). */
	rc = sb->size > 0 ? d->ops->copy_dtod(d, current->ds, sb->ptr,
					      h->alloc.ptr, sb->size) :
			    0;
	if (rc != 0) {
		/*
		 * Nothing was enqueued that uses sb: it goes now.  Left in
		 * the service's list it would stay there for good, in
		 * SHARED_FILLING with no filler for shared_fills_settle to
		 * look at when a connection of the service goes.
		 */
		sb->state = SHARED_LOST;
		shared_buffer_put(d, sb);
		free(spare);
		return rc;
	}
	/* After the copy: its fence must cover the copy's read. */
	rc = release_memory(set, current, h);
	if (rc != 0) {
		/* h keeps its memory; sb goes once the copy has run. */
		struct handle tmp = *h;

		tmp.owner = current;
		sb->state = SHARED_LOST;
		release_shared(set, current, &tmp, sb, spare);
		return rc;
	}
	free(spare);
	/* Its live bytes were h's: the service is charged for them once. */
	sb->charged = true;
	sb->connection = set->connection_id;
	sb->sharer_open = !set->closing;
	sb->filler = current;
	sb->fill_seq = stream_next_fence(current);
	current->filling++;
	h->alloc.ptr = sb->ptr;
	h->alloc.slice = NULL;
	h->shared = sb;
	h->owner = current;
	/* The copy is the new memory's first write; nothing read it yet. */
	h->writer_slot = current->slot;
	h->writer_cursor = current->cursor;
	h->nreaders = 0;
	return 0;
}

bool streams_shared_ready(struct shared_buffer *sb)
{
	/* Settled when its fence completed (streams_fills_done). */
	return sb->state == SHARED_READY;
}

int streams_import(struct stream_set *set, struct stream *current, uint64_t id,
		   struct shared_buffer *sb)
{
	struct memory_alloc a = { .ptr = sb->ptr, .size = sb->size };
	struct handle *h = handle_new(id, current, &a);
	int rc;

	if (h == NULL)
		return GPUCMD_ENOMEM;
	h->shared = sb;
	rc = handle_table_insert(set->handles, h);
	if (rc != 0) {
		handle_free(h);
		return rc;
	}
	shared_buffer_get(sb);
	sb->imports++;
	return 0;
}

static uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

uint64_t stream_ordered_bound(const struct stream *s)
{
	if (s->ordered_pending == 0 || !memory_manager_busy(s->memory))
		return 0;
	return min_u64(s->ordered_pending, s->ordered_free);
}

uint64_t stream_ordered_held(const struct stream *s)
{
	uint64_t bound = stream_ordered_bound(s);

	if (bound == 0)
		return 0;
	return min_u64(bound, memory_manager_busy_idle(s->memory));
}

uint64_t stream_take_released(struct stream *s, uint64_t reused)
{
	uint64_t taken = min_u64(s->ordered_free, reused);

	s->ordered_free -= taken;
	return taken;
}

uint64_t streams_ordered_held(const struct stream_set *set, bool exact)
{
	uint64_t sum = 0;

	for (uint32_t i = 0; i < set->nstreams; i++)
		sum += exact ? stream_ordered_held(set->slots[i]) :
			       stream_ordered_bound(set->slots[i]);
	return sum;
}

uint32_t streams_fence_all(const struct stream_set *set,
			   const struct stream *current, struct drop_fence *out)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < set->nstreams; i++)
		add_fence(out, &n, set->slots[i], current);
	return n;
}

bool streams_fences_passed(const struct drop_fence *f, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (stream_completed(f[i].stream) < f[i].seq)
			return false;
	return true;
}

uint64_t stream_next_fence(const struct stream *s)
{
	/*
	 * A held stream (executor.c: its completion could not be enqueued)
	 * has submitted at UINT64_MAX and never completes: its fences must
	 * never pass, not wrap to 0 and pass at once.
	 */
	return s->submitted == UINT64_MAX ? UINT64_MAX : s->submitted + 1;
}

uint64_t stream_completed(const struct stream *s)
{
	return s->completed;
}

void streams_flush_drops(struct stream_set *set)
{
	for (uint32_t i = 0; i < set->nstreams; i++)
		if (!set->slots[i]->capturing)
			drop_queue_flush(set->slots[i]->drops);
	region_flush(set);
	graph_flush(set);
	module_drops_flush(set, false);
	shared_drops_flush(set, false);
}

void streams_usage(const struct stream_set *set, struct memory_usage *out)
{
	memset(out, 0, sizeof(*out));
	for (uint32_t i = 0; i < set->nstreams; i++) {
		struct memory_usage u;

		memory_manager_usage(set->slots[i]->memory, &u);
		out->allocations += u.allocations;
		out->bytes_in_use += u.bytes_in_use;
		out->bytes_padding += u.bytes_padding;
		out->bytes_reserved += u.bytes_reserved;
	}
}

bool streams_idle(const struct stream_set *set)
{
	for (uint32_t i = 0; i < set->nstreams; i++)
		if (set->slots[i]->completed < set->slots[i]->submitted)
			return false;
	return true;
}

bool streams_idle_lost(const struct stream_set *set)
{
	for (uint32_t i = 0; i < set->nstreams; i++) {
		const struct stream *s = set->slots[i];
		uint64_t last = s->submitted == UINT64_MAX ? s->held_after :
							     s->submitted;

		if (s->completed < last)
			return false;
	}
	return true;
}
