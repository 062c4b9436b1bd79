// gpusim kernel language: what a .cu file needs from nvcc/hip-clang when it is compiled as plain C++
// by the host compiler and run on the gpusim runtime (runtime.cpp, scheduler.cpp). The sources reach
// the compiler through build_tools/gpusim.py, which rewrites the two constructs C++ cannot parse:
// `kernel<<<grid, block, smem, stream>>>(args)` becomes hipLaunchKernelGGL (torch's hipify engine
// does that rewrite) and `__shared__ T name[N];` becomes GPUSIM_SHARED(name, T[N]).
//
// Each GPU thread of a block is a fiber with its own stack; threadIdx & co. read the running fiber's
// coordinates. __syncthreads and every warp-level operation (shuffle, ballot, vote, __syncwarp)
// switch fibers, so the runtime can check that every thread of a block (warp) reaches the same
// barrier. Atomics are host atomics: blocks run on several host threads at once.
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "api.h"

// ------------------------------------------------------------------------ qualifiers
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __constant__ static

// -------------------------------------------------------------------------- vector types
struct uint3 {
  unsigned int x, y, z;
};
struct __attribute__((aligned(8))) float2 {
  float x, y;
};
struct __attribute__((aligned(16))) float4 {
  float x, y, z, w;
};
struct __attribute__((aligned(8))) int2 {
  int x, y;
};
struct __attribute__((aligned(16))) int4 {
  int x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
  unsigned int x, y;
};
struct __attribute__((aligned(16))) uint4 {
  unsigned int x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

static constexpr int warpSize = GPUSIM_WARP_SIZE;

namespace gpusim {

// --------------------------------------------------------------------- thread coordinates
struct Coords {
  uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
};
// The running GPU thread's coordinates (set by the scheduler before it resumes a fiber).
extern GPUSIM_API thread_local const Coords *tls_coords;

// ------------------------------------------------------------------- barriers and warps
GPUSIM_API void syncthreads(const char *file, int line);
enum class Shfl : int { kIdx, kUp, kDown, kXor, kBallot, kSyncWarp };
// One warp-level exchange: every live lane of the warp deposits `bits`, waits for the others, and
// gets the bits of the lane `kind`/`arg`/`width` select (kBallot: the OR of (bit != 0) << lane over
// the lanes of `mask`; kSyncWarp: 0). `mask` is the *_sync member mask (HIP spellings pass ~0).
GPUSIM_API uint64_t warp_op(Shfl kind, uint64_t bits, int arg, int width, uint64_t mask,
                            bool has_mask, const char *file, int line);

template <typename T>
inline T warp_shfl(Shfl kind, T v, int arg, int width, uint64_t mask, bool has_mask,
                   const char *file, int line) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value,
                "gpusim: shuffles move values of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = warp_op(kind, bits, arg, width, mask, has_mask, file, line);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// ------------------------------------------------------------------------- shared memory
// The block's static shared allocation for one declaration (`key` identifies it): allocated in the
// block's arena when the first thread reaches it, filled with the fill pattern, red zones around it
// in ASan builds. Every thread of the block gets the same address.
GPUSIM_API void *static_shared(const void *key, size_t bytes, size_t align, const char *name);
// The launch's dynamic shared memory (the `smem` launch argument), 16-byte aligned.
GPUSIM_API void *dynamic_shared();

// ------------------------------------------------------------------------------ launches
struct LaunchSpec {
  const char *kernel;  // the kernel expression as written at the launch
  const char *file;
  int line;
  dim3 grid, block;
  size_t dynamic_smem;
  cudaStream_t stream;
  int warp_size;  // of the translation unit that launches (must equal the runtime's)
  void (*entry)(void *ctx);  // runs one GPU thread: calls the kernel with the copied arguments
  void (*destroy)(void *ctx);
  void *ctx;
};
// Validates the configuration (cudaGetLastError reports a bad one), then enqueues the launch on its
// stream; takes ownership of spec.ctx either way.
GPUSIM_API cudaError_t launch(const LaunchSpec &spec);

template <typename... P, typename... A>
cudaError_t launch_kernel(const char *name, const char *file, int line, void (*kernel)(P...),
                          dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A &&...args) {
  static_assert(sizeof...(P) == sizeof...(A), "gpusim: kernel launched with a wrong argument count");
  // Kernel parameters are copied at the launch, as the GPU copies them to constant memory.
  struct Ctx {
    void (*kernel)(P...);
    std::tuple<std::decay_t<P>...> args;
  };
  LaunchSpec spec{name, file, line, grid, block, smem, stream, GPUSIM_WARP_SIZE,
                  [](void *c) {
                    Ctx *x = static_cast<Ctx *>(c);
                    std::apply(x->kernel, x->args);
                  },
                  [](void *c) { delete static_cast<Ctx *>(c); },
                  new Ctx{kernel, std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)}};
  return launch(spec);
}

}  // namespace gpusim

#define threadIdx (static_cast<const uint3 &>(::gpusim::tls_coords->thread_idx))
#define blockIdx (static_cast<const uint3 &>(::gpusim::tls_coords->block_idx))
#define blockDim (static_cast<const dim3 &>(::gpusim::tls_coords->block_dim))
#define gridDim (static_cast<const dim3 &>(::gpusim::tls_coords->grid_dim))

#define __syncthreads() ::gpusim::syncthreads(__FILE__, __LINE__)

// `kernel` is parenthesised by the launch rewrite, so template argument commas are safe.
#define hipLaunchKernelGGL(kernel, grid, block, smem, stream, ...) \
  ::gpusim::launch_kernel(#kernel, __FILE__, __LINE__, kernel, grid, block, smem, stream,    \
                          ##__VA_ARGS__)

// `__shared__ T name[N];` after build_tools/gpusim.py: a reference to the block's copy.
#define GPUSIM_SHARED(name, ...)                                                              \
  using name##_gpusim_type = __VA_ARGS__;                                                     \
  static const char name##_gpusim_key = 0;                                                    \
  name##_gpusim_type &name = *static_cast<name##_gpusim_type *>(::gpusim::static_shared(     \
      &name##_gpusim_key, sizeof(name##_gpusim_type), alignof(name##_gpusim_type), #name))
// `extern __shared__ T name[];` after torch's rewrite.
#define HIP_DYNAMIC_SHARED(type, name) type *name = static_cast<type *>(::gpusim::dynamic_shared());

// ------------------------------------------------------------------- shuffles and votes
#define GPUSIM_FULL_MASK (GPUSIM_WARP_SIZE == 64 ? ~0ull : 0xffffffffull)
template <typename T>
inline T gpusim_shfl_sync(unsigned long long mask, T v, int lane, int width, ::gpusim::Shfl k,
                          bool has_mask, const char *file, int line) {
  return ::gpusim::warp_shfl(k, v, lane, width, mask, has_mask, file, line);
}
#define __shfl_sync(mask, v, lane, ...)                                                       \
  gpusim_shfl_sync(mask, v, lane, GPUSIM_WIDTH(__VA_ARGS__), ::gpusim::Shfl::kIdx, true,      \
                   __FILE__, __LINE__)
#define __shfl_xor_sync(mask, v, lane_mask, ...)                                              \
  gpusim_shfl_sync(mask, v, lane_mask, GPUSIM_WIDTH(__VA_ARGS__), ::gpusim::Shfl::kXor, true, \
                   __FILE__, __LINE__)
#define __shfl_up_sync(mask, v, delta, ...)                                                   \
  gpusim_shfl_sync(mask, v, delta, GPUSIM_WIDTH(__VA_ARGS__), ::gpusim::Shfl::kUp, true,      \
                   __FILE__, __LINE__)
#define __shfl_down_sync(mask, v, delta, ...)                                                 \
  gpusim_shfl_sync(mask, v, delta, GPUSIM_WIDTH(__VA_ARGS__), ::gpusim::Shfl::kDown, true,    \
                   __FILE__, __LINE__)
#define __shfl(v, lane, ...)                                                                  \
  gpusim_shfl_sync(GPUSIM_FULL_MASK, v, lane, GPUSIM_WIDTH(__VA_ARGS__),                      \
                   ::gpusim::Shfl::kIdx, false, __FILE__, __LINE__)
#define __shfl_xor(v, lane_mask, ...)                                                         \
  gpusim_shfl_sync(GPUSIM_FULL_MASK, v, lane_mask, GPUSIM_WIDTH(__VA_ARGS__),                 \
                   ::gpusim::Shfl::kXor, false, __FILE__, __LINE__)
#define __shfl_up(v, delta, ...)                                                              \
  gpusim_shfl_sync(GPUSIM_FULL_MASK, v, delta, GPUSIM_WIDTH(__VA_ARGS__),                     \
                   ::gpusim::Shfl::kUp, false, __FILE__, __LINE__)
#define __shfl_down(v, delta, ...)                                                            \
  gpusim_shfl_sync(GPUSIM_FULL_MASK, v, delta, GPUSIM_WIDTH(__VA_ARGS__),                     \
                   ::gpusim::Shfl::kDown, false, __FILE__, __LINE__)
// The optional width argument (default: the whole warp).
#define GPUSIM_WIDTH(...) (::gpusim::width_or_warp(0, ##__VA_ARGS__))
namespace gpusim {
constexpr int width_or_warp(int) { return GPUSIM_WARP_SIZE; }
constexpr int width_or_warp(int, int width) { return width; }
}  // namespace gpusim

#define __ballot_sync(mask, pred)                                                             \
  ::gpusim::warp_op(::gpusim::Shfl::kBallot, (pred) ? 1u : 0u, 0, GPUSIM_WARP_SIZE, mask, true, \
                    __FILE__, __LINE__)
#define __ballot(pred)                                                                        \
  ::gpusim::warp_op(::gpusim::Shfl::kBallot, (pred) ? 1u : 0u, 0, GPUSIM_WARP_SIZE,           \
                    GPUSIM_FULL_MASK, false, __FILE__, __LINE__)
#define __any_sync(mask, pred) (__ballot_sync(mask, pred) != 0)
#define __all_sync(mask, pred) (__ballot_sync(mask, !(pred)) == 0)
#define __any(pred) (__ballot(pred) != 0)
#define __all(pred) (__ballot(!(pred)) == 0)
#define __syncwarp(...)                                                                        \
  ((void)::gpusim::warp_op(::gpusim::Shfl::kSyncWarp, 0, 0, GPUSIM_WARP_SIZE,                  \
                           ::gpusim::sync_mask(0, ##__VA_ARGS__), true, __FILE__, __LINE__))
namespace gpusim {
constexpr uint64_t sync_mask(int) { return GPUSIM_FULL_MASK; }
constexpr uint64_t sync_mask(int, uint64_t mask) { return mask; }
}  // namespace gpusim

// ------------------------------------------------------------------------------- atomics
// Host atomics on device (host) memory: relaxed, like the GPU's; blocks run concurrently.
inline unsigned int atomicMax(unsigned int *addr, unsigned int v) {
  unsigned int old = __atomic_load_n(addr, __ATOMIC_RELAXED);
  while (old < v &&
         !__atomic_compare_exchange_n(addr, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
inline int atomicMax(int *addr, int v) {
  int old = __atomic_load_n(addr, __ATOMIC_RELAXED);
  while (old < v &&
         !__atomic_compare_exchange_n(addr, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
inline unsigned int atomicMin(unsigned int *addr, unsigned int v) {
  unsigned int old = __atomic_load_n(addr, __ATOMIC_RELAXED);
  while (old > v &&
         !__atomic_compare_exchange_n(addr, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
inline float atomicAdd(float *addr, float v) {
  uint32_t *bits = reinterpret_cast<uint32_t *>(addr);
  uint32_t old = __atomic_load_n(bits, __ATOMIC_RELAXED), next;
  do {
    float f;
    std::memcpy(&f, &old, 4);
    f += v;
    std::memcpy(&next, &f, 4);
  } while (!__atomic_compare_exchange_n(bits, &old, next, true, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED));
  float out;
  std::memcpy(&out, &old, 4);
  return out;
}
inline int atomicAdd(int *addr, int v) { return __atomic_fetch_add(addr, v, __ATOMIC_RELAXED); }
inline unsigned int atomicAdd(unsigned int *addr, unsigned int v) {
  return __atomic_fetch_add(addr, v, __ATOMIC_RELAXED);
}
inline unsigned long long atomicAdd(unsigned long long *addr, unsigned long long v) {
  return __atomic_fetch_add(addr, v, __ATOMIC_RELAXED);
}
inline unsigned int atomicCAS(unsigned int *addr, unsigned int cmp, unsigned int v) {
  __atomic_compare_exchange_n(addr, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  return cmp;
}
inline unsigned int atomicExch(unsigned int *addr, unsigned int v) {
  return __atomic_exchange_n(addr, v, __ATOMIC_RELAXED);
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// --------------------------------------------------------------------- bit reinterprets
inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline int __float_as_int(float f) {
  int u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __int_as_float(int u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
