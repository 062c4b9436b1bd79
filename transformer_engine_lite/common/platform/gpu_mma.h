// Warp-level tensor-core product D = A * B + C of shape m16n8k16 (A 16x16, B 16x8, C/D 16x8 fp32)
// on bf16 or fp16 operands, in the register layout of PTX's mma.m16n8k16 ("Matrix Fragments for
// mma.m16n8k16 with floating point type"). Lane l of a 32-lane group (g = l / 4, t = l % 4) holds
//   A (row-major): a[0] = A[g][2t, 2t+1],   a[1] = A[g+8][2t, 2t+1],
//                  a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]
//   B (col-major): b[0] = B[2t, 2t+1][g],   b[1] = B[2t+8, 2t+9][g]
//   C, D:          c[0], c[1] = C[g][2t, 2t+1],  c[2], c[3] = C[g+8][2t, 2t+1]
// with two 16-bit elements per 32-bit register, the lower column / row index in the low half.
//
// sm_80+ (CUDA device code): the mma.sync instruction. Everywhere else (gpusim, which runs kernels
// as host code; HIP, whose compilers take no PTX; CUDA archs below sm_80) the same layout is
// computed from the group's lanes: each lane fetches the A and B registers it needs with shuffles
// and accumulates its four outputs with fp32 FMAs (the products of two 16-bit floats are exact in
// fp32; the sum order differs from the tensor core's, so results agree to fp32 rounding). The
// shuffles run in 32-lane segments, so a 64-lane wavefront holds two independent groups.
#pragma once

#include <cstdint>
#include <type_traits>

#include "../util/half.h"
#include "device.h"

namespace nvte {

// Lanes that share one m16n8k16 product.
constexpr int kMmaLanes = 32;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(__HIP_PLATFORM_AMD__)
#define NVTE_MMA_PTX 1
#endif

// Two 16-bit floats as one operand register: lo in bits 0-15 (the lower index), hi in 16-31.
template <typename T>
__device__ __forceinline__ uint32_t mma_pack(T lo, T hi) {
  return static_cast<uint32_t>(lo.x) | (static_cast<uint32_t>(hi.x) << 16);
}
template <typename T>
__device__ __forceinline__ uint32_t mma_pack_f32(float lo, float hi) {
  return mma_pack(from_float<T>(lo), from_float<T>(hi));
}

namespace mma_detail {

template <typename T>
__device__ __forceinline__ float lo_f(uint32_t r) {
  return to_float(T{static_cast<uint16_t>(r & 0xFFFFu)});
}
template <typename T>
__device__ __forceinline__ float hi_f(uint32_t r) {
  return to_float(T{static_cast<uint16_t>(r >> 16)});
}
// dot of the two 16-bit pairs in registers x and y, added to acc in index order.
template <typename T>
__device__ __forceinline__ float dot2(uint32_t x, uint32_t y, float acc) {
  acc = fmaf(lo_f<T>(x), lo_f<T>(y), acc);
  return fmaf(hi_f<T>(x), hi_f<T>(y), acc);
}
__device__ __forceinline__ uint64_t join(uint32_t lo, uint32_t hi) {
  return static_cast<uint64_t>(lo) | (static_cast<uint64_t>(hi) << 32);
}
__device__ __forceinline__ uint32_t low(uint64_t v) { return static_cast<uint32_t>(v); }
__device__ __forceinline__ uint32_t high(uint64_t v) { return static_cast<uint32_t>(v >> 32); }

// The layout above evaluated lane by lane. D[g][n] sums over k = 0..15; k in [2u, 2u+1] and
// [2u+8, 2u+9] sit in the A registers of lane 4g + u and the B registers of lane 4n + u, so four
// rounds (u = 0..3) of four 64-bit shuffles bring every operand a lane needs.
template <typename T>
__device__ __forceinline__ void mma_lanes(float (&d)[4], const uint32_t (&a)[4],
                                          const uint32_t (&b)[2]) {
  const int lane = static_cast<int>(threadIdx.x) % kMmaLanes, g = lane / 4, t = lane % 4;
  const uint64_t a01 = join(a[0], a[1]), a23 = join(a[2], a[3]), b01 = join(b[0], b[1]);
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const uint64_t xa01 = warp_shfl_idx(a01, 4 * g + u, kMmaLanes);
    const uint64_t xa23 = warp_shfl_idx(a23, 4 * g + u, kMmaLanes);
    const uint64_t xb0 = warp_shfl_idx(b01, 4 * (2 * t) + u, kMmaLanes);      // column 2t
    const uint64_t xb1 = warp_shfl_idx(b01, 4 * (2 * t + 1) + u, kMmaLanes);  // column 2t + 1
    // Rows g (a[0], a[2]) and g + 8 (a[1], a[3]); k block 2u (b[0]) then 2u + 8 (b[1]).
    d[0] = dot2<T>(low(xa23), high(xb0), dot2<T>(low(xa01), low(xb0), d[0]));
    d[1] = dot2<T>(low(xa23), high(xb1), dot2<T>(low(xa01), low(xb1), d[1]));
    d[2] = dot2<T>(high(xa23), high(xb0), dot2<T>(high(xa01), low(xb0), d[2]));
    d[3] = dot2<T>(high(xa23), high(xb1), dot2<T>(high(xa01), low(xb1), d[3]));
  }
}

}  // namespace mma_detail

// d += A * B for one 32-lane group (every lane of the group must call it: it is warp-collective).
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
#if defined(NVTE_MMA_PTX)
  if constexpr (std::is_same<T, bf16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  mma_detail::mma_lanes<T>(d, a, b);
#endif
}

}  // namespace nvte
