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
 * Thread: the device thread.  Compilation runs there too for now (the
 * driver API call is synchronous); the cache keeps it to once per content.
 */
#pragma once

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

/** An empty cache over d. */
int module_cache_create(struct driver *d, struct module_cache **out);
/** Unload everything (no references may remain). */
void module_cache_destroy(struct module_cache *c);
/**
 * The entry for this content, compiled on first sight.  On failure the
 * driver's log (compile errors) is in log.
 */
int module_cache_get(struct module_cache *c, enum driver_module_format fmt,
		     const void *data, size_t len, struct module_entry **out,
		     char *log, size_t log_len);
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
