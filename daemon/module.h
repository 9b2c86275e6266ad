/*
 * module.h - device code clients load: a cache shared by the whole daemon,
 * keyed by content, so the same PTX sent by ten services is compiled once.
 * A module with global variables (static_bytes) is the exception: it is
 * shared only by the connections of the service that loaded it (owner, a
 * service id, never reused), since its globals are one copy in device
 * memory and kernels read and write them; another service loading the
 * same code gets a module of its own.  They keep their values while the
 * module stays loaded, cached or not, as within one CUDA process.
 *
 * Each connection names its modules by ids it chooses (stream_set's
 * module list); an id holds a reference on a cache entry, and so does a
 * captured graph that launches it.  An unloaded id gives its reference
 * back only once the launches enqueued before the unload have run
 * (streams.c, fenced like released memory), so an entry nobody references
 * runs nowhere.  Such an entry stays compiled for the next service that
 * sends the same code, until a load finds the cache full
 * (MODULE_CACHE_MAX distinct modules): then the one unused longest is
 * unloaded to make room.  Only a cache full of referenced modules refuses
 * a load; each service may reference at most its max_modules
 * (gpucmdd.conf(5)), so one service cannot fill it for the others.
 * Built-in kernels do not go through here (the backend holds them).
 *
 * Safety: a user kernel runs in the daemon's one device context, so, like
 * every kernel under MPS, it could address memory it was not given; the
 * daemon cannot bounds-check user code as it does the built-ins.  Operators
 * who cannot trust a service's kernels give it the built-ins only
 * (max_modules = 0, gpucmdd.conf(5)).
 *
 * Threads: the cache belongs to the device thread.  Compilation (NVRTC,
 * the PTX JIT: milliseconds to seconds) runs off it where the backend can
 * (driver module_load_shared): the loop sees a load_module op with inline
 * bytes whose content the cache does not hold, compiles it on libuv's
 * thread pool (module_compile) while that connection's later requests
 * wait, and the batch then brings the loaded module along for
 * module_cache_get to file.  Other connections are served meanwhile.  A
 * module sent through a region is compiled on the device thread (the loop
 * cannot read regions).
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "driver/driver.h"

/* Distinct modules the daemon keeps compiled at most. */
#define MODULE_CACHE_MAX 1024
/*
 * Device memory the globals of modules nobody references may hold at most
 * (module_cache_put): it belongs to no service's quota.
 */
#define MODULE_CACHE_IDLE_BYTES (64ull << 20)

struct module_cache;
struct module_entry;

/* A connection's name for a loaded module. */
struct module_ref {
	uint64_t id;
	struct module_entry *entry;
	struct module_ref *next;
};

/* A module compiled off the device thread, waiting to be filed. */
struct module_compiled {
	bool done;		  /* module_compile ran */
	int rc;			  /* its result */
	struct driver_module *dm; /* loaded, until the cache takes it */
	char err[256];		  /* rc != 0: what went wrong */
	char log[400];		  /* the compiler's log, if any */
};

/** An empty cache over d. */
int module_cache_create(struct driver *d, struct module_cache **out);
/** Unload everything (no references may remain). */
void module_cache_destroy(struct module_cache *c);
/**
 * The entry for this content, compiled on first sight, or filed from pre
 * (when not NULL and done: compiled by module_compile; the cache takes its
 * module, or leaves it for module_compiled_release).  On failure err says
 * what went wrong and log has the compiler's log (compile errors).
 */
int module_cache_get(struct module_cache *c, enum driver_module_format fmt,
		     const void *data, size_t len, uint32_t owner,
		     struct module_compiled *pre, struct module_entry **out,
		     char *err, size_t err_len, char *log, size_t log_len);
/** The entry for this content when compiled already (no reference), else NULL. */
const struct module_entry *module_cache_lookup(struct module_cache *c,
					       enum driver_module_format fmt,
					       const void *data, size_t len,
					       uint32_t owner);
/** The device memory e's globals hold while it is loaded (module_image.h). */
uint64_t module_entry_static_bytes(const struct module_entry *e);
/** What the globals of entries nobody references hold (at most MODULE_CACHE_IDLE_BYTES). */
uint64_t module_cache_idle_bytes(const struct module_cache *c);
/** Any thread: may modules be compiled off the device thread? */
bool module_cache_compiles_shared(const struct module_cache *c);
/** Any thread: does the cache hold this content compiled already? */
bool module_cache_has(struct module_cache *c, enum driver_module_format fmt,
		      const void *data, size_t len, uint32_t owner);
/**
 * Any thread (module_cache_compiles_shared): compile and load the content
 * into out, without touching the cache.
 */
void module_compile(struct module_cache *c, enum driver_module_format fmt,
		    const void *data, size_t len, struct module_compiled *out);
/** Any thread: unload what module_cache_get did not take from m. */
void module_compiled_release(struct module_cache *c, struct module_compiled *m);
/**
 * Drop one reference, when no work enqueued under it may still run it:
 * the module stays compiled, and may be evicted once nobody holds it.
 */
void module_cache_put(struct module_cache *c, struct module_entry *e);
/** One more reference on e (a graph that launches it). */
void module_cache_hold(struct module_cache *c, struct module_entry *e);
/** The function name in e (looked up once, then remembered). */
int module_function(struct module_cache *c, struct module_entry *e,
		    const char *name, struct driver_function **out);
/** Parse "ptx", "cubin", "fatbin", "cuda"; -1 when unknown. */
int module_format_parse(const char *s);
/**
 * Modules loaded (over the daemon's life), loads the cache saved, and
 * modules evicted to make room (for status).
 */
void module_cache_stats(const struct module_cache *c, uint64_t *loaded,
			uint64_t *hits, uint64_t *evicted);
/** Distinct modules compiled in the cache now. */
uint32_t module_cache_count(const struct module_cache *c);
