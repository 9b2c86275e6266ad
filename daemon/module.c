/*
 * module.c - see module.h.  Entries are found by a 64-bit FNV-1a hash of
 * format and content, confirmed by comparing the bytes.
 */
#include "module.h"
#include "module_image.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpucmd.h"

struct module_fn {
	char *name;
	struct driver_function *fn;
	struct module_fn *next;
};

struct module_entry {
	uint64_t hash;
	enum driver_module_format fmt;
	void *data;
	size_t len;
	struct driver_module *dm;
	uint32_t refs;
	uint64_t last_use;     /* the cache's tick at its last get */
	uint64_t static_bytes; /* its globals' device memory (module_image.h) */
	/*
	 * With globals (static_bytes > 0): the id of the service whose
	 * connections alone share it, so that no service reads or writes
	 * another's global variables (module.h).  0 for one without.
	 */
	uint32_t owner;
	struct module_fn *fns;
	struct module_entry *next;
};

struct module_cache {
	struct driver *driver;
	/*
	 * Only the device thread adds and evicts entries, under lock; other
	 * threads look them up under lock (module_cache_has), the device
	 * thread without.
	 */
	pthread_mutex_t lock;
	struct module_entry *entries;
	uint64_t loaded;
	uint64_t hits;
	uint64_t evicted;
	uint64_t tick;	     /* counts gets: the order of use */
	uint64_t idle_bytes; /* static_bytes of entries nobody references */
	uint32_t count;
};

static uint64_t fnv1a(uint64_t h, const void *data, size_t len)
{
	const uint8_t *p = data;

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

int module_cache_create(struct driver *d, struct module_cache **out)
{
	struct module_cache *c = calloc(1, sizeof(*c));

	if (c == NULL)
		return GPUCMD_ENOMEM;
	c->driver = d;
	pthread_mutex_init(&c->lock, NULL);
	*out = c;
	return 0;
}

static void entry_free(struct module_cache *c, struct module_entry *e)
{
	while (e->fns != NULL) {
		struct module_fn *f = e->fns;
		e->fns = f->next;
		free(f->name);
		free(f);
	}
	c->driver->ops->module_unload(c->driver, e->dm);
	free(e->data);
	free(e);
}

void module_cache_destroy(struct module_cache *c)
{
	if (c == NULL)
		return;
	while (c->entries != NULL) {
		struct module_entry *e = c->entries;
		c->entries = e->next;
		entry_free(c, e);
	}
	pthread_mutex_destroy(&c->lock);
	free(c);
}

static uint64_t content_hash(enum driver_module_format fmt, const void *data,
			     size_t len)
{
	return fnv1a(fnv1a(0xcbf29ce484222325ull, &fmt, sizeof(fmt)), data,
		     len);
}

static struct module_entry *find(struct module_cache *c, uint64_t h,
				 enum driver_module_format fmt,
				 const void *data, size_t len, uint32_t owner)
{
	for (struct module_entry *e = c->entries; e != NULL; e = e->next)
		if (e->hash == h && e->fmt == fmt && e->len == len &&
		    (e->owner == 0 || e->owner == owner) &&
		    memcmp(e->data, data, len) == 0)
			return e;
	return NULL;
}

/* Is there an entry nobody references? */
static bool evictable(const struct module_cache *c)
{
	for (const struct module_entry *e = c->entries; e != NULL; e = e->next)
		if (e->refs == 0)
			return true;
	return false;
}

/* Unload *pp, which nobody references. */
static void evict(struct module_cache *c, struct module_entry **pp)
{
	struct module_entry *e = *pp;

	pthread_mutex_lock(&c->lock);
	*pp = e->next;
	pthread_mutex_unlock(&c->lock);
	c->idle_bytes -= e->static_bytes;
	entry_free(c, e);
	c->count--;
	c->evicted++;
}

/*
 * Unload the entry nobody references that was used longest ago (of those
 * whose globals hold device memory, when holding_memory); false when there
 * is none.  A linear walk: it runs only when a
 * load finds MODULE_CACHE_MAX entries, and compiling costs far more.
 */
static bool evict_one(struct module_cache *c, bool holding_memory)
{
	struct module_entry **victim = NULL;

	for (struct module_entry **pp = &c->entries; *pp != NULL;
	     pp = &(*pp)->next)
		if ((*pp)->refs == 0 &&
		    (!holding_memory || (*pp)->static_bytes > 0) &&
		    (victim == NULL || (*pp)->last_use < (*victim)->last_use))
			victim = pp;
	if (victim == NULL)
		return false;
	evict(c, victim);
	return true;
}

/*
 * The device memory e's globals hold: the backend's word for what it
 * loaded (CUDA C is compiled there), else read from the image.
 */
static uint64_t entry_static_bytes(struct module_cache *c,
				   const struct module_entry *e)
{
	if (c->driver->ops->module_static_bytes != NULL)
		return c->driver->ops->module_static_bytes(c->driver, e->dm);
	if (e->fmt == DRIVER_MODULE_CUDA_C)
		return 0;
	return module_image_static_bytes(e->data, e->len, NULL);
}

/* Whether e's image says for sure what globals it has (none or some). */
static bool globals_known(const struct module_entry *e)
{
	enum module_image_known k = MODULE_IMAGE_KNOWN;

	if (e->fmt != DRIVER_MODULE_CUDA_C)
		(void)module_image_static_bytes(e->data, e->len, &k);
	return k == MODULE_IMAGE_KNOWN;
}

int module_cache_get(struct module_cache *c, enum driver_module_format fmt,
		     const void *data, size_t len, uint32_t owner,
		     struct module_compiled *pre, struct module_entry **out,
		     char *err, size_t err_len, char *log, size_t log_len)
{
	uint64_t h = content_hash(fmt, data, len);
	struct module_entry *e = find(c, h, fmt, data, len, owner);
	int rc;

	err[0] = '\0';
	log[0] = '\0';
	if (e != NULL) {
		/* Another connection may have filed it while pre compiled. */
		if (e->refs++ == 0)
			c->idle_bytes -= e->static_bytes;
		e->last_use = ++c->tick;
		c->hits++;
		*out = e;
		return 0;
	}
	/* Room first (no compile for a cache that cannot take it)... */
	if (c->count >= MODULE_CACHE_MAX && !evictable(c)) {
		snprintf(err, err_len,
			 "the daemon's module cache holds %d "
			 "modules and every one is in use (loaded by a "
			 "connection, launched by a graph, or by work not yet "
			 "done); unload modules, or lower the max_modules of "
			 "the services that hold them",
			 MODULE_CACHE_MAX);
		return GPUCMD_ELIMIT;
	}
	if (pre != NULL && pre->done && pre->rc != 0) {
		snprintf(err, err_len, "%s", pre->err);
		snprintf(log, log_len, "%s", pre->log);
		return pre->rc;
	}
	e = calloc(1, sizeof(*e));
	if (e == NULL)
		return GPUCMD_ENOMEM;
	e->data = malloc(len ? len : 1);
	if (e->data == NULL) {
		free(e);
		return GPUCMD_ENOMEM;
	}
	/* memcpy from NULL is undefined even for 0 bytes (an empty load). */
	if (len > 0)
		memcpy(e->data, data, len);
	e->len = len;
	e->hash = h;
	e->fmt = fmt;
	if (pre != NULL && pre->done) {
		e->dm = pre->dm;
		pre->dm = NULL;
	} else {
		/*
		 * From the copy, not from data: bytes in a client's region
		 * may change under the daemon, and the cache must hold the
		 * code of the content it files it under.
		 */
		c->driver->error[0] = '\0';
		rc = c->driver->ops->module_load(c->driver, fmt, e->data, len,
						 &e->dm, log, log_len);
		if (rc != 0) {
			snprintf(err, err_len, "%s", c->driver->error);
			free(e->data);
			free(e);
			return rc;
		}
	}
	/* ...made only for a module that loaded. */
	if (c->count >= MODULE_CACHE_MAX)
		(void)evict_one(c, false);
	e->static_bytes = entry_static_bytes(c, e);
	/*
	 * Shared only when it surely has no globals: an image whose size
	 * could not be read (older fatbin compression, past the expansion
	 * budget) may have some, and stays its service's too.
	 */
	e->owner = e->static_bytes > 0 || !globals_known(e) ? owner : 0;
	e->refs = 1;
	e->last_use = ++c->tick;
	pthread_mutex_lock(&c->lock);
	e->next = c->entries;
	c->entries = e;
	pthread_mutex_unlock(&c->lock);
	c->loaded++;
	c->count++;
	*out = e;
	return 0;
}

const struct module_entry *module_cache_lookup(struct module_cache *c,
					       enum driver_module_format fmt,
					       const void *data, size_t len,
					       uint32_t owner)
{
	return find(c, content_hash(fmt, data, len), fmt, data, len, owner);
}

bool module_cache_compiles_shared(const struct module_cache *c)
{
	return c->driver->ops->module_load_shared != NULL;
}

bool module_cache_has(struct module_cache *c, enum driver_module_format fmt,
		      const void *data, size_t len, uint32_t owner)
{
	uint64_t h = content_hash(fmt, data, len);
	bool has;

	pthread_mutex_lock(&c->lock);
	has = find(c, h, fmt, data, len, owner) != NULL;
	pthread_mutex_unlock(&c->lock);
	return has;
}

void module_compile(struct module_cache *c, enum driver_module_format fmt,
		    const void *data, size_t len, struct module_compiled *out)
{
	out->log[0] = '\0';
	out->err[0] = '\0';
	out->dm = NULL;
	out->rc = c->driver->ops->module_load_shared(c->driver, fmt, data, len,
						     &out->dm, out->err,
						     sizeof(out->err), out->log,
						     sizeof(out->log));
	if (out->rc != 0)
		out->dm = NULL;
	out->done = true;
}

void module_compiled_release(struct module_cache *c, struct module_compiled *m)
{
	if (m->dm != NULL)
		c->driver->ops->module_unload(c->driver, m->dm);
	m->dm = NULL;
}

void module_cache_put(struct module_cache *c, struct module_entry *e)
{
	/*
	 * An entry nobody references stays compiled, for the next service
	 * that sends the same code; evict_one unloads it when room is
	 * needed (every launch of it has run by then: see module.h).  Its
	 * globals' memory then belongs to no service, so such entries keep
	 * at most MODULE_CACHE_IDLE_BYTES of it: past that the ones unused
	 * longest are unloaded now.
	 */
	if (--e->refs > 0)
		return;
	c->idle_bytes += e->static_bytes;
	/*
	 * One that takes more alone could never stay: it goes first, not
	 * after every smaller one used before it.
	 */
	if (e->static_bytes > MODULE_CACHE_IDLE_BYTES) {
		struct module_entry **pp = &c->entries;

		while (*pp != e)
			pp = &(*pp)->next;
		evict(c, pp);
		return;
	}
	while (c->idle_bytes > MODULE_CACHE_IDLE_BYTES && evict_one(c, true))
		;
}

void module_cache_hold(struct module_cache *c, struct module_entry *e)
{
	if (e->refs++ == 0)
		c->idle_bytes -= e->static_bytes;
}

uint64_t module_entry_static_bytes(const struct module_entry *e)
{
	return e->static_bytes;
}

uint64_t module_cache_idle_bytes(const struct module_cache *c)
{
	return c->idle_bytes;
}

int module_function(struct module_cache *c, struct module_entry *e,
		    const char *name, struct driver_function **out)
{
	struct module_fn *f;
	int rc;

	for (f = e->fns; f != NULL; f = f->next) {
		if (strcmp(f->name, name) == 0) {
			*out = f->fn;
			return 0;
		}
	}
	f = calloc(1, sizeof(*f));
	if (f == NULL)
		return GPUCMD_ENOMEM;
	f->name = strdup(name);
	if (f->name == NULL) {
		free(f);
		return GPUCMD_ENOMEM;
	}
	rc = c->driver->ops->module_function(c->driver, e->dm, name, &f->fn);
	if (rc != 0) {
		free(f->name);
		free(f);
		return rc;
	}
	f->next = e->fns;
	e->fns = f;
	*out = f->fn;
	return 0;
}

int module_format_parse(const char *s)
{
	if (strcmp(s, "ptx") == 0)
		return DRIVER_MODULE_PTX;
	if (strcmp(s, "cubin") == 0)
		return DRIVER_MODULE_CUBIN;
	if (strcmp(s, "fatbin") == 0)
		return DRIVER_MODULE_FATBIN;
	if (strcmp(s, "cuda") == 0)
		return DRIVER_MODULE_CUDA_C;
	return -1;
}

void module_cache_stats(const struct module_cache *c, uint64_t *loaded,
			uint64_t *hits, uint64_t *evicted)
{
	*loaded = c->loaded;
	*hits = c->hits;
	*evicted = c->evicted;
}

uint32_t module_cache_count(const struct module_cache *c)
{
	return c->count;
}
