/*
 * cuda_api.h - the part of the CUDA driver API that the CUDA backend uses,
 * declared here so that the backend builds without the CUDA toolkit.
 *
 * The daemon never links libcuda: it opens libcuda.so.1 at run time
 * (cuda.c), so all it needs at build time are the types, the constants and
 * the prototypes of the entry points it looks up.  Distributions ship
 * gpucmd without NVIDIA's headers (they are not free software), and a
 * gpucmdd built without its CUDA backend could never use a GPU.  This is
 * the interface only, written from the documented ABI: handles are pointers
 * to opaque structs, CUresult is an int-sized enum, and the versioned entry
 * points (cuMemAlloc_v2 ...) are what cuda.h maps the plain names to.
 *
 * tests/unit/check_cuda_api.c includes the real cuda.h and then this file
 * with CUDA_API_VERIFY defined: every constant, prototype, symbol name and
 * the layout of CUDA_MEMCPY2D are then checked against NVIDIA's, at compile
 * time and when it runs.  It is built wherever cuda.h is found.
 *
 * Each list is X(...) of what the backend uses and nothing more; adding a
 * call to cuda.c means adding it here, where the check sees it.
 */
#pragma once

#include <stddef.h>

/* Constants: X(name, value), one list per enum of cuda.h. */
#define CUDA_API_RESULTS(X)                               \
	X(CUDA_SUCCESS, 0)                                \
	X(CUDA_ERROR_INVALID_VALUE, 1)                    \
	X(CUDA_ERROR_OUT_OF_MEMORY, 2)                    \
	X(CUDA_ERROR_STUB_LIBRARY, 34)                    \
	X(CUDA_ERROR_NO_DEVICE, 100)                      \
	X(CUDA_ERROR_INVALID_DEVICE, 101)                 \
	X(CUDA_ERROR_INVALID_IMAGE, 200)                  \
	X(CUDA_ERROR_INVALID_CONTEXT, 201)                \
	X(CUDA_ERROR_NO_BINARY_FOR_GPU, 209)              \
	X(CUDA_ERROR_ECC_UNCORRECTABLE, 214)              \
	X(CUDA_ERROR_INVALID_PTX, 218)                    \
	X(CUDA_ERROR_NVLINK_UNCORRECTABLE, 220)           \
	X(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, 221)         \
	X(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, 222)        \
	X(CUDA_ERROR_JIT_COMPILATION_DISABLED, 223)       \
	X(CUDA_ERROR_CONTAINED, 226)                      \
	X(CUDA_ERROR_INVALID_SOURCE, 300)                 \
	X(CUDA_ERROR_INVALID_HANDLE, 400)                 \
	X(CUDA_ERROR_ILLEGAL_STATE, 401)                  \
	X(CUDA_ERROR_NOT_FOUND, 500)                      \
	X(CUDA_ERROR_NOT_READY, 600)                      \
	X(CUDA_ERROR_ILLEGAL_ADDRESS, 700)                \
	X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, 701)        \
	X(CUDA_ERROR_LAUNCH_TIMEOUT, 702)                 \
	X(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, 703)  \
	X(CUDA_ERROR_ASSERT, 710)                         \
	X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, 712) \
	X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, 713)     \
	X(CUDA_ERROR_HARDWARE_STACK_ERROR, 714)           \
	X(CUDA_ERROR_ILLEGAL_INSTRUCTION, 715)            \
	X(CUDA_ERROR_MISALIGNED_ADDRESS, 716)             \
	X(CUDA_ERROR_INVALID_ADDRESS_SPACE, 717)          \
	X(CUDA_ERROR_INVALID_PC, 718)                     \
	X(CUDA_ERROR_LAUNCH_FAILED, 719)                  \
	X(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, 720)   \
	X(CUDA_ERROR_TENSOR_MEMORY_LEAK, 721)             \
	X(CUDA_ERROR_NOT_PERMITTED, 800)                  \
	X(CUDA_ERROR_NOT_SUPPORTED, 801)                  \
	X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, 803)         \
	X(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, 804) \
	X(CUDA_ERROR_MPS_CLIENT_TERMINATED, 810)          \
	X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, 900)     \
	X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, 901)     \
	X(CUDA_ERROR_STREAM_CAPTURE_MERGE, 902)           \
	X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, 903)       \
	X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, 904)        \
	X(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, 905)       \
	X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 906)        \
	X(CUDA_ERROR_CAPTURED_EVENT, 907)                 \
	X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, 908)    \
	X(CUDA_ERROR_EXTERNAL_DEVICE, 911)

#define CUDA_API_DEVICE_ATTRIBUTES(X)                       \
	X(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1)     \
	X(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 2)           \
	X(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 3)           \
	X(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 4)           \
	X(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 5)            \
	X(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 6)            \
	X(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 7)            \
	X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 75) \
	X(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 76) \
	X(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 97)

#define CUDA_API_FUNCTION_ATTRIBUTES(X) \
	X(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 8)

#define CUDA_API_JIT_OPTIONS(X)       \
	X(CU_JIT_ERROR_LOG_BUFFER, 5) \
	X(CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, 6)

#define CUDA_API_MEMORY_TYPES(X) \
	X(CU_MEMORYTYPE_HOST, 1) \
	X(CU_MEMORYTYPE_DEVICE, 2)

#define CUDA_API_CAPTURE_MODES(X) X(CU_STREAM_CAPTURE_MODE_RELAXED, 2)

/* Flags, plain numbers in the calls that take them. */
#define CUDA_API_FLAGS(X)              \
	X(CU_EVENT_DEFAULT, 0)         \
	X(CU_EVENT_WAIT_DEFAULT, 0)    \
	X(CU_STREAM_NON_BLOCKING, 1)   \
	X(CU_MEMHOSTALLOC_PORTABLE, 1) \
	X(CU_MEMHOSTREGISTER_PORTABLE, 1)

/* CUDA_MEMCPY2D's fields, in order: X(type, name). */
#define CUDA_API_MEMCPY2D_FIELDS(X)    \
	X(size_t, srcXInBytes)         \
	X(size_t, srcY)                \
	X(CUmemorytype, srcMemoryType) \
	X(const void *, srcHost)       \
	X(CUdeviceptr, srcDevice)      \
	X(CUarray, srcArray)           \
	X(size_t, srcPitch)            \
	X(size_t, dstXInBytes)         \
	X(size_t, dstY)                \
	X(CUmemorytype, dstMemoryType) \
	X(void *, dstHost)             \
	X(CUdeviceptr, dstDevice)      \
	X(CUarray, dstArray)           \
	X(size_t, dstPitch)            \
	X(size_t, WidthInBytes)        \
	X(size_t, Height)

/*
 * Entry points: X(name the code uses, symbol in libcuda, parameters).  The
 * symbol is the versioned one cuda.h maps the name to.
 */
/* clang-format off */
#define CUDA_API_ENTRY_POINTS(X)					\
	X(cuGetErrorName, cuGetErrorName,				\
	  (CUresult error, const char **pStr))				\
	X(cuGetErrorString, cuGetErrorString,				\
	  (CUresult error, const char **pStr))				\
	X(cuInit, cuInit, (unsigned int Flags))				\
	X(cuDeviceGetCount, cuDeviceGetCount, (int *count))		\
	X(cuDeviceGet, cuDeviceGet, (CUdevice *device, int ordinal))	\
	X(cuDeviceGetName, cuDeviceGetName,				\
	  (char *name, int len, CUdevice dev))				\
	X(cuDeviceGetUuid, cuDeviceGetUuid_v2,				\
	  (CUuuid *uuid, CUdevice dev))					\
	X(cuDeviceGetPCIBusId, cuDeviceGetPCIBusId,			\
	  (char *pciBusId, int len, CUdevice dev))			\
	X(cuDeviceGetByPCIBusId, cuDeviceGetByPCIBusId,			\
	  (CUdevice *dev, const char *pciBusId))			\
	X(cuDeviceGetAttribute, cuDeviceGetAttribute,			\
	  (int *pi, CUdevice_attribute attrib, CUdevice dev))		\
	X(cuDeviceTotalMem, cuDeviceTotalMem_v2,			\
	  (size_t *bytes, CUdevice dev))				\
	X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain,		\
	  (CUcontext *pctx, CUdevice dev))				\
	X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2,	\
	  (CUdevice dev))						\
	X(cuCtxSetCurrent, cuCtxSetCurrent, (CUcontext ctx))		\
	X(cuCtxSynchronize, cuCtxSynchronize, (void))			\
	X(cuMemGetInfo, cuMemGetInfo_v2, (size_t *free, size_t *total))	\
	X(cuMemAlloc, cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytesize)) \
	X(cuMemFree, cuMemFree_v2, (CUdeviceptr dptr))			\
	X(cuMemHostAlloc, cuMemHostAlloc,				\
	  (void **pp, size_t bytesize, unsigned int Flags))		\
	X(cuMemFreeHost, cuMemFreeHost, (void *p))			\
	X(cuMemHostRegister, cuMemHostRegister_v2,			\
	  (void *p, size_t bytesize, unsigned int Flags))		\
	X(cuMemHostUnregister, cuMemHostUnregister, (void *p))		\
	X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2,			\
	  (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,	\
	   CUstream hStream))						\
	X(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2,			\
	  (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,	\
	   CUstream hStream))						\
	X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2,			\
	  (CUdeviceptr dstDevice, CUdeviceptr srcDevice,		\
	   size_t ByteCount, CUstream hStream))				\
	X(cuMemcpy2DAsync, cuMemcpy2DAsync_v2,				\
	  (const CUDA_MEMCPY2D *pCopy, CUstream hStream))		\
	X(cuMemsetD8Async, cuMemsetD8Async,				\
	  (CUdeviceptr dstDevice, unsigned char uc, size_t N,		\
	   CUstream hStream))						\
	X(cuStreamCreate, cuStreamCreate,				\
	  (CUstream *phStream, unsigned int Flags))			\
	X(cuStreamDestroy, cuStreamDestroy_v2, (CUstream hStream))	\
	X(cuStreamWaitEvent, cuStreamWaitEvent,				\
	  (CUstream hStream, CUevent hEvent, unsigned int Flags))	\
	X(cuStreamAddCallback, cuStreamAddCallback,			\
	  (CUstream hStream, CUstreamCallback callback, void *userData,	\
	   unsigned int flags))						\
	X(cuLaunchHostFunc, cuLaunchHostFunc,				\
	  (CUstream hStream, CUhostFn fn, void *userData))		\
	X(cuStreamBeginCapture, cuStreamBeginCapture_v2,		\
	  (CUstream hStream, CUstreamCaptureMode mode))			\
	X(cuStreamEndCapture, cuStreamEndCapture,			\
	  (CUstream hStream, CUgraph *phGraph))				\
	X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags,	\
	  (CUgraphExec *phGraphExec, CUgraph hGraph,			\
	   unsigned long long flags))					\
	X(cuGraphLaunch, cuGraphLaunch,					\
	  (CUgraphExec hGraphExec, CUstream hStream))			\
	X(cuGraphExecDestroy, cuGraphExecDestroy, (CUgraphExec hGraphExec)) \
	X(cuGraphDestroy, cuGraphDestroy, (CUgraph hGraph))		\
	X(cuEventCreate, cuEventCreate,					\
	  (CUevent *phEvent, unsigned int Flags))			\
	X(cuEventDestroy, cuEventDestroy_v2, (CUevent hEvent))		\
	X(cuEventRecord, cuEventRecord, (CUevent hEvent, CUstream hStream)) \
	X(cuEventQuery, cuEventQuery, (CUevent hEvent))			\
	X(cuEventElapsedTime, cuEventElapsedTime_v2,			\
	  (float *pMilliseconds, CUevent hStart, CUevent hEnd))		\
	X(cuModuleLoadDataEx, cuModuleLoadDataEx,			\
	  (CUmodule *module, const void *image, unsigned int numOptions,	\
	   CUjit_option *options, void **optionValues))			\
	X(cuModuleUnload, cuModuleUnload, (CUmodule hmod))		\
	X(cuModuleGetFunction, cuModuleGetFunction,			\
	  (CUfunction *hfunc, CUmodule hmod, const char *name))		\
	X(cuFuncSetAttribute, cuFuncSetAttribute,			\
	  (CUfunction hfunc, CUfunction_attribute attrib, int value))	\
	X(cuFuncGetParamInfo, cuFuncGetParamInfo,			\
	  (CUfunction func, size_t paramIndex, size_t *paramOffset,	\
	   size_t *paramSize))						\
	X(cuLaunchKernel, cuLaunchKernel,				\
	  (CUfunction f, unsigned int gridDimX, unsigned int gridDimY,	\
	   unsigned int gridDimZ, unsigned int blockDimX,		\
	   unsigned int blockDimY, unsigned int blockDimZ,		\
	   unsigned int sharedMemBytes, CUstream hStream,		\
	   void **kernelParams, void **extra))
/* clang-format on */

/* Handles: X(typedef, its opaque struct). */
#define CUDA_API_HANDLES(X)      \
	X(CUcontext, CUctx_st)   \
	X(CUmodule, CUmod_st)    \
	X(CUfunction, CUfunc_st) \
	X(CUarray, CUarray_st)   \
	X(CUevent, CUevent_st)   \
	X(CUstream, CUstream_st) \
	X(CUgraph, CUgraph_st)   \
	X(CUgraphExec, CUgraphExec_st)

#ifndef CUDA_API_VERIFY

#define CUDA_API_ENUMERATOR(name, value) name = value,
#define CUDA_API_HANDLE(type, tag) typedef struct tag *type;
#define CUDA_API_FIELD_DECL(type, name) type name;
#define CUDA_API_PROTOTYPE(name, symbol, params) CUresult symbol params;

/* The plain names of versioned entry points, as cuda.h maps them. */
#define cuDeviceGetUuid cuDeviceGetUuid_v2
#define cuDeviceTotalMem cuDeviceTotalMem_v2
#define cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease_v2
#define cuMemGetInfo cuMemGetInfo_v2
#define cuMemAlloc cuMemAlloc_v2
#define cuMemFree cuMemFree_v2
#define cuMemHostRegister cuMemHostRegister_v2
#define cuMemcpyHtoDAsync cuMemcpyHtoDAsync_v2
#define cuMemcpyDtoHAsync cuMemcpyDtoHAsync_v2
#define cuMemcpyDtoDAsync cuMemcpyDtoDAsync_v2
#define cuMemcpy2DAsync cuMemcpy2DAsync_v2
#define cuStreamDestroy cuStreamDestroy_v2
#define cuStreamBeginCapture cuStreamBeginCapture_v2
#define cuEventDestroy cuEventDestroy_v2
#define cuEventElapsedTime cuEventElapsedTime_v2

#define CUDA_CB

typedef enum cudaError_enum { CUDA_API_RESULTS(CUDA_API_ENUMERATOR) } CUresult;
typedef enum CUdevice_attribute_enum {
	CUDA_API_DEVICE_ATTRIBUTES(CUDA_API_ENUMERATOR)
} CUdevice_attribute;
typedef enum CUfunction_attribute_enum {
	CUDA_API_FUNCTION_ATTRIBUTES(CUDA_API_ENUMERATOR)
} CUfunction_attribute;
typedef enum CUjit_option_enum {
	CUDA_API_JIT_OPTIONS(CUDA_API_ENUMERATOR)
} CUjit_option;
typedef enum CUmemorytype_enum {
	CUDA_API_MEMORY_TYPES(CUDA_API_ENUMERATOR)
} CUmemorytype;
typedef enum CUstreamCaptureMode_enum {
	CUDA_API_CAPTURE_MODES(CUDA_API_ENUMERATOR)
} CUstreamCaptureMode;
enum { CUDA_API_FLAGS(CUDA_API_ENUMERATOR) };

typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef struct CUuuid_st {
	char bytes[16];
} CUuuid;
CUDA_API_HANDLES(CUDA_API_HANDLE)

typedef void(CUDA_CB *CUstreamCallback)(CUstream hStream, CUresult status,
					void *userData);
typedef void(CUDA_CB *CUhostFn)(void *userData);

typedef struct CUDA_MEMCPY2D_st {
	CUDA_API_MEMCPY2D_FIELDS(CUDA_API_FIELD_DECL)
} CUDA_MEMCPY2D;

CUDA_API_ENTRY_POINTS(CUDA_API_PROTOTYPE)

#undef CUDA_API_ENUMERATOR
#undef CUDA_API_HANDLE
#undef CUDA_API_FIELD_DECL
#undef CUDA_API_PROTOTYPE

#endif /* !CUDA_API_VERIFY */
