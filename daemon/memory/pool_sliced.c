/*
 * pool_sliced.c - pages carved first-fit into slices.
 *
 * A page is a chain of blocks in address order, each either a live slice or
 * free space; together they cover the page exactly.  The free blocks of a
 * page are also linked in a second list, in address order, so a reserve
 * looks only at free space and takes the lowest block that fits (first
 * fit, which keeps the low end of a page dense and the high end whole).
 * Adjacent free blocks are merged as soon as a slice is released, so no two
 * free blocks ever touch and a page with nothing live is a single block.
 * The reference merges lazily before each search instead; the layout that
 * results is the same, but merging on release keeps the search short.
 *
 * Costs with many live slices: a reserve skips a page in O(1) through
 * free_bound, an upper bound on its largest free block that becomes exact
 * whenever a search of the page fails; within a page it walks free blocks
 * only.  A release merges in O(1); a released block with no free neighbour
 * is linked into the free list by walking outwards both ways to the nearest
 * free block and along the free list at once (free_insert), which is short
 * unless the page has both many free blocks and long runs of live ones.
 *
 * Block structs are recycled through a per-pool list of spares, so a split
 * or a merge costs no trip to malloc; the spares go back to the C library
 * on an explicit cleanup.
 *
 * Pages go back to the storage on an explicit cleanup (a dealloc period
 * means nothing to this pool, as in the reference), or when the manager
 * trims pages that have held nothing for a while (pool_trim); a page with
 * a release the device may still be reading (pool_busy) waits for it.
 */
#include "memory/pool_sliced.h"

#include <stdlib.h>

struct sliced_page;

/* A live slice or a run of free space within one page. */
struct sliced_block {
	/* ptr and effective describe the range; size only while live. */
	struct memory_slice slice;
	struct sliced_page *page;
	/* Neighbours by address, then the page's free list by address. */
	struct sliced_block *prev, *next;
	struct sliced_block *free_prev, *free_next;
	bool free;
};

struct sliced_page {
	uint64_t base;
	/* Starts at base and stays there: merges keep the lower block. */
	struct sliced_block *first;
	struct sliced_block *free_head;
	uint64_t free_bound; /* no free block here is larger */
	uint64_t live;	     /* live slices in this page */
	uint64_t idle_since; /* the clock when live last became 0 */
	uint64_t busy_until; /* the largest release fence (pool_busy) */
};

struct sliced_pool {
	struct pool base;
	uint64_t page_size;
	uint64_t max_alloc;	    /* min(max_slice, page_size) */
	uint64_t max_pages;	    /* 0: no cap */
	struct sliced_page **pages; /* creation order, searched so */
	size_t npages;
	size_t pages_cap;
	struct sliced_block *spare; /* unused structs, linked by next */
};

static struct sliced_pool *to_sliced(struct pool *pool)
{
	return pool_container_of(pool, struct sliced_pool, base);
}

static const struct sliced_pool *to_sliced_const(const struct pool *pool)
{
	return pool_container_of(pool, const struct sliced_pool, base);
}

static struct sliced_block *to_block(struct memory_slice *slice)
{
	return pool_container_of(slice, struct sliced_block, slice);
}

/* Link b into page's free list between prev and next. */
static void free_link(struct sliced_page *page, struct sliced_block *prev,
		      struct sliced_block *next, struct sliced_block *b)
{
	b->free_prev = prev;
	b->free_next = next;
	if (prev)
		prev->free_next = b;
	else
		page->free_head = b;
	if (next)
		next->free_prev = b;
}

static void free_unlink(struct sliced_page *page, struct sliced_block *b)
{
	if (b->free_prev)
		b->free_prev->free_next = b->free_next;
	else
		page->free_head = b->free_next;
	if (b->free_next)
		b->free_next->free_prev = b->free_prev;
}

/*
 * Link a free block that has no free neighbour into the free list at its
 * address.  Two searches run in step: outwards through the neighbours to
 * the nearest free block, and along the free list from its low end to the
 * first free block above b.  Whichever ends first places b, so the cost is
 * the smaller of the distance to a free neighbour and the number of free
 * blocks below b: a page with one hole and a free tail, the shape of a
 * loop that takes and gives back the same sizes, costs one step.
 */
static void free_insert(struct sliced_page *page, struct sliced_block *b)
{
	struct sliced_block *l = b->prev;
	struct sliced_block *r = b->next;
	struct sliced_block *f = page->free_head, *last = NULL;

	for (;;) {
		if (!f) {
			free_link(page, last, NULL, b);
			return;
		}
		if (f->slice.ptr > b->slice.ptr) {
			free_link(page, f->free_prev, f, b);
			return;
		}
		last = f;
		f = f->free_next;
		if (l) {
			if (l->free) {
				free_link(page, l, l->free_next, b);
				return;
			}
			l = l->prev;
		}
		if (r) {
			if (r->free) {
				free_link(page, r->free_prev, r, b);
				return;
			}
			r = r->next;
		}
	}
}

/* A block struct from the spares, or a new one; NULL when memory is short. */
static struct sliced_block *block_get(struct sliced_pool *sp)
{
	struct sliced_block *b = sp->spare;

	if (b) {
		sp->spare = b->next;
		return b;
	}
	return malloc(sizeof(*b));
}

static void block_put(struct sliced_pool *sp, struct sliced_block *b)
{
	b->next = sp->spare;
	sp->spare = b;
}

/* Merge b's successor, a free block already off the free list, into b. */
static void block_merge_next(struct sliced_pool *sp, struct sliced_block *b)
{
	struct sliced_block *n = b->next;

	b->slice.effective += n->slice.effective;
	/* Free blocks keep the largest release fence of what they hold. */
	if (n->slice.busy_until > b->slice.busy_until)
		b->slice.busy_until = n->slice.busy_until;
	b->next = n->next;
	if (n->next)
		n->next->prev = b;
	block_put(sp, n);
}

/* The lowest free block of page that holds effective bytes. */
static struct sliced_block *page_first_fit(struct sliced_page *page,
					   uint64_t effective)
{
	struct sliced_block *b;
	uint64_t largest = 0;

	for (b = page->free_head; b; b = b->free_next) {
		if (b->slice.effective >= effective)
			return b;
		if (b->slice.effective > largest)
			largest = b->slice.effective;
	}
	/* Every free block was seen, so the bound is exact now. */
	page->free_bound = largest;
	return NULL;
}

static uint64_t page_largest_free(const struct sliced_page *page)
{
	const struct sliced_block *b;
	uint64_t largest = 0;

	for (b = page->free_head; b; b = b->free_next)
		if (b->slice.effective > largest)
			largest = b->slice.effective;
	return largest;
}

/* Hand out the start of free block b; the rest stays free in its place. */
static inline int sliced_carve(struct sliced_pool *sp, struct sliced_block *b,
			       uint64_t size, uint64_t effective,
			       struct memory_slice **out)
{
	struct sliced_page *page = b->page;
	struct sliced_block *rest;

	if (b->slice.effective > effective) {
		rest = block_get(sp);
		if (!rest)
			return GPUCMD_ENOMEM;
		rest->page = page;
		rest->free = true;
		rest->slice = (struct memory_slice){
			.pool = &sp->base,
			.ptr = b->slice.ptr + effective,
			.effective = b->slice.effective - effective,
			.busy_until = b->slice.busy_until,
		};
		rest->prev = b;
		rest->next = b->next;
		if (b->next)
			b->next->prev = rest;
		b->next = rest;
		free_link(page, b->free_prev, b->free_next, rest);
	} else {
		free_unlink(page, b);
	}
	b->free = false;
	page->live++;
	pool_slice_lend(&sp->base, &b->slice, size, effective);
	*out = &b->slice;
	return 0;
}

/* Allocate one more page, a single free block. */
static int sliced_add_page(struct sliced_pool *sp, struct sliced_page **out)
{
	struct sliced_page **pages, *page;
	struct sliced_block *b;
	uint64_t base;
	int rc;

	pages = pool_grow(sp->pages, &sp->pages_cap, sp->npages + 1,
			  sizeof(*pages));
	if (!pages)
		return GPUCMD_ENOMEM;
	sp->pages = pages;
	page = calloc(1, sizeof(*page));
	b = block_get(sp);
	if (!page || !b) {
		free(page);
		if (b)
			block_put(sp, b);
		return GPUCMD_ENOMEM;
	}
	rc = pool_device_alloc(&sp->base, sp->page_size, &base);
	if (rc < 0) {
		free(page);
		block_put(sp, b);
		return rc;
	}
	*b = (struct sliced_block){
		.slice = { .pool = &sp->base,
			   .ptr = base,
			   .effective = sp->page_size },
		.page = page,
		.free = true,
	};
	page->base = base;
	page->first = b;
	page->free_head = b;
	page->free_bound = sp->page_size;
	page->idle_since = pool_now(&sp->base);
	sp->pages[sp->npages++] = page;
	*out = page;
	return 0;
}

static uint64_t sliced_max_accept(const struct pool *pool)
{
	const struct sliced_pool *sp = to_sliced_const(pool);

	return sp->max_pages == 0 ? sp->page_size : sp->max_alloc;
}

static int sliced_reserve(struct pool *pool, uint64_t size,
			  struct memory_slice **out)
{
	struct sliced_pool *sp = to_sliced(pool);
	uint64_t effective = pool_effective(pool, size);
	struct sliced_page *page;
	struct sliced_block *b;
	size_t i;
	int rc;

	if (effective == 0 || effective > sp->page_size)
		return GPUCMD_ETOOBIG;
	for (i = 0; i < sp->npages; i++) {
		page = sp->pages[i];
		if (page->free_bound < effective)
			continue;
		b = page_first_fit(page, effective);
		if (b) {
			/*
			 * Reused busy memory is what this block held, not its
			 * page's: space never used beside a busy release is
			 * fresh (command_reserve's bound counts only reuse).
			 */
			pool_note_reuse(pool, b->slice.busy_until, effective);
			return sliced_carve(sp, b, size, effective, out);
		}
	}
	if (sp->max_pages != 0 && sp->npages >= sp->max_pages)
		return GPUCMD_ECAPACITY;
	rc = sliced_add_page(sp, &page);
	if (rc < 0)
		return rc;
	/* On failure the new page stays, free, until an explicit cleanup. */
	return sliced_carve(sp, page->first, size, effective, out);
}

static void sliced_release(struct pool *pool, struct memory_slice *slice)
{
	struct sliced_pool *sp = to_sliced(pool);
	struct sliced_block *b = to_block(slice);
	struct sliced_page *page = b->page;

	if (b->free)
		return;
	pool_slice_return(pool, slice);
	if (--page->live == 0)
		page->idle_since = pool_now(pool);
	if (slice->busy_until > page->busy_until)
		page->busy_until = slice->busy_until;
	b->free = true;
	if (b->prev && b->prev->free) {
		/* b is not on the free list; its predecessor absorbs it. */
		b = b->prev;
		block_merge_next(sp, b);
		if (b->next && b->next->free) {
			free_unlink(page, b->next);
			block_merge_next(sp, b);
		}
	} else if (b->next && b->next->free) {
		/* b takes its successor's place on the free list. */
		free_link(page, b->next->free_prev, b->next->free_next, b);
		block_merge_next(sp, b);
	} else {
		free_insert(page, b);
	}
	if (b->slice.effective > page->free_bound)
		page->free_bound = b->slice.effective;
}

static void sliced_free_page(struct sliced_pool *sp, struct sliced_page *page)
{
	struct sliced_block *b = page->first;
	struct sliced_block *next;

	pool_device_free(&sp->base, page->base, sp->page_size);
	for (; b; b = next) {
		next = b->next;
		block_put(sp, b);
	}
	free(page);
}

static void sliced_free_spares(struct sliced_pool *sp)
{
	struct sliced_block *b;

	while ((b = sp->spare) != NULL) {
		sp->spare = b->next;
		free(b);
	}
}

/*
 * Return the pages with nothing live that have been so since idle_since or
 * earlier and that the device is done with, until want bytes are returned, keeping the others in their
 * order; answers the bytes returned.
 */
static uint64_t sliced_free_idle(struct sliced_pool *sp, uint64_t idle_since,
				 uint64_t want)
{
	struct sliced_page *page;
	uint64_t freed = 0;
	size_t i, kept = 0;

	/* Merging on release leaves an unused page as one free block. */
	for (i = 0; i < sp->npages; i++) {
		page = sp->pages[i];
		if (freed < want && page->live == 0 &&
		    page->idle_since <= idle_since &&
		    !pool_busy(&sp->base, page->busy_until)) {
			sliced_free_page(sp, page);
			freed += sp->page_size;
		} else {
			sp->pages[kept++] = page;
		}
	}
	sp->npages = kept;
	return freed;
}

static void sliced_cleanup(struct pool *pool, bool explicit_call,
			   uint64_t clock)
{
	struct sliced_pool *sp = to_sliced(pool);

	if (!explicit_call)
		return;
	sliced_free_idle(sp, UINT64_MAX, UINT64_MAX);
	sliced_free_spares(sp);
}

static uint64_t sliced_trim(struct pool *pool, uint64_t idle_since,
			    uint64_t want)
{
	return sliced_free_idle(to_sliced(pool), idle_since, want);
}

static uint64_t sliced_largest_free(const struct pool *pool)
{
	const struct sliced_pool *sp = to_sliced_const(pool);
	uint64_t largest = 0, l;
	size_t i;

	for (i = 0; i < sp->npages; i++) {
		l = page_largest_free(sp->pages[i]);
		if (l > largest)
			largest = l;
	}
	return largest;
}

static uint64_t sliced_busy_idle(const struct pool *pool)
{
	const struct sliced_pool *sp = to_sliced_const(pool);
	uint64_t sum = 0;

	for (size_t i = 0; i < sp->npages; i++)
		if (sp->pages[i]->live == 0 &&
		    pool_busy(pool, sp->pages[i]->busy_until))
			sum += sp->page_size;
	return sum;
}

static void sliced_destroy(struct pool *pool)
{
	struct sliced_pool *sp = to_sliced(pool);
	size_t i;

	for (i = 0; i < sp->npages; i++)
		sliced_free_page(sp, sp->pages[i]);
	sliced_free_spares(sp);
	free(sp->pages);
	free(sp);
}

static const struct pool_ops sliced_ops = {
	.max_accept = sliced_max_accept,
	.reserve = sliced_reserve,
	.release = sliced_release,
	.cleanup = sliced_cleanup,
	.trim = sliced_trim,
	.largest_free = sliced_largest_free,
	.busy_idle = sliced_busy_idle,
	.destroy = sliced_destroy,
};

int pool_sliced_create(const struct memory_pool_options *opt,
		       const struct memory_storage *storage, uint64_t alignment,
		       struct pool **out)
{
	uint64_t max_slice = opt->max_slice ? opt->max_slice : opt->page_size;
	struct sliced_pool *sp;

	/* memory_configuration_resolve guarantees these; check, not trust. */
	if (!pool_is_pow2(alignment) || opt->page_size == 0 ||
	    (opt->page_size & (alignment - 1)) != 0 ||
	    max_slice > opt->page_size ||
	    (opt->max_pool_size != 0 && opt->max_pool_size < opt->page_size))
		return GPUCMD_EINVAL;
	sp = calloc(1, sizeof(*sp));
	if (!sp)
		return GPUCMD_ENOMEM;
	pool_init(&sp->base, &sliced_ops, MEMORY_POOL_SLICED, storage,
		  alignment);
	sp->base.stats.page_size = opt->page_size;
	sp->base.stats.max_slice = max_slice;
	sp->page_size = opt->page_size;
	sp->max_alloc = max_slice;
	sp->max_pages = opt->max_pool_size / opt->page_size;
	sp->base.stats.max_pool_size = sp->max_pages * opt->page_size;
	sp->base.accept_max = max_slice;
	/*
	 * An uncapped pool also takes a request that fills most of a page:
	 * the page is then nearly all used, and a later pool would spend a
	 * device allocation of about the same size on it anyway.
	 */
	if (sp->max_pages == 0) {
		sp->base.near_min = pool_little_waste_min(opt->page_size);
		sp->base.near_max = opt->page_size;
	}
	*out = &sp->base;
	return 0;
}
