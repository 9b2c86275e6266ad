/*
 * builtin.cu - the built-in kernels of the CUDA backend (kernels/builtin.h
 * describes them once for both backends; host.c has the C twins).
 *
 * cuda.mk compiles this file to PTX for a low virtual architecture at build
 * time (nvcc -ptx), and the PTX is embedded in gpucmdd; the driver JIT
 * compiles it for whatever GPU the daemon opens, the first time a built-in
 * is asked for.  So this file must stay plain CUDA C++ without host code or
 * library calls: nothing but what PTX can say.
 *
 * Names are extern "C" so that cuModuleGetFunction finds them by the names
 * in builtin.h; argument order and types follow each signature there
 * (buffers are device addresses, i.e. pointers).
 *
 * Geometry: every kernel covers all of its elements whatever grid and block
 * the client chose, including 2D and 3D ones.  Each thread gets one linear
 * index over the whole launch and strides by the launch's thread count, so
 * no element is visited twice; that matters for the in-place kernels
 * (scale_f32, saxpy_f32), where a second visit would apply the update twice.
 */

/* The launch flattened: this thread's index and the number of threads. */
struct launch_index {
	unsigned long long first;
	unsigned long long stride;
};

static __device__ __forceinline__ unsigned int thread_in_block(void)
{
	return threadIdx.x +
	       blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

static __device__ __forceinline__ struct launch_index launch_index(void)
{
	/* 64-bit arithmetic: a large grid times a large block exceeds 2^32. */
	unsigned long long per_block =
		(unsigned long long)blockDim.x * blockDim.y * blockDim.z;
	unsigned long long block =
		blockIdx.x +
		(unsigned long long)gridDim.x *
			(blockIdx.y +
			 (unsigned long long)gridDim.y * blockIdx.z);
	unsigned long long blocks =
		(unsigned long long)gridDim.x * gridDim.y * gridDim.z;
	struct launch_index li;

	li.first = block * per_block + thread_in_block();
	li.stride = blocks * per_block;
	return li;
}

extern "C" __global__ void fill_u32(unsigned int *buf, unsigned int value,
				    unsigned int count)
{
	struct launch_index li = launch_index();

	for (unsigned long long i = li.first; i < count; i += li.stride)
		buf[i] = value;
}

extern "C" __global__ void copy(unsigned char *dst, const unsigned char *src,
				unsigned long long bytes)
{
	struct launch_index li = launch_index();
	unsigned long long done = 0;

	/*
	 * Buffers handed out by the pools are 512-byte aligned, so the common
	 * case moves 16 bytes per access; anything misaligned falls back to
	 * bytes, which is slow but correct.
	 */
	if ((((unsigned long long)dst | (unsigned long long)src) & 15) == 0) {
		unsigned long long words = bytes / 16;
		uint4 *d = (uint4 *)dst;
		const uint4 *s = (const uint4 *)src;

		for (unsigned long long i = li.first; i < words; i += li.stride)
			d[i] = s[i];
		done = words * 16;
	}
	for (unsigned long long i = done + li.first; i < bytes; i += li.stride)
		dst[i] = src[i];
}

extern "C" __global__ void add_f32(float *out, const float *a, const float *b,
				   unsigned int n)
{
	struct launch_index li = launch_index();

	for (unsigned long long i = li.first; i < n; i += li.stride)
		out[i] = a[i] + b[i];
}

extern "C" __global__ void scale_f32(float *buf, float factor, unsigned int n)
{
	struct launch_index li = launch_index();

	for (unsigned long long i = li.first; i < n; i += li.stride)
		buf[i] *= factor;
}

extern "C" __global__ void saxpy_f32(float *y, const float *x, float a,
				     unsigned int n)
{
	struct launch_index li = launch_index();

	/* Written as a multiply and an add, not fmaf: the host backend's C
	 * computes a * x + y with two roundings, and the two backends should
	 * give the same bits. */
	for (unsigned long long i = li.first; i < n; i += li.stride)
		y[i] = __fadd_rn(__fmul_rn(a, x[i]), y[i]);
}

/* Largest block the hardware allows; the tree below needs one slot each. */
#define REDUCE_MAX_THREADS 1024

extern "C" __global__ void reduce_sum_f32(float *out, const float *in,
					  unsigned int n)
{
	__shared__ double partial[REDUCE_MAX_THREADS];
	unsigned int t = thread_in_block();
	unsigned int threads = blockDim.x * blockDim.y * blockDim.z;
	double sum = 0.0;

	/*
	 * Only block 0 works.  One block summing in a fixed order gives the
	 * same bits on every run with the same geometry (atomics across blocks
	 * would not), and the sum is accumulated in double so that the result
	 * hardly depends on that order at all.  Other blocks leave at once,
	 * before any barrier, which is allowed because a barrier only counts
	 * the threads of its own block.
	 */
	if (blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0)
		return;

	for (unsigned long long i = t; i < n; i += threads)
		sum += (double)in[i];
	partial[t] = sum;
	__syncthreads();

	/* Tree over the block; threads need not be a power of two. */
	unsigned int width = 1;

	while (width < threads)
		width <<= 1;
	for (unsigned int half = width / 2; half > 0; half /= 2) {
		if (t < half && t + half < threads)
			partial[t] += partial[t + half];
		__syncthreads();
	}
	if (t == 0)
		out[0] = (float)partial[0];
}

static __device__ __forceinline__ unsigned long long global_ns(void)
{
	unsigned long long ns;

	/* %globaltimer is wall-clock nanoseconds, independent of the SM
	 * clock, which changes with load and power state. */
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
	return ns;
}

extern "C" __global__ void spin(unsigned int usec)
{
	unsigned long long start = global_ns();
	unsigned long long wait = (unsigned long long)usec * 1000;

	/*
	 * One thread per block is enough to hold the stream; the others leave
	 * so that a big block does not burn every lane for nothing.
	 */
	if (thread_in_block() != 0)
		return;
	while (global_ns() - start < wait)
		;
}

extern "C" __global__ void fault(void)
{
	/*
	 * A trap ends the launch with CUDA_ERROR_LAUNCH_FAILED: a real device
	 * fault that the compiler cannot remove, unlike a store through a bad
	 * pointer, which is undefined behaviour it may delete.  On CUDA such
	 * an error is sticky: the whole context is unusable afterwards.
	 */
	if (threadIdx.x == 0 && blockIdx.x == 0)
		__trap();
}
