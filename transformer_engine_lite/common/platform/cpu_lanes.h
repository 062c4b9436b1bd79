// Vectors of a CPU clone's native width, for kernels dispatched with NVTE_CPU_DISPATCH_LANES
// (cpu_isa.h): W = 16 fp32 lanes in the x86-64-v4 clone (zmm), 8 in v3 (ymm), 4 in baseline (xmm);
// GCC vector extensions, no intrinsics. A row of 64 columns (the attention softmax's) is four
// groups of 16 lanes, each group 16 / W native vectors; the reductions over a group follow one tree
// at every width, so the clones agree bit for bit.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu_tile_gemm.h"  // v16f / v8f / v4f

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
  static constexpr i kIota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
};
template <>
struct Lanes<8> {
  using f = v8f;
  typedef int32_t i __attribute__((vector_size(32)));
  static constexpr i kIota = {0, 1, 2, 3, 4, 5, 6, 7};
};
template <>
struct Lanes<4> {
  using f = v4f;
  typedef int32_t i __attribute__((vector_size(16)));
  static constexpr i kIota = {0, 1, 2, 3};
};

// Max and sum of a 16-lane group g[16 / W] as fixed trees (lanes i and i + 8, then + 4, + 2, + 1):
// the same order in every clone, a 4-deep dependency chain instead of 16, and no trip through
// memory (the halves are register shuffles or separate registers). Vectors pass by pointer: a
// vector argument or return value wider than the caller's registers changes the ABI (-Wpsabi).
template <int W>
__attribute__((always_inline)) inline float hmax_group(const typename Lanes<W>::f *g) {
  v4f m4;
  if constexpr (W == 16) {
    const v8f a = __builtin_shufflevector(g[0], g[0], 0, 1, 2, 3, 4, 5, 6, 7);
    const v8f b = __builtin_shufflevector(g[0], g[0], 8, 9, 10, 11, 12, 13, 14, 15);
    const v8f m8 = b > a ? b : a;
    const v4f c = __builtin_shufflevector(m8, m8, 0, 1, 2, 3);
    const v4f d = __builtin_shufflevector(m8, m8, 4, 5, 6, 7);
    m4 = d > c ? d : c;
  } else if constexpr (W == 8) {
    const v8f m8 = g[1] > g[0] ? g[1] : g[0];
    const v4f c = __builtin_shufflevector(m8, m8, 0, 1, 2, 3);
    const v4f d = __builtin_shufflevector(m8, m8, 4, 5, 6, 7);
    m4 = d > c ? d : c;
  } else {
    const v4f c = g[2] > g[0] ? g[2] : g[0];  // lanes 0-3 of the 8-lane step
    const v4f d = g[3] > g[1] ? g[3] : g[1];  // lanes 4-7
    m4 = d > c ? d : c;
  }
  const float x0 = m4[2] > m4[0] ? m4[2] : m4[0], x1 = m4[3] > m4[1] ? m4[3] : m4[1];
  return x1 > x0 ? x1 : x0;
}
template <int W>
__attribute__((always_inline)) inline float hsum_group(const typename Lanes<W>::f *g) {
  v4f s4;
  if constexpr (W == 16) {
    const v8f s8 = __builtin_shufflevector(g[0], g[0], 0, 1, 2, 3, 4, 5, 6, 7) +
                   __builtin_shufflevector(g[0], g[0], 8, 9, 10, 11, 12, 13, 14, 15);
    s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  } else if constexpr (W == 8) {
    const v8f s8 = g[0] + g[1];
    s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  } else {
    s4 = (g[0] + g[2]) + (g[1] + g[3]);
  }
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// x where lo <= idx < hi, else -inf, in integer arithmetic on the lanes: GCC 12 lowers vector
// comparisons of int lanes (and `?:` on them) for AVX-512 lane by lane, with a test and a branch or
// cmov per lane; that was the hottest code of the forward. Here the sign bits of idx - lo and
// hi - 1 - idx say whether a lane is outside, spread over the lane by an arithmetic shift.
// Lanes are columns c0 .. c0 + W - 1.
template <int W>
__attribute__((always_inline)) inline void mask_outside(typename Lanes<W>::f &x, int c0, int lo, int hi) {
  using VI = typename Lanes<W>::i;
  using VF = typename Lanes<W>::f;
  const VI idx = Lanes<W>::kIota + c0;
  const VI keep = ~(((idx - lo) | ((hi - 1) - idx)) >> 31);  // all ones inside, zero outside
  VI xb, ninf;
  const VF ninf_f = -std::numeric_limits<float>::infinity() - VF{};
  std::memcpy(&xb, &x, sizeof(xb));
  std::memcpy(&ninf, &ninf_f, sizeof(ninf));
  xb = (xb & keep) | (ninf & ~keep);
  std::memcpy(&x, &xb, sizeof(x));
}

}  // namespace lanes
}  // namespace nvte
