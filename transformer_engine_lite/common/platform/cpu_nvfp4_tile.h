// Micro-kernels of the NVFP4 block GEMM (gemm/nvfp4_gemm_cpu.cpp): C[R x cols] = sum over 16-K
// blocks, in K order, of that block's dot products, i.e. per block t = 0; t += a * b over the 16
// K of the block (any order); c += t.
//
// Why any order inside a block is allowed: the operands hold decoded NVFP4 values, e2m1 * e4m3 (at
// most 2 + 4 significant bits, magnitudes in [2^-10, 2688]). Every product has <= 12 significant
// bits and is a multiple of 2^-20, and a block's 16 products share one scale product sB * sA, so
// every partial sum of a block is an integer number of (sB * sA / 4) units below 2^12 units: exact
// in fp32 (24 bits), whatever the order, FMA or not, and never subnormal (so vdpbf16ps's flushing
// changes nothing). The only roundings are the c += t adds, done in K order in every clone: all
// clones and the scalar oracle give the same bits.
//
// Operand layouts (E: uint16_t bf16 bits or float; values exact in both, see above):
//  - A: row-major [R][lda] with lda >= Kp (K padded to whole blocks with zeros).
//  - B: one panel of 64 columns, bf16 [Kp/2][64][2] (vdpbf16ps's pairs of K-neighbours) or fp32
//    [Kp][64]; the fp32 kernel reads a group of NV vectors at column offset g inside it.
//  - C: row-major fp32 [R][ldc], overwritten (the kernel starts from 0, as the tensor core).
// The intrinsics live here (platform/) only; callers see plain functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu_isa.h"
#include "cpu_tile_gemm.h"  // NVTE_HAVE_BF16_DOT_KERNEL, tile::has_bf16_dot, v16f / v8f / v4f

namespace nvte {
namespace nvfp4_tile {

constexpr int kPanel = 64;  // B panel width
constexpr int kBlock = 16;  // NVFP4 block length along K
// Rows per micro-kernel call: R x NV accumulators for c and as many for the block term t, plus NV
// B vectors and one broadcast: AVX-512 3 x 4 zmm (12 + 12 + 5 = 29 of 32 registers); AVX2 3 x 2
// ymm (6 + 6 + 3 = 15 of 16); SSE2 3 x 2 xmm (15 of 16). Row tails use R = 2, 1.
constexpr int kRows = 3;

#ifdef NVTE_HAVE_BF16_DOT_KERNEL
// R rows x 64 columns, `blocks` K blocks (8 vdpbf16ps pair steps each).
template <int R>
__attribute__((target("avx512f,avx512bf16"), always_inline)) inline void mk_bf16(
    const uint16_t *A, size_t lda, const uint16_t *B, int blocks, float *C, size_t ldc) {
  __m512 c[R][4];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) c[r][v] = _mm512_setzero_ps();
  for (int blk = 0; blk < blocks; ++blk) {
    __m512 t[R][4];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v) t[r][v] = _mm512_setzero_ps();
    for (int kk = 0; kk < kBlock / 2; ++kk) {
      const size_t k2 = static_cast<size_t>(blk) * (kBlock / 2) + kk;
      __m512bh b[4];
      for (int v = 0; v < 4; ++v)
        b[v] = (__m512bh)_mm512_loadu_si512(B + (k2 * kPanel + v * 16) * 2);
      for (int r = 0; r < R; ++r) {
        uint32_t pair;
        std::memcpy(&pair, A + r * lda + 2 * k2, sizeof(pair));
        const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
        for (int v = 0; v < 4; ++v) t[r][v] = _mm512_dpbf16_ps(t[r][v], a, b[v]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < 4; ++v) c[r][v] = _mm512_add_ps(c[r][v], t[r][v]);
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < 4; ++v) _mm512_storeu_ps(C + r * ldc + v * 16, c[r][v]);
}

__attribute__((target("avx512f,avx512bf16"))) inline void rows_bf16(int M, const uint16_t *A,
                                                                    size_t lda, const uint16_t *B,
                                                                    int blocks, float *C,
                                                                    size_t ldc) {
  int r = 0;
  for (; r + kRows <= M; r += kRows) mk_bf16<kRows>(A + r * lda, lda, B, blocks, C + r * ldc, ldc);
  if (M - r == 2) mk_bf16<2>(A + r * lda, lda, B, blocks, C + r * ldc, ldc);
  if (M - r == 1) mk_bf16<1>(A + r * lda, lda, B, blocks, C + r * ldc, ldc);
}
#endif

// C[M x 64] for one bf16 panel. Requires tile::has_bf16_dot().
inline void panel_bf16(int M, const uint16_t *A, size_t lda, const uint16_t *B, int blocks,
                       float *C, size_t ldc) {
#ifdef NVTE_HAVE_BF16_DOT_KERNEL
  rows_bf16(M, A, lda, B, blocks, C, ldc);
#else
  (void)M, (void)A, (void)lda, (void)B, (void)blocks, (void)C, (void)ldc;
#endif
}

// ---- fp32 kernel (vector extensions, lowered by the calling clone; no intrinsics) ----
template <typename V, int R, int NV>
__attribute__((always_inline)) inline void mk_f32(const float *A, size_t lda, const float *B,
                                                  int blocks, float *C, size_t ldc) {
  constexpr int W = sizeof(V) / sizeof(float);
  V c[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) c[r][v] = V{};
  for (int blk = 0; blk < blocks; ++blk) {
    V t[R][NV];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) t[r][v] = V{};
    for (int kk = 0; kk < kBlock; ++kk) {
      const size_t k = static_cast<size_t>(blk) * kBlock + kk;
      V b[NV];
      for (int v = 0; v < NV; ++v) std::memcpy(&b[v], B + k * kPanel + v * W, sizeof(V));
      for (int r = 0; r < R; ++r) {
        const V a = A[r * lda + k] - V{};  // broadcast
        for (int v = 0; v < NV; ++v) t[r][v] += a * b[v];
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) c[r][v] += t[r][v];
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) std::memcpy(C + r * ldc + v * W, &c[r][v], sizeof(V));
}

template <typename V, int NV>
__attribute__((always_inline)) inline void rows_f32(int M, const float *A, size_t lda,
                                                    const float *B, int blocks, float *C,
                                                    size_t ldc) {
  int r = 0;
  for (; r + kRows <= M; r += kRows)
    mk_f32<V, kRows, NV>(A + r * lda, lda, B, blocks, C + r * ldc, ldc);
  if (M - r == 2) mk_f32<V, 2, NV>(A + r * lda, lda, B, blocks, C + r * ldc, ldc);
  if (M - r == 1) mk_f32<V, 1, NV>(A + r * lda, lda, B, blocks, C + r * ldc, ldc);
}

// C[M x 64] for one fp32 panel. Inline: compiled into (and vectorized for) each ISA clone of the
// caller, which passes its blocking (tile::F32Blocking).
template <tile::F32Blocking kB>
__attribute__((always_inline)) inline void panel_f32(int M, const float *A, size_t lda,
                                                     const float *B, int blocks, float *C,
                                                     size_t ldc) {
  if constexpr (kB == tile::F32Blocking::kAvx512) {
    rows_f32<tile::v16f, 4>(M, A, lda, B, blocks, C, ldc);
  } else if constexpr (kB == tile::F32Blocking::kAvx2) {
    for (int g = 0; g < kPanel; g += 16)
      rows_f32<tile::v8f, 2>(M, A, lda, B + g, blocks, C + g, ldc);
  } else {
    for (int g = 0; g < kPanel; g += 8)
      rows_f32<tile::v4f, 2>(M, A, lda, B + g, blocks, C + g, ldc);
  }
}

}  // namespace nvfp4_tile
}  // namespace nvte
