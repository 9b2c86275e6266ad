/*
 * cuda.c - the CUDA backend: driver.h's operations on the CUDA driver API.
 *
 * Loading.  libcuda.so.1 is opened with dlopen and every entry point is
 * looked up with dlsym, so one gpucmdd binary runs on machines with and
 * without a GPU (it never links libcuda).  Types and prototypes come from
 * cuda_api.h (below); each entry point is looked up under the versioned name
 * that cuda.h maps it to (cuMemAlloc -> cuMemAlloc_v2), so calling through
 * the pointer means exactly what calling the function would.  NVRTC
 * (CUDA C modules) is opened the same way, on first use.
 *
 * Context and threads.  The daemon uses the device's primary context.  open
 * retains it and makes it current on the calling thread, and every other
 * call relies on it being current there: open, and everything after it,
 * must run on the device thread (driver.h says the same).  Completion
 * callbacks run on CUDA's own callback thread and touch nothing here but
 * the small record they were given.
 *
 * Faults.  On CUDA a device fault (illegal address, trap, assert, ...) is
 * sticky: it poisons the whole context, every stream of every service, and
 * every later call returns the same error until the context is reset, which
 * frees all device memory.  So driver.h's promise that "the fault is then
 * cleared and the stream keeps running later work" cannot be kept here;
 * such errors map to GPUCMD_ESTREAM and their message says that the context
 * is lost.
 *
 * Built-in kernels.  kernels/builtin.cu is compiled to PTX by nvcc at build
 * time and embedded (cuda.mk, kernels/builtin_ptx.h); open loads it as a
 * module, which JIT compiles it for this GPU before the daemon serves, so
 * that no service waits for the compile behind a first launch (a load that
 * failed for memory is tried again at the first builtin_function).
 *
 * The driver API comes from cuda_api.h, the daemon's own declarations of
 * the calls it makes (checked against NVIDIA's cuda.h by check_cuda_api
 * wherever the toolkit is installed), so the backend builds without the
 * toolkit.  Without GPUCMD_HAVE_CUDA (make CUDA=no) this file only provides
 * a driver_cuda_create that says so.
 */
#include "driver.h"

#include <stdio.h>

#include "gpucmd.h"

#ifndef GPUCMD_HAVE_CUDA

int driver_cuda_create(struct driver_options *opt, struct driver **out,
		       char *why, size_t why_len)
{
	(void)opt;
	(void)out;
	if (why && why_len)
		snprintf(why, why_len, "%s",
			 "this gpucmdd was built without the CUDA backend "
			 "(make CUDA=no)");
	return GPUCMD_EUNSUPPORTED;
}

#else /* GPUCMD_HAVE_CUDA */

#include "cuda_api.h"
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels/builtin.h"
#include "kernels/builtin_ptx.h"
#include "log.h"
#include "module_image.h"

_Static_assert(sizeof(CUdeviceptr) == sizeof(uint64_t),
	       "device addresses travel as uint64_t");

/* Turns a macro's expansion into a string: CU_NAME(cuMemAlloc) is
 * "cuMemAlloc_v2" with cuda.h's mapping. */
#define CU_STR(x) #x
#define CU_NAME(fn) CU_STR(fn)

/*
 * The entry points used: X(function as cuda.h names it, older name to try
 * when the versioned one is missing (same signature), required).
 *
 * cuEventElapsedTime_v2 only exists in drivers from CUDA 12.8 on; the
 * original has the same signature.  cuStreamAddCallback is the completion
 * mechanism (see cuda_host_callback) and cuLaunchHostFunc its stand-in for a
 * future driver that drops it; one of the two must exist.
 * cuFuncGetParamInfo (CUDA 12.4 drivers on) lets launch check a client's
 * arguments against the kernel's parameters (cuda_function_params); older
 * drivers lack it, and the module image's declarations stand in.
 */
#define CUDA_FUNCTIONS(X)                                 \
	X(cuGetErrorName, NULL, true)                     \
	X(cuGetErrorString, NULL, true)                   \
	X(cuInit, NULL, true)                             \
	X(cuDeviceGetCount, NULL, true)                   \
	X(cuDeviceGet, NULL, true)                        \
	X(cuDeviceGetName, NULL, true)                    \
	X(cuDeviceGetUuid, NULL, false)                   \
	X(cuDeviceGetPCIBusId, NULL, false)               \
	X(cuDeviceGetByPCIBusId, NULL, false)             \
	X(cuDeviceGetAttribute, NULL, true)               \
	X(cuDeviceTotalMem, NULL, true)                   \
	X(cuDevicePrimaryCtxRetain, NULL, true)           \
	X(cuDevicePrimaryCtxRelease, NULL, true)          \
	X(cuCtxSetCurrent, NULL, true)                    \
	X(cuCtxSynchronize, NULL, true)                   \
	X(cuMemGetInfo, NULL, true)                       \
	X(cuMemAlloc, NULL, true)                         \
	X(cuMemFree, NULL, true)                          \
	X(cuMemHostAlloc, NULL, true)                     \
	X(cuMemFreeHost, NULL, true)                      \
	X(cuMemHostRegister, NULL, true)                  \
	X(cuMemHostUnregister, NULL, true)                \
	X(cuMemcpyHtoDAsync, NULL, true)                  \
	X(cuMemcpyDtoHAsync, NULL, true)                  \
	X(cuMemcpyDtoDAsync, NULL, true)                  \
	X(cuMemcpy2DAsync, NULL, true)                    \
	X(cuMemsetD8Async, NULL, true)                    \
	X(cuStreamCreate, NULL, true)                     \
	X(cuStreamDestroy, NULL, true)                    \
	X(cuStreamWaitEvent, NULL, true)                  \
	X(cuStreamAddCallback, NULL, false)               \
	X(cuLaunchHostFunc, NULL, false)                  \
	X(cuStreamBeginCapture, NULL, true)               \
	X(cuStreamEndCapture, NULL, true)                 \
	X(cuGraphInstantiateWithFlags, NULL, true)        \
	X(cuGraphLaunch, NULL, true)                      \
	X(cuGraphExecDestroy, NULL, true)                 \
	X(cuGraphDestroy, NULL, true)                     \
	X(cuEventCreate, NULL, true)                      \
	X(cuEventDestroy, NULL, true)                     \
	X(cuEventRecord, NULL, true)                      \
	X(cuEventQuery, NULL, true)                       \
	X(cuEventElapsedTime, "cuEventElapsedTime", true) \
	X(cuModuleLoadDataEx, NULL, true)                 \
	X(cuModuleUnload, NULL, true)                     \
	X(cuModuleGetFunction, NULL, true)                \
	X(cuFuncSetAttribute, NULL, true)                 \
	X(cuFuncGetParamInfo, NULL, false)                \
	X(cuLaunchKernel, NULL, true)

/* One pointer per entry point, typed by its prototype (cuda_api.h). */
#define CUDA_API_FIELD(fn, alt, required) __typeof__(fn) *fn;
struct cuda_api {
	CUDA_FUNCTIONS(CUDA_API_FIELD)
};

/*
 * NVRTC's C interface, declared here instead of taken from nvrtc.h: NVRTC is
 * optional at run time, a driver-only development package may lack the
 * header, and its ABI (an opaque program pointer, int results) has been
 * the same since CUDA 7.
 */
struct nvrtc_program;
struct nvrtc_api {
	int (*nvrtcCreateProgram)(struct nvrtc_program **prog, const char *src,
				  const char *name, int num_headers,
				  const char *const *headers,
				  const char *const *include_names);
	int (*nvrtcCompileProgram)(struct nvrtc_program *prog, int num_options,
				   const char *const *options);
	int (*nvrtcGetProgramLogSize)(struct nvrtc_program *prog, size_t *size);
	int (*nvrtcGetProgramLog)(struct nvrtc_program *prog, char *log);
	int (*nvrtcGetPTXSize)(struct nvrtc_program *prog, size_t *size);
	int (*nvrtcGetPTX)(struct nvrtc_program *prog, char *ptx);
	/* CUDA 11.1 on; without them CUDA C goes through PTX. */
	int (*nvrtcGetCUBINSize)(struct nvrtc_program *prog, size_t *size);
	int (*nvrtcGetCUBIN)(struct nvrtc_program *prog, char *cubin);
	int (*nvrtcDestroyProgram)(struct nvrtc_program **prog);
	const char *(*nvrtcGetErrorString)(int result);
};

#define NVRTC_SUCCESS 0
#define NVRTC_ERROR_COMPILATION 6

/* Dynamic shared memory a launch may use without raising the function's
 * CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES first (48 KiB). */
#define CUDA_DEFAULT_SHARED_BYTES (48u * 1024)
/* JIT error log kept per module load; the caller's buffer may be smaller. */
#define CUDA_JIT_LOG_BYTES 8192

/*
 * The memory frees of the device thread, made on a thread of their own.
 * cuMemFree and cuMemFreeHost wait for the whole device (CUDA's frees
 * synchronize the context, and fakecuda's do too), not only for work that
 * uses the memory: on the device thread, a connection closing with pages,
 * a cleanup, or the give-back before an out-of-memory answer would hold
 * every service's batches until another service's longest kernel ended.
 * Memory reaches the frees only once its fences say the device is done
 * with it, so freeing it later is safe; an allocation the device refuses
 * meanwhile waits for the frees queued and tries once more
 * (cuda_frees_wait), as it would have found them done before.
 */
struct cuda_free {
	CUdeviceptr device; /* or 0 */
	void *host;	    /* pinned host memory (cuMemHostAlloc), or NULL */
};

struct cuda_reaper {
	pthread_mutex_t lock;
	pthread_cond_t work; /* frees queued, or stop */
	pthread_cond_t done; /* the queue ran dry */
	struct cuda_free *queue;
	size_t n, cap;
	bool busy; /* a free taken off the queue is running */
	bool started, stop;
	pthread_t thread;
};

struct cuda_driver {
	struct driver base; /* first: d is a struct cuda_driver * */
	struct cuda_api cu;
	void *libcuda;
	int device_count;

	/* Set by open. */
	CUdevice device;
	CUcontext ctx; /* the primary context, NULL until open */
	int cc_major;
	int cc_minor;

	/*
	 * Built-in kernels: the embedded PTX loaded on first use, and one
	 * function per builtin_all() entry, looked up on first use.
	 * builtin_status is 0 before the first try, 1 once loaded, or the
	 * error that the load gave (kept: a PTX the driver refuses once it
	 * refuses every time, and each try costs a JIT compile).
	 */
	CUmodule builtin_module;
	int builtin_status;
	char builtin_error[sizeof(((struct driver *)0)->error)];
	struct driver_function **builtin_fns;
	size_t builtin_count;

	/* NVRTC, opened by the first CUDA C module. */
	void *libnvrtc;
	struct nvrtc_api nvrtc;
	/*
	 * NVRTC's opening, which the device thread and compile threads may
	 * attempt at once (compiles and loads themselves run in parallel).
	 */
	pthread_mutex_t module_lock;

	/*
	 * kernelParams for a kernel whose parameters nobody could tell
	 * (cuda_padded_params): every slot past the client's arguments
	 * points at pad_zero.  Made on the first such launch; device thread.
	 */
	void **pad_params;
	void *pad_zero;

	struct cuda_reaper reaper; /* frees off the device thread */
};

/*
 * Where this thread's failure messages go: a compile thread's own buffer
 * (module_load_shared), else d->error, which belongs to the device thread.
 */
static _Thread_local char *cuda_err_buf;
static _Thread_local size_t cuda_err_len;

struct driver_stream {
	CUstream stream;
	bool capturing; /* between capture_begin and capture_end */
};

struct driver_event {
	CUevent event;
};

struct driver_function {
	CUfunction function;
	/* Dynamic shared memory this function was allowed so far (0: the
	 * default 48 KiB); raising it is a driver call, so it is done once. */
	uint32_t shared_limit;
	/*
	 * The kernel's parameters: params_known once the module image
	 * (cuda_module_function) or the driver, on the first launch
	 * (cuda_function_params), described them, then nparams and each
	 * one's size in bytes.
	 */
	bool params_looked_up;
	bool params_known;
	size_t nparams;
	size_t *param_size;
	struct driver_function *next; /* in its module's list */
	char name[];
};

struct driver_module {
	CUmodule module;
	/* Its globals' device memory, read from the image loaded. */
	uint64_t static_bytes;
	/* Its kernels' parameters, as the image loaded declares them. */
	struct module_image_params *params;
	/* Functions handed out, owned by the module: driver.h has no
	 * function_free, so they live until module_unload. */
	struct driver_function *functions;
};

struct driver_graph {
	CUgraphExec exec;
};

/* What host_callback hands to CUDA's callback thread. */
struct cuda_callback {
	driver_callback_fn fn;
	void *arg;
};

static struct cuda_driver *cuda_of(struct driver *d)
{
	return (struct cuda_driver *)d;
}

static void cuda_function_free(struct driver_function *f)
{
	if (!f)
		return;
	free(f->param_size);
	free(f);
}

/* ---- errors ------------------------------------------------------------ */

/*
 * Errors after which the context is unusable.  A kernel fault surfaces as
 * one of these, at the next call that looks at the stream or context.
 */
static bool cuda_is_sticky(CUresult r)
{
	switch (r) {
	case CUDA_ERROR_ILLEGAL_ADDRESS:
	case CUDA_ERROR_LAUNCH_TIMEOUT:
	case CUDA_ERROR_HARDWARE_STACK_ERROR:
	case CUDA_ERROR_ILLEGAL_INSTRUCTION:
	case CUDA_ERROR_MISALIGNED_ADDRESS:
	case CUDA_ERROR_INVALID_ADDRESS_SPACE:
	case CUDA_ERROR_INVALID_PC:
	case CUDA_ERROR_LAUNCH_FAILED:
	case CUDA_ERROR_ASSERT:
	case CUDA_ERROR_ECC_UNCORRECTABLE:
	/*
	 * cuda.h does not say what follows an uncorrectable NVLink error;
	 * it is the link's counterpart of an uncorrectable ECC error (an
	 * Xid that wants the GPU reset).  Taken as sticky: a context wrongly
	 * kept would answer every later call of every service with it,
	 * while a daemon wrongly restarted costs one restart.
	 */
	case CUDA_ERROR_NVLINK_UNCORRECTABLE:
		return true;
	/*
	 * cuda.h of each: "any further CUDA work will return the same error"
	 * (CONTAINED, TENSOR_MEMORY_LEAK, EXTERNAL_DEVICE), and
	 * MPS_CLIENT_TERMINATED needs a new process.
	 */
	case CUDA_ERROR_CONTAINED:
	case CUDA_ERROR_TENSOR_MEMORY_LEAK:
	case CUDA_ERROR_MPS_CLIENT_TERMINATED:
	case CUDA_ERROR_EXTERNAL_DEVICE:
		return true;
	default:
		return false;
	}
}

/* The one mapping from CUresult to GPUCMD_E* codes. */
static int cuda_code(CUresult r)
{
	if (r == CUDA_SUCCESS)
		return 0;
	if (cuda_is_sticky(r))
		return GPUCMD_ESTREAM;
	switch (r) {
	case CUDA_ERROR_OUT_OF_MEMORY:
		return GPUCMD_ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
	case CUDA_ERROR_INVALID_HANDLE:
	case CUDA_ERROR_INVALID_DEVICE:
	case CUDA_ERROR_INVALID_CONTEXT:
	case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED:
	case CUDA_ERROR_ILLEGAL_STATE:
		return GPUCMD_EINVAL;
	/* A module the client sent that this GPU cannot run. */
	case CUDA_ERROR_INVALID_IMAGE:
	case CUDA_ERROR_INVALID_PTX:
	case CUDA_ERROR_NO_BINARY_FOR_GPU:
	case CUDA_ERROR_INVALID_SOURCE:
		return GPUCMD_EINVAL;
	/* Work recorded into a graph that a graph cannot hold. */
	case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
	case CUDA_ERROR_STREAM_CAPTURE_MERGE:
	case CUDA_ERROR_STREAM_CAPTURE_UNMATCHED:
	case CUDA_ERROR_STREAM_CAPTURE_UNJOINED:
	case CUDA_ERROR_STREAM_CAPTURE_ISOLATION:
	case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT:
	case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD:
	case CUDA_ERROR_CAPTURED_EVENT:
		return GPUCMD_EINVAL;
	case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
		return GPUCMD_EEXIST;
	case CUDA_ERROR_NOT_FOUND:
		return GPUCMD_ENOKERNEL;
	case CUDA_ERROR_NOT_READY:
		return GPUCMD_EBUSY;
	case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
	case CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING:
	case CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE:
		return GPUCMD_ELAUNCH;
	case CUDA_ERROR_NOT_SUPPORTED:
	case CUDA_ERROR_NOT_PERMITTED:
	case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
	case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
	case CUDA_ERROR_JIT_COMPILER_NOT_FOUND:
	case CUDA_ERROR_JIT_COMPILATION_DISABLED:
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
	case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
		return GPUCMD_EUNSUPPORTED;
	default:
		return GPUCMD_EDRIVER;
	}
}

/* "CUDA_ERROR_NAME: the driver's description" of r into buf. */
static void cuda_describe(const struct cuda_api *cu, CUresult r, char *buf,
			  size_t len)
{
	const char *name = NULL;
	const char *text = NULL;

	if (cu->cuGetErrorName && cu->cuGetErrorName(r, &name) != CUDA_SUCCESS)
		name = NULL;
	if (cu->cuGetErrorString &&
	    cu->cuGetErrorString(r, &text) != CUDA_SUCCESS)
		text = NULL;
	if (name)
		snprintf(buf, len, "%s: %s", name,
			 text ? text : "no description");
	else if (r == CUDA_ERROR_STUB_LIBRARY)
		/* The toolkit's stub cannot even name its own error. */
		snprintf(
			buf, len,
			"CUDA_ERROR_STUB_LIBRARY: the libcuda.so.1 "
			"found is the CUDA toolkit's link stub, not the NVIDIA "
			"driver (is a .../stubs directory on LD_LIBRARY_PATH?)");
	else
		snprintf(buf, len, "CUDA error %d (unknown to this driver)",
			 (int)r);
}

/*
 * Write "call: CUDA_ERROR_NAME: description" into d's error and return the
 * GPUCMD_E* code of r.
 */
static int cuda_fail(struct cuda_driver *cd, const char *call, CUresult r)
{
	char what[256];

	cuda_describe(&cd->cu, r, what, sizeof(what));
	snprintf(cuda_err_buf ? cuda_err_buf : cd->base.error,
		 cuda_err_buf ? cuda_err_len : sizeof(cd->base.error),
		 "%s: %s%s", call, what,
		 cuda_is_sticky(r) ?
			 " (a kernel faulted: the CUDA context is lost for "
			 "every stream until gpucmdd restarts)" :
			 "");
	return cuda_code(r);
}

/* 0, or cuda_fail's code. */
static int cuda_check(struct cuda_driver *cd, const char *call, CUresult r)
{
	return r == CUDA_SUCCESS ? 0 : cuda_fail(cd, call, r);
}

/* Call cd->cu.fn(...) and turn its result into 0 or a GPUCMD_E* code; the
 * message names the function as users know it (cuMemAlloc, not _v2). */
#define CU_CHECK(cd, fn, ...) cuda_check((cd), #fn, (cd)->cu.fn(__VA_ARGS__))

static void cuda_set_error(struct cuda_driver *cd, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void cuda_set_error(struct cuda_driver *cd, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(cuda_err_buf ? cuda_err_buf : cd->base.error,
		  cuda_err_buf ? cuda_err_len : sizeof(cd->base.error), fmt,
		  ap);
	va_end(ap);
}

/* Append text to a NUL-terminated log of log_len bytes, truncating. */
static void cuda_log_append(char *log, size_t log_len, const char *text)
{
	const char *end;
	size_t used;

	if (!log || log_len == 0 || !text || !text[0])
		return;
	end = memchr(log, '\0', log_len);
	used = end ? (size_t)(end - log) : log_len - 1;
	snprintf(log + used, log_len - used, "%s", text);
}

/* ---- loading ----------------------------------------------------------- */

/* dlsym under name, else under alt (NULL: none). */
static void *cuda_sym(void *lib, const char *name, const char *alt)
{
	void *sym = dlsym(lib, name);

	if (!sym && alt)
		sym = dlsym(lib, alt);
	return sym;
}

/*
 * Look every entry point up; NULL when all required ones were found, else
 * the name of the first missing one.
 */
static const char *cuda_resolve(struct cuda_driver *cd)
{
	void *sym;

#define CUDA_API_LOAD(fn, alt, required)               \
	sym = cuda_sym(cd->libcuda, CU_NAME(fn), alt); \
	if (!sym && (required))                        \
		return CU_NAME(fn);                    \
	cd->cu.fn = (__typeof__(cd->cu.fn))sym;

	CUDA_FUNCTIONS(CUDA_API_LOAD)
#undef CUDA_API_LOAD

	if (!cd->cu.cuStreamAddCallback && !cd->cu.cuLaunchHostFunc)
		return "cuStreamAddCallback";
	return NULL;
}

/* ---- device ------------------------------------------------------------ */

/*
 * dev's UUID as nvidia-smi prints it ("GPU-" and 8-4-4-4-12 hex digits) and
 * its PCI bus id, each "" where the driver cannot say (the calls are
 * optional: nothing else depends on them).
 */
static void cuda_identify(const struct cuda_driver *cd, CUdevice dev,
			  char *uuid, size_t uuid_len, char *pci,
			  size_t pci_len)
{
	CUuuid u;

	uuid[0] = '\0';
	pci[0] = '\0';
	if (cd->cu.cuDeviceGetUuid != NULL &&
	    cd->cu.cuDeviceGetUuid(&u, dev) == CUDA_SUCCESS) {
		const unsigned char *b = (const unsigned char *)u.bytes;

		snprintf(uuid, uuid_len,
			 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
			 "%02x%02x%02x%02x%02x%02x",
			 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8],
			 b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
	}
	if (cd->cu.cuDeviceGetPCIBusId != NULL &&
	    cd->cu.cuDeviceGetPCIBusId(pci, (int)pci_len, dev) != CUDA_SUCCESS)
		pci[0] = '\0';
	/*
	 * The driver's hex digits are upper case ("0000:3B:00.0"); lspci,
	 * sysfs and our man pages have them lower case, and a bus id copied
	 * from status should match what grep finds there.
	 */
	for (char *c = pci; *c != '\0'; c++)
		*c = (char)tolower((unsigned char)*c);
}

/*
 * The ordinal of the device that id names: its "GPU-" UUID, or a prefix of
 * it that only it has (as nvidia-smi -i takes), or its PCI bus id.  -1,
 * with msg saying why and listing the devices there are, when none or
 * several match.
 */
static int cuda_find_device(const struct cuda_driver *cd, const char *id,
			    int count, char *msg, size_t len)
{
	bool by_uuid = strncasecmp(id, "GPU-", 4) == 0;
	char uuid[48], pci[32];
	int found = -1, matches = 0;
	CUdevice dev, want = -1;
	size_t n;

	if (by_uuid ? cd->cu.cuDeviceGetUuid == NULL :
		      cd->cu.cuDeviceGetByPCIBusId == NULL) {
		snprintf(msg, len,
			 "device %s: this NVIDIA driver cannot look devices "
			 "up by %s: give the device's index instead",
			 id, by_uuid ? "UUID" : "PCI bus id");
		return -1;
	}
	if (!by_uuid && cd->cu.cuDeviceGetByPCIBusId(&want, id) != CUDA_SUCCESS)
		want = -1;
	for (int i = 0; i < count; i++) {
		if (cd->cu.cuDeviceGet(&dev, i) != CUDA_SUCCESS)
			continue;
		if (by_uuid) {
			cuda_identify(cd, dev, uuid, sizeof(uuid), pci,
				      sizeof(pci));
			if (strncasecmp(uuid, id, strlen(id)) != 0)
				continue;
		} else if (dev != want) {
			continue;
		}
		if (matches++ == 0)
			found = i;
	}
	if (matches == 1)
		return found;
	if (matches == 0)
		snprintf(msg, len, "no CUDA device is %s", id);
	else
		snprintf(msg, len,
			 "%s is the start of %d devices' UUIDs: give more of "
			 "it",
			 id, matches);
	n = strlen(msg);
	snprintf(msg + n, len - n, "; the devices this daemon sees are");
	for (int i = 0; i < count && (n = strlen(msg)) + 1 < len; i++) {
		if (cd->cu.cuDeviceGet(&dev, i) != CUDA_SUCCESS)
			continue;
		cuda_identify(cd, dev, uuid, sizeof(uuid), pci, sizeof(pci));
		snprintf(msg + n, len - n, "%s %d %s %s", i ? "," : "", i,
			 uuid[0] ? uuid : "(no UUID)",
			 pci[0] ? pci : "(no PCI bus id)");
	}
	return -1;
}

/* A device attribute into *out; negative values (none exist) become 0. */
static int cuda_attribute(struct cuda_driver *cd, CUdevice_attribute attr,
			  uint32_t *out)
{
	int value = 0;
	int rc = CU_CHECK(cd, cuDeviceGetAttribute, &value, attr, cd->device);

	if (rc)
		return rc;
	*out = value > 0 ? (uint32_t)value : 0;
	return 0;
}

static int cuda_properties(struct cuda_driver *cd, struct driver_properties *p)
{
	size_t total = 0;
	uint32_t cc_major = 0;
	uint32_t cc_minor = 0;
	const struct {
		CUdevice_attribute attr;
		uint32_t *out;
	} attrs[] = {
		{ CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
		  &p->max_threads_per_block },
		{ CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, &p->max_grid[0] },
		{ CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, &p->max_grid[1] },
		{ CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, &p->max_grid[2] },
		{ CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, &p->max_block[0] },
		{ CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, &p->max_block[1] },
		{ CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, &p->max_block[2] },
		/* The opt-in maximum: launch raises a function's limit up to
		 * it when asked for more than the default 48 KiB. */
		{ CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
		  &p->max_shared_bytes },
		{ CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &cc_major },
		{ CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &cc_minor },
	};
	int rc;

	memset(p, 0, sizeof(*p));
	rc = CU_CHECK(cd, cuDeviceGetName, p->name, (int)sizeof(p->name),
		      cd->device);
	if (rc)
		return rc;
	snprintf(p->backend, sizeof(p->backend), "cuda");
	cuda_identify(cd, cd->device, p->uuid, sizeof(p->uuid), p->pci_bus_id,
		      sizeof(p->pci_bus_id));
	p->fault_is_fatal = true;
	p->pageable_copies_block = true;
	rc = CU_CHECK(cd, cuDeviceTotalMem, &total, cd->device);
	if (rc)
		return rc;
	p->total_memory = total;
	/* The reference runtime's choices (cubecl-runtime.md §4.7): a page of
	 * a quarter of the device, and the cuMemAllocPitch row alignment. */
	p->max_page_size = total / 4;
	p->alignment = 512;

	for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
		rc = cuda_attribute(cd, attrs[i].attr, attrs[i].out);
		if (rc)
			return rc;
	}
	cd->cc_major = (int)cc_major;
	cd->cc_minor = (int)cc_minor;
	return 0;
}

/*
 * Must be called on the device thread: the context is made current on the
 * calling thread, and every later call of this backend relies on that.
 */
/* ---- frees off the device thread (struct cuda_reaper) ------------------ */

static void *cuda_reaper_main(void *arg)
{
	struct cuda_driver *cd = arg;
	struct cuda_reaper *rp = &cd->reaper;
	CUresult ctx = cd->cu.cuCtxSetCurrent(cd->ctx);

	pthread_mutex_lock(&rp->lock);
	for (;;) {
		struct cuda_free f;
		CUresult r;

		while (rp->n == 0 && !rp->stop)
			pthread_cond_wait(&rp->work, &rp->lock);
		if (rp->n == 0)
			break;
		f = rp->queue[--rp->n];
		rp->busy = true;
		pthread_mutex_unlock(&rp->lock);
		r = ctx != CUDA_SUCCESS ? ctx :
		    f.host		? cd->cu.cuMemFreeHost(f.host) :
					  cd->cu.cuMemFree(f.device);
		/*
		 * Not the device thread's error buffer, which is its own: a
		 * fault shows there anyway, at its next call.
		 */
		if (r != CUDA_SUCCESS) {
			char what[256];

			cuda_describe(&cd->cu, r, what, sizeof(what));
			log_warn("%s: %s",
				 ctx != CUDA_SUCCESS ? "cuCtxSetCurrent" :
				 f.host		     ? "cuMemFreeHost" :
						       "cuMemFree",
				 what);
		}
		pthread_mutex_lock(&rp->lock);
		rp->busy = false;
		if (rp->n == 0)
			pthread_cond_broadcast(&rp->done);
	}
	pthread_mutex_unlock(&rp->lock);
	return NULL;
}

/*
 * Queue f for the reaper, starting it on the first free: 0, or -errno
 * when neither the thread nor room for f could be had, and the caller
 * frees it itself.
 */
static int cuda_reaper_push(struct cuda_driver *cd, struct cuda_free f)
{
	struct cuda_reaper *rp = &cd->reaper;
	int rc = 0;

	pthread_mutex_lock(&rp->lock);
	if (!rp->started) {
		sigset_t all, old;

		/* Signals are the loop's. */
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		rc = -pthread_create(&rp->thread, NULL, cuda_reaper_main, cd);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		rp->started = rc == 0;
	}
	if (rc == 0 && rp->n == rp->cap) {
		size_t cap = rp->cap ? 2 * rp->cap : 64;
		struct cuda_free *q = realloc(rp->queue, cap * sizeof(*q));

		if (q == NULL) {
			rc = -ENOMEM;
		} else {
			rp->queue = q;
			rp->cap = cap;
		}
	}
	if (rc == 0) {
		rp->queue[rp->n++] = f;
		pthread_cond_signal(&rp->work);
	}
	pthread_mutex_unlock(&rp->lock);
	return rc;
}

/* Wait until the frees queued so far are done: whether there were any. */
static bool cuda_frees_wait(struct cuda_driver *cd)
{
	struct cuda_reaper *rp = &cd->reaper;
	bool any;

	pthread_mutex_lock(&rp->lock);
	any = rp->n > 0 || rp->busy;
	while (rp->n > 0 || rp->busy)
		pthread_cond_wait(&rp->done, &rp->lock);
	pthread_mutex_unlock(&rp->lock);
	return any;
}

/* The reaper's last frees, then the thread; before the context goes. */
static void cuda_reaper_stop(struct cuda_driver *cd)
{
	struct cuda_reaper *rp = &cd->reaper;

	pthread_mutex_lock(&rp->lock);
	rp->stop = true;
	pthread_cond_signal(&rp->work);
	pthread_mutex_unlock(&rp->lock);
	if (rp->started)
		pthread_join(rp->thread, NULL);
	free(rp->queue);
	pthread_cond_destroy(&rp->work);
	pthread_cond_destroy(&rp->done);
	pthread_mutex_destroy(&rp->lock);
}

static int cuda_builtin_load(struct cuda_driver *cd);

static int cuda_open(struct driver *d, int device,
		     struct driver_properties *props)
{
	struct cuda_driver *cd = cuda_of(d);
	struct driver_properties p;
	CUcontext ctx = NULL;
	CUdevice dev = 0;
	int rc;

	if (cd->ctx) {
		cuda_set_error(cd, "the CUDA device is already open");
		return GPUCMD_EINVAL;
	}
	if (device < 0 || device >= cd->device_count) {
		cuda_set_error(
			cd,
			"CUDA device %d does not exist: this machine has "
			"%d (numbered from 0)",
			device, cd->device_count);
		return GPUCMD_EINVAL;
	}
	rc = CU_CHECK(cd, cuDeviceGet, &dev, device);
	if (rc)
		return rc;
	/* The primary context is the one the CUDA runtime and other tools
	 * use too, so nvidia-smi shows one context for the daemon. */
	rc = CU_CHECK(cd, cuDevicePrimaryCtxRetain, &ctx, dev);
	if (rc)
		return rc;
	rc = CU_CHECK(cd, cuCtxSetCurrent, ctx);
	if (rc) {
		cd->cu.cuDevicePrimaryCtxRelease(dev);
		return rc;
	}
	cd->device = dev;
	rc = cuda_properties(cd, &p);
	if (rc) {
		cd->cu.cuCtxSetCurrent(NULL);
		cd->cu.cuDevicePrimaryCtxRelease(dev);
		return rc;
	}
	cd->ctx = ctx;
	cd->base.props = p;
	/*
	 * The JIT compile of the built-ins (up to a second where the compute
	 * cache is cold or unwritable) happens here, before READY, not on
	 * the device thread inside some service's batch.  Its failure is
	 * remembered and told at the first use, not here.
	 */
	if (gpucmd_builtin_ptx_len > 0) {
		(void)cuda_builtin_load(cd);
		cd->base.error[0] = '\0';
	}
	*props = p;
	return 0;
}

static void cuda_close(struct driver *d)
{
	struct cuda_driver *cd = cuda_of(d);

	cuda_reaper_stop(cd);
	if (cd->ctx) {
		/*
		 * The executor is stopped from the loop's thread (or main's,
		 * after a failed start), which has no current context.
		 */
		cd->cu.cuCtxSetCurrent(cd->ctx);
		/*
		 * Wait for the device so that no completion callback is
		 * still running when the caller frees what it points at.
		 * After a fault this returns the fault at once; nothing more
		 * will run then anyway.
		 */
		cd->cu.cuCtxSynchronize();
		for (size_t i = 0; i < cd->builtin_count; i++)
			cuda_function_free(cd->builtin_fns[i]);
		if (cd->builtin_module)
			cd->cu.cuModuleUnload(cd->builtin_module);
		cd->cu.cuCtxSetCurrent(NULL);
		cd->cu.cuDevicePrimaryCtxRelease(cd->device);
	}
	/*
	 * libcuda.so.1 stays loaded: after cuInit the driver runs threads of
	 * its own that outlive any context, and unloading the code under
	 * them crashes the process at exit.  NVRTC has no threads.
	 */
	if (cd->libnvrtc)
		dlclose(cd->libnvrtc);
	free(cd->builtin_fns);
	free(cd->pad_params);
	free(cd->pad_zero);
	pthread_mutex_destroy(&cd->module_lock);
	free(cd);
}

/* ---- streams and events ------------------------------------------------ */

static int cuda_stream_create(struct driver *d, struct driver_stream **out)
{
	struct cuda_driver *cd = cuda_of(d);
	struct driver_stream *s = calloc(1, sizeof(*s));
	int rc;

	if (!s) {
		cuda_set_error(cd, "out of host memory for a stream");
		return -ENOMEM;
	}
	/* Non-blocking: the daemon never uses the legacy NULL stream, and
	 * must not be serialized behind it by some library that does. */
	rc = CU_CHECK(cd, cuStreamCreate, &s->stream, CU_STREAM_NON_BLOCKING);
	if (rc) {
		free(s);
		return rc;
	}
	*out = s;
	return 0;
}

static void cuda_stream_destroy(struct driver *d, struct driver_stream *s)
{
	struct cuda_driver *cd = cuda_of(d);

	if (!s)
		return;
	CU_CHECK(cd, cuStreamDestroy, s->stream);
	free(s);
}

static int cuda_event_create(struct driver *d, struct driver_event **out)
{
	struct cuda_driver *cd = cuda_of(d);
	struct driver_event *e = calloc(1, sizeof(*e));
	int rc;

	if (!e) {
		cuda_set_error(cd, "out of host memory for an event");
		return -ENOMEM;
	}
	/* Default flags keep timing on, which event_elapsed needs. */
	rc = CU_CHECK(cd, cuEventCreate, &e->event, CU_EVENT_DEFAULT);
	if (rc) {
		free(e);
		return rc;
	}
	*out = e;
	return 0;
}

static void cuda_event_destroy(struct driver *d, struct driver_event *e)
{
	struct cuda_driver *cd = cuda_of(d);

	if (!e)
		return;
	CU_CHECK(cd, cuEventDestroy, e->event);
	free(e);
}

static int cuda_event_record(struct driver *d, struct driver_event *e,
			     struct driver_stream *s)
{
	struct cuda_driver *cd = cuda_of(d);

	return CU_CHECK(cd, cuEventRecord, e->event, s->stream);
}

static int cuda_event_wait(struct driver *d, struct driver_stream *s,
			   struct driver_event *e)
{
	struct cuda_driver *cd = cuda_of(d);

	return CU_CHECK(cd, cuStreamWaitEvent, s->stream, e->event,
			CU_EVENT_WAIT_DEFAULT);
}

static int cuda_event_query(struct driver *d, struct driver_event *e)
{
	struct cuda_driver *cd = cuda_of(d);
	CUresult r = cd->cu.cuEventQuery(e->event);

	if (r == CUDA_SUCCESS)
		return 1;
	if (r == CUDA_ERROR_NOT_READY)
		return 0;
	return cuda_fail(cd, "cuEventQuery", r);
}

static int cuda_event_elapsed(struct driver *d, struct driver_event *start,
			      struct driver_event *end, float *ms)
{
	struct cuda_driver *cd = cuda_of(d);
	float value = 0;
	CUresult r =
		cd->cu.cuEventElapsedTime(&value, start->event, end->event);

	if (r == CUDA_ERROR_NOT_READY) {
		cuda_set_error(cd, "cuEventElapsedTime: the events have not "
				   "completed yet");
		return GPUCMD_EBUSY;
	}
	if (r != CUDA_SUCCESS)
		return cuda_fail(cd, "cuEventElapsedTime", r);
	*ms = value;
	return 0;
}

/*
 * Completion callbacks.
 *
 * driver.h asks for fn(arg, GPUCMD_ESTREAM) when the stream faulted, and a
 * sync that waits on the callback must be answered even then, or the
 * client hangs.  cuLaunchHostFunc cannot give that: its function is not
 * called at all once the context has an error, and a host function may not
 * call CUDA (so it cannot ask cuStreamQuery).  A per-stream "an enqueue
 * failed" flag does not help either: an enqueue that fails is already
 * reported to the daemon by its return value, while the fault that matters
 * happens on the device after the callback was enqueued successfully.
 *
 * cuStreamAddCallback does exactly what is needed: the callback runs
 * exactly once, after the work before it, and receives the stream's status,
 * which is the sticky error once the device has faulted.  NVIDIA says it may
 * be deprecated one day, so cuLaunchHostFunc is the stand-in where a driver
 * lacks it.  There a fault leaves the callbacks enqueued before it uncalled
 * (a limitation of that fallback only); the daemon learns of the fault from
 * the GPUCMD_ESTREAM that its next call on any stream returns.
 *
 * Neither may be recorded into a graph the way the daemon uses them
 * (cuStreamAddCallback is refused during capture, and a host function in
 * a graph would run, and free its record, on every replay), so
 * host_callback refuses a capturing stream.
 */
static void CUDA_CB cuda_stream_done(CUstream stream, CUresult status,
				     void *user)
{
	struct cuda_callback cb = *(struct cuda_callback *)user;

	free(user);
	cb.fn(cb.arg, status == CUDA_SUCCESS ? 0 : GPUCMD_ESTREAM);
}

static void CUDA_CB cuda_host_done(void *user)
{
	struct cuda_callback cb = *(struct cuda_callback *)user;

	/* Only ever called when the context is healthy (see above). */
	free(user);
	cb.fn(cb.arg, 0);
}

static int cuda_host_callback(struct driver *d, struct driver_stream *s,
			      driver_callback_fn fn, void *arg)
{
	struct cuda_driver *cd = cuda_of(d);
	struct cuda_callback *cb;
	int rc;

	if (s->capturing) {
		cuda_set_error(cd, "a completion callback cannot be recorded "
				   "into a graph: end the capture first");
		return GPUCMD_EINVAL;
	}
	cb = malloc(sizeof(*cb));
	if (!cb) {
		cuda_set_error(cd, "out of host memory for a callback");
		return -ENOMEM;
	}
	cb->fn = fn;
	cb->arg = arg;
	if (cd->cu.cuStreamAddCallback)
		rc = CU_CHECK(cd, cuStreamAddCallback, s->stream,
			      cuda_stream_done, cb, 0);
	else
		rc = CU_CHECK(cd, cuLaunchHostFunc, s->stream, cuda_host_done,
			      cb);
	/* An async call that fails never calls its callback. */
	if (rc)
		free(cb);
	return rc;
}

/* ---- memory ------------------------------------------------------------ */

static int cuda_mem_alloc(struct driver *d, uint64_t size, uint64_t *ptr)
{
	struct cuda_driver *cd = cuda_of(d);
	CUdeviceptr p = 0;
	CUresult r;

	if (size == 0 || size > SIZE_MAX) {
		cuda_set_error(cd,
			       "cannot allocate %llu bytes of device memory",
			       (unsigned long long)size);
		return GPUCMD_EINVAL;
	}
	r = cd->cu.cuMemAlloc(&p, (size_t)size);
	/* Memory on its way back (cuda_reaper_push) counts as free. */
	if (r == CUDA_ERROR_OUT_OF_MEMORY && cuda_frees_wait(cd))
		r = cd->cu.cuMemAlloc(&p, (size_t)size);
	if (r == CUDA_ERROR_OUT_OF_MEMORY) {
		size_t free_bytes = 0;
		size_t total_bytes = 0;

		/* Unknown numbers are said to be unknown, not "0 of 0". */
		if (cd->cu.cuMemGetInfo(&free_bytes, &total_bytes) !=
		    CUDA_SUCCESS)
			cuda_set_error(cd,
				       "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY: "
				       "the device has no room for %llu bytes "
				       "(how much is free, the driver could "
				       "not say)",
				       (unsigned long long)size);
		else
			cuda_set_error(cd,
				       "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY: "
				       "the device has no room for %llu bytes "
				       "(%zu of %zu bytes free, possibly used "
				       "by other processes)",
				       (unsigned long long)size, free_bytes,
				       total_bytes);
		return GPUCMD_ENOMEM;
	}
	if (r != CUDA_SUCCESS)
		return cuda_fail(cd, "cuMemAlloc", r);
	*ptr = p;
	return 0;
}

static void cuda_mem_free(struct driver *d, uint64_t ptr)
{
	struct cuda_driver *cd = cuda_of(d);

	/* Callers free pages only once the drop queue says they are idle. */
	if (ptr &&
	    cuda_reaper_push(cd, (struct cuda_free){
					 .device = (CUdeviceptr)ptr }) != 0)
		CU_CHECK(cd, cuMemFree, (CUdeviceptr)ptr);
}

static int cuda_host_alloc(struct driver *d, size_t size, void **ptr)
{
	struct cuda_driver *cd = cuda_of(d);
	void *p = NULL;
	int rc;

	if (size == 0) {
		cuda_set_error(cd, "cannot allocate 0 bytes of pinned memory");
		return GPUCMD_EINVAL;
	}
	/* Portable: pinned for every context, not only the current one. */
	rc = CU_CHECK(cd, cuMemHostAlloc, &p, size, CU_MEMHOSTALLOC_PORTABLE);
	if (rc)
		return rc;
	*ptr = p;
	return 0;
}

/*
 * Also at teardown, from the thread that stops the executor (the reaper
 * still runs then: cuda_close stops it).
 */
static void cuda_host_free(struct driver *d, void *ptr)
{
	struct cuda_driver *cd = cuda_of(d);

	if (ptr &&
	    cuda_reaper_push(cd, (struct cuda_free){ .host = ptr }) != 0 &&
	    cd->cu.cuCtxSetCurrent(cd->ctx) == CUDA_SUCCESS)
		CU_CHECK(cd, cuMemFreeHost, ptr);
}

static int cuda_host_register(struct driver *d, void *ptr, size_t size)
{
	struct cuda_driver *cd = cuda_of(d);

	if (!ptr || size == 0) {
		cuda_set_error(cd, "cannot pin an empty range of host memory");
		return GPUCMD_EINVAL;
	}
	return CU_CHECK(cd, cuMemHostRegister, ptr, size,
			CU_MEMHOSTREGISTER_PORTABLE);
}

/*
 * Any thread: the loop frees read staging registered by the device thread
 * (command_free_cpu).  It has no current context, and must not write the
 * driver's error buffer, which the device thread owns.
 */
static void cuda_host_unregister(struct driver *d, void *ptr)
{
	struct cuda_driver *cd = cuda_of(d);

	if (ptr && cd->cu.cuCtxSetCurrent(cd->ctx) == CUDA_SUCCESS)
		cd->cu.cuMemHostUnregister(ptr);
}

/* ---- copies ------------------------------------------------------------ */

/* Zero-byte copies return at once: there is nothing to order. */

static int cuda_copy_htod(struct driver *d, struct driver_stream *s,
			  uint64_t dst, const void *src, size_t n)
{
	struct cuda_driver *cd = cuda_of(d);

	if (n == 0)
		return 0;
	return CU_CHECK(cd, cuMemcpyHtoDAsync, (CUdeviceptr)dst, src, n,
			s->stream);
}

static int cuda_copy_dtoh(struct driver *d, struct driver_stream *s, void *dst,
			  uint64_t src, size_t n)
{
	struct cuda_driver *cd = cuda_of(d);

	if (n == 0)
		return 0;
	return CU_CHECK(cd, cuMemcpyDtoHAsync, dst, (CUdeviceptr)src, n,
			s->stream);
}

static int cuda_copy_dtod(struct driver *d, struct driver_stream *s,
			  uint64_t dst, uint64_t src, size_t n)
{
	struct cuda_driver *cd = cuda_of(d);

	if (n == 0)
		return 0;
	return CU_CHECK(cd, cuMemcpyDtoDAsync, (CUdeviceptr)dst,
			(CUdeviceptr)src, n, s->stream);
}

static int cuda_copy_htod_2d(struct driver *d, struct driver_stream *s,
			     uint64_t dst, const void *src,
			     const struct driver_copy2d *c)
{
	struct cuda_driver *cd = cuda_of(d);
	CUDA_MEMCPY2D m;

	if (c->width == 0 || c->height == 0)
		return 0;
	memset(&m, 0, sizeof(m));
	m.srcMemoryType = CU_MEMORYTYPE_HOST;
	m.srcHost = src;
	m.srcPitch = c->src_pitch;
	m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	m.dstDevice = (CUdeviceptr)dst;
	m.dstPitch = c->dst_pitch;
	m.WidthInBytes = c->width;
	m.Height = c->height;
	return CU_CHECK(cd, cuMemcpy2DAsync, &m, s->stream);
}

static int cuda_copy_dtoh_2d(struct driver *d, struct driver_stream *s,
			     void *dst, uint64_t src,
			     const struct driver_copy2d *c)
{
	struct cuda_driver *cd = cuda_of(d);
	CUDA_MEMCPY2D m;

	if (c->width == 0 || c->height == 0)
		return 0;
	memset(&m, 0, sizeof(m));
	m.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	m.srcDevice = (CUdeviceptr)src;
	m.srcPitch = c->src_pitch;
	m.dstMemoryType = CU_MEMORYTYPE_HOST;
	m.dstHost = dst;
	m.dstPitch = c->dst_pitch;
	m.WidthInBytes = c->width;
	m.Height = c->height;
	return CU_CHECK(cd, cuMemcpy2DAsync, &m, s->stream);
}

static int cuda_mem_info(struct driver *d, uint64_t *free_bytes,
			 uint64_t *total_bytes)
{
	struct cuda_driver *cd = cuda_of(d);
	size_t f = 0, t = 0;
	CUresult r = cd->cu.cuMemGetInfo(&f, &t);

	if (r != CUDA_SUCCESS)
		return cuda_fail(cd, "cuMemGetInfo", r);
	*free_bytes = f;
	*total_bytes = t;
	return 0;
}

static int cuda_memset_d8(struct driver *d, struct driver_stream *s,
			  uint64_t dst, uint8_t value, size_t n)
{
	struct cuda_driver *cd = cuda_of(d);

	if (n == 0)
		return 0;
	return CU_CHECK(cd, cuMemsetD8Async, (CUdeviceptr)dst, value, n,
			s->stream);
}

/* ---- modules ----------------------------------------------------------- */

/*
 * Load a PTX (NUL-terminated), cubin or fatbin image into *out.  The JIT
 * error log, when there is one, is appended to log.
 */
static int cuda_load_image(struct cuda_driver *cd, const void *image,
			   CUmodule *out, char *log, size_t log_len)
{
	char jit_log[CUDA_JIT_LOG_BYTES];
	CUjit_option opts[] = {
		CU_JIT_ERROR_LOG_BUFFER,
		CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
	};
	void *values[] = {
		jit_log,
		(void *)(uintptr_t)sizeof(jit_log),
	};
	CUmodule m = NULL;
	CUresult r;

	jit_log[0] = '\0';
	r = cd->cu.cuModuleLoadDataEx(&m, image, 2, opts, values);
	if (r != CUDA_SUCCESS) {
		jit_log[sizeof(jit_log) - 1] = '\0';
		cuda_log_append(log, log_len, jit_log);
		return cuda_fail(cd, "cuModuleLoadDataEx", r);
	}
	*out = m;
	return 0;
}

/* NVRTC under the names a toolkit or a distribution may install it. */
static const char *const nvrtc_names[] = {
	"libnvrtc.so",
	"libnvrtc.so.13",
	"libnvrtc.so.12",
	"libnvrtc.so.11.2",
};

static int cuda_nvrtc_open(struct cuda_driver *cd)
{
	struct nvrtc_api api;
	void *lib = NULL;
	void *sym;

	if (cd->libnvrtc)
		return 0;
	for (size_t i = 0;
	     !lib && i < sizeof(nvrtc_names) / sizeof(nvrtc_names[0]); i++)
		lib = dlopen(nvrtc_names[i], RTLD_NOW | RTLD_LOCAL);
	/* Not remembered when missing: an admin may install it meanwhile. */
	if (!lib) {
		cuda_set_error(cd,
			       "CUDA C needs NVRTC (libnvrtc.so), which is "
			       "not installed here: install the CUDA toolkit's "
			       "NVRTC, or send PTX or a cubin instead");
		return GPUCMD_EUNSUPPORTED;
	}
	memset(&api, 0, sizeof(api));
#define NVRTC_LOAD(fn, required)                                     \
	sym = dlsym(lib, #fn);                                       \
	if (!sym && (required)) {                                    \
		cuda_set_error(cd,                                   \
			       "the NVRTC library found has no %s: " \
			       "it is too old for gpucmdd",          \
			       #fn);                                 \
		dlclose(lib);                                        \
		return GPUCMD_EUNSUPPORTED;                          \
	}                                                            \
	api.fn = (__typeof__(api.fn))sym;

	NVRTC_LOAD(nvrtcCreateProgram, true)
	NVRTC_LOAD(nvrtcCompileProgram, true)
	NVRTC_LOAD(nvrtcGetProgramLogSize, true)
	NVRTC_LOAD(nvrtcGetProgramLog, true)
	NVRTC_LOAD(nvrtcGetPTXSize, true)
	NVRTC_LOAD(nvrtcGetPTX, true)
	NVRTC_LOAD(nvrtcGetCUBINSize, false)
	NVRTC_LOAD(nvrtcGetCUBIN, false)
	NVRTC_LOAD(nvrtcDestroyProgram, true)
	NVRTC_LOAD(nvrtcGetErrorString, true)
#undef NVRTC_LOAD
	cd->libnvrtc = lib;
	cd->nvrtc = api;
	return 0;
}

static int cuda_nvrtc_fail(struct cuda_driver *cd, const char *call, int r)
{
	const char *text = cd->nvrtc.nvrtcGetErrorString(r);

	cuda_set_error(cd, "%s: %s", call, text ? text : "NVRTC error");
	return r == NVRTC_ERROR_COMPILATION ? GPUCMD_EINVAL : GPUCMD_EDRIVER;
}

/*
 * Compile CUDA C source (len bytes, not NUL-terminated) for this GPU into a
 * malloc'd image for cuda_load_image.  The compiler's log goes to log.
 *
 * Machine code (cubin) for the exact GPU when NVRTC can produce it: it
 * needs no JIT at load, and unlike PTX it is not refused by a driver older
 * than NVRTC's PTX version.  Older NVRTC gives PTX for the GPU's virtual
 * architecture.
 */
static int cuda_nvrtc_compile(struct cuda_driver *cd, const char *src,
			      size_t len, char **image, size_t *image_len,
			      char *log, size_t log_len)
{
	struct nvrtc_api *nv = &cd->nvrtc;
	struct nvrtc_program *prog = NULL;
	bool cubin;
	char arch[64];
	const char *opts[] = { arch };
	char *text = NULL;
	char *out = NULL;
	size_t size = 0;
	int r;
	int rc;

	/*
	 * Only loading NVRTC needs the lock (compile threads and the device
	 * thread may come here at once); compiling and the driver's module
	 * load are thread-safe, so one compile never holds another up.
	 */
	pthread_mutex_lock(&cd->module_lock);
	rc = cuda_nvrtc_open(cd);
	pthread_mutex_unlock(&cd->module_lock);
	if (rc)
		return rc;
	cubin = nv->nvrtcGetCUBIN && nv->nvrtcGetCUBINSize;
	text = malloc(len + 1);
	if (!text) {
		cuda_set_error(cd, "out of host memory for the CUDA C source");
		return -ENOMEM;
	}
	memcpy(text, src, len);
	text[len] = '\0';
	snprintf(arch, sizeof(arch), "--gpu-architecture=%s_%d%d",
		 cubin ? "sm" : "compute", cd->cc_major, cd->cc_minor);

	r = nv->nvrtcCreateProgram(&prog, text, "module.cu", 0, NULL, NULL);
	free(text);
	if (r != NVRTC_SUCCESS)
		return cuda_nvrtc_fail(cd, "nvrtcCreateProgram", r);

	r = nv->nvrtcCompileProgram(prog, 1, opts);
	/* The log holds warnings on success and the errors on failure. */
	if (nv->nvrtcGetProgramLogSize(prog, &size) == NVRTC_SUCCESS &&
	    size > 1) {
		char *compile_log = malloc(size);

		if (compile_log && nv->nvrtcGetProgramLog(prog, compile_log) ==
					   NVRTC_SUCCESS) {
			compile_log[size - 1] = '\0';
			cuda_log_append(log, log_len, compile_log);
		}
		free(compile_log);
	}
	if (r != NVRTC_SUCCESS) {
		rc = cuda_nvrtc_fail(cd, "nvrtcCompileProgram", r);
		if (r == NVRTC_ERROR_COMPILATION)
			cuda_set_error(
				cd,
				"nvrtcCompileProgram: the CUDA C "
				"did not compile for %s (the compile log "
				"says why)",
				arch + strlen("--gpu-architecture="));
		goto out;
	}

	r = cubin ? nv->nvrtcGetCUBINSize(prog, &size) :
		    nv->nvrtcGetPTXSize(prog, &size);
	if (r != NVRTC_SUCCESS) {
		rc = cuda_nvrtc_fail(cd,
				     cubin ? "nvrtcGetCUBINSize" :
					     "nvrtcGetPTXSize",
				     r);
		goto out;
	}
	if (size == 0) {
		cuda_set_error(cd,
			       "NVRTC compiled the CUDA C to an empty module");
		rc = GPUCMD_EDRIVER;
		goto out;
	}
	out = malloc(size);
	if (!out) {
		cuda_set_error(cd,
			       "out of host memory for the compiled module");
		rc = -ENOMEM;
		goto out;
	}
	r = cubin ? nv->nvrtcGetCUBIN(prog, out) : nv->nvrtcGetPTX(prog, out);
	if (r != NVRTC_SUCCESS) {
		rc = cuda_nvrtc_fail(cd,
				     cubin ? "nvrtcGetCUBIN" : "nvrtcGetPTX",
				     r);
		free(out);
		goto out;
	}
	*image = out;
	*image_len = size;
	rc = 0;
out:
	nv->nvrtcDestroyProgram(&prog);
	return rc;
}

static int cuda_module_load_image(struct cuda_driver *cd,
				  enum driver_module_format fmt,
				  const void *data, size_t len,
				  struct driver_module **out, char *log,
				  size_t log_len)
{
	struct driver_module *m;
	char *image = NULL;
	size_t image_len = len;
	uint64_t static_bytes;
	struct module_image_params *params = NULL;
	CUmodule module = NULL;
	int rc;

	if (log && log_len)
		log[0] = '\0';
	if (!data || len == 0) {
		cuda_set_error(cd, "the module is empty");
		return GPUCMD_EINVAL;
	}
	switch (fmt) {
	case DRIVER_MODULE_PTX:
	case DRIVER_MODULE_CUBIN:
	case DRIVER_MODULE_FATBIN:
		/*
		 * A copy: PTX must end in a NUL, which bytes off the wire do
		 * not, and a cubin or fatbin must be aligned like the ELF or
		 * fatbin header inside it, which malloc guarantees.
		 */
		image = malloc(len + 1);
		if (!image) {
			cuda_set_error(cd, "out of host memory for the module");
			return -ENOMEM;
		}
		memcpy(image, data, len);
		image[len] = '\0';
		break;
	case DRIVER_MODULE_CUDA_C:
		rc = cuda_nvrtc_compile(cd, data, len, &image, &image_len, log,
					log_len);
		if (rc)
			return rc;
		break;
	default:
		cuda_set_error(cd, "unknown module format %d", (int)fmt);
		return GPUCMD_EINVAL;
	}

	static_bytes = module_image_static_bytes(image, image_len, NULL);
	/*
	 * Read from the copy (or what NVRTC made): the bytes the driver
	 * loads, which a client cannot change under the daemon.
	 */
	rc = module_image_params_read(image, image_len, &params);
	if (rc) {
		free(image);
		cuda_set_error(cd, "out of host memory for the module");
		return rc;
	}
	rc = cuda_load_image(cd, image, &module, log, log_len);
	free(image);
	if (rc) {
		module_image_params_free(params);
		return rc;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		cd->cu.cuModuleUnload(module);
		module_image_params_free(params);
		cuda_set_error(cd, "out of host memory for the module");
		return -ENOMEM;
	}
	m->module = module;
	m->static_bytes = static_bytes;
	m->params = params;
	*out = m;
	return 0;
}

static uint64_t cuda_module_static_bytes(struct driver *d,
					 const struct driver_module *m)
{
	(void)d;
	return m->static_bytes;
}

static int cuda_module_load(struct driver *d, enum driver_module_format fmt,
			    const void *data, size_t len,
			    struct driver_module **out, char *log,
			    size_t log_len)
{
	return cuda_module_load_image(cuda_of(d), fmt, data, len, out, log,
				      log_len);
}

/*
 * A compile thread: the context is made current here (a thread of
 * libuv's pool has none), and messages go to err, not to d->error.
 */
static int cuda_module_load_shared(struct driver *d,
				   enum driver_module_format fmt,
				   const void *data, size_t len,
				   struct driver_module **out, char *err,
				   size_t err_len, char *log, size_t log_len)
{
	struct cuda_driver *cd = cuda_of(d);
	CUresult r;
	int rc;

	cuda_err_buf = err;
	cuda_err_len = err_len;
	err[0] = '\0';
	r = cd->cu.cuCtxSetCurrent(cd->ctx);
	if (r != CUDA_SUCCESS) {
		rc = cuda_fail(cd, "cuCtxSetCurrent", r);
	} else {
		rc = cuda_module_load_image(cd, fmt, data, len, out, log,
					    log_len);
	}
	cuda_err_buf = NULL;
	cuda_err_len = 0;
	return rc;
}

/*
 * Any thread: it touches no shared state.  The loop thread unloads the
 * modules of a client that died while they compiled, and a thread of the
 * loop or of libuv's pool has no current context: without one the unload
 * fails and the module stays loaded in the device context for good.
 */
static void cuda_module_unload(struct driver *d, struct driver_module *m)
{
	struct cuda_driver *cd = cuda_of(d);
	struct driver_function *f;

	if (!m)
		return;
	while ((f = m->functions)) {
		m->functions = f->next;
		cuda_function_free(f);
	}
	if (cd->cu.cuCtxSetCurrent(cd->ctx) == CUDA_SUCCESS)
		cd->cu.cuModuleUnload(m->module);
	module_image_params_free(m->params);
	free(m);
}

/* Look name up in module into a new driver_function. */
static int cuda_function_get(struct cuda_driver *cd, CUmodule module,
			     const char *name, struct driver_function **out)
{
	struct driver_function *f;
	CUfunction fn = NULL;
	size_t len = strlen(name);
	CUresult r = cd->cu.cuModuleGetFunction(&fn, module, name);

	if (r == CUDA_ERROR_NOT_FOUND) {
		cuda_set_error(cd,
			       "cuModuleGetFunction: no kernel named \"%s\" "
			       "in the module (kernels are found by symbol "
			       "name: declare them extern \"C\")",
			       name);
		return GPUCMD_ENOKERNEL;
	}
	if (r != CUDA_SUCCESS)
		return cuda_fail(cd, "cuModuleGetFunction", r);
	f = calloc(1, sizeof(*f) + len + 1);
	if (!f) {
		cuda_set_error(cd, "out of host memory for a function");
		return -ENOMEM;
	}
	f->function = fn;
	memcpy(f->name, name, len + 1);
	*out = f;
	return 0;
}

/*
 * What m's image declares of f's parameters (module_image.h), for launch
 * to check where the driver cannot say (cuda_function_params).
 */
static int cuda_function_image_params(struct cuda_driver *cd,
				      const struct driver_module *m,
				      struct driver_function *f)
{
	const size_t *sizes;
	size_t n;

	if (!module_image_params_find(m->params, f->name, &n, &sizes))
		return 0;
	f->param_size = malloc(n ? n * sizeof(*sizes) : 1);
	if (!f->param_size) {
		cuda_set_error(cd,
			       "out of host memory for the parameters of "
			       "kernel %s",
			       f->name);
		return -ENOMEM;
	}
	if (n)
		memcpy(f->param_size, sizes, n * sizeof(*sizes));
	f->nparams = n;
	f->params_known = true;
	return 0;
}

static int cuda_module_function(struct driver *d, struct driver_module *m,
				const char *name, struct driver_function **out)
{
	struct cuda_driver *cd = cuda_of(d);
	struct driver_function *f;
	int rc;

	/* The same name gives the same function: no growth on repeats. */
	for (f = m->functions; f; f = f->next) {
		if (strcmp(f->name, name) == 0) {
			*out = f;
			return 0;
		}
	}
	rc = cuda_function_get(cd, m->module, name, &f);
	if (rc)
		return rc;
	rc = cuda_function_image_params(cd, m, f);
	if (rc) {
		cuda_function_free(f);
		return rc;
	}
	f->next = m->functions;
	m->functions = f;
	*out = f;
	return 0;
}

/* Load the embedded built-in PTX once; 0 or the remembered failure. */
static int cuda_builtin_load(struct cuda_driver *cd)
{
	char log[1024];
	int rc;

	if (cd->builtin_status == 1)
		return 0;
	if (cd->builtin_status < 0) {
		memcpy(cd->base.error, cd->builtin_error,
		       sizeof(cd->base.error));
		return cd->builtin_status;
	}
	if (gpucmd_builtin_ptx_len == 0) {
		cuda_set_error(cd,
			       "this gpucmdd was built without nvcc, so the "
			       "CUDA backend has no built-in kernels: rebuild "
			       "it with the CUDA toolkit's nvcc, or load a "
			       "module");
		return GPUCMD_ENOKERNEL;
	}
	log[0] = '\0';
	rc = cuda_load_image(cd, gpucmd_builtin_ptx, &cd->builtin_module, log,
			     sizeof(log));
	if (rc) {
		char first[200];
		char why[sizeof(cd->base.error)];

		/* The log's first line usually names the problem. */
		snprintf(first, sizeof(first), "%.*s", (int)strcspn(log, "\n"),
			 log);
		snprintf(why, sizeof(why), "%s", cd->base.error);
		cuda_set_error(cd, "the built-in kernels did not load: %s%s%s",
			       why, first[0] ? ": " : "", first);
		/* Faults and lack of memory pass; anything else is the PTX
		 * or this driver, and will not change. */
		if (rc == GPUCMD_ESTREAM || rc == GPUCMD_ENOMEM)
			return rc;
		cd->builtin_status = GPUCMD_ENOKERNEL;
		memcpy(cd->builtin_error, cd->base.error,
		       sizeof(cd->builtin_error));
		return GPUCMD_ENOKERNEL;
	}
	cd->builtin_status = 1;
	return 0;
}

static int cuda_builtin_function(struct driver *d, const char *name,
				 struct driver_function **out)
{
	struct cuda_driver *cd = cuda_of(d);
	const struct builtin_kernel *k = builtin_find(name);
	const struct builtin_kernel *all;
	size_t count;
	size_t index;
	int rc;

	if (!k) {
		cuda_set_error(cd, "there is no built-in kernel named \"%s\"",
			       name);
		return GPUCMD_ENOKERNEL;
	}
	rc = cuda_builtin_load(cd);
	if (rc)
		return rc;
	all = builtin_all(&count);
	index = (size_t)(k - all);
	if (!cd->builtin_fns) {
		cd->builtin_fns = calloc(count, sizeof(*cd->builtin_fns));
		if (!cd->builtin_fns) {
			cuda_set_error(cd, "out of host memory for built-ins");
			return -ENOMEM;
		}
		cd->builtin_count = count;
	}
	if (!cd->builtin_fns[index]) {
		rc = cuda_function_get(cd, cd->builtin_module, k->name,
				       &cd->builtin_fns[index]);
		if (rc)
			return rc;
	}
	*out = cd->builtin_fns[index];
	return 0;
}

/* ---- launch and graphs ------------------------------------------------- */

/* A failed launch is GPUCMD_ELAUNCH unless the context is lost. */
static int cuda_launch_fail(struct cuda_driver *cd, const char *call,
			    CUresult r)
{
	int rc = cuda_fail(cd, call, r);

	return rc == GPUCMD_ESTREAM ? rc : GPUCMD_ELAUNCH;
}

/*
 * Look up f's parameters once (cuFuncGetParamInfo): the driver reads
 * kernelParams[i] for every parameter the kernel has, and as many bytes
 * as each one takes, whatever the caller passed.  Unchecked, a client
 * that gives a module's kernel fewer arguments than it takes makes the
 * driver dereference whatever lies past the daemon's array (a crash, or
 * daemon memory sent to the kernel), and a kernel that then runs with a
 * garbage count can fault and lose the context for every service.
 *
 * An index past the last parameter is CUDA_ERROR_INVALID_VALUE, which is
 * how the count is found.  The driver's answer replaces what the module
 * image declares (cuda_function_image_params): it describes the code it
 * loaded.  Where the driver cannot say (older than CUDA 12.4, or any
 * other refusal), the image's declaration is checked, when it could be
 * read; else nothing is, as before.
 */
/*
 * The image's declaration against the driver's answer, in the debug log:
 * only drivers without cuFuncGetParamInfo check launches against the
 * image, so a GPU with one is where module_image's reading of real
 * cubins and PTX is compared with the driver's (tests/gpu/run.sh).
 */
static void cuda_params_compare(const struct driver_function *f,
				const size_t *sizes, size_t n)
{
	bool same = f->nparams == n;

	for (size_t i = 0; same && i < n; i++)
		same = f->param_size[i] == sizes[i];
	log_debug("kernel %s: the module image declares %zu parameters, "
		  "the driver %zu: %s",
		  f->name, f->nparams, n,
		  same ? "they agree" : "they disagree");
}

static int cuda_function_params(struct cuda_driver *cd,
				struct driver_function *f)
{
	size_t *sizes = NULL;
	size_t n = 0, cap = 0;

	if (f->params_looked_up)
		return 0;
	if (!cd->cu.cuFuncGetParamInfo) {
		f->params_looked_up = true;
		return 0; /* the image's, if any */
	}
	for (;;) {
		size_t offset = 0, size = 0;
		CUresult r = cd->cu.cuFuncGetParamInfo(f->function, n, &offset,
						       &size);

		if (r == CUDA_ERROR_INVALID_VALUE)
			break;
		if (r != CUDA_SUCCESS) {
			free(sizes);
			if (cuda_is_sticky(r))
				return cuda_launch_fail(cd,
							"cuFuncGetParamInfo",
							r);
			f->params_looked_up = true;
			return 0; /* the image's, if any */
		}
		if (n == cap) {
			size_t *more;

			cap = cap ? cap * 2 : 8;
			more = realloc(sizes, cap * sizeof(*sizes));
			if (!more) {
				free(sizes);
				cuda_set_error(cd,
					       "out of host memory for "
					       "the parameters of kernel %s",
					       f->name);
				return -ENOMEM;
			}
			sizes = more;
		}
		sizes[n++] = size;
	}
	if (f->params_known)
		cuda_params_compare(f, sizes, n);
	free(f->param_size);
	f->param_size = sizes;
	f->nparams = n;
	f->params_known = true;
	f->params_looked_up = true;
	return 0;
}

/*
 * A value of given bytes for a parameter of want bytes: the same size, or
 * a 32-bit value for a narrower parameter (the smallest value the wire
 * carries; the driver reads its low bytes).
 */
static bool cuda_param_fits(size_t given, size_t want)
{
	return given == want || (want < 4 && given == 4);
}

/*
 * The most parameter bytes a kernel may declare (CUDA 12.1 on Volta and
 * later; 4096 before), so also the most parameters: each takes a byte at
 * least.
 */
#define CUDA_PARAM_BYTES_MAX 32764

/*
 * kernelParams for a launch of a kernel whose parameters neither the
 * driver (cuFuncGetParamInfo) nor the module image could tell.  The
 * driver reads one slot per parameter the kernel declares, whatever the
 * client sent: past the client's arguments it would read the device
 * thread's stack and whatever those slots point at, and hand that to the
 * kernel.  Here every slot past them points at zeros, so a kernel given
 * too few arguments reads 0s.  NULL when the host has no memory for the
 * table (the launch is refused).
 */
static void **cuda_padded_params(struct cuda_driver *cd, void **params,
				 size_t nparams)
{
	if (!cd->pad_params) {
		cd->pad_zero = calloc(1, CUDA_PARAM_BYTES_MAX);
		cd->pad_params =
			malloc(CUDA_PARAM_BYTES_MAX * sizeof(*cd->pad_params));
		if (!cd->pad_zero || !cd->pad_params) {
			free(cd->pad_zero);
			free(cd->pad_params);
			cd->pad_zero = NULL;
			cd->pad_params = NULL;
			return NULL;
		}
		for (size_t i = 0; i < CUDA_PARAM_BYTES_MAX; i++)
			cd->pad_params[i] = cd->pad_zero;
	}
	memcpy(cd->pad_params, params, nparams * sizeof(*params));
	return cd->pad_params;
}

/* The table back to zeros, so that no launch reads another's arguments. */
static void cuda_padded_params_clear(struct cuda_driver *cd, size_t nparams)
{
	for (size_t i = 0; i < nparams; i++)
		cd->pad_params[i] = cd->pad_zero;
}

static int cuda_launch(struct driver *d, struct driver_stream *s,
		       struct driver_function *f, const uint32_t grid[3],
		       const uint32_t block[3], uint32_t shared_bytes,
		       void **params, const size_t *param_sizes, size_t nparams)
{
	struct cuda_driver *cd = cuda_of(d);
	CUresult r;
	int rc;

	rc = cuda_function_params(cd, f);
	if (rc)
		return rc;
	if (f->params_known && nparams != f->nparams) {
		cuda_set_error(cd, "kernel %s takes %zu argument%s, not %zu",
			       f->name, f->nparams, f->nparams == 1 ? "" : "s",
			       nparams);
		return GPUCMD_EINVAL;
	}
	for (size_t i = 0; f->params_known && i < nparams; i++) {
		if (!params[i] ||
		    !cuda_param_fits(param_sizes[i], f->param_size[i])) {
			cuda_set_error(cd,
				       "argument %zu of kernel %s is a "
				       "value of %zu bytes, but the kernel's "
				       "parameter %zu takes %zu",
				       i, f->name, param_sizes[i], i,
				       f->param_size[i]);
			return GPUCMD_EINVAL;
		}
	}
	if (shared_bytes > cd->base.props.max_shared_bytes) {
		cuda_set_error(cd,
			       "kernel %s asks for %u bytes of dynamic "
			       "shared memory, more than the %u a block of "
			       "this device may have",
			       f->name, shared_bytes,
			       cd->base.props.max_shared_bytes);
		return GPUCMD_ELAUNCH;
	}

	/* Above 48 KiB a function must be allowed its dynamic shared memory
	 * first; the limit only grows, so it is set once per size step. */
	if (shared_bytes > CUDA_DEFAULT_SHARED_BYTES &&
	    shared_bytes > f->shared_limit) {
		r = cd->cu.cuFuncSetAttribute(
			f->function,
			CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
			(int)shared_bytes);
		if (r != CUDA_SUCCESS) {
			char call[128];

			snprintf(call, sizeof(call),
				 "cuFuncSetAttribute(%s, "
				 "MAX_DYNAMIC_SHARED_SIZE_BYTES, %u)",
				 f->name, shared_bytes);
			return cuda_launch_fail(cd, call, r);
		}
		f->shared_limit = shared_bytes;
	}
	if (!f->params_known) {
		params = cuda_padded_params(cd, params, nparams);
		if (!params) {
			cuda_set_error(cd,
				       "out of host memory to launch kernel "
				       "%s, whose parameters cannot be checked",
				       f->name);
			return -ENOMEM;
		}
	}
	/* The driver copies the values at the call. */
	r = cd->cu.cuLaunchKernel(f->function, grid[0], grid[1], grid[2],
				  block[0], block[1], block[2], shared_bytes,
				  s->stream,
				  nparams || !f->params_known ? params : NULL,
				  NULL);
	if (!f->params_known)
		cuda_padded_params_clear(cd, nparams);
	if (r != CUDA_SUCCESS) {
		/* The numbers the driver judged, for the client. */
		char call[160];

		snprintf(call, sizeof(call),
			 "cuLaunchKernel of %s (grid "
			 "%ux%ux%u, block %ux%ux%u, %u bytes of shared memory)",
			 f->name, grid[0], grid[1], grid[2], block[0], block[1],
			 block[2], shared_bytes);
		return cuda_launch_fail(cd, call, r);
	}
	return 0;
}

static int cuda_capture_begin(struct driver *d, struct driver_stream *s)
{
	struct cuda_driver *cd = cuda_of(d);
	int rc;

	if (s->capturing) {
		cuda_set_error(cd, "the stream is already being captured");
		return GPUCMD_EINVAL;
	}
	/*
	 * Relaxed: other threads' and other streams' calls that are unsafe
	 * during a capture (cuMemAlloc, synchronous copies) stay allowed.
	 * Only this stream is recorded, and the device thread is the only
	 * caller anyway.
	 */
	rc = CU_CHECK(cd, cuStreamBeginCapture, s->stream,
		      CU_STREAM_CAPTURE_MODE_RELAXED);
	if (rc)
		return rc;
	s->capturing = true;
	return 0;
}

static int cuda_capture_end(struct driver *d, struct driver_stream *s,
			    struct driver_graph **out)
{
	struct cuda_driver *cd = cuda_of(d);
	struct driver_graph *g;
	CUgraphExec exec = NULL;
	CUgraph graph = NULL;
	int rc;

	if (!s->capturing) {
		cuda_set_error(cd, "the stream is not being captured");
		return GPUCMD_EINVAL;
	}
	/* The capture ends here whatever happens next. */
	s->capturing = false;
	rc = CU_CHECK(cd, cuStreamEndCapture, s->stream, &graph);
	if (rc) {
		if (graph)
			cd->cu.cuGraphDestroy(graph);
		return rc;
	}
	rc = CU_CHECK(cd, cuGraphInstantiateWithFlags, &exec, graph, 0);
	/* The executable graph is a copy: the template is not needed. */
	cd->cu.cuGraphDestroy(graph);
	if (rc)
		return rc;
	g = calloc(1, sizeof(*g));
	if (!g) {
		cd->cu.cuGraphExecDestroy(exec);
		cuda_set_error(cd, "out of host memory for a graph");
		return -ENOMEM;
	}
	g->exec = exec;
	*out = g;
	return 0;
}

static int cuda_graph_launch(struct driver *d, struct driver_graph *g,
			     struct driver_stream *s)
{
	struct cuda_driver *cd = cuda_of(d);
	CUresult r = cd->cu.cuGraphLaunch(g->exec, s->stream);

	if (r != CUDA_SUCCESS)
		return cuda_launch_fail(cd, "cuGraphLaunch", r);
	return 0;
}

static void cuda_graph_destroy(struct driver *d, struct driver_graph *g)
{
	struct cuda_driver *cd = cuda_of(d);

	if (!g)
		return;
	CU_CHECK(cd, cuGraphExecDestroy, g->exec);
	free(g);
}

static const struct driver_ops cuda_ops = {
	.name = "cuda",
	.open = cuda_open,
	.close = cuda_close,
	.stream_create = cuda_stream_create,
	.stream_destroy = cuda_stream_destroy,
	.event_create = cuda_event_create,
	.event_destroy = cuda_event_destroy,
	.event_record = cuda_event_record,
	.event_wait = cuda_event_wait,
	.event_query = cuda_event_query,
	.event_elapsed = cuda_event_elapsed,
	.host_callback = cuda_host_callback,
	.mem_alloc = cuda_mem_alloc,
	.mem_free = cuda_mem_free,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
	.host_register = cuda_host_register,
	.host_unregister = cuda_host_unregister,
	.copy_htod = cuda_copy_htod,
	.copy_dtoh = cuda_copy_dtoh,
	.copy_dtod = cuda_copy_dtod,
	.copy_htod_2d = cuda_copy_htod_2d,
	.copy_dtoh_2d = cuda_copy_dtoh_2d,
	.memset_d8 = cuda_memset_d8,
	.mem_info = cuda_mem_info,
	.module_load = cuda_module_load,
	.module_load_shared = cuda_module_load_shared,
	.module_static_bytes = cuda_module_static_bytes,
	.module_unload = cuda_module_unload,
	.module_function = cuda_module_function,
	.builtin_function = cuda_builtin_function,
	.launch = cuda_launch,
	.capture_begin = cuda_capture_begin,
	.capture_end = cuda_capture_end,
	.graph_launch = cuda_graph_launch,
	.graph_destroy = cuda_graph_destroy,
};

/* ---- creation ---------------------------------------------------------- */

/*
 * Fails fast, with GPUCMD_EUNSUPPORTED and a sentence in why, wherever no
 * CUDA device can be used, so that --backend auto can fall back to host.
 * May run on any thread; open must then run on the device thread.
 */
int driver_cuda_create(struct driver_options *opt, struct driver **out,
		       char *why, size_t why_len)
{
	char msg[sizeof(((struct driver *)0)->error)];
	char what[256];
	int device = opt ? opt->device : 0;
	struct cuda_driver *cd;
	const char *missing;
	CUresult r;
	int count = 0;

	cd = calloc(1, sizeof(*cd));
	if (!cd) {
		snprintf(msg, sizeof(msg), "out of host memory");
		if (why && why_len)
			snprintf(why, why_len, "%s", msg);
		return -ENOMEM;
	}
	cd->base.ops = &cuda_ops;

	cd->libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!cd->libcuda) {
		const char *err = dlerror();

		snprintf(msg, sizeof(msg),
			 "cannot load libcuda.so.1 (%s): the NVIDIA driver is "
			 "not installed, or its library is not on the loader "
			 "path",
			 err ? err : "not found");
		goto fail;
	}
	missing = cuda_resolve(cd);
	if (missing) {
		snprintf(msg, sizeof(msg),
			 "libcuda.so.1 has no %s: this NVIDIA driver is too "
			 "old for gpucmdd (it needs CUDA 11.4 or newer)",
			 missing);
		/* Nothing of the driver ran yet, so it may be unloaded. */
		dlclose(cd->libcuda);
		goto fail;
	}
	/* From here on libcuda stays loaded (see cuda_close). */
	r = cd->cu.cuInit(0);
	if (r != CUDA_SUCCESS) {
		cuda_describe(&cd->cu, r, what, sizeof(what));
		snprintf(msg, sizeof(msg),
			 "cuInit failed: %s: no usable CUDA device (is the "
			 "NVIDIA kernel module loaded, and may this user open "
			 "/dev/nvidia*?)",
			 what);
		goto fail;
	}
	r = cd->cu.cuDeviceGetCount(&count);
	if (r != CUDA_SUCCESS) {
		cuda_describe(&cd->cu, r, what, sizeof(what));
		snprintf(msg, sizeof(msg), "cuDeviceGetCount failed: %s", what);
		goto fail;
	}
	if (count <= 0) {
		snprintf(msg, sizeof(msg),
			 "the NVIDIA driver sees no CUDA device");
		goto fail;
	}
	if (opt != NULL && opt->device_id != NULL &&
	    opt->device_id[0] != '\0') {
		device = cuda_find_device(cd, opt->device_id, count, msg,
					  sizeof(msg));
		if (device < 0)
			goto fail;
		opt->device = device;
	}
	if (device < 0 || device >= count) {
		snprintf(msg, sizeof(msg),
			 "CUDA device %d does not exist: this machine has %d "
			 "(numbered from 0)",
			 device, count);
		goto fail;
	}
	cd->device_count = count;
	pthread_mutex_init(&cd->module_lock, NULL);
	pthread_mutex_init(&cd->reaper.lock, NULL);
	pthread_cond_init(&cd->reaper.work, NULL);
	pthread_cond_init(&cd->reaper.done, NULL);
	*out = &cd->base;
	return 0;

fail:
	if (why && why_len)
		snprintf(why, why_len, "%s", msg);
	free(cd);
	return GPUCMD_EUNSUPPORTED;
}

#endif /* GPUCMD_HAVE_CUDA */
