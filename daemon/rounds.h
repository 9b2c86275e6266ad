/*
 * rounds.h - the order in which the device thread serves the services'
 * batches (executor.c).
 *
 * Each service with batches waiting gets up to its weight in batches a
 * turn, in rounds, so a flooding service puts another's batch behind one
 * round, never behind its backlog.  Two rules keep a service that waits
 * for one batch at a time (a client that runs a kernel and syncs) from
 * waiting for whole rounds of the ones that keep the device busy, as new
 * flows go first in FQ-CoDel (RFC 8290):
 *
 * - A service whose queue was empty is fresh: fresh services are served
 *   first, once, then take their place in turn at the back.
 * - A round stops early, after any service's turn in turn, when new
 *   batches or completions came (*news): the device thread picks them up,
 *   fresh services go, and the services of the round not yet served go
 *   before those that were.
 *
 * A service whose turn empties its queue keeps its place (svc->emptied),
 * and leaves the rounds only if that place comes round with no batch.  So
 * a client that always has a batch waiting by its turn, one at a time, is
 * served in turn by its weight, and only one that stayed idle for a whole
 * pass of the turns is fresh again: being fresh at every round would let
 * it outrun every weight (RFC 8290 keeps an emptied new flow among the old
 * ones for the same reason).  Each round serves the next service in turn
 * at least, and each comes round after those before it: none starves.
 * Device thread only.
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>

struct service;

struct rounds {
	struct service *fresh_head; /* queue was empty: served first */
	struct service **fresh_tail;
	struct service *turn_head; /* with work, in turn */
	struct service **turn_tail;
};

/* Serve svc's next batch; whether it has more waiting. */
typedef bool (*rounds_serve_fn)(void *arg, struct service *svc);

void rounds_init(struct rounds *r);
/**
 * svc's queue, empty until now, got a batch: svc is fresh, or keeps its
 * place in turn if it still has one (svc->emptied).
 */
void rounds_add(struct rounds *r, struct service *svc);
/** Whether no service has work. */
bool rounds_empty(const struct rounds *r);
/**
 * One round: the fresh services, then the others in turn, each up to its
 * weight in batches; stops early once *news is set (news may be NULL).
 */
void rounds_run(struct rounds *r, rounds_serve_fn serve, void *arg,
		atomic_uint *news);
