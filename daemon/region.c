/*
 * region.c - see region.h.
 */
#include "region.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <linux/magic.h>

#include "driver/driver.h"
#include "gpucmd.h"
#include "log.h"
#include "service.h"

static uint32_t count(const struct region *r)
{
	uint32_t n = 0;

	for (; r != NULL; r = r->next)
		n++;
	return n;
}

static void unmap(struct driver *d, struct region *r)
{
	if (r->registered)
		d->ops->host_unregister(d, r->base);
	if (r->base != NULL && r->size > 0 && munmap(r->base, r->size) != 0)
		log_err("region %llu: munmap of %llu bytes failed: %s; the "
			"mapping stays",
			(unsigned long long)r->id, (unsigned long long)r->size,
			strerror(errno));
	if (r->fd >= 0)
		close(r->fd);
	free(r);
}

/* Unmap a region that was attached: its bytes go back to the service. */
static void unmap_attached(struct stream_set *set, struct region *r)
{
	service_region_uncharge(set->service, r->size);
	unmap(set->driver, r);
}

/* Regions of this connection released but still mapped (their fences). */
static void released_pending(const struct stream_set *set, uint32_t *n,
			     uint64_t *bytes)
{
	*n = 0;
	*bytes = 0;
	for (const struct region *r = set->released_regions; r != NULL;
	     r = r->next) {
		(*n)++;
		*bytes += r->size;
	}
}

/* The sentence of an attach over the service's region_limit. */
static void describe_quota(const struct stream_set *set, uint64_t id,
			   uint64_t size, char *msg, size_t msg_len)
{
	const struct service *svc = set->service;
	uint64_t limit = atomic_load(&svc->region_limit);
	uint64_t after = svc->region_bytes + size;
	uint64_t pending_bytes;
	uint32_t pending;
	char waiting[160] = "";

	if (after < svc->region_bytes)
		after = UINT64_MAX;
	released_pending(set, &pending, &pending_bytes);
	if (pending > 0)
		snprintf(waiting, sizeof(waiting),
			 "; %u of them, %llu bytes, "
			 "released by this connection and unmapped once its "
			 "work in flight is done",
			 pending, (unsigned long long)pending_bytes);
	snprintf(msg, msg_len,
		 "region %llu of %llu bytes would take service "
		 "'%s' to %llu bytes of shared regions, over its region_limit "
		 "of %llu (%u region%s of %llu bytes attached%s): release a "
		 "region or raise region_limit",
		 (unsigned long long)id, (unsigned long long)size, svc->name,
		 (unsigned long long)after, (unsigned long long)limit,
		 svc->regions, svc->regions == 1 ? "" : "s",
		 (unsigned long long)svc->region_bytes, waiting);
}

int region_attach(struct stream_set *set, uint64_t id, int fd, uint64_t size,
		  char *msg, size_t msg_len)
{
	struct driver *d = set->driver;
	struct region *r;
	struct stat st = { 0 };
	struct statfs sfs = { 0 };
	int seals;

	if (id == 0 || region_find(set, id) != NULL) {
		snprintf(msg, msg_len,
			 "region id %llu is %s: choose another "
			 "non-zero id",
			 (unsigned long long)id,
			 id ? "already attached" : "invalid");
		close(fd);
		return id ? GPUCMD_EEXIST : GPUCMD_EINVAL;
	}
	/*
	 * Released regions stay mapped until the work queued with them is
	 * done, so they count too: without that, a client could keep the
	 * daemon's mappings growing behind one long kernel.
	 */
	if (count(set->regions) + count(set->released_regions) >=
	    REGION_MAX_PER_CONNECTION)
		region_flush(set);
	if (count(set->regions) + count(set->released_regions) >=
	    REGION_MAX_PER_CONNECTION) {
		snprintf(msg, msg_len,
			 "this connection already has %u "
			 "regions attached and %u released but still used "
			 "by work in flight, %d together at most: release "
			 "one, or sync the streams before attaching more",
			 count(set->regions), count(set->released_regions),
			 REGION_MAX_PER_CONNECTION);
		close(fd);
		return GPUCMD_ELIMIT;
	}
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
		snprintf(msg, msg_len,
			 "region %llu: the descriptor is %s: "
			 "pass a memfd created with MFD_ALLOW_SEALING and "
			 "sealed with F_SEAL_SHRINK",
			 (unsigned long long)id,
			 seals < 0 ? "not a sealable memfd" :
				     "not sealed against shrinking");
		close(fd);
		return GPUCMD_EINVAL;
	}
	/*
	 * Only shmem.  A hugetlb memfd is sealable too, but F_SEAL_SHRINK
	 * does not stop its owner punching a hole, and the daemon's next
	 * copy faulting there with no free huge page would be a SIGBUS for
	 * every service; its mapping is also rounded up to the huge page,
	 * past the bytes the quota counts.
	 */
	if (fstatfs(fd, &sfs) != 0 || sfs.f_type != TMPFS_MAGIC) {
		snprintf(msg, msg_len,
			 "region %llu: the descriptor is not a "
			 "plain memfd (%s): create it with memfd_create "
			 "without MFD_HUGETLB",
			 (unsigned long long)id,
			 sfs.f_type == HUGETLBFS_MAGIC ? "hugetlb" :
							 "another file system");
		close(fd);
		return GPUCMD_EINVAL;
	}
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < size || size == 0 ||
	    size > SIZE_MAX / 2) {
		snprintf(msg, msg_len,
			 "region %llu: the memfd holds %lld "
			 "bytes, the attach announced %llu (must be non-zero "
			 "and no more than the file)",
			 (unsigned long long)id, (long long)st.st_size,
			 (unsigned long long)size);
		close(fd);
		return GPUCMD_EINVAL;
	}
	/* The service's budget of shared regions, before anything is mapped. */
	if (service_region_check(set->service, size) != 0) {
		set->service->region_refusals++;
		describe_quota(set, id, size, msg, msg_len);
		close(fd);
		return GPUCMD_EQUOTA;
	}
	r = calloc(1, sizeof(*r));
	if (r == NULL) {
		snprintf(msg, msg_len, "region %llu: out of host memory",
			 (unsigned long long)id);
		close(fd);
		return GPUCMD_ENOMEM;
	}
	r->id = id;
	r->fd = fd;
	r->size = size;
	r->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (r->base == MAP_FAILED) {
		/* A write-sealed or read-only memfd is the client's doing. */
		int err = errno;
		bool refused = err == EPERM || err == EACCES;

		snprintf(msg, msg_len,
			 "region %llu: the daemon cannot map %llu bytes: "
			 "%s%s",
			 (unsigned long long)id, (unsigned long long)size,
			 strerror(err),
			 refused ? " (send a memfd open for writing, not "
				   "sealed against writes)" :
				   " (the daemon's address space or its count "
				   "of mappings is spent, not the device: "
				   "attach a smaller region or release "
				   "others; an operator may raise the unit's "
				   "LimitAS= or vm.max_map_count)");
		r->base = NULL;
		unmap(d, r);
		return refused ? GPUCMD_EINVAL : GPUCMD_ENOMEM;
	}
	/* The mapping holds the memfd: the descriptor is not needed. */
	close(r->fd);
	r->fd = -1;
	/*
	 * Pinned, a copy is one DMA.  Where a copy into memory that is not
	 * pinned holds the device thread until the stream's queued work is
	 * done (driver_properties.pageable_copies_block: CUDA), a region
	 * that cannot be pinned is refused rather than used.
	 */
	d->error[0] = '\0';
	r->registered = d->ops->host_register(d, r->base, size) == 0;
	if (!r->registered && d->props.pageable_copies_block) {
		snprintf(msg, msg_len,
			 "region %llu: the driver cannot pin "
			 "its %llu bytes (%s): attach a smaller region",
			 (unsigned long long)id, (unsigned long long)size,
			 d->error[0] ? d->error : "no reason given");
		unmap(d, r);
		return GPUCMD_ENOMEM;
	}
	r->next = set->regions;
	set->regions = r;
	service_region_charge(set->service, size);
	return 0;
}

struct region *region_find(struct stream_set *set, uint64_t id)
{
	struct region *r;

	for (r = set->regions; r != NULL; r = r->next)
		if (r->id == id)
			return r;
	return NULL;
}

int region_check(const struct region *r, uint64_t offset, uint64_t length,
		 char *msg, size_t msg_len)
{
	uint64_t end;

	if (__builtin_add_overflow(offset, length, &end) || end > r->size) {
		snprintf(msg, msg_len,
			 "region %llu range out of bounds: %llu "
			 "bytes at offset %llu, the region has %llu",
			 (unsigned long long)r->id, (unsigned long long)length,
			 (unsigned long long)offset,
			 (unsigned long long)r->size);
		return GPUCMD_EINVAL;
	}
	return 0;
}

void region_note_use(struct region *r, const struct stream *s)
{
	uint64_t seq = stream_next_fence(s);

	for (uint32_t i = 0; i < r->nfences; i++) {
		if (r->fences[i].stream == s) {
			r->fences[i].seq = seq;
			return;
		}
	}
	r->fences[r->nfences].stream = s;
	r->fences[r->nfences].seq = seq;
	r->nfences++;
}

int region_release(struct stream_set *set, struct stream *current, uint64_t id)
{
	struct region **pp, *r;

	(void)current;
	for (pp = &set->regions; *pp != NULL; pp = &(*pp)->next)
		if ((*pp)->id == id)
			break;
	r = *pp;
	if (r == NULL)
		return GPUCMD_ENOTFOUND;
	*pp = r->next;
	/* Nothing still to run uses it: the room comes back now. */
	if (streams_fences_passed(r->fences, r->nfences)) {
		unmap_attached(set, r);
		return 0;
	}
	r->next = set->released_regions;
	set->released_regions = r;
	return 0;
}

void region_flush(struct stream_set *set)
{
	struct region **pp = &set->released_regions;

	while (*pp != NULL) {
		struct region *r = *pp;

		if (!streams_fences_passed(r->fences, r->nfences)) {
			pp = &r->next;
			continue;
		}
		*pp = r->next;
		unmap_attached(set, r);
	}
}

void region_teardown(struct stream_set *set)
{
	struct region *lists[2] = { set->regions, set->released_regions };

	for (int l = 0; l < 2; l++) {
		while (lists[l] != NULL) {
			struct region *r = lists[l];
			lists[l] = r->next;
			unmap_attached(set, r);
		}
	}
	set->regions = NULL;
	set->released_regions = NULL;
}
