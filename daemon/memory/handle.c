/*
 * handle.c - an open-addressing hash table from client handle ids to
 * struct handle.  Linear probing with backward-shift deletion keeps lookups
 * short without tombstones; the table doubles at 50% load.
 */
#include "memory/handle.h"

#include <stdlib.h>

#include "gpucmd.h"

struct handle_table {
	struct handle **slots;
	uint32_t cap; /* power of two */
	uint32_t count;
	uint32_t max;
};

static uint32_t hash_id(uint64_t id)
{
	/* splitmix64 finaliser: client ids are often small and sequential. */
	id ^= id >> 30;
	id *= 0xbf58476d1ce4e5b9ull;
	id ^= id >> 27;
	id *= 0x94d049bb133111ebull;
	id ^= id >> 31;
	return (uint32_t)id;
}

int handle_table_create(uint32_t max, struct handle_table **out)
{
	struct handle_table *t = calloc(1, sizeof(*t));

	if (t == NULL)
		return GPUCMD_ENOMEM;
	t->cap = 64;
	t->max = max;
	t->slots = calloc(t->cap, sizeof(*t->slots));
	if (t->slots == NULL) {
		free(t);
		return GPUCMD_ENOMEM;
	}
	*out = t;
	return 0;
}

void handle_table_destroy(struct handle_table *t)
{
	if (t == NULL)
		return;
	free(t->slots);
	free(t);
}

static uint32_t probe(const struct handle_table *t, uint64_t id)
{
	uint32_t mask = t->cap - 1;
	uint32_t i = hash_id(id) & mask;

	while (t->slots[i] != NULL && t->slots[i]->id != id)
		i = (i + 1) & mask;
	return i;
}

static int grow(struct handle_table *t)
{
	struct handle **old = t->slots;
	uint32_t old_cap = t->cap;

	t->slots = calloc((size_t)old_cap * 2, sizeof(*t->slots));
	if (t->slots == NULL) {
		t->slots = old;
		return GPUCMD_ENOMEM;
	}
	t->cap = old_cap * 2;
	for (uint32_t i = 0; i < old_cap; i++)
		if (old[i] != NULL)
			t->slots[probe(t, old[i]->id)] = old[i];
	free(old);
	return 0;
}

int handle_table_insert(struct handle_table *t, struct handle *h)
{
	uint32_t i;

	if (h->id == 0)
		return GPUCMD_EINVAL;
	if (t->slots[probe(t, h->id)] != NULL)
		return GPUCMD_EEXIST;
	if (t->count >= t->max)
		return GPUCMD_ELIMIT;
	if ((t->count + 1) * 2 > t->cap && grow(t) != 0)
		return GPUCMD_ENOMEM;
	i = probe(t, h->id);
	t->slots[i] = h;
	t->count++;
	return 0;
}

struct handle *handle_table_find(const struct handle_table *t, uint64_t id)
{
	if (id == 0)
		return NULL;
	return t->slots[probe(t, id)];
}

/* Remove the entry at slot i, shifting later members of its run back. */
static void remove_at(struct handle_table *t, uint32_t i)
{
	uint32_t mask = t->cap - 1;
	uint32_t j = i;

	t->slots[i] = NULL;
	for (;;) {
		uint32_t home;

		j = (j + 1) & mask;
		if (t->slots[j] == NULL)
			break;
		home = hash_id(t->slots[j]->id) & mask;
		/* Move j back to i unless its home lies cyclically in (i, j]. */
		if ((j > i && (home <= i || home > j)) ||
		    (j < i && (home <= i && home > j))) {
			t->slots[i] = t->slots[j];
			t->slots[j] = NULL;
			i = j;
		}
	}
	t->count--;
}

struct handle *handle_table_remove(struct handle_table *t, uint64_t id)
{
	uint32_t i;
	struct handle *h;

	if (id == 0)
		return NULL;
	i = probe(t, id);
	h = t->slots[i];
	if (h != NULL)
		remove_at(t, i);
	return h;
}

void handle_table_drain(struct handle_table *t,
			void (*fn)(struct handle *h, void *arg), void *arg)
{
	for (uint32_t i = 0; i < t->cap; i++) {
		struct handle *h = t->slots[i];
		if (h != NULL) {
			t->slots[i] = NULL;
			fn(h, arg);
		}
	}
	t->count = 0;
}

uint32_t handle_table_count(const struct handle_table *t)
{
	return t->count;
}

uint32_t handle_table_max(const struct handle_table *t)
{
	return t->max;
}

struct handle *handle_new(uint64_t id, struct stream *owner,
			  const struct memory_alloc *alloc)
{
	struct handle *h = calloc(1, sizeof(*h));

	if (h == NULL)
		return NULL;
	h->id = id;
	h->owner = owner;
	h->alloc = *alloc;
	h->writer_slot = -1;
	return h;
}

void handle_free(struct handle *h)
{
	if (h == NULL)
		return;
	free(h->readers);
	free(h);
}
