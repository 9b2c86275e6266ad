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
 *   first, once; one that still has batches after its turn joins the
 *   others at the back.
 * - A round stops early, after any service's turn, when new batches or
 *   completions came (*news): the device thread picks them up, fresh
 *   services go, and the services of the round not yet served go before
 *   those that were.
 *
 * Every service with work is served at least once per round and in turn,
 * so none starves: a fresh service is served once per stretch of work.
 * Device thread only.
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>

struct service;

struct rounds {
	struct service *fresh_head;	/* queue was empty: served first */
	struct service **fresh_tail;
	struct service *turn_head;	/* with work, in turn */
	struct service **turn_tail;
};

/* Serve svc's next batch; whether it has more waiting. */
typedef bool (*rounds_serve_fn)(void *arg, struct service *svc);

void rounds_init(struct rounds *r);
/** svc's queue, empty until now, got a batch (svc->active was false). */
void rounds_add(struct rounds *r, struct service *svc);
/** Whether no service has work. */
bool rounds_empty(const struct rounds *r);
/**
 * One round: the fresh services, then the others in turn, each up to its
 * weight in batches; stops early once *news is set (news may be NULL).
 */
void rounds_run(struct rounds *r, rounds_serve_fn serve, void *arg,
		atomic_uint *news);
