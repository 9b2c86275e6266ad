/*
 * service.c - the service registry and per-service accounting.
 */
#include "service.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpucmd.h"
#include "log.h"

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct service *registry_head;
static struct service **registry_tail = &registry_head;
static uint32_t registry_count;
static uint32_t registry_last_id; /* ids are never used twice */

/*
 * Limits of none: no quota, no modules (loads are refused to observers
 * anyway), the daemon's stream limit; weight 1 like any service, or the
 * executor's rounds would never serve its batches.
 */
static struct service observers = {
	.name = "(observer)",
	.observer = true,
	.weight = 1,
};

int name_check(const char *name, size_t max, const char *extra)
{
	size_t n = name != NULL ? strlen(name) : 0;

	if (n == 0 || n > max)
		return GPUCMD_EINVAL;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '.' || c == '_' ||
		      c == '-' || strchr(extra, c) != NULL))
			return GPUCMD_EINVAL;
	}
	return 0;
}

int service_name_check(const char *name)
{
	return name_check(name, SERVICE_NAME_MAX, "");
}

void service_apply(struct service *svc, const struct config_service *limits)
{
	atomic_store(&svc->memory_limit, limits->memory_limit);
	atomic_store(&svc->region_limit, limits->region_limit);
	atomic_store(&svc->max_streams, limits->max_streams);
	atomic_store(&svc->max_modules, limits->max_modules);
	atomic_store(&svc->weight, limits->weight ? limits->weight : 1);
	atomic_store(&svc->max_bytes_in_flight, limits->max_bytes_in_flight);
	atomic_store(&svc->max_connections, limits->max_connections);
}

bool service_allows(const struct config_service *cs, uint32_t uid,
		    const uint32_t *gids, size_t n)
{
	if (cs->nuids == 0 && cs->ngids == 0)
		return true;
	for (uint32_t i = 0; i < cs->nuids; i++)
		if (cs->uids[i] == uid)
			return true;
	for (uint32_t i = 0; i < cs->ngids; i++)
		for (size_t j = 0; j < n; j++)
			if (cs->gids[i] == gids[j])
				return true;
	return false;
}

struct service *service_observers(void)
{
	return &observers;
}

/* The registered service called name, or NULL (registry_lock held). */
static struct service *find_locked(const char *name)
{
	struct service *svc;

	for (svc = registry_head; svc != NULL; svc = svc->next)
		if (strcmp(svc->name, name) == 0)
			break;
	return svc;
}

bool service_known(const char *name)
{
	bool found;

	pthread_mutex_lock(&registry_lock);
	found = find_locked(name) != NULL;
	pthread_mutex_unlock(&registry_lock);
	return found;
}

/*
 * Whether svc may go to make room (registry_lock held): no file lists it,
 * no session holds it (a session is freed only once the device thread is
 * done with its connection, so none of its connections has a stream set,
 * a batch or a graph left), it is out of the executor's rounds, and it
 * keeps no module loaded.  Nothing else refers to a service but the walks
 * of service_foreach, under the lock.  What goes with it: the peak and OOM
 * count the report showed for it.
 */
static bool service_retirable(const struct service *svc)
{
	return !atomic_load(&svc->listed) && svc->holders == 0 &&
	       atomic_load(&svc->connections) == 0 &&
	       !atomic_load_explicit(&svc->in_rounds, memory_order_acquire) &&
	       atomic_load(&svc->modules) == 0 && svc->budget_waiters == NULL;
}

/* Free the oldest retirable service (registry_lock held); whether one went. */
static bool retire_oldest(void)
{
	for (struct service **pp = &registry_head; *pp != NULL;
	     pp = &(*pp)->next) {
		struct service *svc = *pp;

		if (!service_retirable(svc))
			continue;
		*pp = svc->next;
		if (registry_tail == &svc->next)
			registry_tail = pp;
		registry_count--;
		log_info("service %s (id %u) retired to make room for a new "
			 "one: it held nothing and no connection (the registry "
			 "keeps %d)",
			 svc->name, (unsigned)svc->id, SERVICE_MAX);
		free(svc->module_refs);
		free(svc);
		return true;
	}
	return false;
}

/* service_get, and a holder more when joining (registry_lock taken). */
static struct service *get(const char *name,
			   const struct config_service *limits, bool join)
{
	struct service *svc;

	pthread_mutex_lock(&registry_lock);
	svc = find_locked(name);
	if (svc != NULL || (registry_count >= SERVICE_MAX && !retire_oldest()))
		goto out;
	svc = calloc(1, sizeof(*svc));
	if (svc == NULL)
		goto out;
	snprintf(svc->name, sizeof(svc->name), "%s", name);
	svc->id = ++registry_last_id;
	registry_count++;
	atomic_init(&svc->in_rounds, false);
	atomic_init(&svc->connections, 0);
	atomic_init(&svc->memory_limit, 0);
	atomic_init(&svc->region_limit, 0);
	atomic_init(&svc->max_streams, 0);
	atomic_init(&svc->max_modules, 0);
	atomic_init(&svc->modules, 0);
	atomic_init(&svc->listed, false);
	atomic_init(&svc->weight, 1);
	atomic_init(&svc->max_bytes_in_flight, 0);
	atomic_init(&svc->max_connections, 0);
	atomic_init(&svc->bytes_done, 0);
	service_apply(svc, limits);
	*registry_tail = svc;
	registry_tail = &svc->next;
out:
	if (svc != NULL && join)
		svc->holders++;
	pthread_mutex_unlock(&registry_lock);
	return svc;
}

struct service *service_get(const char *name,
			    const struct config_service *limits)
{
	return get(name, limits, false);
}

struct service *service_join(const char *name,
			     const struct config_service *limits)
{
	return get(name, limits, true);
}

void service_leave(struct service *svc)
{
	pthread_mutex_lock(&registry_lock);
	svc->holders--;
	pthread_mutex_unlock(&registry_lock);
}

void service_foreach(void (*fn)(struct service *svc, void *arg), void *arg)
{
	pthread_mutex_lock(&registry_lock);
	for (struct service *svc = registry_head; svc != NULL; svc = svc->next)
		fn(svc, arg);
	pthread_mutex_unlock(&registry_lock);
}

uint32_t service_count(void)
{
	uint32_t n;

	pthread_mutex_lock(&registry_lock);
	n = registry_count;
	pthread_mutex_unlock(&registry_lock);
	return n;
}

void service_charge(struct service *svc, uint64_t size)
{
	uint64_t held;

	svc->bytes_in_use += size;
	svc->allocations++;
	/*
	 * The peak of what the report calls in use: live buffers and the
	 * released ones the device may still use.  A release moves bytes
	 * from one to the other, so only a charge can raise it.
	 */
	held = svc->bytes_in_use + svc->release_pending_bytes;
	if (held > svc->peak_bytes_in_use)
		svc->peak_bytes_in_use = held;
}

void service_uncharge(struct service *svc, uint64_t size)
{
	svc->bytes_in_use -= size;
	svc->allocations--;
}

uint64_t service_reserve_cap(uint64_t limit)
{
	if (limit == 0)
		return 0;
	if (limit < SERVICE_MIN_RESERVE / 4)
		return SERVICE_MIN_RESERVE;
	return limit > UINT64_MAX / 4 ? UINT64_MAX : 4 * limit;
}

bool service_over_limit(const struct service *svc, uint64_t limit,
			uint64_t size)
{
	uint64_t held;

	if (limit == 0)
		return false;
	if (__builtin_add_overflow(svc->bytes_in_use, svc->module_bytes, &held))
		return true;
	return size > limit || held > limit - size;
}

bool service_reserve_over(const struct service *svc, uint64_t limit,
			  uint64_t size, bool exact)
{
	uint64_t cap = service_reserve_cap(limit);

	if (!exact)
		cap /= 2;

	return cap != 0 && (size > cap || svc->bytes_reserved > cap - size);
}

int service_region_check(const struct service *svc, uint64_t size)
{
	uint64_t limit = atomic_load(&svc->region_limit);
	uint64_t after;

	if (limit == 0)
		return 0;
	if (__builtin_add_overflow(svc->region_bytes, size, &after) ||
	    after > limit)
		return GPUCMD_EQUOTA;
	return 0;
}

void service_region_charge(struct service *svc, uint64_t size)
{
	svc->region_bytes += size;
	svc->regions++;
}

void service_region_uncharge(struct service *svc, uint64_t size)
{
	svc->region_bytes -= size;
	svc->regions--;
}

static struct service_module *module_ref_find(const struct service *svc,
					      const void *entry)
{
	uint32_t n = atomic_load(&svc->modules);

	for (uint32_t i = 0; i < n; i++)
		if (svc->module_refs[i].entry == entry)
			return &svc->module_refs[i];
	return NULL;
}

bool service_module_held(const struct service *svc, const void *entry)
{
	return module_ref_find(svc, entry) != NULL;
}

int service_module_ref(struct service *svc, const void *entry, uint64_t bytes)
{
	struct service_module *m = module_ref_find(svc, entry);
	uint32_t n = atomic_load(&svc->modules);

	if (m != NULL) {
		m->holders++;
		return 0;
	}
	if (n == svc->module_refs_cap) {
		uint32_t cap = n ? 2 * n : 8;
		struct service_module *v =
			realloc(svc->module_refs, cap * sizeof(*v));

		if (v == NULL)
			return GPUCMD_ENOMEM;
		svc->module_refs = v;
		svc->module_refs_cap = cap;
	}
	svc->module_refs[n].entry = entry;
	svc->module_refs[n].holders = 1;
	svc->module_refs[n].bytes = bytes;
	svc->module_bytes += bytes;
	atomic_store(&svc->modules, n + 1);
	return 0;
}

void service_module_unref(struct service *svc, const void *entry)
{
	struct service_module *m = module_ref_find(svc, entry);
	uint32_t n = atomic_load(&svc->modules);

	if (m == NULL || --m->holders > 0)
		return;
	svc->module_bytes -= m->bytes;
	*m = svc->module_refs[n - 1];
	atomic_store(&svc->modules, n - 1);
}

void service_registry_free(void)
{
	pthread_mutex_lock(&registry_lock);
	while (registry_head != NULL) {
		struct service *next = registry_head->next;
		free(registry_head->module_refs);
		free(registry_head);
		registry_head = next;
	}
	registry_tail = &registry_head;
	registry_count = 0;
	registry_last_id = 0;
	pthread_mutex_unlock(&registry_lock);
}

void service_note_refusal(struct service *svc, uint64_t connection,
			  uint32_t stream, uint64_t size, int code,
			  const char *message)
{
	/* A client may cause these at will: the device thread's own limit. */
	static struct log_limit limit =
		LOG_LIMIT_INIT("allocation refusal lines", 10, 20);
	struct service_refusal *r = &svc->last_refusal;
	struct timespec now;

	svc->oom_count++;
	clock_gettime(CLOCK_REALTIME, &now);
	r->unix_ms =
		(uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000;
	r->size = size;
	r->connection = connection;
	r->stream = stream;
	r->code = code;
	snprintf(r->message, sizeof(r->message), "%s", message);
	if (log_limit_take(&limit))
		log_info("service '%s': connection %llu was refused %llu "
			 "bytes on stream %u (%s): %s",
			 svc->name, (unsigned long long)connection,
			 (unsigned long long)size, stream, gpucmd_errname(code),
			 message);
}
