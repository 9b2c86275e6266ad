/*
 * rounds.c - see rounds.h.
 */
#include "rounds.h"

#include <stddef.h>

#include "service.h"

void rounds_init(struct rounds *r)
{
	r->fresh_head = NULL;
	r->fresh_tail = &r->fresh_head;
	r->turn_head = NULL;
	r->turn_tail = &r->turn_head;
}

static void append(struct service ***tail, struct service *svc)
{
	svc->next_active = NULL;
	**tail = svc;
	*tail = &svc->next_active;
}

void rounds_add(struct rounds *r, struct service *svc)
{
	if (svc->active) {
		/* Its place in turn is still there: the batch waits for it. */
		svc->emptied = false;
		return;
	}
	svc->active = true;
	atomic_store_explicit(&svc->in_rounds, true, memory_order_relaxed);
	append(&r->fresh_tail, svc);
}

bool rounds_empty(const struct rounds *r)
{
	return r->fresh_head == NULL && r->turn_head == NULL;
}

/*
 * svc's turn: up to its weight in batches, then the back of the turns,
 * emptied or not; a place that comes round emptied leaves the rounds
 * (rounds.h).  Whether it was a turn, not a place left.
 */
static bool take_turn(struct rounds *r, struct service *svc,
		      rounds_serve_fn serve, void *arg)
{
	unsigned quantum = atomic_load(&svc->weight);
	bool more = true;

	if (svc->emptied) {
		svc->emptied = false;
		svc->active = false;
		/* The last touch: a service no session holds may now go. */
		atomic_store_explicit(&svc->in_rounds, false,
				      memory_order_release);
		return false;
	}
	for (unsigned k = 0; k < quantum && more; k++)
		more = serve(arg, svc);
	svc->emptied = !more;
	append(&r->turn_tail, svc);
	return true;
}

void rounds_run(struct rounds *r, rounds_serve_fn serve, void *arg,
		atomic_uint *news)
{
	struct service *svc = r->fresh_head, *rest = r->turn_head;
	/* The last of rest keeps its link until it is served. */
	struct service **rest_tail = r->turn_tail;

	/* Take both lists: who keeps work goes back to the turns, in order. */
	r->fresh_head = NULL;
	r->fresh_tail = &r->fresh_head;
	r->turn_head = NULL;
	r->turn_tail = &r->turn_head;
	while (svc != NULL) {
		struct service *next = svc->next_active;

		(void)take_turn(r, svc, serve, arg);
		svc = next;
	}
	while (rest != NULL) {
		svc = rest;
		rest = svc->next_active;
		if (!take_turn(r, svc, serve, arg) || rest == NULL ||
		    news == NULL ||
		    atomic_load_explicit(news, memory_order_acquire) == 0)
			continue;
		/* The round's rest goes first next time, as it was. */
		*rest_tail = r->turn_head;
		if (r->turn_head == NULL)
			r->turn_tail = rest_tail;
		r->turn_head = rest;
		break;
	}
}
