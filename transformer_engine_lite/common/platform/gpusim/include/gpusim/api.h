// gpusim host API: the subset of the CUDA runtime API that the library's GPU glue and the GPU gtests
// call, implemented on the host by libnvte_gpusim.so (platform/gpusim/runtime.cpp). The HIP names
// (hip/hip_runtime.h) are aliases of these, so the CUDA sources and their hipified copies run on
// the same runtime instance.
//
// Semantics that matter for what the harness proves:
//  - device memory is host memory from malloc, exactly the size asked (ASan builds put red zones
//    right after it), filled with a pattern (GPUSIM_FILL, default 0xFF: NaN / -1) so a kernel that
//    reads memory nobody wrote shows it in its results;
//  - streams are in-order queues: launches, memsets, async copies and async frees are enqueued and
//    run at the next synchronisation point (stream/device synchronise, a synchronous copy, a
//    synchronous free), so host code that reads results without synchronising reads stale bytes,
//    as it can on a GPU;
//  - asynchronous allocation allocates at the call (the pointer is usable at once, as CUDA's is).
#pragma once

#include <cstddef>
#include <cstdint>

#define GPUSIM_API __attribute__((visibility("default")))

// ---------------------------------------------------------------------------------- types
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchOutOfResources = 701,
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1)
      : x(vx), y(vy), z(vz) {}
};

struct cudaDeviceProp {
  char name[256];
  char gcnArchName[256];  // ROCm's field: "gfx90a" (OCP FP8, what gpusim's kernels compute)
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  size_t sharedMemPerBlockOptin;
  int warpSize;
  int maxThreadsPerBlock;
  int maxThreadsDim[3];
  int maxGridSize[3];
  int major;
  int minor;
  int multiProcessorCount;
};

struct GpusimStream;
typedef GpusimStream *cudaStream_t;
struct GpusimEvent;
typedef GpusimEvent *cudaEvent_t;

// ------------------------------------------------------------------------------ functions
extern "C" {
GPUSIM_API cudaError_t cudaGetDeviceCount(int *count);
GPUSIM_API cudaError_t cudaGetDevice(int *device);
GPUSIM_API cudaError_t cudaSetDevice(int device);
GPUSIM_API cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int device);
GPUSIM_API cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
GPUSIM_API cudaError_t cudaDeviceSynchronize(void);
GPUSIM_API cudaError_t cudaGetLastError(void);
GPUSIM_API cudaError_t cudaPeekAtLastError(void);
GPUSIM_API const char *cudaGetErrorString(cudaError_t error);
GPUSIM_API const char *cudaGetErrorName(cudaError_t error);

GPUSIM_API cudaError_t cudaMalloc(void **ptr, size_t bytes);
GPUSIM_API cudaError_t cudaFree(void *ptr);
GPUSIM_API cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t stream);
GPUSIM_API cudaError_t cudaFreeAsync(void *ptr, cudaStream_t stream);
GPUSIM_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
GPUSIM_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                                       cudaMemcpyKind kind, cudaStream_t stream);
GPUSIM_API cudaError_t cudaMemset(void *ptr, int value, size_t bytes);
GPUSIM_API cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t stream);

GPUSIM_API cudaError_t cudaStreamCreate(cudaStream_t *stream);
GPUSIM_API cudaError_t cudaStreamDestroy(cudaStream_t stream);
GPUSIM_API cudaError_t cudaStreamSynchronize(cudaStream_t stream);
GPUSIM_API cudaError_t cudaEventCreate(cudaEvent_t *event);
GPUSIM_API cudaError_t cudaEventDestroy(cudaEvent_t event);
GPUSIM_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
GPUSIM_API cudaError_t cudaEventSynchronize(cudaEvent_t event);
GPUSIM_API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
GPUSIM_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags);
GPUSIM_API cudaError_t cudaFuncSetAttribute(const void *func, int attr, int value);
}

// The warp width of the runtime (32: CUDA flavour, 64: ROCm flavour; fixed per build).
#ifndef GPUSIM_WARP_SIZE
#if defined(__HIP_PLATFORM_AMD__)
#define GPUSIM_WARP_SIZE 64
#else
#define GPUSIM_WARP_SIZE 32
#endif
#endif
