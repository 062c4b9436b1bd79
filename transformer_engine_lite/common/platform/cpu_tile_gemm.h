// Small-tile GEMMs for the CPU attention kernels: C[M x N] (+)= A[M x K] * B[K x N], fp32 results.
// Attention multiplies tiles of 64-128 rows by 64 keys with K = head dim (or 64): too small for a
// library call per tile (oneDNN's per-call overhead is comparable to the work) and too hot for plain
// loops. Two register-blocked micro-kernels:
//  - bf16: AVX-512 BF16 dot products (vdpbf16ps: pairs of bf16 products summed in fp32), about 2.7x
//    the fp32 FMA rate on the CPUs that have it. Products of bf16 values are exact in fp32; the sums
//    round in fp32 (denormal inputs and results are flushed to zero by the instruction).
//  - fp32: GCC vector extensions (lowered to AVX-512, AVX2 or SSE by the clone that calls it), with a
//    separate multiply and add, as the rest of the library (-ffp-contract=off): every ISA clone rounds
//    alike.
// Operand layouts (all elements of the packed type E: uint16_t bf16 bits or float):
//  - A: row-major [M][lda], K used columns; bf16 K is even (callers zero-pad the odd column).
//  - B: ceil(N / 64) panels of 64 columns, panel p at B + p * panel_stride. Inside a panel, bf16 is
//    [K/2][64][2] (the two K-neighbours of a column adjacent: vdpbf16ps's pairs) and fp32 is [K][64].
//    Columns past N inside the last panel must hold zeros.
//  - C: row-major fp32 with ldc >= N rounded up to 16: the last 16-column group is written in full.
// The intrinsics live here (platform/) only; callers see plain functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu_isa.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define NVTE_HAVE_BF16_DOT_KERNEL 1
#endif

namespace nvte {
namespace tile {

constexpr int kPanel = 64;  // B panel width
constexpr int kRows = 6;    // rows per micro-kernel call (6 x 4 accumulators + 4 B vectors fit 32 zmm)

// Whether the bf16 dot-product kernel runs: the CPU has AVX-512 BF16 and NVTE_CPU_ISA allows it.
inline bool has_bf16_dot() {
#ifdef NVTE_HAVE_BF16_DOT_KERNEL
  return cpu_isa_level() >= CpuIsa::kAvx512CoreBf16;
#else
  return false;
#endif
}

#ifdef NVTE_HAVE_BF16_DOT_KERNEL
// R rows x NV 16-column groups of one panel. K2 = K / 2 pairs.
template <int R, int NV>
__attribute__((target("avx512f,avx512bf16"), always_inline)) inline void mk_bf16(
    const uint16_t *A, int lda, const uint16_t *B, int K2, float *C, int ldc, bool acc) {
  __m512 c[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v)
      c[r][v] = acc ? _mm512_loadu_ps(C + r * ldc + v * 16) : _mm512_setzero_ps();
  for (int k = 0; k < K2; ++k) {
    __m512bh b[NV];
    for (int v = 0; v < NV; ++v)
      b[v] = (__m512bh)_mm512_loadu_si512(B + (static_cast<size_t>(k) * kPanel + v * 16) * 2);
    for (int r = 0; r < R; ++r) {
      uint32_t pair;
      std::memcpy(&pair, A + static_cast<size_t>(r) * lda + 2 * k, sizeof(pair));
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, b[v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(C + r * ldc + v * 16, c[r][v]);
}

template <int NV>
__attribute__((target("avx512f,avx512bf16"))) inline void panel_bf16(int M, const uint16_t *A,
                                                                     int lda, const uint16_t *B,
                                                                     int K2, float *C, int ldc,
                                                                     bool acc) {
  int r = 0;
  for (; r + kRows <= M; r += kRows)
    mk_bf16<kRows, NV>(A + static_cast<size_t>(r) * lda, lda, B, K2, C + r * ldc, ldc, acc);
  const size_t off = static_cast<size_t>(r);
  switch (M - r) {
    case 5: mk_bf16<5, NV>(A + off * lda, lda, B, K2, C + off * ldc, ldc, acc); break;
    case 4: mk_bf16<4, NV>(A + off * lda, lda, B, K2, C + off * ldc, ldc, acc); break;
    case 3: mk_bf16<3, NV>(A + off * lda, lda, B, K2, C + off * ldc, ldc, acc); break;
    case 2: mk_bf16<2, NV>(A + off * lda, lda, B, K2, C + off * ldc, ldc, acc); break;
    case 1: mk_bf16<1, NV>(A + off * lda, lda, B, K2, C + off * ldc, ldc, acc); break;
    default: break;
  }
}
#endif

// C (+)= A * B with bf16 operands (K even). Requires has_bf16_dot().
inline void gemm_bf16(int M, int N, int K, const uint16_t *A, int lda, const uint16_t *B,
                      size_t panel_stride, float *C, int ldc, bool accumulate) {
#ifdef NVTE_HAVE_BF16_DOT_KERNEL
  for (int p = 0; p * kPanel < N; ++p) {
    const int cols = N - p * kPanel < kPanel ? N - p * kPanel : kPanel;
    const uint16_t *Bp = B + static_cast<size_t>(p) * panel_stride;
    float *Cp = C + p * kPanel;
    switch ((cols + 15) / 16) {
      case 1: panel_bf16<1>(M, A, lda, Bp, K / 2, Cp, ldc, accumulate); break;
      case 2: panel_bf16<2>(M, A, lda, Bp, K / 2, Cp, ldc, accumulate); break;
      case 3: panel_bf16<3>(M, A, lda, Bp, K / 2, Cp, ldc, accumulate); break;
      default: panel_bf16<4>(M, A, lda, Bp, K / 2, Cp, ldc, accumulate); break;
    }
  }
#else
  (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)panel_stride, (void)C, (void)ldc,
      (void)accumulate;
#endif
}

// ---- fp32 kernel (vector extensions; no intrinsics) ----
typedef float v16f __attribute__((vector_size(64)));

template <int R, int NV>
__attribute__((always_inline)) inline void mk_f32(const float *A, int lda, const float *B, int K,
                                                  float *C, int ldc, bool acc) {
  v16f c[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      if (acc)
        std::memcpy(&c[r][v], C + r * ldc + v * 16, sizeof(v16f));
      else
        c[r][v] = v16f{};
    }
  for (int k = 0; k < K; ++k) {
    v16f b[NV];
    for (int v = 0; v < NV; ++v)
      std::memcpy(&b[v], B + static_cast<size_t>(k) * kPanel + v * 16, sizeof(v16f));
    for (int r = 0; r < R; ++r) {
      const v16f a = A[static_cast<size_t>(r) * lda + k] - v16f{};  // broadcast
      for (int v = 0; v < NV; ++v) c[r][v] += a * b[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) std::memcpy(C + r * ldc + v * 16, &c[r][v], sizeof(v16f));
}

template <int NV>
__attribute__((always_inline)) inline void panel_f32(int M, const float *A, int lda, const float *B, int K, float *C, int ldc,
                      bool acc) {
  int r = 0;
  for (; r + kRows <= M; r += kRows)
    mk_f32<kRows, NV>(A + static_cast<size_t>(r) * lda, lda, B, K, C + r * ldc, ldc, acc);
  const size_t off = static_cast<size_t>(r);
  switch (M - r) {
    case 5: mk_f32<5, NV>(A + off * lda, lda, B, K, C + off * ldc, ldc, acc); break;
    case 4: mk_f32<4, NV>(A + off * lda, lda, B, K, C + off * ldc, ldc, acc); break;
    case 3: mk_f32<3, NV>(A + off * lda, lda, B, K, C + off * ldc, ldc, acc); break;
    case 2: mk_f32<2, NV>(A + off * lda, lda, B, K, C + off * ldc, ldc, acc); break;
    case 1: mk_f32<1, NV>(A + off * lda, lda, B, K, C + off * ldc, ldc, acc); break;
    default: break;
  }
}

// C (+)= A * B with fp32 operands. Inline: compiled into (and vectorized for) each ISA clone of the
// caller.
__attribute__((always_inline)) inline void gemm_f32(int M, int N, int K, const float *A, int lda,
                                                    const float *B, size_t panel_stride, float *C,
                                                    int ldc, bool accumulate) {
  for (int p = 0; p * kPanel < N; ++p) {
    const int cols = N - p * kPanel < kPanel ? N - p * kPanel : kPanel;
    const float *Bp = B + static_cast<size_t>(p) * panel_stride;
    float *Cp = C + p * kPanel;
    switch ((cols + 15) / 16) {
      case 1: panel_f32<1>(M, A, lda, Bp, K, Cp, ldc, accumulate); break;
      case 2: panel_f32<2>(M, A, lda, Bp, K, Cp, ldc, accumulate); break;
      case 3: panel_f32<3>(M, A, lda, Bp, K, Cp, ldc, accumulate); break;
      default: panel_f32<4>(M, A, lda, Bp, K, Cp, ldc, accumulate); break;
    }
  }
}

}  // namespace tile
}  // namespace nvte
