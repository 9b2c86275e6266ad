/*
 * graph.c - see graph.h.
 */
#include "graph.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"
#include "gpucmd.h"
#include "memory/handle.h"
#include "module.h"
#include "service.h"

struct graph *graph_new(struct stream_set *set)
{
	/* Atomic: a process may run more than one executor (fuzz_dispatch). */
	static atomic_uint_fast64_t serials;
	struct graph *g = calloc(1, sizeof(struct graph));

	if (g != NULL) {
		g->set = set;
		g->serial = atomic_fetch_add(&serials, 1) + 1;
		set->ngraphs++;
	}
	return g;
}

int graph_hold(struct graph *g, struct handle *h)
{
	/*
	 * Once per graph, found in O(1): the graph that held h last is the
	 * one recording, unless two streams record at once and take turns
	 * with h, which holds it twice (graph_free lets go of each).  A
	 * serial, not the graph's address, which a later graph may reuse.
	 */
	if (h->graph_last == g->serial)
		return 0;
	if (g->nhandles == g->handles_cap) {
		uint32_t cap = g->handles_cap ? g->handles_cap * 2 : 8;
		struct handle **n = realloc(g->handles, cap * sizeof(*n));
		if (n == NULL)
			return GPUCMD_ENOMEM;
		g->handles = n;
		g->handles_cap = cap;
	}
	g->handles[g->nhandles++] = h;
	h->graph_refs++;
	h->graph_last = g->serial;
	return 0;
}

int graph_record_op(struct graph *g)
{
	if (g->set->graph_ops >= STREAMS_GRAPH_OPS_MAX)
		return GPUCMD_ELIMIT;
	g->nops++;
	g->set->graph_ops++;
	return 0;
}

void graph_unrecord_ops(struct graph *g, uint32_t n)
{
	if (n > g->nops)
		n = g->nops;
	g->nops -= n;
	g->set->graph_ops -= n;
}

int graph_hold_module(struct graph *g, struct module_cache *c,
		      struct module_entry *e, struct service *svc)
{
	for (uint32_t i = 0; i < g->nmodules; i++)
		if (g->modules[i] == e)
			return 0;
	if (g->nmodules == g->modules_cap) {
		uint32_t cap = g->modules_cap ? g->modules_cap * 2 : 4;
		struct module_entry **n = realloc(g->modules, cap * sizeof(*n));

		if (n == NULL)
			return GPUCMD_ENOMEM;
		g->modules = n;
		g->modules_cap = cap;
	}
	if (service_module_ref(svc, e, module_entry_static_bytes(e)) != 0)
		return GPUCMD_ENOMEM;
	g->modules[g->nmodules++] = e;
	g->module_cache = c;
	g->service = svc;
	module_cache_hold(c, e);
	return 0;
}

int graph_keep(struct graph *g, const void *data, size_t len, void **out)
{
	void *copy;

	if (g->set->graph_bytes + len > STREAMS_GRAPH_BYTES_MAX)
		return GPUCMD_ELIMIT;
	if (g->nblobs == g->blobs_cap) {
		uint32_t cap = g->blobs_cap ? g->blobs_cap * 2 : 4;
		void **n = realloc(g->blobs, cap * sizeof(*n));
		if (n == NULL)
			return GPUCMD_ENOMEM;
		g->blobs = n;
		g->blobs_cap = cap;
	}
	copy = malloc(len ? len : 1);
	if (copy == NULL)
		return GPUCMD_ENOMEM;
	if (len > 0)
		memcpy(copy, data, len);
	g->blobs[g->nblobs++] = copy;
	g->kept += len;
	g->set->graph_bytes += len;
	*out = copy;
	return 0;
}

void graph_free(struct driver *d, struct graph *g)
{
	if (g == NULL)
		return;
	for (uint32_t i = 0; i < g->nhandles; i++)
		g->handles[i]->graph_refs--;
	if (g->dg != NULL)
		d->ops->graph_destroy(d, g->dg);
	/* After the driver graph: it is what refers to the functions. */
	for (uint32_t i = 0; i < g->nmodules; i++) {
		module_cache_put(g->module_cache, g->modules[i]);
		service_module_unref(g->service, g->modules[i]);
	}
	free(g->modules);
	for (uint32_t i = 0; i < g->nblobs; i++)
		free(g->blobs[i]);
	free(g->blobs);
	free(g->handles);
	g->set->graph_bytes -= g->kept;
	g->set->graph_ops -= g->nops;
	g->set->ngraphs--;
	free(g);
}

struct graph *graph_find(struct graph *list, uint64_t id)
{
	for (; list != NULL; list = list->next)
		if (list->id == id)
			return list;
	return NULL;
}

void graph_retire(struct stream_set *set, struct stream *current,
		  struct graph *g)
{
	/*
	 * The buffers may be released at once: their releases are fenced on
	 * the streams the replays ran on, like any other use.
	 */
	for (uint32_t i = 0; i < g->nhandles; i++)
		g->handles[i]->graph_refs--;
	g->nhandles = 0;
	g->nfences = streams_fence_all(set, current, g->fences);
	g->next = set->dead_graphs;
	set->dead_graphs = g;
}

void graph_flush(struct stream_set *set)
{
	struct graph **pp = &set->dead_graphs;

	while (*pp != NULL) {
		struct graph *g = *pp;

		if (!streams_fences_passed(g->fences, g->nfences)) {
			pp = &g->next;
			continue;
		}
		*pp = g->next;
		graph_free(set->driver, g);
	}
}
