/*
 * pinned.c - see pinned.h.
 */
#include "memory/pinned.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "driver/driver.h"
#include "gpucmd.h"

struct pinned_pool {
	/*
	 * The device thread reserves; a reply written from its staging
	 * releases on the loop thread (executor.c's reply_pieces).
	 */
	pthread_mutex_t lock;
	struct driver *driver;
	struct memory_manager *mm;
	uint64_t budget;
	uint64_t held; /* bytes taken from the driver */
};

/*
 * The manager's storage: pinned allocations, refused past the budget (the
 * caller then takes the heap).  Sizes are remembered in a small header so
 * free can give the budget back.
 */
struct pinned_header {
	uint64_t size;
	uint64_t pad[31]; /* keeps the payload 256-byte aligned */
};

static int storage_alloc(void *ctx, uint64_t size, uint64_t *ptr)
{
	struct pinned_pool *p = ctx;
	struct driver *d = p->driver;
	struct pinned_header *h;
	void *mem;

	if (size > p->budget || p->held > p->budget - size)
		return GPUCMD_ENOMEM;
	if (d->ops->host_alloc(d, sizeof(*h) + size, &mem) != 0)
		return GPUCMD_ENOMEM;
	h = mem;
	h->size = size;
	p->held += size;
	*ptr = (uint64_t)(uintptr_t)(h + 1);
	return 0;
}

static void storage_free(void *ctx, uint64_t ptr, uint64_t size)
{
	(void)size; /* the header has it */
	struct pinned_pool *p = ctx;
	struct pinned_header *h = (struct pinned_header *)(uintptr_t)ptr - 1;

	p->held -= h->size;
	p->driver->ops->host_free(p->driver, h);
}

int pinned_pool_create(struct driver *d, uint64_t budget,
		       struct pinned_pool **out)
{
	struct pinned_pool *p = calloc(1, sizeof(*p));
	struct memory_configuration cfg = { .preset = MEMORY_PRESET_SUBSLICES };
	struct memory_device_properties props = {
		.max_page_size = budget / 4 ? budget / 4 : budget,
		.alignment = 256,
	};
	struct memory_storage storage = {
		.alloc = storage_alloc,
		.free = storage_free,
	};
	int rc;

	if (p == NULL)
		return GPUCMD_ENOMEM;
	p->driver = d;
	p->budget = budget;
	storage.ctx = p;
	rc = memory_manager_create(&cfg, &props, &storage, &p->mm);
	if (rc != 0) {
		free(p);
		return rc;
	}
	pthread_mutex_init(&p->lock, NULL);
	*out = p;
	return 0;
}

void pinned_pool_destroy(struct pinned_pool *p)
{
	if (p == NULL)
		return;
	memory_manager_destroy(p->mm);
	pthread_mutex_destroy(&p->lock);
	free(p);
}

int pinned_pool_reserve(struct pinned_pool *p, size_t size, void **ptr,
			struct memory_slice **slice)
{
	struct memory_alloc a;
	int rc;

	if (size > PINNED_MAX_REQUEST)
		return GPUCMD_ENOMEM;
	pthread_mutex_lock(&p->lock);
	rc = memory_manager_reserve(p->mm, size, &a);
	if (rc != 0) {
		/* Free pages may make room: one cleanup, one retry. */
		memory_manager_cleanup(p->mm, true);
		rc = memory_manager_reserve(p->mm, size, &a);
	}
	pthread_mutex_unlock(&p->lock);
	if (rc != 0)
		return GPUCMD_ENOMEM;
	*ptr = (void *)(uintptr_t)a.ptr;
	*slice = a.slice;
	return 0;
}

void pinned_pool_release(struct pinned_pool *p, struct memory_slice *slice)
{
	pthread_mutex_lock(&p->lock);
	memory_manager_release(p->mm, slice);
	pthread_mutex_unlock(&p->lock);
}

void pinned_pool_usage(struct pinned_pool *p, struct memory_usage *out)
{
	pthread_mutex_lock(&p->lock);
	memory_manager_usage(p->mm, out);
	pthread_mutex_unlock(&p->lock);
}
