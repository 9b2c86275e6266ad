/*
 * command.c - the seed's Command, method by method.  See command.h for the
 * map from the seed's names to these functions.
 */
#include "command.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frame.h"
#include "gpucmd.h"
#include "log.h"
#include "memory/drop_queue.h"
#include "memory/handle.h"
#include "memory/pinned.h"
#include "service.h"

void command_init(struct command *cmd, struct command_ctx *ctx,
		  const struct resolved *resolved, struct service *service)
{
	cmd->ctx = ctx;
	cmd->set = resolved->set;
	cmd->current = resolved->current;
	cmd->cursor = resolved->cursor;
	cmd->service = service;
	cmd->fence = false;
	cmd->msg[0] = '\0';
}

struct stream *command_stream(struct command *cmd)
{
	return cmd->current;
}

int command_resource(struct command *cmd, uint64_t handle,
		     struct device_resource *out)
{
	struct handle *h = handle_table_find(cmd->set->handles, handle);

	if (h == NULL) {
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "handle %llu names no live allocation on this "
			 "connection: allocate it first (empty/create) and do "
			 "not use it after release",
			 (unsigned long long)handle);
		return GPUCMD_ENOTFOUND;
	}
	/* The slice lives in its owner's pools, wherever it is used. */
	out->ptr = h->alloc.ptr;
	out->size = h->alloc.size;
	out->handle = h;
	return 0;
}

void command_memory_usage(struct command *cmd, struct memory_usage *out)
{
	memory_manager_usage(cmd->current->memory, out);
}

size_t command_memory_report(struct command *cmd,
			     struct memory_pool_report *out, size_t max)
{
	return memory_manager_report(cmd->current->memory, out, max);
}

void command_memory_cleanup(struct command *cmd)
{
	/*
	 * The reference flushes its drop queue with a host block on the
	 * fences; here the queue holds only what the device may still use, so
	 * one non-blocking flush frees everything that can be freed now.
	 */
	command_flush_drops(cmd);
	memory_manager_cleanup(cmd->current->memory, true);
}

void command_flush_drops(struct command *cmd)
{
	/* A flush during capture would free memory the graph refers to. */
	if (cmd->current->capturing)
		return;
	drop_queue_flush(cmd->current->drops);
}

void command_allocation_mode(struct command *cmd,
			     enum memory_allocation_mode mode)
{
	memory_manager_mode(cmd->current->memory, mode);
}

int command_install_memory_pools(struct command *cmd,
				 const struct memory_configuration *config)
{
	struct memory_device_properties props;
	uint64_t in_use = 0;
	int rc;

	/*
	 * The recording may name memory the pools think free: the old
	 * layout stays, and no release or sync would change that.
	 */
	if (cmd->current->capturing) {
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "pools in use: stream %u records a graph, which may "
			 "name memory in its pools, so the old layout stays; "
			 "install the layout after capture_end",
			 cmd->current->number);
		return GPUCMD_EPOOLSINUSE;
	}
	streams_layout_props(cmd->set, &props);
	command_flush_drops(cmd);
	rc = memory_manager_install_pools(cmd->current->memory, config, &props,
					  &in_use);
	if (rc == GPUCMD_EPOOLSINUSE && in_use == 0 &&
	    memory_manager_busy(cmd->current->memory)) {
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "pools in use: stream %u released buffers that work "
			 "queued before the release still uses, so the old "
			 "layout stays until that work is done; sync the "
			 "stream in an earlier request (ops after a sync in "
			 "the same request do not wait for it)",
			 cmd->current->number);
	} else if (rc == GPUCMD_EPOOLSINUSE) {
		struct memory_pool_report pools[MEMORY_MAX_POOLS + 1];
		size_t n = memory_manager_report(cmd->current->memory, pools,
						 MEMORY_MAX_POOLS + 1);
		uint64_t allocs = 0;

		/* The dynamic pools', as in_use: the persistent pool stays. */
		for (size_t i = 0; i < n && i < MEMORY_MAX_POOLS + 1; i++)
			if (pools[i].kind != MEMORY_POOL_PERSISTENT)
				allocs += pools[i].usage.allocations;
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "pools in use: %llu allocations (%llu bytes) are "
			 "still in stream %u's pools, live buffers or released "
			 "ones that work queued on the device still uses, so "
			 "the old layout stays; release the stream's buffers "
			 "(those of persistent mode may stay) and sync it in "
			 "an earlier request (ops after a sync in the same "
			 "request do not wait for it)",
			 (unsigned long long)allocs, (unsigned long long)in_use,
			 cmd->current->number);
	} else if (rc != 0)
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "cannot install the pool layout: %s",
			 gpucmd_strerror(rc));
	/*
	 * As in the reference, the layout is also the one the streams made
	 * later get (its server keeps it as an override): here those of
	 * this connection, the reference's server being one client's.  The
	 * connection's other streams keep theirs.
	 */
	if (rc == 0)
		cmd->set->layout = *config;
	return rc;
}

/*
 * Clean every stream of set: pages with nothing live in them and released
 * buffers the device is done with go back to the device.  Returns the
 * bytes it gave back.
 */
static uint64_t reclaim_set(struct stream_set *set)
{
	struct memory_usage before, after;

	streams_usage(set, &before);
	for (uint32_t i = 0; i < set->nstreams; i++) {
		struct stream *s = set->slots[i];

		if (s->capturing)
			continue;
		drop_queue_flush(s->drops);
		memory_manager_cleanup(s->memory, true);
	}
	streams_usage(set, &after);
	return before.bytes_reserved - after.bytes_reserved;
}

/*
 * The device is shared: what other connections keep reserved with nothing
 * live in it (a service that allocated much once and went quiet) is taken
 * back before an allocation is refused.  Their live buffers stay.  With
 * only set, the connections of that service alone (its reserve quota).
 */
static uint64_t reclaim_others(struct command *cmd, const struct service *only)
{
	uint64_t got = 0;

	if (cmd->ctx->sets == NULL)
		return 0;
	for (struct stream_set *set = *cmd->ctx->sets; set != NULL;
	     set = set->next)
		if (set != cmd->set && (only == NULL || set->service == only))
			got += reclaim_set(set);
	return got;
}

/*
 * Fragmentation of a memory manager, defined once (gpucmd(1) documents the
 * same formula): 1 - largest free block / free bytes held, where free bytes
 * are reserved - in use - padding; 0 when nothing is free.  1 means the
 * free memory is in pieces too small for anything; 0 means it is one block.
 */
static double fragmentation(const struct memory_manager *mm)
{
	struct memory_usage u;
	uint64_t free_bytes;

	memory_manager_usage(mm, &u);
	free_bytes = u.bytes_reserved - u.bytes_in_use - u.bytes_padding;
	if (free_bytes == 0)
		return 0;
	return 1.0 -
	       (double)memory_manager_largest_free(mm) / (double)free_bytes;
}

static void describe_oom(struct command *cmd, int rc, uint64_t size)
{
	struct memory_usage u;
	struct driver *d = cmd->ctx->driver;
	const struct service *svc = cmd->service;
	uint64_t limit = atomic_load(&svc->memory_limit);
	char lim[48], cap[256] = "";

	/* A capped pool refused it, not the service's limit: name the cap. */
	if (rc == GPUCMD_ECAPACITY)
		memory_manager_describe_capacity(cmd->current->memory, size,
						 cap, sizeof(cap));
	streams_usage(cmd->set, &u);
	if (limit != 0)
		snprintf(lim, sizeof(lim), "%llu", (unsigned long long)limit);
	else
		snprintf(lim, sizeof(lim), "none");
	snprintf(
		cmd->msg, sizeof(cmd->msg),
		"%s: cannot allocate %llu bytes on stream %u; service '%s' "
		"has %llu bytes in use (limit %s), this connection %llu in use "
		"and %llu reserved, largest free block %llu, fragmentation "
		"%.2f, device total %llu bytes%s%s%s%s",
		gpucmd_strerror(rc), (unsigned long long)size,
		cmd->current->number, svc->name,
		(unsigned long long)svc->bytes_in_use, lim,
		(unsigned long long)u.bytes_in_use,
		(unsigned long long)u.bytes_reserved,
		(unsigned long long)memory_manager_largest_free(
			cmd->current->memory),
		fragmentation(cmd->current->memory),
		(unsigned long long)d->props.total_memory, cap[0] ? "; " : "",
		cap, d->error[0] ? "; driver: " : "", d->error);
}

static uint64_t sat_sum(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/*
 * The reserve quota refused new device memory (storage_alloc): name what
 * the service's streams hold, and what keeps it.
 */
static void describe_reserve_quota(struct command *cmd, uint64_t size,
				   uint64_t limit)
{
	const struct service *svc = cmd->service;
	uint64_t need = cmd->set->quota_refused;

	snprintf(cmd->msg, sizeof(cmd->msg),
		 "quota exceeded: allocating %llu bytes on stream %u needs "
		 "%llu bytes of new device memory, which would take service "
		 "'%s' past %llu bytes of device memory, the most its "
		 "memory_limit of %llu lets it hold; it holds %llu, %llu of "
		 "them live buffers, the rest released buffers queued work "
		 "still uses and pages a small live buffer keeps whole (one "
		 "per pool per stream at worst; stream %u's largest free "
		 "block is %llu bytes); release or sync, use fewer streams, "
		 "or raise the memory_limit",
		 (unsigned long long)size, cmd->current->number,
		 (unsigned long long)need, svc->name,
		 (unsigned long long)service_reserve_cap(limit),
		 (unsigned long long)limit,
		 (unsigned long long)svc->bytes_reserved,
		 (unsigned long long)svc->bytes_in_use, cmd->current->number,
		 (unsigned long long)memory_manager_largest_free(
			 cmd->current->memory));
}

/*
 * What the service's streams released to their own pools that work queued
 * before may still use and that they have not reused, over every
 * connection of the service: stream_ordered_held (exact: walks the pools)
 * or stream_ordered_bound (O(1) a stream, never less).
 */
static uint64_t service_ordered_held(const struct command *cmd, bool exact)
{
	uint64_t sum = 0;

	if (cmd->ctx->sets == NULL)
		return streams_ordered_held(cmd->set, exact);
	for (struct stream_set *set = *cmd->ctx->sets; set != NULL;
	     set = set->next)
		if (set->service == cmd->service)
			sum = sat_sum(sum, streams_ordered_held(set, exact));
	return sum;
}

uint64_t command_closing_live(const struct command_ctx *ctx,
			      const struct service *svc)
{
	struct memory_usage u;
	uint64_t sum = 0;

	if (ctx->sets == NULL)
		return 0;
	for (struct stream_set *set = *ctx->sets; set != NULL;
	     set = set->next) {
		if (set->service != svc || !set->closing)
			continue;
		streams_usage(set, &u);
		/* Live: what the pools hold in use, less the drop queues. */
		for (uint32_t i = 0; i < set->nstreams; i++)
			u.bytes_in_use -=
				drop_queue_bytes(set->slots[i]->drops);
		sum = sat_sum(sum, u.bytes_in_use);
	}
	return sum;
}

/*
 * Whether size more bytes, with what the service holds live and released
 * but still used by the device, would go past twice its limit (the live
 * part alone is checked apart).  Live means what service_over_limit
 * counts, module globals included: a request over the limit must reach
 * that check, which refuses it, and not the reuse of busy memory that
 * answers an allocation over this bound without checking it.
 */
static bool pending_over(const struct service *svc, uint64_t limit,
			 uint64_t size, uint64_t released)
{
	uint64_t cap = limit > UINT64_MAX / 2 ? UINT64_MAX : 2 * limit;

	if (limit == 0 || service_over_limit(svc, limit, size))
		return false;
	return released > cap - svc->bytes_in_use - size;
}

/*
 * Whether the service is over twice its limit with size more bytes, counting
 * what it released that work queued before still uses: the cheap count
 * first (every such release), then, over it, with the drops whose work is
 * done freed and what the streams took back left out (first the O(1)
 * bound, then the exact count).  *released and *ordered get the counts
 * last used, for the message.
 */
static bool released_over(struct command *cmd, uint64_t limit, uint64_t size,
			  uint64_t *released, uint64_t *ordered)
{
	const struct service *svc = cmd->service;

	*ordered = svc->ordered_pending_bytes;
	*released = sat_sum(svc->release_pending_bytes, *ordered);
	if (!pending_over(svc, limit, size, *released))
		return false;
	streams_flush_drops(cmd->set);
	for (int exact = 0; exact <= 1; exact++) {
		*ordered = service_ordered_held(cmd, exact);
		*released = sat_sum(svc->release_pending_bytes, *ordered);
		if (!pending_over(svc, limit, size, *released))
			return false;
	}
	return true;
}

/*
 * out holds a reservation on the current stream that took reused bytes of
 * the stream's busy memory: it is the service's until it is released, and
 * what it took is no longer the stream's released memory.
 */
static void reserved(struct command *cmd, struct managed_memory *out,
		     uint64_t reused)
{
	struct service *svc = cmd->service;
	uint64_t held;

	out->origin = cmd->current;
	service_charge(svc, out->alloc.size);
	out->reused = stream_take_released(cmd->current, reused);
	/*
	 * The peak counts as the report's in use does, and that counts the
	 * releases to their own streams not yet reused, which service_charge
	 * cannot see: without them here a peak reached beside such releases
	 * was kept only if a report happened to be taken then.  Their
	 * exact count walks the pools, so only when their upper bound, the
	 * service's ordered_pending_bytes, could raise the peak.
	 */
	held = sat_sum(svc->bytes_in_use, svc->release_pending_bytes);
	if (svc->ordered_pending_bytes == 0 ||
	    sat_sum(held, svc->ordered_pending_bytes) <= svc->peak_bytes_in_use)
		return;
	held = sat_sum(held, service_ordered_held(cmd, true));
	if (held > svc->peak_bytes_in_use)
		svc->peak_bytes_in_use = held;
}

/*
 * An allocation of size refused with code, the sentence in cmd->msg: the
 * service counts it and keeps it for the memory report.
 */
static int refused(struct command *cmd, uint64_t size, int code)
{
	service_note_refusal(cmd->service, cmd->set->connection_id,
			     cmd->current->number, size, code, cmd->msg);
	return code;
}

static int reserve(struct command *cmd, uint64_t size,
		   struct managed_memory *out, uint64_t limit)
{
	struct service *svc = cmd->service;
	struct memory_manager *mm = cmd->current->memory;
	uint64_t total = cmd->ctx->driver->props.total_memory;
	uint64_t released, ordered;
	bool over;
	int rc;

	if (cmd->current->capturing) {
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "cannot allocate %llu bytes while stream %u records a "
			 "graph: reserve the memory before capture_begin",
			 (unsigned long long)size, cmd->current->number);
		return GPUCMD_EINVAL;
	}
	/*
	 * The seed's BufferTooBig: no device could ever fit it.  The pools
	 * say so for the sizes they never take, but a persistent mode or a
	 * direct pool takes any size, and the refusal would come from the
	 * device after a reclaim of every connection's idle memory that
	 * could not help.
	 */
	if (total != 0 && size > total) {
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "buffer too big: %llu bytes is more than the device "
			 "has (%llu bytes); split the buffer",
			 (unsigned long long)size, (unsigned long long)total);
		return GPUCMD_ETOOBIG;
	}

	/*
	 * Released memory the device may still use is held until its work is
	 * done, so the quota bounds it too: live buffers up to the limit, and
	 * live plus released-but-pending up to twice the limit.  A release
	 * followed by an allocation still fits at once (a batch that frees
	 * and allocates, a pipelining client), but a client cannot keep
	 * allocating and releasing behind a long kernel until the device is
	 * full.  Memory released on its own stream counts too, while that
	 * stream has not reused it: its device memory cannot be given back
	 * before the work is done, and new sizes need new memory
	 * (released_over).  An allocation the stream serves wholly out of
	 * such memory holds nothing more, so over the bound the reservation
	 * is tried first and kept when it took only busy memory.
	 */
	over = released_over(cmd, limit, size, &released, &ordered);
	if (over) {
		cmd->set->reuse_only = true;
		rc = memory_manager_reserve(mm, size, &out->alloc);
		cmd->set->reuse_only = false;
	}
	if (over && rc == 0) {
		uint64_t reused = memory_manager_take_reused(mm);

		if (reused >= memory_slice_effective(out->alloc.slice)) {
			reserved(cmd, out, reused);
			return 0;
		}
		memory_manager_release(mm, out->alloc.slice);
	}
	if (over) {
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "quota exceeded: allocating %llu bytes would make "
			 "service '%s' hold %llu bytes of device memory, over "
			 "twice its memory_limit of %llu bytes: %llu in use "
			 "and %llu released but still used by work queued on "
			 "the device (%llu of them released on their own "
			 "stream, back in its pools and not reused; stream "
			 "%u's largest free block %llu); sync the streams (or "
			 "let that work finish) before allocating more, or "
			 "raise the service's memory_limit",
			 (unsigned long long)size, svc->name,
			 (unsigned long long)sat_sum(svc->bytes_in_use + size,
						     released),
			 (unsigned long long)limit,
			 (unsigned long long)svc->bytes_in_use,
			 (unsigned long long)released,
			 (unsigned long long)ordered, cmd->current->number,
			 (unsigned long long)memory_manager_largest_free(mm));
		return refused(cmd, size, GPUCMD_EQUOTA);
	}
	/* The globals of the modules it holds count like live buffers. */
	if (service_over_limit(svc, limit, size)) {
		struct memory_usage u;
		uint64_t after, closing = command_closing_live(cmd->ctx, svc);
		char gone[160] = "", globals[120] = "";

		streams_usage(cmd->set, &u);
		after = sat_sum(sat_sum(svc->bytes_in_use, svc->module_bytes),
				size);
		if (svc->module_bytes > 0)
			snprintf(globals, sizeof(globals),
				 ", globals of its loaded modules %llu",
				 (unsigned long long)svc->module_bytes);
		if (closing > 0)
			snprintf(gone, sizeof(gone),
				 "; %llu of the live bytes belong to closed "
				 "connections and come back once the work "
				 "they queued has run",
				 (unsigned long long)closing);
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "quota exceeded: allocating %llu bytes would take "
			 "service '%s' to %llu%s bytes, over its limit of %llu "
			 "bytes (live buffers %llu%s; this connection reserves "
			 "%llu, stream %u's largest free block %llu, "
			 "fragmentation %.2f%s); release buffers or raise the "
			 "service's memory_limit",
			 (unsigned long long)size, svc->name,
			 (unsigned long long)after,
			 after == UINT64_MAX ? " or more" : "",
			 (unsigned long long)limit,
			 (unsigned long long)svc->bytes_in_use, globals,
			 (unsigned long long)u.bytes_reserved,
			 cmd->current->number,
			 (unsigned long long)memory_manager_largest_free(mm),
			 fragmentation(mm), gone);
		return refused(cmd, size, GPUCMD_EQUOTA);
	}
	cmd->ctx->driver->error[0] = '\0';
	cmd->set->quota_refused = 0;
	rc = memory_manager_reserve(mm, size, &out->alloc);
	if (rc == GPUCMD_ETOOBIG && size > memory_manager_max_alloc(mm)) {
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "buffer too big: %llu bytes is more than any pool of "
			 "this stream accepts (largest %llu bytes); split the "
			 "buffer, or use a layout with a direct pool",
			 (unsigned long long)size,
			 (unsigned long long)memory_manager_max_alloc(mm));
		return rc;
	}
	if (rc == GPUCMD_ETOOBIG) {
		/* A custom layout whose pools leave sizes between them. */
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "no pool of stream %u's layout takes %llu bytes: its "
			 "pools take sizes up to %llu bytes with gaps between "
			 "them (or the size cannot be aligned); change the "
			 "layout (pools) or the buffer's size",
			 cmd->current->number, (unsigned long long)size,
			 (unsigned long long)memory_manager_max_alloc(mm));
		return rc;
	}
	if (rc != 0) {
		/* Pages with nothing live and queued drops may free enough. */
		reclaim_set(cmd->set);
		cmd->set->quota_refused = 0;
		rc = memory_manager_reserve(mm, size, &out->alloc);
	}
	/*
	 * Over the reserve quota (storage_alloc), only the service's own
	 * idle memory may help; out of device memory, anyone's.
	 */
	if (rc == GPUCMD_ENOMEM &&
	    reclaim_others(cmd, cmd->set->quota_refused ? svc : NULL) > 0) {
		cmd->set->quota_refused = 0;
		rc = memory_manager_reserve(mm, size, &out->alloc);
	}
	/*
	 * The pools' share of the reserve quota is spent (pages stop at half
	 * of it, service_reserve_over), or the quota refused a page larger
	 * than the request: a stream laid out before a reload gave the
	 * service its limit (its pages are the device's), a custom layout's
	 * large pages.  An allocation of the request's own size may still
	 * fit under the whole quota, which bounds it all the same: what
	 * such allocations hold is live or released-but-used, at most twice
	 * the limit.  An empty buffer too (one alignment unit): refused here,
	 * it was refused for the pages before it, with a message naming a
	 * bound it was nowhere near.
	 */
	if (rc == GPUCMD_ENOMEM && cmd->set->quota_refused != 0) {
		uint64_t refused = cmd->set->quota_refused;

		cmd->set->quota_refused = 0;
		cmd->set->reserve_exact = true;
		rc = memory_manager_reserve_exact(mm, size, &out->alloc);
		cmd->set->reserve_exact = false;
		/* Refused by the device instead: still the quota's answer. */
		if (rc != 0 && cmd->set->quota_refused == 0) {
			cmd->set->quota_refused = refused;
			rc = GPUCMD_ENOMEM;
		}
	}
	if (rc == GPUCMD_ENOMEM && cmd->set->quota_refused != 0) {
		describe_reserve_quota(cmd, size, limit);
		return refused(cmd, size, GPUCMD_EQUOTA);
	}
	if (rc != 0) {
		describe_oom(cmd, rc, size);
		return refused(cmd, size, rc);
	}
	reserved(cmd, out, memory_manager_take_reused(mm));
	return 0;
}

/*
 * One memory_limit for the whole decision: a reload may change it while
 * the device thread reserves, and the checks here, storage_alloc's reserve
 * cap and the refusal's sentence must all speak of the same one.
 */
int command_reserve(struct command *cmd, uint64_t size,
		    struct managed_memory *out)
{
	struct stream_set *set = cmd->set;
	uint64_t limit = atomic_load(&cmd->service->memory_limit);
	int rc;

	set->quota_limit = limit;
	set->quota_limit_held = true;
	rc = reserve(cmd, size, out, limit);
	set->quota_limit_held = false;
	return rc;
}

uint64_t command_cursor(const struct command *cmd)
{
	return cmd->cursor;
}

int command_empty(struct command *cmd, uint64_t size, uint64_t handle)
{
	struct managed_memory a;
	int rc;

	/* A name that bind would refuse fails before any memory moves. */
	if (handle_table_find(cmd->set->handles, handle) != NULL || handle == 0)
		return command_bind(cmd, NULL, handle);
	rc = command_reserve(cmd, size, &a);
	if (rc != 0)
		return rc;
	rc = command_bind(cmd, &a, handle);
	if (rc != 0)
		command_unreserve(cmd, &a);
	return rc;
}

void command_unreserve(struct command *cmd, const struct managed_memory *m)
{
	/*
	 * Busy memory it took goes back free and busy as it was: count it
	 * as the stream's released memory again, or a client could empty
	 * the count with reservations that fail to bind.
	 */
	m->origin->ordered_free += m->reused;
	memory_manager_release(m->origin->memory, m->alloc.slice);
	service_uncharge(cmd->service, m->alloc.size);
}

int command_bind(struct command *cmd, const struct managed_memory *reserved,
		 uint64_t new_handle)
{
	struct handle_table *t = cmd->set->handles;
	struct handle *h;
	int rc;

	if (new_handle == 0) {
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "handle 0 is invalid: choose a non-zero 64-bit id");
		return GPUCMD_EINVAL;
	}
	if (handle_table_find(t, new_handle) != NULL) {
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "handle %llu is already live on this connection: "
			 "release it first or choose another id",
			 (unsigned long long)new_handle);
		return GPUCMD_EEXIST;
	}
	if (reserved == NULL || reserved->alloc.slice == NULL) {
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "the reservation has no storage to give to handle "
			 "%llu",
			 (unsigned long long)new_handle);
		return GPUCMD_EINVAL;
	}
	/* The memory stays in the pools of the stream that reserved it. */
	h = handle_new(new_handle, reserved->origin, &reserved->alloc);
	if (h == NULL)
		return GPUCMD_ENOMEM;
	/*
	 * Fresh pages are zeroed on the reserving stream: that is the
	 * buffer's first write, which any other stream must wait for.
	 */
	h->writer_slot = reserved->origin->slot;
	h->writer_cursor = reserved->origin->cursor;
	rc = handle_table_insert(t, h);
	if (rc != 0) {
		handle_free(h);
		if (rc == GPUCMD_ELIMIT)
			snprintf(cmd->msg, sizeof(cmd->msg),
				 "this connection already holds %u handles, "
				 "the limit (max_handles): release some first",
				 handle_table_count(t));
		return rc;
	}
	memory_slice_set_cursor(reserved->alloc.slice, cmd->cursor);
	return 0;
}

/*
 * Heap bytes the driver pins for the time of the copy: whole pages of
 * their own (a page registered twice is refused), registered here on the
 * device thread.  Pinning costs time in proportion to the size, which is
 * bounded; a copy to pageable memory would instead wait for everything
 * queued on its stream.  out->data is NULL when either step failed (the
 * caller then falls back to plain heap).
 */
static void heap_registered(struct driver *d, size_t size,
			    struct host_bytes *out)
{
	long sys_page = sysconf(_SC_PAGESIZE); /* 64 KiB on some aarch64 */
	size_t page = sys_page > 0 ? (size_t)sys_page : 4096;
	size_t len = (size + page - 1) / page * page;
	void *p = NULL;

	out->data = NULL;
	if (len == 0)
		len = page;
	if (posix_memalign(&p, page, len) != 0)
		return;
	if (d->ops->host_register(d, p, len) != 0) {
		free(p);
		return;
	}
	out->data = p;
	out->len = size;
	out->pinned = true;
	out->registered = true;
}

static void reserve_cpu(struct command *cmd, size_t size, bool for_copy,
			struct host_bytes *out);

void command_reserve_cpu(struct command *cmd, size_t size,
			 struct stream *origin, struct host_bytes *out)
{
	(void)origin; /* one pinned pool serves the daemon */
	reserve_cpu(cmd, size, true, out);
}

void command_reserve_cpu_unpinned(struct command *cmd, size_t size,
				  struct host_bytes *out)
{
	reserve_cpu(cmd, size, false, out);
}

static void reserve_cpu(struct command *cmd, size_t size, bool for_copy,
			struct host_bytes *out)
{
	/* An exhausted pool falls back to the heap. */
	out->slice = NULL;
	out->registered = false;
	/* Host bytes serve replies: nothing larger than a frame is needed. */
	if (size > FRAME_MAX_BODY) {
		out->data = NULL;
		out->len = 0;
		out->pinned = false;
		return;
	}
	if (cmd->ctx->pinned != NULL &&
	    pinned_pool_reserve(cmd->ctx->pinned, size, &out->data,
				&out->slice) == 0) {
		out->len = size;
		out->pinned = true;
		return;
	}
	if (for_copy && cmd->ctx->driver->props.pageable_copies_block) {
		heap_registered(cmd->ctx->driver, size, out);
		if (out->data != NULL)
			return;
	}
	out->data = malloc(size ? size : 1);
	out->len = out->data != NULL ? size : 0;
	out->pinned = false;
}

void command_free_cpu(struct command_ctx *ctx, struct host_bytes *bytes)
{
	if (bytes->slice != NULL) {
		pinned_pool_release(ctx->pinned, bytes->slice);
	} else {
		if (bytes->registered)
			ctx->driver->ops->host_unregister(ctx->driver,
							  bytes->data);
		free(bytes->data);
	}
	bytes->data = NULL;
	bytes->slice = NULL;
	bytes->len = 0;
	bytes->registered = false;
}

static int mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
	return !__builtin_mul_overflow(a, b, out);
}

int command_check_layout(const struct copy_descriptor *desc, uint64_t size,
			 uint64_t *span, uint64_t *dense, char *msg,
			 size_t msg_len)
{
	uint32_t r = desc->rank;
	uint64_t elems = 1, width, height = 1, pitch, bytes, end;

	if (r == 0 || r > COMMAND_MAX_RANK || desc->elem_size == 0) {
		snprintf(msg, msg_len,
			 "a copy layout needs a rank of 1 to %d and a "
			 "non-zero element size (got rank %u, element size %u)",
			 COMMAND_MAX_RANK, r, desc->elem_size);
		return GPUCMD_EINVAL;
	}
	for (uint32_t i = 0; i < r; i++)
		if (!mul_ok(elems, desc->shape[i], &elems))
			goto too_large;
	if (desc->strides[r - 1] != 1)
		goto strides;
	for (uint32_t i = 0; i < r; i++)
		if (desc->strides[i] == 0)
			goto strides;
	if (r > 1 && desc->strides[r - 2] < desc->shape[r - 1])
		goto strides;
	for (uint32_t i = 0; i + 2 < r; i++) {
		uint64_t packed;
		if (!mul_ok(desc->strides[i + 1], desc->shape[i + 1],
			    &packed) ||
		    desc->strides[i] != packed)
			goto strides;
	}
	if (!mul_ok(elems, desc->elem_size, &bytes))
		goto too_large;
	*dense = bytes;
	if (elems == 0) {
		/* A copy of nothing still names a place: the end at most. */
		*span = 0;
		goto bounds;
	}
	if (!mul_ok(desc->shape[r - 1], desc->elem_size, &width))
		goto too_large;
	for (uint32_t i = 0; i + 1 < r; i++)
		height *= desc->shape[i]; /* bounded by elems */
	if (r > 1) {
		if (!mul_ok(desc->strides[r - 2], desc->elem_size, &pitch) ||
		    !mul_ok(height - 1, pitch, span) ||
		    __builtin_add_overflow(*span, width, span))
			goto too_large;
	} else {
		*span = width;
	}
bounds:
	if (__builtin_add_overflow(desc->offset, *span, &end) || end > size) {
		snprintf(msg, msg_len,
			 "copy out of bounds: %llu bytes at offset %llu of "
			 "handle %llu, which has %llu bytes",
			 (unsigned long long)*span,
			 (unsigned long long)desc->offset,
			 (unsigned long long)desc->handle,
			 (unsigned long long)size);
		return GPUCMD_EINVAL;
	}
	return 0;
strides:
	snprintf(msg, msg_len,
		 "unsupported strides: only pitched row-major layouts copy "
		 "(last stride 1, no zero stride, row pitch at least the row, "
		 "higher dimensions packed)");
	return GPUCMD_ESTRIDES;
too_large:
	snprintf(msg, msg_len, "copy layout describes more than 2^64 bytes");
	return GPUCMD_EINVAL;
}

/* Linear or 2D parameters of a checked layout. */
static bool layout_2d(const struct copy_descriptor *d, struct driver_copy2d *c)
{
	uint32_t r = d->rank;

	if (r < 2 || d->strides[r - 2] == d->shape[r - 1])
		return false;
	c->width = d->shape[r - 1] * d->elem_size;
	c->height = 1;
	for (uint32_t i = 0; i + 1 < r; i++)
		c->height *= d->shape[i];
	return true;
}

static int driver_refused(struct command *cmd, int rc, const char *what)
{
	snprintf(cmd->msg, sizeof(cmd->msg), "the driver refused %s: %s%s%s",
		 what, gpucmd_strerror(rc),
		 cmd->ctx->driver->error[0] ? ": " : "",
		 cmd->ctx->driver->error);
	return rc;
}

int command_write_to_cpu(struct command *cmd,
			 const struct copy_descriptor *desc,
			 struct host_bytes *bytes, struct stream *stream)
{
	struct driver *d = cmd->ctx->driver;
	struct device_resource res;
	struct driver_copy2d c;
	uint64_t span, dense;
	int rc;

	if (stream == NULL)
		stream = cmd->current;
	rc = command_resource(cmd, desc->handle, &res);
	if (rc != 0)
		return rc;
	rc = command_check_layout(desc, res.size, &span, &dense, cmd->msg,
				  sizeof(cmd->msg));
	if (rc != 0)
		return rc;
	if (bytes->len < dense) {
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "host buffer of %zu bytes is smaller than the %llu "
			 "bytes the layout holds",
			 bytes->len, (unsigned long long)dense);
		return GPUCMD_EINVAL;
	}
	if (dense == 0)
		return 0;
	if (layout_2d(desc, &c)) {
		c.src_pitch = desc->strides[desc->rank - 2] * desc->elem_size;
		c.dst_pitch = c.width;
		rc = d->ops->copy_dtoh_2d(d, stream->ds, bytes->data,
					  res.ptr + desc->offset, &c);
	} else {
		rc = d->ops->copy_dtoh(d, stream->ds, bytes->data,
				       res.ptr + desc->offset, dense);
	}
	return rc != 0 ? driver_refused(cmd, rc, "the device-to-host copy") : 0;
}

int command_read_async(struct command *cmd, const struct copy_descriptor *descs,
		       size_t n, struct host_bytes *out)
{
	struct device_resource res;
	uint64_t span, dense;
	size_t i;
	int rc = 0;

	for (i = 0; i < n; i++) {
		rc = command_resource(cmd, descs[i].handle, &res);
		if (rc == 0)
			rc = command_check_layout(&descs[i], res.size, &span,
						  &dense, cmd->msg,
						  sizeof(cmd->msg));
		if (rc != 0)
			break;
		command_reserve_cpu(cmd, dense, NULL, &out[i]);
		if (out[i].data == NULL) {
			snprintf(cmd->msg, sizeof(cmd->msg),
				 "the daemon cannot hold %llu bytes of read "
				 "data in host memory",
				 (unsigned long long)dense);
			rc = GPUCMD_ENOMEM;
			break;
		}
		rc = command_write_to_cpu(cmd, &descs[i], &out[i], NULL);
		if (rc != 0) {
			command_free_cpu(cmd->ctx, &out[i]);
			break;
		}
	}
	if (rc != 0) {
		while (i-- > 0)
			command_free_cpu(cmd->ctx, &out[i]);
		return rc;
	}
	cmd->fence = true;
	return 0;
}

int command_write_to_gpu(struct command *cmd,
			 const struct copy_descriptor *desc, const void *data,
			 size_t len)
{
	struct driver *d = cmd->ctx->driver;
	struct device_resource res;
	struct driver_copy2d c;
	uint64_t span, dense;
	int rc;

	rc = command_resource(cmd, desc->handle, &res);
	if (rc != 0)
		return rc;
	rc = command_check_layout(desc, res.size, &span, &dense, cmd->msg,
				  sizeof(cmd->msg));
	if (rc != 0)
		return rc;
	if (len != dense) {
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "write of %zu bytes does not match the %llu bytes "
			 "its layout describes",
			 len, (unsigned long long)dense);
		return GPUCMD_EINVAL;
	}
	if (len == 0)
		return 0;
	if (layout_2d(desc, &c)) {
		c.src_pitch = c.width;
		c.dst_pitch = desc->strides[desc->rank - 2] * desc->elem_size;
		rc = d->ops->copy_htod_2d(d, cmd->current->ds,
					  res.ptr + desc->offset, data, &c);
	} else {
		rc = d->ops->copy_htod(d, cmd->current->ds,
				       res.ptr + desc->offset, data, len);
	}
	return rc != 0 ? driver_refused(cmd, rc, "the host-to-device copy") : 0;
}

int command_create_with_data(struct command *cmd, const void *data, size_t len,
			     uint64_t handle)
{
	struct copy_descriptor desc = {
		.handle = handle,
		.rank = 1,
		.shape = { len },
		.strides = { 1 },
		.elem_size = 1,
	};
	struct handle *h;
	int rc;

	rc = command_empty(cmd, len, handle);
	if (rc != 0)
		return rc;
	/* The new buffer is written on the current stream: record it. */
	h = handle_table_find(cmd->set->handles, handle);
	h->writer_slot = cmd->current->slot;
	h->writer_cursor = cmd->cursor;
	rc = command_write_to_gpu(cmd, &desc, data, len);
	if (rc != 0) {
		char keep[sizeof(cmd->msg)];

		memcpy(keep, cmd->msg, sizeof(keep));
		if (streams_release(cmd->set, cmd->current, h) != 0)
			log_warn("connection %llu: could not queue handle %llu "
				 "for release after a failed write",
				 (unsigned long long)cmd->set->connection_id,
				 (unsigned long long)handle);
		memcpy(cmd->msg, keep, sizeof(keep));
	}
	return rc;
}

int command_sync(struct command *cmd)
{
	cmd->fence = true;
	return 0;
}

int command_kernel(struct command *cmd, struct driver_function *kernel,
		   const uint32_t grid[3], const uint32_t block[3],
		   uint32_t shared_bytes, void **params,
		   const size_t *param_sizes, size_t nparams)
{
	struct driver *d = cmd->ctx->driver;
	int rc;

	d->error[0] = '\0';
	rc = d->ops->launch(d, cmd->current->ds, kernel, grid, block,
			    shared_bytes, params, param_sizes, nparams);
	if (rc != 0) {
		/* The driver's sentence, when it has one, says it all. */
		snprintf(cmd->msg, sizeof(cmd->msg),
			 "launch refused by the driver: %s",
			 d->error[0] ? d->error : gpucmd_strerror(rc));
		return rc == GPUCMD_EINVAL ? GPUCMD_ELAUNCH : rc;
	}
	return 0;
}
