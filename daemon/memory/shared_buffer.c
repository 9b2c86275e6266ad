/*
 * shared_buffer.c - see shared_buffer.h.
 */
#include "memory/shared_buffer.h"

#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"
#include "gpucmd.h"
#include "service.h"

int shared_buffer_name_check(const char *name)
{
	/* Service names' characters, and / and : to spell versions. */
	return name_check(name, SHARED_NAME_MAX, "/:");
}

struct shared_buffer *shared_buffer_find(const struct service *svc,
					 const char *name)
{
	/* One whose share failed goes once its copy ran; it has no name. */
	for (struct shared_buffer *sb = svc->shared; sb; sb = sb->next)
		if (sb->charged && strcmp(sb->name, name) == 0)
			return sb;
	return NULL;
}

uint64_t shared_buffer_reserved(const struct driver *d, uint64_t size)
{
	uint64_t align = d->props.alignment ? d->props.alignment : 256;

	/* A zero-byte buffer still has an address of its own. */
	if (size == 0)
		return align;
	if (size > UINT64_MAX - (align - 1))
		return 0;
	return (size + align - 1) / align * align;
}

int shared_buffer_create(struct driver *d, struct service *svc,
			 const char *name, uint64_t size,
			 struct shared_buffer **out)
{
	uint64_t reserved = shared_buffer_reserved(d, size);
	struct shared_buffer *sb;
	int rc;

	if (shared_buffer_find(svc, name) != NULL)
		return GPUCMD_EEXIST;
	if (svc->nshared >= SHARED_MAX_PER_SERVICE)
		return GPUCMD_ELIMIT;
	if (reserved == 0)
		return GPUCMD_ETOOBIG;
	sb = calloc(1, sizeof(*sb));
	if (sb == NULL)
		return GPUCMD_ENOMEM;
	rc = d->ops->mem_alloc(d, reserved, &sb->ptr);
	if (rc != 0) {
		free(sb);
		return rc;
	}
	memcpy(sb->name, name, strlen(name) + 1);
	sb->service = svc;
	sb->size = size;
	sb->reserved = reserved;
	sb->refs = 1;
	sb->state = SHARED_FILLING;
	sb->next = svc->shared;
	svc->shared = sb;
	svc->nshared++;
	svc->shared_bytes += size;
	svc->bytes_reserved += reserved;
	*out = sb;
	return 0;
}

void shared_buffer_get(struct shared_buffer *sb)
{
	sb->refs++;
}

void shared_buffer_put(struct driver *d, struct shared_buffer *sb)
{
	struct service *svc = sb->service;

	if (--sb->refs > 0)
		return;
	for (struct shared_buffer **pp = &svc->shared; *pp; pp = &(*pp)->next) {
		if (*pp == sb) {
			*pp = sb->next;
			break;
		}
	}
	d->ops->mem_free(d, sb->ptr);
	svc->nshared--;
	svc->shared_bytes -= sb->size;
	svc->bytes_reserved -= sb->reserved;
	if (sb->charged)
		service_uncharge(svc, sb->size);
	free(sb);
}
