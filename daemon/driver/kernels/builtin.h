/*
 * builtin.h - the built-in kernels every backend provides, described once:
 * name, argument signature, and how many bytes of each buffer argument a
 * launch touches.  The daemon checks every launch of a built-in against this
 * table before it reaches a backend, so a kernel can never run past the end
 * of a buffer (on the host backend that would be the daemon's own memory).
 *
 * Every built-in covers all of its n elements whatever the launch geometry
 * (grid-stride loops); the geometry only sets the parallelism.
 *
 *   fill_u32(out buf, value:u32, count:u32)     buf[i] = value, i < count
 *   copy(out dst, src, bytes:u64)               dst[0..bytes) = src[0..bytes)
 *   add_f32(out o, a, b, n:u32)                 o[i] = a[i] + b[i]
 *   scale_f32(inout buf, factor:f32, n:u32)     buf[i] *= factor
 *   saxpy_f32(inout y, x, a:f32, n:u32)         y[i] = a * x[i] + y[i]
 *   reduce_sum_f32(out o, in, n:u32)            o[0] = sum of in[0..n)
 *   spin(usec:u32)                              busy for usec microseconds
 *   fault()                                     faults the stream (tests)
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Argument kinds, as signature characters. */
#define BUILTIN_ARG_BUF_OUT 'B'	/* buffer the kernel writes */
#define BUILTIN_ARG_BUF_IN 'b'	/* buffer the kernel only reads */
#define BUILTIN_ARG_U32 'u'
#define BUILTIN_ARG_I32 'i'
#define BUILTIN_ARG_U64 'U'
#define BUILTIN_ARG_F32 'f'

#define BUILTIN_MAX_ARGS 8
/* spin() refuses longer waits: one launch may not hold a stream for minutes. */
#define BUILTIN_SPIN_MAX_USEC 60000000u
/*
 * A tenant's (not an admin's) spin() is shorter: while it runs it holds
 * the SMs it was given (the stream worker's CPU on the host backend) from
 * every other service, and spin is how a service given the built-ins only
 * (max_modules = 0) could otherwise take the device for a minute a launch.
 */
#define BUILTIN_SPIN_TENANT_MAX_USEC 10000u

/* One argument value as the daemon decoded it. */
union builtin_value {
	uint64_t buf;	/* device address */
	uint32_t u32;
	int32_t i32;
	uint64_t u64;
	float f32;
};

struct builtin_kernel {
	const char *name;
	const char *signature;	/* one BUILTIN_ARG_* per argument */
	const char *usage;	/* e.g. "fill_u32(buf, value:u32, count:u32)" */
	/* The largest value of its first (u32) argument; 0: any. */
	uint32_t max_arg0;
	/* ... for a connection that is not an admin's; 0: max_arg0. */
	uint32_t tenant_max_arg0;
	/*
	 * It faults the stream on purpose (fault(), for tests).  Where a
	 * fault loses the device context (CUDA) that is every service's
	 * memory and the daemon itself, so only an admin may launch it there.
	 */
	bool faults;
};

/** The built-in named name, or NULL. */
const struct builtin_kernel *builtin_find(const char *name);
/** The whole table, NULL-terminated by a zero entry; *n gets its length. */
const struct builtin_kernel *builtin_all(size_t *n);
/**
 * Bytes of buffer argument index arg that a launch with these values reads
 * or writes (0 for a non-buffer argument).
 */
uint64_t builtin_extent(const struct builtin_kernel *k,
			const union builtin_value *args, size_t arg);
/** Bytes of one argument of signature kind c (8 for buffers and u64). */
size_t builtin_arg_size(char c);
/**
 * Check scalar values that are invalid whatever the buffers (spin too long):
 * 0, or GPUCMD_EINVAL with a sentence in msg.
 */
int builtin_check(const struct builtin_kernel *k,
		  const union builtin_value *args, char *msg, size_t msg_len);
