/*
 * host_kernels.c - the built-in kernels (kernels/builtin.h) written as C loops
 * for the host backend.  Argument indexes follow the signatures of the
 * builtin table; see builtin.h for what each kernel does.
 */
#include "host_kernels.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include "gpucmd.h"

/* Spins at least this long sleep instead of burning a core. */
#define SPIN_SLEEP_MIN_USEC 1000u

/* A device address of the host backend is a host pointer. */
static void *host_ptr(uint64_t addr)
{
	return (void *)(uintptr_t)addr;
}

static int fill_u32(const union builtin_value *a)
{
	uint32_t *buf = host_ptr(a[0].buf);

	for (uint32_t i = 0; i < a[2].u32; i++)
		buf[i] = a[1].u32;
	return 0;
}

static int copy(const union builtin_value *a)
{
	/* memmove: nothing stops a client from copying within one buffer. */
	if (a[2].u64 != 0)
		memmove(host_ptr(a[0].buf), host_ptr(a[1].buf), a[2].u64);
	return 0;
}

static int add_f32(const union builtin_value *a)
{
	float *out = host_ptr(a[0].buf);
	const float *x = host_ptr(a[1].buf);
	const float *y = host_ptr(a[2].buf);

	for (uint32_t i = 0; i < a[3].u32; i++)
		out[i] = x[i] + y[i];
	return 0;
}

static int scale_f32(const union builtin_value *a)
{
	float *buf = host_ptr(a[0].buf);

	for (uint32_t i = 0; i < a[2].u32; i++)
		buf[i] *= a[1].f32;
	return 0;
}

static int saxpy_f32(const union builtin_value *a)
{
	float *y = host_ptr(a[0].buf);
	const float *x = host_ptr(a[1].buf);

	for (uint32_t i = 0; i < a[3].u32; i++)
		y[i] = a[2].f32 * x[i] + y[i];
	return 0;
}

static int reduce_sum_f32(const union builtin_value *a)
{
	const float *in = host_ptr(a[1].buf);
	/*
	 * A double accumulator: the GPU's tree reduction loses less than a
	 * running float sum would, and tests compare the two backends.
	 */
	double sum = 0;

	for (uint32_t i = 0; i < a[2].u32; i++)
		sum += in[i];
	*(float *)host_ptr(a[0].buf) = (float)sum;
	return 0;
}

static int spin(const union builtin_value *a)
{
	uint32_t usec = a[0].u32;
	struct timespec now, end;

	/* Batches of spin(0) measure the queue, not the clock. */
	if (usec == 0)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += usec / 1000000u;
	end.tv_nsec += (long)(usec % 1000000u) * 1000;
	if (end.tv_nsec >= 1000000000) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000;
	}
	/*
	 * Long spins sleep: the test machines have two cores, and a stream that
	 * "computes" must not starve the threads it is tested against.  Short
	 * ones, and whatever a signal cut short, busy-wait to stay exact.
	 */
	if (usec >= SPIN_SLEEP_MIN_USEC)
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &end,
				       NULL) == EINTR)
			;
	do
		clock_gettime(CLOCK_MONOTONIC, &now);
	while (now.tv_sec < end.tv_sec ||
	       (now.tv_sec == end.tv_sec && now.tv_nsec < end.tv_nsec));
	return 0;
}

static int fault(const union builtin_value *a)
{
	return GPUCMD_ESTREAM;
}

static const struct {
	const char *name;
	host_kernel_fn fn;
} host_kernels[] = {
	{ "fill_u32", fill_u32 },
	{ "copy", copy },
	{ "add_f32", add_f32 },
	{ "scale_f32", scale_f32 },
	{ "saxpy_f32", saxpy_f32 },
	{ "reduce_sum_f32", reduce_sum_f32 },
	{ "spin", spin },
	{ "fault", fault },
};

host_kernel_fn host_kernel_find(const char *name)
{
	for (size_t i = 0; i < sizeof(host_kernels) / sizeof(host_kernels[0]);
	     i++)
		if (strcmp(host_kernels[i].name, name) == 0)
			return host_kernels[i].fn;
	return NULL;
}
