// Vectors of a CPU clone's native width and the softmax exp on them, for kernels dispatched with
// NVTE_CPU_DISPATCH_LANES (cpu_isa.h): W = 16 fp32 lanes in the x86-64-v4 clone (zmm), 8 in v3
// (ymm), 4 in baseline (xmm). GCC vector extensions; the one instruction they cannot express, a
// fused multiply-add, is inline assembly here (the intrinsic carries a target and cannot be inlined
// into target-less templates; see cpu_tile_gemm.h's madd).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu_tile_gemm.h"  // v16f / v8f / v4f, NVTE_HAVE_FMA_TILE_KERNELS

namespace nvte {
namespace lanes {

using tile::v16f;
using tile::v4f;
using tile::v8f;

template <int W>
struct Lanes;
template <>
struct Lanes<16> {
  using f = v16f;
  typedef int32_t i __attribute__((vector_size(64)));
  typedef uint32_t u __attribute__((vector_size(64)));
  static constexpr i kIota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
};
template <>
struct Lanes<8> {
  using f = v8f;
  typedef int32_t i __attribute__((vector_size(32)));
  typedef uint32_t u __attribute__((vector_size(32)));
  static constexpr i kIota = {0, 1, 2, 3, 4, 5, 6, 7};
};
template <>
struct Lanes<4> {
  using f = v4f;
  typedef int32_t i __attribute__((vector_size(16)));
  typedef uint32_t u __attribute__((vector_size(16)));
  static constexpr i kIota = {0, 1, 2, 3};
};

// c = a * b + c rounded once per lane, as fmaf (the scalar exp's operations, lane by lane):
// vfmadd231ps where the clone has FMA (16 and 8 lanes are only ever compiled in the v4 / v3
// clones); libm's fmaf per lane in baseline code (no FMA hardware: exact, slowly) and in builds
// without clones.
#ifdef NVTE_HAVE_FMA_TILE_KERNELS
__attribute__((always_inline)) inline void fma_lanes(v16f &c, const v16f &a, const v16f &b) {
  asm("vfmadd231ps %2, %1, %0" : "+v"(c) : "v"(a), "v"(b));
}
__attribute__((always_inline)) inline void fma_lanes(v8f &c, const v8f &a, const v8f &b) {
  asm("vfmadd231ps %2, %1, %0" : "+v"(c) : "v"(a), "v"(b));
}
#endif
template <class V>
__attribute__((always_inline)) inline void fma_lanes(V &c, const V &a, const V &b) {
  for (int i = 0; i < static_cast<int>(sizeof(V) / sizeof(float)); ++i) c[i] = std::fmaf(a[i], b[i], c[i]);
}

// exp_softmax_f32 (util/math.h) of every lane, in place, bit for bit: the same operations in the
// same order (each fmaf a fused multiply-add), so a row's probabilities do not depend on whether a
// loop over exp_softmax_f32 or this computed them, nor on the clone. Written on vectors so that a
// caller keeps the results in registers (the softmax sums them as it stores them).
template <int W>
__attribute__((always_inline)) inline void exp_softmax_lanes(typename Lanes<W>::f &x) {
  using V = typename Lanes<W>::f;
  using U = typename Lanes<W>::u;
  constexpr float kLog2e = 0x1.715476p+0f;
  constexpr float kLn2Hi = 0x1.62e430p-1f;
  constexpr float kLn2Lo = -0x1.05c610p-29f;
  constexpr float kShifter = 0x1.8p+23f;
  constexpr float kMin = -86.5f;
  U xb, under;
  std::memcpy(&xb, &x, sizeof(xb));
  const auto lt = x < kMin;  // -inf included, NaN not: all ones where the result is +0
  std::memcpy(&under, &lt, sizeof(under));
  U xcb = xb & ~under;  // x, or +0 where under
  V xc;
  std::memcpy(&xc, &xcb, sizeof(xc));
  V t = kShifter - V{};
  fma_lanes(t, xc, kLog2e - V{});
  const V kf = t - kShifter;
  const V nkf = -kf;
  V r = xc;
  fma_lanes(r, nkf, kLn2Hi - V{});  // x - k ln2_hi, exact
  fma_lanes(r, nkf, kLn2Lo - V{});  // - k ln2_lo
  V q = 0x1.6a2424p-10f - V{};
  V c = 0x1.1239e4p-7f - V{};
  fma_lanes(c, q, r);
  q = c;
  c = 0x1.5558f2p-5f - V{};
  fma_lanes(c, q, r);
  q = c;
  c = 0x1.555492p-3f - V{};
  fma_lanes(c, q, r);
  q = c;
  c = 0x1.fffffcp-2f - V{};
  fma_lanes(c, q, r);
  q = c;
  const V rr = r * r;
  c = r;
  fma_lanes(c, rr, q);
  const V p = 1.0f + c;
  U tb, pb, ks;
  std::memcpy(&tb, &t, sizeof(tb));
  std::memcpy(&pb, &p, sizeof(pb));
  const U shifter_bits = 0x4B400000u - U{};  // float_bits(kShifter)
  ks = (tb - shifter_bits) << 23;
  const U yb = (pb + ks) & ~under;
  std::memcpy(&x, &yb, sizeof(x));
}

}  // namespace lanes
}  // namespace nvte
