/*
 * check_cuda_api.c - daemon/driver/cuda_api.h against NVIDIA's cuda.h.
 *
 * The CUDA backend builds against its own declarations of the driver API
 * (cuda_api.h), so that gpucmd builds without the toolkit.  Where the
 * toolkit is installed (the Makefile builds this test only then), every
 * constant, handle type, callback type, prototype and the layout of
 * CUDA_MEMCPY2D is checked here at compile time, and the symbol each entry
 * point is looked up by when it runs.  A mismatch fails the build or the
 * test, never a GPU run.
 */
#include <cuda.h>

#include <check.h>
#include <stddef.h>
#include <string.h>

#define CUDA_API_VERIFY
#include "driver/cuda_api.h"
#include "unit.h"

#define SAME_VALUE(name, value)                      \
	_Static_assert((long long)(name) == (value), \
		       #name " is not " #value " in cuda.h");
CUDA_API_RESULTS(SAME_VALUE)
CUDA_API_DEVICE_ATTRIBUTES(SAME_VALUE)
CUDA_API_FUNCTION_ATTRIBUTES(SAME_VALUE)
CUDA_API_JIT_OPTIONS(SAME_VALUE)
CUDA_API_MEMORY_TYPES(SAME_VALUE)
CUDA_API_CAPTURE_MODES(SAME_VALUE)
CUDA_API_FLAGS(SAME_VALUE)

#define SAME_HANDLE(type, tag)                                           \
	_Static_assert(__builtin_types_compatible_p(type, struct tag *), \
		       #type " is not struct " #tag " * in cuda.h");
CUDA_API_HANDLES(SAME_HANDLE)

_Static_assert(__builtin_types_compatible_p(CUdeviceptr, unsigned long long),
	       "CUdeviceptr");
_Static_assert(__builtin_types_compatible_p(CUdevice, int), "CUdevice");
_Static_assert(sizeof(CUuuid) == 16 &&
		       __builtin_types_compatible_p(
			       __typeof__(((CUuuid *)0)->bytes), char[16]),
	       "CUuuid is 16 bytes");
_Static_assert(sizeof(CUresult) == sizeof(int) &&
		       sizeof(CUdevice_attribute) == sizeof(int) &&
		       sizeof(CUfunction_attribute) == sizeof(int) &&
		       sizeof(CUjit_option) == sizeof(int) &&
		       sizeof(CUmemorytype) == sizeof(int) &&
		       sizeof(CUstreamCaptureMode) == sizeof(int),
	       "cuda_api.h's enums are int-sized");
_Static_assert(__builtin_types_compatible_p(CUstreamCallback,
					    void (*)(CUstream, CUresult,
						     void *)),
	       "CUstreamCallback");
_Static_assert(__builtin_types_compatible_p(CUhostFn, void (*)(void *)),
	       "CUhostFn");

/* CUDA_MEMCPY2D as cuda_api.h lays it out, field by field. */
#define MIRROR_FIELD(type, name) type name;
struct memcpy2d_mirror {
	CUDA_API_MEMCPY2D_FIELDS(MIRROR_FIELD)
};
_Static_assert(sizeof(struct memcpy2d_mirror) == sizeof(CUDA_MEMCPY2D),
	       "CUDA_MEMCPY2D's size");
#define SAME_FIELD(type, name)                                               \
	_Static_assert(offsetof(struct memcpy2d_mirror, name) ==             \
				       offsetof(CUDA_MEMCPY2D, name) &&      \
			       __builtin_types_compatible_p(                 \
				       type, __typeof__(((CUDA_MEMCPY2D *)0) \
								->name)),    \
		       "CUDA_MEMCPY2D." #name);
CUDA_API_MEMCPY2D_FIELDS(SAME_FIELD)

#define SAME_PROTOTYPE(name, symbol, params)                          \
	_Static_assert(__builtin_types_compatible_p(__typeof__(name), \
						    CUresult params), \
		       #name "'s prototype differs from cuda.h's");
CUDA_API_ENTRY_POINTS(SAME_PROTOTYPE)

/* The symbol cuda.h maps a name to (after its macros). */
#define STR(x) #x
#define MAPPED(x) STR(x)

START_TEST(entry_points_are_looked_up_by_cuda_h_symbols)
{
	int n = 0;

#define SAME_SYMBOL(name, symbol, params)                          \
	ck_assert_msg(strcmp(MAPPED(name), #symbol) == 0,          \
		      "%s: cuda.h calls %s, cuda_api.h %s", #name, \
		      MAPPED(name), #symbol);                      \
	n++;
	CUDA_API_ENTRY_POINTS(SAME_SYMBOL)
#undef SAME_SYMBOL
	ck_assert_int_eq(n, 49);
}
END_TEST

static Suite *make_suite(void)
{
	Suite *s = suite_create("cuda_api");
	TCase *tc = tcase_create("symbols");

	tcase_add_test(tc, entry_points_are_looked_up_by_cuda_h_symbols);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return unit_main(make_suite());
}
