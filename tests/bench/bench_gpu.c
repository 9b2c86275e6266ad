/*
 * bench_gpu.c - GPU floors: the daemon on the CUDA backend against the CUDA
 * driver API called straight from this process, on the same GPU, in the
 * same run.
 *
 * The other scenarios hold the daemon against what the socket and the CPU
 * allow.  On a GPU the floor that matters is what a program gets by calling
 * CUDA itself, so when the daemon runs on the CUDA backend two more
 * comparisons are made:
 *
 *   launch    the daemon's batches of 1024 spin(0), kept in flight exactly
 *             as the throughput scenario keeps them (bench_spin_batches),
 *             as wall time per op, against cuLaunchKernel of the same PTX
 *             kernel from this process: one context, one stream, 1024
 *             launches then one cuStreamSynchronize, repeated; the median
 *             time per launch.  Target: ratio <= 1.2.
 *   transfer  region writes {write_region S; sync} and reads {read_region
 *             S} as in the transfer scenario (bench_xfer_*), against
 *             cuMemcpyHtoDAsync / cuMemcpyDtoHAsync and cuStreamSynchronize
 *             from cuMemHostAlloc'd (pinned) memory of the same size, for
 *             1 MiB, 16 MiB and 256 MiB (64 MiB with --quick).  Target:
 *             ratio >= 0.9.
 *
 * libcuda.so.1 is opened with dlopen and its entry points looked up under
 * the versioned names cuda.h maps them to, as the daemon's CUDA backend
 * does (daemon/driver/cuda.c), so gpucmd-bench never links libcuda and runs
 * where there is no driver.  The kernel is the PTX that the build embeds in
 * the daemon (driver/kernels/builtin_ptx.h, the object cuda.mk generates,
 * linked here from libgpucmdd.a), not a copy of its source: spin(usec:u32),
 * one 32-bit argument.
 *
 * This process retains the device's primary context of its own, as any
 * second CUDA process would; the daemon keeps its own, and the two never
 * have work on the GPU at the same time, since each side is timed while the
 * other waits.
 *
 * When the daemon is not on CUDA, or this process cannot open the GPU (no
 * libcuda, no device), the scenario adds no rows and says why in one note:
 * that is not a failure of the run.  Built without cuda.h (CUDA=no) it is a
 * stub that says so.
 */
#include "bench.h"

#include <stdio.h>

#ifndef GPUCMD_HAVE_CUDA

void bench_gpu(void)
{
	bench_note("GPU floors skipped: this gpucmd-bench was built without "
		   "CUDA (CUDA=no or no cuda.h at build time)");
}

#else /* GPUCMD_HAVE_CUDA */

#include <cuda.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "driver/kernels/builtin_ptx.h"

/* CU_NAME(cuMemAlloc) is "cuMemAlloc_v2" with cuda.h's mapping. */
#define CU_STR(x) #x
#define CU_NAME(fn) CU_STR(fn)

/* Launches per cuStreamSynchronize, and ops per daemon batch. */
#define GPU_LAUNCHES 1024
#define GPU_RATIO_LAUNCH 1.2
#define GPU_RATIO_COPY 0.9

/* The entry points used; all of them exist since CUDA 11. */
#define GPU_FUNCTIONS(X)             \
	X(cuGetErrorName)            \
	X(cuInit)                    \
	X(cuDeviceGetCount)          \
	X(cuDeviceGet)               \
	X(cuDeviceGetName)           \
	X(cuDevicePrimaryCtxRetain)  \
	X(cuDevicePrimaryCtxRelease) \
	X(cuCtxSetCurrent)           \
	X(cuStreamCreate)            \
	X(cuStreamDestroy)           \
	X(cuStreamSynchronize)       \
	X(cuModuleLoadDataEx)        \
	X(cuModuleUnload)            \
	X(cuModuleGetFunction)       \
	X(cuLaunchKernel)            \
	X(cuMemAlloc)                \
	X(cuMemFree)                 \
	X(cuMemHostAlloc)            \
	X(cuMemFreeHost)             \
	X(cuMemcpyHtoDAsync)         \
	X(cuMemcpyDtoHAsync)

/* One pointer per entry point, typed by cuda.h's own prototype. */
#define GPU_API_FIELD(fn) __typeof__(fn) *fn;
struct gpu_api {
	GPU_FUNCTIONS(GPU_API_FIELD)
};

struct gpu {
	struct gpu_api cu;
	CUdevice dev;
	CUcontext ctx;	 /* the retained primary context, or NULL */
	CUstream stream; /* NULL until created */
	CUmodule module; /* the built-in PTX, NULL until loaded */
	CUfunction spin;
	char why[512]; /* what the last failed call said */
};

/* Call, and on failure keep "call: CUDA_ERROR_..." in g->why; 0 or -1. */
static int gpu_check(struct gpu *g, const char *call, CUresult r)
{
	const char *name = NULL;

	if (r == CUDA_SUCCESS)
		return 0;
	if (g->cu.cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
		name = "unknown error";
	snprintf(g->why, sizeof(g->why), "%s: %s (%d)", call, name, (int)r);
	return -1;
}

/* The message names the function as users know it (cuMemAlloc, not _v2). */
#define GPU_CHECK(g, fn, ...) gpu_check((g), #fn, (g)->cu.fn(__VA_ARGS__))

/* libcuda and every entry point; 0, or -1 with g->why. */
static int gpu_load(struct gpu *g)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	void *sym;

	if (lib == NULL) {
		const char *err = dlerror();

		snprintf(g->why, sizeof(g->why),
			 "cannot load libcuda.so.1 (%s)",
			 err ? err : "not found");
		return -1;
	}
#define GPU_API_LOAD(fn)                                                 \
	sym = dlsym(lib, CU_NAME(fn));                                   \
	if (sym == NULL) {                                               \
		snprintf(g->why, sizeof(g->why),                         \
			 "libcuda.so.1 has no %s: the NVIDIA driver is " \
			 "too old",                                      \
			 CU_NAME(fn));                                   \
		dlclose(lib);                                            \
		return -1;                                               \
	}                                                                \
	g->cu.fn = (__typeof__(g->cu.fn))sym;

	GPU_FUNCTIONS(GPU_API_LOAD)
#undef GPU_API_LOAD
	/* From cuInit on libcuda stays loaded: its threads run its code. */
	return 0;
}

/*
 * Open the device the daemon has, found by name: the protocol does not say
 * the daemon's device number, and on a machine of identical GPUs any one of
 * them is the same floor.  0, or -1 with g->why.
 */
static int gpu_open(struct gpu *g, const char *device_name)
{
	char name[256];
	int count = 0;

	if (gpu_load(g) != 0 || GPU_CHECK(g, cuInit, 0) != 0 ||
	    GPU_CHECK(g, cuDeviceGetCount, &count) != 0)
		return -1;
	for (int i = 0; i < count; i++) {
		if (GPU_CHECK(g, cuDeviceGet, &g->dev, i) != 0 ||
		    GPU_CHECK(g, cuDeviceGetName, name, (int)sizeof(name),
			      g->dev) != 0)
			return -1;
		if (strcmp(name, device_name) != 0)
			continue;
		if (GPU_CHECK(g, cuDevicePrimaryCtxRetain, &g->ctx, g->dev) !=
		    0) {
			g->ctx = NULL;
			return -1;
		}
		/* Non-blocking, like the daemon's streams (driver/cuda.c). */
		if (GPU_CHECK(g, cuCtxSetCurrent, g->ctx) != 0 ||
		    GPU_CHECK(g, cuStreamCreate, &g->stream,
			      CU_STREAM_NON_BLOCKING) != 0) {
			g->stream = NULL;
			return -1;
		}
		return 0;
	}
	snprintf(g->why, sizeof(g->why),
		 "none of the %d CUDA devices this process sees is the "
		 "daemon's \"%s\" (is CUDA_VISIBLE_DEVICES different?)",
		 count, device_name);
	return -1;
}

static void gpu_close(struct gpu *g)
{
	if (g->module != NULL)
		g->cu.cuModuleUnload(g->module);
	if (g->stream != NULL)
		g->cu.cuStreamDestroy(g->stream);
	if (g->ctx != NULL) {
		g->cu.cuCtxSetCurrent(NULL);
		g->cu.cuDevicePrimaryCtxRelease(g->dev);
	}
}

/* The built-in PTX as a module, and spin in it; 0, or -1 with g->why. */
static int gpu_load_spin(struct gpu *g)
{
	char jit_log[4096];
	CUjit_option opts[] = {
		CU_JIT_ERROR_LOG_BUFFER,
		CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
	};
	void *values[] = {
		jit_log,
		(void *)(uintptr_t)sizeof(jit_log),
	};
	size_t used;

	jit_log[0] = '\0';
	if (GPU_CHECK(g, cuModuleLoadDataEx, &g->module, gpucmd_builtin_ptx, 2,
		      opts, values) != 0) {
		g->module = NULL;
		/* The log's first line usually names the problem. */
		jit_log[sizeof(jit_log) - 1] = '\0';
		used = strlen(g->why);
		if (jit_log[0] != '\0')
			snprintf(g->why + used, sizeof(g->why) - used, ": %.*s",
				 (int)strcspn(jit_log, "\n"), jit_log);
		return -1;
	}
	return GPU_CHECK(g, cuModuleGetFunction, &g->spin, g->module, "spin");
}

/* One round: GPU_LAUNCHES spin(0), then wait for them; ns, or 0. */
static uint64_t gpu_launch_round(struct gpu *g)
{
	/* spin(usec:u32), grid 1, block 1: bench_add_spin0's launch. */
	uint32_t usec = 0;
	void *params[] = { &usec };
	uint64_t t0 = bench_now_ns();

	for (int i = 0; i < GPU_LAUNCHES; i++)
		if (GPU_CHECK(g, cuLaunchKernel, g->spin, 1, 1, 1, 1, 1, 1, 0,
			      g->stream, params, NULL) != 0)
			return 0;
	if (GPU_CHECK(g, cuStreamSynchronize, g->stream) != 0)
		return 0;
	return bench_now_ns() - t0;
}

static void gpu_launch(struct gpu *g, struct gpucmd_conn *c)
{
	/* A round is a few milliseconds: about as long as the daemon's run. */
	const size_t reps = bench.quick ? 100 : 600;
	struct bench_tp d = { 0 };
	struct gpucmd_batch *b;
	double *t, direct, daemon;
	uint64_t ns;

	if (gpucmd_builtin_ptx_len == 0) {
		bench_note("gpu: no launch row: this build embeds no PTX (no "
			   "nvcc at build time), so there is no spin kernel "
			   "for the daemon or the bench");
		return;
	}
	/* First, so that a PTX this driver refuses costs no daemon run. */
	if (gpu_load_spin(g) != 0) {
		bench_error("gpu: the built-in spin kernel did not load in "
			    "gpucmd-bench: %s",
			    g->why);
		return;
	}
	bench_progress("gpu: %d spin(0) through the daemon", GPU_LAUNCHES);
	/* Warm up: the daemon's stream exists and spin is loaded there. */
	if (gpucmd_batch_new(c, 0, &b) != 0)
		goto failed;
	for (int i = 0; i < 64; i++)
		if (bench_add_spin0(b) != 0) {
			gpucmd_batch_free(b);
			goto failed;
		}
	if (bench_run_ok(b, "gpu: warm-up spin(0)") != 0 ||
	    bench_spin_batches(c, GPU_LAUNCHES, BENCH_SPIN_X1024_DEPTH,
			       bench_spin_run_ns(), &d) != 0 ||
	    d.ops == 0)
		goto failed;
	daemon = (double)d.wall_ns / (double)d.ops / 1e3;

	bench_progress("gpu: %d spin(0) through cuLaunchKernel", GPU_LAUNCHES);
	t = calloc(reps, sizeof(*t));
	if (t == NULL) {
		bench_error("gpu: out of memory");
		return;
	}
	/* The first round pays for the JIT's code reaching the GPU. */
	ns = gpu_launch_round(g);
	for (size_t r = 0; ns != 0 && r < reps; r++) {
		ns = gpu_launch_round(g);
		t[r] = (double)ns / GPU_LAUNCHES / 1e3;
	}
	if (ns == 0) {
		bench_error("gpu: direct launches of spin failed: %s", g->why);
		free(t);
		return;
	}
	direct = bench_median(t, reps);
	free(t);
	bench_add("spin(0) x1024: launch vs cuLaunchKernel", daemon, "us",
		  direct, daemon / direct, TARGET_RATIO_LE, GPU_RATIO_LAUNCH);
	return;
failed:
	bench_error("gpu: batches of %d spin(0) through the daemon failed",
		    GPU_LAUNCHES);
}

static size_t gpu_reps(size_t len)
{
	if (len <= MIB)
		return bench.quick ? 20 : 100;
	if (len <= 16 * MIB)
		return bench.quick ? 10 : 30;
	return bench.quick ? 5 : 10;
}

/* Host and device memory for the cuMemcpy floor. */
struct gpu_copy {
	uint8_t *src; /* pinned, the bytes written */
	uint8_t *dst; /* pinned, the bytes read back */
	CUdeviceptr dev;
};

/* One copy each way checked, then reps of each timed; 0 or -1 (g->why). */
static int gpu_copy_seconds(struct gpu *g, struct gpu_copy *m, size_t len,
			    size_t reps, double *write_s, double *read_s)
{
	double *tw = calloc(reps, sizeof(double));
	double *tr = calloc(reps, sizeof(double));
	int rc = tw != NULL && tr != NULL ? 0 : -1;
	uint64_t t0;

	if (rc != 0)
		snprintf(g->why, sizeof(g->why), "out of memory");
	memset(m->dst, 0, len);
	if (rc == 0 && (GPU_CHECK(g, cuMemcpyHtoDAsync, m->dev, m->src, len,
				  g->stream) != 0 ||
			GPU_CHECK(g, cuMemcpyDtoHAsync, m->dst, m->dev, len,
				  g->stream) != 0 ||
			GPU_CHECK(g, cuStreamSynchronize, g->stream) != 0))
		rc = -1;
	if (rc == 0 && memcmp(m->dst, m->src, len) != 0) {
		snprintf(g->why, sizeof(g->why),
			 "%zu bytes read back with "
			 "cuMemcpy differ from what was written",
			 len);
		rc = -1;
	}
	for (size_t k = 0; rc == 0 && k < reps; k++) {
		t0 = bench_now_ns();
		if (GPU_CHECK(g, cuMemcpyHtoDAsync, m->dev, m->src, len,
			      g->stream) != 0 ||
		    GPU_CHECK(g, cuStreamSynchronize, g->stream) != 0) {
			rc = -1;
			break;
		}
		tw[k] = (double)(bench_now_ns() - t0) / 1e9;
		t0 = bench_now_ns();
		if (GPU_CHECK(g, cuMemcpyDtoHAsync, m->dst, m->dev, len,
			      g->stream) != 0 ||
		    GPU_CHECK(g, cuStreamSynchronize, g->stream) != 0) {
			rc = -1;
			break;
		}
		tr[k] = (double)(bench_now_ns() - t0) / 1e9;
	}
	if (rc == 0) {
		*write_s = bench_median(tw, reps);
		*read_s = bench_median(tr, reps);
	}
	free(tw);
	free(tr);
	return rc;
}

/* The daemon's region write and read, as bench_transfer times them. */
static int gpu_region_seconds(struct bench_xfer *x, size_t len, size_t reps,
			      double *write_s, double *read_s)
{
	double *tw = calloc(reps, sizeof(double));
	double *tr = calloc(reps, sizeof(double));
	int rc = tw != NULL && tr != NULL ? 0 : -1;
	uint64_t t0;

	memset(x->dst_region, 0, len);
	/* Correct first, and warm. */
	if (rc == 0)
		rc = bench_xfer_write(x, BENCH_XFER_REGION, NULL, len);
	if (rc == 0)
		rc = bench_xfer_read(x, BENCH_XFER_REGION, len, x->src_region);
	for (size_t k = 0; rc == 0 && k < reps; k++) {
		t0 = bench_now_ns();
		rc = bench_xfer_write(x, BENCH_XFER_REGION, NULL, len);
		tw[k] = (double)(bench_now_ns() - t0) / 1e9;
		t0 = bench_now_ns();
		if (rc == 0)
			rc = bench_xfer_read(x, BENCH_XFER_REGION, len, NULL);
		tr[k] = (double)(bench_now_ns() - t0) / 1e9;
	}
	if (rc == 0) {
		*write_s = bench_median(tw, reps);
		*read_s = bench_median(tr, reps);
	}
	free(tw);
	free(tr);
	return rc;
}

static void gpu_copy_row(const char *dir, size_t len, double secs, double floor)
{
	char name[64], sz[32];
	double gbs = (double)len / secs / 1e9;
	double fgbs = (double)len / floor / 1e9;

	bench_size_name(sz, sizeof(sz), len);
	snprintf(name, sizeof(name), "%s region %s vs cuMemcpy pinned", dir,
		 sz);
	bench_add(name, gbs, "GB/s", fgbs, gbs / fgbs, TARGET_RATIO_GE,
		  GPU_RATIO_COPY);
}

static void gpu_transfer(struct gpu *g, struct gpucmd_conn *c)
{
	const size_t sizes[] = { MIB, 16 * MIB,
				 bench.quick ? 64 * MIB : 256 * MIB };
	const size_t nsizes = sizeof(sizes) / sizeof(sizes[0]);
	const size_t max = sizes[nsizes - 1];
	struct bench_xfer x = { c, "gpu", NULL, NULL };
	struct gpu_copy m = { NULL, NULL, 0 };
	void *p;

	if (bench_xfer_setup(&x, max, max) != 0)
		return;
	if (GPU_CHECK(g, cuMemHostAlloc, &p, max, 0) != 0)
		goto failed;
	m.src = p;
	if (GPU_CHECK(g, cuMemHostAlloc, &p, max, 0) != 0)
		goto failed;
	m.dst = p;
	if (GPU_CHECK(g, cuMemAlloc, &m.dev, max) != 0) {
		m.dev = 0;
		goto failed;
	}
	/* The same bytes on both sides. */
	for (size_t i = 0; i < max; i++)
		x.src_region[i] = (uint8_t)(i * 2654435761u >> 13);
	memcpy(m.src, x.src_region, max);

	for (size_t i = 0; i < nsizes; i++) {
		size_t len = sizes[i], reps = gpu_reps(len);
		int errors = bench_errors;
		double dw, dr, fw, fr;

		bench_progress("gpu: region %zu bytes", len);
		if (gpu_region_seconds(&x, len, reps, &dw, &dr) != 0) {
			/* Said already, unless it was the batch itself. */
			if (bench_errors == errors)
				bench_error("gpu: region copies of %zu bytes "
					    "through the daemon failed",
					    len);
			break;
		}
		bench_progress("gpu: cuMemcpy %zu bytes", len);
		if (gpu_copy_seconds(g, &m, len, reps, &fw, &fr) != 0)
			goto failed;
		gpu_copy_row("write", len, dw, fw);
		gpu_copy_row("read", len, dr, fr);
	}
	goto out;
failed:
	bench_error("gpu: the cuMemcpy floor failed: %s", g->why);
out:
	if (m.dev != 0)
		g->cu.cuMemFree(m.dev);
	if (m.src != NULL)
		g->cu.cuMemFreeHost(m.src);
	if (m.dst != NULL)
		g->cu.cuMemFreeHost(m.dst);
}

void bench_gpu(void)
{
	struct gpucmd_conn *c = bench_connect("bench-gpu");
	const struct gpucmd_info *info;
	struct gpu g;

	if (c == NULL)
		return;
	info = gpucmd_info(c);
	if (strcmp(info->backend, "cuda") != 0) {
		bench_note("GPU floors skipped: the daemon runs on the %s "
			   "backend (gpucmd-bench --backend cuda measures "
			   "them)",
			   info->backend);
		gpucmd_close(c);
		return;
	}
	memset(&g, 0, sizeof(g));
	bench_progress("gpu: opening %s in gpucmd-bench", info->device_name);
	if (gpu_open(&g, info->device_name) != 0) {
		bench_note("GPU floors skipped: gpucmd-bench cannot use the "
			   "GPU itself: %s",
			   g.why);
		gpu_close(&g);
		gpucmd_close(c);
		return;
	}
	gpu_launch(&g, c);
	gpu_transfer(&g, c);
	bench_note("gpu rows: the daemon against the CUDA driver API called "
		   "by gpucmd-bench itself on the same %s: cuLaunchKernel of "
		   "the built-in spin PTX, %d launches per "
		   "cuStreamSynchronize (median us per launch); "
		   "cuMemcpyHtoDAsync/DtoHAsync from cuMemHostAlloc memory "
		   "(median GB/s)",
		   info->device_name, GPU_LAUNCHES);
	gpu_close(&g);
	/* Closing unmaps the regions and frees the daemon's buffer. */
	gpucmd_close(c);
}

#endif /* GPUCMD_HAVE_CUDA */
