/*
 * builtin_ptx.h - the built-in kernels (kernels/builtin.cu) as PTX text,
 * compiled by nvcc when gpucmdd is built and embedded in the binary by
 * driver/cuda.mk (generated into $(BUILD)/kernels/, never hand-edited).
 *
 * Only the CUDA backend (driver/cuda.c) reads it, once, the first time a
 * built-in is asked for; it is constant data that any thread may read.
 * A build that had cuda.h but no nvcc embeds an empty text instead, and the
 * CUDA backend then has no built-in kernels.
 */
#pragma once

#include <stddef.h>

/** PTX text of the built-in kernels, followed by a NUL. */
extern const char gpucmd_builtin_ptx[];
/** Its length in bytes without the NUL; 0 when built without nvcc. */
extern const size_t gpucmd_builtin_ptx_len;
