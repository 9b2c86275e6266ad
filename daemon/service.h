/*
 * service.h - services: the named tenants of the daemon.
 *
 * A connection speaks for one service, named in its Hello.  Several
 * connections may share a service; memory accounting, quotas and the memory
 * report are per service.  Services live until the daemon exits (so the
 * report can show a service's peak and OOM count after its clients left).
 *
 * Threads: services are created on the loop thread (at Hello) and read on
 * the device thread; the registry list is guarded by a mutex.  `connections`
 * is atomic; the memory counters are written by the device thread only.
 */
#pragma once

#include <stdatomic.h>
#include <stdint.h>

#define SERVICE_NAME_MAX 63
#define SERVICE_MAX 1024

struct service {
	char name[SERVICE_NAME_MAX + 1];
	uint32_t id;
	uint64_t memory_limit;		/* bytes, 0 = none */
	atomic_uint connections;
	/* Device thread only. */
	uint64_t bytes_in_use;
	uint64_t allocations;
	uint64_t peak_bytes_in_use;
	uint64_t oom_count;
	struct service *next;
};

/**
 * Check a service name: 1 to 63 characters of letters, digits, '.', '_',
 * '-'.  0 or GPUCMD_EINVAL.
 */
int service_name_check(const char *name);
/**
 * The service called name, created with the default limits if new; NULL
 * when SERVICE_MAX services exist already.
 */
struct service *service_get(const char *name);
/** Call fn on every service, in id order, under the registry lock. */
void service_foreach(void (*fn)(struct service *svc, void *arg), void *arg);
/** Number of services known. */
uint32_t service_count(void);
/** Account an allocation of size bytes (device thread). */
void service_charge(struct service *svc, uint64_t size);
/** Account the release of size bytes (device thread). */
void service_uncharge(struct service *svc, uint64_t size);
/** Free every service (at exit, after the threads stopped). */
void service_registry_free(void);
