/*
 * service.h - services: the named tenants of the daemon.
 *
 * A connection speaks for one service, named in its Hello.  Several
 * connections may share a service; memory accounting, quotas and the memory
 * report are per service.  A service outlives its clients, so that the
 * report can show its peak and OOM count after they left; but the registry
 * holds at most SERVICE_MAX, and when a new name finds it full the oldest
 * service that no file lists and that holds nothing (service_retirable)
 * goes to make room, so that services named per job, or a client making up
 * names, cannot shut new services out until a restart.
 *
 * An admin's observer connection (Hello.observe) joins none of them: it
 * speaks for service_observers(), one object outside the registry, so that
 * nothing that walks the services (reports, status, SIGHUP) sees it, and
 * nothing that follows a connection's service finds NULL.  Observers may
 * only read reports and run admin ops (session.c refuses the rest), so it
 * is never charged.
 *
 * Threads: services are created on the loop thread (at Hello) and read on
 * the device thread; the registry list is guarded by a mutex.  `connections`
 * is atomic; the memory counters are written by the device thread only.
 */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"

struct batch;
struct shared_buffer;
struct session;

/*
 * The last allocation a service was refused (device memory or its quota),
 * as its client was told: kept for the memory report, so that an operator
 * asked "why did my allocation fail" after the fact has the sentence with
 * its numbers, and when.
 */
#define SERVICE_REFUSAL_MSG 768 /* a command's sentence, whole */
struct service_refusal {
	uint64_t unix_ms; /* wall clock; 0: none since the daemon started */
	uint64_t size;	  /* bytes asked for */
	uint64_t connection;
	int32_t code; /* GPUCMD_EQUOTA, GPUCMD_ENOMEM */
	uint32_t stream;
	char message[SERVICE_REFUSAL_MSG];
};

#define SERVICE_NAME_MAX 63
/* The sentence for a service name the daemon does not know (evict, cleanup). */
#define SERVICE_UNKNOWN_FMT \
	"no service '%.64s' is known to the daemon (gpucmd services lists them)"
#define SERVICE_MAX 1024
_Static_assert(SERVICE_MAX == CONFIG_MAX_SERVICES,
	       "a file may list as many services as the registry keeps");
/* Sliced pages of a service with a quota are at most max(limit, this). */
#define SERVICE_MIN_PAGE_UNIT (32ull << 20)
/* service_reserve_cap is never below this for a service with a quota. */
#define SERVICE_MIN_RESERVE (256ull << 20)
/* A preset's pages for a service with a quota are at least this large. */
#define SERVICE_MIN_PAGE (2ull << 20)

struct service {
	char name[SERVICE_NAME_MAX + 1];
	uint32_t id;
	/* Limits: set by the loop thread (start, SIGHUP), read anywhere. */
	atomic_uint_fast64_t memory_limit; /* bytes, 0 = none */
	atomic_uint_fast64_t region_limit; /* shared region bytes, 0 = none */
	atomic_uint max_streams;	   /* 0 = the daemon's limit */
	atomic_uint max_modules;	   /* loaded at once, 0 = none */
	atomic_uint weight;		   /* batches per scheduling round */
	atomic_uint_fast64_t max_bytes_in_flight; /* all its connections */
	atomic_uint max_connections; /* open at once, 0 = no bound */
	atomic_bool listed;	     /* a section of the file named it */
	bool observer;		     /* service_observers(), fixed */
	atomic_uint connections;
	/*
	 * Sessions that joined it and are not freed yet (service_join,
	 * service_leave): registry_lock.  A session is freed only once the
	 * device thread is done with its connection.
	 */
	uint32_t holders;
	/* In the executor's rounds (rounds.c sets it, device thread). */
	atomic_bool in_rounds;
	/*
	 * Distinct modules of the daemon's cache the service keeps loaded:
	 * named by its connections' ids, launched by its graphs, or unloaded
	 * with launches still to run (module_refs, device thread); modules
	 * is their number, for the report and max_modules.
	 */
	atomic_uint modules;
	/*
	 * Its connections' requests held in the daemon, against
	 * max_bytes_in_flight: the loop adds each request's cost at submit,
	 * the device thread the costs of completed batches to bytes_done.
	 * Sessions whose next frame waits for the service's budget are on
	 * budget_waiters (loop thread; session.c).
	 */
	uint64_t bytes_submitted; /* loop thread */
	atomic_uint_fast64_t bytes_done;
	/*
	 * Frames let in and not yet submitted (bodies being read, requests
	 * compiling): they hold their place too (loop thread).
	 */
	uint64_t bytes_admitted;
	/*
	 * Its connections' replies waiting in their sockets' write queues
	 * (loop thread; session.c's note_unwritten): a lagging client of a
	 * service already over max_bytes_in_flight is cut off.
	 */
	uint64_t bytes_unwritten;
	/* Oldest first: they go in turn (loop thread). */
	struct session *budget_waiters;
	bool budget_waking; /* wake_budget_waiters runs */
	bool budget_rewake; /* ... and room came back meanwhile */
	/* Device thread only. */
	struct batch *queue_head; /* batches waiting for their turn */
	struct batch **queue_tail;
	struct service *next_active; /* in the executor's round */
	bool active;		     /* in the rounds (rounds.h) */
	bool emptied;		     /* ...without a batch (rounds.h) */
	uint64_t batches;	     /* its connections ran (status) */
	uint64_t bytes_in_use;
	uint64_t allocations;
	uint64_t peak_bytes_in_use;
	uint64_t oom_count;
	struct service_refusal last_refusal; /* device thread */
	/*
	 * Bytes released by the service's connections that the device may
	 * still use (drop queues): no longer in bytes_in_use, not yet free.
	 * The quota bounds them too (command_reserve).
	 */
	uint64_t release_pending_bytes;
	/*
	 * Bytes released on the stream that owns them and that alone used
	 * them (stream-ordered reuse, streams.c): back in that stream's pools
	 * at once, but work queued before the release may still use them, so
	 * their device memory cannot go back to the device yet.  Not in the
	 * report's in use (the stream may have reused them); the quota's
	 * bound counts them with release_pending_bytes.
	 */
	uint64_t ordered_pending_bytes;
	/*
	 * Device memory the pools of the service's streams hold: pages and
	 * allocations, live, cached or busy (streams.c, storage_alloc).  The
	 * quota bounds it at service_reserve_cap (service_reserve_over).
	 */
	uint64_t bytes_reserved;
	/*
	 * Shared regions mapped for the service's connections (region.h):
	 * charged at attach, uncharged when a region is really unmapped
	 * (after a release's fences, or at the connection's teardown).
	 */
	uint64_t region_bytes;
	uint32_t regions;
	uint64_t region_refusals; /* attaches refused over region_limit */
	struct service_module *module_refs; /* modules of them */
	uint32_t module_refs_cap;
	/*
	 * The device memory the globals of those modules hold (device
	 * thread): counted in the memory_limit beside live buffers.
	 */
	uint64_t module_bytes;
	/*
	 * Buffers its connections share (memory/shared_buffer.h; device
	 * thread): their bytes are in bytes_in_use and bytes_reserved too.
	 */
	struct shared_buffer *shared;
	uint32_t nshared;
	uint64_t shared_bytes;
	struct service *next;
};

/* A module the service keeps loaded, and how many of its holders there are. */
struct service_module {
	const void *entry; /* a struct module_entry of the cache */
	uint32_t holders;
	uint64_t bytes; /* its globals' device memory */
};

/**
 * Check a name: 1 to max characters of letters, digits, '.', '_', '-' and
 * those of extra ("" for none).  0 or GPUCMD_EINVAL.
 */
int name_check(const char *name, size_t max, const char *extra);
/** Check a service name: name_check with SERVICE_NAME_MAX, no extras. */
int service_name_check(const char *name);
/** Whether a service of that name exists (any thread). */
bool service_known(const char *name);
/**
 * The service called name, created with limits if new (an existing one
 * keeps its own); NULL when SERVICE_MAX services exist already and none of
 * them can be retired to make room.
 */
struct service *service_get(const char *name,
			    const struct config_service *limits);
/**
 * service_get for a session (loop thread): the service counts it among its
 * holders until service_leave, and is not retired meanwhile.
 */
struct service *service_join(const char *name,
			     const struct config_service *limits);
/** The session that joined svc is freed (loop thread). */
void service_leave(struct service *svc);
/**
 * The service of admins' observer connections: not in the registry (no id,
 * no row in any report, not counted), named "(observer)" for the logs,
 * which no real service can be called; it lives as long as the process.
 */
struct service *service_observers(void);
/** Set svc's limits (at start and on SIGHUP). */
void service_apply(struct service *svc, const struct config_service *limits);
/**
 * May a peer with uid and the groups gids[n] join a service configured as
 * cs?  Yes when cs lists no uids and no gids, or lists one of them.
 */
bool service_allows(const struct config_service *cs, uint32_t uid,
		    const uint32_t *gids, size_t n);
/** Call fn on every service, in id order, under the registry lock. */
void service_foreach(void (*fn)(struct service *svc, void *arg), void *arg);
/** Number of services known. */
uint32_t service_count(void);
/** Account an allocation of size bytes (device thread). */
void service_charge(struct service *svc, uint64_t size);
/** Account the release of size bytes (device thread). */
void service_uncharge(struct service *svc, uint64_t size);
/**
 * The most device memory a service with memory_limit limit may hold in its
 * streams' pools (0: no bound): four times the limit, or
 * SERVICE_MIN_RESERVE when that is more (each stream that holds a buffer
 * keeps a page of each size it uses, and at small limits those pages are
 * a fair part of the limit: three connections of three streams each, with
 * a few small buffers under 32M, hold 174M).  The quota bounds
 * live bytes at the limit and live plus released-but-still-used at twice
 * it; the rest is room for the pages that hold them, each stream's own,
 * partly used (a preset's sliced pages are at most the limit or
 * SERVICE_MIN_PAGE_UNIT, streams_layout_props).  A pipeline of two
 * streams releasing behind its kernels under a quota of 1.2 x its working
 * set peaks at 3.5 x (test_services, pipelines).
 */
uint64_t service_reserve_cap(uint64_t limit);
/**
 * Would size more live bytes (a buffer, a module's globals) take svc past
 * limit, its memory_limit, counting its live buffers and the globals of the
 * modules it holds?  false when limit is 0 (device thread).
 */
bool service_over_limit(const struct service *svc, uint64_t limit,
			uint64_t size);
/**
 * Would size more bytes of device memory take svc's bytes_reserved past
 * service_reserve_cap(limit) (exact: an allocation of a request's own
 * size), or past half of it (anything else: a pool's page or node)?
 * Pages stop at half, and past it requests get allocations of their own
 * size, which live and released-but-used bytes bound at twice the limit:
 * so no request within those two quotas is refused for the pages that
 * came before it (device thread).
 */
bool service_reserve_over(const struct service *svc, uint64_t limit,
			  uint64_t size, bool exact);
/**
 * May svc map one more shared region of size bytes?  0, or GPUCMD_EQUOTA
 * when it would take region_bytes over region_limit (device thread).
 */
int service_region_check(const struct service *svc, uint64_t size);
/** Account a shared region of size bytes mapped (device thread). */
void service_region_charge(struct service *svc, uint64_t size);
/** Account a shared region of size bytes unmapped (device thread). */
void service_region_uncharge(struct service *svc, uint64_t size);
/** Does svc keep the cache's module entry loaded (device thread)? */
bool service_module_held(const struct service *svc, const void *entry);
/**
 * One more holder of entry in svc (an id, a graph, a pending unload): a new
 * entry counts toward modules, and its globals' bytes toward module_bytes.
 * The caller checked max_modules and the memory_limit.  0, or
 * GPUCMD_ENOMEM (nothing changed).  Device thread.
 */
int service_module_ref(struct service *svc, const void *entry, uint64_t bytes);
/** One holder of entry fewer; at none, it leaves modules.  Device thread. */
void service_module_unref(struct service *svc, const void *entry);
/** Free every service (at exit, after the threads stopped). */
void service_registry_free(void);
/**
 * An allocation of size bytes by connection (on stream) was refused with
 * code and message: count it (oom_count), keep it as the service's last
 * refusal, and log it (rate-limited).  Device thread.
 */
void service_note_refusal(struct service *svc, uint64_t connection,
			  uint32_t stream, uint64_t size, int code,
			  const char *message);
