/*
 * memory_fake_storage.h - a storage for the memory tests (check_pools.c,
 * check_memory_manager.c) that records every device allocation.
 *
 * By default addresses are invented by a bump counter, so an "80 GiB
 * device" costs nothing, with a gap after each allocation so a slice that
 * ran past its page would not land in the next one unnoticed.  With real
 * set, allocations are host memory a test can write to.  Tests assert on
 * what is outstanding (every allocation freed at destroy), can make alloc
 * fail, and can make it return misaligned addresses.
 */
#pragma once

#include <check.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "memory/memory_manager.h"

/*
 * A check for hot loops: Check's ck_assert records its location through
 * the runner on every call, which costs more than the code under test.
 */
#define expect(cond)                                                           \
	do {                                                                   \
		if (!(cond))                                                   \
			ck_abort_msg("%s:%d: expected %s", __FILE__, __LINE__, \
				     #cond);                                   \
	} while (0)

struct fake_alloc {
	uint64_t ptr;
	uint64_t size;
};

struct fake_storage {
	uint64_t alignment;
	uint64_t next; /* next invented address */
	bool real;     /* back allocations with host memory */
	bool fail;     /* refuse every alloc while set */
	bool misalign; /* hand out addresses off the alignment */
	struct fake_alloc *live;
	size_t nlive;
	size_t cap;
	uint64_t bytes;	 /* outstanding bytes */
	uint64_t allocs; /* successful allocs so far */
};

static inline int fake_storage_alloc(void *ctx, uint64_t size, uint64_t *ptr)
{
	struct fake_storage *fs = ctx;
	uint64_t rounded, p;
	void *mem;

	if (fs->fail)
		return GPUCMD_ENOMEM;
	expect(size > 0);
	rounded = (size + fs->alignment - 1) / fs->alignment * fs->alignment;
	if (fs->real) {
		mem = aligned_alloc(fs->alignment, rounded);
		expect(mem != NULL);
		p = (uint64_t)(uintptr_t)mem;
	} else {
		p = fs->next;
		fs->next += rounded + 16 * fs->alignment;
	}
	if (fs->misalign)
		p += 8;
	if (fs->nlive == fs->cap) {
		fs->cap = fs->cap ? 2 * fs->cap : 64;
		fs->live = realloc(fs->live, fs->cap * sizeof(*fs->live));
		expect(fs->live != NULL);
	}
	fs->live[fs->nlive++] = (struct fake_alloc){ p, size };
	fs->bytes += size;
	fs->allocs++;
	*ptr = p;
	return 0;
}

static inline void fake_storage_free(void *ctx, uint64_t ptr, uint64_t size)
{
	struct fake_storage *fs = ctx;
	size_t i;

	for (i = 0; i < fs->nlive; i++)
		if (fs->live[i].ptr == ptr)
			break;
	if (i == fs->nlive)
		ck_abort_msg("free of unknown device address %#llx",
			     (unsigned long long)ptr);
	ck_assert_msg(fs->live[i].size == size,
		      "free of %#llx with size %llu, allocated with %llu",
		      (unsigned long long)ptr, (unsigned long long)size,
		      (unsigned long long)fs->live[i].size);
	fs->bytes -= fs->live[i].size;
	if (fs->real)
		free((void *)(uintptr_t)(fs->misalign ? ptr - 8 : ptr));
	fs->live[i] = fs->live[--fs->nlive];
}

/* A storage over fs, which starts empty. */
static inline struct memory_storage
fake_storage_init(struct fake_storage *fs, uint64_t alignment, bool real)
{
	*fs = (struct fake_storage){
		.alignment = alignment,
		.next = UINT64_C(1) << 40,
		.real = real,
	};
	return (struct memory_storage){
		.alloc = fake_storage_alloc,
		.free = fake_storage_free,
		.ctx = fs,
	};
}

/* Drop the record; the test has checked what was outstanding. */
static inline void fake_storage_fini(struct fake_storage *fs)
{
	free(fs->live);
	fs->live = NULL;
	fs->nlive = 0;
}
