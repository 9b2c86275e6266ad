/*
 * host_kernels.h - the built-in kernels of kernels/builtin.h as plain C
 * functions, for the host backend (driver/host.c).
 *
 * A host kernel gets the argument values the daemon decoded (one
 * union builtin_value per signature character; buffers are device addresses,
 * which on the host backend are host pointers) and runs to completion on the
 * calling thread, a host stream worker.  The launch geometry is not passed:
 * every built-in covers all of its elements whatever the geometry, so on a CPU
 * it only would set the parallelism, and one worker per stream is what keeps
 * the stream's order.
 *
 * The buffers have been checked against builtin_extent before the launch was
 * accepted; a kernel trusts them.
 */
#pragma once

#include "builtin.h"

/*
 * Run a kernel: 0, or GPUCMD_ESTREAM when the kernel faulted (the stream then
 * reports the fault at its next host callback).
 */
typedef int (*host_kernel_fn)(const union builtin_value *args);

/** The C implementation of the built-in named name, or NULL. */
host_kernel_fn host_kernel_find(const char *name);
