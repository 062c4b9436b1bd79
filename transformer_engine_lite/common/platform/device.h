// GPU platform layer: the only place for runtime headers, warp-size facts, shuffles, atomics and
// inline asm. Kernels call these wrappers, so hipify is a mechanical rename of the rest. CUDA is the
// source language; `__HIP_PLATFORM_AMD__` branches hold what AMD needs differently (64-lane
// wavefronts on CDNA, no *_sync shuffles in HIP 5.x).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "host_device.h"

namespace nvte {

#if defined(__HIP_PLATFORM_AMD__)
constexpr int kWarpSize = 64;  // CDNA (gfx90a, gfx94x) wavefront
#else
constexpr int kWarpSize = 32;
#endif

// Launch bounds with a minimum number of resident blocks per SM, for register-heavy kernels. CUDA:
// registers are capped at 64K / (threads * min_blocks), and ptxas stops choosing an occupancy of
// its own (without the minimum it aims at what shared memory allows and spills to get there). HIP
// reads the second argument as waves per execution unit, a different quantity: AMD gets the thread
// bound only and sizes VGPRs from it (min_blocks is still evaluated, so it counts as used).
#if defined(__HIP_PLATFORM_AMD__)
#define NVTE_LAUNCH_BOUNDS(threads, min_blocks) \
  __launch_bounds__((static_cast<void>(min_blocks), (threads)))
#else
#define NVTE_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads, min_blocks)
#endif

template <typename T>
__device__ __forceinline__ T warp_shfl_xor(T v, int lane_mask, int width = kWarpSize) {
#if defined(__HIP_PLATFORM_AMD__)
  return __shfl_xor(v, lane_mask, width);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
#endif
}

// The value of lane `src` of this lane's `width`-lane segment (src in [0, width)).
template <typename T>
__device__ __forceinline__ T warp_shfl_idx(T v, int src, int width = kWarpSize) {
#if defined(__HIP_PLATFORM_AMD__)
  return __shfl(v, src, width);
#else
  return __shfl_sync(0xffffffffu, v, src, width);
#endif
}

// Max over `width` consecutive lanes (a power of two <= kWarpSize); NaN propagates.
__device__ __forceinline__ float warp_reduce_max(float v, int width = kWarpSize) {
  for (int m = width / 2; m > 0; m /= 2) {
    const float o = warp_shfl_xor(v, m, width);
    v = (o > v || o != o) ? o : v;
  }
  return v;
}

// Max over `width` consecutive lanes of unsigned values, e.g. magnitude bit patterns (bits &
// 0x7FFFFFFF), which order like |x| with every NaN above +Inf: the exact integer max the CPU takes.
__device__ __forceinline__ uint32_t warp_reduce_max_u32(uint32_t v, int width = kWarpSize) {
  for (int m = width / 2; m > 0; m /= 2) {
    const uint32_t o = warp_shfl_xor(v, m, width);
    v = o > v ? o : v;
  }
  return v;
}

__device__ __forceinline__ float warp_reduce_sum(float v, int width = kWarpSize) {
  for (int m = width / 2; m > 0; m /= 2) v += warp_shfl_xor(v, m, width);
  return v;
}

// Block-wide reduction through shared memory; every thread gets the result. `scratch` holds at least
// blockDim.x / kWarpSize floats. Ends with a barrier, so `scratch` may be reused right after.
// The max starts from warp 0's value, not 0: right for values of any sign (softmax logits).
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float *scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int nwarps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  v = kMax ? warp_reduce_max(v) : warp_reduce_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float r = kMax ? scratch[0] : 0.0f;
  if (kMax) {
    for (int w = 1; w < nwarps; ++w) r = (scratch[w] > r || scratch[w] != scratch[w]) ? scratch[w] : r;
  } else {
    for (int w = 0; w < nwarps; ++w) r += scratch[w];  // fixed order: deterministic
  }
  __syncthreads();
  return r;
}

// amax accumulation: atomic max of |v| (v >= 0 or NaN) through its bit pattern. For non-negative
// floats the unsigned bit patterns order like the values, and a (positive) NaN pattern orders above
// +Inf, so NaN propagates.
__device__ __forceinline__ void atomic_max_abs(float *addr, float v) {
  const unsigned int bits = __float_as_uint(v) & 0x7FFFFFFFu;
  atomicMax(reinterpret_cast<unsigned int *>(addr), bits);
}

// fp32 accumulation into global memory (attention dQ). The order of the additions is not fixed, so
// the sum is not bitwise reproducible; callers that must be deterministic reduce another way.
__device__ __forceinline__ void atomic_add(float *addr, float v) { atomicAdd(addr, v); }

}  // namespace nvte
