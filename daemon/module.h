/*
 * module.h - device code clients load: a cache shared by the whole daemon,
 * keyed by content, so the same PTX sent by ten services is compiled once.
 *
 * Each connection names its modules by ids it chooses (stream_set's
 * module list); an id holds a reference on a cache entry.  Entries stay
 * compiled until the daemon exits (launches may still run them), up to
 * MODULE_CACHE_MAX distinct modules.  Built-in kernels do not go
 * through here (the backend holds them).
 *
 * Safety: a user kernel runs in the daemon's one device context, so, like
 * every kernel under MPS, it could address memory it was not given; the
 * daemon cannot bounds-check user code as it does the built-ins.  Operators
 * who cannot trust a service's kernels should give it built-ins only
 * (documented in gpucmdd(8)).
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
	bool done;			/* module_compile ran */
	int rc;				/* its result */
	struct driver_module *dm;	/* loaded, until the cache takes it */
	char err[256];			/* rc != 0: what went wrong */
	char log[400];			/* the compiler's log, if any */
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
		     const void *data, size_t len,
		     struct module_compiled *pre, struct module_entry **out,
		     char *err, size_t err_len, char *log, size_t log_len);
/** Any thread: may modules be compiled off the device thread? */
bool module_cache_compiles_shared(const struct module_cache *c);
/** Any thread: does the cache hold this content compiled already? */
bool module_cache_has(struct module_cache *c, enum driver_module_format fmt,
		      const void *data, size_t len);
/**
 * Any thread (module_cache_compiles_shared): compile and load the content
 * into out, without touching the cache.
 */
void module_compile(struct module_cache *c, enum driver_module_format fmt,
		    const void *data, size_t len, struct module_compiled *out);
/** Any thread: unload what module_cache_get did not take from m. */
void module_compiled_release(struct module_cache *c,
			     struct module_compiled *m);
/** Drop one reference; the module stays compiled in the cache. */
void module_cache_put(struct module_cache *c, struct module_entry *e);
/** The function name in e (looked up once, then remembered). */
int module_function(struct module_cache *c, struct module_entry *e,
		    const char *name, struct driver_function **out);
/** Parse "ptx", "cubin", "fatbin", "cuda"; -1 when unknown. */
int module_format_parse(const char *s);
/** Modules loaded now, and loads the cache saved (for status). */
void module_cache_stats(const struct module_cache *c, uint64_t *loaded,
			uint64_t *hits);
